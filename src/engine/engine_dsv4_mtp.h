/*
 * engine_dsv4_mtp: DeepSeek V4's MTP block as a drafter (llama.cpp's deepseek4 graph_mtp), for
 * engine.c: engine_new makes one for the view of an MTP-only file's block (model_dsv4.h,
 * model_mtp_view), and engine_forward hands it the batch and the target's states.
 *
 * An entry is the token t_p at position p with the target's residual streams of position
 * p - 1 (hc, dim), flattened to hc * dim (engine_hidden of the target: the streams after its
 * last layer, before the head's collapse). Its input streams are, per stream h,
 * eh_proj([enorm(embedding of t_p); hnorm(state[h])]); then the block itself is one V4 layer
 * run by engine_dsv4 (raw-window attention only, hyper-connections, the biased MoE), the
 * block's own output_hc collapse, the shared head norm and the head. The block's KV (one raw
 * K=V row per position) lives in the view engine's pool, per sequence, and follows the
 * target's accept/reject through specdraft's n_done. Nothing allocates after _new.
 */
#ifndef TM_ENGINE_DSV4_MTP_H
#define TM_ENGINE_DSV4_MTP_H

#include <stddef.h>

#include "engine/engine.h"
#include "engine/engine_dsv4.h"
#include "model/model.h"
#include "util/threadpool.h"

typedef struct engine_dsv4_mtp engine_dsv4_mtp;

/* Input buffers for batches of up to max_tokens entries of view m (an MTP-only file's block:
 * m->mtp_view, m->dsv4), stepping through d (made on m; not owned). NULL and err when out of
 * memory. */
engine_dsv4_mtp *engine_dsv4_mtp_new(const model *m, engine_dsv4 *d, threadpool *tp, int max_tokens, char *err,
                                     size_t errsz);
void engine_dsv4_mtp_free(engine_dsv4_mtp *p);

/* One step over n entries (engine_tok, reserved in d's pool by the caller) whose target states
 * are hidden (n, hc * dim): logits (n_out, n_vocab) for the entries that want them, collapsed
 * (n, dim) the block's streams collapsed by its head mix before the norm; the block's own
 * streams (what a further draft step continues) are engine_dsv4_streams(d). false as
 * engine_dsv4_step's (nothing computed). */
bool engine_dsv4_mtp_step(engine_dsv4_mtp *p, int n, const engine_tok *toks, const float *hidden, float *logits,
                          float *collapsed);

#endif
