/*
 * sched_spec: the scheduler's side of speculative decoding (see sched.h and docs/spec.md).
 * Before a step is planned, sched_spec_plan_locked sets how many drafted tokens every decoding
 * request verifies (the fixed count, or spec_choose's on the learned step-time curve); after a
 * step was sampled, sched_spec_draft drafts each request's continuation (prompt lookup or the
 * draft model, whichever has the better running acceptance for it) and cuts a constrained
 * request's draft where its grammar stops allowing it. The verification itself (sampling the
 * verify rows in order) is in sched_sample.c, the rollback of rejected rows in sched.c's step.
 * Engine thread only; the request fields used here are listed in sched_int.h.
 */
#include "engine/sched_int.h"

#include <math.h>
#include <string.h>

#include "util/util.h"

/* Lets go of r's draft KV and draft (it ends, or is preempted and recomputes from scratch). */
void sched_spec_release(sched *s, sched_req *r)
{
    if (r->dseq) kvpool_seq_free(engine_kvpool(s->o.draft), r->dseq);
    r->dseq = NULL;
    r->d_done = 0;
    r->n_draft = 0;
    r->draft_at = -1;
}

/* The step-time curve the chooser sees: the step as it will be planned (its decodes and the
 * prompt chunk beside them) plus n_extra verify rows, each attending about depth_per_tok
 * positions. */
typedef struct {
    const steptime *tm;
    steptime_x x;                /* the step's decodes and prefill, no verify rows */
    double depth_per_tok;        /* positions a verify row attends */
} sched_spec_curve;

static double sched_spec_time(void *arg, int n_extra)
{
    const sched_spec_curve *c = arg;
    double base = steptime_predict(c->tm, &c->x);
    if (base <= 0) return 0;
    return base + n_extra * (steptime_verify_row_s(c->tm) + steptime_depth_s(c->tm, c->depth_per_tok));
}

/* The prompt tokens the step will read beside its decodes (as the planner's pass over the
 * prompts gives them, in admission order, before the verify rows are known) and the positions
 * they attend, into x. */
static void sched_spec_prefill_part(const sched *s, int n_dec, steptime_x *x)
{
    int budget = s->o.step_tokens - s->o.spec_room - n_dec;
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        const sched_req *r = s->running[i];
        if (r->n_tokens - r->n_done <= 1 || r->share_wait) continue;
        int chunk = sched_prefill_chunk(s, x, r, budget, s->o.step_ms / 1e3);
        if (chunk == 0) break;
        x->n_prefill += chunk;
        x->depth += (double)chunk * r->n_done + (double)chunk * (chunk + 1) / 2;
        budget -= chunk;
    }
}

/* Speculation, before a step is planned: sets how many of its drafts every decoding request
 * verifies (n_verify), at most max_extra in all: the fixed count, the most while the step
 * time is not learned yet, else spec_choose's count. A verify row makes the step longer for
 * every running request (those reading their prompts too), and an accepted draft saves its
 * request a step: so the count maximises (running requests + expected accepted drafts) / the
 * round's predicted seconds (the step with its prompt chunk, plus the draft model's measured
 * round). In steps of decodes alone that is the decodes' tokens per second; beside a prompt
 * chunk, drafts are worth their rows only as the whole step's time is: pricing them against
 * the decodes alone would take a curve extrapolated to steps the server does not run. Drafts
 * were made after the step that sampled the request's last token (sched_spec_draft); one made
 * for another context (the request was preempted since) is not used. */
void sched_spec_plan_locked(sched *s, int max_extra)
{
    int n = 0;
    sched_spec_curve cv = { .tm = &s->tm };
    for (int i = 0; i < s->n_running; i++) {
        sched_req *r = s->running[i];
        r->n_verify = 0;
        if (r->n_tokens - r->n_done != 1 || r->share_wait) continue;
        if (r->draft_at != r->n_tokens) r->n_draft = 0;
        cv.x.n_dec++;
        cv.x.depth += r->n_done + 1;
        s->spec_req[n] = r;
        s->spec_nd[n] = r->n_draft;
        spec_seq_gains(&r->spec[r->draft_src], r->draft_src == 1 ? r->draft_prob : NULL, r->n_draft,
                       s->spec_gains + (size_t)n * SPEC_MAX_K);
        n++;
    }
    if (n == 0 || max_extra <= 0) return;
    cv.depth_per_tok = cv.x.depth / n;
    bool chosen = false;
    if (s->o.spec_fixed <= 0 && steptime_warm(&s->tm)) {
        sched_spec_prefill_part(s, n, &cv.x);
        chosen = spec_choose(s->chooser, n, s->spec_gains, s->spec_nd, s->n_running, max_extra, sched_spec_time, &cv,
                             s->drafter ? s->draft_round_s : 0, s->spec_k) >= 0;
    }
    for (int j = 0; j < n; j++) {
        int k = chosen ? s->spec_k[j] : TM_MIN(s->spec_nd[j], s->o.spec_fixed > 0 ? s->o.spec_fixed : s->o.spec_max);
        if (k == 0 && s->spec_nd[j] > 0 && spec_probe_due(&s->spec_req[j]->probe)) k = 1;
        k = TM_MIN(k, max_extra);
        s->spec_req[j]->n_verify = k;
        max_extra -= k;
    }
}

