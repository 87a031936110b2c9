/*
 * model_int: what only model*.c may see: the loading context and the checked readers of keys
 * and tensors (model.c), which the files of one family each (model_phi3.c, model_gemma3.c, model_gemma4.c, model_glm4moe.c, model_qwen35.c, model_dsv4.c) load with, so that
 * every family's error names its key or tensor the same way.
 */
#ifndef TM_MODEL_INT_H
#define TM_MODEL_INT_H

#include "model/model.h"

/* Loading context: the model being built plus the error buffer. */
typedef struct {
    model *m;
    char *err;
    size_t errsz;
    gguf_status st;  /* first error */
} model_ld;

/* Records the first error (status and message); returns st. */
gguf_status model_fail(model_ld *ld, gguf_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An integer (float) key: false and an error when of another type, or absent and required. */
bool model_key_int(model_ld *ld, const char *key, bool required, int64_t def, int64_t *out);
bool model_key_float(model_ld *ld, const char *key, double def, double *out);
/* Tensor NAME of (cols, rows), checked (model.c). */
const gguf_tensor *model_tensor(model_ld *ld, const char *name, bool required, int n_dims, int64_t cols, int64_t rows);
/* A matrix of (rows, cols) as a view of the mapping. */
bool model_matrix(model_ld *ld, const char *name, int64_t cols, int64_t rows, ops_weight *w);
/* A vector of n elements as an owned f32 array; NULL when absent (an error only if required). */
const float *model_vector(model_ld *ld, const char *name, bool required, int64_t n);
/* n zeroed floats owned by the model. */
float *model_own(model *m, size_t n);

/* YaRN's ramp over the rotated pairs for a base (ggml_rope_yarn_corr_dims with beta fast 32 and
 * slow 1, llama.cpp's defaults): pairs up to dims[0] keep their angle, pairs from dims[1] on
 * are interpolated by the scaling factor, those between mix the two linearly. */
void model_yarn_corr_dims(int n_rot, float orig_ctx, float base, float dims[2]);

/* phi3 (model_phi3.c): its RoPE factors and attention factor, after the common
 * hyper-parameters; every tensor of layer il. */
bool model_phi3_hparams(model_ld *ld);
bool model_phi3_layer(model_ld *ld, int il);
/* mistral3 (model_mistral3.c): its attention temperature and YaRN checks; its tensors are
 * llama's (model.c). */
bool model_mistral3_hparams(model_ld *ld);

/* Layer il's attention after attn_norm (llama's projections and each family's extras), and its
 * FFN with ffn_norm (model.c): for a family's layer hook that adds tensors around them. */
bool model_load_attn(model_ld *ld, int il);
bool model_load_ffn(model_ld *ld, int il);

/* gemma3 (model_gemma3.c): the window layers, their RoPE base, the soft cap, the embedding
 * scale, after the common hyper-parameters; every tensor of layer il. */
bool model_gemma3_hparams(model_ld *ld);
bool model_gemma3_layer(model_ld *ld, int il);
/* gemma4 (model_gemma4.c): gemma3's keys plus each layer's head size, kv heads and RoPE, and
 * the refusals of what the engine lacks; every tensor of layer il. */
bool model_gemma4_hparams(model_ld *ld);
bool model_gemma4_layer(model_ld *ld, int il);

/* The DeepSeek-style router keys deepseek2 and glm4moe share (model.c). */
bool model_read_router(model_ld *ld, const char *an, bool shared_required, int64_t gating_default);

/* glm4moe (model_glm4moe.c): its dense lead, shared experts and router keys (before the
 * shared shape checks); every tensor of layer il (the NextN block's too). */
bool model_glm4moe_keys(model_ld *ld, const char *an);
bool model_glm4moe_layer(model_ld *ld, int il);

/* A stacked expert tensor [cols, rows, n_expert] viewed as n_expert * rows rows. */
bool model_experts(model_ld *ld, const char *name, int64_t cols, int64_t rows, int n_expert, ops_weight *w);
/* A 1-D tensor of n (rows 1) or a 2-D (rows, n) one as owned f32; NULL when absent or wrong. */
const float *model_floats(model_ld *ld, const char *name, bool required, int64_t n, int64_t rows);

/* ---- Qwen3.5 (model_qwen35.c) ---- */
static inline bool model_is_qwen35(const model_hparams *hp)
{
    return hp->arch == MODEL_ARCH_QWEN35 || hp->arch == MODEL_ARCH_QWEN35MOE;
}
/* The linear-attention hyper-parameters and the layer kinds, after model_read_hparams. */
bool model_qwen35_hparams(model_ld *ld);
/* Every tensor of layer il. */
bool model_qwen35_layer(model_ld *ld, int il);

/* token_embd.weight, whose rows fix hp.n_vocab (model.c). */
bool model_load_tok_embd(model_ld *ld);

/* The nextn tensors (eh_proj, enorm, hnorm, and the optional shared head norm, embedding and
 * head) of the MTP layers after the model's, into m->mtp = m->layers + n_layers (model.c). */
bool model_load_nextn(model_ld *ld);

/* bert (model_bert.c): its hyper-parameters beyond the common ones, the embeddings and every
 * layer's tensors, after model_read_hparams; sets n_vocab. */
bool model_bert_load(model_ld *ld);

/* Reads DeepSeek V4's hyper-parameters and every layer's tensors into m->layers and m->dsv4
 * (model_dsv4.c), after the common hyper-parameters, the embedding and the output; of an
 * MTP-only file (model_dsv4.h), the MTP block alone. */
bool model_dsv4_load(model_ld *ld);

/* A DFlash / DSpark drafter's block metadata, heads and layers (model_dflash.c), after the
 * common hyper-parameters; its embedding and head only when the file has them. */
bool model_dflash_load(model_ld *ld);

#endif
