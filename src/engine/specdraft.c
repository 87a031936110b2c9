/*
 * specdraft: greedy drafting with a draft model's engine. See specdraft.h for the design.
 */
#include "engine/specdraft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_dflash.h"
#include "engine/sample.h"
#include "model/ops.h"
#include "util/util.h"

struct specdraft {
    engine *e;                  /* the draft model's engine (not owned) */
    kvpool *pool;               /* its KV pool */
    int n_vocab;
    int max_seqs;
    int max_batch;              /* tokens per draft step */
    engine_tok *batch;          /* (max_batch) */
    int *row;                   /* (max_seqs) logits row of each sequence in the step, or -1 */
    int *adv;                   /* (max_seqs) positions the catch-up step computes for each */
    float *logits;              /* (max_seqs, n_vocab) */
    sampler *greedy;            /* temperature 0, no penalties: the argmax as requests take it */
    bool mtp;                   /* the engine is an MTP view's: steps take hidden states */
    int dim;                    /* hidden state width (engine_hidden_dim: V4's hc * dim) */
    bool raw;                   /* MTP: states taken as they are, not normed (V4: llama.cpp's
                                 * deepseek4 graphs hand over the streams before the head's
                                 * collapse and norm, the target's and the block's own) */
    float *hin;                 /* (max_batch, dim) MTP: the hidden state of each step entry */
    int *last;                  /* (max_seqs) MTP: batch entry of each sequence's logits row */
    engine_dflash *ed;          /* a dflash drafter (e NULL), or NULL */
    bool conf;                  /* dflash: the confidence head's values are the drafts' prob */
    float p_min;                /* dflash: a draft ends before its first prob below it; 0: none */
    int feat;                   /* dflash: floats of one position's target features */
    engine_dflash_inj *inj;     /* (max_batch) dflash: one round's injections */
    engine_dflash_block *blk;   /* (max_seqs) dflash: one round's blocks */
    int *bseq;                  /* (max_seqs) dflash: the sequence of each block */
    float *zeros;               /* (feat) dflash: the features of a position the target did not
                                 * compute here */
};

specdraft *specdraft_new(engine *d, int max_seqs)
{
    if (!d || max_seqs < 1) return NULL;
    specdraft *sd = xcalloc(1, sizeof *sd);
    sd->e = d;
    sd->pool = engine_kvpool(d);
    sd->n_vocab = engine_model(d)->hp.n_vocab;
    sd->max_seqs = max_seqs;
    sd->max_batch = engine_max_batch(d);
    sd->batch = xcalloc((size_t)sd->max_batch, sizeof *sd->batch);
    sd->row = xcalloc((size_t)max_seqs, sizeof *sd->row);
    sd->adv = xcalloc((size_t)max_seqs, sizeof *sd->adv);
    sd->logits = malloc((size_t)max_seqs * (size_t)sd->n_vocab * sizeof(float));
    sample_params gp = sample_params_default();
    gp.temp = 0;
    gp.penalty_last_n = 0;
    sd->greedy = sample_new(sd->n_vocab, &gp);
    sd->mtp = engine_model(d)->mtp_view;
    sd->dim = engine_hidden_dim(d);
    sd->raw = engine_model(d)->dsv4 != NULL;
    if (sd->mtp) {
        sd->hin = malloc((size_t)sd->max_batch * (size_t)sd->dim * sizeof(float));
        sd->last = xcalloc((size_t)max_seqs, sizeof *sd->last);
    }
    if (!sd->logits || !sd->greedy || (sd->mtp && !sd->hin)) {
        specdraft_free(sd);
        return NULL;
    }
    return sd;
}

specdraft *specdraft_new_dflash(engine_dflash *ed, int max_seqs, bool conf, float p_min)
{
    if (!ed || max_seqs < 1) return NULL;
    specdraft *sd = xcalloc(1, sizeof *sd);
    const model_dflash *df = engine_dflash_model(ed);
    sd->ed = ed;
    sd->pool = engine_dflash_kvpool(ed);
    sd->max_seqs = max_seqs;
    sd->max_batch = 512;
    sd->conf = conf && df->has_conf;
    sd->p_min = p_min;
    sd->feat = engine_dflash_features(ed);
    sd->inj = xcalloc((size_t)sd->max_batch, sizeof *sd->inj);
    sd->blk = xcalloc((size_t)max_seqs, sizeof *sd->blk);
    sd->bseq = xcalloc((size_t)max_seqs, sizeof *sd->bseq);
    sd->zeros = xcalloc((size_t)sd->feat, sizeof *sd->zeros);
    return sd;
}

bool specdraft_follows(const specdraft *sd) { return sd->mtp || sd->ed; }
kvpool *specdraft_kvpool(const specdraft *sd) { return sd->pool; }

