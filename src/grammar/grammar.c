/*
 * grammar: the GBNF parser, the compiled byte-level form, the pushdown automaton over bytes
 * and the compile cache. See grammar.h and grammar_int.h.
 *
 * Parsing follows llama.cpp's grammar-parser (same syntax, same expansion of repetitions into
 * helper rules: X* becomes `r ::= X r |`, a tail call, so a long repetition does not deepen
 * the stacks), with one difference: character classes and `.` are code point sets, which are
 * turned into UTF-8 byte-range sequences here (the classic split of a code point range into
 * ranges whose encodings differ only in their last bytes), so the automaton never decodes.
 * Left recursion is refused at compile time (the expansion of a stack would not terminate).
 */
#include "grammar/grammar_int.h"

#include <ctype.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

const char *grammar_status_name(grammar_status st)
{
    switch (st) {
    case GRAMMAR_OK: return "ok";
    case GRAMMAR_ERR_SYNTAX: return "syntax error";
    case GRAMMAR_ERR_UNSUPPORTED: return "unsupported";
    case GRAMMAR_ERR_INVALID: return "invalid grammar";
    }
    return "?";
}

void grammar_printf(bytebuf *t, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        bytebuf_append(t, small, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    bytebuf_append(t, big, (size_t)n);
    free(big);
}

static void grammar_expand_into(const grammar *g, grammar_scratch *sc, grammar_set *out,
                                const uint32_t *stk, int n);

/* ---- parser -------------------------------------------------------------------------- */

typedef struct {
    grammar_el *el;
    int n, cap;
} gp_seq;

typedef struct {
    char *name;
    gp_seq body;            /* alternatives separated by ALT, closed by END */
    bool defined;
    const char *ref_at;     /* where first referenced (undefined-rule messages) */
} gp_rule;

typedef struct {
    const char *src, *end;
    gp_rule *rules;
    int n_rules, cap_rules;
    uint32_t (*sets)[8];
    int n_sets, cap_sets;
    uint32_t single[256];   /* set id + 1 of the one-byte set {b}, 0 before it exists */
    uint32_t *names;        /* (cap_names) open addressing over user rule names: id + 1 */
    int cap_names;
    int32_t max_token;      /* largest token terminal id, -1: none */
    char *err;
    size_t errsz;
    bool failed;
} gp;

static void gp_push(gp_seq *s, uint32_t type, uint32_t v)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->el = xrealloc(s->el, (size_t)s->cap * sizeof *s->el);
    }
    s->el[s->n++] = (grammar_el){ type, v };
}

static void gp_fail(gp *p, const char *at, const char *fmt, ...)
{
    if (p->failed) return;
    p->failed = true;
    int line = 1;
    for (const char *q = p->src; at && q < at && q < p->end; q++) line += *q == '\n';
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) snprintf(p->err, p->errsz, "line %d: %s", line, msg);
    else snprintf(p->err, p->errsz, "%s", msg);
}

static uint64_t gp_name_hash(const char *name, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)name[i]) * 1099511628211ull;
    return h;
}

/* Appends a rule named name[0..len). */
static int gp_add_rule(gp *p, const char *name, size_t len)
{
    if (p->n_rules == p->cap_rules) {
        p->cap_rules = p->cap_rules ? 2 * p->cap_rules : 32;
        p->rules = xrealloc(p->rules, (size_t)p->cap_rules * sizeof *p->rules);
    }
    gp_rule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = xmalloc(len + 1);
    memcpy(r->name, name, len);
    r->name[len] = 0;
    return p->n_rules++;
}

/* The rule a name in the text refers to, created on first use (hash table: grammars with
 * many rules parse in linear time). */
static int gp_rule_id(gp *p, const char *name, size_t len)
{
    if (2 * (p->n_rules + 1) > p->cap_names) {
        int cap = p->cap_names ? 2 * p->cap_names : 64;
        uint32_t *t = xcalloc((size_t)cap, sizeof *t);
        for (int i = 0; i < p->cap_names; i++) {
            if (!p->names[i]) continue;
            const char *z = p->rules[p->names[i] - 1].name;
            int j = (int)(gp_name_hash(z, strlen(z)) & (uint64_t)(cap - 1));
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = p->names[i];
        }
        free(p->names);
        p->names = t;
        p->cap_names = cap;
    }
    int j = (int)(gp_name_hash(name, len) & (uint64_t)(p->cap_names - 1));
    while (p->names[j]) {
        const char *z = p->rules[p->names[j] - 1].name;
        if (strlen(z) == len && !memcmp(z, name, len)) return (int)p->names[j] - 1;
        j = (j + 1) & (p->cap_names - 1);
    }
    int id = gp_add_rule(p, name, len);
    p->names[j] = (uint32_t)id + 1;
    return id;
}

/* A fresh helper rule named after its parent (parent#N: '#' cannot appear in a user's rule
 * name, so helpers never collide with them and need no lookup). */
static int gp_new_rule(gp *p, int parent)
{
    char buf[160];
    snprintf(buf, sizeof buf, "%.120s#%d", p->rules[parent].name, p->n_rules);
    return gp_add_rule(p, buf, strlen(buf));
}

static void gp_define(gp *p, int id, gp_seq *body)
{
    gp_rule *r = &p->rules[id];
    free(r->body.el);
    r->body = *body;
    r->defined = true;
    memset(body, 0, sizeof *body);
}

