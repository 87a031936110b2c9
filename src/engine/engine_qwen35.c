/*
 * engine_qwen35: Qwen3.5's layers (see engine_qwen35.h for the contract, model_qwen35.c for
 * the tensors).
 *
 * A linear-attention layer of a step, as llama.cpp's qwen35 graph computes it for one token
 * after another (its fused gated_delta_net op is this recurrence; its chunked form for long
 * ubatches is the same sum in another order):
 *   mix = W_qkv x, z = W_z x, beta = sigmoid(W_beta x), g = ssm_a * softplus(W_alpha x + dt)
 *   c = silu(causal conv of mix over the conv state and this token, per channel)
 *   q, k, v = the heads of c; q, k L2-normed (eps = the RMS norm's); v head h reads q/k
 *   head h % Hk (ggml_repeat's tiling, which the converter's V reordering assumes)
 *   per v head: M = exp(g) M; d = beta (v - M k); M += d k^T; o = (M q) / sqrt(S)
 *   out = W_out (rmsnorm(o per head) * ssm_norm * silu(z))
 * M is stored by rows j (the v dims), each row over the k dims, as ggml keeps it transposed,
 * so every update of a row is one pass over S contiguous floats: a row is scaled, dotted
 * with k, updated and dotted with q before the next (the same products as ggml's four passes,
 * which never mix rows). Dots sum in 8 lanes then pairwise, one fixed order everywhere.
 *
 * Rounds of a layer: the four input projections in one ops_matmul_multi; the conv over items
 * (sequence, 256 channels); the delta rule over items (sequence, v head), each walking its
 * sequence's entries in order; the gated norm over rows; the output projection.
 */
#include "engine/engine_qwen35.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

#define Q35_CONV_CHUNK 256        /* channels per conv work item */
#define Q35_HEADER 64             /* bytes before the layers' states: the position count */

struct engine_qwen35 {
    const model *m;
    int max_tokens, n_threads;
    int conv_ch;             /* 2 * Hk * S + H * S: q, k, v channels */
    int K;                   /* conv taps */
    int H, Hk, S;            /* v heads, q/k heads, head size */
    int qd;                  /* full layers: n_heads * head_dim */
    int *rec;                /* (n_layers) linear layer index of layer il, -1 for a full one */
    size_t conv_floats;      /* conv_ch * (K - 1): a layer's conv state */
    size_t layer_floats;     /* conv_floats + H * S * S */
    /* activations, (max_tokens, width) f32 */
    float *mix;              /* (T, conv_ch) projected q, k, v before the conv */
    float *cv;               /* (T, conv_ch) after the conv and SiLU */
    float *z;                /* (T, H * S) */
    float *beta;             /* (T, H) */
    float *alpha;            /* (T, H) */
    float *o;                /* (T, H * S) delta rule output, then gated-normed */
    float *qg;               /* (T, n_heads * 2 * head_dim) full layers' query and gate */
    float *gate;             /* (T, qd) full layers' gates */
    float *shg;              /* (T) qwen35moe shared expert gates */
    float *tmp;              /* (n_threads, 2 * S) normed q and k of a token */
    /* the step's sequences (engine_qwen35_plan) */
    const engine_batch *b;
    int n_sq;
    float **st;              /* (T) each sequence's layer states (after the header) */
    int64_t **npos;          /* (T) each sequence's position count */
    int32_t *first;          /* (T) its first entry */
    int32_t *last;           /* (T) its last entry */
    int32_t *nxt;            /* (T) the entry after entry t of the same sequence, -1 */
    bool *reset;             /* (T) restarts at position 0 */
    /* states captured at the block ends the step crosses (engine_qwen35_states) */
    engine_window_state *snap; /* (n_snap_max) */
    uint8_t *snap_data;      /* (n_snap_max, state_bytes) header then the layers, as a sequence's */
    int32_t *snap_at;        /* (T) the capture taken after entry t (its position is end - 1), -1 */
    int n_snap, n_snap_max;
    uint64_t n_snap_dropped; /* captures skipped for want of a slot, lifetime */
    /* the running round */
    int il;                  /* layer */
    int next;                /* work item counter */
};

static bool q35_is(const model *m) { return m->hp.n_recurrent > 0; }

size_t engine_qwen35_state_bytes(const model *m)
{
    const model_hparams *hp = &m->hp;
    if (!q35_is(m)) return 0;
    size_t ch = (size_t)(2 * hp->ssm_k_heads + hp->ssm_v_heads) * (size_t)hp->ssm_head;
    size_t per = ch * (size_t)(hp->ssm_conv - 1) + (size_t)hp->ssm_v_heads * hp->ssm_head * hp->ssm_head;
    return Q35_HEADER + (size_t)hp->n_recurrent * per * sizeof(float);
}

