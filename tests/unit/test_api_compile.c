/*
 * test_api_compile: the structured-output compile pool runs a compile on its own thread and
 * hands back its result; a compile sees "cancelled" once its waiter's client has gone (and
 * not before); a full queue refuses at once instead of waiting.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#include "grammar/grammar.h"
#include "recipe/api_compile.h"

static bool ret_arg(void *arg)
{
    return *(bool *)arg;
}

static bool on_other_thread(void *arg)
{
    return !pthread_equal(pthread_self(), *(pthread_t *)arg);
}

TEST(test_runs_and_returns)
{
    api_compile_pool *p = api_compile_new(2, 4);
    CHECK(p != NULL);
    if (!p) return;
    bool t = true, f = false, res = false;
    CHECK(api_compile_run(p, ret_arg, &t, NULL, NULL, &res) == API_COMPILE_DONE && res);
    CHECK(api_compile_run(p, ret_arg, &f, NULL, NULL, &res) == API_COMPILE_DONE && !res);
    pthread_t me = pthread_self();
    CHECK(api_compile_run(p, on_other_thread, &me, NULL, NULL, &res) == API_COMPILE_DONE && res);
    api_compile_free(p);
}

/* Compiles a one-rule regex until a compile reports "cancelled" (true) or *arg tries pass. */
static bool compile_until_cancelled(void *arg)
{
    int tries = *(int *)arg;
    for (int i = 0; i < tries; i++) {
        char err[256];
        grammar *g = NULL;
        grammar_status st = grammar_compile(GRAMMAR_KIND_REGEX, "a", 1, &g, err, sizeof err);
        grammar_free(g);
        if (st != GRAMMAR_OK) return st == GRAMMAR_ERR_LIMIT && strstr(err, "cancelled");
        usleep(1000);
    }
    return false;
}

static bool gone_yes(void *ctx) { return true; }
static bool gone_no(void *ctx) { return false; }

TEST(test_cancelled_when_the_client_goes)
{
    api_compile_pool *p = api_compile_new(1, 4);
    if (!p) return;
    bool res = false;
    int many = 20000;  /* 20 s: only bounds a hang */
    CHECK(api_compile_run(p, compile_until_cancelled, &many, gone_yes, NULL, &res) == API_COMPILE_DONE && res);
    int few = 30;
    CHECK(api_compile_run(p, compile_until_cancelled, &few, gone_no, NULL, &res) == API_COMPILE_DONE && !res);
    /* the hook was the compile thread's: the next job starts without it */
    CHECK(api_compile_run(p, compile_until_cancelled, &few, NULL, NULL, &res) == API_COMPILE_DONE && !res);
    api_compile_free(p);
}

static atomic_bool held_running, release;

static bool hold(void *arg)
{
    atomic_store(&held_running, true);
    while (!atomic_load(&release)) usleep(1000);
    return true;
}

typedef struct {
    api_compile_pool *p;
    api_compile_status st;
    bool res;
} runner;

static void *run_hold(void *arg)
{
    runner *r = arg;
    r->st = api_compile_run(r->p, hold, NULL, NULL, NULL, &r->res);
    return NULL;
}

TEST(test_full_queue_refuses)
{
    api_compile_pool *p = api_compile_new(1, 1);
    if (!p) return;
    runner a = { .p = p }, b = { .p = p };
    pthread_t ta, tb;
    pthread_create(&ta, NULL, run_hold, &a);
    while (!atomic_load(&held_running)) usleep(1000);
    pthread_create(&tb, NULL, run_hold, &b);
    while (api_compile_waiting(p) < 1) usleep(1000);
    bool t = true, res = false;
    CHECK(api_compile_run(p, ret_arg, &t, NULL, NULL, &res) == API_COMPILE_BUSY);
    atomic_store(&release, true);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(a.st == API_COMPILE_DONE && a.res && b.st == API_COMPILE_DONE && b.res);
    /* room again */
    CHECK(api_compile_run(p, ret_arg, &t, NULL, NULL, &res) == API_COMPILE_DONE && res);
    api_compile_free(p);
}

int main(void)
{
    RUN(test_runs_and_returns);
    RUN(test_cancelled_when_the_client_goes);
    RUN(test_full_queue_refuses);
    HARNESS_END();
}
