/*
 * engine: the batched forward step (see engine.h). One function per stage of a layer; the
 * stages that the kernels module does not provide (bias rows, the K/V store, attention over
 * the paged pool) are small jobs run on the same thread pool.
 */
#include "engine/engine.h"
#include "engine/engine_qwen35.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_dsv4.h"
#include "engine/engine_bert.h"
#include "model/moe.h"
#include "model/ops.h"
#include "util/util.h"

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
#define ENGINE_MOE_ROWS 64       /* output rows of an expert per work item */
/* Steps of at most this many tokens compute the shared experts' FFN as work items of the
 * routed experts' round (two pool rounds fewer per layer); each item quantises its T input
 * rows again, which for a long prefill would cost more than the rounds it saves. */
#define ENGINE_MOE_SHARED_T 4

typedef struct engine_moe_stats {
    int n_layers, n_expert, window;
    uint32_t *ring;          /* (window, n_layers, n_expert) tokens of each of the last steps */
    uint64_t *win;           /* (n_layers, n_expert) sum over the ring */
    uint64_t *total;         /* (n_layers, n_expert) since the start */
    int64_t n_steps;         /* steps recorded; the ring's slot is n_steps % window */
    pthread_mutex_t mu;
} engine_moe_stats;

static engine_moe_stats *engine_moe_stats_new(int n_layers, int n_expert, int window)
{
    engine_moe_stats *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    size_t le = (size_t)n_layers * (size_t)n_expert;
    st->n_layers = n_layers, st->n_expert = n_expert, st->window = window;
    st->ring = calloc((size_t)window * le, sizeof *st->ring);
    st->win = calloc(le, sizeof *st->win);
    st->total = calloc(le, sizeof *st->total);
    pthread_mutex_init(&st->mu, NULL);
    if (!st->ring || !st->win || !st->total) {
        free(st->ring), free(st->win), free(st->total);
        pthread_mutex_destroy(&st->mu);
        free(st);
        return NULL;
    }
    return st;
}

static void engine_moe_stats_free(engine_moe_stats *st)
{
    if (!st) return;
    free(st->ring);
    free(st->win);
    free(st->total);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* Records layer il of the current step: off (n_expert + 1) row offsets, expert x got
 * off[x+1] - off[x] tokens. */
static void engine_moe_stats_layer(engine_moe_stats *st, int il, const int32_t *off)
{
    pthread_mutex_lock(&st->mu);
    size_t le = (size_t)st->n_layers * (size_t)st->n_expert, base = (size_t)il * (size_t)st->n_expert;
    uint32_t *slot = st->ring + (size_t)(st->n_steps % st->window) * le + base;
    for (int x = 0; x < st->n_expert; x++) {
        uint32_t n = (uint32_t)(off[x + 1] - off[x]);
        st->win[base + x] += (uint64_t)n - slot[x];
        st->total[base + x] += n;
        slot[x] = n;
    }
    pthread_mutex_unlock(&st->mu);
}

static void engine_moe_stats_step(engine_moe_stats *st)
{
    pthread_mutex_lock(&st->mu);
    st->n_steps++;
    pthread_mutex_unlock(&st->mu);
}

static void engine_moe_stats_clear(engine_moe_stats *st)
{
    size_t le = (size_t)st->n_layers * (size_t)st->n_expert;
    pthread_mutex_lock(&st->mu);
    memset(st->ring, 0, (size_t)st->window * le * sizeof *st->ring);
    memset(st->win, 0, le * sizeof *st->win);
    memset(st->total, 0, le * sizeof *st->total);
    st->n_steps = 0;
    pthread_mutex_unlock(&st->mu);
}

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
    engine_prof_cell *prof;  /* (n_layers + 1, ENGINE_PROF_N) */
    bool prof_on;            /* counting */
    int64_t prof_steps;      /* steps counted */
    double prof_t;           /* util_now() at the last mark */
    double prof_quant;       /* ops' activation-quantisation seconds since the last mark */
    threadpool_stats prof_tp;/* the pool's counters at the last mark */
    engine_qwen35 *q35;      /* Qwen3.5's linear-attention layers and gates, or NULL */
    engine_bert *bert;       /* an encoder's step (engine_bert.h), or NULL */
};

const char *engine_prof_op_name(engine_prof_op op)
{
    static const char *const names[ENGINE_PROF_N] = {
        "embed", "qkv", "qkv_post", "attention", "wo", "add_norm", "ffn_up", "swiglu",
        "ffn_down", "moe", "act_quant", "out_norm", "output",
    };
    return (unsigned)op < ENGINE_PROF_N ? names[op] : "?";
}

bool engine_profile(engine *e, bool on)
{
    size_t n = (size_t)(e->m->hp.n_layers + 1) * ENGINE_PROF_N;
    if (on && !e->prof && !(e->prof = calloc(n, sizeof *e->prof))) return false;
    if (on) {
        memset(e->prof, 0, n * sizeof *e->prof);
        e->prof_steps = 0;
    }
    threadpool_profile(e->tp, on);
    e->prof_on = on;
    return true;
}

const engine_prof_cell *engine_profile_cells(const engine *e, int64_t *n_steps)
{
    if (n_steps) *n_steps = e->prof_steps;
    return e->prof;
}

/* Ends a stage: the time since the last mark goes to (il, op), the quantisation the step
 * thread did meanwhile to (il, ENGINE_PROF_ACT_QUANT). */
static void engine_prof_mark(engine *e, int il, engine_prof_op op)
{
    if (!e->prof_on) return;
    double now = util_now(), q = e->prof_quant;
    threadpool_stats ts;
    threadpool_stats_get(e->tp, &ts);
    engine_prof_cell *c = &e->prof[(size_t)il * ENGINE_PROF_N + op];
    c->s += now - e->prof_t - q;
    c->work_s += (double)(ts.work_ns - e->prof_tp.work_ns) * 1e-9;
    c->wake_s += (double)(ts.wake_ns - e->prof_tp.wake_ns) * 1e-9;
    c->barrier_s += (double)(ts.barrier_ns - e->prof_tp.barrier_ns) * 1e-9;
    c->rounds += ts.rounds - e->prof_tp.rounds;
    c->calls++;
    if (q > 0) {
        e->prof[(size_t)il * ENGINE_PROF_N + ENGINE_PROF_ACT_QUANT].s += q;
        e->prof[(size_t)il * ENGINE_PROF_N + ENGINE_PROF_ACT_QUANT].calls++;
    }
    e->prof_quant = 0;
    e->prof_t = now;
    e->prof_tp = ts;
}

typedef struct {
    engine *e;
    const engine_batch *b;
    int layer;
    const float *norm;       /* add + norm: the norm's weights (NULL: the sum only) */
    const float *bias;       /* add + norm: (dim) added to xn first (attention output bias), or NULL */
    int n_items;             /* attention: T * n_heads */
    int next;                /* attention, experts: shared item counter (atomic) */
    int next2;               /* experts: the down projection's item counter (atomic) */
    bool q16;                /* attention: the per-key path (f16 Q, f16 V accumulator) */
    bool q8;                 /* attention: the quantised cache's per-key path (Q8_0 Q, f32 V) */
    bool win;                /* attention: a window layer, one item per (batch entry, kv head) */
    bool mla_v;              /* MLA heads: values through v_b (else queries through k_b) */
    bool shexp;              /* experts: the shared experts' FFN is in the round (into shx) */
} engine_job;

const char *engine_status_name(engine_status st)
{
    switch (st) {
    case ENGINE_OK: return "ok";
    case ENGINE_ERR_KV_FULL: return "kv cache full";
    case ENGINE_ERR_ARG: return "bad batch";
    case ENGINE_ERR_NOMEM: return "out of memory";
    }
    return "?";
}

kvpool *engine_kvpool(engine *e) { return e->kv; }
const model *engine_model(const engine *e) { return e->m; }
int engine_max_batch(const engine *e) { return e->max_tokens; }
int engine_n_threads(const engine *e) { return e->n_threads; }

void engine_free(engine *e)
{
    if (!e) return;
    threadpool_free(e->tp);
    kvpool_free(e->kv);
    free(e->prof);
    for (int i = 0; i < e->n_scratch; i++) free(e->scratch[i].p);   /* e->x .. e->wstage */
    free(e->run0);
    free(e->prev_run);
    free(e->wsnap_t);
    free(e->wsnap);
    free(e->wsnap_data);
    engine_moe_stats_free(e->stats);
    engine_qwen35_free(e->q35);
    engine_dsv4_free(e->dsv4);
    engine_bert_free(e->bert);
    free(e);
}

qtype engine_kv_qtype(engine_kv_type t)
{
    switch (t) {
    case ENGINE_KV_F32: return QTYPE_F32;
    case ENGINE_KV_Q8_0: return QTYPE_Q8_0;
    case ENGINE_KV_Q4_0: return QTYPE_Q4_0;
    default: return QTYPE_F16;
    }
}

bool engine_kv_type_parse(const char *z, engine_kv_type *out)
{
    static const char *const names[] = { "f16", "f32", "q8_0", "q4_0" };
    for (int i = 0; i < 4; i++)
        if (strcmp(z, names[i]) == 0) {
            *out = (engine_kv_type)i;
            return true;
        }
    return false;
}

kvpool_opts engine_kv_geometry(const model *m, engine_kv_type kv_type, int32_t *layer_window)
{
    const model_hparams *hp = &m->hp;
    for (int il = 0; il < hp->n_layers; il++) layer_window[il] = model_layer_window(m, il);
    for (int il = 0; il < hp->n_layers; il++)   /* a recurrent layer keeps no KV */
        if (m->layers[il].ssm_out.data) layer_window[il] = -1;
    if (hp->arch == MODEL_ARCH_DEEPSEEK4) return engine_dsv4_kv_geometry(m);   /* F32, no ring */
    if (hp->bidirectional) {   /* an encoder keeps nothing: its pool only counts positions */
        kvpool_opts ke = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .dtype = engine_kv_qtype(kv_type),
                           .layer_window = layer_window };
        memcpy(ke.model_fp, m->fingerprint, 32);
        return ke;
    }
    kvpool_opts ko = { .n_layers = hp->n_layers, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
                       .v_is_k = hp->mla, .dtype = engine_kv_qtype(kv_type), .layer_window = layer_window,
                       .state_bytes = engine_qwen35_state_bytes(m) };
    memcpy(ko.model_fp, m->fingerprint, 32);
    return ko;
}

static size_t engine_scratch_need(const ops_weight *w, int T, size_t cur)
{
    size_t n = ops_matmul_scratch_bytes(w->type, w->cols, T);
    return n > cur ? n : cur;
}

/* An activation or scratch buffer of engine_new, kept in the registry that engine_warmup
 * touches and engine_free frees (NULL when out of memory, as util_aligned_alloc, or when the
 * registry is full: engine_new then fails rather than leave a buffer untouched). */
static void *engine_scratch_alloc(engine *e, size_t bytes)
{
    if (e->n_scratch >= ENGINE_MAX_SCRATCH) return NULL;
    void *p = util_aligned_alloc(bytes);
    if (p) {
        e->scratch[e->n_scratch].p = p;
        e->scratch[e->n_scratch++].bytes = bytes;
    }
    return p;
}

/* The KV pool in the model's geometry and the cache type asked for, of *n_blocks blocks, and
 * the Walsh-Hadamard rotation a quantised cache takes. */
