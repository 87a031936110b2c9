/*
 * sched: continuous batching on one engine thread. sched.h says what callers rely on,
 * docs/architecture.md ("Scheduler") the design.
 *
 * Request life: QUEUED (in s->waiting, in arrival order; a preempted request goes back to the
 * front) -> RUNNING (in s->running, ordered by admission) -> FINISHED (FINISH record
 * published, KV released, dropped by the engine).
 *
 * Admission (which waiting request runs next, and what of its prompt it reuses: cached
 * blocks, blocks loaded from the store, prefixes in flight, tails) is in sched_admit.c; this
 * file calls it before each step's plan.
 *
 * The handle itself is freed by whoever lets go of it last: the caller (sched_release) or the
 * engine thread (when it drops a request the caller has already released). `pub.engine_held`
 * and `pub.released` decide that, under s->mu.
 *
 * What the engine thread alone touches (no lock): the kvpool, the samplers, every request's
 * token array beyond n_prompt, seq, n_done, and the running array (which it changes only
 * under s->mu, so that the cancel-all calls may walk it). What s->mu guards: the waiting
 * queue, each request's `pub` (output ring, cancel, released, engine_held,
 * finish_returned), the count of unfinished requests, the statistics and histograms.
 *
 * Publishing (the overlapped step loop): a step's outputs wait in pub_* from the handoff
 * (sched_step_publish_locked) until sched_pub_flush_locked pushes them, on the publisher
 * thread or on the engine thread (before the next handoff, before any FINISH, with
 * no_overlap). A request ended at the handoff is out of the running set with its KV released
 * but keeps pub.engine_held until its FINISH is pushed, so the handle outlives its records.
 *
 * Stopping: sched_drain refuses new submissions; sched_abort and sched_shutdown also mark
 * every request cancelled, with the finish it must end with (ABORTED or CANCELLED), and the
 * engine thread ends them at its next admission pass, like any cancel. n_live counts accepted
 * requests until their FINISH is published; sched_wait_idle waits for it to reach 0.
 */
#include "engine/sched.h"
#include "engine/sched_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>

#include "cache/blockkey.h"
#include "engine/blockio.h"
#include "engine/engine_dflash.h"
#include "engine/specdraft.h"
#include "engine/steptime.h"
#include "engine/wincache.h"
#include "util/util.h"

const double sched_hist_bounds[SCHED_HIST_N] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
};

/* ---- histograms and outputs (under mu) ---- */

void sched_hist_add(sched_hist *h, double v)
{
    int i = 0;
    while (i < SCHED_HIST_N && v > sched_hist_bounds[i]) i++;
    h->counts[i]++;
    h->n++;
    h->sum += v;
}

sched_output *sched_push(sched_req *r)
{
    if (r->pub.ring_n == r->pub.ring_cap) {
        int ncap = r->pub.ring_cap ? r->pub.ring_cap * 2 : 16;
        sched_output *nr = xmalloc((size_t)ncap * sizeof *nr);
        for (int i = 0; i < r->pub.ring_n; i++) nr[i] = r->pub.ring[(r->pub.ring_head + i) % r->pub.ring_cap];
        free(r->pub.ring);
        r->pub.ring = nr;
        r->pub.ring_cap = ncap;
        r->pub.ring_head = 0;
    }
    sched_output *o = &r->pub.ring[(r->pub.ring_head + r->pub.ring_n) % r->pub.ring_cap];
    r->pub.ring_n++;
    memset(o, 0, sizeof *o);
    return o;
}

static void sched_req_destroy(sched_req *r)
{
    if (!r) return;
    if (r->load.io) blockio_load_free(r->s->o.bio, r->load.io);
    sample_free(r->samp.smp);
    grammar_match_free(r->samp.gm);
    grammar_match_free(r->draft.gm);
    free(r->tokens);
    free(r->prefix.chain);
    free(r->pub.ring);
    free(r->embd);
    pthread_cond_destroy(&r->pub.cv);
    free(r);
}

/* ---- engine thread ---- */

/* Releases r's KV (engine thread): it ends. */
static void sched_finish_release(sched *s, sched_req *r)
{
    sched_admit_tail_unpin(s, r);
    if (r->seq && r->p.kv_out) {
        kvpool_fill_wait(s->pool, -1);   /* blocks loaded from the store are in the pool */
        r->p.kv_out(r->p.kv_arg, s->pool, r->seq, r->n_done);
    }
    if (r->seq) {
        sched_admit_keep_tails(s, r);   /* for its next turn */
        kvpool_seq_free(s->pool, r->seq);
        r->seq = NULL;
    }
    sched_spec_release(s, r);
    r->state = REQ_FINISHED;
}

/* Publishes r's FINISH record with why, unless it has one. Under mu. */
void sched_finish_push_locked(sched *s, sched_req *r, sched_finish why)
{
    if (!r->pub.finished) {
        if (--s->n_live == 0) pthread_cond_broadcast(&s->idle_cv);
        sched_output *o = sched_push(r);
        o->kind = SCHED_OUT_FINISH;
        o->token = -1;
        o->finish = why;
        o->usage.prompt_tokens = r->n_prompt;
        o->usage.cached_tokens = r->prefix.n_cached;
        o->usage.completion_tokens = r->n_tokens - r->n_prompt;
        o->usage.accepted_drafts = r->spec.n_accepted;
        o->usage.rejected_drafts = r->spec.n_verified - r->spec.n_accepted;
        o->ttft_s = r->ttft;
        r->pub.finished = true;
        s->st.n_finished[why]++;
        int n_gen = r->n_tokens - r->n_prompt;
        double span = r->ttft >= 0 && r->t_last > 0 ? r->t_last - (r->t_submit + r->ttft) : 0;
        log_debug("sched: req %llu finished at step %llu (%s): prompt %d, %d tokens generated, %.1f ms from the "
                  "first to the last (%.1f tok/s), drafts verified %d accepted %d",
                  (unsigned long long)r->id, (unsigned long long)s->n_planned, sched_finish_name(why), r->n_prompt,
                  n_gen, span * 1e3, n_gen > 1 && span > 0 ? (n_gen - 1) / span : 0.0, r->spec.n_verified,
                  r->spec.n_accepted);
        pthread_cond_broadcast(&r->pub.cv);
        if (r->p.on_output) r->p.on_output(r->p.out_arg);
    }
}

/* The engine drops its reference; frees the handle if the caller already released it. */
void sched_drop_locked(sched_req *r)
{
    r->pub.engine_held = false;
    if (r->pub.released) sched_req_destroy(r);
}

/* Ends r with why: releases its KV (engine thread), then publishes FINISH after the outputs
 * of the last step still waiting to be published (some may be r's). Caller holds mu. */
void sched_finish_locked(sched *s, sched_req *r, sched_finish why)
{
    sched_finish_release(s, r);
    sched_pub_flush_locked(s);
    sched_finish_push_locked(s, r, why);
}

void sched_running_remove(sched *s, int i)
{
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof s->running[0]);
    s->n_running--;
}

static void sched_wait_push_front(sched *s, sched_req *r)
{
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->n_waiting++;
}

static sched_req *sched_wait_pop(sched *s)
{
    sched_req *r = s->wait_head;
    if (!r) return NULL;
    s->wait_head = r->next;
    if (!s->wait_head) s->wait_tail = NULL;
    r->next = NULL;
    s->n_waiting--;
    return r;
}

/* Preempts running[i]: its blocks go back to the pool (full keyed blocks to the prefix tier,
 * so the resume usually attaches them again), it goes to the front of the queue. */
