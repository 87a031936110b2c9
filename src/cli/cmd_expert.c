/*
 * cmd_expert: `tokenmill expert -m MODEL --listen HOST:PORT [--threads N] [--cpus LIST]
 * [--cluster-key-file PATH] [-v]`: a member of an expert-parallel group (cluster/ep.h). It maps
 * the model and computes the routed experts whose input rows a leader (`serve` or `worker`
 * with --ep-member) sends it, layer by layer; everything else of the model (attention, the
 * dense and shared layers, the KV cache, the API) is the leader's. The leader and its members
 * must load the same file (the fingerprints are compared) and hold the same cluster key.
 * The weights are not faulted in at start: a member reads the pages of the experts it is sent.
 * SIGTERM or SIGINT closes the links (its leaders compute its experts themselves) and exits 0.
 */
#include <signal.h>
#include <stdio.h>

#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cluster/auth.h"
#include "cluster/ep.h"
#include "model/model.h"
#include "recipe/tokenizer.h"
#include "util/topo.h"
#include "util/util.h"

int cmd_expert(int argc, char **argv)
{
    const char *path = NULL, *listen = NULL, *key_path = NULL, *cpus = NULL;
    long threads = 0;
    bool verbose = false;
    cmd_opt place[CMD_PLACE_TABLE_N];
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &path, .arg = "MODEL", .help = "the GGUF (the leader's file)", .required = true },
        { "--listen", NULL, CMD_OPT_STR, &listen, .arg = "HOST:PORT", .help = "where the group's leader connects", .required = true },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_place_table(&threads, &cpus, place) },
        { "--cluster-key-file", NULL, CMD_OPT_STR, &key_path, .arg = "PATH", .help = "the cluster secret (default: generated in ~/.cache/tokenmill)" },
        { "-v", NULL, CMD_OPT_FLAG, &verbose, .help = "log more" },
        { 0 },
    };
    const char *synopsis = "expert -m MODEL --listen HOST:PORT [options]";
    cmd_opts_status ost = cmd_opts_parse("expert", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    if (verbose) util_log_level = LOG_LEVEL_DEBUG;
    sigset_t set;
    cmd_common_block_stop_signals(&set);
    static auth_key key;   /* 4 KiB: off the stack */
    char key_file[4096], err[512];
    if (!cmd_common_cluster_key("expert", key_path, &key, key_file, sizeof key_file, true)) return 2;
    model *m = NULL;
    tokenizer *tok = NULL;
    int rc = 1;
    ep_member *mb = NULL;
    static int cpu_ids[TOPO_MAX_CPUS];
    int n_threads;
    bool pinned;
    if (!cmd_common_place("expert", threads, cpus, &n_threads, cpu_ids, &pinned)) {
        rc = 2;
        goto out;
    }
    if (!cmd_common_load_model("expert", path, &m, &tok)) goto out;
    if (!(mb = ep_member_new(m, n_threads, listen, &key, err, sizeof err))) {
        fprintf(stderr, "tokenmill expert: %s\n", err);
        rc = m->hp.n_expert < 2 ? 2 : 1;
        goto out;
    }
    fprintf(stderr, "tokenmill expert: model %s (%d layers, %d experts), %d threads\n", m->hp.arch_name, m->hp.n_layers,
            m->hp.n_expert, n_threads);
    fprintf(stderr, "tokenmill expert: listening on port %d\n", ep_member_port(mb));
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "tokenmill expert: %s, %llu layer exchanges served, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            (unsigned long long)ep_member_served(mb));
    rc = 0;
out:
    ep_member_free(mb);
    tokenizer_free(tok);
    model_free(m);
    return rc;
}
