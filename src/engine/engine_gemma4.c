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
 * 4x on global ones, and the attention's arithmetic grows alike. Per-layer row shapes in the
 * pool would remove it; they are not done.
 *
 * Rows of a step are split among threads as engine_job_qkv_post splits them; each thread
 * touches only its own rows of g4, q, k and v. Nothing is allocated here.
 */
#include "engine/engine_int.h"

#include <string.h>

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
    if (!L->wv.data) memcpy(rv, rk, (size_t)n * kv * hd * sizeof(float));   /* V is K's projection */
    ops_rmsnorm(NULL, rq, rq, L->q_norm, n * H, hd, hp->rms_eps);
    ops_rmsnorm(NULL, rk, rk, L->k_norm, n * kv, hd, hp->rms_eps);
    ops_rmsnorm(NULL, rv, rv, L->v_norm, n * kv, hd, hp->rms_eps);
    ops_rope_ggml(NULL, rq, e->pos + t0, n, H, hd, L->l_n_rot, true, L->l_theta_scale, 1.0f, L->l_rope_factors,
                  1.0f, NULL);
    ops_rope_ggml(NULL, rk, e->pos + t0, n, kv, hd, L->l_n_rot, true, L->l_theta_scale, 1.0f, L->l_rope_factors,
                  1.0f, NULL);
    const size_t pad = (size_t)(HD - hd) * sizeof(float);
    for (int t = 0; t < n; t++) {
        float *q = e->q + (size_t)(t0 + t) * H * HD, *k = e->k + (size_t)(t0 + t) * KV * HD,
              *v = e->v + (size_t)(t0 + t) * KV * HD;
        for (int h = 0; h < H; h++) {
            memcpy(q + (size_t)h * HD, rq + ((size_t)t * H + h) * hd, (size_t)hd * sizeof(float));
            memset(q + (size_t)h * HD + hd, 0, pad);
        }
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
