/*
 * engine: the engine's life (see engine.h for the design, engine_int.h for struct engine and
 * the files): engine_new sizes and allocates every buffer a step of max_batch_tokens needs
 * (the registry engine_warmup touches), by the model's family; engine_free; the per-stage
 * profile; the experts' load statistics. The step itself is engine_step.c, the KV cache's
 * geometry and window layers engine_kv.c.
 */
#include "engine/engine_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model_dsv4.h"
#include "util/util.h"

struct engine_moe_stats {
    int n_layers, n_expert, window;
    uint32_t *ring;          /* (window, n_layers, n_expert) tokens of each of the last steps */
    uint64_t *win;           /* (n_layers, n_expert) sum over the ring */
    uint64_t *total;         /* (n_layers, n_expert) since the start */
    int64_t n_steps;         /* steps recorded; the ring's slot is n_steps % window */
    pthread_mutex_t mu;
};

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
void engine_moe_stats_layer(engine_moe_stats *st, int il, const int32_t *off)
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

void engine_moe_stats_step(engine_moe_stats *st)
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

const char *engine_prof_op_name(engine_prof_op op)
{
    static const char *const names[ENGINE_PROF_N] = {
        "embed", "qkv", "qkv_post", "attention", "wo", "add_norm", "ffn_up", "swiglu",
        "ffn_down", "moe", "hc_mix", "act_quant", "out_norm", "output",
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
void engine_prof_mark(engine *e, int il, engine_prof_op op)
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
threadpool *engine_threadpool(engine *e) { return e->tp; }

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
    free(e->wkv);
    free(e->wrow_l);
    free(e->wsnap);
    free(e->wsnap_data);
    engine_moe_stats_free(e->stats);
    engine_qwen35_free(e->q35);
    engine_dsv4_mtp_free(e->dsv4_mtp);
    engine_dsv4_free(e->dsv4);
    engine_bert_free(e->bert);
    free(e->cap_slot);
    free(e->cap);
    free(e);
}

static size_t engine_scratch_need(const ops_weight *w, int T, size_t cur)
{
    size_t n = ops_matmul_scratch_bytes(w->type, w->cols, T);
    return n > cur ? n : cur;
}

/* An activation or scratch buffer of engine_new, kept in the registry that engine_warmup
 * touches and engine_free frees (NULL when out of memory, as util_aligned_alloc, or when the
 * registry is full: engine_new then fails rather than leave a buffer untouched). */
void *engine_scratch_alloc(engine *e, size_t bytes)
{
    if (e->n_scratch >= ENGINE_MAX_SCRATCH) return NULL;
    void *p = util_aligned_alloc(bytes);
    if (p) {
        e->scratch[e->n_scratch].p = p;
        e->scratch[e->n_scratch++].bytes = bytes;
    }
    return p;
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
        if (L->pl_gate.data) sc = engine_scratch_need(&L->pl_gate, T, engine_scratch_need(&L->pl_proj, T, sc));
        if (L->gate_inp.data) sc = engine_scratch_need(&L->gate_inp, T, sc);   /* the experts' own: moe_tmp */
        if (L->gate.data) {   /* gemma4's experts have the dense FFN beside them */
            const ops_weight *gu[2] = { &L->gate, &L->up };
            sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(2, gu, T));
            sc = engine_scratch_need(&L->down, T, sc);
        }
    }
    sc = engine_scratch_need(&m->output, T, sc);
    if (m->pl_model_proj.data) sc = engine_scratch_need(&m->pl_model_proj, T, sc);
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
        if (!L->gate_exps.data) continue;   /* a dense layer (gemma4's may be) */
        ops_weight g = model_expert(&L->gate_exps, hp->n_expert, 0);
        ops_weight u = L->exps_gate_up ? g : model_expert(&L->up_exps, hp->n_expert, 0);
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
    /* dense layers (and gemma4's shared MLP beside its experts): ffn_dim; shared experts:
     * n_shared * expert_ffn; routed experts use fe */
    size_t ffn = hp->n_expert > 0 && hp->n_dense_lead == 0 && hp->arch != MODEL_ARCH_GEMMA4 ? 1 : (size_t)hp->ffn_dim;
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
    /* gemma4's layers have their own head size and kv heads: the tile fits the most query heads
     * per kv head, the scratch the largest layer */
    int gqa = hp->n_heads / hp->n_kv_heads;
    for (int il = 0; il < hp->n_layers; il++)
        if (m->layers[il].l_kv_heads) gqa = TM_MAX(gqa, hp->n_heads / m->layers[il].l_kv_heads);
    e->att_tile = TM_MAX(1, TM_MIN(ENGINE_ATT_TILE_MAX, ENGINE_ATT_ROWS / gqa));
    e->att_stride = 0;
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &m->layers[il];
        size_t hdz = (size_t)(L->l_head_dim ? L->l_head_dim : hp->head_dim);
        size_t lgqa = (size_t)(hp->n_heads / (L->l_kv_heads ? L->l_kv_heads : hp->n_kv_heads));
        size_t nqp = TM_ALIGN_UP((size_t)e->att_tile * lgqa, 16);
        e->att_stride = TM_MAX(e->att_stride, TM_ALIGN_UP(3 * KVPOOL_BLOCK * hdz + nqp * (2 * hdz + KVPOOL_BLOCK + 3), 16));
    }
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
    if (hp->arch == MODEL_ARCH_GEMMA4 && hp->n_expert > 0) {   /* the shared MLP, the router's input, ones */
        if (!(e->g4_mlp = engine_scratch_alloc(e, (2 * T + 1) * (size_t)hp->dim * sizeof(float)))) {
            snprintf(err, errsz, "out of memory for gemma4's expert inputs of %d tokens", Ti);
            return ENGINE_ERR_NOMEM;
        }
        for (int i = 0; i < hp->dim; i++) e->g4_mlp[2 * T * (size_t)hp->dim + (size_t)i] = 1.0f;
    }
    if (hp->n_pl > 0) {   /* per token its per-layer inputs and a layer's gate, and one embedding row */
        size_t w = (size_t)hp->n_layers * (size_t)hp->n_pl;
        if (!(e->g4_pl = engine_scratch_alloc(e, (T * (w + (size_t)hp->n_pl) + w) * sizeof(float)))) {
            snprintf(err, errsz, "out of memory for gemma4's per-layer inputs of %d tokens", Ti);
            return ENGINE_ERR_NOMEM;
        }
    }
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
    if (m->dflash) {   /* its pass reads a target's states: engine_dflash.h */
        snprintf(err, errsz, "a dflash drafter is not a model to run: it drafts for one (--draft FILE)");
        return ENGINE_ERR_ARG;
    }
    if (m->dsv4 && m->dsv4->mtp_only && !m->mtp_view) {
        snprintf(err, errsz, "a deepseek4 MTP-only file (the MTP block alone) is not a model to run: it drafts beside "
                 "its trunk (--draft FILE --spec mtp)");
        return ENGINE_ERR_ARG;
    }
    for (int il = 0; il < hp->n_layers; il++) {
        const int nkv = m->layers[il].l_kv_heads ? m->layers[il].l_kv_heads : hp->n_kv_heads;
        if (hp->n_heads / nkv > ENGINE_ATT_GQA_MAX) {
            snprintf(err, errsz, "%d query heads per kv head: at most %d are supported", hp->n_heads / nkv,
                     ENGINE_ATT_GQA_MAX);
            return ENGINE_ERR_ARG;
        }
    }
    engine *e = xcalloc(1, sizeof *e);
    e->win_src = -1;
    for (int il = 0; il < hp->n_layers; il++)   /* gemma4: a window layer that shared KV layers read */
        if (m->layers[il].kv_shared && model_layer_window(m, il) > 0) e->win_src = m->layers[il].kv_src;
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
        else engine_dsv4_profile_to(e->dsv4, e);
        if (st == ENGINE_OK && m->mtp_view &&
            !(e->dsv4_mtp = engine_dsv4_mtp_new(m, e->dsv4, e->tp, o.max_batch_tokens, err, errsz)))
            st = ENGINE_ERR_NOMEM;
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

