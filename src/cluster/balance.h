/*
 * balance: the gateway's load balancers and its capacity rule, as pure functions of the load
 * figures the gateway keeps per worker (no locks, no I/O: the unit tests drive them with
 * numbers; the gateway logs each decision with the figures it used).
 *
 * PREFILL. The work of a prompt is its uncached tokens (the cached prefix is loaded from the
 * shared block store, so any worker gets the same hits: no affinity). Cost model, seconds:
 *     cost(n_new, n_cached) = n_new * (linear_s + attn_s * (n_cached + n_new / 2))
 * (the linear layers per token, plus attention of each new token over the positions before it,
 * on average the cached prefix plus half the new ones). A worker runs prefill in steps of at
 * most step_budget_s: the largest chunk of a request that fits one step is
 *     chunk = step_budget_s / (linear_s + attn_s * ctx)  tokens, ctx = the bucket's upper length
 * (length buckets <=16k, <=64k, <=256k, longer: long prompts get smaller chunks), so a request
 * takes ceil(n_new / chunk) steps. It goes to the up worker that would finish it earliest:
 *     finish = (queued_s + own) / speed,   own = cost, or max(cost, steps * step_budget_s)
 *                                           when the prompt takes more than one step
 * queued_s being the cost of what the worker already has (the gateway adds the cost of each
 * job it sends and subtracts it when the first token comes back). A prompt that fits one step
 * shares that step with the work queued there, so it adds its cost, not a whole step budget
 * (which would make every short prompt weigh as much as a full step and, with unequal
 * speeds, send them all to the faster worker); a longer one finishes no sooner than its
 * steps allow. Ties: fewer queued jobs,
 * then the lower index.
 *
 * SHARED IN FLIGHT. A worker may be computing right now the leading blocks this prompt needs
 * (another request's prefill with the same block keys: same tokens, salt and tenant); its
 * scheduler then attaches them as they complete instead of computing them again. The gateway
 * tells the balancer, per worker, how many of the prompt's tokens beyond the stored prefix
 * are in flight there (inflight_tokens); on that worker the request's own work is only the
 * rest: cost(n_new - shared, n_cached + shared). The request goes there when the time that
 * adds to it is at most the compute it saves: with best the earliest finish over all workers
 * and share the earliest among those computing a prefix of it,
 *     share  when  finish(share) - finish(best) <= work(best) - work(share),
 * work being the request's own cost there / speed (a worker busy with the very prefix has
 * that prefix in its queue, so an idle worker always finishes first: the rule trades a little
 * latency for the cluster's compute, which agents starting together with one system prompt
 * need). Ties go to the worker that shares more. The last prompt token is always computed
 * (its logits), so at most n_new - 1 tokens are shared.
 *
 * LEARNED CURVE. A worker whose scheduler has learned its step time (steptime.h: seconds =
 * w . (1, decodes, prefill tokens, depth / 1024)) reports the weights in its heartbeats; on it
 * the request's own time is that curve's, not the cost model's:
 *     curve(n_new, n_cached) = steps * w0 + n_new * w2 + w3 * n_new * (n_cached + n_new / 2) / 1024
 * with steps = ceil(n_new / chunk), in that worker's real seconds, so its speed is taken as 1
 * (the jobs it was sent since count in its queued_s in the same seconds). A curve that gives
 * no positive time (a fit not settled yet) is ignored: the cost model and the learned speed.
 *
 * speed is the worker's relative speed, learned from its heartbeats
 * (bal_speed): the prefill tokens it computed per second inside engine steps, both lifetime
 * counters, taken by difference once at least BAL_SPEED_MIN_TOKENS more were computed and
 * exponentially averaged (weight BAL_SPEED_ALPHA per sample); a new worker starts from a
 * default rate, which its first sample replaces. Relative speed = rate * linear_s (1 = the cost model's machine). On a mixed
 * worker the engine time of its decodes counts against the rate: that is the share of its
 * steps a prefill gets there.
 *
 * DECODE. Two figures per worker: running requests and the sum of their cache lengths
 * (tokens). A request is long when its expected length (prompt + max new tokens) is above the
 * cluster's mean length per running request (or long_tokens when nothing runs): long ones go
 * to the worker with the shortest total cache (then fewer requests), short ones to the worker
 * with the fewest requests (then the LONGEST total cache, which keeps the short caches free
 * for the long requests). Workers at max_running are used only when every one is.
 *
 * CAPACITY. Recommended worker counts per role: prefill from the uncached tokens/s the
 * gateway sees against what one worker does (tokens_per_s), decode from the running requests
 * against what one worker runs well (target_running); both aimed at target_util, clamped to
 * [min, max], and never below the current count while utilisation is above 0.8.
 */
#ifndef TM_BALANCE_H
#define TM_BALANCE_H

#include <stdbool.h>
#include <stdint.h>

#define BAL_N_BUCKETS 4
extern const int64_t bal_bucket_max[BAL_N_BUCKETS];   /* 16k, 64k, 256k, INT64_MAX tokens */

