/*
 * cmd_gateway: `tokenmill gateway -m [NAME=]MODEL [-m NAME=MODEL ...] --listen HOST:PORT
 * [--prefill HOST:PORT,...] [--decode HOST:PORT,...] [--register HOST:PORT] [options]` (`--help`
 * lists them).
 *
 * The front of a disaggregated cluster (cluster/gateway.h): the same HTTP APIs as `serve`
 * (recipe/api.h, over the gateway's backend instead of a local scheduler), plus the admin
 * routes (/admin/workers, /admin/drain, /admin/undrain, /admin/capacity). The model is opened for its
 * tokenizer, chat template and fingerprint only (the file is mmapped: its weights are never
 * touched here). Workers are the --prefill / --decode addresses (reconnected when they come
 * back) and those that register at --register (workers started with --gateway). Several models:
 * -m repeated, as `serve` takes them (each model opened for its tokenizer, template and
 * fingerprint; one api_ctx each, routed by "model"); each worker says which model it serves and
 * gets that model's requests only (cluster/gateway.h, SEVERAL MODELS). Every worker
 * must prove it holds the cluster key (--cluster-key-file, by default the key generated in the
 * cache dir: cluster/auth.h), else it is refused and logged.
 *
 * Shutdown drains, as `serve` does: the first SIGINT/SIGTERM makes the gateway refuse new
 * requests (503 in the route's shape, with Retry-After) while the running ones go on to their
 * end on the workers and their responses are sent. Past --drain-timeout seconds (default 30)
 * the rest are aborted: each still ends with its API's "incomplete" ending (never as a normal
 * stop; gateway_abort), and the gateway waits a little more for those to be written. That
 * abort is also the only end of a stream moved off a worker that died during the drain and
 * still waiting for another (the wait timeout does not apply while draining). A second
 * signal during all this exits at once with status 128 + the signal number; a completed
 * shutdown exits 0.
 *
 * Lines on stderr for tests: "tokenmill gateway: workers register at HOST:PORT" and
 * "tokenmill gateway: listening on http://HOST:PORT".
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/gc.h"
#include "cache/store.h"
#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cluster/auth.h"
#include "cluster/gateway.h"
#include "engine/sched.h"
#include "grammar/grammar.h"
#include "http/http.h"
#include "model/model.h"
#include "recipe/api.h"
#include "recipe/api_http.h"
#include "recipe/status.h"
#include "recipe/template.h"
#include "recipe/tokenizer.h"
#include "util/util.h"


#define GWC_MAX 32
#define GWC_MAX_MODELS GATEWAY_MAX_MODELS

/* One served model: what the API layer needs of it here. */
typedef struct {
    const char *path;          /* -m's file */
    const char *name;          /* -m NAME=, --model-name (one model), else derived */
    char *derived;             /* the name made from the file (freed) */
    model *m;
    tokenizer *tok;
    template *tmpl;
    grammar_vocab *gvocab;     /* structured output: the API layer compiles each grammar here */
    grammar_cache *gcache;     /* first (a bad one is a 400 at once); the workers compile it again */
    char alias[256];           /* general.name, when the GGUF has one */
    api_ctx ac;
} cmd_gateway_model;
#define GWC_ABORT_GRACE_S 5.0   /* after the abort: for the cut responses to be written */

/* --progress-timeout FIRST[,NEXT] into dst, double[2]: seconds to a job's first token, and
 * between two tokens (NEXT defaults to FIRST / 3). */
static bool cmd_gateway_progress(const char *prog, const char *name, const char *v, void *dst)
{
    double *first = dst, *next = first + 1;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    char *comma = strchr(buf, ',');
    if (comma) *comma = 0;
    if (!cmd_common_num(prog, name, buf, 1e-3, 86400, first)) return false;
    if (!comma) {
        *next = *first / 3;
        return true;
    }
    return cmd_common_num(prog, name, comma + 1, 1e-3, 86400, next);
}

/* Waits until no request runs and no HTTP request is in progress (every response, streamed or
 * not, was sent), or until util_now() passes deadline. */
