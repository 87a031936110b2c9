/*
 * ops_kblk: the batch (several tokens) path of Q2_K, Q3_K and IQ4_XS weights, shared by the
 * x86 kernel files (included only by ops_avx2.c and ops_avx512.c: it uses AVX2 intrinsics and
 * compiles at the including file's ISA).
 *
 * A per-row dot spends most of its time unpacking the weight bits, again for every token.
 * ops_kblk_gemm unpacks one super-block of OPS_KBLK_ROWS rows once (into bytes and int16
 * scale vectors, about 3 KB, in L1) and runs every token of the call over it with the
 * including level's block dot, which loads each token's activations once for all the rows.
 * A (row, token) element gets the per-row dot's exact integer sum per super-block and the
 * same float arithmetic in the same order (y starts at 0 and takes each super-block's term
 * in block order), so the results are bit-identical to the level's per-row dot whatever the
 * tile (batch invariance, test_ops).
 */
#ifndef TM_OPS_KBLK_H
#define TM_OPS_KBLK_H

#include "model/ops_int.h"

#include <immintrin.h>

#define OPS_KBLK_INLINE static inline __attribute__((always_inline))
#define OPS_KBLK_ROWS 4 /* weight rows unpacked together */

/* One super-block (256 columns) of OPS_KBLK_ROWS rows, unpacked. Each row's u, v and sc are
 * contiguous, so a 64-byte load at chunk 2j reads chunks 2j and 2j + 1. */
typedef struct {
    __m256i u[OPS_KBLK_ROWS][8];  /* (row, chunk of 32 columns): unsigned values, Q3_K 0..7
                                   * (value + 4), Q2_K 0..3; IQ4_XS |value| */
    __m256i v[OPS_KBLK_ROWS][8];  /* IQ4_XS only: the signed values */
    __m256i sc[OPS_KBLK_ROWS][8]; /* (row, chunk): 16 x int16 sub-block scales, low 8 lanes
                                   * the chunk's first 16 columns' (Q3_K: sc - 32) */
    __m256i sg[OPS_KBLK_ROWS];    /* per row, 16 x int16 in sub-block order: Q3_K sc - 32,
                                   * Q2_K the mins (the bsum terms) */
    float d[OPS_KBLK_ROWS];       /* per row: fp32 of the super-block's d */
    float dmin[OPS_KBLK_ROWS];    /* per row: Q2_K's dmin */
} ops_kblk;

OPS_KBLK_INLINE __m256i ops_kblk_sc_pair(int lo, int hi)
{
    return _mm256_set_m128i(_mm_set1_epi16((int16_t)hi), _mm_set1_epi16((int16_t)lo));
}

static void ops_kblk_unpack_q3_K(const block_q3_K *w, ops_kblk *k, int r)
{
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    int8_t sc[16];
    quant_q3_K_scales(w->scales, sc);
    __m256i hm = _mm256_loadu_si256((const __m256i *)w->hmask);
    for (int c = 0; c < 8; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * (c / 4)));
        q = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (c % 4)), m3);
        __m256i h = _mm256_and_si256(_mm256_srli_epi16(hm, c), one);
        k->u[r][c] = _mm256_or_si256(q, _mm256_slli_epi16(h, 2));
        k->sc[r][c] = ops_kblk_sc_pair(sc[2 * c] - 32, sc[2 * c + 1] - 32);
    }
    k->sg[r] = _mm256_sub_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)), _mm256_set1_epi16(32));
    k->d[r] = _cvtsh_ss(w->d);
}

static void ops_kblk_unpack_q2_K(const block_q2_K *w, ops_kblk *k, int r)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int c = 0; c < 8; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * (c / 4)));
        k->u[r][c] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (c % 4)), m3);
        k->sc[r][c] = ops_kblk_sc_pair(w->scales[2 * c] & 0xF, w->scales[2 * c + 1] & 0xF);
    }
    __m256i s = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
    k->sg[r] = _mm256_srli_epi16(s, 4);
    k->d[r] = _cvtsh_ss(w->d);
    k->dmin[r] = _cvtsh_ss(w->dmin);
}

static void ops_kblk_unpack_iq4_xs(const block_iq4_xs *w, ops_kblk *k, int r)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)quant_kvalues_iq4nl);
    for (int c = 0; c < 8; c++) {
        /* low nibbles are the chunk's columns 0..15, high nibbles 16..31 */
        __m128i q = _mm_loadu_si128((const __m128i *)(w->qs + 16 * c));
        __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
        __m256i v = _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nib);
        k->v[r][c] = v;
        k->u[r][c] = _mm256_sign_epi8(v, v);
        int s = quant_iq4_xs_scale(w, c) - 32;
        k->sc[r][c] = ops_kblk_sc_pair(s, s);
    }
    k->d[r] = _cvtsh_ss(w->d);
}

/* The gemm (ops_gemm_fn) for weight type t (a constant in each caller): bdot adds one
 * token's super-block xb against the OPS_KBLK_ROWS rows of k to that token's y[0..3]; rows
 * past the last whole group take the per-row dot `dot`. */
OPS_KBLK_INLINE void ops_kblk_gemm(qtype t, void (*bdot)(const ops_kblk *, qtype, const block_q8_K *, float *),
                                   float (*dot)(int64_t, const void *, const block_q8_K *), int64_t cols,
                                   const void *w, size_t ws, int nr, const void *x, size_t xs, int nt,
                                   float *y, size_t ys)
{
    const size_t bb = t == QTYPE_Q3_K ? sizeof(block_q3_K) : t == QTYPE_Q2_K ? sizeof(block_q2_K) : sizeof(block_iq4_xs);
    const int nr4 = nr / OPS_KBLK_ROWS * OPS_KBLK_ROWS;
    ops_kblk k;
    for (int tt = 0; tt < nt; tt++)
        for (int r = 0; r < nr4; r++) y[(size_t)tt * ys + r] = 0;
    for (int r0 = 0; r0 < nr4; r0 += OPS_KBLK_ROWS)
        for (int64_t b = 0; b < cols / QK_K; b++) {
            for (int r = 0; r < OPS_KBLK_ROWS; r++) {
                const void *wb = (const char *)w + (size_t)(r0 + r) * ws + (size_t)b * bb;
                if (t == QTYPE_Q3_K) ops_kblk_unpack_q3_K(wb, &k, r);
                else if (t == QTYPE_Q2_K) ops_kblk_unpack_q2_K(wb, &k, r);
                else ops_kblk_unpack_iq4_xs(wb, &k, r);
            }
            for (int tt = 0; tt < nt; tt++)
                bdot(&k, t, (const block_q8_K *)((const char *)x + (size_t)tt * xs) + b, y + (size_t)tt * ys + r0);
        }
    for (int tt = 0; tt < nt; tt++)
        for (int r = nr4; r < nr; r++)
            y[(size_t)tt * ys + r] = dot(cols, (const char *)w + r * ws, (const block_q8_K *)((const char *)x + (size_t)tt * xs));
}

#endif
