/*
 * kvpool: the paged KV cache and the in-RAM tier of the prefix cache.
 *
 * DESIGN. One allocation at start holds n_blocks blocks of KVPOOL_BLOCK (128) token
 * positions. A block holds K and V of every layer for its 128 positions, laid out
 * [layer][k|v][kv_head][token][row]: attention for one (layer, kv head) walks one
 * contiguous (128, row) slab of K and one of V. A row is head_dim elements unless the layer
 * has its own K / V widths (opts.layer_width, layer_v_width: Gemma 4's head sizes per layer,
 * DeepSeek V4's packed entries) and a layer may have its own kv head count
 * (opts.layer_kv_heads: Gemma 4's), so a layer's slabs are exactly its own size; kvpool_seq_slab
 * looks the layer's offset and row up, the same two loads whatever the geometry. Elements are F16 (default), F32, or
 * ggml's Q8_0 / Q4_0 blocks (32 values and an f16 scale each: a row is head_dim / 32 blocks,
 * quantised as it is written; a block of 128 positions then takes 34/64 or 18/64 of F16's
 * bytes, and the store and handoffs carry those bytes as they are).
 * A pool for multi-head latent attention (v_is_k) stores each row once: the value is a prefix
 * of the key row (the latent), so a block is [layer][kv_head][token][head_dim] and the V slab
 * of a (layer, kv head) is its K slab: half the memory, and half the bytes a stored or
 * handed-off block carries.
 *
 * A sequence (kvpool_seq) owns a block table: position p lives in table[p / 128] at row
 * p % 128. Blocks are reference-counted: a full block whose 128 tokens are known gets a key,
 * SHA-256(parent key, its 128 token ids as int32 LE, pool fingerprint) where the parent key
 * of the first block is all zeros and the pool fingerprint is SHA-256(model fingerprint, KV
 * dtype); keyed blocks are entered in a hash map. A new sequence whose prompt starts with
 * keyed blocks attaches them (refcount++) and computes only the rest. Like SQLite's pcache1:
 * a block is FREE (on the free list, unkeyed), PINNED (refcount > 0) or CACHED (refcount 0,
 * keyed or a tail (below), on the LRU); CACHED blocks are reclaimed, least recently released
 * first (but for a few tails), only when the free list is empty. Keyed blocks are never written again (they are full and their
 * contents are a function of their key), which is what lets a block loaded from the store use
 * the store's read-only mapping of it as its bytes (kvpool_seq_append_external) instead of its
 * part of the allocation, until the block is reused.
 *
 * Not thread-safe: one engine thread owns the pool; kernel threads only read and write the
 * slabs of blocks the engine thread handed out for the current step. The one exception are
 * blocks filled asynchronously (kvpool_seq_append_fill, the block store's I/O threads): they
 * are keyed at once, the engine waits per layer (kvpool_fill_wait) before attention reads
 * them, and a block whose fill may still run is never reclaimed before every fill is done.
 */
#ifndef TM_KVPOOL_H
#define TM_KVPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "model/quant.h"

#define KVPOOL_BLOCK 128
/* Ring slots per sequence beyond the window (room for a few speculative tokens to roll back). */
#define KVPOOL_RING_SPARE 6

typedef enum {
    KVPOOL_OK = 0,
    KVPOOL_ERR_FULL,   /* no free or reclaimable block: wait for a sequence to end, or preempt */
    KVPOOL_ERR_NOMEM,  /* the pool itself could not be allocated */
    KVPOOL_ERR_ARG,    /* bad options */
} kvpool_status;

