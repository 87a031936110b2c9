/*
 * engine_dsv4: DeepSeek V4's layer arithmetic (see engine_dsv4.h for the state layout,
 * docs/deepseek4.md for the forward pass, tests/oracle/dsv4_ref.py for the reference it
 * follows).
 *
 * A step runs layer by layer over the whole batch: every projection is one ops_matmul over
 * the batch's rows (weights read once per step), the routed experts run once per step over
 * the rows routed to them. What depends on earlier positions runs per entry in batch order
 * on the step thread: a layer's projections are written to the ring and the compression groups
 * a position completes are compressed into the blocks, so that a later entry of the same
 * sequence finds them;
 * then the indexer's selection and attention run per entry (attention per block of query
 * heads, which share the one K=V head's rows) on the pool's threads, each output computed by
 * one thread in a fixed order. A (sequence, position)'s logits
 * therefore do not depend on what else shares the step, on how its prompt was chunked or on
 * the thread count.
 *
 * Rings of (layer, position), F32: the raw K=V row (hd; kvpool part 0, swa + spare slots)
 * and, ratio r > 0, the projection row (part 1, the slots a compression reads back + spare),
 * offsets from dsv4_layout: the compressor's kv (hd) and score (hd, ape[pos % r] added); ratio
 * 4: both halves of those and of the indexer's kv (idim) and score (idim), all first halves
 * first (the overlap carry a window state keeps is that prefix). A layer's raw rows go into
 * their ring after its attention (which reads the step's own from kvr), its projections into
 * theirs before it, in batch order (a compression reads at most 127 rows back, always still in
 * the ring; the two rings are disjoint, so a long chunk's projections never overwrite raw rows
 * its attention reads). A block's packed entries: per compressed layer in layer order, its 128 / r entries
 * (hd each), then on ratio 4 its 32 indexer entries (idim each).
 */
#include "engine/engine_dsv4.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/engine_int.h"
#include "model/model_dsv4.h"
#include "model/moe.h"
#include "model/ops.h"
#include "util/util.h"

#define DSV4_MAX_MIX 64          /* (2 + hc) * hc at most: hc <= 6 */
#define DSV4_ATT_HEADS 32        /* query heads per work item of the blocked attention */

typedef struct {
    int ckv, csc;                /* float offsets in the projection row (the first halves on ratio
                                  * 4); -1: absent */
    int ikv, isc;
    int half;                    /* ratio 4: offset of the second halves from the first; else 0 */
    int ent, ient;               /* byte offsets of the layer's entries / indexer entries in a
                                  * block's packed entries (in the blocks' type); -1: absent */
} dsv4_layout;

struct engine_dsv4 {
    const model *m;
    const model_dsv4 *d;
    threadpool *tp;
    kvpool *kv;
    int max_tokens;
    int row;                 /* elements per (layer, position) row: the pool's head_dim */
    bool ring;               /* the layers are the pool's window layers (the compressed layout);
                              * false: raw rows in blocks (no compressed layers) */
    qtype bt;                /* the blocks' element type: F16, F32 or Q8_0 */
    size_t hd_b, id_b;       /* bytes of an entry (hd values) / an indexer entry (idx_dim) in bt */
    int max_ent;             /* compressed entries a sequence can reach (max_pos / 4) + 1 */
    dsv4_layout *lay;        /* (n_layers) */
    float *ent;              /* (max(hd, idim)) an entry before it goes into its block */
    uint8_t *rrow;           /* (hd) a raw row in bt, rounding it as the cache does */
    int rot;                 /* order of the Walsh-Hadamard rotation of queries, raw rows and
                              * entries (0: none), see engine_dsv4_new */
    int irot;                /* likewise of the indexer's queries and entries */
    /* runs and window states of the step (the compressed layout only) */
    int32_t *run0;           /* (T) first batch entry of each entry's run */
    int32_t *prev_run;       /* (T) at a run's first entry: the first entry of the sequence's
                              * previous run in this step, -1 if none */
    engine_window_state *wsnap; /* (n_wsnap_max) states captured this step */
    int32_t *wsnap_t;        /* (n_wsnap_max) a batch entry of the run that crosses each */
    uint8_t *wsnap_data;     /* (n_wsnap_max, kvpool_window_state_bytes) their bytes */
    int n_wsnap, n_wsnap_max;
    /* activations, (max_tokens, width) f32 */
    float *X;                /* (T, hc, dim) residual streams */
    float *xf;               /* (T, hc * dim) normed flattened streams */
    float *mix;              /* (T, mix) hyper-connection mixes */
    float *pre, *post;       /* (T, hc) */
    float *comb;             /* (T, hc, hc) [src][dst] after Sinkhorn */
    float *cur;              /* (T, dim) sublayer input */
    float *y;                /* (T, dim) sublayer output */
    float *qa;               /* (T, q_lora) */
    float *q;                /* (T, H * hd) */
    float *kvr;              /* (T, hd) */
    float *ck, *cg;          /* (T, 2 * hd) compressor kv and gate */
    float *ik, *ig;          /* (T, 2 * idim) indexer compressor kv and gate */
    float *iq;               /* (T, idx_heads * idim) */
    float *iw;               /* (T, idx_heads) */
    float *att;              /* (T, H * hd) */
    const float *og;         /* (o_groups, T, H * hd / o_groups) wo_a's input: att at one token,
                              * else att regrouped into q */
    float *oa;               /* (T, o_groups * o_lora) */
    int32_t *pos;            /* (T) */
    int32_t *npos;           /* (T) minus the positions (the inverse rotation) */
    int32_t *sel;            /* (T, idx_topk) chosen entries of an indexed layer, ascending */
    int32_t *n_sel;          /* (T) */
    /* experts */
    float *r_logits;         /* (T, E) */
    float *r_probs;          /* (T, E) */
    int32_t *r_sel;          /* (T, k) */
    float *r_w;              /* (T, k) */
    int32_t *r_idx;          /* (E) */
    float *r_sc;             /* (E) */
    int32_t *x_row;          /* (T * k) token of each grouped row */
    int32_t *x_slot;         /* (T, k) grouped row of each (token, slot) */
    int32_t *x_off;          /* (E + 1) first grouped row of each expert */
    int32_t *x_act;          /* (E) the experts some row chose, ascending */
    int n_act;
    float *moe_tmp;          /* (n_threads, moe_stride) a chunk's gate and up outputs, (T * k,
                              * ENGINE_MOE_ROWS) each, then its matmul scratch */
    size_t moe_stride;
    threadpool_items wo_items; /* wo_a's round: its work items */
    float *xg;               /* (T * k, dim) */
    float *fg, *fu;          /* (T * k, max_ffn) */
    float *ye;               /* (T * k, dim) */
    float *shg, *shu;        /* (T, n_shared * max_ffn) */
    float *sh;               /* (T, dim) */
    void *mm_scratch;
    /* per thread: scores of attention, the indexer's scores and order; at th_x, Q8_0 blocks:
     * a query in Q8_0 and dequantised, an entry dequantised (max(hd, idx_dim) floats each) */
    float *th_f;             /* (n_threads, th_stride) */
    size_t th_x;             /* floats before a thread's Q8_0 scratch in its th_f share */
    int32_t *th_i;           /* (n_threads, max_ent) */
    size_t th_stride;
    float *att_buf;          /* (n_threads, att_stride) the blocked attention's key block,
                              * queries, running sums and kernel scratch (dsv4_att_heads) */
    size_t att_stride;
    const engine_tok *toks;  /* the step's batch */
    int n_tok;
    int layer;               /* the layer of the current pool round */
    /* a DSpark drafter's block pass (engine_dsv4_block), NULL outside one */
    const int32_t *last;     /* (n_tok) the last key position of each entry: non-causal */
    const model *embd;       /* whose token_embd the entries read (NULL: m's) */
    const float *x0;         /* (n_tok, hc, dim) the entries' input streams given by the caller
                              * (an MTP block's, engine_dsv4_step_from), NULL: the embedding */
    /* layer inputs kept for a drafter (engine_dsv4_capture), NULL: none */
    const int8_t *cap_slot;  /* (n_layers + 1) slot of layer il's input in a cap row, -1: not kept */
    float *cap;              /* (max_tokens, n_cap * dim) */
    int n_cap;
    engine *prof;            /* whose profile the stages are marked in (engine_prof_mark), or NULL */
};

#define DSV4_MARK(d, il, op) do { if ((d)->prof) engine_prof_mark((d)->prof, il, op); } while (0)

void engine_dsv4_profile_to(engine_dsv4 *d, engine *e) { d->prof = e; }

/* The projection row of a layer of ratio r (heads of hd, indexer keys of id): its parts'
 * offsets, and its width in *width (0 on ratio 0). On ratio 4 the first halves (what the next
 * group reads back: the overlap carry) lead the row, so that a window state keeps a prefix. */
static dsv4_layout dsv4_layout_of(int r, int hd, int id, int *width)
{
    dsv4_layout l = { -1, -1, -1, -1, 0, -1, -1 };
    int w = 0;
    if (r > 0) {
        l.ckv = w, w += hd;
        l.csc = w, w += hd;
    }
    if (r == 4) {
        l.ikv = w, w += id;
        l.isc = w, w += id;
        l.half = w, w *= 2;
    }
    *width = w;
    return l;
}

int engine_dsv4_row(const model *m)
{
    int wmax = 0, w;
    for (int il = 0; il < m->hp.n_layers; il++) {
        dsv4_layout_of(m->dsv4->layers[il].ratio, m->hp.head_dim, m->dsv4->idx_dim, &w);
        wmax = TM_MAX(wmax, TM_MAX(w, m->hp.head_dim));
    }
    return TM_ALIGN_UP(wmax, 16);
}

/* Ring slots of a layer of ratio r's projections: the rows a compression reads back, and the
 * spare slots (ratio 4: this group and the previous one; ratio 128: the open group). */