size_t engine_qwen35_scratch_bytes(const model *m, int T)
{
    size_t sc = 0;
    for (int il = 0; il < m->hp.n_layers; il++) {
        const model_layer *L = &m->layers[il];
        if (!L->ssm_out.data) continue;
        const ops_weight *ws[4] = { &L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha };
        sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(4, ws, T));
        sc = TM_MAX(sc, ops_matmul_scratch_bytes(L->ssm_out.type, L->ssm_out.cols, T));
    }
    return sc;
}

void engine_qwen35_free(engine_qwen35 *q)
{
    if (!q) return;
    free(q->rec);
    free(q->mix);
    free(q->cv);
    free(q->z);
    free(q->beta);
    free(q->alpha);
    free(q->o);
    free(q->qg);
    free(q->gate);
    free(q->shg);
    free(q->tmp);
    free(q->st);
    free(q->npos);
    free(q->first);
    free(q->last);
    free(q->nxt);
    free(q->reset);
    free(q->snap);
    free(q->snap_data);
    free(q->snap_at);
    free(q);
}

engine_qwen35 *engine_qwen35_new(const model *m, int max_tokens, int n_threads)
{
    const model_hparams *hp = &m->hp;
    engine_qwen35 *q = xcalloc(1, sizeof *q);
    q->m = m;
    q->max_tokens = max_tokens;
    q->n_threads = n_threads;
    q->H = hp->ssm_v_heads, q->Hk = hp->ssm_k_heads, q->S = hp->ssm_head, q->K = hp->ssm_conv;
    q->conv_ch = (2 * q->Hk + q->H) * q->S;
    q->qd = hp->n_heads * hp->head_dim;
    q->conv_floats = (size_t)q->conv_ch * (size_t)(q->K - 1);
    q->layer_floats = q->conv_floats + (size_t)q->H * q->S * q->S;
    q->rec = xmalloc((size_t)hp->n_layers * sizeof *q->rec);
    for (int il = 0, r = 0; il < hp->n_layers; il++) q->rec[il] = m->layers[il].ssm_out.data ? r++ : -1;
    size_t T = (size_t)max_tokens, vs = (size_t)q->H * q->S;
    q->mix = util_aligned_alloc(T * q->conv_ch * sizeof(float));
    q->cv = util_aligned_alloc(T * q->conv_ch * sizeof(float));
    q->z = util_aligned_alloc(T * vs * sizeof(float));
    q->beta = util_aligned_alloc(T * q->H * sizeof(float));
    q->alpha = util_aligned_alloc(T * q->H * sizeof(float));
    q->o = util_aligned_alloc(T * vs * sizeof(float));
    q->qg = util_aligned_alloc(T * 2 * q->qd * sizeof(float));
    q->gate = util_aligned_alloc(T * q->qd * sizeof(float));
    q->shg = util_aligned_alloc(T * sizeof(float));
    q->tmp = util_aligned_alloc((size_t)n_threads * 2 * q->S * sizeof(float));
    q->st = calloc(T, sizeof *q->st);
    q->npos = calloc(T, sizeof *q->npos);
    q->first = calloc(T, sizeof *q->first);
    q->last = calloc(T, sizeof *q->last);
    q->nxt = calloc(T, sizeof *q->nxt);
    q->reset = calloc(T, sizeof *q->reset);
    q->n_snap_max = (int)(T / KVPOOL_BLOCK) + 16;
    q->snap = calloc((size_t)q->n_snap_max, sizeof *q->snap);
    /* faulted in as states are captured: most steps cross no block boundary */
    q->snap_data = calloc((size_t)q->n_snap_max, engine_qwen35_state_bytes(m));
    q->snap_at = calloc(T, sizeof *q->snap_at);
    if (!q->snap || !q->snap_data || !q->snap_at || !q->mix || !q->cv || !q->z || !q->beta || !q->alpha || !q->o || !q->qg || !q->gate || !q->shg || !q->tmp ||
        !q->st || !q->npos || !q->first || !q->last || !q->nxt || !q->reset) {
        engine_qwen35_free(q);
        return NULL;
    }
    return q;
}

