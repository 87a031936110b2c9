/*
 * cmd_mkmodel_arch: mkmodel's families (the mk_ prefix is cmd_mkmodel's): each architecture's
 * own keys and the tensors of its layers, as llama.cpp's converters write them (see
 * cmd_mkmodel.c's comment for what each family holds). The driver writes the common keys and
 * the model-wide tensors, then calls mk_arch_keys once and mk_arch_layer for each layer after
 * its attn_norm; every tensor is added with mk_add/mk_add3, which only describe it (the bytes
 * are drawn at write time from the seed and the name), so the order of the calls here is the
 * order of the file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_mkmodel_int.h"
#include "util/util.h"

/* The FFN of a DeepSeek-style layer l (deepseek2, glm4moe): a dense one in the first n_dense
 * layers, else the F32 router, its selection bias (skewed on purpose with --router-skew: a
 * random router spreads tokens evenly, and the high ids favoured keep EPLB's ties to the lower
 * index from copying the hot experts by luck), the experts and the shared expert. */
static void mk_ds_ffn(mk_model *m, int l, qtype more, bool probs_bias)
{
    const mk_opts *o = m->o;
    const qtype base = m->base;
    const int64_t dim = o->dim;
    const float s_in = 1.0f / sqrtf((float)dim);
    char name[128];
    if (l < o->n_dense) {
        mk_add(m, MK_T("ffn_gate.weight"), MK_INIT_NOISE, s_in, base, 2, dim, o->ffn);
        mk_add(m, MK_T("ffn_up.weight"), MK_INIT_NOISE, s_in, base, 2, dim, o->ffn);
        mk_add(m, MK_T("ffn_down.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)o->ffn), more, 2, o->ffn, dim);
        return;
    }
    int64_t ne = o->n_expert, ef = o->expert_ffn, sh = ef * o->n_shared;
    mk_add(m, MK_T("ffn_gate_inp.weight"), MK_INIT_NOISE, 2.0f * s_in, QTYPE_F32, 2, dim, ne);
    if (probs_bias)
        mk_add(m, MK_T("exp_probs_b.bias"), o->router_skew > 0 ? MK_INIT_SKEW : MK_INIT_NOISE, 0.05f, QTYPE_F32, 1, ne, 1);
    mk_add3(m, MK_T("ffn_gate_exps.weight"), MK_INIT_NOISE, s_in, base, 3, dim, ef, ne);
    mk_add3(m, MK_T("ffn_up_exps.weight"), MK_INIT_NOISE, s_in, base, 3, dim, ef, ne);
    mk_add3(m, MK_T("ffn_down_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ef), more, 3, ef, dim, ne);
    if (sh > 0) {
        mk_add(m, MK_T("ffn_gate_shexp.weight"), MK_INIT_NOISE, s_in, base, 2, dim, sh);
        mk_add(m, MK_T("ffn_up_shexp.weight"), MK_INIT_NOISE, s_in, base, 2, dim, sh);
        mk_add(m, MK_T("ffn_down_shexp.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)sh), more, 2, sh, dim);
    }
}

/* One deepseek2 layer after its attn_norm: multi-head latent attention with the split
 * attn_k_b / attn_v_b (3-D, one matrix per head) of llama.cpp's current converter, then a
 * dense FFN (the first n_dense layers) or routed experts, the selection bias (sigmoid
 * routers) and the shared experts. */
static void mk_mla_layer(mk_model *m, int l, qtype more)
{
    const mk_opts *o = m->o;
    const qtype base = m->base;
    const int64_t dim = o->dim, H = o->n_heads, kq = o->nope_dim + o->rope_dim, lr = o->kv_lora;
    char name[128];
    const float s_in = 1.0f / sqrtf((float)dim);
    if (o->q_lora) {
        mk_add(m, MK_T("attn_q_a.weight"), MK_INIT_NOISE, s_in, base, 2, dim, o->q_lora);
        mk_add(m, MK_T("attn_q_a_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, o->q_lora, 1);
        mk_add(m, MK_T("attn_q_b.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)o->q_lora), base, 2, o->q_lora, H * kq);
    } else {
        mk_add(m, MK_T("attn_q.weight"), MK_INIT_NOISE, s_in, base, 2, dim, H * kq);
    }
    mk_add(m, MK_T("attn_kv_a_mqa.weight"), MK_INIT_NOISE, s_in, base, 2, dim, lr + o->rope_dim);
    mk_add(m, MK_T("attn_kv_a_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, lr, 1);
    mk_add3(m, MK_T("attn_k_b.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)o->nope_dim), base, 3, o->nope_dim, lr, H);
    mk_add3(m, MK_T("attn_v_b.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)lr), more, 3, lr, o->v_dim, H);
    mk_add(m, MK_T("attn_output.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)(H * o->v_dim)), base, 2, H * o->v_dim, dim);
    mk_add(m, MK_T("ffn_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_ds_ffn(m, l, more, o->sigmoid);
}

/* deepseek4's compression ratio of layer l: the n_plain leading layers uncompressed, then 4
 * and 128 in turn (V4-Flash: 0, 0, 4, 128, 4, ...; the test shape: 0, 4, 128, 4); the MTP
 * block after them uncompressed (the converter appends its 0). */
static int mk_dsv4_ratio(const mk_opts *o, int l)
{
    return l < o->n_plain || l >= o->n_layers ? 0 : (l - o->n_plain) % 2 ? 128 : 4;
}

/* One deepseek4 layer after its attn_norm, as llama.cpp's converter writes V4's (the tensors
 * gguf_dsv4.py lists): the sinks, low-rank queries, the one raw key/value row, the grouped
 * low-rank output, the two hyper-connection mixes; a compressed layer's compressor (with the
 * overlap's double width and the lightning indexer at ratio 4); the router, a hash table
 * (leading layers) or a selection bias, the experts and the shared expert. Mixes, sinks, the
 * compressors' position biases and the router stay F32. */
static void mk_dsv4_layer(mk_model *m, int l)
{
    const mk_opts *o = m->o;
    const qtype base = m->base;
    const int64_t dim = o->dim, H = o->n_heads, hd = o->head_dim, ql = o->q_lora, hc = o->n_hc, mix = (2 + hc) * hc;
    const int64_t gdim = H * hd / o->o_groups, orank = (int64_t)o->o_groups * o->o_lora;
    const int64_t ne = o->n_expert, ef = o->expert_ffn, sh = ef * o->n_shared, ih = o->idx_heads, idim = o->idx_dim;
    const int ratio = mk_dsv4_ratio(o, l);
    const float s_in = 1.0f / sqrtf((float)dim), s_hc = 1.0f / sqrtf((float)(hc * dim));
    char name[128];
    mk_add(m, MK_T("attn_sinks.weight"), MK_INIT_NOISE, 1.0f, QTYPE_F32, 1, H, 1);
    mk_add(m, MK_T("attn_q_a.weight"), MK_INIT_NOISE, s_in, base, 2, dim, ql);
    mk_add(m, MK_T("attn_q_a_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, ql, 1);
    mk_add(m, MK_T("attn_q_b.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ql), base, 2, ql, H * hd);
    mk_add(m, MK_T("attn_kv.weight"), MK_INIT_NOISE, s_in, base, 2, dim, hd);
    mk_add(m, MK_T("attn_kv_a_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, hd, 1);
    mk_add(m, MK_T("attn_output_a.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)gdim), base, 2, gdim, orank);
    mk_add(m, MK_T("attn_output_b.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)orank), base, 2, orank, dim);
    mk_add(m, MK_T("hc_attn_fn.weight"), MK_INIT_NOISE, s_hc, QTYPE_F32, 2, hc * dim, mix);
    mk_add(m, MK_T("hc_attn_base.weight"), MK_INIT_NOISE, 0.5f, QTYPE_F32, 1, mix, 1);
    mk_add(m, MK_T("hc_attn_scale.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, 3, 1);
    mk_add(m, MK_T("hc_ffn_fn.weight"), MK_INIT_NOISE, s_hc, QTYPE_F32, 2, hc * dim, mix);
    mk_add(m, MK_T("hc_ffn_base.weight"), MK_INIT_NOISE, 0.5f, QTYPE_F32, 1, mix, 1);
    mk_add(m, MK_T("hc_ffn_scale.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, 3, 1);
    if (ratio) {
        const int64_t coff = ratio == 4 ? 2 : 1;   /* ratio 4's groups overlap: two rows per position */
        mk_add(m, MK_T("attn_compressor_kv.weight"), MK_INIT_NOISE, s_in, base, 2, dim, coff * hd);
        mk_add(m, MK_T("attn_compressor_gate.weight"), MK_INIT_NOISE, s_in, base, 2, dim, coff * hd);
        mk_add(m, MK_T("attn_compressor_ape.weight"), MK_INIT_NOISE, 0.5f, QTYPE_F32, 2, coff * hd, ratio);
        mk_add(m, MK_T("attn_compressor_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, hd, 1);
        if (ratio == 4) {
            mk_add(m, MK_T("indexer.proj.weight"), MK_INIT_NOISE, s_in, base, 2, dim, ih);
            mk_add(m, MK_T("indexer.attn_q_b.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ql), base, 2, ql, ih * idim);
            mk_add(m, MK_T("indexer_compressor_kv.weight"), MK_INIT_NOISE, s_in, base, 2, dim, 2 * idim);
            mk_add(m, MK_T("indexer_compressor_gate.weight"), MK_INIT_NOISE, s_in, base, 2, dim, 2 * idim);
            mk_add(m, MK_T("indexer_compressor_ape.weight"), MK_INIT_NOISE, 0.5f, QTYPE_F32, 2, 2 * idim, ratio);
            mk_add(m, MK_T("indexer_compressor_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, idim, 1);
        }
    }
    mk_add(m, MK_T("ffn_gate_inp.weight"), MK_INIT_NOISE, 2.0f * s_in, QTYPE_F32, 2, dim, ne);
    if (l < o->n_hash)
        mk_add(m, MK_T("ffn_gate_tid2eid.weight"), MK_INIT_TID2EID, 0, QTYPE_I32, 2, o->n_expert_used, m->n_vocab);
    else
        mk_add(m, MK_T("exp_probs_b.bias"), MK_INIT_NOISE, 0.05f, QTYPE_F32, 1, ne, 1);
    mk_add(m, MK_T("ffn_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_add3(m, MK_T("ffn_gate_exps.weight"), MK_INIT_NOISE, s_in, o->exps_type, 3, dim, ef, ne);
    mk_add3(m, MK_T("ffn_up_exps.weight"), MK_INIT_NOISE, s_in, o->exps_type, 3, dim, ef, ne);
    mk_add3(m, MK_T("ffn_down_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ef), o->exps_type, 3, ef, dim, ne);
    mk_add(m, MK_T("ffn_gate_shexp.weight"), MK_INIT_NOISE, s_in, base, 2, dim, sh);
    mk_add(m, MK_T("ffn_up_shexp.weight"), MK_INIT_NOISE, s_in, base, 2, dim, sh);
    mk_add(m, MK_T("ffn_down_shexp.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)sh), base, 2, sh, dim);
}

/* deepseek4's keys beyond the common ones, as conversion/deepseek.py's DeepseekV4Model writes
 * them: the sqrt-softplus router (gating 4) with its normalised, scaled weights, the SwiGLU
 * clamp of every layer, the indexer, the grouped output, each layer's ratio, the compressed
 * layers' RoPE base, the hyper-connections and the hash-routed lead. */
static void mk_dsv4_keys(gguf_writer *w, const mk_opts *o)
{
    char k[128];
#define MK_KEY(suffix) (snprintf(k, sizeof k, "deepseek4." suffix), k)
    gguf_writer_set_u32(w, MK_KEY("expert_gating_func"), 4);
    gguf_writer_set_u32(w, MK_KEY("attention.q_lora_rank"), (uint32_t)o->q_lora);
    gguf_writer_set_u32(w, MK_KEY("attention.sliding_window"), (uint32_t)o->n_swa);
    gguf_writer_set_u32(w, MK_KEY("expert_shared_count"), (uint32_t)o->n_shared);
    gguf_writer_set_f32(w, MK_KEY("expert_weights_scale"), (float)o->w_scale);
    gguf_writer_set_bool(w, MK_KEY("expert_weights_norm"), true);
    const int nb = o->n_layers + o->n_nextn;   /* per block, the MTP block's included */
    float *clamp = xmalloc((size_t)nb * sizeof *clamp);
    int32_t *ratios = xmalloc((size_t)nb * sizeof *ratios);
    for (int l = 0; l < nb; l++) clamp[l] = 10.0f, ratios[l] = mk_dsv4_ratio(o, l);   /* V4's swiglu_limit */
    gguf_writer_set_arr_f32(w, MK_KEY("swiglu_clamp_exp"), clamp, (uint64_t)nb);
    gguf_writer_set_arr_f32(w, MK_KEY("swiglu_clamp_shexp"), clamp, (uint64_t)nb);
    gguf_writer_set_u32(w, MK_KEY("attention.indexer.head_count"), (uint32_t)o->idx_heads);
    gguf_writer_set_u32(w, MK_KEY("attention.indexer.key_length"), (uint32_t)o->idx_dim);
    gguf_writer_set_u32(w, MK_KEY("attention.indexer.top_k"), (uint32_t)o->idx_topk);
    gguf_writer_set_u32(w, MK_KEY("attention.output_group_count"), (uint32_t)o->o_groups);
    gguf_writer_set_u32(w, MK_KEY("attention.output_lora_rank"), (uint32_t)o->o_lora);
    gguf_writer_set_arr_i32(w, MK_KEY("attention.compress_ratios"), ratios, (uint64_t)nb);
    gguf_writer_set_f32(w, MK_KEY("attention.compress_rope_freq_base"), 160000.0f);
    gguf_writer_set_u32(w, MK_KEY("hyper_connection.count"), (uint32_t)o->n_hc);
    gguf_writer_set_u32(w, MK_KEY("hyper_connection.sinkhorn_iterations"), 20);
    gguf_writer_set_f32(w, MK_KEY("hyper_connection.epsilon"), 1e-6f);
    gguf_writer_set_u32(w, MK_KEY("hash_layer_count"), (uint32_t)o->n_hash);
    gguf_writer_set_u32(w, MK_KEY("embedding_length_out"), (uint32_t)(o->dim * o->n_hc));
    free(clamp);
    free(ratios);
#undef MK_KEY
}

/* One gpt-oss layer after its attn_norm (llama.cpp's LLM_ARCH_OPENAI_MOE tensors): q/k/v/o
 * with biases, the sinks (a logit per head, F32, of the order of the scores so that they
 * matter), post_attention_norm, the router with its bias (F32), the experts in the experts'
 * type with their biases (F32, 2-D: one row per expert). */
static void mk_gptoss_layer(mk_model *m, int l)
{
    const mk_opts *o = m->o;
    const int64_t dim = o->dim, q_dim = (int64_t)o->n_heads * o->head_dim, kv_dim = (int64_t)o->n_kv_heads * o->head_dim;
    const int64_t ne = o->n_expert, ef = o->expert_ffn;
    const float s_in = 1.0f / sqrtf((float)dim);
    char name[128];
    mk_add(m, MK_T("attn_q.weight"), MK_INIT_NOISE, s_in, m->base, 2, dim, q_dim);
    mk_add(m, MK_T("attn_q.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, q_dim, 1);
    mk_add(m, MK_T("attn_k.weight"), MK_INIT_NOISE, s_in, m->base, 2, dim, kv_dim);
    mk_add(m, MK_T("attn_k.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, kv_dim, 1);
    mk_add(m, MK_T("attn_v.weight"), MK_INIT_NOISE, s_in, m->base, 2, dim, kv_dim);
    mk_add(m, MK_T("attn_v.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, kv_dim, 1);
    mk_add(m, MK_T("attn_output.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)q_dim), m->base, 2, q_dim, dim);
    mk_add(m, MK_T("attn_output.bias"), MK_INIT_NOISE, 0.1f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("attn_sinks.weight"), MK_INIT_NOISE, 1.0f, QTYPE_F32, 1, o->n_heads, 1);
    mk_add(m, MK_T("post_attention_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("ffn_gate_inp.weight"), MK_INIT_NOISE, 2.0f * s_in, QTYPE_F32, 2, dim, ne);
    mk_add(m, MK_T("ffn_gate_inp.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, ne, 1);
    mk_add3(m, MK_T("ffn_gate_exps.weight"), MK_INIT_NOISE, s_in, o->exps_type, 3, dim, ef, ne);
    mk_add(m, MK_T("ffn_gate_exps.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 2, ef, ne);
    mk_add3(m, MK_T("ffn_up_exps.weight"), MK_INIT_NOISE, s_in, o->exps_type, 3, dim, ef, ne);
    mk_add(m, MK_T("ffn_up_exps.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 2, ef, ne);
    mk_add3(m, MK_T("ffn_down_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ef), o->exps_type, 3, ef, dim, ne);
    mk_add(m, MK_T("ffn_down_exps.bias"), MK_INIT_NOISE, 0.1f, QTYPE_F32, 2, dim, ne);
}

/* phi3's keys beyond the common ones, as conversion/phi.py writes Phi-4-mini's: LongRoPE
 * from 4096 positions (none for a context of 4096 or less), sliding_window 0. */
static void mk_phi3_keys(gguf_writer *w, const mk_opts *o)
{
    const int orig = TM_MIN(o->ctx, 4096);
    gguf_writer_set_u32(w, "phi3.rope.scaling.original_context_length", (uint32_t)orig);
    gguf_writer_set_u32(w, "phi3.attention.sliding_window", 0);
    if (o->ctx > orig)
        gguf_writer_set_f32(w, "phi3.rope.scaling.attn_factor",
                            (float)sqrt(1.0 + log((double)o->ctx / orig) / log((double)orig)));
}

/* mistral3's keys beyond llama's, as conversion/mistral3.py writes Ministral 3's: YaRN factor
 * 16 from a sixteenth of the context (Ministral 3: 16384 of 262144), beta_fast 32, beta_slow 1,
 * mscale_all_dim 1, and Llama 4's attention temperature with beta 0.1. */
static void mk_mistral3_keys(gguf_writer *w, const mk_opts *o)
{
    gguf_writer_set_str(w, "mistral3.rope.scaling.type", "yarn");
    gguf_writer_set_f32(w, "mistral3.rope.scaling.factor", 16.0f);
    gguf_writer_set_f32(w, "mistral3.rope.scaling.yarn_beta_fast", 32.0f);
    gguf_writer_set_f32(w, "mistral3.rope.scaling.yarn_beta_slow", 1.0f);
    gguf_writer_set_u32(w, "mistral3.rope.scaling.original_context_length", (uint32_t)TM_MAX(o->ctx / 16, 1));
    gguf_writer_set_f32(w, "mistral3.rope.scaling.yarn_log_multiplier", 1.0f);
    gguf_writer_set_f32(w, "mistral3.attention.temperature_scale", 0.1f);
}

/* gemma3's keys beyond the common ones, as conversion/gemma.py writes Gemma 3's: the window
 * (sliding_window_pattern not written: llama.cpp's default 6), the window layers' RoPE base,
 * and for a context past 32768 (4b..27b) linear scaling 8 of the global layers. */
static void mk_gemma3_keys(gguf_writer *w, const mk_opts *o)
{
    gguf_writer_set_u32(w, "gemma3.attention.sliding_window", (uint32_t)o->n_swa);
    gguf_writer_set_f32(w, "gemma3.rope.freq_base_swa", 10000.0f);
    if (o->ctx > 32768) {
        gguf_writer_set_str(w, "gemma3.rope.scaling.type", "linear");
        gguf_writer_set_f32(w, "gemma3.rope.scaling.factor", 8.0f);
    }
}

/* A phi3 layer after its attn_norm: Q, K and V in one matrix (q rows, then k, then v), the
 * FFN's gate and up in one ffn_up of 2 * ffn rows (gate first). */
static void mk_phi3_layer(mk_model *m, int l, qtype more)
{
    const mk_opts *o = m->o;
    const int64_t dim = o->dim, q_dim = (int64_t)o->n_heads * o->head_dim, kv_dim = (int64_t)o->n_kv_heads * o->head_dim;
    char name[128];
    mk_add(m, MK_T("attn_qkv.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), m->base, 2, dim, q_dim + 2 * kv_dim);
    mk_add(m, MK_T("attn_output.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)q_dim), m->base, 2, q_dim, dim);
    mk_add(m, MK_T("ffn_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("ffn_up.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), m->base, 2, dim, 2 * (int64_t)o->ffn);
    mk_add(m, MK_T("ffn_down.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)o->ffn), more, 2, o->ffn, dim);
}

/* deepseek2 and mistral4 (the same converter under another name) have latent attention. */
bool mk_is_mla(const char *arch)
{
    return !strcmp(arch, "deepseek2") || !strcmp(arch, "mistral4");
}

/* deepseek2's keys as llama.cpp's converter writes MLA: one kv head of the latent plus the
 * RoPE key, the ranks, the dense lead, the shared experts, the router and V2-Lite's YaRN. */
static void mk_mla_keys(gguf_writer *w, const mk_opts *o)
{
    char k[128];
    const char *A = o->arch;
#define MK_KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, A), k)
    gguf_writer_set_u32(w, MK_KEY("attention.key_length"), (uint32_t)(o->kv_lora + o->rope_dim));
    gguf_writer_set_u32(w, MK_KEY("attention.value_length"), (uint32_t)o->kv_lora);
    gguf_writer_set_u32(w, MK_KEY("attention.key_length_mla"), (uint32_t)(o->nope_dim + o->rope_dim));
    gguf_writer_set_u32(w, MK_KEY("attention.value_length_mla"), (uint32_t)o->v_dim);
    gguf_writer_set_u32(w, MK_KEY("rope.dimension_count"), (uint32_t)o->rope_dim);
    /* 0 without q-LoRA: llama.cpp reads the key for every depth but V2-Lite's */
    gguf_writer_set_u32(w, MK_KEY("attention.q_lora_rank"), (uint32_t)o->q_lora);
    gguf_writer_set_u32(w, MK_KEY("attention.kv_lora_rank"), (uint32_t)o->kv_lora);
    gguf_writer_set_u32(w, MK_KEY("leading_dense_block_count"), (uint32_t)o->n_dense);
    gguf_writer_set_u32(w, MK_KEY("expert_shared_count"), (uint32_t)o->n_shared);
    gguf_writer_set_f32(w, MK_KEY("expert_weights_scale"), (float)o->w_scale);
    gguf_writer_set_bool(w, MK_KEY("expert_weights_norm"), o->w_norm);
    gguf_writer_set_u32(w, MK_KEY("expert_gating_func"), o->sigmoid ? 2u : 1u);
    if (o->rope_yarn) {   /* DeepSeek-V2-Lite's: factor 40, mscale_all_dim 0.707 (written x 0.1) */
        gguf_writer_set_str(w, MK_KEY("rope.scaling.type"), "yarn");
        gguf_writer_set_f32(w, MK_KEY("rope.scaling.factor"), 40.0f);
        gguf_writer_set_u32(w, MK_KEY("rope.scaling.original_context_length"), 4096);
        gguf_writer_set_f32(w, MK_KEY("rope.scaling.yarn_log_multiplier"), 0.0707f);
    }
    if (o->n_groups > 1) {
        gguf_writer_set_u32(w, MK_KEY("expert_group_count"), (uint32_t)o->n_groups);
        gguf_writer_set_u32(w, MK_KEY("expert_group_used_count"), (uint32_t)o->n_groups_used);
    }
#undef MK_KEY
}

/* qwen35/qwen35moe's keys, as llama.cpp's converter writes Qwen3.5's: the linear layers'
 * geometry (4 conv taps, every 4th layer full), the interleaved M-RoPE sections over the
 * rotated pairs (all three text sections, as the model loader requires) and the shared
 * expert's size. */
static void mk_qwen35_keys(gguf_writer *w, const mk_opts *o)
{
    char k[128];
#define MK_KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, o->arch), k)
    gguf_writer_set_u32(w, MK_KEY("ssm.conv_kernel"), 4);
    gguf_writer_set_u32(w, MK_KEY("ssm.inner_size"), (uint32_t)(o->ssm_v_heads * o->ssm_state));
    gguf_writer_set_u32(w, MK_KEY("ssm.state_size"), (uint32_t)o->ssm_state);
    gguf_writer_set_u32(w, MK_KEY("ssm.time_step_rank"), (uint32_t)o->ssm_v_heads);
    gguf_writer_set_u32(w, MK_KEY("ssm.group_count"), (uint32_t)o->ssm_k_heads);
    gguf_writer_set_u32(w, MK_KEY("full_attention_interval"), 4);
    int32_t pairs = o->rope_dim / 2, sec[4] = { (pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0 };
    gguf_writer_set_arr_i32(w, MK_KEY("rope.dimension_sections"), sec, 4);
    if (o->n_expert > 0) gguf_writer_set_u32(w, MK_KEY("expert_shared_feed_forward_length"), (uint32_t)o->expert_ffn);
#undef MK_KEY
}

/* gemma4's shape: of each 6 layers the first 5 are window layers of head_dim, the 6th a global
 * one with heads twice as wide, a quarter of their kv heads when that divides (the 31B's 256/512
 * and 16/4, the 26B-A4B's 8/2; E4B's 2 stay 2) and no attn_v (V is K, the 31B's
 * attention_k_eq_v) unless o->v_global (E4B's). */
static bool mk_gemma4_swa(int l) { return l % 6 < 5; }
static int mk_gemma4_hd(const mk_opts *o, int l) { return mk_gemma4_swa(l) ? o->head_dim : 2 * o->head_dim; }
static int mk_gemma4_kv(const mk_opts *o, int l)
{
    return mk_gemma4_swa(l) || o->n_kv_heads % 4 ? o->n_kv_heads : o->n_kv_heads / 4;
}

/* gemma4's keys beyond the common ones, as conversion/gemma.py's Gemma4Model writes them: the
 * per-layer window pattern and kv heads, the global (key_length, rope.dimension_count) and
 * window (_swa) head sizes, the window layers' RoPE base, the soft cap, and the features
 * tokenmill does not run set to none (per-layer embeddings, shared KV layers). */
static void mk_gemma4_keys(gguf_writer *w, const mk_opts *o)
{
    int32_t kv[4096];
    uint8_t swa[4096];
    for (int l = 0; l < o->n_layers; l++) kv[l] = mk_gemma4_kv(o, l), swa[l] = mk_gemma4_swa(l);
    gguf_writer_set_arr_i32(w, "gemma4.attention.head_count_kv", kv, (uint64_t)o->n_layers);
    gguf_writer_set_arr(w, "gemma4.attention.sliding_window_pattern", GGUF_VT_BOOL, swa, (uint64_t)o->n_layers);
    gguf_writer_set_u32(w, "gemma4.attention.sliding_window", (uint32_t)o->n_swa);
    gguf_writer_set_u32(w, "gemma4.attention.key_length", (uint32_t)(2 * o->head_dim));
    gguf_writer_set_u32(w, "gemma4.attention.value_length", (uint32_t)(2 * o->head_dim));
    gguf_writer_set_u32(w, "gemma4.attention.key_length_swa", (uint32_t)o->head_dim);
    gguf_writer_set_u32(w, "gemma4.attention.value_length_swa", (uint32_t)o->head_dim);
    gguf_writer_set_u32(w, "gemma4.rope.dimension_count", (uint32_t)(2 * o->head_dim));
    gguf_writer_set_u32(w, "gemma4.rope.dimension_count_swa", (uint32_t)o->head_dim);
    gguf_writer_set_f32(w, "gemma4.rope.freq_base_swa", 10000.0f);
    gguf_writer_set_f32(w, "gemma4.final_logit_softcapping", 30.0f);
    gguf_writer_set_u32(w, "gemma4.attention.shared_kv_layers", (uint32_t)o->n_shared_kv);
    gguf_writer_set_u32(w, "gemma4.embedding_length_per_layer_input", (uint32_t)o->n_pl);
}

static void mk_ffn(mk_model *m, int l, qtype down_t);

/* A gemma4 layer after its attn_norm: its own head size and kv heads (mk_gemma4_*), q/k head
 * norms, the sublayers' output norms, GELU FFN, the layer output scale. */
static void mk_gemma4_layer(mk_model *m, int l)
{
    const mk_opts *o = m->o;
    const qtype base = m->base;
    const int64_t dim = o->dim, hd = mk_gemma4_hd(o, l), q_dim = (int64_t)o->n_heads * hd, kv_dim = mk_gemma4_kv(o, l) * hd;
    char name[128];
    mk_add(m, MK_T("attn_q.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, q_dim);
    mk_add(m, MK_T("attn_k.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, kv_dim);
    if (mk_gemma4_swa(l) || o->v_global) mk_add(m, MK_T("attn_v.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, kv_dim);
    mk_add(m, MK_T("attn_q_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, hd, 1);
    mk_add(m, MK_T("attn_k_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, hd, 1);
    mk_add(m, MK_T("attn_output.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)q_dim), base, 2, q_dim, dim);
    mk_add(m, MK_T("post_attention_norm.weight"), MK_INIT_NORM, 0.3f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("ffn_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("post_ffw_norm.weight"), MK_INIT_NORM, 0.3f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("layer_output_scale.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, 1, 1);
    mk_add(m, MK_T("ffn_gate.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, o->ffn);
    mk_add(m, MK_T("ffn_up.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, o->ffn);
    mk_add(m, MK_T("ffn_down.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)o->ffn), base, 2, o->ffn, dim);
    if (o->n_expert > 0) {   /* the 26B-A4B's experts beside the dense FFN, gate and up fused as the converter writes them */
        const int64_t ne = o->n_expert, ef = o->expert_ffn;
        mk_add(m, MK_T("ffn_gate_inp.weight"), MK_INIT_NOISE, 2.0f, QTYPE_F32, 2, dim, ne);
        mk_add(m, MK_T("ffn_gate_inp.scale"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
        mk_add(m, MK_T("pre_ffw_norm_2.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
        mk_add(m, MK_T("post_ffw_norm_1.weight"), MK_INIT_NORM, 0.3f, QTYPE_F32, 1, dim, 1);
        mk_add(m, MK_T("post_ffw_norm_2.weight"), MK_INIT_NORM, 0.3f, QTYPE_F32, 1, dim, 1);
        mk_add3(m, MK_T("ffn_gate_up_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 3, dim, 2 * ef, ne);
        mk_add3(m, MK_T("ffn_down_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ef), base, 3, ef, dim, ne);
        mk_add(m, MK_T("ffn_down_exps.scale"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, ne, 1);
    }
    if (o->n_pl > 0) {   /* per-layer embeddings: this layer's gate, projection and norm */
        mk_add(m, MK_T("inp_gate.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, o->n_pl);
        mk_add(m, MK_T("proj.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)o->n_pl), base, 2, o->n_pl, dim);
        mk_add(m, MK_T("post_norm.weight"), MK_INIT_NORM, 0.3f, QTYPE_F32, 1, dim, 1);
    }
}

/* Layer l's FFN after its norm: routed experts (an F32 router, 3-D gate/up/down) or a dense
 * one; down_t the type of ffn_down (a K-quant mix gives it more bits). */
static void mk_ffn(mk_model *m, int l, qtype down_t)
{
    const mk_opts *o = m->o;
    const int64_t dim = o->dim, ffn = o->ffn;
    const qtype base = m->base;
    char name[128];
    if (o->n_expert > 0) {
        /* the router stays F32 (llama.cpp's converter and quantiser keep it so); its
         * logits have a standard deviation near 2, so that routing is rarely a near-tie */
        int64_t ne = o->n_expert, ef = o->expert_ffn;
        mk_add(m, MK_T("ffn_gate_inp.weight"), MK_INIT_NOISE, 2.0f / sqrtf((float)dim), QTYPE_F32, 2, dim, ne);
        mk_add3(m, MK_T("ffn_gate_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 3, dim, ef, ne);
        mk_add3(m, MK_T("ffn_up_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 3, dim, ef, ne);
        mk_add3(m, MK_T("ffn_down_exps.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ef), down_t, 3, ef, dim, ne);
        return;
    }
    mk_add(m, MK_T("ffn_gate.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, ffn);
    mk_add(m, MK_T("ffn_up.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, ffn);
    mk_add(m, MK_T("ffn_down.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ffn), down_t, 2, ffn, dim);
}

/* A qwen35/qwen35moe layer after its attn_norm: a gated delta net, or (every 4th) full
 * attention with the query's gate and head norms; post_attention_norm; then routed experts and
 * the gated shared expert, or a dense FFN. */
static void mk_qwen35_layer(mk_model *m, int l)
{
    const mk_opts *o = m->o;
    const qtype base = m->base;
    const int64_t dim = o->dim, q_dim = (int64_t)o->n_heads * o->head_dim, kv_dim = (int64_t)o->n_kv_heads * o->head_dim;
    const int64_t S = o->ssm_state, H = o->ssm_v_heads, ch = (2 * (int64_t)o->ssm_k_heads + H) * S;
    const float sd = 1.0f / sqrtf((float)dim);
    char name[128];
    if ((l + 1) % 4 != 0) {
        mk_add(m, MK_T("attn_qkv.weight"), MK_INIT_NOISE, sd, base, 2, dim, ch);
        mk_add(m, MK_T("attn_gate.weight"), MK_INIT_NOISE, sd, base, 2, dim, H * S);
        mk_add(m, MK_T("ssm_beta.weight"), MK_INIT_NOISE, sd, base, 2, dim, H);
        mk_add(m, MK_T("ssm_alpha.weight"), MK_INIT_NOISE, sd, base, 2, dim, H);
        mk_add(m, MK_T("ssm_conv1d.weight"), MK_INIT_NOISE, 0.5f, QTYPE_F32, 2, 4, ch);
        mk_add(m, MK_T("ssm_dt.bias"), MK_INIT_NOISE, 0.5f, QTYPE_F32, 1, H, 1);
        mk_add(m, MK_T("ssm_a"), MK_INIT_NORM, -4.0f, QTYPE_F32, 1, H, 1);   /* A = -exp(A_log): a decay */
        mk_add(m, MK_T("ssm_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, S, 1);
        mk_add(m, MK_T("ssm_out.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)(H * S)), base, 2, H * S, dim);
    } else {
        mk_add(m, MK_T("attn_q.weight"), MK_INIT_NOISE, sd, base, 2, dim, 2 * q_dim);
        mk_add(m, MK_T("attn_k.weight"), MK_INIT_NOISE, sd, base, 2, dim, kv_dim);
        mk_add(m, MK_T("attn_v.weight"), MK_INIT_NOISE, sd, base, 2, dim, kv_dim);
        mk_add(m, MK_T("attn_q_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, o->head_dim, 1);
        mk_add(m, MK_T("attn_k_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, o->head_dim, 1);
        mk_add(m, MK_T("attn_output.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)q_dim), base, 2, q_dim, dim);
    }
    mk_add(m, MK_T("post_attention_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_ffn(m, l, base);
    if (o->n_expert > 0) {   /* the shared expert and its gate */
        int64_t ef = o->expert_ffn;
        mk_add(m, MK_T("ffn_gate_inp_shexp.weight"), MK_INIT_NOISE, sd, QTYPE_F32, 1, dim, 1);
        mk_add(m, MK_T("ffn_gate_shexp.weight"), MK_INIT_NOISE, sd, base, 2, dim, ef);
        mk_add(m, MK_T("ffn_up_shexp.weight"), MK_INIT_NOISE, sd, base, 2, dim, ef);
        mk_add(m, MK_T("ffn_down_shexp.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)ef), base, 2, ef, dim);
    }
}

/* A glm4moe layer after its attn_norm: biased Q/K/V, the output, post_attention_norm, then a
 * dense FFN (the first n_dense layers) or the router, its selection bias, the experts and the
 * shared expert. */
static void mk_glm4moe_layer(mk_model *m, int l, qtype more)
{
    const mk_opts *o = m->o;
    const qtype base = m->base;
    const int64_t dim = o->dim, q_dim = (int64_t)o->n_heads * o->head_dim, kv_dim = (int64_t)o->n_kv_heads * o->head_dim;
    const float s_in = 1.0f / sqrtf((float)dim);
    char name[128];
    mk_add(m, MK_T("attn_q.weight"), MK_INIT_NOISE, s_in, base, 2, dim, q_dim);
    mk_add(m, MK_T("attn_k.weight"), MK_INIT_NOISE, s_in, base, 2, dim, kv_dim);
    mk_add(m, MK_T("attn_v.weight"), MK_INIT_NOISE, s_in, more, 2, dim, kv_dim);
    mk_add(m, MK_T("attn_q.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, q_dim, 1);
    mk_add(m, MK_T("attn_k.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, kv_dim, 1);
    mk_add(m, MK_T("attn_v.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, kv_dim, 1);
    mk_add(m, MK_T("attn_output.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)q_dim), base, 2, q_dim, dim);
    mk_add(m, MK_T("post_attention_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_ds_ffn(m, l, more, true);
}

/* An MTP layer's own tensors beside its layer's: the input projection [e_proj | h_proj], its
 * two norms and the head norm (all that deepseek4's block has: its MTP-only file carries the
 * shared embedding and head, conversion/deepseek.py's mtp.0.*). */
static void mk_nextn_proj(mk_model *m, int l)
{
    const int64_t dim = m->o->dim;
    char name[128];
    mk_add(m, MK_T("nextn.eh_proj.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)(2 * dim)), m->base, 2, 2 * dim, dim);
    mk_add(m, MK_T("nextn.enorm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("nextn.hnorm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("nextn.shared_head_norm.weight"), MK_INIT_NORM, 20.0f, QTYPE_F32, 1, dim, 1);
}

/* A deepseek2 MTP layer's own tensors after its MLA layer: the input projection and norms,
 * and V3's copies of the embedding and the head (drawn with their seeds). */
static void mk_nextn_layer(mk_model *m, int l, float emb_std, qtype out_type, int64_t V)
{
    const mk_opts *o = m->o;
    const int64_t dim = o->dim;
    char name[128];
    mk_nextn_proj(m, l);
    mk_add(m, MK_T("nextn.embed_tokens.weight"), MK_INIT_NOISE, emb_std, o->tied ? out_type : m->base, 2, dim, V);
    m->ts[m->n - 1].seed = mk_seed_of(o, "token_embd.weight");
    mk_add(m, MK_T("nextn.shared_head_head.weight"), MK_INIT_NOISE, emb_std, out_type, 2, dim, V);
    m->ts[m->n - 1].seed = mk_seed_of(o, o->tied ? "token_embd.weight" : "output.weight");
}

/* A llama, qwen2, qwen3, qwen3moe or mistral3 layer after its attn_norm: the attention
 * (qwen2's biases, qwen3's head norms), ffn_norm, then routed experts or a dense FFN. l is
 * the layer; more the type of the tensors a K-quant mix gives more bits. */
static void mk_dense_layer(mk_model *m, int l, qtype more)
{
    const mk_opts *o = m->o;
    const char *A = o->arch;
    const qtype base = m->base;
    const int64_t dim = o->dim, q_dim = (int64_t)o->n_heads * o->head_dim, kv_dim = (int64_t)o->n_kv_heads * o->head_dim;
    char name[128];
    /* Q3_K_M (llama.cpp's rule for dense models): attn_v Q5_K in the first 2 layers, ffn_down in
     * the first n/16, Q4_K after; attn_output Q4_K */
    qtype v_t = more, down_t = more, o_t = base;
    if (m->k_m && base == QTYPE_Q3_K)
        v_t = l < 2 ? QTYPE_Q5_K : QTYPE_Q4_K, down_t = l < o->n_layers / 16 ? QTYPE_Q5_K : QTYPE_Q4_K, o_t = QTYPE_Q4_K;
    mk_add(m, MK_T("attn_q.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, q_dim);
    mk_add(m, MK_T("attn_k.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, kv_dim);
    mk_add(m, MK_T("attn_v.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)dim), v_t, 2, dim, kv_dim);
    if (!strcmp(A, "qwen2")) {
        mk_add(m, MK_T("attn_q.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, q_dim, 1);
        mk_add(m, MK_T("attn_k.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, kv_dim, 1);
        mk_add(m, MK_T("attn_v.bias"), MK_INIT_NOISE, 0.3f, QTYPE_F32, 1, kv_dim, 1);
    }
    const bool gemma = !strcmp(A, "gemma3");
    if (!strcmp(A, "qwen3") || !strcmp(A, "qwen3moe") || gemma) {
        mk_add(m, MK_T("attn_q_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, o->head_dim, 1);
        mk_add(m, MK_T("attn_k_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, o->head_dim, 1);
    }
    mk_add(m, MK_T("attn_output.weight"), MK_INIT_NOISE, 1.0f / sqrtf((float)q_dim), o_t, 2, q_dim, dim);
    /* gemma3's norms of each sublayer's output: small, as the scaled embeddings' (about 0.5) */
    if (gemma) mk_add(m, MK_T("post_attention_norm.weight"), MK_INIT_NORM, 0.3f, QTYPE_F32, 1, dim, 1);
    mk_add(m, MK_T("ffn_norm.weight"), MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
    if (gemma) mk_add(m, MK_T("post_ffw_norm.weight"), MK_INIT_NORM, 0.3f, QTYPE_F32, 1, dim, 1);
    mk_ffn(m, l, down_t);
}

/* The family part of mk_write_keys: the attention's key/value sizes and RoPE dims (MLA's
 * own), then each family's keys. */
void mk_arch_keys(gguf_writer *w, const mk_opts *o)
{
    const char *A = o->arch;
    char k[128];
#define MK_KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, A), k)
    if (mk_is_mla(A)) {
        mk_mla_keys(w, o);
    } else {
        gguf_writer_set_u32(w, MK_KEY("attention.key_length"), (uint32_t)o->head_dim);
        gguf_writer_set_u32(w, MK_KEY("attention.value_length"), (uint32_t)o->head_dim);
        gguf_writer_set_u32(w, MK_KEY("rope.dimension_count"), (uint32_t)(o->rope_dim ? o->rope_dim : o->head_dim));
    }
    if (!strcmp(A, "phi3")) mk_phi3_keys(w, o);
    if (!strcmp(A, "mistral3")) mk_mistral3_keys(w, o);
    if (o->ssm_state > 0) mk_qwen35_keys(w, o);
    if (!strcmp(A, "gemma3")) mk_gemma3_keys(w, o);
    if (!strcmp(A, "gemma4")) mk_gemma4_keys(w, o);
    if (!strcmp(A, "deepseek4")) mk_dsv4_keys(w, o);
    if (!strcmp(A, "glm4moe")) {   /* as Glm4MoeModel writes GLM-4.5's router and lead */
        gguf_writer_set_u32(w, MK_KEY("leading_dense_block_count"), (uint32_t)o->n_dense);
        gguf_writer_set_u32(w, MK_KEY("expert_shared_count"), (uint32_t)o->n_shared);
        gguf_writer_set_u32(w, MK_KEY("expert_gating_func"), 2u);
        gguf_writer_set_f32(w, MK_KEY("expert_weights_scale"), (float)o->w_scale);
        gguf_writer_set_bool(w, MK_KEY("expert_weights_norm"), true);
    }
    if (!strcmp(A, "gpt-oss")) {   /* gpt-oss, as its converter writes it (the layer pattern: llama.cpp's default 2) */
        gguf_writer_set_u32(w, MK_KEY("attention.sliding_window"), (uint32_t)o->n_swa);
        gguf_writer_set_str(w, MK_KEY("rope.scaling.type"), "yarn");
        gguf_writer_set_f32(w, MK_KEY("rope.scaling.factor"), 32.0f);
        gguf_writer_set_u32(w, MK_KEY("rope.scaling.original_context_length"), 4096);
    }
#undef MK_KEY
}

/* Layer l after its attn_norm, by family; the MTP layers (deepseek2, glm4moe, deepseek4's
 * MTP-only file) add their nextn tensors. */
void mk_arch_layer(mk_model *m, int l, qtype more, float emb_std, qtype out_type)
{
    const mk_opts *o = m->o;
    const char *A = o->arch;
    if (mk_is_mla(A)) {
        mk_mla_layer(m, l, more);
        if (l >= o->n_layers) mk_nextn_layer(m, l, emb_std, out_type, m->n_vocab);
    } else if (!strcmp(A, "glm4moe")) {
        mk_glm4moe_layer(m, l, more);
        if (l >= o->n_layers) mk_nextn_layer(m, l, emb_std, out_type, m->n_vocab);
    } else if (!strcmp(A, "deepseek4")) {
        mk_dsv4_layer(m, l);
        if (l >= o->n_layers) mk_nextn_proj(m, l);
    } else if (!strcmp(A, "gpt-oss")) {
        mk_gptoss_layer(m, l);
    } else if (!strcmp(A, "phi3")) {
        mk_phi3_layer(m, l, more);
    } else if (!strcmp(A, "gemma4")) {
        mk_gemma4_layer(m, l);
    } else if (o->ssm_state > 0) {
        mk_qwen35_layer(m, l);
    } else {
        mk_dense_layer(m, l, more);
    }
}
