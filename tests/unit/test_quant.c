/*
 * test_quant: the type table, fp16/bf16 conversion, and the quantisers.
 *
 * The hashes in test_ref_quantisers_match_ggml were produced by ggml's own
 * quantize_row_*_ref (llama.cpp's ggml-quants.c, compiled next to ours on the same inputs:
 * byte-identical output), so they pin our quantisers to ggml's exact output. The inputs come
 * from util_rng: if its algorithm changes, regenerate them with ggml.
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>

#include "model/quant.h"
#include "model/quant_grids.h"
#include "model/quant_iq.h"
#include "util/util.h"

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *c = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Three input distributions: normal, heavy-tailed (cubed normal), uniform with outliers. */
static void fill_dist(float *x, int64_t n, int dist)
{
    util_rng r;
    util_rng_seed(&r, 42 + dist);
    for (int64_t i = 0; i < n; i++) {
        float v = util_rng_normal(&r);
        if (dist == 1) v = v * v * v * 0.01f;
        if (dist == 2) v = (float)(util_rng_uniform(&r) * 2 - 1) + ((i % 97) == 0 ? 5.f : 0);
        x[i] = v;
    }
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TEST(test_type_table)
{
    CHECK(QTYPE_F32 == 0 && QTYPE_F16 == 1 && QTYPE_Q4_0 == 2 && QTYPE_Q8_0 == 8);
    CHECK(QTYPE_Q4_K == 12 && QTYPE_Q5_K == 13 && QTYPE_Q6_K == 14 && QTYPE_Q8_K == 15 && QTYPE_BF16 == 30);
    CHECK(quant_block_elems(QTYPE_F32) == 1 && quant_block_bytes(QTYPE_F32) == 4);
    CHECK(quant_block_elems(QTYPE_F16) == 1 && quant_block_bytes(QTYPE_F16) == 2);
    CHECK(quant_block_elems(QTYPE_BF16) == 1 && quant_block_bytes(QTYPE_BF16) == 2);
    CHECK(quant_block_elems(QTYPE_Q4_0) == 32 && quant_block_bytes(QTYPE_Q4_0) == 18);
    CHECK(quant_block_elems(QTYPE_Q8_0) == 32 && quant_block_bytes(QTYPE_Q8_0) == 34);
    CHECK(quant_block_elems(QTYPE_Q4_K) == 256 && quant_block_bytes(QTYPE_Q4_K) == 144);
    CHECK(quant_block_elems(QTYPE_Q5_K) == 256 && quant_block_bytes(QTYPE_Q5_K) == 176);
    CHECK(quant_block_elems(QTYPE_Q6_K) == 256 && quant_block_bytes(QTYPE_Q6_K) == 210);
    CHECK(quant_block_elems(QTYPE_Q8_K) == 256 && quant_block_bytes(QTYPE_Q8_K) == 292);
    CHECK(quant_row_bytes(QTYPE_Q4_K, 1024) == 4 * 144);
    CHECK(quant_vec_dot_type(QTYPE_Q4_0) == QTYPE_Q8_0);
    CHECK(quant_vec_dot_type(QTYPE_Q8_0) == QTYPE_Q8_0);
    CHECK(quant_vec_dot_type(QTYPE_Q4_K) == QTYPE_Q8_K);
    CHECK(quant_vec_dot_type(QTYPE_Q5_K) == QTYPE_Q8_K);
    CHECK(quant_vec_dot_type(QTYPE_Q6_K) == QTYPE_Q8_K);
    CHECK(quant_vec_dot_type(QTYPE_F16) == QTYPE_F16);
    CHECK(quant_vec_dot_type(QTYPE_BF16) == QTYPE_BF16);
    CHECK(quant_vec_dot_type(QTYPE_F32) == QTYPE_F32);
    CHECK(!quant_type_supported(4) && !quant_type_supported(40) && !quant_type_supported(63));
    CHECK(quant_type_supported(QTYPE_Q6_K) && quant_type_supported(QTYPE_Q5_K));
    CHECK(!strcmp(quant_type_name(QTYPE_Q5_K), "q5_K"));
    CHECK(!strcmp(quant_type_name(QTYPE_Q4_K), "q4_K") && !strcmp(quant_type_name(99), "?"));
}

TEST(test_fp16_known)
{
    CHECK(quant_fp32_to_fp16(1.0f) == 0x3c00);
    CHECK(quant_fp32_to_fp16(-2.0f) == 0xc000);
    CHECK(quant_fp32_to_fp16(65504.f) == 0x7bff);
    CHECK(quant_fp32_to_fp16(65519.f) == 0x7bff);  /* below the midpoint to infinity */
    CHECK(quant_fp32_to_fp16(65520.f) == 0x7c00);  /* ties to even: infinity */
    CHECK(quant_fp32_to_fp16(INFINITY) == 0x7c00);
    CHECK(quant_fp32_to_fp16(0x1p-24f) == 0x0001);  /* smallest subnormal */
    CHECK(quant_fp32_to_fp16(0x1p-25f) == 0x0000);  /* tie to even (0) */
    CHECK(quant_fp32_to_fp16(0x1.8p-24f) == 0x0002); /* tie to even (2) */
    CHECK(quant_fp32_to_fp16(-0.0f) == 0x8000);
    CHECK(quant_fp32_to_fp16(1.0f + 0x1p-11f) == 0x3c00);            /* tie, even down */
    CHECK(quant_fp32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02);        /* tie, even up */
    fp16_t nan = quant_fp32_to_fp16(NAN);
    CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
    CHECK(quant_fp16_to_fp32(0x3555) == f_of(0x3eaaa000));  /* 0.333251953125 */
    CHECK(quant_fp16_to_fp32(0x0001) == 0x1p-24f);
    CHECK(quant_fp16_to_fp32(0xfc00) == -INFINITY);
    /* every finite half survives a round trip */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        if (quant_fp32_to_fp16(quant_fp16_to_fp32((fp16_t)h)) != h) bad++;
    }
    CHECK(bad == 0);
    /* conversion is monotone and within half an ulp on a sweep of floats */
    util_rng r;
    util_rng_seed(&r, 7);
    for (int i = 0; i < 100000; i++) {
        float f = (float)((util_rng_uniform(&r) * 2 - 1) * 70000.0);
        if (fabsf(f) >= 65520.f) continue;
        float g = quant_fp16_to_fp32(quant_fp32_to_fp16(f));
        float ulp = fabsf(f) < 0x1p-14f ? 0x1p-24f : exp2f(floorf(log2f(fabsf(f))) - 10);
        if (fabsf(g - f) > ulp * 0.5f) bad++;
    }
    CHECK(bad == 0);
}

