/*
 * ops_avx512: AVX-512 (F, BW, VL, DQ, VNNI) kernels (see ops_int.h for the table they fill).
 *
 * Matmul micro-kernels keep an R x T tile of float accumulators (R weight rows, T tokens) in
 * zmm registers and walk the columns once, so every weight byte loaded is used T times and
 * every activation byte R times. Integer dot products are exact (VNNI vpdpbusd / vpdpwssd);
 * their per-block scales are applied in float.
 *
 * Activation formats at this level (produced by this file's quantisers, consumed only by this
 * file's kernels; ops_matmul_scratch_bytes covers them):
 * - Q8_0 consumers (Q8_0, Q4_0, MXFP4 weights): per token, cols signed bytes of q, then
 *   cols/32 floats: the block scales, already rounded through fp16 as ggml stores them, then
 *   cols/32 int32: -128 times the sum of the block's q. vpdpbusd multiplies unsigned by
 *   signed bytes, so the kernels make the weights unsigned: dpbusd(w+128, q) = sum(q*w) +
 *   128*sum(q), started from -128*sum(q), which depends on the activations only, so it costs
 *   nothing per weight row (a decode step's tile has one token and 4 or 16 rows); the integer
 *   sums, so the results, are the same. The file-layout kernels form that start per lane
 *   (one dpbusd per token and block pair); the repacked kernels (block_q8_0x16, weights
 *   stored plus 128; block_q4_0x16, nibbles 0..15 for values - 8; block_mxfp4x16, looked up
 *   plus 128) read the block's sum.
 * - Q8_K consumers (Q4_K, Q5_K, Q6_K): plain block_q8_K; weights are unpacked to unsigned bytes and
 *   multiplied with vpmaddubsw, then scaled per sub-block with vpdpwssd. The 16-row repacked
 *   layouts (block_q4_Kx16, block_q6_Kx16, what model_load uses on this level) have their own
 *   kernels: one int32 lane per row, vpdpbusd against broadcast activation bytes, integer
 *   sub-block scales, and float arithmetic in the scalar reference's order (bit-identical).
 * - F16 / BF16 / F32: plain rows.
 *
 * The level's float kernels (vector helpers, norms, softmax, attention) are ops_vec_avx512.c's.
 */
#include "model/ops_avx512.h"
#include "model/ops_kblk.h"
#include "util/util.h"

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define A512_PF 1024 /* weight prefetch distance, bytes ahead in the row */

static size_t a512_act_row_bytes(qtype vt, int64_t cols)
{
    return vt == QTYPE_Q8_0 ? ops_q8_0x_row_bytes(cols) : quant_row_bytes(vt, cols);
}

/* ---- activation quantisers ------------------------------------------------------------ */

static void a512_quant_q8_0(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    int8_t *q = (int8_t *)dst;
    float *d = (float *)(q + cols);
    int32_t *nsum = (int32_t *)(d + cols / 32);
    const __m512 signbit = _mm512_set1_ps(-0.0f);
    for (int64_t b = e0 / 32; b < e1 / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        __m512 m = _mm512_max_ps(_mm512_andnot_ps(signbit, v0), _mm512_andnot_ps(signbit, v1));
        float amax = _mm512_reduce_max_ps(m);
        float db = amax / 127.f;
        d[b] = _cvtsh_ss(_cvtss_sh(db, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        float id = amax != 0.0f ? 127.f / amax : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        __m128i b0 = _mm512_cvtsepi32_epi8(i0), b1 = _mm512_cvtsepi32_epi8(i1);
        _mm256_storeu_si256((__m256i *)(q + 32 * b), _mm256_set_m128i(b1, b0));
        /* the sum of the stored (saturated) bytes: widen them back */
        __m512i s16 = _mm512_add_epi32(_mm512_cvtepi8_epi32(b0), _mm512_cvtepi8_epi32(b1));
        nsum[b] = -128 * _mm512_reduce_add_epi32(s16);
    }
}

static void a512_quant_q8_K(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    const __m512 signbit = _mm512_set1_ps(-0.0f);
    block_q8_K *y = dst;
    (void)cols;
    x += e0 / QK_K * QK_K;
    for (int64_t i = e0 / QK_K; i < e1 / QK_K; i++, x += QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < QK_K; j += 16)
            m = _mm512_max_ps(m, _mm512_andnot_ps(signbit, _mm512_loadu_ps(x + j)));
        float amax = _mm512_reduce_max_ps(m);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* the first element of largest magnitude, as the scalar loop picks it */
        float max = 0;
        __m512 va = _mm512_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 16) {
            __mmask16 k = _mm512_cmp_ps_mask(_mm512_andnot_ps(signbit, _mm512_loadu_ps(x + j)),
                                             va, _CMP_EQ_OQ);
            if (k) {
                max = x[j + __builtin_ctz(k)];
                break;
            }
        }
        float iscale = -127.f / max;
        __m512 vs = _mm512_set1_ps(iscale);
        const __m512i cap = _mm512_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 16) {
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j), vs));
            v = _mm512_min_epi32(v, cap);
            _mm_storeu_si128((__m128i *)(y[i].qs + j), _mm512_cvtsepi32_epi8(v));
            y[i].bsums[j / 16] = (int16_t)_mm512_reduce_add_epi32(v);
        }
        y[i].d = 1 / iscale;
    }
}

static void a512_to_f16(const float *x, fp16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(y + i, k, h);
    }
}

static void a512_from_f16(const fp16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, x + i)));
    }
}

A512_INLINE __m256i a512_bf16_round(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                            _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(64));
    return _mm512_cvtepi32_epi16(r);
}