typedef struct {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    bool v_is_k;                 /* one row per position serves as K and V (MLA's latent) */
    qtype dtype;                 /* QTYPE_F16, F32, Q8_0 or Q4_0 (kvpool_type_ok) */
    int n_blocks;                /* pool size in blocks */
    uint8_t model_fp[32];        /* model fingerprint (model.h) */
    const int32_t *layer_window; /* (n_layers) sliding window of each layer in positions, 0 =
                                  * full attention, < 0 a layer that keeps nothing here (a
                                  * recurrent layer: its state is the sequence's, below); NULL:
                                  * every layer full. Only read by kvpool_new */
    size_t state_bytes;          /* per sequence: a recurrent model's state (kvpool_seq_state),
                                  * 0: none. A pool with it shares nothing between sequences
                                  * (see kvpool_seq_state) */
    const int32_t *layer_width;  /* (n_layers) each layer's K row in elements (its block slabs' or
                                  * its ring's), 0 or NULL: head_dim; only read by kvpool_new */
    const int32_t *layer_v_width; /* (n_layers) each layer's V row likewise, 0 or NULL: its K
                                  * row's; ignored when v_is_k; only read by kvpool_new */
    const int32_t *layer_kv_heads; /* (n_layers) each layer's kv heads (its slabs per part in a
                                  * block, its ring's heads), 0 or NULL: n_kv_heads (Gemma 4's
                                  * layers differ); only read by kvpool_new */
    bool ring_f32;               /* the window layers' rings (and window states) in F32 whatever
                                  * dtype: DeepSeek V4's rings hold its compressors' running
                                  * projections, which llama.cpp keeps in F32 */
    /* Per-part ring geometry of window layers (the arrays are (n_layers, 2): [2 * layer + kv]),
     * all NULL for the common case: every part window + KVPOOL_RING_SPARE slots, a state of its
     * last `window` rows whole. Only read by kvpool_new. */
    const int32_t *ring_aux_width; /* (n_layers) v_is_k pools only: a second ring row per window
                                  * layer (kv 1: DeepSeek V4's compressor projections) of this many
                                  * elements; 0: none (kv 1 is K, as without it) */
    const int32_t *ring_slots;   /* ring slots of the part (at most window + SPARE; 0: that) */
    const int32_t *state_rows;   /* last positions of the part a window state keeps (0..min(window,
                                  * slots): the rows the next positions read back) */
    const int32_t *state_cols;   /* leading elements of those rows it keeps, 0: the whole row */
    bool state_k_dtype;          /* window states keep K (kv 0) rows in dtype, not the ring's F32
                                  * (the engine rounds them through dtype before use: lossless) */
} kvpool_opts;

typedef struct kvpool kvpool;
typedef struct kvpool_seq kvpool_seq;

typedef struct {
    int n_blocks;                /* total */
    int n_free;                  /* on the free list */
    int n_cached;                /* unreferenced but reusable: keyed, or a tail (LRU) */
    int n_pinned;                /* referenced by at least one sequence */
    uint64_t n_hits;             /* blocks attached from the cache, lifetime */
    uint64_t n_reclaimed;        /* cached blocks evicted to satisfy a reservation */
    uint64_t n_loaded;           /* blocks appended from the block store (filled or external) */
    uint64_t n_tails_kept;       /* blocks kept as tails (kvpool_seq_keep_tail) */
    uint64_t n_tail_rows;        /* rows copied from kept tails (kvpool_seq_copy_tail) */
} kvpool_stats;

/* Whether a pool can hold elements of type t for heads of head_dim: F16 and F32 always, Q8_0
 * and Q4_0 when head_dim is a multiple of their 32-value block. */
bool kvpool_type_ok(qtype t, int head_dim);
/* One row of n floats into t's format (the cache's rounding: ggml's CPU from_float), and back. */
void kvpool_row_put(qtype t, const float *x, void *dst, int n);
void kvpool_row_get(qtype t, const void *src, float *x, int n);

kvpool_status kvpool_new(const kvpool_opts *opts, kvpool **out);
void kvpool_free(kvpool *p);
/* Faults the whole data area in now (writes zeros), before any sequence uses the pool: the
 * first steps, and the fills of blocks loaded from the block store, then write KV into mapped
 * memory instead of paying a page fault (zeroing and accounting) per 4 KiB. Servers call it
 * once at start; the memory is the pool's size either way once it has been used. */
