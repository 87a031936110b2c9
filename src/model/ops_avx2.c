/*
 * ops_avx2: AVX2 + FMA + F16C kernels (see ops_int.h for the table they fill).
 *
 * Same structure as ops_avx512.c with 8-float / 32-byte vectors and only 16 registers, so
 * the R x T tiles are smaller (at most 3 x 3). Without VNNI the integer dots use ggml's
 * AVX2 recipe: vpmaddubsw on |w| and sign(x, w) (no int16 overflow: 2*127*127 < 32768),
 * then vpmaddwd with ones or with the sub-block scales. Activations stay in the scalar
 * formats (block_q8_0 / block_q8_K rows, and the scalar level's block_q8_1 rows), quantised
 * with the same rounding.
 */
#include "model/ops_int.h"
#include "model/ops_kblk.h"

#include <immintrin.h>
#include <stddef.h>
#include <math.h>
#include <string.h>

#define A2_INLINE static inline __attribute__((always_inline))
#define A2_PF 1024 /* weight prefetch distance, bytes ahead in the row */

A2_INLINE float a2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

A2_INLINE float a2_hmax(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

A2_INLINE int a2_hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Packs 4 x 8 int32 (saturating) into 32 int8 in order. */
A2_INLINE __m256i a2_pack_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    __m256i a = _mm256_packs_epi32(i0, i1), b = _mm256_packs_epi32(i2, i3);
    __m256i c = _mm256_packs_epi16(a, b);
    return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* ---- activation quantisers (scalar formats) ------------------------------------------- */

static void a2_quant_q8_0(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    block_q8_0 *y = dst;
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    (void)cols;
    for (int64_t b = e0 / 32; b < e1 / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_andnot_ps(signbit, v0), _mm256_andnot_ps(signbit, v1));
        m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(signbit, v2), _mm256_andnot_ps(signbit, v3)));
        float amax = a2_hmax(m);
        y[b].d = _cvtss_sh(amax / 127.f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        __m256i q = a2_pack_i8(_mm256_cvtps_epi32(_mm256_mul_ps(v0, id)),
                               _mm256_cvtps_epi32(_mm256_mul_ps(v1, id)),
                               _mm256_cvtps_epi32(_mm256_mul_ps(v2, id)),
                               _mm256_cvtps_epi32(_mm256_mul_ps(v3, id)));
        _mm256_storeu_si256((__m256i *)y[b].qs, q);
    }
}

static void a2_quant_q8_K(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    block_q8_K *y = dst;
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    (void)cols;
    x += e0 / QK_K * QK_K;
    for (int64_t i = e0 / QK_K; i < e1 / QK_K; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, _mm256_loadu_ps(x + j)));
        float amax = a2_hmax(m);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        float iscale = -127.f / max;
        __m256 vs = _mm256_set1_ps(iscale);
        const __m256i cap = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++)
                v[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vs)), cap);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), a2_pack_i8(v[0], v[1], v[2], v[3]));
            y[i].bsums[j / 16] = (int16_t)a2_hsum_i32(_mm256_add_epi32(v[0], v[1]));
            y[i].bsums[j / 16 + 1] = (int16_t)a2_hsum_i32(_mm256_add_epi32(v[2], v[3]));
        }
        y[i].d = 1 / iscale;
    }
}

static void a2_to_f16(const float *x, fp16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

static void a2_from_f16(const fp16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = _cvtsh_ss(x[i]);
}

/* ---- tile dispatch -------------------------------------------------------------------- */

#define A2_TILES(RMAX, TMAX, KERNEL)                                                       \
    for (int r0 = 0; r0 < nr; r0 += RMAX) {                                                \
        int rr = nr - r0 < RMAX ? nr - r0 : RMAX;                                          \
        for (int t0 = 0; t0 < nt; t0 += TMAX) {                                            \
            int tt = nt - t0 < TMAX ? nt - t0 : TMAX;                                      \
            switch (rr * 8 + tt) {                                                         \
            A2_CASE(KERNEL, 1, 1) A2_CASE(KERNEL, 1, 2) A2_CASE(KERNEL, 1, 3)              \
            A2_CASE(KERNEL, 2, 1) A2_CASE(KERNEL, 2, 2) A2_CASE(KERNEL, 2, 3)              \
            A2_CASE(KERNEL, 3, 1) A2_CASE(KERNEL, 3, 2) A2_CASE(KERNEL, 3, 3)              \
            default: break;                                                                \
            }                                                                              \
        }                                                                                  \
    }
#define A2_CASE(KERNEL, R, T)                                                              \
    case R * 8 + T:                                                                        \
        if (R <= RMAX_ && T <= TMAX_)                                                      \
            KERNEL(R <= RMAX_ ? R : 1, T <= TMAX_ ? T : 1, cols,                           \
                   (const char *)w + (size_t)r0 * ws, ws, (const char *)x + (size_t)t0 * xs, \
                   xs, y + (size_t)t0 * ys + r0, ys);                                      \
        break;

/* ---- Q8_0 / Q4_0 / MXFP4 weights x Q8_0 activations ----------------------------------- */

A2_INLINE __m256i a2_w_q8_0(const void *b)
{
    return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)b)->qs);
}
A2_INLINE __m256i a2_w_q4_0(const void *b)
{
    __m128i v = _mm_loadu_si128((const __m128i *)((const block_q4_0 *)b)->qs);
    __m256i q = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_sub_epi8(_mm256_and_si256(q, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

/* MXFP4: the codes looked up in the doubled E2M1 table (pshufb), low nibbles first */
A2_INLINE __m256i a2_w_mxfp4(const void *b)
{
    const __m128i tab = _mm_loadu_si128((const __m128i *)quant_kvalues_mxfp4), m4 = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)((const block_mxfp4 *)b)->qs);
    return _mm256_set_m128i(_mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m4)),
                            _mm_shuffle_epi8(tab, _mm_and_si128(v, m4)));
}
#define A2_D_F16(wb) _cvtsh_ss((wb)->d)
#define A2_D_E8M0(wb) quant_e8m0_half((wb)->e)