static void a512_to_bf16(const float *x, bf16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), a512_bf16_round(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(y + i, k, a512_bf16_round(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

/* ---- tile dispatch helper ------------------------------------------------------------- */

/* Calls KERNEL(R, T, ...) for every tile of an nr x nt output, R <= RMAX, T <= TMAX, with
 * R and T compile-time constants so the micro-kernel's arrays live in registers. */
#define A512_TILES(RMAX, TMAX, KERNEL)                                                     \
    for (int r0 = 0; r0 < nr; r0 += RMAX) {                                                \
        int rr = nr - r0 < RMAX ? nr - r0 : RMAX;                                          \
        for (int t0 = 0; t0 < nt; t0 += TMAX) {                                            \
            int tt = nt - t0 < TMAX ? nt - t0 : TMAX;                                      \
            switch (rr * 8 + tt) {                                                         \
            A512_CASE(KERNEL, 1, 1) A512_CASE(KERNEL, 1, 2) A512_CASE(KERNEL, 1, 3)        \
            A512_CASE(KERNEL, 1, 4) A512_CASE(KERNEL, 2, 1) A512_CASE(KERNEL, 2, 2)        \
            A512_CASE(KERNEL, 2, 3) A512_CASE(KERNEL, 2, 4) A512_CASE(KERNEL, 3, 1)        \
            A512_CASE(KERNEL, 3, 2) A512_CASE(KERNEL, 3, 3) A512_CASE(KERNEL, 3, 4)        \
            A512_CASE(KERNEL, 4, 1) A512_CASE(KERNEL, 4, 2) A512_CASE(KERNEL, 4, 3)        \
            A512_CASE(KERNEL, 4, 4)                                                        \
            default: break;                                                                \
            }                                                                              \
        }                                                                                  \
    }
#define A512_CASE(KERNEL, R, T)                                                            \
    case R * 8 + T:                                                                        \
        KERNEL(R, T, cols, (const char *)w + (size_t)r0 * ws, ws,                          \
               (const char *)x + (size_t)t0 * xs, xs, y + (size_t)t0 * ys + r0, ys);       \
        break;

/* ---- Q8_0 / Q4_0 weights x Q8_0 activations ------------------------------------------- */

/* Loads blocks 2p and 2p+1 (only 2p if `one`) of a Q8_0 row: 64 signed bytes and the
 * matching scale vector (lanes 0-7 block 2p, 8-15 block 2p+1). */
/* The scales of blocks b[0] and b[1] in lanes 0-7 and 8-15: both fp16 values converted by
 * one vcvtph2ps and spread by one permute. */
A512_INLINE __m512 a512_pair_scales(fp16_t d0, fp16_t d1)
{
    __m128i h = _mm_insert_epi16(_mm_cvtsi32_si128(d0), d1, 1);
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)));
}

A512_INLINE void a512_load_w_q8_0(const block_q8_0 *b, int one, __m512i *q, __m512 *d)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
    if (one) {
        *q = _mm512_zextsi256_si512(lo);
        *d = _mm512_zextps256_ps512(_mm256_set1_ps(_cvtsh_ss(b[0].d)));
    } else {
        *q = _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                _mm256_loadu_si256((const __m256i *)b[1].qs), 1);
        *d = a512_pair_scales(b[0].d, b[1].d);
    }
}

A512_INLINE void a512_load_w_q4_0(const block_q4_0 *b, int one, __m512i *q, __m512 *d)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), off = _mm256_set1_epi8(8);
    __m128i b0 = _mm_loadu_si128((const __m128i *)b[0].qs);
    __m256i v0 = _mm256_set_m128i(_mm_srli_epi16(b0, 4), b0);
    v0 = _mm256_sub_epi8(_mm256_and_si256(v0, m4), off);
    if (one) {
        *q = _mm512_zextsi256_si512(v0);
        *d = _mm512_zextps256_ps512(_mm256_set1_ps(_cvtsh_ss(b[0].d)));
    } else {
        __m128i b1 = _mm_loadu_si128((const __m128i *)b[1].qs);
        __m256i v1 = _mm256_set_m128i(_mm_srli_epi16(b1, 4), b1);
        v1 = _mm256_sub_epi8(_mm256_and_si256(v1, m4), off);
        *q = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
        *d = a512_pair_scales(b[0].d, b[1].d);
    }
}

/* MXFP4: the codes looked up in the doubled E2M1 table (pshufb), the scale 2^(e - 128) */
A512_INLINE __m256i a512_mxfp4_codes(const block_mxfp4 *b)
{
    const __m128i tab = _mm_loadu_si128((const __m128i *)quant_kvalues_mxfp4), m4 = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)b->qs);
    return _mm256_set_m128i(_mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m4)),
                            _mm_shuffle_epi8(tab, _mm_and_si128(v, m4)));
}

A512_INLINE void a512_load_w_mxfp4(const block_mxfp4 *b, int one, __m512i *q, __m512 *d)
{
    __m256i v0 = a512_mxfp4_codes(b);
    if (one) {
        *q = _mm512_zextsi256_si512(v0);
        *d = _mm512_zextps256_ps512(_mm256_set1_ps(quant_e8m0_half(b[0].e)));
    } else {
        *q = _mm512_inserti64x4(_mm512_castsi256_si512(v0), a512_mxfp4_codes(b + 1), 1);
        *d = _mm512_insertf32x8(_mm512_set1_ps(quant_e8m0_half(b[0].e)), _mm256_set1_ps(quant_e8m0_half(b[1].e)), 1);
    }
}

#define A512_Q80_KERNEL(NAME, BLOCK, LOADW)                                                  \
    A512_INLINE void NAME(int R, int T, int64_t cols, const char *w, size_t ws,             \
                          const char *x, size_t xs, float *y, size_t ys)                    \
    {                                                                                       \
        const int64_t nb = cols / 32;                                                       \
        const float *xd[4];                                                                 \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) xd[t] =                         \
            (const float *)(x + (size_t)t * xs + cols);                                     \
        __m512 acc[4][4];                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps(); \
        const __m512i bias = _mm512_set1_epi8((char)0x80);                                  \
        for (int64_t b = 0; b < nb; b += 2) {                                               \
            int one = b + 1 >= nb;                                                          \
            __m512i wu[4];                                                                  \
            __m512 wd[4];                                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                           \
                __m512i wq;                                                                 \
                LOADW((const BLOCK *)(w + (size_t)r * ws) + b, one, &wq, &wd[r]);           \
                _mm_prefetch((const char *)((const BLOCK *)(w + (size_t)r * ws) + b) + A512_PF, _MM_HINT_T0); \
                wu[r] = _mm512_xor_si512(wq, bias);   /* w + 128, unsigned */                \
            }                                                                               \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                           \
                const uint8_t *xq = (const uint8_t *)(x + (size_t)t * xs) + b * 32;         \
                __m512i xv;                                                                 \
                __m512 dx;                                                                  \
                if (one) {                                                                  \
                    xv = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)xq));   \
                    dx = _mm512_set1_ps(xd[t][b]);                                          \
                } else {                                                                    \
                    xv = _mm512_loadu_si512(xq);                                            \
                    dx = _mm512_insertf32x8(_mm512_set1_ps(xd[t][b]),                       \
                                            _mm256_set1_ps(xd[t][b + 1]), 1);               \
                }                                                                           \
                const __m512i nc = _mm512_sub_epi32(_mm512_setzero_si512(),                 \
                                                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xv)); \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                       \
                    __m512i s = _mm512_dpbusd_epi32(nc, wu[r], xv);                         \
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),                      \
                                                _mm512_mul_ps(wd[r], dx), acc[r][t]);       \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)                             \
                y[(size_t)t * ys + r] = _mm512_reduce_add_ps(acc[r][t]);                    \
    }