static engine_status engine_new_kv(engine *e, const engine_opts *o, int *n_blocks, char *err, size_t errsz)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    int32_t *lw = xcalloc((size_t)hp->n_layers, sizeof *lw);
    kvpool_opts ko = engine_kv_geometry(m, o->kv_type, lw);
    if (!kvpool_type_ok(ko.dtype, ko.head_dim)) {
        snprintf(err, errsz, "a %s KV cache needs a head size that is a multiple of 32; this model's is %d",
                 quant_type_name(ko.dtype), ko.head_dim);
        free(lw);
        return ENGINE_ERR_ARG;
    }
    if (hp->mla && (ko.dtype == QTYPE_Q8_0 || ko.dtype == QTYPE_Q4_0)) {
        snprintf(err, errsz, "a %s KV cache is not supported for multi-head latent attention models (use f16 or f32)",
                 quant_type_name(ko.dtype));
        free(lw);
        return ENGINE_ERR_ARG;
    }
    /* llama.cpp rotates Q, K and V by a Walsh-Hadamard matrix before a quantised cache stores
     * them (the largest power-of-two piece of the head for K, 64 for V) and the attention
     * output back: an outlier is spread over its piece, so the 32-value blocks quantise with
     * less error; scores are unchanged (the matrix is orthonormal). Same condition as its. */
    if ((ko.dtype == QTYPE_Q8_0 || ko.dtype == QTYPE_Q4_0) && ko.head_dim % 64 == 0) {
        e->rot_k = 64;
        while (ko.head_dim % (2 * e->rot_k) == 0) e->rot_k *= 2;
        e->rot_v = 64;
    }
    if (o->n_kv_blocks > 0) ko.n_blocks = o->n_kv_blocks;
    else if (o->kv_bytes > 0) ko.n_blocks = kvpool_blocks_for_bytes(&ko, o->kv_bytes);
    else ko.n_blocks = 4096 / KVPOOL_BLOCK;
    *n_blocks = ko.n_blocks;
    kvpool_status ks = kvpool_new(&ko, &e->kv);
    free(lw);
    if (ks != KVPOOL_OK) {
        snprintf(err, errsz, "KV cache of %d blocks: %s", ko.n_blocks, kvpool_status_name(ks));
        return ENGINE_ERR_NOMEM;
    }
    return ENGINE_OK;
}

/* Sliding-window layers: the staging of a step's window rows and the states captured at
 * block boundaries. */
static engine_status engine_new_window(engine *e, size_t T, char *err, size_t errsz)
{
    const model_hparams *hp = &e->m->hp;
    e->wrow = quant_row_bytes(kvpool_dtype(e->kv), hp->head_dim);
    e->wstage = engine_scratch_alloc(e, T * 2 * (size_t)hp->n_kv_heads * e->wrow);
    e->run0 = xmalloc(T * sizeof *e->run0);
    e->prev_run = xmalloc(T * sizeof *e->prev_run);
    e->n_wsnap_max = (int)(T / KVPOOL_BLOCK) + 16;
    e->wsnap = xcalloc((size_t)e->n_wsnap_max, sizeof *e->wsnap);
    e->wsnap_t = xcalloc((size_t)e->n_wsnap_max, sizeof *e->wsnap_t);
    /* faulted in as states are captured: most steps cross no block boundary */
    e->wsnap_data = calloc((size_t)e->n_wsnap_max, kvpool_window_state_bytes(e->kv));
    if (!e->wstage || !e->wsnap_data) {
        snprintf(err, errsz, "out of memory for the window layers' staging of %zu tokens", T);
        return ENGINE_ERR_NOMEM;
    }
    return ENGINE_OK;
}

/* The activation scratch the largest matmul outside the routed experts needs for T rows. */
static size_t engine_matmul_scratch_bytes(const model *m, int T)
{
    const model_hparams *hp = &m->hp;
    size_t sc = 0;
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &m->layers[il];
        if (hp->mla) {
            const ops_weight *qk[2] = { L->wq_a.data ? &L->wq_a : &L->wq, &L->wkv_a };
            sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(2, qk, T));
            if (L->wq_b.data) sc = engine_scratch_need(&L->wq_b, T, sc);
        } else {
            const ops_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
            sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(3, qkv, T));
        }
        sc = engine_scratch_need(&L->wo, T, sc);
        if (L->gate_shexp.data) {
            const ops_weight *gu[2] = { &L->gate_shexp, &L->up_shexp };
            sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(2, gu, T));
            sc = engine_scratch_need(&L->down_shexp, T, sc);
        }
        if (L->gate_inp.data) {
            sc = engine_scratch_need(&L->gate_inp, T, sc);   /* the experts' own: moe_tmp */
        } else {
            const ops_weight *gu[2] = { &L->gate, &L->up };
            sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(2, gu, T));
            sc = engine_scratch_need(&L->down, T, sc);
        }
    }
    sc = engine_scratch_need(&m->output, T, sc);
    return TM_MAX(sc, engine_qwen35_scratch_bytes(m, T));
}

/* The routed experts: router, grouping of tokens by expert, each thread's chunk scratch, and
 * the per-expert statistics. */
static engine_status engine_new_moe(engine *e, size_t T, int n_threads, char *err, size_t errsz)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    int Ti = (int)T;
    size_t E = (size_t)hp->n_expert, Tk = T * (size_t)hp->n_expert_used;
    e->r_logits = engine_scratch_alloc(e, T * E * sizeof(float));
    e->router = (moe_router){ .gate = hp->router_sigmoid ? MOE_GATE_SIGMOID
                                      : hp->router_logit_topk ? MOE_GATE_SOFTMAX_WEIGHT : MOE_GATE_SOFTMAX,
                              .n_expert = hp->n_expert, .k = hp->n_expert_used, .norm_w = hp->router_norm,
                              .w_scale = hp->router_scale, .n_groups = hp->n_groups,
                              .n_groups_used = hp->n_groups_used };
    e->r_probs = engine_scratch_alloc(e, (size_t)n_threads * MOE_SCRATCH(E) * sizeof(float));
    e->r_idx = engine_scratch_alloc(e, (size_t)n_threads * MOE_SCRATCH(E) * sizeof(int32_t));
    e->r_sel = engine_scratch_alloc(e, Tk * sizeof(int32_t));
    e->r_w = engine_scratch_alloc(e, Tk * sizeof(float));
    e->r_margin = engine_scratch_alloc(e, T * sizeof(float));
    e->x_off = engine_scratch_alloc(e, (E + 1) * sizeof(int32_t));
    e->x_row = engine_scratch_alloc(e, Tk * sizeof(int32_t));
    e->x_tok = engine_scratch_alloc(e, Tk * sizeof(int32_t));
    e->x_act = engine_scratch_alloc(e, E * sizeof(int32_t));
    e->xg = engine_scratch_alloc(e, Tk * (size_t)hp->dim * sizeof(float));
    e->fe = engine_scratch_alloc(e, Tk * (size_t)hp->expert_ffn * sizeof(float));
    e->ye = engine_scratch_alloc(e, Tk * (size_t)hp->dim * sizeof(float));
    /* per thread: gate and up of a chunk (T, ENGINE_MOE_ROWS), then the activation
     * scratch of a chunk's matmul (a view of any rows needs what the whole expert does) */
    size_t msc = 0;
    for (int il = hp->n_dense_lead; il < hp->n_layers; il++) {
        const model_layer *L = &m->layers[il];
        ops_weight g = model_expert(&L->gate_exps, hp->n_expert, 0), u = model_expert(&L->up_exps, hp->n_expert, 0);
        ops_weight d = model_expert(&L->down_exps, hp->n_expert, 0);
        const ops_weight *gu[2] = { &g, &u };
        msc = TM_MAX(msc, ops_matmul_multi_scratch_bytes(2, gu, Ti));
        msc = engine_scratch_need(&d, Ti, msc);
        if (L->gate_shexp.data) {   /* slices of the shared experts, fused into the round */
            const ops_weight *sgu[2] = { &L->gate_shexp, &L->up_shexp };
            msc = TM_MAX(msc, ops_matmul_multi_scratch_bytes(2, sgu, Ti));
            msc = engine_scratch_need(&L->down_shexp, Ti, msc);
        }
    }
    e->moe_tmp_stride = TM_ALIGN_UP(2 * T * ENGINE_MOE_ROWS + (msc + 64) / sizeof(float), 16);
    e->moe_tmp = engine_scratch_alloc(e, (size_t)n_threads * e->moe_tmp_stride * sizeof(float));
    e->stats = engine_moe_stats_new(hp->n_layers, hp->n_expert, ENGINE_MOE_WINDOW);
    if (!e->r_logits || !e->r_probs || !e->r_idx || !e->r_sel || !e->r_w || !e->r_margin || !e->x_off ||
        !e->x_row || !e->x_tok || !e->x_act || !e->xg || !e->fe || !e->ye || !e->moe_tmp || !e->stats) {
        snprintf(err, errsz, "out of memory for the expert buffers of %d tokens", Ti);
        return ENGINE_ERR_NOMEM;
    }
    return ENGINE_OK;
}

/* Multi-head latent attention: the query's low-rank and raw rows, the values, the shared
 * expert's input, and each thread's per-head scratch. */
static engine_status engine_new_mla(engine *e, size_t T, int n_threads, char *err, size_t errsz)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    int Ti = (int)T;
    size_t H = (size_t)hp->n_heads, kq = (size_t)(hp->nope_dim + hp->n_rot), lr = (size_t)hp->kv_lora;
    e->qa = engine_scratch_alloc(e, T * (size_t)TM_MAX(hp->q_lora, 1) * sizeof(float));
    e->qraw = engine_scratch_alloc(e, T * H * kq * sizeof(float));
    e->att_v = engine_scratch_alloc(e, T * H * (size_t)hp->v_dim * sizeof(float));
    e->shx = engine_scratch_alloc(e, T * (size_t)hp->dim * sizeof(float));
    /* per thread: a head's input rows (T, max(nope, kv_lora)), its output rows (T,
     * max(kv_lora, v_dim)), then the activation scratch of its matmul */
    size_t msc = 0;
    for (int il = 0; il < hp->n_layers; il++) {
        ops_weight kb = model_expert(&m->layers[il].wk_b, hp->n_heads, 0);
        ops_weight vb = model_expert(&m->layers[il].wv_b, hp->n_heads, 0);
        msc = engine_scratch_need(&kb, Ti, engine_scratch_need(&vb, Ti, msc));
    }
    e->mla_tmp_stride = TM_ALIGN_UP(T * TM_MAX((size_t)hp->nope_dim, lr) + T * TM_MAX(lr, (size_t)hp->v_dim) +
                                    (msc + 64) / sizeof(float), 16);
    e->mla_tmp = engine_scratch_alloc(e, (size_t)n_threads * e->mla_tmp_stride * sizeof(float));
    if (!e->qa || !e->qraw || !e->att_v || !e->shx || !e->mla_tmp) {
        snprintf(err, errsz, "out of memory for the latent attention buffers of %d tokens", Ti);
        return ENGINE_ERR_NOMEM;
    }
    return ENGINE_OK;
}

/* Every activation of a step of T tokens, the matmul and attention scratch, and the
 * family's own buffers (window staging, linear attention, MTP input, experts, MLA). */
