/*
 * model_dsv4: loading of DeepSeek V4 (`deepseek4`) files: the keys llama.cpp's
 * llama_model_deepseek4::load_arch_hparams reads and the tensors of load_arch_tensors, each
 * checked for presence, type and shape, a failure naming what is wrong. See model_dsv4.h.
 */
#include "model/model_dsv4.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_int.h"
#include "util/util.h"

/* Element i of a numeric array key (or the key's scalar for every i): false when absent or
 * not numeric, or the array too short. */
static bool dsv4_arr_num(const gguf *g, const char *key, int i, double *out)
{
    gguf_vtype et;
    uint64_t n;
    const void *data;
    if (!gguf_get_arr(g, key, &et, &n, &data)) {
        if (gguf_get_float(g, key, out)) return true;
        int64_t v;
        if (!gguf_get_int(g, key, &v)) return false;
        *out = (double)v;
        return true;
    }
    if (!data || (uint64_t)i >= n) return false;
    const uint8_t *p = data;
    switch (et) {
    case GGUF_VT_UINT32: { uint32_t v; memcpy(&v, p + 4 * (size_t)i, 4); *out = v; return true; }
    case GGUF_VT_INT32: { int32_t v; memcpy(&v, p + 4 * (size_t)i, 4); *out = v; return true; }
    case GGUF_VT_FLOAT32: { float v; memcpy(&v, p + 4 * (size_t)i, 4); *out = v; return true; }
    case GGUF_VT_UINT64: { uint64_t v; memcpy(&v, p + 8 * (size_t)i, 8); *out = (double)v; return true; }
    case GGUF_VT_INT64: { int64_t v; memcpy(&v, p + 8 * (size_t)i, 8); *out = (double)v; return true; }
    case GGUF_VT_FLOAT64: { double v; memcpy(&v, p + 8 * (size_t)i, 8); *out = v; return true; }
    default: return false;
    }
}

/* The file's key arch.suffix: "deepseek4." for a V4 model, "dflash." for a DSpark drafter with
 * the V4 backbone (model_dflash.c), whose converter writes the same keys under its prefix. */
static const char *dsv4_key(const model_ld *ld, const char *suffix, char *buf, size_t sz)
{
    snprintf(buf, sz, "%s.%s", ld->m->hp.arch_name, suffix);
    return buf;
}

static bool dsv4_int(model_ld *ld, const char *suffix, bool required, int64_t def, int64_t lo, int64_t hi, int *out)
{
    char key[128];
    dsv4_key(ld, suffix, key, sizeof key);
    int64_t v;
    if (!model_key_int(ld, key, required, def, &v)) return false;
    if (v < lo || v > hi) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad %s %lld (%lld..%lld)", key, (long long)v, (long long)lo, (long long)hi);
        return false;
    }
    *out = (int)v;
    return true;
}

/* The two RoPEs as llama.cpp's V4 graph sets them: ratio-0 layers rotate with the plain base
 * and no scaling whatever the file says; compressed layers with the compressed base and the
 * file's scaling (freq_scale = 1 / rope.scaling.factor), under YaRN with ext_factor 1, the
 * ramp of the compressed base over rope.scaling.original_context_length, and V4's own
 * attention factor (not model.c's rope_attn_factor, which V4's graph does not use). */
static bool dsv4_read_rope(model_ld *ld)
{
    model_hparams *hp = &ld->m->hp;
    model_dsv4 *d = ld->m->dsv4;
    const float n_rot = (float)hp->n_rot;
    char kb[128];
    d->rope_raw = (model_dsv4_rope){ .theta_scale = hp->rope_theta_scale, .freq_scale = 1.0f, .mscale = 1.0f };
    model_dsv4_rope *c = &d->rope_comp;
    *c = (model_dsv4_rope){ .theta_scale = powf(d->cbase, -2.0f / n_rot), .freq_scale = hp->rope_freq_scale,
                            .mscale = 1.0f };
    if (hp->rope_yarn[0] != 0.0f) {
        double orig;
        if (!model_key_float(ld, dsv4_key(ld, "rope.scaling.original_context_length", kb, sizeof kb), hp->n_ctx_train,
                             &orig))
            return false;
        if (!(orig >= 1)) {
            model_fail(ld, GGUF_ERR_FORMAT, "bad deepseek4.rope.scaling.original_context_length %g", orig);
            return false;
        }
        c->yarn[0] = 1.0f;
        model_yarn_corr_dims(hp->n_rot, (float)orig, d->cbase, c->yarn + 1);
        c->mscale = 1.0f / (1.0f + 0.1f * logf(1.0f / c->freq_scale));
    }
    return true;
}

