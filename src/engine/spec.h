/*
 * spec: speculative decoding's pure parts: drafting by prompt lookup, the acceptance
 * estimate of a request, the choice of how many drafted tokens each sequence verifies, and
 * the acceptance rule of speculative sampling. The scheduler (sched.c) puts a sequence's last
 * token and its K verified drafts into one engine step as K + 1 positions that all want
 * logits; this module knows no engine, no KV and no request.
 *
 * DESIGN.
 * - Prompt lookup (llama.cpp's n-gram drafting): the last n tokens of the sequence are looked
 *   up in its earlier tokens, n from n_max down to n_min, the most recent match first; the
 *   tokens that followed the match are the draft, continued from the draft itself where they
 *   reach the end (llama.cpp's n-gram cache drafting likewise looks up again after each
 *   drafted token): a sequence caught in a loop of period p drafts k tokens of the loop, not
 *   p. Free to make, and exactly what an agent quoting tool output, files or earlier answers
 *   repeats. Each drafted token comes with a confidence, as a draft model's come with its
 *   probabilities: the share of the suffix's earlier occurrences that went on the same way (by
 *   the rule of succession, so one occurrence says 2/3; a draft past what any occurrence
 *   shows, in a loop's first repetition, is the token one period back again and takes its
 *   confidence). A suffix that recurs in a loop is followed the same way every time and its
 *   drafts nearly always pass; one followed by different tokens before often fails (measured in
 *   docs/spec.md).
 * - Acceptance estimate: the k-th drafted token of a step is tested only if all before it
 *   were accepted, so each request keeps one running rate per draft position: of its k-th
 *   drafts tested, the share accepted (an exponential average that starts from a prior: the
 *   source's server-wide rate at that position, followed as it learns, SPEC_ACCEPT_PRIOR
 *   before that). One rate for every position would take the first token's acceptance for
 *   the later ones', which are not alike (a lookup that finds the right next token may still
 *   quote the wrong continuation after it; a model that agrees on one token often agrees on
 *   the next). But every source gives a confidence for each drafted token that already
 *   conditions on the tokens before it (a model's probability, prompt lookup's agreement of
 *   the occurrences that went on like the draft so far), so once drafts were tested (the
 *   server's, until the request has its own) a token's estimate is its confidence calibrated
 *   by the request's outcomes: the confidence times the request's acceptance over every
 *   position pooled, over the mean confidence of the drafts it tested. Per-position rates
 *   mix drafts of every confidence and priced a loop's fourth token like any fourth token
 *   (on the quoting workload, single requests verified 2 of 5 loop drafts in their first
 *   steps where a fixed K = 4 verified and kept 4); the pooled calibration is one number,
 *   learned from every tested draft. The per-position rates remain the estimate before any
 *   draft with a confidence was tested, and size a drafting model's drafts
 *   (spec_seq_draft_len). The k-th token's expected gain is the product of the estimates up
 *   to it.
 * - The verify count (spec_choose): a step's cost depends on its make-up (the step time
 *   curve, learned online by steptime.c), its yield is one step of progress for each running
 *   request (a decode's token, or a prompt chunk: a longer step delays both) plus the expected
 *   accepted drafts, each of which saves its request a step. For a given number j of extra
 *   tokens the best drafts to verify are the j with the largest expected gain (gains fall
 *   along each sequence's draft, so the j best are prefixes); spec_choose walks j up from 0, merging the sequences' drafts by
 *   gain with a heap, and keeps the j with the most expected tokens per predicted second of
 *   the round: the step, plus what drafting costs beside it (a draft model's own steps, the
 *   same whatever is verified). Any monotone step-time curve works, the linear model's or a
 *   recorded one.
 * - Probes: a request whose drafts are not worth verifying (or, from a costly source, making)
 *   would never test them again and keep a stale estimate. After SPEC_PROBE_STEPS decode steps
 *   with nothing verified one draft is made and verified anyway; each probe that accepts
 *   nothing doubles the gap (up to SPEC_PROBE_MAX), one that accepts resets it. A request's
 *   first draft is a probe, and a new request starts from the source's server-wide running
 *   rate (a draft model's quality is mostly the model pair's), so poor drafts cost about one
 *   draft round per gap, not one per step.
 * - Acceptance rule (spec_verify_token, Leviathan et al. / Chen et al.): a drafted token d
 *   drawn from the draft's distribution q is kept with probability min(1, p(d) / q(d)) under
 *   the target's distribution p, otherwise the output is drawn from norm(max(0, p - q)); the
 *   output is then distributed exactly as p. For a deterministic draft (prompt lookup) q is
 *   one-hot, the rule keeps d with probability p(d) and otherwise draws from p without d:
 *   the same law as drawing from p and comparing with d, which is what the scheduler does (it
 *   keeps the sampler's draws, and so a seeded request's tokens, as without speculation).
 *
 * Nothing here allocates after spec_chooser_new. Not thread-safe: one caller per object.
 */
