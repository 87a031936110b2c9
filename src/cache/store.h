/*
 * store: the persistent block store behind the in-RAM prefix tier. One interface, two
 * backends chosen by a spec string:
 *   dir:PATH                   files under one directory (local SSD or a shared mount)
 *   ec:K+M:T1,T2,...,T(K+M)    Reed-Solomon K data + M parity fragments over K+M dir targets
 * A bare path means dir:PATH.
 *
 * DESIGN. The store keeps block files (block.h) by block key (blockkey.h). store_get verifies
 * every block it returns (header, key, size, checksum); a block that fails is counted,
 * deleted and reported as STORE_CORRUPT, which callers treat like a miss (recompute).
 * Writes are atomic per file (store_dir.h); retention (TTL per traffic class from last use)
 * and capacity (LRU per target) are gc.h's. Errors never stop the caller: a put that fails is
 * counted and logged (rate-limited) and the service carries on with less cache.
 * Thread-safe: any number of I/O threads may call any function at once.
 */
#ifndef TM_STORE_H
#define TM_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/block.h"

typedef enum {
    STORE_OK = 0,
    STORE_MISS,        /* not stored (or, for ec, fewer than K good fragments) */
    STORE_CORRUPT,     /* stored but failed verification: counted and deleted */
    STORE_NOSPACE,     /* disk full, quota, or larger than the capacity: write dropped */
    STORE_IO,          /* other I/O failure (unwritable, missing target, ...) */
    STORE_ARG,         /* malformed spec or arguments */
} store_status;

const char *store_status_name(store_status st);

typedef struct store store;

typedef struct {
    uint64_t capacity_bytes;   /* per target; 0 = unlimited */
    const char *retention;     /* "agent=72h,chat=7d" over the defaults; NULL = defaults */
    bool gc_thread;            /* run the background collector */
    double gc_interval_s;      /* collector period (0 = 30 s) */
    double rescan_s;           /* rescan of the files for other processes' changes (0 = 300 s) */
    bool fsync;                /* fdatasync every file before its rename */
    bool read_only;            /* inspection only (CLI ls/stat): never write, touch or delete */
    double (*clock)(void);     /* wall clock, epoch seconds; NULL = real time (tests) */
} store_opts;

typedef struct {
    uint64_t n_get;            /* store_get calls */
    uint64_t n_hit;            /* returned a verified block */
    uint64_t n_miss;           /* absent */
    uint64_t n_corrupt;        /* failed verification (deleted) */
    uint64_t n_put;            /* blocks written */
    uint64_t n_put_dup;        /* already present (rewritten: it may have been corrupt) */
    uint64_t n_put_fail;       /* write failed (all causes) */
    uint64_t n_nospace;        /* of the failures: no space */
    uint64_t n_io_err;         /* I/O errors of any operation, all targets */
    uint64_t n_evicted;        /* files deleted for capacity */
    uint64_t n_expired;        /* files deleted for TTL */
    uint64_t n_frag_missing;   /* ec: fragments absent when read */
    uint64_t n_frag_corrupt;   /* ec: fragments that failed their checksum (deleted) */
    uint64_t n_decode;         /* ec: reads that needed Reed-Solomon decoding */
    uint64_t n_degraded_put;   /* ec: puts that wrote at least K but not all K+M fragments */
    uint64_t bytes_read;       /* file bytes read, all targets */
    uint64_t bytes_written;    /* file bytes written, all targets */
    uint64_t n_files;          /* files in the gc views, all targets */
    uint64_t bytes_used;       /* their bytes */
    double oldest_use;         /* last use of the least recently used file, epoch seconds; 0: none */
    int n_targets;
} store_stats;

/* Opens the store named by spec. STORE_ARG for a malformed spec, STORE_IO when the (dir)
 * target or fewer than K (ec) targets can be opened (logged). */
store_status store_open(const char *spec, const store_opts *opts, store **out);
/* Stops the collector and frees everything; NULL is ignored. */
void store_close(store *s);
const char *store_spec(const store *s);
/* Traffic class index of a name (gc_retention_class). */
int store_class(const store *s, const char *name);

/* Stores a block file (block_seal'ed, n bytes) under key with class cls's TTL. The header's
 * key must be key (else STORE_ARG). */