const float *specdraft_step_rows(const specdraft *sd, const engine *t, int first)
{
    if (sd->mtp) return engine_hidden(t) + (size_t)first * engine_hidden_dim(t);
    if (sd->ed) return engine_layer_inputs(t) + (size_t)first * sd->feat;
    return NULL;
}

/* A dflash drafter's round (specdraft_new_dflash): injections, then one block pass. */
static int specdraft_run_dflash(specdraft *sd, specdraft_seq *seqs, int n)
{
    const model_dflash *df = engine_dflash_model(sd->ed);
    int ni = 0, nb = 0, kmax = 0;
    for (int i = 0; i < n; i++) {
        specdraft_seq *q = &seqs[i];
        q->n_draft = 0;
        for (int p = q->n_done; p < q->n_tokens - 1; p++) {
            int r = p - q->hid_pos;
            sd->inj[ni++] = (engine_dflash_inj){ .seq = q->seq, .pos = p,
                .feat = q->hid && r >= 0 && r < q->n_hid ? q->hid + (size_t)r * sd->feat : sd->zeros };
            if (ni == sd->max_batch) {
                if (engine_dflash_inject(sd->ed, ni, sd->inj) != ENGINE_OK) goto fail;
                ni = 0;
            }
        }
        if (q->n_tokens - 1 > q->n_done) q->n_done = q->n_tokens - 1;
        if (q->k_max > 0 && q->n_done == q->n_tokens - 1) {
            sd->bseq[nb++] = i;
            kmax = TM_MAX(kmax, TM_MIN(q->k_max, SPEC_MAX_K));
        }
    }
    if (ni > 0 && engine_dflash_inject(sd->ed, ni, sd->inj) != ENGINE_OK) goto fail;
    if (nb == 0) return ni > 0;
    /* anchor-first (DSpark's layout) reads slots 0..K-1, else [last, mask x K] slots 1..K */
    const bool anchor_first = df->markov_rank > 0 && df->sample_from_anchor;
    const int B = TM_MIN(anchor_first ? kmax : kmax + 1, ENGINE_DFLASH_MAX_BLOCK), i0 = anchor_first ? 0 : 1;
    for (int b = 0; b < nb; b++) {
        const specdraft_seq *q = &seqs[sd->bseq[b]];
        sd->blk[b] = (engine_dflash_block){ .seq = q->seq, .pos = q->n_done, .anchor = q->tokens[q->n_tokens - 1],
                                            .n_slots = B };
    }
    if (engine_dflash_draft(sd->ed, nb, sd->blk) != ENGINE_OK) return 1;
    for (int b = 0; b < nb; b++) {
        specdraft_seq *q = &seqs[sd->bseq[b]];
        const engine_dflash_block *bk = &sd->blk[b];
        int k = 0;
        for (; k < TM_MIN(q->k_max, B - i0); k++) {
            float p = sd->conf && bk->conf[i0 + k] >= 0 ? bk->conf[i0 + k] : expf(bk->logprob[i0 + k]);
            if (sd->p_min > 0 && p < sd->p_min) break;
            q->draft[k] = bk->token[i0 + k];
            q->prob[k] = p;
        }
        q->n_draft = k;
    }
    return 1 + (ni > 0);
fail:   /* no pool room: which positions were written is unknown, so all of them again next time */
    for (int i = 0; i < n; i++) seqs[i].n_done = 0, seqs[i].n_draft = 0;
    return 0;
}

void specdraft_free(specdraft *sd)
{
    if (!sd) return;
    free(sd->inj);
    free(sd->blk);
    free(sd->bseq);
    free(sd->zeros);
    free(sd->batch);
    free(sd->row);
    free(sd->adv);
    free(sd->logits);
    sample_free(sd->greedy);
    free(sd->hin);
    free(sd->last);
    free(sd);
}

bool specdraft_is_mtp(const specdraft *sd) { return sd->mtp; }

/* MTP: into row nt of hin, the model's hidden state of position p - 1 for entry p of q after
 * the model's output norm (the normed state is what the MTP layer was trained on: DeepSeek's
 * and GLM's, as llama.cpp and vLLM feed it), or zeros when the caller did not pass it. */
static void specdraft_mtp_state(specdraft *sd, const specdraft_seq *q, int nt, int p)
{
    const model *v = engine_model(sd->e);
    float *dst = sd->hin + (size_t)nt * sd->dim;
    int i = p - 1 - q->hid_pos;
    const float *src = q->hid && i >= 0 && i < q->n_hid ? q->hid + (size_t)i * sd->dim : NULL;
    if (src && sd->raw) memcpy(dst, src, (size_t)sd->dim * sizeof(float));
    else if (src) ops_rmsnorm(NULL, dst, src, v->trunk_norm, 1, sd->dim, v->hp.rms_eps);
    else memset(dst, 0, (size_t)sd->dim * sizeof(float));
}

