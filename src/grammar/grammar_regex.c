/*
 * grammar_regex: regular expressions into GBNF (one rule, groups inlined as parenthesised
 * expressions).
 *
 * The syntax is the common subset of ECMAScript and PCRE that has no context: literals,
 * escapes (\d \w \s and their negations, \n \t \r \f \v \0, \xHH, \uHHHH, escaped
 * punctuation), classes with ranges and negation, `.`, groups ( ), (?: ), named groups,
 * alternation, the quantifiers * + ? {m} {m,} {m,n} (lazy and possessive suffixes accepted:
 * they change which match is found, not what matches), ^ at the start and $ at the end.
 * Backreferences, lookaround, word boundaries and anchors elsewhere are refused by name:
 * they are not regular or not expressible in a grammar of the text alone.
 *
 * Two modes: the text itself (`--regex`, vLLM's guided_regex: matched in full), and the
 * content of a JSON string (JSON Schema's `pattern`): then each character is written as JSON
 * writes it (`"` as \", controls as escapes) and an end without an anchor matches anything
 * there, since `pattern` searches.
 */
#include "grammar/grammar_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/unicode.h"
#include "util/util.h"

typedef struct {
    uint32_t lo, hi;
} rx_range;

typedef struct {
    const char *s, *end, *start;
    bool json;              /* content of a JSON string */
    bytebuf *out;
    char *err;
    size_t errsz;
    grammar_status st;
    bool failed;
    int depth;
} rx;

static void rx_fail(rx *r, grammar_status st, const char *fmt, const char *what)
{
    if (r->failed) return;
    r->failed = true;
    r->st = st;
    char msg[160];
    snprintf(msg, sizeof msg, fmt, what);
    snprintf(r->err, r->errsz, "regex: %s at offset %d", msg, (int)(r->s - r->start));
}

/* A code point as a GBNF escape (usable in literals and classes). */
static void rx_put_cp(bytebuf *o, uint32_t cp)
{
    if (cp >= 0x20 && cp < 0x7F && cp != '"' && cp != '\\' && cp != ']' && cp != '[' && cp != '-' &&
        cp != '^')
        bytebuf_putc(o, (char)cp);
    else if (cp < 0x100) grammar_printf(o, "\\x%02X", cp);
    else if (cp < 0x10000) grammar_printf(o, "\\u%04X", cp);
    else grammar_printf(o, "\\U%08X", cp);
}

/* The JSON encoding of one character, as a GBNF literal. */
static void rx_put_json_char(bytebuf *o, uint32_t cp)
{
    static const char *const ctl[] = { ['\b'] = "\\\\b", ['\f'] = "\\\\f", ['\n'] = "\\\\n",
                                       ['\r'] = "\\\\r", ['\t'] = "\\\\t" };
    bytebuf_putc(o, '"');
    if (cp == '"') bytebuf_puts(o, "\\\\\\\"");
    else if (cp == '\\') bytebuf_puts(o, "\\\\\\\\");
    else if (cp < 0x20 && cp < TM_ARRAY_LEN(ctl) && ctl[cp]) bytebuf_puts(o, ctl[cp]);
    else if (cp < 0x20) grammar_printf(o, "\\\\u%04X", cp);
    else rx_put_cp(o, cp);
    bytebuf_putc(o, '"');
}

static int rx_cmp(const void *a, const void *b)
{
    const rx_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorted, merged, complemented if negated: the set as disjoint ranges in r (cap >= n + 1). */
static int rx_normalise(rx_range *r, int n, bool negated)
{
    if (n > 0) qsort(r, (size_t)n, sizeof *r, rx_cmp);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k && r[i].lo <= r[k - 1].hi + 1) r[k - 1].hi = TM_MAX(r[k - 1].hi, r[i].hi);
        else r[k++] = r[i];
    }
    if (!negated) return k;
    rx_range *c = xmalloc((size_t)(k + 1) * sizeof *c);
    int kc = 0;
    uint32_t next = 0;
    for (int i = 0; i < k; i++) {
        if (r[i].lo > next) c[kc++] = (rx_range){ next, r[i].lo - 1 };
        next = r[i].hi + 1;
    }
    if (next <= 0x10FFFF) c[kc++] = (rx_range){ next, 0x10FFFF };
    memcpy(r, c, (size_t)kc * sizeof *c);
    free(c);
    return kc;
}

