/*
 * model_mistral3: `mistral3` files (Ministral 3, Mistral Small 3.x / Devstral converted as
 * llama.cpp's Mistral3Model): Llama's tensors and layer (interleaved RoPE, model.c loads
 * them), YaRN RoPE scaling (model.c's, with the mscale_all_dim written as
 * rope.scaling.yarn_log_multiplier), and Llama 4's attention temperature: with
 * attention.temperature_scale = beta, the queries at position p are multiplied after RoPE by
 * 1 + beta * ln(floor(p / n) + 1), n = rope.scaling.original_context_length (engine.c, as
 * llama.cpp's inp_attn_scale). Mistral 4 (`mistral4`, DeepSeek's layer) is refused in model.c.
 */
#include <stdio.h>

#include "model/model_int.h"

bool model_mistral3_hparams(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    double ts, bf, bs, orig;
    int64_t ne;
    if (!model_key_float(ld, "mistral3.attention.temperature_scale", 0.0, &ts)) return false;
    if (!model_key_float(ld, "mistral3.rope.scaling.yarn_beta_fast", 32.0, &bf)) return false;
    if (!model_key_float(ld, "mistral3.rope.scaling.yarn_beta_slow", 1.0, &bs)) return false;
    if (!model_key_float(ld, "mistral3.rope.scaling.original_context_length", hp->n_ctx_train, &orig)) return false;
    if (!model_key_int(ld, "mistral3.expert_count", false, 0, &ne)) return false;
    /* model.c's YaRN ramp is ggml's with beta_fast 32 and beta_slow 1 (Ministral 3's) */
    if (bf != 32.0 || bs != 1.0) {
        model_fail(ld, GGUF_ERR_FORMAT, "mistral3: YaRN beta_fast %g / beta_slow %g are not supported (only 32 / 1)", bf, bs);
        return false;
    }
    if (ne > 0 || gguf_find_tensor(m->g, "blk.0.attn_output.bias") || gguf_find_tensor(m->g, "blk.0.ffn_up.bias") ||
        gguf_find_tensor(m->g, "rope_factors_long.weight")) {
        model_fail(ld, GGUF_ERR_TYPE, "mistral3: experts, biases and LongRoPE factors are not supported");
        return false;
    }
    if (!(ts >= 0 && ts < 16) || (ts > 0 && !(orig >= 1 && orig <= (1 << 30)))) {
        model_fail(ld, GGUF_ERR_FORMAT, "mistral3: bad attention.temperature_scale %g or original_context_length %g", ts, orig);
        return false;
    }
    hp->attn_temp_scale = (float)ts;
    hp->attn_temp_floor = ts > 0 ? (int)orig : 0;
    return true;
}
