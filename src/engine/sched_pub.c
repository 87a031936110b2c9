/*
 * sched_pub: publishing a step's outputs (the step loop: docs/architecture.md, "Scheduler").
 * The engine thread hands a step's tokens over in pub_* (sched.c, sched_step_publish_locked); the publisher thread
 * computes their log-probs without mu, then pushes every token record and the FINISH of the
 * requests their last token ended, while the engine computes the next step. The engine thread
 * publishes itself whenever it must publish first (sched_pub_flush_locked: before the next
 * handoff, before any FINISH, with no_overlap). lp_state under lp_mu says who computes the
 * log-probs, so they are computed once and nobody holds mu meanwhile.
 */
#define _GNU_SOURCE   /* SCHED_BATCH */
#include "engine/sched_int.h"

#include <math.h>
#include <sched.h>
#include <string.h>

#include "util/util.h"

/* log-softmax of the raw logits: the chosen token's log-prob and the top k alternatives. Tokens
 * a grammar masked (-inf) are impossible, not alternatives: fewer than k may be listed, and
 * every listed log-prob is finite (JSON has no infinity). */
static void sched_logprobs(const float *logits, int n_vocab, int32_t chosen, int k, sched_output *o)
{
    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)(logits[i] - mx));
    float lse = mx + (float)log(sum);
    o->logprob = logits[chosen] - lse;
    int n = 0;
    for (int i = 0; i < n_vocab && k > 0; i++) {
        float v = logits[i];
        if (!(v > -INFINITY)) continue;
        if (n == k && v <= o->top[n - 1].logprob) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && o->top[j - 1].logprob < v) {
            o->top[j] = o->top[j - 1];
            j--;
        }
        o->top[j].token = i;
        o->top[j].logprob = v;
    }
    for (int i = 0; i < n; i++) o->top[i].logprob -= lse;
    o->n_top = n;
}


/* -v: r's first token; where its time went, in steps and tokens. Under mu. */
static void sched_trace_log(const sched *s, const sched_req *r)
{
    const sched_trace *t = &r->tr;
    log_debug("sched: req %llu first token at step %llu, %.1f ms after submit: prompt %d, cached %d "
              "(shared in flight %d), computed %d; steps since submit %llu: queued %llu, waited on a shared "
              "prefix %d, own chunks %d (%d with decodes), left out by the budget %d; tokens in those steps "
              "%llu (%llu decode rows)",
              (unsigned long long)r->id, (unsigned long long)s->n_planned, r->ttft * 1e3, r->n_prompt,
              r->prefix.n_cached, r->prefix.n_cached - TM_MIN(r->prefix.n_cached, t->n_cached_at_admit), t->n_computed,
              (unsigned long long)(s->n_planned - t->step0), (unsigned long long)(t->admit_step - t->step0),
              t->n_share, t->n_chunk, t->n_mixed, t->n_starved, (unsigned long long)(s->tok_planned - t->tok0),
              (unsigned long long)(s->dec_planned - t->dec0));
}


/* Publishes one sampled token of r (with its log-probs in so) sampled at time t. Under mu. */
static void sched_pub_token_locked(sched *s, sched_req *r, int32_t tok, const sched_output *so, double t)
{
    s->st.n_gen_tokens++;
    sched_output *o = sched_push(r);
    o->kind = SCHED_OUT_TOKEN;
    o->token = tok;
    o->is_stop = sched_is_stop(s, r, tok);   /* only a request's last token can be one */
    o->usage.prompt_tokens = r->n_prompt;
    o->usage.cached_tokens = r->prefix.n_cached;
    if (r->p.logprobs) {
        o->logprob = so->logprob;
        o->n_top = so->n_top;
        memcpy(o->top, so->top, (size_t)o->n_top * sizeof o->top[0]);
    }
    if (r->ttft < 0) {
        r->ttft = t - r->t_submit;
        sched_hist_add(&s->h_ttft, r->ttft);
        if (util_log_level <= LOG_LEVEL_DEBUG) sched_trace_log(s, r);
    } else {
        sched_hist_add(&s->h_itl, t - r->t_last);
    }
    r->t_last = t;
    pthread_cond_broadcast(&r->pub.cv);
    if (r->p.on_output) r->p.on_output(r->p.out_arg);
}

/* The log-probs of the pending step's tokens that asked for them, from the logits they were
 * sampled from, into pub_out. No lock: the caller is the only one at it (lp_busy). */