/* Emits a character set (disjoint sorted ranges). */
static void rx_emit_set(rx *x, const rx_range *r, int n)
{
    bytebuf *o = x->out;
    if (n == 0) {
        rx_fail(x, GRAMMAR_ERR_INVALID, "%s", "a character class that matches nothing");
        return;
    }
    if (!x->json) {
        bytebuf_putc(o, '[');
        for (int i = 0; i < n; i++) {
            rx_put_cp(o, r[i].lo);
            if (r[i].hi > r[i].lo) {
                bytebuf_putc(o, '-');
                rx_put_cp(o, r[i].hi);
            }
        }
        bytebuf_putc(o, ']');
        return;
    }
    /* JSON: the characters written as themselves, then the ones written as escapes */
    bytebuf_putc(o, '(');
    bool any = false, first = true;
    for (int i = 0; i < n; i++)
        if (r[i].hi >= 0x20) any = true;
    if (any) {
        bytebuf_putc(o, '[');
        for (int i = 0; i < n; i++) {
            uint32_t lo = TM_MAX(r[i].lo, 0x20u), hi = r[i].hi;
            if (lo > hi) continue;
            /* cut out '"' and '\\' */
            uint32_t cuts[2] = { '"', '\\' };
            for (int c = 0; c < 2 && lo <= hi; c++) {
                if (cuts[c] < lo || cuts[c] > hi) continue;
                if (cuts[c] > lo) {
                    rx_put_cp(o, lo);
                    if (cuts[c] - 1 > lo) {
                        bytebuf_putc(o, '-');
                        rx_put_cp(o, cuts[c] - 1);
                    }
                }
                lo = cuts[c] + 1;
            }
            if (lo <= hi) {
                rx_put_cp(o, lo);
                if (hi > lo) {
                    bytebuf_putc(o, '-');
                    rx_put_cp(o, hi);
                }
            }
        }
        bytebuf_putc(o, ']');
        first = false;
    }
    for (int i = 0; i < n; i++)
        for (uint32_t cp = r[i].lo; cp <= TM_MIN(r[i].hi, 0x5Cu); cp++) {
            if (cp >= 0x20 && cp != '"' && cp != '\\') continue;
            if (!first) bytebuf_puts(o, " | ");
            first = false;
            rx_put_json_char(o, cp);
        }
    bytebuf_putc(o, ')');
}

/* The class an escape letter stands for (\d \w \s and negations); false if it is not one. */
static bool rx_class_escape(char c, rx_range *r, int *n, bool *neg)
{
    *neg = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
    case 'd': case 'D': r[0] = (rx_range){ '0', '9' }; *n = 1; return true;
    case 'w': case 'W':
        r[0] = (rx_range){ '0', '9' }, r[1] = (rx_range){ 'A', 'Z' }, r[2] = (rx_range){ '_', '_' },
        r[3] = (rx_range){ 'a', 'z' };
        *n = 4;
        return true;
    case 's': case 'S':
        r[0] = (rx_range){ '\t', '\r' }, r[1] = (rx_range){ ' ', ' ' };
        *n = 2;
        return true;
    }
    return false;
}

static uint32_t rx_utf8(rx *x)
{
    size_t used = 0;
    uint32_t c = unicode_decode(x->s, (size_t)(x->end - x->s), &used);
    x->s += used;
    return c;
}

/* A single-character escape after '\' (x->s at the letter); returns the code point or fails. */
static uint32_t rx_char_escape(rx *x)
{
    char c = *x->s++;
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': case 'u': {
        int nd = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        if (c == 'u' && x->s < x->end && *x->s == '{') {
            x->s++;
            while (x->s < x->end && *x->s != '}' && util_hexval(*x->s) >= 0) v = v * 16 + (uint32_t)util_hexval(*x->s++);
            if (x->s < x->end && *x->s == '}') x->s++;
            return v;
        }
        for (int i = 0; i < nd; i++) {
            if (x->s >= x->end || util_hexval(*x->s) < 0) {
                rx_fail(x, GRAMMAR_ERR_SYNTAX, "\\%s needs hex digits", c == 'x' ? "x" : "u");
                return 0;
            }
            v = v * 16 + (uint32_t)util_hexval(*x->s++);
        }
        return v;
    }
    case 'b': case 'B': rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "%s are not supported", "word boundaries (\\b, \\B)"); return 0;
    case 'p': case 'P': rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "%s are not supported", "Unicode property classes (\\p)"); return 0;
    case 'k': rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "%s are not supported", "backreferences"); return 0;
    default:
        if (c >= '1' && c <= '9') {
            rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "%s are not supported", "backreferences");
            return 0;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            char what[32];
            snprintf(what, sizeof what, "\\%c", c);
            rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "unknown escape %s", what);
            return 0;
        }
        x->s--;
        return rx_utf8(x);
    }
}

