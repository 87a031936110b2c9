/*
 * test_sample: each filter of the sampler, determinism per seed, and the empirical
 * distribution of plain temperature sampling against the softmax.
 */
#include "harness.h"

#include <stdlib.h>

#include "engine/sample.h"

static sample_params plain(void)
{
    sample_params p = sample_params_default();
    p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f, p.temp = 1.0f;
    return p;
}

/* draws n tokens, counts them in hist (n_vocab entries) */
static void draw(sampler *s, const float *logits, int n, int *hist)
{
    for (int i = 0; i < n; i++) hist[sample_token(s, logits)]++;
}

TEST(test_greedy)
{
    float lg[6] = { 0.1f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f };
    sample_params p = plain();
    p.temp = 0;
    sampler *s = sample_new(6, &p);
    CHECK(sample_token(s, lg) == 1);  /* lowest id on a tie */
    sample_free(s);
}

TEST(test_greedy_with_repeat_penalty)
{
    float lg[4] = { 1.0f, 3.0f, 2.9f, -0.5f };
    sample_params p = plain();
    p.temp = 0;
    p.repeat_penalty = 1.5f;
    sampler *s = sample_new(4, &p);
    CHECK(sample_token(s, lg) == 1);
    sample_accept(s, 1);  /* 3.0 / 1.5 = 2.0 < 2.9 */
    CHECK(sample_token(s, lg) == 2);
    sample_accept(s, 2);  /* 2.9 / 1.5 = 1.93 < 2.0 */
    CHECK(sample_token(s, lg) == 1);
    sample_reset(s);
    CHECK(sample_token(s, lg) == 1);
    sample_free(s);
}

TEST(test_presence_frequency_window)
{
    float lg[3] = { 1.0f, 1.5f, 0.0f };
    sample_params p = plain();
    p.temp = 0;
    p.frequency_penalty = 0.2f;
    p.penalty_last_n = 3;
    sampler *s = sample_new(3, &p);
    sample_accept(s, 1);
    sample_accept(s, 1);
    CHECK(sample_token(s, lg) == 1);  /* 1.5 - 0.4 = 1.1 > 1.0 */
    sample_accept(s, 1);
    CHECK(sample_token(s, lg) == 0);  /* 1.5 - 0.6 = 0.9 < 1.0 */
    sample_accept(s, 2);              /* window of 3: one 1 drops out -> 1.5 - 0.4 */
    CHECK(sample_token(s, lg) == 1);
    sample_free(s);
    p.frequency_penalty = 0;
    p.presence_penalty = 0.6f;
    s = sample_new(3, &p);
    sample_accept(s, 1);
    CHECK(sample_token(s, lg) == 0);  /* 1.5 - 0.6 < 1.0 */
    sample_free(s);
}

TEST(test_top_k)
{
    float lg[8] = { 0, 5, 1, 4, 2, 3, -1, 0.5f };
    sample_params p = plain();
    p.top_k = 2;
    p.seed = 7;
    sampler *s = sample_new(8, &p);
    int hist[8] = { 0 };
    draw(s, lg, 2000, hist);
    CHECK(hist[1] + hist[3] == 2000);
    CHECK(hist[1] > hist[3] && hist[3] > 100);
    sample_free(s);
}

TEST(test_top_p)
{
    /* probabilities ~ 0.5, 0.25, 0.125, ... : top-p 0.7 keeps two */
    float lg[5] = { 0, logf(2), logf(4), logf(8), logf(16) };
    sample_params p = plain();
    p.top_p = 0.7f;
    sampler *s = sample_new(5, &p);
    int hist[5] = { 0 };
    draw(s, lg, 2000, hist);
    CHECK(hist[4] + hist[3] == 2000 && hist[3] > 300);
    sample_free(s);
}

TEST(test_min_p)
{
    float lg[4] = { logf(1), logf(10), logf(4), logf(6) };
    sample_params p = plain();
    p.min_p = 0.5f;  /* keep p >= 0.5 * p_max: ids 1 and 3 */
    sampler *s = sample_new(4, &p);
    int hist[4] = { 0 };
    draw(s, lg, 2000, hist);
    CHECK(hist[1] + hist[3] == 2000 && hist[3] > 300);
    sample_free(s);
}

TEST(test_distribution)
{
    /* plain sampling at temperature 2 follows softmax(logits / 2) */
    enum { V = 6, N = 60000 };
    float lg[V] = { 0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f };
    sample_params p = plain();
    p.temp = 2.0f;
    p.seed = 123;
    sampler *s = sample_new(V, &p);
    int hist[V] = { 0 };
    draw(s, lg, N, hist);
    double z = 0, q[V];
    for (int i = 0; i < V; i++) z += q[i] = exp(lg[i] / 2.0);
    for (int i = 0; i < V; i++) {
        double expect = q[i] / z, got = (double)hist[i] / N;
        double sd = sqrt(expect * (1 - expect) / N);
        CHECKF(fabs(got - expect) < 5 * sd, "token %d: %.4f vs %.4f", i, got, expect);
    }
    sample_free(s);
}

TEST(test_seed_determinism)
{
    enum { V = 50 };
    float lg[V];
    for (int i = 0; i < V; i++) lg[i] = sinf((float)i);
    sample_params p = sample_params_default();
    p.seed = 42;
    sampler *a = sample_new(V, &p), *b = sample_new(V, &p);
    int same = 1;
    int32_t seq_a[100];
    for (int i = 0; i < 100; i++) {
        int32_t x = sample_token(a, lg), y = sample_token(b, lg);
        same &= x == y;
        seq_a[i] = x;
        sample_accept(a, x);
        sample_accept(b, y);
    }
    CHECK(same);
    sample_reset(a);
    same = 1;
    for (int i = 0; i < 100; i++) {
        int32_t x = sample_token(a, lg);
        same &= x == seq_a[i];
        sample_accept(a, x);
    }
    CHECK(same);
    p.seed = 43;
    sampler *c = sample_new(V, &p);
    int differ = 0;
    for (int i = 0; i < 100; i++) differ |= sample_token(c, lg) != seq_a[i];
    CHECK(differ);
    sample_free(a);
    sample_free(b);
    sample_free(c);
}

int main(void)
{
    RUN(test_greedy);
    RUN(test_greedy_with_repeat_penalty);
    RUN(test_presence_frequency_window);
    RUN(test_top_k);
    RUN(test_top_p);
    RUN(test_min_p);
    RUN(test_distribution);
    RUN(test_seed_determinism);
    HARNESS_END();
}
