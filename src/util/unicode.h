/*
 * unicode: the little Unicode the tokenizers need, with llama.cpp's exact conventions so that
 * our splits match its splits code point for code point.
 *
 * - unicode_decode reads one code point leniently as llama.cpp does: a byte that does not start
 *   a well-formed sequence (stray continuation, truncated sequence, 0xF8..0xFF) becomes U+FFFD
 *   and consumes one byte; overlong forms and surrogates are NOT rejected (they decode to their
 *   value), code points above U+10FFFF become U+FFFD.
 * - unicode_flags gives a code point's general-category group (\p{L}, \p{N}, ...) and whether it
 *   is White_Space, from the generated table in unicode_data.c.
 * - The GPT-2 byte <-> code point map used by byte-level BPE vocabularies (bytes that are
 *   printable stand for themselves, the other 68 are moved to U+0100..U+0143).
 * - Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF) for what
 *   crosses the API: checking request bodies, and repairing what the model writes. A byte
 *   sequence that can never become a character is replaced by U+FFFD, one per maximal subpart
 *   (Unicode's recommended practice, as Python and WHATWG decoders do), so "\xE2\x82A" becomes
 *   "\uFFFDA". llama.cpp's server also sends U+FFFD for such bytes.
 */
#ifndef TM_UNICODE_H
#define TM_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    UNICODE_FLAG_UNDEFINED   = 0x001,  /* Cn (unassigned), also everything >= U+110000 */
    UNICODE_FLAG_NUMBER      = 0x002,  /* \p{N} */
    UNICODE_FLAG_LETTER      = 0x004,  /* \p{L} */
    UNICODE_FLAG_SEPARATOR   = 0x008,  /* \p{Z} */
    UNICODE_FLAG_MARK        = 0x010,  /* \p{M} */
    UNICODE_FLAG_PUNCTUATION = 0x020,  /* \p{P} */
    UNICODE_FLAG_SYMBOL      = 0x040,  /* \p{S} */
    UNICODE_FLAG_CONTROL     = 0x080,  /* \p{C} other than Cn: Cc, Cf, Co, Cs */
    UNICODE_FLAG_CATEGORIES  = 0x0FF,
    UNICODE_FLAG_WHITESPACE  = 0x100,  /* White_Space property */
};

#define UNICODE_REPLACEMENT 0xFFFDu

/* Length of the UTF-8 sequence a lead byte announces (1 for continuation/invalid bytes),
 * the way llama.cpp splits text into symbols. */
static inline size_t unicode_len_utf8(uint8_t lead)
{
    static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return len[lead >> 4];
}

/* Decodes the code point at s[*pos] (requires *pos < len) and advances *pos. */
uint32_t unicode_decode(const char *s, size_t len, size_t *pos);
/* Writes cpt as UTF-8 into out (4 bytes room); returns the byte count. cpt > U+10FFFF is
 * written as U+FFFD. */
int unicode_encode(uint32_t cpt, char *out);
/* UNICODE_FLAG_* bits of cpt. */
uint32_t unicode_flags(uint32_t cpt);

/* GPT-2 byte-level map: the code point standing for byte b, and back (-1 if cpt stands for
 * no byte). */
uint32_t unicode_byte_to_cpt(uint8_t b);
int unicode_cpt_to_byte(uint32_t cpt);

/* Strict UTF-8. unicode_utf8_next reads at s[0] (len >= 1): returns the length of the valid
 * character there (1..4) with *ok true, or with *ok false the length of the maximal subpart
 * that cannot start a character (1..3); *incomplete (may be NULL) is set when that subpart is
 * cut only by the end of the input, i.e. more bytes could still make it a character. */
size_t unicode_utf8_next(const char *s, size_t len, bool *ok, bool *incomplete);
/* True when s[0..len) is valid UTF-8. */
bool unicode_utf8_valid(const char *s, size_t len);
/* Bytes at the end of s[0..len) that are the start of a character not complete yet (0..3). */
size_t unicode_utf8_tail(const char *s, size_t len);
/* Copies s[0..len) to out with each maximal invalid subpart replaced by U+FFFD; out needs room
 * for 3 * len bytes (a lone byte may become three). Returns the bytes written. */
size_t unicode_utf8_repair(const char *s, size_t len, char *out);

/* llama.cpp's folds for the WordPiece normaliser (unicode_fold.c): the simple lowercase of
 * cpt, and its base letter when it is a precomposed character (its decomposition's first code
 * point, the marks dropped); cpt itself when there is none. */
uint32_t unicode_tolower(uint32_t cpt);
uint32_t unicode_nfd_base(uint32_t cpt);

/* Generated data (unicode_data.c, unicode_fold.c). */
extern const uint32_t unicode_data_ranges[][2];
extern const uint32_t unicode_data_n_ranges;
extern const uint32_t unicode_fold_lower[][2];
extern const uint32_t unicode_fold_n_lower;
extern const uint32_t unicode_fold_nfd[][3];
extern const uint32_t unicode_fold_n_nfd;

/* The byte length of a blank of three UTF-8 bytes at s, as JavaScript's \s and Jinja's trim
 * count them (U+1680, U+2000..200A, U+2028/2029, U+202F, U+205F, U+3000, U+FEFF), 0 if none:
 * the part of "whitespace" the template interpreters agree on beyond their one- and two-byte
 * sets. */
size_t unicode_space3_at(const char *s, size_t n);

#endif
