/*
 * grammar_cache: compiled grammars kept by the SHA-256 of their kind and source, so that the
 * same schema sent by many requests is compiled once. See grammar.h.
 *
 * A slottab (util/slottab.h) over max_entries slots holds the keys and the recency list; the
 * grammars sit in g[], indexed by slot. Every listed slot holds a grammar: a hit moves it to
 * the newest end, a miss takes a free slot or the oldest, and trimming to cache_bytes drops
 * from the oldest end. c->mu guards all of it; compiles run outside it.
 */
#include "grammar/grammar_int.h"

#include <stdlib.h>
#include <string.h>

#include "util/sha256.h"
#include "util/slottab.h"
#include "util/util.h"

struct grammar_cache {
    pthread_mutex_t mu;
    slottab tab;            /* keys (SHA-256 of kind byte + source) and recency of the slots */
    grammar **g;            /* (tab.n) the grammar a listed slot holds, NULL when free */
    size_t *sz;             /* (tab.n) its grammar_bytes, measured by the last trim */
    int n;                  /* slots holding a grammar */
    uint64_t n_compiled, n_hits;
    size_t bytes;           /* grammar_bytes of the entries at the last lookup */
};

/* Frees slot i's grammar and gives the slot back. Under c->mu. */
static void grammar_cache_drop(grammar_cache *c, int i)
{
    grammar_free(c->g[i]);
    c->g[i] = NULL;
    slottab_give(&c->tab, i);
    c->n--;
}

/* Measures the entries (their memos grow while requests use them) and drops the least
 * recently used until they fit cache_bytes. Under c->mu. */
static void grammar_cache_trim(grammar_cache *c)
{
    size_t total = 0, budget = grammar_limits_get().cache_bytes;
    for (int i = slottab_oldest(&c->tab); i >= 0; i = slottab_newer(&c->tab, i))
        total += c->sz[i] = grammar_bytes(c->g[i]);
    while (c->n > 0 && total > budget) {
        int lru = slottab_oldest(&c->tab);
        total -= c->sz[lru];
        grammar_cache_drop(c, lru);
    }
    c->bytes = total;
}

grammar_cache *grammar_cache_new(int max_entries)
{
    grammar_cache *c = xcalloc(1, sizeof *c);
    int n = max_entries > 0 ? TM_MIN(max_entries, SLOTTAB_MAX) : 64;
    if (!slottab_init(&c->tab, n)) util_oom((size_t)n * (32 + 3 * sizeof(int32_t)));
    c->g = xcalloc((size_t)n, sizeof *c->g);
    c->sz = xcalloc((size_t)n, sizeof *c->sz);
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void grammar_cache_free(grammar_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->tab.n; i++) grammar_free(c->g[i]);
    free(c->g);
    free(c->sz);
    slottab_free(&c->tab);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

grammar_status grammar_cache_get(grammar_cache *c, grammar_kind kind, const char *src, size_t len,
                                 grammar **out, char *err, size_t errsz)
{
    uint8_t key[32];
    uint8_t kb = (uint8_t)kind;
    sha256_part parts[] = { { &kb, 1 }, { src, len } };
    sha256_parts(parts, 2, key);
    pthread_mutex_lock(&c->mu);
    int i = slottab_find(&c->tab, key);
    if (i >= 0) {
        slottab_touch(&c->tab, i);
        c->n_hits++;
        *out = grammar_ref(c->g[i]);
        grammar_cache_trim(c);
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
    i = slottab_find(&c->tab, key);   /* compiled meanwhile by another thread: keep that one */
    if (i < 0) {
        i = slottab_take(&c->tab);
        if (i < 0) {
            grammar_cache_drop(c, slottab_oldest(&c->tab));
            i = slottab_take(&c->tab);
        }
        slottab_set_key(&c->tab, i, key);
        c->g[i] = grammar_ref(g);
        c->n++;
    }
    slottab_touch(&c->tab, i);
    grammar_cache_trim(c);  /* (a grammar larger than the whole budget is dropped at once) */
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

void grammar_cache_usage(grammar_cache *c, int *n_entries, size_t *bytes)
{
    pthread_mutex_lock(&c->mu);
    grammar_cache_trim(c);
    *n_entries = c->n;
    *bytes = c->bytes;
    pthread_mutex_unlock(&c->mu);
}

