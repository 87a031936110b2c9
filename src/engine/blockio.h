/*
 * blockio: moves 128-token KV blocks between the KV pool (the RAM tier) and the persistent
 * block store (src/cache/store.h), on its own I/O threads.
 *
 * DESIGN. Write-behind: the pool calls blockio's keyed hook (kvpool_set_keyed_hook) on the
 * engine thread for every full block it computes, prefill and decode alike. The hook copies
 * the block into one of n_write_slots preallocated block-file buffers and queues it; an I/O
 * thread seals it (checksum) and store_put's it. When every slot is busy the block is dropped
 * and counted: a slow or full store never slows a step and never fails a request. Each block
 * is written with the traffic class (retention TTL, cache/gc.h) of the request that computed
 * it, which the scheduler sets before committing that request's blocks; a load refreshes its
 * hits with its request's class.
 *
 * Loads: blockio_load_start (engine thread, while the request still waits in the queue)
 * computes the keys of the blocks that follow the request's RAM-tier prefix and queues a
 * load; the idle I/O threads get them from the store (claimed in order, read side by side)
 * until the first miss, as read-only mappings of the files verified in place where the store
 * can map (dir: on a local file system), else into block-file buffers kept faulted in and
 * reused (n_read_bufs), and the owner hears of the finished load through its ready hook. Loads share blocks: a
 * table of the blocks being read or read but not yet in the pool (by key, refcounted) lets a
 * second request that needs them wait for the first read instead of reading the store again
 * (n_load_shared), so concurrent requests with one prefix read each stored block once.
 *
 * Fills (store -> RAM -> KV pool, layer by layer): when the request is admitted,
 * blockio_load_finish appends the loaded blocks to its sequence after the RAM-tier blocks it
 * attached (kvpool_seq_append_fill: keyed at once, so those tokens are not computed and count
 * as cached) and queues their copy; I/O threads copy layer 0 of every queued block, publish
 * it, then layer 1, ... The engine's forward step waits, before attention of layer l, until
 * layer l of every fill issued is copied (the pool's fill hook; the engine thread copies
 * queued fills itself rather than wait for a busy I/O thread), so the uncached suffix's step
 * starts at once and its first layers overlap the copy of the later ones. A mapped block is
 * not copied at all: the pool uses the verified mapping as that block's bytes
 * (kvpool_seq_append_external, n_inplace) and hands it back through its release hook when it
 * reuses the block for other contents, which drops blockio's last reference and unmaps it.
 *
 * Touches: a RAM-tier hit never reads the store, so the store would age out a prefix that is
 * hot in RAM. blockio_touch (engine thread, at admission) queues the hit blocks' keys, at
 * most once per block per touch_every_s (store clock; a small direct-mapped table of recent
 * touches), and an I/O thread refreshes their last use and expiry (store_touch). A full queue
 * drops touches (counted): they are hints.
 *
 * Queue order of the I/O threads: fills, loads, writes, touches.
 *
 * Locks: one mutex guards the queues, the slot free list, the shared-block table, every load
 * job's state and the fill counters; blocks are read, copied and stored outside it. The kvpool
 * is only touched on the engine thread (hook, start, finish, touch, fill wait); I/O threads
 * only write the data of blocks handed out by kvpool_seq_append_fill.
 */
#ifndef TM_BLOCKIO_H
#define TM_BLOCKIO_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/store.h"
#include "engine/kvpool.h"
#include "model/model.h"

typedef struct {
    int n_threads;           /* I/O threads; <= 0: 2 */
    int n_write_slots;       /* blocks buffered for write-behind; <= 0: 8 */
    int max_load_blocks;     /* most blocks one load reads; <= 0: 256 */
    double touch_every_s;    /* least interval between two touches of one block; <= 0: 60 */
    int n_read_bufs;         /* block-file read buffers kept faulted in and reused (each
                              * BLOCK_HEADER_BYTES + kvpool_block_bytes, allocated at start);
                              * <= 0: 16; only used when blocks are not mapped) */
    bool no_map;             /* read blocks into buffers even where the store can map them
                              * (store_mappable); default: map, verify, and let the pool use
                              * the mapping in place */
    int cls;                 /* default traffic class of writes and loads (store_class); a
                              * request's own class comes with blockio_set_write_class and
                              * blockio_load_start_class */
} blockio_opts;

