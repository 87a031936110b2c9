/*
 * test_spec: speculative decoding. The pure parts (engine/spec.h): prompt lookup drafts, the
 * acceptance estimate, the verify count chosen on step-time curves (checked against a brute
 * force over every count vector) and the acceptance rule of speculative sampling (a
 * chi-square test on a small vocabulary that passes for the rule and fails for a biased one).
 * Then the scheduler on a tiny random llama model: with prompt-lookup drafts, greedy and
 * seeded sampled output equal a run without speculation token for token, alone and batched,
 * with fixed and adaptive verify counts, while drafts are both accepted and rejected; and the
 * KV left after rejections (every position's K and V, every block key) equals the run's
 * without speculation; and the scheduler's verify count priced against the whole step, its
 * prompt chunk included.
 */
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "engine/sched_int.h"
#include "engine/spec.h"
#include "engine/steptime.h"
#include "grammar/grammar.h"
#include "schedtest.h"

/* ---- prompt lookup ---- */

TEST(test_ngram_draft)
{
    int32_t out[SPEC_MAX_K];
    /* ... 1 2 3 4 5 ... 9 1 2 3 -> the 3-gram "1 2 3" recurs: draft 4 5 6 */
    int32_t a[] = { 7, 1, 2, 3, 4, 5, 6, 9, 1, 2, 3 };
    int n = spec_ngram_draft(a, 11, 3, 1, 3, out, NULL);
    CHECK(n == 3 && out[0] == 4 && out[1] == 5 && out[2] == 6);
    /* the most recent occurrence wins: "2 3" after 1 and after 8; where its continuation
     * reaches the end, the draft goes on from itself (11 2 3, then 11 again) */
    int32_t b[] = { 1, 2, 3, 10, 8, 2, 3, 11, 2, 3 };
    n = spec_ngram_draft(b, 10, 2, 1, 4, out, NULL);
    CHECK(n == 4 && out[0] == 11 && out[1] == 2 && out[2] == 3 && out[3] == 11);
    /* longest n first: the 3-gram "5 6 7" (-> 8) beats the more recent 1-gram "7" (-> 9) */
    int32_t c[] = { 5, 6, 7, 8, 0, 7, 9, 5, 6, 7 };
    n = spec_ngram_draft(c, 10, 3, 1, 1, out, NULL);
    CHECK(n == 1 && out[0] == 8);
    /* n_min bounds the shortest suffix: with 2 the lone recurring "7" does not draft */
    int32_t d[] = { 7, 1, 2, 7 };
    CHECK(spec_ngram_draft(d, 4, 3, 2, 2, out, NULL) == 0);
    CHECK(spec_ngram_draft(d, 4, 3, 1, 2, out, NULL) == 2 && out[0] == 1 && out[1] == 2);
    /* no recurrence, too short, k_max 0 */
    int32_t e[] = { 1, 2, 3, 4 };
    CHECK(spec_ngram_draft(e, 4, 3, 1, 4, out, NULL) == 0);
    CHECK(spec_ngram_draft(e, 1, 3, 1, 4, out, NULL) == 0);
    CHECK(spec_ngram_draft(a, 11, 3, 1, 0, out, NULL) == 0);
    /* a loop of period 1 drafts k_max tokens of it, not 1 */
    int32_t f[] = { 4, 4, 4 };
    n = spec_ngram_draft(f, 3, 3, 1, 5, out, NULL);
    CHECK(n == 5 && out[0] == 4 && out[4] == 4);
    /* period 3: 1 2 3 1 2 3 1 -> 2 3 1 2 3 */
    int32_t g[] = { 1, 2, 3, 1, 2, 3, 1 };
    n = spec_ngram_draft(g, 7, 3, 1, 5, out, NULL);
    CHECK(n == 5 && out[0] == 2 && out[1] == 3 && out[2] == 1 && out[3] == 2 && out[4] == 3);
}

/* Each drafted token's confidence: of the matched suffix's earlier occurrences followed by the
 * tokens drafted before it, the share followed by it too, by the rule of succession. */
TEST(test_ngram_confidence)
{
    int32_t out[SPEC_MAX_K];
    float prob[SPEC_MAX_K];
    /* "1 2" went on 3 5, 4 6, 3 7: the most recent says 3 7; 3 follows 2 of 3 occurrences
     * ((2 + 1) / (3 + 2)), 7 follows 1 of the 2 that went on with 3 ((1 + 1) / (2 + 2)) */
    int32_t a[] = { 1, 2, 3, 5, 9, 1, 2, 4, 6, 9, 1, 2, 3, 7, 9, 1, 2 };
    int n = spec_ngram_draft(a, 17, 2, 1, 2, out, prob);
    CHECK(n == 2 && out[0] == 3 && out[1] == 7);
    CHECK(fabsf(prob[0] - 0.6f) < 1e-6f && fabsf(prob[1] - 0.5f) < 1e-6f);
    /* a loop: "6 5 6" occurred at 1 (went on 5 6 5 6) and at 3 (5 6, then the end): the
     * first two drafts have both behind them, the last two only the first */
    int32_t b[] = { 5, 6, 5, 6, 5, 6, 5, 6 };
    n = spec_ngram_draft(b, 8, 3, 1, 4, out, prob);
    CHECK(n == 4 && out[0] == 5 && out[1] == 6 && out[2] == 5 && out[3] == 6);
    CHECK(fabsf(prob[0] - 0.75f) < 1e-6f && fabsf(prob[1] - 0.75f) < 1e-6f);
    CHECK(fabsf(prob[2] - 2.0f / 3) < 1e-6f && fabsf(prob[3] - 2.0f / 3) < 1e-6f);
    /* a loop's first repetition: one occurrence that shows one period; the drafts past the
     * end, which no occurrence shows, take the confidence of the token one period back */
    int32_t c[] = { 4, 4, 4 };
    n = spec_ngram_draft(c, 3, 3, 1, 5, out, prob);
    CHECK(n == 5 && fabsf(prob[0] - 2.0f / 3) < 1e-6f && fabsf(prob[4] - 2.0f / 3) < 1e-6f);
    int32_t e[] = { 8, 1, 2, 3, 9, 1, 2, 3, 1, 2 };   /* "1 2" went on 3 twice, then 9 or 1 */
    n = spec_ngram_draft(e, 10, 2, 1, 5, out, prob);
    CHECK(n == 5 && out[0] == 3 && out[1] == 1 && out[2] == 2 && out[3] == 3 && out[4] == 1);
    CHECK(fabsf(prob[0] - 0.75f) < 1e-6f && fabsf(prob[1] - 0.5f) < 1e-6f && fabsf(prob[2] - 2.0f / 3) < 1e-6f);
    CHECK(fabsf(prob[3] - 0.75f) < 1e-6f && fabsf(prob[4] - 0.5f) < 1e-6f);
    /* the estimate ranks drafts: confident ones gain more under the same running rate */
    spec_seq q;
    spec_seq_init(&q);
    float tested[1] = { 0.6f };
    spec_seq_observe(&q, 1, false, tested);
    double g_loop[2], g_mixed[2];
    float p_loop[2] = { 0.75f, 0.75f }, p_mixed[2] = { 0.6f, 0.5f };
    spec_seq_gains(&q, p_loop, 2, g_loop);
    spec_seq_gains(&q, p_mixed, 2, g_mixed);
    CHECK(g_loop[0] > g_mixed[0] && g_loop[1] > g_mixed[1]);
}

