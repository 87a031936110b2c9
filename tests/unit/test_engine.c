/*
 * test_engine: the batched forward step against a plain reference forward pass (llama, qwen2
 * with biases, qwen3 with q/k norms; GQA; both RoPE forms), and its batching contracts:
 * mixed sequences in one step give the same logits as one at a time, prefix blocks attached
 * from the RAM cache give the same logits as recomputing, the thread count does not change
 * results, bad batches and a full KV pool are reported, not crashed on.
 */
#include "harness.h"

#include <unistd.h>

#include "engine/engine.h"
#include "model/model.h"
#include "tinymodel.h"

static char tmpdir[] = "/tmp/tm_test_engine_XXXXXX";

static model *mk(const char *arch, uint64_t seed)
{
    tiny_cfg c = { .arch = arch, .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                   .head_dim = 16, .ffn = 96, .vocab = 100, .seed = seed };
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, arch);
    if (tiny_write(&c, path)) return NULL;
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    return m;
}

static engine *mk_engine(model *m, int threads, bool f32, int blocks, int maxb)
{
    engine_opts o = { .n_threads = threads, .kv_type = f32 ? ENGINE_KV_F32 : ENGINE_KV_F16, .n_kv_blocks = blocks, .max_batch_tokens = maxb };
    engine *e = NULL;
    char err[256];
    if (engine_new(m, &o, &e, err, sizeof err) != ENGINE_OK) fprintf(stderr, "%s\n", err);
    return e;
}

static float maxdiff(const float *a, const float *b, int n)
{
    float d = 0;
    for (int i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static void toks_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++) t[i] = (seed * 31 + i * 17 + i * i) % 100;
}

/* prefill toks[0..n) from position p0 in chunks of `chunk`, logits of every position into
 * out ((n, V)) */
static bool prefill(engine *e, kvpool_seq *s, const int32_t *toks, int p0, int n, int chunk, float *out)
{
    engine_tok bt[512];
    for (int i = 0; i < n; i += chunk) {
        int m = TM_MIN(chunk, n - i);
        for (int k = 0; k < m; k++) bt[k] = (engine_tok){ toks[i + k], p0 + i + k, s, true };
        engine_batch b = { m, bt };
        if (engine_step(e, &b, out + (size_t)i * engine_model(e)->hp.n_vocab) != ENGINE_OK) return false;
    }
    return true;
}

TEST(test_against_reference)
{
    const char *archs[] = { "llama", "qwen2", "qwen3" };
    enum { N = 300, V = 100 };
    static float lg[N * V], ref[V];
    int32_t toks[N];
    toks_of(toks, N, 3);
    for (int a = 0; a < 3; a++) {
        model *m = mk(archs[a], 11 + a);
        if (!m) { CHECK(m); continue; }
        for (int f32 = 1; f32 >= 0; f32--) {
            engine *e = mk_engine(m, 2, f32, 4, 64);
            kvpool_seq *s = kvpool_seq_new(engine_kvpool(e));
            /* 300 tokens cross two block boundaries; chunks of 64 and a ragged tail */
            CHECK(prefill(e, s, toks, 0, N, 64, lg));
            tiny_ref r;
            tiny_ref_init(&r, m, N);
            float worst = 0;
            for (int p = 0; p < N; p++) {
                tiny_ref_forward(&r, toks[p], p, ref);
                worst = fmaxf(worst, maxdiff(ref, lg + (size_t)p * V, V));
            }
            float tol = f32 ? 1e-4f : 2.5e-2f;
            CHECKF(worst < tol, "%s kv %s: max |logit diff| %g", archs[a], f32 ? "f32" : "f16", worst);
            tiny_ref_free(&r);
            kvpool_seq_free(engine_kvpool(e), s);
            engine_free(e);
        }
        model_free(m);
    }
}

