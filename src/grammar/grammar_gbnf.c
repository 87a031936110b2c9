/*
 * grammar_gbnf: GBNF text -> the compiled form (grammar_int.h), and the rule-name prefixing
 * that lets GBNF texts be combined.
 *
 * Parsing follows llama.cpp's grammar-parser (same syntax, same expansion of repetitions into
 * helper rules: X* becomes `r ::= X r |`, a tail call, so a long repetition does not deepen
 * the stacks), with one difference: character classes and `.` are code point sets, which are
 * turned into UTF-8 byte-range sequences here (the classic split of a code point range into
 * ranges whose encodings differ only in their last bytes), so the automaton never decodes.
 * Left recursion is refused at compile time (the expansion of a stack would not terminate).
 *
 * Budgets (grammar_limits): a grammar is text from a client, so nothing here recurses on its
 * depth (parentheses are limited to GP_MAX_NESTING, the checks and the expansion of stacks
 * are loops over explicit work lists), the compiled elements are counted as rules are
 * defined, the clock is read as they are, and the start state and every rule reference are
 * expanded once at compile under the stack budget: a grammar whose states would blow up
 * (nested counted repetitions of nullable symbols) is refused before any request uses it.
 * A counted repetition past GP_REPEAT_UNROLL is not unrolled: it is built from rules for
 * 2^i copies (x{n} as the powers of n's bits; x{0,n} as "fewer than 2^m" | 2^m then x{0,n-2^m}),
 * O(log n) rules whose stacks stay O(log n) deep.
 */
#include "grammar/grammar_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/unicode.h"
#include "util/util.h"

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
    bool limit;             /* failed at a budget (GRAMMAR_ERR_LIMIT) */
    long n_states;          /* elements defined so far (max_states counts them) */
    double deadline;        /* util_now() past which the compile gives up */
    double next_poll;       /* util_now() at which grammar_cancel is asked next (0: at once) */
    int depth;              /* parentheses open now */
} gp;

/* Parentheses a GBNF text may nest (each level is a C call of the parser). */
#define GP_MAX_NESTING 256
/* Counted repetitions up to this many copies are unrolled as llama.cpp does. */
#define GP_REPEAT_UNROLL 32

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

/* A budget ran out: the message names the limit. */
static void gp_limit(gp *p, const char *fmt, long v)
{
    if (p->failed) return;
    gp_fail(p, NULL, fmt, v);
    p->limit = true;
}

