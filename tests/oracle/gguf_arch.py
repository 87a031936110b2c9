#!/usr/bin/env python3
# gguf_arch: writes a small random-weight GGUF of a dense family with llama.cpp's own gguf-py
# (tests/data/llama.cpp/gguf-py), so that the oracle tests read tensor names, shapes and
# metadata as llama.cpp's converter writes them (conversion/phi.py for phi3), not mkmodel's.
#
#   gguf_arch.py --shape phi3|phi3-long|mistral3|gemma3|gemma4|gemma4-moe|gemma4-e|gemma4-ple|gemma4-shared --vocab VOCAB.gguf
#       [--type f32|f16|q8_0] [--seed N] [--drop TENSOR ...] -o OUT.gguf
#
# phi3: Phi-4-mini's layer in small: fused attn_qkv and ffn_up (gate then up), 3/4 of each
# head rotated (NEOX), LongRoPE's rope_factors_long/short and rope.scaling.attn_factor, a
# tied output, sliding_window 0. phi3-long: the same with original_context_length 32, so that
# both engines take the long factors (llama.cpp: its context exceeds 32; tokenmill: the
# trained context does); phi3: original = trained context, the short factors.
# gemma3: Gemma 3's layer in small (conversion/gemma.py's Gemma3Model): q/k head norms, norms
# after the attention and the FFN, GELU FFN, a 16-position window on 2 of each 3 layers (rotated
# with freq_base_swa 10000) and global layers with freq_base 1e6 and linear scaling 8, the final
# logit soft cap (10, on logits of a standard deviation near 10).
# gemma4: Gemma 4's text layer in small (gguf_gemma4.py).
# The vocabulary (every tokenizer.* key) is copied from VOCAB.gguf. Needs numpy.
import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf_common import copy_vocab, finish, put  # noqa: E402
from gguf_gemma4 import SHAPES as GEMMA4_SHAPES, write_gemma4  # noqa: E402

