/*
 * test_specdraft: engine/specdraft.c, drafting with a model, on a tiny random llama file. The
 * drafts of a round are the greedy chain a plain engine computes on its own sequence (each
 * token the argmax after the one before, with its softmax probability), for one sequence and
 * for several in one round with different k_max; a prompt longer than the draft engine's
 * batch is caught up in pieces and drafted only once complete (k_max 0 catches up only);
 * n_done follows what was computed, and after the caller lowers it past rejected drafts the
 * next round drafts from the corrected context as if nothing had been drafted; a sequence
 * whose KV cannot be reserved drafts nothing and keeps its n_done. MTP drafting is checked
 * against its reference forward in test_mtp.
 */
#include "harness.h"

#include <unistd.h>

#include "engine/engine.h"
#include "engine/specdraft.h"
#include "model/model.h"
#include "tinymodel.h"

enum { V = 100, MAXB = 32 };

static char tmpdir[] = "/tmp/tm_test_specdraft_XXXXXX";
static model *g_model;

static engine *mk_engine(int blocks)
{
    engine_opts o = { .n_threads = 1, .kv_type = ENGINE_KV_F32, .n_kv_blocks = blocks, .max_batch_tokens = MAXB };
    engine *e = NULL;
    char err[256];
    if (engine_new(g_model, &o, &e, err, sizeof err) != ENGINE_OK) fprintf(stderr, "%s\n", err);
    return e;
}

static void toks_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++) t[i] = (seed * 31 + i * 17 + i * i) % V;
}

/* The greedy chain after toks[0..n): k tokens and their softmax probabilities, computed on a
 * fresh engine one plain step at a time. */
static bool reference(const int32_t *toks, int n, int k, int32_t *out, float *prob)
{
    engine *e = mk_engine(8);
    if (!e) return false;
    kvpool_seq *s = kvpool_seq_new(engine_kvpool(e));
    static float lg[V];
    engine_tok bt[MAXB];
    bool ok = kvpool_seq_reserve(engine_kvpool(e), s, n + k) == KVPOOL_OK;
    for (int i = 0; ok && i < n; i += MAXB) {
        int m = TM_MIN(MAXB, n - i);
        for (int j = 0; j < m; j++) bt[j] = (engine_tok){ toks[i + j], i + j, s, i + j == n - 1 };
        engine_batch b = { m, bt };
        ok = engine_step(e, &b, lg) == ENGINE_OK;
    }
    for (int d = 0; ok && d < k; d++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)lg[v] - lg[best]);
        out[d] = best;
        prob[d] = (float)(1 / sum);
        bt[0] = (engine_tok){ best, n + d, s, true };
        engine_batch b = { 1, bt };
        if (d + 1 < k) ok = engine_step(e, &b, lg) == ENGINE_OK;
    }
    kvpool_seq_free(engine_kvpool(e), s);
    engine_free(e);
    return ok;
}

static bool drafts_are(const specdraft_seq *q, const int32_t *want, const float *wprob, int k)
{
    bool ok = q->n_draft == k;
    for (int i = 0; ok && i < k; i++) ok = q->draft[i] == want[i] && fabsf(q->prob[i] - wprob[i]) < 1e-5f;
    if (!ok) {
        fprintf(stderr, "  drafted %d:", q->n_draft);
        for (int i = 0; i < q->n_draft; i++) fprintf(stderr, " %d (%.4f)", q->draft[i], q->prob[i]);
        fprintf(stderr, "; want %d:", k);
        for (int i = 0; i < k; i++) fprintf(stderr, " %d (%.4f)", want[i], wprob[i]);
        fprintf(stderr, "\n");
    }
    return ok;
}

TEST(test_greedy_chain)
{
    enum { N = 20, K = 4 };
    int32_t toks[N], want[K];
    float wprob[K];
    toks_of(toks, N, 1);
    CHECK(reference(toks, N, K, want, wprob));
    engine *d = mk_engine(8);
    specdraft *sd = specdraft_new(d, 2);
    CHECK(sd && !specdraft_is_mtp(sd));
    specdraft_seq q = { .seq = kvpool_seq_new(engine_kvpool(d)), .tokens = toks, .n_tokens = N, .k_max = K };
    CHECK(specdraft_run(sd, &q, 1) == K);
    CHECK(drafts_are(&q, want, wprob, K));
    /* the KV of the prompt and of the drafts fed back (not the last draft's) is in seq */
    CHECK(q.n_done == N + K - 1);
    kvpool_seq_free(engine_kvpool(d), q.seq);
    specdraft_free(sd);
    engine_free(d);
}

/* Two sequences in one round, with different k_max: each drafts what it would alone. */
TEST(test_batched_rounds)
{
    enum { N1 = 9, N2 = 20 };   /* both within one batch of 32 */
    int32_t t1[N1], t2[N2], w1[2], w2[5];
    float p1[2], p2[5];
    toks_of(t1, N1, 2);
    toks_of(t2, N2, 3);
    CHECK(reference(t1, N1, 2, w1, p1) && reference(t2, N2, 5, w2, p2));
    engine *d = mk_engine(8);
    specdraft *sd = specdraft_new(d, 2);
    kvpool *kp = engine_kvpool(d);
    specdraft_seq q[2] = {
        { .seq = kvpool_seq_new(kp), .tokens = t1, .n_tokens = N1, .k_max = 2 },
        { .seq = kvpool_seq_new(kp), .tokens = t2, .n_tokens = N2, .k_max = 5 },
    };
    CHECK(specdraft_run(sd, q, 2) == 5);
    CHECK(drafts_are(&q[0], w1, p1, 2) && drafts_are(&q[1], w2, p2, 5));
    CHECK(q[0].n_done == N1 + 1 && q[1].n_done == N2 + 4);
    kvpool_seq_free(kp, q[0].seq);
    kvpool_seq_free(kp, q[1].seq);
    specdraft_free(sd);
    engine_free(d);
}

