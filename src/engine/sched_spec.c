/*
 * sched_spec: the scheduler's side of speculative decoding (see sched.h and docs/spec.md).
 * Before a step is planned, sched_spec_plan_locked sets how many drafted tokens every decoding
 * request verifies (the fixed count, or spec_choose's on the learned step-time curve); after a
 * step was sampled, sched_spec_draft drafts each request's continuation (prompt lookup, the
 * draft model or the model's MTP layer, whichever has the best running acceptance for it) and
 * cuts a constrained
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
    for (int d = 0; d < SCHED_N_DRAFTERS; d++) {
        if (r->draft.seq[d]) kvpool_seq_free(specdraft_kvpool(s->dr[d].sd), r->draft.seq[d]);
        r->draft.seq[d] = NULL;
        r->draft.done[d] = 0;
        r->draft.idle[d] = false;
    }
    r->draft.n = 0;
    r->draft.at = -1;
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
        if (r->n_tokens - r->n_done <= 1 || r->prefix.share_wait) continue;
        int chunk = sched_prefill_chunk(s, x, r, budget, s->o.step_ms / 1e3);
        if (chunk == 0) break;
        x->n_prefill += chunk;
        x->depth += (double)chunk * r->n_done + (double)chunk * (chunk + 1) / 2;
        budget -= chunk;
    }
}

/* Speculation, before a step is planned: sets how many of its drafts every decoding request
 * verifies (draft.n_verify), at most max_extra in all: the fixed count, the most while the step
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
        r->draft.n_verify = 0;
        if (r->n_tokens - r->n_done != 1 || r->prefix.share_wait) continue;
        if (r->draft.at != r->n_tokens) r->draft.n = 0;
        cv.x.n_dec++;
        cv.x.depth += r->n_done + 1;
        s->spec_req[n] = r;
        s->spec_nd[n] = r->draft.n;
        spec_seq_gains(&r->spec.src[r->draft.src], r->draft.prob, r->draft.n,
                       s->spec_gains + (size_t)n * SPEC_MAX_K);
        n++;
    }
    if (n == 0 || max_extra <= 0) return;
    cv.depth_per_tok = cv.x.depth / n;
    bool chosen = false;
    if (s->o.spec_fixed <= 0 && steptime_warm(&s->tm)) {
        sched_spec_prefill_part(s, n, &cv.x);
        double draft_s = 0;   /* the drafting models' rounds beside the step */
        for (int d = 0; d < SCHED_N_DRAFTERS; d++) draft_s += s->dr[d].sd ? s->dr[d].round_s : 0;
        chosen = spec_choose(s->chooser, n, s->spec_gains, s->spec_nd, s->n_running, max_extra, sched_spec_time, &cv,
                             draft_s, s->spec_k) >= 0;
    }
    for (int j = 0; j < n; j++) {
        int k = chosen ? s->spec_k[j] : TM_MIN(s->spec_nd[j], s->o.spec_fixed > 0 ? s->o.spec_fixed : s->o.spec_max);
        if (k == 0 && s->spec_nd[j] > 0 && spec_probe_due(&s->spec_req[j]->spec.probe)) k = 1;
        k = TM_MIN(k, max_extra);
        s->spec_req[j]->draft.n_verify = k;
        max_extra -= k;
    }
}

/* The drafted tokens of a grammar-constrained request that its automaton allows, in order:
 * checked on a copy of its matcher (the request's own moves only with emitted tokens). A stop
 * id ends the draft after it (the request ends there); a think block's start or end ends the
 * checking (the grammar leaves reasoning free). Returns the drafts kept. */
