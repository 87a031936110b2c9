/*
 * test_sched: the continuous-batching scheduler on a tiny random llama model: batching of
 * several requests with greedy results identical to each request run alone, cancellation
 * releasing KV blocks, the bounded queue, KV exhaustion (waiting and preemption, then
 * completion with the same tokens), prefix-cache hits reported as cached tokens, log-probs,
 * argument errors, and chunked prefill: a long prompt that arrives while a sequence decodes is
 * read in chunks of the default step budget, and the decode gets its token in every step; a
 * prompt read alone goes in steps of the (larger) prefill budget; draining (new work refused,
 * accepted work finishes) and the abort that ends what is left; publishing a step's outputs
 * while the next computes gives the outputs of the loop that publishes first; embedding requests
 * (pooled states, nothing sampled) beside generations.
 *
 * The "alone vs together" comparisons are exact because the engine is batch invariant (a
 * row's arithmetic never depends on the step it is in: test_invariance.c); step_tokens 48
 * only keeps the steps small.
 */
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "cache/store.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "engine/steptime.h"
#include "schedtest.h"

static char tmpdir[] = "/tmp/tm_test_sched_XXXXXX";
static model *g_model;

typedef struct {
    engine *e;
    store *st;      /* block store tier, or NULL */
    blockio *bio;
    sched *s;
} rig;

/* A scheduler with these options (n_ctx 1024, no eos) on a pool of `blocks`, with a block
 * store in directory tmpdir/store_name when that is not NULL. */
static rig rig_open(int blocks, sched_opts so, const char *store_name)
{
    rig r = { 0 };
    engine_opts eo = { .n_threads = 2, .n_kv_blocks = blocks, .max_batch_tokens = 128 };  /* 2: one sampling worker */
    char err[256];
    if (engine_new(g_model, &eo, &r.e, err, sizeof err) != ENGINE_OK) fprintf(stderr, "%s\n", err);
    if (store_name) {
        char spec[300];
        snprintf(spec, sizeof spec, "dir:%s/%s", tmpdir, store_name);
        store_opts sto = { 0 };
        blockio_opts bo = { .n_write_slots = 64 };
        if (store_open(spec, &sto, &r.st) == STORE_OK) r.bio = blockio_new(r.st, engine_kvpool(r.e), g_model, &bo);
        if (!r.bio) fprintf(stderr, "no block store at %s\n", spec);
    }
    so.n_ctx = 1024;
    for (int i = 0; i < 4; i++) so.eos_ids[i] = -1;
    so.bio = r.bio;
    if (sched_new(r.e, &so, &r.s) != SCHED_OK) fprintf(stderr, "sched_new failed\n");
    return r;
}

static rig rig_new(int blocks, int max_seqs, int max_queue, int step_tokens)
{
    sched_opts so = { .max_seqs = max_seqs, .max_queue = max_queue, .step_tokens = step_tokens };
    return rig_open(blocks, so, NULL);
}

static void rig_free(rig *r)
{
    sched_free(r->s);
    blockio_free(r->bio);
    store_close(r->st);
    engine_free(r->e);
}

static void prompt_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++) t[i] = (seed * 31 + i * 17 + i * i) % 100;
}

static sched_params greedy(const int32_t *prompt, int n, int max_tokens)
{
    sched_params p = { .prompt = prompt, .n_prompt = n, .max_tokens = max_tokens };
    p.sample = sample_params_default();
    p.sample.temp = 0;
    return p;
}

static bool wait_blocks_used(sched *s, int want)
{
    sched_stats st;
    if (WAIT_UNTIL((sched_get_stats(s, &st), st.kv_blocks_used == want && st.n_running == 0), 30))
        return true;
    fprintf(stderr, "  blocks used %d running %d\n", st.kv_blocks_used, st.n_running);
    return false;
}

/* Runs one greedy request alone on a fresh rig. */
static int solo(const int32_t *prompt, int n, int max_tokens, int32_t *toks, int cap)
{
    rig g = rig_new(16, 4, 16, 48);
    sched_params p = greedy(prompt, n, max_tokens);
    sched_req *r;
    int k = -1;
    if (sched_submit(g.s, &p, &r) == SCHED_OK) {
        k = schedtest_drain(r, toks, cap, NULL);
        sched_release(r);
    }
    rig_free(&g);
    return k;
}

TEST(test_batch_equals_alone)
{
    enum { NR = 5, GEN = 40 };
    int32_t prompts[NR][200];
    int lens[NR] = { 7, 150, 1, 60, 33 };
    int32_t want[NR][GEN], got[NR][GEN];
    for (int i = 0; i < NR; i++) {
        prompt_of(prompts[i], lens[i], i + 1);
        CHECK(solo(prompts[i], lens[i], GEN, want[i], GEN) == GEN);
    }
    rig g = rig_new(16, 4, 16, 48);  /* 4 running at once: the fifth waits for a slot */
    sched_req *r[NR];
    for (int i = 0; i < NR; i++) {
        sched_params p = greedy(prompts[i], lens[i], GEN);
        CHECK(sched_submit(g.s, &p, &r[i]) == SCHED_OK);
    }
    for (int i = 0; i < NR; i++) {
        sched_output fin = { 0 };
        CHECK(schedtest_drain(r[i], got[i], GEN, &fin) == GEN);
        CHECK(fin.kind == SCHED_OUT_FINISH && fin.finish == SCHED_FINISH_LENGTH);
        CHECK(fin.usage.prompt_tokens == lens[i] && fin.usage.completion_tokens == GEN);
        CHECKF(!memcmp(got[i], want[i], sizeof want[i]), "request %d differs when batched", i);
        sched_release(r[i]);
    }
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECK(st.n_requests == NR && st.n_gen_tokens == NR * GEN);
    CHECK(st.n_finished[SCHED_FINISH_LENGTH] == NR);
    /* batching happened: fewer steps than one per token */
    CHECKF(st.n_steps < (uint64_t)NR * GEN, "%llu steps", (unsigned long long)st.n_steps);
    CHECK(wait_blocks_used(g.s, 0));
    rig_free(&g);
}

TEST(test_cancel_frees_blocks)
{
    rig g = rig_new(16, 4, 16, 48);
    int32_t prompt[300];
    prompt_of(prompt, 300, 3);
    sched_params p = greedy(prompt, 300, 500);
    sched_req *r;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    sched_output out[4];
    int got = 0;
    while (got < 3) {
        int k = sched_poll(r, out, 1, 30000);
        if (k == 0) break;
        got += out[0].kind == SCHED_OUT_TOKEN;
    }
    CHECK(got == 3);
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECK(st.kv_blocks_used >= 3);
    sched_cancel(r);
    sched_output fin = { 0 };
    schedtest_drain(r, NULL, 0, &fin);
    CHECK(fin.finish == SCHED_FINISH_CANCELLED);
    CHECK(fin.usage.completion_tokens >= 3 && fin.usage.completion_tokens < 500);
    CHECK(wait_blocks_used(g.s, 0));
    sched_release(r);
    /* release without polling, while running */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(sched_poll(r, out, 1, 30000) == 1);
    sched_release(r);
    CHECK(wait_blocks_used(g.s, 0));
    sched_get_stats(g.s, &st);
    CHECK(st.n_finished[SCHED_FINISH_CANCELLED] == 2);
    rig_free(&g);
}

TEST(test_queue_full)
{
    rig g = rig_new(16, 1, 2, 48);
    int32_t prompt[20];
    prompt_of(prompt, 20, 5);
    sched_params p = greedy(prompt, 20, 200);  /* long enough that none ends while we submit */
    sched_req *r[10];
    int ok = 0, full = 0;
    for (int i = 0; i < 10; i++) {
        sched_status st = sched_submit(g.s, &p, &r[ok]);
        if (st == SCHED_OK) ok++;
        else if (st == SCHED_ERR_QUEUE_FULL) full++;
    }
    CHECK(full >= 10 - 3 - 1 && ok + full == 10);  /* 1 running + 2 queued (+1 being admitted) */
    int32_t first[200], t[200];
    for (int i = 0; i < ok; i++) {
        CHECK(schedtest_drain(r[i], i ? t : first, 200, NULL) == 200);
        if (i) CHECK(!memcmp(t, first, sizeof t));
        sched_release(r[i]);
    }
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECK(st.n_rejected == (uint64_t)full);
    rig_free(&g);
}