#ifndef TM_SPEC_H
#define TM_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#define SPEC_MAX_K 8            /* most drafted tokens one sequence verifies in a step */
#define SPEC_DEFAULT_MAX 5      /* --spec-max default (DeepSeek drafts 5) */
#define SPEC_NGRAM_MAX 3        /* longest suffix looked up by prompt lookup */
#define SPEC_NGRAM_MIN 1        /* shortest */
#define SPEC_NGRAM_WINDOW 8192  /* tokens searched back from the end (bounds the lookup's cost) */
#define SPEC_ACCEPT_PRIOR 0.5   /* acceptance estimate of a request before any draft was tested */
#define SPEC_ACCEPT_DECAY 0.85  /* weight kept by a request's running rate per tested draft */
#define SPEC_SHARED_DECAY 0.95  /* the same for a source's server-wide rate (all its requests) */
#define SPEC_MIN_GAIN 0.05      /* spec_seq_draft_len's threshold before draft steps were timed */
#define SPEC_PRIOR_MIN_TESTED 8 /* drafts of a source tested server-wide before their running rate,
                                 * not SPEC_ACCEPT_PRIOR, is a new request's estimate */
#define SPEC_PROBE_STEPS 16     /* decode steps without a verified draft after which one is made
                                 * and verified anyway (the estimate must go on being measured) */
#define SPEC_PROBE_MAX 256      /* the longest gap: it doubles while probes accept nothing */
#define SPEC_PROBE_SHARE 0.02   /* most of the time a draft model's probes may cost (counted from
                                 * the server's start): a probe also feeds the draft model what it
                                 * skipped */

/* Draft sources (bits of sched_opts.spec_sources). */
typedef enum {
    SPEC_SRC_NGRAM = 1,         /* prompt lookup over the sequence's own tokens */
    SPEC_SRC_MODEL = 2,         /* a draft model (specdraft.h) */
    SPEC_SRC_MTP = 4,           /* the model's MTP layer (specdraft.h) */
} spec_source;
#define SPEC_N_SRC 3            /* sources; source i is bit 1 << i */

/* Source i's name ("ngram", "model", "mtp"), for metrics and logs. */
const char *spec_source_name(int i);

/* Prompt lookup: drafts up to k_max (at most SPEC_MAX_K) tokens into out for the sequence
 * toks[0..n) (see the design). With prob (k_max; NULL: not wanted) it also gives each drafted
 * token's estimated chance of being right, by the rule of succession over the earlier
 * occurrences of the matched suffix: (a + 1) / (c + 2), c occurrences followed by the tokens
 * drafted before it and a of them by it too (c = 0: the confidence of the token one period
 * back). Returns the count drafted, 0 when no suffix of n_min..n_max tokens recurs. */
int spec_ngram_draft(const int32_t *toks, int n, int n_max, int n_min, int k_max, int32_t *out, float *prob);

#define SPEC_POOLED SPEC_MAX_K  /* the rate slot over the drafts of every position */
#define SPEC_RATES (SPEC_MAX_K + 1)

/* A request's running acceptance of its drafts (or a source's, over all its requests). */
typedef struct {
    double rate[SPEC_RATES];    /* rate[k], k < SPEC_MAX_K: estimated probability that the k-th
                                 * drafted token (from 0) is accepted when all before it were;
                                 * rate[0] is the request's acceptance of its drafts' first
                                 * tokens; rate[SPEC_POOLED] the same over the tested drafts of
                                 * every position: wprior[k] * prior[k] + own[k] */
    double own[SPEC_RATES];     /* the exponential average of the outcomes in slot k, its
                                 * weights summing to 1 - wprior[k] */
    double wprior[SPEC_RATES];  /* weight left to the prior: decay^(outcomes seen in slot k) */
    double prior[SPEC_RATES];   /* SPEC_ACCEPT_PRIOR, or the source's server-wide rate */
    double decay;               /* weight kept per outcome (SPEC_ACCEPT_DECAY, SPEC_SHARED_DECAY) */
    double mean_prob;           /* running mean of the draft's own confidence in the tested
                                 * drafts (a model's probability, prompt lookup's agreement),
                                 * 0 before any */
    uint64_t n_tested;          /* drafted tokens whose verification decided something */
    uint64_t n_accepted;        /* of those, accepted */
} spec_seq;

void spec_seq_init(spec_seq *q);
/* The same for a source's server-wide estimate (a longer memory: SPEC_SHARED_DECAY). */
void spec_seq_init_shared(spec_seq *q);
/* The prior of a request's estimate: the server-wide one all (the same source's drafts of
 * every request) once that has tested SPEC_PRIOR_MIN_TESTED drafts, else SPEC_ACCEPT_PRIOR.
 * Call it every step: a position the request has not tested follows all as it learns (the
 * second tokens of prompt lookup's drafts, rarely verified, would otherwise keep the guess
 * they started from), one it has tested weighs all by what is left of its prior; the mean
 * draft probability is all's until the request has its own. */
