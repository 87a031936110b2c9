/*
 * bench/cache_store: block store throughput (a benchmark, not a test). Built and run by
 * bench/cache after `make`. Prints, for blocks shaped like a real model's 128-token KV block
 * (default 28 layers x 8 KV heads x 128 dims, F16 = 14.7 MB, Qwen3-0.6B):
 *   - put and get GB/s and per-block latency for dir: and ec:10+2 (T threads); "get" is
 *     store_get (a fresh buffer per block, all of them kept until the run ends, as a load holds
 *     its blocks until their fill), "get into" is store_get_into a buffer reused from block to
 *     block (what blockio does with its kept read buffers: no page faults),
 *   - ISA-L Reed-Solomon 10+2 encode and decode (2 data fragments lost) GB/s on one core,
 *   - CRC-64 (block payload checksum) GB/s on one core.
 * Reads usually hit the page cache right after the writes, so get numbers are the software
 * path (read + verify + decode), not the disk; run with --cold as root to drop caches first.
 * Usage: cache_store [--dir BASE] [--blocks N] [--threads T] [--layers L] [--cold] [--json]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <isa-l/erasure_code.h>

#include "cache/block.h"
#include "cache/blockkey.h"
#include "cache/store.h"
#include "util/util.h"

typedef struct {
    store *s;
    uint8_t (*keys)[32];
    void **files;
    size_t n_bytes;
    int i0, i1;               /* block range [i0, i1) */
    int mode;                 /* 0 put, 1 get (fresh buffers, kept), 2 get into a reused buffer */
    void **got;               /* (n_blocks) mode 1: the blocks read, freed after the run */
    void *buf;                /* mode 2: this thread's buffer (n_bytes, faulted in) */
    int n_ok;
} bench_job;

static void *bench_worker(void *p)
{
    bench_job *j = p;
    for (int i = j->i0; i < j->i1; i++) {
        size_t n;
        if (j->mode == 0) {
            j->n_ok += store_put(j->s, j->keys[i], j->files[i], j->n_bytes, 0) == STORE_OK;
        } else if (j->mode == 1) {
            if (store_get(j->s, j->keys[i], 0, &j->got[i], &n) == STORE_OK) j->n_ok += n == j->n_bytes;
        } else {
            if (store_get_into(j->s, j->keys[i], 0, j->buf, j->n_bytes, &n) == STORE_OK) j->n_ok += n == j->n_bytes;
        }
    }
    return NULL;
}

static double bench_run(store *s, uint8_t (*keys)[32], void **files, size_t n_bytes, int n_blocks, int n_threads,
                        int mode, int *n_ok)
{
    pthread_t th[64];
    bench_job jobs[64];
    void **got = xcalloc((size_t)n_blocks, sizeof *got);
    for (int t = 0; t < n_threads; t++) {
        jobs[t] = (bench_job){ s, keys, files, n_bytes, n_blocks * t / n_threads, n_blocks * (t + 1) / n_threads, mode, got,
                               NULL, 0 };
        if (mode == 2) {
            jobs[t].buf = util_aligned_alloc(n_bytes);
            memset(jobs[t].buf, 0, n_bytes);
        }
    }
    double t0 = util_now();
    for (int t = 0; t < n_threads; t++) pthread_create(&th[t], NULL, bench_worker, &jobs[t]);
    *n_ok = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        *n_ok += jobs[t].n_ok;
    }
    double dt = util_now() - t0;
    for (int t = 0; t < n_threads; t++) free(jobs[t].buf);
    for (int b = 0; b < n_blocks; b++) free(got[b]);
    free(got);
    return dt;
}