TEST(test_kv_exhaustion_preempts_and_completes)
{
    /* 5 blocks of 128 positions; 3 requests that each grow to 3 blocks: they cannot all hold
     * their KV at once, so some wait or are preempted and resumed by recomputation. */
    enum { NR = 3, GEN = 300 };
    int32_t prompts[NR][20];
    static int32_t want[NR][GEN], got[NR][GEN];
    for (int i = 0; i < NR; i++) {
        prompt_of(prompts[i], 20, 11 + i);
        CHECK(solo(prompts[i], 20, GEN, want[i], GEN) == GEN);
    }
    /* the requests overlap only if the engine thread does not run one far ahead before the
     * next is submitted (this thread descheduled on a loaded machine): then none is preempted,
     * and the scenario is run again, a few times at most */
    rig g;
    sched_stats st = { 0 };
    for (int attempt = 0; attempt < 5 && st.n_preempted == 0; attempt++) {
        if (attempt > 0) rig_free(&g);
        g = rig_new(5, 4, 16, 48);
        sched_req *r[NR];
        for (int i = 0; i < NR; i++) {
            sched_params p = greedy(prompts[i], 20, GEN);
            CHECK(sched_submit(g.s, &p, &r[i]) == SCHED_OK);
        }
        for (int i = 0; i < NR; i++) {
            sched_output fin = { 0 };
            CHECK(schedtest_drain(r[i], got[i], GEN, &fin) == GEN);
            CHECK(fin.finish == SCHED_FINISH_LENGTH);
            CHECKF(!memcmp(got[i], want[i], sizeof want[i]), "request %d differs after preemption", i);
            sched_release(r[i]);
        }
        sched_get_stats(g.s, &st);
    }
    CHECKF(st.n_preempted > 0, "no preemption happened in 5 runs");
    CHECK(wait_blocks_used(g.s, 0));
    /* a request bigger than the whole pool ends with ERROR, not a crash or a hang */
    int32_t big[700];
    prompt_of(big, 700, 9);
    sched_params p = greedy(big, 700, 10);
    sched_req *rb;
    CHECK(sched_submit(g.s, &p, &rb) == SCHED_OK);
    sched_output fin = { 0 };
    schedtest_drain(rb, NULL, 0, &fin);
    CHECK(fin.finish == SCHED_FINISH_ERROR);
    sched_release(rb);
    rig_free(&g);
}

TEST(test_prefix_cache_hits)
{
    rig g = rig_new(16, 4, 16, 48);
    int32_t prompt[300];
    prompt_of(prompt, 300, 21);
    sched_params p = greedy(prompt, 300, 5);
    sched_req *r;
    sched_output fin = { 0 };
    int32_t a[5], b[5];
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    schedtest_drain(r, a, 5, &fin);
    CHECK(fin.usage.cached_tokens == 0);
    sched_release(r);
    prompt[299] = (prompt[299] + 1) % 100;  /* same first 299, different last token */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    schedtest_drain(r, b, 5, &fin);
    /* two full blocks attached, and the 43 rows after them that the first request kept */
    CHECK(fin.usage.cached_tokens == 299 && fin.usage.prompt_tokens == 300);
    sched_release(r);
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECK(st.n_cached_tokens == 299 && st.n_prompt_tokens == 600);
    rig_free(&g);
}

/* An agent's next turn: the previous prompt (not on a block boundary), the tokens it
 * generated replaced by others, then new ones. The rows of the block where the previous
 * prompt ended outlive its request, whether that block stayed partial (a prompt of 300) or
 * the generated tokens filled it (250 + 10): the next turn copies those of its prompt instead
 * of computing them (cached: every prompt token of the first turn), computes only the rest
 * (counted in engine tokens), and answers as it does alone. With fewer than a few rows in
 * common (a different token right after the blocks) nothing is copied. */
TEST(test_prefix_tail_rows_reused)
{
    enum { P2 = 340, GEN = 10 };
    const int p1s[2] = { 300, 250 };
    for (int c = 0; c < 2; c++) {
        int P1 = p1s[c];
        rig g = rig_new(16, 4, 16, 48);
        static int32_t turn1[P2], turn2[P2];
        prompt_of(turn1, P1, 23);
        int32_t a[GEN], want[GEN], got[GEN];
        sched_params p = greedy(turn1, P1, GEN);
        sched_req *r;
        sched_output fin = { 0 };
        CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
        CHECK(schedtest_drain(r, a, GEN, &fin) == GEN);
        CHECK(fin.usage.cached_tokens == 0);
        sched_release(r);
        memcpy(turn2, turn1, (size_t)P1 * sizeof *turn1);
        prompt_of(turn2 + P1, P2 - P1, 24);
        turn2[P1] = (a[0] + 1) % 100;   /* not the generated token: its row is not the turn's */
        CHECK(solo(turn2, P2, GEN, want, GEN) == GEN);
        sched_stats st;
        sched_get_stats(g.s, &st);
        uint64_t before = st.n_prefill_tokens;
        p = greedy(turn2, P2, GEN);
        CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
        CHECK(schedtest_drain(r, got, GEN, &fin) == GEN);
        CHECKF(fin.usage.cached_tokens == P1, "first turn %d: cached %d", P1, fin.usage.cached_tokens);
        sched_release(r);
        sched_get_stats(g.s, &st);
        CHECK(st.n_tail_tokens == (uint64_t)(P1 % KVPOOL_BLOCK));   /* the rows below the boundary */
        /* the prompt but its cached part and the token sampled with the last */
        CHECKF(st.n_prefill_tokens - before == (uint64_t)(P2 - P1 - 1), "first turn %d: computed %llu", P1,
               (unsigned long long)(st.n_prefill_tokens - before));
        CHECK(!memcmp(got, want, sizeof want));
        /* the first block, then a token of its own: only the block is reused */
        turn2[128] = (turn2[128] + 1) % 100;
        p = greedy(turn2, P2, 1);
        CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
        schedtest_drain(r, NULL, 0, &fin);
        CHECKF(fin.usage.cached_tokens == 128, "first turn %d: cached %d", P1, fin.usage.cached_tokens);
        sched_release(r);
        CHECK(wait_blocks_used(g.s, 0));
        rig_free(&g);
    }
}

/* A waiting request pins the tail it will copy, but never at a running request's expense: a
 * lone request that needs the whole pool (8 blocks) gets the pinned tail's block too, instead
 * of being refused as too large, and the waiting one runs after it. */
TEST(test_tail_pin_yields_to_running)
{
    rig g = rig_new(8, 1, 16, 48);
    static int32_t first[300], next[340], blocker[10];
    prompt_of(first, 300, 25);
    memcpy(next, first, sizeof first);
    prompt_of(next + 300, 40, 26);
    prompt_of(blocker, 10, 27);
    sched_req *r, *b, *c;
    sched_params p = greedy(first, 300, 5);   /* leaves 2 full blocks and a tail */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    schedtest_drain(r, NULL, 0, NULL);
    sched_release(r);
    p = greedy(blocker, 10, 1024 - 10);       /* grows into all 8 blocks */
    CHECK(sched_submit(g.s, &p, &b) == SCHED_OK);
    sched_output out[1];
    CHECK(sched_poll(b, out, 1, 30000) == 1);  /* running: the next one waits for the slot */
    p = greedy(next, 340, 1);
    CHECK(sched_submit(g.s, &p, &c) == SCHED_OK);
    sched_output fin = { 0 };
    CHECK(schedtest_drain(b, NULL, 0, &fin) == 1024 - 10 - 1);
    CHECKF(fin.finish == SCHED_FINISH_LENGTH, "the long request ended %s", sched_finish_name(fin.finish));
    schedtest_drain(c, NULL, 0, &fin);
    CHECK(fin.finish == SCHED_FINISH_LENGTH);
    sched_release(b);
    sched_release(c);
    CHECK(wait_blocks_used(g.s, 0));
    rig_free(&g);
}

