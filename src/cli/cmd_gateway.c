/*
 * cmd_gateway: `tokenmill gateway -m MODEL --listen HOST:PORT [--prefill HOST:PORT,...]
 * [--decode HOST:PORT,...] [--register HOST:PORT] [--cache SPEC|off] [--ctx N]
 * [--heartbeat-timeout S] [--wait-timeout S] [--progress-timeout FIRST[,NEXT]]
 * [--cluster-key-file PATH] [--api-key KEY ...] [--model-name NAME] [-v]`.
 *
 * The front of a disaggregated cluster (cluster/gateway.h): the same HTTP APIs as `serve`
 * (recipe/api.h, over the gateway's backend instead of a local scheduler), plus the admin
 * routes (/admin/workers, /admin/drain, /admin/capacity). The model is opened for its
 * tokenizer, chat template and fingerprint only (the file is mmapped: its weights are never
 * touched here). Workers are the --prefill / --decode addresses (reconnected when they come
 * back) and those that register at --register (workers started with --gateway). Every worker
 * must prove it holds the cluster key (--cluster-key-file, by default the key generated in the
 * cache dir: cluster/auth.h), else it is refused and logged.
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
#include "http/http.h"
#include "model/model.h"
#include "recipe/api.h"
#include "recipe/template.h"
#include "recipe/tokenizer.h"
#include "util/util.h"

#pragma weak api_chat_register
#pragma weak api_responses_register
#pragma weak api_messages_register

#define GWC_MAX 32

static void cmd_gateway_usage(void)
{
    fprintf(stderr, "usage: tokenmill gateway -m MODEL --listen HOST:PORT [--prefill HOST:PORT,...] [--decode HOST:PORT,...]\n"
                    "                         [--register HOST:PORT] [--cache SPEC|off] [--ctx N] [--heartbeat-timeout S]\n"
                    "                         [--wait-timeout S] [--progress-timeout FIRST[,NEXT]] [--cluster-key-file PATH]\n"
                    "                         [--api-key KEY ...] [--model-name NAME] [--template NAME] [-v]\n");
}

/* Splits the comma list z (option opt) in place into out, after its n entries (at most
 * GWC_MAX in all); returns the new count, or -1 after saying so on stderr. */
static int cmd_gateway_list(const char *opt, char *z, const char **out, int n)
{
    for (char *save = NULL, *t = strtok_r(z, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == GWC_MAX) {
            fprintf(stderr, "tokenmill gateway: %s: more than %d workers\n", opt, GWC_MAX);
            return -1;
        }
        out[n++] = t;
    }
    return n;
}

/* --progress-timeout FIRST[,NEXT]: seconds to a job's first token, and between two tokens
 * (NEXT defaults to FIRST / 3). */
static bool cmd_gateway_progress(const char *v, double *first, double *next)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    char *comma = strchr(buf, ',');
    if (comma) *comma = 0;
    if (!cmd_common_num("gateway", "--progress-timeout", buf, 1e-3, 86400, first)) return false;
    if (!comma) {
        *next = *first / 3;
        return true;
    }
    return cmd_common_num("gateway", "--progress-timeout", comma + 1, 1e-3, 86400, next);
}

