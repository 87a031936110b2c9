/*
 * steptime: the engine's step time learned from real steps. See steptime.h for the design.
 */
#include "engine/steptime.h"

#include <math.h>
#include <string.h>

enum { STEPTIME_W_VERIFY = 2, STEPTIME_W_PREFILL = 3, STEPTIME_W_DEPTH = 4 };   /* indexes of w */

#define STEPTIME_RIDGE 1e-9    /* added to a slope's diagonal: an unexcited feature fits to ~0, never NaN */
#define STEPTIME_MIN_S 1e-4    /* shortest step time an observation is weighted by */

static void steptime_vec(const steptime_x *x, double v[STEPTIME_NX])
{
    v[0] = 1;
    v[1] = x->n_dec;
    v[2] = x->n_verify;
    v[3] = x->n_prefill;
    v[4] = x->depth / 1024.0;
}

void steptime_init(steptime *m) { memset(m, 0, sizeof *m); }

bool steptime_warm(const steptime *m) { return m->n_obs >= STEPTIME_WARM; }

double steptime_predict(const steptime *m, const steptime_x *x)
{
    if (!steptime_warm(m)) return 0;
    double v[STEPTIME_NX], t = 0;
    steptime_vec(x, v);
    for (int i = 0; i < STEPTIME_NX; i++) t += m->w[i] * v[i];
    return t > 0 ? t : 0;
}

/* Solves (a + ridge) w = b by Gaussian elimination with partial pivoting (5x5). The ridge is
 * on the slopes, not the constant: a feature that has not varied yet (every step so far had
 * one decode) cannot be told from the constant, and the fit then puts its time in the
 * constant, so one more row of it is predicted free until a step shows its cost. An even split
 * would predict that one more decode row doubles a single stream's step, and speculation would
 * never try a verify row to learn better. */
static void steptime_solve(steptime *m)
{
    double g[STEPTIME_NX][STEPTIME_NX + 1];
    for (int i = 0; i < STEPTIME_NX; i++) {
        for (int j = 0; j < STEPTIME_NX; j++) g[i][j] = m->a[i][j] + (i == j && i > 0 ? STEPTIME_RIDGE * (1 + m->a[i][i]) : 0);
        g[i][STEPTIME_NX] = m->b[i];
    }
    for (int c = 0; c < STEPTIME_NX; c++) {
        int piv = c;
        for (int r = c + 1; r < STEPTIME_NX; r++)
            if (fabs(g[r][c]) > fabs(g[piv][c])) piv = r;
        if (fabs(g[piv][c]) < 1e-300) return;   /* keep the previous fit */
        if (piv != c)
            for (int j = 0; j <= STEPTIME_NX; j++) {
                double t = g[c][j];
                g[c][j] = g[piv][j];
                g[piv][j] = t;
            }
        for (int r = c + 1; r < STEPTIME_NX; r++) {
            double f = g[r][c] / g[c][c];
            for (int j = c; j <= STEPTIME_NX; j++) g[r][j] -= f * g[c][j];
        }
    }
    double w[STEPTIME_NX];
    for (int i = STEPTIME_NX - 1; i >= 0; i--) {
        double t = g[i][STEPTIME_NX];
        for (int j = i + 1; j < STEPTIME_NX; j++) t -= g[i][j] * w[j];
        w[i] = t / g[i][i];
        if (!isfinite(w[i])) return;
    }
    memcpy(m->w, w, sizeof w);
}

void steptime_observe(steptime *m, const steptime_x *x, double seconds)
{
    if (!(seconds >= 0) || !isfinite(seconds)) return;
    if (steptime_warm(m) && seconds > 0) {
        double err = fabs(steptime_predict(m, x) - seconds);
        m->abs_err_s += err;
        m->rel_err += err / seconds;
        m->n_err++;
    }
    /* the machine's noise is a share of the step (other processes, clocks), so each step is
     * weighted by 1 / its time squared: a fit of relative errors, where a 250 ms step with a
     * prompt chunk would otherwise drown the few milliseconds a verify row costs. The larger
     * of the measured and the predicted time sets the weight: a step slowed by a burst of
     * other load counts for less, and one measured too fast cannot count for more than the
     * fit expects. */
    double scale = fmax(fmax(seconds, steptime_predict(m, x)), STEPTIME_MIN_S);
    double wt = 1 / (scale * scale);
    double v[STEPTIME_NX];
    steptime_vec(x, v);
    for (int i = 0; i < STEPTIME_NX; i++) {
        for (int j = 0; j < STEPTIME_NX; j++) m->a[i][j] = STEPTIME_FORGET * m->a[i][j] + wt * v[i] * v[j];
        m->b[i] = STEPTIME_FORGET * m->b[i] + wt * v[i] * seconds;
    }
    m->n_obs++;
    steptime_solve(m);
}

double steptime_prefill_token_s(const steptime *m)
{
    /* a coefficient fitted below zero (noise) must not make tokens look free */
    return steptime_warm(m) ? fmax(m->w[STEPTIME_W_PREFILL], 0) : 0;
}

double steptime_verify_row_s(const steptime *m)
{
    if (!steptime_warm(m)) return 0;
    return fmax(fmax(m->w[STEPTIME_W_VERIFY], 0), steptime_prefill_token_s(m));
}

double steptime_depth_s(const steptime *m, double depth)
{
    return steptime_warm(m) ? fmax(m->w[STEPTIME_W_DEPTH], 0) * depth / 1024.0 : 0;
}

int steptime_fit_tokens(const steptime *m, const steptime_x *x, double depth_per_tok, double target_s)
{
    if (!steptime_warm(m)) return -1;
    double left = target_s - steptime_predict(m, x);
    if (left <= 0) return 0;
    double per_tok = steptime_prefill_token_s(m) + steptime_depth_s(m, depth_per_tok);
    if (per_tok <= 0) return 1 << 30;
    double n = floor(left / per_tok);
    return n > (1 << 30) ? 1 << 30 : (int)n;
}
