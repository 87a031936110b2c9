/*
 * bytebuf: the one growable byte buffer. The HTTP layer reads bodies into one and streams
 * from one, the JSON writer and every API formatter append to one, the templates render into
 * one. Appends grow it by doubling; it is always NUL-terminated once anything (even nothing:
 * bytebuf_append(b, NULL, 0)) was appended, so p can be handed to C string functions.
 * A zeroed bytebuf is empty and valid; bytebuf_free returns it to that state.
 *
 * Out of memory: the plain calls end the process (util_oom), as every request-path caller
 * would have nothing better to do. The bytebuf_try_* calls return false instead and leave
 * the buffer as it was, for code that reports the failure itself (loading a model's
 * vocabulary, where a hostile file may ask for more than there is).
 */
#ifndef TM_BYTEBUF_H
#define TM_BYTEBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p;        /* (cap) bytes, NULL until the first append */
    size_t len;     /* bytes used, excluding the NUL */
    size_t cap;     /* bytes allocated */
} bytebuf;

void bytebuf_free(bytebuf *b);
/* Makes room for extra more bytes (and the NUL) past len. */
void bytebuf_reserve(bytebuf *b, size_t extra);
void bytebuf_append(bytebuf *b, const void *s, size_t len);
void bytebuf_puts(bytebuf *b, const char *z);
void bytebuf_putc(bytebuf *b, char c);
void bytebuf_printf(bytebuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* As bytebuf_reserve / bytebuf_append, but false (b unchanged) when the memory cannot be had
 * or len + extra would overflow. */
bool bytebuf_try_reserve(bytebuf *b, size_t extra);
bool bytebuf_try_append(bytebuf *b, const void *s, size_t len);

#endif
