# gguf_gemma4: the gemma4 shapes of gguf_arch.py (which calls write_gemma4 for them): Gemma 4's
# text layer in small, with the keys and tensors of llama.cpp's Gemma4Model converter
# (conversion/gemma.py) and llama.cpp's gemma4 loader (src/models/gemma4.cpp):
#
# - a per-layer sliding_window_pattern array (true: a window layer) and a per-layer
#   head_count_kv array: window layers with 2 kv heads of 64, global layers with 1 kv head of
#   128 (the 31B's 256/512 and 16/4 halved twice over);
# - window layers rotate all 64 dims with freq_base_swa 10000; global layers their whole head
#   with freq_base 1e6 and `rope_freqs` (1 on the first quarter of the pairs, 1e30 on the rest:
#   Gemma's proportional partial rotation, partial_rotary_factor 0.25, as the converter writes it);
# - q/k head norms, v heads normed without a weight, attn_v absent on the last global layer (V is
#   K, the 31B's attention_k_eq_v), post-norms, GELU FFN, layer_output_scale per layer, the
#   final logit soft cap, a tied output;
# - embedding_length_per_layer_input 0 and shared_kv_layers 0 (the plain shape).
#
# gemma4-moe: the 26B-A4B's layer: every layer's dense FFN is its shared MLP, beside 8 experts of
# 128 (2 used per token) routed on ffn_gate_inp with its input scale (ffn_gate_inp.scale), the
# per-expert output scale (ffn_down_exps.scale), the three extra norms; experts' gate and up
# fused (ffn_gate_up_exps, as the converter maps experts.gate_up_proj) except on layer 0, whose
# are apart (ffn_gate_exps / ffn_up_exps: llama.cpp loads either).
# gemma4-e: E2B's and E4B's features: per-layer embeddings of 32 per layer, and 3 shared KV
# layers of 7 (layers 4..6 read layer 3's K/V (global) or layer 2's (window)) with the
# double-wide MLP (feed_forward_length an array, 2x on the shared layers).
import numpy as np

SHAPES = {
    "gemma4": dict(arch="gemma4", layers=5, dim=256, heads=4, kv_heads=2, kv_heads_full=1, head_dim=64,
                   head_dim_full=128, rot=64, ffn=512, ctx=4096, window=16, swa=[True, True, False, True, False],
                   partial_full=0.25, softcap=30.0, out_norm=20.0),
}
SHAPES["gemma4-moe"] = dict(SHAPES["gemma4"], experts=8, experts_used=2, expert_ffn=128)
SHAPES["gemma4-e"] = dict(SHAPES["gemma4"], layers=7, swa=[True, True, True, False, True, True, False], per_layer=32,
                          shared_kv=3, double_wide=True)
# each of gemma4-e's two features alone
SHAPES["gemma4-ple"] = dict(SHAPES["gemma4"], per_layer=32)
SHAPES["gemma4-shared"] = dict(SHAPES["gemma4-e"], per_layer=0)


def write_gemma4(w, s, n_vocab, add, norm):
    dim, L, H, ffn = s["dim"], s["layers"], s["heads"], s["ffn"]
    hd_s, hd_f = s["head_dim"], s["head_dim_full"]
    swa = s["swa"]
    assert len(swa) == L
    # TextModel.set_gguf_parameters, then Gemma3Model's and Gemma4Model's keys
    w.add_context_length(s["ctx"])
    w.add_embedding_length(dim)
    if not s.get("double_wide"):
        w.add_feed_forward_length(ffn)
    w.add_block_count(L)
    w.add_head_count(H)
    n_kv = L - s.get("shared_kv", 0)
    if s.get("double_wide"):   # Gemma4Model.set_gguf_parameters: use_double_wide_mlp
        w.add_feed_forward_length([ffn if il < n_kv else 2 * ffn for il in range(L)])
    w.add_head_count_kv([s["kv_heads"] if t else s["kv_heads_full"] for t in swa])
    w.add_key_length(hd_f)
    w.add_value_length(hd_f)
    w.add_key_length_swa(hd_s)
    w.add_value_length_swa(hd_s)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_rope_dimension_count(hd_f)
    w.add_rope_dimension_count_swa(hd_s)
    w.add_sliding_window(s["window"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(s.get("shared_kv", 0))
    w.add_embedding_length_per_layer_input(s.get("per_layer", 0))
    ne = s.get("experts", 0)
    if ne:
        w.add_expert_count(ne)
        w.add_expert_used_count(s["experts_used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
    w.add_final_logit_softcapping(s["softcap"])
    # generate_extra_tensors: the global layers' proportional RoPE
    n_rot = int(hd_f * s["partial_full"] / 2)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd_f // 2 - n_rot), dtype=np.float32))
    si = 1.0 / np.sqrt(dim)
    add("token_embd.weight", (n_vocab, dim), 0.5 * si)   # tied output
    norm("output_norm.weight", dim, s["out_norm"])
    pl = s.get("per_layer", 0)
    if pl:   # gemma3n's per-layer embedding tensors, which Gemma 4 keeps
        add("per_layer_token_embd.weight", (n_vocab, L * pl), 1.0)
        add("per_layer_model_proj.weight", (L * pl, dim), si)
        norm("per_layer_proj_norm.weight", pl)
    last_full = max(i for i in range(n_kv) if not swa[i])
    for il in range(L):
        p = f"blk.{il}."
        hd = hd_s if swa[il] else hd_f
        kvh = s["kv_heads"] if swa[il] else s["kv_heads_full"]
        norm(p + "attn_norm.weight", dim)
        add(p + "attn_q.weight", (H * hd, dim), si)
        add(p + "attn_k.weight", (kvh * hd, dim), si)
        if il != last_full:
            add(p + "attn_v.weight", (kvh * hd, dim), si)
        add(p + "attn_output.weight", (dim, H * hd), 1 / np.sqrt(H * hd))
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
        norm(p + "post_attention_norm.weight", dim, 0.3)
        ff = 2 * ffn if s.get("double_wide") and il >= n_kv else ffn
        norm(p + "ffn_norm.weight", dim)
        add(p + "ffn_gate.weight", (ff, dim), si)
        add(p + "ffn_up.weight", (ff, dim), si)
        add(p + "ffn_down.weight", (dim, ff), 1 / np.sqrt(ff))
        norm(p + "post_ffw_norm.weight", dim, 0.3)
        if ne:
            ef = s["expert_ffn"]
            add(p + "ffn_gate_inp.weight", (ne, dim), 1.0)
            norm(p + "ffn_gate_inp.scale", dim)
            norm(p + "pre_ffw_norm_2.weight", dim)
            norm(p + "post_ffw_norm_1.weight", dim, 0.3)
            norm(p + "post_ffw_norm_2.weight", dim, 0.3)
            if il == 0:
                add(p + "ffn_gate_exps.weight", (ne, ef, dim), si)
                add(p + "ffn_up_exps.weight", (ne, ef, dim), si)
            else:
                add(p + "ffn_gate_up_exps.weight", (ne, 2 * ef, dim), si)
            add(p + "ffn_down_exps.weight", (ne, dim, ef), 1 / np.sqrt(ef))
            add(p + "ffn_down_exps.scale", (ne,), 0.3, True, 1.0)
        if pl:
            add(p + "inp_gate.weight", (pl, dim), si)
            add(p + "proj.weight", (dim, pl), 1 / np.sqrt(pl))
            norm(p + "post_norm.weight", dim, 0.3)
        add(p + "layer_output_scale.weight", (1,), 0.2, True, 1.0)
