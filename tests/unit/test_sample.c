/*
 * test_sample: each filter of the sampler, determinism per seed, the empirical
 * distribution of plain temperature sampling against the softmax, and token-for-token
 * equality with the reference implementation below (the straightforward one that sorts the
 * whole vocabulary) on many random logit vectors and parameter sets.
 */
#include "harness.h"

#include <stdlib.h>

#include "engine/sample.h"
#include "util/util.h"

/* ---- the reference: sample.c as it was before it stopped sorting the vocabulary ---- */

typedef struct {
    int32_t id;
    float logit;
    float p;
} ref_cand;

typedef struct ref_sampler ref_sampler;
struct ref_sampler {
    sample_params prm;
    int n_vocab;
    ref_cand *cand;      /* (n_vocab) working candidates */
    int32_t *ring;       /* (penalty_last_n) recent tokens */
    int n_ring;          /* tokens in the ring (<= penalty_last_n) */
    int ring_head;       /* next write index */
    int32_t *count;      /* (n_vocab) occurrences in the ring */
    util_rng rng;
};

static ref_sampler *ref_new(int n_vocab, const sample_params *params)
{
    ref_sampler *s = xcalloc(1, sizeof *s);
    s->prm = *params;
    if (s->prm.penalty_last_n < 0) s->prm.penalty_last_n = 0;
    s->n_vocab = n_vocab;
    s->cand = xmalloc((size_t)n_vocab * sizeof *s->cand);
    s->ring = xmalloc((size_t)(s->prm.penalty_last_n + 1) * sizeof *s->ring);
    s->count = xcalloc((size_t)n_vocab, sizeof *s->count);
    util_rng_seed(&s->rng, s->prm.seed);
    return s;
}

static void ref_free(ref_sampler *s)
{
    if (!s) return;
    free(s->cand);
    free(s->ring);
    free(s->count);
    free(s);
}

static void ref_reset(ref_sampler *s)
{
    memset(s->count, 0, (size_t)s->n_vocab * sizeof *s->count);
    s->n_ring = s->ring_head = 0;
    util_rng_seed(&s->rng, s->prm.seed);
}

static void ref_accept(ref_sampler *s, int32_t token)
{
    int n = s->prm.penalty_last_n;
    if (n <= 0 || token < 0 || token >= s->n_vocab) return;
    if (s->n_ring == n) s->count[s->ring[s->ring_head]]--;
    else s->n_ring++;
    s->ring[s->ring_head] = token;
    s->count[token]++;
    s->ring_head = (s->ring_head + 1) % n;
}

static bool ref_has_penalties(const ref_sampler *s)
{
    return s->n_ring > 0 && (s->prm.repeat_penalty != 1.0f || s->prm.presence_penalty != 0.0f ||
                             s->prm.frequency_penalty != 0.0f);
}

/* Penalises cand (indexed by token id, i.e. the full unsorted list). */
static void ref_apply_penalties(ref_sampler *s)
{
    const sample_params *p = &s->prm;
    for (int i = 0; i < s->n_ring; i++) {
        int32_t t = s->ring[i];
        ref_cand *c = &s->cand[t];
        if (c->p != 0.0f) continue;  /* p doubles as "already penalised" mark here */
        c->p = 1.0f;
        int cnt = s->count[t];
        if (c->logit <= 0) c->logit *= p->repeat_penalty;
        else c->logit /= p->repeat_penalty;
        c->logit -= (float)cnt * p->frequency_penalty + (float)(cnt > 0) * p->presence_penalty;
    }
}

