/*
 * tokenizer_bpe: the merge engine both kinds share, and byte-level BPE.
 *
 * Merging: a text is split into one symbol per UTF-8 character; every adjacent pair that may
 * merge is queued in a binary heap (SPM: by the merged token's score, best first; BPE: by merge
 * rank, lowest first) and pairs are merged until none applies. A queued pair is stale when
 * either side has changed length since it was queued, which is equivalent to llama.cpp's
 * string comparison and O(1).
 *
 * Byte-level BPE: the pre-tokenizer (tokenizer_pre.c) splits a fragment's code points into
 * words; each word is mapped byte by byte to GPT-2 code points and merged; a merged symbol
 * that is no token is emitted as one-byte tokens, as llama.cpp does.
 *
 * SentencePiece-spelled BPE (Gemma 4's "gemma4" vocabulary, spm_bpe): spaces become U+2581, the
 * text is cut into runs of newlines and runs of anything else (llama.cpp's "[^\n]+|[\n]+"),
 * and each run is merged on its raw UTF-8; a run of newlines that is itself a token is taken
 * whole; a merged symbol that is no token falls back to <0xXX> byte tokens.
 */
#include "recipe/tokenizer_int.h"
#include "util/unicode.h"

#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------- */
/* merging                                                                                   */

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

/* The token a byte of a merged symbol that is no token falls back to, -1 if none: SPM's
 * <0xXX> byte token, else the unknown token; BPE's one-byte token of that byte's text
 * (llama.cpp drops the byte when there is none). */
static int32_t tokenizer_byte_fallback(const tokenizer *t, const char *c)
{
    if (t->spm_bpe) {   /* only the <0xXX> token; without one llama.cpp drops the byte */
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", (uint8_t)*c);
        return tokenizer_find(t, hex, 6);
    }
    if (t->kind == TOKENIZER_KIND_BPE) return tokenizer_find(t, c, 1);
    int32_t b = t->byte_tok[(uint8_t)*c];
    return b >= 0 ? b : t->unk;
}

void tokenizer_bpe_merge(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t n)
{
    if (n == 0 || !tokenizer_merge(t, s, text, n)) return;
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const tokenizer_sym *y = &s->sym[i];
        int32_t id = tokenizer_find(t, text + y->start, y->n);
        if (id >= 0) {
            tokenizer_encode_emit(s, id);
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t b = tokenizer_byte_fallback(t, text + y->start + j);
            if (b >= 0) tokenizer_encode_emit(s, b);
        }
    }
}

/* BPE on one pre-tokenized word of code points. */
static void tokenizer_bpe_word(const tokenizer *t, tokenizer_scratch *s, const uint32_t *cpts, size_t n)
{
    s->word.len = 0;
    for (size_t i = 0; i < n; i++) {
        char u[4];
        int nu = unicode_encode(cpts[i], u);
        for (int k = 0; k < nu; k++) {
            char m[4];
            int nm = unicode_encode(unicode_byte_to_cpt((uint8_t)u[k]), m);
            if (!bytebuf_try_append(&s->word, m, (size_t)nm)) {
                s->oom = true;
                return;
            }
        }
    }
    const char *w = s->word.p;
    size_t wn = s->word.len;
    if (t->ignore_merges) {
        int32_t id = tokenizer_find(t, w, wn);
        if (id >= 0) {
            tokenizer_encode_emit(s, id);
            return;
        }
    }
    tokenizer_bpe_merge(t, s, w, wn);
}

/* spm_bpe on one fragment (see the file comment). */
static void tokenizer_spm_bpe(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t len)
{
    s->word.len = 0;
    for (size_t i = 0; i < len; i++) {
        bool ok = text[i] == ' ' ? bytebuf_try_append(&s->word, "\xe2\x96\x81", 3) : bytebuf_try_append(&s->word, text + i, 1);
        if (!ok) {
            s->oom = true;
            return;
        }
    }
    const char *w = s->word.p;
    const size_t n = s->word.len;
    for (size_t a = 0; a < n && !s->oom;) {
        const bool nl = w[a] == '\n';
        size_t b = a;
        while (b < n && (w[b] == '\n') == nl) b++;
        int32_t id = nl ? tokenizer_find(t, w + a, b - a) : -1;
        if (id >= 0) tokenizer_encode_emit(s, id);
        else tokenizer_bpe_merge(t, s, w + a, b - a);
        a = b;
    }
}

static void tokenizer_bpe(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t len)
{
    if (t->spm_bpe) {
        tokenizer_spm_bpe(t, s, text, len);
        return;
    }
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
    if (!tokenizer_pre_split(t, s, s->cpts, n)) {
        s->oom = true;
        return;
    }
    for (size_t i = 0; i < s->segs.n && !s->oom; i++)
        tokenizer_bpe_word(t, s, s->cpts + s->segs.v[i].start, s->segs.v[i].n);
}

void tokenizer_bpe_encode(const tokenizer *t, tokenizer_scratch *s, const char *text, const tokenizer_frags *frags)
{
    for (size_t i = 0; i < frags->n && !s->oom; i++) {
        tokenizer_frag f = frags->v[i];
        if (f.tok >= 0) tokenizer_encode_emit(s, f.tok);
        else tokenizer_bpe(t, s, text + f.off, f.len);
    }
}
