/*
 * engine_step: the decoder step (engine_step / engine_forward, engine.h). One function per
 * stage of a layer; the stages that the kernels module does not provide (bias rows, the K/V
 * store, attention over the paged pool, the experts' grouping) are small jobs run on the
 * engine's pool. Every buffer is engine_new's: a step allocates nothing.
 */
#include "engine/engine_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* Everything between the Q/K/V projections and attention, row by row, in one pool round (the
 * rows of a thread: a contiguous share of the batch): q/k/v += bias (qwen2), RMS norm of each
 * q and k head (qwen3), RoPE of q and k, and K/V into the pool. Per row the same arithmetic as
 * the separate ops, whatever the split; one round instead of up to six keeps a short step's
 * threads from meeting at that many barriers. */
static void engine_job_qkv_post(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[j->layer];
    const int T = j->b->n_tokens, hd = j->hd, nkv = j->nkv, qd = hp->n_heads * hd, kvd = nkv * hd;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth), n = t1 - t0;
    if (n <= 0) return;
    float *q = e->q + (size_t)t0 * qd, *k = e->k + (size_t)t0 * kvd, *v = e->v + (size_t)t0 * kvd;
    if (L->l_head_dim) {   /* gemma4: norms and RoPE in the layer's own geometry */
        engine_gemma4_rows(e, L, q, k, v, t0, n);
        if (L->kv_shared) {   /* queries only: its K/V are an earlier layer's */
            if (j->rot_k) ops_hadamard_rows(q, (int64_t)n * qd / j->rot_k, j->rot_k);
            return;
        }
        goto rotate_store;
    }
    if (L->bq)
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < qd; i++) q[(size_t)t * qd + i] += L->bq[i];
            for (int i = 0; i < kvd; i++) k[(size_t)t * kvd + i] += L->bk[i];
            for (int i = 0; i < kvd; i++) v[(size_t)t * kvd + i] += L->bv[i];
        }
    if (L->q_norm) {
        ops_rmsnorm(NULL, q, q, L->q_norm, n * hp->n_heads, hd, hp->rms_eps);
        ops_rmsnorm(NULL, k, k, L->k_norm, n * nkv, hd, hp->rms_eps);
    }
    /* gemma3: window layers rotate with their own base and no frequency scaling */
    const bool rope_swa = hp->rope_theta_scale_swa != 0.0f && L->window > 0;
    const float theta = rope_swa ? hp->rope_theta_scale_swa : hp->rope_theta_scale, fscale = rope_swa ? 1.0f : hp->rope_freq_scale;
    ops_rope_ggml(NULL, q, e->pos + t0, n, hp->n_heads, hd, hp->n_rot, hp->rope_neox, theta,
                  fscale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
    ops_rope_ggml(NULL, k, e->pos + t0, n, nkv, hd, hp->n_rot, hp->rope_neox, theta,
                  fscale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
    if (hp->attn_temp_scale != 0.0f)   /* mistral3: Llama 4's temperature, as llama.cpp's inp_attn_scale */
        for (int t = 0; t < n; t++) {
            float s = (float)(log(floorf((float)e->pos[t0 + t] / (float)hp->attn_temp_floor) + 1.0) * hp->attn_temp_scale + 1.0);
            ops_vec_scale_f32(qd, q + (size_t)t * qd, s);
        }
rotate_store:
    if (j->rot_k) {
        ops_hadamard_rows(q, (int64_t)n * qd / j->rot_k, j->rot_k);
        ops_hadamard_rows(k, (int64_t)n * kvd / j->rot_k, j->rot_k);
    }
    if (j->rot_v) ops_hadamard_rows(v, (int64_t)n * kvd / j->rot_v, j->rot_v);
    if (kvpool_layer_block_index(e->kv, j->layer) < 0) {   /* a window layer: staged (engine_window_commit) */
        const qtype dt = kvpool_dtype(e->kv);
        const size_t wrow = e->wrow_l[j->layer];
        for (int t = t0; t < t1; t++) {
            uint8_t *dk = e->wstage + (size_t)t * 2 * nkv * wrow, *dv = dk + nkv * wrow;
            for (int h = 0; h < nkv; h++) {
                kvpool_row_put(dt, e->k + (size_t)t * kvd + (size_t)h * hd, dk + (size_t)h * wrow, hd);
                kvpool_row_put(dt, e->v + (size_t)t * kvd + (size_t)h * hd, dv + (size_t)h * wrow, hd);
            }
        }
        return;
    }
    for (int t = t0; t < t1; t++) {
        const engine_tok *tk = &j->b->toks[t];
        if (tk->pos < kvpool_seq_full_from(tk->seq)) continue;   /* replayed: its blocks hold it */
        for (int h = 0; h < nkv; h++)
            kvpool_seq_store(e->kv, tk->seq, tk->pos, j->layer, h, e->k + (size_t)t * kvd + (size_t)h * hd,
                             e->v + (size_t)t * kvd + (size_t)h * hd);
    }
}

/* A row-by-row job (each thread takes a contiguous share of the batch rows, the arithmetic of
 * a row does not depend on the share) over `elems` floats of work: on the step thread alone
 * when that is below ENGINE_INLINE_ELEMS, where waking the pool and meeting at its end costs
 * more than the work (a decode step's few rows), or when the batch is one row, which only one
 * thread of a round could take (a wide model's q/k/v rows can pass the threshold alone, and the
 * other threads would only wake and wait); else as a pool round. Same bits either way. */
#define ENGINE_INLINE_ELEMS 8192
static void engine_run_rows(engine *e, void (*fn)(void *, int, int), engine_job *job, int64_t elems)
{
    if (elems <= ENGINE_INLINE_ELEMS || job->b->n_tokens == 1) fn(job, 0, 1);
    else threadpool_run(e->tp, fn, job);
}

/* x += xn (xn += j->bias first, if any), then (j->norm) xn = rmsnorm(x) * j->norm, the next
 * sublayer's input, row by row (engine_run_rows). */
static void engine_job_add_norm(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int T = j->b->n_tokens, dim = e->m->hp.dim;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth);
    if (t1 <= t0) return;
    float *x = e->x + (size_t)t0 * dim, *xn = e->xn + (size_t)t0 * dim;
    if (j->bias)   /* ggml: (W x + b), then the residual add */
        for (int t = 0; t < t1 - t0; t++) ops_add(NULL, xn + (size_t)t * dim, j->bias, dim);
    ops_add(NULL, x, xn, (int64_t)(t1 - t0) * dim);
    if (j->scale != 0.0f) ops_vec_scale_f32((int64_t)(t1 - t0) * dim, x, j->scale);   /* gemma4's layer scale */
    if (j->norm) ops_rmsnorm(NULL, xn, x, j->norm, t1 - t0, dim, e->m->hp.rms_eps);
}

