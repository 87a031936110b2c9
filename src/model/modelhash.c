/*
 * modelhash: whole-file SHA-256 with a stat-keyed cache. See modelhash.h for the design; the
 * threads share only an atomic chunk counter and write disjoint slots of the digest array.
 */
#include "model/modelhash.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/sha256.h"
#include "util/util.h"

typedef struct {
    const uint8_t *map;     /* the file */
    size_t size;            /* its bytes */
    size_t n_chunks;        /* ceil(size / MODELHASH_CHUNK) */
    uint8_t *digests;       /* (n_chunks, 32) */
    atomic_size_t next;     /* next chunk to take */
} modelhash_job;

static void *modelhash_worker(void *arg)
{
    modelhash_job *j = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_chunks) break;
        size_t off = i * MODELHASH_CHUNK;
        size_t n = j->size - off < MODELHASH_CHUNK ? j->size - off : MODELHASH_CHUNK;
        sha256_digest(j->map + off, n, j->digests + 32 * i);
    }
    return NULL;
}

static void modelhash_compute(const uint8_t *map, size_t size, uint8_t out[32])
{
    modelhash_job j = { .map = map, .size = size, .n_chunks = (size + MODELHASH_CHUNK - 1) / MODELHASH_CHUNK };
    j.digests = xcalloc(j.n_chunks ? j.n_chunks : 1, 32);
    atomic_init(&j.next, 0);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = ncpu > 0 ? (size_t)ncpu : 1;
    if (nt > MODELHASH_MAX_THREADS) nt = MODELHASH_MAX_THREADS;
    if (nt > j.n_chunks) nt = j.n_chunks;
    pthread_t th[MODELHASH_MAX_THREADS];
    size_t started = 0;
    for (size_t t = 1; t < nt; t++) {  /* the caller is thread 0 */
        if (pthread_create(&th[started], NULL, modelhash_worker, &j) != 0) break;
        started++;
    }
    modelhash_worker(&j);
    for (size_t t = 0; t < started; t++) pthread_join(th[t], NULL);

    uint64_t sz = size;
    static const char tag[] = "tokenmill-modelhash-v1";
    sha256_part parts[] = { { tag, sizeof tag }, { &sz, sizeof sz }, { j.digests, 32 * j.n_chunks } };
    sha256_parts(parts, 3, out);
    free(j.digests);
}

bool modelhash_cache_dir(char *buf, size_t bufsz)
{
    const char *e = getenv("TOKENMILL_CACHE_DIR");
    int n = -1;
    if (e && *e) {
        n = snprintf(buf, bufsz, "%s", e);
    } else if ((e = getenv("XDG_CACHE_HOME")) && *e == '/') {
        n = snprintf(buf, bufsz, "%s/tokenmill", e);
    } else if ((e = getenv("HOME")) && *e == '/') {
        n = snprintf(buf, bufsz, "%s/.cache/tokenmill", e);
    }
    return n > 0 && (size_t)n < bufsz;
}

/* The entry's path and the line it must hold for a file of stat st, less the digest. */
static bool modelhash_entry(const struct stat *st, char *path, size_t pathsz, char *line, size_t linesz)
{
    char dir[4096];
    if (!modelhash_cache_dir(dir, sizeof dir)) return false;
    int n = snprintf(path, pathsz, "%s/fp/%llx-%llx", dir, (unsigned long long)st->st_dev,
                     (unsigned long long)st->st_ino);
    int k = snprintf(line, linesz, "tokenmill-modelhash-v1 %llu %llu %llu %lld.%09ld %lld.%09ld ",
                     (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                     (unsigned long long)st->st_size, (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec,
                     (long long)st->st_ctim.tv_sec, (long)st->st_ctim.tv_nsec);
    return n > 0 && (size_t)n < pathsz && k > 0 && (size_t)k < linesz;
}

/* The digest of a valid entry for st into out; false when there is none. */
static bool modelhash_cache_read(const struct stat *st, uint8_t out[32])
{
    char path[4200], want[256], got[256];
    if (!modelhash_entry(st, path, sizeof path, want, sizeof want)) return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return false;
    struct stat es;
    ssize_t n = -1;
    if (fstat(fd, &es) == 0 && S_ISREG(es.st_mode)) n = read(fd, got, sizeof got - 1);
    close(fd);
    size_t wl = strlen(want);
    if (n < 0 || (size_t)n != wl + 65 || memcmp(got, want, wl) != 0 || got[wl + 64] != '\n') return false;
    return util_unhex(got + wl, 32, out);
}

static bool modelhash_same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

static bool modelhash_cache_write(const struct stat *st, const uint8_t d[32])
{
    char path[4200], line[256], dir[4096], tmp[4300];
    if (!modelhash_entry(st, path, sizeof path, line, sizeof line) || !modelhash_cache_dir(dir, sizeof dir))
        return false;
    /* the parents of an explicit TOKENMILL_CACHE_DIR are the user's; ~/.cache may not exist yet */
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if (mkdir(parent, 0700) != 0 && errno != EEXIST) return false;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return false;
    char fpdir[4200];
    snprintf(fpdir, sizeof fpdir, "%s/fp", dir);
    if (mkdir(fpdir, 0700) != 0 && errno != EEXIST) return false;
    int n = snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) return false;
    size_t ll = strlen(line);
    util_hex(d, 32, line + ll);
    line[ll + 64] = '\n';
    line[ll + 65] = '\0';
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return false;
    bool ok = write(fd, line, ll + 65) == (ssize_t)(ll + 65);
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, path) == 0) return true;
    unlink(tmp);
    return false;
}

bool modelhash_file(const char *path, const void *map, size_t size, const struct stat *st, bool use_cache,
                    uint8_t out[32], modelhash_info *info)
{
    modelhash_info dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    if (use_cache && modelhash_cache_read(st, out)) {
        info->from_cache = true;
        return true;
    }
    /* The kernel stamps file times from the coarse real-time clock: a write after this instant
     * gets a ctime at or after it, so a file last changed strictly before it cannot change
     * during the hash without the second stat seeing it. */
    struct timespec start;
    clock_gettime(CLOCK_REALTIME_COARSE, &start);
    bool settled = st->st_ctim.tv_sec < start.tv_sec ||
                   (st->st_ctim.tv_sec == start.tv_sec && st->st_ctim.tv_nsec < start.tv_nsec);
    double t0 = util_now();
    modelhash_compute(map, size, out);
    info->seconds = util_now() - t0;
    struct stat now;
    if (use_cache && settled && stat(path, &now) == 0 && modelhash_same_file(st, &now))
        info->cached = modelhash_cache_write(st, out);
    return true;
}
