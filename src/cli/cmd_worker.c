/*
 * cmd_worker: `tokenmill worker --role prefill|decode|mixed -m MODEL --listen HOST:PORT
 * --cache SPEC [--gateway HOST:PORT] [--threads N] [--cpus LIST] [--ctx N] [--max-seqs N] [--kv-mib N]
 * [--step-tokens N] [--prefill-step-tokens N] [--max-queue N] [--name NAME] [--drain-timeout SECONDS]
 * [--cluster-key-file PATH] [-v]`: one worker of the disaggregated server (src/cluster/worker.h,
 * docs/protocol.md). `-m NAME=FILE` (or --model-name) is the id the gateway routes that model's
 * requests by (default: the file's name, as `serve` names it).
 *
 * The engine, scheduler and block store are set up as `tokenmill serve` does (the weights
 * made resident before the worker listens or registers); every worker
 * and the gateway must name the same --cache store (full KV blocks travel through it) and hold
 * the same cluster key (--cluster-key-file, by default the key generated in the cache dir:
 * cluster/auth.h). SIGTERM or SIGINT drains: the gateway is told (DRAIN) and sends no new work,
 * running requests finish within --drain-timeout (default 30 s), the rest is handed back
 * (FINISH MOVED: the gateway resumes them elsewhere with their tokens so far); then the block
 * store's write-behind queue is flushed (blockio_free) and the process exits 0. A second
 * signal exits at once (status 1).
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
#include "cluster/auth.h"
#include "cluster/ep.h"
#include "cluster/proto.h"
#include "cluster/worker.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "model/model.h"
#include "recipe/api.h"
#include "recipe/tokenizer.h"
#include "grammar/grammar.h"
#include "util/util.h"

/* --role into an int: PROTO_ROLE_PREFILL / DECODE / MIXED */
static bool cmd_worker_role(const char *prog, const char *name, const char *v, void *dst)
{
    int role = proto_role_parse(v);
    if (role <= 0) {
        fprintf(stderr, "tokenmill %s: %s: '%s' is not prefill, decode or mixed\n", prog, name, v);
        return false;
    }
    *(int *)dst = role;
    return true;
}

/* Whether this worker can serve m in role (path names it in the message); false after saying
 * why on stderr: the exit status is then 2. */
static bool cmd_worker_servable(const model *m, int role, const char *path)
{
    if (m->hp.bidirectional && role == PROTO_ROLE_DECODE) {   /* its inputs end where they are computed */
        fprintf(stderr, "tokenmill worker: %s: '%s' is an embedding model: its worker is a prefill or mixed one "
                "(an embedding ends in its prefill; there is nothing to decode)\n", path, m->hp.arch_name);
        return false;
    }
    return true;
}

/* Serves until the stop signals in set (blocked) say otherwise. SIGTERM / SIGINT: drain (the
 * running requests get drain_s seconds), then return 0; a second signal: return 1 at once. */
static int cmd_worker_wait(worker *w, const sigset_t *set, long drain_s)
{
    bool draining = false;
    for (;;) {
        struct timespec ts = { 0, 100000000 };
        int sig = sigtimedwait(set, NULL, &ts);
        const char *sname = sig == SIGINT ? "SIGINT" : "SIGTERM";
        if (sig > 0 && draining) {
            fprintf(stderr, "tokenmill worker: second signal (%s), stopping now\n", sname);
            return 1;
        }
        if (sig > 0) {
            fprintf(stderr, "tokenmill worker: %s, draining (deadline %ld s)\n", sname, drain_s);
            worker_drain(w, (int)(drain_s * 1000));
            draining = true;
        }
        if (draining && worker_drained(w)) {
            fprintf(stderr, "tokenmill worker: drained, flushing the block store's writes\n");
            return 0;
        }
    }
}