static int dsv4_proj_slots(int r)
{
    return r == 4 ? 2 * 4 + KVPOOL_RING_SPARE : r == 128 ? KVPOOL_BLOCK + KVPOOL_RING_SPARE : 0;
}

bool engine_dsv4_sizes_of(const engine_dsv4_shape *s, engine_dsv4_sizes *out, char *err, size_t errsz)
{
    memset(out, 0, sizeof *out);
    if (s->n_layers <= 0 || !s->ratio || s->head_dim <= 0 || s->idx_dim < 0 || s->swa <= 0) {
        snprintf(err, errsz, "deepseek4 layout: %d layers, head size %d, indexer key size %d, window %d: each must "
                 "be positive (the indexer's may be 0 without ratio-4 layers)", s->n_layers, s->head_dim, s->idx_dim,
                 s->swa);
        return false;
    }
    const qtype t = s->type;
    if (t != QTYPE_F32 && t != QTYPE_F16 && t != QTYPE_Q8_0) {
        snprintf(err, errsz, "deepseek4 layout: blocks of %s; the compressed entries are kept in f32, f16 or q8_0",
                 quant_type_name(t));
        return false;
    }
    /* Q8_0: every entry (hd, idx_dim values) and raw row is whole 32-value blocks */
    const int qk = t == QTYPE_Q8_0 ? QK8_0 : 1;
    if (s->head_dim % qk || s->idx_dim % qk) {
        snprintf(err, errsz, "deepseek4 layout: a %s cache needs a head size and an indexer key size that are "
                 "multiples of %d; this model's are %d and %d", quant_type_name(t), qk, s->head_dim, s->idx_dim);
        return false;
    }
    const int64_t hd = s->head_dim, id = s->idx_dim, B = KVPOOL_BLOCK, sp = KVPOOL_RING_SPARE;
    int wmax = 0;
    for (int il = 0; il < s->n_layers; il++) {
        const int r = s->ratio[il];
        if (r != 0 && r != 4 && r != 128) {
            snprintf(err, errsz, "deepseek4 layout: layer %d has compression ratio %d; only 0, 4 and 128 divide "
                     "a 128-position block as the compressed layout needs", il, r);
            return false;
        }
        if (r == 4 && id <= 0) {
            snprintf(err, errsz, "deepseek4 layout: layer %d has ratio 4 but the indexer's key size is %d", il, s->idx_dim);
            return false;
        }
        int w;
        dsv4_layout_of(r, s->head_dim, s->idx_dim, &w);
        wmax = TM_MAX(wmax, TM_MAX(w, s->head_dim));
        out->window += s->swa * hd;
        out->ring += (s->swa + sp) * hd;
        if (r == 4) {
            out->block += B / 4 * (hd + id);
            out->carry += 4 * (2 * hd + 2 * id);              /* kv and score, first halves */
            out->ring += (2 * 4 + sp) * (2 * 2 * hd + 2 * 2 * id);   /* this and the previous group */
        } else if (r == 128) {
            out->block += hd;
            out->ring += (B + sp) * 2 * hd;                    /* the open group, up to 127 behind */
        }
    }
    /* the pool: the entries are one block layer whose row is the block's values over 128
     * positions (rounded up to a whole row: under 128 values); each layer's raw rows and
     * projection rows are rings of their own lengths (engine_dsv4_kv_geometry), a window state
     * their rows above in its compact layout (raw rows in the blocks' type); without compressed
     * layers the raw rows are in blocks */
    out->width = TM_ALIGN_UP(wmax, TM_MAX(qk, 16));
    if (out->block > 0) {
        out->n_slabs = 1;
        out->slab_width = TM_ALIGN_UP((int)((out->block + B - 1) / B), qk);
        for (int il = 0; il < s->n_layers; il++) {
            const int r = s->ratio[il];
            int w;
            dsv4_layout_of(r, s->head_dim, s->idx_dim, &w);
            out->pool_ring += (s->swa + sp) * hd + dsv4_proj_slots(r) * TM_ALIGN_UP(w, 16);
        }

    } else {
        out->n_slabs = s->n_layers;
        out->slab_width = out->width;
    }
    out->pool_block = out->n_slabs * B * out->slab_width;
    out->block_bytes = (int64_t)quant_row_bytes(t, out->block);
    out->pool_block_bytes = (int64_t)quant_row_bytes(t, out->pool_block);
    out->window_bytes = (int64_t)quant_row_bytes(t, out->window);
    return true;
}

bool engine_dsv4_type_ok(const model *m, qtype t, engine_dsv4_sizes *out, char *err, size_t errsz)
{
    const int L = m->hp.n_layers;
    int32_t *ratio = xcalloc((size_t)L, sizeof *ratio);
    for (int il = 0; il < L; il++) ratio[il] = m->dsv4->layers[il].ratio;
    engine_dsv4_shape s = { L, ratio, m->hp.head_dim, m->dsv4->idx_dim, m->dsv4->swa, t };
    /* the loader accepted the model's ratios and sizes (model_dsv4.c): only the type can fail */
    bool ok = engine_dsv4_sizes_of(&s, out, err, errsz);
    if (!ok) memset(out, 0, sizeof *out);
    free(ratio);
    return ok;
}

void engine_dsv4_model_sizes(const model *m, qtype t, engine_dsv4_sizes *out)
{
    char err[256];
    engine_dsv4_type_ok(m, t, out, err, sizeof err);
}

int engine_dsv4_pool_layers(const model *m)
{
    engine_dsv4_sizes z;
    engine_dsv4_model_sizes(m, QTYPE_F32, &z);
    return z.block > 0 ? m->hp.n_layers + z.n_slabs : m->hp.n_layers;
}

kvpool_opts engine_dsv4_kv_geometry(const model *m, qtype t, int32_t *layer_window)
{
    engine_dsv4_sizes z;
    engine_dsv4_model_sizes(m, QTYPE_F32, &z);
    const bool comp = z.block > 0;
    /* the entries' row in t (Q8_0: whole blocks); a type the layout cannot hold keeps F32's
     * geometry, which kvpool_new or engine_dsv4_new then refuses by name */
    if (comp) {
        engine_dsv4_sizes zt;
        engine_dsv4_model_sizes(m, t, &zt);
        if (zt.block > 0) z = zt;
    }
    const int L = m->hp.n_layers;
    const int n = comp ? L + z.n_slabs : L;   /* engine_dsv4_pool_layers */
    int32_t *width = layer_window + n, *aux = width + n, *slots = aux + n, *srows = slots + 2 * n;
    int32_t *scols = srows + 2 * n;
    const int swa = m->dsv4->swa;
    /* window max(swa, 128) (the exact replay span's unit); per layer a ring of raw rows (kv 0,
     * swa + spare slots, the last swa in a state in the blocks' type) and of projections (kv 1,
     * dsv4_proj_slots; in a state only the ratio-4 carry: the last group's first halves) */
    for (int il = 0; il < n; il++) {
        const bool win = comp && il < L;
        const int r = win ? m->dsv4->layers[il].ratio : 0;
        int w;
        dsv4_layout dl = dsv4_layout_of(r, m->hp.head_dim, m->dsv4->idx_dim, &w);
        layer_window[il] = win ? TM_MAX(swa, KVPOOL_BLOCK) : 0;
        width[il] = win ? m->hp.head_dim : comp ? z.slab_width : 0;   /* raw rows; the entries' block layer */
        aux[il] = win ? TM_ALIGN_UP(w, 16) : 0;
        slots[2 * il] = win ? swa + KVPOOL_RING_SPARE : 0;
        slots[2 * il + 1] = dsv4_proj_slots(r);
        srows[2 * il] = win ? swa : 0;
        srows[2 * il + 1] = r == 4 ? 4 : 0;
        scols[2 * il] = 0;
        scols[2 * il + 1] = r == 4 ? dl.half : 0;
    }
    kvpool_opts ko = { .n_layers = n, .n_kv_heads = 1, .head_dim = z.width, .v_is_k = true,
                       .dtype = comp ? t : QTYPE_F32, .layer_window = layer_window, .layer_width = width,
                       .ring_f32 = true };
    if (comp) {
        ko.ring_aux_width = aux, ko.ring_slots = slots, ko.state_rows = srows, ko.state_cols = scols;
        ko.state_k_dtype = true;
    }
    memcpy(ko.model_fp, m->fingerprint, 32);
    return ko;
}

void engine_dsv4_free(engine_dsv4 *d)
{
    if (!d) return;
    void *bufs[] = { d->lay, d->X, d->xf, d->mix, d->pre, d->post, d->comb, d->cur, d->y, d->qa, d->q, d->kvr,
                     d->ck, d->cg, d->ik, d->ig, d->iq, d->iw, d->att, d->oa, d->pos, d->npos,
                     d->sel, d->n_sel, d->r_logits, d->r_probs, d->r_sel, d->r_w, d->r_idx, d->r_sc, d->x_row,
                     d->x_slot, d->xg, d->fg, d->fu, d->ye, d->shg, d->shu, d->sh, d->mm_scratch, d->th_f, d->th_i,
                     d->ent, d->rrow, d->run0, d->prev_run, d->wsnap, d->wsnap_t, d->wsnap_data, d->x_off, d->x_act,
                     d->moe_tmp, d->att_buf };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(d);
}

static size_t dsv4_sc(const ops_weight *w, int T, size_t cur)
{
    if (!w->data) return cur;
    return TM_MAX(cur, ops_matmul_scratch_bytes(w->type, w->cols, T));
}

