#!/usr/bin/env python3
# gguf_moe: writes a small random-weight mixture-of-experts GGUF with llama.cpp's own gguf-py
# (tests/data/llama.cpp/gguf-py, after scripts/fetch-testdata.sh), so that the oracle tests
# read a file that tokenmill's mkmodel did not write: tensor names, shapes, metadata keys and
# value types, quantised blocks (gguf-py's Q8_0 and MXFP4 quantisers) are llama.cpp's.
#
#   gguf_moe.py --shape qwen3moe|deepseek2-v3|deepseek2-v2|gpt-oss|glm4moe|glm4moe-qknorm|mistral4
#               --vocab VOCAB.gguf
#               [--type f32|f16|q8_0|mxfp4] [--seed N] [--drop SUBSTR] [--extra KEY=V] -o OUT.gguf
#
# --drop leaves out every tensor whose name contains SUBSTR and --extra adds a key (an integer,
# a float, or a comma-separated int32 array): the loaders' tests of malformed files.
#
# The vocabulary (every tokenizer.* key) is copied from VOCAB.gguf. Shapes are the families'
# layers in small (see SHAPES); the metadata is what llama.cpp's converters write for the
# real models (convert_hf_to_gguf.py's DeepseekV2Model / GptOssModel / Qwen3MoeModel /
# Glm4MoeModel / Mistral3Model's Mistral4Model).
# Weights: N(0, 1/fan_in) matrices, norms near 1, the final norm near 20 and small
# embeddings (as mkmodel, so that logits have a spread of a few units), the router's logits
# with a standard deviation near 2.
# Needs python3 with numpy (Debian: python3-numpy).
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf_common import copy_vocab, finish, put  # noqa: E402

SHAPES = {
    # Qwen3-30B-A3B's layer in small: 16 experts, 4 per token, per-head q/k norms
    "qwen3moe": dict(arch="qwen3moe", layers=3, dim=256, heads=4, kv_heads=2, head_dim=64, experts=16, used=4,
                     expert_ffn=128, ffn=512),
    # DeepSeek-V3's: q-LoRA 96, MLA, a dense lead layer, the sigmoid router with its selection
    # bias, 8 groups of 4 experts of which 4 groups are kept (group score: the sum of the two
    # best), 6 experts per token, normalised weights times 2.5, one shared expert
    "deepseek2-v3": dict(arch="deepseek2", layers=4, dim=256, heads=4, q_lora=96, kv_lora=128, nope=32, rope=32,
                         v_dim=32, experts=32, used=6, expert_ffn=128, ffn=512, shared=1, dense=1, sigmoid=True,
                         groups=8, groups_used=4, w_scale=2.5, w_norm=True),
    # DeepSeek-V2-Lite's: no q-LoRA, the softmax router without renormalisation, 2 shared experts
    "deepseek2-v2": dict(arch="deepseek2", layers=3, dim=256, heads=4, q_lora=0, kv_lora=128, nope=32, rope=32,
                         v_dim=32, experts=16, used=4, expert_ffn=128, ffn=512, shared=2, dense=1, sigmoid=False,
                         groups=0, groups_used=0, w_scale=1.0, w_norm=False),
    # gpt-oss-20b's: a sliding window on the even layers, sinks, biases, YaRN, 8 experts of
    # which 2 per token (softmax over the chosen logits), the clamped SwiGLU
    "gpt-oss": dict(arch="gpt-oss", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, experts=8, used=2,
                    expert_ffn=128, ffn=128, window=16),
    # GLM-4.5-Air's layer in small: biased Q/K/V, NEOX RoPE over half of each head
    # (partial_rotary_factor 0.5), a dense lead layer, the sigmoid router with its selection
    # bias and no groups (n_group 1), normalised weights times a routed scale (GLM-4.5's 2.5),
    # one shared expert, and the NextN (MTP) block after the model's layers
    "glm4moe": dict(arch="glm4moe", layers=3, dim=256, heads=4, kv_heads=2, head_dim=64, rope=32, experts=16,
                    used=4, expert_ffn=128, ffn=512, shared=1, dense=1, w_scale=2.5, qk_norm=False, nextn=1),
    # GLM-4.5 (355B)'s variant: per-head q/k norms (use_qk_norm)
    "glm4moe-qknorm": dict(arch="glm4moe", layers=3, dim=256, heads=4, kv_heads=2, head_dim=64, rope=32,
                           experts=16, used=4, expert_ffn=128, ffn=512, shared=1, dense=1, w_scale=2.5,
                           qk_norm=True, nextn=0),
    # Mistral 4: the converter is DeepseekV2Model's under another name; V3's layer without groups
    "mistral4": dict(arch="mistral4", layers=3, dim=256, heads=4, q_lora=96, kv_lora=128, nope=32, rope=32,
                     v_dim=32, experts=16, used=4, expert_ffn=128, ffn=512, shared=1, dense=1, sigmoid=False,
                     groups=0, groups_used=0, w_scale=1.0, w_norm=True),
}
MLA = ("deepseek2", "mistral4")



