/*
 * engine_moe: the experts' round of a MoE layer, one for every family (engine_step's and
 * DeepSeek V4's). The caller routes and groups the rows by expert, describes the round in an
 * engine_moe_round (weights, buffers, activation, the shared expert if it rides along) and
 * runs it on its pool; the round computes every active expert's FFN over its rows, and the
 * shared expert's over the step's tokens, into the caller's buffers. Only engine*.c see this.
 */
#ifndef TM_ENGINE_MOE_H
#define TM_ENGINE_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/ops.h"
#include "util/threadpool.h"

#define ENGINE_MOE_ROWS 64       /* output rows of an expert per work item */
/* Steps of at most this many tokens compute the shared experts' FFN as work items of the
 * routed experts' round (two pool rounds fewer per layer); each item quantises its T input
 * rows again, which for a long prefill would cost more than the rounds it saves. */
#define ENGINE_MOE_SHARED_T 4

/* The activation of gate g and up u into g's place. */
typedef enum {
    ENGINE_MOE_ACT_SWIGLU,         /* silu(g) * u (ops_swiglu) */
    ENGINE_MOE_ACT_SWIGLU_OAI,     /* gpt-oss's clamped SwiGLU, alpha 1.702, limit lim (ops_swiglu_oai) */
    ENGINE_MOE_ACT_GEGLU,          /* gelu(g) * u (ops_geglu; gemma4) */
    ENGINE_MOE_ACT_SWIGLU_CLAMP,   /* DeepSeek V4's: engine_moe_swiglu_clamp at lim */
} engine_moe_act;

/* One round's description; the caller fills it (on its stack: a step allocates nothing) and
 * calls engine_moe_round_run. rows: the grouped (token, slot) rows, expert e's at
 * [x_off[e], x_off[e + 1]), in the buffers below at those row indexes. */
typedef struct {
    threadpool *tp;               /* the pool the round runs on */
    int n_expert;                 /* experts of the layer */
    int ef;                       /* an expert's hidden size */
    int dim;                      /* the model's width */
    /* the routed experts: each tensor stacks its experts row-wise (model_expert) */
    const ops_weight *gate;       /* (n_expert * ef, dim); gate_up: (n_expert * 2 * ef, dim) */
    const ops_weight *up;         /* (n_expert * ef, dim); unused when gate_up */
    const ops_weight *down;       /* (n_expert * dim, ef) */
    bool gate_up;                 /* gate holds an expert's ef up rows after its ef gate rows */
    const float *gate_b, *up_b;   /* (n_expert, ef) biases added before the activation, or NULL */
    const float *down_b;          /* (n_expert, dim) bias of the down projection, or NULL */
    const float *down_s;          /* (n_expert) scale of an expert's down output, or NULL */
    engine_moe_act act;           /* the routed experts' activation */
    float lim;                    /* its limit (SWIGLU_OAI, SWIGLU_CLAMP) */
    const int32_t *x_act;         /* (n_act) the active experts */
    int n_act;
    const int32_t *x_off;         /* (n_expert + 1) first grouped row of each expert */
    const float *xg;              /* (rows, dim) the inputs */
    float *fe;                    /* (rows, ef) the activations (written) */
    float *ye;                    /* (rows, dim) the outputs (written) */
    /* the shared expert, its chunks first in each phase; sh_gate NULL: not in this round */
    const ops_weight *sh_gate;    /* (sf, dim) */
    const ops_weight *sh_up;      /* (sf, dim) */
    const ops_weight *sh_down;    /* (dim, sf) */
    engine_moe_act sh_act;        /* SWIGLU or SWIGLU_CLAMP */
    float sh_lim;
    int T;                        /* the step's tokens */
    const float *xs;              /* (T, dim) the shared expert's input */
    float *fs;                    /* (T, sf) its activations (written) */
    float *ys;                    /* (T, dim) its output (written) */
    /* per thread ith: gate's chunk output at tmp + ith * tmp_stride, up's tmp_rows floats
     * later, then the matmul scratch (big enough for any chunk of the round) */
    float *tmp;
    size_t tmp_stride;            /* floats per thread */
    size_t tmp_rows;              /* floats of a chunk's output: rows of an expert * ENGINE_MOE_ROWS */
    threadpool_items items, items2; /* the two phases' work items (the run resets them) */
} engine_moe_round;

/* Runs the round on r->tp (the caller's thread is one of its threads). Work items are
 * ENGINE_MOE_ROWS-row chunks of an expert, taken in contiguous runs per thread
 * (threadpool_items); phase 1: gate and up of a chunk of the expert's hidden rows and the
 * activation into fe (fs), a barrier, phase 2: the down projection of a chunk of its output
 * rows into ye (ys). A chunk's values are its
 * rows of the whole products, so the split changes no bit whatever the thread count. */
void engine_moe_round_run(engine_moe_round *r);

/* silu(min(g, lim)) * clamp(u, -lim, lim), in place in g; lim <= 1e-6: unclamped. */
void engine_moe_swiglu_clamp(float *g, const float *u, int64_t n, float lim);

#endif