/* Attention. An item is (tile, kv head): a tile is a run of consecutive batch
 * entries of one sequence at consecutive positions (a prefill run; a decode token is a tile of
 * one), and the item covers the gqa query heads that share the kv head: nq = tile * gqa query
 * rows, which share every K/V row read.
 *
 * Batch invariance: the arithmetic of one query row depends only on its sequence's K/V and its
 * own position, never on the tile or the step it is computed in (its size, the other
 * sequences, the thread count), so that a sequence's logits are bit-identical however the
 * scheduler batches it. Hence ONE path per engine, chosen from the model and the KV dtype:
 *  - tiled (head size a multiple of 16, or an F32 cache): per 128-position block (K and V
 *    converted to f32 once for all the item's rows), ops_att_block: P = Q K^T with the
 *    queries in SIMD lanes, scale, causal cut, online softmax per row over the block,
 *    acc += P V, all f32. The arithmetic is that of ggml's CPU
 *    flash-attention path for steps of 64+ tokens (prompt processing agrees with llama.cpp
 *    to ~1e-6); its decode steps take ggml's one-query path instead (below), so single-token
 *    steps differ from llama.cpp's by f16 rounding (as llama.cpp differs from itself between
 *    a prompt in one batch and token by token);
 *  - per key (F16 cache and a head size that is not a multiple of 16, where ggml has only
 *    this path): Q rounded to f16, s = f16 dot, online softmax key by key, V accumulated in
 *    an f16 accumulator (rounded after every update), divided by the sum at the end. ggml's
 *    split of the keys over its threads for long single-token steps is not mirrored (it
 *    would make a query's result depend on the step and the thread count). */
/* The first key that the rows of an item (nt positions from pos) see: 0, or for a window
 * layer (whose items are single positions) the start of the window. */
static int engine_att_lo(const engine_job *j, int pos, int nt, const kvpool_seq *seq)
{
    int w = model_layer_window(j->e->m, j->layer);
    return w > 0 ? TM_MAX(kvpool_seq_win_lo(seq), pos + nt - w) : 0;
}

/* Attention sinks (gpt-oss): one more logit per head in the softmax denominator, with no
 * value, applied after the keys as ggml's flash attention does: a sink above the running max
 * rescales the accumulator and the sum. Rows r of kv head kvh are query heads
 * kvh * gqa + r % gqa. */
static void engine_att_sinks(const engine_job *j, int kvh, int nq, float *M, float *S, float *acc)
{
    const float *sinks = j->e->m->layers[j->layer].sinks;
    if (!sinks) return;
    const int gqa = j->e->m->hp.n_heads / j->nkv, hd = j->hd;
    for (int r = 0; r < nq; r++) {
        float s = sinks[kvh * gqa + r % gqa], ms = 1.0f, vs = 1.0f;
        if (s > M[r]) {
            ms = expf(M[r] - s);
            M[r] = s;
            ops_vec_scale_f32(hd, acc + (size_t)r * hd, ms);
        } else {
            vs = expf(s - M[r]);
        }
        S[r] = S[r] * ms + vs;
    }
}

static void engine_att_per_key(engine_job *j, float *sc, int t0, int nt, int kvh)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int hd = j->hd, gqa = hp->n_heads / j->nkv, qd = hp->n_heads * hd;
    const int nq = nt * gqa, nqmax = e->att_tile * gqa;
    const float scale = hp->att_scale;
    const engine_tok *tk0 = &j->b->toks[t0];
    float *acc = sc;                               /* (nq, hd) accumulators, f16 values */
    float *MS = acc + (size_t)nqmax * hd;          /* (nq, 2) running max and sum */
    fp16_t *q16 = (fp16_t *)(MS + 2 * (size_t)nqmax); /* (nq, hd) */
    fp16_t *tmp = q16 + (size_t)nqmax * hd;        /* (hd) */
    for (int r = 0; r < nq; r++) {
        int jt = r / gqa, g = r % gqa;
        ops_fp32_to_fp16_row(e->q + (size_t)(t0 + jt) * qd + (size_t)(kvh * gqa + g) * hd, q16 + (size_t)r * hd, hd);
    }
    int n_ctx = tk0->pos + nt;
    /* no split of the keys over threads (ggml's long single-token steps): the arithmetic of a
     * query depends only on its own position, never on the step it is in */
    for (int r = 0; r < nq; r++) {
        MS[2 * r] = -INFINITY;
        MS[2 * r + 1] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    const bool win = e->wstage && kvpool_layer_block_index(e->kv, j->kv_layer) < 0;
    for (int pk = engine_att_lo(j, tk0->pos, nt, tk0->seq); pk < n_ctx; pk++) {
        const fp16_t *kr, *vr;
        if (win) {
            kr = (const fp16_t *)engine_win_row(e, j->b, j->kv_layer, t0, pk, 0, kvh);
            vr = (const fp16_t *)engine_win_row(e, j->b, j->kv_layer, t0, pk, 1, kvh);
        } else {
            const fp16_t *K = kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->kv_layer, 0, kvh);
            const fp16_t *V = kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->kv_layer, 1, kvh);
            kr = K + (size_t)(pk % KVPOOL_BLOCK) * hd;
            vr = V + (size_t)(pk % KVPOOL_BLOCK) * hd;
        }
        for (int r = 0; r < nq; r++) {
            if (pk > tk0->pos + r / gqa) continue;  /* causal */
            float *a = acc + (size_t)r * hd;
            float s = ops_vec_dot_f16(hd, kr, q16 + (size_t)r * hd) * scale;
            float M = MS[2 * r], ms = 1.0f, vs = 1.0f;
            if (s > M) {
                MS[2 * r] = s;
                ms = expf(M - s);
                ops_vec_scale_f32(hd, a, ms);
                ops_fp32_to_fp16_row(a, tmp, hd);
                ops_fp16_to_fp32_row(tmp, a, hd);
            } else {
                vs = expf(s - M);
            }
            ops_vec_mad_f16(hd, a, vr, vs);
            ops_fp32_to_fp16_row(a, tmp, hd);
            ops_fp16_to_fp32_row(tmp, a, hd);
            MS[2 * r + 1] = MS[2 * r + 1] * ms + vs;
        }
    }
    if (e->m->layers[j->layer].sinks) {
        const float *sinks = e->m->layers[j->layer].sinks;
        for (int r = 0; r < nq; r++) {   /* ggml's one-query path: after the f16 accumulator */
            float s = sinks[kvh * gqa + r % gqa], M = MS[2 * r], ms = 1.0f, vs = 1.0f;
            if (s > M) {
                ms = expf(M - s);
                ops_vec_scale_f32(hd, acc + (size_t)r * hd, ms);
            } else {
                vs = expf(s - M);
            }
            MS[2 * r + 1] = MS[2 * r + 1] * ms + vs;
        }
    }
    for (int r = 0; r < nq; r++) {
        int jt = r / gqa, g = r % gqa;
        float *o = e->att + (size_t)(t0 + jt) * qd + (size_t)(kvh * gqa + g) * hd;
        float S = MS[2 * r + 1], inv = S == 0.0f ? 0.0f : 1.0f / S;
        const float *a = acc + (size_t)r * hd;
        for (int d = 0; d < hd; d++) o[d] = a[d] * inv;
    }
}

