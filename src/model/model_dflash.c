/*
 * model_dflash: loading a DFlash / DSpark drafter (model_dflash.h). The shared readers have
 * read the `dflash.*` counts, shapes and RoPE (NEOX, as the Qwen3 backbone's); this reads the
 * block metadata, the drafter's own tensors and the Qwen3 layers, and refuses the variants
 * the engine does not run by name rather than drafting wrongly with them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_dflash.h"
#include "model/model_dsv4.h"
#include "model/model_int.h"
#include "util/util.h"

void model_dflash_free(model_dflash *d) { free(d); }

/* The block metadata: target layers, block size, anchor slot, mask token. */
static bool model_dflash_keys(model_ld *ld, model_dflash *d)
{
    const gguf *g = ld->m->g;
    gguf_vtype elt;
    uint64_t n;
    const void *data;
    if (!gguf_get_arr(g, "dflash.target_layers", &elt, &n, &data)) {
        model_fail(ld, GGUF_ERR_MISSING, "missing key dflash.target_layers (the target layers a drafter reads)");
        return false;
    }
    if ((elt != GGUF_VT_INT32 && elt != GGUF_VT_UINT32) || n == 0 || n > MODEL_DFLASH_MAX_TL) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad dflash.target_layers: %llu entries (1..%d 32-bit ids)", (unsigned long long)n,
                   MODEL_DFLASH_MAX_TL);
        return false;
    }
    d->n_tl = (int)n;
    for (int i = 0; i < d->n_tl; i++) {
        memcpy(&d->tl[i], (const char *)data + 4 * (size_t)i, 4);
        if (d->tl[i] < 0) {
            model_fail(ld, GGUF_ERR_FORMAT, "bad dflash.target_layers: id %d", d->tl[i]);
            return false;
        }
    }
    int64_t v;
    if (!model_key_int(ld, "dflash.block_size", false, 16, &v)) return false;
    if (v < 1 || v > 64) {
        model_fail(ld, GGUF_ERR_FORMAT, "bad dflash.block_size %lld (1..64)", (long long)v);
        return false;
    }
    d->block_size = (int)v;
    d->sample_from_anchor = true;
    (void)gguf_get_bool(g, "dflash.sample_from_anchor", &d->sample_from_anchor);
    bool causal = false;
    if (gguf_get_bool(g, "dflash.attention.causal", &causal) && causal) {
        model_fail(ld, GGUF_ERR_FORMAT, "dflash.attention.causal is true: only the non-causal block is supported");
        return false;
    }
    if (!model_key_int(ld, "tokenizer.ggml.mask_token_id", true, 0, &v)) return false;
    d->mask_token = (int32_t)v;
    return true;
}

/* The parts llama.cpp's dflash has that the engine does not run: refused by name. Sinks and
 * the sliding window belong to the V4 backbone (v4), which has both. */
static bool model_dflash_unsupported(model_ld *ld, bool v4)
{
    const gguf *g = ld->m->g;
    static const char *const no[][2] = {
        { "d2t", "a reduced draft vocabulary (d2t)" },
        { "selector_hidden.weight", "DFlash2's conv and selector heads" },
        { "blk.0.attn_sinks.weight", "attention sinks" },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(no) - (v4 ? 1 : 0); i++)
        if (gguf_find_tensor(g, no[i][0])) {
            model_fail(ld, GGUF_ERR_TYPE, "dflash drafter with %s (tensor %s): not supported yet", no[i][1], no[i][0]);
            return false;
        }
    int64_t swa = 0;
    if (!v4 && gguf_get_int(g, "dflash.attention.sliding_window", &swa) && swa > 0) {
        model_fail(ld, GGUF_ERR_TYPE, "dflash drafter with sliding-window attention: not supported yet");
        return false;
    }
    return true;
}

/* The DeepSeek V4 backbone (conversion/deepseek.py's DeepseekV4DSparkModel): V4 layers read by
 * model_dsv4_load under the dflash prefix, every one uncompressed and routed by its router (as
 * llama.cpp's dflash loader demands: "expects uncompressed attention on all stages"). */
