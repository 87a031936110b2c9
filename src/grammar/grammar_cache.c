/*
 * grammar_cache: compiled grammars kept by the SHA-256 of their kind and source, so that the
 * same schema sent by many requests is compiled once. See grammar.h.
 */
#include "grammar/grammar_int.h"

#include <stdlib.h>
#include <string.h>

#include "util/sha256.h"
#include "util/util.h"

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
    size_t bytes;           /* grammar_bytes of the entries at the last lookup */
};

/* Drops entry i (the last one moves into its place). Under c->mu. */
static void grammar_cache_drop(grammar_cache *c, int i)
{
    grammar_free(c->e[i].g);
    c->e[i] = c->e[--c->n];
    memset(&c->e[c->n], 0, sizeof c->e[c->n]);
}

/* Measures the entries (their memos grow while requests use them) and drops the least
 * recently used until they fit cache_bytes. Under c->mu. */
static void grammar_cache_trim(grammar_cache *c)
{
    size_t *sz = xmalloc((size_t)(c->n ? c->n : 1) * sizeof *sz);
    size_t total = 0;
    for (int i = 0; i < c->n; i++) total += sz[i] = grammar_bytes(c->e[i].g);
    while (c->n > 0 && total > grammar_limits_get().cache_bytes) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].last_use < c->e[lru].last_use) lru = i;
        total -= sz[lru];
        sz[lru] = sz[c->n - 1];
        grammar_cache_drop(c, lru);
    }
    c->bytes = total;
    free(sz);
}

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
    uint8_t kb = (uint8_t)kind;
    sha256_part parts[] = { { &kb, 1 }, { src, len } };
    sha256_parts(parts, 2, key);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (!memcmp(c->e[i].key, key, 32)) {
            c->e[i].last_use = ++c->tick;
            c->n_hits++;
            *out = grammar_ref(c->e[i].g);
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

