/*
 * engine_kv: the engine's KV cache. The pool's geometry per family (an encoder's counts
 * positions only, DeepSeek V4's is its own), the cache types, and the Walsh-Hadamard rotation
 * a quantised cache takes (engine_job_qkv_post applies it); then the window layers: their
 * K/V of a step staged, read by attention, moved into each sequence's ring, and the states
 * captured at block ends (engine_window_states).
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "util/util.h"

qtype engine_kv_qtype(engine_kv_type t)
{
    switch (t) {
    case ENGINE_KV_F32: return QTYPE_F32;
    case ENGINE_KV_Q8_0: return QTYPE_Q8_0;
    case ENGINE_KV_Q4_0: return QTYPE_Q4_0;
    default: return QTYPE_F16;
    }
}

bool engine_kv_type_parse(const char *z, engine_kv_type *out)
{
    static const char *const names[] = { "f16", "f32", "q8_0", "q4_0" };
    for (int i = 0; i < 4; i++)
        if (strcmp(z, names[i]) == 0) {
            *out = (engine_kv_type)i;
            return true;
        }
    return false;
}

kvpool_opts engine_kv_geometry(const model *m, engine_kv_type kv_type, int32_t *layer_window)
{
    const model_hparams *hp = &m->hp;
    for (int il = 0; il < hp->n_layers; il++) layer_window[il] = model_layer_window(m, il);
    for (int il = 0; il < hp->n_layers; il++)   /* a recurrent layer keeps no KV */
        if (m->layers[il].ssm_out.data || m->layers[il].kv_shared) layer_window[il] = -1;   /* nor a
                                                                * gemma4 layer that reads another's */
    if (hp->arch == MODEL_ARCH_DEEPSEEK4) return engine_dsv4_kv_geometry(m, engine_kv_qtype(kv_type), layer_window);
    if (hp->bidirectional) {   /* an encoder keeps nothing: its pool only counts positions */
        kvpool_opts ke = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .dtype = engine_kv_qtype(kv_type),
                           .layer_window = layer_window };
        memcpy(ke.model_fp, m->fingerprint, 32);
        return ke;
    }
    kvpool_opts ko = { .n_layers = hp->n_layers, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
                       .v_is_k = hp->mla, .dtype = engine_kv_qtype(kv_type), .layer_window = layer_window,
                       .state_bytes = engine_qwen35_state_bytes(m) };
    if (hp->arch == MODEL_ARCH_GEMMA4) {   /* each layer's rows in its own head size and kv heads */
        int32_t *width = layer_window + hp->n_layers, *kvh = width + hp->n_layers;
        for (int il = 0; il < hp->n_layers; il++) {
            width[il] = m->layers[il].l_head_dim;
            kvh[il] = m->layers[il].l_kv_heads;
        }
        ko.layer_width = width;
        ko.layer_kv_heads = kvh;
    }
    memcpy(ko.model_fp, m->fingerprint, 32);
    return ko;
}

int engine_kv_geometry_room(const model *m)
{
    if (m->hp.arch == MODEL_ARCH_GEMMA4) return 3 * m->hp.n_layers;   /* windows, widths, kv heads */
    return m->hp.arch == MODEL_ARCH_DEEPSEEK4 ? ENGINE_DSV4_GEOM_ROOM * engine_dsv4_pool_layers(m) : m->hp.n_layers;
}

void engine_kv_shape(const model *m, int *n_parts, int *n_kv_heads, int *head_dim)
{
    int32_t *lw = xcalloc((size_t)engine_kv_geometry_room(m), sizeof *lw);
    kvpool_opts ko = engine_kv_geometry(m, ENGINE_KV_F32, lw);
    free(lw);
    *n_parts = ko.v_is_k ? 1 : 2;
    *n_kv_heads = ko.n_kv_heads;
    *head_dim = ko.head_dim;
}

/* The KV pool in the model's geometry and the cache type asked for, of *n_blocks blocks, and
 * the Walsh-Hadamard rotation a quantised cache takes. */
