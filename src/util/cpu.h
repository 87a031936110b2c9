/*
 * cpu: which SIMD instruction sets this processor (and OS) offer, detected once with cpuid
 * and xgetbv. TOKENMILL_SIMD=scalar|avx2|avx512 caps the level (tests use it to run the scalar
 * path and each SIMD path on one machine); a cap above what the CPU has is ignored.
 */
#ifndef TM_CPU_H
#define TM_CPU_H

#include <stdbool.h>

typedef enum { CPU_LEVEL_SCALAR = 0, CPU_LEVEL_AVX2 = 1, CPU_LEVEL_AVX512 = 2 } cpu_level;

typedef struct {
    bool avx2, fma, f16c;                  /* AVX2 path needs all three */
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
} cpu_features;

const cpu_features *cpu_get_features(void);
/* Highest usable level, after the TOKENMILL_SIMD cap. */
cpu_level cpu_get_level(void);
/* Whether TOKENMILL_SIMD, when set, names a level (scalar, avx2, avx512); the command checks
 * it at start, so that a misspelt cap is refused rather than silently ignored. */
bool cpu_simd_env_ok(void);
/* Highest level the hardware supports, ignoring the cap. */
cpu_level cpu_get_hw_level(void);
const char *cpu_level_name(cpu_level lvl);

#endif
