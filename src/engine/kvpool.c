/*
 * kvpool: paged KV blocks with refcounts, a key -> block hash map and an LRU of unreferenced
 * keyed blocks. See kvpool.h for the design. Bookkeeping per block lives in a separate array
 * (kvpool_blk) so the data area is one aligned allocation of n_blocks * block_bytes.
 *
 * Lists and keys: a slottab (util/slottab.h) over the block ids keeps the free list, the hash
 * map and the LRU (its recency list: the most recently released block newest, the victim
 * oldest). A PINNED block is on no list; a CACHED one is keyed or a kept tail, and on the LRU.
 * Tails (partial blocks kept after their request) are found by their parent's key through a
 * second slottab used as a hash map only.
 */
#include "engine/kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "cache/block.h"
#include "cache/blockkey.h"

#include "model/ops.h"
#include "util/slottab.h"
#include "util/util.h"

_Static_assert(KVPOOL_BLOCK == BLOCKKEY_TOKENS, "kvpool blocks are store blocks");

/* Tails among the oldest cached blocks that reclaim passes over for a full block (a bound:
 * tails of conversations that never come back end up the oldest ones and go then). */
#define KVPOOL_TAIL_SPARE 8

typedef enum { KVPOOL_BLK_FREE = 0, KVPOOL_BLK_PINNED, KVPOOL_BLK_CACHED } kvpool_blk_state;

typedef struct {
    int32_t refcnt;              /* sequences using the block */
    uint8_t state;               /* kvpool_blk_state */
    bool filling;                /* handed out by kvpool_seq_append_fill, fill maybe pending */
    int16_t tail_rows;           /* a kept tail (keyed in tails by its parent): its leading rows
                                  * that are valid, 1..128; 0: not a tail */
    const uint8_t *ext;          /* the block's bytes when they live outside data (a mapped
                                  * store block, read-only), else NULL */
    void *ext_arg;               /* handed to the release hook when ext is let go */
} kvpool_blk;

struct kvpool {
    kvpool_opts o;
    int n_parts;                 /* slabs per (layer, kv head): 2 (K, V) or 1 (v_is_k) */
    int32_t *bw;                 /* (n_blk_layers, 2) a block layer's K and V row in elements (V = K
                                  * in a v_is_k pool) */
    size_t *brow;                /* (n_blk_layers, 2) those rows' bytes in dtype */
    int32_t *lkv;                /* (n_layers) each layer's kv heads: n_kv_heads, or its
                                  * opts.layer_kv_heads (0 for a layer that keeps nothing) */
    int32_t *bkv;                /* (n_blk_layers) a block layer's kv heads (its slabs per part) */
    size_t *boff;                /* (n_blk_layers + 1, 2) byte offset in a block of a block layer's
                                  * K slabs, then its V slabs; boff[2 * n_blk_layers] = block_bytes */
    bool uniform;                /* every block layer's K and V rows are one width (bw[0]) and
                                  * every block layer has n_kv_heads */
    uint32_t geom;               /* digest of the block geometry (kvpool_block_geom) */
    size_t block_bytes;          /* sum over block layers: n_parts * its kv heads * 128 * its row bytes */
    uint8_t *data;               /* (n_blocks, block_bytes), 64-byte aligned */
    kvpool_blk *blk;             /* (n_blocks) */
    slottab tab;                 /* block ids: SHA-256 block keys, the free list, the LRU */
    slottab tails;               /* block ids of kept tails keyed by their parent: the key of the
                                  * block before them in their sequence (its hash map only) */
    uint8_t pool_fp[32];         /* SHA-256(model fp, dtype) */
    kvpool_stats st;
    kvpool_keyed_fn keyed_fn;    /* block store write-behind hook, or NULL */
    void *keyed_arg;
    kvpool_fill_wait_fn fill_fn; /* waits for asynchronous fills (blockio), or NULL */
    void *fill_arg;
    int32_t *filling;            /* (n_filling) ids of blocks whose fill may be pending */
    int n_filling;
    kvpool_release_fn release_fn; /* lets go of a block's external bytes (blockio), or NULL */
    void *release_arg;
    int32_t *tail_tok;           /* (n_blocks, 128) a kept tail's token ids, row r = position r
                                  * of its block (allocated with the pool: tails are kept on
                                  * the step path, which allocates nothing) */
    int32_t *slot;               /* (n_layers) a full layer's index in a block (>= 0), or a
                                  * window layer's in the ring as -1 - index */
    int n_blk_layers;            /* full layers: the layers a block holds */
    int n_win_layers;            /* window layers: the layers the rings hold */
    int window;                  /* positions a window layer's query sees (the largest window) */
    qtype ring_type;             /* the rings' element type: dtype, or F32 (opts.ring_f32) */
    int32_t *ring_w;             /* (n_win_layers, 2) elements of a window layer's K and V ring row:
                                  * head_dim, or its opts.layer_width / layer_v_width / ring_aux_width */
    int32_t *ring_n;             /* (n_win_layers, 2) ring slots of that part: window + SPARE, or
                                  * its opts.ring_slots */
    size_t *ring_row;            /* (n_win_layers, 2) those rows' bytes in ring_type */
    size_t *ring_off;            /* (n_win_layers, 2) byte offset of a window layer's K ring, V ring
                                  * (a part the pool does not keep: its K ring's) */
    bool *ring_has;              /* (n_win_layers, 2) the part has its own ring */
    int32_t *ring_kv;            /* (n_win_layers) a window layer's kv heads */
    size_t ring_bytes;           /* sum over window layers and parts: its kv heads * its slots * its
                                  * ring row's bytes in ring_type */
    int32_t *st_n;               /* (n_win_layers, 2) last positions of the part a window state keeps */
    int32_t *st_w;               /* (n_win_layers, 2) leading elements of those rows it keeps */
    size_t *st_row;              /* (n_win_layers, 2) a state row's bytes in its st_type */
    size_t *st_off;              /* (n_win_layers, 2) byte offset of the part's rows in a state */
    qtype st_type[2];            /* a state's K (kv 0) and V rows' type: ring_type, or dtype for K
                                  * (opts.state_k_dtype) */
    size_t st_bytes;             /* a window state: KVPOOL_WSTATE_HDR + every part's rows */
    uint32_t st_geom;            /* digest of the state geometry (its header carries it) */
};

