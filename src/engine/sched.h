/*
 * sched: continuous batching of many requests on one engine.
 *
 * DESIGN. One engine thread (started by sched_new) loops: plan a batch, engine_step, sample,
 * hand the outputs to the publisher thread. Requests join and leave between steps. The design
 * is told once, in docs/architecture.md ("Scheduler"): the step's token budget and why
 * (step_tokens, prefill_step_tokens), steps sized in time (step_ms, steptime.h), prefixes
 * shared in flight, admission by cache (sched_admit.c holds the policy and its reasons),
 * preemption, and the overlapped step loop. What a caller must know:
 *
 * - Tokens only: the scheduler knows token ids, never text. Detokenising, stop strings and
 *   the event split run on the caller's threads, which pull outputs with sched_poll; a stop
 *   string matched there is ended with sched_cancel, effective at the next plan (tokens
 *   sampled meanwhile are still published before the FINISH CANCELLED).
 * - Bounded: the queue (max_queue, SCHED_ERR_QUEUE_FULL beyond it), the running set
 *   (max_seqs). KV exhaustion never fails a request that fits the pool alone: it waits, or
 *   the newest running request is preempted and later resumed by recomputing; a request that
 *   cannot fit the pool alone finishes with ERROR.
 * - Attached and shared prefix tokens are reported as cached prompt tokens.
 * - Deterministic per request: each request has its own sampler seeded from its params, and
 *   the engine's results do not depend on the batch (engine.h), so greedy output is the same
 *   alone or batched. Log-probabilities are log-softmax of the raw logits (before penalties
 *   and temperature), as OpenAI reports them.
 * - Speculative decoding (sched_opts.spec_*) emits exactly the tokens the request would have
 *   emitted without it, several per step (spec.h, docs/spec.md).
 * - Records are published in order: whoever publishes a FINISH first publishes the outputs
 *   still pending.
 *
 * Threads and locks: one mutex guards the queue, every request's output ring and state
 * flags; the engine thread holds it only to take new requests, hand over outputs and apply
 * cancels, the publisher thread to push outputs, never while the kernels run. Callers of
 * sched_poll wait on the request's condition variable. The engine thread alone touches the
 * kvpool, the engine and the samplers.
 */
#ifndef TM_SCHED_H
#define TM_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sample.h"
#include "engine/spec.h"
#include "grammar/grammar.h"

typedef enum {
    SCHED_OK = 0,
    SCHED_ERR_QUEUE_FULL,   /* too many waiting requests: HTTP 429 (OpenAI) / 529 (Anthropic) */
    SCHED_ERR_TOO_LONG,     /* prompt (+ max_tokens floor of 1) longer than n_ctx: HTTP 400 */
    SCHED_ERR_ARG,          /* empty prompt, token id out of range, bad counts: HTTP 400 */
    SCHED_ERR_NOMEM,
    SCHED_ERR_STOPPED,      /* the scheduler is shutting down: HTTP 503 */
} sched_status;

typedef enum {
    SCHED_FINISH_NONE = 0,  /* still running */
    SCHED_FINISH_STOP,      /* an end-of-generation / stop token was produced */
    SCHED_FINISH_LENGTH,    /* max_tokens reached, or the context is full */
    SCHED_FINISH_CANCELLED, /* sched_cancel (disconnect, stop string matched by the caller) */
    SCHED_FINISH_ERROR,     /* the request could not run (e.g. larger than the whole KV pool) */
    SCHED_FINISH_ABORTED,   /* sched_abort: the server stopped before it ended (output cut short) */
    SCHED_FINISH_REFUSED,   /* never from the scheduler: a backend in another process refused the
                             * request's arguments there (a cluster worker that could not compile
                             * its grammar): HTTP 400 */
    SCHED_FINISH_UNAVAILABLE, /* never from the scheduler: a cluster gateway found no worker to go
                             * on with the request within its wait timeout (none of the role
                             * was up): HTTP 503, not an engine failure */
} sched_finish;

#define SCHED_MAX_TOP_LOGPROBS 20   /* most alternatives per token (OpenAI allows 20) */
#define SCHED_MAX_STOP_IDS 8        /* most extra stop token ids per request */

/* Prefill tokens per step that the default budget leaves next to max_seqs decodes (why this
 * size: docs/architecture.md, "Scheduler"). */
