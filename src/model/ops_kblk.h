/*
 * ops_kblk: the batch (several tokens) paths of the K-quant-like types (Q2_K, Q3_K, IQ4_XS
 * against Q8_K) and of the 32-element types (Q4_1, Q5_0, Q5_1, IQ4_NL against Q8_1), shared
 * by the x86 kernel files (included only by ops_avx2.c and ops_avx512.c: it uses AVX2
 * intrinsics and compiles at the including file's ISA).
 *
 * A per-row dot spends most of its time unpacking the weight bits, again for every token.
 * ops_kblk_gemm unpacks one super-block of OPS_KBLK_ROWS rows once (into bytes and int16
 * scale vectors, about 3 KB, in L1) and runs every token of the call over it with the
 * including level's block dot, which loads each token's activations once for all the rows.
 * ops_kblk32_gemm does the same for OPS_KBLK32_ROWS rows of up to 8 blocks of 32 (bytes and
 * float scales, about 4.5 KB). A (row, token) element gets the per-row dot's exact integer
 * sum per (super-)block and the same float arithmetic in the same order (y starts at 0 and
 * takes each block's term in block order; the float chains below are the only ones, written
 * once for both levels), so the results are bit-identical to the level's per-row dot
 * whatever the tile (batch invariance, test_ops).
 */
#ifndef TM_OPS_KBLK_H
#define TM_OPS_KBLK_H

#include "model/ops_int.h"

#include <immintrin.h>
#include <string.h>

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

/* Q3_K's 16 sub-block scales (6 bits each in 12 bytes) less 32, as signed bytes in
 * sub-block order: quant_q3_K_scales on 32-bit lanes (lane i: sub-blocks 4i..4i+3, low
 * nibbles of bytes 0-7 then their high nibbles, the top 2 bits from bytes 8-11 at shift
 * 2i). */
OPS_KBLK_INLINE __m128i ops_kblk_q3_K_scales(const uint8_t packed[12])
{
    uint32_t a[3];
    memcpy(a, packed, sizeof a);
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    __m128i s = _mm_set_epi32((int)(((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4)),
                              (int)(((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4)),
                              (int)((a[1] & m4) | (((a[2] >> 2) & m2) << 4)),
                              (int)((a[0] & m4) | ((a[2] & m2) << 4)));
    return _mm_sub_epi8(s, _mm_set1_epi8(32));
}

/* The scale pair of chunk c (32 columns = sub-blocks 2c, 2c + 1) from 16 int16 scales in
 * sub-block order, s16: low 8 lanes sub-block 2c's, high 8 lanes 2c + 1's, by one byte
 * shuffle of s16's half (both lanes) that holds them. */
OPS_KBLK_INLINE __m256i ops_kblk_sc_chunk(__m256i s16, int c)
{
    const int k = c % 4;
    __m256i half = c < 4 ? _mm256_permute2x128_si256(s16, s16, 0x00) : _mm256_permute2x128_si256(s16, s16, 0x11);
    __m256i ctl = _mm256_set_m128i(_mm_set1_epi16((int16_t)(((4 * k + 3) << 8) | (4 * k + 2))),
                                   _mm_set1_epi16((int16_t)(((4 * k + 1) << 8) | (4 * k))));
    return _mm256_shuffle_epi8(half, ctl);
}

/* Q3_K's chunk c (columns 32c..32c+31) as unsigned bytes 0..7 (value + 4): the 2 low bits
 * at bits 2(c % 4) of qs[32(c / 4) ..], the high bit at bit c of hmask. */
OPS_KBLK_INLINE __m256i ops_kblk_q3_K_chunk(const block_q3_K *w, int c)
{
    __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * (c / 4)));
    __m256i hm = _mm256_loadu_si256((const __m256i *)w->hmask);
    q = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (c % 4)), _mm256_set1_epi8(3));
    __m256i h = c < 2 ? _mm256_slli_epi16(hm, 2 - c) : _mm256_srli_epi16(hm, c - 2); /* bit c to bit 2 */
    return _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(4)));
}

static void ops_kblk_unpack_q3_K(const block_q3_K *w, ops_kblk *k, int r)
{
    __m256i s16 = _mm256_cvtepi8_epi16(ops_kblk_q3_K_scales(w->scales));
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
        k->u[r][c] = ops_kblk_q3_K_chunk(w, c);
        k->sc[r][c] = ops_kblk_sc_chunk(s16, c);
    }
    k->sg[r] = s16;
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

