/*
 * model_gemma3: `gemma3` files (Gemma 3 text, as llama.cpp's Gemma3Model converts it), run as
 * llama.cpp's gemma3 graph does:
 *
 * - the embedding rows times sqrt(dim) (engine: hp.embd_scale);
 * - every norm a plain RMS norm: Gemma's (1 + w) weights are stored with the 1 already added
 *   by the converter (its norm_shift), so the file's weight is the multiplier;
 * - each layer: attn_norm, Q/K/V, an RMS norm per q and k head (qwen3's), NEOX RoPE, attention,
 *   attn_output, then `post_attention_norm` on the attention's output before the residual add;
 *   `ffn_norm`, GELU(gate) * up (ggml's tanh GELU, hp.ffn_gelu), ffn_down, `post_ffw_norm` on the
 *   FFN's output before its residual add;
 * - sliding-window layers beside global ones: with attention.sliding_window W, of each
 *   attention.sliding_window_pattern layers (default 6, as the converter leaves it out) all but
 *   the last see only the last W positions (llama.cpp's set_swa_pattern); they rotate with
 *   rope.freq_base_swa (default 10000) and no frequency scaling, the global layers with
 *   rope.freq_base and rope.scaling (Gemma 3 4B..27B: linear, factor 8). Without the window key
 *   every layer is global;
 * - the score scale 1/sqrt(head_dim), except for the 62-layer (27B) shape, whose queries are
 *   scaled by 1/sqrt(dim / n_heads) as Gemma's reference config (and llama.cpp) do;
 * - final_logit_softcapping c, when the file has it: logits = c * tanh(logits / c).
 *
 * Vision tensors live in a separate mmproj file; a text GGUF has none. Gemma 4 (`gemma4`) is
 * model_gemma4.c's.
 */
#include <math.h>
#include <stdio.h>

#include "model/model_int.h"

#define GEMMA3_SWA_PERIOD 6   /* llama.cpp's default sliding_window_pattern for gemma3 */

bool model_gemma3_hparams(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    int64_t swa, period = GEMMA3_SWA_PERIOD;
    double base_swa, cap;
    if (!model_key_int(ld, "gemma3.attention.sliding_window", false, 0, &swa)) return false;
    if (!model_key_float(ld, "gemma3.rope.freq_base_swa", 10000.0, &base_swa)) return false;
    if (!model_key_float(ld, "gemma3.final_logit_softcapping", 0.0, &cap)) return false;
    /* an array here (Gemma 4's per-layer form) is skipped by llama.cpp's gemma3 loader, which
     * keeps the period 6: so is it here, so that both run such a file alike */
    gguf_vtype elt;
    uint64_t n;
    const void *data;
    if (!gguf_get_arr(m->g, "gemma3.attention.sliding_window_pattern", &elt, &n, &data) &&
        !model_key_int(ld, "gemma3.attention.sliding_window_pattern", false, GEMMA3_SWA_PERIOD, &period))
        return false;
    if (swa < 0 || swa > (1 << 24) || period < 0 || period > 4096 || !(base_swa > 0) || !(cap >= 0 && cap < 1e6)) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad gemma3 hyper-parameters: sliding_window %lld (0..%d), sliding_window_pattern "
                   "%lld (0..4096), rope.freq_base_swa %g, final_logit_softcapping %g", (long long)swa, 1 << 24,
                   (long long)period, base_swa, cap);
        return false;
    }
    if (hp->rope_yarn[0] != 0.0f || hp->rope_freq_factors) {
        model_fail(ld, GGUF_ERR_FORMAT, "gemma3: unsupported RoPE scaling (only linear)");
        return false;
    }
    hp->n_swa = (int)swa;
    hp->swa_pattern = (int)period;
    hp->rope_base_swa = (float)base_swa;
    hp->rope_theta_scale_swa = powf(hp->rope_base_swa, -2.0f / (float)hp->n_rot);
    hp->logit_softcap = (float)cap;
    hp->embd_scale = sqrtf((float)hp->dim);
    hp->ffn_gelu = true;
    if (hp->n_layers == 62) hp->att_scale = 1.0f / sqrtf((float)(hp->dim / hp->n_heads));
    return true;
}

/* Llama's layer with qwen3's head norms (model.c's readers), and the norms of each sublayer's
 * output. */
bool model_gemma3_layer(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(L->attn_norm = model_vector(ld, TN("attn_norm.weight"), true, hp->dim))) return false;
    if (!model_load_attn(ld, il)) return false;
    if (!(L->attn_post_norm = model_vector(ld, TN("post_attention_norm.weight"), true, hp->dim))) return false;
    if (!model_load_ffn(ld, il)) return false;
    if (!(L->ffn_post_norm = model_vector(ld, TN("post_ffw_norm.weight"), true, hp->dim))) return false;
#undef TN
    const int pat = hp->swa_pattern;   /* llama.cpp's set_swa_pattern */
    L->window = hp->n_swa > 0 && (pat == 0 || il % pat < pat - 1) ? hp->n_swa : 0;
    return true;
}
