/*
 * blockio: write-behind, shared loads, layer-by-layer fills and touches between the KV pool
 * and the block store (design in blockio.h).
 *
 * A stored block on its way into the pool is a blockio_ent in the shared-block table: QUEUED
 * (some load wants it), READING (an I/O thread is in store_get_into), OK (file verified, in
 * RAM) or MISS (absent or corrupt). Loads hold references to their entries, in order; fills
 * hold one until their copy is done; the last reference returns the file buffer and removes
 * the entry.
 *
 * Loads are read by every idle I/O thread at once: a load stays at the head of the load queue
 * while it has entries to claim, each thread claims the next one (in order) and reads it; a
 * miss stops the claims (a block claimed beside it is read for nothing: counted as wasted).
 * Once no entry is left to claim and no thread reads for it, the thread that made it so
 * settles the load: it waits (ent_cv) for entries other loads' threads are reading, holding
 * no READING entry itself, so two loads never wait for each other, and counts the leading OK
 * entries.
 *
 * Mapped blocks: where the store can map its files (store_mappable: dir: on a local file
 * system), a block is not read at all: store_get_mapped maps the file read-only, verifies it in
 * place, and the pool uses the mapping as the block's bytes (kvpool_seq_append_external: no
 * fill) while it holds the block, with a reference to the entry that its release hook drops
 * when the block is reused; the last reference unmaps it. No copy of the KV bytes at all
 * (reading and filling were two, ~190 MB each for a 1,750-token prompt of a 0.6B model: memory
 * traffic beside the step), and the page-cache pages are mapped in large batches (file
 * folios). A deleted or replaced file keeps its pages while mapped (store_dir.h). While the
 * pool holds such a block its pages are page cache: the kernel may reclaim them under memory
 * pressure and read them again from the file on the next access (as it does for the mmapped
 * model weights); an I/O error on that re-read is, as for the weights, outside the contract.
 *
 * Read buffers (ec:, network file systems, opts.no_map): a block file read into fresh memory
 * costs more in page faults than in the read itself (a 14.7 MB block: ~3,600 faults with their
 * zeroing and accounting), so files are read into a stack of n_read_bufs buffers faulted in
 * once at start and reused; a load that needs more gets fresh ones, freed again beyond the
 * stack's size. With mapped blocks the stack starts empty and only fills if a map fails over
 * to reading (a kernel without MADV_POPULATE_READ).
 *
 * Stopping: blockio_flush waits, with a bound, until the write queue is empty and no write is
 * in store_put; when the bound passes first it sets abandon, and the threads drop what is
 * still queued (writes and touches, counted) instead of waiting for the store, so that
 * blockio_free only waits for the store calls already under way.
 *
 * Fill counters: fill_issued counts the blocks handed to the pool with kvpool_seq_append_fill,
 * fill_done[l] the blocks whose layer l is copied. Every fill copies its layers in order, so
 * fill_done[l] == fill_issued means layer l of every block filled so far is in the pool.
 */
#include "engine/blockio.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/block.h"
#include "cache/blockkey.h"
#include "util/util.h"

#define BLOCKIO_HASH 1024        /* shared-block table buckets */
#define BLOCKIO_TOUCH_SEEN 4096  /* recent touches remembered (direct-mapped) */
#define BLOCKIO_TOUCH_QUEUE 1024 /* touches queued at most */
#define BLOCKIO_FILL_BATCH 64    /* fills one thread takes at once */

typedef enum { BLOCKIO_ENT_QUEUED = 0, BLOCKIO_ENT_READING, BLOCKIO_ENT_OK, BLOCKIO_ENT_MISS } blockio_ent_state;

typedef struct blockio_ent {
    uint8_t key[32];            /* block key */
    void *file;                 /* verified block file when OK (a read buffer, or a mapping of
                                 * file_bytes when mapped), else NULL */
    bool mapped;                /* file is a store mapping (store_unmap), not a read buffer */
    int state;                  /* blockio_ent_state */
    int refcnt;                 /* loads and fills holding it */
    bool used;                  /* appended to a sequence by some load */
    int cls;                    /* traffic class of the last load that asked for it */
    struct blockio_ent *hnext;  /* hash chain */
} blockio_ent;

struct blockio_load {
    blockio_ent **ents;      /* (n_keys) entries of blocks first_block.. (one reference each) */
    int first_block;         /* block index of ents[0] in the request */
    int n_keys;
    int cls;                 /* traffic class the hits are refreshed with (store_class) */
    int n_ok;                /* leading blocks loaded */
    int next;                /* next entry an I/O thread claims (under mu) */
    int n_reading;           /* I/O threads reading one of its entries now (under mu) */
    bool queued;             /* in the load queue: entries left to claim (under mu) */
    bool settling;           /* an I/O thread is settling it (under mu) */
    bool done;               /* settled: n_ok is final (under mu) */
    bool abandoned;          /* the owner let go: the settling I/O thread frees it (under mu) */
    blockio_load *next_load; /* load queue link */
};