static int sched_spec_grammar_cut(sched_req *r)
{
    if (r->samp.in_think) return r->draft.n;
    grammar_match_copy_state(r->draft.gm, r->samp.gm);
    bool on = r->samp.g_on;   /* a lazy grammar binds from its trigger to the end of a document */
    for (int j = 0; j < r->draft.n; j++) {
        int32_t tok = r->draft.tok[j];
        if ((tok == r->p.think_start || tok == r->p.think_end) && tok >= 0) return r->draft.n;
        if (on) {
            if (!grammar_match_accept(r->draft.gm, tok)) return j;
            if (r->p.grammar_lazy && grammar_match_done(r->draft.gm)) {
                grammar_match_reset(r->draft.gm);
                on = false;
            }
        } else if (r->p.grammar_lazy && tok == r->p.grammar_trigger) {
            on = true;
        }
        if (sched_is_stop(r->s, r, tok)) return j + 1;
    }
    return r->draft.n;
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
    r->draft.n = spec_ngram_draft(r->tokens, nt, SPEC_NGRAM_MAX, SPEC_NGRAM_MIN, kmax, r->draft.tok, r->draft.prob);
    r->draft.src = 0;
    r->draft.at = r->draft.n > 0 ? nt : -1;
    s->drafted_run[0] += (uint64_t)r->draft.n;
}

/* What the step just sampled taught of r's drafts: the server-wide rate of the source that
 * drafted them, and r's probe (a decode step of r with or without verified drafts). Its own
 * estimates start from the server-wide ones until it has tested drafts. */
static void sched_spec_learn(sched *s, sched_req *r, int i)
{
    int k = s->batch_k[i];
    if (k > 0) {
        spec_seq_observe(&s->spec_all[r->draft.src], s->batch_acc[i], r->spec.rejected, r->draft.prob);
    }
    if (s->batch_n[i] - k == 1 && s->batch_row[i] >= 0) spec_probe_step(&r->spec.probe, k, s->batch_acc[i]);
    for (int src = 0; src < SPEC_N_SRC; src++) spec_seq_prior(&r->spec.src[src], &s->spec_all[src]);
}

/* How many tokens drafter d drafts for r (at most kmax), from the expected gains of its
 * drafts against what its steps cost; when that is none and d's probe is due (probe_due, its
 * clock read at now), r may probe it: one token anyway, if what d has not seen of r (nt - its
 * draft.done) costs at most SPEC_PROBE_SHARE of the time since d's last probe (or since the
 * scheduler started: a first probe is no cheaper than the others; a new server's first
 * requests try the drafter anyway, from the prior rate). Until d's drafts were tested often
 * enough server-wide to give new requests a measured prior, a request's first drafts with it
 * are a probe too, under the same budget: each one feeds d the request's whole prompt, and a
 * new server would otherwise pay that for every request until the prior is known. A catch-up
 * is priced as d's own catch-ups measured, not by the step-time model's prefill price, which
 * the decode steps after a prompt make it forget (docs/benchmarks.md, "Figures behind
 * decisions in the code"). */
/* What a step of drafter d costs as a fraction of a target step: measured, but never below the
 * ratio of the weights the two read (a slow target step under other load must not make the
 * drafting model look free). A first draft accepted less often does not pay for its step. */
static double sched_spec_min_gain(const sched *s, int d)
{
    const sched_drafter *dr = &s->dr[d];
    double min_gain = dr->step_s > 0 && s->main_step_s > 0 ? dr->step_s / s->main_step_s : SPEC_MIN_GAIN;
    return TM_MAX(min_gain, dr->cost_floor);
}

