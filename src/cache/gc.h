/*
 * gc: retention and capacity of a block store target: what is kept, what goes first.
 *
 * DESIGN. The truth lives in the files, so it survives restarts, crashes and other processes:
 * every block (or fragment) file's atime is its last use and its mtime its expiry (last use +
 * the TTL of the longest-lived traffic class that used it). Writers set both on put, readers
 * move them forward on a hit (store_dir). Each target keeps an in-memory view of its files
 * (gc_view: key -> size, last use, expiry; a hash map plus a list in last-use order) that is
 * rebuilt from a scan of the directory at open and again every rescan interval (so blocks
 * written or deleted by other processes are seen), and updated by this process's own puts,
 * hits and deletes in between.
 *
 * Capacity: a put adds its entry before writing and takes least-recently-used victims out of
 * the view until the view's bytes fit the capacity again; the writer unlinks them before it
 * writes. So on disk a target exceeds its capacity by at most the blocks being written (one per
 * writer thread). Expiry: the collector thread (gc_collector) periodically takes expired
 * entries out of the view and deletes their files, re-checking each file's expiry first since
 * another process may have used it since; it never holds the view's lock across a system call,
 * so reads and puts never wait for it.
 *
 * Retention classes ("agent=72h,chat=7d"): class 0 is the default ("chat"). Locks: one mutex
 * per view guards all its fields.
 */
#ifndef TM_GC_H
#define TM_GC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GC_MAX_CLASSES 8

typedef struct {
    int n;                                /* classes in use */
    char name[GC_MAX_CLASSES][16];        /* class names; [0] is the default ("chat") */
    double ttl_s[GC_MAX_CLASSES];         /* seconds from last use */
} gc_retention;

/* chat=7d (class 0, the default), agent=72h. */
void gc_retention_default(gc_retention *r);
/* Parses "name=DURATION,..." (DURATION: number with s, m, h or d; plain number = seconds) over
 * the current contents of r: known names are updated, new ones added. 0 ok, -1 malformed. */
int gc_retention_parse(gc_retention *r, const char *z);
/* Class index of a name; 0 (the default) for NULL, empty or unknown names. */
int gc_retention_class(const gc_retention *r, const char *name);
/* Parses a size such as "512M", "20G", "1T" or plain bytes; 0 on error or "0". */
uint64_t gc_parse_size(const char *z);
/* Wall-clock seconds since the epoch (the time base of file atime/mtime). */
double gc_wall_now(void);

typedef struct gc_view gc_view;

typedef struct {
    uint64_t bytes;      /* file size */
    double last_use;     /* epoch seconds */
    double expiry;       /* epoch seconds */
} gc_entry;

gc_view *gc_view_new(uint64_t capacity_bytes);   /* 0 = unlimited */
void gc_view_free(gc_view *v);
uint64_t gc_view_capacity(const gc_view *v);
/* Adds or updates key (times only move forward) and takes least-recently-used other entries
 * out until the total fits the capacity; their keys go to victims (at most max_victims).
 * Returns the number of victims. */
int gc_view_add(gc_view *v, const uint8_t key[32], uint64_t bytes, double last_use, double expiry,
                uint8_t (*victims)[32], int max_victims);
/* The same for a file about to be written: the entry is busy (never a victim) until
 * gc_view_done, so a concurrent writer cannot evict a file that is not there yet. */
int gc_view_reserve(gc_view *v, const uint8_t key[32], uint64_t bytes, double last_use, double expiry,
                    bool busy, uint8_t (*victims)[32], int max_victims);
void gc_view_done(gc_view *v, const uint8_t key[32]);
/* Moves last use / expiry forward; false when key is not in the view. */
bool gc_view_touch(gc_view *v, const uint8_t key[32], double last_use, double expiry);
bool gc_view_get(gc_view *v, const uint8_t key[32], gc_entry *out);
void gc_view_remove(gc_view *v, const uint8_t key[32]);
/* Takes up to max entries with expiry <= now out of the view. */
int gc_view_take_expired(gc_view *v, double now, uint8_t (*keys)[32], int max);
/* Takes least-recently-used entries out until the total fits the capacity (at most max). */
int gc_view_take_over_capacity(gc_view *v, uint8_t (*keys)[32], int max);
void gc_view_totals(gc_view *v, uint64_t *n_entries, uint64_t *bytes);
/* The last use (epoch seconds) of the least recently used entry; 0 when empty. */
double gc_view_oldest(gc_view *v);
/* A rescan: begin, merge every file found (no victims taken), end (drops entries whose files
 * were not found and were not added by this process during the scan). */
void gc_view_scan_begin(gc_view *v);
void gc_view_scan_merge(gc_view *v, const uint8_t key[32], uint64_t bytes, double last_use, double expiry);
void gc_view_scan_end(gc_view *v);

/* The background collector over a set of dir targets (store_dir.h). */
struct store_dir;
typedef struct gc_collector gc_collector;
typedef struct {
    uint64_t n_expired;     /* files deleted because their TTL ran out */
    uint64_t n_evicted;     /* files deleted to stay under capacity */
    uint64_t bytes_freed;
} gc_result;

/* One pass over one target at time now: expired files first, then LRU down to capacity. */
void gc_collect_dir(struct store_dir *d, double now, gc_result *res);
/* Starts a thread that runs gc_collect_dir on every target every interval_s seconds and
 * rescans each target's files every rescan_s seconds; tick(arg), when not NULL, runs after
 * each pass. NULL if the thread cannot start. */
gc_collector *gc_collector_start(struct store_dir **dirs, int n_dirs, double interval_s, double rescan_s,
                                 void (*tick)(void *), void *tick_arg);
/* Stops and joins the thread; NULL is ignored. Totals of all passes go to res if not NULL. */
void gc_collector_stop(gc_collector *c, gc_result *res);

#endif
