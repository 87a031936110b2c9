/*
 * engine_dsv4: DeepSeek V4's forward step (model_dsv4.h) over the paged KV pool, for
 * engine.c: engine_new makes one for a `deepseek4` model and engine_step hands it the batch.
 *
 * The state of a sequence is kept in two places (docs/deepseek4.md, "Per-sequence state and
 * the 128-token block"). The blocks hold only what is final for the whole text: each compressed
 * layer's completed entries and the lightning indexer's, packed (engine_dsv4_sizes.block values
 * per 128 positions, in the pool's dtype: F16, F32 or Q8_0). Every model layer is a kvpool window
 * layer (window max(swa, 128)) with two F32 rings of their own lengths: the raw K=V rows
 * (swa + spare positions), which the window attention reads, and the compressor's and indexer's
 * projections (kv and gate score with the learned position; the positions a compression reads
 * back + spare), which a compression reads. Because every ratio divides 128 no group is open at
 * a block end, so the window state at a multiple of 128 (the last swa raw rows, in the blocks'
 * type, and the ratio-4 overlap carry) plus the blocks is the whole state there: the window
 * cache keeps it, and without it the scheduler replays (bounded or exact) as for gpt-oss's
 * window layers.
 *
 * A model without compressed layers (a DSpark drafter's layers) keeps its raw rows in blocks
 * instead (F32), one row per position and layer, which its injected context needs.
 */
#ifndef TM_ENGINE_DSV4_H
#define TM_ENGINE_DSV4_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kvpool.h"
#include "model/model.h"
#include "util/threadpool.h"

typedef struct engine_dsv4 engine_dsv4;

/* Layers of a V4 model's pool: the model's (window layers) and, with compressed layers, the
 * block layers that hold the packed entries after them. */
int engine_dsv4_pool_layers(const model *m);
/* The pool geometry of a V4 model in element type t (F16, F32 or Q8_0; F32 without compressed
 * layers): one "head" of engine_dsv4_row(m) elements, v_is_k; each window layer's ring row as
 * the raw K=V row (kv 0, swa + spare slots) and its projections of its ratio in an aux ring
 * (kv 1, the slots a compression reads back), the entries' block layer's row
 * engine_dsv4_sizes.slab_width; a window state keeps the last swa raw rows in t and the ratio-4
 * carry in F32. layer_window (room for ENGINE_DSV4_GEOM_ROOM * engine_dsv4_pool_layers values)
 * gets the windows, then the other per-layer arrays; the result points into it. */
#define ENGINE_DSV4_GEOM_ROOM 9
kvpool_opts engine_dsv4_kv_geometry(const model *m, qtype t, int32_t *layer_window);
/* The pool's row width: the widest ring row (raw + projections), rounded up to 16. */
int engine_dsv4_row(const model *m);

/* The compressed layout's sizes (docs/deepseek4.md, "Per-sequence state and the 128-token
 * block"): what V4 keeps for the whole text per 128-token block, and what a sequence needs
 * besides, in the window; and what the pool takes for them (the packed entries are one block
 * layer of (128, slab_width): the block's values to under 128, or to a whole Q8_0 block of 32
 * per row; the rings as counted in `ring`, projection rows rounded up to 16).
 * Counts are values; the *_bytes fields are them in the shape's element type. */
typedef struct {
    int n_layers;
    const int32_t *ratio;    /* (n_layers) compression ratio of each layer: 0, 4 or 128 */
    int head_dim;            /* hd: K = V, and a compressed entry's width */
    int idx_dim;             /* the lightning indexer's key size (ratio-4 layers) */
    int swa;                 /* sliding window in positions */
    qtype type;              /* the blocks' element type (F32, F16 or Q8_0; 0 is F32): Q8_0 needs
                              * hd and idx_dim in whole 32-value blocks and rows of them */
} engine_dsv4_shape;

typedef struct {
    int64_t block;           /* values per 128-token block, final for the whole text: per ratio-4
                              * layer 32 entries of hd and 32 indexer entries of idx_dim, per
                              * ratio-128 layer one entry of hd, nothing on ratio 0 */
    int64_t window;          /* the window state at a multiple of 128: every layer's raw K=V rows
                              * of the last swa positions */
    int64_t carry;           /* beside it, the ratio-4 compressors' overlap carry there: the
                              * previous group's 4 rows, first halves of kv and score, of the
                              * compressor (hd) and the indexer (idx_dim); no ratio-128 group is
                              * open at a multiple of 128 */
    int64_t ring;            /* per sequence at any position: raw rows of swa + KVPOOL_RING_SPARE
                              * positions per layer, the ratio-4 projections (kv, score, both
                              * halves) of 8 + spare positions, the ratio-128 ones of 128 + spare */
    int width;               /* the pool's row width (engine_dsv4_row) */
    int n_slabs;             /* block layers: 1 holding a block's packed entries; without
                              * compressed layers every layer's raw rows */
    int slab_width;          /* a block layer's row in values: ceil(block / 128), or width */
    int64_t pool_block;      /* values per block in the pool: n_slabs * 128 * slab_width */
    int64_t pool_ring;       /* values of the pool's rings per sequence: ring, with each projection
                              * row rounded up to 16 (the pool's window state is window in the
                              * blocks' type + carry in F32 + kvpool's 16-byte header) */
    int64_t block_bytes;     /* block in the shape's type */
    int64_t pool_block_bytes; /* pool_block in the shape's type: the pool's and the store's block */
    int64_t window_bytes;    /* window in the shape's type (a window state's raw rows) */
} engine_dsv4_sizes;