/* The drafted tokens of a grammar-constrained request that its automaton allows, in order:
 * checked on a copy of its matcher (the request's own moves only with emitted tokens). A stop
 * id ends the draft after it (the request ends there); a think block's start or end ends the
 * checking (the grammar leaves reasoning free). Returns the drafts kept. */
static int sched_spec_grammar_cut(sched_req *r)
{
    if (r->in_think) return r->n_draft;
    grammar_match_copy_state(r->gm_draft, r->gm);
    bool on = r->g_on;   /* a lazy grammar binds from its trigger to the end of a document */
    for (int j = 0; j < r->n_draft; j++) {
        int32_t tok = r->draft[j];
        if ((tok == r->p.think_start || tok == r->p.think_end) && tok >= 0) return r->n_draft;
        if (on) {
            if (!grammar_match_accept(r->gm_draft, tok)) return j;
            if (r->p.grammar_lazy && grammar_match_done(r->gm_draft)) {
                grammar_match_reset(r->gm_draft);
                on = false;
            }
        } else if (r->p.grammar_lazy && tok == r->p.grammar_trigger) {
            on = true;
        }
        if (sched_is_stop(r->s, r, tok)) return j + 1;
    }
    return r->n_draft;
}

/* Most tokens r may draft once it holds nt tokens: spec_max, within what it may still emit
 * after the token its last verified row gives (<= 0: it ends, or has one token left). */
static int sched_spec_kmax(const sched *s, const sched_req *r, int nt)
{
    return TM_MIN(s->o.spec_max, TM_MIN(r->max_gen - (nt - r->n_prompt), r->cap - nt) - 1);
}

/* Prompt lookup for r once it holds nt tokens, at most kmax. */
static void sched_spec_ngram(sched *s, sched_req *r, int nt, int kmax)
{
    r->n_draft = spec_ngram_draft(r->tokens, nt, SPEC_NGRAM_MAX, SPEC_NGRAM_MIN, kmax, r->draft);
    r->draft_src = 0;
    r->draft_at = nt;
    s->drafted_run += (uint64_t)r->n_draft;
}

/* What the step just sampled taught of r's drafts: the server-wide rate of the source that
 * drafted them, and r's probe (a decode step of r with or without verified drafts). Its own
 * estimates start from the server-wide ones until it has tested drafts. */
static void sched_spec_learn(sched *s, sched_req *r, int i)
{
    int k = s->batch_k[i];
    if (k > 0)
        spec_seq_observe(&s->spec_all[r->draft_src], s->batch_acc[i], r->spec_rejected,
                         r->draft_src == 1 ? r->draft_prob : NULL);
    if (s->batch_n[i] - k == 1 && s->batch_row[i] >= 0) spec_probe_step(&r->probe, k, s->batch_acc[i]);
    for (int src = 0; src < SPEC_N_SRC; src++) spec_seq_prior(&r->spec[src], &s->spec_all[src]);
}

/* Speculation, after a step was sampled: drafts the continuation of every request of the
 * step that goes on decoding, from the source with the better running acceptance for it
 * (prompt lookup first on a tie: it costs nothing; the other source when the first drafts
 * nothing). A costly source (a draft model) drafts only the tokens whose expected gain pays
 * for its steps, none when even the first does not: a request whose drafts are poor runs no
 * draft round, and its draft KV catches up in one chunk if it drafts again. The source's
 * probe (one request drafting one token anyway) comes once per gap of the server's steps
 * without a verified model draft, so a poor draft model costs a catch-up per gap, not one
 * per request. A draft never runs past what the request may still emit (its last token is
 * sampled from the last verified row). The draft KV is first cut back to the positions whose
 * tokens are final (n_done): the rows of rejected or unverified drafts are recomputed.
 * Engine thread, without mu. */
