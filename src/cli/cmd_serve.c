/*
 * cmd_serve: `tokenmill serve -m [NAME=]MODEL [-m NAME=MODEL ...] [--host 127.0.0.1] [--port 8080] [--threads N] [--cpus LIST]
 * [--ctx N] [--max-seqs N] [--api-key KEY ...] [--model-name NAME] [--template NAME]
 * [--kv-mib N] [--max-queue N] [--step-tokens N] [--prefill-step-tokens N] [--max-body BYTES] [--timeout S]
 * [--max-connections N] [--max-client-connections N] [--request-timeout S] [--metrics-public]
 * [--drain-timeout S]`.
 *
 * In named steps: options, model (with its tokenizer and chat template), engine, block store,
 * scheduler, routes (the HTTP server with every API), run (until SIGINT/SIGTERM), shutdown,
 * and everything freed in reverse order.
 *
 * Several models: -m repeated (`-m NAME=FILE`; a plain `-m FILE` is named after its file or
 * --model-name) makes one unit per model: its tokenizer, template, engine, KV pool and
 * scheduler (with its own engine thread), grammar cache and status ring. The units share the
 * HTTP server, the block store (blocks are keyed by the model's fingerprint, so models never
 * share one) and the API keys; requests go to the unit their "model" names (recipe/api.h,
 * SEVERAL MODELS), the first unit when they name none. --kv-mib is the cap of all the pools
 * together, split evenly (the start-up line says so); the engine options apply to each.
 *
 * Shutdown drains: the first SIGINT/SIGTERM makes the scheduler refuse new requests (503 in
 * the route's shape, with Retry-After) and /health answer 503 "draining", while the requests
 * already accepted run to their end and their responses are sent (the scheduler idle and no
 * HTTP request in progress). Past --drain-timeout seconds (default 30) the rest are aborted:
 * each still ends with its API's terminal event (sched_abort, recipe/api.h), and the server
 * waits a little more for those to be written. Then the HTTP server stops, the engine
 * thread ends, and the block store's write-behind queue is flushed (bounded, so a stuck store
 * cannot hold the exit) before the store closes. A second signal during all this exits at
 * once with status 128 + the signal number; a completed shutdown exits 0.
 *
 * The line "tokenmill serve: listening on http://HOST:PORT" goes to stderr once the port
 * is bound (with --port 0 the system picks a free port: tests read it from that line). Then
 * the weights are faulted in (cmd_common_resident) while /health answers 503 "loading", and
 * "tokenmill serve: ready" follows: the first requests then take no page faults.
 *
 * KV pool: max-seqs sequences of the full context, capped at --kv-mib MiB (default 2048),
 * faulted in at start (kvpool_prefault): that much memory is taken at once.
 *
 * Block store (src/cache, engine/blockio.h): --cache SPEC (dir:PATH, ec:K+M:..., or
 * "default" = dir: under $XDG_CACHE_HOME or ~/.cache/tokenmill/blocks, the default, capped at
 * 16 GiB unless --cache-capacity says otherwise) or --cache-dir DIR choose it; --cache off
 * turns it off. Every full KV block computed is written behind, and prompts whose prefix
 * is stored load it instead of computing it. --cache-capacity SIZE (per target) and
 * --retention agent=72h,chat=7d set what is kept. A store that cannot be opened is logged
 * and the server runs without it.
 * Requests choose their traffic class (cache_class field or x-cache-class header, one of the
 * --retention names) and keep tenants apart (cache_salt field, API key identity): see
 * TENANCY in recipe/api.h.
 *
 * API hooks: the chat, responses and messages routes live in their own files (api_chat.c,
 * api_responses.c, api_messages.c); they are declared weak here so that the server builds
 * and runs before those files exist, and registers them as soon as they are linked in.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cache/gc.h"
#include "cache/store.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "http/http.h"
#include "model/model.h"
#include "cluster/ep.h"
#include "recipe/api.h"
#include "recipe/api_http.h"
#include "recipe/status.h"
#include "recipe/template.h"
#include "recipe/tokenizer.h"
#include "util/threadpool.h"
#include "util/util.h"

#define SERVE_MAX_KEYS 16
#define SERVE_MAX_MODELS API_MAX_MODELS
#define SERVE_ABORT_GRACE_S 5.0   /* after the abort: for the cut responses to be written */
#define SERVE_FLUSH_MS 10000      /* for the block store to take the blocks still queued */

