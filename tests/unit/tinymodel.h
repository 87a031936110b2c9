/*
 * tinymodel: tiny random-weight llama / qwen2 / qwen3 / qwen3moe GGUF files for the model and engine
 * unit tests, plus a plain reference forward pass (f32, double accumulation, one token at a
 * time) to check the engine against. Header-only (static functions) so each test binary
 * carries its own copy.
 */
#ifndef TM_TINYMODEL_H
#define TM_TINYMODEL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/quant.h"
#include "util/util.h"

typedef struct {
    const char *arch;   /* "llama", "qwen2", "qwen3", "qwen3moe" */
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn, vocab;
    int n_expert, n_expert_used; /* qwen3moe: experts of ffn hidden units each */
    bool tied;          /* no output.weight */
    uint64_t seed;
    const char *skip;   /* tensor name to leave out (error tests) */
    const char *bad_shape; /* tensor name to write with one row too many */
    qtype wtype;        /* type of the 2-D weight matrices (token_embd stays F32); 0 = F32.
                         * Their cols must be multiples of its block size. */
} tiny_cfg;

typedef struct {
    float *data;        /* all tensors, concatenated */
    size_t n;
} tiny_buf;

static inline float *tiny_rand(util_rng *r, size_t n, float scale, float bias, tiny_buf *all)
{
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = bias + scale * (float)(util_rng_uniform(r) * 2 - 1);
    all->data = xrealloc(all->data, (all->n + 1) * sizeof(float *));
    ((float **)all->data)[all->n++] = p;
    return p;
}

static inline void tiny_free_buf(tiny_buf *b)
{
    for (size_t i = 0; i < b->n; i++) free(((float **)b->data)[i]);
    free(b->data);
}

/* A tensor of `rows` rows of `cols`, or with n_mat > 1 a 3-D stack of n_mat such matrices. */
static inline void tiny_add3(gguf_writer *w, const tiny_cfg *c, const char *name, const float *d, int64_t cols,
                             int64_t rows, int64_t n_mat)
{
    if (c->skip && !strcmp(c->skip, name)) return;
    if (c->bad_shape && !strcmp(c->bad_shape, name)) rows -= 1;  /* data has enough bytes */
    int64_t ne[3] = { cols, rows, n_mat };
    int nd = n_mat > 1 ? 3 : rows > 1 ? 2 : 1;
    rows *= n_mat;
    if (c->wtype != QTYPE_F32 && rows > 1 && strcmp(name, "token_embd.weight")) {
        /* quantised in place (the writer keeps the pointer; the rows shrink, so row r's
         * output never reaches rows not yet read) */
        size_t rb = quant_row_bytes(c->wtype, cols);
        char *q = (char *)d, *tmp = xmalloc(rb);
        for (int64_t r = 0; r < rows; r++) {
            quant_quantize_row(c->wtype, d + r * cols, tmp, cols);
            memcpy(q + (size_t)r * rb, tmp, rb);
        }
        free(tmp);
        gguf_writer_add_tensor(w, name, c->wtype, nd, ne, q, rb * (size_t)rows);
        return;
    }
    gguf_writer_add_tensor(w, name, QTYPE_F32, nd, ne, d, (size_t)(cols * rows) * 4);
}

static inline void tiny_add(gguf_writer *w, const tiny_cfg *c, const char *name, const float *d, int64_t cols, int64_t rows)
{
    tiny_add3(w, c, name, d, cols, rows, 1);
}

