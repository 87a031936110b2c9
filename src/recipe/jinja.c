/*
 * jinja: the evaluator (see jinja.h for the language, the taint and the bounds).
 *
 * One render owns one arena: every value, environment and string builder is allocated from
 * it and freed at once at the end, so values need no reference counts and an error may end
 * the render from anywhere: jx_fail longjmps back to jinja_render, which frees the arena.
 * Strings are immutable (a pointer, a length and NULL or one taint flag per byte); lists are
 * immutable once built; dicts are insertion-ordered arrays searched linearly (chat-template
 * dicts are small); namespaces are the only thing a template can change.
 *
 * Semantics follow @huggingface/jinja 0.5 statement by statement where templates can see a
 * difference: scoping (a for loop has its own scope shared by its iterations; if does not;
 * a macro's body sees its caller's variables), the output of an iteration left by break or
 * continue is dropped, == is JavaScript's loose equality on the values, `in` its strict one,
 * numbers print as JavaScript prints them (floats with ".0" when integral), booleans as
 * true/false, lists and dicts as JSON, string lengths and indexes count UTF-16 code units
 * for length and code points for slicing as that library does.
 */
#include "recipe/jinja_int.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/jsonfmt.h"
#include "util/unicode.h"
#include "util/bytebuf.h"
#include "util/util.h"

#define JINJA_DEFAULT_STEPS   (20u * 1000 * 1000)
#define JINJA_DEFAULT_OUTPUT  ((size_t)32 << 20)
#define JINJA_DEFAULT_MEMORY  ((size_t)128 << 20)

/* ---- values (their types: jinja_int.h) ------------------------------------------------ */

void jx_fail(jx *x, jinja_status st, const char *fmt, ...)
{
    x->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, x->errsz, fmt, ap);
    va_end(ap);
    longjmp(x->jb, 1);
}

static void *jx_alloc(jx *x, size_t sz)
{
    void *p = jarena_alloc(&x->arena, sz);
    if (!p)
        jx_fail(x, JINJA_ERR_LIMIT, "template rendering used more than %zu MiB of memory", x->arena.cap >> 20);
    return p;
}

/* A copy of old's n items of sz bytes in room for cap (the arena never frees: old stays
 * until the render ends). */
static void *jx_grow(jx *x, const void *old, size_t n, size_t cap, size_t sz)
{
    void *p = jx_alloc(x, cap * sz);
    if (n) memcpy(p, old, n * sz);
    return p;
}

void jx_step(jx *x)
{
    if (++x->steps > x->max_steps)
        jx_fail(x, JINJA_ERR_LIMIT, "template rendering took more than %llu steps", (unsigned long long)x->max_steps);
}

static void jx_enter(jx *x, const jnode *n)
{
    if (++x->depth > JINJA_MAX_DEPTH)
        jx_fail(x, JINJA_ERR_LIMIT, "template nested deeper than %d levels at line %d (recursion?)", JINJA_MAX_DEPTH,
                n ? n->line : 0);
}

const char *jv_type(jv v)
{
    static const char *const names[] = { "undefined", "none", "boolean", "integer", "float", "string", "list",
                                         "dict", "namespace", "function", "loop" };
    return names[v.kind];
}

/* ---- strings ------------------------------------------------------------------------- */

static void jsb_grow(jx *x, jsb *b, size_t add)
{
    if (b->n + add > x->max_output)
        jx_fail(x, JINJA_ERR_LIMIT, "template output larger than %zu bytes", x->max_output);
    if (b->n + add + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + add + 1) cap *= 2;
    b->p = jx_grow(x, b->p, b->n, cap, 1);
    b->t = jx_grow(x, b->t, b->n, cap, 1);
    b->cap = cap;
}

/* Appends s[0..n) with flags t (NULL: every flag is taint). */
static void jsb_put(jx *x, jsb *b, const char *s, size_t n, const uint8_t *t, uint8_t taint)
{
    if (!n) return;
    jsb_grow(x, b, n);
    memcpy(b->p + b->n, s, n);
    if (t) {
        memcpy(b->t + b->n, t, n);
        if (!b->tainted)
            for (size_t i = 0; i < n; i++)
                if (t[i]) { b->tainted = true; break; }
    } else {
        memset(b->t + b->n, taint, n);
        if (taint) b->tainted = true;
    }
    b->n += n;
    b->p[b->n] = 0;
}

void jsb_lit(jx *x, jsb *b, const char *z) { jsb_put(x, b, z, strlen(z), NULL, 0); }
void jsb_str(jx *x, jsb *b, const jstr *s) { jsb_put(x, b, s->p, s->n, s->t, 0); }
/* s[off..off+n) with its flags */
void jsb_sub(jx *x, jsb *b, const jstr *s, size_t off, size_t n) { jsb_put(x, b, s->p + off, n, s->t ? s->t + off : NULL, 0); }

const jstr *jsb_done(jx *x, jsb *b)
{
    jstr *s = jx_alloc(x, sizeof *s);
    s->n = b->n;
    if (!b->n) {
        s->p = "";
        return s;
    }
    s->p = b->p;
    s->t = b->tainted ? b->t : NULL;
    return s;
}

const jstr *jstr_new(jx *x, const char *p, size_t n, bool tainted)
{
    jsb b = { 0 };
    jsb_put(x, &b, p, n, NULL, tainted);
    return jsb_done(x, &b);
}

const jstr *jstr_lit(jx *x, const char *z)
{
    jstr *s = jx_alloc(x, sizeof *s);
    s->p = z;
    s->n = strlen(z);
    return s;
}

static bool jstr_eq(const jstr *a, const jstr *b) { return a->n == b->n && !memcmp(a->p, b->p, a->n); }
static bool jstr_eqz(const jstr *a, const char *z) { return a->n == strlen(z) && !memcmp(a->p, z, a->n); }

/* JavaScript's whitespace (String#trim, \s); the byte length of one at s, 0 if none. */
size_t js_space_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (!n) return 0;
    if (u[0] == ' ' || (u[0] >= 0x09 && u[0] <= 0x0d)) return 1;
    if (n >= 2 && u[0] == 0xC2 && u[1] == 0xA0) return 2;
    return unicode_space3_at(s, n);
}

const jstr *jstr_trim(jx *x, const jstr *s, bool left, bool right)
{
    size_t a = 0, e = s->n, k;
    while (left && a < e && (k = js_space_at(s->p + a, e - a)) > 0) a += k;
    while (right && e > a) {
        size_t cut = 0;
        for (size_t back = 1; back <= 3 && back <= e - a; back++)
            if (js_space_at(s->p + e - back, back) == back) { cut = back; break; }
        if (!cut) break;
        e -= cut;
    }
    jsb b = { 0 };
    jsb_sub(x, &b, s, a, e - a);
    return jsb_done(x, &b);
}

/* ASCII case mapping (what chat templates apply it to: roles, names, booleans). */
const jstr *jstr_case(jx *x, const jstr *s, int mode /* 0 lower, 1 upper, 2 title, 3 capitalize */)
{
    jsb b = { 0 };
    jsb_sub(x, &b, s, 0, s->n);
    bool word = false;
    for (size_t i = 0; i < b.n; i++) {
        char c = b.p[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        bool up = mode == 1 || (mode == 2 && !word) || (mode == 3 && i == 0);
        if (up && c >= 'a' && c <= 'z') b.p[i] = (char)(c - 32);
        else if (mode == 0 && c >= 'A' && c <= 'Z') b.p[i] = (char)(c + 32);
        word = alnum;
    }
    return jsb_done(x, &b);
}

/* Code points of s: their byte offsets into *offs (n + 1 entries, the last s->n). */
size_t jstr_cps(jx *x, const jstr *s, size_t **offs)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n;) {
        size_t l = unicode_len_utf8((uint8_t)s->p[i]);
        i += l > s->n - i ? s->n - i : l;
        n++;
    }
    size_t *o = jx_alloc(x, (n + 1) * sizeof *o);
    size_t k = 0;
    for (size_t i = 0; i < s->n;) {
        o[k++] = i;
        size_t l = unicode_len_utf8((uint8_t)s->p[i]);
        i += l > s->n - i ? s->n - i : l;
    }
    o[n] = s->n;
    *offs = o;
    return n;
}

/* Length in UTF-16 code units, as JavaScript counts. */
int64_t jstr_len16(const jstr *s)
{
    int64_t n = 0;
    for (size_t i = 0; i < s->n;) {
        size_t l = unicode_len_utf8((uint8_t)s->p[i]);
        n += l == 4 ? 2 : 1;
        i += l > s->n - i ? s->n - i : l;
    }
    return n;
}

static const uint8_t *jstr_find(const jstr *h, size_t from, const jstr *nd)
{
    if (nd->n == 0) return (const uint8_t *)h->p + from;
    if (nd->n > h->n) return NULL;
    for (size_t i = from; i + nd->n <= h->n; i++)
        if (!memcmp(h->p + i, nd->p, nd->n)) return (const uint8_t *)h->p + i;
    return NULL;
}

/* ---- lists and dicts ----------------------------------------------------------------- */

jv jv_list(jx *x, size_t n)
{
    jlist *l = jx_alloc(x, sizeof *l);
    l->n = n;
    l->v = n ? jx_alloc(x, n * sizeof *l->v) : NULL;
    return (jv){ .kind = JV_LIST, .l = l };
}

static jv jv_dict(jx *x, jv_kind kind)
{
    jdict *d = jx_alloc(x, sizeof *d);
    return (jv){ .kind = kind, .d = d };
}

jv *jdict_get(const jdict *d, const jstr *k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jstr_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}