void spec_seq_prior(spec_seq *q, const spec_seq *all);
/* Whether the server-wide estimate all has tested enough drafts (SPEC_PRIOR_MIN_TESTED) to be
 * new requests' prior: before that, a costly source's worth is unknown. */
bool spec_seq_proven(const spec_seq *all);
/* One verification: n_accepted drafts were accepted in a row, then one was rejected when
 * rejected is true (the others were not tested: their predecessor was rejected, or the
 * request ended first); prob (NULL: none) the draft's probabilities of those drafts. */
void spec_seq_observe(spec_seq *q, int n_accepted, bool rejected, const float *prob);
/* Expected gain of each of n drafted tokens (the chance it is accepted with all before it),
 * non-increasing: the product of the per-token estimates up to it. With the source's
 * confidence in each token (prob, n; NULL: none) and a mean confidence of tested drafts (the
 * request's, or the server's that spec_seq_prior gives it), a token's estimate is its
 * confidence times the request's calibration: its acceptance of the drafts it tested (every
 * position pooled) over their mean confidence, at most 1. So a confident token counts more
 * wherever it stands in the draft (the confidence of a later token already assumes the ones
 * before it), and a request whose drafts were rejected expects nothing of them however
 * confident. Without a confidence, the request's rate for the token's position. */
void spec_seq_gains(const spec_seq *q, const float *prob, int n, double *out);

/* How many tokens a costly source should draft, at most k_max: those whose expected gain by
 * the running rates alone is at least min_gain (what one draft step costs as a fraction of a
 * target step: a drafted token is worth its step when it saves more); 0 when not even the
 * first is, unless probe (then one: the rate must go on being measured). */
int spec_seq_draft_len(const spec_seq *q, int k_max, double min_gain, bool probe);

/* When a request's drafts are verified anyway (see the design). */
typedef struct {
    int quiet;                  /* decode steps since a draft of it was last verified */
    int gap;                    /* quiet steps that make a probe due */
} spec_probe;

/* Due at once: a request's first draft is a probe. */
void spec_probe_init(spec_probe *p);
bool spec_probe_due(const spec_probe *p);
/* One decode step of the request: verified drafts of it were checked, accepted of them kept. */
void spec_probe_step(spec_probe *p, int verified, int accepted);
/* Makes a probe due now (a draft made to probe must be verified whatever the count says). */
void spec_probe_force(spec_probe *p);
/* A probe was taken elsewhere (another request probes the source for all): the quiet steps
 * start again, so its outcome, not the next step, decides the gap. */
void spec_probe_taken(spec_probe *p);

/* Predicted seconds of the step with n_extra verify tokens added to it (monotone in n_extra;
 * <= 0 when unknown). */
typedef double (*spec_time_fn)(void *arg, int n_extra);

typedef struct spec_chooser spec_chooser;
/* A chooser for at most max_seqs sequences per step (allocates its heap and order arrays). */
spec_chooser *spec_chooser_new(int max_seqs);
void spec_chooser_free(spec_chooser *c);
/* The verify count of each of n_seqs sequences of a step: gains (n_seqs, SPEC_MAX_K) row i
 * holding the expected gains of sequence i's n_draft[i] drafts (non-increasing along the
 * row), base_tokens what the step yields without drafts (the scheduler: its running
 * requests, each a step further), at most
 * max_extra drafted tokens in all, round_s the seconds every round costs beside its step
 * whatever is verified (a draft model's own steps; 0: none). Writes k (n_seqs) and returns
 * their sum, the number of extra tokens that maximises (base_tokens + sum of chosen gains) /
 * (time(sum) + round_s): a costly draft round makes the step's own cost a smaller part of the
 * round, so more verify rows pay. Ties go to the fewer tokens. Returns -1 (k untouched) when
 * n_seqs is out of range or the time is unknown. */
int spec_choose(spec_chooser *c, int n_seqs, const double *gains, const int *n_draft, double base_tokens,
                int max_extra, spec_time_fn time, void *time_arg, double round_s, int *k);

/* Speculative sampling of one position: p and q (n) are the target's and the draft's
 * probabilities (each summing to 1; q(d) > 0), d the drafted token, u_accept and u_resample
 * two independent uniform draws in [0, 1). Returns the output token and sets *accepted when
 * it is d; -1 when d is not in 0..n-1. */
int32_t spec_verify_token(const float *p, const float *q, int n, int32_t d, double u_accept, double u_resample,
                          bool *accepted);

#endif
