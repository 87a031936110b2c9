/*
 * tokenizer: text <-> token ids for the vocabularies GGUF files carry, token for token as
 * llama.cpp tokenises them.
 *
 * Two kinds (tokenizer.ggml.model):
 *  - "llama": SentencePiece-style BPE by scores (llm_tokenizer_spm): spaces become U+2581, a
 *    space is prefixed to the text (tokenizer.ggml.add_space_prefix, default true), merges are
 *    taken highest score first, leftovers fall back to <0xXX> byte tokens.
 *  - "gpt2": byte-level BPE by merge ranks: the text is split into words by the pre-tokenizer
 *    regexes that tokenizer.ggml.pre names (PCRE2, on llama.cpp's "collapsed" code point class
 *    representation so that splits match its splits exactly), every byte of a word is mapped to
 *    its GPT-2 code point, and merges are applied lowest rank first.
 *
 * Special tokens: control, user-defined and unknown tokens are cut out of the text before the
 * BPE runs (llama.cpp's tokenizer_st_partition: longest token text first). User-defined tokens
 * are always matched; control and unknown tokens only when the caller passes parse_special,
 * so by default "<|im_end|>" typed by a user is plain text.
 *
 * A tokenizer is immutable after tokenizer_load and may be used from many threads at once.
 * It copies everything it needs: the gguf may be closed afterwards.
 */
#ifndef TM_TOKENIZER_H
#define TM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "model/gguf.h"

typedef enum {
    TOKENIZER_OK = 0,
    TOKENIZER_ERR_MISSING,      /* no tokenizer.ggml.tokens / model / merges in the file */
    TOKENIZER_ERR_FORMAT,       /* a tokenizer key has the wrong type or length */
    TOKENIZER_ERR_UNSUPPORTED,  /* tokenizer.ggml.model or .pre we do not implement */
    TOKENIZER_ERR_NOMEM,
} tokenizer_status;

/* Token attributes (bits), as llama.cpp derives them from tokenizer.ggml.token_type plus its
 * by-text fix-ups (e.g. "<|im_end|>" is always control). */
enum {
    TOKENIZER_ATTR_UNDEFINED    = 0,
    TOKENIZER_ATTR_UNKNOWN      = 1 << 0,
    TOKENIZER_ATTR_UNUSED       = 1 << 1,
    TOKENIZER_ATTR_NORMAL       = 1 << 2,
    TOKENIZER_ATTR_CONTROL      = 1 << 3,
    TOKENIZER_ATTR_USER_DEFINED = 1 << 4,
    TOKENIZER_ATTR_BYTE         = 1 << 5,
    TOKENIZER_ATTR_LSTRIP       = 1 << 7,  /* strip whitespace left of it when matched in text */
    TOKENIZER_ATTR_RSTRIP       = 1 << 8,  /* ... right of it */
};

typedef enum { TOKENIZER_KIND_SPM, TOKENIZER_KIND_BPE, TOKENIZER_KIND_WPM } tokenizer_kind;   /* WPM: BERT's WordPiece */

typedef struct tokenizer tokenizer;

/* Loads the vocabulary of an open gguf. On failure returns the status, writes a one-line
 * message into err and sets *out = NULL. */
tokenizer_status tokenizer_load(const gguf *g, tokenizer **out, char *err, size_t errsz);
void tokenizer_free(tokenizer *t);
const char *tokenizer_status_name(tokenizer_status st);

/* Tokenises text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp does: byte tokens
 * for SPM, U+FFFD for BPE). add_special: prepend BOS (and append EOS) if the model asks for it
 * (tokenizer.ggml.add_bos_token / add_eos_token). parse_special: let control-token text match.
 * Returns the number of tokens; if that is > cap only the first cap are written (call again
 * with a bigger buffer). Returns a negative value on bad arguments (text NULL with len > 0,
 * cap < 0, len beyond INT32_MAX) or out of memory. */
int32_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, int32_t *out, int32_t cap);

tokenizer_kind tokenizer_get_kind(const tokenizer *t);
int32_t tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t);   /* -1 if none */
int32_t tokenizer_eos(const tokenizer *t);   /* -1 if none */
int32_t tokenizer_eot(const tokenizer *t);   /* -1 if none */
bool tokenizer_add_bos(const tokenizer *t);  /* does the model want BOS prepended? */
bool tokenizer_is_eog(const tokenizer *t, int32_t id);  /* end of generation: eos, eot, ... */
uint32_t tokenizer_attr(const tokenizer *t, int32_t id); /* TOKENIZER_ATTR_* bits, 0 if out of range */
/* Raw vocabulary text of id (not NUL-terminated, *len set); NULL if id is out of range. */
const char *tokenizer_piece(const tokenizer *t, int32_t id, size_t *len);
/* Finds the token whose vocabulary text is exactly s[0..len); -1 if none. */
int32_t tokenizer_find(const tokenizer *t, const char *s, size_t len);
/* Longest decoded piece of any token, in bytes (sizes stream buffers). */
size_t tokenizer_max_piece(const tokenizer *t);

/* Decoded bytes of one token, like llama_token_to_piece: U+2581 -> space (SPM), byte tokens ->
 * their byte, GPT-2 code points -> bytes (BPE); control/unknown tokens render their text only
 * when special is true, else nothing. Returns the byte count; if it is > cap nothing is
 * written. Negative if id is out of range. */
int tokenizer_token_to_piece(const tokenizer *t, int32_t id, char *buf, int cap, bool special);

/* The vocabulary as the grammar matcher sees it (grammar_vocab_new): each token's bytes as the
 * detokenizer writes them (token_to_piece without special text); added tokens (control,
 * user-defined, unknown) have none: the marker tokens a grammar writes are its token
 * terminals. grammar_vocab_free frees it. */
struct grammar_vocab;
struct grammar_vocab *tokenizer_grammar_vocab(const tokenizer *t);

/* Streaming detokenizer: feed ids one at a time, get text that never ends inside a UTF-8
 * character (a partial sequence is held back until the next token completes it or flush).
 * For SPM models with a space prefix, the leading space of the piece right after BOS is
 * dropped, as llama.cpp's and llama2.c's decoders do ("<s>▁Once" -> "Once"). Invalid UTF-8
 * bytes are passed through once it is clear they cannot become a character. */
typedef struct {
    const tokenizer *tok;  /* the vocabulary */
    bool special;          /* render control tokens' text (default false) */
    int32_t prev;          /* last id pushed, -1 at start */
    uint8_t npend;         /* bytes held back in pend (0..3) */
    char pend[4];          /* an incomplete UTF-8 sequence from earlier pieces */
} tokenizer_stream;

void tokenizer_stream_init(tokenizer_stream *s, const tokenizer *t);
/* Pushes one token; writes the text ready to print into out and returns its length. If that
 * is > cap nothing is written and the token is NOT consumed (call again with a bigger buffer);
 * cap >= tokenizer_max_piece(t) + 4 always suffices. */
size_t tokenizer_stream_push(tokenizer_stream *s, int32_t id, char *out, size_t cap);
/* Emits whatever is held back (an incomplete sequence at the very end); same cap rule, 4 bytes
 * always suffice. */
size_t tokenizer_stream_flush(tokenizer_stream *s, char *out, size_t cap);

#endif
