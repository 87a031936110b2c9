/*
 * test_store: the block file format, and the dir: store: round trips, sharded layout,
 * concurrent writers, corruption (flipped, truncated, wrong header, wrong key)
 * detected/counted/deleted, unwritable targets, restart, fsck. The keys are test_blockkey's.
 */
#define _GNU_SOURCE   /* unshare */
#include <pthread.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include "harness.h"
#include "storetest.h"

#include "cache/store.h"
#include "cache/store_dir.h"
#include "cli/cmd.h"
#include "model/quant.h"

TEST(test_block_format)
{
    uint8_t key[32], other[32];
    storetest_key(1, key);
    storetest_key(2, other);
    size_t n;
    uint8_t *f = storetest_block(key, 3, 1, &n);
    block_header h;
    CHECK(n == 256 + 3 * 2 * 2 * 128 * 16 * 2);
    CHECK(block_verify(f, n, key, &h) == BLOCK_OK);
    CHECK(h.n_layers == 3 && h.layer_bytes == 2 * 2 * 128 * 16 * 2 && h.n_tokens == 128);
    CHECK(block_verify(f, n, other, NULL) == BLOCK_ERR_KEY);
    CHECK(block_verify(f, n - 1, key, NULL) == BLOCK_ERR_SHORT);
    CHECK(block_verify(f, 100, key, NULL) == BLOCK_ERR_SHORT);
    f[n - 5] ^= 1;
    CHECK(block_verify(f, n, key, NULL) == BLOCK_ERR_CHECKSUM);
    f[n - 5] ^= 1;
    f[90] ^= 1;   /* a shape field: header checksum */
    CHECK(block_verify(f, n, key, NULL) == BLOCK_ERR_HEADER);
    f[90] ^= 1;
    f[0] = 'X';
    CHECK(block_verify(f, n, key, NULL) == BLOCK_ERR_MAGIC);
    free(f);

    /* a latent block (V is K) has one row per (layer, kv head, token): half the payload, and
     * its header says so; a file written before the field existed (zeros) reads as K and V */
    uint8_t fp[32] = { 7 };
    block_header_init(&h, key, fp, 1, 24 * 2, 3, 1, 24, 1);
    CHECK(h.payload_bytes == 3 * 128 * 24 * 2);
    f = block_alloc(&h);
    block_seal(&h, f);
    block_header g;
    CHECK(block_verify(f, block_file_bytes(&h), key, &g) == BLOCK_OK && g.n_parts == 1 && g.layer_bytes == 128 * 24 * 2);
    free(f);
    /* a quantised cache's rows are whole bytes per row, not per value: Q8_0 34 and Q4_0 18 bytes
     * per 32 values (a head of 64: 68 and 36) */
    const struct { qtype t; int row; } qz[2] = { { QTYPE_Q8_0, 68 }, { QTYPE_Q4_0, 36 } };
    for (int i = 0; i < 2; i++) {
        CHECK((int)quant_row_bytes(qz[i].t, 64) == qz[i].row);
        block_header_init(&h, key, fp, (uint32_t)qz[i].t, qz[i].row, 2, 2, 64, 2);
        f = block_alloc(&h);
        block_seal(&h, f);
        CHECK(block_verify(f, block_file_bytes(&h), key, &g) == BLOCK_OK && g.layer_bytes == 2u * 2 * 128 * qz[i].row);
        free(f);
    }
    /* a row shorter than half a byte per value, or longer than f32's, is no KV row */
    block_header_init(&h, key, fp, (uint32_t)QTYPE_Q4_0, 31, 2, 2, 64, 2);
    f = block_alloc(&h);
    block_seal(&h, f);
    CHECK(block_verify(f, block_file_bytes(&h), key, NULL) == BLOCK_ERR_HEADER);
    free(f);
    f = storetest_block(key, 3, 1, &n);
    memset(f + 120, 0, 4);
    uint32_t crc = block_crc32c(f, 252);
    memcpy(f + 252, &crc, 4);
    CHECK(block_verify(f, n, key, &g) == BLOCK_OK && g.n_parts == 2);
    f[120] = 3;   /* more parts than K and V */
    crc = block_crc32c(f, 252);
    memcpy(f + 252, &crc, 4);
    CHECK(block_verify(f, n, key, NULL) == BLOCK_ERR_HEADER);
    /* dimensions whose product wraps to zero (2 x 2^23 x 2^26 x 2^26 = 2^76) are refused, not
     * divided by */
    const uint32_t wrap[4] = { 2, 1u << 23, 1u << 26, 1u << 26 };   /* parts, heads, width, tokens */
    const int at[4] = { 120, 88, 92, 96 };
    for (int i = 0; i < 4; i++) memcpy(f + at[i], &wrap[i], 4);
    memset(f + 100, 0, 4);   /* layer bytes 0: a multiple of anything */
    memset(f + 104, 0, 8);
    crc = block_crc32c(f, 252);
    memcpy(f + 252, &crc, 4);
    CHECK(block_parse_header(f, n, NULL) == BLOCK_ERR_HEADER);
    free(f);
}