/* A quantised cache (ggml's one-query path for non-F16 K/V): each query row quantised to
 * Q8_0, s = integer dot with the key row (ops_vec_dot_kv), online softmax key by key, the
 * value row dequantised and accumulated in f32 (acc = acc * ms + vs * v), sinks after the
 * keys, divided by the sum at the end. A row's arithmetic depends only on its own query and
 * keys: batch invariant like the other paths. */
static void engine_att_per_key_q(engine_job *j, float *sc, int t0, int nt, int kvh)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int hd = j->hd, gqa = hp->n_heads / j->nkv, qd = hp->n_heads * hd;
    const int nq = nt * gqa, nqmax = e->att_tile * gqa;
    const qtype dt = kvpool_dtype(e->kv);
    const size_t row = quant_row_bytes(dt, hd), qrow = quant_row_bytes(QTYPE_Q8_0, hd);
    const engine_tok *tk0 = &j->b->toks[t0];
    float *acc = sc;                               /* (nq, hd) accumulators */
    float *M = acc + (size_t)nqmax * hd;           /* (nq) running max */
    float *S = M + nqmax;                          /* (nq) running sum */
    float *vf = S + nqmax;                         /* (hd) the value row in f32 */
    uint8_t *q8 = (uint8_t *)(vf + hd);            /* (nq) query rows in Q8_0 */
    for (int r = 0; r < nq; r++) {
        quant_act_q8_0(e->q + (size_t)(t0 + r / gqa) * qd + (size_t)(kvh * gqa + r % gqa) * hd,
                       (block_q8_0 *)(q8 + (size_t)r * qrow), hd);
        M[r] = -INFINITY;
        S[r] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    const int n_ctx = tk0->pos + nt;
    const bool win = e->wstage && kvpool_layer_block_index(e->kv, j->kv_layer) < 0;
    for (int pk = engine_att_lo(j, tk0->pos, nt, tk0->seq); pk < n_ctx; pk++) {
        const uint8_t *kr, *vr;
        if (win) {
            kr = engine_win_row(e, j->b, j->kv_layer, t0, pk, 0, kvh);
            vr = engine_win_row(e, j->b, j->kv_layer, t0, pk, 1, kvh);
        } else {
            kr = (const uint8_t *)kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->kv_layer, 0, kvh) +
                 (size_t)(pk % KVPOOL_BLOCK) * row;
            vr = (const uint8_t *)kvpool_seq_slab(e->kv, tk0->seq, pk / KVPOOL_BLOCK, j->kv_layer, 1, kvh) +
                 (size_t)(pk % KVPOOL_BLOCK) * row;
        }
        bool have_v = false;
        for (int r = 0; r < nq; r++) {
            if (pk > tk0->pos + r / gqa) continue;   /* causal */
            float s = ops_vec_dot_kv(dt, hd, kr, (const block_q8_0 *)(q8 + (size_t)r * qrow)) * hp->att_scale;
            float *a = acc + (size_t)r * hd, ms = 1.0f, vs = 1.0f;
            if (s > M[r]) {
                ms = expf(M[r] - s);
                M[r] = s;
                ops_vec_scale_f32(hd, a, ms);
            } else {
                vs = expf(s - M[r]);
            }
            if (!have_v) {
                quant_dequantize_row(dt, vr, vf, hd);
                have_v = true;
            }
            ops_vec_mad_f32(hd, a, vf, vs);
            S[r] = S[r] * ms + vs;
        }
    }
    engine_att_sinks(j, kvh, nq, M, S, acc);
    for (int r = 0; r < nq; r++) {
        float *o = e->att + (size_t)(t0 + r / gqa) * qd + (size_t)(kvh * gqa + r % gqa) * hd;
        float inv = S[r] == 0.0f ? 0.0f : 1.0f / S[r];
        const float *ar = acc + (size_t)r * hd;
        for (int d = 0; d < hd; d++) o[d] = ar[d] * inv;
        if (j->rot_v) ops_hadamard_rows(o, hd / j->rot_v, j->rot_v);   /* back from V's rotation */
    }
}

_Static_assert(KVPOOL_BLOCK <= OPS_ATT_KT_KEYS, "a pool block fits the attention kernels' kt scratch");