#define SCHED_PREFILL_CHUNK 64
/* Default budget of a step without decodes (prefill chunks only). */
#define SCHED_PREFILL_STEP 512
/* A step without decodes stalls no stream: its time target is this many times step_ms. */
#define SCHED_PREFILL_STEP_MS_FACTOR 4
/* Fewest prefill tokens a step with a time target gives the prompts being read (when decodes
 * alone fill the target, prompts still progress). */
#define SCHED_TIME_MIN_CHUNK 16
/* Admission by cache (sched_admit.c): waiting requests scored for what their reusable prefix leaves to
 * compute, from the oldest, and admissions that may overtake a waiting request before it goes
 * first. */
#define SCHED_ADMIT_WINDOW 32
#define SCHED_ADMIT_MAX_PASSED 8

typedef struct {
    int max_seqs;           /* running sequences at once; <= 0: 16 */
    int max_queue;          /* waiting requests beyond which submit fails; <= 0: 256 */
    int step_tokens;        /* token budget per step (decodes + prefill chunks); <= 0:
                             * sched_default_step_tokens(max_seqs); either way at most the
                             * engine's max batch */
    int spec_room;          /* of step_tokens, the tokens only verify rows may take (the room a
                             * default budget adds for speculation), so prompts are read in the
                             * chunks they would be without it; 0: none kept apart */
    int prefill_step_tokens; /* budget of a step with no decode in it; <= 0: SCHED_PREFILL_STEP;
                             * at least step_tokens, at most the engine's max batch */
    double step_ms;         /* time target of a step that carries decodes (the stall a stream
                             * sees per token), milliseconds; 0: token budgets only */
    double prefill_step_ms; /* time target of a step without decodes; <= 0: step_ms *
                             * SCHED_PREFILL_STEP_MS_FACTOR; at least step_ms */
    int n_ctx;              /* positions per sequence (prompt + generated); <= 0: model n_ctx_train */
    int32_t eos_ids[4];     /* end-of-generation ids for every request (-1 = unused) */
    struct blockio *bio;    /* block store tier (engine/blockio.h), or NULL: prefixes beyond the
                             * RAM tier are loaded from the store before admission */
    /* models with sliding-window layers: the window cache (engine/wincache.h) */
    double window_mib;      /* RAM for window states; 0: 1024; < 0: none kept (always replay) */
    double window_ttl_s;    /* seconds a window state is kept; <= 0: 180 */
    bool window_exact;      /* replay a missing state exactly (else bounded: the last block) */
    /* speculative decoding (engine/spec.h): a decoding sequence's drafted tokens are verified
     * in its step, all of them wanting logits, and it emits every token sampled up to the
     * first one that differs from the draft (included) */
    int spec_sources;       /* SPEC_SRC_* bits: where drafts come from; 0: no speculation */
    int spec_max;           /* most drafted tokens one sequence verifies per step; <= 0:
                             * SPEC_DEFAULT_MAX; at most SPEC_MAX_K */
    int spec_fixed;         /* > 0: verify that many (fewer when fewer were drafted or the step
                             * budget is spent) instead of the count chosen from the learned step
                             * time and the acceptance estimates */
    engine *draft;          /* with SPEC_SRC_MODEL: the draft model's engine (same vocabulary,
                             * its own KV pool; engine/specdraft.h); must outlive the scheduler */
    struct engine_dflash *dflash; /* with SPEC_SRC_MODEL instead of draft: a DFlash / DSpark
                             * drafter (engine/engine_dflash.h) beside this model; must outlive
                             * the scheduler */
    bool dflash_conf;       /* its confidence head's values are the acceptance estimates' input
                             * (DSpark), else its softmax probabilities (DFlash) */
    float spec_p_min;       /* > 0: a dflash draft ends before its first token below this */
    engine *mtp;            /* with SPEC_SRC_MTP: an engine over the model's MTP layer
                             * (model_mtp_view; its own KV pool); must outlive the scheduler */
    bool no_overlap;        /* publish a step's outputs on the engine thread before planning
                             * the next, instead of on the publisher thread while it computes
                             * (the same outputs either way; for comparisons and tests) */
} sched_opts;

