/*
 * cmd_worker: `tokenmill worker --role prefill|decode|mixed -m MODEL --listen HOST:PORT
 * --cache SPEC [--gateway HOST:PORT] [--threads N] [--ctx N] [--max-seqs N] [--kv-mib N]
 * [--step-tokens N] [--prefill-step-tokens N] [--max-queue N] [--name NAME] [--drain-timeout SECONDS] [-v]`: one worker
 * of the disaggregated server (src/cluster/worker.h, docs/protocol.md).
 *
 * The engine, scheduler and block store are set up as `tokenmill serve` does; every worker
 * and the gateway must name the same --cache store (full KV blocks travel through it). SIGTERM
 * drains (no new work, running requests finish within --drain-timeout, the rest is reported
 * MOVED to the gateway) and exits; SIGINT stops at once.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/store.h"
#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cluster/proto.h"
#include "cluster/worker.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "model/model.h"
#include "recipe/tokenizer.h"
#include "util/util.h"

static void cmd_worker_usage(void)
{
    fprintf(stderr,
            "usage: tokenmill worker --role prefill|decode|mixed -m MODEL --listen HOST:PORT --cache SPEC|off\n"
            "                        [--gateway HOST:PORT] [--threads N] [--ctx N] [--max-seqs N] [--kv-mib N]\n"
            "                        [--step-tokens N] [--prefill-step-tokens N] [--step-ms MS] [--prefill-step-ms MS]\n"
            "                        [--max-queue N] [--name NAME] [--drain-timeout SECONDS] [-v]\n");
}

int cmd_worker(int argc, char **argv)
{
    const char *path = NULL, *listen = NULL, *gateway = NULL, *cache_spec = NULL, *name = NULL;
    int role = -1;
    long drain_s = 60;
    cmd_engine_opts eng = CMD_ENGINE_OPTS_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "-v")) { util_log_level = LOG_LEVEL_DEBUG; continue; }
        if (!v) { fprintf(stderr, "tokenmill worker: %s needs a value\n", a); cmd_worker_usage(); return 2; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) path = v;
        else if (!strcmp(a, "--role")) {
            if ((role = proto_role_parse(v)) <= 0) {
                fprintf(stderr, "tokenmill worker: --role: '%s' is not prefill, decode or mixed\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--listen")) listen = v;
        else if (!strcmp(a, "--gateway")) gateway = v;
        else if (!strcmp(a, "--cache")) cache_spec = v;
        else if (!strcmp(a, "--name")) name = v;
        else if (cmd_common_engine_opt("worker", a, v, &eng, &ok)) {}
        else if (!strcmp(a, "--drain-timeout")) ok = cmd_common_int("worker", a, v, 1, 86400, &drain_s);
        else {
            fprintf(stderr, "tokenmill worker: unknown option '%s'\n", a);
            cmd_worker_usage();
            return 2;
        }
        if (!ok) return 2;  /* cmd_common_int said why */
        i++;
    }
    if (!path || role < 0 || (!listen && !gateway)) { cmd_worker_usage(); return 2; }
    if (cache_spec && !strcmp(cache_spec, "off")) cache_spec = NULL;
    if (!cache_spec && role != PROTO_ROLE_MIXED)
        fprintf(stderr, "tokenmill worker: no --cache: full KV blocks cannot be handed off, decode recomputes them\n");

    /* SIGINT/SIGTERM are blocked before any thread exists, so every thread inherits the mask
     * and only the main loop's sigtimedwait takes them (a thread started earlier with them
     * unblocked would take a SIGTERM with the default action: the process dies, undrained) */
    sigset_t set;
    cmd_common_block_stop_signals(&set);
    int rc = 1;
    model *m = NULL;
    tokenizer *tok = NULL;
    engine *e = NULL;
    sched *s = NULL;
    store *cache = NULL;
    blockio *bio = NULL;
    worker *w = NULL;
    if (!cmd_common_load_model("worker", path, &m, &tok)) goto out;
    if (!(e = cmd_common_engine_new("worker", m, &eng))) goto out;
    int n_ctx = (int)eng.ctx;
    if (cache_spec) {
        store_opts sto = { .capacity_bytes = (uint64_t)16 << 30, .gc_thread = true };
        store_status sst = store_open(cache_spec, &sto, &cache);
        if (sst != STORE_OK) {
            fprintf(stderr, "tokenmill worker: cannot open the block store %s (%s)\n", cache_spec, store_status_name(sst));
            rc = sst == STORE_ARG ? 2 : 1;
            goto out;
        }
        blockio_opts bo = { .n_write_slots = 32 };
        bio = blockio_new(cache, engine_kvpool(e), m, &bo);
    }
    sched_opts so = cmd_common_sched_opts(&eng, bio, tok);
    if (sched_new(e, &so, &s) != SCHED_OK) {
        fprintf(stderr, "tokenmill worker: cannot start the scheduler\n");
        goto out;
    }

    worker_opts wo = { .role = role, .listen = listen, .gateway = gateway, .name = name,
                       .max_seqs = (int)eng.max_seqs, .n_ctx = n_ctx };
    w = worker_new(&wo, e, s, cache, bio);
    if (!w) goto out;
    kvpool_stats kv_stats;
    kvpool_get_stats(engine_kvpool(e), &kv_stats);
    fprintf(stderr, "tokenmill worker: %s, model %s (%d layers, ctx %d, KV %d blocks, %d threads)%s%s\n",
            proto_role_name(role), m->hp.arch_name, m->hp.n_layers, n_ctx, kv_stats.n_blocks, engine_n_threads(e),
            bio ? ", block store " : "", bio ? store_spec(cache) : "");
    if (listen) fprintf(stderr, "tokenmill worker: listening on port %d\n", worker_port(w));
    fflush(stderr);
    /* SIGTERM: drain, then exit; SIGINT (or a second signal): stop now */
    bool draining = false;
    for (;;) {
        struct timespec ts = { 0, 100000000 };
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGINT || (sig == SIGTERM && draining)) {
            fprintf(stderr, "tokenmill worker: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
            break;
        }
        if (sig == SIGTERM) {
            fprintf(stderr, "tokenmill worker: SIGTERM, draining (deadline %ld s)\n", drain_s);
            worker_drain(w, (int)(drain_s * 1000));
            draining = true;
        }
        if (draining && worker_drained(w)) break;
    }
    rc = 0;
out:
    worker_free(w);
    if (s) sched_shutdown(s);
    sched_free(s);
    blockio_free(bio);
    store_close(cache);
    engine_free(e);
    tokenizer_free(tok);
    model_free(m);
    return rc;
}