static void engine_att_tiled(engine_job *j, float *sc, int t0, int nt, int kvh)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int hd = j->hd, gqa = hp->n_heads / j->nkv, qd = hp->n_heads * hd;
    const int nq = nt * gqa, nqp = TM_ALIGN_UP(nq, 16);
    const bool f16 = kvpool_dtype(e->kv) == QTYPE_F16;
    const engine_tok *tk0 = &j->b->toks[t0];
    float *Kf = sc;                                   /* (128, hd) K block in f32 */
    float *Vf = Kf + (size_t)KVPOOL_BLOCK * hd;       /* (128, hd) V block in f32 */
    float *qt = Vf + (size_t)KVPOOL_BLOCK * hd;       /* (hd, nqp) queries, transposed */
    float *acc = qt + (size_t)hd * nqp;               /* (nq, hd) running P V */
    float *st = acc + (size_t)nqp * hd;               /* (128, nqp) scores, probabilities */
    float *M = st + (size_t)KVPOOL_BLOCK * nqp;       /* (nq) running max */
    float *S = M + nqp;                               /* (nq) running sum */
    int32_t *lim = (int32_t *)(S + nqp);              /* (nq) keys of the block each row sees */
    float *kt = (float *)(lim + nqp);                 /* (hd, 128) K block transposed (kernel's) */
    /* qt row by row (contiguous stores; the query rows are read across, from L2) */
    const float *qrow[TM_MAX(ENGINE_ATT_ROWS, ENGINE_ATT_GQA_MAX)];   /* nq <= max(256, gqa) */
    for (int r = 0; r < nq; r++) qrow[r] = e->q + (size_t)(t0 + r / gqa) * qd + (size_t)(kvh * gqa + r % gqa) * hd;
    for (int d = 0; d < hd; d++) {
        float *row = qt + (size_t)d * nqp;
        for (int r = 0; r < nq; r++) row[r] = qrow[r][d];
        for (int r = nq; r < nqp; r++) row[r] = 0.0f;  /* pad lanes */
    }
    for (int r = 0; r < nq; r++) {
        M[r] = -INFINITY;
        S[r] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    int n_ctx = tk0->pos + nt;  /* positions the last row sees */
    /* a window layer's item is one position (engine_job_attention): its first key lo, and each
     * block's keys from there on (skipped keys would only add exact zeros) */
    const int lo = engine_att_lo(j, tk0->pos, nt, tk0->seq);
    const bool win = e->wstage && kvpool_layer_block_index(e->kv, j->kv_layer) < 0;
    ops_att_block_args a = { .hd = hd, .nq = nq, .nqp = nqp, .scale = hp->att_scale, .qt = qt,
                             .lim = lim, .st = st, .m = M, .s = S, .acc = acc, .kt = kt };
    for (int bi = lo / KVPOOL_BLOCK; bi * KVPOOL_BLOCK < n_ctx; bi++) {
        int k0 = TM_MAX(0, lo - bi * KVPOOL_BLOCK), nb = TM_MIN(KVPOOL_BLOCK, n_ctx - bi * KVPOOL_BLOCK) - k0;
        if (win) {   /* the same keys and blocks as if in the pool, gathered from staging and ring */
            for (int r = 0; r < nb; r++) {
                int pk = bi * KVPOOL_BLOCK + k0 + r;
                const void *kr = engine_win_row(e, j->b, j->kv_layer, t0, pk, 0, kvh);
                const void *vr = engine_win_row(e, j->b, j->kv_layer, t0, pk, 1, kvh);
                if (f16) {
                    ops_fp16_to_fp32_row(kr, Kf + (size_t)r * hd, hd);
                    ops_fp16_to_fp32_row(vr, Vf + (size_t)r * hd, hd);
                } else {
                    memcpy(Kf + (size_t)r * hd, kr, (size_t)hd * sizeof(float));
                    memcpy(Vf + (size_t)r * hd, vr, (size_t)hd * sizeof(float));
                }
            }
            a.k = Kf;
            a.v = Vf;
            a.nb = nb;
            for (int r = 0; r < nq; r++)
                lim[r] = TM_MAX(0, TM_MIN(nb, tk0->pos + r / gqa + 1 - bi * KVPOOL_BLOCK - k0));
            ops_att_block(&a);
            continue;
        }
        const void *K = kvpool_seq_slab(e->kv, tk0->seq, bi, j->kv_layer, 0, kvh);
        const void *V = kvpool_seq_slab(e->kv, tk0->seq, bi, j->kv_layer, 1, kvh);
        size_t esz = f16 ? sizeof(fp16_t) : sizeof(float);
        K = (const char *)K + (size_t)k0 * hd * esz;
        V = (const char *)V + (size_t)k0 * hd * esz;
        a.k = K;
        a.v = V;
        if (f16) {
            ops_fp16_to_fp32_row(K, Kf, (int64_t)nb * hd);
            if (V != K) ops_fp16_to_fp32_row(V, Vf, (int64_t)nb * hd);   /* a latent pool: V is K */
            a.k = Kf;
            a.v = V != K ? Vf : Kf;
        }
        a.nb = nb;
        for (int r = 0; r < nq; r++)
            lim[r] = TM_MAX(0, TM_MIN(nb, tk0->pos + r / gqa + 1 - bi * KVPOOL_BLOCK - k0));
        ops_att_block(&a);
    }
    engine_att_sinks(j, kvh, nq, M, S, acc);
    for (int r = 0; r < nq; r++) {
        int jt = r / gqa, g = r % gqa;
        float *o = e->att + (size_t)(t0 + jt) * qd + (size_t)(kvh * gqa + g) * hd;
        float inv = S[r] > 0 ? 1.0f / S[r] : 0.0f;
        const float *ar = acc + (size_t)r * hd;
        for (int d = 0; d < hd; d++) o[d] = ar[d] * inv;
    }
}

/* The end of the run of batch entries from t: one sequence at consecutive positions. */
int engine_run_end(const engine_batch *b, int t)
{
    int r = t + 1;
    while (r < b->n_tokens && b->toks[r].seq == b->toks[t].seq && b->toks[r].pos == b->toks[r - 1].pos + 1) r++;
    return r;
}

/* Cuts the batch into attention tiles (e->tile_start): each run of one sequence at
 * consecutive positions into equal pieces of at most `tile` positions, tile = att_tile halved
 * (down to ENGINE_ATT_TILE_MIN) while the step would have fewer than two items per thread. */
static void engine_plan_tiles(engine *e, const engine_batch *b)
{
    const int T = b->n_tokens, nkv = e->m->hp.n_kv_heads;
    int tile = e->att_tile;
    for (;;) {
        int items = 0;
        for (int t = 0; t < T;) {
            int r = engine_run_end(b, t);
            items += (r - t + tile - 1) / tile * nkv;
            t = r;
        }
        if (items >= 2 * e->n_threads || tile <= ENGINE_ATT_TILE_MIN) break;
        tile = TM_MAX(ENGINE_ATT_TILE_MIN, tile / 2);
    }
    e->n_tiles = 0;
    for (int t = 0; t < T;) {
        int r = engine_run_end(b, t);
        int pieces = (r - t + tile - 1) / tile, len = r - t;
        for (int k = 0; k < pieces; k++) e->tile_start[e->n_tiles++] = t + (int)((int64_t)len * k / pieces);
        t = r;
    }
    e->tile_start[e->n_tiles] = T;
}

static void engine_job_attention(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int nkv = j->nkv;
    float *sc = e->att_scratch + (size_t)ith * e->att_stride;
    (void)nth;
    for (;;) {
        int it = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (it >= j->n_items) break;
        int tile = it / nkv, kvh = it % nkv;
        /* a window layer's items are single positions (each has its own first key) */
        int t0 = j->win ? tile : e->tile_start[tile], nt = j->win ? 1 : e->tile_start[tile + 1] - t0;
        if (j->q8) engine_att_per_key_q(j, sc, t0, nt, kvh);
        else if (j->q16) engine_att_per_key(j, sc, t0, nt, kvh);
        else engine_att_tiled(j, sc, t0, nt, kvh);
    }
}

/* ---- mixture of experts -----------------------------------------------------------------
 * A MoE FFN in four stages: the router matmul for the whole step, routing token by token
 * (moe.h: llama.cpp's softmax, argsort and renormalisation), the (token, slot) pairs grouped
 * by expert (counting sort: ascending expert, then batch order) with their inputs gathered
 * into xg, then per active expert one gate/up matmul over its rows, SwiGLU and the down
 * matmul into ye (its weights are read once per step, only for the experts some token
 * chose), and the sum per token of weight * output in slot order (llama.cpp's order: e0*w0,
 * then + e1*w1, ...). Every output row depends only on its own token's input: the matmuls
 * compute a row's dots alike whatever the rows beside it, so batch and thread-count
 * invariance hold as for the dense FFN. */
static void engine_job_route(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const int T = j->b->n_tokens, E = hp->n_expert, k = hp->n_expert_used;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth);
    float *fs = e->r_probs + (size_t)ith * MOE_SCRATCH(E);
    int32_t *is = e->r_idx + (size_t)ith * MOE_SCRATCH(E);
    const float *bias = e->m->layers[j->layer].exp_probs_b, *lb = e->m->layers[j->layer].gate_inp_b;
    if (lb)   /* the router's own bias on its logits (gpt-oss) */
        for (int t = t0; t < t1; t++) ops_add(NULL, e->r_logits + (size_t)t * E, lb, E);
    for (int t = t0; t < t1; t++) {
        float mg = moe_route(&e->router, e->r_logits + (size_t)t * E, bias, fs, is, e->r_sel + (size_t)t * k,
                             e->r_w + (size_t)t * k);
        if (mg < e->r_margin[t]) e->r_margin[t] = mg;
    }
}

