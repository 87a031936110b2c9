/*
 * model_bert: BERT-style encoders (`bert`) as llama.cpp's converter writes them, for
 * embeddings: the input is the token's row plus token type 0's row plus the position's row
 * (absolute, position_embd: at most context_length positions), LayerNormed; each block is
 * attention with biases (every position sees every other of its sequence), the residual
 * add, a LayerNorm, then a GELU FFN with biases, the residual add and a LayerNorm (post-norm,
 * unlike the decoders' pre-norm). There is no output head: the last block's states are
 * pooled (pooling_type) into the embedding. A file whose attention.causal says true is
 * refused: its graph would be another one.
 *
 * nomic-bert (nomic-embed-text): the same blocks without position_embd, NEOX RoPE on Q and K
 * instead (rope.freq_base; every dim rotated), Q/K/V fused in one attn_qkv (q, k, v rows in
 * that order: viewed as three matrices, as phi3's), no biases, and a SwiGLU FFN
 * (silu(ffn_gate) * ffn_up, then ffn_down). Its MoE variant (nomic-bert-moe) is not read.
 */
#include "model/model.h"

#include <stdio.h>
#include <string.h>

#include "model/model_int.h"
#include "util/util.h"

/* Layer il's tensors: q/k/v (or fused qkv), output, the two LayerNorms, the FFN. */
static bool model_bert_layer(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    const int64_t dim = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (gguf_find_tensor(ld->m->g, TN("attn_qkv.weight"))) {   /* fused: row ranges of one matrix */
        ops_weight qkv;
        if (!model_matrix(ld, nm, dim, qd + 2 * kvd, &qkv)) return false;
        size_t rb = quant_row_bytes(qkv.type, dim);
        L->wq = (ops_weight){ qkv.type, qd, dim, qkv.data };
        L->wk = (ops_weight){ qkv.type, kvd, dim, (const char *)qkv.data + rb * (size_t)qd };
        L->wv = (ops_weight){ qkv.type, kvd, dim, (const char *)qkv.data + rb * (size_t)(qd + kvd) };
        const float *b = model_vector(ld, TN("attn_qkv.bias"), false, qd + 2 * kvd);
        if (b) L->bq = b, L->bk = b + qd, L->bv = b + qd + kvd;
    } else {
        if (!model_matrix(ld, TN("attn_q.weight"), dim, qd, &L->wq)) return false;
        if (!model_matrix(ld, TN("attn_k.weight"), dim, kvd, &L->wk)) return false;
        if (!model_matrix(ld, TN("attn_v.weight"), dim, kvd, &L->wv)) return false;
        L->bq = model_vector(ld, TN("attn_q.bias"), false, qd);
        L->bk = model_vector(ld, TN("attn_k.bias"), false, kvd);
        L->bv = model_vector(ld, TN("attn_v.bias"), false, kvd);
    }
    if (!model_matrix(ld, TN("attn_output.weight"), qd, dim, &L->wo)) return false;
    L->bo = model_vector(ld, TN("attn_output.bias"), false, dim);
    if (!(L->attn_norm = model_vector(ld, TN("attn_output_norm.weight"), true, dim))) return false;
    if (!(L->attn_norm_b = model_vector(ld, TN("attn_output_norm.bias"), true, dim))) return false;
    if (!model_matrix(ld, TN("ffn_up.weight"), dim, hp->ffn_dim, &L->up)) return false;
    L->up_b = model_vector(ld, TN("ffn_up.bias"), false, hp->ffn_dim);
    if (hp->arch == MODEL_ARCH_NOMIC_BERT && !model_matrix(ld, TN("ffn_gate.weight"), dim, hp->ffn_dim, &L->gate))
        return false;
    if (!model_matrix(ld, TN("ffn_down.weight"), hp->ffn_dim, dim, &L->down)) return false;
    L->down_b = model_vector(ld, TN("ffn_down.bias"), false, dim);
    if (!(L->ffn_norm = model_vector(ld, TN("layer_output_norm.weight"), true, dim))) return false;
    if (!(L->ffn_norm_b = model_vector(ld, TN("layer_output_norm.bias"), true, dim))) return false;
#undef TN
    return ld->st == GGUF_OK;
}

bool model_bert_load(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    double f;
    int64_t v;
    bool causal;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", hp->arch_name, suffix), key)
    if (gguf_get_bool(m->g, KEY("attention.causal"), &causal) && causal) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s is true: only bidirectional (non-causal) %s is supported", key, hp->arch_name);
        return false;
    }
    if (!model_key_int(ld, KEY("moe_every_n_layers"), false, 0, &v)) return false;
    if (v != 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "%s %lld: mixture-of-experts encoders are not supported", key, (long long)v);
        return false;
    }
    if (!model_key_float(ld, KEY("attention.layer_norm_epsilon"), 1e-12, &f)) return false;
#undef KEY
    hp->norm_eps = (float)f;
    hp->bidirectional = true;
    if (hp->n_ctx_train > (1 << 16)) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad %s.context_length %d (at most 65536)", hp->arch_name, hp->n_ctx_train);
        return false;
    }

    if (!model_load_tok_embd(ld)) return false;
    m->output = m->tok_embd;   /* no head: the repacker and residency see a valid matrix */
    m->tied_output = true;

    /* only type 0 is ever used (llama.cpp hardcodes "sentence A") */
    const gguf_tensor *tt = gguf_find_tensor(m->g, "token_types.weight");
    if (tt) {
        int64_t n_types = tt->n_dims >= 2 ? tt->ne[1] : 1;
        if (n_types < 1 || n_types > 64) {
            model_fail(ld, GGUF_ERR_SHAPE, "tensor token_types.weight has %lld rows", (long long)n_types);
            return false;
        }
        if (!(m->type_row = model_floats(ld, "token_types.weight", true, hp->dim, n_types))) return false;
    }
    if (hp->arch == MODEL_ARCH_BERT &&
        !(m->pos_embd = model_floats(ld, "position_embd.weight", true, hp->dim, hp->n_ctx_train)))
        return false;
    if (!(m->embd_norm = model_vector(ld, "token_embd_norm.weight", true, hp->dim))) return false;
    if (!(m->embd_norm_b = model_vector(ld, "token_embd_norm.bias", true, hp->dim))) return false;
    m->layers = xcalloc((size_t)hp->n_layers, sizeof *m->layers);
    for (int il = 0; il < hp->n_layers; il++)
        if (!model_bert_layer(ld, il)) return false;
    return true;
}