A512_Q80_KERNEL(a512_tile_q8_0, block_q8_0, a512_load_w_q8_0)
A512_Q80_KERNEL(a512_tile_q4_0, block_q4_0, a512_load_w_q4_0)
A512_Q80_KERNEL(a512_tile_mxfp4, block_mxfp4, a512_load_w_mxfp4)

static void a512_gemm_q8_0(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                           size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_q8_0)
}

static void a512_gemm_q4_0(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                           size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_q4_0)
}

static void a512_gemm_mxfp4(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                            size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_mxfp4)
}

/* ---- repacked Q8_0 (block_q8_0x16) x Q8_0 ---------------------------------------------- */

/* Float ops that GCC must not contract into FMAs: the repacked kernels round exactly as the
 * scalar reference does (one lane per row, blocks summed in order), so their results are
 * bit-identical to it and to the original layout's reference. */
#define A512_MUL(a, b) _mm512_mul_round_ps(a, b, _MM_FROUND_CUR_DIRECTION)
#define A512_ADD(a, b) _mm512_add_round_ps(a, b, _MM_FROUND_CUR_DIRECTION)
#define A512_SUB(a, b) _mm512_sub_round_ps(a, b, _MM_FROUND_CUR_DIRECTION)

A512_INLINE __m512i a512_bcast32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* A 64-byte load that stays one: a plain load the compiler may fold into each instruction
 * that uses the vector (the two masks of a nibble vector each load the same 64 bytes again),
 * on the load ports that the activation broadcasts also need. A volatile access is performed
 * exactly once, as written (C11 5.1.2.3), so the vector is loaded into a register once. */
A512_INLINE __m512i a512_load_once(const void *p)
{
    return *(const volatile __m512i *)p;
}

enum { A512_X16_Q8_0, A512_X16_Q4_0, A512_X16_MXFP4 };   /* a512_x16_q80's kinds */

/* The 16 rows' MXFP4 block scales 2^(e - 128) from their exponents (quant_e8m0_half). */
A512_INLINE __m512 a512_e8m0_half16(const uint8_t *e)
{
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)e));
    __m512i bits = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
    __mmask16 sub = _mm512_cmplt_epu32_mask(v, _mm512_set1_epi32(2));
    bits = _mm512_mask_sllv_epi32(bits, sub, _mm512_set1_epi32(0x00200000), v);
    return _mm512_castsi512_ps(bits);
}

/* 16 rows x T tokens of Q8_0, Q4_0 or MXFP4 (block_q8_0x16, block_q4_0x16, block_mxfp4x16),
 * one int32 lane per row: per 32-column block, 8 vectors of 4 columns of the 16 rows (Q8_0:
 * stored plus 128; Q4_0 and MXFP4: 4 vectors whose low and high nibbles are 4 columns each,
 * unsigned 0..15 for Q4_0, looked up as the doubled E2M1 value plus 128 for MXFP4) times the
 * token's 4 activation bytes broadcast (vpdpbusd), started from the token's -128 (Q4_0: -8)
 * times the sum of the block, give every row's exact integer dot; then y += isum * (d_w * d_x)
 * per block in order, as the scalar reference. The weights stream once through the tile in
 * address order, which the hardware prefetcher follows, so there is no software prefetch here
 * (the measurement: docs/benchmarks.md, "Figures behind decisions in the code"). */
A512_INLINE void a512_x16_q80(int T, int kind, int64_t cols, const char *w, const char *x,
                              size_t xs, float *y, size_t ys)
{
    const int64_t np = cols / 64;
    const size_t psz = kind == A512_X16_Q8_0   ? sizeof(block_q8_0x16)
                       : kind == A512_X16_Q4_0 ? sizeof(block_q4_0x16)
                                               : sizeof(block_mxfp4x16);
    const size_t qoff = kind == A512_X16_MXFP4 ? offsetof(block_mxfp4x16, qs) : 64;
    const size_t hsz = kind == A512_X16_Q8_0 ? sizeof(((block_q8_0x16 *)0)->qs[0]) : sizeof(((block_q4_0x16 *)0)->qs[0]);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* MXFP4: the doubled E2M1 values plus 128, in each 128-bit lane for vpshufb */
    const __m512i tab = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)quant_kvalues_mxfp4)),
                                         _mm512_set1_epi8((char)0x80));
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xn[4];
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
        xq[t] = (const int8_t *)(x + (size_t)t * xs);
        xd[t] = (const float *)(xq[t] + cols);
        xn[t] = (const int32_t *)(xd[t] + cols / 32);
        acc[t] = _mm512_setzero_ps();
    }
    _Static_assert(offsetof(block_q8_0x16, qs) == 64 && offsetof(block_q4_0x16, qs) == 64,
                   "the scales fill the first 64 bytes");
    for (int64_t p = 0; p < np; p++) {
        const char *wp = w + (size_t)p * psz;
        const __m512i dh = kind == A512_X16_MXFP4 ? _mm512_setzero_si512() : _mm512_load_si512(wp);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const int64_t b = 2 * p + h;
            const char *qh = wp + qoff + h * hsz;
            __m512i s0[4], s1[4];
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                s0[t] = _mm512_set1_epi32(kind == A512_X16_Q4_0 ? xn[t][b] / 16 : xn[t][b]);
                s1[t] = _mm512_setzero_si512();
            }
            if (kind != A512_X16_Q8_0) {
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                    __m512i v = _mm512_loadu_si512(qh + 64 * k);
                    __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    if (kind == A512_X16_MXFP4) {
                        lo = _mm512_shuffle_epi8(tab, lo);
                        hi = _mm512_shuffle_epi8(tab, hi);
                    }
                    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                        s0[t] = _mm512_dpbusd_epi32(s0[t], lo, a512_bcast32(xq[t] + 32 * b + 4 * k));
                        s1[t] = _mm512_dpbusd_epi32(s1[t], hi, a512_bcast32(xq[t] + 32 * b + 16 + 4 * k));
                    }
                }
            } else {
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                    __m512i v = _mm512_load_si512(qh + 64 * k);
                    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                        __m512i xb = a512_bcast32(xq[t] + 32 * b + 4 * k);
                        if (k & 1) s1[t] = _mm512_dpbusd_epi32(s1[t], v, xb);
                        else s0[t] = _mm512_dpbusd_epi32(s0[t], v, xb);
                    }
                }
            }
            __m512 wd = kind == A512_X16_MXFP4
                            ? a512_e8m0_half16((const uint8_t *)wp + 16 * h)
                            : _mm512_cvtph_ps(h ? _mm512_extracti64x4_epi64(dh, 1) : _mm512_castsi512_si256(dh));
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0[t], s1[t]));
                acc[t] = A512_ADD(acc[t], A512_MUL(f, A512_MUL(wd, _mm512_set1_ps(xd[t][b]))));
            }
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* nr is a multiple of 16 (the driver's row chunks are); tokens in tiles of up to 4. */
A512_INLINE void a512_gemm_x16_q80(int kind, int64_t cols, const void *w, size_t ws, int nr,
                                   const void *x, size_t xs, int nt, float *y, size_t ys)
{
    for (int r0 = 0; r0 + 16 <= nr; r0 += 16) {
        const char *wg = (const char *)w + (size_t)r0 * ws;
        for (int t0 = 0; t0 < nt; t0 += 4) {
            const char *xt = (const char *)x + (size_t)t0 * xs;
            float *yt = y + (size_t)t0 * ys + r0;
            switch (nt - t0 < 4 ? nt - t0 : 4) {
            case 1: a512_x16_q80(1, kind, cols, wg, xt, xs, yt, ys); break;
            case 2: a512_x16_q80(2, kind, cols, wg, xt, xs, yt, ys); break;
            case 3: a512_x16_q80(3, kind, cols, wg, xt, xs, yt, ys); break;
            default: a512_x16_q80(4, kind, cols, wg, xt, xs, yt, ys); break;
            }
        }
    }
}

static void a512_gemm_q8_0x16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                              size_t xs, int nt, float *y, size_t ys)
{
    a512_gemm_x16_q80(A512_X16_Q8_0, cols, w, ws, nr, x, xs, nt, y, ys);
}