static int ref_cmp_desc(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* heap of the k best: a min-heap on (logit, then larger id counts as smaller) */
static bool ref_worse(const ref_cand *a, const ref_cand *b)
{
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static void ref_sift_down(ref_cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ref_worse(&h[l], &h[m])) m = l;
        if (r < n && ref_worse(&h[r], &h[m])) m = r;
        if (m == i) return;
        ref_cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Keeps the k best of cand[0..n) in cand[0..k), sorted best first. Returns k. */
static int ref_top_k(ref_cand *c, int n, int k)
{
    if (k >= n) {
        qsort(c, (size_t)n, sizeof *c, ref_cmp_desc);
        return n;
    }
    for (int i = k / 2 - 1; i >= 0; i--) ref_sift_down(c, k, i);
    for (int i = k; i < n; i++) {
        if (ref_worse(&c[0], &c[i])) {
            c[0] = c[i];
            ref_sift_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof *c, ref_cmp_desc);
    return k;
}

/* Softmax of sorted candidates into .p (max is c[0]). */
static void ref_softmax(ref_cand *c, int n)
{
    double sum = 0;
    float mx = c[0].logit;
    for (int i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - mx);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

static int32_t ref_token(ref_sampler *s, const float *logits)
{
    const sample_params *p = &s->prm;
    int n = s->n_vocab;
    bool pen = ref_has_penalties(s);
    if (p->temp <= 0 && !pen) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    ref_cand *c = s->cand;
    for (int i = 0; i < n; i++) c[i] = (ref_cand){ i, logits[i], 0.0f };
    if (pen) ref_apply_penalties(s);
    if (p->temp <= 0) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return best;
    }
    /* top-k (also sorts); without it, sort everything for top-p / min-p */
    n = ref_top_k(c, n, p->top_k > 0 ? p->top_k : n);
    if (p->top_p < 1.0f) {
        ref_softmax(c, n);
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        float thr = c[0].logit + logf(p->min_p);
        int keep = 1;
        while (keep < n && c[keep].logit >= thr) keep++;
        n = keep;
    }
    for (int i = 0; i < n; i++) c[i].logit /= p->temp;
    ref_softmax(c, n);
    double r = util_rng_uniform(&s->rng), cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}

/* ---- end of the reference ---- */

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

/* ---- equality with the reference ---- */

enum { CMP_KINDS = 7 };

/* Fills lg with logits of one of several shapes: LLM-like (normal bulk, a few tokens far
 * above), flat (all nearly equal), coarse (few distinct values: many ties), peaked with a
 * masked (-inf) part, integer steps, one dominant token, signed zeros (-0 ties with +0). */
static void cmp_fill(float *lg, int n, int kind, util_rng *r)
{
    for (int i = 0; i < n; i++) {
        float z = util_rng_normal(r);
        switch (kind) {
        case 0: lg[i] = 2.5f * z; break;
        case 1: lg[i] = 0.01f * z; break;
        case 2: lg[i] = (float)(int)(2.0f * z) * 0.5f; break;
        case 3: lg[i] = util_rng_next(r) % 4 == 0 ? -INFINITY : 3.0f * z; break;
        case 4: lg[i] = (float)(util_rng_next(r) % 7); break;
        case 6: lg[i] = (float[]){ 0.0f, -0.0f, 0.5f, -0.5f }[util_rng_next(r) % 4]; break;
        default: lg[i] = z - 20.0f; break;
        }
    }
    if (kind == 0 || kind == 3)
        for (int j = 0; j < 4; j++) lg[util_rng_next(r) % (uint64_t)n] += 6.0f + 3.0f * (float)j;
    if (kind == 5) lg[util_rng_next(r) % (uint64_t)n] = 30.0f;
}

/* One parameter set out of a spread of combinations, picked by the draw in r. */
static sample_params cmp_params(int n, util_rng *r)
{
    static const float temps[] = { 0.0f, 0.0f, 1.0f, 1.0f, 0.7f, 1.5f, 0.25f };
    static const float top_ps[] = { 1.0f, 1.0f, 0.95f, 0.9f, 0.5f, 0.99f, 0.0f, 0.999f };
    static const float min_ps[] = { 0.0f, 0.0f, 0.05f, 0.2f, 1e-4f };
    sample_params p = sample_params_default();
    p.temp = temps[util_rng_next(r) % TM_ARRAY_LEN(temps)];
    p.top_p = top_ps[util_rng_next(r) % TM_ARRAY_LEN(top_ps)];
    p.min_p = min_ps[util_rng_next(r) % TM_ARRAY_LEN(min_ps)];
    int ks[] = { 0, 0, 0, 1, 5, 40, n - 1, n, n + 3 };
    p.top_k = ks[util_rng_next(r) % TM_ARRAY_LEN(ks)];
    if (util_rng_next(r) % 2) {
        p.repeat_penalty = util_rng_next(r) % 2 ? 1.3f : 0.8f;
        p.presence_penalty = util_rng_next(r) % 2 ? 0.5f : -0.25f;
        p.frequency_penalty = util_rng_next(r) % 2 ? 0.3f : 0.0f;
        p.penalty_last_n = (int)(util_rng_next(r) % 100);
    }
    p.seed = util_rng_next(r);
    return p;
}

/* n_runs parameter sets on vocabulary n, n_steps tokens each (fresh logits per step, the
 * chosen token accepted into both); returns the number of tokens that differed. */
static int cmp_run(int n, int n_runs, int n_steps, uint64_t seed)
{
    util_rng r;
    util_rng_seed(&r, seed);
    float *lg = xmalloc((size_t)n * sizeof *lg);
    int bad = 0;
    for (int run = 0; run < n_runs; run++) {
        sample_params p = cmp_params(n, &r);
        sampler *s = sample_new(n, &p);
        ref_sampler *ref = ref_new(n, &p);
        for (int i = 0; i < 20; i++) {
            int32_t t = (int32_t)(util_rng_next(&r) % (uint64_t)TM_MIN(n, 50));
            sample_accept(s, t);
            ref_accept(ref, t);
        }
        for (int step = 0; step < n_steps; step++) {
            int kind = (int)(util_rng_next(&r) % CMP_KINDS);
            cmp_fill(lg, n, kind, &r);
            int32_t a = sample_token(s, lg), b = ref_token(ref, lg);
            if (a != b) {
                if (bad++ < 5)
                    fprintf(stderr, "  n %d kind %d temp %g top_k %d top_p %g min_p %g pen %g/%g/%g/%d: %d vs ref %d\n",
                            n, kind, p.temp, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                            p.presence_penalty, p.frequency_penalty, p.penalty_last_n, a, b);
            }
            sample_accept(s, b);
            ref_accept(ref, b);
        }
        sample_reset(s);  /* forgets the window, same draws again */
        ref_reset(ref);
        bad += sample_token(s, lg) != ref_token(ref, lg);
        sample_free(s);
        ref_free(ref);
    }
    free(lg);
    return bad;
}

TEST(test_matches_reference)
{
    CHECK(cmp_run(32, 300, 8, 1) == 0);
    CHECK(cmp_run(33, 100, 8, 2) == 0);
    CHECK(cmp_run(100, 200, 6, 3) == 0);
    CHECK(cmp_run(1000, 100, 4, 4) == 0);
    CHECK(cmp_run(4097, 40, 3, 5) == 0);
    CHECK(cmp_run(32000, 12, 3, 6) == 0);
    CHECK(cmp_run(151936, 8, 2, 7) == 0);
}

/* Plain temperature over the whole vocabulary (the OpenAI APIs' default): many draws, so
 * that random numbers land everywhere in the distribution, on a flat and a peaked shape. */
TEST(test_matches_reference_plain_temperature)
{
    enum { V = 20000 };
    util_rng r;
    util_rng_seed(&r, 99);
    float *lg = xmalloc(V * sizeof *lg);
    for (int kind = 0; kind < 2; kind++) {
        cmp_fill(lg, V, kind, &r);
        sample_params p = plain();
        p.seed = 11;
        sampler *s = sample_new(V, &p);
        ref_sampler *ref = ref_new(V, &p);
        int bad = 0;
        for (int i = 0; i < 200; i++) bad += sample_token(s, lg) != ref_token(ref, lg);
        CHECKF(bad == 0, "kind %d: %d differ", kind, bad);
        sample_free(s);
        ref_free(ref);
    }
    free(lg);
}

/* NaN and infinite logits take the reference's own path; results still agree. */
TEST(test_matches_reference_nonfinite)
{
    enum { V = 300 };
    util_rng r;
    util_rng_seed(&r, 5);
    float lg[V];
    int bad = 0;
    for (int run = 0; run < 200; run++) {
        sample_params p = cmp_params(V, &r);
        cmp_fill(lg, V, 0, &r);
        float special[] = { NAN, INFINITY, -INFINITY };
        for (int j = 0; j < 3; j++) lg[util_rng_next(&r) % V] = special[util_rng_next(&r) % 3];
        sampler *s = sample_new(V, &p);
        ref_sampler *ref = ref_new(V, &p);
        bad += sample_token(s, lg) != ref_token(ref, lg);
        sample_free(s);
        ref_free(ref);
    }
    CHECK(bad == 0);
}

/* Greedy ties, also when a penalised token ties with an untouched one. */
TEST(test_greedy_ties_penalised)
{
    float lg[40] = { 0 };
    lg[3] = 2.0f, lg[20] = 4.0f, lg[35] = 2.0f;  /* 4 / 2 = 2: ties with 3 and 35 */
    sample_params p = plain();
    p.temp = 0;
    p.repeat_penalty = 2.0f;
    sampler *s = sample_new(40, &p);
    CHECK(sample_token(s, lg) == 20);
    sample_accept(s, 20);
    CHECK(sample_token(s, lg) == 3);
    lg[3] = 1.0f;
    CHECK(sample_token(s, lg) == 20);  /* 20 (penalised to 2) before 35 */
    sample_free(s);
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
    RUN(test_greedy_ties_penalised);
    RUN(test_matches_reference);
    RUN(test_matches_reference_plain_temperature);
    RUN(test_matches_reference_nonfinite);
    HARNESS_END();
}
