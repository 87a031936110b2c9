/*
 * ops_avx512: AVX-512 (F, BW, VL, DQ, VNNI) kernels (see ops_int.h for the table they fill).
 */
#include "model/ops_int.h"

void ops_kernels_init_avx512(ops_kernels *k)
{
    (void)k;
}
