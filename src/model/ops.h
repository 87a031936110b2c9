/*
 * ops: the CPU kernels of the forward pass: quantised matrix multiplication against
 * quantised activations (as llama.cpp's CPU backend does it), and the elementwise ops.
 *
 * Every op exists as a portable scalar reference and as AVX2 and AVX-512 (VNNI) versions,
 * picked once at run time from cpu_get_level() (TOKENMILL_SIMD caps it; tests switch with
 * ops_force_level). Ops that take a threadpool split their work over its threads by ith/nth;
 * a NULL pool means "run on the caller". Results do not depend on the thread count: every
 * output element is computed by exactly one thread in a fixed order. Nor do they depend on
 * the batch: a matmul computes each (row, token) dot product in the same order whatever
 * n_tokens and wherever the token sits in the batch (kernel tiles only share loads), so a
 * token's y is bit-identical alone or batched (the engine's batch invariance rests on it).
 *
 * Numerics mirror ggml: activations are quantised to the weight type's vec-dot type (Q8_0,
 * Q8_K; F16 for F16 weights, BF16 for BF16) with llama.cpp's x86 rounding, integer dot
 * products are exact, RMS norm sums squares in double, RoPE builds sin/cos like ggml.
 */
#ifndef TM_OPS_H
#define TM_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "model/quant.h"
#include "util/threadpool.h"
#include "util/cpu.h"

/* A weight matrix as stored in GGUF: `rows` rows of `cols` elements (ne[0] = cols,
 * ne[1] = rows), row-major, each row quant_row_bytes(type, cols) bytes. */
typedef struct {
    qtype type;          /* element type */
    int64_t rows, cols;  /* shape; cols a multiple of the type's block size */
    const void *data;    /* rows * quant_row_bytes(type, cols) bytes */
} ops_weight;

/* Rows [r0, r0 + n) of w as a weight of their own (a slice that starts on a 16-row group of a
 * repacked layout is one too). */
static inline ops_weight ops_weight_rows(const ops_weight *w, int64_t r0, int64_t n)
{
    return (ops_weight){ w->type, n, w->cols, (const char *)w->data + quant_row_bytes(w->type, w->cols) * (size_t)r0 };
}

/* Bytes of scratch ops_matmul needs for n_tokens activations of `cols` against weights of
 * type wtype (the quantised activations; 0 for F32 weights, plus slack for alignment). */
size_t ops_matmul_scratch_bytes(qtype wtype, int64_t cols, int n_tokens);

/* y[t][r] = dot(W row r, x[t]) for t < n_tokens, r < w->rows. x is (n_tokens, cols) floats,
 * y is (n_tokens, rows) floats (must not alias x). x is first quantised to the vec-dot type
 * in scratch (ops_matmul_scratch_bytes). Each weight row is read from memory once per call
 * for the whole batch. */
void ops_matmul(threadpool *tp, const ops_weight *w, const float *x, int n_tokens, float *y,
                void *scratch);

/* Weight repacking. ops_repack_type(w) is the layout that w is best repacked into for the
 * active level's kernels (quant_repack: Q8_0, Q4_0, MXFP4, Q4_K and Q6_K with rows a multiple
 * of 16, and columns a multiple of the repacked block, into the 16-row interleaved layouts, on
 * AVX-512), or w->type when there is none or TOKENMILL_REPACK=0 is set. Every level runs every
 * layout, and a repacked weight gives bit-identical results to the original layout's scalar
 * reference (the AVX-512 file-layout kernels of Q8_0/Q4_0/MXFP4 sum in another order). */
qtype ops_repack_type(const ops_weight *w);
/* Repacks w into dst (quant_row_bytes(ops_repack_type(w), w->cols) * w->rows bytes, 64-byte
 * aligned), split over the pool's threads; returns the view of dst. */
ops_weight ops_repack(threadpool *tp, const ops_weight *w, void *dst);

/* n_w matmuls with the same x and cols (Q/K/V, gate/up) in one pool call, x quantised once
 * per distinct vec-dot type: ys[i] is (n_tokens, ws[i]->rows). scratch: when all weights
 * share one vec-dot type (real models: Q4_K with Q6_K, ...) the max over the weights of
 * ops_matmul_scratch_bytes; in general ops_matmul_multi_scratch_bytes. n_w <= 8. */
void ops_matmul_multi(threadpool *tp, int n_w, const ops_weight *const *ws, const float *x,
                      int n_tokens, float *const *ys, void *scratch);
