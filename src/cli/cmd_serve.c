/*
 * cmd_serve: `tokenmill serve -m MODEL [--host 127.0.0.1] [--port 8080] [--threads N]
 * [--ctx N] [--max-seqs N] [--api-key KEY ...] [--model-name NAME] [--template NAME]
 * [--kv-mib N] [--max-queue N] [--step-tokens N] [--prefill-step-tokens N] [--max-body BYTES] [--timeout S]
 * [--max-connections N] [--max-client-connections N] [--request-timeout S] [--metrics-public]`.
 *
 * Loads the model, its tokenizer and chat template, starts the engine and its scheduler
 * thread, registers every API's routes on the HTTP server and serves until SIGINT/SIGTERM.
 * Then: the scheduler is shut down first (queued and running requests end, so streams
 * finish), the HTTP server stops, and everything is freed in reverse order.
 *
 * The line "tokenmill serve: listening on http://HOST:PORT" goes to stderr once the port
 * is bound (with --port 0 the system picks a free port: tests read it from that line).
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

#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cache/gc.h"
#include "cache/store.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "http/http.h"
#include "model/model.h"
#include "recipe/api.h"
#include "recipe/template.h"
#include "recipe/tokenizer.h"
#include "util/util.h"

#pragma weak api_chat_register
#pragma weak api_responses_register
#pragma weak api_messages_register

#define SERVE_MAX_KEYS 16

static void cmd_serve_usage(void)
{
    fprintf(stderr,
            "usage: tokenmill serve -m MODEL [--host 127.0.0.1] [--port 8080] [--threads N] [--ctx N]\n"
            "                       [--max-seqs N] [--api-key KEY ...] [--model-name NAME] [--template NAME]\n"
            "                       [--kv-mib N] [--max-queue N] [--step-tokens N] [--prefill-step-tokens N] [--max-body BYTES]\n"
            "                       [--timeout SECONDS] [--cache SPEC|default|off] [--cache-dir DIR]\n"
            "                       [--cache-capacity SIZE] [--retention agent=72h,chat=7d]\n"
            "                       [--max-connections N] [--max-client-connections N] [--request-timeout S]\n"
            "                       [--metrics-public] [-v]\n");
}

int cmd_serve(int argc, char **argv)
{
    const char *path = NULL, *host = "127.0.0.1", *name = NULL, *tmpl_name = NULL;
    const char *keys[SERVE_MAX_KEYS];
    int n_keys = 0;
    long port = 8080;
    cmd_engine_opts eng = CMD_ENGINE_OPTS_DEFAULT;
    long max_body = 8 << 20, timeout = 60;
    http_opts ho = { 0 };       /* connection limits from the options; the rest below */
    bool metrics_public = false;
    const char *cache_spec = "default", *retention = NULL;
    uint64_t cache_capacity = 0;
    char cache_buf[4096];
    /* SIGINT/SIGTERM are blocked before any thread exists (threads inherit the mask) and
     * taken with sigwait below: a signal arriving while threads start must not kill the
     * process before its clean shutdown */
    sigset_t set;
    cmd_common_block_stop_signals(&set);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "-v")) { util_log_level = LOG_LEVEL_DEBUG; continue; }
        if (!strcmp(a, "--metrics-public")) { metrics_public = true; continue; }
        if (!v) { fprintf(stderr, "tokenmill serve: %s needs a value\n", a); cmd_serve_usage(); return 2; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) path = v;
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) ok = cmd_common_int("serve", a, v, 0, 65535, &port);
        else if (cmd_common_engine_opt("serve", a, v, &eng, &ok)) {}
        else if (cmd_common_http_opt("serve", a, v, &ho, &ok)) {}
        else if (!strcmp(a, "--max-body")) ok = cmd_common_int("serve", a, v, 1024, 1L << 32, &max_body);
        else if (!strcmp(a, "--timeout")) ok = cmd_common_int("serve", a, v, 1, 86400, &timeout);
        else if (!strcmp(a, "--cache")) cache_spec = v;
        else if (!strcmp(a, "--cache-dir")) {
            snprintf(cache_buf, sizeof cache_buf, "dir:%s", v);
            cache_spec = cache_buf;
        } else if (!strcmp(a, "--cache-capacity")) {
            if (!(cache_capacity = gc_parse_size(v))) {
                fprintf(stderr, "tokenmill serve: %s: '%s' is not a size such as 512M, 20G or 1T\n", a, v);
                return 2;
            }
        }
        else if (!strcmp(a, "--retention")) retention = v;
        else if (!strcmp(a, "--model-name")) name = v;
        else if (!strcmp(a, "--template")) tmpl_name = v;
        else if (!strcmp(a, "--api-key")) {
            if (n_keys == SERVE_MAX_KEYS) { fprintf(stderr, "tokenmill serve: too many --api-key\n"); return 2; }
            keys[n_keys++] = v;
        } else {
            fprintf(stderr, "tokenmill serve: unknown option '%s'\n", a);
            cmd_serve_usage();
            return 2;
        }
        if (!ok) return 2;  /* cmd_common_int said why */
        i++;
    }
    if (!path) { cmd_serve_usage(); return 2; }
    gc_retention classes;   /* the traffic classes requests may name (cache_class) */
    gc_retention_default(&classes);
    if (retention && gc_retention_parse(&classes, retention)) {
        fprintf(stderr, "tokenmill serve: bad --retention '%s' (want e.g. agent=72h,chat=7d)\n", retention);
        return 2;
    }

    int rc = 1;
    char err[512];
    model *m = NULL;
    tokenizer *tok = NULL;
    template *tmpl = NULL;
    engine *e = NULL;
    sched *s = NULL;
    http_server *h = NULL;
    store *cache = NULL;
    blockio *bio = NULL;
    char *derived_name = NULL;

    if (!cmd_common_load_model("serve", path, &m, &tok)) goto out;
    if (template_new(tok, m->g, tmpl_name, &tmpl, err, sizeof err) != TEMPLATE_OK) {
        fprintf(stderr, "tokenmill serve: %s\n", err);
        rc = tmpl_name ? 2 : 1;
        goto out;
    }
    if (!(e = cmd_common_engine_new("serve", m, &eng))) goto out;
    int n_ctx = (int)eng.ctx;
    if (cache_spec && !strcmp(cache_spec, "off")) cache_spec = NULL;
    if (cache_spec && !strcmp(cache_spec, "default")) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg) snprintf(cache_buf, sizeof cache_buf, "dir:%s/tokenmill/blocks", xdg);
        else snprintf(cache_buf, sizeof cache_buf, "dir:%s/.cache/tokenmill/blocks", home && *home ? home : "/tmp");
        cache_spec = cache_buf;
        if (!cache_capacity) cache_capacity = (uint64_t)16 << 30; /* a default must not fill the disk */
    }
    if (cache_spec) {
        store_opts sto = { .capacity_bytes = cache_capacity, .retention = retention, .gc_thread = true };
        store_status sst = store_open(cache_spec, &sto, &cache);
        if (sst == STORE_ARG) {
            fprintf(stderr, "tokenmill serve: bad --cache '%s' or --retention\n", cache_spec);
            rc = 2;
            goto out;
        }
        if (sst != STORE_OK) {
            fprintf(stderr, "tokenmill serve: block store %s unavailable (%s): running without it\n", cache_spec,
                    store_status_name(sst));
        } else {
            blockio_opts bo = { 0 };
            bio = blockio_new(cache, engine_kvpool(e), m, &bo);
        }
    }
    sched_opts so = cmd_common_sched_opts(&eng, bio, tok);
    if (sched_new(e, &so, &s) != SCHED_OK) {
        fprintf(stderr, "tokenmill serve: cannot start the scheduler\n");
        goto out;
    }
    if (!name) name = derived_name = api_model_default_name(path);
    char alias_buf[256];
    const char *alias = api_model_alias(m, alias_buf, sizeof alias_buf);

    api_ctx ac = {
        .sched = s, .model = m, .tok = tok, .tmpl = tmpl, .model_name = name, .model_alias = alias,
        .n_ctx = n_ctx, .n_threads = engine_n_threads(e), .created = (int64_t)time(NULL), .retention = &classes,
        .metrics_public = metrics_public,
    };
    ho.host = host;
    ho.port = (int)port;
    ho.max_body = (size_t)max_body;
    ho.idle_timeout_s = (int)timeout;
    ho.api_keys = keys;
    ho.n_api_keys = n_keys;
    if (http_server_new(&ho, &h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill serve: %s\n", err);
        rc = 2;
        goto out;
    }
    api_misc_register(h, &ac);
    api_completions_register(h, &ac);
    if (api_chat_register) api_chat_register(h, &ac);
    if (api_responses_register) api_responses_register(h, &ac);
    if (api_messages_register) api_messages_register(h, &ac);

    if (http_server_start(h, err, sizeof err) != HTTP_OK) {
        fprintf(stderr, "tokenmill serve: %s\n", err);
        goto out;
    }
    kvpool_stats kv_stats;
    kvpool_get_stats(engine_kvpool(e), &kv_stats);
    fprintf(stderr, "tokenmill serve: model %s (%s, %d layers, ctx %d, KV %d blocks, %d threads, template %s)\n", name,
            m->hp.arch_name, m->hp.n_layers, n_ctx, kv_stats.n_blocks, engine_n_threads(e), template_name(tmpl));
    if (bio) fprintf(stderr, "tokenmill serve: block store %s\n", store_spec(cache));
    fprintf(stderr, "tokenmill serve: listening on http://%s:%d\n", host, http_server_port(h));
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "tokenmill serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
out:
    if (s) sched_shutdown(s);
    http_server_free(h);
    sched_free(s);
    blockio_free(bio);   /* writes what is queued; before the pool goes */
    store_close(cache);
    engine_free(e);
    template_free(tmpl);
    tokenizer_free(tok);
    model_free(m);
    free(derived_name);
    return rc;
}
