/*
 * test_ops: every op at every SIMD level this CPU has agrees with the scalar reference, and
 * with 1, 2 or 3 threads gives bit-identical results.
 *
 * Matmul: the scalar level is checked against a double-precision product of the dequantised
 * weights and the dequantised (quantised) activations; every other level against the scalar
 * level within a few float ulps of the sum of absolute terms (integer block sums are exact,
 * only the float accumulation order may differ).
 */
#include "harness.h"

#include <float.h>
#include <stdlib.h>

#include "model/ops.h"
#include "model/quant.h"
#include "model/quant_iq.h"
#include "util/util.h"

static const qtype mm_types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16,   QTYPE_Q4_0,   QTYPE_Q8_0,
                                 QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K,   QTYPE_MXFP4,  QTYPE_Q4_1,
                                 QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_IQ4_NL, QTYPE_Q2_K,   QTYPE_Q3_K,
                                 QTYPE_IQ4_XS, QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS,
                                 QTYPE_IQ3_S,  QTYPE_IQ1_S,  QTYPE_IQ1_M,  QTYPE_TQ1_0, QTYPE_TQ2_0};

/* Weights of a type mkmodel cannot write (ggml quantises them only with an importance
 * matrix, quant_iq.h): random block bytes, so every index, sign and scale pattern occurs,
 * under an fp16 super-block scale between 1/64 and 1/32. */
static void fill_iq_blocks(qtype t, void *dst, size_t bytes, uint64_t seed)
{
    util_rng r;
    util_rng_seed(&r, seed);
    unsigned char *p = dst;
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(util_rng_next(&r) >> 56);
    size_t bb = quant_block_bytes(t);
    for (size_t b = 0; b + bb <= bytes; b += bb) {
        fp16_t d = quant_fp32_to_fp16((float)(1.0 + util_rng_uniform(&r)) / 64);
        if (t == QTYPE_IQ1_M) { /* its scale is the top nibbles of the four scale words */
            block_iq1_m *m = (block_iq1_m *)(p + b);
            for (int k = 0; k < 4; k++) m->scales[2 * k + 1] = (uint8_t)((m->scales[2 * k + 1] & 0x0f) | ((d >> 4 * k) & 0xf) << 4);
        } else {
            memcpy(p + b, &d, 2);
        }
    }
}

static void fill_normal(float *x, int64_t n, uint64_t seed, float scale)
{
    util_rng r;
    util_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = util_rng_normal(&r) * scale;
}

static int n_levels(void) { return (int)cpu_get_hw_level() + 1; }

typedef struct {
    qtype t;
    int rows, cols, n_tokens;
    void *wq;        /* quantised weights */
    float *x;        /* (n_tokens, cols) */
    double *ref;     /* (n_tokens, rows) double product of dequantised operands */
    double *absref;  /* (n_tokens, rows) sum of |terms| */
    double *slack;   /* (n_tokens, rows) Q4_1 / Q5_1: what the min term's s = fp16(d * sum q)
                      * of Q8_1 may differ from the dequantised activations' sum (0 otherwise) */
} mm_case;

static void mm_case_slack(mm_case *c, const float *w);

static void mm_case_init(mm_case *c, qtype t, int rows, int cols, int n_tokens, uint64_t seed)
{
    c->t = t;
    c->rows = rows;
    c->cols = cols;
    c->n_tokens = n_tokens;
    float *w = malloc((size_t)rows * cols * 4);
    fill_normal(w, (int64_t)rows * cols, seed, 0.5f);
    size_t rb = quant_row_bytes(t, cols);
    c->wq = malloc(rb * rows);
    if (quant_iq_type(t) && !quant_iq_can_quantize(t))
        fill_iq_blocks(t, c->wq, rb * rows, seed);
    else
        for (int r = 0; r < rows; r++) quant_quantize_row(t, w + (size_t)r * cols, (char *)c->wq + r * rb, cols);
    for (int r = 0; r < rows; r++) quant_dequantize_row(t, (char *)c->wq + r * rb, w + (size_t)r * cols, cols);
    c->x = malloc((size_t)n_tokens * cols * 4);
    fill_normal(c->x, (int64_t)n_tokens * cols, seed + 1, 1.0f);
    /* dequantised activations as the kernels see them */
    qtype vt = quant_vec_dot_type(t);
    float *xd = malloc((size_t)n_tokens * cols * 4);
    void *xq = malloc(quant_row_bytes(vt, cols) + 64);
    for (int i = 0; i < n_tokens; i++) {
        const float *xi = c->x + (size_t)i * cols;
        if (vt == QTYPE_Q8_0) quant_act_q8_0(xi, xq, cols);
        else if (vt == QTYPE_Q8_K) quant_act_q8_K(xi, xq, cols);
        else if (vt == QTYPE_Q8_1) quant_act_q8_1(xi, xq, cols);
        else quant_quantize_row(vt, xi, xq, cols);
        quant_dequantize_row(vt, xq, xd + (size_t)i * cols, cols);
    }
    c->ref = malloc(sizeof(double) * n_tokens * rows);
    c->absref = malloc(sizeof(double) * n_tokens * rows);
    c->slack = calloc((size_t)n_tokens * rows, sizeof(double));
    for (int i = 0; i < n_tokens; i++)
        for (int r = 0; r < rows; r++) {
            double s = 0, a = 0;
            for (int j = 0; j < cols; j++) {
                double p = (double)w[(size_t)r * cols + j] * xd[(size_t)i * cols + j];
                s += p;
                a += fabs(p);
            }
            c->ref[(size_t)i * rows + r] = s;
            c->absref[(size_t)i * rows + r] = a;
        }
    if (t == QTYPE_Q4_1 || t == QTYPE_Q5_1) mm_case_slack(c, w);
    free(w);
    free(xd);
    free(xq);
}

/* Q4_1 / Q5_1 against Q8_1: c->slack (a function of its own: aarch64 GCC 12's vectoriser
 * fails on these loops inlined into mm_case_init) */