/* A window state's header: magic, version, geometry digest, bytes (u32 LE each). */
#define KVPOOL_WSTATE_HDR 16
#define KVPOOL_WSTATE_MAGIC 0x53574d54u   /* "TMWS" */
#define KVPOOL_WSTATE_VERSION 2u

struct kvpool_seq {
    int32_t *table;              /* (n_blocks max) block ids */
    int n;                       /* blocks in the table */
    int n_keyed;                 /* leading blocks whose key is known */
    uint8_t last_key[32];        /* key of block n_keyed-1, zeros if none */
    uint8_t *ring;               /* per window layer and kept part (its kv heads, its slots, its
                                  * width): position p at slot p % slots; NULL if none */
    int win_lo;                  /* window layers see no key below this position */
    int full_from;               /* full layers' KV below this position is already in the blocks */
    int exact_from;              /* window state at positions >= this equals a run without cache */
    int ring_next;               /* window layers' positions below it are written; the ring holds
                                  * the last `slots` of them per part */
    uint8_t *state;              /* (state_bytes) a recurrent model's state, or NULL */
};

const char *kvpool_status_name(kvpool_status st)
{
    switch (st) {
    case KVPOOL_OK: return "ok";
    case KVPOOL_ERR_FULL: return "kv cache full";
    case KVPOOL_ERR_NOMEM: return "out of memory";
    case KVPOOL_ERR_ARG: return "bad argument";
    }
    return "?";
}

static int kvpool_geom_blk_layers(const kvpool_opts *o)
{
    int n = 0;
    for (int l = 0; l < o->n_layers; l++) n += !o->layer_window || o->layer_window[l] == 0;
    return n;
}

bool kvpool_type_ok(qtype t, int head_dim)
{
    switch (t) {
    case QTYPE_F32:
    case QTYPE_F16: return head_dim > 0;
    case QTYPE_Q8_0:
    case QTYPE_Q4_0: return head_dim > 0 && head_dim % QK8_0 == 0;
    default: return false;
    }
}

/* Elements of layer l's K (kv 0) or V row under o: its layer_width / layer_v_width, else
 * head_dim (a v_is_k pool's V is its K). */
static int kvpool_geom_width(const kvpool_opts *o, int l, int kv)
{
    int w = o->layer_width && o->layer_width[l] > 0 ? o->layer_width[l] : o->head_dim;
    if (kv && !o->v_is_k && o->layer_v_width && o->layer_v_width[l] > 0) w = o->layer_v_width[l];
    return w;
}

/* Layer l's kv heads under o: its layer_kv_heads, else n_kv_heads. */
static int kvpool_geom_kv_heads(const kvpool_opts *o, int l)
{
    return o->layer_kv_heads && o->layer_kv_heads[l] > 0 ? o->layer_kv_heads[l] : o->n_kv_heads;
}

size_t kvpool_geom_block_bytes(const kvpool_opts *o)
{
    size_t n = 0;
    if (!kvpool_type_ok(o->dtype, o->head_dim)) return 0;
    for (int l = 0; l < o->n_layers; l++) {
        if (o->layer_window && o->layer_window[l] != 0) continue;
        for (int kv = 0; kv < (o->v_is_k ? 1 : 2); kv++) {
            int w = kvpool_geom_width(o, l, kv);
            if (!kvpool_type_ok(o->dtype, w)) return 0;
            n += (size_t)kvpool_geom_kv_heads(o, l) * KVPOOL_BLOCK * quant_row_bytes(o->dtype, w);
        }
    }
    return n;
}

int kvpool_blocks_for_bytes(const kvpool_opts *o, size_t bytes)
{
    size_t bb = kvpool_geom_block_bytes(o);
    size_t n = bb ? bytes / bb : 1;
    if (n < 1) n = 1;
    if (n > (1u << 30)) n = 1u << 30;
    return (int)n;
}

