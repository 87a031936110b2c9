/*
 * sample: penalties -> top-k -> top-p -> min-p -> temperature -> draw (llama.cpp's order).
 * See sample.h.
 *
 * The chain is defined on the candidate list sorted best first (logit descending, lower id
 * first on ties); "the reference" below means running it literally: sort everything, softmax,
 * walk. This file picks the same token as the reference, every time, without sorting the
 * vocabulary:
 *
 * - Penalties touch only the tokens in the window: when they are on, the logits are copied
 *   once into val and the window's distinct tokens patched there; otherwise the caller's
 *   logits are read in place.
 * - Greedy is one SSE2 pass (per-lane max and index; the lowest index wins ties).
 * - top-k (k < n_vocab) keeps a bounded heap of the k best, skipping 16 logits at a time when
 *   none reaches the heap's root, then runs the reference chain on the k survivors.
 * - Without top-k, every later stage only ever looks at a prefix of the sorted list: min-p
 *   keeps {logit >= max + ln min_p}, top-p and the draw stop where the running probability
 *   crosses top_p or the random number. We collect the candidates above a logit threshold (a
 *   prefix by construction), sort only those, and walk them. Where a stage needs the softmax
 *   sum over the whole vocabulary (top-p, and the draw when nothing was cut), that sum is the
 *   reference's sequential double sum over the sorted list; we sum the same float terms in
 *   another order instead, which differs from it by at most 2(n-1)u relatively (u = 2^-53, the
 *   standard bound for recursive summation, any order). Every quantity the walk compares is
 *   monotone in the sum, so we walk twice, with the sum's lower and upper bound: if both walks
 *   stop at the same place, that is the reference's place. If they differ (the crossing lies
 *   within ~1e-10 of the target) or the prefix runs out, the prefix grows, and in the end the
 *   reference itself runs (also for NaN or infinite logits).
 * - Long lists (a deep prefix, or everything) are sorted by an LSD radix sort on the logit's
 *   bits, stable, from id order: the same order as the reference's comparator.
 *
 * The candidate buffers, the penalised copy and the exp buffer have n_vocab entries each and
 * are allocated in sample_new: sample_token allocates nothing (they are only touched by the
 * paths that use them). The penalty window is a ring of the last penalty_last_n tokens with
 * per-token counts kept incrementally (count has n_vocab entries); it exists only when a
 * penalty is set: zeroing its n_vocab counts was most of a greedy request's set-up, and the
 * first requests of a new process took those pages' faults.
 */
#include "engine/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "util/util.h"

typedef struct {
    int32_t id;
    float logit;
    float p;
} sample_cand;

struct sampler {
    sample_params prm;
    int n_vocab;
    sample_cand *cand;   /* (n_vocab) working candidates: a sorted prefix, or all of them */
    sample_cand *tmp;    /* (n_vocab) the radix sort's other buffer */
    uint32_t *hist;      /* (3, 2048) the radix sort's digit counts */
    float *val;          /* (n_vocab) penalised logits, written only when penalties are on */
    float *e;            /* (n_vocab) exp(logit - max) terms of the current call's softmax */
    uint8_t *mark;       /* (n_vocab) 0, or 1 for a window token while penalties are applied;
                          * NULL without penalties, as count */
    int32_t *ring;       /* (penalty_last_n) recent tokens */
    int n_ring;          /* tokens in the ring (<= penalty_last_n) */
    int ring_head;       /* next write index */
    int32_t *count;      /* (n_vocab) occurrences in the ring */
    util_rng rng;
};

enum {
    SAMPLE_BLOCK = 16,    /* logits tested at once before looking at them one by one */
    SAMPLE_N_BINS = 128,  /* histogram of softmax terms (<= 1) by float exponent */
    SAMPLE_BIN_STEP = 4,  /* bins (factors of 2 in probability) added when a prefix runs out */
    SAMPLE_RADIX_MIN = 1024, /* shorter lists are sorted by qsort */
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
    bool penalties = s->prm.repeat_penalty != 1.0f || s->prm.presence_penalty != 0.0f || s->prm.frequency_penalty != 0.0f;
    if (s->prm.penalty_last_n < 0 || !penalties) s->prm.penalty_last_n = 0;   /* no window to keep */
    s->n_vocab = n_vocab;
    s->cand = xmalloc((size_t)n_vocab * sizeof *s->cand);
    s->tmp = xmalloc((size_t)n_vocab * sizeof *s->tmp);
    s->hist = xmalloc(3 * 2048 * sizeof *s->hist);
    s->val = xmalloc((size_t)n_vocab * sizeof *s->val);
    s->e = xmalloc((size_t)n_vocab * sizeof *s->e);
    s->ring = xmalloc((size_t)(s->prm.penalty_last_n + 1) * sizeof *s->ring);
    if (s->prm.penalty_last_n > 0) {
        s->mark = xcalloc((size_t)n_vocab, sizeof *s->mark);
        s->count = xcalloc((size_t)n_vocab, sizeof *s->count);
    }
    util_rng_seed(&s->rng, s->prm.seed);
    return s;
}

