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
 * threadpool_start is the same round without the caller's share (workers_only: a worker passes
 * ith - 1 and n - 1), and threadpool_wait is the caller's wait for n_done. threadpool_try_run
 * takes the `busy` flag first, so concurrent callers never interleave two rounds.
 *
 * The barrier is a counter with a generation (sense reversal): the last thread to arrive
 * resets the counter and bumps bar_gen; the others spin on bar_gen, then sleep on it.
 *
 * Profile counters live in one cache line per thread (cnt[ith]); a thread finds its own
 * through a thread-local pointer, set by a worker when it starts and by the caller in each
 * run, so that threadpool_barrier needs no ith. A worker's writes happen before its n_done
 * increment (release), so the caller reads them safely once the run returned.
 */
#define _GNU_SOURCE
#include "util/threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define THREADPOOL_SPIN 4000 /* default pause iterations before sleeping (~100 us) */

typedef struct {
    _Alignas(64) uint64_t work_ns;  /* inside fn */
    uint64_t wake_ns;               /* round started -> entered fn */
    uint64_t barrier_ns;            /* waiting at barriers */
} threadpool_counter;

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
    bool workers_only;                    /* the run is threadpool_start's: no caller share */
    _Atomic int n_spin;                   /* pause iterations an idle worker spins */
    _Alignas(64) _Atomic uint32_t gen;    /* futex word: bumped once per run */
    _Atomic int stop;                     /* set by threadpool_free */
    _Atomic int n_sleeping;               /* workers in (or entering) futex_wait on gen */
    _Atomic int busy;                     /* a threadpool_try_run caller holds the pool */
    _Alignas(64) _Atomic int n_done;      /* workers finished with the current run */
    _Alignas(64) _Atomic int bar_count;   /* threads arrived at the current barrier */
    _Atomic uint32_t bar_gen;             /* futex word: bumped when a barrier opens */
    _Atomic int bar_sleeping;             /* threads sleeping on bar_gen */
    bool prof;                            /* profile counters on */
    uint64_t t_run;                       /* ns (CLOCK_MONOTONIC) the current run started */
    uint64_t rounds;                      /* runs since the counters were zeroed */
    threadpool_counter *cnt;              /* (n) per-thread counters, [0] the caller */
    int *cpus;                            /* (n) CPU of each thread, or NULL: not pinned */
    pthread_t pinned_caller;              /* the last caller pinned to cpus[0] */
    bool caller_pinned;                   /* pinned_caller is set */
};

/* Pins thread th to cpu; false if the system refused. */
static bool threadpool_pin(pthread_t th, int cpu)
{
    if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(th, sizeof set, &set) == 0;
}

static _Thread_local threadpool_counter *threadpool_self; /* this thread's counters */