/* With confidences, a token's estimate is its confidence calibrated by every tested draft of
 * the request, whatever its position: drafts whose confident first tokens (0.8) always pass
 * and whose unsure second ones (0.4) never do still expect a confident token at the second or
 * third position to pass (the per-position rate of second tokens is about 0). */
TEST(test_confidence_calibrates_every_position)
{
    spec_seq q;
    spec_seq_init(&q);
    const float seen[2] = { 0.8f, 0.4f };
    for (int i = 0; i < 60; i++) spec_seq_observe(&q, 1, true, seen);
    /* exponential averages that end on a rejection: about 0.46 accepted, 0.58 confidence */
    double cal = q.rate[SPEC_POOLED] / q.mean_prob;
    CHECKF(q.rate[1] < 0.01 && q.rate[SPEC_POOLED] > 0.4 && q.rate[SPEC_POOLED] < 0.6 && q.mean_prob > 0.5 &&
               q.mean_prob < 0.7,
           "second %.3f pooled %.3f mean confidence %.3f", q.rate[1], q.rate[SPEC_POOLED], q.mean_prob);
    double g[3];
    const float loop[3] = { 0.9f, 0.9f, 0.9f }, unsure[2] = { 0.4f, 0.4f };
    spec_seq_gains(&q, loop, 3, g);
    double a = 0.9 * cal;
    CHECKF(fabs(g[0] - a) < 1e-6 && fabs(g[1] - a * a) < 1e-6 && fabs(g[2] - a * a * a) < 1e-6 && g[2] > 0.3,
           "gains %.3f %.3f %.3f", g[0], g[1], g[2]);
    spec_seq_gains(&q, unsure, 2, g);
    CHECKF(fabs(g[0] - 0.4 * cal) < 1e-6 && g[1] < 0.15, "gains %.3f %.3f", g[0], g[1]);
    /* without confidences the per-position rates still rule */
    spec_seq_gains(&q, NULL, 2, g);
    CHECK(g[0] > 0.99 && g[1] < 0.01);
}

/* An estimate with the same rate at every position. */
static spec_seq seq_at(double rate)
{
    spec_seq q;
    spec_seq_init(&q);
    for (int k = 0; k < SPEC_MAX_K; k++) q.rate[k] = q.prior[k] = rate;
    return q;
}

TEST(test_acceptance_estimate)
{
    spec_seq q;
    spec_seq_init(&q);
    CHECK(q.rate[0] == SPEC_ACCEPT_PRIOR && q.rate[SPEC_MAX_K - 1] == SPEC_ACCEPT_PRIOR);
    double g[4];
    spec_seq_gains(&q, NULL, 4, g);
    CHECK(fabs(g[0] - 0.5) < 1e-12 && fabs(g[3] - 0.0625) < 1e-12);
    /* a draft model's own probabilities, calibrated by the request's outcomes: drafts of
     * probability 0.2 always accepted make a 0.2 draft a sure one and a 0.1 draft a 50 %
     * one; a request whose drafts were all rejected expects nothing however confident */
    const float prob[2] = { 0.2f, 0.1f }, seen[4] = { 0.2f, 0.2f, 0.2f, 0.2f };
    spec_seq c;
    spec_seq_init(&c);
    spec_seq_gains(&c, prob, 2, g);   /* nothing tested yet: the rate alone */
    CHECK(fabs(g[0] - 0.5) < 1e-12);
    for (int i = 0; i < 40; i++) spec_seq_observe(&c, 4, false, seen);
    CHECK(fabs(c.mean_prob - 0.2) < 1e-6);
    spec_seq_gains(&c, prob, 2, g);
    CHECK(g[0] > 0.99 && fabs(g[1] - g[0] * 0.5) < 1e-3);
    spec_seq z = { .rate = { 0 }, .mean_prob = 0.2 };
    spec_seq_gains(&z, prob, 2, g);
    CHECK(g[0] == 0 && g[1] == 0);
    for (int i = 0; i < 20; i++) spec_seq_observe(&q, 4, false, NULL);
    CHECK(q.rate[0] > 0.98 && q.rate[3] > 0.98 && q.n_tested == 80 && q.n_accepted == 80);
    CHECK(q.rate[4] == SPEC_ACCEPT_PRIOR);   /* never tested */
    for (int i = 0; i < 20; i++) spec_seq_observe(&q, 0, true, NULL);
    CHECK(q.rate[0] < 0.05 && q.rate[1] > 0.98 && q.n_tested == 100 && q.n_accepted == 80);
    spec_seq_observe(&q, 2, true, NULL);   /* two accepted, then the third rejected */
    CHECK(q.n_tested == 103 && q.n_accepted == 82);
    /* a costly source drafts while the expected gain is worth it, nothing when not even the
     * first token is, one token when probing */
    spec_seq r = seq_at(0.9);
    CHECK(spec_seq_draft_len(&r, 5, 0.05, false) == 5);
    r = seq_at(0.5);   /* 0.5 0.25 0.125 0.0625 0.03 */
    CHECK(spec_seq_draft_len(&r, 8, 0.05, false) == 4);
    CHECK(spec_seq_draft_len(&r, 8, 0.2, false) == 2);   /* a dearer draft step: fewer */
    CHECK(spec_seq_draft_len(&r, 8, 0.2, true) == 2);
    r = seq_at(0.01);
    CHECK(spec_seq_draft_len(&r, 8, 0.05, false) == 0);
    CHECK(spec_seq_draft_len(&r, 8, 0.05, true) == 1);
    CHECK(spec_seq_draft_len(&r, 0, 0.05, true) == 0);
}

/* The rates are per position: drafts whose first token is accepted 3 times in 4 but whose
 * second never is expect nothing of the second (one rate for all positions would expect
 * 0.43 * 0.43 of it), and drafts accepted whole expect their second token as their first. */
TEST(test_acceptance_per_position)
{
    spec_seq q;
    spec_seq_init(&q);
    for (int i = 0; i < 200; i++) {
        if (i % 4 == 3) spec_seq_observe(&q, 0, true, NULL);
        else spec_seq_observe(&q, 1, true, NULL);
    }
    double g[3];
    spec_seq_gains(&q, NULL, 3, g);
    CHECKF(g[0] > 0.55 && g[0] < 0.95 && g[1] < 0.02, "gains %.3f %.3f", g[0], g[1]);
    CHECK(spec_seq_draft_len(&q, 5, 0.05, false) == 1);
    spec_seq w;
    spec_seq_init(&w);
    for (int i = 0; i < 200; i++) {
        if (i % 4 == 3) spec_seq_observe(&w, 0, true, NULL);
        else spec_seq_observe(&w, 3, false, NULL);
    }
    spec_seq_gains(&w, NULL, 3, g);
    CHECKF(g[1] > 0.98 * g[0] && g[2] > 0.98 * g[0], "gains %.3f %.3f %.3f", g[0], g[1], g[2]);
}