engine_status engine_new_kv(engine *e, const engine_opts *o, int *n_blocks, char *err, size_t errsz)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    int32_t *lw = xcalloc((size_t)engine_kv_geometry_room(m), sizeof *lw);
    kvpool_opts ko = engine_kv_geometry(m, o->kv_type, lw);
    engine_dsv4_sizes z;   /* deepseek4's entries in whole Q8_0 blocks, its own rule */
    if (hp->arch == MODEL_ARCH_DEEPSEEK4 && ko.dtype != QTYPE_Q4_0 && !engine_dsv4_type_ok(m, ko.dtype, &z, err, errsz)) {
        free(lw);
        return ENGINE_ERR_ARG;
    }
    if (!kvpool_type_ok(ko.dtype, ko.head_dim)) {
        snprintf(err, errsz, "a %s KV cache needs a head size that is a multiple of 32; this model's is %d",
                 quant_type_name(ko.dtype), ko.head_dim);
        free(lw);
        return ENGINE_ERR_ARG;
    }
    /* deepseek4 keeps its compressed entries in Q8_0 (engine_dsv4.c), not Q4_0 */
    if ((hp->mla && (ko.dtype == QTYPE_Q8_0 || ko.dtype == QTYPE_Q4_0)) ||
        (hp->arch == MODEL_ARCH_DEEPSEEK4 && ko.dtype == QTYPE_Q4_0)) {
        snprintf(err, errsz, "a %s KV cache is not supported for %s models (use %s)", quant_type_name(ko.dtype),
                 hp->mla ? "multi-head latent attention" : "deepseek4", hp->mla ? "f16 or f32" : "f16, f32 or q8_0");
        free(lw);
        return ENGINE_ERR_ARG;
    }
    /* llama.cpp rotates Q, K and V by a Walsh-Hadamard matrix before a quantised cache stores
     * them (the largest power-of-two piece of the head for K, 64 for V) and the attention
     * output back: an outlier is spread over its piece, so the 32-value blocks quantise with
     * less error; scores are unchanged (the matrix is orthonormal). Same condition as its.
     * deepseek4's step rotates its own rows (engine_dsv4_new). */
    if ((ko.dtype == QTYPE_Q8_0 || ko.dtype == QTYPE_Q4_0) && hp->arch != MODEL_ARCH_DEEPSEEK4 &&
        (e->rot_k = ops_hadamard_order(ko.head_dim)) > 0)
        e->rot_v = 64;
    if (o->n_kv_blocks > 0) ko.n_blocks = o->n_kv_blocks;
    else if (o->kv_bytes > 0) ko.n_blocks = kvpool_blocks_for_bytes(&ko, o->kv_bytes);
    else ko.n_blocks = 4096 / KVPOOL_BLOCK;
    *n_blocks = ko.n_blocks;
    kvpool_status ks = kvpool_new(&ko, &e->kv);
    free(lw);
    if (ks != KVPOOL_OK) {
        snprintf(err, errsz, "KV cache of %d blocks: %s", ko.n_blocks, kvpool_status_name(ks));
        return ENGINE_ERR_NOMEM;
    }
    return ENGINE_OK;
}

/* Sliding-window layers: the staging of a step's window rows and the states captured at
 * block boundaries. */
engine_status engine_new_window(engine *e, size_t T, char *err, size_t errsz)
{
    const model_hparams *hp = &e->m->hp;
    e->wrow = quant_row_bytes(kvpool_dtype(e->kv), hp->head_dim);
    /* the widest head size and the most kv heads bound every layer's staged rows */
    e->wstage = engine_scratch_alloc(e, T * 2 * (size_t)hp->n_kv_heads * e->wrow);
    e->wkv = xmalloc((size_t)hp->n_layers * sizeof *e->wkv);
    e->wrow_l = xmalloc((size_t)hp->n_layers * sizeof *e->wrow_l);
    for (int il = 0; il < hp->n_layers; il++) {
        const int w = kvpool_layer_width(e->kv, il, 0);
        e->wkv[il] = w ? kvpool_layer_kv_heads(e->kv, il) : hp->n_kv_heads;
        e->wrow_l[il] = w ? quant_row_bytes(kvpool_dtype(e->kv), w) : e->wrow;
    }
    e->run0 = xmalloc(T * sizeof *e->run0);
    e->prev_run = xmalloc(T * sizeof *e->prev_run);
    e->n_wsnap_max = (int)(T / KVPOOL_BLOCK) + 16;
    e->wsnap = xcalloc((size_t)e->n_wsnap_max, sizeof *e->wsnap);
    e->wsnap_t = xcalloc((size_t)e->n_wsnap_max, sizeof *e->wsnap_t);
    /* faulted in as states are captured: most steps cross no block boundary */
    e->wsnap_data = calloc((size_t)e->n_wsnap_max, kvpool_window_state_bytes(e->kv));
    if (!e->wstage || !e->wsnap_data) {
        snprintf(err, errsz, "out of memory for the window layers' staging of %zu tokens", T);
        return ENGINE_ERR_NOMEM;
    }
    return ENGINE_OK;
}

/* ---- window layers ----------------------------------------------------------------------
 * A window layer's K/V of a step are staged (engine_job_qkv_post); a query of entry t reads a
 * key at pk from the staging when pk is in its own run (the step's positions of its sequence),
 * else from the sequence's ring, which holds the positions before the run. After the layer's
 * attention, engine_window_commit captures the states this step crossed and moves the staged
 * rows into the rings. So a ring needs the window only, however long a prefill chunk. */
