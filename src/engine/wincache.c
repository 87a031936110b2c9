/*
 * wincache: fixed-size slots, a free list, an LRU (most recently used at the head) and a hash
 * map of chained slot indexes, all under one mutex. See wincache.h.
 */
#include "engine/wincache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

typedef struct {
    uint8_t key[32];
    double t_put;                /* seconds (util_now) of the put: expiry is t_put + ttl */
    int32_t hnext;               /* next slot in the bucket, -1 ends */
    int32_t prev, next;          /* LRU links (next also links the free list), -1 ends */
    bool used;
} wincache_slot;

struct wincache {
    wincache_opts o;
    pthread_mutex_t mu;
    int n_slots;
    uint8_t *data;               /* (n_slots, entry_bytes) */
    wincache_slot *slot;         /* (n_slots) */
    int32_t *bucket;             /* (mask + 1) hash heads, -1 empty */
    uint32_t mask;
    int32_t free_head, lru_head, lru_tail;
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
    uint32_t nb = 16;
    while (nb < 2 * n) nb <<= 1;
    c->mask = nb - 1;
    c->data = calloc(n + 1, o->entry_bytes);   /* pages faulted in as entries arrive */
    c->slot = calloc(n + 1, sizeof *c->slot);
    c->bucket = malloc(nb * sizeof *c->bucket);
    if (!c->data || !c->slot || !c->bucket) {
        wincache_free(c);
        return NULL;
    }
    for (uint32_t i = 0; i < nb; i++) c->bucket[i] = -1;
    for (int i = 0; i < c->n_slots; i++) {
        c->slot[i].hnext = c->slot[i].prev = -1;
        c->slot[i].next = i + 1 < c->n_slots ? i + 1 : -1;
    }
    c->free_head = c->n_slots ? 0 : -1;
    c->lru_head = c->lru_tail = -1;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void wincache_free(wincache *c)
{
    if (!c) return;
    if (c->bucket) pthread_mutex_destroy(&c->mu);
    free(c->data);
    free(c->slot);
    free(c->bucket);
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

static uint32_t wincache_hash(const wincache *c, const uint8_t key[32])
{
    uint32_t h;
    memcpy(&h, key, sizeof h);   /* a SHA-256: its bytes are uniform */
    return h & c->mask;
}

static int wincache_find(const wincache *c, const uint8_t key[32])
{
    for (int i = c->bucket[wincache_hash(c, key)]; i >= 0; i = c->slot[i].hnext)
        if (!memcmp(c->slot[i].key, key, 32)) return i;
    return -1;
}

static void wincache_lru_unlink(wincache *c, int i)
{
    wincache_slot *s = &c->slot[i];
    if (s->prev >= 0) c->slot[s->prev].next = s->next;
    else c->lru_head = s->next;
    if (s->next >= 0) c->slot[s->next].prev = s->prev;
    else c->lru_tail = s->prev;
    s->prev = s->next = -1;
}

static void wincache_lru_push(wincache *c, int i)
{
    wincache_slot *s = &c->slot[i];
    s->prev = -1;
    s->next = c->lru_head;
    if (c->lru_head >= 0) c->slot[c->lru_head].prev = i;
    c->lru_head = i;
    if (c->lru_tail < 0) c->lru_tail = i;
}

/* Takes slot i out of the map and the LRU onto the free list. */
static void wincache_drop(wincache *c, int i)
{
    wincache_journal(c, c->slot[i].key, WINCACHE_EV_DROP);
    int32_t *pp = &c->bucket[wincache_hash(c, c->slot[i].key)];
    while (*pp != i) pp = &c->slot[*pp].hnext;
    *pp = c->slot[i].hnext;
    wincache_lru_unlink(c, i);
    c->slot[i].used = false;
    c->slot[i].hnext = -1;
    c->slot[i].next = c->free_head;
    c->free_head = i;
    c->st.n_entries--;
    c->st.bytes -= c->o.entry_bytes;
}

static void wincache_put_locked(wincache *c, const uint8_t key[32], const void *state, double now)
{
    int i = wincache_find(c, key);
    if (i >= 0) {
        wincache_lru_unlink(c, i);
    } else {
        /* expired entries at the LRU's tail go first, then the least recently used */
        while (c->lru_tail >= 0 && now - c->slot[c->lru_tail].t_put > c->o.ttl_s) {
            wincache_drop(c, c->lru_tail);
            c->st.n_expired++;
        }
        if (c->free_head < 0) {
            wincache_drop(c, c->lru_tail);
            c->st.n_evicted++;
        }
        i = c->free_head;
        c->free_head = c->slot[i].next;
        memcpy(c->slot[i].key, key, 32);
        uint32_t h = wincache_hash(c, key);
        c->slot[i].hnext = c->bucket[h];
        c->bucket[h] = i;
        c->slot[i].used = true;
        c->st.n_entries++;
        c->st.bytes += c->o.entry_bytes;
    }
    memcpy(c->data + (size_t)i * c->o.entry_bytes, state, c->o.entry_bytes);
    c->slot[i].t_put = now;
    wincache_lru_push(c, i);
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
    int i = wincache_find(c, key);
    if (i >= 0 && now - c->slot[i].t_put > c->o.ttl_s) {
        wincache_drop(c, i);
        c->st.n_expired++;
        i = -1;
    }
    if (i >= 0) {
        memcpy(dst, c->data + (size_t)i * c->o.entry_bytes, c->o.entry_bytes);
        wincache_lru_unlink(c, i);
        wincache_lru_push(c, i);
        c->st.n_hits++;
    } else {
        c->st.n_misses++;
    }
    pthread_mutex_unlock(&c->mu);
    return i >= 0;
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
    int i = wincache_find(c, key);
    bool ok = i >= 0 && now - c->slot[i].t_put <= c->o.ttl_s;
    if (ok) {
        memcpy(dst, c->data + (size_t)i * c->o.entry_bytes, c->o.entry_bytes);
        c->st.n_served++;
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

size_t wincache_entry_bytes(const wincache *c) { return c ? c->o.entry_bytes : 0; }