/* A request of L prompt tokens on a model with window layers counts at most L - this many as
 * cached: the last block and 6 spare positions are always computed (DeepSeek's accounting). */
#define SCHED_WINDOW_UNCACHED 134

typedef struct {
    const int32_t *prompt;  /* (n_prompt) token ids; copied by sched_submit */
    int n_prompt;           /* >= 1 */
    sample_params sample;   /* sampling, incl. seed; see sample.h */
    int max_tokens;         /* generated tokens at most; <= 0: until the context is full */
    /* An embedding instead of a generation: MODEL_POOL_MEAN, MODEL_POOL_LAST or MODEL_POOL_CLS pools the
     * prompt's token states after the output norm (engine_hidden_normed) into one vector, read
     * with sched_embedding once FINISH STOP was polled; nothing is sampled (max_tokens and the
     * sampling fields are ignored, completion_tokens is 0). It reuses no cached prefix (every
     * position's state is needed) and keys no block. MODEL_POOL_NONE: a generation (refused,
     * SCHED_ERR_ARG, on a bidirectional model: an encoder has no logits). */
    model_pool embed;
    int32_t stop_ids[SCHED_MAX_STOP_IDS]; /* extra ids that end generation (e.g. <|im_end|>) */
    int n_stop_ids;         /* used entries of stop_ids */
    bool ignore_eos;        /* do not stop on opts.eos_ids (stop_ids still apply) */
    bool logprobs;          /* report the log-probability of each chosen token */
    int top_logprobs;       /* alternatives per token, 0..SCHED_MAX_TOP_LOGPROBS (needs logprobs) */
    const char *cache_salt; /* tenant salt for block keys (request field / API key identity):
                             * requests with different salts never share cached blocks; NULL
                             * or "" = no salt */
    int cache_class;        /* traffic class of its blocks in the block store (store_class: the
                             * retention TTL they are written and refreshed with); 0 = the
                             * default ("chat") */
    /* Reasoning budget (Anthropic thinking.budget_tokens): once think_budget tokens were
     * generated inside think blocks (think_start ... think_end; the markers themselves not
     * counted), the next token of a still open block is think_end instead of the sampled one,
     * so the model goes on with its answer (llama.cpp's and vLLM's reasoning budgets). The
     * sampler still draws for it, so seeded runs stay in step. 0 = no budget. */
    int think_budget;
    int32_t think_start;    /* id that opens a think block (-1: none) */
    int32_t think_end;      /* id that closes it (-1: no budget can be enforced) */
    bool think_open;        /* the prompt ends inside an open think block */
    /* disaggregated serving (src/cluster/worker.c); zeros = unused */
    const int32_t *gen;     /* (n_gen) tokens already generated elsewhere: the context is prompt
                             * ++ gen, generation continues after them and they count toward
                             * max_tokens and completion_tokens; copied by sched_submit */
    int n_gen;
    int n_sampled;          /* sampler draws already made for them (skipped after seeding) */
    /* Engine thread, at each admission after the cached/loaded blocks were attached
     * (n_attached positions, all keyed): may install more KV into seq (reserving blocks) and
     * returns the positions now valid, n_attached when it installs nothing. */
    int (*kv_in)(void *arg, kvpool *pool, kvpool_seq *seq, int n_attached);
    /* Engine thread, when the request finishes while it holds KV (n_done positions valid),
     * just before the KV is released: may copy it out. */
    void (*kv_out)(void *arg, const kvpool *pool, const kvpool_seq *seq, int n_done);
    void *kv_arg;           /* first argument of kv_in / kv_out */
    /* The engine or the publisher thread, under the scheduler's lock, each time outputs were
     * queued for the request (a token, its FINISH): may only wake whoever polls it (no sched_* call, no
     * lock that is held while calling sched_*), so that a few threads can serve many
     * requests (the cluster worker) instead of one sched_poll each. NULL = none. */
    void (*on_output)(void *arg);
    void *out_arg;          /* its argument */
    /* Structured output: each generated token outside think blocks must continue a document
     * of this grammar (the disallowed tokens are masked before sampling, grammar.h); the end
     * of generation ids are allowed only where the document is complete, so the request ends
     * with STOP at the end of a document or LENGTH when the budget runs out inside one.
     * sched_submit takes its own reference; NULL = unconstrained (costs nothing). */
    grammar *grammar;
    const grammar_vocab *grammar_vocab; /* the model's token bytes; required with grammar,
                                         * must outlive the request */
    /* The source grammar was compiled from, for a backend that runs the request in another
     * process (the cluster gateway sends it to a worker, which compiles it there); the
     * scheduler ignores it. NULL = none. */
    int grammar_kind;       /* grammar_kind (grammar.h) of grammar_src */
    const char *grammar_src; /* (grammar_len) bytes; must live until submit returns */
    size_t grammar_len;
    /* A lazy grammar (strict tools while the model may also answer in text): the output is
     * free until it generates grammar_trigger outside think blocks; the tokens after it must
     * form a document of the grammar, after which the output is free again (the next trigger
     * starts another document). */
    bool grammar_lazy;
    int32_t grammar_trigger;
} sched_params;

