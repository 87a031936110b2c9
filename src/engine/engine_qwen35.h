/*
 * engine_qwen35: Qwen3.5's layer arithmetic for engine.c: the gated delta net ("linear
 * attention") layers with their recurrent state per sequence, the full-attention layers'
 * output gate, the MoE layers' shared-expert gate.
 *
 * A sequence's state (kvpool_seq_state, engine_qwen35_state_bytes) is its position count and,
 * per linear layer, the conv state (the last ssm_conv - 1 inputs of each channel) and the
 * delta rule's matrix per v head; it holds exactly the positions computed so far, so a step
 * must continue each sequence where its state ends (or restart it at position 0), its entries
 * at consecutive positions in batch order (engine_qwen35_plan checks, ENGINE_ERR_ARG else).
 * Work items are (sequence, v head): each walks its sequence's tokens of the step in order on
 * one thread, so a token's numbers do not depend on the batch or the thread count.
 */
#ifndef TM_ENGINE_QWEN35_H
#define TM_ENGINE_QWEN35_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"
#include "util/threadpool.h"

typedef struct engine_qwen35 engine_qwen35;

/* Bytes of one sequence's state (0 for a model without linear-attention layers). */
size_t engine_qwen35_state_bytes(const model *m);
/* Matmul scratch the layers need for T tokens. */
size_t engine_qwen35_scratch_bytes(const model *m, int T);
/* Buffers for max_tokens tokens and n_threads threads; NULL when out of memory. */
engine_qwen35 *engine_qwen35_new(const model *m, int max_tokens, int n_threads);
void engine_qwen35_free(engine_qwen35 *q);

/* Before a step: groups the batch by sequence and checks each continues its state (an entry
 * at position 0 restarts it). false: a bad batch, nothing changed. */
bool engine_qwen35_plan(engine_qwen35 *q, kvpool *kv, const engine_batch *b);
/* After the step: each sequence's state holds its positions up to its last entry. */
void engine_qwen35_commit(engine_qwen35 *q);
/* The states the last step captured: for each entry at a position end - 1 with end a multiple
 * of 128, the sequence's whole state (engine_qwen35_state_bytes, its header saying end) as it
 * was right after that entry, whatever else the step computed after it. Restored into a
 * sequence that attached the blocks up to end, it continues exactly as one that computed
 * every position. Valid until the next step. */
int engine_qwen35_states(const engine_qwen35 *q, const engine_window_state **out);

/* Linear-attention layer il: xn (T, dim) in, its output (T, dim) in xn. */
void engine_qwen35_linear(engine_qwen35 *q, threadpool *tp, int il, float *xn, void *mm_scratch);

/* Full-attention layers: the query projection's output (T, n_heads * 2 * head_dim) goes to
 * engine_qwen35_qg; split moves the queries into q (T, n_heads * head_dim) and keeps the gates;
 * gate multiplies the attention output att (T, n_heads * head_dim) by their sigmoid. */
float *engine_qwen35_qg(engine_qwen35 *q);
void engine_qwen35_split(engine_qwen35 *q, int T, float *qout);
void engine_qwen35_gate(engine_qwen35 *q, int T, float *att);

/* qwen35moe: sigmoid(dot(xn[t], gate_inp_shexp)) for every t, before the experts overwrite xn;
 * engine_qwen35_shgate gives them (T) to scale the shared expert's output. */
void engine_qwen35_shgate_compute(engine_qwen35 *q, int il, const float *xn, int T);
const float *engine_qwen35_shgate(const engine_qwen35 *q);

#endif
