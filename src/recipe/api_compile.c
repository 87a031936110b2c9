/*
 * api_compile: a small pool of compile threads with a bounded queue. See api_compile.h.
 */
#include "recipe/api_compile.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "grammar/grammar.h"
#include "util/util.h"

typedef struct api_compile_job {
    bool (*fn)(void *arg);
    void *arg;
    atomic_bool cancel;            /* the client has gone: the compile's hook says so */
    bool done;                     /* fn returned (guarded by the pool's mutex) */
    bool result;                   /* what it returned */
    struct api_compile_job *next;  /* queue link */
} api_compile_job;

struct api_compile_pool {
    pthread_mutex_t mu;            /* guards everything below and jobs' done */
    pthread_cond_t work;           /* a job was queued or the pool stops */
    pthread_cond_t done;           /* a job finished (CLOCK_MONOTONIC waits) */
    api_compile_job *head, *tail;  /* waiting jobs, oldest first */
    int n_queued;                  /* their number */
    int queue;                     /* at most this many wait */
    bool stop;                     /* api_compile_free: threads exit */
    int n_threads;                 /* started */
    pthread_t *threads;            /* (n_threads) */
};

static bool api_compile_cancelled(void *ctx)
{
    return atomic_load(&((api_compile_job *)ctx)->cancel);
}

static void *api_compile_main(void *arg)
{
    api_compile_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop) pthread_cond_wait(&p->work, &p->mu);
        if (!p->head) break;
        api_compile_job *j = p->head;
        p->head = j->next;
        if (!p->head) p->tail = NULL;
        p->n_queued--;
        pthread_mutex_unlock(&p->mu);
        /* a job whose client went while it waited still runs: its compile stops at its first
         * poll, and the waiter gets the compile's own error to answer with */
        grammar_cancel_set(api_compile_cancelled, j);
        bool res = j->fn(j->arg);
        grammar_cancel_set(NULL, NULL);
        pthread_mutex_lock(&p->mu);
        j->result = res;
        j->done = true;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

api_compile_pool *api_compile_new(int n_threads, int queue)
{
    api_compile_pool *p = xcalloc(1, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    util_cond_init(&p->done);
    p->queue = queue < 1 ? 1 : queue;
    p->threads = xcalloc((size_t)(n_threads < 1 ? 1 : n_threads), sizeof *p->threads);
    for (int i = 0; i < n_threads || i == 0; i++) {
        if (pthread_create(&p->threads[p->n_threads], NULL, api_compile_main, p) != 0) break;
        p->n_threads++;
    }
    if (p->n_threads == 0) {
        api_compile_free(p);
        return NULL;
    }
    return p;
}

void api_compile_free(api_compile_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

static api_compile_pool *api_compile_the_pool;
static pthread_once_t api_compile_once = PTHREAD_ONCE_INIT;

static void api_compile_start(void)
{
    api_compile_the_pool = api_compile_new(API_COMPILE_THREADS, API_COMPILE_QUEUE);
}

api_compile_pool *api_compile_shared(void)
{
    pthread_once(&api_compile_once, api_compile_start);
    return api_compile_the_pool;
}

int api_compile_waiting(api_compile_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int n = p->n_queued;
    pthread_mutex_unlock(&p->mu);
    return n;
}

api_compile_status api_compile_run(api_compile_pool *p, bool (*fn)(void *arg), void *arg, bool (*gone)(void *ctx),
                                   void *gone_ctx, bool *result)
{
    api_compile_job j = { .fn = fn, .arg = arg };
    atomic_init(&j.cancel, false);
    pthread_mutex_lock(&p->mu);
    if (p->n_queued >= p->queue) {
        pthread_mutex_unlock(&p->mu);
        return API_COMPILE_BUSY;
    }
    if (p->tail) p->tail->next = &j;
    else p->head = &j;
    p->tail = &j;
    p->n_queued++;
    pthread_cond_signal(&p->work);
    const int poll_ms = (int)(GRAMMAR_CANCEL_POLL_S * 1000);
    while (!j.done) {
        util_cond_wait_ms(&p->done, &p->mu, poll_ms > 0 ? poll_ms : 1);
        if (!j.done && gone && !atomic_load(&j.cancel)) {
            pthread_mutex_unlock(&p->mu);  /* the check may take the server's locks */
            if (gone(gone_ctx)) atomic_store(&j.cancel, true);
            pthread_mutex_lock(&p->mu);
        }
    }
    pthread_mutex_unlock(&p->mu);
    *result = j.result;
    return API_COMPILE_DONE;
}
