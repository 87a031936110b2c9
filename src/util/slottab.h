/*
 * slottab: the bookkeeping of a fixed table of n slots keyed by 32-byte digests: a free list,
 * a recency list and a hash map from key to slot. The KV pool's prefix tier (an LRU of
 * unreferenced blocks), the window-state cache (an LRU) and the gateway's window directory (a
 * FIFO by report) are all this shape: each keeps its payload in arrays of its own, indexed by
 * slot, and leaves the links to this module.
 *
 * DESIGN. A slot is on at most one list: the free list (singly linked through next, taken from
 * and given back at its head, so a fresh table hands out 0, 1, 2 ...), the recency list (doubly
 * linked, prev towards the oldest and next towards the newest), or neither (a slot its owner
 * holds, such as a pinned KV block). Keyed or not is separate from the lists: a held slot may
 * be keyed so that others find it. The hash map chains keyed slots through hnext from (mask + 1)
 * bucket heads, two per slot (up to 2^30 buckets); the keys are SHA-256 digests, so their first
 * four bytes serve as the hash. Nothing allocates after slottab_init; the owner's lock guards the table.
 */
#ifndef TM_SLOTTAB_H
#define TM_SLOTTAB_H

#include <stdbool.h>
#include <stdint.h>

#define SLOTTAB_MAX (1 << 30)     /* the most slots a table may have */

typedef struct {
    int n;                        /* slots, 0 .. n-1 */
    uint32_t mask;                /* hash buckets - 1 (a power of two) */
    int32_t *bucket;              /* (mask + 1) a chain's first slot, -1 empty */
    uint8_t (*key)[32];           /* (n) a slot's key while it is keyed */
    int32_t *hnext;               /* (n) the next slot in its chain, -1 ends, SLOTTAB_UNKEYED */
    int32_t *prev;                /* (n) the older neighbour on the recency list, -1 the oldest,
                                   * SLOTTAB_HELD or SLOTTAB_FREE when off it */
    int32_t *next;                /* (n) the newer neighbour, -1 the newest; on the free list the
                                   * next free slot, -1 ends */
    int32_t free_head;            /* the first free slot, -1 none */
    int32_t oldest, newest;       /* ends of the recency list, -1 when it is empty */
} slottab;

#define SLOTTAB_UNKEYED (-2)      /* hnext of a slot outside the hash map */
#define SLOTTAB_HELD    (-2)      /* prev of a slot on no list */
#define SLOTTAB_FREE    (-3)      /* prev of a slot on the free list */

/* Every slot free and unkeyed, 0 first. False when n is outside 0 .. SLOTTAB_MAX or memory is
 * short (t is then left zeroed). A zeroed slottab may be freed. */
bool slottab_init(slottab *t, int n);
void slottab_free(slottab *t);

/* A free slot, now held and unkeyed; -1 when none is free. */
int slottab_take(slottab *t);
/* Slot i leaves the hash map and the recency list for the free list; no-op if already free. */
void slottab_give(slottab *t, int i);

/* The slot keyed by key, or -1. */
int slottab_find(const slottab *t, const uint8_t key[32]);
/* Enters unkeyed slot i under key; the caller has checked that no slot has that key (find). */
void slottab_set_key(slottab *t, int i, const uint8_t key[32]);
/* Takes slot i out of the hash map; no-op if unkeyed. */
void slottab_clear_key(slottab *t, int i);
bool slottab_keyed(const slottab *t, int i);
/* Slot i's key (valid while keyed), or NULL when unkeyed. */
const uint8_t *slottab_get_key(const slottab *t, int i);

/* Puts slot i (held, or already on the recency list) at the newest end of the recency list. */
void slottab_touch(slottab *t, int i);
/* Takes slot i off the recency list, leaving it held; no-op when it is not on it. */
void slottab_unlink(slottab *t, int i);
bool slottab_listed(const slottab *t, int i);
/* The oldest slot on the recency list, or -1; then the next newer after i, or -1 past the
 * newest. */
int slottab_oldest(const slottab *t);
int slottab_newer(const slottab *t, int i);

#endif
