/*
 * test_steptime: the learned step-time model on recorded curves: steps of a known cost
 * curve (a constant per step, per decode, per verify row, per prefill token and per 1024
 * positions of attention depth, with +-5 % noise) in the mix a server sees (decode-only, with
 * verify rows, mixed, prefill alone at several depths). The fit predicts held-out steps within 10 %, sizes a step to a
 * time target as the curve says, follows a machine that slows down, says nothing before it is
 * warm, and stays finite when a feature never varies. No clock is read: the "seconds" are the
 * curve's.
 */
#include <stdint.h>
#include <stdio.h>

#include "harness.h"
#include "engine/steptime.h"

typedef struct {
    double c0, dec, pre, depth;   /* seconds: per step, per decode, per prefill token, per 1024 depth */
    double ver;                   /* seconds per verify row */
} curve;

static double curve_at(const curve *c, const steptime_x *x)
{
    return c->c0 + c->dec * x->n_dec + c->ver * x->n_verify + c->pre * x->n_prefill + c->depth * x->depth / 1024.0;
}

static uint64_t g_rng = 88172645463325252ull;
static double noise(void)   /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* Step i of a server's mix: decodes of 1..16 streams at depth 200..4000 (0..3 verify rows
 * beside each in one step of two), with or without a prefill chunk of 16..512 tokens, or a
 * prefill alone. */
static steptime_x mix_step(int i)
{
    steptime_x x = { 0 };
    int kind = i % 3;
    int n_dec = kind == 2 ? 0 : 1 + (i * 7) % 16;
    double dec_depth = 200 + (i * 131) % 3800;
    int chunk = kind == 0 ? 0 : 16 + (i * 37) % 497;
    double chunk_at = (i * 53) % 3000;
    int n_ver = i % 2 ? n_dec * ((i / 2) % 4) : 0;
    x.n_dec = n_dec;
    x.n_verify = n_ver;
    x.n_prefill = chunk;
    x.depth = (n_dec + n_ver) * dec_depth + chunk * chunk_at + (double)chunk * (chunk + 1) / 2;
    return x;
}

static void feed(steptime *m, const curve *c, int from, int n, double noise_frac)
{
    for (int i = from; i < from + n; i++) {
        steptime_x x = mix_step(i);
        steptime_observe(m, &x, curve_at(c, &x) * (1 + noise_frac * noise()));
    }
}

static double worst_rel_err(const steptime *m, const curve *c, int from, int n)
{
    double worst = 0;
    for (int i = from; i < from + n; i++) {
        steptime_x x = mix_step(i);
        double want = curve_at(c, &x), got = steptime_predict(m, &x);
        double e = fabs(got - want) / want;
        if (e > worst) worst = e;
    }
    return worst;
}

/* A CPU-like curve: 4 ms per step (weights read), 0.3 ms per decode, 0.2 ms per verify row,
 * 0.12 ms per prefill token, 0.02 ms per 1024 positions of depth. */
static const curve g_cpu = { 4e-3, 0.3e-3, 0.12e-3, 0.02e-3, 0.2e-3 };

TEST(test_fit_predicts_held_out_steps)
{
    steptime m;
    steptime_init(&m);
    steptime_x x = mix_step(1);
    CHECK(!steptime_warm(&m) && steptime_predict(&m, &x) == 0);
    CHECK(steptime_fit_tokens(&m, &x, 100, 0.05) == -1);   /* not warm: the caps decide */
    feed(&m, &g_cpu, 0, STEPTIME_WARM - 1, 0.05);
    CHECK(!steptime_warm(&m));
    feed(&m, &g_cpu, STEPTIME_WARM - 1, 300, 0.05);
    CHECK(steptime_warm(&m));
    double e = worst_rel_err(&m, &g_cpu, 10000, 200);   /* steps it never saw */
    CHECKF(e < 0.10, "worst relative error %.3f", e);
    /* the error the model reports of itself: ~ the noise once it has learned */
    CHECK(m.n_err == (uint64_t)(STEPTIME_WARM - 1 + 300 - STEPTIME_WARM));   /* scored once warm */
    steptime m2 = m;
    m2.n_err = 0;
    m2.abs_err_s = m2.rel_err = 0;
    feed(&m2, &g_cpu, 20000, 100, 0.05);
    CHECKF(m2.n_err == 100 && m2.rel_err / 100 < 0.08, "mean relative error %.3f", m2.rel_err / 100);
}

