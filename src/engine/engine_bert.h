/*
 * engine_bert: the forward pass of a BERT-style encoder (model_bert.c) for engine.c:
 * engine_new makes one for a `bert` model and engine_step hands it the batch. Attention is
 * bidirectional, so nothing is kept between steps (the KV pool only counts positions): each
 * sequence of a step is computed whole, from position 0, and its states are final. The
 * output is the last block's state of every entry (what the scheduler pools); there are no
 * logits. nomic-bert: RoPE on Q and K instead of position rows, a SwiGLU FFN.
 *
 * Numerics follow llama.cpp's CPU graph: LayerNorm as ggml_norm (mean, then the centred
 * variance), GELU by ggml's fp16 table (the tanh form at the input rounded to fp16, the
 * result rounded to fp16; identity above 10, zero below -10), attention in f32 with scores
 * scaled by 1/sqrt(head_dim).
 */
#ifndef TM_ENGINE_BERT_H
#define TM_ENGINE_BERT_H

#include <stdbool.h>

#include "engine/engine.h"
#include "model/model.h"
#include "util/threadpool.h"

typedef struct engine_bert engine_bert;

/* Buffers for steps of up to max_tokens entries; NULL when out of memory. */
engine_bert *engine_bert_new(const model *m, threadpool *tp, int max_tokens);
void engine_bert_free(engine_bert *b);

/* One step over n entries into x (n, dim): each sequence's entries consecutive in batch order
 * at positions 0, 1, .. (its whole input; a sequence in one run only), below the model's
 * context_length, none wanting logits. false (nothing computed) for any other batch. */
bool engine_bert_step(engine_bert *b, int n, const engine_tok *toks, float *x);

#endif
