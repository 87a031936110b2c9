/*
 * model_gemma4: `gemma4` files (Gemma 4 text, as llama.cpp's Gemma4Model converts it), run as
 * llama.cpp's gemma4 graph does. Gemma 3's layer (model_gemma3.c: post-norms, GELU, embedding
 * scale, soft cap) with these differences:
 *
 * - window and global layers have their own head size (key_length_swa vs key_length: 256 and
 *   512 in the 31B) and may have their own kv head count (head_count_kv as a per-layer array);
 *   attention.sliding_window_pattern is a per-layer array of bools (true: a window layer);
 * - window layers rotate rope.dimension_count_swa dims with rope.freq_base_swa; global layers
 *   rotate their whole head with rope.freq_base and the `rope_freqs` factors (1 on the rotated
 *   pairs, 1e30 on the rest: Gemma's "proportional" partial rotation as NEOX can hold it);
 * - q and k heads RMS-normed with their weights, v heads RMS-normed without one; a layer
 *   without attn_v uses K's projection as V (before K's norm), as llama.cpp does;
 * - no score scale (1.0: the normed q and k stand for it);
 * - layer_output_scale: the layer's output, residual included, times a scalar.
 *
 * - experts (26B-A4B, expert_count > 0): a layer with a router (ffn_gate_inp) runs the dense
 *   FFN as its shared MLP and the routed experts beside it, each with its own norms (model.h);
 *   the router reads rmsnorm(x) / sqrt(dim) * ffn_gate_inp.scale, softmax over every expert,
 *   the top expert_used_count renormalised; experts are GELU-gated, gate and up fused
 *   (ffn_gate_up_exps, as the converter writes them) or apart, each expert's output times its
 *   ffn_down_exps.scale;
 * - per-layer embeddings (E2B/E4B, embedding_length_per_layer_input > 0): model.h's
 *   pl_tok_embd and each layer's pl_gate/pl_proj;
 * - shared KV layers (E2B/E4B, shared_kv_layers = n): the last n layers keep no K/V; each
 *   attends over the K/V of the last earlier layer of its kind, as llama.cpp's reuse rule
 *   picks it (block_count - n - 1 for a global layer, - 2 for a window one, which must be of
 *   that kind); a per-layer feed_forward_length gives them their double-wide MLP.
 *
 * hp.head_dim and hp.n_kv_heads are the widest head size and the most kv heads of any layer
 * (the engine's buffers); each layer's own are model_layer.l_*, in which the KV pool keeps its
 * rows and attention reads them (engine_gemma4.c).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/model_int.h"

/* Element il of the integer or bool array KEY, or the scalar KEY for every layer; def when
 * absent. False with the error set when it is of another type or too short. */
static bool model_gemma4_at(model_ld *ld, const char *key, int il, int64_t def, int64_t *out)
{
    gguf_vtype elt;
    uint64_t n;
    const void *data;
    if (!gguf_get_arr(ld->m->g, key, &elt, &n, &data)) return model_key_int(ld, key, false, def, out);
    if (n != (uint64_t)(ld->m->hp.n_layers + ld->m->hp.n_nextn) && n != (uint64_t)ld->m->hp.n_layers) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s has %llu elements, not one per layer (%d)", key, (unsigned long long)n,
                   ld->m->hp.n_layers);
        return false;
    }
    switch (elt) {
    case GGUF_VT_BOOL: case GGUF_VT_UINT8: *out = ((const uint8_t *)data)[il]; return true;
    case GGUF_VT_INT8: *out = ((const int8_t *)data)[il]; return true;
    case GGUF_VT_UINT32: *out = ((const uint32_t *)data)[il]; return true;
    case GGUF_VT_INT32: *out = ((const int32_t *)data)[il]; return true;
    default:
        model_fail(ld, GGUF_ERR_FORMAT, "%s: an array of type %d, not of integers or bools", key, (int)elt);
        return false;
    }
}