int cmd_worker(int argc, char **argv)
{
    const char *path = NULL, *listen = NULL, *gateway = NULL, *cache_spec = NULL, *name = NULL, *key_path = NULL;
    const char *model_id = NULL;
    char *derived_id = NULL;
    int role = -1;
    long drain_s = 30;
    cmd_engine_opts eng = CMD_ENGINE_OPTS_DEFAULT;
    cmd_ep_opts ep = CMD_EP_OPTS_DEFAULT;
    ep_group *epg = NULL;
    bool verbose = false;
    cmd_opt eng_t[CMD_ENGINE_TABLE_N], gram[CMD_GRAMMAR_TABLE_N], ep_t[CMD_EP_TABLE_N];
    grammar_limits gl = grammar_limits_get();
    const cmd_opt opts[] = {
        { "--role", NULL, CMD_OPT_FN, &role, .fn = cmd_worker_role, .arg = "prefill|decode|mixed", .help = "what this worker does", .required = true },
        { "--model", "-m", CMD_OPT_STR, &path, .arg = "[NAME=]MODEL", .help = "the GGUF, and the id requests name it by (default: the file's name)", .required = true },
        { "--model-name", NULL, CMD_OPT_STR, &model_id, .arg = "NAME", .help = "the model's id (as -m NAME=FILE)" },
        { "--listen", NULL, CMD_OPT_STR, &listen, .arg = "HOST:PORT", .help = "where the gateway connects (this or --gateway)" },
        { "--gateway", NULL, CMD_OPT_STR, &gateway, .arg = "HOST:PORT", .help = "register at a gateway's --register address" },
        { "--cache", NULL, CMD_OPT_STR, &cache_spec, .arg = "SPEC|off", .help = "the block store every worker shares" },
        { "--name", NULL, CMD_OPT_STR, &name, .arg = "NAME", .help = "the worker's name in /admin/workers, unique per gateway (default HOSTNAME:PORT)" },
        { "--cluster-key-file", NULL, CMD_OPT_STR, &key_path, .arg = "PATH", .help = "the cluster secret (default: generated in ~/.cache/tokenmill)" },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_engine_table(&eng, eng_t) },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_ep_table(&ep, ep_t) },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_grammar_table(&gl, gram) },
        { "--drain-timeout", NULL, CMD_OPT_LONG, &drain_s, 1, 86400, .arg = "S", .help = "at SIGTERM, seconds running requests get (default 30)" },
        { "-v", NULL, CMD_OPT_FLAG, &verbose, .help = "log every engine step" },
        { 0 },
    };
    const char *synopsis = "worker --role prefill|decode|mixed -m MODEL --listen HOST:PORT|--gateway HOST:PORT --cache SPEC [options]";
    cmd_opts_status ost = cmd_opts_parse("worker", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    grammar_limits_set(&gl);
    const char *spec_id;
    if (!cmd_common_model_spec("worker", (char *)path, &spec_id, &path)) return 2;   /* argv's storage */
    if (spec_id && model_id && strcmp(spec_id, model_id)) {
        fprintf(stderr, "tokenmill worker: -m names the model '%s', --model-name '%s': give one\n", spec_id, model_id);
        return 2;
    }
    if (spec_id) model_id = spec_id;
    if (!model_id) model_id = derived_id = api_model_default_name(path);
    if (!listen && !gateway) {
        fprintf(stderr, "tokenmill worker: --listen or --gateway is required\n");
        cmd_opts_hint("worker", synopsis);
        return 2;
    }
    if (verbose) util_log_level = LOG_LEVEL_DEBUG;
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
    grammar_vocab *gvocab = NULL;
    static auth_key key;   /* 4 KiB: off the stack */
    char key_file[4096];
    if (!cmd_common_cluster_key("worker", key_path, &key, key_file, sizeof key_file, true)) {
        rc = 2;
        goto out;
    }
    if (!cmd_common_load_model("worker", path, &m, &tok)) goto out;
    if (!cmd_worker_servable(m, role, path)) {
        rc = 2;
        goto out;
    }
    if (!(e = cmd_common_engine_new("worker", m, &eng))) goto out;
    if (!cmd_common_ep_start("worker", e, &ep, key_path, &epg)) goto out;
    cmd_common_resident("worker", m, engine_n_threads(e));   /* before the gateway may send work */
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
        if (!m->hp.bidirectional) bio = blockio_new(cache, engine_kvpool(e), m, &bo);   /* an encoder keeps no KV to store */
    }
    sched_opts so = cmd_common_sched_opts(&eng, bio, tok);
    if (sched_new(e, &so, &s) != SCHED_OK) {
        fprintf(stderr, "tokenmill worker: cannot start the scheduler\n");
        goto out;
    }

    gvocab = tokenizer_grammar_vocab(tok);   /* the jobs' structured-output grammars */
    worker_opts wo = { .role = role, .listen = listen, .gateway = gateway, .name = name, .model_id = model_id, .key = &key,
                       .max_seqs = (int)eng.max_seqs, .n_ctx = n_ctx, .gvocab = gvocab };
    w = worker_new(&wo, e, s, cache, bio);
    if (!w) goto out;
    char kvd[128];
    cmd_common_kv_desc(e, kvd, sizeof kvd);
    fprintf(stderr, "tokenmill worker: %s, model %s (%d layers, ctx %d, %s, %d threads)%s%s\n",
            proto_role_name(role), m->hp.arch_name, m->hp.n_layers, n_ctx, kvd, engine_n_threads(e),
            bio ? ", block store " : "", bio ? store_spec(cache) : "");
    fprintf(stderr, "tokenmill worker: named %s\n", worker_name(w));
    fprintf(stderr, "tokenmill worker: serves the model '%s'\n", model_id);
    if (listen) fprintf(stderr, "tokenmill worker: listening on port %d\n", worker_port(w));
    fflush(stderr);
    rc = cmd_worker_wait(w, &set, drain_s);
out:
    worker_free(w);
    if (s) sched_shutdown(s);
    sched_free(s);
    blockio_free(bio);
    store_close(cache);
    ep_group_free(epg);
    engine_free(e);
    grammar_vocab_free(gvocab);
    cmd_common_draft_free(&eng);
    tokenizer_free(tok);
    model_free(m);
    free(derived_id);
    return rc;
}
