/*
 * windowtest: what the unit tests of sliding-window KV on a real model (test_window,
 * test_dsv4layout) share: computing a sequence's positions in steps as the server does (the
 * full blocks committed after each step, the window states the step captured kept by block
 * end), finding the first position where two runs' logits differ, and the step rules every
 * windowed layout keeps (windowtest_check_steps). Include after harness.h: it CHECKs.
 */
#ifndef TM_WINDOWTEST_H
#define TM_WINDOWTEST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "engine/engine.h"
#include "util/util.h"

/* Computes positions [from, n_pos) of s in steps of `chunk` tokens, the logits of every
 * position into out (n_pos, n_vocab) at its position; after each step the full blocks are
 * committed and the window state captured at each block end (j + 1) * KVPOOL_BLOCK the step
 * crossed copied into states[j] (kvpool_window_state_bytes each), for j < n_states where states[j] is set (states
 * may be NULL). */
static inline bool windowtest_run(engine *e, kvpool_seq *s, const int32_t *toks, int from, int n_pos, int chunk,
                                  int n_vocab, float *out, uint8_t *const *states, int n_states)
{
    kvpool *kv = engine_kvpool(e);
    engine_tok *bt = xmalloc((size_t)chunk * sizeof *bt);
    bool ok = true;
    for (int p = from; p < n_pos && ok;) {
        int n = TM_MIN(chunk, n_pos - p);
        for (int k = 0; k < n; k++) bt[k] = (engine_tok){ toks[p + k], p + k, s, true };
        engine_batch b = { n, bt };
        if (engine_step(e, &b, out + (size_t)p * n_vocab) != ENGINE_OK) {
            ok = false;
            break;
        }
        p += n;
        kvpool_seq_commit_full_blocks(kv, s, toks, p);
        const engine_window_state *ws;
        int ns = engine_window_states(e, &ws);
        for (int i = 0; i < ns && states; i++) {
            int j = ws[i].end / KVPOOL_BLOCK - 1;
            if (ws[i].seq == s && j >= 0 && j < n_states && states[j])
                memcpy(states[j], ws[i].state, kvpool_window_state_bytes(kv));
        }
    }
    free(bt);
    return ok;
}

/* The first position in [from, n_pos) whose logits (rows of n_vocab) differ in a bit between
 * a and b, or -1. */
static inline int windowtest_first_diff(const float *a, const float *b, int from, int n_pos, int n_vocab)
{
    for (int p = from; p < n_pos; p++)
        if (memcmp(a + (size_t)p * n_vocab, b + (size_t)p * n_vocab, (size_t)n_vocab * sizeof(float))) return p;
    return -1;
}

/* The step rules of a windowed layout, on a sequence a whose positions [0, n_pos) were computed
 * into ref (n_pos, n_vocab), its ring at n_pos: another sequence a step holds in two runs
 * (a third sequence's token between them) reads its first run's rows from the step and computes
 * as alone; a gap in its positions is refused (its ring holds what precedes the step); going
 * back 6 positions (a rejected draft) recomputes exactly, further back is refused. got: at
 * least n_vocab floats of scratch. */
static inline void windowtest_check_steps(engine *e, kvpool_seq *a, const int32_t *toks, int n_pos, int n_vocab,
                                          const float *ref, float *got)
{
    kvpool *kv = engine_kvpool(e);
    kvpool_seq *x = kvpool_seq_new(kv), *y = kvpool_seq_new(kv);
    engine_tok *split = xmalloc(100 * sizeof *split);
    float *lsplit = xmalloc((size_t)100 * (size_t)n_vocab * sizeof(float));
    int ns = 0;
    for (int p = 0; p < 50; p++) split[ns++] = (engine_tok){ toks[p], p, x, true };
    split[ns++] = (engine_tok){ toks[0], 0, y, true };
    for (int p = 50; p < 99; p++) split[ns++] = (engine_tok){ toks[p], p, x, true };
    engine_batch sb = { ns, split };
    CHECK(engine_step(e, &sb, lsplit) == ENGINE_OK);
    bool same = true;
    for (int k = 0; k < ns; k++)
        if (split[k].seq == x)
            same &= !memcmp(lsplit + (size_t)k * n_vocab, ref + (size_t)split[k].pos * n_vocab,
                            (size_t)n_vocab * sizeof(float));
    CHECKF(same, "a sequence split in two runs of one step differs from computing it alone");
    kvpool_seq_reset(kv, x);
    engine_tok gap[2] = { { toks[0], 0, x, false }, { toks[5], 5, x, false } };
    engine_batch tb = { 2, gap };
    CHECK(engine_step(e, &tb, NULL) == ENGINE_ERR_ARG);
    kvpool_seq_free(kv, x);
    kvpool_seq_free(kv, y);
    free(split);
    free(lsplit);

    engine_tok back = { toks[n_pos - 6], n_pos - 6, a, true };
    engine_batch bb = { 1, &back };
    CHECK(engine_step(e, &bb, got) == ENGINE_OK &&
          !memcmp(got, ref + (size_t)(n_pos - 6) * n_vocab, (size_t)n_vocab * sizeof(float)));
    back = (engine_tok){ toks[10], 10, a, true };
    CHECK(engine_step(e, &bb, got) == ENGINE_ERR_ARG);
}

#endif
