/*
 * jsonfmt: JSON validation and re-layout. See jsonfmt.h for the output rules.
 */
#include "util/jsonfmt.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/unicode.h"
#include "util/util.h"

/* ---- reader ---------------------------------------------------------------------------- */

typedef struct {
    const char *s;       /* input bytes */
    size_t n;            /* input length */
    size_t i;            /* read position */
    bytebuf *out;    /* output, or NULL to validate only */
    jsonfmt_style style; /* output layout */
    int indent;          /* spaces per level for JSONFMT_INDENT */
    bool partial;        /* jsonfmt_prefix: the input may continue; emit only what is final */
    bool eof;            /* partial: the read failed because the input ended */
} jsonfmt_rd;

/* The input ended where more was needed: in partial mode a "need more", else an error. */
static bool jsonfmt_end(jsonfmt_rd *r)
{
    r->eof = true;
    return false;
}

static void jsonfmt_ws(jsonfmt_rd *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

static void jsonfmt_emit(jsonfmt_rd *r, const char *s, size_t len)
{
    if (r->out) bytebuf_append(r->out, s, len);
}

static void jsonfmt_newline(jsonfmt_rd *r, int level)
{
    if (!r->out) return;
    bytebuf_putc(r->out, '\n');
    for (int k = 0; k < level * r->indent; k++) bytebuf_putc(r->out, ' ');
}

static int jsonfmt_hex4(const char *s)
{
    uint8_t b[2];
    if (!util_unhex(s, 2, b)) return -1;
    return b[0] << 8 | b[1];
}

static void jsonfmt_put_utf8(bytebuf *b, uint32_t cp)
{
    char u[4];
    bytebuf_append(b, u, (size_t)unicode_encode(cp, u));
}

/* Escapes one decoded code point as JSON.stringify does (lone surrogates as \udxxx). */
static void jsonfmt_put_escaped_cp(bytebuf *b, uint32_t cp)
{
    char tmp[16];
    switch (cp) {
    case '"': bytebuf_puts(b, "\\\""); return;
    case '\\': bytebuf_puts(b, "\\\\"); return;
    case '\b': bytebuf_puts(b, "\\b"); return;
    case '\f': bytebuf_puts(b, "\\f"); return;
    case '\n': bytebuf_puts(b, "\\n"); return;
    case '\r': bytebuf_puts(b, "\\r"); return;
    case '\t': bytebuf_puts(b, "\\t"); return;
    default: break;
    }
    if (cp < 0x20 || (cp >= 0xD800 && cp <= 0xDFFF)) {
        snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
        bytebuf_puts(b, tmp);
        return;
    }
    jsonfmt_put_utf8(b, cp);
}

/* Reads a string literal at r->i (the opening quote). mode 0: re-escape to r->out;
 * mode 1: decode raw UTF-8 into dec. */
static bool jsonfmt_string_rd(jsonfmt_rd *r, bytebuf *dec)
{
    if (r->i >= r->n) return jsonfmt_end(r);
    if (r->s[r->i] != '"') return false;
    r->i++;
    if (r->out && !dec) bytebuf_putc(r->out, '"');
    bytebuf *o = dec ? dec : r->out;
    while (r->i < r->n) {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            if (r->out && !dec) bytebuf_putc(r->out, '"');
            return true;
        }
        if (c < 0x20) return false;
        if (c != '\\') {
            /* copy a run of plain bytes */
            size_t j = r->i;
            while (j < r->n && r->s[j] != '"' && r->s[j] != '\\' && (unsigned char)r->s[j] >= 0x20) j++;
            size_t keep = j - r->i;
            if (r->partial && j == r->n) keep -= unicode_utf8_tail(r->s + r->i, keep); /* whole characters only */
            if (o) bytebuf_append(o, r->s + r->i, keep);
            r->i = j;
            continue;
        }
        if (r->i + 1 >= r->n) return jsonfmt_end(r);
        char e = r->s[r->i + 1];
        uint32_t cp;
        r->i += 2;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
            if (r->i + 4 > r->n) return jsonfmt_end(r);
            int h = jsonfmt_hex4(r->s + r->i);
            if (h < 0) return false;
            r->i += 4;
            cp = (uint32_t)h;
            /* a high surrogate may still be followed by its low half */
            if (r->partial && cp >= 0xD800 && cp <= 0xDBFF && r->i + 6 > r->n) return jsonfmt_end(r);
            if (cp >= 0xD800 && cp <= 0xDBFF && r->i + 6 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') {
                int l = jsonfmt_hex4(r->s + r->i + 2);
                if (l >= 0xDC00 && l <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)l - 0xDC00);
                    r->i += 6;
                }
            }
            break;
        }
        default: return false;
        }
        if (!o) continue;
        if (dec) jsonfmt_put_utf8(dec, cp);
        else jsonfmt_put_escaped_cp(o, cp);
    }
    return jsonfmt_end(r);
}

