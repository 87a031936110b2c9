/*
 * model: hyper-parameters and weight views of llama / qwen2 / qwen3 / qwen3moe / deepseek2 /
 * gpt-oss / phi3 (model_phi3.c) / mistral3 (model_mistral3.c) / gemma3 (model_gemma3.c) / gemma4 (model_gemma4.c) / mistral4 (deepseek2's) / glm4moe (model_glm4moe.c) / bert (model_bert.c) GGUF files. See model.h
 * for the design; this file is the loading and validation, one tensor at a time, each error
 * naming what is wrong.
 */
#include "model/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

#include "model/model_dflash.h"
#include "model/model_dsv4.h"
#include "model/model_int.h"
#include "model/modelhash.h"
#include "util/bytebuf.h"
#include "util/sha256.h"
#include "util/util.h"


gguf_status model_fail(model_ld *ld, gguf_status st, const char *fmt, ...)
{
    if (ld->st == GGUF_OK) {
        ld->st = st;
        if (ld->errsz > 0) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ld->err, ld->errsz, fmt, ap);
            va_end(ap);
        }
    }
    return st;
}

bool model_key_int(model_ld *ld, const char *key, bool required, int64_t def, int64_t *out)
{
    int64_t v;
    if (gguf_get_int(ld->m->g, key, &v)) {
        *out = v;
        return true;
    }
    if (gguf_find_key(ld->m->g, key) >= 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "key %s has the wrong type (expected an integer)", key);
        return false;
    }
    if (required) {
        model_fail(ld, GGUF_ERR_MISSING, "missing key %s", key);
        return false;
    }
    *out = def;
    return true;
}

bool model_key_float(model_ld *ld, const char *key, double def, double *out)
{
    double v;
    if (gguf_get_float(ld->m->g, key, &v)) {
        *out = v;
        return true;
    }
    if (gguf_find_key(ld->m->g, key) >= 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "key %s has the wrong type (expected a float)", key);
        return false;
    }
    *out = def;
    return true;
}

/* Finds tensor NAME, checks it is 1-D or 2-D with the given (cols, rows) (rows = 1 and
 * n_dims = 1 for a vector). Returns NULL and records the error when absent (if required) or
 * wrong. */
const gguf_tensor *model_tensor(model_ld *ld, const char *name, bool required,
                                int n_dims, int64_t cols, int64_t rows)
{
    const gguf_tensor *t = gguf_find_tensor(ld->m->g, name);
    if (!t) {
        if (required) model_fail(ld, GGUF_ERR_MISSING, "missing tensor %s", name);
        return NULL;
    }
    int64_t nel_hi = t->ne[2] * t->ne[3];
    bool ok = nel_hi == 1 && t->ne[0] == cols && t->ne[1] == rows && t->n_dims <= 2 &&
              (n_dims == 2 || t->n_dims == 1 || t->ne[1] == 1);
    if (!ok) {
        model_fail(ld, GGUF_ERR_SHAPE,
                   "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                   (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                   (long long)t->ne[3], (long long)cols, (long long)rows);
        return NULL;
    }
    if (!quant_weight_type(t->type)) {
        model_fail(ld, GGUF_ERR_TYPE, "tensor %s has unsupported type %d", name, (int)t->type);
        return NULL;
    }
    return t;
}

bool model_matrix(model_ld *ld, const char *name, int64_t cols, int64_t rows, ops_weight *w)
{
    const gguf_tensor *t = model_tensor(ld, name, true, 2, cols, rows);
    if (!t) return false;
    if (t->type == QTYPE_Q8_K || t->type == QTYPE_Q8_1) {
        model_fail(ld, GGUF_ERR_TYPE, "tensor %s: type %s is not a weight type", name, quant_type_name(t->type));
        return false;
    }
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    return true;
}

/* A stacked expert tensor: 3-D [cols, rows, n_expert] as llama.cpp writes `*_exps`, viewed as
 * one matrix of n_expert * rows rows (model_expert slices it). */
bool model_experts(model_ld *ld, const char *name, int64_t cols, int64_t rows, int n_expert, ops_weight *w)
{
    const gguf_tensor *t = gguf_find_tensor(ld->m->g, name);
    if (!t) {
        model_fail(ld, GGUF_ERR_MISSING, "missing tensor %s", name);
        return false;
    }
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_expert || t->ne[3] != 1) {
        model_fail(ld, GGUF_ERR_SHAPE, "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %d]",
                   name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                   (long long)cols, (long long)rows, n_expert);
        return false;
    }
    if (!quant_weight_type(t->type)) {
        model_fail(ld, GGUF_ERR_TYPE, "tensor %s has unsupported type %d", name, (int)t->type);
        return false;
    }
    *w = (ops_weight){ t->type, rows * n_expert, cols, t->data };
    return true;
}

/* A 1-D tensor of n elements (rows == 1), or a 2-D one of (rows, n), converted to an owned
 * f32 array. Returns NULL if absent (error recorded only if required) or wrong. */
const float *model_floats(model_ld *ld, const char *name, bool required, int64_t n, int64_t rows)
{
    const gguf_tensor *t = model_tensor(ld, name, required, rows > 1 ? 2 : 1, n, rows);
    if (!t) return NULL;
    if (n % quant_block_elems(t->type) != 0) {
        model_fail(ld, GGUF_ERR_SHAPE, "tensor %s: %lld elements is not a whole number of blocks",
                   name, (long long)n);
        return NULL;
    }
    float *v = malloc((size_t)n * (size_t)rows * sizeof(float));
    if (!v) {
        model_fail(ld, GGUF_ERR_NOMEM, "out of memory for tensor %s", name);
        return NULL;
    }
    size_t rb = quant_row_bytes(t->type, n);
    for (int64_t r = 0; r < rows; r++)
        quant_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, v + (size_t)r * (size_t)n, n);
    model *m = ld->m;
    m->owned = xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(float *));
    m->owned[m->n_owned++] = v;
    return v;
}

const float *model_vector(model_ld *ld, const char *name, bool required, int64_t n)
{
    return model_floats(ld, name, required, n, 1);
}

/* Layer il's multi-head latent attention tensors (deepseek2). */
static bool model_load_mla(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    const int64_t H = hp->n_heads, kq = hp->nope_dim + hp->n_rot;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (hp->q_lora > 0) {
        if (!model_matrix(ld, TN("attn_q_a.weight"), hp->dim, hp->q_lora, &L->wq_a)) return false;
        if (!(L->q_a_norm = model_vector(ld, TN("attn_q_a_norm.weight"), true, hp->q_lora))) return false;
        if (!model_matrix(ld, TN("attn_q_b.weight"), hp->q_lora, H * kq, &L->wq_b)) return false;
    } else if (!model_matrix(ld, TN("attn_q.weight"), hp->dim, H * kq, &L->wq)) {
        return false;
    }
    if (!model_matrix(ld, TN("attn_kv_a_mqa.weight"), hp->dim, hp->kv_lora + hp->n_rot, &L->wkv_a)) return false;
    if (!(L->kv_a_norm = model_vector(ld, TN("attn_kv_a_norm.weight"), true, hp->kv_lora))) return false;
    if (!model_experts(ld, TN("attn_k_b.weight"), hp->nope_dim, hp->kv_lora, hp->n_heads, &L->wk_b)) return false;
    if (!model_experts(ld, TN("attn_v_b.weight"), hp->kv_lora, hp->v_dim, hp->n_heads, &L->wv_b)) return false;
    if (!model_matrix(ld, TN("attn_output.weight"), H * hp->v_dim, hp->dim, &L->wo)) return false;
#undef TN
    return true;
}

