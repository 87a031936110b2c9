/*
 * sched_sample: the scheduler's sampling (the step loop: docs/architecture.md, "Scheduler").
 * A step's requests are split by ith/nth over the sampling pool (util/threadpool: the engine
 * thread is ith 0, the workers sleep between steps); each request's sampler, grammar and think
 * state are its own, so the split changes no result. While the engine computes a step, the
 * pool's workers alone compute the grammar masks its constrained requests will need
 * (threadpool_start / threadpool_wait). A request verifying drafts samples its verify rows in
 * order here (the acceptance rule); sched.c commits what was accepted. Engine thread and the
 * pool's workers; the pool's rounds order their writes.
 */
#include "engine/sched_int.h"

#include "util/threadpool.h"
#include "util/util.h"

/* Fewest logits (rows x vocabulary) a step's sampling splits over the sampling workers:
 * below it, waking them costs more than the rows (a small vocabulary's argmax takes
 * microseconds; a wake-up as long, and far longer when other processes hold the cores) */
#define SCHED_SAMPLE_SPLIT_MIN (1 << 18)

/* Follows think blocks in the output for the reasoning budget and the grammar, which leaves
 * them free (p.think_*). */
void sched_sample_think_track(sched_req *r, int32_t tok)
{
    if (r->p.think_budget <= 0 && !r->samp.gm) return;
    if (!r->samp.in_think && tok == r->p.think_start && tok >= 0) r->samp.in_think = true;
    else if (r->samp.in_think && tok == r->p.think_end && tok >= 0) r->samp.in_think = false;
    else if (r->samp.in_think) r->samp.n_think++;
}

/* Feeds a generated token to the request's grammar: outside think blocks, a bound token
 * advances the matcher (false: the grammar does not allow it) and ends a lazy grammar's
 * document when nothing can follow; a free one may be a lazy grammar's trigger. Before
 * sched_sample_think_track (the token's own think state is the one before it). */
bool sched_sample_grammar_track(sched_req *r, int32_t tok)
{
    if (!r->samp.gm || r->samp.in_think) return true;
    if (r->samp.g_on) {
        if (!grammar_match_accept(r->samp.gm, tok)) return false;
        if (r->p.grammar_lazy && grammar_match_done(r->samp.gm)) {
            grammar_match_reset(r->samp.gm);
            r->samp.g_on = false;
        }
    } else if (r->p.grammar_lazy && tok == r->p.grammar_trigger) {
        r->samp.g_on = true;
    }
    return true;
}

/* Samples requests ith, ith+nth, ... of the step (each request's sampler is its own, so the
 * split does not change any result). A request verifying K drafts samples its rows in order,
 * each exactly as its own decode step would have (penalty window, grammar, think budget and
 * generator advanced by the tokens before it), and goes on to the next row only while the
 * token sampled equals the draft token the row was computed with and the request goes on: so
 * it emits the tokens a run without speculation emits, the seeded draws included (for a
 * deterministic draft this is the acceptance rule of speculative sampling, spec.h). */
static void sched_sample_rows(sched *s, int ith, int nth)
{
    for (int i = ith; i < s->batch_n_reqs; i += nth) {
        sched_req *r = s->batch_req[i];
        s->batch_ntok[i] = 0;
        s->batch_acc[i] = 0;
        if (s->batch_row[i] < 0) continue;
        int k = s->batch_k[i];
        bool rejected = false;
        for (int j = 0; j <= k; j++) {
            float *row = s->logits + (size_t)(s->batch_row[i] + j) * s->n_vocab;
            bool constrained = r->samp.gm && r->samp.g_on && !r->samp.in_think;  /* reasoning stays free */
            if (constrained) grammar_match_apply(r->samp.gm, row);
            int32_t tok = sample_token(r->samp.smp, row);
            if (r->samp.in_think && r->p.think_budget > 0 && r->samp.n_think >= r->p.think_budget &&
                r->p.think_end >= 0)
                tok = r->p.think_end;  /* the reasoning budget is spent: close the block */
            sample_accept(r->samp.smp, tok);
            sched_sample_grammar_track(r, tok);
            sched_sample_think_track(r, tok);
            size_t at = (size_t)i * s->tok_stride + j;
            s->batch_tok[at] = tok;
            sched_output *o = &s->batch_out[at];
            o->n_top = 0;
            o->logprob = 0;   /* the log-probs are post-processing: sched_pub_logprobs */
            s->batch_ntok[i] = j + 1;
            if (j == k) break;
            if (tok != r->draft.tok[j]) {
                rejected = true;
                break;
            }
            s->batch_acc[i]++;
            int gen = r->n_tokens + j + 1;   /* the request ends at this token: drafts after it are moot */
            if (sched_is_stop(s, r, tok) || gen - r->n_prompt >= r->max_gen || gen >= r->cap) break;
        }
        r->spec.rejected = rejected;
        if (k > 0) spec_seq_observe(&r->spec.src[r->draft.src], s->batch_acc[i], rejected, r->draft.prob);
    }
}

/* The next-token masks of the step's constrained requests ith, ith+nth, ... (the matcher keeps
 * its mask until it accepts a token, so sampling then only applies it). */
static void sched_sample_mask_part(sched *s, int ith, int nth)
{
    for (int i = ith; i < s->batch_n_reqs; i += nth) {
        sched_req *r = s->batch_req[i];
        if (s->batch_row[i] >= 0 && r->samp.gm && r->samp.g_on && !r->samp.in_think)
            grammar_match_mask(r->samp.gm, NULL);
    }
}

static void sched_sample_rows_job(void *ctx, int ith, int nth) { sched_sample_rows(ctx, ith, nth); }
static void sched_sample_masks_job(void *ctx, int ith, int nth) { sched_sample_mask_part(ctx, ith, nth); }

void sched_sample_masks_wait(sched *s) { threadpool_wait(s->samplers); }

/* Starts the masks of the step's constrained requests on the workers, to run during the
 * engine step; false when there is none to compute or no worker (sampling computes them). */
bool sched_sample_masks_start(sched *s, int n_reqs)
{
    if (threadpool_size(s->samplers) == 1) return false;
    bool any = false;
    for (int i = 0; i < n_reqs && !any; i++) {
        const sched_req_sample *sm = &s->batch_req[i]->samp;
        any = s->batch_row[i] >= 0 && sm->gm && sm->g_on && !sm->in_think;
    }
    if (!any) return false;
    s->batch_n_reqs = n_reqs;
    return threadpool_start(s->samplers, sched_sample_masks_job, s);
}

/* Samples every request of the step that wants a token, on the workers when it pays. */
void sched_sample_step(sched *s, int n_reqs)
{
    s->batch_n_reqs = n_reqs;
    int n_rows = 0;
    for (int i = 0; i < n_reqs; i++) n_rows += s->batch_row[i] >= 0 ? 1 + s->batch_k[i] : 0;
    if (n_rows < 2 || (double)n_rows * s->n_vocab < SCHED_SAMPLE_SPLIT_MIN) sched_sample_rows(s, 0, 1);
    else threadpool_run(s->samplers, sched_sample_rows_job, s);
}

void sched_sample_start(sched *s, int n_workers)
{
    s->samplers = n_workers > 0 ? threadpool_new(n_workers + 1) : NULL;
    /* a round per step beside the engine's own pool: idle samplers must not spin on its cores */
    threadpool_set_spin(s->samplers, 0);
}

void sched_sample_stop(sched *s)
{
    threadpool_free(s->samplers);
    s->samplers = NULL;
}
