/*
 * ops_iq: the scalar dot kernels of the codebook and ternary types (quant_iq.h) against Q8_K
 * activations, ggml's vec_dot_<type>_q8_K: exact integer sums per super-block, one float
 * chain per super-block as ggml's reference writes it (for IQ2_XXS: sumf += d_w*d_x * sum of
 * (2s+1) * dot over its sub-blocks, times 1/8 at the end). The SIMD levels (ops_iq_avx2.c)
 * compute the same integers and the same float chain, so they equal this level bit for bit.
 */
#include "model/ops_int.h"
#include "model/quant_grids.h"
#include "model/quant_iq.h"

/* The dot of 8 activations with an IQ2 grid entry under 8 sign bits. */
static inline int ops_iq_dot8(const int8_t *q8, uint64_t entry, uint8_t signs)
{
    int s = 0;
    for (int j = 0; j < 8; j++) {
        int v = (uint8_t)(entry >> 8 * j);
        s += (signs >> j & 1 ? -v : v) * q8[j];
    }
    return s;
}

/* The same for two 4-point IQ3 entries. */
static inline int ops_iq_dot4x2(const int8_t *q8, uint32_t g1, uint32_t g2, uint8_t signs)
{
    return ops_iq_dot8(q8, (uint64_t)g1 | (uint64_t)g2 << 32, signs);
}

static float ops_iq_dot_iq2_xxs(int64_t n, const block_iq2_xxs *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        int bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint16_t *q = w[b].qs + 4 * ib;
            uint32_t a0 = q[0] | (uint32_t)q[1] << 16, a1 = q[2] | (uint32_t)q[3] << 16;
            int sumi = 0;
            for (int l = 0; l < 4; l++, q8 += 8)
                sumi += ops_iq_dot8(q8, quant_grids_iq2xxs[a0 >> 8 * l & 255], quant_grids_ksigns[a1 >> 7 * l & 127]);
            bsum += sumi * (int)(2 * (a1 >> 28) + 1);
        }
        sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * (float)bsum;
    }
    return 0.125f * sumf;
}

static float ops_iq_dot_iq2_xs(int64_t n, const block_iq2_xs *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        int bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int sumi[2] = {0, 0};
            for (int l = 0; l < 4; l++, q8 += 8) {
                uint16_t q = w[b].qs[4 * ib + l];
                sumi[l / 2] += ops_iq_dot8(q8, quant_grids_iq2xs[q & 511], quant_grids_ksigns[q >> 9]);
            }
            bsum += sumi[0] * (2 * (w[b].scales[ib] & 0xf) + 1) + sumi[1] * (2 * (w[b].scales[ib] >> 4) + 1);
        }
        sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * (float)bsum;
    }
    return 0.125f * sumf;
}

static float ops_iq_dot_iq2_s(int64_t n, const block_iq2_s *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        int bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int sumi[2] = {0, 0};
            for (int l = 0; l < 4; l++, q8 += 8) {
                int idx = w[b].qs[4 * ib + l] | ((w[b].qh[ib] << (8 - 2 * l)) & 0x300);
                sumi[l / 2] += ops_iq_dot8(q8, quant_grids_iq2s[idx], w[b].qs[QK_K / 8 + 4 * ib + l]);
            }
            bsum += sumi[0] * (2 * (w[b].scales[ib] & 0xf) + 1) + sumi[1] * (2 * (w[b].scales[ib] >> 4) + 1);
        }
        sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * (float)bsum;
    }
    return 0.125f * sumf;
}

static float ops_iq_dot_iq3_xxs(int64_t n, const block_iq3_xxs *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        const uint8_t *q3 = w[b].qs, *sas = w[b].qs + QK_K / 4;
        int bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++, q3 += 8) {
            const uint8_t *s4 = sas + 4 * ib;
            uint32_t aux = s4[0] | (uint32_t)s4[1] << 8 | (uint32_t)s4[2] << 16 | (uint32_t)s4[3] << 24;
            int sumi = 0;
            for (int l = 0; l < 4; l++, q8 += 8)
                sumi += ops_iq_dot4x2(q8, quant_grids_iq3xxs[q3[2 * l]], quant_grids_iq3xxs[q3[2 * l + 1]],
                                      quant_grids_ksigns[aux >> 7 * l & 127]);
            bsum += sumi * (int)(2 * (aux >> 28) + 1);
        }
        sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * (float)bsum;
    }
    return 0.25f * sumf;
}

static float ops_iq_dot_iq3_s(int64_t n, const block_iq3_s *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        int bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint8_t *qs = w[b].qs + 8 * ib, *signs = w[b].signs + 4 * ib;
            int qh = w[b].qh[ib], sumi = 0;
            for (int l = 0; l < 4; l++, q8 += 8)
                sumi += ops_iq_dot4x2(q8, quant_grids_iq3s[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)],
                                      quant_grids_iq3s[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], signs[l]);
            bsum += sumi * (2 * ((w[b].scales[ib / 2] >> 4 * (ib % 2)) & 0xf) + 1);
        }
        sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * (float)bsum;
    }
    return sumf;
}

/* The dot of 8 activations with an IQ1 grid entry (int8 points -1, 0, 1). */
static inline int ops_iq_dot8_iq1(const int8_t *q8, uint64_t entry)
{
    int s = 0;
    for (int j = 0; j < 8; j++) s += (int8_t)(entry >> 8 * j) * q8[j];
    return s;
}