static engine_status engine_new_buffers(engine *e, const engine_opts *o, char *err, size_t errsz)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    engine_status st;
    size_t T = (size_t)o->max_batch_tokens;
    int Ti = (int)T;
    size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    e->x = engine_scratch_alloc(e, T * hp->dim * sizeof(float));
    e->xn = engine_scratch_alloc(e, T * hp->dim * sizeof(float));
    e->q = engine_scratch_alloc(e, T * qd * sizeof(float));
    e->k = engine_scratch_alloc(e, T * kvd * sizeof(float));
    e->v = engine_scratch_alloc(e, T * kvd * sizeof(float));
    e->att = engine_scratch_alloc(e, T * qd * sizeof(float));
    /* dense layers: ffn_dim; shared experts: n_shared * expert_ffn; routed experts use fe */
    size_t ffn = hp->n_expert > 0 && hp->n_dense_lead == 0 ? 1 : (size_t)hp->ffn_dim;
    ffn = TM_MAX(ffn, (size_t)hp->n_shared * (size_t)hp->expert_ffn);
    e->ffa = engine_scratch_alloc(e, T * ffn * sizeof(float));
    e->ffb = engine_scratch_alloc(e, T * ffn * sizeof(float));
    e->xo = engine_scratch_alloc(e, T * hp->dim * sizeof(float));
    e->pos = engine_scratch_alloc(e, T * sizeof(int32_t));
    if (kvpool_n_window_layers(e->kv) > 0 && (st = engine_new_window(e, T, err, errsz)) != ENGINE_OK) return st;

    size_t sc = engine_matmul_scratch_bytes(m, Ti);
    if (hp->n_recurrent > 0 && !(e->q35 = engine_qwen35_new(m, Ti, o->n_threads))) {
        snprintf(err, errsz, "out of memory for the linear-attention buffers of %d tokens", Ti);
        return ENGINE_ERR_NOMEM;
    }
    if (m->mtp_view) {
        sc = engine_scratch_need(&m->layers[0].eh_proj, Ti, sc);
        e->mtp_cat = engine_scratch_alloc(e, T * 2 * (size_t)hp->dim * sizeof(float));
        if (!e->mtp_cat) {
            snprintf(err, errsz, "out of memory for the MTP input of %d tokens", Ti);
            return ENGINE_ERR_NOMEM;
        }
    }
    e->mm_scratch = engine_scratch_alloc(e, sc + 64);
    /* per thread: K and V block in f32 and K transposed (3 * 128 * hd), and for the tile's
     * query rows (att_tile * gqa, rounded up to 16): queries transposed and accumulators (hd
     * each), scores (128), max, sum and causal limit (3); the per-key path needs less */
    int gqa = hp->n_heads / hp->n_kv_heads;
    e->att_tile = TM_MAX(1, TM_MIN(ENGINE_ATT_TILE_MAX, ENGINE_ATT_ROWS / gqa));
    size_t hdz = (size_t)hp->head_dim;
    size_t nqp = TM_ALIGN_UP((size_t)e->att_tile * (size_t)gqa, 16);
    e->att_stride = TM_ALIGN_UP(3 * KVPOOL_BLOCK * hdz + nqp * (2 * hdz + KVPOOL_BLOCK + 3), 16);
    e->att_scratch = engine_scratch_alloc(e, (size_t)o->n_threads * e->att_stride * sizeof(float));
    e->tile_start = engine_scratch_alloc(e, (T + 1) * sizeof(int32_t));
    if (!e->tile_start || !e->x || !e->xn || !e->q || !e->k || !e->v || !e->att || !e->ffa || !e->ffb || !e->xo ||
        !e->pos || !e->mm_scratch || !e->att_scratch) {
        snprintf(err, errsz, "out of memory for activations of %d tokens", Ti);
        return ENGINE_ERR_NOMEM;
    }
    if (hp->n_expert > 0 && (st = engine_new_moe(e, T, o->n_threads, err, errsz)) != ENGINE_OK) return st;
    if (hp->mla) return engine_new_mla(e, T, o->n_threads, err, errsz);
    if (hp->n_shared > 0) e->shx = engine_scratch_alloc(e, T * (size_t)hp->dim * sizeof(float));
    return ENGINE_OK;
}

engine_status engine_new(model *m, const engine_opts *opts, engine **out, char *err, size_t errsz)
{
    *out = NULL;
    engine_opts o = opts ? *opts : (engine_opts){ 0 };
    const model_hparams *hp = &m->hp;
    if (o.n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        o.n_threads = nc > 0 ? (int)nc : 1;
        o.cpus = NULL;
    }
    if (o.max_batch_tokens <= 0) o.max_batch_tokens = 512;
    if (hp->n_heads / hp->n_kv_heads > ENGINE_ATT_GQA_MAX) {
        snprintf(err, errsz, "%d query heads per kv head: at most %d are supported", hp->n_heads / hp->n_kv_heads,
                 ENGINE_ATT_GQA_MAX);
        return ENGINE_ERR_ARG;
    }
    engine *e = xcalloc(1, sizeof *e);
    e->m = m;
    e->max_tokens = o.max_batch_tokens;
    e->n_threads = o.n_threads;
    e->tp = threadpool_new_pinned(o.n_threads, o.cpus);
    if (!e->tp) {
        snprintf(err, errsz, "cannot start %d kernel threads", o.n_threads);
        engine_free(e);
        return ENGINE_ERR_NOMEM;
    }
    int n_blocks = 0;
    engine_status st = engine_new_kv(e, &o, &n_blocks, err, errsz);
    if (st == ENGINE_OK && hp->bidirectional) {
        e->bert = engine_bert_new(m, e->tp, o.max_batch_tokens);
        e->x = engine_scratch_alloc(e, (size_t)o.max_batch_tokens * hp->dim * sizeof(float));
        if (!e->bert || !e->x) {
            snprintf(err, errsz, "out of memory for the encoder's buffers of %d tokens", o.max_batch_tokens);
            st = ENGINE_ERR_NOMEM;
        }
    } else if (st == ENGINE_OK && hp->arch == MODEL_ARCH_DEEPSEEK4) {
        e->dsv4 = engine_dsv4_new(m, e->tp, e->kv, o.max_batch_tokens, n_blocks * KVPOOL_BLOCK, err, errsz);
        e->x = engine_scratch_alloc(e, (size_t)o.max_batch_tokens * hp->dim * sizeof(float));
        if (!e->dsv4 || !e->x) st = ENGINE_ERR_NOMEM;
    } else if (st == ENGINE_OK) {
        st = engine_new_buffers(e, &o, err, errsz);
    }
    if (st != ENGINE_OK) {
        engine_free(e);
        return st;
    }
    *out = e;
    return ENGINE_OK;
}

/* Everything between the Q/K/V projections and attention, row by row, in one pool round (the
 * rows of a thread: a contiguous share of the batch): q/k/v += bias (qwen2), RMS norm of each
 * q and k head (qwen3), RoPE of q and k, and K/V into the pool. Per row the same arithmetic as
 * the separate ops, whatever the split; one round instead of up to six keeps a short step's
 * threads from meeting at that many barriers. */
static void engine_job_qkv_post(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[j->layer];
    const int T = j->b->n_tokens, hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth), n = t1 - t0;
    if (n <= 0) return;
    float *q = e->q + (size_t)t0 * qd, *k = e->k + (size_t)t0 * kvd, *v = e->v + (size_t)t0 * kvd;
    if (L->bq)
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < qd; i++) q[(size_t)t * qd + i] += L->bq[i];
            for (int i = 0; i < kvd; i++) k[(size_t)t * kvd + i] += L->bk[i];
            for (int i = 0; i < kvd; i++) v[(size_t)t * kvd + i] += L->bv[i];
        }
    if (L->q_norm) {
        ops_rmsnorm(NULL, q, q, L->q_norm, n * hp->n_heads, hd, hp->rms_eps);
        ops_rmsnorm(NULL, k, k, L->k_norm, n * hp->n_kv_heads, hd, hp->rms_eps);
    }
    /* gemma3: window layers rotate with their own base and no frequency scaling */
    const bool rope_swa = hp->rope_theta_scale_swa != 0.0f && L->window > 0;
    const float theta = rope_swa ? hp->rope_theta_scale_swa : hp->rope_theta_scale, fscale = rope_swa ? 1.0f : hp->rope_freq_scale;
    ops_rope_ggml(NULL, q, e->pos + t0, n, hp->n_heads, hd, hp->n_rot, hp->rope_neox, theta,
                  fscale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
    ops_rope_ggml(NULL, k, e->pos + t0, n, hp->n_kv_heads, hd, hp->n_rot, hp->rope_neox, theta,
                  fscale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
    if (hp->attn_temp_scale != 0.0f)   /* mistral3: Llama 4's temperature, as llama.cpp's inp_attn_scale */
        for (int t = 0; t < n; t++) {
            float s = (float)(log(floorf((float)e->pos[t0 + t] / (float)hp->attn_temp_floor) + 1.0) * hp->attn_temp_scale + 1.0);
            ops_vec_scale_f32(qd, q + (size_t)t * qd, s);
        }
    if (e->rot_k) {
        ops_hadamard_rows(q, (int64_t)n * qd / e->rot_k, e->rot_k);
        ops_hadamard_rows(k, (int64_t)n * kvd / e->rot_k, e->rot_k);
        ops_hadamard_rows(v, (int64_t)n * kvd / e->rot_v, e->rot_v);
    }
    if (kvpool_layer_block_index(e->kv, j->layer) < 0) {   /* a window layer: staged (engine_window_commit) */
        const qtype dt = kvpool_dtype(e->kv);
        const int nkv = hp->n_kv_heads;
        for (int t = t0; t < t1; t++) {
            uint8_t *dk = e->wstage + (size_t)t * 2 * nkv * e->wrow, *dv = dk + nkv * e->wrow;
            for (int h = 0; h < nkv; h++) {
                kvpool_row_put(dt, e->k + (size_t)t * kvd + (size_t)h * hd, dk + (size_t)h * e->wrow, hd);
                kvpool_row_put(dt, e->v + (size_t)t * kvd + (size_t)h * hd, dv + (size_t)h * e->wrow, hd);
            }
        }
        return;
    }
    for (int t = t0; t < t1; t++) {
        const engine_tok *tk = &j->b->toks[t];
        if (tk->pos < kvpool_seq_full_from(tk->seq)) continue;   /* replayed: its blocks hold it */
        for (int h = 0; h < hp->n_kv_heads; h++)
            kvpool_seq_store(e->kv, tk->seq, tk->pos, j->layer, h, e->k + (size_t)t * kvd + (size_t)h * hd,
                             e->v + (size_t)t * kvd + (size_t)h * hd);
    }
}

static int engine_run_end(const engine_batch *b, int t);

/* ---- window layers ----------------------------------------------------------------------
 * A window layer's K/V of a step are staged (engine_job_qkv_post); a query of entry t reads a
 * key at pk from the staging when pk is in its own run (the step's positions of its sequence),
 * else from the sequence's ring, which holds the positions before the run. After the layer's
 * attention, engine_window_commit captures the states this step crossed and moves the staged
 * rows into the rings. So a ring needs the window only, however long a prefill chunk. */
static const uint8_t *engine_win_row(const engine *e, const engine_batch *b, int layer, int t, int pk, int kv, int kvh)
{
    for (int r0 = e->run0[t];; r0 = e->prev_run[r0]) {   /* this run, then the sequence's earlier ones */
        int p0 = b->toks[r0].pos;
        if (pk >= p0)
            return e->wstage + (((size_t)(r0 + pk - p0) * 2 + (size_t)kv) * (size_t)e->m->hp.n_kv_heads + (size_t)kvh) * e->wrow;
        if (e->prev_run[r0] < 0) break;
    }
    return kvpool_seq_ring_row(e->kv, b->toks[t].seq, layer, kv, kvh, pk);
}

/* After a window layer's attention (the caller's thread): first the states at the block ends
 * planned for this step (engine_window_plan), from staging or ring, then the run's last ring_len
 * staged rows into the ring. */
static void engine_window_commit(engine *e, const engine_batch *b, int layer)
{
    const kvpool *kv = e->kv;
    const int nkv = e->m->hp.n_kv_heads, W = kvpool_window(kv), wl = -1 - kvpool_layer_block_index(kv, layer);
    const int R = W + KVPOOL_RING_SPARE;
    const size_t sb = kvpool_window_state_bytes(kv), lb = sb / (size_t)kvpool_n_window_layers(kv);
    for (int i = 0; i < e->n_wsnap; i++) {
        const engine_window_state *ws = &e->wsnap[i];
        int t = e->wsnap_t[i];
        uint8_t *dst = e->wsnap_data + (size_t)i * sb + (size_t)wl * lb;
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < nkv; h++)
                for (int r = 0; r < W; r++, dst += e->wrow)
                    memcpy(dst, engine_win_row(e, b, layer, t, ws->end - W + r, k, h), e->wrow);
    }
    for (int t = 0; t < b->n_tokens;) {
        int r = engine_run_end(b, t), p0 = b->toks[t].pos, p1 = b->toks[r - 1].pos;
        for (int pk = TM_MAX(p0, p1 + 1 - R); pk <= p1; pk++)
            for (int k = 0; k < 2; k++)
                for (int h = 0; h < nkv; h++)
                    memcpy(kvpool_seq_ring_row(kv, b->toks[t].seq, layer, k, h, pk), engine_win_row(e, b, layer, t, pk, k, h),
                           e->wrow);
        if (wl == kvpool_n_window_layers(kv) - 1) kvpool_seq_set_ring_next(b->toks[t].seq, p1 + 1);
        t = r;
    }
}