/* A request's estimate: the prior until the source has tested enough drafts server-wide,
 * then the server-wide rate; a position the request has tested weighs the server-wide rate by
 * what is left of its prior, one it has not follows it as it learns. */
TEST(test_prior_from_all_requests)
{
    spec_seq all, q;
    spec_seq_init_shared(&all);
    for (int i = 0; i < SPEC_PRIOR_MIN_TESTED - 1; i++) spec_seq_observe(&all, 0, true, NULL);
    spec_seq_init(&q);
    spec_seq_prior(&q, &all);
    CHECK(q.rate[0] == SPEC_ACCEPT_PRIOR);
    spec_seq_observe(&all, 0, true, NULL);
    spec_seq_prior(&q, &all);
    CHECK(q.rate[0] == all.rate[0] && q.rate[0] < 0.4 && q.rate[1] == all.rate[1]);
    spec_seq mine;
    spec_seq_init(&mine);
    for (int i = 0; i < 10; i++) spec_seq_observe(&mine, 1, true, NULL);   /* first always, second never */
    double first = mine.rate[0];
    spec_seq_prior(&mine, &all);
    CHECKF(fabs(mine.rate[0] - first) < 0.15 * (1 - all.rate[0]) + 1e-12, "%.3f after %.3f", mine.rate[0], first);
    CHECK(mine.rate[2] == all.rate[2]);   /* never tested: the server's */
    /* the server learns that second tokens are poor from other requests: a request that has
     * not verified second tokens expects what the server does of them */
    spec_seq fresh;
    spec_seq_init(&fresh);
    for (int i = 0; i < 3; i++) spec_seq_observe(&fresh, 1, false, NULL);   /* only first tokens tested */
    spec_seq_prior(&fresh, &all);
    double before = fresh.rate[1];
    for (int i = 0; i < 40; i++) spec_seq_observe(&all, 1, true, NULL);
    spec_seq_prior(&fresh, &all);
    CHECKF(fresh.rate[1] < 0.1 && fresh.rate[1] < before, "second tokens: %.3f (was %.3f)", fresh.rate[1], before);
    CHECK(fresh.rate[0] > 0.4);
}

/* Probes: due at once, then after SPEC_PROBE_STEPS quiet decode steps; a probe that accepts
 * nothing doubles the gap up to SPEC_PROBE_MAX, one that accepts resets it. A draft model whose
 * drafts are never accepted then drafts on a vanishing share of the steps. */
TEST(test_probe_backs_off)
{
    spec_probe p;
    spec_probe_init(&p);
    CHECK(spec_probe_due(&p));
    spec_probe_step(&p, 1, 0);   /* the first probe: rejected */
    int quiet = 0;
    while (!spec_probe_due(&p)) {
        spec_probe_step(&p, 0, 0);
        quiet++;
    }
    CHECKF(quiet == 2 * SPEC_PROBE_STEPS, "%d", quiet);
    spec_probe_step(&p, 2, 1);   /* accepted: back to the short gap */
    for (int i = 0; i < SPEC_PROBE_STEPS - 1; i++) spec_probe_step(&p, 0, 0);
    CHECK(!spec_probe_due(&p));
    spec_probe_step(&p, 0, 0);
    CHECK(spec_probe_due(&p));
    /* poor drafts: a step with drafts verified only when the probe is due */
    spec_probe_init(&p);
    int probes = 0, steps = 4096;
    for (int i = 0; i < steps; i++) {
        bool v = spec_probe_due(&p);
        probes += v;
        spec_probe_step(&p, v, 0);
    }
    CHECKF(probes <= 6 + steps / SPEC_PROBE_MAX + 1, "%d probes in %d steps", probes, steps);
    CHECK(p.gap == SPEC_PROBE_MAX);
}

/* ---- the verify count on step-time curves ---- */

typedef struct {
    int base;                   /* tokens of the step without drafts */
    const double *ms;           /* (n_pts) recorded step ms at tokens[i] */
    const int *tokens;
    int n_pts;
    double round_ms;            /* what a round costs beside the step (a draft model's steps) */
} curve;

/* Piecewise-linear interpolation of a recorded curve at base + n_extra tokens. */
static double curve_time(void *arg, int n_extra)
{
    const curve *c = arg;
    double x = c->base + n_extra;
    if (x <= c->tokens[0]) return c->ms[0] / 1e3;
    for (int i = 1; i < c->n_pts; i++)
        if (x <= c->tokens[i]) {
            double f = (x - c->tokens[i - 1]) / (c->tokens[i] - c->tokens[i - 1]);
            return (c->ms[i - 1] + f * (c->ms[i] - c->ms[i - 1])) / 1e3;
        }
    int i = c->n_pts - 1;
    double slope = (c->ms[i] - c->ms[i - 1]) / (c->tokens[i] - c->tokens[i - 1]);
    return (c->ms[i] + slope * (x - c->tokens[i])) / 1e3;
}

/* The best ratio over every count vector (k_i in 0..n_draft[i], sum <= max_extra), and the
 * fewest tokens reaching it. */
static double brute_best(int n, const double *gains, const int *nd, int max_extra, curve *c, int *best_sum)
{
    int k[8] = { 0 };
    double best = -1;
    *best_sum = 0;
    for (;;) {
        int sum = 0;
        double e = c->base;
        for (int i = 0; i < n; i++) {
            sum += k[i];
            for (int j = 0; j < k[i]; j++) e += gains[i * SPEC_MAX_K + j];
        }
        if (sum <= max_extra) {
            double r = e / (curve_time(c, sum) + c->round_ms / 1e3);
            if (r > best * (1 + 1e-9) || (fabs(r - best) <= best * 1e-9 && sum < *best_sum)) {
                if (r > best * (1 + 1e-9)) *best_sum = sum;
                else *best_sum = TM_MIN(*best_sum, sum);
                best = TM_MAX(best, r);
            }
        }
        int i = 0;
        while (i < n && k[i] == nd[i]) k[i++] = 0;
        if (i == n) break;
        k[i]++;
    }
    return best;
}

static double ratio_of(int n, const double *gains, const int *k, curve *c)
{
    int sum = 0;
    double e = c->base;
    for (int i = 0; i < n; i++) {
        sum += k[i];
        for (int j = 0; j < k[i]; j++) e += gains[i * SPEC_MAX_K + j];
    }
    return e / (curve_time(c, sum) + c->round_ms / 1e3);
}

