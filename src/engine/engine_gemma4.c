/*
 * engine_gemma4: Gemma 4's attention layers in their own geometry, its experts and its
 * per-layer embeddings.
 *
 * Gemma 4's layers differ in head size (window 256, global 512 in the 31B) and kv heads. Each
 * layer runs in its own shape throughout: its projections write (T, n_heads * l_head_dim) q
 * and (T, l_kv_heads * l_head_dim) k and v rows into the engine's q, k, v (sized for the
 * widest, hp.head_dim and hp.n_kv_heads), engine_gemma4_rows norms and rotates them in place,
 * the KV pool keeps each layer's rows at exactly l_kv_heads x l_head_dim (kvpool_opts'
 * layer_width and layer_kv_heads, engine_kv_geometry), and attention (engine_step.c) takes the
 * layer's head size and kv heads from its job, so its output is already the layer's own
 * (T, n_heads * l_head_dim) for attn_output. A window layer's staged rows and ring rows are
 * its own width too (engine_win_row).
 *
 * A shared KV layer (model.h's kv_shared) computes only its queries here; engine_step.c's
 * attention reads its source layer's K/V (engine_job.kv_layer), which has its geometry, and
 * the pool keeps none for it.
 *
 * Also Gemma 4's FFN with experts beside the shared MLP, and its per-layer embeddings (below):
 * their inputs in g4_mlp and g4_pl, engine_new's.
 *
 * Rows of a step are split among threads as engine_job_qkv_post splits them; each thread
 * touches only its own rows of q, k and v. Nothing is allocated here.
 */
#include "engine/engine_int.h"

#include <math.h>
#include <string.h>

#include "model/quant.h"

void engine_gemma4_rows(const engine *e, const model_layer *L, float *q, float *k, float *v, int t0, int n)
{
    const model_hparams *hp = &e->m->hp;
    const int H = hp->n_heads, hd = L->l_head_dim, kv = L->l_kv_heads;
    ops_rmsnorm(NULL, q, q, L->q_norm, n * H, hd, hp->rms_eps);
    ops_rope_ggml(NULL, q, e->pos + t0, n, H, hd, L->l_n_rot, true, L->l_theta_scale, 1.0f, L->l_rope_factors,
                  1.0f, NULL);
    if (L->kv_shared) return;   /* its keys and values are layer kv_src's, in the pool already */
    if (!L->wv.data) memcpy(v, k, (size_t)n * kv * hd * sizeof(float));   /* V is K's projection */
    ops_rmsnorm(NULL, k, k, L->k_norm, n * kv, hd, hp->rms_eps);
    ops_rmsnorm(NULL, v, v, L->v_norm, n * kv, hd, hp->rms_eps);
    ops_rope_ggml(NULL, k, e->pos + t0, n, kv, hd, L->l_n_rot, true, L->l_theta_scale, 1.0f, L->l_rope_factors,
                  1.0f, NULL);
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