class Writer:
    def __init__(self, w, rng, qtype, exps_qtype, drop=()):
        self.w, self.rng, self.qtype, self.exps_qtype, self.drop = w, rng, qtype, exps_qtype, drop

    def add(self, name, shape, std, kind="mat", mean=0.0):
        """shape in numpy order (rows..., cols); kind: mat (the file's type), exps (the
        experts' type), f32 (always F32: norms, biases, routers)."""
        a = (mean + std * self.rng.standard_normal(shape)).astype(np.float32)
        if any(d in name for d in self.drop):   # drawn all the same: the other tensors keep their values
            return
        t = {"mat": self.qtype, "exps": self.exps_qtype, "f32": gguf.GGMLQuantizationType.F32}[kind]
        put(self.w, name, a, t)

    def norm(self, name, n, mean=1.0):
        self.add(name, (n,), 0.1 * mean, "f32", mean)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--type", default="f32", choices=["f32", "f16", "q8_0", "mxfp4"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                    help="override one of the shape's numbers (e.g. q_lora=128)")
    ap.add_argument("--drop", action="append", default=[], metavar="SUBSTR")
    ap.add_argument("--extra", action="append", default=[], metavar="KEY=V")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    for kv in a.set:
        k, v = kv.split("=", 1)
        if k not in s:
            sys.exit(f"gguf_moe: --set {k}: not a number of shape {a.shape}")
        s[k] = type(s[k])(float(v)) if not isinstance(s[k], bool) else v in ("1", "true")
    Q = gguf.GGMLQuantizationType
    qtype = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "mxfp4": Q.Q8_0}[a.type]
    exps_qtype = Q.MXFP4 if a.type == "mxfp4" else qtype
    if a.type == "mxfp4" and s["arch"] != "gpt-oss":
        sys.exit("gguf_moe: --type mxfp4 is gpt-oss's")
    arch = s["arch"]
    w = gguf.GGUFWriter(a.out + ".tmp", arch)
    rng = np.random.default_rng(a.seed)
    W = Writer(w, rng, qtype, exps_qtype, a.drop)
    for kv in a.extra:
        k, v = kv.split("=", 1)
        if "," in v:
            w.add_array(k, [int(x) for x in v.split(",")])
        elif "." in v:
            w.add_float32(k, float(v))
        else:
            w.add_uint32(k, int(v))

    w.add_name(f"gguf-py-random-{a.shape}-seed{a.seed}")
    w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7, "mxfp4": 38}[a.type])
    if qtype not in (Q.F32, Q.F16):
        w.add_quantization_version(2)
    n_vocab = copy_vocab(w, a.vocab)
    dim, L, H = s["dim"], s["layers"], s["heads"]
    ne, ef = s["experts"], s["expert_ffn"]
    nextn = s.get("nextn", 0)
    w.add_block_count(L + nextn)
    w.add_context_length(4096 if arch not in MLA else 163840)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(H)
    w.add_layer_norm_rms_eps(1e-6 if arch in MLA else 1e-5)
    w.add_expert_count(ne)
    w.add_expert_used_count(s["used"])
    w.add_expert_feed_forward_length(ef)
    if arch in MLA:
        w.add_head_count_kv(1)
        w.add_rope_freq_base(10000.0)
        w.add_leading_dense_block_count(s["dense"])
        w.add_vocab_size(n_vocab)
        # llama.cpp requires the key unless the layer count says V2-Lite (27): 0 is "none"
        w.add_q_lora_rank(s["q_lora"])
        w.add_kv_lora_rank(s["kv_lora"])
        w.add_key_length(s["kv_lora"] + s["rope"])
        w.add_value_length(s["kv_lora"])
        w.add_key_length_mla(s["nope"] + s["rope"])
        w.add_value_length_mla(s["v_dim"])
        w.add_expert_shared_count(s["shared"])
        w.add_expert_weights_scale(s["w_scale"])
        if s["w_norm"]:
            w.add_expert_weights_norm(True)
        w.add_rope_dimension_count(s["rope"])
        if s["groups"]:
            w.add_expert_group_count(s["groups"])
            w.add_expert_group_used_count(s["groups_used"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if s["sigmoid"] else
                                 gguf.ExpertGatingFuncType.SOFTMAX)
    elif arch == "gpt-oss":
        w.add_head_count_kv(s["kv_heads"])
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
        w.add_rope_freq_base(150000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_sliding_window(s["window"])
    elif arch == "glm4moe":
        w.add_head_count_kv(s["kv_heads"])
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
        w.add_rope_freq_base(1000000.0)
        w.add_rope_dimension_count(s["rope"])
        w.add_expert_shared_count(s["shared"])
        w.add_leading_dense_block_count(s["dense"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(s["w_scale"])
        w.add_expert_weights_norm(True)
        if nextn:
            w.add_nextn_predict_layers(nextn)
    else:
        w.add_head_count_kv(s["kv_heads"])
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
        w.add_rope_freq_base(1000000.0)

    si = 1.0 / np.sqrt(dim)
    W.add("token_embd.weight", (n_vocab, dim), 0.5 * si)
    W.norm("output_norm.weight", dim, 20.0)
    W.add("output.weight", (n_vocab, dim), 0.5 * si)
    for il in range(L + nextn):
        p = f"blk.{il}."
        W.norm(p + "attn_norm.weight", dim)
        if arch in MLA:
            kq = s["nope"] + s["rope"]
            if s["q_lora"]:
                W.add(p + "attn_q_a.weight", (s["q_lora"], dim), si)
                W.norm(p + "attn_q_a_norm.weight", s["q_lora"])
                W.add(p + "attn_q_b.weight", (H * kq, s["q_lora"]), 1 / np.sqrt(s["q_lora"]))
            else:
                W.add(p + "attn_q.weight", (H * kq, dim), si)
            W.add(p + "attn_kv_a_mqa.weight", (s["kv_lora"] + s["rope"], dim), si)
            W.norm(p + "attn_kv_a_norm.weight", s["kv_lora"])
            W.add(p + "attn_k_b.weight", (H, s["kv_lora"], s["nope"]), 1 / np.sqrt(s["nope"]))
            W.add(p + "attn_v_b.weight", (H, s["v_dim"], s["kv_lora"]), 1 / np.sqrt(s["kv_lora"]))
            W.add(p + "attn_output.weight", (dim, H * s["v_dim"]), 1 / np.sqrt(H * s["v_dim"]))
        else:
            hd, kvh = s["head_dim"], s["kv_heads"]
            W.add(p + "attn_q.weight", (H * hd, dim), si)
            W.add(p + "attn_k.weight", (kvh * hd, dim), si)
            W.add(p + "attn_v.weight", (kvh * hd, dim), si)
            W.add(p + "attn_output.weight", (dim, H * hd), 1 / np.sqrt(H * hd))
            if arch == "qwen3moe" or s.get("qk_norm"):
                W.norm(p + "attn_q_norm.weight", hd)
                W.norm(p + "attn_k_norm.weight", hd)
            if arch == "glm4moe":
                W.add(p + "attn_q.bias", (H * hd,), 0.3, "f32")
                W.add(p + "attn_k.bias", (kvh * hd,), 0.3, "f32")
                W.add(p + "attn_v.bias", (kvh * hd,), 0.3, "f32")
            elif arch == "gpt-oss":
                W.add(p + "attn_q.bias", (H * hd,), 0.3, "f32")
                W.add(p + "attn_k.bias", (kvh * hd,), 0.3, "f32")
                W.add(p + "attn_v.bias", (kvh * hd,), 0.3, "f32")
                W.add(p + "attn_output.bias", (dim,), 0.1, "f32")
                W.add(p + "attn_sinks.weight", (H,), 1.0, "f32")
        if arch in ("gpt-oss", "glm4moe"):
            W.norm(p + "post_attention_norm.weight", dim)
        else:
            W.norm(p + "ffn_norm.weight", dim)
        if il >= L:   # the NextN block's own tensors (its embedding and head are the model's)
            W.add(p + "nextn.eh_proj.weight", (dim, 2 * dim), 1 / np.sqrt(2 * dim))
            W.norm(p + "nextn.enorm.weight", dim)
            W.norm(p + "nextn.hnorm.weight", dim)
            W.norm(p + "nextn.shared_head_norm.weight", dim, 20.0)
        if arch in MLA + ("glm4moe",) and il < s["dense"]:
            W.add(p + "ffn_gate.weight", (s["ffn"], dim), si)
            W.add(p + "ffn_up.weight", (s["ffn"], dim), si)
            W.add(p + "ffn_down.weight", (dim, s["ffn"]), 1 / np.sqrt(s["ffn"]))
            continue
        W.add(p + "ffn_gate_inp.weight", (ne, dim), 2 * si, "f32")
        W.add(p + "ffn_gate_exps.weight", (ne, ef, dim), si, "exps")
        W.add(p + "ffn_up_exps.weight", (ne, ef, dim), si, "exps")
        W.add(p + "ffn_down_exps.weight", (ne, dim, ef), 1 / np.sqrt(ef), "exps")
        if arch == "gpt-oss":
            W.add(p + "ffn_gate_inp.bias", (ne,), 0.3, "f32")
            W.add(p + "ffn_gate_exps.bias", (ne, ef), 0.3, "f32")
            W.add(p + "ffn_up_exps.bias", (ne, ef), 0.3, "f32")
            W.add(p + "ffn_down_exps.bias", (ne, dim), 0.1, "f32")
        if arch in MLA + ("glm4moe",):
            if arch == "glm4moe" or s["sigmoid"]:
                W.add(p + "exp_probs_b.bias", (ne,), 0.05, "f32")
            sh = ef * s["shared"]
            W.add(p + "ffn_gate_shexp.weight", (sh, dim), si)
            W.add(p + "ffn_up_shexp.weight", (sh, dim), si)
            W.add(p + "ffn_down_shexp.weight", (dim, sh), 1 / np.sqrt(sh))

    finish(w, a.out)


if __name__ == "__main__":
    main()
