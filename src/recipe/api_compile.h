/*
 * api_compile: the threads that compile requests' structured-output formats, so that the
 * number of compiles running at once is bounded by the pool, not by the connections.
 *
 * A connection thread hands its compile (a function and its argument) to the pool and waits
 * for it; while it waits it asks every GRAMMAR_CANCEL_POLL_S whether its client is still
 * there, and when it has gone, the compile's cancel hook (grammar_cancel_set, installed on
 * the compile thread) says so and the compile stops at its next poll. At most `queue` compiles
 * wait for a thread; one more is refused at once (API_COMPILE_BUSY: the caller answers 429).
 * The compile's budgets (--grammar-max-*) are the grammar module's, unchanged.
 *
 * Lock: one mutex guards the queue and every job's `done`; a job lives on its waiter's stack
 * and is not touched by the pool after `done` is set.
 */
#ifndef TM_API_COMPILE_H
#define TM_API_COMPILE_H

#include <stdbool.h>

typedef struct api_compile_pool api_compile_pool;

typedef enum {
    API_COMPILE_DONE = 0,   /* fn ran (perhaps cancelled); its result is in *result */
    API_COMPILE_BUSY = 1,   /* the queue was full; fn did not run */
} api_compile_status;

#define API_COMPILE_THREADS 4   /* compile threads of the server's pool */
#define API_COMPILE_QUEUE   64  /* compiles that may wait for one */

/* A pool of n_threads (>= 1) threads with room for `queue` (>= 1) waiting compiles; NULL when
 * no thread could be started. */
api_compile_pool *api_compile_new(int n_threads, int queue);
/* Joins the threads; no api_compile_run may be in progress. Accepts NULL. */
void api_compile_free(api_compile_pool *p);

/* The process's pool (API_COMPILE_THREADS, API_COMPILE_QUEUE), started on first use; NULL
 * when it could not be started. */
api_compile_pool *api_compile_shared(void);

/* Runs fn(arg) on a pool thread and waits for it, polling gone(gone_ctx) (may be NULL) as
 * above. */
api_compile_status api_compile_run(api_compile_pool *p, bool (*fn)(void *arg), void *arg, bool (*gone)(void *ctx),
                                   void *gone_ctx, bool *result);

/* Compiles waiting for a thread now. */
int api_compile_waiting(api_compile_pool *p);

#endif
