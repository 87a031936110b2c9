/*
 * tokenizer_spm: SentencePiece-style BPE by scores (llama.cpp's llm_tokenizer_spm). Spaces
 * become U+2581 and a space is prefixed at the start and after each special token (when the
 * vocabulary asks, tokenizer.ggml.add_space_prefix); the escaped text is merged best score
 * first (tokenizer_bpe_merge, in tokenizer_bpe.c); a merged symbol that is no token falls back
 * to <0xXX> byte tokens, else to the unknown token.
 */
#include "recipe/tokenizer_int.h"

void tokenizer_spm_encode(const tokenizer *t, tokenizer_scratch *s, const char *text, const tokenizer_frags *frags)
{
    bool prev_special = true;  /* a space is prefixed at the start and after special tokens */
    for (size_t i = 0; i < frags->n && !s->oom; i++) {
        tokenizer_frag f = frags->v[i];
        if (f.tok >= 0) {
            tokenizer_encode_emit(s, f.tok);
            prev_special = true;
            continue;
        }
        s->word.len = 0;
        if (t->add_space_prefix && prev_special && !bytebuf_try_append(&s->word, "\xe2\x96\x81", 3)) s->oom = true;
        for (size_t j = 0; j < f.len && !s->oom; j++) {
            bool ok = text[f.off + j] == ' ' ? bytebuf_try_append(&s->word, "\xe2\x96\x81", 3)
                                             : bytebuf_try_append(&s->word, text + f.off + j, 1);
            if (!ok) s->oom = true;
        }
        if (s->oom) break;
        tokenizer_bpe_merge(t, s, s->word.p, s->word.len);
        prev_special = false;
    }
}