#define A2_Q80_KERNEL(NAME, BLOCK, LOADW, SCALEW)                                                 \
    A2_INLINE void NAME(int R, int T, int64_t cols, const char *w, size_t ws, const char *x, \
                        size_t xs, float *y, size_t ys)                                     \
    {                                                                                       \
        const int64_t nb = cols / 32;                                                       \
        __m256 acc[3][3];                                                                   \
        _Pragma("GCC unroll 3") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps(); \
        const __m256i ones = _mm256_set1_epi16(1);                                          \
        for (int64_t b = 0; b < nb; b++) {                                                  \
            __m256i wq[3], aw[3];                                                           \
            float dw[3];                                                                    \
            _Pragma("GCC unroll 3") for (int r = 0; r < R; r++) {                           \
                const BLOCK *wb = (const BLOCK *)(w + (size_t)r * ws) + b;                  \
                _mm_prefetch((const char *)wb + A2_PF, _MM_HINT_T0);                        \
                wq[r] = LOADW(wb);                                                          \
                aw[r] = _mm256_sign_epi8(wq[r], wq[r]);                                     \
                dw[r] = SCALEW(wb);                                                         \
            }                                                                               \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) {                           \
                const block_q8_0 *xb = (const block_q8_0 *)(x + (size_t)t * xs) + b;        \
                __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);                   \
                float dx = _cvtsh_ss(xb->d);                                                \
                _Pragma("GCC unroll 3") for (int r = 0; r < R; r++) {                       \
                    __m256i p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wq[r]));   \
                    __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));              \
                    acc[r][t] = _mm256_fmadd_ps(f, _mm256_set1_ps(dw[r] * dx), acc[r][t]);  \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 3") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                             \
                y[(size_t)t * ys + r] = a2_hsum(acc[r][t]);                                 \
    }

A2_Q80_KERNEL(a2_tile_q8_0, block_q8_0, a2_w_q8_0, A2_D_F16)
A2_Q80_KERNEL(a2_tile_q4_0, block_q4_0, a2_w_q4_0, A2_D_F16)
A2_Q80_KERNEL(a2_tile_mxfp4, block_mxfp4, a2_w_mxfp4, A2_D_E8M0)

#define RMAX_ 3
#define TMAX_ 3
static void a2_gemm_q8_0(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(3, 3, a2_tile_q8_0)
}
static void a2_gemm_q4_0(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(3, 3, a2_tile_q4_0)
}
static void a2_gemm_mxfp4(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                          size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(3, 3, a2_tile_mxfp4)
}
#undef RMAX_
#undef TMAX_

/* ---- Q4_K / Q6_K weights x Q8_K activations ------------------------------------------- */

A2_INLINE void a2_q4_K_scales(const uint8_t *s, uint8_t out[16])
{
    uint32_t u[4];
    memcpy(u, s, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    uint32_t ua = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = ua;
    u[0] &= k1;
    memcpy(out, u, 16);
}

/* Q4_K, and with `five` Q5_K: the same block prefix (d, dmin, scales), 4-bit values in qs, and
 * for Q5_K their fifth bit in qh (bit j of byte l: column 32j + l), or'ed in per sub-block. */
A2_INLINE void a2_tile_kmin(int R, int T, bool five, int64_t cols, const char *w, size_t ws, const char *x,
                            size_t xs, float *y, size_t ys)
{
    const int64_t nb = cols / QK_K;
    const size_t bsz = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t o_qs = five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const __m256i one = _mm256_set1_epi8(1);
    __m256 acc[2][2];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sm[2][16];
        __m256i isum[2][2], qh[2];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            const block_q4_K *wb = (const block_q4_K *)(w + (size_t)r * ws + (size_t)b * bsz);
            a2_q4_K_scales(wb->scales, sm[r]);
            if (five) qh[r] = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)wb)->qh);
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) isum[r][t] = _mm256_setzero_si256();
        }
        for (int j = 0; j < 8; j++) {
            __m256i q[2], sc[2];
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                const char *wb = w + (size_t)r * ws + (size_t)b * bsz;
                if (!(j & 1)) _mm_prefetch(wb + 32 * j + A2_PF, _MM_HINT_T0);
                __m256i v = _mm256_loadu_si256((const __m256i *)(wb + o_qs + 32 * (j >> 1)));
                q[r] = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v, 4) : v, m4);
                if (five) {
                    __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh[r], _mm_cvtsi32_si128(j)), one);
                    q[r] = _mm256_or_si256(q[r], _mm256_slli_epi16(hb, 4));
                }
                sc[r] = _mm256_set1_epi16(sm[r][j]);
            }
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * j));
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                    isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], xv), sc[r]));
            }
        }
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            const block_q4_K *wb = (const block_q4_K *)(w + (size_t)r * ws + (size_t)b * bsz);
            float dw = _cvtsh_ss(wb->d), dmw = _cvtsh_ss(wb->dmin);
            __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm[r] + 8)));
            /* m_j for bsums 2j and 2j+1 */
            __m256i mrep = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
                _mm_loadl_epi64((const __m128i *)(sm[r] + 8)),
                _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
            (void)m8;
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), mrep);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(xb->d * dw), acc[r][t]);
                acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(xb->d * dmw), acc[r][t]);
            }
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++)
            y[(size_t)t * ys + r] = a2_hsum(acc[r][t]);
}

