/*
 * blockio: write-behind and loads between the KV pool and the block store (design in
 * blockio.h).
 */
#include "engine/blockio.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/block.h"
#include "cache/blockkey.h"
#include "util/util.h"

struct blockio_load {
    uint8_t (*keys)[32];     /* (n_keys) keys of blocks first_block.. */
    int first_block;         /* block index of keys[0] in the request */
    int n_keys;
    int cls;                 /* traffic class the hits are refreshed with (store_class) */
    void **files;            /* (n_keys) loaded block files, NULL past n_ok */
    int n_ok;                /* leading blocks loaded */
    bool done;               /* the I/O thread finished (under mu) */
    bool abandoned;          /* the owner let go: the I/O thread frees it (under mu) */
    blockio_load *next;      /* load queue link */
};

struct blockio {
    store *st;
    kvpool *pool;
    blockio_opts o;
    block_header proto;      /* header fields shared by every block (key set per block) */
    size_t block_bytes;      /* kvpool_block_bytes */
    size_t file_bytes;       /* BLOCK_HEADER_BYTES + block_bytes */
    pthread_t *th;           /* (n_threads) */
    int n_started;
    pthread_mutex_t mu;      /* guards everything below */
    pthread_cond_t cv;       /* work or stop */
    bool stop;
    uint8_t **slot;          /* (n_write_slots) block-file buffers */
    uint8_t (*slot_key)[32]; /* (n_write_slots) */
    int *slot_cls;           /* (n_write_slots) traffic class of the queued block */
    int write_cls;           /* class of the blocks the hook gets next (engine thread only) */
    int *free_slots;         /* (n_write_slots) stack */
    int n_free;
    int *wq;                 /* (n_write_slots) FIFO of queued slots */
    int wq_head, wq_n;
    blockio_load *lq_head, *lq_tail;
    blockio_stats s;
};

static void blockio_load_destroy(blockio_load *l)
{
    if (!l) return;
    for (int i = 0; i < l->n_keys; i++) free(l->files[i]);
    free(l->files);
    free(l->keys);
    free(l);
}

static void blockio_do_load(blockio *b, blockio_load *l)
{
    int n_ok = 0;
    for (int i = 0; i < l->n_keys; i++) {
        void *f;
        size_t n;
        if (store_get(b->st, l->keys[i], l->cls, &f, &n) != STORE_OK) break;
        block_header h;
        if (block_parse_header(f, n, &h) != BLOCK_OK || h.payload_bytes != b->block_bytes ||
            memcmp(h.fp, b->proto.fp, 32)) {
            free(f);   /* same key, other geometry: cannot happen unless keys collide */
            break;
        }
        l->files[i] = f;
        n_ok++;
    }
    pthread_mutex_lock(&b->mu);
    l->n_ok = n_ok;
    b->s.n_load_blocks += (uint64_t)n_ok;
    l->done = true;
    bool free_it = l->abandoned;
    if (free_it) b->s.n_load_wasted += (uint64_t)n_ok;
    pthread_mutex_unlock(&b->mu);
    if (free_it) blockio_load_destroy(l);
}

