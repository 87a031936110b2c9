/*
 * ops_iq_x86: the x86 kernels of the codebook and ternary types (quant_iq.h) against Q8_K, as
 * static inline functions for ops_iq_avx2.c (which instantiates them) and ops_iq_avx512.c
 * (which runs wider dots over the same tiles); include it only from files built with AVX2 or
 * more. Per-row dots, and batch tiles (4 rows decoded once per super-block, see "batches"):
 * they compute the integers of the scalar kernels (ops_iq.c) and the same float chain per
 * super-block, so they equal the scalar level bit for bit (test_ops checks it).
 *
 * A 32-element sub-block becomes one vector: its grid entries gathered from the tables
 * (4 x 8 points, or 8 x 4 for the IQ3 grids), its sign bits spread to a byte of -1 or +1 per
 * element and moved onto the activations (vpsignb), then vpmaddubsw (unsigned points times
 * signed activations: at most 2 * 62 * 127 per int16) and vpmaddwd with the sub-block's
 * scales, which sums into int32 exactly. The IQ1 grids' points are -1, 0, 1: vpsignb of the
 * activations by them is the product. The ternary types multiply their codes 0..2 and take
 * the block's activation sum (from bsums) off once.
 */
#ifndef TM_OPS_IQ_X86_H
#define TM_OPS_IQ_X86_H

#include "model/ops_int.h"
#include "model/quant_grids.h"
#include "model/quant_iq.h"

#include <immintrin.h>

/* The float chain must round as the scalar level's (built without FMA) does: no a * b + c
 * fused into one rounding. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

#define IQ2_INLINE static inline __attribute__((always_inline))

IQ2_INLINE int iq_a2_hsum(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Four sign bytes (byte l: elements 8l..8l+7, bit j element 8l+j) as 32 bytes of -1 / +1. */
IQ2_INLINE __m256i iq_a2_signs(uint32_t s4)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s4), spread);
    __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_or_si256(neg, _mm256_set1_epi8(1));
}

/* sum over the 32 elements of point * sign * q8, weighted per 16 by the int16 lanes of sc
 * (low 128 bits: elements 0..15), as 8 int32 lanes. */
IQ2_INLINE __m256i iq_a2_dot32(__m256i points, __m256i signs, const int8_t *q8, __m256i sc)
{
    __m256i x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)q8), signs);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(points, x), sc);
}

IQ2_INLINE __m256i iq_a2_scales(int ls1, int ls2)
{
    return _mm256_set_m128i(_mm_set1_epi16((short)ls2), _mm_set1_epi16((short)ls1));
}

/* Sub-block ib (32 elements) of a super-block of the grid types whose points are unsigned
 * (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): its points, its signs (bytes of -1 / +1) and its
 * scales (int16 lanes, low 128 bits elements 0..15). The per-row dots and the batch kernels
 * below both take their sub-blocks from these. */
typedef struct {
    __m256i pts;   /* 32 unsigned grid points */
    __m256i signs; /* 32 x -1 / +1 */
    __m256i sc;    /* 16 x int16: the scales of elements 0..15 (low lanes), 16..31 */
} iq_a2_sub;

IQ2_INLINE iq_a2_sub iq_a2_sub_iq2_xxs(const block_iq2_xxs *w, int ib)
{
    const uint16_t *q = w->qs + 4 * ib;
    uint32_t a0 = q[0] | (uint32_t)q[1] << 16, a1 = q[2] | (uint32_t)q[3] << 16;
    uint32_t s4 = quant_grids_ksigns[a1 & 127] | (uint32_t)quant_grids_ksigns[a1 >> 7 & 127] << 8 |
                  (uint32_t)quant_grids_ksigns[a1 >> 14 & 127] << 16 | (uint32_t)quant_grids_ksigns[a1 >> 21 & 127] << 24;
    return (iq_a2_sub){
        _mm256_set_epi64x((long long)quant_grids_iq2xxs[a0 >> 24], (long long)quant_grids_iq2xxs[a0 >> 16 & 255],
                          (long long)quant_grids_iq2xxs[a0 >> 8 & 255], (long long)quant_grids_iq2xxs[a0 & 255]),
        iq_a2_signs(s4), _mm256_set1_epi16((short)(2 * (a1 >> 28) + 1))};
}

