#!/usr/bin/env python3
# gguf_qwen35: writes a small random-weight Qwen3.5 GGUF (`qwen35`, `qwen35moe`) with llama.cpp's
# own gguf-py (tests/data/llama.cpp/gguf-py), so that the oracle tests read a file that
# tokenmill did not write: the tensor names, shapes and metadata keys of llama.cpp's
# converter (conversion/qwen.py: Qwen3_5TextModel, Qwen3_5MoeTextModel).
#
#   gguf_qwen35.py --shape qwen35|qwen35moe --vocab VOCAB.gguf [--type f32|f16|q8_0]
#                  [--seed N] [--set KEY=INT ...] -o OUT.gguf
#
# Shapes are the real models' layers in small (see SHAPES): every 4th layer full attention
# (query and output gate per head, q/k norms, partial interleaved M-RoPE: a quarter of the head
# rotated), the others gated delta net layers (qkv, z, beta, alpha, a causal conv of 4 taps,
# A = -exp(A_log), dt bias, the gated norm, ssm_out) with twice as many v heads as q/k heads.
# Weights N(0, 1/fan_in), norms near 1 (the final one near 20), as gguf_moe.py.
# Needs python3 with numpy.
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf_common import copy_vocab, finish  # noqa: E402
from gguf_moe import Writer  # noqa: E402

SHAPES = {
    # Qwen3.5-4B's layer in small: 16 q heads of 256 over 4 kv heads there, a quarter rotated;
    # 16 k heads and 32 v heads of 128 in the linear layers
    "qwen35": dict(arch="qwen35", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, rot=16, ffn=512,
                   conv=4, k_heads=2, v_heads=4, state=32, interval=4),
    # Qwen3.5-35B-A3B's: routed experts (softmax, top-k renormalised) and one shared expert with
    # its sigmoid gate
    "qwen35moe": dict(arch="qwen35moe", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, rot=16, ffn=512,
                      conv=4, k_heads=2, v_heads=4, state=32, interval=4, experts=8, used=2, expert_ffn=128),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--type", default="f32", choices=["f32", "f16", "q8_0"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    for kv in a.set:
        k, v = kv.split("=", 1)
        if k not in s or k == "arch":
            sys.exit(f"gguf_qwen35: --set {k}: not a number of shape {a.shape}")
        s[k] = int(v)
    Q = gguf.GGMLQuantizationType
    qtype = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}[a.type]
    arch = s["arch"]
    w = gguf.GGUFWriter(a.out + ".tmp", arch)
    rng = np.random.default_rng(a.seed)
    W = Writer(w, rng, qtype, qtype)

    w.add_name(f"gguf-py-random-{a.shape}-seed{a.seed}")
    w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[a.type])
    if qtype not in (Q.F32, Q.F16):
        w.add_quantization_version(2)
    n_vocab = copy_vocab(w, a.vocab)
    dim, L, H, kvh, hd = s["dim"], s["layers"], s["heads"], s["kv_heads"], s["head_dim"]
    S, Hk, Hv, K = s["state"], s["k_heads"], s["v_heads"], s["conv"]
    moe = arch == "qwen35moe"
    w.add_block_count(L)
    w.add_context_length(262144)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(H)
    w.add_head_count_kv(kvh)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(10000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(s["rot"])
    # interleaved M-RoPE sections over rot/2 pairs, as [11, 11, 10, 0] is over 32
    half = s["rot"] // 2
    t3 = (half + 2) // 3
    w.add_rope_dimension_sections([t3, t3, half - 2 * t3, 0])
    w.add_ssm_conv_kernel(K)
    w.add_ssm_state_size(S)
    w.add_ssm_group_count(Hk)
    w.add_ssm_time_step_rank(Hv)
    w.add_ssm_inner_size(Hv * S)
    w.add_full_attention_interval(s["interval"])
    if moe:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
        w.add_expert_shared_feed_forward_length(s["expert_ffn"])

    si = 1.0 / np.sqrt(dim)
    W.add("token_embd.weight", (n_vocab, dim), 0.5 * si)
    W.norm("output_norm.weight", dim, 20.0)
    W.add("output.weight", (n_vocab, dim), 0.5 * si)
    conv_ch = 2 * Hk * S + Hv * S
    for il in range(L):
        p = f"blk.{il}."
        W.norm(p + "attn_norm.weight", dim)
        W.norm(p + "post_attention_norm.weight", dim)
        if (il + 1) % s["interval"] != 0:
            W.add(p + "attn_qkv.weight", (conv_ch, dim), si)
            W.add(p + "attn_gate.weight", (Hv * S, dim), si)
            W.add(p + "ssm_beta.weight", (Hv, dim), si)
            W.add(p + "ssm_alpha.weight", (Hv, dim), si)
            W.add(p + "ssm_conv1d.weight", (conv_ch, K), 0.5, "f32")
            W.add(p + "ssm_dt.bias", (Hv,), 0.5, "f32")
            # -exp(A_log), A_log ~ log(U(1, 16)) as the model initialises it
            w.add_tensor(p + "ssm_a", (-rng.uniform(1, 16, Hv)).astype(np.float32))
            W.norm(p + "ssm_norm.weight", S)
            W.add(p + "ssm_out.weight", (dim, Hv * S), 1 / np.sqrt(Hv * S))
        else:
            W.add(p + "attn_q.weight", (H * hd * 2, dim), si)
            W.add(p + "attn_k.weight", (kvh * hd, dim), si)
            W.add(p + "attn_v.weight", (kvh * hd, dim), si)
            W.add(p + "attn_output.weight", (dim, H * hd), 1 / np.sqrt(H * hd))
            W.norm(p + "attn_q_norm.weight", hd)
            W.norm(p + "attn_k_norm.weight", hd)
        if moe:
            ne, ef = s["experts"], s["expert_ffn"]
            W.add(p + "ffn_gate_inp.weight", (ne, dim), 2 * si, "f32")
            W.add(p + "ffn_gate_exps.weight", (ne, ef, dim), si, "exps")
            W.add(p + "ffn_up_exps.weight", (ne, ef, dim), si, "exps")
            W.add(p + "ffn_down_exps.weight", (ne, dim, ef), 1 / np.sqrt(ef), "exps")
            W.add(p + "ffn_gate_inp_shexp.weight", (dim,), si, "f32")
            W.add(p + "ffn_gate_shexp.weight", (ef, dim), si)
            W.add(p + "ffn_up_shexp.weight", (ef, dim), si)
            W.add(p + "ffn_down_shexp.weight", (dim, ef), 1 / np.sqrt(ef))
        else:
            W.add(p + "ffn_gate.weight", (s["ffn"], dim), si)
            W.add(p + "ffn_up.weight", (s["ffn"], dim), si)
            W.add(p + "ffn_down.weight", (dim, s["ffn"]), 1 / np.sqrt(s["ffn"]))

    finish(w, a.out)


if __name__ == "__main__":
    main()