/* Sizes for a shape; false and err for a shape the layout cannot hold (a ratio other than 0,
 * 4, 128; a size not positive; a type other than F32, F16, Q8_0, or Q8_0 with a head or
 * indexer key size that is not a multiple of 32). */
bool engine_dsv4_sizes_of(const engine_dsv4_shape *s, engine_dsv4_sizes *out, char *err, size_t errsz);
/* The sizes of a loaded V4 model in blocks of type t (its shape was checked by the loader;
 * all zero for a type the layout cannot hold). */
void engine_dsv4_model_sizes(const model *m, qtype t, engine_dsv4_sizes *out);
/* Whether blocks of type t hold a loaded V4 model's entries (engine_dsv4_sizes_of's rules); the
 * sizes in *out, or false and err naming what refuses it. */
bool engine_dsv4_type_ok(const model *m, qtype t, engine_dsv4_sizes *out, char *err, size_t errsz);

/* Scratch for batches of up to max_tokens entries on pool kv (max_pos: the most positions a
 * sequence can hold, for the indexer's and attention's per-thread buffers). NULL and err
 * when out of memory. */
engine_dsv4 *engine_dsv4_new(const model *m, threadpool *tp, kvpool *kv, int max_tokens, int max_pos, char *err,
                             size_t errsz);
void engine_dsv4_free(engine_dsv4 *d);

/* One step over n entries (engine.h's engine_tok, reserved in the pool by the caller; a
 * sequence's entries at consecutive positions in batch order, continuing what its ring holds,
 * as engine_window_states says): logits (n_out, n_vocab) for the entries that want them, hidden
 * (n, dim) the collapsed residual stream before the output norm. false (nothing computed): a
 * sequence's entries out of order or too far back for its ring. Compressed entries are written
 * only at positions at or above kvpool_seq_full_from (below it the attached blocks hold them). */
bool engine_dsv4_step(engine_dsv4 *d, int n, const void *toks, float *logits, float *hidden);
/* The steps' stages go to e's profile (engine_profile) when it is on; e NULL: nowhere. */
void engine_dsv4_profile_to(engine_dsv4 *d, engine *e);
/* The window states captured by the last step at the block ends its sequences crossed
 * (engine_window_states). */
int engine_dsv4_states(const engine_dsv4 *d, const engine_window_state **out);

/* The step with the entries' input streams x0 (n, hc, dim) given, in place of the embedding
 * copied into every stream: an MTP block's (engine_dsv4_mtp.h). false as engine_dsv4_step. */
bool engine_dsv4_step_from(engine_dsv4 *d, int n, const void *toks, const float *x0, float *logits, float *hidden);

/* The last step's residual streams after the last layer, (n, hc, dim) in batch order, before
 * the head's collapse: what an MTP block continues (llama.cpp's h_nextn). Valid until the next
 * step. */
const float *engine_dsv4_streams(const engine_dsv4 *d);

/* Keep the inputs of some layers of every entry of every step from now on, for a DSpark drafter
 * (engine_dflash.h): slot (n_layers + 1 entries, -1: not kept; slot[n_layers] is the streams
 * after the last layer) says where layer il's input goes in an entry's row of cap (n_cap * dim
 * floats, max_tokens rows). The input is the mean of the hyper-connection streams entering the
 * layer, what llama.cpp's deepseek4 graph gives a drafter. NULL cap stops; the arrays stay the
 * caller's. */
void engine_dsv4_capture(engine_dsv4 *d, const int8_t *slot, int n_cap, float *cap);

/* A V4-backbone DSpark drafter's block pass (d made on the drafter's model and pool): the step
 * over n entries whose K=V rows at positions before the blocks were injected, every entry
 * attending to the window before it and to every position up to last[t] (its block's end: the
 * non-causal block), with the embedding of embd (the target's when the drafter has none). Only
 * hidden (n, dim), the collapsed streams before the output norm, is written. */
void engine_dsv4_block(engine_dsv4 *d, int n, const void *toks, const int32_t *last, const model *embd,
                       float *hidden);

#endif
