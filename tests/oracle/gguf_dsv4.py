#!/usr/bin/env python3
# gguf_dsv4: writes a small random-weight DeepSeek V4 (`deepseek4`) GGUF with llama.cpp's own
# gguf-py (tests/data/llama.cpp/gguf-py, after scripts/fetch-testdata.sh): the metadata keys
# and tensors that llama.cpp's converter (conversion/deepseek.py, DeepseekV4Model) writes and
# its loader (src/models/deepseek4.cpp) reads, in a shape small enough for a test.
#
#   gguf_dsv4.py --vocab VOCAB.gguf [--type f32|f16|q8_0|mxfp4] [--seed N] [--yarn FACTOR:ORIG_CTX]
#                [--mtp [--mtp-hash]] [--dim N] [--hc N] [--idx-dim N] -o OUT.gguf
#
# The shape (SHAPE) has every kind of layer V4 has: compression ratios 0, 4 (with the
# lightning indexer) and 128, a hash-routed lead layer (tid2eid), the sqrt-softplus router
# with its selection bias, a shared expert, the clamped SwiGLU, 4 hyper-connection streams,
# the grouped low-rank output, sinks; the sliding window (16) and the indexer's top-k (6)
# are small so that a few hundred tokens cross both, and several 128-token HCA groups.
# --type mxfp4 is the published V4 files' mix (llama.cpp's MXFP4_MOE): routed experts in MXFP4
# (gguf-py's quantiser), every other matrix in Q8_0. --yarn writes the rope.scaling keys the converter writes for the published V4 files (type
# yarn, the factor, the original context length), which llama.cpp applies to the compressed
# layers' RoPE. The vocabulary (every tokenizer.* key) is copied from VOCAB.gguf. Needs numpy.
#
# --mtp writes the MTP-only companion of the model of the same seed and options, as the
# converter's `--mtp` does (DeepseekV4Model with mtp_only): block_count counts the MTP block
# (num_hidden_layers + 1), nextn_predict_layers 1, the per-layer arrays (compress_ratios, the
# SwiGLU clamps) one entry longer (the MTP block's ratio 0), and only the shared embedding,
# output norm and head (the trunk's values: the same draws), the MTP block's own output_hc_*
# (mtp.0.hc_head_*), and blk.L.* for L = the trunk's layer count: attention without compressor,
# both hyper-connections, the biased router, experts, shared expert, and nextn.eh_proj
# ([e_proj | h_proj], (dim, 2 dim)), nextn.enorm, nextn.hnorm, nextn.shared_head_norm. The
# trunk's tensors are absent: llama.cpp's loader recognises the file by nextn_predict_layers > 0
# and no blk.0.attn_norm.weight. (The converter forces eh_proj to Q8_0; here it follows --type,
# so an F32 file compares without rounding.) --mtp-hash counts the MTP block among the
# hash-routed layers (a file llama.cpp's graph refuses, for the refusal test). --dim / --hc
# change the width and the hyper-connection count (mismatched companions). --idx-dim sets the
# indexer's key size: the pinned llama.cpp's MTP context divides by zero when it equals the
# head size (its iswa cache forces V4's Hadamard rotation on, and the full-attention half of
# that cache has no layer, so no head size to size the rotation by), so the MTP oracle test
# writes 128 against heads of 64.
#
# gguf_dspark_v4.py writes a drafter with this backbone through the writers below (tensor_writers,
# add_keys, add_output_hc, add_block_attn, add_block_ffn): each draws in the order it is called,
# so a file's bytes depend on the order its main() calls them.
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf_common import copy_vocab, finish, put  # noqa: E402

SHAPE = dict(ratios=[0, 4, 128, 4], dim=128, heads=4, head_dim=64, rope=16, q_lora=64, o_groups=2, o_lora=32,
             experts=8, used=2, expert_ffn=64, shared=1, hash_layers=1, window=16, idx_heads=8, idx_dim=64,
             idx_topk=6, hc=4, sinkhorn=20, hc_eps=1e-6, swiglu_limit=10.0, w_scale=1.5)


def tensor_writers(w, rng, types, keep=lambda name: True):
    """(add, norm) for w: add(name, shape, std, kind="mat", mean=0.0) draws N(mean, std^2) from rng
    and writes it as types[kind] ("mat", "exps" or "f32") when keep(name) (a tensor not kept is
    still drawn); norm(name, n, mean=1.0) a norm's weights around mean."""
    def add(name, shape, std, kind="mat", mean=0.0):
        x = (mean + std * rng.standard_normal(shape)).astype(np.float32)
        if keep(name):
            put(w, name, x, types[kind])

    def norm(name, n, mean=1.0):
        add(name, (n,), 0.1 * mean, "f32", mean)

    return add, norm