void model_dsv4_free(model_dsv4 *d)
{
    if (!d) return;
    free(d->mtp);
    free(d->layers);
    free(d);
}

/* The family's keys: the MoE keys model_read_hparams leaves to the MoE families, the
 * attention's ranks and groups, the hyper-connections, the hash layers and the indexer. */
int model_dsv4_layer_matrices(model_dsv4 *d, int il, model_dsv4_mat *out)
{
    model_dsv4_layer *l = &d->layers[il];
    const model_dsv4_mat all[MODEL_DSV4_LAYER_MATS] = {
        { &l->wkv, 0, MODEL_DSV4_USE_ATT_IN },        { &l->comp_kv, 0, MODEL_DSV4_USE_ATT_IN },
        { &l->comp_gate, 0, MODEL_DSV4_USE_ATT_IN },  { &l->idx_proj, 0, MODEL_DSV4_USE_ATT_IN },
        { &l->idx_q_b, 0, MODEL_DSV4_USE_ATT_IN },    { &l->icomp_kv, 0, MODEL_DSV4_USE_ATT_IN },
        { &l->icomp_gate, 0, MODEL_DSV4_USE_ATT_IN }, { &l->wo_a, d->o_lora, MODEL_DSV4_USE_ATT_OUT },
        { &l->wo_b, 0, MODEL_DSV4_USE_ATT_OUT },      { &l->hc_fn[0], 0, MODEL_DSV4_USE_HC },
        { &l->hc_fn[1], 0, MODEL_DSV4_USE_HC },
    };
    int n = 0;
    for (int i = 0; i < MODEL_DSV4_LAYER_MATS; i++)
        if (all[i].w->data) out[n++] = all[i];
    return n;
}

static bool dsv4_read_hparams(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    model_dsv4 *d = m->dsv4;
    const int L = hp->n_layers, H = hp->n_heads, hd = hp->head_dim;
    double f;
    char kb[128];
    if (!dsv4_int(ld, "expert_count", true, 0, 1, MODEL_MAX_EXPERTS, &hp->n_expert)) return false;
    if (!dsv4_int(ld, "expert_used_count", true, 0, 1, hp->n_expert, &hp->n_expert_used)) return false;
    if (!dsv4_int(ld, "expert_shared_count", false, 0, 0, 64, &hp->n_shared)) return false;
    int gating;
    if (!dsv4_int(ld, "expert_gating_func", true, 0, 0, 16, &gating)) return false;
    if (gating != 4) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s %d: only 4 (sqrt-softplus) is supported",
                   dsv4_key(ld, "expert_gating_func", kb, sizeof kb), gating);
        return false;
    }
    bool b;
    hp->router_norm = gguf_get_bool(m->g, dsv4_key(ld, "expert_weights_norm", kb, sizeof kb), &b) && b;
    if (!model_key_float(ld, dsv4_key(ld, "expert_weights_scale", kb, sizeof kb), 1.0, &f)) return false;
    hp->router_scale = (float)f;
    if (hp->n_kv_heads != 1) {
        model_fail(ld, GGUF_ERR_FORMAT, "deepseek4: %d kv heads, the family has one (K = V)", hp->n_kv_heads);
        return false;
    }
    if (hp->rope_freq_factors) {
        model_fail(ld, GGUF_ERR_FORMAT, "deepseek4 with per-frequency RoPE factors (rope_freqs / llama3 scaling) "
                   "is not supported: llama.cpp's V4 scales by YaRN or linearly only");
        return false;
    }

    if (!dsv4_int(ld, "attention.q_lora_rank", true, 0, 1, 1 << 16, &d->q_lora)) return false;
    if (!dsv4_int(ld, "attention.sliding_window", true, 0, 1, 1 << 20, &d->swa)) return false;
    if (!dsv4_int(ld, "attention.output_group_count", true, 0, 1, H, &d->o_groups)) return false;
    if (!dsv4_int(ld, "attention.output_lora_rank", true, 0, 1, 1 << 16, &d->o_lora)) return false;
    if (!dsv4_int(ld, "hyper_connection.count", true, 0, 1, 16, &d->hc)) return false;
    if (!dsv4_int(ld, "hyper_connection.sinkhorn_iterations", true, 0, 1, 1000, &d->sk_iters)) return false;
    if (!model_key_float(ld, dsv4_key(ld, "hyper_connection.epsilon", kb, sizeof kb), 1e-6, &f)) return false;
    d->hc_eps = (float)f;
    if (!dsv4_int(ld, "hash_layer_count", false, 0, 0, L + hp->n_nextn, &d->n_hash)) return false;
    if (!dsv4_int(ld, "attention.indexer.head_count", true, 0, 1, 4096, &d->idx_heads)) return false;
    if (!dsv4_int(ld, "attention.indexer.key_length", true, 0, 2, 4096, &d->idx_dim)) return false;
    if (!dsv4_int(ld, "attention.indexer.top_k", true, 0, 1, 1 << 24, &d->idx_topk)) return false;
    if (!model_key_float(ld, dsv4_key(ld, "attention.compress_rope_freq_base", kb, sizeof kb), 0.0, &f)) return false;
    d->cbase = (float)f;
    if (H % d->o_groups != 0 || d->cbase <= 0 || hp->n_rot > d->idx_dim || d->idx_dim % 2) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad deepseek4 hyper-parameters: %d heads in %d output groups, compressed "
                   "RoPE base %g, indexer key length %d (rope dims %d)", H, d->o_groups, (double)d->cbase, d->idx_dim,
                   hp->n_rot);
        return false;
    }
    if (!dsv4_read_rope(ld)) return false;
    hp->att_scale = 1.0f / sqrtf((float)hd);
    hp->n_swa = d->swa;
    return true;
}