static uint32_t gp_set_id(gp *p, const uint32_t set[8])
{
    for (int i = 0; i < p->n_sets; i++)
        if (!memcmp(p->sets[i], set, 32)) return (uint32_t)i;
    if (p->n_sets == p->cap_sets) {
        p->cap_sets = p->cap_sets ? 2 * p->cap_sets : 64;
        p->sets = xrealloc(p->sets, (size_t)p->cap_sets * sizeof *p->sets);
    }
    memcpy(p->sets[p->n_sets], set, 32);
    return (uint32_t)p->n_sets++;
}

static void gp_push_range(gp *p, gp_seq *s, unsigned lo, unsigned hi)
{
    if (lo == hi && p->single[lo]) {  /* literals: the common case, without a search */
        gp_push(s, GRAMMAR_EL_BYTES, p->single[lo] - 1);
        return;
    }
    uint32_t set[8] = { 0 };
    for (unsigned b = lo; b <= hi; b++) set[b >> 5] |= 1u << (b & 31);
    uint32_t id = gp_set_id(p, set);
    if (lo == hi) p->single[lo] = id + 1;
    gp_push(s, GRAMMAR_EL_BYTES, id);
}

static bool gp_is_word(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_';
}

static const char *gp_space(gp *p, const char *s, bool newline_ok)
{
    while (s < p->end) {
        if (*s == ' ' || *s == '\t' || *s == '\r' || (newline_ok && *s == '\n')) s++;
        else if (*s == '#') {
            while (s < p->end && *s != '\n') s++;
        } else break;
    }
    return s;
}

/* Decodes one UTF-8 character (invalid bytes decode as themselves). */
static const char *gp_utf8(const char *s, const char *end, uint32_t *cp)
{
    unsigned char c = (unsigned char)*s;
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (n <= 0 || s + n >= end) {
        *cp = c;
        return s + 1;
    }
    uint32_t v = c & (0x3F >> n);
    for (int i = 1; i <= n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            *cp = c;
            return s + 1;
        }
        v = v << 6 | ((unsigned char)s[i] & 0x3F);
    }
    *cp = v;
    return s + n + 1;
}

static int gp_hex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class: an escape or a UTF-8 character. */
static const char *gp_char(gp *p, const char *s, uint32_t *cp)
{
    if (s >= p->end) {
        gp_fail(p, s, "unexpected end of input");
        return s;
    }
    if (*s != '\\') return gp_utf8(s, p->end, cp);
    if (s + 1 >= p->end) {
        gp_fail(p, s, "unexpected end of input after '\\'");
        return s + 1;
    }
    char e = s[1];
    int nhex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (nhex) {
        uint32_t v = 0;
        for (int i = 0; i < nhex; i++) {
            int h = s + 2 + i < p->end ? gp_hex(s[2 + i]) : -1;
            if (h < 0) {
                gp_fail(p, s, "expecting %d hex digits after \\%c", nhex, e);
                return s + 2;
            }
            v = v << 4 | (uint32_t)h;
        }
        *cp = v;
        return s + 2 + nhex;
    }
    switch (e) {
    case 't': *cp = '\t'; break;
    case 'r': *cp = '\r'; break;
    case 'n': *cp = '\n'; break;
    case '\\': case '"': case '[': case ']': case '-': case '^': *cp = (uint32_t)e; break;
    default:
        gp_fail(p, s, "unknown escape \\%c", e);
        *cp = 0;
    }
    return s + 2;
}

static int gp_utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return out[0] = (uint8_t)(0xC0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Appends to alts (a rule body under construction) the byte-range sequences of the code
 * points lo..hi, all of one encoded length, as alternatives. */
static void gp_utf8_split(gp *p, gp_seq *alts, uint32_t lo, uint32_t hi, bool *first)
{
    static const uint32_t bounds[] = { 0x7F, 0x7FF, 0xFFFF };
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            gp_utf8_split(p, alts, lo, bounds[i], first);
            gp_utf8_split(p, alts, bounds[i] + 1, hi, first);
            return;
        }
    int n = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                gp_utf8_split(p, alts, lo, lo | m, first);
                gp_utf8_split(p, alts, (lo | m) + 1, hi, first);
                return;
            }
            if ((hi & m) != m) {
                gp_utf8_split(p, alts, lo, (hi & ~m) - 1, first);
                gp_utf8_split(p, alts, hi & ~m, hi, first);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    gp_utf8_encode(lo, a);
    gp_utf8_encode(hi, b);
    if (!*first) gp_push(alts, GRAMMAR_EL_ALT, 0);
    *first = false;
    for (int i = 0; i < n; i++) gp_push_range(p, alts, a[i], b[i]);
}

typedef struct {
    uint32_t lo, hi;
} gp_range;