static bool cmd_gateway_wait_quiet(gateway *g, http_server *h, double deadline)
{
    for (;;) {
        double left = deadline - util_now();
        int n_live = gateway_wait_idle(g, left > 0 ? (int)(left * 1000) : 0);
        http_stats hs;
        http_get_stats(h, &hs);
        if (n_live == 0 && hs.n_active == 0) return true;
        if (deadline - util_now() <= 0) return false;
        struct timespec nap = { 0, 10 * 1000 * 1000 };   /* the last responses are being written */
        nanosleep(&nap, NULL);
    }
}

/* The shutdown's drain (see the file comment). */
static void cmd_gateway_drain(gateway *g, http_server *h, int sig, long drain_timeout)
{
    cmd_common_arm_second_signal("gateway");
    fprintf(stderr, "tokenmill gateway: %s, draining (up to %lds; a second signal exits at once)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", drain_timeout);
    gateway_drain(g);
    if (!cmd_gateway_wait_quiet(g, h, util_now() + (double)drain_timeout)) {
        fprintf(stderr, "tokenmill gateway: drain timeout: ending %d requests\n", gateway_wait_idle(g, 0));
        gateway_abort(g);
        if (!cmd_gateway_wait_quiet(g, h, util_now() + GWC_ABORT_GRACE_S))
            fprintf(stderr, "tokenmill gateway: closing the connections still open\n");
    }
    fprintf(stderr, "tokenmill gateway: stopped\n");
}

/* The gateway's command line, parsed (cmd_gateway_parse). */
typedef struct {
    const char *paths[GWC_MAX_MODELS];   /* -m's arguments, as given: [NAME=]FILE (argv's) */
    const char *pre[GWC_MAX];            /* --prefill workers, HOST:PORT each */
    const char *dec[GWC_MAX];            /* --decode workers, HOST:PORT each */
    const char *keys[16];                /* --api-key values */
    int n_models;                        /* entries in paths */
    int n_pre, n_dec, n_keys;            /* entries in pre, dec, keys */
    const char *listen;                  /* --listen, HOST:PORT (default 127.0.0.1:8080) */
    const char *reg;                     /* --register, HOST:PORT, or NULL */
    const char *cache_spec;              /* --cache, SPEC or "off", or NULL */
    const char *name;                    /* --model-name, or NULL */
    const char *tmpl_name;               /* --template, or NULL (auto) */
    const char *tmpl_file;               /* --template-file, or NULL */
    const char *key_path;                /* --cluster-key-file, or NULL (the generated key) */
    long ctx;                            /* --ctx, tokens per sequence; 0: the workers' default */
    long drain_timeout;                  /* --drain-timeout, seconds */
    double hb_timeout;                   /* --heartbeat-timeout, seconds */
    double wait_timeout;                 /* --wait-timeout, seconds */
    double progress[2];                  /* --progress-timeout, seconds: first, next */
    double cost_per_hour;                /* --cost-per-hour, price per hour (0: not shown) */
    http_opts ho;                        /* connection limits from the options; the rest is set later */
    bool metrics_public;                 /* --metrics-public */
    bool verbose;                        /* -v */
    char host[256];                      /* --listen's HOST */
    long port;                           /* --listen's PORT, 0 .. 65535 */
} cmd_gateway_opts;

/* Parses the command line into o (grammar limits and -v take effect here) and names the served
 * models in mods[0 .. o->n_models), which it zeroes first: path and name each (argv's storage),
 * a name made from the file malloc'd into derived. Returns -1 to go on, else the exit status
 * (--help, a bad or missing option, two models of one name). */