TEST(test_choose_on_recorded_curves)
{
    /* a memory-bound CPU step: flat while the weights' reading dominates, then each token's
     * FLOPs show (the knee); and a compute-bound one: every token costs its share at once */
    static const int pts[] = { 1, 8, 16, 32, 64 };
    static const double flat_ms[] = { 20.0, 20.4, 21.0, 27.0, 45.0 };
    static const double steep_ms[] = { 2.0, 16.0, 32.0, 64.0, 128.0 };
    spec_chooser *ch = spec_chooser_new(8);
    CHECK(ch != NULL);
    util_rng rng;
    util_rng_seed(&rng, 7);
    double gains[8 * SPEC_MAX_K];
    int nd[8], k[8];
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + trial % 4;
        /* a third of the trials with a draft model's round beside the step */
        curve c = { .base = n, .ms = trial % 2 ? steep_ms : flat_ms, .tokens = pts, .n_pts = 5,
                    .round_ms = trial % 3 == 2 ? 5.0 * (1 + trial % 7) : 0 };
        for (int i = 0; i < n; i++) {
            spec_seq q = seq_at(util_rng_uniform(&rng));
            nd[i] = (int)(util_rng_next(&rng) % 6);
            spec_seq_gains(&q, NULL, nd[i], gains + i * SPEC_MAX_K);
        }
        int max_extra = trial % 5 == 0 ? 3 : 64;
        int sum = spec_choose(ch, n, gains, nd, n, max_extra, curve_time, &c, c.round_ms / 1e3, k);
        int want_sum;
        double want = brute_best(n, gains, nd, max_extra, &c, &want_sum);
        int ksum = 0;
        bool in_range = true;
        for (int i = 0; i < n; i++) {
            ksum += k[i];
            in_range &= k[i] >= 0 && k[i] <= nd[i];
        }
        CHECKF(in_range && ksum == sum && sum <= max_extra, "trial %d", trial);
        double got = ratio_of(n, gains, k, &c);
        CHECKF(fabs(got - want) <= want * 1e-9 && sum == want_sum, "trial %d: ratio %g want %g, sum %d want %d", trial,
               got, want, sum, want_sum);
    }
    /* the plain cases: sure drafts on the flat curve verify everything; poor drafts on the
     * steep curve verify nothing; no drafts, nothing */
    curve flat = { .base = 4, .ms = flat_ms, .tokens = pts, .n_pts = 5 };
    curve steep = { .base = 4, .ms = steep_ms, .tokens = pts, .n_pts = 5 };
    for (int i = 0; i < 4; i++) {
        spec_seq q = seq_at(0.95);
        nd[i] = 3;
        spec_seq_gains(&q, NULL, 3, gains + i * SPEC_MAX_K);
    }
    CHECK(spec_choose(ch, 4, gains, nd, 4, 64, curve_time, &flat, 0, k) == 12);
    for (int i = 0; i < 4; i++) CHECK(k[i] == 3);
    for (int i = 0; i < 4; i++) {
        spec_seq q = seq_at(0.05);
        spec_seq_gains(&q, NULL, 3, gains + i * SPEC_MAX_K);
    }
    CHECK(spec_choose(ch, 4, gains, nd, 4, 64, curve_time, &steep, 0, k) == 0);
    for (int i = 0; i < 4; i++) CHECK(k[i] == 0);
    /* drafts accepted half the time on the steep curve (2 ms a token): not worth a row when
     * the round is the step alone (8 ms for 4 tokens); when a draft model's steps add 40 ms to
     * the round, the first two drafts of each (gains 0.5 and 0.25 for 2 ms) raise the tokens
     * per second and the third (0.125) does not */
    for (int i = 0; i < 4; i++) {
        spec_seq q = seq_at(0.5);
        spec_seq_gains(&q, NULL, 3, gains + i * SPEC_MAX_K);
    }
    CHECK(spec_choose(ch, 4, gains, nd, 4, 64, curve_time, &steep, 0, k) == 0);
    CHECK(spec_choose(ch, 4, gains, nd, 4, 64, curve_time, &steep, 0.040, k) == 8);
    for (int i = 0; i < 4; i++) CHECK(k[i] == 2);
    for (int i = 0; i < 4; i++) nd[i] = 0;
    CHECK(spec_choose(ch, 4, gains, nd, 4, 64, curve_time, &flat, 0, k) == 0);
    /* unknown time, too many sequences */
    curve none = { .base = 1, .ms = (const double[]){ 0, 0 }, .tokens = (const int[]){ 1, 2 }, .n_pts = 2 };
    CHECK(spec_choose(ch, 1, gains, nd, 1, 4, curve_time, &none, 0, k) == -1);
    CHECK(spec_choose(ch, 9, gains, nd, 9, 4, curve_time, &flat, 0, k) == -1);
    spec_chooser_free(ch);
}

/* The verify count from the learned step time (steptime.h), as the scheduler feeds it: the
 * steps of a linear curve learned, K grows with the acceptance estimate. */
typedef struct {
    steptime *tm;
    int n_dec;
} learned;

static double learned_time(void *arg, int n_extra)
{
    const learned *l = arg;
    steptime_x x = { .n_dec = l->n_dec, .n_verify = n_extra, .depth = (l->n_dec + n_extra) * 200.0 };
    return steptime_predict(l->tm, &x);
}

TEST(test_choose_on_learned_step_time)
{
    steptime tm;
    steptime_init(&tm);
    for (int i = 0; i < 64; i++) {   /* 20 ms a step + 0.5 ms a row */
        int dec = 1 + i % 3, rows = dec + (i * 7) % 22;
        steptime_x x = { .n_dec = dec, .n_verify = rows - dec, .depth = rows * 200.0 };
        steptime_observe(&tm, &x, 0.020 + 0.0005 * rows);
    }
    CHECK(steptime_warm(&tm));
    spec_chooser *ch = spec_chooser_new(2);
    learned l = { .tm = &tm, .n_dec = 2 };
    int nd[2] = { 5, 5 }, k[2], prev = -1;
    double gains[2 * SPEC_MAX_K];
    for (double rate = 0.0; rate <= 1.0; rate += 0.1) {
        spec_seq q = seq_at(rate);
        spec_seq_gains(&q, NULL, 5, gains);
        spec_seq_gains(&q, NULL, 5, gains + SPEC_MAX_K);
        int sum = spec_choose(ch, 2, gains, nd, 2, 64, learned_time, &l, 0, k);
        CHECKF(sum >= prev, "rate %.1f: %d after %d", rate, sum, prev);
        prev = sum;
    }
    CHECK(prev == 10);   /* sure drafts at 0.5 ms a row next to a 20 ms step: all of them */
    spec_chooser_free(ch);
}

/* ---- the acceptance rule ---- */

#define CHI_N 6
#define CHI_SAMPLES 200000