TEST(test_bf16_known)
{
    CHECK(quant_fp32_to_bf16(1.0f) == 0x3f80);
    CHECK(quant_fp32_to_bf16(f_of(0x3f808000)) == 0x3f80); /* tie, even down */
    CHECK(quant_fp32_to_bf16(f_of(0x3f818000)) == 0x3f82); /* tie, even up */
    CHECK(quant_fp32_to_bf16(f_of(0x3f808001)) == 0x3f81);
    CHECK(quant_bf16_to_fp32(0xc000) == -2.0f);
    bf16_t nan = quant_fp32_to_bf16(NAN);
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
}

TEST(test_ref_quantisers_match_ggml)
{
    static const struct {
        qtype t;
        uint64_t hash[3];
    } want[] = {
        {QTYPE_Q4_0, {0x968efcb10884fd45ull, 0xc4c3b64bcd1d25eaull, 0x73a65bf02a2cee1eull}},
        {QTYPE_Q8_0, {0x77329ea65cbe16c4ull, 0xc59be6a092b1422cull, 0x03b3c68955e9cad9ull}},
        {QTYPE_Q4_K, {0x56e81c440e452518ull, 0xb693236b343df30aull, 0xe3cfe4a4d7a6b045ull}},
        {QTYPE_Q5_K, {0xf1570ea99fbc02b1ull, 0x39585be1ee83e43dull, 0x31bafd0832648eb5ull}},
        {QTYPE_Q6_K, {0xac7076fbb20015fbull, 0x8ff5f76c75de9efcull, 0xa2ebff1f3ee3e71aull}},
        {QTYPE_Q8_K, {0xaed80593bafc6e04ull, 0x97768d815d47ca57ull, 0x5c4e259aaef3a90eull}},
    };
    int64_t n = 256 * 64;
    float *x = malloc((size_t)n * 4);
    unsigned char *q = malloc((size_t)n * 4);
    for (int dist = 0; dist < 3; dist++) {
        fill_dist(x, n, dist);
        for (size_t k = 0; k < TM_ARRAY_LEN(want); k++) {
            size_t sz = quant_row_bytes(want[k].t, n);
            memset(q, 0xAA, sz);
            quant_quantize_row(want[k].t, x, q, n);
            uint64_t h = fnv1a(q, sz);
            CHECKF(h == want[k].hash[dist], "%s dist %d: %016llx", quant_type_name(want[k].t),
                   dist, (unsigned long long)h);
        }
    }
    free(x);
    free(q);
}

