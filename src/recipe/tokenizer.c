/*
 * tokenizer: the vocabulary of a GGUF file and its loader; SentencePiece-style and byte-level
 * BPE tokenisation written to reproduce llama.cpp's llama-vocab.cpp token for token (see
 * tokenizer.h; tokenizer_int.h names the files that do the encoding and decoding).
 *
 * Data: every token text and merge is copied into one arena at load; a string -> id hash map
 * (open addressing, last duplicate wins as in llama.cpp) and a (left, right) -> rank map for
 * merges (first duplicate wins). Token attributes and the end-of-generation set follow
 * llama.cpp's load-time fix-ups by token text. Decoded pieces are precomputed per token.
 * A tokenizer is immutable after tokenizer_load.
 */
#define _GNU_SOURCE  /* memmem */
#include "recipe/tokenizer_int.h"
#include "util/util.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* hashing and maps                                                                          */

static uint64_t tokenizer_hash(uint64_t h, const void *p, size_t n)
{
    const uint8_t *s = p;
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)n * 0xC2B2AE3D27D4EB4Full;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * k;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * k;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

static bool tokenizer_map_init(tokenizer_map *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    m->slot = calloc(cap, sizeof *m->slot);
    m->hash = calloc(cap, sizeof *m->hash);
    m->mask = cap - 1;
    return m->slot && m->hash;
}

static void tokenizer_map_free(tokenizer_map *m)
{
    free(m->slot);
    free(m->hash);
}

/* The slot of tok_map holding the token whose text is s[0..len) (h its hash), or the empty
 * slot where it would go. */
static uint64_t tokenizer_token_slot(const tokenizer *t, const char *s, size_t len, uint64_t h)
{
    uint32_t hh = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->tok_map.mask;; i = (i + 1) & t->tok_map.mask) {
        int32_t v = t->tok_map.slot[i];
        if (v == 0 || (t->tok_map.hash[i] == hh && t->tok_len[v - 1] == len &&
                       memcmp(t->arena.p + t->tok_off[v - 1], s, len) == 0))
            return i;
    }
}

int32_t tokenizer_find(const tokenizer *t, const char *s, size_t len)
{
    if (len > t->max_token_len) return -1;
    return t->tok_map.slot[tokenizer_token_slot(t, s, len, tokenizer_hash(0, s, len))] - 1;
}

/* Inserts id under its text; a later duplicate replaces the earlier id (llama.cpp's
 * token_to_id[word] = i). */
static void tokenizer_map_put_token(tokenizer *t, int32_t id)
{
    size_t len;
    const char *s = tokenizer_text(t, id, &len);
    uint64_t h = tokenizer_hash(0, s, len);
    uint64_t i = tokenizer_token_slot(t, s, len, h);
    t->tok_map.slot[i] = id + 1;
    t->tok_map.hash[i] = (uint32_t)(h >> 32);
}

static uint64_t tokenizer_merge_hash(const char *a, size_t na, const char *b, size_t nb)
{
    return tokenizer_hash(tokenizer_hash(0x5bd1e995, a, na), b, nb);
}

static bool tokenizer_merge_eq(const tokenizer *t, int32_t r, const char *a, size_t na,
                               const char *b, size_t nb)
{
    return t->merge_len[2 * r] == na && t->merge_len[2 * r + 1] == nb &&
           memcmp(t->arena.p + t->merge_off[2 * r], a, na) == 0 &&
           memcmp(t->arena.p + t->merge_off[2 * r + 1], b, nb) == 0;
}

/* The slot of merge_map holding the merge (a, b) (h its hash), or the empty slot where it
 * would go. */
static uint64_t tokenizer_merge_slot(const tokenizer *t, const char *a, size_t na, const char *b,
                                     size_t nb, uint64_t h)
{
    uint32_t hh = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->merge_map.mask;; i = (i + 1) & t->merge_map.mask) {
        int32_t v = t->merge_map.slot[i];
        if (v == 0 || (t->merge_map.hash[i] == hh && tokenizer_merge_eq(t, v - 1, a, na, b, nb))) return i;
    }
}

int32_t tokenizer_merge_rank(const tokenizer *t, const char *a, size_t na, const char *b, size_t nb)
{
    return t->merge_map.slot[tokenizer_merge_slot(t, a, na, b, nb, tokenizer_merge_hash(a, na, b, nb))] - 1;
}

