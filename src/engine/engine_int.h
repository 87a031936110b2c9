/*
 * engine_int: what the engine's files share and no other module sees: the layout of struct
 * engine (every buffer of a step, its shape and dtype, all allocated by engine_new; the
 * design is in engine.h), the job a pool round of a step receives, and the calls from one
 * engine file into another.
 *
 *   engine.c      the engine's life: engine_new (buffers, the family's own state), free,
 *                 warm-up, the profile and the experts' load statistics
 *   engine_kv.c   the KV cache: its types and geometry, the rotation a quantised cache takes,
 *                 and the window layers' staging, rings and captured states
 *   engine_step.c the decoder step: the layers of engine_forward, their pool jobs
 *                 (attention, routing, latent attention) and the logits; the experts'
 *                 round itself is engine_moe.c's (engine_moe.h), shared with engine_dsv4.c
 */
#ifndef TM_ENGINE_INT_H
#define TM_ENGINE_INT_H

#include <pthread.h>

#include "engine/engine.h"
#include "engine/engine_bert.h"
#include "engine/engine_dsv4.h"
#include "engine/engine_dsv4_mtp.h"
#include "engine/engine_moe.h"
#include "engine/engine_qwen35.h"
#include "model/moe.h"
#include "model/ops.h"
#include "util/threadpool.h"

/* Attention tiles: the consecutive positions of one sequence in a step are cut into tiles,
 * and a tile's query rows (tile * gqa) share every read of the context's K/V: each 128-key
 * block is read from the pool and converted to f32 once per tile, so on a deep context (a
 * cached prefix's short uncached suffix) fewer, larger tiles mean less of that memory-bound
 * work per row. Tiles hold up to ENGINE_ATT_ROWS query rows (the scratch stays in L2) and at
 * most ENGINE_ATT_TILE_MAX positions (at least one: a tile of one MQA position may exceed
 * the rows); a step with few tiles cuts them smaller so that every
 * kernel thread gets work (engine_plan_tiles). A row's arithmetic does not depend on its tile
 * (ops_att_block), so none of this changes a result. */
#define ENGINE_ATT_ROWS 256
#define ENGINE_ATT_GQA_MAX 1024  /* query heads per kv head at most (a tile has >= 1 position) */
#define ENGINE_ATT_TILE_MAX 128
#define ENGINE_ATT_TILE_MIN 16

/* Expert load statistics: the tokens each expert of each layer received, per step, for the
 * last ENGINE_MOE_WINDOW steps (a ring; their sum kept as the window's), and since the start.
 * The step thread updates them once per layer under mu; readers (/metrics, bench) copy under
 * it. No allocation after engine_new. */
#define ENGINE_MAX_SCRATCH 48   /* buffers engine_new allocates at most */
#define ENGINE_MOE_WINDOW 128

typedef struct engine_moe_stats engine_moe_stats;

