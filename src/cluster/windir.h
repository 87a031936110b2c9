/*
 * windir: the gateway's directory of window states: which worker holds the sliding-window
 * layers' state that ends at a block key (engine/wincache.h).
 *
 * DESIGN. Workers report the states they add and drop (WINDOW frames, docs/protocol.md); the
 * gateway records key -> (worker slot, connection generation, expiry) here and, when it sends
 * a job to another worker than the holder, fetches the state for it. The directory is
 * advisory: an entry may point at a state already gone (the fetch then answers nothing and the
 * target replays), and a state it does not know is simply not fetched. Memory is bounded: at
 * most max_entries, fixed slots allocated at windir_new, a hash map of chained slot indexes
 * and a FIFO (oldest report first out when full; expired entries go first). One key has one
 * holder: the latest report wins. Not thread-safe: the gateway calls it under its mutex.
 */
#ifndef TM_WINDIR_H
#define TM_WINDIR_H

#include <stdbool.h>
#include <stdint.h>

typedef struct windir windir;

/* NULL when max_entries < 1 or memory is short. */
windir *windir_new(int max_entries);
void windir_free(windir *d);
/* slot (connection gen) holds key until expiry (seconds, util_now), replacing any holder. */
void windir_add(windir *d, const uint8_t key[32], int slot, uint64_t gen, double expiry);
/* slot no longer holds key (nothing when another worker is the holder). */
void windir_drop(windir *d, const uint8_t key[32], int slot);
/* Every entry of slot goes (its connection is lost, or it drains). */
void windir_drop_worker(windir *d, int slot);
/* The holder of key: true and *slot, *gen when held and not expired at now (an expired one is
 * dropped). */
bool windir_find(windir *d, const uint8_t key[32], double now, int *slot, uint64_t *gen);
/* Entries held now (expired ones not yet seen included). */
int windir_count(const windir *d);

#endif