static void a512_gemm_q4_0x16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                              size_t xs, int nt, float *y, size_t ys)
{
    a512_gemm_x16_q80(A512_X16_Q4_0, cols, w, ws, nr, x, xs, nt, y, ys);
}

static void a512_gemm_mxfp4x16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                               size_t xs, int nt, float *y, size_t ys)
{
    a512_gemm_x16_q80(A512_X16_MXFP4, cols, w, ws, nr, x, xs, nt, y, ys);
}

/* ---- Q4_K / Q6_K weights x Q8_K activations ------------------------------------------- */

/* Unpacks the 6-bit scales and mins of a Q4_K block: 16 int16 [sc0..sc7, m0..m7]. */
A512_INLINE __m256i a512_q4_K_scales(const uint8_t *s)
{
    uint32_t u[4];
    memcpy(u, s, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    uint32_t ua = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = ua;
    u[0] &= k1;
    return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)u));
}

/* Q4_K (and with `five` Q5_K): tile of R rows x T tokens. Per 64-column chunk c (sub-blocks 2c,
 * 2c+1), the weight nibbles become 64 unsigned bytes (Q5_K: their fifth bit, bit 2c or 2c+1 of
 * qh, or'ed in as 16), vpmaddubsw with the activations gives int16 pairs, and vpdpwssd
 * multiplies by the sub-block scale while summing into int32. Per super-block:
 * y += d_x*d_w * isum - d_x*dmin_w * sum_j m_j * bsum_j. */
A512_INLINE void a512_tile_kmin(int R, int T, bool five, int64_t cols, const char *w, size_t ws,
                                const char *x, size_t xs, float *y, size_t ys)
{
    const int64_t nb = cols / QK_K;
    const size_t bsz = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t o_qs = five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const __m512i one = _mm512_set1_epi8(1);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* int16 lane i of chunk c takes scale 2c + i/16 */
    const __m512i idx0 = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i midx = _mm256_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9,
                                          8, 8);
    for (int64_t b = 0; b < nb; b++) {
        __m512i sc[4], qh[4];
        __m256i mr[4];
        float dw[4], dmw[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const block_q4_K *wb = (const block_q4_K *)(w + (size_t)r * ws + (size_t)b * bsz);
            if (five) qh[r] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const block_q5_K *)wb)->qh));
            __m256i s16 = a512_q4_K_scales(wb->scales);
            sc[r] = _mm512_castsi256_si512(s16);
            mr[r] = _mm256_permutexvar_epi16(midx, s16);
            dw[r] = _cvtsh_ss(wb->d);
            dmw[r] = _cvtsh_ss(wb->dmin);
        }
        __m512i isum[4][4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) isum[r][t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i q[4], s[4];
            __m512i idx = _mm512_add_epi16(idx0, _mm512_set1_epi16((short)(2 * c)));
            /* Q5_K: the low half takes bit 2c of qh, the high half bit 2c + 1 */
            const __m512i hsh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const char *wb = w + (size_t)r * ws + (size_t)b * bsz;
                _mm_prefetch(wb + 64 * c + A512_PF, _MM_HINT_T0);
                __m256i v = _mm256_loadu_si256((const __m256i *)(wb + o_qs + 32 * c));
                __m512i vv = _mm512_inserti64x4(_mm512_castsi256_si512(v),
                                                _mm256_srli_epi16(v, 4), 1);
                q[r] = _mm512_and_si512(vv, m4);
                if (five) {
                    __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh[r], hsh), one);
                    q[r] = _mm512_or_si512(q[r], _mm512_slli_epi16(hb, 4));
                }
                s[r] = _mm512_permutexvar_epi16(idx, sc[r]);
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                __m512i xv = _mm512_loadu_si512(xb->qs + 64 * c);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                    isum[r][t] = _mm512_dpwssd_epi32(isum[r][t], _mm512_maddubs_epi16(q[r], xv), s[r]);
            }
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
            __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                __m512 mins = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(_mm256_madd_epi16(bs, mr[r])));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]), _mm512_set1_ps(xb->d * dw[r]),
                                            acc[r][t]);
                acc[r][t] = _mm512_fnmadd_ps(mins, _mm512_set1_ps(xb->d * dmw[r]), acc[r][t]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            y[(size_t)t * ys + r] = _mm512_reduce_add_ps(acc[r][t]);
}