struct engine {
    model *m;
    threadpool *tp;
    kvpool *kv;
    int n_threads;
    int max_tokens;          /* max batch tokens */
    struct {
        void *p;
        size_t bytes;
    } scratch[ENGINE_MAX_SCRATCH]; /* every buffer below that engine_new allocated, for engine_warmup */
    int n_scratch;
    /* activations, (max_tokens, width) f32 row-major */
    float *x;                /* (T, dim) residual stream */
    float *xn;               /* (T, dim) normed input / layer output */
    float *q;                /* (T, n_heads*head_dim) */
    float *k;                /* (T, n_kv_heads*head_dim) */
    float *v;                /* (T, n_kv_heads*head_dim) */
    float *att;              /* (T, n_heads*head_dim) attention output */
    float *ffa;              /* (T, ffn_dim) gate, then swiglu */
    float *ffb;              /* (T, ffn_dim) up */
    float *xo;               /* (T, dim) rows that want logits */
    int32_t *pos;            /* (T) positions of the batch entries */
    void *mm_scratch;        /* matmul activation scratch */
    /* per-thread attention scratch: (n_threads, ENGINE_ATT_STRIDE) floats */
    float *att_scratch;
    size_t att_stride;       /* floats per thread */
    int32_t *tile_start;     /* (T + 1) first batch entry of each attention tile */
    int n_tiles;
    int att_tile;            /* positions per attention tile at most (ENGINE_ATT_* bounds) */
    int rot_k;               /* a quantised cache: order of the Walsh-Hadamard rotation of
                              * Q and K (each head row in pieces of rot_k values), 0: none */
    int rot_v;               /* the same for V, and back for the attention output, 0: none */
    /* mixture of experts (NULL for a dense model); k = n_expert_used, E = n_expert */
    float *r_logits;         /* (T, E) router logits */
    moe_router router;       /* the model's routing (model/moe.h) */
    float *r_probs;          /* (n_threads, MOE_SCRATCH(E)) routing scratch */
    int32_t *r_idx;          /* (n_threads, MOE_SCRATCH(E)) routing scratch */
    int32_t *r_sel;          /* (T, k) experts of each token, best first */
    float *r_w;              /* (T, k) their weights */
    float *r_margin;         /* (T) each token's smallest routing margin over the step's MoE
                              * layers (moe_route), INFINITY before the first */
    int32_t *x_off;          /* (E + 1) first row of each expert in xg / ye */
    int32_t *x_row;          /* (T, k) row in xg / ye of each (token, slot) */
    int32_t *x_tok;          /* (T * k) token of each row of xg */
    int32_t *x_act;          /* (E) experts with rows this layer, ascending */
    int n_act;
    float *xg;               /* (T * k, dim) inputs grouped by expert */
    float *fe;               /* (T * k, expert_ffn) SwiGLU of the experts, same rows */
    float *ye;               /* (T * k, dim) expert outputs, same rows */
    float *moe_tmp;          /* (n_threads, moe_tmp_stride) chunk outputs and matmul scratch */
    size_t moe_tmp_stride;   /* floats per thread */
    engine_moe_stats *stats; /* expert load windows */
    const engine_ep_hooks *ep; /* expert parallelism: experts computed elsewhere, or NULL */
    /* multi-head latent attention (NULL otherwise); H = n_heads, kq = nope + rope */
    float *qa;               /* (T, q_lora) query low-rank activations */
    float *qraw;             /* (T, H * kq) queries before absorption */
    float *att_v;            /* (T, H * v_dim) per-head values after attn_v_b */
    float *mla_tmp;          /* (n_threads, mla_tmp_stride) per-head gather/scatter and scratch */
    size_t mla_tmp_stride;   /* floats per thread */
    float *shx;              /* (T, dim) shared experts' output */
    float *mtp_cat;          /* (T, 2 * dim) an MTP view's normed embedding and hidden state */
    /* window layers (NULL for a model without): their K/V of a step is staged here, read by
     * attention for the step's own positions, and moved into each sequence's ring after */
    uint8_t *wstage;         /* (T, 2, n_kv_heads) rows of the pool dtype, K then V of an entry */
    size_t wrow;             /* bytes of one staged row: head_dim values in the pool dtype */
    int32_t *wkv;            /* (n_layers) a layer's kv heads in the staging (kvpool_layer_kv_heads) */
    size_t *wrow_l;          /* (n_layers) bytes of a layer's staged row: its own K width in the
                              * pool dtype (wrow for a uniform model) */
    int32_t *run0;           /* (T) first batch entry of each entry's run (engine_run_end) */
    int32_t *prev_run;       /* (T) at a run's first entry: the first entry of the same
                              * sequence's previous run in this step, -1 if none */
    engine_window_state *wsnap; /* (n_wsnap_max) states captured this step */
    int32_t *wsnap_t;        /* (n_wsnap_max) a batch entry of the run that crossed each end */
    uint8_t *wsnap_data;     /* (n_wsnap_max, kvpool_window_state_bytes) their bytes */
    int n_wsnap, n_wsnap_max;
    uint64_t n_wsnap_dropped; /* states not captured for want of a slot, lifetime */
    /* profile (engine_profile): cells NULL until first enabled */
    engine_dsv4 *dsv4;       /* DeepSeek V4's step (engine_dsv4.h), or NULL */
    engine_dsv4_mtp *dsv4_mtp; /* over an MTP-only file's block: its input (engine_dsv4_mtp.h) */
    engine_prof_cell *prof;  /* (n_layers + 1, ENGINE_PROF_N) */
    bool prof_on;            /* counting */
    int64_t prof_steps;      /* steps counted */
    double prof_t;           /* util_now() at the last mark */
    double prof_quant;       /* ops' activation-quantisation seconds since the last mark */
    threadpool_stats prof_tp;/* the pool's counters at the last mark */
    engine_qwen35 *q35;      /* Qwen3.5's linear-attention layers and gates, or NULL */
    engine_bert *bert;       /* an encoder's step (engine_bert.h), or NULL */
    /* layer inputs kept for a dflash drafter (engine_capture_layers), NULL: none */
    int8_t *cap_slot;        /* (n_layers) where layer il's input goes in a row of cap, -1: not kept */
    float *cap;              /* (max_tokens, n_cap * dim) */
    int n_cap;
    int win_src;             /* gemma4: the window layer shared KV layers read, committed to the
                              * ring after the last layer (engine_window_commit), or -1 */
    float *g4_mlp;           /* gemma4 with experts: (T, dim) the shared MLP's output, then (T,
                              * dim) the router's input; or NULL */
    float *g4_pl;            /* gemma4 with per-layer embeddings: (T, n_layers * n_pl) each
                              * token's per-layer inputs, then (T, n_pl) a layer's gate; or NULL */
};