size_t ops_matmul_multi_scratch_bytes(int n_w, const ops_weight *const *ws, int n_tokens);

/* ops_matmul_multi on the calling thread, for many products with one input (the row chunks of
 * an expert, each its own work item): x is quantised into scratch only when *held is not x,
 * and *held is x afterwards. The caller keeps *held for one scratch and one set of vec-dot
 * types and cols (row slices of the same weights), and resets it to NULL when those change.
 * The results are ops_matmul_multi's, bit for bit. n_w <= 8. */
void ops_matmul_reuse(int n_w, const ops_weight *const *ws, const float *x, int n_tokens, float *const *ys,
                      void *scratch, const float **held);

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of n floats; w (n) or NULL for none.
 * out may equal x. */
void ops_rmsnorm(threadpool *tp, float *out, const float *x, const float *w, int rows, int n,
                 float eps);
/* out = silu(gate) * up, (rows, n); out may equal gate or up. */
void ops_swiglu(threadpool *tp, float *out, const float *gate, const float *up, int rows, int n);
/* ggml's GELU (tanh form) as its CPU backend computes it: 0 for x <= -10, x for x >= 10, else
 * x rounded to fp16 looked up in a table of every fp16 value's GELU rounded to fp16. */
float ops_gelu(float x);
/* out = gelu(gate) * up with that GELU (ggml's geglu), (rows, n); out may equal gate or up. */
void ops_geglu(threadpool *tp, float *out, const float *gate, const float *up, int rows, int n);
/* x = c * tanh(x / c) in place, n floats (a final logit soft cap), as ggml computes it: x times
 * 1/c, tanhf, times c. */
void ops_softcap(threadpool *tp, float *x, int64_t n, float c);
/* gpt-oss's clamped SwiGLU, as ggml's swiglu_oai computes it (scalar there too, so one
 * scalar version here): x = min(gate, limit), y = clamp(up, -limit, limit),
 * out = x / (1 + exp(-alpha x)) * (y + 1), n floats, on the caller's thread; out may equal
 * gate or up. */
void ops_swiglu_oai(float *out, const float *gate, const float *up, int64_t n, float alpha, float limit);
/* y += x, n floats. */
void ops_add(threadpool *tp, float *y, const float *x, int64_t n);
/* Reads n bytes at p once, each thread of tp a contiguous share, with the widest loads of the
 * level and nothing else: the rate a decode step's weight streaming is held against (`bench
 * --limit`). Returns the xor of the n / 8 64-bit words (n a multiple of 8), the same at every
 * level, so that the loads cannot be left out. */
uint64_t ops_stream_read(threadpool *tp, const void *p, size_t n);

/* Rotary embedding in place on x (rows, n_heads, head_dim): the first n_rot dims of each head
 * rotate by theta_i = pos[row] * inv_freq[i], i < n_rot/2. neox = 0 pairs (2i, 2i+1) (llama),
 * neox = 1 pairs (i, i + n_rot/2) (qwen2, qwen3). */
void ops_rope(threadpool *tp, float *x, const int32_t *pos, int rows, int n_heads, int head_dim,
              int n_rot, int neox, const float *inv_freq);
/* The same with ggml's exact angle arithmetic: theta starts at (float)pos and is multiplied by
 * theta_scale (= powf(freq_base, -2.0f/n_rot)) once per pair; each pair's angle is
 * freq_scale * theta / freq_factors[i] (freq_factors (n_rot/2) or NULL); cos and sin are
 * multiplied by mscale (llama.cpp's attn_factor, normally 1). yarn: NULL, or {ext_factor,
 * corr_dims[0], corr_dims[1]} for ggml's YaRN (rope_yarn: pair i's angle mixes the
 * interpolated and the extrapolated one by the ramp over the corr dims, and mscale is
 * multiplied by 1 + 0.1 ln(1/freq_scale)). */
void ops_rope_ggml(threadpool *tp, float *x, const int32_t *pos, int rows, int n_heads,
                   int head_dim, int n_rot, int neox, float theta_scale, float freq_scale,
                   const float *freq_factors, float mscale, const float *yarn);

