/*
 * engine: the batched forward step of a model over the paged KV pool.
 *
 * DESIGN. engine_step takes a batch of n_tokens entries (token id, sequence, position,
 * want_logits) from any number of sequences, prefill chunks and single decode tokens mixed
 * in any order, and runs every layer once for the whole batch: each linear layer is one
 * ops_matmul with n_tokens rows, so the weights are read from memory once per step. K and V
 * of the batch tokens are stored in the pool (converted to the pool dtype) before attention;
 * attention then walks each token's own sequence's blocks up to its position (causal), GQA
 * mapping head h to kv head h / (n_heads / n_kv_heads). Attention work items are (tile, kv
 * head), a tile being up to 16 consecutive positions of one sequence in the batch, taken by
 * the threads from a shared counter; per block, Q K^T and P V are two small f32 GEMMs. Every
 * output is computed by one thread in a fixed order.
 *
 * Batch invariance: the logits of a (sequence, position) are bit-identical whatever else
 * shares the step (other sequences, prefill chunks, decode tokens), however its prompt was
 * chunked (one step, chunks, token by token) and whatever the thread count, at a given SIMD
 * level: every matmul kernel computes a (row, token) dot in one fixed order whatever the
 * tile, and attention takes one path per engine whose arithmetic for a query depends only on
 * its own position (tests/unit/test_invariance.c). So greedy output never depends on load.
 *
 * Numerics follow llama.cpp's CPU backend with flash attention (node-llama-cpp 3.21.1's
 * default: flash_attn "auto" resolves to on for CPU, F16 K/V cache) in its tiled path (the
 * one it takes for prompt processing, steps of 64+ tokens): Q K^T and P V in f32 with an
 * online softmax per 128-key block, for every step. llama.cpp's single-token steps use its
 * one-query path instead (Q rounded to f16, f16 V accumulator), so our decode steps differ
 * from its by f16 rounding. With an F16 cache and a head size that is not a multiple of 16,
 * where ggml has only the one-query path, that path is used for every step (without ggml's
 * split of long single-token steps over threads). Scores are scaled by 1/sqrt(head_dim).
 * A quantised cache (Q8_0 / Q4_0) takes ggml's only path for one: per key, the query
 * quantised to Q8_0 and an integer dot with the key row, the value row dequantised and
 * accumulated in f32; head sizes must be a multiple of 32 (engine_new refuses others).
 *
 * Mixture of experts (qwen3moe): the FFN of a step routes each token (llama.cpp's router
 * arithmetic, model/moe.h), groups the step's tokens by expert and runs each active expert
 * once over its tokens, so an expert's weights are read once per step and only if some token
 * chose it; outputs are summed per token in a fixed order (engine.c). Per-expert token counts
 * are kept for /metrics and bench (engine_moe_load).
 *
 * Multi-token prediction: an engine over an MTP view (model_mtp_view) makes each entry's input
 * eh_proj([rmsnorm(embedding) * enorm; rmsnorm(hidden) * hnorm]) from the hidden states given
 * to engine_forward, then runs the view's one layer, head norm and head as any model (V4: per
 * hyper-connection stream, engine_dsv4_mtp.h);
 * engine_hidden gives every step's hidden states (the model's, which the MTP draft continues;
 * the view's, to chain it), read in place: nothing is copied on the model's step.
 *
 * Memory: all scratch (activations for max_batch_tokens, matmul scratch, per-thread
 * attention buffers) is allocated in engine_new; engine_step allocates nothing.
 *
 * The caller owns positions: entry (seq, pos) attends to positions 0..pos of seq, which must
 * all have been written by this or earlier steps, or be blocks that the block store fills
 * asynchronously (kvpool_seq_append_fill): attention of layer l first waits for layer l of
 * those (kvpool_fill_wait), so the uncached suffix computes its embeddings, norms and Q/K/V
 * of layer l while the I/O threads are still copying layers l.. of its cached prefix. engine_step reserves pool blocks for the
 * positions it writes; if the pool cannot supply them it returns ENGINE_ERR_KV_FULL before
 * computing anything (some sequences may keep blocks reserved for those positions).
 */
#ifndef TM_ENGINE_H
#define TM_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "engine/kvpool.h"
#include "model/model.h"
#include "util/bytebuf.h"

