/*
 * engine_dsv4_mtp: DeepSeek V4's MTP block's input projection, then the block through
 * engine_dsv4 (see engine_dsv4_mtp.h; docs/deepseek4.md, "MTP").
 */
#include "engine/engine_dsv4_mtp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_dsv4.h"
#include "model/ops.h"
#include "util/util.h"

struct engine_dsv4_mtp {
    const model *m;          /* the view of the block (model_mtp_view) */
    engine_dsv4 *d;          /* its step (not owned) */
    threadpool *tp;
    int max_tokens;
    float *e;                /* (T, dim) the entries' normed embeddings */
    float *hn;               /* (T, hc, dim) the target's streams, normed per stream */
    float *cat;              /* (T, hc, 2 * dim) per stream [enorm(embedding); hnorm(stream)] */
    float *x0;               /* (T, hc, dim) eh_proj's output: the block's input streams */
    void *mm_scratch;        /* eh_proj over T * hc rows */
};

engine_dsv4_mtp *engine_dsv4_mtp_new(const model *m, engine_dsv4 *d, threadpool *tp, int max_tokens, char *err,
                                     size_t errsz)
{
    const size_t T = (size_t)max_tokens, dim = (size_t)m->hp.dim, hc = (size_t)m->dsv4->hc;
    engine_dsv4_mtp *p = xcalloc(1, sizeof *p);
    p->m = m, p->d = d, p->tp = tp, p->max_tokens = max_tokens;
    p->e = util_aligned_alloc(T * dim * sizeof(float));
    p->hn = util_aligned_alloc(T * hc * dim * sizeof(float));
    p->cat = util_aligned_alloc(T * hc * 2 * dim * sizeof(float));
    p->x0 = util_aligned_alloc(T * hc * dim * sizeof(float));
    const ops_weight *eh = &m->layers[0].eh_proj;
    p->mm_scratch = util_aligned_alloc(ops_matmul_scratch_bytes(eh->type, eh->cols, (int)(T * hc)) + 64);
    if (!p->e || !p->hn || !p->cat || !p->x0 || !p->mm_scratch) {
        snprintf(err, errsz, "out of memory for DeepSeek V4's MTP input of %d tokens", max_tokens);
        engine_dsv4_mtp_free(p);
        return NULL;
    }
    return p;
}

void engine_dsv4_mtp_free(engine_dsv4_mtp *p)
{
    if (!p) return;
    free(p->e);
    free(p->hn);
    free(p->cat);
    free(p->x0);
    free(p->mm_scratch);
    free(p);
}

bool engine_dsv4_mtp_step(engine_dsv4_mtp *p, int T, const engine_tok *toks, const float *hidden, float *logits,
                          float *collapsed)
{
    const model *m = p->m;
    const model_layer *L = &m->layers[0];
    const int dim = m->hp.dim, hc = m->dsv4->hc;
    const float eps = m->hp.rms_eps;
    for (int t = 0; t < T; t++) model_embed_row(m, toks[t].token, p->e + (size_t)t * dim);
    ops_rmsnorm(p->tp, p->e, p->e, L->enorm, T, dim, eps);
    ops_rmsnorm(p->tp, p->hn, hidden, L->hnorm, T * hc, dim, eps);
    /* the embedding's half is the same for every stream of an entry (llama.cpp repeats it) */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < hc; h++) {
            float *c = p->cat + ((size_t)t * hc + h) * 2 * dim;
            memcpy(c, p->e + (size_t)t * dim, (size_t)dim * sizeof(float));
            memcpy(c + dim, p->hn + ((size_t)t * hc + h) * dim, (size_t)dim * sizeof(float));
        }
    ops_matmul(p->tp, &L->eh_proj, p->cat, T * hc, p->x0, p->mm_scratch);
    return engine_dsv4_step_from(p->d, T, toks, p->x0, logits, collapsed);
}
