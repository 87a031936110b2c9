/*
 * model: a transformer described by a GGUF file: the hyper-parameters and the weights of the
 * architectures we run (the decoders `llama`, `qwen2`, `qwen3`, `qwen3moe`, `deepseek2`,
 * `gpt-oss`, `phi3`, `mistral3`, `gemma3`, `gemma4`, ..., and the BERT-style encoder `bert` for embeddings,
 * model_bert.c: docs/architectures.md), ready for the engine.
 *
 * model_load opens the GGUF (gguf.c: read-only shared mmap) and keeps it open for the
 * model's lifetime: matrices are used in place from the mapping as ops_weight views, except
 * those that the active kernels want in another layout (ops_repack_type: Q8_0, Q4_0, MXFP4,
 * Q4_K and Q6_K on AVX-512, 16 rows interleaved): they are repacked at load into one owned
 * allocation, and their file pages are dropped from the process (madvise DONTNEED; the page
 * cache keeps them). Such a matrix costs anonymous memory of about its file size (the same for
 * Q8_0, Q4_0 and MXFP4, +2.8 % for Q4_K, +1 % for Q6_K) that processes do not share, instead
 * of shared page cache. The token embedding keeps the file's
 * layout (rows are read one at a time); a tied output matrix is repacked as a copy. Small
 * 1-D tensors (norm weights, biases) are converted once to owned f32 arrays, whatever their
 * stored type, so that the kernels see one layout. Every required tensor is checked for
 * presence, type support and shape before the load succeeds; a failure names the tensor.
 *
 * Mixture of experts (`qwen3moe`): Qwen3 attention, and instead of the dense FFN a router
 * (`ffn_gate_inp`, (n_expert, dim), F32 in llama.cpp's files) and n_expert experts stored as
 * three 3-D tensors (`ffn_gate_exps`/`ffn_up_exps` [dim, expert_ffn, n_expert],
 * `ffn_down_exps` [expert_ffn, dim, n_expert]). Each is kept as ONE ops_weight over the
 * mapping, the experts stacked row-wise (rows = n_expert * rows per expert); model_expert
 * gives expert e's slice as a view. Expert tensors are repacked as the 2-D matrices are when
 * each expert's rows are whole 16-row groups (the stacked layout stays expert-major, so an
 * expert's slice is still one contiguous range and a decode step reads only the experts its
 * tokens were routed to, each in one sequential stream); the file pages are dropped piece
 * by piece, so a model's memory stays about the size of its weights. Otherwise they are
 * used in place from the shared page cache.
 *
 * gpt-oss (llama.cpp's `gpt-oss`, LLM_ARCH_OPENAI_MOE): attention with q/k/v/o biases and a
 * learned sink logit per head (`attn_sinks`), NEOX RoPE with YaRN; every layer but the last of
 * each `sliding_window_pattern` (default 2: even layers) attends only to the last
 * `sliding_window` positions (model_layer_window), the others to the whole context; the FFN
 * input norm is `post_attention_norm`; the router has a bias, picks the top k on its logits and
 * weights them by a softmax over those k; experts have biases and the clamped SwiGLU
 * (ops_swiglu_oai). Expert weights are usually MXFP4.
 *
 * Multi-head latent attention (`deepseek2`, as llama.cpp's converter writes it with split
 * `attn_k_b` / `attn_v_b`): hp.head_dim is the latent plus the RoPE part (one kv head),
 * hp.mla says so; see engine.h for how it is computed. The per-head tensors are stacked as
 * the experts are (model_expert gives head h's slice) and repacked on the same condition.
 *
 * Multi-token prediction (DeepSeek-V3's MTP, llama.cpp's "nextn" layers): a file with
 * `{arch}.nextn_predict_layers` = n stores n more blocks after the model's (block_count counts
 * them, as llama.cpp's converter writes it): each the usual layer tensors plus
 * `nextn.eh_proj`, `nextn.enorm`, `nextn.hnorm` and the optional `nextn.shared_head_norm`,
 * `nextn.embed_tokens`, `nextn.shared_head_head`. hp.n_layers excludes them (the model runs
 * as without them, as llama.cpp's does); they are loaded into model.mtp for the MTP draft
 * (model_mtp_view; engine/specdraft.h). They are not repacked.
 *
 * RoPE: llama uses the interleaved ("normal") form, qwen2/qwen3 the NEOX (half-split) form.
 * The inverse frequencies inv_freq[i] = freq_scale * base^(-2i/n_rot) / factor[i] are
 * precomputed, where factor comes from the `rope_freqs.weight` tensor (llama3 scaling, as
 * llama.cpp's converter writes it) or, when that tensor is absent, from the
 * `{arch}.rope.scaling.*` keys (type "llama3"), and freq_scale = 1/factor for linear scaling.
 *
 * Fingerprint: SHA-256 over a version tag, the architecture, the hyper-parameters, every
 * tensor's name/type/shape/offset, the file size, and the digest of every byte of the file
 * (model/modelhash.h: hashed in parallel at the first load of a file, then read from a cache
 * entry keyed by the file's identity and times). KV-cache block keys include it, so two files
 * that differ in any byte never share blocks.
 */