static int cmd_gateway_parse(int argc, char **argv, cmd_gateway_opts *o, cmd_gateway_model *mods)
{
    *o = (cmd_gateway_opts){ .listen = "127.0.0.1:8080", .drain_timeout = 30, .hb_timeout = 2, .wait_timeout = 30,
                             .progress = { 30, 10 } };
    cmd_opt_list pre_l = { o->pre, 0, GWC_MAX }, dec_l = { o->dec, 0, GWC_MAX }, keys_l = { o->keys, 0, 16 };
    cmd_opt_list models_l = { o->paths, 0, GWC_MAX_MODELS };
    cmd_opt http[CMD_HTTP_TABLE_N], gram[CMD_GRAMMAR_TABLE_N];
    grammar_limits gl = grammar_limits_get();
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_LIST, &models_l, .arg = "[NAME=]MODEL", .help = "a served model's GGUF (tokenizer, template, fingerprint); repeat with NAME=FILE for several (the first is the default; required)" },
        { "--listen", NULL, CMD_OPT_STR, &o->listen, .arg = "HOST:PORT", .help = "the HTTP API (default 127.0.0.1:8080)" },
        { "--prefill", NULL, CMD_OPT_LIST, &pre_l, .set = 1, .arg = "HOST:PORT,...", .help = "prefill workers to connect to" },
        { "--decode", NULL, CMD_OPT_LIST, &dec_l, .set = 1, .arg = "HOST:PORT,...", .help = "decode (or mixed) workers to connect to" },
        { "--register", NULL, CMD_OPT_STR, &o->reg, .arg = "HOST:PORT", .help = "where workers started with --gateway register" },
        { "--cache", NULL, CMD_OPT_STR, &o->cache_spec, .arg = "SPEC|off", .help = "the workers' block store (entry-point hits)" },
        { "--ctx", NULL, CMD_OPT_LONG, &o->ctx, 1, 1 << 24, .arg = "N", .help = "tokens per sequence (default: the workers' default for the model)" },
        { "--heartbeat-timeout", NULL, CMD_OPT_DOUBLE, &o->hb_timeout, 1e-3, 86400, .arg = "S", .help = "a silent worker is dead after S seconds (default 2)" },
        { "--wait-timeout", NULL, CMD_OPT_DOUBLE, &o->wait_timeout, 1e-3, 86400, .arg = "S", .help = "with no worker of a role, 503 after S seconds (default 30)" },
        { "--progress-timeout", NULL, CMD_OPT_FN, o->progress, .fn = cmd_gateway_progress, .arg = "FIRST[,NEXT]",
          .help = "move a request off a worker with no token for FIRST / NEXT s (default 30,10)" },
        { "--drain-timeout", NULL, CMD_OPT_LONG, &o->drain_timeout, 0, 86400, .arg = "S", .help = "at SIGTERM, seconds running requests get (default 30)" },
        { "--cluster-key-file", NULL, CMD_OPT_STR, &o->key_path, .arg = "PATH", .help = "the cluster secret (default: generated in ~/.cache/tokenmill)" },
        { "--api-key", NULL, CMD_OPT_LIST, &keys_l, .arg = "KEY", .help = "require this key (repeat for several)" },
        { "--metrics-public", NULL, CMD_OPT_FLAG, &o->metrics_public, .help = "with --api-key, leave /metrics and the status page open" },
        { "--cost-per-hour", NULL, CMD_OPT_DOUBLE, &o->cost_per_hour, 0, 1e9, .arg = "PRICE", .help = "the cluster's price per hour: the status page shows cost per million tokens" },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_http_table(&o->ho, http) },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_grammar_table(&gl, gram) },
        { "--model-name", NULL, CMD_OPT_STR, &o->name, .arg = "NAME", .help = "the one model's name in /v1/models (default: the file's; several: -m NAME=FILE)" },
        { "--template", NULL, CMD_OPT_STR, &o->tmpl_name, .arg = "NAME", .help = "chat template: auto (the default: the family whose reference text the template is, else the Jinja interpreter), jinja, or a family" },
        { "--template-file", NULL, CMD_OPT_STR, &o->tmpl_file, .arg = "FILE", .help = "a Jinja chat template to use instead of the model's own" },
        { "-v", NULL, CMD_OPT_FLAG, &o->verbose, .help = "log more" },
        { 0 },
    };
    const char *synopsis = "gateway -m [NAME=]MODEL [-m NAME=MODEL ...] --listen HOST:PORT [--prefill ...] [--decode ...] [--register HOST:PORT] [options]";
    cmd_opts_status ost = cmd_opts_parse("gateway", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    grammar_limits_set(&gl);
    if (o->verbose) util_log_level = LOG_LEVEL_DEBUG;
    o->n_pre = pre_l.n;
    o->n_dec = dec_l.n;
    o->n_keys = keys_l.n;
    int n_models = o->n_models = models_l.n;
    if (n_models == 0) {
        fprintf(stderr, "tokenmill gateway: -m/--model is required\n");
        cmd_opts_hint("gateway", synopsis);
        return 2;
    }
    memset(mods, 0, GWC_MAX_MODELS * sizeof *mods);
    for (int i = 0; i < n_models; i++) {
        mods[i].path = o->paths[i];
        if (!cmd_common_model_spec("gateway", (char *)o->paths[i], &mods[i].name, &mods[i].path)) return 2;   /* argv's */
    }
    if (n_models > 1 && o->name) {
        fprintf(stderr, "tokenmill gateway: --model-name names the one model; with several, name each as -m NAME=FILE\n");
        return 2;
    }
    if (n_models == 1 && !mods[0].name) mods[0].name = o->name;
    for (int i = 0; i < n_models; i++) {
        if (!mods[i].name) mods[i].name = mods[i].derived = api_model_default_name(mods[i].path);
        for (int k = 0; k < i; k++)
            if (!strcmp(mods[i].name, mods[k].name)) {
                fprintf(stderr, "tokenmill gateway: two models are named '%s': name them apart with -m NAME=FILE\n",
                        mods[i].name);
                for (int j = 0; j < n_models; j++) free(mods[j].derived);
                return 2;
            }
    }
    const char *listen = o->listen;
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof o->host) {
        fprintf(stderr, "tokenmill gateway: bad --listen '%s' (want HOST:PORT)\n", listen);
        return 2;
    }
    memcpy(o->host, listen, (size_t)(colon - listen));
    o->host[colon - listen] = 0;
    if (!cmd_common_int("gateway", "--listen port", colon + 1, 0, 65535, &o->port)) return 2;
    return -1;
}