typedef struct {
    uint64_t n_write_queued;   /* blocks handed to the I/O threads */
    uint64_t n_write_dropped;  /* blocks dropped because every slot was busy */
    uint64_t n_written;        /* blocks stored (or already present) */
    uint64_t n_write_failed;   /* store_put failures (no space, I/O) */
    uint64_t n_loads;          /* load jobs started */
    uint64_t n_load_blocks;    /* blocks read from the store */
    uint64_t n_load_mapped;    /* of those, mapped (verified in place, no read copy) */
    uint64_t n_inplace;        /* mapped blocks the pool uses in place (no fill copy either) */
    uint64_t n_appended;       /* loaded blocks appended to sequences (store hits) */
    uint64_t n_load_wasted;    /* blocks read that no request used (cancelled, prefix changed, pool
                                * full, or in the RAM tier meanwhile) */
    uint64_t n_load_shared;    /* blocks a load took from another one (read once, used twice) */
    double load_s;             /* seconds the I/O threads spent reading + verifying blocks (summed
                                * over the threads: loads are read by all of them at once) */
    uint64_t n_read_buf_alloc; /* blocks read into a fresh buffer: the kept ones were all busy */
    uint64_t n_fills;          /* loaded blocks copied into the KV pool, layer by layer */
    uint64_t n_fills_by_engine;/* of those, copied by the engine thread while it waited */
    double fill_wait_s;        /* seconds the engine waited for fills before attention */
    uint64_t n_touch_queued;   /* RAM-tier hits queued to refresh the store's last use */
    uint64_t n_touched;        /* of those, refreshed in the store */
    uint64_t n_touch_skipped;  /* hits not queued: the block was touched < touch_every_s ago */
    uint64_t n_touch_dropped;  /* hits not queued: the touch queue was full */
} blockio_stats;

typedef struct blockio blockio;
typedef struct blockio_load blockio_load;

/* Starts the I/O threads and hooks the pool (model m gives the block geometry and the
 * fingerprint). NULL when the pool's block layout does not match the model. */
blockio *blockio_new(store *st, kvpool *pool, const model *m, const blockio_opts *opts);
/* Writes what is queued, stops the threads, unhooks the pool. Every load must have been
 * finished or freed. NULL is ignored. */
void blockio_free(blockio *b);
/* For a process that stops (after the engine's last step, so that no block is queued any
 * more): waits up to timeout_ms for every block queued for write-behind to be stored.
 * Returns how many were still queued or being written then (0: all are in the store); those
 * still queued are dropped (n_write_dropped), so that blockio_free does not wait for a stuck
 * store beyond the writes already in progress. */
int blockio_flush(blockio *b, int timeout_ms);
/* Waits, on the writers' completions (no polling), up to timeout_ms for every block queued for
 * write-behind so far to be stored or to have failed; drops nothing. True when they have (a
 * prefill worker before it counts the stored blocks of a handoff). */
bool blockio_wait_writes(blockio *b, int timeout_ms);
void blockio_get_stats(blockio *b, blockio_stats *st);

/* Engine thread: the traffic class (store_class) of the blocks the pool's keyed hook hands
 * over from now on (the scheduler sets it to a request's class before committing that
 * request's blocks); they are written behind with that class's TTL. */
void blockio_set_write_class(blockio *b, int cls);

/* fn(arg) is called on an I/O thread, without blockio's lock, soon after one or more loads
 * became ready (blockio_load_ready), so that the owner can admit their requests at once
 * instead of polling; fn may take the owner's locks but must not call blockio. NULL removes
 * it; on return no call of the previous hook is in progress. */
typedef void (*blockio_ready_fn)(void *arg);
void blockio_set_ready_hook(blockio *b, blockio_ready_fn fn, void *arg);

/* Engine thread: queues a load of the stored blocks that continue tokens' RAM-tier prefix
 * (keys chained from root, NULL = zeros: see kvpool_seq_set_root; at least one token is
 * always left to compute). NULL when there is nothing to look up. */
blockio_load *blockio_load_start(blockio *b, const uint8_t *root, const int32_t *tokens, int n_tokens);
/* The same for a request of traffic class cls: every hit moves the block's expiry to at least
 * now + TTL(cls) (blockio_load_start uses opts.cls), also when the block is shared with a load
 * of another class (a store touch with cls is queued for it). */
blockio_load *blockio_load_start_class(blockio *b, const uint8_t *root, const int32_t *tokens, int n_tokens, int cls);
/* Block index (in the request) of the first block the load looks up. */
int blockio_load_first_block(const blockio_load *l);
/* True once the I/O thread is done with it. */
bool blockio_load_ready(blockio *b, blockio_load *l);
/* Block index just past the blocks it holds once ready (first block + blocks loaded), the
 * first block before: what admission may count as reusable. */
int blockio_load_end_block(blockio *b, blockio_load *l);
/* Engine thread, l ready: appends the loaded blocks that continue seq (which holds its
 * RAM-tier prefix, all keyed) and frees l. Returns the positions appended (a multiple of 128).
 * Their KV is copied into the pool asynchronously: engine_step waits for it layer by layer. */
int blockio_load_finish(blockio *b, blockio_load *l, kvpool_seq *seq);
/* Drops a load, ready or not (the I/O thread frees it when it is done). NULL is ignored.
 * Any thread. */
void blockio_load_free(blockio *b, blockio_load *l);

/* Engine thread: the first n_blocks blocks of seq (keyed) were hits of the RAM tier for a
 * request of class cls: refreshes their last use and expiry in the store, asynchronously and
 * at most once per block per touch_every_s. */
void blockio_touch(blockio *b, const kvpool_seq *seq, int n_blocks, int cls);

#endif