static int sched_spec_model_len(sched *s, int d, sched_req *r, int nt, int kmax, bool *probe_due, double now)
{
    sched_drafter *dr = &s->dr[d];
    const spec_seq *q = &r->spec.src[SCHED_DRAFTER_SRC(d)];
    if (kmax <= 0) return 0;
    if (s->o.spec_fixed > 0) return kmax;
    double min_gain = sched_spec_min_gain(s, d);
    /* a catch-up token: as the drafting model's catch-ups measured, or before one was, the
     * target's prefill token by its share of the weights */
    double per_tok = TM_MAX(steptime_prefill_token_s(&s->tm) * dr->cost_floor, dr->catchup_tok_s);
    bool affordable = (double)(nt - r->draft.done[d]) * per_tok <= SPEC_PROBE_SHARE * (now - dr->probe_t);
    bool unproven = !spec_seq_proven(&s->spec_all[SCHED_DRAFTER_SRC(d)]) && r->draft.done[d] == 0;
    if (unproven && !affordable) return 0;
    bool probe = *probe_due && affordable;
    int k;
    bool worth;
    if (specdraft_follows(dr->sd) && !specdraft_is_mtp(dr->sd)) {
        /* a block drafter (dflash) drafts the whole block in one pass, so each further token
         * costs nothing more to draft: it drafts when the accepted tokens its longest draft is
         * expected to yield pay for the pass, and then all of them (the verify count chooses how
         * many to verify); priced a pass per token, its drafts stopped at the first position
         * whose running acceptance fell below the pass's cost */
        int n = TM_MIN(kmax, SPEC_MAX_K);
        double g = 1, yield = 0;
        for (int j = 0; j < n; j++) yield += (g *= q->rate[j]);
        worth = yield >= min_gain;
        k = worth || probe ? n : 0;
    } else {
        k = spec_seq_draft_len(q, kmax, min_gain, probe);
        worth = q->rate[0] >= min_gain;
    }
    if (k > 0 && (unproven || (probe && !worth))) {   /* this request probes */
        *probe_due = false;
        dr->probe_t = now;
        spec_probe_taken(&dr->probe);
        spec_probe_force(&r->spec.probe);
    }
    return k;
}

/* Queues r on drafter d for this round: k_max tokens (0: an MTP layer's catch-up only), the
 * model's hidden states of r's rows in the step (from row first, n_rows of them) for an MTP
 * layer. */
static void sched_spec_queue(sched *s, int d, sched_req *r, int nt, int k_max, int first, int n_rows)
{
    sched_drafter *dr = &s->dr[d];
    if (!r->draft.seq[d]) r->draft.seq[d] = kvpool_seq_new(specdraft_kvpool(dr->sd));
    specdraft_seq *q = &dr->q[dr->nq];
    q->seq = r->draft.seq[d];
    q->tokens = r->tokens;
    q->n_tokens = nt;
    q->n_done = r->draft.done[d];
    q->k_max = k_max;
    q->hid = specdraft_step_rows(dr->sd, s->e, first);
    q->hid_pos = s->batch[first].pos;
    q->n_hid = n_rows;
    dr->q_req[dr->nq++] = r;
}

/* Whether MTP drafter d skips the catch-up of r's rows in a step (ntok: the tokens the step
 * sampled for r, 0 for a prompt chunk). The layer costs a whole layer's forward on every row
 * it follows, and its drafts need its KV at every position (its attention reads them), so it
 * follows a request while the request drafts with it; once adaptive speculation has stopped
 * that (r->draft.idle, a fixed draft count never does) it skips r's rows, and a prompt's chunks
 * are skipped when r's estimate of the layer's first drafts (the server-wide rate once that is
 * known, else the prior) does not pay for a draft step: r would draft with it only as a probe,
 * and a probe's catch-up is priced by the probe budget. When r
 * drafts with it again (a probe, or its rate back above the step's cost), the round catches
 * the gap up first, as a draft model catches up: the rows of the step just run with the
 * model's states, older ones with a zero state (the state exists only during its step), as
 * after a prefix taken from the cache; verification keeps the output exact whatever the
 * drafts. Those catch-ups are priced by the probe's budget (sched_spec_model_len). A dflash
 * drafter follows every step. */
static bool sched_spec_skips(const sched *s, int d, const sched_req *r, int ntok)
{
    if (!specdraft_is_mtp(s->dr[d].sd) || s->o.spec_fixed > 0) return false;
    if (ntok > 0) return r->draft.idle[d];
    return r->draft.idle[d] || r->spec.src[SCHED_DRAFTER_SRC(d)].rate[0] < sched_spec_min_gain(s, d);
}

