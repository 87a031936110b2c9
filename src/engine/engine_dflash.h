/*
 * engine_dflash: the forward pass of a DFlash / DSpark drafter (model_dflash.h) beside its
 * target, for many sequences at once.
 *
 * DESIGN. The drafter keeps a KV cache of its own (an F32 kvpool, one kvpool_seq per target
 * sequence) that mirrors the target's final positions:
 *   - inject: each position the target computed gives the inputs of its layers tl[0..n_tl)
 *     (engine_capture_layers), concatenated, (n_tl * dim) floats; g = rmsnorm(fc . feat) *
 *     enc_norm, and for each drafter layer K = rope(k_norm(wk . g)), V = wv . g are written at
 *     that position (no attention, no FFN);
 *   - draft: a block of B tokens [anchor, mask, ..., mask] at positions n..n+B-1 (n = the
 *     positions injected) runs the backbone from the token embeddings (the target's, unless
 *     the file has its own) with non-causal attention over the injected context and the whole
 *     block, then the output norm and head (the target's unless its own). With a Markov head,
 *     slot i's logits get w2 . w1[prev] added (prev: the anchor for the first drafted slot, then
 *     the argmax of the slot before: a greedy chain inside the pass), skipped for a block
 *     longer than the trained block_size; the confidence head gives sigmoid(conf_w .
 *     [normed hidden; w1[prev]] + b). Every block of a call shares one pass (each matmul once
 *     for all of them). The block's own K/V are scratch rows past n: the next injection
 *     overwrites them, so rolling back is the caller lowering n to the target's final
 *     positions.
 * Which slots are drafts is the caller's (draft-dspark's anchor-first layout reads slots
 * 0..B-1 of a block of K; draft-dflash reads 1..K of a block of K + 1): this returns every
 * slot. The arithmetic is llama.cpp's src/models/dflash.cpp (docs/spec.md).
 *
 * Engine thread only; all scratch is allocated in engine_dflash_new.
 */
#ifndef TM_ENGINE_DFLASH_H
#define TM_ENGINE_DFLASH_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kvpool.h"
#include "model/model.h"
#include "model/model_dflash.h"

#define ENGINE_DFLASH_MAX_BLOCK 16   /* slots per drafted block at most */

typedef struct engine_dflash engine_dflash;

typedef struct {
    int max_seqs;            /* blocks per draft call at most */
    int max_tokens;          /* positions per inject call at most (larger calls are split) */
    int n_ctx;               /* positions a sequence may hold (the drafter's KV is sized for
                              * max_seqs of them, plus a block each) */
    int n_threads;           /* <= 0: online cores */
} engine_dflash_opts;

/* A drafter d (model_dflash_match(t, d) must hold) beside target t; neither is owned, both
 * must outlive it. NULL with a message in err when out of memory. */
engine_dflash *engine_dflash_new(const model *d, const model *t, const engine_dflash_opts *o, char *err,
                                 size_t errsz);
void engine_dflash_free(engine_dflash *ed);
/* The pool the sequences live in (kvpool_seq_new / kvpool_seq_free on it). */
kvpool *engine_dflash_kvpool(engine_dflash *ed);
const model_dflash *engine_dflash_model(const engine_dflash *ed);
/* The drafter model. */
const model *engine_dflash_drafter(const engine_dflash *ed);
/* Floats of one position's target features (n_tl * dim). */
int engine_dflash_features(const engine_dflash *ed);

/* One injected position. */
typedef struct {
    kvpool_seq *seq;
    int32_t pos;
    const float *feat;       /* (n_tl * dim) the target's layer inputs at this position */
} engine_dflash_inj;

/* Writes the drafter's K/V of n positions. ENGINE_ERR_KV_FULL when the pool has no room
 * (nothing written for the entries past the failure). */
engine_status engine_dflash_inject(engine_dflash *ed, int n, const engine_dflash_inj *inj);

/* One block to draft and, out, each slot's result. */
typedef struct {
    kvpool_seq *seq;
    int32_t pos;             /* the block's first position: the positions injected */
    int32_t anchor;          /* the token at pos (the target's last, not yet injected) */
    int n_slots;             /* B, 1..ENGINE_DFLASH_MAX_BLOCK; every block of a call the same */
    int32_t token[ENGINE_DFLASH_MAX_BLOCK];   /* out: argmax of each slot's (biased) logits */
    float logprob[ENGINE_DFLASH_MAX_BLOCK];   /* out: its log-probability */
    float conf[ENGINE_DFLASH_MAX_BLOCK];      /* out: the confidence head's value, -1 without
                                               * one (or for a slot it does not score) */
} engine_dflash_block;

/* Runs the blocks (n <= max_seqs) in one pass. ENGINE_ERR_ARG for blocks of different sizes or
 * a bad token; ENGINE_ERR_KV_FULL when a block's positions cannot be reserved. */
engine_status engine_dflash_draft(engine_dflash *ed, int n, engine_dflash_block *blocks);

#endif