/* Before a step of a model with window layers: the runs (run0) and each sequence's chain of
 * runs (prev_run): a sequence may come in several runs, in batch order at consecutive
 * positions (the ring holds what precedes the first); and the states to capture: every block
 * end a run crosses at which the window state is exact (kvpool_seq_exact_from). false: a
 * sequence's runs out of order or with a gap. */
static bool engine_window_plan(engine *e, const engine_batch *b)
{
    const int W = kvpool_window(e->kv);
    e->n_wsnap = 0;
    for (int t = 0; t < b->n_tokens;) {
        int r = engine_run_end(b, t), p0 = b->toks[t].pos, p1 = b->toks[r - 1].pos;
        kvpool_seq *sq = b->toks[t].seq;
        for (int u = t; u < r; u++) e->run0[u] = t;
        e->prev_run[t] = -1;
        for (int u = t - 1; u >= 0; u--)
            if (b->toks[u].seq == sq) {   /* the end of the sequence's previous run */
                if (b->toks[u].pos != p0 - 1) return false;
                e->prev_run[t] = e->run0[u];
                break;
            }
        /* its first run may go back a few positions (a rejected draft), not further: the ring
         * has moved on */
        if (e->prev_run[t] < 0 && p0 + KVPOOL_RING_SPARE < kvpool_seq_ring_next(sq)) return false;
        for (int end = (p0 / KVPOOL_BLOCK + 1) * KVPOOL_BLOCK; end <= p1 + 1; end += KVPOOL_BLOCK) {
            if (end < W || end < kvpool_seq_exact_from(sq)) continue;
            if (e->n_wsnap == e->n_wsnap_max) {
                e->n_wsnap_dropped++;
                continue;
            }
            e->wsnap_t[e->n_wsnap] = t;
            e->wsnap[e->n_wsnap] = (engine_window_state){ .seq = sq, .end = end,
                .state = e->wsnap_data + (size_t)e->n_wsnap * kvpool_window_state_bytes(e->kv) };
            e->n_wsnap++;
        }
        t = r;
    }
    return true;
}

int engine_window_states(const engine *e, const engine_window_state **out)
{
    *out = e->wsnap;
    return e->wsnap ? e->n_wsnap : 0;
}

/* A row-by-row job (each thread takes a contiguous share of the batch rows, the arithmetic of
 * a row does not depend on the share) over `elems` floats of work: on the step thread alone
 * when that is below ENGINE_INLINE_ELEMS, where waking the pool and meeting at its end costs
 * more than the work (a decode step's few rows), else as a pool round. Same bits either way. */
#define ENGINE_INLINE_ELEMS 8192
static void engine_run_rows(engine *e, void (*fn)(void *, int, int), engine_job *job, int64_t elems)
{
    if (elems <= ENGINE_INLINE_ELEMS) fn(job, 0, 1);
    else threadpool_run(e->tp, fn, job);
}

/* x += xn (xn += j->bias first, if any), then (j->norm) xn = rmsnorm(x) * j->norm, the next
 * sublayer's input, row by row (engine_run_rows). */
static void engine_job_add_norm(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int T = j->b->n_tokens, dim = e->m->hp.dim;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth);
    if (t1 <= t0) return;
    float *x = e->x + (size_t)t0 * dim, *xn = e->xn + (size_t)t0 * dim;
    if (j->bias)   /* ggml: (W x + b), then the residual add */
        for (int t = 0; t < t1 - t0; t++) ops_add(NULL, xn + (size_t)t * dim, j->bias, dim);
    ops_add(NULL, x, xn, (int64_t)(t1 - t0) * dim);
    if (j->norm) ops_rmsnorm(NULL, xn, x, j->norm, t1 - t0, dim, e->m->hp.rms_eps);
}

/* Attention. An item is (tile, kv head): a tile is a run of consecutive batch
 * entries of one sequence at consecutive positions (a prefill run; a decode token is a tile of
 * one), and the item covers the gqa query heads that share the kv head: nq = tile * gqa query
 * rows, which share every K/V row read.
 *
 * Batch invariance: the arithmetic of one query row depends only on its sequence's K/V and its
 * own position, never on the tile or the step it is computed in (its size, the other
 * sequences, the thread count), so that a sequence's logits are bit-identical however the
 * scheduler batches it. Hence ONE path per engine, chosen from the model and the KV dtype:
 *  - tiled (head size a multiple of 16, or an F32 cache): per 128-position block (K and V
 *    converted to f32 once for all the item's rows), ops_att_block: P = Q K^T with the
 *    queries in SIMD lanes, scale, causal cut, online softmax per row over the block,
 *    acc += P V, all f32. The arithmetic is that of ggml's CPU
 *    flash-attention path for steps of 64+ tokens (prompt processing agrees with llama.cpp
 *    to ~1e-6); its decode steps take ggml's one-query path instead (below), so single-token
 *    steps differ from llama.cpp's by f16 rounding (as llama.cpp differs from itself between
 *    a prompt in one batch and token by token);
 *  - per key (F16 cache and a head size that is not a multiple of 16, where ggml has only
 *    this path): Q rounded to f16, s = f16 dot, online softmax key by key, V accumulated in
 *    an f16 accumulator (rounded after every update), divided by the sum at the end. ggml's
 *    split of the keys over its threads for long single-token steps is not mirrored (it
 *    would make a query's result depend on the step and the thread count). */
/* The first key that the rows of an item (nt positions from pos) see: 0, or for a window
 * layer (whose items are single positions) the start of the window. */
static int engine_att_lo(const engine_job *j, int pos, int nt, const kvpool_seq *seq)
{
    int w = model_layer_window(j->e->m, j->layer);
    return w > 0 ? TM_MAX(kvpool_seq_win_lo(seq), pos + nt - w) : 0;
}

/* Attention sinks (gpt-oss): one more logit per head in the softmax denominator, with no
 * value, applied after the keys as ggml's flash attention does: a sink above the running max
 * rescales the accumulator and the sum. Rows r of kv head kvh are query heads
 * kvh * gqa + r % gqa. */
static void engine_att_sinks(const engine_job *j, int kvh, int nq, float *M, float *S, float *acc)
{
    const model_hparams *hp = &j->e->m->hp;
    const float *sinks = j->e->m->layers[j->layer].sinks;
    if (!sinks) return;
    const int gqa = hp->n_heads / hp->n_kv_heads, hd = hp->head_dim;
    for (int r = 0; r < nq; r++) {
        float s = sinks[kvh * gqa + r % gqa], ms = 1.0f, vs = 1.0f;
        if (s > M[r]) {
            ms = expf(M[r] - s);
            M[r] = s;
            ops_vec_scale_f32(hd, acc + (size_t)r * hd, ms);
        } else {
            vs = expf(s - M[r]);
        }
        S[r] = S[r] * ms + vs;
    }
}

static void engine_att_per_key(engine_job *j, float *sc, int t0, int nt, int kvh)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int hd = hp->head_dim, gqa = hp->n_heads / hp->n_kv_heads, qd = hp->n_heads * hd;
    const int nq = nt * gqa, nqmax = e->att_tile * gqa;
    const float scale = hp->att_scale;
    const engine_tok *tk0 = &j->b->toks[t0];
    float *acc = sc;                               /* (nq, hd) accumulators, f16 values */
    float *MS = acc + (size_t)nqmax * hd;          /* (nq, 2) running max and sum */
    fp16_t *q16 = (fp16_t *)(MS + 2 * (size_t)nqmax); /* (nq, hd) */
    fp16_t *tmp = q16 + (size_t)nqmax * hd;        /* (hd) */
    for (int r = 0; r < nq; r++) {
        int jt = r / gqa, g = r % gqa;
        ops_fp32_to_fp16_row(e->q + (size_t)(t0 + jt) * qd + (size_t)(kvh * gqa + g) * hd, q16 + (size_t)r * hd, hd);
    }
    int n_ctx = tk0->pos + nt;
    /* no split of the keys over threads (ggml's long single-token steps): the arithmetic of a
     * query depends only on its own position, never on the step it is in */
    for (int r = 0; r < nq; r++) {
        MS[2 * r] = -INFINITY;
        MS[2 * r + 1] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    const bool win = e->wstage && kvpool_layer_block_index(e->kv, j->layer) < 0;
    for (int pk = engine_att_lo(j, tk0->pos, nt, tk0->seq); pk < n_ctx; pk++) {
        const fp16_t *kr, *vr;
        if (win) {
            kr = (const fp16_t *)engine_win_row(e, j->b, j->layer, t0, pk, 0, kvh);
            vr = (const fp16_t *)engine_win_row(e, j->b, j->layer, t0, pk, 1, kvh);
        } else {
            const fp16_t *K = kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->layer, 0, kvh);
            const fp16_t *V = kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->layer, 1, kvh);
            kr = K + (size_t)(pk % KVPOOL_BLOCK) * hd;
            vr = V + (size_t)(pk % KVPOOL_BLOCK) * hd;
        }
        for (int r = 0; r < nq; r++) {
            if (pk > tk0->pos + r / gqa) continue;  /* causal */
            float *a = acc + (size_t)r * hd;
            float s = ops_vec_dot_f16(hd, kr, q16 + (size_t)r * hd) * scale;
            float M = MS[2 * r], ms = 1.0f, vs = 1.0f;
            if (s > M) {
                MS[2 * r] = s;
                ms = expf(M - s);
                ops_vec_scale_f32(hd, a, ms);
                ops_fp32_to_fp16_row(a, tmp, hd);
                ops_fp16_to_fp32_row(tmp, a, hd);
            } else {
                vs = expf(s - M);
            }
            ops_vec_mad_f16(hd, a, vr, vs);
            ops_fp32_to_fp16_row(a, tmp, hd);
            ops_fp16_to_fp32_row(tmp, a, hd);
            MS[2 * r + 1] = MS[2 * r + 1] * ms + vs;
        }
    }
    if (e->m->layers[j->layer].sinks) {
        const float *sinks = e->m->layers[j->layer].sinks;
        for (int r = 0; r < nq; r++) {   /* ggml's one-query path: after the f16 accumulator */
            float s = sinks[kvh * gqa + r % gqa], M = MS[2 * r], ms = 1.0f, vs = 1.0f;
            if (s > M) {
                ms = expf(M - s);
                ops_vec_scale_f32(hd, acc + (size_t)r * hd, ms);
            } else {
                vs = expf(s - M);
            }
            MS[2 * r + 1] = MS[2 * r + 1] * ms + vs;
        }
    }
    for (int r = 0; r < nq; r++) {
        int jt = r / gqa, g = r % gqa;
        float *o = e->att + (size_t)(t0 + jt) * qd + (size_t)(kvh * gqa + g) * hd;
        float S = MS[2 * r + 1], inv = S == 0.0f ? 0.0f : 1.0f / S;
        const float *a = acc + (size_t)r * hd;
        for (int d = 0; d < hd; d++) o[d] = a[d] * inv;
    }
}