/* The MTP tensors of the layers after the model's (model.h): m->mtp. */
bool model_load_nextn(model_ld *ld)
{
    model *m = ld->m;
    const model_hparams *hp = &m->hp;
    m->mtp = m->layers + hp->n_layers;
    for (int i = 0; i < hp->n_nextn; i++) {
        model_layer *L = &m->mtp[i];
        char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.nextn.%s", hp->n_layers + i, suffix), nm)
        if (!model_matrix(ld, TN("eh_proj.weight"), 2 * (int64_t)hp->dim, hp->dim, &L->eh_proj)) return false;
        if (!(L->enorm = model_vector(ld, TN("enorm.weight"), true, hp->dim))) return false;
        if (!(L->hnorm = model_vector(ld, TN("hnorm.weight"), true, hp->dim))) return false;
        L->head_norm = model_vector(ld, TN("shared_head_norm.weight"), false, hp->dim);
        if (ld->st != GGUF_OK) return false;
        if (gguf_find_tensor(m->g, TN("embed_tokens.weight")) &&
            !model_matrix(ld, nm, hp->dim, hp->n_vocab, &L->embed))
            return false;
        if (gguf_find_tensor(m->g, TN("shared_head_head.weight")) &&
            !model_matrix(ld, nm, hp->dim, hp->n_vocab, &L->head))
            return false;
#undef TN
    }
    return true;
}

void model_mtp_view(const model *m, int i, model *out)
{
    const model_layer *L = &m->mtp[i];
    *out = *m;
    out->hp.n_layers = 1;
    out->hp.n_nextn = 0;
    out->hp.n_dense_lead = L->gate_inp.data ? 0 : 1;
    out->layers = &m->mtp[i];
    out->mtp = NULL;
    out->mtp_view = true;
    out->trunk_norm = m->output_norm;
    if (m->dsv4) out->dsv4 = m->dsv4->mtp;   /* V4: its block's own parameters (model_dsv4.h) */
    if (L->embed.data) out->tok_embd = L->embed;
    if (L->head_norm) out->output_norm = L->head_norm;
    if (L->head.data) {
        out->output = L->head;
        out->tied_output = false;
    }
    out->owned = NULL;
    out->n_owned = 0;
    out->repacked = NULL;
    out->repacked_bytes = 0;
    out->fingerprint[0] ^= 0x80;   /* its KV is another model's */
    out->fingerprint[31] ^= (uint8_t)(i + 1);
    util_hex(out->fingerprint, 32, out->fingerprint_hex);
}

float *model_own(model *m, size_t n)
{
    float *v = xcalloc(n, sizeof(float));
    m->owned = xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(float *));
    m->owned[m->n_owned++] = v;
    return v;
}

/* Builds "ARCH.SUFFIX" in the caller's key[128]: every hyper-parameter key is its family's. */
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", an, suffix), key)

/* The sizes every family has: width, layers (less the MTP ones), heads. */
static bool model_read_counts(model_ld *ld, const char *an)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    int64_t v;
    if (!model_key_int(ld, KEY("embedding_length"), true, 0, &v)) return false;
    hp->dim = (int)v;
    if (!model_key_int(ld, KEY("block_count"), true, 0, &v)) return false;
    hp->n_layers = (int)v;
    /* MTP layers are counted in block_count and stored after the model's */
    if (!model_key_int(ld, KEY("nextn_predict_layers"), false, 0, &v)) return false;
    if (v < 0 || v > 16 || v >= hp->n_layers) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad %s %lld (block_count %d)", key, (long long)v, hp->n_layers);
        return false;
    }
    hp->n_nextn = (int)v;
    hp->n_layers -= hp->n_nextn;
    if (!model_key_int(ld, KEY("attention.head_count"), true, 0, &v)) return false;
    hp->n_heads = (int)v;
    /* a per-layer array (gemma4): its largest here, each layer's for the family to read */
    gguf_vtype elt;
    uint64_t na;
    const void *arr;
    if (gguf_get_arr(ld->m->g, KEY("attention.head_count_kv"), &elt, &na, &arr) &&
        (elt == GGUF_VT_UINT32 || elt == GGUF_VT_INT32)) {
        v = 0;
        for (uint64_t i = 0; i < na; i++) v = TM_MAX(v, (int64_t)((const int32_t *)arr)[i]);
    } else if (!model_key_int(ld, KEY("attention.head_count_kv"), false, hp->n_heads, &v)) {
        return false;
    }
    hp->n_kv_heads = (int)v;
    return true;
}

/* The routed experts of a MoE family: how many, how many per token, their FFN width. */
static bool model_read_experts(model_ld *ld, const char *an)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    int64_t v;
    if (!model_key_int(ld, KEY("expert_count"), true, 0, &v)) return false;
    hp->n_expert = (int)v;
    if (!model_key_int(ld, KEY("expert_used_count"), true, 0, &v)) return false;
    hp->n_expert_used = (int)v;
    if (!model_key_int(ld, KEY("expert_feed_forward_length"), true, 0, &v)) return false;
    hp->expert_ffn = (int)v;
    if (hp->n_expert <= 0 || hp->n_expert > MODEL_MAX_EXPERTS || hp->n_expert_used <= 0 ||
        hp->n_expert_used > hp->n_expert || hp->expert_ffn <= 0 || hp->expert_ffn > (1 << 22)) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad expert hyper-parameters: %d experts (at most %d), %d used, expert ffn %d",
                   hp->n_expert, MODEL_MAX_EXPERTS, hp->n_expert_used, hp->expert_ffn);
        return false;
    }
    return true;
}

/* gpt-oss as llama.cpp runs it: the window and its layer pattern (default 2: even layers
 * windowed), the router's softmax over the chosen logits, SwiGLU clamped at 7. */
static bool model_read_gptoss(model_ld *ld, const char *an)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    int64_t v;
    hp->router_logit_topk = true;
    hp->swiglu_limit = 7.0f;
    if (!model_key_int(ld, KEY("attention.sliding_window"), true, 0, &v)) return false;
    hp->n_swa = (int)TM_MAX(TM_MIN(v, (int64_t)INT32_MAX), (int64_t)-1);
    if (!model_key_int(ld, KEY("attention.sliding_window_pattern"), false, 2, &v)) return false;
    hp->swa_pattern = (int)TM_MAX(TM_MIN(v, (int64_t)INT32_MAX), (int64_t)-1);
    double fb, fbs;
    if (!model_key_float(ld, KEY("rope.freq_base"), 10000.0, &fb)) return false;
    if (!model_key_float(ld, KEY("rope.freq_base_swa"), fb, &fbs)) return false;
    if (hp->n_swa <= 0 || hp->n_swa > (1 << 24) || hp->swa_pattern < 0 || hp->swa_pattern > 4096 || fbs != fb) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad gpt-oss hyper-parameters: sliding_window %d (1..%d), "
                   "sliding_window_pattern %d (0..4096), rope.freq_base_swa %g (only the rope.freq_base %g)",
                   hp->n_swa, 1 << 24, hp->swa_pattern, fbs, fb);
        return false;
    }
    return true;
}

/* The DeepSeek-style router's keys that deepseek2 and glm4moe share: the leading dense layers,
 * the shared experts (required or 0), the gating function (gating_default when absent: 1
 * softmax, 2 sigmoid), the weights' normalisation and scale. */
bool model_read_router(model_ld *ld, const char *an, bool shared_required, int64_t gating_default)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    int64_t v;
    double f;
    bool b;
    if (!model_key_int(ld, KEY("leading_dense_block_count"), false, 0, &v)) return false;
    hp->n_dense_lead = (int)v;
    if (!model_key_int(ld, KEY("expert_shared_count"), shared_required, 0, &v)) return false;
    hp->n_shared = (int)v;
    if (!model_key_int(ld, KEY("expert_gating_func"), false, gating_default, &v)) return false;
    if (v != 1 && v != 2) {
        model_fail(ld, GGUF_ERR_FORMAT, "unsupported %s %lld (1 softmax, 2 sigmoid)", key, (long long)v);
        return false;
    }
    hp->router_sigmoid = v == 2;
    hp->router_norm = gguf_get_bool(ld->m->g, KEY("expert_weights_norm"), &b) && b;
    if (!model_key_float(ld, KEY("expert_weights_scale"), 0.0, &f)) return false;
    hp->router_scale = (float)f;
    return true;
}

