/*
 * quant_iq: dequantisation and quantisation of the codebook and ternary types (quant_iq.h).
 *
 * Each dequantiser is ggml's dequantize_row_<type> in the same float operations and order
 * (the scale of a group first, then times the grid point, then the sign), so that the values
 * are bit-identical to llama.cpp's; the grids are ggml's tables (quant_grids.c).
 */
#include "model/quant_iq.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant_grids.h"
#include "util/util.h"

_Static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs layout");
_Static_assert(sizeof(block_iq2_xs) == 74, "block_iq2_xs layout");
_Static_assert(sizeof(block_iq2_s) == 82, "block_iq2_s layout");
_Static_assert(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs layout");
_Static_assert(sizeof(block_iq3_s) == 110, "block_iq3_s layout");
_Static_assert(sizeof(block_iq1_s) == 50, "block_iq1_s layout");
_Static_assert(sizeof(block_iq1_m) == 56, "block_iq1_m layout");
_Static_assert(sizeof(block_tq1_0) == 54, "block_tq1_0 layout");
_Static_assert(sizeof(block_tq2_0) == 66, "block_tq2_0 layout");

bool quant_iq_type(int type)
{
    switch (type) {
    case QTYPE_IQ2_XXS: case QTYPE_IQ2_XS: case QTYPE_IQ2_S: case QTYPE_IQ3_XXS: case QTYPE_IQ3_S:
    case QTYPE_IQ1_S: case QTYPE_IQ1_M: case QTYPE_TQ1_0: case QTYPE_TQ2_0: return true;
    default: return false;
    }
}

static inline uint8_t quant_iq_byte(uint64_t entry, int j) { return (uint8_t)(entry >> (8 * j)); }
static inline float quant_iq_sign(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.f : 1.f; }

/* Eight elements of an IQ2 grid entry times dl with their signs. */
static inline void quant_iq_put8(float *y, float dl, uint64_t entry, uint8_t signs)
{
    for (int j = 0; j < 8; j++) y[j] = dl * quant_iq_byte(entry, j) * quant_iq_sign(signs, j);
}

static void quant_iq_dequant_iq2_xxs(const block_iq2_xxs *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint16_t *q = x[i].qs + 4 * ib;
            uint32_t a0 = q[0] | (uint32_t)q[1] << 16, a1 = q[2] | (uint32_t)q[3] << 16;
            const float db = d * (0.5f + (a1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, y += 8)
                quant_iq_put8(y, db, quant_grids_iq2xxs[(a0 >> 8 * l) & 255], quant_grids_ksigns[(a1 >> 7 * l) & 127]);
        }
    }
}

static void quant_iq_dequant_iq2_xs(const block_iq2_xs *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f, d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                uint16_t q = x[i].qs[4 * ib + l];
                quant_iq_put8(y, db[l / 2], quant_grids_iq2xs[q & 511], quant_grids_ksigns[q >> 9]);
            }
        }
    }
}

static void quant_iq_dequant_iq2_s(const block_iq2_s *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f, d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                int idx = x[i].qs[4 * ib + l] | ((x[i].qh[ib] << (8 - 2 * l)) & 0x300);
                quant_iq_put8(y, db[l / 2], quant_grids_iq2s[idx], x[i].qs[QK_K / 8 + 4 * ib + l]);
            }
        }
    }
}

static void quant_iq_dequant_iq3_xxs(const block_iq3_xxs *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs, *sas = x[i].qs + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8) {
            const uint8_t *s4 = sas + 4 * ib;
            uint32_t aux = s4[0] | (uint32_t)s4[1] << 8 | (uint32_t)s4[2] << 16 | (uint32_t)s4[3] << 24;
            const float db = d * (0.5f + (aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8) {
                uint8_t signs = quant_grids_ksigns[(aux >> 7 * l) & 127];
                uint32_t g1 = quant_grids_iq3xxs[qs[2 * l]], g2 = quant_grids_iq3xxs[qs[2 * l + 1]];
                for (int j = 0; j < 4; j++) {
                    y[j] = db * quant_iq_byte(g1, j) * quant_iq_sign(signs, j);
                    y[j + 4] = db * quant_iq_byte(g2, j) * quant_iq_sign(signs, j + 4);
                }
            }
        }
    }
}

