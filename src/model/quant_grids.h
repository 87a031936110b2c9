/*
 * quant_grids: the i-quants' codebooks as ggml defines them (ggml-common.h), generated into
 * quant_grids.c by scripts/gen-iq-grids.py. Entry layouts: see quant_grids.c.
 */
#ifndef TM_QUANT_GRIDS_H
#define TM_QUANT_GRIDS_H

#include <stdint.h>

extern const uint8_t quant_grids_ksigns[128];   /* 7 sign bits -> 8 (bit j: element j negative) */
extern const uint64_t quant_grids_iq2xxs[256];  /* IQ2_XXS: 8 points of {8, 25, 43} */
extern const uint64_t quant_grids_iq2xs[512];   /* IQ2_XS: the same points, 512 entries */
extern const uint64_t quant_grids_iq2s[1024];   /* IQ2_S: the same points, 1024 entries */
extern const uint32_t quant_grids_iq3xxs[256];  /* IQ3_XXS: 4 points of 4..62 */
extern const uint32_t quant_grids_iq3s[512];    /* IQ3_S: 4 points of 1..15 (odd) */
extern const uint64_t quant_grids_iq1s[2048];   /* IQ1_S / IQ1_M: 8 int8 points of -1, 0, 1 */

#endif