/* The greedy token of a logits row and its softmax probability. */
static int32_t specdraft_argmax(specdraft *sd, const float *l, float *prob)
{
    int32_t best = sample_token(sd->greedy, l);
    double sum = 0;
    for (int i = 0; i < sd->n_vocab; i++) sum += exp((double)(l[i] - l[best]));
    *prob = (float)(1.0 / sum);
    return best;
}

int specdraft_run(specdraft *sd, specdraft_seq *seqs, int n)
{
    n = TM_MIN(n, sd->max_seqs);
    if (sd->ed) return specdraft_run_dflash(sd, seqs, n);
    /* step 0: what each sequence's draft KV has not seen, the last token wanting logits */
    int nt = 0, nr = 0;
    for (int i = 0; i < n; i++) {
        specdraft_seq *q = &seqs[i];
        q->n_draft = 0;
        sd->row[i] = -1;
        sd->adv[i] = 0;
        int c = q->n_tokens - q->n_done, room = sd->max_batch - nt;
        if (c <= 0 || room <= 0 || q->k_max < 0) continue;
        int take = TM_MIN(c, room);
        bool full = take == c && q->k_max > 0;
        int need = q->n_done + take + (full ? TM_MIN(q->k_max, SPEC_MAX_K) - 1 : 0);
        if (kvpool_seq_reserve(sd->pool, q->seq, need) != KVPOOL_OK) continue;
        for (int j = 0; j < take; j++) {
            engine_tok *t = &sd->batch[nt++];
            t->token = q->tokens[q->n_done + j];
            t->pos = q->n_done + j;
            t->seq = q->seq;
            t->want_logits = full && j == take - 1;
            if (sd->mtp) specdraft_mtp_state(sd, q, nt - 1, t->pos);
        }
        if (sd->mtp) sd->last[i] = nt - 1;
        sd->adv[i] = take;
        if (full) sd->row[i] = nr++;
    }
    if (nt == 0) return 0;
    engine_batch b = { .n_tokens = nt, .toks = sd->batch };
    const float *hin = sd->mtp ? sd->hin : NULL;
    if (engine_forward(sd->e, &b, hin, sd->logits) != ENGINE_OK) return 1;
    int n_steps = 1;
    for (int i = 0; i < n; i++) {
        specdraft_seq *q = &seqs[i];
        q->n_done += sd->adv[i];
        if (sd->row[i] < 0) continue;
        q->draft[0] = specdraft_argmax(sd, sd->logits + (size_t)sd->row[i] * sd->n_vocab, &q->prob[0]);
        q->n_draft = 1;
    }
    /* steps 1..: each sequence still drafting feeds its last drafted token */
    for (int k = 1; k < SPEC_MAX_K; k++) {
        nt = 0;
        for (int i = 0; i < n; i++) {
            specdraft_seq *q = &seqs[i];
            sd->row[i] = -1;
            if (q->n_draft != k || k >= q->k_max) continue;
            engine_tok *t = &sd->batch[nt];
            t->token = q->draft[k - 1];
            t->pos = q->n_tokens + k - 1;
            t->seq = q->seq;
            t->want_logits = true;
            if (sd->mtp) {   /* the layer's own state of the entry before, after its head norm (as
                              * llama.cpp chains it): copied before the step overwrites it */
                const model *v = engine_model(sd->e);
                const float *own = engine_hidden(sd->e) + (size_t)sd->last[i] * sd->dim;
                if (sd->raw) memcpy(sd->hin + (size_t)nt * sd->dim, own, (size_t)sd->dim * sizeof(float));
                else ops_rmsnorm(NULL, sd->hin + (size_t)nt * sd->dim, own, v->output_norm, 1, sd->dim, v->hp.rms_eps);
                sd->last[i] = nt;
            }
            sd->row[i] = nt++;
        }
        if (nt == 0) return n_steps;
        b.n_tokens = nt;
        n_steps++;
        if (engine_forward(sd->e, &b, hin, sd->logits) != ENGINE_OK) return n_steps;   /* keep the drafts so far */
        for (int i = 0; i < n; i++) {
            specdraft_seq *q = &seqs[i];
            if (sd->row[i] < 0) continue;
            if (!sd->mtp) q->n_done = q->n_tokens + k;   /* MTP: drafted entries are never final */
            q->draft[k] = specdraft_argmax(sd, sd->logits + (size_t)sd->row[i] * sd->n_vocab, &q->prob[k]);
            q->n_draft = k + 1;
        }
    }
    return n_steps;
}
