/*
 * harness: the unit-test harness. A test file defines TEST(name) functions and lists them in
 * main with RUN(name); CHECK records a failure with file:line and keeps going. The last line
 * printed is "N passed, N failed", the summary CI reads; the exit status is non-zero on any
 * failure.
 */
#ifndef TM_HARNESS_H
#define TM_HARNESS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

static int harness_failed_checks;
static int harness_passed, harness_failed;

#define TEST(name) static void name(void)
#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            harness_failed_checks++;                                                   \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                              \
    } while (0)
#define CHECKF(cond, ...)                                                              \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            harness_failed_checks++;                                                   \
            fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
        }                                                                              \
    } while (0)
/* TESTS_ONLY=a,b runs only the tests whose names are listed (unset: all of them); the others
 * count as neither passed nor failed (the aarch64 tests under emulation pick some this way). */
static inline bool harness_selected(const char *name)
{
    const char *only = getenv("TESTS_ONLY");
    if (!only || !*only) return true;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        p += len + (e != NULL);
    }
    return false;
}
#define RUN(name)                                                    \
    do {                                                             \
        if (!harness_selected(#name)) break;                         \
        int before_ = harness_failed_checks;                         \
        name();                                                      \
        if (harness_failed_checks == before_) {                      \
            harness_passed++;                                        \
            printf("ok   %s\n", #name);                              \
        } else {                                                     \
            harness_failed++;                                        \
            printf("FAIL %s\n", #name);                              \
        }                                                            \
        fflush(stdout);                                              \
    } while (0)
/* Polls cond every 2 ms for up to `seconds` of wall time; evaluates to cond's last value.
 * Asynchronous work (write-behind, collectors, drains) gets a generous limit because CI
 * runs these under ASan on two shared cores: the limit only bounds a hang, never a speed. */
#define WAIT_UNTIL(cond, seconds)                                               \
    ({                                                                          \
        struct timespec t0_, t1_;                                               \
        clock_gettime(CLOCK_MONOTONIC, &t0_);                                   \
        bool ok_;                                                               \
        for (;;) {                                                              \
            ok_ = (cond);                                                       \
            if (ok_) break;                                                     \
            clock_gettime(CLOCK_MONOTONIC, &t1_);                               \
            if ((t1_.tv_sec - t0_.tv_sec) + (t1_.tv_nsec - t0_.tv_nsec) * 1e-9  \
                > (seconds)) break;                                             \
            usleep(2000);                                                       \
        }                                                                       \
        ok_;                                                                    \
    })
#define HARNESS_END()                                                     \
    do {                                                                  \
        printf("%d passed, %d failed\n", harness_passed, harness_failed); \
        return harness_failed ? 1 : 0;                                    \
    } while (0)

#endif
