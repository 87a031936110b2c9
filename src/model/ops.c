/*
 * ops: dispatch, threading and the scalar reference kernels (see ops.h).
 *
 * The kernel table (ops_int.h) starts as the scalar reference; ops_avx2.c and ops_avx512.c
 * override entries when the CPU level allows. The threaded drivers here are shared by all
 * levels: ops_matmul quantises the activations in a first phase (blocks split evenly over
 * threads), meets at a barrier, then hands out chunks of (weight, row range, token range)
 * from an atomic counter. A chunk covers all tokens up to OPS_TOKEN_CHUNK, so that each
 * weight row is streamed from memory once per call for a decode batch and once per
 * OPS_TOKEN_CHUNK tokens for prefill, where the rest come from cache. On aarch64 ops_neon.c
 * takes the place of the two x86 files.
 *
 * Scalar reference semantics (the SIMD kernels agree up to float summation order):
 * quantised dots sum exact integers per block and accumulate block results in float, in
 * block order; float dots (F32, F16, BF16) accumulate in double.
 */
#include "model/ops.h"
#include "model/ops_int.h"
#include "util/util.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define OPS_TOKEN_CHUNK 128  /* tokens per matmul chunk */
#define OPS_ROW_ALIGN 16     /* row chunks are multiples of this (kernel tile rows) */
#define OPS_MAX_MULTI 8      /* weights per ops_matmul_multi call */
#define OPS_OWN_MAX 64       /* threads with their own chunk range; more share the last ranges */
#define OPS_ROPE_MAX_DIM 1024
#define OPS_PREQUANT_MAX 32768 /* activations quantised by the caller up to this many floats */
#define OPS_INLINE_MACS (1 << 18) /* matmuls below this many multiply-adds skip the pool: waking
                                   * a sleeping worker costs more than the work itself */

static ops_kernels ops_k;
static cpu_level ops_level = (cpu_level)-1;
static _Thread_local double *ops_prof_quant; /* ops_profile_attach's counter, or NULL */

void ops_profile_attach(double *quant_s) { ops_prof_quant = quant_s; }

/* ---- scalar reference kernels --------------------------------------------------------- */

static float ops_dot_q8_0_q8_0(int64_t n, const block_q8_0 *w, const block_q8_0 *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += w[b].qs[j] * x[b].qs[j];
        sumf += (float)sumi * (quant_fp16_to_fp32(w[b].d) * quant_fp16_to_fp32(x[b].d));
    }
    return sumf;
}

static float ops_dot_q4_0_q8_0(int64_t n, const block_q4_0 *w, const block_q8_0 *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((w[b].qs[j] & 0x0F) - 8) * x[b].qs[j];
            sumi += ((w[b].qs[j] >> 4) - 8) * x[b].qs[j + QK4_0 / 2];
        }
        sumf += (float)sumi * (quant_fp16_to_fp32(w[b].d) * quant_fp16_to_fp32(x[b].d));
    }
    return sumf;
}

/* ggml's vec_dot_mxfp4_q8_0: per block d = fp16(d_x) * e8m0_half(e) times the integer dot of
 * the doubled E2M1 values with the activations. */
static float ops_dot_mxfp4_q8_0(int64_t n, const block_mxfp4 *w, const block_q8_0 *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_MXFP4; b++) {
        int sumi = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            sumi += quant_kvalues_mxfp4[w[b].qs[j] & 0x0F] * x[b].qs[j];
            sumi += quant_kvalues_mxfp4[w[b].qs[j] >> 4] * x[b].qs[j + QK_MXFP4 / 2];
        }
        sumf += (float)sumi * (quant_e8m0_half(w[b].e) * quant_fp16_to_fp32(x[b].d));
    }
    return sumf;
}

/* The 32-element types against Q8_1 (ggml's vec_dot_{q4_1,q5_1}_q8_1, and for Q5_0 / IQ4_NL
 * its _q8_0 ones: Q8_1's d and qs are Q8_0's). ops_unpack_32 gives a block's 32 integer
 * values; per block sumf += sumi * (d_w * d_x), plus m_w * s_x for the types with a min. */
static inline void ops_unpack_32(qtype t, const void *blk, int8_t v[32])
{
    const uint8_t *qs, *qhp = NULL;
    int off = 0;
    switch (t) {
    case QTYPE_Q4_1: qs = ((const block_q4_1 *)blk)->qs; break;
    case QTYPE_Q5_0: qs = ((const block_q5_0 *)blk)->qs, qhp = ((const block_q5_0 *)blk)->qh, off = 16; break;
    case QTYPE_Q5_1: qs = ((const block_q5_1 *)blk)->qs, qhp = ((const block_q5_1 *)blk)->qh; break;
    default: qs = ((const block_iq4_nl *)blk)->qs; break;
    }
    uint32_t qh = qhp ? (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 | (uint32_t)qhp[3] << 24 : 0;
    for (int j = 0; j < 16; j++) {
        int lo = qs[j] & 0xF, hi = qs[j] >> 4;
        if (t == QTYPE_IQ4_NL) {
            v[j] = quant_kvalues_iq4nl[lo];
            v[j + 16] = quant_kvalues_iq4nl[hi];
        } else {
            v[j] = (int8_t)((lo | (((qh >> j) & 1) << 4)) - off);
            v[j + 16] = (int8_t)((hi | (((qh >> (j + 16)) & 1) << 4)) - off);
        }
    }
}

static inline float ops_dot_32_q8_1(int64_t n, qtype t, const void *w, const block_q8_1 *x)
{
    const size_t bsz = quant_block_bytes(t);
    float sumf = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        const char *wb = (const char *)w + (size_t)b * bsz;
        int8_t v[32];
        ops_unpack_32(t, wb, v);
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += v[j] * x[b].qs[j];
        const fp16_t *dm = (const fp16_t *)wb; /* every one of these blocks starts with d (and m) */
        sumf += (float)sumi * (quant_fp16_to_fp32(dm[0]) * quant_fp16_to_fp32(x[b].d));
        if (t == QTYPE_Q4_1 || t == QTYPE_Q5_1) sumf += quant_fp16_to_fp32(dm[1]) * quant_fp16_to_fp32(x[b].s);
    }
    return sumf;
}

static float ops_dot_q4_1_q8_1(int64_t n, const void *w, const block_q8_1 *x) { return ops_dot_32_q8_1(n, QTYPE_Q4_1, w, x); }
static float ops_dot_q5_0_q8_1(int64_t n, const void *w, const block_q8_1 *x) { return ops_dot_32_q8_1(n, QTYPE_Q5_0, w, x); }
static float ops_dot_q5_1_q8_1(int64_t n, const void *w, const block_q8_1 *x) { return ops_dot_32_q8_1(n, QTYPE_Q5_1, w, x); }
static float ops_dot_iq4_nl_q8_1(int64_t n, const void *w, const block_q8_1 *x) { return ops_dot_32_q8_1(n, QTYPE_IQ4_NL, w, x); }