TEST(test_fit_tokens_sizes_to_the_target)
{
    steptime m;
    steptime_init(&m);
    feed(&m, &g_cpu, 0, 300, 0.05);
    /* 8 decodes at depth 1000, then prefill at depth ~500 under a 50 ms target */
    steptime_x x = { .n_dec = 8, .depth = 8 * 1000 };
    int n = steptime_fit_tokens(&m, &x, 500, 50e-3);
    double per_tok = g_cpu.pre + g_cpu.depth * 500 / 1024.0;
    double want = (50e-3 - curve_at(&g_cpu, &x)) / per_tok;
    CHECKF(fabs(n - want) < 0.1 * want, "%d tokens, the curve says %.0f", n, want);
    /* a step at its target already takes nothing more */
    steptime_x full = { .n_dec = 16, .n_prefill = 400, .depth = 16 * 3000 + 400 * 1000 };
    CHECK(steptime_fit_tokens(&m, &full, 1000, curve_at(&g_cpu, &full) * 0.9) == 0);
    /* a larger target (a step without decodes) fits more */
    steptime_x none = { 0 };
    CHECK(steptime_fit_tokens(&m, &none, 500, 200e-3) > steptime_fit_tokens(&m, &none, 500, 50e-3));
}

/* The machine gets twice as slow (another process, a lower clock): the forgetting factor
 * lets the fit follow within a few hundred steps. */
TEST(test_follows_a_slower_machine)
{
    steptime m;
    steptime_init(&m);
    feed(&m, &g_cpu, 0, 300, 0.05);
    curve slow = { 2 * g_cpu.c0, 2 * g_cpu.dec, 2 * g_cpu.pre, 2 * g_cpu.depth, 2 * g_cpu.ver };
    CHECK(worst_rel_err(&m, &slow, 10000, 100) > 0.3);
    feed(&m, &slow, 300, 300, 0.05);
    double e = worst_rel_err(&m, &slow, 10000, 200);
    CHECKF(e < 0.10, "worst relative error after the change %.3f", e);
}

/* Only prefill steps at depth 0 (the decode and depth features never vary): predictions and
 * sizes stay finite, negative or zero times are never predicted. Garbage times are ignored. */
TEST(test_degenerate_mix_stays_finite)
{
    steptime m;
    steptime_init(&m);
    for (int i = 0; i < 50; i++) {
        steptime_x x = { .n_prefill = 512 };
        steptime_observe(&m, &x, 0.06);
    }
    steptime_x bad = { .n_prefill = 512 };
    steptime_observe(&m, &bad, NAN);
    steptime_observe(&m, &bad, -1);
    CHECK(m.n_obs == 50);
    steptime_x x = { .n_dec = 4, .n_prefill = 100, .depth = 4000 };
    double t = steptime_predict(&m, &x);
    CHECKF(isfinite(t) && t > 0, "%g s", t);
    /* warm (not -1), and the step has room left under the target */
    int n = steptime_fit_tokens(&m, &x, 100, 0.1);
    CHECKF(t < 0.1 && n > 0, "%g s, %d tokens", t, n);
    steptime_x p = { .n_prefill = 512 };
    CHECKF(fabs(steptime_predict(&m, &p) - 0.06) < 0.006, "%.4f", steptime_predict(&m, &p));
}

/* One stream decoding (every step one decode row, the depth growing): the cost of a second
 * row was never seen, so it is predicted free rather than a guessed share of the step, and
 * once steps with more rows are seen the fit follows the curve. */