typedef struct {
    const char *paths[SERVE_MAX_MODELS]; /* (n_models) -m: the GGUF files */
    const char *names[SERVE_MAX_MODELS]; /* (n_models) their names (-m NAME=FILE), or NULL:
                                  * --model-name for the first, else derived from the file */
    int n_models;
    const char *host;            /* listen address */
    const char *name;            /* --model-name, or NULL: derived from the file name */
    const char *tmpl_name;       /* --template, or NULL: auto */
    const char *tmpl_file;       /* --template-file, or NULL: the GGUF's template text */
    const char *keys[SERVE_MAX_KEYS]; /* (n_keys) --api-key values */
    int n_keys;
    long port;
    long max_body;               /* bytes */
    long timeout;                /* seconds: idle / slow client */
    long drain_timeout;          /* seconds the running requests get at shutdown */
    cmd_engine_opts eng;         /* --threads, --ctx, --max-seqs, ... */
    cmd_ep_opts ep;              /* --ep-member, --redundant-experts, ... */
    const char *key_path;        /* --cluster-key-file (with --ep-member) */
    http_opts http;              /* connection limits (--max-connections, ...); the rest is set
                                  * by serve_routes */
    grammar_limits grammar;      /* structured output's compile budgets (--grammar-*) */
    bool metrics_public;         /* --metrics-public: /metrics without the API key */
    double cost_per_hour;        /* --cost-per-hour: the machine's price per hour (0: none) */
    const char *curves_path;     /* --curves: `bench curves` JSON for the status page, or NULL */
    status_curve curve;          /* its decode points */
    const char *cache_spec;      /* store spec, "default", or NULL (off) */
    const char *retention;       /* --retention, or NULL */
    uint64_t cache_capacity;     /* bytes per target; 0: the store's default */
    char cache_buf[4096];        /* storage of a cache_spec built here */
    gc_retention classes;        /* the traffic classes requests may name (cache_class) */
} serve_opts;

/* One served model and what runs it. */
typedef struct {
    const char *path;            /* its GGUF */
    model *m;
    tokenizer *tok;
    template *tmpl;
    cmd_engine_opts eng;         /* the engine options for this model (kv_mib its share) */
    engine *e;
    struct ep_group *ep;         /* with --ep-member (one model only): the expert group this
                                  * process leads for it, or NULL */
    blockio *bio;                /* its write-behind / load tier of the shared store, or NULL */
    sched *s;
    const char *name;            /* what requests call it */
    char *derived_name;          /* owned name when none was given */
    char alias_buf[256];         /* storage of the model's alias */
    grammar_cache *gcache;       /* structured output: compiled grammars, by content */
    grammar_vocab *gvocab;       /* the tokenizer's token bytes, for the grammars' masks */
    status_ring *status;         /* the status page's ring of this model */
    threadpool *tok_pool;        /* tokenises long prompts (api_ctx.tok_pool), or NULL */
    api_ctx ac;                  /* what every route sees of it; outlives the HTTP server */
} serve_unit;

typedef struct {
    serve_opts o;
    serve_unit u[SERVE_MAX_MODELS]; /* (n) the models, u[0] the default */
    int n;
    api_ctx *all[SERVE_MAX_MODELS]; /* (n) &u[i].ac, what api_ctx.all points to */
    store *cache;                /* NULL: no block store */
    http_server *h;
} serve;

/* Splits each -m into its name and file (cmd_common_model_spec); checks the names are unique
 * and the options that name one model's file are not given with several. 0 or 2 after a
 * message. */