/* Inserts merge r unless an equal pair exists (llama.cpp's bpe_ranks.emplace keeps the first). */
static void tokenizer_map_put_merge(tokenizer *t, int32_t r)
{
    const char *a = t->arena.p + t->merge_off[2 * r], *b = t->arena.p + t->merge_off[2 * r + 1];
    size_t na = t->merge_len[2 * r], nb = t->merge_len[2 * r + 1];
    uint64_t h = tokenizer_merge_hash(a, na, b, nb);
    uint64_t i = tokenizer_merge_slot(t, a, na, b, nb, h);
    if (t->merge_map.slot[i] != 0) return;
    t->merge_map.slot[i] = r + 1;
    t->merge_map.hash[i] = (uint32_t)(h >> 32);
}

/* Appends bytes to the arena, returns their offset or UINT64_MAX on failure. */
static uint64_t tokenizer_arena_add(tokenizer *t, const void *s, size_t n)
{
    uint64_t off = t->arena.len;
    return bytebuf_try_append(&t->arena, s, n) ? off : UINT64_MAX;
}

/* ---------------------------------------------------------------------------------------- */
/* loading                                                                                   */

void tokenizer_err(char *err, size_t errsz, const char *fmt, ...)
{
    if (!err || errsz == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsz, fmt, ap);
    va_end(ap);
}

static bool tokenizer_text_is(const tokenizer *t, int32_t id, const char *z)
{
    size_t n;
    const char *s = tokenizer_text(t, id, &n);
    return strlen(z) == n && !memcmp(s, z, n);
}

/* First token (lowest id, counting each distinct text once) whose text is in the NULL-ended
 * list, or -1. */