#ifndef TM_MODEL_H
#define TM_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "model/gguf.h"
#include "model/ops.h"

#define MODEL_MAX_EXPERTS 1024   /* experts per layer at most */

typedef enum {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_QWEN3,
    MODEL_ARCH_QWEN3MOE,     /* qwen3 attention, routed experts (no shared expert) */
    MODEL_ARCH_DEEPSEEK2,    /* multi-head latent attention, leading dense layers, routed and
                              * shared experts */
    MODEL_ARCH_GPTOSS,       /* sliding-window and full layers, attention sinks, biases, routed
                              * experts with biases and the clamped SwiGLU */
    MODEL_ARCH_PHI3,         /* llama's layer, fused QKV and gate-up, partial NEOX RoPE,
                              * LongRoPE factors (model_phi3.c) */
    MODEL_ARCH_MISTRAL3,     /* llama's layer, YaRN, Llama 4's attention temperature
                              * (model_mistral3.c) */
    MODEL_ARCH_QWEN35,       /* Qwen3.5: gated delta net (linear attention) layers beside gated
                              * full-attention ones (model_qwen35.c, engine_qwen35.c) */
    MODEL_ARCH_QWEN35MOE,    /* Qwen3.5's layers, routed experts and a gated shared expert */
    MODEL_ARCH_DEEPSEEK4,    /* compressed attention, lightning indexer, hyper-connections
                              * (model_dsv4.h, engine_dsv4.c) */
    MODEL_ARCH_BERT,         /* an encoder: absolute positions, bidirectional attention,
                              * post-LayerNorm blocks, GELU FFN (model_bert.c, engine_bert.c) */
    MODEL_ARCH_NOMIC_BERT,   /* bert's blocks with NEOX RoPE instead of absolute positions,
                              * fused QKV, a SwiGLU FFN (model_bert.c, engine_bert.c) */
    MODEL_ARCH_DFLASH,       /* a DFlash / DSpark drafter: drafts a block from a target's hidden
                              * states (model_dflash.h, engine_dflash.c); not a model to serve */
    MODEL_ARCH_GEMMA3,       /* window and global layers with their own RoPE bases, norms after
                              * each sublayer too, GELU FFN, scaled embeddings, capped logits
                              * (model_gemma3.c) */
    MODEL_ARCH_GEMMA4,       /* gemma3's layer with per-layer head sizes and kv heads, V from K,
                              * a layer output scale (model_gemma4.c, engine_gemma4.c) */
    MODEL_ARCH_GLM4MOE,      /* GLM-4.5: biased Q/K/V, optional q/k head norms, partial NEOX
                              * RoPE, a dense lead, sigmoid-routed and shared experts, an MTP
                              * layer (model_glm4moe.c) */
    MODEL_ARCH_MISTRAL4,     /* Mistral 4: deepseek2's latent attention and experts under its
                              * own name (model.c) */
} model_arch;

