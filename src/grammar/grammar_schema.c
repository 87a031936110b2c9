/*
 * grammar_schema: JSON Schema into GBNF.
 *
 * Supported: the keywords OpenAI's strict mode documents (type incl. lists of types,
 * properties, required, additionalProperties, items, enum, const, anyOf, $ref with $defs /
 * definitions incl. recursion, string/number/integer/boolean/object/array/null), plus
 * pattern (grammar_regex.c, searching as JSON Schema does), the regular formats (date, time,
 * date-time, uuid, ipv4), minLength/maxLength, minItems/maxItems, tuple items (prefixItems,
 * or draft 4's items array with additionalItems), integer minimum/maximum (exclusive too,
 * both drafts' spellings) as digit patterns, allOf of one schema, and annotations (title,
 * description, default, examples, ...). Anything else is refused with every such keyword
 * named, never ignored: a grammar that silently ignored `multipleOf` would let invalid output
 * through.
 *
 * Exactness where it is cheap, a subset where it is not (the output is always valid, some
 * valid documents cannot be produced): properties come in the schema's order (required ones
 * always, optional ones may be left out), then additional ones; keys of additional
 * properties differ from the declared names and contain no escapes; integers are written
 * without a fraction or exponent; enum and const values as compact JSON. Without a `type`,
 * type-specific keywords constrain only values of their type, as the specification says.
 *
 * Every value is followed by `space` (nothing, one space, or a newline and up to 20 blanks:
 * bounded, so that an unlikely model cannot wander in whitespace forever).
 */
#include "grammar/grammar_int.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/unicode.h"
#include "util/util.h"

typedef struct {
    char *ref;              /* "#/$defs/x" */
    char *name;             /* its rule */
} sc_ref;

typedef struct {
    json_t *root;
    bytebuf out;        /* the rules */
    int n_names;            /* helper rule counter */
    sc_ref *refs;
    int n_refs, cap_refs;
    unsigned prims;         /* SC_PRIM_* emitted */
    bytebuf unsupported;/* names of refused keywords, ", "-separated */
    char *err;
    size_t errsz;
    grammar_status st;
    bool failed;
    int depth;
} sc;

enum {
    SC_PRIM_SPACE = 1, SC_PRIM_VALUE = 2, SC_PRIM_CHAR = 4, SC_PRIM_NUMBER = 8,
    SC_PRIM_INTEGER = 16, SC_PRIM_KEYCHAR = 32, SC_PRIM_DATE = 64,
};

static void sc_fail(sc *c, grammar_status st, const char *fmt, const char *a)
{
    if (c->failed) return;
    c->failed = true;
    c->st = st;
    char msg[400];
    snprintf(msg, sizeof msg, fmt, a);
    snprintf(c->err, c->errsz, "schema: %s", msg);
}

static void sc_unsupported(sc *c, const char *kw)
{
    /* each name once */
    char quoted[160];
    snprintf(quoted, sizeof quoted, "'%.150s'", kw);
    if (c->unsupported.p && strstr(c->unsupported.p, quoted)) return;
    if (c->unsupported.len) bytebuf_puts(&c->unsupported, ", ");
    bytebuf_puts(&c->unsupported, quoted);
}

static void sc_prims(sc *c, unsigned want)
{
    bytebuf *o = &c->out;
    if (want & (SC_PRIM_VALUE)) want |= SC_PRIM_CHAR | SC_PRIM_NUMBER;
    want |= SC_PRIM_SPACE;
    unsigned todo = want & ~c->prims;
    c->prims |= want;
    if (todo & SC_PRIM_SPACE) bytebuf_puts(o, "space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
    if (todo & SC_PRIM_CHAR)
        bytebuf_puts(o, "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
                            "string ::= \"\\\"\" char* \"\\\"\" space\n");
    if (todo & SC_PRIM_KEYCHAR) bytebuf_puts(o, "keychar ::= [^\"\\\\\\x7F\\x00-\\x1F]\n");
    if (todo & SC_PRIM_NUMBER)
        bytebuf_puts(o, "integral ::= \"0\" | [1-9] [0-9]{0,15}\n"
                            "number ::= \"-\"? integral (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space\n");
    if (todo & SC_PRIM_INTEGER) bytebuf_puts(o, "integer ::= \"-\"? integral space\n");
    if (todo & SC_PRIM_VALUE)
        bytebuf_puts(o, "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") space\n"
                            "object ::= \"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space\n"
                            "array ::= \"[\" space ( value (\",\" space value)* )? \"]\" space\n");
    if (todo & SC_PRIM_DATE)
        bytebuf_puts(o, "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1])\n"
                            "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                            "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n");
}

static char *sc_name(sc *c, const char *hint)
{
    char buf[96];
    int k = 0;
    for (const char *p = hint; *p && k < 40; p++)
        buf[k++] = isalnum((unsigned char)*p) ? *p : '-';
    if (!k) buf[k++] = 'r';
    snprintf(buf + k, sizeof buf - (size_t)k, "-%d", ++c->n_names);
    return xstrdup(buf);
}

/* A GBNF literal of raw bytes (a JSON text fragment). */
static void sc_literal(bytebuf *o, const char *s, size_t n)
{
    bytebuf_putc(o, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            bytebuf_putc(o, '\\');
            bytebuf_putc(o, (char)ch);
        } else if (ch < 0x20 || ch == 0x7F) grammar_printf(o, "\\x%02X", ch);
        else if (ch >= 0x80) {
            /* keep UTF-8 characters whole: GBNF literals are read as UTF-8 */
            bytebuf_putc(o, (char)ch);
        } else bytebuf_putc(o, (char)ch);
    }
    bytebuf_putc(o, '"');
}