static __attribute__((noinline, optimize("no-tree-vectorize"))) void mm_case_slack(mm_case *c, const float *w)
{
    int rows = c->rows, cols = c->cols, n_tokens = c->n_tokens;
    {
        /* per block |m_w| <= max |w| times |s - d * sum q| (s rounded to fp16 from the unrounded d) */
        block_q8_1 *xb = malloc(quant_row_bytes(QTYPE_Q8_1, cols));
        for (int i = 0; i < n_tokens; i++) {
            quant_act_q8_1(c->x + (size_t)i * cols, xb, cols);
            for (int r = 0; r < rows; r++)
                for (int b = 0; b < cols / 32; b++) {
                    int sum = 0;
                    double wmax = 0;
                    for (int j = 0; j < 32; j++) sum += xb[b].qs[j];
                    for (int j = 0; j < 32; j++) wmax = fmax(wmax, fabs(w[(size_t)r * cols + 32 * b + j]));
                    double e = fabs(quant_fp16_to_fp32(xb[b].s) - (double)quant_fp16_to_fp32(xb[b].d) * sum);
                    c->slack[(size_t)i * rows + r] += 2 * wmax * e;
                }
        }
        free(xb);
    }
}

static void mm_case_free(mm_case *c)
{
    free(c->wq);
    free(c->x);
    free(c->ref);
    free(c->absref);
    free(c->slack);
}

static void mm_run(const mm_case *c, threadpool *tp, float *y)
{
    ops_weight w = {c->t, c->rows, c->cols, c->wq};
    void *scratch = malloc(ops_matmul_scratch_bytes(c->t, c->cols, c->n_tokens) + 1);
    ops_matmul(tp, &w, c->x, c->n_tokens, y, scratch);
    free(scratch);
}

static int check_mm(qtype t, int rows, int cols, int n_tokens, threadpool **pools)
{
    mm_case c;
    mm_case_init(&c, t, rows, cols, n_tokens, 1000 + (uint64_t)t * 7 + (uint64_t)rows + cols);
    size_t ny = (size_t)n_tokens * rows;
    float *y_ref = malloc(ny * 4), *y = malloc(ny * 4);
    int bad = 0;
    /* block contributions are rounded once each in float, plus fp16 scale products */
    int nb = cols / (int)quant_block_elems(quant_vec_dot_type(t)) + 1;
    if (nb > cols / 8 + 1) nb = cols / 8 + 1;
    double rel = (double)FLT_EPSILON * (nb + 8);

    ops_force_level(CPU_LEVEL_SCALAR);
    mm_run(&c, NULL, y_ref);
    for (size_t i = 0; i < ny; i++) {
        double tol = 4 * rel * c.absref[i] + c.slack[i] + 1e-30;
        if (fabs(y_ref[i] - c.ref[i]) > tol) {
            if (bad++ < 3)
                fprintf(stderr, "  %s %dx%dx%d scalar[%zu]=%g ref=%g\n", quant_type_name(t), rows,
                        cols, n_tokens, i, y_ref[i], c.ref[i]);
        }
    }
    for (int lvl = 0; lvl < n_levels(); lvl++) {
        ops_force_level((cpu_level)lvl);
        float *y1 = NULL;
        for (int th = 0; th < 3; th++) {
            memset(y, 0xff, ny * 4);
            mm_run(&c, pools[th], y);
            if (th == 0) {
                y1 = malloc(ny * 4);
                memcpy(y1, y, ny * 4);
                for (size_t i = 0; i < ny; i++) {
                    /* the codebook types' kernels are bit-identical at every level */
                    double tol = quant_iq_type(t) ? 0 : 2 * rel * c.absref[i] + 1e-30;
                    if (!(fabs((double)y[i] - y_ref[i]) <= tol)) {
                        if (bad++ < 3)
                            fprintf(stderr, "  %s %dx%dx%d %s[%zu]=%.9g scalar=%.9g tol %g\n",
                                    quant_type_name(t), rows, cols, n_tokens, ops_level_name(), i,
                                    y[i], y_ref[i], tol);
                    }
                }
            } else if (memcmp(y, y1, ny * 4)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s %dx%dx%d %s: %d threads differ from 1\n",
                            quant_type_name(t), rows, cols, n_tokens, ops_level_name(), th + 1);
            }
        }
        free(y1);
    }
    free(y_ref);
    free(y);
    mm_case_free(&c);
    return bad;
}

static threadpool *pools[3];

TEST(test_matmul_all_types)
{
    static const int shapes[][3] = {
        /* rows, cols (multiple of 256 for k-quants), tokens */
        {1, 256, 1}, {7, 256, 3}, {33, 512, 5}, {64, 768, 16}, {45, 1024, 17}, {130, 256, 33},
        {16, 256, 130},
    };
    for (size_t ti = 0; ti < TM_ARRAY_LEN(mm_types); ti++)
        for (size_t s = 0; s < TM_ARRAY_LEN(shapes); s++)
            CHECKF(check_mm(mm_types[ti], shapes[s][0], shapes[s][1], shapes[s][2], pools) == 0,
                   "%s %dx%dx%d", quant_type_name(mm_types[ti]), shapes[s][0], shapes[s][1],
                   shapes[s][2]);
}

TEST(test_matmul_odd_cols)
{
    /* types with small blocks accept any multiple of their block size */
    static const qtype t32[] = {QTYPE_Q4_0, QTYPE_Q8_0, QTYPE_MXFP4, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_IQ4_NL};
    for (size_t i = 0; i < TM_ARRAY_LEN(t32); i++) {
        CHECK(check_mm(t32[i], 5, 32, 2, pools) == 0);
        CHECK(check_mm(t32[i], 19, 96, 7, pools) == 0);
        CHECK(check_mm(t32[i], 3, 288, 1, pools) == 0);
    }
    static const qtype tf[] = {QTYPE_F32, QTYPE_F16, QTYPE_BF16};
    for (size_t i = 0; i < TM_ARRAY_LEN(tf); i++) {
        CHECK(check_mm(tf[i], 5, 1, 2, pools) == 0);
        CHECK(check_mm(tf[i], 9, 37, 3, pools) == 0);
        CHECK(check_mm(tf[i], 17, 300, 6, pools) == 0);
    }
}

/* Batch invariance: a token's y is bit-identical whatever the batch around it (n_tokens, its
 * index in the batch, so the kernel tile it lands in) and whatever the thread count. The
 * reference is the token computed alone (n_tokens = 1, no threads). */
