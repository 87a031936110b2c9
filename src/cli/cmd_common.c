/*
 * cmd_common: the option parsing all subcommands share and the start-up steps serve, gateway
 * and worker share (see cmd_common.h).
 */
#include "cli/cmd_common.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster/auth.h"
#include "cluster/ep.h"
#include "engine/engine_dflash.h"
#include "engine/engine_dsv4.h"
#include "engine/kvpool.h"
#include "model/model_dflash.h"
#include "model/model_dsv4.h"
#include "util/threadpool.h"
#include "recipe/api.h"
#include "util/topo.h"
#include "util/util.h"

#pragma weak api_chat_register
#pragma weak api_responses_register
#pragma weak api_messages_register

bool cmd_common_int(const char *prog, const char *opt, const char *z, long lo, long hi, long *out)
{
    char *end = NULL;
    long v = 0;
    errno = 0;
    if (*z && !isspace((unsigned char)*z)) v = strtol(z, &end, 10);
    if (!end || end == z || *end || (errno && errno != ERANGE)) {
        fprintf(stderr, "tokenmill %s: %s: '%s' is not a whole number in %ld..%ld\n", prog, opt, z, lo, hi);
        return false;
    }
    if (errno == ERANGE || v < lo || v > hi) {  /* a number, but not one the option takes */
        fprintf(stderr, "tokenmill %s: %s: %s is %s: it must be in %ld..%ld\n", prog, opt, z,
                (errno == ERANGE ? *z == '-' : v < lo) ? "below the minimum" : "above the maximum", lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool cmd_common_num(const char *prog, const char *opt, const char *z, double lo, double hi, double *out)
{
    char *end = NULL;
    double v = 0;
    errno = 0;
    if (*z && !isspace((unsigned char)*z)) v = strtod(z, &end);
    if (!end || end == z || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "tokenmill %s: %s: '%s' is not a number in %g..%g\n", prog, opt, z, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

void cmd_common_block_stop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static char cmd_common_exit_msg[96];   /* written by the handler: set before it is installed */
static size_t cmd_common_exit_len;

/* A signal during the shutdown: exit now (async-signal-safe calls only). */
static void cmd_common_exit_now(int sig)
{
    ssize_t w = write(STDERR_FILENO, cmd_common_exit_msg, cmd_common_exit_len);
    (void)w;
    _exit(128 + sig);
}

void cmd_common_arm_second_signal(const char *prog)
{
    int n = snprintf(cmd_common_exit_msg, sizeof cmd_common_exit_msg, "tokenmill %s: second signal, exiting now\n", prog);
    cmd_common_exit_len = n > 0 && (size_t)n < sizeof cmd_common_exit_msg ? (size_t)n : 0;
    struct sigaction sa = { .sa_handler = cmd_common_exit_now };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

bool cmd_common_model_spec(const char *prog, char *spec, const char **name, const char **path)
{
    *name = NULL;
    *path = spec;
    char *eq = strchr(spec, '=');
    if (!eq || eq == spec || memchr(spec, '/', (size_t)(eq - spec)) || access(spec, F_OK) == 0) return true;
    *eq = 0;
    *name = spec;
    *path = eq + 1;
    if (!**path) {
        fprintf(stderr, "tokenmill %s: -m %s=: no file after the name\n", prog, spec);
        return false;
    }
    return true;
}

bool cmd_common_load_model(const char *prog, const char *path, model **m, tokenizer **tok)
{
    char err[512];
    *m = NULL;
    *tok = NULL;
    if (model_load(path, NULL, m, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        return false;
    }
    if (tokenizer_load((*m)->g, tok, err, sizeof err) != TOKENIZER_OK) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        model_free(*m);
        *m = NULL;
        return false;
    }
    return true;
}

bool cmd_common_load_vocab(const char *prog, const char *path, tokenizer **tok)
{
    char err[512];
    gguf *g;
    *tok = NULL;
    if (gguf_open(path, &g, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        return false;
    }
    tokenizer_status st = tokenizer_load(g, tok, err, sizeof err);
    gguf_close(g);
    if (st != TOKENIZER_OK) {
        fprintf(stderr, "tokenmill %s: %s: %s\n", prog, path, err);
        *tok = NULL;
        return false;
    }
    return true;
}

const cmd_opt *cmd_common_place_table(long *threads, const char **cpus, cmd_opt out[CMD_PLACE_TABLE_N])
{
    const cmd_opt t[CMD_PLACE_TABLE_N] = {
        { "--threads", "-t", CMD_OPT_LONG, threads, 0, 1024, .arg = "N", .help = "kernel threads (default: one per physical core)" },
        { "--cpus", NULL, CMD_OPT_STR, cpus, .arg = "LIST", .help = "CPUs the kernel threads run on, e.g. 0-15,32-47 (default: all allowed)" },
        { 0 },
    };
    memcpy(out, t, sizeof t);
    return out;
}

const cmd_opt *cmd_common_engine_table(cmd_engine_opts *o, cmd_opt out[CMD_ENGINE_TABLE_N])
{
    cmd_opt *place = out + CMD_ENGINE_TABLE_N - CMD_PLACE_TABLE_N;   /* the tail of out holds it */
    const cmd_opt t[CMD_ENGINE_TABLE_N - CMD_PLACE_TABLE_N] = {
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_place_table(&o->threads, &o->cpus, place) },
        { "--ctx", "-c", CMD_OPT_LONG, &o->ctx, 0, 1 << 24, .arg = "N", .help = "tokens per sequence (default: the model's trained context if its KV fits --kv-mib)" },
        { "--max-seqs", NULL, CMD_OPT_LONG, &o->max_seqs, 1, 4096, .arg = "N", .help = "sequences running at once (default 16)" },
        { "--kv-mib", NULL, CMD_OPT_LONG, &o->kv_mib, 1, 1 << 24, .arg = "N", .help = "cap of the KV pool in MiB (default 2048)" },
        { "--kv-type", NULL, CMD_OPT_CHOICE, &o->kv_type, .choices = "f16|f32|q8_0|q4_0", .help = "KV cache elements: q8_0 / q4_0 hold 1.9x / 3.6x the tokens of f16 in the same memory and store (default f16)" },
        { "--max-queue", NULL, CMD_OPT_LONG, &o->max_queue, 1, 1 << 20, .arg = "N", .help = "requests waiting to run (default 256)" },
        { "--step-tokens", NULL, CMD_OPT_LONG, &o->step_tokens, 1, 1 << 16, .arg = "N", .help = "tokens of a step with decodes (default max-seqs + 64)" },
        { "--prefill-step-tokens", NULL, CMD_OPT_LONG, &o->prefill_step, 1, 1 << 16, .arg = "N", .help = "tokens of a step without decodes (default 512)" },
        { "--step-ms", NULL, CMD_OPT_DOUBLE, &o->step_ms, 0.01, 60000, .arg = "MS", .help = "time target of a step with decodes (default: token budgets only)" },
        { "--prefill-step-ms", NULL, CMD_OPT_DOUBLE, &o->prefill_step_ms, 0.01, 60000, .arg = "MS", .help = "time target of a step without decodes (default 4 x --step-ms)" },
        { "--window-mib", NULL, CMD_OPT_DOUBLE, &o->window_mib, 0, 1 << 24, .arg = "N", .help = "sliding-window models: RAM for the window cache in MiB (default 1024; 0: keep none)" },
        { "--window-ttl", NULL, CMD_OPT_DOUBLE, &o->window_ttl, 0.001, 1e7, .arg = "S", .help = "seconds a window state is kept (default 180)" },
        { "--window-replay", NULL, CMD_OPT_CHOICE, &o->window_replay, .choices = "bounded|exact", .help = "a missing window state: recompute the last block (default) or exactly" },
        { "--spec", NULL, CMD_OPT_CHOICE, &o->spec, .choices = "off|ngram|mtp|dspark|dflash", .arg = "SRC", .help = "speculative decoding: ngram drafts by prompt lookup (with the model's MTP layers too, if it has them), mtp by its MTP layers, dspark / dflash by the --draft dflash drafter with / without its confidence head as the acceptance estimate (default off)" },
        { "--spec-p-min", NULL, CMD_OPT_DOUBLE, &o->spec_p_min, 0, 1, .arg = "P", .help = "a dflash drafter's draft ends before its first token whose confidence (dspark) or probability (dflash) is below P (default 0: none)" },
        { "--spec-max", NULL, CMD_OPT_LONG, &o->spec_max, 1, SPEC_MAX_K, .arg = "K", .help = "most drafted tokens a sequence verifies per step (default 5)" },
        { "--spec-fixed", NULL, CMD_OPT_LONG, &o->spec_fixed, 1, SPEC_MAX_K, .arg = "K", .help = "always verify K drafted tokens (default: chosen per step from the step time)" },
        { "--draft", NULL, CMD_OPT_STR, &o->draft, .arg = "FILE", .help = "speculative decoding with a draft model of the same vocabulary (beside prompt lookup and the model's MTP layers when --spec is on: each request drafts from the source it accepts best)" },
        { "--draft-layers", NULL, CMD_OPT_LONG, &o->draft_layers, 1, 4096, .arg = "N", .help = "speculative decoding drafted by the model's first N layers" },
        { "--no-overlap", NULL, CMD_OPT_FLAG, &o->no_overlap, .help = "publish each step's outputs before planning the next, not while it computes (same outputs)" },
        { 0 },
    };
    memcpy(out, t, sizeof t);
    return out;
}

/* --cors-origin: appends one origin (repeatable); "*" or a scheme://host[:port] without a path. */
static bool cmd_common_cors(const char *prog, const char *name, const char *value, void *dst)
{
    http_opts *o = dst;
    if (o->n_cors_origin >= HTTP_MAX_CORS) {
        fprintf(stderr, "tokenmill %s: at most %d %s values\n", prog, HTTP_MAX_CORS, name);
        return false;
    }
    const char *host = strstr(value, "://");
    if (strcmp(value, "*") && (!host || host == value || !host[3] || strchr(host + 3, '/'))) {
        fprintf(stderr, "tokenmill %s: %s '%s': want '*' or an origin such as https://app.example:8443 (no path)\n",
                prog, name, value);
        return false;
    }
    o->cors_origin[o->n_cors_origin++] = value;
    return true;
}

#define CMD_CTX_SHORT 4096   /* tokens: the former default context, and what a pool holds
                              * max_seqs of when the context is the default */

long cmd_common_default_ctx(const char *prog, const model *m, long kv_mib, engine_kv_type kv_type)
{
    long train = m->hp.n_ctx_train > 0 ? m->hp.n_ctx_train : CMD_CTX_SHORT;
    long floor_ctx = TM_MIN(train, CMD_CTX_SHORT);
    int32_t *lw = xcalloc((size_t)engine_kv_geometry_room(m), sizeof *lw);
    kvpool_opts ko = engine_kv_geometry(m, kv_type, lw);
    /* blocks of the cap, less the one a sequence's next token may open past its context */
    long fit = ((long)kvpool_blocks_for_bytes(&ko, (size_t)kv_mib << 20) - 1) * KVPOOL_BLOCK;
    /* MiB of one whole trained context */
    double mib = (double)((train + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK) * (double)kvpool_geom_block_bytes(&ko) / 1048576.0;
    free(lw);
    long ctx;
    if (train <= fit) {
        ctx = train;
        fprintf(stderr, "tokenmill %s: context %ld tokens: the model's trained context (its KV %.0f MiB, within --kv-mib %ld)\n",
                prog, ctx, mib, kv_mib);
    } else {
        ctx = TM_MAX(fit, floor_ctx);
        fprintf(stderr, "tokenmill %s: context %ld tokens, not the model's %ld: a whole context's KV (%.0f MiB) is past "
                "--kv-mib %ld (raise it, or set --ctx)\n", prog, ctx, train, mib, kv_mib);
    }
    return ctx;
}

const cmd_opt *cmd_common_http_table(http_opts *o, cmd_opt out[CMD_HTTP_TABLE_N])
{
    const cmd_opt t[CMD_HTTP_TABLE_N] = {
        { "--max-connections", NULL, CMD_OPT_INT, &o->max_connections, 1, 1 << 20, .arg = "N", .help = "requests served at once; past it a 503 (default 1024)" },
        { "--max-client-connections", NULL, CMD_OPT_INT, &o->max_client_connections, 1, 1 << 20, .arg = "N", .help = "connections from one address; past it a 429 (default 256)" },
        { "--request-timeout", NULL, CMD_OPT_INT, &o->request_timeout_s, 1, 86400, .arg = "S", .help = "seconds for a request's headers to arrive (default 30)" },
        { "--cors-origin", NULL, CMD_OPT_FN, o, .fn = cmd_common_cors, .arg = "ORIGIN", .help = "let browser pages from ORIGIN call the API (repeat for several; * for any; default none)" },
        { 0 },
    };
    memcpy(out, t, sizeof t);
    return out;
}

const cmd_opt *cmd_common_grammar_table(grammar_limits *o, cmd_opt out[CMD_GRAMMAR_TABLE_N])
{
    const cmd_opt t[CMD_GRAMMAR_TABLE_N] = {
        { "--grammar-max-states", NULL, CMD_OPT_LONG, &o->max_states, 16, 1L << 30, .arg = "N",
          .help = "structured output: compiled states one grammar may have; past it a 400 (default 1048576)" },
        { "--grammar-max-stacks", NULL, CMD_OPT_LONG, &o->max_stacks, 16, 1L << 24, .arg = "N",
          .help = "structured output: parser stacks one grammar state may hold (its ambiguity; default 4096)" },
        { "--grammar-max-seconds", NULL, CMD_OPT_DOUBLE, &o->max_seconds, 1e-3, 3600, .arg = "S",
          .help = "structured output: wall time one grammar compile may take (default 5)" },
        { "--grammar-cache", NULL, CMD_OPT_SIZE, &o->cache_bytes, .arg = "SIZE",
          .help = "structured output: bytes of compiled grammars kept, masks included (default 256M)" },
        { 0 },
    };
    memcpy(out, t, sizeof t);
    return out;
}

/* KV pool blocks for m: max_seqs full contexts, capped by kv_mib, at least one context. A
 * default context longer than CMD_CTX_SHORT counts as CMD_CTX_SHORT there: max_seqs whole
 * trained contexts (128k tokens each) is not what a pool is for, and the cap would take all
 * of kv_mib even for a model whose every request is short. */
static int cmd_common_kv_blocks(const model *m, const cmd_engine_opts *o)
{
    int32_t *lw = xcalloc((size_t)engine_kv_geometry_room(m), sizeof *lw);   /* window layers keep no KV in blocks */
    kvpool_opts ko = engine_kv_geometry(m, (engine_kv_type)o->kv_type, lw);
    size_t ctx_blocks = (size_t)(o->ctx + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK;
    long per_seq = o->ctx_default ? TM_MIN(o->ctx, CMD_CTX_SHORT) : o->ctx;
    size_t want_blocks = (size_t)o->max_seqs * (size_t)((per_seq + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK);
    size_t cap_blocks = (size_t)kvpool_blocks_for_bytes(&ko, (size_t)o->kv_mib << 20);
    free(lw);
    return (int)TM_MAX(TM_MIN(want_blocks, cap_blocks), ctx_blocks + 1);
}

/* Whether two tokenizers have the same vocabulary: every id the same bytes (control tokens'
 * text included). A first difference is described in why. */
static bool cmd_common_same_vocab(const tokenizer *a, const tokenizer *b, char *why, size_t whysz)
{
    int n = tokenizer_n_vocab(a);
    if (n != tokenizer_n_vocab(b)) {
        snprintf(why, whysz, "%d tokens, the model has %d", tokenizer_n_vocab(b), n);
        return false;
    }
    char pa[256], pb[256];
    for (int32_t id = 0; id < n; id++) {
        int la = tokenizer_token_to_piece(a, id, pa, sizeof pa, true);
        int lb = tokenizer_token_to_piece(b, id, pb, sizeof pb, true);
        if (la != lb || (la > 0 && memcmp(pa, pb, (size_t)TM_MIN(la, (int)sizeof pa)))) {
            snprintf(why, whysz, "token %d differs", id);
            return false;
        }
    }
    return true;
}

/* The model's first MTP layer on an engine of its own, whose steps also carry the catch-up of
 * every step's positions (a prefill chunk's included), into o->mtp_model / o->mtp_engine. */
static bool cmd_common_mtp_new(const char *prog, const model *m, cmd_engine_opts *o, const engine_opts *main_eo)
{
    char err[256];
    model *view = xmalloc(sizeof *view);
    model_mtp_view(m, 0, view);
    engine_opts eo = *main_eo;
    eo.n_kv_blocks = cmd_common_kv_blocks(view, o);
    eo.max_batch_tokens += (int)o->max_seqs;   /* a step's rows and each new sequence's first */
    if (engine_new(view, &eo, &o->mtp_engine, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill %s: MTP layer: %s\n", prog, err);
        free(view);
        return false;
    }
    o->mtp_model = view;
    log_info("%s: speculative drafts by the model's MTP layer (blk.%d of %d, %s head)", prog, m->hp.n_layers,
             m->hp.n_layers + m->hp.n_nextn, m->mtp[0].head.data ? "its own" : "the model's");
    return true;
}

/* DeepSeek V4's MTP-only file dm (--draft FILE, as llama.cpp's converter writes it with --mtp)
 * beside m: checked against it (its block continues m's streams after m's last layer), its
 * block on an engine of its own as cmd_common_mtp_new's (dm into o->mtp_file, or freed). */
static bool cmd_common_mtp_file(const char *prog, const model *m, model *dm, cmd_engine_opts *o,
                                const engine_opts *main_eo)
{
    char err[256];
    const model_dsv4 *d = dm->dsv4;
    if (o->spec == 3 || o->spec == 4) {
        fprintf(stderr, "tokenmill %s: --draft %s is a deepseek4 MTP-only file: --spec mtp drafts with it, not --spec "
                "%s\n", prog, o->draft, o->spec == 3 ? "dspark" : "dflash");
        model_free(dm);
        return false;
    }
    if (!m->dsv4 || m->dsv4->mtp_only) {
        snprintf(err, sizeof err, "the model is %s, not a deepseek4 trunk", m->dsv4 ? "an MTP-only file too" :
                 m->hp.arch_name);
    } else if (dm->hp.dim != m->hp.dim || d->hc != m->dsv4->hc) {
        snprintf(err, sizeof err, "its block takes %d streams of %d (%d x %d), the model's are %d of %d", d->hc,
                 dm->hp.dim, d->hc, dm->hp.dim, m->dsv4->hc, m->hp.dim);
    } else if (dm->hp.n_layers != m->hp.n_layers) {
        snprintf(err, sizeof err, "its block is blk.%d, after a trunk of %d layers; the model has %d", dm->hp.n_layers,
                 dm->hp.n_layers, m->hp.n_layers);
    } else {
        err[0] = '\0';
    }
    if (err[0]) {
        fprintf(stderr, "tokenmill %s: --draft %s: the MTP file does not fit the model: %s\n", prog, o->draft, err);
        model_free(dm);
        return false;
    }
    model *view = xmalloc(sizeof *view);
    model_mtp_view(dm, 0, view);
    engine_opts eo = *main_eo;
    eo.n_kv_blocks = cmd_common_kv_blocks(view, o);
    eo.max_batch_tokens += (int)o->max_seqs;   /* a step's rows and each new sequence's first */
    if (engine_new(view, &eo, &o->mtp_engine, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill %s: --draft %s: MTP block: %s\n", prog, o->draft, err);
        free(view);
        model_free(dm);
        return false;
    }
    o->mtp_model = view;
    o->mtp_file = dm;
    log_info("%s: speculative drafts by the MTP block of %s (blk.%d, %d streams of %d, window %d)", prog, o->draft,
             dm->hp.n_layers, d->hc, dm->hp.dim, d->swa);
    return true;
}

/* A dflash drafter dm (--draft FILE) beside m: checked against it, its pass into o->dflash
 * (dm into o->draft_model, or freed). --spec dspark wants its confidence head. */
static bool cmd_common_dflash_new(const char *prog, model *m, model *dm, cmd_engine_opts *o)
{
    char err[256];
    const model_dflash *df = dm->dflash;
    if (!model_dflash_match(m, dm, err, sizeof err)) {
        fprintf(stderr, "tokenmill %s: --draft %s: the dflash drafter does not fit the model: %s\n", prog, o->draft, err);
        model_free(dm);
        return false;
    }
    if (o->spec == 3 && !df->has_conf) {
        fprintf(stderr, "tokenmill %s: --spec dspark: %s has no confidence head (conf_proj); --spec dflash drafts with "
                "it\n", prog, o->draft);
        model_free(dm);
        return false;
    }
    engine_dflash_opts dopt = { .max_seqs = (int)o->max_seqs, .max_tokens = 512, .n_ctx = (int)o->ctx,
                                .n_threads = (int)o->threads };
    if (!(o->dflash = engine_dflash_new(dm, m, &dopt, err, sizeof err))) {
        fprintf(stderr, "tokenmill %s: --draft %s: %s\n", prog, o->draft, err);
        model_free(dm);
        return false;
    }
    o->draft_model = dm;
    o->draft_shares = false;
    log_info("%s: speculative drafts by the %s drafter %s (%d layers over %d of the model's, blocks of %d%s)", prog,
             df->markov_rank ? "DSpark" : "DFlash", o->draft, dm->hp.n_layers, df->n_tl, df->block_size,
             o->spec != 4 && df->has_conf ? ", its confidence head as the acceptance estimate" : "");
    return true;
}

/* The draft model of speculative decoding (--draft FILE or --draft-layers N) and its engine,
 * into o->draft_model / o->draft_engine. */
static bool cmd_common_draft_new(const char *prog, model *m, cmd_engine_opts *o, const engine_opts *main_eo)
{
    char err[256];
    model *dm = NULL;
    if (o->draft && o->draft_layers > 0) {
        fprintf(stderr, "tokenmill %s: give --draft or --draft-layers, not both\n", prog);
        return false;
    }
    if (o->draft_layers > 0) {
        if (o->draft_layers >= m->hp.n_layers) {
            fprintf(stderr, "tokenmill %s: --draft-layers %ld: the model has %d layers, a draft needs fewer\n", prog,
                    o->draft_layers, m->hp.n_layers);
            return false;
        }
        /* self-speculation: the same weights, the engine runs the first layers, then the
         * output norm and head (a view: nothing is loaded or copied) */
        dm = xmalloc(sizeof *dm);
        *dm = *m;
        dm->hp.n_layers = (int)o->draft_layers;
        o->draft_shares = true;
    } else {
        tokenizer *dtok = NULL, *ttok = NULL;
        if (!cmd_common_load_model(prog, o->draft, &dm, &dtok)) return false;
        bool same = tokenizer_load(m->g, &ttok, err, sizeof err) == TOKENIZER_OK;
        char why[128] = "the model's tokenizer";
        same = same && cmd_common_same_vocab(ttok, dtok, why, sizeof why) && dm->hp.n_vocab == m->hp.n_vocab;
        tokenizer_free(dtok);
        tokenizer_free(ttok);
        if (!same) {
            fprintf(stderr, "tokenmill %s: --draft %s: not the model's vocabulary (%s)\n", prog, o->draft, why);
            model_free(dm);
            return false;
        }
        if (dm->dflash) return cmd_common_dflash_new(prog, m, dm, o);
        if (dm->dsv4 && dm->dsv4->mtp_only) return cmd_common_mtp_file(prog, m, dm, o, main_eo);
        if (o->spec == 2) {
            fprintf(stderr, "tokenmill %s: --spec mtp: --draft %s is not an MTP-only file (a deepseek4 file of "
                    "nextn_predict_layers > 0 without the trunk's tensors, as llama.cpp's converter writes with "
                    "--mtp)\n", prog, o->draft);
            model_free(dm);
            return false;
        }
        o->draft_shares = false;
    }
    engine_opts eo = *main_eo;
    eo.n_kv_blocks = cmd_common_kv_blocks(dm, o);
    if (engine_new(dm, &eo, &o->draft_engine, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill %s: draft model: %s\n", prog, err);
        if (o->draft_shares) free(dm);
        else model_free(dm);
        return false;
    }
    o->draft_model = dm;
    return true;
}

void cmd_common_draft_free(cmd_engine_opts *o)
{
    engine_dflash_free(o->dflash);
    o->dflash = NULL;
    engine_free(o->draft_engine);
    if (o->draft_shares) free(o->draft_model);
    else model_free(o->draft_model);
    engine_free(o->mtp_engine);
    free(o->mtp_model);
    model_free(o->mtp_file);
    o->draft_engine = o->mtp_engine = NULL;
    o->draft_model = o->mtp_model = o->mtp_file = NULL;
}

engine *cmd_common_engine_new(const char *prog, model *m, cmd_engine_opts *o)
{
    char err[256];
    if (o->spec == 2 && m->hp.n_nextn == 0 && !(m->dsv4 && o->draft)) {
        fprintf(stderr, "tokenmill %s: --spec mtp: the model has no MTP layers (%s.nextn_predict_layers)%s\n", prog,
                m->hp.arch_name, m->dsv4 ? "; a deepseek4 model's MTP block is a file of its own: --draft FILE" : "");
        return NULL;
    }
    if ((o->spec == 3 || o->spec == 4) && !o->draft) {
        fprintf(stderr, "tokenmill %s: --spec %s needs --draft FILE: a dflash drafter\n", prog,
                o->spec == 3 ? "dspark" : "dflash");
        return NULL;
    }
    if (o->spec_p_min > 0 && o->spec != 3 && o->spec != 4) {
        fprintf(stderr, "tokenmill %s: --spec-p-min needs --spec dspark or dflash\n", prog);
        return NULL;
    }
    /* with prompt lookup on, a model's MTP layers draft too (and a draft model beside them) */
    bool mtp = (o->spec == 1 || o->spec == 2) && m->hp.n_nextn > 0;
    bool drafted = o->draft || o->draft_layers > 0 || mtp;
    if (o->spec_fixed > 0 && !o->spec && !drafted) {
        fprintf(stderr, "tokenmill %s: --spec-fixed needs --spec, --draft or --draft-layers\n", prog);
        return NULL;
    }
    if (o->spec_fixed > o->spec_max) {
        fprintf(stderr, "tokenmill %s: --spec-fixed %ld is above --spec-max %ld\n", prog, o->spec_fixed, o->spec_max);
        return NULL;
    }
    if (o->ctx <= 0) {
        o->ctx = cmd_common_default_ctx(prog, m, o->kv_mib, (engine_kv_type)o->kv_type);
        o->ctx_default = true;
    }
    /* with a time target, the time sizes the steps: the token budget with decodes is only a cap */
    if (o->step_tokens == 0 && o->step_ms > 0) o->step_tokens = o->prefill_step;
    if (o->step_tokens == 0) {
        o->step_tokens = sched_default_step_tokens((int)o->max_seqs);   /* max-seqs + 64 */
        /* a speculating decode carries its drafts too: room for every one's verify rows */
        if (o->spec || drafted) {
            o->spec_room = o->max_seqs * o->spec_max;
            o->step_tokens += o->spec_room;
        }
    }
    /* the engine batch holds the larger of the two step budgets (sched caps both at it) */
    static int cpus[TOPO_MAX_CPUS];   /* one engine per process */
    int n_threads;
    bool pinned;
    if (!cmd_common_place(prog, o->threads, o->cpus, &n_threads, cpus, &pinned)) return NULL;
    engine_opts eo = { .n_threads = n_threads, .cpus = pinned ? cpus : NULL,
                       .max_batch_tokens = (int)TM_MAX(o->step_tokens, o->prefill_step),
                       .kv_type = (engine_kv_type)o->kv_type };
    eo.n_kv_blocks = cmd_common_kv_blocks(m, o);
    engine *e = NULL;
    if (engine_new(m, &eo, &e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        return NULL;
    }
    if ((mtp && !cmd_common_mtp_new(prog, m, o, &eo)) ||
        ((o->draft || o->draft_layers > 0) && !cmd_common_draft_new(prog, m, o, &eo))) {
        cmd_common_draft_free(o);
        engine_free(e);
        return NULL;
    }
    kvpool *kv = engine_kvpool(e);
    kvpool_prefault(kv);
    /* the first real step then finds its scratch pages and code touched (a warm-up that
     * fails, on a pool too small for a block, only leaves that to the first request) */
    engine_warmup(e);
    if (o->draft_engine) engine_warmup(o->draft_engine);
    if (o->mtp_engine) engine_warmup(o->mtp_engine);
    if (kvpool_n_window_layers(kv) > 0) {
        int slots = 0;   /* the longest ring (a layer's parts may keep fewer: DeepSeek V4's) */
        for (int l = 0; l < kvpool_n_layers(kv); l++)
            for (int k = 0; k < 2; k++) slots = TM_MAX(slots, kvpool_ring_slots(kv, l, k));
        log_info("%s: %d window layers (window %d) keep a ring of %d positions per sequence: %.2f MiB each; "
                 "%d full layers in %zu-byte blocks; window states of %.2f MiB",
                 prog, kvpool_n_window_layers(kv), kvpool_window(kv), slots,
                 kvpool_ring_bytes(kv) / 1048576.0, kvpool_n_block_layers(kv), kvpool_block_bytes(kv),
                 kvpool_window_state_bytes(kv) / 1048576.0);
    }
    if (kvpool_state_bytes(kv) > 0)
        log_info("%s: %d linear-attention layers keep a recurrent state of %.2f MiB per sequence, cached at block "
                 "ends for prefix reuse (the window cache); %d full layers in %zu-byte blocks; no speculative decoding",
                 prog, engine_model(e)->hp.n_recurrent, kvpool_state_bytes(kv) / 1048576.0,
                 kvpool_n_block_layers(kv), kvpool_block_bytes(kv));
    if (engine_model(e)->hp.arch == MODEL_ARCH_DEEPSEEK4) {
        /* the compressed layout's true sizes against what the pool takes for them
         * (docs/deepseek4.md, "Per-sequence state and the 128-token block") */
        engine_dsv4_sizes z;
        engine_dsv4_model_sizes(engine_model(e), kvpool_dtype(kv), &z);
        if (z.block > 0)
            log_info("%s: deepseek4 keeps compressed entries in blocks: %.1f KiB per 128-token block in %s (a block "
                     "layer of 128 x %d: %.1f KiB); window states of %.1f KiB (%.1f KiB of raw rows in %s and "
                     "%.1f KiB of ratio-4 carry in F32); rings of %.2f MiB per sequence",
                     prog, (double)z.block_bytes / 1024.0, quant_type_name(kvpool_dtype(kv)), z.slab_width,
                     (double)z.pool_block_bytes / 1024.0, kvpool_window_state_bytes(kv) / 1024.0,
                     (double)z.window_bytes / 1024.0, quant_type_name(kvpool_dtype(kv)), (double)z.carry * 4 / 1024.0,
                     kvpool_ring_bytes(kv) / 1048576.0);
    }
    return e;
}

void cmd_common_kv_desc(engine *e, char *buf, size_t n)
{
    kvpool *p = engine_kvpool(e);
    kvpool_stats st;
    kvpool_get_stats(p, &st);
    /* a DeepSeek V4 block holds compressed entries, not rows (engine_dsv4.h) */
    const char *rows = engine_model(e)->hp.arch == MODEL_ARCH_DEEPSEEK4
                           ? (kvpool_n_window_layers(p) > 0 ? ", compressed entries (the window in rings)"
                                                            : ", a raw K=V row per position")
                           : kvpool_n_parts(p) == 1 ? ", latent: V is K" : "";
    snprintf(buf, n, "KV %s, %d blocks of %.1f KiB per 128 tokens%s", quant_type_name(kvpool_dtype(p)), st.n_blocks,
             (double)kvpool_block_bytes(p) / 1024.0, rows);
}

bool cmd_common_place(const char *prog, long threads, const char *cpus_list, int *n, int *cpus, bool *pinned)
{
    char err[256], line[512];
    bool *only = NULL, *allowed = calloc(TOPO_MAX_CPUS, sizeof *allowed);
    topo *t = malloc(sizeof *t);
    bool ok = false;
    *pinned = false;
    if (!allowed || !t) goto out;
    if (cpus_list) {
        only = calloc(TOPO_MAX_CPUS, sizeof *only);
        if (!only) goto out;
        if (topo_parse_list(cpus_list, only, err, sizeof err) != TOPO_OK) {
            fprintf(stderr, "tokenmill %s: --cpus: %s\n", prog, err);
            goto out;
        }
    }
    const char *root = getenv("TOKENMILL_TEST_SYSFS");   /* tests: a synthetic tree */
    topo_status st = topo_read(root && *root ? root : "/sys", topo_allowed(allowed) ? allowed : NULL, only, t, err, sizeof err);
    if (st == TOPO_ERR_IO && !cpus_list) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        *n = threads > 0 ? (int)threads : nc > 0 ? (int)nc : 1;
        fprintf(stderr, "tokenmill %s: threads: %d, not pinned (%s)\n", prog, *n, err);
        ok = true;
        goto out;
    }
    if (st != TOPO_OK) {
        fprintf(stderr, "tokenmill %s: %s%s\n", prog, cpus_list ? "--cpus: " : "", err);
        goto out;
    }
    *n = topo_place(t, (int)TM_MIN(threads, TOPO_MAX_CPUS), cpus);
    if (*n > t->n) {
        /* two pinned threads on one CPU would spin against each other at every barrier */
        fprintf(stderr, "tokenmill %s: threads: %d, more than the %d usable CPUs: not pinned\n", prog, *n, t->n);
    } else if (!cpus_list && *n < t->n_cores) {
        /* fewer threads than cores and no --cpus: other processes (several servers, tests)
         * may share the machine, and every one of them would pin to the same first cores */
        fprintf(stderr, "tokenmill %s: threads: %d on %d usable physical cores, not pinned (--cpus pins them)\n", prog,
                *n, t->n_cores);
    } else {
        *pinned = true;
        topo_describe(t, cpus, *n, line, sizeof line);
        fprintf(stderr, "tokenmill %s: threads: %s\n", prog, line);
    }
    ok = true;
out:
    free(only);
    free(allowed);
    free(t);
    return ok;
}

void cmd_common_resident(const char *prog, model *m, int n_threads)
{
    const char *gate = getenv("TOKENMILL_TEST_RESIDENT_GATE");
    for (int i = 0; gate && *gate && i < 6000 && access(gate, F_OK) != 0; i++) {
        struct timespec nap = { 0, 10 * 1000 * 1000 };
        nanosleep(&nap, NULL);
    }
    threadpool *tp = threadpool_new(n_threads);   /* NULL: the caller alone */
    model_resident_info ri;
    model_resident(m, tp, &ri);
    threadpool_free(tp);
    fprintf(stderr, "tokenmill %s: weights resident: %.1f MiB mapped%s, %.1f MiB repacked, in %.2f s (%s)\n", prog,
            (double)ri.file_bytes / (1 << 20), ri.huge ? " (huge pages asked)" : "", (double)ri.anon_bytes / (1 << 20),
            ri.seconds, ri.populate ? "populated" : "pages touched");
    fflush(stderr);
}

sched_opts cmd_common_sched_opts(const cmd_engine_opts *o, blockio *bio, const tokenizer *tok)
{
    sched_opts so = { .bio = bio, .max_seqs = (int)o->max_seqs, .max_queue = (int)o->max_queue,
                      .step_tokens = (int)o->step_tokens, .spec_room = (int)o->spec_room,
                      .prefill_step_tokens = (int)o->prefill_step,
                      .step_ms = o->step_ms, .prefill_step_ms = o->prefill_step_ms,
                      .n_ctx = (int)o->ctx, .eos_ids = { -1, -1, -1, -1 },
                      .window_mib = o->window_mib > 0 ? o->window_mib : -1, .window_ttl_s = o->window_ttl,
                      .window_exact = o->window_replay == 1,
                      .spec_sources = (o->spec == 1 ? SPEC_SRC_NGRAM : 0) | (o->draft_engine || o->dflash ? SPEC_SRC_MODEL : 0) |
                                      (o->mtp_engine ? SPEC_SRC_MTP : 0),
                      .spec_max = (int)o->spec_max, .spec_fixed = (int)o->spec_fixed, .draft = o->draft_engine,
                      .dflash = o->dflash, .dflash_conf = o->spec != 4, .spec_p_min = (float)o->spec_p_min,
                      .mtp = o->mtp_engine,
                      .no_overlap = o->no_overlap };
    so.eos_ids[0] = tokenizer_eos(tok);
    so.eos_ids[1] = tokenizer_eot(tok);
    return so;
}

const cmd_opt *cmd_common_ep_table(cmd_ep_opts *o, cmd_opt out[CMD_EP_TABLE_N])
{
    o->members.v = o->member_v;
    o->members.cap = (int)TM_ARRAY_LEN(o->member_v) < EP_MAX_MEMBERS ? (int)TM_ARRAY_LEN(o->member_v) : EP_MAX_MEMBERS;
    const cmd_opt t[CMD_EP_TABLE_N] = {
        { "--ep-member", NULL, CMD_OPT_LIST, &o->members, .set = 1, .arg = "HOST:PORT", .help = "expert parallelism: a member (tokenmill expert) computing a share of the experts (repeatable)" },
        { "--redundant-experts", NULL, CMD_OPT_LONG, &o->redundant, 0, 1 << 16, .arg = "N", .help = "with --ep-member: extra expert copies per layer, placed by EPLB from the live load (default 0)" },
        { "--ep-timeout", NULL, CMD_OPT_DOUBLE, &o->timeout_s, 0.01, 3600, .arg = "S", .help = "with --ep-member: a member silent this long is down, its experts run here (default 5)" },
        { "--ep-rebalance", NULL, CMD_OPT_DOUBLE, &o->rebalance_s, 0, 1e7, .arg = "S", .help = "with --redundant-experts: seconds between placements (default 60; 0: once)" },
        { "--ep-overlap", NULL, CMD_OPT_CHOICE, &o->overlap_off, .choices = "on|off", .help = "with --ep-member: each member's share of a layer in two micro-batches, the first's outputs on the wire while the second computes (default on)" },
        { 0 },
    };
    memcpy(out, t, sizeof t);
    return out;
}
bool cmd_common_cluster_key(const char *prog, const char *key_path, auth_key *key, char *used, size_t usedsz, bool say)
{
    char err[512];
    auth_status ast = key_path ? auth_key_load(key_path, key, err, sizeof err)
                               : auth_key_default(key, used, usedsz, err, sizeof err);
    if (ast != AUTH_OK) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        return false;
    }
    if (key_path) snprintf(used, usedsz, "%s", key_path);
    if (say) fprintf(stderr, "tokenmill %s: cluster key %s\n", prog, used);
    return true;
}


bool cmd_common_ep_start(const char *prog, engine *e, cmd_ep_opts *o, const char *key_path, ep_group **out)
{
    *out = NULL;
    if (o->members.n == 0) {
        if (o->redundant > 0) {
            fprintf(stderr, "tokenmill %s: --redundant-experts needs --ep-member\n", prog);
            return false;
        }
        return true;
    }
    static auth_key key;   /* 4 KiB: off the stack */
    char key_file[4096], err[512];
    if (!cmd_common_cluster_key(prog, key_path, &key, key_file, sizeof key_file, false)) return false;
    ep_opts eo = { .members = o->members.v, .n_members = o->members.n, .key = &key, .redundant = (int)o->redundant,
                   .timeout_s = o->timeout_s, .rebalance_s = o->rebalance_s, .micro_batches = o->overlap_off ? 1 : 2 };
    ep_group *g = ep_group_new(e, &eo, err, sizeof err);
    if (!g) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        return false;
    }
    const model *m = engine_model(e);
    fprintf(stderr, "tokenmill %s: expert group of %d processes (this one and %d members), %d experts per layer, %ld redundant, "
                    "%s micro-batch%s per member and layer, cluster key %s\n",
            prog, ep_group_size(g), o->members.n, m->hp.n_expert, o->redundant, o->overlap_off ? "one" : "two",
            o->overlap_off ? "" : "es", key_file);
    *out = g;
    return true;
}

void cmd_common_api_routes(http_server *h, api_ctx *c)
{
    api_misc_register(h, c);
    api_completions_register(h, c);
    if (api_chat_register) api_chat_register(h, c);
    if (api_responses_register) api_responses_register(h, c);
    if (api_messages_register) api_messages_register(h, c);
    api_tokenize_register(h, c);
    api_embed_register(h, c);
}