static int serve_model_specs(serve_opts *o)
{
    for (int i = 0; i < o->n_models; i++) {
        /* argv's own storage, writable */
        if (!cmd_common_model_spec("serve", (char *)o->paths[i], &o->names[i], &o->paths[i])) return 2;
    }
    if (o->n_models > 1) {
        if (o->name) {
            fprintf(stderr, "tokenmill serve: --model-name names the one model; with several, name each as -m NAME=FILE\n");
            return 2;
        }
        if (o->eng.draft || o->eng.draft_layers > 0) {
            fprintf(stderr, "tokenmill serve: --draft and --draft-layers are for one model; serve it alone to use them\n");
            return 2;
        }
    } else if (!o->names[0]) {
        o->names[0] = o->name;
    }
    return 0;
}

/* Step: options. Returns 0, -1 after --help (exit 0), or the exit status after a message. */
static int serve_options(int argc, char **argv, serve_opts *o)
{
    *o = (serve_opts){ .host = "127.0.0.1", .port = 8080, .eng = CMD_ENGINE_OPTS_DEFAULT, .ep = CMD_EP_OPTS_DEFAULT, .max_body = 8 << 20,
                       .timeout = 60, .drain_timeout = 30, .cache_spec = "default" };
    cmd_opt eng[CMD_ENGINE_TABLE_N], http[CMD_HTTP_TABLE_N], gram[CMD_GRAMMAR_TABLE_N], ept[CMD_EP_TABLE_N];
    o->grammar = grammar_limits_get();
    cmd_opt_list keys = { o->keys, 0, SERVE_MAX_KEYS };
    cmd_opt_list models = { o->paths, 0, SERVE_MAX_MODELS };
    const char *cache_dir = NULL;
    bool verbose = false;
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_LIST, &models, .arg = "[NAME=]MODEL", .help = "the GGUF to serve; repeat with NAME=FILE to serve several (the first is the default)" },
        { "--host", NULL, CMD_OPT_STR, &o->host, .arg = "ADDR", .help = "listen address (default 127.0.0.1)" },
        { "--port", NULL, CMD_OPT_LONG, &o->port, 0, 65535, .arg = "PORT", .help = "listen port (default 8080; 0: any free one)" },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_engine_table(&o->eng, eng) },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_ep_table(&o->ep, ept) },
        { "--cluster-key-file", NULL, CMD_OPT_STR, &o->key_path, .arg = "PATH", .help = "with --ep-member: the cluster secret (default: generated in ~/.cache/tokenmill)" },
        { "--model-name", NULL, CMD_OPT_STR, &o->name, .arg = "NAME", .help = "the model's name in /v1/models (default: the file's)" },
        { "--template", NULL, CMD_OPT_STR, &o->tmpl_name, .arg = "NAME", .help = "chat template: auto (the default: the family whose reference text the template is, else the Jinja interpreter), jinja, or a family" },
        { "--template-file", NULL, CMD_OPT_STR, &o->tmpl_file, .arg = "FILE", .help = "a Jinja chat template to use instead of the model's own" },
        { "--api-key", NULL, CMD_OPT_LIST, &keys, .arg = "KEY", .help = "require this key (repeat for several)" },
        { "--metrics-public", NULL, CMD_OPT_FLAG, &o->metrics_public, .help = "with --api-key, leave /metrics and the status page open" },
        { "--curves", NULL, CMD_OPT_STR, &o->curves_path, .arg = "PATH", .help = "this machine's `tokenmill bench curves` JSON: the status page places its users on it" },
        { "--cost-per-hour", NULL, CMD_OPT_DOUBLE, &o->cost_per_hour, 0, 1e9, .arg = "PRICE", .help = "the machine's price per hour: the status page (GET /) shows cost per million tokens" },
        { "--max-body", NULL, CMD_OPT_LONG, &o->max_body, 1024, 4294967296.0, .arg = "BYTES", .help = "largest request body (default 8 MiB)" },
        { "--timeout", NULL, CMD_OPT_LONG, &o->timeout, 1, 86400, .arg = "S", .help = "idle keep-alive connections close after S seconds (default 60)" },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_http_table(&o->http, http) },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_grammar_table(&o->grammar, gram) },
        { "--drain-timeout", NULL, CMD_OPT_LONG, &o->drain_timeout, 0, 86400, .arg = "S", .help = "at SIGTERM, seconds running requests get (default 30)" },
        { "--cache", NULL, CMD_OPT_STR, &o->cache_spec, .arg = "SPEC|default|off", .help = "block store: dir:PATH, ec:K+M:DIRS (default: ~/.cache/tokenmill/blocks)" },
        { "--cache-dir", NULL, CMD_OPT_STR, &cache_dir, .arg = "DIR", .help = "the same as --cache dir:DIR" },
        { "--cache-capacity", NULL, CMD_OPT_SIZE, &o->cache_capacity, .arg = "SIZE", .help = "per-target capacity, e.g. 20G (default store: 16G)" },
        { "--retention", NULL, CMD_OPT_STR, &o->retention, .arg = "SPEC", .help = "TTL per traffic class (default agent=72h,chat=7d)" },
        { "-v", NULL, CMD_OPT_FLAG, &verbose, .help = "log every engine step" },
        { 0 },
    };
    const char *synopsis = "serve -m MODEL [-m NAME=MODEL ...] [options]: the HTTP API server (OpenAI and Anthropic APIs)";
    cmd_opts_status ost = cmd_opts_parse("serve", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return ost == CMD_OPTS_HELP ? -1 : 2;
    o->n_keys = keys.n;
    o->n_models = models.n;
    if (o->n_models == 0) {   /* -m is a list (repeatable), which the parser cannot require */
        fprintf(stderr, "tokenmill serve: -m/--model is required\n");
        cmd_opts_hint("serve", synopsis);
        return 2;
    }
    if (serve_model_specs(o)) return 2;
    grammar_limits_set(&o->grammar);
    if (verbose) util_log_level = LOG_LEVEL_DEBUG;
    if (cache_dir) {
        snprintf(o->cache_buf, sizeof o->cache_buf, "dir:%s", cache_dir);
        o->cache_spec = o->cache_buf;
    }
    gc_retention_default(&o->classes);
    if (o->retention && gc_retention_parse(&o->classes, o->retention)) {
        fprintf(stderr, "tokenmill serve: bad --retention '%s' (want e.g. agent=72h,chat=7d)\n", o->retention);
        return 2;
    }
    char err[512];
    if (o->curves_path && status_curve_load(o->curves_path, &o->curve, err, sizeof err)) {
        fprintf(stderr, "tokenmill serve: bad --curves: %s\n", err);
        return 2;
    }
    if (o->cache_spec && !strcmp(o->cache_spec, "off")) o->cache_spec = NULL;
    if (o->cache_spec && !strcmp(o->cache_spec, "default")) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg) snprintf(o->cache_buf, sizeof o->cache_buf, "dir:%s/tokenmill/blocks", xdg);
        else snprintf(o->cache_buf, sizeof o->cache_buf, "dir:%s/.cache/tokenmill/blocks", home && *home ? home : "/tmp");
        o->cache_spec = o->cache_buf;
        if (!o->cache_capacity) o->cache_capacity = (uint64_t)16 << 30; /* a default must not fill the disk */
    }
    return 0;
}