void kvpool_prefault(kvpool *p);
const char *kvpool_status_name(kvpool_status st);
size_t kvpool_block_bytes(const kvpool *p);
/* Bytes of one 128-position block for the given geometry (no pool needed: start-up sizing);
 * 0 when the dtype does not fit the head size (kvpool_type_ok). */
size_t kvpool_geom_block_bytes(const kvpool_opts *opts);
/* Slabs per (layer, kv head) in a block: 2 (K and V) or 1 (v_is_k). */
int kvpool_n_parts(const kvpool *p);
int kvpool_n_layers(const kvpool *p);   /* opts.n_layers */
/* The row geometry the pool was made with: a block's slabs are (128, row) per (layer, part, kv
 * head), a row head_dim elements or the layer's own width (kvpool_layer_width). Not always the
 * model's heads: a DeepSeek V4 pool has one "head" whose block row is its packed compressed
 * entries (engine_dsv4.h); blocks, tails and handoffs take their shape from here. */
int kvpool_n_kv_heads(const kvpool *p);
int kvpool_head_dim(const kvpool *p);
/* Elements of layer `layer`'s K (kv 0) or V row, in its block slabs or its ring (a v_is_k
 * pool's window layer: kv 1 is its aux ring row, or K's without one); 0 for a layer that keeps
 * nothing here. */
int kvpool_layer_width(const kvpool *p, int layer, int kv);
/* Layer `layer`'s kv heads (n_kv_heads or its opts.layer_kv_heads); 0 for a layer that keeps
 * nothing here. */
int kvpool_layer_kv_heads(const kvpool *p, int layer);
/* Whether every block layer's K and V rows have one width (the common case: head_dim; a
 * DeepSeek V4 pool's one entries layer) and n_kv_heads heads, and the widest block row. */
bool kvpool_block_uniform(const kvpool *p);
int kvpool_block_width_max(const kvpool *p);
/* Byte offset in a block of block layer bl's slabs (kvpool_layer_block_index); bl =
 * kvpool_n_block_layers gives kvpool_block_bytes. Layer bl is [offset(bl), offset(bl + 1)). */
size_t kvpool_block_layer_offset(const kvpool *p, int bl);
/* A digest of the block geometry (parts, kv heads, dtype, every block layer's row widths and,
 * with opts.layer_kv_heads, its kv heads): a
 * stored block's header carries it, and a block of another geometry is refused. */
uint32_t kvpool_block_geom(const kvpool *p);
/* Blocks that fit in `bytes` for the given geometry (at least 1). */
int kvpool_blocks_for_bytes(const kvpool_opts *opts, size_t bytes);
void kvpool_get_stats(const kvpool *p, kvpool_stats *st);
qtype kvpool_dtype(const kvpool *p);

/* A new, empty sequence (allocates its handle: not for the hot path). */
kvpool_seq *kvpool_seq_new(kvpool *p);
/* Releases the sequence's blocks (keyed ones go to the LRU, others to the free list) and
 * frees the handle. NULL is ignored. */
void kvpool_seq_free(kvpool *p, kvpool_seq *s);
/* Releases all blocks and makes the sequence empty again (keeps the handle). */
void kvpool_seq_reset(kvpool *p, kvpool_seq *s);

/* On a sequence whose blocks are all keyed (an empty one, or one whose blocks were attached or
 * committed full, none reserved beyond them): attaches the longest run of cached full blocks
 * that continues it over tokens[0..n) (the sequence's own tokens), leaving at least one token
 * to compute (so never all n). Called again later, it attaches what other sequences have
 * completed meanwhile (a prefix computed in flight). Returns the positions the sequence holds
 * now (a multiple of 128); the caller computes tokens from there. A sequence with a block not
 * yet keyed attaches nothing. */
int kvpool_seq_attach_prefix(kvpool *p, kvpool_seq *s, const int32_t *tokens, int n);
/* Whether a block with this key is in the pool (pinned or cached): attaching it costs nothing. */
bool kvpool_key_cached(const kvpool *p, const uint8_t key[32]);
/* Makes positions [0, n_total) writable/readable: allocates blocks as needed, reclaiming
 * cached blocks when the free list is empty. KVPOOL_ERR_FULL (not enough free + cached
 * blocks) changes nothing. */