/* The types read since (quantisers: byte-identical to ggml's quantize_row_{q4_1,q5_0,q5_1,
 * q2_K,q3_K}_ref and quantize_iq4_{nl,xs} without an importance matrix, which llama-quantize
 * calls; dequantisers: bit-identical to ggml's dequantize_row_* on random block bytes). The
 * hashes come from ggml-quants.c of the bundled llama.cpp compiled next to ours on the same
 * inputs, both outputs compared byte for byte. */
TEST(test_more_types_match_ggml)
{
    static const struct {
        qtype t;
        uint64_t quant[3], dequant[3];
    } want[] = {
        {QTYPE_Q4_1, {0xdd170511a5ae564full, 0xef16d23350d1180eull, 0x0a2773f1cb60a6c3ull}, {0xa30143c3535436afull, 0xe25ed0ac5580c3bdull, 0xd7f96ac70689080dull}},
        {QTYPE_Q5_0, {0xae993152a55437f3ull, 0xa1dc5ad5bfd3800aull, 0xb470ccc181d22e8bull}, {0x8acfa4a399438dfbull, 0x4f3b85aaaa0190d9ull, 0x5690be4db0024e9aull}},
        {QTYPE_Q5_1, {0xb9b7bfd6277ff84dull, 0xd328c25f9c82a0caull, 0x230f299b0931ce5aull}, {0x53f18f0aafe4cb5aull, 0xeb0f81c37704b815ull, 0xac87719f0dacb9e0ull}},
        {QTYPE_Q2_K, {0xd2749296d7e32b8full, 0x8e7a92477166b8cbull, 0x2aee1a77f56f67f0ull}, {0x9aca672a6341613full, 0xacd5433235faac16ull, 0xc2d759a075665a65ull}},
        {QTYPE_Q3_K, {0x7496d00124d64bcaull, 0x34295f4be7221ccdull, 0x4d4839d51253f0f3ull}, {0xab195eaffd77132bull, 0xcd000763d320296eull, 0xae127453b5b8c9b2ull}},
        {QTYPE_IQ4_NL, {0x220aa94766e03f0eull, 0xbd93dbb5276af8a3ull, 0x5c2afaa7cbd2dea2ull}, {0x9be4cc608da2f326ull, 0x3bc1f87fc92dce7dull, 0xd563f2083a6e80d2ull}},
        {QTYPE_IQ4_XS, {0xf5bcd276cba0f1baull, 0x2d80dee5d30752cdull, 0x9c5b920ae7a96c0eull}, {0xe2ff3cbec3c51312ull, 0xe46ec657ffc50777ull, 0x205d7bf4979adf92ull}},
    };
    int64_t n = 256 * 64;
    float *x = malloc((size_t)n * 4);
    unsigned char *q = malloc((size_t)n * 4);
    for (size_t k = 0; k < TM_ARRAY_LEN(want); k++) {
        size_t sz = quant_row_bytes(want[k].t, n);
        for (int dist = 0; dist < 3; dist++) {
            fill_dist(x, n, dist);
            memset(q, 0xAA, sz);
            quant_quantize_row(want[k].t, x, q, n);
            uint64_t h = fnv1a(q, sz);
            CHECKF(h == want[k].quant[dist], "%s quantise dist %d: %016llx", quant_type_name(want[k].t), dist,
                   (unsigned long long)h);
            util_rng r;
            util_rng_seed(&r, 7 + dist);
            for (size_t i = 0; i < sz; i++) q[i] = (unsigned char)(util_rng_next(&r) >> 56);
            quant_dequantize_row(want[k].t, q, x, n);
            /* random scales include fp16 infinities and NaNs: 0 * inf's NaN is the CPU's
             * (x86 sets the sign, aarch64 does not), so every NaN hashes as one */
            for (int64_t i = 0; i < n; i++)
                if (isnan(x[i])) x[i] = f_of(0x7fc00000u);
            h = fnv1a(x, (size_t)n * 4);
            CHECKF(h == want[k].dequant[dist], "%s dequantise %d: %016llx", quant_type_name(want[k].t), dist,
                   (unsigned long long)h);
        }
    }
    /* the sizes and activation types ggml gives them (Q5_0 / IQ4_NL: Q8_1, the same values as
     * ggml's Q8_0, see quant.h) */
    CHECK(quant_block_bytes(QTYPE_Q4_1) == 20 && quant_block_bytes(QTYPE_Q5_0) == 22);
    CHECK(quant_block_bytes(QTYPE_Q5_1) == 24 && quant_block_bytes(QTYPE_IQ4_NL) == 18);
    CHECK(quant_block_bytes(QTYPE_Q2_K) == 84 && quant_block_bytes(QTYPE_Q3_K) == 110);
    CHECK(quant_block_bytes(QTYPE_IQ4_XS) == 136 && quant_block_elems(QTYPE_IQ4_XS) == 256);
    CHECK(quant_vec_dot_type(QTYPE_Q4_1) == QTYPE_Q8_1 && quant_vec_dot_type(QTYPE_Q3_K) == QTYPE_Q8_K);
    CHECK(quant_weight_type(QTYPE_IQ4_XS) && !quant_weight_type(QTYPE_Q8_1) && !quant_weight_type(QTYPE_Q8_K));
    CHECK(!quant_weight_type(40) && !strcmp(quant_ggml_type_name(16), "iq2_xxs"));
    CHECK(!strcmp(quant_ggml_type_name(35), "tq2_0") && !quant_ggml_type_name(4) && !quant_ggml_type_name(99));
    free(x);
    free(q);
}

