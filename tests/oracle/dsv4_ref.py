#!/usr/bin/env python3
# dsv4_ref: a numpy reference of DeepSeek V4's forward pass (`deepseek4` GGUFs), written from
# llama.cpp's graph (src/models/deepseek4.cpp) and its cache planner
# (src/llama-kv-cache-dsv4.cpp), one token at a time, so that each step of the design is
# plain to read and checked against llama.cpp itself (tests/e2e/oracle_dsv4.test.mjs):
#
#   dsv4_ref.py -m MODEL.gguf --input IN.json      (IN.json as tests/oracle/llama_eval.mjs)
#
# stdout: {"seqs": [{"top": [[[id, logprob] x K] per position], "greedy": [G ids]}]}.
#
# Per layer (hc = 4 residual streams X, (hc, dim)):
#   hc_pre:  mixes = fn . rmsnorm(X flat); pre = sigmoid(mixes[:hc]*s0 + b) + eps;
#            post = 2 sigmoid(mixes[hc:2hc]*s1 + b); comb = Sinkhorn(mixes[2hc:]*s2 + b)
#            (softmax over dst, + eps, column norm, then (iters-1) x row and column norms);
#            the sublayer's input is sum_h pre[h] X[h]
#   hc_post: X'[dst] = y * post[dst] + sum_src comb[src, dst] X[src]
#   attention: q = rmsnorm_per_head(wq_b(qnorm(wq_a x))), kv = kv_norm(wkv x) (one head,
#            K = V), RoPE (interleaved pairs) on the last n_rot dims; keys: the raw kv of the
#            last `sliding_window` positions, and for a compressed layer (ratio r) the entries
#            of the whole r-token groups completed so far (entry j: a per-dimension softmax
#            over the group's gate scores + ape[pos % r] weighting its kv projections; ratio 4
#            overlaps the previous group through a second half of the projections; rmsnorm,
#            RoPE at position r*j with the compressed base); ratio 4 keeps only the top-k
#            entries by the lightning indexer's score sum_h w_h relu(q_h . k_j); softmax with
#            a sink per head; the output is de-roped, then the grouped low-rank wo_a, wo_b
#   MoE: sqrt(softplus(logits)), top-k on probs + bias (or tid2eid[token] on hash layers),
#            weights renormalised and scaled; clamped SwiGLU (gate <= limit, |up| <= limit);
#            plus the shared expert
# Head: pre = sigmoid(fn . rmsnorm(X flat) * s + b) + eps, sum_h pre[h] X[h], output norm.
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


def load(path):
    r = gguf.GGUFReader(path)
    kv = {}
    for name, f in r.fields.items():
        if name.startswith("tokenizer."):
            continue
        c = f.contents()
        kv[name] = c
    T = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            a = np.array(t.data).reshape(shape)
        else:
            a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        T[t.name] = a
    return kv, T


def rms(x, eps):
    x = x.astype(np.float32)
    return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps).astype(np.float32)