static bool model_dflash_v4(model_ld *ld)
{
    model *m = ld->m;
    m->layers = xcalloc((size_t)m->hp.n_layers, sizeof *m->layers);
    if (!model_dsv4_load(ld)) return false;
    for (int il = 0; il < m->hp.n_layers; il++)
        if (m->dsv4->layers[il].ratio != 0) {
            model_fail(ld, GGUF_ERR_FORMAT, "DSpark drafter with a DeepSeek V4 backbone: layer %d has compression "
                       "ratio %d (a drafter's layers are uncompressed)", il, m->dsv4->layers[il].ratio);
            return false;
        }
    if (m->dsv4->n_hash > 0) {
        model_fail(ld, GGUF_ERR_FORMAT, "DSpark drafter with a DeepSeek V4 backbone: %d hash-routed layers (a "
                   "drafter has none)", m->dsv4->n_hash);
        return false;
    }
    return true;
}

/* Layer il: Qwen3's attention (q/k norms) and a SwiGLU FFN. */
static bool model_dflash_layer(model_ld *ld, int il)
{
    const model_hparams *hp = &ld->m->hp;
    model_layer *L = &ld->m->layers[il];
    const int qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim, dim = hp->dim;
    char nm[96];
#define TN(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (!(L->attn_norm = model_vector(ld, TN("attn_norm.weight"), true, dim))) return false;
    if (!model_matrix(ld, TN("attn_q.weight"), dim, qd, &L->wq)) return false;
    if (!model_matrix(ld, TN("attn_k.weight"), dim, kvd, &L->wk)) return false;
    if (!model_matrix(ld, TN("attn_v.weight"), dim, kvd, &L->wv)) return false;
    if (!model_matrix(ld, TN("attn_output.weight"), qd, dim, &L->wo)) return false;
    if (!(L->q_norm = model_vector(ld, TN("attn_q_norm.weight"), true, hp->head_dim))) return false;
    if (!(L->k_norm = model_vector(ld, TN("attn_k_norm.weight"), true, hp->head_dim))) return false;
    if (!(L->ffn_norm = model_vector(ld, TN("ffn_norm.weight"), true, dim))) return false;
    if (!model_matrix(ld, TN("ffn_gate.weight"), dim, hp->ffn_dim, &L->gate)) return false;
    if (!model_matrix(ld, TN("ffn_up.weight"), dim, hp->ffn_dim, &L->up)) return false;
    if (!model_matrix(ld, TN("ffn_down.weight"), hp->ffn_dim, dim, &L->down)) return false;
#undef TN
    return true;
}

/* The vocabulary size: token_embd's rows, else the tokenizer's token count. */
static bool model_dflash_vocab(model_ld *ld, model_dflash *d)
{
    model *m = ld->m;
    if (gguf_find_tensor(m->g, "token_embd.weight")) {
        if (!model_load_tok_embd(ld)) return false;
        d->own_embd = true;
    } else {
        gguf_vtype elt;
        uint64_t n;
        const void *data;
        if (!gguf_get_arr(m->g, "tokenizer.ggml.tokens", &elt, &n, &data) || n == 0 || n > (1 << 24)) {
            model_fail(ld, GGUF_ERR_MISSING, "dflash drafter without token_embd.weight and without tokenizer.ggml.tokens");
            return false;
        }
        m->hp.n_vocab = (int)n;
    }
    if (d->mask_token < 0 || d->mask_token >= m->hp.n_vocab) {
        model_fail(ld, GGUF_ERR_FORMAT, "tokenizer.ggml.mask_token_id %d is not in the vocabulary of %d", d->mask_token,
                   m->hp.n_vocab);
        return false;
    }
    return true;
}