kvpool_status kvpool_seq_reserve(kvpool *p, kvpool_seq *s, int n_total);
/* After a step wrote positions [0, n_tokens) of the sequence, whose token ids are
 * tokens[0..n_tokens): keys and registers every full block not yet keyed. A block whose key
 * is already registered (another sequence computed the same prefix) stays unkeyed. */
void kvpool_seq_commit_full_blocks(kvpool *p, kvpool_seq *s, const int32_t *tokens, int n_tokens);
/* Positions the sequence can hold now (blocks * 128). */
int kvpool_seq_capacity(const kvpool_seq *s);
/* Positions of leading blocks that were keyed (attached or committed). */
int kvpool_seq_n_keyed(const kvpool_seq *s);
/* Key of the last keyed block (zeros if none). */
const uint8_t *kvpool_seq_last_key(const kvpool_seq *s);

/* Slab of K (kv = 0) or V (kv = 1) for (layer, kv_head) in the sequence's block bi:
 * (128, head_dim) elements of the pool dtype (a row is quant_row_bytes(dtype, head_dim)),
 * row r = position bi*128 + r. bi must be below
 * capacity/128. In a v_is_k pool both are the same slab. NULL for a window layer (its KV is in
 * the sequence's ring). */
void *kvpool_seq_slab(const kvpool *p, const kvpool_seq *s, int bi, int layer, int kv, int kv_head);
/* Copies the full layers' K and V of positions [from, to), all in one block, from src to dst
 * (another sequence holding the same tokens there: a prefix shared below a block boundary).
 * Both must hold those positions (below their capacity), dst's block must be its own (not
 * keyed), src's rows must be written (its fills done). Window layers are not copied. */
void kvpool_seq_copy_rows(const kvpool *p, const kvpool_seq *dst, const kvpool_seq *src, int from, int to);
/* Tails: rows of a sequence's block outlive their sequence as an index entry, so that the
 * next request continuing the same tokens copies them instead of computing them again. An
 * agent's next turn resends its last prompt, which rarely ends on a block boundary: the rows
 * of the block where that prompt ended are valid for it up to the first token that differs,
 * whether the block is the sequence's last, partial one or was filled (and keyed) by the
 * tokens it generated after the prompt, which the next turn may not repeat. keep_tail
 * records block bi of s (rows [bi*128, bi*128 + rows) valid, their token ids `tokens`, after
 * the block chain whose last key, or root, is `parent`) in the tail map under parent, one
 * tail per parent, the newest; call it before kvpool_seq_free or kvpool_seq_reset of s. The
 * block may be keyed (any full block; it stays the cached block it is), or s's own unkeyed
 * partial block (bi == the keyed count), which then stays in the pool as a CACHED block on the
 * LRU instead of going to the free list. Either is reclaimed like any other, and leaves the
 * tail map then, except that reclaim passes over the tails among the few oldest cached blocks
 * when a full one is among them: with the block store on, an evicted full block is loaded back
 * when a request needs it, a tail only computed again, and on a busy pool a tail would go
 * before the agent's next turn arrives (a waiting request pins the tail it will copy:
 * kvpool_tail_pin). No-op on a pool with window layers (their state is in the sequence's ring,
 * not in blocks) or on a block loaded from the store. */
void kvpool_seq_keep_tail(kvpool *p, kvpool_seq *s, int bi, const uint8_t parent[32], const int32_t *tokens, int rows);
/* For s at a block boundary (every block keyed, nothing reserved beyond): the rows of the
 * tail kept after its last block (its last key) that equal tokens[0..lim) (tokens of positions
 * from n_keyed*128 on), when at least min_rows: reserves the next block and copies them into
 * it. Returns the rows copied (0: none; s unchanged). */