TEST(test_stop_ids_logprobs_seed)
{
    rig g = rig_new(16, 4, 16, 48);
    int32_t prompt[10];
    prompt_of(prompt, 10, 2);
    int32_t ref[20];
    sched_params p = greedy(prompt, 10, 20);
    sched_req *r;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, ref, 20, NULL) == 20);
    sched_release(r);
    /* the 5th greedy token as a stop id: 5 tokens, the last flagged, finish STOP */
    p.stop_ids[0] = ref[4];
    p.n_stop_ids = 1;
    p.logprobs = true;
    p.top_logprobs = 3;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    sched_output out[32];
    int n = 0, k;
    while ((k = sched_poll(r, out + n, 32 - n, 30000)) > 0) n += k;
    int first_stop = 0;
    while (ref[first_stop] != ref[4]) first_stop++;
    CHECK(n == first_stop + 2);
    CHECK(out[n - 1].kind == SCHED_OUT_FINISH && out[n - 1].finish == SCHED_FINISH_STOP);
    CHECK(out[n - 2].is_stop && out[n - 2].token == ref[4]);
    CHECK(out[n - 1].usage.completion_tokens == first_stop + 1);
    for (int i = 0; i < n - 1; i++) {
        CHECK(out[i].n_top == 3);
        CHECK(out[i].top[0].token == out[i].token);          /* greedy: the top one */
        CHECK(fabsf(out[i].top[0].logprob - out[i].logprob) < 1e-6f);
        CHECK(out[i].top[0].logprob >= out[i].top[1].logprob && out[i].top[1].logprob >= out[i].top[2].logprob);
        CHECK(out[i].logprob <= 0);
    }
    sched_release(r);
    /* seeded sampling: same seed, same tokens; batched together */
    sched_params q = greedy(prompt, 10, 20);
    q.sample.temp = 1.0f;
    q.sample.top_k = 0;
    q.sample.top_p = 1;
    q.sample.min_p = 0;
    q.sample.seed = 1234;
    sched_req *r1, *r2, *r3;
    int32_t t1[20], t2[20], t3[20];
    CHECK(sched_submit(g.s, &q, &r1) == SCHED_OK);
    CHECK(sched_submit(g.s, &q, &r2) == SCHED_OK);
    q.sample.seed = 99;
    CHECK(sched_submit(g.s, &q, &r3) == SCHED_OK);
    CHECK(schedtest_drain(r1, t1, 20, NULL) == 20 && schedtest_drain(r2, t2, 20, NULL) == 20 &&
          schedtest_drain(r3, t3, 20, NULL) == 20);
    CHECK(!memcmp(t1, t2, sizeof t1));
    CHECK(memcmp(t1, t3, sizeof t1) != 0);
    sched_release(r1);
    sched_release(r2);
    sched_release(r3);
    rig_free(&g);
}

/* The reasoning budget: after think_budget tokens inside a think block the next token is the
 * think-end id, not the sampled one; before it, and without a budget, nothing changes. */
TEST(test_think_budget)
{
    rig g = rig_new(16, 4, 16, 48);
    int32_t prompt[10];
    prompt_of(prompt, 10, 3);
    int32_t ref[24], got[24];
    sched_params p = greedy(prompt, 10, 24);
    sched_req *r;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, ref, 24, NULL) == 24);
    sched_release(r);
    /* an id the greedy run never produced stands for </think> */
    int32_t end = 0;
    for (int i = 0; i < 24; i++)
        if (ref[i] == end) end++, i = -1;  /* taken: try the next id from the start */
    /* the prompt opened the block: token 4 is forced, the 4 before are the model's */
    p.think_budget = 4;
    p.think_start = -1;
    p.think_end = end;
    p.think_open = true;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, got, 24, NULL) == 24);
    sched_release(r);
    CHECK(!memcmp(got, ref, 4 * sizeof got[0]));
    CHECKF(got[4] == end, "token 4 is %d, want %d", got[4], end);
    int n_end = 0;
    for (int i = 0; i < 24; i++) n_end += got[i] == end;
    CHECK(n_end == 1);  /* the block is closed: nothing more is forced */
    /* the model opens the block itself (its 2nd token as <think>): 3 inside, then the end */
    p.think_budget = 3;
    p.think_start = ref[1];
    p.think_open = false;
    int first = 0;
    while (ref[first] != ref[1]) first++;  /* where the "<think>" appears first */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, got, 24, NULL) == 24);
    sched_release(r);
    CHECK(!memcmp(got, ref, (size_t)(first + 4) * sizeof got[0]));
    CHECKF(got[first + 4] == end, "token %d is %d, want %d", first + 4, got[first + 4], end);
    /* no budget: the same as without */
    p.think_budget = 0;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, got, 24, NULL) == 24 && !memcmp(got, ref, sizeof ref));
    sched_release(r);
    /* a think-end id outside the vocabulary is refused */
    p.think_budget = 2;
    p.think_end = 1 << 30;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_ERR_ARG);
    rig_free(&g);
}

/* A long prompt arrives while a sequence decodes: with the default budget (max_seqs + 64) the
 * prompt is read in chunks of what the decode leaves of it, one chunk per step, and the decode
 * gets its token in every one of those steps (decodes are planned first), so its wait for a
 * token is one budget-sized step, never the whole prompt. Counted in steps, not seconds. A
 * decodes until it is cancelled after B's answer; should it have reached its length first
 * (this thread was not scheduled for its ~1000 steps), the round proves nothing and is rerun. */
static int chunked_round(int *mixed, int *max_tok, int *budget, int spec_room)
{
    enum { MAXS = 4, PA = 10, GA = 1000, PB = 900 };
    /* engine max batch 128 > the default budget (68, or with the room for verify rows 68 + 16) */
    sched_opts so = { .max_seqs = MAXS, .max_queue = 16 };
    if (spec_room) {   /* A speculates by prompt lookup (its prompt repeats itself) */
        so.spec_sources = SPEC_SRC_NGRAM;
        so.spec_max = 4;
        so.spec_room = spec_room;
        so.step_tokens = sched_default_step_tokens(MAXS) + spec_room;
    }
    rig g = rig_open(18, so, NULL);
    sched_stats st;
    sched_get_stats(g.s, &st);
    *budget = st.step_tokens;
    int32_t pa[PA], pb[PB];
    prompt_of(pa, PA, 5);
    prompt_of(pb, PB, 6);
    sched_params p = greedy(pa, PA, GA);
    sched_req *a, *b;
    int rc = -1;
    if (sched_submit(g.s, &p, &a) != SCHED_OK) goto out;
    sched_output out[16];
    if (sched_poll(a, out, 16, 30000) <= 0) goto out_a;   /* A decodes before B arrives */
    p = greedy(pb, PB, 1);
    if (sched_submit(g.s, &p, &b) != SCHED_OK) goto out_a;
    int32_t tb[1];
    rc = schedtest_drain(b, tb, 1, NULL) == 1 ? 0 : -1;
    sched_cancel(a);
    sched_output fin = { 0 };
    int32_t ta[16];
    schedtest_drain(a, ta, 16, &fin);
    if (rc == 0 && fin.finish != SCHED_FINISH_CANCELLED) rc = 1;   /* A ended first: rerun */
    sched_get_stats(g.s, &st);
    *mixed = (int)st.n_mixed_steps;
    *max_tok = st.max_step_tokens;
    sched_release(b);
out_a:
    sched_release(a);
out:
    rig_free(&g);
    return rc;
}

TEST(test_long_prompt_chunked_beside_decode)
{
    enum { MAXS = 4, PB = 900 };
    CHECK(sched_default_step_tokens(MAXS) == MAXS + SCHED_PREFILL_CHUNK);
    CHECK(sched_default_step_tokens(0) == 16 + SCHED_PREFILL_CHUNK);
    int mixed = 0, max_tok = 0, budget = 0, rc = 1;
    for (int round = 0; round < 3 && rc == 1; round++) rc = chunked_round(&mixed, &max_tok, &budget, 0);
    CHECK(rc == 0);
    CHECK(budget == sched_default_step_tokens(MAXS));
    /* every step of B's prompt carried A's decode and a chunk of budget - 1 tokens */
    int chunks = (PB + budget - 2) / (budget - 1);
    CHECKF(mixed == chunks, "%d steps with decode + prefill chunk, want %d", mixed, chunks);
    CHECK(max_tok == budget);
    /* with speculation the budget has room for verify rows: B's prompt is still read in chunks
     * of the budget without it, the room left to A's drafts */
    int room = MAXS * 4;
    rc = 1;
    for (int round = 0; round < 3 && rc == 1; round++) rc = chunked_round(&mixed, &max_tok, &budget, room);
    CHECK(rc == 0);
    CHECK(budget == sched_default_step_tokens(MAXS) + room);
    CHECKF(mixed == chunks, "speculating: %d steps with decode + prefill chunk, want %d", mixed, chunks);
    CHECKF(max_tok <= budget, "%d tokens in a step, budget %d", max_tok, budget);
}