static void quant_iq_dequant_iq3_s(const block_iq3_s *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int s = (x[i].scales[ib / 2] >> 4 * (ib % 2)) & 0xf;
            const float db = d * (1 + 2 * s);
            const uint8_t *qs = x[i].qs + 8 * ib, *signs = x[i].signs + 4 * ib;
            int qh = x[i].qh[ib];
            for (int l = 0; l < 4; l++, y += 8) {
                uint32_t g1 = quant_grids_iq3s[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
                uint32_t g2 = quant_grids_iq3s[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
                for (int j = 0; j < 4; j++) {
                    y[j] = db * quant_iq_byte(g1, j) * quant_iq_sign(signs[l], j);
                    y[j + 4] = db * quant_iq_byte(g2, j) * quant_iq_sign(signs[l], j + 4);
                }
            }
        }
    }
}

/* Eight IQ1 grid points plus delta, times dl. */
static inline void quant_iq_put8_iq1(float *y, float dl, uint64_t entry, float delta)
{
    for (int j = 0; j < 8; j++) y[j] = dl * ((int8_t)quant_iq_byte(entry, j) + delta);
}

static void quant_iq_dequant_iq1_s(const block_iq1_s *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint16_t qh = x[i].qh[ib];
            const float dl = d * (2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -QUANT_IQ1_DELTA : QUANT_IQ1_DELTA;
            for (int l = 0; l < 4; l++, y += 8)
                quant_iq_put8_iq1(y, dl, quant_grids_iq1s[x[i].qs[4 * ib + l] | (((qh >> 3 * l) & 7) << 8)], delta);
        }
    }
}

static void quant_iq_dequant_iq1_m(const block_iq1_m *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(quant_iq1_m_scale(&x[i]));
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint16_t sc = (uint16_t)(x[i].scales[2 * (ib / 2)] | x[i].scales[2 * (ib / 2) + 1] << 8);
            const float dl1 = d * (2 * ((sc >> (6 * (ib % 2) + 0)) & 7) + 1);
            const float dl2 = d * (2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1);
            const uint8_t *qs = x[i].qs + 4 * ib, *qh = x[i].qh + 2 * ib;
            for (int l = 0; l < 4; l++, y += 8) {
                int h = qh[l / 2] >> 4 * (l % 2); /* the group's nibble: 3 index bits, the delta sign */
                float delta = h & 8 ? -QUANT_IQ1_DELTA : QUANT_IQ1_DELTA;
                quant_iq_put8_iq1(y, l < 2 ? dl1 : dl2, quant_grids_iq1s[qs[l] | ((h & 7) << 8)], delta);
            }
        }
    }
}

/* Trit n (0..4) of a TQ1_0 byte: the byte is a fixed-point fraction of 3^5 whose base-3
 * digits are the trits, most significant first. */
static inline int quant_iq_trit(uint8_t byte, int n)
{
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    uint8_t q = (uint8_t)(byte * pow3[n]);
    return ((uint16_t)q * 3) >> 8;
}

static void quant_iq_dequant_tq1_0(const block_tq1_0 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        /* qs[0..31]: 5 x 32 elements, qs[32..47]: 5 x 16, qh: 4 x 4 */
        for (int n5 = 0; n5 < 5; n5++)
            for (int m = 0; m < 32; m++) *y++ = (float)(quant_iq_trit(x[i].qs[m], n5) - 1) * d;
        for (int n5 = 0; n5 < 5; n5++)
            for (int m = 0; m < 16; m++) *y++ = (float)(quant_iq_trit(x[i].qs[32 + m], n5) - 1) * d;
        for (int n4 = 0; n4 < 4; n4++)
            for (int j = 0; j < 4; j++) *y++ = (float)(quant_iq_trit(x[i].qh[j], n4) - 1) * d;
    }
}

static void quant_iq_dequant_tq2_0(const block_tq2_0 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 64; j += 32)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++) *y++ = (float)(((x[i].qs[j + m] >> 2 * l) & 3) - 1) * d;
    }
}