static store *open_dir(const char *dir, uint64_t cap)
{
    char spec[300];
    snprintf(spec, sizeof spec, "dir:%s", dir);
    store_opts o = { .capacity_bytes = cap };
    store *s = NULL;
    CHECK(store_open(spec, &o, &s) == STORE_OK);
    return s;
}

/* Path of key's file in a dir: store at dir. */
static void block_path(const char *dir, const uint8_t key[32], char *path, size_t n)
{
    char hex[BLOCKKEY_HEX];
    blockkey_hex(key, hex);
    snprintf(path, n, "%s/%.2s/%.2s/%s.blk", dir, hex, hex + 2, hex);
}

/* The ways the corruption tests damage a stored block file. */
enum { DAMAGE_FLIP_PAYLOAD, DAMAGE_FLIP_HEADER, DAMAGE_TRUNCATE, DAMAGE_WRONG_KEY, DAMAGE_GARBAGE,
       DAMAGE_APPENDED, DAMAGE_EMPTY };

/* Damages the block file at path (n bytes) in that way; DAMAGE_WRONG_KEY puts a valid block of
 * key other (layers layers) under its name, DAMAGE_APPENDED makes it longer than its header says. */
static void damage_block(const char *path, int kind, size_t n, const uint8_t other[32], int layers)
{
    FILE *fp = NULL;
    switch (kind) {
    case DAMAGE_FLIP_PAYLOAD: CHECK(storetest_flip(path, -3) == 0); break;
    case DAMAGE_FLIP_HEADER: CHECK(storetest_flip(path, 20) == 0); break;
    case DAMAGE_TRUNCATE: CHECK(truncate(path, (off_t)n - 1000) == 0); break;
    case DAMAGE_EMPTY: CHECK(truncate(path, 0) == 0); break;
    case DAMAGE_WRONG_KEY: {
        size_t n2;
        void *f2 = storetest_block(other, layers, 99, &n2);
        fp = fopen(path, "wb");
        CHECK(fp && fwrite(f2, 1, n2, fp) == n2);
        free(f2);
        break;
    }
    case DAMAGE_GARBAGE:
        fp = fopen(path, "wb");
        CHECK(fp && fputs("not a block", fp) >= 0);
        break;
    case DAMAGE_APPENDED: {
        static const char tail[8192];
        fp = fopen(path, "ab");
        CHECK(fp && fwrite(tail, 1, sizeof tail, fp) == sizeof tail);
        break;
    }
    }
    if (fp) fclose(fp);
}