A2_INLINE void a2_tile_q4_K(int R, int T, int64_t cols, const char *w, size_t ws, const char *x,
                            size_t xs, float *y, size_t ys)
{
    a2_tile_kmin(R, T, false, cols, w, ws, x, xs, y, ys);
}

A2_INLINE void a2_tile_q5_K(int R, int T, int64_t cols, const char *w, size_t ws, const char *x,
                            size_t xs, float *y, size_t ys)
{
    a2_tile_kmin(R, T, true, cols, w, ws, x, xs, y, ys);
}

A2_INLINE void a2_tile_q6_K(int R, int T, int64_t cols, const char *w, size_t ws, const char *x,
                            size_t xs, float *y, size_t ys)
{
    const int64_t nb = cols / QK_K;
    __m256 acc[2][2];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++) {
        __m256i isum[2][2];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * ws) + b;
            __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb->scales));
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), s16);
                isum[r][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(m, 5));
            }
        }
        for (int k = 0; k < 8; k++) {
            int h = k >> 2, qq = k & 3;
            __m256i q[2], sc[2];
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * ws) + b;
                _mm_prefetch((const char *)wb + 26 * k + A2_PF, _MM_HINT_T0);
                __m256i ql = _mm256_loadu_si256((const __m256i *)(wb->ql + 64 * h + 32 * (qq & 1)));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(wb->qh + 32 * h));
                __m256i lo = _mm256_and_si256(qq >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
                __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * qq)), m3);
                q[r] = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
                sc[r] = _mm256_set_m128i(_mm_set1_epi16(wb->scales[2 * k + 1]), _mm_set1_epi16(wb->scales[2 * k]));
            }
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * k));
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                    isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], xv), sc[r]));
            }
        }
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            float dw = _cvtsh_ss(((const block_q6_K *)(w + (size_t)r * ws) + b)->d);
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(xb->d * dw), acc[r][t]);
            }
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++)
            y[(size_t)t * ys + r] = a2_hsum(acc[r][t]);
}

#define RMAX_ 2
#define TMAX_ 2
static void a2_gemm_q4_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(2, 2, a2_tile_q4_K)
}
static void a2_gemm_q5_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(2, 2, a2_tile_q5_K)
}
static void a2_gemm_q6_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(2, 2, a2_tile_q6_K)
}
#undef RMAX_
#undef TMAX_

/* ---- float weights -------------------------------------------------------------------- */

