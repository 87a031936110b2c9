/*
 * unicode: lenient UTF-8 decoding, code point classes and the GPT-2 byte map (see unicode.h).
 * Classes are a binary search over the generated range table, with a direct table for ASCII.
 */
#include "util/unicode.h"

#include <stdbool.h>
#include <string.h>

uint32_t unicode_decode(const char *z, size_t len, size_t *pos)
{
    const uint8_t *s = (const uint8_t *)z;
    size_t i = *pos;
    uint8_t b0 = s[i];
    if (b0 < 0x80) {
        *pos = i + 1;
        return b0;
    }
#define CONT(k) (i + (k) < len && (s[i + (k)] & 0xC0) == 0x80)
    if ((b0 & 0x40) == 0) goto bad;                 /* stray continuation byte */
    if ((b0 & 0x20) == 0) {                         /* 110xxxxx */
        if (!CONT(1)) goto bad;
        *pos = i + 2;
        return ((uint32_t)(b0 & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if ((b0 & 0x10) == 0) {                         /* 1110xxxx */
        if (!CONT(1) || !CONT(2)) goto bad;
        *pos = i + 3;
        return ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    if ((b0 & 0x08) == 0) {                         /* 11110xxx */
        if (!CONT(1) || !CONT(2) || !CONT(3)) goto bad;
        *pos = i + 4;
        uint32_t c = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                     ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
        return c > 0x10FFFF ? UNICODE_REPLACEMENT : c;
    }
#undef CONT
bad:
    *pos = i + 1;
    return UNICODE_REPLACEMENT;
}

int unicode_encode(uint32_t c, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (c > 0x10FFFF) c = UNICODE_REPLACEMENT;
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

uint32_t unicode_flags(uint32_t c)
{
    if (c >= 0x110000) return UNICODE_FLAG_UNDEFINED;
    /* last range whose start <= c */
    uint32_t lo = 0, hi = unicode_data_n_ranges;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (unicode_data_ranges[mid][0] <= c) lo = mid;
        else hi = mid;
    }
    return unicode_data_ranges[lo][1];
}

/* Bytes that stand for themselves in the GPT-2 map: '!'..'~', 0xA1..0xAC, 0xAE..0xFF. */
static bool unicode_byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

/* The non-printable bytes are 0x00..0x20 (33), 0x7F..0xA0 (34) and 0xAD: the n-th of them, in
 * byte order, stands for U+0100 + n. */
uint32_t unicode_byte_to_cpt(uint8_t b)
{
    if (unicode_byte_is_printable(b)) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 33 + (b - 0x7F);
    return 0x100 + 67;  /* 0xAD */
}

int unicode_cpt_to_byte(uint32_t c)
{
    if (c < 0x100) return unicode_byte_is_printable(c) ? (int)c : -1;
    if (c > 0x143) return -1;
    uint32_t n = c - 0x100;
    if (n < 33) return (int)n;
    if (n < 67) return (int)(0x7F + n - 33);
    return 0xAD;
}

size_t unicode_utf8_next(const char *z, size_t len, bool *ok, bool *incomplete)
{
    const uint8_t *s = (const uint8_t *)z;
    uint8_t b0 = s[0];
    if (incomplete) *incomplete = false;
    *ok = true;
    if (b0 < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;  /* the range of the second byte; later ones are 80..BF */
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        if (b0 == 0xE0) lo = 0xA0;        /* overlong */
        else if (b0 == 0xED) hi = 0x9F;   /* surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        if (b0 == 0xF0) lo = 0x90;        /* overlong */
        else if (b0 == 0xF4) hi = 0x8F;   /* above U+10FFFF */
    } else {
        *ok = false;                      /* 80..C1, F5..FF never start a character */
        return 1;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= len) {
            *ok = false;
            if (incomplete) *incomplete = true;
            return k;
        }
        uint8_t c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) {
            *ok = false;
            return k;
        }
    }
    return need;
}

bool unicode_utf8_valid(const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        bool ok;
        i += unicode_utf8_next(s + i, len - i, &ok, NULL);
        if (!ok) return false;
    }
    return true;
}

size_t unicode_utf8_tail(const char *s, size_t len)
{
    size_t from = len > 3 ? len - 3 : 0;
    for (size_t i = from; i < len; i++) {
        bool ok, inc;
        size_t n = unicode_utf8_next(s + i, len - i, &ok, &inc);
        if (!ok && inc) return len - i;
        if (ok) i += n - 1;
    }
    return 0;
}

size_t unicode_utf8_repair(const char *s, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        bool ok;
        size_t n = unicode_utf8_next(s + i, len - i, &ok, NULL);
        if (ok) {
            memcpy(out + o, s + i, n);
            o += n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += n;
    }
    return o;
}

uint32_t unicode_tolower(uint32_t cpt)
{
    uint32_t lo = 0, hi = unicode_fold_n_lower;   /* the first entry >= cpt */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (unicode_fold_lower[mid][0] < cpt) lo = mid + 1;
        else hi = mid;
    }
    return lo < unicode_fold_n_lower && unicode_fold_lower[lo][0] == cpt ? unicode_fold_lower[lo][1] : cpt;
}

uint32_t unicode_nfd_base(uint32_t cpt)
{
    uint32_t lo = 0, hi = unicode_fold_n_nfd;   /* the first range starting after cpt */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (unicode_fold_nfd[mid][0] <= cpt) lo = mid + 1;
        else hi = mid;
    }
    return lo > 0 && cpt <= unicode_fold_nfd[lo - 1][1] ? unicode_fold_nfd[lo - 1][2] : cpt;
}

size_t unicode_space3_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n < 3) return 0;
    if (u[0] == 0xE1 && u[1] == 0x9A && u[2] == 0x80) return 3;
    if (u[0] == 0xE2 && u[1] == 0x80 && (u[2] <= 0x8A || u[2] == 0xA8 || u[2] == 0xA9 || u[2] == 0xAF)) return 3;
    if (u[0] == 0xE2 && u[1] == 0x81 && u[2] == 0x9F) return 3;
    if (u[0] == 0xE3 && u[1] == 0x80 && u[2] == 0x80) return 3;
    if (u[0] == 0xEF && u[1] == 0xBB && u[2] == 0xBF) return 3;
    return 0;
}