/* A prompt read with no decode running goes in steps of the prefill budget (capped at the
 * engine's max batch, 128 here), not of the decode-sharing budget (48): 300 tokens in 3 steps,
 * the first two full. Then its first token, alone. Counted in steps. */
TEST(test_prefill_alone_uses_prefill_budget)
{
    enum { P = 300 };
    rig g = rig_new(16, 4, 16, 48);
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECK(st.step_tokens == 48);
    CHECK(st.prefill_step_tokens == 128);
    int32_t pr[P], out[4];
    prompt_of(pr, P, 9);
    sched_params p = greedy(pr, P, 2);
    sched_req *r;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, out, 4, NULL) == 2);
    sched_release(r);
    sched_get_stats(g.s, &st);
    CHECKF(st.n_steps == 3 + 1, "%d steps for a %d-token prompt and one decode", (int)st.n_steps, P);
    CHECK(st.max_step_tokens == 128);
    CHECK(st.n_mixed_steps == 0);
    rig_free(&g);
}

TEST(test_errors_and_shutdown)
{
    rig g = rig_new(16, 4, 16, 48);
    int32_t prompt[1100];
    prompt_of(prompt, 1100, 1);
    sched_params p = greedy(prompt, 1024, 10);
    sched_req *r = NULL;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_ERR_TOO_LONG && !r);
    p.n_prompt = 0;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_ERR_ARG);
    p.n_prompt = 3;
    prompt[1] = 100;  /* out of vocabulary */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_ERR_ARG);
    prompt[1] = 5;
    /* context limit: 1000 prompt tokens leave 24 */
    p.n_prompt = 1000;
    p.max_tokens = 0;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    sched_output fin = { 0 };
    CHECK(schedtest_drain(r, NULL, 0, &fin) == 24);
    CHECK(fin.finish == SCHED_FINISH_LENGTH);
    sched_release(r);
    /* shutdown cancels what runs and refuses new work */
    p.n_prompt = 10;
    p.max_tokens = 1000;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    sched_shutdown(g.s);
    schedtest_drain(r, NULL, 0, &fin);
    CHECK(fin.finish == SCHED_FINISH_CANCELLED);
    sched_release(r);
    CHECK(sched_submit(g.s, &p, &r) == SCHED_ERR_STOPPED);
    rig_free(&g);
}

/* Draining: new submissions are refused, /health can tell, and what was accepted goes on:
 * the running request and the one queued behind it (max_seqs 1) both end normally with all
 * their tokens. Then sched_abort: a request still running ends ABORTED after the tokens it
 * produced (it was producing tokens after the drain began), one the caller cancelled first
 * stays CANCELLED, and nothing is left (sched_wait_idle 0, KV blocks free). */
TEST(test_drain_then_abort)
{
    enum { GEN = 12 };
    rig g = rig_new(16, 1, 16, 48);
    int32_t pa[20], pb[20], out[GEN + 1];
    prompt_of(pa, 20, 11);
    prompt_of(pb, 20, 12);
    sched_params p = greedy(pa, 20, GEN);
    sched_req *a, *b, *c = NULL;
    CHECK(sched_submit(g.s, &p, &a) == SCHED_OK);
    p.prompt = pb;
    CHECK(sched_submit(g.s, &p, &b) == SCHED_OK);   /* waits: one sequence at a time */
    CHECK(!sched_draining(g.s));
    sched_drain(g.s);
    CHECK(sched_draining(g.s));
    CHECK(sched_submit(g.s, &p, &c) == SCHED_ERR_STOPPED && !c);
    CHECK(sched_wait_idle(g.s, 30000) == 0);
    sched_output fin = { 0 };
    CHECK(schedtest_drain(a, out, GEN + 1, &fin) == GEN);
    CHECK(fin.finish == SCHED_FINISH_LENGTH);
    CHECK(schedtest_drain(b, out, GEN + 1, &fin) == GEN);
    CHECK(fin.finish == SCHED_FINISH_LENGTH);
    sched_release(a);
    sched_release(b);
    rig_free(&g);

    g = rig_new(16, 4, 16, 48);
    p = greedy(pa, 20, 1000);   /* long enough to be running when the abort comes */
    CHECK(sched_submit(g.s, &p, &a) == SCHED_OK);
    CHECK(sched_submit(g.s, &p, &b) == SCHED_OK);
    sched_drain(g.s);
    CHECK(sched_wait_idle(g.s, 0) == 2);
    sched_output o[4];
    int got = 0;
    for (int k = 0; k < 100 && got < 3; k++) {   /* tokens keep coming while draining */
        int n = sched_poll(a, o, 1, 30000);
        if (n == 0) break;
        got += o[0].kind == SCHED_OUT_TOKEN;
    }
    CHECK(got == 3);
    sched_cancel(b);
    sched_abort(g.s);
    CHECK(sched_wait_idle(g.s, 30000) == 0);
    int n_a = schedtest_drain(a, NULL, 0, &fin);
    CHECK(fin.kind == SCHED_OUT_FINISH && fin.finish == SCHED_FINISH_ABORTED);
    CHECK(fin.usage.completion_tokens == got + n_a && fin.usage.completion_tokens < 1000);
    schedtest_drain(b, NULL, 0, &fin);
    CHECK(fin.finish == SCHED_FINISH_CANCELLED);
    CHECK(!strcmp(sched_finish_name(SCHED_FINISH_ABORTED), "aborted"));
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECK(st.n_finished[SCHED_FINISH_ABORTED] == 1 && st.n_finished[SCHED_FINISH_CANCELLED] == 1);
    CHECK(wait_blocks_used(g.s, 0));
    CHECK(sched_submit(g.s, &p, &c) == SCHED_ERR_STOPPED);
    sched_release(a);
    sched_release(b);
    rig_free(&g);
}


/* ---- prefixes shared in flight ---- */

enum { SP_N = 5, SP_PREFIX = 1000, SP_LEN = 1020, SP_GEN = 3, SP_SHARED = 896 /* 7 full blocks */ };

/* SP_N prompts: the same SP_PREFIX tokens, then SP_LEN - SP_PREFIX of their own. */
static void share_prompts(int32_t p[SP_N][SP_LEN])
{
    for (int i = 0; i < SP_N; i++) {
        prompt_of(p[i], SP_PREFIX, 40);
        prompt_of(p[i] + SP_PREFIX, SP_LEN - SP_PREFIX, 50 + i);
    }
}

typedef struct {
    int step_tokens;   /* 48 (chunks across block boundaries), or 0: the default budget */
    bool store;        /* with a block store tier */
    bool staggered;    /* each request arrives once the engine has made progress since the last */
    bool reversed;     /* requests arrive in the opposite order */
} share_case;

typedef struct {
    uint64_t prefill;            /* tokens computed as prefill */
    uint64_t shared;             /* tokens attached from prefixes in flight */
    int cached;                  /* cached_tokens summed over the requests' usage */
    int32_t toks[SP_N][SP_GEN];  /* greedy outputs */
} share_run;

/* Runs the SP_N requests one at a time (serial) or as the case says, on a fresh scheduler
 * (4 running at once, so the fifth waits for a slot). */
