/*
 * ops_neon: aarch64 AdvSIMD kernels with the dot-product extension (armv8.2-a+dotprod), and
 * the int8 matrix multiply extension (i8mm) for the Q8_0-family gemms where the CPU has it
 * (see ops_int.h for the table they fill; cpu.c detects both through HWCAP/HWCAP2).
 *
 * Vectors are 4 floats / 16 bytes, with 32 registers. Activations stay in the scalar formats
 * (block_q8_0 / block_q8_K rows), quantised here with the scalar rounding (half to even), so
 * the integer block sums equal the scalar ones exactly.
 *
 * Batch invariance: Q8_0 / Q4_0 / MXFP4 put four (row, token) results in the lanes of one
 * vector, each lane the chain acc = fma(float(block sum), d_w * d_x, acc) over the blocks in
 * order; the dot-product tiles (4 rows x 1..4 tokens) and the i8mm tiles (2 x 2 pairs, whose
 * vmmla gives the four block sums at once) run that same chain, so an element has the same
 * bits whichever tile computes it. The k-quant and float kernels keep one accumulator vector
 * per (row, token), summed across lanes at the end, which no tile shape changes.
 */
#include "model/ops_int.h"
#include "util/cpu.h"

#include <arm_neon.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define NE_INLINE static inline __attribute__((always_inline))
#define NE_PF 1024 /* weight prefetch distance, bytes ahead in the row */
#define NE_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))

NE_INLINE float ne_h2f(fp16_t h)
{
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

NE_INLINE float32x4_t ne_load_f16x4(const fp16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* ---- activation quantisers (scalar formats) ------------------------------------------- */

static void ne_quant_q8_0(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    block_q8_0 *y = dst;
    (void)cols;
    for (int64_t b = e0 / 32; b < e1 / 32; b++) {
        const float *xb = x + 32 * b;
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(xb + 4 * k);
            m = vmaxq_f32(m, vabsq_f32(v[k]));
        }
        float amax = vmaxvq_f32(m);
        y[b].d = quant_fp32_to_fp16(amax / 127.f);
        float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int16x8_t h[4];
        for (int k = 0; k < 4; k++)
            h[k] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * k], id))),
                                vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * k + 1], id))));
        vst1q_s8(y[b].qs, vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])));
        vst1q_s8(y[b].qs + 16, vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3])));
    }
}

static void ne_quant_q8_K(const float *x, void *dst, int64_t cols, int64_t e0, int64_t e1)
{
    block_q8_K *y = dst;
    (void)cols;
    x += e0 / QK_K * QK_K;
    for (int64_t i = e0 / QK_K; i < e1 / QK_K; i++, x += QK_K) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
        float amax = vmaxvq_f32(m);
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
        const int32x4_t cap = vdupq_n_s32(127);
        for (int j = 0; j < QK_K; j += 16) {
            int32x4_t q[4];
            for (int k = 0; k < 4; k++)
                q[k] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4 * k), iscale)), cap);
            int16x8_t h0 = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            int16x8_t h1 = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            vst1q_s8(y[i].qs + j, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
            y[i].bsums[j / 16] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])));
        }
        y[i].d = 1 / iscale;
    }
}

static void ne_to_f16(const float *x, fp16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = quant_fp32_to_fp16(x[i]);
}

static void ne_from_f16(const fp16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, ne_load_f16x4(x + i));
    for (; i < n; i++) y[i] = ne_h2f(x[i]);
}

/* ---- tile dispatch -------------------------------------------------------------------- */

/* Calls KERNEL(R, T, ...) over the (nr, nt) tile grid, R and T compile-time constants. */
#define NE_TILES(RMAX, TMAX, KERNEL)                                                       \
    for (int r0 = 0; r0 < nr; r0 += RMAX) {                                                \
        int rr = nr - r0 < RMAX ? nr - r0 : RMAX;                                          \
        for (int t0 = 0; t0 < nt; t0 += TMAX) {                                            \
            int tt = nt - t0 < TMAX ? nt - t0 : TMAX;                                      \
            const char *w_ = (const char *)w + (size_t)r0 * ws;                            \
            const char *x_ = (const char *)x + (size_t)t0 * xs;                            \
            float *y_ = y + (size_t)t0 * ys + r0;                                          \
            switch (rr * 8 + tt) {                                                         \
            NE_CASE(KERNEL, 1, 1) NE_CASE(KERNEL, 1, 2) NE_CASE(KERNEL, 1, 3) NE_CASE(KERNEL, 1, 4) \
            NE_CASE(KERNEL, 2, 1) NE_CASE(KERNEL, 2, 2) NE_CASE(KERNEL, 2, 3) NE_CASE(KERNEL, 2, 4) \
            NE_CASE(KERNEL, 3, 1) NE_CASE(KERNEL, 3, 2) NE_CASE(KERNEL, 3, 3) NE_CASE(KERNEL, 3, 4) \
            NE_CASE(KERNEL, 4, 1) NE_CASE(KERNEL, 4, 2) NE_CASE(KERNEL, 4, 3) NE_CASE(KERNEL, 4, 4) \
            default: break;                                                                \
            }                                                                              \
        }                                                                                  \
    }