typedef enum {
    ENGINE_OK = 0,
    ENGINE_ERR_KV_FULL,  /* no KV block for a batch position: wait or preempt, then retry */
    ENGINE_ERR_ARG,      /* bad batch (token id out of range, too many tokens, bad position) */
    ENGINE_ERR_NOMEM,    /* engine_new could not allocate */
} engine_status;

/* The KV cache's element type (engine_kv_qtype gives its qtype); zero is the default, F16. */
typedef enum {
    ENGINE_KV_F16 = 0,
    ENGINE_KV_F32,
    ENGINE_KV_Q8_0,           /* ggml's Q8_0 blocks: 34 bytes per 32 values */
    ENGINE_KV_Q4_0,           /* ggml's Q4_0 blocks: 18 bytes per 32 values */
} engine_kv_type;

qtype engine_kv_qtype(engine_kv_type t);
/* "f16", "f32", "q8_0", "q4_0" -> the type; false for any other name. */
bool engine_kv_type_parse(const char *z, engine_kv_type *out);

typedef struct {
    int n_threads;            /* kernel threads incl. the caller; <= 0: online cores */
    int n_kv_blocks;          /* KV pool size in 128-token blocks; 0: from kv_bytes */
    size_t kv_bytes;          /* KV pool size in bytes when n_kv_blocks is 0; 0: 4096 tokens */
    int max_batch_tokens;     /* most tokens per engine_step; <= 0: 512 */
    engine_kv_type kv_type;   /* KV cache elements (default F16) */
    const int *cpus;          /* (n_threads) the CPU of each kernel thread (util/topo.h's
                               * topo_place), or NULL: not pinned; needs n_threads > 0 */
} engine_opts;

typedef struct {
    int32_t token;            /* token id, < n_vocab */
    int32_t pos;              /* position in its sequence, >= 0 */
    kvpool_seq *seq;          /* the sequence (from kvpool_seq_new on engine_kvpool) */
    bool want_logits;         /* write this token's next-token logits */
} engine_tok;

typedef struct {
    int n_tokens;             /* entries in toks, 1..max_batch_tokens */
    const engine_tok *toks;   /* (n_tokens) */
} engine_batch;

typedef struct engine engine;

engine_status engine_new(model *m, const engine_opts *opts, engine **out, char *err, size_t errsz);
void engine_free(engine *e);            /* does not free the model */
const char *engine_status_name(engine_status st);

kvpool *engine_kvpool(engine *e);
/* The KV pool geometry engine_new gives a model (n_blocks 0): for sizing the pool before
 * the engine exists (kvpool_geom_block_bytes). MLA models store one latent row per position;
 * window layers keep no KV in blocks. layer_window: (n_layers) the caller's array, which the
 * result points to (filled with model_layer_window). */
kvpool_opts engine_kv_geometry(const model *m, engine_kv_type kv_type, int32_t *layer_window);
/* The values the layer_window array of engine_kv_geometry must have room for: the model's
 * layers, or DeepSeek V4's (engine_dsv4_kv_geometry: its pool's layers and their ring widths). */
int engine_kv_geometry_room(const model *m);
/* The row shape of that geometry (whatever the KV type): slabs per (layer, kv head), kv heads
 * and values per row, as a handoff's tail KV carries them (for a gateway, which has no pool). */
void engine_kv_shape(const model *m, int *n_parts, int *n_kv_heads, int *head_dim);
const model *engine_model(const engine *e);
int engine_max_batch(const engine *e);
int engine_n_threads(const engine *e);
/* The pool the engine's kernels run on (for a benchmark's work between steps). */
threadpool *engine_threadpool(engine *e);

/* Expert load of a MoE model's layer (false for a dense model or a bad layer): window
 * (n_expert) the tokens each expert received over the last *n_steps steps (at most 128: a
 * sliding window), total (n_expert) since the engine started; either may be NULL. Safe to
 * call from any thread while steps run. */
bool engine_moe_load(engine *e, int layer, uint64_t *window, uint64_t *total, int64_t *n_steps);
/* The imbalance DeepSeek reports for expert parallelism: the experts cut into n_groups
 * contiguous groups (as G devices would hold them), the busiest group's load over the mean
 * group load; 1 is perfect balance, 0 when nothing was counted. */
double engine_moe_imbalance(const uint64_t *counts, int n_expert, int n_groups);