/* Layer il's entries of the per-layer array keys: compression ratio, expert FFN size and the
 * SwiGLU clamps. */
static bool dsv4_layer_keys(model_ld *ld, int il)
{
    const gguf *g = ld->m->g;
    model_dsv4 *d = ld->m->dsv4;
    model_dsv4_layer *dl = &d->layers[il];
    double r, ef, ce, cs;
    char kb[128];
    if (!dsv4_arr_num(g, dsv4_key(ld, "attention.compress_ratios", kb, sizeof kb), il, &r) ||
        (r != 0 && r != 4 && r != 128)) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s: layer %d missing or not 0, 4 or 128", kb, il);
        return false;
    }
    if (!dsv4_arr_num(g, dsv4_key(ld, "expert_feed_forward_length", kb, sizeof kb), il, &ef) || ef < 1 ||
        ef > (1 << 22)) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s: layer %d missing or bad", kb, il);
        return false;
    }
    if (!dsv4_arr_num(g, dsv4_key(ld, "swiglu_clamp_exp", kb, sizeof kb), il, &ce)) ce = 0;
    if (!dsv4_arr_num(g, dsv4_key(ld, "swiglu_clamp_shexp", kb, sizeof kb), il, &cs)) cs = ce;
    dl->ratio = (int)r;
    dl->ffn = (int)ef;
    dl->clamp_exp = (float)ce;
    dl->clamp_shexp = (float)cs;
    d->max_ffn = TM_MAX(d->max_ffn, dl->ffn);
    ld->m->layers[il].window = d->swa;
    return true;
}

/* Layer il's attention tensors: the low-rank query, the one K = V head, the grouped output,
 * the two hyper-connections, and the compressor and indexer its ratio asks for. */
