/*
 * windir: the gateway's directory of window states: which worker holds the sliding-window
 * layers' state that ends at a block key (engine/wincache.h).
 *
 * DESIGN. Workers report the states they add and drop (WINDOW frames, docs/protocol.md); the
 * gateway records key -> (the set of worker slots holding it, expiry) here and, when it sends
 * a job to a worker that does not hold the state the job needs, fetches it from one that
 * does. The producer holds a state, and so does every worker it was relayed to: a job placed
 * on any of them needs no fetch. The directory is advisory: an entry may name a state already
 * gone (the fetch then answers nothing and the target replays), and a state it does not know
 * is simply not fetched. Memory is bounded: at most max_entries, fixed slots allocated at
 * windir_new, a hash map of chained slot indexes and a FIFO (the oldest report goes when
 * full). An entry expires at the latest expiry reported for it. The worker slots are the
 * gateway's (< WINDIR_MAX_SLOTS); a slot's bits are cleared when its connection goes, so a
 * reconnected worker starts with none. Not thread-safe: the gateway calls it under its mutex.
 */
#ifndef TM_WINDIR_H
#define TM_WINDIR_H

#include <stdbool.h>
#include <stdint.h>

#define WINDIR_MAX_SLOTS 64     /* worker slots a holder set can name (bits of a u64) */

typedef struct windir windir;

/* NULL when max_entries < 1 or memory is short. */
windir *windir_new(int max_entries);
void windir_free(windir *d);
/* slot holds key until expiry (seconds, util_now); slots outside 0..WINDIR_MAX_SLOTS-1 are
 * ignored. */
void windir_add(windir *d, const uint8_t key[32], int slot, double expiry);
/* slot no longer holds key (the entry goes with its last holder). */
void windir_drop(windir *d, const uint8_t key[32], int slot);
/* slot holds nothing any more (its connection is lost, or it drains). */
void windir_drop_worker(windir *d, int slot);
/* The workers holding key, bit i for slot i; 0 when none or expired at now (then dropped). */
uint64_t windir_find(windir *d, const uint8_t key[32], double now);
/* Entries held now (expired ones not yet seen included). */
int windir_count(const windir *d);

#endif