static int check_mm_invariant(qtype t, int rows, int cols)
{
    enum { NMAX = 130 };
    static const int ns[] = {1, 2, 3, 4, 5, 16, 17, 130};
    mm_case c;
    mm_case_init(&c, t, rows, cols, NMAX, 4242 + (uint64_t)t);
    ops_weight w = {t, rows, cols, c.wq};
    void *scratch = malloc(ops_matmul_scratch_bytes(t, cols, NMAX) + 1);
    float *alone = malloc((size_t)NMAX * rows * 4), *y = malloc((size_t)NMAX * rows * 4);
    int bad = 0;
    for (int lvl = 0; lvl < n_levels(); lvl++) {
        ops_force_level((cpu_level)lvl);
        for (int i = 0; i < NMAX; i++)
            ops_matmul(NULL, &w, c.x + (size_t)i * cols, 1, alone + (size_t)i * rows, scratch);
        for (size_t k = 0; k < TM_ARRAY_LEN(ns); k++)
            for (int th = 0; th < 3; th++) {
                /* batches ending at different tokens, so each token sits at several tile
                 * offsets */
                for (int off = 0; off + ns[k] <= NMAX; off += ns[k] == NMAX ? NMAX : 37) {
                    ops_matmul(pools[th], &w, c.x + (size_t)off * cols, ns[k], y, scratch);
                    if (memcmp(y, alone + (size_t)off * rows, (size_t)ns[k] * rows * 4)) {
                        if (bad++ < 3)
                            fprintf(stderr, "  %s %dx%d %s: n_tokens %d from %d, %d threads "
                                    "differ from one token alone\n", quant_type_name(t), rows,
                                    cols, ops_level_name(), ns[k], off, th + 1);
                    }
                }
            }
    }
    free(alone);
    free(y);
    free(scratch);
    mm_case_free(&c);
    return bad;
}

TEST(test_matmul_batch_invariant)
{
    for (size_t ti = 0; ti < TM_ARRAY_LEN(mm_types); ti++) {
        CHECKF(check_mm_invariant(mm_types[ti], 37, 512) == 0, "%s", quant_type_name(mm_types[ti]));
        CHECKF(check_mm_invariant(mm_types[ti], 5, 256) == 0, "%s", quant_type_name(mm_types[ti]));
    }
    static const qtype t32[] = {QTYPE_Q4_0, QTYPE_Q8_0, QTYPE_MXFP4, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_IQ4_NL};
    for (size_t i = 0; i < TM_ARRAY_LEN(t32); i++) {
        CHECK(check_mm_invariant(t32[i], 19, 96) == 0);
        /* 9 blocks: one whole group of 8 unpacked blocks and one more (ops_kblk32_gemm) */
        CHECK(check_mm_invariant(t32[i], 17, 288) == 0);
    }
    static const qtype tf[] = {QTYPE_F32, QTYPE_F16, QTYPE_BF16};
    for (size_t i = 0; i < TM_ARRAY_LEN(tf); i++) CHECK(check_mm_invariant(tf[i], 9, 37) == 0);
}

/* Repacked Q8_0 / Q4_0 / MXFP4 / Q4_K / Q6_K (quant_repack, 16-row interleaved): at every level and thread count
 * the result is bit-identical to the original layout at the scalar level, and a token's y
 * is the same whatever the batch around it. */
static int check_mm_repacked(qtype t, int rows, int cols, int n_tokens)
{
    mm_case c;
    mm_case_init(&c, t, rows, cols, n_tokens, 555 + (uint64_t)t * 3 + (uint64_t)rows + cols);
    qtype rt = quant_repack_type(t);
    size_t bytes = quant_row_bytes(rt, cols) * (size_t)rows;
    void *wr = aligned_alloc(64, TM_ALIGN_UP(bytes, 64));
    quant_repack(t, c.wq, wr, cols, 0, rows);
    ops_weight w0 = {t, rows, cols, c.wq}, w1 = {rt, rows, cols, wr};
    size_t ny = (size_t)n_tokens * rows;
    float *y_ref = malloc(ny * 4), *y = malloc(ny * 4), *alone = malloc(ny * 4);
    void *scratch = malloc(ops_matmul_scratch_bytes(t, cols, n_tokens) + 1);
    int bad = 0;
    ops_force_level(CPU_LEVEL_SCALAR);
    ops_matmul(NULL, &w0, c.x, n_tokens, y_ref, scratch);
    for (int lvl = 0; lvl < n_levels(); lvl++) {
        ops_force_level((cpu_level)lvl);
        if (lvl == (int)cpu_get_hw_level() && lvl == CPU_LEVEL_AVX512)
            CHECK(ops_repack_type(&w0) == rt || getenv("TOKENMILL_REPACK"));
        for (int i = 0; i < n_tokens; i++)
            ops_matmul(NULL, &w1, c.x + (size_t)i * cols, 1, alone + (size_t)i * rows, scratch);
        if (memcmp(alone, y_ref, ny * 4) && bad++ < 3)
            fprintf(stderr, "  %s %dx%d %s: one token at a time differs from the scalar "
                    "reference of the original layout\n", quant_type_name(rt), rows, cols,
                    ops_level_name());
        for (int th = 0; th < 3; th++) {
            memset(y, 0xff, ny * 4);
            ops_matmul(pools[th], &w1, c.x, n_tokens, y, scratch);
            if (memcmp(y, alone, ny * 4) && bad++ < 3)
                fprintf(stderr, "  %s %dx%dx%d %s, %d threads: batched differs from alone\n",
                        quant_type_name(rt), rows, cols, n_tokens, ops_level_name(), th + 1);
        }
    }
    free(scratch);
    free(alone);
    free(y);
    free(y_ref);
    free(wr);
    mm_case_free(&c);
    return bad;
}

/* The codebook and ternary types' batch kernels sum in int16 where the per-row dots widen
 * sooner: at the range edges (every scale and delta bit set, activations all +-127 or
 * alternating) a batch of 3 tokens over 8 rows (two 4-row tiles) must still equal the scalar
 * level token by token, bit for bit, at every level. */