static void sc_json_literal(bytebuf *o, const json_t *v)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    sc_literal(o, t ? t : "null", t ? strlen(t) : 4);
    free(t);
}

static void sc_visit_into(sc *c, json_t *s, const char *name);

/* The UTF-8 character at s (n > 0 bytes); *len its length. */
static uint32_t sc_utf8(const char *s, size_t n, int *len)
{
    size_t used = 0;
    uint32_t v = unicode_decode(s, n, &used);
    *len = (int)used;
    return v;
}

static const char *sc_visit(sc *c, json_t *s, const char *hint)
{
    char *name = sc_name(c, hint);
    sc_visit_into(c, s, name);
    /* names live as long as the compilation: kept in the refs table's spare list */
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 32;
        c->refs = xrealloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
    }
    c->refs[c->n_refs++] = (sc_ref){ NULL, name };
    return name;
}

/* ---- integers in a range ------------------------------------------------------------- */

static int sc_ndigits(uint64_t v)
{
    int d = 1;
    while (v >= 10) v /= 10, d++;
    return d;
}

/* Alternatives for the d-digit strings from lo to hi (same length, lo <= hi). */
static void sc_digits(bytebuf *o, const char *lo, const char *hi, int d)
{
    if (d == 0) {
        bytebuf_puts(o, "\"\"");
        return;
    }
    if (!memcmp(lo, hi, (size_t)d)) {
        sc_literal(o, lo, (size_t)d);
        return;
    }
    if (lo[0] == hi[0]) {
        grammar_printf(o, "\"%c\" (", lo[0]);
        sc_digits(o, lo + 1, hi + 1, d - 1);
        bytebuf_putc(o, ')');
        return;
    }
    bool lo_zeros = true, hi_nines = true;
    for (int i = 1; i < d; i++) {
        lo_zeros &= lo[i] == '0';
        hi_nines &= hi[i] == '9';
    }
    char a = lo[0], b = hi[0];
    bool first = true;
    if (!lo_zeros) {
        char nines[24];
        memset(nines, '9', sizeof nines);
        grammar_printf(o, "\"%c\" (", a);
        sc_digits(o, lo + 1, nines, d - 1);
        bytebuf_putc(o, ')');
        first = false;
        a++;
    }
    char mid_hi = hi_nines ? b : (char)(b - 1);
    if (a <= mid_hi) {
        if (!first) bytebuf_puts(o, " | ");
        grammar_printf(o, "[%c-%c]", a, mid_hi);
        if (d > 1) grammar_printf(o, " [0-9]{%d}", d - 1);
        first = false;
    }
    if (!hi_nines) {
        char zeros[24];
        memset(zeros, '0', sizeof zeros);
        if (!first) bytebuf_puts(o, " | ");
        grammar_printf(o, "\"%c\" (", b);
        sc_digits(o, zeros, hi + 1, d - 1);
        bytebuf_putc(o, ')');
    }
}

/* Alternatives for the non-negative integers lo..hi (hi < 0: unbounded). */
static void sc_nonneg(bytebuf *o, uint64_t lo, int64_t hi)
{
    int dlo = sc_ndigits(lo), dhi = hi < 0 ? 16 : sc_ndigits((uint64_t)hi);
    bool first = true;
    for (int d = dlo; d <= dhi; d++) {
        uint64_t p = 1;
        for (int i = 1; i < d; i++) p *= 10;
        uint64_t a = TM_MAX(lo, d == 1 ? 0 : p), b = p * 10 - 1;
        if (hi >= 0 && (uint64_t)hi < b) b = (uint64_t)hi;
        if (a > b) continue;
        if (!first) bytebuf_puts(o, " | ");
        first = false;
        if (hi < 0 && d == dlo && d < 16) {
            /* this length from lo, then every longer number */
            char sa[24], sb[24];
            snprintf(sa, sizeof sa, "%0*llu", d, (unsigned long long)a);
            snprintf(sb, sizeof sb, "%0*llu", d, (unsigned long long)b);
            bytebuf_putc(o, '(');
            sc_digits(o, sa, sb, d);
            grammar_printf(o, ") | [1-9] [0-9]{%d,15}", d);
            return;
        }
        char sa[24], sb[24];
        snprintf(sa, sizeof sa, "%0*llu", d, (unsigned long long)a);
        snprintf(sb, sizeof sb, "%0*llu", d, (unsigned long long)b);
        bytebuf_putc(o, '(');
        sc_digits(o, sa, sb, d);
        bytebuf_putc(o, ')');
    }
    if (first) bytebuf_puts(o, "\"\"");  /* (unreachable for lo <= hi) */
}