IQ2_INLINE iq_a2_sub iq_a2_sub_iq2_xs(const block_iq2_xs *w, int ib)
{
    const uint16_t *q = w->qs + 4 * ib;
    uint32_t s4 = quant_grids_ksigns[q[0] >> 9] | (uint32_t)quant_grids_ksigns[q[1] >> 9] << 8 |
                  (uint32_t)quant_grids_ksigns[q[2] >> 9] << 16 | (uint32_t)quant_grids_ksigns[q[3] >> 9] << 24;
    uint8_t sc = w->scales[ib];
    return (iq_a2_sub){
        _mm256_set_epi64x((long long)quant_grids_iq2xs[q[3] & 511], (long long)quant_grids_iq2xs[q[2] & 511],
                          (long long)quant_grids_iq2xs[q[1] & 511], (long long)quant_grids_iq2xs[q[0] & 511]),
        iq_a2_signs(s4), iq_a2_scales(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1)};
}

IQ2_INLINE iq_a2_sub iq_a2_sub_iq2_s(const block_iq2_s *w, int ib)
{
    const uint8_t *qs = w->qs + 4 * ib, *sg = w->qs + QK_K / 8 + 4 * ib;
    int qh = w->qh[ib];
    uint32_t s4 = sg[0] | (uint32_t)sg[1] << 8 | (uint32_t)sg[2] << 16 | (uint32_t)sg[3] << 24;
    uint8_t sc = w->scales[ib];
    return (iq_a2_sub){
        _mm256_set_epi64x((long long)quant_grids_iq2s[qs[3] | (qh << 2 & 0x300)], (long long)quant_grids_iq2s[qs[2] | (qh << 4 & 0x300)],
                          (long long)quant_grids_iq2s[qs[1] | (qh << 6 & 0x300)], (long long)quant_grids_iq2s[qs[0] | (qh << 8 & 0x300)]),
        iq_a2_signs(s4), iq_a2_scales(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1)};
}

IQ2_INLINE iq_a2_sub iq_a2_sub_iq3_xxs(const block_iq3_xxs *w, int ib)
{
    const uint8_t *q3 = w->qs + 8 * ib, *s = w->qs + QK_K / 4 + 4 * ib;
    uint32_t aux = s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 24;
    uint32_t s4 = quant_grids_ksigns[aux & 127] | (uint32_t)quant_grids_ksigns[aux >> 7 & 127] << 8 |
                  (uint32_t)quant_grids_ksigns[aux >> 14 & 127] << 16 | (uint32_t)quant_grids_ksigns[aux >> 21 & 127] << 24;
    return (iq_a2_sub){
        _mm256_setr_epi32((int)quant_grids_iq3xxs[q3[0]], (int)quant_grids_iq3xxs[q3[1]], (int)quant_grids_iq3xxs[q3[2]],
                          (int)quant_grids_iq3xxs[q3[3]], (int)quant_grids_iq3xxs[q3[4]], (int)quant_grids_iq3xxs[q3[5]],
                          (int)quant_grids_iq3xxs[q3[6]], (int)quant_grids_iq3xxs[q3[7]]),
        iq_a2_signs(s4), _mm256_set1_epi16((short)(2 * (aux >> 28) + 1))};
}

IQ2_INLINE iq_a2_sub iq_a2_sub_iq3_s(const block_iq3_s *w, int ib)
{
    const uint8_t *qs = w->qs + 8 * ib, *sg = w->signs + 4 * ib;
    int qh = w->qh[ib];
    int idx[8];
    for (int k = 0; k < 8; k++) idx[k] = qs[k] | ((qh << (8 - k)) & 256);
    uint32_t s4 = sg[0] | (uint32_t)sg[1] << 8 | (uint32_t)sg[2] << 16 | (uint32_t)sg[3] << 24;
    return (iq_a2_sub){
        _mm256_setr_epi32((int)quant_grids_iq3s[idx[0]], (int)quant_grids_iq3s[idx[1]], (int)quant_grids_iq3s[idx[2]],
                          (int)quant_grids_iq3s[idx[3]], (int)quant_grids_iq3s[idx[4]], (int)quant_grids_iq3s[idx[5]],
                          (int)quant_grids_iq3s[idx[6]], (int)quant_grids_iq3s[idx[7]]),
        iq_a2_signs(s4), _mm256_set1_epi16((short)(2 * ((w->scales[ib / 2] >> 4 * (ib % 2)) & 0xf) + 1))};
}

