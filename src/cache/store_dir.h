/*
 * store_dir: one directory target of the block store (the `dir:` backend, and each of the K+M
 * targets of `ec:`). Files are keyed by block key: ROOT/ab/cd/<64 hex>.<ext> (ab, cd: the
 * first two key bytes; shard directories are made on first use). Bytes are opaque here: the
 * caller verifies them (block files: block.h; fragments: store_ec.c).
 *
 * DESIGN. A put writes ROOT/ab/cd/.<hex>.<pid>.<tid>.<n>.tmp and renames it over the final
 * name: rename is atomic, so readers see the old file, no file, or the whole new one, and when
 * several processes write the same key at once one valid file remains (blocks are immutable:
 * same key, same content). No lock file, no global lock: the file system is the arbiter.
 * Retention times are file times (gc.h: atime = last use, mtime = expiry). Temporary files
 * older than an hour (a writer that died) are removed by scans.
 *
 * Mapped reads (store_dir_map): on a local file system (ext4, xfs, btrfs, tmpfs, f2fs, overlay)
 * a file may be read through a read-only private mapping instead of a copy. A mapping reads
 * the file's pages in place, so it is only safe while nobody truncates or rewrites the file
 * in place (truncation makes any access beyond the new end raise SIGBUS). The store never
 * does: a put writes a new inode and renames it over the name, and every delete (request,
 * corruption, fsck, TTL, eviction, capacity, in this process or another) is an unlink; a
 * mapped inode that was unlinked or renamed over keeps its pages until the last munmap. Pages
 * are read in at map time (MADV_POPULATE_READ), so an I/O error is a failed read (STORE_IO),
 * not a SIGBUS later. Network and FUSE file systems (NFS, CephFS, 3FS, ...) are never mapped:
 * a file deleted by another client can vanish from under a mapping there (ESTALE). Out of the
 * contract, as for the model's own mapping: a process outside the store that truncates or
 * writes a block file in place while it is mapped, and a media error on a page evicted under
 * memory pressure between map and use.
 *
 * Errors: ENOSPC/EDQUOT -> STORE_NOSPACE, other failures -> STORE_IO; each is counted and
 * logged at most once per 10 s per target, and the caller carries on with less cache.
 * Thread-safe: any number of threads may call any function at once.
 */
#ifndef TM_STORE_DIR_H
#define TM_STORE_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "cache/store.h"
#include "cache/gc.h"

typedef struct store_dir store_dir;

typedef struct {
    const char *ext;           /* file name extension without the dot ("blk", "frg") */
    uint64_t capacity_bytes;   /* 0 = unlimited */
    bool fsync;                /* fdatasync before rename (default off: readers verify anyway) */
    bool read_only;            /* never create, write, touch or delete (inspection) */
    double (*clock)(void);     /* wall clock in epoch seconds; NULL = gc_wall_now (tests) */
} store_dir_opts;

typedef struct {
    uint64_t n_put;            /* files written */
    uint64_t n_put_dup;        /* puts of a key already present (rewritten) */
    uint64_t n_put_fail;       /* puts that failed (I/O, no space) */
    uint64_t n_nospace;        /* of those: disk full / quota */
    uint64_t n_io_err;         /* I/O errors of any operation */
    uint64_t n_read;           /* files read */
    uint64_t n_read_miss;      /* reads of absent keys */
    uint64_t n_deleted;        /* files deleted by request (corrupt, fsck, ...) */
    uint64_t n_evicted;        /* files deleted for capacity */
    uint64_t n_expired;        /* files deleted for TTL */
    uint64_t n_tmp_removed;    /* stale temporary files removed */
    uint64_t bytes_written;
    uint64_t bytes_read;
} store_dir_counters;

/* Opens (creating ROOT unless read_only) and scans the target to build its gc view.
 * STORE_IO when ROOT cannot be made or read (logged). */
store_status store_dir_open(const char *root, const store_dir_opts *opts, store_dir **out);
void store_dir_close(store_dir *d);
const char *store_dir_root(const store_dir *d);
gc_view *store_dir_view(store_dir *d);
double store_dir_now(const store_dir *d);

/* Writes the concatenation of iov[0..niov) as key's file with expiry now + ttl_s. A key
 * already present is rewritten (counted as a duplicate; its later expiry is kept). */
store_status store_dir_putv(store_dir *d, const uint8_t key[32], const struct iovec *iov, int niov,
                            double ttl_s);
/* Reads key's whole file into a 64-byte aligned buffer (*out, free with free()). With
 * ttl_s > 0 the hit moves last use to now and expiry to at least now + ttl_s. */
store_status store_dir_read(store_dir *d, const uint8_t key[32], double ttl_s, void **out, size_t *n);
/* The same into the caller's buffer buf of cap bytes (no allocation: a reused buffer takes no
 * page faults). A file larger than cap is not read: STORE_ARG. */
store_status store_dir_read_into(store_dir *d, const uint8_t key[32], double ttl_s, void *buf, size_t cap, size_t *n);
/* True when the target may be read by store_dir_map (a local file system, see above). */
bool store_dir_mappable(const store_dir *d);
/* Maps key's whole file read-only (private, pages read in now) at *out, *n bytes: the read of
 * store_dir_read without the copy. Unmap with store_dir_unmap (an empty file gives a non-NULL
 * *out with *n = 0). STORE_MISS when absent, STORE_IO when the file cannot be opened, mapped
 * or read (counted, logged), STORE_ARG when the target is not mappable. ttl_s as for
 * store_dir_read. */
store_status store_dir_map(store_dir *d, const uint8_t key[32], double ttl_s, const void **out, size_t *n);
/* Unmaps a mapping of store_dir_map (p, n as it returned them); NULL is ignored. */
void store_dir_unmap(const void *p, size_t n);
/* Moves key's last use to now and its expiry to at least now + ttl_s, as a read hit does,
 * without reading it. STORE_OK, STORE_MISS when absent. */
store_status store_dir_touch(store_dir *d, const uint8_t key[32], double ttl_s);
/* True when key's file exists (one stat). */
bool store_dir_exists(store_dir *d, const uint8_t key[32]);
/* STORE_OK or STORE_MISS. */
store_status store_dir_delete(store_dir *d, const uint8_t key[32]);
/* Deletes key's file if its expiry (mtime) is <= now; if another process extended it, the
 * view gets the file's times back instead. True when deleted. */
bool store_dir_delete_if_expired(store_dir *d, const uint8_t key[32], double now);
/* Deletes a victim chosen for capacity (counted as eviction). */
void store_dir_evict(store_dir *d, const uint8_t key[32]);

typedef void (*store_dir_scan_fn)(void *arg, const uint8_t key[32], uint64_t bytes, double last_use,
                                  double expiry);
/* Calls fn for every file of the target (and removes stale temporary files). Returns the
 * number of files, or -1 when ROOT cannot be read. */
long store_dir_scan(store_dir *d, store_dir_scan_fn fn, void *arg);
/* Rescans the files into the gc view (gc_view_scan_*). */
void store_dir_rebuild(store_dir *d);
void store_dir_get_counters(store_dir *d, store_dir_counters *c);
/* Path of key's file into buf (PATH_MAX). */
void store_dir_path(const store_dir *d, const uint8_t key[32], char *buf, size_t n);
/* The first n bytes of key's file into buf, without verifying, touching or counting anything
 * (inspection: a block's header). STORE_MISS when absent or shorter than n. */
store_status store_dir_peek(store_dir *d, const uint8_t key[32], void *buf, size_t n);

#endif