/* Step: the models, their tokenizers and chat templates, and their names (unique). Returns
 * 0 or the exit status. */
static int serve_model(serve *sv)
{
    char err[512];
    for (int i = 0; i < sv->o.n_models; i++) {
        serve_unit *u = &sv->u[i];
        sv->n = i + 1;
        u->path = sv->o.paths[i];
        u->name = sv->o.names[i] ? sv->o.names[i] : (u->derived_name = api_model_default_name(u->path));
        for (int k = 0; k < i; k++)
            if (!strcmp(u->name, sv->u[k].name)) {
                fprintf(stderr, "tokenmill serve: two models are named '%s': name them apart with -m NAME=FILE\n",
                        u->name);
                return 2;
            }
        if (!cmd_common_load_model("serve", u->path, &u->m, &u->tok)) return 1;
        if (template_open_file(u->tok, u->m->g, sv->o.tmpl_name, sv->o.tmpl_file, &u->tmpl, err, sizeof err) != TEMPLATE_OK) {
            fprintf(stderr, "tokenmill serve: %s: %s\n", u->name, err);
            return sv->o.tmpl_name || sv->o.tmpl_file ? 2 : 1;
        }
    }
    return 0;
}

/* Step: the engines (their KV pools faulted in), --kv-mib split evenly between them. */
static int serve_engine(serve *sv)
{
    long share = sv->o.eng.kv_mib / sv->n;
    if (share < 1) share = 1;
    if (sv->n > 1)
        fprintf(stderr, "tokenmill serve: %d models: the KV cap of %ld MiB split evenly, %ld MiB each\n", sv->n,
                sv->o.eng.kv_mib, share);
    if (sv->n > 1 && sv->o.ep.members.n > 0) {
        fprintf(stderr, "tokenmill serve: --ep-member forms an expert group for one model; serve one -m with it\n");
        return 2;
    }
    for (int i = 0; i < sv->n; i++) {
        serve_unit *u = &sv->u[i];
        u->eng = sv->o.eng;
        u->eng.kv_mib = share;
        if (!(u->e = cmd_common_engine_new("serve", u->m, &u->eng))) return 1;
    }
    if (!cmd_common_ep_start("serve", sv->u[0].e, &sv->o.ep, sv->o.key_path, &sv->u[0].ep)) return 1;
    return 0;
}

