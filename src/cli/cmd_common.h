/*
 * cmd_common: what the subcommands do alike at start: checked numeric option values (every
 * subcommand), and for the long-running ones (serve, gateway, worker) the stop signals,
 * loading a model with its tokenizer, and (serve, worker) the engine options, the engine and
 * the scheduler options, with their error messages.
 */
#ifndef TM_CMD_COMMON_H
#define TM_CMD_COMMON_H

#include <signal.h>
#include <stdbool.h>

#include "cli/cmd_opts.h"
#include "cluster/auth.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "grammar/grammar.h"
#include "http/http.h"
#include "model/model.h"
#include "recipe/tokenizer.h"

/* Option values: z must be a number and nothing else (no empty string, no leading blanks, no
 * trailing text such as "2x"), without overflow, and within [lo, hi]. On success *out is set
 * and true returned; otherwise *out is untouched, one line goes to stderr, e.g.
 *   tokenmill bench: --pp: 'abc' is not a whole number in 0..16777216
 * and false is returned (the caller exits with 2). opt names the option as typed. */
bool cmd_common_int(const char *prog, const char *opt, const char *z, long lo, long hi, long *out);
/* The same for a decimal number (strtod's syntax: 1e-6 and 0.5 are fine; nan, inf never are:
 * they fail the range check). */
bool cmd_common_num(const char *prog, const char *opt, const char *z, double lo, double hi, double *out);

/* The engine and scheduler options of the processes that run an engine (serve, worker). */
typedef struct {
    long threads;        /* kernel threads, 0: one per core */
    long ctx;            /* tokens per sequence, 0: cmd_common_default_ctx */
    bool ctx_default;    /* ctx was 0 and cmd_common_engine_new chose it */
    long max_seqs;       /* sequences in flight */
    long kv_mib;         /* KV pool cap, MiB */
    int kv_type;         /* --kv-type: an engine_kv_type (0: F16) */
    long max_queue;      /* requests waiting for admission */
    long step_tokens;    /* tokens per step with decodes, 0: sched_default_step_tokens */
    long spec_room;      /* of those, the room the default adds for verify rows (sched_opts) */
    long prefill_step;   /* tokens per step without decodes */
    double step_ms;      /* time target of a step with decodes, ms; 0: token budgets only */
    double prefill_step_ms; /* time target of a step without decodes, ms; 0: 4 x step_ms */
    double window_mib;   /* window cache RAM, MiB (models with sliding-window layers); 0: none */
    double window_ttl;   /* seconds a window state is kept */
    int window_replay;   /* 0: bounded, 1: exact (a missing window state) */
    int spec;            /* --spec: 0 off, 1 ngram (prompt lookup; and the model's MTP layers
                          * if it has them), 2 mtp (the model's MTP layers only), 3 dspark, 4
                          * dflash (the --draft dflash drafter with / without its confidence head) */
    double spec_p_min;   /* --spec-p-min: a dflash draft ends before its first token below it */
    long spec_max;       /* most drafted tokens verified per sequence and step */
    long spec_fixed;     /* 0: the count is chosen per step; else always this many */
    const char *draft;   /* --draft: a draft model's GGUF, or NULL */
    long draft_layers;   /* --draft-layers: self-speculation on the first N layers, 0: off */
    /* made by cmd_common_engine_new with --draft / --draft-layers, and with --spec when the
     * model has MTP layers; cmd_common_draft_free */
    model *draft_model;  /* the draft (with --draft-layers a view of the model's weights) */
    engine *draft_engine;
    bool draft_shares;   /* draft_model shares the model's weights (free the view only) */
    struct engine_dflash *dflash; /* --draft on a dflash drafter: its pass (draft_model the drafter,
                          * draft_engine NULL) */
    model *mtp_model;    /* a view of the model's first MTP layer (model_mtp_view) */
    model *mtp_file;     /* the MTP-only file the view is of (deepseek4, --draft FILE), or NULL:
                          * the model's own layer */
    engine *mtp_engine;
    const char *cpus;    /* --cpus LIST: the CPUs the kernel threads may run on, or NULL: all allowed */
    bool no_overlap;     /* --no-overlap: outputs published before the next step is planned */
} cmd_engine_opts;
#define CMD_ENGINE_OPTS_DEFAULT \
    { .max_seqs = 16, .kv_mib = 2048, .max_queue = 256, .prefill_step = SCHED_PREFILL_STEP, \
      .window_mib = 1024, .window_ttl = 180, .spec_max = SPEC_DEFAULT_MAX }