#define NE_CASE(KERNEL, R, T)                                                              \
    case R * 8 + T:                                                                        \
        if (R <= RMAX_ && T <= TMAX_)                                                      \
            KERNEL(R <= RMAX_ ? R : 1, T <= TMAX_ ? T : 1, cols, w_, ws, x_, xs, y_, ys);  \
        break;

/* ---- Q8_0 / Q4_0 / MXFP4 weights x Q8_0 activations ----------------------------------- */

/* A weight block as 32 signed values: v[0] columns 0..15, v[1] columns 16..31. */
NE_INLINE void ne_w_q8_0(const void *b, int8x16_t v[2])
{
    const block_q8_0 *p = b;
    v[0] = vld1q_s8(p->qs);
    v[1] = vld1q_s8(p->qs + 16);
}
NE_INLINE void ne_w_q4_0(const void *b, int8x16_t v[2])
{
    uint8x16_t q = vld1q_u8(((const block_q4_0 *)b)->qs);
    const int8x16_t eight = vdupq_n_s8(8);
    v[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), eight);
    v[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
}
/* MXFP4: the codes looked up in the doubled E2M1 table, low nibbles first */
NE_INLINE void ne_w_mxfp4(const void *b, int8x16_t v[2])
{
    const int8x16_t tab = vld1q_s8(quant_kvalues_mxfp4);
    uint8x16_t q = vld1q_u8(((const block_mxfp4 *)b)->qs);
    v[0] = vqtbl1q_s8(tab, vandq_u8(q, vdupq_n_u8(0x0F)));
    v[1] = vqtbl1q_s8(tab, vshrq_n_u8(q, 4));
}
#define NE_D_F16(wb) ne_h2f((wb)->d)
#define NE_D_E8M0(wb) quant_e8m0_half((wb)->e)

/* Rows [0, R) (R <= 4) x tokens [0, T): lane r of acc[t] is (row r, token t). Rows past R
 * repeat row R-1 (never read past the weight) and are not stored. */
#define NE_Q80_KERNEL(NAME, BLOCK, LOADW, SCALEW)                                             \
    NE_INLINE void NAME(int R, int T, int64_t cols, const char *w, size_t ws, const char *x, \
                        size_t xs, float *y, size_t ys)                                     \
    {                                                                                       \
        const int64_t nb = cols / 32;                                                       \
        const BLOCK *wr[4];                                                                 \
        for (int r = 0; r < 4; r++) wr[r] = (const BLOCK *)(w + (size_t)(r < R ? r : R - 1) * ws); \
        float32x4_t acc[4];                                                                 \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[t] = vdupq_n_f32(0.0f);     \
        const int32x4_t zero = vdupq_n_s32(0);                                              \
        for (int64_t b = 0; b < nb; b++) {                                                  \
            int8x16_t wq[4][2];                                                             \
            float dw[4];                                                                    \
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                           \
                __builtin_prefetch((const char *)(wr[r] + b) + NE_PF);                      \
                LOADW(wr[r] + b, wq[r]);                                                    \
                dw[r] = SCALEW(wr[r] + b);                                                  \
            }                                                                               \
            float32x4_t dwv = vld1q_f32(dw);                                                \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                           \
                const block_q8_0 *xb = (const block_q8_0 *)(x + (size_t)t * xs) + b;        \
                int8x16_t x0 = vld1q_s8(xb->qs), x1 = vld1q_s8(xb->qs + 16);                \
                int32x4_t d[4];                                                             \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                         \
                    d[r] = vdotq_s32(vdotq_s32(zero, wq[r][0], x0), wq[r][1], x1);          \
                int32x4_t s = vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3]));   \
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), vmulq_n_f32(dwv, ne_h2f(xb->d))); \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                               \
            float o[4];                                                                     \
            vst1q_f32(o, acc[t]);                                                           \
            for (int r = 0; r < R; r++) y[(size_t)t * ys + r] = o[r];                       \
        }                                                                                   \
    }

NE_Q80_KERNEL(ne_tile_q8_0, block_q8_0, ne_w_q8_0, NE_D_F16)
NE_Q80_KERNEL(ne_tile_q4_0, block_q4_0, ne_w_q4_0, NE_D_F16)
NE_Q80_KERNEL(ne_tile_mxfp4, block_mxfp4, ne_w_mxfp4, NE_D_E8M0)

/* i8mm: rows r0, r0+1 x tokens t0, t0+1 per vmmla; lanes (r0,t0), (r0,t1), (r1,t0), (r1,t1).
 * RP row pairs x TP token pairs; the same lane chain as the dot-product tiles. */
