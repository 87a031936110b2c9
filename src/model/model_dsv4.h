/*
 * model_dsv4: DeepSeek V4 (`deepseek4` GGUFs as llama.cpp's converter writes them): the
 * hyper-parameters and tensors that the family adds to model.h's, loaded by model_load.
 *
 * The tensors V4 shares with the other families stay in model_layer (attention and FFN
 * norms, the sinks, wq_a / q_a_norm / wq_b, the router, the stacked experts, the shared
 * expert, the selection bias), so that repacking, residency and the weight byte counts see
 * them as any model's; model_dsv4_layer holds the rest: the single K=V head's projection,
 * the grouped low-rank output, the hyper-connection mixes, the compressor and the lightning
 * indexer of compressed layers, the hash-routing table. The forward pass is
 * engine/engine_dsv4.c; docs/deepseek4.md writes it out.
 *
 * MTP. llama.cpp's converter writes V4's MTP block only into a file of its own (`--mtp`): an
 * MTP-only file, which llama.cpp's loader recognises by nextn_predict_layers > 0 and no
 * blk.0.attn_norm.weight. Its block_count counts the block after the trunk's layers (blk.L,
 * L = num_hidden_layers), it holds the shared embedding, output norm and head, the block's own
 * output_hc_* and the block (attention without compressor, hyper-connections, biased MoE, the
 * nextn tensors). Such a file loads as a model of L layers of which only the MTP block is
 * read (mtp_only, m->mtp, and `mtp` below for model_mtp_view); it is not a model to run, only
 * to draft beside its trunk (engine/engine_dsv4_mtp.c). One block only (llama.cpp's graph
 * runs one), of ratio 0, not hash-routed: anything else is refused at load. MTP layers inside
 * a trunk file (which the converter never writes) are not read: hp.n_nextn is set to 0.
 */
#ifndef TM_MODEL_DSV4_H
#define TM_MODEL_DSV4_H

#include <stdint.h>

#include "model/model.h"

/* One RoPE as ggml_rope_ext takes it (ops_rope_ggml's arguments). */
typedef struct {
    float theta_scale;       /* powf(base, -2 / n_rot) */
    float freq_scale;        /* 1 / the scaling factor; 1: none */
    float mscale;            /* cos/sin multiplier: V4's attention factor, 1 / (1 + 0.1 ln factor)
                              * under YaRN, which cancels ggml's YaRN magnitude (net 1) */
    float yarn[3];           /* ext_factor (0: no YaRN), the ramp's corr dims for this base */
} model_dsv4_rope;

typedef struct {
    int ratio;               /* compression ratio: 0 (window only), 4 (with the indexer), 128 */
    int ffn;                 /* the routed experts' hidden size in this layer */
    float clamp_exp;         /* SwiGLU clamp of the routed experts, 0: none */
    float clamp_shexp;       /* of the shared expert */
    ops_weight wkv;          /* (hd, dim) the one K=V head */
    const float *kv_norm;    /* (hd) f32 */
    ops_weight wo_a;         /* (o_groups * o_lora, H * hd / o_groups): group g is rows g*o_lora.. */
    ops_weight wo_b;         /* (dim, o_groups * o_lora) */
    ops_weight hc_fn[2];     /* (mix, hc * dim) attention's, ffn's hyper-connection mixes */
    const float *hc_base[2]; /* (mix) f32, mix = (2 + hc) * hc */
    const float *hc_scale[2];/* (3) f32: pre, post, combination */
    /* compressor (ratio > 0); coff = 2 for ratio 4 (overlapping groups), else 1 */
    ops_weight comp_kv;      /* (coff * hd, dim) */
    ops_weight comp_gate;    /* (coff * hd, dim) */
    const float *comp_ape;   /* (ratio, coff * hd) f32 learned position within the group */
    const float *comp_norm;  /* (hd) f32 */
    /* lightning indexer (ratio 4) */
    ops_weight idx_proj;     /* (idx_heads, dim) head weights */
    ops_weight idx_q_b;      /* (idx_heads * idx_dim, q_lora) */
    ops_weight icomp_kv;     /* (2 * idx_dim, dim) */
    ops_weight icomp_gate;   /* (2 * idx_dim, dim) */
    const float *icomp_ape;  /* (4, 2 * idx_dim) f32 */
    const float *icomp_norm; /* (idx_dim) f32 */
    const int32_t *tid2eid;  /* (n_vocab, n_expert_used) experts of each token (hash layers), or
                              * NULL; in the file mapping, values checked < n_expert at load */
} model_dsv4_layer;

typedef struct model_dsv4 {
    int q_lora;              /* query low-rank size */
    int swa;                 /* sliding window: a query at p sees raw rows p - swa + 1 .. p */
    int o_groups, o_lora;    /* grouped low-rank output: groups, rank per group */
    int hc;                  /* residual streams (hyper-connections) */
    int sk_iters;            /* Sinkhorn iterations */
    float hc_eps;            /* hyper-connection epsilon */
    int n_hash;              /* leading layers routed by tid2eid */
    int idx_heads, idx_dim;  /* lightning indexer heads and key size */
    int idx_topk;            /* compressed entries an indexed layer attends to at most */
    float cbase;             /* RoPE base of compressed layers (attention.compress_rope_freq_base) */
    model_dsv4_rope rope_raw;  /* RoPE of ratio-0 layers: the plain base, never scaled */
    model_dsv4_rope rope_comp; /* of compressed layers (queries, keys, entries, the indexer):
                                * the compressed base with the file's scaling (YaRN) */
    int max_ffn;             /* largest expert hidden size over the layers */
    ops_weight out_hc_fn;    /* (hc, hc * dim) the head's collapse of the streams */
    const float *out_hc_base;/* (hc) f32 */
    const float *out_hc_scale; /* (1) f32 */
    model_dsv4_layer *layers;/* (n_layers + n_nextn); of an MTP-only file only [n_layers] is read */
    bool mtp_only;           /* an MTP-only file (see the file comment) */
    struct model_dsv4 *mtp;  /* an MTP-only file's view of its block (layers = &layers[n_layers],
                              * no hash layers), model_mtp_view's; NULL otherwise */
} model_dsv4;

/* Frees what model_dsv4_load allocated (NULL is fine); the model's owned arrays are its own. */
void model_dsv4_free(model_dsv4 *d);

/* Where a step reads one of V4's own matrices: with the attention's input projections (the K=V
 * head, the compressor's and the indexer's), as the grouped output, or in the hyper-connections'
 * mixes. bench profile charges each to its stage by this. */
typedef enum { MODEL_DSV4_USE_ATT_IN, MODEL_DSV4_USE_ATT_OUT, MODEL_DSV4_USE_HC } model_dsv4_use;

typedef struct {
    ops_weight *w;
    int slice_rows;          /* rows of the slices the engine cuts it into (wo_a: one group's
                              * o_lora); 0: used whole */
    model_dsv4_use use;
} model_dsv4_mat;

/* The 2-D matrices of V4's own that a trunk layer has (data set), at most MODEL_DSV4_LAYER_MATS,
 * for repacking, the weight byte counts and the profile's stages. */
#define MODEL_DSV4_LAYER_MATS 11
int model_dsv4_layer_matrices(model_dsv4 *d, int il, model_dsv4_mat *out);

#endif