/* Q2_K: per super-block d_x*d_w * sum_j sc_j * dot_j - d_x*dmin_w * sum_j m_j * bsum_j. */
static float ops_dot_q2_K_q8_K(int64_t n, const block_q2_K *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int isum = 0, summs = 0;
        for (int j = 0; j < 16; j++) summs += x[b].bsums[j] * (w[b].scales[j] >> 4);
        for (int g = 0; g < 16; g++) {
            /* group g: elements 16g.., of chunk c = g/2 (n = c/4, shift 2*(c%4)), half g%2 */
            int c = g / 2, sh = 2 * (c % 4);
            const uint8_t *q = w[b].qs + 32 * (c / 4) + 16 * (g % 2);
            int dot = 0;
            for (int l = 0; l < 16; l++) dot += ((q[l] >> sh) & 3) * x[b].qs[16 * g + l];
            isum += (w[b].scales[g] & 0xF) * dot;
        }
        float dall = x[b].d * quant_fp16_to_fp32(w[b].d), dmin = x[b].d * quant_fp16_to_fp32(w[b].dmin);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

/* Q3_K: per super-block d_x*d_w * sum_g (sc_g - 32) * dot_g. */
static float ops_dot_q3_K_q8_K(int64_t n, const block_q3_K *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int8_t sc[16];
        quant_q3_K_scales(w[b].scales, sc);
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int c = g / 2, sh = 2 * (c % 4);
            int l0 = 16 * (g % 2);
            const uint8_t *q = w[b].qs + 32 * (c / 4);
            int dot = 0;
            for (int l = l0; l < l0 + 16; l++) {
                int v = ((q[l] >> sh) & 3) - ((w[b].hmask[l] >> c) & 1 ? 0 : 4);
                dot += v * x[b].qs[16 * g + l - l0];
            }
            isum += (sc[g] - 32) * dot;
        }
        sumf += x[b].d * quant_fp16_to_fp32(w[b].d) * (float)isum;
    }
    return sumf;
}

/* IQ4_XS: per super-block d_x*d_w * sum_j (ls_j - 32) * dot_j. */
static float ops_dot_iq4_xs_q8_K(int64_t n, const block_iq4_xs *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int isum = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            const uint8_t *qs = w[b].qs + 16 * j;
            const int8_t *y = x[b].qs + 32 * j;
            int dot = 0;
            for (int l = 0; l < 16; l++)
                dot += quant_kvalues_iq4nl[qs[l] & 0xF] * y[l] + quant_kvalues_iq4nl[qs[l] >> 4] * y[l + 16];
            isum += (quant_iq4_xs_scale(&w[b], j) - 32) * dot;
        }
        sumf += x[b].d * quant_fp16_to_fp32(w[b].d) * (float)isum;
    }
    return sumf;
}

/* Q4_K, and with `five` Q5_K (the same block prefix d, dmin, scales; the fifth bit of column
 * 32j + l is bit j of qh[l]). Per super-block:
 * d_x*d_w * sum_j sc_j * dot_j  -  d_x*dmin_w * sum_j m_j * bsum_j. */
static inline float ops_dot_kmin_q8_K(int64_t n, const void *w, bool five, const block_q8_K *x)
{
    const size_t bsz = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t o_qs = five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const block_q4_K *wb = (const block_q4_K *)((const char *)w + (size_t)b * bsz);
        const uint8_t *qs = (const uint8_t *)wb + o_qs, *qh = five ? ((const block_q5_K *)wb)->qh : NULL;
        int isum = 0, imin = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            uint8_t sc, m;
            quant_q4_K_scale_min(j, wb->scales, &sc, &m);
            const uint8_t *q = qs + (j / 2) * 32;
            const int8_t *y = x[b].qs + j * 32;
            int dot = 0;
            for (int l = 0; l < 32; l++) {
                int v = (j & 1) ? (q[l] >> 4) : (q[l] & 0xF);
                if (five) v |= ((qh[l] >> j) & 1) << 4;
                dot += v * y[l];
            }
            isum += sc * dot;
            imin += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        }
        float d = x[b].d * quant_fp16_to_fp32(wb->d);
        float dmin = x[b].d * quant_fp16_to_fp32(wb->dmin);
        sumf += d * (float)isum - dmin * (float)imin;
    }
    return sumf;
}

static float ops_dot_q4_K_q8_K(int64_t n, const block_q4_K *w, const block_q8_K *x)
{
    return ops_dot_kmin_q8_K(n, w, false, x);
}

static float ops_dot_q5_K_q8_K(int64_t n, const block_q5_K *w, const block_q8_K *x)
{
    return ops_dot_kmin_q8_K(n, w, true, x);
}

/* Per super-block: d_x*d_w * sum over 16 groups of sc_g * sum (q - 32) * y. */
static float ops_dot_q6_K_q8_K(int64_t n, const block_q6_K *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int8_t q[QK_K];
        const uint8_t *ql = w[b].ql, *qh = w[b].qh;
        for (int k = 0; k < QK_K; k += 128) {
            for (int l = 0; l < 32; l++) {
                q[k + l + 0] = (int8_t)(((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                q[k + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                q[k + l + 64] = (int8_t)(((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                q[k + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            ql += 64;
            qh += 32;
        }
        int isum = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            int dot = 0;
            for (int l = 0; l < 16; l++) dot += q[g * 16 + l] * x[b].qs[g * 16 + l];
            isum += w[b].scales[g] * dot;
        }
        sumf += x[b].d * quant_fp16_to_fp32(w[b].d) * (float)isum;
    }
    return sumf;
}

/* Row i (0..15) of a repacked Q8_0 group (block_q8_0x16; n a multiple of 64): the arithmetic
 * of ops_dot_q8_0_q8_0, so the result is bit-identical to the original layout's. */
static float ops_dot_q8_0x16_q8_0(int64_t n, const block_q8_0x16 *w, int i, const block_q8_0 *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const block_q8_0x16 *wp = w + b / 2;
        int h = (int)(b % 2), sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += ((int)wp->qs[h][j / 4][i][j % 4] - 128) * x[b].qs[j];
        sumf += (float)sumi * (quant_fp16_to_fp32(wp->d[h][i]) * quant_fp16_to_fp32(x[b].d));
    }
    return sumf;
}

/* Row i of a repacked Q4_0 group (block_q4_0x16), as ops_dot_q4_0_q8_0 computes it. */
static float ops_dot_q4_0x16_q8_0(int64_t n, const block_q4_0x16 *w, int i, const block_q8_0 *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const block_q4_0x16 *wp = w + b / 2;
        int h = (int)(b % 2), sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            uint8_t q = wp->qs[h][j / 4][i][j % 4];
            sumi += ((q & 0x0F) - 8) * x[b].qs[j];
            sumi += ((q >> 4) - 8) * x[b].qs[j + QK4_0 / 2];
        }
        sumf += (float)sumi * (quant_fp16_to_fp32(wp->d[h][i]) * quant_fp16_to_fp32(x[b].d));
    }
    return sumf;
}

/* Row i of a repacked MXFP4 group (block_mxfp4x16), as ops_dot_mxfp4_q8_0 computes it. */
static float ops_dot_mxfp4x16_q8_0(int64_t n, const block_mxfp4x16 *w, int i, const block_q8_0 *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_MXFP4; b++) {
        const block_mxfp4x16 *wp = w + b / 2;
        int h = (int)(b % 2), sumi = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            uint8_t q = wp->qs[h][j / 4][i][j % 4];
            sumi += quant_kvalues_mxfp4[q & 0x0F] * x[b].qs[j];
            sumi += quant_kvalues_mxfp4[q >> 4] * x[b].qs[j + QK_MXFP4 / 2];
        }
        sumf += (float)sumi * (quant_e8m0_half(wp->e[h][i]) * quant_fp16_to_fp32(x[b].d));
    }
    return sumf;
}

/* Row i (0..15) of a repacked Q4_K group (block_q4_Kx16): the arithmetic of
 * ops_dot_q4_K_q8_K, so the result is bit-identical to the original layout's. */
static float ops_dot_q4_Kx16_q8_K(int64_t n, const block_q4_Kx16 *w, int i, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int isum = 0, imin = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            const int8_t *y = x[b].qs + j * 32;
            int dot = 0;
            for (int l = 0; l < 32; l++) {
                uint8_t q = w[b].qs[j / 2][l / 4][i][l % 4];
                dot += ((j & 1) ? (q >> 4) : (q & 0xF)) * y[l];
            }
            isum += w[b].sc[j][i] * dot;
            imin += w[b].m[j / 2][i][j % 2] * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        }
        float d = x[b].d * quant_fp16_to_fp32(w[b].d[i]);
        float dmin = x[b].d * quant_fp16_to_fp32(w[b].dmin[i]);
        sumf += d * (float)isum - dmin * (float)imin;
    }
    return sumf;
}