/* A window layers' state captured by a step (models with sliding-window layers): the state
 * of seq at end (a multiple of 128 its step crossed, where the state is exact), in the layout
 * of kvpool_seq_window_save. On a model with recurrent layers (Qwen3.5) the same for the
 * sequence's recurrent state (kvpool_seq_state's bytes at end; engine_qwen35_states). */
typedef struct {
    kvpool_seq *seq;
    int end;                  /* positions [end - window, end) */
    const void *state;        /* kvpool_window_state_bytes (recurrent: kvpool_state_bytes);
                               * valid until the next engine_step */
} engine_window_state;
/* The states captured by the last engine_step (0 for a model with neither window nor
 * recurrent layers). On a
 * model with window layers a sequence's entries in one step must be at consecutive positions
 * in batch order (runs of it may have other sequences' entries between them), starting at
 * most KVPOOL_RING_SPARE positions before kvpool_seq_ring_next, else ENGINE_ERR_ARG: its
 * ring holds what precedes the step. */
int engine_window_states(const engine *e, const engine_window_state **out);

/* Profile of the steps (off by default; bench profile): the step thread reads the clock
 * after each stage of each layer and adds the interval to the stage's cell, with the pool's
 * counters over the interval (threadpool_stats) and the activation quantisation done on the
 * step thread carved out into ENGINE_PROF_ACT_QUANT. A few clock reads per stage; nothing
 * when off. */
typedef enum {
    ENGINE_PROF_EMBED = 0,   /* embedding rows and the first norm (outside the layers) */
    ENGINE_PROF_QKV,         /* Q/K/V projections (MLA: the latent projections and heads) */
    ENGINE_PROF_QKV_POST,    /* biases, Q/K norms, RoPE, K/V into the pool */
    ENGINE_PROF_ATTENTION,   /* attention over the pool */
    ENGINE_PROF_WO,          /* attention output projection (MLA: v_b heads too) */
    ENGINE_PROF_ADD_NORM,    /* residual adds and the next sublayer's norm */
    ENGINE_PROF_FFN_UP,      /* gate and up projections */
    ENGINE_PROF_SWIGLU,      /* silu(gate) * up */
    ENGINE_PROF_FFN_DOWN,    /* down projection */
    ENGINE_PROF_MOE,         /* router, routed and shared experts */
    ENGINE_PROF_HC,          /* DeepSeek V4's hyper-connection mixes (into and out of sublayers) */
    ENGINE_PROF_ACT_QUANT,   /* activations quantised by the step thread before matmuls */
    ENGINE_PROF_OUT_NORM,    /* the final norm of the rows that want logits */
    ENGINE_PROF_OUTPUT,      /* the output head (vocabulary logits) */
    ENGINE_PROF_N
} engine_prof_op;

typedef struct {
    double s;                /* seconds on the step thread (wall time of the stage) */
    double work_s;           /* thread-seconds inside the pool's rounds (all threads) */
    double wake_s;           /* thread-seconds workers took to enter the rounds */
    double barrier_s;        /* thread-seconds waiting at barriers inside the rounds */
    uint64_t rounds;         /* pool rounds */
    uint64_t calls;          /* times the stage ran */
} engine_prof_cell;

/* on: allocates (first time), zeroes the cells and starts counting; false when out of
 * memory. off: stops counting, the cells stay readable. Not during a step. */
bool engine_profile(engine *e, bool on);
/* The cells, (n_layers + 1, ENGINE_PROF_N): row il < n_layers for layer il, row n_layers
 * for the stages outside the layers; NULL before engine_profile. *n_steps: steps counted. */
const engine_prof_cell *engine_profile_cells(const engine *e, int64_t *n_steps);
const char *engine_prof_op_name(engine_prof_op op);

/* The hidden states of the last engine_step's entries, (n_tokens, engine_hidden_dim) in batch
 * order: the residual stream after the last layer, before the output norm (what an MTP layer
 * continues from); of a V4 model its hc streams, before the head's collapse. Valid until the
 * next engine_step. */
const float *engine_hidden(const engine *e);
/* The width of an engine_hidden row: dim, or hc * dim for a V4 model (its MTP view's too). */
int engine_hidden_dim(const engine *e);

/* Keep the inputs of layers[0..n) (the residual stream entering each, as llama.cpp's
 * embeddings_layer_inp) of every entry of every step from now on, for a DFlash drafter
 * (engine_dflash.h); n = 0 stops. Allocates (not during a step); false for a layer out of
 * range, an encoder or out of memory. A V4 model keeps the mean of its streams, and layers[i] may
 * be n_layers there (the streams after the last layer). */
