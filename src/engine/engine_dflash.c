/*
 * engine_dflash: a DFlash / DSpark drafter's injection and block pass (engine_dflash.h).
 *
 * The arithmetic is the Qwen3 layer's (engine.c) without its batching tricks: the drafter is
 * small and its passes are short, so each step here is plain ops calls over the rows of the
 * call, and attention is one (block, head) item per thread at a time with an online softmax
 * over the sequence's 128-position slabs (F32 KV: the drafter's cache keeps no rounding of
 * its own, as the oracle's F32 cache).
 *
 * A drafter with the DeepSeek V4 backbone (m->dsv4) runs its layers through engine_dsv4 over a
 * pool of V4 rows (engine_dsv4_kv_geometry without compressed layers: one raw K=V row per layer
 * and position, in blocks): injection
 * writes rope(kv_norm(wkv . g)) with the uncompressed layers' RoPE into the rows, the block pass
 * is engine_dsv4_block (hyper-connections, sinks, the window, MoE) with the block non-causal;
 * the confidence head then reads the collapsed streams before the output norm, as llama.cpp's
 * dsv4 graph does.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_dflash.h"
#include "engine/engine_dsv4.h"
#include "model/model_dsv4.h"
#include "util/threadpool.h"
#include "util/util.h"

struct engine_dflash {
    const model *d;          /* the drafter */
    const model *t;          /* its target: embedding and head unless the drafter has its own */
    const model_dflash *df;
    threadpool *tp;
    kvpool *kv;              /* F32, the drafter's layers */
    int max_seqs, max_tokens;
    int max_rows;            /* max(max_tokens, max_seqs * ENGINE_DFLASH_MAX_BLOCK) */
    const ops_weight *head;  /* (n_vocab, dim) the output head used */
    const model *embd;       /* whose token_embd the block reads */
    float *feat;             /* (max_tokens, n_tl * dim) gathered target features */
    float *x;                /* (max_rows, dim) residual stream / g */
    float *xn;               /* (max_rows, dim) normed */
    float *q;                /* (max_rows, n_heads * head_dim) */
    float *k, *v;            /* (max_rows, n_kv_heads * head_dim) */
    float *att;              /* (max_rows, n_heads * head_dim) */
    float *ffa, *ffb;        /* (max_rows, ffn_dim) */
    float *logits;           /* (max_seqs * MAX_BLOCK, n_vocab) */
    float *bias;             /* (max_seqs, n_vocab) the Markov bias of one slot */
    float *w1p;              /* (max_seqs, R) w1[prev] of one slot */
    int32_t *pos;            /* (max_rows) */
    kvpool_seq **rseq;       /* (max_rows) the sequence of each row */
    int32_t *prev;           /* (max_seqs) the Markov chain's previous token of each block */
    void *mm;                /* matmul scratch */
    float *att_tmp;          /* (n_threads, ENGINE_DFLASH_MAX_BLOCK * (KVPOOL_BLOCK + head_dim + 2)) */
    size_t att_stride;       /* floats per thread */
    /* the V4 backbone, NULL for Qwen3's */
    engine_dsv4 *v4;         /* its layers over kv */
    engine_tok *toks;        /* (max_rows) a block pass's entries */
    int32_t *last;           /* (max_rows) each entry's block end */
};

/* One draft pass's attention job: items are (block, head). */
typedef struct {
    engine_dflash *ed;
    const engine_dflash_block *blocks;
    int B, layer;
    _Atomic int next;
    int n_items;
} dflash_att_job;

void engine_dflash_free(engine_dflash *ed)
{
    if (!ed) return;
    engine_dsv4_free(ed->v4);
    free(ed->toks), free(ed->last);
    kvpool_free(ed->kv);
    threadpool_free(ed->tp);
    free(ed->feat), free(ed->x), free(ed->xn), free(ed->q), free(ed->k), free(ed->v), free(ed->att);
    free(ed->ffa), free(ed->ffb), free(ed->logits), free(ed->bias), free(ed->w1p), free(ed->pos);
    free(ed->mm), free(ed->att_tmp), free(ed->rseq), free(ed->prev);
    free(ed);
}