static void share_run_case(const share_case *c, bool serial, int run_no, share_run *out)
{
    static int32_t prompts[SP_N][SP_LEN];
    share_prompts(prompts);
    char store_name[32];
    snprintf(store_name, sizeof store_name, "share-%d", run_no);
    sched_opts so = { .max_seqs = 4, .max_queue = 16, .step_tokens = c->step_tokens };
    rig g = rig_open(64, so, c->store ? store_name : NULL);
    memset(out, 0, sizeof *out);
    sched_req *r[SP_N] = { 0 };
    for (int k = 0; k < SP_N; k++) {
        int i = c->reversed ? SP_N - 1 - k : k;
        sched_params p = greedy(prompts[i], SP_LEN, SP_GEN);
        sched_stats st;
        sched_get_stats(g.s, &st);
        uint64_t before = st.n_prefill_tokens;
        CHECK(sched_submit(g.s, &p, &r[i]) == SCHED_OK);
        sched_output fin = { 0 };
        if (serial) {
            CHECK(schedtest_drain(r[i], out->toks[i], SP_GEN, &fin) == SP_GEN);
            out->cached += fin.usage.cached_tokens;
        } else if (c->staggered) {   /* the next one arrives in the middle of this one's work */
            WAIT_UNTIL((sched_get_stats(g.s, &st), st.n_prefill_tokens > before ||
                        st.n_finished[SCHED_FINISH_LENGTH] == (uint64_t)k + 1), 30);
        }
    }
    for (int i = 0; i < SP_N && !serial; i++) {
        sched_output fin = { 0 };
        CHECK(schedtest_drain(r[i], out->toks[i], SP_GEN, &fin) == SP_GEN);
        CHECK(fin.finish == SCHED_FINISH_LENGTH);
        out->cached += fin.usage.cached_tokens;
    }
    for (int i = 0; i < SP_N; i++) sched_release(r[i]);
    sched_stats st;
    sched_get_stats(g.s, &st);
    out->prefill = st.n_prefill_tokens;
    out->shared = st.n_shared_tokens;
    CHECK(st.n_cached_tokens == (uint64_t)out->cached);
    CHECK(wait_blocks_used(g.s, 0));
    rig_free(&g);
}

/* SP_N requests with a shared SP_PREFIX-token prefix, together: its full blocks are computed
 * once, the others attach them as they complete and report them as cached, and every greedy
 * output is the one of the serial run. Whatever the arrival order, chunk size, and with the
 * block store on and off. Counted in engine tokens. The rows of the prefix's last, partial
 * block (104) are computed once too: copied from a running request that holds them, or, one
 * at a time, from the tail the previous request kept; so the serial run caches the whole
 * prefix, and a concurrent request that computed them itself (it found no one ahead of it
 * holding them) computed 104 tokens more than serially. */
TEST(test_shared_prefix_computed_once)
{
    const share_case cases[] = {
        { .step_tokens = 48 },
        { .step_tokens = 0 },
        { .step_tokens = 48, .reversed = true },
        { .step_tokens = 48, .staggered = true },
        { .step_tokens = 0, .staggered = true, .reversed = true },
        { .step_tokens = 48, .store = true },
        { .step_tokens = 0, .store = true, .staggered = true },
    };
    int run_no = 0;
    uint64_t shared_together = 0;   /* attached in flight, over the cases that submit at once */
    int rows_together = 0;          /* of those, rows copied below a block boundary */
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const share_case *c = &cases[ci];
        share_run ser, con;
        share_run_case(c, true, run_no++, &ser);
        share_run_case(c, false, run_no++, &con);
        CHECKF(ser.cached == (SP_N - 1) * SP_PREFIX, "case %zu: serial cached %d", ci, ser.cached);
        int rows = ser.cached - con.cached;   /* partial-block rows computed again together */
        CHECKF(rows >= 0 && rows % (SP_PREFIX - SP_SHARED) == 0 && rows <= (SP_N - 1) * (SP_PREFIX - SP_SHARED),
               "case %zu: %d cached tokens together, %d one at a time", ci, con.cached, ser.cached);
        CHECKF(con.prefill == ser.prefill + (uint64_t)rows, "case %zu: %llu prefill tokens together (%d rows "
               "computed again), %llu one at a time", ci, (unsigned long long)con.prefill, rows,
               (unsigned long long)ser.prefill);
        CHECKF(!memcmp(con.toks, ser.toks, sizeof con.toks), "case %zu: outputs differ from the serial run", ci);
        if (!c->staggered) {
            shared_together += con.shared;
            rows_together += con.shared % KVPOOL_BLOCK != 0;   /* rows copied from a running one */
        }
    }
    /* Whether a given run attaches in flight or from the finished prefix depends on when the
     * engine thread admits the others (a loaded machine may finish the prefix first); over
     * the four runs that submit at once, some of it is attached in flight. */
    CHECKF(shared_together > 0, "nothing attached in flight in any run that submits at once");
    CHECKF(rows_together > 0, "no rows of the prefix's partial block shared in any run that submits at once");
}

/* The request computing a shared prefix is cancelled while another waits on it: the waiting
 * one attaches every block completed before the cancel, computes the rest itself (no block is
 * computed twice), and its greedy output is the one it has alone. Small steps give the cancel
 * time to land inside the prefix; a round where A's prefix ended first proves less (the
 * follower attached everything) and is rerun, a few times at most. */
TEST(test_shared_prefix_leader_cancelled)
{
    static int32_t prompts[SP_N][SP_LEN];
    share_prompts(prompts);
    int32_t want[SP_GEN], got[SP_GEN];
    CHECK(solo(prompts[1], SP_LEN, SP_GEN, want, SP_GEN) == SP_GEN);
    bool mid = false;
    for (int round = 0; round < 8 && !mid; round++) {
        sched_opts so = { .max_seqs = 2, .max_queue = 4, .step_tokens = 16, .prefill_step_tokens = 16 };
        rig g = rig_open(32, so, NULL);
        sched_params pa = greedy(prompts[0], SP_LEN, 500), pb = greedy(prompts[1], SP_LEN, SP_GEN);
        sched_req *a, *b;
        CHECK(sched_submit(g.s, &pa, &a) == SCHED_OK);
        CHECK(sched_submit(g.s, &pb, &b) == SCHED_OK);
        sched_stats st;
        WAIT_UNTIL((sched_get_stats(g.s, &st), st.n_prefill_tokens >= 300), 30);
        sched_cancel(a);
        sched_output fa = { 0 }, fb = { 0 };
        schedtest_drain(a, NULL, 0, &fa);
        if (fa.finish != SCHED_FINISH_CANCELLED) {
            /* A ran to its end before the cancel landed (the test thread was descheduled on a
             * loaded machine): the round proves nothing; B still answers as alone */
            CHECK(fa.finish == SCHED_FINISH_LENGTH);
            CHECK(schedtest_drain(b, got, SP_GEN, &fb) == SP_GEN && !memcmp(got, want, sizeof want));
            sched_release(a);
            sched_release(b);
            CHECK(wait_blocks_used(g.s, 0));
            rig_free(&g);
            continue;
        }
        CHECK(schedtest_drain(b, got, SP_GEN, &fb) == SP_GEN);
        CHECK(fb.finish == SCHED_FINISH_LENGTH);
        CHECK(!memcmp(got, want, sizeof want));
        sched_get_stats(g.s, &st);
        /* B computed its prompt but the cached part and the token sampled with the last */
        int b_computed = SP_LEN - fb.usage.cached_tokens - 1;
        int a_computed = (int)st.n_prefill_tokens - b_computed;
        int a_blocks = TM_MIN(a_computed, SP_SHARED) / KVPOOL_BLOCK * KVPOOL_BLOCK;
        /* B also copies the rows A computed in its partial last block (from A running, or from
         * the tail A's cancel kept), when there are enough of them to be worth it */
        bool rows = fb.usage.cached_tokens == TM_MIN(a_computed, SP_PREFIX);
        CHECKF(fb.usage.cached_tokens == a_blocks || rows, "A computed %d tokens, B attached %d", a_computed,
               fb.usage.cached_tokens);
        mid = fa.usage.completion_tokens == 0 && a_computed < SP_SHARED;
        sched_release(a);
        sched_release(b);
        CHECK(wait_blocks_used(g.s, 0));
        rig_free(&g);
    }
    CHECKF(mid, "the cancel never landed inside the prefix");
}

/* ---- admission by cache ---- */

static int g_admitted[32];   /* request numbers in the order the engine admitted them */
static int g_n_admitted;

static int record_admission(void *arg, kvpool *pool, kvpool_seq *seq, int n_attached)
{
    if (g_n_admitted < 32) g_admitted[g_n_admitted++] = (int)(intptr_t)arg;
    return n_attached;
}