/* The chi-square statistic of counts against probabilities p over CHI_N outcomes. */
static double chi_square(const long *counts, const float *p, long n)
{
    double x2 = 0;
    for (int i = 0; i < CHI_N; i++) {
        double e = p[i] * (double)n;
        x2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    return x2;
}

/* Draws from probabilities w (CHI_N) with u. */
static int draw(const float *w, double u)
{
    double acc = 0;
    for (int i = 0; i < CHI_N; i++) {
        acc += w[i];
        if (u < acc) return i;
    }
    return CHI_N - 1;
}

/* A plausible but wrong rule: on rejection, draw from the target itself instead of the
 * residual max(0, p - q): the draft's mass is counted twice. */
static int32_t biased_verify(const float *p, const float *q, int32_t d, double ua, double ur, bool *acc)
{
    *acc = ua < p[d] / q[d];
    return *acc ? d : draw(p, ur);
}

TEST(test_speculative_sampling_keeps_distribution)
{
    /* target and draft disagree a lot (the draft favours what the target rarely picks) */
    const float p[CHI_N] = { 0.30f, 0.25f, 0.20f, 0.15f, 0.07f, 0.03f };
    const float q[CHI_N] = { 0.05f, 0.10f, 0.15f, 0.20f, 0.20f, 0.30f };
    const float onehot[CHI_N] = { 0, 0, 1, 0, 0, 0 };
    /* 5 degrees of freedom: 20.5 is the 0.1 % critical value; the seeds are fixed, so the
     * statistics below are the same on every run */
    const double crit = 20.5;
    util_rng rng;
    util_rng_seed(&rng, 1234);
    long good[CHI_N] = { 0 }, bad[CHI_N] = { 0 }, hot[CHI_N] = { 0 }, n_acc = 0;
    for (long s = 0; s < CHI_SAMPLES; s++) {
        int32_t d = draw(q, util_rng_uniform(&rng));
        double ua = util_rng_uniform(&rng), ur = util_rng_uniform(&rng);
        bool acc;
        int32_t t = spec_verify_token(p, q, CHI_N, d, ua, ur, &acc);
        CHECK(t >= 0 && t < CHI_N && acc == (t == d && ua < p[d] / q[d]));
        good[t]++;
        n_acc += acc;
        bool bacc;
        bad[biased_verify(p, q, d, ua, ur, &bacc)]++;
        /* a deterministic draft (prompt lookup): q one-hot on token 2 */
        hot[spec_verify_token(p, onehot, CHI_N, 2, ua, ur, &acc)]++;
    }
    double x_good = chi_square(good, p, CHI_SAMPLES), x_bad = chi_square(bad, p, CHI_SAMPLES);
    double x_hot = chi_square(hot, p, CHI_SAMPLES);
    CHECKF(x_good < crit, "chi-square %.2f", x_good);
    CHECKF(x_hot < crit, "one-hot chi-square %.2f", x_hot);
    CHECKF(x_bad > 10 * crit, "the biased rule's chi-square %.2f should fail the bound", x_bad);
    /* the acceptance rate is sum min(p, q) = 0.05 + 0.10 + 0.15 + 0.15 + 0.07 + 0.03 = 0.55 */
    double rate = (double)n_acc / CHI_SAMPLES;
    CHECKF(fabs(rate - 0.55) < 0.01, "acceptance %.4f", rate);
    bool acc;
    CHECK(spec_verify_token(p, q, CHI_N, CHI_N, 0.5, 0.5, &acc) == -1);
    /* p == q: always accepted */
    CHECK(spec_verify_token(p, p, CHI_N, 5, 0.999, 0.5, &acc) == 5 && acc);
}

/* ---- the scheduler: output and KV equal a run without speculation ---- */

static char tmpdir[] = "/tmp/tm_test_spec_XXXXXX";
static model *g_model;

typedef struct {
    engine *e;
    model *draft_model;         /* the model cut to its first layers (self-speculation) */
    engine *draft;
    sched *s;
} rig;

/* Layers of the draft model of the next runs with SPEC_SRC_MODEL (all of them: the draft is
 * the target itself). */
static int g_draft_layers;
/* When set, the draft model instead: the same vocabulary with other random weights, whose
 * drafts the target almost never accepts. */
static model *g_poor_draft;

static rig rig_new(int spec_sources, int spec_max, int spec_fixed)
{
    rig r = { 0 };
    engine_opts eo = { .n_threads = 2, .n_kv_blocks = 64, .max_batch_tokens = 128 };
    char err[256];
    if (engine_new(g_model, &eo, &r.e, err, sizeof err) != ENGINE_OK) fprintf(stderr, "%s\n", err);
    sched_opts so = { .max_seqs = 4, .max_queue = 16, .step_tokens = 96, .n_ctx = 1024,
                      .spec_sources = spec_sources, .spec_max = spec_max, .spec_fixed = spec_fixed };
    if (spec_sources & SPEC_SRC_MODEL) {
        r.draft_model = xmalloc(sizeof *r.draft_model);
        *r.draft_model = g_poor_draft ? *g_poor_draft : *g_model;   /* shares the weights */
        if (!g_poor_draft) r.draft_model->hp.n_layers = g_draft_layers;   /* the engine reads only those */
        if (engine_new(r.draft_model, &eo, &r.draft, err, sizeof err) != ENGINE_OK) fprintf(stderr, "%s\n", err);
        so.draft = r.draft;
    }
    for (int i = 0; i < 4; i++) so.eos_ids[i] = -1;
    if (sched_new(r.e, &so, &r.s) != SCHED_OK) fprintf(stderr, "sched_new failed\n");
    return r;
}

static void rig_free(rig *r)
{
    sched_free(r->s);
    engine_free(r->draft);
    free(r->draft_model);
    engine_free(r->e);
}

/* What a request left in the KV pool when it finished (the kv_out hook). */
typedef struct {
    int n_done;                 /* positions valid */
    float *kv;                  /* (n_done, layers, kv heads, 2, head_dim) */
    int n_keyed;                /* keyed blocks */
    uint8_t keys[8][32];
} kv_dump;

static void dump_kv(void *arg, const kvpool *pool, const kvpool_seq *seq, int n_done)
{
    kv_dump *d = arg;
    const model_hparams *hp = &g_model->hp;
    int hd = hp->head_dim, per = hp->n_layers * hp->n_kv_heads * 2 * hd;
    d->n_done = n_done;
    d->kv = xmalloc((size_t)n_done * per * sizeof(float));
    for (int pos = 0; pos < n_done; pos++)
        for (int l = 0; l < hp->n_layers; l++)
            for (int h = 0; h < hp->n_kv_heads; h++) {
                float *k = d->kv + (size_t)pos * per + ((size_t)l * hp->n_kv_heads + h) * 2 * hd;
                kvpool_seq_load(pool, seq, pos, l, h, k, k + hd);
            }
    d->n_keyed = kvpool_seq_n_keyed(seq) / KVPOOL_BLOCK;
    for (int b = 0; b < d->n_keyed && b < 8; b++) memcpy(d->keys[b], kvpool_seq_block_key(pool, seq, b), 32);
}

#define NREQ 4
#define GEN 150

typedef struct {
    int32_t toks[NREQ][GEN];
    int n[NREQ];
    kv_dump kv[NREQ];
    sched_stats st;
} run_out;

/* A prompt that repeats itself (what prompt lookup drafts from), different per request. */
static void prompt_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++) t[i] = (seed * 13 + (i % 11) * 7 + (i % 3)) % 100;
}

/* The grammar and vocabulary of the next runs (NULL: unconstrained). */
static grammar *g_grammar;
static grammar_vocab *g_gvocab;

