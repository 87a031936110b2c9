/*
 * cpu: which SIMD instruction sets this processor (and OS) offer, detected once: with cpuid
 * and xgetbv on x86, with the kernel's hardware capability bits (getauxval) on aarch64.
 *
 * The levels form one ladder per architecture, each level a superset of the one below:
 * scalar < avx2 < avx512 on x86, scalar < neon on aarch64 (neon: AdvSIMD with the dot-product
 * extension; the kernels use the int8 matrix multiply extension too where the CPU has it). The
 * other architecture's names exist so that shared code compiles; the hardware level never
 * reaches them. TOKENMILL_SIMD=NAME picks a lower level than the hardware's (tests use it to
 * run the scalar path and each SIMD path on one machine); cpu_simd_check refuses a name that
 * is no level, or a level this build or CPU does not have.
 */
#ifndef TM_CPU_H
#define TM_CPU_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    CPU_LEVEL_SCALAR = 0,
#if defined(__aarch64__)
    CPU_LEVEL_NEON = 1,
    CPU_LEVEL_AVX2 = 8, /* not on this architecture */
    CPU_LEVEL_AVX512 = 9,
#else
    CPU_LEVEL_AVX2 = 1,
    CPU_LEVEL_AVX512 = 2,
    CPU_LEVEL_NEON = 8, /* not on this architecture */
#endif
} cpu_level;

typedef struct {
    bool avx2, fma, f16c;                  /* AVX2 path needs all three */
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool asimd, asimddp, i8mm;             /* aarch64: NEON path needs asimd + asimddp */
} cpu_features;

const cpu_features *cpu_get_features(void);
/* Highest usable level: TOKENMILL_SIMD's when it names one the CPU has, else the hardware's. */
cpu_level cpu_get_level(void);
/* Highest level the hardware supports, ignoring TOKENMILL_SIMD. */
cpu_level cpu_get_hw_level(void);
const char *cpu_level_name(cpu_level lvl);
/* Whether TOKENMILL_SIMD (unset or empty is fine) names a level of this architecture that the
 * CPU has; if not, a message for the user in err (n bytes) and false. */
bool cpu_simd_check(char *err, size_t n);

#endif