/* The per-row dot of such a type: per super-block sumf += d_w * d_x * isum, then times the
 * type's constant (ggml's 0.125 / 0.25 / 1). */
#define IQ_A2_DOT_SUB(NAME, BT, SUB, FACTOR)                                                   \
    IQ2_INLINE float NAME(int64_t n, const BT *w, const block_q8_K *x)                         \
    {                                                                                          \
        float sumf = 0;                                                                        \
        for (int64_t b = 0; b < n / QK_K; b++) {                                               \
            __m256i acc = _mm256_setzero_si256();                                              \
            for (int ib = 0; ib < QK_K / 32; ib++) {                                           \
                iq_a2_sub s = SUB(&w[b], ib);                                                  \
                acc = _mm256_add_epi32(acc, iq_a2_dot32(s.pts, s.signs, x[b].qs + 32 * ib, s.sc)); \
            }                                                                                  \
            sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * (float)iq_a2_hsum(acc);              \
        }                                                                                      \
        return FACTOR * sumf;                                                                  \
    }
IQ_A2_DOT_SUB(iq_a2_dot_iq2_xxs, block_iq2_xxs, iq_a2_sub_iq2_xxs, 0.125f)
IQ_A2_DOT_SUB(iq_a2_dot_iq2_xs, block_iq2_xs, iq_a2_sub_iq2_xs, 0.125f)
IQ_A2_DOT_SUB(iq_a2_dot_iq2_s, block_iq2_s, iq_a2_sub_iq2_s, 0.125f)
IQ_A2_DOT_SUB(iq_a2_dot_iq3_xxs, block_iq3_xxs, iq_a2_sub_iq3_xxs, 0.25f)
IQ_A2_DOT_SUB(iq_a2_dot_iq3_s, block_iq3_s, iq_a2_sub_iq3_s, 1.0f)

/* sum of grid point * q8 over 32 elements whose int8 points (-1, 0, 1) are `pts`, weighted
 * per 16 by sc. */
IQ2_INLINE __m256i iq_a2_dot32_iq1(__m256i pts, const int8_t *q8, __m256i sc)
{
    __m256i p = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)q8), pts);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), sc);
}

/* Sub-block ib of an IQ1_S super-block: its 32 grid points (-1, 0 or 1 a byte) and in *ls its
 * odd scale 1..15; the sign of its delta is bit 15 of qh[ib]. The per-row dot and the tile
 * fill decode it alike. */
IQ2_INLINE __m256i iq_a2_iq1_s_points(const block_iq1_s *wb, int ib, int *ls)
{
    const uint8_t *qs = wb->qs + 4 * ib;
    uint16_t qh = wb->qh[ib];
    *ls = 2 * ((qh >> 12) & 7) + 1;
    return _mm256_set_epi64x((long long)quant_grids_iq1s[qs[3] | ((qh >> 9 & 7) << 8)],
                             (long long)quant_grids_iq1s[qs[2] | ((qh >> 6 & 7) << 8)],
                             (long long)quant_grids_iq1s[qs[1] | ((qh >> 3 & 7) << 8)],
                             (long long)quant_grids_iq1s[qs[0] | ((qh & 7) << 8)]);
}

/* Sub-block ib of an IQ1_M super-block: its 32 grid points, and in *dl each 8-point group's
 * delta sign (+1 or -1 a byte). */
IQ2_INLINE __m256i iq_a2_iq1_m_points(const block_iq1_m *wb, int ib, __m256i *dl)
{
    const long long plus = 0x0101010101010101ll, minus = -1ll;
    const uint8_t *qs = wb->qs + 4 * ib, *qh = wb->qh + 2 * ib;
    int h0 = qh[0] & 15, h1 = qh[0] >> 4, h2 = qh[1] & 15, h3 = qh[1] >> 4;
    *dl = _mm256_set_epi64x(h3 & 8 ? minus : plus, h2 & 8 ? minus : plus, h1 & 8 ? minus : plus, h0 & 8 ? minus : plus);
    return _mm256_set_epi64x((long long)quant_grids_iq1s[qs[3] | (h3 & 7) << 8],
                             (long long)quant_grids_iq1s[qs[2] | (h2 & 7) << 8],
                             (long long)quant_grids_iq1s[qs[1] | (h1 & 7) << 8],
                             (long long)quant_grids_iq1s[qs[0] | (h0 & 7) << 8]);
}