static uint64_t threadpool_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void threadpool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
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
                                       _Atomic int *n_sleeping, int n_spin)
{
    uint32_t g;
    for (int i = 0; i < n_spin; i++) {
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
    threadpool_counter *cnt = &tp->cnt[w->ith];
    threadpool_self = cnt;
    uint32_t seen = 0;
    for (;;) {
        seen = threadpool_wait_change(&tp->gen, seen, &tp->n_sleeping,
                                      atomic_load_explicit(&tp->n_spin, memory_order_relaxed));
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        int ith = w->ith - tp->workers_only, nth = tp->n - tp->workers_only;
        if (tp->prof) {
            uint64_t t0 = threadpool_ns();
            cnt->wake_ns += t0 - tp->t_run;
            tp->fn(tp->ctx, ith, nth);
            cnt->work_ns += threadpool_ns() - t0;
        } else {
            tp->fn(tp->ctx, ith, nth);
        }
        atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
    }
    return NULL;
}

threadpool *threadpool_new(int n_threads) { return threadpool_new_pinned(n_threads, NULL); }

threadpool *threadpool_new_pinned(int n_threads, const int *cpus)
{
    if (n_threads < 1) n_threads = 1;
    threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n = n_threads;
    tp->n_spin = THREADPOOL_SPIN;
    if (cpus) {
        if (!(tp->cpus = malloc((size_t)n_threads * sizeof *tp->cpus))) goto err;
        memcpy(tp->cpus, cpus, (size_t)n_threads * sizeof *tp->cpus);
    }
    tp->cnt = aligned_alloc(64, (size_t)n_threads * sizeof *tp->cnt);
    if (!tp->cnt) goto err;
    memset(tp->cnt, 0, (size_t)n_threads * sizeof *tp->cnt);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) goto err;
        for (int i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i + 1;
            if (pthread_create(&tp->workers[i].thread, NULL, threadpool_main, &tp->workers[i]))
                goto err;
            tp->n_started++;
            if (tp->cpus) threadpool_pin(tp->workers[i].thread, tp->cpus[i + 1]);
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
    free(tp->cnt);
    free(tp->cpus);
    free(tp);
}

int threadpool_size(const threadpool *tp) { return tp ? tp->n : 1; }

/* Hands fn/ctx to the workers (a new round). */
static void threadpool_kick(threadpool *tp, void (*fn)(void *, int, int), void *ctx, bool workers_only)
{
    tp->fn = fn;
    tp->ctx = ctx;
    tp->workers_only = workers_only;
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    if (tp->prof) {
        threadpool_self = &tp->cnt[0];
        tp->t_run = threadpool_ns();
        tp->rounds++;
    }
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: publishes fn/ctx, orders against n_sleeping */
    if (atomic_load(&tp->n_sleeping) > 0) threadpool_futex_wake(&tp->gen);
}

void threadpool_wait(threadpool *tp)
{
    if (!tp || tp->n == 1) return;
    int want = tp->n - 1;
    for (int i = 0; atomic_load_explicit(&tp->n_done, memory_order_acquire) != want; i++) {
        if (i < THREADPOOL_SPIN) threadpool_pause();
        else sched_yield(); /* a worker may have lost its core to another process */
    }
}

void threadpool_run(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    if (tp && tp->cpus && (!tp->caller_pinned || !pthread_equal(tp->pinned_caller, pthread_self()))) {
        threadpool_pin(pthread_self(), tp->cpus[0]);
        tp->pinned_caller = pthread_self();
        tp->caller_pinned = true;
    }
    if (!tp || tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    threadpool_kick(tp, fn, ctx, false);
    uint64_t t0 = tp->prof ? tp->t_run : 0;
    fn(ctx, 0, tp->n);
    if (tp->prof) tp->cnt[0].work_ns += threadpool_ns() - t0;
    threadpool_wait(tp);
}

bool threadpool_try_run(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    int idle = 0;
    if (tp && !atomic_compare_exchange_strong(&tp->busy, &idle, 1)) return false;
    threadpool_run(tp, fn, ctx);
    if (tp) atomic_store(&tp->busy, 0);
    return true;
}

bool threadpool_start(threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    if (!tp || tp->n == 1) return false;
    threadpool_kick(tp, fn, ctx, true);
    return true;
}

void threadpool_set_spin(threadpool *tp, int n_spin)
{
    if (tp) atomic_store_explicit(&tp->n_spin, n_spin < 0 ? 0 : n_spin, memory_order_relaxed);
}

void threadpool_profile(threadpool *tp, bool on)
{
    if (!tp) return;
    memset(tp->cnt, 0, (size_t)tp->n * sizeof *tp->cnt);
    tp->rounds = 0;
    tp->prof = on;
}

void threadpool_stats_get(const threadpool *tp, threadpool_stats *out)
{
    *out = (threadpool_stats){ 0 };
    if (!tp) return;
    out->rounds = tp->rounds;
    for (int i = 0; i < tp->n; i++) {
        out->work_ns += tp->cnt[i].work_ns;
        out->wake_ns += tp->cnt[i].wake_ns;
        out->barrier_ns += tp->cnt[i].barrier_ns;
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
    if (tp->prof) {
        uint64_t t0 = threadpool_ns();
        threadpool_wait_change(&tp->bar_gen, g, &tp->bar_sleeping,
                               atomic_load_explicit(&tp->n_spin, memory_order_relaxed));
        threadpool_self->barrier_ns += threadpool_ns() - t0;
        return;
    }
    threadpool_wait_change(&tp->bar_gen, g, &tp->bar_sleeping,
                           atomic_load_explicit(&tp->n_spin, memory_order_relaxed));
}

void threadpool_items_reset(threadpool_items *w, int n, int n_threads)
{
    w->n = n;
    w->nr = n_threads < 1 ? 1 : n_threads < THREADPOOL_RANGES ? n_threads : THREADPOOL_RANGES;
    for (int j = 0; j < w->nr; j++) w->r[j].next = (int)((int64_t)n * j / w->nr);
}

int threadpool_items_take(threadpool_items *w, int ith)
{
    for (int k = 0; k < w->nr; k++) {
        const int j = (ith + k) % w->nr, end = (int)((int64_t)w->n * (j + 1) / w->nr);
        if (__atomic_load_n(&w->r[j].next, __ATOMIC_RELAXED) >= end) continue;
        const int it = __atomic_fetch_add(&w->r[j].next, 1, __ATOMIC_RELAXED);
        if (it < end) return it;
    }
    return -1;
}
