/*
 * sched_int: what only the scheduler's files (sched*.c) may see: the request and scheduler
 * structs and the functions one of those files calls in another. The design is in sched.h,
 * the request life and which thread or lock guards what in sched.c, the admission policy in
 * sched_admit.c.
 *
 *   sched.c       the step loop: planning, the engine step, the handoff to publishing, the
 *                 request lifecycle, the public API
 *   sched_admit.c admission with prefix reuse: which waiting request runs next, the blocks and
 *                 rows it attaches (cached, loaded, in flight, tails), the tails kept and pinned
 *   sched_sample.c sampling a step (the verify rows of drafts included) on the engine thread
 *                 and the sampling workers, and the grammar masks computed during a step
 *   sched_pub.c   publishing a step's outputs on the publisher thread (or the engine thread)
 *   sched_spec.c  speculative decoding: the verify counts of a step, the drafts after it
 *                 (prompt lookup, the draft model), the grammar's cut of a draft
 */
#ifndef TM_SCHED_INT_H
#define TM_SCHED_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/blockio.h"
#include "engine/sched.h"
#include "engine/specdraft.h"
#include "engine/steptime.h"
#include "engine/wincache.h"
#include "util/threadpool.h"

typedef enum { REQ_QUEUED = 0, REQ_RUNNING, REQ_FINISHED } req_state;

/* Where a request's time to first token went, in steps and tokens (clocks are noisy on a
 * shared machine, counts are not): logged with -v at its first token. A few additions per
 * running request and step. */
typedef struct {
    uint64_t step0;              /* s->n_planned at submit */
    uint64_t tok0, dec0;         /* s->tok_planned, s->dec_planned at submit */
    uint64_t admit_step;         /* s->n_planned when it was first admitted */
    int n_share;                 /* steps it sat out waiting on a prefix in flight */
    int n_chunk;                 /* steps that carried a prefill chunk of it */
    int n_starved;               /* steps it had prompt left, no wait, and got no tokens (budget) */
    int n_mixed;                 /* of its chunk steps, those that also carried decodes */
    int n_computed;              /* tokens it computed (prefill chunks, its first decode row) */
    int n_cached_at_admit;       /* cached tokens attached at admission */
} sched_trace;

#define SCHED_CATCHUP_MEASURE 64 /* tokens a drafting round must catch up to time its catch-up */

/* A model that drafts for the scheduler's requests (the draft model, or the model's MTP layer),
 * with what its cost and its probes have taught. Drafter d drafts for source index d + 1
 * (SPEC_SRC_MODEL, SPEC_SRC_MTP). Engine thread. */
#define SCHED_N_DRAFTERS 2
#define SCHED_DRAFTER_SRC(d) ((d) + 1)
typedef struct {
    engine *e;                   /* the engine it drafts on (sched_opts.draft or .mtp) */
    specdraft *sd;               /* NULL: this drafter is off */
    specdraft_seq *q;            /* (max_seqs) a drafting round's sequences */
    sched_req **q_req;           /* (max_seqs) their requests */
    int nq;                      /* entries of q this round */
    spec_probe probe;            /* when one request drafts with it although its rate says the
                                  * draft steps do not pay: a probe per gap of the server's
                                  * steps, not per request (a request's first draft round also
                                  * feeds its whole prompt to the drafting model) */
    double probe_t;              /* util_now() of the last such probe, or of sched_new */
    double step_s;               /* running mean seconds of one of its engine steps, 0: none yet */
    double round_s;              /* running mean seconds of a round of its steps, 0: none yet */
    double catchup_tok_s;        /* running mean seconds per token of rounds that fed it at least
                                  * SCHED_CATCHUP_MEASURE tokens it had not seen, 0: none yet */
    double cost_floor;           /* its weight bytes a token reads over the target's: the least
                                  * a draft step costs as a fraction of a target step, whatever
                                  * noisy timings say */
} sched_drafter;

/* A request's sampling state (engine thread and the sampling workers, one request each). */
typedef struct {
    sampler *smp;                /* own sampler, seeded from p.sample */
    grammar_match *gm;           /* p.grammar's matcher, or NULL */
    bool in_think;               /* the output is inside a think block (p.think_*) */
    bool g_on;                   /* gm binds the next token (off: before a lazy grammar's
                                  * trigger, or after its document ended) */
    int n_think;                 /* tokens generated inside think blocks so far */
} sched_req_sample;

