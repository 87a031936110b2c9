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
# - embedding_length_per_layer_input 0 and shared_kv_layers 0 (what tokenmill runs).
import numpy as np

SHAPES = {
    "gemma4": dict(arch="gemma4", layers=5, dim=256, heads=4, kv_heads=2, kv_heads_full=1, head_dim=64,
                   head_dim_full=128, rot=64, ffn=512, ctx=4096, window=16, swa=[True, True, False, True, False],
                   partial_full=0.25, softcap=30.0, out_norm=20.0),
}


def write_gemma4(w, s, n_vocab, add, norm):
    dim, L, H, ffn = s["dim"], s["layers"], s["heads"], s["ffn"]
    hd_s, hd_f = s["head_dim"], s["head_dim_full"]
    swa = s["swa"]
    assert len(swa) == L
    # TextModel.set_gguf_parameters, then Gemma3Model's and Gemma4Model's keys
    w.add_context_length(s["ctx"])
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_block_count(L)
    w.add_head_count(H)
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
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_final_logit_softcapping(s["softcap"])
    # generate_extra_tensors: the global layers' proportional RoPE
    n_rot = int(hd_f * s["partial_full"] / 2)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd_f // 2 - n_rot), dtype=np.float32))
    si = 1.0 / np.sqrt(dim)
    add("token_embd.weight", (n_vocab, dim), 0.5 * si)   # tied output
    norm("output_norm.weight", dim, s["out_norm"])
    last_full = max(i for i in range(L) if not swa[i])
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
        norm(p + "ffn_norm.weight", dim)
        add(p + "ffn_gate.weight", (ffn, dim), si)
        add(p + "ffn_up.weight", (ffn, dim), si)
        add(p + "ffn_down.weight", (dim, ffn), 1 / np.sqrt(ffn))
        norm(p + "post_ffw_norm.weight", dim, 0.3)
        add(p + "layer_output_scale.weight", (1,), 0.2, True, 1.0)
