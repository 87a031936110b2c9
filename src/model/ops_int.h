/*
 * ops_int: what only ops*.c may see: the kernel table that ops.c fills from the scalar
 * reference and then lets ops_avx2.c / ops_avx512.c (or ops_neon.c) override with theirs.
 *
 * A gemm kernel computes y[t * y_stride + r] = dot(W row r, X row t) for r < nr, t < nt,
 * where W rows are w_stride bytes apart (weight type) and X rows x_stride bytes apart (its
 * vec-dot type, already quantised). It tiles rows x tokens internally, but must compute every
 * (r, t) element in the same arithmetic order whatever the tile it falls in (nr, nt, its
 * offsets): batch invariance (test_ops.c checks it bit for bit).
 */
#ifndef TM_OPS_INT_H
#define TM_OPS_INT_H

#include "model/ops.h"

typedef void (*ops_gemm_fn)(int64_t cols, const void *w, size_t w_stride, int nr, const void *x,
                            size_t x_stride, int nt, float *y, size_t y_stride);

typedef struct {
    ops_gemm_fn gemm[QTYPE_COUNT_MAX];                               /* by weight type */
    /* Activation quantisers: elements [e0, e1) (block aligned) of one token's row x of
     * `cols` into that token's buffer `dst`, in the format the same level's gemm reads
     * (the scalar level: block_q8_0 / block_q8_K rows). act_row_bytes: bytes per token. */
    void (*quant_q8_0)(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1);
    void (*quant_q8_K)(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1);
    void (*quant_q8_1)(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1); /* block_q8_1
                                                                                        * at every level */
    size_t (*act_row_bytes)(qtype vt, int64_t cols);
    void (*to_f16)(const float *x, fp16_t *y, int64_t n);
    void (*from_f16)(const fp16_t *x, float *y, int64_t n);
    void (*to_bf16)(const float *x, bf16_t *y, int64_t n);
    float (*dot_f16_f32)(int n, const fp16_t *a, const float *b);
    float (*dot_f16)(int n, const fp16_t *a, const fp16_t *b);
    void (*mad_f16)(int n, float *y, const fp16_t *x, float s);
    float (*dot_f32)(int n, const float *a, const float *b);
    /* a quantised KV row (block_q8_0 / block_q4_0) . a query row quantised to Q8_0 */
    float (*dot_kv_q8_0)(int n, const void *k, const block_q8_0 *q);
    float (*dot_kv_q4_0)(int n, const void *k, const block_q8_0 *q);
    void (*mad_f32)(int n, float *y, const float *x, float s);
    void (*scale_f32)(int n, float *y, float s);
    float (*softmax_exp)(int n, float *y, float max);
    float (*max_f32)(int n, const float *x);
    void (*rmsnorm_row)(float *out, const float *x, const float *w, int n, float eps);
    void (*swiglu)(float *out, const float *g, const float *u, int64_t n);
    void (*add)(float *y, const float *x, int64_t n);
    void (*att_block)(const ops_att_block_args *a);
    /* the xor of the n / 8 little-endian 64-bit words at p (n a multiple of 8), read once
     * with the level's widest loads (ops_stream_read) */
    uint64_t (*stream_read)(const void *p, size_t n);
} ops_kernels;

void ops_kernels_init_scalar(ops_kernels *k);
/* Bytes per token of the Q8_0 activation format of the AVX-512 level: cols signed bytes of q,
 * then cols/32 float scales (fp16-rounded), then cols/32 int32 (-128 * the block's sum). */
static inline size_t ops_q8_0x_row_bytes(int64_t cols) { return (size_t)cols + (size_t)cols / 4; }
/* Attention block kernels (att_block): the furthest key any of rows [i0, i1) sees in the
 * block, max of lim[i] (0 for no rows). */
static inline int ops_att_lim_max(const int32_t *lim, int i0, int i1)
{
    int m = 0;
    for (int i = i0; i < i1; i++) m = lim[i] > m ? lim[i] : m;
    return m;
}
/* Each overrides entries of the table: the x86 ones after scalar and in this order, the
 * aarch64 one after scalar. Only the target architecture's files are compiled. */
void ops_kernels_init_avx2(ops_kernels *k);
void ops_kernels_init_avx512(ops_kernels *k);
void ops_kernels_init_neon(ops_kernels *k);
/* The codebook and ternary types' kernels (ops_iq.c, ops_iq_avx2.c, ops_iq_avx512.c):
 * ops_kernels_init_scalar calls the first, ops_kernels_init_avx2 the second,
 * ops_kernels_init_avx512 the third. */
void ops_iq_init_scalar(ops_kernels *k);
void ops_iq_init_avx2(ops_kernels *k);
void ops_iq_init_avx512(ops_kernels *k);
/* A gemm kernel (ops_gemm_fn) from a row dot `float dot(int64_t cols, const WT *w, const
 * XT *x)`: every (row, token) by itself, so any tiling computes it alike. */
#define OPS_GEMM_OF_DOT(name, dot, WT, XT)                                                         \
    static void name(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs, int nt, \
                     float *y, size_t ys)                                                          \
    {                                                                                              \
        for (int t = 0; t < nt; t++)                                                               \
            for (int r = 0; r < nr; r++)                                                           \
                y[(size_t)t * ys + r] = dot(cols, (const WT *)((const char *)w + r * ws),          \
                                            (const XT *)((const char *)x + t * xs));               \
    }

#endif
