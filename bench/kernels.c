/*
 * bench/kernels: micro-benchmark of ops_matmul on Qwen3-0.6B-shaped layers (a benchmark, not a
 * test: it prints timings). Build after `make`:
 *   cc -O2 -Isrc -o build/bench_kernels bench/kernels.c build/src/model/ops.o build/src/model/ops_avx2.o \
 *      build/src/model/ops_avx512.o build/src/model/quant.o build/src/model/threadpool.o build/src/util/util.o \
 *      build/src/util/cpu.o build/src/util/bytebuf.o -lm -pthread
 *      build/src/util/topo.o
 * Run: build/bench_kernels [threads] [layers]   (TOKENMILL_SIMD=scalar|avx2|avx512 caps the ISA;
 * with 1 thread the matmuls are timed in thread CPU time, else wall time)
 * Prints, per weight type and batch size, the time of one pass over `layers` layers, the
 * weight bytes streamed per second, and multiply-accumulates per second, next to the
 * machine's measured read bandwidth.
 *
 * build/bench_kernels stream [rows] [reps]: one thread, one token, how fast each type's
 * kernel (repacked where the level has a layout: Q8_0, Q4_K, Q6_K, MXFP4, Q4_0; file layout: Q5_K, F16)
 * streams a rows x 1024 matrix (default 131072 rows: 75-268 MB, past any L3) from memory,
 * next to a plain read loop over as many bytes as the largest (ops_stream_read: the level's
 * widest loads). Every buffer is on huge pages (util_huge_alloc), as tokenmill's repacked
 * weights are: on 4 KiB pages the MXFP4 tile read well below its rate at 4,096 columns. Each rep runs every type and the
 * loop in turn (thread CPU time); it prints the median GB/s and the median of each rep's
 * ratio to the loop, which is what means something on a machine others are using.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/ops.h"
#include "util/util.h"

static double read_bandwidth(threadpool *tp, size_t bytes);
static int stream_main(int argc, char **argv);

typedef struct {
    const char *name;
    int64_t rows, cols;
} shape;

static const shape layer[] = {
    {"q", 2048, 1024}, {"k", 1024, 1024}, {"v", 1024, 1024}, {"o", 1024, 2048},
    {"gate", 3072, 1024}, {"up", 3072, 1024}, {"down", 1024, 3072},
};

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum[64];
} bw_ctx;

static void bw_thread(void *arg, int ith, int nth)
{
    bw_ctx *c = arg;
    size_t i0 = c->n * ith / nth, i1 = c->n * (ith + 1) / nth;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = i0; i + 4 <= i1; i += 4) {
        s0 += c->p[i];
        s1 += c->p[i + 1];
        s2 += c->p[i + 2];
        s3 += c->p[i + 3];
    }
    c->sum[ith] = s0 + s1 + s2 + s3;
}

static double read_bandwidth(threadpool *tp, size_t bytes)
{
    uint64_t *p = malloc(bytes);
    for (size_t i = 0; i < bytes / 8; i++) p[i] = i;
    bw_ctx c = {p, bytes / 8, {0}};
    double best = 0;
    for (int it = 0; it < 5; it++) {
        double t0 = util_now();
        threadpool_run(tp, bw_thread, &c);
        double dt = util_now() - t0;
        if (bytes / dt > best) best = bytes / dt;
    }
    free(p);
    return best;
}

static double thread_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Random weight bytes: fine for speed, with F16 scales kept finite and small (the 0x3b mask).
 * MXFP4's scale is a whole byte of exponent, which that mask would put at 2^-128..2^-69: the
 * products go subnormal and take the multiplier's slow path (it halved the one-token kernel's
 * rate), where a trained matrix's exponents sit near 127. */
static void bench_fill(char *d, size_t sz, qtype t, util_rng *r)
{
    for (size_t i = 0; i < sz; i++) d[i] = (char)(util_rng_next(r) & 0x3b);
    if (t == QTYPE_MXFP4)
        for (size_t i = 0; i < sz; i += sizeof(block_mxfp4)) d[i] = (char)(120 + i % 9);
}

enum { STREAM_REPS_MAX = 101, STREAM_COLS = 1024 };