IQ2_INLINE float iq_a2_dot_iq1_s(int64_t n, const block_iq1_s *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m256i acc = _mm256_setzero_si256();
        int sumi1 = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int ls;
            __m256i pts = iq_a2_iq1_s_points(&w[b], ib, &ls);
            acc = _mm256_add_epi32(acc, iq_a2_dot32_iq1(pts, x[b].qs + 32 * ib, _mm256_set1_epi16((short)ls)));
            sumi1 += ls * (w[b].qh[ib] & 0x8000 ? -1 : 1) * (x[b].bsums[2 * ib] + x[b].bsums[2 * ib + 1]);
        }
        sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * ((float)iq_a2_hsum(acc) + QUANT_IQ1_DELTA * (float)sumi1);
    }
    return sumf;
}

IQ2_INLINE float iq_a2_dot_iq1_m(int64_t n, const block_iq1_m *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m256i acc1 = _mm256_setzero_si256(), acc2 = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint16_t sc = (uint16_t)(w[b].scales[2 * (ib / 2)] | w[b].scales[2 * (ib / 2) + 1] << 8);
            __m256i scv = iq_a2_scales(2 * ((sc >> (6 * (ib % 2))) & 7) + 1, 2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1);
            __m256i dl, pts = iq_a2_iq1_m_points(&w[b], ib, &dl);
            acc1 = _mm256_add_epi32(acc1, iq_a2_dot32_iq1(pts, x[b].qs + 32 * ib, scv));
            acc2 = _mm256_add_epi32(acc2, iq_a2_dot32_iq1(dl, x[b].qs + 32 * ib, scv));
        }
        sumf += quant_fp16_to_fp32(quant_iq1_m_scale(&w[b])) * x[b].d *
                ((float)iq_a2_hsum(acc1) + QUANT_IQ1_DELTA * (float)iq_a2_hsum(acc2));
    }
    return sumf;
}

/* The block's activation sum (bsums). */
IQ2_INLINE int iq_a2_xsum(const block_q8_K *x)
{
    int s = 0;
    for (int j = 0; j < QK_K / 16; j++) s += x->bsums[j];
    return s;
}

IQ2_INLINE float iq_a2_dot_tq2_0(int64_t n, const block_tq2_0 *w, const block_q8_K *x)
{
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * c));
            for (int l = 0; l < 4; l++) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), m3);
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[b].qs + 128 * c + 32 * l));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(v, xv), ones));
            }
        }
        int sumi = iq_a2_hsum(acc) - iq_a2_xsum(&x[b]);
        sumf += (float)sumi * (x[b].d * quant_fp16_to_fp32(w[b].d));
    }
    return sumf;
}

/* The trits of bytes v (as stored: a fraction of 3^5) times 3^k, for each byte: the byte
 * times 3^k modulo 256, then (that * 3) >> 8. 16-bit lanes, low and high bytes apart. */
IQ2_INLINE __m256i iq_a2_trits(__m256i v, int pow3k)
{
    const __m256i lo8 = _mm256_set1_epi16(0x00ff);
    __m256i m = _mm256_set1_epi16((short)pow3k), three = _mm256_set1_epi16(3);
    __m256i lo = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(v, lo8), m), lo8);
    __m256i hi = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(v, 8), m), lo8);
    lo = _mm256_srli_epi16(_mm256_mullo_epi16(lo, three), 8);
    hi = _mm256_srli_epi16(_mm256_mullo_epi16(hi, three), 8);
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 8));
}

IQ2_INLINE float iq_a2_dot_tq1_0(int64_t n, const block_tq1_0 *w, const block_q8_K *x)
{
    static const int pow3[5] = {1, 3, 9, 27, 81};
    const __m256i ones = _mm256_set1_epi16(1);
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m256i acc = _mm256_setzero_si256();
        /* qs[0..31]: trit k of byte m is element 32k + m */
        __m256i q = _mm256_loadu_si256((const __m256i *)w[b].qs);
        for (int k = 0; k < 5; k++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * k));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(iq_a2_trits(q, pow3[k]), xv), ones));
        }
        /* qs[32..47]: trit k of byte m is element 160 + 16k + m; two k per vector */
        __m128i q16 = _mm_loadu_si128((const __m128i *)(w[b].qs + 32));
        __m256i q2 = _mm256_set_m128i(q16, q16);
        for (int k = 0; k < 4; k += 2) {
            __m256i t = _mm256_blend_epi32(iq_a2_trits(q2, pow3[k]), iq_a2_trits(q2, pow3[k + 1]), 0xf0);
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x[b].qs + 160 + 16 * k));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(t, xv), ones));
        }
        int sum = iq_a2_hsum(acc);
        for (int m = 0; m < 16; m++) sum += (((uint8_t)(w[b].qs[32 + m] * 81) * 3) >> 8) * x[b].qs[224 + m];
        /* qh: trit k of byte j is element 240 + 4k + j */
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 4; j++) sum += (((uint8_t)(w[b].qh[j] * pow3[k]) * 3) >> 8) * x[b].qs[240 + 4 * k + j];
        sum -= iq_a2_xsum(&x[b]);
        sumf += (float)sum * (quant_fp16_to_fp32(w[b].d) * x[b].d);
    }
    return sumf;
}