void quant_iq_dequantize_row(qtype t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case QTYPE_IQ2_XXS: quant_iq_dequant_iq2_xxs(src, dst, n); break;
    case QTYPE_IQ2_XS: quant_iq_dequant_iq2_xs(src, dst, n); break;
    case QTYPE_IQ2_S: quant_iq_dequant_iq2_s(src, dst, n); break;
    case QTYPE_IQ3_XXS: quant_iq_dequant_iq3_xxs(src, dst, n); break;
    case QTYPE_IQ3_S: quant_iq_dequant_iq3_s(src, dst, n); break;
    case QTYPE_IQ1_S: quant_iq_dequant_iq1_s(src, dst, n); break;
    case QTYPE_IQ1_M: quant_iq_dequant_iq1_m(src, dst, n); break;
    case QTYPE_TQ1_0: quant_iq_dequant_tq1_0(src, dst, n); break;
    case QTYPE_TQ2_0: quant_iq_dequant_tq2_0(src, dst, n); break;
    default: assert(!"not an i-quant"); break;
    }
}

/* ---- quantisers ---------------------------------------------------------------------- */

static float quant_iq_amax(const float *x)
{
    float amax = 0;
    for (int j = 0; j < QK_K; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

/* ggml's quantize_row_tq1_0_ref: d = amax, trits lroundf(x / d) + 1 packed five (four in qh)
 * per byte as a base-3 number, stored as its ceiling fraction of 3^5 in 256ths. */
static void quant_iq_ref_tq1_0(const float *x, block_tq1_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = quant_iq_amax(x), id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_fp32_to_fp16(d);
        const float *xs = x;
        for (int m = 0; m < 32; m++) {
            uint8_t q = 0;
            for (int k = 0; k < 5; k++) q = (uint8_t)(q * 3 + lroundf(xs[m + 32 * k] * id) + 1);
            y[i].qs[m] = (uint8_t)(((uint16_t)q * 256 + 242) / 243);
        }
        xs += 160;
        for (int m = 0; m < 16; m++) {
            uint8_t q = 0;
            for (int k = 0; k < 5; k++) q = (uint8_t)(q * 3 + lroundf(xs[m + 16 * k] * id) + 1);
            y[i].qs[32 + m] = (uint8_t)(((uint16_t)q * 256 + 242) / 243);
        }
        xs += 80;
        for (int j = 0; j < 4; j++) {
            uint8_t q = 0;
            for (int k = 0; k < 4; k++) q = (uint8_t)(q * 3 + lroundf(xs[j + 4 * k] * id) + 1);
            q = (uint8_t)(q * 3); /* the first trit to the most significant place of five */
            y[i].qh[j] = (uint8_t)(((uint16_t)q * 256 + 242) / 243);
        }
    }
}

/* ggml's quantize_row_tq2_0_ref: d = amax, q = lroundf(x / d) + 1 in 2 bits. */
static void quant_iq_ref_tq2_0(const float *x, block_tq2_0 *y, int64_t n)
{
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = quant_iq_amax(x), id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_fp32_to_fp16(d);
        for (int j = 0; j < 64; j += 32)
            for (int m = 0; m < 32; m++) {
                uint8_t q = 0;
                for (int k = 0; k < 4; k++) q = (uint8_t)(q + (((lroundf(x[4 * j + m + 32 * k] * id) + 1) & 3) << (2 * k)));
                y[i].qs[j + m] = q;
            }
    }
}

/* ---- IQ3_XXS and IQ3_S: ggml's quantize_row_iq3_{xxs,s}_impl without an importance matrix */

/* The search tables of ggml's iq3xs_init_impl for one grid (IQ3_XXS's 256 points, IQ3_S's
 * 512): the grid as int8 points 2l+1 of 3-bit levels l (4 per entry), a map from the 12-bit
 * level pattern of 4 elements to its entry, and for a pattern off the grid (map < 0: at
 * -map - 1 in neighbours) the count and list of the entries at its 2 (IQ3_S: 3) smallest
 * distances. Built once, on first use. */
typedef struct {
    int n;                  /* grid entries: 256 or 512 */
    uint32_t grid[512];     /* int8 points 2l+1 per element */
    int map[4096];          /* pattern -> entry, or -(offset + 1) into neighbours */
    uint16_t *neighbours;   /* per off-grid pattern: n, then n entries */
} quant_iq3_search;