def rope(v, pos, n_rot, base, inverse=False):
    """interleaved pairs on the last n_rot dims of v (..., d)"""
    v = v.copy()
    off = v.shape[-1] - n_rot
    i = np.arange(n_rot // 2)
    theta = pos * base ** (-2.0 * i / n_rot)
    c, s = np.cos(theta), np.sin(theta)
    if inverse:
        s = -s
    x0 = v[..., off + 2 * i].copy()
    x1 = v[..., off + 2 * i + 1].copy()
    v[..., off + 2 * i] = x0 * c - x1 * s
    v[..., off + 2 * i + 1] = x0 * s + x1 * c
    return v


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


class Model:
    def __init__(self, path):
        kv, self.T = load(path)
        a = "deepseek4."

        def k(name, d=None):
            v = kv.get(a + name, d)
            return v
        self.ratios = list(k("attention.compress_ratios"))
        self.L = int(k("block_count")) - int(k("nextn_predict_layers", 0))
        self.dim = int(k("embedding_length"))
        self.H = int(k("attention.head_count"))
        self.hd = int(k("attention.key_length"))
        self.n_rot = int(k("rope.dimension_count"))
        self.eps = float(k("attention.layer_norm_rms_epsilon"))
        self.base = float(k("rope.freq_base", 10000.0))
        self.cbase = float(k("attention.compress_rope_freq_base"))
        self.swa = int(k("attention.sliding_window"))
        self.o_groups = int(k("attention.output_group_count"))
        self.o_lora = int(k("attention.output_lora_rank"))
        self.hc = int(k("hyper_connection.count"))
        self.sk_iters = int(k("hyper_connection.sinkhorn_iterations"))
        self.hc_eps = float(k("hyper_connection.epsilon"))
        self.n_hash = int(k("hash_layer_count"))
        self.used = int(k("expert_used_count"))
        self.w_norm = bool(k("expert_weights_norm", False))
        self.w_scale = float(k("expert_weights_scale", 1.0))
        cl = k("swiglu_clamp_exp")
        self.clamp = list(cl) if hasattr(cl, "__len__") else [float(cl)] * self.L
        cs = k("swiglu_clamp_shexp", cl)
        self.clamp_sh = list(cs) if hasattr(cs, "__len__") else [float(cs)] * self.L
        self.ih = int(k("attention.indexer.head_count"))
        self.idim = int(k("attention.indexer.key_length"))
        self.topk = int(k("attention.indexer.top_k"))
        assert k("expert_gating_func") == 4, "sqrt-softplus scoring"

    def new_state(self):
        # per layer: raw kv rows, compressor projections per position, compressed entries
        return [dict(raw=[], ckv=[], csc=[], comp=[], ikv=[], isc=[], icomp=[]) for _ in range(self.L)]

    def hc_pre(self, X, fn, scale, base):
        hc = self.hc
        mixes = self.T[fn] @ rms(X.reshape(-1), self.eps)
        s, b = self.T[scale], self.T[base]
        pre = sigmoid(mixes[:hc] * s[0] + b[:hc]) + self.hc_eps
        post = 2.0 * sigmoid(mixes[hc:2 * hc] * s[1] + b[hc:2 * hc])
        comb = (mixes[2 * hc:] * s[2] + b[2 * hc:]).reshape(hc, hc)  # [src, dst]
        comb = softmax(comb, axis=1) + self.hc_eps
        comb = comb / (comb.sum(axis=0, keepdims=True) + self.hc_eps)
        for _ in range(1, self.sk_iters):
            comb = comb / (comb.sum(axis=1, keepdims=True) + self.hc_eps)
            comb = comb / (comb.sum(axis=0, keepdims=True) + self.hc_eps)
        return (pre[:, None] * X).sum(axis=0), post, comb

    @staticmethod
    def hc_post(y, X, post, comb):
        return y[None, :] * post[:, None] + comb.T @ X

    def compress(self, kvs, scs, j, r, overlap, norm, d):
        """entry j of ratio r from the per-position projections kvs/scs"""
        cur = slice(r * j, r * j + r)
        if overlap:
            v_cur, s_cur = np.array(kvs[cur])[:, d:], np.array(scs[cur])[:, d:]
            if j == 0:
                v_prev, s_prev = np.zeros((r, d), np.float32), np.full((r, d), -np.inf, np.float32)
            else:
                prev = slice(r * (j - 1), r * j)
                v_prev, s_prev = np.array(kvs[prev])[:, :d], np.array(scs[prev])[:, :d]
            v, s = np.concatenate([v_prev, v_cur]), np.concatenate([s_prev, s_cur])
        else:
            v, s = np.array(kvs[cur]), np.array(scs[cur])
        c = (softmax(s, axis=0) * v).sum(axis=0)
        c = rms(c, self.eps) * self.T[norm]
        return rope(c, r * j, self.n_rot, self.cbase)

    def attention(self, il, x, pos, st):
        T, p = self.T, f"blk.{il}."
        H, hd, ratio = self.H, self.hd, self.ratios[il]
        base = self.cbase if ratio else self.base
        qr = rms(T[p + "attn_q_a.weight"] @ x, self.eps) * T[p + "attn_q_a_norm.weight"]
        q = rms((T[p + "attn_q_b.weight"] @ qr).reshape(H, hd), self.eps)
        q = rope(q, pos, self.n_rot, base)
        kv = rms(T[p + "attn_kv.weight"] @ x, self.eps) * T[p + "attn_kv_a_norm.weight"]
        kv = rope(kv, pos, self.n_rot, base)
        st["raw"].append(kv)
        keys = st["raw"][max(0, pos + 1 - self.swa):pos + 1]
        if ratio:
            st["ckv"].append(T[p + "attn_compressor_kv.weight"] @ x)
            st["csc"].append(T[p + "attn_compressor_gate.weight"] @ x + T[p + "attn_compressor_ape.weight"][pos % ratio])
            if ratio == 4:
                st["ikv"].append(T[p + "indexer_compressor_kv.weight"] @ x)
                st["isc"].append(T[p + "indexer_compressor_gate.weight"] @ x +
                                 T[p + "indexer_compressor_ape.weight"][pos % ratio])
            if (pos + 1) % ratio == 0:
                j = pos // ratio
                st["comp"].append(self.compress(st["ckv"], st["csc"], j, ratio, ratio == 4,
                                                p + "attn_compressor_norm.weight", hd))
                if ratio == 4:
                    st["icomp"].append(self.compress(st["ikv"], st["isc"], j, ratio, True,
                                                     p + "indexer_compressor_norm.weight", self.idim))
            comp = st["comp"]
            if ratio == 4 and len(comp) > 0:
                qi = (T[p + "indexer.attn_q_b.weight"] @ qr).reshape(self.ih, self.idim)
                qi = rope(qi, pos, self.n_rot, self.cbase)
                wi = (T[p + "indexer.proj.weight"] @ x) / np.sqrt(self.idim * self.ih)
                K = np.array(st["icomp"])
                score = (np.maximum(qi @ K.T, 0.0) * wi[:, None]).sum(axis=0)
                sel = np.argsort(-score, kind="stable")[:self.topk]
                comp = [comp[i] for i in sorted(sel)]
            keys = keys + list(comp)
        K = np.array(keys)                                   # (n, hd), also the values
        sc = (q @ K.T) / np.sqrt(hd)                         # (H, n)
        sink = T[p + "attn_sinks.weight"]
        m = np.maximum(sc.max(axis=1), sink)
        e = np.exp(sc - m[:, None])
        den = e.sum(axis=1) + np.exp(sink - m)
        out = (e @ K) / den[:, None]                         # (H, hd)
        out = rope(out, pos, self.n_rot, base, inverse=True)
        g = self.o_groups
        og = out.reshape(g, -1)
        wa = T[p + "attn_output_a.weight"].reshape(g, self.o_lora, -1)
        oa = np.concatenate([wa[i] @ og[i] for i in range(g)])
        return T[p + "attn_output_b.weight"] @ oa

    def moe(self, il, x, token):
        T, p = self.T, f"blk.{il}."
        logits = T[p + "ffn_gate_inp.weight"] @ x
        probs = np.sqrt(np.logaddexp(0.0, logits))
        if il < self.n_hash:
            sel = T[p + "ffn_gate_tid2eid.weight"][token]
        else:
            sel = np.argsort(-(probs + T[p + "exp_probs_b.bias"]), kind="stable")[:self.used]
        w = probs[sel]
        if self.w_norm:
            w = w / max(w.sum(), 6.103515625e-5)
        if self.w_scale not in (0.0, 1.0):
            w = w * self.w_scale
        lim = self.clamp[il]

        def swiglu(g, u, lim):
            if lim > 1e-6:
                g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
            return g / (1.0 + np.exp(-g)) * u
        out = np.zeros_like(x)
        for e, we in zip(sel, w):
            h = swiglu(T[p + "ffn_gate_exps.weight"][e] @ x, T[p + "ffn_up_exps.weight"][e] @ x, lim)
            out = out + we * (T[p + "ffn_down_exps.weight"][e] @ h)
        h = swiglu(T[p + "ffn_gate_shexp.weight"] @ x, T[p + "ffn_up_shexp.weight"] @ x, self.clamp_sh[il])
        return out + T[p + "ffn_down_shexp.weight"] @ h

    def step(self, token, pos, state):
        T = self.T
        X = np.repeat(T["token_embd.weight"][token][None, :], self.hc, axis=0)
        for il in range(self.L):
            p = f"blk.{il}."
            cur, post, comb = self.hc_pre(X, p + "hc_attn_fn.weight", p + "hc_attn_scale.weight", p + "hc_attn_base.weight")
            cur = rms(cur, self.eps) * T[p + "attn_norm.weight"]
            X = self.hc_post(self.attention(il, cur, pos, state[il]), X, post, comb)
            cur, post, comb = self.hc_pre(X, p + "hc_ffn_fn.weight", p + "hc_ffn_scale.weight", p + "hc_ffn_base.weight")
            cur = rms(cur, self.eps) * T[p + "ffn_norm.weight"]
            X = self.hc_post(self.moe(il, cur, token), X, post, comb)
        mixes = T["output_hc_fn.weight"] @ rms(X.reshape(-1), self.eps)
        pre = sigmoid(mixes * T["output_hc_scale.weight"][0] + T["output_hc_base.weight"]) + self.hc_eps
        y = rms((pre[:, None] * X).sum(axis=0), self.eps) * T["output_norm.weight"]
        return T["output.weight"] @ y


def top(logits, k):
    l = logits.astype(np.float64)
    lp = l - (np.max(l) + np.log(np.sum(np.exp(l - np.max(l)))))
    idx = np.argsort(-lp, kind="stable")[:k]
    return [[int(i), float(lp[i])] for i in idx]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--input", required=True)
    a = ap.parse_args()
    inp = json.load(open(a.input))
    m = Model(a.model)
    out = []
    for seq in inp["seqs"]:
        st = m.new_state()
        tops, greedy = [], []
        logits = None
        for pos, t in enumerate(seq):
            logits = m.step(t, pos, st)
            tops.append(top(logits, inp.get("top", 10)))
        pos = len(seq)
        for g in range(inp.get("greedy", 0)):
            nxt = int(np.argmax(logits))
            greedy.append(nxt)
            if g + 1 < inp.get("greedy", 0):
                logits = m.step(nxt, pos, st)
                pos += 1
        out.append(dict(top=tops, greedy=greedy))
    json.dump(dict(seqs=out), sys.stdout)


if __name__ == "__main__":
    main()
