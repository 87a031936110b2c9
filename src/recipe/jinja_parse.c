/*
 * jinja_parse: source text to syntax tree, as @huggingface/jinja reads it.
 *
 * Preprocessing first (the library's regular expressions, in its order): one trailing newline
 * dropped; lstrip_blocks (blanks at a line's start before "{%", "{#" or "{-" removed);
 * trim_blocks (the newline right after "%}", "#}" or "-}" removed); `{% generation %}` and
 * `{% endgeneration %}` removed with the blanks their dashes ask. Then the lexer: text runs up
 * to the next "{{", "{%" or "{#"; inside tags, tokens by the library's ordered table; "{%-" and
 * "{{-" strip the blanks before, "-%}" and "-}}" those after. Then a recursive-descent parser
 * with the library's precedence (or < and < not < comparisons and in < + - ~ < * / // % < ** <
 * is-tests < filters < unary sign < calls and members). Every recursive call counts against
 * JINJA_MAX_DEPTH, so no source can exhaust the stack.
 */
#include "recipe/jinja_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/unicode.h"
#include "util/bytebuf.h"
#include "util/util.h"

/* ---- arena ----------------------------------------------------------------------------- */

struct jarena_chunk {
    jarena_chunk *next;
    size_t size, used;        /* bytes of data[] */
    _Alignas(16) unsigned char data[];
};

#define JARENA_CHUNK (64 * 1024)

void *jarena_alloc(jarena *a, size_t sz)
{
    sz = (sz + 15) & ~(size_t)15;
    if (sz == 0) sz = 16;
    jarena_chunk *c = a->head;
    if (!c || c->size - c->used < sz) {
        size_t size = sz > JARENA_CHUNK / 4 ? sz : JARENA_CHUNK;
        if (a->cap && (a->held + size > a->cap || size > a->cap)) return NULL;
        jarena_chunk *nc = malloc(sizeof *nc + size);
        if (!nc) return NULL;
        nc->size = size;
        nc->used = 0;
        a->held += size;
        if (size != JARENA_CHUNK && c) {
            /* a big block goes behind the current chunk, which keeps serving small ones */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            a->head = nc;
        }
        c = nc;
    }
    void *p = c->data + c->used;
    c->used += sz;
    memset(p, 0, sz);
    return p;
}