/* Vector helpers for attention (single-threaded, SIMD). */
float ops_vec_dot_f16_f32(int n, const fp16_t *a, const float *b);
float ops_vec_dot_f16(int n, const fp16_t *a, const fp16_t *b);   /* ggml's vec_dot_f16 */
void ops_vec_mad_f16(int n, float *y, const fp16_t *x, float s);  /* y += s * x */
float ops_vec_dot_f32(int n, const float *a, const float *b);
void ops_vec_mad_f32(int n, float *y, const float *x, float s);   /* y += s * x */
/* A row k of a quantised KV cache (t = QTYPE_Q8_0 or QTYPE_Q4_0, n values) dotted with a
 * query row q quantised to Q8_0 (quant_act_q8_0): ggml's vec_dot_q8_0_q8_0 / q4_0_q8_0, exact
 * integer dots per 32-value block scaled by both blocks' scales. */
float ops_vec_dot_kv(qtype t, int n, const void *k, const block_q8_0 *q);
void ops_vec_scale_f32(int n, float *y, float s);                 /* y *= s */
/* Each of the n_rows rows of n values (n a power of two) times the orthonormal Walsh-Hadamard
 * matrix of order n, in place: x * (1 / sqrt(n)), then log2(n) butterfly passes (u + v,
 * u - v) with half-widths 1, 2, 4, ... The order of ggml's CPU FWHT (the matmul it runs for a
 * Hadamard-hinted src0), so the results are bit-identical to it. */
void ops_hadamard_rows(float *x, int64_t n_rows, int n);
/* The order llama.cpp gives that rotation for rows of n values: the largest power of two from 64
 * dividing n; 0 (no rotation) when 64 does not divide n. */
int ops_hadamard_order(int n);
/* y = exp(x - max) in place, returns the sum (softmax numerator). */
float ops_vec_softmax_exp(int n, float *y, float max);
float ops_vec_max_f32(int n, const float *x);
void ops_fp32_to_fp16_row(const float *x, fp16_t *y, int64_t n);
void ops_fp16_to_fp32_row(const fp16_t *x, float *y, int64_t n);

/* One block of keys of flash attention for nq query rows of one kv head, with the queries
 * in SIMD lanes (no horizontal sums, no transposed V):
 *   st[j][i] = (k_j . q_i) * scale, the dot summed over d = 0..hd-1 in order (one FMA chain
 *            per (i, j), whatever lane or tile i falls in);
 *   online softmax per row i over its first lim[i] keys: m[i] = max(m[i], max_j st),
 *            a raised max rescales acc[i] and s[i] by exp(old - new), p = exp(st - m[i]),
 *            s[i] += p in key order (keys at or past lim[i] give p = 0);
 *   acc[i] += sum_j p[j][i] * v_j, in key order.
 * A row's arithmetic depends only on its own q, its lim and the block's K/V rows below lim:
 * keys past lim add exact zeros, so the result does not depend on nq, nb or the row's place
 * in the tile (batch invariance). Pad lanes of qt (i in [nq, nqp)) must be finite. */
typedef struct {
    int hd;              /* head size */
    int nq;              /* query rows */
    int nqp;             /* row stride of qt and st: nq rounded up to 16 */
    int nb;              /* keys in the block, 1..OPS_ATT_KT_KEYS (a KV pool block) */
    float scale;         /* score scale (1/sqrt(hd)) */
    const float *qt;     /* (hd, nqp) queries, transposed */
    const float *k;      /* (nb, hd) keys */
    const float *v;      /* (nb, hd) values */
    const int32_t *lim;  /* (nq) keys of this block row i sees, 0..nb (causal cut) */
    float *st;           /* (nb, nqp) scratch: scores, then probabilities */
    float *m;            /* (nq) running max of each row, -INFINITY at the start */
    float *s;            /* (nq) running softmax sum of each row, 0 at the start */
    float *acc;          /* (nq, hd) running sum of p * v of each row, 0 at the start */
    float *kt;           /* (hd, OPS_ATT_KT_KEYS) scratch for the block's keys transposed, or
                          * NULL: with it, kernels may put the keys in lanes for few query
                          * rows (a decode token), with the same bits per row */
} ops_att_block_args;
#define OPS_ATT_KT_KEYS 128   /* kt's row stride: the most keys in one block */
void ops_att_block(const ops_att_block_args *a);

/* Profiling: while a counter is attached on this thread, ops_matmul adds to it the seconds
 * this thread spends quantising activations before a pool round (the decode-sized batches,
 * which the caller quantises alone). NULL detaches. */
void ops_profile_attach(double *quant_s);

/* Active instruction set ("scalar", "avx2", "avx512", "neon"). */
const char *ops_level_name(void);
cpu_level ops_get_level(void);
/* Selects the kernels of `lvl` (capped at what the hardware has). Not thread-safe against
 * running ops; tests call it between ops. */
void ops_force_level(cpu_level lvl);

#endif