static void jdict_set(jx *x, jdict *d, const jstr *k, jv v)
{
    jv *old = jdict_get(d, k);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        d->k = jx_grow(x, d->k, d->n, cap, sizeof *d->k);
        d->v = jx_grow(x, d->v, d->n, cap, sizeof *d->v);
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

/* dict.keys(), dict.values(), dict.items() */
jv jdict_view(jx *x, const jdict *d, int which /* 0 keys, 1 values, 2 items */)
{
    jv l = jv_list(x, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (which == 0) l.l->v[i] = jv_str(d->k[i]);
        else if (which == 1) l.l->v[i] = d->v[i];
        else {
            jv p = jv_list(x, 2);
            p.l->v[0] = jv_str(d->k[i]);
            p.l->v[1] = d->v[i];
            l.l->v[i] = p;
        }
    }
    return l;
}

/* ---- environments -------------------------------------------------------------------- */

static jenv *jenv_new(jx *x, jenv *parent)
{
    jenv *e = jx_alloc(x, sizeof *e);
    e->parent = parent;
    return e;
}

static void jenv_set(jx *x, jenv *e, const char *name, jv v)
{
    for (size_t i = 0; i < e->n; i++)
        if (!strcmp(e->names[i], name)) {
            e->vals[i] = v;
            return;
        }
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 8;
        e->names = jx_grow(x, e->names, e->n, cap, sizeof *e->names);
        e->vals = jx_grow(x, e->vals, e->n, cap, sizeof *e->vals);
        e->cap = cap;
    }
    e->names[e->n] = name;
    e->vals[e->n++] = v;
}

static jv jenv_get(const jenv *e, const char *name)
{
    for (; e; e = e->parent)
        for (size_t i = 0; i < e->n; i++)
            if (!strcmp(e->names[i], name)) return e->vals[i];
    return JV_UNDEF_V;
}

/* ---- printing ------------------------------------------------------------------------ */

static void jnum_js(bytebuf *b, double f)
{
    if (isnan(f)) bytebuf_puts(b, "NaN");
    else if (isinf(f)) bytebuf_puts(b, f > 0 ? "Infinity" : "-Infinity");
    else jsonfmt_write_number(b, f);
}

/* A float as FloatValue#toString prints it: integral ones with ".0". */
static void jnum_float(bytebuf *b, double f)
{
    if (f == 0 && signbit(f)) { bytebuf_puts(b, "-0.0"); return; }
    if (isfinite(f) && f == floor(f) && fabs(f) < 1e21) {
        bytebuf_printf(b, "%.1f", f);
        return;
    }
    jnum_js(b, f);
}

static void jjson_string(jx *x, jsb *b, const jstr *s, bool ensure_ascii)
{
    jsb_lit(x, b, "\"");
    for (size_t i = 0; i < s->n;) {
        unsigned char c = (unsigned char)s->p[i];
        uint8_t t = s->t ? s->t[i] : 0;
        char tmp[16];
        size_t l = 1;
        const char *out = tmp;
        size_t on = 0;
        if (c < 0x80) {
            switch (c) {
            case '"': out = "\\\""; on = 2; break;
            case '\\': out = "\\\\"; on = 2; break;
            case '\b': out = "\\b"; on = 2; break;
            case '\f': out = "\\f"; on = 2; break;
            case '\n': out = "\\n"; on = 2; break;
            case '\r': out = "\\r"; on = 2; break;
            case '\t': out = "\\t"; on = 2; break;
            default:
                if (c < 0x20) on = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", c);
                else if (c == 0x7f && ensure_ascii) on = (size_t)snprintf(tmp, sizeof tmp, "\\u007f");
                else { tmp[0] = (char)c; on = 1; }
            }
        } else {
            bool ok;
            l = unicode_utf8_next(s->p + i, s->n - i, &ok, NULL);
            uint32_t cp = UNICODE_REPLACEMENT;
            if (ok) {
                size_t pos = 0;
                cp = unicode_decode(s->p + i, l, &pos);
            }
            if (ensure_ascii) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    on = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    on = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", cp);
                }
            } else {
                on = (size_t)unicode_encode(cp, tmp);
            }
        }
        jsb_put(x, b, out, on, NULL, t);
        i += l;
    }
    jsb_lit(x, b, "\"");
}

static int jjson_cmp_keys(const void *a, const void *b)
{
    const jstr *x = *(const jstr *const *)a, *y = *(const jstr *const *)b;
    int c = memcmp(x->p, y->p, TM_MIN(x->n, y->n));
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static void jjson_pad(jx *x, jsb *b, const jjson_opt *o, int depth)
{
    jsb_lit(x, b, "\n");
    for (int k = 0; k < o->indent * depth; k++) jsb_lit(x, b, " ");
}

void jjson(jx *x, jsb *b, jv v, const jjson_opt *o, int depth)
{
    jx_step(x);
    if (depth > JINJA_MAX_DEPTH) jx_fail(x, JINJA_ERR_LIMIT, "tojson: value nested deeper than %d levels", JINJA_MAX_DEPTH);
    bytebuf nb = { 0 };
    switch (v.kind) {
    case JV_NONE: jsb_lit(x, b, "null"); return;
    case JV_UNDEF: jsb_lit(x, b, o->undef_null ? "null" : "undefined"); return;
    case JV_BOOL: jsb_lit(x, b, v.b ? "true" : "false"); return;
    case JV_INT: bytebuf_printf(&nb, "%lld", (long long)v.i); break;
    case JV_FLOAT:
        if (!isfinite(v.f)) bytebuf_puts(&nb, "null");
        else jsonfmt_write_number(&nb, v.f);
        break;
    case JV_STR: jjson_string(x, b, v.s, o->ensure_ascii); return;
    case JV_LIST: {
        if (!v.l->n) { jsb_lit(x, b, "[]"); return; }
        jsb_lit(x, b, "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jsb_lit(x, b, o->item_sep);
            if (o->indent) jjson_pad(x, b, o, depth + 1);
            jjson(x, b, v.l->v[i], o, depth + 1);
        }
        if (o->indent) jjson_pad(x, b, o, depth);
        jsb_lit(x, b, "]");
        return;
    }
    case JV_DICT:
    case JV_NS: {
        const jdict *d = v.d;
        if (!d->n) { jsb_lit(x, b, "{}"); return; }
        size_t *order = jx_alloc(x, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) {
            /* insertion sort by key bytes (localeCompare agrees on ASCII keys' usual case) */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jjson_cmp_keys(&d->k[order[j - 1]], &d->k[order[j]]) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        }
        jsb_lit(x, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i) jsb_lit(x, b, o->item_sep);
            if (o->indent) jjson_pad(x, b, o, depth + 1);
            jjson_string(x, b, d->k[order[i]], o->ensure_ascii);
            jsb_lit(x, b, o->key_sep);
            jjson(x, b, d->v[order[i]], o, depth + 1);
        }
        if (o->indent) jjson_pad(x, b, o, depth);
        jsb_lit(x, b, "}");
        return;
    }
    default:
        jx_fail(x, JINJA_ERR_RUNTIME, "cannot convert a %s to JSON", jv_type(v));
    }
    jsb_put(x, b, nb.p, nb.len, NULL, 0);
    bytebuf_free(&nb);
}

const jjson_opt jjson_default = { 0, false, false, true, ", ", ": " };
const jjson_opt jjson_print = { 0, false, false, false, ", ", ": " };

/* Appends v as the output of {{ v }} (toString). */
void jv_print(jx *x, jsb *b, jv v)
{
    bytebuf nb = { 0 };
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE: return;
    case JV_BOOL: jsb_lit(x, b, v.b ? "true" : "false"); return;
    case JV_INT: bytebuf_printf(&nb, "%lld", (long long)v.i); break;
    case JV_FLOAT: jnum_float(&nb, v.f); break;
    case JV_STR: jsb_str(x, b, v.s); return;
    case JV_LIST:
    case JV_DICT:
    case JV_NS: jjson(x, b, v, &jjson_print, 0); return;
    default: jsb_lit(x, b, "[function]"); return;
    }
    jsb_put(x, b, nb.p, nb.len, NULL, 0);
    bytebuf_free(&nb);
}

/* Appends v as JavaScript's String(value) writes the raw value (the + and ~ operators, join). */
void jv_js(jx *x, jsb *b, jv v)
{
    bytebuf nb = { 0 };
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE: return;
    case JV_FLOAT: jnum_js(&nb, v.f); break;
    case JV_LIST:
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jsb_lit(x, b, ",");
            jsb_lit(x, b, "[object Object]");
        }
        return;
    case JV_DICT:
    case JV_NS: jsb_lit(x, b, "[object Map]"); return;
    default: jv_print(x, b, v); return;
    }
    jsb_put(x, b, nb.p, nb.len, NULL, 0);
    bytebuf_free(&nb);
}

/* ---- truth, equality, comparison ----------------------------------------------------- */

