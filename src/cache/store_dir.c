/*
 * store_dir: a directory target (design in store_dir.h). File times carry retention
 * (gc.h): atime = last use, mtime = expiry, set with futimens/utimensat. Mapped reads
 * (store_dir_map) are decided per target at open from the file system type (statfs).
 */
#include "cache/store_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "util/util.h"

#define STORE_DIR_LOG_EVERY_S 10.0    /* at most one error line per target per this */
#define STORE_DIR_TOUCH_EVERY_S 60.0  /* hits closer than this do not rewrite file times */
#define STORE_DIR_TMP_STALE_S 3600.0  /* temporary files older than this are removed */
#define STORE_DIR_MAX_VICTIMS 64

struct store_dir {
    char *root;                  /* target directory */
    char ext[8];                 /* file extension */
    store_dir_opts o;
    gc_view *view;               /* retention/capacity view (gc.h) */
    store_dir_counters c;        /* updated with __atomic ops */
    pthread_mutex_t log_mu;      /* guards last_log / n_suppressed */
    double last_log;             /* util_now() of the last error line */
    uint64_t n_suppressed;       /* error lines not printed since */
    uint64_t tmp_seq;            /* temporary-name counter (atomic) */
    bool mappable;               /* local file system: store_dir_map allowed (atomic: cleared
                                  * when the kernel cannot populate mappings) */
};

#define STORE_DIR_INC(d, field, v) __atomic_fetch_add(&(d)->c.field, (v), __ATOMIC_RELAXED)

const char *store_dir_root(const store_dir *d) { return d->root; }
gc_view *store_dir_view(store_dir *d) { return d->view; }
double store_dir_now(const store_dir *d) { return d->o.clock ? d->o.clock() : gc_wall_now(); }

static void store_dir_log(store_dir *d, const char *what, const char *path, int err)
{
    pthread_mutex_lock(&d->log_mu);
    double now = util_now();
    if (d->last_log == 0 || now - d->last_log >= STORE_DIR_LOG_EVERY_S) {
        if (d->n_suppressed)
            log_warn("store %s: %s %s: %s (%llu similar errors not shown); continuing with less cache",
                     d->root, what, path, strerror(err), (unsigned long long)d->n_suppressed);
        else
            log_warn("store %s: %s %s: %s; continuing with less cache", d->root, what, path, strerror(err));
        d->last_log = now;
        d->n_suppressed = 0;
    } else {
        d->n_suppressed++;
    }
    pthread_mutex_unlock(&d->log_mu);
}

void store_dir_path(const store_dir *d, const uint8_t key[32], char *buf, size_t n)
{
    char hex[BLOCKKEY_HEX];
    blockkey_hex(key, hex);
    snprintf(buf, n, "%s/%.2s/%.2s/%s.%s", d->root, hex, hex + 2, hex, d->ext);
}

store_status store_dir_peek(store_dir *d, const uint8_t key[32], void *buf, size_t n)
{
    char path[PATH_MAX];
    store_dir_path(d, key, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return STORE_MISS;
    ssize_t r = pread(fd, buf, n, 0);
    close(fd);
    return r == (ssize_t)n ? STORE_OK : STORE_MISS;
}

static int store_dir_mkdirs(const char *path)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof buf) return ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) continue;
        char c = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return errno;
        buf[i] = c;
    }
    return 0;
}

static store_status store_dir_errno_status(int err)
{
    return err == ENOSPC || err == EDQUOT ? STORE_NOSPACE : STORE_IO;
}

static double store_dir_ts(const struct timespec *ts) { return (double)ts->tv_sec + ts->tv_nsec * 1e-9; }

static struct timespec store_dir_timespec(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec < 0) ts.tv_nsec = 0;
    if (ts.tv_nsec > 999999999) ts.tv_nsec = 999999999;
    return ts;
}

/* True for the local file systems whose files may be mapped (store_dir.h): a file there keeps
 * its pages while mapped even when another process unlinks or renames over it. */
static bool store_dir_local_fs(const char *root)
{
    struct statfs sf;
    if (statfs(root, &sf)) return false;
    switch ((unsigned long)sf.f_type) {
    case 0xEF53UL:       /* ext2/3/4 */
    case 0x58465342UL:   /* xfs */
    case 0x9123683EUL:   /* btrfs */
    case 0x01021994UL:   /* tmpfs */
    case 0xF2F52010UL:   /* f2fs */
    case 0x794C7630UL:   /* overlayfs */
        return true;
    }
    return false;
}

