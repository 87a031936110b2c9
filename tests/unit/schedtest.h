/*
 * schedtest: what the scheduler's unit tests (test_sched, test_spec) share: the tiny random
 * llama model they run in a temporary directory, and reading a request's output to its end.
 * Header-only (static functions), like tinymodel.h, so each test binary carries its own copy.
 */
#ifndef TM_SCHEDTEST_H
#define TM_SCHEDTEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/sched.h"
#include "model/model.h"
#include "tinymodel.h"

/* Makes the directory dir (a mkdtemp template, rewritten in place) and loads the tiny llama
 * written into it (64 wide, 2 layers, 4 heads on 2 KV heads of 16, vocabulary 100, weights
 * from seed). NULL after a message on stderr. */
static model *schedtest_open(char *dir, uint64_t seed)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return NULL;
    }
    tiny_cfg c = { .arch = "llama", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                   .head_dim = 16, .ffn = 96, .vocab = 100, .seed = seed };
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/llama.gguf", dir);
    if (tiny_write(&c, path)) {
        fprintf(stderr, "cannot write %s\n", path);
        return NULL;
    }
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    return m;
}

/* Frees m and removes dir with everything in it. */
static void schedtest_close(const char *dir, model *m)
{
    model_free(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

/* Polls r to its FINISH record (that record into *fin when fin is not NULL); the tokens go
 * into toks (up to cap of them). Returns how many tokens came, cap or not. */
static int schedtest_drain(sched_req *r, int32_t *toks, int cap, sched_output *fin)
{
    sched_output out[16];
    int n = 0;
    while (!sched_done(r)) {
        int k = sched_poll(r, out, 16, 30000);
        if (k == 0) break;  /* 30 s without output: a bug */
        for (int i = 0; i < k; i++) {
            if (out[i].kind == SCHED_OUT_TOKEN) {
                if (n < cap) toks[n] = out[i].token;
                n++;
            } else if (fin) {
                *fin = out[i];
            }
        }
    }
    return n;
}

#endif
