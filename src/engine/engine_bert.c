/*
 * engine_bert: a BERT encoder's step (engine_bert.h). Per step: the input rows and their
 * LayerNorm; per block Q/K/V in one matmul call, bidirectional attention per (sequence,
 * head) work item, the output projection, add and LayerNorm, up, GELU, down, add and
 * LayerNorm. Row-wise stages split the rows over the pool's threads; every output is
 * computed by one thread in a fixed order, so a sequence's states do not depend on the other
 * sequences of its step or the thread count. All buffers are allocated in engine_bert_new.
 */
#include "engine/engine_bert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/ops.h"
#include "model/quant.h"
#include "util/util.h"

struct engine_bert {
    const model *m;
    threadpool *tp;
    int max_tokens;
    float *q;                /* (T, n_heads * head_dim) */
    float *k;                /* (T, n_kv_heads * head_dim) */
    float *v;                /* (T, n_kv_heads * head_dim) */
    float *att;              /* (T, n_heads * head_dim) attention output */
    float *y;                /* (T, dim) a sublayer's output */
    float *ff;               /* (T, ffn_dim) up, then GELU (nomic-bert: gate, then SwiGLU) */
    float *ff2;              /* (T, ffn_dim) nomic-bert's up, or NULL */
    float *scores;           /* (n_threads, T) one query's scores per thread */
    int32_t *run0;           /* (T + 1) first entry of each sequence's run, then n */
    int n_runs;
    void *mm_scratch;        /* matmul activation scratch */
};

void engine_bert_free(engine_bert *b)
{
    if (!b) return;
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->att);
    free(b->y);
    free(b->ff);
    free(b->ff2);
    free(b->scores);
    free(b->run0);
    free(b->mm_scratch);
    free(b);
}

static size_t engine_bert_scratch(const ops_weight *w, int T, size_t cur)
{
    return TM_MAX(cur, ops_matmul_scratch_bytes(w->type, w->cols, T));
}

engine_bert *engine_bert_new(const model *m, threadpool *tp, int max_tokens)
{
    const model_hparams *hp = &m->hp;
    engine_bert *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->m = m;
    b->tp = tp;
    b->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens, qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    b->q = malloc(T * qd * sizeof(float));
    b->k = malloc(T * kvd * sizeof(float));
    b->v = malloc(T * kvd * sizeof(float));
    b->att = malloc(T * qd * sizeof(float));
    b->y = malloc(T * (size_t)hp->dim * sizeof(float));
    b->ff = malloc(T * (size_t)hp->ffn_dim * sizeof(float));
    b->scores = malloc((size_t)threadpool_size(tp) * T * sizeof(float));
    b->run0 = malloc((T + 1) * sizeof(int32_t));
    size_t sc = 0;
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &m->layers[il];
        const ops_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
        sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(3, qkv, max_tokens));
        sc = engine_bert_scratch(&L->wo, max_tokens, sc);
        sc = engine_bert_scratch(&L->up, max_tokens, sc);
        if (L->gate.data) {
            const ops_weight *gu[2] = { &L->gate, &L->up };
            sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(2, gu, max_tokens));
        }
        sc = engine_bert_scratch(&L->down, max_tokens, sc);
    }
    b->mm_scratch = util_aligned_alloc(sc + 64);
    if (m->hp.arch == MODEL_ARCH_NOMIC_BERT && !(b->ff2 = malloc(T * (size_t)hp->ffn_dim * sizeof(float)))) {
        engine_bert_free(b);
        return NULL;
    }
    if (!b->q || !b->k || !b->v || !b->att || !b->y || !b->ff || !b->scores || !b->run0 || !b->mm_scratch) {
        engine_bert_free(b);
        return NULL;
    }
    return b;
}