/* ---- batches ------------------------------------------------------------------------------ */

/* Decoding a sub-block (grid lookups, sign tables, trits) costs far more than its dot: for
 * more than one token, a super-block of IQ_A2_ROWS rows is decoded once into a tile (3-4 KB,
 * in L1) and every token of the call runs over it. Each (row, token) gets the per-row dot's
 * integer sums (exact in int32, so any order of summing gives the same) and its float chain
 * in the same order (this file builds without contraction), so a batch is bit-identical to
 * its tokens one by one (test_ops' batch invariance). */
#define IQ_A2_ROWS 4

/* The four int32 lane sums of a0..a3, in that order. */
IQ2_INLINE __m128i iq_a2_hsum4(__m256i a0, __m256i a1, __m256i a2, __m256i a3)
{
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The driver: rows in groups of IQ_A2_ROWS (the rest, and single tokens, by the per-row DOT),
 * each super-block decoded by FILL(tile, r, block) for r < IQ_A2_ROWS, then TDOT(tile, token's
 * q8_K block, y + row) adds the four rows' contributions of every token; FACTOR (the type's
 * constant, applied last as the per-row dot does) unless it is 1. */
#define IQ_A2_GEMM_TILE(NAME, DOT, BT, TT, FILL, TDOT, FACTOR)                                 \
    static void NAME(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs, \
                     int nt, float *y, size_t ys)                                             \
    {                                                                                         \
        const int nr4 = nt == 1 ? 0 : nr / IQ_A2_ROWS * IQ_A2_ROWS;                           \
        TT k;                                                                                 \
        for (int r0 = 0; r0 < nr4; r0 += IQ_A2_ROWS) {                                        \
            for (int tt = 0; tt < nt; tt++) _mm_storeu_ps(y + (size_t)tt * ys + r0, _mm_setzero_ps()); \
            for (int64_t b = 0; b < cols / QK_K; b++) {                                       \
                for (int r = 0; r < IQ_A2_ROWS; r++)                                          \
                    FILL(&k, r, (const BT *)((const char *)w + (size_t)(r0 + r) * ws) + b);   \
                for (int tt = 0; tt < nt; tt++)                                               \
                    TDOT(&k, (const block_q8_K *)((const char *)x + (size_t)tt * xs) + b,     \
                         y + (size_t)tt * ys + r0);                                           \
            }                                                                                 \
            if ((FACTOR) != 1.0f)                                                             \
                for (int tt = 0; tt < nt; tt++) {                                             \
                    float *yt = y + (size_t)tt * ys + r0;                                     \
                    _mm_storeu_ps(yt, _mm_mul_ps(_mm_set1_ps(FACTOR), _mm_loadu_ps(yt)));     \
                }                                                                             \
        }                                                                                     \
        for (int tt = 0; tt < nt; tt++)                                                       \
            for (int r = nr4; r < nr; r++)                                                    \
                y[(size_t)tt * ys + r] = DOT(cols, (const BT *)((const char *)w + r * ws),    \
                                             (const block_q8_K *)((const char *)x + (size_t)tt * xs)); \
    }

/* The grid types with unsigned points (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): their
 * sub-blocks as the per-row dot takes them. */
typedef struct {
    __m256i pts[IQ_A2_ROWS][QK_K / 32];   /* (row, sub-block) */
    __m256i signs[IQ_A2_ROWS][QK_K / 32]; /* (row, sub-block) */
    __m256i sc[IQ_A2_ROWS][QK_K / 32];    /* (row, sub-block) */
    float d[IQ_A2_ROWS];                  /* per row: fp32 of the super-block's d */
} iq_a2_tile;