/* `integral` writes at most 16 digits: a bound at or past 1e16 leaves nothing out of what
 * it writes (zod's int() sends +-(2^53 - 1), 16 digits, which is kept exactly). */
#define SC_INT_LIMIT 1e16

/* integer rule for [lo, hi] (has_*: bounded on that side). */
static void sc_int_range(sc *c, const char *name, bool has_lo, double lo, bool has_hi, double hi)
{
    bytebuf *o = &c->out;
    if ((has_lo && lo >= SC_INT_LIMIT) || (has_hi && hi <= -SC_INT_LIMIT)) {
        sc_fail(c, GRAMMAR_ERR_UNSUPPORTED, "%s", "integer bounds of 17 digits or more are not supported");
        return;
    }
    if (has_lo && lo <= -SC_INT_LIMIT) has_lo = false;
    if (has_hi && hi >= SC_INT_LIMIT) has_hi = false;
    if (!has_lo && !has_hi) {
        sc_prims(c, SC_PRIM_INTEGER);
        grammar_printf(o, "%s ::= integer\n", name);
        return;
    }
    if (has_lo && has_hi && lo > hi) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "minimum above maximum: no integer is valid");
        return;
    }
    int64_t a = (int64_t)lo, b = (int64_t)hi;
    grammar_printf(o, "%s ::= (", name);
    if (!has_lo && !has_hi) bytebuf_puts(o, "\"-\"? integral");
    else if (has_lo && !has_hi) {
        if (a >= 0) sc_nonneg(o, (uint64_t)a, -1);
        else {
            bytebuf_puts(o, "\"-\" (");
            sc_nonneg(o, 1, -a);
            bytebuf_puts(o, ") | integral");
        }
    } else if (!has_lo && has_hi) {
        if (b >= 0) {
            bytebuf_puts(o, "\"-\" [1-9] [0-9]{0,15} | ");
            sc_nonneg(o, 0, b);
        } else {
            bytebuf_puts(o, "\"-\" (");
            sc_nonneg(o, (uint64_t)-b, -1);
            bytebuf_puts(o, ")");
        }
    } else if (a >= 0) sc_nonneg(o, (uint64_t)a, b);
    else if (b < 0) {
        bytebuf_puts(o, "\"-\" (");
        sc_nonneg(o, (uint64_t)-b, -a);
        bytebuf_puts(o, ")");
    } else {
        bytebuf_puts(o, "\"-\" (");
        sc_nonneg(o, 1, -a);
        bytebuf_puts(o, ") | ");
        sc_nonneg(o, 0, b);
    }
    bytebuf_puts(o, ") space\n");
}

/* The integer bounds of s (minimum / maximum / exclusive forms of draft 4 and later). */
static void sc_int_bounds(json_t *s, bool *has_lo, double *lo, bool *has_hi, double *hi)
{
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    json_t *xmn = json_object_get(s, "exclusiveMinimum"), *xmx = json_object_get(s, "exclusiveMaximum");
    *has_lo = *has_hi = false;
    if (json_is_number(mn)) {
        *has_lo = true;
        double v = json_number_value(mn);
        *lo = json_is_true(xmn) ? floor(v) + 1 : ceil(v);
    }
    if (json_is_number(xmn)) {
        double v = floor(json_number_value(xmn)) + 1;
        *lo = *has_lo ? fmax(*lo, v) : v;
        *has_lo = true;
    }
    if (json_is_number(mx)) {
        *has_hi = true;
        double v = json_number_value(mx);
        *hi = json_is_true(xmx) ? ceil(v) - 1 : floor(v);
    }
    if (json_is_number(xmx)) {
        double v = ceil(json_number_value(xmx)) - 1;
        *hi = *has_hi ? fmin(*hi, v) : v;
        *has_hi = true;
    }
}

/* ---- the types ----------------------------------------------------------------------- */