typedef struct {
    int prompt_tokens;      /* tokens of the prompt */
    int cached_tokens;      /* prompt tokens whose KV came from a cache tier or from another
                             * request computing the same prefix at the same time (first run) */
    int completion_tokens;  /* tokens generated, the stop token included when one ended it */
    int accepted_drafts;    /* (speculation) drafted tokens verified and accepted: generated
                             * without a step of their own */
    int rejected_drafts;    /* drafted tokens verified and rejected */
} sched_usage;

typedef enum {
    SCHED_OUT_TOKEN = 0,    /* one generated token */
    SCHED_OUT_FINISH,       /* the last record of a request */
} sched_out_kind;

typedef struct {
    int32_t token;          /* token id */
    float logprob;          /* natural log-probability */
} sched_logprob;

typedef struct {
    sched_out_kind kind;
    int32_t token;          /* TOKEN: the generated id */
    bool is_stop;           /* TOKEN: this id is the eos/stop token that ended the request */
    float logprob;          /* TOKEN with logprobs: log p(token) */
    int n_top;              /* TOKEN with top_logprobs: entries of top, most likely first */
    sched_logprob top[SCHED_MAX_TOP_LOGPROBS];
    sched_finish finish;    /* FINISH: why */
    sched_usage usage;      /* FINISH: token counts; TOKEN: prompt_tokens and cached_tokens (known
                             * once the request was admitted, so from its first token on) */
    double ttft_s;          /* FINISH: seconds from submit to the first token (-1 if none) */
} sched_output;

/* The parts of the CPU gap between two engine steps on the engine thread, in the order they
 * happen; they sum to the gap (sched_stats.gap_s). */
typedef enum {
    SCHED_GAP_COMMIT = 0,   /* after the step: the grammar masks' wait, the KV blocks the step
                             * completed, window states, the step-time model */
    SCHED_GAP_SAMPLE,       /* sampling the step's rows (drafts' verify rows included) */
    SCHED_GAP_DRAFT,        /* drafting the next tokens (speculation) */
    SCHED_GAP_LOCK,         /* waiting for the scheduler's lock after sampling */
    SCHED_GAP_PUBLISH,      /* publishing outputs on the engine thread: the previous step's
                             * when the publisher has not yet, this step's with no_overlap */
    SCHED_GAP_HANDOFF,      /* the rest of handing the step over: counters, requests ended,
                             * waking the publisher */
    SCHED_GAP_PLAN,         /* planning the next step: cancels, admissions, the batch */
    SCHED_GAP_LAUNCH,       /* the rest: the loop around, the KV figures, letting go of the lock
                             * before the next engine step */
    SCHED_GAP_N
} sched_gap_part;

/* The part's name in /metrics ("commit", "sample", ...). */
const char *sched_gap_part_name(sched_gap_part p);