TEST(test_unseen_rows_are_not_guessed_costly)
{
    steptime m;
    steptime_init(&m);
    for (int i = 0; i < 40; i++) {
        steptime_x x = { .n_dec = 1, .depth = 300 + i };
        steptime_observe(&m, &x, curve_at(&g_cpu, &x) * (1 + 0.02 * noise()));
    }
    steptime_x one = { .n_dec = 1, .depth = 340 }, two = { .n_dec = 2, .depth = 680 };
    double t1 = steptime_predict(&m, &one), t2 = steptime_predict(&m, &two);
    CHECKF(t2 < 1.05 * t1, "one row %.3g s, two rows %.3g s", t1, t2);
    for (int i = 0; i < 40; i++) {
        steptime_x x = { .n_dec = 1 + i % 4, .depth = (1 + i % 4) * (340.0 + i) };
        steptime_observe(&m, &x, curve_at(&g_cpu, &x) * (1 + 0.02 * noise()));
    }
    t2 = steptime_predict(&m, &two);
    double want = curve_at(&g_cpu, &two);
    CHECKF(fabs(t2 - want) < 0.05 * want, "two rows %.3g s, the curve says %.3g s", t2, want);
}

/* Four streams decoding, verify rows cheaper than decode rows (they share their sequence's
 * cached keys and values): before any step had one, a verify row is predicted free (so
 * drafts get tried); once steps with 0-8 of them were seen, the price of one more is the
 * curve's and not a decode row's. */
TEST(test_verify_rows_priced_apart)
{
    const curve c = { 20e-3, 8e-3, 2e-3, 0.5e-3, 5e-3 };
    steptime m;
    steptime_init(&m);
    for (int i = 0; i < 60; i++) {   /* streams joining: 1-4 decodes, no drafts yet */
        steptime_x x = { .n_dec = 1 + i % 4, .depth = (1 + i % 4) * (400.0 + i) };
        steptime_observe(&m, &x, curve_at(&c, &x) * (1 + 0.02 * noise()));
    }
    steptime_x four = { .n_dec = 4, .depth = 4 * 460.0 }, plus = four;
    plus.n_verify = 1;
    plus.depth += 460;
    double free_row = steptime_predict(&m, &plus) - steptime_predict(&m, &four);
    CHECKF(free_row < 0.5 * c.ver, "an unseen verify row predicted %.3g s", free_row);
    for (int i = 0; i < 80; i++) {
        int ver = (i * 5) % 9;
        steptime_x x = { .n_dec = 4, .n_verify = ver, .depth = (4.0 + ver) * (460.0 + i) };
        steptime_observe(&m, &x, curve_at(&c, &x) * (1 + 0.02 * noise()));
    }
    double row = steptime_predict(&m, &plus) - steptime_predict(&m, &four);
    double want = c.ver + c.depth * 460 / 1024.0;
    CHECKF(fabs(row - want) < 0.15 * want, "a verify row %.3g s, the curve says %.3g s (a decode row %.3g)", row, want,
           c.dec + c.depth * 460 / 1024.0);
}

/* Sixteen streams whose prompts are being read beside the decodes: every other step carries
 * a 75-token chunk (~250 ms, +-15 % noise from the machine), the others are decodes alone
 * (4 streams, 0-8 verify rows, ~50-90 ms, +-3 %). Fitted on relative errors, the price of a
 * verify row comes from the small steps, not from the chunks' noise; and a verify row is never
 * priced below a prefill token, even when the fit says less. */