/* deepseek2: multi-head latent attention's ranks and head parts, the leading dense layers,
 * the shared experts and the router (softmax or sigmoid, groups, scale). */
static bool model_read_mla(model_ld *ld, const char *an)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    int64_t v;
    double f;
    if (!model_read_router(ld, an, false, 1)) return false;
    if (!model_key_int(ld, KEY("expert_group_count"), false, 0, &v)) return false;
    hp->n_groups = (int)v;
    if (!model_key_int(ld, KEY("expert_group_used_count"), false, 0, &v)) return false;
    hp->n_groups_used = (int)v;
    if (!model_key_int(ld, KEY("attention.q_lora_rank"), false, 0, &v)) return false;
    hp->q_lora = (int)v;
    if (!model_key_int(ld, KEY("attention.kv_lora_rank"), true, 0, &v)) return false;
    hp->kv_lora = (int)v;
    int64_t kmla, vmla;
    if (!model_key_int(ld, KEY("attention.key_length_mla"), true, 0, &kmla)) return false;
    if (!model_key_int(ld, KEY("attention.value_length_mla"), true, 0, &vmla)) return false;
    hp->v_dim = (int)vmla;
    hp->nope_dim = (int)kmla;   /* minus n_rot in model_read_rope */
    if (hp->n_dense_lead < 0 || hp->n_dense_lead > hp->n_layers || hp->n_shared < 0 || hp->n_shared > 64 ||
        hp->q_lora < 0 || hp->q_lora > (1 << 16) || hp->kv_lora <= 0 || hp->kv_lora > (1 << 16) || vmla <= 0 ||
        vmla > 4096 || kmla <= 0 || kmla > 4096 ||
        (hp->n_groups > 1 && (hp->n_expert % hp->n_groups || hp->n_groups_used < 1 || hp->n_groups_used > hp->n_groups))) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad %s hyper-parameters: dense layers %d, shared %d, q_lora %d, "
                   "kv_lora %d, key/value_length_mla %lld/%lld, groups %d/%d", an, hp->n_dense_lead, hp->n_shared,
                   hp->q_lora, hp->kv_lora, (long long)kmla, (long long)vmla, hp->n_groups, hp->n_groups_used);
        return false;
    }
    /* llama.cpp's deepseek2 graph scales the queries by Llama 4's temperature when a file has
     * it (Mistral Large 3); the MLA stage here does not, so such a file is refused, not run wrong */
    if (!model_key_float(ld, KEY("attention.temperature_scale"), 0.0, &f)) return false;
    if (f != 0.0) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s %g: the attention temperature is not supported with latent attention", key, f);
        return false;
    }
    return true;
}

/* The training context, the pooling, and the shapes checked together; then the head size. */
static bool model_read_shapes(model_ld *ld, const char *an)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    int64_t v;
    if (!model_key_int(ld, KEY("context_length"), false, 2048, &v)) return false;
    hp->n_ctx_train = (int)v;
    /* llama.cpp's enum llama_pooling_type; a model without the key pools nothing there */
    if (!model_key_int(ld, KEY("pooling_type"), false, MODEL_POOL_NONE, &v)) return false;
    if (v < MODEL_POOL_NONE || v > MODEL_POOL_RANK) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad pooling_type %lld", (long long)v);
        return false;
    }
    hp->pooling = (model_pool)v;
    if (hp->dim <= 0 || hp->n_layers <= 0 || hp->n_heads <= 0 || hp->n_kv_heads <= 0 ||
        hp->ffn_dim <= 0 || hp->n_ctx_train <= 0 || hp->dim > (1 << 20) || hp->n_layers > 4096 ||
        hp->n_heads > 4096 || hp->ffn_dim > (1 << 22)) {
        model_fail(ld, GGUF_ERR_FORMAT,
                   "bad hyper-parameters: dim %d, layers %d, heads %d, kv heads %d, ffn %d, ctx %d",
                   hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim, hp->n_ctx_train);
        return false;
    }
    if (hp->n_heads % hp->n_kv_heads != 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "head count %d is not a multiple of the kv head count %d",
                   hp->n_heads, hp->n_kv_heads);
        return false;
    }
    int64_t def_hd = hp->dim / hp->n_heads;
    if (!model_key_int(ld, KEY("attention.key_length"), false, def_hd, &v)) return false;
    hp->head_dim = (int)v;
    int64_t vlen;
    if (!model_key_int(ld, KEY("attention.value_length"), false, hp->head_dim, &vlen)) return false;
    /* MLA: the value is the latent, the key the latent plus the RoPE part */
    bool vlen_ok = hp->mla ? vlen == hp->kv_lora && hp->n_kv_heads == 1 : vlen == hp->head_dim;
    if (hp->head_dim <= 0 || hp->head_dim > 1024 || hp->head_dim % 2 != 0 || !vlen_ok) {
        model_fail(ld, GGUF_ERR_FORMAT, "unsupported head size: key_length %d, value_length %lld",
                   hp->head_dim, (long long)vlen);
        return false;
    }
    return true;
}

/* What the RoPE scaling keys said, for the frequencies (model_rope_freqs). */
typedef struct {
    double factor;          /* rope.scaling.factor (or scale_linear); 0: none given */
    bool llama3;            /* Llama 3's per-frequency factors from its keys */
    float yarn_log_mul;     /* YaRN's log multiplier (deepseek2's undone 0.1 x); 0: none */
} model_rope_scaling;

void model_yarn_corr_dims(int n_rot, float orig_ctx, float base, float dims[2])
{
    float n_dims = (float)n_rot;
    float start = floorf(n_dims * logf(orig_ctx / (32.0f * 2 * (float)M_PI)) / (2 * logf(base)));
    float end = ceilf(n_dims * logf(orig_ctx / (1.0f * 2 * (float)M_PI)) / (2 * logf(base)));
    dims[0] = start > 0 ? start : 0;
    dims[1] = end < n_dims - 1 ? end : n_dims - 1;
}

/* YaRN as llama.cpp sets it up (llama_context's yarn_attn_factor, ggml's corr dims, beta
 * fast 32 and slow 1), with deepseek2's log multiplier (its converter writes 0.1 x it). */
static bool model_read_yarn(model_ld *ld, const char *an, double factor, model_rope_scaling *rs)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    hp->rope_freq_scale = 1.0f / (float)factor;
    double orig_ctx, lm, af;
    if (!model_key_float(ld, KEY("rope.scaling.original_context_length"), hp->n_ctx_train, &orig_ctx)) return false;
    if (!model_key_float(ld, KEY("rope.scaling.yarn_log_multiplier"), 0.0, &lm)) return false;
    if (!model_key_float(ld, KEY("rope.scaling.attn_factor"), 1.0, &af)) return false;
    float yarn_log_mul = (float)lm;
    if (hp->mla && yarn_log_mul != 0.0f) yarn_log_mul /= 0.1f;
    rs->yarn_log_mul = yarn_log_mul;
    const float fac = 1.0f / hp->rope_freq_scale;
#define MODEL_YARN_MSCALE(sc, ms) ((sc) <= 1.0f ? 1.0f : (0.1f * (ms) * logf(sc) + 1.0f))
    float attn;
    if (yarn_log_mul != 0.0f) {
        float ms = hp->mla && yarn_log_mul != 1.0f ? yarn_log_mul : 1.0f;
        attn = MODEL_YARN_MSCALE(fac, ms) / MODEL_YARN_MSCALE(fac, yarn_log_mul);
    } else {
        attn = MODEL_YARN_MSCALE(fac, 1.0f);
    }