A512_INLINE void a512_tile_q4_K(int R, int T, int64_t cols, const char *w, size_t ws,
                                const char *x, size_t xs, float *y, size_t ys)
{
    a512_tile_kmin(R, T, false, cols, w, ws, x, xs, y, ys);
}

A512_INLINE void a512_tile_q5_K(int R, int T, int64_t cols, const char *w, size_t ws,
                                const char *x, size_t xs, float *y, size_t ys)
{
    a512_tile_kmin(R, T, true, cols, w, ws, x, xs, y, ys);
}

static void a512_gemm_q4_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                           size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_q4_K)
}

static void a512_gemm_q5_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                           size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_q5_K)
}

/* Q6_K: 6-bit unsigned q (0..63) with vpmaddubsw, scales per 16 columns with vpdpwssd; the
 * -32 offset is folded in as -32 * sum_g sc_g * bsum_g at the start of each super-block. */
A512_INLINE void a512_tile_q6_K(int R, int T, int64_t cols, const char *w, size_t ws,
                                const char *x, size_t xs, float *y, size_t ys)
{
    const int64_t nb = cols / QK_K;
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    /* int16 lane i of chunk c takes scale 4c + i/8 */
    const __m512i idx0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1,
                                          1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    /* qh shifts: chunk even takes bits 0-1 (low half) / 2-3 (high half), odd 4-5 / 6-7 */
    const __m512i sh_even = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i sh_odd = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    for (int64_t b = 0; b < nb; b++) {
        __m512i sc[4];
        float dw[4];
        __m512i isum[4][4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * ws) + b;
            __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb->scales));
            sc[r] = _mm512_castsi256_si512(s16);
            dw[r] = _cvtsh_ss(wb->d);
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), s16);
                isum[r][t] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(),
                                                                     _mm256_slli_epi32(m, 5)));
            }
        }
        for (int c = 0; c < 4; c++) {
            __m512i q[4], s[4];
            __m512i idx = _mm512_add_epi16(idx0, _mm512_set1_epi16((short)(4 * c)));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * ws) + b;
                _mm_prefetch((const char *)wb + 64 * c + A512_PF, _MM_HINT_T0);
                if (c == 3) _mm_prefetch((const char *)wb + 256 + A512_PF, _MM_HINT_T0);
                int h = c >> 1;
                __m512i ql = _mm512_loadu_si512(wb->ql + 64 * h);
                __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb->qh + 32 * h)));
                __m512i lo = (c & 1) ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4)
                                     : _mm512_and_si512(ql, m4);
                __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, (c & 1) ? sh_odd : sh_even), m3);
                q[r] = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
                s[r] = _mm512_permutexvar_epi16(idx, sc[r]);
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                __m512i xv = _mm512_loadu_si512(xb->qs + 64 * c);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                    isum[r][t] = _mm512_dpwssd_epi32(isum[r][t], _mm512_maddubs_epi16(q[r], xv), s[r]);
            }
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]),
                                            _mm512_set1_ps(xb->d * dw[r]), acc[r][t]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            y[(size_t)t * ys + r] = _mm512_reduce_add_ps(acc[r][t]);
}

static void a512_gemm_q6_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                           size_t xs, int nt, float *y, size_t ys)
{
    if (nt == 1) {
        A512_TILES(4, 1, a512_tile_q6_K)
    } else {
        A512_TILES(2, 4, a512_tile_q6_K)
    }
}

/* ---- repacked Q4_K / Q6_K (block_q4_Kx16, block_q6_Kx16) x Q8_K ------------------------ */

/* Software prefetch (PF) two structs ahead, only in the full tiles of a group that has more
 * than 4 tokens. Up to 4 tokens a tile reads each 16-row group once, as one ascending stream
 * that the hardware prefetcher follows into L2 by itself, and prefetching two of every three
 * Q6_K lines slowed one thread's stream from memory well below a plain read loop's (at any
 * distance, with any hint: most likely each prefetch holds one of the core's few L1 miss
 * buffers for a whole memory latency); without it Q6_K streams at the read loop's rate.
 * With more tiles only the first one reads the group from memory and the hardware
 * prefetcher, seeing no misses in the others, falls behind: there the prefetch, which then
 * mostly finds its lines in L1, pays (docs/benchmarks.md, "Figures behind decisions in the
 * code"). */

/* 16 rows x T tokens: one int32 lane per row. Per 64-column chunk c, each 64-byte vector of
 * weights holds 4 columns of every row in its low nibbles (sub-block 2c) and 4 in its high
 * nibbles (sub-block 2c+1); vpdpbusd against the token's 4 activation bytes broadcast sums
 * them per row, the sub-block scale multiplies the int32 sum (vpmulld). The high nibbles are
 * masked in place, not shifted down (16 times their value: at most 240 * 127 * 32 * 63 * 4 per
 * super-block, far inside int32), and their scaled sums are divided by 16 once per super-block,
 * exactly: two vector ops per weight load instead of three. Mins: vpdpwssd of the rows' min
 * pairs with the token's pair sums of bsums. */
