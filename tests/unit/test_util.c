/*
 * test_util: the monotonic timed waits: a wait that nobody ends returns false once its time
 * is up, a signal ends it with true, a deadline already past and a wait of 0 ms return at
 * once, and util_deadline is on the clock the waits use; util_hex and its inverse util_unhex.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#include "util/util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static bool flag;

TEST(test_wait_times_out)
{
    pthread_mutex_lock(&mu);
    bool woken = false;
    for (int i = 0; i < 100 && !woken; i++) woken = util_cond_wait_ms(&cv, &mu, 5) && flag;
    CHECK(!woken);
    CHECK(!util_cond_wait_ms(&cv, &mu, 0));
    CHECK(!util_cond_wait_ms(&cv, &mu, -3));
    struct timespec past;
    util_deadline(&past, CLOCK_MONOTONIC, 0);
    past.tv_sec -= 1;
    CHECK(!util_cond_wait_until(&cv, &mu, &past));
    pthread_mutex_unlock(&mu);
}

static void *signaller(void *arg)
{
    usleep(20 * 1000);
    pthread_mutex_lock(&mu);
    flag = true;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

TEST(test_signal_ends_the_wait)
{
    pthread_t t;
    pthread_mutex_lock(&mu);
    flag = false;
    pthread_create(&t, NULL, signaller, NULL);
    struct timespec dl;
    util_deadline(&dl, CLOCK_MONOTONIC, 60 * 1000);  /* only bounds a hang */
    bool in_time = true;
    while (!flag && in_time) in_time = util_cond_wait_until(&cv, &mu, &dl);
    CHECK(flag && in_time);
    pthread_mutex_unlock(&mu);
    pthread_join(t, NULL);
}

TEST(test_deadline_is_monotonic)
{
    struct timespec a, b;
    util_deadline(&a, CLOCK_MONOTONIC, 1500);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double d = (double)(a.tv_sec - b.tv_sec) + (double)(a.tv_nsec - b.tv_nsec) * 1e-9;
    CHECKF(d > 1.0 && d <= 1.5 && a.tv_nsec < 1000000000L, "deadline %.3f s ahead", d);
}

TEST(test_hex)
{
    char out[9];
    const uint8_t b[4] = { 0x00, 0x0f, 0xa5, 0xff };
    util_hex(b, 4, out);
    CHECKF(!strcmp(out, "000fa5ff"), "%s", out);
    util_hex(b, 0, out);
    CHECK(out[0] == '\0');
}

TEST(test_unhex)
{
    uint8_t b[4] = { 0 };
    CHECK(util_unhex("000fA5ff", 4, b));
    CHECK(b[0] == 0x00 && b[1] == 0x0f && b[2] == 0xa5 && b[3] == 0xff);
    CHECK(!util_unhex("0g", 1, b));
    CHECK(!util_unhex("g0", 1, b));   /* stops at the first bad digit, reads no further */
    CHECK(util_hexval('F') == 15 && util_hexval('a') == 10 && util_hexval('9') == 9);
    CHECK(util_hexval('G') < 0 && util_hexval(' ') < 0 && util_hexval('\0') < 0);
}

int main(void)
{
    util_cond_init(&cv);
    RUN(test_wait_times_out);
    RUN(test_signal_ends_the_wait);
    RUN(test_deadline_is_monotonic);
    RUN(test_hex);
    RUN(test_unhex);
    HARNESS_END();
}
