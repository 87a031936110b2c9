/*
 * balance: the prefill and decode balancers and the capacity rule (see balance.h).
 */
#include "cluster/balance.h"

#include <math.h>
#include <stddef.h>

const int64_t bal_bucket_max[BAL_N_BUCKETS] = { 16384, 65536, 262144, INT64_MAX };

void bal_cost_default(bal_cost *c)
{
    c->linear_s = 50e-6;
    c->attn_s = 5e-9;
    c->step_budget_s = 0.05;
}

int bal_bucket(int64_t n_tokens)
{
    for (int b = 0; b < BAL_N_BUCKETS - 1; b++)
        if (n_tokens <= bal_bucket_max[b]) return b;
    return BAL_N_BUCKETS - 1;
}

double bal_prefill_cost(const bal_cost *c, int64_t n_new, int64_t n_cached)
{
    if (n_new <= 0) return 0;
    return (double)n_new * (c->linear_s + c->attn_s * ((double)n_cached + (double)n_new / 2));
}

int64_t bal_chunk_tokens(const bal_cost *c, int64_t n_prompt)
{
    int b = bal_bucket(n_prompt);
    /* the last bucket has no upper bound: its attention is counted at the prompt's length */
    double ctx = b == BAL_N_BUCKETS - 1 ? (double)n_prompt : (double)bal_bucket_max[b];
    double per = c->linear_s + c->attn_s * ctx;
    double chunk = per > 0 ? c->step_budget_s / per : 1e18;
    if (chunk < 1) chunk = 1;
    if (chunk > 1e15) chunk = 1e15;
    return (int64_t)chunk;
}

double bal_curve_prefill_s(const double w[4], int64_t n_new, int64_t n_cached, int64_t chunk)
{
    if (n_new <= 0) return 0;
    double steps = ceil((double)n_new / (double)(chunk > 0 ? chunk : 1));
    double depth = (double)n_new * ((double)n_cached + (double)n_new / 2);
    return steps * w[0] + (double)n_new * w[2] + w[3] * depth / 1024;
}

void bal_speed_init(bal_speed *s, double default_tokens_per_s)
{
    s->tokens_per_s = default_tokens_per_s > 0 ? default_tokens_per_s : 20000;
    s->base_tokens = s->base_busy_us = 0;   /* a new connection's counters count from here */
    s->n_samples = 0;
}

bool bal_speed_report(bal_speed *s, uint64_t prefill_tokens, uint64_t busy_us)
{
    if (prefill_tokens < s->base_tokens || busy_us < s->base_busy_us) {
        s->base_tokens = prefill_tokens;
        s->base_busy_us = busy_us;
        return false;
    }
    uint64_t dt = prefill_tokens - s->base_tokens, dus = busy_us - s->base_busy_us;
    if (dt < BAL_SPEED_MIN_TOKENS || dus == 0) return false;   /* not enough yet: keep the base */
    double rate = (double)dt / ((double)dus * 1e-6);
    s->tokens_per_s = s->n_samples == 0 ? rate : s->tokens_per_s + BAL_SPEED_ALPHA * (rate - s->tokens_per_s);
    s->n_samples++;
    s->base_tokens = prefill_tokens;
    s->base_busy_us = busy_us;
    return true;
}

double bal_speed_rel(const bal_speed *s, const bal_cost *c)
{
    double r = s->tokens_per_s * c->linear_s;
    return r > 0 ? r : 1;
}