const uint8_t *engine_win_row(const engine *e, const engine_batch *b, int layer, int t, int pk, int kv, int kvh)
{
    for (int r0 = e->run0[t];; r0 = e->prev_run[r0]) {   /* this run, then the sequence's earlier ones */
        int p0 = b->toks[r0].pos;
        if (pk >= p0)
            return e->wstage + (((size_t)(r0 + pk - p0) * 2 + (size_t)kv) * (size_t)e->wkv[layer] + (size_t)kvh) *
                               e->wrow_l[layer];
        if (e->prev_run[r0] < 0) break;
    }
    return kvpool_seq_ring_row(e->kv, b->toks[t].seq, layer, kv, kvh, pk);
}

/* After a window layer's attention (the caller's thread): first the states at the block ends
 * planned for this step (engine_window_plan), from staging or ring, then the run's last ring_len
 * staged rows into the ring. */
void engine_window_commit(engine *e, const engine_batch *b, int layer)
{
    const kvpool *kv = e->kv;
    const int nkv = e->wkv[layer], W = kvpool_window(kv), wl = -1 - kvpool_layer_block_index(kv, layer);
    const int R = kvpool_ring_slots(kv, layer, 0);
    const size_t row = e->wrow_l[layer];
    for (int i = 0; i < e->n_wsnap; i++) {
        const engine_window_state *ws = &e->wsnap[i];
        int t = e->wsnap_t[i];
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < nkv; h++) {
                uint8_t *dst = kvpool_window_state_rows(kv, (void *)ws->state, layer, k, h, NULL);
                for (int r = 0; r < W; r++, dst += row)
                    memcpy(dst, engine_win_row(e, b, layer, t, ws->end - W + r, k, h), row);
            }
    }
    for (int t = 0; t < b->n_tokens;) {
        int r = engine_run_end(b, t), p0 = b->toks[t].pos, p1 = b->toks[r - 1].pos;
        for (int pk = TM_MAX(p0, p1 + 1 - R); pk <= p1; pk++)
            for (int k = 0; k < 2; k++)
                for (int h = 0; h < nkv; h++)
                    memcpy(kvpool_seq_ring_row(kv, b->toks[t].seq, layer, k, h, pk), engine_win_row(e, b, layer, t, pk, k, h),
                           row);
        if (wl == kvpool_n_window_layers(kv) - 1) kvpool_seq_set_ring_next(b->toks[t].seq, p1 + 1);
        t = r;
    }
}

/* Before a step of a model with window layers: the runs (run0) and each sequence's chain of
 * runs (prev_run): a sequence may come in several runs, in batch order at consecutive
 * positions (the ring holds what precedes the first); and the states to capture: every block
 * end a run crosses at which the window state is exact (kvpool_seq_exact_from). false: a
 * sequence's runs out of order or with a gap. */
bool engine_window_plan(engine *e, const engine_batch *b)
{
    const int W = kvpool_window(e->kv);
    e->n_wsnap = 0;
    for (int t = 0; t < b->n_tokens;) {
        int r = engine_run_end(b, t), p0 = b->toks[t].pos, p1 = b->toks[r - 1].pos;
        kvpool_seq *sq = b->toks[t].seq;
        for (int u = t; u < r; u++) e->run0[u] = t;
        e->prev_run[t] = -1;
        for (int u = t - 1; u >= 0; u--)
            if (b->toks[u].seq == sq) {   /* the end of the sequence's previous run */
                if (b->toks[u].pos != p0 - 1) return false;
                e->prev_run[t] = e->run0[u];
                break;
            }
        /* its first run may go back a few positions (a rejected draft), not further: the ring
         * has moved on */
        if (e->prev_run[t] < 0 && p0 + KVPOOL_RING_SPARE < kvpool_seq_ring_next(sq)) return false;
        for (int end = (p0 / KVPOOL_BLOCK + 1) * KVPOOL_BLOCK; end <= p1 + 1; end += KVPOOL_BLOCK) {
            if (end < W || end < kvpool_seq_exact_from(sq)) continue;
            if (e->n_wsnap == e->n_wsnap_max) {
                e->n_wsnap_dropped++;
                continue;
            }
            e->wsnap_t[e->n_wsnap] = t;
            e->wsnap[e->n_wsnap] = (engine_window_state){ .seq = sq, .end = end,
                .state = e->wsnap_data + (size_t)e->n_wsnap * kvpool_window_state_bytes(e->kv) };
            kvpool_window_state_init(e->kv, e->wsnap_data + (size_t)e->n_wsnap * kvpool_window_state_bytes(e->kv));
            e->n_wsnap++;
        }
        t = r;
    }
    return true;
}

int engine_window_states(const engine *e, const engine_window_state **out)
{
    if (e->q35) return engine_qwen35_states(e->q35, out);
    if (e->dsv4) return engine_dsv4_states(e->dsv4, out);
    *out = e->wsnap;
    return e->wsnap ? e->n_wsnap : 0;
}
