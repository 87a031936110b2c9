/*
 * cpu: feature detection with cpuid/xgetbv (see cpu.h). The OS must have enabled the AVX
 * and AVX-512 register state (XCR0 bits), not only the CPU report the instructions.
 */
#include "util/cpu.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static unsigned long long cpu_xgetbv0(void)
{
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}
#endif

static cpu_features cpu_feat;
static bool cpu_detected;

static void cpu_detect(void)
{
    memset(&cpu_feat, 0, sizeof cpu_feat);
#if defined(__x86_64__) || defined(__i386__)
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) goto done;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) goto done;
    unsigned long long xcr0 = cpu_xgetbv0();
    bool ymm_ok = (xcr0 & 0x6) == 0x6;
    bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
    if (!ymm_ok) goto done;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) goto done;
    cpu_feat.avx2 = (b >> 5) & 1;
    cpu_feat.fma = fma;
    cpu_feat.f16c = f16c;
    if (zmm_ok) {
        cpu_feat.avx512f = (b >> 16) & 1;
        cpu_feat.avx512dq = (b >> 17) & 1;
        cpu_feat.avx512bw = (b >> 30) & 1;
        cpu_feat.avx512vl = (b >> 31) & 1;
        cpu_feat.avx512vnni = (c >> 11) & 1;
        unsigned int a1, b1, c1, d1;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) cpu_feat.avx512bf16 = (a1 >> 5) & 1;
    }
done:
#endif
    cpu_detected = true;
}

const cpu_features *cpu_get_features(void)
{
    if (!cpu_detected) cpu_detect();
    return &cpu_feat;
}

cpu_level cpu_get_hw_level(void)
{
    const cpu_features *f = cpu_get_features();
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni && f->avx2 &&
        f->fma && f->f16c)
        return CPU_LEVEL_AVX512;
    if (f->avx2 && f->fma && f->f16c) return CPU_LEVEL_AVX2;
    return CPU_LEVEL_SCALAR;
}

bool cpu_simd_env_ok(void)
{
    const char *cap = getenv("TOKENMILL_SIMD");
    return !cap || !*cap || !strcmp(cap, "scalar") || !strcmp(cap, "avx2") || !strcmp(cap, "avx512");
}

cpu_level cpu_get_level(void)
{
    cpu_level hw = cpu_get_hw_level();
    const char *cap = getenv("TOKENMILL_SIMD");
    if (!cap || !*cap) return hw;
    cpu_level want = hw;
    if (!strcmp(cap, "scalar")) want = CPU_LEVEL_SCALAR;
    else if (!strcmp(cap, "avx2")) want = CPU_LEVEL_AVX2;
    else if (!strcmp(cap, "avx512")) want = CPU_LEVEL_AVX512;
    return want < hw ? want : hw;
}

const char *cpu_level_name(cpu_level lvl)
{
    switch (lvl) {
    case CPU_LEVEL_AVX512: return "avx512";
    case CPU_LEVEL_AVX2: return "avx2";
    default: return "scalar";
    }
}
