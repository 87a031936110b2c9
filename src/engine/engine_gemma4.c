/*
 * engine_gemma4: Gemma 4's attention layers in the engine's uniform K/V geometry.
 *
 * Gemma 4's layers differ in head size (window 256, global 512 in the 31B) and kv heads, while
 * the KV pool, the window ring and the attention paths have one row shape. So every layer
 * runs in the widest shape (hp.head_dim, hp.n_kv_heads, model_gemma4.c): its q, k and v heads
 * are computed in its own geometry (projections into g4, the head norms, its RoPE), then
 * written into hp's rows: each head zero-padded to head_dim, each kv head repeated
 * n_kv_heads / l_kv_heads times (query head h reads kv head h / (n_heads / l_kv_heads) either
 * way). Padding adds exact zeros to every dot and zero value dims, which the compaction after
 * attention drops; repeated kv heads are the same keys read by the same queries. The output
 * equals the layer's own attention to the last float bit save for the order of sums.
 *
 * The cost: every layer's K/V rows take the widest head size and the most kv heads. For the
 * 31B (window layers 16 kv heads of 256, global 4 of 512) a position costs 16 * 512 * 2 values
 * per layer instead of 16 * 256 * 2 (window) or 4 * 512 * 2 (global): 2x on window layers,
 * 4x on global ones, and the attention's arithmetic grows alike. The pool's per-layer row
 * widths (kvpool_opts.layer_width) are half of what would remove it; per-layer kv head counts
 * in the pool and attention reading each layer in its own shape are not done.
 *
 * A shared KV layer (model.h's kv_shared) computes only its queries here; engine_step.c's
 * attention reads its source layer's K/V (engine_job.kv_layer), and the pool keeps none for it.
 *
 * Also Gemma 4's FFN with experts beside the shared MLP, and its per-layer embeddings (below):
 * their inputs in g4_mlp and g4_pl, engine_new's.
 *
 * Rows of a step are split among threads as engine_job_qkv_post splits them; each thread
 * touches only its own rows of g4, q, k and v. Nothing is allocated here.
 */
#include "engine/engine_int.h"

#include <math.h>
#include <string.h>

#include "model/quant.h"

void engine_gemma4_raw(engine *e, float **q, float **k, float **v)
{
    const model_hparams *hp = &e->m->hp;
    const size_t T = (size_t)e->max_tokens, qd = (size_t)hp->n_heads * hp->head_dim,
                 kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    *q = e->g4;
    *k = e->g4 + T * qd;
    *v = *k + T * kvd;
}

void engine_gemma4_rows(engine *e, const model_layer *L, int t0, int n)
{
    const model_hparams *hp = &e->m->hp;
    const int H = hp->n_heads, HD = hp->head_dim, KV = hp->n_kv_heads;
    const int hd = L->l_head_dim, kv = L->l_kv_heads, rep = KV / kv;
    float *rq, *rk, *rv;
    engine_gemma4_raw(e, &rq, &rk, &rv);
    rq += (size_t)t0 * H * hd;
    rk += (size_t)t0 * kv * hd;
    rv += (size_t)t0 * kv * hd;
    ops_rmsnorm(NULL, rq, rq, L->q_norm, n * H, hd, hp->rms_eps);
    ops_rope_ggml(NULL, rq, e->pos + t0, n, H, hd, L->l_n_rot, true, L->l_theta_scale, 1.0f, L->l_rope_factors,
                  1.0f, NULL);
    const size_t pad = (size_t)(HD - hd) * sizeof(float);
    for (int t = 0; t < n; t++) {
        float *q = e->q + (size_t)(t0 + t) * H * HD;
        for (int h = 0; h < H; h++) {
            memcpy(q + (size_t)h * HD, rq + ((size_t)t * H + h) * hd, (size_t)hd * sizeof(float));
            memset(q + (size_t)h * HD + hd, 0, pad);
        }
    }
    if (L->kv_shared) return;   /* its keys and values are layer kv_src's, in the pool already */
    if (!L->wv.data) memcpy(rv, rk, (size_t)n * kv * hd * sizeof(float));   /* V is K's projection */
    ops_rmsnorm(NULL, rk, rk, L->k_norm, n * kv, hd, hp->rms_eps);
    ops_rmsnorm(NULL, rv, rv, L->v_norm, n * kv, hd, hp->rms_eps);
    ops_rope_ggml(NULL, rk, e->pos + t0, n, kv, hd, L->l_n_rot, true, L->l_theta_scale, 1.0f, L->l_rope_factors,
                  1.0f, NULL);
    for (int t = 0; t < n; t++) {
        float *k = e->k + (size_t)(t0 + t) * KV * HD, *v = e->v + (size_t)(t0 + t) * KV * HD;
        for (int h = 0; h < KV; h++) {
            const size_t src = ((size_t)t * kv + (size_t)(h / rep)) * hd;
            memcpy(k + (size_t)h * HD, rk + src, (size_t)hd * sizeof(float));
            memset(k + (size_t)h * HD + hd, 0, pad);
            memcpy(v + (size_t)h * HD, rv + src, (size_t)hd * sizeof(float));
            memset(v + (size_t)h * HD + hd, 0, pad);
        }
    }
}

