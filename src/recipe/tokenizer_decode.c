/*
 * tokenizer_decode: token ids -> text. Every token's decoded piece (U+2581 -> space for SPM and gemma4,
 * GPT-2 code points -> bytes for BPE, <0xXX> -> the byte) is computed once at load into the
 * arena; token_to_piece copies it, and the streaming detokenizer holds back an unfinished
 * UTF-8 character until the next token completes it or flush. The grammar's view of the
 * vocabulary (each token's bytes) is built here from the same pieces, so that grammar/ needs
 * no tokenizer.
 */
#include "recipe/tokenizer_int.h"
#include "grammar/grammar.h"
#include "util/unicode.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Decoded bytes of a token rendered with special = true (llama.cpp's token_to_piece cache). */
bool tokenizer_decode_piece(const tokenizer *t, int32_t id, bytebuf *b)
{
    size_t n;
    const char *s = tokenizer_text(t, id, &n);
    uint32_t a = t->attr[id];
    b->len = 0;
    if (a & (TOKENIZER_ATTR_UNKNOWN | TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED))
        return bytebuf_try_append(b, s, n);
    if (a & TOKENIZER_ATTR_NORMAL) {
        if (t->kind == TOKENIZER_KIND_SPM || t->kind == TOKENIZER_KIND_WPM || t->spm_bpe) {   /* U+2581 -> space */
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                    if (!bytebuf_try_append(b, " ", 1)) return false;
                    i += 3;
                } else {
                    if (!bytebuf_try_append(b, s + i, 1)) return false;
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
                if (!bytebuf_try_append(b, &ch, 1)) return false;
            } else {  /* llama.cpp's "[UNK_BYTE_0x..<text>]" */
                char u[4], hex[3];
                int nu = unicode_encode(c, u);
                (void)p0;
                if (!bytebuf_try_append(b, "[UNK_BYTE_0x", 12)) return false;
                for (int k = 0; k < nu; k++) {
                    util_hex(u + k, 1, hex);
                    if (!bytebuf_try_append(b, hex, 2)) return false;
                }
                if (!bytebuf_try_append(b, s, n) || !bytebuf_try_append(b, "]", 1)) return false;
            }
        }
        return true;
    }
    if (a & TOKENIZER_ATTR_BYTE) {
        char hex[3] = { n > 3 ? s[3] : 0, n > 4 ? s[4] : 0, 0 };
        char ch = (char)strtol(hex, NULL, 16);
        return bytebuf_try_append(b, &ch, 1);
    }
    return true;
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
    return t->arena.p + t->piece_off[id];
}

int tokenizer_token_to_piece(const tokenizer *t, int32_t id, char *buf, int cap, bool special)
{
    size_t n;
    const char *p = tokenizer_decoded(t, id, special, &n);
    if (!p) return -1;
    if (cap >= 0 && n <= (size_t)cap && n > 0) memcpy(buf, p, n);
    return (int)n;
}

grammar_vocab *tokenizer_grammar_vocab(const tokenizer *t)
{
    int n = tokenizer_n_vocab(t);
    int cap = (int)tokenizer_max_piece(t) + 8;
    char *buf = xmalloc((size_t)n * (size_t)cap);
    char **bytes = xmalloc((size_t)n * sizeof *bytes);
    int *lens = xmalloc((size_t)n * sizeof *lens);
    for (int i = 0; i < n; i++) {
        bytes[i] = buf + (size_t)i * (size_t)cap;
        lens[i] = tokenizer_token_to_piece(t, i, bytes[i], cap, false);
        /* added tokens (control and user-defined: <think>, <tool_call>, ...) mean something
         * to the output splitter and the scheduler by id, so a grammar never writes text with
         * them: they match token terminals only */
        if (lens[i] > cap || tokenizer_attr(t, i) & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED |
                                                     TOKENIZER_ATTR_UNKNOWN))
            lens[i] = 0;
    }
    grammar_vocab *v = grammar_vocab_new(n, (const char *const *)bytes, lens);
    free(buf);
    free(bytes);
    free(lens);
    return v;
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
