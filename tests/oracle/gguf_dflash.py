#!/usr/bin/env python3
# gguf_dflash: writes a small random-weight DFlash / DSpark drafter GGUF (llama.cpp's `dflash`
# architecture) for a given target GGUF with llama.cpp's own gguf-py
# (tests/data/llama.cpp/gguf-py, after scripts/fetch-testdata.sh): the tensor names, shapes and
# metadata keys are those llama.cpp's converters write (conversion/qwen.py's DFlashModel and
# DSparkModel: a Qwen3-style backbone, `fc` and `enc.output_norm` over the target's layer
# inputs, the optional Markov head `markov_w1/w2` and confidence head `conf_proj`).
#
#   gguf_dflash.py --target TARGET.gguf [--layers N] [--heads H] [--kv-heads K] [--head-dim D]
#                  [--ffn F] [--block B] [--target-layers 1,2] [--markov R] [--conf]
#                  [--own-head] [--dim N] [--type f32|f16] [--seed N] -o OUT.gguf
#
# The vocabulary (every tokenizer.* key) is copied from the target, plus a mask token (the
# last id) as tokenizer.ggml.mask_token_id. Without --own-head the drafter has neither an
# embedding nor an output head and borrows the target's (as llama.cpp's full-vocabulary
# exports do). --dim other than the target's writes a mismatched drafter (for refusal tests).
# Needs python3 with numpy (Debian: python3-numpy).
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf_common import copy_vocab  # noqa: E402



def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--target-layers", default="")
    ap.add_argument("--markov", type=int, default=0, help="Markov head rank (0: none)")
    ap.add_argument("--conf", action="store_true", help="a confidence head (needs --markov)")
    ap.add_argument("--own-head", action="store_true")
    ap.add_argument("--dim", type=int, default=0)
    ap.add_argument("--anchor", choices=["true", "false"], default="true")
    ap.add_argument("--type", choices=["f32", "f16"], default="f32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    r = gguf.GGUFReader(a.target)
    tarch = field(r, "general.architecture")
    tdim = int(field(r, f"{tarch}.embedding_length"))
    tlayers = int(field(r, f"{tarch}.block_count"))
    dim = a.dim or tdim
    tl = [int(x) for x in a.target_layers.split(",")] if a.target_layers else sorted({1, max(1, tlayers - 1)})
    rng = np.random.default_rng(a.seed)
    arch = "dflash"
    w = gguf.GGUFWriter(a.output, arch)
    w.add_name(f"tokenmill-random-dflash-seed{a.seed}")
    n_vocab = copy_vocab(w, r, skip=("tokenizer.ggml.mask_token_id",))
    w.add_mask_token_id(n_vocab - 1)
    w.add_context_length(int(field(r, f"{tarch}.context_length", 4096)))
    w.add_embedding_length(dim)
    w.add_feed_forward_length(a.ffn)
    w.add_block_count(a.layers)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(float(field(r, f"{tarch}.rope.freq_base", 1000000.0)))
    w.add_block_size(a.block)
    w.add_target_layers(tl)
    if a.markov:
        w.add_sample_from_anchor(a.anchor == "true")
        w.add_has_confidence_head(bool(a.conf))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if a.type == "f32" else gguf.LlamaFileType.MOSTLY_F16)

    def mat(name, rows, cols, std=None):
        x = (rng.standard_normal((rows, cols)) * (std if std is not None else 1.0 / np.sqrt(cols))).astype(np.float32)
        w.add_tensor(name, x.astype(np.float16) if a.type == "f16" else x)

    def vec(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (mean + std * rng.standard_normal(n)).astype(np.float32))

    hd, H, K = a.head_dim, a.heads, a.kv_heads
    mat("fc.weight", dim, len(tl) * tdim)
    vec("enc.output_norm.weight", dim)
    vec("output_norm.weight", dim, mean=4.0, std=0.5)
    if a.own_head:
        mat("token_embd.weight", n_vocab, dim, std=0.05)
        mat("output.weight", n_vocab, dim)
    for i in range(a.layers):
        vec(f"blk.{i}.attn_norm.weight", dim)
        mat(f"blk.{i}.attn_q.weight", H * hd, dim)
        mat(f"blk.{i}.attn_k.weight", K * hd, dim)
        mat(f"blk.{i}.attn_v.weight", K * hd, dim)
        mat(f"blk.{i}.attn_output.weight", dim, H * hd)
        vec(f"blk.{i}.attn_q_norm.weight", hd)
        vec(f"blk.{i}.attn_k_norm.weight", hd)
        vec(f"blk.{i}.ffn_norm.weight", dim)
        mat(f"blk.{i}.ffn_gate.weight", a.ffn, dim)
        mat(f"blk.{i}.ffn_up.weight", a.ffn, dim)
        mat(f"blk.{i}.ffn_down.weight", dim, a.ffn)
    if a.markov:
        R = a.markov
        # the Markov bias w2 . w1[prev] has a spread of a few logits, as the backbone's
        w.add_tensor("markov_w1.weight", rng.standard_normal((n_vocab, R)).astype(np.float32))
        w.add_tensor("markov_w2.weight", (rng.standard_normal((n_vocab, R)) * 2.0 / np.sqrt(R)).astype(np.float32))
        if a.conf:
            # confidences spread over (0, 1): the logit has a standard deviation near 1.5
            n = dim + R
            w.add_tensor("conf_proj.weight", (rng.standard_normal((1, n)) * 1.5 / np.sqrt(n * 8.0)).astype(np.float32))
            w.add_tensor("conf_proj.bias", np.array([0.2], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