bool jv_truthy(jv v)
{
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0 && !isnan(v.f);
    case JV_STR: return v.s->n > 0;
    case JV_LIST: return v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool jv_numeric(jv v) { return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL; }

/* JavaScript's Number(string) for loose equality. */
static double js_to_number(const jstr *s)
{
    size_t a = 0, e = s->n, k;
    while (a < e && (k = js_space_at(s->p + a, e - a)) > 0) a += k;
    while (e > a && js_space_at(s->p + e - 1, 1)) e--;
    if (a == e) return 0;
    char tmp[64];
    if (e - a >= sizeof tmp) return NAN;
    memcpy(tmp, s->p + a, e - a);
    tmp[e - a] = 0;
    char *end;
    double d = strtod(tmp, &end);
    return *end ? NAN : d;
}

/* JavaScript's ==: on the raw values. */
static bool jv_loose_eq(jv a, jv b)
{
    bool an = a.kind == JV_UNDEF || a.kind == JV_NONE, bn = b.kind == JV_UNDEF || b.kind == JV_NONE;
    if (an || bn) return an && bn;
    if (a.kind == JV_STR && b.kind == JV_STR) return jstr_eq(a.s, b.s);
    if (jv_numeric(a) && jv_numeric(b)) return jv_num(a) == jv_num(b);
    if (a.kind == JV_STR && jv_numeric(b)) return js_to_number(a.s) == jv_num(b);
    if (b.kind == JV_STR && jv_numeric(a)) return js_to_number(b.s) == jv_num(a);
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_LIST: return a.l == b.l;
    case JV_DICT:
    case JV_NS: return a.d == b.d;
    case JV_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

/* JavaScript's === on the raw values (`in` on lists, unique). */
bool jv_strict_eq(jv a, jv b)
{
    bool anum = a.kind == JV_INT || a.kind == JV_FLOAT, bnum = b.kind == JV_INT || b.kind == JV_FLOAT;
    if (anum && bnum) return jv_num(a) == jv_num(b);
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_BOOL: return a.b == b.b;
    case JV_STR: return jstr_eq(a.s, b.s);
    case JV_LIST: return a.l == b.l;
    case JV_DICT:
    case JV_NS: return a.d == b.d;
    default: return a.fn == b.fn;
    }
}

/* compareRuntimeValues: -1, 0, 1 or an error. */
int jv_compare(jx *x, jv a, jv b, bool case_sensitive)
{
    if (a.kind == JV_NONE && b.kind == JV_NONE) return 0;
    if (a.kind == JV_UNDEF && b.kind == JV_UNDEF) return 0;
    if (a.kind == JV_NONE || b.kind == JV_NONE || a.kind == JV_UNDEF || b.kind == JV_UNDEF)
        jx_fail(x, JINJA_ERR_RUNTIME, "cannot compare %s with %s", jv_type(a), jv_type(b));
    if (jv_numeric(a) && jv_numeric(b)) {
        double p = jv_num(a), q = jv_num(b);
        return p < q ? -1 : p > q;
    }
    if (a.kind != b.kind || a.kind != JV_STR)
        jx_fail(x, JINJA_ERR_RUNTIME, "cannot compare %s with %s", jv_type(a), jv_type(b));
    size_t n = TM_MIN(a.s->n, b.s->n);
    for (size_t i = 0; i < n; i++) {
        unsigned char p = (unsigned char)a.s->p[i], q = (unsigned char)b.s->p[i];
        if (!case_sensitive) {
            if (p >= 'A' && p <= 'Z') p = (unsigned char)(p + 32);
            if (q >= 'A' && q <= 'Z') q = (unsigned char)(q + 32);
        }
        if (p != q) return p < q ? -1 : 1;
    }
    return (a.s->n > b.s->n) - (a.s->n < b.s->n);
}

/* Stable merge sort of v[0..n) by jv_compare on key(v) (an attribute path or the item). */

static jv jsort_get(jx *x, jv v, const jsort_key *k)
{
    if (k->pair_index >= 0) return v.l->v[k->pair_index];
    return k->attr ? jv_attr_path(x, v, k->attr) : v;
}

void jsort(jx *x, jv *v, size_t n, const jsort_key *k)
{
    if (n < 2) return;
    jv *tmp = jx_alloc(x, n * sizeof *tmp);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = TM_MIN(lo + w, n), hi = TM_MIN(lo + 2 * w, n), i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                jx_step(x);
                int c = jv_compare(x, jsort_get(x, v[i], k), jsort_get(x, v[j], k), k->case_sensitive);
                if (k->reverse) c = -c;
                tmp[o++] = c <= 0 ? v[i++] : v[j++];
            }
            while (i < mid) tmp[o++] = v[i++];
            while (j < hi) tmp[o++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof *v);
    }
}

/* getAttributeValue: "a.b.0" through dicts, namespaces and lists. */
jv jv_attr_path(jx *x, jv item, const jstr *path)
{
    jv v = item;
    size_t i = 0;
    for (;;) {
        size_t e = i;
        while (e < path->n && path->p[e] != '.') e++;
        if (v.kind == JV_DICT || v.kind == JV_NS) {
            jstr part = { e - i, path->p + i, NULL };
            jv *f = jdict_get(v.d, &part);
            v = f ? *f : JV_UNDEF_V;
        } else if (v.kind == JV_LIST) {
            long long idx = -1;
            if (e > i && path->p[i] >= '0' && path->p[i] <= '9') idx = strtoll(path->p + i, NULL, 10);
            if (idx < 0 || (size_t)idx >= v.l->n) return JV_UNDEF_V;
            v = v.l->v[idx];
        } else {
            return JV_UNDEF_V;
        }
        if (e >= path->n) return v;
        i = e + 1;
    }
}

/* ---- the evaluator ------------------------------------------------------------------- */

typedef enum { JX_NEXT = 0, JX_BREAK, JX_CONTINUE } jx_flow;

static jv jx_eval(jx *x, jenv *env, const jnode *n);
static jx_flow jx_exec_block(jx *x, jenv *env, jnode *const *v, size_t n);
static jv jx_call(jx *x, jenv *env, jv fn, jargs *a, const jnode *at);

/* Renders a block into a new string (macro bodies, set blocks, filter blocks). */
static const jstr *jx_render_block(jx *x, jenv *env, jnode *const *v, size_t n, const jnode *at)
{
    jsb b = { 0 }, *saved = x->out;
    x->out = &b;
    jx_flow f = jx_exec_block(x, env, v, n);
    x->out = saved;
    if (f != JX_NEXT) jx_fail(x, JINJA_ERR_RUNTIME, "break or continue outside a loop (line %d)", at->line);
    return jsb_done(x, &b);
}