static void sc_string(sc *c, json_t *s, const char *name)
{
    bytebuf *o = &c->out;
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    sc_prims(c, SC_PRIM_CHAR);
    if (pat && (mn || mx || fmt)) {
        sc_fail(c, GRAMMAR_ERR_UNSUPPORTED, "%s", "pattern together with minLength/maxLength/format is not supported");
        return;
    }
    if (json_is_string(pat)) {
        char *rn = sc_name(c, "pattern");
        grammar_status st;
        if (!grammar_regex_rule(o, rn, json_string_value(pat), json_string_length(pat), true, true, &st,
                                c->err, c->errsz)) {
            c->failed = true;
            c->st = st;
            free(rn);
            return;
        }
        grammar_printf(o, "%s ::= \"\\\"\" %s \"\\\"\" space\n", name, rn);
        free(rn);
        return;
    }
    if (fmt) {
        const char *f = json_string_value(fmt);
        const char *body = NULL;
        if (f && !strcmp(f, "date")) body = "date";
        else if (f && !strcmp(f, "time")) body = "time";
        else if (f && !strcmp(f, "date-time")) body = "date \"T\" time";
        else if (f && !strcmp(f, "uuid"))
            body = "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}";
        else if (f && !strcmp(f, "ipv4"))
            body = "ipv4-octet \".\" ipv4-octet \".\" ipv4-octet \".\" ipv4-octet";
        if (!body) {
            char what[120];
            snprintf(what, sizeof what, "format '%.80s'", f ? f : "?");
            sc_unsupported(c, what);
            return;
        }
        if (mn || mx) {
            sc_fail(c, GRAMMAR_ERR_UNSUPPORTED, "%s", "format together with minLength/maxLength is not supported");
            return;
        }
        if (!strncmp(body, "date", 4) || !strcmp(body, "time")) sc_prims(c, SC_PRIM_DATE);
        if (!strncmp(body, "ipv4", 4) && !strstr(c->out.p ? c->out.p : "", "ipv4-octet ::="))
            bytebuf_puts(o, "ipv4-octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]\n");
        grammar_printf(o, "%s ::= \"\\\"\" %s \"\\\"\" space\n", name, body);
        return;
    }
    long lo = json_is_integer(mn) ? (long)json_integer_value(mn) : 0;
    long hi = json_is_integer(mx) ? (long)json_integer_value(mx) : -1;
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || lo < 0 || lo > 100000 || hi > 100000) {
        sc_fail(c, GRAMMAR_ERR_UNSUPPORTED, "%s", "minLength/maxLength must be whole numbers up to 100000");
        return;
    }
    if (hi >= 0 && hi < lo) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "maxLength below minLength: no string is valid");
        return;
    }
    if (lo == 0 && hi < 0) grammar_printf(o, "%s ::= \"\\\"\" char* \"\\\"\" space\n", name);
    else if (hi < 0) grammar_printf(o, "%s ::= \"\\\"\" char{%ld,} \"\\\"\" space\n", name, lo);
    else grammar_printf(o, "%s ::= \"\\\"\" char{%ld,%ld} \"\\\"\" space\n", name, lo, hi);
}

static void sc_number(sc *c, json_t *s, const char *name, bool integer)
{
    bool has_lo, has_hi;
    double lo = 0, hi = 0;
    sc_int_bounds(s, &has_lo, &lo, &has_hi, &hi);
    sc_prims(c, SC_PRIM_NUMBER);
    if (integer) {
        if (!has_lo && !has_hi) {
            sc_prims(c, SC_PRIM_INTEGER);
            grammar_printf(&c->out, "%s ::= integer\n", name);
        } else sc_int_range(c, name, has_lo, lo, has_hi, hi);
        return;
    }
    json_t *mn = json_object_get(s, "minimum");
    bool only_min0 = json_is_number(mn) && json_number_value(mn) == 0 && !json_is_true(json_object_get(s, "exclusiveMinimum")) &&
                     !json_object_get(s, "maximum") && !json_is_number(json_object_get(s, "exclusiveMinimum")) &&
                     !json_object_get(s, "exclusiveMaximum");
    if (!has_lo && !has_hi) grammar_printf(&c->out, "%s ::= number\n", name);
    else if (only_min0)
        grammar_printf(&c->out, "%s ::= integral (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space\n", name);
    else sc_fail(c, GRAMMAR_ERR_UNSUPPORTED, "%s",
                 "minimum/maximum on a non-integer number are supported only as \"minimum\": 0; use type integer");
}