/* ggml_norm then the affine: (x - mean) / sqrt(var + eps) * w + bias, in place. */
static void engine_bert_layernorm(float *x, int n, const float *w, const float *bias, float eps)
{
    double sum = 0;   /* ggml_vec_sum_f32: in ggml_float (double), stored as float */
    for (int i = 0; i < n; i++) sum += x[i];
    const float mean = (float)sum / (float)n;
    double var = 0;   /* ggml_vec_cvar_f32 sums the squares in ggml_float (double) */
    for (int i = 0; i < n; i++) {
        x[i] -= mean;
        var += (double)(x[i] * x[i]);
    }
    const float scale = 1.0f / sqrtf((float)(var / n) + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * scale * w[i] + bias[i];
}

static void engine_bert_bias(float *y, const float *bias, int n)
{
    if (bias)
        for (int i = 0; i < n; i++) y[i] += bias[i];
}

typedef enum {
    BERT_JOB_EMBED,          /* x = LN(tok + type 0 + pos) */
    BERT_JOB_QKV_BIAS,       /* q, k, v += their biases */
    BERT_JOB_ATTENTION,      /* att, per (run, head) */
    BERT_JOB_ADD_NORM_ATT,   /* x = LN(x + y + bo) with the attention's norm */
    BERT_JOB_GELU,           /* ff = gelu(ff + up_b) */
    BERT_JOB_ADD_NORM_FFN,   /* x = LN(x + y + down_b) with the FFN's norm */
} engine_bert_op;

typedef struct {
    engine_bert *b;
    engine_bert_op op;
    int n;                   /* batch entries */
    const engine_tok *toks;  /* (n) */
    float *x;                /* (n, dim) */
    const model_layer *L;
} engine_bert_job;

static void engine_bert_attention(const engine_bert_job *j, int item, float *sc)
{
    const engine_bert *b = j->b;
    const model_hparams *hp = &b->m->hp;
    const int H = hp->n_heads, hd = hp->head_dim, qd = H * hd, kvd = hp->n_kv_heads * hd;
    const int r = item / H, h = item % H, kvh = h / (H / hp->n_kv_heads);
    const int t0 = b->run0[r], nt = b->run0[r + 1] - t0;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < nt; i++) {
        const float *q = b->q + (size_t)(t0 + i) * qd + (size_t)h * hd;
        float mx = -INFINITY;
        for (int k = 0; k < nt; k++) {
            sc[k] = ops_vec_dot_f32(hd, q, b->k + (size_t)(t0 + k) * kvd + (size_t)kvh * hd) * scale;
            mx = sc[k] > mx ? sc[k] : mx;
        }
        float sum = ops_vec_softmax_exp(nt, sc, mx);
        float *o = b->att + (size_t)(t0 + i) * qd + (size_t)h * hd;
        memset(o, 0, (size_t)hd * sizeof *o);
        for (int k = 0; k < nt; k++) ops_vec_mad_f32(hd, o, b->v + (size_t)(t0 + k) * kvd + (size_t)kvh * hd, sc[k]);
        ops_vec_scale_f32(hd, o, 1.0f / sum);
    }
}