void sample_free(sampler *s)
{
    if (!s) return;
    free(s->cand);
    free(s->tmp);
    free(s->hist);
    free(s->val);
    free(s->e);
    free(s->mark);
    free(s->ring);
    free(s->count);
    free(s);
}

void sample_reset(sampler *s)
{
    if (s->count) memset(s->count, 0, (size_t)s->n_vocab * sizeof *s->count);
    s->n_ring = s->ring_head = 0;
    util_rng_seed(&s->rng, s->prm.seed);
}

void sample_skip_draws(sampler *s, int n)
{
    for (int i = 0; i < n; i++) (void)util_rng_uniform(&s->rng);
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

/* The window is kept only when a penalty is set (sample_new), so a token in it is enough. */
static bool sample_has_penalties(const sampler *s) { return s->n_ring > 0; }

/* Copies logits into val, adds the logit biases, and penalises each distinct window token
 * once (on the biased logit). Returns val. */
static const float *sample_penalise(sampler *s, const float *logits)
{
    const sample_params *p = &s->prm;
    memcpy(s->val, logits, (size_t)s->n_vocab * sizeof *s->val);
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] >= 0 && p->bias_id[i] < s->n_vocab) s->val[p->bias_id[i]] += p->bias[i];
    logits = s->val;
    for (int i = 0; i < s->n_ring; i++) {
        int32_t t = s->ring[i];
        if (s->mark[t]) continue;
        s->mark[t] = 1;
        int cnt = s->count[t];
        float l = logits[t];
        if (l <= 0) l *= p->repeat_penalty;
        else l /= p->repeat_penalty;
        l -= (float)cnt * p->frequency_penalty + (float)(cnt > 0) * p->presence_penalty;
        s->val[t] = l;
    }
    for (int i = 0; i < s->n_ring; i++) s->mark[s->ring[i]] = 0;
    return s->val;
}