typedef struct {
    const float *attn_norm;  /* (dim) f32 */
    ops_weight wq;           /* (n_heads*head_dim, dim) */
    ops_weight wk;           /* (n_kv_heads*head_dim, dim) */
    ops_weight wv;           /* (n_kv_heads*head_dim, dim) */
    ops_weight wo;           /* (dim, n_heads*head_dim) */
    const float *bq;         /* (n_heads*head_dim) f32, qwen2 only, else NULL */
    const float *bk;         /* (n_kv_heads*head_dim) f32, qwen2 only, else NULL */
    const float *bv;         /* (n_kv_heads*head_dim) f32, qwen2 only, else NULL */
    const float *bo;         /* (dim) f32 attention output bias (gpt-oss), else NULL */
    const float *sinks;      /* (n_heads) f32 attention sink logits (gpt-oss), else NULL: one
                              * more term exp(sink) per head in the softmax denominator */
    int window;              /* sliding-window attention: a query at p sees keys p-window+1..p;
                              * 0: every earlier key (see model_layer_window) */
    const float *q_norm;     /* (head_dim) f32, qwen3 only, else NULL */
    const float *k_norm;     /* (head_dim) f32, qwen3 only, else NULL */
    const float *attn_post_norm; /* (dim) f32 gemma3: RMS norm of the attention's output before
                              * its residual add, else NULL */
    const float *ffn_norm;   /* (dim) f32 */
    const float *ffn_post_norm; /* (dim) f32 gemma3: the same for the FFN's output, else NULL */
    /* gemma4: this layer's own attention geometry (its K/V rows in the pool, its attention);
     * hp.head_dim and hp.n_kv_heads are then the widest over the layers, which size the
     * engine's buffers (engine_gemma4.c) */
    int l_head_dim;          /* head size of q, k and v; 0: hp's geometry (every other family) */
    int l_kv_heads;          /* kv heads, a divisor of n_heads, at most hp.n_kv_heads */
    int l_n_rot;             /* rotated dims per head (NEOX) */
    int l_ffn_dim;           /* its dense FFN's width (gemma4's double-wide MLP on the shared KV
                              * layers); 0: hp.ffn_dim, which is then the widest */
    float l_theta_scale;     /* base^(-2/l_n_rot), its own RoPE base's per-pair step */
    const float *l_rope_factors; /* (l_n_rot/2) f32 frequency divisors (rope_freqs), or NULL */
    const float *v_norm;     /* (l_head_dim) f32 ones: each v head RMS-normed without a weight */
    float out_scale;         /* layer_output_scale: the layer's output, residual included, times
                              * this; 0: none */
    bool kv_shared;          /* gemma4's shared KV layers: no K/V of its own; it computes only
                              * its queries and attends over layer kv_src's K/V */
    int kv_src;              /* that earlier layer, when kv_shared */
    /* gemma4's experts (26B-A4B) beside the dense FFN, which is then its shared MLP: the layer's
     * FFN output is post_norm_1(mlp(ffn_norm(x))) + post_norm_2(experts(pre_norm_2(x))) */
    const float *gate_inp_s; /* (dim) f32 the router's input is rmsnorm(x) / sqrt(dim) * this */
    const float *down_exps_s;/* (n_expert) f32 expert e's output times [e], or NULL */
    const float *ffn_pre_norm_2;  /* (dim) f32 the experts' input norm */
    const float *ffn_post_norm_1; /* (dim) f32 the shared MLP's output norm */
    const float *ffn_post_norm_2; /* (dim) f32 the experts' output norm */
    bool exps_gate_up;       /* gate_exps holds each expert's gate rows then its up rows
                              * (ffn_gate_up_exps: 2 * expert_ffn rows an expert); up_exps empty */
    /* gemma4's per-layer embeddings (E2B, E4B): after the FFN's residual add, x += post_norm(
     * pl_proj(gelu(pl_gate(x)) * this layer's slice of the per-layer input)) */
    ops_weight pl_gate;      /* (n_pl, dim) per_layer_inp_gate */
    ops_weight pl_proj;      /* (dim, n_pl) per_layer_proj */
    const float *pl_post_norm; /* (dim) f32 per_layer_post_norm */
    ops_weight gate;         /* (ffn_dim, dim) */
    ops_weight up;           /* (ffn_dim, dim) */
    ops_weight down;         /* (dim, ffn_dim) */
    /* mixture of experts (n_expert > 0; gate/up/down above unused) */
    ops_weight gate_inp;     /* (n_expert, dim) router */
    ops_weight gate_exps;    /* (n_expert * expert_ffn, dim), expert e at rows e*expert_ffn.. */
    ops_weight up_exps;      /* (n_expert * expert_ffn, dim) */
    ops_weight down_exps;    /* (n_expert * dim, expert_ffn) */
    const float *exp_probs_b;/* (n_expert) f32 selection bias (DeepSeek V3), else NULL */
    const float *gate_inp_b; /* (n_expert) f32 router logit bias (gpt-oss), else NULL */
    const float *gate_exps_b;/* (n_expert, expert_ffn) f32 expert biases (gpt-oss), else NULL */
    const float *up_exps_b;  /* (n_expert, expert_ffn) f32 */
    const float *down_exps_b;/* (n_expert, dim) f32 */
    ops_weight gate_shexp;   /* (n_shared * expert_ffn, dim) shared experts (deepseek2), or empty */
    ops_weight up_shexp;     /* (n_shared * expert_ffn, dim) */
    ops_weight down_shexp;   /* (dim, n_shared * expert_ffn) */
    /* multi-head latent attention (deepseek2; wq/wk/wv unused, wq set without q-LoRA) */
    ops_weight wq_a;         /* (q_lora, dim), or empty without q-LoRA */
    const float *q_a_norm;   /* (q_lora) f32 */
    ops_weight wq_b;         /* (n_heads * (nope + rope), q_lora) */
    ops_weight wkv_a;        /* (kv_lora + rope, dim): the latent and the RoPE key */
    const float *kv_a_norm;  /* (kv_lora) f32 */
    ops_weight wk_b;         /* (n_heads * kv_lora, nope): per head, q_nope -> latent space */
    ops_weight wv_b;         /* (n_heads * v_dim, kv_lora): per head, latent -> value */
    /* multi-token prediction (the nextn layers after the model's own, model.mtp): the layer's
     * input is eh_proj([enorm(embedding); hnorm(hidden)]) */
    ops_weight eh_proj;      /* (dim, 2 * dim) */
    const float *enorm;      /* (dim) f32 */
    const float *hnorm;      /* (dim) f32 */
    const float *head_norm;  /* (dim) f32 shared_head_norm, or NULL: the model's output_norm */
    ops_weight embed;        /* (n_vocab, dim) its own embedding, or empty: the model's */
    ops_weight head;         /* (n_vocab, dim) its own output head, or empty: the model's */
    /* Qwen3.5: a linear-attention (gated delta net) layer has ssm_out set and no wq..wo; a
     * full-attention layer has attn_gated. H = ssm_v_heads, Hk = ssm_k_heads, S = ssm_head */
    bool attn_gated;         /* wq is (n_heads * 2 * head_dim, dim): per head its query, then
                              * its output gate (attention output *= sigmoid(gate)) */
    ops_weight ssm_qkv;      /* (2 * Hk * S + H * S, dim) attn_qkv: q, k, v before the conv */
    ops_weight ssm_z;        /* (H * S, dim) attn_gate: the output norm's SiLU gate */
    ops_weight ssm_beta;     /* (H, dim) the delta rule's write strength, through a sigmoid */
    ops_weight ssm_alpha;    /* (H, dim) the decay: ssm_a * softplus(alpha + ssm_dt) */
    const float *ssm_conv1d; /* (2 * Hk * S + H * S, ssm_conv) f32 causal conv taps, oldest first */
    const float *ssm_dt;     /* (H) f32 */
    const float *ssm_a;      /* (H) f32, -exp(A_log) as the converter writes it */
    const float *ssm_norm;   /* (S) f32 the gated RMS norm's weight, shared by the heads */
    ops_weight ssm_out;      /* (dim, H * S) */
    const float *gate_inp_shexp; /* (dim) f32 the shared expert's gate (qwen35moe): its output
                              * times sigmoid(dot(x, this)); NULL: ungated */
    /* bert: attn_norm and ffn_norm are the LayerNorms AFTER each sublayer's residual add
     * (attn_output_norm, layer_output_norm), with these biases; up/down have biases (bert's
     * FFN is GELU(up) without gate, nomic-bert's SwiGLU with gate) */
    const float *attn_norm_b;/* (dim) f32 */
    const float *ffn_norm_b; /* (dim) f32 */
    const float *up_b;       /* (ffn_dim) f32, or NULL */
    const float *down_b;     /* (dim) f32, or NULL */
} model_layer;