void jx_eval_args(jx *x, jenv *env, jnode *const *v, size_t n, jargs *a)
{
    memset(a, 0, sizeof *a);
    /* positional first, in order */
    size_t cap_p = 8, cap_k = 8;
    a->pos = jx_alloc(x, cap_p * sizeof *a->pos);
    a->kw_k = jx_alloc(x, cap_k * sizeof *a->kw_k);
    a->kw_v = jx_alloc(x, cap_k * sizeof *a->kw_v);
    for (size_t i = 0; i < n; i++) {
        const jnode *arg = v[i];
        if (arg->kind == JN_KWARG || arg->kind == JN_KWSPREAD) continue;
        jv val = jx_eval(x, env, arg->kind == JN_SPREAD ? arg->a : arg);
        size_t add = arg->kind == JN_SPREAD ? val.l->n : 1;
        if (a->n_pos + add > cap_p) {
            while (cap_p < a->n_pos + add) cap_p *= 2;
            a->pos = jx_grow(x, a->pos, a->n_pos, cap_p, sizeof *a->pos);
        }
        if (arg->kind == JN_SPREAD) {
            if (val.kind != JV_LIST) jx_fail(x, JINJA_ERR_RUNTIME, "cannot unpack a %s", jv_type(val));
            memcpy(a->pos + a->n_pos, val.l->v, val.l->n * sizeof *a->pos);
            a->n_pos += val.l->n;
        } else {
            a->pos[a->n_pos++] = val;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const jnode *arg = v[i];
        if (arg->kind != JN_KWARG && arg->kind != JN_KWSPREAD) continue;
        a->has_kw = true;
        const jstr *keys1[1];
        jv vals1[1];
        const jstr **ks = keys1;
        jv *vs = vals1;
        size_t m = 1;
        if (arg->kind == JN_KWARG) {
            jstr *k = jx_alloc(x, sizeof *k);
            k->p = arg->s;
            k->n = arg->sn;
            keys1[0] = k;
            vals1[0] = jx_eval(x, env, arg->a);
        } else {
            jv d = jx_eval(x, env, arg->a);
            if (d.kind != JV_DICT) jx_fail(x, JINJA_ERR_RUNTIME, "argument after ** must be a mapping, not %s", jv_type(d));
            ks = d.d->k;
            vs = d.d->v;
            m = d.d->n;
        }
        for (size_t j = 0; j < m; j++) {
            for (size_t q = 0; q < a->n_kw; q++)
                if (jstr_eq(a->kw_k[q], ks[j]))
                    jx_fail(x, JINJA_ERR_RUNTIME, "got multiple values for keyword argument '%s'", ks[j]->p);
            if (a->n_kw == cap_k) {
                cap_k *= 2;
                a->kw_k = jx_grow(x, a->kw_k, a->n_kw, cap_k, sizeof *a->kw_k);
                a->kw_v = jx_grow(x, a->kw_v, a->n_kw, cap_k, sizeof *a->kw_v);
            }
            a->kw_k[a->n_kw] = ks[j];
            a->kw_v[a->n_kw++] = vs[j];
        }
    }
}

/* Positional argument i, else keyword `name`, else NULL. */
const jv *jarg(const jargs *a, size_t i, const char *name)
{
    if (i < a->n_pos) return &a->pos[i];
    if (name)
        for (size_t k = 0; k < a->n_kw; k++)
            if (jstr_eqz(a->kw_k[k], name)) return &a->kw_v[k];
    return NULL;
}

static void jx_bind(jx *x, const char *display, jnode *const *params, size_t n_params, bool special, const jargs *a,
                    jenv *scope)
{
    bool *used = a->n_kw ? jx_alloc(x, a->n_kw * sizeof *used) : NULL;
    const jnode **pending = n_params ? jx_alloc(x, n_params * sizeof *pending) : NULL;
    for (size_t i = 0; i < n_params; i++) {
        const jnode *p = params[i];
        const char *name = p->s;
        const jv *v = i < a->n_pos ? &a->pos[i] : NULL;
        if (!v)
            for (size_t k = 0; k < a->n_kw; k++)
                if (!used[k] && jstr_eqz(a->kw_k[k], name)) {
                    v = &a->kw_v[k];
                    used[k] = true;
                    break;
                }
        if (!v && p->kind == JN_KWARG) pending[i] = p;
        jenv_set(x, scope, name, v ? *v : JV_UNDEF_V);
    }
    if (special) {
        jv d = jv_dict(x, JV_DICT);
        for (size_t k = 0; k < a->n_kw; k++)
            if (!used[k]) jdict_set(x, d.d, a->kw_k[k], a->kw_v[k]);
        jenv_set(x, scope, "kwargs", d);
        size_t extra = a->n_pos > n_params ? a->n_pos - n_params : 0;
        jv l = jv_list(x, extra);
        for (size_t k = 0; k < extra; k++) l.l->v[k] = a->pos[n_params + k];
        jenv_set(x, scope, "varargs", l);
    } else {
        for (size_t k = 0; k < a->n_kw; k++)
            if (!used[k]) jx_fail(x, JINJA_ERR_RUNTIME, "macro %s takes no keyword argument '%s'", display, a->kw_k[k]->p);
        if (a->n_pos > n_params)
            jx_fail(x, JINJA_ERR_RUNTIME, "macro %s takes not more than %zu argument(s)", display, n_params);
    }
    for (size_t i = 0; i < n_params; i++)
        if (pending[i]) jenv_set(x, scope, pending[i]->s, jx_eval(x, scope, pending[i]->a));
}

/* ---- string and dict methods --------------------------------------------------------- */

static const jstr *jarg_str(jx *x, const jv *v, const char *what)
{
    if (!v || v->kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "%s must be a string", what);
    return v->s;
}

static bool jstr_starts(const jstr *s, const jstr *p) { return p->n <= s->n && !memcmp(s->p, p->p, p->n); }
static bool jstr_ends(const jstr *s, const jstr *p) { return p->n <= s->n && !memcmp(s->p + s->n - p->n, p->p, p->n); }

static jv jx_str_replace(jx *x, const jstr *s, const jstr *old, const jstr *nw, int64_t count)
{
    if (count == 0) return jv_str(s);
    jsb b = { 0 };
    int64_t done = 0;
    if (old->n == 0) {
        /* "(?=)" matches before every code point and at the end */
        size_t *o;
        size_t n = jstr_cps(x, s, &o);
        for (size_t i = 0; i <= n; i++) {
            if (count < 0 || done < count) {
                jsb_str(x, &b, nw);
                done++;
            }
            if (i < n) jsb_sub(x, &b, s, o[i], o[i + 1] - o[i]);
        }
        return jv_str(jsb_done(x, &b));
    }
    size_t i = 0;
    while (i < s->n) {
        const uint8_t *f = (count < 0 || done < count) ? jstr_find(s, i, old) : NULL;
        if (!f) break;
        size_t at = (size_t)((const char *)f - s->p);
        jsb_sub(x, &b, s, i, at - i);
        jsb_str(x, &b, nw);
        done++;
        i = at + old->n;
        jx_step(x);
    }
    jsb_sub(x, &b, s, i, s->n - i);
    return jv_str(jsb_done(x, &b));
}

static jv jx_str_split(jx *x, const jstr *s, const jargs *a)
{
    const jv *sep = jarg(a, 0, "sep");
    const jv *mx = jarg(a, 1, "maxsplit");
    int64_t maxsplit = -1;
    if (mx) {
        if (mx->kind != JV_INT) jx_fail(x, JINJA_ERR_RUNTIME, "maxsplit argument must be a number");
        maxsplit = mx->i;
    }
    jv *parts = NULL;
    size_t n = 0, cap = 0;
    if (!sep || sep->kind == JV_NONE) {
        size_t i = 0, k;
        while (i < s->n && (k = js_space_at(s->p + i, s->n - i)) > 0) i += k;
        while (i < s->n) {
            size_t st = i;
            if (maxsplit != -1 && (int64_t)n >= maxsplit) {
                i = s->n;
            } else {
                while (i < s->n && !js_space_at(s->p + i, s->n - i)) i++;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                parts = jx_grow(x, parts, n, cap, sizeof *parts);
            }
            jsb b = { 0 };
            jsb_sub(x, &b, s, st, i - st);
            parts[n++] = jv_str(jsb_done(x, &b));
            while (i < s->n && (k = js_space_at(s->p + i, s->n - i)) > 0) i += k;
            jx_step(x);
        }
    } else {
        const jstr *sp = jarg_str(x, sep, "sep argument");
        if (!sp->n) jx_fail(x, JINJA_ERR_RUNTIME, "empty separator");
        size_t i = 0;
        for (;;) {
            const uint8_t *f = (maxsplit == -1 || (int64_t)n < maxsplit) ? jstr_find(s, i, sp) : NULL;
            size_t at = f ? (size_t)((const char *)f - s->p) : s->n;
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                parts = jx_grow(x, parts, n, cap, sizeof *parts);
            }
            jsb b = { 0 };
            jsb_sub(x, &b, s, i, at - i);
            parts[n++] = jv_str(jsb_done(x, &b));
            jx_step(x);
            if (!f) break;
            i = at + sp->n;
        }
    }
    jv l = jv_list(x, n);
    if (n) memcpy(l.l->v, parts, n * sizeof *parts);
    return l;
}

static bool jx_str_affix(jx *x, const jstr *s, const jargs *a, bool end, const char *name)
{
    const jv *p = jarg(a, 0, NULL);
    if (!p) jx_fail(x, JINJA_ERR_RUNTIME, "%s() requires at least one argument", name);
    if (p->kind == JV_STR) return end ? jstr_ends(s, p->s) : jstr_starts(s, p->s);
    if (p->kind == JV_LIST) {
        for (size_t i = 0; i < p->l->n; i++) {
            if (p->l->v[i].kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "%s() tuple elements must be strings", name);
            if (end ? jstr_ends(s, p->l->v[i].s) : jstr_starts(s, p->l->v[i].s)) return true;
        }
        return false;
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "%s() argument must be a string or tuple of strings", name);
}

static jv jx_dictsort(jx *x, const jdict *d, const jargs *a)
{
    const jv *cs = jarg(a, 0, "case_sensitive"), *by = jarg(a, 1, "by"), *rev = jarg(a, 2, "reverse");
    if (cs && cs->kind != JV_BOOL) jx_fail(x, JINJA_ERR_RUNTIME, "case_sensitive must be a boolean");
    if (rev && rev->kind != JV_BOOL) jx_fail(x, JINJA_ERR_RUNTIME, "reverse must be a boolean");
    int idx = 0;
    if (by) {
        if (by->kind != JV_STR || (!jstr_eqz(by->s, "key") && !jstr_eqz(by->s, "value")))
            jx_fail(x, JINJA_ERR_RUNTIME, "by must be either 'key' or 'value'");
        idx = jstr_eqz(by->s, "value");
    }
    jv l = jdict_view(x, d, 2);
    jsort_key k = { .case_sensitive = cs && cs->b, .reverse = rev && rev->b, .pair_index = idx };
    jsort(x, l.l->v, l.l->n, &k);
    return l;
}

jv jx_method(jx *x, jv self, const char *m, const jargs *a)
{
    if (self.kind == JV_STR) {
        const jstr *s = self.s;
        if (!strcmp(m, "upper")) return jv_str(jstr_case(x, s, 1));
        if (!strcmp(m, "lower")) return jv_str(jstr_case(x, s, 0));
        if (!strcmp(m, "title")) return jv_str(jstr_case(x, s, 2));
        if (!strcmp(m, "capitalize")) return jv_str(jstr_case(x, s, 3));
        if (!strcmp(m, "strip")) return jv_str(jstr_trim(x, s, true, true));
        if (!strcmp(m, "lstrip")) return jv_str(jstr_trim(x, s, true, false));
        if (!strcmp(m, "rstrip")) return jv_str(jstr_trim(x, s, false, true));
        if (!strcmp(m, "startswith")) return jv_bool(jx_str_affix(x, s, a, false, m));
        if (!strcmp(m, "endswith")) return jv_bool(jx_str_affix(x, s, a, true, m));
        if (!strcmp(m, "split")) return jx_str_split(x, s, a);
        if (!strcmp(m, "format")) {
            /* Python's "{}" fields, filled in order (an extension: the reference renderer has none) */
            jsb b = { 0 };
            size_t k = 0;
            for (size_t i = 0; i < s->n; i++) {
                if (s->p[i] == '{' && i + 1 < s->n && s->p[i + 1] == '}') {
                    if (k >= a->n_pos) jx_fail(x, JINJA_ERR_RUNTIME, "format(): not enough arguments");
                    jv_print(x, &b, a->pos[k++]);
                    i++;
                } else {
                    jsb_sub(x, &b, s, i, 1);
                }
            }
            return jv_str(jsb_done(x, &b));
        }
        if (!strcmp(m, "replace")) {
            if (a->n_pos < 2) jx_fail(x, JINJA_ERR_RUNTIME, "replace() requires at least two arguments");
            const jstr *o = jarg_str(x, &a->pos[0], "replace() arguments"), *w = jarg_str(x, &a->pos[1], "replace() arguments");
            const jv *c = jarg(a, 2, "count");
            if (c && c->kind != JV_INT && c->kind != JV_NONE)
                jx_fail(x, JINJA_ERR_RUNTIME, "replace() count argument must be a number or null");
            return jx_str_replace(x, s, o, w, c && c->kind == JV_INT ? c->i : -1);
        }
    } else if (self.kind == JV_DICT) {
        const jdict *d = self.d;
        if (!strcmp(m, "get")) {
            const jv *k = jarg(a, 0, NULL);
            if (!k || k->kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "object key must be a string");
            jv *v = jdict_get(d, k->s);
            if (v && v->kind != JV_UNDEF) return *v;
            const jv *def = jarg(a, 1, NULL);
            return def ? *def : JV_NONE_V;
        }
        if (!strcmp(m, "items")) return jdict_view(x, d, 2);
        if (!strcmp(m, "keys")) return jdict_view(x, d, 0);
        if (!strcmp(m, "values")) return jdict_view(x, d, 1);
        if (!strcmp(m, "dictsort")) return jx_dictsort(x, d, a);
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "%s has no method %s", jv_type(self), m);
}