/* x_off, x_row, x_tok and the active experts x_act from r_sel (the caller's thread; T * k
 * entries). */
static void engine_moe_group(engine *e, int T)
{
    const int E = e->m->hp.n_expert, k = e->m->hp.n_expert_used, n = T * k;
    int32_t *off = e->x_off, *cur = e->r_idx;   /* cur: E cursors (r_idx is free here) */
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < n; i++) off[e->r_sel[i] + 1]++;
    for (int x = 0; x < E; x++) off[x + 1] += off[x];
    memcpy(cur, off, (size_t)E * sizeof *cur);
    for (int i = 0; i < n; i++) {
        int row = cur[e->r_sel[i]]++;
        e->x_row[i] = row;
        e->x_tok[row] = i / k;
    }
    e->n_act = 0;
    for (int x = 0; x < E; x++)
        if (off[x + 1] > off[x]) e->x_act[e->n_act++] = x;
}

static void engine_job_moe_gather(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int dim = e->m->hp.dim, n = j->b->n_tokens * e->m->hp.n_expert_used;
    const int r0 = (int)((int64_t)n * ith / nth), r1 = (int)((int64_t)n * (ith + 1) / nth);
    for (int r = r0; r < r1; r++)
        memcpy(e->xg + (size_t)r * dim, e->xn + (size_t)e->x_tok[r] * dim, (size_t)dim * sizeof(float));
}

/* GCC in GNU mode fuses a product and a later add into an FMA even across statements; clang
 * fuses only within one expression (its default -ffp-contract=on), and knows no optimize
 * attribute. */
#if defined(__clang__)
#define ENGINE_NO_FP_CONTRACT
#else
#define ENGINE_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* xn[t] = sum over slots s of w[t][s] * ye[row(t, s)], each product rounded before the add
 * (ggml_mul then ggml_add): no contraction into FMAs; then + shx[t], the shared experts'
 * output, in a layer that has them. */
ENGINE_NO_FP_CONTRACT
static void engine_job_moe_sum(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const int T = j->b->n_tokens, dim = e->m->hp.dim, k = e->m->hp.n_expert_used;
    const int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth);
    const float *sh = e->m->layers[j->layer].gate_shexp.data ? e->shx : NULL;
    const float *sg = e->m->layers[j->layer].gate_inp_shexp ? engine_qwen35_shgate(e->q35) : NULL;
    for (int t = t0; t < t1; t++) {
        float *o = e->xn + (size_t)t * dim;
        const float *y = e->ye + (size_t)e->x_row[(size_t)t * k] * dim;
        float w = e->r_w[(size_t)t * k];
        for (int d = 0; d < dim; d++) o[d] = y[d] * w;
        for (int s = 1; s < k; s++) {
            y = e->ye + (size_t)e->x_row[(size_t)t * k + s] * dim;
            w = e->r_w[(size_t)t * k + s];
            for (int d = 0; d < dim; d++) {
                float p = y[d] * w;
                o[d] = o[d] + p;
            }
        }
        if (sh && sg) {   /* qwen35moe: the shared expert times its gate, rounded, then added */
            for (int d = 0; d < dim; d++) {
                float p = sh[(size_t)t * dim + d] * sg[t];
                o[d] = o[d] + p;
            }
        } else if (sh) {   /* routed + shared, the add ops_add did */
            for (int d = 0; d < dim; d++) o[d] = o[d] + sh[(size_t)t * dim + d];
        }
    }
}

/* The experts' round of layer il (engine_moe_round_run) over the rows grouped in x_off/x_act/xg,
 * into fe and ye; shexp: the shared experts' FFN too (xn through ffa into shx). */
static void engine_moe_round_fill(engine *e, engine_moe_round *r, int il, int T, bool shexp)
{
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[il];
    const engine_moe_act act = hp->swiglu_limit > 0 ? ENGINE_MOE_ACT_SWIGLU_OAI
                               : hp->ffn_gelu       ? ENGINE_MOE_ACT_GEGLU
                                                    : ENGINE_MOE_ACT_SWIGLU;
    *r = (engine_moe_round){
        .tp = e->tp, .n_expert = hp->n_expert, .ef = hp->expert_ffn, .dim = hp->dim,
        .gate = &L->gate_exps, .up = &L->up_exps, .down = &L->down_exps, .gate_up = L->exps_gate_up,
        .gate_b = L->gate_exps_b, .up_b = L->up_exps_b, .down_b = L->down_exps_b, .down_s = L->down_exps_s,
        .act = act, .lim = hp->swiglu_limit,
        .x_act = e->x_act, .n_act = e->n_act, .x_off = e->x_off, .xg = e->xg, .fe = e->fe, .ye = e->ye,
        .sh_gate = shexp ? &L->gate_shexp : NULL, .sh_up = &L->up_shexp, .sh_down = &L->down_shexp,
        .sh_act = ENGINE_MOE_ACT_SWIGLU, .T = T, .xs = e->xn, .fs = e->ffa, .ys = e->shx,
        .tmp = e->moe_tmp, .tmp_stride = e->moe_tmp_stride, .tmp_rows = (size_t)e->max_tokens * ENGINE_MOE_ROWS,
    };
}

void engine_moe_ffn(engine *e, engine_job *job, int il, int T, const float *rin)
{
    const model_layer *L = &e->m->layers[il];
    threadpool *tp = e->tp;
    if (L->gate_inp_shexp) engine_qwen35_shgate_compute(e->q35, il, e->xn, T);   /* before xn is overwritten */
    const bool shexp = L->gate_shexp.data && T <= ENGINE_MOE_SHARED_T;
    if (L->gate_shexp.data && !shexp) {   /* shared experts: a dense FFN on the same input */
        const ops_weight *gu[2] = { &L->gate_shexp, &L->up_shexp };
        float *gu_out[2] = { e->ffa, e->ffb };
        ops_matmul_multi(tp, 2, gu, e->xn, T, gu_out, e->mm_scratch);
        ops_swiglu(tp, e->ffa, e->ffa, e->ffb, T, (int)L->gate_shexp.rows);
        ops_matmul(tp, &L->down_shexp, e->ffa, T, e->shx, e->mm_scratch);
    }
    ops_matmul(tp, &L->gate_inp, rin ? rin : e->xn, T, e->r_logits, e->mm_scratch);
    engine_run_rows(e, engine_job_route, job, (int64_t)T * e->m->hp.n_expert);   /* a decode step's: inline */
    engine_moe_group(e, T);
    engine_moe_stats_layer(e->stats, il, e->x_off);
    threadpool_run(tp, engine_job_moe_gather, job);
    if (e->ep) e->n_act = e->ep->dispatch(e->ep->ctx, il, e->x_act, e->n_act, e->x_off, e->xg);
    engine_moe_round r;
    engine_moe_round_fill(e, &r, il, T, shexp);
    engine_moe_round_run(&r);
    if (e->ep && (e->n_act = e->ep->combine(e->ep->ctx, il, e->ye, e->x_act)) > 0) {
        engine_moe_round_fill(e, &r, il, T, false);   /* the shared experts: done in the first round */
        engine_moe_round_run(&r);
    }
    threadpool_run(tp, engine_job_moe_sum, job);
}

