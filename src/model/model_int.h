/*
 * model_int: what only model*.c may see: the loading context and the tensor readers of
 * model.c, shared with the files that load a family of their own (model_dsv4.c). Each
 * reader records the first error in the context, naming the key or tensor, and returns
 * false / NULL.
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

gguf_status model_fail(model_ld *ld, gguf_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool model_key_int(model_ld *ld, const char *key, bool required, int64_t def, int64_t *out);
bool model_key_float(model_ld *ld, const char *key, double def, double *out);
/* Tensor NAME of n_dims 1 or 2 and (cols, rows); NULL when absent (an error if required). */
const gguf_tensor *model_tensor(model_ld *ld, const char *name, bool required, int n_dims, int64_t cols,
                                int64_t rows);
bool model_matrix(model_ld *ld, const char *name, int64_t cols, int64_t rows, ops_weight *w);
/* A stacked 3-D expert tensor [cols, rows, n_expert] as one matrix of n_expert * rows rows. */
bool model_experts(model_ld *ld, const char *name, int64_t cols, int64_t rows, int n_expert, ops_weight *w);
/* A 1-D (rows 1) or 2-D (rows, n) tensor of any type as an owned f32 array. */
const float *model_floats(model_ld *ld, const char *name, bool required, int64_t n, int64_t rows);
const float *model_vector(model_ld *ld, const char *name, bool required, int64_t n);
/* n zeroed floats owned by the model. */
float *model_own(model *m, size_t n);

/* Reads DeepSeek V4's hyper-parameters and every layer's tensors into m->layers and m->dsv4
 * (model_dsv4.c), after the common hyper-parameters, the embedding and the output. */
bool model_dsv4_load(model_ld *ld);

#endif
