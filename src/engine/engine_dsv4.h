/*
 * engine_dsv4: DeepSeek V4's forward step (model_dsv4.h) over the paged KV pool, for
 * engine.c: engine_new makes one for a `deepseek4` model and engine_step hands it the batch.
 *
 * Per-sequence state lives in the pool's blocks, one row per position and layer (a pool of
 * one "head" of engine_dsv4_row floats, F32): the position's raw K=V row, and on a compressed
 * layer its compressor projections (kv and gate score with the learned position), the
 * compressed entry that the position completes (at the group's last position), and on a ratio-4
 * layer the lightning indexer's projections and entry likewise. Everything a later position
 * reads (the window's raw rows, the open group's projections, the finished entries) is thus a
 * function of the tokens up to it: a keyed block holds exactly the state of its 128 positions,
 * and attaching it gives the same logits as computing it.
 */
#ifndef TM_ENGINE_DSV4_H
#define TM_ENGINE_DSV4_H

#include <stddef.h>
#include <stdbool.h>

#include "engine/kvpool.h"
#include "model/model.h"
#include "util/threadpool.h"

typedef struct engine_dsv4 engine_dsv4;

/* The pool geometry of a V4 model: one row of engine_dsv4_row(m) F32 values per layer and
 * position, in blocks (no ring: the window is read from the blocks). */
kvpool_opts engine_dsv4_kv_geometry(const model *m);
int engine_dsv4_row(const model *m);

/* Scratch for batches of up to max_tokens entries on pool kv (max_pos: the most positions a
 * sequence can hold, for the indexer's and attention's per-thread buffers). NULL and err
 * when out of memory. */
engine_dsv4 *engine_dsv4_new(const model *m, threadpool *tp, kvpool *kv, int max_tokens, int max_pos, char *err,
                             size_t errsz);
void engine_dsv4_free(engine_dsv4 *d);

/* One step over n entries (engine.h's engine_tok, reserved in the pool by the caller; a
 * sequence's entries at consecutive positions in batch order, continuing what it holds):
 * logits (n_out, n_vocab) for the entries that want them, hidden (n, dim) the collapsed
 * residual stream before the output norm. */
void engine_dsv4_step(engine_dsv4 *d, int n, const void *toks, float *logits, float *hidden);

#endif