#undef MODEL_YARN_MSCALE
    attn *= 1.0f / (1.0f + 0.1f * logf(fac));
    hp->rope_attn_factor = attn * (float)af;
    hp->rope_yarn[0] = 1.0f;
    model_yarn_corr_dims(hp->n_rot, (float)orig_ctx, hp->rope_base, hp->rope_yarn + 1);
    return true;
}

/* RoPE: base, rotated dimensions, and the scaling (linear, llama3, YaRN or none). */
static bool model_read_rope(model_ld *ld, const char *an, model_rope_scaling *rs)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    int64_t v;
    double f;
    if (!model_key_float(ld, KEY("rope.freq_base"), 10000.0, &f)) return false;
    hp->rope_base = (float)f;
    if (!model_key_int(ld, KEY("rope.dimension_count"), false, hp->head_dim, &v)) return false;
    hp->n_rot = (int)v;
    if (hp->mla) {
        hp->nope_dim -= hp->n_rot;
        if (hp->nope_dim <= 0 || hp->head_dim != hp->kv_lora + hp->n_rot) {
            model_fail(ld, GGUF_ERR_FORMAT, "MLA key_length %d is not kv_lora_rank %d + rope dims %d, or no no-RoPE part",
                       hp->head_dim, hp->kv_lora, hp->n_rot);
            return false;
        }
    }
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad rope.dimension_count %d (head size %d)", hp->n_rot,
                   hp->head_dim);
        return false;
    }
    hp->rope_freq_scale = 1.0f;
    const char *stype = NULL;
    size_t stype_len = 0;
    bool has_type = gguf_get_str(ld->m->g, KEY("rope.scaling.type"), &stype, &stype_len);
    double factor = 0;
    if (!model_key_float(ld, KEY("rope.scaling.factor"), 0.0, &factor)) return false;
    if (factor == 0 && !model_key_float(ld, KEY("rope.scale_linear"), 0.0, &factor)) return false;
    bool is_linear = has_type ? (stype_len == 6 && !memcmp(stype, "linear", 6)) : factor != 0;
    bool is_llama3 = has_type && stype_len == 6 && !memcmp(stype, "llama3", 6);
    bool is_none = has_type && stype_len == 4 && !memcmp(stype, "none", 4);
    bool is_yarn = has_type && stype_len == 4 && !memcmp(stype, "yarn", 4);
    if (has_type && !is_linear && !is_llama3 && !is_none && !is_yarn) {
        model_fail(ld, GGUF_ERR_FORMAT, "unsupported rope scaling type '%.*s'", (int)stype_len, stype);
        return false;
    }
    if (is_linear && factor != 0) hp->rope_freq_scale = (float)(1.0 / factor);
    rs->factor = factor;
    rs->llama3 = is_llama3;
    rs->yarn_log_mul = 0.0f;
    hp->rope_attn_factor = 1.0f;
    return !(is_yarn && factor != 0) || model_read_yarn(ld, an, factor, rs);
}

/* The inverse frequencies, with per-pair factors from rope_freqs.weight or the llama3 keys,
 * and the attention scale (llama.cpp's kq_scale; MLA's with YaRN's mscale folded in, as
 * deepseek2's graph does). */
static bool model_rope_freqs(model_ld *ld, const char *an, const model_rope_scaling *rs)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    double factor = rs->factor;
    float *inv = model_own(ld->m, (size_t)hp->n_rot / 2);
    const float *ff = model_vector(ld, "rope_freqs.weight", false, hp->n_rot / 2);
    if (ld->st != GGUF_OK) return false;
    double lo = 1, hi = 4, orig = 8192;
    float *factors = NULL;
    if (rs->llama3 && !ff) {
        factors = model_own(ld->m, (size_t)hp->n_rot / 2);
        if (!model_key_float(ld, KEY("rope.scaling.low_freq_factor"), 1.0, &lo)) return false;
        if (!model_key_float(ld, KEY("rope.scaling.high_freq_factor"), 4.0, &hi)) return false;
        if (!model_key_float(ld, KEY("rope.scaling.original_context_length"), 8192.0, &orig)) return false;
        if (factor == 0) factor = 8.0;
    }
    for (int i = 0; i < hp->n_rot / 2; i++) {
        double freq = pow((double)hp->rope_base, -2.0 * i / hp->n_rot);
        double fac = 1.0;
        if (ff) {
            fac = ff[i];
        } else if (rs->llama3) {
            double wavelen = 2 * M_PI / freq;
            double lo_wl = orig / lo, hi_wl = orig / hi;
            if (wavelen < hi_wl) fac = 1;
            else if (wavelen > lo_wl) fac = factor;
            else {
                double smooth = (orig / wavelen - lo) / (hi - lo);
                fac = 1 / ((1 - smooth) / factor + smooth);
            }
        }
        inv[i] = (float)(freq * hp->rope_freq_scale / fac);
        if (factors) factors[i] = (float)fac;
    }
    hp->rope_inv_freq = inv;
    hp->rope_freq_factors = ff ? ff : factors;
    hp->rope_theta_scale = powf(hp->rope_base, -2.0f / (float)hp->n_rot);
    hp->att_scale = 1.0f / sqrtf((float)(hp->mla ? hp->nope_dim + hp->n_rot : hp->head_dim));
    if (hp->mla && hp->rope_yarn[0] != 0.0f) {
        float org = hp->rope_attn_factor * (1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale));
        float ms = org * (1.0f + 0.1f * rs->yarn_log_mul * logf(1.0f / hp->rope_freq_scale));
        hp->att_scale = 1.0f * ms * ms / sqrtf((float)(hp->nope_dim + hp->n_rot));
    }
    return true;
}

/* One architecture tokenmill runs: its general.architecture name and what the shared readers
 * do for it. A new family is a row here, its hooks in its own file (model_int.h); a hook left
 * NULL is the shared reader's part. */
typedef struct {
    const char *name;                           /* general.architecture */
    model_arch arch;
    bool rope_neox;                             /* RoPE on halves (NEOX), not adjacent pairs */
    bool moe;                                   /* routed experts: reads the expert keys */
    bool (*keys)(model_ld *ld, const char *an); /* its keys the shared shape checks need */
    bool (*hparams)(model_ld *ld);              /* its keys after the shared ones */
    bool (*layer)(model_ld *ld, int il);        /* every tensor of layer il */
    bool (*layers)(model_ld *ld);               /* every layer at once, with its own state */
    bool (*all)(model_ld *ld);                  /* every tensor, embeddings included, and no output
                                                 * head (the encoders) */
} model_arch_desc;

