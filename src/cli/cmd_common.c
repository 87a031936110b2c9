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
