/*
 * storetest: helpers shared by the block-store unit tests: temporary directories, random
 * block files, a fake wall clock, and byte-level fault injection on stored files.
 */
#ifndef TM_STORETEST_H
#define TM_STORETEST_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/block.h"
#include "cache/blockkey.h"
#include "util/util.h"

/* A fresh directory under /tmp (static buffer per call site is the caller's). */
static inline void storetest_tmpdir(char *buf, size_t n, const char *tag)
{
    snprintf(buf, n, "/tmp/tm-%s-XXXXXX", tag);
    if (!mkdtemp(buf)) buf[0] = 0;
}

static inline void storetest_rmrf(const char *dir)
{
    char cmd[600];
    if (!dir[0] || strncmp(dir, "/tmp/tm-", 8)) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* A key derived from a number (distinct numbers, distinct keys). */
static inline void storetest_key(int i, uint8_t key[32])
{
    uint8_t fp[32] = { 7 }, root[32];
    int32_t toks[128];
    for (int t = 0; t < 128; t++) toks[t] = i * 1000 + t;
    blockkey_root(NULL, 0, root);
    blockkey_compute(root, toks, fp, key);
}

/* A sealed block file with random payload for key (n_layers x 2 heads x 16 dims, f16). */
static inline void *storetest_block(const uint8_t key[32], int n_layers, uint64_t seed, size_t *n)
{
    block_header h;
    uint8_t fp[32] = { 7 };
    block_header_init(&h, key, fp, 1, 16 * 2, n_layers, 2, 16, 2);   /* F16 rows of 16 */
    uint8_t *f = block_alloc(&h);
    util_rng r;
    util_rng_seed(&r, seed);
    uint8_t *p = block_payload(f);
    for (size_t i = 0; i < h.payload_bytes; i++) p[i] = (uint8_t)util_rng_next(&r);
    block_seal(&h, f);
    *n = block_file_bytes(&h);
    return f;
}

/* Flips one byte of a file at offset (from the end when off < 0). Returns 0 on success. */
static inline int storetest_flip(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    struct stat st;
    fstat(fd, &st);
    off_t at = off >= 0 ? off : st.st_size + off;
    unsigned char c;
    int rc = -1;
    if (pread(fd, &c, 1, at) == 1) {
        c ^= 0x5a;
        if (pwrite(fd, &c, 1, at) == 1) rc = 0;
    }
    close(fd);
    return rc;
}

static inline off_t storetest_size(const char *path)
{
    struct stat st;
    return stat(path, &st) ? -1 : st.st_size;
}

/* Fake wall clock for TTL tests. */
static double storetest_clock_now = 1.7e9;
static inline double storetest_clock(void) { return storetest_clock_now; }

#endif