kvpool *engine_dflash_kvpool(engine_dflash *ed) { return ed->kv; }
const model_dflash *engine_dflash_model(const engine_dflash *ed) { return ed->df; }
const model *engine_dflash_drafter(const engine_dflash *ed) { return ed->d; }
int engine_dflash_features(const engine_dflash *ed) { return ed->df->n_tl * ed->d->hp.dim; }

static size_t engine_dflash_mm_bytes(const engine_dflash *ed)
{
    const model *d = ed->d;
    size_t b = ops_matmul_scratch_bytes(ed->df->fc.type, ed->df->fc.cols, ed->max_tokens);
    for (int il = 0; il < d->hp.n_layers; il++) {
        const model_layer *L = &d->layers[il];
        const ops_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down,
                                   d->dsv4 ? &d->dsv4->layers[il].wkv : &L->wk };
        for (size_t i = 0; i < TM_ARRAY_LEN(ws); i++)
            if (ws[i]->data) b = TM_MAX(b, ops_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, ed->max_rows));
    }
    b = TM_MAX(b, ops_matmul_scratch_bytes(ed->head->type, ed->head->cols, ed->max_rows));
    if (ed->df->markov_rank)
        b = TM_MAX(b, ops_matmul_scratch_bytes(ed->df->markov_w2.type, ed->df->markov_w2.cols, ed->max_seqs));
    return b + 64;
}