TEST(test_dir_roundtrip_layout_exists_delete)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "store");
    store *s = open_dir(dir, 0);
    uint8_t keys[4][32];
    for (int i = 0; i < 4; i++) storetest_key(i, keys[i]);
    size_t n;
    void *f0 = storetest_block(keys[0], 2, 10, &n), *f1 = storetest_block(keys[1], 2, 11, &n);
    CHECK(store_put(s, keys[0], f0, n, 0) == STORE_OK);
    CHECK(store_put(s, keys[1], f1, n, 0) == STORE_OK);
    CHECK(store_put(s, keys[1], f0, n, 0) == STORE_ARG);   /* header key mismatch */
    CHECK(store_exists(s, (const uint8_t(*)[32])keys, 4) == 2);
    void *got;
    size_t gn;
    CHECK(store_get(s, keys[1], 0, &got, &gn) == STORE_OK);
    CHECK(gn == n && !memcmp(got, f1, n));
    free(got);
    CHECK(store_get(s, keys[2], 0, &got, &gn) == STORE_MISS && got == NULL);
    /* sharded path */
    char path[512];
    block_path(dir, keys[0], path, sizeof path);
    CHECK(storetest_size(path) == (off_t)n);
    /* duplicate put: rewritten, still one file */
    CHECK(store_put(s, keys[0], f0, n, 0) == STORE_OK);
    store_stats st;
    store_get_stats(s, &st);
    CHECK(st.n_put == 3 && st.n_put_dup == 1 && st.n_hit == 1 && st.n_miss == 1);
    CHECK(st.n_files == 2 && st.bytes_used == 2 * n);
    CHECK(store_delete(s, keys[0]) == STORE_OK);
    CHECK(store_delete(s, keys[0]) == STORE_MISS);
    CHECK(store_exists(s, (const uint8_t(*)[32])keys, 4) == 0);
    /* restart: the other block is still there and in the view */
    store_close(s);
    s = open_dir(dir, 0);
    store_get_stats(s, &st);
    CHECK(st.n_files == 1);
    CHECK(store_get(s, keys[1], 0, &got, &gn) == STORE_OK && gn == n && !memcmp(got, f1, n));
    free(got);
    store_close(s);
    free(f0);
    free(f1);
    storetest_rmrf(dir);
}

TEST(test_dir_get_into_caller_buffer)
{
    /* store_get_into: the same block bytes as store_get, in the caller's buffer; a miss, every
     * kind of corruption (detected, counted, deleted), a stored block larger than the buffer
     * (STORE_ARG, kept when valid, deleted when corrupt) */
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "store");
    store *s = open_dir(dir, 0);
    uint8_t key[32], other[32];
    storetest_key(300, key);
    storetest_key(301, other);
    size_t n;
    void *f = storetest_block(key, 2, 30, &n);
    size_t cap = n + 4096;
    uint8_t *buf = util_aligned_alloc(cap);
    memset(buf, 0xab, cap);
    size_t gn = 1;
    CHECK(store_get_into(s, key, 0, buf, cap, &gn) == STORE_MISS && gn == 0);
    CHECK(store_put(s, key, f, n, 0) == STORE_OK);
    CHECK(store_get_into(s, key, 0, buf, cap, &gn) == STORE_OK && gn == n && !memcmp(buf, f, n));
    CHECK(buf[n] == 0xab);   /* nothing written past the file */
    CHECK(store_get_into(s, key, 0, buf, n, &gn) == STORE_OK && gn == n && !memcmp(buf, f, n));   /* exact fit */
    /* larger than the buffer: not read into it, the valid block stays */
    CHECK(store_get_into(s, key, 0, buf, n - 1, &gn) == STORE_ARG && gn == 0);
    CHECK(store_exists(s, (const uint8_t(*)[32])key, 1) == 1);

    char path[512];
    block_path(dir, key, path, sizeof path);
    /* appended: longer than the buffer and than its header says */
    const int kinds[] = { DAMAGE_FLIP_PAYLOAD, DAMAGE_FLIP_HEADER, DAMAGE_TRUNCATE, DAMAGE_WRONG_KEY, DAMAGE_APPENDED };
    const int N_KINDS = (int)TM_ARRAY_LEN(kinds);
    for (int kind = 0; kind < N_KINDS; kind++) {
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        damage_block(path, kinds[kind], n, other, 2);
        store_status st = store_get_into(s, key, 0, buf, cap, &gn);
        CHECKF(st == STORE_CORRUPT, "kind %d: %s", kind, store_status_name(st));
        CHECKF(storetest_size(path) < 0, "kind %d: corrupt file not deleted", kind);
    }
    store_stats st;
    store_get_stats(s, &st);
    CHECKF(st.n_corrupt == N_KINDS, "corrupt %llu", (unsigned long long)st.n_corrupt);
    free(buf);
    free(f);
    store_close(s);
    storetest_rmrf(dir);
}