void sched_spec_draft(sched *s, int n_reqs)
{
    int nq = 0, row0 = 0, model_verified = 0, model_accepted = 0;
    for (int i = 0; i < n_reqs; i++)
        if (s->batch_k[i] > 0 && s->batch_req[i]->draft_src == 1) {
            model_verified += s->batch_k[i];
            model_accepted += s->batch_acc[i];
        }
    spec_probe_step(&s->model_probe, model_verified, model_accepted);
    bool model_probe = spec_probe_due(&s->model_probe);
    double now = model_probe ? util_now() : 0;
    bool ngram = s->o.spec_sources & SPEC_SRC_NGRAM, dmodel = s->drafter != NULL;
    /* an MTP draft continues the model's hidden states: it catches up on every step's rows
     * (prefill chunks, and steps where prompt lookup drafts), catching up only (k_max 0) */
    bool mtp = dmodel && specdraft_is_mtp(s->drafter);
    for (int i = 0; i < n_reqs; i++) {
        sched_req *r = s->batch_req[i];
        int ntok = s->batch_ntok[i], first = row0;
        row0 += s->batch_n[i];
        sched_spec_learn(s, r, i);
        if (r->dseq) r->d_done = TM_MIN(r->d_done, r->n_done);
        r->n_draft = 0;
        r->draft_at = -1;
        if (ntok == 0 && !mtp) continue;
        int nt = ntok ? r->n_tokens + ntok : r->n_done + 1;   /* tokens once this step is published */
        int kmax = ntok ? sched_spec_kmax(s, r, nt) : 0;
        if (ntok && (kmax <= 0 || sched_is_stop(s, r, r->tokens[nt - 1]))) continue;   /* it ends */
        bool ngram_first = ntok && ngram && (!dmodel || r->spec[0].rate[0] >= r->spec[1].rate[0]);
        if (ngram_first) {
            sched_spec_ngram(s, r, nt, kmax);
            if (r->n_draft > 0 || !dmodel) {
                if (!mtp) continue;
                kmax = 0;
            } else {
                r->draft_at = -1;
            }
        }
        if (!dmodel) continue;
        /* what a draft step costs as a fraction of a target step: measured, but never below
         * the ratio of the weights the two read (a slow target step under other load must not
         * make the draft model look free) */
        double min_gain = s->draft_step_s > 0 && s->main_step_s > 0 ? s->draft_step_s / s->main_step_s : SPEC_MIN_GAIN;
        min_gain = TM_MAX(min_gain, s->draft_cost_floor);
        /* a probe feeds the draft model what it has not seen of r (all of it, the first time):
         * at the draft's share of a target's prefill per token, it may cost SPEC_PROBE_SHARE of
         * the time since the last probe at most */
        bool probe = model_probe && ntok &&
                     (s->model_probe_t == 0 || (double)(nt - r->d_done) * steptime_prefill_token_s(&s->tm) * s->draft_cost_floor <=
                                                   SPEC_PROBE_SHARE * (now - s->model_probe_t));
        int k_model = kmax <= 0 ? 0 : s->o.spec_fixed > 0 ? kmax : spec_seq_draft_len(&r->spec[1], kmax, min_gain, probe);
        if (k_model > 0 && probe && r->spec[1].rate[0] < min_gain) {   /* this request probes */
            model_probe = false;
            s->model_probe_t = now;
            spec_probe_taken(&s->model_probe);
            spec_probe_force(&r->probe);
        }
        /* no drafts from the model this time: prompt lookup when it was not tried (an MTP
         * layer still catches up below, drafting nothing) */
        if (k_model == 0 && ntok && ngram && !ngram_first) sched_spec_ngram(s, r, nt, kmax);
        if (k_model == 0 && !mtp) continue;
        if (!r->dseq) r->dseq = kvpool_seq_new(engine_kvpool(s->o.draft));
        specdraft_seq *q = &s->dq[nq];
        q->seq = r->dseq;
        q->tokens = r->tokens;
        q->n_tokens = nt;
        q->n_done = r->d_done;
        q->k_max = k_model;
        q->hid = mtp ? engine_hidden(s->e) + (size_t)first * s->e_dim : NULL;
        q->hid_pos = s->batch[first].pos;
        q->n_hid = s->batch_n[i];
        s->dq_req[nq++] = r;
    }
    if (nq > 0) {   /* its steps' cost against the target's decides how far the next drafts go */
        double t0 = util_now();
        int n_steps = specdraft_run(s->drafter, s->dq, nq);
        if (n_steps > 0) {
            double all = util_now() - t0, per = all / n_steps;
            s->draft_step_s = s->draft_step_s > 0 ? 0.9 * s->draft_step_s + 0.1 * per : per;
            s->draft_round_s = s->draft_round_s > 0 ? 0.9 * s->draft_round_s + 0.1 * all : all;
        }
    }
    for (int j = 0; j < nq; j++) {
        sched_req *r = s->dq_req[j];
        specdraft_seq *q = &s->dq[j];
        r->d_done = q->n_done;
        if (q->k_max == 0) continue;   /* caught up only */
        r->draft_at = q->n_tokens;
        r->draft_src = 1;
        r->n_draft = q->n_draft;
        memcpy(r->draft, q->draft, (size_t)q->n_draft * sizeof *r->draft);
        memcpy(r->draft_prob, q->prob, (size_t)q->n_draft * sizeof *r->draft_prob);
        s->drafted_run += (uint64_t)r->n_draft;
        if (r->n_draft == 0 && ngram && r->spec[0].rate[0] < r->spec[1].rate[0])   /* it was not tried first */
            sched_spec_ngram(s, r, q->n_tokens, sched_spec_kmax(s, r, q->n_tokens));
    }
    for (int i = 0; i < n_reqs; i++) {
        sched_req *r = s->batch_req[i];
        if (r->gm && r->n_draft > 0 && !r->in_think) r->n_draft = sched_spec_grammar_cut(r);
    }
}
