/*
 * steptime: a model of the engine's step time learned from real steps, for sizing each step
 * to a time target instead of a token count (DeepSeek's prefill balancer budgets in time).
 *
 * DESIGN. A step's seconds are modelled as w . x with the features
 *   x = (1, decodes, verify rows, prefill tokens, context depth / 1024),
 * the depth being the sum over the step's tokens of the positions each attends to: the
 * weights are read once per step (the constant), every token costs its FLOPs (decodes, verify
 * rows and prefill tokens apart: a decode row is a skinny GEMV, prefill rows batch well, and a
 * speculative verify row rides with its sequence's decode row: it reads the same cached keys
 * and values and adds no sequence to sample, so on a 2-core machine it costs about two
 * thirds of a decode row; priced as one, drafts that pay would not be verified) and attention
 * grows with depth. w is the least-squares fit of the steps seen, in relative terms (each
 * step weighted by 1 / its time squared: noise on a shared machine is a share of the step) (a ridge on the slopes only:
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

#define STEPTIME_NX 5          /* features */
#define STEPTIME_FORGET 0.98   /* weight kept by an observation per newer one (~50-step memory) */
#define STEPTIME_WARM 8        /* steps observed before the model sizes anything */

typedef struct {
    double n_dec;              /* decode rows (one per decoding sequence) */
    double n_verify;           /* speculative verify rows beside them (drafted tokens) */
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
/* The fit in the four terms the cluster protocol carries (a worker's heartbeat): seconds per
 * step, per decode row, per prefill token and per 1024 positions attended (verify rows are
 * the scheduler's own business: the gateway prices prompts). */
void steptime_curve4(const steptime *m, double out[4]);
/* Seconds one more prefill token adds, attention apart (0 before warm, never negative). */
double steptime_prefill_token_s(const steptime *m);
/* Seconds one more verify row adds, attention apart: the fit's, but never below a prefill
 * token's (a verify row is a token through every layer, and wants logits besides): in steps
 * made mostly of a prompt chunk the verify rows' few milliseconds are within the noise, and
 * a fit near zero would have every draft verified (0 before warm). */
double steptime_verify_row_s(const steptime *m);
/* Seconds that attention over depth positions adds (0 before warm, never negative). */
double steptime_depth_s(const steptime *m, double depth);
/* Prefill tokens that can join a step already made of *x and keep it within target_s, each
 * new token attending to about depth_per_tok positions; -1 before warm (use the token caps).
 * 0 when the step is at or over the target already. */
int steptime_fit_tokens(const steptime *m, const steptime_x *x, double depth_per_tok, double target_s);

#endif