static int gp_cmp_range(const void *a, const void *b)
{
    const gp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Emits a code point set (ranges, maybe negated) as one symbol: a byte set when it is all
 * ASCII, else a reference to a helper rule of UTF-8 sequences. */
static void gp_emit_class(gp *p, gp_seq *out, int rule, gp_range *r, int n, bool negated)
{
    if (n > 0) qsort(r, (size_t)n, sizeof *r, gp_cmp_range);
    /* merge, then complement if negated; surrogates are never characters */
    gp_range *m = xmalloc((size_t)(n + 2) * sizeof *m);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].lo > r[i].hi) continue;
        if (k && r[i].lo <= m[k - 1].hi + 1) m[k - 1].hi = TM_MAX(m[k - 1].hi, r[i].hi);
        else m[k++] = r[i];
    }
    if (negated) {
        gp_range *c = xmalloc((size_t)(k + 2) * sizeof *c);
        int kc = 0;
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (m[i].lo > next) c[kc++] = (gp_range){ next, m[i].lo - 1 };
            next = m[i].hi + 1;
        }
        if (next <= 0x10FFFF) c[kc++] = (gp_range){ next, 0x10FFFF };
        free(m);
        m = c;
        k = kc;
    }
    /* cut out surrogates */
    gp_range *q = xmalloc((size_t)(2 * k + 1) * sizeof *q);
    int kq = 0;
    for (int i = 0; i < k; i++) {
        uint32_t lo = m[i].lo, hi = TM_MIN(m[i].hi, 0x10FFFFu);
        if (lo > hi) continue;
        if (lo < 0xD800 && hi >= 0xD800) {
            q[kq++] = (gp_range){ lo, 0xD7FF };
            if (hi > 0xDFFF) q[kq++] = (gp_range){ 0xE000, hi };
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            if (hi > 0xDFFF) q[kq++] = (gp_range){ 0xE000, hi };
        } else q[kq++] = (gp_range){ lo, hi };
    }
    free(m);
    if (kq == 0) {
        free(q);
        gp_fail(p, NULL, "rule '%s': a character class matches nothing", p->rules[rule].name);
        return;
    }
    bool ascii = q[kq - 1].hi < 0x80;
    uint32_t set[8] = { 0 };
    for (int i = 0; i < kq && q[i].lo < 0x80; i++)
        for (uint32_t b = q[i].lo; b <= TM_MIN(q[i].hi, 0x7Fu); b++) set[b >> 5] |= 1u << (b & 31);
    if (ascii) {
        gp_push(out, GRAMMAR_EL_BYTES, gp_set_id(p, set));
        free(q);
        return;
    }
    int id = gp_new_rule(p, rule);
    gp_seq body = { 0 };
    bool first = true;
    bool any_ascii = q[0].lo < 0x80;
    if (any_ascii) {
        gp_push(&body, GRAMMAR_EL_BYTES, gp_set_id(p, set));
        first = false;
    }
    for (int i = 0; i < kq; i++) {
        uint32_t lo = TM_MAX(q[i].lo, 0x80u);
        if (q[i].hi < 0x80) continue;
        gp_utf8_split(p, &body, lo, q[i].hi, &first);
    }
    gp_push(&body, GRAMMAR_EL_END, 0);
    gp_define(p, id, &body);
    gp_push(out, GRAMMAR_EL_RULE, (uint32_t)id);
    free(q);
}

static const char *gp_alternates(gp *p, const char *s, int rule, bool nested);

/* Applies {min,max} (max < 0: unbounded) to the symbol out[start..n), as llama.cpp does. */
static void gp_repeat(gp *p, gp_seq *out, int start, int rule, int min, int max)
{
    int nprev = out->n - start;
    grammar_el *prev = xmalloc((size_t)(nprev ? nprev : 1) * sizeof *prev);
    memcpy(prev, out->el + start, (size_t)nprev * sizeof *prev);
    if (min == 0) out->n = start;
    else
        for (int i = 1; i < min; i++)
            for (int j = 0; j < nprev; j++) gp_push(out, prev[j].type, prev[j].v);
    int last = -1;
    int n_opt = max < 0 ? 1 : max - min;
    for (int i = 0; i < n_opt; i++) {
        int id = gp_new_rule(p, rule);
        gp_seq body = { 0 };
        for (int j = 0; j < nprev; j++) gp_push(&body, prev[j].type, prev[j].v);
        if (i > 0 || max < 0) gp_push(&body, GRAMMAR_EL_RULE, (uint32_t)(max < 0 ? id : last));
        gp_push(&body, GRAMMAR_EL_ALT, 0);
        gp_push(&body, GRAMMAR_EL_END, 0);
        gp_define(p, id, &body);
        last = id;
    }
    if (n_opt > 0) gp_push(out, GRAMMAR_EL_RULE, (uint32_t)last);
    free(prev);
}

static const char *gp_int(gp *p, const char *s, int *v)
{
    const char *b = s;
    long x = 0;
    while (s < p->end && isdigit((unsigned char)*s) && x < 100000) x = x * 10 + (*s++ - '0');
    if (s == b) gp_fail(p, s, "expecting a number");
    if (x >= 100000) gp_fail(p, s, "repetition count too large");
    *v = (int)x;
    return s;
}

