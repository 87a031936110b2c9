/*
 * ops_vec_avx512: the AVX-512 level's float kernels (the table's entries of ops_int.h other
 * than the quantisers and matrix products, which are ops_avx512.c's): dots and multiply-adds
 * of F32/F16 rows, softmax, RMS norm, SwiGLU, add, attention over a block of keys
 * (ops_att_block: many query rows with queries in lanes, few with keys in lanes), and the read
 * loop of ops_stream_read. Each is the scalar reference's arithmetic up to float summation
 * order; test_ops checks them against it at every level.
 */
#include "model/ops_avx512.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "util/util.h"

/* ---- vector helpers and elementwise ops ----------------------------------------------- */

#define A512_MASK(n, i) ((n) - (i) >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ((n) - (i))) - 1))

/* exp(x) for x <= ~88: 2^n * p(r), r = x - n*ln2 in [-ln2/2, ln2/2], degree-6 polynomial
 * (relative error ~2 ulp); large negative x flush to 0. */
A512_INLINE __m512 a512_exp(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static float a512_dot_f16_f32(int n, const fp16_t *a, const float *b)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(a512_load_f16(a, i, 0xFFFF), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(a512_load_f16(a, i + 16, 0xFFFF), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        acc0 = _mm512_fmadd_ps(a512_load_f16(a, i, k), _mm512_maskz_loadu_ps(k, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static float a512_dot_f16(int n, const fp16_t *a, const fp16_t *b)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(a512_load_f16(a, i, 0xFFFF), a512_load_f16(b, i, 0xFFFF), acc0);
        acc1 = _mm512_fmadd_ps(a512_load_f16(a, i + 16, 0xFFFF), a512_load_f16(b, i + 16, 0xFFFF), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        acc0 = _mm512_fmadd_ps(a512_load_f16(a, i, k), a512_load_f16(b, i, k), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static float a512_dot_f32(int n, const float *a, const float *b)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static void a512_mad_f16(int n, float *y, const fp16_t *x, float s)
{
    __m512 vs = _mm512_set1_ps(s);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        __m512 v = _mm512_fmadd_ps(a512_load_f16(x, i, k), vs, _mm512_maskz_loadu_ps(k, y + i));
        _mm512_mask_storeu_ps(y + i, k, v);
    }
}

static void a512_mad_f32(int n, float *y, const float *x, float s)
{
    __m512 vs = _mm512_set1_ps(s);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x + i), vs, _mm512_maskz_loadu_ps(k, y + i));
        _mm512_mask_storeu_ps(y + i, k, v);
    }
}

static void a512_scale_f32(int n, float *y, float s)
{
    __m512 vs = _mm512_set1_ps(s);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + i), vs));
    }
}

static float a512_max_f32(int n, const float *x)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
    }
    return _mm512_reduce_max_ps(m);
}

