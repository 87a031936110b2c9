/*
 * quant: GGUF/ggml element types, fp16/bf16 conversion, row (de)quantisation.
 *
 * Everything here is the scalar reference. The quantisers reproduce ggml's
 * quantize_row_*_ref algorithms (ggml-quants.c) step by step, in the same float arithmetic
 * order, so that a file we quantise holds what llama.cpp would have written for the same
 * floats (modulo FMA contraction in its build). The activation quantisers (quant_act_*)
 * reproduce what llama.cpp's x86 CPU backend does to activations before a quantised dot
 * product, which differs from the file quantiser for Q8_0 (scale 127/amax and round half to
 * even, instead of 1/d and roundf).
 */
#include "model/quant.h"
#include "model/quant_iq.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

typedef struct {
    const char *name;       /* ggml's type name */
    int64_t block_elems;    /* elements per block */
    size_t block_bytes;     /* bytes per block */
    qtype vec_dot;          /* activation type for dot products */
} quant_traits;

static const quant_traits *quant_get_traits(int t)
{
    static const quant_traits tr_f32 = {"f32", 1, 4, QTYPE_F32};
    static const quant_traits tr_f16 = {"f16", 1, 2, QTYPE_F16};
    static const quant_traits tr_bf16 = {"bf16", 1, 2, QTYPE_BF16};
    static const quant_traits tr_i32 = {"i32", 1, 4, QTYPE_I32};
    static const quant_traits tr_q4_0 = {"q4_0", QK4_0, sizeof(block_q4_0), QTYPE_Q8_0};
    static const quant_traits tr_q4_1 = {"q4_1", 32, sizeof(block_q4_1), QTYPE_Q8_1};
    static const quant_traits tr_q5_0 = {"q5_0", 32, sizeof(block_q5_0), QTYPE_Q8_1};
    static const quant_traits tr_q5_1 = {"q5_1", 32, sizeof(block_q5_1), QTYPE_Q8_1};
    static const quant_traits tr_q8_1 = {"q8_1", 32, sizeof(block_q8_1), QTYPE_Q8_1};
    static const quant_traits tr_iq4_nl = {"iq4_nl", 32, sizeof(block_iq4_nl), QTYPE_Q8_1};
    static const quant_traits tr_q2_k = {"q2_K", QK_K, sizeof(block_q2_K), QTYPE_Q8_K};
    static const quant_traits tr_q3_k = {"q3_K", QK_K, sizeof(block_q3_K), QTYPE_Q8_K};
    static const quant_traits tr_iq4_xs = {"iq4_xs", QK_K, sizeof(block_iq4_xs), QTYPE_Q8_K};
    static const quant_traits tr_q8_0 = {"q8_0", QK8_0, sizeof(block_q8_0), QTYPE_Q8_0};
    static const quant_traits tr_mxfp4 = {"mxfp4", QK_MXFP4, sizeof(block_mxfp4), QTYPE_Q8_0};
    static const quant_traits tr_q4_k = {"q4_K", QK_K, sizeof(block_q4_K), QTYPE_Q8_K};
    static const quant_traits tr_q5_k = {"q5_K", QK_K, sizeof(block_q5_K), QTYPE_Q8_K};
    static const quant_traits tr_q6_k = {"q6_K", QK_K, sizeof(block_q6_K), QTYPE_Q8_K};
    static const quant_traits tr_q8_k = {"q8_K", QK_K, sizeof(block_q8_K), QTYPE_Q8_K};
    static const quant_traits tr_q8_0x16 = {"q8_0x16", 2 * QK8_0, sizeof(block_q8_0x16) / 16,
                                            QTYPE_Q8_0};
    static const quant_traits tr_q4_0x16 = {"q4_0x16", 2 * QK4_0, sizeof(block_q4_0x16) / 16,
                                            QTYPE_Q8_0};
    static const quant_traits tr_mxfp4x16 = {"mxfp4x16", 2 * QK_MXFP4, sizeof(block_mxfp4x16) / 16,
                                             QTYPE_Q8_0};
    static const quant_traits tr_q4_kx16 = {"q4_Kx16", QK_K, sizeof(block_q4_Kx16) / 16,
                                            QTYPE_Q8_K};
    static const quant_traits tr_q6_kx16 = {"q6_Kx16", QK_K, sizeof(block_q6_Kx16) / 16,
                                            QTYPE_Q8_K};
    static const quant_traits tr_iq[] = {
        {"iq2_xxs", QK_K, sizeof(block_iq2_xxs), QTYPE_Q8_K}, {"iq2_xs", QK_K, sizeof(block_iq2_xs), QTYPE_Q8_K},
        {"iq2_s", QK_K, sizeof(block_iq2_s), QTYPE_Q8_K},     {"iq3_xxs", QK_K, sizeof(block_iq3_xxs), QTYPE_Q8_K},
        {"iq3_s", QK_K, sizeof(block_iq3_s), QTYPE_Q8_K},     {"iq1_s", QK_K, sizeof(block_iq1_s), QTYPE_Q8_K},
        {"iq1_m", QK_K, sizeof(block_iq1_m), QTYPE_Q8_K},     {"tq1_0", QK_K, sizeof(block_tq1_0), QTYPE_Q8_K},
        {"tq2_0", QK_K, sizeof(block_tq2_0), QTYPE_Q8_K},
    };
    switch (t) {
    case QTYPE_F32: return &tr_f32;
    case QTYPE_I32: return &tr_i32;
    case QTYPE_F16: return &tr_f16;
    case QTYPE_BF16: return &tr_bf16;
    case QTYPE_Q4_0: return &tr_q4_0;
    case QTYPE_Q4_1: return &tr_q4_1;
    case QTYPE_Q5_0: return &tr_q5_0;
    case QTYPE_Q5_1: return &tr_q5_1;
    case QTYPE_Q8_1: return &tr_q8_1;
    case QTYPE_IQ4_NL: return &tr_iq4_nl;
    case QTYPE_Q2_K: return &tr_q2_k;
    case QTYPE_Q3_K: return &tr_q3_k;
    case QTYPE_IQ4_XS: return &tr_iq4_xs;
    case QTYPE_Q8_0: return &tr_q8_0;
    case QTYPE_MXFP4: return &tr_mxfp4;
    case QTYPE_Q4_K: return &tr_q4_k;
    case QTYPE_Q5_K: return &tr_q5_k;
    case QTYPE_Q6_K: return &tr_q6_k;
    case QTYPE_Q8_K: return &tr_q8_k;
    case QTYPE_Q8_0_X16: return &tr_q8_0x16;
    case QTYPE_Q4_0_X16: return &tr_q4_0x16;
    case QTYPE_MXFP4_X16: return &tr_mxfp4x16;
    case QTYPE_Q4_K_X16: return &tr_q4_kx16;
    case QTYPE_Q6_K_X16: return &tr_q6_kx16;
    case QTYPE_IQ2_XXS: return &tr_iq[0];
    case QTYPE_IQ2_XS: return &tr_iq[1];
    case QTYPE_IQ2_S: return &tr_iq[2];
    case QTYPE_IQ3_XXS: return &tr_iq[3];
    case QTYPE_IQ3_S: return &tr_iq[4];
    case QTYPE_IQ1_S: return &tr_iq[5];
    case QTYPE_IQ1_M: return &tr_iq[6];
    case QTYPE_TQ1_0: return &tr_iq[7];
    case QTYPE_TQ2_0: return &tr_iq[8];
    default: return NULL;
    }
}