static const char *gp_sequence(gp *p, const char *s, int rule, gp_seq *out, bool nested)
{
    int last_start = out->n;
    while (s < p->end && !p->failed) {
        int start = out->n;
        if (*s == '"') {
            s++;
            while (s < p->end && *s != '"' && !p->failed) {
                uint32_t cp;
                s = gp_char(p, s, &cp);
                uint8_t b[4];
                int nb = gp_utf8_encode(cp, b);
                for (int i = 0; i < nb; i++) gp_push_range(p, out, b[i], b[i]);
            }
            if (s >= p->end) {
                gp_fail(p, s, "unterminated literal");
                break;
            }
            s = gp_space(p, s + 1, nested);
            last_start = start;
        } else if (*s == '[' || *s == '.') {
            gp_range *r = NULL;
            int n = 0, cap = 0;
            bool neg = false;
            if (*s == '.') {
                s++;
                r = xmalloc(sizeof *r);
                r[n++] = (gp_range){ 0, 0x10FFFF };
            } else {
                s++;
                if (s < p->end && *s == '^') neg = true, s++;
                while (s < p->end && *s != ']' && !p->failed) {
                    uint32_t lo, hi;
                    s = gp_char(p, s, &lo);
                    hi = lo;
                    if (s + 1 < p->end && *s == '-' && s[1] != ']') s = gp_char(p, s + 1, &hi);
                    if (n == cap) r = xrealloc(r, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *r);
                    r[n++] = (gp_range){ lo, hi };
                }
                if (s >= p->end) {
                    gp_fail(p, s, "unterminated character class");
                    free(r);
                    break;
                }
                s++;
            }
            if (!p->failed) gp_emit_class(p, out, rule, r, n, neg);
            free(r);
            s = gp_space(p, s, nested);
            last_start = start;
        } else if (*s == '<') {
            /* a token terminal, llama.cpp's <[ID]>: that token id, never the same bytes */
            const char *b = s;
            if (s + 1 >= p->end || s[1] != '[') {
                gp_fail(p, s, "expecting '<[' and a token id (tokens by text are not supported)");
                break;
            }
            long id = 0;
            s += 2;
            const char *d = s;
            while (s < p->end && isdigit((unsigned char)*s) && id <= INT32_MAX) id = id * 10 + (*s++ - '0');
            if (s == d || id > INT32_MAX || s + 1 >= p->end || s[0] != ']' || s[1] != '>') {
                gp_fail(p, b, "a token terminal is '<[' token id ']>'");
                break;
            }
            gp_push(out, GRAMMAR_EL_TOKEN, (uint32_t)id);
            p->max_token = TM_MAX(p->max_token, (int32_t)id);
            s = gp_space(p, s + 2, nested);
            last_start = start;
        } else if (gp_is_word(*s)) {
            const char *b = s;
            while (s < p->end && gp_is_word(*s)) s++;
            int id = gp_rule_id(p, b, (size_t)(s - b));
            if (!p->rules[id].ref_at) p->rules[id].ref_at = b;
            gp_push(out, GRAMMAR_EL_RULE, (uint32_t)id);
            s = gp_space(p, s, nested);
            last_start = start;
        } else if (*s == '(') {
            int id = gp_new_rule(p, rule);
            s = gp_alternates(p, gp_space(p, s + 1, true), id, true);
            if (s >= p->end || *s != ')') {
                gp_fail(p, s, "expecting ')'");
                break;
            }
            gp_push(out, GRAMMAR_EL_RULE, (uint32_t)id);
            s = gp_space(p, s + 1, nested);
            last_start = start;
        } else if (*s == '*' || *s == '+' || *s == '?' || *s == '{') {
            if (last_start == out->n) {
                gp_fail(p, s, "expecting a symbol before '%c'", *s);
                break;
            }
            int min = 0, max = -1;
            if (*s == '+') min = 1;
            else if (*s == '?') max = 1;
            else if (*s == '{') {
                s = gp_space(p, s + 1, nested);
                s = gp_int(p, s, &min);
                s = gp_space(p, s, nested);
                if (s < p->end && *s == ',') {
                    s = gp_space(p, s + 1, nested);
                    if (s < p->end && isdigit((unsigned char)*s)) s = gp_int(p, s, &max);
                } else max = min;
                s = gp_space(p, s, nested);
                if (s >= p->end || *s != '}') {
                    gp_fail(p, s, "expecting '}'");
                    break;
                }
                if (max >= 0 && max < min) {
                    gp_fail(p, s, "repetition {%d,%d}: max below min", min, max);
                    break;
                }
            }
            gp_repeat(p, out, last_start, rule, min, max);
            s = gp_space(p, s + 1, nested);
        } else break;
    }
    return s;
}

static const char *gp_alternates(gp *p, const char *s, int rule, bool nested)
{
    gp_seq body = { 0 };
    s = gp_sequence(p, s, rule, &body, nested);
    while (!p->failed && s < p->end && *s == '|') {
        gp_push(&body, GRAMMAR_EL_ALT, 0);
        s = gp_sequence(p, gp_space(p, s + 1, true), rule, &body, nested);
    }
    gp_push(&body, GRAMMAR_EL_END, 0);
    if (p->rules[rule].defined && !nested) gp_fail(p, s, "rule '%s' defined twice", p->rules[rule].name);
    gp_define(p, rule, &body);
    free(body.el);
    return s;
}

static void gp_parse(gp *p)
{
    const char *s = gp_space(p, p->src, true);
    while (s < p->end && !p->failed) {
        const char *b = s;
        while (s < p->end && gp_is_word(*s)) s++;
        if (s == b) {
            gp_fail(p, s, "expecting a rule name");
            return;
        }
        int id = gp_rule_id(p, b, (size_t)(s - b));
        s = gp_space(p, s, false);
        if (s + 3 > p->end || memcmp(s, "::=", 3)) {
            gp_fail(p, s, "expecting '::=' after '%s'", p->rules[id].name);
            return;
        }
        if (p->rules[id].defined) {
            gp_fail(p, b, "rule '%s' defined twice", p->rules[id].name);
            return;
        }
        s = gp_alternates(p, gp_space(p, s + 3, true), id, false);
        if (p->failed) return;
        if (s < p->end && *s == '\r') s++;
        if (s < p->end && *s != '\n') {
            gp_fail(p, s, "unexpected '%c'", *s);
            return;
        }
        s = gp_space(p, s, true);
    }
}