static void sc_object(sc *c, json_t *s, const char *name)
{
    bytebuf *o = &c->out;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "properties must be an object");
        return;
    }
    if (req && !json_is_array(req)) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "required must be an array");
        return;
    }
    /* the members: declared properties, then required names not declared */
    int n = (int)json_object_size(props) + (int)json_array_size(req);
    const char **keys = xmalloc((size_t)(n ? n : 1) * sizeof *keys);
    json_t **schemas = xmalloc((size_t)(n ? n : 1) * sizeof *schemas);
    bool *required = xcalloc((size_t)(n ? n : 1), sizeof *required);
    int k = 0;
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) {
        keys[k] = key;
        schemas[k] = v;
        k++;
    }
    size_t i;
    json_array_foreach(req, i, v) {
        const char *r = json_string_value(v);
        if (!r) continue;
        int j = 0;
        while (j < k && strcmp(keys[j], r)) j++;
        if (j == k) {
            keys[k] = r;
            schemas[k] = json_object_get(s, "additionalProperties");
            if (!schemas[k] || json_is_false(schemas[k])) schemas[k] = NULL;
            k++;
        }
        required[j] = true;
    }
    n = k;
    /* member rules */
    char **kv = xcalloc((size_t)(n ? n : 1), sizeof *kv);
    for (int j = 0; j < n && !c->failed; j++) {
        const char *vn = schemas[j] ? sc_visit(c, schemas[j], keys[j]) : (sc_prims(c, SC_PRIM_VALUE), "value");
        kv[j] = sc_name(c, "kv");
        grammar_printf(o, "%s ::= ", kv[j]);
        bytebuf enc = { 0 };
        jsonfmt_write_string(&enc, keys[j], strlen(keys[j]));
        sc_literal(o, enc.p, enc.len);
        bytebuf_free(&enc);
        grammar_printf(o, " space \":\" space %s\n", vn);
    }
    /* additional members: a key none of the declared ones, then a value */
    char *add = NULL;
    if (!c->failed && !json_is_false(addl)) {
        const char *vn = addl && !json_is_true(addl) ? sc_visit(c, addl, "additional") : (sc_prims(c, SC_PRIM_VALUE), "value");
        sc_prims(c, SC_PRIM_KEYCHAR);
        add = sc_name(c, "additional-kv");
        char *keyr = sc_name(c, "additional-key");
        /* not-one-of over a trie of the declared names, one rule per trie node (by prefix) */
        grammar_printf(o, "%s ::= \"\\\"\" %s-0 \"\\\"\" space \":\" space %s\n", add, keyr, vn);
        /* node ids: prefixes of declared keys; emit recursively by prefix string */
        int n_nodes = 0;
        char **pre = xmalloc(sizeof *pre * 1);
        pre[n_nodes++] = xstrdup("");
        for (int p = 0; p < n_nodes; p++) {
            size_t pl = strlen(pre[p]);
            bool is_word = false;
            for (int j = 0; j < n; j++) is_word |= !strcmp(keys[j], pre[p]);
            /* children: distinct next characters of keys extending this prefix */
            uint32_t nxt[256];
            int nlen[256], nn = 0;
            for (int j = 0; j < n && nn < 256; j++) {
                size_t kl = strlen(keys[j]);
                if (kl <= pl || memcmp(keys[j], pre[p], pl)) continue;
                int len;
                uint32_t ch = sc_utf8(keys[j] + pl, kl - pl, &len);
                if (ch == '"' || ch == '\\' || ch < 0x20) continue;  /* never written: keys have no escapes */
                bool seen = false;
                for (int q = 0; q < nn; q++) seen |= nxt[q] == ch;
                if (!seen) nxt[nn] = ch, nlen[nn++] = len;
            }
            grammar_printf(o, "%s-%d ::= ", keyr, p);
            /* a character that leaves every declared name: then anything */
            bytebuf_puts(o, "[^\"\\\\\\x7F\\x00-\\x1F");
            for (int q = 0; q < nn; q++) grammar_printf(o, "\\U%08X", nxt[q]);
            bytebuf_puts(o, "] keychar*");
            for (int q = 0; q < nn; q++) {
                char *np = xmalloc(pl + (size_t)nlen[q] + 1);
                memcpy(np, pre[p], pl);
                size_t kj = 0;  /* the key this character came from */
                for (int j = 0; j < n; j++) {
                    int len;
                    if (strlen(keys[j]) > pl && !memcmp(keys[j], pre[p], pl) &&
                        sc_utf8(keys[j] + pl, strlen(keys[j]) - pl, &len) == nxt[q]) {
                        kj = (size_t)j;
                        break;
                    }
                }
                memcpy(np + pl, keys[kj] + pl, (size_t)nlen[q]);
                np[pl + (size_t)nlen[q]] = 0;
                pre = xrealloc(pre, (size_t)(n_nodes + 1) * sizeof *pre);
                pre[n_nodes] = np;
                grammar_printf(o, " | \"\\U%08X\" %s-%d", nxt[q], keyr, n_nodes);
                n_nodes++;
            }
            if (!is_word) bytebuf_puts(o, " | \"\"");  /* may end here: not a declared name */
            bytebuf_putc(o, '\n');
        }
        for (int p = 0; p < n_nodes; p++) free(pre[p]);
        free(pre);
        free(keyr);
    }
    /* S_j^f (nothing written yet) and S_j^r (something written) for j = 0..n */
    if (!c->failed) {
        for (int j = n; j >= 0; j--) {
            if (j == n) {
                if (add) {
                    grammar_printf(o, "%s-f%d ::= (%s (\",\" space %s)*)?\n", name, j, add, add);
                    grammar_printf(o, "%s-r%d ::= (\",\" space %s)*\n", name, j, add);
                } else {
                    grammar_printf(o, "%s-f%d ::= \"\"\n", name, j);
                    grammar_printf(o, "%s-r%d ::= \"\"\n", name, j);
                }
                continue;
            }
            grammar_printf(o, "%s-f%d ::= %s %s-r%d", name, j, kv[j], name, j + 1);
            if (!required[j]) grammar_printf(o, " | %s-f%d", name, j + 1);
            grammar_printf(o, "\n%s-r%d ::= \",\" space %s %s-r%d", name, j, kv[j], name, j + 1);
            if (!required[j]) grammar_printf(o, " | %s-r%d", name, j + 1);
            bytebuf_putc(o, '\n');
        }
        grammar_printf(o, "%s ::= \"{\" space %s-f0 \"}\" space\n", name, name);
    }
    for (int j = 0; j < n; j++) free(kv[j]);
    free(kv);
    free(add);
    free(keys);
    free(schemas);
    free(required);
}