engine_dsv4 *engine_dsv4_new(const model *m, threadpool *tp, kvpool *kv, int max_tokens, int max_pos, char *err,
                             size_t errsz)
{
    const model_hparams *hp = &m->hp;
    const model_dsv4 *md = m->dsv4;
    if ((2 + md->hc) * md->hc > DSV4_MAX_MIX) {
        snprintf(err, errsz, "deepseek4: %d hyper-connection streams (at most 6)", md->hc);
        return NULL;
    }
    engine_dsv4 *d = xcalloc(1, sizeof *d);
    d->m = m, d->d = md, d->tp = tp, d->kv = kv, d->max_tokens = max_tokens;
    d->row = kvpool_head_dim(kv);
    d->ring = kvpool_n_window_layers(kv) > 0;
    d->bt = kvpool_dtype(kv);
    const bool bt_ok = d->bt == QTYPE_F16 || d->bt == QTYPE_F32 ||
                       (d->bt == QTYPE_Q8_0 && hp->head_dim % QK8_0 == 0 && md->idx_dim % QK8_0 == 0);
    d->hd_b = bt_ok ? quant_row_bytes(d->bt, hp->head_dim) : 0;
    d->id_b = bt_ok ? quant_row_bytes(d->bt, md->idx_dim) : 0;
    d->max_ent = max_pos / 4 + 1;
    /* llama.cpp's V4 cache rotates what it stores by an orthonormal Walsh-Hadamard matrix, the
     * queries likewise and the attention output back: the indexer's keys always, the raw rows
     * and compressed entries when the head size equals the indexer's key size (its rule for the
     * indexer's cache then matches the others). Exact arithmetic is unchanged; what changes is
     * where an F16 cache rounds, so the engine rotates where llama.cpp does (docs/deepseek4.md,
     * "The F16 cache against llama.cpp"). A quantised (Q8_0) cache rotates every cache whose key
     * size is a multiple of 64, as llama.cpp's rule for any quantised cache (its K only: V is K
     * here). Without compressed layers the rows are F32, so there is nothing to match, and a
     * DSpark drafter's context rows (engine_dflash.c) are unrotated. */
    d->irot = ops_hadamard_order(md->idx_dim);
    d->rot = d->ring && (hp->head_dim == md->idx_dim || d->bt == QTYPE_Q8_0) ? ops_hadamard_order(hp->head_dim) : 0;
    d->lay = xcalloc((size_t)hp->n_layers, sizeof *d->lay);
    int w, wmax = 0;
    bool rings_ok = true;   /* each layer's raw and projection rings as engine_dsv4_kv_geometry made them */
    int64_t n_ent = 0;   /* bytes of a block's packed entries */
    for (int il = 0; il < hp->n_layers; il++) {
        const int r = md->layers[il].ratio;
        dsv4_layout *l = &d->lay[il];
        *l = dsv4_layout_of(r, hp->head_dim, md->idx_dim, &w);
        wmax = TM_MAX(wmax, TM_MAX(w, hp->head_dim));
        rings_ok &= !d->ring || (kvpool_layer_width(kv, il, 0) == hp->head_dim &&
                                 kvpool_ring_slots(kv, il, 0) >= md->swa + KVPOOL_RING_SPARE &&
                                 (!r || (kvpool_layer_width(kv, il, 1) >= w &&
                                         kvpool_ring_slots(kv, il, 1) >= dsv4_proj_slots(r))));
        if (r > 0) l->ent = (int)n_ent, n_ent += (int64_t)(KVPOOL_BLOCK / r) * (int64_t)d->hd_b;
        if (r == 4) l->ient = (int)n_ent, n_ent += (int64_t)(KVPOOL_BLOCK / 4) * (int64_t)d->id_b;
    }
    /* the pool must be engine_dsv4_kv_geometry's for this model */
    if (d->row < wmax || (n_ent > 0) != d->ring || !rings_ok || !bt_ok ||
        (d->ring && (kvpool_ring_dtype(kv) != QTYPE_F32 || (int64_t)kvpool_block_bytes(kv) < n_ent))) {
        snprintf(err, errsz, "deepseek4: the KV pool's geometry (rows of %d %s) does not hold this model's state",
                 d->row, quant_type_name(d->bt));
        engine_dsv4_free(d);
        return NULL;
    }

    const size_t T = (size_t)max_tokens, dim = (size_t)hp->dim, hc = (size_t)md->hc, H = (size_t)hp->n_heads;
    const size_t hd = (size_t)hp->head_dim, id = (size_t)md->idx_dim, E = (size_t)hp->n_expert;
    const size_t k = (size_t)hp->n_expert_used, ffn = (size_t)md->max_ffn, mix = (2 + hc) * hc;
#define DSV4_F(n) util_aligned_alloc((n) * sizeof(float))
    d->X = DSV4_F(T * hc * dim);
    d->xf = DSV4_F(T * hc * dim);
    d->mix = DSV4_F(T * mix);
    d->pre = DSV4_F(T * hc);
    d->post = DSV4_F(T * hc);
    d->comb = DSV4_F(T * hc * hc);
    d->cur = DSV4_F(T * dim);
    d->y = DSV4_F(T * dim);
    d->qa = DSV4_F(T * (size_t)md->q_lora);
    d->q = DSV4_F(T * H * hd);
    d->kvr = DSV4_F(T * hd);
    d->ck = DSV4_F(T * 2 * hd);
    d->cg = DSV4_F(T * 2 * hd);
    d->ik = DSV4_F(T * 2 * id);
    d->ig = DSV4_F(T * 2 * id);
    d->iq = DSV4_F(T * (size_t)md->idx_heads * id);
    d->iw = DSV4_F(T * (size_t)md->idx_heads);
    d->att = DSV4_F(T * H * hd);
    d->oa = DSV4_F(T * (size_t)md->o_groups * (size_t)md->o_lora);
    d->pos = DSV4_F(T);
    d->npos = DSV4_F(T);
    d->sel = DSV4_F(T * (size_t)md->idx_topk);
    d->n_sel = DSV4_F(T);
    d->r_logits = DSV4_F(T * E);
    d->r_probs = DSV4_F(T * E);
    d->r_sel = DSV4_F(T * k);
    d->r_w = DSV4_F(T * k);
    d->r_idx = DSV4_F(E);
    d->r_sc = DSV4_F(E);
    d->x_row = DSV4_F(T * k);
    d->x_slot = DSV4_F(T * k);
    d->x_off = DSV4_F(E + 1);
    d->x_act = DSV4_F(E);
    d->xg = DSV4_F(T * k * dim);
    d->fg = DSV4_F(T * k * ffn);
    d->fu = DSV4_F(T * k * ffn);
    d->ye = DSV4_F(T * k * dim);
    size_t shf = (size_t)TM_MAX(hp->n_shared, 1) * ffn;
    d->shg = DSV4_F(T * shf);
    d->shu = DSV4_F(T * shf);
    d->sh = DSV4_F(T * dim);
    int nth = threadpool_size(tp);
    d->th_x = TM_ALIGN_UP(TM_MAX((size_t)md->swa + 2 * (size_t)d->max_ent, TM_MAX(hd, id)) + 16, 16);
    d->th_stride = d->th_x + TM_ALIGN_UP(3 * TM_MAX(hd, id) + 16, 16);
    d->th_f = DSV4_F((size_t)nth * d->th_stride);
    d->th_i = DSV4_F((size_t)nth * (size_t)d->max_ent);
    {   /* dsv4_att_heads' parts, each 64-byte aligned */
        const size_t nqp = TM_ALIGN_UP(TM_MIN((size_t)DSV4_ATT_HEADS, H), 16), B = OPS_ATT_KT_KEYS;
        d->att_stride = TM_ALIGN_UP(B * hd, 16) + TM_ALIGN_UP(hd * nqp, 16) + TM_ALIGN_UP(nqp * hd, 16) +
                        TM_ALIGN_UP(B * nqp, 16) + 3 * TM_ALIGN_UP(nqp, 16) + TM_ALIGN_UP(hd * B, 16);
        d->att_buf = DSV4_F((size_t)nth * d->att_stride);
    }
    d->ent = DSV4_F(TM_MAX(hd, id));
    d->rrow = xcalloc(hd, sizeof(float));
    d->run0 = xcalloc(T, sizeof *d->run0);
    d->prev_run = xcalloc(T, sizeof *d->prev_run);
    if (d->ring) {
        /* most steps cross no block end; a state is faulted in when captured */
        d->n_wsnap_max = (int)(T / KVPOOL_BLOCK) + 4;
        d->wsnap = xcalloc((size_t)d->n_wsnap_max, sizeof *d->wsnap);
        d->wsnap_t = xcalloc((size_t)d->n_wsnap_max, sizeof *d->wsnap_t);
        d->wsnap_data = calloc((size_t)d->n_wsnap_max, kvpool_window_state_bytes(kv));
    }
#undef DSV4_F
    size_t sc = 0, msc = 0;   /* msc: a chunk's of the experts' and wo_a's rounds (a view of any rows
                               * needs what the whole matrix does) */
    int Ti = (int)T;
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &m->layers[il];
        const model_dsv4_layer *dl = &md->layers[il];
        const ops_weight *in[7] = { &L->wq_a, &dl->wkv, &dl->comp_kv, &dl->comp_gate, &dl->icomp_kv, &dl->icomp_gate,
                                    &dl->idx_proj };
        int n_in = dl->ratio == 4 ? 7 : dl->ratio ? 4 : 2;
        sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(n_in, in, Ti));
        const ops_weight *hcw[2] = { &dl->hc_fn[0], &dl->hc_fn[1] };
        for (int j = 0; j < 2; j++) sc = dsv4_sc(hcw[j], Ti, sc);
        sc = dsv4_sc(&L->wq_b, Ti, sc);
        sc = dsv4_sc(&dl->idx_q_b, Ti, sc);
        msc = dsv4_sc(&dl->wo_a, Ti, msc);   /* its round's chunks */
        sc = dsv4_sc(&dl->wo_b, Ti, sc);
        sc = dsv4_sc(&L->gate_inp, Ti, sc);
        ops_weight g = model_expert(&L->gate_exps, hp->n_expert, 0), u = model_expert(&L->up_exps, hp->n_expert, 0);
        ops_weight dn = model_expert(&L->down_exps, hp->n_expert, 0);
        const ops_weight *gu[2] = { &g, &u };
        sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(2, gu, Ti * (int)k));
        sc = dsv4_sc(&dn, Ti * (int)k, sc);
        msc = TM_MAX(msc, ops_matmul_multi_scratch_bytes(2, gu, Ti * (int)k));
        msc = dsv4_sc(&dn, Ti * (int)k, msc);
        if (L->gate_shexp.data) {
            const ops_weight *sgu[2] = { &L->gate_shexp, &L->up_shexp };
            sc = TM_MAX(sc, ops_matmul_multi_scratch_bytes(2, sgu, Ti));
            sc = dsv4_sc(&L->down_shexp, Ti, sc);
            msc = TM_MAX(msc, ops_matmul_multi_scratch_bytes(2, sgu, Ti));
            msc = dsv4_sc(&L->down_shexp, Ti, msc);
        }
    }
    d->moe_stride = TM_ALIGN_UP(2 * T * k * ENGINE_MOE_ROWS + (msc + 64) / sizeof(float), 16);
    d->moe_tmp = util_aligned_alloc((size_t)threadpool_size(tp) * d->moe_stride * sizeof(float));
    sc = dsv4_sc(&md->out_hc_fn, Ti, sc);
    sc = dsv4_sc(&m->output, Ti, sc);
    d->mm_scratch = util_aligned_alloc(sc + 64);
    void *need[] = { d->X, d->xf, d->mix, d->pre, d->post, d->comb, d->cur, d->y, d->qa, d->q, d->kvr, d->ck, d->cg,
                     d->ik, d->ig, d->iq, d->iw, d->att, d->oa, d->pos, d->npos, d->sel, d->n_sel,
                     d->r_logits, d->r_probs, d->r_sel, d->r_w, d->r_idx, d->r_sc, d->x_row, d->x_slot, d->xg,
                     d->fg, d->fu, d->ye, d->shg, d->shu, d->sh, d->mm_scratch, d->th_f, d->th_i, d->ent,
                     d->ring ? (void *)d->wsnap_data : d->ent, d->x_off, d->x_act, d->moe_tmp, d->att_buf };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i]) {
            snprintf(err, errsz, "out of memory for DeepSeek V4's activations of %d tokens", Ti);
            engine_dsv4_free(d);
            return NULL;
        }
    return d;
}