static int32_t tokenizer_find_any(const tokenizer *t, const char *const *list)
{
    int32_t best = -1;
    for (const char *const *z = list; *z; z++) {
        int32_t id = tokenizer_find(t, *z, strlen(*z));
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

/* llama.cpp's load-time fix-ups: special ids found by text become control tokens, the
 * end-of-generation set, and a few per-model attributes. */
static void tokenizer_fixups(tokenizer *t, const gguf *g, int32_t fim[6])
{
    static const char *const eot_texts[] = { "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
        "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
        "<end_of_utterance>", NULL };
    static const char *const eom_texts[] = { "<|eom_id|>", NULL };
    static const char *const fim_texts[6][9] = {
        { "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>", NULL },
        { "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", NULL },
        { "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>", NULL },
        { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL },
        { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL },
        { "<|file_sep|>", NULL },
    };
    static const char *const eog_texts[] = { "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>",
        "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[", NULL };

    if (t->eot < 0 && (t->eot = tokenizer_find_any(t, eot_texts)) >= 0) t->attr[t->eot] |= TOKENIZER_ATTR_CONTROL;
    if (t->eom < 0 && (t->eom = tokenizer_find_any(t, eom_texts)) >= 0) t->attr[t->eom] |= TOKENIZER_ATTR_CONTROL;
    for (int k = 0; k < 6; k++)
        if (fim[k] < 0 && (fim[k] = tokenizer_find_any(t, fim_texts[k])) >= 0) t->attr[fim[k]] |= TOKENIZER_ATTR_CONTROL;

    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n;
        const char *s = tokenizer_text(t, id, &n);
        if ((t->attr[id] & TOKENIZER_ATTR_CONTROL) && memmem(s, n, "unused", 6)) t->attr[id] |= TOKENIZER_ATTR_UNUSED;
    }

    for (int k = 3; k < 6; k++)  /* fim pad, repo, sep end generation */
        if (fim[k] >= 0) t->eog[fim[k]] = 1;
    for (const char *const *z = eog_texts; *z; z++) {
        int32_t id = tokenizer_find(t, *z, strlen(*z));
        if (id < 0) continue;
        t->eog[id] = 1;
        t->attr[id] |= TOKENIZER_ATTR_CONTROL;
    }
    static const char *const gptoss_texts[] = { "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL };
    for (const char *const *z = gptoss_texts; *z; z++) {
        int32_t id = tokenizer_find(t, *z, strlen(*z));
        if (id >= 0) t->attr[id] = TOKENIZER_ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;

    /* o200k_harmony / solar-open: "<|end|>" is not end of generation there */
    bool has_return = false, has_call = false, has_flush = false, has_tool_response = false;
    int32_t end_id = -1, s_id = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!t->eog[id]) continue;
        if (tokenizer_text_is(t, id, "<|return|>")) has_return = true;
        else if (tokenizer_text_is(t, id, "<|call|>") || tokenizer_text_is(t, id, "<|calls|>")) has_call = true;
        else if (tokenizer_text_is(t, id, "<|flush|>")) has_flush = true;
        else if (tokenizer_text_is(t, id, "<|end|>")) end_id = id;
        else if (tokenizer_text_is(t, id, "<|tool_response>")) has_tool_response = true;
        else if (tokenizer_text_is(t, id, "</s>")) s_id = id;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
        t->eog[end_id] = 0;
        t->attr[end_id] = TOKENIZER_ATTR_USER_DEFINED;
    }
    if (has_tool_response && s_id >= 0) {
        t->eog[s_id] = 0;
        t->attr[s_id] = TOKENIZER_ATTR_NORMAL;
    }

    /* per-model attributes by general.name (phi-3 strips whitespace right of its specials) */
    const char *name;
    size_t nname;
    char lname[256] = "";
    if (gguf_get_str(g, "general.name", &name, &nname)) {
        size_t k = TM_MIN(nname, sizeof lname - 1);
        for (size_t i = 0; i < k; i++) lname[i] = (char)tolower((unsigned char)name[i]);
        lname[k] = 0;
    }
    if (strstr(lname, "phi-3") || strstr(lname, "phi3")) {
        for (int32_t id = 0; id < t->n_vocab; id++)
            if (t->attr[id] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED | TOKENIZER_ATTR_UNKNOWN))
                t->attr[id] |= TOKENIZER_ATTR_RSTRIP;
        int32_t id = tokenizer_find(t, "</s>", 4);
        if (id >= 0) t->attr[id] |= TOKENIZER_ATTR_RSTRIP;
        static const char *const off[] = { "<unk>", "<s>", "<|endoftext|>" };
        for (size_t i = 0; i < 3; i++)
            if ((id = tokenizer_find(t, off[i], strlen(off[i]))) >= 0) t->attr[id] &= ~(uint32_t)TOKENIZER_ATTR_RSTRIP;
    }
}