A2_INLINE __m256 a2_load_f32(const void *p, int64_t i) { return _mm256_loadu_ps((const float *)p + i); }
A2_INLINE __m256 a2_load_f16(const void *p, int64_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const fp16_t *)p + i)));
}
A2_INLINE __m256 a2_load_bf16(const void *p, int64_t i)
{
    __m128i h = _mm_loadu_si128((const __m128i *)((const bf16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
A2_INLINE float a2_s_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
A2_INLINE float a2_s_f16(const void *p, int64_t i) { return _cvtsh_ss(((const fp16_t *)p)[i]); }
A2_INLINE float a2_s_bf16(const void *p, int64_t i) { return quant_bf16_to_fp32(((const bf16_t *)p)[i]); }

#define A2_FLOAT_KERNEL(NAME, LOAD, SCALAR)                                                 \
    A2_INLINE void NAME(int R, int T, int64_t cols, const char *w, size_t ws, const char *x, \
                        size_t xs, float *y, size_t ys)                                     \
    {                                                                                       \
        __m256 acc[3][3];                                                                   \
        _Pragma("GCC unroll 3") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps(); \
        int64_t i = 0;                                                                      \
        for (; i + 8 <= cols; i += 8) {                                                     \
            __m256 wv[3];                                                                   \
            _Pragma("GCC unroll 3") for (int r = 0; r < R; r++) {                           \
                wv[r] = LOAD(w + (size_t)r * ws, i);                                        \
                _mm_prefetch(w + (size_t)r * ws + i * 4 + A2_PF, _MM_HINT_T0);              \
            }                                                                               \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) {                           \
                __m256 xv = LOAD(x + (size_t)t * xs, i);                                    \
                _Pragma("GCC unroll 3") for (int r = 0; r < R; r++) acc[r][t] =             \
                    _mm256_fmadd_ps(wv[r], xv, acc[r][t]);                                  \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 3") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) {                           \
                float s = a2_hsum(acc[r][t]);                                               \
                for (int64_t j = i; j < cols; j++)                                          \
                    s += SCALAR(w + (size_t)r * ws, j) * SCALAR(x + (size_t)t * xs, j);     \
                y[(size_t)t * ys + r] = s;                                                  \
            }                                                                               \
    }

A2_FLOAT_KERNEL(a2_tile_f32, a2_load_f32, a2_s_f32)
A2_FLOAT_KERNEL(a2_tile_f16, a2_load_f16, a2_s_f16)
A2_FLOAT_KERNEL(a2_tile_bf16, a2_load_bf16, a2_s_bf16)

#define RMAX_ 3
#define TMAX_ 3
static void a2_gemm_f32(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                        size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(3, 3, a2_tile_f32)
}
static void a2_gemm_f16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                        size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(3, 3, a2_tile_f16)
}
static void a2_gemm_bf16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    A2_TILES(3, 3, a2_tile_bf16)
}
#undef RMAX_
#undef TMAX_

/* ---- vector helpers and elementwise ops ----------------------------------------------- */

/* exp(x): 2^n * p(r) as in ops_avx512.c, 2^n built in the exponent bits. */
A2_INLINE __m256 a2_exp(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* n in [-126, 128]: split 2^n = 2^(n/2) * 2^(n - n/2) to stay in range */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static float a2_dot_f16_f32(int n, const fp16_t *a, const float *b)
{
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(a2_load_f16(a, i), _mm256_loadu_ps(b + i), acc);
    float s = a2_hsum(acc);
    for (; i < n; i++) s += _cvtsh_ss(a[i]) * b[i];
    return s;
}

static float a2_dot_f16(int n, const fp16_t *a, const fp16_t *b)
{
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(a2_load_f16(a, i), a2_load_f16(b, i), acc);
    float s = a2_hsum(acc);
    for (; i < n; i++) s += _cvtsh_ss(a[i]) * _cvtsh_ss(b[i]);
    return s;
}

static float a2_dot_f32(int n, const float *a, const float *b)
{
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = a2_hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void a2_mad_f16(int n, float *y, const fp16_t *x, float s)
{
    __m256 vs = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a2_load_f16(x, i), vs, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += _cvtsh_ss(x[i]) * s;
}

static void a2_mad_f32(int n, float *y, const float *x, float s)
{
    __m256 vs = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vs, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += x[i] * s;
}

static void a2_scale_f32(int n, float *y, float s)
{
    __m256 vs = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs));
    for (; i < n; i++) y[i] *= s;
}

static float a2_max_f32(int n, const float *x)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float r = a2_hmax(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* ---- attention: one key block (ops_att_block), queries in lanes ------------------------ */

/* lane mask of the first n (0..8) lanes */
A2_INLINE __m256i a2_lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* st[j][i] for JJ keys from j0 and CC 8-query chunks from c0 (see a512_att_qk) */
A2_INLINE void a2_att_qk(int JJ, int CC, const ops_att_block_args *a, int j0, int c0)
{
    __m256 acc[4][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < JJ; r++)
        _Pragma("GCC unroll 2") for (int c = 0; c < CC; c++) acc[r][c] = _mm256_setzero_ps();
    const float *k = a->k + (size_t)j0 * a->hd, *q = a->qt + (size_t)c0 * 8;
    for (int d = 0; d < a->hd; d++) {
        __m256 qv[2];
        _Pragma("GCC unroll 2") for (int c = 0; c < CC; c++) qv[c] = _mm256_loadu_ps(q + (size_t)d * a->nqp + c * 8);
        _Pragma("GCC unroll 4") for (int r = 0; r < JJ; r++) {
            __m256 kv = _mm256_broadcast_ss(k + (size_t)r * a->hd + d);
            _Pragma("GCC unroll 2") for (int c = 0; c < CC; c++) acc[r][c] = _mm256_fmadd_ps(kv, qv[c], acc[r][c]);
        }
    }
    __m256 vs = _mm256_set1_ps(a->scale);
    _Pragma("GCC unroll 4") for (int r = 0; r < JJ; r++)
        _Pragma("GCC unroll 2") for (int c = 0; c < CC; c++)
            _mm256_storeu_ps(a->st + (size_t)(j0 + r) * a->nqp + (c0 + c) * 8, _mm256_mul_ps(acc[r][c], vs));
}

/* acc[i][d] += sum_j st[j][i] * v[j][d], II rows from i0, dims [d0, d0 + 8 * DC) (the last
 * chunk masked by km), keys j < nj (see a512_att_pv) */
A2_INLINE void a2_att_pv(int II, int DC, const ops_att_block_args *a, int i0, int d0, __m256i km, int nj)
{
    __m256 acc[4][2];
    const int hd = a->hd;
    const __m256i all = _mm256_set1_epi32(-1);
    _Pragma("GCC unroll 4") for (int r = 0; r < II; r++)
        _Pragma("GCC unroll 2") for (int c = 0; c < DC; c++)
            acc[r][c] = _mm256_maskload_ps(a->acc + (size_t)(i0 + r) * hd + d0 + c * 8, c == DC - 1 ? km : all);
    for (int j = 0; j < nj; j++) {
        __m256 vv[2];
        _Pragma("GCC unroll 2") for (int c = 0; c < DC; c++)
            vv[c] = _mm256_maskload_ps(a->v + (size_t)j * hd + d0 + c * 8, c == DC - 1 ? km : all);
        _Pragma("GCC unroll 4") for (int r = 0; r < II; r++) {
            __m256 p = _mm256_broadcast_ss(a->st + (size_t)j * a->nqp + i0 + r);
            _Pragma("GCC unroll 2") for (int c = 0; c < DC; c++) acc[r][c] = _mm256_fmadd_ps(p, vv[c], acc[r][c]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < II; r++)
        _Pragma("GCC unroll 2") for (int c = 0; c < DC; c++)
            _mm256_maskstore_ps(a->acc + (size_t)(i0 + r) * hd + d0 + c * 8, c == DC - 1 ? km : all, acc[r][c]);
}

static void a2_att_block(const ops_att_block_args *a)
{
    const int hd = a->hd, nq = a->nq, nqp = a->nqp, nc = (nq + 7) / 8;
    for (int c0 = 0; c0 < nc; c0 += 2) {
        int cc = nc - c0 < 2 ? nc - c0 : 2, jend = ops_att_lim_max(a->lim, c0 * 8, nq < (c0 + cc) * 8 ? nq : (c0 + cc) * 8);
        for (int j0 = 0; j0 < jend; j0 += 4) {
            int jj = jend - j0 < 4 ? jend - j0 : 4;
            switch (jj * 8 + cc) {
#define A2_ATT_QK(JJ, CC) case JJ * 8 + CC: a2_att_qk(JJ, CC, a, j0, c0); break;
            A2_ATT_QK(1, 1) A2_ATT_QK(1, 2) A2_ATT_QK(2, 1) A2_ATT_QK(2, 2)
            A2_ATT_QK(3, 1) A2_ATT_QK(3, 2) A2_ATT_QK(4, 1) A2_ATT_QK(4, 2)
#undef A2_ATT_QK
            default: break;
            }
        }
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int c = 0; c < nc; c++) {
        int live = nq - c * 8 < 8 ? nq - c * 8 : 8;
        __m256i lm = a2_lanes(live);
        __m256i lim = _mm256_maskload_epi32(a->lim + c * 8, lm);
        __m256 M = _mm256_blendv_ps(ninf, _mm256_maskload_ps(a->m + c * 8, lm), _mm256_castsi256_ps(lm));
        __m256 S = _mm256_maskload_ps(a->s + c * 8, lm);
        int jend = ops_att_lim_max(a->lim, c * 8, c * 8 + live);
        __m256 mb = ninf;
        for (int j = 0; j < jend; j++) {
            __m256 kj = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, _mm256_set1_epi32(j)));
            __m256 sv = _mm256_loadu_ps(a->st + (size_t)j * nqp + c * 8);
            mb = _mm256_blendv_ps(mb, _mm256_max_ps(mb, sv), kj);
        }
        __m256 up = _mm256_cmp_ps(mb, M, _CMP_GT_OQ);
        __m256 resc = _mm256_and_ps(up, _mm256_cmp_ps(M, ninf, _CMP_NEQ_OQ));
        int rbits = _mm256_movemask_ps(resc);
        if (rbits) {
            float ms[8];
            _mm256_storeu_ps(ms, a2_exp(_mm256_sub_ps(M, mb)));
            S = _mm256_blendv_ps(S, _mm256_mul_ps(S, _mm256_loadu_ps(ms)), resc);
            for (unsigned bits = (unsigned)rbits; bits; bits &= bits - 1) {
                int l = __builtin_ctz(bits);
                float *row = a->acc + (size_t)(c * 8 + l) * hd;
                for (int d = 0; d < hd; d++) row[d] *= ms[l];
            }
        }
        M = _mm256_blendv_ps(M, mb, up);
        for (int j = 0; j < jend; j++) {
            float *sp = a->st + (size_t)j * nqp + c * 8;
            __m256 kj = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, _mm256_set1_epi32(j)));
            __m256 p = _mm256_and_ps(kj, a2_exp(_mm256_sub_ps(_mm256_loadu_ps(sp), M)));
            _mm256_storeu_ps(sp, p);
            S = _mm256_add_ps(S, p);
        }
        _mm256_maskstore_ps(a->m + c * 8, lm, M);
        _mm256_maskstore_ps(a->s + c * 8, lm, S);
    }
    for (int i0 = 0; i0 < nq; i0 += 4) {
        int ii = nq - i0 < 4 ? nq - i0 : 4, nj = ops_att_lim_max(a->lim, i0, i0 + ii);
        for (int d0 = 0; d0 < hd; d0 += 16) {
            int dc = hd - d0 >= 16 ? 2 : (hd - d0 + 7) / 8;
            __m256i km = a2_lanes(hd - d0 - (dc - 1) * 8);
            switch (ii * 8 + dc) {
#define A2_ATT_PV(II, DC) case II * 8 + DC: a2_att_pv(II, DC, a, i0, d0, km, nj); break;
            A2_ATT_PV(1, 1) A2_ATT_PV(1, 2) A2_ATT_PV(2, 1) A2_ATT_PV(2, 2)
            A2_ATT_PV(3, 1) A2_ATT_PV(3, 2) A2_ATT_PV(4, 1) A2_ATT_PV(4, 2)
#undef A2_ATT_PV
            default: break;
            }
        }
    }
}

static float a2_softmax_exp(int n, float *y, float max)
{
    __m256 vm = _mm256_set1_ps(max), sum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = a2_exp(_mm256_sub_ps(_mm256_loadu_ps(y + i), vm));
        _mm256_storeu_ps(y + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float s = a2_hsum(sum);
    for (; i < n; i++) {
        y[i] = expf(y[i] - max);
        s += y[i];
    }
    return s;
}

static void a2_rmsnorm_row(float *out, const float *x, const float *w, int n, float eps)
{
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 sq = _mm256_mul_ps(v, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double sum = _mm_cvtsd_f64(h) + _mm_cvtsd_f64(_mm_unpackhi_pd(h, h));
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++) out[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static void a2_swiglu(float *out, const float *g, const float *u, int64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = a2_exp(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void a2_add(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

/* four 32-byte loads a line pair, four chains; the words past the last 128 bytes one by one */
static uint64_t a2_stream_read(const void *p, size_t n)
{
    const char *c = p;
    __m256i a = _mm256_setzero_si256(), b = a, d = a, e = a;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(c + i)));
        b = _mm256_xor_si256(b, _mm256_loadu_si256((const __m256i *)(c + i + 32)));
        d = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)(c + i + 64)));
        e = _mm256_xor_si256(e, _mm256_loadu_si256((const __m256i *)(c + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(d, e));
    uint64_t w[4], r;
    _mm256_storeu_si256((__m256i *)w, a);
    r = w[0] ^ w[1] ^ w[2] ^ w[3];
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, c + i, 8);
        r ^= v;
    }
    return r;
}

/* ---- the other weight types: per-row dots -------------------------------------------- */

/* Q4_1, Q5_0, Q5_1, IQ4_NL (against Q8_1), Q2_K, Q3_K, IQ4_XS (against Q8_K): one (row,
 * token) at a time, the same integer sums as ops.c's reference and its float terms in the
 * same order, fused as ggml's x86 kernels fuse them (so within rounding of the scalar level's,
 * not bit-identical to it; the batch kernels below repeat each chain exactly). They serve one token (a decode step) and the rows past the last whole group of
 * the batch kernels below, at the AVX-512 level too. */

/* sum of w[i] * x[i] over 32 signed bytes (|w| <= 127, x != -128), as 8 int32 lanes. */
A2_INLINE __m256i a2_dot_s8(__m256i w, __m256i x)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* the same with unsigned w (0..127) */
A2_INLINE __m256i a2_dot_u8(__m256i w, __m256i x)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

A2_INLINE __m256i a2_iq4_lookup(__m256i nib)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)quant_kvalues_iq4nl);
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nib);
}