A512_INLINE void a512_x16_q4_K(int T, bool PF, int64_t nb, const block_q4_Kx16 *w, const char *x,
                               size_t xs, float *y, size_t ys)
{
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), one16 = _mm512_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const block_q4_Kx16 *wb = w + b;
        const block_q8_K *xb[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            xb[t] = (const block_q8_K *)(x + (size_t)t * xs) + b;
        if (PF) _mm_prefetch((const char *)(wb + 2), _MM_HINT_T0);
        __m512i isum[4], isum16[4], imin[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            isum[t] = isum16[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            /* two chains per nibble half at one token (the dpbusd latency), one at more */
            __m512i dl[4][2], dh[4][2];
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                dl[t][0] = dl[t][1] = _mm512_setzero_si512();
                dh[t][0] = dh[t][1] = _mm512_setzero_si512();
            }
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                /* one load at one token, where the loads are the busiest ports; folded
                 * into both masks at more, where it saves an instruction */
                __m512i v = T == 1 ? a512_load_once(wb->qs[c][k]) : _mm512_load_si512(wb->qs[c][k]);
                /* high nibbles stay in place: 16 times the value, taken off after the scale */
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_andnot_si512(m4, v);
                const int ch = T == 1 ? k & 1 : 0;
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                    dl[t][ch] = _mm512_dpbusd_epi32(dl[t][ch], lo, a512_bcast32(xb[t]->qs + 64 * c + 4 * k));
                    dh[t][ch] = _mm512_dpbusd_epi32(dh[t][ch], hi, a512_bcast32(xb[t]->qs + 64 * c + 32 + 4 * k));
                }
            }
            __m512i sl = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)wb->sc[2 * c]));
            __m512i sh = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)wb->sc[2 * c + 1]));
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                __m512i l = T == 1 ? _mm512_add_epi32(dl[t][0], dl[t][1]) : dl[t][0];
                __m512i h = T == 1 ? _mm512_add_epi32(dh[t][0], dh[t][1]) : dh[t][0];
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(l, sl));
                isum16[t] = _mm512_add_epi32(isum16[t], _mm512_mullo_epi32(h, sh));
            }
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            isum[t] = _mm512_add_epi32(isum[t], _mm512_srai_epi32(isum16[t], 4));
        /* the token's 8 sub-block sums of bsums as int16, pair p = sub-blocks 2p, 2p+1 */
        __m512i bs2[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb[t]->bsums),
                                            _mm512_castsi512_si256(one16));
            bs2[t] = _mm512_castsi128_si512(
                _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1)));
            imin[t] = _mm512_setzero_si512();
        }
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            __m512i mp = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)wb->m[p]));
            __m512i ip = _mm512_set1_epi32(p);
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
                imin[t] = _mm512_dpwssd_epi32(imin[t], mp, _mm512_permutexvar_epi32(ip, bs2[t]));
        }
        __m512 wd = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)wb->d));
        __m512 wm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)wb->dmin));
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            __m512 dx = _mm512_set1_ps(xb[t]->d);
            __m512 d = A512_MUL(dx, wd), dm = A512_MUL(dx, wm);
            acc[t] = A512_ADD(acc[t], A512_SUB(A512_MUL(d, _mm512_cvtepi32_ps(isum[t])),
                                               A512_MUL(dm, _mm512_cvtepi32_ps(imin[t]))));
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* 16 rows x T tokens of Q6_K: per group of 16 columns, the three 64-byte planes give the
 * four 6-bit units (see block_q6_Kx16), vpdpbusd sums q * x per row with q unsigned, the
 * group's scale multiplies that; the -32 offset is subtracted once per super-block as
 * 32 * sum_g sc_g * bsum_g (vpdpwssd of the rows' scale pairs with the token's bsum pairs). */
A512_INLINE void a512_x16_q6_K(int T, bool PF, int64_t nb, const block_q6_Kx16 *w, const char *x,
                               size_t xs, float *y, size_t ys)
{
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m6 = _mm512_set1_epi8(0x3F), k03 = _mm512_set1_epi8(0x03),
                  k0f = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const block_q6_Kx16 *wb = w + b;
        const block_q8_K *xb[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            xb[t] = (const block_q8_K *)(x + (size_t)t * xs) + b;
        __m512i isum[4], corr[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            isum[t] = _mm512_setzero_si512();
            corr[t] = _mm512_setzero_si512();
        }
        for (int p = 0; p < 8; p++) {
            __m512i sp = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)wb->sc[p]));
            __m512i se = _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
            __m512i so = _mm512_srai_epi32(sp, 16);
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
                corr[t] = _mm512_dpwssd_epi32(corr[t], sp,
                                              a512_bcast32((const int8_t *)(xb[t]->bsums + 2 * p)));
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                int g = 2 * p + h;
                if (PF) {
                    _mm_prefetch((const char *)wb->q[g] + 2 * sizeof *wb, _MM_HINT_T0);
                    _mm_prefetch((const char *)wb->q[g] + 2 * sizeof *wb + 128, _MM_HINT_T0);
                }
                __m512i P = _mm512_load_si512(wb->q[g][0]), Q = _mm512_load_si512(wb->q[g][1]),
                        R = _mm512_load_si512(wb->q[g][2]);
                __m512i ua = _mm512_and_si512(P, m6), ub = _mm512_and_si512(Q, m6),
                        uc = _mm512_and_si512(R, m6);
                /* unit 3: bits 6-7 of P, Q, R; select (imm 0xE4: C ? A : B) by bit masks */
                __m512i t01 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(P, 6),
                                                        _mm512_srli_epi16(Q, 4), k03, 0xE4);
                __m512i ud = _mm512_and_si512(
                    _mm512_ternarylogic_epi32(t01, _mm512_srli_epi16(R, 2), k0f, 0xE4), m6);
                __m512i sg = h ? so : se;
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                    const int8_t *xq = xb[t]->qs + 16 * g;
                    __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ua, a512_bcast32(xq));
                    d = _mm512_dpbusd_epi32(d, ub, a512_bcast32(xq + 4));
                    d = _mm512_dpbusd_epi32(d, uc, a512_bcast32(xq + 8));
                    d = _mm512_dpbusd_epi32(d, ud, a512_bcast32(xq + 12));
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(d, sg));
                }
            }
        }
        __m512 wd = _mm512_load_ps(wb->d);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            __m512i is = _mm512_sub_epi32(isum[t], _mm512_slli_epi32(corr[t], 5));
            acc[t] = A512_ADD(acc[t], A512_MUL(A512_MUL(_mm512_set1_ps(xb[t]->d), wd),
                                               _mm512_cvtepi32_ps(is)));
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* nr is a multiple of 16 (the driver's row chunks are); tokens in tiles of up to 4.
 * Software prefetch (PF) only where a group has more than one full tile: see below. */
#define A512_X16_GEMM(NAME, KERNEL, BLOCK)                                                   \
    static void NAME(int64_t cols, const void *w, size_t ws, int nr, const void *x,          \
                     size_t xs, int nt, float *y, size_t ys)                                 \
    {                                                                                        \
        const int64_t nb = cols / QK_K;                                                      \
        for (int r0 = 0; r0 + 16 <= nr; r0 += 16) {                                          \
            const BLOCK *wg = (const BLOCK *)((const char *)w + (size_t)r0 * ws);            \
            for (int t0 = 0; t0 < nt; t0 += 4) {                                             \
                const char *xt = (const char *)x + (size_t)t0 * xs;                          \
                float *yt = y + (size_t)t0 * ys + r0;                                        \
                switch (nt - t0 < 4 ? nt - t0 : 4) {                                         \
                case 1: KERNEL(1, false, nb, wg, xt, xs, yt, ys); break;                     \
                case 2: KERNEL(2, false, nb, wg, xt, xs, yt, ys); break;                     \
                case 3: KERNEL(3, false, nb, wg, xt, xs, yt, ys); break;                     \
                default:                                                                     \
                    if (nt > 4) KERNEL(4, true, nb, wg, xt, xs, yt, ys);                     \
                    else KERNEL(4, false, nb, wg, xt, xs, yt, ys);                           \
                    break;                                                                   \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }
A512_X16_GEMM(a512_gemm_q4_Kx16, a512_x16_q4_K, block_q4_Kx16)
A512_X16_GEMM(a512_gemm_q6_Kx16, a512_x16_q6_K, block_q6_Kx16)

/* ---- the batch kernels of ops_kblk.h: shared pieces --------------------------------- */

/* The activation bytes x negated where the signed weight byte s is negative: what vpsignb
 * does for the AVX2 level (AVX-512 has none), -128 wrapping alike, so that vpdpbusd /
 * vpmaddubsw can take |s| as the unsigned side. */
A512_INLINE __m512i a512_kblk_sign(__m512i x, __m512i s)
{
    return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(s), _mm512_setzero_si512(), x);
}

/* A per-row dot `float NAME(cols, w, x)` from entry I of TABLE, the AVX2 level's gemm for the
 * type (ops_kernels_init_avx512 keeps it there), run for one row and one token. */
#define A512_ROW_DOT(NAME, TABLE, I, XT)                                                        \
    static float NAME(int64_t cols, const void *w, const XT *x)                                \
    {                                                                                          \
        float y;                                                                               \
        TABLE[I](cols, w, 0, 1, x, 0, 1, &y, 0);                                               \
        return y;                                                                              \
    }

/* ---- Q2_K / Q3_K / IQ4_XS x Q8_K for batches (ops_kblk.h) ------------------------------ */

/* The AVX2 level's per-row dots serve one token (a decode step) and the rows past the last
 * group of 4 here too: ops_kernels_init_avx512 keeps its gemm entries, and these call them.
 * The batch dot below gives the same integer sums and float chain as those, so the results
 * are bit-identical (test_ops' batch invariance). */
static ops_gemm_fn a512_kblk_row_gemm[3]; /* the AVX2 gemms: Q2_K, Q3_K, IQ4_XS */

A512_ROW_DOT(a512_row_dot_q2_K, a512_kblk_row_gemm, 0, block_q8_K)
A512_ROW_DOT(a512_row_dot_q3_K, a512_kblk_row_gemm, 1, block_q8_K)
A512_ROW_DOT(a512_row_dot_iq4_xs, a512_kblk_row_gemm, 2, block_q8_K)

/* One token's super-block xb against the 4 unpacked rows of k, added to the token's y[0..3]:
 * ops_avx2.c's a2_kblk_dot with 64-byte vectors. vpmaddubsw of unsigned weights (IQ4_XS: |v|,
 * the activations negated where v < 0, as vpsignb would) then vpdpwssd with the sub-block
 * scales: the same exact integer sums, then the same float chain (ops_kblk_finish). */
A512_INLINE void a512_kblk_dot(const ops_kblk *k, qtype t, const block_q8_K *xb, float *y)
{
    __m512i acc[OPS_KBLK_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK_ROWS; r++) acc[r] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8") for (int j = 0; j < 4; j++) {
        __m512i xv = _mm512_loadu_si512(xb->qs + 64 * j);
        _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK_ROWS; r++) {
            __m512i u = _mm512_loadu_si512(&k->u[r][2 * j]), xs = xv;
            if (t == QTYPE_IQ4_XS) xs = a512_kblk_sign(xv, _mm512_loadu_si512(&k->v[r][2 * j]));
            acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(u, xs), _mm512_loadu_si512(&k->sc[r][2 * j]));
        }
    }
    __m256i a[OPS_KBLK_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK_ROWS; r++)
        a[r] = _mm256_add_epi32(_mm512_castsi512_si256(acc[r]), _mm512_extracti64x4_epi64(acc[r], 1));
    ops_kblk_finish(k, t, xb, a, y);
}