store_status store_dir_open(const char *root, const store_dir_opts *opts, store_dir **out)
{
    *out = NULL;
    if (!root || !*root) return STORE_ARG;
    store_dir *d = xcalloc(1, sizeof *d);
    d->o = *opts;
    snprintf(d->ext, sizeof d->ext, "%s", opts->ext ? opts->ext : "blk");
    d->o.ext = d->ext;
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/') n--;
    d->root = xmalloc(n + 1);
    memcpy(d->root, root, n);
    d->root[n] = 0;
    pthread_mutex_init(&d->log_mu, NULL);
    d->view = gc_view_new(opts->capacity_bytes);
    int err = opts->read_only ? 0 : store_dir_mkdirs(d->root);
    struct stat st;
    if (!err && stat(d->root, &st)) err = errno;
    if (!err && !S_ISDIR(st.st_mode)) err = ENOTDIR;
    if (!err && !opts->read_only && access(d->root, W_OK | X_OK)) err = errno;
    if (err) {
        log_error("store %s: cannot use the directory: %s; running without this cache target",
                  d->root, strerror(err));
        store_dir_close(d);
        return STORE_IO;
    }
    d->mappable = store_dir_local_fs(d->root);
    store_dir_rebuild(d);
    *out = d;
    return STORE_OK;
}

void store_dir_close(store_dir *d)
{
    if (!d) return;
    gc_view_free(d->view);
    pthread_mutex_destroy(&d->log_mu);
    free(d->root);
    free(d);
}