void jsonfmt_write_number(bytebuf *b, double v)
{
    char tmp[64];
    if (v == 0) { bytebuf_putc(b, '0'); return; }
    if (!isfinite(v)) { bytebuf_puts(b, "null"); return; }
    /* shortest round-trip digits */
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v) break;
    }
    /* tmp = [-]d.ddde[+-]xx */
    char digits[32];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int e10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) bytebuf_putc(b, '-');
    int n = e10 + 1; /* position of the decimal point relative to the digits */
    if (nd <= n && n <= 21) {
        bytebuf_append(b, digits, (size_t)nd);
        for (int k = nd; k < n; k++) bytebuf_putc(b, '0');
    } else if (0 < n && n <= 21) {
        bytebuf_append(b, digits, (size_t)n);
        bytebuf_putc(b, '.');
        bytebuf_append(b, digits + n, (size_t)(nd - n));
    } else if (-6 < n && n <= 0) {
        bytebuf_puts(b, "0.");
        for (int k = 0; k < -n; k++) bytebuf_putc(b, '0');
        bytebuf_append(b, digits, (size_t)nd);
    } else {
        bytebuf_putc(b, digits[0]);
        if (nd > 1) {
            bytebuf_putc(b, '.');
            bytebuf_append(b, digits + 1, (size_t)(nd - 1));
        }
        snprintf(tmp, sizeof tmp, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
        bytebuf_puts(b, tmp);
    }
}

static bool jsonfmt_number(jsonfmt_rd *r)
{
    size_t st = r->i;
    bool is_int = true;
    if (r->partial) { /* a number that reaches the end of the input may go on */
        size_t j = st;
        while (j < r->n && r->s[j] && strchr("0123456789+-.eE", r->s[j])) j++;
        if (j == r->n) return jsonfmt_end(r);
    }
    if (r->i < r->n && r->s[r->i] == '-') r->i++;
    if (r->i >= r->n) return false;
    if (r->s[r->i] == '0') r->i++;
    else if (r->s[r->i] >= '1' && r->s[r->i] <= '9')
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    else return false;
    if (r->i < r->n && r->s[r->i] == '.') {
        is_int = false;
        r->i++;
        size_t d = r->i;
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
        if (r->i == d) return false;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        is_int = false;
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        size_t d = r->i;
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
        if (r->i == d) return false;
    }
    if (!r->out) return true;
    size_t len = r->i - st;
    if (is_int && len <= 15 && !(len == 2 && r->s[st] == '-' && r->s[st + 1] == '0')) {
        jsonfmt_emit(r, r->s + st, len);
        return true;
    }
    char tmp[512];
    if (len >= sizeof tmp) {
        jsonfmt_emit(r, r->s + st, len);
        return true;
    }
    memcpy(tmp, r->s + st, len);
    tmp[len] = 0;
    jsonfmt_write_number(r->out, strtod(tmp, NULL));
    return true;
}

static bool jsonfmt_lit(jsonfmt_rd *r, const char *lit)
{
    size_t l = strlen(lit);
    if (r->partial && r->n - r->i < l && !memcmp(r->s + r->i, lit, r->n - r->i)) return jsonfmt_end(r);
    if (r->n - r->i < l || memcmp(r->s + r->i, lit, l)) return false;
    r->i += l;
    jsonfmt_emit(r, lit, l);
    return true;
}