TEST(test_dir_corruption_detected_counted_deleted)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "store");
    store *s = open_dir(dir, 0);
    const int kinds[] = { DAMAGE_FLIP_PAYLOAD, DAMAGE_FLIP_HEADER, DAMAGE_TRUNCATE, DAMAGE_WRONG_KEY, DAMAGE_GARBAGE };
    const int N_KINDS = (int)TM_ARRAY_LEN(kinds);
    for (int kind = 0; kind < N_KINDS; kind++) {
        uint8_t key[32], other[32];
        storetest_key(100 + kind, key);
        storetest_key(200 + kind, other);
        size_t n;
        void *f = storetest_block(key, 2, (uint64_t)kind, &n);
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        char path[512];
        block_path(dir, key, path, sizeof path);
        damage_block(path, kinds[kind], n, other, 2);
        void *got = (void *)1;
        size_t gn;
        CHECKF(store_get(s, key, 0, &got, &gn) == STORE_CORRUPT, "kind %d", kind);
        CHECK(got == NULL);
        CHECKF(storetest_size(path) < 0, "kind %d: corrupt file not deleted", kind);
        CHECK(store_get(s, key, 0, &got, &gn) == STORE_MISS);
        /* recompute and store again: a hit */
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        CHECK(store_get(s, key, 0, &got, &gn) == STORE_OK && gn == n && !memcmp(got, f, n));
        free(got);
        free(f);
    }
    store_stats st;
    store_get_stats(s, &st);
    CHECK(st.n_corrupt == N_KINDS);
    store_close(s);
    storetest_rmrf(dir);
}

typedef struct {
    store *s;
    const uint8_t *key;
    const void *f;
    size_t n;
    int ok;
} writer_arg;

static void *writer_main(void *p)
{
    writer_arg *a = p;
    for (int i = 0; i < 20; i++) a->ok += store_put(a->s, a->key, a->f, a->n, 0) == STORE_OK;
    return NULL;
}