/* Runs n_req requests at once (sampled with a seed when temp > 0) and collects tokens and KV. */
static void run(int spec_sources, int spec_max, int spec_fixed, int n_req, float temp, run_out *o)
{
    memset(o, 0, sizeof *o);
    rig g = rig_new(spec_sources, spec_max, spec_fixed);
    static int32_t prompts[NREQ][120];
    sched_req *r[NREQ];
    for (int i = 0; i < n_req; i++) {
        prompt_of(prompts[i], 90 + 10 * i, i);
        sched_params p = { .prompt = prompts[i], .n_prompt = 90 + 10 * i, .max_tokens = GEN };
        p.sample = sample_params_default();
        p.sample.temp = temp;
        p.sample.seed = 100 + (uint64_t)i;
        if (temp > 0) {   /* the whole chain: penalties and a bias as well */
            p.sample.repeat_penalty = 1.1f;
            p.sample.presence_penalty = 0.2f;
            p.sample.n_bias = 1;
            p.sample.bias_id[0] = 5;
            p.sample.bias[0] = 2.0f;
        }
        p.think_start = p.think_end = -1;
        p.grammar = g_grammar;
        p.grammar_vocab = g_gvocab;
        p.kv_out = dump_kv;
        p.kv_arg = &o->kv[i];
        if (sched_submit(g.s, &p, &r[i]) != SCHED_OK) r[i] = NULL;
    }
    for (int i = 0; i < n_req; i++) {
        if (!r[i]) continue;
        o->n[i] = TM_MIN(schedtest_drain(r[i], o->toks[i], GEN, NULL), GEN);
        sched_release(r[i]);
    }
    sched_get_stats(g.s, &o->st);
    rig_free(&g);
}

static void run_free(run_out *o)
{
    for (int i = 0; i < NREQ; i++) free(o->kv[i].kv);
}

static bool same_kv(const kv_dump *a, const kv_dump *b)
{
    const model_hparams *hp = &g_model->hp;
    size_t per = (size_t)hp->n_layers * hp->n_kv_heads * 2 * hp->head_dim;
    return a->n_done == b->n_done && a->n_keyed == b->n_keyed &&
           !memcmp(a->keys, b->keys, (size_t)TM_MIN(a->n_keyed, 8) * 32) &&
           !memcmp(a->kv, b->kv, (size_t)a->n_done * per * sizeof(float));
}

/* The same tokens and the same KV and keyed blocks left behind, request by request. */
static void compare_outputs(const run_out *want, const run_out *got, int n_req, const char *what)
{
    for (int i = 0; i < n_req; i++) {
        CHECKF(got->n[i] == GEN && want->n[i] == GEN, "%s: request %d: %d and %d tokens", what, i, got->n[i], want->n[i]);
        int diff = -1;
        for (int j = 0; j < GEN && diff < 0; j++)
            if (got->toks[i][j] != want->toks[i][j]) diff = j;
        CHECKF(diff < 0, "%s: request %d differs at token %d", what, i, diff);
        CHECKF(same_kv(&want->kv[i], &got->kv[i]), "%s: request %d: KV after rejections differs (%d / %d positions, "
               "%d / %d blocks keyed)", what, i, got->kv[i].n_done, want->kv[i].n_done, got->kv[i].n_keyed,
               want->kv[i].n_keyed);
    }
}

static void compare_ex(const run_out *want, const run_out *got, int n_req, const char *what, bool all_accepted)
{
    compare_outputs(want, got, n_req, what);
    /* drafts were verified, some accepted and some rejected: both paths ran */
    const sched_stats *st = &got->st;
    CHECKF(st->spec_verified > 0 && st->spec_accepted > 0 &&
           (all_accepted ? st->spec_accepted == st->spec_verified : st->spec_accepted < st->spec_verified),
           "%s: drafted %llu verified %llu accepted %llu", what, (unsigned long long)st->spec_drafted,
           (unsigned long long)st->spec_verified, (unsigned long long)st->spec_accepted);
    CHECKF(st->spec_drafted >= st->spec_verified && st->spec_verifies > 0, "%s", what);
    if (getenv("TEST_SPEC_VERBOSE"))
        fprintf(stderr, "  %s: drafted %llu verified %llu accepted %llu in %llu verifies, %llu steps\n", what,
                (unsigned long long)st->spec_drafted, (unsigned long long)st->spec_verified,
                (unsigned long long)st->spec_accepted, (unsigned long long)st->spec_verifies,
                (unsigned long long)st->n_steps);
    /* fewer steps than tokens: the accepted drafts took none of their own */
    CHECKF(st->n_gen_tokens == (uint64_t)(n_req * GEN), "%s: %llu tokens", what, (unsigned long long)st->n_gen_tokens);
}

static void compare(const run_out *want, const run_out *got, int n_req, const char *what)
{
    compare_ex(want, got, n_req, what, false);
}

TEST(test_greedy_identity_and_rollback)
{
    static run_out base, fixed, adaptive;
    for (int n_req = 1; n_req <= NREQ; n_req += NREQ - 1) {
        run(0, 0, 0, n_req, 0, &base);
        CHECK(base.st.spec_drafted == 0 && base.st.spec_verified == 0);
        run(SPEC_SRC_NGRAM, 5, 3, n_req, 0, &fixed);
        compare(&base, &fixed, n_req, n_req == 1 ? "greedy, K 3, alone" : "greedy, K 3, batched");
        uint64_t k_hist = 0;
        for (int k = 0; k <= SPEC_MAX_K; k++) k_hist += fixed.st.spec_k_hist[k];
        CHECK(k_hist > 0 && fixed.st.spec_k_hist[4] == 0 && fixed.st.spec_k_hist[5] == 0);   /* never above 3 */
        run(SPEC_SRC_NGRAM, 5, 0, n_req, 0, &adaptive);
        compare(&base, &adaptive, n_req, n_req == 1 ? "greedy, adaptive, alone" : "greedy, adaptive, batched");
        run_free(&base);
        run_free(&fixed);
        run_free(&adaptive);
    }
}

TEST(test_sampled_identity)
{
    /* seeded sampling with temperature, top-k/p, min-p, penalties and a bias: the scheduler
     * samples every row as its own decode would, so the tokens equal the run's without
     * speculation (the law is kept as well: test_speculative_sampling_keeps_distribution) */
    static run_out base, spec;
    run(0, 0, 0, NREQ, 0.8f, &base);
    run(SPEC_SRC_NGRAM, 4, 2, NREQ, 0.8f, &spec);
    compare(&base, &spec, NREQ, "sampled, K 2, batched");
    run_free(&base);
    run_free(&spec);
}