static bool jx_is_str_method(const char *m)
{
    static const char *const names[] = { "upper", "lower", "strip", "title", "capitalize", "rstrip", "lstrip",
                                         "startswith", "endswith", "split", "replace", "format", NULL };
    for (const char *const *p = names; *p; p++)
        if (!strcmp(*p, m)) return true;
    return false;
}

bool jx_is_dict_method(const char *m)
{
    return !strcmp(m, "get") || !strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values") || !strcmp(m, "dictsort");
}

static jv jv_method(jx *x, jv self, const char *m)
{
    jfunc *f = jx_alloc(x, sizeof *f);
    f->kind = JF_METHOD;
    f->self = self;
    f->method = m;
    return (jv){ .kind = JV_FUNC, .fn = f };
}

/* ---- members and slices -------------------------------------------------------------- */

static int64_t jx_slice_norm(int64_t v, int64_t len, bool is_stop, bool fwd, bool given)
{
    if (fwd) {
        if (!given) return is_stop ? len : 0;
        return v < 0 ? TM_MAX(len + v, 0) : TM_MIN(v, len);
    }
    if (!given) return is_stop ? -1 : len - 1;
    if (is_stop) return v < -1 ? TM_MAX(len + v, -1) : TM_MIN(v, len - 1);
    return v < 0 ? TM_MAX(len + v, -1) : TM_MIN(v, len - 1);
}

static jv jx_slice(jx *x, jenv *env, jv obj, const jnode *sl)
{
    if (obj.kind != JV_LIST && obj.kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "slice object must be a list or string (line %d)", sl->line);
    jv b[3] = { jx_eval(x, env, sl->a), jx_eval(x, env, sl->b), jx_eval(x, env, sl->c) };
    for (int k = 0; k < 3; k++)
        if (b[k].kind != JV_INT && b[k].kind != JV_UNDEF) jx_fail(x, JINJA_ERR_RUNTIME, "slice bounds must be integers (line %d)", sl->line);
    int64_t step = b[2].kind == JV_INT ? b[2].i : 1;
    if (step == 0) jx_fail(x, JINJA_ERR_RUNTIME, "slice step cannot be zero");
    size_t *o = NULL;
    int64_t len = obj.kind == JV_LIST ? (int64_t)obj.l->n : (int64_t)jstr_cps(x, obj.s, &o);
    bool fwd = step > 0;
    int64_t st = jx_slice_norm(b[0].i, len, false, fwd, b[0].kind == JV_INT);
    int64_t sp = jx_slice_norm(b[1].i, len, true, fwd, b[1].kind == JV_INT);
    int64_t dir = fwd ? 1 : -1;
    size_t cnt = 0;
    for (int64_t i = st; dir * i < dir * sp; i += step) cnt++;
    if (obj.kind == JV_LIST) {
        jv l = jv_list(x, cnt);
        size_t k = 0;
        for (int64_t i = st; dir * i < dir * sp; i += step) l.l->v[k++] = obj.l->v[i];
        return l;
    }
    jsb sb = { 0 };
    for (int64_t i = st; dir * i < dir * sp; i += step) jsb_sub(x, &sb, obj.s, o[i], o[i + 1] - o[i]);
    return jv_str(jsb_done(x, &sb));
}

static jv jx_member(jx *x, jv obj, jv prop, const jnode *at)
{
    if (obj.kind == JV_DICT || obj.kind == JV_NS) {
        if (prop.kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "cannot access a property with a %s (line %d)", jv_type(prop), at->line);
        jv *v = jdict_get(obj.d, prop.s);
        if (v) return *v;
        if (obj.kind == JV_DICT && jx_is_dict_method(prop.s->p) && prop.s->n == strlen(prop.s->p)) return jv_method(x, obj, prop.s->p);
        return JV_UNDEF_V;
    }
    if (obj.kind == JV_LOOP) {
        const jloop *l = obj.loop;
        if (prop.kind != JV_STR) return JV_UNDEF_V;
        const char *k = prop.s->p;
        int64_t i = (int64_t)l->i, n = (int64_t)l->n;
        if (!strcmp(k, "index")) return jv_int(i + 1);
        if (!strcmp(k, "index0")) return jv_int(i);
        if (!strcmp(k, "revindex")) return jv_int(n - i);
        if (!strcmp(k, "revindex0")) return jv_int(n - i - 1);
        if (!strcmp(k, "first")) return jv_bool(i == 0);
        if (!strcmp(k, "last")) return jv_bool(i == n - 1);
        if (!strcmp(k, "length")) return jv_int(n);
        if (!strcmp(k, "previtem")) return i > 0 ? l->items[i - 1] : JV_UNDEF_V;
        if (!strcmp(k, "nextitem")) return i < n - 1 ? l->items[i + 1] : JV_UNDEF_V;
        return JV_UNDEF_V;
    }
    if (obj.kind == JV_LIST || obj.kind == JV_STR) {
        if (prop.kind == JV_INT) {
            if (obj.kind == JV_LIST) {
                int64_t n = (int64_t)obj.l->n, i = prop.i < 0 ? n + prop.i : prop.i;
                return i >= 0 && i < n ? obj.l->v[i] : JV_UNDEF_V;
            }
            size_t *o;
            int64_t n = (int64_t)jstr_cps(x, obj.s, &o), i = prop.i < 0 ? n + prop.i : prop.i;
            if (i < 0 || i >= n) return JV_UNDEF_V;
            jsb b = { 0 };
            jsb_sub(x, &b, obj.s, o[i], o[i + 1] - o[i]);
            return jv_str(jsb_done(x, &b));
        }
        if (prop.kind == JV_STR) {
            if (jstr_eqz(prop.s, "length")) return jv_int(obj.kind == JV_LIST ? (int64_t)obj.l->n : jstr_len16(obj.s));
            if (obj.kind == JV_STR && jx_is_str_method(prop.s->p) && prop.s->n == strlen(prop.s->p)) return jv_method(x, obj, prop.s->p);
            return JV_UNDEF_V;
        }
        jx_fail(x, JINJA_ERR_RUNTIME, "cannot access a property with a %s (line %d)", jv_type(prop), at->line);
    }
    if (prop.kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "cannot access a property with a %s (line %d)", jv_type(prop), at->line);
    return JV_UNDEF_V;
}

/* ---- tests --------------------------------------------------------------------------- */

bool jx_test(jx *x, const char *name, jv v, const jv *arg, int line)
{
    if (!strcmp(name, "boolean")) return v.kind == JV_BOOL;
    if (!strcmp(name, "callable")) return v.kind == JV_FUNC;
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v.kind != JV_INT) jx_fail(x, JINJA_ERR_RUNTIME, "cannot %s on %s (line %d)", name, jv_type(v), line);
        return (v.i % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "false")) return v.kind == JV_BOOL && !v.b;
    if (!strcmp(name, "true")) return v.kind == JV_BOOL && v.b;
    if (!strcmp(name, "none")) return v.kind == JV_NONE;
    if (!strcmp(name, "string")) return v.kind == JV_STR;
    if (!strcmp(name, "number")) return v.kind == JV_INT || v.kind == JV_FLOAT;
    if (!strcmp(name, "integer")) return v.kind == JV_INT;
    if (!strcmp(name, "iterable")) return v.kind == JV_LIST || v.kind == JV_STR;
    if (!strcmp(name, "mapping")) return v.kind == JV_DICT;
    if (!strcmp(name, "sequence")) return v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_STR;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v.kind != JV_STR) return false;
        for (size_t i = 0; i < v.s->n; i++) {
            char c = v.s->p[i];
            if (name[0] == 'l' ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
        }
        return true;
    }
    if (!strcmp(name, "defined")) return v.kind != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v.kind == JV_UNDEF;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "sameas")) return arg && jv_strict_eq(v, *arg);
    if (!strcmp(name, "in")) {
        if (!arg) return false;
        if (arg->kind == JV_LIST) {
            for (size_t i = 0; i < arg->l->n; i++)
                if (jv_strict_eq(v, arg->l->v[i])) return true;
            return false;
        }
        if (arg->kind == JV_STR && v.kind == JV_STR) return jstr_find(arg->s, 0, v.s) != NULL;
        if (arg->kind == JV_DICT && v.kind == JV_STR) return jdict_get(arg->d, v.s) != NULL;
        return false;
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "unknown test '%s' (line %d)", name, line);
}

/* ---- binary operators ---------------------------------------------------------------- */

