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
 * from inside fn.
 */
#ifndef TM_THREADPOOL_H
#define TM_THREADPOOL_H

typedef struct threadpool threadpool;

/* n_threads >= 1 counts the caller. Returns NULL if threads cannot be started. */
threadpool *threadpool_new(int n_threads);
void threadpool_free(threadpool *tp);          /* joins the workers; NULL is fine */
int threadpool_size(const threadpool *tp);     /* n_threads; 1 for a NULL pool */

/* Runs fn(ctx, ith, nth) on every thread (ith = 0 .. nth-1, the caller is 0) and waits.
 * A NULL pool runs fn(ctx, 0, 1) on the caller. */
void threadpool_run(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* Inside fn: waits until every thread of the pool has reached the barrier. All threads must
 * call it the same number of times. No-op for a NULL or one-thread pool. */
void threadpool_barrier(threadpool *tp);

#endif