/* In the order the error messages list them. */
static const model_arch_desc model_archs[] = {
    { .name = "llama", .arch = MODEL_ARCH_LLAMA },
    { .name = "qwen2", .arch = MODEL_ARCH_QWEN2, .rope_neox = true },
    { .name = "qwen3", .arch = MODEL_ARCH_QWEN3, .rope_neox = true },
    { .name = "qwen3moe", .arch = MODEL_ARCH_QWEN3MOE, .rope_neox = true, .moe = true },
    { .name = "deepseek2", .arch = MODEL_ARCH_DEEPSEEK2, .moe = true, .keys = model_read_mla },
    { .name = "gpt-oss", .arch = MODEL_ARCH_GPTOSS, .rope_neox = true, .moe = true, .keys = model_read_gptoss },
    { .name = "phi3", .arch = MODEL_ARCH_PHI3, .rope_neox = true, .hparams = model_phi3_hparams,
      .layer = model_phi3_layer },
    { .name = "mistral3", .arch = MODEL_ARCH_MISTRAL3, .hparams = model_mistral3_hparams },
    { .name = "gemma3", .arch = MODEL_ARCH_GEMMA3, .rope_neox = true, .hparams = model_gemma3_hparams,
      .layer = model_gemma3_layer },
    { .name = "gemma4", .arch = MODEL_ARCH_GEMMA4, .rope_neox = true, .hparams = model_gemma4_hparams,
      .layer = model_gemma4_layer },
    { .name = "qwen35", .arch = MODEL_ARCH_QWEN35, .rope_neox = true, .hparams = model_qwen35_hparams,
      .layer = model_qwen35_layer },
    { .name = "qwen35moe", .arch = MODEL_ARCH_QWEN35MOE, .rope_neox = true, .moe = true,
      .hparams = model_qwen35_hparams, .layer = model_qwen35_layer },
    { .name = "deepseek4", .arch = MODEL_ARCH_DEEPSEEK4, .layers = model_dsv4_load },
    { .name = "bert", .arch = MODEL_ARCH_BERT, .all = model_bert_load },
    { .name = "nomic-bert", .arch = MODEL_ARCH_NOMIC_BERT, .rope_neox = true, .all = model_bert_load },
    { .name = "dflash", .arch = MODEL_ARCH_DFLASH, .rope_neox = true, .all = model_dflash_load },
    { .name = "glm4moe", .arch = MODEL_ARCH_GLM4MOE, .rope_neox = true, .moe = true, .keys = model_glm4moe_keys,
      .layer = model_glm4moe_layer },
    { .name = "mistral4", .arch = MODEL_ARCH_MISTRAL4, .moe = true, .keys = model_read_mla },
};
/* Families llama.cpp runs whose layers the engine lacks: refused as "not supported yet". */
static const char *const model_archs_later[] = { "nomic-bert-moe" };

/* The row for general.architecture, or NULL with the error set. */
static const model_arch_desc *model_arch_find(model_ld *ld, const char *path, const char *an, size_t an_len)
{
    for (size_t i = 0; i < TM_ARRAY_LEN(model_archs); i++)
        if (strlen(model_archs[i].name) == an_len && !memcmp(an, model_archs[i].name, an_len)) return &model_archs[i];
    char names[256] = "";
    for (size_t i = 0; i < TM_ARRAY_LEN(model_archs); i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", model_archs[i].name);
    for (size_t i = 0; i < TM_ARRAY_LEN(model_archs_later); i++)
        if (strlen(model_archs_later[i]) == an_len && !memcmp(an, model_archs_later[i], an_len)) {
            model_fail(ld, GGUF_ERR_TYPE, "%s: the '%.*s' architecture is not supported yet (its layers are not in the "
                       "engine; supported: %s)", path, (int)an_len, an, names);
            return NULL;
        }
    model_fail(ld, GGUF_ERR_TYPE, "%s: unsupported architecture '%.*s' (supported: %s)", path, (int)TM_MIN(an_len, 64),
               an, names);
    return NULL;
}

/* Reads the hyper-parameters of architecture ad: the shared keys, the family's own that they
 * need (ad->keys), RoPE. The family's later keys (ad->hparams) are model_load's to call. */
static bool model_read_hparams(model_ld *ld, const model_arch_desc *ad)
{
    model_hparams *hp = &ld->m->hp;
    const char *an = ad->name;
    char key[128];
    int64_t v;
    double f;
    if (!model_read_counts(ld, an)) return false;
    hp->mla = hp->arch == MODEL_ARCH_DEEPSEEK2 || hp->arch == MODEL_ARCH_MISTRAL4;   /* mistral4: deepseek2's layer */
    if (ad->moe && !model_read_experts(ld, an)) return false;
    /* a MoE model's dense FFN size is informational only, unless it has dense layers */
    gguf_vtype elt;
    uint64_t na;
    const void *arr;
    if (hp->arch == MODEL_ARCH_GEMMA4 && gguf_get_arr(ld->m->g, KEY("feed_forward_length"), &elt, &na, &arr) &&
        (elt == GGUF_VT_UINT32 || elt == GGUF_VT_INT32)) {
        /* per layer (gemma4's double-wide MLP): the widest sizes the buffers, model_gemma4.c
         * reads each layer's */
        v = 0;
        for (uint64_t i = 0; i < na; i++) v = TM_MAX(v, (int64_t)((const int32_t *)arr)[i]);
    } else if (!model_key_int(ld, KEY("feed_forward_length"), !ad->moe, hp->expert_ffn, &v)) {
        return false;
    }
    hp->ffn_dim = (int)v;
    hp->router_norm = hp->arch == MODEL_ARCH_QWEN3MOE || hp->arch == MODEL_ARCH_QWEN35MOE;
    if (ad->keys && !ad->keys(ld, an)) return false;
    if (!model_read_shapes(ld, an)) return false;
    if (!model_key_float(ld, KEY("attention.layer_norm_rms_epsilon"), 1e-5, &f)) return false;
    hp->rms_eps = (float)f;
    model_rope_scaling rs;
    if (!model_read_rope(ld, an, &rs)) return false;
    return model_rope_freqs(ld, an, &rs);
}
#undef KEY

static bool model_fingerprint(model *m, const char *path, const model_opts *opts)
{
    uint8_t file_digest[32] = { 0 };
    bool bytes = !(opts && opts->no_fingerprint_bytes);
    if (bytes) {
        modelhash_info info;
        size_t fsz = gguf_file_size(m->g);
        if (!modelhash_file(path, gguf_file_map(m->g), fsz, gguf_file_stat(m->g), !(opts && opts->no_fingerprint_cache),
                            file_digest, &info))
            return false;
        if (!info.from_cache && fsz >= ((size_t)1 << 30))
            log_info("model: fingerprinted all %.1f GiB of %s in %.1f s (%s)", (double)fsz / (1 << 30), path,
                     info.seconds, info.cached ? "cached for later starts" : "not cached");
    }
    const model_hparams *hp = &m->hp;
    static const char tag[] = "tokenmill-model-fp-v2";
    int32_t ints[] = { hp->n_vocab, hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads,
                       hp->head_dim, hp->ffn_dim, hp->n_rot, hp->rope_neox };
    float fl[] = { hp->rms_eps, hp->rope_base, hp->rope_freq_scale };
    int32_t moe[] = { hp->n_expert, hp->n_expert_used, hp->expert_ffn };
    int32_t swa[] = { hp->n_swa, hp->swa_pattern };
    float gemma[] = { hp->rope_base_swa, hp->embd_scale, hp->logit_softcap, hp->att_scale };
    uint64_t fsz = gguf_file_size(m->g);
    /* every tensor's name, type, shape and offset */
    bytebuf tt = { 0 };
    int nt = gguf_n_tensors(m->g);
    for (int i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(m->g, i);
        int32_t ty = (int32_t)t->type;
        bytebuf_append(&tt, t->name, strlen(t->name) + 1);
        bytebuf_append(&tt, &ty, 4);
        bytebuf_append(&tt, t->ne, sizeof t->ne);
        bytebuf_append(&tt, &t->offset, 8);
    }
    sha256_part parts[] = {
        { tag, sizeof tag },
        { hp->arch_name, strlen(hp->arch_name) + 1 },
        { ints, sizeof ints },
        { fl, sizeof fl },
        { moe, hp->n_expert > 0 ? sizeof moe : 0 },
        { swa, hp->n_swa > 0 ? sizeof swa : 0 },
        { gemma, hp->embd_scale != 0 ? sizeof gemma : 0 },
        { hp->rope_inv_freq, sizeof(float) * (size_t)(hp->n_rot / 2) },
        { &fsz, sizeof fsz },
        { tt.p, tt.len },
        { file_digest, sizeof file_digest },
    };
    sha256_parts(parts, (int)TM_ARRAY_LEN(parts), m->fingerprint);
    bytebuf_free(&tt);
    util_hex(m->fingerprint, 32, m->fingerprint_hex);
    return true;
}

/* The 2-D matrices of a layer that exist (data set), at most MODEL_LAYER_MATS. */
#define MODEL_LAYER_MATS 20
static int model_layer_matrices(model_layer *L, ops_weight **ws)
{
    ops_weight *all[MODEL_LAYER_MATS] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down,
                                          &L->gate_shexp, &L->up_shexp, &L->down_shexp, &L->wq_a, &L->wq_b, &L->wkv_a,
                                          &L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha, &L->ssm_out,
                                          &L->pl_gate, &L->pl_proj };
    int n = 0;
    for (int i = 0; i < MODEL_LAYER_MATS; i++)
        if (all[i]->data) ws[n++] = all[i];
    return n;
}