static quant_iq3_search quant_iq_s3[2];  /* [0] IQ3_XXS, [1] IQ3_S */
static pthread_once_t quant_iq_s3_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static int quant_iq_cmp_pair(const void *a, const void *b)
{
    const int *l = a, *r = b;
    return l[0] < r[0] ? -1 : l[0] > r[0] ? 1 : l[1] < r[1] ? -1 : l[1] > r[1] ? 1 : 0;
}

/* The level (0..7) of a grid point: IQ3_XXS's points are 4, 12, .., 52, 62, IQ3_S's 2l+1. */
static int quant_iq3_level(int which, uint8_t v)
{
    static const uint8_t xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62};
    if (which) return (v - 1) / 2;
    int l = 0;
    while (xxs[l] != v) l++;
    return l;
}

static void quant_iq_s3_init_grid(int which)
{
    quant_iq3_search *s = &quant_iq_s3[which];
    s->n = which ? 512 : 256;
    const int nwant = which ? 3 : 2;
    for (int k = 0; k < 4096; k++) s->map[k] = -1;
    for (int k = 0; k < s->n; k++) {
        uint32_t g = which ? quant_grids_iq3s[k] : quant_grids_iq3xxs[k], e = 0;
        int u = 0;
        for (int i = 0; i < 4; i++) {
            int l = quant_iq3_level(which, quant_iq_byte(g, i));
            u |= l << 3 * i;
            e |= (uint32_t)(2 * l + 1) << 8 * i;
        }
        s->grid[k] = e;
        s->map[u] = k;
    }
    size_t cap = 4096 * 8, used = 0;
    s->neighbours = xmalloc(cap * sizeof *s->neighbours);
    int dist2[2 * 512];
    for (int u = 0; u < 4096; u++) {
        if (s->map[u] >= 0) continue;
        int pos[4];
        for (int k = 0; k < 4; k++) pos[k] = 2 * ((u >> 3 * k) & 7) + 1;
        for (int j = 0; j < s->n; j++) {
            int d2 = 0;
            for (int k = 0; k < 4; k++) {
                int d = (int8_t)quant_iq_byte(s->grid[j], k) - pos[k];
                d2 += d * d;
            }
            dist2[2 * j] = d2, dist2[2 * j + 1] = j;
        }
        qsort(dist2, (size_t)s->n, 2 * sizeof(int), quant_iq_cmp_pair);
        if (used + 1 + (size_t)s->n > cap) s->neighbours = xrealloc(s->neighbours, (cap *= 2) * sizeof *s->neighbours);
        size_t start = used++;
        int n = 0, d2 = dist2[0], nhave = 1;
        for (int j = 0; j < s->n; j++) {
            if (dist2[2 * j] > d2) {
                if (nhave == nwant) break;
                d2 = dist2[2 * j];
                nhave++;
            }
            s->neighbours[used++] = (uint16_t)dist2[2 * j + 1];
            n++;
        }
        s->neighbours[start] = (uint16_t)n;
        s->map[u] = -(int)(start + 1);
    }
}
static void quant_iq_s3_init_xxs(void) { quant_iq_s3_init_grid(0); }
static void quant_iq_s3_init_s(void) { quant_iq_s3_init_grid(1); }

/* ggml's iq3_find_best_neighbour: the weighted-nearest of the pattern's neighbours at scale;
 * writes its levels to L. */
static int quant_iq3_best_neighbour(const quant_iq3_search *s, const uint16_t *nb, const float *xval,
                                    const float *w, float scale, int8_t *L)
{
    float best_d2 = FLT_MAX;
    int gi = -1;
    for (int j = 1; j <= nb[0]; j++) {
        float d2 = 0;
        for (int i = 0; i < 4; i++) {
            float q = (int8_t)quant_iq_byte(s->grid[nb[j]], i);
            float diff = scale * q - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) best_d2 = d2, gi = nb[j];
    }
    for (int i = 0; i < 4; i++) L[i] = (int8_t)(((int8_t)quant_iq_byte(s->grid[gi], i) - 1) / 2);
    return gi;
}

/* The levels of 4 elements at inverse scale id, snapped to the grid at scale (the best
 * neighbour when off it, which rewrites L); returns whether they were on it. */
