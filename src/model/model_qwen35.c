/*
 * model_qwen35: the hyper-parameters and tensors of Qwen3.5 GGUFs (llama.cpp's `qwen35` and
 * `qwen35moe`, as its converter writes them).
 *
 * Every full_attention_interval-th layer (default 4: layers 3, 7, ...) is full attention:
 * Qwen3's (per-head q/k RMS norms, GQA) with the query projection twice as wide, per head the
 * query and then a gate that multiplies the attention output through a sigmoid, and partial
 * interleaved M-RoPE (rope.dimension_sections) which, for text, where every section's
 * position is the token's, is NEOX RoPE over the first rope.dimension_count dims. The others
 * are gated delta net ("linear attention") layers: attn_qkv, a causal depthwise conv of
 * ssm.conv_kernel taps over it, SiLU, q/k L2-normed, the delta rule with a per-head decay and
 * write strength, a gated RMS norm and ssm_out (engine_qwen35.c computes them). Every layer's
 * FFN input norm is post_attention_norm; the FFN is dense (qwen35) or routed experts plus a
 * shared expert scaled by a sigmoid gate (qwen35moe).
 *
 * The MTP layers that a file may store after the model's (nextn_predict_layers) are not
 * loaded: the model runs without them, as llama.cpp's main pass does.
 */
#include <stdio.h>
#include <string.h>

#include "model/model_int.h"

bool model_qwen35_hparams(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    char key[128];
    int64_t conv, inner, state, vh, kh, interval;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", hp->arch_name, suffix), key)
    if (!model_key_int(ld, KEY("ssm.conv_kernel"), true, 0, &conv)) return false;
    if (!model_key_int(ld, KEY("ssm.inner_size"), true, 0, &inner)) return false;
    if (!model_key_int(ld, KEY("ssm.state_size"), true, 0, &state)) return false;
    if (!model_key_int(ld, KEY("ssm.time_step_rank"), true, 0, &vh)) return false;
    if (!model_key_int(ld, KEY("ssm.group_count"), true, 0, &kh)) return false;
    if (!model_key_int(ld, KEY("full_attention_interval"), false, 4, &interval)) return false;
    if (gguf_find_key(m->g, KEY("attention.recurrent_layers")) >= 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s: a per-layer list of recurrent layers is not supported "
                   "(only full_attention_interval)", key);
        return false;
    }
    if (conv < 2 || conv > 16 || state <= 0 || state > 1024 || vh <= 0 || vh > 1024 || kh <= 0 || vh % kh != 0 ||
        inner != vh * state || interval < 1 || interval > 4096) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad %s linear-attention hyper-parameters: ssm.conv_kernel %lld (2..16), "
                   "state_size %lld, time_step_rank %lld (a multiple of group_count %lld), inner_size %lld "
                   "(time_step_rank * state_size), full_attention_interval %lld", hp->arch_name, (long long)conv,
                   (long long)state, (long long)vh, (long long)kh, (long long)inner, (long long)interval);
        return false;
    }
    hp->ssm_conv = (int)conv;
    hp->ssm_head = (int)state;
    hp->ssm_v_heads = (int)vh;
    hp->ssm_k_heads = (int)kh;
    /* interleaved M-RoPE: pair i takes the position of section i % 3 while i < 3 * that
     * section's size, else the 4th (0 for text); every pair must be one of the first three
     * for the text path (NEOX over n_rot dims) to be the model's */
    gguf_vtype elt;
    uint64_t n;
    const void *data;
    if (gguf_get_arr(m->g, KEY("rope.dimension_sections"), &elt, &n, &data)) {
        int64_t sec[4] = { 0 };
        for (uint64_t i = 0; i < n && i < 4; i++) {
            if (elt == GGUF_VT_INT32 || elt == GGUF_VT_UINT32) sec[i] = ((const int32_t *)data)[i];
            else if (elt == GGUF_VT_INT64 || elt == GGUF_VT_UINT64) sec[i] = ((const int64_t *)data)[i];
        }
        int64_t dims = sec[0] + sec[1] + sec[2] + sec[3];
        for (int i = 0; i < hp->n_rot / 2 && dims > 0; i++) {
            int64_t s = i % dims;
            bool text = (s % 3 == 0 && s < 3 * sec[0]) || (s % 3 == 1 && s < 3 * sec[1]) ||
                        (s % 3 == 2 && s < 3 * sec[2]);
            if (!text) {
                model_fail(ld, GGUF_ERR_FORMAT, "%s [%lld, %lld, %lld, %lld]: rotary pair %d takes the 4th position "
                           "(not supported)", key, (long long)sec[0], (long long)sec[1], (long long)sec[2],
                           (long long)sec[3], i);
                return false;
            }
        }
    }