/* The codebook and ternary types: dequantisation bit-identical to ggml's dequantize_row_* on
 * random block bytes (every index, sign and scale pattern; random fp16 scales), the TQ
 * quantisers byte-identical to quantize_row_tq{1,2}_0_ref, IQ3_XXS's, IQ3_S's and IQ2_S's to
 * quantize_iq3_{xxs,s} / quantize_iq2_s without an importance matrix (what llama-quantize
 * runs without one). The hashes come from the bundled
 * ggml-quants.c compiled next to ours on the same bytes, both outputs compared bit for bit. */
TEST(test_iq_types_match_ggml)
{
    static const struct {
        qtype t;
        size_t bytes;
        uint64_t dequant[3];
    } want[] = {
        {QTYPE_IQ2_XXS, 66, {0x53ec898e4f9faf34ull, 0x8be4caabd2c26bdaull, 0x8903866ed5ac2e74ull}},
        {QTYPE_IQ2_XS, 74, {0x9a92617c218cec58ull, 0xe8fc0def776b0194ull, 0x679c27190a31ef42ull}},
        {QTYPE_IQ2_S, 82, {0xeb41f4c8db3539f6ull, 0x8f36f13445467290ull, 0x655395db590c086dull}},
        {QTYPE_IQ3_XXS, 98, {0x3d6987f0faa88d32ull, 0x4fe80b17198ed983ull, 0x31defb2359a62323ull}},
        {QTYPE_IQ3_S, 110, {0xc20b3147dedee83cull, 0x720b4078bade6f52ull, 0x903ba4142e59cdf0ull}},
        {QTYPE_IQ1_S, 50, {0x75496f7f53e0e2e8ull, 0x8674cea22d34dd45ull, 0xb824605569ef4729ull}},
        {QTYPE_IQ1_M, 56, {0x8ca0211ed8f60655ull, 0xddf9420aec40044full, 0x7bb9c6a7d0bdf6abull}},
        {QTYPE_TQ1_0, 54, {0x7616a636090dd9b1ull, 0x59d537b51d9a6f29ull, 0xaa8000c5dc70003dull}},
        {QTYPE_TQ2_0, 66, {0xca3fcd8f561ef485ull, 0x42cdab39a8dd4c96ull, 0x35ced78ba8be9efeull}},
    };
    static const struct {
        qtype t;
        uint64_t quant[3];
    } want_q[] = {
        {QTYPE_TQ1_0, {0x6211be33802e1850ull, 0x04996b9dd2a60f13ull, 0xd0f495e5feb5c0a1ull}},
        {QTYPE_TQ2_0, {0xa5c571f7d2cf4eddull, 0x2f904eb9553a287eull, 0x23085724b88d594eull}},
        {QTYPE_IQ3_XXS, {0x8e56acc1968696dfull, 0x391163bc622c536bull, 0x9798ff1a2fc21ce5ull}},
        {QTYPE_IQ3_S, {0x73e4136a471b8b8full, 0x89277555e78cc825ull, 0xf3a2d23825f685d3ull}},
        {QTYPE_IQ2_S, {0xb51feaf2d450d483ull, 0x7fd8025703e72addull, 0xfe6365854a134942ull}},
    };
    int64_t n = 256 * 64;
    float *x = malloc((size_t)n * 4);
    unsigned char *q = malloc((size_t)n * 4);
    for (size_t k = 0; k < TM_ARRAY_LEN(want); k++) {
        CHECK(quant_weight_type(want[k].t) && quant_block_elems(want[k].t) == 256);
        CHECK(quant_block_bytes(want[k].t) == want[k].bytes && quant_vec_dot_type(want[k].t) == QTYPE_Q8_K);
        CHECK(!strcmp(quant_type_name(want[k].t), quant_ggml_type_name(want[k].t)));
        size_t sz = quant_row_bytes(want[k].t, n);
        for (int dist = 0; dist < 3; dist++) {
            util_rng r;
            util_rng_seed(&r, 7 + dist);
            for (size_t i = 0; i < sz; i++) q[i] = (unsigned char)(util_rng_next(&r) >> 56);
            quant_dequantize_row(want[k].t, q, x, n);
            for (int64_t i = 0; i < n; i++)
                if (isnan(x[i])) x[i] = f_of(0x7fc00000u);
            uint64_t h = fnv1a(x, (size_t)n * 4);
            CHECKF(h == want[k].dequant[dist], "%s dequantise %d: %016llx", quant_type_name(want[k].t), dist,
                   (unsigned long long)h);
        }
    }
    for (size_t k = 0; k < TM_ARRAY_LEN(want_q); k++) {
        CHECK(quant_iq_can_quantize(want_q[k].t));
        size_t sz = quant_row_bytes(want_q[k].t, n);
        for (int dist = 0; dist < 3; dist++) {
            fill_dist(x, n, dist);
            memset(q, 0xAA, sz);
            quant_quantize_row(want_q[k].t, x, q, n);
            uint64_t h = fnv1a(q, sz);
            CHECKF(h == want_q[k].quant[dist], "%s quantise %d: %016llx", quant_type_name(want_q[k].t), dist,
                   (unsigned long long)h);
        }
    }
    /* ggml needs an importance matrix to quantise these: mkmodel does not write them */
    CHECK(!quant_iq_can_quantize(QTYPE_IQ2_XXS) && !quant_iq_can_quantize(QTYPE_IQ1_S));
    free(x);
    free(q);
}