static float a512_softmax_exp(int n, float *y, float max)
{
    __m512 vm = _mm512_set1_ps(max), sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        __m512 e = a512_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, y + i), vm));
        _mm512_mask_storeu_ps(y + i, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* ---- attention: one key block (ops_att_block), queries in lanes ------------------------ */

/* st[j][i] for JJ keys from j0 and CC 16-query chunks from c0: one FMA chain over d per
 * (key, query), the key element broadcast, 16 queries of qt per load */
A512_INLINE void a512_att_qk(int JJ, int CC, const ops_att_block_args *a, int j0, int c0)
{
    __m512 acc[6][4];
    _Pragma("GCC unroll 6") for (int r = 0; r < JJ; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++) acc[r][c] = _mm512_setzero_ps();
    const float *k = a->k + (size_t)j0 * a->hd, *q = a->qt + (size_t)c0 * 16;
    for (int d = 0; d < a->hd; d++) {
        __m512 qv[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++) qv[c] = _mm512_loadu_ps(q + (size_t)d * a->nqp + c * 16);
        _Pragma("GCC unroll 6") for (int r = 0; r < JJ; r++) {
            __m512 kv = _mm512_set1_ps(k[(size_t)r * a->hd + d]);
            _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++) acc[r][c] = _mm512_fmadd_ps(kv, qv[c], acc[r][c]);
        }
    }
    __m512 vs = _mm512_set1_ps(a->scale);
    _Pragma("GCC unroll 6") for (int r = 0; r < JJ; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < CC; c++)
            _mm512_storeu_ps(a->st + (size_t)(j0 + r) * a->nqp + (c0 + c) * 16, _mm512_mul_ps(acc[r][c], vs));
}
#define A512_ATT_QK(JJ, CC) case JJ * 8 + CC: a512_att_qk(JJ, CC, a, j0, c0); break;
/* every (rows 1..6, 16-float chunks 1..4) register tile, as switch cases of C(R, C) */
#define A512_ATT_TILES(C)                                                                   \
    C(1, 1) C(1, 2) C(1, 3) C(1, 4) C(2, 1) C(2, 2) C(2, 3) C(2, 4) C(3, 1) C(3, 2) C(3, 3)  \
    C(3, 4) C(4, 1) C(4, 2) C(4, 3) C(4, 4) C(5, 1) C(5, 2) C(5, 3) C(5, 4) C(6, 1) C(6, 2)  \
    C(6, 3) C(6, 4)

/* acc[i][d] += sum_j st[j][i] * v[j][d] for II rows from i0 and dims [d0, d0 + 16 * DC)
 * (the last chunk masked by km), keys j < nj */
A512_INLINE void a512_att_pv(int II, int DC, const ops_att_block_args *a, int i0, int d0,
                             __mmask16 km, int nj)
{
    __m512 acc[6][4];
    const int hd = a->hd;
    _Pragma("GCC unroll 6") for (int r = 0; r < II; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++)
            acc[r][c] = _mm512_maskz_loadu_ps(c == DC - 1 ? km : 0xFFFF, a->acc + (size_t)(i0 + r) * hd + d0 + c * 16);
    for (int j = 0; j < nj; j++) {
        __m512 vv[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++)
            vv[c] = _mm512_maskz_loadu_ps(c == DC - 1 ? km : 0xFFFF, a->v + (size_t)j * hd + d0 + c * 16);
        _Pragma("GCC unroll 6") for (int r = 0; r < II; r++) {
            __m512 p = _mm512_set1_ps(a->st[(size_t)j * a->nqp + i0 + r]);
            _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < II; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < DC; c++)
            _mm512_mask_storeu_ps(a->acc + (size_t)(i0 + r) * hd + d0 + c * 16, c == DC - 1 ? km : 0xFFFF, acc[r][c]);
}

/* row[0..hd) *= f: a row's accumulator when its running max rose */
A512_INLINE void a512_att_rescale(float *row, int hd, float f)
{
    __m512 vf = _mm512_set1_ps(f);
    for (int d = 0; d < hd; d += 16) {
        __mmask16 kd = A512_MASK(hd, d);
        _mm512_mask_storeu_ps(row + d, kd, _mm512_mul_ps(_mm512_maskz_loadu_ps(kd, row + d), vf));
    }
}

/* acc += P V (P in st): 6 rows x 64 dims per tile, keys up to the furthest the rows see */
static void a512_att_pv_all(const ops_att_block_args *a)
{
    const int hd = a->hd, nq = a->nq;
    for (int i0 = 0; i0 < nq; i0 += 6) {
        int ii = TM_MIN(6, nq - i0), nj = ops_att_lim_max(a->lim, i0, i0 + ii);
        for (int d0 = 0; d0 < hd; d0 += 64) {
            int dc = TM_MIN(4, (hd - d0 + 15) / 16);
            __mmask16 km = A512_MASK(hd, d0 + (dc - 1) * 16);
            switch (ii * 8 + dc) {
#define A512_ATT_PV(II, DC) case II * 8 + DC: a512_att_pv(II, DC, a, i0, d0, km, nj); break;
            A512_ATT_TILES(A512_ATT_PV)
#undef A512_ATT_PV
            default: break;
            }
        }
    }
}

/* ---- attention, few query rows (a decode token's gqa heads): keys in lanes --------------
 * With 1-4 query rows the queries-in-lanes Q K^T above fills 1-4 of 16 lanes. Here the
 * block's keys are transposed into kt (16x16 register transposes) and 16 keys share a vector:
 * each (query, key) score is still one FMA chain over d = 0..hd-1 in order, scaled the same
 * way, and the softmax does per row exactly the arithmetic of the chunked one (same max, same
 * exp of the same differences, the sum added key by key in key order), so a row's bits do not
 * depend on which of the two paths its block took. */
#define A512_KIL_ROWS 4   /* blocks of at most this many query rows take this path */

A512_INLINE void a512_transpose16(__m512 r[16])
{
    __m512 t[16];
    _Pragma("GCC unroll 8") for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < 16; i += 8)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            t[i + c] = _mm512_shuffle_f32x4(r[i + c], r[i + c + 4], 0x88);
            t[i + c + 4] = _mm512_shuffle_f32x4(r[i + c], r[i + c + 4], 0xdd);
        }
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0xdd);
    }
}