/* How an embedding model pools its token states into one vector: {arch}.pooling_type, with
 * llama.cpp's values (enum llama_pooling_type). */
typedef enum {
    MODEL_POOL_NONE = 0,     /* a chat model (no key): nothing declared */
    MODEL_POOL_MEAN = 1,     /* the mean of every position's state */
    MODEL_POOL_CLS = 2,      /* the first position's (BERT's [CLS]) */
    MODEL_POOL_LAST = 3,     /* the last position's (Qwen3-Embedding) */
    MODEL_POOL_RANK = 4,     /* a reranker: the last position's state through a score head */
} model_pool;

typedef struct {
    model_arch arch;
    const char *arch_name;   /* "llama", "qwen2", "qwen3", "qwen3moe" */
    int n_vocab;             /* rows of token_embd */
    int dim;                 /* embedding width */
    int n_layers;            /* the model's layers: block_count less the MTP layers */
    int n_nextn;             /* {arch}.nextn_predict_layers: MTP layers stored after them */
    int n_heads;
    int n_kv_heads;          /* n_heads is a multiple of it (GQA) */
    int head_dim;            /* {arch}.attention.key_length, default dim/n_heads */
    int ffn_dim;             /* {arch}.feed_forward_length (MoE: the expert's when absent) */
    int n_expert;            /* {arch}.expert_count; 0 for a dense model */
    int n_expert_used;       /* {arch}.expert_used_count: experts per token (top-k) */
    int expert_ffn;          /* {arch}.expert_feed_forward_length: an expert's hidden size */
    int n_shared;            /* {arch}.expert_shared_count (deepseek2) */
    int n_dense_lead;        /* {arch}.leading_dense_block_count: dense FFN layers first */
    bool router_sigmoid;     /* {arch}.expert_gating_func 2 (V3) instead of softmax */
    bool router_norm;        /* renormalise the chosen experts' weights */
    bool router_logit_topk;  /* gpt-oss: experts chosen on the logits, their weights the
                              * softmax over the chosen ones' logits */
    float swiglu_limit;      /* gpt-oss's clamped SwiGLU (alpha 1.702, this limit), 0: plain */
    int n_swa;               /* {arch}.attention.sliding_window (gpt-oss), 0: none */
    int swa_pattern;         /* {arch}.attention.sliding_window_pattern: of each swa_pattern
                              * layers all but the last are windowed (llama.cpp's set_swa_pattern;
                              * 0: every layer) */
    float router_scale;      /* {arch}.expert_weights_scale, 0 or 1: none */
    int n_groups, n_groups_used; /* group-limited routing (V3), n_groups 0 or 1: none */
    /* multi-head latent attention (deepseek2): the pool holds ONE kv head of head_dim =
     * kv_lora + n_rot values per token (the normed latent, then the roped key part), which is
     * also the value (its first kv_lora values) */
    bool mla;
    int q_lora;              /* 0: no query low-rank projection */
    int kv_lora;             /* latent size */
    int nope_dim;            /* per-head query dims without RoPE (key_length_mla - n_rot) */
    int v_dim;               /* per-head value dims (value_length_mla) */
    float att_scale;         /* score scale: 1/sqrt(head_dim), MLA 1/sqrt(nope_dim + n_rot) */
    int n_ctx_train;         /* {arch}.context_length */
    model_pool pooling;      /* {arch}.pooling_type, MODEL_POOL_NONE without it */
    float rms_eps;           /* {arch}.attention.layer_norm_rms_epsilon */
    float rope_base;         /* {arch}.rope.freq_base, default 10000 */
    float rope_freq_scale;   /* 1/factor for linear scaling, else 1 */
    int n_rot;               /* rotated dims per head, {arch}.rope.dimension_count */
    bool rope_neox;          /* false: interleaved pairs (llama), true: halves (qwen) */
    const float *rope_inv_freq; /* (n_rot/2) radians per position, scaling folded in */
    float rope_theta_scale;  /* powf(rope_base, -2/n_rot), ggml's per-pair angle step */
    const float *rope_freq_factors; /* (n_rot/2) divisors per pair (llama3 scaling) or NULL */
    float rope_attn_factor;  /* llama.cpp's attn_factor: cos/sin multiplier, 1 unless YaRN */
    float rope_yarn[3];      /* YaRN: ext_factor (0: none), the ramp's corr dims (ggml's) */
    float attn_temp_scale;   /* mistral3: queries at p scaled by 1 + this * ln(floor(p /
                              * attn_temp_floor) + 1) after RoPE (Llama 4's); 0: none */
    int attn_temp_floor;     /* positions per step of that scale */
    /* gemma3 (0 / false for other families) */
    float rope_base_swa;     /* window layers' RoPE base ({arch}.rope.freq_base_swa) */
    float rope_theta_scale_swa; /* powf(rope_base_swa, -2/n_rot): the window layers rotate with
                              * it and no frequency scaling; 0: every layer as rope_theta_scale */
    float embd_scale;        /* token embeddings times this (sqrt(dim)); 0: as stored */
    float logit_softcap;     /* final logits c * tanh(logit / c) with this c; 0: none */
    /* gemma4 */
    int n_pl;                /* embedding_length_per_layer_input: per-layer embedding width, 0: none */
    int n_kv_layers;         /* layers that keep K/V (block_count - shared_kv_layers); the rest
                              * read an earlier layer's (model_layer.kv_src) */
    bool ffn_gelu;           /* dense FFN gelu(gate) * up (ggml's tanh GELU), not SwiGLU */
    /* Qwen3.5's linear-attention layers (0 for other families) */
    int ssm_conv;            /* {arch}.ssm.conv_kernel: causal conv taps */
    int ssm_k_heads;         /* {arch}.ssm.group_count: q and k heads */
    int ssm_v_heads;         /* {arch}.ssm.time_step_rank: v heads, a multiple of the k heads;
                              * v head h reads q/k head h % ssm_k_heads */
    int ssm_head;            /* {arch}.ssm.state_size: q, k and v head size (inner_size / v heads) */
    int n_recurrent;         /* linear-attention layers */
    /* encoders (bert) */
    bool bidirectional;      /* attention sees every position of its sequence, before and after:
                              * a sequence is computed whole in one step, and it has no logits */
    float norm_eps;          /* {arch}.attention.layer_norm_epsilon (LayerNorm) */
} model_hparams;