static jv jx_binary(jx *x, jenv *env, const jnode *n)
{
    jv l = jx_eval(x, env, n->a);
    if (n->op == JOP_AND) return jv_truthy(l) ? jx_eval(x, env, n->b) : l;
    if (n->op == JOP_OR) return jv_truthy(l) ? l : jx_eval(x, env, n->b);
    jv r = jx_eval(x, env, n->b);
    if (n->op == JOP_EQ) return jv_bool(jv_loose_eq(l, r));
    if (n->op == JOP_NE) return jv_bool(!jv_loose_eq(l, r));
    if (l.kind == JV_UNDEF || r.kind == JV_UNDEF) {
        if (r.kind == JV_UNDEF && (n->op == JOP_IN || n->op == JOP_NOTIN)) return jv_bool(n->op == JOP_NOTIN);
        jx_fail(x, JINJA_ERR_RUNTIME, "cannot operate on undefined values (line %d)", n->line);
    }
    if (l.kind == JV_NONE || r.kind == JV_NONE) jx_fail(x, JINJA_ERR_RUNTIME, "cannot operate on none values (line %d)", n->line);
    if (n->op == JOP_CONCAT) {
        jsb b = { 0 };
        jv_js(x, &b, l);
        jv_js(x, &b, r);
        return jv_str(jsb_done(x, &b));
    }
    if (n->op == JOP_POW && jv_numeric(l) && jv_numeric(r)) {
        double p = jv_num(l), q = jv_num(r), res = pow(p, q);
        if (p == 0 && q < 0) jx_fail(x, JINJA_ERR_RUNTIME, "0.0 cannot be raised to a negative power");
        if (!isfinite(res)) jx_fail(x, JINJA_ERR_RUNTIME, "exponentiation result is not a finite real number");
        bool fl = l.kind == JV_FLOAT || r.kind == JV_FLOAT || q < 0;
        if (!fl && fabs(res) > 9.0e15) jx_fail(x, JINJA_ERR_RUNTIME, "integer overflow (line %d)", n->line);
        return fl ? jv_float(res) : jv_int((int64_t)res);
    }
    bool ln = l.kind == JV_INT || l.kind == JV_FLOAT, rn = r.kind == JV_INT || r.kind == JV_FLOAT;
    if (ln && rn) {
        bool fl = l.kind == JV_FLOAT || r.kind == JV_FLOAT;
        double a = jv_num(l), b = jv_num(r);
        switch (n->op) {
        case JOP_ADD:
        case JOP_SUB:
        case JOP_MUL: {
            if (!fl) {
                int64_t res;
                bool ovf = n->op == JOP_ADD ? __builtin_add_overflow(l.i, r.i, &res)
                         : n->op == JOP_SUB ? __builtin_sub_overflow(l.i, r.i, &res) : __builtin_mul_overflow(l.i, r.i, &res);
                if (ovf) jx_fail(x, JINJA_ERR_RUNTIME, "integer overflow (line %d)", n->line);
                return jv_int(res);
            }
            return jv_float(n->op == JOP_ADD ? a + b : n->op == JOP_SUB ? a - b : a * b);
        }
        case JOP_DIV: return jv_float(a / b);
        case JOP_FLOORDIV:
            if (!fl) {
                if (r.i == 0) jx_fail(x, JINJA_ERR_RUNTIME, "integer division by zero (line %d)", n->line);
                return jv_int((int64_t)floor(a / b));
            }
            return jv_float(floor(a / b));
        case JOP_MOD:
            if (!fl) {
                if (r.i == 0) jx_fail(x, JINJA_ERR_RUNTIME, "integer modulo by zero (line %d)", n->line);
                if (r.i == -1) return jv_int(0);
                return jv_int(l.i % r.i);
            }
            return jv_float(fmod(a, b));
        case JOP_LT: return jv_bool(a < b);
        case JOP_GT: return jv_bool(a > b);
        case JOP_LE: return jv_bool(a <= b);
        case JOP_GE: return jv_bool(a >= b);
        default: break;
        }
    } else if (l.kind == JV_LIST && r.kind == JV_LIST) {
        if (n->op == JOP_ADD) {
            jv res = jv_list(x, l.l->n + r.l->n);
            if (l.l->n) memcpy(res.l->v, l.l->v, l.l->n * sizeof *res.l->v);
            if (r.l->n) memcpy(res.l->v + l.l->n, r.l->v, r.l->n * sizeof *res.l->v);
            return res;
        }
    } else if (r.kind == JV_LIST && (n->op == JOP_IN || n->op == JOP_NOTIN)) {
        bool m = false;
        for (size_t i = 0; i < r.l->n && !m; i++) m = jv_strict_eq(l, r.l->v[i]);
        return jv_bool(m == (n->op == JOP_IN));
    }
    if ((l.kind == JV_STR || r.kind == JV_STR) && n->op == JOP_ADD) {
        jsb b = { 0 };
        jv_js(x, &b, l);
        jv_js(x, &b, r);
        return jv_str(jsb_done(x, &b));
    }
    if (l.kind == JV_STR && r.kind == JV_STR && (n->op == JOP_IN || n->op == JOP_NOTIN))
        return jv_bool((jstr_find(r.s, 0, l.s) != NULL) == (n->op == JOP_IN));
    if (l.kind == JV_STR && r.kind == JV_DICT && (n->op == JOP_IN || n->op == JOP_NOTIN))
        return jv_bool((jdict_get(r.d, l.s) != NULL) == (n->op == JOP_IN));
    jx_fail(x, JINJA_ERR_RUNTIME, "unsupported operator between %s and %s (line %d)", jv_type(l), jv_type(r), n->line);
}

/* ---- calls --------------------------------------------------------------------------- */

static jv jx_strftime(jx *x, const jargs *a)
{
    const jv *f = jarg(a, 0, NULL);
    if (!f || f->kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "strftime_now needs a format string");
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    int y, m, d;
    if (x->today && sscanf(x->today, "%d-%d-%d", &y, &m, &d) == 3) {
        tm.tm_year = y - 1900;
        tm.tm_mon = m - 1;
        tm.tm_mday = d;
        tm.tm_hour = tm.tm_min = 0;   /* a fixed day (tests) starts at midnight */
    }
    static const char *const months[] = { "January", "February", "March", "April", "May", "June", "July",
                                          "August", "September", "October", "November", "December" };
    jsb b = { 0 };
    const jstr *s = f->s;
    for (size_t i = 0; i < s->n; i++) {
        char tmp[32];
        if (s->p[i] != '%' || i + 1 >= s->n) {
            jsb_put(x, &b, s->p + i, 1, NULL, s->t ? s->t[i] : 0);
            continue;
        }
        char c = s->p[++i];
        int mon = tm.tm_mon >= 0 && tm.tm_mon < 12 ? tm.tm_mon : 0;
        switch (c) {
        case 'Y': snprintf(tmp, sizeof tmp, "%d", tm.tm_year + 1900); break;
        case 'm': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mon + 1); break;
        case 'd': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mday); break;
        case 'b': snprintf(tmp, sizeof tmp, "%.3s", months[mon]); break;
        case 'B': snprintf(tmp, sizeof tmp, "%s", months[mon]); break;
        case 'H': snprintf(tmp, sizeof tmp, "%02d", tm.tm_hour); break;
        case 'M': snprintf(tmp, sizeof tmp, "%02d", tm.tm_min); break;
        case '%': snprintf(tmp, sizeof tmp, "%%"); break;
        default: snprintf(tmp, sizeof tmp, "%%%c", c); break;
        }
        jsb_lit(x, &b, tmp);
    }
    return jv_str(jsb_done(x, &b));
}

static jv jx_call(jx *x, jenv *env, jv fn, jargs *a, const jnode *at)
{
    if (fn.kind != JV_FUNC) jx_fail(x, JINJA_ERR_RUNTIME, "cannot call a %s (line %d)", jv_type(fn), at->line);
    const jfunc *f = fn.fn;
    switch (f->kind) {
    case JF_NAMESPACE: {
        jv ns = jv_dict(x, JV_NS);
        if (a->n_pos > 1) jx_fail(x, JINJA_ERR_RUNTIME, "namespace expected at most 1 argument");
        if (a->n_pos == 1) {
            jv src = a->pos[0];
            if (src.kind == JV_DICT) {
                for (size_t i = 0; i < src.d->n; i++) jdict_set(x, ns.d, src.d->k[i], src.d->v[i]);
            } else if (src.kind == JV_LIST) {
                for (size_t i = 0; i < src.l->n; i++) {
                    jv p = src.l->v[i];
                    if (p.kind != JV_LIST || p.l->n != 2 || p.l->v[0].kind != JV_STR)
                        jx_fail(x, JINJA_ERR_RUNTIME, "namespace expected an object or an iterable of [key, value] pairs");
                    jdict_set(x, ns.d, p.l->v[0].s, p.l->v[1]);
                }
            } else {
                jx_fail(x, JINJA_ERR_RUNTIME, "'%s' object is not iterable", jv_type(src));
            }
        }
        for (size_t k = 0; k < a->n_kw; k++) jdict_set(x, ns.d, a->kw_k[k], a->kw_v[k]);
        return ns;
    }
    case JF_RAISE: {
        jsb b = { 0 };
        for (size_t i = 0; i < a->n_pos; i++) {
            if (i) jsb_lit(x, &b, ",");
            jv_js(x, &b, a->pos[i]);
        }
        jx_fail(x, JINJA_ERR_RAISED, "the template raised an exception: %.*s", (int)TM_MIN(b.n, (size_t)400), b.n ? b.p : "");
    }
    case JF_RANGE: {
        const jv *p0 = jarg(a, 0, NULL), *p1 = jarg(a, 1, NULL), *p2 = jarg(a, 2, NULL);
        for (size_t i = 0; i < a->n_pos && i < 3; i++)
            if (a->pos[i].kind != JV_INT) jx_fail(x, JINJA_ERR_RUNTIME, "range() arguments must be integers");
        if (!p0) jx_fail(x, JINJA_ERR_RUNTIME, "range() needs an argument");
        int64_t start = p1 ? p0->i : 0, stop = p1 ? p1->i : p0->i, step = p2 ? p2->i : 1;
        if (step == 0) jx_fail(x, JINJA_ERR_RUNTIME, "range() step must not be zero");
        int64_t cnt = 0;
        if (step > 0 && stop > start) cnt = (stop - start + step - 1) / step;
        if (step < 0 && stop < start) cnt = (start - stop + (-step) - 1) / (-step);
        if ((uint64_t)cnt > x->max_steps) jx_fail(x, JINJA_ERR_LIMIT, "range() of %lld items", (long long)cnt);
        jv l = jv_list(x, (size_t)cnt);
        for (int64_t i = 0; i < cnt; i++) l.l->v[i] = jv_int(start + i * step);
        x->steps += (uint64_t)cnt;
        return l;
    }
    case JF_STRFTIME: return jx_strftime(x, a);
    case JF_METHOD: return jx_method(x, f->self, f->method, a);
    case JF_MACRO: {
        jenv *scope = jenv_new(x, env);
        char disp[80];
        snprintf(disp, sizeof disp, "'%s'", f->node->s);
        jx_bind(x, disp, f->node->w, f->node->nw, f->node->flag, a, scope);
        return jv_str(jx_render_block(x, scope, f->node->v, f->node->n, f->node));
    }
    case JF_CALLER: {
        jenv *scope = jenv_new(x, f->env);
        jx_bind(x, "None", f->node->w, f->node->nw, f->node->flag, a, scope);
        return jv_str(jx_render_block(x, scope, f->node->v, f->node->n, f->node));
    }
    }
    jx_fail(x, JINJA_ERR_RUNTIME, "bad function");
}