/* A quantised cache (ggml's one-query path for non-F16 K/V): each query row quantised to
 * Q8_0, s = integer dot with the key row (ops_vec_dot_kv), online softmax key by key, the
 * value row dequantised and accumulated in f32 (acc = acc * ms + vs * v), sinks after the
 * keys, divided by the sum at the end. A row's arithmetic depends only on its own query and
 * keys: batch invariant like the other paths. */
static void engine_att_per_key_q(engine_job *j, float *sc, int t0, int nt, int kvh)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int hd = hp->head_dim, gqa = hp->n_heads / hp->n_kv_heads, qd = hp->n_heads * hd;
    const int nq = nt * gqa, nqmax = e->att_tile * gqa;
    const qtype dt = kvpool_dtype(e->kv);
    const size_t row = quant_row_bytes(dt, hd), qrow = quant_row_bytes(QTYPE_Q8_0, hd);
    const engine_tok *tk0 = &j->b->toks[t0];
    float *acc = sc;                               /* (nq, hd) accumulators */
    float *M = acc + (size_t)nqmax * hd;           /* (nq) running max */
    float *S = M + nqmax;                          /* (nq) running sum */
    float *vf = S + nqmax;                         /* (hd) the value row in f32 */
    uint8_t *q8 = (uint8_t *)(vf + hd);            /* (nq) query rows in Q8_0 */
    for (int r = 0; r < nq; r++) {
        quant_act_q8_0(e->q + (size_t)(t0 + r / gqa) * qd + (size_t)(kvh * gqa + r % gqa) * hd,
                       (block_q8_0 *)(q8 + (size_t)r * qrow), hd);
        M[r] = -INFINITY;
        S[r] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    const int n_ctx = tk0->pos + nt;
    const bool win = e->wstage && kvpool_layer_block_index(e->kv, j->layer) < 0;
    for (int pk = engine_att_lo(j, tk0->pos, nt, tk0->seq); pk < n_ctx; pk++) {
        const uint8_t *kr, *vr;
        if (win) {
            kr = engine_win_row(e, j->b, j->layer, t0, pk, 0, kvh);
            vr = engine_win_row(e, j->b, j->layer, t0, pk, 1, kvh);
        } else {
            kr = (const uint8_t *)kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->layer, 0, kvh) +
                 (size_t)(pk % KVPOOL_BLOCK) * row;
            vr = (const uint8_t *)kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->layer, 1, kvh) +
                 (size_t)(pk % KVPOOL_BLOCK) * row;
        }
        bool have_v = false;
        for (int r = 0; r < nq; r++) {
            if (pk > tk0->pos + r / gqa) continue;   /* causal */
            float s = ops_vec_dot_kv(dt, hd, kr, (const block_q8_0 *)(q8 + (size_t)r * qrow)) * hp->att_scale;
            float *a = acc + (size_t)r * hd, ms = 1.0f, vs = 1.0f;
            if (s > M[r]) {
                ms = expf(M[r] - s);
                M[r] = s;
                ops_vec_scale_f32(hd, a, ms);
            } else {
                vs = expf(s - M[r]);
            }
            if (!have_v) {
                quant_dequantize_row(dt, vr, vf, hd);
                have_v = true;
            }
            ops_vec_mad_f32(hd, a, vf, vs);
            S[r] = S[r] * ms + vs;
        }
    }
    engine_att_sinks(j, kvh, nq, M, S, acc);
    for (int r = 0; r < nq; r++) {
        float *o = e->att + (size_t)(t0 + r / gqa) * qd + (size_t)(kvh * gqa + r % gqa) * hd;
        float inv = S[r] == 0.0f ? 0.0f : 1.0f / S[r];
        const float *ar = acc + (size_t)r * hd;
        for (int d = 0; d < hd; d++) o[d] = ar[d] * inv;
        if (e->rot_v) ops_hadamard_rows(o, hd / e->rot_v, e->rot_v);   /* back from V's rotation */
    }
}

_Static_assert(KVPOOL_BLOCK <= OPS_ATT_KT_KEYS, "a pool block fits the attention kernels' kt scratch");

static void engine_att_tiled(engine_job *j, float *sc, int t0, int nt, int kvh)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int hd = hp->head_dim, gqa = hp->n_heads / hp->n_kv_heads, qd = hp->n_heads * hd;
    const int nq = nt * gqa, nqp = TM_ALIGN_UP(nq, 16);
    const bool f16 = kvpool_dtype(e->kv) == QTYPE_F16;
    const engine_tok *tk0 = &j->b->toks[t0];
    float *Kf = sc;                                   /* (128, hd) K block in f32 */
    float *Vf = Kf + (size_t)KVPOOL_BLOCK * hd;       /* (128, hd) V block in f32 */
    float *qt = Vf + (size_t)KVPOOL_BLOCK * hd;       /* (hd, nqp) queries, transposed */
    float *acc = qt + (size_t)hd * nqp;               /* (nq, hd) running P V */
    float *st = acc + (size_t)nqp * hd;               /* (128, nqp) scores, probabilities */
    float *M = st + (size_t)KVPOOL_BLOCK * nqp;       /* (nq) running max */
    float *S = M + nqp;                               /* (nq) running sum */
    int32_t *lim = (int32_t *)(S + nqp);              /* (nq) keys of the block each row sees */
    float *kt = (float *)(lim + nqp);                 /* (hd, 128) K block transposed (kernel's) */
    /* qt row by row (contiguous stores; the query rows are read across, from L2) */
    const float *qrow[TM_MAX(ENGINE_ATT_ROWS, ENGINE_ATT_GQA_MAX)];   /* nq <= max(256, gqa) */
    for (int r = 0; r < nq; r++) qrow[r] = e->q + (size_t)(t0 + r / gqa) * qd + (size_t)(kvh * gqa + r % gqa) * hd;
    for (int d = 0; d < hd; d++) {
        float *row = qt + (size_t)d * nqp;
        for (int r = 0; r < nq; r++) row[r] = qrow[r][d];
        for (int r = nq; r < nqp; r++) row[r] = 0.0f;  /* pad lanes */
    }
    for (int r = 0; r < nq; r++) {
        M[r] = -INFINITY;
        S[r] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    int n_ctx = tk0->pos + nt;  /* positions the last row sees */
    /* a window layer's item is one position (engine_job_attention): its first key lo, and each
     * block's keys from there on (skipped keys would only add exact zeros) */
    const int lo = engine_att_lo(j, tk0->pos, nt, tk0->seq);
    const bool win = e->wstage && kvpool_layer_block_index(e->kv, j->layer) < 0;
    ops_att_block_args a = { .hd = hd, .nq = nq, .nqp = nqp, .scale = hp->att_scale, .qt = qt,
                             .lim = lim, .st = st, .m = M, .s = S, .acc = acc, .kt = kt };
    for (int bi = lo / KVPOOL_BLOCK; bi * KVPOOL_BLOCK < n_ctx; bi++) {
        int k0 = TM_MAX(0, lo - bi * KVPOOL_BLOCK), nb = TM_MIN(KVPOOL_BLOCK, n_ctx - bi * KVPOOL_BLOCK) - k0;
        if (win) {   /* the same keys and blocks as if in the pool, gathered from staging and ring */
            for (int r = 0; r < nb; r++) {
                int pk = bi * KVPOOL_BLOCK + k0 + r;
                const void *kr = engine_win_row(e, j->b, j->layer, t0, pk, 0, kvh);
                const void *vr = engine_win_row(e, j->b, j->layer, t0, pk, 1, kvh);
                if (f16) {
                    ops_fp16_to_fp32_row(kr, Kf + (size_t)r * hd, hd);
                    ops_fp16_to_fp32_row(vr, Vf + (size_t)r * hd, hd);
                } else {
                    memcpy(Kf + (size_t)r * hd, kr, (size_t)hd * sizeof(float));
                    memcpy(Vf + (size_t)r * hd, vr, (size_t)hd * sizeof(float));
                }
            }
            a.k = Kf;
            a.v = Vf;
            a.nb = nb;
            for (int r = 0; r < nq; r++)
                lim[r] = TM_MAX(0, TM_MIN(nb, tk0->pos + r / gqa + 1 - bi * KVPOOL_BLOCK - k0));
            ops_att_block(&a);
            continue;
        }
        const void *K = kvpool_seq_slab(e->kv, tk0->seq, bi, j->layer, 0, kvh);
        const void *V = kvpool_seq_slab(e->kv, tk0->seq, bi, j->layer, 1, kvh);
        size_t esz = f16 ? sizeof(fp16_t) : sizeof(float);
        K = (const char *)K + (size_t)k0 * hd * esz;
        V = (const char *)V + (size_t)k0 * hd * esz;
        a.k = K;
        a.v = V;
        if (f16) {
            ops_fp16_to_fp32_row(K, Kf, (int64_t)nb * hd);
            if (V != K) ops_fp16_to_fp32_row(V, Vf, (int64_t)nb * hd);   /* a latent pool: V is K */
            a.k = Kf;
            a.v = V != K ? Vf : Kf;
        }
        a.nb = nb;
        for (int r = 0; r < nq; r++)
            lim[r] = TM_MAX(0, TM_MIN(nb, tk0->pos + r / gqa + 1 - bi * KVPOOL_BLOCK - k0));
        ops_att_block(&a);
    }
    engine_att_sinks(j, kvh, nq, M, S, acc);
    for (int r = 0; r < nq; r++) {
        int jt = r / gqa, g = r % gqa;
        float *o = e->att + (size_t)(t0 + jt) * qd + (size_t)(kvh * gqa + g) * hd;
        float inv = S[r] > 0 ? 1.0f / S[r] : 0.0f;
        const float *ar = acc + (size_t)r * hd;
        for (int d = 0; d < hd; d++) o[d] = ar[d] * inv;
    }
}

/* The end of the run of batch entries from t: one sequence at consecutive positions. */
static int engine_run_end(const engine_batch *b, int t)
{
    int r = t + 1;
    while (r < b->n_tokens && b->toks[r].seq == b->toks[t].seq && b->toks[r].pos == b->toks[r - 1].pos + 1) r++;
    return r;
}

/* Cuts the batch into attention tiles (e->tile_start): each run of one sequence at
 * consecutive positions into equal pieces of at most `tile` positions, tile = att_tile halved
 * (down to ENGINE_ATT_TILE_MIN) while the step would have fewer than two items per thread. */
static void engine_plan_tiles(engine *e, const engine_batch *b)
{
    const int T = b->n_tokens, nkv = e->m->hp.n_kv_heads;
    int tile = e->att_tile;
    for (;;) {
        int items = 0;
        for (int t = 0; t < T;) {
            int r = engine_run_end(b, t);
            items += (r - t + tile - 1) / tile * nkv;
            t = r;
        }
        if (items >= 2 * e->n_threads || tile <= ENGINE_ATT_TILE_MIN) break;
        tile = TM_MAX(ENGINE_ATT_TILE_MIN, tile / 2);
    }
    e->n_tiles = 0;
    for (int t = 0; t < T;) {
        int r = engine_run_end(b, t);
        int pieces = (r - t + tile - 1) / tile, len = r - t;
        for (int k = 0; k < pieces; k++) e->tile_start[e->n_tiles++] = t + (int)((int64_t)len * k / pieces);
        t = r;
    }
    e->tile_start[e->n_tiles] = T;
}