/* ---- helpers ---------------------------------------------------------------------------- */

/* The F32 projection row of layer il at position pos (dsv4_layout): its ring slot. */
static float *dsv4_prow(const engine_dsv4 *d, const kvpool_seq *s, int il, int pos)
{
    return kvpool_seq_ring_row(d->kv, s, il, 1, 0, pos);
}

/* The F32 raw K=V row of layer il at position pos: its ring slot, or (raw rows in blocks) its
 * block row. */
static float *dsv4_row(const engine_dsv4 *d, const kvpool_seq *s, int il, int pos)
{
    if (d->ring) return kvpool_seq_ring_row(d->kv, s, il, 0, 0, pos);
    float *slab = kvpool_seq_slab(d->kv, s, pos / KVPOOL_BLOCK, il, 0, 0);
    return slab + (size_t)(pos % KVPOOL_BLOCK) * (size_t)d->row;
}

/* The raw K=V row (hd floats) that entry t reads at key position pp: the step's own (kvr) when
 * pp is in a run of its sequence in this step, else its ring's (or block's). */
static const float *dsv4_raw(const engine_dsv4 *d, int t, int il, int pp)
{
    if (d->ring)
        for (int r0 = d->run0[t];; r0 = d->prev_run[r0]) {
            int p0 = d->toks[r0].pos;
            if (pp >= p0) return d->kvr + (size_t)(r0 + pp - p0) * (size_t)d->m->hp.head_dim;
            if (d->prev_run[r0] < 0) break;
        }
    return dsv4_row(d, d->toks[t].seq, il, pp);
}

/* The packed entry at byte offset off of the block that holds position pos, in the blocks'
 * element type. */
static uint8_t *dsv4_ent(const engine_dsv4 *d, const kvpool_seq *s, int pos, int off)
{
    return (uint8_t *)kvpool_seq_slab(d->kv, s, pos / KVPOOL_BLOCK, d->m->hp.n_layers, 0, 0) + off;
}

/* Where entry j of layer il (ratio r) is: its position (r * j), and in *off its byte offset. */
static int dsv4_ent_at(const engine_dsv4 *d, int il, int r, int j, bool idx, int *off)
{
    const dsv4_layout *l = &d->lay[il];
    *off = idx ? l->ient + (j % (KVPOOL_BLOCK / 4)) * (int)d->id_b : l->ent + (j % (KVPOOL_BLOCK / r)) * (int)d->hd_b;
    return r * j;
}

/* An F16 or F32 entry (n values) dotted with an F32 query; a Q8_0 entry with the query in Q8_0
 * (q8: ggml's one-query flash attention quantises the query to the key's vec-dot type). */
static float dsv4_ent_dot(const engine_dsv4 *d, int n, const float *q, const block_q8_0 *q8, const uint8_t *e)
{
    switch (d->bt) {
    case QTYPE_F16: return ops_vec_dot_f16_f32(n, (const fp16_t *)e, q);
    case QTYPE_Q8_0: return ops_vec_dot_kv(QTYPE_Q8_0, n, e, q8);
    default: return ops_vec_dot_f32(n, q, (const float *)e);
    }
}

static float dsv4_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* RoPE rp on the last n_rot of each head_dim values of rows * n_heads heads, at positions pos
 * (negated: the inverse rotation). */
static void dsv4_rope(const engine_dsv4 *d, float *x, const int32_t *pos, int rows, int n_heads, int head_dim,
                      const model_dsv4_rope *rp)
{
    const int n_rot = d->m->hp.n_rot;
    ops_rope_ggml(rows * n_heads >= 64 ? d->tp : NULL, x + (head_dim - n_rot), pos, rows, n_heads, head_dim, n_rot, 0,
                  rp->theta_scale, rp->freq_scale, NULL, rp->mscale, rp->yarn[0] != 0.0f ? rp->yarn : NULL);
}

/* GCC vectorises at -O2 only loops of known trip counts; the streams' loops below keep each
 * element's order of operations, so vectorising them changes no bit (clang does it at -O2). */
#if defined(__clang__)
#define DSV4_VECTORISE
#else
#define DSV4_VECTORISE __attribute__((optimize("tree-vectorize")))
#endif

/* out = sum_h w[h] X[h] over hc streams of dim, each element summed from 0 in stream order. */
DSV4_VECTORISE
static void dsv4_hc_sum(float *out, const float *X, const float *w, int hc, int dim)
{
    for (int i = 0; i < dim; i++) out[i] = 0;
    for (int h = 0; h < hc; h++) {
        const float wh = w[h], *xh = X + (size_t)h * dim;
        for (int i = 0; i < dim; i++) out[i] += wh * xh[i];
    }
}

/* Hyper-connection mixes of the step's rows (which: 0 attention, 1 ffn), and the sublayer
 * input cur = sum_h pre[h] X[h], normed by norm. */
static void dsv4_hc_pre(engine_dsv4 *d, int T, const ops_weight *fn, const float *base, const float *scale,
                        const float *norm)
{
    const model_hparams *hp = &d->m->hp;
    const int hc = d->d->hc, dim = hp->dim, mix = (2 + hc) * hc;
    const float eps = d->d->hc_eps;
    ops_rmsnorm(d->tp, d->xf, d->X, NULL, T, hc * dim, hp->rms_eps);
    ops_matmul(d->tp, fn, d->xf, T, d->mix, d->mm_scratch);
    for (int t = 0; t < T; t++) {
        const float *mx = d->mix + (size_t)t * mix;
        float *pre = d->pre + (size_t)t * hc, *post = d->post + (size_t)t * hc, *c = d->comb + (size_t)t * hc * hc;
        for (int h = 0; h < hc; h++) {
            pre[h] = dsv4_sigmoid(mx[h] * scale[0] + base[h]) + eps;
            post[h] = 2.0f * dsv4_sigmoid(mx[hc + h] * scale[1] + base[hc + h]);
        }
        for (int i = 0; i < hc * hc; i++) c[i] = mx[2 * hc + i] * scale[2] + base[2 * hc + i];
        for (int s = 0; s < hc; s++) {   /* softmax over dst, + eps */
            float *r = c + s * hc, mxv = r[0], sum = 0;
            for (int j = 1; j < hc; j++) mxv = fmaxf(mxv, r[j]);
            for (int j = 0; j < hc; j++) sum += (r[j] = expf(r[j] - mxv));
            for (int j = 0; j < hc; j++) r[j] = r[j] / sum + eps;
        }
        for (int it = 0; it < d->d->sk_iters; it++) {
            if (it > 0)
                for (int s = 0; s < hc; s++) {   /* rows */
                    float sum = 0;
                    for (int j = 0; j < hc; j++) sum += c[s * hc + j];
                    for (int j = 0; j < hc; j++) c[s * hc + j] /= sum + eps;
                }
            for (int j = 0; j < hc; j++) {   /* columns */
                float sum = 0;
                for (int s = 0; s < hc; s++) sum += c[s * hc + j];
                for (int s = 0; s < hc; s++) c[s * hc + j] /= sum + eps;
            }
        }
        dsv4_hc_sum(d->cur + (size_t)t * dim, d->X + (size_t)t * hc * dim, pre, hc, dim);
    }
    if (norm) ops_rmsnorm(d->tp, d->cur, d->cur, norm, T, dim, hp->rms_eps);
}