/* IQ1_S: d_w*d_x * (sum (2s+1) * dot + 1/8 * sum (2s+1) * delta_sign * bsum). */
static float ops_iq_dot_iq1_s(int64_t n, const block_iq1_s *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        int sumi = 0, sumi1 = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint16_t qh = w[b].qh[ib];
            int ls = 2 * ((qh >> 12) & 7) + 1, lsum = 0;
            for (int l = 0; l < 4; l++, q8 += 8)
                lsum += ops_iq_dot8_iq1(q8, quant_grids_iq1s[w[b].qs[4 * ib + l] | (((qh >> 3 * l) & 7) << 8)]);
            sumi += ls * lsum;
            sumi1 += ls * (qh & 0x8000 ? -1 : 1) * (x[b].bsums[2 * ib] + x[b].bsums[2 * ib + 1]);
        }
        sumf += quant_fp16_to_fp32(w[b].d) * x[b].d * ((float)sumi + QUANT_IQ1_DELTA * (float)sumi1);
    }
    return sumf;
}

/* IQ1_M: as IQ1_S with a scale per 16 and a delta sign per 8 elements. */
static float ops_iq_dot_iq1_m(int64_t n, const block_iq1_m *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        int sumi1 = 0, sumi2 = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint8_t *qs = w[b].qs + 4 * ib, *qh = w[b].qh + 2 * ib;
            uint16_t sc = (uint16_t)(w[b].scales[2 * (ib / 2)] | w[b].scales[2 * (ib / 2) + 1] << 8);
            int ls[2] = {2 * ((sc >> (6 * (ib % 2))) & 7) + 1, 2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1};
            for (int l = 0; l < 4; l++, q8 += 8) {
                int h = qh[l / 2] >> 4 * (l % 2), s8 = 0;
                for (int j = 0; j < 8; j++) s8 += q8[j];
                sumi1 += ls[l / 2] * ops_iq_dot8_iq1(q8, quant_grids_iq1s[qs[l] | ((h & 7) << 8)]);
                sumi2 += ls[l / 2] * (h & 8 ? -s8 : s8);
            }
        }
        sumf += quant_fp16_to_fp32(quant_iq1_m_scale(&w[b])) * x[b].d * ((float)sumi1 + QUANT_IQ1_DELTA * (float)sumi2);
    }
    return sumf;
}

/* TQ1_0: per super-block sum of (trit - 1) * q8, times d_w*d_x. */
static float ops_iq_dot_tq1_0(int64_t n, const block_tq1_0 *w, const block_q8_K *x)
{
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *q8 = x[b].qs;
        int sum = 0;
        for (int k = 0; k < 5; k++)
            for (int m = 0; m < 32; m++) sum += ((((uint8_t)(w[b].qs[m] * pow3[k]) * 3) >> 8) - 1) * q8[32 * k + m];
        for (int k = 0; k < 5; k++)
            for (int m = 0; m < 16; m++)
                sum += ((((uint8_t)(w[b].qs[32 + m] * pow3[k]) * 3) >> 8) - 1) * q8[160 + 16 * k + m];
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 4; j++) sum += ((((uint8_t)(w[b].qh[j] * pow3[k]) * 3) >> 8) - 1) * q8[240 + 4 * k + j];
        sumf += (float)sum * (quant_fp16_to_fp32(w[b].d) * x[b].d);
    }
    return sumf;
}

static float ops_iq_dot_tq2_0(int64_t n, const block_tq2_0 *w, const block_q8_K *x)
{
    float sumf = 0;
    for (int64_t b = 0; b < n / QK_K; b++) {
        int sumi = 0;
        for (int j = 0; j < 64; j += 32)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++) sumi += x[b].qs[4 * j + 32 * l + m] * (((w[b].qs[j + m] >> 2 * l) & 3) - 1);
        sumf += (float)sumi * (x[b].d * quant_fp16_to_fp32(w[b].d));
    }
    return sumf;
}

OPS_GEMM_OF_DOT(ops_iq_gemm_iq2_xxs, ops_iq_dot_iq2_xxs, block_iq2_xxs, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_iq2_xs, ops_iq_dot_iq2_xs, block_iq2_xs, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_iq2_s, ops_iq_dot_iq2_s, block_iq2_s, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_iq3_xxs, ops_iq_dot_iq3_xxs, block_iq3_xxs, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_iq3_s, ops_iq_dot_iq3_s, block_iq3_s, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_iq1_s, ops_iq_dot_iq1_s, block_iq1_s, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_iq1_m, ops_iq_dot_iq1_m, block_iq1_m, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_tq1_0, ops_iq_dot_tq1_0, block_tq1_0, block_q8_K)
OPS_GEMM_OF_DOT(ops_iq_gemm_tq2_0, ops_iq_dot_tq2_0, block_tq2_0, block_q8_K)

void ops_iq_init_scalar(ops_kernels *k)
{
    k->gemm[QTYPE_IQ2_XXS] = ops_iq_gemm_iq2_xxs;
    k->gemm[QTYPE_IQ2_XS] = ops_iq_gemm_iq2_xs;
    k->gemm[QTYPE_IQ2_S] = ops_iq_gemm_iq2_s;
    k->gemm[QTYPE_IQ3_XXS] = ops_iq_gemm_iq3_xxs;
    k->gemm[QTYPE_IQ3_S] = ops_iq_gemm_iq3_s;
    k->gemm[QTYPE_IQ1_S] = ops_iq_gemm_iq1_s;
    k->gemm[QTYPE_IQ1_M] = ops_iq_gemm_iq1_m;
    k->gemm[QTYPE_TQ1_0] = ops_iq_gemm_tq1_0;
    k->gemm[QTYPE_TQ2_0] = ops_iq_gemm_tq2_0;
}