kvpool_status kvpool_new(const kvpool_opts *opts, kvpool **out)
{
    *out = NULL;
    if (opts->n_layers <= 0 || opts->n_kv_heads <= 0 || opts->head_dim <= 0 || opts->n_blocks <= 0 ||
        !kvpool_type_ok(opts->dtype, opts->head_dim) || kvpool_geom_blk_layers(opts) == 0)
        return KVPOOL_ERR_ARG;
    kvpool *p = xcalloc(1, sizeof *p);
    p->o = *opts;
    p->o.layer_window = NULL;    /* the caller's arrays need not outlive the call: slot, bw and
                                  * ring_w say it all */
    p->n_parts = opts->v_is_k ? 1 : 2;
    p->slot = xmalloc((size_t)opts->n_layers * sizeof *p->slot);
    for (int l = 0; l < opts->n_layers; l++) {
        int w = opts->layer_window ? opts->layer_window[l] : 0;
        if (w > 0) {
            p->slot[l] = -1 - p->n_win_layers++;
            p->window = TM_MAX(p->window, w);
        } else if (w < 0) {
            p->slot[l] = INT32_MIN;   /* a recurrent layer: nothing here */
        } else {
            p->slot[l] = p->n_blk_layers++;
        }
    }
    /* a sequence never holds more positions than the pool: a wider window (an odd GGUF) needs
     * no wider ring */
    p->window = (int)TM_MIN((int64_t)p->window, (int64_t)opts->n_blocks * KVPOOL_BLOCK);
    p->ring_type = opts->ring_f32 ? QTYPE_F32 : opts->dtype;
    const size_t nw2 = 2 * (size_t)p->n_win_layers + 1;
    p->ring_w = xcalloc(nw2, sizeof *p->ring_w);
    p->ring_n = xcalloc(nw2, sizeof *p->ring_n);
    p->ring_row = xcalloc(nw2, sizeof *p->ring_row);
    p->ring_off = xcalloc(nw2, sizeof *p->ring_off);
    p->ring_has = xcalloc(nw2, sizeof *p->ring_has);
    p->st_n = xcalloc(nw2, sizeof *p->st_n);
    p->st_w = xcalloc(nw2, sizeof *p->st_w);
    p->st_row = xcalloc(nw2, sizeof *p->st_row);
    p->st_off = xcalloc(nw2, sizeof *p->st_off);
    p->st_type[0] = opts->state_k_dtype ? opts->dtype : p->ring_type;
    p->st_type[1] = p->ring_type;
    p->st_bytes = p->n_win_layers ? KVPOOL_WSTATE_HDR : 0;
    uint32_t *sgeom = xmalloc((6 + 9 * (size_t)opts->n_layers) * sizeof *sgeom);
    int n_sgeom = 0;
    sgeom[n_sgeom++] = KVPOOL_WSTATE_VERSION;
    sgeom[n_sgeom++] = (uint32_t)opts->n_kv_heads;
    sgeom[n_sgeom++] = (uint32_t)p->n_win_layers;
    sgeom[n_sgeom++] = (uint32_t)p->st_type[0];
    sgeom[n_sgeom++] = (uint32_t)p->st_type[1];
    if ((opts->ring_aux_width && !opts->v_is_k) ||
        (p->st_type[0] != p->ring_type && p->ring_type != QTYPE_F32)) {   /* conversions are from F32 rings */
        free(sgeom);
        kvpool_free(p);
        return KVPOOL_ERR_ARG;
    }
    p->bw = xcalloc(2 * (size_t)p->n_blk_layers, sizeof *p->bw);
    p->brow = xcalloc(2 * (size_t)p->n_blk_layers, sizeof *p->brow);
    p->boff = xcalloc(2 * (size_t)p->n_blk_layers + 1, sizeof *p->boff);
    p->lkv = xcalloc((size_t)opts->n_layers, sizeof *p->lkv);
    p->bkv = xcalloc((size_t)p->n_blk_layers + 1, sizeof *p->bkv);
    p->ring_kv = xcalloc((size_t)p->n_win_layers + 1, sizeof *p->ring_kv);
    p->uniform = true;
    /* the geometry digest: what a stored block's header must match to be read into this pool */
    uint32_t *geom = xmalloc((4 + 3 * (size_t)opts->n_layers) * sizeof *geom);
    int n_geom = 0;
    geom[n_geom++] = (uint32_t)p->n_parts;
    geom[n_geom++] = (uint32_t)opts->n_kv_heads;
    geom[n_geom++] = (uint32_t)opts->dtype;
    geom[n_geom++] = (uint32_t)p->n_blk_layers;
    for (int l = 0; l < opts->n_layers; l++) {
        if (p->slot[l] == INT32_MIN) continue;
        const bool win = p->slot[l] < 0;
        const int i = 2 * (win ? -1 - p->slot[l] : p->slot[l]);
        const qtype t = win ? p->ring_type : opts->dtype;
        const int nkv = kvpool_geom_kv_heads(opts, l);
        p->lkv[l] = nkv;
        if (win) {
            p->ring_kv[i / 2] = nkv;
            if (opts->layer_kv_heads) sgeom[n_sgeom++] = (uint32_t)nkv;
        } else {
            p->bkv[i / 2] = nkv;
            p->uniform &= nkv == opts->n_kv_heads;
            /* only a pool with per-layer kv heads digests them: the others' digests stay */
            if (opts->layer_kv_heads) geom[n_geom++] = (uint32_t)nkv;
        }
        for (int kv = 0; kv < 2; kv++) {
            const bool aux = win && kv && opts->ring_aux_width && opts->ring_aux_width[l] > 0;
            int w = aux ? opts->ring_aux_width[l] : kvpool_geom_width(opts, l, kv);
            bool has = kv < p->n_parts || aux;
            if (!kvpool_type_ok(t, w)) {
                free(geom);
                free(sgeom);
                kvpool_free(p);
                return KVPOOL_ERR_ARG;
            }
            size_t rb = quant_row_bytes(t, w), part = has ? (size_t)nkv * rb : 0;
            if (win) {
                const int j = 2 * l + kv, full = p->window + KVPOOL_RING_SPARE;
                int n = opts->ring_slots && opts->ring_slots[j] > 0 ? TM_MIN(opts->ring_slots[j], full) : full;
                int sn = opts->state_rows ? opts->state_rows[j] : p->window;
                int sw = opts->state_cols && opts->state_cols[j] > 0 ? opts->state_cols[j] : w;
                qtype st = p->st_type[kv];
                /* a state's rows must be in the ring when it is saved and restored */
                if (sn < 0 || sn > TM_MIN(n, p->window) || sw > w || (sn && !kvpool_type_ok(st, sw))) {
                    free(geom);
                    free(sgeom);
                    kvpool_free(p);
                    return KVPOOL_ERR_ARG;
                }
                if (!has) n = p->ring_n[i], sn = 0, sw = p->st_w[i];
                p->ring_w[i + kv] = w;
                p->ring_n[i + kv] = n;
                p->ring_row[i + kv] = rb;
                p->ring_has[i + kv] = has;
                p->ring_off[i + kv] = has ? p->ring_bytes : p->ring_off[i];
                p->ring_bytes += part * (size_t)n;
                p->st_n[i + kv] = sn;
                p->st_w[i + kv] = sw;
                p->st_row[i + kv] = quant_row_bytes(st, sw);
                p->st_off[i + kv] = p->st_bytes;
                p->st_bytes += (size_t)nkv * (size_t)sn * p->st_row[i + kv];
                sgeom[n_sgeom++] = (uint32_t)has;
                sgeom[n_sgeom++] = (uint32_t)w;
                sgeom[n_sgeom++] = (uint32_t)sn;
                sgeom[n_sgeom++] = (uint32_t)sw;
            } else {
                p->bw[i + kv] = w;
                p->brow[i + kv] = rb;
                p->boff[i + kv] = kv < p->n_parts ? p->block_bytes : p->boff[i];
                p->block_bytes += part * KVPOOL_BLOCK;
                if (kv < p->n_parts) p->uniform &= w == p->bw[0];
                if (kv < p->n_parts) geom[n_geom++] = (uint32_t)w;
            }
        }
    }
    p->boff[2 * p->n_blk_layers] = p->block_bytes;
    p->geom = block_crc32c(geom, (size_t)n_geom * sizeof geom[0]);
    free(geom);
    p->st_geom = block_crc32c(sgeom, (size_t)n_sgeom * sizeof sgeom[0]);
    free(sgeom);
    p->o.ring_aux_width = p->o.ring_slots = p->o.state_rows = p->o.state_cols = NULL;
    p->o.layer_width = p->o.layer_v_width = p->o.layer_kv_heads = NULL;
    size_t total = p->block_bytes * (size_t)opts->n_blocks;
    if (p->block_bytes != kvpool_geom_block_bytes(opts) || total / (size_t)opts->n_blocks != p->block_bytes) {
        kvpool_free(p);   /* half-built: slot is allocated already */
        return KVPOOL_ERR_NOMEM;
    }
    p->data = util_aligned_alloc(total);
    p->blk = calloc((size_t)opts->n_blocks, sizeof *p->blk);
    p->filling = malloc((size_t)opts->n_blocks * sizeof *p->filling);
    p->tail_tok = malloc((size_t)opts->n_blocks * KVPOOL_BLOCK * sizeof *p->tail_tok);
    if (!p->data || !p->blk || !p->filling || !p->tail_tok || !slottab_init(&p->tab, opts->n_blocks) ||
        !slottab_init(&p->tails, opts->n_blocks)) {
        kvpool_free(p);
        return KVPOOL_ERR_NOMEM;
    }
    p->st.n_blocks = p->st.n_free = opts->n_blocks;

    blockkey_pool_fp(opts->model_fp, (int32_t)opts->dtype, p->pool_fp);
    *out = p;
    return KVPOOL_OK;
}