/* One slot, held by a long decode while a cold request (0) and then NF requests whose prompt
 * starts with a cached prefix (1..NF) queue up: the cached ones go first, in arrival order,
 * until the cold one was overtaken SCHED_ADMIT_MAX_PASSED times; then it goes. Recorded by
 * the order of admission, not by time. */
TEST(test_admission_prefers_cache_within_age_bound)
{
    enum { NF = SCHED_ADMIT_MAX_PASSED + 4, P = 300 };
    sched_opts so = { .max_seqs = 1, .max_queue = 32, .step_tokens = 48 };
    rig g = rig_open(64, so, NULL);
    static int32_t warm[P], cold[P], fr[NF + 1][P], blocker[10];
    prompt_of(warm, P, 60);
    prompt_of(cold, P, 61);
    prompt_of(blocker, 10, 62);
    sched_req *r;
    sched_params p = greedy(warm, P, 1);
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);   /* warm: the first 256 tokens get cached */
    schedtest_drain(r, NULL, 0, NULL);
    sched_release(r);
    sched_req *d, *q[NF + 1];
    p = greedy(blocker, 10, 0);
    CHECK(sched_submit(g.s, &p, &d) == SCHED_OK);
    sched_output out[1];
    CHECK(sched_poll(d, out, 1, 30000) == 1);   /* it holds the only slot */
    g_n_admitted = 0;
    for (int i = 0; i <= NF; i++) {
        if (i > 0) {
            memcpy(fr[i], warm, 256 * sizeof warm[0]);
            prompt_of(fr[i] + 256, P - 256, 70 + i);
        }
        p = greedy(i ? fr[i] : cold, P, 1);
        p.kv_in = record_admission;
        p.kv_arg = (void *)(intptr_t)i;
        CHECK(sched_submit(g.s, &p, &q[i]) == SCHED_OK);
    }
    sched_cancel(d);
    for (int i = 0; i <= NF; i++) {
        sched_output fin = { 0 };
        schedtest_drain(q[i], NULL, 0, &fin);
        CHECK(fin.finish == SCHED_FINISH_LENGTH);
        CHECK(fin.usage.cached_tokens == (i ? 256 : 0));
        sched_release(q[i]);
    }
    schedtest_drain(d, NULL, 0, NULL);
    sched_release(d);
    CHECK(g_n_admitted == NF + 1);
    int want[NF + 1], k = 0;
    for (int i = 1; i <= SCHED_ADMIT_MAX_PASSED; i++) want[k++] = i;
    want[k++] = 0;
    for (int i = SCHED_ADMIT_MAX_PASSED + 1; i <= NF; i++) want[k++] = i;
    for (int i = 0; i <= NF; i++)
        CHECKF(g_admitted[i] == want[i], "admission %d: request %d, want %d", i, g_admitted[i], want[i]);
    rig_free(&g);
}

/* Two requests wait for the only slot, held by a decode: an older one whose prompt is a short
 * cached prefix and little to compute, and a newer one with a longer cached prefix but more to
 * compute (an agent's next turn beside another agent's earlier one). The one with the fewest
 * blocks left to compute goes first, so later turns do not overtake earlier ones. Recorded by
 * the order of admission. */
TEST(test_admission_fewest_blocks_to_compute_first)
{
    enum { PX = 300, PY = 700 };
    sched_opts so = { .max_seqs = 1, .max_queue = 8, .step_tokens = 48 };
    rig g = rig_open(64, so, NULL);
    static int32_t px[PX], py[PY], blocker[10];
    prompt_of(px, PX, 63);
    prompt_of(py, PY, 64);
    prompt_of(blocker, 10, 65);
    sched_req *r, *d, *q[2];
    sched_params p = greedy(px, 256 + 1, 1);   /* X's first 2 blocks cached */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    schedtest_drain(r, NULL, 0, NULL);
    sched_release(r);
    p = greedy(py, 512 + 1, 1);                /* Y's first 4 blocks cached */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    schedtest_drain(r, NULL, 0, NULL);
    sched_release(r);
    p = greedy(blocker, 10, 0);
    CHECK(sched_submit(g.s, &p, &d) == SCHED_OK);
    sched_output out[1];
    CHECK(sched_poll(d, out, 1, 30000) == 1);   /* it holds the only slot */
    g_n_admitted = 0;
    for (int i = 0; i < 2; i++) {   /* X: 1 block left to compute; Y, newer: 2 */
        p = greedy(i ? py : px, i ? PY : PX, 1);
        p.kv_in = record_admission;
        p.kv_arg = (void *)(intptr_t)i;
        CHECK(sched_submit(g.s, &p, &q[i]) == SCHED_OK);
    }
    sched_cancel(d);
    for (int i = 0; i < 2; i++) {
        sched_output fin = { 0 };
        schedtest_drain(q[i], NULL, 0, &fin);
        CHECK(fin.usage.cached_tokens == (i ? 512 : 256));
        sched_release(q[i]);
    }
    schedtest_drain(d, NULL, 0, NULL);
    sched_release(d);
    CHECK(g_n_admitted == 2);
    CHECKF(g_admitted[0] == 0 && g_admitted[1] == 1, "admitted %d then %d, want 0 then 1", g_admitted[0],
           g_admitted[1]);
    rig_free(&g);
}

/* Holds the decode that keeps the only slot at its last token until the block store has read
 * `want` blocks (or 10 s passed): the waiting requests' loads are settled before admission. */
typedef struct {
    blockio *bio;
    int n_out;       /* outputs queued so far */
    int last;        /* the output to hold at */
    uint64_t want;   /* blocks read from the store */
} hold_arg;

static void hold_at_last(void *arg)
{
    hold_arg *h = arg;
    if (++h->n_out != h->last) return;
    blockio_stats bs;
    WAIT_UNTIL((blockio_get_stats(h->bio, &bs), bs.n_load_blocks >= h->want), 10);
}

/* A waiting request whose prefix the RAM tier reclaims while it waits (a decode grows into
 * those blocks) loads it back from the block store, and admission counts the loaded blocks as
 * reusable: it goes before a newer request with as little to compute, instead of being passed
 * over as if it had to compute its whole prompt. Recorded by the order of admission. */
TEST(test_admission_counts_blocks_reloaded_from_store)
{
    enum { PX = 512 + 44, PY = 256 + 44, GD = 950 };
    sched_opts so = { .max_seqs = 1, .max_queue = 8, .step_tokens = 48 };
    rig g = rig_open(10, so, "reload");   /* 10 blocks: A's 4 + B's 2 cached, 4 free */
    CHECK(g.bio != NULL);
    static int32_t px[PX], py[PY], blocker[10];
    prompt_of(px, PX, 66);
    prompt_of(py, PY, 67);
    prompt_of(blocker, 10, 68);
    sched_req *r, *d, *q[2];
    sched_params p = greedy(px, PX, 1);   /* A: X's 4 full blocks, into RAM and the store */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    schedtest_drain(r, NULL, 0, NULL);
    sched_release(r);
    blockio_stats bs;
    CHECK(WAIT_UNTIL((blockio_get_stats(g.bio, &bs), bs.n_written >= 4), 30));
    p = greedy(py, PY, 1);                /* B: Y's 2 full blocks, released after A's */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    schedtest_drain(r, NULL, 0, NULL);
    sched_release(r);
    /* D grows to 8 blocks: the 4 free ones, then A's (least recently released) */
    hold_arg h = { .bio = g.bio, .last = GD, .want = 4 };
    p = greedy(blocker, 10, GD);
    p.on_output = hold_at_last;
    p.out_arg = &h;
    CHECK(sched_submit(g.s, &p, &d) == SCHED_OK);
    sched_output out[1];
    CHECK(sched_poll(d, out, 1, 30000) == 1);   /* it holds the only slot */
    g_n_admitted = 0;
    for (int i = 0; i < 2; i++) {   /* each has one block to compute; X is older */
        p = greedy(i ? py : px, i ? PY : PX, 1);
        p.kv_in = record_admission;
        p.kv_arg = (void *)(intptr_t)i;
        CHECK(sched_submit(g.s, &p, &q[i]) == SCHED_OK);
    }
    sched_output fin = { 0 };
    schedtest_drain(d, NULL, 0, &fin);
    CHECK(fin.finish == SCHED_FINISH_LENGTH);
    sched_release(d);
    for (int i = 0; i < 2; i++) {
        schedtest_drain(q[i], NULL, 0, &fin);
        CHECK(fin.finish == SCHED_FINISH_LENGTH);
        /* the full blocks, and the 43 rows after them the first run kept when its tail was still
         * in the pool as the request came (pinned while it waits) */
        int blocks = i ? 256 : 512;
        CHECKF(fin.usage.cached_tokens == blocks || fin.usage.cached_tokens == blocks + 43, "request %d: %d cached", i,
               fin.usage.cached_tokens);
        sched_release(q[i]);
    }
    CHECK(g_n_admitted == 2);
    CHECKF(g_admitted[0] == 0 && g_admitted[1] == 1, "admitted %d then %d, want 0 then 1", g_admitted[0],
           g_admitted[1]);
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECKF(st.store_blocks_hit >= 4, "%llu blocks from the store", (unsigned long long)st.store_blocks_hit);
    rig_free(&g);
}

