/*
 * cmd_eval_dflash: `tokenmill eval -m TARGET --draft DRAFTER --input IN.json` for the DFlash
 * oracle test: the drafting rounds tests/oracle/dflash_llama.cpp runs on llama.cpp, on
 * tokenmill's target engine and engine_dflash, printing the same JSON lines.
 *
 * IN.json: {"seqs": [[id, ...], ...], "n_draft": K, "rounds": R, "mode": "dspark"|"dflash"}
 * Each sequence's prompt goes through the target (one step for all of them) with the inputs of
 * the drafter's target layers kept, which are injected; then every round drafts a block for
 * every sequence in one pass after the target's greedy next token (anchor-first, K slots, for
 * dspark with a sample_from_anchor drafter; [last, mask x K] otherwise), accepts the target's
 * greedy token and the drafts it agrees with (one target step per token, each injected), as
 * the oracle does. stdout, per round and sequence:
 *   {"seq": i, "round": r, "pos": n, "anchor": t, "slots": [{"token", "logprob", "conf"}...]}
 * conf is -1 without a confidence head (or in dflash mode).
 *
 * With a DeepSeek V4 MTP-only file as the drafter (model_dsv4.h; "mode": "mtp"), the rounds of
 * tests/oracle/dsv4_mtp_llama.cpp, drafted by specdraft as the server drafts: every round
 * catches the MTP block up on the positions the target made final (entry p: token p with the
 * target's streams of p - 1, zeros for p = 0) and drafts K (at most SPEC_MAX_K) tokens by
 * chaining the block from the anchor; the target verifies the anchor and the drafts in one step
 * and accepts the drafts its greedy choices confirm (what llama.cpp's one-token steps give, a
 * position's logits not depending on the batch); conf is -1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cmd.h"
#include "cli/cmd_eval_dflash.h"
#include "engine/engine.h"
#include "engine/engine_dflash.h"
#include "engine/specdraft.h"
#include "model/model.h"
#include "model/model_dflash.h"
#include "model/model_dsv4.h"
#include "util/util.h"

#define CMD_EVAL_DFLASH_CTX 1024   /* positions a sequence may reach (as the oracle's n_ctx) */

typedef struct {
    int32_t toks[CMD_EVAL_DFLASH_CTX];
    int n;                   /* tokens final (their target KV and drafter KV written) */
    int32_t last;            /* the target's greedy token after them */
    kvpool_seq *tseq, *dseq;
} cmd_evd_seq;

typedef struct {
    engine *e;
    engine_dflash *ed;
    const model_dflash *df;
    int V, F;                /* vocabulary; floats of one position's target features */
    float *logits;           /* (CMD_EVAL_DFLASH_CTX, V) */
    engine_tok *bt;          /* (CMD_EVAL_DFLASH_CTX) */
    engine_dflash_inj *inj;  /* (CMD_EVAL_DFLASH_CTX) */
} cmd_evd;

static int32_t cmd_evd_argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* Sequence i of the input's "seqs" into toks: returns its length, or -1 (said on stderr) when
 * it is not an array of 1..CMD_EVAL_DFLASH_CTX / 2 ids below V. */
static int cmd_evd_read_ids(json_t *jseqs, int i, int V, int32_t *toks)
{
    json_t *a = json_array_get(jseqs, (size_t)i);
    int n = json_is_array(a) ? (int)json_array_size(a) : 0;
    if (n < 1 || n > CMD_EVAL_DFLASH_CTX / 2) {
        fprintf(stderr, "tokenmill eval: sequence %d: 1..%d ids\n", i, CMD_EVAL_DFLASH_CTX / 2);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        json_int_t id = json_integer_value(json_array_get(a, (size_t)k));
        if (id < 0 || id >= V) {
            fprintf(stderr, "tokenmill eval: sequence %d token %d is not an id below %d\n", i, k, V);
            return -1;
        }
        toks[k] = (int32_t)id;
    }
    return n;
}

/* Target step over s->toks[s->n .. s->n + k), injecting those positions; s->n += k and
 * s->last = the greedy token after them. */
