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
# The V4 keys and blocks are gguf_dsv4.py's writers, all in F32.
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
from gguf_dsv4 import SHAPE, add_block_attn, add_block_ffn, add_keys, add_output_hc, tensor_writers  # noqa: E402


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
    L, hc = a.layers, s["hc"]
    w.add_name(f"gguf-py-random-dspark-v4-seed{a.seed}")
    w.add_file_type(0)
    n_vocab = copy_vocab(w, r, skip=("tokenizer.ggml.mask_token_id",))
    w.add_mask_token_id(n_vocab - 1)
    add_keys(w, s, dim, n_vocab, L, [0] * L, a.window, 0)
    w.add_block_size(a.block)
    w.add_target_layers(tl)

    F32 = gguf.GGMLQuantizationType.F32
    add, norm = tensor_writers(w, rng, {"mat": F32, "exps": F32, "f32": F32})
    si = 1.0 / np.sqrt(dim)
    add("fc.weight", (dim, len(tl) * dim), 1.0 / np.sqrt(len(tl) * dim))
    norm("enc.output_norm.weight", dim)
    norm("output_norm.weight", dim, 20.0)
    if a.own_head:
        add("token_embd.weight", (n_vocab, dim), 0.5 * si)
        add("output.weight", (n_vocab, dim), 0.5 * si)
    add_output_hc(add, hc, dim)
    for il in range(L):
        add_block_attn(add, norm, f"blk.{il}.", s, dim)
        add_block_ffn(add, norm, f"blk.{il}.", s, dim)
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