/* ---- steps sized in time ---- */

/* With a time target no step can meet (1 us), once the step-time model is warm every step
 * reading a prompt alone carries the least chunk (SCHED_TIME_MIN_CHUNK), not the prefill
 * budget: the target, not the token cap, sized it. Before it is warm the caps decide. Counted
 * in steps; the model's own error is reported. */
TEST(test_step_time_target_sizes_prefill)
{
    enum { PW = 300, GW = 20, P = 600 };
    sched_opts so = { .max_seqs = 2, .max_queue = 4, .step_tokens = 48, .step_ms = 0.001 };
    rig g = rig_open(32, so, NULL);
    sched_stats st;
    sched_get_stats(g.s, &st);
    CHECK(st.step_ms == 0.001 && st.prefill_step_ms == 0.001 * SCHED_PREFILL_STEP_MS_FACTOR);
    static int32_t pw[PW], pr[P];
    prompt_of(pw, PW, 80);
    prompt_of(pr, P, 81);
    sched_req *r;
    sched_params p = greedy(pw, PW, GW);   /* warms the model: 3 capped prefill steps, 19 decodes */
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, NULL, 0, NULL) == GW);
    sched_release(r);
    sched_get_stats(g.s, &st);
    CHECK(st.n_steps == 3 + GW - 1 + 0 && st.n_steps >= STEPTIME_WARM);
    uint64_t steps0 = st.n_steps;
    p = greedy(pr, P, 1);
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    CHECK(schedtest_drain(r, NULL, 0, NULL) == 1);
    sched_release(r);
    sched_get_stats(g.s, &st);
    int want = (P + SCHED_TIME_MIN_CHUNK - 1) / SCHED_TIME_MIN_CHUNK;
    CHECKF(st.n_steps - steps0 == (uint64_t)want, "%d steps for %d tokens, want %d",
           (int)(st.n_steps - steps0), P, want);
    CHECK(st.step_model_n > 0 && st.step_model_abs_err_s > 0 && isfinite(st.step_model_rel_err));
    rig_free(&g);
}

/* One run of the overlap comparison: every request's records, in order, and the stats. */
typedef struct {
    int n[6];                        /* records of request i, FINISH included */
    sched_output out[6][640];
    sched_stats st;
} overlap_run;

/* Six requests (three run at once, so admissions follow ends): greedy with a stop id, seeded
 * sampling with log-probs, a length end, one cancelled mid-stream; with or without overlap,
 * with or without prompt-lookup drafts. */
static void overlap_run_once(bool no_overlap, bool spec, const int32_t *stop_tok, overlap_run *o)
{
    sched_opts so = { .max_seqs = 3, .max_queue = 16, .step_tokens = 48, .no_overlap = no_overlap,
                      .spec_sources = spec ? SPEC_SRC_NGRAM : 0 };
    rig g = rig_open(32, so, NULL);
    int32_t prompts[6][60];
    sched_req *r[6];
    for (int i = 0; i < 6; i++) {
        for (int j = 0; j < 60; j++) prompts[i][j] = (j % 12) * 7 % 100 + i;   /* repeats: drafts hit */
        sched_params p = greedy(prompts[i], 20 + 8 * i, i == 5 ? 600 : 30 + 5 * i);   /* 5: cancelled */
        if (i % 3 == 1) {
            p.sample.temp = 0.8f;
            p.sample.seed = 77 + i;
            p.logprobs = true;
            p.top_logprobs = 2;
        }
        if (i % 2 == 0 && stop_tok) {
            p.stop_ids[0] = stop_tok[i];
            p.n_stop_ids = 1;
        }
        CHECK(sched_submit(g.s, &p, &r[i]) == SCHED_OK);
    }
    for (int q = 0; q < 6; q++) {   /* the cancelled one first: it must still run then */
        int i = (q + 5) % 6;
        o->n[i] = 0;
        sched_output tmp[8];
        while (!sched_done(r[i]) && o->n[i] < 640) {
            int k = sched_poll(r[i], tmp, 8, 30000);
            if (k == 0) break;
            for (int j = 0; j < k && o->n[i] < 640; j++) o->out[i][o->n[i]++] = tmp[j];
            if (i == 5 && o->n[i] >= 4) sched_cancel(r[i]);   /* mid-stream */
        }
        sched_release(r[i]);
    }
    CHECK(wait_blocks_used(g.s, 0));
    sched_get_stats(g.s, &o->st);
    rig_free(&g);
}

/* The gap between steps is cut into parts that sum to it, each measured where it happens:
 * sampling and planning always, drafting with drafts, publishing on the engine thread at least once
 * (every step's outputs) without overlap. */
static void check_gap_parts(const sched_stats *st, bool spec, bool no_overlap)
{
    double sum = 0;
    for (int i = 0; i < SCHED_GAP_N; i++) {
        CHECKF(st->gap_part_s[i] >= 0, "part %s: %g s", sched_gap_part_name((sched_gap_part)i), st->gap_part_s[i]);
        sum += st->gap_part_s[i];
    }
    CHECKF(st->gap_s > 0 && fabs(sum - st->gap_s) <= 1e-9 + 1e-9 * st->gap_s, "gap %.9f s, parts %.9f s", st->gap_s, sum);
    CHECK(st->gap_part_s[SCHED_GAP_SAMPLE] > 0 && st->gap_part_s[SCHED_GAP_PLAN] > 0);
    if (spec) CHECK(st->gap_part_s[SCHED_GAP_DRAFT] > 0);
    if (no_overlap) CHECK(st->gap_part_s[SCHED_GAP_PUBLISH] > 0);
    CHECK(!strcmp(sched_gap_part_name(SCHED_GAP_COMMIT), "commit") && !strcmp(sched_gap_part_name(SCHED_GAP_LAUNCH), "launch"));
}

/* Publishing while the next step computes changes no output: tokens, log-probs, stop and
 * length ends (no token past a stop id), usage and the token counters equal those of the loop
 * that publishes before planning, with and without speculation; every FINISH comes after its
 * request's tokens. A cancel takes effect within a step either way (the exact count then may
 * differ by the steps in flight, so only its order and end are compared). */