/* A request's prompt prefix in the cache: its key chain and what it attached (engine thread). */
typedef struct {
    int n_cached;                /* prompt positions attached from the cache in its first run
                                  * (at admission, and from prefixes computed in flight) */
    bool admitted_once;          /* has run before (a resume does not count cache hits again) */
    bool first_run;              /* RUNNING for the first time: attached blocks count as hits */
    uint8_t (*chain)[32];        /* (cap / 128) keys of the full blocks of tokens, from root:
                                  * equal keys at block i = same tenant and tokens up to its end */
    int n_chain;                 /* entries of chain computed so far (lazily) */
    bool share_wait;             /* this step: another request is computing its next block */
    bool salted;                 /* root holds the key chain's root (cache_salt) */
    uint8_t root[32];            /* blockkey_root(cache_salt) */
} sched_req_prefix;

/* A request's block store load and the tail it pinned while it waits (engine thread). */
typedef struct {
    blockio_load *io;            /* the load in flight, or NULL */
    bool started;                /* a load was tried for this (re)admission */
    int retries;                 /* loads restarted because the RAM tier changed */
    int ram;                     /* full blocks prefixing it in the RAM tier when its load started */
    bool tail_looked;            /* looked for a tail to pin for this (re)admission */
    int tail_pin;                /* 1 + the pool block of the tail it pinned while it waits
                                  * (kvpool_tail_pin), 0: none */
    double t;                    /* util_now() when the load started */
    double t0;                   /* util_now() when the first load of this (re)admission
                                  * started, 0 when none: admission observes the wait */
} sched_req_load;

/* What speculation has learnt of a request's drafts (engine thread unless said). */
typedef struct {
    spec_seq src[SPEC_N_SRC];    /* the running acceptance of each source's drafts */
    spec_probe probe;            /* when its drafts are made and verified anyway */
    bool rejected;               /* the last step rejected one of its drafts */
    int n_verified;              /* its drafted tokens verified so far (under mu) */
    int n_accepted;              /* of those, accepted (under mu) */
} sched_req_spec;

/* A request's current draft and its drafting state (engine thread). */
typedef struct {
    grammar_match *gm;           /* a copy of samp.gm that drafted tokens are checked on, made
                                  * at submit when samp.gm is and speculation is on */
    int32_t tok[SPEC_MAX_K];     /* the drafted continuation of tokens[0..at) */
    float prob[SPEC_MAX_K];      /* its source's confidence in each (spec_seq_gains' prob) */
    int n;                       /* entries of tok */
    int at;                      /* n_tokens the draft continues (stale unless equal), -1: none */
    int src;                     /* index of the source that drafted it */
    int n_verify;                /* of which verified in this step (its decode carries 1 + that) */
    kvpool_seq *seq[SCHED_N_DRAFTERS]; /* its KV in each drafting model's pool, or NULL */
    int done[SCHED_N_DRAFTERS];  /* positions of seq[i] whose tokens are final */
    bool idle[SCHED_N_DRAFTERS]; /* an MTP layer i skips its rows: adaptive speculation stopped
                                  * drafting it with i (done[i] stays behind; the gap is caught
                                  * up when it drafts with i again) */
} sched_req_draft;

/* A request's outputs and its end, guarded by s->mu. */
typedef struct {
    sched_output *ring;          /* (ring_cap) pending outputs, ring_n from ring_head */
    int ring_cap, ring_head, ring_n;
    bool cancel;                 /* sched_cancel or sched_abort was called */
    sched_finish cancel_why;     /* what the cancel ends it with: CANCELLED, or ABORTED */
    bool finished;               /* FINISH record pushed */
    bool finish_returned;        /* FINISH record handed to the caller */
    bool released;               /* the caller let go of the handle */
    bool engine_held;            /* the engine thread still references it */
    pthread_cond_t cv;           /* signalled when outputs are pushed */
} sched_req_pub;