/* Row i of a repacked Q6_K group (block_q6_Kx16), as ops_dot_q6_K_q8_K computes it. */
static float ops_dot_q6_Kx16_q8_K(int64_t n, const block_q6_Kx16 *w, int i, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int isum = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            const uint8_t *p0 = w[b].q[g][0][i], *p1 = w[b].q[g][1][i], *p2 = w[b].q[g][2][i];
            int dot = 0;
            for (int l = 0; l < 4; l++) {
                int q3 = (p0[l] >> 6) | ((p1[l] >> 6) << 2) | ((p2[l] >> 6) << 4);
                dot += ((p0[l] & 63) - 32) * x[b].qs[16 * g + l];
                dot += ((p1[l] & 63) - 32) * x[b].qs[16 * g + 4 + l];
                dot += ((p2[l] & 63) - 32) * x[b].qs[16 * g + 8 + l];
                dot += (q3 - 32) * x[b].qs[16 * g + 12 + l];
            }
            isum += w[b].sc[g / 2][i][g % 2] * dot;
        }
        sumf += x[b].d * w[b].d[i] * (float)isum;
    }
    return sumf;
}

static float ops_dot_f32_ref(int64_t n, const float *a, const float *b)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return (float)s;
}

static float ops_dot_f16_ref(int64_t n, const fp16_t *a, const fp16_t *b)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)quant_fp16_to_fp32(a[i]) * (double)quant_fp16_to_fp32(b[i]);
    return (float)s;
}

static float ops_dot_bf16_ref(int64_t n, const bf16_t *a, const bf16_t *b)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)quant_bf16_to_fp32(a[i]) * (double)quant_bf16_to_fp32(b[i]);
    return (float)s;
}

/* Generic gemm from a row dot: the reference tiling is no tiling. */
#define OPS_GEMM_FROM_DOT(name, dot, wt, xt)                                                  \
    static void name(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs, \
                     int nt, float *y, size_t ys)                                             \
    {                                                                                         \
        for (int t = 0; t < nt; t++)                                                          \
            for (int r = 0; r < nr; r++)                                                      \
                y[(size_t)t * ys + r] = dot(cols, (const wt *)((const char *)w + r * ws),     \
                                            (const xt *)((const char *)x + t * xs));          \
    }
OPS_GEMM_FROM_DOT(ops_gemm_q8_0_ref, ops_dot_q8_0_q8_0, block_q8_0, block_q8_0)
OPS_GEMM_FROM_DOT(ops_gemm_q4_0_ref, ops_dot_q4_0_q8_0, block_q4_0, block_q8_0)
OPS_GEMM_FROM_DOT(ops_gemm_mxfp4_ref, ops_dot_mxfp4_q8_0, block_mxfp4, block_q8_0)
OPS_GEMM_FROM_DOT(ops_gemm_q4_K_ref, ops_dot_q4_K_q8_K, block_q4_K, block_q8_K)
OPS_GEMM_FROM_DOT(ops_gemm_q5_K_ref, ops_dot_q5_K_q8_K, block_q5_K, block_q8_K)
OPS_GEMM_FROM_DOT(ops_gemm_q6_K_ref, ops_dot_q6_K_q8_K, block_q6_K, block_q8_K)
OPS_GEMM_FROM_DOT(ops_gemm_f32_ref, ops_dot_f32_ref, float, float)
OPS_GEMM_FROM_DOT(ops_gemm_q4_1_ref, ops_dot_q4_1_q8_1, void, block_q8_1)
OPS_GEMM_FROM_DOT(ops_gemm_q5_0_ref, ops_dot_q5_0_q8_1, void, block_q8_1)
OPS_GEMM_FROM_DOT(ops_gemm_q5_1_ref, ops_dot_q5_1_q8_1, void, block_q8_1)
OPS_GEMM_FROM_DOT(ops_gemm_iq4_nl_ref, ops_dot_iq4_nl_q8_1, void, block_q8_1)
OPS_GEMM_FROM_DOT(ops_gemm_q2_K_ref, ops_dot_q2_K_q8_K, block_q2_K, block_q8_K)
OPS_GEMM_FROM_DOT(ops_gemm_q3_K_ref, ops_dot_q3_K_q8_K, block_q3_K, block_q8_K)
OPS_GEMM_FROM_DOT(ops_gemm_iq4_xs_ref, ops_dot_iq4_xs_q8_K, block_iq4_xs, block_q8_K)

/* The same for the 16-row interleaved types: row r lives in group r/16 (nr and the first row
 * are multiples of 16; the driver's row chunks are). */
#define OPS_GEMM_X16_FROM_DOT(name, dot, wt, xt)                                              \
    static void name(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs, \
                     int nt, float *y, size_t ys)                                             \
    {                                                                                         \
        for (int t = 0; t < nt; t++)                                                          \
            for (int r = 0; r < nr; r++)                                                      \
                y[(size_t)t * ys + r] =                                                       \
                    dot(cols, (const wt *)((const char *)w + (size_t)(r / 16) * 16 * ws),     \
                        r % 16, (const xt *)((const char *)x + t * xs));                      \
    }
OPS_GEMM_X16_FROM_DOT(ops_gemm_q8_0x16_ref, ops_dot_q8_0x16_q8_0, block_q8_0x16, block_q8_0)
OPS_GEMM_X16_FROM_DOT(ops_gemm_q4_0x16_ref, ops_dot_q4_0x16_q8_0, block_q4_0x16, block_q8_0)
OPS_GEMM_X16_FROM_DOT(ops_gemm_mxfp4x16_ref, ops_dot_mxfp4x16_q8_0, block_mxfp4x16, block_q8_0)
OPS_GEMM_X16_FROM_DOT(ops_gemm_q4_Kx16_ref, ops_dot_q4_Kx16_q8_K, block_q4_Kx16, block_q8_K)
OPS_GEMM_X16_FROM_DOT(ops_gemm_q6_Kx16_ref, ops_dot_q6_Kx16_q8_K, block_q6_Kx16, block_q8_K)
OPS_GEMM_FROM_DOT(ops_gemm_f16_ref, ops_dot_f16_ref, fp16_t, fp16_t)
OPS_GEMM_FROM_DOT(ops_gemm_bf16_ref, ops_dot_bf16_ref, bf16_t, bf16_t)

