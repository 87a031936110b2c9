/*
 * engine_moe: the experts' round of a MoE layer (engine_moe.h), for every family. One pool
 * round instead of two or three per active expert keeps a decode step's threads from meeting
 * at a dozen barriers per layer. Work items are chunks of ENGINE_MOE_ROWS rows of one expert
 * (the shared expert's first), taken from an atomic counter; a chunk's values are its rows of
 * the whole-matrix products (a row's dots do not depend on the rows beside it), so neither the
 * chunking nor which thread takes a chunk changes a bit. A thread quantises an input once for
 * the run of chunks it takes from one expert (ops_matmul_reuse): consecutive items are mostly
 * the same expert's. Each thread writes only its chunk's columns of fe/fs and ye/ys.
 */
#include "engine/engine_moe.h"

#include <math.h>
#include <string.h>

#include "model/model.h"
#include "util/util.h"

void engine_moe_swiglu_clamp(float *g, const float *u, int64_t n, float lim)
{
    for (int64_t i = 0; i < n; i++) {
        float a = g[i], b = u[i];
        if (lim > 1e-6f) {
            a = fminf(a, lim);
            b = fminf(fmaxf(b, -lim), lim);
        }
        g[i] = a / (1.0f + expf(-a)) * b;
    }
}

/* g = act(g, u) over n rows of nr values. */
static void engine_moe_act_rows(engine_moe_act act, float lim, float *g, const float *u, int n, int nr)
{
    switch (act) {
    case ENGINE_MOE_ACT_SWIGLU_OAI: ops_swiglu_oai(g, g, u, (int64_t)n * nr, 1.702f, lim); break;
    case ENGINE_MOE_ACT_GEGLU: ops_geglu(NULL, g, g, u, n, nr); break;
    case ENGINE_MOE_ACT_SWIGLU_CLAMP: engine_moe_swiglu_clamp(g, u, (int64_t)n * nr, lim); break;
    case ENGINE_MOE_ACT_SWIGLU: default: ops_swiglu(NULL, g, g, u, n, nr); break;
    }
}

/* n rows of nr values from src into dst's columns [c0, c0 + nr) of rows ld values apart */
static void engine_moe_put(float *dst, size_t ld, int c0, const float *src, int n, int nr)
{
    for (int t = 0; t < n; t++) memcpy(dst + (size_t)t * ld + c0, src + (size_t)t * nr, (size_t)nr * sizeof(float));
}

static void engine_moe_job(void *ctx, int ith, int nth)
{
    engine_moe_round *r = ctx;
    const int E = r->n_expert, dim = r->dim, ef = r->ef, R = ENGINE_MOE_ROWS, T = r->T;
    const int sf = r->sh_gate ? (int)r->sh_gate->rows : 0;
    const int cg = (ef + R - 1) / R, cd = (dim + R - 1) / R, csg = (sf + R - 1) / R, csd = sf ? cd : 0;
    float *tg = r->tmp + (size_t)ith * r->tmp_stride, *tu = tg + r->tmp_rows;
    void *scratch = tu + r->tmp_rows;
    const float *qx = NULL;   /* the input quantised in scratch: once per run of one expert's chunks */
    (void)nth;
    for (;;) {
        int it = threadpool_items_take(&r->items, ith);
        if (it < 0) break;
        it -= csg;
        if (it < 0) {   /* a chunk of the shared expert's hidden rows */
            const int c0 = (it + csg) * R, nr = TM_MIN(R, sf - c0);
            ops_weight g = ops_weight_rows(r->sh_gate, c0, nr), u = ops_weight_rows(r->sh_up, c0, nr);
            const ops_weight *gu[2] = { &g, &u };
            float *out[2] = { tg, tu };
            ops_matmul_reuse(2, gu, r->xs, T, out, scratch, &qx);
            engine_moe_act_rows(r->sh_act, r->sh_lim, tg, tu, T, nr);
            engine_moe_put(r->fs, (size_t)sf, c0, tg, T, nr);
            continue;
        }
        const int x = r->x_act[it / cg], c0 = it % cg * R, nr = TM_MIN(R, ef - c0);
        const int r0 = r->x_off[x], n = r->x_off[x + 1] - r0;
        ops_weight g = model_expert(r->gate, E, x), u = r->gate_up ? g : model_expert(r->up, E, x);
        /* gate and up may differ in type (the "dynamic" mixes): each its own row size */
        u = ops_weight_rows(&u, r->gate_up ? ef + c0 : c0, nr);
        g = ops_weight_rows(&g, c0, nr);
        const ops_weight *gu[2] = { &g, &u };
        float *out[2] = { tg, tu };
        ops_matmul_reuse(2, gu, r->xg + (size_t)r0 * dim, n, out, scratch, &qx);
        if (r->gate_b) {
            const float *gb = r->gate_b + (size_t)x * ef + c0, *ub = r->up_b + (size_t)x * ef + c0;
            for (int t = 0; t < n; t++) {
                ops_add(NULL, tg + (size_t)t * nr, gb, nr);
                ops_add(NULL, tu + (size_t)t * nr, ub, nr);
            }
        }
        engine_moe_act_rows(r->act, r->lim, tg, tu, n, nr);
        engine_moe_put(r->fe + (size_t)r0 * ef, (size_t)ef, c0, tg, n, nr);
    }
    threadpool_barrier(r->tp);
    qx = NULL;
    for (;;) {
        int it = threadpool_items_take(&r->items2, ith);
        if (it < 0) break;
        it -= csd;
        const int c0 = (it < 0 ? it + csd : it % cd) * R, nr = TM_MIN(R, dim - c0);
        float *o[1] = { tg };
        if (it < 0) {   /* a chunk of the shared expert's output rows */
            ops_weight d = ops_weight_rows(r->sh_down, c0, nr);
            const ops_weight *dw[1] = { &d };
            ops_matmul_reuse(1, dw, r->fs, T, o, scratch, &qx);
            engine_moe_put(r->ys, (size_t)dim, c0, tg, T, nr);
            continue;
        }
        const int x = r->x_act[it / cd], r0 = r->x_off[x], n = r->x_off[x + 1] - r0;
        ops_weight d = model_expert(r->down, E, x);
        d = ops_weight_rows(&d, c0, nr);
        const ops_weight *dw[1] = { &d };
        ops_matmul_reuse(1, dw, r->fe + (size_t)r0 * ef, n, o, scratch, &qx);
        if (r->down_b)
            for (int t = 0; t < n; t++) ops_add(NULL, tg + (size_t)t * nr, r->down_b + (size_t)x * dim + c0, nr);
        if (r->down_s)   /* gemma4's per-expert scale, before the routing weight (ggml's order) */
            ops_vec_scale_f32((int64_t)n * nr, tg, r->down_s[x]);
        engine_moe_put(r->ye + (size_t)r0 * dim, (size_t)dim, c0, tg, n, nr);
    }
}

void engine_moe_round_run(engine_moe_round *r)
{
    const int R = ENGINE_MOE_ROWS, nth = threadpool_size(r->tp), cd = (r->dim + R - 1) / R;
    const int sf = r->sh_gate ? (int)r->sh_gate->rows : 0;
    threadpool_items_reset(&r->items, (sf + R - 1) / R + r->n_act * ((r->ef + R - 1) / R), nth);
    threadpool_items_reset(&r->items2, (sf ? cd : 0) + r->n_act * cd, nth);
    threadpool_run(r->tp, engine_moe_job, r);
}
