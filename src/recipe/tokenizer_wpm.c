/*
 * tokenizer_wpm: BERT's WordPiece as llama.cpp's llm_tokenizer_wpm does it. The text is cut
 * into words: whitespace ends a word; NUL, U+FFFD and control characters are dropped;
 * punctuation, ASCII symbols and CJK ideographs are words of their own. With the normaliser's
 * lowercase (the default) every code point is lowercased, and with strip_accents (default: as
 * lowercase) a precomposed letter becomes its base letter and marks are dropped
 * (util/unicode's folds, llama.cpp's tables). Each word, prefixed with U+2581 as the
 * vocabulary spells a word start, is matched greedily longest-first from its start; a word
 * with a position where nothing matches becomes one [UNK].
 */
#include "recipe/tokenizer_int.h"
#include "util/unicode.h"
#include "util/util.h"

#include <string.h>

#define WPM_PREFIX "\xe2\x96\x81"   /* U+2581, the word start */

static bool tokenizer_wpm_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) ||
           (c >= 0x2B920 && c <= 0x2CEAF) ||   /* llama.cpp's (and HF's) bound, not 0x2B820 */
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* The tokens of the word in s->word (the prefix and the word's bytes), or [UNK]. */
static void tokenizer_wpm_word(const tokenizer *t, tokenizer_scratch *s)
{
    const char *w = s->word.p;
    const size_t n = s->word.len, n_out0 = s->n_out;
    if (n <= sizeof WPM_PREFIX - 1) return;   /* empty */
    for (size_t i = 0; i < n;) {
        size_t j = TM_MIN(n, i + t->max_token_len + 1);
        int32_t id = -1;
        for (; j > i; j--)
            if ((id = tokenizer_find(t, w + i, j - i)) >= 0) break;
        if (id < 0) {   /* nothing matches here: the whole word is unknown */
            s->n_out = n_out0;
            break;
        }
        tokenizer_encode_emit(s, id);
        i = j;
    }
    if (s->n_out == n_out0 && t->unk >= 0) tokenizer_encode_emit(s, t->unk);
    s->word.len = 0;
}

static void tokenizer_wpm_text(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t len)
{
    s->word.len = 0;
    for (size_t pos = 0; pos < len && !s->oom;) {
        uint32_t c = unicode_decode(text, len, &pos);
        if (t->wpm_strip) c = unicode_nfd_base(c);
        uint32_t f = unicode_flags(c);
        if (f & UNICODE_FLAG_WHITESPACE) {
            tokenizer_wpm_word(t, s);
            continue;
        }
        if (c == 0 || c == UNICODE_REPLACEMENT || (f & UNICODE_FLAG_CONTROL)) continue;
        if (t->wpm_strip && (f & UNICODE_FLAG_MARK)) continue;
        char u[4];
        int nu = unicode_encode(t->wpm_lower ? unicode_tolower(c) : c, u);
        bool alone = (f & UNICODE_FLAG_PUNCTUATION) || (c < 0x7F && (f & UNICODE_FLAG_SYMBOL)) || tokenizer_wpm_cjk(c);
        if (alone) tokenizer_wpm_word(t, s);
        if (s->word.len == 0 && !bytebuf_try_append(&s->word, WPM_PREFIX, sizeof WPM_PREFIX - 1)) s->oom = true;
        if (!bytebuf_try_append(&s->word, u, (size_t)nu)) s->oom = true;
        if (alone) tokenizer_wpm_word(t, s);
    }
    tokenizer_wpm_word(t, s);
}

void tokenizer_wpm_encode(const tokenizer *t, tokenizer_scratch *s, const char *text, const tokenizer_frags *frags)
{
    for (size_t i = 0; i < frags->n && !s->oom; i++) {
        const tokenizer_frag *f = &frags->v[i];
        if (f->tok >= 0) tokenizer_encode_emit(s, f->tok);
        else tokenizer_wpm_text(t, s, text + f->off, f->len);
    }
}