static bool dsv4_layer_attn(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    const model_dsv4 *d = ld->m->dsv4;
    model_layer *ly = &ld->m->layers[il];
    model_dsv4_layer *dl = &d->layers[il];
    const int dim = hp->dim, H = hp->n_heads, hd = hp->head_dim;
    const int hc = d->hc, mix = (2 + hc) * hc, ql = d->q_lora;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(ly->attn_norm = model_vector(ld, TN("attn_norm.weight"), true, dim))) return false;
    if (!(ly->sinks = model_vector(ld, TN("attn_sinks.weight"), true, H))) return false;
    if (!model_matrix(ld, TN("attn_q_a.weight"), dim, ql, &ly->wq_a)) return false;
    if (!(ly->q_a_norm = model_vector(ld, TN("attn_q_a_norm.weight"), true, ql))) return false;
    if (!model_matrix(ld, TN("attn_q_b.weight"), ql, (int64_t)H * hd, &ly->wq_b)) return false;
    if (!model_matrix(ld, TN("attn_kv.weight"), dim, hd, &dl->wkv)) return false;
    if (!(dl->kv_norm = model_vector(ld, TN("attn_kv_a_norm.weight"), true, hd))) return false;
    if (!model_matrix(ld, TN("attn_output_a.weight"), (int64_t)H * hd / d->o_groups,
                      (int64_t)d->o_groups * d->o_lora, &dl->wo_a)) return false;
    if (!model_matrix(ld, TN("attn_output_b.weight"), (int64_t)d->o_groups * d->o_lora, dim, &dl->wo_b)) return false;
    static const char *const hck[2] = { "attn", "ffn" };
    for (int k = 0; k < 2; k++) {
        char sfx[48];
        snprintf(sfx, sizeof sfx, "hc_%s_fn.weight", hck[k]);
        if (!model_matrix(ld, TN(sfx), (int64_t)hc * dim, mix, &dl->hc_fn[k])) return false;
        snprintf(sfx, sizeof sfx, "hc_%s_base.weight", hck[k]);
        if (!(dl->hc_base[k] = model_vector(ld, TN(sfx), true, mix))) return false;
        snprintf(sfx, sizeof sfx, "hc_%s_scale.weight", hck[k]);
        if (!(dl->hc_scale[k] = model_vector(ld, TN(sfx), true, 3))) return false;
    }
    if (dl->ratio) {
        int coff = dl->ratio == 4 ? 2 : 1;
        if (!model_matrix(ld, TN("attn_compressor_kv.weight"), dim, (int64_t)coff * hd, &dl->comp_kv)) return false;
        if (!model_matrix(ld, TN("attn_compressor_gate.weight"), dim, (int64_t)coff * hd, &dl->comp_gate)) return false;
        if (!(dl->comp_ape = model_floats(ld, TN("attn_compressor_ape.weight"), true, (int64_t)coff * hd, dl->ratio)))
            return false;
        if (!(dl->comp_norm = model_vector(ld, TN("attn_compressor_norm.weight"), true, hd))) return false;
    }
    if (dl->ratio == 4) {
        int ih = d->idx_heads, id = d->idx_dim;
        if (!model_matrix(ld, TN("indexer.proj.weight"), dim, ih, &dl->idx_proj)) return false;
        if (!model_matrix(ld, TN("indexer.attn_q_b.weight"), ql, (int64_t)ih * id, &dl->idx_q_b)) return false;
        if (!model_matrix(ld, TN("indexer_compressor_kv.weight"), dim, 2 * (int64_t)id, &dl->icomp_kv)) return false;
        if (!model_matrix(ld, TN("indexer_compressor_gate.weight"), dim, 2 * (int64_t)id, &dl->icomp_gate)) return false;
        if (!(dl->icomp_ape = model_floats(ld, TN("indexer_compressor_ape.weight"), true, 2 * (int64_t)id, 4)))
            return false;
        if (!(dl->icomp_norm = model_vector(ld, TN("indexer_compressor_norm.weight"), true, id))) return false;
    }
#undef TN
    return true;
}

/* Layer il's FFN: router, hash table (the lead layers, each entry checked) or selection
 * bias, experts, shared expert. */