typedef struct {
    uint8_t *dst;            /* pool block data (kvpool_block_bytes) */
    blockio_ent *ent;        /* source (OK), one reference */
} blockio_fill;

typedef struct {
    uint8_t key[32];
    double t;                /* store clock of the last touch queued; 0 = empty */
} blockio_seen;

struct blockio {
    store *st;
    kvpool *pool;
    blockio_opts o;
    block_header proto;      /* header fields shared by every block (key set per block) */
    size_t block_bytes;      /* kvpool_block_bytes */
    size_t *layer_off;       /* (n_layers + 1) byte offset of each block layer's K and V in a
                              * block (kvpool_block_layer_offset); layer_off[n_layers] = block_bytes */
    int n_layers;
    size_t file_bytes;       /* BLOCK_HEADER_BYTES + block_bytes */
    bool map;                /* read blocks through store_get_mapped (store_mappable, !o.no_map) */
    uint8_t **rbuf;          /* (o.n_read_bufs) stack of free read buffers (file_bytes each, faulted in) */
    int n_rbuf;              /* buffers on the stack */
    pthread_t *th;           /* (n_threads) */
    int n_started;
    pthread_mutex_t mu;      /* guards everything below but write_cls and seen */
    pthread_cond_t cv;       /* work or stop */
    pthread_cond_t ent_cv;   /* an entry left READING */
    pthread_cond_t fill_cv;  /* fill_done moved */
    pthread_cond_t flush_cv; /* a write ended (blockio_flush, blockio_wait_writes) */
    bool stop;
    bool abandon;            /* blockio_flush gave up: queued writes and touches are dropped */
    int n_writing;           /* writes taken off wq, in store_put now */
    uint8_t **slot;          /* (n_write_slots) block-file buffers */
    uint8_t (*slot_key)[32]; /* (n_write_slots) */
    int *slot_cls;           /* (n_write_slots) traffic class of the queued block */
    int write_cls;           /* class of the blocks the hook gets next (engine thread only) */
    int *free_slots;         /* (n_write_slots) stack */
    int n_free;
    int *wq;                 /* (n_write_slots) FIFO of queued slots */
    int wq_head, wq_n;
    blockio_load *lq_head, *lq_tail;
    blockio_ent *hash[BLOCKIO_HASH];  /* shared-block table */
    blockio_fill *fq;        /* (fq_cap) ring of queued fills */
    int fq_head, fq_n, fq_cap;
    uint64_t fill_issued;    /* blocks handed out for filling */
    uint64_t *fill_done;     /* (n_layers) blocks whose layer l is copied */
    uint8_t (*tq_key)[32];   /* (BLOCKIO_TOUCH_QUEUE) ring of queued touches */
    int *tq_cls;             /* (BLOCKIO_TOUCH_QUEUE) their classes */
    int tq_head, tq_n;
    blockio_seen *seen;      /* (BLOCKIO_TOUCH_SEEN) recent touches */
    blockio_ready_fn ready_fn;   /* called when a load is settled, or NULL */
    void *ready_arg;
    bool ready_pending;      /* a load was settled since the last ready_fn call */
    int n_ready_calls;       /* ready_fn calls in progress (outside mu) */
    blockio_stats s;
};

/* ---- read buffers (under mu) ---- */

/* A free read buffer, or NULL: the caller allocates one (outside mu). */
static uint8_t *blockio_rbuf_get_locked(blockio *b)
{
    return b->n_rbuf ? b->rbuf[--b->n_rbuf] : NULL;
}

/* Returns a read buffer to the stack, or frees it when the stack is full. NULL is ignored. */
static void blockio_rbuf_put_locked(blockio *b, void *buf)
{
    if (!buf) return;
    if (b->n_rbuf < b->o.n_read_bufs) b->rbuf[b->n_rbuf++] = buf;
    else free(buf);
}

/* ---- shared-block table (under mu) ---- */

static blockio_ent **blockio_ent_slot(blockio *b, const uint8_t key[32])
{
    uint32_t h;
    memcpy(&h, key, 4);
    blockio_ent **pp = &b->hash[h % BLOCKIO_HASH];
    while (*pp && memcmp((*pp)->key, key, 32)) pp = &(*pp)->hnext;
    return pp;
}

