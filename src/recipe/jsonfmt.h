/*
 * jsonfmt: validate a JSON text and re-emit it in a fixed layout, plus a growable byte buffer.
 *
 * Chat templates print JSON the way the reference Jinja renderer's `tojson` filter does
 * (@huggingface/jinja, itself modelled on Python's json.dumps): ", " and ": " separators, or
 * with indent N: "," then a newline and N spaces per level; strings escaped as JavaScript's
 * JSON.stringify escapes them (", \, control characters; non-ASCII kept as UTF-8); numbers
 * printed as JavaScript prints a double (1.0 -> 1, 1e21 -> 1e+21). The output splitter
 * re-emits model-written tool arguments compactly so that clients always receive valid JSON.
 *
 * The reader is a recursive descent over the bytes, depth-limited (JSONFMT_MAX_DEPTH), with
 * no allocation besides the output buffer. Key order and duplicate keys are kept as written.
 */
#ifndef TM_JSONFMT_H
#define TM_JSONFMT_H

#include <stdbool.h>
#include <stddef.h>

#define JSONFMT_MAX_DEPTH 128

/* A growable byte string, always NUL-terminated once anything was appended. */
typedef struct {
    char *p;        /* bytes (NULL until the first append) */
    size_t len;     /* bytes used, excluding the NUL */
    size_t cap;     /* bytes allocated */
} jsonfmt_buf;

void jsonfmt_buf_free(jsonfmt_buf *b);
void jsonfmt_buf_append(jsonfmt_buf *b, const char *s, size_t len);
void jsonfmt_buf_puts(jsonfmt_buf *b, const char *z);
void jsonfmt_buf_putc(jsonfmt_buf *b, char c);

typedef enum {
    JSONFMT_COMPACT = 0,  /* "," and ":" with no spaces: what clients receive */
    JSONFMT_SPACED,       /* ", " and ": ": Jinja's tojson without indent */
    JSONFMT_INDENT,       /* tojson(indent=N): "," + newline + N spaces per level, ": " */
} jsonfmt_style;

/* Appends the JSON value in src[0..len) to out in `style` (indent: spaces per level, used by
 * JSONFMT_INDENT only). Whitespace around the value is allowed. Returns false, leaving out as
 * it was, when src is not exactly one valid JSON value. */
bool jsonfmt_write(jsonfmt_buf *out, const char *src, size_t len, jsonfmt_style style, int indent);

typedef enum {
    JSONFMT_PREFIX_DONE = 0,  /* one whole value was read (*used: bytes up to its end) */
    JSONFMT_PREFIX_MORE,      /* the input ended inside the value: it may still become valid */
    JSONFMT_PREFIX_BAD,       /* no continuation can make it a JSON value; out has what was
                               * re-emitted before the error (a number or literal right before
                               * it included) */
} jsonfmt_prefix_status;

/* Streaming re-emission: appends to out the compact form of as much of the JSON value that
 * starts src[0..len) (after optional whitespace) as is final, i.e. what jsonfmt_write
 * (JSONFMT_COMPACT) writes for every valid continuation too: a string's characters as they
 * come (never half an escape, half a surrogate pair or half a UTF-8 sequence), a number or a
 * literal once it has ended, punctuation as it is read. So the outputs for growing prefixes
 * of one text extend one another, and at DONE out holds exactly jsonfmt_write's output for
 * the value. Text after the value is not looked at. */
jsonfmt_prefix_status jsonfmt_prefix(jsonfmt_buf *out, const char *src, size_t len, size_t *used);

/* True when src[0..len) is exactly one valid JSON value. */
bool jsonfmt_valid(const char *src, size_t len);

/* Bytes (1..4) of the valid UTF-8 character at the start of s[0..n), or 0 when s does not
 * start with one (a stray or missing continuation byte, an overlong form, a surrogate, a code
 * point past U+10FFFF, n = 0). */
size_t jsonfmt_utf8_char(const char *s, size_t n);

/* Appends s[0..len) (UTF-8) as a quoted JSON string, escaped as JSON.stringify does. Bytes that
 * are not UTF-8 are written as U+FFFD each: the output is valid UTF-8 whatever s holds. */
void jsonfmt_write_string(jsonfmt_buf *out, const char *s, size_t len);

/* Looks up a top-level member of the JSON object in src. On success *val and *val_len span the
 * member's raw value text (for a string value: including its quotes). Returns false when src
 * is not a valid object or has no such key (the first occurrence wins). */
bool jsonfmt_get_member(const char *src, size_t len, const char *key, const char **val, size_t *val_len);

/* Decodes the JSON string literal at src (which must start with '"') into out (UTF-8, no
 * quotes). Returns false if it is not a valid string literal. */
bool jsonfmt_decode_string(jsonfmt_buf *out, const char *src, size_t len);

#endif