void kvpool_prefault(kvpool *p)
{
    memset(p->data, 0, p->block_bytes * (size_t)p->o.n_blocks);
}

/* The block's bytes: its external ones (kvpool_seq_append_external) or its part of data. */
static inline uint8_t *kvpool_blk_bytes(const kvpool *p, int id)
{
    return p->blk[id].ext ? (uint8_t *)p->blk[id].ext : p->data + (size_t)id * p->block_bytes;
}

/* Lets go of block id's external bytes, first copying them into its own part of data when
 * `keep` (the block stays valid); no-op for an ordinary block. */
static void kvpool_blk_internalise(kvpool *p, int id, bool keep)
{
    kvpool_blk *b = &p->blk[id];
    if (!b->ext) return;
    if (keep) memcpy(p->data + (size_t)id * p->block_bytes, b->ext, p->block_bytes);
    b->ext = NULL;
    if (p->release_fn) p->release_fn(p->release_arg, b->ext_arg);
    b->ext_arg = NULL;
}

void kvpool_set_release_hook(kvpool *p, kvpool_release_fn fn, void *arg)
{
    p->release_fn = fn;
    p->release_arg = arg;
}

void kvpool_internalise_all(kvpool *p)
{
    for (int id = 0; id < p->o.n_blocks; id++) kvpool_blk_internalise(p, id, true);
}

void kvpool_free(kvpool *p)
{
    if (!p) return;
    if (p->blk)
        for (int id = 0; id < p->o.n_blocks; id++) kvpool_blk_internalise(p, id, false);
    free(p->data);
    free(p->blk);
    slottab_free(&p->tab);
    slottab_free(&p->tails);
    free(p->filling);
    free(p->tail_tok);
    free(p->slot);
    free(p->ring_w);
    free(p->ring_n);
    free(p->ring_row);
    free(p->ring_off);
    free(p->ring_has);
    free(p->st_n);
    free(p->st_w);
    free(p->st_row);
    free(p->st_off);
    free(p->ring_kv);
    free(p->lkv);
    free(p->bkv);
    free(p->bw);
    free(p->brow);
    free(p->boff);
    free(p);
}

size_t kvpool_block_bytes(const kvpool *p) { return p->block_bytes; }
int kvpool_n_parts(const kvpool *p) { return p->n_parts; }
int kvpool_n_layers(const kvpool *p) { return p->o.n_layers; }
int kvpool_n_kv_heads(const kvpool *p) { return p->o.n_kv_heads; }
int kvpool_head_dim(const kvpool *p) { return p->o.head_dim; }
bool kvpool_block_uniform(const kvpool *p) { return p->uniform; }
uint32_t kvpool_block_geom(const kvpool *p) { return p->geom; }
size_t kvpool_block_layer_offset(const kvpool *p, int bl) { return p->boff[2 * bl]; }

int kvpool_layer_width(const kvpool *p, int layer, int kv)
{
    int sl = p->slot[layer];
    if (sl == INT32_MIN) return 0;
    if (sl < 0) return p->ring_w[2 * (-1 - sl) + kv];   /* V is K, unless an aux ring */
    if (p->n_parts == 1) kv = 0;
    return p->bw[2 * sl + kv];
}

int kvpool_layer_kv_heads(const kvpool *p, int layer) { return p->lkv[layer]; }

int kvpool_block_width_max(const kvpool *p)
{
    int w = 0;
    for (int i = 0; i < 2 * p->n_blk_layers; i++) w = TM_MAX(w, p->bw[i]);
    return w;
}
qtype kvpool_dtype(const kvpool *p) { return p->o.dtype; }
void kvpool_get_stats(const kvpool *p, kvpool_stats *st) { *st = p->st; }

void kvpool_block_key(const kvpool *p, const uint8_t parent[32], const int32_t *tokens, uint8_t out[32])
{
    blockkey_compute(parent, tokens, p->pool_fp, out);
}

/* Takes a referenced block: CACHED -> PINNED, or refcount++ on a PINNED one. */
static void kvpool_ref(kvpool *p, int id)
{
    kvpool_blk *b = &p->blk[id];
    if (b->state == KVPOOL_BLK_CACHED) {
        slottab_unlink(&p->tab, id);
        b->state = KVPOOL_BLK_PINNED;
        p->st.n_cached--;
        p->st.n_pinned++;
    }
    b->refcnt++;
}

/* Puts unreferenced, unkeyed block id on the free list. */
static void kvpool_free_push(kvpool *p, int id)
{
    p->blk[id].state = KVPOOL_BLK_FREE;
    slottab_give(&p->tab, id);
    p->st.n_free++;
}

static void kvpool_unref(kvpool *p, int id)
{
    kvpool_blk *b = &p->blk[id];
    if (--b->refcnt > 0) return;
    p->st.n_pinned--;
    if (slottab_keyed(&p->tab, id) || b->tail_rows) {   /* reusable: the prefix tier */
        b->state = KVPOOL_BLK_CACHED;
        slottab_touch(&p->tab, id);
        p->st.n_cached++;
    } else {
        kvpool_free_push(p, id);
    }
}