static void ops_to_f16_ref(const float *x, fp16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = quant_fp32_to_fp16(x[i]);
}
static void ops_from_f16_ref(const fp16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = quant_fp16_to_fp32(x[i]);
}
static void ops_to_bf16_ref(const float *x, bf16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = quant_fp32_to_bf16(x[i]);
}
static float ops_dot_f16_f32_ref(int n, const fp16_t *a, const float *b)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)quant_fp16_to_fp32(a[i]) * (double)b[i];
    return (float)s;
}
static float ops_dot_f16_int(int n, const fp16_t *a, const fp16_t *b)
{
    return ops_dot_f16_ref(n, a, b);
}
static void ops_mad_f16_ref(int n, float *y, const fp16_t *x, float s)
{
    for (int i = 0; i < n; i++) y[i] += quant_fp16_to_fp32(x[i]) * s;
}
static float ops_dot_f32_int(int n, const float *a, const float *b)
{
    return ops_dot_f32_ref(n, a, b);
}
static float ops_dot_kv_q8_0_ref(int n, const void *k, const block_q8_0 *q) { return ops_dot_q8_0_q8_0(n, k, q); }
static float ops_dot_kv_q4_0_ref(int n, const void *k, const block_q8_0 *q) { return ops_dot_q4_0_q8_0(n, k, q); }

static void ops_mad_f32_ref(int n, float *y, const float *x, float s)
{
    for (int i = 0; i < n; i++) y[i] += x[i] * s;
}
static void ops_scale_f32_ref(int n, float *y, float s)
{
    for (int i = 0; i < n; i++) y[i] *= s;
}
static float ops_softmax_exp_ref(int n, float *y, float max)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        y[i] = expf(y[i] - max);
        sum += y[i];
    }
    return (float)sum;
}
static float ops_max_f32_ref(int n, const float *x)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
/* ops_att_block in plain loops, the same order of operations as the SIMD versions (which
 * fuse the multiply-adds and use their own exp, so results agree to rounding, not bits). */
static void ops_att_block_ref(const ops_att_block_args *a)
{
    const int hd = a->hd, nq = a->nq, nqp = a->nqp, nb = a->nb;
    for (int j = 0; j < nb; j++)
        for (int i = 0; i < nq; i++) {
            float d = 0.0f;
            for (int e = 0; e < hd; e++) d += a->k[(size_t)j * hd + e] * a->qt[(size_t)e * nqp + i];
            a->st[(size_t)j * nqp + i] = d * a->scale;
        }
    for (int i = 0; i < nq; i++) {
        int n = a->lim[i];
        float *acc = a->acc + (size_t)i * hd;
        float mb = -INFINITY, M = a->m[i], S = a->s[i];
        for (int j = 0; j < n; j++) mb = a->st[(size_t)j * nqp + i] > mb ? a->st[(size_t)j * nqp + i] : mb;
        if (mb > M) {
            if (M != -INFINITY) {
                float ms = expf(M - mb);
                for (int e = 0; e < hd; e++) acc[e] *= ms;
                S *= ms;
            }
            M = mb;
        }
        for (int j = 0; j < nb; j++) {
            float *p = &a->st[(size_t)j * nqp + i];
            *p = j < n ? expf(*p - M) : 0.0f;
            S += *p;
        }
        a->m[i] = M;
        a->s[i] = S;
        for (int j = 0; j < n; j++) {
            float p = a->st[(size_t)j * nqp + i];
            for (int e = 0; e < hd; e++) acc[e] += p * a->v[(size_t)j * hd + e];
        }
    }
}

/* four chains, so the loop is not bound by one xor's latency */
static uint64_t ops_stream_read_ref(const void *p, size_t n)
{
    const uint64_t *q = p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t w = n / 8, i = 0;
    for (; i + 4 <= w; i += 4) a ^= q[i], b ^= q[i + 1], c ^= q[i + 2], d ^= q[i + 3];
    for (; i < w; i++) a ^= q[i];
    return a ^ b ^ c ^ d;
}

