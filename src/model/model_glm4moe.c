/*
 * model_glm4moe: `glm4moe` files (GLM-4.5, 4.5-Air, 4.6, 4.7 as llama.cpp's Glm4MoeModel
 * converter writes them), loaded as llama.cpp's glm4-moe.cpp reads them: llama's projections
 * with Q/K/V biases, RMS norms per query and key head when the file has them (GLM-4.5's
 * 355B has them, Air has none), NEOX RoPE over the first rope.dimension_count dims of a head
 * (partial_rotary_factor 0.5), `post_attention_norm` as the FFN's input norm, a dense FFN in
 * the first leading_dense_block_count layers and past them DeepSeek-V3's router (sigmoid
 * scores, the selection bias exp_probs_b, normalised weights times expert_weights_scale)
 * with shared experts beside it. The NextN (MTP) block after the model's layers is one more
 * layer of the same kind plus model.c's nextn tensors. Nothing here needs a step of its own:
 * every part is one the engine already runs for another family.
 */
#include <stdio.h>

#include "model/model_int.h"

#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", an, suffix), key)

bool model_glm4moe_keys(model_ld *ld, const char *an)
{
    model_hparams *hp = &ld->m->hp;
    char key[128];
    /* the converter always writes sigmoid; llama.cpp takes sigmoid when the key is absent */
    if (!model_read_router(ld, an, true, 2)) return false;
    /* GLM's config has n_group 1 (no group routing) and the converter writes no group keys;
     * a file with them would route differently in llama.cpp's graph, which ignores them */
    if (gguf_find_key(ld->m->g, KEY("expert_group_count")) >= 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s: group-limited routing is not part of glm4moe", key);
        return false;
    }
    /* M-RoPE sections are GLM-4.5V's (vision); the text model has none */
    gguf_vtype elt;
    uint64_t n_sec = 0;
    const void *sec = NULL;
    if (gguf_get_arr(ld->m->g, KEY("rope.dimension_sections"), &elt, &n_sec, &sec) && n_sec >= 2 &&
        (elt == GGUF_VT_INT32 || elt == GGUF_VT_UINT32) && ((const int32_t *)sec)[0] > 0 && ((const int32_t *)sec)[1] > 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s: multi-section RoPE (GLM-4.5V) is not supported", key);
        return false;
    }
    if (hp->n_dense_lead < 0 || hp->n_dense_lead > hp->n_layers || hp->n_shared < 0 || hp->n_shared > 64) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad glm4moe hyper-parameters: dense layers %d (of %d), shared experts %d",
                   hp->n_dense_lead, hp->n_layers, hp->n_shared);
        return false;
    }
    return true;
}
#undef KEY

/* Layer il (the NextN block's too): attn_norm, the attention with its biases and optional
 * head norms, then post_attention_norm and the FFN (model_load_ffn). */
bool model_glm4moe_layer(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    const int q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(L->attn_norm = model_vector(ld, TN("attn_norm.weight"), true, hp->dim))) return false;
    if (!model_load_attn(ld, il)) return false;
    /* the engine adds the three biases together: a file has all of them or none */
    L->bq = model_vector(ld, TN("attn_q.bias"), false, q_dim);
    L->bk = model_vector(ld, TN("attn_k.bias"), false, kv_dim);
    L->bv = model_vector(ld, TN("attn_v.bias"), false, kv_dim);
    if (ld->st != GGUF_OK) return false;
    if ((L->bq != NULL) != (L->bk != NULL) || (L->bq != NULL) != (L->bv != NULL)) {
        model_fail(ld, GGUF_ERR_MISSING, "blk.%d: attn_q/k/v.bias must all be present or all absent", il);
        return false;
    }
    L->q_norm = model_vector(ld, TN("attn_q_norm.weight"), false, hp->head_dim);
    L->k_norm = model_vector(ld, TN("attn_k_norm.weight"), false, hp->head_dim);
    if (ld->st != GGUF_OK) return false;
    if ((L->q_norm != NULL) != (L->k_norm != NULL)) {
        model_fail(ld, GGUF_ERR_MISSING, "blk.%d: attn_q_norm and attn_k_norm must both be present or both absent", il);
        return false;
    }
    if (!model_load_ffn(ld, il)) return false;
    /* llama.cpp requires the selection bias of every routed layer; without it the choice of
     * experts would differ from the model's */
    if (L->gate_inp.data && !L->exp_probs_b) {
        model_fail(ld, GGUF_ERR_MISSING, "missing tensor %s", TN("exp_probs_b.bias"));
        return false;
    }
#undef TN
    return true;
}
