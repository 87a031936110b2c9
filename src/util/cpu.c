/*
 * cpu: feature detection (see cpu.h). On x86 with cpuid/xgetbv: the OS must have enabled the
 * AVX and AVX-512 register state (XCR0 bits), not only the CPU report the instructions. On
 * aarch64 with getauxval's HWCAP/HWCAP2 bits, which the kernel sets only for what it supports.
 */
#include "util/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#endif

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
#elif defined(__aarch64__)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    cpu_feat.asimd = (hw & HWCAP_ASIMD) != 0;
    cpu_feat.asimddp = (hw & HWCAP_ASIMDDP) != 0;
    cpu_feat.i8mm = (hw2 & HWCAP2_I8MM) != 0;
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
#if defined(__aarch64__)
    if (f->asimd && f->asimddp) return CPU_LEVEL_NEON;
#else
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni && f->avx2 &&
        f->fma && f->f16c)
        return CPU_LEVEL_AVX512;
    if (f->avx2 && f->fma && f->f16c) return CPU_LEVEL_AVX2;
#endif
    return CPU_LEVEL_SCALAR;
}

/* This architecture's ladder, lowest first. */
static const cpu_level cpu_ladder[] = {
#if defined(__aarch64__)
    CPU_LEVEL_SCALAR, CPU_LEVEL_NEON,
#else
    CPU_LEVEL_SCALAR, CPU_LEVEL_AVX2, CPU_LEVEL_AVX512,
#endif
};
#define CPU_LADDER_N (sizeof cpu_ladder / sizeof cpu_ladder[0])

/* TOKENMILL_SIMD's level; 0 when unset or empty, -1 when it names no level of any
 * architecture, -2 when a level of the other one, -3 when one above the hardware's. */
static int cpu_env_level(cpu_level *out)
{
    const char *want = getenv("TOKENMILL_SIMD");
    if (!want || !*want) return 0;
    static const cpu_level all[] = {CPU_LEVEL_SCALAR, CPU_LEVEL_AVX2, CPU_LEVEL_AVX512, CPU_LEVEL_NEON};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(want, cpu_level_name(all[i]))) continue;
        *out = all[i];
        bool here = false;
        for (size_t j = 0; j < CPU_LADDER_N; j++) here |= cpu_ladder[j] == all[i];
        if (!here) return -2;
        return all[i] > cpu_get_hw_level() ? -3 : 1;
    }
    return -1;
}

cpu_level cpu_get_level(void)
{
    cpu_level lvl;
    return cpu_env_level(&lvl) > 0 ? lvl : cpu_get_hw_level();
}

bool cpu_simd_check(char *err, size_t n)
{
    cpu_level lvl;
    int rc = cpu_env_level(&lvl);
    if (rc >= 0) return true;
    char have[64] = "";
    for (size_t j = 0; j < CPU_LADDER_N && cpu_ladder[j] <= cpu_get_hw_level(); j++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", j ? ", " : "",
                 cpu_level_name(cpu_ladder[j]));
    const char *want = getenv("TOKENMILL_SIMD");
    if (rc == -1)
        snprintf(err, n, "TOKENMILL_SIMD=%s is not a SIMD level (this CPU has: %s)", want, have);
    else if (rc == -2)
        snprintf(err, n, "TOKENMILL_SIMD=%s: this build is for another architecture (this CPU has: %s)",
                 want, have);
    else
        snprintf(err, n, "TOKENMILL_SIMD=%s: this CPU lacks it (this CPU has: %s)", want, have);
    return false;
}

const char *cpu_level_name(cpu_level lvl)
{
    switch (lvl) {
    case CPU_LEVEL_AVX512: return "avx512";
    case CPU_LEVEL_AVX2: return "avx2";
    case CPU_LEVEL_NEON: return "neon";
    default: return "scalar";
    }
}