/* --ctx's default: the model's trained context when the KV of one whole context fits the KV
 * cap (kv_mib), else the most 128-token blocks that fit, but never less than the trained
 * context or 4096, whichever is smaller (what the pool always held, past the cap if need be).
 * Prints one line "tokenmill PROG: context N tokens: WHY" on stderr. */
long cmd_common_default_ctx(const char *prog, const model *m, long kv_mib, engine_kv_type kv_type);
/* The option table entries of the engine options (--threads/-t, --cpus, --ctx/-c, --max-seqs,
 * --kv-mib, --kv-type, --max-queue, --step-tokens, --prefill-step-tokens, --step-ms, --prefill-step-ms,
 * --window-mib, --window-ttl, --window-replay, --spec, --spec-p-min, --spec-max, --spec-fixed, --draft,
 * --draft-layers, --no-overlap)
 * writing into *o, in out (a table of its own, END-terminated): include it with
 * { .kind = CMD_OPT_TABLE, .dst = out }. */
#define CMD_PLACE_TABLE_N 3
#define CMD_ENGINE_TABLE_N (21 + CMD_PLACE_TABLE_N)   /* its entries, then the placement table it includes */
const cmd_opt *cmd_common_engine_table(cmd_engine_opts *o, cmd_opt out[CMD_ENGINE_TABLE_N]);
/* The same for the kernel threads' placement that cmd_common_place reads: --threads/-t and
 * --cpus (the engine table includes it; bench and expert, which take no other engine option,
 * include it alone). */
const cmd_opt *cmd_common_place_table(long *threads, const char **cpus, cmd_opt out[CMD_PLACE_TABLE_N]);
/* The same for the HTTP layer's connection limits (http/http.h): --max-connections,
 * --max-client-connections, --request-timeout. */
#define CMD_HTTP_TABLE_N 5
const cmd_opt *cmd_common_http_table(http_opts *o, cmd_opt out[CMD_HTTP_TABLE_N]);
/* The same for the structured-output compile budgets (grammar/grammar.h): --grammar-max-states,
 * --grammar-max-stacks, --grammar-max-seconds, --grammar-cache. *o starts as
 * grammar_limits_get(); the command calls grammar_limits_set(o) after parsing. */
#define CMD_GRAMMAR_TABLE_N 5
const cmd_opt *cmd_common_grammar_table(grammar_limits *o, cmd_opt out[CMD_GRAMMAR_TABLE_N]);
/* The kernel threads' placement (util/topo.h) for --threads (0: one per usable physical
 * core) and --cpus (NULL: every allowed CPU): the thread count in *n and, when the threads
 * are pinned, each one's CPU in cpus (TOPO_MAX_CPUS entries) and *pinned true; logs
 * "tokenmill PROG: threads: ...". Pinned: with --cpus, or when the threads take every usable
 * physical core (the default); not pinned: fewer threads than cores without --cpus (other
 * processes would pin to the same first cores), more threads than CPUs, or no readable
 * /sys without --cpus (*n: threads, or the online CPUs). false after a message (a bad or
 * unusable --cpus list). */
bool cmd_common_place(const char *prog, long threads, const char *cpus_list, int *n, int *cpus, bool *pinned);

/* Starts the engine for m: its threads placed (cmd_common_place), the context and step budgets resolved into *o (ctx, step_tokens),
 * a batch for the larger budget, a KV pool of max_seqs full contexts capped by kv_mib (at
 * least one context), faulted in now so that the first steps and store fills take no page
 * faults. NULL after "tokenmill PROG: why" on stderr. */
engine *cmd_common_engine_new(const char *prog, model *m, cmd_engine_opts *o);
/* The start-up line's KV part: "KV N blocks of X KiB per 128 tokens" (", latent: V is K" for
 * a pool of one row per position), the size of a block in the pool, the store and a handoff. */