store_status store_put(store *s, const uint8_t key[32], const void *file, size_t n, int cls);
/* Returns key's verified block file in *out (64-byte aligned, free with free()), n bytes;
 * payload at block_payload(*out). A hit moves the block's last use to now and its expiry to at
 * least now + TTL(cls). STORE_MISS / STORE_CORRUPT / STORE_IO otherwise (*out = NULL). */
store_status store_get(store *s, const uint8_t key[32], int cls, void **out, size_t *n);
/* store_get into the caller's buffer buf of cap bytes (64-byte aligned; a buffer reused from
 * one get to the next takes no page faults): the same verification, counters and refresh; *n
 * is the block file's size. A stored block larger than cap is verified (deleted when corrupt)
 * and STORE_ARG is returned for a valid one. buf's bytes are undefined unless STORE_OK. */
store_status store_get_into(store *s, const uint8_t key[32], int cls, void *buf, size_t cap, size_t *n);
/* store_get without a copy, for dir: stores on a local file system (store_mappable): maps
 * key's block file read-only (*out, n bytes) and verifies it in place, with the same
 * counters, deletion of a corrupt block and refresh. Release with store_unmap(*out, *n). The
 * mapping stays valid when the file is deleted or replaced meanwhile (store_dir.h says why and
 * what is out of the contract). STORE_ARG when this store cannot map (ec:, a network file
 * system): use store_get_into; STORE_MISS / STORE_CORRUPT / STORE_IO otherwise (*out = NULL). */
store_status store_get_mapped(store *s, const uint8_t key[32], int cls, const void **out, size_t *n);
void store_unmap(const void *file, size_t n);
/* True when store_get_mapped may map (it can still answer STORE_ARG, e.g. on an old kernel). */
bool store_mappable(const store *s);
/* Refreshes key's last use to now and its expiry to at least now + TTL(cls) without reading
 * it (a hit served from a RAM tier above the store). STORE_OK, STORE_MISS when absent. */
store_status store_touch(store *s, const uint8_t key[32], int cls);
/* The number of leading keys[0..n) that are stored (stops at the first absent one). */
int store_exists(store *s, const uint8_t (*keys)[32], int n);
/* STORE_OK or STORE_MISS. */
store_status store_delete(store *s, const uint8_t key[32]);
void store_get_stats(store *s, store_stats *st);

/* Maintenance (the `tokenmill store` command, tests). */
typedef struct {
    uint64_t n_files;          /* files examined */
    uint64_t n_ok;             /* files that verified */
    uint64_t n_broken;         /* files that failed verification (removed) */
    uint64_t n_lost;           /* ec: blocks with fewer than K good fragments (removed) */
    uint64_t n_degraded;       /* ec: blocks with K..K+M-1 good fragments */
    uint64_t n_repaired;       /* ec: of those, decoded and written back whole */
    uint64_t bytes;            /* bytes examined */
} store_fsck_result;
/* Verifies every file of every target, removing the broken ones (and, for ec, the
 * fragments of blocks that can no longer be decoded; degraded blocks are decoded and their
 * missing fragments written again). */
void store_fsck(store *s, store_fsck_result *r);
/* One collector pass over every target now: expired blocks, then LRU down to capacity. */
void store_gc(store *s, uint64_t *n_expired, uint64_t *n_evicted);

/* Reads only the header of key's block (no payload check, no touch, no counters): what
 * `store stat` reports of a store's blocks without the model. STORE_MISS when absent or
 * unreadable (ec: data fragment 0 absent or damaged), STORE_CORRUPT for a bad header. */
store_status store_peek_header(store *s, const uint8_t key[32], block_header *h);

typedef void (*store_ls_fn)(void *arg, int target, const uint8_t key[32], uint64_t bytes,
                            double last_use, double expiry);
/* Lists the files of every target. */
void store_ls(store *s, store_ls_fn fn, void *arg);
/* Counters of every process that used this store: each open store that served gets or
 * puts writes its own ROOT/.stats/HOST-PID-N (first target) at close and after each collector pass; this sums
 * them into sum (counter fields only). Returns the number of files read. */
int store_load_counters(store *s, store_stats *sum);
void store_save_counters(store *s);
/* Number of dir targets (1 for dir:, K+M for ec:) and the root of one. */
int store_n_targets(const store *s);
const char *store_target_root(const store *s, int i);
/* ec geometry (k = 1, m = 0 for dir:). */
void store_geometry(const store *s, int *k, int *m);
/* Wall clock of the store (store_opts.clock). */
double store_now(const store *s);

#endif