typedef struct model {
    gguf *g;                 /* the open file; weights point into its mapping */
    model_hparams hp;
    ops_weight tok_embd;     /* (n_vocab, dim) any supported type; rows dequantised on use */
    const float *output_norm;/* (dim) f32 */
    ops_weight output;       /* (n_vocab, dim); the token_embd view when tied */
    bool tied_output;        /* output is token_embd */
    const float *cls_out;    /* (n_cls_out, dim) f32: a reranker's score head (cls.output, llama.cpp's
                              * Qwen3-Reranker: the "yes" and "no" rows), or NULL */
    int n_cls_out;
    model_layer *layers;     /* (n_layers + n_nextn): the MTP layers follow the model's */
    model_layer *mtp;        /* (n_nextn) layers + n_layers, or NULL: no MTP layers */
    bool mtp_view;           /* a view of one MTP layer (model_mtp_view): its steps take the
                              * model's hidden states (engine_batch.hidden) */
    const float *trunk_norm; /* (dim) f32, an MTP view's: the model's output norm, which the
                              * model's hidden states pass through before the view reads them
                              * (the state llama.cpp's and vLLM's MTP drafts are fed); NULL else */
    uint8_t fingerprint[32]; /* SHA-256, see the file comment */
    char fingerprint_hex[65];
    /* owned f32 copies of the 1-D tensors, freed with the model */
    float **owned;           /* (n_owned) */
    int n_owned;
    void *repacked;          /* repacked matrices, one 64-byte aligned allocation, or NULL */
    size_t repacked_bytes;   /* its size */
    struct model_dsv4 *dsv4; /* DeepSeek V4's own hyper-parameters and tensors (model_dsv4.h), or NULL */
    struct model_dflash *dflash; /* a DFlash drafter's own tensors (model_dflash.h), or NULL */
    /* bert's input: token row + token type 0's row + the position's row, then a LayerNorm */
    const float *type_row;   /* (dim) f32 token_types row 0 ("sentence A"), or NULL */
    const float *pos_embd;   /* (n_ctx_train, dim) f32 absolute position embeddings, or NULL
                              * (nomic-bert: RoPE) */
    const float *embd_norm;  /* (dim) f32 token_embd_norm weight */
    const float *embd_norm_b;/* (dim) f32 its bias */
    /* gemma4's per-layer embeddings (hp.n_pl > 0): each token's per-layer input, (n_layers, n_pl),
     * is (rmsnorm(pl_model_proj(x0) / sqrt(dim)) * pl_proj_norm + pl_tok_embd[token] *
     * sqrt(n_pl)) / sqrt(2), x0 the scaled token embedding */
    ops_weight pl_tok_embd;  /* (n_vocab, n_layers * n_pl) any type; rows dequantised on use */
    ops_weight pl_model_proj;/* (n_layers * n_pl, dim) */
    const float *pl_proj_norm; /* (n_pl) f32 */
} model;