static int tokenizer_special_cmp_len(const tokenizer *t, int32_t a, int32_t b)
{
    if (t->tok_len[a] != t->tok_len[b]) return t->tok_len[a] > t->tok_len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Insertion-free ordering without qsort_r: a merge sort on the id list. */
static void tokenizer_sort_special(const tokenizer *t, int32_t *v, int32_t *tmp, int32_t n)
{
    if (n < 2) return;
    int32_t h = n / 2;
    tokenizer_sort_special(t, v, tmp, h);
    tokenizer_sort_special(t, v + h, tmp, n - h);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = tokenizer_special_cmp_len(t, v[i], v[j]) <= 0 ? v[i++] : v[j++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

static uint32_t tokenizer_attr_of_type(int32_t type)
{
    switch (type) {
    case 1: return TOKENIZER_ATTR_NORMAL;
    case 2: return TOKENIZER_ATTR_UNKNOWN;
    case 3: return TOKENIZER_ATTR_CONTROL;
    case 4: return TOKENIZER_ATTR_USER_DEFINED;
    case 5: return TOKENIZER_ATTR_UNUSED;
    case 6: return TOKENIZER_ATTR_BYTE;
    default: return TOKENIZER_ATTR_UNDEFINED;
    }
}

/* Reads an optional token id key into *id (kept when absent or out of range). */
static void tokenizer_get_id(const tokenizer *t, const gguf *g, const char *key, int32_t *id)
{
    int64_t v;
    if (gguf_get_int(g, key, &v) && v >= 0 && v < t->n_vocab) *id = (int32_t)v;
}

/* The loading steps below each return TOKENIZER_OK or the status of the first problem, with
 * err filled in; tokenizer_load runs them in order and frees the half-built tokenizer on
 * the first failure. */

static tokenizer_status tokenizer_nomem(char *err, size_t errsz)
{
    tokenizer_err(err, errsz, "out of memory loading the vocabulary");
    return TOKENIZER_ERR_NOMEM;
}

/* tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (byte-level BPE), "gemma4" (BPE on
 * SentencePiece's spelling, tokenizer_bpe.c) or "bert" (WordPiece). */
static tokenizer_status tokenizer_load_kind(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    const char *model;
    size_t nmodel;
    if (!gguf_get_str(g, "tokenizer.ggml.model", &model, &nmodel)) {
        tokenizer_err(err, errsz, "tokenizer.ggml.model missing (no vocabulary in this file)");
        return TOKENIZER_ERR_MISSING;
    }
    if (nmodel == 5 && !memcmp(model, "llama", 5)) t->kind = TOKENIZER_KIND_SPM;
    else if (nmodel == 4 && !memcmp(model, "gpt2", 4)) t->kind = TOKENIZER_KIND_BPE;
    else if (nmodel == 4 && !memcmp(model, "bert", 4)) t->kind = TOKENIZER_KIND_WPM;
    else if (nmodel == 6 && !memcmp(model, "gemma4", 6)) t->kind = TOKENIZER_KIND_BPE, t->spm_bpe = true;
    else {
        tokenizer_err(err, errsz, "unsupported tokenizer.ggml.model '%.*s' (supported: llama, gpt2, gemma4, bert)", (int)TM_MIN(nmodel, 64), model);
        return TOKENIZER_ERR_UNSUPPORTED;
    }
    return TOKENIZER_OK;
}

/* The string array under key: its length (at most 2^30, at least 1 if nonempty) in *n. When
 * it is absent the message says "<key> missing" followed by why_needed. */
static tokenizer_status tokenizer_load_strings(const gguf *g, const char *key, bool nonempty,
                                               const char *why_needed, uint64_t *n, char *err,
                                               size_t errsz)
{
    gguf_vtype elt;
    const void *data;
    if (!gguf_get_arr(g, key, &elt, n, &data)) {
        tokenizer_err(err, errsz, "%s missing%s", key, why_needed);
        return TOKENIZER_ERR_MISSING;
    }
    if (elt != GGUF_VT_STRING || (nonempty && *n == 0) || *n > (1u << 30)) {
        tokenizer_err(err, errsz, "%s: expected a %sstring array", key, nonempty ? "non-empty " : "");
        return TOKENIZER_ERR_FORMAT;
    }
    return TOKENIZER_OK;
}

/* Element i of the string array under key (checked by tokenizer_load_strings). */
static tokenizer_status tokenizer_load_string(const gguf *g, const char *key, uint64_t i,
                                              const char **s, size_t *len, char *err, size_t errsz)
{
    if (gguf_arr_str(g, key, i, s, len)) return TOKENIZER_OK;
    tokenizer_err(err, errsz, "%s[%llu] unreadable", key, (unsigned long long)i);
    return TOKENIZER_ERR_FORMAT;
}

/* tokenizer.ggml.tokens into the arena; sizes the per-token arrays (every token normal until
 * its type is read). */
static tokenizer_status tokenizer_load_tokens(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    uint64_t n;
    tokenizer_status st = tokenizer_load_strings(g, "tokenizer.ggml.tokens", true, "", &n, err, errsz);
    if (st != TOKENIZER_OK) return st;
    t->n_vocab = (int32_t)n;
    t->tok_off = calloc(n, sizeof *t->tok_off);
    t->tok_len = calloc(n, sizeof *t->tok_len);
    t->piece_off = calloc(n, sizeof *t->piece_off);
    t->piece_len = calloc(n, sizeof *t->piece_len);
    t->score = calloc(n, sizeof *t->score);
    t->attr = calloc(n, sizeof *t->attr);
    t->eog = calloc(n, 1);
    if (!t->tok_off || !t->tok_len || !t->piece_off || !t->piece_len || !t->score || !t->attr || !t->eog)
        return tokenizer_nomem(err, errsz);
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        char empty[32];
        if ((st = tokenizer_load_string(g, "tokenizer.ggml.tokens", i, &s, &len, err, errsz)) != TOKENIZER_OK) return st;
        if (len == 0) {  /* llama.cpp renames empty tokens */
            len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%llu]", (unsigned long long)i);
            s = empty;
        }
        if (len > UINT32_MAX) {
            tokenizer_err(err, errsz, "token too long");
            return TOKENIZER_ERR_FORMAT;
        }
        uint64_t off = tokenizer_arena_add(t, s, len);
        if (off == UINT64_MAX) return tokenizer_nomem(err, errsz);
        t->tok_off[i] = off;
        t->tok_len[i] = (uint32_t)len;
        if (len > t->max_token_len) t->max_token_len = len;
        t->attr[i] = TOKENIZER_ATTR_NORMAL;
    }
    return TOKENIZER_OK;
}

/* The optional tokenizer.ggml.scores (SPM merge priorities) and tokenizer.ggml.token_type
 * (the attributes); then the text -> id map. */
static tokenizer_status tokenizer_load_scores_types(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    gguf_vtype elt;
    uint64_t n;
    const void *data;
    if (gguf_get_arr(g, "tokenizer.ggml.scores", &elt, &n, &data)) {
        if ((elt != GGUF_VT_FLOAT32 && elt != GGUF_VT_INT32) || n < (uint64_t)t->n_vocab) {
            tokenizer_err(err, errsz, "tokenizer.ggml.scores: expected %d float32 or int32", t->n_vocab);
            return TOKENIZER_ERR_FORMAT;
        }
        for (int32_t i = 0; i < t->n_vocab; i++) {
            if (elt == GGUF_VT_FLOAT32) memcpy(&t->score[i], (const char *)data + 4 * (size_t)i, 4);
            else {
                int32_t v;
                memcpy(&v, (const char *)data + 4 * (size_t)i, 4);
                t->score[i] = (float)v;
            }
        }
    }
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", &elt, &n, &data)) {
        if (elt != GGUF_VT_INT32 || n < (uint64_t)t->n_vocab) {
            tokenizer_err(err, errsz, "tokenizer.ggml.token_type: expected %d int32", t->n_vocab);
            return TOKENIZER_ERR_FORMAT;
        }
        for (int32_t i = 0; i < t->n_vocab; i++) {
            int32_t v;
            memcpy(&v, (const char *)data + 4 * (size_t)i, 4);
            t->attr[i] = tokenizer_attr_of_type(v);
        }
    }
    if (!tokenizer_map_init(&t->tok_map, (size_t)t->n_vocab)) return tokenizer_nomem(err, errsz);
    for (int32_t i = 0; i < t->n_vocab; i++) tokenizer_map_put_token(t, i);
    return TOKENIZER_OK;
}