static bool jsonfmt_value(jsonfmt_rd *r, int depth)
{
    if (depth > JSONFMT_MAX_DEPTH) return false;
    jsonfmt_ws(r);
    if (r->i >= r->n) return jsonfmt_end(r);
    char c = r->s[r->i];
    const char *item_sep = r->style == JSONFMT_SPACED ? ", " : ",";
    const char *key_sep = r->style == JSONFMT_COMPACT ? ":" : ": ";
    bool ind = r->style == JSONFMT_INDENT && r->indent > 0;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        char close = obj ? '}' : ']';
        r->i++;
        jsonfmt_emit(r, &c, 1);
        jsonfmt_ws(r);
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
            jsonfmt_emit(r, &close, 1);
            return true;
        }
        for (int k = 0;; k++) {
            if (k) jsonfmt_emit(r, item_sep, strlen(item_sep));
            if (ind) jsonfmt_newline(r, depth + 1);
            jsonfmt_ws(r);
            if (obj) {
                if (!jsonfmt_string_rd(r, NULL)) return false;
                jsonfmt_ws(r);
                if (r->i >= r->n) return jsonfmt_end(r);
                if (r->s[r->i] != ':') return false;
                r->i++;
                jsonfmt_emit(r, key_sep, strlen(key_sep));
            }
            if (!jsonfmt_value(r, depth + 1)) return false;
            jsonfmt_ws(r);
            if (r->i >= r->n) return jsonfmt_end(r);
            if (r->s[r->i] == ',') { r->i++; continue; }
            if (r->s[r->i] != close) return false;
            r->i++;
            if (ind) jsonfmt_newline(r, depth);
            jsonfmt_emit(r, &close, 1);
            return true;
        }
    }
    if (c == '"') return jsonfmt_string_rd(r, NULL);
    if (c == 't') return jsonfmt_lit(r, "true");
    if (c == 'f') return jsonfmt_lit(r, "false");
    if (c == 'n') return jsonfmt_lit(r, "null");
    return jsonfmt_number(r);
}

bool jsonfmt_write(bytebuf *out, const char *src, size_t len, jsonfmt_style style, int indent)
{
    size_t mark = out->len;
    jsonfmt_rd r = { .s = src, .n = len, .i = 0, .out = out, .style = style, .indent = indent };
    bool ok = jsonfmt_value(&r, 0);
    if (ok) {
        jsonfmt_ws(&r);
        ok = r.i == r.n;
    }
    if (!ok) {
        out->len = mark;
        if (out->p) out->p[mark] = 0;
    }
    return ok;
}

jsonfmt_prefix_status jsonfmt_prefix(bytebuf *out, const char *src, size_t len, size_t *used)
{
    jsonfmt_rd r = { .s = src, .n = len, .i = 0, .out = out, .style = JSONFMT_COMPACT, .partial = true };
    bytebuf_reserve(out, 0);
    if (jsonfmt_value(&r, 0)) {
        if (used) *used = r.i;
        return JSONFMT_PREFIX_DONE;
    }
    return r.eof ? JSONFMT_PREFIX_MORE : JSONFMT_PREFIX_BAD;
}

jsonfmt_scan_status jsonfmt_scan(const char *src, size_t len, int max_depth, size_t max_values, int *depth,
                                 size_t *n_values)
{
    int d = 0, deepest = 0;
    size_t n = len ? 1 : 0;
    jsonfmt_scan_status st = JSONFMT_SCAN_OK;
    for (size_t i = 0; i < len && st == JSONFMT_SCAN_OK; i++) {
        switch (src[i]) {
        case '"':  /* skip the string: its brackets and commas are text */
            for (i++; i < len && src[i] != '"'; i++)
                if (src[i] == '\\') i++;
            break;
        case '[':
        case '{':
            if (++d > deepest) deepest = d;
            if (d > max_depth) st = JSONFMT_SCAN_TOO_DEEP;
            else if (++n > max_values) st = JSONFMT_SCAN_TOO_MANY;
            break;
        case ']':
        case '}':
            if (d > 0) d--;
            break;
        case ',':
        case ':':
            if (++n > max_values) st = JSONFMT_SCAN_TOO_MANY;
            break;
        default: break;
        }
    }
    if (depth) *depth = deepest;
    if (n_values) *n_values = n;
    return st;
}

bool jsonfmt_valid(const char *src, size_t len)
{
    jsonfmt_rd r = { .s = src, .n = len };
    if (!jsonfmt_value(&r, 0)) return false;
    jsonfmt_ws(&r);
    return r.i == r.n;
}