/* The four int32 lane sums of a0..a3, in that order (integer adds: exact in any order). */
OPS_KBLK_INLINE __m128i ops_kblk_hsum4_i32(__m256i a0, __m256i a1, __m256i a2, __m256i a3)
{
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The eight int32 lane sums of a[0..7], in that order. */
OPS_KBLK_INLINE __m256i ops_kblk_hsum8_i32(const __m256i a[8])
{
    __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
    __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* The end of a level's block dot: a[r] holds row r's integer sub-block products (scaled by
 * the sub-block scales, 8 int32 lanes) for token super-block xb; adds each row's term to the
 * token's y[0..3] with the per-row dots' float arithmetic, lane by lane: Q3_K y = fma(d_x*d,
 * isum - 4 * sum_g sg_g*bsum_g, y); Q2_K y += fma(d_x*d, isum, -((d_x*dmin) * sum_g
 * m_g*bsum_g)); IQ4_XS y = fma(d_x*d, isum, y). The fused multiply-adds are explicit on both
 * paths, so that the compiler's contraction of plain float expressions cannot make them
 * differ. */
OPS_KBLK_INLINE void ops_kblk_finish(const ops_kblk *k, qtype t, const block_q8_K *xb, __m256i a[OPS_KBLK_ROWS], float *y)
{
    __m128 xd = _mm_set1_ps(xb->d), yv = _mm_loadu_ps(y);
    __m128 dx = _mm_mul_ps(xd, _mm_loadu_ps(k->d));
    __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
    if (t == QTYPE_Q3_K)
        _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK_ROWS; r++)
            a[r] = _mm256_sub_epi32(a[r], _mm256_slli_epi32(_mm256_madd_epi16(k->sg[r], bs), 2));
    __m128 isum = _mm_cvtepi32_ps(ops_kblk_hsum4_i32(a[0], a[1], a[2], a[3]));
    if (t == QTYPE_Q2_K) {
        __m128 imin = _mm_cvtepi32_ps(ops_kblk_hsum4_i32(_mm256_madd_epi16(k->sg[0], bs), _mm256_madd_epi16(k->sg[1], bs),
                                                          _mm256_madd_epi16(k->sg[2], bs), _mm256_madd_epi16(k->sg[3], bs)));
        __m128 dm = _mm_mul_ps(xd, _mm_loadu_ps(k->dmin));
        yv = _mm_add_ps(yv, _mm_fmadd_ps(dx, isum, _mm_sub_ps(_mm_setzero_ps(), _mm_mul_ps(dm, imin))));
    } else {
        yv = _mm_fmadd_ps(dx, isum, yv);
    }
    _mm_storeu_ps(y, yv);
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

/* ---- the 32-element types against Q8_1 ---------------------------------------------------- */

#define OPS_KBLK32_ROWS 8 /* weight rows unpacked together: one float lane each */
#define OPS_KBLK32_BLKS 8 /* blocks of 32 columns unpacked at a time */

/* Up to OPS_KBLK32_BLKS blocks of OPS_KBLK32_ROWS rows, unpacked; a block's rows are
 * contiguous (a 64-byte load at row 2i reads rows 2i and 2i + 1). */
typedef struct {
    uint8_t u[OPS_KBLK32_BLKS][OPS_KBLK32_ROWS][32] __attribute__((aligned(64))); /* (block, row, column):
                                 * Q4_1 0..15, Q5_1 0..31; Q5_0 and IQ4_NL |value| */
    int8_t v[OPS_KBLK32_BLKS][OPS_KBLK32_ROWS][32] __attribute__((aligned(64))); /* Q5_0, IQ4_NL: the
                                 * signed values (their signs go onto the activations) */
    float d[OPS_KBLK32_BLKS][OPS_KBLK32_ROWS]; /* (block, row): fp32 of the block's d */
    float m[OPS_KBLK32_BLKS][OPS_KBLK32_ROWS]; /* Q4_1, Q5_1: fp32 of the block's m */
} ops_kblk32;

OPS_KBLK_INLINE size_t ops_kblk32_block_bytes(qtype t)
{
    return t == QTYPE_Q4_1 ? sizeof(block_q4_1) : t == QTYPE_Q5_0 ? sizeof(block_q5_0)
         : t == QTYPE_Q5_1 ? sizeof(block_q5_1) : sizeof(block_iq4_nl);
}

/* 32 nibbles of 16 bytes: low nibbles in bytes 0..15, high ones in 16..31. */
OPS_KBLK_INLINE __m256i ops_kblk32_nibbles(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* Byte j = 0x10 where bit j of the 32-bit qh is set, else 0. */
OPS_KBLK_INLINE __m256i ops_kblk32_bit4(const uint8_t qh4[4])
{
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                    _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                       0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Block wb (type t) into block slot j, row r of k. */
OPS_KBLK_INLINE void ops_kblk32_unpack(qtype t, const void *wb, ops_kblk32 *k, int j, int r)
{
    const fp16_t *dm = wb; /* every one of these blocks starts with d (and m) */
    __m256i u;
    if (t == QTYPE_Q4_1) {
        u = ops_kblk32_nibbles(((const block_q4_1 *)wb)->qs);
    } else if (t == QTYPE_Q5_1) {
        const block_q5_1 *b = wb;
        u = _mm256_or_si256(ops_kblk32_nibbles(b->qs), ops_kblk32_bit4(b->qh));
    } else {
        __m256i v;
        if (t == QTYPE_Q5_0) {
            const block_q5_0 *b = wb;
            v = _mm256_sub_epi8(_mm256_or_si256(ops_kblk32_nibbles(b->qs), ops_kblk32_bit4(b->qh)), _mm256_set1_epi8(16));
        } else {
            const __m128i tab = _mm_loadu_si128((const __m128i *)quant_kvalues_iq4nl);
            v = _mm256_shuffle_epi8(_mm256_set_m128i(tab, tab), ops_kblk32_nibbles(((const block_iq4_nl *)wb)->qs));
        }
        _mm256_store_si256((__m256i *)k->v[j][r], v);
        u = _mm256_sign_epi8(v, v);
    }
    _mm256_store_si256((__m256i *)k->u[j][r], u);
    k->d[j][r] = _cvtsh_ss(dm[0]);
    if (t == QTYPE_Q4_1 || t == QTYPE_Q5_1) k->m[j][r] = _cvtsh_ss(dm[1]);
}

/* Token block xb's term for the 8 rows of block slot j, given their exact integer dots isum
 * (one int32 lane per row), added to y lane by lane with the per-row dots' float chain
 * (ops_avx2.c's A2_DOT32): y = fma(isum, d_w * d_x, y), then (types with a min) y = fma(m_w,
 * s_x, y). Fused explicitly on both paths: these files build with contraction on, and a
 * chain left to the compiler could fuse differently in the two. */
OPS_KBLK_INLINE __m256 ops_kblk32_finish(qtype t, const ops_kblk32 *k, int j, const block_q8_1 *xb, __m256i isum, __m256 y)
{
    __m256 dd = _mm256_mul_ps(_mm256_loadu_ps(k->d[j]), _mm256_set1_ps(_cvtsh_ss(xb->d)));
    y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, y);
    if (t == QTYPE_Q4_1 || t == QTYPE_Q5_1)
        y = _mm256_fmadd_ps(_mm256_loadu_ps(k->m[j]), _mm256_set1_ps(_cvtsh_ss(xb->s)), y);
    return y;
}

/* The gemm (ops_gemm_fn) for the 32-element weight type t (a constant in each caller): bdot
 * gives token block xb's exact integer dots with block slot j of the OPS_KBLK32_ROWS rows of k
 * (one int32 lane per row); rows past the last whole group take the per-row dot `dot`. */
OPS_KBLK_INLINE void ops_kblk32_gemm(qtype t, __m256i (*bdot)(const ops_kblk32 *, qtype, int, const block_q8_1 *),
                                     float (*dot)(int64_t, const void *, const block_q8_1 *), int64_t cols,
                                     const void *w, size_t ws, int nr, const void *x, size_t xs, int nt,
                                     float *y, size_t ys)
{
    const size_t bb = ops_kblk32_block_bytes(t);
    const int64_t nb = cols / 32;
    const int nr8 = nr / OPS_KBLK32_ROWS * OPS_KBLK32_ROWS;
    ops_kblk32 k;
    for (int r0 = 0; r0 < nr8; r0 += OPS_KBLK32_ROWS) {
        for (int tt = 0; tt < nt; tt++) _mm256_storeu_ps(y + (size_t)tt * ys + r0, _mm256_setzero_ps());
        for (int64_t b0 = 0; b0 < nb; b0 += OPS_KBLK32_BLKS) {
            const int n = nb - b0 < OPS_KBLK32_BLKS ? (int)(nb - b0) : OPS_KBLK32_BLKS;
            for (int r = 0; r < OPS_KBLK32_ROWS; r++) {
                const char *wr = (const char *)w + (size_t)(r0 + r) * ws + (size_t)b0 * bb;
                for (int j = 0; j < n; j++) ops_kblk32_unpack(t, wr + (size_t)j * bb, &k, j, r);
            }
            for (int tt = 0; tt < nt; tt++) {
                const block_q8_1 *xb = (const block_q8_1 *)((const char *)x + (size_t)tt * xs) + b0;
                float *yt = y + (size_t)tt * ys + r0;
                __m256 yv = _mm256_loadu_ps(yt);
                for (int j = 0; j < n; j++) yv = ops_kblk32_finish(t, &k, j, xb + j, bdot(&k, t, j, xb + j), yv);
                _mm256_storeu_ps(yt, yv);
            }
        }
    }
    for (int tt = 0; tt < nt; tt++)
        for (int r = nr8; r < nr; r++)
            y[(size_t)tt * ys + r] = dot(cols, (const char *)w + r * ws, (const block_q8_1 *)((const char *)x + (size_t)tt * xs));
}

#endif
