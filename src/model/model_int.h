/*
 * model_int: what the files of model/ that load one family each (model_qwen35.c) share with
 * model.c: the loading context and its checked readers of keys and tensors. Not for callers of
 * model.h.
 */
#ifndef TM_MODEL_INT_H
#define TM_MODEL_INT_H

#include "model/model.h"

/* Loading context: the model being built plus the error buffer. */
typedef struct {
    model *m;
    char *err;
    size_t errsz;
    gguf_status st;  /* first error */
} model_ld;

/* Records the first error (later ones are dropped) and returns st. */
gguf_status model_fail(model_ld *ld, gguf_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An integer key, def when absent and not required; false (error recorded) otherwise. */
bool model_key_int(model_ld *ld, const char *key, bool required, int64_t def, int64_t *out);
bool model_key_float(model_ld *ld, const char *key, double def, double *out);
/* A (rows, cols) weight matrix of a supported type, viewed in place. */
bool model_matrix(model_ld *ld, const char *name, int64_t cols, int64_t rows, ops_weight *w);
/* A stacked expert tensor [cols, rows, n_expert] viewed as n_expert * rows rows. */
bool model_experts(model_ld *ld, const char *name, int64_t cols, int64_t rows, int n_expert, ops_weight *w);
/* A 1-D tensor of n (rows 1) or a 2-D (rows, n) one as owned f32; NULL when absent or wrong. */
const float *model_floats(model_ld *ld, const char *name, bool required, int64_t n, int64_t rows);
const float *model_vector(model_ld *ld, const char *name, bool required, int64_t n);

/* ---- Qwen3.5 (model_qwen35.c) ---- */
static inline bool model_is_qwen35(const model_hparams *hp)
{
    return hp->arch == MODEL_ARCH_QWEN35 || hp->arch == MODEL_ARCH_QWEN35MOE;
}
/* The linear-attention hyper-parameters and the layer kinds, after model_read_hparams. */
bool model_qwen35_hparams(model_ld *ld);
/* Every tensor of layer il. */
bool model_qwen35_layer(model_ld *ld, int il);

#endif
