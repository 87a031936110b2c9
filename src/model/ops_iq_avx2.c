/*
 * ops_iq_avx2: the AVX2 level's kernels of the codebook and ternary types: the per-row dots
 * and 4-row batch tiles of ops_iq_x86.h, one gemm per type (single tokens and the rows left
 * over from the tiles go through the per-row dot).
 */
#include "model/ops_iq_x86.h"

#define IQ_GEMM(n, T, TT, DSFX, FACTOR) \
    IQ_A2_GEMM_TILE(iq_a2_gemm_##n, iq_a2_dot_##n, block_##n, TT, iq_a2_fill_##n, iq_a2_tile_dot##DSFX, FACTOR)
IQ_X86_TYPES(IQ_GEMM)
#undef IQ_GEMM

void ops_iq_init_avx2(ops_kernels *k)
{
#define IQ_SET(n, T, TT, DSFX, FACTOR) k->gemm[QTYPE_##T] = iq_a2_gemm_##n;
    IQ_X86_TYPES(IQ_SET)
#undef IQ_SET
}