static bool quant_iq3_snap(const quant_iq3_search *s, const float *xval, const float *w, float id, float scale, int8_t *L)
{
    int u = 0;
    for (int i = 0; i < 4; i++) {
        int l = quant_nearest_int(0.5f * (id * xval[i] - 1));
        L[i] = (int8_t)(l < 0 ? 0 : l > 7 ? 7 : l);
        u |= L[i] << 3 * i;
    }
    if (s->map[u] >= 0) return true;
    quant_iq3_best_neighbour(s, s->neighbours - s->map[u] - 1, xval, w, scale, L);
    return false;
}

static int quant_iq3_entry_of(const quant_iq3_search *s, const int8_t *L)
{
    int u = 0;
    for (int i = 0; i < 4; i++) u |= L[i] << 3 * i;
    assert(s->map[u] >= 0);
    return s->map[u];
}

/* One 32-element group as ggml's IQ3 quantisers search it (xxs: IQ3_XXS's variant, whose
 * signs carry even parity, 31 trial scales, and only off-grid groups re-snapped at the end;
 * else IQ3_S's: 8 free sign bits, 19 trial scales, every group re-snapped). Returns the
 * group's scale with the levels in L and the sign bytes in signs, or -1 for a group of zeros
 * (ggml leaves its bytes zero). */
static float quant_iq3_group(const quant_iq3_search *s, const float *xb, bool xxs, int8_t L[32], uint8_t signs[4])
{
    float weight[32], waux[32], xval[32];
    int8_t Laux[32];
    bool on_grid[8], on_grid_aux[8];
    for (int i = 0; i < 32; i++) weight[i] = xb[i] * xb[i];
    for (int i = 0; i < 32; i++) waux[i] = sqrtf(weight[i]);
    for (int k = 0; k < 4; k++) {
        int nflip = 0;
        uint8_t sg = 0;
        for (int i = 0; i < 8; i++) {
            if (xb[8 * k + i] >= 0) xval[8 * k + i] = xb[8 * k + i];
            else xval[8 * k + i] = -xb[8 * k + i], nflip++, sg |= (uint8_t)(1 << i);
        }
        if (xxs && nflip % 2) { /* flip the least important element to make the count even */
            int imin = 0;
            float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; i++) {
                float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) min = ax, imin = i;
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            sg ^= (uint8_t)(1 << imin);
        }
        signs[k] = xxs ? sg & 127 : sg;
    }
    float max = xval[0];
    for (int i = 1; i < 32; i++) max = max > xval[i] ? max : xval[i];
    memset(L, 0, 32);
    if (xxs ? max < 1e-8f : !max) return -1;
    float best = 0, scale = max / 15;
    for (int k = 0; k < 8; k++) on_grid[k] = xxs;
    int range = xxs ? 15 : 9;
    for (int is = -range; is <= range; is++) {
        float id = (15 + is * 0.2f) / max, this_scale = 1 / id;
        for (int k = 0; k < 8; k++) on_grid_aux[k] = quant_iq3_snap(s, xval + 4 * k, waux + 4 * k, id, this_scale, Laux + 4 * k);
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < 32; i++) {
            float w = weight[i], q = 2 * Laux[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2, best = scale * sumqx;
            memcpy(L, Laux, 32);
            memcpy(on_grid, on_grid_aux, sizeof on_grid);
        }
    }
    int n_off = 0;
    for (int k = 0; k < 8; k++) n_off += !on_grid[k];
    if (n_off > 0 && scale > 0) {
        float id = 1 / scale;
        for (int k = 0; k < 8; k++)
            if (!xxs || !on_grid[k]) quant_iq3_snap(s, xval + 4 * k, waux + 4 * k, id, scale, L + 4 * k);
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < 32; i++) {
            float w = weight[i], q = 2 * L[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) { /* ggml: "should never happen"; the scale is stored unsigned */
        scale = -scale;
        for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(~signs[k] & (xxs ? 127 : 255));
    }
    return scale;
}

/* The 4-bit sub-block scale of scale under the super-block's d = max_scale / 31. */
static uint8_t quant_iq3_scale4(float id, float scale)
{
    int l = quant_nearest_int(0.5f * (id * scale - 1));
    return (uint8_t)(l < 0 ? 0 : l > 15 ? 15 : l);
}

