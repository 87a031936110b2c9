/*
 * ops_avx2: AVX2 + FMA + F16C kernels (see ops_int.h for the table they fill).
 */
#include "model/ops_int.h"

void ops_kernels_init_avx2(ops_kernels *k)
{
    (void)k;
}