static jv jx_eval_call(jx *x, jenv *env, const jnode *n)
{
    jargs a;
    jx_eval_args(x, env, n->v, n->n, &a);
    jv fn = jx_eval(x, env, n->a);
    return jx_call(x, env, fn, &a, n);
}

/* ---- expressions --------------------------------------------------------------------- */

static jv jx_eval_inner(jx *x, jenv *env, const jnode *n)
{
    switch (n->kind) {
    case JN_TEXT:
    case JN_STR: {
        jstr *s = jx_alloc(x, sizeof *s);
        s->p = n->s;
        s->n = n->sn;
        return jv_str(s);
    }
    case JN_INT: return jv_int(n->i);
    case JN_FLOAT: return jv_float(n->f);
    case JN_IDENT: return jenv_get(env, n->s);
    case JN_ARRAY:
    case JN_TUPLE: {
        jv l = jv_list(x, n->n);
        for (size_t i = 0; i < n->n; i++) l.l->v[i] = jx_eval(x, env, n->v[i]);
        l.tuple = n->kind == JN_TUPLE;
        return l;
    }
    case JN_OBJECT: {
        jv d = jv_dict(x, JV_DICT);
        for (size_t i = 0; i + 1 < n->n; i += 2) {
            jv k = jx_eval(x, env, n->v[i]);
            if (k.kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "object keys must be strings (line %d)", n->line);
            jdict_set(x, d.d, k.s, jx_eval(x, env, n->v[i + 1]));
        }
        return d;
    }
    case JN_MEMBER: {
        jv obj = jx_eval(x, env, n->a);
        if (n->flag && n->b->kind == JN_SLICE) return jx_slice(x, env, obj, n->b);
        jv prop;
        if (n->flag) prop = jx_eval(x, env, n->b);
        else if (n->b->kind == JN_INT) prop = jv_int(n->b->i);
        else {
            jstr *s = jx_alloc(x, sizeof *s);
            s->p = n->b->s;
            s->n = n->b->sn;
            prop = jv_str(s);
        }
        return jx_member(x, obj, prop, n);
    }
    case JN_CALL: return jx_eval_call(x, env, n);
    case JN_BINARY: return jx_binary(x, env, n);
    case JN_UNARY: {
        jv v = jx_eval(x, env, n->a);
        if (n->op == JOP_NOT) return jv_bool(!jv_truthy(v));
        if (!jv_numeric(v)) jx_fail(x, JINJA_ERR_RUNTIME, "unary %c on a %s (line %d)", n->op == JOP_NEG ? '-' : '+', jv_type(v), n->line);
        if (v.kind == JV_FLOAT) return jv_float(n->op == JOP_NEG ? -v.f : v.f);
        int64_t i = v.kind == JV_BOOL ? v.b : v.i;
        return jv_int(n->op == JOP_NEG ? -i : i);
    }
    case JN_FILTER: return jx_filter(x, env, jx_eval(x, env, n->a), n->b);
    case JN_TEST: return jv_bool(jx_test(x, n->s, jx_eval(x, env, n->a), NULL, n->line) != n->flag);
    case JN_SELECT: return jv_truthy(jx_eval(x, env, n->b)) ? jx_eval(x, env, n->a) : JV_UNDEF_V;
    case JN_TERNARY: return jv_truthy(jx_eval(x, env, n->a)) ? jx_eval(x, env, n->b) : jx_eval(x, env, n->c);
    case JN_SLICE:
    case JN_KWARG:
    case JN_SPREAD:
    case JN_KWSPREAD:
        jx_fail(x, JINJA_ERR_RUNTIME, "unexpected expression (line %d)", n->line);
    default:
        jx_fail(x, JINJA_ERR_RUNTIME, "a statement used as a value (line %d)", n->line);
    }
}

static jv jx_eval(jx *x, jenv *env, const jnode *n)
{
    if (!n) return JV_UNDEF_V;
    jx_step(x);
    jx_enter(x, n);
    jv v = jx_eval_inner(x, env, n);
    x->depth--;
    return v;
}

/* ---- statements ---------------------------------------------------------------------- */

static void jx_assign(jx *x, jenv *env, const jnode *target, jv v)
{
    if (target->kind == JN_IDENT) {
        jenv_set(x, env, target->s, v);
    } else if (target->kind == JN_TUPLE) {
        if (v.kind != JV_LIST) jx_fail(x, JINJA_ERR_RUNTIME, "cannot unpack a %s (line %d)", jv_type(v), target->line);
        if (v.l->n != target->n)
            jx_fail(x, JINJA_ERR_RUNTIME, "too %s items to unpack (line %d)", target->n > v.l->n ? "few" : "many", target->line);
        for (size_t i = 0; i < target->n; i++) {
            if (target->v[i]->kind != JN_IDENT) jx_fail(x, JINJA_ERR_RUNTIME, "cannot unpack to a non-name (line %d)", target->line);
            jenv_set(x, env, target->v[i]->s, v.l->v[i]);
        }
    } else {
        jx_fail(x, JINJA_ERR_RUNTIME, "invalid assignment target (line %d)", target->line);
    }
}

static jx_flow jx_exec_for(jx *x, jenv *env, const jnode *n)
{
    jenv *scope = jenv_new(x, env);
    const jnode *it = n->b, *test = NULL;
    if (it->kind == JN_SELECT) {
        test = it->b;
        it = it->a;
    }
    jv iterable = jx_eval(x, scope, it);
    if (iterable.kind == JV_DICT) iterable = jdict_view(x, iterable.d, 0);
    if (iterable.kind != JV_LIST)
        jx_fail(x, JINJA_ERR_RUNTIME, "cannot loop over a %s (line %d)", jv_type(iterable), n->line);
    const jlist *src = iterable.l;
    /* the items iterated: the list itself, or those passing the loop's `if` */
    const jv *items = src->v;
    size_t n_items = src->n;
    if (test) {
        jv *kept = src->n ? jx_alloc(x, src->n * sizeof *kept) : NULL;
        n_items = 0;
        for (size_t i = 0; i < src->n; i++) {
            jx_step(x);
            jenv *ls = jenv_new(x, scope);
            jx_assign(x, ls, n->a, src->v[i]);
            if (jv_truthy(jx_eval(x, ls, test))) kept[n_items++] = src->v[i];
        }
        items = kept;
    } else if (n->a->kind == JN_TUPLE) {
        for (size_t i = 0; i < src->n; i++)
            if (src->v[i].kind != JV_LIST)
                jx_fail(x, JINJA_ERR_RUNTIME, "cannot unpack a %s (line %d)", jv_type(src->v[i]), n->line);
    }
    jloop *loop = jx_alloc(x, sizeof *loop);
    loop->n = n_items;
    loop->items = items;
    bool none = true;
    for (size_t i = 0; i < n_items; i++) {
        jx_step(x);
        loop->i = i;
        jenv_set(x, scope, "loop", (jv){ .kind = JV_LOOP, .loop = loop });
        jx_assign(x, scope, n->a, items[i]);
        size_t mark = x->out->n;
        jx_flow f = jx_exec_block(x, scope, n->v, n->n);
        if (f != JX_NEXT) {
            /* the iteration's output is dropped, as the reference renderer drops it */
            x->out->n = mark;
            if (x->out->p) x->out->p[mark] = 0;
            if (f == JX_BREAK) break;
            continue;
        }
        none = false;
    }
    if (none) return jx_exec_block(x, scope, n->w, n->nw);
    return JX_NEXT;
}