#define IQ_A2_FILL_SUB(NAME, BT, SUB)                                                          \
    IQ2_INLINE void NAME(iq_a2_tile *k, int r, const BT *wb)                                   \
    {                                                                                          \
        for (int ib = 0; ib < QK_K / 32; ib++) {                                               \
            iq_a2_sub s = SUB(wb, ib);                                                         \
            k->pts[r][ib] = s.pts, k->signs[r][ib] = s.signs, k->sc[r][ib] = s.sc;             \
        }                                                                                      \
        k->d[r] = quant_fp16_to_fp32(wb->d);                                                   \
    }
IQ_A2_FILL_SUB(iq_a2_fill_iq2_xxs, block_iq2_xxs, iq_a2_sub_iq2_xxs)
IQ_A2_FILL_SUB(iq_a2_fill_iq2_xs, block_iq2_xs, iq_a2_sub_iq2_xs)
IQ_A2_FILL_SUB(iq_a2_fill_iq2_s, block_iq2_s, iq_a2_sub_iq2_s)
IQ_A2_FILL_SUB(iq_a2_fill_iq3_xxs, block_iq3_xxs, iq_a2_sub_iq3_xxs)
IQ_A2_FILL_SUB(iq_a2_fill_iq3_s, block_iq3_s, iq_a2_sub_iq3_s)

/* y[0..3] += (d_w * d_x) * isum, lane by lane: the grid types' per-row chain. */
IQ2_INLINE void iq_a2_tile_finish(const float *d, const block_q8_K *xb, __m128i isum, float *y)
{
    __m128 dd = _mm_mul_ps(_mm_loadu_ps(d), _mm_set1_ps(xb->d));
    _mm_storeu_ps(y, _mm_add_ps(_mm_loadu_ps(y), _mm_mul_ps(dd, _mm_cvtepi32_ps(isum))));
}

/* Token super-block xb against the tile: y[0..3] += (d_w * d_x) * isum, lane by lane. */
IQ2_INLINE void iq_a2_tile_dot(const iq_a2_tile *k, const block_q8_K *xb, float *y)
{
    __m256i acc[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int ib = 0; ib < QK_K / 32; ib++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * ib));
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) {
            __m256i p = _mm256_maddubs_epi16(k->pts[r][ib], _mm256_sign_epi8(xv, k->signs[r][ib]));
            acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, k->sc[r][ib]));
        }
    }
    iq_a2_tile_finish(k->d, xb, iq_a2_hsum4(acc[0], acc[1], acc[2], acc[3]), y);
}


/* IQ1_S, IQ1_M: a grid point (-1, 0, 1) times its scale (odd, at most 15) fits a byte, so the
 * tile holds that product c per element and a token's dot is vpmaddubsw(|c|, sign(x, c)),
 * summed in int16 over the 8 sub-blocks (at most 8 * 2 * 15 * 127 = 30480) and widened once.
 * IQ1_M's delta term (sign per 8 elements times the scale) is a second such product; IQ1_S's
 * (sign and scale per 32) reads the token's 16-element sums (bsums). */
typedef struct {
    __m256i c[IQ_A2_ROWS][QK_K / 32];    /* (row, sub-block): 32 x int8 point * scale */
    __m256i cabs[IQ_A2_ROWS][QK_K / 32]; /* (row, sub-block): |c| */
    __m256i dc[IQ_A2_ROWS][QK_K / 32];   /* IQ1_M (row, sub-block): 32 x int8 delta sign * scale */
    __m256i dcabs[IQ_A2_ROWS][QK_K / 32];/* IQ1_M: |dc| */
    __m256i bc[IQ_A2_ROWS];              /* IQ1_S (row): 16 x int16 delta sign * scale per bsum */
    float d[IQ_A2_ROWS];                 /* per row: fp32 of the super-block scale */
} iq_a2_tile1;

IQ2_INLINE void iq_a2_fill_iq1_s(iq_a2_tile1 *k, int r, const block_iq1_s *wb)
{
    int16_t bc[QK_K / 16];
    for (int ib = 0; ib < QK_K / 32; ib++) {
        int ls;
        __m256i pts = iq_a2_iq1_s_points(wb, ib, &ls);
        __m256i c = _mm256_sign_epi8(_mm256_set1_epi8((char)ls), pts);
        k->c[r][ib] = c, k->cabs[r][ib] = _mm256_abs_epi8(c);
        bc[2 * ib] = bc[2 * ib + 1] = (int16_t)(wb->qh[ib] & 0x8000 ? -ls : ls);
    }
    k->bc[r] = _mm256_loadu_si256((const __m256i *)bc);
    k->d[r] = quant_fp16_to_fp32(wb->d);
}