/* X'[dst] = y * post[dst] + sum_src comb[src][dst] X[src] */
DSV4_VECTORISE
static void dsv4_hc_post(engine_dsv4 *d, int T)
{
    const int hc = d->d->hc, dim = d->m->hp.dim;
    float nx[16 * 64];
    for (int t = 0; t < T; t++) {
        float *X = d->X + (size_t)t * hc * dim;
        const float *y = d->y + (size_t)t * dim, *post = d->post + (size_t)t * hc, *c = d->comb + (size_t)t * hc * hc;
        for (int i0 = 0; i0 < dim; i0 += 64) {
            int n = TM_MIN(64, dim - i0);
            for (int h = 0; h < hc; h++) {   /* y post[h], then + comb[s][h] X[s] in stream order */
                float *o = nx + h * 64;
                const float ph = post[h];
                for (int i = 0; i < n; i++) o[i] = y[i0 + i] * ph;
                for (int s = 0; s < hc; s++) {
                    const float cs = c[s * hc + h], *xs = X + (size_t)s * dim + i0;
                    for (int i = 0; i < n; i++) o[i] += cs * xs[i];
                }
            }
            for (int h = 0; h < hc; h++) memcpy(X + (size_t)h * dim + i0, nx + h * 64, (size_t)n * sizeof(float));
        }
    }
}

/* Entry j of a compressor of ratio r from the rows of its group (r = 4: their second halves,
 * and the previous group's first halves): per dimension a softmax over the group's scores
 * weighting its kv; then the norm and RoPE at position r * j. kvo / sco: the projections'
 * offsets in the projection row, w the entry's width, out the entry. */
static void dsv4_compress(const engine_dsv4 *d, const kvpool_seq *s, int il, int j, int r, int kvo, int sco, int w,
                          const float *norm, float *out, float *tmp)
{
    const bool overlap = r == 4;
    const float *kv[2 * 4 + 128], *sc[2 * 4 + 128];
    int off[2 * 4 + 128];
    int nr = 0;
    if (overlap && j > 0)
        for (int i = 0; i < r; i++) {
            const float *row = dsv4_prow(d, s, il, r * (j - 1) + i);
            kv[nr] = row + kvo, sc[nr] = row + sco, off[nr++] = 0;
        }
    for (int i = 0; i < r; i++) {
        const float *row = dsv4_prow(d, s, il, r * j + i);
        kv[nr] = row + kvo, sc[nr] = row + sco, off[nr++] = d->lay[il].half;
    }
    for (int x = 0; x < w; x++) {
        float mx = -INFINITY;
        for (int i = 0; i < nr; i++) mx = fmaxf(mx, sc[i][off[i] + x]);
        float sum = 0, acc = 0;
        for (int i = 0; i < nr; i++) {
            float e = expf(sc[i][off[i] + x] - mx);
            sum += e;
            acc += e * kv[i][off[i] + x];
        }
        tmp[x] = acc / sum;
    }
    ops_rmsnorm(NULL, out, tmp, norm, 1, w, d->m->hp.rms_eps);
    int32_t p = r * j;
    dsv4_rope(d, out, &p, 1, 1, w, &d->d->rope_comp);
}

/* Entry j of layer il's compressor (idx: the indexer's) into its place in the sequence's block. */
static void dsv4_compress_store(engine_dsv4 *d, const kvpool_seq *s, int il, int j, int r, bool idx, float *tmp)
{
    const model_dsv4_layer *dl = &d->d->layers[il];
    const dsv4_layout *l = &d->lay[il];
    const int w = idx ? d->d->idx_dim : d->m->hp.head_dim;
    dsv4_compress(d, s, il, j, r, idx ? l->ikv : l->ckv, idx ? l->isc : l->csc, w, idx ? dl->icomp_norm : dl->comp_norm,
                  d->ent, tmp);
    const int rot = idx ? d->irot : d->rot;
    if (rot) ops_hadamard_rows(d->ent, w / rot, rot);
    int off, pos = dsv4_ent_at(d, il, r, j, idx, &off);
    kvpool_row_put(d->bt, d->ent, dsv4_ent(d, s, pos, off), w);
}

/* ---- indexer and attention (pool rounds) ---------------------------------------------- */

static float *dsv4_th(const engine_dsv4 *d, int ith) { return d->th_f + (size_t)ith * d->th_stride; }

/* Top-k of an indexed layer's entries for each entry of the step. */
static void dsv4_job_indexer(void *ctx, int ith, int nth)
{
    engine_dsv4 *d = ctx;
    const model_dsv4 *md = d->d;
    const int il = d->layer, ih = md->idx_heads, id = md->idx_dim, k = md->idx_topk;
    float *sc = dsv4_th(d, ith), *kf = sc + d->th_x;
    int32_t *ord = d->th_i + (size_t)ith * (size_t)d->max_ent;
    for (int t = ith; t < d->n_tok; t += nth) {
        const engine_tok *tk = &d->toks[t];
        int n = (tk->pos + 1) / 4;
        int32_t *sel = d->sel + (size_t)t * k;
        if (n <= k) {
            for (int j = 0; j < n; j++) sel[j] = j;
            d->n_sel[t] = n;
            continue;
        }
        const float *q = d->iq + (size_t)t * ih * id, *w = d->iw + (size_t)t * ih;
        for (int j = 0; j < n; j++) {
            int off, pe = dsv4_ent_at(d, il, 4, j, true, &off);
            const uint8_t *key = dsv4_ent(d, tk->seq, pe, off);
            /* llama.cpp's fused indexer turns a quantised key to F32 and dots it with the F32
             * queries */
            if (d->bt == QTYPE_Q8_0) quant_dequantize_row(QTYPE_Q8_0, key, kf, id);
            float s = 0;
            for (int h = 0; h < ih; h++) {
                float dot = d->bt == QTYPE_Q8_0 ? ops_vec_dot_f32(id, q + (size_t)h * id, kf)
                                                : dsv4_ent_dot(d, id, q + (size_t)h * id, NULL, key);
                s += w[h] * (dot > 0 ? dot : 0);
            }
            sc[j] = s;
            ord[j] = j;
        }
        moe_sort_desc(ord, n, sc);
        for (int j = 0; j < k; j++) sel[j] = ord[j];
        /* ascending: the keys in position order, as a full selection has them */
        for (int a = 1; a < k; a++) {
            int32_t v = sel[a];
            int b = a;
            for (; b > 0 && sel[b - 1] > v; b--) sel[b] = sel[b - 1];
            sel[b] = v;
        }
        d->n_sel[t] = k;
    }
}

/* Attention of (entry, head) items: the window's raw rows and the layer's (chosen) entries
 * as keys and values, a sink per head. */
/* Attention of entry t's query heads [h0, h0 + nq) with the blocks' entries in F16 or F32: the
 * keys (K = V: the one raw head, then the compressed entries) in blocks of at most 128, the
 * raw rows cut at multiples of 128 positions and the entries 128 at a time in selection
 * order, so that the blocks depend only on the entry's position; each block gathered in F32
 * once for all nq heads (ops_att_block: the queries in lanes, an online softmax), the sink
 * folded in at the end as one more key without a value. */
static void dsv4_att_heads(engine_dsv4 *d, int ith, int t, int h0, int nq)
{
    const model *m = d->m;
    const int il = d->layer, H = m->hp.n_heads, hd = m->hp.head_dim, r = d->d->layers[il].ratio;
    const int B = OPS_ATT_KT_KEYS, nqp = TM_ALIGN_UP(nq, 16);
    const engine_tok *tk = &d->toks[t];
    const int p = tk->pos, lo = TM_MAX(kvpool_seq_win_lo(tk->seq), TM_MAX(0, p - d->d->swa + 1));
    const int hi = d->last ? d->last[t] : p;
    float *kf = d->att_buf + (size_t)ith * d->att_stride;             /* (B, hd) the block */
    float *qt = kf + TM_ALIGN_UP((size_t)B * hd, 16);                  /* (hd, nqp) */
    float *acc = qt + TM_ALIGN_UP((size_t)hd * nqp, 16);               /* (nqp, hd) */
    float *st = acc + TM_ALIGN_UP((size_t)nqp * hd, 16);               /* (B, nqp) */
    float *M = st + TM_ALIGN_UP((size_t)B * nqp, 16), *S = M + TM_ALIGN_UP(nqp, 16);
    int32_t *lim = (int32_t *)(S + TM_ALIGN_UP(nqp, 16));
    float *kt = (float *)lim + TM_ALIGN_UP(nqp, 16);                   /* (hd, B) */
    const float *q = d->q + ((size_t)t * H + h0) * hd;
    for (int k = 0; k < hd; k++) {
        float *row = qt + (size_t)k * nqp;
        for (int i = 0; i < nq; i++) row[i] = q[(size_t)i * hd + k];
        for (int i = nq; i < nqp; i++) row[i] = 0.0f;
    }
    for (int i = 0; i < nq; i++) M[i] = -INFINITY, S[i] = 0.0f, lim[i] = 0;
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    ops_att_block_args a = { .hd = hd, .nq = nq, .nqp = nqp, .scale = m->hp.att_scale, .qt = qt, .k = kf,
                             .v = kf, .lim = lim, .st = st, .m = M, .s = S, .acc = acc, .kt = kt };
    for (int b0 = lo; b0 <= hi;) {
        const int b1 = TM_MIN(hi + 1, (b0 / B + 1) * B);
        a.nb = b1 - b0;
        for (int i = 0; i < a.nb; i++) memcpy(kf + (size_t)i * hd, dsv4_raw(d, t, il, b0 + i), (size_t)hd * sizeof(float));
        for (int i = 0; i < nq; i++) lim[i] = a.nb;
        ops_att_block(&a);
        b0 = b1;
    }
    const int ne = r == 4 ? d->n_sel[t] : r > 0 ? (p + 1) / r : 0;
    for (int e0 = 0; e0 < ne; e0 += B) {
        a.nb = TM_MIN(B, ne - e0);
        for (int i = 0; i < a.nb; i++) {
            int j = r == 4 ? d->sel[(size_t)t * d->d->idx_topk + e0 + i] : e0 + i, off = 0;
            const int pe = dsv4_ent_at(d, il, r, j, false, &off);
            const uint8_t *e = dsv4_ent(d, tk->seq, pe, off);
            if (d->bt == QTYPE_F16) ops_fp16_to_fp32_row((const fp16_t *)e, kf + (size_t)i * hd, hd);
            else memcpy(kf + (size_t)i * hd, e, (size_t)hd * sizeof(float));
        }
        for (int i = 0; i < nq; i++) lim[i] = a.nb;
        ops_att_block(&a);
    }
    const float *sinks = m->layers[il].sinks;
    for (int i = 0; i < nq; i++) {
        float *o = d->att + ((size_t)t * H + h0 + i) * hd, *ai = acc + (size_t)i * hd;
        float s = sinks[h0 + i];
        if (s > M[i]) {
            float ms = expf(M[i] - s);
            ops_vec_scale_f32(hd, ai, ms);
            S[i] = S[i] * ms + 1.0f;
        } else {
            S[i] += expf(s - M[i]);
        }
        const float inv = 1.0f / S[i];
        for (int k = 0; k < hd; k++) o[k] = ai[k] * inv;
    }
}