/* Step: the block store and each model's I/O tier; a store that cannot be opened is logged
 * and skipped. */
static int serve_store(serve *sv)
{
    const serve_opts *o = &sv->o;
    if (!o->cache_spec) return 0;
    store_opts sto = { .capacity_bytes = o->cache_capacity, .retention = o->retention, .gc_thread = true };
    store_status sst = store_open(o->cache_spec, &sto, &sv->cache);
    if (sst == STORE_ARG) {
        fprintf(stderr, "tokenmill serve: bad --cache '%s' or --retention\n", o->cache_spec);
        return 2;
    }
    if (sst != STORE_OK) {
        fprintf(stderr, "tokenmill serve: block store %s unavailable (%s): running without it\n", o->cache_spec,
                store_status_name(sst));
        return 0;
    }
    for (int i = 0; i < sv->n; i++) {
        blockio_opts bo = { 0 };
        if (sv->u[i].m->hp.bidirectional) continue;   /* an encoder keeps no KV to store */
        sv->u[i].bio = blockio_new(sv->cache, engine_kvpool(sv->u[i].e), sv->u[i].m, &bo);
    }
    return 0;
}

/* Step: the schedulers' engine threads. */
static int serve_scheduler(serve *sv)
{
    for (int i = 0; i < sv->n; i++) {
        serve_unit *u = &sv->u[i];
        sched_opts so = cmd_common_sched_opts(&u->eng, u->bio, u->tok);
        if (sched_new(u->e, &so, &u->s) != SCHED_OK) {
            fprintf(stderr, "tokenmill serve: cannot start the scheduler\n");
            return 1;
        }
    }
    return 0;
}