void jarena_free(jarena *a)
{
    jarena_chunk *c = a->head;
    while (c) {
        jarena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->held = 0;
}

/* ---- preprocessing ------------------------------------------------------------------- */

static bool jp_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The blanks-and-tag `{%-? generation -?%}` or endgeneration at s[i]; its length, 0 if none;
 * *lstrip / *rstrip: its dashes. */
static size_t jp_generation_tag(const char *s, size_t n, size_t i, bool *lstrip, bool *rstrip)
{
    size_t j = i;
    if (j + 2 > n || s[j] != '{' || s[j + 1] != '%') return 0;
    j += 2;
    *lstrip = j < n && s[j] == '-';
    if (*lstrip) j++;
    while (j < n && jp_space(s[j])) j++;
    if (j + 3 <= n && !memcmp(s + j, "end", 3)) j += 3;
    if (j + 10 > n || memcmp(s + j, "generation", 10)) return 0;
    j += 10;
    while (j < n && jp_space(s[j])) j++;
    *rstrip = j < n && s[j] == '-';
    if (*rstrip) j++;
    if (j + 2 > n || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2 - i;
}

/* A stage's output: bytes and, for each, its offset in the original source (error lines). */
typedef struct {
    bytebuf b;
    size_t *at;
    size_t cap;
} jp_text;

static void jp_text_put(jp_text *o, const char *s, size_t n, const size_t *at_in, size_t from)
{
    if (o->b.len + n > o->cap) {
        o->cap = (o->b.len + n) * 2 + 16;
        o->at = xrealloc(o->at, o->cap * sizeof *o->at);
    }
    for (size_t k = 0; k < n; k++) o->at[o->b.len + k] = at_in ? at_in[from + k] : from + k;
    bytebuf_append(&o->b, s, n);
}

static void jp_text_free(jp_text *o)
{
    bytebuf_free(&o->b);
    free(o->at);
}

/* The preprocessed source into *out (out->at: original offsets). */
static void jp_preprocess(const char *src, size_t n, jp_text *out)
{
    if (n && src[n - 1] == '\n') n--;
    jp_text a = { 0 }, b = { 0 };
    /* lstrip_blocks */
    jp_text_put(&a, NULL, 0, NULL, 0);
    for (size_t i = 0; i < n;) {
        if (i == 0 || src[i - 1] == '\n' || src[i - 1] == '\r') {
            size_t j = i;
            while (j < n && (src[j] == ' ' || src[j] == '\t')) j++;
            if (j + 1 < n && src[j] == '{' && (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) i = j;
        }
        /* copy up to the next line start */
        size_t k = i;
        while (k < n && src[k] != '\n' && src[k] != '\r') k++;
        if (k < n) k++;
        jp_text_put(&a, src + i, k - i, NULL, i);
        i = k;
    }
    /* trim_blocks */
    jp_text_put(&b, NULL, 0, NULL, 0);
    for (size_t i = 0; i < a.b.len; i++) {
        if (a.b.p[i] == '\n' && i >= 2 && a.b.p[i - 1] == '}' && (a.b.p[i - 2] == '#' || a.b.p[i - 2] == '%' || a.b.p[i - 2] == '-'))
            continue;
        jp_text_put(&b, a.b.p + i, 1, a.at, i);
    }
    jp_text_free(&a);
    /* generation tags */
    jp_text_put(out, NULL, 0, NULL, 0);
    size_t i = 0;
    while (i < b.b.len) {
        /* a run of blanks followed by a tag, or a tag */
        size_t j = i;
        while (j < b.b.len && jp_space(b.b.p[j])) j++;
        bool ls, rs;
        size_t tl = j < b.b.len ? jp_generation_tag(b.b.p, b.b.len, j, &ls, &rs) : 0;
        if (!tl) {
            size_t m = j > i ? j - i : 1;
            jp_text_put(out, b.b.p + i, m, b.at, i);
            i += m;
            continue;
        }
        if (!ls) jp_text_put(out, b.b.p + i, j - i, b.at, i);
        size_t k = j + tl, e = k;
        while (e < b.b.len && jp_space(b.b.p[e])) e++;
        if (!rs) jp_text_put(out, b.b.p + k, e - k, b.at, k);
        i = e;
    }
    jp_text_free(&b);
}

/* ---- lexer --------------------------------------------------------------------------- */

typedef enum {
    JT_TEXT = 0, JT_NUM, JT_STR, JT_IDENT, JT_EQUALS, JT_LPAREN, JT_RPAREN, JT_OPEN_STMT, JT_CLOSE_STMT,
    JT_OPEN_EXPR, JT_CLOSE_EXPR, JT_LBRACKET, JT_RBRACKET, JT_LBRACE, JT_RBRACE, JT_COMMA, JT_DOT, JT_COLON,
    JT_PIPE, JT_ADD, JT_MUL, JT_POW, JT_CMP, JT_UNARY, JT_COMMENT,
} jtok_kind;

typedef struct {
    jtok_kind kind;
    const char *s;      /* value (arena, NUL-terminated) */
    size_t sn;
    size_t pos;         /* offset in the preprocessed source */
} jtok;

typedef struct {
    jarena *arena;
    const char *src;    /* preprocessed */
    size_t n;
    const size_t *at;   /* (n) each byte's offset in the original source */
    const char *orig;   /* the original source (line numbers) */
    jtok *t;            /* n_t tokens */
    size_t n_t, cap_t;
    size_t cur;         /* parser position */
    int depth;
    size_t n_special;   /* identifiers varargs/kwargs seen so far */
    size_t line_pos;    /* jp_line's cache: a position and its line */
    int line_at;
    char *err;
    size_t errsz;
    bool failed;
} jp;

/* The original line of preprocessed position pos; positions mostly grow, so counting goes on
 * from the last one asked. */
static int jp_line(jp *p, size_t pos)
{
    pos = pos < p->n ? p->at[pos] : p->n ? p->at[p->n - 1] + 1 : 0;
    if (pos < p->line_pos) {
        p->line_pos = 0;
        p->line_at = 1;
    }
    for (size_t i = p->line_pos; i < pos; i++) p->line_at += p->orig[i] == '\n';
    p->line_pos = pos;
    return p->line_at;
}

static void jp_fail(jp *p, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void jp_fail(jp *p, size_t pos, const char *fmt, ...)
{
    if (p->failed) return;
    p->failed = true;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errsz, "template syntax error at line %d: %s", jp_line(p, pos), msg);
}

static char *jp_strdup(jp *p, const char *s, size_t n)
{
    char *d = jarena_alloc(p->arena, n + 1);
    if (!d) util_oom(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static void jp_push(jp *p, jtok_kind k, const char *s, size_t sn, size_t pos)
{
    if (p->n_t == p->cap_t) {
        p->cap_t = p->cap_t ? p->cap_t * 2 : 256;
        p->t = xrealloc(p->t, p->cap_t * sizeof *p->t);
    }
    p->t[p->n_t++] = (jtok){ k, s ? s : "", sn, pos };
}

static bool jp_word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
static bool jp_digit(char c) { return c >= '0' && c <= '9'; }

/* A string literal's body from src[*i] up to the quote q (escapes decoded) into out. */
static bool jp_string_body(jp *p, size_t *i, char q, bytebuf *out)
{
    const char *s = p->src;
    size_t n = p->n;
    uint32_t hi = 0; /* a pending high surrogate from \u */
    while (*i < n && s[*i] != q) {
        if (s[*i] == '\\') {
            size_t at = *i;
            if (++*i >= n) { jp_fail(p, at, "unexpected end of input"); return false; }
            char e = s[(*i)++];
            if (e == 'x' || e == 'u') {
                int len = e == 'x' ? 2 : 4;
                uint32_t v = 0;
                for (int k = 0; k < len; k++) {
                    int h = *i + (size_t)k < n ? util_hexval(s[*i + (size_t)k]) : -1;
                    if (h < 0) { jp_fail(p, at, "invalid hexadecimal escape sequence"); return false; }
                    v = v * 16 + (uint32_t)h;
                }
                *i += (size_t)len;
                if (v >= 0xD800 && v <= 0xDBFF) { hi = v; continue; }
                if (v >= 0xDC00 && v <= 0xDFFF && hi) v = 0x10000 + ((hi - 0xD800) << 10) + (v - 0xDC00);
                else if (v >= 0xD800 && v <= 0xDFFF) v = UNICODE_REPLACEMENT;
                hi = 0;
                char u[4];
                bytebuf_append(out, u, (size_t)unicode_encode(v, u));
                continue;
            }
            const char *map = NULL;
            switch (e) {
            case 'n': map = "\n"; break;
            case 't': map = "\t"; break;
            case 'r': map = "\r"; break;
            case 'b': map = "\b"; break;
            case 'f': map = "\f"; break;
            case 'v': map = "\v"; break;
            case '\'': map = "'"; break;
            case '"': map = "\""; break;
            case '\\': map = "\\"; break;
            default: break;
            }
            if (!map) { jp_fail(p, at, "unexpected escaped character: %c", e); return false; }
            bytebuf_puts(out, map);
            continue;
        }
        bytebuf_putc(out, s[(*i)++]);
        if (*i >= n) { jp_fail(p, *i, "unexpected end of input"); return false; }
    }
    if (*i >= n) { jp_fail(p, *i, "unexpected end of input"); return false; }
    return true;
}

static const struct { const char *seq; jtok_kind kind; } jp_table[] = {
    { "{%", JT_OPEN_STMT }, { "%}", JT_CLOSE_STMT }, { "{{", JT_OPEN_EXPR }, { "}}", JT_CLOSE_EXPR },
    { "(", JT_LPAREN }, { ")", JT_RPAREN }, { "{", JT_LBRACE }, { "}", JT_RBRACE }, { "[", JT_LBRACKET },
    { "]", JT_RBRACKET }, { ",", JT_COMMA }, { ".", JT_DOT }, { ":", JT_COLON }, { "|", JT_PIPE },
    { "<=", JT_CMP }, { ">=", JT_CMP }, { "==", JT_CMP }, { "!=", JT_CMP }, { "<", JT_CMP }, { ">", JT_CMP },
    { "+", JT_ADD }, { "-", JT_ADD }, { "~", JT_ADD }, { "**", JT_POW }, { "*", JT_MUL }, { "//", JT_MUL },
    { "/", JT_MUL }, { "%", JT_MUL }, { "=", JT_EQUALS },
};

static void jp_strip_trailing(jp *p)
{
    if (!p->n_t || p->t[p->n_t - 1].kind != JT_TEXT) return;
    jtok *t = &p->t[p->n_t - 1];
    while (t->sn && jp_space(t->s[t->sn - 1])) t->sn--;
    if (!t->sn) p->n_t--;
}

static void jp_lex(jp *p)
{
    const char *s = p->src;
    size_t n = p->n, i = 0;
    int curly = 0;
    bytebuf sb = { 0 };
    while (i < n && !p->failed) {
        jtok_kind last = p->n_t ? p->t[p->n_t - 1].kind : JT_TEXT;
        bool at_start = p->n_t == 0;
        if (at_start || last == JT_CLOSE_STMT || last == JT_CLOSE_EXPR || last == JT_COMMENT) {
            size_t st = i;
            while (i < n && !(s[i] == '{' && i + 1 < n && (s[i + 1] == '%' || s[i + 1] == '{' || s[i + 1] == '#'))) i++;
            if (i > st) {
                jp_push(p, JT_TEXT, s + st, i - st, st);
                continue;
            }
        }
        if (s[i] == '{' && i + 1 < n && s[i + 1] == '#') {
            size_t st = i;
            i += 2;
            bool strip_before = i < n && s[i] == '-';
            if (strip_before) i++;
            size_t cst = i;
            while (!(i + 1 < n && s[i] == '#' && s[i + 1] == '}')) {
                if (i + 2 >= n) { jp_fail(p, st, "missing end of comment tag"); goto out; }
                i++;
            }
            bool strip_after = i > cst && s[i - 1] == '-';
            if (strip_before) jp_strip_trailing(p);
            jp_push(p, JT_COMMENT, NULL, 0, st);
            i += 2;
            if (strip_after)
                while (i < n && jp_space(s[i])) i++;
            continue;
        }
        if (i + 3 <= n && !memcmp(s + i, "{%-", 3)) {
            jp_strip_trailing(p);
            jp_push(p, JT_OPEN_STMT, "{%", 2, i);
            i += 3;
            continue;
        }
        if (i + 3 <= n && !memcmp(s + i, "{{-", 3)) {
            jp_strip_trailing(p);
            jp_push(p, JT_OPEN_EXPR, "{{", 2, i);
            curly = 0;
            i += 3;
            continue;
        }
        while (i < n && jp_space(s[i])) i++;
        if (i >= n) break;
        if (i + 3 <= n && !memcmp(s + i, "-%}", 3)) {
            jp_push(p, JT_CLOSE_STMT, "%}", 2, i);
            i += 3;
            while (i < n && jp_space(s[i])) i++;
            continue;
        }
        if (i + 3 <= n && !memcmp(s + i, "-}}", 3)) {
            jp_push(p, JT_CLOSE_EXPR, "}}", 2, i);
            i += 3;
            while (i < n && jp_space(s[i])) i++;
            continue;
        }
        char c = s[i];
        if (c == '-' || c == '+') {
            jtok_kind lk = p->n_t ? p->t[p->n_t - 1].kind : JT_TEXT;
            if (!p->n_t || lk == JT_TEXT) { jp_fail(p, i, "unexpected character: %c", c); goto out; }
            if (!(lk == JT_IDENT || lk == JT_NUM || lk == JT_STR || lk == JT_RPAREN || lk == JT_RBRACKET)) {
                size_t st = i++;
                while (i < n && jp_digit(s[i])) i++;
                bool num = i > st + 1;
                if (num && i + 1 < n && s[i] == '.' && jp_digit(s[i + 1])) {
                    i++;
                    while (i < n && jp_digit(s[i])) i++;
                }
                if (num && i >= n) { jp_fail(p, st, "unexpected end of input"); goto out; }
                jp_push(p, num ? JT_NUM : JT_UNARY, jp_strdup(p, s + st, i - st), i - st, st);
                continue;
            }
        }
        bool matched = false;
        for (size_t k = 0; k < TM_ARRAY_LEN(jp_table); k++) {
            if (jp_table[k].kind == JT_CLOSE_EXPR && curly > 0) continue;
            size_t l = strlen(jp_table[k].seq);
            if (i + l <= n && !memcmp(s + i, jp_table[k].seq, l)) {
                jp_push(p, jp_table[k].kind, jp_table[k].seq, l, i);
                if (jp_table[k].kind == JT_OPEN_EXPR) curly = 0;
                else if (jp_table[k].kind == JT_LBRACE) curly++;
                else if (jp_table[k].kind == JT_RBRACE) curly--;
                i += l;
                matched = true;
                break;
            }
        }
        if (matched) continue;
        if (c == '\'' || c == '"') {
            size_t st = i++;
            sb.len = 0;
            bytebuf_append(&sb, NULL, 0);
            if (!jp_string_body(p, &i, c, &sb)) goto out;
            i++;
            jp_push(p, JT_STR, jp_strdup(p, sb.p, sb.len), sb.len, st);
            continue;
        }
        if (jp_digit(c)) {
            size_t st = i;
            while (i < n && jp_digit(s[i])) i++;
            bool after_dot = p->n_t && p->t[p->n_t - 1].kind == JT_DOT;
            if (!after_dot && i + 1 < n && s[i] == '.' && jp_digit(s[i + 1])) {
                i++;
                while (i < n && jp_digit(s[i])) i++;
            }
            if (i >= n) { jp_fail(p, st, "unexpected end of input"); goto out; }
            jp_push(p, JT_NUM, jp_strdup(p, s + st, i - st), i - st, st);
            continue;
        }
        if (jp_word(c)) {
            size_t st = i;
            while (i < n && jp_word(s[i])) i++;
            if (i >= n) { jp_fail(p, st, "unexpected end of input"); goto out; }
            jp_push(p, JT_IDENT, jp_strdup(p, s + st, i - st), i - st, st);
            continue;
        }
        jp_fail(p, i, "unexpected character: %c", c);
    }
out:
    bytebuf_free(&sb);
}

/* ---- parser -------------------------------------------------------------------------- */

static jnode *jp_node(jp *p, jnode_kind k)
{
    jnode *x = jarena_alloc(p->arena, sizeof *x);
    if (!x) util_oom(sizeof *x); /* the program's arena has no cap */
    x->kind = k;
    size_t pos = p->cur < p->n_t ? p->t[p->cur].pos : p->n;
    x->line = jp_line(p, pos);
    return x;
}

/* A growable list of nodes, moved into the arena when done. */
typedef struct {
    jnode **v;
    size_t n, cap;
} jp_list;

static void jp_list_push(jp_list *l, jnode *x)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 8;
        l->v = xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = x;
}

static jnode **jp_list_done(jp *p, jp_list *l, size_t *n)
{
    *n = l->n;
    jnode **v = NULL;
    if (l->n) {
        v = jarena_alloc(p->arena, l->n * sizeof *v);
        if (!v) util_oom(l->n * sizeof *v);
        memcpy(v, l->v, l->n * sizeof *v);
    }
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
    return v;
}

static bool jp_is(const jp *p, jtok_kind k) { return p->cur < p->n_t && p->t[p->cur].kind == k; }

static bool jp_is_ident(const jp *p, size_t at, const char *name)
{
    return at < p->n_t && p->t[at].kind == JT_IDENT && !strcmp(p->t[at].s, name);
}

/* "{% name" with name one of the NULL-terminated list. */
static bool jp_is_stmt(const jp *p, const char *const *names)
{
    if (!jp_is(p, JT_OPEN_STMT) || p->cur + 1 >= p->n_t || p->t[p->cur + 1].kind != JT_IDENT) return false;
    for (; *names; names++)
        if (!strcmp(p->t[p->cur + 1].s, *names)) return true;
    return false;
}

static size_t jp_pos(const jp *p) { return p->cur < p->n_t ? p->t[p->cur].pos : p->n; }

static bool jp_expect(jp *p, jtok_kind k, const char *what)
{
    if (p->failed) return false;
    if (!jp_is(p, k)) {
        jp_fail(p, jp_pos(p), "expected %s", what);
        return false;
    }
    p->cur++;
    return true;
}

static bool jp_expect_ident(jp *p, const char *name)
{
    if (p->failed) return false;
    if (!jp_is_ident(p, p->cur, name)) {
        jp_fail(p, jp_pos(p), "expected %s", name);
        return false;
    }
    p->cur++;
    return true;
}

static bool jp_enter(jp *p)
{
    if (p->failed) return false;
    if (++p->depth > JINJA_MAX_DEPTH) {
        jp_fail(p, jp_pos(p), "nested deeper than %d levels", JINJA_MAX_DEPTH);
        return false;
    }
    return true;
}

static jnode *jp_expression(jp *p);
static jnode *jp_primary(jp *p);
static jnode *jp_any(jp *p);

/* Statements until one of names starts ("{% name"); the end of input is an error. */
static jnode **jp_block(jp *p, const char *const *names, size_t *n)
{
    jp_list l = { 0 };
    while (!p->failed && !jp_is_stmt(p, names)) {
        if (p->cur >= p->n_t) {
            jp_fail(p, p->n, "unexpected end of template, expected {%% %s %%}", names[0]);
            break;
        }
        jnode *x = jp_any(p);
        if (x) jp_list_push(&l, x);
    }
    return jp_list_done(p, &l, n);
}

static jnode *jp_sequence(jp *p, bool primary)
{
    jnode *first = primary ? jp_primary(p) : jp_expression(p);
    if (p->failed || !jp_is(p, JT_COMMA)) return first;
    jp_list l = { 0 };
    jp_list_push(&l, first);
    while (!p->failed && jp_is(p, JT_COMMA)) {
        p->cur++;
        jp_list_push(&l, primary ? jp_primary(p) : jp_expression(p));
    }
    jnode *t = jp_node(p, JN_TUPLE);
    t->v = jp_list_done(p, &l, &t->n);
    return t;
}

/* Arguments in parentheses; parameters: a declaration (names and defaults). */
static jnode **jp_args(jp *p, bool parameters, size_t *n)
{
    jp_list l = { 0 };
    *n = 0;
    if (!jp_expect(p, JT_LPAREN, "( for the arguments")) return NULL;
    bool saw_kw = false, saw_spread = false;
    while (!p->failed && !jp_is(p, JT_RPAREN)) {
        if (p->cur >= p->n_t) { jp_fail(p, p->n, "unexpected end of template in an argument list"); break; }
        bool kwspread = jp_is(p, JT_POW);
        bool spread = jp_is(p, JT_MUL) && !strcmp(p->t[p->cur].s, "*");
        if (parameters && (kwspread || spread)) { jp_fail(p, jp_pos(p), "argument unpacking in a parameter list"); break; }
        if (kwspread) {
            p->cur++;
            jnode *x = jp_node(p, JN_KWSPREAD);
            x->a = jp_expression(p);
            jp_list_push(&l, x);
            if (jp_is(p, JT_COMMA)) p->cur++;
            if (!jp_is(p, JT_RPAREN)) jp_fail(p, jp_pos(p), "** must be applied to the final argument");
            break;
        }
        jnode *arg;
        if (spread) {
            if (saw_spread) { jp_fail(p, jp_pos(p), "only one * argument unpacking is allowed"); break; }
            saw_spread = true;
            p->cur++;
            arg = jp_node(p, JN_SPREAD);
            arg->a = jp_expression(p);
        } else {
            arg = jp_expression(p);
            if (p->failed) break;
            if (jp_is(p, JT_EQUALS)) {
                p->cur++;
                if (arg->kind != JN_IDENT) { jp_fail(p, jp_pos(p), "expected an identifier before ="); break; }
                jnode *kw = jp_node(p, JN_KWARG);
                kw->s = arg->s;
                kw->sn = arg->sn;
                kw->a = jp_expression(p);
                arg = kw;
            }
            if (parameters && arg->kind != JN_IDENT && arg->kind != JN_KWARG) {
                jp_fail(p, jp_pos(p), "expected an identifier for a parameter");
                break;
            }
            if (parameters)
                for (size_t k = 0; k < l.n; k++)
                    if (!strcmp(l.v[k]->s, arg->s)) { jp_fail(p, jp_pos(p), "duplicate parameter name: %s", arg->s); break; }
            if (arg->kind == JN_KWARG) saw_kw = true;
            else if (saw_kw) { jp_fail(p, jp_pos(p), "positional argument after keyword argument"); break; }
            else if (saw_spread) { jp_fail(p, jp_pos(p), "positional argument after * unpacking"); break; }
        }
        jp_list_push(&l, arg);
        if (jp_is(p, JT_COMMA)) p->cur++;
    }
    jp_expect(p, JT_RPAREN, ") after the arguments");
    return jp_list_done(p, &l, n);
}

static jnode *jp_member(jp *p, jnode *obj);

static jnode *jp_call(jp *p, jnode *callee)
{
    if (!jp_enter(p)) return callee;
    jnode *x = jp_node(p, JN_CALL);
    x->a = callee;
    x->v = jp_args(p, false, &x->n);
    x = jp_member(p, x);
    if (!p->failed && jp_is(p, JT_LPAREN)) x = jp_call(p, x);
    p->depth--;
    return x;
}

static jnode *jp_member(jp *p, jnode *obj)
{
    while (!p->failed && (jp_is(p, JT_DOT) || jp_is(p, JT_LBRACKET))) {
        bool computed = jp_is(p, JT_LBRACKET);
        p->cur++;
        jnode *prop;
        if (computed) {
            /* an index or a slice */
            jnode *parts[3] = { 0 };
            int np = 0;
            bool slice = false;
            while (!p->failed && !jp_is(p, JT_RBRACKET)) {
                if (p->cur >= p->n_t || np >= 3) { jp_fail(p, jp_pos(p), "bad subscript"); break; }
                if (jp_is(p, JT_COLON)) {
                    parts[np++] = NULL;
                    p->cur++;
                    slice = true;
                } else {
                    parts[np++] = jp_expression(p);
                    if (jp_is(p, JT_COLON)) {
                        p->cur++;
                        slice = true;
                    }
                }
            }
            if (p->failed) return obj;
            if (np == 0) { jp_fail(p, jp_pos(p), "empty subscript"); return obj; }
            if (slice) {
                prop = jp_node(p, JN_SLICE);
                prop->a = parts[0];
                prop->b = np > 1 ? parts[1] : NULL;
                prop->c = np > 2 ? parts[2] : NULL;
            } else {
                prop = parts[0];
            }
            if (!jp_expect(p, JT_RBRACKET, "]")) return obj;
        } else {
            prop = jp_primary(p);
            if (p->failed) return obj;
            if (prop->kind != JN_IDENT && prop->kind != JN_INT) {
                jp_fail(p, jp_pos(p), "expected a name or an integer after .");
                return obj;
            }
        }
        jnode *m = jp_node(p, JN_MEMBER);
        m->a = obj;
        m->b = prop;
        m->flag = computed;
        obj = m;
    }
    return obj;
}

static jnode *jp_call_member(jp *p)
{
    jnode *m = jp_member(p, jp_primary(p));
    if (!p->failed && jp_is(p, JT_LPAREN)) return jp_call(p, m);
    return m;
}

static jnode *jp_unary_sign(jp *p)
{
    if (p->cur < p->n_t && (p->t[p->cur].kind == JT_UNARY || p->t[p->cur].kind == JT_ADD) &&
        (!strcmp(p->t[p->cur].s, "-") || !strcmp(p->t[p->cur].s, "+"))) {
        if (!jp_enter(p)) return NULL;
        jnode *x = jp_node(p, JN_UNARY);
        x->op = p->t[p->cur].s[0] == '-' ? JOP_NEG : JOP_POS;
        p->cur++;
        x->a = jp_unary_sign(p);
        p->depth--;
        return x;
    }
    return jp_call_member(p);
}

static jnode *jp_filter_expr(jp *p)
{
    jnode *operand = jp_unary_sign(p);
    while (!p->failed && jp_is(p, JT_PIPE)) {
        p->cur++;
        jnode *f = jp_primary(p);
        if (p->failed) break;
        if (f->kind != JN_IDENT) { jp_fail(p, jp_pos(p), "expected a filter name"); break; }
        if (jp_is(p, JT_LPAREN)) f = jp_call(p, f);
        jnode *x = jp_node(p, JN_FILTER);
        x->a = operand;
        x->b = f;
        operand = x;
    }
    return operand;
}

static jnode *jp_test_expr(jp *p)
{
    jnode *operand = jp_filter_expr(p);
    while (!p->failed && jp_is_ident(p, p->cur, "is")) {
        p->cur++;
        bool neg = jp_is_ident(p, p->cur, "not");
        if (neg) p->cur++;
        jnode *t = jp_primary(p);
        if (p->failed) break;
        if (t->kind != JN_IDENT) { jp_fail(p, jp_pos(p), "expected a test name"); break; }
        jnode *x = jp_node(p, JN_TEST);
        x->a = operand;
        x->s = t->s;
        x->sn = t->sn;
        x->flag = neg;
        operand = x;
    }
    return operand;
}

static jnode *jp_binary(jp *p, jop op, jnode *a, jnode *b)
{
    jnode *x = jp_node(p, JN_BINARY);
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static jnode *jp_power(jp *p)
{
    jnode *l = jp_test_expr(p);
    while (!p->failed && jp_is(p, JT_POW)) {
        p->cur++;
        l = jp_binary(p, JOP_POW, l, jp_test_expr(p));
    }
    return l;
}

static jnode *jp_mul(jp *p)
{
    jnode *l = jp_power(p);
    while (!p->failed && jp_is(p, JT_MUL)) {
        const char *o = p->t[p->cur++].s;
        jop op = !strcmp(o, "*") ? JOP_MUL : !strcmp(o, "/") ? JOP_DIV : !strcmp(o, "//") ? JOP_FLOORDIV : JOP_MOD;
        l = jp_binary(p, op, l, jp_power(p));
    }
    return l;
}

static jnode *jp_add(jp *p)
{
    jnode *l = jp_mul(p);
    while (!p->failed && jp_is(p, JT_ADD)) {
        const char *o = p->t[p->cur++].s;
        jop op = o[0] == '+' ? JOP_ADD : o[0] == '-' ? JOP_SUB : JOP_CONCAT;
        l = jp_binary(p, op, l, jp_mul(p));
    }
    return l;
}

static jnode *jp_compare(jp *p)
{
    jnode *l = jp_add(p);
    for (;;) {
        if (p->failed) break;
        jop op;
        if (jp_is_ident(p, p->cur, "not") && jp_is_ident(p, p->cur + 1, "in")) {
            op = JOP_NOTIN;
            p->cur += 2;
        } else if (jp_is_ident(p, p->cur, "in")) {
            op = JOP_IN;
            p->cur++;
        } else if (jp_is(p, JT_CMP)) {
            const char *o = p->t[p->cur++].s;
            op = !strcmp(o, "==") ? JOP_EQ : !strcmp(o, "!=") ? JOP_NE : !strcmp(o, "<") ? JOP_LT : !strcmp(o, ">") ? JOP_GT
               : !strcmp(o, "<=") ? JOP_LE : JOP_GE;
        } else {
            break;
        }
        l = jp_binary(p, op, l, jp_add(p));
    }
    return l;
}

static jnode *jp_not(jp *p)
{
    if (jp_is_ident(p, p->cur, "not")) {
        if (!jp_enter(p)) return NULL;
        p->cur++;
        jnode *x = jp_node(p, JN_UNARY);
        x->op = JOP_NOT;
        x->a = jp_not(p);
        p->depth--;
        return x;
    }
    return jp_compare(p);
}

static jnode *jp_and(jp *p)
{
    jnode *l = jp_not(p);
    while (!p->failed && jp_is_ident(p, p->cur, "and")) {
        p->cur++;
        l = jp_binary(p, JOP_AND, l, jp_not(p));
    }
    return l;
}

static jnode *jp_or(jp *p)
{
    jnode *l = jp_and(p);
    while (!p->failed && jp_is_ident(p, p->cur, "or")) {
        p->cur++;
        l = jp_binary(p, JOP_OR, l, jp_and(p));
    }
    return l;
}

static jnode *jp_if_expr(jp *p)
{
    jnode *a = jp_or(p);
    if (!p->failed && jp_is_ident(p, p->cur, "if")) {
        p->cur++;
        jnode *test = jp_or(p);
        if (!p->failed && jp_is_ident(p, p->cur, "else")) {
            p->cur++;
            if (!jp_enter(p)) return a;
            jnode *x = jp_node(p, JN_TERNARY);
            x->a = test;
            x->b = a;
            x->c = jp_if_expr(p);
            p->depth--;
            return x;
        }
        jnode *x = jp_node(p, JN_SELECT);
        x->a = a;
        x->b = test;
        return x;
    }
    return a;
}

static jnode *jp_expression(jp *p)
{
    if (!jp_enter(p)) return NULL;
    if (p->cur >= p->n_t) {
        jp_fail(p, p->n, "unexpected end of template in an expression");
        p->depth--;
        return NULL;
    }
    jnode *x = jp_if_expr(p);
    p->depth--;
    return x;
}

static jnode *jp_primary(jp *p)
{
    if (!jp_enter(p)) return NULL;
    if (p->cur >= p->n_t) {
        jp_fail(p, p->n, "unexpected end of template");
        p->depth--;
        return NULL;
    }
    jtok *t = &p->t[p->cur++];
    jnode *x = NULL;
    switch (t->kind) {
    case JT_NUM:
        if (strchr(t->s, '.')) {
            x = jp_node(p, JN_FLOAT);
            x->f = strtod(t->s, NULL);
        } else {
            x = jp_node(p, JN_INT);
            double d = strtod(t->s, NULL);
            if (d > 9.0e15 || d < -9.0e15) {
                x->kind = JN_FLOAT;
                x->f = d;
            } else {
                x->i = (int64_t)d;
            }
        }
        break;
    case JT_STR: {
        if (!jp_is(p, JT_STR)) {
            x = jp_node(p, JN_STR);
            x->s = t->s;
            x->sn = t->sn;
            break;
        }
        bytebuf b = { 0 };
        bytebuf_append(&b, t->s, t->sn);
        while (jp_is(p, JT_STR)) {
            bytebuf_append(&b, p->t[p->cur].s, p->t[p->cur].sn);
            p->cur++;
        }
        x = jp_node(p, JN_STR);
        x->s = jp_strdup(p, b.p, b.len);
        x->sn = b.len;
        bytebuf_free(&b);
        break;
    }
    case JT_IDENT:
        x = jp_node(p, JN_IDENT);
        x->s = t->s;
        x->sn = t->sn;
        if (!strcmp(x->s, "varargs") || !strcmp(x->s, "kwargs")) p->n_special++;
        break;
    case JT_LPAREN:
        x = jp_sequence(p, false);
        jp_expect(p, JT_RPAREN, ")");
        break;
    case JT_LBRACKET: {
        jp_list l = { 0 };
        while (!p->failed && !jp_is(p, JT_RBRACKET)) {
            if (p->cur >= p->n_t) { jp_fail(p, p->n, "unexpected end of template in a list"); break; }
            jp_list_push(&l, jp_expression(p));
            if (jp_is(p, JT_COMMA)) p->cur++;
        }
        p->cur++;
        x = jp_node(p, JN_ARRAY);
        x->v = jp_list_done(p, &l, &x->n);
        break;
    }
    case JT_LBRACE: {
        jp_list l = { 0 };
        while (!p->failed && !jp_is(p, JT_RBRACE)) {
            if (p->cur >= p->n_t) { jp_fail(p, p->n, "unexpected end of template in a dict"); break; }
            jp_list_push(&l, jp_expression(p));
            if (!jp_expect(p, JT_COLON, ": between a key and its value")) break;
            jp_list_push(&l, jp_expression(p));
            if (jp_is(p, JT_COMMA)) p->cur++;
        }
        p->cur++;
        x = jp_node(p, JN_OBJECT);
        x->v = jp_list_done(p, &l, &x->n);
        break;
    }
    default:
        jp_fail(p, t->pos, "unexpected token '%.*s'", (int)TM_MIN(t->sn, (size_t)40), t->s);
        break;
    }
    p->depth--;
    return x;
}

static const char *const jp_end_if[] = { "elif", "else", "endif", NULL };
static const char *const jp_endif[] = { "endif", NULL };
static const char *const jp_end_for[] = { "endfor", "else", NULL };
static const char *const jp_endfor[] = { "endfor", NULL };
static const char *const jp_endset[] = { "endset", NULL };
static const char *const jp_endmacro[] = { "endmacro", NULL };
static const char *const jp_endcall[] = { "endcall", NULL };
static const char *const jp_endfilter[] = { "endfilter", NULL };

/* After "{% if" / "{% elif": the test, the body and the else branch. */
static jnode *jp_if_stmt(jp *p)
{
    if (!jp_enter(p)) return NULL;
    jnode *x = jp_node(p, JN_IF);
    x->a = jp_expression(p);
    jp_expect(p, JT_CLOSE_STMT, "%} after the if test");
    x->v = jp_block(p, jp_end_if, &x->n);
    if (!p->failed && jp_is_stmt(p, (const char *const[]){ "elif", NULL })) {
        p->cur += 2;
        jnode *e = jp_if_stmt(p);
        x->w = jarena_alloc(p->arena, sizeof *x->w);
        x->w[0] = e;
        x->nw = 1;
    } else if (!p->failed && jp_is_stmt(p, (const char *const[]){ "else", NULL })) {
        p->cur += 2;
        jp_expect(p, JT_CLOSE_STMT, "%} after else");
        x->w = jp_block(p, jp_endif, &x->nw);
    }
    p->depth--;
    return x;
}

static jnode *jp_statement(jp *p)
{
    size_t at = jp_pos(p);
    jp_expect(p, JT_OPEN_STMT, "{%");
    if (p->failed) return NULL;
    if (!jp_is(p, JT_IDENT)) { jp_fail(p, at, "expected a statement name after {%%"); return NULL; }
    const char *name = p->t[p->cur].s;
    jnode *x = NULL;
    p->cur++;
    if (!strcmp(name, "set")) {
        x = jp_node(p, JN_SET);
        x->a = jp_sequence(p, false);
        if (!p->failed && jp_is(p, JT_EQUALS)) {
            p->cur++;
            x->b = jp_sequence(p, false);
        } else {
            jp_expect(p, JT_CLOSE_STMT, "%} or = after set");
            x->v = jp_block(p, jp_endset, &x->n);
            jp_expect(p, JT_OPEN_STMT, "{%");
            jp_expect_ident(p, "endset");
        }
        jp_expect(p, JT_CLOSE_STMT, "%}");
    } else if (!strcmp(name, "if")) {
        x = jp_if_stmt(p);
        jp_expect(p, JT_OPEN_STMT, "{%");
        jp_expect_ident(p, "endif");
        jp_expect(p, JT_CLOSE_STMT, "%}");
    } else if (!strcmp(name, "macro")) {
        x = jp_node(p, JN_MACRO);
        jnode *nm = jp_primary(p);
        if (p->failed) return NULL;
        if (nm->kind != JN_IDENT) { jp_fail(p, at, "expected a name after macro"); return NULL; }
        x->s = nm->s;
        x->sn = nm->sn;
        x->w = jp_args(p, true, &x->nw);
        jp_expect(p, JT_CLOSE_STMT, "%}");
        size_t sp = p->n_special;
        x->v = jp_block(p, jp_endmacro, &x->n);
        x->flag = p->n_special != sp;  /* the body reads varargs or kwargs */
        jp_expect(p, JT_OPEN_STMT, "{%");
        jp_expect_ident(p, "endmacro");
        jp_expect(p, JT_CLOSE_STMT, "%}");
    } else if (!strcmp(name, "for")) {
        x = jp_node(p, JN_FOR);
        x->a = jp_sequence(p, true);
        if (p->failed) return NULL;
        if (x->a->kind != JN_IDENT && x->a->kind != JN_TUPLE) { jp_fail(p, at, "expected a name or names after for"); return NULL; }
        if (!jp_is_ident(p, p->cur, "in")) { jp_fail(p, jp_pos(p), "expected in after the loop variable"); return NULL; }
        p->cur++;
        x->b = jp_expression(p);
        jp_expect(p, JT_CLOSE_STMT, "%}");
        x->v = jp_block(p, jp_end_for, &x->n);
        if (!p->failed && jp_is_stmt(p, (const char *const[]){ "else", NULL })) {
            p->cur += 2;
            jp_expect(p, JT_CLOSE_STMT, "%}");
            x->w = jp_block(p, jp_endfor, &x->nw);
        }
        jp_expect(p, JT_OPEN_STMT, "{%");
        jp_expect_ident(p, "endfor");
        jp_expect(p, JT_CLOSE_STMT, "%}");
    } else if (!strcmp(name, "call")) {
        x = jp_node(p, JN_CALLSTMT);
        if (jp_is(p, JT_LPAREN)) x->w = jp_args(p, true, &x->nw);
        jnode *callee = jp_primary(p);
        if (p->failed) return NULL;
        if (callee->kind != JN_IDENT) { jp_fail(p, at, "expected a macro name after call"); return NULL; }
        jnode *c = jp_node(p, JN_CALL);
        c->a = callee;
        c->v = jp_args(p, false, &c->n);
        x->a = c;
        jp_expect(p, JT_CLOSE_STMT, "%}");
        size_t sp = p->n_special;
        x->v = jp_block(p, jp_endcall, &x->n);
        x->flag = p->n_special != sp;
        jp_expect(p, JT_OPEN_STMT, "{%");
        jp_expect_ident(p, "endcall");
        jp_expect(p, JT_CLOSE_STMT, "%}");
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        x = jp_node(p, name[0] == 'b' ? JN_BREAK : JN_CONTINUE);
        jp_expect(p, JT_CLOSE_STMT, "%}");
    } else if (!strcmp(name, "filter")) {
        x = jp_node(p, JN_FILTERSTMT);
        jnode *f = jp_primary(p);
        if (p->failed) return NULL;
        if (f->kind == JN_IDENT && jp_is(p, JT_LPAREN)) f = jp_call(p, f);
        if (f->kind != JN_IDENT && !(f->kind == JN_CALL && f->a->kind == JN_IDENT)) { jp_fail(p, at, "expected a filter"); return NULL; }
        x->b = f;
        jp_expect(p, JT_CLOSE_STMT, "%}");
        x->v = jp_block(p, jp_endfilter, &x->n);
        jp_expect(p, JT_OPEN_STMT, "{%");
        jp_expect_ident(p, "endfilter");
        jp_expect(p, JT_CLOSE_STMT, "%}");
    } else {
        jp_fail(p, at, "unknown statement '%s'", name);
    }
    return x;
}

static jnode *jp_any(jp *p)
{
    if (!jp_enter(p)) return NULL;
    jtok *t = &p->t[p->cur];
    jnode *x = NULL;
    switch (t->kind) {
    case JT_COMMENT:
        p->cur++;
        x = jp_node(p, JN_COMMENT);
        break;
    case JT_TEXT:
        x = jp_node(p, JN_TEXT);
        x->s = jp_strdup(p, t->s, t->sn);
        x->sn = t->sn;
        p->cur++;
        break;
    case JT_OPEN_STMT:
        x = jp_statement(p);
        break;
    case JT_OPEN_EXPR:
        p->cur++;
        x = jp_expression(p);
        jp_expect(p, JT_CLOSE_EXPR, "}} after the expression");
        break;
    default:
        jp_fail(p, t->pos, "unexpected '%.*s'", (int)TM_MIN(t->sn, (size_t)40), t->s);
        break;
    }
    p->depth--;
    return x;
}

jinja_status jinja_parse(const char *src, size_t n, jinja_program **out, char *err, size_t errsz)
{
    *out = NULL;
    jinja_program *prog = xcalloc(1, sizeof *prog);
    jp_text pre = { 0 };
    jp_preprocess(src, n, &pre);
    jp p = { .arena = &prog->arena, .src = pre.b.p, .n = pre.b.len, .at = pre.at, .orig = src, .line_at = 1, .err = err,
             .errsz = errsz };
    jp_lex(&p);
    jp_list body = { 0 };
    while (!p.failed && p.cur < p.n_t) {
        jnode *x = jp_any(&p);
        if (x) jp_list_push(&body, x);
    }
    prog->body = jp_list_done(&p, &body, &prog->n_body);
    free(p.t);
    jp_text_free(&pre);
    if (p.failed) {
        jinja_program_free(prog);
        return JINJA_ERR_SYNTAX;
    }
    *out = prog;
    return JINJA_OK;
}

void jinja_program_free(jinja_program *p)
{
    if (!p) return;
    jarena_free(&p->arena);
    free(p);
}