engine_dflash *engine_dflash_new(const model *d, const model *t, const engine_dflash_opts *o, char *err,
                                 size_t errsz)
{
    const model_hparams *hp = &d->hp;
    const model_dflash *df = d->dflash;
    engine_dflash *ed = xcalloc(1, sizeof *ed);
    ed->d = d, ed->t = t, ed->df = df;
    ed->max_seqs = TM_MAX(o->max_seqs, 1);
    ed->max_tokens = o->max_tokens > 0 ? o->max_tokens : 512;
    ed->max_rows = TM_MAX(ed->max_tokens, ed->max_seqs * ENGINE_DFLASH_MAX_BLOCK);
    ed->head = df->own_head ? &d->output : &t->output;
    ed->embd = df->own_embd ? d : t;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = o->n_threads > 0 ? o->n_threads : (nc > 0 ? (int)nc : 1);
    ed->tp = threadpool_new(nth);
    int n_ctx = TM_MAX(o->n_ctx, 1) + ENGINE_DFLASH_MAX_BLOCK;
    kvpool_opts ko = { .n_layers = hp->n_layers, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
                       .dtype = QTYPE_F32 };
    /* a drafter's layers are uncompressed (model_dflash.c): its raw rows are in blocks, F32 */
    int32_t *lw = d->dsv4 ? xcalloc(ENGINE_DSV4_GEOM_ROOM * (size_t)engine_dsv4_pool_layers(d), sizeof *lw) : NULL;
    if (d->dsv4) ko = engine_dsv4_kv_geometry(d, QTYPE_F32, lw);
    ko.n_blocks = ed->max_seqs * ((n_ctx + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK);
    memcpy(ko.model_fp, d->fingerprint, 32);
    bool kv_ok = ed->tp && kvpool_new(&ko, &ed->kv) == KVPOOL_OK;
    free(lw);
    if (!kv_ok) goto nomem;
    if (d->dsv4) {
        /* the attention scratch holds the window plus a block: max_pos covers it */
        ed->v4 = engine_dsv4_new(d, ed->tp, ed->kv, ed->max_rows, TM_MAX(n_ctx, 4 * ENGINE_DFLASH_MAX_BLOCK), err,
                                 errsz);
        ed->toks = malloc((size_t)ed->max_rows * sizeof *ed->toks);
        ed->last = malloc((size_t)ed->max_rows * sizeof *ed->last);
        if (!ed->v4 || !ed->toks || !ed->last) goto nomem;
    }
    const size_t R = (size_t)ed->max_rows, dim = (size_t)hp->dim, qd = (size_t)hp->n_heads * hp->head_dim,
                 kvd = (size_t)hp->n_kv_heads * hp->head_dim, nv = (size_t)hp->n_vocab;
    ed->feat = malloc((size_t)ed->max_tokens * (size_t)df->n_tl * dim * sizeof(float));
    ed->x = malloc(R * dim * sizeof(float));
    ed->xn = malloc(R * dim * sizeof(float));
    ed->q = malloc(R * qd * sizeof(float));
    ed->k = malloc(R * kvd * sizeof(float));
    ed->v = malloc(R * kvd * sizeof(float));
    ed->att = malloc(R * qd * sizeof(float));
    ed->ffa = malloc(R * (size_t)hp->ffn_dim * sizeof(float));
    ed->ffb = malloc(R * (size_t)hp->ffn_dim * sizeof(float));
    ed->logits = malloc((size_t)ed->max_seqs * ENGINE_DFLASH_MAX_BLOCK * nv * sizeof(float));
    ed->bias = malloc((size_t)ed->max_seqs * nv * sizeof(float));
    ed->w1p = malloc((size_t)ed->max_seqs * (size_t)TM_MAX(df->markov_rank, 1) * sizeof(float));
    ed->pos = malloc(R * sizeof(int32_t));
    ed->rseq = malloc(R * sizeof *ed->rseq);
    ed->prev = malloc((size_t)ed->max_seqs * sizeof *ed->prev);
    ed->mm = aligned_alloc(64, TM_ALIGN_UP(engine_dflash_mm_bytes(ed), 64));
    ed->att_stride = (size_t)ENGINE_DFLASH_MAX_BLOCK * (KVPOOL_BLOCK + (size_t)hp->head_dim + 2);
    ed->att_tmp = malloc((size_t)nth * ed->att_stride * sizeof(float));
    if (!ed->feat || !ed->x || !ed->xn || !ed->q || !ed->k || !ed->v || !ed->att || !ed->ffa || !ed->ffb ||
        !ed->logits || !ed->bias || !ed->w1p || !ed->pos || !ed->mm || !ed->att_tmp || !ed->rseq || !ed->prev)
        goto nomem;
    return ed;
nomem:
    snprintf(err, errsz, "out of memory for the dflash drafter (%d sequences of %d positions)", ed->max_seqs, n_ctx);
    engine_dflash_free(ed);
    return NULL;
}

/* q/k head norms and RoPE of rows [0, n) at ed->pos; k and v into the pool at (seqs[r], pos). */
static void engine_dflash_kv_rows(engine_dflash *ed, int il, int n, bool with_q, kvpool_seq *const *seqs)
{
    const model_hparams *hp = &ed->d->hp;
    const model_layer *L = &ed->d->layers[il];
    const int hd = hp->head_dim, kvd = hp->n_kv_heads * hd;
    if (with_q) {
        ops_rmsnorm(ed->tp, ed->q, ed->q, L->q_norm, n * hp->n_heads, hd, hp->rms_eps);
        ops_rope_ggml(ed->tp, ed->q, ed->pos, n, hp->n_heads, hd, hp->n_rot, hp->rope_neox, hp->rope_theta_scale,
                      hp->rope_freq_scale, hp->rope_freq_factors, hp->rope_attn_factor, NULL);
    }
    ops_rmsnorm(ed->tp, ed->k, ed->k, L->k_norm, n * hp->n_kv_heads, hd, hp->rms_eps);
    ops_rope_ggml(ed->tp, ed->k, ed->pos, n, hp->n_kv_heads, hd, hp->n_rot, hp->rope_neox, hp->rope_theta_scale,
                  hp->rope_freq_scale, hp->rope_freq_factors, hp->rope_attn_factor, NULL);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < hp->n_kv_heads; h++)
            kvpool_seq_store(ed->kv, seqs[r], ed->pos[r], il, h, ed->k + (size_t)r * kvd + (size_t)h * hd,
                             ed->v + (size_t)r * kvd + (size_t)h * hd);
}

/* V4 backbone: each layer's K=V row of the m rows of g in ed->x, as dflash.cpp's dsv4 graph
 * injects it (kv_norm(wkv . g), RoPE on the last n_rot dims with the uncompressed layers'
 * parameters), into offset 0 of the pool's row (engine_dsv4.h's raw K=V). */
