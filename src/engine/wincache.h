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
 * A model with recurrent layers (Qwen3.5) keeps its whole recurrent state here the same way
 * (engine_qwen35_states): a recurrent state cannot be replayed from a bounded span, so a miss
 * falls back to the furthest earlier state held (wincache_contains probes for it).
 *
 * Every entry has the same size (one model per process), so the store is an array of slots
 * allocated once (faulted in as used), a free list, an LRU and a hash map by key: no
 * allocation after wincache_new. The engine thread puts and gets; a mutex guards everything
 * so that /metrics and a cluster worker's connection threads may read at any time.
 *
 * In a cluster the gateway keeps a directory of which worker holds which state (windir.h):
 * a worker turns on a journal (wincache_journal_start) and sends the gateway what was added
 * and dropped (wincache_events). A lost event only costs a replay: a directory entry that
 * points at a state no longer held answers its fetch with nothing, a state the directory
 * does not know is simply not fetched. wincache_peek serves a fetch; wincache_put_fetched
 * keeps a state another worker produced.
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
    uint64_t n_fetches;          /* states fetched from another process (wincache_put_fetched) */
    uint64_t n_fetch_bytes;      /* their bytes */
    uint64_t n_served;           /* states copied out for another process (wincache_peek hits) */
    uint64_t n_journal_lost;     /* events not journaled because the journal was full */
} wincache_stats;

typedef enum {
    WINCACHE_EV_ADD = 1,         /* a state was put (or replaced): held for ttl_ms from now */
    WINCACHE_EV_DROP = 2,        /* a state was dropped (evicted or expired) */
} wincache_ev_op;

typedef struct {
    uint8_t key[32];             /* block key of the block the state ends */
    uint8_t op;                  /* wincache_ev_op */
    uint32_t ttl_ms;             /* ADD: milliseconds it lives from the put; DROP: 0 */
} wincache_event;

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
/* Whether a state of key is held and unexpired, counting nothing and moving nothing (a probe
 * for the longest prefix a state continues). */
bool wincache_contains(wincache *c, const uint8_t key[32], double now);
/* Counts a replay of n positions (exact or bounded). */
void wincache_count_replay(wincache *c, bool exact, int n);
void wincache_get_stats(wincache *c, wincache_stats *st);

/* Turns on the journal of adds and drops, n events deep (allocated here, once; later calls
 * do nothing). When it is full, new events are lost (counted): the directory they feed is
 * advisory. */
void wincache_journal_start(wincache *c, int n);
/* Moves up to max journaled events, oldest first, into out; returns how many. */
int wincache_events(wincache *c, wincache_event *out, int max);
/* Copies the state of key into dst without counting a hit or refreshing its place in the LRU
 * (a fetch by another process); false when there is none or it has expired. */
bool wincache_peek(wincache *c, const uint8_t key[32], void *dst, double now);
/* wincache_put of a state fetched from another process, counted as a fetch of entry_bytes. */
void wincache_put_fetched(wincache *c, const uint8_t key[32], const void *state, double now);
/* Bytes of one state (what a fetched state must measure); 0 for NULL. */
size_t wincache_entry_bytes(const wincache *c);

#endif