static void engine_bert_run(void *ctx, int ith, int nth)
{
    const engine_bert_job *j = ctx;
    engine_bert *b = j->b;
    const model *m = b->m;
    const model_hparams *hp = &m->hp;
    const model_layer *L = j->L;
    const int dim = hp->dim, qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim;
    if (j->op == BERT_JOB_ATTENTION) {
        for (int it = ith; it < b->n_runs * hp->n_heads; it += nth)
            engine_bert_attention(j, it, b->scores + (size_t)ith * (size_t)b->max_tokens);
        return;
    }
    const int t_lo = (int)((int64_t)j->n * ith / nth), t_hi = (int)((int64_t)j->n * (ith + 1) / nth);
    for (int t = t_lo; t < t_hi; t++) {
        float *x = j->x + (size_t)t * dim, *y = b->y + (size_t)t * dim;
        switch (j->op) {
        case BERT_JOB_EMBED:
            model_embed_row(m, j->toks[t].token, x);
            if (m->type_row)
                for (int d = 0; d < dim; d++) x[d] += m->type_row[d];
            if (m->pos_embd)
                for (int d = 0; d < dim; d++) x[d] += m->pos_embd[(size_t)j->toks[t].pos * dim + d];
            engine_bert_layernorm(x, dim, m->embd_norm, m->embd_norm_b, hp->norm_eps);
            break;
        case BERT_JOB_QKV_BIAS:
            engine_bert_bias(b->q + (size_t)t * qd, L->bq, qd);
            engine_bert_bias(b->k + (size_t)t * kvd, L->bk, kvd);
            engine_bert_bias(b->v + (size_t)t * kvd, L->bv, kvd);
            if (!m->pos_embd) {   /* nomic-bert: RoPE on Q and K at the entry's position */
                ops_rope_ggml(NULL, b->q + (size_t)t * qd, &j->toks[t].pos, 1, hp->n_heads, hp->head_dim, hp->n_rot,
                              hp->rope_neox, hp->rope_theta_scale, hp->rope_freq_scale, hp->rope_freq_factors,
                              hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
                ops_rope_ggml(NULL, b->k + (size_t)t * kvd, &j->toks[t].pos, 1, hp->n_kv_heads, hp->head_dim, hp->n_rot,
                              hp->rope_neox, hp->rope_theta_scale, hp->rope_freq_scale, hp->rope_freq_factors,
                              hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
            }
            break;
        case BERT_JOB_ADD_NORM_ATT:
        case BERT_JOB_ADD_NORM_FFN: {
            const bool att = j->op == BERT_JOB_ADD_NORM_ATT;
            engine_bert_bias(y, att ? L->bo : L->down_b, dim);
            for (int d = 0; d < dim; d++) x[d] += y[d];
            engine_bert_layernorm(x, dim, att ? L->attn_norm : L->ffn_norm, att ? L->attn_norm_b : L->ffn_norm_b,
                                  hp->norm_eps);
            break;
        }
        case BERT_JOB_GELU: {
            float *f = b->ff + (size_t)t * hp->ffn_dim;
            engine_bert_bias(f, L->up_b, hp->ffn_dim);
            for (int d = 0; d < hp->ffn_dim; d++) f[d] = ops_gelu(f[d]);
            break;
        }
        default:
            break;
        }
    }
}

/* The runs of the batch into b->run0; false when it is not one whole run per sequence. */
static bool engine_bert_plan(engine_bert *b, int n, const engine_tok *toks)
{
    b->n_runs = 0;
    for (int t = 0; t < n; t++) {
        const engine_tok *tk = &toks[t];
        if (tk->want_logits || tk->pos >= b->m->hp.n_ctx_train) return false;
        if (t > 0 && tk->seq == toks[t - 1].seq) {
            if (tk->pos != toks[t - 1].pos + 1) return false;
            continue;
        }
        if (tk->pos != 0) return false;
        for (int r = 0; r < b->n_runs; r++)
            if (toks[b->run0[r]].seq == tk->seq) return false;
        b->run0[b->n_runs++] = t;
    }
    b->run0[b->n_runs] = n;
    return true;
}

bool engine_bert_step(engine_bert *b, int n, const engine_tok *toks, float *x)
{
    if (n <= 0 || n > b->max_tokens || !engine_bert_plan(b, n, toks)) return false;
    const model_hparams *hp = &b->m->hp;
    engine_bert_job j = { .b = b, .op = BERT_JOB_EMBED, .n = n, .toks = toks, .x = x };
    threadpool_run(b->tp, engine_bert_run, &j);
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &b->m->layers[il];
        j.L = L;
        const ops_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
        float *ys[3] = { b->q, b->k, b->v };
        ops_matmul_multi(b->tp, 3, qkv, x, n, ys, b->mm_scratch);
        j.op = BERT_JOB_QKV_BIAS;
        threadpool_run(b->tp, engine_bert_run, &j);
        j.op = BERT_JOB_ATTENTION;
        threadpool_run(b->tp, engine_bert_run, &j);
        ops_matmul(b->tp, &L->wo, b->att, n, b->y, b->mm_scratch);
        j.op = BERT_JOB_ADD_NORM_ATT;
        threadpool_run(b->tp, engine_bert_run, &j);
        if (L->gate.data) {   /* nomic-bert: silu(gate) * up */
            const ops_weight *gu[2] = { &L->gate, &L->up };
            float *ys2[2] = { b->ff, b->ff2 };
            ops_matmul_multi(b->tp, 2, gu, x, n, ys2, b->mm_scratch);
            ops_swiglu(b->tp, b->ff, b->ff, b->ff2, n, hp->ffn_dim);
        } else {
            ops_matmul(b->tp, &L->up, x, n, b->ff, b->mm_scratch);
            j.op = BERT_JOB_GELU;
            threadpool_run(b->tp, engine_bert_run, &j);
        }
        ops_matmul(b->tp, &L->down, b->ff, n, b->y, b->mm_scratch);
        j.op = BERT_JOB_ADD_NORM_FFN;
        threadpool_run(b->tp, engine_bert_run, &j);
    }
    return true;
}