static void blockio_ent_unref(blockio *b, blockio_ent *e)
{
    if (--e->refcnt > 0) return;
    if (e->state == BLOCKIO_ENT_OK && !e->used) b->s.n_load_wasted++;   /* read for nothing */
    blockio_ent **pp = blockio_ent_slot(b, e->key);
    if (*pp == e) *pp = e->hnext;
    if (e->mapped) store_unmap(e->file, b->file_bytes);
    else blockio_rbuf_put_locked(b, e->file);
    free(e);
}

/* kvpool release hook (engine thread, mu not held): the pool lets go of a mapped block it used
 * in place (kvpool_seq_append_external). */
static void blockio_pool_release(void *arg, void *ent)
{
    blockio *b = arg;
    pthread_mutex_lock(&b->mu);
    blockio_ent_unref(b, ent);
    pthread_mutex_unlock(&b->mu);
}

/* Takes l out of the load queue, if it is in (under mu). */
static void blockio_lq_unlink(blockio *b, blockio_load *l)
{
    if (!l->queued) return;
    for (blockio_load **pp = &b->lq_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next_load)
        if (*pp == l) {
            *pp = l->next_load;
            if (b->lq_tail == l) b->lq_tail = prev;
            break;
        }
    l->next_load = NULL;
    l->queued = false;
}

/* Drops a load's references and frees it (under mu). */
static void blockio_load_destroy_locked(blockio *b, blockio_load *l)
{
    for (int i = 0; i < l->n_keys; i++) blockio_ent_unref(b, l->ents[i]);
    free(l->ents);
    free(l);
}

/* ---- I/O thread work ---- */

/* A verified block file of n bytes has this pool's geometry and model (same key, other
 * geometry: a block written by a pool of other row widths, or keys colliding). */
static bool blockio_geometry_ok(const blockio *b, const void *file, size_t n)
{
    block_header h;
    return n == b->file_bytes && block_parse_header(file, n, &h) == BLOCK_OK && h.payload_bytes == b->block_bytes &&
           h.n_parts == b->proto.n_parts && h.n_layers == b->proto.n_layers && h.n_kv_heads == b->proto.n_kv_heads &&
           h.head_dim == b->proto.head_dim && h.layer_bytes == b->proto.layer_bytes && h.geom == b->proto.geom &&
           !memcmp(h.fp, b->proto.fp, 32);
}

/* Reads key's block into buf (file_bytes) with a geometry check. False on a miss. */
static bool blockio_read(blockio *b, const uint8_t key[32], int cls, uint8_t *buf)
{
    size_t n;
    return store_get_into(b->st, key, cls, buf, b->file_bytes, &n) == STORE_OK && blockio_geometry_ok(b, buf, n);
}

/* Maps key's block (store_get_mapped) with the geometry check of blockio_read: 1 with the
 * mapping in *out, 0 on a miss, -1 when the store cannot map (read it instead). */
static int blockio_read_mapped(blockio *b, const uint8_t key[32], int cls, const void **out)
{
    size_t n;
    store_status st = store_get_mapped(b->st, key, cls, out, &n);
    if (st == STORE_ARG) return -1;
    if (st != STORE_OK) return 0;
    if (blockio_geometry_ok(b, *out, n)) return 1;
    store_unmap(*out, n);
    *out = NULL;
    return 0;
}

/* Nothing left to claim and nobody reading for it: waits for the entries other loads' threads
 * read, counts the leading OK ones, marks l done (frees it when abandoned). Called with mu
 * held; returns with it held. */
static void blockio_load_settle(blockio *b, blockio_load *l)
{
    l->settling = true;
    int n_ok = 0;
    for (int i = 0; i < l->n_keys; i++) {
        blockio_ent *e = l->ents[i];
        while (e->state == BLOCKIO_ENT_READING) pthread_cond_wait(&b->ent_cv, &b->mu);
        if (e->state != BLOCKIO_ENT_OK) break;
        n_ok++;
    }
    l->n_ok = n_ok;
    l->done = true;
    if (l->abandoned) blockio_load_destroy_locked(b, l);
    else b->ready_pending = true;
}

/* Claims the next entry of l (the head of the load queue) and reads it. Called with mu held;
 * returns with it held. */