engine_status engine_moe_experts_run(engine *e, int il, int n_exp, const int32_t *experts, const int32_t *n_rows,
                                     const float *x, float *y)
{
    const model_hparams *hp = &e->m->hp;
    if (!e->x_off || il < 0 || il >= hp->n_layers || !e->m->layers[il].gate_exps.data || n_exp < 0 ||
        n_exp > hp->n_expert)
        return ENGINE_ERR_ARG;
    const int E = hp->n_expert, dim = hp->dim;
    int64_t n = 0;
    memset(e->x_off, 0, (size_t)(E + 1) * sizeof *e->x_off);
    for (int i = 0; i < n_exp; i++) {
        /* a step routes an expert at most one row per token: the round's chunk buffers hold no more */
        if (experts[i] < 0 || experts[i] >= E || (i > 0 && experts[i] <= experts[i - 1]) || n_rows[i] <= 0 ||
            n_rows[i] > e->max_tokens)
            return ENGINE_ERR_ARG;
        n += n_rows[i];
        e->x_off[experts[i] + 1] = n_rows[i];
    }
    if (n > (int64_t)e->max_tokens * hp->n_expert_used) return ENGINE_ERR_ARG;
    for (int i = 0; i < E; i++) e->x_off[i + 1] += e->x_off[i];
    memcpy(e->x_act, experts, (size_t)n_exp * sizeof *experts);
    e->n_act = n_exp;
    memcpy(e->xg, x, (size_t)n * dim * sizeof(float));
    engine_moe_round r;
    engine_moe_round_fill(e, &r, il, 1, false);   /* the shared experts are not in this round */
    engine_moe_round_run(&r);
    memcpy(y, e->ye, (size_t)n * dim * sizeof(float));
    return ENGINE_OK;
}

/* ---- multi-head latent attention ------------------------------------------------------
 * llama.cpp's MLA with the up-projections absorbed (deepseek2 with split attn_k_b/attn_v_b):
 * the latent c = norm(kv_a[:kv_lora]) and the roped key part k_pe = rope(kv_a[kv_lora:]) are
 * one kv head of kv_lora + rope values, stored once (a "V is K" pool: attention reads the
 * first kv_lora values of the key row as the value); each query head is (q_nope @ k_b[h], rope(q_pe))
 * so that Q K^T equals the decompressed scores; the attention output of a head (kv_lora) goes
 * through v_b[h] to v_dim values, then attn_output. */

/* After the projections, rows [t0, t1): norm the latent, rope the key part and each head's
 * query part (copied into q's RoPE slot), and store the row in the pool (as K; V is K). */