static void bench_drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (f) {
        fputs("3\n", f);
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    const char *base = "/tmp";
    int n_blocks = 16, n_threads = 2, n_layers = 28;
    bool cold = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) base = argv[++i];
        else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) n_blocks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) n_layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cold")) cold = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else {
            fprintf(stderr, "usage: cache_store [--dir BASE] [--blocks N] [--threads T] [--layers L] [--cold] [--json]\n");
            return 2;
        }
    }
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 64) n_threads = 64;
    util_log_level = LOG_LEVEL_ERROR;

    /* blocks */
    uint8_t (*keys)[32] = xmalloc(sizeof(*keys) * (size_t)n_blocks);
    void **files = xmalloc(sizeof(void *) * (size_t)n_blocks);
    uint8_t fp[32] = { 1 }, parent[32] = { 0 };
    size_t n_bytes = 0;
    util_rng r;
    util_rng_seed(&r, 1);
    for (int b = 0; b < n_blocks; b++) {
        int32_t toks[128];
        for (int t = 0; t < 128; t++) toks[t] = b * 128 + t;
        blockkey_compute(parent, toks, fp, keys[b]);
        memcpy(parent, keys[b], 32);
        block_header h;
        block_header_init(&h, keys[b], fp, 1, 2, n_layers, 8, 128, 2);
        files[b] = block_alloc(&h);
        uint64_t *p = block_payload(files[b]);
        for (size_t i = 0; i < h.payload_bytes / 8; i++) p[i] = util_rng_next(&r);
        block_seal(&h, files[b]);
        n_bytes = block_file_bytes(&h);
    }
    double gb = (double)n_bytes * n_blocks / 1e9;

    char root[256];
    snprintf(root, sizeof root, "%s/tm-bench-cache-XXXXXX", base);
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    char dirspec[512], ecspec[4096];
    snprintf(dirspec, sizeof dirspec, "dir:%s/dir", root);
    int n = snprintf(ecspec, sizeof ecspec, "ec:10+2:");
    for (int i = 0; i < 12; i++) n += snprintf(ecspec + n, sizeof ecspec - (size_t)n, "%s%s/ec%d", i ? "," : "", root, i);

    const char *specs[2] = { dirspec, ecspec }, *names[2] = { "dir:", "ec:10+2" };
    double put_gbs[2] = { 0 }, get_gbs[2] = { 0 }, get_ms[2] = { 0 }, put_ms[2] = { 0 }, into_gbs[2] = { 0 },
           into_ms[2] = { 0 };
    for (int k = 0; k < 2; k++) {
        store *s;
        store_opts o = { 0 };
        if (store_open(specs[k], &o, &s) != STORE_OK) {
            fprintf(stderr, "cannot open %s\n", specs[k]);
            return 1;
        }
        int ok;
        double tp = bench_run(s, keys, files, n_bytes, n_blocks, n_threads, 0, &ok);
        if (ok != n_blocks) fprintf(stderr, "%s: %d of %d puts failed\n", names[k], n_blocks - ok, n_blocks);
        if (cold) bench_drop_caches();
        double tg = bench_run(s, keys, files, n_bytes, n_blocks, n_threads, 1, &ok);
        if (ok != n_blocks) fprintf(stderr, "%s: %d of %d gets failed\n", names[k], n_blocks - ok, n_blocks);
        if (cold) bench_drop_caches();
        double ti = bench_run(s, keys, files, n_bytes, n_blocks, n_threads, 2, &ok);
        if (ok != n_blocks) fprintf(stderr, "%s: %d of %d gets into a buffer failed\n", names[k], n_blocks - ok, n_blocks);
        into_gbs[k] = gb / ti;
        into_ms[k] = ti * 1e3 * n_threads / n_blocks;
        put_gbs[k] = gb / tp;
        get_gbs[k] = gb / tg;
        put_ms[k] = tp * 1e3 * n_threads / n_blocks;
        get_ms[k] = tg * 1e3 * n_threads / n_blocks;
        store_close(s);
    }

    /* ISA-L 10+2 on one core: encode, and decode of two lost data fragments */
    int K = 10, M = 2;
    size_t frag = 1 << 20;
    uint8_t *buf = util_aligned_alloc(frag * (size_t)(K + M + 2));
    for (size_t i = 0; i < frag * (size_t)K; i += 8) {
        uint64_t v = util_rng_next(&r);
        memcpy(buf + i, &v, 8);
    }
    uint8_t *data[12], *par[2], a[12 * 10], tb[32 * 10 * 2];
    for (int i = 0; i < K; i++) data[i] = buf + (size_t)i * frag;
    for (int i = 0; i < M; i++) par[i] = buf + (size_t)(K + i) * frag;
    gf_gen_cauchy1_matrix(a, K + M, K);
    ec_init_tables(K, M, a + K * K, tb);
    int reps = 30;
    double t0 = util_now();
    for (int i = 0; i < reps; i++) ec_encode_data((int)frag, K, M, tb, data, par);
    double enc_gbs = (double)frag * K * reps / (util_now() - t0) / 1e9;
    /* lose data 0 and 1: sources 2..9 + parity 10, 11 */
    uint8_t bm[100], inv[100], rows[20], dtb[32 * 10 * 2], *src[10], *out[2];
    int srcs[10] = { 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 };
    for (int i = 0; i < K; i++) {
        memcpy(bm + i * K, a + srcs[i] * K, (size_t)K);
        src[i] = srcs[i] < K ? data[srcs[i]] : par[srcs[i] - K];
    }
    gf_invert_matrix(bm, inv, K);
    memcpy(rows, inv, (size_t)K);
    memcpy(rows + K, inv + K, (size_t)K);
    ec_init_tables(K, 2, rows, dtb);
    out[0] = buf + (size_t)(K + M) * frag;
    out[1] = buf + (size_t)(K + M + 1) * frag;
    t0 = util_now();
    for (int i = 0; i < reps; i++) ec_encode_data((int)frag, K, 2, dtb, src, out);
    double dec_gbs = (double)frag * K * reps / (util_now() - t0) / 1e9;
    bool dec_ok = !memcmp(out[0], data[0], frag) && !memcmp(out[1], data[1], frag);
    t0 = util_now();
    uint64_t crc = 0;
    for (int i = 0; i < reps; i++) crc ^= block_crc64(buf, frag * (size_t)K);
    double crc_gbs = (double)frag * K * reps / (util_now() - t0) / 1e9;

    if (json) {
        printf("{\"block_bytes\":%zu,\"blocks\":%d,\"threads\":%d,\"cold\":%s,"
               "\"dir\":{\"put_gbs\":%.3f,\"get_gbs\":%.3f,\"put_ms_per_block\":%.3f,\"get_ms_per_block\":%.3f,"
               "\"get_into_gbs\":%.3f,\"get_into_ms_per_block\":%.3f},"
               "\"ec_10_2\":{\"put_gbs\":%.3f,\"get_gbs\":%.3f,\"put_ms_per_block\":%.3f,\"get_ms_per_block\":%.3f,"
               "\"get_into_gbs\":%.3f,\"get_into_ms_per_block\":%.3f},"
               "\"isal_encode_gbs_per_core\":%.3f,\"isal_decode2_gbs_per_core\":%.3f,\"crc64_gbs_per_core\":%.3f,"
               "\"decode_ok\":%s}\n",
               n_bytes, n_blocks, n_threads, cold ? "true" : "false", put_gbs[0], get_gbs[0], put_ms[0], get_ms[0],
               into_gbs[0], into_ms[0], put_gbs[1], get_gbs[1], put_ms[1], get_ms[1], into_gbs[1], into_ms[1], enc_gbs,
               dec_gbs, crc_gbs, dec_ok ? "true" : "false");
    } else {
        printf("block: %d layers x 8 KV heads x 128 dims x 128 tokens, F16 = %.1f MB; %d blocks, %d threads%s\n",
               n_layers, (double)n_bytes / 1e6, n_blocks, n_threads, cold ? ", caches dropped before gets" : " (gets from page cache)");
        printf("%-8s %10s %10s %14s %14s %15s %16s\n", "store", "put GB/s", "get GB/s", "put ms/block", "get ms/block",
               "get into GB/s", "into ms/block");
        for (int k = 0; k < 2; k++)
            printf("%-8s %10.2f %10.2f %14.2f %14.2f %15.2f %16.2f\n", names[k], put_gbs[k], get_gbs[k], put_ms[k], get_ms[k],
                   into_gbs[k], into_ms[k]);
        printf("ISA-L RS 10+2, one core: encode %.2f GB/s, decode (2 data lost) %.2f GB/s%s; CRC-64 %.2f GB/s\n",
               enc_gbs, dec_gbs, dec_ok ? "" : " (DECODE MISMATCH)", crc_gbs);
    }
    (void)crc;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", root);
    for (int b = 0; b < n_blocks; b++) free(files[b]);
    free(files);
    free(keys);
    free(buf);
    return dec_ok ? 0 : 1;
}