TEST(test_matmul_iq_edges)
{
    static const qtype ts[] = {QTYPE_IQ1_S, QTYPE_IQ1_M, QTYPE_TQ1_0, QTYPE_TQ2_0, QTYPE_IQ2_XXS,
                               QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS, QTYPE_IQ3_S};
    enum { R = 8, C = 512 };
    float xe[3 * C], y0[3 * R], y1[3 * R];
    for (int i = 0; i < C; i++) {
        xe[i] = 1.0f;  /* all -127 (Q8_K scales by -127 / the signed maximum) */
        xe[C + i] = -1.0f;
        xe[2 * C + i] = (i & 1) ? 2.0f : -2.0f;
    }
    for (size_t ti = 0; ti < TM_ARRAY_LEN(ts); ti++)
        for (int fill = 0; fill < 2; fill++) {
            const qtype t = ts[ti];
            const size_t rb = quant_row_bytes(t, C), bsz = quant_block_bytes(t);
            unsigned char *w = malloc(rb * R);
            util_rng g;
            util_rng_seed(&g, 17 + (uint64_t)fill);
            for (size_t i = 0; i < rb * R; i++) w[i] = fill ? (unsigned char)util_rng_next(&g) : 0xFF;
            const fp16_t one = quant_fp32_to_fp16(1.0f);
            for (size_t b = 0; b < rb * R; b += bsz) {   /* a finite super-block scale of 1 */
                if (t == QTYPE_IQ1_M) {
                    block_iq1_m *m = (block_iq1_m *)(w + b);
                    for (int k = 0; k < 4; k++)
                        m->scales[2 * k + 1] = (uint8_t)((m->scales[2 * k + 1] & 0x0f) | ((one >> 4 * k) & 0xf) << 4);
                } else {
                    size_t off = t == QTYPE_TQ1_0 ? offsetof(block_tq1_0, d)
                                 : t == QTYPE_TQ2_0 ? offsetof(block_tq2_0, d) : 0;
                    memcpy(w + b + off, &one, sizeof one);
                }
            }
            void *sc = malloc(ops_matmul_scratch_bytes(t, C, 3));
            ops_weight a = {t, R, C, w};
            ops_force_level(CPU_LEVEL_SCALAR);
            for (int tok = 0; tok < 3; tok++) ops_matmul(NULL, &a, xe + (size_t)tok * C, 1, y0 + tok * R, sc);
            for (int lvl = 0; lvl < n_levels(); lvl++) {
                ops_force_level((cpu_level)lvl);
                ops_matmul(NULL, &a, xe, 3, y1, sc);
                CHECKF(!memcmp(y0, y1, sizeof y0), "%s %s at the range edges (fill %d)",
                       quant_type_name(t), ops_level_name(), fill);
            }
            free(sc);
            free(w);
        }
}

TEST(test_matmul_repacked)
{
    static const int shapes[][3] = {
        {16, 256, 1}, {32, 512, 3}, {48, 256, 5}, {160, 1024, 17}, {64, 768, 130},
    };
    static const qtype ts[] = {QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_MXFP4};
    for (size_t ti = 0; ti < TM_ARRAY_LEN(ts); ti++)
        for (size_t s = 0; s < TM_ARRAY_LEN(shapes); s++)
            CHECKF(check_mm_repacked(ts[ti], shapes[s][0], shapes[s][1], shapes[s][2]) == 0,
                   "%s %dx%dx%d", quant_type_name(ts[ti]), shapes[s][0], shapes[s][1],
                   shapes[s][2]);
    /* MXFP4 exponents 0 and 1 (the subnormal scales) and every code, from random bytes */
    {
        enum { R = 32, C = 128 };
        static block_mxfp4 wm[R * C / 32];
        static block_mxfp4x16 wx[R * C / 32 / 2] __attribute__((aligned(64)));
        util_rng g;
        util_rng_seed(&g, 77);
        for (int i = 0; i < R * C / 32; i++) {
            /* rows 0-15 only tiny scales (rounding would hide them beside normal ones) */
            wm[i].e = (uint8_t)(i / (C / 32) < 16 ? (uint64_t)(i % 4) : 100 + util_rng_next(&g) % 40);
            for (int j = 0; j < 16; j++) wm[i].qs[j] = (uint8_t)util_rng_next(&g);
        }
        quant_repack(QTYPE_MXFP4, wm, wx, C, 0, R);
        float xm[2 * C], y0[2 * R], y1[2 * R];
        for (int i = 0; i < 2 * C; i++) xm[i] = (float)util_rng_normal(&g);
        void *sc = malloc(ops_matmul_scratch_bytes(QTYPE_MXFP4, C, 2));
        ops_weight a = {QTYPE_MXFP4, R, C, wm}, b = {QTYPE_MXFP4_X16, R, C, wx};
        ops_force_level(CPU_LEVEL_SCALAR);
        ops_matmul(NULL, &a, xm, 2, y0, sc);
        ops_force_level(cpu_get_hw_level());
        ops_matmul(NULL, &b, xm, 2, y1, sc);
        CHECKF(!memcmp(y0, y1, sizeof y0), "mxfp4x16 %s with exponents 0 and 1", ops_level_name());
        free(sc);
    }
    /* Q4_K / Q6_K at the edges of their integer ranges (every nibble and 6-bit scale at its
     * largest, then random bytes; activations all +-127): the repacked kernels' int32 sums
     * (high nibbles kept in place, 16 times their value) neither overflow nor round */
    for (int kt = 0; kt < 2; kt++)
        for (int fill = 0; fill < 2; fill++) {
            enum { R = 32, C = 512 };
            const qtype t = kt ? QTYPE_Q6_K : QTYPE_Q4_K, rt = quant_repack_type(t);
            const size_t rb = quant_row_bytes(t, C), bsz = quant_block_bytes(t);
            char *wf = malloc(rb * R), *wx = aligned_alloc(64, quant_row_bytes(rt, C) * R);
            util_rng g;
            util_rng_seed(&g, 91 + (uint64_t)fill);
            for (size_t i = 0; i < rb * R; i++) wf[i] = fill ? (char)util_rng_next(&g) : (char)0xFF;
            for (size_t i = 0; i < rb * R; i += bsz) {   /* finite super-block scales */
                fp16_t one = quant_fp32_to_fp16(1.0f), half = quant_fp32_to_fp16(0.5f);
                if (kt) memcpy(wf + i + offsetof(block_q6_K, d), &one, sizeof one);
                else {
                    memcpy(wf + i + offsetof(block_q4_K, d), &one, sizeof one);
                    memcpy(wf + i + offsetof(block_q4_K, dmin), &half, sizeof half);
                }
            }
            quant_repack(t, wf, wx, C, 0, R);
            float xe[3 * C], y0[3 * R], y1[3 * R];
            for (int i = 0; i < C; i++) {
                xe[i] = 1.0f;                                 /* all +127 */
                xe[C + i] = -1.0f;                            /* all -127 */
                xe[2 * C + i] = (i & 1) ? 2.0f : -2.0f;
            }
            void *sc = malloc(ops_matmul_scratch_bytes(t, C, 3));
            ops_weight a = {t, R, C, wf}, b = {rt, R, C, wx};
            ops_force_level(CPU_LEVEL_SCALAR);
            ops_matmul(NULL, &a, xe, 3, y0, sc);
            ops_force_level(cpu_get_hw_level());
            ops_matmul(NULL, &b, xe, 3, y1, sc);
            CHECKF(!memcmp(y0, y1, sizeof y0), "%s %s at the range edges (fill %d)",
                   quant_type_name(rt), ops_level_name(), fill);
            free(sc);
            free(wx);
            free(wf);
        }
    /* ops_repack (threaded) writes what quant_repack does, and only eligible weights */
    ops_weight odd = {QTYPE_Q4_K, 17, 256, NULL}, q8 = {QTYPE_Q8_0, 16, 96, NULL},
               q8r = {QTYPE_Q8_0, 24, 256, NULL}, q5 = {QTYPE_Q5_K, 16, 256, NULL};
    CHECK(ops_repack_type(&odd) == QTYPE_Q4_K);
    CHECK(ops_repack_type(&q8) == QTYPE_Q8_0);   /* cols not a multiple of 64 */
    CHECK(ops_repack_type(&q8r) == QTYPE_Q8_0);  /* rows not a multiple of 16 */
    CHECK(ops_repack_type(&q5) == QTYPE_Q5_K);   /* no repacked layout */
    mm_case c;
    mm_case_init(&c, QTYPE_Q6_K, 64, 512, 1, 9);
    size_t bytes = quant_row_bytes(QTYPE_Q6_K_X16, 512) * 64;
    void *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    ops_weight w = {QTYPE_Q6_K, 64, 512, c.wq};
    quant_repack(QTYPE_Q6_K, c.wq, a, 512, 0, 64);
    ops_force_level(cpu_get_hw_level());
    if (ops_repack_type(&w) == QTYPE_Q6_K_X16) {
        ops_weight r = ops_repack(pools[1], &w, b);
        CHECK(r.type == QTYPE_Q6_K_X16 && r.data == b && r.rows == 64);
        CHECK(!memcmp(a, b, bytes));
    }
    free(a);
    free(b);
    mm_case_free(&c);
}