/* The reference's argmax: the first index of the largest value by '>' (also with NaN). */
static int sample_argmax_scalar(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Index of the largest of v[0..n) (the lowest index on ties); -1 if any is NaN. */
static int sample_argmax(const float *v, int n)
{
    int i = 0, best = 0;
    float bv = v[0];
#ifdef __SSE2__
    if (n >= 2 * SAMPLE_BLOCK) {
        /* 16 lanes: each keeps its largest value and the first index holding it */
        __m128 m[4], bad = _mm_setzero_ps();
        __m128i idx[4], cur[4];
        const __m128i step = _mm_set1_epi32(SAMPLE_BLOCK);
        for (int k = 0; k < 4; k++) {
            m[k] = _mm_loadu_ps(v + 4 * k);
            bad = _mm_or_ps(bad, _mm_cmpunord_ps(m[k], m[k]));
            idx[k] = cur[k] = _mm_setr_epi32(4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3);
        }
        for (i = SAMPLE_BLOCK; i + SAMPLE_BLOCK <= n; i += SAMPLE_BLOCK) {
            for (int k = 0; k < 4; k++) {
                __m128 x = _mm_loadu_ps(v + i + 4 * k);
                __m128 gt = _mm_cmpgt_ps(x, m[k]);
                cur[k] = _mm_add_epi32(cur[k], step);
                bad = _mm_or_ps(bad, _mm_cmpunord_ps(x, x));
                m[k] = _mm_max_ps(x, m[k]);  /* x > m ? x : m */
                __m128i g = _mm_castps_si128(gt);
                idx[k] = _mm_or_si128(_mm_and_si128(g, cur[k]), _mm_andnot_si128(g, idx[k]));
            }
        }
        if (_mm_movemask_ps(bad)) return -1;
        float lv[SAMPLE_BLOCK];
        int32_t li[SAMPLE_BLOCK];
        for (int k = 0; k < 4; k++) {
            _mm_storeu_ps(lv + 4 * k, m[k]);
            _mm_storeu_si128((__m128i *)(li + 4 * k), idx[k]);
        }
        bv = lv[0], best = li[0];
        for (int j = 1; j < SAMPLE_BLOCK; j++)
            if (lv[j] > bv || (lv[j] == bv && li[j] < best)) bv = lv[j], best = li[j];
    }
#endif
    if (bv != bv) return -1;
    for (i = i ? i : 1; i < n; i++) {
        if (v[i] != v[i]) return -1;
        if (v[i] > bv) bv = v[i], best = i;
    }
    return best;
}

/* Whether any of v[0..SAMPLE_BLOCK) is >= t. */
static inline bool sample_any_ge(const float *v, float t)
{
#ifdef __SSE2__
    __m128 tt = _mm_set1_ps(t);
    __m128 a = _mm_or_ps(_mm_cmpge_ps(_mm_loadu_ps(v), tt), _mm_cmpge_ps(_mm_loadu_ps(v + 4), tt));
    __m128 b = _mm_or_ps(_mm_cmpge_ps(_mm_loadu_ps(v + 8), tt),
                         _mm_cmpge_ps(_mm_loadu_ps(v + 12), tt));
    return _mm_movemask_ps(_mm_or_ps(a, b)) != 0;
#else
    bool any = false;
    for (int j = 0; j < SAMPLE_BLOCK; j++) any |= v[j] >= t;
    return any;
#endif
}

static int sample_cmp_desc(const void *a, const void *b)
{
    const sample_cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Order-preserving key of a logit, ascending for descending logits (-0 counts as +0). */
static inline uint32_t sample_key(float f)
{
    uint32_t u;
    f += 0.0f;  /* -0 -> +0 */
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? u : ~u & 0x7fffffffu;  /* (u >> 31 ? ~u : u | sign) inverted */
}

/* Sorts c[0..n) best first: logit descending, id ascending on ties (sample_cmp_desc's order;
 * logits must not be NaN). Large lists go through an LSD radix sort (three stable 11-bit
 * passes on the key, so equal logits keep the ascending id order collection gives them when
 * c is in id order) in s->tmp; small ones through qsort. c must be in id order. */
static void sample_sort_ids(sampler *s, sample_cand *c, int n)
{
    if (n < SAMPLE_RADIX_MIN) {
        qsort(c, (size_t)n, sizeof *c, sample_cmp_desc);
        return;
    }
    uint32_t *hist = s->hist;  /* (3, 2048) */
    memset(hist, 0, 3 * 2048 * sizeof *hist);
    for (int i = 0; i < n; i++) {
        uint32_t k = sample_key(c[i].logit);
        hist[k & 2047]++;
        hist[2048 + ((k >> 11) & 2047)]++;
        hist[4096 + (k >> 22)]++;
    }
    sample_cand *src = c, *dst = s->tmp;
    for (int pass = 0; pass < 3; pass++) {
        uint32_t *h = hist + 2048 * pass, sum = 0;
        int shift = 11 * pass;
        if (h[sample_key(c[0].logit) >> shift & 2047] == (uint32_t)n) continue;  /* one bucket */
        for (int d = 0; d < 2048; d++) {
            uint32_t x = h[d];
            h[d] = sum;
            sum += x;
        }
        for (int i = 0; i < n; i++) dst[h[sample_key(src[i].logit) >> shift & 2047]++] = src[i];
        sample_cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != c) memcpy(c, src, (size_t)n * sizeof *c);
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

/* The k best of v[0..n) (0 < k < n), sorted best first, into h[0..k). Same steps as the
 * reference's heap over the whole list, minus blocks where nothing reaches the root. */
static void sample_select_k(sample_cand *h, const float *v, int n, int k)
{
    for (int i = 0; i < k; i++) h[i] = (sample_cand){ i, v[i], 0.0f };
    for (int i = k / 2 - 1; i >= 0; i--) sample_sift_down(h, k, i);
    int i = k;
    while (i < n) {
        if (i + SAMPLE_BLOCK <= n && !sample_any_ge(v + i, h[0].logit)) {
            i += SAMPLE_BLOCK;
            continue;
        }
        for (int end = TM_MIN(i + SAMPLE_BLOCK, n); i < end; i++) {
            sample_cand x = { i, v[i], 0.0f };
            if (sample_worse(&h[0], &x)) {
                h[0] = x;
                sample_sift_down(h, k, 0);
            }
        }
    }
    qsort(h, (size_t)k, sizeof *h, sample_cmp_desc);  /* (heap order, not id order) */
}

/* Puts {i : v[i] >= t} into c as (i, v[i], e ? e[i] : 0), in id order; returns the count. */
static int sample_collect(sample_cand *c, const float *v, const float *e, int n, float t)
{
    int m = 0, i = 0;
    for (; i + SAMPLE_BLOCK <= n; i += SAMPLE_BLOCK) {
        if (!sample_any_ge(v + i, t)) continue;
        for (int j = i; j < i + SAMPLE_BLOCK; j++)
            if (v[j] >= t) c[m++] = (sample_cand){ j, v[j], e ? e[j] : 0.0f };
    }
    for (; i < n; i++)
        if (v[i] >= t) c[m++] = (sample_cand){ i, v[i], e ? e[i] : 0.0f };
    return m;
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

/* Temperature, softmax and the draw over the sorted c[0..n) (the reference's last steps). */
static int32_t sample_draw(const sampler *s, sample_cand *c, int n, double r)
{
    for (int i = 0; i < n; i++) c[i].logit /= s->prm.temp;
    sample_softmax(c, n);
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}

/* The reference chain from top-p on, over the complete sorted candidate list c[0..n). */
static int32_t sample_chain(const sampler *s, sample_cand *c, int n, double r)
{
    const sample_params *p = &s->prm;
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
    return sample_draw(s, c, n, r);
}

/* The reference over the whole vocabulary: sort everything (with NaN among the logits, the
 * way the reference did, by qsort: the order is then qsort's own). */
static int32_t sample_full(sampler *s, const float *v, bool nan, double r)
{
    int n = s->n_vocab;
    for (int i = 0; i < n; i++) s->cand[i] = (sample_cand){ i, v[i], 0.0f };
    if (nan) qsort(s->cand, (size_t)n, sizeof *s->cand, sample_cmp_desc);
    else sample_sort_ids(s, s->cand, n);
    return sample_chain(s, s->cand, n, r);
}

/* e[i] = expf(v[i] / temp - m) for all i (the reference's softmax terms); returns their sum
 * in index order. hist[b] gets the mass of the terms with float exponent field b (terms are
 * <= 1: b <= 127); *n_ge the number of v[i] >= thr. */
static double sample_exp_pass(sampler *s, const float *v, float temp, float m, float thr,
                              double *hist, int *n_ge)
{
    int n = s->n_vocab, cnt = 0;
    double sum[4] = { 0 }, h[4][SAMPLE_N_BINS];  /* 4 of each: no chain through one bin */
    memset(h, 0, sizeof h);
    for (int i = 0; i < n; i++) {
        float x = temp == 1.0f ? v[i] : v[i] / temp;  /* (x / 1 == x) */
        float e = expf(x - m);
        uint32_t bits;
        memcpy(&bits, &e, sizeof bits);
        s->e[i] = e;
        sum[i & 3] += e;
        h[i & 3][(bits >> 23) & (SAMPLE_N_BINS - 1)] += e;
        cnt += v[i] >= thr;
    }
    for (int b = 0; b < SAMPLE_N_BINS; b++) hist[b] = (h[0][b] + h[1][b]) + (h[2][b] + h[3][b]);
    *n_ge = cnt;
    return (sum[0] + sum[1]) + (sum[2] + sum[3]);
}

/* The highest bin b such that the terms in bins >= b hold at least the fraction t (plus a
 * little) of sum; 0 if there is none below the top. */
static int sample_pick_bin(const double *hist, double sum, double t)
{
    double need = (t + fmin(1e-4, (1.0 - t) * 0.5)) * sum, acc = 0;
    for (int b = 127; b > 0; b--) {
        acc += hist[b];
        if (acc >= need) return b;
    }
    return 0;
}

/* A logit threshold whose prefix holds about the terms of bins >= b (terms >= 2^(b-127)). */
static float sample_bin_logit(int b, float mx, float temp)
{
    return mx + (float)(b - 127) * 0.6931472f * temp - 0.01f * fmaxf(temp, 1.0f);
}

/* First i < n where the running double sum of (float)(c[i].p / sum) reaches t (>= t, top-p)
 * or exceeds it (> t, the draw); -1 if none. */
static int sample_walk(const sample_cand *c, int n, double sum, double t, bool strict)
{
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += (float)(c[i].p / sum);
        if (strict ? t < cum : cum >= t) return i;
    }
    return -1;
}

/* Both walks; 1: found at *at, 0: not within c[0..n), -1: the bounds disagree. */
static int sample_walk2(const sample_cand *c, int n, const double *sum, double t, bool strict,
                        int *at)
{
    /* the larger sum gives smaller probabilities, so it stops later (or not at all) */
    int lo = sample_walk(c, n, sum[0], t, strict), hi = sample_walk(c, n, sum[1], t, strict);
    if (hi >= 0 && lo == hi) {
        *at = hi;
        return 1;
    }
    return lo < 0 ? 0 : -1;
}

/* Non-greedy without top-k, on a prefix of the sorted list. Returns -1 where the reference
 * must decide. */
static int32_t sample_prefix(sampler *s, const float *v, float mx, double r)
{
    const sample_params *p = &s->prm;
    int n = s->n_vocab, n_ge = 0, at = 0;
    sample_cand *c = s->cand;
    bool top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    float thr = min_p ? mx + logf(p->min_p) : -INFINITY;
    float lowest = fminf(thr, mx);  /* the min-p set, and at least the max */
    if (!top_p && min_p) {
        int m = sample_collect(c, v, NULL, n, lowest);
        sample_sort_ids(s, c, m);
        int keep = 1;
        while (keep < m && c[keep].logit >= thr) keep++;
        return sample_draw(s, c, keep, r);
    }
    double hist[SAMPLE_N_BINS], sum[2];
    /* top-p: terms of the plain softmax; no cut at all: of the tempered one, for the draw */
    float temp = top_p ? 1.0f : p->temp, m = top_p ? mx : mx / p->temp;
    double tot = sample_exp_pass(s, v, temp, m, thr, hist, &n_ge);
    double rel = (4.0 * n + 16.0) * 0x1p-53;
    sum[0] = tot * (1.0 - rel);
    sum[1] = tot * (1.0 + rel);
    double target = top_p ? (double)p->top_p : r;
    int cap = min_p ? TM_MAX(1, n_ge) : n;  /* min-p keeps at most this many */
    for (int b = sample_pick_bin(hist, tot, target); b > 0; b -= SAMPLE_BIN_STEP) {
        float t = sample_bin_logit(b, mx, temp);
        if (min_p) t = fmaxf(t, lowest);
        int k = sample_collect(c, v, s->e, n, t);
        if (k >= n) return -1;
        sample_sort_ids(s, c, k);
        int lim = TM_MIN(k, cap);
        int res = sample_walk2(c, lim, sum, target, !top_p, &at);
        if (res < 0) return -1;
        if (res == 0 && lim < cap) continue;  /* the prefix ran out: take more */
        if (!top_p) return c[at].id;           /* (res == 1: with no cut, cap is n > lim) */
        return sample_draw(s, c, res ? at + 1 : cap, r);
    }
    return -1;
}

int32_t sample_token(sampler *s, const float *logits)
{
    const sample_params *p = &s->prm;
    int n = s->n_vocab;
    const float *v = sample_has_penalties(s) || p->n_bias > 0 ? sample_penalise(s, logits) : logits;
    if (p->temp <= 0) {
        int best = sample_argmax(v, n);
        return best >= 0 ? best : sample_argmax_scalar(v, n);
    }
    double r = util_rng_uniform(&s->rng);
    if (p->top_k > 0 && p->top_k < n) {
        sample_select_k(s->cand, v, n, p->top_k);
        return sample_chain(s, s->cand, p->top_k, r);
    }
    int best = sample_argmax(v, n);
    if (best < 0 || !isfinite(v[best])) return sample_full(s, v, best < 0, r);
    int32_t tok = sample_prefix(s, v, v[best], r);
    return tok >= 0 ? tok : sample_full(s, v, false, r);
}