#define A2_DOT32(NAME, BT, INTSUM, HAS_MIN)                                                   \
    static float NAME(int64_t n, const void *vw, const block_q8_1 *x)                         \
    {                                                                                         \
        const BT *w = vw;                                                                     \
        float sumf = 0;                                                                       \
        for (int64_t b = 0; b < n / 32; b++) {                                                \
            __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);                        \
            int sumi = a2_hsum_i32(INTSUM);                                                   \
            sumf = fmaf((float)sumi, _cvtsh_ss(w[b].d) * _cvtsh_ss(x[b].d), sumf);            \
            if (HAS_MIN) sumf = fmaf(a2_min_of(&w[b]), _cvtsh_ss(x[b].s), sumf);               \
        }                                                                                     \
        return sumf;                                                                          \
    }
#define a2_min_of(p) _cvtsh_ss(*((const fp16_t *)(p) + 1))
A2_DOT32(a2_dot_q4_1, block_q4_1, a2_dot_u8(ops_kblk32_nibbles(w[b].qs), xv), 1)
A2_DOT32(a2_dot_q5_1, block_q5_1, a2_dot_u8(_mm256_or_si256(ops_kblk32_nibbles(w[b].qs), ops_kblk32_bit4(w[b].qh)), xv), 1)
A2_DOT32(a2_dot_q5_0, block_q5_0,
         a2_dot_s8(_mm256_sub_epi8(_mm256_or_si256(ops_kblk32_nibbles(w[b].qs), ops_kblk32_bit4(w[b].qh)), _mm256_set1_epi8(16)), xv), 0)