/* ggml: sum of squares in double, scale = 1/sqrtf(mean + eps), out = (x * scale) * w. */
static void ops_rmsnorm_row_ref(float *out, const float *x, const float *w, int n, float eps)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    float mean = (float)(sum / n);
    float scale = 1.0f / sqrtf(mean + eps);
    if (w)
        for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
    else
        for (int i = 0; i < n; i++) out[i] = x[i] * scale;
}
static void ops_swiglu_ref(float *out, const float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
static void ops_add_ref(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void ops_quant_q8_0_ref(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    (void)cols;
    quant_act_q8_0(x + e0, (block_q8_0 *)dst + e0 / QK8_0, e1 - e0);
}
static void ops_quant_q8_K_ref(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    (void)cols;
    quant_act_q8_K(x + e0, (block_q8_K *)dst + e0 / QK_K, e1 - e0);
}
static void ops_quant_q8_1_ref(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    (void)cols;
    quant_act_q8_1(x + e0, (block_q8_1 *)dst + e0 / 32, e1 - e0);
}
static size_t ops_act_row_bytes_ref(qtype vt, int64_t cols) { return quant_row_bytes(vt, cols); }

void ops_kernels_init_scalar(ops_kernels *k)
{
    memset(k, 0, sizeof *k);
    k->act_row_bytes = ops_act_row_bytes_ref;
    k->gemm[QTYPE_F32] = ops_gemm_f32_ref;
    k->gemm[QTYPE_F16] = ops_gemm_f16_ref;
    k->gemm[QTYPE_BF16] = ops_gemm_bf16_ref;
    k->gemm[QTYPE_Q4_0] = ops_gemm_q4_0_ref;
    k->gemm[QTYPE_Q8_0] = ops_gemm_q8_0_ref;
    k->gemm[QTYPE_MXFP4] = ops_gemm_mxfp4_ref;
    k->gemm[QTYPE_Q4_K] = ops_gemm_q4_K_ref;
    k->gemm[QTYPE_Q5_K] = ops_gemm_q5_K_ref;
    k->gemm[QTYPE_Q6_K] = ops_gemm_q6_K_ref;
    k->gemm[QTYPE_Q4_1] = ops_gemm_q4_1_ref;
    k->gemm[QTYPE_Q5_0] = ops_gemm_q5_0_ref;
    k->gemm[QTYPE_Q5_1] = ops_gemm_q5_1_ref;
    k->gemm[QTYPE_IQ4_NL] = ops_gemm_iq4_nl_ref;
    k->gemm[QTYPE_Q2_K] = ops_gemm_q2_K_ref;
    k->gemm[QTYPE_Q3_K] = ops_gemm_q3_K_ref;
    k->gemm[QTYPE_IQ4_XS] = ops_gemm_iq4_xs_ref;
    k->gemm[QTYPE_Q8_0_X16] = ops_gemm_q8_0x16_ref;
    k->gemm[QTYPE_Q4_0_X16] = ops_gemm_q4_0x16_ref;
    k->gemm[QTYPE_MXFP4_X16] = ops_gemm_mxfp4x16_ref;
    k->gemm[QTYPE_Q4_K_X16] = ops_gemm_q4_Kx16_ref;
    k->gemm[QTYPE_Q6_K_X16] = ops_gemm_q6_Kx16_ref;
    k->quant_q8_0 = ops_quant_q8_0_ref;
    k->quant_q8_K = ops_quant_q8_K_ref;
    k->quant_q8_1 = ops_quant_q8_1_ref;
    k->to_f16 = ops_to_f16_ref;
    k->from_f16 = ops_from_f16_ref;
    k->to_bf16 = ops_to_bf16_ref;
    k->dot_f16_f32 = ops_dot_f16_f32_ref;
    k->dot_f16 = ops_dot_f16_int;
    k->mad_f16 = ops_mad_f16_ref;
    k->dot_f32 = ops_dot_f32_int;
    k->mad_f32 = ops_mad_f32_ref;
    k->dot_kv_q8_0 = ops_dot_kv_q8_0_ref;
    k->dot_kv_q4_0 = ops_dot_kv_q4_0_ref;
    k->scale_f32 = ops_scale_f32_ref;
    k->softmax_exp = ops_softmax_exp_ref;
    k->max_f32 = ops_max_f32_ref;
    k->rmsnorm_row = ops_rmsnorm_row_ref;
    k->swiglu = ops_swiglu_ref;
    k->add = ops_add_ref;
    k->att_block = ops_att_block_ref;
    k->stream_read = ops_stream_read_ref;
    ops_iq_init_scalar(k);
}

/* ---- dispatch ------------------------------------------------------------------------- */

void ops_force_level(cpu_level lvl)
{
    cpu_level hw = cpu_get_hw_level();
    if (lvl > hw) lvl = hw;
    ops_kernels k;
    ops_kernels_init_scalar(&k);
#if defined(__aarch64__)
    if (lvl >= CPU_LEVEL_NEON) ops_kernels_init_neon(&k);
#else
    if (lvl >= CPU_LEVEL_AVX2) ops_kernels_init_avx2(&k);
    if (lvl >= CPU_LEVEL_AVX512) ops_kernels_init_avx512(&k);
#endif
    ops_k = k;
    ops_level = lvl;
}

static inline const ops_kernels *ops_get(void)
{
    if ((int)ops_level < 0) ops_force_level(cpu_get_level());
    return &ops_k;
}

cpu_level ops_get_level(void)
{
    ops_get();
    return ops_level;
}

const char *ops_level_name(void) { return cpu_level_name(ops_get_level()); }

/* ---- matmul driver -------------------------------------------------------------------- */

/* Activation quantisation unit: elements per unit of work (f16/bf16 rows may end in a
 * partial unit). */
static int64_t ops_act_unit(qtype vt)
{
    switch (vt) {
    case QTYPE_Q8_0:
    case QTYPE_Q8_1: return QK8_0 * 8;
    case QTYPE_Q8_K: return QK_K;
    default: return 256;
    }
}

size_t ops_matmul_scratch_bytes(qtype wtype, int64_t cols, int n_tokens)
{
    qtype vt = quant_vec_dot_type(wtype);
    if (vt == QTYPE_F32) return 0;
    size_t rb = quant_row_bytes(vt, cols);
    if (vt == QTYPE_Q8_0) rb = TM_MAX(rb, ops_q8_0x_row_bytes(cols));
    return TM_ALIGN_UP(rb, 64) * (size_t)n_tokens + 64;
}

/* A thread's own range of chunks, claimed from `next` by it and, once it has finished its
 * own, by the others (one cache line each). */
typedef struct {
    _Alignas(64) _Atomic int next;       /* next unclaimed chunk */
    int end;                             /* one past the range */
} ops_mm_cursor;

typedef struct {
    qtype vt;           /* vec-dot type */
    char *buf;          /* (n_tokens, stride) quantised x; NULL for f32 (x itself) */
    size_t stride;      /* bytes per token */
} ops_act;

typedef struct {
    const ops_kernels *k;                /* kernel table */
    threadpool *tp;                      /* for the barrier */
    int n_w;                             /* weights */
    const ops_weight *const *ws;         /* (n_w) */
    float *const *ys;                    /* (n_w) outputs, (n_tokens, rows) */
    const float *x;                      /* (n_tokens, cols) */
    int64_t cols;                        /* shared by all weights */
    int n_tokens;                        /* batch */
    int n_act;                           /* distinct vec-dot types */
    ops_act act[OPS_MAX_MULTI];          /* their buffers */
    int act_of[OPS_MAX_MULTI];           /* weight -> act index */
    int chunk_rows[OPS_MAX_MULTI];       /* rows per chunk, per weight */
    int row_chunks[OPS_MAX_MULTI];       /* chunks per token range, per weight */
    int chunk_first[OPS_MAX_MULTI + 1];  /* prefix sums of row_chunks */
    int n_tok_chunks;                    /* token ranges */
    bool pre_quantised;                  /* the caller quantised x already */
    int n_own;                           /* threads with their own chunk range (<= OPS_OWN_MAX) */
    ops_mm_cursor own[OPS_OWN_MAX];      /* (n_own) thread i's chunks [next, end) */
} ops_mm_ctx;

/* Quantises elements [e0, e1) of one token's row x into its buffer dst. */
static void ops_quantize_act(const ops_kernels *k, qtype vt, const float *x, void *dst,
                             int64_t cols, int64_t e0, int64_t e1)
{
    switch (vt) {
    case QTYPE_Q8_0: k->quant_q8_0(x, dst, cols, e0, e1); break;
    case QTYPE_Q8_K: k->quant_q8_K(x, dst, cols, e0, e1); break;
    case QTYPE_Q8_1: k->quant_q8_1(x, dst, cols, e0, e1); break;
    case QTYPE_F16: k->to_f16(x + e0, (fp16_t *)dst + e0, e1 - e0); break;
    case QTYPE_BF16: k->to_bf16(x + e0, (bf16_t *)dst + e0, e1 - e0); break;
    default: break;
    }
}

/* Quantises this thread's share of the activations; returns whether there were any. */
static bool ops_mm_quantise(ops_mm_ctx *c, int ith, int nth)
{
    const ops_kernels *k = c->k;
    bool quantised = false;
    for (int a = 0; a < c->n_act; a++) {
        ops_act *act = &c->act[a];
        if (!act->buf) continue;
        quantised = true;
        int64_t unit = ops_act_unit(act->vt);
        int64_t per_row = (c->cols + unit - 1) / unit;
        int64_t total = per_row * c->n_tokens;
        int64_t u0 = total * ith / nth, u1 = total * (ith + 1) / nth;
        for (int64_t u = u0; u < u1;) {
            int64_t t = u / per_row, j0 = u % per_row;
            int64_t j1 = TM_MIN(per_row, j0 + (u1 - u));
            int64_t e0 = j0 * unit, e1 = TM_MIN(c->cols, j1 * unit);
            ops_quantize_act(k, act->vt, c->x + t * c->cols, act->buf + t * act->stride, c->cols,
                             e0, e1);
            u += j1 - j0;
        }
    }
    return quantised;
}

static void ops_mm_thread(void *arg, int ith, int nth)
{
    ops_mm_ctx *c = arg;
    const ops_kernels *k = c->k;
    /* a thread that loses its core would hold everybody at the barrier: small batches are
     * quantised by the caller before the pool starts */
    if (!c->pre_quantised && ops_mm_quantise(c, ith, nth) && nth > 1) threadpool_barrier(c->tp);

    int per_tok = c->chunk_first[c->n_w];
    /* own range first, then the others' leftovers in ring order */
    int home = ith * c->n_own / nth;
    for (int v = 0; v < c->n_own;) {
        ops_mm_cursor *cur = &c->own[(home + v) % c->n_own];
        int ci = atomic_load_explicit(&cur->next, memory_order_relaxed) < cur->end
                     ? atomic_fetch_add_explicit(&cur->next, 1, memory_order_relaxed)
                     : cur->end;
        if (ci >= cur->end) {
            v++;
            continue;
        }
        int tc = ci / per_tok, rc = ci % per_tok;
        int wi = 0;
        while (rc >= c->chunk_first[wi + 1]) wi++;
        rc -= c->chunk_first[wi];
        const ops_weight *w = c->ws[wi];
        const ops_act *act = &c->act[c->act_of[wi]];
        int64_t r0 = (int64_t)rc * c->chunk_rows[wi];
        int nr = (int)TM_MIN(w->rows - r0, (int64_t)c->chunk_rows[wi]);
        int t0 = tc * OPS_TOKEN_CHUNK;
        int nt = TM_MIN(c->n_tokens - t0, OPS_TOKEN_CHUNK);
        size_t wstride = quant_row_bytes(w->type, w->cols);
        const char *xq = act->buf ? act->buf + (size_t)t0 * act->stride
                                  : (const char *)(c->x + (size_t)t0 * c->cols);
        k->gemm[w->type](w->cols, (const char *)w->data + (size_t)r0 * wstride, wstride, nr, xq,
                         act->stride, nt, c->ys[wi] + (size_t)t0 * w->rows + r0,
                         (size_t)w->rows);
    }
}

/* The context of a matmul: activation buffers laid out in scratch (one per distinct vec-dot
 * type, in the order of the weights), the chunks, the threads' ranges. */
static void ops_mm_setup(ops_mm_ctx *c, threadpool *tp, int n_w, const ops_weight *const *ws, const float *x,
                         int n_tokens, float *const *ys, void *scratch)
{
    c->k = ops_get();
    c->tp = tp;
    c->n_w = n_w;
    c->ws = ws;
    c->ys = ys;
    c->x = x;
    c->cols = ws[0]->cols;
    c->n_tokens = n_tokens;
    c->n_act = 0;
    int nth = threadpool_size(tp);
    char *p = (char *)TM_ALIGN_UP((uintptr_t)scratch, 64);
    c->chunk_first[0] = 0;
    for (int i = 0; i < n_w; i++) {
        qtype vt = quant_vec_dot_type(ws[i]->type);
        int a = 0;
        while (a < c->n_act && c->act[a].vt != vt) a++;
        if (a == c->n_act) {
            c->act[a].vt = vt;
            if (vt == QTYPE_F32) {
                c->act[a].buf = NULL;
                c->act[a].stride = (size_t)c->cols * sizeof(float);
            } else {
                c->act[a].buf = p;
                c->act[a].stride = TM_ALIGN_UP(c->k->act_row_bytes(vt, c->cols), 64);
                p += c->act[a].stride * (size_t)n_tokens;
            }
            c->n_act++;
        }
        c->act_of[i] = a;
        /* about 8 chunks per thread and weight, at least OPS_ROW_ALIGN rows each: enough to
         * even out threads that lose their core for a while */
        int64_t rows = ws[i]->rows;
        int64_t cr = rows / ((int64_t)nth * 8);
        cr = TM_ALIGN_UP(TM_MAX(cr, 1), OPS_ROW_ALIGN);
        if (cr > rows) cr = rows;
        if (cr < 1) cr = 1;
        c->chunk_rows[i] = (int)cr;
        c->row_chunks[i] = (int)((rows + cr - 1) / cr);
        c->chunk_first[i + 1] = c->chunk_first[i] + c->row_chunks[i];
    }
    c->n_tok_chunks = (n_tokens + OPS_TOKEN_CHUNK - 1) / OPS_TOKEN_CHUNK;
    /* each thread owns a contiguous range of the chunks: the same rows of every matrix at
     * every step (its core's caches, its NUMA node's pages); a thread that finishes early
     * takes chunks from the others' ranges, so one that lost its core delays nobody. Every
     * chunk is computed once, by whichever thread claims it, with the same arithmetic. */
    int total = c->chunk_first[n_w] * c->n_tok_chunks;
    c->n_own = TM_MIN(nth, OPS_OWN_MAX);
    for (int i = 0; i < c->n_own; i++) {
        atomic_init(&c->own[i].next, (int)((int64_t)total * i / c->n_own));
        c->own[i].end = (int)((int64_t)total * (i + 1) / c->n_own);
    }
}

static void ops_mm_run(threadpool *tp, int n_w, const ops_weight *const *ws, const float *x,
                       int n_tokens, float *const *ys, void *scratch)
{
    if (n_tokens <= 0 || n_w <= 0) return;
    ops_mm_ctx c;
    ops_mm_setup(&c, tp, n_w, ws, x, n_tokens, ys, scratch);
    int nth = threadpool_size(tp);
    c.pre_quantised = false;
    if (nth == 1 || (int64_t)n_tokens * c.cols <= OPS_PREQUANT_MAX) {
        double t0 = ops_prof_quant ? util_now() : 0;
        ops_mm_quantise(&c, 0, 1);
        if (ops_prof_quant) *ops_prof_quant += util_now() - t0;
        c.pre_quantised = true;
    }
    int64_t macs = 0;
    for (int i = 0; i < n_w; i++) macs += ws[i]->rows * c.cols * (int64_t)n_tokens;
    if (c.pre_quantised && macs < OPS_INLINE_MACS) ops_mm_thread(&c, 0, 1);
    else threadpool_run(tp, ops_mm_thread, &c);
}

void ops_matmul(threadpool *tp, const ops_weight *w, const float *x, int n_tokens, float *y,
                void *scratch)
{
    const ops_weight *ws[1] = {w};
    float *ys[1] = {y};
    ops_mm_run(tp, 1, ws, x, n_tokens, ys, scratch);
}

void ops_matmul_multi(threadpool *tp, int n_w, const ops_weight *const *ws, const float *x,
                      int n_tokens, float *const *ys, void *scratch)
{
    for (int i0 = 0; i0 < n_w; i0 += OPS_MAX_MULTI)
        ops_mm_run(tp, TM_MIN(OPS_MAX_MULTI, n_w - i0), ws + i0, x, n_tokens, ys + i0, scratch);
}

void ops_matmul_reuse(int n_w, const ops_weight *const *ws, const float *x, int n_tokens, float *const *ys,
                      void *scratch, const float **held)
{
    if (n_tokens <= 0 || n_w <= 0) return;
    ops_mm_ctx c;
    ops_mm_setup(&c, NULL, n_w, ws, x, n_tokens, ys, scratch);
    if (*held != x) {
        double t0 = ops_prof_quant ? util_now() : 0;
        ops_mm_quantise(&c, 0, 1);
        if (ops_prof_quant) *ops_prof_quant += util_now() - t0;
        *held = x;
    }
    c.pre_quantised = true;
    ops_mm_thread(&c, 0, 1);
}

size_t ops_matmul_multi_scratch_bytes(int n_w, const ops_weight *const *ws, int n_tokens)
{
    size_t sum = 0;
    for (int i = 0; i < n_w; i++) {
        qtype vt = quant_vec_dot_type(ws[i]->type);
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= quant_vec_dot_type(ws[j]->type) == vt;
        if (!seen) sum += ops_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, n_tokens);
    }
    return sum + 64;
}

/* ---- weight repacking ----------------------------------------------------------------- */

qtype ops_repack_type(const ops_weight *w)
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *e = getenv("TOKENMILL_REPACK");
        enabled = !(e && strcmp(e, "0") == 0);
    }
    qtype rt = quant_repack_type(w->type);
    /* the driver's row chunks are multiples of OPS_ROW_ALIGN, so of the 16-row groups */
    _Static_assert(OPS_ROW_ALIGN % 16 == 0, "row chunks must hold whole 16-row groups");
    if (!enabled || rt == w->type || w->rows % 16 || w->cols % quant_block_elems(rt) ||
        ops_get_level() < CPU_LEVEL_AVX512)
        return w->type;
    return rt;
}