static void blockio_do_load(blockio *b, blockio_load *l)
{
    blockio_ent *e = l->ents[l->next++];
    if (l->next >= l->n_keys) blockio_lq_unlink(b, l);   /* every entry claimed */
    if (e->state == BLOCKIO_ENT_QUEUED) {
        e->state = BLOCKIO_ENT_READING;
        l->n_reading++;
        if (l->queued) pthread_cond_signal(&b->cv);   /* more to claim: wake an idle thread */
        bool map = b->map;
        uint8_t *buf = map ? NULL : blockio_rbuf_get_locked(b);
        pthread_mutex_unlock(&b->mu);
        double t0 = util_now();
        const void *mapping = NULL;
        int mapped = map ? blockio_read_mapped(b, e->key, l->cls, &mapping) : -1;
        bool fresh = false, ok = mapped == 1;
        if (mapped < 0) {   /* read into a buffer */
            if (map) {
                pthread_mutex_lock(&b->mu);
                buf = blockio_rbuf_get_locked(b);
                pthread_mutex_unlock(&b->mu);
            }
            fresh = !buf;
            if (fresh) buf = util_aligned_alloc(b->file_bytes);
            ok = buf && blockio_read(b, e->key, l->cls, buf);
        }
        double dt = util_now() - t0;
        pthread_mutex_lock(&b->mu);
        if (fresh && buf) b->s.n_read_buf_alloc++;
        if (ok && mapped == 1) {
            e->file = (void *)mapping;
            e->mapped = true;
            e->state = BLOCKIO_ENT_OK;
            b->s.n_load_blocks++;
            b->s.n_load_mapped++;
        } else if (ok) {
            e->file = buf;
            e->state = BLOCKIO_ENT_OK;
            b->s.n_load_blocks++;
        } else {
            blockio_rbuf_put_locked(b, buf);
            e->state = BLOCKIO_ENT_MISS;
        }
        b->s.load_s += dt;
        pthread_cond_broadcast(&b->ent_cv);
        l->n_reading--;
    }
    if (e->state == BLOCKIO_ENT_MISS) blockio_lq_unlink(b, l);   /* nothing after a miss is used */
    if (!l->queued && l->n_reading == 0 && !l->settling) blockio_load_settle(b, l);
}

/* Takes up to BLOCKIO_FILL_BATCH queued fills, copies them layer by layer, publishing each
 * layer. Called with mu held; returns with it held. */
static void blockio_do_fills(blockio *b)
{
    blockio_fill f[BLOCKIO_FILL_BATCH];
    int n = 0;
    while (b->fq_n && n < BLOCKIO_FILL_BATCH) {
        f[n++] = b->fq[b->fq_head];
        b->fq_head = (b->fq_head + 1) % b->fq_cap;
        b->fq_n--;
    }
    for (int l = 0; l < b->n_layers; l++) {
        pthread_mutex_unlock(&b->mu);
        size_t off = b->layer_off[l], len = b->layer_off[l + 1] - off;
        for (int i = 0; i < n; i++)
            memcpy(f[i].dst + off, (const uint8_t *)block_payload(f[i].ent->file) + off, len);
        pthread_mutex_lock(&b->mu);
        b->fill_done[l] += (uint64_t)n;
        pthread_cond_broadcast(&b->fill_cv);
    }
    for (int i = 0; i < n; i++) blockio_ent_unref(b, f[i].ent);
}