struct sched_req {
    sched *s;                    /* owner */
    uint64_t id;                 /* admission order tie-breaker (submit order) */
    /* set at submit, then engine thread only */
    int32_t *tokens;             /* (cap) prompt then generated ids */
    int n_prompt;                /* prompt tokens */
    int n_tokens;                /* prompt + generated so far */
    int cap;                     /* entries of tokens: most positions this request can use */
    int max_gen;                 /* generated tokens at most (<= cap - n_prompt) */
    sched_params p;              /* copy (prompt pointer not used after submit) */
    kvpool_seq *seq;             /* KV while RUNNING, else NULL */
    int n_done;                  /* positions of tokens whose KV is in seq */
    int n_passed;                /* admissions that overtook it while it waited */
    uint64_t admit_no;           /* order of (re)admission: the newest is preempted first */
    float *embd;                 /* (e_dim) an embedding request's pooled sum so far, or NULL
                                  * (engine thread until its FINISH is pushed) */
    req_state state;
    double t_submit;             /* util_now() at submit */
    double t_last;               /* time of the last token, 0 before the first (under mu:
                                  * set by whoever publishes) */
    double ttft;                 /* seconds to the first token, -1 before it (the same) */
    sched_trace tr;              /* counts until its first token, for the -v line */
    sched_req_sample samp;     /* sampling */
    sched_req_prefix prefix;   /* its prefix in the cache */
    sched_req_load load;       /* its block store load */
    sched_req_spec spec;       /* speculation's view of its drafts */
    sched_req_draft draft;     /* its current draft */
    sched_req_pub pub;         /* its outputs and end (under s->mu) */
    sched_req *next;             /* waiting queue link (under s->mu) */
};