void store_dir_get_counters(store_dir *d, store_dir_counters *c)
{
    uint64_t *dst = (uint64_t *)c;
    uint64_t *src = (uint64_t *)&d->c;
    for (size_t i = 0; i < sizeof *c / sizeof(uint64_t); i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

/* Sets last use = now and expiry = max(old expiry, now + ttl) on an open fd. */
static void store_dir_set_times(int fd, double last_use, double expiry)
{
    struct timespec ts[2] = { store_dir_timespec(last_use), store_dir_timespec(expiry) };
    (void)futimens(fd, ts);
}

store_status store_dir_putv(store_dir *d, const uint8_t key[32], const struct iovec *iov, int niov,
                            double ttl_s)
{
    if (d->o.read_only) return STORE_ARG;
    char path[PATH_MAX], tmp[PATH_MAX];
    store_dir_path(d, key, path, sizeof path);
    uint64_t total = 0;
    for (int i = 0; i < niov; i++) total += iov[i].iov_len;
    double now = store_dir_now(d), expiry = now + ttl_s;

    /* a key already present is written again all the same: its file may be corrupt (a
     * reader that verified it deleted it, but blocks behind a corrupt one in a chain are never
     * read), and same key means same content anyway. Only its expiry is kept if later. */
    struct stat st;
    if (!stat(path, &st)) {
        double old_exp = store_dir_ts(&st.st_mtim);
        if (expiry < old_exp) expiry = old_exp;
        STORE_DIR_INC(d, n_put_dup, 1);
    }
    uint64_t cap = gc_view_capacity(d->view);
    if (cap && total > cap) {
        STORE_DIR_INC(d, n_put_fail, 1);
        STORE_DIR_INC(d, n_nospace, 1);
        return STORE_NOSPACE;
    }
    /* account first, evict LRU victims, then write: disk use stays under capacity + one
     * in-flight file per writer */
    uint8_t victims[STORE_DIR_MAX_VICTIMS][32];
    int nv;
    while ((nv = gc_view_reserve(d->view, key, total, now, expiry, true, victims, STORE_DIR_MAX_VICTIMS)) > 0) {
        for (int i = 0; i < nv; i++) store_dir_evict(d, victims[i]);
        if (nv < STORE_DIR_MAX_VICTIMS) break;
    }

    uint64_t seq = __atomic_fetch_add(&d->tmp_seq, 1, __ATOMIC_RELAXED);
    char *slash = strrchr(path, '/');
    snprintf(tmp, sizeof tmp, "%.*s/.%s.%d.%ld.%llu.tmp", (int)(slash - path), path, slash + 1,
             (int)getpid(), (long)syscall(SYS_gettid), (unsigned long long)seq);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {
        *slash = 0;
        int err = store_dir_mkdirs(path);
        *slash = '/';
        if (err) errno = err;
        else fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    int err = 0;
    if (fd < 0) {
        err = errno;
        store_dir_log(d, "cannot create", tmp, err);
        goto fail;
    }
    /* write everything, resuming partial writes */
    struct iovec v[8];
    if (niov > 8) { err = EINVAL; close(fd); goto fail_tmp; }
    memcpy(v, iov, sizeof(*iov) * (size_t)niov);
    int vi = 0;
    uint64_t left = total;
    while (left > 0) {
        ssize_t w = writev(fd, v + vi, niov - vi);
        if (w < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        if (w == 0) { err = EIO; break; }
        left -= (uint64_t)w;
        while (vi < niov && (size_t)w >= v[vi].iov_len) w -= (ssize_t)v[vi++].iov_len;
        if (vi < niov) {
            v[vi].iov_base = (uint8_t *)v[vi].iov_base + w;
            v[vi].iov_len -= (size_t)w;
        }
    }
    if (!err && d->o.fsync && fdatasync(fd)) err = errno;
    if (!err) store_dir_set_times(fd, now, expiry);
    if (close(fd) && !err) err = errno;
    if (err) {
        store_dir_log(d, "cannot write", tmp, err);
        goto fail_tmp;
    }
    if (rename(tmp, path)) {
        err = errno;
        store_dir_log(d, "cannot rename to", path, err);
        goto fail_tmp;
    }
    gc_view_done(d->view, key);
    STORE_DIR_INC(d, n_put, 1);
    STORE_DIR_INC(d, bytes_written, total);
    return STORE_OK;

fail_tmp:
    unlink(tmp);
fail:
    gc_view_remove(d->view, key);
    STORE_DIR_INC(d, n_put_fail, 1);
    STORE_DIR_INC(d, n_io_err, 1);
    if (store_dir_errno_status(err) == STORE_NOSPACE) STORE_DIR_INC(d, n_nospace, 1);
    return store_dir_errno_status(err);
}

/* A hit on key's file (open as fd, or at path when fd < 0; st its stat): last use = now,
 * expiry = max(old, now + ttl_s); file times are only rewritten when they move by
 * STORE_DIR_TOUCH_EVERY_S or more, the gc view always. */
static void store_dir_refresh(store_dir *d, const uint8_t key[32], int fd, const char *path, const struct stat *st,
                              double ttl_s)
{
    double now = store_dir_now(d);
    double old_exp = store_dir_ts(&st->st_mtim), old_use = store_dir_ts(&st->st_atim);
    double exp = now + ttl_s > old_exp ? now + ttl_s : old_exp;
    if (now - old_use >= STORE_DIR_TOUCH_EVERY_S || exp - old_exp >= STORE_DIR_TOUCH_EVERY_S || old_use > now) {
        if (fd >= 0) {
            store_dir_set_times(fd, now, exp);
        } else {
            struct timespec ts[2] = { store_dir_timespec(now), store_dir_timespec(exp) };
            (void)utimensat(AT_FDCWD, path, ts, 0);
        }
    }
    if (!gc_view_touch(d->view, key, now, exp)) {
        uint8_t victims[1][32];
        (void)gc_view_add(d->view, key, (uint64_t)st->st_size, now, exp, victims, 0);
    }
}

store_status store_dir_touch(store_dir *d, const uint8_t key[32], double ttl_s)
{
    if (d->o.read_only) return STORE_ARG;
    char path[PATH_MAX];
    store_dir_path(d, key, path, sizeof path);
    struct stat st;
    if (stat(path, &st)) {
        if (errno == ENOENT || errno == ENOTDIR) {
            gc_view_remove(d->view, key);
            return STORE_MISS;
        }
        STORE_DIR_INC(d, n_io_err, 1);
        return STORE_IO;
    }
    store_dir_refresh(d, key, -1, path, &st, ttl_s);
    return STORE_OK;
}

/* Opens key's file for reading (its path to path, PATH_MAX): STORE_MISS when there is none
 * (the view forgets it), STORE_IO (logged) when it cannot be opened. */
static store_status store_dir_open_block(store_dir *d, const uint8_t key[32], char *path, int *fd)
{
    store_dir_path(d, key, path, PATH_MAX);
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd >= 0) return STORE_OK;
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
        gc_view_remove(d->view, key);
        STORE_DIR_INC(d, n_read_miss, 1);
        return STORE_MISS;
    }
    store_dir_log(d, "cannot open", path, err);
    STORE_DIR_INC(d, n_io_err, 1);
    return STORE_IO;
}

/* Reads key's file into buf (cap bytes), or into a new buffer (*out) when buf is NULL. */
static store_status store_dir_read_impl(store_dir *d, const uint8_t key[32], double ttl_s, void *buf, size_t cap,
                                        void **out, size_t *n)
{
    *n = 0;
    char path[PATH_MAX];
    int fd;
    store_status ost = store_dir_open_block(d, key, path, &fd);
    if (ost != STORE_OK) return ost;
    struct stat st;
    if (fstat(fd, &st)) {
        int err = errno;
        close(fd);
        store_dir_log(d, "cannot stat", path, err);
        STORE_DIR_INC(d, n_io_err, 1);
        return STORE_IO;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *dst = buf;
    if (!dst) {
        dst = util_aligned_alloc(size ? size : 1);
        if (!dst) {
            close(fd);
            return STORE_IO;
        }
    } else if (size > cap) {   /* not what the caller expects: leave it alone */
        close(fd);
        return STORE_ARG;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, dst + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got < size) {   /* an I/O error mid-file: hand back what was read, verification fails */
        STORE_DIR_INC(d, n_io_err, 1);
    }
    if (ttl_s > 0 && !d->o.read_only) store_dir_refresh(d, key, fd, NULL, &st, ttl_s);
    close(fd);
    STORE_DIR_INC(d, n_read, 1);
    STORE_DIR_INC(d, bytes_read, got);
    if (out) *out = dst;
    *n = got;
    return STORE_OK;
}

store_status store_dir_read(store_dir *d, const uint8_t key[32], double ttl_s, void **out, size_t *n)
{
    *out = NULL;
    return store_dir_read_impl(d, key, ttl_s, NULL, 0, out, n);
}

store_status store_dir_read_into(store_dir *d, const uint8_t key[32], double ttl_s, void *buf, size_t cap, size_t *n)
{
    return store_dir_read_impl(d, key, ttl_s, buf, cap, NULL, n);
}

bool store_dir_mappable(const store_dir *d) { return __atomic_load_n(&d->mappable, __ATOMIC_RELAXED); }

store_status store_dir_map(store_dir *d, const uint8_t key[32], double ttl_s, const void **out, size_t *n)
{
    static const uint8_t empty[1];   /* the mapping of an empty file */
    *out = NULL;
    *n = 0;
    if (!store_dir_mappable(d)) return STORE_ARG;
    char path[PATH_MAX];
    int fd;
    store_status ost = store_dir_open_block(d, key, path, &fd);
    if (ost != STORE_OK) return ost;
    struct stat st;
    const char *what = NULL;
    int err = 0;
    void *p = (void *)empty;
    size_t size = 0;
    if (fstat(fd, &st)) {
        what = "cannot stat";
        err = errno;
    } else if ((size = (size_t)st.st_size) > 0) {
        /* MADV_HUGEPAGE: pages read from disk now go into the page cache as 2 MB folios, which
         * later maps (and the checksum and fill over them) take as a few large entries, not
         * thousands of 4 KB ones (files written by a put are in large folios already; figures
         * in docs/benchmarks.md). Advice only: failure is ignored. */
        p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            what = "cannot map";
            err = errno;
            p = NULL;
        } else if ((void)madvise(p, size, MADV_HUGEPAGE), madvise(p, size, MADV_POPULATE_READ)) {
            /* EINVAL: a kernel without it (< 5.14): read files instead from now on; else a
             * page could not be read (I/O error, or truncated meanwhile by someone else) */
            err = errno;
            munmap(p, size);
            p = NULL;
            if (err == EINVAL) {
                __atomic_store_n(&d->mappable, false, __ATOMIC_RELAXED);
                close(fd);
                return STORE_ARG;
            }
            what = "cannot read";
        }
    }
    if (err) {
        close(fd);
        store_dir_log(d, what, path, err);
        STORE_DIR_INC(d, n_io_err, 1);
        return STORE_IO;
    }
    if (ttl_s > 0 && !d->o.read_only) store_dir_refresh(d, key, fd, NULL, &st, ttl_s);
    close(fd);
    STORE_DIR_INC(d, n_read, 1);
    STORE_DIR_INC(d, bytes_read, size);
    *out = p;
    *n = size;
    return STORE_OK;
}

void store_dir_unmap(const void *p, size_t n)
{
    if (p && n) munmap((void *)p, n);
}

bool store_dir_exists(store_dir *d, const uint8_t key[32])
{
    char path[PATH_MAX];
    store_dir_path(d, key, path, sizeof path);
    struct stat st;
    return stat(path, &st) == 0;
}

store_status store_dir_delete(store_dir *d, const uint8_t key[32])
{
    if (d->o.read_only) return STORE_ARG;
    char path[PATH_MAX];
    store_dir_path(d, key, path, sizeof path);
    gc_view_remove(d->view, key);
    if (unlink(path)) {
        if (errno == ENOENT) return STORE_MISS;
        store_dir_log(d, "cannot delete", path, errno);
        STORE_DIR_INC(d, n_io_err, 1);
        return STORE_IO;
    }
    STORE_DIR_INC(d, n_deleted, 1);
    return STORE_OK;
}

bool store_dir_delete_if_expired(store_dir *d, const uint8_t key[32], double now)
{
    char path[PATH_MAX];
    store_dir_path(d, key, path, sizeof path);
    struct stat st;
    if (stat(path, &st)) return false;
    double exp = store_dir_ts(&st.st_mtim);
    if (exp > now) {   /* used by someone since: keep, with the file's times */
        uint8_t victims[1][32];
        (void)gc_view_add(d->view, key, (uint64_t)st.st_size, store_dir_ts(&st.st_atim), exp, victims, 0);
        return false;
    }
    if (unlink(path)) return false;
    STORE_DIR_INC(d, n_expired, 1);
    return true;
}

void store_dir_evict(store_dir *d, const uint8_t key[32])
{
    char path[PATH_MAX];
    store_dir_path(d, key, path, sizeof path);
    if (!unlink(path)) STORE_DIR_INC(d, n_evicted, 1);
}

static bool store_dir_is_hex2(const char *z)
{
    uint8_t b;
    return strlen(z) == 2 && util_unhex(z, 1, &b);
}

long store_dir_scan(store_dir *d, store_dir_scan_fn fn, void *arg)
{
    DIR *top = opendir(d->root);
    if (!top) {
        store_dir_log(d, "cannot read", d->root, errno);
        STORE_DIR_INC(d, n_io_err, 1);
        return -1;
    }
    long count = 0;
    double now = store_dir_now(d);
    size_t ext_len = strlen(d->ext);
    char path[PATH_MAX];
    struct dirent *e1;
    while ((e1 = readdir(top))) {
        if (!store_dir_is_hex2(e1->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", d->root, e1->d_name);
        DIR *mid = opendir(path);
        if (!mid) continue;
        struct dirent *e2;
        while ((e2 = readdir(mid))) {
            if (!store_dir_is_hex2(e2->d_name)) continue;
            char sub[PATH_MAX];
            snprintf(sub, sizeof sub, "%s/%s/%s", d->root, e1->d_name, e2->d_name);
            DIR *leaf = opendir(sub);
            if (!leaf) continue;
            struct dirent *e3;
            while ((e3 = readdir(leaf))) {
                const char *name = e3->d_name;
                size_t len = strlen(name);
                struct stat st;
                if (name[0] == '.' && len > 4 && !strcmp(name + len - 4, ".tmp")) {
                    if (!d->o.read_only && !fstatat(dirfd(leaf), name, &st, 0) &&
                        now - store_dir_ts(&st.st_mtim) > STORE_DIR_TMP_STALE_S &&
                        !unlinkat(dirfd(leaf), name, 0))
                        STORE_DIR_INC(d, n_tmp_removed, 1);
                    continue;
                }
                uint8_t key[32];
                if (len != 64 + 1 + ext_len || name[64] != '.' || strcmp(name + 65, d->ext) ||
                    blockkey_from_hex(name, key))
                    continue;
                if (fstatat(dirfd(leaf), name, &st, 0)) continue;
                count++;
                if (fn) fn(arg, key, (uint64_t)st.st_size, store_dir_ts(&st.st_atim), store_dir_ts(&st.st_mtim));
            }
            closedir(leaf);
        }
        closedir(mid);
    }
    closedir(top);
    return count;
}

static void store_dir_rebuild_cb(void *arg, const uint8_t key[32], uint64_t bytes, double last_use,
                                 double expiry)
{
    gc_view_scan_merge(arg, key, bytes, last_use, expiry);
}

void store_dir_rebuild(store_dir *d)
{
    gc_view_scan_begin(d->view);
    if (store_dir_scan(d, store_dir_rebuild_cb, d->view) >= 0) gc_view_scan_end(d->view);
}