TEST(test_decode_matches_prefill)
{
    enum { N = 40, V = 100 };
    static float a[N * V], b[N * V];
    int32_t toks[N];
    toks_of(toks, N, 5);
    model *m = mk("qwen3", 7);
    engine *e = mk_engine(m, 2, false, 4, 64);
    kvpool_seq *s1 = kvpool_seq_new(engine_kvpool(e)), *s2 = kvpool_seq_new(engine_kvpool(e));
    CHECK(prefill(e, s1, toks, 0, N, N, a));   /* one step */
    CHECK(prefill(e, s2, toks, 0, N, 1, b));   /* token by token */
    /* batch invariance: the same attention arithmetic whatever the step (see
     * test_invariance.c for the full matrix) */
    CHECKF(!memcmp(a, b, sizeof a), "%g", maxdiff(a, b, N * V));
    kvpool_seq_free(engine_kvpool(e), s1);
    kvpool_seq_free(engine_kvpool(e), s2);
    engine_free(e);
    model_free(m);
}

TEST(test_mixed_batch)
{
    enum { V = 100 };
    model *m = mk("qwen2", 9);
    engine *e = mk_engine(m, 2, false, 16, 64);
    kvpool *kv = engine_kvpool(e);
    int lens[3] = { 5, 17, 9 };
    int32_t toks[3][40];
    kvpool_seq *s[3], *solo[3];
    for (int i = 0; i < 3; i++) {
        toks_of(toks[i], 40, 20 + i);
        s[i] = kvpool_seq_new(kv);
        solo[i] = kvpool_seq_new(kv);
    }
    /* step 1: all three prompts interleaved in one batch, logits for the last of each */
    engine_tok bt[64];
    int n = 0;
    for (int p = 0; p < 17; p++)
        for (int i = 0; i < 3; i++)
            if (p < lens[i]) bt[n++] = (engine_tok){ toks[i][p], p, s[i], p == lens[i] - 1 };
    static float lg[3 * V], ref[40 * V];
    engine_batch b = { n, bt };
    CHECK(engine_step(e, &b, lg) == ENGINE_OK);
    /* rows come in batch order: seq0 ends first (p=4), then seq2 (p=8), then seq1 (p=16) */
    int order[3] = { 0, 2, 1 };
    for (int r = 0; r < 3; r++) {
        int i = order[r];
        CHECK(prefill(e, solo[i], toks[i], 0, lens[i], lens[i], ref));
        CHECKF(maxdiff(lg + r * V, ref + (size_t)(lens[i] - 1) * V, V) < 1e-5f, "seq %d", i);
    }
    /* step 2: one decode token per sequence plus a prefill chunk of a fourth sequence */
    kvpool_seq *s4 = kvpool_seq_new(kv), *s4solo = kvpool_seq_new(kv);
    int32_t t4[10];
    toks_of(t4, 10, 40);
    n = 0;
    for (int i = 0; i < 3; i++) bt[n++] = (engine_tok){ 7 + i, lens[i], s[i], true };
    for (int p = 0; p < 10; p++) bt[n++] = (engine_tok){ t4[p], p, s4, p == 9 };
    static float lg2[4 * V];
    b = (engine_batch){ n, bt };
    CHECK(engine_step(e, &b, lg2) == ENGINE_OK);
    for (int i = 0; i < 3; i++) {
        engine_tok one = { 7 + i, lens[i], solo[i], true };
        engine_batch b1 = { 1, &one };
        CHECK(engine_step(e, &b1, ref) == ENGINE_OK);
        CHECKF(maxdiff(lg2 + i * V, ref, V) < 1e-5f, "decode seq %d", i);
    }
    CHECK(prefill(e, s4solo, t4, 0, 10, 10, ref));
    CHECK(maxdiff(lg2 + 3 * V, ref + 9 * V, V) < 1e-5f);
    for (int i = 0; i < 3; i++) kvpool_seq_free(kv, s[i]), kvpool_seq_free(kv, solo[i]);
    kvpool_seq_free(kv, s4);
    kvpool_seq_free(kv, s4solo);
    engine_free(e);
    model_free(m);
}

