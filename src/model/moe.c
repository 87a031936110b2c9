/*
 * moe: the router (see moe.h). moe_sort_desc follows libstdc++'s std::sort step for step
 * (bits/stl_algo.h, bits/stl_heap.h): only then do equal scores come out in ggml_argsort's
 * order, since std::sort is not stable.
 */
#include "model/moe.h"

#include <math.h>

#include "model/ops.h"

#define MOE_SORT_THRESHOLD 16   /* libstdc++'s _S_threshold */

/* comp(a, b) of ggml's cmp_argsort<DESC>: v[a] > v[b] */
#define MOE_GT(a, b) (v[a] > v[b])

static void moe_swap(int32_t *a, int32_t *b)
{
    int32_t t = *a;
    *a = *b;
    *b = t;
}

static void moe_push_heap(int32_t *first, long hole, long top, int32_t value, const float *v)
{
    long parent = (hole - 1) / 2;
    while (hole > top && MOE_GT(first[parent], value)) {
        first[hole] = first[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    first[hole] = value;
}

static void moe_adjust_heap(int32_t *first, long hole, long len, int32_t value, const float *v)
{
    const long top = hole;
    long child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (MOE_GT(first[child], first[child - 1])) child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    moe_push_heap(first, hole, top, value, v);
}

/* std::__partial_sort(first, last, last): make_heap then sort_heap */
static void moe_heap_sort(int32_t *first, int32_t *last, const float *v)
{
    long len = last - first;
    if (len < 2) return;
    for (long parent = (len - 2) / 2;; parent--) {
        moe_adjust_heap(first, parent, len, first[parent], v);
        if (parent == 0) break;
    }
    while (last - first > 1) {
        --last;
        int32_t value = *last;
        *last = *first;
        moe_adjust_heap(first, 0, last - first, value, v);
    }
}

static void moe_move_median_to_first(int32_t *result, int32_t *a, int32_t *b, int32_t *c, const float *v)
{
    if (MOE_GT(*a, *b)) {
        if (MOE_GT(*b, *c)) moe_swap(result, b);
        else if (MOE_GT(*a, *c)) moe_swap(result, c);
        else moe_swap(result, a);
    } else if (MOE_GT(*a, *c)) {
        moe_swap(result, a);
    } else if (MOE_GT(*b, *c)) {
        moe_swap(result, c);
    } else {
        moe_swap(result, b);
    }
}

static int32_t *moe_unguarded_partition(int32_t *first, int32_t *last, const int32_t *pivot, const float *v)
{
    for (;;) {
        while (MOE_GT(*first, *pivot)) ++first;
        --last;
        while (MOE_GT(*pivot, *last)) --last;
        if (!(first < last)) return first;
        moe_swap(first, last);
        ++first;
    }
}

static void moe_introsort_loop(int32_t *first, int32_t *last, int depth, const float *v)
{
    while (last - first > MOE_SORT_THRESHOLD) {
        if (depth == 0) {
            moe_heap_sort(first, last, v);
            return;
        }
        --depth;
        int32_t *mid = first + (last - first) / 2;
        moe_move_median_to_first(first, first + 1, mid, last - 1, v);
        int32_t *cut = moe_unguarded_partition(first + 1, last, first, v);
        moe_introsort_loop(cut, last, depth, v);
        last = cut;
    }
}

static void moe_unguarded_linear_insert(int32_t *last, const float *v)
{
    int32_t val = *last;
    int32_t *next = last - 1;
    while (MOE_GT(val, *next)) {
        *last = *next;
        last = next;
        --next;
    }
    *last = val;
}

static void moe_insertion_sort(int32_t *first, int32_t *last, const float *v)
{
    if (first == last) return;
    for (int32_t *i = first + 1; i != last; ++i) {
        if (MOE_GT(*i, *first)) {
            int32_t val = *i;
            for (int32_t *p = i; p > first; p--) p[0] = p[-1];
            *first = val;
        } else {
            moe_unguarded_linear_insert(i, v);
        }
    }
}

void moe_sort_desc(int32_t *idx, int n, const float *v)
{
    if (n < 2) return;
    int lg = 0;
    while ((2L << lg) <= n) lg++;   /* std::__lg(n) = floor(log2 n) */
    moe_introsort_loop(idx, idx + n, 2 * lg, v);
    if (n > MOE_SORT_THRESHOLD) {
        moe_insertion_sort(idx, idx + MOE_SORT_THRESHOLD, v);
        for (int32_t *i = idx + MOE_SORT_THRESHOLD; i != idx + n; ++i) moe_unguarded_linear_insert(i, v);
    } else {
        moe_insertion_sort(idx, idx + n, v);
    }
}

float moe_route(const moe_router *r, const float *logits, const float *bias, float *fs, int32_t *is, int32_t *sel,
                float *w)
{
    float margin = INFINITY;
    const int n = r->n_expert, k = r->k;
    float *probs = fs, *score = fs + n, *gscore = fs + 2 * n;
    int32_t *idx = is, *gidx = is + n, *lidx = is + 2 * n;
    if (r->gate == MOE_GATE_SIGMOID) {
        for (int i = 0; i < n; i++) probs[i] = 1.f / (1.f + expf(-logits[i]));
    } else if (r->gate == MOE_GATE_SOFTMAX_WEIGHT) {
        for (int i = 0; i < n; i++) probs[i] = logits[i];
    } else {
        float max = -INFINITY;
        for (int i = 0; i < n; i++) {
            probs[i] = logits[i];
            max = logits[i] > max ? logits[i] : max;
        }
        ops_vec_softmax_exp(n, probs, max);
        double sum = 0;
        for (int i = 0; i < n; i++) sum += probs[i];
        const float inv = (float)(1.0 / sum);
        for (int i = 0; i < n; i++) probs[i] *= inv;
    }
    const float *sc = probs;
    if (bias || r->n_groups > 1) {
        for (int i = 0; i < n; i++) score[i] = bias ? probs[i] + bias[i] : probs[i];
        sc = score;
    }
    if (r->n_groups > 1) {
        /* a group's score: its two best (ggml_argsort_top_k(group, 2), get_rows, sum_rows) */
        const int G = r->n_groups, per = n / G;
        for (int g = 0; g < G; g++) {
            for (int i = 0; i < per; i++) lidx[i] = i;
            moe_sort_desc(lidx, per, score + (size_t)g * per);
            gscore[g] = (float)((double)score[g * per + lidx[0]] + (double)score[g * per + lidx[1]]);
            gidx[g] = g;
        }
        moe_sort_desc(gidx, G, gscore);
        if (r->n_groups_used < G) margin = gscore[gidx[r->n_groups_used - 1]] - gscore[gidx[r->n_groups_used]];
        /* the other groups' scores -inf (ggml_fill, then set_rows of the kept groups) */
        for (int i = 0; i < n; i++) lidx[i] = 0;
        for (int u = 0; u < r->n_groups_used; u++)
            for (int i = 0; i < per; i++) lidx[gidx[u] * per + i] = 1;
        for (int i = 0; i < n; i++)
            if (!lidx[i]) score[i] = -INFINITY;
    }
    for (int i = 0; i < n; i++) idx[i] = i;
    moe_sort_desc(idx, n, sc);
    /* the last kept expert over the first left out, unless that one's group was (its -inf
     * score: the groups' margin decided) */
    if (k < n && sc[idx[k]] != -INFINITY && sc[idx[k - 1]] - sc[idx[k]] < margin) margin = sc[idx[k - 1]] - sc[idx[k]];
    double ws = 0;
    for (int s = 0; s < k; s++) {
        sel[s] = idx[s];
        w[s] = probs[idx[s]];
        ws += w[s];
    }
    if (r->gate == MOE_GATE_SOFTMAX_WEIGHT) {
        float max = -INFINITY;
        for (int s = 0; s < k; s++) max = w[s] > max ? w[s] : max;
        ops_vec_softmax_exp(k, w, max);
        double sum = 0;
        for (int s = 0; s < k; s++) sum += w[s];
        const float inv = (float)(1.0 / sum);
        ws = 0;
        for (int s = 0; s < k; s++) {
            w[s] *= inv;
            ws += w[s];
        }
    }
    if (r->norm_w) {
        float d = (float)ws;
        if (!(d >= 6.103515625e-5f)) d = 6.103515625e-5f;   /* ggml_clamp(sum, 2^-14, inf) */
        for (int s = 0; s < k; s++) w[s] /= d;
    }
    if (r->w_scale != 0.0f && r->w_scale != 1.0f)
        for (int s = 0; s < k; s++) w[s] *= r->w_scale;
    return margin;
}
