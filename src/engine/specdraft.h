/*
 * specdraft: drafting with a model: a smaller model of the same vocabulary (--draft), or the
 * served model cut to its first layers (--draft-layers, self-speculation), run on an engine
 * of its own with its own KV pool, for many sequences at once.
 *
 * DESIGN. A round drafts up to k_max tokens for each sequence greedily (the argmax; its
 * softmax probability goes with it as the acceptance estimate's input), in k_max batched
 * engine steps: the first carries every sequence's tokens the draft KV has not seen yet (the
 * newly sampled ones, or the prompt when a sequence first drafts: caught up in pieces within
 * the draft engine's batch when long, drafting only once it is complete), the others one
 * drafted token per sequence still drafting. Greedy drafts are a deterministic function of
 * the context, so the acceptance rule is the one-hot case of speculative sampling (spec.h)
 * and the scheduler's sample-and-compare keeps the target's distribution exactly.
 *
 * The draft KV follows accept/reject by the caller's n_done alone: after verification the
 * caller lowers it to the positions whose tokens are final (the rejected drafts' rows lie
 * beyond it and are overwritten by the next round). Its blocks are never keyed (nothing of a
 * draft reaches the prefix cache or the block store).
 *
 * MTP (DeepSeek-V3's multi-token prediction, on an engine over model_mtp_view): the same
 * rounds, where draft entry p is the token t_p with the model's hidden state of position p - 1
 * (the state that predicted t_p) after the model's output norm, and predicts t_{p+1}. The
 * caller passes the model's hidden states of the step it just ran (engine_hidden, before the
 * norm: specdraft applies it); entries whose state is not among them (the first position, a
 * prefix taken from the cache, a backlog caught up in pieces, rows the scheduler skipped while
 * the request did not draft with the layer) take a zero state (hnorm of zero
 * is zero: the entry sees its token alone). Drafted entries continue the MTP layer's own hidden
 * state of the entry before (after its head norm) and are never final: n_done stays at the
 * last entry computed from the model's states, so they are recomputed once those exist.
 * DeepSeek V4's block (a view of its MTP-only file, engine_dsv4_mtp.h) takes both states as
 * they are, hc * dim wide: llama.cpp's deepseek4 graphs hand over the residual streams before
 * the head's collapse and norm, the model's and the block's own.
 *
 * Engine thread only, like the engine it drives; nothing allocates after specdraft_new.
 */
#ifndef TM_SPECDRAFT_H
#define TM_SPECDRAFT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/spec.h"

typedef struct {
    kvpool_seq *seq;            /* the sequence's KV in the draft engine's pool */
    const int32_t *tokens;      /* (n_tokens) its tokens so far: the draft continues them */
    int n_tokens;
    int n_done;                 /* in/out: positions of tokens whose draft KV is in seq */
    int k_max;                  /* tokens to draft, 1..SPEC_MAX_K (0: catch up only) */
    int32_t draft[SPEC_MAX_K];  /* out: the drafted tokens */
    float prob[SPEC_MAX_K];     /* out: the draft's probability of each */
    int n_draft;                /* out: drafted (0: still catching up, or no KV room) */
    const float *hid;           /* (n_hid, dim) MTP: the model's hidden states of positions
                                 * hid_pos.. (engine_hidden rows), or NULL */
    int hid_pos, n_hid;
} specdraft_seq;

typedef struct specdraft specdraft;
struct engine_dflash;

/* A drafter for at most max_seqs sequences a round on engine d (which it does not own). */
specdraft *specdraft_new(engine *d, int max_seqs);
void specdraft_free(specdraft *sd);
/* Whether sd drafts with an MTP layer (its engine is over model_mtp_view): its sequences need
 * the model's hidden states (specdraft_seq.hid) and catch up on every step's positions. */
bool specdraft_is_mtp(const specdraft *sd);
/* A drafter over a DFlash / DSpark drafter (engine_dflash.h; not owned) beside target engine t,
 * which must keep the drafter's layer inputs (engine_capture_layers). Its sequences follow the
 * target like an MTP layer's: every round injects the positions n_done .. n_tokens - 2 from
 * specdraft_seq.hid (the target's layer inputs of its rows in the step just run, from
 * hid_pos; zeros for a position not among them, as a prefix from the cache), then one pass
 * drafts a block for every sequence with k_max > 0 (k_max slots each, the block as long as the
 * longest). A draft's prob is the confidence head's value with conf (DSpark), else its
 * softmax probability; p_min > 0 cuts a draft before its first token below p_min. */
specdraft *specdraft_new_dflash(struct engine_dflash *ed, int max_seqs, bool conf, float p_min);
/* Whether sd follows every step of the target (an MTP layer, a dflash drafter): its sequences
 * catch up on every step's rows, drafting or not. */
bool specdraft_follows(const specdraft *sd);
/* The pool sd's sequences live in. */
kvpool *specdraft_kvpool(const specdraft *sd);
/* What sd reads of target engine t's last step for the row `first` on: the hidden states (MTP),
 * the layer inputs (dflash), NULL for a draft model. */
const float *specdraft_step_rows(const specdraft *sd, const engine *t, int first);
/* Drafts for seqs[0..n) (n <= max_seqs). A sequence whose KV cannot be reserved in the draft
 * pool drafts nothing (its n_done unchanged); a failed engine step drafts nothing for any.
 * Returns the draft engine steps run. */
int specdraft_run(specdraft *sd, specdraft_seq *seqs, int n);

#endif