static void engine_dflash_inject_v4(engine_dflash *ed, int m, kvpool_seq *const *seqs)
{
    const model *d = ed->d;
    const model_dsv4 *md = d->dsv4;
    const int hd = d->hp.head_dim, n_rot = d->hp.n_rot, row = engine_dsv4_row(d);
    const model_dsv4_rope *rp = &md->rope_raw;
    for (int il = 0; il < d->hp.n_layers; il++) {
        const model_dsv4_layer *dl = &md->layers[il];
        ops_matmul(ed->tp, &dl->wkv, ed->x, m, ed->k, ed->mm);
        ops_rmsnorm(ed->tp, ed->k, ed->k, dl->kv_norm, m, hd, d->hp.rms_eps);
        ops_rope_ggml(NULL, ed->k + (hd - n_rot), ed->pos, m, 1, hd, n_rot, 0, rp->theta_scale, rp->freq_scale, NULL,
                      rp->mscale, rp->yarn[0] != 0.0f ? rp->yarn : NULL);
        for (int r = 0; r < m; r++) {
            float *slab = kvpool_seq_slab(ed->kv, seqs[r], ed->pos[r] / KVPOOL_BLOCK, il, 0, 0);
            memcpy(slab + (size_t)(ed->pos[r] % KVPOOL_BLOCK) * (size_t)row, ed->k + (size_t)r * hd,
                   (size_t)hd * sizeof(float));
        }
    }
}

engine_status engine_dflash_inject(engine_dflash *ed, int n, const engine_dflash_inj *inj)
{
    const model_hparams *hp = &ed->d->hp;
    const model_dflash *df = ed->df;
    const size_t F = (size_t)df->n_tl * hp->dim;
    kvpool_seq **seqs = ed->rseq;
    for (int i0 = 0; i0 < n; i0 += ed->max_tokens) {
        const int m = TM_MIN(ed->max_tokens, n - i0);
        for (int r = 0; r < m; r++) {
            const engine_dflash_inj *e = &inj[i0 + r];
            if (e->pos < 0 || !e->seq || !e->feat) return ENGINE_ERR_ARG;
            if (kvpool_seq_reserve(ed->kv, e->seq, e->pos + 1) != KVPOOL_OK) return ENGINE_ERR_KV_FULL;
            memcpy(ed->feat + (size_t)r * F, e->feat, F * sizeof(float));
            ed->pos[r] = e->pos;
            seqs[r] = e->seq;
        }
        ops_matmul(ed->tp, &df->fc, ed->feat, m, ed->x, ed->mm);
        ops_rmsnorm(ed->tp, ed->x, ed->x, df->enc_norm, m, hp->dim, hp->rms_eps);
        if (ed->v4) {
            engine_dflash_inject_v4(ed, m, seqs);
            continue;
        }
        for (int il = 0; il < hp->n_layers; il++) {
            const model_layer *L = &ed->d->layers[il];
            const ops_weight *kv[2] = { &L->wk, &L->wv };
            float *kv_out[2] = { ed->k, ed->v };
            ops_matmul_multi(ed->tp, 2, kv, ed->x, m, kv_out, ed->mm);
            engine_dflash_kv_rows(ed, il, m, false, seqs);
        }
    }
    return ENGINE_OK;
}

/* Attention of (block, head) items: every slot of the block attends to positions 0..pos+B-1
 * of its sequence (the injected context and the whole block: non-causal), online softmax per
 * 128-position slab. */