static void sched_pub_logprobs(sched *s)
{
    for (int i = 0; i < s->pub_n_reqs; i++) {
        const sched_req *r = s->pub_req[i];
        if (!r->p.logprobs) continue;
        for (int j = 0; j < s->pub_ntok[i]; j++) {
            size_t at = (size_t)i * s->tok_stride + j;
            sched_logprobs(s->pub_lg + (size_t)(s->pub_row[i] + j) * s->n_vocab, s->n_vocab, s->pub_tok[at],
                           r->p.top_logprobs, &s->pub_out[at]);
        }
    }
}

/* Moves lp_state from `from` (-1: any) to `to`; returns whether it did. */
bool sched_pub_lp_move(sched *s, int from, int to)
{
    pthread_mutex_lock(&s->lp_mu);
    bool ok = from < 0 || s->lp_state == from;
    if (ok) s->lp_state = to;
    if (ok && to == SCHED_LP_DONE) pthread_cond_broadcast(&s->lp_cv);
    pthread_mutex_unlock(&s->lp_mu);
    return ok;
}

/* Publishes the step's outputs waiting in pub_* (nothing when none waits): every request's
 * tokens, then the FINISH of those their last token ended. The publisher thread calls it while
 * the next step computes, the engine thread whenever it must publish first (then it finishes
 * the log-probs: waits for the publisher's, or computes them). Under mu, which it keeps. */
void sched_pub_flush_locked(sched *s)
{
    if (!s->pub_pending) return;
    if (sched_pub_lp_move(s, SCHED_LP_PENDING, SCHED_LP_BUSY)) {
        sched_pub_logprobs(s);
        sched_pub_lp_move(s, -1, SCHED_LP_DONE);
    } else {   /* done, or the publisher is at them */
        pthread_mutex_lock(&s->lp_mu);
        while (s->lp_state != SCHED_LP_DONE) pthread_cond_wait(&s->lp_cv, &s->lp_mu);
        pthread_mutex_unlock(&s->lp_mu);
    }
    s->pub_pending = false;
    for (int i = 0; i < s->pub_n_reqs; i++) {
        sched_req *r = s->pub_req[i];
        s->st.n_prefill_tokens += (uint64_t)s->pub_prefill[i];
        for (int j = 0; j < s->pub_ntok[i]; j++) {
            size_t at = (size_t)i * s->tok_stride + j;
            sched_pub_token_locked(s, r, s->pub_tok[at], &s->pub_out[at], s->pub_t);
        }
        if (s->pub_end[i] != SCHED_FINISH_NONE) {
            sched_finish_push_locked(s, r, s->pub_end[i]);
            sched_drop_locked(r);
        }
    }
    s->pub_n_reqs = 0;
}

/* Engine thread, with or without mu: wakes the publisher for the outputs handed over last.
 * The handoff defers it to here, after the next step was planned and mu let go: woken while
 * the engine thread holds mu, the publisher would block on it at once and be woken again when
 * mu is let go, two wake-ups that each may take the engine thread's core in the gap. */
void sched_pub_wake(sched *s)
{
    if (!s->pub_wake) return;
    s->pub_wake = false;
    pthread_cond_signal(&s->pub_cv);
}

/* The publisher thread: publishes each step's outputs while the engine computes the next,
 * their log-probs first, without mu (readers and the engine thread go on meanwhile). */
void *sched_pub_thread(void *arg)
{
    sched *s = arg;
#ifdef SCHED_BATCH
    /* Woken once per step by the engine thread, a normal thread preempts it on its own core
     * (the kernel favours a thread that slept), so the engine thread waited out the whole
     * publishing in the gap. A batch thread is never run by its wake-up: it takes a free
     * core, or its turn at the next tick. No privilege needed; if refused, nothing changes. */
    struct sched_param sp = { .sched_priority = 0 };
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
    pthread_mutex_lock(&s->mu);
    while (!s->pub_stop) {
        if (!s->pub_pending) {
            pthread_cond_wait(&s->pub_cv, &s->mu);
            continue;
        }
        if (sched_pub_lp_move(s, SCHED_LP_PENDING, SCHED_LP_BUSY)) {
            pthread_mutex_unlock(&s->mu);
            sched_pub_logprobs(s);
            sched_pub_lp_move(s, -1, SCHED_LP_DONE);
            pthread_mutex_lock(&s->mu);
            continue;   /* the engine thread may have published them meanwhile */
        }
        sched_pub_flush_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}


/* Stops and joins the publisher thread (everything was published: the engine thread has
 * exited, or never started), and destroys its condition variable. */
void sched_pub_stop(sched *s)
{
    if (s->pub_started) {
        pthread_mutex_lock(&s->mu);
        s->pub_stop = true;
        pthread_cond_signal(&s->pub_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->publisher, NULL);
        s->pub_started = false;
    }
    pthread_cond_destroy(&s->pub_cv);
    pthread_mutex_destroy(&s->lp_mu);
    pthread_cond_destroy(&s->lp_cv);
}
