/*
 * cmd_mkmodel_int: what only mkmodel's files may see: the resolved options, the tensor
 * descriptors and the model being written, and the calls between the two files.
 *
 *   cmd_mkmodel.c       the driver: options and presets, the vocabulary, the weights'
 *                       generation and quantisation (mk_add), the common keys, the write
 *   cmd_mkmodel_arch.c  the families: each architecture's own keys and layer tensors, as
 *                       llama.cpp's converters write them (mk_arch_keys, mk_arch_layer)
 *
 * A tensor's bytes depend only on the seed, its name and its descriptor, and the writer
 * emits keys and tensors in the order they are added: the family writers must add them in
 * the converters' order for the files to stay the same.
 */
#ifndef TM_CMD_MKMODEL_INT_H
#define TM_CMD_MKMODEL_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/gguf.h"
#include "model/quant.h"

typedef struct {
    const char *arch;       /* "llama", "qwen2", "qwen3", "qwen3moe" */
    int n_layers, dim, ffn, n_heads, n_kv_heads, head_dim, ctx;
    int n_expert, n_expert_used, expert_ffn;  /* qwen3moe, deepseek2 */
    int q_lora, kv_lora, nope_dim, rope_dim, v_dim, n_shared, n_dense;   /* deepseek2 */
    bool sigmoid, w_norm;
    double w_scale;
    int n_groups, n_groups_used;
    double router_skew;     /* deepseek2 sigmoid router: added to expert x's selection bias
                             * times x / (E - 1), 0: none */
    int n_vocab;            /* requested (generated vocab size, or pad target) */
    double rope_base;
    double eps;
    bool tied;
    bool rope_llama3;
    bool rope_yarn;         /* YaRN: factor 40 from 4096 positions, DeepSeek's settings (gpt-oss:
                             * factor 32, its own) */
    int n_swa;              /* gpt-oss, gemma3: sliding window */
    int n_nextn;            /* deepseek2, glm4moe: MTP layers after the n_layers; deepseek4's
                             * MTP-only file: 1, its block */
    bool mtp_only;          /* deepseek4: the MTP-only companion (the converter's --mtp): the
                             * shared embedding, norm and head, the block's own head collapse
                             * and blk.<n_layers>.*, none of the trunk's layers */
    int ssm_k_heads, ssm_v_heads, ssm_state;   /* qwen35: linear layers' q/k heads, v heads, head size */
    /* deepseek4 (with q_lora, rope_dim, n_shared, w_scale, n_swa above): the grouped low-rank
     * output, the lightning indexer, the hyper-connection streams, the hash-routed lead layers */
    int o_groups, o_lora;           /* output groups, each's low rank */
    int idx_heads, idx_dim, idx_topk;   /* indexer heads, head size, compressed entries kept */
    int n_hc;                       /* hyper-connection streams */
    int n_hash;                     /* leading layers routed by token id (tid2eid) */
    int n_plain;                    /* leading uncompressed layers (ratio 0), then ratios 4, 128 in turn */
    int pooling;            /* {arch}.pooling_type to write (llama.cpp's values), -1: none */
    qtype exps_type;        /* the experts' type (mxfp4: MXFP4, else the base type) */
    const char *type;       /* --type */
    uint64_t seed;
    int n_threads;
    int n_pl;               /* gemma4: per-layer embedding width (E2B/E4B's), 0: none */
    int n_shared_kv;        /* gemma4: layers at the end that read an earlier layer's K/V */
    bool v_global;          /* gemma4: the global layers have their own attn_v (E2B/E4B), not V = K */
} mk_opts;

/* SKEW: noise + router_skew's ramp; TID2EID: I32 rows of distinct expert ids in 0..n_expert-1 */
/* PROPORTIONAL: gemma4's rope_freqs, 1 on the first quarter of the pairs and 1e30 (unrotated) on
 * the rest, as conversion/gemma.py writes partial_rotary_factor 0.25 */
typedef enum { MK_INIT_NOISE, MK_INIT_NORM, MK_INIT_ROPE_FREQS, MK_INIT_SKEW, MK_INIT_TID2EID, MK_INIT_PROPORTIONAL } mk_init;

typedef struct {
    uint64_t seed;          /* per-tensor seed (run seed mixed with the name) */
    mk_init init;
    float std;              /* noise standard deviation */
    qtype type;             /* storage type */
    int64_t ne0, nrows;     /* row length, rows */
    const mk_opts *o;
} mk_tensor;

typedef struct {
    gguf_writer *w;
    mk_tensor *ts;          /* (n) descriptors, kept alive until the write */
    int n, cap;
    const mk_opts *o;
    qtype base;             /* type of ordinary matrices */
    bool k_m;               /* q3_k_m / q4_k_m / q5_k_m mix */
    int64_t n_vocab;        /* tokens (deepseek4's tid2eid has a row per token) */
} mk_model;

/* Layer l's tensor named "blk.<l>.SUFFIX", in a function with a char name[] and an int l. */
#define MK_T(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), name)

/* cmd_mkmodel.c */

/* The seed of the tensor named name (mk_add3 draws with it): a copy under another name draws the same. */
uint64_t mk_seed_of(const mk_opts *o, const char *name);
/* Adds tensor name of 1..3 dims (ne2 > 1: 3-D, a stack of ne2 matrices of ne1 rows) to m's
 * writer, generated at write time; a matrix whose rows do not fit type's block falls back as
 * llama.cpp's quantiser does. Aborts past m->cap tensors. */
void mk_add3(mk_model *m, const char *name, mk_init init, float std, qtype type, int n_dims, int64_t ne0, int64_t ne1,
             int64_t ne2);
/* mk_add3 of at most 2 dims. */
void mk_add(mk_model *m, const char *name, mk_init init, float std, qtype type, int n_dims, int64_t ne0, int64_t ne1);

/* cmd_mkmodel_arch.c */

/* deepseek2 and mistral4 (the same converter under another name) have latent attention. */
bool mk_is_mla(const char *arch);
/* o's family's keys after the common hyper-parameters (rms epsilon) and before vocab_size:
 * the attention's key/value sizes and RoPE dims, then each family's own. */
void mk_arch_keys(gguf_writer *w, const mk_opts *o);
/* Layer l's tensors after its attn_norm (l >= o->n_layers: an MTP layer, with its nextn.*:
 * deepseek2/glm4moe's with copies of the embedding and head, deepseek4's without);
 * more is the type of the "more bits" matrices of a K-quant mix, emb_std and out_type the
 * embedding's scale and the head's type (the MTP layer's copies of them). */
void mk_arch_layer(mk_model *m, int l, qtype more, float emb_std, qtype out_type);

#endif