static void engine_dflash_job_att(void *ctx, int ith, int nth)
{
    dflash_att_job *j = ctx;
    engine_dflash *ed = j->ed;
    const model_hparams *hp = &ed->d->hp;
    const int hd = hp->head_dim, H = hp->n_heads, B = j->B, qd = H * hd;
    const int gqa = H / hp->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    float *sc = ed->att_tmp + (size_t)ith * ed->att_stride;   /* (B, 128) scores */
    float *mx = sc + (size_t)B * KVPOOL_BLOCK, *sum = mx + B;  /* (B) each */
    float *acc = sum + B;                                      /* (B, hd) */
    (void)nth;
    for (;;) {
        int it = atomic_fetch_add(&j->next, 1);
        if (it >= j->n_items) break;
        const int b = it / H, h = it % H, kvh = h / gqa;
        const engine_dflash_block *bk = &j->blocks[b];
        const int n_keys = bk->pos + B;
        const float *q0 = ed->q + (size_t)b * B * qd + (size_t)h * hd;
        for (int i = 0; i < B; i++) mx[i] = -INFINITY, sum[i] = 0;
        memset(acc, 0, (size_t)B * hd * sizeof(float));
        for (int bi = 0; bi * KVPOOL_BLOCK < n_keys; bi++) {
            const int nk = TM_MIN(KVPOOL_BLOCK, n_keys - bi * KVPOOL_BLOCK);
            const float *K = kvpool_seq_slab(ed->kv, bk->seq, bi, j->layer, 0, kvh);
            const float *V = kvpool_seq_slab(ed->kv, bk->seq, bi, j->layer, 1, kvh);
            for (int i = 0; i < B; i++) {
                const float *q = q0 + (size_t)i * qd;
                float *s = sc + (size_t)i * KVPOOL_BLOCK, m = mx[i];
                for (int r = 0; r < nk; r++) {
                    s[r] = ops_vec_dot_f32(hd, q, K + (size_t)r * hd) * scale;
                    m = s[r] > m ? s[r] : m;
                }
                float c = expf(mx[i] - m);   /* 0 on the first slab (mx -inf) */
                sum[i] *= c;
                ops_vec_scale_f32(hd, acc + (size_t)i * hd, c);
                for (int r = 0; r < nk; r++) {
                    float p = expf(s[r] - m);
                    sum[i] += p;
                    ops_vec_mad_f32(hd, acc + (size_t)i * hd, V + (size_t)r * hd, p);
                }
                mx[i] = m;
            }
        }
        for (int i = 0; i < B; i++) {
            float *o = ed->att + ((size_t)b * B + i) * qd + (size_t)h * hd;
            for (int c = 0; c < hd; c++) o[c] = acc[(size_t)i * hd + c] / sum[i];
        }
    }
}

static int engine_dflash_argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static float engine_dflash_logprob(const float *l, int n, int t)
{
    double m = l[engine_dflash_argmax(l, n)], s = 0;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - m);
    return (float)((double)l[t] - m - log(s));
}

/* The Markov head and the confidence head over the pass's logits (dflash.cpp's
 * build_dspark_markov_head): slot by slot, all blocks at once. */
static void engine_dflash_markov(engine_dflash *ed, int n, engine_dflash_block *blocks, int B, const float *hid)
{
    const model_dflash *df = ed->df;
    const int R = df->markov_rank, nv = ed->d->hp.n_vocab, dim = ed->d->hp.dim;
    const int i0 = df->sample_from_anchor ? 0 : 1;
    int32_t *prev = ed->prev;
    for (int b = 0; b < n; b++) prev[b] = blocks[b].anchor;
    for (int i = i0; i < B; i++) {
        for (int b = 0; b < n; b++)
            memcpy(ed->w1p + (size_t)b * R, df->markov_w1 + (size_t)prev[b] * R, (size_t)R * sizeof(float));
        ops_matmul(ed->tp, &df->markov_w2, ed->w1p, n, ed->bias, ed->mm);
        for (int b = 0; b < n; b++) {
            float *l = ed->logits + ((size_t)b * B + i) * nv;
            ops_add(NULL, l, ed->bias + (size_t)b * nv, nv);
            if (df->conf_w) {
                const float *h = hid + ((size_t)b * B + i) * dim;
                double z = (double)ops_vec_dot_f32(dim, df->conf_w, h) +
                           (double)ops_vec_dot_f32(R, df->conf_w + dim, ed->w1p + (size_t)b * R) + df->conf_b;
                blocks[b].conf[i] = (float)(1.0 / (1.0 + exp(-z)));
            }
            prev[b] = engine_dflash_argmax(l, nv);
        }
    }
}

