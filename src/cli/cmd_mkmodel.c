/*
 * cmd_mkmodel: writes a random-weight GGUF model of a real architecture and shape, which
 * llama.cpp also loads: the test and benchmark models of tokenmill.
 *
 *   tokenmill mkmodel --arch llama|qwen2|qwen3|qwen3moe|deepseek2|mistral4|gpt-oss|phi3|mistral3|qwen35|qwen35moe|gemma3|glm4moe|gemma4|deepseek4 [--preset NAME] [shape options] [--vocab FILE]
 *                     --type T --seed S [--tied|--untied] [--rope-scaling llama3] -o OUT.gguf
 *
 * Tensors and metadata follow llama.cpp's converters: `llama` (rope_freqs.weight when
 * --rope-scaling llama3), `qwen2` (q/k/v biases), `qwen3` (per-head q/k RMSNorm weights,
 * key/value_length = head_dim), `qwen3moe` (qwen3 attention; per layer an F32 router
 * ffn_gate_inp and the experts as 3-D ffn_{gate,up,down}_exps tensors, with expert_count,
 * expert_used_count and expert_feed_forward_length), `gpt-oss` (q/k/v/o biases, attn_sinks,
 * post_attention_norm, a router bias, expert biases, attention.sliding_window, YaRN factor 32;
 * --type mxfp4 is llama.cpp's MXFP4_MOE: experts in MXFP4, other matrices in Q8_0), `phi3`
 * (Phi-4-mini's: fused attn_qkv and ffn_up, 3/4 of each head rotated, LongRoPE's factor tensors
 * and attn_factor when the context exceeds 4096, sliding_window 0), `mistral3` (llama's tensors,
 * Ministral 3's YaRN and attention temperature keys), `qwen35`/`qwen35moe` (Qwen3.5's: every 4th
 * layer full attention with the query's gate (attn_q twice as wide) and q/k norms, a quarter of
 * each head rotated over three interleaved M-RoPE sections; the others gated delta nets:
 * attn_qkv, attn_gate, ssm_beta/alpha, an F32 ssm_conv1d of 4 taps, ssm_dt.bias, ssm_a < 0,
 * ssm_norm, ssm_out; post_attention_norm; the MoE with its gated shared expert), `gemma3` (qwen3's head norms, post_attention_norm and
 * post_ffw_norm, attention.sliding_window (--window, default 512) on 5 of each 6 layers,
 * rope.freq_base_swa 10000 and, past a 32768-token context, linear scaling 8 for the global
 * layers, as conversion/gemma.py writes Gemma 3's; tied embeddings), `gemma4` (gemma3's tensors
 * with 5 of each 6 layers window ones of --head-dim and the 6th global, twice as wide heads, a
 * quarter of the kv heads, no attn_v, proportional RoPE (rope_freqs), a layer_output_scale, the
 * soft cap 30, as conversion/gemma.py's Gemma4Model writes them; no per-layer embeddings, shared
 * KV layers or experts), `deepseek4` (DeepSeek V4's, as
 * conversion/deepseek.py writes them and tests/oracle/gguf_dsv4.py lists them: --plain-layers
 * leading layers uncompressed (dsv4-tiny 1, deepseek-v4-flash 2) then compression ratios 4
 * and 128 in turn, the compressors and the lightning
 * indexer, the grouped low-rank output, sinks, 4 hyper-connection streams, the sqrt-softplus
 * router with --hash-layers hash-routed lead layers (an I32 tid2eid table of distinct experts per token) and
 * a selection bias after it, the clamped SwiGLU experts and a shared one; untied; --type mxfp4
 * as gpt-oss's), `glm4moe` (GLM-4.5's as Glm4MoeModel writes it: q/k/v biases, half of each
 * head rotated (NEOX), post_attention_norm, a dense lead layer (--dense-layers, default 1), then
 * an F32 router with its exp_probs_b selection bias, the experts and a shared expert
 * (--shared-experts, default 1), the sigmoid gating, normalised weights and --routed-scale
 * keys), `mistral4` (deepseek2's tensors and keys under Mistral 4's name, as Mistral3Model's
 * Mistral4Model converter writes them). Norms, biases and rope factors stay F32; every matrix gets
 * --type (q4_1, q5_0, q5_1, q2_k, q3_k, iq4_nl, iq4_xs, iq3_xxs, iq3_s, iq2_s, tq1_0, tq2_0 too, ggml's reference quantisers; every matrix
 * in the one type), for q3_k_m llama.cpp's Q3_K_M mix (Q3_K, attn_v/ffn_down/attn_output in Q4_K/Q5_K, output Q6_K),
 * or for q4_k_m / q5_k_m the Q4_K (Q5_K) / Q6_K mix of llama.cpp's Q4_K_M / Q5_K_M (output or tied embedding,
 * and attn_v/ffn_down of "more bits" layers, in Q6_K). A matrix whose rows do not fit the
 * block size falls back to Q8_0, then F16, as llama.cpp's quantiser does.
 *
 * Weights: uniform noise of a chosen standard deviation, linear layers 1/sqrt(fan_in), the
 * output embedding scaled so that logits have a standard deviation near 8 (greedy choices are
 * rarely near ties, so token-for-token comparisons with llama.cpp are stable), norm weights
 * near 1. Each row has its own generator seeded from (seed, tensor name, row), so the output
 * is the same for a seed whatever the thread count. Tensors are generated and quantised at
 * write time (gguf_writer_add_tensor_fill), rows split across threads.
 *
 * `--mtp-out FILE` (deepseek4) also writes the model's MTP-only file as the converter's `--mtp`
 * does (DeepseekV4Model with mtp_only; tests/oracle/gguf_dsv4.py --mtp): the model's keys with
 * block_count and the per-layer arrays one longer (the block's ratio 0), nextn_predict_layers 1,
 * the shared embedding, output norm and head (the model's bytes: seeds come from names), the
 * block's own head collapse (output_hc_*, drawn as mtp.0.hc_head_*) and blk.<layers>.*: an
 * uncompressed V4 layer routed by its bias, with nextn.eh_proj, enorm, hnorm, shared_head_norm.
 *
 * `--nextn N` (deepseek2, glm4moe) appends N multi-token prediction layers as llama.cpp's converter
 * writes DeepSeek-V3's: block_count counts them, nextn_predict_layers = N, and each is a whole
 * layer (MoE, as V3's) plus nextn.eh_proj [2 dim, dim], nextn.enorm, nextn.hnorm,
 * nextn.shared_head_norm, nextn.embed_tokens and nextn.shared_head_head (copies of the
 * model's embedding and output head, as V3's checkpoint holds them). The model's own tensors
 * are the same bytes with and without them (seeds come from tensor names).
 *
 * Vocabulary: --vocab copies every tokenizer.* key of a GGUF, or reads a Hugging Face
 * tokenizer.json (BPE; its added_tokens as the converter writes them: "special" ones control
 * tokens, the others user-defined); without it a small byte-level BPE vocabulary is
 * generated. --chat-template FILE stores that text as tokenizer.chat_template (replacing a
 * GGUF vocabulary's own), as the converter copies tokenizer_config.json's.
 *
 * This file is the driver (options, presets, vocabulary, weights, common keys, the write);
 * each family's keys and layer tensors are in cmd_mkmodel_arch.c (cmd_mkmodel_int.h).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "cli/cmd_mkmodel_int.h"
#include "cli/cmd_opts.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/util.h"

enum { MK_TT_NORMAL = 1, MK_TT_CONTROL = 3, MK_TT_USER = 4, MK_TT_UNUSED = 5 };

typedef struct {
    const char *name;
    const char *arch;       /* NULL: any */
    int n_layers, dim, ffn, n_heads, n_kv_heads, head_dim, ctx, n_vocab;
    double rope_base;       /* 0: the arch default */
    bool tied;
    bool rope_llama3;
    int n_expert, n_expert_used, expert_ffn;  /* MoE presets */
    /* deepseek2: multi-head latent attention and its MoE */
    int q_lora, kv_lora, nope_dim, rope_dim, v_dim, n_shared, n_dense;
    bool sigmoid, w_norm;
    double w_scale;
    int n_groups, n_groups_used;
    int n_swa;              /* gpt-oss: sliding window (every other layer); gemma3: 5 of 6 */
    int ssm_k_heads, ssm_v_heads, ssm_state;   /* qwen35: the linear layers' q/k heads, v heads, head size */
    /* deepseek4: output groups and each's rank, the indexer's heads, head size and top-k, the
     * hash-routed leading layers, the leading uncompressed (window-only) layers */
    int o_groups, o_lora, idx_heads, idx_dim, idx_topk, n_hash, n_plain;
    /* gemma4: per-layer embedding width (E2B/E4B), trailing layers reading an earlier layer's
     * K/V, and whether the global layers have their own V (attention_k_eq_v false) */
    int n_pl, n_shared_kv;
    bool v_global;
} mk_preset;

