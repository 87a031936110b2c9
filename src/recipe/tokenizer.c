/*
 * tokenizer: SentencePiece-style and byte-level BPE tokenisation of GGUF vocabularies, written
 * to reproduce llama.cpp's llama-vocab.cpp token for token (see tokenizer.h).
 *
 * Data: every token text and merge is copied into one arena at load; a string -> id hash map
 * (open addressing, last duplicate wins as in llama.cpp) and a (left, right) -> rank map for
 * merges (first duplicate wins). Token attributes and the end-of-generation set follow
 * llama.cpp's load-time fix-ups by token text. Decoded pieces are precomputed per token.
 *
 * Encoding: (1) special-token partition of the text into raw and token fragments; (2) per raw
 * fragment, SPM: one symbol per UTF-8 character of "▁"-escaped text, bigrams merged best score
 * first from a binary heap, leftovers as byte tokens; BPE: the pre-tokenizer splits the code
 * points into words (regexes run by PCRE2 on llama.cpp's collapsed class representation: one
 * byte per code point, non-ASCII letters -> 0xD2, digits -> 0xD1, ... so splits equal
 * std::regex's on the same text), each word is byte-encoded and merged lowest rank first.
 * A merge candidate is stale when either side has changed length since it was queued, which
 * is equivalent to llama.cpp's string comparison and O(1). Each encode call allocates its own
 * scratch, so a const tokenizer is safe to share between threads.
 */
#define _GNU_SOURCE  /* memmem */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "recipe/tokenizer.h"
#include "recipe/unicode.h"
#include "util/util.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZER_MAX_REGEX 8

typedef enum {
    TOKENIZER_RE_COLLAPSED,      /* uses \p{..}: run on the collapsed one-byte-per-code-point text */
    TOKENIZER_RE_WIDE,           /* plain: run on UTF-8 text with non-ASCII spaces -> \v */
    TOKENIZER_RE_TRAILING_SPACE, /* "\s+$", done by hand (PCRE2 would be quadratic on long runs) */
} tokenizer_re_mode;

typedef struct {
    tokenizer_re_mode mode;
    pcre2_code *code;            /* NULL for TRAILING_SPACE */
    bool jit;                    /* JIT-compiled */
} tokenizer_regex;

/* Open-addressing hash: slots hold value+1 (0 = empty); keys are looked up through the owner. */
typedef struct {
    int32_t *slot;               /* (mask + 1) slots */
    uint32_t *hash;              /* high bits of each slot's hash, to skip most compares */
    uint64_t mask;
} tokenizer_map;

struct tokenizer {
    tokenizer_kind kind;
    int32_t n_vocab;
    char *arena;                 /* token texts, then merge halves, then decoded pieces */
    size_t arena_len, arena_cap; /* bytes used / allocated */
    uint64_t *tok_off;           /* (n_vocab) offset of each token text in arena */
    uint32_t *tok_len;           /* (n_vocab) its length in bytes */
    uint64_t *piece_off;         /* (n_vocab) decoded piece (special = true rendering) */
    uint32_t *piece_len;         /* (n_vocab) */
    float *score;                /* (n_vocab) SPM merge priority */
    uint32_t *attr;              /* (n_vocab) TOKENIZER_ATTR_* */
    uint8_t *eog;                /* (n_vocab) 1 if end of generation */
    tokenizer_map tok_map;       /* text -> id */
    size_t max_token_len;        /* longest token text, bytes */
    size_t max_piece_len;        /* longest decoded piece, bytes */

    int32_t n_merges;
    uint64_t *merge_off;         /* (n_merges, 2) arena offsets of the two halves */
    uint32_t *merge_len;         /* (n_merges, 2) their lengths */
    tokenizer_map merge_map;     /* (left, right) -> rank */

    int32_t *special;            /* ids of control/user-defined/unknown tokens, longest first */
    int32_t n_special;

    int32_t bos, eos, eot, eom, unk;  /* -1 if none */
    int32_t byte_tok[256];       /* SPM byte fallback: <0xXX> (or the byte itself), -1 if none */
    bool add_bos, add_eos;
    bool add_space_prefix;       /* SPM: prefix a space to text at the start/after a special */
    bool ignore_merges;          /* BPE: a word that is a whole token is taken as is */

    int n_regex;
    tokenizer_regex regex[TOKENIZER_MAX_REGEX];
};

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

static const char *tokenizer_text(const tokenizer *t, int32_t id, size_t *len)
{
    *len = t->tok_len[id];
    return t->arena + t->tok_off[id];
}

int32_t tokenizer_find(const tokenizer *t, const char *s, size_t len)
{
    if (len > t->max_token_len) return -1;
    uint64_t h = tokenizer_hash(0, s, len);
    uint32_t hh = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->tok_map.mask;; i = (i + 1) & t->tok_map.mask) {
        int32_t v = t->tok_map.slot[i];
        if (v == 0) return -1;
        if (t->tok_map.hash[i] != hh) continue;
        int32_t id = v - 1;
        if (t->tok_len[id] == len && memcmp(t->arena + t->tok_off[id], s, len) == 0) return id;
    }
}

/* Inserts id under its text; a later duplicate replaces the earlier id (llama.cpp's
 * token_to_id[word] = i). */
static void tokenizer_map_put_token(tokenizer *t, int32_t id)
{
    size_t len;
    const char *s = tokenizer_text(t, id, &len);
    uint64_t h = tokenizer_hash(0, s, len);
    uint32_t hh = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->tok_map.mask;; i = (i + 1) & t->tok_map.mask) {
        int32_t v = t->tok_map.slot[i];
        if (v == 0) {
            t->tok_map.slot[i] = id + 1;
            t->tok_map.hash[i] = hh;
            return;
        }
        if (t->tok_map.hash[i] == hh && t->tok_len[v - 1] == len &&
            memcmp(t->arena + t->tok_off[v - 1], s, len) == 0) {
            t->tok_map.slot[i] = id + 1;
            return;
        }
    }
}