/* The Qwen3 backbone's layers over the T = n * B rows of ed->x. */
static void engine_dflash_layers(engine_dflash *ed, int n, engine_dflash_block *blocks, int B)
{
    const model *d = ed->d;
    const model_hparams *hp = &d->hp;
    const int T = n * B, dim = hp->dim;
    kvpool_seq **seqs = ed->rseq;
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &d->layers[il];
        ops_rmsnorm(ed->tp, ed->xn, ed->x, L->attn_norm, T, dim, hp->rms_eps);
        const ops_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
        float *qkv_out[3] = { ed->q, ed->k, ed->v };
        ops_matmul_multi(ed->tp, 3, qkv, ed->xn, T, qkv_out, ed->mm);
        engine_dflash_kv_rows(ed, il, T, true, seqs);
        dflash_att_job job = { .ed = ed, .blocks = blocks, .B = B, .layer = il, .n_items = n * hp->n_heads };
        atomic_init(&job.next, 0);
        threadpool_run(ed->tp, engine_dflash_job_att, &job);
        ops_matmul(ed->tp, &L->wo, ed->att, T, ed->xn, ed->mm);
        ops_add(ed->tp, ed->x, ed->xn, (int64_t)T * dim);
        ops_rmsnorm(ed->tp, ed->xn, ed->x, L->ffn_norm, T, dim, hp->rms_eps);
        const ops_weight *gu[2] = { &L->gate, &L->up };
        float *gu_out[2] = { ed->ffa, ed->ffb };
        ops_matmul_multi(ed->tp, 2, gu, ed->xn, T, gu_out, ed->mm);
        ops_swiglu(ed->tp, ed->ffa, ed->ffa, ed->ffb, T, hp->ffn_dim);
        ops_matmul(ed->tp, &L->down, ed->ffa, T, ed->xn, ed->mm);
        ops_add(ed->tp, ed->x, ed->xn, (int64_t)T * dim);
    }
}

engine_status engine_dflash_draft(engine_dflash *ed, int n, engine_dflash_block *blocks)
{
    const model *d = ed->d;
    const model_hparams *hp = &d->hp;
    const model_dflash *df = ed->df;
    if (n <= 0 || n > ed->max_seqs) return ENGINE_ERR_ARG;
    const int B = blocks[0].n_slots;
    if (B < 1 || B > ENGINE_DFLASH_MAX_BLOCK) return ENGINE_ERR_ARG;
    const int T = n * B, dim = hp->dim, nv = hp->n_vocab;
    kvpool_seq **seqs = ed->rseq;
    for (int b = 0; b < n; b++) {
        engine_dflash_block *bk = &blocks[b];
        if (bk->n_slots != B || bk->anchor < 0 || bk->anchor >= nv || bk->pos < 0 || !bk->seq) return ENGINE_ERR_ARG;
        if (kvpool_seq_reserve(ed->kv, bk->seq, bk->pos + B) != KVPOOL_OK) return ENGINE_ERR_KV_FULL;
        for (int i = 0; i < B; i++) {
            const int r = b * B + i;
            model_embed_row(ed->embd, i == 0 ? bk->anchor : df->mask_token, ed->x + (size_t)r * dim);
            ed->pos[r] = bk->pos + i;
            seqs[r] = bk->seq;
            bk->conf[i] = -1.0f;
        }
    }
    if (ed->v4) {
        for (int r = 0; r < T; r++) {
            const engine_dflash_block *bk = &blocks[r / B];
            ed->toks[r] = (engine_tok){ .token = r % B == 0 ? bk->anchor : df->mask_token, .pos = ed->pos[r],
                                        .seq = bk->seq };
            ed->last[r] = bk->pos + B - 1;
        }
        engine_dsv4_block(ed->v4, T, ed->toks, ed->last, ed->embd, ed->x);
    } else {
        engine_dflash_layers(ed, n, blocks, B);
    }
    ops_rmsnorm(ed->tp, ed->xn, ed->x, d->output_norm, T, dim, hp->rms_eps);
    ops_matmul(ed->tp, ed->head, ed->xn, T, ed->logits, ed->mm);
    /* the confidence head reads the normed state (Qwen3), the collapsed streams before the norm (V4) */
    if (df->markov_rank && B <= df->block_size) engine_dflash_markov(ed, n, blocks, B, ed->v4 ? ed->x : ed->xn);
    for (int b = 0; b < n; b++)
        for (int i = 0; i < B; i++) {
            const float *l = ed->logits + ((size_t)b * B + i) * nv;
            blocks[b].token[i] = engine_dflash_argmax(l, nv);
            blocks[b].logprob[i] = engine_dflash_logprob(l, nv, blocks[b].token[i]);
        }
    return ENGINE_OK;
}