TEST(test_matmul_multi)
{
    /* Q4_K_M style: q, k in Q4_K and v in Q6_K share Q8_K activations; plus an F16 one */
    int cols = 512, nt = 5;
    mm_case cs[4];
    qtype ts[4] = {QTYPE_Q4_K, QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_F16};
    int rows[4] = {64, 32, 48, 16};
    for (int i = 0; i < 4; i++) mm_case_init(&cs[i], ts[i], rows[i], cols, nt, 77 + (uint64_t)i);
    /* same x for all */
    for (int i = 1; i < 4; i++) memcpy(cs[i].x, cs[0].x, (size_t)nt * cols * 4);
    for (int lvl = 0; lvl < n_levels(); lvl++) {
        ops_force_level((cpu_level)lvl);
        ops_weight w[4];
        const ops_weight *wp[4];
        float *ys[4], *yr[4];
        for (int i = 0; i < 4; i++) {
            w[i] = (ops_weight){ts[i], rows[i], cols, cs[i].wq};
            wp[i] = &w[i];
            ys[i] = malloc((size_t)nt * rows[i] * 4);
            yr[i] = malloc((size_t)nt * rows[i] * 4);
            void *s = malloc(ops_matmul_scratch_bytes(ts[i], cols, nt) + 1);
            ops_matmul(pools[0], &w[i], cs[0].x, nt, yr[i], s);
            free(s);
        }
        for (int th = 0; th < 3; th++) {
            void *s = malloc(ops_matmul_multi_scratch_bytes(4, wp, nt));
            ops_matmul_multi(pools[th], 4, wp, cs[0].x, nt, ys, s);
            free(s);
            for (int i = 0; i < 4; i++)
                CHECKF(!memcmp(ys[i], yr[i], (size_t)nt * rows[i] * 4), "%s weight %d th %d",
                       ops_level_name(), i, th + 1);
        }
        for (int i = 0; i < 4; i++) {
            free(ys[i]);
            free(yr[i]);
        }
    }
    for (int i = 0; i < 4; i++) mm_case_free(&cs[i]);
}

/* Compares the elementwise ops at each level (and thread count) with the scalar level. */
TEST(test_elementwise)
{
    int rows = 7, n = 1000;
    size_t N = (size_t)rows * n;
    float *x = malloc(N * 4), *g = malloc(N * 4), *w = malloc(n * 4);
    float *ref = malloc(N * 4), *out = malloc(N * 4);
    fill_normal(x, (int64_t)N, 1, 2.0f);
    fill_normal(g, (int64_t)N, 2, 3.0f);
    fill_normal(w, n, 3, 1.0f);
    for (int op = 0; op < 4; op++) {
        ops_force_level(CPU_LEVEL_SCALAR);
        memcpy(ref, g, N * 4);
        if (op == 0) ops_rmsnorm(NULL, ref, x, w, rows, n, 1e-6f);
        if (op == 1) ops_rmsnorm(NULL, ref, x, NULL, rows, n, 1e-5f);
        if (op == 2) ops_swiglu(NULL, ref, g, x, rows, n);
        if (op == 3) ops_add(NULL, ref, x, (int64_t)N);
        for (int lvl = 0; lvl < n_levels(); lvl++) {
            ops_force_level((cpu_level)lvl);
            for (int th = 0; th < 3; th++) {
                memcpy(out, g, N * 4);
                if (op == 0) ops_rmsnorm(pools[th], out, x, w, rows, n, 1e-6f);
                if (op == 1) ops_rmsnorm(pools[th], out, x, NULL, rows, n, 1e-5f);
                if (op == 2) ops_swiglu(pools[th], out, g, x, rows, n);
                if (op == 3) ops_add(pools[th], out, x, (int64_t)N);
                int bad = 0;
                for (size_t i = 0; i < N; i++) {
                    float tol = 4 * FLT_EPSILON * fabsf(ref[i]) + 1e-30f;
                    if (op == 2) tol = 8 * FLT_EPSILON * (fabsf(ref[i]) + fabsf(x[i]));
                    if (!(fabsf(out[i] - ref[i]) <= tol)) bad++;
                }
                CHECKF(bad == 0, "op %d %s th %d: %d mismatches", op, ops_level_name(), th + 1, bad);
            }
        }
    }
    free(x);
    free(g);
    free(w);
    free(ref);
    free(out);
}

