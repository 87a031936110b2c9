/*
 * wincache: fixed-size slots whose keys, free list and LRU (the recency list) a slottab
 * (util/slottab.h) keeps, all under one mutex. See wincache.h.
 */
#include "engine/wincache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/slottab.h"
#include "util/util.h"

typedef struct {
    double t_put;                /* seconds (util_now) of the put: expiry is t_put + ttl */
} wincache_slot;

struct wincache {
    wincache_opts o;
    pthread_mutex_t mu;
    int n_slots;
    uint8_t *data;               /* (n_slots, entry_bytes) */
    wincache_slot *slot;         /* (n_slots) */
    slottab tab;                 /* keys, the free list and the LRU over the slots */
    wincache_stats st;
    wincache_event *jr;          /* (n_jr) journal ring, NULL when off */
    int n_jr, jr_head, jr_n;     /* capacity, oldest event, events held */
};

wincache *wincache_new(const wincache_opts *o)
{
    if (!o->entry_bytes) return NULL;
    size_t n = o->max_bytes / o->entry_bytes;   /* 0: nothing is kept, replays still counted */
    if (n > (1u << 24)) n = 1u << 24;
    wincache *c = xcalloc(1, sizeof *c);
    c->o = *o;
    if (c->o.ttl_s <= 0) c->o.ttl_s = 180;
    c->n_slots = (int)n;
    c->data = calloc(n + 1, o->entry_bytes);   /* pages faulted in as entries arrive */
    c->slot = calloc(n + 1, sizeof *c->slot);
    if (!c->data || !c->slot || !slottab_init(&c->tab, c->n_slots)) {
        wincache_free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void wincache_free(wincache *c)
{
    if (!c) return;
    if (c->tab.bucket) pthread_mutex_destroy(&c->mu);
    free(c->data);
    free(c->slot);
    slottab_free(&c->tab);
    free(c->jr);
    free(c);
}

/* Journals an event (mu held). */
static void wincache_journal(wincache *c, const uint8_t key[32], int op)
{
    if (!c->jr) return;
    if (c->jr_n == c->n_jr) {
        c->st.n_journal_lost++;
        return;
    }
    wincache_event *e = &c->jr[(c->jr_head + c->jr_n++) % c->n_jr];
    memcpy(e->key, key, 32);
    e->op = (uint8_t)op;
    e->ttl_ms = op == WINCACHE_EV_ADD ? (uint32_t)(c->o.ttl_s * 1000.0 < 4e9 ? c->o.ttl_s * 1000.0 : 4e9) : 0;
}

/* Takes slot i out of the map and the LRU onto the free list. */
static void wincache_drop(wincache *c, int i)
{
    wincache_journal(c, slottab_get_key(&c->tab, i), WINCACHE_EV_DROP);
    slottab_give(&c->tab, i);
    c->st.n_entries--;
    c->st.bytes -= c->o.entry_bytes;
}

static void wincache_put_locked(wincache *c, const uint8_t key[32], const void *state, double now)
{
    int i = slottab_find(&c->tab, key);
    if (i < 0) {
        /* expired entries at the LRU's oldest end go first, then the least recently used */
        int old;
        while ((old = slottab_oldest(&c->tab)) >= 0 && now - c->slot[old].t_put > c->o.ttl_s) {
            wincache_drop(c, old);
            c->st.n_expired++;
        }
        i = slottab_take(&c->tab);
        if (i < 0) {
            wincache_drop(c, slottab_oldest(&c->tab));
            c->st.n_evicted++;
            i = slottab_take(&c->tab);
        }
        slottab_set_key(&c->tab, i, key);
        c->st.n_entries++;
        c->st.bytes += c->o.entry_bytes;
    }
    memcpy(c->data + (size_t)i * c->o.entry_bytes, state, c->o.entry_bytes);
    c->slot[i].t_put = now;
    slottab_touch(&c->tab, i);
    c->st.n_puts++;
    wincache_journal(c, key, WINCACHE_EV_ADD);
}

void wincache_put(wincache *c, const uint8_t key[32], const void *state, double now)
{
    if (!c || !c->n_slots) return;
    pthread_mutex_lock(&c->mu);
    wincache_put_locked(c, key, state, now);
    pthread_mutex_unlock(&c->mu);
}

void wincache_put_fetched(wincache *c, const uint8_t key[32], const void *state, double now)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    if (c->n_slots) wincache_put_locked(c, key, state, now);
    c->st.n_fetches++;
    c->st.n_fetch_bytes += c->o.entry_bytes;
    pthread_mutex_unlock(&c->mu);
}

bool wincache_get(wincache *c, const uint8_t key[32], void *dst, double now)
{
    if (!c) return false;
    pthread_mutex_lock(&c->mu);
    int i = slottab_find(&c->tab, key);
    if (i >= 0 && now - c->slot[i].t_put > c->o.ttl_s) {
        wincache_drop(c, i);
        c->st.n_expired++;
        i = -1;
    }
    if (i >= 0) {
        memcpy(dst, c->data + (size_t)i * c->o.entry_bytes, c->o.entry_bytes);
        slottab_touch(&c->tab, i);
        c->st.n_hits++;
    } else {
        c->st.n_misses++;
    }
    pthread_mutex_unlock(&c->mu);
    return i >= 0;
}

bool wincache_contains(wincache *c, const uint8_t key[32], double now)
{
    if (!c) return false;
    pthread_mutex_lock(&c->mu);
    int i = slottab_find(&c->tab, key);
    bool ok = i >= 0 && now - c->slot[i].t_put <= c->o.ttl_s;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void wincache_count_replay(wincache *c, bool exact, int n)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    if (exact) c->st.n_replay_exact++;
    else c->st.n_replay_bounded++;
    c->st.n_replay_tokens += (uint64_t)n;
    pthread_mutex_unlock(&c->mu);
}

void wincache_get_stats(wincache *c, wincache_stats *st)
{
    if (!c) {
        memset(st, 0, sizeof *st);
        return;
    }
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    pthread_mutex_unlock(&c->mu);
}

void wincache_journal_start(wincache *c, int n)
{
    if (!c || n <= 0) return;
    pthread_mutex_lock(&c->mu);
    if (!c->jr) {
        c->jr = calloc((size_t)n, sizeof *c->jr);
        c->n_jr = c->jr ? n : 0;
    }
    pthread_mutex_unlock(&c->mu);
}

int wincache_events(wincache *c, wincache_event *out, int max)
{
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    int n = 0;
    while (n < max && c->jr_n > 0) {
        out[n++] = c->jr[c->jr_head];
        c->jr_head = (c->jr_head + 1) % c->n_jr;
        c->jr_n--;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

bool wincache_peek(wincache *c, const uint8_t key[32], void *dst, double now)
{
    if (!c) return false;
    pthread_mutex_lock(&c->mu);
    int i = slottab_find(&c->tab, key);
    bool ok = i >= 0 && now - c->slot[i].t_put <= c->o.ttl_s;
    if (ok) {
        memcpy(dst, c->data + (size_t)i * c->o.entry_bytes, c->o.entry_bytes);
        c->st.n_served++;
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

size_t wincache_entry_bytes(const wincache *c) { return c ? c->o.entry_bytes : 0; }