static void dsv4_job_attention(void *ctx, int ith, int nth)
{
    engine_dsv4 *d = ctx;
    const model *m = d->m;
    const int il = d->layer, H = m->hp.n_heads, hd = m->hp.head_dim, r = d->d->layers[il].ratio;
    if (d->bt != QTYPE_Q8_0) {   /* the blocked pass (a Q8_0 cache's keys meet Q8_0 queries, below) */
        const int gh = TM_MIN(H, DSV4_ATT_HEADS), ng = (H + gh - 1) / gh;
        for (int it = ith; it < d->n_tok * ng; it += nth) {
            const int h0 = it % ng * gh;
            dsv4_att_heads(d, ith, it / ng, h0, TM_MIN(gh, H - h0));
        }
        return;
    }
    /* a Q8_0 cache: head by head */
    const float *sinks = m->layers[il].sinks, scale = m->hp.att_scale;
    float *sc = dsv4_th(d, ith), *qf = sc + d->th_x, *ef = qf + hd;
    block_q8_0 *q8 = (block_q8_0 *)(ef + hd);
    for (int it = ith; it < d->n_tok * H; it += nth) {
        int t = it / H, h = it % H;
        const engine_tok *tk = &d->toks[t];
        /* no key below the sequence's window floor (a replay starts there) */
        const int p = tk->pos, lo = TM_MAX(kvpool_seq_win_lo(tk->seq), TM_MAX(0, p - d->d->swa + 1));
        const int hi = d->last ? d->last[t] : p;
        const float *q = d->q + ((size_t)t * H + h) * hd, *qr = qf;
        float *o = d->att + ((size_t)t * H + h) * hd;
        /* the keys meet the query in Q8_0 (ggml's one-query path); the raw rows are the cache's
         * values in F32 (rounded through Q8_0), so the dequantised query against them is that
         * dot up to F32 summation order */
        quant_act_q8_0(q, q8, hd);
        quant_dequantize_row(QTYPE_Q8_0, q8, qf, hd);
        int nk = 0;
        for (int pp = lo; pp <= hi; pp++) sc[nk++] = ops_vec_dot_f32(hd, qr, dsv4_raw(d, t, il, pp)) * scale;
        int ne = 0;
        if (r == 4) ne = d->n_sel[t];
        else if (r > 0) ne = (p + 1) / r;
        for (int e = 0; e < ne; e++) {
            int j = r == 4 ? d->sel[(size_t)t * d->d->idx_topk + e] : e, off, pe = dsv4_ent_at(d, il, r, j, false, &off);
            sc[nk++] = dsv4_ent_dot(d, hd, q, q8, dsv4_ent(d, tk->seq, pe, off)) * scale;
        }
        float mx = sinks[h];
        for (int i = 0; i < nk; i++) mx = fmaxf(mx, sc[i]);
        float sum = expf(sinks[h] - mx);
        for (int i = 0; i < nk; i++) sum += (sc[i] = expf(sc[i] - mx));
        memset(o, 0, (size_t)hd * sizeof(float));
        int i = 0;
        for (int pp = lo; pp <= hi; pp++) ops_vec_mad_f32(hd, o, dsv4_raw(d, t, il, pp), sc[i++]);
        for (int e = 0; e < ne; e++) {
            int j = r == 4 ? d->sel[(size_t)t * d->d->idx_topk + e] : e, off, pe = dsv4_ent_at(d, il, r, j, false, &off);
            quant_dequantize_row(QTYPE_Q8_0, dsv4_ent(d, tk->seq, pe, off), ef, hd);   /* ggml's V to F32 */
            ops_vec_mad_f32(hd, o, ef, sc[i++]);
        }
        ops_vec_scale_f32(hd, o, 1.0f / sum);
    }
}

/* ---- runs, ring commits and window states (the compressed layout) ----------------------- */

/* Before a step: each entry's run (consecutive positions of one sequence) and each run's
 * predecessor of the same sequence in this step; the window states to capture: every block
 * end a run crosses at which the sequence's state is exact (kvpool_seq_exact_from). false: a
 * sequence's runs out of order, or starting further back than its ring holds. */
static bool dsv4_plan(engine_dsv4 *d)
{
    const engine_tok *toks = d->toks;
    const int T = d->n_tok;
    d->n_wsnap = 0;
    for (int t = 0; t < T;) {
        int r = t + 1;
        while (r < T && toks[r].seq == toks[t].seq && toks[r].pos == toks[r - 1].pos + 1) r++;
        const int p0 = toks[t].pos, p1 = toks[r - 1].pos;
        kvpool_seq *sq = toks[t].seq;
        for (int u = t; u < r; u++) d->run0[u] = t;
        d->prev_run[t] = -1;
        for (int u = t - 1; u >= 0; u--)
            if (toks[u].seq == sq) {
                if (toks[u].pos != p0 - 1) return false;
                d->prev_run[t] = d->run0[u];
                break;
            }
        if (d->prev_run[t] < 0 && p0 + KVPOOL_RING_SPARE < kvpool_seq_ring_next(sq)) return false;
        /* every ratio divides 128: no compression group is open at a block end, so the ring's
         * rows there (raw rows, the ratio-4 carry) and the blocks are the whole state */
        _Static_assert(KVPOOL_BLOCK % 128 == 0 && KVPOOL_BLOCK % 4 == 0, "V4's ratios divide a block");
        for (int end = (p0 / KVPOOL_BLOCK + 1) * KVPOOL_BLOCK; end <= p1 + 1; end += KVPOOL_BLOCK) {
            if (end < kvpool_window(d->kv) || end < kvpool_seq_exact_from(sq) || d->n_wsnap == d->n_wsnap_max) continue;
            d->wsnap_t[d->n_wsnap] = t;
            uint8_t *st = d->wsnap_data + (size_t)d->n_wsnap * kvpool_window_state_bytes(d->kv);
            kvpool_window_state_init(d->kv, st);
            d->wsnap[d->n_wsnap] = (engine_window_state){ .seq = sq, .end = end, .state = st };
            d->n_wsnap++;
        }
        t = r;
    }
    return true;
}

/* Layer il's part kv in state i (kvpool_seq_window_save's layout), its shape in *sp. */
static uint8_t *dsv4_state_rows(const engine_dsv4 *d, int i, int il, int kv, kvpool_wstate_part *sp)
{
    return kvpool_window_state_rows(d->kv, (void *)d->wsnap[i].state, il, kv, 0, sp);
}

/* Layer il's projection rows kept in state i (the ratio-4 carry: the last group's first
 * halves), just after the projections of its position end - 1 were written (a long run
 * overwrites them later). */
static void dsv4_capture_rows(const engine_dsv4 *d, int i, int il)
{
    kvpool_wstate_part sp;
    uint8_t *dst = dsv4_state_rows(d, i, il, 1, &sp);
    const int end = d->wsnap[i].end;
    for (int k = 0; k < sp.n_rows; k++)
        memcpy(dst + (size_t)k * sp.row_bytes, dsv4_prow(d, d->wsnap[i].seq, il, end - sp.n_rows + k), sp.row_bytes);
}

/* After layer il's attention: the raw rows of the states captured this step (the step's own
 * from kvr; in the state's type, the blocks': the rows were rounded through it already), then
 * each run's last raw rows (the ring's slots) into its ring; after the last layer the rings'
 * next position. */
static void dsv4_commit(engine_dsv4 *d, int il)
{
    const int R = kvpool_ring_slots(d->kv, il, 0), hd = d->m->hp.head_dim;
    const size_t rb = (size_t)hd * sizeof(float);
    for (int i = 0; i < d->n_wsnap; i++) {
        kvpool_wstate_part sp;
        uint8_t *dst = dsv4_state_rows(d, i, il, 0, &sp);
        const int end = d->wsnap[i].end;
        for (int k = 0; k < sp.n_rows; k++)
            kvpool_row_put(sp.type, dsv4_raw(d, d->wsnap_t[i], il, end - sp.n_rows + k), dst + (size_t)k * sp.row_bytes, hd);
    }
    for (int t = 0; t < d->n_tok;) {
        int r = t + 1;
        while (r < d->n_tok && d->run0[r] == t) r++;
        const int p0 = d->toks[t].pos, p1 = d->toks[r - 1].pos;
        kvpool_seq *sq = d->toks[t].seq;
        for (int pk = TM_MAX(p0, p1 + 1 - R); pk <= p1; pk++)
            memcpy(kvpool_seq_ring_row(d->kv, sq, il, 0, 0, pk), d->kvr + (size_t)(t + pk - p0) * hd, rb);
        if (il == d->m->hp.n_layers - 1) kvpool_seq_set_ring_next(sq, p1 + 1);
        t = r;
    }
}

