/*
 * bytebuf: growable byte buffer (see bytebuf.h).
 */
#include "util/bytebuf.h"

#include <stdarg.h>
#include <stdint.h>
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

bool bytebuf_try_reserve(bytebuf *b, size_t extra)
{
    if (extra > SIZE_MAX - 1 - b->len) return false;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

/* The plain calls' end when the try ones fail: the size asked for, then abort. */
static void bytebuf_oom(const bytebuf *b, size_t extra)
{
    util_oom(extra > SIZE_MAX - 1 - b->len ? SIZE_MAX : b->len + extra + 1);
}

void bytebuf_reserve(bytebuf *b, size_t extra)
{
    if (!bytebuf_try_reserve(b, extra)) bytebuf_oom(b, extra);
}

bool bytebuf_try_append(bytebuf *b, const void *s, size_t len)
{
    if (!bytebuf_try_reserve(b, len)) return false;
    if (len) memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = 0;
    return true;
}

void bytebuf_append(bytebuf *b, const void *s, size_t len)
{
    if (!bytebuf_try_append(b, s, len)) bytebuf_oom(b, len);
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