int kvpool_seq_copy_tail(kvpool *p, kvpool_seq *s, const int32_t *tokens, int lim, int min_rows);
/* Pins (refcount++) the tail kept after parent when at least min_rows of its rows equal
 * tokens[0..lim), so that it is not reclaimed while the request that will copy them waits for
 * room; returns its block, or -1 (nothing pinned). kvpool_tail_unpin lets go of it (back on
 * the LRU as just used, or free if a newer tail replaced it meanwhile). */
int kvpool_tail_pin(kvpool *p, const uint8_t parent[32], const int32_t *tokens, int lim, int min_rows);
void kvpool_tail_unpin(kvpool *p, int id);
/* Writes K and V (head_dim floats each) of position pos for (layer, kv_head), converted to
 * the pool dtype (a window layer: into its ring slot). pos must be below capacity.
 * Thread-safe for distinct positions. A v_is_k pool stores k only (v is not read; NULL allowed). */
void kvpool_seq_store(const kvpool *p, const kvpool_seq *s, int pos, int layer, int kv_head,
                      const float *k, const float *v);
/* Reads them back as floats (tests, block export); a v_is_k pool gives the K row as v. */
void kvpool_seq_load(const kvpool *p, const kvpool_seq *s, int pos, int layer, int kv_head,
                     float *k, float *v);

/* The key of a block from its parent key and 128 tokens (exposed for tests and the store). */
void kvpool_block_key(const kvpool *p, const uint8_t parent[32], const int32_t *tokens, uint8_t out[32]);
/* ---- block store hooks (src/engine/blockio.h) ---- */
/* Called by kvpool_seq_commit_full_blocks for every block it newly keys (computed by this
 * pool, prefill or decode): block points at its block_bytes bytes, valid only during the call. */
typedef void (*kvpool_keyed_fn)(void *arg, const uint8_t key[32], const void *block, size_t bytes);
void kvpool_set_keyed_hook(kvpool *p, kvpool_keyed_fn fn, void *arg);
/* Length in positions (a multiple of 128, leaving at least one of n to compute) of the run
 * of cached blocks prefixing tokens (chained from root, NULL = zeros), without attaching
 * anything; the key of its last block goes to last_key (the root when none). */
int kvpool_cached_prefix(const kvpool *p, const uint8_t *root, const int32_t *tokens, int n, uint8_t last_key[32]);
/* On an empty sequence: the parent key of its first block (blockkey_root of a tenant salt),
 * instead of zeros, for this sequence's attach and commits. */
void kvpool_seq_set_root(kvpool_seq *s, const uint8_t root[32]);
/* Appending a block loaded from the store to a sequence whose blocks are all keyed (after
 * kvpool_seq_attach_prefix): when its key is already cached the cached block is attached
 * instead; KVPOOL_ERR_FULL when no block is free or reclaimable, KVPOOL_ERR_ARG when the
 * sequence has unkeyed blocks. Two ways:
 *
 * kvpool_seq_append_external, without a copy: the block's bytes are `bytes` (read-only,
 * kvpool_block_bytes long, e.g. a verified store block mapped from its file) until the block is
 * reused for other contents or the pool is freed, when the release hook gets `arg`. *taken
 * says whether the pool now holds arg (false when the key was already cached and that block
 * was attached: the caller keeps it). Nothing ever writes into such a block: it is a full,
 * keyed block, and sequences only write the positions they compute. */
kvpool_status kvpool_seq_append_external(kvpool *p, kvpool_seq *s, const uint8_t key[32], const void *bytes,
                                         void *arg, bool *taken);
typedef void (*kvpool_release_fn)(void *hook_arg, void *arg);
void kvpool_set_release_hook(kvpool *p, kvpool_release_fn fn, void *arg);
/* Copies every external block's bytes into the pool's own memory and lets go of them (the
 * owner of the release hook is about to go away). */
void kvpool_internalise_all(kvpool *p);

