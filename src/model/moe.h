/*
 * moe: the router of a mixture-of-experts layer, token by token, with llama.cpp's arithmetic
 * (build_moe_ffn, as its CPU backend computes it), so that the experts chosen, and how ties
 * between equal scores break, are the same as llama.cpp's:
 *
 *   probs   = softmax(logits)             max, exp(l - max) (ggml's SIMD exp), the sum in
 *                                         double, then each times (float)(1 / sum);
 *             or sigmoid(logits)          1 / (1 + expf(-l)) (DeepSeek V3)
 *   scores  = probs + bias                the selection bias (V3's correction), if any;
 *             groups (n_groups > 1)       the experts cut into n_groups equal groups, a
 *                                         group's score the sum of its 2 best, the
 *                                         n_groups_used best groups kept (argsort as below),
 *                                         the others' scores -inf
 *   order   = argsort(scores, descending) std::sort of the indices 0..n-1 with the
 *                                         comparator scores[a] > scores[b], as libstdc++
 *                                         implements it (introsort, median of three, final
 *                                         insertion sort; heap sort past the depth limit):
 *                                         moe_sort_desc is a port, so equal scores land in
 *                                         the same order as in ggml_argsort
 *   selected = order[0..k)                in that order: slot 0 is the highest score
 *   weights = probs[selected] (unbiased), renormalised (norm_w): w / max(sum(w), 2^-14),
 *             the sum in double as ggml_sum_rows; then times w_scale (ggml_scale) when it is
 *             not 0 or 1
 *
 *   gpt-oss (MOE_GATE_SOFTMAX_WEIGHT): probs = logits (biased by the caller), the top k as
 *             above, weights = softmax over the k selected logits (ggml_soft_max: max, exp,
 *             the sum in double, times (float)(1 / sum)); no renormalisation, no scaling
 *
 * The caller multiplies each selected expert's output by its weight and adds the products in
 * slot order (ggml: moe_out = e0*w0, then moe_out + e1*w1, ...). Pure functions of one
 * token's logits: routing never depends on the batch or the thread count.
 */
#ifndef TM_MOE_H
#define TM_MOE_H

#include <stdbool.h>
#include <stdint.h>

/* Sorts idx[0..n) (any permutation of indices into v) exactly as libstdc++'s std::sort with
 * the comparator v[a] > v[b] would. */
void moe_sort_desc(int32_t *idx, int n, const float *v);

typedef enum {
    MOE_GATE_SOFTMAX = 0,    /* qwen3moe, DeepSeek V2 */
    MOE_GATE_SIGMOID,        /* DeepSeek V3 */
    MOE_GATE_SOFTMAX_WEIGHT, /* gpt-oss: the top k of the logits themselves, weighted by a
                              * softmax over those k logits (llama.cpp's SOFTMAX_WEIGHT) */
} moe_gate;

/* A router's configuration (one per model). */
typedef struct {
    moe_gate gate;
    int n_expert;            /* experts of the layer */
    int k;                   /* experts per token, <= n_expert */
    bool norm_w;             /* renormalise the k weights to sum to 1 */
    float w_scale;           /* weights times this (routed scaling), 0 or 1: none */
    int n_groups;            /* group-limited selection when > 1 (n_expert a multiple) */
    int n_groups_used;       /* groups kept, 1..n_groups */
} moe_router;

/* Scratch floats and ints moe_route needs for a router of n_expert experts. */
#define MOE_SCRATCH(n_expert) (3 * (size_t)(n_expert))

/* Routes one token: logits (n_expert) in, sel (k) expert ids, best first, and w (k) weights
 * out. bias (n_expert) is the layer's selection bias or NULL. fs and is are scratch of
 * MOE_SCRATCH(n_expert) floats and ints; fs starts with the probabilities afterwards.
 * Returns the routing margin: the smallest difference between a kept and a dropped
 * candidate at a boundary the selection drew, in the units it compared (the best dropped
 * group's score below the last kept group's, the best dropped expert's score below the
 * last kept expert's); INFINITY when nothing was dropped. Two engines whose scores differ by
 * more than the margin may route the token differently. */
float moe_route(const moe_router *r, const float *logits, const float *bias, float *fs, int32_t *is, int32_t *sel,
               float *w);

#endif