TEST(test_prefix_cache_and_threads)
{
    enum { N = 300, V = 100 };
    static float a[N * V], b[N * V], c[N * V];
    int32_t toks[N], t2[N];
    toks_of(toks, N, 8);
    memcpy(t2, toks, sizeof t2);
    for (int i = 260; i < N; i++) t2[i] = (t2[i] + 1) % 100;
    model *m = mk("llama", 4);
    engine *e = mk_engine(m, 2, true, 8, 64);
    kvpool *kv = engine_kvpool(e);
    kvpool_seq *sa = kvpool_seq_new(kv);
    CHECK(prefill(e, sa, toks, 0, N, 64, a));
    kvpool_seq_commit_full_blocks(kv, sa, toks, N);
    kvpool_seq_free(kv, sa);  /* its two full blocks stay cached */
    kvpool_seq *sb = kvpool_seq_new(kv);
    int cached = kvpool_seq_attach_prefix(kv, sb, t2, N);
    CHECK(cached == 256);
    CHECK(prefill(e, sb, t2 + cached, cached, N - cached, 64, b + (size_t)cached * V));
    /* recompute t2 from scratch on a 1-thread engine */
    engine *e1 = mk_engine(m, 1, true, 8, 64);
    kvpool_seq *sc = kvpool_seq_new(engine_kvpool(e1));
    CHECK(prefill(e1, sc, t2, 0, N, 64, c));
    CHECKF(maxdiff(b + (size_t)cached * V, c + (size_t)cached * V, (N - cached) * V) == 0.0f, "%g",
           maxdiff(b + (size_t)cached * V, c + (size_t)cached * V, (N - cached) * V));
    CHECK(maxdiff(a, c, 256 * V) == 0.0f);  /* shared prefix, 2 threads vs 1 */
    kvpool_seq_free(engine_kvpool(e1), sc);
    kvpool_seq_free(kv, sb);
    engine_free(e1);
    engine_free(e);
    model_free(m);
}

/* A warm-up step leaves no trace: every block is free again and a prompt's logits after it
 * are bit-identical to a fresh engine's. */
TEST(test_warmup_leaves_no_trace)
{
    model *m = mk("qwen3", 11);
    CHECK(m != NULL);
    if (!m) return;
    enum { N = 40 };
    int V = m->hp.n_vocab;
    static float a[N * 100], b[N * 100];
    int32_t toks[N];
    toks_of(toks, N, 5);
    engine *e0 = mk_engine(m, 2, false, 8, 64), *e1 = mk_engine(m, 2, false, 8, 64);
    CHECK(e0 && e1 && V <= 100);
    if (!e0 || !e1) return;
    CHECK(engine_warmup(e1) == ENGINE_OK);
    kvpool_stats ks;
    kvpool_get_stats(engine_kvpool(e1), &ks);
    CHECKF(ks.n_free == ks.n_blocks && ks.n_cached == 0, "%d of %d free, %d cached", ks.n_free, ks.n_blocks, ks.n_cached);
    kvpool_seq *s0 = kvpool_seq_new(engine_kvpool(e0)), *s1 = kvpool_seq_new(engine_kvpool(e1));
    CHECK(prefill(e0, s0, toks, 0, N, 16, a) && prefill(e1, s1, toks, 0, N, 16, b));
    CHECK(memcmp(a, b, sizeof(float) * (size_t)N * (size_t)V) == 0);
    kvpool_seq_free(engine_kvpool(e0), s0);
    kvpool_seq_free(engine_kvpool(e1), s1);
    engine_free(e0);
    engine_free(e1);
    model_free(m);
}

TEST(test_errors)
{
    model *m = mk("llama", 5);
    engine *e = mk_engine(m, 2, false, 2, 16);
    kvpool *kv = engine_kvpool(e);
    kvpool_seq *s = kvpool_seq_new(kv), *t = kvpool_seq_new(kv);
    float lg[100];
    engine_tok bad = { 100, 0, s, true };
    engine_batch b = { 1, &bad };
    CHECK(engine_step(e, &b, lg) == ENGINE_ERR_ARG);
    bad.token = -1;
    CHECK(engine_step(e, &b, lg) == ENGINE_ERR_ARG);
    bad = (engine_tok){ 1, -3, s, true };
    CHECK(engine_step(e, &b, lg) == ENGINE_ERR_ARG);
    b.n_tokens = 17;  /* over max batch */
    CHECK(engine_step(e, &b, lg) == ENGINE_ERR_ARG);
    engine_tok ok = { 1, 0, s, true };
    b = (engine_batch){ 1, &ok };
    CHECK(engine_step(e, &b, NULL) == ENGINE_ERR_ARG);  /* logits wanted, no buffer */
    ok.pos = 200;  /* needs two blocks for s */
    CHECK(engine_step(e, &b, lg) == ENGINE_OK);
    engine_tok o2 = { 1, 0, t, true };
    b = (engine_batch){ 1, &o2 };
    CHECK(engine_step(e, &b, lg) == ENGINE_ERR_KV_FULL);
    kvpool_seq_free(kv, s);
    CHECK(engine_step(e, &b, lg) == ENGINE_OK);
    kvpool_seq_free(kv, t);
    engine_free(e);
    model_free(m);
}