/* Writes the model to path; returns 0 on success. */
static inline int tiny_write(const tiny_cfg *c, const char *path)
{
    util_rng r;
    util_rng_seed(&r, c->seed);
    tiny_buf all = { 0 };
    gguf_writer *w = gguf_writer_new();
    char k[128];
    gguf_writer_set_str(w, "general.architecture", c->arch);
#define KEYU(s, v) (snprintf(k, sizeof k, "%s.%s", c->arch, s), gguf_writer_set_u32(w, k, (uint32_t)(v)))
    KEYU("embedding_length", c->dim);
    KEYU("block_count", c->n_layers);
    KEYU("attention.head_count", c->n_heads);
    KEYU("attention.head_count_kv", c->n_kv_heads);
    KEYU("attention.key_length", c->head_dim);
    KEYU("attention.value_length", c->head_dim);
    KEYU("feed_forward_length", c->ffn);
    KEYU("context_length", 1024);
    bool moe = !strcmp(c->arch, "qwen3moe");
    if (moe) {
        KEYU("expert_count", c->n_expert);
        KEYU("expert_used_count", c->n_expert_used);
        KEYU("expert_feed_forward_length", c->ffn);
    }
#undef KEYU
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", c->arch);
    gguf_writer_set_f32(w, k, 1e-6f);
    snprintf(k, sizeof k, "%s.rope.freq_base", c->arch);
    gguf_writer_set_f32(w, k, 10000.0f);
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    float s_in = 1.0f / sqrtf((float)c->dim);
    tiny_add(w, c, "token_embd.weight", tiny_rand(&r, (size_t)c->vocab * c->dim, 1.0f, 0, &all), c->dim, c->vocab);
    tiny_add(w, c, "output_norm.weight", tiny_rand(&r, (size_t)c->dim, 0.2f, 1.0f, &all), c->dim, 1);
    if (!c->tied)
        tiny_add(w, c, "output.weight", tiny_rand(&r, (size_t)c->vocab * c->dim, s_in * 3, 0, &all), c->dim, c->vocab);
    char nm[96];
    for (int l = 0; l < c->n_layers; l++) {
#define T(s) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), nm)
        tiny_add(w, c, T("attn_norm.weight"), tiny_rand(&r, (size_t)c->dim, 0.2f, 1.0f, &all), c->dim, 1);
        tiny_add(w, c, T("attn_q.weight"), tiny_rand(&r, (size_t)qd * c->dim, s_in * 2, 0, &all), c->dim, qd);
        tiny_add(w, c, T("attn_k.weight"), tiny_rand(&r, (size_t)kvd * c->dim, s_in * 2, 0, &all), c->dim, kvd);
        tiny_add(w, c, T("attn_v.weight"), tiny_rand(&r, (size_t)kvd * c->dim, s_in, 0, &all), c->dim, kvd);
        tiny_add(w, c, T("attn_output.weight"), tiny_rand(&r, (size_t)c->dim * qd, 1.0f / sqrtf((float)qd), 0, &all), qd, c->dim);
        if (!strcmp(c->arch, "qwen2")) {
            tiny_add(w, c, T("attn_q.bias"), tiny_rand(&r, (size_t)qd, 0.5f, 0, &all), qd, 1);
            tiny_add(w, c, T("attn_k.bias"), tiny_rand(&r, (size_t)kvd, 0.5f, 0, &all), kvd, 1);
            tiny_add(w, c, T("attn_v.bias"), tiny_rand(&r, (size_t)kvd, 0.5f, 0, &all), kvd, 1);
        }
        if (!strcmp(c->arch, "qwen3") || moe) {
            tiny_add(w, c, T("attn_q_norm.weight"), tiny_rand(&r, (size_t)c->head_dim, 0.3f, 1.0f, &all), c->head_dim, 1);
            tiny_add(w, c, T("attn_k_norm.weight"), tiny_rand(&r, (size_t)c->head_dim, 0.3f, 1.0f, &all), c->head_dim, 1);
        }
        tiny_add(w, c, T("ffn_norm.weight"), tiny_rand(&r, (size_t)c->dim, 0.2f, 1.0f, &all), c->dim, 1);
        if (moe) {
            /* the router stays F32, as in llama.cpp's files */
            tiny_cfg cr = *c;
            cr.wtype = QTYPE_F32;
            size_t ne = (size_t)c->n_expert, nf = (size_t)c->ffn * c->dim * ne;
            tiny_add(w, &cr, T("ffn_gate_inp.weight"), tiny_rand(&r, ne * c->dim, s_in * 3, 0, &all), c->dim, c->n_expert);
            tiny_add3(w, c, T("ffn_gate_exps.weight"), tiny_rand(&r, nf, s_in * 2, 0, &all), c->dim, c->ffn, c->n_expert);
            tiny_add3(w, c, T("ffn_up_exps.weight"), tiny_rand(&r, nf, s_in * 2, 0, &all), c->dim, c->ffn, c->n_expert);
            tiny_add3(w, c, T("ffn_down_exps.weight"), tiny_rand(&r, nf, 1.0f / sqrtf((float)c->ffn), 0, &all), c->ffn,
                      c->dim, c->n_expert);
            continue;
        }
        tiny_add(w, c, T("ffn_gate.weight"), tiny_rand(&r, (size_t)c->ffn * c->dim, s_in * 2, 0, &all), c->dim, c->ffn);
        tiny_add(w, c, T("ffn_up.weight"), tiny_rand(&r, (size_t)c->ffn * c->dim, s_in * 2, 0, &all), c->dim, c->ffn);
        tiny_add(w, c, T("ffn_down.weight"), tiny_rand(&r, (size_t)c->dim * c->ffn, 1.0f / sqrtf((float)c->ffn), 0, &all), c->ffn, c->dim);
#undef T
    }
    char err[256];
    gguf_status st = gguf_writer_write(w, path, err, sizeof err);
    if (st != GGUF_OK) fprintf(stderr, "tiny_write: %s\n", err);
    gguf_writer_free(w);
    tiny_free_buf(&all);
    return st == GGUF_OK ? 0 : 1;
}