void engine_set_ep(engine *e, const engine_ep_hooks *h) { e->ep = h; }
void engine_ep_metrics(engine *e, bytebuf *b)
{
    if (e->ep && e->ep->metrics) e->ep->metrics(e->ep->ctx, b);
}
void engine_ep_status(engine *e, bytebuf *b)
{
    if (e->ep && e->ep->status) e->ep->status(e->ep->ctx, b);
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

const float *engine_hidden(const engine *e) { return e->dsv4 ? engine_dsv4_streams(e->dsv4) : e->x; }
int engine_hidden_dim(const engine *e) { return e->dsv4 ? e->m->dsv4->hc * e->m->hp.dim : e->m->hp.dim; }

bool engine_capture_layers(engine *e, const int32_t *layers, int n)
{
    const int L = e->m->hp.n_layers, max_l = e->dsv4 ? L : L - 1;   /* V4: the final streams too */
    for (int i = 0; i < n; i++)
        if (layers[i] < 0 || layers[i] > max_l || n > 127 || e->bert) return false;
    if (e->dsv4) engine_dsv4_capture(e->dsv4, NULL, 0, NULL);
    free(e->cap_slot), free(e->cap);
    e->cap_slot = NULL, e->cap = NULL, e->n_cap = 0;
    if (n == 0) return true;
    e->cap_slot = malloc((size_t)L + 1);
    e->cap = malloc((size_t)e->max_tokens * (size_t)n * (size_t)e->m->hp.dim * sizeof(float));
    if (!e->cap_slot || !e->cap) {
        free(e->cap_slot), free(e->cap);
        e->cap_slot = NULL, e->cap = NULL;
        return false;
    }
    memset(e->cap_slot, -1, (size_t)L + 1);
    for (int i = 0; i < n; i++) e->cap_slot[layers[i]] = (int8_t)i;
    e->n_cap = n;
    if (e->dsv4) engine_dsv4_capture(e->dsv4, e->cap_slot, n, e->cap);
    return true;
}

const float *engine_layer_inputs(const engine *e) { return e->cap; }

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
