/*
 * schedtest: what the tests that drive the scheduler (test_sched, test_spec, test_blockio,
 * test_tenancy, test_worker, test_gateway) share: the tiny random llama model they run in a
 * temporary directory, an engine + scheduler (+ block store) stack as a server builds it, and
 * running a request to its end. Header-only (static inline functions), like tinymodel.h, so
 * each test binary carries its own copy.
 */
#ifndef TM_SCHEDTEST_H
#define TM_SCHEDTEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/store.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "model/model.h"
#include "tinymodel.h"

/* Makes the directory dir (a mkdtemp template, rewritten in place) and loads the tiny llama
 * written into it (64 wide, 2 layers, 4 heads on 2 KV heads of 16, vocabulary 100, weights
 * from seed). NULL after a message on stderr. */
static inline model *schedtest_open(char *dir, uint64_t seed)
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
static inline void schedtest_close(const char *dir, model *m)
{
    model_free(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

/* A prompt of n tokens below 100 (the tiny vocabulary), different for each seed. */
static inline void schedtest_prompt(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++) t[i] = (seed * 31 + i * 17 + i * i) % 100;
}

/* Polls r to its FINISH record (that record into *fin when fin is not NULL); the tokens go
 * into toks (up to cap of them). Returns how many tokens came, cap or not. */
static inline int schedtest_drain(sched_req *r, int32_t *toks, int cap, sched_output *fin)
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

/* Runs p on s: submits it, reads it to its end (as schedtest_drain) and releases it. Returns
 * how many tokens came, or -1 when the scheduler refused the request. */
static inline int schedtest_run(sched *s, const sched_params *p, int32_t *toks, int cap, sched_output *fin)
{
    sched_req *r;
    if (sched_submit(s, p, &r) != SCHED_OK) return -1;
    int n = schedtest_drain(r, toks, cap, fin);
    sched_release(r);
    return n;
}

/* One engine + scheduler, with a block store and its blockio when a store spec is given: what
 * a server (or a cluster worker) runs. */
typedef struct {
    engine *e;
    store *st;                   /* NULL without a spec or when it did not open */
    blockio *bio;                /* NULL without a store */
    sched *s;                    /* NULL when sched_new failed */
} schedtest_stack;

typedef struct {
    const char *spec;            /* the store ("dir:PATH", ...), NULL: none */
    int n_kv_blocks;             /* KV pool blocks; 0: 32 */
    int n_ctx;                   /* context tokens; 0: 1024 */
    store_opts store;            /* the store's options */
    blockio_opts bio;            /* blockio's options; n_write_slots 0: 64 */
} schedtest_stack_opts;

/* Builds the stack over m: one engine thread, batches of 128 tokens, a scheduler of 4
 * sequences, a queue of 16 and steps of 48 tokens (see test_sched.c), no EOS. A part that
 * fails stays NULL after a message on stderr: the caller checks what it needs. */
static inline schedtest_stack schedtest_stack_new(model *m, const schedtest_stack_opts *o)
{
    schedtest_stack v = { 0 };
    engine_opts eo = { .n_threads = 1, .n_kv_blocks = o->n_kv_blocks ? o->n_kv_blocks : 32,
                       .max_batch_tokens = 128 };
    char err[256];
    if (engine_new(m, &eo, &v.e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "%s\n", err);
        return v;
    }
    if (o->spec) {
        store_opts so = o->store;
        if (store_open(o->spec, &so, &v.st) == STORE_OK) {
            blockio_opts bo = o->bio;
            if (!bo.n_write_slots) bo.n_write_slots = 64;
            v.bio = blockio_new(v.st, engine_kvpool(v.e), m, &bo);
        } else {
            fprintf(stderr, "cannot open the store %s\n", o->spec);
        }
    }
    sched_opts so = { .max_seqs = 4, .max_queue = 16, .step_tokens = 48, .n_ctx = o->n_ctx ? o->n_ctx : 1024,
                      .eos_ids = { -1, -1, -1, -1 }, .bio = v.bio };
    if (sched_new(v.e, &so, &v.s) != SCHED_OK) fprintf(stderr, "sched_new failed\n");
    return v;
}

/* Frees what schedtest_stack_new built (scheduler first, the blockio's queue written). */
static inline void schedtest_stack_free(schedtest_stack *v)
{
    sched_free(v->s);
    blockio_free(v->bio);
    store_close(v->st);
    engine_free(v->e);
    memset(v, 0, sizeof *v);
}

#endif