/* The grids are the bundled ggml's tables, entry for entry (ggml-common.h's GGML_TABLE_BEGIN
 * blocks, read as text). */
TEST(test_iq_grids_match_ggml)
{
    FILE *f = fopen("tests/data/llama.cpp/ggml/src/ggml-common.h", "rb");
    CHECKF(f != NULL, "tests/data/llama.cpp missing: run scripts/fetch-testdata.sh");
    if (!f) return;
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    static const struct {
        const char *name;
        const void *ours;
        int size, n;
    } tabs[] = {
        {"ksigns_iq2xs", quant_grids_ksigns, 1, 128},  {"iq2xxs_grid", quant_grids_iq2xxs, 8, 256},
        {"iq2xs_grid", quant_grids_iq2xs, 8, 512},     {"iq2s_grid", quant_grids_iq2s, 8, 1024},
        {"iq3xxs_grid", quant_grids_iq3xxs, 4, 256},   {"iq3s_grid", quant_grids_iq3s, 4, 512},
        {"iq1s_grid", quant_grids_iq1s, 8, 2048},
    };
    for (size_t k = 0; k < TM_ARRAY_LEN(tabs); k++) {
        char key[64];
        snprintf(key, sizeof key, ", %s,", tabs[k].name);
        const char *p = strstr(text, key);
        CHECKF(p != NULL, "%s not in ggml-common.h", tabs[k].name);
        if (!p) continue;
        p = strchr(p, ')') + 1;
        const char *end = strstr(p, "GGML_TABLE_END");
        int i = 0, bad = 0;
        while (p < end) {
            char *e;
            unsigned long long v = strtoull(p, &e, 0);
            if (e == p) {
                p++;
                continue;
            }
            p = e;
            if (i < tabs[k].n) {
                unsigned long long o = tabs[k].size == 1 ? ((const uint8_t *)tabs[k].ours)[i]
                                     : tabs[k].size == 4 ? ((const uint32_t *)tabs[k].ours)[i]
                                                         : ((const uint64_t *)tabs[k].ours)[i];
                bad += o != v;
            }
            i++;
        }
        CHECKF(i == tabs[k].n && bad == 0, "%s: %d entries, %d differ", tabs[k].name, i, bad);
    }
}