static void sched_preempt_locked(sched *s, int i)
{
    sched_req *r = s->running[i];
    sched_admit_keep_tails(s, r);   /* for its resume */
    kvpool_seq_free(s->pool, r->seq);
    r->seq = NULL;
    r->n_done = 0;
    sched_spec_release(s, r);
    r->state = REQ_QUEUED;
    r->prefix.first_run = false;
    r->load.started = false;   /* the resume may load its blocks back from the store */
    r->load.tail_looked = false;    /* and pin the tail it kept */
    sched_running_remove(s, i);
    sched_wait_push_front(s, r);
    s->st.n_preempted++;
}

static int sched_newest_running(const sched *s)
{
    int best = -1;
    for (int i = 0; i < s->n_running; i++)
        if (best < 0 || s->running[i]->admit_no > s->running[best]->admit_no) best = i;
    return best;
}

/* The prompt tokens r reads in a step that already holds x, with budget tokens left and a
 * step-time target (seconds; 0: none, or not learned yet): the rest of its prompt within the
 * budget, cut to what fits the target, but at least SCHED_TIME_MIN_CHUNK when the step reads
 * no prompt yet (progress); 0: the step is full. The planner's pass over the prompts and the
 * verify count's estimate of it (sched_spec.c) both ask this. */
int sched_prefill_chunk(const sched *s, const steptime_x *x, const sched_req *r, int budget, double target_s)
{
    int chunk = TM_MIN(r->n_tokens - r->n_done, budget);
    if (target_s > 0) {
        int fit = steptime_fit_tokens(&s->tm, x, r->n_done + chunk / 2.0, target_s);
        if (fit >= 0 && x->n_prefill == 0) fit = TM_MAX(fit, SCHED_TIME_MIN_CHUNK);
        if (fit >= 0) chunk = TM_MIN(chunk, fit);
    }
    return TM_MAX(chunk, 0);
}

/* Plans one step into s->batch. Returns the number of batch tokens (0: nothing to run).
 * Reserves KV for every planned position; preempts the newest request when the pool is
 * full. Under mu (preemption moves requests to the queue). */
static int sched_plan_locked(sched *s, int *n_reqs)
{
replan:
    sched_admit_share_locked(s);
    *n_reqs = 0;
    int n_tok = 0, budget = s->o.step_tokens, n_rows = 0;
    steptime_x *x = &s->plan_x;
    memset(x, 0, sizeof *x);
    double target_s = s->o.step_ms / 1e3;
    if (s->o.spec_sources) {
        /* verify rows come out of the budget the decodes leave, a minimal chunk kept for the
         * prompts being read */
        int n_dec = 0;
        bool prefill = false;
        for (int i = 0; i < s->n_running; i++) {
            int left = s->running[i]->n_tokens - s->running[i]->n_done;
            n_dec += left == 1;
            prefill |= left > 1 && !s->running[i]->prefix.share_wait;
        }
        sched_spec_plan_locked(s, budget - n_dec - (prefill ? SCHED_TIME_MIN_CHUNK : 0));
    }
    /* two passes: decodes (one token left) first, then prefill chunks, admission order */
    int n_dec_rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && n_tok == 0) {   /* no decode waits */
            budget = s->o.prefill_step_tokens;
            target_s = s->o.prefill_step_ms / 1e3;
        } else if (pass == 1) {   /* the room kept for verify rows is not the prompts' */
            budget = TM_MIN(budget, s->o.step_tokens - s->o.spec_room - n_dec_rows);
        }
        for (int i = 0; i < s->n_running && budget > 0; i++) {
            sched_req *r = s->running[i];
            int left = r->n_tokens - r->n_done;
            /* an encoder's inputs are all prompts: one token is no decode (pass 1's budget) */
            if ((pass == 0) != (left == 1 && !s->whole) || r->prefix.share_wait) continue;
            int k = pass == 0 && s->o.spec_sources ? TM_MIN(r->draft.n_verify, budget - 1) : 0;
            int chunk = pass == 0 ? 1 + k : sched_prefill_chunk(s, x, r, budget, target_s);
            if (pass == 1 && s->whole) {   /* an encoder's sequence is one step's, whole */
                if (left > budget) continue;   /* the next step's (sched_new bounds the prompt) */
                chunk = left;
            }
            if (chunk == 0) break;
            kvpool_status ks = kvpool_seq_reserve(s->pool, r->seq, r->n_done + chunk);
            if (ks != KVPOOL_OK && k > 0) {   /* no room for the drafts: decode plainly */
                k = 0;
                chunk = 1;
                ks = kvpool_seq_reserve(s->pool, r->seq, r->n_done + chunk);
            }
            if (ks != KVPOOL_OK) {
                if (sched_admit_tail_unpin_all(s)) goto replan;   /* running requests go first */
                int v = sched_newest_running(s);
                if (s->n_running == 1) {
                    /* alone and still no room: the pool is too small for this request */
                    sched_running_remove(s, 0);
                    sched_finish_locked(s, r, SCHED_FINISH_ERROR);
                    sched_drop_locked(r);
                } else {
                    sched_preempt_locked(s, v);
                }
                goto replan;
            }
            bool last = (pass == 0 || chunk == left) && !r->embd;   /* an embedding samples nothing */
            for (int j = 0; j < chunk; j++) {
                engine_tok *t = &s->batch[n_tok++];
                t->token = j == 0 || pass == 1 ? r->tokens[r->n_done + j] : r->draft.tok[j - 1];
                t->pos = r->n_done + j;
                t->seq = r->seq;
                t->want_logits = last && j >= chunk - 1 - k;   /* a decode's verify rows all do */
            }
            if (pass == 0) x->n_dec++, x->n_verify += k, n_dec_rows++;
            else x->n_prefill += chunk;
            x->depth += (double)chunk * r->n_done + (double)chunk * (chunk + 1) / 2;
            s->batch_req[*n_reqs] = r;
            s->batch_n[*n_reqs] = chunk;
            s->batch_row[*n_reqs] = last ? n_rows : -1;
            s->batch_k[*n_reqs] = k;
            s->batch_nd[*n_reqs] = pass == 0 ? r->draft.n : 0;
            s->batch_src[*n_reqs] = r->draft.src;
            n_rows += last ? 1 + k : 0;
            (*n_reqs)++;
            budget -= chunk;
        }
    }
    return n_tok;
}

bool sched_is_stop(const sched *s, const sched_req *r, int32_t tok)
{
    if (!r->p.ignore_eos)
        for (int i = 0; i < 4; i++)
            if (s->o.eos_ids[i] >= 0 && s->o.eos_ids[i] == tok) return true;
    for (int i = 0; i < r->p.n_stop_ids; i++)
        if (r->p.stop_ids[i] == tok) return true;
    return false;
}

/* -v: one line per step with its make-up and where its time went (milliseconds): planning
 * (admissions + batch, under mu), the engine step, bookkeeping + sampling, waiting for mu,
 * handing the outputs over (publishing them too when the publisher has not, or with
 * no_overlap). A decode waits for a whole step, so `step` with prefill chunks next to the
 * decode-only steps is what a long prompt costs the running streams. */