A2_DOT32(a2_dot_iq4_nl, block_iq4_nl, a2_dot_s8(a2_iq4_lookup(ops_kblk32_nibbles(w[b].qs)), xv), 0)
#undef a2_min_of

/* Q2_K: chunk c (32 values 32c..32c+31) is bits 2(c%4) of qs[32(c/4) ..]; its halves have
 * the scales of sub-blocks 2c and 2c+1 (low nibbles of scales[]), the mins (high nibbles)
 * meet the activations' sums. */
static float a2_dot_q2_K(int64_t n, const void *vw, const block_q8_K *x)
{
    const block_q2_K *w = vw;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m15 = _mm_set1_epi8(0x0F);
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m128i s8 = _mm_loadu_si128((const __m128i *)w[b].scales);
        __m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m15));
        __m256i mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m15));
        int summs = a2_hsum_i32(_mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i *)x[b].bsums)));
        __m256i q0 = _mm256_loadu_si256((const __m256i *)w[b].qs), q1 = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32));
        __m256i acc = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(c < 4 ? q0 : q1, 2 * (c % 4)), m3);
            __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * c)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ops_kblk_sc_chunk(sc, c)));
        }
        int isum = a2_hsum_i32(acc);
        float dall = x[b].d * _cvtsh_ss(w[b].d), dmin = x[b].d * _cvtsh_ss(w[b].dmin);
        sumf += fmaf(dall, (float)isum, -(dmin * (float)summs)); /* the batch kernel's chain */
    }
    return sumf;
}