bool engine_qwen35_plan(engine_qwen35 *q, kvpool *kv, const engine_batch *b)
{
    const int T = b->n_tokens;
    int n = 0;
    for (int t = 0; t < T; t++) {
        const engine_tok *tk = &b->toks[t];
        uint8_t *base = kvpool_seq_state(kv, tk->seq);
        if (!base) return false;
        int si = n - 1;
        while (si >= 0 && (void *)q->npos[si] != (void *)base) si--;
        if (si < 0) {   /* its first entry: continues its state, or restarts it */
            si = n++;
            q->npos[si] = (int64_t *)base;
            q->st[si] = (float *)(base + Q35_HEADER);
            q->first[si] = q->last[si] = t;
            q->reset[si] = tk->pos == 0;
            if (tk->pos != 0 && tk->pos != *q->npos[si]) return false;
        } else {
            if (tk->pos != b->toks[q->last[si]].pos + 1) return false;
            q->nxt[q->last[si]] = t;
            q->last[si] = t;
        }
        q->nxt[t] = -1;
    }
    for (int si = 0; si < n; si++)
        if (q->reset[si]) memset(q->npos[si], 0, engine_qwen35_state_bytes(q->m));
    /* the block ends crossed: the state after the entry at end - 1 */
    const size_t sb = engine_qwen35_state_bytes(q->m);
    q->n_snap = 0;
    for (int t = 0; t < T; t++) {
        q->snap_at[t] = -1;
        int end = b->toks[t].pos + 1;
        if (end % KVPOOL_BLOCK) continue;
        if (q->n_snap == q->n_snap_max) {
            q->n_snap_dropped++;
            continue;
        }
        uint8_t *dst = q->snap_data + (size_t)q->n_snap * sb;
        memset(dst, 0, Q35_HEADER);
        *(int64_t *)dst = end;
        q->snap[q->n_snap] = (engine_window_state){ .seq = b->toks[t].seq, .end = end, .state = dst };
        q->snap_at[t] = q->n_snap++;
    }
    q->b = b;
    q->n_sq = n;
    return true;
}

int engine_qwen35_states(const engine_qwen35 *q, const engine_window_state **out)
{
    *out = q->snap;
    return q->n_snap;
}

/* The state buffer of capture i for (recurrent layer r): what q->st[si] + r * layer_floats is
 * for the sequence. */
static float *q35_snap_layer(engine_qwen35 *q, int i, int r)
{
    return (float *)(q->snap_data + (size_t)i * engine_qwen35_state_bytes(q->m) + Q35_HEADER) +
           (size_t)r * q->layer_floats;
}

void engine_qwen35_commit(engine_qwen35 *q)
{
    for (int si = 0; si < q->n_sq; si++) *q->npos[si] = q->b->toks[q->last[si]].pos + 1;
}

