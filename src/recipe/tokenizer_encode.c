/*
 * tokenizer_encode: text -> token ids. (1) The special-token partition cuts the text into raw
 * and token fragments (llama.cpp's tokenizer_st_partition); (2) the raw fragments go to
 * SentencePiece (tokenizer_spm.c), byte-level BPE (tokenizer_bpe.c) or WordPiece
 * (tokenizer_wpm.c); BOS and EOS (WordPiece: [CLS] and [SEP]) around them
 * as the model asks. Each call allocates its own scratch and frees it at the end, so a const
 * tokenizer is safe to share between threads.
 */
#define _GNU_SOURCE  /* memmem */
#include "recipe/tokenizer_int.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

static void tokenizer_scratch_free(tokenizer_scratch *s)
{
    free(s->out);
    free(s->cpts);
    free(s->coll);
    free(s->wide);
    free(s->wide_off);
    free(s->segs.v);
    free(s->segs2.v);
    bytebuf_free(&s->word);
    free(s->sym);
    free(s->heap);
    if (s->md) pcre2_match_data_free(s->md);
    if (s->mctx) pcre2_match_context_free(s->mctx);
    if (s->jstack) pcre2_jit_stack_free(s->jstack);
}

void tokenizer_encode_emit(tokenizer_scratch *s, int32_t id)
{
    if (!tokenizer_grow((void **)&s->out, &s->cap_out, s->n_out + 1, sizeof *s->out)) {
        s->oom = true;
        return;
    }
    s->out[s->n_out++] = id;
}

/* ---------------------------------------------------------------------------------------- */
/* special-token partition                                                                   */

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

    if (add_special && t->add_bos && t->bos >= 0) tokenizer_encode_emit(&s, t->bos);
    if (t->kind == TOKENIZER_KIND_SPM) tokenizer_spm_encode(t, &s, text, &frags);
    else if (t->kind == TOKENIZER_KIND_WPM) tokenizer_wpm_encode(t, &s, text, &frags);
    else tokenizer_bpe_encode(t, &s, text, &frags);
    if (add_special && t->add_eos && t->eos >= 0) tokenizer_encode_emit(&s, t->eos);
    if (add_special && t->add_sep && t->sep >= 0) tokenizer_encode_emit(&s, t->sep);
    if (s.oom) goto done;
    if (s.n_out > (size_t)INT32_MAX) goto done;
    if (cap > 0 && s.n_out > 0) memcpy(out, s.out, TM_MIN(s.n_out, (size_t)cap) * sizeof *out);
    ret = (int32_t)s.n_out;
done:
    free(frags.v);
    tokenizer_scratch_free(&s);
    return ret;
}