/* Q3_K: u = low 2 bits | high bit << 2 (0..7), value u - 4: dot = maddubs(u, x) - 4 * bsum,
 * the second term taken per sub-block with its scale through the activations' sums. */
static float a2_dot_q3_K(int64_t n, const void *vw, const block_q8_K *x)
{
    const block_q3_K *w = vw;
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m256i s16 = _mm256_cvtepi8_epi16(ops_kblk_q3_K_scales(w[b].scales));
        __m256i corr = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)x[b].bsums));
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 2));
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
            __m256i p = _mm256_maddubs_epi16(ops_kblk_q3_K_chunk(&w[b], c),
                                             _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * c)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ops_kblk_sc_chunk(s16, c)));
        }
        sumf = fmaf(x[b].d * _cvtsh_ss(w[b].d), (float)a2_hsum_i32(acc), sumf);
    }
    return sumf;
}

static float a2_dot_iq4_xs(int64_t n, const void *vw, const block_q8_K *x)
{
    const block_iq4_xs *w = vw;
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 32; j++) {
            __m256i v = a2_iq4_lookup(ops_kblk32_nibbles(w[b].qs + 16 * j));
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((int16_t)(quant_iq4_xs_scale(&w[b], j) - 32))));
        }
        sumf = fmaf(x[b].d * _cvtsh_ss(w[b].d), (float)a2_hsum_i32(acc), sumf);
    }
    return sumf;
}

/* ---- Q2_K, Q3_K, IQ4_XS for batches: unpack once, dot many tokens -------------------- */

/* The per-row dots above unpack the weight bits again for every token; for batches the
 * driver in ops_kblk.h unpacks 4 rows' super-block once and calls a2_kblk_dot per token. */
/* Q2_K, Q3_K, IQ4_XS for batches (ops_kblk.h): one token's super-block xb against the
 * OPS_KBLK_ROWS unpacked rows of k, added to that token's y[0..3] (ops_kblk_finish). */
A2_INLINE void a2_kblk_dot(const ops_kblk *k, qtype t, const block_q8_K *xb, float *y)
{
    __m256i acc[OPS_KBLK_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK_ROWS; r++) acc[r] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * c));
        _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK_ROWS; r++) {
            __m256i p = t == QTYPE_IQ4_XS ? _mm256_maddubs_epi16(k->u[r][c], _mm256_sign_epi8(xv, k->v[r][c]))
                                          : _mm256_maddubs_epi16(k->u[r][c], xv);
            acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, k->sc[r][c]));
        }
    }
    ops_kblk_finish(k, t, xb, acc, y);
}

#define A2_GEMM_KBLK(name, dot, t)                                                            \
    static void name(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs, \
                     int nt, float *y, size_t ys)                                             \
    {                                                                                         \
        if (nt == 1) { /* decode: one pass over the row, nothing to share */                  \
            for (int r = 0; r < nr; r++) y[r] = dot(cols, (const char *)w + r * ws, x);       \
            return;                                                                           \
        }                                                                                     \
        ops_kblk_gemm(t, a2_kblk_dot, dot, cols, w, ws, nr, x, xs, nt, y, ys);                                   \
    }
A2_GEMM_KBLK(a2_gemm_q2_K, a2_dot_q2_K, QTYPE_Q2_K)
A2_GEMM_KBLK(a2_gemm_q3_K, a2_dot_q3_K, QTYPE_Q3_K)
A2_GEMM_KBLK(a2_gemm_iq4_xs, a2_dot_iq4_xs, QTYPE_IQ4_XS)

/* ---- Q4_1, Q5_0, Q5_1, IQ4_NL for batches (ops_kblk.h's ops_kblk32_gemm) --------------- */

/* Token block xb against block slot j of the 8 unpacked rows of k: each row's exact integer
 * dot (vpmaddubsw of the unsigned weight bytes, with the signed types' signs moved onto the
 * activations, then vpmaddwd with ones), one int32 lane per row. */
A2_INLINE __m256i a2_kblk32_dot(const ops_kblk32 *k, qtype t, int j, const block_q8_1 *xb)
{
    const __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs), ones = _mm256_set1_epi16(1);
    __m256i a[OPS_KBLK32_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < OPS_KBLK32_ROWS; r++) {
        __m256i u = _mm256_load_si256((const __m256i *)k->u[j][r]), xs = xv;
        if (t == QTYPE_Q5_0 || t == QTYPE_IQ4_NL) xs = _mm256_sign_epi8(xv, _mm256_load_si256((const __m256i *)k->v[j][r]));
        a[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xs), ones);
    }
    return ops_kblk_hsum8_i32(a);
}