IQ2_INLINE void iq_a2_fill_iq1_m(iq_a2_tile1 *k, int r, const block_iq1_m *wb)
{
    for (int ib = 0; ib < QK_K / 32; ib++) {
        uint16_t sc = (uint16_t)(wb->scales[2 * (ib / 2)] | wb->scales[2 * (ib / 2) + 1] << 8);
        int ls1 = 2 * ((sc >> (6 * (ib % 2))) & 7) + 1, ls2 = 2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1;
        __m256i sc8 = _mm256_set_m128i(_mm_set1_epi8((char)ls2), _mm_set1_epi8((char)ls1));
        __m256i dl, pts = iq_a2_iq1_m_points(wb, ib, &dl);
        k->c[r][ib] = _mm256_sign_epi8(sc8, pts), k->cabs[r][ib] = _mm256_abs_epi8(k->c[r][ib]);
        k->dc[r][ib] = _mm256_sign_epi8(sc8, dl), k->dcabs[r][ib] = sc8;
    }
    k->d[r] = quant_fp16_to_fp32(quant_iq1_m_scale(wb));
}

/* y[0..3] += (d_w * d_x) * (isum + DELTA * dsum), the per-row dots' chain, lane by lane. */
IQ2_INLINE void iq_a2_tile1_finish(const iq_a2_tile1 *k, const block_q8_K *xb, __m128i isum, __m128i dsum, float *y)
{
    __m128 t = _mm_add_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(_mm_set1_ps(QUANT_IQ1_DELTA), _mm_cvtepi32_ps(dsum)));
    __m128 dd = _mm_mul_ps(_mm_loadu_ps(k->d), _mm_set1_ps(xb->d));
    _mm_storeu_ps(y, _mm_add_ps(_mm_loadu_ps(y), _mm_mul_ps(dd, t)));
}

IQ2_INLINE void iq_a2_tile_dot_iq1_s(const iq_a2_tile1 *k, const block_q8_K *xb, float *y)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[IQ_A2_ROWS], w[IQ_A2_ROWS], dv[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int ib = 0; ib < QK_K / 32; ib++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * ib));
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++)
            acc[r] = _mm256_add_epi16(acc[r], _mm256_maddubs_epi16(k->cabs[r][ib], _mm256_sign_epi8(xv, k->c[r][ib])));
    }
    __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) {
        w[r] = _mm256_madd_epi16(acc[r], ones);
        dv[r] = _mm256_madd_epi16(bs, k->bc[r]);
    }
    iq_a2_tile1_finish(k, xb, iq_a2_hsum4(w[0], w[1], w[2], w[3]), iq_a2_hsum4(dv[0], dv[1], dv[2], dv[3]), y);
}

IQ2_INLINE void iq_a2_tile_dot_iq1_m(const iq_a2_tile1 *k, const block_q8_K *xb, float *y)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[IQ_A2_ROWS], dacc[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = dacc[r] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int ib = 0; ib < QK_K / 32; ib++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * ib));
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) {
            acc[r] = _mm256_add_epi16(acc[r], _mm256_maddubs_epi16(k->cabs[r][ib], _mm256_sign_epi8(xv, k->c[r][ib])));
            dacc[r] = _mm256_add_epi16(dacc[r], _mm256_maddubs_epi16(k->dcabs[r][ib], _mm256_sign_epi8(xv, k->dc[r][ib])));
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) {
        acc[r] = _mm256_madd_epi16(acc[r], ones);
        dacc[r] = _mm256_madd_epi16(dacc[r], ones);
    }
    iq_a2_tile1_finish(k, xb, iq_a2_hsum4(acc[0], acc[1], acc[2], acc[3]),
                       iq_a2_hsum4(dacc[0], dacc[1], dacc[2], dacc[3]), y);
}


/* TQ1_0, TQ2_0: the tile holds each element's code 0..2 in element order, a token's dot is
 * vpmaddubsw(codes, x) summed in int16 (at most 8 * 2 * 2 * 127 = 4064), less the token's
 * block sum once. */