/* kt[d][j] = k[j][d] for keys j < nk, zeros for keys [nk, nkp) (nkp: nk rounded up to 64) */
static void a512_att_kt(const ops_att_block_args *a, int nk, int nkp)
{
    const int hd = a->hd;
    for (int j0 = 0; j0 < nkp; j0 += 16)
        for (int d0 = 0; d0 < hd; d0 += 16) {
            __mmask16 kd = A512_MASK(hd, d0);
            __m512 r[16];
            /* rows past nk read as zeros (masked off, never past the block) */
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
                r[i] = _mm512_maskz_loadu_ps(j0 + i < nk ? kd : 0, a->k + (size_t)TM_MIN(j0 + i, nk - 1) * hd + d0);
            a512_transpose16(r);
            float *dst = a->kt + (size_t)d0 * OPS_ATT_KT_KEYS + j0;
            if (d0 + 16 <= hd) {
                _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) _mm512_storeu_ps(dst + (size_t)c * OPS_ATT_KT_KEYS, r[c]);
            } else {
                _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++)
                    if (d0 + c < hd) _mm512_storeu_ps(dst + (size_t)c * OPS_ATT_KT_KEYS, r[c]);
            }
        }
}

/* sk[r][j] = (q_r . k_j) * scale for RR rows from r0 and the 64 keys from j0 */
A512_INLINE void a512_att_qk_kil(int RR, const ops_att_block_args *a, int r0, int j0, float (*sk)[OPS_ATT_KT_KEYS])
{
    __m512 acc[A512_KIL_ROWS][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < RR; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < a->hd; d++) {
        const float *kt = a->kt + (size_t)d * OPS_ATT_KT_KEYS + j0;
        __m512 kv[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) kv[c] = _mm512_loadu_ps(kt + c * 16);
        _Pragma("GCC unroll 4") for (int r = 0; r < RR; r++) {
            __m512 qv = _mm512_set1_ps(a->qt[(size_t)d * a->nqp + r0 + r]);
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(kv[c], qv, acc[r][c]);
        }
    }
    __m512 vs = _mm512_set1_ps(a->scale);
    _Pragma("GCC unroll 4") for (int r = 0; r < RR; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(&sk[r0 + r][j0 + c * 16], _mm512_mul_ps(acc[r][c], vs));
}

static void a512_att_block_kil(const ops_att_block_args *a)
{
    const int hd = a->hd, nq = a->nq, nqp = a->nqp;
    const int jall = ops_att_lim_max(a->lim, 0, nq), nkp = (jall + 63) / 64 * 64;
    float sk[A512_KIL_ROWS][OPS_ATT_KT_KEYS] __attribute__((aligned(64)));
    float p[OPS_ATT_KT_KEYS] __attribute__((aligned(64)));
    a512_att_kt(a, jall, nkp);
    for (int j0 = 0; j0 < nkp; j0 += 64)
        switch (nq) {
        case 1: a512_att_qk_kil(1, a, 0, j0, sk); break;
        case 2: a512_att_qk_kil(2, a, 0, j0, sk); break;
        case 3: a512_att_qk_kil(3, a, 0, j0, sk); break;
        default: a512_att_qk_kil(4, a, 0, j0, sk); break;
        }
    for (int r = 0; r < nq; r++) {
        const int lim = a->lim[r];
        float M = a->m[r], S = a->s[r];
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < lim; j += 16) mv = _mm512_mask_max_ps(mv, A512_MASK(lim, j), mv, _mm512_loadu_ps(&sk[r][j]));
        float mb = _mm512_reduce_max_ps(mv);   /* a max: the same whatever the order */
        if (mb > M) {
            if (M != -INFINITY) {
                float ms = _mm512_cvtss_f32(a512_exp(_mm512_set1_ps(M - mb)));
                S *= ms;
                a512_att_rescale(a->acc + (size_t)r * hd, hd, ms);
            }
            M = mb;
        }
        __m512 vm = _mm512_set1_ps(M);
        for (int j = 0; j < lim; j += 16)
            _mm512_storeu_ps(p + j, _mm512_maskz_mov_ps(A512_MASK(lim, j), a512_exp(_mm512_sub_ps(_mm512_loadu_ps(&sk[r][j]), vm))));
        for (int j = 0; j < lim; j++) S += p[j];   /* key order, as the chunked softmax */
        for (int j = 0; j < lim; j++) a->st[(size_t)j * nqp + r] = p[j];
        for (int j = lim; j < jall; j++) a->st[(size_t)j * nqp + r] = 0.0f;
        a->m[r] = M;
        a->s[r] = S;
    }
    a512_att_pv_all(a);
}