static void rx_class(rx *x)
{
    int n = 0, cap = 16;
    rx_range *r = xmalloc((size_t)cap * sizeof *r);
    bool neg = false;
    if (x->s < x->end && *x->s == '^') neg = true, x->s++;
    bool first = true;
    while (x->s < x->end && (*x->s != ']' || first) && !x->failed) {
        first = false;
        if (n + 8 > cap) r = xrealloc(r, (size_t)(cap *= 2) * sizeof *r);
        uint32_t lo;
        if (*x->s == '\\' && x->s + 1 < x->end) {
            x->s++;
            rx_range cr[4];
            int cn;
            bool cneg;
            if (rx_class_escape(*x->s, cr, &cn, &cneg)) {
                x->s++;
                cn = rx_normalise(cr, cn, false);
                if (cneg) {
                    rx_range tmp[8];
                    memcpy(tmp, cr, (size_t)cn * sizeof *cr);
                    cn = rx_normalise(tmp, cn, true);
                    for (int i = 0; i < cn; i++) r[n++] = tmp[i];
                } else
                    for (int i = 0; i < cn; i++) r[n++] = cr[i];
                continue;
            }
            if (*x->s == 'b') {  /* backspace inside a class */
                x->s++;
                lo = '\b';
            } else lo = rx_char_escape(x);
        } else lo = rx_utf8(x);
        uint32_t hi = lo;
        if (x->s + 1 < x->end && *x->s == '-' && x->s[1] != ']') {
            x->s++;
            if (*x->s == '\\') {
                x->s++;
                hi = rx_char_escape(x);
            } else hi = rx_utf8(x);
            if (hi < lo) rx_fail(x, GRAMMAR_ERR_SYNTAX, "%s", "a class range out of order");
        }
        r[n++] = (rx_range){ lo, hi };
    }
    if (x->s >= x->end) rx_fail(x, GRAMMAR_ERR_SYNTAX, "%s", "unterminated character class");
    else x->s++;
    if (!x->failed) {
        r = xrealloc(r, (size_t)(n + 2) * sizeof *r);
        n = rx_normalise(r, n, neg);
        rx_emit_set(x, r, n);
    }
    free(r);
}

static void rx_alt(rx *x);

/* One atom; false at the end of a sequence. */
static bool rx_atom(rx *x)
{
    if (x->s >= x->end || *x->s == '|' || *x->s == ')') return false;
    char c = *x->s;
    if (c == '(') {
        x->s++;
        if (x->s < x->end && *x->s == '?') {
            x->s++;
            if (x->s < x->end && *x->s == ':') x->s++;
            else if (x->s + 1 < x->end && (*x->s == 'P' || *x->s == '<') && x->s[*x->s == 'P'] == '<' &&
                     x->s[(*x->s == 'P') + 1] != '=' && x->s[(*x->s == 'P') + 1] != '!') {
                while (x->s < x->end && *x->s != '>') x->s++;
                x->s++;
            } else {
                rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "%s are not supported", "lookaround and inline flags (?...)");
                return false;
            }
        }
        if (++x->depth > 200) {
            rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "%s", "groups nested too deeply");
            return false;
        }
        bytebuf_putc(x->out, '(');
        rx_alt(x);
        bytebuf_putc(x->out, ')');
        x->depth--;
        if (x->s >= x->end || *x->s != ')') {
            rx_fail(x, GRAMMAR_ERR_SYNTAX, "%s", "missing ')'");
            return false;
        }
        x->s++;
        return true;
    }
    if (c == '[') {
        x->s++;
        rx_class(x);
        return true;
    }
    if (c == '.') {
        x->s++;
        rx_range r[2] = { { '\n', '\n' } };
        int n = rx_normalise(r, 1, true);
        rx_emit_set(x, r, n);
        return true;
    }
    if (c == '^' || c == '$') {
        rx_fail(x, GRAMMAR_ERR_UNSUPPORTED, "%s", "anchors are supported only at the start (^) and end ($)");
        return false;
    }
    if (c == '*' || c == '+' || c == '?' || (c == '{' && x->s + 1 < x->end && x->s[1] >= '0' && x->s[1] <= '9')) {
        rx_fail(x, GRAMMAR_ERR_SYNTAX, "%s", "a quantifier without anything to repeat");
        return false;
    }
    uint32_t cp;
    if (c == '\\') {
        x->s++;
        if (x->s >= x->end) {
            rx_fail(x, GRAMMAR_ERR_SYNTAX, "%s", "a trailing backslash");
            return false;
        }
        rx_range r[8];
        int n;
        bool neg;
        if (rx_class_escape(*x->s, r, &n, &neg)) {
            x->s++;
            n = rx_normalise(r, n, neg);
            rx_emit_set(x, r, n);
            return true;
        }
        cp = rx_char_escape(x);
        if (x->failed) return false;
    } else cp = rx_utf8(x);
    if (x->json) rx_put_json_char(x->out, cp);
    else {
        bytebuf_puts(x->out, "\"");
        rx_put_cp(x->out, cp);
        bytebuf_puts(x->out, "\"");
    }
    return true;
}