SHAPES = {
    "phi3": dict(arch="phi3", layers=3, dim=256, heads=4, kv_heads=2, head_dim=64, rot=48, ffn=512, ctx=4096,
                 orig=4096),
    # Ministral 3's layer in small (conversion/mistral3.py's Ministral3Model): llama's tensors,
    # YaRN (factor 16, mscale_all_dim 1) and Llama 4's attention temperature (beta 0.1) over
    # an original context of 16 positions, so that its steps fall inside the test's prompts
    "mistral3": dict(arch="mistral3", layers=3, dim=256, heads=4, kv_heads=2, head_dim=64, rot=64, ffn=512, ctx=4096,
                     orig=16),
    "gemma3": dict(arch="gemma3", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, rot=64, ffn=512, ctx=4096,
                   window=16, pattern=3, softcap=10.0, out_norm=20.0),
    "phi3-long": dict(arch="phi3", layers=3, dim=256, heads=4, kv_heads=2, head_dim=64, rot=48, ffn=512, ctx=4096,
                      orig=32),
    **GEMMA4_SHAPES,
}



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--type", default="f32", choices=["f32", "f16", "q8_0"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--drop", action="append", default=[], help="leave this tensor out (a broken file, for tests)")
    a = ap.parse_args()
    s = SHAPES[a.shape]
    Q = gguf.GGMLQuantizationType
    qtype = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}[a.type]
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out + ".tmp", s["arch"])

    def add(name, shape, std, f32=False, mean=0.0):
        x = (mean + std * rng.standard_normal(shape)).astype(np.float32)
        t = Q.F32 if f32 else qtype
        if name not in a.drop:
            put(w, name, x, t)

    def norm(name, n, mean=1.0):
        add(name, (n,), 0.1 * mean, True, mean)

    # not "phi3" in the name: llama.cpp then sets attributes of Phi-3's special tokens by text,
    # which a generated vocabulary lacks
    w.add_name(f"gguf-py-random-{a.shape.replace('phi3', 'phi')}-seed{a.seed}")
    w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[a.type])
    if qtype not in (Q.F32, Q.F16):
        w.add_quantization_version(2)
    n_vocab = copy_vocab(w, a.vocab)
    dim, L, H, kvh, hd, rot, ffn = s["dim"], s["layers"], s["heads"], s["kv_heads"], s["head_dim"], s["rot"], s["ffn"]
    if s["arch"] == "mistral3":
        write_mistral3(w, s, n_vocab, add, norm)
        return finish(w, a.out)
    if s["arch"] == "gemma3":
        write_gemma3(w, s, n_vocab, add, norm)
        return finish(w, a.out)
    if s["arch"] == "gemma4":
        write_gemma4(w, s, n_vocab, add, norm)
        return finish(w, a.out)
    # conversion/phi.py's Phi3MiniModel.set_gguf_parameters
    w.add_context_length(s["ctx"])
    w.add_rope_scaling_orig_ctx_len(s["orig"])
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(kvh)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(rot)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(0)
    # generate_extra_tensors: LongRoPE (Phi-4-mini: 131072 / 4096)
    scale = 131072 / 4096
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(4096)))
    w.add_tensor("rope_factors_long.weight", np.linspace(1.0, 40.0, rot // 2, dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.linspace(1.0, 3.0, rot // 2, dtype=np.float32))

    si = 1.0 / np.sqrt(dim)
    add("token_embd.weight", (n_vocab, dim), 0.5 * si)
    norm("output_norm.weight", dim, 20.0)
    for il in range(L):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight", dim)
        add(p + "attn_qkv.weight", ((H + 2 * kvh) * hd, dim), si)
        add(p + "attn_output.weight", (dim, H * hd), 1 / np.sqrt(H * hd))
        norm(p + "ffn_norm.weight", dim)
        add(p + "ffn_up.weight", (2 * ffn, dim), si)
        add(p + "ffn_down.weight", (dim, ffn), 1 / np.sqrt(ffn))
    finish(w, a.out)


def write_shape(w, s, eps):
    """The shape keys of llama's layout (TextModel.set_gguf_parameters, head sizes given)."""
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_feed_forward_length(s["ffn"])
    w.add_block_count(s["layers"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_layer_norm_rms_eps(eps)


def add_llama_layer(s, add, norm, p, ffn_between=lambda: None):
    """Llama's attention and gated FFN tensors of one layer (prefix p); ffn_between adds what
    comes between the attention and ffn_norm."""
    dim, H, kvh, hd, ffn = s["dim"], s["heads"], s["kv_heads"], s["head_dim"], s["ffn"]
    si = 1.0 / np.sqrt(dim)
    norm(p + "attn_norm.weight", dim)
    add(p + "attn_q.weight", (H * hd, dim), si)
    add(p + "attn_k.weight", (kvh * hd, dim), si)
    add(p + "attn_v.weight", (kvh * hd, dim), si)
    add(p + "attn_output.weight", (dim, H * hd), 1 / np.sqrt(H * hd))
    ffn_between()
    norm(p + "ffn_norm.weight", dim)
    add(p + "ffn_gate.weight", (ffn, dim), si)
    add(p + "ffn_up.weight", (ffn, dim), si)
    add(p + "ffn_down.weight", (dim, ffn), 1 / np.sqrt(ffn))


def write_mistral3(w, s, n_vocab, add, norm):
    dim, L, hd = s["dim"], s["layers"], s["head_dim"]
    # LlamaModel.set_gguf_parameters, then Ministral3Model's YaRN and temperature keys
    write_shape(w, s, 1e-5)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(1000000.0)
    w.add_vocab_size(n_vocab)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(16.0)
    w.add_rope_scaling_yarn_beta_fast(32.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_rope_scaling_orig_ctx_len(s["orig"])
    w.add_rope_scaling_yarn_log_mul(1.0)
    w.add_attn_temperature_scale(0.1)
    si = 1.0 / np.sqrt(dim)
    add("token_embd.weight", (n_vocab, dim), 0.5 * si)
    norm("output_norm.weight", dim, 20.0)
    add("output.weight", (n_vocab, dim), 0.5 * si)
    for il in range(L):
        add_llama_layer(s, add, norm, f"blk.{il}.")


def write_gemma3(w, s, n_vocab, add, norm):
    dim, L, hd = s["dim"], s["layers"], s["head_dim"]
    # TextModel.set_gguf_parameters, then Gemma3Model's (norm weights stored as 1 + w)
    write_shape(w, s, 1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(8.0)
    w.add_sliding_window(s["window"])
    w.add_sliding_window_pattern(s["pattern"])
    if s["softcap"]:
        w.add_final_logit_softcapping(s["softcap"])
    si = 1.0 / np.sqrt(dim)
    add("token_embd.weight", (n_vocab, dim), 0.5 * si)   # tied output, as Gemma's
    norm("output_norm.weight", dim, s["out_norm"])
    for il in range(L):
        p = f"blk.{il}."

        def head_norms(p=p):   # qwen3's head norms, then the attention output's norm
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
            norm(p + "post_attention_norm.weight", dim, 0.3)
        add_llama_layer(s, add, norm, p, head_norms)
        norm(p + "post_ffw_norm.weight", dim, 0.3)


if __name__ == "__main__":
    main()
