/*
 * ops_iq_avx2: the AVX2 level's kernels of the codebook and ternary types: the per-row dots
 * and 4-row batch tiles of ops_iq_x86.h, one gemm per type (single tokens and the rows left
 * over from the tiles go through the per-row dot).
 */
#include "model/ops_iq_x86.h"

IQ_A2_GEMM_TILE(iq_a2_gemm_iq2_xxs, iq_a2_dot_iq2_xxs, block_iq2_xxs, iq_a2_tile, iq_a2_fill_iq2_xxs, iq_a2_tile_dot, 0.125f)
IQ_A2_GEMM_TILE(iq_a2_gemm_iq2_xs, iq_a2_dot_iq2_xs, block_iq2_xs, iq_a2_tile, iq_a2_fill_iq2_xs, iq_a2_tile_dot, 0.125f)
IQ_A2_GEMM_TILE(iq_a2_gemm_iq2_s, iq_a2_dot_iq2_s, block_iq2_s, iq_a2_tile, iq_a2_fill_iq2_s, iq_a2_tile_dot, 0.125f)
IQ_A2_GEMM_TILE(iq_a2_gemm_iq3_xxs, iq_a2_dot_iq3_xxs, block_iq3_xxs, iq_a2_tile, iq_a2_fill_iq3_xxs, iq_a2_tile_dot, 0.25f)
IQ_A2_GEMM_TILE(iq_a2_gemm_iq3_s, iq_a2_dot_iq3_s, block_iq3_s, iq_a2_tile, iq_a2_fill_iq3_s, iq_a2_tile_dot, 1.0f)
IQ_A2_GEMM_TILE(iq_a2_gemm_iq1_s, iq_a2_dot_iq1_s, block_iq1_s, iq_a2_tile1, iq_a2_fill_iq1_s, iq_a2_tile_dot_iq1_s, 1.0f)
IQ_A2_GEMM_TILE(iq_a2_gemm_iq1_m, iq_a2_dot_iq1_m, block_iq1_m, iq_a2_tile1, iq_a2_fill_iq1_m, iq_a2_tile_dot_iq1_m, 1.0f)
IQ_A2_GEMM_TILE(iq_a2_gemm_tq1_0, iq_a2_dot_tq1_0, block_tq1_0, iq_a2_tilet, iq_a2_fill_tq1_0, iq_a2_tile_dot_tq, 1.0f)
IQ_A2_GEMM_TILE(iq_a2_gemm_tq2_0, iq_a2_dot_tq2_0, block_tq2_0, iq_a2_tilet, iq_a2_fill_tq2_0, iq_a2_tile_dot_tq, 1.0f)

void ops_iq_init_avx2(ops_kernels *k)
{
    k->gemm[QTYPE_IQ2_XXS] = iq_a2_gemm_iq2_xxs;
    k->gemm[QTYPE_IQ2_XS] = iq_a2_gemm_iq2_xs;
    k->gemm[QTYPE_IQ2_S] = iq_a2_gemm_iq2_s;
    k->gemm[QTYPE_IQ3_XXS] = iq_a2_gemm_iq3_xxs;
    k->gemm[QTYPE_IQ3_S] = iq_a2_gemm_iq3_s;
    k->gemm[QTYPE_IQ1_S] = iq_a2_gemm_iq1_s;
    k->gemm[QTYPE_IQ1_M] = iq_a2_gemm_iq1_m;
    k->gemm[QTYPE_TQ1_0] = iq_a2_gemm_tq1_0;
    k->gemm[QTYPE_TQ2_0] = iq_a2_gemm_tq2_0;
}
