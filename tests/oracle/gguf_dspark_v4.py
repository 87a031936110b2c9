#!/usr/bin/env python3
# gguf_dspark_v4: writes a small random-weight DSpark drafter with a DeepSeek V4 backbone
# (llama.cpp's `dflash` architecture with dflash.hyper_connection_count > 0) for a V4 target
# written by gguf_dsv4.py, with llama.cpp's own gguf-py. The keys and tensors are those of
# conversion/deepseek.py's DeepseekV4DSparkModel: every DeepseekV4Model key under the `dflash`
# prefix (compress_ratios all 0, no hash layers), the block size and target layers, main_proj ->
# `fc`, main_norm -> `enc.output_norm`, the V4 layers (hyper-connections, the low-rank query,
# one K = V head, sinks, grouped output, sqrt-softplus MoE with a shared expert), the head's
# hyper-connection `output_hc_*`, and the optional Markov head and confidence head (no bias, as
# that converter writes none). llama.cpp's loader is src/models/dflash.cpp (its dsv4 branch).
#
#   gguf_dspark_v4.py --target TARGET.gguf [--layers N] [--block B] [--window W]
#                     [--target-layers 1,4] [--markov R] [--conf] [--own-head] [--seed N] -o OUT.gguf
#
# Without --own-head the drafter borrows the target's embedding and head. The vocabulary is
# copied from the target, the mask token is its last id. Needs numpy.
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf_common import copy_vocab, finish  # noqa: E402
from gguf_dsv4 import SHAPE  # noqa: E402


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block", type=int, default=6)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--target-layers", default="")
    ap.add_argument("--markov", type=int, default=0, help="Markov head rank (0: none)")
    ap.add_argument("--conf", action="store_true", help="a confidence head (needs --markov)")
    ap.add_argument("--own-head", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    s = SHAPE
    r = gguf.GGUFReader(a.target)
    tarch = field(r, "general.architecture")
    if tarch != "deepseek4":
        sys.exit(f"gguf_dspark_v4: the target is '{tarch}', not deepseek4")
    dim = int(field(r, "deepseek4.embedding_length"))
    tlayers = int(field(r, "deepseek4.block_count"))
    tl = [int(x) for x in a.target_layers.split(",")] if a.target_layers else [1, tlayers]
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.output + ".tmp", "dflash")
    L, H, hd, hc = a.layers, s["heads"], s["head_dim"], s["hc"]
    ne, ef = s["experts"], s["expert_ffn"]
    w.add_name(f"gguf-py-random-dspark-v4-seed{a.seed}")
    w.add_file_type(0)
    n_vocab = copy_vocab(w, r, skip=("tokenizer.ggml.mask_token_id",))
    w.add_mask_token_id(n_vocab - 1)
    w.add_block_count(L)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ef)
    w.add_head_count(H)
    w.add_head_count_kv(1)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(ne)
    w.add_expert_used_count(s["used"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SQRTSOFTPLUS)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(s["rope"])
    w.add_q_lora_rank(s["q_lora"])
    w.add_sliding_window(a.window)
    w.add_expert_feed_forward_length(ef)
    w.add_expert_shared_count(s["shared"])
    w.add_expert_weights_scale(s["w_scale"])
    w.add_expert_weights_norm(True)
    w.add_swiglu_clamp_exp([s["swiglu_limit"]] * L)
    w.add_swiglu_clamp_shexp([s["swiglu_limit"]] * L)
    w.add_indexer_head_count(s["idx_heads"])
    w.add_indexer_key_length(s["idx_dim"])
    w.add_indexer_top_k(s["idx_topk"])
    w.add_attention_output_group_count(s["o_groups"])
    w.add_attention_output_lora_rank(s["o_lora"])
    w.add_attention_compress_ratios([0] * L)
    w.add_attention_compress_rope_freq_base(160000.0)
    w.add_hyper_connection_count(hc)
    w.add_hyper_connection_sinkhorn_iterations(s["sinkhorn"])
    w.add_hyper_connection_epsilon(s["hc_eps"])
    w.add_hash_layer_count(0)
    w.add_block_size(a.block)
    w.add_target_layers(tl)

    def add(name, shape, std, mean=0.0):
        w.add_tensor(name, (mean + std * rng.standard_normal(shape)).astype(np.float32))

    def norm(name, n, mean=1.0):
        add(name, (n,), 0.1 * mean, mean)

    si = 1.0 / np.sqrt(dim)
    mix = (2 + hc) * hc
    add("fc.weight", (dim, len(tl) * dim), 1.0 / np.sqrt(len(tl) * dim))
    norm("enc.output_norm.weight", dim)
    norm("output_norm.weight", dim, 20.0)
    if a.own_head:
        add("token_embd.weight", (n_vocab, dim), 0.5 * si)
        add("output.weight", (n_vocab, dim), 0.5 * si)
    add("output_hc_fn.weight", (hc, hc * dim), 1.0 / np.sqrt(hc * dim))
    add("output_hc_base.weight", (hc,), 0.5)
    add("output_hc_scale.weight", (1,), 0.3, 1.0)
    ql = s["q_lora"]
    for il in range(L):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight", dim)
        add(p + "attn_sinks.weight", (H,), 1.0)
        add(p + "attn_q_a.weight", (ql, dim), si)
        norm(p + "attn_q_a_norm.weight", ql)
        add(p + "attn_q_b.weight", (H * hd, ql), 1 / np.sqrt(ql))
        add(p + "attn_kv.weight", (hd, dim), si)
        norm(p + "attn_kv_a_norm.weight", hd)
        gdim = H * hd // s["o_groups"]
        add(p + "attn_output_a.weight", (s["o_groups"] * s["o_lora"], gdim), 1 / np.sqrt(gdim))
        add(p + "attn_output_b.weight", (dim, s["o_groups"] * s["o_lora"]), 1 / np.sqrt(s["o_groups"] * s["o_lora"]))
        for k in ("attn", "ffn"):
            add(p + f"hc_{k}_fn.weight", (mix, hc * dim), 1.0 / np.sqrt(hc * dim))
            add(p + f"hc_{k}_base.weight", (mix,), 0.5)
            add(p + f"hc_{k}_scale.weight", (3,), 0.3, 1.0)
        add(p + "ffn_gate_inp.weight", (ne, dim), 2 * si)
        add(p + "exp_probs_b.bias", (ne,), 0.05)
        norm(p + "ffn_norm.weight", dim)
        add(p + "ffn_gate_exps.weight", (ne, ef, dim), si)
        add(p + "ffn_up_exps.weight", (ne, ef, dim), si)
        add(p + "ffn_down_exps.weight", (ne, dim, ef), 1 / np.sqrt(ef))
        sh = ef * s["shared"]
        add(p + "ffn_gate_shexp.weight", (sh, dim), si)
        add(p + "ffn_up_shexp.weight", (sh, dim), si)
        add(p + "ffn_down_shexp.weight", (dim, sh), 1 / np.sqrt(sh))
    if a.markov:
        R = a.markov
        w.add_tensor("markov_w1.weight", rng.standard_normal((n_vocab, R)).astype(np.float32))
        w.add_tensor("markov_w2.weight", (rng.standard_normal((n_vocab, R)) * 2.0 / np.sqrt(R)).astype(np.float32))
        if a.conf:
            # the confidence head reads the collapsed stream before the output norm (dflash.cpp's
            # dsv4 graph), whose size is about 1: a logit spread near 1.5
            n = dim + R
            w.add_has_confidence_head(True)   # what dflash_llama.cpp reads to print the confidences
            w.add_tensor("conf_proj.weight", (rng.standard_normal((1, n)) * 1.5 / np.sqrt(n)).astype(np.float32))
    finish(w, a.output)


if __name__ == "__main__":
    main()