/* ---- checks and flattening ----------------------------------------------------------- */

/* Whether each rule can match the empty string (fixpoint). */
static void gp_nullable(const gp *p, bool *nul)
{
    memset(nul, 0, (size_t)p->n_rules);
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < p->n_rules; r++) {
            if (nul[r]) continue;
            const gp_seq *b = &p->rules[r].body;
            bool alt_ok = true;
            for (int i = 0; i < b->n; i++) {
                const grammar_el *e = &b->el[i];
                if (e->type == GRAMMAR_EL_ALT || e->type == GRAMMAR_EL_END) {
                    if (alt_ok) {
                        nul[r] = changed = true;
                        break;
                    }
                    alt_ok = true;
                } else if (e->type != GRAMMAR_EL_RULE || !nul[e->v]) alt_ok = false;
            }
        }
    }
}

/* DFS over "may start with" edges; 1 visiting, 2 done. Returns a rule on a cycle or -1. */
static int gp_left_rec(const gp *p, const bool *nul, uint8_t *mark, int r)
{
    if (mark[r] == 2) return -1;
    if (mark[r] == 1) return r;
    mark[r] = 1;
    const gp_seq *b = &p->rules[r].body;
    bool at_start = true;
    for (int i = 0; i < b->n; i++) {
        const grammar_el *e = &b->el[i];
        if (e->type == GRAMMAR_EL_ALT || e->type == GRAMMAR_EL_END) {
            at_start = true;
            continue;
        }
        if (!at_start) continue;
        if (e->type != GRAMMAR_EL_RULE) {
            at_start = false;
            continue;
        }
        int c = gp_left_rec(p, nul, mark, (int)e->v);
        if (c >= 0) return c;
        if (!nul[e->v]) at_start = false;
    }
    mark[r] = 2;
    return -1;
}

static void gp_free(gp *p)
{
    for (int i = 0; i < p->n_rules; i++) {
        free(p->rules[i].name);
        free(p->rules[i].body.el);
    }
    free(p->rules);
    free(p->sets);
    free(p->names);
}

static grammar_status gp_finish(gp *p, grammar **out)
{
    int root = -1;
    for (int i = 0; i < p->n_rules; i++) {
        if (!p->rules[i].defined) {
            gp_fail(p, p->rules[i].ref_at, "undefined rule '%s'", p->rules[i].name);
            return GRAMMAR_ERR_INVALID;
        }
        if (!strcmp(p->rules[i].name, "root")) root = i;
    }
    if (root < 0) {
        gp_fail(p, NULL, "no 'root' rule");
        return GRAMMAR_ERR_INVALID;
    }
    bool *nul = xmalloc((size_t)p->n_rules + 1);
    uint8_t *mark = xcalloc((size_t)p->n_rules + 1, 1);
    gp_nullable(p, nul);
    for (int r = 0; r < p->n_rules; r++) {
        int c = gp_left_rec(p, nul, mark, r);
        if (c >= 0) {
            gp_fail(p, NULL, "rule '%s' is left-recursive", p->rules[c].name);
            free(nul);
            free(mark);
            return GRAMMAR_ERR_INVALID;
        }
    }
    free(nul);
    free(mark);
    grammar *g = xcalloc(1, sizeof *g);
    g->refs = 1;
    g->n_rules = p->n_rules;
    g->rule_start = xmalloc((size_t)g->n_rules * sizeof *g->rule_start);
    for (int r = 0; r < p->n_rules; r++) g->n_el += p->rules[r].body.n;
    g->el = xmalloc((size_t)g->n_el * sizeof *g->el);
    int k = 0;
    for (int r = 0; r < p->n_rules; r++) {
        g->rule_start[r] = (uint32_t)k;
        memcpy(g->el + k, p->rules[r].body.el, (size_t)p->rules[r].body.n * sizeof *g->el);
        k += p->rules[r].body.n;
    }
    g->n_sets = p->n_sets;
    g->sets = xmalloc((size_t)(g->n_sets ? g->n_sets : 1) * sizeof *g->sets);
    if (g->n_sets) memcpy(g->sets, p->sets, (size_t)g->n_sets * sizeof *g->sets);
    g->root = root;
    g->max_token = p->max_token;
    pthread_mutex_init(&g->mu, NULL);
    /* the initial state: the root rule's alternatives */
    grammar_set_init(&g->start);
    grammar_scratch sc = { 0 };
    /* a one-element stack holding a reference to root (an extra element after the rules),
     * expanded */
    grammar_el *tmp = xrealloc(g->el, (size_t)(g->n_el + 2) * sizeof *g->el);
    g->el = tmp;
    g->el[g->n_el] = (grammar_el){ GRAMMAR_EL_RULE, (uint32_t)root };
    g->el[g->n_el + 1] = (grammar_el){ GRAMMAR_EL_END, 0 };
    uint32_t w = (uint32_t)g->n_el;
    grammar_expand_into(g, &sc, &g->start, &w, 1);
    grammar_scratch_free(&sc);
    *out = g;
    return GRAMMAR_OK;
}