/* The matrices a decode step multiplies with (output first), n_layers * MODEL_LAYER_MATS + 1
 * of them at most; a MoE layer's router, its experts and MLA's per-head tensors are not among
 * them (model_repack_list adds the stacked ones). */
static int model_matrices(model *m, ops_weight **ws)
{
    int n = 0;
    ws[n++] = &m->output;
    for (int il = 0; il < m->hp.n_layers; il++) n += model_layer_matrices(&m->layers[il], ws + n);
    return n;
}

/* ---- residency ------------------------------------------------------------------------ */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22    /* Linux 5.14; older kernels answer EINVAL: pages are touched */
#endif
#define MODEL_RESIDENT_PIECE (4u << 20)      /* bytes per populate call: a thread's unit */

typedef struct {
    uintptr_t a, e;          /* page-aligned [a, e) */
} model_range;

typedef struct {
    const model_range *r;    /* (n) sorted, disjoint */
    int n;
    size_t total;            /* bytes over all ranges */
    _Atomic int n_touch;     /* threads that fell back to touching pages */
} model_resident_job;

static int model_range_cmp(const void *x, const void *y)
{
    const model_range *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* Thread ith's share: bytes [total * ith / nth, total * (ith + 1) / nth) of the ranges laid
 * end to end, in pieces. */
static void model_resident_thread(void *ctx, int ith, int nth)
{
    model_resident_job *j = ctx;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t b0 = j->total / (size_t)nth * (size_t)ith / page * page;
    size_t b1 = ith == nth - 1 ? j->total : j->total / (size_t)nth * (size_t)(ith + 1) / page * page;
    size_t base = 0;
    bool touched = false;
    for (int i = 0; i < j->n && base < b1; i++) {
        size_t len = j->r[i].e - j->r[i].a;
        size_t s0 = TM_MAX(b0, base), s1 = TM_MIN(b1, base + len);
        for (size_t o = s0; o < s1; o += MODEL_RESIDENT_PIECE) {
            char *p = (char *)(j->r[i].a + (o - base));
            size_t n = TM_MIN((size_t)MODEL_RESIDENT_PIECE, s1 - o);
            if (!touched && madvise(p, n, MADV_POPULATE_READ) == 0) continue;
            touched = true;
            volatile const char *q = p;
            char sum = 0;
            for (size_t k = 0; k < n; k += page) sum ^= q[k];
            (void)sum;
        }
        base += len;
    }
    if (touched) atomic_fetch_add(&j->n_touch, 1);
}

static void model_resident_add(model_range *r, int *n, const model *m, const ops_weight *w, uintptr_t page)
{
    if (!w->data) return;
    uintptr_t a = (uintptr_t)w->data, e = a + quant_row_bytes(w->type, w->cols) * (size_t)w->rows;
    uintptr_t ra = (uintptr_t)m->repacked;
    if (m->repacked && a >= ra && a < ra + m->repacked_bytes) return;   /* owned, resident */
    r[(*n)++] = (model_range){ a & ~(page - 1), TM_ALIGN_UP(e, page) };
}

void model_resident(model *m, threadpool *tp, model_resident_info *info)
{
    double t0 = util_now();
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    model_range *r = xcalloc((size_t)m->hp.n_layers * 19 + 2, sizeof *r);
    int n = 0;
    model_resident_add(r, &n, m, &m->tok_embd, page);
    model_resident_add(r, &n, m, &m->output, page);
    for (int il = 0; il < m->hp.n_layers; il++) {
        const model_layer *L = &m->layers[il];
        const ops_weight *all[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down, &L->gate_inp,
                                    &L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_shexp, &L->up_shexp,
                                    &L->down_shexp, &L->wq_a, &L->wq_b, &L->wkv_a, &L->wk_b, &L->wv_b };
        _Static_assert(sizeof all / sizeof all[0] == 19, "the range array holds 19 per layer");
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) model_resident_add(r, &n, m, all[i], page);
    }
    /* sort and merge: a tied output is the embedding, neighbours share pages */
    qsort(r, (size_t)n, sizeof *r, model_range_cmp);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k > 0 && r[i].a <= r[k - 1].e) r[k - 1].e = TM_MAX(r[k - 1].e, r[i].e);
        else r[k++] = r[i];
    }
    model_resident_job j = { .r = r, .n = k };
    bool huge = k > 0;
    for (int i = 0; i < k; i++) {
        size_t len = r[i].e - r[i].a;
        if (madvise((void *)r[i].a, len, MADV_HUGEPAGE)) huge = false;
        (void)madvise((void *)r[i].a, len, MADV_WILLNEED);
        j.total += len;
    }
    atomic_init(&j.n_touch, 0);
    if (j.total) threadpool_run(tp, model_resident_thread, &j);
    if (info)
        *info = (model_resident_info){ .file_bytes = j.total, .anon_bytes = m->repacked_bytes,
                                       .seconds = util_now() - t0, .populate = atomic_load(&j.n_touch) == 0,
                                       .huge = huge };
    free(r);
}

/* The matrices model_repack considers: model_matrices, then the stacked expert tensors whose
 * experts are each whole 16-row groups (so that model_expert's row offsets, and the engine's
 * 64-row slices of them, start on a group of the repacked layout), and MLA's per-head
 * tensors on the same condition per head (a decode step multiplies every head's slice: in
 * the file layout their many short products streamed at a fraction of the repacked rate),
 * and DeepSeek V4's own matrices (wo_a on the same condition per group). */
#define MODEL_REPACK_STACKED 5   /* stacked tensors per layer model_repack_list may add */
static int model_repack_list(model *m, ops_weight **ws)
{
    int n = model_matrices(m, ws);
    for (int il = 0; il < m->hp.n_layers; il++) {
        model_layer *L = &m->layers[il];
        ops_weight *ex[MODEL_REPACK_STACKED] = { &L->gate_exps, &L->up_exps, &L->down_exps, &L->wk_b, &L->wv_b };
        for (int i = 0; i < MODEL_REPACK_STACKED; i++) {
            int n_slices = i < 3 ? m->hp.n_expert : m->hp.n_heads;
            /* a fused gate/up expert is read as two halves: each must be whole groups */
            if (i == 0 && L->exps_gate_up) n_slices *= 2;
            if (ex[i]->data && n_slices > 0 && ex[i]->rows % n_slices == 0 && ex[i]->rows / n_slices % 16 == 0)
                ws[n++] = ex[i];
        }
        if (m->dsv4) {   /* V4's own (a sliced one when its slices are whole groups) */
            model_dsv4_mat dm[MODEL_DSV4_LAYER_MATS];
            int nd = model_dsv4_layer_matrices(m->dsv4, il, dm);
            for (int i = 0; i < nd; i++)
                if (dm[i].slice_rows % 16 == 0) ws[n++] = dm[i].w;
        }
    }
    return n;
}