/* kvpool_seq_append_fill: the caller fills the block itself, asynchronously: *dst
 * gets the new block's kvpool_block_bytes bytes to write (NULL when the key was already cached
 * and that block was attached). The block is keyed at once (a hit for others); nothing reads
 * its layer l before kvpool_fill_wait(p, l) has returned, and the block is not reused before
 * kvpool_fill_wait(p, -1): the fill hook must cover every block handed out this way. */
kvpool_status kvpool_seq_append_fill(kvpool *p, kvpool_seq *s, const uint8_t key[32], void **dst);
/* Waits until layer `layer` (every layer when < 0) of every block handed out by
 * kvpool_seq_append_fill so far is written (the engine calls it before attention reads a
 * layer). Returns at once when no fill is pending. */
typedef void (*kvpool_fill_wait_fn)(void *arg, int layer);
void kvpool_set_fill_hook(kvpool *p, kvpool_fill_wait_fn fn, void *arg);
void kvpool_fill_wait(kvpool *p, int layer);
/* Key of the sequence's block bi (NULL unless bi < kvpool_seq_n_keyed / 128). */
const uint8_t *kvpool_seq_block_key(const kvpool *p, const kvpool_seq *s, int bi);

/* ---- window layers ----
 * Layers with a sliding window keep no KV in blocks: a block holds only the full layers (in
 * layer order; kvpool_layer_block_index), so blocks, their keys' payload and the block store
 * hold full layers only. Each sequence has a ring of window + KVPOOL_RING_SPARE slots per window
 * layer (position p at slot p % ring_len): memory per sequence bounded by the window, not the
 * context. A layer's parts may have fewer slots (opts.ring_slots: what the next positions read
 * back), and a v_is_k pool's window layers a second ring row (opts.ring_aux_width). The engine writes the ring after attention (it reads a step's own keys from its
 * staging rows), so the ring needs no room for a whole prefill chunk.
 *
 * In a v_is_k pool a ring keeps one part (K is V). With opts.ring_f32 the rings and window
 * states are F32 whatever the blocks' dtype (DeepSeek V4: its ring rows also hold compressor
 * projections, and its blocks hold no rows at all but packed compressed entries).
 *
 * A sequence that attaches a prefix of P positions from blocks has the full layers' KV but not
 * the window layers' state: either kvpool_seq_window_restore copies the state at P (the window
 * cache), or kvpool_seq_window_replay says from where to recompute; positions below
 * kvpool_seq_full_from are then computed for the window layers only (the full layers' KV is
 * in the blocks already and is never written again). */
/* A full layer's index within a block (>= 0), or -1 - its index among the window layers. */
int kvpool_layer_block_index(const kvpool *p, int layer);
int kvpool_n_block_layers(const kvpool *p);
int kvpool_n_window_layers(const kvpool *p);
int kvpool_window(const kvpool *p);                 /* the largest window, 0 if none */
size_t kvpool_ring_bytes(const kvpool *p);          /* ring bytes per sequence */
qtype kvpool_ring_dtype(const kvpool *p);           /* the rings' elements: dtype, or F32 (ring_f32) */
/* Ring slots of window layer `layer`'s part kv (0 for other layers). */
int kvpool_ring_slots(const kvpool *p, int layer, int kv);
/* A window state is its own compact layout, not a copy of the ring: a 16-byte header (magic,
 * version, geometry digest, bytes; u32 LE) then per window layer and kept part
 * (its kv heads, state rows, state cols) elements of the part's state type (opts.state_rows,
 * state_cols, state_k_dtype; by default (its kv heads, window, width) in the ring dtype). A state
 * of another geometry (another pool, an older layout) is refused on restore, never misread. */
