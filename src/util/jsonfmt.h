/*
 * jsonfmt: validate a JSON text and re-emit it in a fixed layout (into a util/bytebuf).
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
 *
 * Bounds: JSON from outside (request bodies) is measured by jsonfmt_scan, a loop with no
 * recursion, before any recursive reader (jansson, this one, the template renderer) sees it.
 * Its depth limit is the reader's own, so a value accepted at the door is never too deep for
 * anything downstream, and the recursion of every reader stays far inside an HTTP thread's
 * small stack.
 */
#ifndef TM_JSONFMT_H
#define TM_JSONFMT_H

#include <stdbool.h>
#include <stddef.h>

#include "util/bytebuf.h"

/* Nesting levels of arrays and objects (the outermost container is level 1). Tool schemas
 * written by people and by generators stay far below this; OpenAI and vLLM accept deep ones,
 * so the bound is generous. */
#define JSONFMT_MAX_DEPTH 128
/* Values (scalars and containers, object keys included) in one request body. A parsed value
 * costs jansson some 50 bytes, so this bounds the memory a body can make the parser use
 * (a 8 MiB body of "[0,0,..." would otherwise be four million values). */
#define JSONFMT_MAX_VALUES (1u << 20)

typedef enum {
    JSONFMT_COMPACT = 0,  /* "," and ":" with no spaces: what clients receive */
    JSONFMT_SPACED,       /* ", " and ": ": Jinja's tojson without indent */
    JSONFMT_INDENT,       /* tojson(indent=N): "," + newline + N spaces per level, ": " */
} jsonfmt_style;

/* Appends the JSON value in src[0..len) to out in `style` (indent: spaces per level, used by
 * JSONFMT_INDENT only). Whitespace around the value is allowed. Returns false, leaving out as
 * it was, when src is not exactly one valid JSON value. */
bool jsonfmt_write(bytebuf *out, const char *src, size_t len, jsonfmt_style style, int indent);

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
jsonfmt_prefix_status jsonfmt_prefix(bytebuf *out, const char *src, size_t len, size_t *used);

typedef enum {
    JSONFMT_SCAN_OK = 0,      /* within both limits (the text may still be invalid JSON) */
    JSONFMT_SCAN_TOO_DEEP,    /* arrays/objects nest deeper than max_depth */
    JSONFMT_SCAN_TOO_MANY,    /* more than max_values values */
} jsonfmt_scan_status;

/* Measures the text src[0..len) without recursion and without judging its syntax: the
 * deepest nesting of [ and { outside strings, and the number of values (containers, scalars
 * and keys: every [ { , : plus one). Stops at the first limit passed. *depth and *n_values
 * (either may be NULL) get the figures up to where the scan stopped. */
jsonfmt_scan_status jsonfmt_scan(const char *src, size_t len, int max_depth, size_t max_values, int *depth,
                                 size_t *n_values);

/* Appends v as JavaScript's Number#toString prints it (1.0 -> 1, 1e21 -> 1e+21; NaN and the
 * infinities, which JSON cannot hold, as null). */
void jsonfmt_write_number(bytebuf *out, double v);

/* True when src[0..len) is exactly one valid JSON value. */
bool jsonfmt_valid(const char *src, size_t len);

/* Appends s[0..len) as a quoted JSON string, escaped as JSON.stringify does. Whatever the
 * bytes, the result is valid UTF-8: a sequence that is not is written as U+FFFD (see
 * unicode_utf8_repair), so no client's strict parser ever sees a broken string. */
void jsonfmt_write_string(bytebuf *out, const char *s, size_t len);

/* Looks up a top-level member of the JSON object in src. On success *val and *val_len span the
 * member's raw value text (for a string value: including its quotes). Returns false when src
 * is not a valid object or has no such key (the first occurrence wins). */
bool jsonfmt_get_member(const char *src, size_t len, const char *key, const char **val, size_t *val_len);

/* Walks the members of the object, or the elements of the array, that src[0..len) holds (a
 * valid JSON text: check with jsonfmt_valid first). Start with *pos = 0; each call gives the
 * next entry: its raw value text in val and val_len and, for an object, its decoded key in key
 * (replaced; may be NULL). Returns false after the last entry or if src is neither. */
bool jsonfmt_next(const char *src, size_t len, size_t *pos, bytebuf *key, const char **val, size_t *val_len);

/* Decodes the JSON string literal at src (which must start with '"') into out (UTF-8, no
 * quotes). Returns false if it is not a valid string literal. */
bool jsonfmt_decode_string(bytebuf *out, const char *src, size_t len);

#endif