/* The experts' keys, when expert_count is above 0 (26B-A4B). */
static bool model_gemma4_experts(model_ld *ld)
{
    model_hparams *hp = &ld->m->hp;
    int64_t ne, nu, ef;
    if (!model_key_int(ld, "gemma4.expert_count", false, 0, &ne)) return false;
    if (ne == 0) return true;
    if (!model_key_int(ld, "gemma4.expert_used_count", true, 0, &nu)) return false;
    if (!model_key_int(ld, "gemma4.expert_feed_forward_length", true, 0, &ef)) return false;
    if (ne < 0 || ne > MODEL_MAX_EXPERTS || nu <= 0 || nu > ne || ef <= 0 || ef > (1 << 22)) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad gemma4 expert hyper-parameters: expert_count %lld (at most %d), "
                   "expert_used_count %lld, expert_feed_forward_length %lld", (long long)ne, MODEL_MAX_EXPERTS,
                   (long long)nu, (long long)ef);
        return false;
    }
    hp->n_expert = (int)ne, hp->n_expert_used = (int)nu, hp->expert_ffn = (int)ef;
    hp->router_norm = true;   /* softmax over all, the chosen renormalised (llama.cpp's norm_w) */
    return true;
}

/* Per-layer embeddings' width and the shared KV layers' count. */
static bool model_gemma4_shared(model_ld *ld)
{
    model_hparams *hp = &ld->m->hp;
    int64_t pl, sh;
    if (!model_key_int(ld, "gemma4.embedding_length_per_layer_input", false, 0, &pl)) return false;
    if (!model_key_int(ld, "gemma4.attention.shared_kv_layers", false, 0, &sh)) return false;
    if (pl < 0 || pl > (1 << 16) || pl * hp->n_layers > (1 << 24)) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad gemma4.embedding_length_per_layer_input %lld (%d layers)", (long long)pl,
                   hp->n_layers);
        return false;
    }
    /* llama.cpp's reuse rule reads the last two layers that keep K/V */
    if (sh < 0 || (sh > 0 && sh > hp->n_layers - 2)) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad gemma4.attention.shared_kv_layers %lld: at most block_count - 2 (%d)",
                   (long long)sh, hp->n_layers - 2);
        return false;
    }
    hp->n_pl = (int)pl;
    hp->n_kv_layers = hp->n_layers - (int)sh;
    return true;
}

