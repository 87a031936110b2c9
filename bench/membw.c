/* membw: measures the machine's memory read bandwidth, the ceiling for decode speed.
 *
 * Decode of one token reads every weight once, so tokens/s can never beat
 * read_bandwidth / weight_bytes. This program reads a buffer much larger than the caches
 * (default 1 GiB) with NTHREADS threads, each summing its own contiguous slice with wide
 * loads, and reports the best of several passes as one JSON line. A pass lasts from the first
 * thread's start to the last one's end, each read by the thread itself: timed by the main
 * thread around the barriers instead, a pass with as many threads as CPUs looked up to 1.5x
 * faster than it was, because the woken main thread waited for a CPU (milliseconds) while the
 * readers already ran:
 *   {"threads": N, "bytes": B, "read_gb_s": X, "passes": P}
 * (GB = 1e9 bytes). Built by bench/engine.mjs with `cc -O2 -march=native -pthread`; not part
 * of the tokenmill binary.
 *
 * usage: membw [THREADS] [MIB] [PASSES]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

typedef struct membw_slice {
    const uint8_t *p;     /* start of this thread's slice, 64-byte aligned */
    size_t         n;     /* bytes, a multiple of 128 */
    pthread_barrier_t *bar; /* start barrier shared by all threads */
    uint64_t       sink;  /* folded sum, so the loads are not optimised away */
    double         t0, t1; /* seconds (CLOCK_MONOTONIC): this thread's read began, ended */
} membw_slice;

static double membw_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t membw_read(const uint8_t *p, size_t n) {
#if defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, s);
    return out[0] + out[1] + out[2] + out[3];
#else
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        s0 += q[i]; s1 += q[i + 1]; s2 += q[i + 2]; s3 += q[i + 3];
    }
    return s0 + s1 + s2 + s3;
#endif
}

static void *membw_thread(void *arg) {
    membw_slice *s = arg;
    pthread_barrier_wait(s->bar);
    s->t0 = membw_now();
    s->sink += membw_read(s->p, s->n);
    s->t1 = membw_now();
    return NULL;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 1;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int passes = argc > 3 ? atoi(argv[3]) : 5;
    if (nth < 1 || nth > 1024 || mib < 16 || passes < 1) {
        fprintf(stderr, "usage: membw [THREADS] [MIB>=16] [PASSES]\n");
        return 2;
    }
    size_t bytes = mib << 20;
    uint8_t *buf = aligned_alloc(64, bytes);
    if (!buf) {
        fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    memset(buf, 1, bytes); /* fault every page in before timing */

    size_t per = (bytes / (size_t)nth) & ~(size_t)127;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nth);
    membw_slice *sl = calloc((size_t)nth, sizeof *sl);
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < passes; pass++) {
        for (int i = 0; i < nth; i++) {
            sl[i] = (membw_slice){ .p = buf + (size_t)i * per, .n = per, .bar = &bar };
            pthread_create(&th[i], NULL, membw_thread, &sl[i]);
        }
        double t0 = 0, t1 = 0;
        for (int i = 0; i < nth; i++) {
            pthread_join(th[i], NULL);
            sink += sl[i].sink;
            if (i == 0 || sl[i].t0 < t0) t0 = sl[i].t0;
            if (i == 0 || sl[i].t1 > t1) t1 = sl[i].t1;
        }
        double dt = t1 - t0;
        double gbs = (double)(per * (size_t)nth) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("{\"threads\": %d, \"bytes\": %zu, \"read_gb_s\": %.3f, \"passes\": %d, \"sink\": %llu}\n",
           nth, per * (size_t)nth, best, passes, (unsigned long long)(sink & 0xff));
    pthread_barrier_destroy(&bar);
    free(sl);
    free(th);
    free(buf);
    return 0;
}