bool engine_capture_layers(engine *e, const int32_t *layers, int n);
/* The last engine_step's kept layer inputs, (n_tokens, n * dim) in batch order: entry t's row
 * is its inputs of layers[0], layers[1], ... side by side. NULL without engine_capture_layers.
 * Valid until the next engine_step. */
const float *engine_layer_inputs(const engine *e);

/* The hidden state of the last engine_step's entry t (< its n_tokens) after the model's output
 * norm, (dim) floats into out: the token state llama.cpp pools into an embedding. Valid until
 * the next engine_step; allocates nothing. */
void engine_hidden_normed(const engine *e, int t, float *out);

/* Each entry's routing margin in the last engine_step, (n_tokens) in batch order: the
 * smallest moe_route margin over the MoE layers (how close the token came to another
 * expert or group; INFINITY when no layer dropped one); NULL for a model without experts.
 * Valid until the next engine_step. */
const float *engine_route_margins(const engine *e);

/* The forward pass, one step over the batch. logits receives (n_out, n_vocab) floats, one row
 * per entry with want_logits, in batch order; it may be NULL when no entry wants logits.
 * hidden is NULL for a model and (n_tokens, dim) floats for an engine over an MTP view
 * (model_mtp_view): the hidden state each entry continues; either other way is refused. */
engine_status engine_forward(engine *e, const engine_batch *b, const float *hidden, float *logits);
/* engine_forward of a model (hidden NULL): what every caller but the MTP drafter runs. */
engine_status engine_step(engine *e, const engine_batch *b, float *logits);

/* Every activation and scratch buffer written once (each pool thread its share, so a
 * per-thread buffer is first touched by its own thread), then a step of one token (id 0 at
 * position 0, wanting logits) on a sequence of its own, which is let go after, with the expert
 * statistics set back to none: run once before the first real step (cmd_common_engine_new
 * runs it, before serve listens), so that step does not pay for the first touch of the
 * scratch pages and the step's code (it was about a quarter slower than the next ones, and a
 * first prompt of several tokens faulted in the rows the one-token step had not). Leaves no
 * trace: the pool's blocks are all free again and nothing is keyed. The step is skipped on an
 * engine over an MTP view (its steps need the model's hidden states). */
engine_status engine_warmup(engine *e);

/* Expert parallelism (cluster/ep.h): some experts of a MoE layer computed by other processes.
 * After routing and the gather of layer il, dispatch gets the active experts act (n_act,
 * ascending), expert x's input rows being off[x]..off[x + 1] of xg (dim floats each); it sends
 * the rows of the experts computed elsewhere, moves the experts computed here to the front
 * of act and returns their count; the engine computes those. combine then waits for the
 * others' outputs and writes them into the same rows of ye; it returns how many experts'
 * outputs did not come (a member failed), listed in act, and the engine computes those too.
 * The sum per token then runs as without: same rows, same order, same bits. Runs on the step
 * thread; the hooks must outlive the engine or be unset first. */
typedef struct {
    void *ctx;
    int (*dispatch)(void *ctx, int il, int32_t *act, int n_act, const int32_t *off, const float *xg);
    int (*combine)(void *ctx, int il, float *ye, int32_t *act);
    void (*metrics)(void *ctx, bytebuf *b);   /* the group's /metrics lines (any thread) */
    void (*status)(void *ctx, bytebuf *b);    /* its status page line, HTML-safe text */
} engine_ep_hooks;
void engine_set_ep(engine *e, const engine_ep_hooks *h);   /* NULL: every expert here */
/* The group's /metrics lines and status line (nothing without a group). */
void engine_ep_metrics(engine *e, bytebuf *b);
void engine_ep_status(engine *e, bytebuf *b);
/* The routed experts' FFN of layer il for rows another process gathered: experts (n_exp, strictly
 * ascending) with n_rows[i] rows each, x (sum of n_rows, dim) their inputs in that order, y the
 * outputs in the same order: the rows engine_step would compute for them, bit for bit. At most
 * max_batch * n_expert_used rows, max_batch of them an expert's; ENGINE_ERR_ARG otherwise, or
 * for a layer without experts. */
engine_status engine_moe_experts_run(engine *e, int il, int n_exp, const int32_t *experts, const int32_t *n_rows,
                                     const float *x, float *y);

#endif