/* BPE: tokenizer.ggml.merges ("left right", rank = index) into the arena and the
 * (left, right) -> rank map. */
static tokenizer_status tokenizer_load_merges(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    uint64_t n;
    tokenizer_status st = tokenizer_load_strings(g, "tokenizer.ggml.merges", false,
                                                 " (required by gpt2 vocabularies)", &n, err, errsz);
    if (st != TOKENIZER_OK) return st;
    t->n_merges = (int32_t)n;
    t->merge_off = calloc(2 * n + 2, sizeof *t->merge_off);
    t->merge_len = calloc(2 * n + 2, sizeof *t->merge_len);
    if (!t->merge_off || !t->merge_len || !tokenizer_map_init(&t->merge_map, n)) return tokenizer_nomem(err, errsz);
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        if ((st = tokenizer_load_string(g, "tokenizer.ggml.merges", i, &s, &len, err, errsz)) != TOKENIZER_OK) return st;
        /* split at the first space after position 0; none -> ("", "") as in llama.cpp */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        size_t n1 = sp ? (size_t)(sp - s) : 0, n2 = sp ? len - n1 - 1 : 0;
        uint64_t o = tokenizer_arena_add(t, s, len);
        if (o == UINT64_MAX) return tokenizer_nomem(err, errsz);
        t->merge_off[2 * i] = o;
        t->merge_len[2 * i] = (uint32_t)n1;
        t->merge_off[2 * i + 1] = o + n1 + 1;
        t->merge_len[2 * i + 1] = (uint32_t)n2;
        if (!sp) t->merge_off[2 * i + 1] = o;
    }
    for (int32_t i = 0; i < t->n_merges; i++) tokenizer_map_put_merge(t, i);
    return TOKENIZER_OK;
}