typedef struct {
    const ops_weight *w;  /* source */
    void *dst;            /* repacked */
} ops_repack_ctx;

static void ops_repack_thread(void *arg, int ith, int nth)
{
    ops_repack_ctx *c = arg;
    int64_t groups = c->w->rows / 16;
    int64_t g0 = groups * ith / nth, g1 = groups * (ith + 1) / nth;
    quant_repack(c->w->type, c->w->data, c->dst, c->w->cols, g0 * 16, g1 * 16);
}

ops_weight ops_repack(threadpool *tp, const ops_weight *w, void *dst)
{
    ops_repack_ctx c = {w, dst};
    if (tp) threadpool_run(tp, ops_repack_thread, &c);
    else ops_repack_thread(&c, 0, 1);
    return (ops_weight){ops_repack_type(w), w->rows, w->cols, dst};
}

/* ---- elementwise drivers -------------------------------------------------------------- */

typedef struct {
    const ops_kernels *k;      /* kernel table */
    float *out;                /* output */
    const float *a, *b;        /* inputs (op-specific) */
    int rows, n;               /* shape */
    float eps;                 /* rmsnorm */
} ops_rows_ctx;

static void ops_rmsnorm_thread(void *arg, int ith, int nth)
{
    ops_rows_ctx *c = arg;
    int r0 = (int)((int64_t)c->rows * ith / nth), r1 = (int)((int64_t)c->rows * (ith + 1) / nth);
    for (int r = r0; r < r1; r++)
        c->k->rmsnorm_row(c->out + (size_t)r * c->n, c->a + (size_t)r * c->n, c->b, c->n, c->eps);
}

