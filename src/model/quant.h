/*
 * quant: the tensor element types of GGUF/ggml (ids and block layouts exactly as llama.cpp
 * writes them), conversion of rows to and from float, and the reference quantisers.
 *
 * A quantised row of n elements is n / block_elems blocks of block_bytes each. Weight rows are
 * multiplied against activations quantised to the weight type's "vec dot type" (Q8_0 for
 * Q4_0/Q8_0/MXFP4, Q8_1 for Q4_1/Q5_1 and also Q5_0/IQ4_NL, Q8_K for the k-quants, IQ4_XS and
 * the codebook and ternary types (quant_iq.h),
 * F16 for F16, BF16 for BF16, F32 for F32), as llama.cpp's CPU backend does, so that our results
 * agree with it to rounding. ggml takes Q8_0 activations for Q5_0 and IQ4_NL; Q8_1 holds the
 * same scale and values (plus a sum they ignore) and keeps one plain block format at every
 * SIMD level (the AVX-512 level's Q8_0 rows have their own layout, see ops_avx512.c).
 */
#ifndef TM_QUANT_H
#define TM_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef enum {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q5_1 = 7,
    QTYPE_Q8_0 = 8,
    QTYPE_Q8_1 = 9,       /* activations only */
    QTYPE_Q2_K = 10,
    QTYPE_Q3_K = 11,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_Q8_K = 15,      /* activations only */
    QTYPE_IQ4_NL = 20,    /* 4-bit codes into a non-linear table (quant_kvalues_iq4nl) */
    QTYPE_IQ4_XS = 23,    /* IQ4_NL codes, 6-bit scales per 32 under an fp16 per 256 */
    QTYPE_I32 = 26,       /* 32-bit integers (lookup tables such as DeepSeek V4's tid2eid): a
                           * file may hold them, no kernel reads them as a matrix */
    QTYPE_BF16 = 30,
    QTYPE_MXFP4 = 39,     /* OCP microscaling FP4: E2M1 values, an E8M0 scale per 32 */
    /* the codebook and ternary types (quant_iq.h) */
    QTYPE_IQ2_XXS = 16,
    QTYPE_IQ2_XS = 17,
    QTYPE_IQ3_XXS = 18,
    QTYPE_IQ1_S = 19,
    QTYPE_IQ3_S = 21,
    QTYPE_IQ2_S = 22,
    QTYPE_IQ1_M = 29,
    QTYPE_TQ1_0 = 34,
    QTYPE_TQ2_0 = 35,
    /* repacked layouts (quant_repack; in memory only, never read from a file) */
    QTYPE_MXFP4_X16 = 59,
    QTYPE_Q4_0_X16 = 60,
    QTYPE_Q8_0_X16 = 61,
    QTYPE_Q4_K_X16 = 62,
    QTYPE_Q6_K_X16 = 63,
    QTYPE_COUNT_MAX = 64, /* ids below this may appear in files; only the above are supported */
} qtype;

typedef uint16_t fp16_t;  /* IEEE half, bit pattern */
typedef uint16_t bf16_t;  /* bfloat16, bit pattern */

#define QK8_0 32
#define QK4_0 32
#define QK_K 256
#define QK_MXFP4 32