#define A512_GEMM_KBLK(name, i, rowdot, t)                                                      \
    static void name(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs,  \
                     int nt, float *y, size_t ys)                                              \
    {                                                                                          \
        if (nt == 1) a512_kblk_row_gemm[i](cols, w, ws, nr, x, xs, nt, y, ys);                 \
        else ops_kblk_gemm(t, a512_kblk_dot, rowdot, cols, w, ws, nr, x, xs, nt, y, ys);       \
    }
A512_GEMM_KBLK(a512_gemm_q2_K, 0, a512_row_dot_q2_K, QTYPE_Q2_K)
A512_GEMM_KBLK(a512_gemm_q3_K, 1, a512_row_dot_q3_K, QTYPE_Q3_K)
A512_GEMM_KBLK(a512_gemm_iq4_xs, 2, a512_row_dot_iq4_xs, QTYPE_IQ4_XS)

/* ---- Q4_1 / Q5_0 / Q5_1 / IQ4_NL x Q8_1 for batches (ops_kblk.h's ops_kblk32_gemm) ------- */

/* As above: one token (and the rows past the last group of 8) takes the AVX2 level's per-row
 * dot, whose integer sums and float chain the batch path repeats. */
static ops_gemm_fn a512_kblk32_row_gemm[4]; /* the AVX2 gemms: Q4_1, Q5_0, Q5_1, IQ4_NL */

A512_ROW_DOT(a512_row_dot_q4_1, a512_kblk32_row_gemm, 0, block_q8_1)
A512_ROW_DOT(a512_row_dot_q5_0, a512_kblk32_row_gemm, 1, block_q8_1)
A512_ROW_DOT(a512_row_dot_q5_1, a512_kblk32_row_gemm, 2, block_q8_1)
A512_ROW_DOT(a512_row_dot_iq4_nl, a512_kblk32_row_gemm, 3, block_q8_1)

/* Token block xb against block slot j of the 8 unpacked rows of k, two rows per zmm (a
 * block's rows are contiguous) against the token's 32 bytes in both halves: vpdpbusd of the
 * unsigned weight bytes (Q5_0 / IQ4_NL: |v|, the activations negated where v < 0), exact
 * int32 sums, one lane per row after the reduction. */