static void a512_att_block(const ops_att_block_args *a)
{
    if (a->kt && a->nq <= A512_KIL_ROWS) {
        a512_att_block_kil(a);
        return;
    }
    const int hd = a->hd, nq = a->nq, nqp = a->nqp, nc = (nq + 15) / 16;
    /* scores, keys up to the furthest any query of the chunk group sees */
    for (int c0 = 0; c0 < nc; c0 += 4) {
        int cc = TM_MIN(4, nc - c0), jend = ops_att_lim_max(a->lim, c0 * 16, TM_MIN(nq, (c0 + cc) * 16));
        for (int j0 = 0; j0 < jend; j0 += 6) {
            int jj = TM_MIN(6, jend - j0);
            switch (jj * 8 + cc) {
            A512_ATT_TILES(A512_ATT_QK)
            default: break;
            }
        }
    }
    /* online softmax, 16 rows at once */
    int jall = ops_att_lim_max(a->lim, 0, nq);
    for (int c = 0; c < nc; c++) {
        __mmask16 live = A512_MASK(nq, c * 16);
        __m512i lim = _mm512_maskz_loadu_epi32(live, a->lim + c * 16);
        __m512 M = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, a->m + c * 16);
        __m512 S = _mm512_maskz_loadu_ps(live, a->s + c * 16);
        int jend = ops_att_lim_max(a->lim, c * 16, TM_MIN(nq, c * 16 + 16));
        __m512 mb = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < jend; j++) {
            __mmask16 kj = _mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(j));
            mb = _mm512_mask_max_ps(mb, kj, mb, _mm512_loadu_ps(a->st + (size_t)j * nqp + c * 16));
        }
        __mmask16 up = _mm512_cmp_ps_mask(mb, M, _CMP_GT_OQ);
        __mmask16 resc = up & _mm512_cmp_ps_mask(M, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        if (resc) {
            float ms[16];
            _mm512_storeu_ps(ms, a512_exp(_mm512_sub_ps(M, mb)));
            S = _mm512_mask_mul_ps(S, resc, S, _mm512_loadu_ps(ms));
            for (unsigned bits = resc; bits; bits &= bits - 1) {
                int l = __builtin_ctz(bits);
                a512_att_rescale(a->acc + (size_t)(c * 16 + l) * hd, hd, ms[l]);
            }
        }
        M = _mm512_mask_mov_ps(M, up, mb);
        for (int j = 0; j < jend; j++) {
            float *sp = a->st + (size_t)j * nqp + c * 16;
            __mmask16 kj = _mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(j));
            __m512 p = _mm512_maskz_mov_ps(kj, a512_exp(_mm512_sub_ps(_mm512_loadu_ps(sp), M)));
            _mm512_storeu_ps(sp, p);
            S = _mm512_add_ps(S, p);
        }
        /* keys from jend to the block's furthest are p = 0 for all 16 rows: stored as such,
         * since a P V tile (6 rows) may span two chunks and run to its other rows' furthest
         * key; adding these zeros to S would change nothing */
        for (int j = jend; j < jall; j++) _mm512_storeu_ps(a->st + (size_t)j * nqp + c * 16, _mm512_setzero_ps());
        _mm512_mask_storeu_ps(a->m + c * 16, live, M);
        _mm512_mask_storeu_ps(a->s + c * 16, live, S);
    }
    a512_att_pv_all(a);
}