struct sched {
    engine *e;
    kvpool *pool;
    wincache *wc;                /* window states, NULL for a model without window layers */
    uint8_t *wstate;             /* (kvpool_window_state_bytes) a state taken out of wc */
    int n_vocab;
    int e_dim;                   /* the model's hidden state width */
    bool whole;                  /* bidirectional model (an encoder): a prompt is planned whole
                                  * into one step, never in chunks */
    sched_opts o;                /* resolved options */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;      /* new work or stop for the engine thread */
    bool stop;                   /* sched_free: the thread exits */
    bool shutdown;               /* sched_drain/abort/shutdown: no new submissions */
    /* under mu */
    int n_live;                  /* accepted requests whose FINISH is not published yet */
    pthread_cond_t idle_cv;      /* n_live reached 0 (sched_wait_idle) */
    sched_req *wait_head, *wait_tail;  /* waiting FIFO */
    int n_waiting;
    uint64_t next_id;
    sched_stats st;
    sched_hist h_ttft, h_itl, h_step;
    sched_hist h_load_wait;      /* seconds a request waited for its store load before admission */
    /* engine thread only */
    sched_req **running;         /* (max_seqs) in admission order */
    int n_running;
    uint64_t admit_counter;
    uint64_t n_planned;          /* steps planned (the trace's clock) */
    uint64_t tok_planned;        /* tokens of those steps */
    uint64_t dec_planned;        /* of which decode rows */
    double t_prev_end;           /* util_now() at the end of the previous step when no idle
                                  * wait followed, else -1: the CPU gap between steps */
    double t_prev_pub;           /* util_now() when the previous step's handoff ended */
    double gap_run[SCHED_GAP_N]; /* seconds of each part of the gap since the previous step */
    double gap_acc[SCHED_GAP_N]; /* the parts of the gaps not yet in st (added under mu at the
                                  * next handoff, so the step needs no lock to count them) */
    double gap_acc_s;            /* the gaps themselves, likewise */
    engine_tok *batch;           /* (prefill_step_tokens >= step_tokens) */
    sched_req **batch_req;       /* (max_seqs) requests in this step */
    int *batch_n;                /* (max_seqs) tokens of each in this step */
    int *batch_row;              /* (max_seqs) logits row or -1 */
    int *batch_k;                /* (max_seqs) drafted tokens each verifies (0: none) */
    int *batch_nd;               /* (max_seqs) tokens drafted for each (its K was chosen among) */
    int *batch_src;              /* (max_seqs) the source of the drafts each verifies */
    int *batch_ntok;             /* (max_seqs) tokens sampled for each: 1 + accepted drafts, 0
                                  * for a prefill chunk that wanted no logits */
    int *batch_acc;              /* (max_seqs) drafted tokens accepted */
    int32_t *batch_tok;          /* (max_seqs, tok_stride) tokens sampled for each */
    sched_output *batch_out;     /* (max_seqs, tok_stride) their log-probs */
    int tok_stride;              /* 1 + spec_max: most tokens one request emits per step */
    float *logits;               /* (max_seqs * tok_stride, n_vocab) the next step's */
    float *logits_twin;          /* the same shape, overlap only: the logits of the step being
                                  * published, whose log-probs the publisher computes */
    spec_chooser *chooser;       /* the verify counts of a step (speculation on) */
    double *spec_gains;          /* (max_seqs, SPEC_MAX_K) expected gains of the decodes' drafts */
    int *spec_nd;                /* (max_seqs) drafts of each decode, for the chooser */
    int *spec_k;                 /* (max_seqs) the chooser's answer */
    sched_req **spec_req;        /* (max_seqs) the decodes those rows belong to */
    sched_drafter dr[SCHED_N_DRAFTERS]; /* the drafting models: dr[0] the draft model (o.draft),
                                  * dr[1] the MTP layer (o.mtp); sd NULL when off */
    uint64_t drafted_run[SPEC_N_SRC]; /* tokens each source drafted since the statistics were last
                                  * updated */
    uint64_t caught_run[SPEC_N_SRC]; /* positions each drafting model caught up since then */
    spec_seq spec_all[SPEC_N_SRC]; /* each source's running acceptance over every request: a new
                                  * request's estimate (engine thread) */
    double main_step_s;          /* running mean seconds of one engine step of the target */
    int batch_n_reqs;            /* requests of the step being sampled */
    steptime tm;                 /* learned step time (engine thread; its error sums are copied
                                  * into st after each step) */
    steptime_x plan_x;           /* make-up of the step planned last, for tm */
    /* the sampling pool: the step's requests are split by ith/nth between the engine thread
     * (ith 0) and its workers, which sleep between steps. While the engine computes a step,
     * the workers alone compute the grammar masks its constrained sequences will need (their
     * matchers' states are known before the step), so sampling finds them ready */
    threadpool *samplers;        /* NULL: the engine thread samples alone */
    /* publishing: a step's outputs wait in pub_* until published (sched_pub_flush_locked), by
     * the publisher thread while the next step computes, or by the engine thread when it must
     * publish first (a FINISH, the next step's outputs, o.no_overlap). pub_pending and the
     * buffers while pending are guarded by mu */
    pthread_t publisher;
    bool pub_started;            /* the publisher thread runs */
    bool pub_stop;               /* sched_free: the publisher exits */
    pthread_cond_t pub_cv;       /* pub_pending was set, or pub_stop */
    bool pub_pending;            /* pub_* hold a step's outputs not published yet */
    bool pub_wake;               /* (engine thread) the publisher is to be woken for them */
    int pub_n_reqs;              /* requests of that step */
    sched_req **pub_req;         /* (max_seqs) its requests */
    int *pub_ntok;               /* (max_seqs) tokens each gets (0: a prefill chunk) */
    int *pub_prefill;            /* (max_seqs) positions each computed as prefill */
    sched_finish *pub_end;       /* (max_seqs) how its last token ended it, or NONE */
    int32_t *pub_tok;            /* (max_seqs, tok_stride) the tokens (batch_tok's twin) */
    sched_output *pub_out;       /* (max_seqs, tok_stride) their log-probs (batch_out's twin) */
    int *pub_row;                /* (max_seqs) first logits row of each in pub_lg, or -1 */
    const float *pub_lg;         /* the logits they were sampled from (logits_twin, or with
                                  * no_overlap logits) */
    double pub_t;                /* util_now() when they were handed over */
    /* the log-probs of the pending step: computed by the publisher outside mu, or by whoever
     * publishes when the publisher has not started them; one that must publish while the
     * publisher is at them waits on lp_cv (the publisher needs no mu to finish) */
    pthread_mutex_t lp_mu;
    pthread_cond_t lp_cv;        /* lp_state became SCHED_LP_DONE */
    int lp_state;                /* under lp_mu: SCHED_LP_PENDING, _BUSY (the publisher), _DONE */
};

/* lp_state: who computes the pending step's log-probs */
enum { SCHED_LP_PENDING = 0, SCHED_LP_BUSY, SCHED_LP_DONE };

