/*
 * model_phi3: `phi3` files (Phi-3, Phi-3.5 and Phi-4-mini as llama.cpp's converter writes
 * them): Llama's layer with NEOX RoPE over the first rope.dimension_count dims of a head
 * (Phi-4-mini: 96 of 128), the Q/K/V projections fused in one `attn_qkv` matrix and the FFN's
 * gate and up fused in one `ffn_up` matrix of 2 * feed_forward_length rows (gate first, as
 * ggml_swiglu splits it). Both are used as row views of the one tensor (a row range is
 * contiguous), so the engine runs them as Llama's separate matrices: each output element is
 * the same dot product as llama.cpp's one fused product.
 *
 * LongRoPE (the 128k models): `rope_factors_short` / `rope_factors_long` (n_rot/2 divisors of
 * the frequencies) and rope.scaling.attn_factor, which multiplies cos and sin. llama.cpp takes
 * the long factors when its context per sequence exceeds rope.scaling.original_context_length;
 * a served context defaults to the trained one, so here the long factors are taken when the
 * trained context exceeds the original (docs/architectures.md). The choice is part of
 * rope_inv_freq, hence of the fingerprint and of every block key.
 *
 * Phi-3's sliding_window key is ignored, as llama.cpp does (its SWA is disabled for phi3).
 */
#include <math.h>
#include <stdio.h>

#include "model/model_int.h"

bool model_phi3_hparams(model_ld *ld)
{
    model_hparams *hp = &ld->m->hp;
    const int half = hp->n_rot / 2;
    const float *lng = model_vector(ld, "rope_factors_long.weight", false, half);
    const float *sht = model_vector(ld, "rope_factors_short.weight", false, half);
    if (ld->st != GGUF_OK) return false;
    if (!lng != !sht) {
        model_fail(ld, GGUF_ERR_MISSING, "phi3: rope_factors_long.weight and rope_factors_short.weight come together");
        return false;
    }
    if (hp->rope_freq_factors || hp->rope_yarn[0] != 0.0f || hp->rope_freq_scale != 1.0f) {
        model_fail(ld, GGUF_ERR_FORMAT, "phi3: unsupported RoPE scaling (only LongRoPE's factor tensors)");
        return false;
    }
    double orig, af;
    if (!model_key_float(ld, "phi3.rope.scaling.original_context_length", hp->n_ctx_train, &orig)) return false;
    if (!model_key_float(ld, "phi3.rope.scaling.attn_factor", 1.0, &af)) return false;
    if (!(af > 0 && af < 16)) {
        model_fail(ld, GGUF_ERR_FORMAT, "phi3: bad rope.scaling.attn_factor %g", af);
        return false;
    }
    hp->rope_attn_factor = (float)af;
    if (!lng) return true;
    const float *ff = hp->n_ctx_train > orig ? lng : sht;
    float *inv = model_own(ld->m, (size_t)half);
    for (int i = 0; i < half; i++) {
        if (!(ff[i] > 0)) {
            model_fail(ld, GGUF_ERR_FORMAT, "phi3: RoPE factor %d is %g (must be positive)", i, ff[i]);
            return false;
        }
        inv[i] = (float)(pow((double)hp->rope_base, -2.0 * i / hp->n_rot) / ff[i]);
    }
    hp->rope_inv_freq = inv;
    hp->rope_freq_factors = ff;
    return true;
}

/* Rows [r0, r0 + n) of a matrix view. */
static ops_weight model_phi3_rows(const ops_weight *w, int64_t r0, int64_t n)
{
    size_t rb = quant_row_bytes(w->type, w->cols);
    return (ops_weight){ w->type, n, w->cols, (const char *)w->data + (size_t)r0 * rb };
}

bool model_phi3_layer(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    const int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim, kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(L->attn_norm = model_vector(ld, TN("attn_norm.weight"), true, hp->dim))) return false;
    if (gguf_find_tensor(ld->m->g, TN("attn_qkv.weight"))) {
        ops_weight qkv;
        if (!model_matrix(ld, nm, hp->dim, q_dim + 2 * kv_dim, &qkv)) return false;
        L->wq = model_phi3_rows(&qkv, 0, q_dim);
        L->wk = model_phi3_rows(&qkv, q_dim, kv_dim);
        L->wv = model_phi3_rows(&qkv, q_dim + kv_dim, kv_dim);
    } else {
        if (!model_matrix(ld, TN("attn_q.weight"), hp->dim, q_dim, &L->wq)) return false;
        if (!model_matrix(ld, TN("attn_k.weight"), hp->dim, kv_dim, &L->wk)) return false;
        if (!model_matrix(ld, TN("attn_v.weight"), hp->dim, kv_dim, &L->wv)) return false;
    }
    if (!model_matrix(ld, TN("attn_output.weight"), q_dim, hp->dim, &L->wo)) return false;
    if (!(L->ffn_norm = model_vector(ld, TN("ffn_norm.weight"), true, hp->dim))) return false;
    if (gguf_find_tensor(ld->m->g, TN("ffn_gate_inp.weight"))) {
        model_fail(ld, GGUF_ERR_TYPE, "phi3: %s: a phi3 file with experts is not supported", nm);
        return false;
    }
    ops_weight gu;
    if (!model_matrix(ld, TN("ffn_up.weight"), hp->dim, 2 * (int64_t)hp->ffn_dim, &gu)) return false;
    L->gate = model_phi3_rows(&gu, 0, hp->ffn_dim);
    L->up = model_phi3_rows(&gu, hp->ffn_dim, hp->ffn_dim);
    if (!model_matrix(ld, TN("ffn_down.weight"), hp->ffn_dim, hp->dim, &L->down)) return false;
#undef TN
    return true;
}