/* Takes block id out of the tail map (no-op when it is not a tail). */
static void kvpool_tail_remove(kvpool *p, int id)
{
    kvpool_blk *b = &p->blk[id];
    if (!b->tail_rows) return;
    slottab_clear_key(&p->tails, id);
    b->tail_rows = 0;
}

/* The cached block to reclaim: the least recently released one, but passing over the tails
 * among the KVPOOL_TAIL_SPARE oldest (see kvpool.h: a full block usually comes back from the
 * block store, a tail only by computing it again); -1 when none is cached. */
static int kvpool_lru_victim(const kvpool *p)
{
    int k = 0;
    int oldest = slottab_oldest(&p->tab);
    for (int id = oldest; id >= 0 && k < KVPOOL_TAIL_SPARE; id = slottab_newer(&p->tab, id), k++)
        if (!p->blk[id].tail_rows) return id;
    return oldest;
}

/* A fresh PINNED block with refcount 1: from the free list, else the LRU victim. */
static int kvpool_take(kvpool *p)
{
    int id = slottab_take(&p->tab);
    if (id >= 0) {
        p->st.n_free--;
    } else if ((id = kvpool_lru_victim(p)) >= 0) {
        if (p->blk[id].filling) kvpool_fill_wait(p, -1);   /* never reuse a block being filled */
        slottab_unlink(&p->tab, id);
        slottab_clear_key(&p->tab, id);
        kvpool_tail_remove(p, id);
        p->st.n_cached--;
        p->st.n_reclaimed++;
    } else {
        return -1;
    }
    kvpool_blk_internalise(p, id, false);   /* new contents: let go of old external bytes */
    kvpool_blk *b = &p->blk[id];
    b->state = KVPOOL_BLK_PINNED;
    b->refcnt = 1;
    p->st.n_pinned++;
    return id;
}

kvpool_seq *kvpool_seq_new(kvpool *p)
{
    kvpool_seq *s = xcalloc(1, sizeof *s);
    s->table = xmalloc((size_t)p->o.n_blocks * sizeof *s->table);
    if (p->ring_bytes) s->ring = xcalloc(1, p->ring_bytes);   /* never garbage, even if misused */
    if (p->o.state_bytes) s->state = xcalloc(1, p->o.state_bytes);
    return s;
}

void kvpool_seq_reset(kvpool *p, kvpool_seq *s)
{
    for (int i = s->n - 1; i >= 0; i--) kvpool_unref(p, s->table[i]);
    s->n = 0;
    s->n_keyed = 0;
    s->win_lo = s->full_from = s->exact_from = s->ring_next = 0;
    memset(s->last_key, 0, sizeof s->last_key);
    if (s->state) memset(s->state, 0, p->o.state_bytes);
}

void kvpool_seq_free(kvpool *p, kvpool_seq *s)
{
    if (!s) return;
    kvpool_seq_reset(p, s);
    free(s->ring);
    free(s->state);
    free(s->table);
    free(s);
}

int kvpool_seq_attach_prefix(kvpool *p, kvpool_seq *s, const int32_t *tokens, int n)
{
    if (s->n != s->n_keyed) return s->n_keyed * KVPOOL_BLOCK;   /* a block being written ends the chain */
    uint8_t key[32];
    while ((s->n + 1) * KVPOOL_BLOCK < n) {  /* strictly less: keep >= 1 token to compute */
        kvpool_block_key(p, s->last_key, tokens + (size_t)s->n * KVPOOL_BLOCK, key);
        int id = slottab_find(&p->tab, key);
        if (id < 0) break;
        kvpool_ref(p, id);
        s->table[s->n++] = id;
        s->n_keyed = s->n;
        memcpy(s->last_key, key, 32);
        p->st.n_hits++;
    }
    return s->n * KVPOOL_BLOCK;
}

bool kvpool_key_cached(const kvpool *p, const uint8_t key[32]) { return slottab_find(&p->tab, key) >= 0; }