static void engine_job_attention(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int nkv = e->m->hp.n_kv_heads;
    float *sc = e->att_scratch + (size_t)ith * e->att_stride;
    (void)nth;
    for (;;) {
        int it = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (it >= j->n_items) break;
        int tile = it / nkv, kvh = it % nkv;
        /* a window layer's items are single positions (each has its own first key) */
        int t0 = j->win ? tile : e->tile_start[tile], nt = j->win ? 1 : e->tile_start[tile + 1] - t0;
        if (j->q8) engine_att_per_key_q(j, sc, t0, nt, kvh);
        else if (j->q16) engine_att_per_key(j, sc, t0, nt, kvh);
        else engine_att_tiled(j, sc, t0, nt, kvh);
    }
}

/* ---- mixture of experts -----------------------------------------------------------------
 * A MoE FFN in four stages: the router matmul for the whole step, routing token by token
 * (moe.h: llama.cpp's softmax, argsort and renormalisation), the (token, slot) pairs grouped
 * by expert (counting sort: ascending expert, then batch order) with their inputs gathered
 * into xg, then per active expert one gate/up matmul over its rows, SwiGLU and the down
 * matmul into ye (its weights are read once per step, only for the experts some token
 * chose), and the sum per token of weight * output in slot order (llama.cpp's order: e0*w0,
 * then + e1*w1, ...). Every output row depends only on its own token's input: the matmuls
 * compute a row's dots alike whatever the rows beside it, so batch and thread-count
 * invariance hold as for the dense FFN. */
static void engine_job_route(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int T = j->b->n_tokens, E = hp->n_expert, k = hp->n_expert_used;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth);
    float *fs = e->r_probs + (size_t)ith * MOE_SCRATCH(E);
    int32_t *is = e->r_idx + (size_t)ith * MOE_SCRATCH(E);
    const float *bias = e->m->layers[j->layer].exp_probs_b, *lb = e->m->layers[j->layer].gate_inp_b;
    if (lb)   /* the router's own bias on its logits (gpt-oss) */
        for (int t = t0; t < t1; t++) ops_add(NULL, e->r_logits + (size_t)t * E, lb, E);
    for (int t = t0; t < t1; t++) {
        float mg = moe_route(&e->router, e->r_logits + (size_t)t * E, bias, fs, is, e->r_sel + (size_t)t * k,
                             e->r_w + (size_t)t * k);
        if (mg < e->r_margin[t]) e->r_margin[t] = mg;
    }
}

/* x_off, x_row, x_tok and the active experts x_act from r_sel (the caller's thread; T * k
 * entries). */
static void engine_moe_group(engine *e, int T)
{
    const int E = e->m->hp.n_expert, k = e->m->hp.n_expert_used, n = T * k;
    int32_t *off = e->x_off, *cur = e->r_idx;   /* cur: E cursors (r_idx is free here) */
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < n; i++) off[e->r_sel[i] + 1]++;
    for (int x = 0; x < E; x++) off[x + 1] += off[x];
    memcpy(cur, off, (size_t)E * sizeof *cur);
    for (int i = 0; i < n; i++) {
        int row = cur[e->r_sel[i]]++;
        e->x_row[i] = row;
        e->x_tok[row] = i / k;
    }
    e->n_act = 0;
    for (int x = 0; x < E; x++)
        if (off[x + 1] > off[x]) e->x_act[e->n_act++] = x;
}

static void engine_job_moe_gather(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int dim = e->m->hp.dim, n = j->b->n_tokens * e->m->hp.n_expert_used;
    const int r0 = (int)((int64_t)n * ith / nth), r1 = (int)((int64_t)n * (ith + 1) / nth);
    for (int r = r0; r < r1; r++)
        memcpy(e->xg + (size_t)r * dim, e->xn + (size_t)e->x_tok[r] * dim, (size_t)dim * sizeof(float));
}

/* GCC in GNU mode fuses a product and a later add into an FMA even across statements; clang
 * fuses only within one expression (its default -ffp-contract=on), and knows no optimize
 * attribute. */
#if defined(__clang__)
#define ENGINE_NO_FP_CONTRACT
#else
#define ENGINE_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* xn[t] = sum over slots s of w[t][s] * ye[row(t, s)], each product rounded before the add
 * (ggml_mul then ggml_add): no contraction into FMAs; then + shx[t], the shared experts'
 * output, in a layer that has them. */
ENGINE_NO_FP_CONTRACT
static void engine_job_moe_sum(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int T = j->b->n_tokens, dim = e->m->hp.dim, k = e->m->hp.n_expert_used;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth);
    const float *sh = e->m->layers[j->layer].gate_shexp.data ? e->shx : NULL;
    const float *sg = e->m->layers[j->layer].gate_inp_shexp ? engine_qwen35_shgate(e->q35) : NULL;
    for (int t = t0; t < t1; t++) {
        float *o = e->xn + (size_t)t * dim;
        const float *y = e->ye + (size_t)e->x_row[(size_t)t * k] * dim;
        float w = e->r_w[(size_t)t * k];
        for (int d = 0; d < dim; d++) o[d] = y[d] * w;
        for (int s = 1; s < k; s++) {
            y = e->ye + (size_t)e->x_row[(size_t)t * k + s] * dim;
            w = e->r_w[(size_t)t * k + s];
            for (int d = 0; d < dim; d++) {
                float p = y[d] * w;
                o[d] = o[d] + p;
            }
        }
        if (sh && sg) {   /* qwen35moe: the shared expert times its gate, rounded, then added */
            for (int d = 0; d < dim; d++) {
                float p = sh[(size_t)t * dim + d] * sg[t];
                o[d] = o[d] + p;
            }
        } else if (sh) {   /* routed + shared, the add ops_add did */
            for (int d = 0; d < dim; d++) o[d] = o[d] + sh[(size_t)t * dim + d];
        }
    }
}

/* The experts' matmuls of a step in one pool round: work items are (active expert, chunk of
 * ENGINE_MOE_ROWS output rows), taken from a shared counter; phase 1 computes gate and up for
 * a chunk of the expert's hidden rows over all of its tokens and SwiGLU into fe, then after a
 * barrier phase 2 the down projection for a chunk of its output rows into ye. A chunk's
 * results are its rows of the whole-matrix products (a row's dots do not depend on the rows
 * beside it), so the split changes no bit; one round instead of three per active expert keeps
 * a decode step's threads from meeting at 3k barriers per layer. With j->shexp the shared
 * experts' FFN comes first in each phase, as chunks of the same size over every token (xn
 * through gate/up and SwiGLU into ffa, then ffa through down into shx). */
static void engine_job_moe_experts(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[j->layer];
    const int E = hp->n_expert, dim = hp->dim, ef = hp->expert_ffn, R = ENGINE_MOE_ROWS;
    const int cg = (ef + R - 1) / R, cd = (dim + R - 1) / R;
    float *tg = e->moe_tmp + (size_t)ith * e->moe_tmp_stride, *tu = tg + (size_t)e->max_tokens * R;
    void *scratch = tu + (size_t)e->max_tokens * R;
    const int T = j->b->n_tokens, sf = j->shexp ? (int)L->gate_shexp.rows : 0;
    const int csg = (sf + R - 1) / R, csd = j->shexp ? cd : 0;
    (void)nth;
    for (;;) {
        int it = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED) - csg;
        if (it >= e->n_act * cg) break;
        if (it < 0) {   /* a chunk of the shared experts' hidden rows */
            int c0 = (it + csg) * R, nr = TM_MIN(R, sf - c0);
            size_t rb = quant_row_bytes(L->gate_shexp.type, L->gate_shexp.cols);
            ops_weight g = { L->gate_shexp.type, nr, L->gate_shexp.cols, (const char *)L->gate_shexp.data + rb * (size_t)c0 };
            ops_weight u = { L->up_shexp.type, nr, L->up_shexp.cols,
                             (const char *)L->up_shexp.data + quant_row_bytes(L->up_shexp.type, L->up_shexp.cols) * (size_t)c0 };
            const ops_weight *gu[2] = { &g, &u };
            float *out[2] = { tg, tu };
            ops_matmul_multi(NULL, 2, gu, e->xn, T, out, scratch);
            ops_swiglu(NULL, tg, tg, tu, T, nr);
            for (int t = 0; t < T; t++)
                memcpy(e->ffa + (size_t)t * sf + c0, tg + (size_t)t * nr, (size_t)nr * sizeof(float));
            continue;
        }
        int x = e->x_act[it / cg], c0 = it % cg * R, nr = TM_MIN(R, ef - c0);
        int r0 = e->x_off[x], n = e->x_off[x + 1] - r0;
        ops_weight g = model_expert(&L->gate_exps, E, x), u = model_expert(&L->up_exps, E, x);
        /* gate and up may differ in type (the "dynamic" mixes): each its own row size */
        g = (ops_weight){ g.type, nr, g.cols, (const char *)g.data + quant_row_bytes(g.type, g.cols) * (size_t)c0 };
        u = (ops_weight){ u.type, nr, u.cols, (const char *)u.data + quant_row_bytes(u.type, u.cols) * (size_t)c0 };
        const ops_weight *gu[2] = { &g, &u };
        float *out[2] = { tg, tu };
        ops_matmul_multi(NULL, 2, gu, e->xg + (size_t)r0 * dim, n, out, scratch);
        if (L->gate_exps_b) {   /* expert biases (gpt-oss) */
            const float *gb = L->gate_exps_b + (size_t)x * ef + c0, *ub = L->up_exps_b + (size_t)x * ef + c0;
            for (int t = 0; t < n; t++) {
                ops_add(NULL, tg + (size_t)t * nr, gb, nr);
                ops_add(NULL, tu + (size_t)t * nr, ub, nr);
            }
        }
        if (hp->swiglu_limit > 0) ops_swiglu_oai(tg, tg, tu, (int64_t)n * nr, 1.702f, hp->swiglu_limit);
        else ops_swiglu(NULL, tg, tg, tu, n, nr);
        for (int t = 0; t < n; t++)
            memcpy(e->fe + (size_t)(r0 + t) * ef + c0, tg + (size_t)t * nr, (size_t)nr * sizeof(float));
    }
    threadpool_barrier(e->tp);
    for (;;) {
        int it = __atomic_fetch_add(&j->next2, 1, __ATOMIC_RELAXED) - csd;
        if (it >= e->n_act * cd) break;
        if (it < 0) {   /* a chunk of the shared experts' output rows */
            int c0 = (it + csd) * R, nr = TM_MIN(R, dim - c0);
            const ops_weight *sd = &L->down_shexp;
            ops_weight d = { sd->type, nr, sd->cols, (const char *)sd->data + quant_row_bytes(sd->type, sd->cols) * (size_t)c0 };
            ops_matmul(NULL, &d, e->ffa, T, tg, scratch);
            for (int t = 0; t < T; t++)
                memcpy(e->shx + (size_t)t * dim + c0, tg + (size_t)t * nr, (size_t)nr * sizeof(float));
            continue;
        }
        int x = e->x_act[it / cd], c0 = it % cd * R, nr = TM_MIN(R, dim - c0);
        int r0 = e->x_off[x], n = e->x_off[x + 1] - r0;
        ops_weight d = model_expert(&L->down_exps, E, x);
        d = (ops_weight){ d.type, nr, d.cols, (const char *)d.data + quant_row_bytes(d.type, d.cols) * (size_t)c0 };
        ops_matmul(NULL, &d, e->fe + (size_t)r0 * ef, n, tg, scratch);
        if (L->down_exps_b)
            for (int t = 0; t < n; t++) ops_add(NULL, tg + (size_t)t * nr, L->down_exps_b + (size_t)x * dim + c0, nr);
        for (int t = 0; t < n; t++)
            memcpy(e->ye + (size_t)(r0 + t) * dim + c0, tg + (size_t)t * nr, (size_t)nr * sizeof(float));
    }
}