_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 layout");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 layout");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl layout");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs layout");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K layout");

const int8_t quant_kvalues_iq4nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

void quant_q3_K_scales(const uint8_t packed[12], int8_t out[16])
{
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)(lo | (hi << 4));
    }
}

const int8_t quant_kvalues_mxfp4[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

float quant_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");
_Static_assert(sizeof(block_q8_0x16) == 1088, "block_q8_0x16 layout");
_Static_assert(sizeof(block_q4_0x16) == 576, "block_q4_0x16 layout");
_Static_assert(sizeof(block_mxfp4x16) == 544, "block_mxfp4x16 layout");
_Static_assert(sizeof(block_q4_Kx16) == 2368, "block_q4_Kx16 layout");
_Static_assert(sizeof(block_q6_Kx16) == 3392, "block_q6_Kx16 layout");

bool quant_type_supported(int type)
{
    return quant_get_traits(type) != NULL && type != QTYPE_Q8_0_X16 && type != QTYPE_Q4_0_X16 &&
           type != QTYPE_MXFP4_X16 && type != QTYPE_Q4_K_X16 && type != QTYPE_Q6_K_X16 &&
           type != QTYPE_I32;
}

bool quant_weight_type(int type)
{
    return quant_type_supported(type) && type != QTYPE_Q8_K && type != QTYPE_Q8_1;
}

const char *quant_ggml_type_name(int type)
{
    /* ggml.h's ids; the removed ones (4, 5, 31-33, 36-38) have no name */
    static const char *const names[] = {
        "f32", "f16", "q4_0", "q4_1", NULL, NULL, "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K",
        "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",
        "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m", "bf16", NULL, NULL, NULL,
        "tq1_0", "tq2_0", NULL, NULL, NULL, "mxfp4", "nvfp4", "q1_0", "q2_0",
    };
    return type >= 0 && type < (int)(sizeof names / sizeof names[0]) ? names[type] : NULL;
}

const char *quant_type_name(qtype t)
{
    const quant_traits *tr = quant_get_traits(t);
    return tr ? tr->name : "?";
}

int64_t quant_block_elems(qtype t)
{
    const quant_traits *tr = quant_get_traits(t);
    return tr ? tr->block_elems : 0;
}

size_t quant_block_bytes(qtype t)
{
    const quant_traits *tr = quant_get_traits(t);
    return tr ? tr->block_bytes : 0;
}

size_t quant_row_bytes(qtype t, int64_t n)
{
    const quant_traits *tr = quant_get_traits(t);
    if (!tr) return 0;
    return (size_t)(n / tr->block_elems) * tr->block_bytes;
}

qtype quant_vec_dot_type(qtype weights)
{
    const quant_traits *tr = quant_get_traits(weights);
    return tr ? tr->vec_dot : QTYPE_F32;
}

/* ---- fp16 / bf16 ---------------------------------------------------------------------- */

static inline uint32_t quant_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float quant_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float quant_fp16_to_fp32(fp16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return quant_u2f(sign | 0x7f800000 | (mant << 13));
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return quant_u2f(sign | ((exp + 112) << 23) | (mant << 13));
}

fp16_t quant_fp32_to_fp16(float f)
{
    uint32_t x = quant_f2u(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t a = x & 0x7fffffff;
    if (a > 0x7f800000) return (fp16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff)); /* quiet NaN */
    if (a >= 0x477ff000) return (fp16_t)(sign | 0x7c00); /* rounds to infinity */
    if (a < 0x38800000) {
        /* half subnormal or zero: adding 0.5f aligns the mantissa so that the FPU's round
         * to nearest even does the work (0.5f has ulp 2^-24, the half subnormal step) */
        float t = quant_u2f(a) + 0.5f;
        return (fp16_t)(sign | (quant_f2u(t) - 0x3f000000));
    }
    uint32_t odd = (a >> 13) & 1;
    a += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
    return (fp16_t)(sign | (a >> 13));
}

float quant_bf16_to_fp32(bf16_t h) { return quant_u2f((uint32_t)h << 16); }

bf16_t quant_fp32_to_bf16(float f)
{
    uint32_t x = quant_f2u(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (bf16_t)((x >> 16) | 64);
    return (bf16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

/* ---- helpers shared with ggml's algorithms -------------------------------------------- */

#define QUANT_GROUP_MAX_EPS 1e-15f


void quant_q4_K_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* ---- dequantisation ------------------------------------------------------------------- */

static void quant_dequant_q4_0(const block_q4_0 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK4_0; i++) {
        float d = quant_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[i * QK4_0 + j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[i * QK4_0 + j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void quant_dequant_mxfp4(const block_mxfp4 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        float d = quant_e8m0_half(x[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[i * QK_MXFP4 + j] = (float)quant_kvalues_mxfp4[x[i].qs[j] & 0x0F] * d;
            y[i * QK_MXFP4 + j + QK_MXFP4 / 2] = (float)quant_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

static void quant_dequant_q8_0(const block_q8_0 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d = quant_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = (float)x[i].qs[j] * d;
    }
}

static void quant_dequant_q4_K(const block_q4_K *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        float d = quant_fp16_to_fp32(x[i].d), min = quant_fp16_to_fp32(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            quant_q4_K_scale_min(is + 0, x[i].scales, &sc, &m);
            float d1 = d * sc, m1 = min * m;
            quant_q4_K_scale_min(is + 1, x[i].scales, &sc, &m);
            float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void quant_dequant_q5_K(const block_q5_K *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        float d = quant_fp16_to_fp32(x[i].d), min = quant_fp16_to_fp32(x[i].dmin);
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2) {
            quant_q4_K_scale_min(is + 0, x[i].scales, &sc, &m);
            float d1 = d * sc, m1 = min * m;
            quant_q4_K_scale_min(is + 1, x[i].scales, &sc, &m);
            float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((q[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            q += 32;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void quant_dequant_q6_K(const block_q6_K *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = quant_fp16_to_fp32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int k = 0; k < QK_K; k += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

static void quant_dequant_q4_1(const block_q4_1 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        float d = quant_fp16_to_fp32(x[i].d), m = quant_fp16_to_fp32(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (x[i].qs[j] & 0x0F) * d + m;
            y[j + 16] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

static inline uint32_t quant_qh32(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void quant_dequant_q5_0(const block_q5_0 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        float d = quant_fp16_to_fp32(x[i].d);
        uint32_t qh = quant_qh32(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int x0 = ((x[i].qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
            int x1 = ((x[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

static void quant_dequant_q5_1(const block_q5_1 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        float d = quant_fp16_to_fp32(x[i].d), m = quant_fp16_to_fp32(x[i].m);
        uint32_t qh = quant_qh32(x[i].qh);
        for (int j = 0; j < 16; j++) {
            int x0 = (x[i].qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
            int x1 = (x[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

static void quant_dequant_q8_1(const block_q8_1 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++) {
        float d = quant_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 32; j++) *y++ = x[i].qs[j] * d;
    }
}

static void quant_dequant_iq4_nl(const block_iq4_nl *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        float d = quant_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * quant_kvalues_iq4nl[x[i].qs[j] & 0xf];
            y[j + 16] = d * quant_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

static void quant_dequant_iq4_xs(const block_iq4_xs *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = quant_fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32, qs += 16) {
            float dl = d * (quant_iq4_xs_scale(&x[i], ib) - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * quant_kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * quant_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

static void quant_dequant_q2_K(const block_q2_K *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = quant_fp16_to_fp32(x[i].d), min = quant_fp16_to_fp32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int k = 0; k < QK_K; k += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2) {
                uint8_t sc = x[i].scales[is++];
                float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[l] >> shift) & 3) - ml;
                sc = x[i].scales[is++];
                dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16] >> shift) & 3) - ml;
            }
    }
}

static void quant_dequant_q3_K(const block_q3_K *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d_all = quant_fp16_to_fp32(x[i].d);
        int8_t sc[16];
        quant_q3_K_scales(x[i].scales, sc);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int k = 0; k < QK_K; k += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                float dl = d_all * (sc[is++] - 32);
                for (int l = 0; l < 16; l++) *y++ = dl * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                dl = d_all * (sc[is++] - 32);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
            }
    }
}

static void quant_dequant_q8_K(const block_q8_K *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}

void quant_dequantize_row(qtype t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case QTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case QTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = quant_fp16_to_fp32(((const fp16_t *)src)[i]);
        break;
    case QTYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_fp32(((const bf16_t *)src)[i]);
        break;
    case QTYPE_Q4_0: quant_dequant_q4_0(src, dst, n); break;
    case QTYPE_Q4_1: quant_dequant_q4_1(src, dst, n); break;
    case QTYPE_Q5_0: quant_dequant_q5_0(src, dst, n); break;
    case QTYPE_Q5_1: quant_dequant_q5_1(src, dst, n); break;
    case QTYPE_Q8_1: quant_dequant_q8_1(src, dst, n); break;
    case QTYPE_IQ4_NL: quant_dequant_iq4_nl(src, dst, n); break;
    case QTYPE_IQ4_XS: quant_dequant_iq4_xs(src, dst, n); break;
    case QTYPE_Q2_K: quant_dequant_q2_K(src, dst, n); break;
    case QTYPE_Q3_K: quant_dequant_q3_K(src, dst, n); break;
    case QTYPE_Q8_0: quant_dequant_q8_0(src, dst, n); break;
    case QTYPE_MXFP4: quant_dequant_mxfp4(src, dst, n); break;
    case QTYPE_Q4_K: quant_dequant_q4_K(src, dst, n); break;
    case QTYPE_Q5_K: quant_dequant_q5_K(src, dst, n); break;
    case QTYPE_Q6_K: quant_dequant_q6_K(src, dst, n); break;
    case QTYPE_Q8_K: quant_dequant_q8_K(src, dst, n); break;
    default: quant_iq_dequantize_row(t, src, dst, n); break;
    }
}

/* ---- reference quantisers (ggml's quantize_row_*_ref) ---------------------------------- */

static void quant_ref_q4_0(const float *x, block_q4_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK4_0; i++) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            float v = x[i * QK4_0 + j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        float d = max / -8;
        float id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            float x0 = x[i * QK4_0 + j] * id;
            float x1 = x[i * QK4_0 + QK4_0 / 2 + j] * id;
            int8_t t0 = (int8_t)(x0 + 8.5f), t1 = (int8_t)(x1 + 8.5f);
            uint8_t xi0 = (uint8_t)(t0 < 15 ? t0 : 15);
            uint8_t xi1 = (uint8_t)(t1 < 15 ? t1 : 15);
            y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

static void quant_ref_q8_0(const float *x, block_q8_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[i * QK8_0 + j]));
        float d = amax / ((1 << 7) - 1);
        float id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[i * QK8_0 + j] * id);
    }
}

/* ggml's quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127, each value the nearest
 * doubled E2M1 level times 2^(e - 128) (the first of equally near ones). */
static int quant_mxfp4_best(float x, float d)
{
    int best = 0;
    float err = fabsf(quant_kvalues_mxfp4[0] * d - x);
    for (int i = 1; i < 16; i++) {
        float e = fabsf(quant_kvalues_mxfp4[i] * d - x);
        if (e < err) best = i, err = e;
    }
    return best;
}

static void quant_ref_mxfp4(const float *x, block_mxfp4 *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[i * QK_MXFP4 + j])) amax = fabsf(x[i * QK_MXFP4 + j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = quant_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            int x0 = quant_mxfp4_best(x[i * QK_MXFP4 + j], d);
            int x1 = quant_mxfp4_best(x[i * QK_MXFP4 + QK_MXFP4 / 2 + j], d);
            y[i].qs[j] = (uint8_t)(x0 | (x1 << 4));
        }
    }
}

/* ggml's make_qkx2_quants: asymmetric (scale, min) fit of n values to [0, nmax] levels,
 * minimising the weighted squared error over a small search of scales. */
static float quant_make_qkx2(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                             float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                             bool use_mad)
{
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = quant_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = quant_nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* One super-block of the k-quants with a min (Q4_K: nmax 15, Q5_K: 31), as ggml's
 * quantize_row_q{4,5}_K_ref: per 32-column sub-block a weighted scale and min
 * (quant_make_qkx2), both 6-bit against the super-block's d and dmin, then each value's level
 * 0..nmax against the rounded scale and min into L. */
static void quant_ref_kmin(const float *x, int nmax, float rmin, int nstep, uint8_t scales12[12], fp16_t *d_out,
                           fp16_t *dmin_out, uint8_t L[QK_K])
{
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = quant_make_qkx2(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep,
                                    false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales12, 0, 12);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)quant_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)quant_nearest_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            scales12[j] = ls;
            scales12[j + 4] = lm;
        } else {
            scales12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales12[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = quant_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = quant_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        quant_q4_K_scale_min(j, scales12, &sc, &m);
        float d = quant_fp16_to_fp32(*d_out) * sc;
        if (!d) continue;
        float dm = quant_fp16_to_fp32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) {
            int l = quant_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

static void quant_ref_q4_K(const float *x, block_q4_K *y, int64_t n)
{
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quant_ref_kmin(x, 15, -1.f, 20, y[i].scales, &y[i].d, &y[i].dmin, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            q += 32;
        }
        x += QK_K;
    }
}

static void quant_ref_q5_K(const float *x, block_q5_K *y, int64_t n)
{
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quant_ref_kmin(x, 31, -0.5f, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
        uint8_t *q = y[i].qs, *qh = y[i].qh, m1 = 1, m2 = 2;
        memset(qh, 0, QK_K / 8);
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[j + l], l2 = L[j + l + 32];
                if (l1 > 15) l1 -= 16, qh[l] |= m1;
                if (l2 > 15) l2 -= 16, qh[l] |= m2;
                q[l] = (uint8_t)(l1 | (l2 << 4));
            }
            q += 32;
            m1 <<= 2;
            m2 <<= 2;
        }
        x += QK_K;
    }
}

/* ggml's make_qx_quants with rmse_type 1 and no importance weights: symmetric scale for n
 * values onto [-nmax, nmax-1], searched over 19 candidate scales. Returns the scale. */
static float quant_make_qx(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < QUANT_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = quant_nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = quant_nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = quant_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void quant_ref_q6_K(const float *x, block_q6_K *y, int64_t n)
{
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            float scale = quant_make_qx(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            float abs_scale = fabsf(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < QUANT_GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(block_q6_K));
            x += QK_K;
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = quant_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            int v = quant_nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            float d = quant_fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = quant_nearest_int(x[16 * j + ii] / d);
                l = l < -32 ? -32 : l > 31 ? 31 : l;
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; l++) {
                uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
                uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
        x += QK_K;
    }
}

static void quant_ref_q4_1(const float *x, block_q4_1 *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float d = (max - min) / 15, id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_fp32_to_fp16(d);
        y[i].m = quant_fp32_to_fp16(min);
        for (int j = 0; j < 16; j++) {
            int8_t t0 = (int8_t)((x[j] - min) * id + 0.5f), t1 = (int8_t)((x[j + 16] - min) * id + 0.5f);
            uint8_t q0 = (uint8_t)(t0 < 15 ? t0 : 15), q1 = (uint8_t)(t1 < 15 ? t1 : 15);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quant_put_qh32(uint8_t qh[4], uint32_t v)
{
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(v >> 8 * k);
}

static void quant_ref_q5_0(const float *x, block_q5_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float d = max / -16, id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int8_t t0 = (int8_t)(x[j] * id + 16.5f), t1 = (int8_t)(x[j + 16] * id + 16.5f);
            uint8_t q0 = (uint8_t)(t0 < 31 ? t0 : 31), q1 = (uint8_t)(t1 < 31 ? t1 : 31);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + 16);
        }
        quant_put_qh32(y[i].qh, qh);
    }
}

static void quant_ref_q5_1(const float *x, block_q5_1 *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float d = (max - min) / 31, id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_fp32_to_fp16(d);
        y[i].m = quant_fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            uint8_t q0 = (uint8_t)((x[j] - min) * id + 0.5f), q1 = (uint8_t)((x[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + 16);
        }
        quant_put_qh32(y[i].qh, qh);
    }
}

/* Q2_K and Q3_K: element 128n + 32k + l of L (0..3) into bits 2k of qs[32n + l]. */
static void quant_pack_2bit(const uint8_t *L, uint8_t qs[64])
{
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

static void quant_ref_q2_K(const float *x, block_q2_K *y, int64_t n)
{
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = quant_make_qkx2(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)quant_nearest_int(iscale * scales[j]);
            y[i].d = quant_fp32_to_fp16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = quant_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] |= (uint8_t)(quant_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = quant_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = quant_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = quant_fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = quant_fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                int l = quant_nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)(l < 0 ? 0 : l > 3 ? 3 : l);
            }
        }
        quant_pack_2bit(L, y[i].qs);
    }
}

/* ggml's make_q3_quants with do_rmse: symmetric levels [-nmax, nmax-1], then up to 5 passes
 * that move single values to a better level. Returns the scale; L holds level + nmax. */
static float quant_make_q3(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < QUANT_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = quant_nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = quant_nearest_int(x[i] * sl2 / slx);
                new_l = new_l < -nmax ? -nmax : new_l > nmax - 1 ? nmax - 1 : new_l;
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static void quant_ref_q3_K(const float *x, block_q3_K *y, int64_t n)
{
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = quant_make_q3(16, 4, x + 16 * j, L + 16 * j);
            float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int8_t l = (int8_t)quant_nearest_int(iscale * scales[j]);
                l = (int8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                l >>= 4;
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = quant_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = quant_fp32_to_fp16(0.f);
        }
        int8_t sc[16];
        quant_q3_K_scales(y[i].scales, sc);
        for (int j = 0; j < QK_K / 16; j++) {
            float d = quant_fp16_to_fp32(y[i].d) * (sc[j] - 32);
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = quant_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)((l < -4 ? -4 : l > 3 ? 3 : l) + 4);
            }
        }
        memset(y[i].hmask, 0, QK_K / 8);
        for (int j = 0; j < QK_K; j++)
            if (L[j] > 3) {
                y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
                L[j] -= 4;
            }
        quant_pack_2bit((const uint8_t *)L, y[i].qs);
    }
}

/* ggml's best_index_int8: the nearest of n sorted values (the lower on a tie). */
static int quant_best_index(int n, const int8_t *val, float x)
{
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* ggml's quantize_row_iq4_nl_impl without importance weights and with ntry 7, as
 * quantize_iq4_nl / quantize_iq4_xs run it for llama-quantize (the _ref entry points pass
 * ntry -1, a cruder search no file is written with). sb: 32 (IQ4_NL) or QK_K (IQ4_XS); for
 * QK_K, scales_h / scales_l receive the 6-bit sub-block scales. */
static void quant_iq4_impl(int sb, const float *x, fp16_t *dh, uint8_t *q4, uint16_t *scales_h,
                           uint8_t *scales_l)
{
    const int8_t *values = quant_kvalues_iq4nl;
    const int ntry = 7;
    uint8_t L[QK_K];
    float weight[32], scales[QK_K / 32];
    memset(q4, 0, (size_t)sb / 2);
    *dh = quant_fp32_to_fp16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < sb / 32; ib++) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        if (amax < QUANT_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0], id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            int l = quant_best_index(16, values, id * xb[j]);
            Lb[j] = (uint8_t)l;
            float q = values[l], w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                float q = values[quant_best_index(16, values, id * xb[j])], w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale = d;
        }
    }
    if (sb > 32) {
        *scales_h = 0;
        float d = -max_scale / 32;
        *dh = quant_fp32_to_fp16(d);
        float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < sb / 32; ib++) {
            int l = quant_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            float dl = d * l, idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[ib * 32 + j] = (uint8_t)quant_best_index(16, values, idl * x[ib * 32 + j]);
            l += 32;
            uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        *dh = quant_fp32_to_fp16(scales[0]);
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < sb; j++) L[j] = (uint8_t)quant_best_index(16, values, id * x[j]);
    }
    for (int i = 0; i < sb / 32; i++)
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void quant_ref_iq4_nl(const float *x, block_iq4_nl *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++) quant_iq4_impl(32, x + 32 * i, &y[i].d, y[i].qs, NULL, NULL);
}

static void quant_ref_iq4_xs(const float *x, block_iq4_xs *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++)
        quant_iq4_impl(QK_K, x + QK_K * i, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l);
}

void quant_act_q8_1(const float *x, block_q8_1 *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.f;
        y[i].d = quant_fp32_to_fp16(d);
        float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = (int8_t)quant_nearest_int(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = quant_fp32_to_fp16(d * (float)sum);
    }
}

void quant_act_q8_K(const float *x, block_q8_K *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            memset(y[i].bsums, 0, sizeof y[i].bsums);
            x += QK_K;
            continue;
        }
        float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = quant_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
        x += QK_K;
    }
}

/* x86 llama.cpp (quantize_row_q8_0 with AVX/AVX2): amax over the block, d = amax/127 stored
 * as fp16, values multiplied by 127/amax and rounded half to even. */
void quant_act_q8_0(const float *x, block_q8_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.f;
        y[i].d = quant_fp32_to_fp16(d);
        float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)quant_nearest_int(x[j] * id);
        x += QK8_0;
    }
}

void quant_quantize_row(qtype t, const float *src, void *dst, int64_t n)
{
    switch (t) {
    case QTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case QTYPE_F16:
        for (int64_t i = 0; i < n; i++) ((fp16_t *)dst)[i] = quant_fp32_to_fp16(src[i]);
        break;
    case QTYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((bf16_t *)dst)[i] = quant_fp32_to_bf16(src[i]);
        break;
    case QTYPE_Q4_0: quant_ref_q4_0(src, dst, n); break;
    case QTYPE_Q4_1: quant_ref_q4_1(src, dst, n); break;
    case QTYPE_Q5_0: quant_ref_q5_0(src, dst, n); break;
    case QTYPE_Q5_1: quant_ref_q5_1(src, dst, n); break;
    case QTYPE_Q8_1: quant_act_q8_1(src, dst, n); break;
    case QTYPE_IQ4_NL: quant_ref_iq4_nl(src, dst, n); break;
    case QTYPE_IQ4_XS: quant_ref_iq4_xs(src, dst, n); break;
    case QTYPE_Q2_K: quant_ref_q2_K(src, dst, n); break;
    case QTYPE_Q3_K: quant_ref_q3_K(src, dst, n); break;
    case QTYPE_Q8_0: quant_ref_q8_0(src, dst, n); break;
    case QTYPE_MXFP4: quant_ref_mxfp4(src, dst, n); break;
    case QTYPE_Q4_K: quant_ref_q4_K(src, dst, n); break;
    case QTYPE_Q5_K: quant_ref_q5_K(src, dst, n); break;
    case QTYPE_Q6_K: quant_ref_q6_K(src, dst, n); break;
    case QTYPE_Q8_K: quant_act_q8_K(src, dst, n); break;
    default: quant_iq_quantize_row(t, src, dst, n); break;
    }
}

/* ---- repacking (see block_q4_Kx16) ----------------------------------------------------- */

qtype quant_repack_type(qtype t)
{
    switch (t) {
    case QTYPE_Q8_0: return QTYPE_Q8_0_X16;
    case QTYPE_Q4_0: return QTYPE_Q4_0_X16;
    case QTYPE_MXFP4: return QTYPE_MXFP4_X16;
    case QTYPE_Q4_K: return QTYPE_Q4_K_X16;
    case QTYPE_Q6_K: return QTYPE_Q6_K_X16;
    default: return t;
    }
}

static void quant_repack_q4_K(const block_q4_K *const src[16], block_q4_Kx16 *y)
{
    for (int i = 0; i < 16; i++) {
        const block_q4_K *x = src[i];
        y->d[i] = x->d;
        y->dmin[i] = x->dmin;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_q4_K_scale_min(j, x->scales, &sc, &m);
            y->sc[j][i] = sc;
            y->m[j / 2][i][j % 2] = m;
        }
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 8; k++) memcpy(y->qs[c][k][i], x->qs + 32 * c + 4 * k, 4);
    }
}

