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

#include "engine/kvpool.h"
#include "util/util.h"

bool cmd_common_int(const char *prog, const char *opt, const char *z, long lo, long hi, long *out)
{
    char *end = NULL;
    long v = 0;
    errno = 0;
    if (*z && !isspace((unsigned char)*z)) v = strtol(z, &end, 10);
    if (!end || end == z || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "tokenmill %s: %s: '%s' is not a whole number in %ld..%ld\n", prog, opt, z, lo, hi);
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

bool cmd_common_engine_opt(const char *prog, const char *a, const char *v, cmd_engine_opts *o, bool *ok)
{
    long *dst;
    long lo = 1, hi;
    if (!strcmp(a, "--step-ms") || !strcmp(a, "--prefill-step-ms")) {
        *ok = cmd_common_num(prog, a, v, 0.01, 60000, a[2] == 's' ? &o->step_ms : &o->prefill_step_ms);
        return true;
    }
    if (!strcmp(a, "--threads") || !strcmp(a, "-t")) dst = &o->threads, lo = 0, hi = 1024;
    else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) dst = &o->ctx, lo = 0, hi = 1 << 24;
    else if (!strcmp(a, "--max-seqs")) dst = &o->max_seqs, hi = 4096;
    else if (!strcmp(a, "--kv-mib")) dst = &o->kv_mib, hi = 1 << 24;
    else if (!strcmp(a, "--max-queue")) dst = &o->max_queue, hi = 1 << 20;
    else if (!strcmp(a, "--step-tokens")) dst = &o->step_tokens, hi = 1 << 16;
    else if (!strcmp(a, "--prefill-step-tokens")) dst = &o->prefill_step, hi = 1 << 16;
    else return false;
    *ok = cmd_common_int(prog, a, v, lo, hi, dst);
    return true;
}

bool cmd_common_http_opt(const char *prog, const char *a, const char *v, http_opts *o, bool *ok)
{
    long x = 0;
    if (!strcmp(a, "--max-connections")) *ok = cmd_common_int(prog, a, v, 1, 1 << 20, &x), o->max_connections = (int)x;
    else if (!strcmp(a, "--max-client-connections")) *ok = cmd_common_int(prog, a, v, 1, 1 << 20, &x), o->max_client_connections = (int)x;
    else if (!strcmp(a, "--request-timeout")) *ok = cmd_common_int(prog, a, v, 1, 86400, &x), o->request_timeout_s = (int)x;
    else return false;
    return true;
}

engine *cmd_common_engine_new(const char *prog, model *m, cmd_engine_opts *o)
{
    char err[256];
    if (o->ctx <= 0) o->ctx = TM_MIN(m->hp.n_ctx_train, 4096);
    /* with a time target, the time sizes the steps: the token budget with decodes is only a cap */
    if (o->step_tokens == 0 && o->step_ms > 0) o->step_tokens = o->prefill_step;
    if (o->step_tokens == 0) o->step_tokens = sched_default_step_tokens((int)o->max_seqs);   /* max-seqs + 64 */
    /* the engine batch holds the larger of the two step budgets (sched caps both at it) */
    engine_opts eo = { .n_threads = (int)o->threads, .max_batch_tokens = (int)TM_MAX(o->step_tokens, o->prefill_step) };
    size_t per_tok = (size_t)m->hp.n_layers * (size_t)m->hp.n_kv_heads * (size_t)m->hp.head_dim * 2 * 2;
    size_t ctx_blocks = (size_t)(o->ctx + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK;
    size_t want_blocks = (size_t)o->max_seqs * ctx_blocks;
    size_t cap_blocks = ((size_t)o->kv_mib << 20) / (per_tok * KVPOOL_BLOCK);
    eo.n_kv_blocks = (int)TM_MAX(TM_MIN(want_blocks, cap_blocks), ctx_blocks + 1);
    engine *e = NULL;
    if (engine_new(m, &eo, &e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        return NULL;
    }
    kvpool_prefault(engine_kvpool(e));
    return e;
}

sched_opts cmd_common_sched_opts(const cmd_engine_opts *o, blockio *bio, const tokenizer *tok)
{
    sched_opts so = { .bio = bio, .max_seqs = (int)o->max_seqs, .max_queue = (int)o->max_queue,
                      .step_tokens = (int)o->step_tokens, .prefill_step_tokens = (int)o->prefill_step,
                      .step_ms = o->step_ms, .prefill_step_ms = o->prefill_step_ms,
                      .n_ctx = (int)o->ctx, .eos_ids = { -1, -1, -1, -1 } };
    so.eos_ids[0] = tokenizer_eos(tok);
    so.eos_ids[1] = tokenizer_eot(tok);
    return so;
}