static const mk_preset mk_presets[] = {
    { .name = "tiny", .n_layers = 2, .dim = 256, .ffn = 512, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .ctx = 2048,
      .n_vocab = 1024, .tied = true },
    { .name = "small", .n_layers = 4, .dim = 512, .ffn = 1536, .n_heads = 8, .n_kv_heads = 4, .head_dim = 64, .ctx = 4096,
      .n_vocab = 4096, .tied = true },
    { .name = "qwen3-0.6b", .arch = "qwen3", .n_layers = 28, .dim = 1024, .ffn = 3072, .n_heads = 16, .n_kv_heads = 8,
      .head_dim = 128, .ctx = 40960, .n_vocab = 151936, .rope_base = 1e6, .tied = true },
    { .name = "qwen2-0.5b", .arch = "qwen2", .n_layers = 24, .dim = 896, .ffn = 4864, .n_heads = 14, .n_kv_heads = 2,
      .head_dim = 64, .ctx = 32768, .n_vocab = 151936, .rope_base = 1e6, .tied = true },
    { .name = "llama3.2-1b", .arch = "llama", .n_layers = 16, .dim = 2048, .ffn = 8192, .n_heads = 32, .n_kv_heads = 8,
      .head_dim = 64, .ctx = 131072, .n_vocab = 128256, .rope_base = 500000, .tied = true, .rope_llama3 = true },
    { .name = "qwen3-30b-a3b", .arch = "qwen3moe", .n_layers = 48, .dim = 2048, .ffn = 6144, .n_heads = 32, .n_kv_heads = 4,
      .head_dim = 128, .ctx = 40960, .n_vocab = 151936, .rope_base = 1e6, .n_expert = 128, .n_expert_used = 8,
      .expert_ffn = 768 },
    { .name = "deepseek-v2-lite", .arch = "deepseek2", .n_layers = 27, .dim = 2048, .ffn = 10944, .n_heads = 16,
      .n_kv_heads = 1, .head_dim = 192, .ctx = 163840, .n_vocab = 102400, .rope_base = 10000, .n_expert = 64,
      .n_expert_used = 6, .expert_ffn = 1408, .kv_lora = 512, .nope_dim = 128, .rope_dim = 64, .v_dim = 128,
      .n_shared = 2, .n_dense = 1, .w_scale = 1.0 },
    { .name = "deepseek-v3", .arch = "deepseek2", .n_layers = 61, .dim = 7168, .ffn = 18432, .n_heads = 128,
      .n_kv_heads = 1, .head_dim = 192, .ctx = 163840, .n_vocab = 129280, .rope_base = 10000, .n_expert = 256,
      .n_expert_used = 8, .expert_ffn = 2048, .q_lora = 1536, .kv_lora = 512, .nope_dim = 128, .rope_dim = 64,
      .v_dim = 128, .n_shared = 1, .n_dense = 3, .sigmoid = true, .w_norm = true, .w_scale = 2.5, .n_groups = 8,
      .n_groups_used = 4 },
    /* gpt-oss: 64 query heads of 64 over 8 kv heads, a 128-token window on even layers,
     * YaRN from 4096 positions (factor 32), the o200k vocabulary padded to 201088 */
    { .name = "gpt-oss-20b", .arch = "gpt-oss", .n_layers = 24, .dim = 2880, .ffn = 2880, .n_heads = 64,
      .n_kv_heads = 8, .head_dim = 64, .ctx = 131072, .n_vocab = 201088, .rope_base = 150000, .n_expert = 32,
      .n_expert_used = 4, .expert_ffn = 2880, .n_swa = 128 },
    { .name = "gpt-oss-120b", .arch = "gpt-oss", .n_layers = 36, .dim = 2880, .ffn = 2880, .n_heads = 64,
      .n_kv_heads = 8, .head_dim = 64, .ctx = 131072, .n_vocab = 201088, .rope_base = 150000, .n_expert = 128,
      .n_expert_used = 4, .expert_ffn = 2880, .n_swa = 128 },
    /* Phi-4-mini-instruct's config.json: 3/4 of each head rotated, LongRoPE from 4096
     * positions to 131072, the o200k vocabulary padded to 200064, tied embeddings */
    { .name = "phi-4-mini", .arch = "phi3", .n_layers = 32, .dim = 3072, .ffn = 8192, .n_heads = 24, .n_kv_heads = 8,
      .head_dim = 128, .ctx = 131072, .n_vocab = 200064, .rope_base = 10000, .tied = true },
    /* Ministral 3 14B (Ministral-3-14B-*-2512, the text model): 40 layers of 5120, 32 q heads
     * of 128 over 8 kv heads, FFN 16384, RoPE base 1e9 with YaRN x16 to 262144, the 131072
     * Tekken vocabulary, untied */
    { .name = "ministral3-14b", .arch = "mistral3", .n_layers = 40, .dim = 5120, .ffn = 16384, .n_heads = 32,
      .n_kv_heads = 8, .head_dim = 128, .ctx = 262144, .n_vocab = 131072, .rope_base = 1e9 },
    /* Ministral 3 8B (Ministral-3-8B-Base-2512, the text model, as transformers'
     * Ministral3Config defaults give it; NVIDIA's Megatron-Bridge page agrees on 34 layers of
     * 4096 and 32 q heads over 8 kv heads): heads of 128, FFN 14336, RoPE base 1e6 with YaRN
     * x16 from 16384 to 262144, the 131072 Tekken vocabulary, untied */
    { .name = "ministral3-8b", .arch = "mistral3", .n_layers = 34, .dim = 4096, .ffn = 14336, .n_heads = 32,
      .n_kv_heads = 8, .head_dim = 128, .ctx = 262144, .n_vocab = 131072, .rope_base = 1e6 },
    /* Qwen3.5-4B's config.json: 32 layers, every 4th full attention (16 q heads of 256 over 4
     * kv heads, a quarter rotated), the others gated delta nets of 16 q/k heads and 32 v heads
     * of 128 with 4 conv taps; 248320 tokens, tied embeddings, RoPE base 1e7 */
    { .name = "qwen3.5-4b", .arch = "qwen35", .n_layers = 32, .dim = 2560, .ffn = 9216, .n_heads = 16, .n_kv_heads = 4,
      .head_dim = 256, .ctx = 262144, .n_vocab = 248320, .rope_base = 1e7, .tied = true, .ssm_k_heads = 16,
      .ssm_v_heads = 32, .ssm_state = 128 },
    /* Qwen3.5-35B-A3B (the text model; docs/architectures.md "Preset sources"): 40 layers of
     * 2048 (llama.cpp's qwen35moe names that depth 35B-A3B), every 4th full attention (16 q heads
     * of 256 over 2 kv heads, a quarter rotated), the others gated delta nets of 16 q/k heads and
     * 32 v heads of 128; in every layer 256 experts of 512 (8 per token) and a gated shared
     * expert of 512; 248320 tokens, untied, RoPE base 1e7. The config has no dense FFN: ffn is
     * the expert's size, which llama.cpp does not read when the expert size is given. */
    { .name = "qwen3.5-35b-a3b", .arch = "qwen35moe", .n_layers = 40, .dim = 2048, .ffn = 512, .n_heads = 16,
      .n_kv_heads = 2, .head_dim = 256, .ctx = 262144, .n_vocab = 248320, .rope_base = 1e7, .n_expert = 256,
      .n_expert_used = 8, .expert_ffn = 512, .ssm_k_heads = 16, .ssm_v_heads = 32, .ssm_state = 128 },
    /* GLM-4.5-Air (zai-org/GLM-4.5-Air's config.json): 46 layers of 4096 (llama.cpp's glm4moe
     * names that depth 106B-A12B), 96 q heads of 128 over 8 kv heads, half of each head rotated,
     * the first layer dense (FFN 10944), then 128 experts of 1408 with 8 per token and one shared,
     * routed_scaling_factor 1, norm_topk_prob; 151552 tokens, 131072 positions, rope_theta 1e6,
     * untied; add --nextn 1 for its MTP layer */
    { .name = "glm-4.5-air", .arch = "glm4moe", .n_layers = 46, .dim = 4096, .ffn = 10944, .n_heads = 96,
      .n_kv_heads = 8, .head_dim = 128, .ctx = 131072, .n_vocab = 151552, .rope_base = 1e6, .n_expert = 128,
      .n_expert_used = 8, .expert_ffn = 1408, .n_shared = 1, .n_dense = 1, .sigmoid = true, .w_norm = true,
      .w_scale = 1.0 },
    /* Gemma 3 (google/gemma-3-{1b,4b,12b,27b}-it config.json, the 4b..27b text_config): a
     * 512 / 1024-token window on 5 of each 6 layers, global layers with rope_theta 1e6 (linear
     * scaling 8 past 1b's 32768 positions), tied embeddings of 262144 tokens (4b..27b's configs
     * say 262208: the converter keeps only the tokenizer's 262144 rows) */
    { .name = "gemma-3-1b", .arch = "gemma3", .n_layers = 26, .dim = 1152, .ffn = 6912, .n_heads = 4, .n_kv_heads = 1,
      .head_dim = 256, .ctx = 32768, .n_vocab = 262144, .rope_base = 1e6, .tied = true, .n_swa = 512 },
    { .name = "gemma-3-4b", .arch = "gemma3", .n_layers = 34, .dim = 2560, .ffn = 10240, .n_heads = 8, .n_kv_heads = 4,
      .head_dim = 256, .ctx = 131072, .n_vocab = 262144, .rope_base = 1e6, .tied = true, .n_swa = 1024 },
    { .name = "gemma-3-12b", .arch = "gemma3", .n_layers = 48, .dim = 3840, .ffn = 15360, .n_heads = 16, .n_kv_heads = 8,
      .head_dim = 256, .ctx = 131072, .n_vocab = 262144, .rope_base = 1e6, .tied = true, .n_swa = 1024 },
    { .name = "gemma-3-27b", .arch = "gemma3", .n_layers = 62, .dim = 5376, .ffn = 21504, .n_heads = 32, .n_kv_heads = 16,
      .head_dim = 128, .ctx = 131072, .n_vocab = 262144, .rope_base = 1e6, .tied = true, .n_swa = 1024 },
    /* Qwen3.5-27B (the text model; docs/architectures.md "Preset sources"): 64 layers of 5120
     * (llama.cpp's qwen35 names that depth 27B), FFN 17408, every 4th full attention (24 q heads
     * of 256 over 4 kv heads, a quarter rotated), the others gated delta nets of 16 q/k heads and
     * 48 v heads of 128; 248320 tokens, untied, RoPE base 1e7 */
    { .name = "qwen3.5-27b", .arch = "qwen35", .n_layers = 64, .dim = 5120, .ffn = 17408, .n_heads = 24, .n_kv_heads = 4,
      .head_dim = 256, .ctx = 262144, .n_vocab = 248320, .rope_base = 1e7, .ssm_k_heads = 16, .ssm_v_heads = 48,
      .ssm_state = 128 },
    /* Gemma 4 (the text models; docs/architectures.md "Preset sources"): 5 window layers of
     * heads of 256 then a global one of heads of 512 (mkmodel's gemma4 layer), RoPE bases 1e4
     * (window) and 1e6 (global, a quarter rotated), 262144 tied tokens, soft cap 30.
     * 31B: 60 layers of 5376, FFN 21504, 32 q heads over 16 kv heads (4 on the global layers,
     * V = K there), window 1024. */
    { .name = "gemma4-31b", .arch = "gemma4", .n_layers = 60, .dim = 5376, .ffn = 21504, .n_heads = 32, .n_kv_heads = 16,
      .head_dim = 256, .ctx = 262144, .n_vocab = 262144, .rope_base = 1e6, .tied = true, .n_swa = 1024 },
    /* 26B-A4B: 30 layers of 2816, a dense MLP of 2112 beside 128 experts of 704 (8 per token),
     * 16 q heads over 8 kv heads (2 on the global layers, V = K there), window 1024 */
    { .name = "gemma4-26b-a4b", .arch = "gemma4", .n_layers = 30, .dim = 2816, .ffn = 2112, .n_heads = 16,
      .n_kv_heads = 8, .head_dim = 256, .ctx = 262144, .n_vocab = 262144, .rope_base = 1e6, .tied = true,
      .n_expert = 128, .n_expert_used = 8, .expert_ffn = 704, .n_swa = 1024 },
    /* E4B: 42 layers of 2560, FFN 10240, 8 q heads over 2 kv heads (on the global layers too,
     * with their own V), window 512, per-layer embeddings of 256, the last 18 layers reading
     * the K/V of layers 22 (window) and 23 (global), 131072 positions */
    { .name = "gemma4-e4b", .arch = "gemma4", .n_layers = 42, .dim = 2560, .ffn = 10240, .n_heads = 8, .n_kv_heads = 2,
      .head_dim = 256, .ctx = 131072, .n_vocab = 262144, .rope_base = 1e6, .tied = true, .n_swa = 512, .n_pl = 256,
      .n_shared_kv = 18, .v_global = true },
    /* DeepSeek V4's test shape (tests/oracle/gguf_dsv4.py's): 4 layers of ratios 0, 4, 128, 4,
     * 4 heads of 64 (16 rotated) over one kv head, 8 experts of 64 (2 per token) and one shared,
     * the indexer's 8 heads of 64 keeping 6 entries, 2 output groups of rank 32, one hash layer */
    { .name = "dsv4-tiny", .arch = "deepseek4", .n_layers = 4, .dim = 128, .ffn = 64, .n_heads = 4, .n_kv_heads = 1,
      .head_dim = 64, .ctx = 4096, .n_vocab = 1024, .rope_base = 10000, .n_expert = 8, .n_expert_used = 2,
      .expert_ffn = 64, .q_lora = 64, .rope_dim = 16, .n_shared = 1, .w_scale = 1.5, .n_swa = 16, .o_groups = 2,
      .o_lora = 32, .idx_heads = 8, .idx_dim = 64, .idx_topk = 6, .n_hash = 1, .n_plain = 1 },
    /* DeepSeek-V4-Flash (deepseek-ai/DeepSeek-V4-Flash's config.json as the model card and
     * NeMo AutoModel's model page give it, docs/deepseek4.md "mkmodel"): 43 layers of 4096, 64
     * heads of 512 (64 rotated) over one kv head, q rank 1024, 8 output groups of rank 1024, a
     * 128-token window, layers 0-1 uncompressed then ratios 4 and 128 in turn, the indexer's 64
     * heads of 128 keeping 512 entries, 256 experts of 2048 (6 per token, scale 1.5) and one
     * shared, 3 hash-routed layers, 129280 tokens, 1M positions. */
    { .name = "deepseek-v4-flash", .arch = "deepseek4", .n_layers = 43, .dim = 4096, .ffn = 2048, .n_heads = 64,
      .n_kv_heads = 1, .head_dim = 512, .ctx = 1048576, .n_vocab = 129280, .rope_base = 10000, .n_expert = 256,
      .n_expert_used = 6, .expert_ffn = 2048, .q_lora = 1024, .rope_dim = 64, .n_shared = 1, .w_scale = 1.5,
      .n_swa = 128, .o_groups = 8, .o_lora = 1024, .idx_heads = 64, .idx_dim = 128, .idx_topk = 512, .n_hash = 3,
      .n_plain = 2 },
    /* DeepSeek-V4-Pro (docs/deepseek4.md "mkmodel"): 61 layers of 7168, 128 heads of 512 (64
     * rotated) over one kv head, q rank 1536, 16 output groups of rank 1024, the 128-token
     * window, 384 experts of 3072 (6 per token, scale 2.5) and one shared, 3 hash-routed
     * layers, the indexer's 64 heads of 128 keeping 1024 entries; V4-Flash's ratio pattern */
    { .name = "deepseek-v4-pro", .arch = "deepseek4", .n_layers = 61, .dim = 7168, .ffn = 3072, .n_heads = 128,
      .n_kv_heads = 1, .head_dim = 512, .ctx = 1048576, .n_vocab = 129280, .rope_base = 10000, .n_expert = 384,
      .n_expert_used = 6, .expert_ffn = 3072, .q_lora = 1536, .rope_dim = 64, .n_shared = 1, .w_scale = 2.5,
      .n_swa = 128, .o_groups = 16, .o_lora = 1024, .idx_heads = 64, .idx_dim = 128, .idx_topk = 1024, .n_hash = 3,
      .n_plain = 2 },
};


