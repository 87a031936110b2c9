/*
 * model_dflash: DFlash / DSpark drafters (llama.cpp's `dflash` architecture, as its
 * converters write it: a Qwen3-style backbone that drafts a block of tokens in one pass from
 * the target's hidden states), loaded by model_load beside a target of the same vocabulary.
 *
 * The backbone's layers are ordinary model_layer rows (Qwen3 attention with q/k norms, NEOX
 * RoPE, a SwiGLU FFN), so repacking and the byte counts see them as any model's; this holds
 * what the architecture adds: `fc` and `enc.output_norm`, which turn the inputs of the
 * target's layers `target_layers` into the drafter's context, the DSpark Markov head
 * (`markov_w1/w2`) and confidence head (`conf_proj`), and the block metadata. A file without
 * `token_embd` / `output` borrows the target's (hp.n_vocab then comes from its tokenizer).
 * engine/engine_dflash.c runs it; docs/spec.md writes the arithmetic out.
 *
 * A file with dflash.hyper_connection.count > 0 has the DeepSeek V4 backbone instead
 * (conversion/deepseek.py's DeepseekV4DSparkModel): its layers are V4 layers, loaded by
 * model_dsv4_load under the `dflash.` prefix into m->dsv4 (all uncompressed, no hash layers),
 * and it drafts for a `deepseek4` target only.
 *
 * Refused at load with a message naming the part: DFlash2's conv and selector tensors, a
 * reduced draft vocabulary (`d2t`), and on the Qwen3 backbone attention sinks and sliding
 * windows (not in the engine yet).
 */
#ifndef TM_MODEL_DFLASH_H
#define TM_MODEL_DFLASH_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

#define MODEL_DFLASH_MAX_TL 16   /* target layers a drafter may read */

typedef struct model_dflash {
    int n_tl;                /* target layers read */
    int32_t tl[MODEL_DFLASH_MAX_TL]; /* (n_tl) their ids: the residual stream entering each */
    int block_size;          /* dflash.block_size: the trained block (anchor + drafts) */
    bool sample_from_anchor; /* dflash.sample_from_anchor (default true): with a Markov head,
                              * slot 0 (the anchor's) predicts the first draft */
    bool has_conf;           /* a confidence head (conf_proj) */
    int32_t mask_token;      /* tokenizer.ggml.mask_token_id: the block's unknown slots */
    bool own_embd, own_head; /* token_embd / output in the file (else the target's) */
    ops_weight fc;           /* (dim, n_tl * dim): target features -> drafter context */
    const float *enc_norm;   /* (dim) f32 enc.output_norm, after fc */
    int markov_rank;         /* R, 0: no Markov head */
    const float *markov_w1;  /* (n_vocab, R) f32: row prev is the previous token's code */
    ops_weight markov_w2;    /* (n_vocab, R): bias = w2 . w1[prev] */
    const float *conf_w;     /* (dim + R) f32 conf_proj over [hidden; w1[prev]] (hidden: normed on
                              * Qwen3, the collapsed streams before the norm on V4), or NULL */
    float conf_b;            /* its bias (0 without) */
} model_dflash;

void model_dflash_free(model_dflash *d);

/* Whether drafter d can draft for target t: the backbone's family (V4 for a deepseek4 target,
 * Qwen3 for the others), the same vocabulary size, the drafter's width the target's, every
 * target layer below t's layer count (up to it on V4: the final streams), a target with the
 * embedding and head a drafter without its own borrows, the mask token in range. false with a message naming what differs. The vocabularies' tokens are the caller's
 * to compare (tokenizer). */
bool model_dflash_match(const model *t, const model *d, char *err, size_t errsz);

#endif