static int stream_main(int argc, char **argv)
{
    int64_t rows = argc > 2 ? atoll(argv[2]) : 131072;
    int reps = argc > 3 ? atoi(argv[3]) : 15;
    if (rows < 16 || rows % 16 || reps < 1 || reps > STREAM_REPS_MAX) {
        fprintf(stderr, "usage: bench_kernels stream [rows: a multiple of 16] [reps: 1-%d]\n",
                STREAM_REPS_MAX);
        return 1;
    }
    static const qtype st[] = {QTYPE_Q8_0, QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_Q5_K, QTYPE_F16,
                               QTYPE_Q3_K, QTYPE_Q2_K, QTYPE_IQ4_XS, QTYPE_MXFP4, QTYPE_Q4_0};
    enum { NT = TM_ARRAY_LEN(st) };
    threadpool *tp = threadpool_new(1);
    util_rng r;
    util_rng_seed(&r, 1);
    float x[STREAM_COLS], *y = malloc(sizeof(float) * (size_t)rows);
    for (int i = 0; i < STREAM_COLS; i++) x[i] = util_rng_normal(&r);
    size_t ssz = 0;
    for (int k = 0; k < NT; k++) {
        size_t b = ops_matmul_scratch_bytes(st[k], STREAM_COLS, 1);
        if (b > ssz) ssz = b;
    }
    void *scratch = malloc(ssz);
    ops_weight w[NT];
    size_t bytes[NT], most = 0;
    for (int k = 0; k < NT; k++) {
        size_t sz = quant_row_bytes(st[k], STREAM_COLS) * (size_t)rows;
        char *d = util_huge_alloc(sz);
        bench_fill(d, sz, st[k], &r);
        w[k] = (ops_weight){st[k], rows, STREAM_COLS, d};
        qtype rt = ops_repack_type(&w[k]);
        if (rt != st[k]) {
            size_t rsz = quant_row_bytes(rt, STREAM_COLS) * (size_t)rows;
            void *rd = util_huge_alloc(rsz);
            w[k] = ops_repack(tp, &w[k], rd);
            free(d);
            sz = rsz;
        }
        bytes[k] = sz;
        if (sz > most) most = sz;
    }
    most = TM_ALIGN_UP(most, 64);
    uint64_t *buf = util_huge_alloc(most);
    for (size_t i = 0; i < most / 8; i++) buf[i] = i;
    static double gbs[NT + 1][STREAM_REPS_MAX], ratio[NT][STREAM_REPS_MAX];
    uint64_t sink = 0;
    for (int rep = 0; rep < reps; rep++)
        for (int j = 0; j <= NT; j++) {
            int k = (j + rep) % (NT + 1); /* a different order each rep */
            double t0 = thread_cpu_now();
            if (k == NT) sink ^= ops_stream_read(tp, buf, most);
            else ops_matmul(tp, &w[k], x, 1, y, scratch);
            gbs[k][rep] = (double)(k == NT ? most : bytes[k]) / (thread_cpu_now() - t0) / 1e9;
        }
    printf("level %s, one thread, one token, %lld x %d, %d reps (thread CPU time)\n",
           ops_level_name(), (long long)rows, STREAM_COLS, reps);
    for (int k = 0; k < NT; k++)
        for (int rep = 0; rep < reps; rep++) ratio[k][rep] = gbs[k][rep] / gbs[NT][rep];
    for (int k = 0; k <= NT; k++) {
        qsort(gbs[k], (size_t)reps, sizeof(double), cmp_double);
        if (k < NT) qsort(ratio[k], (size_t)reps, sizeof(double), cmp_double);
        printf("%-8s %7.1f MB  median %5.1f GB/s", k == NT ? "read" : quant_type_name(w[k].type),
               (double)(k == NT ? most : bytes[k]) / 1e6, gbs[k][reps / 2]);
        if (k < NT)
            printf("  of the read loop: median %.2f (quartiles %.2f-%.2f)", ratio[k][reps / 2],
                   ratio[k][reps / 4], ratio[k][3 * reps / 4]);
        printf("\n");
    }
    if (sink == 1) printf(" \n"); /* keeps the read loop */
    for (int k = 0; k < NT; k++) free((void *)w[k].data);
    free(buf);
    free(scratch);
    free(y);
    threadpool_free(tp);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "stream")) return stream_main(argc, argv);
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    int n_layers = argc > 2 ? atoi(argv[2]) : 6;
    threadpool *tp = threadpool_new(nth);
    printf("level %s, %d threads, %d layers\n", ops_level_name(), nth, n_layers);
    double bw = read_bandwidth(tp, (size_t)512 << 20);
    printf("read bandwidth: %.1f GB/s\n", bw / 1e9);
    /* Q8_0, Q4_0, MXFP4 and the k-quants twice: as stored, then repacked (ops_repack) where the level
     * has a kernel; Q3_K, Q2_K, IQ4_XS, Q4_1, Q5_0, Q5_1, IQ4_NL, the IQ3 / IQ2 / IQ1 grid types
     * and the ternary types as stored (their batch kernels unpack per call) */
    qtype types[] = {QTYPE_Q8_0, QTYPE_Q8_0_X16, QTYPE_Q4_K, QTYPE_Q4_K_X16, QTYPE_Q6_K, QTYPE_Q6_K_X16,
                     QTYPE_Q4_0, QTYPE_Q4_0_X16, QTYPE_MXFP4, QTYPE_MXFP4_X16, QTYPE_F16,
                     QTYPE_Q3_K, QTYPE_Q2_K, QTYPE_IQ4_XS, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_IQ4_NL,
                     QTYPE_IQ3_S, QTYPE_IQ3_XXS, QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S,
                     QTYPE_IQ1_S, QTYPE_IQ1_M, QTYPE_TQ1_0, QTYPE_TQ2_0};
    const char *only = getenv("BENCH_TYPES"); /* e.g. "q4_K,q4_Kx16" */
    int batches[] = {1, 4, 16, 128, 512};
    int nl = (int)TM_ARRAY_LEN(layer);
    float *x = malloc(sizeof(float) * 512 * 3072), *y = malloc(sizeof(float) * 512 * 3072);
    util_rng r;
    util_rng_seed(&r, 1);
    for (int i = 0; i < 512 * 3072; i++) x[i] = util_rng_normal(&r);
    void *scratch = malloc(ops_matmul_scratch_bytes(QTYPE_F16, 3072, 512) + 
                           ops_matmul_scratch_bytes(QTYPE_Q8_0, 3072, 512));
    for (size_t ti = 0; ti < TM_ARRAY_LEN(types); ti++) {
        qtype t = types[ti], st = t == QTYPE_Q4_K_X16   ? QTYPE_Q4_K
                                 : t == QTYPE_Q6_K_X16 ? QTYPE_Q6_K
                                 : t == QTYPE_Q8_0_X16 ? QTYPE_Q8_0
                                 : t == QTYPE_Q4_0_X16 ? QTYPE_Q4_0
                                 : t == QTYPE_MXFP4_X16 ? QTYPE_MXFP4 : t;
        if (only) {
            const char *p = strstr(only, quant_type_name(t));
            size_t n = strlen(quant_type_name(t));
            while (p && ((p > only && p[-1] != ',') || (p[n] && p[n] != ',')))
                p = strstr(p + 1, quant_type_name(t));
            if (!p)
                continue;
        }
        ops_weight *ws = malloc(sizeof(ops_weight) * n_layers * nl);
        size_t total = 0;
        double macs = 0;
        for (int l = 0; l < n_layers; l++)
            for (int j = 0; j < nl; j++) {
                size_t sz = quant_row_bytes(st, layer[j].cols) * layer[j].rows;
                char *d = malloc(sz);
                bench_fill(d, sz, st, &r);
                ws[l * nl + j] = (ops_weight){st, layer[j].rows, layer[j].cols, d};
                if (t != st) {
                    if (ops_repack_type(&ws[l * nl + j]) != t) {
                        printf("%s: no repacked kernel at this level\n", quant_type_name(t));
                        return 0;
                    }
                    size_t rsz = quant_row_bytes(t, layer[j].cols) * layer[j].rows;
                    void *rd = aligned_alloc(64, TM_ALIGN_UP(rsz, 64));
                    ws[l * nl + j] = ops_repack(tp, &ws[l * nl + j], rd);
                    free(d);
                    sz = rsz;
                }
                total += sz;
                macs += (double)layer[j].rows * layer[j].cols;
            }
        for (size_t bi = 0; bi < TM_ARRAY_LEN(batches); bi++) {
            int nt = batches[bi];
            int reps = nt >= 128 ? 1 : 3;
            double best = 1e9;
            for (int rep = 0; rep < reps + 1; rep++) {
                /* one thread runs on the caller: its CPU time, which others' load on a
                 * shared machine does not inflate */
                double t0 = nth == 1 ? thread_cpu_now() : util_now();
                for (int i = 0; i < n_layers * nl; i++) ops_matmul(tp, &ws[i], x, nt, y, scratch);
                double dt = (nth == 1 ? thread_cpu_now() : util_now()) - t0;
                if (rep > 0 && dt < best) best = dt;
            }
            printf("%-5s batch %3d: %8.2f ms  %6.1f GB/s weights (%3.0f%% of bw)  %7.1f GMAC/s  %8.1f tok/s-equiv(x%.0f layers)\n",
                   quant_type_name(t), nt, best * 1e3, total / best / 1e9, 100 * total / best / bw,
                   macs * nt / best / 1e9, nt / best * n_layers / 28.0, 28.0);
        }
        for (int i = 0; i < n_layers * nl; i++) free((void *)ws[i].data);
        free(ws);
    }
    threadpool_free(tp);
    return 0;
}