/* ---- vocabulary ------------------------------------------------------------------------ */

typedef struct {
    char **tok;             /* (n) token texts */
    size_t *len;            /* (n) byte lengths */
    int32_t *type;          /* (n) llama token types */
    int n, cap;
    char **merges;          /* (n_merges) "a b" */
    int n_merges, cap_merges;
    int bos, eos, pad;      /* ids, -1 if none */
    bool add_bos;
    const char *pre;        /* tokenizer.ggml.pre */
    gguf *src;              /* GGUF vocabulary source (keys copied), or NULL */
    char *chat_template;    /* tokenizer.chat_template to write (--chat-template), or NULL */
} mk_vocab;

static void mk_vocab_free(mk_vocab *v)
{
    if (v->tok)
        for (int i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->len);
    free(v->type);
    for (int i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->merges);
    free(v->chat_template);
    if (v->src) gguf_close(v->src);
}

static void mk_vocab_set(mk_vocab *v, int id, const char *s, size_t len, int32_t type)
{
    if (id >= v->cap) {
        int ncap = v->cap ? v->cap : 1024;
        while (ncap <= id) ncap *= 2;
        v->tok = xrealloc(v->tok, (size_t)ncap * sizeof *v->tok);
        v->len = xrealloc(v->len, (size_t)ncap * sizeof *v->len);
        v->type = xrealloc(v->type, (size_t)ncap * sizeof *v->type);
        for (int i = v->cap; i < ncap; i++) v->tok[i] = NULL;
        v->cap = ncap;
    }
    while (v->n <= id) {
        v->tok[v->n] = NULL;
        v->len[v->n] = 0;
        v->type[v->n] = MK_TT_UNUSED;
        v->n++;
    }
    free(v->tok[id]);
    v->tok[id] = xmalloc(len + 1);
    memcpy(v->tok[id], s, len);
    v->tok[id][len] = 0;
    v->len[id] = len;
    v->type[id] = type;
}

static int mk_vocab_add(mk_vocab *v, const char *s, int32_t type)
{
    int id = v->n;
    mk_vocab_set(v, id, s, strlen(s), type);
    return id;
}

static void mk_vocab_merge(mk_vocab *v, const char *a, const char *b)
{
    if (v->n_merges == v->cap_merges) {
        v->cap_merges = v->cap_merges ? 2 * v->cap_merges : 1024;
        v->merges = xrealloc(v->merges, (size_t)v->cap_merges * sizeof *v->merges);
    }
    size_t la = strlen(a), lb = strlen(b);
    char *m = xmalloc(la + lb + 2);
    memcpy(m, a, la);
    m[la] = ' ';
    memcpy(m + la + 1, b, lb + 1);
    v->merges[v->n_merges++] = m;
}

/* Fills empty ids (and pads up to N) with "[PADi]" unused tokens, as llama.cpp's converter. */
static void mk_vocab_pad(mk_vocab *v, int n)
{
    if (n > v->n) mk_vocab_set(v, n - 1, "", 0, MK_TT_UNUSED);
    for (int i = 0; i < v->n; i++) {
        if (v->tok[i] && v->len[i] > 0) continue;
        char b[32];
        snprintf(b, sizeof b, "[PAD%d]", i);
        mk_vocab_set(v, i, b, strlen(b), MK_TT_UNUSED);
    }
}

/* GPT-2's byte -> printable code point map, UTF-8 encoded into out (<= 3 bytes + NUL). */
static void mk_byte_unicode(int b, char *out)
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

/* A byte-level BPE vocabulary of exactly N tokens: 256 bytes, merges of letter groups (with
 * and without a leading space), then three control tokens. */
static bool mk_vocab_builtin(mk_vocab *v, const char *arch, int n)
{
    const int n_special = 3;
    if (n < 256 + n_special) {
        fprintf(stderr, "tokenmill mkmodel: a generated vocabulary needs at least %d tokens\n", 256 + n_special);
        return false;
    }
    char u[8];
    for (int b = 0; b < 256; b++) {
        mk_byte_unicode(b, u);
        mk_vocab_add(v, u, MK_TT_NORMAL);
    }
    const char *sp = "\xc4\xa0"; /* 'Ġ', the byte-level space */
    int want = n - n_special;
    char a[16], b2[16], m[32];
    /* stage 1: space + lowercase letter; 2: letter pairs; 3: space + capital;
     * 4: space-letter + letter; 5: letter pair + letter */
    for (int stage = 1; stage <= 5 && v->n < want; stage++) {
        for (int i = 0; i < 26 && v->n < want; i++) {
            int jn = stage == 1 || stage == 3 ? 1 : 26;
            for (int j = 0; j < jn && v->n < want; j++) {
                int kn = stage == 5 ? 26 : 1;
                for (int k = 0; k < kn && v->n < want; k++) {
                    switch (stage) {
                    case 1: snprintf(a, sizeof a, "%s", sp); snprintf(b2, sizeof b2, "%c", 'a' + i); break;
                    case 2: snprintf(a, sizeof a, "%c", 'a' + i); snprintf(b2, sizeof b2, "%c", 'a' + j); break;
                    case 3: snprintf(a, sizeof a, "%s", sp); snprintf(b2, sizeof b2, "%c", 'A' + i); break;
                    case 4: snprintf(a, sizeof a, "%s%c", sp, 'a' + i); snprintf(b2, sizeof b2, "%c", 'a' + j); break;
                    default: snprintf(a, sizeof a, "%c%c", 'a' + i, 'a' + j); snprintf(b2, sizeof b2, "%c", 'a' + k); break;
                    }
                    snprintf(m, sizeof m, "%s%s", a, b2);
                    mk_vocab_merge(v, a, b2);
                    mk_vocab_add(v, m, MK_TT_NORMAL);
                }
            }
        }
    }
    while (v->n < want) { /* only for huge requests: unreachable filler */
        snprintf(m, sizeof m, "[PAD%d]", v->n);
        mk_vocab_add(v, m, MK_TT_UNUSED);
    }
    if (!strcmp(arch, "llama")) {
        v->bos = mk_vocab_add(v, "<|begin_of_text|>", MK_TT_CONTROL);
        v->eos = mk_vocab_add(v, "<|end_of_text|>", MK_TT_CONTROL);
        mk_vocab_add(v, "<|eot_id|>", MK_TT_CONTROL);
        v->add_bos = true;
        v->pre = "llama-bpe";
    } else {
        v->eos = v->bos = v->pad = mk_vocab_add(v, "<|endoftext|>", MK_TT_CONTROL);
        mk_vocab_add(v, "<|im_start|>", MK_TT_CONTROL);
        mk_vocab_add(v, "<|im_end|>", MK_TT_CONTROL);
        v->add_bos = false;
        v->pre = "qwen2";
    }
    return true;
}

/* A Hugging Face tokenizer.json with a BPE model (Qwen2/3 style). */
static bool mk_vocab_tokenizer_json(mk_vocab *v, const char *path, int pad_to, const char *arch)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        fprintf(stderr, "tokenmill mkmodel: %s:%d: %s\n", path, jerr.line, jerr.text);
        return false;
    }
    bool ok = false;
    json_t *jmodel = json_object_get(root, "model");
    json_t *vocab = json_object_get(jmodel, "vocab");
    json_t *merges = json_object_get(jmodel, "merges");
    const char *mtype = json_string_value(json_object_get(jmodel, "type"));
    if (!json_is_object(vocab) || !json_is_array(merges) || (mtype && strcmp(mtype, "BPE"))) {
        fprintf(stderr, "tokenmill mkmodel: %s: not a BPE tokenizer.json (model.vocab/model.merges)\n", path);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= 1 << 24) {
            fprintf(stderr, "tokenmill mkmodel: %s: bad id for token '%s'\n", path, key);
            goto out;
        }
        mk_vocab_set(v, (int)id, key, strlen(key), MK_TT_NORMAL);
    }
    size_t i;
    json_array_foreach(merges, i, val) {
        if (json_is_string(val)) {
            const char *s = json_string_value(val), *spc = strchr(s, ' ');
            if (!spc) continue;
            char *a = xmalloc((size_t)(spc - s) + 1);
            memcpy(a, s, (size_t)(spc - s));
            a[spc - s] = 0;
            mk_vocab_merge(v, a, spc + 1);
            free(a);
        } else if (json_is_array(val) && json_array_size(val) == 2) {
            const char *a = json_string_value(json_array_get(val, 0)), *b = json_string_value(json_array_get(val, 1));
            if (a && b) mk_vocab_merge(v, a, b);
        }
    }
    json_t *added = json_object_get(root, "added_tokens");
    json_array_foreach(added, i, val) {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        const char *content = json_string_value(json_object_get(val, "content"));
        if (!content || id < 0 || id >= 1 << 24) continue;
        bool special = json_is_true(json_object_get(val, "special"));
        mk_vocab_set(v, (int)id, content, strlen(content), special ? MK_TT_CONTROL : MK_TT_USER);
    }
    mk_vocab_pad(v, pad_to);
    v->bos = v->eos = v->pad = -1;
    v->add_bos = false;
    /* o200k (gpt-oss) as llama.cpp's converter writes it: the gpt-4o pre-tokenizer (its split
       regex is the one with the cased-letter classes), bos <|startoftext|>, eos <|return|>,
       pad <|endoftext|>; DeepSeek V3's (and V4's, which adds tokens to it): the deepseek-v3
       pre-tokenizer, bos <｜begin▁of▁sentence｜> added, eos and pad <｜end▁of▁sentence｜>, as
       its tokenizer_config.json names them; the Qwen vocabularies: <|endoftext|> for all
       three */
    char *pre = json_dumps(json_object_get(root, "pre_tokenizer"), JSON_COMPACT);
    bool o200k = pre && strstr(pre, "p{Lu}") && strstr(pre, "p{Ll}") && strstr(pre, "p{N}{1,3}");
    free(pre);
    v->pre = o200k ? "gpt-4o" : "qwen2";
    bool deepseek = false;
    for (int k = 0; k < v->n && !o200k && !deepseek; k++) deepseek = v->tok[k] && !strcmp(v->tok[k], "<｜begin▁of▁sentence｜>");
    if (deepseek) {
        v->pre = "deepseek-v3";
        v->add_bos = true;
    }
    for (int k = 0; k < v->n; k++) {
        if (deepseek) {
            if (!strcmp(v->tok[k], "<｜begin▁of▁sentence｜>")) v->bos = k;
            if (!strcmp(v->tok[k], "<｜end▁of▁sentence｜>")) v->eos = v->pad = k;
        } else if (o200k) {
            if (!strcmp(v->tok[k], "<|startoftext|>")) v->bos = k;
            if (!strcmp(v->tok[k], "<|return|>")) v->eos = k;
            if (!strcmp(v->tok[k], "<|endoftext|>")) v->pad = k;
        } else if (!strcmp(v->tok[k], "<|endoftext|>")) {
            v->bos = v->eos = v->pad = k;
        }
    }
    ok = true;