/* The special ids and flags: llama.cpp's defaults for the kind (BPE: with its pre-tokenizer
 * and merges), then the file's keys; fim[] gets the fill-in-the-middle ids for the fix-ups. */
static tokenizer_status tokenizer_load_specials(tokenizer *t, const gguf *g, int32_t fim[6], char *err, size_t errsz)
{
    t->bos = t->eos = t->eot = t->eom = t->unk = t->sep = -1;
    bool bv;
    if (t->kind == TOKENIZER_KIND_SPM) {
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else if (t->kind == TOKENIZER_KIND_WPM) {   /* BERT's [CLS] text [SEP], [UNK] 100 */
        t->bos = 101, t->unk = 100, t->sep = 102;
        t->add_bos = t->add_sep = true;
        t->wpm_lower = !gguf_get_bool(g, "tokenizer.ggml.normalizer.lowercase", &bv) || bv;
        t->wpm_strip = t->wpm_lower;
        if (gguf_get_bool(g, "tokenizer.ggml.normalizer.strip_accents", &bv)) t->wpm_strip = bv;
        if (t->sep >= t->n_vocab) t->sep = -1;
        tokenizer_get_id(t, g, "tokenizer.ggml.seperator_token_id", &t->sep);   /* llama.cpp's spelling */
        if (gguf_get_bool(g, "tokenizer.ggml.add_sep_token", &bv)) t->add_sep = bv;
    } else if (t->spm_bpe) {   /* no pre-tokenizer regex (tokenizer_bpe.c cuts at newlines), ids from the file */
        tokenizer_status st = tokenizer_load_merges(t, g, err, errsz);
        if (st != TOKENIZER_OK) return st;
    } else {
        t->bos = 11, t->eos = 11;
        tokenizer_status st = tokenizer_pre_load(t, g, err, errsz);
        if (st == TOKENIZER_OK) st = tokenizer_load_merges(t, g, err, errsz);
        if (st != TOKENIZER_OK) return st;
    }
    if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &bv)) t->add_space_prefix = bv;
    if (t->bos >= t->n_vocab) t->bos = -1;
    if (t->eos >= t->n_vocab) t->eos = -1;
    if (t->unk >= t->n_vocab) t->unk = -1;
    for (int i = 0; i < 6; i++) fim[i] = -1;
    tokenizer_get_id(t, g, "tokenizer.ggml.bos_token_id", &t->bos);
    tokenizer_get_id(t, g, "tokenizer.ggml.eos_token_id", &t->eos);
    tokenizer_get_id(t, g, "tokenizer.ggml.eot_token_id", &t->eot);
    tokenizer_get_id(t, g, "tokenizer.ggml.eom_token_id", &t->eom);
    tokenizer_get_id(t, g, "tokenizer.ggml.unknown_token_id", &t->unk);
    tokenizer_get_id(t, g, "tokenizer.ggml.fim_pre_token_id", &fim[0]);
    tokenizer_get_id(t, g, "tokenizer.ggml.fim_suf_token_id", &fim[1]);
    tokenizer_get_id(t, g, "tokenizer.ggml.fim_mid_token_id", &fim[2]);
    tokenizer_get_id(t, g, "tokenizer.ggml.fim_pad_token_id", &fim[3]);
    tokenizer_get_id(t, g, "tokenizer.ggml.fim_rep_token_id", &fim[4]);
    tokenizer_get_id(t, g, "tokenizer.ggml.fim_sep_token_id", &fim[5]);
    tokenizer_get_id(t, g, "tokenizer.ggml.prefix_token_id", &fim[0]);
    tokenizer_get_id(t, g, "tokenizer.ggml.suffix_token_id", &fim[1]);
    tokenizer_get_id(t, g, "tokenizer.ggml.middle_token_id", &fim[2]);
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv)) t->add_bos = bv;
    if (gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &bv)) t->add_eos = bv;
    if (t->spm_bpe) t->add_bos = true;   /* llama.cpp overrides a gemma4 file's false */
    return TOKENIZER_OK;
}