static bool cmd_evd_feed(cmd_evd *c, cmd_evd_seq *s, int k)
{
    for (int i = 0; i < k; i++)
        c->bt[i] = (engine_tok){ .token = s->toks[s->n + i], .pos = s->n + i, .seq = s->tseq, .want_logits = i == k - 1 };
    engine_batch b = { .n_tokens = k, .toks = c->bt };
    if (engine_step(c->e, &b, c->logits) != ENGINE_OK) return false;
    const float *feat = engine_layer_inputs(c->e);
    for (int i = 0; i < k; i++)
        c->inj[i] = (engine_dflash_inj){ .seq = s->dseq, .pos = s->n + i, .feat = feat + (size_t)i * c->F };
    if (engine_dflash_inject(c->ed, k, c->inj) != ENGINE_OK) return false;
    s->n += k;
    s->last = cmd_evd_argmax(c->logits, c->V);
    return true;
}

/* The MTP rounds (the file comment), through specdraft as the server drafts: one sequence at a
 * time, target engine e, the MTP block's engine me. */
static int cmd_eval_mtp(model *m, model *d, json_t *jseqs, int K, int R, int threads, int kv_type)
{
    char err[512];
    const int ns = (int)json_array_size(jseqs), V = m->hp.n_vocab;
    if (K > SPEC_MAX_K) {
        fprintf(stderr, "tokenmill eval: mode mtp drafts at most %d tokens a round\n", SPEC_MAX_K);
        return 1;
    }
    model view;
    model_mtp_view(d, 0, &view);
    engine *e = NULL, *me = NULL;
    specdraft *sd = NULL;
    int rc = 1;
    engine_opts eo = { .n_threads = threads, .n_kv_blocks = CMD_EVAL_DFLASH_CTX / KVPOOL_BLOCK + 1,
                       .max_batch_tokens = CMD_EVAL_DFLASH_CTX, .kv_type = (engine_kv_type)kv_type };
    cmd_evd_seq *s = xcalloc(1, sizeof *s);
    float *logits = xmalloc((size_t)(SPEC_MAX_K + 1) * (size_t)V * sizeof(float));
    engine_tok *bt = xmalloc(CMD_EVAL_DFLASH_CTX * sizeof *bt);
    if (engine_new(m, &eo, &e, err, sizeof err) != ENGINE_OK || engine_new(&view, &eo, &me, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill eval: %s\n", err);
        goto out;
    }
    if (!(sd = specdraft_new(me, 1))) {
        fprintf(stderr, "tokenmill eval: out of memory for the MTP drafter\n");
        goto out;
    }
    for (int i = 0; i < ns; i++) {
        memset(s, 0, sizeof *s);
        const int n = cmd_evd_read_ids(jseqs, i, V, s->toks);
        if (n < 0) goto out;
        s->tseq = kvpool_seq_new(engine_kvpool(e));
        s->dseq = kvpool_seq_new(engine_kvpool(me));
        for (int k = 0; k < n; k++)
            bt[k] = (engine_tok){ .token = s->toks[k], .pos = k, .seq = s->tseq, .want_logits = k == n - 1 };
        engine_batch b = { .n_tokens = n, .toks = bt };
        if (engine_step(e, &b, logits) != ENGINE_OK) goto fail;
        s->n = n;
        s->last = cmd_evd_argmax(logits, V);
        specdraft_seq q = { .seq = s->dseq, .tokens = s->toks, .hid_pos = 0, .n_hid = n };
        for (int r = 0; r < R && s->n + K + 1 < CMD_EVAL_DFLASH_CTX; r++) {
            /* the drafts after the anchor, from the states of the target's last step */
            s->toks[s->n] = s->last;
            q.n_tokens = s->n + 1, q.k_max = K, q.hid = engine_hidden(e);
            specdraft_run(sd, &q, 1);
            if (q.n_draft != K) goto fail;
            printf("{\"seq\":%d,\"round\":%d,\"pos\":%d,\"anchor\":%d,\"slots\":[", i, r, s->n, s->last);
            for (int j = 0; j < K; j++)
                printf("%s{\"token\":%d,\"logprob\":%.6f,\"conf\":-1}", j ? "," : "", q.draft[j], log((double)q.prob[j]));
            printf("]}\n");
            /* verification as the server's: the anchor and the drafts in one target step, the
             * drafts its greedy choices confirm accepted */
            for (int j = 0; j <= K; j++)
                bt[j] = (engine_tok){ .token = j ? q.draft[j - 1] : s->last, .pos = s->n + j, .seq = s->tseq,
                                      .want_logits = true };
            b.n_tokens = K + 1;
            if (engine_step(e, &b, logits) != ENGINE_OK) goto fail;
            int acc = 0;
            while (acc < K && cmd_evd_argmax(logits + (size_t)acc * V, V) == q.draft[acc]) {
                s->toks[s->n + 1 + acc] = q.draft[acc];
                acc++;
            }
            q.hid_pos = s->n, q.n_hid = K + 1;
            s->last = cmd_evd_argmax(logits + (size_t)acc * V, V);
            s->n += 1 + acc;
        }
        kvpool_seq_free(engine_kvpool(e), s->tseq);
        kvpool_seq_free(engine_kvpool(me), s->dseq);
        s->tseq = s->dseq = NULL;
    }
    fflush(stdout);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "tokenmill eval: a target step or an MTP round failed\n");
out:
    if (s->tseq) kvpool_seq_free(engine_kvpool(e), s->tseq);
    if (s->dseq) kvpool_seq_free(engine_kvpool(me), s->dseq);
    free(s), free(logits), free(bt);
    specdraft_free(sd);
    engine_free(me);
    engine_free(e);
    return rc;
}