static void *blockio_thread(void *arg)
{
    blockio *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stop && !b->fq_n && !b->lq_head && !b->wq_n && !b->tq_n) pthread_cond_wait(&b->cv, &b->mu);
        if (b->fq_n) {
            blockio_do_fills(b);
            continue;
        }
        if (b->lq_head) {
            blockio_do_load(b, b->lq_head);
            if (b->ready_pending && b->ready_fn) {   /* tell the owner, without mu */
                blockio_ready_fn fn = b->ready_fn;
                void *rarg = b->ready_arg;
                b->ready_pending = false;
                b->n_ready_calls++;
                pthread_mutex_unlock(&b->mu);
                fn(rarg);
                pthread_mutex_lock(&b->mu);
                if (--b->n_ready_calls == 0) pthread_cond_broadcast(&b->ent_cv);
            }
            continue;
        }
        if (b->wq_n) {
            int si = b->wq[b->wq_head];
            b->wq_head = (b->wq_head + 1) % b->o.n_write_slots;
            b->wq_n--;
            if (b->abandon) {   /* a stuck store: what is queued is lost, counted */
                b->s.n_write_dropped++;
                b->free_slots[b->n_free++] = si;
                continue;
            }
            b->n_writing++;
            pthread_mutex_unlock(&b->mu);
            block_header h = b->proto;
            memcpy(h.key, b->slot_key[si], 32);
            block_seal(&h, b->slot[si]);
            store_status st = store_put(b->st, h.key, b->slot[si], b->file_bytes, b->slot_cls[si]);
            pthread_mutex_lock(&b->mu);
            if (st == STORE_OK) b->s.n_written++;
            else b->s.n_write_failed++;
            b->free_slots[b->n_free++] = si;
            b->n_writing--;
            pthread_cond_broadcast(&b->flush_cv);
            continue;
        }
        if (b->tq_n) {
            uint8_t key[32];
            memcpy(key, b->tq_key[b->tq_head], 32);
            int cls = b->tq_cls[b->tq_head];
            b->tq_head = (b->tq_head + 1) % BLOCKIO_TOUCH_QUEUE;
            b->tq_n--;
            if (b->abandon) {
                b->s.n_touch_dropped++;
                continue;
            }
            pthread_mutex_unlock(&b->mu);
            store_status st = store_touch(b->st, key, cls);
            pthread_mutex_lock(&b->mu);
            if (st == STORE_OK) b->s.n_touched++;
            continue;
        }
        if (b->stop) break;   /* queues drained */
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* kvpool hook (engine thread): copy the block into a free slot, or drop it. */
static void blockio_keyed(void *arg, const uint8_t key[32], const void *block, size_t bytes)
{
    blockio *b = arg;
    pthread_mutex_lock(&b->mu);
    if (!b->n_free || bytes != b->block_bytes) {
        b->s.n_write_dropped++;
        pthread_mutex_unlock(&b->mu);
        return;
    }
    int si = b->free_slots[--b->n_free];
    pthread_mutex_unlock(&b->mu);
    memcpy(b->slot_key[si], key, 32);
    b->slot_cls[si] = b->write_cls;
    memcpy(b->slot[si] + BLOCK_HEADER_BYTES, block, bytes);
    pthread_mutex_lock(&b->mu);
    b->wq[(b->wq_head + b->wq_n) % b->o.n_write_slots] = si;
    b->wq_n++;
    b->s.n_write_queued++;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* kvpool fill hook (engine thread): waits until layer `layer` (all when < 0) of every fill is
 * copied, copying queued fills itself rather than waiting for a busy I/O thread. */
static void blockio_fill_wait(void *arg, int layer)
{
    blockio *b = arg;
    int l = layer < 0 || layer >= b->n_layers ? b->n_layers - 1 : layer;
    pthread_mutex_lock(&b->mu);
    if (b->fill_done[l] < b->fill_issued) {
        double t0 = util_now();
        while (b->fill_done[l] < b->fill_issued) {
            if (b->fq_n) {
                b->s.n_fills_by_engine += (uint64_t)TM_MIN(b->fq_n, BLOCKIO_FILL_BATCH);
                blockio_do_fills(b);
            } else {
                pthread_cond_wait(&b->fill_cv, &b->mu);
            }
        }
        b->s.fill_wait_s += util_now() - t0;
    }
    pthread_mutex_unlock(&b->mu);
}

blockio *blockio_new(store *st, kvpool *pool, const model *m, const blockio_opts *opts)
{
    blockio *b = xcalloc(1, sizeof *b);
    b->st = st;
    b->pool = pool;
    if (opts) b->o = *opts;
    if (b->o.n_threads <= 0) b->o.n_threads = 2;
    if (b->o.n_write_slots <= 0) b->o.n_write_slots = 8;
    if (b->o.max_load_blocks <= 0) b->o.max_load_blocks = 256;
    if (b->o.touch_every_s <= 0) b->o.touch_every_s = 60;
    if (b->o.n_read_bufs <= 0) b->o.n_read_bufs = 16;
    qtype dt = kvpool_dtype(pool);
    int row = (int)quant_row_bytes(dt, kvpool_block_width_max(pool));
    uint8_t fp[32], zero[32] = { 0 };
    blockkey_pool_fp(m->fingerprint, (int32_t)dt, fp);
    if (kvpool_block_uniform(pool))
        block_header_init(&b->proto, zero, fp, (uint32_t)dt, row, kvpool_n_block_layers(pool), kvpool_n_kv_heads(pool),
                          kvpool_block_width_max(pool), kvpool_n_parts(pool));
    else
        block_header_init_layers(&b->proto, zero, fp, (uint32_t)dt, kvpool_n_block_layers(pool),
                                 kvpool_n_kv_heads(pool), kvpool_block_width_max(pool), kvpool_n_parts(pool),
                                 kvpool_block_bytes(pool));
    b->proto.geom = kvpool_block_geom(pool);
    b->block_bytes = kvpool_block_bytes(pool);
    if (b->proto.payload_bytes != b->block_bytes) {
        log_error("blockio: KV pool blocks (%zu bytes) do not match the model geometry (%llu bytes)", b->block_bytes,
                  (unsigned long long)b->proto.payload_bytes);
        free(b);
        return NULL;
    }
    b->n_layers = kvpool_n_block_layers(pool);   /* window layers never enter a block */
    b->layer_off = xmalloc(((size_t)b->n_layers + 1) * sizeof *b->layer_off);
    for (int l = 0; l <= b->n_layers; l++) b->layer_off[l] = kvpool_block_layer_offset(pool, l);
    b->file_bytes = BLOCK_HEADER_BYTES + b->block_bytes;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    pthread_cond_init(&b->ent_cv, NULL);
    pthread_cond_init(&b->fill_cv, NULL);
    util_cond_init(&b->flush_cv);   /* blockio_flush's deadline is on the monotonic clock */
    int ns = b->o.n_write_slots;
    b->slot = xcalloc((size_t)ns, sizeof *b->slot);
    b->slot_key = xcalloc((size_t)ns, sizeof *b->slot_key);
    b->slot_cls = xcalloc((size_t)ns, sizeof *b->slot_cls);
    b->write_cls = b->o.cls;
    b->free_slots = xmalloc(sizeof(int) * (size_t)ns);
    b->wq = xmalloc(sizeof(int) * (size_t)ns);
    for (int i = 0; i < ns; i++) {
        b->slot[i] = util_aligned_alloc(b->file_bytes);
        if (b->slot[i]) b->free_slots[b->n_free++] = i;
    }
    /* read buffers, faulted in now rather than by the first loads after a start (none when
     * blocks are mapped: the stack fills only if mapping fails over to reading) */
    b->map = !b->o.no_map && store_mappable(st);
    b->rbuf = xcalloc((size_t)b->o.n_read_bufs, sizeof *b->rbuf);
    for (int i = 0; i < (b->map ? 0 : b->o.n_read_bufs); i++) {
        uint8_t *r = util_aligned_alloc(b->file_bytes);
        if (!r) break;
        memset(r, 0, b->file_bytes);
        b->rbuf[b->n_rbuf++] = r;
    }
    kvpool_stats ks;
    kvpool_get_stats(pool, &ks);
    b->fq_cap = ks.n_blocks;   /* a block being filled is never reused: at most every block */
    b->fq = xcalloc((size_t)b->fq_cap, sizeof *b->fq);
    b->fill_done = xcalloc((size_t)b->n_layers, sizeof *b->fill_done);
    b->tq_key = xcalloc(BLOCKIO_TOUCH_QUEUE, sizeof *b->tq_key);
    b->tq_cls = xcalloc(BLOCKIO_TOUCH_QUEUE, sizeof *b->tq_cls);
    b->seen = xcalloc(BLOCKIO_TOUCH_SEEN, sizeof *b->seen);
    b->th = xcalloc((size_t)b->o.n_threads, sizeof *b->th);
    for (int i = 0; i < b->o.n_threads; i++)
        if (!pthread_create(&b->th[i], NULL, blockio_thread, b)) b->n_started++;
    if (!b->n_started || !b->n_free) {
        log_error("blockio: cannot start I/O threads or buffers; running without the block store");
        blockio_free(b);
        return NULL;
    }
    kvpool_set_keyed_hook(pool, blockio_keyed, b);
    kvpool_set_fill_hook(pool, blockio_fill_wait, b);
    kvpool_set_release_hook(pool, blockio_pool_release, b);
    return b;
}

void blockio_free(blockio *b)
{
    if (!b) return;
    kvpool_set_keyed_hook(b->pool, NULL, NULL);
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->o.n_threads; i++)
        if (i < b->n_started) pthread_join(b->th[i], NULL);
    /* the threads drained every queue (fills included) before they stopped */
    kvpool_fill_wait(b->pool, -1);
    kvpool_set_fill_hook(b->pool, NULL, NULL);
    kvpool_internalise_all(b->pool);   /* the pool keeps its mapped blocks' bytes as copies */
    kvpool_set_release_hook(b->pool, NULL, NULL);
    pthread_mutex_lock(&b->mu);
    while (b->fq_n) blockio_do_fills(b);   /* no thread started */
    for (blockio_load *l = b->lq_head, *next; l; l = next) {   /* abandoned, still queued */
        next = l->next_load;
        blockio_load_destroy_locked(b, l);
    }
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n_rbuf; i++) free(b->rbuf[i]);
    free(b->rbuf);
    for (int i = 0; i < b->o.n_write_slots; i++) free(b->slot[i]);
    free(b->slot);
    free(b->slot_key);
    free(b->slot_cls);
    free(b->free_slots);
    free(b->wq);
    free(b->fq);
    free(b->fill_done);
    free(b->tq_key);
    free(b->tq_cls);
    free(b->seen);
    free(b->th);
    free(b->layer_off);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    pthread_cond_destroy(&b->ent_cv);
    pthread_cond_destroy(&b->fill_cv);
    pthread_cond_destroy(&b->flush_cv);
    free(b);
}

