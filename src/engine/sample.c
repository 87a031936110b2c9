/*
 * sample: penalties -> top-k -> top-p -> min-p -> temperature -> draw (llama.cpp's order).
 * See sample.h.
 *
 * Candidates are (id, logit, p) triples in one buffer of n_vocab entries. top-k selects with
 * a bounded min-heap (O(n log k)), then sorts the k survivors; without top-k, top-p sorts
 * the whole list. The penalty window is a ring of the last penalty_last_n tokens with
 * per-token counts kept incrementally (counts has n_vocab entries).
 */
#include "engine/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

typedef struct {
    int32_t id;
    float logit;
    float p;
} sample_cand;

struct sampler {
    sample_params prm;
    int n_vocab;
    sample_cand *cand;   /* (n_vocab) working candidates */
    int32_t *ring;       /* (penalty_last_n) recent tokens */
    int n_ring;          /* tokens in the ring (<= penalty_last_n) */
    int ring_head;       /* next write index */
    int32_t *count;      /* (n_vocab) occurrences in the ring */
    util_rng rng;
};

sample_params sample_params_default(void)
{
    return (sample_params){ .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                            .repeat_penalty = 1.0f, .presence_penalty = 0.0f,
                            .frequency_penalty = 0.0f, .penalty_last_n = 64, .seed = 0 };
}

sampler *sample_new(int n_vocab, const sample_params *params)
{
    sampler *s = xcalloc(1, sizeof *s);
    s->prm = *params;
    if (s->prm.penalty_last_n < 0) s->prm.penalty_last_n = 0;
    s->n_vocab = n_vocab;
    s->cand = xmalloc((size_t)n_vocab * sizeof *s->cand);
    s->ring = xmalloc((size_t)(s->prm.penalty_last_n + 1) * sizeof *s->ring);
    s->count = xcalloc((size_t)n_vocab, sizeof *s->count);
    util_rng_seed(&s->rng, s->prm.seed);
    return s;
}

void sample_free(sampler *s)
{
    if (!s) return;
    free(s->cand);
    free(s->ring);
    free(s->count);
    free(s);
}

void sample_reset(sampler *s)
{
    memset(s->count, 0, (size_t)s->n_vocab * sizeof *s->count);
    s->n_ring = s->ring_head = 0;
    util_rng_seed(&s->rng, s->prm.seed);
}

void sample_accept(sampler *s, int32_t token)
{
    int n = s->prm.penalty_last_n;
    if (n <= 0 || token < 0 || token >= s->n_vocab) return;
    if (s->n_ring == n) s->count[s->ring[s->ring_head]]--;
    else s->n_ring++;
    s->ring[s->ring_head] = token;
    s->count[token]++;
    s->ring_head = (s->ring_head + 1) % n;
}

static bool sample_has_penalties(const sampler *s)
{
    return s->n_ring > 0 && (s->prm.repeat_penalty != 1.0f || s->prm.presence_penalty != 0.0f ||
                             s->prm.frequency_penalty != 0.0f);
}

/* Penalises cand (indexed by token id, i.e. the full unsorted list). */
static void sample_apply_penalties(sampler *s)
{
    const sample_params *p = &s->prm;
    for (int i = 0; i < s->n_ring; i++) {
        int32_t t = s->ring[i];
        sample_cand *c = &s->cand[t];
        if (c->p != 0.0f) continue;  /* p doubles as "already penalised" mark here */
        c->p = 1.0f;
        int cnt = s->count[t];
        if (c->logit <= 0) c->logit *= p->repeat_penalty;
        else c->logit /= p->repeat_penalty;
        c->logit -= (float)cnt * p->frequency_penalty + (float)(cnt > 0) * p->presence_penalty;
    }
}

static int sample_cmp_desc(const void *a, const void *b)
{
    const sample_cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* heap of the k best: a min-heap on (logit, then larger id counts as smaller) */
static bool sample_worse(const sample_cand *a, const sample_cand *b)
{
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static void sample_sift_down(sample_cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && sample_worse(&h[l], &h[m])) m = l;
        if (r < n && sample_worse(&h[r], &h[m])) m = r;
        if (m == i) return;
        sample_cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Keeps the k best of cand[0..n) in cand[0..k), sorted best first. Returns k. */
static int sample_top_k(sample_cand *c, int n, int k)
{
    if (k >= n) {
        qsort(c, (size_t)n, sizeof *c, sample_cmp_desc);
        return n;
    }
    for (int i = k / 2 - 1; i >= 0; i--) sample_sift_down(c, k, i);
    for (int i = k; i < n; i++) {
        if (sample_worse(&c[0], &c[i])) {
            c[0] = c[i];
            sample_sift_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof *c, sample_cmp_desc);
    return k;
}

/* Softmax of sorted candidates into .p (max is c[0]). */
static void sample_softmax(sample_cand *c, int n)
{
    double sum = 0;
    float mx = c[0].logit;
    for (int i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - mx);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

int32_t sample_token(sampler *s, const float *logits)
{
    const sample_params *p = &s->prm;
    int n = s->n_vocab;
    bool pen = sample_has_penalties(s);
    if (p->temp <= 0 && !pen) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    sample_cand *c = s->cand;
    for (int i = 0; i < n; i++) c[i] = (sample_cand){ i, logits[i], 0.0f };
    if (pen) sample_apply_penalties(s);
    if (p->temp <= 0) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return best;
    }
    /* top-k (also sorts); without it, sort everything for top-p / min-p */
    n = sample_top_k(c, n, p->top_k > 0 ? p->top_k : n);
    if (p->top_p < 1.0f) {
        sample_softmax(c, n);
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
    sample_softmax(c, n);
    double r = util_rng_uniform(&s->rng), cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}