kvpool_status kvpool_seq_reserve(kvpool *p, kvpool_seq *s, int n_total)
{
    if (n_total < 0) return KVPOOL_ERR_ARG;
    int need = (n_total + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK - s->n;
    if (need <= 0) return KVPOOL_OK;
    if (need > p->st.n_free + p->st.n_cached || s->n + need > p->o.n_blocks) return KVPOOL_ERR_FULL;
    while (need-- > 0) s->table[s->n++] = kvpool_take(p);
    return KVPOOL_OK;
}

void kvpool_seq_commit_full_blocks(kvpool *p, kvpool_seq *s, const int32_t *tokens, int n_tokens)
{
    uint8_t key[32];
    while (s->n_keyed < s->n && (s->n_keyed + 1) * KVPOOL_BLOCK <= n_tokens) {
        int bi = s->n_keyed;
        kvpool_block_key(p, s->last_key, tokens + (size_t)bi * KVPOOL_BLOCK, key);
        int id = s->table[bi];
        if (!slottab_keyed(&p->tab, id) && slottab_find(&p->tab, key) < 0) {
            slottab_set_key(&p->tab, id, key);
            if (p->keyed_fn) p->keyed_fn(p->keyed_arg, key, kvpool_blk_bytes(p, id), p->block_bytes);
        }
        memcpy(s->last_key, key, 32);
        s->n_keyed++;
    }
}

void kvpool_set_keyed_hook(kvpool *p, kvpool_keyed_fn fn, void *arg)
{
    p->keyed_fn = fn;
    p->keyed_arg = arg;
}

void kvpool_seq_set_root(kvpool_seq *s, const uint8_t root[32])
{
    if (s->n == 0) memcpy(s->last_key, root, 32);
}

int kvpool_cached_prefix(const kvpool *p, const uint8_t *root, const int32_t *tokens, int n, uint8_t last_key[32])
{
    uint8_t parent[32] = { 0 }, key[32];
    if (root) memcpy(parent, root, 32);
    int nb = 0;
    while ((nb + 1) * KVPOOL_BLOCK < n) {   /* keep >= 1 token to compute, as attach does */
        kvpool_block_key(p, parent, tokens + (size_t)nb * KVPOOL_BLOCK, key);
        if (slottab_find(&p->tab, key) < 0) break;
        memcpy(parent, key, 32);
        nb++;
    }
    memcpy(last_key, parent, 32);
    return nb * KVPOOL_BLOCK;
}

/* Appends the block with this key to a sequence whose blocks are all keyed: the cached one
 * (refcount++), else a fresh one keyed at once (*fresh: the caller supplies its bytes before
 * anything reads them). Returns its id, or -1 with *st set. */
static int kvpool_seq_append_keyed(kvpool *p, kvpool_seq *s, const uint8_t key[32], bool *fresh, kvpool_status *st)
{
    *fresh = false;
    *st = KVPOOL_OK;
    if (s->n_keyed != s->n || s->n >= p->o.n_blocks) {
        *st = KVPOOL_ERR_ARG;
        return -1;
    }
    int id = slottab_find(&p->tab, key);
    if (id >= 0) {
        kvpool_ref(p, id);
    } else {
        id = kvpool_take(p);
        if (id < 0) {
            *st = KVPOOL_ERR_FULL;
            return -1;
        }
        slottab_set_key(&p->tab, id, key);
        p->st.n_loaded++;
        *fresh = true;
    }
    s->table[s->n++] = id;
    s->n_keyed = s->n;
    memcpy(s->last_key, key, 32);
    return id;
}

kvpool_status kvpool_seq_append_fill(kvpool *p, kvpool_seq *s, const uint8_t key[32], void **dst)
{
    *dst = NULL;
    bool fresh;
    kvpool_status st;
    int id = kvpool_seq_append_keyed(p, s, key, &fresh, &st);
    if (fresh) {
        p->blk[id].filling = true;
        p->filling[p->n_filling++] = id;
        *dst = p->data + (size_t)id * p->block_bytes;
    }
    return st;
}

kvpool_status kvpool_seq_append_external(kvpool *p, kvpool_seq *s, const uint8_t key[32], const void *bytes,
                                         void *arg, bool *taken)
{
    kvpool_status st;
    int id = kvpool_seq_append_keyed(p, s, key, taken, &st);
    if (*taken) {
        p->blk[id].ext = bytes;
        p->blk[id].ext_arg = arg;
    }
    return st;
}

void kvpool_set_fill_hook(kvpool *p, kvpool_fill_wait_fn fn, void *arg)
{
    p->fill_fn = fn;
    p->fill_arg = arg;
}

void kvpool_fill_wait(kvpool *p, int layer)
{
    if (!p->n_filling) return;
    if (p->fill_fn) p->fill_fn(p->fill_arg, layer);
    if (layer < 0 || layer >= p->n_blk_layers - 1) {   /* fills copy layers in order: all done */
        for (int i = 0; i < p->n_filling; i++) p->blk[p->filling[i]].filling = false;
        p->n_filling = 0;
    }
}

const uint8_t *kvpool_seq_block_key(const kvpool *p, const kvpool_seq *s, int bi)
{
    return bi >= 0 && bi < s->n_keyed ? slottab_get_key(&p->tab, s->table[bi]) : NULL;
}

int kvpool_seq_capacity(const kvpool_seq *s) { return s->n * KVPOOL_BLOCK; }
int kvpool_seq_n_keyed(const kvpool_seq *s) { return s->n_keyed * KVPOOL_BLOCK; }
const uint8_t *kvpool_seq_last_key(const kvpool_seq *s) { return s->last_key; }
int kvpool_seq_block_id(const kvpool_seq *s, int bi) { return bi >= 0 && bi < s->n ? s->table[bi] : -1; }
int kvpool_block_refcount(const kvpool *p, int id) { return p->blk[id].refcnt; }

void *kvpool_seq_slab(const kvpool *p, const kvpool_seq *s, int bi, int layer, int kv, int kv_head)
{
    int bl = p->slot[layer];
    if (bl < 0) return NULL;   /* a window layer: its KV is in the ring */
    size_t i = 2 * (size_t)bl + (size_t)(p->n_parts == 1 ? 0 : kv);   /* V is K in a v_is_k pool */
    return kvpool_blk_bytes(p, s->table[bi]) + p->boff[i] + (size_t)kv_head * KVPOOL_BLOCK * p->brow[i];
}

/* Copies rows [from, to) (positions within a block, 0..128) of every full layer's slabs from
 * block src to block dst (distinct). */
static void kvpool_blk_copy_rows(const kvpool *p, int dst, int src, int from, int to)
{
    uint8_t *d = kvpool_blk_bytes(p, dst);
    const uint8_t *sb = kvpool_blk_bytes(p, src);
    for (int bl = 0; bl < p->n_blk_layers; bl++)
        for (int kv = 0; kv < p->n_parts; kv++) {
            const size_t row = p->brow[2 * bl + kv], slab = KVPOOL_BLOCK * row;
            const size_t base = p->boff[2 * bl + kv] + (size_t)from * row, n = (size_t)(to - from) * row;
            for (int h = 0; h < p->bkv[bl]; h++)
                memcpy(d + base + (size_t)h * slab, sb + base + (size_t)h * slab, n);
        }
}

void kvpool_seq_copy_rows(const kvpool *p, const kvpool_seq *dst, const kvpool_seq *src, int from, int to)
{
    if (from >= to) return;
    int bi = from / KVPOOL_BLOCK;
    kvpool_blk_copy_rows(p, dst->table[bi], src->table[bi], from % KVPOOL_BLOCK, from % KVPOOL_BLOCK + (to - from));
}

/* The tail kept after parent, or -1. */
static int kvpool_tail_lookup(const kvpool *p, const uint8_t parent[32])
{
    return slottab_find(&p->tails, parent);
}

/* Forgets tail id; an unkeyed one no sequence holds goes to the free list. */
static void kvpool_tail_drop(kvpool *p, int id)
{
    kvpool_blk *b = &p->blk[id];
    kvpool_tail_remove(p, id);
    if (slottab_keyed(&p->tab, id) || b->state != KVPOOL_BLK_CACHED) return;   /* still cached, or its unref frees it */
    p->st.n_cached--;
    kvpool_free_push(p, id);
}

void kvpool_seq_keep_tail(kvpool *p, kvpool_seq *s, int bi, const uint8_t parent[32], const int32_t *tokens, int rows)
{
    if (p->n_win_layers || p->o.state_bytes || bi < 0 || bi >= s->n || rows <= 0 || rows > KVPOOL_BLOCK) return;
    int id = s->table[bi];
    kvpool_blk *b = &p->blk[id];
    if (b->ext || b->filling) return;   /* a loaded block: its rows are the store's */
    if (!slottab_keyed(&p->tab, id) && b->refcnt != 1) return;   /* not its own block */
    if (b->tail_rows && !memcmp(slottab_get_key(&p->tails, id), parent, 32) && b->tail_rows >= rows)
        return;   /* kept already */
    int old = kvpool_tail_lookup(p, parent);
    if (old >= 0 && old != id) kvpool_tail_drop(p, old);   /* the newest tail after a prefix wins */
    kvpool_tail_remove(p, id);
    slottab_set_key(&p->tails, id, parent);
    b->tail_rows = (int16_t)rows;
    memcpy(p->tail_tok + (size_t)id * KVPOOL_BLOCK, tokens, (size_t)rows * sizeof *tokens);
    p->st.n_tails_kept++;
}

/* The tail kept after parent and the rows of it that equal tokens[0..lim) (*n), or -1 when
 * none, or fewer than min_rows of them. */
static int kvpool_tail_match(const kvpool *p, const uint8_t parent[32], const int32_t *tokens, int lim, int min_rows,
                             int *n_out)
{
    if (lim < min_rows || lim < 1) return -1;
    int id = kvpool_tail_lookup(p, parent);
    if (id < 0) return -1;
    const int32_t *tt = p->tail_tok + (size_t)id * KVPOOL_BLOCK;
    int n = 0, m = TM_MIN(lim, (int)p->blk[id].tail_rows);
    while (n < m && tt[n] == tokens[n]) n++;
    if (n < min_rows || n < 1) return -1;
    *n_out = n;
    return id;
}

int kvpool_tail_pin(kvpool *p, const uint8_t parent[32], const int32_t *tokens, int lim, int min_rows)
{
    int n, id = kvpool_tail_match(p, parent, tokens, lim, min_rows, &n);
    if (id >= 0) kvpool_ref(p, id);
    return id;
}

void kvpool_tail_unpin(kvpool *p, int id) { kvpool_unref(p, id); }

int kvpool_seq_copy_tail(kvpool *p, kvpool_seq *s, const int32_t *tokens, int lim, int min_rows)
{
    if (s->n != s->n_keyed || p->o.state_bytes) return 0;
    int n, id = kvpool_tail_match(p, s->last_key, tokens, lim, min_rows, &n);
    if (id < 0) return 0;
    kvpool_ref(p, id);   /* not the block the reservation reclaims */
    int base = s->n * KVPOOL_BLOCK;
    bool ok = kvpool_seq_reserve(p, s, base + n) == KVPOOL_OK;
    if (ok) kvpool_blk_copy_rows(p, s->table[s->n_keyed], id, 0, n);
    kvpool_unref(p, id);   /* back to the LRU, as just used */
    if (!ok) return 0;
    p->st.n_tail_rows += (uint64_t)n;
    return n;
}

void *kvpool_seq_ring_row(const kvpool *p, const kvpool_seq *s, int layer, int kv, int kv_head, int pos)
{
    size_t i = 2 * (size_t)(-1 - p->slot[layer]) + (size_t)kv;   /* a part not kept aliases K */
    size_t n = (size_t)p->ring_n[i], row = (size_t)kv_head * n + (size_t)pos % n;
    return s->ring + p->ring_off[i] + row * p->ring_row[i];
}

/* Row of position pos of (layer, kv, kv_head): in its block, or a window layer's ring slot. */
static uint8_t *kvpool_seq_row(const kvpool *p, const kvpool_seq *s, int pos, int layer, int kv, int kv_head)
{
    if (p->n_parts == 1) kv = 0;   /* V is K (an aux ring is reached by kvpool_seq_ring_row only) */
    if (p->slot[layer] < 0) return kvpool_seq_ring_row(p, s, layer, kv, kv_head, pos);
    size_t off = (size_t)(pos % KVPOOL_BLOCK) * p->brow[2 * p->slot[layer] + (p->n_parts == 1 ? 0 : kv)];
    return (uint8_t *)kvpool_seq_slab(p, s, pos / KVPOOL_BLOCK, layer, kv, kv_head) + off;
}

void kvpool_row_put(qtype t, const float *x, void *dst, int n)
{
    switch (t) {
    case QTYPE_F16: ops_fp32_to_fp16_row(x, dst, n); break;
    case QTYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); break;
    /* what ggml's CPU backend writes into a quantised cache (its from_float): Q8_0 with the
     * activation quantiser's rounding, Q4_0 with the reference one */
    case QTYPE_Q8_0: quant_act_q8_0(x, dst, n); break;
    default: quant_quantize_row(t, x, dst, n); break;
    }
}