/* Q8_1 activations: Q8_0's scale and values (llama.cpp's x86 quantiser) and s = d * sum. */
TEST(test_q8_1_act)
{
    float x[64];
    fill_dist(x, 64, 0);
    block_q8_0 a[2];
    block_q8_1 b[2];
    quant_act_q8_0(x, a, 64);
    quant_act_q8_1(x, b, 64);
    for (int i = 0; i < 2; i++) {
        CHECK(a[i].d == b[i].d && !memcmp(a[i].qs, b[i].qs, 32));
        int sum = 0;
        float amax = 0;
        for (int j = 0; j < 32; j++) sum += b[i].qs[j];
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * i + j]));
        CHECK(b[i].s == quant_fp32_to_fp16(amax / 127.f * (float)sum));
    }
}

/* MXFP4 as ggml lays it out: E8M0 scale byte, element j in the low nibble of qs[j] and
 * j + 16 in the high one, doubled E2M1 values times 2^(e - 128) (ggml_e8m0_to_fp32_half,
 * subnormal for e 0 and 1), and the reference quantiser's exponent floor(log2(amax)) - 2. */
TEST(test_mxfp4_layout)
{
    CHECK(quant_block_elems(QTYPE_MXFP4) == 32 && quant_block_bytes(QTYPE_MXFP4) == 17);
    CHECK(quant_vec_dot_type(QTYPE_MXFP4) == QTYPE_Q8_0 && quant_type_supported(39));
    CHECK(quant_e8m0_half(128) == 1.0f && quant_e8m0_half(127) == 0.5f && quant_e8m0_half(130) == 4.0f);
    CHECK(quant_e8m0_half(1) == 0x1p-127f && quant_e8m0_half(0) == 0x1p-128f);
    block_mxfp4 b = {.e = 129};
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    quant_dequantize_row(QTYPE_MXFP4, &b, y, 32);
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; j++) {
        CHECKF(y[j] == 4 * e2m1[j], "element %d: %g", j, y[j]);           /* scale 2^(129-127) */
        CHECKF(y[j + 16] == 4 * e2m1[15 - j], "element %d: %g", j + 16, y[j + 16]);
    }
    /* amax 5.9: e = floor(log2 5.9) - 2 + 127 = 127, values on the grid come back exactly */
    float x[32] = {5.9f, -3.0f, 1.5f, 0.5f, 0.24f};
    block_mxfp4 q;
    quant_quantize_row(QTYPE_MXFP4, x, &q, 32);
    CHECK(q.e == 127);
    quant_dequantize_row(QTYPE_MXFP4, &q, y, 32);
    CHECK(y[0] == 6.0f && y[1] == -3.0f && y[2] == 1.5f && y[3] == 0.5f && y[4] == 0.0f && y[31] == 0.0f);
}