void ops_rmsnorm(threadpool *tp, float *out, const float *x, const float *w, int rows, int n,
                 float eps)
{
    ops_rows_ctx c = {ops_get(), out, x, w, rows, n, eps};
    if (rows == 1) {
        c.k->rmsnorm_row(out, x, w, n, eps);
        return;
    }
    threadpool_run(tp, ops_rmsnorm_thread, &c);
}

/* Flat range split for n elements in 16-float-aligned pieces. */
static void ops_split(int64_t n, int ith, int nth, int64_t *i0, int64_t *i1)
{
    int64_t units = (n + 15) / 16;
    *i0 = TM_MIN(n, units * ith / nth * 16);
    *i1 = TM_MIN(n, units * (ith + 1) / nth * 16);
}

typedef struct {
    const ops_kernels *k;   /* kernel table */
    float *out;             /* output */
    const float *a, *b;     /* inputs */
    int64_t n;              /* elements */
} ops_flat_ctx;

static void ops_swiglu_thread(void *arg, int ith, int nth)
{
    ops_flat_ctx *c = arg;
    int64_t i0, i1;
    ops_split(c->n, ith, nth, &i0, &i1);
    if (i1 > i0) c->k->swiglu(c->out + i0, c->a + i0, c->b + i0, i1 - i0);
}

void ops_swiglu(threadpool *tp, float *out, const float *gate, const float *up, int rows, int n)
{
    ops_flat_ctx c = {ops_get(), out, gate, up, (int64_t)rows * n};
    if (c.n < 4096) {
        c.k->swiglu(out, gate, up, c.n);
        return;
    }
    threadpool_run(tp, ops_swiglu_thread, &c);
}

/* ggml's table (ggml_table_gelu_f16): built once, on first use */
static float ops_gelu_tab[1 << 16];
static pthread_once_t ops_gelu_once = PTHREAD_ONCE_INIT;

static void ops_gelu_init(void)
{
    const float c = 0.79788456080286535587989211986876f, a = 0.044715f;   /* sqrt(2/pi), ggml's */
    for (uint32_t i = 0; i < (1u << 16); i++) {
        float x = quant_fp16_to_fp32((fp16_t)i);
        ops_gelu_tab[i] = quant_fp16_to_fp32(quant_fp32_to_fp16(0.5f * x * (1.0f + tanhf(c * x * (1.0f + a * x * x)))));
    }
}

float ops_gelu(float x)
{
    pthread_once(&ops_gelu_once, ops_gelu_init);
    return x <= -10.0f ? 0.0f : x >= 10.0f ? x : ops_gelu_tab[quant_fp32_to_fp16(x)];
}

static void ops_geglu_thread(void *arg, int ith, int nth)
{
    ops_flat_ctx *c = arg;
    int64_t i0, i1;
    ops_split(c->n, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        const float x = c->a[i], g = c->b[i];
        c->out[i] = (x <= -10.0f ? 0.0f : x >= 10.0f ? x : ops_gelu_tab[quant_fp32_to_fp16(x)]) * g;
    }
}

void ops_geglu(threadpool *tp, float *out, const float *gate, const float *up, int rows, int n)
{
    pthread_once(&ops_gelu_once, ops_gelu_init);
    ops_flat_ctx c = {ops_get(), out, gate, up, (int64_t)rows * n};
    if (c.n < 4096) {
        ops_geglu_thread(&c, 0, 1);
        return;
    }
    threadpool_run(tp, ops_geglu_thread, &c);
}

static void ops_softcap_thread(void *arg, int ith, int nth)
{
    ops_flat_ctx *c = arg;
    int64_t i0, i1;
    ops_split(c->n, ith, nth, &i0, &i1);
    const float cap = c->a[0], inv = 1.0f / cap;
    for (int64_t i = i0; i < i1; i++) c->out[i] = tanhf(c->out[i] * inv) * cap;
}

void ops_softcap(threadpool *tp, float *x, int64_t n, float cap)
{
    ops_flat_ctx c = {ops_get(), x, &cap, NULL, n};
    if (n < 4096) {
        ops_softcap_thread(&c, 0, 1);
        return;
    }
    threadpool_run(tp, ops_softcap_thread, &c);
}

void ops_swiglu_oai(float *out, const float *gate, const float *up, int64_t n, float alpha, float limit)
{
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i] < limit ? gate[i] : limit;   /* std::min(gate, limit) */
        const float y = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        const float glu = x / (1.f + expf(alpha * (-x)));
        out[i] = glu * (y + 1.f);
    }
}

typedef struct {
    const ops_kernels *k;
    const char *p;
    size_t n;                   /* bytes, a multiple of 8 */
    uint64_t *fold;             /* (threads) each one's xor */
} ops_stream_ctx;

static void ops_stream_thread(void *arg, int ith, int nth)
{
    ops_stream_ctx *c = arg;
    /* shares of whole 64-byte lines, so that no line is read by two threads */
    size_t lines = c->n / 64, a = lines * (size_t)ith / (size_t)nth * 64;
    size_t b = ith == nth - 1 ? c->n : lines * (size_t)(ith + 1) / (size_t)nth * 64;
    c->fold[ith] = b > a ? c->k->stream_read(c->p + a, b - a) : 0;
}