out:
    json_decref(root);
    return ok;
}

static bool mk_vocab_load(mk_vocab *v, const char *path, const mk_opts *o, int pad_to)
{
    v->bos = v->eos = v->pad = -1;
    if (!path) return mk_vocab_builtin(v, o->arch, o->n_vocab);
    size_t pl = strlen(path);
    if (pl >= 5 && !strcmp(path + pl - 5, ".gguf")) {
        char err[512];
        if (gguf_open(path, &v->src, err, sizeof err) != GGUF_OK) {
            fprintf(stderr, "tokenmill mkmodel: %s\n", err);
            return false;
        }
        gguf_vtype elt;
        uint64_t n;
        if (!gguf_get_arr(v->src, "tokenizer.ggml.tokens", &elt, &n, NULL) || elt != GGUF_VT_STRING || n == 0) {
            fprintf(stderr, "tokenmill mkmodel: %s: no tokenizer.ggml.tokens\n", path);
            return false;
        }
        v->n = (int)n;
        return true;
    }
    return mk_vocab_tokenizer_json(v, path, pad_to, o->arch);
}

static void mk_vocab_write(mk_vocab *v, gguf_writer *w)
{
    if (v->chat_template) gguf_writer_set_str(w, "tokenizer.chat_template", v->chat_template);
    if (v->src) {
        for (int i = 0; i < gguf_n_keys(v->src); i++) {
            const char *k = gguf_key_name(v->src, i);
            if (v->chat_template && !strcmp(k, "tokenizer.chat_template")) continue;
            if (!strncmp(k, "tokenizer.", 10)) gguf_writer_copy_key(w, v->src, k);
        }
        return;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->len, (uint64_t)v->n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->type, (uint64_t)v->n);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL, (uint64_t)v->n_merges);
    if (v->bos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->eos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (v->pad >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
}

/* ---- weights ------------------------------------------------------------------------- */


typedef struct {
    const mk_tensor *t;
    uint8_t *dst;           /* tensor data */
    int64_t r0, r1;         /* rows of this thread */
} mk_job;

static uint64_t mk_hash(uint64_t h, const char *s)
{
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

static void *mk_fill_rows(void *arg)
{
    mk_job *j = arg;
    const mk_tensor *t = j->t;
    float *row = xmalloc((size_t)t->ne0 * sizeof *row);
    size_t rb = quant_row_bytes(t->type, t->ne0);
    const float a = t->std * 1.7320508f; /* uniform [-a, a) has standard deviation std; norms: std is the mean */
    for (int64_t r = j->r0; r < j->r1; r++) {
        util_rng rng;
        util_rng_seed(&rng, t->seed ^ ((uint64_t)r * 0x9E3779B97F4A7C15ULL));
        for (int64_t i = 0; i < t->ne0; i++) {
            uint64_t x = util_rng_next(&rng);
            float u = (float)(x >> 40) * (1.0f / 8388608.0f) - 1.0f; /* [-1, 1) */
            row[i] = t->init == MK_INIT_NORM ? t->std * (1.0f + 0.2f * u) : a * u;
            if (t->init == MK_INIT_SKEW) row[i] += (float)(t->o->router_skew * (double)i / (double)(t->ne0 - 1));
        }
        quant_quantize_row(t->type, row, j->dst + (size_t)r * rb, t->ne0);
    }
    free(row);
    return NULL;
}

/* llama 3 rope frequency factors, as llama.cpp's converter computes them (factor 8). */
static void mk_rope_freqs(const mk_opts *o, float *out)
{
    const double factor = 8.0, low = 1.0, high = 4.0, old_ctx = 8192.0;
    const double low_wl = old_ctx / low, high_wl = old_ctx / high;
    int dim = o->head_dim;
    for (int i = 0; i < dim / 2; i++) {
        double freq = 1.0 / pow(o->rope_base, (double)(2 * i) / dim);
        double wl = 2 * M_PI / freq;
        if (wl < high_wl) out[i] = 1.0f;
        else if (wl > low_wl) out[i] = (float)factor;
        else {
            double smooth = (old_ctx / wl - low) / (high - low);
            out[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

/* deepseek4's hash routing table: per token (row) ne0 distinct experts, a partial shuffle of
 * 0..n_expert-1 with the row's generator. */
static void mk_tid2eid(const mk_tensor *t, int32_t *dst)
{
    const int ne = t->o->n_expert;
    int32_t *perm = xmalloc((size_t)ne * sizeof *perm);
    for (int64_t r = 0; r < t->nrows; r++) {
        util_rng rng;
        util_rng_seed(&rng, t->seed ^ ((uint64_t)r * 0x9E3779B97F4A7C15ULL));
        for (int i = 0; i < ne; i++) perm[i] = i;
        for (int64_t i = 0; i < t->ne0; i++) {
            int j = (int)i + (int)(util_rng_next(&rng) % (uint64_t)(ne - i));
            int32_t x = perm[i];
            perm[i] = perm[j], perm[j] = x;
            dst[r * t->ne0 + i] = perm[i];
        }
    }
    free(perm);
}

static void mk_fill(void *ctx, const char *name, void *dst, size_t nbytes)
{
    const mk_tensor *t = ctx;
    if (t->init == MK_INIT_ROPE_FREQS) {
        mk_rope_freqs(t->o, dst);
        return;
    }
    if (t->init == MK_INIT_TID2EID) {
        mk_tid2eid(t, dst);
        return;
    }
    if (t->init == MK_INIT_PROPORTIONAL) {
        float *f = dst;
        for (int64_t i = 0; i < t->ne0; i++) f[i] = i < t->ne0 / 4 ? 1.0f : 1e30f;
        return;
    }
    int nth = t->o->n_threads;
    if (t->nrows < 4 * nth) nth = 1;
    mk_job jobs[64];
    pthread_t th[64];
    if (nth > 64) nth = 64;
    for (int i = 0; i < nth; i++) {
        jobs[i] = (mk_job){ .t = t, .dst = dst, .r0 = t->nrows * i / nth, .r1 = t->nrows * (i + 1) / nth };
        if (i > 0 && pthread_create(&th[i], NULL, mk_fill_rows, &jobs[i]) != 0) {
            mk_fill_rows(&jobs[i]);
            th[i] = 0;
        }
    }
    mk_fill_rows(&jobs[0]);
    for (int i = 1; i < nth; i++)
        if (th[i]) pthread_join(th[i], NULL);
    if (isatty(2)) fprintf(stderr, "\r  %-32s %-5s %12zu bytes", name, quant_type_name(t->type), nbytes);
}

/* The storage type of a matrix with rows of NE0 for the requested type T, with llama.cpp's
 * fallbacks when the row does not fit T's block. */
static qtype mk_fit_type(qtype t, int64_t ne0)
{
    if (ne0 % quant_block_elems(t) == 0) return t;
    if (ne0 % QK8_0 == 0) return QTYPE_Q8_0;
    return QTYPE_F16;
}

static bool mk_use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}


/* The seed of the tensor named name (mk_add3 draws with it): a copy under another name draws the same. */
uint64_t mk_seed_of(const mk_opts *o, const char *name)
{
    return mk_hash(0xcbf29ce484222325ULL ^ o->seed * 0x9E3779B97F4A7C15ULL, name);
}

/* A tensor of 1..3 dims (ne2 > 1: 3-D, a stack of ne2 matrices of ne1 rows). */
void mk_add3(mk_model *m, const char *name, mk_init init, float std, qtype type, int n_dims, int64_t ne0, int64_t ne1,
             int64_t ne2)
{
    if (m->n == m->cap) {
        /* descriptors are referenced by the writer: allocate once, large enough */
        fprintf(stderr, "tokenmill mkmodel: internal: too many tensors\n");
        abort();
    }
    mk_tensor *t = &m->ts[m->n++];
    int64_t ne[3] = { ne0, ne1, ne2 };
    if (n_dims >= 2) type = mk_fit_type(type, ne0);
    *t = (mk_tensor){ .seed = mk_seed_of(m->o, name), .init = init,
                      .std = std, .type = type, .ne0 = ne0, .nrows = n_dims >= 2 ? ne1 * ne2 : 1, .o = m->o };
    gguf_writer_add_tensor_fill(m->w, name, type, n_dims, ne, mk_fill, t);
}

void mk_add(mk_model *m, const char *name, mk_init init, float std, qtype type, int n_dims, int64_t ne0, int64_t ne1)
{
    mk_add3(m, name, init, std, type, n_dims, ne0, ne1, 1);
}

static bool mk_parse_type(const char *s, qtype *base, bool *k_m, uint32_t *ftype)
{
    static const struct { const char *name; qtype t; bool k_m; uint32_t ftype; } types[] = {
        { "f32", QTYPE_F32, false, 0 }, { "f16", QTYPE_F16, false, 1 }, { "bf16", QTYPE_BF16, false, 32 },
        { "q8_0", QTYPE_Q8_0, false, 7 }, { "q4_0", QTYPE_Q4_0, false, 2 }, { "q4_k", QTYPE_Q4_K, false, 14 },
        { "q4_k_m", QTYPE_Q4_K, true, 15 }, { "q3_k_m", QTYPE_Q3_K, true, 12 }, { "q5_k", QTYPE_Q5_K, false, 16 }, { "q5_k_m", QTYPE_Q5_K, true, 17 },
        { "q6_k", QTYPE_Q6_K, false, 18 },
        /* every matrix in the one type (llama.cpp's Q2_K / Q3_K_* mixes raise some to Q4_K+;
         * the file type says the nearest of its mixes) */
        { "q4_1", QTYPE_Q4_1, false, 3 }, { "q5_0", QTYPE_Q5_0, false, 8 }, { "q5_1", QTYPE_Q5_1, false, 9 },
        { "q2_k", QTYPE_Q2_K, false, 10 }, { "q3_k", QTYPE_Q3_K, false, 11 },
        { "iq4_nl", QTYPE_IQ4_NL, false, 25 }, { "iq4_xs", QTYPE_IQ4_XS, false, 30 },
        /* llama.cpp's MXFP4_MOE: experts in MXFP4, every other matrix in Q8_0 */
        { "mxfp4", QTYPE_Q8_0, false, 38 },
        /* ternary (ggml's quantize_row_tq{1,2}_0_ref), IQ3_XXS, IQ3_S and IQ2_S (ggml's
         * quantisers without an importance matrix); the other codebook types need ggml's
         * importance matrix or a search not ported (quant_iq.h) */
        { "tq1_0", QTYPE_TQ1_0, false, 36 }, { "tq2_0", QTYPE_TQ2_0, false, 37 }, { "iq3_xxs", QTYPE_IQ3_XXS, false, 23 },
        { "iq3_s", QTYPE_IQ3_S, false, 26 }, { "iq2_s", QTYPE_IQ2_S, false, 28 },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(types); i++) {
        if (!strcasecmp(s, types[i].name)) {
            *base = types[i].t, *k_m = types[i].k_m, *ftype = types[i].ftype;
            return true;
        }
    }
    return false;
}

/* Every key before the vocabulary's: general.*, then the architecture's hyper-parameters
 * (a reranker's labels and prompt, each family's own). */
static void mk_write_keys(gguf_writer *w, const mk_opts *o, int64_t V, qtype base, uint32_t ftype, const char *preset)
{
    const char *A = o->arch;
    char k[128], name[128];
    gguf_writer_set_str(w, "general.architecture", A);
    /* not "phi3": llama.cpp then looks up Phi-3's special tokens by text in the vocabulary */
    snprintf(name, sizeof name, "tokenmill-random-%s-%s-seed%llu", strcmp(A, "phi3") ? A : "phi", preset ? preset : "custom",
             (unsigned long long)o->seed);
    gguf_writer_set_str(w, "general.name", name);
    gguf_writer_set_u32(w, "general.file_type", ftype);
    if (base != QTYPE_F32 && base != QTYPE_F16 && base != QTYPE_BF16) gguf_writer_set_u32(w, "general.quantization_version", 2);
#define MK_KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, A), k)
    gguf_writer_set_u32(w, MK_KEY("block_count"), (uint32_t)(o->n_layers + o->n_nextn));
    if (o->n_nextn > 0) gguf_writer_set_u32(w, MK_KEY("nextn_predict_layers"), (uint32_t)o->n_nextn);
    gguf_writer_set_u32(w, MK_KEY("context_length"), (uint32_t)o->ctx);
    if (o->pooling >= 0) gguf_writer_set_u32(w, MK_KEY("pooling_type"), (uint32_t)o->pooling);
    if (o->pooling == MODEL_POOL_RANK) {   /* Qwen3-Reranker's labels and prompt, as llama.cpp's converter writes them */
        static const char *const labels[2] = { "yes", "no" };
        static const size_t label_lens[2] = { 3, 2 };
        gguf_writer_set_arr_str(w, MK_KEY("classifier.output_labels"), labels, label_lens, 2);
    }
    if (o->pooling == MODEL_POOL_RANK)
        gguf_writer_set_str(w, "tokenizer.chat_template.rerank",
                            "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
                            "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                            "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
                            "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
                            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    gguf_writer_set_u32(w, MK_KEY("embedding_length"), (uint32_t)o->dim);
    gguf_writer_set_u32(w, MK_KEY("feed_forward_length"), (uint32_t)o->ffn);
    gguf_writer_set_u32(w, MK_KEY("attention.head_count"), (uint32_t)o->n_heads);
    const bool one_kv = mk_is_mla(A) || !strcmp(A, "deepseek4");   /* latent / V4's single kv row */
    gguf_writer_set_u32(w, MK_KEY("attention.head_count_kv"), one_kv ? 1u : (uint32_t)o->n_kv_heads);
    gguf_writer_set_f32(w, MK_KEY("rope.freq_base"), (float)o->rope_base);
    gguf_writer_set_f32(w, MK_KEY("attention.layer_norm_rms_epsilon"), (float)o->eps);
    mk_arch_keys(w, o);
    gguf_writer_set_u32(w, MK_KEY("vocab_size"), (uint32_t)V);
    if (o->n_expert > 0) {
        gguf_writer_set_u32(w, MK_KEY("expert_count"), (uint32_t)o->n_expert);
        gguf_writer_set_u32(w, MK_KEY("expert_used_count"), (uint32_t)o->n_expert_used);
        gguf_writer_set_u32(w, MK_KEY("expert_feed_forward_length"), (uint32_t)o->expert_ffn);
    }
#undef MK_KEY
}

static int mk_write(const mk_opts *o, mk_vocab *v, const char *out, const char *preset)
{
    qtype base = QTYPE_F32;
    bool k_m = false;
    uint32_t ftype = 0;
    mk_parse_type(o->type, &base, &k_m, &ftype);
    const char *A = o->arch;
    const int64_t dim = o->dim, V = v->n;
    const bool moe = o->n_expert > 0;
    gguf_writer *w = gguf_writer_new();
    char name[128];
    mk_write_keys(w, o, V, base, ftype, preset);
    mk_vocab_write(v, w);

    mk_model m = { .w = w, .o = o, .base = base, .k_m = k_m, .n_vocab = V, .cap = 16 + 48 * (o->n_layers + o->n_nextn) };
    m.ts = xcalloc((size_t)m.cap, sizeof *m.ts);
    /* Embeddings are small (0.5/sqrt(dim)) so that, with a tied output, the input token's own
     * embedding in the residual stream does not dominate the logits (random models otherwise
     * just repeat their input); the final norm's weights (about 20) scale logits back up to a
     * standard deviation of about 10. */
    float emb_std = 0.5f / sqrtf((float)dim);
    qtype out_type = k_m ? QTYPE_Q6_K : base;
    mk_add(&m, "token_embd.weight", MK_INIT_NOISE, emb_std, o->tied ? out_type : base, 2, dim, V);
    mk_add(&m, "output_norm.weight", MK_INIT_NORM, 20.0f, QTYPE_F32, 1, dim, 1);
    if (!o->tied) mk_add(&m, "output.weight", MK_INIT_NOISE, emb_std, out_type, 2, dim, V);
    /* a reranker's score head: the rows of "yes" and "no" (llama.cpp's cls.output) */
    if (o->pooling == MODEL_POOL_RANK) mk_add(&m, "cls.output.weight", MK_INIT_NOISE, 0.05f / sqrtf((float)dim), QTYPE_F32, 2, dim, 2);  /* scores of about 1 */
    if (!strcmp(A, "phi3") && o->ctx > 4096) {   /* LongRoPE's divisors: short near 1, long near 8 */
        mk_add(&m, "rope_factors_long.weight", MK_INIT_NORM, 8.0f, QTYPE_F32, 1, o->rope_dim / 2, 1);
        mk_add(&m, "rope_factors_short.weight", MK_INIT_NORM, 1.0f, QTYPE_F32, 1, o->rope_dim / 2, 1);
    }
    if (o->rope_llama3) mk_add(&m, "rope_freqs.weight", MK_INIT_ROPE_FREQS, 0, QTYPE_F32, 1, o->head_dim / 2, 1);
    if (!strcmp(A, "gemma4")) mk_add(&m, "rope_freqs.weight", MK_INIT_PROPORTIONAL, 0, QTYPE_F32, 1, o->head_dim, 1);
    if (o->n_pl > 0) {   /* gemma4's per-layer embeddings: a row of every layer's per token */
        const int64_t plw = (int64_t)o->n_layers * o->n_pl;
        mk_add(&m, "per_layer_token_embd.weight", MK_INIT_NOISE, 1.0f, base, 2, plw, V);
        mk_add(&m, "per_layer_model_proj.weight", MK_INIT_NOISE, 1.0f / sqrtf((float)dim), base, 2, dim, plw);
        mk_add(&m, "per_layer_proj_norm.weight", MK_INIT_NORM, 1.0f, QTYPE_F32, 1, o->n_pl, 1);
    }
    if (!strcmp(A, "deepseek4")) {   /* the head's mix of the hyper-connection streams */
        /* an MTP-only file's are its block's own (mtp.0.hc_head_*): drawn under those names */
        static const char *const hc_names[2][3] = {
            { "output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight" },
            { "mtp.0.hc_head_fn", "mtp.0.hc_head_base", "mtp.0.hc_head_scale" } };
        const char *const *hn = hc_names[o->mtp_only];
        mk_add(&m, hc_names[0][0], MK_INIT_NOISE, 1.0f / sqrtf((float)(o->n_hc * dim)), QTYPE_F32, 2, o->n_hc * dim, o->n_hc);
        m.ts[m.n - 1].seed = mk_seed_of(o, hn[0]);
        mk_add(&m, hc_names[0][1], MK_INIT_NOISE, 0.5f, QTYPE_F32, 1, o->n_hc, 1);
        m.ts[m.n - 1].seed = mk_seed_of(o, hn[1]);
        mk_add(&m, hc_names[0][2], MK_INIT_NORM, 1.0f, QTYPE_F32, 1, 1, 1);
        m.ts[m.n - 1].seed = mk_seed_of(o, hn[2]);
    }
    for (int l = o->mtp_only ? o->n_layers : 0; l < o->n_layers + o->n_nextn; l++) {   /* the MTP layers last */
        qtype more = k_m && l < o->n_layers && mk_use_more_bits(l, o->n_layers) ? QTYPE_Q6_K : base;
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        mk_add(&m, name, MK_INIT_NORM, 1.0f, QTYPE_F32, 1, dim, 1);
        mk_arch_layer(&m, l, more, emb_std, out_type);
    }
    double t0 = util_now();
    char err[512];
    gguf_status st = gguf_writer_write(w, out, err, sizeof err);
    if (isatty(2)) fprintf(stderr, "\n");
    if (st != GGUF_OK) fprintf(stderr, "tokenmill mkmodel: %s\n", err);
    else
        fprintf(stderr, "tokenmill mkmodel: wrote %s: %s%s, %d layers, dim %d, ffn %d, heads %d/%d x %d, vocab %lld, %s, %s output"
                "%s%.0d%s%.0d%s%.0d (%.1f s)\n",
                out, A, o->mtp_only ? " MTP-only (the block after them)" : "", o->n_layers, o->dim, o->ffn, o->n_heads, o->n_kv_heads, o->head_dim, (long long)V, o->type,
                o->tied ? "tied" : "untied", moe ? ", experts " : "", o->n_expert, moe ? " (" : "", o->n_expert_used,
                moe ? " used) x ffn " : "", o->expert_ffn, util_now() - t0);
    gguf_writer_free(w);
    free(m.ts);
    return st == GGUF_OK ? 0 : 1;
}

/* The command line as given, before the preset fills the gaps: 0, -1 (where 0 is a value)
 * or NULL is "not given". */
typedef struct {
    const char *preset, *vocab, *out, *rope_scaling, *pooling, *router, *chat_template;
    const char *mtp_out;            /* deepseek4: the MTP-only companion's path */
    long layers, dim, ffn, heads, kv, hd, ctx, nv, threads;     /* shape options */
    long experts, experts_used, expert_ffn, window, nextn;
    long per_layer, shared_kv;      /* gemma4 */
    long q_lora, kv_lora, rope_dim, nope_dim, v_dim, shared, dense, groups, groups_used;   /* deepseek2 */
    long o_groups, o_lora, idx_heads, idx_dim, idx_topk, hash_layers, plain_layers;   /* deepseek4; -1 for the last two */
    double routed_scale;
    double router_skew;             /* deepseek2 --router-skew */
    int tied;                       /* 1 --tied, 0 --untied, -1 the preset's */
    double rope_base, eps;          /* 0: the preset's or the arch's */
} mk_args;

/* Says why --type T cannot be written: read but not written (needs an importance matrix,
 * or its quantiser is not ported), or unknown. */
static void mk_type_refused(const char *type)
{
    int id = -1;   /* a type tokenmill reads but cannot write says so */
    for (int i = 0; i < QTYPE_COUNT_MAX && id < 0; i++)
        if (quant_ggml_type_name(i) && !strcasecmp(quant_ggml_type_name(i), type) && quant_weight_type(i)) id = i;
    if (id == QTYPE_IQ2_XXS || id == QTYPE_IQ2_XS || id == QTYPE_IQ1_S)
        fprintf(stderr, "tokenmill mkmodel: type '%s' is read but not written: ggml quantises it only with an "
                "importance matrix\n", type);
    else if (id >= 0)
        fprintf(stderr, "tokenmill mkmodel: type '%s' is read but not written: its quantiser is not ported\n", type);
    else
        fprintf(stderr, "tokenmill mkmodel: unknown type '%s'\n", type);
}

/* The preset called NAME, or NULL. */
static const mk_preset *mk_preset_find(const char *name)
{
    for (size_t i = 0; i < TM_ARRAY_LEN(mk_presets); i++)
        if (!strcmp(name, mk_presets[i].name)) return &mk_presets[i];
    return NULL;
}

/* deepseek4's shape beyond the common options: the V4 parts of the preset (dsv4-tiny's under a
 * preset of another family) unless an option says otherwise; the hash-routed and uncompressed
 * leading layers cut to the layers written. 0, or 2 with a message. */
static int mk_resolve_dsv4(mk_opts *o, const mk_args *a, const mk_preset *p)
{
    const mk_preset *d = p->arch && !strcmp(p->arch, "deepseek4") ? p : mk_preset_find("dsv4-tiny");
    if (a->kv_lora || a->nope_dim || a->v_dim || a->dense >= 0 || a->router || a->groups >= 0 || a->groups_used ||
        a->nextn || a->router_skew > 0) {
        fprintf(stderr, "tokenmill mkmodel: --kv-lora, --nope-dim, --v-dim, --dense-layers, --router, --expert-groups, "
                        "--groups-used, --nextn and --router-skew are for --arch deepseek2\n");
        return 2;
    }
    o->n_expert = a->experts ? (int)a->experts : p->n_expert ? p->n_expert : d->n_expert;
    o->n_expert_used = a->experts_used ? (int)a->experts_used : p->n_expert_used ? p->n_expert_used : d->n_expert_used;
    o->expert_ffn = a->expert_ffn ? (int)a->expert_ffn : p->expert_ffn ? p->expert_ffn : o->ffn;
    o->q_lora = a->q_lora >= 0 ? (int)a->q_lora : d->q_lora;
    o->rope_dim = a->rope_dim ? (int)a->rope_dim : d->rope_dim;
    o->n_shared = a->shared >= 0 ? (int)a->shared : d->n_shared;
    o->w_scale = a->routed_scale > 0 ? a->routed_scale : d->w_scale;
    o->n_swa = a->window ? (int)a->window : d->n_swa;
    o->o_groups = a->o_groups ? (int)a->o_groups : d->o_groups;
    o->o_lora = a->o_lora ? (int)a->o_lora : d->o_lora;
    o->idx_heads = a->idx_heads ? (int)a->idx_heads : d->idx_heads;
    o->idx_dim = a->idx_dim ? (int)a->idx_dim : d->idx_dim;
    o->idx_topk = a->idx_topk ? (int)a->idx_topk : d->idx_topk;
    o->n_hc = 4;
    /* a model cut to fewer layers keeps as many of the leading kinds as fit */
    o->n_hash = TM_MIN(a->hash_layers >= 0 ? (int)a->hash_layers : d->n_hash, o->n_layers);
    o->n_plain = TM_MIN(a->plain_layers >= 0 ? (int)a->plain_layers : d->n_plain, o->n_layers);
    if (a->kv > 1) {
        fprintf(stderr, "tokenmill mkmodel: deepseek4 has one key/value head (--kv-heads 1)\n");
        return 2;
    }
    o->n_kv_heads = 1;   /* one raw key/value row per position, whatever the preset's */
    /* as the loader requires: the heads split into the output groups, the indexer's heads rotate
     * the same dims as the attention's */
    if (o->n_expert_used > o->n_expert || o->q_lora <= 0 || o->n_shared <= 0 || o->rope_dim <= 0 || o->rope_dim % 2 ||
        o->rope_dim >= o->head_dim || o->rope_dim > o->idx_dim || o->n_heads % o->o_groups ||
        (int64_t)o->n_heads * o->head_dim / o->o_groups <= 0 || o->n_swa <= 0) {
        fprintf(stderr, "tokenmill mkmodel: bad deepseek4 options (experts-used <= experts, a positive --q-lora, "
                        "--shared-experts and --window, an even --rope-dim below the head size and at most the "
                        "indexer's head size %d, heads a multiple of the %d output groups)\n",
                o->idx_dim, o->o_groups);
        return 2;
    }
    return 0;
}

/* glm4moe's experts, lead and router from the options, else GLM's preset's, else 16 experts
 * of a quarter of the FFN with 4 per token, one shared, one dense layer, scale 1; 0, or 2 with
 * a message. */
static int mk_resolve_glm4moe(mk_opts *o, const mk_args *a, const mk_preset *p)
{
    const bool glm = p->arch && !strcmp(p->arch, "glm4moe");
    if (a->q_lora >= 0 || a->kv_lora || a->rope_dim || a->nope_dim || a->v_dim || a->router || a->groups >= 0 ||
        a->groups_used || a->router_skew > 0) {
        fprintf(stderr, "tokenmill mkmodel: the MLA, --router, --expert-groups, --groups-used and --router-skew options "
                        "are for --arch deepseek2 (glm4moe's router is sigmoid, without groups)\n");
        return 2;
    }
    o->n_expert = a->experts ? (int)a->experts : glm ? p->n_expert : 16;
    o->n_expert_used = a->experts_used ? (int)a->experts_used : glm ? p->n_expert_used : 4;
    o->expert_ffn = a->expert_ffn ? (int)a->expert_ffn : glm ? p->expert_ffn : TM_MAX(o->ffn / 4, 16);
    o->n_shared = a->shared >= 0 ? (int)a->shared : glm ? p->n_shared : 1;
    o->n_dense = a->dense >= 0 ? (int)a->dense : glm ? p->n_dense : 1;
    o->w_scale = a->routed_scale > 0 ? a->routed_scale : glm ? p->w_scale : 1.0;
    o->sigmoid = o->w_norm = true;
    o->n_nextn = (int)a->nextn;
    if (o->n_expert_used > o->n_expert || o->n_dense > o->n_layers) {
        fprintf(stderr, "tokenmill mkmodel: bad glm4moe options (experts-used %d <= experts %d, dense layers %d <= layers %d)\n",
                o->n_expert_used, o->n_expert, o->n_dense, o->n_layers);
        return 2;
    }
    return 0;
}

/* The experts, MLA and window of o's architecture from the options, else the preset's or the
 * family's defaults; 0, or 2 with a message when an option does not fit the architecture. */
static int mk_resolve_experts(mk_opts *o, const mk_args *a, const mk_preset *p)
{
    bool mla = mk_is_mla(o->arch), gptoss = !strcmp(o->arch, "gpt-oss");
    const bool g4 = p->arch && !strcmp(p->arch, "gemma4");   /* a Gemma 4 preset's experts and layers */
    if (!strcmp(o->arch, "glm4moe")) {
        return mk_resolve_glm4moe(o, a, p);
    } else if (mla) {
        /* a dense preset under --arch deepseek2: V2-Lite's attention and router on its width */
        const mk_preset *d = !strcmp(p->arch ? p->arch : "", "deepseek2") ? p : mk_preset_find("deepseek-v2-lite");
        o->q_lora = a->q_lora >= 0 ? (int)a->q_lora : d->q_lora;
        o->kv_lora = a->kv_lora ? (int)a->kv_lora : d->kv_lora;
        o->nope_dim = a->nope_dim ? (int)a->nope_dim : d->nope_dim;
        o->rope_dim = a->rope_dim ? (int)a->rope_dim : d->rope_dim;
        o->v_dim = a->v_dim ? (int)a->v_dim : d->v_dim;
        o->n_shared = a->shared >= 0 ? (int)a->shared : d->n_shared;
        o->n_dense = a->dense >= 0 ? (int)a->dense : d->n_dense;
        o->sigmoid = a->router ? !strcmp(a->router, "sigmoid") : d->sigmoid;
        o->w_norm = o->sigmoid ? true : d->w_norm;
        o->w_scale = a->routed_scale > 0 ? a->routed_scale : d->w_scale;
        o->n_groups = a->groups >= 0 ? (int)a->groups : d->n_groups;
        o->n_groups_used = a->groups_used ? (int)a->groups_used : d->n_groups_used;
        o->router_skew = a->router_skew;
        if (o->router_skew > 0 && !o->sigmoid) {
            fprintf(stderr, "tokenmill mkmodel: --router-skew needs --router sigmoid (it skews the selection bias)\n");
            return 2;
        }
        o->n_expert = a->experts ? a->experts : d->n_expert;
        o->n_expert_used = a->experts_used ? a->experts_used : d->n_expert_used;
        o->expert_ffn = a->expert_ffn ? a->expert_ffn : d->expert_ffn;
        o->head_dim = o->nope_dim + o->rope_dim;
        o->n_nextn = (int)a->nextn;
        o->n_kv_heads = o->n_heads;
        if ((a->router && strcmp(a->router, "softmax") && strcmp(a->router, "sigmoid")) || o->n_expert_used > o->n_expert ||
            o->kv_lora <= 0 || o->rope_dim <= 0 || o->rope_dim % 2 || o->nope_dim <= 0 || o->v_dim <= 0 ||
            (o->n_groups > 1 && (o->n_expert % o->n_groups || o->n_groups_used < 1 || o->n_groups_used > o->n_groups))) {
            fprintf(stderr, "tokenmill mkmodel: bad %s options (router softmax|sigmoid, experts-used <= experts, "
                            "positive latent/rope/nope/v dims, experts a multiple of the groups, groups-used in 1..groups)\n", o->arch);
            return 2;
        }
    } else if (!strcmp(o->arch, "deepseek4")) {
        return mk_resolve_dsv4(o, a, p);
    } else if (a->q_lora >= 0 || a->kv_lora || a->rope_dim || a->nope_dim || a->v_dim || a->shared >= 0 || a->dense >= 0 || a->router ||
               a->groups >= 0 || a->groups_used || a->routed_scale > 0 || a->nextn || a->router_skew > 0) {
        fprintf(stderr, "tokenmill mkmodel: the MLA, shared-expert, --router-skew and --nextn options are for --arch deepseek2\n");
        return 2;
    } else if (gptoss) {
        /* a dense preset under --arch gpt-oss: 32 experts, 4 per token, each of the ffn size;
         * a 128-token window */
        o->n_expert = a->experts ? a->experts : p->n_expert ? p->n_expert : 32;
        o->n_expert_used = a->experts_used ? a->experts_used : p->n_expert_used ? p->n_expert_used : 4;
        o->expert_ffn = a->expert_ffn ? a->expert_ffn : p->expert_ffn ? p->expert_ffn : o->ffn;
        o->n_swa = a->window ? (int)a->window : p->n_swa ? p->n_swa : 128;
        if (o->n_expert_used > o->n_expert) {
            fprintf(stderr, "tokenmill mkmodel: --experts-used %d is more than --experts %d\n", o->n_expert_used, o->n_expert);
            return 2;
        }
    } else if (!strcmp(o->arch, "qwen3moe") || !strcmp(o->arch, "qwen35moe")) {
        /* a dense preset under --arch qwen3moe: 8 experts, 2 per token, each of the ffn size */
        o->n_expert = a->experts ? a->experts : p->n_expert ? p->n_expert : 8;
        o->n_expert_used = a->experts_used ? a->experts_used : p->n_expert_used ? p->n_expert_used : 2;
        o->expert_ffn = a->expert_ffn ? a->expert_ffn : p->expert_ffn ? p->expert_ffn : o->ffn;
        if (o->n_expert_used > o->n_expert) {
            fprintf(stderr, "tokenmill mkmodel: --experts-used %d is more than --experts %d\n", o->n_expert_used, o->n_expert);
            return 2;
        }
    } else if (!strcmp(o->arch, "gemma4") && (a->experts || (g4 && p->n_expert))) {
        /* the 26B-A4B's layer: experts beside the dense FFN, the preset's or 2 per token unless
         * asked (a preset's count cut to --experts when that is fewer) */
        o->n_expert = a->experts ? (int)a->experts : p->n_expert;
        o->n_expert_used = a->experts_used ? (int)a->experts_used
                                           : TM_MIN(g4 && p->n_expert_used ? p->n_expert_used : 2, o->n_expert);
        o->expert_ffn = a->expert_ffn ? (int)a->expert_ffn : g4 && p->expert_ffn ? p->expert_ffn : o->ffn;
        if (o->n_expert_used > o->n_expert) {
            fprintf(stderr, "tokenmill mkmodel: --experts-used %d is more than --experts %d\n", o->n_expert_used, o->n_expert);
            return 2;
        }
    } else if (a->experts || a->experts_used || a->expert_ffn) {
        fprintf(stderr, "tokenmill mkmodel: --experts, --experts-used and --expert-ffn are for --arch qwen3moe, qwen35moe, deepseek2, gpt-oss or gemma4\n");
        return 2;
    }
    if (!strncmp(o->arch, "gemma", 5)) o->n_swa = a->window ? (int)a->window : p->n_swa ? p->n_swa : 512;
    if ((a->per_layer || a->shared_kv) && strcmp(o->arch, "gemma4")) {
        fprintf(stderr, "tokenmill mkmodel: --per-layer-embd and --shared-kv-layers are for --arch gemma4\n");
        return 2;
    }
    o->n_pl = a->per_layer ? (int)a->per_layer : g4 ? p->n_pl : 0;
    o->n_shared_kv = a->shared_kv ? (int)a->shared_kv : g4 ? p->n_shared_kv : 0;
    o->v_global = g4 && p->v_global;
    if (o->n_shared_kv > 0) {
        /* llama.cpp's reuse rule: the last layer that keeps K/V is a global one, the one before a
         * window one (layers 5 of each 6 are global here) */
        int last = o->n_layers - o->n_shared_kv - 1;
        if (last < 1 || (last % 6) != 5) {
            fprintf(stderr, "tokenmill mkmodel: --shared-kv-layers %d of %d layers: the last layer keeping K/V (%d) must be "
                            "a global one (5, 11, 17, ...)%s\n", o->n_shared_kv, o->n_layers, last,
                    a->shared_kv ? "" : " (the preset's count: give --shared-kv-layers with --layers)");
            return 2;
        }
    }
    return 0;
}

/* RoPE scaling: the preset's (Llama 3's, DeepSeek's YaRN) unless --rope-scaling says; 0, or
 * 2 with a message. */
static int mk_resolve_rope(mk_opts *o, const mk_args *a, const mk_preset *p)
{
    bool mla = mk_is_mla(o->arch);
    o->rope_llama3 = p->rope_llama3 && !strcmp(o->arch, "llama");
    o->rope_yarn = mla && p->arch && !strcmp(p->arch, "deepseek2");   /* the DeepSeek presets' */
    if (a->rope_scaling) {
        if (!strcmp(a->rope_scaling, "llama3")) o->rope_llama3 = true;
        else if (!strcmp(a->rope_scaling, "yarn") && mla) o->rope_yarn = true;
        else if (!strcmp(a->rope_scaling, "none")) o->rope_llama3 = o->rope_yarn = false;
        else {
            fprintf(stderr, "tokenmill mkmodel: --rope-scaling takes llama3, yarn (deepseek2) or none\n");
            return 2;
        }
    }
    if (o->rope_llama3 && strcmp(o->arch, "llama")) {
        fprintf(stderr, "tokenmill mkmodel: --rope-scaling llama3 is for --arch llama\n");
        return 2;
    }
    return 0;
}

/* The architectures mkmodel writes; false (and said) for another. */
static bool mk_arch_known(const char *arch)
{
    static const char *const known[] = { "llama", "qwen2", "qwen3", "qwen3moe", "deepseek2", "mistral4", "gpt-oss", "phi3",
                                         "mistral3", "qwen35", "qwen35moe", "gemma3", "glm4moe", "gemma4", "deepseek4" };
    for (size_t i = 0; i < TM_ARRAY_LEN(known); i++)
        if (!strcmp(arch, known[i])) return true;
    fprintf(stderr, "tokenmill mkmodel: unknown arch '%s' (", arch);
    for (size_t i = 0; i < TM_ARRAY_LEN(known); i++) fprintf(stderr, "%s%s", i ? ", " : "", known[i]);
    fprintf(stderr, ")\n");
    return false;
}

/* The families that rotate part of each head, and Qwen3.5's linear layers' shape. */
static void mk_partial_rope(mk_opts *o, const mk_preset *p)
{
    if (!strcmp(o->arch, "phi3")) o->rope_dim = o->head_dim * 3 / 4 / 2 * 2;   /* partial_rotary_factor 0.75 */
    if (!strcmp(o->arch, "glm4moe")) o->rope_dim = o->head_dim / 2 / 2 * 2;    /* partial_rotary_factor 0.5 */
    if (!strncmp(o->arch, "qwen35", 6)) {
        /* a quarter of each head rotated; a non-qwen35 preset's linear layers: as many q/k
         * heads as kv heads, twice as many v heads, of half the head size */
        o->rope_dim = TM_MAX(2, o->head_dim / 4 / 2 * 2);
        o->ssm_k_heads = p->ssm_k_heads ? p->ssm_k_heads : o->n_kv_heads;
        o->ssm_v_heads = p->ssm_v_heads ? p->ssm_v_heads : 2 * o->ssm_k_heads;
        o->ssm_state = p->ssm_state ? p->ssm_state : TM_MAX(16, o->head_dim / 2);
    }
}

int cmd_mkmodel(int argc, char **argv)
{
    mk_opts o = { .arch = NULL, .seed = 1, .n_threads = 0 };
    mk_args a = { .q_lora = -1, .shared = -1, .dense = -1, .groups = -1, .tied = -1, .hash_layers = -1, .plain_layers = -1 };
    cmd_opt_u64 seed = { 0 };
    char preset_help[1024];
    size_t ph = (size_t)snprintf(preset_help, sizeof preset_help, "a real model's shape:");
    for (size_t i = 0; i < TM_ARRAY_LEN(mk_presets) && ph < sizeof preset_help; i++)
        ph += (size_t)snprintf(preset_help + ph, sizeof preset_help - ph, " %s", mk_presets[i].name);
    const cmd_opt opts[] = {
        { "--arch", NULL, CMD_OPT_STR, &o.arch, .arg = "llama|qwen2|qwen3|qwen3moe|deepseek2|mistral4|gpt-oss|phi3|mistral3|qwen35|qwen35moe|gemma3|glm4moe|gemma4|deepseek4", .help = "architecture (or the preset's)" },
        { "--preset", NULL, CMD_OPT_STR, &a.preset, .arg = "NAME", .help = preset_help },
        { "--layers", NULL, CMD_OPT_LONG, &a.layers, 0, 4096, .arg = "N", .help = "shape options override the preset's" },
        { "--dim", NULL, CMD_OPT_LONG, &a.dim, 0, 1 << 20, .arg = "N", .help = "hidden size" },
        { "--ffn", NULL, CMD_OPT_LONG, &a.ffn, 0, 1 << 20, .arg = "N", .help = "feed-forward size" },
        { "--heads", NULL, CMD_OPT_LONG, &a.heads, 0, 4096, .arg = "N", .help = "query heads" },
        { "--kv-heads", NULL, CMD_OPT_LONG, &a.kv, 0, 4096, .arg = "N", .help = "key/value heads" },
        { "--head-dim", NULL, CMD_OPT_LONG, &a.hd, 0, 1 << 16, .arg = "N", .help = "per head (default dim / heads)" },
        { "--experts", NULL, CMD_OPT_LONG, &a.experts, 0, 1024, .arg = "N", .help = "qwen3moe, gemma4: experts per layer" },
        { "--experts-used", NULL, CMD_OPT_LONG, &a.experts_used, 0, 1024, .arg = "K", .help = "qwen3moe, gemma4: experts per token" },
        { "--expert-ffn", NULL, CMD_OPT_LONG, &a.expert_ffn, 0, 1 << 20, .arg = "N", .help = "qwen3moe, gemma4: an expert's hidden size" },
        { "--per-layer-embd", NULL, CMD_OPT_LONG, &a.per_layer, 0, 4096, .arg = "N", .help = "gemma4: per-layer embedding width (E2B/E4B's)" },
        { "--shared-kv-layers", NULL, CMD_OPT_LONG, &a.shared_kv, 0, 4096, .arg = "N", .help = "gemma4: last N layers read an earlier layer's K/V" },
        { "--q-lora", NULL, CMD_OPT_LONG, &a.q_lora, 0, 1 << 16, .arg = "N", .help = "deepseek2: query low-rank size (0: none)" },
        { "--kv-lora", NULL, CMD_OPT_LONG, &a.kv_lora, 0, 1 << 16, .arg = "N", .help = "deepseek2: latent (compressed KV) size" },
        { "--nope-dim", NULL, CMD_OPT_LONG, &a.nope_dim, 0, 1 << 12, .arg = "N", .help = "deepseek2: per-head query/key dims without RoPE" },
        { "--rope-dim", NULL, CMD_OPT_LONG, &a.rope_dim, 0, 1 << 12, .arg = "N", .help = "deepseek2: per-head RoPE dims" },
        { "--v-dim", NULL, CMD_OPT_LONG, &a.v_dim, 0, 1 << 12, .arg = "N", .help = "deepseek2: per-head value dims" },
        { "--shared-experts", NULL, CMD_OPT_LONG, &a.shared, 0, 64, .arg = "N", .help = "deepseek2, glm4moe: shared experts" },
        { "--dense-layers", NULL, CMD_OPT_LONG, &a.dense, 0, 4096, .arg = "N", .help = "deepseek2, glm4moe: leading dense layers" },
        { "--router", NULL, CMD_OPT_STR, &a.router, .arg = "softmax|sigmoid", .help = "deepseek2: V2's or V3's router" },
        { "--expert-groups", NULL, CMD_OPT_LONG, &a.groups, 0, 1024, .arg = "G", .help = "deepseek2: group-limited routing" },
        { "--groups-used", NULL, CMD_OPT_LONG, &a.groups_used, 0, 1024, .arg = "N", .help = "deepseek2: groups kept per token" },
        { "--routed-scale", NULL, CMD_OPT_DOUBLE, &a.routed_scale, 0, 1000, .arg = "F", .help = "deepseek2, glm4moe: routed experts' weight scale" },
        { "--router-skew", NULL, CMD_OPT_DOUBLE, &a.router_skew, 0, 100, .arg = "F", .help = "deepseek2 sigmoid router: a load skewed on purpose, expert x's selection bias + F x/(E-1)" },
        { "--nextn", NULL, CMD_OPT_LONG, &a.nextn, 0, 16, .arg = "N", .help = "deepseek2, glm4moe: N multi-token prediction (MTP) layers after the model's" },
        { "--mtp-out", NULL, CMD_OPT_STR, &a.mtp_out, .arg = "FILE.gguf", .help = "deepseek4: also write the model's MTP-only file (llama.cpp's --mtp companion, for --draft FILE --spec mtp)" },
        { "--out-groups", NULL, CMD_OPT_LONG, &a.o_groups, 0, 4096, .arg = "G", .help = "deepseek4: output projection groups" },
        { "--out-lora", NULL, CMD_OPT_LONG, &a.o_lora, 0, 1 << 16, .arg = "N", .help = "deepseek4: each output group's low rank" },
        { "--indexer-heads", NULL, CMD_OPT_LONG, &a.idx_heads, 0, 4096, .arg = "N", .help = "deepseek4: lightning indexer heads" },
        { "--indexer-dim", NULL, CMD_OPT_LONG, &a.idx_dim, 0, 1 << 12, .arg = "N", .help = "deepseek4: indexer head size" },
        { "--indexer-top-k", NULL, CMD_OPT_LONG, &a.idx_topk, 0, 1 << 20, .arg = "K", .help = "deepseek4: compressed entries kept per query" },
        { "--hash-layers", NULL, CMD_OPT_LONG, &a.hash_layers, 0, 4096, .arg = "N", .help = "deepseek4: leading layers routed by token id" },
        { "--plain-layers", NULL, CMD_OPT_LONG, &a.plain_layers, 0, 4096, .arg = "N", .help = "deepseek4: leading uncompressed layers (then ratios 4, 128 in turn)" },
        { "--window", NULL, CMD_OPT_LONG, &a.window, 0, 1 << 24, .arg = "N", .help = "gpt-oss: sliding window of the even layers; gemma3, gemma4: of 5 in 6 layers; deepseek4: of every layer" },
        { "--ctx", NULL, CMD_OPT_LONG, &a.ctx, 0, 1 << 24, .arg = "N", .help = "training context" },
        { "--vocab-size", NULL, CMD_OPT_LONG, &a.nv, 0, 1 << 24, .arg = "N", .help = "without --vocab: a synthetic vocabulary" },
        { "--vocab", NULL, CMD_OPT_STR, &a.vocab, .arg = "FILE.gguf|tokenizer.json", .help = "a real vocabulary" },
        { "--chat-template", NULL, CMD_OPT_STR, &a.chat_template, .arg = "FILE", .help = "store FILE's text as tokenizer.chat_template" },
        { "--type", NULL, CMD_OPT_STR, &o.type, .arg = "T", .help = "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q3_k_m|q4_k|q4_k_m|q5_k|q5_k_m|q6_k|iq4_nl|iq4_xs|iq3_xxs|iq3_s|iq2_s|tq1_0|tq2_0|mxfp4 (mxfp4: gpt-oss experts, the rest q8_0)", .required = true },
        { "--seed", NULL, CMD_OPT_U64, &seed, .arg = "S", .help = "weights' seed", .required = true },
        { "--tied", NULL, CMD_OPT_SET, &a.tied, .set = 1, .help = "output head shares the embedding" },
        { "--pooling", NULL, CMD_OPT_STR, &a.pooling, .arg = "mean|last|rank", .help = "an embedding model's pooling_type (rank: a Qwen3-Reranker, with cls.output and its prompt)" },
        { "--untied", NULL, CMD_OPT_SET, &a.tied, .set = 0, .help = "output head of its own" },
        { "--rope-base", NULL, CMD_OPT_DOUBLE, &a.rope_base, 0, 1e12, .arg = "F", .help = "RoPE frequency base" },
        { "--rope-scaling", NULL, CMD_OPT_STR, &a.rope_scaling, .arg = "llama3|yarn|none", .help = "Llama 3 or (deepseek2) YaRN RoPE scaling" },
        { "--eps", NULL, CMD_OPT_DOUBLE, &a.eps, 0, 1, .arg = "F", .help = "RMS norm epsilon" },
        { "--threads", NULL, CMD_OPT_LONG, &a.threads, 0, 1024, .arg = "N", .help = "threads for quantising" },
        { "--output", "-o", CMD_OPT_STR, &a.out, .arg = "OUT.gguf", .help = "the GGUF to write", .required = true },
        { 0 },
    };
    const char *synopsis = "mkmodel --arch A|--preset P --type T --seed S -o OUT.gguf [options]: a random-weight GGUF";
    cmd_opts_status ost = cmd_opts_parse("mkmodel", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    o.seed = seed.value;
    const mk_preset *p = &mk_presets[0];
    if (a.preset) {
        if (!(p = mk_preset_find(a.preset))) {
            fprintf(stderr, "tokenmill mkmodel: unknown preset '%s'\n", a.preset);
            cmd_opts_hint("mkmodel", synopsis);
            return 2;
        }
    }
    if (!o.arch) o.arch = p->arch;
    if (!a.preset && o.arch && !strcmp(o.arch, "deepseek4")) p = mk_preset_find("dsv4-tiny");   /* its own shape */
    qtype qt;
    bool km;
    uint32_t ft;
    if (!o.arch) {
        fprintf(stderr, "tokenmill mkmodel: --arch (or an arch preset) is required\n");
        cmd_opts_hint("mkmodel", synopsis);
        return 2;
    }
    if (!mk_arch_known(o.arch)) return 2;
    bool gptoss = !strcmp(o.arch, "gpt-oss");
    if (!mk_parse_type(o.type, &qt, &km, &ft)) {
        mk_type_refused(o.type);
        cmd_opts_hint("mkmodel", synopsis);
        return 2;
    }
    bool qwen = strcmp(o.arch, "llama") != 0 && strcmp(o.arch, "phi3") != 0 && strcmp(o.arch, "mistral3") != 0;   /* RoPE base 1e6, eps 1e-6 */
    o.n_layers = a.layers ? a.layers : p->n_layers;
    o.dim = a.dim ? a.dim : p->dim;
    o.ffn = a.ffn ? a.ffn : p->ffn;
    o.n_heads = a.heads ? a.heads : p->n_heads;
    o.n_kv_heads = a.kv ? a.kv : (a.heads ? a.heads : p->n_kv_heads);
    o.head_dim = a.hd ? a.hd : (a.dim || a.heads ? o.dim / o.n_heads : p->head_dim);
    o.ctx = a.ctx ? a.ctx : p->ctx;
    o.pooling = -1;
    if (a.pooling && !strcmp(a.pooling, "mean")) o.pooling = MODEL_POOL_MEAN;
    else if (a.pooling && !strcmp(a.pooling, "last")) o.pooling = MODEL_POOL_LAST;
    else if (a.pooling && !strcmp(a.pooling, "rank")) o.pooling = MODEL_POOL_RANK;
    else if (a.pooling) {
        fprintf(stderr, "tokenmill mkmodel: --pooling takes mean, last or rank, not '%s'\n", a.pooling);
        return 2;
    }
    if (mk_resolve_experts(&o, &a, p) != 0) return 2;
    bool dsv4 = !strcmp(o.arch, "deepseek4");
    if (a.mtp_out && (!dsv4 || !strcmp(a.mtp_out, a.out))) {
        if (dsv4) fprintf(stderr, "tokenmill mkmodel: --mtp-out must name another file than -o\n");
        else
            fprintf(stderr, "tokenmill mkmodel: --mtp-out writes deepseek4's MTP-only file (--arch %s: --nextn N appends "
                            "MTP layers to deepseek2 and glm4moe models)\n", o.arch);
        return 2;
    }
    if ((!gptoss && !dsv4 && !strcasecmp(o.type, "mxfp4")) || (!gptoss && !dsv4 && strncmp(o.arch, "gemma", 5) && a.window)) {
        fprintf(stderr, "tokenmill mkmodel: --window is for --arch gpt-oss, gemma3, gemma4 or deepseek4, --type mxfp4 for gpt-oss or deepseek4\n");
        return 2;
    }
    o.exps_type = !strcasecmp(o.type, "mxfp4") ? QTYPE_MXFP4 : qt;
    o.n_vocab = a.nv ? a.nv : p->n_vocab;
    o.rope_base = a.rope_base > 0 ? a.rope_base : p->rope_base > 0 ? p->rope_base : gptoss ? 150000 : qwen ? 1e6 : 10000;
    o.eps = a.eps > 0 ? a.eps : qwen && !gptoss ? 1e-6 : 1e-5;
    o.tied = a.tied >= 0 ? a.tied == 1 : p->tied;
    if ((gptoss || dsv4) && o.tied) {   /* llama.cpp's gpt-oss and deepseek4 require output.weight */
        if (a.tied == 1) {
            fprintf(stderr, "tokenmill mkmodel: %s has no tied output (--untied)\n", o.arch);
            return 2;
        }
        o.tied = false;
    }
    if (mk_resolve_rope(&o, &a, p) != 0) return 2;
    o.n_threads = (int)a.threads;
    if (o.n_threads <= 0) o.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (o.n_threads <= 0) o.n_threads = 1;
    if (!strncmp(o.arch, "gemma", 5) && a.tied < 0) o.tied = true;   /* Gemma's output is its embedding */
    if (o.n_layers <= 0 || o.dim <= 0 || o.ffn <= 0 || o.n_heads <= 0 || o.n_kv_heads <= 0 || o.head_dim <= 0 ||
        o.head_dim % 2 || o.ctx <= 0 || o.n_heads % o.n_kv_heads || o.n_vocab <= 0 || o.n_layers > 4096) {
        fprintf(stderr, "tokenmill mkmodel: bad shape: layers %d dim %d ffn %d heads %d kv-heads %d head-dim %d ctx %d vocab %d "
                "(heads must be a multiple of kv-heads, head-dim even)\n",
                o.n_layers, o.dim, o.ffn, o.n_heads, o.n_kv_heads, o.head_dim, o.ctx, o.n_vocab);
        return 2;
    }
    mk_partial_rope(&o, p);
    mk_vocab v = { 0 };
    if (!mk_vocab_load(&v, a.vocab, &o, a.nv ? a.nv : (a.preset ? p->n_vocab : 0))) {
        mk_vocab_free(&v);
        return 1;
    }
    if (a.chat_template && !(v.chat_template = util_read_file(a.chat_template, NULL))) {
        fprintf(stderr, "tokenmill mkmodel: cannot read the chat template %s: %s\n", a.chat_template, strerror(errno));
        mk_vocab_free(&v);
        return 1;
    }
    int rc = mk_write(&o, &v, a.out, p->name);
    if (rc == 0 && a.mtp_out) {   /* the same draws by name: the shared head is the model's bytes */
        mk_opts mo = o;
        mo.n_nextn = 1;
        mo.mtp_only = true;
        rc = mk_write(&mo, &v, a.mtp_out, p->name);
    }
    mk_vocab_free(&v);
    return rc;
}