/* Speculation, after a step was sampled: drafts the continuation of every request of the
 * step that goes on decoding, from the source with the best running acceptance for it (on a
 * tie the cheaper first: prompt lookup, which costs nothing, then the MTP layer, then the
 * draft model), the next one when a source drafts nothing. A drafting model drafts only the
 * tokens whose expected gain pays for its steps, none when even the first does not: a request
 * whose drafts are poor runs no draft round, and its draft KV catches up in one chunk if it
 * drafts again. A model's probe (one request drafting one token anyway) comes once per gap of
 * the server's steps without a verified draft of that model, so a poor draft model costs a
 * catch-up per gap, not one per request. An MTP layer continues the model's hidden states, so
 * it catches up on every step's rows (prefill chunks, and steps where another source drafted)
 * while the request drafts with it, and skips them once adaptive speculation stopped that
 * (sched_spec_skips); a dflash drafter follows every step. A draft never runs past what the request may still emit (its last token is
 * sampled from the last verified row). Draft KV is first cut back to the positions whose tokens
 * are final (n_done): the rows of rejected or unverified drafts are recomputed. Engine thread,
 * without mu. */
void sched_spec_draft(sched *s, int n_reqs)
{
    int row0 = 0;
    bool ngram = s->o.spec_sources & SPEC_SRC_NGRAM;
    bool probe_due[SCHED_N_DRAFTERS] = { false };
    double now = 0;
    for (int d = 0; d < SCHED_N_DRAFTERS; d++) {
        sched_drafter *dr = &s->dr[d];
        dr->nq = 0;
        if (!dr->sd) continue;
        int verified = 0, accepted = 0;
        for (int i = 0; i < n_reqs; i++)
            if (s->batch_k[i] > 0 && s->batch_src[i] == SCHED_DRAFTER_SRC(d)) {
                verified += s->batch_k[i];
                accepted += s->batch_acc[i];
            }
        spec_probe_step(&dr->probe, verified, accepted);
        probe_due[d] = spec_probe_due(&dr->probe);
        if (now == 0 && (probe_due[d] || !spec_seq_proven(&s->spec_all[SCHED_DRAFTER_SRC(d)])))
            now = util_now();
    }
    /* the drafters that follow every step (an MTP layer, a dflash drafter) */
    bool follows[SCHED_N_DRAFTERS], any_follows = false;
    for (int d = 0; d < SCHED_N_DRAFTERS; d++)
        any_follows |= follows[d] = s->dr[d].sd && specdraft_follows(s->dr[d].sd);
    for (int i = 0; i < n_reqs; i++) {
        sched_req *r = s->batch_req[i];
        int ntok = s->batch_ntok[i], first = row0;
        row0 += s->batch_n[i];
        sched_spec_learn(s, r, i);
        for (int d = 0; d < SCHED_N_DRAFTERS; d++)
            if (r->draft.seq[d]) r->draft.done[d] = TM_MIN(r->draft.done[d], r->n_done);
        r->draft.n = 0;
        r->draft.at = -1;
        if (ntok == 0 && !any_follows) continue;
        int nt = ntok ? r->n_tokens + ntok : r->n_done + 1;   /* tokens once this step is published */
        int kmax = ntok ? sched_spec_kmax(s, r, nt) : 0;
        if (ntok && (kmax <= 0 || sched_is_stop(s, r, r->tokens[nt - 1]))) continue;   /* it ends */
        /* the sources by r's running acceptance of their first drafts, cheapest first on a tie */
        int order[SPEC_N_SRC], n_src = 0;
        const int by_cost[SPEC_N_SRC] = { 0, 2, 1 };
        for (int j = 0; j < SPEC_N_SRC; j++) {
            int src = by_cost[j];
            if (!(s->o.spec_sources & (1 << src))) continue;
            int at = n_src++;
            while (at > 0 && r->spec.src[order[at - 1]].rate[0] < r->spec.src[src].rate[0]) {
                order[at] = order[at - 1];
                at--;
            }
            order[at] = src;
        }
        int queued = -1;   /* the drafter r drafts with this round */
        for (int j = 0; j < n_src && ntok && r->draft.n == 0 && queued < 0; j++) {
            int src = order[j];
            if (src == 0) {
                sched_spec_ngram(s, r, nt, kmax);
                continue;
            }
            int d = src - 1;
            int k = sched_spec_model_len(s, d, r, nt, kmax, &probe_due[d], now);
            r->draft.idle[d] = k == 0;   /* an MTP layer stops (or resumes) following r */
            if (k == 0) continue;
            sched_spec_queue(s, d, r, nt, k, first, s->batch_n[i]);
            queued = d;
        }
        for (int d = 0; d < SCHED_N_DRAFTERS; d++)
            if (follows[d] && queued != d && !sched_spec_skips(s, d, r, ntok))
                sched_spec_queue(s, d, r, nt, 0, first, s->batch_n[i]);   /* catch-up */
    }
    for (int d = 0; d < SCHED_N_DRAFTERS; d++) {
        sched_drafter *dr = &s->dr[d];
        if (dr->nq == 0) continue;
        /* its steps' cost against the target's decides how far the next drafts go */
        int fed = 0;   /* tokens it has not seen, caught up this round */
        for (int j = 0; j < dr->nq; j++) fed += dr->q[j].n_tokens - dr->q[j].n_done;
        double t0 = util_now();
        int n_steps = specdraft_run(dr->sd, dr->q, dr->nq);
        if (n_steps > 0) {
            /* a round that catches up a prompt times the catch-up (rare: a short memory), the
             * others a drafting step and round: a catch-up step of a hundred tokens counted as a
             * draft step made the drafting model look dear for the steps after it */
            double all = util_now() - t0, per = all / n_steps;
            if (fed >= SCHED_CATCHUP_MEASURE) {
                dr->catchup_tok_s = dr->catchup_tok_s > 0 ? 0.5 * dr->catchup_tok_s + 0.5 * all / fed : all / fed;
            } else {
                dr->step_s = dr->step_s > 0 ? 0.9 * dr->step_s + 0.1 * per : per;
                dr->round_s = dr->round_s > 0 ? 0.9 * dr->round_s + 0.1 * all : all;
            }
            log_debug("sched: draft round (%s): %d sequences, %d steps, %d tokens caught up; ms %.2f",
                      spec_source_name(SCHED_DRAFTER_SRC(d)), dr->nq, n_steps, fed, all * 1e3);
        }
        for (int j = 0; j < dr->nq; j++) {
            sched_req *r = dr->q_req[j];
            specdraft_seq *q = &dr->q[j];
            if (q->n_done > r->draft.done[d]) s->caught_run[SCHED_DRAFTER_SRC(d)] += (uint64_t)(q->n_done - r->draft.done[d]);
            r->draft.done[d] = q->n_done;
            if (q->k_max == 0) continue;   /* caught up only */
            r->draft.at = q->n_tokens;
            r->draft.src = SCHED_DRAFTER_SRC(d);
            r->draft.n = q->n_draft;
            memcpy(r->draft.tok, q->draft, (size_t)q->n_draft * sizeof *r->draft.tok);
            memcpy(r->draft.prob, q->prob, (size_t)q->n_draft * sizeof *r->draft.prob);
            s->drafted_run[r->draft.src] += (uint64_t)r->draft.n;
            /* nothing drafted (a backlog still catching up, no KV room): prompt lookup, when
             * it ranked below this model and was not tried */
            if (r->draft.n == 0 && ngram && r->spec.src[0].rate[0] < r->spec.src[r->draft.src].rate[0])
                sched_spec_ngram(s, r, q->n_tokens, sched_spec_kmax(s, r, q->n_tokens));
        }
    }
    for (int i = 0; i < n_reqs; i++) {
        sched_req *r = s->batch_req[i];
        if (r->samp.gm && r->draft.n > 0 && !r->samp.in_think) r->draft.n = sched_spec_grammar_cut(r);
    }
}