size_t kvpool_window_state_bytes(const kvpool *p);
uint32_t kvpool_window_state_geom(const kvpool *p);
/* Writes dst's header (engines that capture states themselves; kvpool_seq_window_save does). */
void kvpool_window_state_init(const kvpool *p, void *dst);
/* Whether src (bytes long) is a window state of this pool's geometry. */
bool kvpool_window_state_ok(const kvpool *p, const void *src, size_t bytes);
typedef struct {
    int n_rows;                  /* last positions kept (the oldest first) */
    int n_cols;                  /* leading elements of each row */
    qtype type;                  /* their type */
    size_t row_bytes;            /* one row's bytes */
} kvpool_wstate_part;
/* Where (layer, kv, kv_head)'s rows lie in a state, and their shape in *part (NULL: not
 * wanted). A part the pool does not keep (V of a v_is_k layer without an aux ring) has 0 rows. */
void *kvpool_window_state_rows(const kvpool *p, void *state, int layer, int kv, int kv_head, kvpool_wstate_part *part);
/* Positions to recompute before P so that the window layers' state at P is exactly that of
 * the full computation: window + (n_window_layers - 1) * (window - 1). */
int kvpool_window_exact_span(const kvpool *p);
/* Row (head_dim elements, or the layer's opts.layer_width, of the ring dtype) of window layer
 * `layer`'s ring for position pos (in a v_is_k pool kv 1 is K again, or the aux ring's row). */
void *kvpool_seq_ring_row(const kvpool *p, const kvpool_seq *s, int layer, int kv, int kv_head, int pos);
int kvpool_seq_win_lo(const kvpool_seq *s);         /* window layers see no key below it */
int kvpool_seq_full_from(const kvpool_seq *s);      /* full layers' KV below it is in blocks */
int kvpool_seq_exact_from(const kvpool_seq *s);     /* window state exact at positions >= it */
/* Window layers' positions below it have been written (the engine advances it): a step may
 * go back at most KVPOOL_RING_SPARE positions from it (a rejected draft); further back the
 * ring no longer holds what it needs (reset the sequence, or restore / replay). */
int kvpool_seq_ring_next(const kvpool_seq *s);
void kvpool_seq_set_ring_next(kvpool_seq *s, int pos);
/* The window state at end (each part's last state rows before end, which the ring must hold)
 * into dst (kvpool_window_state_bytes, header included). */
void kvpool_seq_window_save(const kvpool *p, const kvpool_seq *s, int end, void *dst);
/* Puts a saved state at end (src, bytes long) into the ring: the sequence continues at end
 * exactly as if it had computed every position (end: its attached positions). false, the
 * sequence unchanged: not a state of this pool's geometry (kvpool_window_state_ok). */
bool kvpool_seq_window_restore(const kvpool *p, kvpool_seq *s, int end, const void *src, size_t bytes);
/* No saved state at end: returns the position to recompute from (window layers only up to
 * end; window attention sees no key below it). exact: far enough back (the exact span) that
 * the state at end is the full computation's; else only the last block (DeepSeek's bounded
 * replay: an approximation whose cost does not grow with depth), or the exact span when that
 * is shorter. States the sequence crosses before it is exact again are not captured. */
int kvpool_seq_window_replay(const kvpool *p, kvpool_seq *s, int end, bool exact);

/* ---- recurrent state ----
 * A model with recurrent layers (Qwen3.5's linear attention) keeps, per sequence, a state of
 * opts.state_bytes that the engine reads and writes in place: zeroed by kvpool_seq_new and
 * kvpool_seq_reset (a sequence computed from position 0). Blocks hold the full layers only and
 * are keyed, attached, stored and loaded as any, but a block's KV alone does not continue such
 * a sequence: whoever attaches blocks up to P must also put the state at P into the sequence
 * (kvpool_seq_state; the scheduler keeps them in the window cache), or the engine refuses the
 * step (it continues a sequence only where its state ends). Tails are neither kept nor
 * copied: no state is captured inside a block. */
void *kvpool_seq_state(const kvpool *p, const kvpool_seq *s);   /* NULL: no state */
size_t kvpool_state_bytes(const kvpool *p);

/* Debug/test: block id at table index bi, and the refcount of a block id. */
int kvpool_seq_block_id(const kvpool_seq *s, int bi);
int kvpool_block_refcount(const kvpool *p, int block_id);

#endif