/* ---- reference forward pass over a loaded F32 model (model.h), one token at a time ---- */
#ifdef TM_MODEL_H
typedef struct {
    const model *m;
    int max_pos;
    float *kc, *vc;     /* (n_layers, max_pos, kv_dim) */
} tiny_ref;

static inline void tiny_ref_init(tiny_ref *r, const model *m, int max_pos)
{
    const model_hparams *hp = &m->hp;
    r->m = m;
    r->max_pos = max_pos;
    size_t n = (size_t)hp->n_layers * max_pos * hp->n_kv_heads * hp->head_dim;
    r->kc = xcalloc(n, sizeof(float));
    r->vc = xcalloc(n, sizeof(float));
}

static inline void tiny_ref_free(tiny_ref *r)
{
    free(r->kc);
    free(r->vc);
}

static inline void tiny_matvec(const ops_weight *w, const float *x, float *y)
{
    const float *W = w->data;
    for (int64_t i = 0; i < w->rows; i++) {
        double s = 0;
        for (int64_t j = 0; j < w->cols; j++) s += (double)W[i * w->cols + j] * x[j];
        y[i] = (float)s;
    }
}

static inline void tiny_rms(const float *x, const float *w, float *y, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float sc = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = x[i] * sc * w[i];
}

static inline void tiny_rope(float *v, int n_heads, int hd, int n_rot, bool neox, int pos, float base)
{
    for (int h = 0; h < n_heads; h++) {
        float *x = v + h * hd;
        for (int i = 0; i < n_rot / 2; i++) {
            double th = pos * pow(base, -2.0 * i / n_rot);
            int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = (float)(x0 * cos(th) - x1 * sin(th));
            x[b] = (float)(x0 * sin(th) + x1 * cos(th));
        }
    }
}