static void sc_array(sc *c, json_t *s, const char *name)
{
    bytebuf *o = &c->out;
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    long lo = json_is_integer(mn) ? (long)json_integer_value(mn) : 0;
    long hi = json_is_integer(mx) ? (long)json_integer_value(mx) : -1;
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || lo < 0 || lo > 10000 || hi > 10000) {
        sc_fail(c, GRAMMAR_ERR_UNSUPPORTED, "%s", "minItems/maxItems must be whole numbers up to 10000");
        return;
    }
    if (hi >= 0 && hi < lo) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "maxItems below minItems: no array is valid");
        return;
    }
    json_t *tuple = json_is_array(prefix) ? prefix : json_is_array(items) ? items : NULL;
    json_t *rest = tuple == prefix && prefix ? items : tuple ? addi : items;
    /* rest: NULL/true = any value, false = none, object = schema */
    const char *rn = NULL;
    if (!json_is_false(rest)) {
        if (!rest || json_is_true(rest)) {
            sc_prims(c, SC_PRIM_VALUE);
            rn = "value";
        } else rn = sc_visit(c, rest, "item");
    }
    int k = tuple ? (int)json_array_size(tuple) : 0;
    const char **pn = xmalloc((size_t)(k ? k : 1) * sizeof *pn);
    for (int i = 0; i < k && !c->failed; i++) pn[i] = sc_visit(c, json_array_get(tuple, (size_t)i), "tuple");
    if (c->failed) {
        free(pn);
        return;
    }
    if (!rn && hi < 0) hi = k;
    if (!rn && hi > k) hi = k;
    if (lo > (rn ? (hi < 0 ? lo : hi) : k)) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "minItems cannot be met: no array is valid");
        free(pn);
        return;
    }
    grammar_printf(o, "%s ::= \"[\" space ", name);
    if (k == 0) {
        if (hi == 0) ;
        else if (lo == 0) {
            grammar_printf(o, "(%s (\",\" space %s)", rn, rn);
            if (hi < 0) bytebuf_puts(o, "*)?");
            else grammar_printf(o, "{0,%ld})?", hi - 1);
        } else {
            grammar_printf(o, "%s (\",\" space %s)", rn, rn);
            if (hi < 0) grammar_printf(o, "{%ld,}", lo - 1);
            else grammar_printf(o, "{%ld,%ld}", lo - 1, hi - 1);
        }
    } else {
        /* P1 ("," P2 ( ... ("," rest){a,b} )? )? with the first lo items mandatory */
        int n_open = 0;
        long top = hi < 0 ? -1 : hi;
        for (int i = 0; i < k && (top < 0 || i < top); i++) {
            if (i >= lo) {
                bytebuf_puts(o, "(");
                n_open++;
            }
            if (i > 0) bytebuf_puts(o, "\",\" space ");
            grammar_printf(o, "%s ", pn[i]);
        }
        if (rn && (top < 0 || top > k)) {
            long a = TM_MAX(0, lo - k), b = top < 0 ? -1 : top - k;
            if (b < 0) grammar_printf(o, "(\",\" space %s){%ld,}", rn, a);
            else grammar_printf(o, "(\",\" space %s){%ld,%ld}", rn, a, b);
        }
        for (int i = 0; i < n_open; i++) bytebuf_puts(o, ")?");
    }
    bytebuf_puts(o, " \"]\" space\n");
    free(pn);
}

/* ---- dispatch ------------------------------------------------------------------------ */

static const char *const sc_annotations[] = {
    "title", "description", "default", "examples", "$schema", "$id", "id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "strict", "name", NULL,
};
static const char *const sc_keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "allOf", "$ref", "pattern", "format", "minLength",
    "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "uniqueItems", NULL,
};

static bool sc_in(const char *const *list, const char *k)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return true;
    return false;
}

/* Resolves a local JSON pointer ("#", "#/a/b" with ~0 ~1 and %XX). */
static json_t *sc_resolve(sc *c, const char *ref)
{
    if (ref[0] != '#') return NULL;
    json_t *cur = c->root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
                char h[3] = { p[1], p[2], 0 };
                tok[n++] = (char)strtol(h, NULL, 16);
                p += 3;
            } else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *e;
            long idx = strtol(tok, &e, 10);
            cur = *e || idx < 0 ? NULL : json_array_get(cur, (size_t)idx);
        } else cur = NULL;
    }
    return *p ? NULL : cur;
}

static bool sc_has_any(json_t *s, const char *const *kws)
{
    for (int i = 0; kws[i]; i++)
        if (json_object_get(s, kws[i])) return true;
    return false;
}

static const char *const sc_kw_object[] = { "properties", "required", "additionalProperties", NULL };
static const char *const sc_kw_array[] = { "items", "prefixItems", "additionalItems", "minItems", "maxItems", NULL };
static const char *const sc_kw_string[] = { "pattern", "format", "minLength", "maxLength", NULL };
static const char *const sc_kw_number[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL };

static void sc_type(sc *c, json_t *s, const char *t, const char *name)
{
    if (!strcmp(t, "string")) sc_string(c, s, name);
    else if (!strcmp(t, "integer")) sc_number(c, s, name, true);
    else if (!strcmp(t, "number")) sc_number(c, s, name, false);
    else if (!strcmp(t, "object")) sc_object(c, s, name);
    else if (!strcmp(t, "array")) sc_array(c, s, name);
    else if (!strcmp(t, "boolean")) grammar_printf(&c->out, "%s ::= (\"true\" | \"false\") space\n", name);
    else if (!strcmp(t, "null")) grammar_printf(&c->out, "%s ::= \"null\" space\n", name);
    else sc_fail(c, GRAMMAR_ERR_INVALID, "unknown type '%s'", t);
}