int engine_dsv4_states(const engine_dsv4 *d, const engine_window_state **out)
{
    *out = d->wsnap;
    return d->n_wsnap;
}



/* A thread's part of moe_tmp as the experts' round lays it out (engine_moe_round): its first
 * output tile of (T * k, ENGINE_MOE_ROWS), and after the two tiles its matmul scratch. */
static float *dsv4_thread_tmp(const engine_dsv4 *d, int ith, void **scratch)
{
    const size_t rows_max = (size_t)d->max_tokens * d->m->hp.n_expert_used * ENGINE_MOE_ROWS;
    float *g = d->moe_tmp + (size_t)ith * d->moe_stride;
    *scratch = g + 2 * rows_max;
    return g;
}
/* The grouped output's first projection, every group in one pool round: work items are (group,
 * chunk of ENGINE_MOE_ROWS of its o_lora rows) in contiguous runs per thread (threadpool_items),
 * a thread quantising a group's input once for the run of chunks it takes from it
 * (ops_matmul_reuse). A chunk's values
 * are its rows of the group's product, so the split changes no bit; one round instead of one per
 * group keeps a decode step's threads from meeting at o_groups barriers per layer. */
static void dsv4_job_wo_a(void *ctx, int ith, int nth)
{
    engine_dsv4 *d = ctx;
    const model_dsv4 *md = d->d;
    const ops_weight *wa = &md->layers[d->layer].wo_a;
    const int G = md->o_groups, ol = md->o_lora, T = d->n_tok, R = ENGINE_MOE_ROWS, cg = (ol + R - 1) / R;
    const int64_t gd = wa->cols;
    void *scratch;
    float *tg = dsv4_thread_tmp(d, ith, &scratch);
    const float *qx = NULL;   /* the input quantised in scratch */
    (void)nth;
    for (;;) {
        const int it = threadpool_items_take(&d->wo_items, ith);
        if (it < 0) break;
        const int g = it / cg, c0 = it % cg * R, nr = TM_MIN(R, ol - c0);
        const ops_weight w = ops_weight_rows(wa, (int64_t)g * ol + c0, nr);
        const ops_weight *ws[1] = { &w };
        float *out[1] = { tg };
        ops_matmul_reuse(1, ws, d->og + (size_t)g * T * gd, T, out, scratch, &qx);
        for (int t = 0; t < T; t++)
            memcpy(d->oa + (size_t)t * G * ol + (size_t)g * ol + c0, tg + (size_t)t * nr, (size_t)nr * sizeof(float));
    }
}
/* ---- the layers ------------------------------------------------------------------------- */

static void dsv4_attention(engine_dsv4 *d, int il, int T)
{
    const model *m = d->m;
    const model_hparams *hp = &m->hp;
    const model_dsv4 *md = d->d;
    const model_layer *L = &m->layers[il];
    const model_dsv4_layer *dl = &md->layers[il];
    const dsv4_layout *lay = &d->lay[il];
    const int H = hp->n_heads, hd = hp->head_dim, r = dl->ratio, id = md->idx_dim, ih = md->idx_heads;
    const float eps = hp->rms_eps;
    const model_dsv4_rope *rp = r ? &md->rope_comp : &md->rope_raw;

    dsv4_hc_pre(d, T, &dl->hc_fn[0], dl->hc_base[0], dl->hc_scale[0], L->attn_norm);
    DSV4_MARK(d, il, ENGINE_PROF_HC);
    const ops_weight *in[7] = { &L->wq_a, &dl->wkv, &dl->comp_kv, &dl->comp_gate, &dl->icomp_kv, &dl->icomp_gate,
                                &dl->idx_proj };
    float *out[7] = { d->qa, d->kvr, d->ck, d->cg, d->ik, d->ig, d->iw };
    ops_matmul_multi(d->tp, r == 4 ? 7 : r ? 4 : 2, in, d->cur, T, out, d->mm_scratch);
    ops_rmsnorm(d->tp, d->qa, d->qa, L->q_a_norm, T, md->q_lora, eps);
    const ops_weight *qb[2] = { &L->wq_b, &dl->idx_q_b };
    float *qbo[2] = { d->q, d->iq };
    ops_matmul_multi(d->tp, r == 4 ? 2 : 1, qb, d->qa, T, qbo, d->mm_scratch);
    DSV4_MARK(d, il, ENGINE_PROF_QKV);
    ops_rmsnorm(d->tp, d->q, d->q, NULL, T * H, hd, eps);
    dsv4_rope(d, d->q, d->pos, T, H, hd, rp);
    ops_rmsnorm(d->tp, d->kvr, d->kvr, dl->kv_norm, T, hd, eps);
    dsv4_rope(d, d->kvr, d->pos, T, 1, hd, rp);
    if (d->rot) {
        ops_hadamard_rows(d->q, (int64_t)T * H * hd / d->rot, d->rot);
        ops_hadamard_rows(d->kvr, (int64_t)T * hd / d->rot, d->rot);
    }
    if (d->ring && d->bt != QTYPE_F32)   /* attention reads the raw rows as the cache holds them */
        for (int t = 0; t < T; t++) {
            kvpool_row_put(d->bt, d->kvr + (size_t)t * hd, d->rrow, hd);
            kvpool_row_get(d->bt, d->rrow, d->kvr + (size_t)t * hd, hd);
        }
    if (r == 4) {
        dsv4_rope(d, d->iq, d->pos, T, ih, id, &md->rope_comp);
        if (d->irot) ops_hadamard_rows(d->iq, (int64_t)T * ih * id / d->irot, d->irot);
        float s = 1.0f / sqrtf((float)id * (float)ih);
        for (int i = 0; i < T * ih; i++) d->iw[i] *= s;
    }

    /* the projections into the ring (raw rows into blocks without one), and the groups the
     * entries complete, in batch order; the window states at the block ends a run crosses
     * take the ring's rows there (their raw part after attention, dsv4_commit) */
    float *tmp = d->th_f;   /* the step thread's share, free outside the rounds */
    for (int t = 0; t < T; t++) {
        const engine_tok *tk = &d->toks[t];
        const int p = tk->pos;
        if (!d->ring) memcpy(dsv4_row(d, tk->seq, il, p), d->kvr + (size_t)t * hd, (size_t)hd * sizeof(float));
        if (r) {
            /* each projection's halves (one on ratio 128) to their places in the row */
            float *row = dsv4_prow(d, tk->seq, il, p);
            const int nh = r == 4 ? 2 : 1, c = nh * hd;
            const float *ape = dl->comp_ape + (size_t)(p % r) * c, *g = d->cg + (size_t)t * c;
            for (int h = 0; h < nh; h++) {
                float *kv = row + lay->ckv + h * lay->half, *sc = row + lay->csc + h * lay->half;
                memcpy(kv, d->ck + (size_t)t * c + (size_t)h * hd, (size_t)hd * sizeof(float));
                for (int i = 0; i < hd; i++) sc[i] = g[h * hd + i] + ape[h * hd + i];
            }
            if (r == 4) {
                const float *ia = dl->icomp_ape + (size_t)(p % 4) * 2 * id, *ig = d->ig + (size_t)t * 2 * id;
                for (int h = 0; h < 2; h++) {
                    float *kv = row + lay->ikv + h * lay->half, *sc = row + lay->isc + h * lay->half;
                    memcpy(kv, d->ik + (size_t)t * 2 * id + (size_t)h * id, (size_t)id * sizeof(float));
                    for (int i = 0; i < id; i++) sc[i] = ig[h * id + i] + ia[h * id + i];
                }
            }
        }
        for (int i = 0; i < d->n_wsnap; i++)
            if (d->wsnap[i].seq == tk->seq && d->wsnap[i].end == p + 1) dsv4_capture_rows(d, i, il);
        /* below full_from the attached blocks hold the entries: a replay leaves them alone */
        if (r && (p + 1) % r == 0 && p >= kvpool_seq_full_from(tk->seq)) {
            dsv4_compress_store(d, tk->seq, il, p / r, r, false, tmp);
            if (r == 4) dsv4_compress_store(d, tk->seq, il, p / r, r, true, tmp);
        }
    }
    DSV4_MARK(d, il, ENGINE_PROF_QKV_POST);
    d->layer = il;
    if (r == 4) threadpool_run(d->tp, dsv4_job_indexer, d);
    threadpool_run(d->tp, dsv4_job_attention, d);
    if (d->ring) dsv4_commit(d, il);
    DSV4_MARK(d, il, ENGINE_PROF_ATTENTION);

    /* back from the rotation, de-rope, then the grouped low-rank output */
    if (d->rot) ops_hadamard_rows(d->att, (int64_t)T * H * hd / d->rot, d->rot);
    dsv4_rope(d, d->att, d->npos, T, H, hd, rp);
    const int G = md->o_groups, gd = H * hd / G;
    d->og = d->att;   /* one token's row is its groups in order */
    if (T > 1) {      /* group-major into q, which the attention has done with */
        d->og = d->q;
        for (int g = 0; g < G; g++)
            for (int t = 0; t < T; t++)
                memcpy(d->q + ((size_t)g * T + t) * gd, d->att + (size_t)t * H * hd + (size_t)g * gd,
                       (size_t)gd * sizeof(float));
    }
    threadpool_items_reset(&d->wo_items, G * ((md->o_lora + ENGINE_MOE_ROWS - 1) / ENGINE_MOE_ROWS),
                           threadpool_size(d->tp));
    threadpool_run(d->tp, dsv4_job_wo_a, d);
    ops_matmul(d->tp, &dl->wo_b, d->oa, T, d->y, d->mm_scratch);
    DSV4_MARK(d, il, ENGINE_PROF_WO);
    dsv4_hc_post(d, T);
    DSV4_MARK(d, il, ENGINE_PROF_HC);
}