static grammar_status grammar_from_gbnf(const char *src, size_t len, grammar **out, char *err,
                                        size_t errsz)
{
    gp p = { .src = src, .end = src + len, .err = err, .errsz = errsz, .max_token = -1 };
    gp_parse(&p);
    grammar_status st = p.failed ? GRAMMAR_ERR_SYNTAX : gp_finish(&p, out);
    if (p.failed && st == GRAMMAR_OK) st = GRAMMAR_ERR_SYNTAX;
    gp_free(&p);
    return st;
}

/* ---- stack sets ---------------------------------------------------------------------- */

void grammar_set_init(grammar_set *s)
{
    memset(s, 0, sizeof *s);
    s->gen = 1;
}

void grammar_set_free(grammar_set *s)
{
    free(s->data);
    free(s->off);
    free(s->ht);
    free(s->ht_gen);
    memset(s, 0, sizeof *s);
}

void grammar_set_clear(grammar_set *s)
{
    s->n_data = s->n_stacks = 0;
    if (++s->gen == 0) {  /* wrapped: really clear */
        if (s->ht_gen) memset(s->ht_gen, 0, (size_t)s->ht_cap * sizeof *s->ht_gen);
        s->gen = 1;
    }
}

static uint64_t grammar_hash_words(const uint32_t *w, int n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return h;
}

uint64_t grammar_set_hash(const grammar_set *s)
{
    return grammar_hash_words(s->data, s->n_data) ^ (uint64_t)s->n_stacks;
}

static void grammar_set_rehash(grammar_set *s, int cap)
{
    free(s->ht);
    free(s->ht_gen);
    s->ht_cap = cap;
    s->ht = xmalloc((size_t)cap * sizeof *s->ht);
    s->ht_gen = xcalloc((size_t)cap, sizeof *s->ht_gen);
    s->gen = 1;
    for (int i = 0; i < s->n_stacks; i++) {
        const uint32_t *w = s->data + s->off[i];
        uint64_t h = grammar_hash_words(w + 1, (int)w[0]);
        int j = (int)(h & (uint64_t)(cap - 1));
        while (s->ht_gen[j] == s->gen) j = (j + 1) & (cap - 1);
        s->ht_gen[j] = s->gen;
        s->ht[j] = (uint32_t)i + 1;
    }
}

/* Adds the stack stk[0..n) unless present. */
void grammar_set_add(grammar_set *s, const uint32_t *stk, int n)
{
    if (2 * (s->n_stacks + 1) > s->ht_cap) grammar_set_rehash(s, s->ht_cap ? 2 * s->ht_cap : 16);
    uint64_t h = grammar_hash_words(stk, n);
    int j = (int)(h & (uint64_t)(s->ht_cap - 1));
    while (s->ht_gen[j] == s->gen) {
        const uint32_t *w = s->data + s->off[s->ht[j] - 1];
        if ((int)w[0] == n && !memcmp(w + 1, stk, (size_t)n * sizeof *stk)) return;
        j = (j + 1) & (s->ht_cap - 1);
    }
    if (s->n_stacks == s->cap_stacks) {
        s->cap_stacks = s->cap_stacks ? 2 * s->cap_stacks : 16;
        s->off = xrealloc(s->off, (size_t)s->cap_stacks * sizeof *s->off);
    }
    if (s->n_data + n + 1 > s->cap_data) {
        s->cap_data = TM_MAX(2 * s->cap_data, s->n_data + n + 64);
        s->data = xrealloc(s->data, (size_t)s->cap_data * sizeof *s->data);
    }
    s->ht_gen[j] = s->gen;
    s->ht[j] = (uint32_t)s->n_stacks + 1;
    s->off[s->n_stacks++] = (uint32_t)s->n_data;
    s->data[s->n_data++] = (uint32_t)n;
    memcpy(s->data + s->n_data, stk, (size_t)n * sizeof *stk);
    s->n_data += n;
}

void grammar_set_copy(grammar_set *dst, const grammar_set *src)
{
    grammar_set_clear(dst);
    for (int i = 0; i < src->n_stacks; i++) {
        const uint32_t *w = src->data + src->off[i];
        grammar_set_add(dst, w + 1, (int)w[0]);
    }
}

bool grammar_set_accepting(const grammar_set *s)
{
    for (int i = 0; i < s->n_stacks; i++)
        if (s->data[s->off[i]] == 0) return true;
    return false;
}

void grammar_scratch_free(grammar_scratch *sc)
{
    free(sc->p);
    memset(sc, 0, sizeof *sc);
}

static uint32_t *grammar_scratch_push(grammar_scratch *sc, int n)
{
    if (sc->n + n > sc->cap) {
        sc->cap = TM_MAX(2 * sc->cap, sc->n + n + 256);
        sc->p = xrealloc(sc->p, (size_t)sc->cap * sizeof *sc->p);
    }
    uint32_t *r = sc->p + sc->n;
    sc->n += n;
    return r;
}

static bool grammar_el_ends(const grammar *g, uint32_t pos)
{
    return g->el[pos].type == GRAMMAR_EL_END || g->el[pos].type == GRAMMAR_EL_ALT;
}