typedef struct {
    bool no_fingerprint_bytes; /* leave the file's bytes out of the fingerprint (tests) */
    bool no_fingerprint_cache; /* hash the file even when a cache entry holds its digest */
    bool no_repack;            /* keep every matrix in the file's layout */
} model_opts;

/* Loads PATH. Returns GGUF_OK and *out, or an error status (any gguf_status: the file's own
 * problems from gguf_open, GGUF_ERR_MISSING for a missing key/tensor, GGUF_ERR_SHAPE for a
 * tensor of the wrong shape, GGUF_ERR_TYPE for an unsupported architecture or tensor type)
 * with a one-line message naming the problem in err, and *out = NULL. opts may be NULL. */
gguf_status model_load(const char *path, const model_opts *opts, model **out, char *err, size_t errsz);
void model_free(model *m);

/* A view of m's MTP layer i (< hp.n_nextn) as a one-layer model for an engine of its own
 * (the draft of speculative decoding): that layer, its head norm and head (or m's), its
 * embedding (or m's), m's hyper-parameters; it shares m's weights and must not outlive m or
 * be passed to model_free (free() the struct). The fingerprint differs from m's. */
void model_mtp_view(const model *m, int i, model *out);

/* Dequantises row `token` of the embedding into out (dim floats). token must be in range. */
void model_embed_row(const model *m, int32_t token, float *out);