/* Quantise then dequantise: relative RMS error within what each format allows. */
TEST(test_round_trip_error)
{
    static const struct {
        qtype t;
        double max_rel_rmse;
    } cases[] = {
        {QTYPE_F32, 0},         {QTYPE_F16, 1e-3},      {QTYPE_BF16, 5e-3},
        {QTYPE_Q8_0, 0.01},     {QTYPE_Q4_0, 0.15},     {QTYPE_Q4_K, 0.12},     {QTYPE_Q5_K, 0.06},
        {QTYPE_Q6_K, 0.03},     {QTYPE_Q8_K, 0.01},     {QTYPE_MXFP4, 0.2},
    };
    int64_t n = 256 * 16;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    void *q = malloc((size_t)n * 4);
    fill_dist(x, n, 0);
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    for (size_t k = 0; k < TM_ARRAY_LEN(cases); k++) {
        quant_quantize_row(cases[k].t, x, q, n);
        quant_dequantize_row(cases[k].t, q, y, n);
        double se = 0;
        for (int64_t i = 0; i < n; i++) se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        double rel = sqrt(se / ss);
        CHECKF(rel <= cases[k].max_rel_rmse, "%s: %g", quant_type_name(cases[k].t), rel);
    }
    /* all-zero input stays zero and does not divide by zero */
    memset(x, 0, (size_t)n * 4);
    for (size_t k = 0; k < TM_ARRAY_LEN(cases); k++) {
        quant_quantize_row(cases[k].t, x, q, n);
        quant_dequantize_row(cases[k].t, q, y, n);
        int nz = 0;
        for (int64_t i = 0; i < n; i++) nz += y[i] != 0;
        CHECKF(nz == 0, "%s", quant_type_name(cases[k].t));
    }
    free(x);
    free(y);
    free(q);
}

TEST(test_q8_0_known_block)
{
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    block_q8_0 b;
    quant_quantize_row(QTYPE_Q8_0, x, &b, 32);
    CHECK(b.d == quant_fp32_to_fp16(16.f / 127));
    CHECK(b.qs[0] == -127 && b.qs[16] == 0 && b.qs[17] == 8 && b.qs[31] == 119);
    /* activation flavour: 127/amax scale and round half to even. 0.5 * 127/127 = 0.5 -> 0 */
    float a[32] = {0};
    a[0] = 127.f;
    a[1] = 0.5f;
    a[2] = 1.5f;
    a[3] = -2.5f;
    block_q8_0 c;
    quant_act_q8_0(a, &c, 32);
    CHECK(c.qs[0] == 127 && c.qs[1] == 0 && c.qs[2] == 2 && c.qs[3] == -2);
    quant_quantize_row(QTYPE_Q8_0, a, &c, 32); /* file flavour: roundf, half away from 0 */
    CHECK(c.qs[1] == 1 && c.qs[2] == 2 && c.qs[3] == -3);
}

TEST(test_q8_K_act)
{
    float x[256];
    for (int j = 0; j < 256; j++) x[j] = (float)(j % 16) - 7.5f;
    x[5] = -20.f; /* the signed max: scale is negative */
    block_q8_K b;
    quant_act_q8_K(x, &b, 256);
    CHECK(b.d == 20.f / 127.f);
    CHECK(b.qs[5] == -127);
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int l = 0; l < 16; l++) s += b.qs[g * 16 + l];
        CHECK(b.bsums[g] == s);
    }
    float y[256];
    quant_dequantize_row(QTYPE_Q8_K, &b, y, 256);
    for (int j = 0; j < 256; j++) CHECK(fabsf(y[j] - x[j]) <= 20.f / 127 * 0.5f + 1e-5f);
}

TEST(test_q4_K_scale_pack)
{
    /* scales j<4 in the low 6 bits of bytes 0..3 (mins 4..7); j>=4 split nibbles + high bits */
    uint8_t s[12] = {0};
    uint8_t want_sc[8] = {1, 63, 17, 40, 33, 5, 62, 0}, want_m[8] = {2, 0, 63, 9, 48, 31, 7, 60};
    for (int j = 0; j < 8; j++) {
        uint8_t ls = want_sc[j], lm = want_m[j];
        if (j < 4) {
            s[j] |= ls;
            s[j + 4] |= lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        quant_q4_K_scale_min(j, s, &sc, &m);
        CHECK(sc == want_sc[j] && m == want_m[j]);
    }
}

int main(void)
{
    RUN(test_type_table);
    RUN(test_fp16_known);
    RUN(test_bf16_known);
    RUN(test_ref_quantisers_match_ggml);
    RUN(test_more_types_match_ggml);
    RUN(test_iq_types_match_ggml);
    RUN(test_iq_grids_match_ggml);
    RUN(test_q8_1_act);
    RUN(test_mxfp4_layout);
    RUN(test_round_trip_error);
    RUN(test_q8_0_known_block);
    RUN(test_q8_K_act);
    RUN(test_q4_K_scale_pack);
    HARNESS_END();
}