/* A prompt of 80 tokens through a batch of 32: two rounds catch up (nothing drafted), the
 * third drafts. k_max 0 only catches up. */
TEST(test_catch_up_in_pieces)
{
    enum { N = 80, K = 3 };
    int32_t toks[N], want[K];
    float wprob[K];
    toks_of(toks, N, 4);
    CHECK(reference(toks, N, K, want, wprob));
    engine *d = mk_engine(8);
    specdraft *sd = specdraft_new(d, 1);
    kvpool *kp = engine_kvpool(d);
    specdraft_seq q = { .seq = kvpool_seq_new(kp), .tokens = toks, .n_tokens = N, .k_max = K };
    CHECK(specdraft_run(sd, &q, 1) == 1 && q.n_draft == 0 && q.n_done == 32);
    CHECK(specdraft_run(sd, &q, 1) == 1 && q.n_draft == 0 && q.n_done == 64);
    CHECK(specdraft_run(sd, &q, 1) == K && q.n_done == N + K - 1);
    CHECK(drafts_are(&q, want, wprob, K));
    specdraft_seq z = { .seq = kvpool_seq_new(kp), .tokens = toks, .n_tokens = 20, .k_max = 0 };
    CHECK(specdraft_run(sd, &z, 1) == 1 && z.n_draft == 0 && z.n_done == 20);
    /* nothing new to read: no step at all */
    CHECK(specdraft_run(sd, &z, 1) == 0 && z.n_done == 20);
    kvpool_seq_free(kp, q.seq);
    kvpool_seq_free(kp, z.seq);
    specdraft_free(sd);
    engine_free(d);
}

/* The target accepted the first draft and sampled another token in place of the second: the
 * caller lowers n_done to the final positions and the next round drafts from the corrected
 * context exactly as a fresh sequence would (the rejected draft's KV row is overwritten). */
TEST(test_after_rejection)
{
    enum { N = 15, K = 4 };
    int32_t toks[N + 2], d1[K], want[K];
    float p1[K], wprob[K];
    toks_of(toks, N, 5);
    CHECK(reference(toks, N, K, d1, p1));
    engine *d = mk_engine(8);
    specdraft *sd = specdraft_new(d, 1);
    kvpool *kp = engine_kvpool(d);
    specdraft_seq q = { .seq = kvpool_seq_new(kp), .tokens = toks, .n_tokens = N, .k_max = K };
    CHECK(specdraft_run(sd, &q, 1) == K && drafts_are(&q, d1, p1, K));
    toks[N] = d1[0];
    toks[N + 1] = (d1[1] + 1) % V;   /* not the draft */
    CHECK(reference(toks, N + 2, K, want, wprob));
    q.n_tokens = N + 2;
    q.n_done = N + 1;                 /* the prompt and the accepted draft */
    CHECK(specdraft_run(sd, &q, 1) == K);
    CHECK(drafts_are(&q, want, wprob, K));
    kvpool_seq_free(kp, q.seq);
    specdraft_free(sd);
    engine_free(d);
}

/* A draft pool of one block (128 positions) holding a 125-token context caught up with k_max
 * 0: with one new token, drafting 4 would need 129 positions, which cannot be reserved, so
 * the round drafts nothing and n_done stays; drafting 3 needs 128 and drafts what the plain
 * engine computes. */
TEST(test_no_kv_room)
{
    enum { N = 126 };
    static int32_t toks[N];
    int32_t want[3];
    float wprob[3];
    toks_of(toks, N, 6);
    CHECK(reference(toks, N, 3, want, wprob));
    engine *d = mk_engine(1);
    specdraft *sd = specdraft_new(d, 1);
    kvpool *kp = engine_kvpool(d);
    specdraft_seq q = { .seq = kvpool_seq_new(kp), .tokens = toks, .n_tokens = N - 1, .k_max = 0 };
    while (q.n_done < N - 1 && specdraft_run(sd, &q, 1) == 1) {}
    CHECK(q.n_done == N - 1);
    q.n_tokens = N;
    q.k_max = 4;
    CHECK(specdraft_run(sd, &q, 1) == 0 && q.n_draft == 0 && q.n_done == N - 1);
    q.k_max = 3;
    CHECK(specdraft_run(sd, &q, 1) == 3 && q.n_done == N + 2);
    CHECK(drafts_are(&q, want, wprob, 3));
    kvpool_seq_free(kp, q.seq);
    specdraft_free(sd);
    engine_free(d);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    tiny_cfg c = { .arch = "llama", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                   .head_dim = 16, .ffn = 96, .vocab = V, .seed = 42 };
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/llama.gguf", tmpdir);
    if (tiny_write(&c, path) || model_load(path, NULL, &g_model, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tiny model: %s\n", err);
        return 1;
    }
    RUN(test_greedy_chain);
    RUN(test_batched_rounds);
    RUN(test_catch_up_in_pieces);
    RUN(test_after_rejection);
    RUN(test_no_kv_room);
    model_free(g_model);
    unlink(path);
    rmdir(tmpdir);
    HARNESS_END();
}
