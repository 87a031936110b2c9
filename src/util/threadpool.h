/*
 * threadpool: a fixed set of kernel threads that run one function on every thread at a time
 * (ggml's ith/nth model). The calling thread takes part as ith = 0, so a pool of n threads
 * starts n - 1 workers. threadpool_run returns when every thread has returned from fn.
 *
 * Made for many small calls (a decode step issues hundreds): no allocation per call; idle
 * workers spin briefly on a generation counter, then sleep on a futex, so a call costs a few
 * microseconds while calls come back to back, and nothing while the pool is idle.
 *
 * One caller at a time: threadpool_run must not be called concurrently on the same pool, nor
 * from inside fn. A pool that several threads share (each wanting a parallel loop now and
 * then) is run with threadpool_try_run, which declines while another caller holds the pool.
 *
 * Two ways to use it besides a plain run: threadpool_start hands a job to the workers alone
 * and returns, so the caller computes something else meanwhile and meets them in
 * threadpool_wait; threadpool_set_spin(tp, 0) makes idle workers sleep at once, for a pool
 * whose rounds are rare beside another pool's (their spin would take cores that pool wants).
 *
 * Profiling (threadpool_profile, off by default): each thread adds up, in its own counters,
 * the time it spent inside fn (work), waiting for a round to reach it after the caller
 * started it (wake: the spin or futex sleep of a worker, the caller's own 0), and waiting at
 * barriers inside fn; two clock reads per round and per barrier, none when off. The caller
 * reads the sums between rounds (threadpool_stats_get), when no worker writes them.
 */
#ifndef TM_THREADPOOL_H
#define TM_THREADPOOL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct threadpool threadpool;

/* n_threads >= 1 counts the caller. Returns NULL if threads cannot be started. */
threadpool *threadpool_new(int n_threads);
/* The same with thread ith pinned to CPU cpus[ith] (n_threads entries; NULL: not pinned):
 * workers from their start, the calling thread of threadpool_run when a run finds a caller it
 * has not pinned yet (that thread stays pinned to cpus[0]). A CPU the process may not use
 * leaves that thread unpinned. */
threadpool *threadpool_new_pinned(int n_threads, const int *cpus);
void threadpool_free(threadpool *tp);          /* joins the workers; NULL is fine */
int threadpool_size(const threadpool *tp);     /* n_threads; 1 for a NULL pool */

/* Runs fn(ctx, ith, nth) on every thread (ith = 0 .. nth-1, the caller is 0) and waits.
 * A NULL pool runs fn(ctx, 0, 1) on the caller. */
void threadpool_run(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* As threadpool_run, when no other caller of threadpool_try_run holds the pool; false (fn not
 * run) when one does: the caller then does the work itself (fn(ctx, 0, 1)). Callers that
 * share a pool all use this, never threadpool_run. */
bool threadpool_try_run(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* Starts fn(ctx, ith, nth) on the workers only (ith = 0 .. nth-1, nth = threadpool_size - 1)
 * and returns at once; threadpool_wait waits for them. False, nothing started, when the pool
 * has no worker (NULL or one thread). Between the two the pool is busy: no run, no start, and
 * fn may not call threadpool_barrier. */
bool threadpool_start(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx);
/* Waits until the job threadpool_start started has returned on every worker. */
void threadpool_wait(threadpool *tp);

/* Pause iterations an idle worker spins before it sleeps (default about 100 us; 0: sleeps at
 * once). Not during a run. */
void threadpool_set_spin(threadpool *tp, int n_spin);

/* Inside fn: waits until every thread of the pool has reached the barrier. All threads must
 * call it the same number of times. No-op for a NULL or one-thread pool. */
void threadpool_barrier(threadpool *tp);

/* Work items [0, n) shared by a round's threads in contiguous runs: range j is
 * [n * j / nr, n * (j + 1) / nr) of nr = min(threads, THREADPOOL_RANGES) ranges; thread ith
 * takes the items of range ith % nr in order, then, when that is done, the rest of the other
 * ranges. Each thread so streams one run of whatever the items index (a weight's rows: taken
 * in turns from one counter, two threads read alternate chunks, which measured slower), and a
 * thread that falls behind has its items taken by the others. Reset before the round, not in
 * it. */
#define THREADPOOL_RANGES 32
typedef struct {
    struct {
        int next;             /* the range's next item (atomic; may pass its end) */
        char pad[60];         /* a cache line per counter */
    } r[THREADPOOL_RANGES];
    int n;                    /* items */
    int nr;                   /* ranges */
} threadpool_items;

void threadpool_items_reset(threadpool_items *w, int n, int n_threads);
/* The next item for thread ith, or -1 when every item is taken. */
int threadpool_items_take(threadpool_items *w, int ith);

/* Sums over every thread of the pool since threadpool_profile(tp, true). */
typedef struct {
    uint64_t rounds;          /* threadpool_run calls that used the pool */
    uint64_t work_ns;         /* thread-time inside fn, barrier waits included */
    uint64_t wake_ns;         /* thread-time from a round's start until a worker entered fn */
    uint64_t barrier_ns;      /* thread-time waiting at threadpool_barrier */
} threadpool_stats;

/* Turns the counters on (zeroed) or off. Not during a run. */
void threadpool_profile(threadpool *tp, bool on);
/* The counters so far (zeros when off or for a NULL pool). Not during a run. */
void threadpool_stats_get(const threadpool *tp, threadpool_stats *out);

#endif