/* Whether the compile is past its time budget or cancelled (then failed). */
static bool gp_late(gp *p)
{
    if (p->failed) return p->limit;
    double now = util_now();
    if (now >= p->next_poll) {
        p->next_poll = now + GRAMMAR_CANCEL_POLL_S;
        if (grammar_cancelled()) {
            gp_fail(p, NULL, "grammar compile cancelled (the client has gone)");
            p->limit = true;
            return true;
        }
    }
    if (now <= p->deadline) return false;
    gp_fail(p, NULL, "grammar compile took longer than %.3g s (--grammar-max-seconds)", grammar_limits_get().max_seconds);
    p->limit = true;
    return true;
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
    p->n_states += body->n;
    if (p->n_states > grammar_limits_get().max_states)
        gp_limit(p, "grammar too large: more than %ld states (--grammar-max-states)", grammar_limits_get().max_states);
    else gp_late(p);
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

/* One character of a literal or class: an escape or a UTF-8 character. */
static const char *gp_char(gp *p, const char *s, uint32_t *cp)
{
    if (s >= p->end) {
        gp_fail(p, s, "unexpected end of input");
        return s;
    }
    if (*s != '\\') {
        size_t used = 0;
        *cp = unicode_decode(s, (size_t)(p->end - s), &used);
        return s + used;
    }
    if (s + 1 >= p->end) {
        gp_fail(p, s, "unexpected end of input after '\\'");
        return s + 1;
    }
    char e = s[1];
    int nhex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (nhex) {
        uint32_t v = 0;
        for (int i = 0; i < nhex; i++) {
            int h = s + 2 + i < p->end ? util_hexval(s[2 + i]) : -1;
            if (h < 0) {
                gp_fail(p, s, "expecting %d hex digits after \\%c", nhex, e);
                return s + 2;
            }
            v = v << 4 | (uint32_t)h;
        }
        if (v > 0x10FFFF) {
            gp_fail(p, s, "\\%c%.*s is beyond U+10FFFF", e, nhex, s + 2);
            v = 0;
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
    char a[4], b[4];
    unicode_encode(lo, a);
    unicode_encode(hi, b);
    if (!*first) gp_push(alts, GRAMMAR_EL_ALT, 0);
    *first = false;
    for (int i = 0; i < n; i++) gp_push_range(p, alts, (uint8_t)a[i], (uint8_t)b[i]);
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

/* A helper rule of rule with the body e[0..n) (one alternative; n may be 0: empty). */
static int gp_helper(gp *p, int rule, const grammar_el *e, int n)
{
    int id = gp_new_rule(p, rule);
    gp_seq body = { 0 };
    for (int i = 0; i < n; i++) gp_push(&body, e[i].type, e[i].v);
    gp_push(&body, GRAMMAR_EL_END, 0);
    gp_define(p, id, &body);
    return id;
}

/* {min,max} of the symbol prev[0..nprev) without unrolling: pw[i] matches 2^i copies
 * (pw[i+1] ::= pw[i] pw[i]); x{min} is the powers of min's bits in a row; x{0,n} is
 * lt[m] | pw[m] x{0,n-2^m} for 2^m <= n < 2^(m+1), where lt[j] (fewer than 2^j copies) ::=
 * pw[j-1] lt[j-1] | lt[j-1]. Each length has one derivation (the alternatives' lengths are
 * disjoint), so the stacks of a prefix stay few. */
static void gp_repeat_log(gp *p, gp_seq *out, int rule, const grammar_el *prev, int nprev, int min, int max)
{
    int pw[32], lt[32];
    int top = 0;
    for (long v = TM_MAX(min, max); v > 1; v >>= 1) top++;
    pw[0] = nprev == 1 && prev[0].type == GRAMMAR_EL_RULE ? (int)prev[0].v : gp_helper(p, rule, prev, nprev);
    for (int i = 1; i <= top && !p->failed; i++) {
        grammar_el two[2] = { { GRAMMAR_EL_RULE, (uint32_t)pw[i - 1] }, { GRAMMAR_EL_RULE, (uint32_t)pw[i - 1] } };
        pw[i] = gp_helper(p, rule, two, 2);
    }
    if (p->failed) return;
    for (int i = top; i >= 0; i--)
        if (min >> i & 1) gp_push(out, GRAMMAR_EL_RULE, (uint32_t)pw[i]);
    if (max < 0) {  /* x{min,}: then x*, a tail call */
        int id = gp_new_rule(p, rule);
        gp_seq body = { 0 };
        for (int j = 0; j < nprev; j++) gp_push(&body, prev[j].type, prev[j].v);
        gp_push(&body, GRAMMAR_EL_RULE, (uint32_t)id);
        gp_push(&body, GRAMMAR_EL_ALT, 0);
        gp_push(&body, GRAMMAR_EL_END, 0);
        gp_define(p, id, &body);
        gp_push(out, GRAMMAR_EL_RULE, (uint32_t)id);
        return;
    }
    int n = max - min;
    if (n == 0) return;
    /* lt[j] for j >= 1 (lt[0], no copies, is the empty sequence) */
    lt[0] = -1;
    for (int j = 1; j <= top && !p->failed; j++) {
        int id = gp_new_rule(p, rule);
        gp_seq body = { 0 };
        gp_push(&body, GRAMMAR_EL_RULE, (uint32_t)pw[j - 1]);
        if (lt[j - 1] >= 0) gp_push(&body, GRAMMAR_EL_RULE, (uint32_t)lt[j - 1]);
        gp_push(&body, GRAMMAR_EL_ALT, 0);
        if (lt[j - 1] >= 0) gp_push(&body, GRAMMAR_EL_RULE, (uint32_t)lt[j - 1]);
        gp_push(&body, GRAMMAR_EL_END, 0);
        gp_define(p, id, &body);
        lt[j] = id;
    }
    /* x{0,n}: one rule per bit of n, each naming the next */
    int first = -1, prev_id = -1;
    while (n > 0 && !p->failed) {
        int m = 0;
        while ((2L << m) <= n) m++;
        n -= 1 << m;
        int id = gp_new_rule(p, rule);
        gp_seq body = { 0 };
        if (lt[m] >= 0) gp_push(&body, GRAMMAR_EL_RULE, (uint32_t)lt[m]);
        gp_push(&body, GRAMMAR_EL_ALT, 0);
        gp_push(&body, GRAMMAR_EL_RULE, (uint32_t)pw[m]);
        gp_push(&body, GRAMMAR_EL_END, 0);
        gp_define(p, id, &body);
        if (prev_id >= 0) {  /* the previous bit's rule continues with this one after its 2^m copies */
            gp_rule *r = &p->rules[prev_id];
            r->body.el[r->body.n - 1] = (grammar_el){ GRAMMAR_EL_RULE, (uint32_t)id };
            gp_push(&r->body, GRAMMAR_EL_END, 0);
            p->n_states++;
        }
        if (first < 0) first = id;
        prev_id = id;
    }
    if (first >= 0) gp_push(out, GRAMMAR_EL_RULE, (uint32_t)first);
}

/* Applies {min,max} (max < 0: unbounded) to the symbol out[start..n), as llama.cpp does for
 * small counts, with gp_repeat_log for large ones. */
static void gp_repeat(gp *p, gp_seq *out, int start, int rule, int min, int max)
{
    int nprev = out->n - start;
    if (min > GP_REPEAT_UNROLL || (max >= 0 && max - min > GP_REPEAT_UNROLL)) {
        grammar_el *sym = xmalloc((size_t)(nprev ? nprev : 1) * sizeof *sym);
        memcpy(sym, out->el + start, (size_t)nprev * sizeof *sym);
        out->n = start;
        gp_repeat_log(p, out, rule, sym, nprev, min, max);
        free(sym);
        return;
    }
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
                char b[4];
                int nb = unicode_encode(cp, b);
                for (int i = 0; i < nb; i++) gp_push_range(p, out, (uint8_t)b[i], (uint8_t)b[i]);
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
            if (p->depth >= GP_MAX_NESTING) {
                gp_fail(p, s, "parentheses nested deeper than %d", GP_MAX_NESTING);
                break;
            }
            int id = gp_new_rule(p, rule);
            p->depth++;
            s = gp_alternates(p, gp_space(p, s + 1, true), id, true);
            p->depth--;
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
static void gp_nullable(gp *p, bool *nul)
{
    memset(nul, 0, (size_t)p->n_rules);
    for (bool changed = true; changed && !gp_late(p);) {
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

/* A rule being searched by gp_left_rec: the element it is at and whether that element can
 * be the first of its alternative. */
typedef struct {
    int r, i;
    bool at_start;
} gp_frame;

/* DFS over "may start with" edges from r; 1 visiting, 2 done. Returns a rule on a cycle or
 * -1. A loop over st (n_rules frames: a rule is on the path once), not recursion: a chain of
 * helper rules is as long as the text makes it. */
static int gp_left_rec(const gp *p, const bool *nul, uint8_t *mark, int r, gp_frame *st)
{
    if (mark[r] == 2) return -1;
    int d = 0;
    st[d++] = (gp_frame){ r, 0, true };
    mark[r] = 1;
    while (d > 0) {
        gp_frame *f = &st[d - 1];
        const gp_seq *b = &p->rules[f->r].body;
        if (f->i >= b->n) {
            mark[f->r] = 2;
            d--;
            if (d > 0) {  /* back in the parent, past the reference */
                gp_frame *up = &st[d - 1];
                if (!nul[p->rules[up->r].body.el[up->i].v]) up->at_start = false;
                up->i++;
            }
            continue;
        }
        const grammar_el *e = &b->el[f->i];
        if (e->type == GRAMMAR_EL_ALT || e->type == GRAMMAR_EL_END) {
            f->at_start = true;
            f->i++;
            continue;
        }
        if (!f->at_start || e->type != GRAMMAR_EL_RULE) {
            f->at_start = false;
            f->i++;
            continue;
        }
        int c = (int)e->v;
        if (mark[c] == 1) return c;
        if (mark[c] == 2) {
            if (!nul[c]) f->at_start = false;
            f->i++;
            continue;
        }
        mark[c] = 1;
        st[d++] = (gp_frame){ c, 0, true };
    }
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
    if (p->failed) return p->limit ? GRAMMAR_ERR_LIMIT : GRAMMAR_ERR_INVALID;
    if (root < 0) {
        gp_fail(p, NULL, "no 'root' rule");
        return GRAMMAR_ERR_INVALID;
    }
    bool *nul = xmalloc((size_t)p->n_rules + 1);
    uint8_t *mark = xcalloc((size_t)p->n_rules + 1, 1);
    gp_frame *st = xmalloc((size_t)(p->n_rules + 1) * sizeof *st);
    gp_nullable(p, nul);
    for (int r = 0; r < p->n_rules && !p->failed; r++) {
        int c = gp_left_rec(p, nul, mark, r, st);
        if (c >= 0) gp_fail(p, NULL, "rule '%s' is left-recursive", p->rules[c].name);
    }
    free(nul);
    free(mark);
    free(st);
    if (p->failed) return p->limit ? GRAMMAR_ERR_LIMIT : GRAMMAR_ERR_INVALID;
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
    grammar_expand(g, &sc, &g->start, w);
    if (sc.truncated)
        gp_limit(p, "grammar too ambiguous: its start state holds more than %ld parser stacks (--grammar-max-stacks)",
                 grammar_limits_get().max_stacks);
    /* every rule reference, expanded alone: what any state of the grammar holds is made of
     * these (one per entry of a stack it pops through), so the matcher never meets a blow-up
     * that this did not (and an inner one is refused here, not on a request's later token) */
    grammar_set tmp_set;
    grammar_set_init(&tmp_set);
    for (int r = 0, i = 0; r < g->n_rules && !p->failed; r++) {
        int end = r + 1 < g->n_rules ? (int)g->rule_start[r + 1] : g->n_el;
        for (; i < end && !p->failed; i++) {
            if (g->el[i].type != GRAMMAR_EL_RULE) continue;
            if ((i & 255) == 0 && gp_late(p)) break;
            grammar_set_clear(&tmp_set);
            grammar_expand(g, &sc, &tmp_set, (uint32_t)i);
            if (sc.truncated)
                gp_limit(p, "grammar too ambiguous: a rule expands to more than %ld parser stacks (--grammar-max-stacks)",
                         grammar_limits_get().max_stacks);
        }
    }
    grammar_set_free(&tmp_set);
    grammar_scratch_free(&sc);
    if (p->failed) {
        grammar_free(g);
        return p->limit ? GRAMMAR_ERR_LIMIT : GRAMMAR_ERR_INVALID;
    }
    *out = g;
    return GRAMMAR_OK;
}

grammar_status grammar_gbnf_compile(const char *src, size_t len, double deadline, grammar **out, char *err,
                                    size_t errsz)
{
    gp p = { .src = src, .end = src + len, .err = err, .errsz = errsz, .max_token = -1, .deadline = deadline };
    gp_parse(&p);
    grammar_status st = p.failed ? GRAMMAR_ERR_SYNTAX : gp_finish(&p, out);
    if (p.failed && st == GRAMMAR_OK) st = GRAMMAR_ERR_SYNTAX;
    if (p.limit) st = GRAMMAR_ERR_LIMIT;
    gp_free(&p);
    return st;
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
