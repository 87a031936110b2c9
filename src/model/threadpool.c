/*
 * threadpool: see threadpool.h.
 *
 * Protocol. The caller stores fn/ctx, resets n_done and bumps `gen` (release); every worker
 * waits for gen to change (spin, then futex), runs fn, and increments n_done. The caller runs
 * its own share and then waits for n_done == n - 1. Sleepers announce themselves in
 * n_sleeping before the futex wait, so that the caller issues the wake syscall only when
 * somebody sleeps (both sides use sequentially consistent operations, so either the worker
 * sees the new gen in futex_wait's check or the caller sees n_sleeping > 0).
 *
 * The barrier is a counter with a generation (sense reversal): the last thread to arrive
 * resets the counter and bumps bar_gen; the others spin on bar_gen, then sleep on it.
 */
#include "model/threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define THREADPOOL_SPIN 4000 /* pause iterations before sleeping (~100 us) */

struct threadpool_worker {
    struct threadpool *tp; /* owner */
    int ith;               /* 1 .. n-1 */
    pthread_t thread;      /* the worker thread */
};

struct threadpool {
    int n;                                /* threads including the caller */
    struct threadpool_worker *workers;    /* (n - 1) */
    int n_started;                        /* workers successfully created */
    void (*fn)(void *, int, int);         /* the job of the current run */
    void *ctx;                            /* its argument */
    _Alignas(64) _Atomic uint32_t gen;    /* futex word: bumped once per run */
    _Atomic int stop;                     /* set by threadpool_free */
    _Atomic int n_sleeping;               /* workers in (or entering) futex_wait on gen */
    _Alignas(64) _Atomic int n_done;      /* workers finished with the current run */
    _Alignas(64) _Atomic int bar_count;   /* threads arrived at the current barrier */
    _Atomic uint32_t bar_gen;             /* futex word: bumped when a barrier opens */
    _Atomic int bar_sleeping;             /* threads sleeping on bar_gen */
};

static void threadpool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void threadpool_futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void threadpool_futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Waits until *word != seen; returns the new value. */
static uint32_t threadpool_wait_change(_Atomic uint32_t *word, uint32_t seen,
                                       _Atomic int *n_sleeping)
{
    uint32_t g;
    for (int i = 0; i < THREADPOOL_SPIN; i++) {
        g = atomic_load_explicit(word, memory_order_acquire);
        if (g != seen) return g;
        threadpool_pause();
    }
    for (;;) {
        atomic_fetch_add(n_sleeping, 1);
        g = atomic_load(word);
        if (g == seen) threadpool_futex_wait(word, seen);
        atomic_fetch_sub(n_sleeping, 1);
        g = atomic_load_explicit(word, memory_order_acquire);
        if (g != seen) return g;
    }
}

static void *threadpool_main(void *arg)
{
    struct threadpool_worker *w = arg;
    struct threadpool *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        seen = threadpool_wait_change(&tp->gen, seen, &tp->n_sleeping);
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        tp->fn(tp->ctx, w->ith, tp->n);
        atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
    }
    return NULL;
}

threadpool *threadpool_new(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n = n_threads;
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) goto err;
        for (int i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i + 1;
            if (pthread_create(&tp->workers[i].thread, NULL, threadpool_main, &tp->workers[i]))
                goto err;
            tp->n_started++;
        }
    }
    return tp;
err:
    threadpool_free(tp);
    return NULL;
}

void threadpool_free(threadpool *tp)
{
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    atomic_fetch_add(&tp->gen, 1);
    threadpool_futex_wake(&tp->gen);
    for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i].thread, NULL);
    free(tp->workers);
    free(tp);
}

int threadpool_size(const threadpool *tp) { return tp ? tp->n : 1; }

void threadpool_run(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    if (!tp || tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: publishes fn/ctx, orders against n_sleeping */
    if (atomic_load(&tp->n_sleeping) > 0) threadpool_futex_wake(&tp->gen);
    fn(ctx, 0, tp->n);
    int want = tp->n - 1;
    for (int i = 0; atomic_load_explicit(&tp->n_done, memory_order_acquire) != want; i++) {
        if (i < THREADPOOL_SPIN) threadpool_pause();
        else sched_yield(); /* a worker may have lost its core to another process */
    }
}

void threadpool_barrier(threadpool *tp)
{
    if (!tp || tp->n == 1) return;
    uint32_t g = atomic_load_explicit(&tp->bar_gen, memory_order_acquire);
    if (atomic_fetch_add(&tp->bar_count, 1) == tp->n - 1) {
        atomic_store_explicit(&tp->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add(&tp->bar_gen, 1);
        if (atomic_load(&tp->bar_sleeping) > 0) threadpool_futex_wake(&tp->bar_gen);
        return;
    }
    threadpool_wait_change(&tp->bar_gen, g, &tp->bar_sleeping);
}