typedef struct { fp16_t d; int8_t qs[QK8_0]; } block_q8_0;                       /* 34 bytes */
typedef struct { fp16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;                  /* 18 bytes */
/* The legacy 32-element types: element j in the low nibble of qs[j], j + 16 in the high one;
 * the 5-bit ones keep bit 4 of element j in bit j of qh (little-endian uint32). _1 types add
 * a min m: value = q * d + m (q unsigned); _0 types are signed: (q - 8) * d, (q - 16) * d. */
typedef struct { fp16_t d, m; uint8_t qs[16]; } block_q4_1;                       /* 20 bytes */
typedef struct { fp16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;           /* 22 bytes */
typedef struct { fp16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1;        /* 24 bytes */
/* Q8_1: Q8_0 plus s = d * sum(qs) (d before its fp16 rounding), for the _1 types' min term. */
typedef struct { fp16_t d, s; int8_t qs[32]; } block_q8_1;                        /* 36 bytes */
/* IQ4_NL: Q4_0's layout with codes into quant_kvalues_iq4nl: value = kvalues[code] * d. */
typedef struct { fp16_t d; uint8_t qs[16]; } block_iq4_nl;                        /* 18 bytes */
/* IQ4_XS: 8 sub-blocks of 32; sub-block j's 6-bit scale ls (value = (ls - 32) * d *
 * kvalues[code]) has its low 4 bits in nibble j%2 of scales_l[j/2] and its high 2 bits in bits
 * 2j..2j+1 of scales_h; qs as IQ4_NL's per sub-block (16 bytes each). */
typedef struct { fp16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } block_iq4_xs; /* 136 */
/* Q2_K: 16 sub-blocks of 16; scales[j] holds sub-block j's 4-bit scale (low) and min (high):
 * value = d * sc * q - dmin * m. Element 128n + 32k + l is bits 2k..2k+1 of qs[32n + l]. */
typedef struct { uint8_t scales[16]; uint8_t qs[64]; fp16_t d, dmin; } block_q2_K; /* 84 */
/* Q3_K: 16 sub-blocks of 16 with signed 6-bit scales (packed in 12 bytes, quant_q3_K_scales);
 * element 128n + 32k + l: low 2 bits as Q2_K's, high bit in bit 4n + k of hmask[l], value =
 * d * (sc - 32) * (low + 4 * high - 4). */
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; fp16_t d; } block_q3_K; /* 110 */
/* MXFP4 (ggml's layout): e is the block's E8M0 exponent, qs the 4-bit E2M1 codes, element j
 * in the low nibble of qs[j] and element j + 16 in the high one. ggml stores the values
 * doubled (quant_kvalues_mxfp4: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives, so they are
 * integers) and halves the scale to match: value = kvalues[code] * 2^(e - 128). */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;            /* 17 bytes */
typedef struct { fp16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K; /* 144 */
/* Q5_K: Q4_K's scales and mins, the low 4 bits of each value in qs (as Q4_K's), and its fifth
 * bit in qh: bit j of qh[l] is the high bit of column 32j + l (sub-block j). */
typedef struct { fp16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K; /* 176 */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; fp16_t d; } block_q6_K; /* 210 */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K; /* 292 */

/* Repacked k-quant layouts: 16 consecutive rows interleaved, one super-block (256 columns)
 * of all 16 rows per struct, so that a SIMD kernel computes 16 rows at once with one int32
 * lane per row (AVX-512 vpdpbusd: a 64-byte vector holds 4 columns of 16 rows) and the
 * scales need no unpacking. A matrix of `rows` (a multiple of 16) rows and nb super-blocks
 * per row is rows/16 groups of nb structs, group-major; per row that is 4 bytes per super-block
 * more than Q4_K and 2 more than Q6_K (quant_row_bytes gives it per row).
 * The values are the original ones, re-arranged: a kernel computes exactly what the
 * original layout gives. */
typedef struct {
    fp16_t d[16];            /* super-block scale per row */
    fp16_t dmin[16];         /* super-block min scale per row */
    uint8_t sc[8][16];       /* [sub-block j][row]: 6-bit scale of columns 32j..32j+31 */
    uint8_t m[4][16][2];     /* [j/2][row][j%2]: 6-bit min of sub-block j */
    uint8_t qs[4][8][16][4]; /* [c][k][row][i]: byte 32c+4k+i of the row's Q4_K qs: low nibble
                              * column 64c+4k+i, high nibble column 64c+32+4k+i */
} block_q4_Kx16; /* 2368 */
typedef struct {
    /* The scales come first, as in every other repacked layout: a kernel then reads each
     * struct in ascending address order, which the hardware prefetcher follows (with them
     * after the values, every struct began with a jump back 3 KiB). */
    float d[16];             /* super-block scale per row (the fp16 value, widened: keeps the
                              * struct a multiple of 64 bytes) */
    int8_t sc[8][16][2];     /* [g/2][row][g%2]: scale of group g */
    /* [group g][plane][row][i]: 6-bit values q (0..63, the value is q - 32) of the 16
     * columns 16g..16g+15 in 4 units of 4 (unit u: columns 16g+4u+i). Plane 0 holds unit 0
     * in bits 0-5 and bits 0-1 of unit 3 in bits 6-7, plane 1 unit 1 and bits 2-3 of unit 3,
     * plane 2 unit 2 and bits 4-5 of unit 3. */
    uint8_t q[16][3][16][4];
} block_q6_Kx16; /* 3392 */

/* Repacked Q8_0: 16 consecutive rows interleaved, 64 columns (two Q8_0 blocks) of all 16 rows
 * per struct (1088 bytes: a multiple of 64, so every vector load is aligned), so that a
 * decode tile reads one sequential stream and one int32 lane per row accumulates a block's
 * whole integer dot product (vpdpbusd: a 64-byte vector holds 4 columns of 16 rows). The
 * values are stored plus 128 (unsigned), the operand side vpdpbusd wants them on; the kernel
 * takes the -128 * sum(activations) of a block off once per token. A matrix of `rows` (a
 * multiple of 16) rows and `cols` (a multiple of 64) columns is rows/16 groups of cols/64
 * structs, group-major: the same bytes as the file's layout. */
typedef struct {
    fp16_t d[2][16];         /* [h][row]: scale of Q8_0 block 2p + h of the row */
    uint8_t qs[2][8][16][4]; /* [h][k][row][i]: value of column 64p + 32h + 4k + i, plus 128 */
} block_q8_0x16; /* 1088 */
/* Repacked Q4_0, the same way: 64 columns of 16 rows per struct (576 bytes). A byte holds the
 * row's original nibble pair (low: column j, high: column j + 16 of its block): the nibbles
 * are unsigned already, and the kernel takes 8 * sum(activations) off per block. */
typedef struct {
    fp16_t d[2][16];         /* [h][row]: scale of Q4_0 block 2p + h of the row */
    uint8_t qs[2][4][16][4]; /* [h][k][row][i]: byte 4k + i of the row's block 2p + h: low nibble
                              * column 64p + 32h + 4k + i, high nibble the same + 16 */
} block_q4_0x16; /* 576 */
/* Repacked MXFP4, the same way: the 32 E8M0 exponents, then the nibble pairs as in
 * block_q4_0x16 (codes, looked up in quant_kvalues_mxfp4). 544 bytes, the file's size: every
 * other struct starts 32 bytes into a cache line (gpt-oss's 2,880 columns are not a multiple of
 * 128, so two structs per 64-byte multiple would leave its matrices in the file layout). */
typedef struct {
    uint8_t e[2][16];        /* [h][row]: exponent of MXFP4 block 2p + h of the row */
    uint8_t qs[2][4][16][4]; /* [h][k][row][i]: byte 4k + i of the row's block 2p + h */
} block_mxfp4x16; /* 544 */

bool quant_type_supported(int type);      /* one of the QTYPE_ values above */
bool quant_weight_type(int type);         /* one a file's tensor may hold (not Q8_1/Q8_K/repacked) */
const char *quant_ggml_type_name(int type); /* ggml's name of any ggml type id, ours or not
                                             * ("iq2_xxs"); NULL past the known ones */
const char *quant_type_name(qtype t);     /* "f32", "q8_0", ...; "?" if unknown */
int64_t quant_block_elems(qtype t);       /* elements per block (1 for f32/f16/bf16) */
size_t quant_block_bytes(qtype t);        /* bytes per block */
size_t quant_row_bytes(qtype t, int64_t n); /* n must be a multiple of quant_block_elems */
qtype quant_vec_dot_type(qtype weights);

/* MXFP4: the doubled E2M1 values by code, and the halved scale 2^(e - 128) of an E8M0
 * exponent (ggml_e8m0_to_fp32_half: e 0 and 1 are the subnormals 2^-128 and 2^-127). */
extern const int8_t quant_kvalues_mxfp4[16];
float quant_e8m0_half(uint8_t e);
/* IQ4_NL / IQ4_XS: ggml's kvalues_iq4nl, the value of each 4-bit code. */
extern const int8_t quant_kvalues_iq4nl[16];
/* Q3_K's 16 scales unpacked from its 12 bytes (0..63; the scale is the value - 32). */
void quant_q3_K_scales(const uint8_t packed[12], int8_t out[16]);
/* IQ4_XS's scale (0..63; the scale is the value - 32) of sub-block j (0..7). */
static inline int quant_iq4_xs_scale(const block_iq4_xs *b, int j)
{
    return ((b->scales_l[j / 2] >> 4 * (j % 2)) & 0xf) | (((b->scales_h >> 2 * j) & 3) << 4);
}

/* ggml's nearest_int: round half to even through the 1.5*2^23 trick (|v| < 2^22). */
static inline int quant_nearest_int(float v)
{
    union { float f; int32_t i; } t = { v + 12582912.f };
    return (t.i & 0x007fffff) - 0x00400000;
}

float quant_fp16_to_fp32(fp16_t h);
fp16_t quant_fp32_to_fp16(float f);      /* round to nearest even, like F16C */
float quant_bf16_to_fp32(bf16_t h);
bf16_t quant_fp32_to_bf16(float f);      /* round to nearest even, NaN kept quiet */

/* Row conversions (scalar reference; n a multiple of the block size). */
void quant_dequantize_row(qtype t, const void *src, float *dst, int64_t n);
void quant_quantize_row(qtype t, const float *src, void *dst, int64_t n);

/* Activation quantisers, as llama.cpp's x86 CPU backend quantises the activations before a
 * quantised dot product (scalar reference; ops.h has the fast, threaded path):
 * Q8_0: d = amax/127 (fp16), q = round-half-even(x * 127/amax);
 * Q8_K: d = -max/127 with max the signed value of largest magnitude, q = nearest_int(x * -127/max)
 *       capped at 127, bsums[j] = sum of qs[16j .. 16j+15]. (Also what quant_quantize_row does
 *       for QTYPE_Q8_K.) n a multiple of the block size. */
void quant_act_q8_0(const float *x, block_q8_0 *y, int64_t n);
/* Q8_1 (x86 llama.cpp's quantize_row_q8_1): Q8_0's d and qs, s = fp16(amax/127 * sum(qs)). */
void quant_act_q8_1(const float *x, block_q8_1 *y, int64_t n);
void quant_act_q8_K(const float *x, block_q8_K *y, int64_t n);

/* Repacks `rows` rows (a multiple of 16) of `cols` columns of type t (Q8_0, Q4_0, MXFP4, Q4_K
 * or Q6_K) into quant_repack_type(t) (see block_q8_0x16, block_q4_Kx16); dst holds
 * quant_row_bytes(that, cols) * rows; cols a multiple of quant_block_elems(that).
 * Rows [r0, r1) (multiples of 16) only, so that threads can split the work. */
qtype quant_repack_type(qtype t);   /* the repacked type of t, or t when there is none */
void quant_repack(qtype t, const void *src, void *dst, int64_t cols, int64_t r0, int64_t r1);

/* Q4_K's (and Q5_K's) packed 6-bit scale and min of sub-block j (0..7) from .scales. */
void quant_q4_K_scale_min(int j, const uint8_t *scales, uint8_t *d, uint8_t *m);

#endif