static void sched_log_step(const sched *s, int n_reqs, int n_tok, double ta, double tc, double t0, double t1,
                           double pred_s, double t2, double t3)
{
    int n_dec = 0, n_chunks = 0, max_chunk = 0, n_drafted = 0, n_verified = 0, n_accepted = 0;
    for (int i = 0; i < n_reqs; i++) {
        if (s->batch_n[i] - s->batch_k[i] == 1 && s->batch_row[i] >= 0) {
            n_dec++;
            n_drafted += s->batch_nd[i];
            n_verified += s->batch_k[i];
            n_accepted += s->batch_acc[i];
        } else {
            n_chunks++;
            max_chunk = TM_MAX(max_chunk, s->batch_n[i]);
        }
    }
    double t4 = util_now();
    log_debug("sched: step %d tokens (budget %d): %d decodes, %d prefill chunks (largest %d); running %d, "
              "waiting %d; drafts %d verified %d accepted %d; ms: plan %.2f step %.2f (predicted %.2f) sample %.2f "
              "lock %.2f handover %.2f", n_tok, s->o.step_tokens, n_dec, n_chunks, max_chunk, s->n_running, s->n_waiting,
              n_drafted, n_verified, n_accepted, (tc - ta) * 1e3, (t1 - t0) * 1e3, pred_s * 1e3, (t2 - t1) * 1e3,
              (t3 - t2) * 1e3, (t4 - t3) * 1e3);
}

/* The trace of a planned step: the step clock, and what each running request that has not
 * had its first token did in it. Under mu. */
static void sched_trace_plan(sched *s, int n_reqs, int n_tok)
{
    int n_dec = 0;
    for (int i = 0; i < n_reqs; i++) n_dec += s->batch_n[i] - s->batch_k[i] == 1 && s->batch_row[i] >= 0;
    s->n_planned++;
    s->tok_planned += (uint64_t)n_tok;
    s->dec_planned += (uint64_t)n_dec;
    for (int i = 0; i < s->n_running; i++) {
        sched_req *r = s->running[i];
        if (r->ttft >= 0) continue;
        int k = 0;
        while (k < n_reqs && s->batch_req[k] != r) k++;
        if (k < n_reqs) {
            r->tr.n_chunk++;
            r->tr.n_mixed += n_dec > 0;
            r->tr.n_computed += s->batch_n[k];
        } else if (r->prefix.share_wait) {
            r->tr.n_share++;
        } else {
            r->tr.n_starved++;
        }
    }
}

/* One step's make-up and timings (util_now() seconds), from planning to publishing. */
typedef struct {
    int n_reqs;                  /* requests in the batch (s->batch_req ...) */
    int n_tok;                   /* batch tokens; 0: nothing to run */
    engine_status est;           /* engine_step's result */
    double ta;                   /* planning starts (admissions, then the batch) */
    double tc;                   /* planning done */
    double t0, t1;               /* engine_step start, end */
    double pred_s;               /* the step-time model's prediction of t1 - t0 (0: not warm) */
    double t2;                   /* sampling done */
    double t3;                   /* mu taken back: publishing starts */
    double part[SCHED_GAP_N];    /* seconds of the gap after it, COMMIT to PUBLISH */
} sched_step;

/* Step 1, under mu: cancels and admissions, the batch, and the KV figures for /metrics. */
static void sched_step_plan_locked(sched *s, sched_step *st)
{
    st->ta = util_now();
    sched_admit_locked(s);
    st->n_reqs = 0;
    st->n_tok = s->n_running ? sched_plan_locked(s, &st->n_reqs) : 0;
    if (st->n_tok) sched_trace_plan(s, st->n_reqs, st->n_tok);
    st->tc = util_now();
    kvpool_stats ks;
    kvpool_get_stats(s->pool, &ks);
    s->st.kv_blocks_total = ks.n_blocks;
    s->st.kv_blocks_used = ks.n_pinned;
    s->st.kv_blocks_cached = ks.n_cached;
    s->st.kv_blocks_free = ks.n_free;
    s->st.n_queued = s->n_waiting;
    s->st.n_running = s->n_running;
}

/* Nothing to run, under mu: sleeps until new work (or a cancel, a ready load, stop). */
static void sched_idle_wait_locked(sched *s)
{
    s->t_prev_end = -1;
    if (s->n_running == 0 && (!s->wait_head || s->n_waiting == 0)) {
        pthread_cond_wait(&s->work_cv, &s->mu);
        return;
    }
    /* waiting requests that do not fit and nothing running can't happen (they error out in
     * admission); be safe and nap briefly */
    util_cond_wait_ms(&s->work_cv, &s->mu, 2);
}

/* Pools the states of r's n entries from batch entry t0 (its positions n_done ..) into r->embd:
 * the sum for MEAN (started again at position 0: a preempted request computes everything
 * again), the last prompt position's for LAST, the first's for CLS. Engine thread. */
static void sched_embed_pool(sched *s, sched_req *r, int t0, int n)
{
    if (r->p.embed == MODEL_POOL_LAST) {
        if (r->n_done + n == r->n_prompt) engine_hidden_normed(s->e, t0 + n - 1, r->embd);
        return;
    }
    if (r->p.embed == MODEL_POOL_CLS) {   /* the first position's (BERT's [CLS]) */
        if (r->n_done == 0) engine_hidden_normed(s->e, t0, r->embd);
        return;
    }
    if (r->n_done == 0) memset(r->embd, 0, (size_t)s->e_dim * sizeof *r->embd);
    float *row = r->embd + s->e_dim;   /* the scratch row after the sum */
    for (int j = 0; j < n; j++) {
        engine_hidden_normed(s->e, t0 + j, row);
        for (int d = 0; d < s->e_dim; d++) r->embd[d] += row[d];
    }
    if (r->n_done + n == r->n_prompt)
        for (int d = 0; d < s->e_dim; d++) r->embd[d] /= (float)r->n_prompt;
}

/* Step 2, without mu: the engine step, then the requests' committed blocks and sampling
 * (engine-thread state only). */
static void sched_step_run(sched *s, sched_step *st)
{
    st->t0 = util_now();
    if (s->t_prev_end >= 0) {   /* the gap since the previous step: counted at the next handoff */
        s->gap_run[SCHED_GAP_PLAN] = st->tc - st->ta;
        s->gap_run[SCHED_GAP_LAUNCH] = (st->ta - s->t_prev_pub) + (st->t0 - st->tc);
        for (int i = 0; i < SCHED_GAP_N; i++) s->gap_acc[i] += s->gap_run[i];
        s->gap_acc_s += st->t0 - s->t_prev_end;
    }
    memset(st->part, 0, sizeof st->part);
    engine_batch b = { .n_tokens = st->n_tok, .toks = s->batch };
    bool masks = sched_sample_masks_start(s, st->n_reqs);  /* overlapped with the step */
    st->pred_s = steptime_predict(&s->tm, &s->plan_x);
    st->est = engine_step(s->e, &b, s->logits);
    st->t1 = util_now();
    if (masks) sched_sample_masks_wait(s);
    if (st->est == ENGINE_OK) steptime_observe(&s->tm, &s->plan_x, st->t1 - st->t0);
    if (st->est == ENGINE_OK)
        s->main_step_s = s->main_step_s > 0 ? 0.9 * s->main_step_s + 0.1 * (st->t1 - st->t0) : st->t1 - st->t0;
    for (int i = 0, t0 = 0; i < st->n_reqs && st->est == ENGINE_OK; t0 += s->batch_n[i++]) {
        sched_req *r = s->batch_req[i];
        if (s->batch_k[i] > 0) continue;   /* verified below */
        if (r->embd) {
            sched_embed_pool(s, r, t0, s->batch_n[i]);
            r->n_done += s->batch_n[i];
            continue;   /* its blocks are of no use to another request: keyed by nothing */
        }
        r->n_done += s->batch_n[i];
        if (s->o.bio) blockio_set_write_class(s->o.bio, r->p.cache_class);   /* its blocks' TTL */
        kvpool_seq_commit_full_blocks(s->pool, r->seq, r->tokens, r->n_done);
    }
    if (st->est == ENGINE_OK && s->wc) sched_admit_window_put(s, st->n_reqs);
    double tk = util_now();
    st->part[SCHED_GAP_COMMIT] = tk - st->t1;
    if (st->est == ENGINE_OK) sched_sample_step(s, st->n_reqs);
    double ts = util_now();
    st->part[SCHED_GAP_SAMPLE] = ts - tk;
    /* Rollback of rejected drafts: a verifying request keeps the KV of its last token and of
     * the drafts accepted (the tokens before its last sampled one); the rows of rejected drafts
     * stay beyond n_done, where the next steps overwrite them, and no block is keyed from them:
     * only positions below n_done, whose tokens are final, complete blocks. */
    for (int i = 0; i < st->n_reqs && st->est == ENGINE_OK; i++) {
        sched_req *r = s->batch_req[i];
        int n = s->batch_ntok[i];
        /* the sampled tokens go into tokens now, beyond n_tokens until publishing counts them,
         * for the commit below and the drafts */
        memcpy(r->tokens + r->n_tokens, s->batch_tok + (size_t)i * s->tok_stride, (size_t)n * sizeof *r->tokens);
        if (s->batch_k[i] == 0) continue;
        r->n_done += n;
        if (s->o.bio) blockio_set_write_class(s->o.bio, r->p.cache_class);
        kvpool_seq_commit_full_blocks(s->pool, r->seq, r->tokens, r->n_done);
    }
    double tr = util_now();
    st->part[SCHED_GAP_COMMIT] += tr - ts;
    if (st->est == ENGINE_OK && s->o.spec_sources) sched_spec_draft(s, st->n_reqs);
    st->t2 = util_now();
    st->part[SCHED_GAP_DRAFT] = st->t2 - tr;
}