static void *blockio_thread(void *arg)
{
    blockio *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stop && !b->lq_head && !b->wq_n) pthread_cond_wait(&b->cv, &b->mu);
        if (b->lq_head) {
            blockio_load *l = b->lq_head;
            b->lq_head = l->next;
            if (!b->lq_head) b->lq_tail = NULL;
            pthread_mutex_unlock(&b->mu);
            blockio_do_load(b, l);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (b->wq_n) {
            int si = b->wq[b->wq_head];
            b->wq_head = (b->wq_head + 1) % b->o.n_write_slots;
            b->wq_n--;
            pthread_mutex_unlock(&b->mu);
            block_header h = b->proto;
            memcpy(h.key, b->slot_key[si], 32);
            block_seal(&h, b->slot[si]);
            store_status st = store_put(b->st, h.key, b->slot[si], b->file_bytes, b->slot_cls[si]);
            pthread_mutex_lock(&b->mu);
            if (st == STORE_OK) b->s.n_written++;
            else b->s.n_write_failed++;
            b->free_slots[b->n_free++] = si;
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

blockio *blockio_new(store *st, kvpool *pool, const model *m, const blockio_opts *opts)
{
    blockio *b = xcalloc(1, sizeof *b);
    b->st = st;
    b->pool = pool;
    if (opts) b->o = *opts;
    if (b->o.n_threads <= 0) b->o.n_threads = 2;
    if (b->o.n_write_slots <= 0) b->o.n_write_slots = 8;
    if (b->o.max_load_blocks <= 0) b->o.max_load_blocks = 256;
    qtype dt = kvpool_dtype(pool);
    int esz = dt == QTYPE_F32 ? 4 : 2;
    uint8_t fp[32], zero[32] = { 0 };
    blockkey_pool_fp(m->fingerprint, (int32_t)dt, fp);
    block_header_init(&b->proto, zero, fp, (uint32_t)dt, esz, m->hp.n_layers, m->hp.n_kv_heads, m->hp.head_dim);
    b->block_bytes = kvpool_block_bytes(pool);
    if (b->proto.payload_bytes != b->block_bytes) {
        log_error("blockio: KV pool blocks (%zu bytes) do not match the model geometry (%llu bytes)", b->block_bytes,
                  (unsigned long long)b->proto.payload_bytes);
        free(b);
        return NULL;
    }
    b->file_bytes = BLOCK_HEADER_BYTES + b->block_bytes;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
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
    b->th = xcalloc((size_t)b->o.n_threads, sizeof *b->th);
    for (int i = 0; i < b->o.n_threads; i++)
        if (!pthread_create(&b->th[i], NULL, blockio_thread, b)) b->n_started++;
    if (!b->n_started || !b->n_free) {
        log_error("blockio: cannot start I/O threads or buffers; running without the block store");
        blockio_free(b);
        return NULL;
    }
    kvpool_set_keyed_hook(pool, blockio_keyed, b);
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
    /* loads still queued (their owners abandoned them) */
    for (blockio_load *l = b->lq_head, *next; l; l = next) {
        next = l->next;
        blockio_load_destroy(l);
    }
    for (int i = 0; i < b->o.n_write_slots; i++) free(b->slot[i]);
    free(b->slot);
    free(b->slot_key);
    free(b->slot_cls);
    free(b->free_slots);
    free(b->wq);
    free(b->th);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

void blockio_get_stats(blockio *b, blockio_stats *st)
{
    pthread_mutex_lock(&b->mu);
    *st = b->s;
    pthread_mutex_unlock(&b->mu);
}

void blockio_set_write_class(blockio *b, int cls) { b->write_cls = cls; }

blockio_load *blockio_load_start(blockio *b, const uint8_t *root, const int32_t *tokens, int n_tokens)
{
    return blockio_load_start_class(b, root, tokens, n_tokens, b->o.cls);
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
    l->keys = xmalloc(sizeof(*l->keys) * (size_t)l->n_keys);
    l->files = xcalloc((size_t)l->n_keys, sizeof(void *));
    for (int i = 0; i < l->n_keys; i++) {
        kvpool_block_key(b->pool, i ? l->keys[i - 1] : parent, tokens + (size_t)(first + i) * KVPOOL_BLOCK, l->keys[i]);
    }
    pthread_mutex_lock(&b->mu);
    if (b->lq_tail) b->lq_tail->next = l; else b->lq_head = l;
    b->lq_tail = l;
    b->s.n_loads++;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return l;
}

int blockio_load_first_block(const blockio_load *l) { return l->first_block; }

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
    int added = 0;
    /* the loaded run must start at or before the sequence's end (no gap) */
    if (have >= l->first_block && kvpool_seq_capacity(seq) == have * KVPOOL_BLOCK) {
        for (int i = have - l->first_block; i < l->n_ok; i++) {
            if (kvpool_seq_append_loaded(b->pool, seq, l->keys[i], block_payload(l->files[i])) != KVPOOL_OK) break;
            added++;
        }
    }
    pthread_mutex_lock(&b->mu);
    b->s.n_appended += (uint64_t)added;
    b->s.n_load_wasted += (uint64_t)(l->n_ok - added);
    pthread_mutex_unlock(&b->mu);
    blockio_load_destroy(l);
    return added * KVPOOL_BLOCK;
}

void blockio_load_free(blockio *b, blockio_load *l)
{
    if (!l) return;
    pthread_mutex_lock(&b->mu);
    bool done = l->done;
    bool queued = false;
    if (!done) {
        /* still queued: unlink it here; being loaded: the I/O thread frees it */
        for (blockio_load **pp = &b->lq_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next)
            if (*pp == l) {
                *pp = l->next;
                if (b->lq_tail == l) b->lq_tail = prev;
                queued = true;
                break;
            }
        if (!queued) l->abandoned = true;
    } else {
        b->s.n_load_wasted += (uint64_t)l->n_ok;
    }
    pthread_mutex_unlock(&b->mu);
    if (done || queued) blockio_load_destroy(l);
}