/* sched.c: whether tok ends r (an end-of-generation id unless ignore_eos, or a stop id). */
bool sched_is_stop(const sched *s, const sched_req *r, int32_t tok);
/* sched.c, under mu: a new record at the end of r's output ring (zeroed). */
sched_output *sched_push(sched_req *r);
/* sched.c, under mu: publishes r's FINISH record with why, unless it has one. */
void sched_finish_push_locked(sched *s, sched_req *r, sched_finish why);
/* sched.c, under mu: the engine drops its reference; frees r if the caller released it. */
void sched_drop_locked(sched_req *r);
/* sched.c, under mu: ends r with why: releases its KV (engine thread), then publishes FINISH
 * after the outputs of the last step still waiting to be published. */
void sched_finish_locked(sched *s, sched_req *r, sched_finish why);
/* sched.c, under mu: takes running[i] out of the running set (the order of the rest kept). */
void sched_running_remove(sched *s, int i);

/* sched_admit.c, engine thread */
/* Under mu, before each plan: ends the cancelled requests, starts the waiting ones' store
 * loads, admits waiting requests while slots and KV allow (the admission policy), attaching
 * what each can reuse. */
void sched_admit_locked(sched *s);
/* Under mu, at the start of each plan: prefixes shared in flight (running requests attach
 * the blocks others completed, wait for the one being computed, copy the rows of a partial
 * block; share_wait says who sits this step out). */
void sched_admit_share_locked(sched *s);
/* Before r's sequence lets go of its blocks (it ends, or is preempted): keeps its tails
 * findable for a request that continues its tokens. */
void sched_admit_keep_tails(sched *s, sched_req *r);
/* Lets go of the tail r pinned while it waited. */
void sched_admit_tail_unpin(sched *s, sched_req *r);
/* Lets go of every waiting request's pinned tail (the pool is full); whether there was one. */
bool sched_admit_tail_unpin_all(sched *s);
/* After a step: the window states its n_reqs sequences crossed, into the window cache. */
void sched_admit_window_put(sched *s, int n_reqs);

/* sched_sample.c */
/* Makes the sampling pool: the engine thread and n_workers workers (none when n_workers <= 0
 * or threads cannot be made). Before the engine thread starts; sched_sample_stop frees it. */
void sched_sample_start(sched *s, int n_workers);
/* Frees the pool sched_sample_start made (the engine thread has exited). */
void sched_sample_stop(sched *s);
/* Engine thread: starts the grammar masks of the step's constrained requests on the workers,
 * to run during the engine step; false when there is none or no worker. Then, after the
 * step, sched_sample_masks_wait waits for them. */
bool sched_sample_masks_start(sched *s, int n_reqs);
void sched_sample_masks_wait(sched *s);
/* Engine thread: samples every request of the step that wants a token (batch_tok, batch_ntok,
 * batch_acc), on the workers when it pays. */
void sched_sample_step(sched *s, int n_reqs);
/* A generated token fed to r's grammar (false: it does not allow it), then to its think-block
 * state, in that order (also for the tokens a request continues from, at submit). */
bool sched_sample_grammar_track(sched_req *r, int32_t tok);
void sched_sample_think_track(sched_req *r, int32_t tok);

/* sched_pub.c */
/* Under mu: publishes the step's outputs waiting in pub_* (nothing when none waits). */
void sched_pub_flush_locked(sched *s);
/* Engine thread: wakes the publisher for the outputs handed over last, if not yet. */
void sched_pub_wake(sched *s);
/* The publisher thread's body (arg: the sched). */
void *sched_pub_thread(void *arg);
/* Stops and joins the publisher thread, destroys its condition variables and lp_mu. */
void sched_pub_stop(sched *s);
/* Moves lp_state from `from` (-1: any) to `to`; returns whether it did. */
bool sched_pub_lp_move(sched *s, int from, int to);

/* sched.c: the prompt tokens r reads in a step already holding x (budget tokens left, a
 * step-time target in seconds or 0); 0 when the step is full. */
int sched_prefill_chunk(const sched *s, const steptime_x *x, const sched_req *r, int budget, double target_s);

/* sched_spec.c, engine thread */
/* Lets go of r's draft KV and draft (it ends, or is preempted and recomputes from scratch). */
void sched_spec_release(sched *s, sched_req *r);
/* Before a step is planned: sets every decoding request's n_verify, max_extra in all. */
void sched_spec_plan_locked(sched *s, int max_extra);
/* After a step was sampled: drafts the continuation of every request of the step. */
void sched_spec_draft(sched *s, int n_reqs);

#endif
