/*
 * windir: an entry per slot of a slottab (util/slottab.h), whose recency list is the FIFO by
 * report (the oldest report at its oldest end). See windir.h.
 */
#include "cluster/windir.h"

#include <stdlib.h>

#include "util/slottab.h"

typedef struct {
    uint64_t holders;            /* bit i: worker slot i holds it */
    double expiry;               /* seconds (util_now): the latest a holder reported */
} windir_ent;

struct windir {
    int n_max;
    windir_ent *e;               /* (n_max) */
    slottab tab;                 /* keys, the free list and the FIFO over e's slots */
    int n;                       /* entries held */
};

windir *windir_new(int max_entries)
{
    if (max_entries < 1 || max_entries > (1 << 24)) return NULL;
    windir *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->n_max = max_entries;
    d->e = calloc((size_t)max_entries, sizeof *d->e);
    if (!d->e || !slottab_init(&d->tab, max_entries)) {
        windir_free(d);
        return NULL;
    }
    return d;
}

void windir_free(windir *d)
{
    if (!d) return;
    free(d->e);
    slottab_free(&d->tab);
    free(d);
}

static void windir_remove(windir *d, int i)
{
    slottab_give(&d->tab, i);
    d->n--;
}

void windir_add(windir *d, const uint8_t key[32], int slot, double expiry)
{
    if (!d || slot < 0 || slot >= WINDIR_MAX_SLOTS) return;
    int i = slottab_find(&d->tab, key);
    if (i >= 0) {
        if (expiry < d->e[i].expiry) expiry = d->e[i].expiry;
    } else {
        if (d->n == d->n_max) {
            /* the oldest report goes: with the TTLs workers use, the first to expire */
            windir_remove(d, slottab_oldest(&d->tab));
        }
        i = slottab_take(&d->tab);
        slottab_set_key(&d->tab, i, key);
        d->e[i].holders = 0;
        d->n++;
    }
    d->e[i].holders |= 1ull << slot;
    d->e[i].expiry = expiry;
    slottab_touch(&d->tab, i);
}

void windir_drop(windir *d, const uint8_t key[32], int slot)
{
    if (!d || slot < 0 || slot >= WINDIR_MAX_SLOTS) return;
    int i = slottab_find(&d->tab, key);
    if (i < 0) return;
    d->e[i].holders &= ~(1ull << slot);
    if (!d->e[i].holders) windir_remove(d, i);
}

void windir_drop_worker(windir *d, int slot)
{
    if (!d || slot < 0 || slot >= WINDIR_MAX_SLOTS) return;
    for (int i = slottab_oldest(&d->tab); i >= 0;) {
        int nx = slottab_newer(&d->tab, i);
        d->e[i].holders &= ~(1ull << slot);
        if (!d->e[i].holders) windir_remove(d, i);
        i = nx;
    }
}

uint64_t windir_find(windir *d, const uint8_t key[32], double now)
{
    if (!d) return 0;
    int i = slottab_find(&d->tab, key);
    if (i < 0) return 0;
    if (now > d->e[i].expiry) {
        windir_remove(d, i);
        return 0;
    }
    return d->e[i].holders;
}

int windir_count(const windir *d) { return d ? d->n : 0; }
