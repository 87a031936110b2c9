/*
 * ops_iq_avx512: the AVX-512 level's batch kernels of the codebook and ternary types. They
 * decode the same 4-row tiles as the AVX2 level (ops_iq_x86.h) and run each token over them
 * 64 elements at a time with VNNI: vpdpbusd for the byte products that fit a byte
 * (ternary codes, IQ1 points times scales), vpmaddubsw then vpdpwssd for the grid types whose
 * scales do not. Signs go onto the activations by a masked subtraction (AVX-512 has no
 * vpsignb), which wraps -128 as vpsignb does. The int32 sums are the AVX2 ones exactly, the
 * float chain the same, so every level stays bit-identical to the scalar one. Single tokens
 * and leftover rows use the AVX2 per-row dots.
 */
#include "model/ops_iq_x86.h"

/* The 8 int32 lane sums of a 512-bit accumulator, folded to 256 bits for iq_a2_hsum4. */
IQ2_INLINE __m256i iq_a5_fold(__m512i a)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
}

/* x with its bytes negated where s (a sign or a signed coefficient) is negative. */
IQ2_INLINE __m512i iq_a5_sign(__m512i x, __m512i s)
{
    return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(s), _mm512_setzero_si512(), x);
}

#define IQ_A5_LD(p) _mm512_loadu_si512((const void *)(p))

IQ2_INLINE void iq_a5_tile_dot(const iq_a2_tile *k, const block_q8_K *xb, float *y)
{
    __m512i acc[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int j = 0; j < QK_K / 64; j++) {
        __m512i xv = IQ_A5_LD(xb->qs + 64 * j);
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) {
            __m512i p = _mm512_maddubs_epi16(IQ_A5_LD(&k->pts[r][2 * j]), iq_a5_sign(xv, IQ_A5_LD(&k->signs[r][2 * j])));
            acc[r] = _mm512_dpwssd_epi32(acc[r], p, IQ_A5_LD(&k->sc[r][2 * j]));
        }
    }
    iq_a2_tile_finish(k->d, xb, iq_a2_hsum4(iq_a5_fold(acc[0]), iq_a5_fold(acc[1]), iq_a5_fold(acc[2]), iq_a5_fold(acc[3])), y);
}

IQ2_INLINE void iq_a5_tile_dot_iq1_s(const iq_a2_tile1 *k, const block_q8_K *xb, float *y)
{
    __m512i acc[IQ_A2_ROWS];
    __m256i dv[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int j = 0; j < QK_K / 64; j++) {
        __m512i xv = IQ_A5_LD(xb->qs + 64 * j);
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++)
            acc[r] = _mm512_dpbusd_epi32(acc[r], IQ_A5_LD(&k->cabs[r][2 * j]), iq_a5_sign(xv, IQ_A5_LD(&k->c[r][2 * j])));
    }
    __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) dv[r] = _mm256_madd_epi16(bs, k->bc[r]);
    iq_a2_tile1_finish(k, xb, iq_a2_hsum4(iq_a5_fold(acc[0]), iq_a5_fold(acc[1]), iq_a5_fold(acc[2]), iq_a5_fold(acc[3])),
                       iq_a2_hsum4(dv[0], dv[1], dv[2], dv[3]), y);
}

IQ2_INLINE void iq_a5_tile_dot_iq1_m(const iq_a2_tile1 *k, const block_q8_K *xb, float *y)
{
    __m512i acc[IQ_A2_ROWS], dacc[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = dacc[r] = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int j = 0; j < QK_K / 64; j++) {
        __m512i xv = IQ_A5_LD(xb->qs + 64 * j);
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) {
            acc[r] = _mm512_dpbusd_epi32(acc[r], IQ_A5_LD(&k->cabs[r][2 * j]), iq_a5_sign(xv, IQ_A5_LD(&k->c[r][2 * j])));
            dacc[r] = _mm512_dpbusd_epi32(dacc[r], IQ_A5_LD(&k->dcabs[r][2 * j]), iq_a5_sign(xv, IQ_A5_LD(&k->dc[r][2 * j])));
        }
    }
    iq_a2_tile1_finish(k, xb, iq_a2_hsum4(iq_a5_fold(acc[0]), iq_a5_fold(acc[1]), iq_a5_fold(acc[2]), iq_a5_fold(acc[3])),
                       iq_a2_hsum4(iq_a5_fold(dacc[0]), iq_a5_fold(dacc[1]), iq_a5_fold(dacc[2]), iq_a5_fold(dacc[3])), y);
}

IQ2_INLINE void iq_a5_tile_dot_tq(const iq_a2_tilet *k, const block_q8_K *xb, float *y)
{
    __m512i acc[IQ_A2_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++) acc[r] = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int j = 0; j < QK_K / 64; j++) {
        __m512i xv = IQ_A5_LD(xb->qs + 64 * j);
        _Pragma("GCC unroll 4") for (int r = 0; r < IQ_A2_ROWS; r++)
            acc[r] = _mm512_dpbusd_epi32(acc[r], IQ_A5_LD(&k->q[r][2 * j]), xv);
    }
    iq_a2_tilet_finish(k, xb, iq_a2_hsum4(iq_a5_fold(acc[0]), iq_a5_fold(acc[1]), iq_a5_fold(acc[2]), iq_a5_fold(acc[3])), y);
}

#define IQ_GEMM(n, T, TT, DSFX, FACTOR) \
    IQ_A2_GEMM_TILE(iq_a5_gemm_##n, iq_a2_dot_##n, block_##n, TT, iq_a2_fill_##n, iq_a5_tile_dot##DSFX, FACTOR)
IQ_X86_TYPES(IQ_GEMM)
#undef IQ_GEMM

void ops_iq_init_avx512(ops_kernels *k)
{
#define IQ_SET(n, T, TT, DSFX, FACTOR) k->gemm[QTYPE_##T] = iq_a5_gemm_##n;
    IQ_X86_TYPES(IQ_SET)
#undef IQ_SET
}