int blockio_flush(blockio *b, int timeout_ms)
{
    struct timespec ts;
    util_deadline(&ts, CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&b->mu);
    while ((b->wq_n || b->n_writing) && timeout_ms > 0)
        if (!util_cond_wait_until(&b->flush_cv, &b->mu, &ts)) break;
    int left = b->wq_n + b->n_writing;
    if (left) {
        b->abandon = true;
        pthread_cond_broadcast(&b->cv);   /* idle threads drop the queue now */
    }
    pthread_mutex_unlock(&b->mu);
    return left;
}

bool blockio_wait_writes(blockio *b, int timeout_ms)
{
    struct timespec ts;
    util_deadline(&ts, CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&b->mu);
    uint64_t target = b->s.n_write_queued;
    while (b->s.n_written + b->s.n_write_failed < target)
        if (!util_cond_wait_until(&b->flush_cv, &b->mu, &ts)) break;
    bool done = b->s.n_written + b->s.n_write_failed >= target;
    pthread_mutex_unlock(&b->mu);
    return done;
}

void blockio_get_stats(blockio *b, blockio_stats *st)
{
    pthread_mutex_lock(&b->mu);
    *st = b->s;
    pthread_mutex_unlock(&b->mu);
}

void blockio_set_write_class(blockio *b, int cls) { b->write_cls = cls; }