static void a512_rmsnorm_row(float *out, const float *x, const float *w, int n, float eps)
{
    /* squares rounded to float (as ggml), summed in double */
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __m512 sq = _mm512_mul_ps(v, v);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    float mean = (float)(sum / n);
    __m512 vs = _mm512_set1_ps(1.0f / sqrtf(mean + eps));
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vs);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + i));
        _mm512_mask_storeu_ps(out + i, k, v);
    }
}

static void a512_swiglu(float *out, const float *g, const float *u, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        __m512 gv = _mm512_maskz_loadu_ps(k, g + i);
        __m512 e = a512_exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i)));
    }
}

static void a512_add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = A512_MASK(n, i);
        _mm512_mask_storeu_ps(y + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, y + i),
                                                     _mm512_maskz_loadu_ps(k, x + i)));
    }
}

/* four 64-byte loads a 256-byte step, four chains; the words past the last step one by one */
static uint64_t a512_stream_read(const void *p, size_t n)
{
    const char *c = p;
    __m512i a = _mm512_setzero_si512(), b = a, d = a, e = a;
    size_t i = 0;
    for (; i + 256 <= n; i += 256) {
        a = _mm512_xor_si512(a, _mm512_loadu_si512(c + i));
        b = _mm512_xor_si512(b, _mm512_loadu_si512(c + i + 64));
        d = _mm512_xor_si512(d, _mm512_loadu_si512(c + i + 128));
        e = _mm512_xor_si512(e, _mm512_loadu_si512(c + i + 192));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(d, e));
    uint64_t w[8], r = 0;
    _mm512_storeu_si512(w, a);
    for (int k = 0; k < 8; k++) r ^= w[k];
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, c + i, 8);
        r ^= v;
    }
    return r;
}

void ops_vec_init_avx512(ops_kernels *k)
{
    k->dot_f16_f32 = a512_dot_f16_f32;
    k->dot_f16 = a512_dot_f16;
    k->mad_f16 = a512_mad_f16;
    k->dot_f32 = a512_dot_f32;
    k->mad_f32 = a512_mad_f32;
    k->scale_f32 = a512_scale_f32;
    k->softmax_exp = a512_softmax_exp;
    k->max_f32 = a512_max_f32;
    k->rmsnorm_row = a512_rmsnorm_row;
    k->swiglu = a512_swiglu;
    k->add = a512_add;
    k->att_block = a512_att_block;
    k->stream_read = a512_stream_read;
}