static void dsv4_moe(engine_dsv4 *d, int il, int T)
{
    const model *m = d->m;
    const model_hparams *hp = &m->hp;
    const model_layer *L = &m->layers[il];
    const model_dsv4_layer *dl = &d->d->layers[il];
    const int E = hp->n_expert, k = hp->n_expert_used, dim = hp->dim;

    dsv4_hc_pre(d, T, &dl->hc_fn[1], dl->hc_base[1], dl->hc_scale[1], L->ffn_norm);
    DSV4_MARK(d, il, ENGINE_PROF_HC);
    ops_matmul(d->tp, &L->gate_inp, d->cur, T, d->r_logits, d->mm_scratch);
    for (int t = 0; t < T; t++) {
        const float *lg = d->r_logits + (size_t)t * E;
        float *pr = d->r_probs + (size_t)t * E, sum = 0;
        int32_t *sel = d->r_sel + (size_t)t * k;
        float *w = d->r_w + (size_t)t * k;
        for (int e = 0; e < E; e++) {
            float x = lg[e], sp = x > 20.0f ? x : log1pf(expf(x));
            pr[e] = sqrtf(sp);
        }
        if (dl->tid2eid) {
            memcpy(sel, dl->tid2eid + (size_t)d->toks[t].token * k, (size_t)k * sizeof(int32_t));
        } else {
            for (int e = 0; e < E; e++) d->r_sc[e] = pr[e] + L->exp_probs_b[e], d->r_idx[e] = e;
            moe_sort_desc(d->r_idx, E, d->r_sc);
            memcpy(sel, d->r_idx, (size_t)k * sizeof(int32_t));
        }
        for (int i = 0; i < k; i++) sum += (w[i] = pr[sel[i]]);
        if (hp->router_norm)
            for (int i = 0; i < k; i++) w[i] /= fmaxf(sum, 6.103515625e-5f);
        if (hp->router_scale != 0.0f && hp->router_scale != 1.0f)
            for (int i = 0; i < k; i++) w[i] *= hp->router_scale;
    }
    /* the (token, slot) rows grouped by expert (ascending, then batch order), then every
     * active expert's matmuls in one round */
    int nr = 0;
    d->n_act = 0;
    for (int e = 0; e < E; e++) {
        d->x_off[e] = nr;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < k; i++)
                if (d->r_sel[(size_t)t * k + i] == e) {
                    memcpy(d->xg + (size_t)nr * dim, d->cur + (size_t)t * dim, (size_t)dim * sizeof(float));
                    d->x_slot[(size_t)t * k + i] = nr++;
                }
        if (nr > d->x_off[e]) d->x_act[d->n_act++] = e;
    }
    d->x_off[E] = nr;
    const bool sh_round = L->gate_shexp.data && T <= ENGINE_MOE_SHARED_T;
    if (L->gate_shexp.data && !sh_round) {   /* a dense FFN over the whole step, its own rounds */
        const int sf = (int)L->gate_shexp.rows;
        const ops_weight *gu[2] = { &L->gate_shexp, &L->up_shexp };
        float *fo[2] = { d->shg, d->shu };
        ops_matmul_multi(d->tp, 2, gu, d->cur, T, fo, d->mm_scratch);
        engine_moe_swiglu_clamp(d->shg, d->shu, (int64_t)T * sf, dl->clamp_shexp);
        ops_matmul(d->tp, &L->down_shexp, d->shg, T, d->sh, d->mm_scratch);
    }
    engine_moe_round r = {
        .tp = d->tp, .n_expert = E, .ef = dl->ffn, .dim = dim,
        .gate = &L->gate_exps, .up = &L->up_exps, .down = &L->down_exps,
        .act = ENGINE_MOE_ACT_SWIGLU_CLAMP, .lim = dl->clamp_exp,
        .x_act = d->x_act, .n_act = d->n_act, .x_off = d->x_off, .xg = d->xg, .fe = d->fg, .ye = d->ye,
        .sh_gate = sh_round ? &L->gate_shexp : NULL, .sh_up = &L->up_shexp, .sh_down = &L->down_shexp,
        .sh_act = ENGINE_MOE_ACT_SWIGLU_CLAMP, .sh_lim = dl->clamp_shexp, .T = T, .xs = d->cur, .fs = d->shg, .ys = d->sh,
        .tmp = d->moe_tmp, .tmp_stride = d->moe_stride, .tmp_rows = (size_t)d->max_tokens * k * ENGINE_MOE_ROWS,
    };
    engine_moe_round_run(&r);
    for (int t = 0; t < T; t++) {
        float *y = d->y + (size_t)t * dim;
        memset(y, 0, (size_t)dim * sizeof(float));
        for (int i = 0; i < k; i++)
            ops_vec_mad_f32(dim, y, d->ye + (size_t)d->x_slot[(size_t)t * k + i] * dim, d->r_w[(size_t)t * k + i]);
        if (L->gate_shexp.data) ops_add(NULL, y, d->sh + (size_t)t * dim, dim);
    }
    DSV4_MARK(d, il, ENGINE_PROF_MOE);
    dsv4_hc_post(d, T);
    DSV4_MARK(d, il, ENGINE_PROF_HC);
}

void engine_dsv4_capture(engine_dsv4 *d, const int8_t *slot, int n_cap, float *cap)
{
    d->cap_slot = slot, d->n_cap = n_cap, d->cap = cap;
}

/* The mean of the T entries' streams into their slot k of cap (llama.cpp's dsv4_hc_mean). */
static void dsv4_capture(engine_dsv4 *d, int k, int T)
{
    const int hc = d->d->hc, dim = d->m->hp.dim;
    for (int t = 0; t < T; t++) {
        const float *X = d->X + (size_t)t * hc * dim;
        float *o = d->cap + (size_t)t * d->n_cap * dim + (size_t)k * dim;
        memcpy(o, X, (size_t)dim * sizeof(float));
        for (int h = 1; h < hc; h++) ops_add(NULL, o, X + (size_t)h * dim, dim);
        ops_vec_scale_f32(dim, o, 1.0f / (float)hc);
    }
}

void engine_dsv4_block(engine_dsv4 *d, int T, const void *toks, const int32_t *last, const model *embd,
                       float *hidden)
{
    d->last = last, d->embd = embd;
    engine_dsv4_step(d, T, toks, NULL, hidden);   /* raw rows in blocks: no ring to refuse it */
    d->last = NULL, d->embd = NULL;
}

bool engine_dsv4_step_from(engine_dsv4 *d, int T, const void *toks, const float *x0, float *logits, float *hidden)
{
    d->x0 = x0;
    bool ok = engine_dsv4_step(d, T, toks, logits, hidden);
    d->x0 = NULL;
    return ok;
}

const float *engine_dsv4_streams(const engine_dsv4 *d) { return d->X; }

bool engine_dsv4_step(engine_dsv4 *d, int T, const void *toks_, float *logits, float *hidden)
{
    const model *m = d->m;
    const model_hparams *hp = &m->hp;
    const model_dsv4 *md = d->d;
    const engine_tok *toks = toks_;
    const int dim = hp->dim, hc = md->hc;
    d->toks = toks, d->n_tok = T;
    d->n_wsnap = 0;
    if (d->ring) {
        if (!dsv4_plan(d)) return false;
        kvpool_fill_wait(d->kv, -1);   /* the entries of blocks still loading from the store */
    }
    for (int t = 0; t < T; t++) {
        float *X = d->X + (size_t)t * hc * dim;
        if (d->x0) {
            memcpy(X, d->x0 + (size_t)t * hc * dim, (size_t)hc * dim * sizeof(float));
        } else {
            model_embed_row(d->embd ? d->embd : m, toks[t].token, X);
            for (int h = 1; h < hc; h++) memcpy(X + (size_t)h * dim, X, (size_t)dim * sizeof(float));
        }
        d->pos[t] = toks[t].pos;
        d->npos[t] = -toks[t].pos;
    }
    DSV4_MARK(d, hp->n_layers, ENGINE_PROF_EMBED);
    for (int il = 0; il < hp->n_layers; il++) {
        if (!d->ring) kvpool_fill_wait(d->kv, il);   /* layer il of blocks still loading from the store */
        if (d->cap && d->cap_slot[il] >= 0) dsv4_capture(d, d->cap_slot[il], T);
        dsv4_attention(d, il, T);
        dsv4_moe(d, il, T);
    }
    if (d->cap && d->cap_slot[hp->n_layers] >= 0) dsv4_capture(d, d->cap_slot[hp->n_layers], T);
    /* the head: the streams collapsed by their own mix (pre only), the output norm */
    ops_rmsnorm(d->tp, d->xf, d->X, NULL, T, hc * dim, hp->rms_eps);
    ops_matmul(d->tp, &md->out_hc_fn, d->xf, T, d->mix, d->mm_scratch);
    int n_out = 0;
    for (int t = 0; t < T; t++) {
        const float *mx = d->mix + (size_t)t * hc, *X = d->X + (size_t)t * hc * dim;
        float pre[16];
        for (int h = 0; h < hc; h++) pre[h] = dsv4_sigmoid(mx[h] * md->out_hc_scale[0] + md->out_hc_base[h]) + md->hc_eps;
        float *y = hidden + (size_t)t * dim;
        dsv4_hc_sum(y, X, pre, hc, dim);
        if (toks[t].want_logits && logits) memcpy(d->cur + (size_t)n_out++ * dim, y, (size_t)dim * sizeof(float));
    }
    if (n_out > 0) {
        ops_rmsnorm(d->tp, d->cur, d->cur, m->output_norm, n_out, dim, hp->rms_eps);
        DSV4_MARK(d, hp->n_layers, ENGINE_PROF_OUT_NORM);
        ops_matmul(d->tp, &m->output, d->cur, n_out, logits, d->mm_scratch);
        DSV4_MARK(d, hp->n_layers, ENGINE_PROF_OUTPUT);
    }
    return true;
}