/* The profile counts every stage of every step it saw, with pool rounds where the pool ran
 * (a decode step's row-wise stages run without one), and changes no result. */
TEST(test_profile)
{
    enum { V = 100, P = 20, D = 3 };
    static float a[(P + D) * V], b[(P + D) * V];
    int32_t toks[P + D];
    toks_of(toks, P + D, 6);
    model *m = mk("qwen3", 6);
    const int nl = m->hp.n_layers;
    for (int on = 0; on < 2; on++) {
        float *out = on ? b : a;
        engine *e = mk_engine(m, 2, false, 4, 64);
        kvpool_seq *s = kvpool_seq_new(engine_kvpool(e));
        CHECK(engine_profile_cells(e, NULL) == NULL);
        CHECK(prefill(e, s, toks, 0, P, P, out));
        if (on) CHECK(engine_profile(e, true));
        CHECK(prefill(e, s, toks + P, P, D, 1, out + (size_t)P * V));   /* D decode steps */
        if (on) {
            CHECK(engine_profile(e, false));
            int64_t steps = 0;
            const engine_prof_cell *c = engine_profile_cells(e, &steps);
            CHECK(c && steps == D);
            for (int il = 0; c && il < nl; il++) {
                const engine_prof_cell *r = c + (size_t)il * ENGINE_PROF_N;
                CHECKF(r[ENGINE_PROF_QKV].calls == D && r[ENGINE_PROF_ATTENTION].calls == D &&
                       r[ENGINE_PROF_ADD_NORM].calls == 2 * D && r[ENGINE_PROF_FFN_DOWN].calls == D &&
                       r[ENGINE_PROF_MOE].calls == 0, "layer %d", il);
                CHECK(r[ENGINE_PROF_ATTENTION].rounds == D && r[ENGINE_PROF_ATTENTION].work_s > 0);
                /* a decode step's few rows: the adds, norms and RoPE run on the step thread, no
                 * pool round (attention is the only round of this tiny model's layer) */
                CHECK(r[ENGINE_PROF_ADD_NORM].rounds == 0 && r[ENGINE_PROF_QKV_POST].rounds == 0);
                CHECK(r[ENGINE_PROF_QKV].s > 0);
            }
            const engine_prof_cell *o = c ? c + (size_t)nl * ENGINE_PROF_N : NULL;
            CHECK(o && o[ENGINE_PROF_EMBED].calls == D && o[ENGINE_PROF_OUTPUT].calls == D &&
                  o[ENGINE_PROF_QKV].calls == 0);
            CHECK(!strcmp(engine_prof_op_name(ENGINE_PROF_OUTPUT), "output"));
            /* off: later steps are not counted */
            engine_tok t = { 1, P + D, s, true };
            engine_batch bt = { 1, &t };
            float lg[V];
            CHECK(engine_step(e, &bt, lg) == ENGINE_OK);
            CHECK(engine_profile_cells(e, &steps) && steps == D);
        }
        kvpool_seq_free(engine_kvpool(e), s);
        engine_free(e);
    }
    CHECK(maxdiff(a, b, (P + D) * V) == 0.0f);
    model_free(m);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_against_reference);
    RUN(test_decode_matches_prefill);
    RUN(test_mixed_batch);
    RUN(test_prefix_cache_and_threads);
    RUN(test_warmup_leaves_no_trace);
    RUN(test_errors);
    RUN(test_profile);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    HARNESS_END();
}