void cmd_common_kv_desc(engine *e, char *buf, size_t n);
/* Frees the draft model and engine cmd_common_engine_new made (after the scheduler). */
void cmd_common_draft_free(cmd_engine_opts *o);
/* Faults the model's mapped weights in (model_resident) over n_threads temporary threads
 * and logs "tokenmill PROG: weights resident: ..." with the time it took. For tests, the
 * environment variable TOKENMILL_TEST_RESIDENT_GATE=FILE holds it back until FILE exists
 * (polled every 10 ms, at most 6000 times), so that a test can observe the server before. */
void cmd_common_resident(const char *prog, model *m, int n_threads);
/* The scheduler options for an engine made by cmd_common_engine_new (bio may be NULL). */
sched_opts cmd_common_sched_opts(const cmd_engine_opts *o, blockio *bio, const tokenizer *tok);

/* Blocks SIGINT and SIGTERM in the calling thread and ignores SIGPIPE. Call it before any
 * thread starts: threads inherit the mask, so only the main loop's sigwait/sigtimedwait on
 * *set takes a stop signal, and one arriving while threads start cannot kill the process
 * before its clean shutdown. */
void cmd_common_block_stop_signals(sigset_t *set);
/* From now on (a shutdown has begun) SIGINT/SIGTERM end the process at once: "tokenmill PROG:
 * second signal, exiting now" and status 128 + the signal. The handler is installed and the
 * signals unblocked in the calling thread (every other thread keeps them blocked). */
void cmd_common_arm_second_signal(const char *prog);

/* Splits one -m value in place: NAME=FILE when the text before the first '=' is a name (no '/')
 * and the whole is not itself an existing file; *name is then NAME (else NULL) and *path the
 * file. False after "tokenmill PROG: ..." when the file part is empty. serve, gateway and
 * worker read -m the same way. */
bool cmd_common_model_spec(const char *prog, char *spec, const char **name, const char **path);

/* Loads the GGUF at path and its tokenizer; on failure prints "tokenmill PROG: why" and
 * returns false with whatever was loaded freed (*m and *tok NULL). */
bool cmd_common_load_model(const char *prog, const char *path, model **m, tokenizer **tok);
/* Loads only the vocabulary of the GGUF at path (no weights); on failure prints
 * "tokenmill PROG: why" and returns false with *tok NULL. */
bool cmd_common_load_vocab(const char *prog, const char *path, tokenizer **tok);

/* Expert parallelism (cluster/ep.h) for serve and worker: the process leads a group whose
 * members (`tokenmill expert`) compute some of the experts. */
typedef struct {
    cmd_opt_list members;        /* --ep-member HOST:PORT (repeatable, or comma-separated) */
    const char *member_v[64];    /* members' storage */
    long redundant;              /* --redundant-experts N */
    double timeout_s;            /* --ep-timeout S */
    double rebalance_s;          /* --ep-rebalance S */
    int overlap_off;             /* --ep-overlap on|off: index, 0 on (two micro-batches) */
} cmd_ep_opts;
#define CMD_EP_OPTS_DEFAULT { .timeout_s = 5, .rebalance_s = 60 }
/* The option table entries of those (--ep-member, --redundant-experts, --ep-timeout,
 * --ep-rebalance, --ep-overlap), as cmd_common_engine_table. */
#define CMD_EP_TABLE_N 6
const cmd_opt *cmd_common_ep_table(cmd_ep_opts *o, cmd_opt out[CMD_EP_TABLE_N]);
/* The cluster key from key_path (NULL: the default key, generated on first use) into key, and
 * the file it came from into used (usedsz bytes); with say, "tokenmill PROG: cluster key FILE"
 * on stderr. false after "tokenmill PROG: why" on stderr. */
bool cmd_common_cluster_key(const char *prog, const char *key_path, auth_key *key, char *used, size_t usedsz, bool say);

struct ep_group;
/* Forms the group when members were named (*out NULL otherwise): the key from key_path (NULL:
 * the default key), logs "tokenmill PROG: expert group of N processes ...". false after a
 * message on stderr. Free with ep_group_free before the engine (after the scheduler). */
bool cmd_common_ep_start(const char *prog, engine *e, cmd_ep_opts *o, const char *key_path, struct ep_group **out);

struct api_ctx;
/* The API routes serve and the gateway both answer, on h with c (chat, responses and messages
 * where they are linked in). */
void cmd_common_api_routes(http_server *h, struct api_ctx *c);

#endif