TEST(test_draft_model)
{
    static run_out base, spec;
    run(0, 0, 0, NREQ, 0, &base);
    /* the draft is the target itself: every greedy draft is accepted */
    g_draft_layers = g_model->hp.n_layers;
    run(SPEC_SRC_MODEL, 4, 0, NREQ, 0, &spec);
    compare_ex(&base, &spec, NREQ, "draft model = target, greedy", true);
    run_free(&spec);
    /* self-speculation on the first layer: drafts accepted and rejected, alone and batched
     * (with a fixed count: the adaptive one drafts these poor drafts only in the few probes
     * the probe budget allows, too few to be sure of both outcomes) */
    g_draft_layers = 1;
    run(SPEC_SRC_MODEL, 4, 2, NREQ, 0, &spec);
    compare(&base, &spec, NREQ, "first layer drafts, greedy, batched");
    run_free(&spec);
    run(SPEC_SRC_MODEL, 3, 3, 1, 0, &spec);
    compare(&base, &spec, 1, "first layer drafts, greedy, alone");
    run_free(&spec);
    /* both sources on: each request drafts from the one it accepts more of */
    run(SPEC_SRC_MODEL | SPEC_SRC_NGRAM, 4, 0, NREQ, 0, &spec);
    compare(&base, &spec, NREQ, "prompt lookup + first layer drafts, greedy");
    run_free(&spec);
    run_free(&base);
    /* sampled: greedy drafts are deterministic (q one-hot), the law and the tokens are kept */
    run(0, 0, 0, NREQ, 0.8f, &base);
    run(SPEC_SRC_MODEL, 4, 2, NREQ, 0.8f, &spec);
    compare(&base, &spec, NREQ, "first layer drafts, sampled");
    run_free(&spec);
    run_free(&base);
    /* a draft of another vocabulary is refused */
    model other = *g_model;
    other.hp.n_vocab = g_model->hp.n_vocab - 1;
    engine_opts eo = { .n_threads = 1, .n_kv_blocks = 8, .max_batch_tokens = 32 };
    engine *e = NULL, *d = NULL;
    char err[256];
    CHECK(engine_new(g_model, &eo, &e, err, sizeof err) == ENGINE_OK);
    CHECK(engine_new(&other, &eo, &d, err, sizeof err) == ENGINE_OK);
    sched_opts so = { .spec_sources = SPEC_SRC_MODEL, .draft = d };
    sched *s = NULL;
    CHECK(sched_new(e, &so, &s) == SCHED_ERR_ARG && s == NULL);
    engine_free(d);
    engine_free(e);
}

/* A new server, before a cheap draft's drafts (the target's first layer) were tested often
 * enough to give new requests a measured prior. A short request drafts while the step time is
 * not learned (a catch-up is then free), too briefly to prove the draft. The next request's
 * 400-token prompt would cost the draft 400 tokens of catch-up, far more than the 2 % of the
 * time since the last probe that probes may take, so it drafts nothing (it used to start from
 * the prior 0.5, which a draft this cheap pays for, and catch up). With a budget made huge, a
 * request still drafts nothing while the catch-up price measured on the drafting model says
 * its catch-up is dearer still, and drafts once that price is cheap: the budget, priced by
 * the measured catch-ups, is what decides. */
TEST(test_unproven_draft_waits_for_the_probe_budget)
{
    g_draft_layers = 1;
    rig g = rig_new(SPEC_SRC_MODEL, 4, 0);
    if (g.s) {
        static int32_t prompts[4][400], out[GEN];
        const int n_prompt[4] = { 96, 400, 400, 400 }, n_gen[4] = { 5, 8, 8, 16 };
        uint64_t drafted[4] = { 0 }, verified0 = 0;
        for (int i = 0; i < 4; i++) {
            prompt_of(prompts[i], n_prompt[i], 7 + i);
            /* white-box, set while the engine thread has nothing to do */
            pthread_mutex_lock(&g.s->mu);
            if (i == 1)   /* the first request's 96-token catch-up was timed */
                CHECKF(g.s->dr[0].catchup_tok_s > 0, "catch-up %.3g s a token", g.s->dr[0].catchup_tok_s);
            if (i >= 1) {
                /* a draft step a quarter of a target step, as 7 of 28 layers are (on these tiny
                 * models fixed costs make it cost about a whole step, and the rig's layer cut
                 * reads every layer's weights as its floor, so it would not draft at all) */
                g.s->dr[0].step_s = 0.25 * g.s->main_step_s;
                g.s->dr[0].cost_floor = 0.25;
            }
            if (i >= 2) {   /* the last probe a million seconds ago: a budget of 20,000 s */
                g.s->dr[0].probe_t = util_now() - 1e6;
                g.s->dr[0].catchup_tok_s = i == 2 ? 1e3 : 0;   /* 400,000 s for the catch-up, then free */
            }
            pthread_mutex_unlock(&g.s->mu);
            sched_params p = { .prompt = prompts[i], .n_prompt = n_prompt[i], .max_tokens = n_gen[i] };
            p.sample = sample_params_default();
            p.sample.temp = 0;
            p.think_start = p.think_end = -1;
            sched_req *r;
            sched_stats before, after;
            sched_get_stats(g.s, &before);
            CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
            CHECK(schedtest_drain(r, out, GEN, NULL) == n_gen[i]);
            sched_release(r);
            sched_get_stats(g.s, &after);
            drafted[i] = after.spec_drafted - before.spec_drafted;
            if (i == 0) verified0 = after.spec_verified;
        }
        if (getenv("TEST_SPEC_VERBOSE"))
            fprintf(stderr, "unproven: drafted %llu, %llu, %llu, %llu (first verified %llu)\n", (unsigned long long)drafted[0],
                    (unsigned long long)drafted[1], (unsigned long long)drafted[2], (unsigned long long)drafted[3],
                    (unsigned long long)verified0);
        CHECKF(verified0 < SPEC_PRIOR_MIN_TESTED, "the first request verified %llu drafts", (unsigned long long)verified0);
        CHECKF(drafted[1] == 0, "the long request drafted %llu tokens", (unsigned long long)drafted[1]);
        CHECKF(drafted[2] == 0, "priced by its measured catch-ups, a request drafted %llu tokens", (unsigned long long)drafted[2]);
        CHECKF(drafted[3] > 0, "with the budget to spare, a request drafted nothing");
    }
    rig_free(&g);
}

/* A draft model whose drafts are almost never accepted: the output is the target's, and once
 * its acceptance shows that its steps do not pay it drafts only for probes (one request per gap
 * of the server's steps), not on every step of every request. */
