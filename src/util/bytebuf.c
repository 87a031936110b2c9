/*
 * bytebuf: growable byte buffer (see bytebuf.h).
 */
#include "util/bytebuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

void bytebuf_free(bytebuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void bytebuf_reserve(bytebuf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void bytebuf_append(bytebuf *b, const void *s, size_t len)
{
    bytebuf_reserve(b, len);
    if (len) memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = 0;
}

void bytebuf_puts(bytebuf *b, const char *z) { bytebuf_append(b, z, strlen(z)); }
void bytebuf_putc(bytebuf *b, char c) { bytebuf_append(b, &c, 1); }

void bytebuf_printf(bytebuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    bytebuf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}