/* Whether a JSON value is of a type named by a schema's "type" (absent: any). */
static bool sc_type_matches(json_t *type, json_t *v)
{
    if (!type) return true;
    if (json_is_array(type)) {
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t)
            if (sc_type_matches(t, v)) return true;
        return false;
    }
    const char *t = json_string_value(type);
    if (!t) return false;
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

/* A $ref: one rule per distinct reference (so a recursive schema is a recursive rule), its
 * target visited once. */
static void sc_visit_ref(sc *c, json_t *ref, const char *name)
{
    bytebuf *o = &c->out;
    const char *r = json_string_value(ref);
    if (!r) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "$ref must be a string");
        return;
    }
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].ref && !strcmp(c->refs[i].ref, r)) {
            grammar_printf(o, "%s ::= %s\n", name, c->refs[i].name);
            return;
        }
    json_t *target = sc_resolve(c, r);
    if (!target) {
        sc_fail(c, r[0] == '#' ? GRAMMAR_ERR_INVALID : GRAMMAR_ERR_UNSUPPORTED,
                r[0] == '#' ? "$ref '%s' does not resolve" : "$ref '%s': only local references (#...) are supported", r);
        return;
    }
    char *rn = sc_name(c, "ref");
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 32;
        c->refs = xrealloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
    }
    c->refs[c->n_refs++] = (sc_ref){ xstrdup(r), rn };
    grammar_printf(o, "%s ::= %s\n", name, rn);
    sc_visit_into(c, target, rn);
}

/* const / enum: the values as JSON literals (an enum's values of the schema's type only). */
static void sc_enum(sc *c, json_t *s, json_t *cst, json_t *en, const char *name)
{
    bytebuf *o = &c->out;
    json_t *v;
    if (cst) {
        grammar_printf(o, "%s ::= ", name);
        sc_json_literal(o, cst);
        bytebuf_puts(o, " space\n");
        return;
    }
    if (!json_is_array(en) || json_array_size(en) == 0) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "enum must be a non-empty array");
        return;
    }
    grammar_printf(o, "%s ::= (", name);
    size_t i;
    int n_out = 0;
    json_array_foreach(en, i, v) {
        if (!sc_type_matches(json_object_get(s, "type"), v)) continue;
        if (n_out++) bytebuf_puts(o, " | ");
        sc_json_literal(o, v);
    }
    if (!n_out) sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "no enum value has the schema's type");
    bytebuf_puts(o, ") space\n");
}

/* anyOf: a rule per alternative (next to type keywords refused: they would apply to all). */
static void sc_any_of(sc *c, json_t *s, json_t *any, const char *name)
{
    bytebuf *o = &c->out;
    if (!json_is_array(any) || json_array_size(any) == 0) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "anyOf must be a non-empty array");
        return;
    }
    if (json_object_get(s, "type") || sc_has_any(s, sc_kw_object) || sc_has_any(s, sc_kw_array) ||
        sc_has_any(s, sc_kw_string) || sc_has_any(s, sc_kw_number)) {
        sc_unsupported(c, "anyOf next to type keywords");
        return;
    }
    size_t n = json_array_size(any);
    const char **alts = xmalloc(n * sizeof *alts);
    for (size_t i = 0; i < n && !c->failed; i++) alts[i] = sc_visit(c, json_array_get(any, i), "any");
    if (!c->failed) {
        grammar_printf(o, "%s ::= ", name);
        for (size_t i = 0; i < n; i++) grammar_printf(o, "%s%s", i ? " | " : "", alts[i]);
        bytebuf_putc(o, '\n');
    }
    free(alts);
}

/* No type: the keywords constrain only their own type; without any, any value. */
static void sc_untyped(sc *c, json_t *s, const char *name)
{
    bytebuf *o = &c->out;
    const char *types[8];
    int nt = 0;
    bool ob = sc_has_any(s, sc_kw_object), ar = sc_has_any(s, sc_kw_array),
         st = sc_has_any(s, sc_kw_string), nu = sc_has_any(s, sc_kw_number);
    if (!ob && !ar && !st && !nu) {
        sc_prims(c, SC_PRIM_VALUE);
        grammar_printf(o, "%s ::= value\n", name);
        return;
    }
    static const char *const all_types[] = { "object", "array", "string", "number", "boolean", "null" };
    for (int i = 0; i < 6; i++) types[nt++] = all_types[i];
    sc_prims(c, SC_PRIM_VALUE);
    char **alts = xcalloc(6, sizeof *alts);
    grammar_printf(o, "%s ::= ", name);
    const char *generic[] = { "object", "array", "string", "number", NULL, NULL };
    bool constrained[] = { ob, ar, st, nu, true, true };
    for (int i = 0; i < 6; i++) {
        if (!constrained[i] && generic[i]) grammar_printf(o, "%s%s", i ? " | " : "", generic[i]);
        else {
            alts[i] = sc_name(c, types[i]);
            grammar_printf(o, "%s%s", i ? " | " : "", alts[i]);
        }
    }
    bytebuf_putc(o, '\n');
    for (int i = 0; i < 6 && !c->failed; i++)
        if (alts[i]) sc_type(c, s, types[i], alts[i]);
    for (int i = 0; i < 6; i++) free(alts[i]);
    free(alts);
}