static void quant_iq_ref_iq3_xxs(const float *x, block_iq3_xxs *y, int64_t n)
{
    pthread_once(&quant_iq_s3_once[0], quant_iq_s3_init_xxs);
    const quant_iq3_search *s = &quant_iq_s3[0];
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        uint8_t q3[96] = {0};
        float scales[QK_K / 32], max_scale = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int8_t L[32];
            uint8_t sg[4];
            scales[ib] = quant_iq3_group(s, x + QK_K * ibl + 32 * ib, true, L, sg);
            if (scales[ib] < 0) {
                scales[ib] = 0;
                continue;
            }
            for (int k = 0; k < 8; k++) q3[8 * ib + k] = (uint8_t)quant_iq3_entry_of(s, L + 4 * k);
            uint32_t sas = sg[0] | (uint32_t)sg[1] << 7 | (uint32_t)sg[2] << 14 | (uint32_t)sg[3] << 21;
            memcpy(q3 + 64 + 4 * ib, &sas, 4);
            max_scale = max_scale > scales[ib] ? max_scale : scales[ib];
        }
        y[ibl].d = quant_fp32_to_fp16(0.f);
        if (!max_scale) {
            memset(y[ibl].qs, 0, sizeof y[ibl].qs);
            continue;
        }
        float d = max_scale / 31;
        y[ibl].d = quant_fp32_to_fp16(d * 1.0125f); /* ggml's fudge factor */
        float id = 1 / d;
        for (int ib = 0; ib < QK_K / 32; ib++) q3[64 + 4 * ib + 3] |= (uint8_t)(quant_iq3_scale4(id, scales[ib]) << 4);
        memcpy(y[ibl].qs, q3, sizeof q3);
    }
}

static void quant_iq_ref_iq3_s(const float *x, block_iq3_s *y, int64_t n)
{
    pthread_once(&quant_iq_s3_once[1], quant_iq_s3_init_s);
    const quant_iq3_search *s = &quant_iq_s3[1];
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        memset(&y[ibl], 0, sizeof y[ibl]);
        float scales[QK_K / 32], max_scale = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int8_t L[32];
            uint8_t sg[4];
            scales[ib] = quant_iq3_group(s, x + QK_K * ibl + 32 * ib, false, L, sg);
            if (scales[ib] < 0) {
                scales[ib] = 0;
                continue;
            }
            for (int k = 0; k < 8; k++) {
                int gi = quant_iq3_entry_of(s, L + 4 * k);
                y[ibl].qs[8 * ib + k] = (uint8_t)(gi & 255);
                y[ibl].qh[ib] |= (uint8_t)((gi >> 8) << k);
            }
            memcpy(y[ibl].signs + 4 * ib, sg, 4);
            max_scale = max_scale > scales[ib] ? max_scale : scales[ib];
        }
        if (!max_scale) continue;
        float d = max_scale / 31;
        y[ibl].d = quant_fp32_to_fp16(d * 1.033f); /* ggml's fudge factor */
        float id = 1 / d;
        for (int ib = 0; ib < QK_K / 32; ib += 2)
            y[ibl].scales[ib / 2] = (uint8_t)(quant_iq3_scale4(id, scales[ib]) | quant_iq3_scale4(id, scales[ib + 1]) << 4);
    }
}

/* ---- IQ2_S: ggml's quantize_row_iq2_s_impl without an importance matrix -------------- */

/* ggml's iq2xs_init_impl tables for the IQ2_S grid: its 1024 entries as int8 points 2l+1 of
 * 2-bit levels (8 per entry), the map from a 16-bit level pattern to its entry, and for a
 * pattern off the grid the entries at its smallest distance (ggml keeps 1 distance for
 * IQ2_S). Built once, on first use. */
#define QUANT_IQ2S_MAP 43692 /* ggml's kmap_size: patterns up to 0xaaab */
typedef struct {
    uint64_t grid[1024];          /* int8 points 2l+1 per element */
    int map[QUANT_IQ2S_MAP];      /* pattern -> entry, or -(offset + 1) into neighbours */
    uint16_t *neighbours;         /* per off-grid pattern: n, then n entries */
} quant_iq2s_search;

static quant_iq2s_search quant_iq_s2;
static pthread_once_t quant_iq_s2_once = PTHREAD_ONCE_INIT;