/* Repacks every matrix that ops_repack_type wants in another layout (see model.h) into
 * m->repacked, with a temporary pool of one thread per CPU, and drops the file pages of the
 * originals from this process. Returns false when out of memory (nothing changed). */
static bool model_repack(model *m)
{
    ops_weight **ws = xcalloc((size_t)m->hp.n_layers * (MODEL_LAYER_MATS + MODEL_REPACK_STACKED + MODEL_DSV4_LAYER_MATS) + 1,
                              sizeof *ws);
    int n = model_repack_list(m, ws);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        qtype rt = ops_repack_type(ws[i]);
        if (rt != ws[i]->type)
            total += TM_ALIGN_UP(quant_row_bytes(rt, ws[i]->cols) * (size_t)ws[i]->rows, 64);
    }
    if (!total) {
        free(ws);
        return true;
    }
    /* a decode step streams all of it */
    char *buf = util_huge_alloc(total);
    if (!buf) {
        free(ws);
        return false;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    threadpool *tp = threadpool_new(ncpu > 1 ? (int)TM_MIN(ncpu, 64) : 1);
    size_t off = 0, page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        qtype rt = ops_repack_type(ws[i]);
        if (rt == ws[i]->type) continue;
        /* a few MiB of rows at a time, dropping the file pages of each piece once it is
         * repacked, so that the peak stays near the final size */
        const ops_weight src = *ws[i];
        size_t srb = quant_row_bytes(src.type, src.cols), drb = quant_row_bytes(rt, src.cols);
        int64_t step = TM_MAX((int64_t)16, (int64_t)((8u << 20) / srb) / 16 * 16);
        for (int64_t r0 = 0; r0 < src.rows; r0 += step) {
            int64_t nr = TM_MIN(step, src.rows - r0);
            ops_weight piece = {src.type, nr, src.cols, (const char *)src.data + (size_t)r0 * srb};
            ops_repack(tp, &piece, buf + off + (size_t)r0 * drb);
            /* whole pages inside the piece: this process will not read them again (a tied
             * token embedding reads its rows back from the page cache) */
            uintptr_t a = TM_ALIGN_UP((uintptr_t)piece.data, page);
            uintptr_t e = ((uintptr_t)piece.data + srb * (size_t)nr) & ~(uintptr_t)(page - 1);
            if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
        }
        *ws[i] = (ops_weight){rt, src.rows, src.cols, buf + off};
        off += TM_ALIGN_UP(drb * (size_t)src.rows, 64);
    }
    threadpool_free(tp);
    free(ws);
    m->repacked = buf;
    m->repacked_bytes = total;
    return true;
}

/* Layer il's attention after its attn_norm: llama's four projections, with qwen2's biases,
 * qwen3's (and gemma3's) head norms, or gpt-oss' biases, sinks and window. */
bool model_load_attn(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    int q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!model_matrix(ld, TN("attn_q.weight"), hp->dim, q_dim, &L->wq)) return false;
    if (!model_matrix(ld, TN("attn_k.weight"), hp->dim, kv_dim, &L->wk)) return false;
    if (!model_matrix(ld, TN("attn_v.weight"), hp->dim, kv_dim, &L->wv)) return false;
    if (!model_matrix(ld, TN("attn_output.weight"), q_dim, hp->dim, &L->wo)) return false;
    if (hp->arch == MODEL_ARCH_QWEN2) {
        if (!(L->bq = model_vector(ld, TN("attn_q.bias"), true, q_dim))) return false;
        if (!(L->bk = model_vector(ld, TN("attn_k.bias"), true, kv_dim))) return false;
        if (!(L->bv = model_vector(ld, TN("attn_v.bias"), true, kv_dim))) return false;
    }
    if (hp->arch == MODEL_ARCH_QWEN3 || hp->arch == MODEL_ARCH_QWEN3MOE || hp->arch == MODEL_ARCH_GEMMA3) {
        if (!(L->q_norm = model_vector(ld, TN("attn_q_norm.weight"), true, hp->head_dim))) return false;
        if (!(L->k_norm = model_vector(ld, TN("attn_k_norm.weight"), true, hp->head_dim))) return false;
    }
    if (hp->arch == MODEL_ARCH_GPTOSS) {
        if (!(L->bq = model_vector(ld, TN("attn_q.bias"), true, q_dim))) return false;
        if (!(L->bk = model_vector(ld, TN("attn_k.bias"), true, kv_dim))) return false;
        if (!(L->bv = model_vector(ld, TN("attn_v.bias"), true, kv_dim))) return false;
        if (!(L->bo = model_vector(ld, TN("attn_output.bias"), true, hp->dim))) return false;
        if (!(L->sinks = model_vector(ld, TN("attn_sinks.weight"), true, hp->n_heads))) return false;
        int pat = hp->swa_pattern;
        L->window = pat == 0 || il % pat < pat - 1 ? hp->n_swa : 0;
    }
#undef TN
    return true;
}

/* Layer il's FFN: its norm, then routed experts (with gpt-oss' biases and deepseek2's shared
 * experts) past the leading dense layers, or a dense gate/up/down. */
bool model_load_ffn(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    const bool gptoss = hp->arch == MODEL_ARCH_GPTOSS, post_norm = gptoss || hp->arch == MODEL_ARCH_GLM4MOE;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(L->ffn_norm = model_vector(ld, TN(post_norm ? "post_attention_norm.weight" : "ffn_norm.weight"), true, hp->dim)))
        return false;
    if (hp->n_expert > 0 && il >= hp->n_dense_lead) {
        int ne = hp->n_expert, ef = hp->expert_ffn;
        if (!model_matrix(ld, TN("ffn_gate_inp.weight"), hp->dim, ne, &L->gate_inp)) return false;
        if (!model_experts(ld, TN("ffn_gate_exps.weight"), hp->dim, ef, ne, &L->gate_exps)) return false;
        if (!model_experts(ld, TN("ffn_up_exps.weight"), hp->dim, ef, ne, &L->up_exps)) return false;
        if (!model_experts(ld, TN("ffn_down_exps.weight"), ef, hp->dim, ne, &L->down_exps)) return false;
        L->exp_probs_b = model_vector(ld, TN("exp_probs_b.bias"), false, ne);
        if (ld->st != GGUF_OK) return false;
        if (gptoss) {
            if (!(L->gate_inp_b = model_vector(ld, TN("ffn_gate_inp.bias"), true, ne))) return false;
            if (!(L->gate_exps_b = model_floats(ld, TN("ffn_gate_exps.bias"), true, ef, ne))) return false;
            if (!(L->up_exps_b = model_floats(ld, TN("ffn_up_exps.bias"), true, ef, ne))) return false;
            if (!(L->down_exps_b = model_floats(ld, TN("ffn_down_exps.bias"), true, hp->dim, ne))) return false;
        }
        if (hp->n_shared > 0) {
            int64_t sh = (int64_t)ef * hp->n_shared;
            if (!model_matrix(ld, TN("ffn_gate_shexp.weight"), hp->dim, sh, &L->gate_shexp)) return false;
            if (!model_matrix(ld, TN("ffn_up_shexp.weight"), hp->dim, sh, &L->up_shexp)) return false;
            if (!model_matrix(ld, TN("ffn_down_shexp.weight"), sh, hp->dim, &L->down_shexp)) return false;
        }
        return true;
    }
    if (!model_matrix(ld, TN("ffn_gate.weight"), hp->dim, hp->ffn_dim, &L->gate)) return false;
    if (!model_matrix(ld, TN("ffn_up.weight"), hp->dim, hp->ffn_dim, &L->up)) return false;
    if (!model_matrix(ld, TN("ffn_down.weight"), hp->ffn_dim, hp->dim, &L->down)) return false;