static inline void tiny_ref_forward(tiny_ref *r, int32_t token, int pos, float *logits)
{
    const model *m = r->m;
    const model_hparams *hp = &m->hp;
    int D = hp->dim, hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd;
    int F = TM_MAX(hp->ffn_dim, hp->expert_ffn);
    float *x = xmalloc(D * 4), *xn = xmalloc(D * 4), *q = xmalloc(qd * 4), *att = xmalloc(qd * 4);
    float *g = xmalloc(F * 4), *u = xmalloc(F * 4), *tmp = xmalloc((size_t)TM_MAX(D, hp->n_vocab) * 4);
    double *sc = xmalloc((size_t)(pos + 1) * sizeof(double));
    memcpy(x, (const float *)m->tok_embd.data + (size_t)token * D, D * 4);
    for (int l = 0; l < hp->n_layers; l++) {
        const model_layer *L = &m->layers[l];
        float *k = r->kc + ((size_t)l * r->max_pos + pos) * kvd, *v = r->vc + ((size_t)l * r->max_pos + pos) * kvd;
        tiny_rms(x, L->attn_norm, xn, D, hp->rms_eps);
        tiny_matvec(&L->wq, xn, q);
        tiny_matvec(&L->wk, xn, k);
        tiny_matvec(&L->wv, xn, v);
        if (L->bq) {
            for (int i = 0; i < qd; i++) q[i] += L->bq[i];
            for (int i = 0; i < kvd; i++) k[i] += L->bk[i], v[i] += L->bv[i];
        }
        if (L->q_norm) {
            for (int h = 0; h < hp->n_heads; h++) tiny_rms(q + h * hd, L->q_norm, q + h * hd, hd, hp->rms_eps);
            for (int h = 0; h < hp->n_kv_heads; h++) tiny_rms(k + h * hd, L->k_norm, k + h * hd, hd, hp->rms_eps);
        }
        tiny_rope(q, hp->n_heads, hd, hp->n_rot, hp->rope_neox, pos, hp->rope_base);
        tiny_rope(k, hp->n_kv_heads, hd, hp->n_rot, hp->rope_neox, pos, hp->rope_base);
        for (int h = 0; h < hp->n_heads; h++) {
            int kh = h / (hp->n_heads / hp->n_kv_heads);
            double mx = -1e300, sum = 0;
            for (int p = 0; p <= pos; p++) {
                const float *kp = r->kc + ((size_t)l * r->max_pos + p) * kvd + kh * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)kp[i] * q[h * hd + i];
                sc[p] = d / sqrt((double)hd);
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p <= pos; p++) sum += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int p = 0; p <= pos; p++) a += sc[p] * r->vc[((size_t)l * r->max_pos + p) * kvd + kh * hd + i];
                att[h * hd + i] = (float)(a / sum);
            }
        }
        tiny_matvec(&L->wo, att, tmp);
        for (int i = 0; i < D; i++) x[i] += tmp[i];
        tiny_rms(x, L->ffn_norm, xn, D, hp->rms_eps);
        if (hp->n_expert > 0) {
            /* softmax over the router, the top k (first index on ties), weights renormalised,
             * the experts' outputs summed in double */
            int E = hp->n_expert, K = hp->n_expert_used, Fe = hp->expert_ffn;
            float *lg = xmalloc((size_t)E * 4);
            double *acc = xcalloc((size_t)D, sizeof(double)), pr[MODEL_MAX_EXPERTS], mx = -1e300, sum = 0, wsum = 0;
            int sel[MODEL_MAX_EXPERTS];
            bool used[MODEL_MAX_EXPERTS] = { 0 };
            tiny_matvec(&L->gate_inp, xn, lg);
            for (int i = 0; i < E; i++) mx = lg[i] > mx ? lg[i] : mx;
            for (int i = 0; i < E; i++) sum += pr[i] = exp(lg[i] - mx);
            for (int s = 0; s < K; s++) {
                int b = -1;
                for (int i = 0; i < E; i++)
                    if (!used[i] && (b < 0 || pr[i] > pr[b])) b = i;
                used[b] = true, sel[s] = b, wsum += pr[b] / sum;
            }
            for (int s = 0; s < K; s++) {
                ops_weight gw = model_expert(&L->gate_exps, E, sel[s]), uw = model_expert(&L->up_exps, E, sel[s]);
                ops_weight dw = model_expert(&L->down_exps, E, sel[s]);
                tiny_matvec(&gw, xn, g);
                tiny_matvec(&uw, xn, u);
                for (int i = 0; i < Fe; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
                tiny_matvec(&dw, g, tmp);
                for (int i = 0; i < D; i++) acc[i] += pr[sel[s]] / sum / wsum * tmp[i];
            }
            for (int i = 0; i < D; i++) x[i] += (float)acc[i];
            free(lg), free(acc);
            continue;
        }
        tiny_matvec(&L->gate, xn, g);
        tiny_matvec(&L->up, xn, u);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        tiny_matvec(&L->down, g, tmp);
        for (int i = 0; i < D; i++) x[i] += tmp[i];
    }
    tiny_rms(x, m->output_norm, xn, D, hp->rms_eps);
    tiny_matvec(&m->output, xn, logits);
    free(x), free(xn), free(q), free(att), free(g), free(u), free(tmp), free(sc);
}
#endif

#endif