/* Quantised KV rows (Q8_0, Q4_0) against a Q8_0 query row: every level agrees with the scalar
 * reference (the integer dots are exact; only the float sum of the blocks may round
 * differently) and with the double dot of the dequantised operands. */
TEST(test_vec_dot_kv)
{
    static const qtype kt[] = { QTYPE_Q8_0, QTYPE_Q4_0 };
    enum { N = 288 };   /* a latent row of the test MLA model: 9 blocks */
    float k[N], q[N], kd[N], qd[N];
    block_q8_0 kq8[N / QK8_0], qq[N / QK8_0];
    block_q4_0 kq4[N / QK4_0];
    for (int rep = 0; rep < 20; rep++) {
        fill_normal(k, N, 100 + rep, rep % 2 ? 0.5f : 3.0f);
        fill_normal(q, N, 200 + rep, 1.0f);
        if (rep == 3) k[5] = 40.0f;   /* one large value: the block's scale follows it */
        quant_act_q8_0(q, qq, N);
        quant_dequantize_row(QTYPE_Q8_0, qq, qd, N);
        for (int it = 0; it < 2; it++) {
            void *kb = it == 0 ? (void *)kq8 : (void *)kq4;
            quant_quantize_row(kt[it], k, kb, N);
            quant_dequantize_row(kt[it], kb, kd, N);
            double want = 0, mag = 0;
            for (int i = 0; i < N; i++) want += (double)kd[i] * qd[i], mag += fabs((double)kd[i] * qd[i]);
            ops_force_level(CPU_LEVEL_SCALAR);
            float ref = ops_vec_dot_kv(kt[it], N, kb, qq);
            CHECKF(fabs(ref - want) <= 1e-5 * mag + 1e-6, "%s scalar %g want %g", quant_type_name(kt[it]), ref, want);
            for (int lvl = 1; lvl < n_levels(); lvl++) {
                ops_force_level((cpu_level)lvl);
                float got = ops_vec_dot_kv(kt[it], N, kb, qq);
                CHECKF(fabsf(got - ref) <= 1e-5f * (float)mag + 1e-6f, "%s %s %g, scalar %g", quant_type_name(kt[it]),
                       ops_level_name(), got, ref);
            }
        }
    }
    ops_force_level(cpu_get_hw_level());
}

/* gpt-oss's clamped SwiGLU as ggml's swiglu_oai: the gate capped at 7 from above only, the
 * up clamped to [-7, 7], x * sigmoid(1.702 x) * (up + 1). */
TEST(test_swiglu_oai)
{
    const float g[5] = { 10.0f, -20.0f, 0.5f, 7.0f, -3.0f }, u[5] = { 10.0f, -10.0f, 0.25f, -7.5f, 1.0f };
    float out[5];
    ops_swiglu_oai(out, g, u, 5, 1.702f, 7.0f);
    for (int i = 0; i < 5; i++) {
        double x = g[i] < 7 ? g[i] : 7, y = u[i] < -7 ? -7 : u[i] > 7 ? 7 : u[i];
        double want = x / (1 + exp(-1.702 * x)) * (y + 1);
        CHECKF(fabs(out[i] - want) <= 1e-6 * fmax(1, fabs(want)), "%d: %g, want %g", i, out[i], want);
    }
}

TEST(test_rope)
{
    int rows = 5, nh = 3, hd = 64;
    size_t N = (size_t)rows * nh * hd;
    float *x = malloc(N * 4), *a = malloc(N * 4), *b = malloc(N * 4);
    fill_normal(x, (int64_t)N, 11, 1.0f);
    int32_t pos[5] = {0, 1, 7, 300, 4095};
    for (int neox = 0; neox < 2; neox++) {
        for (int n_rot = 32; n_rot <= hd; n_rot += 32) {
            float inv[64];
            float ts = powf(10000.f, -2.0f / n_rot);
            float th = 1.0f;
            for (int i = 0; i < n_rot / 2; i++) {
                inv[i] = th;
                th *= ts;
            }
            memcpy(a, x, N * 4);
            ops_rope(pools[0], a, pos, rows, nh, hd, n_rot, neox, inv);
            /* direct formula in double */
            int bad = 0;
            for (int r = 0; r < rows; r++)
                for (int h = 0; h < nh; h++) {
                    const float *v = x + ((size_t)r * nh + h) * hd;
                    const float *o = a + ((size_t)r * nh + h) * hd;
                    for (int i = 0; i < n_rot / 2; i++) {
                        int i0 = neox ? i : 2 * i, i1 = neox ? i + n_rot / 2 : 2 * i + 1;
                        double t = (double)((float)pos[r] * inv[i]);
                        double y0 = v[i0] * cos(t) - v[i1] * sin(t);
                        double y1 = v[i0] * sin(t) + v[i1] * cos(t);
                        if (fabs(o[i0] - y0) > 1e-5 || fabs(o[i1] - y1) > 1e-5) bad++;
                    }
                    for (int i = n_rot; i < hd; i++) if (o[i] != v[i]) bad++;
                }
            CHECKF(bad == 0, "neox %d n_rot %d: %d", neox, n_rot, bad);
            /* ggml flavour, thread counts identical, close to the inv_freq flavour */
            memcpy(b, x, N * 4);
            ops_rope_ggml(pools[0], b, pos, rows, nh, hd, n_rot, neox, ts, 1.0f, NULL, 1.0f, NULL);
            float *c = malloc(N * 4);
            for (int t = 1; t < 3; t++) {
                memcpy(c, x, N * 4);
                ops_rope_ggml(pools[t], c, pos, rows, nh, hd, n_rot, neox, ts, 1.0f, NULL, 1.0f, NULL);
                CHECK(!memcmp(b, c, N * 4));
            }
            free(c);
            for (size_t i = 0; i < N; i++) CHECK(fabsf(a[i] - b[i]) < 2e-3f);
            /* position 0 is the identity */
            for (int i = 0; i < nh * hd; i++) CHECK(b[i] == x[i]);
        }
    }
    free(x);
    free(a);
    free(b);
}