void blockio_set_ready_hook(blockio *b, blockio_ready_fn fn, void *arg)
{
    pthread_mutex_lock(&b->mu);
    b->ready_fn = fn;
    b->ready_arg = arg;
    b->ready_pending = false;
    while (b->n_ready_calls > 0) pthread_cond_wait(&b->ent_cv, &b->mu);   /* the old hook is done */
    pthread_mutex_unlock(&b->mu);
}

blockio_load *blockio_load_start(blockio *b, const uint8_t *root, const int32_t *tokens, int n_tokens)
{
    return blockio_load_start_class(b, root, tokens, n_tokens, b->o.cls);
}

/* Queues a store touch of key with class cls for the I/O threads (mu held); false when the
 * queue is full (counted as dropped). */
static bool blockio_touch_enqueue_locked(blockio *b, const uint8_t key[32], int cls)
{
    if (b->tq_n == BLOCKIO_TOUCH_QUEUE) {
        b->s.n_touch_dropped++;
        return false;
    }
    int qi = (b->tq_head + b->tq_n++) % BLOCKIO_TOUCH_QUEUE;
    memcpy(b->tq_key[qi], key, 32);
    b->tq_cls[qi] = cls;
    b->s.n_touch_queued++;
    pthread_cond_signal(&b->cv);
    return true;
}

blockio_load *blockio_load_start_class(blockio *b, const uint8_t *root, const int32_t *tokens, int n_tokens, int cls)
{
    uint8_t parent[32];
    int ram = kvpool_cached_prefix(b->pool, root, tokens, n_tokens, parent);
    int first = ram / KVPOOL_BLOCK;
    int last = (n_tokens - 1) / KVPOOL_BLOCK;   /* blocks [first, last) leave >= 1 token */
    if (last - first > b->o.max_load_blocks) last = first + b->o.max_load_blocks;
    if (last <= first) return NULL;
    blockio_load *l = xcalloc(1, sizeof *l);
    l->first_block = first;
    l->cls = cls;
    l->n_keys = last - first;
    l->ents = xcalloc((size_t)l->n_keys, sizeof *l->ents);
    uint8_t (*keys)[32] = xmalloc(sizeof(*keys) * (size_t)l->n_keys);
    for (int i = 0; i < l->n_keys; i++)
        kvpool_block_key(b->pool, i ? keys[i - 1] : parent, tokens + (size_t)(first + i) * KVPOOL_BLOCK, keys[i]);
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < l->n_keys; i++) {
        blockio_ent **pp = blockio_ent_slot(b, keys[i]), *e = *pp;
        if (e) {   /* another load reads it, or has it in RAM: share */
            if (e->state != BLOCKIO_ENT_MISS) {
                b->s.n_load_shared++;
                /* its store read refreshes it with the other load's class: this request's
                 * class is applied too, by a touch (an expiry only moves forward, so the
                 * longer of the two holds whatever the order) */
                if (e->cls != cls) blockio_touch_enqueue_locked(b, e->key, cls);
            }
            e->cls = cls;
        } else {
            e = *pp = xcalloc(1, sizeof *e);
            memcpy(e->key, keys[i], 32);
            e->state = BLOCKIO_ENT_QUEUED;
            e->cls = cls;
        }
        e->refcnt++;
        l->ents[i] = e;
    }
    if (b->lq_tail) b->lq_tail->next_load = l; else b->lq_head = l;
    b->lq_tail = l;
    l->queued = true;
    b->s.n_loads++;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    free(keys);
    return l;
}

