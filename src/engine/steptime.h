/*
 * steptime: a model of the engine's step time learned from real steps, for sizing each step
 * to a time target instead of a token count (DeepSeek's prefill balancer budgets in time).
 *
 * DESIGN. A step's seconds are modelled as w . x with the features
 *   x = (1, decodes, prefill tokens, context depth / 1024),
 * the depth being the sum over the step's tokens of the positions each attends to: the
 * weights are read once per step (the constant), every token costs its FLOPs (decodes and
 * prefill tokens apart: a decode row is a skinny GEMV, prefill rows batch well) and attention
 * grows with depth. w is the least-squares fit of the steps seen (a ridge on the slopes only:
 * a feature that has not varied yet is predicted free, not a guessed share of the step), each
 * older step weighted down by STEPTIME_FORGET per step, so the curve follows a machine whose
 * speed changes (other load, frequency) with no history stored: a 4x4 normal matrix and its
 * right-hand side, solved after each observation (no allocation, a few hundred flops). Until
 * STEPTIME_WARM steps were seen the model gives no answer and callers keep their token caps.
 * Each step's prediction, made before that step is learned, is compared with its measured
 * time: the error sums are what /metrics shows of the model's quality.
 *
 * Not thread-safe: the scheduler's engine thread alone updates and reads it.
 */
#ifndef TM_STEPTIME_H
#define TM_STEPTIME_H

#include <stdbool.h>
#include <stdint.h>

#define STEPTIME_NX 4          /* features */
#define STEPTIME_FORGET 0.98   /* weight kept by an observation per newer one (~50-step memory) */
#define STEPTIME_WARM 8        /* steps observed before the model sizes anything */

typedef struct {
    double n_dec;              /* decode rows */
    double n_prefill;          /* prefill tokens */
    double depth;              /* sum over the step's tokens of the positions attended to */
} steptime_x;

typedef struct {
    double a[STEPTIME_NX][STEPTIME_NX]; /* forgetting-weighted sum of x x^T */
    double b[STEPTIME_NX];     /* forgetting-weighted sum of x * seconds */
    double w[STEPTIME_NX];     /* fitted seconds per unit of each feature */
    uint64_t n_obs;            /* steps observed */
    uint64_t n_err;            /* steps whose prediction was scored (observed once warm) */
    double abs_err_s;          /* sum of |predicted - measured| seconds over those */
    double rel_err;            /* sum of |predicted - measured| / measured over those */
} steptime;

void steptime_init(steptime *m);
bool steptime_warm(const steptime *m);
/* Predicted seconds of a step with this make-up (0 before warm). */
double steptime_predict(const steptime *m, const steptime_x *x);
/* Learns one real step (its make-up and measured seconds); scores the prediction first. */
void steptime_observe(steptime *m, const steptime_x *x, double seconds);
/* Prefill tokens that can join a step already made of *x and keep it within target_s, each
 * new token attending to about depth_per_tok positions; -1 before warm (use the token caps).
 * 0 when the step is at or over the target already. */
int steptime_fit_tokens(const steptime *m, const steptime_x *x, double depth_per_tok, double target_s);

#endif