/* type (a name or a list of them), each type's keywords applying to it. */
static void sc_types(sc *c, json_t *s, const char *name)
{
    bytebuf *o = &c->out;
    json_t *v;
    json_t *type = json_object_get(s, "type");
    const char *types[8];
    int nt = 0;
    if (json_is_string(type)) types[nt++] = json_string_value(type);
    else if (json_is_array(type)) {
        size_t i;
        json_array_foreach(type, i, v) {
            if (!json_is_string(v) || nt == 7) {
                sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "type must be a string or an array of strings");
                return;
            }
            types[nt++] = json_string_value(v);
        }
        /* "number" covers "integer" */
        bool has_num = false;
        for (int j = 0; j < nt; j++) has_num |= !strcmp(types[j], "number");
        if (has_num) {
            int k = 0;
            for (int j = 0; j < nt; j++)
                if (strcmp(types[j], "integer")) types[k++] = types[j];
            nt = k;
        }
    } else if (type) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "type must be a string or an array of strings");
        return;
    } else {
        sc_untyped(c, s, name);
        return;
    }
    if (nt == 1) sc_type(c, s, types[0], name);
    else {
        char *alts[8] = { 0 };
        grammar_printf(o, "%s ::= ", name);
        for (int i = 0; i < nt; i++) {
            alts[i] = sc_name(c, types[i]);
            grammar_printf(o, "%s%s", i ? " | " : "", alts[i]);
        }
        bytebuf_putc(o, '\n');
        for (int i = 0; i < nt && !c->failed; i++) sc_type(c, s, types[i], alts[i]);
        for (int i = 0; i < nt; i++) free(alts[i]);
    }
}

/* One schema object: its keywords checked, then the first of $ref, allOf, const/enum, anyOf
 * and type that it has decides the rule. */
static void sc_schema(sc *c, json_t *s, const char *name)
{
    bytebuf *o = &c->out;
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        sc_prims(c, SC_PRIM_VALUE);
        grammar_printf(o, "%s ::= value\n", name);
        return;
    }
    if (json_is_false(s)) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "the schema false allows nothing");
        return;
    }
    if (!json_is_object(s)) {
        sc_fail(c, GRAMMAR_ERR_INVALID, "%s", "a schema must be an object or a boolean");
        return;
    }
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        if (sc_in(sc_annotations, key)) continue;
        if (!sc_in(sc_keywords, key)) sc_unsupported(c, key);
        else if (!strcmp(key, "uniqueItems") && json_is_true(v)) sc_unsupported(c, "uniqueItems");
        else if (!strcmp(key, "allOf") && (!json_is_array(v) || json_array_size(v) != 1))
            sc_unsupported(c, "allOf (of more than one schema)");
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        sc_visit_ref(c, ref, name);
        return;
    }
    json_t *all = json_object_get(s, "allOf");
    if (json_is_array(all) && json_array_size(all) == 1) {
        json_object_foreach(s, key, v)
            if (strcmp(key, "allOf") && !sc_in(sc_annotations, key)) sc_unsupported(c, "allOf next to other keywords");
        grammar_printf(o, "%s ::= %s\n", name, sc_visit(c, json_array_get(all, 0), "all"));
        return;
    }
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cst || en) {
        sc_enum(c, s, cst, en, name);
        return;
    }
    json_t *any = json_object_get(s, "anyOf");
    if (any) {
        sc_any_of(c, s, any, name);
        return;
    }
    sc_types(c, s, name);
}

static void sc_visit_into(sc *c, json_t *s, const char *name)
{
    sc_prims(c, 0);
    if (c->failed) return;
    if (++c->depth > 64) {
        sc_fail(c, GRAMMAR_ERR_UNSUPPORTED, "%s", "schema nested too deeply");
        return;
    }
    sc_schema(c, s, name);
    c->depth--;
}

char *grammar_schema_to_gbnf(const char *json, size_t len, grammar_status *st, char *err, size_t errsz)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY, &je);
    if (!root) {
        *st = GRAMMAR_ERR_SYNTAX;
        snprintf(err, errsz, "schema: not JSON: %s (line %d)", je.text, je.line);
        return NULL;
    }
    sc c = { .root = root, .err = err, .errsz = errsz };
    bytebuf_puts(&c.out, "root ::= schema\n");
    sc_visit_into(&c, root, "schema");
    if (!c.failed && c.unsupported.len) {
        c.failed = true;
        c.st = GRAMMAR_ERR_UNSUPPORTED;
        snprintf(err, errsz, "schema: unsupported keyword%s %s", strchr(c.unsupported.p, ',') ? "s" : "",
                 c.unsupported.p);
    }
    for (int i = 0; i < c.n_refs; i++) {
        free(c.refs[i].ref);
        free(c.refs[i].name);
    }
    free(c.refs);
    bytebuf_free(&c.unsupported);
    json_decref(root);
    if (c.failed) {
        *st = c.st;
        bytebuf_free(&c.out);
        return NULL;
    }
    *st = GRAMMAR_OK;
    return c.out.p;
}
