/*
 * test_threadpool: the one pool of ith/nth threads (util/threadpool). Every thread runs each
 * round once and meets the others at barriers; a started job runs on the workers alone while
 * the caller goes on; callers that share a pool through threadpool_try_run never interleave
 * two rounds, and one that finds the pool busy is told so and does the work itself.
 */
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "util/threadpool.h"

static void tp_count(void *ctx, int ith, int nth)
{
    _Atomic int *c = ctx;
    atomic_fetch_add(&c[ith], 1);
    threadpool_barrier(NULL);
    (void)nth;
}

typedef struct {
    threadpool *tp;
    _Atomic int phase_a, bad;
} tp_bar_ctx;

static void tp_barrier_fn(void *arg, int ith, int nth)
{
    tp_bar_ctx *c = arg;
    for (int round = 0; round < 50; round++) {
        atomic_fetch_add(&c->phase_a, 1);
        threadpool_barrier(c->tp);
        if (atomic_load(&c->phase_a) != nth * (round + 1)) atomic_fetch_add(&c->bad, 1);
        threadpool_barrier(c->tp);
    }
    (void)ith;
}

TEST(test_threadpool_run_and_barrier)
{
    for (int n = 1; n <= 4; n++) {
        threadpool *tp = threadpool_new(n);
        CHECK(tp && threadpool_size(tp) == n);
        _Atomic int cnt[4] = {0};
        for (int i = 0; i < 1000; i++) threadpool_run(tp, tp_count, cnt);
        for (int i = 0; i < n; i++) CHECK(atomic_load(&cnt[i]) == 1000);
        tp_bar_ctx bc = {tp, 0, 0};
        threadpool_run(tp, tp_barrier_fn, &bc);
        CHECK(atomic_load(&bc.bad) == 0);
        threadpool_free(tp);
    }
    CHECK(threadpool_size(NULL) == 1);
}

/* Idle workers that sleep at once (no spin) still take every round. */
TEST(test_threadpool_no_spin)
{
    threadpool *tp = threadpool_new(3);
    threadpool_set_spin(tp, 0);
    _Atomic int cnt[3] = {0};
    for (int i = 0; i < 300; i++) threadpool_run(tp, tp_count, cnt);
    for (int i = 0; i < 3; i++) CHECK(atomic_load(&cnt[i]) == 300);
    threadpool_free(tp);
}

typedef struct {
    pthread_t caller;
    _Atomic int ran[4];     /* (nth) rounds each ith ran */
    _Atomic int on_caller;  /* rounds that ran on the caller's thread */
    _Atomic int nth_seen;   /* the nth the job was given */
    _Atomic int release;    /* the caller lets the workers finish */
} tp_start_ctx;

static void tp_start_fn(void *arg, int ith, int nth)
{
    tp_start_ctx *c = arg;
    while (!atomic_load(&c->release)) sched_yield();
    atomic_fetch_add(&c->ran[ith], 1);
    atomic_store(&c->nth_seen, nth);
    if (pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->on_caller, 1);
}

/* A started job runs once on every worker (ith 0 .. size-2 of nth = size-1), never on the
 * caller, which returns at once and meets it in threadpool_wait. */
TEST(test_threadpool_start_wait)
{
    CHECK(!threadpool_start(NULL, tp_start_fn, NULL));
    threadpool *one = threadpool_new(1);
    CHECK(!threadpool_start(one, tp_start_fn, NULL));
    threadpool_wait(one);
    threadpool_free(one);
    for (int n = 2; n <= 4; n++) {
        threadpool *tp = threadpool_new(n);
        threadpool_set_spin(tp, n == 3 ? 0 : 4000);
        for (int round = 0; round < 20; round++) {
            tp_start_ctx c = { .caller = pthread_self() };
            CHECK(threadpool_start(tp, tp_start_fn, &c));
            /* the workers wait for this store: start returned before they finished */
            atomic_store(&c.release, 1);
            threadpool_wait(tp);
            for (int i = 0; i < n - 1; i++) CHECK(atomic_load(&c.ran[i]) == 1);
            for (int i = n - 1; i < 4; i++) CHECK(atomic_load(&c.ran[i]) == 0);
            CHECK(atomic_load(&c.nth_seen) == n - 1);
            CHECK(atomic_load(&c.on_caller) == 0);
        }
        /* a plain run after a start numbers every thread again */
        _Atomic int cnt[4] = {0};
        threadpool_run(tp, tp_count, cnt);
        for (int i = 0; i < n; i++) CHECK(atomic_load(&cnt[i]) == 1);
        threadpool_free(tp);
    }
}

typedef struct {
    threadpool *tp;
    _Atomic int inner_declined;  /* a try_run made inside a round was refused */
    _Atomic int inside;          /* threads inside a round of the pool now */
    _Atomic int overlap;         /* a round found another round's thread inside */
    _Atomic long sum;            /* work done, on the pool or alone */
} tp_share_ctx;

static void tp_nested_fn(void *arg, int ith, int nth)
{
    tp_share_ctx *c = arg;
    if (ith == 0 && !threadpool_try_run(c->tp, tp_nested_fn, c)) atomic_fetch_add(&c->inner_declined, 1);
    threadpool_barrier(c->tp);
    (void)nth;
}