#undef TN
    return true;
}

/* Every tensor of layer il of a family without a layer hook: attn_norm, the attention (MLA's
 * or the shared one) and the FFN. */
static bool model_load_layer(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    char nm[96];
    snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", il);
    if (!(L->attn_norm = model_vector(ld, nm, true, hp->dim))) return false;
    if (hp->mla ? !model_load_mla(ld, il) : !model_load_attn(ld, il)) return false;
    return model_load_ffn(ld, il);
}

/* The token embedding (which fixes the vocabulary), the output norm and head (or the tied
 * embedding), and a ranking model's classifier. */
/* token_embd.weight, whose rows fix the vocabulary size (n_vocab). */
bool model_load_tok_embd(model_ld *ld)
{
    model *m = ld->m;
    const gguf_tensor *te = gguf_find_tensor(m->g, "token_embd.weight");
    if (!te) {
        model_fail(ld, GGUF_ERR_MISSING, "missing tensor token_embd.weight");
        return false;
    }
    if (te->ne[1] <= 0 || te->ne[1] > (1 << 24)) {
        model_fail(ld, GGUF_ERR_SHAPE, "tensor token_embd.weight has %lld rows", (long long)te->ne[1]);
        return false;
    }
    m->hp.n_vocab = (int)te->ne[1];
    return model_matrix(ld, "token_embd.weight", m->hp.dim, m->hp.n_vocab, &m->tok_embd);
}

static bool model_load_io(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    if (!model_load_tok_embd(ld)) return false;
    m->output_norm = model_vector(ld, "output_norm.weight", true, hp->dim);
    if (!m->output_norm) return false;
    if (gguf_find_tensor(m->g, "output.weight")) {
        if (!model_matrix(ld, "output.weight", hp->dim, hp->n_vocab, &m->output)) return false;
    } else {
        m->output = m->tok_embd;
        m->tied_output = true;
    }
    const gguf_tensor *cls = gguf_find_tensor(m->g, "cls.output.weight");
    if (cls && hp->pooling == MODEL_POOL_RANK && cls->n_dims == 2 && cls->ne[1] >= 2 && cls->ne[1] <= 16) {
        m->n_cls_out = (int)cls->ne[1];
        if (!(m->cls_out = model_floats(ld, "cls.output.weight", true, hp->dim, m->n_cls_out))) return false;
    }
    return true;
}

/* The KV pool keeps its blocks for the global layers: a model whose every layer is a window
 * one (a gemma3 file of fewer than 6 layers, a gpt-oss pattern of 0) has none to key them by. */
static bool model_check_windows(model_ld *ld)
{
    const model_hparams *hp = &ld->m->hp;
    for (int il = 0; il < hp->n_layers; il++)
        if (model_layer_window(ld->m, il) == 0) return true;
    model_fail(ld, GGUF_ERR_FORMAT, "every one of the %d layers is a sliding-window layer (window %d): at least one "
               "global layer is needed", hp->n_layers, hp->n_swa);
    return false;
}

gguf_status model_load(const char *path, const model_opts *opts, model **out, char *err, size_t errsz)
{
    *out = NULL;
    if (errsz > 0) err[0] = '\0';
    model *m = xcalloc(1, sizeof *m);
    model_ld ld = { .m = m, .err = err, .errsz = errsz, .st = GGUF_OK };
    gguf_status st = gguf_open(path, &m->g, err, errsz);
    if (st != GGUF_OK) {
        free(m);
        return st;
    }

    const char *an;
    size_t an_len;
    if (!gguf_get_str(m->g, "general.architecture", &an, &an_len)) {
        model_fail(&ld, GGUF_ERR_MISSING, "%s: missing key general.architecture", path);
        goto fail;
    }
    const model_arch_desc *ad = model_arch_find(&ld, path, an, an_len);
    if (!ad) goto fail;
    model_hparams *hp = &m->hp;
    hp->arch = ad->arch, hp->arch_name = ad->name, hp->rope_neox = ad->rope_neox;
    if (!model_read_hparams(&ld, ad)) goto fail;
    if (ad->hparams && !ad->hparams(&ld)) goto fail;
    if (ad->all) {
        if (!ad->all(&ld)) goto fail;
        goto loaded;
    }
    if (!model_load_io(&ld)) goto fail;

    m->layers = xcalloc((size_t)(hp->n_layers + hp->n_nextn), sizeof *m->layers);
    if (ad->layers) {
        if (!ad->layers(&ld)) goto fail;
    } else {
        for (int il = 0; il < hp->n_layers + hp->n_nextn; il++)   /* the MTP layers last */
            if (!(ad->layer ? ad->layer(&ld, il) : model_load_layer(&ld, il))) goto fail;
        if (hp->n_nextn > 0 && !model_load_nextn(&ld)) goto fail;
        if (!model_check_windows(&ld)) goto fail;   /* deepseek4's pool is its own (engine_dsv4.c) */
    }
loaded:
    if (!model_fingerprint(m, path, opts)) {
        model_fail(&ld, GGUF_ERR_NOMEM, "SHA-256 (libcrypto) failed while fingerprinting");
        goto fail;
    }
    if (!(opts && opts->no_repack) && !model_repack(m)) {
        model_fail(&ld, GGUF_ERR_NOMEM, "out of memory for the repacked weights");
        goto fail;
    }
    *out = m;
    return GGUF_OK;

fail:
    st = ld.st != GGUF_OK ? ld.st : GGUF_ERR_FORMAT;
    model_free(m);
    return st;
}

void model_free(model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->repacked);
    free(m->layers);
    model_dsv4_free(m->dsv4);
    model_dflash_free(m->dflash);
    gguf_close(m->g);
    free(m);
}

void model_embed_row(const model *m, int32_t token, float *out)
{
    const ops_weight *w = &m->tok_embd;
    size_t rb = quant_row_bytes(w->type, w->cols);
    quant_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)token * rb, out, w->cols);
}

static size_t model_w_bytes(const ops_weight *w)
{
    return quant_row_bytes(w->type, w->cols) * (size_t)w->rows;
}

ops_weight model_expert(const ops_weight *w, int n_expert, int e)
{
    int64_t rows = w->rows / n_expert;
    return ops_weight_rows(w, rows * e, rows);
}

/* experts_used: how many experts per layer to count (n_expert for all of them) */
static size_t model_bytes(const model *m, int experts_used)
{
    size_t n = model_w_bytes(&m->output) + (m->dsv4 ? model_w_bytes(&m->dsv4->out_hc_fn) : 0);
    const model_hparams *hp = &m->hp;
    for (int il = 0; il < hp->n_layers; il++) {
        model_layer *L = &m->layers[il];
        ops_weight *ws[MODEL_LAYER_MATS];
        int nw = model_layer_matrices(L, ws);
        for (int i = 0; i < nw; i++) n += model_w_bytes(ws[i]);
        n += model_w_bytes(&L->wk_b) + model_w_bytes(&L->wv_b);
        if (m->dsv4) {
            model_dsv4_mat dm[MODEL_DSV4_LAYER_MATS];
            int nd = model_dsv4_layer_matrices(m->dsv4, il, dm);
            for (int i = 0; i < nd; i++) n += model_w_bytes(dm[i].w);
        }
        if (!L->gate_inp.data) continue;
        size_t all = model_w_bytes(&L->gate_exps) + model_w_bytes(&L->up_exps) + model_w_bytes(&L->down_exps);
        n += model_w_bytes(&L->gate_inp) + all / (size_t)hp->n_expert * (size_t)experts_used;
    }
    return n;
}

size_t model_weight_bytes(const model *m) { return model_bytes(m, m->hp.n_expert); }
size_t model_active_weight_bytes(const model *m) { return model_bytes(m, m->hp.n_expert_used); }
