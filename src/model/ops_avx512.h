/*
 * ops_avx512: what the AVX-512 level's kernel files share (ops_avx512.c: quantisers and
 * matrix products; ops_vec_avx512.c: the float kernels). Only those files include it; they are
 * built with the AVX-512 flags.
 */
#ifndef TM_OPS_AVX512_H
#define TM_OPS_AVX512_H

#include <immintrin.h>

#include "model/ops_int.h"

#define A512_INLINE static inline __attribute__((always_inline))

/* elements [i, i + 16) of an F16 row as floats, lanes outside k zero */
A512_INLINE __m512 a512_load_f16(const void *p, int64_t i, __mmask16 k)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const fp16_t *)p + i));
}

/* fills the table's float kernels (ops_vec_avx512.c) */
void ops_vec_init_avx512(ops_kernels *k);

#endif