int blockio_load_first_block(const blockio_load *l) { return l->first_block; }

int blockio_load_end_block(blockio *b, blockio_load *l)
{
    pthread_mutex_lock(&b->mu);
    int end = l->first_block + (l->done ? l->n_ok : 0);
    pthread_mutex_unlock(&b->mu);
    return end;
}

bool blockio_load_ready(blockio *b, blockio_load *l)
{
    pthread_mutex_lock(&b->mu);
    bool done = l->done;
    pthread_mutex_unlock(&b->mu);
    return done;
}

int blockio_load_finish(blockio *b, blockio_load *l, kvpool_seq *seq)
{
    int have = kvpool_seq_n_keyed(seq) / KVPOOL_BLOCK;   /* blocks the sequence holds */
    int added = 0, n_fill = 0;
    /* the loaded run must start at or before the sequence's end (no gap) */
    if (have >= l->first_block && kvpool_seq_capacity(seq) == have * KVPOOL_BLOCK) {
        /* l is done: its entries are OK up to n_ok and immutable. The pool is called without
         * mu (reclaiming a block may wait for fills, blockio_fill_wait) */
        for (int i = have - l->first_block; i < l->n_ok; i++) {
            blockio_ent *e = l->ents[i];
            if (e->mapped) {   /* the pool uses the verified mapping in place: no fill */
                pthread_mutex_lock(&b->mu);
                e->refcnt++;   /* the pool's, until it lets go (blockio_pool_release) */
                pthread_mutex_unlock(&b->mu);
                bool taken = false;
                kvpool_status ks = kvpool_seq_append_external(b->pool, seq, e->key, block_payload(e->file), e, &taken);
                pthread_mutex_lock(&b->mu);
                if (!taken) blockio_ent_unref(b, e);
                if (ks == KVPOOL_OK) {
                    e->used = true;
                    b->s.n_inplace += taken;
                }
                pthread_mutex_unlock(&b->mu);
                if (ks != KVPOOL_OK) break;
                added++;
                continue;
            }
            void *dst;
            if (kvpool_seq_append_fill(b->pool, seq, l->ents[i]->key, &dst) != KVPOOL_OK) break;
            added++;
            pthread_mutex_lock(&b->mu);
            l->ents[i]->used = true;
            if (!dst) {   /* already in the pool: attached */
                pthread_mutex_unlock(&b->mu);
                continue;
            }
            blockio_fill *f = &b->fq[(b->fq_head + b->fq_n++) % b->fq_cap];
            f->dst = dst;
            f->ent = l->ents[i];
            f->ent->refcnt++;
            b->fill_issued++;
            pthread_mutex_unlock(&b->mu);
            n_fill++;
        }
    }
    pthread_mutex_lock(&b->mu);
    b->s.n_appended += (uint64_t)added;
    b->s.n_fills += (uint64_t)n_fill;
    if (n_fill) pthread_cond_broadcast(&b->cv);
    blockio_load_destroy_locked(b, l);
    pthread_mutex_unlock(&b->mu);
    return added * KVPOOL_BLOCK;
}

void blockio_load_free(blockio *b, blockio_load *l)
{
    if (!l) return;
    pthread_mutex_lock(&b->mu);
    /* no entry claimed after this; nobody reading for it: free it here, else the I/O thread
     * that settles it does */
    blockio_lq_unlink(b, l);
    if (l->done || (l->n_reading == 0 && !l->settling)) blockio_load_destroy_locked(b, l);
    else l->abandoned = true;
    pthread_mutex_unlock(&b->mu);
}

void blockio_touch(blockio *b, const kvpool_seq *seq, int n_blocks, int cls)
{
    if (n_blocks <= 0) return;
    double now = store_now(b->st);
    uint64_t skipped = 0;
    pthread_mutex_lock(&b->mu);
    for (int bi = 0; bi < n_blocks; bi++) {
        const uint8_t *key = kvpool_seq_block_key(b->pool, seq, bi);
        if (!key) break;
        uint32_t h;
        memcpy(&h, key + 4, 4);
        blockio_seen *sn = &b->seen[h % BLOCKIO_TOUCH_SEEN];
        if (sn->t > 0 && !memcmp(sn->key, key, 32) && now - sn->t < b->o.touch_every_s && now >= sn->t) {
            skipped++;
            continue;
        }
        if (!blockio_touch_enqueue_locked(b, key, cls)) continue;
        memcpy(sn->key, key, 32);
        sn->t = now;
    }
    b->s.n_touch_skipped += skipped;
    pthread_mutex_unlock(&b->mu);
}