void kvpool_row_get(qtype t, const void *src, float *x, int n)
{
    if (t == QTYPE_F16) ops_fp16_to_fp32_row(src, x, n);
    else quant_dequantize_row(t, src, x, n);
}

void kvpool_seq_store(const kvpool *p, const kvpool_seq *s, int pos, int layer, int kv_head,
                      const float *k, const float *v)
{
    qtype t = p->slot[layer] < 0 ? p->ring_type : p->o.dtype;
    uint8_t *kr = kvpool_seq_row(p, s, pos, layer, 0, kv_head), *vr = kvpool_seq_row(p, s, pos, layer, 1, kv_head);
    kvpool_row_put(t, k, kr, kvpool_layer_width(p, layer, 0));
    if (vr != kr) kvpool_row_put(t, v, vr, kvpool_layer_width(p, layer, 1));   /* two parts: widths of each */
}

void kvpool_seq_load(const kvpool *p, const kvpool_seq *s, int pos, int layer, int kv_head,
                     float *k, float *v)
{
    qtype t = p->slot[layer] < 0 ? p->ring_type : p->o.dtype;
    const uint8_t *kr = kvpool_seq_row(p, s, pos, layer, 0, kv_head), *vr = kvpool_seq_row(p, s, pos, layer, 1, kv_head);
    kvpool_row_get(t, kr, k, kvpool_layer_width(p, layer, 0));
    kvpool_row_get(t, vr, v, kvpool_layer_width(p, layer, p->n_parts == 1 ? 0 : 1));
}