#define NE_Q80_MMLA(NAME, BLOCK, LOADW, SCALEW)                                               \
    NE_I8MM static void NAME(int RP, int TP, int64_t cols, const char *w, size_t ws,        \
                             const char *x, size_t xs, float *y, size_t ys)                 \
    {                                                                                       \
        const int64_t nb = cols / 32;                                                       \
        float32x4_t acc[2][2];                                                              \
        for (int p = 0; p < RP; p++)                                                        \
            for (int q = 0; q < TP; q++) acc[p][q] = vdupq_n_f32(0.0f);                     \
        for (int64_t b = 0; b < nb; b++) {                                                  \
            int8x16_t wz[2][4], xz[2][4];                                                   \
            float dw[4], dx[4];                                                             \
            for (int p = 0; p < RP; p++) {                                                  \
                int8x16_t v0[2], v1[2];                                                     \
                const BLOCK *b0 = (const BLOCK *)(w + (size_t)(2 * p) * ws) + b;            \
                const BLOCK *b1 = (const BLOCK *)(w + (size_t)(2 * p + 1) * ws) + b;        \
                __builtin_prefetch((const char *)b0 + NE_PF);                               \
                __builtin_prefetch((const char *)b1 + NE_PF);                               \
                LOADW(b0, v0);                                                              \
                LOADW(b1, v1);                                                              \
                dw[2 * p] = SCALEW(b0);                                                     \
                dw[2 * p + 1] = SCALEW(b1);                                                 \
                for (int h = 0; h < 2; h++) {                                               \
                    int64x2_t a0 = vreinterpretq_s64_s8(v0[h]), a1 = vreinterpretq_s64_s8(v1[h]); \
                    wz[p][2 * h] = vreinterpretq_s8_s64(vzip1q_s64(a0, a1));                \
                    wz[p][2 * h + 1] = vreinterpretq_s8_s64(vzip2q_s64(a0, a1));            \
                }                                                                           \
            }                                                                               \
            for (int q = 0; q < TP; q++) {                                                  \
                const block_q8_0 *x0 = (const block_q8_0 *)(x + (size_t)(2 * q) * xs) + b;  \
                const block_q8_0 *x1 = (const block_q8_0 *)(x + (size_t)(2 * q + 1) * xs) + b; \
                dx[2 * q] = ne_h2f(x0->d);                                                  \
                dx[2 * q + 1] = ne_h2f(x1->d);                                              \
                for (int h = 0; h < 2; h++) {                                               \
                    int64x2_t a0 = vreinterpretq_s64_s8(vld1q_s8(x0->qs + 16 * h));         \
                    int64x2_t a1 = vreinterpretq_s64_s8(vld1q_s8(x1->qs + 16 * h));         \
                    xz[q][2 * h] = vreinterpretq_s8_s64(vzip1q_s64(a0, a1));                \
                    xz[q][2 * h + 1] = vreinterpretq_s8_s64(vzip2q_s64(a0, a1));            \
                }                                                                           \
            }                                                                               \
            for (int p = 0; p < RP; p++)                                                    \
                for (int q = 0; q < TP; q++) {                                              \
                    int32x4_t s = vdupq_n_s32(0);                                           \
                    for (int k = 0; k < 4; k++) s = vmmlaq_s32(s, wz[p][k], xz[q][k]);      \
                    float sc[4] = {dw[2 * p] * dx[2 * q], dw[2 * p] * dx[2 * q + 1],         \
                                   dw[2 * p + 1] * dx[2 * q], dw[2 * p + 1] * dx[2 * q + 1]}; \
                    acc[p][q] = vfmaq_f32(acc[p][q], vcvtq_f32_s32(s), vld1q_f32(sc));      \
                }                                                                           \
        }                                                                                   \
        for (int p = 0; p < RP; p++)                                                        \
            for (int q = 0; q < TP; q++) {                                                  \
                float o[4];                                                                 \
                vst1q_f32(o, acc[p][q]);                                                    \
                y[(size_t)(2 * q) * ys + 2 * p] = o[0];                                     \
                y[(size_t)(2 * q + 1) * ys + 2 * p] = o[1];                                 \
                y[(size_t)(2 * q) * ys + 2 * p + 1] = o[2];                                 \
                y[(size_t)(2 * q + 1) * ys + 2 * p + 1] = o[3];                             \
            }                                                                               \
    }

NE_Q80_MMLA(ne_mmla_q8_0, block_q8_0, ne_w_q8_0, NE_D_F16)
NE_Q80_MMLA(ne_mmla_q4_0, block_q4_0, ne_w_q4_0, NE_D_F16)
NE_Q80_MMLA(ne_mmla_mxfp4, block_mxfp4, ne_w_mxfp4, NE_D_E8M0)

#define RMAX_ 4
#define TMAX_ 4
#define NE_Q80_GEMM(NAME, TILE)                                                             \
    static void NAME(int64_t cols, const void *w, size_t ws, int nr, const void *x,         \
                     size_t xs, int nt, float *y, size_t ys)                                \
    {                                                                                       \
        NE_TILES(4, 4, TILE)                                                                \
    }
NE_Q80_GEMM(ne_gemm_q8_0, ne_tile_q8_0)
NE_Q80_GEMM(ne_gemm_q4_0, ne_tile_q4_0)
NE_Q80_GEMM(ne_gemm_mxfp4, ne_tile_mxfp4)

/* With i8mm: 4 x 4 tiles of pairs where both dimensions allow, the dot-product tiles for an
 * odd last row or token (a decode step's single token among them). */
