/*
 * bench/sample: time per sample_token call on a large vocabulary, for the parameter sets the
 * server sees (greedy, the OpenAI APIs' default of plain temperature over the whole vocabulary,
 * top-p / min-p without top-k, llama.cpp's default chain, penalties on). Not part of the build
 * or the tests; compile by hand against any sample.c (e.g. main's, for "before" numbers):
 *
 *   cc -O2 -g -fno-math-errno -Isrc -o /tmp/bench_sample bench/sample.c src/engine/sample.c \
 *      src/util/util.c -lm && /tmp/bench_sample [n_vocab] [iters]
 *
 * Prints the median and 90th percentile of the per-call time (the machine is shared).
 * Logits are LLM-like: a normal bulk (sd 2.5) with a few tokens 8..16 above it ("peaked"), or
 * the bulk alone ("flat"); a fresh vector every call so caches do not flatter the result.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample.h"
#include "util/util.h"

enum { N_VEC = 8 };

static void bench_fill(float *lg, int n, bool peaked, util_rng *r)
{
    for (int i = 0; i < n; i++) lg[i] = 2.5f * util_rng_normal(r);
    if (peaked)
        for (int j = 0; j < 5; j++) lg[util_rng_next(r) % (uint64_t)n] += 8.0f + 2.0f * (float)j;
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench_one(const char *name, sample_params p, float **vecs, int n, int iters)
{
    sampler *s = sample_new(n, &p);
    for (int i = 0; i < 64; i++) sample_accept(s, (int32_t)((i * 7919) % n));
    long sum = 0;
    double *dt = xmalloc((size_t)iters * sizeof *dt);
    for (int i = 0; i < iters; i++) {
        double t0 = util_now();
        sum += sample_token(s, vecs[i % N_VEC]);
        dt[i] = util_now() - t0;
    }
    qsort(dt, (size_t)iters, sizeof *dt, bench_cmp);
    printf("  %-36s median %8.1f  p90 %8.1f us/token  (checksum %ld)\n", name,
           dt[iters / 2] * 1e6, dt[iters * 9 / 10] * 1e6, sum);
    free(dt);
    sample_free(s);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 151936, iters = argc > 2 ? atoi(argv[2]) : 200;
    util_rng r;
    util_rng_seed(&r, 1);
    float *vecs[2][N_VEC];
    for (int k = 0; k < 2; k++)
        for (int v = 0; v < N_VEC; v++) {
            vecs[k][v] = xmalloc((size_t)n * sizeof(float));
            bench_fill(vecs[k][v], n, k == 0, &r);
        }
    sample_params base = sample_params_default();
    base.seed = 5;
    for (int k = 0; k < 2; k++) {
        printf("n_vocab %d, %s logits, %d calls each\n", n, k == 0 ? "peaked" : "flat", iters);
        sample_params p = base;
        p.temp = 0, p.top_k = 0, p.top_p = 1, p.min_p = 0;
        bench_one("greedy", p, vecs[k], n, iters);
        p.repeat_penalty = 1.1f, p.presence_penalty = 0.5f;
        bench_one("greedy + penalties", p, vecs[k], n, iters);
        p = base;
        p.temp = 1, p.top_k = 0, p.top_p = 1, p.min_p = 0;
        bench_one("temp 1 (OpenAI default)", p, vecs[k], n, iters);
        p.presence_penalty = 0.5f, p.frequency_penalty = 0.3f;
        bench_one("temp 1 + presence/frequency", p, vecs[k], n, iters);
        p = base;
        p.temp = 0.7f, p.top_k = 0, p.top_p = 0.9f, p.min_p = 0;
        bench_one("temp 0.7 top-p 0.9", p, vecs[k], n, iters);
        p.min_p = 0.05f, p.top_p = 0.95f;
        bench_one("temp 0.7 top-p 0.95 min-p 0.05", p, vecs[k], n, iters);
        p.top_p = 1.0f;
        bench_one("temp 0.7 min-p 0.05", p, vecs[k], n, iters);
        bench_one("llama.cpp default (top-k 40 ...)", base, vecs[k], n, iters);
    }
    for (int k = 0; k < 2; k++)
        for (int v = 0; v < N_VEC; v++) free(vecs[k][v]);
    return 0;
}