uint64_t ops_stream_read(threadpool *tp, const void *p, size_t n)
{
    const int nth = threadpool_size(tp);
    ops_stream_ctx c = { ops_get(), p, n / 8 * 8, NULL };
    if (nth == 1) return c.k->stream_read(p, c.n);
    c.fold = xcalloc((size_t)nth, sizeof *c.fold);
    threadpool_run(tp, ops_stream_thread, &c);
    uint64_t r = 0;
    for (int i = 0; i < nth; i++) r ^= c.fold[i];
    free(c.fold);
    return r;
}

static void ops_add_thread(void *arg, int ith, int nth)
{
    ops_flat_ctx *c = arg;
    int64_t i0, i1;
    ops_split(c->n, ith, nth, &i0, &i1);
    if (i1 > i0) c->k->add(c->out + i0, c->a + i0, i1 - i0);
}

void ops_add(threadpool *tp, float *y, const float *x, int64_t n)
{
    ops_flat_ctx c = {ops_get(), y, x, NULL, n};
    if (n < 16384) {
        c.k->add(y, x, n);
        return;
    }
    threadpool_run(tp, ops_add_thread, &c);
}

/* ---- rope ----------------------------------------------------------------------------- */

typedef struct {
    float *x;                   /* (rows, n_heads, head_dim) */
    const int32_t *pos;         /* (rows) */
    int rows, n_heads, head_dim, n_rot, neox;
    const float *inv_freq;      /* (n_rot/2) or NULL for the ggml variant */
    float theta_scale, freq_scale, mscale; /* ggml variant */
    const float *freq_factors;  /* (n_rot/2) or NULL */
    float ext_factor;           /* YaRN: 0 none */
    float corr0, corr1;         /* YaRN: the ramp's dims */
} ops_rope_ctx;

static void ops_rope_cache(const ops_rope_ctx *c, int32_t p, float *cs)
{
    int half = c->n_rot / 2;
    if (c->inv_freq) {
        for (int i = 0; i < half; i++) {
            float theta = (float)p * c->inv_freq[i];
            cs[2 * i] = cosf(theta);
            cs[2 * i + 1] = sinf(theta);
        }
        return;
    }
    float theta = (float)p;
    for (int i = 0; i < half; i++) {
        float ff = c->freq_factors ? c->freq_factors[i] : 1.0f;
        float extrap = theta / ff, th = c->freq_scale * extrap, ms = c->mscale;
        if (c->ext_factor != 0.0f) {   /* ggml's rope_yarn */
            float y = ((float)i - c->corr0) / fmaxf(0.001f, c->corr1 - c->corr0);
            float mix = (1 - fminf(1, fmaxf(0, y))) * c->ext_factor;
            th = th * (1 - mix) + extrap * mix;
            ms *= 1.0f + 0.1f * logf(1.0f / c->freq_scale);
        }
        cs[2 * i] = cosf(th) * ms;
        cs[2 * i + 1] = sinf(th) * ms;
        theta *= c->theta_scale;
    }
}

static void ops_rope_thread(void *arg, int ith, int nth)
{
    ops_rope_ctx *c = arg;
    float cs[OPS_ROPE_MAX_DIM];
    int64_t units = (int64_t)c->rows * c->n_heads;
    int64_t u0 = units * ith / nth, u1 = units * (ith + 1) / nth;
    int last_row = -1;
    int half = c->n_rot / 2;
    for (int64_t u = u0; u < u1; u++) {
        int r = (int)(u / c->n_heads);
        if (r != last_row) {
            ops_rope_cache(c, c->pos[r], cs);
            last_row = r;
        }
        float *v = c->x + u * c->head_dim;
        if (c->neox) {
            for (int i = 0; i < half; i++) {
                float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
                v[i + half] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
                v[2 * i + 1] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
            }
        }
    }
}

static void ops_rope_go(threadpool *tp, ops_rope_ctx *c)
{
    if (c->n_rot > OPS_ROPE_MAX_DIM || c->n_rot > c->head_dim) return;
    if ((int64_t)c->rows * c->n_heads < 8) ops_rope_thread(c, 0, 1);
    else threadpool_run(tp, ops_rope_thread, c);
}

void ops_rope(threadpool *tp, float *x, const int32_t *pos, int rows, int n_heads, int head_dim,
              int n_rot, int neox, const float *inv_freq)
{
    ops_rope_ctx c = {x, pos, rows, n_heads, head_dim, n_rot, neox, inv_freq, 0, 0, 0, NULL, 0, 0, 0};
    ops_rope_go(tp, &c);
}

void ops_rope_ggml(threadpool *tp, float *x, const int32_t *pos, int rows, int n_heads,
                   int head_dim, int n_rot, int neox, float theta_scale, float freq_scale,
                   const float *freq_factors, float mscale, const float *yarn)
{
    ops_rope_ctx c = {x,           pos,        rows,   n_heads,     head_dim, n_rot, neox,
                      NULL,        theta_scale, freq_scale, mscale, freq_factors,
                      yarn ? yarn[0] : 0, yarn ? yarn[1] : 0, yarn ? yarn[2] : 0};
    ops_rope_go(tp, &c);
}

/* ---- vector helpers ------------------------------------------------------------------- */

float ops_vec_dot_f16_f32(int n, const fp16_t *a, const float *b) { return ops_get()->dot_f16_f32(n, a, b); }
float ops_vec_dot_f16(int n, const fp16_t *a, const fp16_t *b) { return ops_get()->dot_f16(n, a, b); }
void ops_vec_mad_f16(int n, float *y, const fp16_t *x, float s) { ops_get()->mad_f16(n, y, x, s); }
float ops_vec_dot_f32(int n, const float *a, const float *b) { return ops_get()->dot_f32(n, a, b); }
void ops_vec_mad_f32(int n, float *y, const float *x, float s) { ops_get()->mad_f32(n, y, x, s); }
float ops_vec_dot_kv(qtype t, int n, const void *k, const block_q8_0 *q)
{
    return t == QTYPE_Q8_0 ? ops_get()->dot_kv_q8_0(n, k, q) : ops_get()->dot_kv_q4_0(n, k, q);
}
void ops_vec_scale_f32(int n, float *y, float s) { ops_get()->scale_f32(n, y, s); }
int ops_hadamard_order(int n)
{
    if (n <= 0 || n % 64) return 0;
    int r = 64;
    while (n % (2 * r) == 0) r *= 2;
    return r;
}
void ops_hadamard_rows(float *x, int64_t n_rows, int n)
{
    const float scale = 1.0f / sqrtf((float)n);
    for (int64_t r = 0; r < n_rows; r++, x += n) {
        for (int i = 0; i < n; i++) x[i] *= scale;
        for (int len = 1; len < n; len <<= 1)
            for (int i = 0; i < n; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    float u = x[j], v = x[j + len];
                    x[j] = u + v;
                    x[j + len] = u - v;
                }
    }
}
float ops_vec_softmax_exp(int n, float *y, float max) { return ops_get()->softmax_exp(n, y, max); }
float ops_vec_max_f32(int n, const float *x) { return ops_get()->max_f32(n, x); }
void ops_fp32_to_fp16_row(const float *x, fp16_t *y, int64_t n) { ops_get()->to_f16(x, y, n); }
void ops_fp16_to_fp32_row(const fp16_t *x, float *y, int64_t n) { ops_get()->from_f16(x, y, n); }
void ops_att_block(const ops_att_block_args *a) { ops_get()->att_block(a); }