#define A2_GEMM_KBLK32(name, dot, t)                                                          \
    static void name(int64_t cols, const void *w, size_t ws, int nr, const void *x, size_t xs, \
                     int nt, float *y, size_t ys)                                             \
    {                                                                                         \
        if (nt == 1) { /* decode: one pass over the row, nothing to share */                  \
            for (int r = 0; r < nr; r++) y[r] = dot(cols, (const char *)w + r * ws, x);       \
            return;                                                                           \
        }                                                                                     \
        ops_kblk32_gemm(t, a2_kblk32_dot, dot, cols, w, ws, nr, x, xs, nt, y, ys);            \
    }
A2_GEMM_KBLK32(a2_gemm_q4_1, a2_dot_q4_1, QTYPE_Q4_1)
A2_GEMM_KBLK32(a2_gemm_q5_0, a2_dot_q5_0, QTYPE_Q5_0)
A2_GEMM_KBLK32(a2_gemm_q5_1, a2_dot_q5_1, QTYPE_Q5_1)
A2_GEMM_KBLK32(a2_gemm_iq4_nl, a2_dot_iq4_nl, QTYPE_IQ4_NL)

/* KV cache rows against a Q8_0 query row, as ggml's AVX2 vec_dot_q8_0_q8_0 / q4_0_q8_0: the
 * exact integer dot of a block (signs moved onto the query so that maddubs multiplies
 * unsigned by signed), times both scales, accumulated in 8 float lanes, summed at the end. */
A2_INLINE __m256 a2_kv_block(__m256i k8, const block_q8_0 *q, float dk, __m256 acc)
{
    __m256i q8 = _mm256_loadu_si256((const __m256i *)q->qs);
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(k8, k8), _mm256_sign_epi8(q8, k8));
    __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
    return _mm256_fmadd_ps(_mm256_set1_ps(dk * _cvtsh_ss(q->d)), p, acc);
}

static float a2_dot_kv_q8_0(int n, const void *k, const block_q8_0 *q)
{
    const block_q8_0 *kb = k;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK8_0; b++)
        acc = a2_kv_block(_mm256_loadu_si256((const __m256i *)kb[b].qs), q + b, _cvtsh_ss(kb[b].d), acc);
    return a2_hsum(acc);
}

static float a2_dot_kv_q4_0(int n, const void *k, const block_q8_0 *q)
{
    const block_q4_0 *kb = k;
    const __m256i lo = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK4_0; b++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)kb[b].qs);
        /* low nibbles are values 0..15 of the block, high nibbles 16..31 */
        __m256i k8 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), lo);
        acc = a2_kv_block(_mm256_sub_epi8(k8, eight), q + b, _cvtsh_ss(kb[b].d), acc);
    }
    return a2_hsum(acc);
}

void ops_kernels_init_avx2(ops_kernels *k)
{
    ops_iq_init_avx2(k);
    k->dot_kv_q8_0 = a2_dot_kv_q8_0;
    k->dot_kv_q4_0 = a2_dot_kv_q4_0;
    k->quant_q8_0 = a2_quant_q8_0;
    k->quant_q8_K = a2_quant_q8_K;
    k->gemm[QTYPE_Q8_0] = a2_gemm_q8_0;
    k->gemm[QTYPE_Q4_0] = a2_gemm_q4_0;
    k->gemm[QTYPE_MXFP4] = a2_gemm_mxfp4;
    k->gemm[QTYPE_Q4_K] = a2_gemm_q4_K;
    k->gemm[QTYPE_Q5_K] = a2_gemm_q5_K;
    k->gemm[QTYPE_Q6_K] = a2_gemm_q6_K;
    k->gemm[QTYPE_Q4_1] = a2_gemm_q4_1;
    k->gemm[QTYPE_Q5_0] = a2_gemm_q5_0;
    k->gemm[QTYPE_Q5_1] = a2_gemm_q5_1;
    k->gemm[QTYPE_IQ4_NL] = a2_gemm_iq4_nl;
    k->gemm[QTYPE_Q2_K] = a2_gemm_q2_K;
    k->gemm[QTYPE_Q3_K] = a2_gemm_q3_K;
    k->gemm[QTYPE_IQ4_XS] = a2_gemm_iq4_xs;
    k->gemm[QTYPE_F32] = a2_gemm_f32;
    k->gemm[QTYPE_F16] = a2_gemm_f16;
    k->gemm[QTYPE_BF16] = a2_gemm_bf16;
    k->to_f16 = a2_to_f16;
    k->from_f16 = a2_from_f16;
    k->dot_f16_f32 = a2_dot_f16_f32;
    k->dot_f16 = a2_dot_f16;
    k->mad_f16 = a2_mad_f16;
    k->dot_f32 = a2_dot_f32;
    k->mad_f32 = a2_mad_f32;
    k->scale_f32 = a2_scale_f32;
    k->softmax_exp = a2_softmax_exp;
    k->att_block = a2_att_block;
    k->max_f32 = a2_max_f32;
    k->rmsnorm_row = a2_rmsnorm_row;
    k->swiglu = a2_swiglu;
    k->add = a2_add;
    k->stream_read = a2_stream_read;
}