/* Inside a round the pool is busy: a try_run declines (it would deadlock as a run). */
TEST(test_threadpool_try_run_declines_when_busy)
{
    threadpool *tp = threadpool_new(2);
    tp_share_ctx c = { .tp = tp };
    CHECK(threadpool_try_run(tp, tp_nested_fn, &c));
    CHECK(atomic_load(&c.inner_declined) == 1);
    CHECK(threadpool_try_run(tp, tp_nested_fn, &c));   /* released after the round */
    CHECK(atomic_load(&c.inner_declined) == 2);
    threadpool_free(tp);
    _Atomic int cnt[1] = {0};
    CHECK(threadpool_try_run(NULL, tp_count, cnt));   /* no pool: the caller runs it */
    CHECK(atomic_load(&cnt[0]) == 1);
}

/* One job of 1000 units, split by ith/nth. */
static void tp_share_fn(void *arg, int ith, int nth)
{
    tp_share_ctx *c = arg;
    if (atomic_fetch_add(&c->inside, 1) >= nth) atomic_fetch_add(&c->overlap, 1);
    long s = 0;
    for (int i = ith; i < 1000; i += nth) s += i;
    atomic_fetch_add(&c->sum, s);
    threadpool_barrier(c->tp);   /* every thread of the round is inside before any leaves */
    atomic_fetch_sub(&c->inside, 1);
    threadpool_barrier(c->tp);
}

static void *tp_share_caller(void *arg)
{
    tp_share_ctx *c = arg;
    for (int i = 0; i < 200; i++)
        if (!threadpool_try_run(c->tp, tp_share_fn, c)) {
            long s = 0;
            for (int k = 0; k < 1000; k++) s += k;   /* declined: the caller's own loop */
            atomic_fetch_add(&c->sum, s);
        }
    return NULL;
}

/* Four threads share a pool: every job is done exactly once and no two rounds interleave. */
TEST(test_threadpool_try_run_shared)
{
    threadpool *tp = threadpool_new(3);
    threadpool_set_spin(tp, 0);
    tp_share_ctx c = { .tp = tp };
    pthread_t th[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, tp_share_caller, &c) == 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    CHECK(atomic_load(&c.sum) == 4L * 200 * (999L * 1000 / 2));
    CHECK(atomic_load(&c.overlap) == 0);
    threadpool_free(tp);
}

/* threadpool_items: every item is taken exactly once whatever the thread and item counts (more
 * threads than THREADPOOL_RANGES, fewer items than threads, none); a thread's items start with
 * its own range, in order. */
typedef struct {
    threadpool_items w;
    _Atomic int taken[1000];
    _Atomic int first_bad;     /* a thread's first item was not its range's start */
    _Atomic int order_bad;     /* a thread's own range came out of order */
} tp_items_ctx;

static void tp_items_fn(void *arg, int ith, int nth)
{
    tp_items_ctx *c = arg;
    const int nr = c->w.nr, j = ith % nr;
    const int start = (int)((int64_t)c->w.n * j / nr);
    const int end = (int)((int64_t)c->w.n * (j + 1) / nr);
    int prev = -1, k = 0;
    for (int it; (it = threadpool_items_take(&c->w, ith)) >= 0; k++) {
        atomic_fetch_add(&c->taken[it], 1);
        if (k == 0 && ith < nr && start < end && it != start) atomic_store(&c->first_bad, 1);
        if (ith < nr && it >= start && it < end) {
            if (it < prev) atomic_store(&c->order_bad, 1);
            prev = it;
        }
    }
    (void)nth;
}

TEST(test_threadpool_items)
{
    static const int threads[] = {1, 2, 3, THREADPOOL_RANGES + 3};
    static const int items[] = {0, 1, 2, 5, 64, 999};
    static tp_items_ctx c;
    for (size_t a = 0; a < sizeof threads / sizeof threads[0]; a++) {
        threadpool *tp = threadpool_new(threads[a]);
        CHECK(tp);
        for (size_t b = 0; b < sizeof items / sizeof items[0]; b++) {
            for (int rep = 0; rep < 20; rep++) {
                memset(&c, 0, sizeof c);
                threadpool_items_reset(&c.w, items[b], threadpool_size(tp));
                CHECK(c.w.nr == (threads[a] < THREADPOOL_RANGES ? threads[a] : THREADPOOL_RANGES));
                threadpool_run(tp, tp_items_fn, &c);
                for (int i = 0; i < items[b]; i++)
                    CHECKF(atomic_load(&c.taken[i]) == 1, "item %d of %d, %d threads", i, items[b], threads[a]);
                CHECK(atomic_load(&c.taken[items[b]]) == 0);
                CHECK(!atomic_load(&c.order_bad));
                if (threads[a] == 1) CHECK(!atomic_load(&c.first_bad));
            }
        }
        threadpool_free(tp);
    }
}

int main(void)
{
    RUN(test_threadpool_run_and_barrier);
    RUN(test_threadpool_no_spin);
    RUN(test_threadpool_start_wait);
    RUN(test_threadpool_try_run_declines_when_busy);
    RUN(test_threadpool_try_run_shared);
    RUN(test_threadpool_items);
    HARNESS_END();
}