static uint64_t tokenizer_merge_hash(const char *a, size_t na, const char *b, size_t nb)
{
    return tokenizer_hash(tokenizer_hash(0x5bd1e995, a, na), b, nb);
}

static bool tokenizer_merge_eq(const tokenizer *t, int32_t r, const char *a, size_t na,
                               const char *b, size_t nb)
{
    return t->merge_len[2 * r] == na && t->merge_len[2 * r + 1] == nb &&
           memcmp(t->arena + t->merge_off[2 * r], a, na) == 0 &&
           memcmp(t->arena + t->merge_off[2 * r + 1], b, nb) == 0;
}

/* Rank of the merge (a, b), -1 if none. */
static int32_t tokenizer_merge_rank(const tokenizer *t, const char *a, size_t na, const char *b,
                                    size_t nb)
{
    uint64_t h = tokenizer_merge_hash(a, na, b, nb);
    uint32_t hh = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->merge_map.mask;; i = (i + 1) & t->merge_map.mask) {
        int32_t v = t->merge_map.slot[i];
        if (v == 0) return -1;
        if (t->merge_map.hash[i] == hh && tokenizer_merge_eq(t, v - 1, a, na, b, nb)) return v - 1;
    }
}

/* Inserts merge r unless an equal pair exists (llama.cpp's bpe_ranks.emplace keeps the first). */
static void tokenizer_map_put_merge(tokenizer *t, int32_t r)
{
    const char *a = t->arena + t->merge_off[2 * r], *b = t->arena + t->merge_off[2 * r + 1];
    size_t na = t->merge_len[2 * r], nb = t->merge_len[2 * r + 1];
    uint64_t h = tokenizer_merge_hash(a, na, b, nb);
    uint32_t hh = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->merge_map.mask;; i = (i + 1) & t->merge_map.mask) {
        int32_t v = t->merge_map.slot[i];
        if (v == 0) {
            t->merge_map.slot[i] = r + 1;
            t->merge_map.hash[i] = hh;
            return;
        }
        if (t->merge_map.hash[i] == hh && tokenizer_merge_eq(t, v - 1, a, na, b, nb)) return;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* growable buffers used while loading and encoding                                          */

typedef struct {
    char *p;
    size_t n, cap;
} tokenizer_buf;

static bool tokenizer_buf_reserve(tokenizer_buf *b, size_t extra)
{
    if (b->n + extra <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static bool tokenizer_buf_add(tokenizer_buf *b, const void *s, size_t n)
{
    if (!tokenizer_buf_reserve(b, n)) return false;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

/* Appends bytes to the arena, returns their offset or UINT64_MAX on failure. */
static uint64_t tokenizer_arena_add(tokenizer *t, const void *s, size_t n)
{
    tokenizer_buf b = { t->arena, t->arena_len, t->arena_cap };
    if (!tokenizer_buf_add(&b, s, n)) return UINT64_MAX;
    t->arena = b.p;
    t->arena_cap = b.cap;
    uint64_t off = t->arena_len;
    t->arena_len = b.n;
    return off;
}

/* ---------------------------------------------------------------------------------------- */
/* pre-tokenizers                                                                            */

#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_GPT4O_MAIN "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACTIONS "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* The pre-tokenizers of llama.cpp (llm_tokenizer_bpe), by tokenizer.ggml.pre. Names are
 * '|'-separated. Only those llama.cpp runs as plain regex lists are here. */
static const struct {
    const char *names;
    bool ignore_merges, add_bos, no_bos;
    const char *re[TOKENIZER_MAX_REGEX];
} tokenizer_pres[] = {
    { "|llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano|", true, true, false,
      { RE_LLAMA3 } },
    { "|dbrx|smaug-bpe|", false, false, false, { RE_LLAMA3 } },
    { "|jais-2|", false, false, false,
      { RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}" } },
    { "|deepseek-llm|", false, false, false,
      { "[\r\n]",
        "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba\xc6\xbc-\xc6\xbf\xc7\x84-\xca\x93\xca\x95-\xca\xaf\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7\xcd\xbb-\xcd\xbd\xcd\xbf\xce\x86\xce\x88-\xce\x8a\xce\x8c\xce\x8e-\xce\xa1\xce\xa3-\xcf\xb5\xcf\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96\xe1\x82\xa0-\xe1\x83\x85\xe1\x8e\xa0-\xe1\x8f\xb5\xe1\x8f\xb8-\xe1\x8f\xbd\xe1\xb2\x90-\xe1\xb2\xba\xe1\xb2\xbd-\xe1\xb2\xbf\xe1\xb4\x80-\xe1\xb4\xab\xe1\xb5\xab-\xe1\xb5\xb7\xe1\xb5\xb9-\xe1\xb6\x9a\xe1\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d\xe1\xbc\xa0-\xe1\xbd\x85\xe1\xbd\x88-\xe1\xbd\x8d\xe1\xbd\x90-\xe1\xbd\x97\xe1\xbd\x99\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd\x9f-\xe1\xbd\xbd\xe1\xbe\x80-\xe1\xbe\xb4\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe\xe1\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-\xe1\xbf\x8c\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac\xe1\xbf\xb2-\xe1\xbf\xb4\xe1\xbf\xb6-\xe1\xbf\xbc\xe2\x84\x82\xe2\x84\x87\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95\xe2\x84\x99-\xe2\x84\x9d\xe2\x84\xa4\xe2\x84\xa6\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf-\xe2\x84\xb4\xe2\x84\xb9\xe2\x84\xbc-\xe2\x84\xbf\xe2\x85\x85-\xe2\x85\x89\xe2\x85\x8e\xe2\x86\x83\xe2\x86\x84\xe2\xb0\x80-\xe2\xb1\xbb\xe2\xb1\xbe-\xe2\xb3\xa4\xe2\xb3\xab-\xe2\xb3\xae\xe2\xb3\xb2\xe2\xb3\xb3\xea\x99\x80-\xea\x99\xad\xea\x9a\x80-\xea\x9a\x9b\xea\x9c\xa2-\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87\xea\x9e\x8b-\xea\x9e\x8e\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-\xef\xac\x86\xef\xac\x93-\xef\xac\x97\xef\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90\x91\x8f\xf0\x90\x92\xb0-\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb\xf0\x90\xb2\x80-\xf0\x90\xb2\xb2\xf0\x90\xb3\x80-\xf0\x90\xb3\xb2\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0\x9e\xa4\x80-\xf0\x9e\xa5\x83]+",
        "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+",
        "\\s+$",
        "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
        "\\p{N}+" } },
    { "|deepseek-v3|hunyuan-dense|joyai-llm|", false, false, false,
      { "\\p{N}{1,3}",
        "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" } },
    { "|deepseek-coder|", false, false, false,
      { "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+", "\\p{N}" } },
    { "|falcon|", false, false, false,
      { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "[0-9][0-9][0-9]" } },
    { "|starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2|", false, false, false,
      { "\\p{N}", RE_GPT2 } },
    { "|gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|mpt|olmo|jais|trillion|granite-docling|exaone4|jina-v1-en|jina-v2-code|roberta-bpe|",
      false, false, false, { RE_GPT2 } },
    { "|qwen2|deepseek-r1-qwen|kormo|f2llmv2|stablelm2|hunyuan|solar-open|megrez|", false, false, false,
      { RE_QWEN2 } },
    { "|qwen35|", false, false, false,
      { RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|poro-chat|bloom|gpt3-finnish|", false, false, false, { " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+" } },
    { "|glm4|chatglm-bpe|", false, false, true, { RE_LLAMA3 } },
    { "|viking|", false, false, false, { " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+", "\\p{N}" } },
    { "|tekken|", true, true, false,
      { "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|chameleon|", false, true, false,
      { "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2 } },
    { "|gpt-4o|llama4|kanana2|talkie|minimax-m2|", false, false, false, { RE_GPT4O_MAIN } },
    { "|bailingmoe|bailingmoe2|llada-moe|", false, false, false,
      { "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+" } },
    { "|seed-coder|", false, false, false,
      { RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|grok-2|", false, false, false, { RE_QWEN2 } },
    { "|laguna|", false, false, false, { "[^\\n]+|[\\n]+", RE_QWEN2 } },
    { "|minicpm5|", true, false, false,
      { "\\p{N}{1,3}",
        RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|default|", false, false, false,
      { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" } },
};

/* Unicode classes llama.cpp's regex splitter knows, the byte that stands for a non-ASCII code
 * point of that class in the collapsed text, and the ASCII members to keep in the class. */
static const struct {
    const char *name;
    uint32_t flag;
} tokenizer_ucat[] = {
    { "\\p{N}", UNICODE_FLAG_NUMBER }, { "\\p{L}", UNICODE_FLAG_LETTER },
    { "\\p{P}", UNICODE_FLAG_PUNCTUATION }, { "\\p{M}", UNICODE_FLAG_MARK },
    { "\\p{S}", UNICODE_FLAG_SYMBOL }, { "\\p{Lu}", UNICODE_FLAG_LETTER },
    { "\\p{Ll}", UNICODE_FLAG_LETTER }, { "\\p{Lt}", UNICODE_FLAG_LETTER },
    { "\\p{Lm}", UNICODE_FLAG_LETTER }, { "\\p{Lo}", UNICODE_FLAG_LETTER },
};

static uint8_t tokenizer_collapsed_byte(uint32_t flag)
{
    switch (flag) {
    case UNICODE_FLAG_NUMBER: return 0xD1;
    case UNICODE_FLAG_LETTER: return 0xD2;
    case UNICODE_FLAG_PUNCTUATION: return 0xD3;
    case UNICODE_FLAG_MARK: return 0xD4;
    case UNICODE_FLAG_SYMBOL: return 0xD5;
    default: return 0xD0;
    }
}

static const char *tokenizer_collapsed_ascii(uint32_t flag)
{
    switch (flag) {
    case UNICODE_FLAG_NUMBER: return "0-9";
    case UNICODE_FLAG_LETTER: return "A-Za-z";
    case UNICODE_FLAG_PUNCTUATION: return "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}";
    case UNICODE_FLAG_SYMBOL: return "\\$\\+<->^`\\|\\~";
    default: return "";
    }
}

/* Rewrites a regex using \p{..} for the collapsed text, exactly as llama.cpp does. */
static bool tokenizer_collapse_regex(const char *re, tokenizer_buf *out)
{
    size_t n = strlen(re);
    bool inside = false;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
            inside = true;
            if (!tokenizer_buf_add(out, "[", 1)) return false;
            continue;
        }
        if (inside && re[i] == ']' && re[i - 1] != '\\') {
            inside = false;
            if (!tokenizer_buf_add(out, "]", 1)) return false;
            continue;
        }
        if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const char *close = strchr(re + i + 3, '}');
            if (close && (size_t)(close - re) <= i + 10) {
                size_t plen = (size_t)(close - re) - i + 1;
                for (size_t k = 0; k < TM_ARRAY_LEN(tokenizer_ucat); k++) {
                    if (strlen(tokenizer_ucat[k].name) == plen && !memcmp(re + i, tokenizer_ucat[k].name, plen)) {
                        uint8_t cb = tokenizer_collapsed_byte(tokenizer_ucat[k].flag);
                        const char *ascii = tokenizer_collapsed_ascii(tokenizer_ucat[k].flag);
                        if (!inside && !tokenizer_buf_add(out, "[", 1)) return false;
                        if (!tokenizer_buf_add(out, &cb, 1) || !tokenizer_buf_add(out, ascii, strlen(ascii))) return false;
                        if (!inside && !tokenizer_buf_add(out, "]", 1)) return false;
                        i = (size_t)(close - re);
                        goto next;
                    }
                }
            }
        }
        if (!tokenizer_buf_add(out, re + i, 1)) return false;
    next:;
    }
    return true;
}

static bool tokenizer_regex_uses_ucat(const char *re)
{
    for (size_t k = 0; k < TM_ARRAY_LEN(tokenizer_ucat); k++)
        if (strstr(re, tokenizer_ucat[k].name)) return true;
    return false;
}

static bool tokenizer_regex_compile(tokenizer_regex *r, const char *re, char *err, size_t errsz)
{
    if (!strcmp(re, "\\s+$")) {
        r->mode = TOKENIZER_RE_TRAILING_SPACE;
        return true;
    }
    tokenizer_buf pat = { 0 };
    uint32_t opts = PCRE2_DOLLAR_ENDONLY;
    if (tokenizer_regex_uses_ucat(re)) {
        r->mode = TOKENIZER_RE_COLLAPSED;
        if (!tokenizer_collapse_regex(re, &pat)) {
            free(pat.p);
            snprintf(err, errsz, "out of memory");
            return false;
        }
    } else {
        r->mode = TOKENIZER_RE_WIDE;
        opts |= PCRE2_UTF;
        if (!tokenizer_buf_add(&pat, re, strlen(re))) {
            free(pat.p);
            snprintf(err, errsz, "out of memory");
            return false;
        }
    }
    int ec;
    PCRE2_SIZE eo;
    r->code = pcre2_compile((PCRE2_SPTR)pat.p, pat.n, opts, &ec, &eo, NULL);
    free(pat.p);
    if (!r->code) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, errsz, "pre-tokenizer regex does not compile at %zu: %s", (size_t)eo, (char *)msg);
        return false;
    }
    r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
    return true;
}

/* One word (or gap) of the pre-tokenizer: code points [start, start + n). */
typedef struct {
    uint32_t start, n;
} tokenizer_seg;

typedef struct {
    tokenizer_seg *v;
    size_t n, cap;
} tokenizer_segs;

static bool tokenizer_segs_push(tokenizer_segs *s, uint32_t start, uint32_t n)
{
    if (n == 0) return true;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        tokenizer_seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (tokenizer_seg){ start, n };
    return true;
}

/* Per-encode scratch, grown as needed and freed at the end of the call. */
typedef struct {
    int32_t *out;                /* tokens produced */
    size_t n_out, cap_out;
    uint32_t *cpts;              /* BPE: code points of the fragment */
    size_t cap_cpts;
    char *coll;                  /* collapsed text (one byte per code point), NULL until needed */
    char *wide;                  /* UTF-8 text for plain regexes, NULL until needed */
    uint32_t *wide_off;          /* (n_cpts + 1) byte offset of each code point in wide */
    tokenizer_segs segs, segs2;  /* pre-tokenizer output, double-buffered */
    tokenizer_buf word;          /* the byte-encoded word / the escaped SPM text */
    struct tokenizer_sym { int32_t prev, next; uint32_t start, n; } *sym;
    size_t cap_sym;
    struct tokenizer_bigram { float key; int32_t left, right; uint32_t size; } *heap;
    size_t n_heap, cap_heap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    bool oom;
} tokenizer_scratch;

static void tokenizer_scratch_free(tokenizer_scratch *s)
{
    free(s->out);
    free(s->cpts);
    free(s->coll);
    free(s->wide);
    free(s->wide_off);
    free(s->segs.v);
    free(s->segs2.v);
    free(s->word.p);
    free(s->sym);
    free(s->heap);
    if (s->md) pcre2_match_data_free(s->md);
    if (s->mctx) pcre2_match_context_free(s->mctx);
    if (s->jstack) pcre2_jit_stack_free(s->jstack);
}

static void tokenizer_emit(tokenizer_scratch *s, int32_t id)
{
    if (s->n_out == s->cap_out) {
        size_t cap = s->cap_out ? s->cap_out * 2 : 256;
        int32_t *o = realloc(s->out, cap * sizeof *o);
        if (!o) {
            s->oom = true;
            return;
        }
        s->out = o;
        s->cap_out = cap;
    }
    s->out[s->n_out++] = id;
}

static bool tokenizer_grow(void **p, size_t *cap, size_t need, size_t elt)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elt);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* Runs a PCRE2 regex over subject[0..len) the way std::regex_iterator walks a range: every
 * match and every gap between matches becomes a segment (offsets are in subject units). */
static bool tokenizer_regex_run(const tokenizer_regex *r, tokenizer_scratch *s, const char *subject,
                                size_t len, size_t *bounds, size_t *nb, size_t cap_bounds)
{
    size_t pos = 0, last = 0;
    *nb = 0;
    while (pos <= len) {
        int rc;
        if (r->jit) {
            rc = pcre2_jit_match(r->code, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
                if (!s->jstack) {
                    s->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
                    if (!s->jstack) return false;
                    pcre2_jit_stack_assign(s->mctx, NULL, s->jstack);
                    continue;
                }
                rc = pcre2_match(r->code, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s->md, s->mctx);
            }
        } else {
            rc = pcre2_match(r->code, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        }
        if (rc < 0) break;  /* no match (or a resource error: the rest stays one segment) */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {  /* empty match: step one character */
            pos = ms + 1;
            if (r->mode == TOKENIZER_RE_WIDE)
                while (pos < len && ((uint8_t)subject[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (*nb + 4 > cap_bounds) return false;
        if (ms > last) bounds[(*nb)++] = ms;  /* gap [last, ms) ends */
        bounds[(*nb)++] = me;                 /* match [ms, me) ends */
        last = me;
        pos = me;
    }
    return true;
}

/* Splits code points cpts[0..n) into words with the tokenizer's regex list. */
static bool tokenizer_pretokenize(const tokenizer *t, tokenizer_scratch *s, const uint32_t *cpts, size_t n)
{
    s->segs.n = 0;
    if (!tokenizer_segs_push(&s->segs, 0, (uint32_t)n)) return false;
    size_t *bounds = NULL;
    size_t cap_bounds = 0;
    bool ok = true;
    for (int ri = 0; ri < t->n_regex && ok; ri++) {
        const tokenizer_regex *r = &t->regex[ri];
        s->segs2.n = 0;
        if (r->mode == TOKENIZER_RE_COLLAPSED && !s->coll) {
            s->coll = malloc(n + 1);
            if (!s->coll) { ok = false; break; }
            for (size_t i = 0; i < n; i++) {
                uint32_t c = cpts[i];
                if (c < 128) { s->coll[i] = (char)c; continue; }
                uint32_t f = unicode_flags(c);
                s->coll[i] = (f & UNICODE_FLAG_WHITESPACE) ? '\v' : (char)tokenizer_collapsed_byte(f & UNICODE_FLAG_CATEGORIES);
            }
        }
        if (r->mode == TOKENIZER_RE_WIDE && !s->wide) {
            s->wide = malloc(4 * n + 1);
            s->wide_off = malloc((n + 1) * sizeof *s->wide_off);
            if (!s->wide || !s->wide_off) { ok = false; break; }
            uint32_t off = 0;
            for (size_t i = 0; i < n; i++) {
                uint32_t c = cpts[i];
                if (c > 0x7F && (unicode_flags(c) & UNICODE_FLAG_WHITESPACE)) c = '\v';
                s->wide_off[i] = off;
                off += (uint32_t)unicode_encode(c, s->wide + off);
            }
            s->wide_off[n] = off;
        }
        for (size_t si = 0; si < s->segs.n && ok; si++) {
            tokenizer_seg g = s->segs.v[si];
            if (r->mode == TOKENIZER_RE_TRAILING_SPACE) {
                uint32_t k = g.n;
                while (k > 0 && (unicode_flags(cpts[g.start + k - 1]) & UNICODE_FLAG_WHITESPACE)) k--;
                ok = tokenizer_segs_push(&s->segs2, g.start, k) && tokenizer_segs_push(&s->segs2, g.start + k, g.n - k);
                continue;
            }
            const char *subj;
            size_t len;
            if (r->mode == TOKENIZER_RE_COLLAPSED) {
                subj = s->coll + g.start;
                len = g.n;
            } else {
                subj = s->wide + s->wide_off[g.start];
                len = s->wide_off[g.start + g.n] - s->wide_off[g.start];
            }
            size_t nb;
            if (!tokenizer_grow((void **)&bounds, &cap_bounds, 2 * len + 8, sizeof *bounds) ||
                !tokenizer_regex_run(r, s, subj, len, bounds, &nb, cap_bounds)) {
                ok = false;
                break;
            }
            /* bounds are segment ends in subject units; convert to code points */
            uint32_t prev = g.start;
            size_t wi = g.start;  /* wide: code point index being located */
            for (size_t b = 0; b <= nb && ok; b++) {
                uint32_t end;
                if (b == nb) {
                    end = g.start + g.n;
                } else if (r->mode == TOKENIZER_RE_COLLAPSED) {
                    end = g.start + (uint32_t)bounds[b];
                } else {
                    uint32_t target = s->wide_off[g.start] + (uint32_t)bounds[b];
                    while (s->wide_off[wi] < target) wi++;
                    end = (uint32_t)wi;
                }
                ok = tokenizer_segs_push(&s->segs2, prev, end - prev);
                prev = end;
            }
        }
        tokenizer_segs tmp = s->segs;
        s->segs = s->segs2;
        s->segs2 = tmp;
    }
    free(bounds);
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* merging                                                                                   */

typedef struct tokenizer_sym tokenizer_sym;
typedef struct tokenizer_bigram tokenizer_bigram;

/* Heap order: larger key first, then smaller left. SPM keys are scores, BPE keys are -rank. */
static bool tokenizer_bigram_before(const tokenizer_bigram *a, const tokenizer_bigram *b)
{
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static void tokenizer_heap_push(tokenizer_scratch *s, tokenizer_bigram bg)
{
    if (!tokenizer_grow((void **)&s->heap, &s->cap_heap, s->n_heap + 1, sizeof *s->heap)) {
        s->oom = true;
        return;
    }
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tokenizer_bigram_before(&bg, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = bg;
}

static tokenizer_bigram tokenizer_heap_pop(tokenizer_scratch *s)
{
    tokenizer_bigram top = s->heap[0], last = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && tokenizer_bigram_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!tokenizer_bigram_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Queues the pair (left, right) of text if it may merge. */
static void tokenizer_try_pair(const tokenizer *t, tokenizer_scratch *s, const char *text, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return;
    const tokenizer_sym *l = &s->sym[left], *r = &s->sym[right];
    tokenizer_bigram bg = { 0, left, right, l->n + r->n };
    if (t->kind == TOKENIZER_KIND_SPM) {
        int32_t id = tokenizer_find(t, text + l->start, l->n + r->n);
        if (id < 0) return;
        bg.key = t->score[id];
    } else {
        int32_t rank = tokenizer_merge_rank(t, text + l->start, l->n, text + r->start, r->n);
        if (rank < 0) return;
        bg.key = -(float)rank;  /* exact: ranks < 2^24 */
    }
    tokenizer_heap_push(s, bg);
}

/* Splits text[0..n) into one symbol per UTF-8 character and merges pairs until none applies.
 * Leaves the symbol chain in s->sym (0 is the first, -1 ends it). */
static bool tokenizer_merge(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t n)
{
    if (!tokenizer_grow((void **)&s->sym, &s->cap_sym, n + 1, sizeof *s->sym)) return false;
    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t l = unicode_len_utf8((uint8_t)text[off]);
        if (l > n - off) l = n - off;
        s->sym[ns] = (tokenizer_sym){ ns - 1, off + l == n ? -1 : ns + 1, (uint32_t)off, (uint32_t)l };
        ns++;
        off += l;
    }
    s->n_heap = 0;
    for (int32_t i = 1; i < ns; i++) tokenizer_try_pair(t, s, text, i - 1, i);
    while (s->n_heap > 0 && !s->oom) {
        tokenizer_bigram bg = tokenizer_heap_pop(s);
        tokenizer_sym *l = &s->sym[bg.left], *r = &s->sym[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size) continue;  /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->sym[r->next].prev = bg.left;
        tokenizer_try_pair(t, s, text, l->prev, bg.left);
        tokenizer_try_pair(t, s, text, bg.left, l->next);
    }
    return !s->oom;
}

/* SPM on an already escaped text: merged symbols that are tokens, else byte tokens. */
static void tokenizer_spm(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t n)
{
    if (n == 0 || !tokenizer_merge(t, s, text, n)) return;
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const tokenizer_sym *y = &s->sym[i];
        int32_t id = tokenizer_find(t, text + y->start, y->n);
        if (id >= 0) {
            tokenizer_emit(s, id);
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t b = t->byte_tok[(uint8_t)text[y->start + j]];
            if (b >= 0) tokenizer_emit(s, b);
            else if (t->unk >= 0) tokenizer_emit(s, t->unk);
        }
    }
}

/* BPE on one pre-tokenized word of code points. */
static void tokenizer_bpe_word(const tokenizer *t, tokenizer_scratch *s, const uint32_t *cpts, size_t n)
{
    s->word.n = 0;
    for (size_t i = 0; i < n; i++) {
        char u[4];
        int nu = unicode_encode(cpts[i], u);
        for (int k = 0; k < nu; k++) {
            char m[4];
            int nm = unicode_encode(unicode_byte_to_cpt((uint8_t)u[k]), m);
            if (!tokenizer_buf_add(&s->word, m, (size_t)nm)) {
                s->oom = true;
                return;
            }
        }
    }
    const char *w = s->word.p;
    size_t wn = s->word.n;
    if (t->ignore_merges) {
        int32_t id = tokenizer_find(t, w, wn);
        if (id >= 0) {
            tokenizer_emit(s, id);
            return;
        }
    }
    if (!tokenizer_merge(t, s, w, wn)) return;
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const tokenizer_sym *y = &s->sym[i];
        int32_t id = tokenizer_find(t, w + y->start, y->n);
        if (id >= 0) {
            tokenizer_emit(s, id);
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {  /* llama.cpp: each raw byte as a 1-byte token */
            int32_t b = tokenizer_find(t, w + y->start + j, 1);
            if (b >= 0) tokenizer_emit(s, b);
        }
    }
}

static void tokenizer_bpe(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t len)
{
    if (!tokenizer_grow((void **)&s->cpts, &s->cap_cpts, len + 1, sizeof *s->cpts)) {
        s->oom = true;
        return;
    }
    size_t n = 0;
    for (size_t pos = 0; pos < len;) s->cpts[n++] = unicode_decode(text, len, &pos);
    free(s->coll);
    free(s->wide);
    free(s->wide_off);
    s->coll = s->wide = NULL;
    s->wide_off = NULL;
    if (!tokenizer_pretokenize(t, s, s->cpts, n)) {
        s->oom = true;
        return;
    }
    for (size_t i = 0; i < s->segs.n && !s->oom; i++)
        tokenizer_bpe_word(t, s, s->cpts + s->segs.v[i].start, s->segs.v[i].n);
}

/* ---------------------------------------------------------------------------------------- */
/* special-token partition                                                                   */

typedef struct {
    int32_t tok;                 /* token id, or -1 for raw text */
    size_t off, len;             /* raw text: bytes of the input */
} tokenizer_frag;

typedef struct {
    tokenizer_frag *v;
    size_t n, cap;
} tokenizer_frags;

static bool tokenizer_frags_push(tokenizer_frags *f, int32_t tok, size_t off, size_t len)
{
    if (!tokenizer_grow((void **)&f->v, &f->cap, f->n + 1, sizeof *f->v)) return false;
    f->v[f->n++] = (tokenizer_frag){ tok, off, len };
    return true;
}

static bool tokenizer_isspace(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* llama.cpp's tokenizer_st_partition: cuts every occurrence of each special token (longest
 * first) out of the raw fragments. */
static bool tokenizer_partition(const tokenizer *t, const char *text, size_t len, bool parse_special,
                                tokenizer_frags *frags)
{
    tokenizer_frags other = { 0 };
    frags->n = 0;
    if (len > 0 && !tokenizer_frags_push(frags, -1, 0, len)) return false;
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint32_t a = t->attr[id];
        if (!parse_special && (a & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_UNKNOWN))) continue;
        size_t tl;
        const char *tt = tokenizer_text(t, id, &tl);
        other.n = 0;
        for (size_t i = 0; i < frags->n; i++) {
            tokenizer_frag f = frags->v[i];
            if (f.tok >= 0 || f.len < tl) {
                if (!tokenizer_frags_push(&other, f.tok, f.off, f.len)) goto oom;
                continue;
            }
            size_t off = f.off, n = f.len;
            for (;;) {
                const char *m = n >= tl ? memmem(text + off, n, tt, tl) : NULL;
                if (!m) {
                    if (n > 0 && !tokenizer_frags_push(&other, -1, off, n)) goto oom;
                    break;
                }
                size_t mo = (size_t)(m - text);
                if (mo > off) {
                    size_t ll = mo - off;
                    if (a & TOKENIZER_ATTR_LSTRIP)
                        while (ll > 0 && tokenizer_isspace(text[off + ll - 1])) ll--;
                    if (ll > 0 && !tokenizer_frags_push(&other, -1, off, ll)) goto oom;
                }
                if (!tokenizer_frags_push(&other, id, 0, 0)) goto oom;
                size_t end = off + n;
                if (mo + tl >= end) break;
                off = mo + tl;
                n = end - off;
                if (a & TOKENIZER_ATTR_RSTRIP)
                    while (n > 0 && tokenizer_isspace(text[off])) off++, n--;
            }
        }
        tokenizer_frags tmp = *frags;
        *frags = other;
        other = tmp;
    }
    free(other.v);
    return true;
oom:
    free(other.v);
    return false;
}

/* ---------------------------------------------------------------------------------------- */
/* encode                                                                                    */

int32_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, int32_t *out, int32_t cap)
{
    if (!t || (!text && len > 0) || cap < 0 || (cap > 0 && !out) || len > (size_t)INT32_MAX / 4) return -1;
    tokenizer_scratch s = { 0 };
    tokenizer_frags frags = { 0 };
    int32_t ret = -1;
    s.md = pcre2_match_data_create(1, NULL);
    s.mctx = pcre2_match_context_create(NULL);
    if (!s.md || !s.mctx || !tokenizer_partition(t, text, len, parse_special, &frags)) goto done;

    if (add_special && t->add_bos && t->bos >= 0) tokenizer_emit(&s, t->bos);
    if (t->kind == TOKENIZER_KIND_SPM) {
        bool prev_special = true;  /* a space is prefixed at the start and after special tokens */
        for (size_t i = 0; i < frags.n && !s.oom; i++) {
            tokenizer_frag f = frags.v[i];
            if (f.tok >= 0) {
                tokenizer_emit(&s, f.tok);
                prev_special = true;
                continue;
            }
            s.word.n = 0;
            if (t->add_space_prefix && prev_special && !tokenizer_buf_add(&s.word, "\xe2\x96\x81", 3)) s.oom = true;
            for (size_t j = 0; j < f.len && !s.oom; j++) {
                bool ok = text[f.off + j] == ' ' ? tokenizer_buf_add(&s.word, "\xe2\x96\x81", 3)
                                                 : tokenizer_buf_add(&s.word, text + f.off + j, 1);
                if (!ok) s.oom = true;
            }
            if (s.oom) break;
            tokenizer_spm(t, &s, s.word.p, s.word.n);
            prev_special = false;
        }
    } else {
        for (size_t i = 0; i < frags.n && !s.oom; i++) {
            tokenizer_frag f = frags.v[i];
            if (f.tok >= 0) tokenizer_emit(&s, f.tok);
            else tokenizer_bpe(t, &s, text + f.off, f.len);
        }
    }
    if (add_special && t->add_eos && t->eos >= 0) tokenizer_emit(&s, t->eos);
    if (s.oom) goto done;
    if (s.n_out > (size_t)INT32_MAX) goto done;
    if (cap > 0 && s.n_out > 0) memcpy(out, s.out, TM_MIN(s.n_out, (size_t)cap) * sizeof *out);
    ret = (int32_t)s.n_out;
done:
    free(frags.v);
    tokenizer_scratch_free(&s);
    return ret;
}

/* ---------------------------------------------------------------------------------------- */
/* loading                                                                                   */

static void tokenizer_err(char *err, size_t errsz, const char *fmt, ...)
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

/* Decoded bytes of a token rendered with special = true (llama.cpp's token_to_piece cache). */
static bool tokenizer_decode_piece(const tokenizer *t, int32_t id, tokenizer_buf *b)
{
    size_t n;
    const char *s = tokenizer_text(t, id, &n);
    uint32_t a = t->attr[id];
    b->n = 0;
    if (a & (TOKENIZER_ATTR_UNKNOWN | TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED))
        return tokenizer_buf_add(b, s, n);
    if (a & TOKENIZER_ATTR_NORMAL) {
        if (t->kind == TOKENIZER_KIND_SPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                    if (!tokenizer_buf_add(b, " ", 1)) return false;
                    i += 3;
                } else {
                    if (!tokenizer_buf_add(b, s + i, 1)) return false;
                    i++;
                }
            }
            return true;
        }
        for (size_t pos = 0; pos < n;) {
            size_t p0 = pos;
            uint32_t c = unicode_decode(s, n, &pos);
            int byte = unicode_cpt_to_byte(c);
            if (byte >= 0) {
                char ch = (char)byte;
                if (!tokenizer_buf_add(b, &ch, 1)) return false;
            } else {  /* llama.cpp's "[UNK_BYTE_0x..<text>]" */
                char u[4], hex[16];
                int nu = unicode_encode(c, u);
                (void)p0;
                if (!tokenizer_buf_add(b, "[UNK_BYTE_0x", 12)) return false;
                for (int k = 0; k < nu; k++) {
                    snprintf(hex, sizeof hex, "%02x", (uint8_t)u[k]);
                    if (!tokenizer_buf_add(b, hex, 2)) return false;
                }
                if (!tokenizer_buf_add(b, s, n) || !tokenizer_buf_add(b, "]", 1)) return false;
            }
        }
        return true;
    }
    if (a & TOKENIZER_ATTR_BYTE) {
        char hex[3] = { n > 3 ? s[3] : 0, n > 4 ? s[4] : 0, 0 };
        char ch = (char)strtol(hex, NULL, 16);
        return tokenizer_buf_add(b, &ch, 1);
    }
    return true;
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

/* tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE). */
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
    else {
        tokenizer_err(err, errsz, "unsupported tokenizer.ggml.model '%.*s' (supported: llama, gpt2)", (int)TM_MIN(nmodel, 64), model);
        return TOKENIZER_ERR_UNSUPPORTED;
    }
    return TOKENIZER_OK;
}

/* tokenizer.ggml.tokens into the arena; sizes the per-token arrays (every token normal until
 * its type is read). */
static tokenizer_status tokenizer_load_tokens(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    gguf_vtype elt;
    uint64_t n;
    const void *data;
    if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &elt, &n, &data)) {
        tokenizer_err(err, errsz, "tokenizer.ggml.tokens missing");
        return TOKENIZER_ERR_MISSING;
    }
    if (elt != GGUF_VT_STRING || n == 0 || n > (1u << 30)) {
        tokenizer_err(err, errsz, "tokenizer.ggml.tokens: expected a non-empty string array");
        return TOKENIZER_ERR_FORMAT;
    }
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
        if (!gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len)) {
            tokenizer_err(err, errsz, "tokenizer.ggml.tokens[%llu] unreadable", (unsigned long long)i);
            return TOKENIZER_ERR_FORMAT;
        }
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

/* BPE: tokenizer.ggml.pre chooses the pre-tokenizer (its regexes, BOS handling, whether
 * whole-token words skip merging). */
static tokenizer_status tokenizer_load_pre(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    const char *pre = NULL;
    size_t npre = 0;
    if (!gguf_get_str(g, "tokenizer.ggml.pre", &pre, &npre)) pre = "default", npre = 7;
    char pname[80];
    if (npre == 0 || npre >= sizeof pname - 2) pre = "default", npre = 7;
    snprintf(pname, sizeof pname, "|%.*s|", (int)npre, pre);
    size_t k;
    for (k = 0; k < TM_ARRAY_LEN(tokenizer_pres); k++)
        if (strstr(tokenizer_pres[k].names, pname)) break;
    if (k == TM_ARRAY_LEN(tokenizer_pres)) {
        tokenizer_err(err, errsz, "unsupported pre-tokenizer tokenizer.ggml.pre = '%.*s'", (int)TM_MIN(npre, 64), pre);
        return TOKENIZER_ERR_UNSUPPORTED;
    }
    t->ignore_merges = tokenizer_pres[k].ignore_merges;
    t->add_bos = tokenizer_pres[k].add_bos;
    if (tokenizer_pres[k].no_bos) t->bos = -1;
    for (int r = 0; r < TOKENIZER_MAX_REGEX && tokenizer_pres[k].re[r]; r++) {
        if (!tokenizer_regex_compile(&t->regex[r], tokenizer_pres[k].re[r], err, errsz)) return TOKENIZER_ERR_FORMAT;
        t->n_regex = r + 1;
    }
    return TOKENIZER_OK;
}

/* BPE: tokenizer.ggml.merges ("left right", rank = index) into the arena and the
 * (left, right) -> rank map. */
static tokenizer_status tokenizer_load_merges(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    gguf_vtype elt;
    uint64_t n;
    const void *data;
    if (!gguf_get_arr(g, "tokenizer.ggml.merges", &elt, &n, &data)) {
        tokenizer_err(err, errsz, "tokenizer.ggml.merges missing (required by gpt2 vocabularies)");
        return TOKENIZER_ERR_MISSING;
    }
    if (elt != GGUF_VT_STRING || n > (1u << 30)) {
        tokenizer_err(err, errsz, "tokenizer.ggml.merges: expected a string array");
        return TOKENIZER_ERR_FORMAT;
    }
    t->n_merges = (int32_t)n;
    t->merge_off = calloc(2 * n + 2, sizeof *t->merge_off);
    t->merge_len = calloc(2 * n + 2, sizeof *t->merge_len);
    if (!t->merge_off || !t->merge_len || !tokenizer_map_init(&t->merge_map, n)) return tokenizer_nomem(err, errsz);
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        if (!gguf_arr_str(g, "tokenizer.ggml.merges", i, &s, &len)) {
            tokenizer_err(err, errsz, "tokenizer.ggml.merges[%llu] unreadable", (unsigned long long)i);
            return TOKENIZER_ERR_FORMAT;
        }
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
    t->bos = t->eos = t->eot = t->eom = t->unk = -1;
    if (t->kind == TOKENIZER_KIND_SPM) {
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else {
        t->bos = 11, t->eos = 11;
        tokenizer_status st = tokenizer_load_pre(t, g, err, errsz);
        if (st == TOKENIZER_OK) st = tokenizer_load_merges(t, g, err, errsz);
        if (st != TOKENIZER_OK) return st;
    }
    bool bv;
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

    tokenizer_buf piece = { 0 };
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint64_t off = tokenizer_decode_piece(t, i, &piece) ? tokenizer_arena_add(t, piece.p ? piece.p : "", piece.n) : UINT64_MAX;
        if (off == UINT64_MAX) {
            free(piece.p);
            return tokenizer_nomem(err, errsz);
        }
        t->piece_off[i] = off;
        t->piece_len[i] = (uint32_t)piece.n;
        if (piece.n > t->max_piece_len) t->max_piece_len = piece.n;
    }
    free(piece.p);
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
    free(t->arena);
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
/* accessors and decoding                                                                    */

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

/* Decoded piece of id without copying; NULL if out of range. */
static const char *tokenizer_decoded(const tokenizer *t, int32_t id, bool special, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (!special && (t->attr[id] & (TOKENIZER_ATTR_UNKNOWN | TOKENIZER_ATTR_CONTROL))) {
        *len = 0;
        return "";
    }
    *len = t->piece_len[id];
    return t->arena + t->piece_off[id];
}

int tokenizer_token_to_piece(const tokenizer *t, int32_t id, char *buf, int cap, bool special)
{
    size_t n;
    const char *p = tokenizer_decoded(t, id, special, &n);
    if (!p) return -1;
    if (cap >= 0 && n <= (size_t)cap && n > 0) memcpy(buf, p, n);
    return (int)n;
}

void tokenizer_stream_init(tokenizer_stream *s, const tokenizer *t)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->prev = -1;
}

size_t tokenizer_stream_push(tokenizer_stream *s, int32_t id, char *out, size_t cap)
{
    const tokenizer *t = s->tok;
    size_t n = 0;
    const char *p = tokenizer_decoded(t, id, s->special, &n);
    if (!p) p = "", n = 0;
    if (t->kind == TOKENIZER_KIND_SPM && t->add_space_prefix && s->prev >= 0 && s->prev == t->bos &&
        n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    size_t total = s->npend + n;
    uint8_t tail[8];
    size_t ready;
    /* decide what is ready by looking at the last bytes of pend + piece */
    size_t nt = TM_MIN(total, (size_t)4);
    for (size_t i = 0; i < nt; i++) {
        size_t idx = total - nt + i;
        tail[i] = idx < s->npend ? (uint8_t)s->pend[idx] : (uint8_t)p[idx - s->npend];
    }
    ready = total - unicode_utf8_tail((const char *)tail, nt);   /* an unfinished character waits */
    if (ready > cap) return ready;
    for (size_t i = 0; i < ready; i++) out[i] = i < s->npend ? s->pend[i] : p[i - s->npend];
    char keep[4];
    size_t nk = total - ready;
    for (size_t i = 0; i < nk; i++) {
        size_t idx = ready + i;
        keep[i] = idx < s->npend ? s->pend[idx] : p[idx - s->npend];
    }
    memcpy(s->pend, keep, nk);
    s->npend = (uint8_t)nk;
    s->prev = id;
    return ready;
}

size_t tokenizer_stream_flush(tokenizer_stream *s, char *out, size_t cap)
{
    size_t n = s->npend;
    if (n > cap) return n;
    memcpy(out, s->pend, n);
    s->npend = 0;
    return n;
}