/* Step: the HTTP server with every linked API's routes, listening; then the start-up lines. */
static int serve_routes(serve *sv)
{
    const serve_opts *o = &sv->o;
    char err[512];
    int64_t created = (int64_t)time(NULL);
    for (int i = 0; i < sv->n; i++) {
        serve_unit *u = &sv->u[i];
        u->gvocab = tokenizer_grammar_vocab(u->tok);
        u->gcache = grammar_cache_new(256);
        u->tok_pool = threadpool_new(TM_MIN(engine_n_threads(u->e), 16));
        threadpool_set_spin(u->tok_pool, 0);   /* rare rounds: idle, it leaves the engine its cores */
        u->ac = (api_ctx){
            .sched = u->s, .model = u->m, .tok = u->tok, .tmpl = u->tmpl, .model_name = u->name,
            .model_alias = api_model_alias(u->m, u->alias_buf, sizeof u->alias_buf), .n_ctx = sched_n_ctx(u->s),
            .tok_pool = u->tok_pool, .created = created, .retention = &o->classes,
            .metrics_public = o->metrics_public, .gcache = u->gcache, .gvocab = u->gvocab,
            .status = u->status = status_new(gc_wall_now()),
            .store = u->bio ? sv->cache : NULL, .store_capacity = o->cache_capacity, .cost_per_hour = o->cost_per_hour,
            .curve = o->curves_path ? &o->curve : NULL, .loading = true,
            .all = sv->n > 1 ? sv->all : NULL, .n_all = sv->n > 1 ? sv->n : 0,
        };
        sv->all[i] = &u->ac;
        status_observe(u->status, gc_wall_now(), 0);   /* the engine's busy seconds start at 0 */
    }
    api_ctx *c = &sv->u[0].ac;   /* the routes route each request to its model's ctx */
    http_opts ho = o->http;
    ho.host = o->host;
    ho.port = (int)o->port;
    ho.max_body = (size_t)o->max_body;
    ho.idle_timeout_s = (int)o->timeout;
    ho.api_keys = o->keys;
    ho.n_api_keys = o->n_keys;
    api_http_opts(&ho);
    if (http_server_new(&ho, &sv->h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill serve: %s\n", err);
        return 2;
    }
    cmd_common_api_routes(sv->h, c);
    if (http_server_start(sv->h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill serve: %s\n", err);
        return 1;
    }
    for (int i = 0; i < sv->n; i++) {
        serve_unit *u = &sv->u[i];
        char kvd[128];
        cmd_common_kv_desc(u->e, kvd, sizeof kvd);
        fprintf(stderr, "tokenmill serve: model %s (%s, %d layers, ctx %d, %s, %d threads, template %s, tool calls %s)\n",
                u->name, u->m->hp.arch_name, u->m->hp.n_layers, (int)u->eng.ctx, kvd, engine_n_threads(u->e),
                template_name(u->tmpl), template_tool_format(u->tmpl));
    }
    if (sv->u[0].bio) fprintf(stderr, "tokenmill serve: block store %s\n", store_spec(sv->cache));
    fprintf(stderr, "tokenmill serve: listening on http://%s:%d\n", o->host, http_server_port(sv->h));
    fflush(stderr);
    return 0;
}

/* Step: the weights faulted in while /health says "loading"; then ready. */
static int serve_resident(serve *sv)
{
    for (int i = 0; i < sv->n; i++) {
        cmd_common_resident("serve", sv->u[i].m, engine_n_threads(sv->u[i].e));
        atomic_store(&sv->u[i].ac.loading, false);
    }
    fprintf(stderr, "tokenmill serve: ready\n");
    fflush(stderr);
    return 0;
}

/* Step: serve until SIGINT/SIGTERM (blocked in every thread, taken here). Returns it. */
static int serve_run(const sigset_t *stop_signals)
{
    int sig = 0;
    sigwait(stop_signals, &sig);
    return sig;
}

/* Waits until every accepted request has finished and no HTTP request is in progress (so
 * every response, streamed or not, was sent), or until util_now() passes deadline. */
static bool serve_wait_quiet(serve *sv, double deadline)
{
    for (;;) {
        int n_live = 0;
        for (int i = 0; i < sv->n; i++) {
            double left = deadline - util_now();
            n_live += sched_wait_idle(sv->u[i].s, left > 0 ? (int)(left * 1000) : 0);
        }
        http_stats hs;
        http_get_stats(sv->h, &hs);
        if (n_live == 0 && hs.n_active == 0) return true;
        if (deadline - util_now() <= 0) return false;
        struct timespec nap = { 0, 10 * 1000 * 1000 };   /* the last responses are being written */
        nanosleep(&nap, NULL);
    }
}

/* Step: shutdown (see the file comment): drain, abort what the deadline leaves, stop the
 * HTTP server and the engines, flush the write-behind queues. */
static void serve_shutdown(serve *sv, int sig)
{
    cmd_common_arm_second_signal("serve");
    fprintf(stderr, "tokenmill serve: %s, draining (up to %lds; a second signal exits at once)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", sv->o.drain_timeout);
    for (int i = 0; i < sv->n; i++) sched_drain(sv->u[i].s);
    if (!serve_wait_quiet(sv, util_now() + (double)sv->o.drain_timeout)) {
        int n_live = 0;
        for (int i = 0; i < sv->n; i++) n_live += sched_wait_idle(sv->u[i].s, 0);
        fprintf(stderr, "tokenmill serve: drain timeout: ending %d requests\n", n_live);
        for (int i = 0; i < sv->n; i++) sched_abort(sv->u[i].s);
        if (!serve_wait_quiet(sv, util_now() + SERVE_ABORT_GRACE_S))
            fprintf(stderr, "tokenmill serve: closing the connections still open\n");
    }
    http_server_free(sv->h);
    sv->h = NULL;
    for (int i = 0; i < sv->n; i++) {
        sched_free(sv->u[i].s);   /* the engine thread ends: no more blocks are queued */
        sv->u[i].s = NULL;
    }
    for (int i = 0; i < sv->n; i++) {
        if (!sv->u[i].bio) continue;
        int left = blockio_flush(sv->u[i].bio, SERVE_FLUSH_MS);
        if (left) fprintf(stderr, "tokenmill serve: block store too slow: %d blocks not written\n", left);
    }
    fprintf(stderr, "tokenmill serve: stopped\n");
}

/* Frees what was made, in reverse order; accepts a half-built server. */
static void serve_free(serve *sv)
{
    for (int i = 0; i < sv->n; i++)
        if (sv->u[i].s) sched_shutdown(sv->u[i].s);   /* a failed start: end what may run */
    http_server_free(sv->h);
    for (int i = 0; i < sv->n; i++) {
        serve_unit *u = &sv->u[i];
        sched_free(u->s);
        blockio_free(u->bio);   /* writes what is queued; before the pool goes */
    }
    store_close(sv->cache);
    for (int i = 0; i < sv->n; i++) {
        serve_unit *u = &sv->u[i];
        ep_group_free(u->ep);   /* unsets the engine's hooks: no step runs any more */
        engine_free(u->e);
        cmd_common_draft_free(&u->eng);
        template_free(u->tmpl);
        grammar_cache_free(u->gcache);
        threadpool_free(u->tok_pool);
        grammar_vocab_free(u->gvocab);
        tokenizer_free(u->tok);
        model_free(u->m);
        free(u->derived_name);
        status_free(u->status);   /* after the HTTP server: no route draws it any more */
    }
}

int cmd_serve(int argc, char **argv)
{
    /* SIGINT/SIGTERM are blocked before any thread exists (threads inherit the mask) and
     * taken with sigwait: a signal arriving while threads start must not kill the process
     * before its clean shutdown */
    sigset_t stop_signals;
    cmd_common_block_stop_signals(&stop_signals);
    serve *sv = xcalloc(1, sizeof *sv);
    int rc = serve_options(argc, argv, &sv->o);
    if (!rc) rc = serve_model(sv);
    if (!rc) rc = serve_engine(sv);
    if (!rc) rc = serve_store(sv);
    if (!rc) rc = serve_scheduler(sv);
    if (!rc) rc = serve_routes(sv);
    if (!rc) rc = serve_resident(sv);
    if (!rc) serve_shutdown(sv, serve_run(&stop_signals));
    serve_free(sv);
    free(sv);
    return rc < 0 ? 0 : rc;
}