static void engine_mla_post_rows(engine_job *j, int t0, int t1)
{
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[j->layer];
    const int H = hp->n_heads, hd = hp->head_dim, lr = hp->kv_lora, kq = hp->nope_dim + hp->n_rot;
    for (int t = t0; t < t1; t++) {
        float *k = e->k + (size_t)t * hd, *qr = e->qraw + (size_t)t * H * kq;
        ops_rmsnorm(NULL, k, k, L->kv_a_norm, 1, lr, hp->rms_eps);
        ops_rope_ggml(NULL, k + lr, e->pos + t, 1, 1, hp->n_rot, hp->n_rot, hp->rope_neox, hp->rope_theta_scale,
                      hp->rope_freq_scale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
        /* head h's RoPE part starts at nope_dim within its kq values */
        ops_rope_ggml(NULL, qr + hp->nope_dim, e->pos + t, 1, H, kq, hp->n_rot, hp->rope_neox, hp->rope_theta_scale,
                      hp->rope_freq_scale, hp->rope_freq_factors, hp->rope_attn_factor, hp->rope_yarn[0] != 0 ? hp->rope_yarn : NULL);
        for (int h = 0; h < H; h++)
            memcpy(e->q + ((size_t)t * H + h) * hd + lr, qr + (size_t)h * kq + hp->nope_dim, (size_t)hp->n_rot * sizeof(float));
        const engine_tok *tk = &j->b->toks[t];
        kvpool_seq_store(e->kv, tk->seq, tk->pos, j->layer, 0, k, k);
    }
}

/* Per head (items from a shared counter): gather the head's rows, one matmul with its slice
 * of a per-head tensor, scatter the results. j->mla_v false: q_nope (qraw) through k_b into
 * q's latent slot, after the thread's share of engine_mla_post_rows (which reads and writes
 * only what the heads do not: the latent row, the RoPE parts, the pool), so that the query
 * side of a layer is one pool round after its projections; true: the attention output's
 * latent part (att) through v_b into att_v. */
static void engine_job_mla_heads(void *ctx, int ith, int nth)
{
    engine_job *j = ctx;
    engine *e = j->e;
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[j->layer];
    const int T = j->b->n_tokens, H = hp->n_heads, hd = hp->head_dim, lr = hp->kv_lora, kq = hp->nope_dim + hp->n_rot;
    const bool out_v = j->mla_v;
    const int n_in = out_v ? lr : hp->nope_dim, n_out = out_v ? hp->v_dim : lr;
    const size_t in_stride = out_v ? (size_t)H * hd : (size_t)H * kq, in_head = out_v ? (size_t)hd : (size_t)kq;
    const size_t out_stride = out_v ? (size_t)H * hp->v_dim : (size_t)H * hd, out_head = out_v ? (size_t)hp->v_dim : (size_t)hd;
    const float *in = out_v ? e->att : e->qraw;
    float *out = out_v ? e->att_v : e->q;
    float *xin = e->mla_tmp + (size_t)ith * e->mla_tmp_stride;
    float *yout = xin + (size_t)e->max_tokens * TM_MAX(hp->nope_dim, lr);
    void *scratch = yout + (size_t)e->max_tokens * TM_MAX(lr, hp->v_dim);
    if (!out_v) engine_mla_post_rows(j, (int)((int64_t)T * ith / nth), (int)((int64_t)T * (ith + 1) / nth));
    for (;;) {
        int h = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (h >= H) break;
        ops_weight w = model_expert(out_v ? &L->wv_b : &L->wk_b, H, h);
        for (int t = 0; t < T; t++)
            memcpy(xin + (size_t)t * n_in, in + t * in_stride + h * in_head, (size_t)n_in * sizeof(float));
        ops_matmul(NULL, &w, xin, T, yout, scratch);
        for (int t = 0; t < T; t++)
            memcpy(out + t * out_stride + h * out_head, yout + (size_t)t * n_out, (size_t)n_out * sizeof(float));
    }
}

/* Q (T, H * head_dim) and the pool rows of layer il from xn. */
static void engine_mla_qkv(engine *e, engine_job *job, int il, int T)
{
    const model_hparams *hp = &e->m->hp;
    const model_layer *L = &e->m->layers[il];
    threadpool *tp = e->tp;
    if (L->wq_a.data) {
        const ops_weight *ws[2] = { &L->wq_a, &L->wkv_a };
        float *ys[2] = { e->qa, e->k };
        ops_matmul_multi(tp, 2, ws, e->xn, T, ys, e->mm_scratch);
        ops_rmsnorm(tp, e->qa, e->qa, L->q_a_norm, T, hp->q_lora, hp->rms_eps);
        ops_matmul(tp, &L->wq_b, e->qa, T, e->qraw, e->mm_scratch);
    } else {
        const ops_weight *ws[2] = { &L->wq, &L->wkv_a };
        float *ys[2] = { e->qraw, e->k };
        ops_matmul_multi(tp, 2, ws, e->xn, T, ys, e->mm_scratch);
    }
    job->next = 0, job->mla_v = false;
    threadpool_run(tp, engine_job_mla_heads, job);
}

/* The attention output (att) through v_b and attn_output into xn. */
static void engine_mla_out(engine *e, engine_job *job, int il, int T)
{
    job->next = 0, job->mla_v = true;
    threadpool_run(e->tp, engine_job_mla_heads, job);
    ops_matmul(e->tp, &e->m->layers[il].wo, e->att_v, T, e->xn, e->mm_scratch);
}

/* An MTP view's layer input (engine.h), in place of the embeddings in x: x = eh_proj([enorm
 * of the embedding; hnorm of the hidden state]). */
static void engine_mtp_input(engine *e, const engine_batch *b, const float *hidden)
{
    const model_layer *L = &e->m->layers[0];
    const int T = b->n_tokens, dim = e->m->hp.dim;
    const float eps = e->m->hp.rms_eps;
    ops_rmsnorm(e->tp, e->xn, e->x, L->enorm, T, dim, eps);
    for (int t = 0; t < T; t++)
        memcpy(e->mtp_cat + (size_t)t * 2 * dim, e->xn + (size_t)t * dim, (size_t)dim * sizeof(float));
    ops_rmsnorm(e->tp, e->xn, hidden, L->hnorm, T, dim, eps);
    for (int t = 0; t < T; t++)
        memcpy(e->mtp_cat + (size_t)t * 2 * dim + dim, e->xn + (size_t)t * dim, (size_t)dim * sizeof(float));
    ops_matmul(e->tp, &L->eh_proj, e->mtp_cat, T, e->x, e->mm_scratch);
}

engine_status engine_step(engine *e, const engine_batch *b, float *logits)
{
    return engine_forward(e, b, NULL, logits);
}

/* Layer il's input rows into their slot of cap (engine_capture_layers). */
static void engine_capture(engine *e, int il, int T)
{
    const int dim = e->m->hp.dim, k = e->cap_slot[il];
    const size_t row = (size_t)e->n_cap * dim;
    for (int t = 0; t < T; t++)
        memcpy(e->cap + (size_t)t * row + (size_t)k * dim, e->x + (size_t)t * dim, (size_t)dim * sizeof(float));
}

/* A profiled step starts (engine_profile): its clock, the pool's counters. */
static void engine_prof_begin(engine *e)
{
    if (!e->prof_on) return;
    e->prof_steps++;
    e->prof_t = util_now();
    e->prof_quant = 0;
    threadpool_stats_get(e->tp, &e->prof_tp);
    ops_profile_attach(&e->prof_quant);
}

engine_status engine_forward(engine *e, const engine_batch *b, const float *hidden, float *logits)
{
    const model *m = e->m;
    const model_hparams *hp = &m->hp;
    int T = b->n_tokens;
    if (T <= 0 || T > e->max_tokens) return ENGINE_ERR_ARG;
    int n_out = 0;
    for (int t = 0; t < T; t++) {
        const engine_tok *tk = &b->toks[t];
        if (tk->token < 0 || tk->token >= hp->n_vocab || tk->pos < 0 || !tk->seq ||
            tk->pos >= (1 << 30))
            return ENGINE_ERR_ARG;
        n_out += tk->want_logits;
    }
    if ((n_out > 0 && !logits) || m->mtp_view != (hidden != NULL)) return ENGINE_ERR_ARG;
    for (int t = 0; t < T; t++) {
        const engine_tok *tk = &b->toks[t];
        if (kvpool_seq_reserve(e->kv, tk->seq, tk->pos + 1) != KVPOOL_OK) return ENGINE_ERR_KV_FULL;
    }

    if (e->dsv4) {
        engine_prof_begin(e);
        bool ok = e->dsv4_mtp ? engine_dsv4_mtp_step(e->dsv4_mtp, T, b->toks, hidden, logits, e->x)
                              : engine_dsv4_step(e->dsv4, T, b->toks, logits, e->x);
        if (e->prof_on) ops_profile_attach(NULL);
        return ok ? ENGINE_OK : ENGINE_ERR_ARG;
    }
    if (e->bert) return engine_bert_step(e->bert, T, b->toks, e->x) ? ENGINE_OK : ENGINE_ERR_ARG;
    if (e->wstage && !engine_window_plan(e, b)) return ENGINE_ERR_ARG;
    if (e->q35 && !engine_qwen35_plan(e->q35, e->kv, b)) return ENGINE_ERR_ARG;
    engine_plan_tiles(e, b);
    if (e->r_margin)
        for (int t = 0; t < T; t++) e->r_margin[t] = INFINITY;
    const int il_out = hp->n_layers;   /* the profile's row of the stages outside the layers */
    engine_prof_begin(e);

    threadpool *tp = e->tp;
    const int dim = hp->dim;
    const float eps = hp->rms_eps;
    for (int t = 0; t < T; t++) {
        model_embed_row(m, b->toks[t].token, e->x + (size_t)t * dim);
        if (hp->embd_scale != 0.0f) ops_vec_scale_f32(dim, e->x + (size_t)t * dim, hp->embd_scale);   /* gemma3 */
        e->pos[t] = b->toks[t].pos;
    }
    engine_job job = { .e = e, .b = b };
    if (m->mtp_view) engine_mtp_input(e, b, hidden);
    if (hp->n_pl) engine_gemma4_pl_inputs(e, b, T);
    ops_rmsnorm(tp, e->xn, e->x, m->layers[0].attn_norm, T, dim, eps);
    engine_prof_mark(e, il_out, ENGINE_PROF_EMBED);
    for (int il = 0; il < hp->n_layers; il++) {
        const model_layer *L = &m->layers[il];
        job.layer = il;
        job.kv_layer = L->kv_shared ? L->kv_src : il;
        /* the layer's geometry: gemma4's own (a shared layer's is its source's), else the model's */
        job.hd = L->l_head_dim ? L->l_head_dim : hp->head_dim;
        job.nkv = L->l_head_dim ? L->l_kv_heads : hp->n_kv_heads;
        job.rot_k = e->rot_k && L->l_head_dim ? ops_hadamard_order(job.hd) : e->rot_k;
        job.rot_v = job.rot_k ? e->rot_v : 0;   /* V is rotated (and the output back) only with K */
        if (e->cap && e->cap_slot[il] >= 0) engine_capture(e, il, T);
        if (L->ssm_out.data) {   /* Qwen3.5's linear attention: xn in, its output in xn */
            engine_qwen35_linear(e->q35, tp, il, e->xn, e->mm_scratch);
            engine_prof_mark(e, il, ENGINE_PROF_ATTENTION);
            goto add_attention;
        }
        if (hp->mla) {
            engine_mla_qkv(e, &job, il, T);
            engine_prof_mark(e, il, ENGINE_PROF_QKV);
        } else {
            const ops_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
            float *qkv_out[3] = { L->attn_gated ? engine_qwen35_qg(e->q35) : e->q, e->k, e->v };
            /* gemma4: V may be K; a shared KV layer projects only its queries */
            ops_matmul_multi(tp, L->kv_shared ? 1 : L->l_head_dim && !L->wv.data ? 2 : 3, qkv, e->xn, T, qkv_out,
                             e->mm_scratch);
            if (L->attn_gated) engine_qwen35_split(e->q35, T, e->q);
            engine_prof_mark(e, il, ENGINE_PROF_QKV);
            engine_run_rows(e, engine_job_qkv_post, &job, (int64_t)T * (hp->n_heads + 2 * job.nkv) * job.hd);
            engine_prof_mark(e, il, ENGINE_PROF_QKV_POST);
        }
        job.win = model_layer_window(m, il) > 0;
        job.n_items = (job.win ? T : e->n_tiles) * job.nkv;
        job.next = 0;
        job.q16 = kvpool_dtype(e->kv) == QTYPE_F16 && job.hd % 16 != 0;
        job.q8 = kvpool_dtype(e->kv) == QTYPE_Q8_0 || kvpool_dtype(e->kv) == QTYPE_Q4_0;
        int bl = kvpool_layer_block_index(e->kv, job.kv_layer);
        if (bl >= 0) kvpool_fill_wait(e->kv, bl);   /* layer il of blocks still loading from the store */
        threadpool_run(tp, engine_job_attention, &job);
        /* the window layer that shared KV layers read keeps its staged rows until they have */
        if (bl < 0 && !L->kv_shared && il != e->win_src) engine_window_commit(e, b, il);
        if (L->attn_gated) engine_qwen35_gate(e->q35, T, e->att);
        engine_prof_mark(e, il, ENGINE_PROF_ATTENTION);
        if (hp->mla) engine_mla_out(e, &job, il, T);
        else ops_matmul(tp, &L->wo, e->att, T, e->xn, e->mm_scratch);
        if (L->attn_post_norm) ops_rmsnorm(tp, e->xn, e->xn, L->attn_post_norm, T, dim, eps);   /* gemma3 */
        engine_prof_mark(e, il, ENGINE_PROF_WO);
    add_attention:
        job.norm = L->ffn_norm;
        job.bias = L->bo;
        engine_run_rows(e, engine_job_add_norm, &job, (int64_t)T * dim);   /* x += attention; xn = ffn input */
        job.bias = NULL;
        engine_prof_mark(e, il, ENGINE_PROF_ADD_NORM);
        if (L->ffn_pre_norm_2) {   /* gemma4: the shared MLP and the experts */
            engine_gemma4_moe(e, &job, il, T);
            if (L->ffn_post_norm) ops_rmsnorm(tp, e->xn, e->xn, L->ffn_post_norm, T, dim, eps);
            engine_prof_mark(e, il, ENGINE_PROF_MOE);
        } else if (L->gate_inp.data) {
            engine_moe_ffn(e, &job, il, T, NULL);
            engine_prof_mark(e, il, ENGINE_PROF_MOE);
        } else {
            const ops_weight *gu[2] = { &L->gate, &L->up };
            float *gu_out[2] = { e->ffa, e->ffb };
            ops_matmul_multi(tp, 2, gu, e->xn, T, gu_out, e->mm_scratch);
            engine_prof_mark(e, il, ENGINE_PROF_FFN_UP);
            const int ff = L->l_ffn_dim ? L->l_ffn_dim : hp->ffn_dim;   /* gemma4's may be its own */
            if (hp->ffn_gelu) ops_geglu(tp, e->ffa, e->ffa, e->ffb, T, ff);
            else ops_swiglu(tp, e->ffa, e->ffa, e->ffb, T, ff);
            engine_prof_mark(e, il, ENGINE_PROF_SWIGLU);
            ops_matmul(tp, &L->down, e->ffa, T, e->xn, e->mm_scratch);
            if (L->ffn_post_norm) ops_rmsnorm(tp, e->xn, e->xn, L->ffn_post_norm, T, dim, eps);   /* gemma3 */
            engine_prof_mark(e, il, ENGINE_PROF_FFN_DOWN);
        }
        if (L->pl_gate.data) {   /* gemma4: x += ffn, then its per-layer embedding term */
            job.norm = NULL;
            engine_run_rows(e, engine_job_add_norm, &job, (int64_t)T * dim);
            engine_gemma4_pl_layer(e, il, T);   /* the term in xn */
        }
        job.norm = il + 1 < hp->n_layers ? m->layers[il + 1].attn_norm : NULL;
        job.scale = L->out_scale;
        engine_run_rows(e, engine_job_add_norm, &job, (int64_t)T * dim);   /* x += ffn; xn = next layer's input */
        job.scale = 0.0f;
        engine_prof_mark(e, il, ENGINE_PROF_ADD_NORM);
    }
    if (e->win_src >= 0) engine_window_commit(e, b, e->win_src);
    if (e->stats) engine_moe_stats_step(e->stats);
    if (e->q35) engine_qwen35_commit(e->q35);
    if (n_out > 0) {
        int r = 0;
        for (int t = 0; t < T; t++)
            if (b->toks[t].want_logits)
                memcpy(e->xo + (size_t)r++ * dim, e->x + (size_t)t * dim, (size_t)dim * sizeof(float));
        ops_rmsnorm(tp, e->xo, e->xo, m->output_norm, n_out, dim, eps);
        engine_prof_mark(e, il_out, ENGINE_PROF_OUT_NORM);
        ops_matmul(tp, &m->output, e->xo, n_out, logits, e->mm_scratch);
        if (hp->logit_softcap != 0.0f) ops_softcap(tp, logits, (int64_t)n_out * hp->n_vocab, hp->logit_softcap);   /* gemma3 */
        engine_prof_mark(e, il_out, ENGINE_PROF_OUTPUT);
    }
    if (e->prof_on) ops_profile_attach(NULL);
    return ENGINE_OK;
}