/* The MoE FFN of layer il: xn (T, dim) in, the FFN output (routed + shared experts) in xn. */
static void engine_moe_ffn(engine *e, engine_job *job, int il, int T)
{
    const model_layer *L = &e->m->layers[il];
    threadpool *tp = e->tp;
    if (L->gate_inp_shexp) engine_qwen35_shgate_compute(e->q35, il, e->xn, T);   /* before xn is overwritten */
    job->shexp = L->gate_shexp.data && T <= ENGINE_MOE_SHARED_T;
    if (L->gate_shexp.data && !job->shexp) {   /* shared experts: a dense FFN on the same input */
        const ops_weight *gu[2] = { &L->gate_shexp, &L->up_shexp };
        float *gu_out[2] = { e->ffa, e->ffb };
        ops_matmul_multi(tp, 2, gu, e->xn, T, gu_out, e->mm_scratch);
        ops_swiglu(tp, e->ffa, e->ffa, e->ffb, T, (int)L->gate_shexp.rows);
        ops_matmul(tp, &L->down_shexp, e->ffa, T, e->shx, e->mm_scratch);
    }
    ops_matmul(tp, &L->gate_inp, e->xn, T, e->r_logits, e->mm_scratch);
    engine_run_rows(e, engine_job_route, job, (int64_t)T * e->m->hp.n_expert);   /* a decode step's: inline */
    engine_moe_group(e, T);
    engine_moe_stats_layer(e->stats, il, e->x_off);
    threadpool_run(tp, engine_job_moe_gather, job);
    if (e->ep) e->n_act = e->ep->dispatch(e->ep->ctx, il, e->x_act, e->n_act, e->x_off, e->xg);
    job->next = job->next2 = 0;
    threadpool_run(tp, engine_job_moe_experts, job);
    if (e->ep && (e->n_act = e->ep->combine(e->ep->ctx, il, e->ye, e->x_act)) > 0) {
        job->shexp = false;   /* done in the first round */
        job->next = job->next2 = 0;
        threadpool_run(tp, engine_job_moe_experts, job);
    }
    threadpool_run(tp, engine_job_moe_sum, job);
}

void engine_set_ep(engine *e, const engine_ep_hooks *h) { e->ep = h; }
void engine_ep_metrics(engine *e, bytebuf *b)
{
    if (e->ep && e->ep->metrics) e->ep->metrics(e->ep->ctx, b);
}
void engine_ep_status(engine *e, bytebuf *b)
{
    if (e->ep && e->ep->status) e->ep->status(e->ep->ctx, b);
}

engine_status engine_moe_experts_run(engine *e, int il, int n_exp, const int32_t *experts, const int32_t *n_rows,
                                     const float *x, float *y)
{
    const model_hparams *hp = &e->m->hp;
    if (!e->x_off || il < 0 || il >= hp->n_layers || !e->m->layers[il].gate_exps.data || n_exp < 0 ||
        n_exp > hp->n_expert)
        return ENGINE_ERR_ARG;
    const int E = hp->n_expert, dim = hp->dim;
    int64_t n = 0;
    memset(e->x_off, 0, (size_t)(E + 1) * sizeof *e->x_off);
    for (int i = 0; i < n_exp; i++) {
        if (experts[i] < 0 || experts[i] >= E || (i > 0 && experts[i] <= experts[i - 1]) || n_rows[i] <= 0)
            return ENGINE_ERR_ARG;
        n += n_rows[i];
        e->x_off[experts[i] + 1] = n_rows[i];
    }
    if (n > (int64_t)e->max_tokens * hp->n_expert_used) return ENGINE_ERR_ARG;
    for (int i = 0; i < E; i++) e->x_off[i + 1] += e->x_off[i];
    memcpy(e->x_act, experts, (size_t)n_exp * sizeof *experts);
    e->n_act = n_exp;
    memcpy(e->xg, x, (size_t)n * dim * sizeof(float));
    engine_tok tk = { 0 };
    engine_batch b = { .n_tokens = 1, .toks = &tk };   /* the shared experts are not in this round */
    engine_job job = { .e = e, .b = &b, .layer = il };
    threadpool_run(e->tp, engine_job_moe_experts, &job);
    memcpy(y, e->ye, (size_t)n * dim * sizeof(float));
    return ENGINE_OK;
}

bool engine_moe_load(engine *e, int layer, uint64_t *window, uint64_t *total, int64_t *n_steps)
{
    engine_moe_stats *st = e->stats;
    if (!st || layer < 0 || layer >= st->n_layers) return false;
    size_t base = (size_t)layer * (size_t)st->n_expert;
    pthread_mutex_lock(&st->mu);
    if (window) memcpy(window, st->win + base, (size_t)st->n_expert * sizeof *window);
    if (total) memcpy(total, st->total + base, (size_t)st->n_expert * sizeof *total);
    if (n_steps) *n_steps = TM_MIN(st->n_steps, (int64_t)st->window);
    pthread_mutex_unlock(&st->mu);
    return true;
}

double engine_moe_imbalance(const uint64_t *counts, int n_expert, int n_groups)
{
    if (n_groups <= 0 || n_expert <= 0) return 0;
    if (n_groups > n_expert) n_groups = n_expert;
    uint64_t all = 0, max = 0;
    for (int g = 0; g < n_groups; g++) {
        /* expert parallelism places experts in contiguous ranges */
        int x0 = (int)((int64_t)n_expert * g / n_groups), x1 = (int)((int64_t)n_expert * (g + 1) / n_groups);
        uint64_t load = 0;
        for (int x = x0; x < x1; x++) load += counts[x];
        all += load;
        if (load > max) max = load;
    }
    return all ? (double)max * n_groups / (double)all : 0;
}

/* ---- multi-head latent attention ------------------------------------------------------
 * llama.cpp's MLA with the up-projections absorbed (deepseek2 with split attn_k_b/attn_v_b):
 * the latent c = norm(kv_a[:kv_lora]) and the roped key part k_pe = rope(kv_a[kv_lora:]) are
 * one kv head of kv_lora + rope values, stored once (a "V is K" pool: attention reads the
 * first kv_lora values of the key row as the value); each query head is (q_nope @ k_b[h], rope(q_pe))
 * so that Q K^T equals the decompressed scores; the attention output of a head (kv_lora) goes
 * through v_b[h] to v_dim values, then attn_output. */

/* After the projections, rows [t0, t1): norm the latent, rope the key part and each head's
 * query part (copied into q's RoPE slot), and store the row in the pool (as K; V is K). */