TEST(test_poor_draft_model)
{
    tiny_cfg c = { .arch = "llama", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                   .head_dim = 16, .ffn = 96, .vocab = 100, .seed = 99 };
    char path[300], err[256];
    snprintf(path, sizeof path, "%s/other.gguf", tmpdir);
    CHECK(tiny_write(&c, path) == 0);
    CHECK(model_load(path, NULL, &g_poor_draft, err, sizeof err) == GGUF_OK);
    if (!g_poor_draft) return;
    static run_out base, fixed, spec;
    run(0, 0, 0, NREQ, 0, &base);
    /* one draft verified every step: the draft is poor (how often the adaptive run below
     * verifies depends on the time its probes may take, too few to judge the draft by) */
    run(SPEC_SRC_MODEL, 4, 1, NREQ, 0, &fixed);
    compare_outputs(&base, &fixed, NREQ, "a poor draft model, K = 1, greedy");
    if (getenv("TEST_SPEC_VERBOSE")) fprintf(stderr, "poor, K = 1: verified %llu accepted %llu\n", (unsigned long long)fixed.st.spec_verified, (unsigned long long)fixed.st.spec_accepted);
    CHECKF(fixed.st.spec_verified > 100 && fixed.st.spec_accepted * 4 < fixed.st.spec_verified,
           "accepted %llu of %llu: not a poor draft", (unsigned long long)fixed.st.spec_accepted,
           (unsigned long long)fixed.st.spec_verified);
    run(SPEC_SRC_MODEL, 4, 0, NREQ, 0, &spec);
    compare_outputs(&base, &spec, NREQ, "a poor draft model, greedy");
    const sched_stats *st = &spec.st;
    if (getenv("TEST_SPEC_VERBOSE")) fprintf(stderr, "poor: drafted %llu verified %llu accepted %llu\n", (unsigned long long)st->spec_drafted, (unsigned long long)st->spec_verified, (unsigned long long)st->spec_accepted);
    CHECKF(st->spec_drafted < NREQ * GEN / 8, "drafted %llu tokens for %d requests of %d", (unsigned long long)st->spec_drafted,
           NREQ, GEN);
    run_free(&spec);
    run_free(&fixed);
    run_free(&base);
    model_free(g_poor_draft);
    g_poor_draft = NULL;
}

/* The scheduler prices drafts against the step as it will run. Two decodes whose drafts pass
 * 18 % of the time, on a learned curve of 20 ms a step + 8 ms a decode + 4 ms a verify row + 1
 * ms a prompt token: beside the decodes alone a verify row costs more than it yields (2.18
 * tokens in 40 ms against 2 in 36), so none is verified; beside the 94-token chunk of a prompt
 * being read (the step budget less the decodes) the step takes 130 ms for its 3 running
 * requests and a first draft pays (3.18 tokens in 134 ms against 3 in 130; a second one, 3 %
 * likely, does not). Pricing the drafts against the decodes alone would verify none in both.
 * White-box: the counts are set on requests made up here, under the scheduler's lock while its
 * engine thread has nothing to do. */
TEST(test_count_prices_the_whole_step)
{
    rig g = rig_new(SPEC_SRC_NGRAM, 4, 0);
    sched *s = g.s;
    if (!s) goto out;
    pthread_mutex_lock(&s->mu);
    CHECK(s->n_running == 0 && s->o.step_tokens == 96 && s->o.spec_room == 0 && s->o.step_ms == 0);
    steptime_init(&s->tm);
    for (int i = 0; i < 200; i++) {
        steptime_x x = { .n_dec = 1 + i % 4, .n_verify = (i * 7) % 5, .n_prefill = (i % 3) * 40 + (i * 13) % 17,
                         .depth = 100 + (i * 31) % 1000 };
        steptime_observe(&s->tm, &x, 0.020 + 0.008 * x.n_dec + 0.004 * x.n_verify + 0.001 * x.n_prefill);
    }
    CHECK(steptime_warm(&s->tm));
    static sched_req rq[3];
    memset(rq, 0, sizeof rq);
    for (int i = 0; i < 2; i++) {   /* decoding, 3 drafts each */
        rq[i].n_tokens = 50;
        rq[i].n_done = 49;
        rq[i].draft.at = 50;
        rq[i].draft.n = 3;
        for (int src = 0; src < SPEC_N_SRC; src++) rq[i].spec.src[src] = seq_at(0.18);
        rq[i].spec.probe.gap = 1 << 20;   /* no probe due */
    }
    rq[2].n_tokens = 200;   /* reading its prompt */
    s->running[0] = &rq[0];
    s->running[1] = &rq[1];
    s->n_running = 2;
    sched_spec_plan_locked(s, 8);
    CHECKF(rq[0].draft.n_verify == 0 && rq[1].draft.n_verify == 0, "decodes alone: %d and %d verified",
           rq[0].draft.n_verify, rq[1].draft.n_verify);
    s->running[2] = &rq[2];
    s->n_running = 3;
    sched_spec_plan_locked(s, 8);
    CHECKF(rq[0].draft.n_verify == 1 && rq[1].draft.n_verify == 1, "beside a prompt chunk: %d and %d verified",
           rq[0].draft.n_verify, rq[1].draft.n_verify);
    s->n_running = 0;
    pthread_mutex_unlock(&s->mu);
out:
    rig_free(&g);
}

TEST(test_grammar_drafts)
{
    /* tokens 0..9 are the digits, the others letters; the output must be digits: drafts the
     * grammar forbids (prompt lookup finds letters in the prompt) are cut before verification */
    char bytes[100][4];
    const char *pb[100];
    int lens[100];
    for (int i = 0; i < 100; i++) {
        if (i < 10) snprintf(bytes[i], sizeof bytes[i], "%c", '0' + i);
        else snprintf(bytes[i], sizeof bytes[i], "%c%c", 'a' + i % 26, 'a' + i / 26);
        pb[i] = bytes[i];
        lens[i] = (int)strlen(bytes[i]);
    }
    char err[256];
    g_gvocab = grammar_vocab_new(100, pb, lens);
    CHECK(grammar_compile(GRAMMAR_KIND_REGEX, "[0-9]+", 6, &g_grammar, err, sizeof err) == GRAMMAR_OK);
    static run_out base, spec;
    run(0, 0, 0, NREQ, 0, &base);
    for (int i = 0; i < NREQ; i++)
        for (int j = 0; j < base.n[i]; j++) CHECK(base.toks[i][j] < 10);
    /* a fixed K of 3 at most 3 drafted: every draft is verified unless the grammar cut it */
    run(SPEC_SRC_NGRAM, 3, 3, NREQ, 0, &spec);
    compare(&base, &spec, NREQ, "greedy under a grammar");
    CHECKF(spec.st.spec_verified < spec.st.spec_drafted, "drafted %llu verified %llu",
           (unsigned long long)spec.st.spec_drafted, (unsigned long long)spec.st.spec_verified);
    run_free(&spec);
    run_free(&base);
    grammar_free(g_grammar);
    grammar_vocab_free(g_gvocab);
    g_grammar = NULL;
    g_gvocab = NULL;
}

int main(void)
{
    RUN(test_ngram_draft);
    RUN(test_ngram_confidence);
    RUN(test_acceptance_estimate);
    RUN(test_confidence_calibrates_every_position);
    RUN(test_acceptance_per_position);
    RUN(test_prior_from_all_requests);
    RUN(test_probe_backs_off);
    RUN(test_choose_on_recorded_curves);
    RUN(test_choose_on_learned_step_time);
    RUN(test_speculative_sampling_keeps_distribution);
    g_model = schedtest_open(tmpdir, 3);
    if (!g_model) {
        fprintf(stderr, "no model\n");
        return 1;
    }
    RUN(test_greedy_identity_and_rollback);
    RUN(test_sampled_identity);
    RUN(test_draft_model);
    RUN(test_unproven_draft_waits_for_the_probe_budget);
    RUN(test_poor_draft_model);
    RUN(test_grammar_drafts);
    RUN(test_count_prices_the_whole_step);
    schedtest_close(tmpdir, g_model);
    HARNESS_END();
}