static void quant_repack_q6_K(const block_q6_K *const src[16], block_q6_Kx16 *y)
{
    for (int i = 0; i < 16; i++) {
        const block_q6_K *x = src[i];
        uint8_t q[QK_K]; /* 0..63 */
        const uint8_t *ql = x->ql, *qh = x->qh;
        for (int k = 0; k < QK_K; k += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                q[k + l + 0] = (uint8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4));
                q[k + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
                q[k + l + 64] = (uint8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4));
                q[k + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        for (int g = 0; g < 16; g++) {
            for (int p = 0; p < 3; p++)
                for (int l = 0; l < 4; l++) {
                    uint8_t u3 = q[16 * g + 12 + l];
                    y->q[g][p][i][l] = (uint8_t)(q[16 * g + 4 * p + l] | (((u3 >> (2 * p)) & 3) << 6));
                }
            y->sc[g / 2][i][g % 2] = x->scales[g];
        }
        y->d[i] = quant_fp16_to_fp32(x->d);
    }
}

static void quant_repack_q8_0(const block_q8_0 *const src[16], block_q8_0x16 *y)
{
    for (int i = 0; i < 16; i++)
        for (int h = 0; h < 2; h++) {
            const block_q8_0 *x = src[i] + h;
            y->d[h][i] = x->d;
            for (int j = 0; j < QK8_0; j++) y->qs[h][j / 4][i][j % 4] = (uint8_t)(x->qs[j] ^ 0x80);
        }
}

static void quant_repack_q4_0(const block_q4_0 *const src[16], block_q4_0x16 *y)
{
    for (int i = 0; i < 16; i++)
        for (int h = 0; h < 2; h++) {
            const block_q4_0 *x = src[i] + h;
            y->d[h][i] = x->d;
            for (int k = 0; k < 4; k++) memcpy(y->qs[h][k][i], x->qs + 4 * k, 4);
        }
}

static void quant_repack_mxfp4(const block_mxfp4 *const src[16], block_mxfp4x16 *y)
{
    for (int i = 0; i < 16; i++)
        for (int h = 0; h < 2; h++) {
            const block_mxfp4 *x = src[i] + h;
            y->e[h][i] = x->e;
            for (int k = 0; k < 4; k++) memcpy(y->qs[h][k][i], x->qs + 4 * k, 4);
        }
}

void quant_repack(qtype t, const void *src, void *dst, int64_t cols, int64_t r0, int64_t r1)
{
    size_t rb = quant_row_bytes(t, cols);
    if (t == QTYPE_Q8_0 || t == QTYPE_Q4_0 || t == QTYPE_MXFP4) {
        int64_t np = cols / 64;
        for (int64_t r = r0; r + 16 <= r1; r += 16)
            for (int64_t p = 0; p < np; p++) {
                const block_q8_0 *s8[16];
                const block_q4_0 *s4[16];
                const block_mxfp4 *sm[16];
                for (int i = 0; i < 16; i++) {
                    const char *row = (const char *)src + (size_t)(r + i) * rb;
                    s8[i] = (const block_q8_0 *)row + 2 * p;
                    s4[i] = (const block_q4_0 *)row + 2 * p;
                    sm[i] = (const block_mxfp4 *)row + 2 * p;
                }
                if (t == QTYPE_Q8_0) quant_repack_q8_0(s8, (block_q8_0x16 *)dst + (r / 16) * np + p);
                else if (t == QTYPE_Q4_0) quant_repack_q4_0(s4, (block_q4_0x16 *)dst + (r / 16) * np + p);
                else quant_repack_mxfp4(sm, (block_mxfp4x16 *)dst + (r / 16) * np + p);
            }
        return;
    }
    int64_t nb = cols / QK_K;
    for (int64_t r = r0; r + 16 <= r1; r += 16)
        for (int64_t b = 0; b < nb; b++) {
            if (t == QTYPE_Q4_K) {
                const block_q4_K *s[16];
                for (int i = 0; i < 16; i++)
                    s[i] = (const block_q4_K *)((const char *)src + (size_t)(r + i) * rb) + b;
                quant_repack_q4_K(s, (block_q4_Kx16 *)dst + (r / 16) * nb + b);
            } else if (t == QTYPE_Q6_K) {
                const block_q6_K *s[16];
                for (int i = 0; i < 16; i++)
                    s[i] = (const block_q6_K *)((const char *)src + (size_t)(r + i) * rb) + b;
                quant_repack_q6_K(s, (block_q6_Kx16 *)dst + (r / 16) * nb + b);
            }
        }
}
