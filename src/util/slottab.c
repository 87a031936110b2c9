/*
 * slottab: a free list, a recency list and a chained hash map over n fixed slots. See
 * slottab.h.
 */
#include "util/slottab.h"

#include <stdlib.h>
#include <string.h>

bool slottab_init(slottab *t, int n)
{
    memset(t, 0, sizeof *t);
    if (n < 0 || n > SLOTTAB_MAX) return false;
    uint32_t nb = 16;
    while (nb < 2u * (uint32_t)n && nb < (1u << 30)) nb <<= 1;
    size_t ns = n ? (size_t)n : 1;   /* malloc(0) may answer NULL */
    t->n = n;
    t->mask = nb - 1;
    t->bucket = malloc(nb * sizeof *t->bucket);
    t->key = malloc(ns * sizeof *t->key);
    t->hnext = malloc(ns * sizeof *t->hnext);
    t->prev = malloc(ns * sizeof *t->prev);
    t->next = malloc(ns * sizeof *t->next);
    if (!t->bucket || !t->key || !t->hnext || !t->prev || !t->next) {
        slottab_free(t);
        return false;
    }
    for (uint32_t b = 0; b < nb; b++) t->bucket[b] = -1;
    for (int i = 0; i < n; i++) {
        t->hnext[i] = SLOTTAB_UNKEYED;
        t->prev[i] = SLOTTAB_FREE;
        t->next[i] = i + 1 < n ? i + 1 : -1;
    }
    t->free_head = n ? 0 : -1;
    t->oldest = t->newest = -1;
    return true;
}

void slottab_free(slottab *t)
{
    free(t->bucket);
    free(t->key);
    free(t->hnext);
    free(t->prev);
    free(t->next);
    memset(t, 0, sizeof *t);
}

int slottab_take(slottab *t)
{
    int i = t->free_head;
    if (i < 0) return -1;
    t->free_head = t->next[i];
    t->prev[i] = SLOTTAB_HELD;
    t->next[i] = -1;
    return i;
}

void slottab_give(slottab *t, int i)
{
    if (t->prev[i] == SLOTTAB_FREE) return;
    slottab_clear_key(t, i);
    slottab_unlink(t, i);
    t->prev[i] = SLOTTAB_FREE;
    t->next[i] = t->free_head;
    t->free_head = i;
}

static uint32_t slottab_hash(const slottab *t, const uint8_t key[32])
{
    uint32_t h;
    memcpy(&h, key, sizeof h);   /* a digest: its bytes are uniform */
    return h & t->mask;
}

int slottab_find(const slottab *t, const uint8_t key[32])
{
    if (!t->bucket) return -1;
    for (int i = t->bucket[slottab_hash(t, key)]; i >= 0; i = t->hnext[i])
        if (!memcmp(t->key[i], key, 32)) return i;
    return -1;
}

void slottab_set_key(slottab *t, int i, const uint8_t key[32])
{
    if (t->hnext[i] != SLOTTAB_UNKEYED) return;
    memcpy(t->key[i], key, 32);
    uint32_t h = slottab_hash(t, key);
    t->hnext[i] = t->bucket[h];
    t->bucket[h] = i;
}

void slottab_clear_key(slottab *t, int i)
{
    if (t->hnext[i] == SLOTTAB_UNKEYED) return;
    int32_t *pp = &t->bucket[slottab_hash(t, t->key[i])];
    while (*pp != i) pp = &t->hnext[*pp];
    *pp = t->hnext[i];
    t->hnext[i] = SLOTTAB_UNKEYED;
}

bool slottab_keyed(const slottab *t, int i) { return t->hnext[i] != SLOTTAB_UNKEYED; }

const uint8_t *slottab_get_key(const slottab *t, int i)
{
    return t->hnext[i] != SLOTTAB_UNKEYED ? t->key[i] : NULL;
}

bool slottab_listed(const slottab *t, int i) { return t->prev[i] >= -1; }

void slottab_unlink(slottab *t, int i)
{
    if (!slottab_listed(t, i)) return;
    if (t->prev[i] >= 0) t->next[t->prev[i]] = t->next[i];
    else t->oldest = t->next[i];
    if (t->next[i] >= 0) t->prev[t->next[i]] = t->prev[i];
    else t->newest = t->prev[i];
    t->prev[i] = SLOTTAB_HELD;
    t->next[i] = -1;
}

void slottab_touch(slottab *t, int i)
{
    if (t->prev[i] == SLOTTAB_FREE) return;   /* a free slot is the free list's, not ours */
    slottab_unlink(t, i);
    t->prev[i] = t->newest;
    t->next[i] = -1;
    if (t->newest >= 0) t->next[t->newest] = i;
    else t->oldest = i;
    t->newest = i;
}

int slottab_oldest(const slottab *t) { return t->oldest; }

int slottab_newer(const slottab *t, int i) { return t->next[i]; }
