/*
 * util: the few helpers every module may use: checked allocation, monotonic time, logging.
 *
 * Allocation failure in setup code is reported by returning NULL from the xmalloc family's
 * callers' own constructors; xmalloc itself aborts with a message, because a process that
 * cannot get a few kilobytes for bookkeeping cannot serve anyway. Large buffers (KV pool,
 * model scratch) use plain malloc and report failure to the caller.
 *
 * Logging goes to stderr, one line per call, prefixed by level; the level is set once at start
 * (util_log_level) and read without a lock.
 */
#ifndef TM_UTIL_H
#define TM_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <time.h>

#include <pthread.h>

#define TM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TM_ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

void *xmalloc(size_t sz);
void *xcalloc(size_t n, size_t sz);
void *xrealloc(void *p, size_t sz);
char *xstrdup(const char *z);
/* The xmalloc family's end: "out of memory allocating SZ bytes" on stderr, then abort. */
void util_oom(size_t sz) __attribute__((noreturn));
/* 64-byte aligned allocation for SIMD buffers; free with free(). Returns NULL on failure. */
void *util_aligned_alloc(size_t sz);
/* sz bytes rounded up to whole 2 MiB, 2 MiB aligned, with huge pages asked for (advice the
 * kernel may ignore): memory streamed end to end, where TLB misses on 4 KiB pages cost.
 * Free with free(). Returns NULL on failure. */
void *util_huge_alloc(size_t sz);
/* Sorts v[0..n) ascending (quantiles of timings). */
void util_sort_doubles(double *v, size_t n);

/* Seconds from an arbitrary fixed point (CLOCK_MONOTONIC). */
double util_now(void);
/* The time ms milliseconds from now on clock clk, as pthread_cond_timedwait wants it
 * (CLOCK_MONOTONIC for a condition variable made with that clock, else CLOCK_REALTIME). */
void util_deadline(struct timespec *ts, clockid_t clk, int ms);

/* Hex, the one encoder and decoder. util_hex: lower-case hex of p[0..n) into out, which holds
 * 2n+1 bytes (NUL-terminated). util_hexval: the value of one hex digit (either case), or -1.
 * util_unhex: the n bytes that the 2n hex digits at z spell (either case) into out; false at
 * the first character that is not a hex digit (out then holds a prefix only). */
void util_hex(const void *p, size_t n, char *out);
int util_hexval(char c);
bool util_unhex(const char *z, size_t n, void *out);

/* Condition variables with timed waits on CLOCK_MONOTONIC, so that a step of the wall clock
 * (NTP, an operator) neither cuts a wait short nor stretches it by the step. A cv made with
 * util_cond_init takes only these timed waits (and pthread_cond_wait). */
void util_cond_init(pthread_cond_t *cv);
/* Waits on cv (mu held) at most ms milliseconds; ms <= 0 does not wait. False when the time
 * ran out (a wake-up may still be spurious: callers re-check their condition). */
bool util_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, long ms);
/* Waits on cv until the deadline (util_deadline with CLOCK_MONOTONIC); false once it passed. */
bool util_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *deadline);

typedef enum { LOG_LEVEL_DEBUG = 0, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR } log_level;
extern log_level util_log_level;
void util_log(log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) util_log(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_info(...)  util_log(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_warn(...)  util_log(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_error(...) util_log(LOG_LEVEL_ERROR, __VA_ARGS__)

/* Reads a whole file into a malloc'd buffer (NUL-terminated, *len excludes the NUL).
 * Returns NULL and sets errno on failure. */
char *util_read_file(const char *path, size_t *len);

/* Deterministic 64-bit PRNG (xoshiro256**), for sampling and generated models. */
typedef struct { uint64_t s[4]; } util_rng;
void util_rng_seed(util_rng *r, uint64_t seed);
uint64_t util_rng_next(util_rng *r);
double util_rng_uniform(util_rng *r);   /* [0, 1) with 53 random bits */
float util_rng_normal(util_rng *r);     /* standard normal (Box-Muller) */

#endif