static void quant_iq_s2_init(void)
{
    static const uint8_t value[3] = {8, 25, 43};
    quant_iq2s_search *s = &quant_iq_s2;
    for (int k = 0; k < QUANT_IQ2S_MAP; k++) s->map[k] = -1;
    for (int k = 0; k < 1024; k++) {
        int u = 0;
        uint64_t e = 0;
        for (int i = 0; i < 8; i++) {
            int l = 0;
            while (value[l] != quant_iq_byte(quant_grids_iq2s[k], i)) l++;
            u |= l << 2 * i;
            e |= (uint64_t)(2 * l + 1) << 8 * i;
        }
        s->grid[k] = e;
        s->map[u] = k;
    }
    /* ggml sorts all entries by (distance, index) and keeps those at the smallest distance:
     * the entries at the minimum in index order, found in one pass */
    size_t cap = QUANT_IQ2S_MAP * 4, used = 0;
    s->neighbours = xmalloc(cap * sizeof *s->neighbours);
    int dist2[1024];
    for (int u = 0; u < QUANT_IQ2S_MAP; u++) {
        if (s->map[u] >= 0) continue;
        int pos[8], dmin = INT32_MAX;
        for (int k = 0; k < 8; k++) pos[k] = 2 * ((u >> 2 * k) & 3) + 1;
        for (int j = 0; j < 1024; j++) {
            int d2 = 0;
            for (int k = 0; k < 8; k++) {
                int d = (int8_t)quant_iq_byte(s->grid[j], k) - pos[k];
                d2 += d * d;
            }
            dist2[j] = d2;
            dmin = d2 < dmin ? d2 : dmin;
        }
        if (used + 1 + 1024 > cap) s->neighbours = xrealloc(s->neighbours, (cap *= 2) * sizeof *s->neighbours);
        size_t start = used++;
        for (int j = 0; j < 1024; j++)
            if (dist2[j] == dmin) s->neighbours[used++] = (uint16_t)j;
        s->neighbours[start] = (uint16_t)(used - start - 1);
        s->map[u] = -(int)(start + 1);
    }
}

/* The levels of 8 elements at inverse scale id, snapped to the IQ2_S grid at scale (ggml's
 * iq2_find_best_neighbour when off it, which rewrites L); returns whether they were on it. */
static bool quant_iq2s_snap(const float *xval, const float *w, float id, float scale, int8_t *L)
{
    const quant_iq2s_search *s = &quant_iq_s2;
    int u = 0;
    for (int i = 0; i < 8; i++) {
        int l = quant_nearest_int(0.5f * (id * xval[i] - 1));
        L[i] = (int8_t)(l < 0 ? 0 : l > 2 ? 2 : l);
        u |= L[i] << 2 * i;
    }
    if (s->map[u] >= 0) return true;
    const uint16_t *nb = s->neighbours - s->map[u] - 1;
    float best_d2 = FLT_MAX;
    int gi = -1;
    for (int j = 1; j <= nb[0]; j++) {
        float d2 = 0;
        for (int i = 0; i < 8; i++) {
            float q = (int8_t)quant_iq_byte(s->grid[nb[j]], i);
            float diff = scale * q - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) best_d2 = d2, gi = nb[j];
    }
    for (int i = 0; i < 8; i++) L[i] = (int8_t)(((int8_t)quant_iq_byte(s->grid[gi], i) - 1) / 2);
    return false;
}