static bool dsv4_layer_ffn(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    const model_dsv4 *d = ld->m->dsv4;
    model_layer *ly = &ld->m->layers[il];
    model_dsv4_layer *dl = &d->layers[il];
    const int dim = hp->dim, ne = hp->n_expert, k = hp->n_expert_used;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(ly->ffn_norm = model_vector(ld, TN("ffn_norm.weight"), true, dim))) return false;
    if (!model_matrix(ld, TN("ffn_gate_inp.weight"), dim, ne, &ly->gate_inp)) return false;
    if (il < d->n_hash) {
        const gguf_tensor *t = gguf_find_tensor(ld->m->g, TN("ffn_gate_tid2eid.weight"));
        if (!t) {
            model_fail(ld, GGUF_ERR_MISSING, "missing tensor %s", nm);
            return false;
        }
        if (t->type != QTYPE_I32 || t->n_dims != 2 || t->ne[0] != k || t->ne[1] != hp->n_vocab) {
            model_fail(ld, GGUF_ERR_SHAPE, "tensor %s: expected i32 [%d, %d]", nm, k, hp->n_vocab);
            return false;
        }
        const int32_t *tab = t->data;
        for (int64_t i = 0; i < (int64_t)k * hp->n_vocab; i++)
            if (tab[i] < 0 || tab[i] >= ne) {
                model_fail(ld, GGUF_ERR_FORMAT, "tensor %s: expert %d out of range (%d experts)", nm, (int)tab[i], ne);
                return false;
            }
        dl->tid2eid = tab;
    } else if (!(ly->exp_probs_b = model_vector(ld, TN("exp_probs_b.bias"), true, ne))) {
        return false;
    }
    if (!model_experts(ld, TN("ffn_gate_exps.weight"), dim, dl->ffn, ne, &ly->gate_exps)) return false;
    if (!model_experts(ld, TN("ffn_up_exps.weight"), dim, dl->ffn, ne, &ly->up_exps)) return false;
    if (!model_experts(ld, TN("ffn_down_exps.weight"), dl->ffn, dim, ne, &ly->down_exps)) return false;
    if (hp->n_shared > 0) {
        int64_t sh = (int64_t)dl->ffn * hp->n_shared;
        if (!model_matrix(ld, TN("ffn_gate_shexp.weight"), dim, sh, &ly->gate_shexp)) return false;
        if (!model_matrix(ld, TN("ffn_up_shexp.weight"), dim, sh, &ly->up_shexp)) return false;
        if (!model_matrix(ld, TN("ffn_down_shexp.weight"), sh, dim, &ly->down_shexp)) return false;
    }
#undef TN
    return true;
}

/* An MTP-only file's block (model_dsv4.h): blk.L with L the trunk's layer count, checked to be
 * what llama.cpp's graph_mtp runs, and its view for model_mtp_view. */
static bool dsv4_load_mtp(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    model_dsv4 *d = m->dsv4;
    const int il = hp->n_layers;
    char kb[128];
    if (hp->n_nextn != 1) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s %d: a deepseek4 MTP-only file with more than one MTP block (llama.cpp's "
                   "graph runs one)", dsv4_key(ld, "nextn_predict_layers", kb, sizeof kb), hp->n_nextn);
        return false;
    }
    if (il < d->n_hash) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s %d: the MTP block blk.%d is hash-routed, which llama.cpp's MTP graph "
                   "refuses", dsv4_key(ld, "hash_layer_count", kb, sizeof kb), d->n_hash, il);
        return false;
    }
    if (!dsv4_layer_keys(ld, il)) return false;
    if (d->layers[il].ratio != 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s: the MTP block blk.%d has ratio %d; its attention is the raw window "
                   "only (0)", dsv4_key(ld, "attention.compress_ratios", kb, sizeof kb), il, d->layers[il].ratio);
        return false;
    }
    if (!dsv4_layer_attn(ld, il) || !dsv4_layer_ffn(ld, il) || !model_load_nextn(ld)) return false;
    d->mtp_only = true;
    return true;
}

bool model_dsv4_load(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    model_dsv4 *d = xcalloc(1, sizeof *d);
    m->dsv4 = d;
    if (!dsv4_read_hparams(ld)) return false;
    d->layers = xcalloc((size_t)(hp->n_layers + hp->n_nextn), sizeof *d->layers);
    if (hp->n_nextn > 0 && !gguf_find_tensor(m->g, "blk.0.attn_norm.weight")) {
        if (!dsv4_load_mtp(ld)) return false;
    } else {
        for (int il = 0; il < hp->n_layers; il++)
            if (!dsv4_layer_keys(ld, il) || !dsv4_layer_attn(ld, il) || !dsv4_layer_ffn(ld, il)) return false;
        hp->n_nextn = 0;   /* MTP layers inside a trunk file are not read (the file comment) */
    }
    hp->expert_ffn = d->max_ffn;
    const int hc = d->hc;
    if (!model_matrix(ld, "output_hc_fn.weight", (int64_t)hc * hp->dim, hc, &d->out_hc_fn)) return false;
    if (!(d->out_hc_base = model_vector(ld, "output_hc_base.weight", true, hc))) return false;
    if (!(d->out_hc_scale = model_vector(ld, "output_hc_scale.weight", true, 1))) return false;
    if (d->mtp_only) {   /* the view model_mtp_view gives an engine: its block as layer 0 */
        d->mtp = xmalloc(sizeof *d->mtp);
        *d->mtp = *d;
        d->mtp->layers = d->layers + hp->n_layers;
        d->mtp->n_hash = 0;
        d->mtp->mtp = NULL;
    }
    return true;
}