/* ---- window layers ---- */
int kvpool_layer_block_index(const kvpool *p, int layer) { return p->slot[layer]; }
void *kvpool_seq_state(const kvpool *p, const kvpool_seq *s) { return s->state; }
size_t kvpool_state_bytes(const kvpool *p) { return p->o.state_bytes; }
int kvpool_n_block_layers(const kvpool *p) { return p->n_blk_layers; }
int kvpool_n_window_layers(const kvpool *p) { return p->n_win_layers; }
int kvpool_window(const kvpool *p) { return p->window; }
size_t kvpool_ring_bytes(const kvpool *p) { return p->ring_bytes; }
qtype kvpool_ring_dtype(const kvpool *p) { return p->ring_type; }
size_t kvpool_window_state_bytes(const kvpool *p) { return p->st_bytes; }
uint32_t kvpool_window_state_geom(const kvpool *p) { return p->st_geom; }

int kvpool_ring_slots(const kvpool *p, int layer, int kv)
{
    const int sl = p->slot[layer];
    return sl < 0 && sl != INT32_MIN ? p->ring_n[2 * (-1 - sl) + kv] : 0;
}

static void kvpool_put_u32(uint8_t *d, uint32_t v)
{
    for (int i = 0; i < 4; i++) d[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t kvpool_get_u32(const uint8_t *d)
{
    return (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
}

void kvpool_window_state_init(const kvpool *p, void *dst)
{
    uint8_t *h = dst;
    kvpool_put_u32(h, KVPOOL_WSTATE_MAGIC);
    kvpool_put_u32(h + 4, KVPOOL_WSTATE_VERSION);
    kvpool_put_u32(h + 8, p->st_geom);
    kvpool_put_u32(h + 12, (uint32_t)p->st_bytes);
}

bool kvpool_window_state_ok(const kvpool *p, const void *src, size_t bytes)
{
    const uint8_t *h = src;
    return p->st_bytes && bytes == p->st_bytes && kvpool_get_u32(h) == KVPOOL_WSTATE_MAGIC &&
           kvpool_get_u32(h + 4) == KVPOOL_WSTATE_VERSION && kvpool_get_u32(h + 8) == p->st_geom &&
           kvpool_get_u32(h + 12) == (uint32_t)p->st_bytes;
}

void *kvpool_window_state_rows(const kvpool *p, void *state, int layer, int kv, int kv_head, kvpool_wstate_part *part)
{
    const size_t j = 2 * (size_t)(-1 - p->slot[layer]) + (size_t)kv;
    if (part) *part = (kvpool_wstate_part){ p->st_n[j], p->st_w[j], p->st_type[kv], p->st_row[j] };
    return (uint8_t *)state + p->st_off[j] + (size_t)kv_head * (size_t)p->st_n[j] * p->st_row[j];
}

int kvpool_window_exact_span(const kvpool *p)
{
    return p->n_win_layers ? p->window + (p->n_win_layers - 1) * (p->window - 1) : 0;
}

int kvpool_seq_win_lo(const kvpool_seq *s) { return s->win_lo; }
int kvpool_seq_full_from(const kvpool_seq *s) { return s->full_from; }
int kvpool_seq_exact_from(const kvpool_seq *s) { return s->exact_from; }
int kvpool_seq_ring_next(const kvpool_seq *s) { return s->ring_next; }
void kvpool_seq_set_ring_next(kvpool_seq *s, int pos) { s->ring_next = pos; }

/* Each kept part's last st_n rows before end, in the ring or in the state's order (header, then
 * per window layer and part (its kv heads, st_n, st_w elements of st_type)): one memcpy per
 * (layer, part, head) and ring wrap where the state row is the ring row's prefix in its type,
 * else row by row through F32 (an F32 ring row's leading st_w elements rounded to st_type, which
 * the engine has made lossless). to_ring copies the state into the ring, else the ring into it. */
static void kvpool_seq_window_copy(const kvpool *p, kvpool_seq *s, int end, uint8_t *buf, bool to_ring)
{
    for (int j = 0; j < 2 * p->n_win_layers; j++) {
        if (!p->ring_has[j] || !p->st_n[j]) continue;
        const int R = p->ring_n[j], W = p->st_n[j];
        const size_t row = p->ring_row[j], srow = p->st_row[j];
        const qtype st = p->st_type[j % 2];
        for (int i = 0; i < p->ring_kv[j / 2]; i++) {
            uint8_t *ring = s->ring + p->ring_off[j] + (size_t)i * R * row;
            uint8_t *state = buf + p->st_off[j] + (size_t)i * W * srow;
            for (int k = 0; k < W;) {
                int pos = end - W + k, slot = pos % R, run = TM_MIN(W - k, R - slot);
                for (int u = 0; u < run; u++) {
                    uint8_t *rr = ring + (size_t)(slot + u) * row, *sr = state + (size_t)(k + u) * srow;
                    if (st == p->ring_type) {
                        if (to_ring) memcpy(rr, sr, srow);
                        else memcpy(sr, rr, srow);
                    } else if (to_ring) {
                        kvpool_row_get(st, sr, (float *)rr, p->st_w[j]);
                    } else {
                        kvpool_row_put(st, (const float *)rr, sr, p->st_w[j]);
                    }
                }
                k += run;
            }
        }
    }
}

void kvpool_seq_window_save(const kvpool *p, const kvpool_seq *s, int end, void *dst)
{
    kvpool_window_state_init(p, dst);
    kvpool_seq_window_copy(p, (kvpool_seq *)s, end, dst, false);
}

bool kvpool_seq_window_restore(const kvpool *p, kvpool_seq *s, int end, const void *src, size_t bytes)
{
    if (!kvpool_window_state_ok(p, src, bytes)) return false;
    kvpool_seq_window_copy(p, s, end, (uint8_t *)src, true);
    s->win_lo = end - p->window;
    s->full_from = end;
    s->exact_from = 0;
    s->ring_next = end;
    return true;
}

int kvpool_seq_window_replay(const kvpool *p, kvpool_seq *s, int end, bool exact)
{
    /* bounded: the last block, or less when the exact span is shorter (then exact too) */
    int span = kvpool_window_exact_span(p);
    int from = end - (exact ? span : TM_MIN(span, KVPOOL_BLOCK));
    from = TM_MAX(0, from);
    s->win_lo = from;
    s->full_from = end;
    s->ring_next = from;
    /* computing from `from` with nothing below it: the state equals the full computation's
     * once every window layer's dependencies lie above it (the exact span) */
    s->exact_from = from > 0 ? from + kvpool_window_exact_span(p) : 0;
    return from;
}