#define NE_Q80_GEMM_MMLA(NAME, MMLA, DOT)                                                   \
    static void NAME(int64_t cols, const void *w, size_t ws, int nr, const void *x,         \
                     size_t xs, int nt, float *y, size_t ys)                                \
    {                                                                                       \
        int nr2 = nr & ~1, nt2 = nt & ~1;                                                   \
        if (nt2 == 0) {                                                                     \
            DOT(cols, w, ws, nr, x, xs, nt, y, ys);                                         \
            return;                                                                         \
        }                                                                                   \
        for (int r0 = 0; r0 < nr2; r0 += 4)                                                 \
            for (int t0 = 0; t0 < nt2; t0 += 4)                                             \
                MMLA(nr2 - r0 >= 4 ? 2 : 1, nt2 - t0 >= 4 ? 2 : 1, cols,                    \
                     (const char *)w + (size_t)r0 * ws, ws, (const char *)x + (size_t)t0 * xs, \
                     xs, y + (size_t)t0 * ys + r0, ys);                                     \
        if (nr2 < nr)                                                                       \
            DOT(cols, (const char *)w + (size_t)nr2 * ws, ws, 1, x, xs, nt2, y + nr2, ys);  \
        if (nt2 < nt)                                                                       \
            DOT(cols, w, ws, nr, (const char *)x + (size_t)nt2 * xs, xs, 1,                 \
                y + (size_t)nt2 * ys, ys);                                                  \
    }
NE_Q80_GEMM_MMLA(ne_gemm_q8_0_mmla, ne_mmla_q8_0, ne_gemm_q8_0)
NE_Q80_GEMM_MMLA(ne_gemm_q4_0_mmla, ne_mmla_q4_0, ne_gemm_q4_0)
NE_Q80_GEMM_MMLA(ne_gemm_mxfp4_mmla, ne_mmla_mxfp4, ne_gemm_mxfp4)
#undef RMAX_
#undef TMAX_

/* ---- Q4_K / Q5_K / Q6_K weights x Q8_K activations ------------------------------------ */

/* The 8 sub-block scales, then the 8 mins, of a Q4_K/Q5_K block (quant_q4_K_scale_min). */
NE_INLINE void ne_q4_K_scales(const uint8_t *s, uint8_t out[16])
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

/* Q4_K, and with `five` Q5_K (the fifth bit of column 32j + l is bit j of qh[l]). */
NE_INLINE void ne_tile_kmin(int R, int T, bool five, int64_t cols, const char *w, size_t ws,
                            const char *x, size_t xs, float *y, size_t ys)
{
    const int64_t nb = cols / QK_K;
    const size_t bsz = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t o_qs = five ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const uint8x16_t m4 = vdupq_n_u8(0x0F), b4 = vdupq_n_u8(0x10);
    const int32x4_t zero = vdupq_n_s32(0);
    float32x4_t acc[2][2];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sm[2][16];
        int32x4_t isum[2][2];
        uint8x16_t qh[2][2];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            const block_q4_K *wb = (const block_q4_K *)(w + (size_t)r * ws + (size_t)b * bsz);
            ne_q4_K_scales(wb->scales, sm[r]);
            if (five) {
                qh[r][0] = vld1q_u8(((const block_q5_K *)wb)->qh);
                qh[r][1] = vld1q_u8(((const block_q5_K *)wb)->qh + 16);
            }
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) isum[r][t] = zero;
        }
        for (int j = 0; j < 8; j++) {
            int8x16_t q[2][2];
            const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << j));
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                const uint8_t *qs = (const uint8_t *)w + (size_t)r * ws + (size_t)b * bsz + o_qs + 32 * (j >> 1);
                if (!(j & 1)) __builtin_prefetch(qs + NE_PF);
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                    uint8x16_t v = vld1q_u8(qs + 16 * h);
                    v = (j & 1) ? vshrq_n_u8(v, 4) : vandq_u8(v, m4);
                    if (five) v = vorrq_u8(v, vandq_u8(vtstq_u8(qh[r][h], bit), b4));
                    q[r][h] = vreinterpretq_s8_u8(v);
                }
            }
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                int8x16_t x0 = vld1q_s8(xb->qs + 32 * j), x1 = vld1q_s8(xb->qs + 32 * j + 16);
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                    isum[r][t] = vmlaq_n_s32(isum[r][t], vdotq_s32(vdotq_s32(zero, q[r][0], x0), q[r][1], x1), sm[r][j]);
            }
        }
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            const block_q4_K *wb = (const block_q4_K *)(w + (size_t)r * ws + (size_t)b * bsz);
            float dw = ne_h2f(wb->d), dmw = ne_h2f(wb->dmin);
            int16x8_t mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm[r] + 8)));
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                /* bsums 2j + 2j+1, times m_j */
                int16x8_t bs = vpaddq_s16(vld1q_s16(xb->bsums), vld1q_s16(xb->bsums + 8));
                int32x4_t mv = vmlal_high_s16(vmull_s16(vget_low_s16(bs), vget_low_s16(mins)), bs, mins);
                acc[r][t] = vfmaq_f32(acc[r][t], vcvtq_f32_s32(isum[r][t]), vdupq_n_f32(xb->d * dw));
                acc[r][t] = vfmsq_f32(acc[r][t], vcvtq_f32_s32(mv), vdupq_n_f32(xb->d * dmw));
            }
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) y[(size_t)t * ys + r] = vaddvq_f32(acc[r][t]);
}