const float *engine_gemma4_att(engine *e, const model_layer *L, int T)
{
    const model_hparams *hp = &e->m->hp;
    const int H = hp->n_heads, HD = hp->head_dim, hd = L->l_head_dim;
    float *out, *rk, *rv;
    engine_gemma4_raw(e, &out, &rk, &rv);   /* the raw q is spent by now */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            memcpy(out + ((size_t)t * H + h) * hd, e->att + ((size_t)t * H + h) * HD, (size_t)hd * sizeof(float));
    return out;
}

/* ---- experts beside the shared MLP (26B-A4B) ----------------------------------------------
 * As llama.cpp's gemma4 graph: mlp = post_norm_1(down(gelu(gate(xn)) * up(xn))) with xn =
 * ffn_norm(x); the experts read pre_norm_2(x), routed on gate_inp(rmsnorm(x) / sqrt(dim) *
 * gate_inp.scale) (a scale, then a product: ggml's two roundings); moe = post_norm_2(their
 * weighted sum); the output mlp + moe. */
void engine_gemma4_moe(engine *e, engine_job *job, int il, int T)
{
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[il];
    threadpool *tp = e->tp;
    const int dim = hp->dim;
    const float eps = hp->rms_eps, rs = 1.0f / sqrtf((float)dim);
    float *mlp = e->g4_mlp, *rin = mlp + (size_t)e->max_tokens * dim, *ones = rin + (size_t)e->max_tokens * dim;
    const ops_weight *gu[2] = { &L->gate, &L->up };
    float *gu_out[2] = { e->ffa, e->ffb };
    ops_matmul_multi(tp, 2, gu, e->xn, T, gu_out, e->mm_scratch);
    ops_geglu(tp, e->ffa, e->ffa, e->ffb, T, L->l_ffn_dim);
    ops_matmul(tp, &L->down, e->ffa, T, mlp, e->mm_scratch);
    ops_rmsnorm(tp, mlp, mlp, L->ffn_post_norm_1, T, dim, eps);
    ops_rmsnorm(tp, e->xn, e->x, L->ffn_pre_norm_2, T, dim, eps);
    ops_rmsnorm(tp, rin, e->x, ones, T, dim, eps);   /* x * 1 is exact: the norm without a weight */
    for (int t = 0; t < T; t++) {
        float *r = rin + (size_t)t * dim;
        for (int d = 0; d < dim; d++) {
            float v = r[d] * rs;
            r[d] = v * L->gate_inp_s[d];
        }
    }
    engine_moe_ffn(e, job, il, T, rin);
    ops_rmsnorm(tp, e->xn, e->xn, L->ffn_post_norm_2, T, dim, eps);
    ops_add(tp, e->xn, mlp, (int64_t)T * dim);
}

/* ---- per-layer embeddings (E2B, E4B) ------------------------------------------------------
 * As llama.cpp's project_per_layer_inputs: per token, (rmsnorm(pl_model_proj(x0) / sqrt(dim))
 * per layer's slice * pl_proj_norm + pl_tok_embd[token] * sqrt(n_pl)) / sqrt(2), each step
 * rounded as ggml's ops are; then per layer x += post_norm(pl_proj(gelu(pl_gate(x)) * slice)). */
void engine_gemma4_pl_inputs(engine *e, const engine_batch *b, int T)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    const int np = hp->n_pl, w = hp->n_layers * np;
    const float ps = 1.0f / sqrtf((float)hp->dim), ts = sqrtf((float)np), is = 1.0f / sqrtf(2.0f);
    float *pl = e->g4_pl, *row = pl + (size_t)e->max_tokens * (w + np);
    const size_t rb = quant_row_bytes(m->pl_tok_embd.type, m->pl_tok_embd.cols);
    ops_matmul(e->tp, &m->pl_model_proj, e->x, T, pl, e->mm_scratch);
    for (size_t i = 0; i < (size_t)T * w; i++) pl[i] *= ps;
    ops_rmsnorm(e->tp, pl, pl, m->pl_proj_norm, T * hp->n_layers, np, hp->rms_eps);
    for (int t = 0; t < T; t++) {
        quant_dequantize_row(m->pl_tok_embd.type, (const uint8_t *)m->pl_tok_embd.data + (size_t)b->toks[t].token * rb,
                             row, w);
        float *p = pl + (size_t)t * w;
        for (int i = 0; i < w; i++) {
            float v = row[i] * ts;
            v = p[i] + v;
            p[i] = v * is;
        }
    }
}

void engine_gemma4_pl_layer(engine *e, int il, int T)
{
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[il];
    const int np = hp->n_pl, w = hp->n_layers * np;
    float *g = e->g4_pl + (size_t)e->max_tokens * w;
    ops_matmul(e->tp, &L->pl_gate, e->x, T, g, e->mm_scratch);
    for (int t = 0; t < T; t++)
        ops_geglu(NULL, g + (size_t)t * np, g + (size_t)t * np, e->g4_pl + (size_t)t * w + (size_t)il * np, 1, np);
    ops_matmul(e->tp, &L->pl_proj, g, T, e->xn, e->mm_scratch);
    ops_rmsnorm(e->tp, e->xn, e->xn, L->pl_post_norm, T, hp->dim, hp->rms_eps);
}
