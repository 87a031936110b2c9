#!/usr/bin/env python3
# gguf_bert: writes a small random-weight BERT encoder GGUF with llama.cpp's own gguf-py
# (tests/data/llama.cpp/gguf-py), with the keys, tensor names and WordPiece vocabulary as
# llama.cpp's converter writes them (conversion/bert.py: causal attention off, the pooling
# type, token_type_count, a "phantom space" vocabulary where a word-initial piece is
# U+2581 + text and a continuation "##x" is "x", the special tokens CONTROL).
#
#   gguf_bert.py [--arch bert|nomic-bert] [--pooling mean|cls|none] [--type f32|f16] [--seed N] -o OUT.gguf
#
# nomic-bert (conversion/bert.py's NomicBertModel, nomic-embed-text): no position_embd but
# RoPE (freq_base 1000), Q/K/V fused in attn_qkv, no biases, a SwiGLU FFN (ffn_gate, ffn_up).
#
# The vocabulary is BERT's layout in small: [PAD] 0, [unused*] 1..99, [UNK] 100, [CLS] 101,
# [SEP] 102, [MASK] 103, then single characters (word-initial and continuation), a few whole
# words and suffixes, so that greedy longest-match, [UNK] words, punctuation and case folding
# all occur in short test strings. Needs numpy.
import argparse
import os
import string
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf_common import finish  # noqa: E402  (same folder)

WORDS = ["the", "quick", "brown", "fox", "jump", "over", "lazy", "dog", "cat", "hello", "world", "once", "upon",
         "time", "there", "was", "little", "a", "an", "is", "it", "run", "park", "cafe", "deja", "vu", "embed", "ding"]
SUFFIXES = ["s", "ed", "ing", "ly", "er", "ding", "ps", "mps"]


def vocab():
    T = gguf.TokenType
    toks = [("[PAD]", T.CONTROL)] + [(f"[unused{i}]", T.CONTROL) for i in range(99)]
    toks += [("[UNK]", T.CONTROL), ("[CLS]", T.CONTROL), ("[SEP]", T.CONTROL), ("[MASK]", T.CONTROL)]
    seen = set(t for t, _ in toks)

    def add(t):
        if t not in seen:
            seen.add(t)
            toks.append((t, T.NORMAL))

    chars = string.ascii_lowercase + string.digits + ".,!?'-:;()"
    for c in chars:
        add("\u2581" + c)
    for c in string.ascii_lowercase + string.digits:
        add(c)
    for wd in WORDS:
        add("\u2581" + wd)
    for sf in SUFFIXES:
        add(sf)
    add("\u2581\u4e16")   # a CJK ideograph, a word of its own
    return toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="bert", choices=["bert", "nomic-bert"])
    ap.add_argument("--pooling", default="mean", choices=["mean", "cls", "none"])
    ap.add_argument("--type", default="f32", choices=["f32", "f16"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(a.seed)
    dim, L, H, ffn, ctx, n_types = 128, 2, 4, 256, 512, 2
    nomic = a.arch == "nomic-bert"
    w = gguf.GGUFWriter(a.out + ".tmp", a.arch)

    def add(name, shape, std, f32=False, mean=0.0):
        x = (mean + std * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(name, x if f32 or a.type == "f32" else x.astype(np.float16))

    def norm(prefix):
        add(prefix + ".weight", (dim,), 0.1, True, 1.0)
        add(prefix + ".bias", (dim,), 0.05, True)

    w.add_name(f"gguf-py-random-{a.arch}-seed{a.seed}")
    w.add_file_type({"f32": 0, "f16": 1}[a.type])
    # TextModel.set_gguf_parameters, then BertModel's
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    if nomic:
        w.add_rope_freq_base(1000.0)
    if a.pooling != "none":
        w.add_pooling_type({"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS}[a.pooling])
    toks = vocab()
    w.add_token_type_count(n_types)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in toks])
    w.add_token_types([int(k) for _, k in toks])
    w.add_unk_token_id(100)
    w.add_bos_token_id(101)   # SpecialVocab writes [CLS] as cls and the converter's bos
    w.add_sep_token_id(102)
    w.add_pad_token_id(0)
    w.add_mask_token_id(103)

    si = 1.0 / np.sqrt(dim)
    add("token_embd.weight", (len(toks), dim), 0.5)
    add("token_types.weight", (n_types, dim), 0.5, True)
    if not nomic:
        add("position_embd.weight", (ctx, dim), 0.5, True)
    norm("token_embd_norm")
    for il in range(L):
        p = f"blk.{il}."
        if nomic:
            add(p + "attn_qkv.weight", (3 * dim, dim), si)
            add(p + "attn_output.weight", (dim, dim), si)
            norm(p + "attn_output_norm")
            add(p + "ffn_gate.weight", (ffn, dim), si)
            add(p + "ffn_up.weight", (ffn, dim), si)
            add(p + "ffn_down.weight", (dim, ffn), 1 / np.sqrt(ffn))
            norm(p + "layer_output_norm")
            continue
        for t in ("q", "k", "v"):
            add(p + f"attn_{t}.weight", (dim, dim), si)
            add(p + f"attn_{t}.bias", (dim,), 0.1, True)
        add(p + "attn_output.weight", (dim, dim), si)
        add(p + "attn_output.bias", (dim,), 0.1, True)
        norm(p + "attn_output_norm")
        add(p + "ffn_up.weight", (ffn, dim), si)
        add(p + "ffn_up.bias", (ffn,), 0.1, True)
        add(p + "ffn_down.weight", (dim, ffn), 1 / np.sqrt(ffn))
        add(p + "ffn_down.bias", (dim,), 0.1, True)
        norm(p + "layer_output_norm")
    finish(w, a.out)


if __name__ == "__main__":
    main()
