/*
 * windir: fixed slots, a free list, a FIFO by report (oldest at the head) and a hash map of
 * chained slot indexes. See windir.h.
 */
#include "cluster/windir.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t key[32];
    uint64_t holders;            /* bit i: worker slot i holds it */
    double expiry;               /* seconds (util_now): the latest a holder reported */
    int32_t hnext;               /* next in the bucket, -1 ends */
    int32_t prev, next;          /* FIFO links (next also links the free list), -1 ends */
} windir_ent;

struct windir {
    int n_max;
    windir_ent *e;               /* (n_max) */
    int32_t *bucket;             /* (mask + 1) hash heads, -1 empty */
    uint32_t mask;
    int32_t free_head, head, tail;   /* free list; FIFO oldest, newest */
    int n;                       /* entries held */
};

windir *windir_new(int max_entries)
{
    if (max_entries < 1 || max_entries > (1 << 24)) return NULL;
    windir *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    uint32_t nb = 16;
    while (nb < 2u * (uint32_t)max_entries) nb <<= 1;
    d->n_max = max_entries;
    d->mask = nb - 1;
    d->e = calloc((size_t)max_entries, sizeof *d->e);
    d->bucket = malloc(nb * sizeof *d->bucket);
    if (!d->e || !d->bucket) {
        windir_free(d);
        return NULL;
    }
    for (uint32_t i = 0; i < nb; i++) d->bucket[i] = -1;
    for (int i = 0; i < max_entries; i++) {
        d->e[i].hnext = d->e[i].prev = -1;
        d->e[i].next = i + 1 < max_entries ? i + 1 : -1;
    }
    d->head = d->tail = -1;
    return d;
}

void windir_free(windir *d)
{
    if (!d) return;
    free(d->e);
    free(d->bucket);
    free(d);
}

static uint32_t windir_hash(const windir *d, const uint8_t key[32])
{
    uint32_t h;
    memcpy(&h, key, sizeof h);   /* a SHA-256: its bytes are uniform */
    return h & d->mask;
}

static int windir_find_idx(const windir *d, const uint8_t key[32])
{
    for (int i = d->bucket[windir_hash(d, key)]; i >= 0; i = d->e[i].hnext)
        if (!memcmp(d->e[i].key, key, 32)) return i;
    return -1;
}

static void windir_fifo_unlink(windir *d, int i)
{
    windir_ent *x = &d->e[i];
    if (x->prev >= 0) d->e[x->prev].next = x->next;
    else d->head = x->next;
    if (x->next >= 0) d->e[x->next].prev = x->prev;
    else d->tail = x->prev;
    x->prev = x->next = -1;
}

static void windir_fifo_append(windir *d, int i)
{
    windir_ent *x = &d->e[i];
    x->next = -1;
    x->prev = d->tail;
    if (d->tail >= 0) d->e[d->tail].next = i;
    d->tail = i;
    if (d->head < 0) d->head = i;
}

static void windir_remove(windir *d, int i)
{
    int32_t *pp = &d->bucket[windir_hash(d, d->e[i].key)];
    while (*pp != i) pp = &d->e[*pp].hnext;
    *pp = d->e[i].hnext;
    windir_fifo_unlink(d, i);
    d->e[i].hnext = -1;
    d->e[i].next = d->free_head;
    d->free_head = i;
    d->n--;
}

void windir_add(windir *d, const uint8_t key[32], int slot, double expiry)
{
    if (!d || slot < 0 || slot >= WINDIR_MAX_SLOTS) return;
    int i = windir_find_idx(d, key);
    if (i >= 0) {
        windir_fifo_unlink(d, i);
        if (expiry < d->e[i].expiry) expiry = d->e[i].expiry;
    } else {
        if (d->n == d->n_max) {
            /* the oldest report goes: with the TTLs workers use, the first to expire */
            windir_remove(d, d->head);
        }
        i = d->free_head;
        d->free_head = d->e[i].next;
        memcpy(d->e[i].key, key, 32);
        uint32_t h = windir_hash(d, key);
        d->e[i].hnext = d->bucket[h];
        d->bucket[h] = i;
        d->e[i].holders = 0;
        d->n++;
    }
    d->e[i].holders |= 1ull << slot;
    d->e[i].expiry = expiry;
    windir_fifo_append(d, i);
}

void windir_drop(windir *d, const uint8_t key[32], int slot)
{
    if (!d || slot < 0 || slot >= WINDIR_MAX_SLOTS) return;
    int i = windir_find_idx(d, key);
    if (i < 0) return;
    d->e[i].holders &= ~(1ull << slot);
    if (!d->e[i].holders) windir_remove(d, i);
}

void windir_drop_worker(windir *d, int slot)
{
    if (!d || slot < 0 || slot >= WINDIR_MAX_SLOTS) return;
    for (int i = d->head; i >= 0;) {
        int nx = d->e[i].next;
        d->e[i].holders &= ~(1ull << slot);
        if (!d->e[i].holders) windir_remove(d, i);
        i = nx;
    }
}

uint64_t windir_find(windir *d, const uint8_t key[32], double now)
{
    if (!d) return 0;
    int i = windir_find_idx(d, key);
    if (i < 0) return 0;
    if (now > d->e[i].expiry) {
        windir_remove(d, i);
        return 0;
    }
    return d->e[i].holders;
}

int windir_count(const windir *d) { return d ? d->n : 0; }
