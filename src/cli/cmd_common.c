/*
 * cmd_common: the start-up steps serve, gateway and worker share (see cmd_common.h).
 */
#include "cli/cmd_common.h"

#include <pthread.h>
#include <stdio.h>

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