typedef struct {
    engine *e;
    const engine_batch *b;
    int layer;
    int kv_layer;            /* attention: the layer whose K/V it reads (gemma4's shared KV
                              * layers read an earlier one's), else layer */
    const float *norm;       /* add + norm: the norm's weights (NULL: the sum only) */
    const float *bias;       /* add + norm: (dim) added to xn first (attention output bias), or NULL */
    float scale;             /* add + norm: the sum times this before the norm (gemma4), 0: none */
    int n_items;             /* attention: T * n_heads */
    int hd;                  /* attention, q/k/v rows: the layer's head size (gemma4's own, else
                              * head_dim); q rows are n_heads * hd, k and v rows nkv * hd */
    int nkv;                 /* the layer's kv heads (gemma4's own, else n_kv_heads) */
    int rot_k;               /* the layer's Walsh-Hadamard order for Q and K (rot_k's, 0: none) */
    int rot_v;               /* the layer's order for V and back for the output (rot_v's, 0: none) */
    int next;                /* attention, MLA heads: shared item counter (atomic) */
    bool q16;                /* attention: the per-key path (f16 Q, f16 V accumulator) */
    bool q8;                 /* attention: the quantised cache's per-key path (Q8_0 Q, f32 V) */
    bool win;                /* attention: a window layer, one item per (batch entry, kv head) */
    bool mla_v;              /* MLA heads: values through v_b (else queries through k_b) */
} engine_job;

/* engine_gemma4.c: a gemma4 layer's q, k and v rows [t0, t0 + n) of the step, in its own
 * geometry ((n, n_heads * l_head_dim) q, (n, l_kv_heads * l_head_dim) k and v, where the
 * projections wrote them), normed and rotated in place; v from k without attn_v. */
void engine_gemma4_rows(const engine *e, const model_layer *L, float *q, float *k, float *v, int t0, int n);
/* Layer il's FFN with experts beside the shared MLP: x (the attention's residual sum) and xn
 * (ffn_norm of it) in, the FFN's output before post_ffw_norm in xn. */
void engine_gemma4_moe(engine *e, engine_job *job, int il, int T);
/* Each token's per-layer inputs into g4_pl, from the scaled embeddings in x (before layer 0). */
void engine_gemma4_pl_inputs(engine *e, const engine_batch *b, int T);
/* x += layer il's per-layer embedding term (after the FFN's residual add, before its scale). */
void engine_gemma4_pl_layer(engine *e, int il, int T);
/* The routed experts of layer il (engine_step.c): xn in, the weighted sum of the chosen
 * experts' outputs in xn (plus the shared experts' where the layer has them); rin: the router's
 * input, (T, dim), or NULL: xn. */
void engine_moe_ffn(engine *e, engine_job *job, int il, int T, const float *rin);

/* engine.c */
/* A buffer of engine_new, registered for engine_warmup and engine_free (NULL: out of memory
 * or the registry is full). */
void *engine_scratch_alloc(engine *e, size_t bytes);
/* Adds the time since the last mark to the profile cell (il, op) when profiling. */
void engine_prof_mark(engine *e, int il, engine_prof_op op);
/* The tokens each expert of layer il received this step (off: (n_expert + 1) row offsets),
 * then, once per step, the window's ring advanced. */
void engine_moe_stats_layer(engine_moe_stats *st, int il, const int32_t *off);
void engine_moe_stats_step(engine_moe_stats *st);

/* engine_kv.c */
engine_status engine_new_kv(engine *e, const engine_opts *o, int *n_blocks, char *err, size_t errsz);
engine_status engine_new_window(engine *e, size_t T, char *err, size_t errsz);
bool engine_window_plan(engine *e, const engine_batch *b);
void engine_window_commit(engine *e, const engine_batch *b, int layer);
/* The K (kv 0) or V (kv 1) row of kv head kvh at position pk that entry t of a window layer
 * reads: staged in this step, or in its sequence's ring. */
const uint8_t *engine_win_row(const engine *e, const engine_batch *b, int layer, int t, int pk, int kv, int kvh);

/* engine_step.c */
/* The end (exclusive) of the run of consecutive positions of one sequence that entry t starts. */
int engine_run_end(const engine_batch *b, int t);

#endif