bal_prefill_choice bal_prefill_pick(const bal_cost *c, const bal_prefill_worker *w, int n_workers, int64_t n_prompt,
                                    int64_t n_cached)
{
    bal_prefill_choice ch = { .worker = -1, .bucket = bal_bucket(n_prompt) };
    int64_t n_new = n_prompt - n_cached;
    if (n_new < 1) n_new = 1; /* the last prompt token is always computed (its logits) */
    int64_t chunk = bal_chunk_tokens(c, n_prompt);
    /* best: the earliest finish; share: the earliest among the workers computing a prefix of
     * it, taken instead when the time it adds is at most the compute it saves */
    bal_prefill_choice best = ch, share = ch;
    double best_work = 0, share_work = 0;   /* the request's own compute there, seconds */
    for (int i = 0; i < n_workers; i++) {
        if (!w[i].up) continue;
        int64_t shared = w[i].inflight_tokens > 0 ? w[i].inflight_tokens : 0;
        if (shared > n_new - 1) shared = n_new - 1;
        int64_t mine = n_new - shared;
        double cost = bal_prefill_cost(c, mine, n_prompt - mine);
        int64_t steps = (mine + chunk - 1) / chunk;
        double own = cost;   /* one step: shared with the queued work (balance.h) */
        if (steps > 1 && own < (double)steps * c->step_budget_s) own = (double)steps * c->step_budget_s;
        double speed = w[i].speed > 0 ? w[i].speed : 1;
        double curve = w[i].has_curve ? bal_curve_prefill_s(w[i].curve, mine, n_prompt - mine, chunk) : 0;
        if (curve > 0) {   /* the worker's own seconds (LEARNED CURVE) */
            cost = own = curve;
            speed = 1;
        }
        double fin = (w[i].queued_s + own) / speed;
        bal_prefill_choice *k = shared > 0 ? &share : &best;
        for (int pass = 0; pass < (shared > 0 ? 2 : 1); pass++, k = &best) {
            bool tie = k->worker >= 0 && fabs(fin - k->finish_s) <= 1e-12;
            if (k->worker < 0 || fin < k->finish_s - 1e-12 || (tie && shared > k->shared_tokens) ||
                (tie && shared == k->shared_tokens && w[i].n_queued < w[k->worker].n_queued)) {
                *k = (bal_prefill_choice){ .worker = i, .bucket = ch.bucket, .cost_s = cost, .steps = steps,
                                           .shared_tokens = shared, .finish_s = fin };
                *(k == &share ? &share_work : &best_work) = cost / speed;
            }
        }
    }
    ch = best;
    if (share.worker >= 0 && share.worker != best.worker && share.finish_s - best.finish_s <= best_work - share_work)
        ch = share;
    if (ch.worker < 0) {   /* no worker: the figures of the whole prompt, for the caller's log */
        ch.cost_s = bal_prefill_cost(c, n_new, n_prompt - n_new);
        ch.steps = (n_new + chunk - 1) / chunk;
    }
    return ch;
}

bal_decode_choice bal_decode_pick(const bal_decode_worker *w, int n_workers, int64_t len, int64_t long_tokens)
{
    bal_decode_choice ch = { .worker = -1 };
    int64_t sum = 0, n = 0;
    bool any_room = false;
    for (int i = 0; i < n_workers; i++) {
        if (!w[i].up) continue;
        sum += w[i].sum_ctx;
        n += w[i].n_running;
        if (w[i].max_running <= 0 || w[i].n_running < w[i].max_running) any_room = true;
    }
    ch.mean_len = n > 0 ? sum / n : long_tokens;
    ch.is_long = len > ch.mean_len;
    for (int i = 0; i < n_workers; i++) {
        if (!w[i].up) continue;
        if (any_room && w[i].max_running > 0 && w[i].n_running >= w[i].max_running) continue;
        if (ch.worker < 0) { ch.worker = i; continue; }
        const bal_decode_worker *a = &w[i], *b = &w[ch.worker];
        bool better;
        if (ch.is_long) better = a->sum_ctx < b->sum_ctx || (a->sum_ctx == b->sum_ctx && a->n_running < b->n_running);
        else better = a->n_running < b->n_running || (a->n_running == b->n_running && a->sum_ctx > b->sum_ctx);
        if (better) ch.worker = i;
    }
    return ch;
}

bal_capacity_out bal_capacity(const bal_capacity_in *in)
{
    bal_capacity_out o = { 0 };
    double per = in->per_worker > 0 ? in->per_worker : 1;
    double target = in->target_util > 0 && in->target_util <= 1 ? in->target_util : 0.6;
    o.utilisation = in->n_current > 0 ? in->load / ((double)in->n_current * per) : (in->load > 0 ? INFINITY : 0);
    double need = ceil(in->load / (per * target) - 1e-9);
    int rec = (int)(need > 1e6 ? 1e6 : need);
    if (rec < in->min_workers) rec = in->min_workers;
    if (in->max_workers > 0 && rec > in->max_workers) rec = in->max_workers;
    if (rec < in->n_current && o.utilisation > 0.8) {
        rec = in->n_current;
        o.held = true;
    }
    o.recommended = rec;
    return o;
}