bool model_gemma4_hparams(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    if (!model_gemma4_experts(ld) || !model_gemma4_shared(ld)) return false;
    int64_t swa, kl, kl_swa, vl_swa, rot_swa;
    double base_swa, cap;
    if (!model_key_int(ld, "gemma4.attention.sliding_window", true, 0, &swa)) return false;
    if (!model_key_float(ld, "gemma4.rope.freq_base_swa", 10000.0, &base_swa)) return false;
    if (!model_key_float(ld, "gemma4.final_logit_softcapping", 0.0, &cap)) return false;
    kl = hp->head_dim;   /* key_length: the global layers' (model.c checked value_length) */
    if (!model_key_int(ld, "gemma4.attention.key_length_swa", false, kl, &kl_swa)) return false;
    if (!model_key_int(ld, "gemma4.attention.value_length_swa", false, kl_swa, &vl_swa)) return false;
    if (!model_key_int(ld, "gemma4.rope.dimension_count_swa", false, hp->n_rot, &rot_swa)) return false;
    if (swa <= 0 || swa > (1 << 24) || !(base_swa > 0) || !(cap >= 0 && cap < 1e6) || kl_swa <= 0 || kl_swa > 1024 ||
        kl_swa % 2 || vl_swa != kl_swa || rot_swa <= 0 || rot_swa > kl_swa || rot_swa % 2) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad gemma4 hyper-parameters: sliding_window %lld (1..%d), rope.freq_base_swa %g, "
                   "final_logit_softcapping %g, key_length_swa %lld, value_length_swa %lld, rope.dimension_count_swa %lld",
                   (long long)swa, 1 << 24, base_swa, cap, (long long)kl_swa, (long long)vl_swa, (long long)rot_swa);
        return false;
    }
    if (hp->rope_yarn[0] != 0.0f || hp->rope_freq_scale != 1.0f) {
        model_fail(ld, GGUF_ERR_FORMAT, "gemma4: unsupported RoPE scaling (only rope_freqs' factors)");
        return false;
    }
    /* every layer's kv heads divide the query heads; the most of them size the engine's buffers */
    int kv_max = 0;
    for (int il = 0; il < hp->n_layers; il++) {
        int64_t is_swa, kv;
        if (!model_gemma4_at(ld, "gemma4.attention.sliding_window_pattern", il, 0, &is_swa)) return false;
        if (!model_gemma4_at(ld, "gemma4.attention.head_count_kv", il, hp->n_heads, &kv)) return false;
        if (kv <= 0 || kv > hp->n_heads || hp->n_heads % kv) {
            model_fail(ld, GGUF_ERR_FORMAT, "gemma4: layer %d has %lld kv heads for %d query heads", il, (long long)kv,
                       hp->n_heads);
            return false;
        }
        kv_max = kv > kv_max ? (int)kv : kv_max;
    }
    hp->n_kv_heads = kv_max;
    hp->head_dim = (int)(kl > kl_swa ? kl : kl_swa);
    hp->n_swa = (int)swa;
    hp->swa_pattern = 0;   /* per layer, from the array (model_gemma4_layer) */
    hp->rope_base_swa = (float)base_swa;
    hp->logit_softcap = (float)cap;
    hp->embd_scale = sqrtf((float)hp->dim);
    hp->ffn_gelu = true;
    hp->att_scale = 1.0f;
    /* model.c read rope_freqs (global layers only) as every layer's: the layers take it over */
    hp->rope_freq_factors = NULL;
    return true;
}

/* Layer il's FFN: the dense one (its own width: the double-wide MLP), and where the layer has a
 * router the experts with their norms beside it. */
static bool model_gemma4_ffn(model_ld *ld, int il)
{
    model *m = ld->m;
    const model_hparams *hp = &m->hp;
    model_layer *L = &m->layers[il];
    char nm[96];
    int64_t ff;
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!model_gemma4_at(ld, "gemma4.feed_forward_length", il, hp->ffn_dim, &ff)) return false;
    if (ff <= 0 || ff > hp->ffn_dim) {
        model_fail(ld, GGUF_ERR_FORMAT, "gemma4: layer %d's feed_forward_length %lld (1..%d)", il, (long long)ff,
                   hp->ffn_dim);
        return false;
    }
    L->l_ffn_dim = (int)ff;
    if (!(L->ffn_norm = model_vector(ld, TN("ffn_norm.weight"), true, hp->dim))) return false;
    if (!model_matrix(ld, TN("ffn_gate.weight"), hp->dim, ff, &L->gate)) return false;
    if (!model_matrix(ld, TN("ffn_up.weight"), hp->dim, ff, &L->up)) return false;
    if (!model_matrix(ld, TN("ffn_down.weight"), ff, hp->dim, &L->down)) return false;
    /* a layer without a router is dense, as llama.cpp loads it */
    if (hp->n_expert == 0 || !gguf_find_tensor(m->g, TN("ffn_gate_inp.weight"))) return true;
    const int ne = hp->n_expert, ef = hp->expert_ffn;
    if (!model_matrix(ld, nm, hp->dim, ne, &L->gate_inp)) return false;
    if (!(L->gate_inp_s = model_vector(ld, TN("ffn_gate_inp.scale"), true, hp->dim))) return false;
    if (!(L->ffn_pre_norm_2 = model_vector(ld, TN("pre_ffw_norm_2.weight"), true, hp->dim))) return false;
    if (!(L->ffn_post_norm_1 = model_vector(ld, TN("post_ffw_norm_1.weight"), true, hp->dim))) return false;
    if (!(L->ffn_post_norm_2 = model_vector(ld, TN("post_ffw_norm_2.weight"), true, hp->dim))) return false;
    if (gguf_find_tensor(m->g, TN("ffn_gate_up_exps.weight"))) {
        if (!model_experts(ld, nm, hp->dim, 2 * (int64_t)ef, ne, &L->gate_exps)) return false;
        L->exps_gate_up = true;
    } else if (!gguf_find_tensor(m->g, TN("ffn_gate_exps.weight"))) {
        model_fail(ld, GGUF_ERR_MISSING, "missing tensor blk.%d.ffn_gate_up_exps.weight (or blk.%d.ffn_gate_exps.weight "
                   "and ffn_up_exps.weight)", il, il);
        return false;
    } else {
        if (!model_experts(ld, nm, hp->dim, ef, ne, &L->gate_exps)) return false;
        if (!model_experts(ld, TN("ffn_up_exps.weight"), hp->dim, ef, ne, &L->up_exps)) return false;
    }
    if (!model_experts(ld, TN("ffn_down_exps.weight"), ef, hp->dim, ne, &L->down_exps)) return false;
    L->down_exps_s = model_vector(ld, TN("ffn_down_exps.scale"), false, ne);
