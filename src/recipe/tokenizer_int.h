/*
 * tokenizer_int: what the tokenizer's files share and only they may see (callers use
 * tokenizer.h). The vocabulary and its loader are in tokenizer.c, the per-call encoder with the
 * special-token partition in tokenizer_encode.c, the pre-tokenizer regexes in tokenizer_pre.c,
 * the merge engine and byte-level BPE in tokenizer_bpe.c, SentencePiece in tokenizer_spm.c,
 * WordPiece in tokenizer_wpm.c and
 * the decoded pieces and streaming detokenizer in tokenizer_decode.c.
 */
#ifndef TM_TOKENIZER_INT_H
#define TM_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "recipe/tokenizer.h"
#include "util/bytebuf.h"

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
    bytebuf arena;               /* token texts, then merge halves, then decoded pieces */
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
    bool spm_bpe;                /* BPE as SentencePiece spells it (tokenizer.ggml.model gemma4):
                                  * spaces written U+2581, merges on the raw UTF-8 of runs of
                                  * newlines and of anything else, <0xXX> byte fallback */
    int32_t sep;                 /* WPM: [SEP], appended after the text (add_sep), -1 if none */
    bool add_sep;
    bool wpm_lower;              /* WPM: lowercase the text (tokenizer.ggml.normalizer.lowercase) */
    bool wpm_strip;              /* WPM: precomposed letters to their base, marks dropped */

    int n_regex;
    tokenizer_regex regex[TOKENIZER_MAX_REGEX];
};

static inline const char *tokenizer_text(const tokenizer *t, int32_t id, size_t *len)
{
    *len = t->tok_len[id];
    return t->arena.p + t->tok_off[id];
}

/* One word (or gap) of the pre-tokenizer: code points [start, start + n). */
typedef struct {
    uint32_t start, n;
} tokenizer_seg;

typedef struct {
    tokenizer_seg *v;
    size_t n, cap;
} tokenizer_segs;

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
    bytebuf word;          /* the byte-encoded word / the escaped SPM text */
    struct tokenizer_sym { int32_t prev, next; uint32_t start, n; } *sym;
    size_t cap_sym;
    struct tokenizer_bigram { float key; int32_t left, right; uint32_t size; } *heap;
    size_t n_heap, cap_heap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    bool oom;
} tokenizer_scratch;

typedef struct tokenizer_sym tokenizer_sym;
typedef struct tokenizer_bigram tokenizer_bigram;

/* A fragment of the text after the special-token partition. */
typedef struct {
    int32_t tok;                 /* token id, or -1 for raw text */
    size_t off, len;             /* raw text: bytes of the input */
} tokenizer_frag;

typedef struct {
    tokenizer_frag *v;
    size_t n, cap;
} tokenizer_frags;

/* Grows *p (of *cap elements of elt bytes) to hold need elements, doubling; false if out of
 * memory (*p and *cap then unchanged). The one growth rule of every tokenizer array; inline
 * because the encoder calls it for every token and heap entry. */
static inline bool tokenizer_grow(void **p, size_t *cap, size_t need, size_t elt)
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

/* tokenizer.c: the vocabulary */
void tokenizer_err(char *err, size_t errsz, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Rank of the merge (a, b), -1 if none. */
int32_t tokenizer_merge_rank(const tokenizer *t, const char *a, size_t na, const char *b, size_t nb);

/* tokenizer_pre.c */
/* BPE: tokenizer.ggml.pre chooses the pre-tokenizer (its regexes, BOS handling, whether
 * whole-token words skip merging). */
tokenizer_status tokenizer_pre_load(tokenizer *t, const gguf *g, char *err, size_t errsz);
/* Splits code points cpts[0..n) into words (s->segs) with the tokenizer's regex list. */
bool tokenizer_pre_split(const tokenizer *t, tokenizer_scratch *s, const uint32_t *cpts, size_t n);

/* tokenizer_encode.c: the per-call scratch */
/* Appends id to the output; sets s->oom if out of memory. */
void tokenizer_encode_emit(tokenizer_scratch *s, int32_t id);

/* tokenizer_bpe.c */
/* Merges text[0..n) (one symbol per UTF-8 character, pairs merged by score or rank until none
 * applies) and emits the symbols: each that is a token as that token, the others byte by byte
 * as the kind falls back (SPM: <0xXX> tokens, else unknown; BPE: one-byte tokens). */
void tokenizer_bpe_merge(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t n);
/* Byte-level BPE of the fragments of text into s's output. */
void tokenizer_bpe_encode(const tokenizer *t, tokenizer_scratch *s, const char *text, const tokenizer_frags *frags);

/* tokenizer_spm.c */
/* SentencePiece of the fragments of text into s's output. */
void tokenizer_spm_encode(const tokenizer *t, tokenizer_scratch *s, const char *text, const tokenizer_frags *frags);

/* tokenizer_wpm.c */
/* WordPiece of the fragments of text into s's output (llama.cpp's llm_tokenizer_wpm). */
void tokenizer_wpm_encode(const tokenizer *t, tokenizer_scratch *s, const char *text, const tokenizer_frags *frags);

/* tokenizer_decode.c */
/* Decoded bytes of a token rendered with special = true (llama.cpp's token_to_piece cache). */
bool tokenizer_decode_piece(const tokenizer *t, int32_t id, bytebuf *b);

#endif