/* Adds to out every stack that stk[0..n) expands to: a rule reference on top is replaced by
 * each of its alternatives (with the position after the reference below it), until a byte
 * set is on top or the stack is empty. Terminates because left recursion was refused.
 * stk may live in sc (it is copied before sc grows). */
static void grammar_expand_into(const grammar *g, grammar_scratch *sc, grammar_set *out, const uint32_t *stk,
                         int n)
{
    if (n == 0 || g->el[stk[n - 1]].type != GRAMMAR_EL_RULE) {  /* a terminal on top */
        grammar_set_add(out, stk, n);
        return;
    }
    uint32_t pos = stk[n - 1];
    int base = sc->n;
    size_t stk_off = (size_t)-1;
    if (sc->p && stk >= sc->p && stk < sc->p + sc->cap) stk_off = (size_t)(stk - sc->p);
    uint32_t *w = grammar_scratch_push(sc, n + 1);
    if (stk_off != (size_t)-1) stk = sc->p + stk_off;
    memcpy(w, stk, (size_t)(n - 1) * sizeof *w);
    int k = n - 1;
    if (!grammar_el_ends(g, pos + 1)) w[k++] = pos + 1;
    uint32_t a = g->rule_start[g->el[pos].v];
    for (;;) {
        w = sc->p + base;  /* (sc may have moved) */
        if (grammar_el_ends(g, a)) grammar_expand_into(g, sc, out, w, k);
        else {
            w[k] = a;
            grammar_expand_into(g, sc, out, w, k + 1);
        }
        while (!grammar_el_ends(g, a)) a++;
        if (g->el[a].type == GRAMMAR_EL_END) break;
        a++;
    }
    sc->n = base;
}

/* out = the stacks of in whose top terminal matches (byte x of a byte set, or token x of a
 * token terminal), advanced past it and expanded. */
static void grammar_advance(const grammar *g, grammar_scratch *sc, const grammar_set *in, uint32_t type, uint32_t x,
                            grammar_set *out)
{
    grammar_set_clear(out);
    for (int i = 0; i < in->n_stacks; i++) {
        const uint32_t *w = in->data + in->off[i];
        int n = (int)w[0];
        if (n == 0) continue;
        uint32_t pos = w[n];
        const grammar_el *e = &g->el[pos];
        if (e->type != type) continue;
        if (type == GRAMMAR_EL_BYTES ? !(g->sets[e->v][x >> 5] >> (x & 31) & 1) : e->v != x) continue;
        int base = sc->n;
        uint32_t *t = grammar_scratch_push(sc, n);
        w = in->data + in->off[i];
        memcpy(t, w + 1, (size_t)(n - 1) * sizeof *t);
        int k = n - 1;
        if (!grammar_el_ends(g, pos + 1)) t[k++] = pos + 1;
        grammar_expand_into(g, sc, out, sc->p + base, k);
        sc->n = base;
    }
}

void grammar_step(const grammar *g, grammar_scratch *sc, const grammar_set *in, uint8_t b,
                  grammar_set *out)
{
    grammar_advance(g, sc, in, GRAMMAR_EL_BYTES, b, out);
}

void grammar_step_token(const grammar *g, grammar_scratch *sc, const grammar_set *in, int32_t token,
                        grammar_set *out)
{
    if (token < 0) grammar_set_clear(out);
    else grammar_advance(g, sc, in, GRAMMAR_EL_TOKEN, (uint32_t)token, out);
}

bool grammar_accepts(const grammar *g, const char *doc, size_t len)
{
    grammar_set a, b;
    grammar_set_init(&a);
    grammar_set_init(&b);
    grammar_scratch sc = { 0 };
    grammar_set_copy(&a, &g->start);
    grammar_set *cur = &a, *nxt = &b;
    for (size_t i = 0; i < len && cur->n_stacks; i++) {
        grammar_step(g, &sc, cur, (uint8_t)doc[i], nxt);
        grammar_set *t = cur;
        cur = nxt;
        nxt = t;
    }
    bool ok = grammar_set_accepting(cur);
    grammar_set_free(&a);
    grammar_set_free(&b);
    grammar_scratch_free(&sc);
    return ok;
}

int grammar_n_rules(const grammar *g)
{
    return g->n_rules;
}

int32_t grammar_max_token(const grammar *g)
{
    return g->max_token;
}