typedef struct {
    uint64_t n_requests;        /* submitted (accepted) */
    uint64_t n_rejected;        /* submit failed with QUEUE_FULL */
    uint64_t n_finished[SCHED_FINISH_ABORTED + 1]; /* by sched_finish value */
    uint64_t n_prompt_tokens;   /* prompt tokens of admitted requests */
    uint64_t n_cached_tokens;   /* of which attached from the cache */
    uint64_t n_shared_tokens;   /* of those, attached while the request ran, from blocks another
                                 * request computed meanwhile (a prefix shared in flight) */
    uint64_t n_tail_tokens;     /* of the cached ones, rows below a block boundary copied from a
                                 * tail an ended request kept (kvpool_seq_keep_tail) */
    uint64_t n_prefill_tokens;  /* tokens computed as prefill (recomputes included) */
    uint64_t n_gen_tokens;      /* tokens generated */
    uint64_t n_preempted;       /* preemptions */
    uint64_t n_steps;           /* engine steps */
    uint64_t n_mixed_steps;     /* of which steps that carried decodes and prefill chunks */
    uint64_t spec_drafted;      /* tokens drafted for decoding sequences */
    uint64_t spec_verified;     /* of which put into steps to be verified */
    uint64_t spec_accepted;     /* of those, accepted: emitted without a step of their own */
    uint64_t spec_verifies;     /* sequence-steps that verified at least one drafted token */
    uint64_t spec_k_hist[SPEC_MAX_K + 1]; /* decodes that had drafts, by the count verified */
    uint64_t spec_src_drafted[SPEC_N_SRC];  /* spec_drafted by source (spec_source bit 1 << i) */
    uint64_t spec_src_verified[SPEC_N_SRC]; /* spec_verified by source */
    uint64_t spec_src_accepted[SPEC_N_SRC]; /* spec_accepted by source */
    uint64_t spec_src_caught_up[SPEC_N_SRC]; /* positions a drafting model's KV advanced over
                                 * by source (its catch-ups; a draft model's drafts too) */
    int step_tokens;            /* the token budget of a step (opts.step_tokens resolved) */
    int prefill_step_tokens;    /* the budget of a step without decodes (resolved) */
    int max_step_tokens;        /* most tokens any step carried so far */
    double step_ms;             /* time target of a step with decodes (0: none), resolved */
    double prefill_step_ms;     /* time target of a step without decodes, resolved */
    uint64_t step_model_n;      /* steps whose time the learned model predicted (steptime.h) */
    double step_model_abs_err_s; /* sum of |predicted - measured| seconds over those */
    double step_model_rel_err;  /* sum of |predicted - measured| / measured over those */
    bool step_model_warm;       /* the model has seen enough steps to predict */
    double step_model_w[4];     /* its fitted seconds per unit of (1, decodes, prefill tokens,
                                 * depth / 1024): steptime_curve4, for a worker's heartbeat */
    double step_s;              /* total seconds inside engine_step */
    double gap_s;               /* total seconds between consecutive steps while busy (sampling,
                                   publishing, planning): the kernels' idle time */
    double gap_part_s[SCHED_GAP_N]; /* its parts (sched_gap_part), which sum to it */
    int n_queued;               /* waiting now (incl. preempted) */
    int n_running;              /* running now */
    int kv_blocks_total;        /* pool size */
    int kv_blocks_used;         /* pinned blocks */
    int kv_blocks_cached;       /* unreferenced but keyed (reclaimable) */
    int kv_blocks_free;         /* on the free list */
    /* block store tier (zeros without one; engine/blockio.h) */
    uint64_t store_blocks_loaded;   /* blocks read from the store */
    uint64_t store_blocks_hit;      /* of those, appended to a request (their tokens cached) */
    uint64_t store_writes;          /* blocks written behind */
    uint64_t store_writes_dropped;  /* blocks not written: every write buffer busy */
    uint64_t store_writes_failed;   /* writes the store refused (no space, I/O error) */
    uint64_t store_blocks_shared;   /* blocks a load took from another request's load (not read again) */
    uint64_t store_touches;         /* RAM-tier hits whose stored blocks' last use was refreshed */
    double store_load_s;            /* seconds the I/O threads spent reading + verifying blocks */
    double store_fill_wait_s;       /* seconds engine steps waited for loaded blocks' layers to reach
                                     * the KV pool (copies the engine thread did itself included) */
    /* window cache (zeros for a model without window layers; engine/wincache.h) */
    bool window;                    /* the model has window layers */
    uint64_t window_entries, window_bytes, window_puts, window_hits, window_misses, window_expired,
             window_evicted, window_replay_exact, window_replay_bounded, window_replay_tokens,
             window_fetches;
} sched_stats;