NE_INLINE void ne_tile_q4_K(int R, int T, int64_t cols, const char *w, size_t ws, const char *x,
                            size_t xs, float *y, size_t ys)
{
    ne_tile_kmin(R, T, false, cols, w, ws, x, xs, y, ys);
}

NE_INLINE void ne_tile_q5_K(int R, int T, int64_t cols, const char *w, size_t ws, const char *x,
                            size_t xs, float *y, size_t ys)
{
    ne_tile_kmin(R, T, true, cols, w, ws, x, xs, y, ys);
}

/* Per super-block: the unsigned 6-bit values q (0..63) dotted per 16-column group, times the
 * group's scale, minus 32 * scale * the group's activation sum (bsums) for the -32 offset. */
NE_INLINE void ne_tile_q6_K(int R, int T, int64_t cols, const char *w, size_t ws, const char *x,
                            size_t xs, float *y, size_t ys)
{
    const int64_t nb = cols / QK_K;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    const int32x4_t zero = vdupq_n_s32(0);
    float32x4_t acc[2][2];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t isum[2][2];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * ws) + b;
            int8x16_t sc = vld1q_s8(wb->scales);
            int16x8_t s0 = vmovl_s8(vget_low_s8(sc)), s1 = vmovl_high_s8(sc);
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                int16x8_t b0 = vld1q_s16(xb->bsums), b1 = vld1q_s16(xb->bsums + 8);
                int32x4_t m = vmull_s16(vget_low_s16(b0), vget_low_s16(s0));
                m = vmlal_high_s16(m, b0, s0);
                m = vmlal_s16(m, vget_low_s16(b1), vget_low_s16(s1));
                m = vmlal_high_s16(m, b1, s1);
                isum[r][t] = vnegq_s32(vshlq_n_s32(m, 5));
            }
        }
        for (int k = 0; k < 8; k++) {
            int h = k >> 2, qq = k & 3;
            int8x16_t q[2][2];
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * ws) + b;
                __builtin_prefetch((const char *)wb + 26 * k + NE_PF);
                const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * qq));
                _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {
                    uint8x16_t ql = vld1q_u8(wb->ql + 64 * h + 32 * (qq & 1) + 16 * e);
                    uint8x16_t qh = vld1q_u8(wb->qh + 32 * h + 16 * e);
                    uint8x16_t lo = qq >= 2 ? vshrq_n_u8(ql, 4) : vandq_u8(ql, m4);
                    uint8x16_t hb = vandq_u8(vshlq_u8(qh, sh), m3);
                    q[r][e] = vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hb, 4)));
                }
            }
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                int8x16_t x0 = vld1q_s8(xb->qs + 32 * k), x1 = vld1q_s8(xb->qs + 32 * k + 16);
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                    const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * ws) + b;
                    isum[r][t] = vmlaq_n_s32(isum[r][t], vdotq_s32(zero, q[r][0], x0), wb->scales[2 * k]);
                    isum[r][t] = vmlaq_n_s32(isum[r][t], vdotq_s32(zero, q[r][1], x1), wb->scales[2 * k + 1]);
                }
            }
        }
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            float dw = ne_h2f(((const block_q6_K *)(w + (size_t)r * ws) + b)->d);
            _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xs) + b;
                acc[r][t] = vfmaq_f32(acc[r][t], vcvtq_f32_s32(isum[r][t]), vdupq_n_f32(xb->d * dw));
            }
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < T; t++) y[(size_t)t * ys + r] = vaddvq_f32(acc[r][t]);
}

#define RMAX_ 2
#define TMAX_ 2
static void ne_gemm_q4_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    NE_TILES(2, 2, ne_tile_q4_K)
}
static void ne_gemm_q5_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    NE_TILES(2, 2, ne_tile_q5_K)
}
static void ne_gemm_q6_K(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    NE_TILES(2, 2, ne_tile_q6_K)
}
#undef RMAX_
#undef TMAX_

/* ---- float weights -------------------------------------------------------------------- */

NE_INLINE float32x4_t ne_load_f32(const void *p, int64_t i) { return vld1q_f32((const float *)p + i); }
NE_INLINE float32x4_t ne_load_f16(const void *p, int64_t i) { return ne_load_f16x4((const fp16_t *)p + i); }
NE_INLINE float32x4_t ne_load_bf16(const void *p, int64_t i)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const bf16_t *)p + i), 16));
}
NE_INLINE float ne_s_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
NE_INLINE float ne_s_f16(const void *p, int64_t i) { return ne_h2f(((const fp16_t *)p)[i]); }
NE_INLINE float ne_s_bf16(const void *p, int64_t i) { return quant_bf16_to_fp32(((const bf16_t *)p)[i]); }