typedef struct {
    double linear_s;          /* seconds per token of the linear layers (MLP, projections) */
    double attn_s;            /* seconds per token per attended position */
    double step_budget_s;     /* seconds one prefill step may take */
} bal_cost;

/* Defaults for a small CPU model (tests and bench); the gateway may scale them. */
void bal_cost_default(bal_cost *c);
/* Length bucket of a prompt of n tokens: 0..BAL_N_BUCKETS-1. */
int bal_bucket(int64_t n_tokens);
/* Seconds of prefill work of n_new uncached tokens after n_cached cached ones. */
double bal_prefill_cost(const bal_cost *c, int64_t n_new, int64_t n_cached);
/* Tokens per step for prompts of the bucket of n_prompt (>= 1). */
int64_t bal_chunk_tokens(const bal_cost *c, int64_t n_prompt);
/* Seconds of prefill of n_new tokens after n_cached on a worker whose step time is the learned
 * curve w, in steps of chunk tokens (see LEARNED CURVE); <= 0: the curve is not to be used. */
double bal_curve_prefill_s(const double w[4], int64_t n_new, int64_t n_cached, int64_t chunk);

/* A worker's learned prefill rate. */
#define BAL_SPEED_MIN_TOKENS 64   /* prefill tokens between two samples at least */
#define BAL_SPEED_ALPHA 0.3       /* weight of a new sample in the average */
typedef struct {
    double tokens_per_s;      /* the estimate: prefill tokens per second of engine time */
    uint64_t base_tokens;     /* counters at the last sample (0 at first: the first report's
                               * lifetime counters are a sample of their own) */
    uint64_t base_busy_us;
    int n_samples;            /* samples averaged in (0: still the default) */
} bal_speed;

void bal_speed_init(bal_speed *s, double default_tokens_per_s);
/* Feeds a heartbeat's lifetime counters (prefill tokens computed, microseconds in engine
 * steps). Counters below the base (a restarted worker) start a new base. True when the
 * estimate moved. */
bool bal_speed_report(bal_speed *s, uint64_t prefill_tokens, uint64_t busy_us);
/* Relative speed for bal_prefill_worker.speed: tokens_per_s * c->linear_s (> 0). */
double bal_speed_rel(const bal_speed *s, const bal_cost *c);

typedef struct {
    bool up;                  /* registered, heartbeating, not draining */
    double queued_s;          /* seconds of prefill work sent and not yet done (cost model) */
    int n_queued;             /* jobs sent and not yet done */
    double speed;             /* relative speed (1 = the cost model's machine, bal_speed_rel);
                               * <= 0 taken as 1 */
    int64_t inflight_tokens;  /* tokens of this prompt past its stored prefix that a job on
                               * this worker is computing now (a shared pending prefix), 0 none */
    bool has_curve;           /* the worker reported its learned step-time curve */
    double curve[4];          /* its weights, seconds per unit of (1, decodes, prefill tokens,
                               * depth / 1024) (steptime.h) */
} bal_prefill_worker;

typedef struct {
    int worker;               /* chosen index, -1 when no worker is up */
    int bucket;               /* the prompt's length bucket */
    double cost_s;            /* the request's cost on the chosen worker (cost model; less the
                               * tokens it shares in flight there) */
    int64_t steps;            /* prefill steps it takes there */
    int64_t shared_tokens;    /* tokens it attaches from a computation in flight there */
    double finish_s;          /* estimated seconds until the chosen worker finishes it */
} bal_prefill_choice;

/* Picks the prefill worker for a prompt of n_prompt tokens of which n_cached are stored. */
bal_prefill_choice bal_prefill_pick(const bal_cost *c, const bal_prefill_worker *w, int n_workers, int64_t n_prompt,
                                    int64_t n_cached);

typedef struct {
    bool up;                  /* registered, heartbeating, not draining */
    int n_running;            /* requests it decodes now */
    int64_t sum_ctx;          /* sum of their cache lengths, tokens */
    int max_running;          /* requests it takes at most (<= 0: no limit) */
} bal_decode_worker;

typedef struct {
    int worker;               /* chosen index, -1 when no worker is up */
    bool is_long;             /* the request counted as long */
    int64_t mean_len;         /* the threshold it was compared with */
} bal_decode_choice;

/* Picks the decode worker for a request expected to reach len tokens (prompt + max new). */
bal_decode_choice bal_decode_pick(const bal_decode_worker *w, int n_workers, int64_t len, int64_t long_tokens);

typedef struct {
    int n_current;            /* workers of the role that are up */
    double load;              /* prefill: uncached tokens/s; decode: running requests */
    double per_worker;        /* prefill: tokens/s one worker does; decode: requests one runs well */
    double target_util;       /* utilisation the recommendation aims at (e.g. 0.6) */
    int min_workers, max_workers;
} bal_capacity_in;

typedef struct {
    int recommended;          /* workers of the role */
    double utilisation;       /* load / (n_current * per_worker); 0 with no worker and no load */
    bool held;                /* a smaller count was held back: utilisation > 0.8 */
} bal_capacity_out;

bal_capacity_out bal_capacity(const bal_capacity_in *in);

#endif