static void rx_seq(rx *x)
{
    bool any = false;
    for (;;) {
        size_t mark = x->out->len;
        if (any) bytebuf_putc(x->out, ' ');
        size_t at = x->out->len;
        if (x->s < x->end && *x->s == '$' && x->s + 1 == x->end) {
            x->out->len = mark;
            return;  /* the final anchor: the caller checks it */
        }
        if (!rx_atom(x) || x->failed) {
            x->out->len = mark;
            if (!any && !x->failed) bytebuf_puts(x->out, "\"\"");
            return;
        }
        any = true;
        /* quantifier */
        if (x->s < x->end && (*x->s == '*' || *x->s == '+' || *x->s == '?' ||
                              (*x->s == '{' && x->s + 1 < x->end && x->s[1] >= '0' && x->s[1] <= '9'))) {
            char q = *x->s;
            int min = -1, max = -1;
            if (q == '{') {
                const char *b = x->s + 1;
                char *e;
                long lo = strtol(b, &e, 10);
                if (e == b || lo < 0 || lo > 10000) {
                    /* not a quantifier: a literal '{' (as ECMAScript's Annex B reads it) */
                    continue;
                }
                long hi = lo;
                if (*e == ',') {
                    const char *b2 = e + 1;
                    hi = strtol(b2, &e, 10);
                    if (e == b2) hi = -1;
                }
                if (*e != '}' || (hi >= 0 && hi < lo) || hi > 10000) {
                    rx_fail(x, GRAMMAR_ERR_SYNTAX, "%s", "a bad {m,n} quantifier");
                    return;
                }
                x->s = e + 1;
                min = (int)lo;
                max = (int)hi;
            } else x->s++;
            /* wrap the atom in a group so the quantifier applies to it as a whole */
            size_t alen = x->out->len - at;
            char *atom = xmalloc(alen + 1);
            if (alen) memcpy(atom, x->out->p + at, alen);
            x->out->len = at;
            bytebuf_putc(x->out, '(');
            bytebuf_append(x->out, atom, alen);
            bytebuf_putc(x->out, ')');
            free(atom);
            if (q == '{') {
                if (max < 0) grammar_printf(x->out, "{%d,}", min);
                else grammar_printf(x->out, "{%d,%d}", min, max);
            } else bytebuf_putc(x->out, q);
            if (x->s < x->end && (*x->s == '?' || *x->s == '+')) x->s++;  /* lazy / possessive */
            if (x->s < x->end && (*x->s == '*' || *x->s == '+' || *x->s == '?' || *x->s == '{') &&
                !(*x->s == '{' && !(x->s + 1 < x->end && x->s[1] >= '0' && x->s[1] <= '9'))) {
                rx_fail(x, GRAMMAR_ERR_SYNTAX, "%s", "a quantifier after a quantifier");
                return;
            }
        }
    }
}

static void rx_alt(rx *x)
{
    bytebuf_putc(x->out, '(');
    rx_seq(x);
    while (!x->failed && x->s < x->end && *x->s == '|') {
        x->s++;
        bytebuf_puts(x->out, " | ");
        rx_seq(x);
    }
    bytebuf_putc(x->out, ')');
}

bool grammar_regex_rule(bytebuf *t, const char *name, const char *re, size_t len,
                        bool json_string, bool search, grammar_status *st, char *err, size_t errsz)
{
    rx x = { .s = re, .end = re + len, .start = re, .json = json_string, .out = t, .err = err,
             .errsz = errsz };
    bool start_anchor = len > 0 && re[0] == '^';
    bool end_anchor = len > 0 && re[len - 1] == '$' && (len < 2 || re[len - 2] != '\\');
    if (start_anchor) x.s++;
    grammar_printf(t, "%s ::= ", name);
    if (search && !start_anchor) grammar_printf(t, "%s-any* ", name);
    rx_alt(&x);
    if (!x.failed && x.s < x.end && *x.s == '$' && x.s + 1 == x.end) x.s++;
    if (!x.failed && x.s < x.end) rx_fail(&x, GRAMMAR_ERR_SYNTAX, "%s", "unbalanced ')'");
    if (search && !end_anchor) grammar_printf(t, " %s-any*", name);
    bytebuf_putc(t, '\n');
    if (search) {
        grammar_printf(t, "%s-any ::= ", name);
        rx_range r[2];
        int n = rx_normalise(r, 0, true);  /* anything, newlines too */
        x.s = x.end;
        rx_emit_set(&x, r, n);
        bytebuf_putc(t, '\n');
    }
    if (x.failed) {
        *st = x.st;
        return false;
    }
    return true;
}

char *grammar_regex_to_gbnf(const char *re, size_t len, grammar_status *st, char *err, size_t errsz)
{
    bytebuf t = { 0 };
    if (!grammar_regex_rule(&t, "root", re, len, false, false, st, err, errsz)) {
        bytebuf_free(&t);
        return NULL;
    }
    *st = GRAMMAR_OK;
    return t.p;
}