def add_keys(w, s, dim, n_vocab, nb, ratios, window, n_hash, yarn=None):
    """The keys of a V4 model of shape s and width dim (DeepseekV4Model.set_gguf_parameters and
    the common ones before them) under w's architecture: nb blocks of compression ratios,
    window, n_hash hash-routed layers, yarn "FACTOR:ORIG_CTX" or None."""
    w.add_block_count(nb)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(s["expert_ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(1)
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(10000.0)
    if yarn:
        factor, orig = yarn.split(":")
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(factor))
        w.add_rope_scaling_orig_ctx_len(int(orig))
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(s["experts"])
    w.add_expert_used_count(s["used"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SQRTSOFTPLUS)
    w.add_vocab_size(n_vocab)
    # DeepseekV4Model.set_gguf_parameters
    w.add_rope_dimension_count(s["rope"])
    w.add_q_lora_rank(s["q_lora"])
    w.add_sliding_window(window)
    w.add_expert_feed_forward_length(s["expert_ffn"])
    w.add_expert_shared_count(s["shared"])
    w.add_expert_weights_scale(s["w_scale"])
    w.add_expert_weights_norm(True)
    w.add_swiglu_clamp_exp([s["swiglu_limit"]] * nb)
    w.add_swiglu_clamp_shexp([s["swiglu_limit"]] * nb)
    w.add_indexer_head_count(s["idx_heads"])
    w.add_indexer_key_length(s["idx_dim"])
    w.add_indexer_top_k(s["idx_topk"])
    w.add_attention_output_group_count(s["o_groups"])
    w.add_attention_output_lora_rank(s["o_lora"])
    w.add_attention_compress_ratios(ratios)
    w.add_attention_compress_rope_freq_base(160000.0)
    w.add_hyper_connection_count(s["hc"])
    w.add_hyper_connection_sinkhorn_iterations(s["sinkhorn"])
    w.add_hyper_connection_epsilon(s["hc_eps"])
    w.add_hash_layer_count(n_hash)


def add_output_hc(add, hc, dim):
    """The head's hyper-connection collapse (output_hc_*)."""
    add("output_hc_fn.weight", (hc, hc * dim), 1.0 / np.sqrt(hc * dim), "f32")
    add("output_hc_base.weight", (hc,), 0.5, "f32")
    add("output_hc_scale.weight", (1,), 0.3, "f32", 1.0)


def add_block_attn(add, norm, p, s, dim, ratio=0):
    """Block p's attention (the low-rank query, one K = V head, sinks, the grouped output), its
    two hyper-connections, and for ratio 4 or 128 its compressor (ratio 4: with the indexer)."""
    H, hd, hc, ql = s["heads"], s["head_dim"], s["hc"], s["q_lora"]
    si = 1.0 / np.sqrt(dim)
    mix = (2 + hc) * hc
    norm(p + "attn_norm.weight", dim)
    add(p + "attn_sinks.weight", (H,), 1.0, "f32")
    add(p + "attn_q_a.weight", (ql, dim), si)
    norm(p + "attn_q_a_norm.weight", ql)
    add(p + "attn_q_b.weight", (H * hd, ql), 1 / np.sqrt(ql))
    add(p + "attn_kv.weight", (hd, dim), si)
    norm(p + "attn_kv_a_norm.weight", hd)
    gdim = H * hd // s["o_groups"]
    add(p + "attn_output_a.weight", (s["o_groups"] * s["o_lora"], gdim), 1 / np.sqrt(gdim))
    add(p + "attn_output_b.weight", (dim, s["o_groups"] * s["o_lora"]), 1 / np.sqrt(s["o_groups"] * s["o_lora"]))
    for k in ("attn", "ffn"):
        add(p + f"hc_{k}_fn.weight", (mix, hc * dim), 1.0 / np.sqrt(hc * dim), "f32")
        add(p + f"hc_{k}_base.weight", (mix,), 0.5, "f32")
        add(p + f"hc_{k}_scale.weight", (3,), 0.3, "f32", 1.0)
    if ratio:
        ih, idim = s["idx_heads"], s["idx_dim"]
        coff = 2 if ratio == 4 else 1
        add(p + "attn_compressor_kv.weight", (coff * hd, dim), si)
        add(p + "attn_compressor_gate.weight", (coff * hd, dim), si)
        add(p + "attn_compressor_ape.weight", (ratio, coff * hd), 0.5, "f32")
        norm(p + "attn_compressor_norm.weight", hd)
        if ratio == 4:
            add(p + "indexer.proj.weight", (ih, dim), si)
            add(p + "indexer.attn_q_b.weight", (ih * idim, ql), 1 / np.sqrt(ql))
            add(p + "indexer_compressor_kv.weight", (2 * idim, dim), si)
            add(p + "indexer_compressor_gate.weight", (2 * idim, dim), si)
            add(p + "indexer_compressor_ape.weight", (ratio, 2 * idim), 0.5, "f32")
            norm(p + "indexer_compressor_norm.weight", idim)


def add_block_ffn(add, norm, p, s, dim, route=None):
    """Block p's MoE: the router, then route() where the layer is hash-routed (it writes the
    tid2eid table) or else the router's selection bias, the routed experts and the shared one."""
    ne, ef = s["experts"], s["expert_ffn"]
    si = 1.0 / np.sqrt(dim)
    add(p + "ffn_gate_inp.weight", (ne, dim), 2 * si, "f32")
    if route:
        route()
    else:
        add(p + "exp_probs_b.bias", (ne,), 0.05, "f32")
    norm(p + "ffn_norm.weight", dim)
    add(p + "ffn_gate_exps.weight", (ne, ef, dim), si, "exps")
    add(p + "ffn_up_exps.weight", (ne, ef, dim), si, "exps")
    add(p + "ffn_down_exps.weight", (ne, dim, ef), 1 / np.sqrt(ef), "exps")
    sh = ef * s["shared"]
    add(p + "ffn_gate_shexp.weight", (sh, dim), si)
    add(p + "ffn_up_shexp.weight", (sh, dim), si)
    add(p + "ffn_down_shexp.weight", (dim, sh), 1 / np.sqrt(sh))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--type", default="f32", choices=["f32", "f16", "q8_0", "mxfp4"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--yarn", default=None, help="FACTOR:ORIG_CTX")
    ap.add_argument("--mtp", action="store_true", help="write the MTP-only companion file")
    ap.add_argument("--mtp-hash", action="store_true", help="the MTP block hash-routed (refused)")
    ap.add_argument("--dim", type=int, default=None)
    ap.add_argument("--hc", type=int, default=None)
    ap.add_argument("--idx-dim", type=int, default=None)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    s = dict(SHAPE)
    if a.dim:
        s["dim"] = a.dim
    if a.hc:
        s["hc"] = a.hc
    if a.idx_dim:
        s["idx_dim"] = a.idx_dim
    Q = gguf.GGMLQuantizationType
    qtype = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "mxfp4": Q.Q8_0}[a.type]
    exps_qtype = Q.MXFP4 if a.type == "mxfp4" else qtype
    w = gguf.GGUFWriter(a.out + ".tmp", "deepseek4")
    rng = np.random.default_rng(a.seed)

    # --mtp: every trunk tensor is still drawn (so the shared ones are the trunk file's values),
    # only the shared ones and the MTP block are written
    shared = ("token_embd.weight", "output_norm.weight", "output.weight")
    writing = [True]
    add, norm = tensor_writers(w, rng, {"mat": qtype, "exps": exps_qtype, "f32": Q.F32},
                               lambda name: writing[0] or name in shared)

    L, dim = len(s["ratios"]), s["dim"]
    nb = L + 1 if a.mtp else L   # block_count: the converter counts the MTP block in an MTP-only file
    ratios = s["ratios"] + [0] if a.mtp else s["ratios"]
    ne, hc = s["experts"], s["hc"]
    w.add_name(f"gguf-py-random-deepseek4-seed{a.seed}")
    w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7, "mxfp4": 38}[a.type])
    if qtype not in (Q.F32, Q.F16):
        w.add_quantization_version(2)
    n_vocab = copy_vocab(w, a.vocab)
    add_keys(w, s, dim, n_vocab, nb, ratios, s["window"], nb if a.mtp_hash else s["hash_layers"], a.yarn)
    w.add_embedding_length_out(dim * hc)
    if a.mtp:
        w.add_nextn_predict_layers(1)

    si = 1.0 / np.sqrt(dim)
    writing[0] = not a.mtp
    add("token_embd.weight", (n_vocab, dim), 0.5 * si)
    norm("output_norm.weight", dim, 20.0)
    add("output.weight", (n_vocab, dim), 0.5 * si)
    add_output_hc(add, hc, dim)
    for il, ratio in enumerate(ratios):
        if a.mtp and il == L:
            # the MTP block (after every trunk draw): its own head collapse, its input projection
            writing[0] = True
            add_output_hc(add, hc, dim)
            add(f"blk.{il}.nextn.eh_proj.weight", (dim, 2 * dim), 1 / np.sqrt(2 * dim))
            norm(f"blk.{il}.nextn.enorm.weight", dim)
            norm(f"blk.{il}.nextn.hnorm.weight", dim)
            norm(f"blk.{il}.nextn.shared_head_norm.weight", dim, 20.0)
        p = f"blk.{il}."
        add_block_attn(add, norm, p, s, dim, ratio)

        def tid2eid():
            tid = np.stack([rng.permutation(ne)[:s["used"]] for _ in range(n_vocab)]).astype(np.int32)
            if writing[0]:
                w.add_tensor(p + "ffn_gate_tid2eid.weight", tid)

        hashed = il < s["hash_layers"] or (a.mtp_hash and il == L)
        add_block_ffn(add, norm, p, s, dim, tid2eid if hashed else None)

    finish(w, a.out)


if __name__ == "__main__":
    main()