grammar *grammar_ref(grammar *g)
{
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void grammar_free(grammar *g)
{
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (int i = 0; i < g->ci_cap; i++) {
        free(g->ci[i].mask);
        free(g->ci[i].ids);
        free(g->ci[i].unc);
    }
    free(g->ci);
    for (int i = 0; i < GRAMMAR_MASK_CACHE; i++) {
        free(g->cache[i].key);
        free(g->cache[i].mask);
    }
    pthread_mutex_destroy(&g->mu);
    grammar_set_free(&g->start);
    free(g->el);
    free(g->rule_start);
    free(g->sets);
    free(g);
}

/* ---- front ends ---------------------------------------------------------------------- */

/* A JSON object (OpenAI's json_object mode promises an object), as llama.cpp's
 * grammars/json.gbnf but with bounded whitespace. */
static const char grammar_json_gbnf[] =
    "root ::= ws object\n"
    "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

char *grammar_to_gbnf(grammar_kind kind, const char *src, size_t len, grammar_status *st,
                      char *err, size_t errsz)
{
    *st = GRAMMAR_OK;
    switch (kind) {
    case GRAMMAR_KIND_GBNF: {
        char *t = xmalloc(len + 1);
        memcpy(t, src, len);
        t[len] = 0;
        return t;
    }
    case GRAMMAR_KIND_JSON: return xstrdup(grammar_json_gbnf);
    case GRAMMAR_KIND_REGEX: return grammar_regex_to_gbnf(src, len, st, err, errsz);
    case GRAMMAR_KIND_SCHEMA: return grammar_schema_to_gbnf(src, len, st, err, errsz);
    }
    *st = GRAMMAR_ERR_INVALID;
    snprintf(err, errsz, "unknown grammar kind");
    return NULL;
}

char *grammar_gbnf_prefix(const char *gbnf, size_t len, const char *prefix)
{
    bytebuf t = { 0 };
    bytebuf_puts(&t, "");
    const char *s = gbnf, *end = gbnf + len;
    while (s < end) {
        const char *b = s;
        if (*s == '"' || *s == '[') {  /* a literal or class: copied, escapes included */
            char close = *s == '"' ? '"' : ']';
            s++;
            while (s < end && *s != close) s += (*s == '\\' && s + 1 < end) ? 2 : 1;
            if (s < end) s++;
        } else if (*s == '#') {
            while (s < end && *s != '\n') s++;
        } else if (*s == '{') {
            while (s < end && *s != '}') s++;
            if (s < end) s++;
        } else if (gp_is_word(*s)) {
            while (s < end && gp_is_word(*s)) s++;
            bytebuf_puts(&t, prefix);
        } else s++;
        bytebuf_append(&t, b, (size_t)(s - b));
    }
    return t.p;
}

grammar_status grammar_compile(grammar_kind kind, const char *src, size_t len, grammar **out,
                               char *err, size_t errsz)
{
    *out = NULL;
    grammar_status st;
    char *text = grammar_to_gbnf(kind, src, len, &st, err, errsz);
    if (!text) return st;
    st = grammar_from_gbnf(text, strlen(text), out, err, errsz);
    if (st != GRAMMAR_OK && kind != GRAMMAR_KIND_GBNF) {
        /* a front end wrote bad GBNF: say so, it is our bug, not the user's */
        size_t n = strlen(err);
        snprintf(err + n, errsz - n, " (in the grammar compiled from the %s)",
                 kind == GRAMMAR_KIND_REGEX ? "regex" : "schema");
    }
    free(text);
    return st;
}

/* ---- compile cache ------------------------------------------------------------------- */

typedef struct {
    uint8_t key[32];        /* SHA-256 of kind byte + source */
    grammar *g;
    uint64_t last_use;      /* cache tick */
} grammar_cache_entry;

struct grammar_cache {
    pthread_mutex_t mu;
    grammar_cache_entry *e; /* (max) */
    int n, max;
    uint64_t tick, n_compiled, n_hits;
};

grammar_cache *grammar_cache_new(int max_entries)
{
    grammar_cache *c = xcalloc(1, sizeof *c);
    c->max = max_entries > 0 ? max_entries : 64;
    c->e = xcalloc((size_t)c->max, sizeof *c->e);
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void grammar_cache_free(grammar_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) grammar_free(c->e[i].g);
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

grammar_status grammar_cache_get(grammar_cache *c, grammar_kind kind, const char *src, size_t len,
                                 grammar **out, char *err, size_t errsz)
{
    uint8_t key[32];
    unsigned klen = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    uint8_t kb = (uint8_t)kind;
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    EVP_DigestUpdate(md, &kb, 1);
    EVP_DigestUpdate(md, src, len);
    EVP_DigestFinal_ex(md, key, &klen);
    EVP_MD_CTX_free(md);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (!memcmp(c->e[i].key, key, 32)) {
            c->e[i].last_use = ++c->tick;
            c->n_hits++;
            *out = grammar_ref(c->e[i].g);
            pthread_mutex_unlock(&c->mu);
            return GRAMMAR_OK;
        }
    pthread_mutex_unlock(&c->mu);
    /* compile outside the lock: a slow schema does not hold up lookups of others */
    grammar *g;
    grammar_status st = grammar_compile(kind, src, len, &g, err, errsz);
    if (st != GRAMMAR_OK) return st;
    pthread_mutex_lock(&c->mu);
    c->n_compiled++;
    int slot = -1;
    for (int i = 0; i < c->n; i++)
        if (!memcmp(c->e[i].key, key, 32)) slot = i;  /* compiled meanwhile by another thread */
    if (slot < 0) {
        if (c->n < c->max) slot = c->n++;
        else {
            slot = 0;
            for (int i = 1; i < c->n; i++)
                if (c->e[i].last_use < c->e[slot].last_use) slot = i;
        }
        grammar_free(c->e[slot].g);
        memcpy(c->e[slot].key, key, 32);
        c->e[slot].g = grammar_ref(g);
    }
    c->e[slot].last_use = ++c->tick;
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return GRAMMAR_OK;
}

void grammar_cache_stats(grammar_cache *c, uint64_t *n_compiled, uint64_t *n_hits)
{
    pthread_mutex_lock(&c->mu);
    *n_compiled = c->n_compiled;
    *n_hits = c->n_hits;
    pthread_mutex_unlock(&c->mu);
}