int cmd_gateway(int argc, char **argv)
{
    const char *path = NULL, *listen = "127.0.0.1:8080", *reg = NULL, *cache_spec = NULL, *name = NULL, *tmpl_name = NULL;
    const char *pre[GWC_MAX], *dec[GWC_MAX], *keys[16];
    int n_pre = 0, n_dec = 0, n_keys = 0;
    long ctx = 0;
    double hb_timeout = 2, wait_timeout = 30, progress_first = 30, progress_next = 10;
    const char *key_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-v")) { util_log_level = LOG_LEVEL_DEBUG; continue; }
        if (!v) { fprintf(stderr, "tokenmill gateway: %s needs a value\n", a); cmd_gateway_usage(); return 2; }
        bool ok = true;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) path = v;
        else if (!strcmp(a, "--listen")) listen = v;
        else if (!strcmp(a, "--register")) reg = v;
        else if (!strcmp(a, "--prefill")) ok = (n_pre = cmd_gateway_list(a, v, pre, n_pre)) >= 0;
        else if (!strcmp(a, "--decode")) ok = (n_dec = cmd_gateway_list(a, v, dec, n_dec)) >= 0;
        else if (!strcmp(a, "--cache")) cache_spec = v;
        else if (!strcmp(a, "--ctx")) ok = cmd_common_int("gateway", a, v, 1, 1 << 24, &ctx);
        else if (!strcmp(a, "--heartbeat-timeout")) ok = cmd_common_num("gateway", a, v, 1e-3, 86400, &hb_timeout);
        else if (!strcmp(a, "--wait-timeout")) ok = cmd_common_num("gateway", a, v, 1e-3, 86400, &wait_timeout);
        else if (!strcmp(a, "--progress-timeout")) ok = cmd_gateway_progress(v, &progress_first, &progress_next);
        else if (!strcmp(a, "--cluster-key-file")) key_path = v;
        else if (!strcmp(a, "--model-name")) name = v;
        else if (!strcmp(a, "--template")) tmpl_name = v;
        else if (!strcmp(a, "--api-key")) {
            if (n_keys == 16) { fprintf(stderr, "tokenmill gateway: too many --api-key\n"); return 2; }
            keys[n_keys++] = v;
        } else {
            fprintf(stderr, "tokenmill gateway: unknown option '%s'\n", a);
            cmd_gateway_usage();
            return 2;
        }
        if (!ok) return 2;  /* the parser said why */
        i++;
    }
    if (!path) { cmd_gateway_usage(); return 2; }
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host) {
        fprintf(stderr, "tokenmill gateway: bad --listen '%s' (want HOST:PORT)\n", listen);
        return 2;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    long port;
    if (!cmd_common_int("gateway", "--listen port", colon + 1, 0, 65535, &port)) return 2;

    int rc = 1;
    char err[512];
    model *m = NULL;
    tokenizer *tok = NULL;
    template *tmpl = NULL;
    store *cache = NULL;
    gateway *g = NULL;
    http_server *h = NULL;
    char *derived = NULL;
    gc_retention classes;
    gc_retention_default(&classes);
    /* SIGINT/SIGTERM are blocked before any thread exists, so every thread inherits the mask
     * and only the main loop's sigtimedwait takes them (a thread started earlier with them
     * unblocked would take a SIGTERM with the default action: the process dies, not stopped) */
    sigset_t set;
    cmd_common_block_stop_signals(&set);
    if (!cmd_common_load_model("gateway", path, &m, &tok)) goto out;
    if (template_new(tok, m->g, tmpl_name, &tmpl, err, sizeof err) != TEMPLATE_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        goto out;
    }
    static auth_key key;   /* 4 KiB: off the stack */
    char key_file[4096];
    auth_status ast = key_path ? auth_key_load(key_path, &key, err, sizeof err)
                               : auth_key_default(&key, key_file, sizeof key_file, err, sizeof err);
    if (ast != AUTH_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        rc = 2;
        goto out;
    }
    fprintf(stderr, "tokenmill gateway: cluster key %s\n", key_path ? key_path : key_file);
    if (cache_spec && strcmp(cache_spec, "off")) {
        store_opts sto = { 0 };
        if (store_open(cache_spec, &sto, &cache) != STORE_OK) {
            fprintf(stderr, "tokenmill gateway: block store %s unavailable: no entry-point hits\n", cache_spec);
            cache = NULL;
        }
    }
    int n_ctx = ctx > 0 ? (int)ctx : TM_MIN(m->hp.n_ctx_train, 4096);
    gateway_opts go = { .model = m, .cache = cache, .prefill = pre, .n_prefill = n_pre, .decode = dec, .n_decode = n_dec,
                        .register_listen = reg, .n_ctx = n_ctx, .eos_ids = { -1, -1, -1, -1 },
                        .heartbeat_timeout_s = hb_timeout, .wait_timeout_s = wait_timeout, .key = &key,
                        .progress_first_s = progress_first, .progress_next_s = progress_next };
    go.eos_ids[0] = tokenizer_eos(tok);
    go.eos_ids[1] = tokenizer_eot(tok);
    if (gateway_new(&go, &g, err, sizeof err) != GATEWAY_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        rc = 2;
        goto out;
    }
    if (!name) name = derived = api_model_default_name(path);
    char alias_buf[256];
    const char *alias = api_model_alias(m, alias_buf, sizeof alias_buf);
    api_ctx ac = { .sched = NULL, .model = m, .tok = tok, .tmpl = tmpl, .model_name = name, .model_alias = alias,
                   .n_ctx = n_ctx, .n_threads = 1, .created = (int64_t)time(NULL), .retention = &classes,
                   .backend = gateway_backend(g) };
    http_opts ho = { .host = host, .port = port, .api_keys = keys, .n_api_keys = n_keys };
    if (http_server_new(&ho, &h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        rc = 2;
        goto out;
    }
    api_misc_register(h, &ac);
    api_completions_register(h, &ac);
    if (api_chat_register) api_chat_register(h, &ac);
    if (api_responses_register) api_responses_register(h, &ac);
    if (api_messages_register) api_messages_register(h, &ac);
    gateway_routes(g, h);

    if (http_server_start(h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill gateway: %s\n", err);
        goto out;
    }
    if (reg) {
        const char *rc_ = strrchr(reg, ':');
        fprintf(stderr, "tokenmill gateway: workers register at %.*s:%d\n", (int)(rc_ ? rc_ - reg : 0), reg,
                gateway_register_port(g));
    }
    fprintf(stderr, "tokenmill gateway: listening on http://%s:%d\n", host, http_server_port(h));
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "tokenmill gateway: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
out:
    gateway_shutdown(g);
    http_server_free(h);
    gateway_free(g);
    store_close(cache);
    template_free(tmpl);
    tokenizer_free(tok);
    model_free(m);
    free(derived);
    return rc;
}