/* The attention window of layer il: a query at position p sees keys p - w + 1 .. p, where w is
 * the result; 0 for a layer of full (causal) attention. The engine and the KV pool read it. */
static inline int model_layer_window(const model *m, int il) { return m->layers[il].window; }

/* Expert e's slice of a stacked expert tensor (gate_exps, up_exps, down_exps): a view of
 * w->rows / n_expert rows. */
ops_weight model_expert(const ops_weight *w, int n_expert, int e);

/* What model_resident did. */
typedef struct {
    size_t file_bytes;       /* bytes of the file mapping faulted in (page-rounded) */
    size_t anon_bytes;       /* bytes of repacked (owned) weights, resident since the load */
    double seconds;          /* wall time of the call */
    bool populate;           /* MADV_POPULATE_READ did it (else a touch of every page) */
    bool huge;               /* the kernel accepted MADV_HUGEPAGE on the mapped weights */
} model_resident_info;

/* Faults every weight that the model reads from the file mapping into this process (the
 * token embedding, every matrix, router and expert; not the repacked ones, which live in
 * owned memory), split over the pool's threads (NULL: the caller), after asking for huge
 * pages and read-ahead (MADV_HUGEPAGE, MADV_WILLNEED: advice the file system may ignore), so
 * that the first requests do not pay for page faults. Pages may still be evicted later under
 * memory pressure, like any page cache. info may be NULL. */
void model_resident(model *m, threadpool *tp, model_resident_info *info);

/* Bytes of all weight matrices (every expert included). */
size_t model_weight_bytes(const model *m);
/* Bytes of the weight matrices that one token reads: for a MoE model the router and
 * n_expert_used experts per layer instead of all of them (the same as model_weight_bytes for
 * a dense model). */
size_t model_active_weight_bytes(const model *m);

#endif