TEST(test_vec_helpers)
{
    int sizes[] = {1, 7, 16, 33, 128, 257};
    for (size_t si = 0; si < TM_ARRAY_LEN(sizes); si++) {
        int n = sizes[si];
        float *a = malloc(n * 4), *b = malloc(n * 4), *y0 = malloc(n * 4), *y1 = malloc(n * 4);
        fp16_t *h = malloc(n * 2), *h2 = malloc(n * 2), *hb = malloc(n * 2);
        fill_normal(a, n, 5, 1.0f);
        fill_normal(b, n, 6, 1.0f);
        for (int i = 0; i < n; i++) h[i] = quant_fp32_to_fp16(a[i]);
        for (int i = 0; i < n; i++) hb[i] = quant_fp32_to_fp16(b[i]);
        double sabs = 0;
        for (int i = 0; i < n; i++) sabs += fabs((double)a[i] * b[i]);
        ops_force_level(CPU_LEVEL_SCALAR);
        float r_dot = ops_vec_dot_f32(n, a, b), r_dh = ops_vec_dot_f16_f32(n, h, b);
        float r_dhh = ops_vec_dot_f16(n, h, hb), r_max = ops_vec_max_f32(n, a);
        memcpy(y0, b, n * 4);
        ops_vec_mad_f32(n, y0, a, 0.37f);
        ops_vec_mad_f16(n, y0, h, -1.25f);
        ops_vec_scale_f32(n, y0, 0.5f);
        float *e0 = malloc(n * 4);
        memcpy(e0, a, n * 4);
        float r_sum = ops_vec_softmax_exp(n, e0, r_max);
        for (int lvl = 1; lvl < n_levels(); lvl++) {
            ops_force_level((cpu_level)lvl);
            double tol = 4 * FLT_EPSILON * (sabs + 1);
            CHECKF(fabs(ops_vec_dot_f32(n, a, b) - r_dot) <= tol, "%s n=%d", ops_level_name(), n);
            CHECKF(fabs(ops_vec_dot_f16_f32(n, h, b) - r_dh) <= tol, "%s n=%d", ops_level_name(), n);
            CHECKF(fabs(ops_vec_dot_f16(n, h, hb) - r_dhh) <= tol, "%s n=%d", ops_level_name(), n);
            CHECK(ops_vec_max_f32(n, a) == r_max);
            memcpy(y1, b, n * 4);
            ops_vec_mad_f32(n, y1, a, 0.37f);
            ops_vec_mad_f16(n, y1, h, -1.25f);
            ops_vec_scale_f32(n, y1, 0.5f);
            for (int i = 0; i < n; i++) CHECK(fabsf(y1[i] - y0[i]) <= 1e-5f * (fabsf(y0[i]) + 1));
            float *e1 = malloc(n * 4);
            memcpy(e1, a, n * 4);
            float s1 = ops_vec_softmax_exp(n, e1, r_max);
            CHECKF(fabsf(s1 - r_sum) <= 1e-5f * r_sum, "%s softmax sum %g vs %g", ops_level_name(), s1, r_sum);
            for (int i = 0; i < n; i++) CHECK(fabsf(e1[i] - e0[i]) <= 4e-6f);
            free(e1);
            ops_fp32_to_fp16_row(a, h2, n);
            CHECK(!memcmp(h2, h, n * 2));
            ops_fp16_to_fp32_row(h, y1, n);
            for (int i = 0; i < n; i++) CHECK(y1[i] == quant_fp16_to_fp32(h[i]));
        }
        free(e0);
        free(a);
        free(b);
        free(y0);
        free(y1);
        free(h);
        free(h2);
        free(hb);
    }
}

/* Runs ops_att_block over n_blk key blocks (nb keys each, the last block nb_last) for nq
 * rows whose queries are rows q[qi[r]] (hd), with causal limits lim_of(qpos[r], block), and
 * writes each row's normalised output (nq, hd) to out. */
/* att_run gives the kernels a kt scratch (as the engine does): few-row blocks may take the
 * keys-in-lanes path; without it they take the queries-in-lanes one */
static bool att_with_kt = true;

static void att_run(int hd, int nq, const float *q, const int *qpos, const float *K, const float *V,
                    int n_ctx, float *out)
{
    int nqp = (nq + 15) / 16 * 16;
    float *qt = calloc((size_t)hd * nqp, 4), *st = malloc((size_t)128 * nqp * 4);
    float *m = malloc(nq * 4), *s = malloc(nq * 4), *acc = calloc((size_t)nq * hd, 4);
    float *kt = att_with_kt ? malloc((size_t)hd * OPS_ATT_KT_KEYS * 4) : NULL;
    int32_t *lim = malloc(nq * 4);
    for (int r = 0; r < nq; r++) {
        for (int d = 0; d < hd; d++) qt[(size_t)d * nqp + r] = q[(size_t)r * hd + d];
        m[r] = -INFINITY;
        s[r] = 0;
    }
    ops_att_block_args a = { .hd = hd, .nq = nq, .nqp = nqp, .scale = 1.0f / sqrtf((float)hd), .qt = qt,
                             .lim = lim, .st = st, .m = m, .s = s, .acc = acc, .kt = kt };
    for (int b0 = 0; b0 < n_ctx; b0 += 128) {
        a.nb = TM_MIN(128, n_ctx - b0);
        a.k = K + (size_t)b0 * hd;
        a.v = V + (size_t)b0 * hd;
        for (int r = 0; r < nq; r++) lim[r] = TM_MAX(0, TM_MIN(a.nb, qpos[r] + 1 - b0));
        ops_att_block(&a);
    }
    for (int r = 0; r < nq; r++)
        for (int d = 0; d < hd; d++) out[(size_t)r * hd + d] = s[r] > 0 ? acc[(size_t)r * hd + d] / s[r] : 0;
    free(qt);
    free(st);
    free(m);
    free(s);
    free(acc);
    free(kt);
    free(lim);
}

/* ops_att_block: every level agrees with a double-precision softmax(q K^T / sqrt(hd)) V, and a
 * row's output is bit-identical whatever the other rows, their number and the block length
 * (batch invariance), at every level. */