int cmd_gateway(int argc, char **argv)
{
    static cmd_gateway_model mods[GWC_MAX_MODELS];   /* api_ctx is large: off the stack */
    cmd_gateway_opts o;
    int st_parse = cmd_gateway_parse(argc, argv, &o, mods);
    if (st_parse >= 0) return st_parse;
    const int n_models = o.n_models;
    int rc = 1;
    char err[512];
    store *cache = NULL;
    gateway *g = NULL;
    http_server *h = NULL;
    status_ring *st = NULL;
    api_ctx *all[GWC_MAX_MODELS];
    gc_retention classes;
    gc_retention_default(&classes);
    /* SIGINT/SIGTERM are blocked before any thread exists, so every thread inherits the mask
     * and only the main loop's sigtimedwait takes them (a thread started earlier with them
     * unblocked would take a SIGTERM with the default action: the process dies, not stopped) */
    sigset_t set;
    cmd_common_block_stop_signals(&set);
    for (int i = 0; i < n_models; i++) {
        cmd_gateway_model *u = &mods[i];
        if (!cmd_common_load_model("gateway", u->path, &u->m, &u->tok)) goto out;
        if (template_open_file(u->tok, u->m->g, o.tmpl_name, o.tmpl_file, &u->tmpl, err, sizeof err) != TEMPLATE_OK) {
            fprintf(stderr, "tokenmill gateway: %s: %s\n", u->name, err);
            goto out;
        }
    }
    static auth_key key;   /* 4 KiB: off the stack */
    char key_file[4096];
    if (!cmd_common_cluster_key("gateway", o.key_path, &key, key_file, sizeof key_file, true)) {
        rc = 2;
        goto out;
    }
    if (o.cache_spec && strcmp(o.cache_spec, "off")) {
        store_opts sto = { 0 };
        if (store_open(o.cache_spec, &sto, &cache) != STORE_OK) {
            fprintf(stderr, "tokenmill gateway: block store %s unavailable: no entry-point hits\n", o.cache_spec);
            cache = NULL;
        }
    }
    /* the workers' default, for their default --kv-mib (other --kv-mib: set --ctx on both) */
    cmd_engine_opts eng_default = CMD_ENGINE_OPTS_DEFAULT;
    gateway_model gm[GWC_MAX_MODELS];
    for (int i = 0; i < n_models; i++) {
        cmd_gateway_model *u = &mods[i];
        int n_ctx = o.ctx > 0 ? (int)o.ctx
                            : (int)cmd_common_default_ctx("gateway", u->m, eng_default.kv_mib, (engine_kv_type)eng_default.kv_type);
        /* an encoder's input is within its position table (sched.c); the step that computes it
         * whole bounds it too, which the gateway learns from its workers (max_input) */
        if (u->m->hp.bidirectional) n_ctx = TM_MIN(n_ctx, u->m->hp.n_ctx_train) + 1;
        gm[i] = (gateway_model){ .model = u->m, .name = u->name, .n_ctx = n_ctx,
                                 .eos_ids = { tokenizer_eos(u->tok), tokenizer_eot(u->tok), -1, -1 } };
    }
    gateway_opts go = { .models = gm, .n_models = n_models, .cache = cache, .prefill = o.pre, .n_prefill = o.n_pre, .decode = o.dec,
                        .n_decode = o.n_dec, .register_listen = o.reg, .heartbeat_timeout_s = o.hb_timeout,
                        .wait_timeout_s = o.wait_timeout, .key = &key, .progress_first_s = o.progress[0],
                        .progress_next_s = o.progress[1] };
    if (gateway_new(&go, &g, err, sizeof err) != GATEWAY_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        rc = 2;
        goto out;
    }
    st = status_new(gc_wall_now());
    for (int i = 0; i < n_models; i++) {
        cmd_gateway_model *u = &mods[i];
        /* structured output: the API layer compiles each grammar here first (a bad one is a
         * 400 at once, and the gateway sends only sources that compile); the workers compile
         * it again */
        u->gvocab = tokenizer_grammar_vocab(u->tok);
        u->gcache = grammar_cache_new(256);
        u->ac = (api_ctx){ .sched = NULL, .model = u->m, .tok = u->tok, .tmpl = u->tmpl, .model_name = u->name,
                           .model_alias = api_model_alias(u->m, u->alias, sizeof u->alias), .n_ctx = gm[i].n_ctx,
                           .created = (int64_t)time(NULL), .retention = &classes,
                           .backend = gateway_backend(g, i), .metrics_public = o.metrics_public, .gcache = u->gcache,
                           .gvocab = u->gvocab, .status = st, .store = cache, .cost_per_hour = o.cost_per_hour,
                           .all = n_models > 1 ? all : NULL, .n_all = n_models > 1 ? n_models : 0 };
        all[i] = &u->ac;
    }
    api_ctx *ac = all[0];   /* the routes route each request by its "model" from here */
    o.ho.host = o.host;
    o.ho.port = (int)o.port;
    o.ho.api_keys = o.keys;
    o.ho.n_api_keys = o.n_keys;
    api_http_opts(&o.ho);
    if (http_server_new(&o.ho, &h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        rc = 2;
        goto out;
    }
    cmd_common_api_routes(h, ac);
    gateway_routes(g, h);

    if (http_server_start(h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        goto out;
    }
    for (int i = 0; i < n_models; i++)
        fprintf(stderr, "tokenmill gateway: model %s (template %s, tool calls %s)\n", mods[i].name,
                template_name(mods[i].tmpl), template_tool_format(mods[i].tmpl));
    if (o.reg) {
        const char *rc_ = strrchr(o.reg, ':');
        fprintf(stderr, "tokenmill gateway: workers register at %.*s:%d\n", (int)(rc_ ? rc_ - o.reg : 0), o.reg,
                gateway_register_port(g));
    }
    fprintf(stderr, "tokenmill gateway: listening on http://%s:%d\n", o.host, http_server_port(h));
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    cmd_gateway_drain(g, h, sig, o.drain_timeout);
    rc = 0;
out:
    gateway_shutdown(g);
    http_server_free(h);
    gateway_free(g);
    status_free(st);
    store_close(cache);
    for (int i = 0; i < n_models; i++) {
        cmd_gateway_model *u = &mods[i];
        grammar_cache_free(u->gcache);
        grammar_vocab_free(u->gvocab);
        template_free(u->tmpl);
        tokenizer_free(u->tok);
        model_free(u->m);
        free(u->derived);
    }
    return rc;
}