TEST(test_overlap_same_outputs)
{
    static overlap_run a, b;
    int32_t stop_tok[6];
    overlap_run_once(true, false, NULL, &a);   /* the 7th greedy token of each becomes its stop id */
    for (int i = 0; i < 6; i++) stop_tok[i] = a.n[i] > 7 ? a.out[i][6].token : 0;
    for (int spec = 0; spec < 2; spec++) {
        overlap_run_once(true, spec, stop_tok, &a);
        overlap_run_once(false, spec, stop_tok, &b);
        check_gap_parts(&a.st, spec, true);
        check_gap_parts(&b.st, spec, false);
        for (int i = 0; i < 6; i++) {
            CHECKF(a.n[i] > 1 && b.n[i] > 1, "spec %d request %d: %d / %d records", spec, i, a.n[i], b.n[i]);
            if (a.n[i] < 2 || b.n[i] < 2) continue;
            const sched_output *fa = &a.out[i][a.n[i] - 1], *fb = &b.out[i][b.n[i] - 1];
            CHECK(fa->kind == SCHED_OUT_FINISH && fb->kind == SCHED_OUT_FINISH);
            for (int j = 0; j < a.n[i] - 1; j++) CHECK(a.out[i][j].kind == SCHED_OUT_TOKEN);
            for (int j = 0; j < b.n[i] - 1; j++) CHECK(b.out[i][j].kind == SCHED_OUT_TOKEN);
            if (i == 5) {   /* cancelled, unless this thread was away for all its 600 tokens */
                CHECKF((fa->finish == SCHED_FINISH_CANCELLED || a.n[i] == 601) &&
                       (fb->finish == SCHED_FINISH_CANCELLED || b.n[i] == 601),
                       "spec %d: %d records, finish %d without overlap; %d, finish %d with", spec, a.n[i], fa->finish,
                       b.n[i], fb->finish);
                continue;
            }
            CHECKF(a.n[i] == b.n[i], "spec %d request %d: %d records without overlap, %d with", spec, i, a.n[i], b.n[i]);
            CHECK(fa->finish == fb->finish && fa->usage.completion_tokens == fb->usage.completion_tokens);
            CHECK(fa->usage.completion_tokens == a.n[i] - 1);
            if (i % 2 == 0) CHECK(fa->finish == SCHED_FINISH_STOP && a.out[i][a.n[i] - 2].is_stop);
            for (int j = 0; j < a.n[i] - 1 && j < b.n[i] - 1; j++) {
                CHECKF(a.out[i][j].token == b.out[i][j].token, "spec %d request %d token %d", spec, i, j);
                CHECK(a.out[i][j].is_stop == b.out[i][j].is_stop);
                CHECK(a.out[i][j].n_top == b.out[i][j].n_top && a.out[i][j].logprob == b.out[i][j].logprob);
            }
        }
        CHECK(a.st.n_finished[SCHED_FINISH_STOP] == b.st.n_finished[SCHED_FINISH_STOP]);
        CHECK(a.st.n_prompt_tokens == b.st.n_prompt_tokens);
    }
}

/* The embedding kind: the pooled normed states of the prompt, computed beside generations in
 * the same steps, equal to the engine's own states pooled by hand, whatever shares the step;
 * no cached prefix reused or left behind; nothing sampled. */
static void embed_by_hand(const int32_t *prompt, int n, model_pool pool, float *out)
{
    engine_opts eo = { .n_threads = 2, .n_kv_blocks = 8, .max_batch_tokens = 128 };
    engine *e;
    char err[256];
    if (engine_new(g_model, &eo, &e, err, sizeof err) != ENGINE_OK) return;
    int dim = g_model->hp.dim;
    float *row = malloc((size_t)dim * sizeof *row);
    memset(out, 0, (size_t)dim * sizeof *out);
    kvpool_seq *q = kvpool_seq_new(engine_kvpool(e));
    engine_tok toks[100];
    for (int at = 0; at < n; at += 100) {
        int k = TM_MIN(100, n - at);
        for (int j = 0; j < k; j++) toks[j] = (engine_tok){ .token = prompt[at + j], .pos = at + j, .seq = q };
        engine_batch b = { .n_tokens = k, .toks = toks };
        if (engine_step(e, &b, NULL) != ENGINE_OK) break;
        for (int j = 0; j < k; j++) {
            engine_hidden_normed(e, j, row);
            for (int d = 0; d < dim; d++) {
                if (pool == MODEL_POOL_MEAN) out[d] += row[d];
                else if (at + j == n - 1) out[d] = row[d];
            }
        }
    }
    if (pool == MODEL_POOL_MEAN)
        for (int d = 0; d < dim; d++) out[d] /= (float)n;
    kvpool_seq_free(engine_kvpool(e), q);
    free(row);
    engine_free(e);
}

TEST(test_embedding_requests)
{
    enum { N = 300, GEN = 30 };
    const int dim = g_model->hp.dim;
    int32_t prompt[N], gp[2][40], want_gen[2][GEN], got_gen[GEN];
    prompt_of(prompt, N, 77);
    for (int i = 0; i < 2; i++) {
        prompt_of(gp[i], 40, 90 + i);
        CHECK(solo(gp[i], 40, GEN, want_gen[i], GEN) == GEN);
    }
    float *want[2] = { malloc((size_t)dim * sizeof(float)), malloc((size_t)dim * sizeof(float)) };
    embed_by_hand(prompt, N, MODEL_POOL_MEAN, want[0]);
    embed_by_hand(prompt, N, MODEL_POOL_LAST, want[1]);
    CHECK(memcmp(want[0], want[1], (size_t)dim * sizeof(float)) != 0);
    rig g = rig_new(16, 4, 16, 48);
    for (int round = 0; round < 2; round++) {   /* the second: the same prompt again */
        sched_req *rg[2], *re[2];
        for (int i = 0; i < 2; i++) {
            sched_params p = greedy(gp[i], 40, GEN);
            CHECK(sched_submit(g.s, &p, &rg[i]) == SCHED_OK);
        }
        for (int k = 0; k < 2; k++) {
            sched_params p = { .prompt = prompt, .n_prompt = N, .max_tokens = 5,
                               .embed = k ? MODEL_POOL_LAST : MODEL_POOL_MEAN };
            CHECK(sched_submit(g.s, &p, &re[k]) == SCHED_OK);
        }
        for (int k = 0; k < 2; k++) {
            sched_output fin = { 0 };
            CHECK(schedtest_drain(re[k], NULL, 0, &fin) == 0);   /* no token */
            CHECK(fin.finish == SCHED_FINISH_STOP);
            CHECK(fin.usage.prompt_tokens == N && fin.usage.completion_tokens == 0 && fin.usage.cached_tokens == 0);
            const float *v = sched_embedding(re[k]);
            CHECK(v != NULL);
            if (v) CHECKF(!memcmp(v, want[k], (size_t)dim * sizeof(float)), "pooling %d differs from the engine's states", k);
            sched_release(re[k]);
        }
        for (int i = 0; i < 2; i++) {
            CHECK(schedtest_drain(rg[i], got_gen, GEN, NULL) == GEN);
            CHECK(!memcmp(got_gen, want_gen[i], sizeof got_gen));
            CHECK(sched_embedding(rg[i]) == NULL);
            sched_release(rg[i]);
        }
    }
    /* a generation of the same prompt finds nothing the embeddings left */
    sched_params p = greedy(prompt, N, 1);
    sched_req *r;
    CHECK(sched_submit(g.s, &p, &r) == SCHED_OK);
    sched_output fin = { 0 };
    schedtest_drain(r, NULL, 0, &fin);
    CHECK(fin.usage.cached_tokens == 0);
    sched_release(r);
    sched_params bad = { .prompt = prompt, .n_prompt = N, .embed = MODEL_POOL_RANK };
    CHECK(sched_submit(g.s, &bad, &r) == SCHED_ERR_ARG);
    CHECK(wait_blocks_used(g.s, 0));
    rig_free(&g);
    free(want[0]);
    free(want[1]);
}

int main(void)
{
    g_model = schedtest_open(tmpdir, 7);
    if (!g_model) return 1;
    RUN(test_batch_equals_alone);
    RUN(test_cancel_frees_blocks);
    RUN(test_queue_full);
    RUN(test_kv_exhaustion_preempts_and_completes);
    RUN(test_prefix_cache_hits);
    RUN(test_prefix_tail_rows_reused);
    RUN(test_tail_pin_yields_to_running);
    RUN(test_stop_ids_logprobs_seed);
    RUN(test_think_budget);
    RUN(test_long_prompt_chunked_beside_decode);
    RUN(test_prefill_alone_uses_prefill_budget);
    RUN(test_errors_and_shutdown);
    RUN(test_drain_then_abort);
    RUN(test_shared_prefix_computed_once);
    RUN(test_shared_prefix_leader_cancelled);
    RUN(test_admission_prefers_cache_within_age_bound);
    RUN(test_admission_fewest_blocks_to_compute_first);
    RUN(test_admission_counts_blocks_reloaded_from_store);
    RUN(test_step_time_target_sizes_prefill);
    RUN(test_overlap_same_outputs);
    RUN(test_embedding_requests);
    schedtest_close(tmpdir, g_model);
    HARNESS_END();
}