TEST(test_att_block)
{
    const int hds[] = {128, 64, 40};
    for (size_t hi = 0; hi < TM_ARRAY_LEN(hds); hi++) {
        int hd = hds[hi], n_ctx = 300, nq = 37;
        float *K = malloc((size_t)n_ctx * hd * 4), *V = malloc((size_t)n_ctx * hd * 4);
        float *q = malloc((size_t)nq * hd * 4), *out = malloc((size_t)nq * hd * 4), *o1 = malloc((size_t)hd * 4);
        int qpos[37];
        fill_normal(K, (int64_t)n_ctx * hd, 11 + hi, 1.0f);
        fill_normal(V, (int64_t)n_ctx * hd, 12 + hi, 1.0f);
        fill_normal(q, (int64_t)nq * hd, 13 + hi, 3.0f);   /* peaked softmax: rescales happen */
        for (int r = 0; r < nq; r++) qpos[r] = r == 0 ? 0 : r == 1 ? 127 : r == 2 ? 128 : 263 + r;
        /* reference in double */
        double *ref = malloc((size_t)nq * hd * sizeof(double));
        for (int r = 0; r < nq; r++) {
            int n = qpos[r] + 1;
            double *sc = malloc((size_t)n * sizeof(double)), mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)q[(size_t)r * hd + e] * K[(size_t)j * hd + e];
                sc[j] = d / sqrt((double)hd);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j < n; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int j = 0; j < n; j++) o += sc[j] * V[(size_t)j * hd + e];
                ref[(size_t)r * hd + e] = o / sum;
            }
            free(sc);
        }
        for (int lvl = 0; lvl < n_levels(); lvl++) {
            ops_force_level((cpu_level)lvl);
            att_run(hd, nq, q, qpos, K, V, n_ctx, out);
            double maxerr = 0;
            for (int i = 0; i < nq * hd; i++) maxerr = fmax(maxerr, fabs(out[i] - ref[i]));
            CHECKF(maxerr < 1e-4, "%s hd=%d max error %g", ops_level_name(), hd, maxerr);
            /* each row alone, with only the context it sees: the same bits */
            for (int r = 0; r < nq; r += 5) {
                att_run(hd, 1, q + (size_t)r * hd, &qpos[r], K, V, qpos[r] + 1, o1);
                CHECKF(!memcmp(o1, out + (size_t)r * hd, (size_t)hd * 4), "%s hd=%d row %d alone differs",
                       ops_level_name(), hd, r);
            }
            /* groups of 2, 3 and 4 rows (a decode token's gqa heads: few-row kernels), each
             * with the context its last row sees: the same bits */
            for (int g = 2; g <= 4; g++)
                for (int r = 0; r + g <= nq; r += 7) {
                    float *og = malloc((size_t)g * hd * 4);
                    int n = 0;
                    for (int i = 0; i < g; i++) n = TM_MAX(n, qpos[r + i] + 1);
                    att_run(hd, g, q + (size_t)r * hd, &qpos[r], K, V, n, og);
                    CHECKF(!memcmp(og, out + (size_t)r * hd, (size_t)g * hd * 4), "%s hd=%d rows %d..%d together differ",
                           ops_level_name(), hd, r, r + g - 1);
                    free(og);
                }
            /* a row alone without the kt scratch (the queries-in-lanes path): the same bits */
            att_with_kt = false;
            att_run(hd, 1, q + (size_t)5 * hd, &qpos[5], K, V, qpos[5] + 1, o1);
            att_with_kt = true;
            CHECKF(!memcmp(o1, out + (size_t)5 * hd, (size_t)hd * 4), "%s hd=%d row 5 alone without kt differs",
                   ops_level_name(), hd);
            /* the rows in another order and count (reversed, first 20): the same bits */
            float *qr = malloc((size_t)20 * hd * 4), *outr = malloc((size_t)20 * hd * 4);
            int qposr[20];
            for (int r = 0; r < 20; r++) {
                memcpy(qr + (size_t)r * hd, q + (size_t)(nq - 1 - r) * hd, (size_t)hd * 4);
                qposr[r] = qpos[nq - 1 - r];
            }
            att_run(hd, 20, qr, qposr, K, V, n_ctx, outr);
            for (int r = 0; r < 20; r++)
                CHECKF(!memcmp(outr + (size_t)r * hd, out + (size_t)(nq - 1 - r) * hd, (size_t)hd * 4),
                       "%s hd=%d row %d moved differs", ops_level_name(), hd, nq - 1 - r);
            free(qr);
            free(outr);
        }
        free(ref);
        free(K);
        free(V);
        free(q);
        free(out);
        free(o1);
    }
    ops_force_level(cpu_get_hw_level());
}

/* ops_stream_read: at every level and thread count, the xor of the words read, for lengths
 * around the kernels' 128- and 256-byte steps and the threads' 64-byte shares, from an
 * unaligned start too (a kernel that skipped or re-read a piece gives another fold). */
static void test_stream_read(void)
{
    const size_t cap = (1u << 20) + 4096;
    uint64_t *buf = malloc(cap + 64);
    util_rng r;
    util_rng_seed(&r, 17);
    for (size_t i = 0; i < (cap + 64) / 8; i++) buf[i] = util_rng_next(&r);
    static const size_t lens[] = { 0, 8, 56, 64, 120, 128, 136, 248, 256, 264, 1000, 4096, 65536 + 200, 1u << 20 };
    for (int lvl = 0; lvl < n_levels(); lvl++) {
        ops_force_level((cpu_level)lvl);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int off = 0; off <= 8; off += 8) {
                const char *p = (const char *)buf + off;
                uint64_t want = 0;
                for (size_t i = 0; i < lens[li] / 8; i++) {
                    uint64_t v;
                    memcpy(&v, p + 8 * i, 8);
                    want ^= v;
                }
                for (int th = 0; th < 3; th++)
                    CHECKF(ops_stream_read(pools[th], p, lens[li]) == want, "%s %zu bytes at +%d, %d threads",
                           ops_level_name(), lens[li], off, th + 1);
                /* a trailing part word is not read */
                CHECKF(ops_stream_read(pools[1], p, lens[li] + 5) == want, "%s %zu + 5 bytes", ops_level_name(), lens[li]);
            }
    }
    ops_force_level(cpu_get_hw_level());
    free(buf);
}

int main(void)
{
    for (int i = 0; i < 3; i++) pools[i] = threadpool_new(i + 1);
    RUN(test_matmul_all_types);
    RUN(test_matmul_odd_cols);
    RUN(test_matmul_batch_invariant);
    RUN(test_matmul_iq_edges);
    RUN(test_matmul_repacked);
    RUN(test_matmul_multi);
    RUN(test_elementwise);
    RUN(test_swiglu_oai);
    RUN(test_vec_dot_kv);
    RUN(test_rope);
    RUN(test_vec_helpers);
    RUN(test_att_block);
    RUN(test_stream_read);
    for (int i = 0; i < 3; i++) threadpool_free(pools[i]);
    HARNESS_END();
}