/* sum of a[i] * b[i] in 8 lanes, then the lanes pairwise: one order whatever the caller */
static inline float q35_dot(const float *a, const float *b, int n)
{
    float l[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) l[k] += a[i + k] * b[i + k];
    for (; i < n; i++) l[i & 7] += a[i] * b[i];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static inline float q35_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float q35_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ggml_l2_norm: x / max(||x||, eps), the sum of squares in double */
static void q35_l2norm(float *out, const float *x, int n, float eps)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    float scale = 1.0f / fmaxf(sqrtf((float)sum), eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale;
}

static void q35_job_conv(void *ctx, int ith, int nth)
{
    engine_qwen35 *q = ctx;
    const model_layer *L = &q->m->layers[q->il];
    const int nc = (q->conv_ch + Q35_CONV_CHUNK - 1) / Q35_CONV_CHUNK, K = q->K, r = q->rec[q->il];
    (void)ith, (void)nth;
    for (;;) {
        int it = __atomic_fetch_add(&q->next, 1, __ATOMIC_RELAXED);
        if (it >= q->n_sq * nc) break;
        int si = it / nc, c0 = it % nc * Q35_CONV_CHUNK, c1 = TM_MIN(q->conv_ch, c0 + Q35_CONV_CHUNK);
        float *cs = q->st[si] + (size_t)r * q->layer_floats;   /* (conv_ch, K - 1) */
        for (int t = q->first[si]; t >= 0; t = q->nxt[t]) {
            const float *x = q->mix + (size_t)t * q->conv_ch;
            float *y = q->cv + (size_t)t * q->conv_ch;
            for (int c = c0; c < c1; c++) {
                float *s = cs + (size_t)c * (K - 1);
                const float *w = L->ssm_conv1d + (size_t)c * K;
                float sum = 0.0f;
                for (int k = 0; k < K - 1; k++) sum += s[k] * w[k];
                sum += x[c] * w[K - 1];
                y[c] = q35_silu(sum);
                for (int k = 0; k + 1 < K - 1; k++) s[k] = s[k + 1];
                s[K - 2] = x[c];
            }
            if (q->snap_at[t] >= 0)
                memcpy(q35_snap_layer(q, q->snap_at[t], r) + (size_t)c0 * (K - 1), cs + (size_t)c0 * (K - 1),
                       (size_t)(c1 - c0) * (K - 1) * sizeof(float));
        }
    }
}

static void q35_job_delta(void *ctx, int ith, int nth)
{
    engine_qwen35 *q = ctx;
    const model_layer *L = &q->m->layers[q->il];
    const int H = q->H, Hk = q->Hk, S = q->S, r = q->rec[q->il], ch = q->conv_ch;
    const float eps = q->m->hp.rms_eps, scale = 1.0f / sqrtf((float)S);
    float *qn = q->tmp + (size_t)ith * 2 * S, *kn = qn + S;
    (void)nth;
    for (;;) {
        int it = __atomic_fetch_add(&q->next, 1, __ATOMIC_RELAXED);
        if (it >= q->n_sq * H) break;
        int si = it / H, h = it % H, kh = h % Hk;
        float *M = q->st[si] + (size_t)r * q->layer_floats + q->conv_floats + (size_t)h * S * S;
        for (int t = q->first[si]; t >= 0; t = q->nxt[t]) {
            const float *c = q->cv + (size_t)t * ch;
            q35_l2norm(qn, c + (size_t)kh * S, S, eps);
            q35_l2norm(kn, c + (size_t)(Hk + kh) * S, S, eps);
            const float *v = c + (size_t)(2 * Hk + h) * S;
            float a = q->alpha[(size_t)t * H + h] + L->ssm_dt[h];
            float sp = a > 20.0f ? a : logf(1.0f + expf(a));
            float g = expf(sp * L->ssm_a[h]);
            float beta = q35_sigmoid(q->beta[(size_t)t * H + h]);
            float *o = q->o + (size_t)t * H * S + (size_t)h * S;
            for (int j = 0; j < S; j++) {
                float *row = M + (size_t)j * S;
                for (int i = 0; i < S; i++) row[i] *= g;
                float d = (v[j] - q35_dot(row, kn, S)) * beta;
                for (int i = 0; i < S; i++) row[i] += kn[i] * d;
                o[j] = q35_dot(row, qn, S) * scale;
            }
            if (q->snap_at[t] >= 0)
                memcpy(q35_snap_layer(q, q->snap_at[t], r) + q->conv_floats + (size_t)h * S * S, M,
                       (size_t)S * S * sizeof(float));
        }
    }
}

static void q35_job_gnorm(void *ctx, int ith, int nth)
{
    engine_qwen35 *q = ctx;
    const model_layer *L = &q->m->layers[q->il];
    const int64_t rows = (int64_t)q->b->n_tokens * q->H;
    const int64_t r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    if (r1 <= r0) return;
    float *o = q->o + (size_t)r0 * q->S;
    const float *z = q->z + (size_t)r0 * q->S;
    ops_rmsnorm(NULL, o, o, L->ssm_norm, (int)(r1 - r0), q->S, q->m->hp.rms_eps);
    for (int64_t i = 0; i < (r1 - r0) * q->S; i++) o[i] = o[i] * q35_silu(z[i]);
}

void engine_qwen35_linear(engine_qwen35 *q, threadpool *tp, int il, float *xn, void *mm_scratch)
{
    const model_layer *L = &q->m->layers[il];
    const int T = q->b->n_tokens;
    const ops_weight *ws[4] = { &L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha };
    float *ys[4] = { q->mix, q->z, q->beta, q->alpha };
    ops_matmul_multi(tp, 4, ws, xn, T, ys, mm_scratch);
    q->il = il;
    q->next = 0;
    threadpool_run(tp, q35_job_conv, q);
    q->next = 0;
    threadpool_run(tp, q35_job_delta, q);
    threadpool_run(tp, q35_job_gnorm, q);
    ops_matmul(tp, &L->ssm_out, q->o, T, xn, mm_scratch);
}

float *engine_qwen35_qg(engine_qwen35 *q) { return q->qg; }

void engine_qwen35_split(engine_qwen35 *q, int T, float *qout)
{
    const int nh = q->m->hp.n_heads, hd = q->m->hp.head_dim;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *src = q->qg + ((size_t)t * nh + h) * 2 * hd;
            memcpy(qout + ((size_t)t * nh + h) * hd, src, (size_t)hd * sizeof(float));
            memcpy(q->gate + ((size_t)t * nh + h) * hd, src + hd, (size_t)hd * sizeof(float));
        }
}

void engine_qwen35_gate(engine_qwen35 *q, int T, float *att)
{
    for (size_t i = 0; i < (size_t)T * q->qd; i++) att[i] = att[i] * q35_sigmoid(q->gate[i]);
}

void engine_qwen35_shgate_compute(engine_qwen35 *q, int il, const float *xn, int T)
{
    const model_layer *L = &q->m->layers[il];
    const int dim = q->m->hp.dim;
    for (int t = 0; t < T; t++) q->shg[t] = q35_sigmoid(q35_dot(xn + (size_t)t * dim, L->gate_inp_shexp, dim));
}

const float *engine_qwen35_shgate(const engine_qwen35 *q) { return q->shg; }