/* Ends running request r with why (under mu). */
static void sched_end_running_locked(sched *s, sched_req *r, sched_finish why)
{
    for (int j = 0; j < s->n_running; j++)
        if (s->running[j] == r) { sched_running_remove(s, j); break; }
    sched_finish_locked(s, r, why);
    sched_drop_locked(r);
}

/* Step 3a, under mu: the step's counters and duration histogram. */
static void sched_step_count_locked(sched *s, const sched_step *st)
{
    s->st.n_steps++;
    s->st.max_step_tokens = TM_MAX(s->st.max_step_tokens, st->n_tok);
    bool dec = false, pre = false;
    for (int i = 0; i < st->n_reqs; i++) {
        if (s->batch_n[i] - s->batch_k[i] == 1 && s->batch_row[i] >= 0) dec = true;
        else pre = true;
        if (s->batch_nd[i] > 0) s->st.spec_k_hist[s->batch_k[i]]++;
        if (s->batch_k[i] > 0 && st->est == ENGINE_OK) {
            s->st.spec_verified += (uint64_t)s->batch_k[i];
            s->st.spec_accepted += (uint64_t)s->batch_acc[i];
            s->st.spec_verifies++;
            s->st.spec_src_verified[s->batch_src[i]] += (uint64_t)s->batch_k[i];
            s->st.spec_src_accepted[s->batch_src[i]] += (uint64_t)s->batch_acc[i];
            s->batch_req[i]->spec.n_verified += s->batch_k[i];
            s->batch_req[i]->spec.n_accepted += s->batch_acc[i];
        }
    }
    if (dec && pre) s->st.n_mixed_steps++;
    for (int src = 0; src < SPEC_N_SRC; src++) {
        s->st.spec_drafted += s->drafted_run[src];
        s->st.spec_src_drafted[src] += s->drafted_run[src];
        s->drafted_run[src] = 0;
        s->st.spec_src_caught_up[src] += s->caught_run[src];
        s->caught_run[src] = 0;
    }
    s->st.step_model_n = s->tm.n_err;
    s->st.step_model_abs_err_s = s->tm.abs_err_s;
    s->st.step_model_rel_err = s->tm.rel_err;
    s->st.step_model_warm = steptime_warm(&s->tm);
    steptime_curve4(&s->tm, s->st.step_model_w);
    s->st.step_s += st->t1 - st->t0;
    s->st.gap_s += s->gap_acc_s;   /* the gaps before this step, with their parts */
    for (int i = 0; i < SCHED_GAP_N; i++) s->st.gap_part_s[i] += s->gap_acc[i];
    s->gap_acc_s = 0;
    memset(s->gap_acc, 0, sizeof s->gap_acc);
    sched_hist_add(&s->h_step, st->t1 - st->t0);
}

/* Step 3, under mu: counters, then the step's outputs handed to publishing. Every request
 * that got tokens counts them now (n_tokens) and, when its last one ends it (a stop id, its
 * length), leaves the running set and releases its KV now, so the next plan sees exactly what
 * it would have seen had everything been published first; its records and FINISH follow in
 * sched_pub_flush_locked. A failed engine step ends all of the step's requests with ERROR. */
static void sched_step_publish_locked(sched *s, sched_step *st)
{
    st->t3 = util_now();
    sched_step_count_locked(s, st);
    if (st->est != ENGINE_OK) {
        log_error("sched: engine_step failed: %s", engine_status_name(st->est));
        for (int i = 0; i < st->n_reqs; i++) sched_end_running_locked(s, s->batch_req[i], SCHED_FINISH_ERROR);
        s->t_prev_end = -1;
        return;
    }
    double tp = util_now();
    sched_pub_flush_locked(s);   /* the previous step's, if the publisher has not got to them */
    double tp1 = util_now();
    st->part[SCHED_GAP_PUBLISH] = tp1 - tp;
    bool any_lp = false;
    for (int i = 0; i < st->n_reqs; i++) {
        sched_req *r = s->batch_req[i];
        any_lp |= r->p.logprobs && s->batch_ntok[i] > 0;
        int n = s->batch_ntok[i];
        s->pub_req[i] = r;
        s->pub_ntok[i] = n;
        s->pub_row[i] = s->batch_row[i];
        s->pub_prefill[i] = n == 0 ? s->batch_n[i] : s->batch_n[i] - 1 - s->batch_k[i];
        s->pub_end[i] = SCHED_FINISH_NONE;
        if (r->embd && r->n_done >= r->n_prompt) {   /* its vector is complete */
            s->pub_end[i] = SCHED_FINISH_STOP;
            for (int j = 0; j < s->n_running; j++)
                if (s->running[j] == r) { sched_running_remove(s, j); break; }
            sched_finish_release(s, r);
            continue;
        }
        if (n == 0) continue;
        r->n_tokens += n;   /* its tokens are in r->tokens already (sched_step_run) */
        if (sched_is_stop(s, r, r->tokens[r->n_tokens - 1])) s->pub_end[i] = SCHED_FINISH_STOP;
        else if (r->n_tokens - r->n_prompt >= r->max_gen || r->n_tokens >= r->cap) s->pub_end[i] = SCHED_FINISH_LENGTH;
        if (s->pub_end[i] != SCHED_FINISH_NONE) {
            for (int j = 0; j < s->n_running; j++)
                if (s->running[j] == r) { sched_running_remove(s, j); break; }
            sched_finish_release(s, r);
        }
    }
    /* the step's tokens and log-probs change hands: the next step samples into the others */
    int32_t *tok = s->pub_tok;
    s->pub_tok = s->batch_tok;
    s->batch_tok = tok;
    sched_output *out = s->pub_out;
    s->pub_out = s->batch_out;
    s->batch_out = out;
    s->pub_lg = s->logits;
    if (!s->o.no_overlap) {   /* the next step computes into the twin */
        s->logits = s->logits_twin;
        s->logits_twin = (float *)s->pub_lg;
    }
    sched_pub_lp_move(s, -1, any_lp ? SCHED_LP_PENDING : SCHED_LP_DONE);
    s->pub_n_reqs = st->n_reqs;
    s->pub_t = util_now();
    s->pub_pending = true;
    double tf = util_now();
    if (s->o.no_overlap) sched_pub_flush_locked(s);
    else s->pub_wake = true;   /* sched_pub_wake, once mu is free */
    if (s->o.no_overlap) st->part[SCHED_GAP_PUBLISH] += util_now() - tf;
    s->t_prev_end = st->t1;  /* the gap: sampling, handing over, planning the next step */
    s->t_prev_pub = util_now();
    memcpy(s->gap_run, st->part, sizeof s->gap_run);
    s->gap_run[SCHED_GAP_LOCK] = st->t3 - st->t2;
    s->gap_run[SCHED_GAP_HANDOFF] = s->t_prev_pub - st->t3 - st->part[SCHED_GAP_PUBLISH];
    if (util_log_level <= LOG_LEVEL_DEBUG)
        sched_log_step(s, st->n_reqs, st->n_tok, st->ta, st->tc, st->t0, st->t1, st->pred_s, st->t2, st->t3);
}