#define NE_FLOAT_KERNEL(NAME, LOAD, SCALAR)                                                 \
    NE_INLINE void NAME(int R, int T, int64_t cols, const char *w, size_t ws, const char *x, \
                        size_t xs, float *y, size_t ys)                                     \
    {                                                                                       \
        float32x4_t acc[4][4];                                                              \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = vdupq_n_f32(0.0f); \
        int64_t i = 0;                                                                      \
        for (; i + 4 <= cols; i += 4) {                                                     \
            float32x4_t wv[4];                                                              \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                           \
                wv[r] = LOAD(w + (size_t)r * ws, i);                                        \
                if (!(i & 15)) __builtin_prefetch(w + (size_t)r * ws + i * 4 + NE_PF);      \
            }                                                                               \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                           \
                float32x4_t xv = LOAD(x + (size_t)t * xs, i);                               \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][t] =             \
                    vfmaq_f32(acc[r][t], wv[r], xv);                                        \
            }                                                                               \
        }                                                                                   \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {                           \
                float s = vaddvq_f32(acc[r][t]);                                            \
                for (int64_t j = i; j < cols; j++)                                          \
                    s += SCALAR(w + (size_t)r * ws, j) * SCALAR(x + (size_t)t * xs, j);     \
                y[(size_t)t * ys + r] = s;                                                  \
            }                                                                               \
    }

NE_FLOAT_KERNEL(ne_tile_f32, ne_load_f32, ne_s_f32)
NE_FLOAT_KERNEL(ne_tile_f16, ne_load_f16, ne_s_f16)
NE_FLOAT_KERNEL(ne_tile_bf16, ne_load_bf16, ne_s_bf16)

#define RMAX_ 4
#define TMAX_ 4
static void ne_gemm_f32(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                        size_t xs, int nt, float *y, size_t ys)
{
    NE_TILES(4, 4, ne_tile_f32)
}
static void ne_gemm_f16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                        size_t xs, int nt, float *y, size_t ys)
{
    NE_TILES(4, 4, ne_tile_f16)
}
static void ne_gemm_bf16(int64_t cols, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nt, float *y, size_t ys)
{
    NE_TILES(4, 4, ne_tile_bf16)
}
#undef RMAX_
#undef TMAX_

/* ---- vector helpers and elementwise ops ----------------------------------------------- */

/* exp(x): 2^n * p(r) as in ops_avx2.c, 2^n built in the exponent bits in two halves. */
NE_INLINE float32x4_t ne_exp(float32x4_t x)
{
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    x = vminq_f32(x, vdupq_n_f32(88.7f));
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145752f));
    r = vfmsq_f32(r, n, vdupq_n_f32(1.42860677e-6f));
    float32x4_t p = vdupq_n_f32(1.0f / 720);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    int32x4_t ni = vcvtq_s32_f32(n);
    int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
    float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

static float ne_dot_f16_f32(int n, const fp16_t *a, const float *b)
{
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, ne_load_f16x4(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(acc);
    for (; i < n; i++) s += ne_h2f(a[i]) * b[i];
    return s;
}

static float ne_dot_f16(int n, const fp16_t *a, const fp16_t *b)
{
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, ne_load_f16x4(a + i), ne_load_f16x4(b + i));
    float s = vaddvq_f32(acc);
    for (; i < n; i++) s += ne_h2f(a[i]) * ne_h2f(b[i]);
    return s;
}

static float ne_dot_f32(int n, const float *a, const float *b)
{
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void ne_mad_f16(int n, float *y, const fp16_t *x, float s)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), ne_load_f16x4(x + i), s));
    for (; i < n; i++) y[i] += ne_h2f(x[i]) * s;
}

static void ne_mad_f32(int n, float *y, const float *x, float s)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), s));
    for (; i < n; i++) y[i] += x[i] * s;
}

static void ne_scale_f32(int n, float *y, float s)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(y + i), s));
    for (; i < n; i++) y[i] *= s;
}

