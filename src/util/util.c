/*
 * util: checked allocation, time, logging, whole-file reads and the project's PRNG.
 * See util.h for the contracts.
 */
#include "util/util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

log_level util_log_level = LOG_LEVEL_INFO;

void util_oom(size_t sz)
{
    fprintf(stderr, "tokenmill: out of memory allocating %zu bytes\n", sz);
    abort();
}

void *xmalloc(size_t sz)
{
    void *p = malloc(sz ? sz : 1);
    if (!p) util_oom(sz);
    return p;
}

void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) util_oom(n * sz);
    return p;
}

void *xrealloc(void *p, size_t sz)
{
    void *q = realloc(p, sz ? sz : 1);
    if (!q) util_oom(sz);
    return q;
}

char *xstrdup(const char *z)
{
    size_t n = strlen(z) + 1;
    char *p = xmalloc(n);
    memcpy(p, z, n);
    return p;
}

void *util_aligned_alloc(size_t sz)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, TM_ALIGN_UP(sz ? sz : 1, 64)) != 0) return NULL;
    return p;
}

void *util_huge_alloc(size_t sz)
{
    const size_t huge = (size_t)2 << 20;
    size_t n = TM_ALIGN_UP(sz ? sz : 1, huge);
    void *p = aligned_alloc(huge, n);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

static int util_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void util_sort_doubles(double *v, size_t n) { qsort(v, n, sizeof *v, util_cmp_double); }

double util_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void util_deadline(struct timespec *ts, clockid_t clk, int ms)
{
    clock_gettime(clk, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) { ts->tv_sec++; ts->tv_nsec -= 1000000000L; }
}

void util_hex(const void *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

int util_hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool util_unhex(const char *z, size_t n, void *out)
{
    uint8_t *b = out;
    for (size_t i = 0; i < n; i++) {
        int hi = util_hexval(z[2 * i]), lo = hi < 0 ? -1 : util_hexval(z[2 * i + 1]);
        if (lo < 0) return false;
        b[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

void util_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

bool util_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *deadline)
{
    return pthread_cond_timedwait(cv, mu, deadline) != ETIMEDOUT;
}

bool util_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, long ms)
{
    if (ms <= 0) return false;
    struct timespec ts;
    util_deadline(&ts, CLOCK_MONOTONIC, ms > INT_MAX ? INT_MAX : (int)ms);
    return util_cond_wait_until(cv, mu, &ts);
}

void util_log(log_level lvl, const char *fmt, ...)
{
    static const char *names[] = { "debug", "info", "warn", "error" };
    if (lvl < util_log_level) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tokenmill %s: %s\n", names[lvl], line);
}

char *util_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fclose(f); errno = ENOMEM; return NULL; }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); fclose(f); errno = ENOMEM; return NULL; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); errno = EIO; return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static uint64_t util_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void util_rng_seed(util_rng *r, uint64_t seed)
{
    /* splitmix64 expands the seed so that nearby seeds give unrelated streams */
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        r->s[i] = z ^ (z >> 31);
    }
}

uint64_t util_rng_next(util_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = util_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = util_rotl(s[3], 45);
    return result;
}

double util_rng_uniform(util_rng *r)
{
    return (double)(util_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

float util_rng_normal(util_rng *r)
{
    double u1 = util_rng_uniform(r), u2 = util_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