/* sched_free: everything still queued or running ends CANCELLED (under mu). */
static void sched_end_remaining_locked(sched *s)
{
    while (s->n_running > 0) {
        sched_req *r = s->running[s->n_running - 1];
        s->n_running--;
        sched_finish_locked(s, r, SCHED_FINISH_CANCELLED);
        sched_drop_locked(r);
    }
    sched_req *r;
    while ((r = sched_wait_pop(s))) {
        sched_finish_locked(s, r, SCHED_FINISH_CANCELLED);
        sched_drop_locked(r);
    }
}

/* The engine thread: plan (under mu), run (without it), hand over (under mu), until stop;
 * then whatever is pending is published and what is left ends CANCELLED. */
static void *sched_thread(void *arg)
{
    sched *s = arg;
    s->t_prev_end = -1;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        sched_step st;
        sched_step_plan_locked(s, &st);
        if (st.n_tok == 0) {
            sched_pub_wake(s);
            sched_idle_wait_locked(s);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        sched_pub_wake(s);
        sched_step_run(s, &st);
        pthread_mutex_lock(&s->mu);
        sched_step_publish_locked(s, &st);
    }
    sched_pub_flush_locked(s);
    sched_end_remaining_locked(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- public ---- */

/* names[v], or "?" for a value outside the table or without a name. */
static const char *sched_enum_name(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n && names[v] ? names[v] : "?";
}

const char *sched_status_name(sched_status st)
{
    static const char *const names[] = {
        [SCHED_OK] = "ok",
        [SCHED_ERR_QUEUE_FULL] = "queue full",
        [SCHED_ERR_TOO_LONG] = "prompt too long",
        [SCHED_ERR_ARG] = "bad argument",
        [SCHED_ERR_NOMEM] = "out of memory",
        [SCHED_ERR_STOPPED] = "shutting down",
    };
    return sched_enum_name(names, TM_ARRAY_LEN(names), (int)st);
}

const char *sched_gap_part_name(sched_gap_part p)
{
    static const char *const names[SCHED_GAP_N] = {
        [SCHED_GAP_COMMIT] = "commit",
        [SCHED_GAP_SAMPLE] = "sample",
        [SCHED_GAP_DRAFT] = "draft",
        [SCHED_GAP_LOCK] = "lock",
        [SCHED_GAP_PUBLISH] = "publish",
        [SCHED_GAP_HANDOFF] = "handoff",
        [SCHED_GAP_PLAN] = "plan",
        [SCHED_GAP_LAUNCH] = "launch",
    };
    return sched_enum_name(names, TM_ARRAY_LEN(names), (int)p);
}

const char *sched_finish_name(sched_finish f)
{
    static const char *const names[] = {
        [SCHED_FINISH_NONE] = "none",
        [SCHED_FINISH_STOP] = "stop",
        [SCHED_FINISH_LENGTH] = "length",
        [SCHED_FINISH_CANCELLED] = "cancelled",
        [SCHED_FINISH_ERROR] = "error",
        [SCHED_FINISH_ABORTED] = "aborted",
        [SCHED_FINISH_REFUSED] = "refused",
        [SCHED_FINISH_UNAVAILABLE] = "unavailable",
    };
    return sched_enum_name(names, TM_ARRAY_LEN(names), (int)f);
}

int sched_default_step_tokens(int max_seqs)
{
    return (max_seqs > 0 ? max_seqs : 16) + SCHED_PREFILL_CHUNK;
}

/* blockio's ready hook (an I/O thread): a store load finished, admission may proceed. */
static void sched_load_ready(void *arg)
{
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

/* The options as the scheduler runs them: defaults filled in, bounds of the engine's step and
 * the model's state applied, the drafters kept that fit the model. False: a drafter does not
 * fit (another vocabulary, or an MTP layer of another width), or two drafters of one kind. */
static bool sched_opts_resolve(engine *e, sched_opts *o)
{
    const model *m = engine_model(e);
    if (o->max_seqs <= 0) o->max_seqs = 16;
    if (o->max_queue <= 0) o->max_queue = 256;
    int mb = engine_max_batch(e);
    if (o->step_tokens <= 0) o->step_tokens = sched_default_step_tokens(o->max_seqs);
    if (o->step_tokens > mb) o->step_tokens = mb;
    if (o->max_seqs > o->step_tokens) o->max_seqs = o->step_tokens;
    o->spec_room = o->spec_sources ? TM_MAX(0, TM_MIN(o->spec_room, o->step_tokens - o->max_seqs - 1)) : 0;
    if (o->prefill_step_tokens <= 0) o->prefill_step_tokens = SCHED_PREFILL_STEP;
    o->prefill_step_tokens = TM_MAX(o->step_tokens, TM_MIN(o->prefill_step_tokens, mb));
    if (!(o->step_ms > 0)) o->step_ms = 0;
    if (!(o->prefill_step_ms > 0)) o->prefill_step_ms = o->step_ms * SCHED_PREFILL_STEP_MS_FACTOR;
    o->prefill_step_ms = TM_MAX(o->prefill_step_ms, o->step_ms);
    if (o->n_ctx <= 0) o->n_ctx = m->hp.n_ctx_train;
    /* an encoder computes a sequence whole in one step, within its position table, and
     * generates nothing: a prompt of at most min(n_ctx, n_ctx_train, an empty step's budget)
     * tokens (n_ctx bounds a prompt exclusive, keeping room for a generated token) */
    if (m->hp.bidirectional) o->n_ctx = TM_MIN(o->n_ctx, TM_MIN(m->hp.n_ctx_train, o->prefill_step_tokens)) + 1;
    if (o->spec_max <= 0) o->spec_max = SPEC_DEFAULT_MAX;
    o->spec_max = TM_MIN(o->spec_max, SPEC_MAX_K);
    /* window layers keep KVPOOL_RING_SPARE slots beyond the window: a step goes back at most
     * that many positions, which is K when all K drafts are rejected */
    if (kvpool_n_window_layers(engine_kvpool(e)) > 0) o->spec_max = TM_MIN(o->spec_max, KVPOOL_RING_SPARE);
    /* a recurrent state cannot go back to before a rejected draft: no speculation */
    if (kvpool_state_bytes(engine_kvpool(e))) o->spec_sources = 0, o->spec_room = 0;
    o->spec_fixed = TM_MIN(TM_MAX(o->spec_fixed, 0), o->spec_max);
    if (o->draft && o->dflash) {
        return false;
    }
    if (!o->draft && !o->dflash) o->spec_sources &= ~SPEC_SRC_MODEL;
    if (!o->mtp) o->spec_sources &= ~SPEC_SRC_MTP;
    if (!(o->spec_sources & SPEC_SRC_MODEL)) o->draft = NULL, o->dflash = NULL;
    /* a dflash drafter reads the inputs of some of the model's layers at every step */
    if (o->dflash && !engine_capture_layers(e, engine_dflash_model(o->dflash)->tl, engine_dflash_model(o->dflash)->n_tl)) {
        return false;
    }
    if (!(o->spec_sources & SPEC_SRC_MTP)) o->mtp = NULL;
    /* a drafter's ids are the target's; an MTP layer's engine continues the model's hidden states */
    if ((o->draft && (engine_model(o->draft)->hp.n_vocab != m->hp.n_vocab || engine_model(o->draft)->mtp_view)) ||
        (o->mtp && (engine_model(o->mtp)->hp.n_vocab != m->hp.n_vocab || !engine_model(o->mtp)->mtp_view ||
                   engine_hidden_dim(o->mtp) != engine_hidden_dim(e)))) {
        return false;
    }
    return true;
}

sched_status sched_new(engine *e, const sched_opts *opts, sched **out)
{
    *out = NULL;
    sched *s = xcalloc(1, sizeof *s);
    s->e = e;
    s->pool = engine_kvpool(e);
    const model *m = engine_model(e);
    s->n_vocab = m->hp.n_vocab;
    s->e_dim = m->hp.dim;
    s->whole = m->hp.bidirectional;
    sched_opts o = opts ? *opts : (sched_opts){ .eos_ids = { -1, -1, -1, -1 } };
    if (!sched_opts_resolve(e, &o)) {
        free(s);
        return SCHED_ERR_ARG;
    }
    s->o = o;
    /* the window cache: the window layers' states, or a recurrent model's, at block ends */
    if (kvpool_n_window_layers(s->pool) > 0 || kvpool_state_bytes(s->pool) > 0) {
        size_t sb = kvpool_n_window_layers(s->pool) > 0 ? kvpool_window_state_bytes(s->pool) : kvpool_state_bytes(s->pool);
        wincache_opts wo = { .entry_bytes = sb, .ttl_s = o.window_ttl_s,
                             .max_bytes = (size_t)(o.window_mib < 0 ? 0 : (o.window_mib == 0 ? 1024 : o.window_mib) * 1048576.0) };
        s->wc = wincache_new(&wo);
        s->wstate = malloc(sb);
        if (!s->wc || !s->wstate) {
            wincache_free(s->wc);
            free(s->wstate);
            free(s);
            return SCHED_ERR_NOMEM;
        }
        s->st.window = true;
    }
    s->st.step_tokens = o.step_tokens;
    s->st.prefill_step_tokens = o.prefill_step_tokens;
    s->st.step_ms = o.step_ms;
    s->st.prefill_step_ms = o.prefill_step_ms;
    steptime_init(&s->tm);
    s->running = xcalloc((size_t)o.max_seqs, sizeof *s->running);
    s->batch = xcalloc((size_t)o.prefill_step_tokens, sizeof *s->batch);
    s->batch_req = xcalloc((size_t)o.max_seqs, sizeof *s->batch_req);
    s->batch_n = xcalloc((size_t)o.max_seqs, sizeof *s->batch_n);
    s->batch_row = xcalloc((size_t)o.max_seqs, sizeof *s->batch_row);
    s->tok_stride = o.spec_sources ? 1 + o.spec_max : 1;
    s->batch_k = xcalloc((size_t)o.max_seqs, sizeof *s->batch_k);
    s->batch_nd = xcalloc((size_t)o.max_seqs, sizeof *s->batch_nd);
    s->batch_src = xcalloc((size_t)o.max_seqs, sizeof *s->batch_src);
    s->batch_ntok = xcalloc((size_t)o.max_seqs, sizeof *s->batch_ntok);
    s->batch_acc = xcalloc((size_t)o.max_seqs, sizeof *s->batch_acc);
    s->batch_tok = xcalloc((size_t)o.max_seqs * s->tok_stride, sizeof *s->batch_tok);
    s->batch_out = xcalloc((size_t)o.max_seqs * s->tok_stride, sizeof *s->batch_out);
    s->pub_req = xcalloc((size_t)o.max_seqs, sizeof *s->pub_req);
    s->pub_ntok = xcalloc((size_t)o.max_seqs, sizeof *s->pub_ntok);
    s->pub_prefill = xcalloc((size_t)o.max_seqs, sizeof *s->pub_prefill);
    s->pub_end = xcalloc((size_t)o.max_seqs, sizeof *s->pub_end);
    s->pub_tok = xcalloc((size_t)o.max_seqs * s->tok_stride, sizeof *s->pub_tok);
    s->pub_out = xcalloc((size_t)o.max_seqs * s->tok_stride, sizeof *s->pub_out);
    s->pub_row = xcalloc((size_t)o.max_seqs, sizeof *s->pub_row);
    if (o.spec_sources) {
        s->chooser = spec_chooser_new(o.max_seqs);
        for (int i = 0; i < SPEC_N_SRC; i++) spec_seq_init_shared(&s->spec_all[i]);
        engine *de[SCHED_N_DRAFTERS] = { o.draft, o.mtp };
        for (int d = 0; d < SCHED_N_DRAFTERS; d++) {
            sched_drafter *dr = &s->dr[d];
            dr->e = de[d];
            spec_probe_init(&dr->probe);
            dr->probe_t = util_now();
            const model *dm = de[d] ? engine_model(de[d]) : d == 0 && o.dflash ? engine_dflash_drafter(o.dflash) : NULL;
            if (!dm) continue;
            dr->sd = de[d] ? specdraft_new(de[d], o.max_seqs)
                           : specdraft_new_dflash(o.dflash, o.max_seqs, o.dflash_conf, o.spec_p_min);
            size_t tb = model_active_weight_bytes(engine_model(e));
            dr->cost_floor = tb ? (double)model_active_weight_bytes(dm) / (double)tb : 0;
            dr->q = xcalloc((size_t)o.max_seqs, sizeof *dr->q);
            dr->q_req = xcalloc((size_t)o.max_seqs, sizeof *dr->q_req);
        }
        s->spec_gains = xcalloc((size_t)o.max_seqs * SPEC_MAX_K, sizeof *s->spec_gains);
        s->spec_nd = xcalloc((size_t)o.max_seqs, sizeof *s->spec_nd);
        s->spec_k = xcalloc((size_t)o.max_seqs, sizeof *s->spec_k);
        s->spec_req = xcalloc((size_t)o.max_seqs, sizeof *s->spec_req);
    }
    size_t logits_sz = (size_t)o.max_seqs * s->tok_stride * (size_t)s->n_vocab * sizeof(float);
    s->logits = malloc(logits_sz);
    if (!o.no_overlap) s->logits_twin = malloc(logits_sz);
    if (!s->logits || (!o.no_overlap && !s->logits_twin) || (o.spec_sources && !s->chooser) ||
        ((o.draft || o.dflash) && !s->dr[0].sd) || (o.mtp && !s->dr[1].sd)) {
        sched_free(s);
        return SCHED_ERR_NOMEM;
    }
    /* one sequence's rows of both buffers touched now: a new process's first request (alone,
     * in the one and then the other buffer) takes no page faults writing its logits. The rest
     * is touched as batches grow (all of it would be max_seqs x tok_stride x the vocabulary). */
    size_t first_rows = (size_t)s->tok_stride * (size_t)s->n_vocab * sizeof(float);
    memset(s->logits, 0, first_rows);
    if (s->logits_twin) memset(s->logits_twin, 0, first_rows);
    pthread_mutex_init(&s->mu, NULL);
    util_cond_init(&s->work_cv);
    util_cond_init(&s->idle_cv);   /* sched_wait_idle's deadline is on the monotonic clock */
    pthread_cond_init(&s->pub_cv, NULL);
    pthread_mutex_init(&s->lp_mu, NULL);
    pthread_cond_init(&s->lp_cv, NULL);
    if (!o.no_overlap) s->pub_started = pthread_create(&s->publisher, NULL, sched_pub_thread, s) == 0;
    if (!s->pub_started) s->o.no_overlap = true;   /* no thread: the engine thread publishes */
    sched_sample_start(s, TM_MIN(engine_n_threads(e), 16) - 1);
    if (pthread_create(&s->thread, NULL, sched_thread, s) != 0) {
        sched_sample_stop(s);
        sched_pub_stop(s);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        pthread_cond_destroy(&s->idle_cv);
        free(s->logits);
        s->logits = NULL;   /* no thread to stop */
        sched_free(s);
        return SCHED_ERR_NOMEM;
    }
    if (o.bio) blockio_set_ready_hook(o.bio, sched_load_ready, s);
    *out = s;
    return SCHED_OK;
}

/* Marks r to end with why before its next step, unless it ended or was cancelled already. */
static void sched_cancel_locked(sched *s, sched_req *r, sched_finish why)
{
    if (r->pub.finished || r->pub.cancel) return;
    r->pub.cancel = true;
    r->pub.cancel_why = why;
    pthread_cond_signal(&s->work_cv);
}

/* Refuses new submissions and ends every queued and running request with why. */
static void sched_end_all(sched *s, sched_finish why)
{
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    for (int i = 0; i < s->n_running; i++) sched_cancel_locked(s, s->running[i], why);
    for (sched_req *r = s->wait_head; r; r = r->next) sched_cancel_locked(s, r, why);
    pthread_mutex_unlock(&s->mu);
}

void sched_shutdown(sched *s) { sched_end_all(s, SCHED_FINISH_CANCELLED); }

void sched_abort(sched *s) { sched_end_all(s, SCHED_FINISH_ABORTED); }

void sched_drain(sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_mutex_unlock(&s->mu);
}

bool sched_draining(sched *s)
{
    pthread_mutex_lock(&s->mu);
    bool d = s->shutdown;
    pthread_mutex_unlock(&s->mu);
    return d;
}

int sched_wait_idle(sched *s, int timeout_ms)
{
    struct timespec ts;
    if (timeout_ms > 0) util_deadline(&ts, CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (s->n_live > 0 && timeout_ms != 0) {
        if (timeout_ms < 0) pthread_cond_wait(&s->idle_cv, &s->mu);
        else if (!util_cond_wait_until(&s->idle_cv, &s->mu, &ts)) break;
    }
    int n = s->n_live;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void sched_free(sched *s)
{
    if (!s) return;
    if (s->o.bio && s->logits) blockio_set_ready_hook(s->o.bio, NULL, NULL);   /* before mu goes */
    if (s->logits) {  /* thread started */
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        s->shutdown = true;
        pthread_cond_signal(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        sched_pub_stop(s);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        pthread_cond_destroy(&s->idle_cv);
        sched_sample_stop(s);
    }
    free(s->running);
    free(s->batch);
    free(s->batch_req);
    free(s->batch_n);
    free(s->batch_row);
    free(s->batch_k);
    free(s->batch_nd);
    free(s->batch_src);
    free(s->batch_ntok);
    free(s->batch_acc);
    free(s->batch_tok);
    free(s->batch_out);
    free(s->pub_req);
    free(s->pub_ntok);
    free(s->pub_prefill);
    free(s->pub_end);
    free(s->pub_tok);
    free(s->pub_out);
    free(s->pub_row);
    free(s->logits_twin);
    free(s->logits);
    wincache_free(s->wc);
    free(s->wstate);
    spec_chooser_free(s->chooser);
    for (int d = 0; d < SCHED_N_DRAFTERS; d++) {
        specdraft_free(s->dr[d].sd);
        free(s->dr[d].q);
        free(s->dr[d].q_req);
    }
    free(s->spec_gains);
    free(s->spec_nd);
    free(s->spec_k);
    free(s->spec_req);
    free(s);
}

int sched_n_ctx(const sched *s) { return s->o.n_ctx; }

sched_status sched_submit(sched *s, const sched_params *p, sched_req **out)
{
    *out = NULL;
    if (!p || !p->prompt || p->n_prompt < 1 || p->n_stop_ids < 0 || p->n_stop_ids > SCHED_MAX_STOP_IDS ||
        p->top_logprobs < 0 || p->top_logprobs > SCHED_MAX_TOP_LOGPROBS)
        return SCHED_ERR_ARG;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->n_vocab) return SCHED_ERR_ARG;
    if (p->n_prompt >= s->o.n_ctx) return SCHED_ERR_TOO_LONG;
    if (p->embed != MODEL_POOL_NONE && p->embed != MODEL_POOL_MEAN && p->embed != MODEL_POOL_LAST &&
        p->embed != MODEL_POOL_CLS)
        return SCHED_ERR_ARG;
    if (engine_model(s->e)->hp.bidirectional && !p->embed) return SCHED_ERR_ARG;   /* an encoder has no logits */
    if (p->n_gen < 0 || (p->n_gen > 0 && !p->gen) || p->n_sampled < 0) return SCHED_ERR_ARG;
    if (p->think_budget < 0 || (p->think_budget > 0 && p->think_end >= s->n_vocab)) return SCHED_ERR_ARG;
    for (int i = 0; i < p->n_gen; i++)
        if (p->gen[i] < 0 || p->gen[i] >= s->n_vocab) return SCHED_ERR_ARG;
    if (p->n_gen > 0 && p->n_prompt + p->n_gen >= s->o.n_ctx) return SCHED_ERR_TOO_LONG;
    if (p->n_gen > 0 && p->max_tokens > 0 && p->n_gen >= p->max_tokens) return SCHED_ERR_ARG;
    if (p->grammar && (!p->grammar_vocab || grammar_vocab_n(p->grammar_vocab) != s->n_vocab ||
                       grammar_max_token(p->grammar) >= s->n_vocab ||
                       (p->grammar_lazy && (p->grammar_trigger < 0 || p->grammar_trigger >= s->n_vocab))))
        return SCHED_ERR_ARG;

    sched_req *r = calloc(1, sizeof *r);
    if (!r) return SCHED_ERR_NOMEM;
    r->s = s;
    r->p = *p;
    r->p.prompt = NULL;
    r->p.cache_salt = NULL;
    r->p.gen = NULL;
    if (p->cache_salt && *p->cache_salt) {
        blockkey_root(p->cache_salt, strlen(p->cache_salt), r->prefix.root);
        r->prefix.salted = true;
    }
    r->n_prompt = p->n_prompt;
    r->n_tokens = p->n_prompt;
    int room = s->o.n_ctx - p->n_prompt;
    r->max_gen = p->embed ? 0 : p->max_tokens > 0 ? TM_MIN(p->max_tokens, room) : room;
    r->cap = p->n_prompt + r->max_gen;
    r->tokens = malloc((size_t)r->cap * sizeof *r->tokens);
    r->prefix.chain = malloc(((size_t)r->cap / KVPOOL_BLOCK + 1) * sizeof *r->prefix.chain);
    r->samp.smp = sample_new(s->n_vocab, &p->sample);
    if (p->embed) {
        /* the sum, then a row of scratch; a root of its own: it attaches no one's blocks */
        r->embd = calloc(2 * (size_t)s->e_dim, sizeof *r->embd);
        uint64_t nonce[2] = { (uint64_t)(uintptr_t)r, (uint64_t)(util_now() * 1e9) };
        blockkey_root((const char *)nonce, sizeof nonce, r->prefix.root);
        r->prefix.salted = true;
    }
    if (!r->tokens || !r->prefix.chain || !r->samp.smp || (p->embed && !r->embd)) {
        sched_req_destroy(r);
        return SCHED_ERR_NOMEM;
    }
    memcpy(r->tokens, p->prompt, (size_t)p->n_prompt * sizeof *r->tokens);
    for (int i = 0; i < p->n_prompt; i++) sample_accept(r->samp.smp, p->prompt[i]);
    r->samp.in_think = p->think_open;
    r->p.grammar = NULL;  /* the matcher holds the reference */
    if (p->grammar) {
        int32_t stops[4 + SCHED_MAX_STOP_IDS];
        int n_stops = 0;
        for (int i = 0; i < 4 && !p->ignore_eos; i++)
            if (s->o.eos_ids[i] >= 0) stops[n_stops++] = s->o.eos_ids[i];
        for (int i = 0; i < p->n_stop_ids; i++) stops[n_stops++] = p->stop_ids[i];
        r->samp.gm = grammar_match_new(p->grammar, p->grammar_vocab, stops, n_stops);
        r->samp.g_on = !p->grammar_lazy;
        /* the copy drafts are checked on, made here: the engine thread allocates nothing */
        if (s->o.spec_sources) r->draft.gm = grammar_match_clone(r->samp.gm);
    }
    if (p->n_gen > 0) {   /* continue a request generated elsewhere: same sampler state */
        memcpy(r->tokens + p->n_prompt, p->gen, (size_t)p->n_gen * sizeof *r->tokens);
        r->n_tokens += p->n_gen;
        for (int i = 0; i < p->n_gen; i++) {
            sample_accept(r->samp.smp, p->gen[i]);
            if (!sched_sample_grammar_track(r, p->gen[i])) {
                sched_req_destroy(r);
                return SCHED_ERR_ARG;  /* the tokens generated elsewhere leave the grammar */
            }
            sched_sample_think_track(r, p->gen[i]);
        }
        sample_skip_draws(r->samp.smp, p->n_sampled);
    }
    r->ttft = -1;
    for (int i = 0; i < SPEC_N_SRC; i++) spec_seq_init(&r->spec.src[i]);
    spec_probe_init(&r->spec.probe);
    r->draft.at = -1;
    r->t_submit = util_now();
    r->pub.engine_held = true;
    util_cond_init(&r->pub.cv);

    pthread_mutex_lock(&s->mu);
    if (s->shutdown) {
        pthread_mutex_unlock(&s->mu);
        sched_req_destroy(r);
        return SCHED_ERR_STOPPED;
    }
    if (s->n_waiting >= s->o.max_queue) {
        s->st.n_rejected++;
        pthread_mutex_unlock(&s->mu);
        sched_req_destroy(r);
        return SCHED_ERR_QUEUE_FULL;
    }
    r->id = ++s->next_id;
    r->state = REQ_QUEUED;
    r->tr.step0 = s->n_planned;
    r->tr.tok0 = s->tok_planned;
    r->tr.dec0 = s->dec_planned;
    if (s->wait_tail) s->wait_tail->next = r; else s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    s->n_live++;
    s->st.n_requests++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return SCHED_OK;
}

int sched_poll(sched_req *r, sched_output *out, int max, int timeout_ms)
{
    sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    if (r->pub.ring_n == 0 && !r->pub.finish_returned && timeout_ms != 0) {
        struct timespec ts;
        if (timeout_ms > 0) util_deadline(&ts, CLOCK_MONOTONIC, timeout_ms);
        while (r->pub.ring_n == 0) {
            if (timeout_ms < 0) pthread_cond_wait(&r->pub.cv, &s->mu);
            else if (!util_cond_wait_until(&r->pub.cv, &s->mu, &ts)) break;
        }
    }
    int n = 0;
    while (n < max && r->pub.ring_n > 0) {
        out[n] = r->pub.ring[r->pub.ring_head];
        r->pub.ring_head = (r->pub.ring_head + 1) % r->pub.ring_cap;
        r->pub.ring_n--;
        if (out[n].kind == SCHED_OUT_FINISH) r->pub.finish_returned = true;
        n++;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

const float *sched_embedding(const sched_req *r)
{
    return r->embd && r->pub.finish_returned && r->n_done >= r->n_prompt ? r->embd : NULL;
}

bool sched_done(const sched_req *r)
{
    sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    bool d = r->pub.finish_returned;
    pthread_mutex_unlock(&s->mu);
    return d;
}

void sched_cancel(sched_req *r)
{
    sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    sched_cancel_locked(s, r, SCHED_FINISH_CANCELLED);
    pthread_mutex_unlock(&s->mu);
}

void sched_release(sched_req *r)
{
    if (!r) return;
    sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    r->pub.released = true;
    if (r->pub.engine_held) {
        sched_cancel_locked(s, r, SCHED_FINISH_CANCELLED);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    pthread_mutex_unlock(&s->mu);
    sched_req_destroy(r);
}

engine *sched_engine(sched *s) { return s->e; }

wincache *sched_wincache(sched *s) { return s->wc; }

void sched_get_stats(sched *s, sched_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->n_queued = s->n_waiting;
    pthread_mutex_unlock(&s->mu);
    if (s->o.bio) {
        blockio_stats bs;
        blockio_get_stats(s->o.bio, &bs);
        st->store_blocks_loaded = bs.n_load_blocks;
        st->store_blocks_hit = bs.n_appended;
        st->store_writes = bs.n_written;
        st->store_writes_dropped = bs.n_write_dropped;
        st->store_writes_failed = bs.n_write_failed;
        st->store_blocks_shared = bs.n_load_shared;
        st->store_touches = bs.n_touched;
        st->store_load_s = bs.load_s;
        st->store_fill_wait_s = bs.fill_wait_s;
    }
    if (s->wc) {
        wincache_stats ws;
        wincache_get_stats(s->wc, &ws);
        st->window_entries = ws.n_entries;
        st->window_bytes = ws.bytes;
        st->window_puts = ws.n_puts;
        st->window_hits = ws.n_hits;
        st->window_misses = ws.n_misses;
        st->window_expired = ws.n_expired;
        st->window_evicted = ws.n_evicted;
        st->window_replay_exact = ws.n_replay_exact;
        st->window_replay_bounded = ws.n_replay_bounded;
        st->window_replay_tokens = ws.n_replay_tokens;
        st->window_fetches = ws.n_fetches;
    }
}

void sched_get_hists(sched *s, sched_hist *ttft, sched_hist *itl, sched_hist *step, sched_hist *load_wait)
{
    pthread_mutex_lock(&s->mu);
    if (load_wait) *load_wait = s->h_load_wait;
    if (ttft) *ttft = s->h_ttft;
    if (itl) *itl = s->h_itl;
    if (step) *step = s->h_step;
    pthread_mutex_unlock(&s->mu);
}