static jx_flow jx_exec(jx *x, jenv *env, const jnode *n)
{
    jx_step(x);
    switch (n->kind) {
    case JN_TEXT:
        jsb_put(x, x->out, n->s, n->sn, NULL, 0);
        return JX_NEXT;
    case JN_COMMENT:
        return JX_NEXT;
    case JN_BREAK:
        return JX_BREAK;
    case JN_CONTINUE:
        return JX_CONTINUE;
    case JN_IF: {
        jx_enter(x, n);
        jx_flow f = jv_truthy(jx_eval(x, env, n->a)) ? jx_exec_block(x, env, n->v, n->n) : jx_exec_block(x, env, n->w, n->nw);
        x->depth--;
        return f;
    }
    case JN_FOR: {
        jx_enter(x, n);
        jx_flow f = jx_exec_for(x, env, n);
        x->depth--;
        return f;
    }
    case JN_SET: {
        jx_enter(x, n);
        jv v = n->b ? jx_eval(x, env, n->b) : jv_str(jx_render_block(x, env, n->v, n->n, n));
        if (n->a->kind == JN_MEMBER) {
            jv obj = jx_eval(x, env, n->a->a);
            if (obj.kind != JV_NS) jx_fail(x, JINJA_ERR_RUNTIME, "cannot assign an attribute of a %s (line %d)", jv_type(obj), n->line);
            if (n->a->flag || n->a->b->kind != JN_IDENT) jx_fail(x, JINJA_ERR_RUNTIME, "cannot assign to this member (line %d)", n->line);
            jdict_set(x, obj.d, jstr_lit(x, n->a->b->s), v);
        } else {
            jx_assign(x, env, n->a, v);
        }
        x->depth--;
        return JX_NEXT;
    }
    case JN_MACRO: {
        jfunc *f = jx_alloc(x, sizeof *f);
        f->kind = JF_MACRO;
        f->node = n;
        jenv_set(x, env, n->s, (jv){ .kind = JV_FUNC, .fn = f });
        return JX_NEXT;
    }
    case JN_CALLSTMT: {
        jx_enter(x, n);
        jfunc *cf = jx_alloc(x, sizeof *cf);
        cf->kind = JF_CALLER;
        cf->node = n;
        cf->env = env;
        jargs a;
        jx_eval_args(x, env, n->a->v, n->a->n, &a);
        a.has_kw = true;
        jv fn = jx_eval(x, env, n->a->a);
        if (fn.kind != JV_FUNC) jx_fail(x, JINJA_ERR_RUNTIME, "cannot call a %s (line %d)", jv_type(fn), n->line);
        jenv *ne = jenv_new(x, env);
        jenv_set(x, ne, "caller", (jv){ .kind = JV_FUNC, .fn = cf });
        jv_print(x, x->out, jx_call(x, ne, fn, &a, n));
        x->depth--;
        return JX_NEXT;
    }
    case JN_FILTERSTMT: {
        jx_enter(x, n);
        const jstr *body = jx_render_block(x, env, n->v, n->n, n);
        jv_print(x, x->out, jx_filter(x, env, jv_str(body), n->b));
        x->depth--;
        return JX_NEXT;
    }
    default:
        jv_print(x, x->out, jx_eval(x, env, n));
        return JX_NEXT;
    }
}

static jx_flow jx_exec_block(jx *x, jenv *env, jnode *const *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        jx_flow f = jx_exec(x, env, v[i]);
        if (f != JX_NEXT) return f;
    }
    return JX_NEXT;
}

/* ---- JSON input ---------------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t n, i;
    bool tainted;
} jjin;

static void jjin_ws(jjin *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static const jstr *jjin_string(jx *x, jjin *r)
{
    size_t st = r->i;
    if (r->i >= r->n || r->s[r->i] != '"') jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON in a template variable");
    r->i++;
    bool esc = false;
    while (r->i < r->n && (esc || r->s[r->i] != '"')) {
        esc = !esc && r->s[r->i] == '\\';
        r->i++;
    }
    if (r->i >= r->n) jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON in a template variable");
    r->i++;
    bytebuf b = { 0 };
    if (!jsonfmt_decode_string(&b, r->s + st, r->i - st)) {
        bytebuf_free(&b);
        jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON string in a template variable");
    }
    const jstr *s = jstr_new(x, b.p ? b.p : "", b.len, r->tainted);
    bytebuf_free(&b);
    return s;
}

static jv jjin_value(jx *x, jjin *r, int depth)
{
    if (depth > JSONFMT_MAX_DEPTH) jx_fail(x, JINJA_ERR_LIMIT, "a template variable is nested too deeply");
    jjin_ws(r);
    if (r->i >= r->n) jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON in a template variable");
    char c = r->s[r->i];
    if (c == '"') return jv_str(jjin_string(x, r));
    if (c == '{') {
        jv d = jv_dict(x, JV_DICT);
        r->i++;
        jjin_ws(r);
        if (r->i < r->n && r->s[r->i] == '}') { r->i++; return d; }
        for (;;) {
            jjin_ws(r);
            const jstr *k = jjin_string(x, r);
            jjin_ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON in a template variable");
            r->i++;
            jdict_set(x, d.d, k, jjin_value(x, r, depth + 1));
            jjin_ws(r);
            if (r->i < r->n && r->s[r->i] == ',') { r->i++; continue; }
            if (r->i < r->n && r->s[r->i] == '}') { r->i++; return d; }
            jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON in a template variable");
        }
    }
    if (c == '[') {
        r->i++;
        size_t cap = 8, n = 0;
        jv *v = jx_alloc(x, cap * sizeof *v);
        jjin_ws(r);
        if (r->i < r->n && r->s[r->i] == ']') {
            r->i++;
            return jv_list(x, 0);
        }
        for (;;) {
            if (n == cap) {
                cap *= 2;
                jv *nv = jx_alloc(x, cap * sizeof *nv);
                memcpy(nv, v, n * sizeof *nv);
                v = nv;
            }
            v[n++] = jjin_value(x, r, depth + 1);
            jjin_ws(r);
            if (r->i < r->n && r->s[r->i] == ',') { r->i++; continue; }
            if (r->i < r->n && r->s[r->i] == ']') { r->i++; break; }
            jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON in a template variable");
        }
        jv l = jv_list(x, n);
        memcpy(l.l->v, v, n * sizeof *v);
        return l;
    }
    if (r->n - r->i >= 4 && !memcmp(r->s + r->i, "true", 4)) { r->i += 4; return jv_bool(true); }
    if (r->n - r->i >= 5 && !memcmp(r->s + r->i, "false", 5)) { r->i += 5; return jv_bool(false); }
    if (r->n - r->i >= 4 && !memcmp(r->s + r->i, "null", 4)) { r->i += 4; return JV_NONE_V; }
    char tmp[64];
    size_t k = 0;
    while (r->i < r->n && k < sizeof tmp - 1 && strchr("+-0123456789.eE", r->s[r->i])) tmp[k++] = r->s[r->i++];
    tmp[k] = 0;
    char *end;
    double d = strtod(tmp, &end);
    if (!k || *end) jx_fail(x, JINJA_ERR_RUNTIME, "bad JSON number in a template variable");
    /* JSON.parse gives a number; an integral one is an IntegerValue */
    if (d == floor(d) && fabs(d) < 9.0e15) return jv_int((int64_t)d);
    return jv_float(d);
}

/* ---- the render ---------------------------------------------------------------------- */

static void jx_global_fn(jx *x, jenv *e, const char *name, jfunc_kind k)
{
    jfunc *f = jx_alloc(x, sizeof *f);
    f->kind = k;
    jenv_set(x, e, name, (jv){ .kind = JV_FUNC, .fn = f });
}

jinja_status jinja_render(const jinja_program *p, const jinja_var *vars, size_t n_vars, const char *today,
                          const jinja_limits *lim, jinja_output *out, char *err, size_t errsz)
{
    memset(out, 0, sizeof *out);
    char dummy[1];
    jx *x = xcalloc(1, sizeof *x);
    x->err = err ? err : dummy;
    x->errsz = err ? errsz : sizeof dummy;
    x->max_steps = lim && lim->max_steps ? lim->max_steps : JINJA_DEFAULT_STEPS;
    x->max_output = lim && lim->max_output ? lim->max_output : JINJA_DEFAULT_OUTPUT;
    x->arena.cap = lim && lim->max_memory ? lim->max_memory : JINJA_DEFAULT_MEMORY;
    x->today = today;
    jinja_status st = JINJA_OK;
    if (setjmp(x->jb)) {
        st = x->st;
        goto done;
    }
    jenv *g = jenv_new(x, NULL);
    jenv_set(x, g, "true", jv_bool(true));
    jenv_set(x, g, "false", jv_bool(false));
    jenv_set(x, g, "True", jv_bool(true));
    jenv_set(x, g, "False", jv_bool(false));
    jenv_set(x, g, "none", JV_NONE_V);
    jenv_set(x, g, "None", JV_NONE_V);
    jx_global_fn(x, g, "namespace", JF_NAMESPACE);
    jx_global_fn(x, g, "raise_exception", JF_RAISE);
    jx_global_fn(x, g, "range", JF_RANGE);
    jx_global_fn(x, g, "strftime_now", JF_STRFTIME);
    for (size_t i = 0; i < n_vars; i++) {
        const jinja_var *v = &vars[i];
        jv val;
        if (v->kind == JINJA_VAR_BOOL) {
            val = jv_bool(v->b);
        } else if (v->kind == JINJA_VAR_STRING) {
            val = jv_str(jstr_new(x, v->text, v->len, v->tainted));
        } else {
            jjin r = { v->text, v->len, 0, v->tainted };
            val = jjin_value(x, &r, 0);
        }
        jenv_set(x, g, v->name, val);
    }
    jsb o = { 0 };
    x->out = &o;
    jx_flow f = jx_exec_block(x, g, p->body, p->n_body);
    if (f != JX_NEXT) jx_fail(x, JINJA_ERR_RUNTIME, "break or continue outside a loop");
    out->len = o.n;
    out->text = xmalloc(o.n + 1);
    out->taint = xmalloc(o.n ? o.n : 1);
    if (o.n) {
        memcpy(out->text, o.p, o.n);
        memcpy(out->taint, o.t, o.n);
    }
    out->text[o.n] = 0;
done:
    jarena_free(&x->arena);
    free(x);
    return st;
}

void jinja_output_free(jinja_output *o)
{
    free(o->text);
    free(o->taint);
    memset(o, 0, sizeof *o);
}
