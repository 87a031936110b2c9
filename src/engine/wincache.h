/*
 * wincache: the window cache, the sliding-window layers' state at block ends, in RAM.
 *
 * DESIGN. A model with sliding-window layers keeps their KV out of the blocks (kvpool.h): a
 * sequence that attaches a prefix of P positions from blocks also needs the window layers'
 * last `window` positions at P. When a sequence crosses a multiple of 128 (prefill or decode)
 * the engine captures that state (engine_window_states) and the scheduler puts it here, keyed
 * by the block key of the block that ends at P. A later request whose attached prefix ends at P
 * takes it (kvpool_seq_window_restore) and continues exactly as if it had computed every
 * position; without it, it replays (kvpool_seq_window_replay). Entries live `ttl_s` seconds
 * from when they were put (DeepSeek keeps theirs about 180 s: a state is only useful to the
 * next turn of a conversation) within max_bytes, least recently used first out.
 *
 * Every entry has the same size (one model per process), so the store is an array of slots
 * allocated once (faulted in as used), a free list, an LRU and a hash map by key: no
 * allocation after wincache_new. The engine thread puts and gets; a mutex guards everything
 * so that /metrics (and a future fetch for another process) may read at any time.
 */
#ifndef TM_WINCACHE_H
#define TM_WINCACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef struct {
    size_t entry_bytes;          /* bytes of one state (kvpool_window_state_bytes) */
    size_t max_bytes;            /* entries fit in this; less than one entry: none is kept */
    double ttl_s;                /* seconds an entry lives after its put; <= 0: 180 */
} wincache_opts;

typedef struct {
    uint64_t n_entries;          /* held now */
    uint64_t bytes;              /* held now: n_entries * entry_bytes */
    uint64_t n_puts;             /* states put, lifetime */
    uint64_t n_hits;             /* gets that found the state */
    uint64_t n_misses;           /* gets that did not (never put, expired or evicted) */
    uint64_t n_expired;          /* entries dropped for age */
    uint64_t n_evicted;          /* entries dropped for room (LRU) */
    uint64_t n_replay_exact;     /* misses replayed exactly (counted by the scheduler) */
    uint64_t n_replay_bounded;   /* misses replayed over the last block only */
    uint64_t n_replay_tokens;    /* positions recomputed by replays */
    uint64_t n_fetches;          /* states fetched from another process */
} wincache_stats;

typedef struct wincache wincache;

/* NULL when entry_bytes is 0 (no window layers) or memory is short. */
wincache *wincache_new(const wincache_opts *o);
void wincache_free(wincache *c);
/* Keeps a copy of state (entry_bytes) under key, replacing an entry of the same key; now in
 * seconds (util_now), for the TTL. */
void wincache_put(wincache *c, const uint8_t key[32], const void *state, double now);
/* Copies the state of key into dst and returns true, or false (a miss) when there is none or
 * it has expired (then dropped). */
bool wincache_get(wincache *c, const uint8_t key[32], void *dst, double now);
/* Counts a replay of n positions (exact or bounded). */
void wincache_count_replay(wincache *c, bool exact, int n);
void wincache_get_stats(wincache *c, wincache_stats *st);

#endif