#undef TN
    return ld->st == GGUF_OK;
}

/* The per-layer embeddings' model-wide tensors. */
static bool model_gemma4_pl_inputs(model_ld *ld)
{
    model *m = ld->m;
    const model_hparams *hp = &m->hp;
    const int64_t w = (int64_t)hp->n_pl * hp->n_layers;
    if (!model_matrix(ld, "per_layer_token_embd.weight", w, hp->n_vocab, &m->pl_tok_embd)) return false;
    if (!model_matrix(ld, "per_layer_model_proj.weight", hp->dim, w, &m->pl_model_proj)) return false;
    return (m->pl_proj_norm = model_vector(ld, "per_layer_proj_norm.weight", true, hp->n_pl)) != NULL;
}

bool model_gemma4_layer(model_ld *ld, int il)
{
    model *m = ld->m;
    const model_hparams *hp = &m->hp;
    model_layer *L = &m->layers[il];
    char nm[96], key[128];
    int64_t is_swa, kv, kl, rot;
    if (!model_gemma4_at(ld, "gemma4.attention.sliding_window_pattern", il, 0, &is_swa)) return false;
    if (!model_gemma4_at(ld, "gemma4.attention.head_count_kv", il, hp->n_heads, &kv)) return false;
    snprintf(key, sizeof key, "gemma4.attention.key_length%s", is_swa ? "_swa" : "");
    if (!model_key_int(ld, key, !is_swa, 0, &kl)) return false;
    if (is_swa && kl == 0 && !model_key_int(ld, "gemma4.attention.key_length", true, 0, &kl)) return false;
    rot = kl;   /* global layers: the whole head, rope_freqs marking the pairs left unrotated */
    if (is_swa && !model_key_int(ld, "gemma4.rope.dimension_count_swa", false, rot, &rot)) return false;
    if (!is_swa && !model_key_int(ld, "gemma4.rope.dimension_count", false, rot, &rot)) return false;
    if (rot <= 0 || rot > kl || rot % 2) {
        model_fail(ld, GGUF_ERR_FORMAT, "gemma4: layer %d rotates %lld of its %lld head dims", il, (long long)rot,
                   (long long)kl);
        return false;
    }
    if (il >= hp->n_kv_layers) {   /* a shared KV layer: the last earlier layer of its kind keeps its K/V */
        /* llama.cpp's rule (src/llama-model.cpp) takes the last layer that keeps K/V for a global
         * layer, the one before for a window layer: they must be of those kinds */
        const int src = hp->n_kv_layers - (is_swa ? 2 : 1);
        int64_t last_swa, prev_swa;
        if (!model_gemma4_at(ld, "gemma4.attention.sliding_window_pattern", hp->n_kv_layers - 1, 0, &last_swa) ||
            !model_gemma4_at(ld, "gemma4.attention.sliding_window_pattern", hp->n_kv_layers - 2, 0, &prev_swa))
            return false;
        if (last_swa || !prev_swa) {
            model_fail(ld, GGUF_ERR_FORMAT, "gemma4: with shared_kv_layers %d, layer %d must be a global layer and layer "
                       "%d a window layer (the K/V the shared layers read), not %s and %s",
                       hp->n_layers - hp->n_kv_layers, hp->n_kv_layers - 1, hp->n_kv_layers - 2,
                       last_swa ? "window" : "global", prev_swa ? "window" : "global");
            return false;
        }
        L->kv_shared = true;
        L->kv_src = src;
        kv = m->layers[src].l_kv_heads;   /* its keys are the source layer's */
    }
    const int hd = (int)kl, q_dim = hp->n_heads * hd, kv_dim = (int)kv * hd;
    L->l_head_dim = hd;
    L->l_kv_heads = (int)kv;
    L->l_n_rot = (int)rot;
    L->l_theta_scale = powf(is_swa ? hp->rope_base_swa : hp->rope_base, -2.0f / (float)rot);
    L->window = is_swa ? hp->n_swa : 0;
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!is_swa && !(L->l_rope_factors = model_vector(ld, "rope_freqs.weight", false, rot / 2)) && ld->st != GGUF_OK)
        return false;
    if (!(L->attn_norm = model_vector(ld, TN("attn_norm.weight"), true, hp->dim))) return false;
    if (!model_matrix(ld, TN("attn_q.weight"), hp->dim, q_dim, &L->wq)) return false;
    if (!L->kv_shared) {   /* a shared layer's attn_k/attn_v, if the file has them, are unused (as in llama.cpp) */
        if (!model_matrix(ld, TN("attn_k.weight"), hp->dim, kv_dim, &L->wk)) return false;
        /* no attn_v (the 31B's global layers): V is K's projection */
        if (gguf_find_tensor(m->g, TN("attn_v.weight")) && !model_matrix(ld, nm, hp->dim, kv_dim, &L->wv)) return false;
        if (!(L->k_norm = model_vector(ld, TN("attn_k_norm.weight"), true, hd))) return false;
    }
    if (!model_matrix(ld, TN("attn_output.weight"), q_dim, hp->dim, &L->wo)) return false;
    if (!(L->q_norm = model_vector(ld, TN("attn_q_norm.weight"), true, hd))) return false;
    if (!(L->attn_post_norm = model_vector(ld, TN("post_attention_norm.weight"), true, hp->dim))) return false;
    const float *os = model_vector(ld, TN("layer_output_scale.weight"), false, 1);
    if (ld->st != GGUF_OK) return false;
    L->out_scale = os ? os[0] : 0.0f;
    if (!model_gemma4_ffn(ld, il)) return false;
    if (!(L->ffn_post_norm = model_vector(ld, TN("post_ffw_norm.weight"), true, hp->dim))) return false;
    if (hp->n_pl > 0) {
        if (il == 0 && !model_gemma4_pl_inputs(ld)) return false;
        if (!model_matrix(ld, TN("inp_gate.weight"), hp->dim, hp->n_pl, &L->pl_gate)) return false;
        if (!model_matrix(ld, TN("proj.weight"), hp->n_pl, hp->dim, &L->pl_proj)) return false;
        if (!(L->pl_post_norm = model_vector(ld, TN("post_norm.weight"), true, hp->dim))) return false;
    }
#undef TN
    /* V's norm has no weight: ones, so that the shared RMS norm serves (x * 1 is exact) */
    float *ones = model_own(m, (size_t)hd);
    for (int i = 0; i < hd; i++) ones[i] = 1.0f;
    L->v_norm = ones;
    return true;
}