/* Latency histograms, seconds; SCHED_HIST_N bucket upper bounds (+Inf implied). */
#define SCHED_HIST_N 14
extern const double sched_hist_bounds[SCHED_HIST_N];
typedef struct {
    uint64_t counts[SCHED_HIST_N + 1];  /* per bucket, not cumulative; last is +Inf */
    uint64_t n;                         /* observations */
    double sum;                         /* seconds */
} sched_hist;
/* Counts one observation of v seconds (the caller holds whatever lock guards h). */
void sched_hist_add(sched_hist *h, double v);

typedef struct sched sched;
typedef struct sched_req sched_req;

/* The default step budget for max_seqs running sequences (<= 0: 16): max_seqs +
 * SCHED_PREFILL_CHUNK. Size the engine's max batch with it (engine_opts.max_batch_tokens). */
int sched_default_step_tokens(int max_seqs);
/* Starts the engine thread. The engine (and its model) must outlive the scheduler. */
sched_status sched_new(engine *e, const sched_opts *opts, sched **out);
/* Stops the engine thread (running and queued requests finish CANCELLED) and frees the
 * scheduler. Every request handle must have been released before. */
void sched_free(sched *s);
/* Refuses new submissions (SCHED_ERR_STOPPED) and cancels every queued and running request,
 * so that streams end; call before stopping the HTTP server, then sched_free. */
void sched_shutdown(sched *s);

/* Draining, for a server that stops without cutting its streams: sched_drain refuses new
 * submissions (SCHED_ERR_STOPPED) while every request already accepted, queued or running,
 * goes on to its normal end; sched_wait_idle waits for that; sched_abort ends what is left
 * (FINISH ABORTED, after the outputs already produced) when the drain deadline has come. */
void sched_drain(sched *s);
/* True once sched_drain, sched_abort or sched_shutdown was called (for /health). */
bool sched_draining(sched *s);
/* Waits up to timeout_ms (< 0: forever) until every accepted request has its FINISH record
 * published. Returns how many still had none (0: idle). */
int sched_wait_idle(sched *s, int timeout_ms);
/* Refuses new submissions and ends every queued and running request ABORTED before its next
 * step (a request the caller cancelled already still ends CANCELLED). */
void sched_abort(sched *s);

const char *sched_status_name(sched_status st);
const char *sched_finish_name(sched_finish f);   /* "stop", "length", "cancelled", "error", "aborted", "refused", "unavailable" */
int sched_n_ctx(const sched *s);

/* Queues a request. On SCHED_OK *out is a handle the caller polls and must release. */
sched_status sched_submit(sched *s, const sched_params *p, sched_req **out);
/* Waits up to timeout_ms (0: do not wait, < 0: forever) for outputs; copies up to max of
 * them into out and returns how many. The FINISH record comes last; after it has been
 * returned every call returns 0 at once. */
int sched_poll(sched_req *r, sched_output *out, int max, int timeout_ms);
/* An embedding request's pooled vector, (dim) floats, not normalised: valid once its FINISH
 * STOP was polled, until sched_release; NULL for a generation or before. */
const float *sched_embedding(const sched_req *r);
/* True once the FINISH record has been returned by sched_poll. */
bool sched_done(const sched_req *r);
/* Ends the request as soon as the engine thread sees it (before its next step): its KV
 * blocks are released then. Outputs already produced remain pollable, followed by FINISH
 * CANCELLED (unless it had finished already). Safe to call more than once. */
void sched_cancel(sched_req *r);
/* Cancels if needed and frees the handle; r must not be used afterwards. */
void sched_release(sched_req *r);

void sched_get_stats(sched *s, sched_stats *st);
/* The engine it runs (for its thread-safe readers, such as engine_moe_load). */
engine *sched_engine(sched *s);
/* Its window cache (thread-safe; NULL for a model without window layers): a cluster worker
 * journals it for the gateway's directory and serves and keeps fetched states through it. */
struct wincache;
struct wincache *sched_wincache(sched *s);
/* Copies the time-to-first-token, inter-token latency, step duration and store load wait
 * (seconds from the start of a request's block store load to its admission: the part of its
 * time to first token spent getting its blocks, before any compute) histograms; NULL skips. */
void sched_get_hists(sched *s, sched_hist *ttft, sched_hist *itl, sched_hist *step, sched_hist *load_wait);

#endif
