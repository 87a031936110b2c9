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

/* The least-squares weights of the features in mask (the others 0): solves the normal
 * equations g restricted to them by Gaussian elimination with partial pivoting. Returns false
 * when that system is singular or a weight is not finite. */
static bool steptime_solve_subset(const double g[STEPTIME_NX][STEPTIME_NX], const double *b, unsigned mask,
                                  double w[STEPTIME_NX])
{
    int idx[STEPTIME_NX], n = 0;
    for (int i = 0; i < STEPTIME_NX; i++) {
        w[i] = 0;
        if (mask & (1u << i)) idx[n++] = i;
    }
    double h[STEPTIME_NX][STEPTIME_NX + 1];
    for (int r = 0; r < n; r++) {
        for (int c = 0; c < n; c++) h[r][c] = g[idx[r]][idx[c]];
        h[r][n] = b[idx[r]];
    }
    for (int c = 0; c < n; c++) {
        int piv = c;
        for (int r = c + 1; r < n; r++)
            if (fabs(h[r][c]) > fabs(h[piv][c])) piv = r;
        if (fabs(h[piv][c]) < 1e-300) return false;
        if (piv != c)
            for (int j = 0; j <= n; j++) {
                double t = h[c][j];
                h[c][j] = h[piv][j];
                h[piv][j] = t;
            }
        for (int r = c + 1; r < n; r++) {
            double f = h[r][c] / h[c][c];
            for (int j = c; j <= n; j++) h[r][j] -= f * h[c][j];
        }
    }
    for (int r = n - 1; r >= 0; r--) {
        double t = h[r][n];
        for (int j = r + 1; j < n; j++) t -= h[r][j] * w[idx[j]];
        w[idx[r]] = t / h[r][r];
        if (!isfinite(w[idx[r]])) return false;
    }
    return true;
}

/* The fit: the least-squares weights under the constraint that none is negative (a step, a
 * row, a token and attention each cost time, never save it). Features that go together (one
 * stream: every decode step has one decode row, its verify rows bring their depth along) can
 * be traded against each other without changing the fit, and an unconstrained solution then
 * pairs a huge weight with a huge negative one; any single weight read from it (a verify
 * row's price, a prefill token's) is then meaningless. With 5 weights every set of zero
 * weights is tried (32 small solves): the best solution whose free weights are all >= 0 is the
 * constrained optimum. A small ridge on the slopes, not the constant: a feature that has not
 * varied yet (every step so far had one decode) cannot be told from the constant, and its time
 * goes to the constant, so one more row of it is predicted free until a step shows its cost
 * (an even split would predict that one more row doubles a single stream's step, and no verify
 * row would ever be tried to learn better). */
static void steptime_solve(steptime *m)
{
    double g[STEPTIME_NX][STEPTIME_NX];
    for (int i = 0; i < STEPTIME_NX; i++)
        for (int j = 0; j < STEPTIME_NX; j++) g[i][j] = m->a[i][j] + (i == j && i > 0 ? STEPTIME_RIDGE * (1 + m->a[i][i]) : 0);
    double best[STEPTIME_NX] = { 0 }, best_f = 0;   /* all zero: objective 0 */
    for (unsigned mask = 1; mask < (1u << STEPTIME_NX); mask++) {
        double w[STEPTIME_NX];
        if (!steptime_solve_subset(g, m->b, mask, w)) continue;
        bool ok = true;
        for (int i = 0; i < STEPTIME_NX; i++) ok &= w[i] >= 0;
        if (!ok) continue;
        double f = 0;   /* w' g w - 2 b' w: the squared error less its constant part */
        for (int i = 0; i < STEPTIME_NX; i++) {
            double gw = 0;
            for (int j = 0; j < STEPTIME_NX; j++) gw += g[i][j] * w[j];
            f += w[i] * gw - 2 * m->b[i] * w[i];
        }
        if (f < best_f) {
            best_f = f;
            memcpy(best, w, sizeof best);
        }
    }
    memcpy(m->w, best, sizeof best);
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

void steptime_curve4(const steptime *m, double out[4])
{
    out[0] = m->w[0];
    out[1] = m->w[1];
    out[2] = m->w[STEPTIME_W_PREFILL];
    out[3] = m->w[STEPTIME_W_DEPTH];
}

double steptime_prefill_token_s(const steptime *m)
{
    return steptime_warm(m) ? m->w[STEPTIME_W_PREFILL] : 0;
}

double steptime_verify_row_s(const steptime *m)
{
    if (!steptime_warm(m)) return 0;
    return fmax(m->w[STEPTIME_W_VERIFY], steptime_prefill_token_s(m));
}

double steptime_depth_s(const steptime *m, double depth)
{
    return steptime_warm(m) ? m->w[STEPTIME_W_DEPTH] * depth / 1024.0 : 0;
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