#undef KEY
    /* MTP layers (nextn) are left out: the model's layers are all that runs */
    hp->n_nextn = 0;
    hp->n_recurrent = 0;
    for (int il = 0; il < hp->n_layers; il++) hp->n_recurrent += (il + 1) % interval != 0;
    if (hp->n_recurrent == hp->n_layers) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s: full_attention_interval %lld leaves no full-attention layer in %d",
                   hp->arch_name, (long long)interval, hp->n_layers);
        return false;
    }
    if (hp->arch == MODEL_ARCH_QWEN35MOE) {
        int64_t sh;
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", hp->arch_name);
        if (!model_key_int(ld, key, false, hp->expert_ffn, &sh)) return false;
        if (sh != hp->expert_ffn) {
            model_fail(ld, GGUF_ERR_FORMAT, "%s %lld: a shared expert of another size than the routed ones (%d) "
                       "is not supported", key, (long long)sh, hp->expert_ffn);
            return false;
        }
        hp->n_shared = 1;
    }
    return true;
}

bool model_qwen35_layer(model_ld *ld, int il)
{
    model *m = ld->m;
    const model_hparams *hp = &m->hp;
    model_layer *L = &m->layers[il];
    const int64_t dim = hp->dim, S = hp->ssm_head, H = hp->ssm_v_heads, Hk = hp->ssm_k_heads;
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    const int64_t conv_ch = 2 * Hk * S + H * S;
    int64_t interval = hp->n_layers;
    /* the layer kind again from the key: n_recurrent counted the same way */
    char key[128];
    snprintf(key, sizeof key, "%s.full_attention_interval", hp->arch_name);
    if (!model_key_int(ld, key, false, 4, &interval)) return false;
    const bool recurrent = (il + 1) % interval != 0;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(L->attn_norm = model_vector(ld, TN("attn_norm.weight"), true, dim))) return false;
    if (!(L->ffn_norm = model_vector(ld, TN("post_attention_norm.weight"), true, dim))) return false;
    if (recurrent) {
        if (!model_matrix(ld, TN("attn_qkv.weight"), dim, conv_ch, &L->ssm_qkv)) return false;
        if (!model_matrix(ld, TN("attn_gate.weight"), dim, H * S, &L->ssm_z)) return false;
        if (!model_matrix(ld, TN("ssm_beta.weight"), dim, H, &L->ssm_beta)) return false;
        if (!model_matrix(ld, TN("ssm_alpha.weight"), dim, H, &L->ssm_alpha)) return false;
        if (!model_matrix(ld, TN("ssm_out.weight"), H * S, dim, &L->ssm_out)) return false;
        if (!(L->ssm_conv1d = model_floats(ld, TN("ssm_conv1d.weight"), true, hp->ssm_conv, conv_ch))) return false;
        if (!(L->ssm_dt = model_vector(ld, TN("ssm_dt.bias"), true, H))) return false;
        if (!(L->ssm_a = model_vector(ld, TN("ssm_a"), true, H))) return false;
        if (!(L->ssm_norm = model_vector(ld, TN("ssm_norm.weight"), true, S))) return false;
    } else {
        L->attn_gated = true;
        if (!model_matrix(ld, TN("attn_q.weight"), dim, 2 * qd, &L->wq)) return false;
        if (!model_matrix(ld, TN("attn_k.weight"), dim, kvd, &L->wk)) return false;
        if (!model_matrix(ld, TN("attn_v.weight"), dim, kvd, &L->wv)) return false;
        if (!model_matrix(ld, TN("attn_output.weight"), qd, dim, &L->wo)) return false;
        if (!(L->q_norm = model_vector(ld, TN("attn_q_norm.weight"), true, hp->head_dim))) return false;
        if (!(L->k_norm = model_vector(ld, TN("attn_k_norm.weight"), true, hp->head_dim))) return false;
    }
    if (hp->n_expert > 0) {
        int ne = hp->n_expert, ef = hp->expert_ffn;
        if (!model_matrix(ld, TN("ffn_gate_inp.weight"), dim, ne, &L->gate_inp)) return false;
        if (!model_experts(ld, TN("ffn_gate_exps.weight"), dim, ef, ne, &L->gate_exps)) return false;
        if (!model_experts(ld, TN("ffn_up_exps.weight"), dim, ef, ne, &L->up_exps)) return false;
        if (!model_experts(ld, TN("ffn_down_exps.weight"), ef, dim, ne, &L->down_exps)) return false;
        if (!model_matrix(ld, TN("ffn_gate_shexp.weight"), dim, ef, &L->gate_shexp)) return false;
        if (!model_matrix(ld, TN("ffn_up_shexp.weight"), dim, ef, &L->up_shexp)) return false;
        if (!model_matrix(ld, TN("ffn_down_shexp.weight"), ef, dim, &L->down_shexp)) return false;
        if (!(L->gate_inp_shexp = model_vector(ld, TN("ffn_gate_inp_shexp.weight"), true, dim))) return false;
        return true;
    }
    if (!model_matrix(ld, TN("ffn_gate.weight"), dim, hp->ffn_dim, &L->gate)) return false;
    if (!model_matrix(ld, TN("ffn_up.weight"), dim, hp->ffn_dim, &L->up)) return false;
    if (!model_matrix(ld, TN("ffn_down.weight"), hp->ffn_dim, dim, &L->down)) return false;
#undef TN
    return true;
}
