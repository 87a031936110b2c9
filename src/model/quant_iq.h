/*
 * quant_iq: the codebook ("i-") quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
 * and the ternary TQ1_0, TQ2_0: their block layouts (exactly ggml's), dequantisation, and the
 * quantisers that ggml can run without an importance matrix.
 *
 * All are super-blocks of 256 elements, multiplied against Q8_K activations as ggml does.
 * An i-quant stores groups of 8 (or 4) elements as an index into a grid of points
 * (quant_grids.h) plus signs, under a small odd scale per 16 or 32 elements and an fp16
 * scale per super-block. Dequantisation follows ggml's dequantize_row_* in the same float
 * operations and order, so that the values are bit-identical (test_quant pins them); the
 * quantisers are ggml's, byte for byte.
 */
#ifndef TM_QUANT_IQ_H
#define TM_QUANT_IQ_H

#include "model/quant.h"

/* IQ2_XXS: per 32 elements two uint32 (qs[4j], qs[4j+1] read as aux[0], aux[1]): byte l of
 * aux[0] indexes quant_grids_iq2xxs for elements 8l..8l+7, bits 7l..7l+6 of aux[1] their signs
 * (quant_grids_ksigns), bits 28..31 the scale s: value = d * (0.5 + s) * 0.25 * point * sign. */
typedef struct { fp16_t d; uint16_t qs[32]; } block_iq2_xxs;                       /* 66 */
/* IQ2_XS: per 8 elements a uint16: 9 bits of index into quant_grids_iq2xs, 7 sign bits;
 * per 16 a 4-bit scale (low then high nibble of scales[j] for sub-block j of 32). */
typedef struct { fp16_t d; uint16_t qs[32]; uint8_t scales[8]; } block_iq2_xs;      /* 74 */
/* IQ2_S: per 8 elements a byte of index (qs[0..31]) plus 2 high bits in qh[j] (bits 2l..2l+1
 * for group l of sub-block j), a sign byte (qs[32..63]); 4-bit scales as IQ2_XS. */
typedef struct { fp16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; } block_iq2_s; /* 82 */
/* IQ3_XXS: per 4 elements a byte index into quant_grids_iq3xxs (qs[0..63]); per 32 a uint32
 * (qs[64 + 4j]) of 4 x 7 sign bits and a 4-bit scale: value = d * (0.5 + s) * 0.5 * point. */
typedef struct { fp16_t d; uint8_t qs[96]; } block_iq3_xxs;                         /* 98 */
/* IQ3_S: per 4 elements 8 bits of index (qs) plus a ninth in qh, a sign bit per element
 * (signs), a 4-bit scale per 32: value = d * (1 + 2s) * point * sign. */
typedef struct { fp16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; } block_iq3_s; /* 110 */
/* IQ1_S: per 8 elements 8 bits of index into quant_grids_iq1s (qs) plus 3 in qh[j] (bits
 * 3l..3l+2); bits 12..14 of qh[j] the scale s of sub-block j, bit 15 the sign of its delta:
 * value = d * (2s + 1) * (point +- 0.125). */
typedef struct { fp16_t d; uint8_t qs[32]; uint16_t qh[8]; } block_iq1_s;           /* 50 */
/* IQ1_M: as IQ1_S's indices, the 3 high bits and delta sign per 8 elements in a nibble of qh;
 * a 3-bit scale per 16 elements in scales (four uint16 of 4 x 3 bits), whose top nibbles
 * together hold the fp16 super-block scale (quant_iq1_m_scale). */
typedef struct { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; } block_iq1_m;  /* 56 */
/* TQ1_0: ternary (-1, 0, 1 times d), five trits per byte in qs (elements of 32 / 16 byte
 * stripes), four per byte in qh; a trit is read as ((uint8)(byte * 3^n) * 3) >> 8. */
typedef struct { uint8_t qs[48]; uint8_t qh[4]; fp16_t d; } block_tq1_0;            /* 54 */
/* TQ2_0: ternary, 2 bits per element (value = (q - 1) * d); element 128n + 32l + m in bits
 * 2l..2l+1 of qs[32n + m]. */
typedef struct { uint8_t qs[64]; fp16_t d; } block_tq2_0;                           /* 66 */

#define QUANT_IQ1_DELTA 0.125f /* IQ1_S / IQ1_M: the shift of a sub-block's grid points */

/* IQ1_M's fp16 super-block scale from the top nibbles of its four uint16 scale words. */
static inline fp16_t quant_iq1_m_scale(const block_iq1_m *b)
{
    uint16_t sc[4];
    for (int i = 0; i < 4; i++) sc[i] = (uint16_t)(b->scales[2 * i] | b->scales[2 * i + 1] << 8);
    return (fp16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}

/* One of the types above (ggml ids 16-19, 21, 22, 29, 34, 35). */
bool quant_iq_type(int type);
/* Dequantises n (a multiple of 256) elements of type t, one of the above. */
void quant_iq_dequantize_row(qtype t, const void *src, float *dst, int64_t n);
/* Whether quant_iq_quantize_row writes t: TQ1_0, TQ2_0, IQ3_XXS, IQ3_S and IQ2_S. ggml
 * quantises IQ2_XXS, IQ2_XS and IQ1_S only with an importance matrix (llama-quantize refuses
 * without one), so no reference exists to match; IQ1_M's grid search is not ported. */
bool quant_iq_can_quantize(qtype t);
/* Quantises n (a multiple of 256) elements as ggml's quantize_<type> without an importance
 * matrix does, byte for byte; t must satisfy quant_iq_can_quantize. */
void quant_iq_quantize_row(qtype t, const float *src, void *dst, int64_t n);

#endif