void jsonfmt_write_string(bytebuf *out, const char *s, size_t len)
{
    bytebuf_putc(out, '"');
    size_t i = 0;
    while (i < len) {
        size_t j = i;  /* a run of bytes that need nothing: printable ASCII but " and \ */
        while (j < len && (unsigned char)s[j] >= 0x20 && (unsigned char)s[j] < 0x80 && s[j] != '"' && s[j] != '\\') j++;
        bytebuf_append(out, s + i, j - i);
        if (j == len) break;
        unsigned char c = (unsigned char)s[j];
        if (c < 0x80) {
            jsonfmt_put_escaped_cp(out, c);
            j++;
        } else {
            bool ok;
            size_t n = unicode_utf8_next(s + j, len - j, &ok, NULL);
            if (ok) bytebuf_append(out, s + j, n);
            else jsonfmt_put_utf8(out, UNICODE_REPLACEMENT);
            j += n;
        }
        i = j;
    }
    bytebuf_putc(out, '"');
}

bool jsonfmt_get_member(const char *src, size_t len, const char *key, const char **val, size_t *val_len)
{
    if (!jsonfmt_valid(src, len)) return false;
    jsonfmt_rd r = { .s = src, .n = len };
    jsonfmt_ws(&r);
    if (r.i >= r.n || r.s[r.i] != '{') return false;
    r.i++;
    bytebuf k = { 0 };
    bool found = false;
    for (;;) {
        jsonfmt_ws(&r);
        if (r.s[r.i] == '}') break;
        k.len = 0;
        if (!jsonfmt_string_rd(&r, &k)) break;
        jsonfmt_ws(&r);
        r.i++; /* ':' */
        jsonfmt_ws(&r);
        size_t st = r.i;
        if (!jsonfmt_value(&r, 1)) break;
        if (k.len == strlen(key) && !memcmp(k.p ? k.p : "", key, k.len)) {
            *val = src + st;
            *val_len = r.i - st;
            found = true;
            break;
        }
        jsonfmt_ws(&r);
        if (r.s[r.i] == ',') r.i++;
        else break;
    }
    bytebuf_free(&k);
    return found;
}

bool jsonfmt_next(const char *src, size_t len, size_t *pos, bytebuf *key, const char **val, size_t *val_len)
{
    jsonfmt_rd r = { .s = src, .n = len, .i = *pos };
    if (r.i == 0) { /* first call: step into the container */
        jsonfmt_ws(&r);
        if (r.i >= r.n || (r.s[r.i] != '{' && r.s[r.i] != '[')) return false;
        r.i++;
    } else {
        jsonfmt_ws(&r);
        if (r.i >= r.n || r.s[r.i] != ',') return false;
        r.i++;
    }
    jsonfmt_ws(&r);
    if (r.i >= r.n || r.s[r.i] == '}' || r.s[r.i] == ']') return false;
    /* an object member starts with its key, then ':' */
    size_t st = r.i;
    if (r.s[r.i] == '"') {
        bytebuf dummy = { 0 };
        bytebuf *k = key ? key : &dummy;
        if (key) {
            key->len = 0;
        }
        size_t at = r.i;
        if (!jsonfmt_string_rd(&r, k)) {
            bytebuf_free(&dummy);
            return false;
        }
        jsonfmt_ws(&r);
        if (r.i < r.n && r.s[r.i] == ':') {
            r.i++;
            jsonfmt_ws(&r);
            st = r.i;
        } else {
            r.i = at;  /* an array element that is a string */
            if (key) key->len = 0;
        }
        bytebuf_free(&dummy);
    }
    if (!jsonfmt_value(&r, 1)) return false;
    *val = src + st;
    *val_len = r.i - st;
    *pos = r.i;
    return true;
}

bool jsonfmt_decode_string(bytebuf *out, const char *src, size_t len)
{
    jsonfmt_rd r = { .s = src, .n = len };
    size_t mark = out->len;
    bytebuf_reserve(out, 0);
    if (!jsonfmt_string_rd(&r, out)) {
        out->len = mark;
        out->p[mark] = 0;
        return false;
    }
    return true;
}