A512_INLINE __m256i a512_kblk32_dot(const ops_kblk32 *k, qtype t, int j, const block_q8_1 *xb)
{
    const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->qs));
    __m256i a[OPS_KBLK32_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK32_ROWS; r += 2) {
        __m512i xs = xv;
        if (t == QTYPE_Q5_0 || t == QTYPE_IQ4_NL) xs = a512_kblk_sign(xv, _mm512_load_si512(k->v[j][r]));
        __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(k->u[j][r]), xs);
        a[r] = _mm512_castsi512_si256(acc);
        a[r + 1] = _mm512_extracti64x4_epi64(acc, 1);
    }
    return ops_kblk_hsum8_i32(a);
}

#define A512_GEMM_KBLK32(name, i, rowdot, t)                                                    \
    static void name(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs,  \
                     int nt, float *y, size_t ys)                                              \
    {                                                                                          \
        if (nt == 1) a512_kblk32_row_gemm[i](cols, w, ws, nr, x, xs, nt, y, ys);               \
        else ops_kblk32_gemm(t, a512_kblk32_dot, rowdot, cols, w, ws, nr, x, xs, nt, y, ys);   \
    }
A512_GEMM_KBLK32(a512_gemm_q4_1, 0, a512_row_dot_q4_1, QTYPE_Q4_1)
A512_GEMM_KBLK32(a512_gemm_q5_0, 1, a512_row_dot_q5_0, QTYPE_Q5_0)
A512_GEMM_KBLK32(a512_gemm_q5_1, 2, a512_row_dot_q5_1, QTYPE_Q5_1)
A512_GEMM_KBLK32(a512_gemm_iq4_nl, 3, a512_row_dot_iq4_nl, QTYPE_IQ4_NL)

/* ---- float weights -------------------------------------------------------------------- */

A512_INLINE __m512 a512_load_f32(const void *p, int64_t i, __mmask16 k)
{
    return _mm512_maskz_loadu_ps(k, (const float *)p + i);
}
A512_INLINE __m512 a512_load_bf16(const void *p, int64_t i, __mmask16 k)
{
    __m256i h = _mm256_maskz_loadu_epi16(k, (const bf16_t *)p + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define A512_FLOAT_KERNEL(NAME, LOAD)                                                        \
    A512_INLINE void NAME(int R, int T, int64_t cols, const char *w, size_t ws,             \
                          const char *x, size_t xs, float *y, size_t ys)                    \
    {                                                                                       \
        __m512 acc[4][4];                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps(); \
        for (int64_t i = 0; i < cols; i += 16) {                                            \
            __mmask16 k = cols - i >= 16 ? (__mmask16)0xFFFF                                \
                                         : (__mmask16)((1u << (cols - i)) - 1);             \
            __m512 wv[4];                                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                           \
                wv[r] = LOAD(w + (size_t)r * ws, i, k);                                     \
                _mm_prefetch(w + (size_t)r * ws + i * (int64_t)sizeof(fp16_t) * 2 + A512_PF, _MM_HINT_T0); \
            }                                                                               \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                           \
                __m512 xv = LOAD(x + (size_t)t * xs, i, k);                                 \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][t] =             \
                    _mm512_fmadd_ps(wv[r], xv, acc[r][t]);                                  \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)                             \
                y[(size_t)t * ys + r] = _mm512_reduce_add_ps(acc[r][t]);                    \
    }

A512_FLOAT_KERNEL(a512_tile_f32, a512_load_f32)
A512_FLOAT_KERNEL(a512_tile_f16, a512_load_f16)
A512_FLOAT_KERNEL(a512_tile_bf16, a512_load_bf16)

static void a512_gemm_f32(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                          size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_f32)
}
static void a512_gemm_f16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                          size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_f16)
}
static void a512_gemm_bf16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                           size_t xs, int nt, float *y, size_t ys)
{
    A512_TILES(4, 4, a512_tile_bf16)
}

void ops_kernels_init_avx512(ops_kernels *k)
{
    a512_kblk_row_gemm[0] = k->gemm[QTYPE_Q2_K];
    a512_kblk_row_gemm[1] = k->gemm[QTYPE_Q3_K];
    a512_kblk_row_gemm[2] = k->gemm[QTYPE_IQ4_XS];
    k->gemm[QTYPE_Q2_K] = a512_gemm_q2_K;
    k->gemm[QTYPE_Q3_K] = a512_gemm_q3_K;
    k->gemm[QTYPE_IQ4_XS] = a512_gemm_iq4_xs;
    a512_kblk32_row_gemm[0] = k->gemm[QTYPE_Q4_1];
    a512_kblk32_row_gemm[1] = k->gemm[QTYPE_Q5_0];
    a512_kblk32_row_gemm[2] = k->gemm[QTYPE_Q5_1];
    a512_kblk32_row_gemm[3] = k->gemm[QTYPE_IQ4_NL];
    k->gemm[QTYPE_Q4_1] = a512_gemm_q4_1;
    k->gemm[QTYPE_Q5_0] = a512_gemm_q5_0;
    k->gemm[QTYPE_Q5_1] = a512_gemm_q5_1;
    k->gemm[QTYPE_IQ4_NL] = a512_gemm_iq4_nl;
    k->quant_q8_0 = a512_quant_q8_0;
    k->gemm[QTYPE_Q8_0] = a512_gemm_q8_0;
    k->gemm[QTYPE_Q4_0] = a512_gemm_q4_0;
    k->gemm[QTYPE_MXFP4] = a512_gemm_mxfp4;
    k->quant_q8_K = a512_quant_q8_K;
    k->gemm[QTYPE_Q4_K] = a512_gemm_q4_K;
    k->gemm[QTYPE_Q5_K] = a512_gemm_q5_K;
    k->gemm[QTYPE_Q6_K] = a512_gemm_q6_K;
    k->gemm[QTYPE_Q8_0_X16] = a512_gemm_q8_0x16;
    k->gemm[QTYPE_Q4_0_X16] = a512_gemm_q4_0x16;
    k->gemm[QTYPE_MXFP4_X16] = a512_gemm_mxfp4x16;
    k->gemm[QTYPE_Q4_K_X16] = a512_gemm_q4_Kx16;
    k->gemm[QTYPE_Q6_K_X16] = a512_gemm_q6_Kx16;
    k->gemm[QTYPE_F32] = a512_gemm_f32;
    k->gemm[QTYPE_F16] = a512_gemm_f16;
    k->gemm[QTYPE_BF16] = a512_gemm_bf16;
    k->to_f16 = a512_to_f16;
    k->from_f16 = a512_from_f16;
    k->to_bf16 = a512_to_bf16;
    k->act_row_bytes = a512_act_row_bytes;
    ops_vec_init_avx512(k);
    ops_iq_init_avx512(k);
}
