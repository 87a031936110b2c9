/*
 * grammar: the module's entry points and the compiled form: status names, the process-wide
 * budgets and cancel hook, grammar_compile (a front end's GBNF text, then grammar_gbnf.c's
 * parser), and the compiled grammar's accessors and reference count. The rest of the module,
 * one job a file: grammar_gbnf.c (GBNF text -> compiled form), grammar_pda.c (the pushdown
 * automaton over bytes), grammar_match.c (tokens), grammar_regex.c and grammar_schema.c
 * (front ends), grammar_cache.c (compiled grammars by their source). See grammar.h and
 * grammar_int.h.
 */
#include "grammar/grammar_int.h"

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
    case GRAMMAR_ERR_LIMIT: return "over a limit";
    }
    return "?";
}

static grammar_limits grammar_lim = { GRAMMAR_DEFAULT_MAX_STATES, GRAMMAR_DEFAULT_MAX_STACKS,
                                      GRAMMAR_DEFAULT_MAX_SECONDS, GRAMMAR_DEFAULT_CACHE_BYTES };

void grammar_limits_set(const grammar_limits *l)
{
    grammar_lim.max_states = l->max_states > 0 ? l->max_states : GRAMMAR_DEFAULT_MAX_STATES;
    grammar_lim.max_stacks = l->max_stacks > 0 ? l->max_stacks : GRAMMAR_DEFAULT_MAX_STACKS;
    grammar_lim.max_seconds = l->max_seconds > 0 ? l->max_seconds : GRAMMAR_DEFAULT_MAX_SECONDS;
    grammar_lim.cache_bytes = l->cache_bytes > 0 ? l->cache_bytes : GRAMMAR_DEFAULT_CACHE_BYTES;
}

grammar_limits grammar_limits_get(void)
{
    return grammar_lim;
}

static __thread grammar_cancel_fn grammar_cancel;
static __thread void *grammar_cancel_ctx;

void grammar_cancel_set(grammar_cancel_fn fn, void *ctx)
{
    grammar_cancel = fn;
    grammar_cancel_ctx = ctx;
}

bool grammar_cancelled(void)
{
    return grammar_cancel && grammar_cancel(grammar_cancel_ctx);
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

/* ---- compiled form ------------------------------------------------------------------- */

int grammar_n_rules(const grammar *g)
{
    return g->n_rules;
}

int grammar_n_states(const grammar *g)
{
    return g->n_el;
}

size_t grammar_bytes(grammar *g)
{
    size_t b = sizeof *g + (size_t)(g->n_el + 2) * sizeof *g->el + (size_t)g->n_rules * sizeof *g->rule_start +
               (size_t)g->n_sets * sizeof *g->sets +
               (size_t)(g->start.cap_data + g->start.cap_stacks + 2 * g->start.ht_cap) * sizeof(uint32_t);
    pthread_mutex_lock(&g->mu);
    b += g->ci_bytes + (size_t)g->ci_cap * sizeof *g->ci;
    for (int i = 0; i < GRAMMAR_MASK_CACHE; i++)
        if (g->cache[i].mask) b += (size_t)(g->cache[i].n_key + g->cache[i].n_mask) * sizeof(uint32_t);
    pthread_mutex_unlock(&g->mu);
    return b;
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
    case GRAMMAR_KIND_REGEX: {  /* (the regex parser reads counts with strtol: a terminated copy) */
        char *z = xmalloc(len + 1);
        memcpy(z, src, len);
        z[len] = 0;
        char *t = grammar_regex_to_gbnf(z, len, st, err, errsz);
        free(z);
        return t;
    }
    case GRAMMAR_KIND_SCHEMA: return grammar_schema_to_gbnf(src, len, st, err, errsz);
    }
    *st = GRAMMAR_ERR_INVALID;
    snprintf(err, errsz, "unknown grammar kind");
    return NULL;
}

grammar_status grammar_compile(grammar_kind kind, const char *src, size_t len, grammar **out,
                               char *err, size_t errsz)
{
    *out = NULL;
    grammar_status st;
    double deadline = util_now() + grammar_lim.max_seconds;
    char *text = grammar_to_gbnf(kind, src, len, &st, err, errsz);
    if (!text) return st;
    st = grammar_gbnf_compile(text, strlen(text), deadline, out, err, errsz);
    if (st != GRAMMAR_OK && st != GRAMMAR_ERR_LIMIT && kind != GRAMMAR_KIND_GBNF) {
        /* a front end wrote bad GBNF: say so, it is our bug, not the user's */
        size_t n = strlen(err);
        snprintf(err + n, errsz - n, " (in the grammar compiled from the %s)",
                 kind == GRAMMAR_KIND_REGEX ? "regex" : "schema");
    }
    free(text);
    return st;
}
