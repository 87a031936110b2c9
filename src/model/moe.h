/*
 * moe: the router of a mixture-of-experts layer, token by token, with llama.cpp's arithmetic
 * (build_moe_ffn with softmax gating, as its CPU backend computes it), so that the experts
 * chosen, and how ties between equal scores break, are the same as llama.cpp's:
 *
 *   probs   = softmax(logits)             max, exp(l - max) (ggml's SIMD exp), the sum in
 *                                         double, then each times (float)(1 / sum)
 *   order   = argsort(probs, descending)  std::sort of the indices 0..n-1 with the
 *                                         comparator probs[a] > probs[b], as libstdc++
 *                                         implements it (introsort, median of three, final
 *                                         insertion sort; heap sort past the depth limit):
 *                                         moe_sort_desc is a port, so equal scores land in
 *                                         the same order as in ggml_argsort
 *   selected = order[0..k)                in that order: slot 0 is the highest score
 *   weights = probs[selected], renormalised (norm_w): w / max(sum(w), 2^-14), the sum in
 *             double as ggml_sum_rows
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

/* Routes one token: logits (n_expert) in, sel (k) expert ids and w (k) weights out. probs
 * (n_expert) and idx (n_expert) are scratch; probs holds the softmax afterwards. norm_w:
 * renormalise the k weights to sum to 1 (qwen3moe). */
void moe_route_softmax(const float *logits, int n_expert, int k, bool norm_w, float *probs, int32_t *idx,
                       int32_t *sel, float *w);

#endif