typedef struct {
    __m256i q[IQ_A2_ROWS][QK_K / 32]; /* (row, 32 elements): codes 0..2 */
    float d[IQ_A2_ROWS];              /* per row: fp32 of the block's d */
} iq_a2_tilet;

IQ2_INLINE void iq_a2_fill_tq2_0(iq_a2_tilet *k, int r, const block_tq2_0 *wb)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int c = 0; c < 2; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(wb->qs + 32 * c));
        for (int l = 0; l < 4; l++) k->q[r][4 * c + l] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), m3);
    }
    k->d[r] = quant_fp16_to_fp32(wb->d);
}

IQ2_INLINE void iq_a2_fill_tq1_0(iq_a2_tilet *k, int r, const block_tq1_0 *wb)
{
    static const int pow3[5] = {1, 3, 9, 27, 81};
    __m256i q = _mm256_loadu_si256((const __m256i *)wb->qs);
    for (int j = 0; j < 5; j++) k->q[r][j] = iq_a2_trits(q, pow3[j]); /* elements 32j + m */
    __m128i q16 = _mm_loadu_si128((const __m128i *)(wb->qs + 32));
    __m256i q2 = _mm256_set_m128i(q16, q16);
    /* elements 160 + 16j + m: trit j of qs[32 + m] */
    k->q[r][5] = _mm256_blend_epi32(iq_a2_trits(q2, 1), iq_a2_trits(q2, 3), 0xf0);
    k->q[r][6] = _mm256_blend_epi32(iq_a2_trits(q2, 9), iq_a2_trits(q2, 27), 0xf0);
    /* elements 240 + 4j + i: trit j of qh[i] */
    uint8_t hi[16];
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 4; i++) hi[4 * j + i] = (uint8_t)((((uint8_t)(wb->qh[i] * pow3[j])) * 3) >> 8);
    k->q[r][7] = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)hi), _mm256_castsi256_si128(iq_a2_trits(q2, 81)));
    k->d[r] = quant_fp16_to_fp32(wb->d);
}

/* y[0..3] += (isum - the token's block sum) * (d_w * d_x), the per-row dots' chain. */
IQ2_INLINE void iq_a2_tilet_finish(const iq_a2_tilet *k, const block_q8_K *xb, __m128i isum, float *y)
{
    isum = _mm_sub_epi32(isum, _mm_set1_epi32(iq_a2_xsum(xb)));
    __m128 dd = _mm_mul_ps(_mm_loadu_ps(k->d), _mm_set1_ps(xb->d));
    _mm_storeu_ps(y, _mm_add_ps(_mm_loadu_ps(y), _mm_mul_ps(_mm_cvtepi32_ps(isum), dd)));
}

IQ2_INLINE void iq_a2_tile_dot_tq(const iq_a2_tilet *k, const block_q8_K *xb, float *y)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int ib = 0; ib < QK_K / 32; ib++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * ib));
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++)
            acc[r] = _mm256_add_epi16(acc[r], _mm256_maddubs_epi16(k->q[r][ib], xv));
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = _mm256_madd_epi16(acc[r], ones);
    iq_a2_tilet_finish(k, xb, iq_a2_hsum4(acc[0], acc[1], acc[2], acc[3]), y);
}

/* Every type with a batch tile, as X(name, QTYPE suffix, tile type, tile-dot suffix, FACTOR):
 * each level instantiates its gemms and fills its kernel table from this one list. */
#define IQ_X86_TYPES(X)                                \
    X(iq2_xxs, IQ2_XXS, iq_a2_tile, , 0.125f)          \
    X(iq2_xs, IQ2_XS, iq_a2_tile, , 0.125f)            \
    X(iq2_s, IQ2_S, iq_a2_tile, , 0.125f)              \
    X(iq3_xxs, IQ3_XXS, iq_a2_tile, , 0.25f)           \
    X(iq3_s, IQ3_S, iq_a2_tile, , 1.0f)                \
    X(iq1_s, IQ1_S, iq_a2_tile1, _iq1_s, 1.0f)         \
    X(iq1_m, IQ1_M, iq_a2_tile1, _iq1_m, 1.0f)         \
    X(tq1_0, TQ1_0, iq_a2_tilet, _tq, 1.0f)            \
    X(tq2_0, TQ2_0, iq_a2_tilet, _tq, 1.0f)

#endif