static void quant_iq_ref_iq2_s(const float *x, block_iq2_s *y, int64_t n)
{
    pthread_once(&quant_iq_s2_once, quant_iq_s2_init);
    const quant_iq2s_search *s = &quant_iq_s2;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        memset(&y[ibl], 0, sizeof y[ibl]);
        const float *xbl = x + QK_K * ibl;
        float sumx2 = 0;
        for (int i = 0; i < QK_K; i++) sumx2 += xbl[i] * xbl[i];
        const float sigma2 = 2 * sumx2 / QK_K;
        float scales[QK_K / 16], max_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float *xb = xbl + 16 * ib;
            float weight[16], waux[16], xval[16];
            int8_t L[16] = {0}, Laux[16];
            bool on_grid[2] = {true, true}, on_grid_aux[2];
            uint8_t signs[2];
            for (int i = 0; i < 16; i++) weight[i] = 0.25f * sigma2 + xb[i] * xb[i];
            for (int i = 0; i < 16; i++) waux[i] = sqrtf(weight[i]);
            for (int k = 0; k < 2; k++) {
                uint8_t sg = 0;
                for (int i = 0; i < 8; i++) {
                    if (xb[8 * k + i] >= 0) xval[8 * k + i] = xb[8 * k + i];
                    else xval[8 * k + i] = -xb[8 * k + i], sg |= (uint8_t)(1 << i);
                }
                signs[k] = sg;
            }
            float max = xval[0];
            for (int i = 1; i < 16; i++) max = max > xval[i] ? max : xval[i];
            if (max < 1e-8f) {
                scales[ib] = 0;
                continue;
            }
            float best = 0, scale = max / 5;
            for (int is = -9; is <= 9; is++) {
                float id = (5 + is * 0.1f) / max, this_scale = 1 / id;
                for (int k = 0; k < 2; k++) on_grid_aux[k] = quant_iq2s_snap(xval + 8 * k, waux + 8 * k, id, this_scale, Laux + 8 * k);
                float sumqx = 0, sumq2 = 0;
                for (int i = 0; i < 16; i++) {
                    float w = weight[i], q = 2 * Laux[i] + 1;
                    sumqx += w * xval[i] * q;
                    sumq2 += w * q * q;
                }
                if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                    scale = sumqx / sumq2, best = scale * sumqx;
                    memcpy(L, Laux, 16);
                    on_grid[0] = on_grid_aux[0], on_grid[1] = on_grid_aux[1];
                }
            }
            if ((!on_grid[0] || !on_grid[1]) && scale > 0) {
                float id = 1 / scale;
                for (int k = 0; k < 2; k++)
                    if (!on_grid[k]) quant_iq2s_snap(xval + 8 * k, waux + 8 * k, id, scale, L + 8 * k);
                float sumqx = 0, sumq2 = 0;
                for (int i = 0; i < 16; i++) {
                    float w = weight[i], q = 2 * L[i] + 1;
                    sumqx += w * xval[i] * q;
                    sumq2 += w * q * q;
                }
                if (sumq2 > 0) scale = sumqx / sumq2;
            }
            if (scale < 0) { /* ggml: "should never happen"; the scale is stored unsigned */
                scale = -scale;
                for (int k = 0; k < 2; k++) signs[k] = (uint8_t)~signs[k];
            }
            for (int k = 0; k < 2; k++) {
                int u = 0;
                for (int i = 0; i < 8; i++) u |= L[8 * k + i] << 2 * i;
                assert(s->map[u] >= 0);
                int gi = s->map[u], i8 = 2 * ib + k;
                y[ibl].qs[i8] = (uint8_t)(gi & 255);
                y[ibl].qh[i8 / 4] |= (uint8_t)((gi >> 8) << 2 * (i8 % 4));
                y[ibl].qs[QK_K / 8 + i8] = signs[k];
            }
            scales[ib] = scale;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (!max_scale) continue;
        float d = max_scale / 31;
        y[ibl].d = quant_fp32_to_fp16(d * 0.9875f); /* ggml's fudge factor */
        float id = 1 / d;
        for (int ib = 0; ib < QK_K / 16; ib++)
            y[ibl].scales[ib / 2] |= (uint8_t)(quant_iq3_scale4(id, scales[ib]) << 4 * (ib % 2));
    }
}

bool quant_iq_can_quantize(qtype t)
{
    return t == QTYPE_TQ1_0 || t == QTYPE_TQ2_0 || t == QTYPE_IQ3_XXS || t == QTYPE_IQ3_S || t == QTYPE_IQ2_S;
}

void quant_iq_quantize_row(qtype t, const float *src, void *dst, int64_t n)
{
    switch (t) {
    case QTYPE_TQ1_0: quant_iq_ref_tq1_0(src, dst, n); break;
    case QTYPE_TQ2_0: quant_iq_ref_tq2_0(src, dst, n); break;
    case QTYPE_IQ3_XXS: quant_iq_ref_iq3_xxs(src, dst, n); break;
    case QTYPE_IQ3_S: quant_iq_ref_iq3_s(src, dst, n); break;
    case QTYPE_IQ2_S: quant_iq_ref_iq2_s(src, dst, n); break;
    default: assert(!"no quantiser for this type"); break;
    }
}