static void engine_mla_post_rows(engine_job *j, int t0, int t1)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[j->layer];
    const int H = hp->n_heads, hd = hp->head_dim, lr = hp->kv_lora, kq = hp->nope_dim + hp->n_rot;
    for (int t = t0; t < t1; t++) {
        float *k = e->k + (size_t)t * hd, *qr = e->qraw + (size_t)t * H * kq;
        ops_rmsnorm(NULL, k, k, L->kv_a_norm, 1, lr, hp->rms_eps);
        ops_rope_ggml(NULL, k + lr, e->pos + t, 1, 1, hp->n_rot, hp->n_rot, hp->rope_neox, hp->rope_theta_scale,
                      hp->rope_freq_scale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
        /* head h's RoPE part starts at nope_dim within its kq values */
        ops_rope_ggml(NULL, qr + hp->nope_dim, e->pos + t, 1, H, kq, hp->n_rot, hp->rope_neox, hp->rope_theta_scale,
                      hp->rope_freq_scale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
        for (int h = 0; h < H; h++)
            memcpy(e->q + ((size_t)t * H + h) * hd + lr, qr + (size_t)h * kq + hp->nope_dim, (size_t)hp->n_rot * sizeof(float));
        const engine_tok *tk = &j->b->toks[t];
        kvpool_seq_store(e->kv, tk->seq, tk->pos, j->layer, 0, k, k);
    }
}

/* Per head (items from a shared counter): gather the head's rows, one matmul with its slice
 * of a per-head tensor, scatter the results. j->mla_v false: q_nope (qraw) through k_b into
 * q's latent slot, after the thread's share of engine_mla_post_rows (which reads and writes
 * only what the heads do not: the latent row, the RoPE parts, the pool), so that the query
 * side of a layer is one pool round after its projections; true: the attention output's
 * latent part (att) through v_b into att_v. */
static void engine_job_mla_heads(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[j->layer];
    const int T = j->b->n_tokens, H = hp->n_heads, hd = hp->head_dim, lr = hp->kv_lora, kq = hp->nope_dim + hp->n_rot;
    const bool out_v = j->mla_v;
    const int n_in = out_v ? lr : hp->nope_dim, n_out = out_v ? hp->v_dim : lr;
    const size_t in_stride = out_v ? (size_t)H * hd : (size_t)H * kq, in_head = out_v ? (size_t)hd : (size_t)kq;
    const size_t out_stride = out_v ? (size_t)H * hp->v_dim : (size_t)H * hd, out_head = out_v ? (size_t)hp->v_dim : (size_t)hd;
    const float *in = out_v ? e->att : e->qraw;
    float *out = out_v ? e->att_v : e->q;
    float *xin = e->mla_tmp + (size_t)ith * e->mla_tmp_stride;
    float *yout = xin + (size_t)e->max_tokens * TM_MAX(hp->nope_dim, lr);
    void *scratch = yout + (size_t)e->max_tokens * TM_MAX(lr, hp->v_dim);
    if (!out_v) engine_mla_post_rows(j, (int)((int64_t)T * ith / nth), (int)((int64_t)T * (ith + 1) / nth));
    for (;;) {
        int h = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (h >= H) break;
        ops_weight w = model_expert(out_v ? &L->wv_b : &L->wk_b, H, h);
        for (int t = 0; t < T; t++)
            memcpy(xin + (size_t)t * n_in, in + t * in_stride + h * in_head, (size_t)n_in * sizeof(float));
        ops_matmul(NULL, &w, xin, T, yout, scratch);
        for (int t = 0; t < T; t++)
            memcpy(out + t * out_stride + h * out_head, yout + (size_t)t * n_out, (size_t)n_out * sizeof(float));
    }
}

/* Q (T, H * head_dim) and the pool rows of layer il from xn. */
static void engine_mla_qkv(engine *e, engine_job *job, int il, int T)
{
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[il];
    threadpool *tp = e->tp;
    if (L->wq_a.data) {
        const ops_weight *ws[2] = { &L->wq_a, &L->wkv_a };
        float *ys[2] = { e->qa, e->k };
        ops_matmul_multi(tp, 2, ws, e->xn, T, ys, e->mm_scratch);
        ops_rmsnorm(tp, e->qa, e->qa, L->q_a_norm, T, hp->q_lora, hp->rms_eps);
        ops_matmul(tp, &L->wq_b, e->qa, T, e->qraw, e->mm_scratch);
    } else {
        const ops_weight *ws[2] = { &L->wq, &L->wkv_a };
        float *ys[2] = { e->qraw, e->k };
        ops_matmul_multi(tp, 2, ws, e->xn, T, ys, e->mm_scratch);
    }
    job->next = 0, job->mla_v = false;
    threadpool_run(tp, engine_job_mla_heads, job);
}

/* The attention output (att) through v_b and attn_output into xn. */
static void engine_mla_out(engine *e, engine_job *job, int il, int T)
{
    job->next = 0, job->mla_v = true;
    threadpool_run(e->tp, engine_job_mla_heads, job);
    ops_matmul(e->tp, &e->m->layers[il].wo, e->att_v, T, e->xn, e->mm_scratch);
}

const float *engine_hidden(const engine *e) { return e->x; }

void engine_hidden_normed(const engine *e, int t, float *out)
{
    const int dim = e->m->hp.dim;
    if (e->bert) {   /* an encoder's last block ends in its own LayerNorm */
        memcpy(out, e->x + (size_t)t * dim, (size_t)dim * sizeof *out);
        return;
    }
    ops_rmsnorm(e->tp, out, e->x + (size_t)t * dim, e->m->output_norm, 1, dim, e->m->hp.rms_eps);
}

const float *engine_route_margins(const engine *e) { return e->r_margin; }

/* An MTP view's layer input (engine.h), in place of the embeddings in x: x = eh_proj([enorm
 * of the embedding; hnorm of the hidden state]). */
static void engine_mtp_input(engine *e, const engine_batch *b, const float *hidden)
{
    const model_layer *L = &e->m->layers[0];
    const int T = b->n_tokens, dim = e->m->hp.dim;
    const float eps = e->m->hp.rms_eps;
    ops_rmsnorm(e->tp, e->xn, e->x, L->enorm, T, dim, eps);
    for (int t = 0; t < T; t++)
        memcpy(e->mtp_cat + (size_t)t * 2 * dim, e->xn + (size_t)t * dim, (size_t)dim * sizeof(float));
    ops_rmsnorm(e->tp, e->xn, hidden, L->hnorm, T, dim, eps);
    for (int t = 0; t < T; t++)
        memcpy(e->mtp_cat + (size_t)t * 2 * dim + dim, e->xn + (size_t)t * dim, (size_t)dim * sizeof(float));
    ops_matmul(e->tp, &L->eh_proj, e->mtp_cat, T, e->x, e->mm_scratch);
}

/* Each thread writes its share of every scratch buffer: a per-thread buffer (n_threads slices
 * in thread order) lands in its own thread's slice, on that thread's memory node. */
static void engine_job_touch(void *ctx, int ith, int nth)
{
    engine *e = ctx;
    for (int i = 0; i < e->n_scratch; i++) {
        size_t n = e->scratch[i].bytes, a = n * (size_t)ith / (size_t)nth, b = n * (size_t)(ith + 1) / (size_t)nth;
        memset((char *)e->scratch[i].p + a, 0, b - a);
    }
}

engine_status engine_warmup(engine *e)
{
    /* the step below touches one token's rows; the first prompt would fault in the rest */
    threadpool_run(e->tp, engine_job_touch, e);
    if (e->m->mtp_view) return ENGINE_OK;
    kvpool_seq *q = kvpool_seq_new(e->kv);
    float *logits = malloc((size_t)e->m->hp.n_vocab * sizeof *logits);
    engine_status st = ENGINE_ERR_NOMEM;
    if (q && logits) {
        engine_tok t = { .token = 0, .pos = 0, .seq = q, .want_logits = !e->bert };   /* an encoder has none */
        engine_batch b = { .n_tokens = 1, .toks = &t };
        bool prof = e->prof_on;
        e->prof_on = false;
        st = engine_step(e, &b, logits);
        e->prof_on = prof;
    }
    if (q) kvpool_seq_free(e->kv, q);
    free(logits);
    if (e->stats) engine_moe_stats_clear(e->stats);
    return st;
}

engine_status engine_step(engine *e, const engine_batch *b, float *logits)
{
    return engine_forward(e, b, NULL, logits);
}

engine_status engine_forward(engine *e, const engine_batch *b, const float *hidden, float *logits)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    int T = b->n_tokens;
    if (T <= 0 || T > e->max_tokens) return ENGINE_ERR_ARG;
    int n_out = 0;
    for (int t = 0; t < T; t++) {
        const engine_tok *tk = &b->toks[t];
        if (tk->token < 0 || tk->token >= hp->n_vocab || tk->pos < 0 || !tk->seq ||
            tk->pos >= (1 << 30))
            return ENGINE_ERR_ARG;
        n_out += tk->want_logits;
    }
    if ((n_out > 0 && !logits) || m->mtp_view != (hidden != NULL)) return ENGINE_ERR_ARG;
    for (int t = 0; t < T; t++) {
        const engine_tok *tk = &b->toks[t];
        if (kvpool_seq_reserve(e->kv, tk->seq, tk->pos + 1) != KVPOOL_OK) return ENGINE_ERR_KV_FULL;
    }

    if (e->dsv4) {
        engine_dsv4_step(e->dsv4, T, b->toks, logits, e->x);
        return ENGINE_OK;
    }
    if (e->bert) return engine_bert_step(e->bert, T, b->toks, e->x) ? ENGINE_OK : ENGINE_ERR_ARG;
    if (e->wstage && !engine_window_plan(e, b)) return ENGINE_ERR_ARG;
    if (e->q35 && !engine_qwen35_plan(e->q35, e->kv, b)) return ENGINE_ERR_ARG;
    engine_plan_tiles(e, b);
    if (e->r_margin)
        for (int t = 0; t < T; t++) e->r_margin[t] = INFINITY;
    const int il_out = hp->n_layers;   /* the profile's row of the stages outside the layers */
    if (e->prof_on) {
        e->prof_steps++;
        e->prof_t = util_now();
        e->prof_quant = 0;
        threadpool_stats_get(e->tp, &e->prof_tp);
        ops_profile_attach(&e->prof_quant);
    }

    threadpool *tp = e->tp;
    const int dim = hp->dim, hd = hp->head_dim;
    const float eps = hp->rms_eps;
    for (int t = 0; t < T; t++) {
        model_embed_row(m, b->toks[t].token, e->x + (size_t)t * dim);
        if (hp->embd_scale != 0.0f) ops_vec_scale_f32(dim, e->x + (size_t)t * dim, hp->embd_scale);   /* gemma3 */
        e->pos[t] = b->toks[t].pos;
    }
    engine_job job = { .e = e, .b = b };
    if (m->mtp_view) engine_mtp_input(e, b, hidden);
    ops_rmsnorm(tp, e->xn, e->x, m->layers[0].attn_norm, T, dim, eps);
    engine_prof_mark(e, il_out, ENGINE_PROF_EMBED);
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &m->layers[il];
        job.layer = il;
        if (L->ssm_out.data) {   /* Qwen3.5's linear attention: xn in, its output in xn */
            engine_qwen35_linear(e->q35, tp, il, e->xn, e->mm_scratch);
            engine_prof_mark(e, il, ENGINE_PROF_ATTENTION);
            goto add_attention;
        }
        if (hp->mla) {
            engine_mla_qkv(e, &job, il, T);
            engine_prof_mark(e, il, ENGINE_PROF_QKV);
        } else {
            const ops_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
            float *qkv_out[3] = { L->attn_gated ? engine_qwen35_qg(e->q35) : e->q, e->k, e->v };
            ops_matmul_multi(tp, 3, qkv, e->xn, T, qkv_out, e->mm_scratch);
            if (L->attn_gated) engine_qwen35_split(e->q35, T, e->q);
            engine_prof_mark(e, il, ENGINE_PROF_QKV);
            engine_run_rows(e, engine_job_qkv_post, &job, (int64_t)T * (hp->n_heads + 2 * hp->n_kv_heads) * hd);
            engine_prof_mark(e, il, ENGINE_PROF_QKV_POST);
        }
        job.win = model_layer_window(m, il) > 0;
        job.n_items = (job.win ? T : e->n_tiles) * hp->n_kv_heads;
        job.next = 0;
        job.q16 = kvpool_dtype(e->kv) == QTYPE_F16 && hd % 16 != 0;
        job.q8 = kvpool_dtype(e->kv) == QTYPE_Q8_0 || kvpool_dtype(e->kv) == QTYPE_Q4_0;
        int bl = kvpool_layer_block_index(e->kv, il);
        if (bl >= 0) kvpool_fill_wait(e->kv, bl);   /* layer il of blocks still loading from the store */
        threadpool_run(tp, engine_job_attention, &job);
        if (bl < 0) engine_window_commit(e, b, il);
        if (L->attn_gated) engine_qwen35_gate(e->q35, T, e->att);
        engine_prof_mark(e, il, ENGINE_PROF_ATTENTION);
        if (hp->mla) engine_mla_out(e, &job, il, T);
        else ops_matmul(tp, &L->wo, e->att, T, e->xn, e->mm_scratch);
        if (L->attn_post_norm) ops_rmsnorm(tp, e->xn, e->xn, L->attn_post_norm, T, dim, eps);   /* gemma3 */
        engine_prof_mark(e, il, ENGINE_PROF_WO);
    add_attention:
        job.norm = L->ffn_norm;
        job.bias = L->bo;
        engine_run_rows(e, engine_job_add_norm, &job, (int64_t)T * dim);   /* x += attention; xn = ffn input */
        job.bias = NULL;
        engine_prof_mark(e, il, ENGINE_PROF_ADD_NORM);
        if (L->gate_inp.data) {
            engine_moe_ffn(e, &job, il, T);
            engine_prof_mark(e, il, ENGINE_PROF_MOE);
        } else {
            const ops_weight *gu[2] = { &L->gate, &L->up };
            float *gu_out[2] = { e->ffa, e->ffb };
            ops_matmul_multi(tp, 2, gu, e->xn, T, gu_out, e->mm_scratch);
            engine_prof_mark(e, il, ENGINE_PROF_FFN_UP);
            if (hp->ffn_gelu) ops_geglu(tp, e->ffa, e->ffa, e->ffb, T, hp->ffn_dim);
            else ops_swiglu(tp, e->ffa, e->ffa, e->ffb, T, hp->ffn_dim);
            engine_prof_mark(e, il, ENGINE_PROF_SWIGLU);
            ops_matmul(tp, &L->down, e->ffa, T, e->xn, e->mm_scratch);
            if (L->ffn_post_norm) ops_rmsnorm(tp, e->xn, e->xn, L->ffn_post_norm, T, dim, eps);   /* gemma3 */
            engine_prof_mark(e, il, ENGINE_PROF_FFN_DOWN);
        }
        job.norm = il + 1 < hp->n_layers ? m->layers[il + 1].attn_norm : NULL;
        engine_run_rows(e, engine_job_add_norm, &job, (int64_t)T * dim);   /* x += ffn; xn = next layer's input */
        engine_prof_mark(e, il, ENGINE_PROF_ADD_NORM);
    }
    if (e->stats) engine_moe_stats_step(e->stats);
    if (e->q35) engine_qwen35_commit(e->q35);
    if (n_out > 0) {
        int r = 0;
        for (int t = 0; t < T; t++)
            if (b->toks[t].want_logits)
                memcpy(e->xo + (size_t)r++ * dim, e->x + (size_t)t * dim, (size_t)dim * sizeof(float));
        ops_rmsnorm(tp, e->xo, e->xo, m->output_norm, n_out, dim, eps);
        engine_prof_mark(e, il_out, ENGINE_PROF_OUT_NORM);
        ops_matmul(tp, &m->output, e->xo, n_out, logits, e->mm_scratch);
        if (hp->logit_softcap != 0.0f) ops_softcap(tp, logits, (int64_t)n_out * hp->n_vocab, hp->logit_softcap);   /* gemma3 */
        engine_prof_mark(e, il_out, ENGINE_PROF_OUTPUT);
    }
    if (e->prof_on) ops_profile_attach(NULL);
    return ENGINE_OK;
}