static long count_files(const char *dir, const char *pattern)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "find '%s' -type f -name '%s' | wc -l", dir, pattern);
    FILE *p = popen(cmd, "r");
    long n = -1;
    if (p) {
        if (fscanf(p, "%ld", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

TEST(test_dir_concurrent_writers_same_key)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "store");
    uint8_t key[32];
    storetest_key(7, key);
    size_t n;
    void *f = storetest_block(key, 4, 3, &n);
    /* two processes, each with three threads, write the same key at once */
    pid_t pid = fork();
    store *s = open_dir(dir, 0);
    pthread_t th[3];
    writer_arg a[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (writer_arg){ s, key, f, n, 0 };
        pthread_create(&th[i], NULL, writer_main, &a[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    if (pid == 0) {
        store_close(s);
        free(f);
        _exit(a[0].ok + a[1].ok + a[2].ok == 60 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(a[0].ok + a[1].ok + a[2].ok == 60);
    CHECK(count_files(dir, "*.blk") == 1);
    CHECK(count_files(dir, "*.tmp") == 0);
    void *got;
    size_t gn;
    CHECK(store_get(s, key, 0, &got, &gn) == STORE_OK && gn == n && !memcmp(got, f, n));
    free(got);
    store_close(s);
    free(f);
    storetest_rmrf(dir);
}

TEST(test_dir_unwritable_and_missing_targets)
{
    char dir[64], spec[300];
    storetest_tmpdir(dir, sizeof dir, "store");
    /* a target below a regular file cannot be made: open fails cleanly */
    char file[128];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *fp = fopen(file, "w");
    if (fp) fclose(fp);
    snprintf(spec, sizeof spec, "dir:%s/plain/cache", dir);
    store *s = NULL;
    CHECK(store_open(spec, NULL, &s) == STORE_IO && s == NULL);
    CHECK(store_open("ec:2+x:a,b", NULL, &s) == STORE_ARG);
    CHECK(store_open("ec:2+1:a,b", NULL, &s) == STORE_ARG);
    CHECK(store_open("", NULL, &s) == STORE_ARG);
    /* a shard directory that cannot be created (a file in its place): the put fails, is
     * counted, and the store keeps working for other keys */
    snprintf(spec, sizeof spec, "%s/cache", dir);
    store_opts o = { 0 };
    CHECK(store_open(spec, &o, &s) == STORE_OK);
    uint8_t key[32];
    storetest_key(5, key);
    char hex[BLOCKKEY_HEX], shard[256];
    blockkey_hex(key, hex);
    snprintf(shard, sizeof shard, "%s/cache/%.2s", dir, hex);
    fp = fopen(shard, "w");
    if (fp) fclose(fp);
    size_t n;
    void *f = storetest_block(key, 1, 1, &n);
    CHECK(store_put(s, key, f, n, 0) == STORE_IO);
    store_stats st;
    store_get_stats(s, &st);
    CHECK(st.n_put_fail == 1 && st.n_io_err >= 1 && st.n_files == 0);
    uint8_t key2[32];
    for (int i = 6; i < 50; i++) {   /* a key on another shard */
        storetest_key(i, key2);
        if (key2[0] != key[0]) break;
    }
    void *f2 = storetest_block(key2, 1, 2, &n);
    CHECK(store_put(s, key2, f2, n, 0) == STORE_OK);
    /* a block larger than the whole capacity is dropped as no-space */
    store_close(s);
    o.capacity_bytes = 1000;
    CHECK(store_open(spec, &o, &s) == STORE_OK);
    uint8_t key3[32];
    storetest_key(60, key3);
    void *f3 = storetest_block(key3, 1, 3, &n);
    CHECK(store_put(s, key3, f3, n, 0) == STORE_NOSPACE);
    store_get_stats(s, &st);
    CHECK(st.n_nospace == 1);
    store_close(s);
    free(f);
    free(f2);
    free(f3);
    storetest_rmrf(dir);
}

/* Child of test_dir_disk_full, in its own mount namespace with a 160 KiB tmpfs: returns the
 * exit status (0 ok, 1 failed check, 77 skipped: no permission to mount). */
static int disk_full_child(const char *dir)
{
    if (unshare(CLONE_NEWNS) || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
        mount("none", dir, "tmpfs", 0, "size=160k"))
        return 77;
    char spec[300];
    snprintf(spec, sizeof spec, "dir:%s/cache", dir);
    store *s = NULL;
    if (store_open(spec, NULL, &s) != STORE_OK) return 1;
    int n_ok = 0, n_full = 0;
    uint8_t first[32];
    storetest_key(500, first);
    for (int i = 0; i < 12; i++) {   /* 33 KiB blocks: the fifth or so does not fit */
        uint8_t key[32];
        storetest_key(500 + i, key);
        size_t n;
        void *f = storetest_block(key, 2, (uint64_t)i, &n);
        store_status st = store_put(s, key, f, n, 0);
        free(f);
        if (st == STORE_OK) n_ok++;
        else if (st == STORE_NOSPACE) n_full++;
        else return 1;
    }
    store_stats stats;
    store_get_stats(s, &stats);
    void *got;
    size_t gn;
    int rc = n_ok >= 2 && n_full >= 1 && stats.n_nospace == (uint64_t)n_full &&
             store_get(s, first, 0, &got, &gn) == STORE_OK && count_files(dir, "*.tmp") == 0 ? 0 : 1;
    if (rc == 0) free(got);
    if (rc) fprintf(stderr, "  ok %d full %d nospace %llu\n", n_ok, n_full, (unsigned long long)stats.n_nospace);
    store_close(s);
    umount(dir);
    return rc;
}

TEST(test_dir_disk_full)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "store");
    pid_t pid = fork();
    if (pid == 0) _exit(disk_full_child(dir));
    int status = 0;
    waitpid(pid, &status, 0);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (rc == 77) printf("     (skipped: cannot mount a small tmpfs here)\n");
    CHECK(rc == 0 || rc == 77);
    storetest_rmrf(dir);
}

TEST(test_dir_get_mapped)
{
    /* store_get_mapped: the stored bytes in place; every kind of corruption detected (never
     * returned), counted and deleted, as store_get; the mapping stays valid and unchanged when
     * its file is deleted, replaced (put again), evicted for capacity or fsck'ed meanwhile;
     * ec: stores do not map */
    char dir[64], path[512];
    storetest_tmpdir(dir, sizeof dir, "store");
    uint8_t key[32], other[32];
    storetest_key(400, key);
    storetest_key(401, other);
    size_t n;
    void *f = storetest_block(key, 3, 40, &n);
    store *s = open_dir(dir, 2 * n + n / 2);   /* room for two blocks */
    if (!store_mappable(s)) {
        printf("     (skipped: %s is not on a local file system)\n", dir);
        store_close(s);
        storetest_rmrf(dir);
        free(f);
        return;
    }
    block_path(dir, key, path, sizeof path);
    const void *m = (const void *)1;
    size_t mn = 1;
    CHECK(store_get_mapped(s, key, 0, &m, &mn) == STORE_MISS && m == NULL && mn == 0);
    CHECK(store_put(s, key, f, n, 0) == STORE_OK);
    CHECK(store_get_mapped(s, key, 0, &m, &mn) == STORE_OK && mn == n && m && !memcmp(m, f, n));
    /* deleted while mapped */
    CHECK(store_delete(s, key) == STORE_OK && storetest_size(path) < 0);
    CHECK(!memcmp(m, f, n));
    /* put again, mapped again, then replaced by another put (rename over the name) */
    const void *m2;
    size_t mn2;
    CHECK(store_put(s, key, f, n, 0) == STORE_OK);
    CHECK(store_get_mapped(s, key, 0, &m2, &mn2) == STORE_OK && mn2 == n);
    CHECK(store_put(s, key, f, n, 0) == STORE_OK);
    CHECK(m2 && !memcmp(m2, f, n));
    /* evicted for capacity by two other blocks, then fsck over what is left */
    for (int i = 0; i < 2; i++) {
        uint8_t k2[32];
        size_t n2;
        storetest_key(410 + i, k2);
        void *f2 = storetest_block(k2, 3, 41 + (uint64_t)i, &n2);
        CHECK(store_put(s, k2, f2, n2, 0) == STORE_OK);
        free(f2);
    }
    CHECK(storetest_size(path) < 0);   /* the LRU block went */
    store_fsck_result fr;
    store_fsck(s, &fr);
    CHECK(fr.n_broken == 0);
    CHECK(!memcmp(m, f, n) && !memcmp(m2, f, n));
    store_unmap(m, mn);
    store_unmap(m2, mn2);
    store_stats st;
    store_get_stats(s, &st);
    CHECK(st.n_get == 3 && st.n_hit == 2 && st.n_miss == 1 && st.n_corrupt == 0);

    const int kinds[] = { DAMAGE_FLIP_PAYLOAD, DAMAGE_FLIP_HEADER, DAMAGE_TRUNCATE, DAMAGE_WRONG_KEY, DAMAGE_APPENDED,
                          DAMAGE_EMPTY };
    const int N_KINDS = (int)TM_ARRAY_LEN(kinds);
    for (int kind = 0; kind < N_KINDS; kind++) {
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        damage_block(path, kinds[kind], n, other, 3);
        m = (const void *)1;
        store_status gs = store_get_mapped(s, key, 0, &m, &mn);
        CHECKF(gs == STORE_CORRUPT && m == NULL && mn == 0, "kind %d: %s", kind, store_status_name(gs));
        CHECKF(storetest_size(path) < 0, "kind %d: corrupt file not deleted", kind);
        CHECK(store_get_mapped(s, key, 0, &m, &mn) == STORE_MISS);
    }
    store_get_stats(s, &st);
    CHECKF(st.n_corrupt == N_KINDS, "corrupt %llu", (unsigned long long)st.n_corrupt);
    store_close(s);
    storetest_rmrf(dir);

    /* ec: does not map (store_get_into reads it) */
    char spec[300];
    storetest_tmpdir(dir, sizeof dir, "store");
    snprintf(spec, sizeof spec, "ec:1+1:%s/a,%s/b", dir, dir);
    store_opts o = { 0 };
    CHECK(store_open(spec, &o, &s) == STORE_OK);
    if (s) {
        CHECK(!store_mappable(s));
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        CHECK(store_get_mapped(s, key, 0, &m, &mn) == STORE_ARG && m == NULL);
        store_close(s);
    }
    storetest_rmrf(dir);
    free(f);
}

typedef struct {
    store *s;
    const uint8_t *key;
    const void *f;
    size_t n;
    int stop;                  /* atomic */
    int n_del;                 /* atomic: deletes that removed the file */
} churn_arg;

/* Deletes and puts key again and again until stop (the file stays a moment each time). */
static void *churn_main(void *p)
{
    churn_arg *a = p;
    for (int i = 0; !__atomic_load_n(&a->stop, __ATOMIC_RELAXED); i++) {
        if (store_delete(a->s, a->key) == STORE_OK) __atomic_fetch_add(&a->n_del, 1, __ATOMIC_RELAXED);
        store_put(a->s, a->key, a->f, a->n, 0);
        usleep((useconds_t)(50 + 37 * (i % 7)));
    }
    return NULL;
}

TEST(test_dir_mapped_concurrent_delete)
{
    /* one thread deletes and rewrites a block while another maps it, holds the mapping over
     * further deletes and reads it: every hit is the whole block, unchanged while mapped */
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "store");
    store *s = open_dir(dir, 0);
    uint8_t key[32];
    storetest_key(420, key);
    size_t n;
    void *f = storetest_block(key, 4, 42, &n);
    if (!store_mappable(s)) {
        printf("     (skipped: %s is not on a local file system)\n", dir);
    } else {
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        churn_arg a = { .s = s, .key = key, .f = f, .n = n };
        pthread_t th;
        CHECK(pthread_create(&th, NULL, churn_main, &a) == 0);
        int hits = 0, bad = 0;
        double t0 = util_now();
        for (int i = 0; (i < 400 || hits < 50) && util_now() - t0 < 30; i++) {
            const void *m;
            size_t mn;
            store_status st = store_get_mapped(s, key, 0, &m, &mn);
            if (st != STORE_OK) {
                CHECKF(st == STORE_MISS, "%s", store_status_name(st));
                continue;
            }
            hits++;
            int del0 = __atomic_load_n(&a.n_del, __ATOMIC_RELAXED);   /* deleted meanwhile */
            CHECK(WAIT_UNTIL(__atomic_load_n(&a.n_del, __ATOMIC_RELAXED) > del0, 30));
            bad += mn != n || memcmp(m, f, n) != 0;
            store_unmap(m, mn);
        }
        __atomic_store_n(&a.stop, 1, __ATOMIC_RELAXED);
        pthread_join(th, NULL);
        CHECKF(hits >= 50 && bad == 0, "hits %d, changed %d", hits, bad);
        store_stats st;
        store_get_stats(s, &st);
        CHECK(st.n_corrupt == 0);
    }
    free(f);
    store_close(s);
    storetest_rmrf(dir);
}

TEST(test_dir_fsck)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "store");
    store *s = open_dir(dir, 0);
    for (int i = 0; i < 6; i++) {
        uint8_t key[32];
        storetest_key(300 + i, key);
        size_t n;
        void *f = storetest_block(key, 1, (uint64_t)i, &n);
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        free(f);
        if (i < 2) {
            char path[512];
            block_path(dir, key, path, sizeof path);
            CHECK(storetest_flip(path, i == 0 ? -1 : 30) == 0);
        }
    }
    store_fsck_result r;
    store_fsck(s, &r);
    CHECK(r.n_files == 6 && r.n_ok == 4 && r.n_broken == 2);
    store_fsck(s, &r);
    CHECK(r.n_files == 4 && r.n_ok == 4 && r.n_broken == 0);
    store_close(s);
    storetest_rmrf(dir);
}

/* store_peek_header: a stored block's header without reading its payload, from a dir: store
 * and from an ec: store's first data fragment; an absent key is a miss, a damaged header a
 * corruption (what `store stat` reports block sizes from). */
TEST(test_peek_header)
{
    uint8_t key[32], other[32];
    storetest_key(900, key);
    storetest_key(901, other);
    size_t n;
    void *f = storetest_block(key, 3, 5, &n);
    for (int ec = 0; ec < 2; ec++) {
        char dir[64], spec[300];
        storetest_tmpdir(dir, sizeof dir, "store");
        if (ec) snprintf(spec, sizeof spec, "ec:2+1:%s/a,%s/b,%s/c", dir, dir, dir);
        else snprintf(spec, sizeof spec, "dir:%s", dir);
        store *s = NULL;
        store_opts o = { 0 };
        CHECK(store_open(spec, &o, &s) == STORE_OK);
        if (!s) continue;
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        block_header h;
        CHECKF(store_peek_header(s, key, &h) == STORE_OK, "%s", spec);
        CHECK(!memcmp(h.key, key, 32) && h.n_layers == 3 && h.n_kv_heads == 2 && h.head_dim == 16 && h.n_parts == 2 &&
              h.payload_bytes == n - BLOCK_HEADER_BYTES);
        CHECK(store_peek_header(s, other, &h) == STORE_MISS);
        store_stats st;
        store_get_stats(s, &st);
        CHECK(st.n_get == 0 && st.n_hit == 0);   /* inspection: no counters */
        if (!ec) {
            char path[512];
            block_path(dir, key, path, sizeof path);
            CHECK(storetest_flip(path, 90) == 0);
            CHECK(store_peek_header(s, key, &h) == STORE_CORRUPT);
        }
        store_close(s);
        storetest_rmrf(dir);
    }
    free(f);
}

TEST(test_cli_store_commands)
{
    char dir[64], spec[300];
    storetest_tmpdir(dir, sizeof dir, "store");
    snprintf(spec, sizeof spec, "dir:%s", dir);
    store *s = open_dir(dir, 0);
    uint8_t key[32];
    for (int i = 0; i < 3; i++) {
        storetest_key(400 + i, key);
        size_t n;
        void *f = storetest_block(key, 1, (uint64_t)i, &n);
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        free(f);
    }
    void *got;
    size_t gn;
    CHECK(store_get(s, key, 0, &got, &gn) == STORE_OK);
    free(got);
    store_close(s);   /* writes this process's counters file */
    char path[512];
    block_path(dir, key, path, sizeof path);
    CHECK(storetest_flip(path, -1) == 0);
    fflush(stdout);
    int saved = dup(1);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    char *stat_argv[] = { "store", "stat", spec, NULL };
    char *ls_argv[] = { "store", "ls", spec, NULL };
    char *fsck_argv[] = { "store", "fsck", spec, NULL };
    char *gc_argv[] = { "store", "gc", spec, "--capacity", "1K", NULL };
    char *bad_argv[] = { "store", "frob", spec, NULL };
    int rc_stat = cmd_store(3, stat_argv), rc_ls = cmd_store(3, ls_argv);
    int rc_fsck1 = cmd_store(3, fsck_argv), rc_fsck2 = cmd_store(3, fsck_argv);
    int rc_gc = cmd_store(5, gc_argv), rc_bad = cmd_store(3, bad_argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(devnull);
    CHECK(rc_stat == 0 && rc_ls == 0 && rc_bad == 2);
    CHECK(rc_fsck1 == 1 && rc_fsck2 == 0);   /* broken block found and removed, then clean */
    CHECK(rc_gc == 0 && count_files(dir, "*.blk") == 0);
    /* the counters file of the closed store is summed by stat */
    s = NULL;
    store_opts ro = { .read_only = true };
    CHECK(store_open(spec, &ro, &s) == STORE_OK);
    store_stats c;
    CHECK(store_load_counters(s, &c) >= 1 && c.n_hit == 1 && c.n_put == 3);
    store_close(s);
    storetest_rmrf(dir);
}

int main(void)
{
    util_log_level = LOG_LEVEL_ERROR;
    RUN(test_block_format);
    RUN(test_dir_roundtrip_layout_exists_delete);
    RUN(test_dir_corruption_detected_counted_deleted);
    RUN(test_dir_get_into_caller_buffer);
    RUN(test_dir_get_mapped);
    RUN(test_dir_mapped_concurrent_delete);
    RUN(test_dir_concurrent_writers_same_key);
    RUN(test_dir_unwritable_and_missing_targets);
    RUN(test_dir_disk_full);
    RUN(test_dir_fsck);
    RUN(test_peek_header);
    RUN(test_cli_store_commands);
    HARNESS_END();
}