int cmd_eval_dflash(model *m, const char *draft_path, json_t *root, int threads, int kv_type)
{
    char err[512];
    json_t *jseqs = json_object_get(root, "seqs");
    int K = (int)json_integer_value(json_object_get(root, "n_draft"));
    int R = (int)json_integer_value(json_object_get(root, "rounds"));
    const char *mode = json_string_value(json_object_get(root, "mode"));
    int ns = json_is_array(jseqs) ? (int)json_array_size(jseqs) : 0;
    if (ns < 1 || ns > 64 || K < 1 || K >= ENGINE_DFLASH_MAX_BLOCK || R < 0 || !mode ||
        (strcmp(mode, "dspark") && strcmp(mode, "dflash") && strcmp(mode, "mtp"))) {
        fprintf(stderr, "tokenmill eval: --draft needs {\"seqs\": [[ids]...] (1..64), \"n_draft\": K (1..%d), "
                "\"rounds\": R, \"mode\": \"dspark\"|\"dflash\"|\"mtp\"}\n", ENGINE_DFLASH_MAX_BLOCK - 1);
        return 1;
    }
    model *d = NULL;
    if (model_load(draft_path, NULL, &d, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tokenmill eval: cannot load %s: %s\n", draft_path, err);
        return 1;
    }
    if (!strcmp(mode, "mtp") || (d->dsv4 && d->dsv4->mtp_only)) {
        int mrc = 1;
        if (!strcmp(mode, "mtp") && d->dsv4 && d->dsv4->mtp_only && m->dsv4 && !m->dsv4->mtp_only &&
            m->dsv4->hc == d->dsv4->hc && m->hp.dim == d->hp.dim && m->hp.n_vocab == d->hp.n_vocab)
            mrc = cmd_eval_mtp(m, d, jseqs, K, R, threads, kv_type);
        else
            fprintf(stderr, "tokenmill eval: mode mtp takes a deepseek4 model and its MTP-only file (same width, "
                    "streams and vocabulary)\n");
        model_free(d);
        return mrc;
    }
    if (!model_dflash_match(m, d, err, sizeof err)) {
        fprintf(stderr, "tokenmill eval: --draft %s does not fit the model: %s\n", draft_path, err);
        model_free(d);
        return 1;
    }
    const model_dflash *df = d->dflash;
    int rc = 1;
    cmd_evd c = { .df = df, .V = m->hp.n_vocab, .F = df->n_tl * m->hp.dim };
    cmd_evd_seq *seqs = xcalloc((size_t)ns, sizeof *seqs);
    engine_dflash_block *blocks = xcalloc((size_t)ns, sizeof *blocks);
    engine_opts eo = { .n_threads = threads, .n_kv_blocks = ns * (CMD_EVAL_DFLASH_CTX / KVPOOL_BLOCK + 1),
                       .max_batch_tokens = CMD_EVAL_DFLASH_CTX, .kv_type = (engine_kv_type)kv_type };
    engine_dflash_opts dopt = { .max_seqs = ns, .max_tokens = 512, .n_ctx = CMD_EVAL_DFLASH_CTX, .n_threads = threads };
    if (engine_new(m, &eo, &c.e, err, sizeof err) != ENGINE_OK ||
        !(c.ed = engine_dflash_new(d, m, &dopt, err, sizeof err))) {
        fprintf(stderr, "tokenmill eval: %s\n", err);
        goto out;
    }
    if (!engine_capture_layers(c.e, df->tl, df->n_tl)) {
        fprintf(stderr, "tokenmill eval: cannot keep the target's layer inputs\n");
        goto out;
    }
    c.logits = xmalloc((size_t)CMD_EVAL_DFLASH_CTX * (size_t)c.V * sizeof(float));
    c.bt = xmalloc(CMD_EVAL_DFLASH_CTX * sizeof *c.bt);
    c.inj = xmalloc(CMD_EVAL_DFLASH_CTX * sizeof *c.inj);
    for (int i = 0; i < ns; i++) {
        const int n = cmd_evd_read_ids(jseqs, i, c.V, seqs[i].toks);
        if (n < 0) goto out;
        seqs[i].tseq = kvpool_seq_new(engine_kvpool(c.e));
        seqs[i].dseq = kvpool_seq_new(engine_dflash_kvpool(c.ed));
        if (!cmd_evd_feed(&c, &seqs[i], n)) goto fail;
    }
    const bool anchor_first = !strcmp(mode, "dspark") && df->markov_rank > 0 && df->sample_from_anchor;
    const int B = anchor_first ? K : K + 1, i0 = anchor_first ? 0 : 1;
    const bool show_conf = !strcmp(mode, "dspark");
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < ns; i++)
            blocks[i] = (engine_dflash_block){ .seq = seqs[i].dseq, .pos = seqs[i].n, .anchor = seqs[i].last,
                                               .n_slots = B };
        if (engine_dflash_draft(c.ed, ns, blocks) != ENGINE_OK) goto fail;
        for (int i = 0; i < ns; i++) {
            cmd_evd_seq *s = &seqs[i];
            const engine_dflash_block *bk = &blocks[i];
            printf("{\"seq\":%d,\"round\":%d,\"pos\":%d,\"anchor\":%d,\"slots\":[", i, r, s->n, s->last);
            for (int j = i0; j < B; j++)
                printf("%s{\"token\":%d,\"logprob\":%.6f,\"conf\":%.6f}", j > i0 ? "," : "", bk->token[j],
                       (double)bk->logprob[j], show_conf ? (double)bk->conf[j] : -1.0);
            printf("]}\n");
            /* verification: the anchor is final, then each draft the target's greedy choice confirms */
            if (s->n + 1 + (B - i0) >= CMD_EVAL_DFLASH_CTX - ENGINE_DFLASH_MAX_BLOCK) continue;
            s->toks[s->n] = s->last;
            if (!cmd_evd_feed(&c, s, 1)) goto fail;
            for (int j = i0; j < B && bk->token[j] == s->last; j++) {
                s->toks[s->n] = s->last;
                if (!cmd_evd_feed(&c, s, 1)) goto fail;
            }
        }
    }
    fflush(stdout);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "tokenmill eval: a target step, injection or draft pass failed\n");
out:
    for (int i = 0; i < ns; i++) {
        if (seqs[i].tseq) kvpool_seq_free(engine_kvpool(c.e), seqs[i].tseq);
        if (seqs[i].dseq) kvpool_seq_free(engine_dflash_kvpool(c.ed), seqs[i].dseq);
    }
    free(seqs), free(blocks), free(c.logits), free(c.bt), free(c.inj);
    engine_dflash_free(c.ed);
    engine_free(c.e);
    model_free(d);
    return rc;
}
