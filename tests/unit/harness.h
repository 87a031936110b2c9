/*
 * harness: the unit-test harness. A test file defines TEST(name) functions and lists them in
 * main with RUN(name); CHECK records a failure with file:line and keeps going. The last line
 * printed is "N passed, N failed", the summary CI reads; the exit status is non-zero on any
 * failure.
 */
#ifndef TM_HARNESS_H
#define TM_HARNESS_H

#include <stdio.h>
#include <string.h>
#include <math.h>

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
#define RUN(name)                                                    \
    do {                                                             \
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
#define HARNESS_END()                                                     \
    do {                                                                  \
        printf("%d passed, %d failed\n", harness_passed, harness_failed); \
        return harness_failed ? 1 : 0;                                    \
    } while (0)

#endif