/* What encoding and decoding look up, derived once the attributes are final: the special
 * tokens longest text first, the SPM byte-fallback tokens, and every token's decoded piece. */
static tokenizer_status tokenizer_build_tables(tokenizer *t, char *err, size_t errsz)
{
    t->special = malloc((size_t)t->n_vocab * sizeof *t->special);
    int32_t *tmp = malloc((size_t)t->n_vocab * sizeof *tmp);
    if (!t->special || !tmp) {
        free(tmp);
        return tokenizer_nomem(err, errsz);
    }
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED | TOKENIZER_ATTR_UNKNOWN))
            t->special[t->n_special++] = i;
    tokenizer_sort_special(t, t->special, tmp, t->n_special);
    free(tmp);

    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        t->byte_tok[b] = tokenizer_find(t, hex, 6);
        if (t->byte_tok[b] < 0) {
            char ch = (char)b;
            t->byte_tok[b] = tokenizer_find(t, &ch, 1);
        }
    }

    bytebuf piece = { 0 };
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint64_t off = tokenizer_decode_piece(t, i, &piece) ? tokenizer_arena_add(t, piece.p ? piece.p : "", piece.len) : UINT64_MAX;
        if (off == UINT64_MAX) {
            bytebuf_free(&piece);
            return tokenizer_nomem(err, errsz);
        }
        t->piece_off[i] = off;
        t->piece_len[i] = (uint32_t)piece.len;
        if (piece.len > t->max_piece_len) t->max_piece_len = piece.len;
    }
    bytebuf_free(&piece);
    return TOKENIZER_OK;
}

tokenizer_status tokenizer_load(const gguf *g, tokenizer **out, char *err, size_t errsz)
{
    *out = NULL;
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tokenizer_nomem(err, errsz);
    int32_t fim[6];  /* fill-in-the-middle ids: pre, suf, mid, pad, rep, sep */
    tokenizer_status st = tokenizer_load_kind(t, g, err, errsz);
    if (st == TOKENIZER_OK) st = tokenizer_load_tokens(t, g, err, errsz);
    if (st == TOKENIZER_OK) st = tokenizer_load_scores_types(t, g, err, errsz);
    if (st == TOKENIZER_OK) st = tokenizer_load_specials(t, g, fim, err, errsz);
    if (st == TOKENIZER_OK) tokenizer_fixups(t, g, fim);
    if (st == TOKENIZER_OK) st = tokenizer_build_tables(t, err, errsz);
    if (st != TOKENIZER_OK) {
        tokenizer_free(t);
        return st;
    }
    *out = t;
    return TOKENIZER_OK;
}

void tokenizer_free(tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_regex; i++)
        if (t->regex[i].code) pcre2_code_free(t->regex[i].code);
    tokenizer_map_free(&t->tok_map);
    tokenizer_map_free(&t->merge_map);
    bytebuf_free(&t->arena);
    free(t->tok_off);
    free(t->tok_len);
    free(t->piece_off);
    free(t->piece_len);
    free(t->score);
    free(t->attr);
    free(t->eog);
    free(t->merge_off);
    free(t->merge_len);
    free(t->special);
    free(t);
}

const char *tokenizer_status_name(tokenizer_status st)
{
    switch (st) {
    case TOKENIZER_OK: return "ok";
    case TOKENIZER_ERR_MISSING: return "missing";
    case TOKENIZER_ERR_FORMAT: return "format";
    case TOKENIZER_ERR_UNSUPPORTED: return "unsupported";
    case TOKENIZER_ERR_NOMEM: return "out of memory";
    }
    return "?";
}

/* ---------------------------------------------------------------------------------------- */
/* accessors                                                                                 */

tokenizer_kind tokenizer_get_kind(const tokenizer *t) { return t->kind; }
int32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const tokenizer *t) { return t->eot; }
bool tokenizer_add_bos(const tokenizer *t) { return t->add_bos && t->bos >= 0; }
size_t tokenizer_max_piece(const tokenizer *t) { return t->max_piece_len; }

bool tokenizer_is_eog(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

uint32_t tokenizer_attr(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->attr[id] : 0;
}

const char *tokenizer_piece(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    size_t n;
    const char *s = tokenizer_text(t, id, &n);
    if (len) *len = n;
    return s;
}