bool model_dflash_load(model_ld *ld)
{
    model *m = ld->m;
    model_hparams *hp = &m->hp;
    model_dflash *d = m->dflash = xcalloc(1, sizeof *d);
    int64_t hc = 0;
    const bool v4 = gguf_get_int(m->g, "dflash.hyper_connection.count", &hc) && hc > 0;
    if (!model_dflash_unsupported(ld, v4) || !model_dflash_keys(ld, d) || !model_dflash_vocab(ld, d)) return false;
    const int dim = hp->dim;
    /* the usual cause of a wrong fc: a drafter made for a target of another width */
    const gguf_tensor *fc = gguf_find_tensor(m->g, "fc.weight");
    if (fc && fc->n_dims == 2 && fc->ne[1] == dim && fc->ne[0] != (int64_t)d->n_tl * dim && fc->ne[0] % d->n_tl == 0) {
        model_fail(ld, GGUF_ERR_SHAPE, "tensor fc.weight reads %d target layers of width %lld, but the drafter's width "
                   "is %d (a drafter's width must be its target's)", d->n_tl, (long long)(fc->ne[0] / d->n_tl), dim);
        return false;
    }
    if (!model_matrix(ld, "fc.weight", (int64_t)d->n_tl * dim, dim, &d->fc)) return false;
    if (!(d->enc_norm = model_vector(ld, "enc.output_norm.weight", true, dim))) return false;
    if (!(m->output_norm = model_vector(ld, "output_norm.weight", true, dim))) return false;
    if (gguf_find_tensor(m->g, "output.weight")) {
        if (!model_matrix(ld, "output.weight", dim, hp->n_vocab, &m->output)) return false;
        d->own_head = true;
    }   /* else the target's head, even beside an embedding of its own (llama.cpp's ctx_other) */
    const gguf_tensor *w1 = gguf_find_tensor(m->g, "markov_w1.weight");
    if (w1) {
        if (w1->n_dims != 2 || w1->ne[0] < 1 || w1->ne[0] > 4096) {
            model_fail(ld, GGUF_ERR_SHAPE, "tensor markov_w1.weight: bad rank %lld", (long long)w1->ne[0]);
            return false;
        }
        d->markov_rank = (int)w1->ne[0];
        if (!(d->markov_w1 = model_floats(ld, "markov_w1.weight", true, d->markov_rank, hp->n_vocab))) return false;
        if (!model_matrix(ld, "markov_w2.weight", d->markov_rank, hp->n_vocab, &d->markov_w2)) return false;
        if (gguf_find_tensor(m->g, "markov_w2.scale")) {
            model_fail(ld, GGUF_ERR_TYPE, "tensor markov_w2.scale: a scaled Markov head is not supported yet");
            return false;
        }
        d->conf_w = model_floats(ld, "conf_proj.weight", false, (int64_t)dim + d->markov_rank, 1);
        if (ld->st != GGUF_OK) return false;
        if (d->conf_w) {
            const float *b = model_vector(ld, "conf_proj.bias", false, 1);
            if (ld->st != GGUF_OK) return false;
            d->conf_b = b ? b[0] : 0.0f;
            d->has_conf = true;
        }
    }
    if (gguf_find_tensor(m->g, "fc.scale")) {
        model_fail(ld, GGUF_ERR_TYPE, "tensor fc.scale: scaled matrices are not supported yet");
        return false;
    }
    if (v4) return model_dflash_v4(ld);
    m->layers = xcalloc((size_t)hp->n_layers, sizeof *m->layers);
    for (int il = 0; il < hp->n_layers; il++)
        if (!model_dflash_layer(ld, il)) return false;
    return true;
}

bool model_dflash_match(const model *t, const model *d, char *err, size_t errsz)
{
    const model_dflash *df = d->dflash;
    if (!df) {
        snprintf(err, errsz, "not a dflash drafter");
        return false;
    }
    if (d->dsv4 && !t->dsv4) {
        snprintf(err, errsz, "a DSpark drafter with the DeepSeek V4 backbone drafts for a deepseek4 model, not '%s'",
                 t->hp.arch_name);
        return false;
    }
    if (!d->dsv4 && (t->hp.arch == MODEL_ARCH_DFLASH || t->hp.bidirectional || t->dsv4 || t->mtp_view)) {
        snprintf(err, errsz, "a dflash drafter with the Qwen3 backbone drafts for a decoder of llama's, qwen's or "
                 "deepseek2's layers, not '%s'", t->hp.arch_name);
        return false;
    }
    if (d->hp.n_vocab != t->hp.n_vocab) {
        snprintf(err, errsz, "vocabulary: the drafter has %d tokens, the model %d", d->hp.n_vocab, t->hp.n_vocab);
        return false;
    }
    if (d->hp.dim != t->hp.dim) {
        snprintf(err, errsz, "width: the drafter's is %d, the model's %d (fc reads the model's layers at its own width)",
                 d->hp.dim, t->hp.dim);
        return false;
    }
    /* a V4 target also gives the streams after its last layer (llama.cpp's deepseek4 graph) */
    const int max_tl = t->dsv4 ? t->hp.n_layers : t->hp.n_layers - 1;
    for (int i = 0; i < df->n_tl; i++)
        if (df->tl[i] > max_tl) {
            snprintf(err, errsz, "target layers: the drafter reads layer %d, the model has %d (0..%d)", df->tl[i],
                     t->hp.n_layers, max_tl);
            return false;
        }
    if ((!df->own_embd && !t->tok_embd.data) || (!df->own_head && !t->output.data)) {
        snprintf(err, errsz, "the drafter borrows the model's embedding and head, which it lacks");
        return false;
    }
    return true;
}