TEST(test_small_steps_not_drowned)
{
    const curve c = { 20e-3, 8e-3, 2.2e-3, 0.5e-3, 5e-3 };
    steptime m;
    steptime_init(&m);
    for (int i = 0; i < 200; i++) {
        steptime_x x;
        double noise_frac;
        if (i % 2) {
            int ver = (i * 3) % 9;
            x = (steptime_x){ .n_dec = 4, .n_verify = ver, .depth = (4.0 + ver) * 500 };
            noise_frac = 0.03;
        } else {
            int dec = 5 + i % 4, ver = (i * 7) % 6;
            x = (steptime_x){ .n_dec = dec, .n_verify = ver, .n_prefill = 75, .depth = (dec + ver) * 500.0 + 75 * 300 };
            noise_frac = 0.15;
        }
        steptime_observe(&m, &x, curve_at(&c, &x) * (1 + noise_frac * noise()));
    }
    steptime_x four = { .n_dec = 4, .depth = 4 * 500.0 }, plus = { .n_dec = 4, .n_verify = 1, .depth = 5 * 500.0 };
    double row = steptime_predict(&m, &plus) - steptime_predict(&m, &four), want = c.ver + c.depth * 500 / 1024.0;
    CHECKF(fabs(row - want) < 0.05 * want, "a verify row %.3g s, the curve says %.3g s", row, want);
    double priced = steptime_verify_row_s(&m) + steptime_depth_s(&m, 500);
    CHECKF(fabs(priced - want) < 0.05 * want, "%.3g s", priced);
    /* a fit that finds verify rows free (here: they are) still prices them as prefill tokens */
    const curve freerows = { 20e-3, 8e-3, 2.2e-3, 0.5e-3, 0 };
    steptime f;
    steptime_init(&f);
    for (int i = 0; i < 100; i++) {
        int ver = i % 5, chunk = i % 3 ? 0 : 64;
        steptime_x x = { .n_dec = 1 + i % 4, .n_verify = ver, .n_prefill = chunk, .depth = 400.0 * (5 + ver) };
        steptime_observe(&f, &x, curve_at(&freerows, &x) * (1 + 0.02 * noise()));
    }
    CHECKF(fabs(steptime_verify_row_s(&f) - freerows.pre) < 0.1 * freerows.pre, "%.3g s", steptime_verify_row_s(&f));
}

/* The curve a worker reports to the gateway (its heartbeat's four terms) is the fit's step,
 * decode row, prefill token and depth terms, whatever else the fit has. */
TEST(test_curve_for_the_gateway)
{
    steptime m;
    steptime_init(&m);
    feed(&m, &g_cpu, 0, 300, 0.01);
    double w[4];
    steptime_curve4(&m, w);
    const double want[4] = { g_cpu.c0, g_cpu.dec, g_cpu.pre, g_cpu.depth };
    for (int i = 0; i < 4; i++) CHECKF(fabs(w[i] - want[i]) < 0.1 * want[i], "term %d: %.3g, the curve's %.3g", i, w[i], want[i]);
}

/* One stream with prompt lookup: every decode step has one decode row and 0-2 verify rows, the
 * depth grows by a position a step, a 400-token prompt now and then, steps +-20 % noisy. The
 * constant, the decode row and the depth hardly vary apart, so an unconstrained fit pays a huge
 * weight with a huge negative one; constrained, no weight is negative and a verify row with its
 * depth is priced as the curve says, within the noise. */
TEST(test_collinear_one_stream)
{
    const curve c = { 22e-3, 3e-3, 2.5e-3, 1e-3, 2e-3 };
    steptime m;
    steptime_init(&m);
    int pos = 0;
    for (int i = 0; i < 400; i++) {
        steptime_x x;
        if (i % 70 == 0) {
            x = (steptime_x){ .n_prefill = 400, .depth = 400.0 * 401 / 2 };
            pos = 400;
        } else {
            int ver = (i * 7) % 3;
            x = (steptime_x){ .n_dec = 1, .n_verify = ver, .depth = (1.0 + ver) * pos };
            pos += 1 + ver / 2;
        }
        steptime_observe(&m, &x, curve_at(&c, &x) * (1 + 0.2 * noise()));
    }
    for (int i = 0; i < STEPTIME_NX; i++) CHECKF(m.w[i] >= 0, "weight %d: %.3g", i, m.w[i]);
    double price = steptime_verify_row_s(&m) + steptime_depth_s(&m, pos), want = c.ver + c.depth * pos / 1024.0;
    CHECKF(fabs(price - want) < 0.35 * want, "a verify row at depth %d: %.3g s, the curve says %.3g s", pos, price, want);
}

int main(void)
{
    RUN(test_fit_predicts_held_out_steps);
    RUN(test_fit_tokens_sizes_to_the_target);
    RUN(test_follows_a_slower_machine);
    RUN(test_degenerate_mix_stays_finite);
    RUN(test_unseen_rows_are_not_guessed_costly);
    RUN(test_verify_rows_priced_apart);
    RUN(test_small_steps_not_drowned);
    RUN(test_curve_for_the_gateway);
    RUN(test_collinear_one_stream);
    HARNESS_END();
}