static float ne_max_f32(int n, const float *x)
{
    float32x4_t m = vdupq_n_f32(-INFINITY);
    int i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxq_f32(m, vld1q_f32(x + i));
    float r = vmaxvq_f32(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static float ne_softmax_exp(int n, float *y, float max)
{
    float32x4_t vm = vdupq_n_f32(max), sum = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t e = ne_exp(vsubq_f32(vld1q_f32(y + i), vm));
        vst1q_f32(y + i, e);
        sum = vaddq_f32(sum, e);
    }
    float s = vaddvq_f32(sum);
    for (; i < n; i++) {
        y[i] = expf(y[i] - max);
        s += y[i];
    }
    return s;
}

static void ne_rmsnorm_row(float *out, const float *x, const float *w, int n, float eps)
{
    float64x2_t s0 = vdupq_n_f64(0.0), s1 = vdupq_n_f64(0.0);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i), sq = vmulq_f32(v, v);
        s0 = vaddq_f64(s0, vcvt_f64_f32(vget_low_f32(sq)));
        s1 = vaddq_f64(s1, vcvt_high_f64_f32(sq));
    }
    double sum = vaddvq_f64(vaddq_f64(s0, s1));
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), scale);
        if (w) v = vmulq_f32(v, vld1q_f32(w + i));
        vst1q_f32(out + i, v);
    }
    for (; i < n; i++) out[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static void ne_swiglu(float *out, const float *g, const float *u, int64_t n)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t gv = vld1q_f32(g + i);
        float32x4_t s = vdivq_f32(gv, vaddq_f32(one, ne_exp(vnegq_f32(gv))));
        vst1q_f32(out + i, vmulq_f32(s, vld1q_f32(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void ne_add(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

/* ---- attention: one key block (ops_att_block), queries in lanes ------------------------ */

/* st[j][i] for JJ keys from j0 and CC 4-query chunks from c0: one FMA chain over d per (key,
 * query), the key element broadcast, 4 queries of qt per load */
NE_INLINE void ne_att_qk(int JJ, int CC, const ops_att_block_args *a, int j0, int c0)
{
    float32x4_t acc[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < JJ; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++) acc[r][c] = vdupq_n_f32(0.0f);
    const float *k = a->k + (size_t)j0 * a->hd, *q = a->qt + (size_t)c0 * 4;
    for (int d = 0; d < a->hd; d++) {
        float32x4_t qv[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++) qv[c] = vld1q_f32(q + (size_t)d * a->nqp + c * 4);
        _Pragma("GCC unroll 4") for (int r = 0; r < JJ; r++) {
            float kv = k[(size_t)r * a->hd + d];
            _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++) acc[r][c] = vfmaq_n_f32(acc[r][c], qv[c], kv);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < JJ; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++)
            vst1q_f32(a->st + (size_t)(j0 + r) * a->nqp + (c0 + c) * 4, vmulq_n_f32(acc[r][c], a->scale));
}

/* acc[i][d] += sum_j st[j][i] * v[j][d] for II rows from i0, dims [d0, d0 + 4 * DC), keys
 * j < nj: one FMA chain per element in key order (the scalar tail below matches it) */
NE_INLINE void ne_att_pv(int II, int DC, const ops_att_block_args *a, int i0, int d0, int nj)
{
    float32x4_t acc[4][4];
    const int hd = a->hd;
    _Pragma("GCC unroll 4") for (int r = 0; r < II; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++) acc[r][c] = vld1q_f32(a->acc + (size_t)(i0 + r) * hd + d0 + c * 4);
    for (int j = 0; j < nj; j++) {
        float32x4_t vv[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++) vv[c] = vld1q_f32(a->v + (size_t)j * hd + d0 + c * 4);
        _Pragma("GCC unroll 4") for (int r = 0; r < II; r++) {
            float p = a->st[(size_t)j * a->nqp + i0 + r];
            _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++) acc[r][c] = vfmaq_n_f32(acc[r][c], vv[c], p);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < II; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++) vst1q_f32(a->acc + (size_t)(i0 + r) * hd + d0 + c * 4, acc[r][c]);
}

static void ne_att_block(const ops_att_block_args *a)
{
    const int hd = a->hd, nq = a->nq, nqp = a->nqp, nc = (nq + 3) / 4;
    for (int c0 = 0; c0 < nc; c0 += 4) {
        int cc = nc - c0 < 4 ? nc - c0 : 4;
        int jend = ops_att_lim_max(a->lim, c0 * 4, nq < (c0 + cc) * 4 ? nq : (c0 + cc) * 4);
        for (int j0 = 0; j0 < jend; j0 += 4) {
            int jj = jend - j0 < 4 ? jend - j0 : 4;
            switch (jj * 8 + cc) {
#define NE_ATT_QK(JJ, CC) case JJ * 8 + CC: ne_att_qk(JJ, CC, a, j0, c0); break;
            NE_ATT_QK(1, 1) NE_ATT_QK(1, 2) NE_ATT_QK(1, 3) NE_ATT_QK(1, 4)
            NE_ATT_QK(2, 1) NE_ATT_QK(2, 2) NE_ATT_QK(2, 3) NE_ATT_QK(2, 4)
            NE_ATT_QK(3, 1) NE_ATT_QK(3, 2) NE_ATT_QK(3, 3) NE_ATT_QK(3, 4)
            NE_ATT_QK(4, 1) NE_ATT_QK(4, 2) NE_ATT_QK(4, 3) NE_ATT_QK(4, 4)
#undef NE_ATT_QK
            default: break;
            }
        }
    }
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    for (int c = 0; c < nc; c++) {
        int live = nq - c * 4 < 4 ? nq - c * 4 : 4;
        int32_t lim4[4] = {0, 0, 0, 0};
        float m4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, s4[4] = {0, 0, 0, 0};
        for (int l = 0; l < live; l++) {
            lim4[l] = a->lim[c * 4 + l];
            m4[l] = a->m[c * 4 + l];
            s4[l] = a->s[c * 4 + l];
        }
        int32x4_t lim = vld1q_s32(lim4);
        float32x4_t M = vld1q_f32(m4), S = vld1q_f32(s4);
        int jend = ops_att_lim_max(a->lim, c * 4, c * 4 + live);
        float32x4_t mb = ninf;
        for (int j = 0; j < jend; j++) {
            uint32x4_t kj = vcgtq_s32(lim, vdupq_n_s32(j));
            float32x4_t sv = vld1q_f32(a->st + (size_t)j * nqp + c * 4);
            mb = vbslq_f32(kj, vmaxq_f32(mb, sv), mb);
        }
        uint32x4_t up = vcgtq_f32(mb, M);
        uint32x4_t resc = vandq_u32(up, vmvnq_u32(vceqq_f32(M, ninf)));
        if (vmaxvq_u32(resc)) {
            float ms[4];
            uint32_t rb[4];
            vst1q_f32(ms, ne_exp(vsubq_f32(M, mb)));
            vst1q_u32(rb, resc);
            S = vbslq_f32(resc, vmulq_f32(S, vld1q_f32(ms)), S);
            for (int l = 0; l < live; l++) {
                if (!rb[l]) continue;
                float *row = a->acc + (size_t)(c * 4 + l) * hd;
                for (int d = 0; d < hd; d++) row[d] *= ms[l];
            }
        }
        M = vbslq_f32(up, mb, M);
        for (int j = 0; j < jend; j++) {
            float *sp = a->st + (size_t)j * nqp + c * 4;
            uint32x4_t kj = vcgtq_s32(lim, vdupq_n_s32(j));
            float32x4_t p = vreinterpretq_f32_u32(vandq_u32(kj, vreinterpretq_u32_f32(ne_exp(vsubq_f32(vld1q_f32(sp), M)))));
            vst1q_f32(sp, p);
            S = vaddq_f32(S, p);
        }
        vst1q_f32(m4, M);
        vst1q_f32(s4, S);
        for (int l = 0; l < live; l++) {
            a->m[c * 4 + l] = m4[l];
            a->s[c * 4 + l] = s4[l];
        }
    }
    const int hd4 = hd & ~3;
    for (int i0 = 0; i0 < nq; i0 += 4) {
        int ii = nq - i0 < 4 ? nq - i0 : 4, nj = ops_att_lim_max(a->lim, i0, i0 + ii);
        for (int d0 = 0; d0 < hd4; d0 += 16) {
            int dc = hd4 - d0 >= 16 ? 4 : (hd4 - d0) / 4;
            switch (ii * 8 + dc) {
#define NE_ATT_PV(II, DC) case II * 8 + DC: ne_att_pv(II, DC, a, i0, d0, nj); break;
            NE_ATT_PV(1, 1) NE_ATT_PV(1, 2) NE_ATT_PV(1, 3) NE_ATT_PV(1, 4)
            NE_ATT_PV(2, 1) NE_ATT_PV(2, 2) NE_ATT_PV(2, 3) NE_ATT_PV(2, 4)
            NE_ATT_PV(3, 1) NE_ATT_PV(3, 2) NE_ATT_PV(3, 3) NE_ATT_PV(3, 4)
            NE_ATT_PV(4, 1) NE_ATT_PV(4, 2) NE_ATT_PV(4, 3) NE_ATT_PV(4, 4)
#undef NE_ATT_PV
            default: break;
            }
        }
        for (int r = 0; r < ii; r++)
            for (int d = hd4; d < hd; d++) {
                float *o = a->acc + (size_t)(i0 + r) * hd + d;
                for (int j = 0; j < nj; j++) *o = fmaf(a->v[(size_t)j * hd + d], a->st[(size_t)j * nqp + i0 + r], *o);
            }
    }
}

void ops_kernels_init_neon(ops_kernels *k)
{
    bool mmla = cpu_get_features()->i8mm;
    k->quant_q8_0 = ne_quant_q8_0;
    k->quant_q8_K = ne_quant_q8_K;
    k->gemm[QTYPE_Q8_0] = mmla ? ne_gemm_q8_0_mmla : ne_gemm_q8_0;
    k->gemm[QTYPE_Q4_0] = mmla ? ne_gemm_q4_0_mmla : ne_gemm_q4_0;
    k->gemm[QTYPE_MXFP4] = mmla ? ne_gemm_mxfp4_mmla : ne_gemm_mxfp4;
    k->gemm[QTYPE_Q4_K] = ne_gemm_q4_K;
    k->gemm[QTYPE_Q5_K] = ne_gemm_q5_K;
    k->gemm[QTYPE_Q6_K] = ne_gemm_q6_K;
    k->gemm[QTYPE_F32] = ne_gemm_f32;
    k->gemm[QTYPE_F16] = ne_gemm_f16;
    k->gemm[QTYPE_BF16] = ne_gemm_bf16;
    k->to_f16 = ne_to_f16;
    k->from_f16 = ne_from_f16;
    k->dot_f16_f32 = ne_dot_f16_f32;
    k->dot_f16 = ne_dot_f16;
    k->mad_f16 = ne_mad_f16;
    k->dot_f32 = ne_dot_f32;
    k->mad_f32 = ne_mad_f32;
    k->scale_f32 = ne_scale_f32;
    k->softmax_exp = ne_softmax_exp;
    k->max_f32 = ne_max_f32;
    k->rmsnorm_row = ne_rmsnorm_row;
    k->swiglu = ne_swiglu;
    k->add = ne_add;
    k->att_block = ne_att_block;
}
