/*
 * test_invariance: batch invariance of the forward step. The logits of a (sequence,
 * position) must be bit-identical (memcmp) however the step that computes them is made up:
 * the sequence alone with its whole prompt in one step, its prompt in chunks of 7 / 64 / 100
 * tokens or one token at a time, or in steps shared with 1..15 other sequences of different
 * lengths (prefill chunks and decode tokens mixed, the sequence in the middle of the batch),
 * and whatever the thread count. Checked on llama and qwen3 tiny models with F32, F16, Q8_0,
 * Q4_K and Q6_K weights, F16 and F32 KV caches, both attention paths (head size 64 and 24),
 * at every SIMD level the CPU has; and on a qwen3moe model (16 experts, 4 per token), whose
 * steps group their tokens by expert, so an expert's matmul sees different rows beside a
 * token's in every batch shape; and on a deepseek2 model (latent attention: one wide kv head,
 * per-head absorbed projections).
 *
 * Greedy decoding of a served request must not depend on what else the server is running;
 * these random-weight models amplify last-bit differences, so anything short of bit
 * identity shows up as different text.
 */
#include "harness.h"

#include <unistd.h>

#include "cli/cmd.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/ops.h"
#include "tinymodel.h"

enum { N = 140, V = 300, MAXB = 256, OTHERS = 15 };

/* Under the sanitizers (which look for memory errors, not numbers) a lighter matrix: one
 * model per weight type and fewer batch shapes; the optimised build runs all of it, unless
 * TM_TEST_LIGHT is set (the aarch64 build under emulation, many times slower). */
#if defined(__SANITIZE_ADDRESS__)
#define LIGHT 1
#else
#define LIGHT (getenv("TM_TEST_LIGHT") != NULL)
#endif

static char tmpdir[] = "/tmp/tm_test_invariance_XXXXXX";

/* deepseek2 (V3-like: q-LoRA, latent attention, a dense layer, sigmoid router with groups,
 * a shared expert) from mkmodel, which writes what llama.cpp reads */
static model *mk_deepseek2(qtype wt)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/deepseek2-%s.gguf", tmpdir, quant_type_name(wt));
    char vs[16];
    snprintf(vs, sizeof vs, "%d", V);
    char *argv[] = { "mkmodel", "--arch", "deepseek2", "--layers", "2", "--dim", "256", "--ffn", "256", "--heads", "4",
                     "--q-lora", "256", "--kv-lora", "256", "--nope-dim", "64", "--rope-dim", "32", "--v-dim", "64",
                     "--experts", "8", "--experts-used", "2", "--expert-ffn", "256", "--shared-experts", "1",
                     "--dense-layers", "1", "--router", "sigmoid", "--expert-groups", "4", "--groups-used", "2",
                     "--routed-scale", "2.5", "--vocab-size", vs, "--type", (char *)quant_type_name(wt), "--seed", "3",
                     "--threads", "2", "-o", path, NULL };
    if (cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) != 0) return NULL;
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    unlink(path);
    return m;
}

/* gpt-oss from mkmodel: a 16-token window on layer 0 (so windows start inside and across KV
 * blocks), sinks, biases, 8 experts of which 2 per token; "mxfp4" is MXFP4 experts with Q8_0
 * elsewhere */
static model *mk_gptoss(qtype wt)
{
    char path[256], err[256], vs[16];
    snprintf(path, sizeof path, "%s/gpt-oss-%s.gguf", tmpdir, quant_type_name(wt));
    snprintf(vs, sizeof vs, "%d", V);
    char *argv[] = { "mkmodel", "--arch", "gpt-oss", "--layers", "2", "--dim", "256", "--ffn", "256", "--heads", "4",
                     "--kv-heads", "2", "--head-dim", "64", "--experts", "8", "--experts-used", "2", "--expert-ffn", "256",
                     "--window", "16", "--vocab-size", vs, "--type", (char *)quant_type_name(wt), "--seed", "4",
                     "--threads", "2", "-o", path, NULL };
    if (cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) != 0) return NULL;
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    unlink(path);
    return m;
}

static model *mk(const char *arch, qtype wt, int hd)
{
    if (!strcmp(arch, "deepseek2")) return mk_deepseek2(wt);
    if (!strcmp(arch, "gpt-oss")) return mk_gptoss(wt);
    /* every matrix has 256 columns (hd 64), so the k-quants (256-element blocks) apply */
    bool moe = !strcmp(arch, "qwen3moe");
    tiny_cfg c = { .arch = arch, .dim = 256, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                   .head_dim = hd, .ffn = 256, .vocab = V, .seed = 5 + (uint64_t)wt, .wtype = wt,
                   .n_expert = moe ? 16 : 0, .n_expert_used = moe ? 4 : 0 };
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", tmpdir, arch, quant_type_name(wt));
    if (tiny_write(&c, path)) return NULL;
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    unlink(path);
    return m;
}

static engine *mk_engine(model *m, int threads, bool kv_f32)
{
    engine_opts o = { .n_threads = threads, .kv_type = kv_f32 ? ENGINE_KV_F32 : ENGINE_KV_F16, .n_kv_blocks = 64, .max_batch_tokens = MAXB };
    engine *e = NULL;
    char err[256];
    if (engine_new(m, &o, &e, err, sizeof err) != ENGINE_OK) fprintf(stderr, "%s\n", err);
    return e;
}

static void toks_of(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++) t[i] = (seed * 31 + i * 17 + i * i) % V;
}

/* The sequence alone, its N tokens in steps of `chunk`; logits of every position. */
static bool run_chunked(engine *e, const int32_t *toks, int chunk, float *out)
{
    kvpool *kv = engine_kvpool(e);
    kvpool_seq *s = kvpool_seq_new(kv);
    engine_tok bt[MAXB];
    bool ok = true;
    for (int i = 0; i < N && ok; i += chunk) {
        int m = TM_MIN(chunk, N - i);
        for (int k = 0; k < m; k++) bt[k] = (engine_tok){ toks[i + k], i + k, s, true };
        engine_batch b = { m, bt };
        ok = engine_step(e, &b, out + (size_t)i * V) == ENGINE_OK;
    }
    kvpool_seq_free(kv, s);
    return ok;
}

/* The sequence prefilled in chunks of 64 up to position 100, then decoded one token per
 * step, the steps shared with n_others other sequences: other j has 10 + 4j tokens, takes
 * (j % 12) + 1 of them per step (a decode token for j = 0, 12) and is in the batch before the
 * sequence if j is even, after it if odd. */
static bool run_shared(engine *e, const int32_t *toks, int n_others, float *out)
{
    kvpool *kv = engine_kvpool(e);
    kvpool_seq *s = kvpool_seq_new(kv), *o[OTHERS];
    int opos[OTHERS];
    int32_t ot[OTHERS][10 + 4 * OTHERS];
    for (int j = 0; j < n_others; j++) {
        o[j] = kvpool_seq_new(kv);
        opos[j] = 0;
        toks_of(ot[j], 10 + 4 * OTHERS, 100 + j);
    }
    static float lg[MAXB * V];
    engine_tok bt[MAXB];
    bool ok = true;
    for (int p = 0; p < N && ok;) {
        int m = p < 100 ? TM_MIN(64, 100 - p) : 1, n = 0;
        /* the even others, the sequence, the odd others */
        for (int pass = 0; pass < 3; pass++) {
            if (pass == 1) {
                for (int k = 0; k < m; k++) bt[n++] = (engine_tok){ toks[p + k], p + k, s, true };
                continue;
            }
            for (int j = pass / 2; j < n_others; j += 2) {
                int c = j % 12 + 1;
                for (int k = 0; k < c && opos[j] < 10 + 4 * j; k++, opos[j]++)
                    bt[n++] = (engine_tok){ ot[j][opos[j]], opos[j], o[j], k == c - 1 || j % 3 == 0 };
            }
        }
        engine_batch b = { n, bt };
        ok = engine_step(e, &b, lg) == ENGINE_OK;
        int r = 0;
        for (int t = 0; t < n; t++) {
            if (!bt[t].want_logits) continue;
            if (bt[t].seq == s) memcpy(out + (size_t)bt[t].pos * V, lg + (size_t)r * V, V * sizeof(float));
            r++;
        }
        p += m;
    }
    kvpool_seq_free(kv, s);
    for (int j = 0; j < n_others; j++) kvpool_seq_free(kv, o[j]);
    return ok;
}

static int first_diff(const float *a, const float *b)
{
    for (int p = 0; p < N; p++)
        if (memcmp(a + (size_t)p * V, b + (size_t)p * V, V * sizeof(float))) return p;
    return -1;
}

static void check_model(const char *arch, qtype wt, bool kv_f32, int hd)
{
    model *m = mk(arch, wt, hd);
    if (!m) {
        CHECKF(m, "%s %s", arch, quant_type_name(wt));
        return;
    }
    int32_t toks[N];
    toks_of(toks, N, 3);
    static float ref[N * V], got[N * V];
    for (int lvl = 0; lvl <= (int)cpu_get_hw_level(); lvl++) {
        ops_force_level((cpu_level)lvl);
        char what[96];
        snprintf(what, sizeof what, "%s %s hd %d kv %s %s", arch, quant_type_name(wt), hd,
                 kv_f32 ? "f32" : "f16", ops_level_name());
        /* Under the sanitizers the scalar level (the reference kernels, there many times
         * slower than the SIMD ones: most of this test's time) runs one chunking only; the
         * optimised build checks all of it at every level, and test_ops runs each scalar
         * kernel under the sanitizers. */
        bool brief = LIGHT && lvl == CPU_LEVEL_SCALAR && lvl < (int)cpu_get_hw_level();
        engine *e = mk_engine(m, 2, kv_f32);
        CHECK(e && run_chunked(e, toks, N, ref));  /* the whole prompt in one step */
        static const int chunks[] = { 7, 100, 1, 64 };
        for (size_t c = 0; c < (brief ? 1 : LIGHT ? 2 : TM_ARRAY_LEN(chunks)); c++) {
            CHECK(run_chunked(e, toks, chunks[c], got));
            int d = first_diff(ref, got);
            CHECKF(d < 0, "%s: chunks of %d differ from one step at position %d", what, chunks[c], d);
        }
        static const int others[] = { 15, 1, 2, 5 };
        for (size_t k = 0; k < (brief ? 0 : LIGHT ? 1 : TM_ARRAY_LEN(others)); k++) {
            CHECK(run_shared(e, toks, others[k], got));
            int d = first_diff(ref, got);
            CHECKF(d < 0, "%s: with %d other sequences, differs from alone at position %d", what,
                   others[k], d);
        }
        engine_free(e);
        /* thread count: 1 and 3 threads, one token at a time and in one step */
        for (int th = LIGHT ? 3 : 1; th <= 3 && !brief; th += 2) {
            engine *e2 = mk_engine(m, th, kv_f32);
            CHECK(e2 && run_chunked(e2, toks, th == 1 ? 1 : N, got));
            int d = first_diff(ref, got);
            CHECKF(d < 0, "%s: %d threads differ from 2 at position %d", what, th, d);
            engine_free(e2);
        }
    }
    ops_force_level(cpu_get_hw_level());
    model_free(m);
}

TEST(test_invariance_f32) { check_model("llama", QTYPE_F32, false, 64); if (!LIGHT) check_model("qwen3", QTYPE_F32, true, 64); }
TEST(test_invariance_f16) { check_model("qwen3", QTYPE_F16, false, 64); if (!LIGHT) check_model("llama", QTYPE_F16, true, 64); }
TEST(test_invariance_q8_0) { check_model("llama", QTYPE_Q8_0, false, 64); if (!LIGHT) check_model("qwen3", QTYPE_Q8_0, false, 64); }
TEST(test_invariance_q4_K) { check_model("qwen3", QTYPE_Q4_K, false, 64); if (!LIGHT) check_model("llama", QTYPE_Q4_K, true, 64); }
TEST(test_invariance_q6_K) { check_model("llama", QTYPE_Q6_K, false, 64); if (!LIGHT) check_model("qwen3", QTYPE_Q6_K, false, 64); }
TEST(test_invariance_mla) { check_model("deepseek2", QTYPE_Q8_0, false, 0); if (!LIGHT) check_model("deepseek2", QTYPE_F32, true, 0); }
TEST(test_invariance_gptoss) { check_model("gpt-oss", QTYPE_MXFP4, false, 64); if (!LIGHT) check_model("gpt-oss", QTYPE_F32, true, 64); }
TEST(test_invariance_moe) { check_model("qwen3moe", QTYPE_Q4_K, false, 64); if (!LIGHT) check_model("qwen3moe", QTYPE_Q8_0, true, 64); }
/* a head size that is not a multiple of 16: the per-key attention path with an F16 cache */
TEST(test_invariance_odd_head) { check_model("qwen3", QTYPE_F32, false, 24); }

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_invariance_f32);
    RUN(test_invariance_f16);
    RUN(test_invariance_q8_0);
    RUN(test_invariance_q4_K);
    RUN(test_invariance_q6_K);
    RUN(test_invariance_odd_head);
    RUN(test_invariance_moe);
    RUN(test_invariance_mla);
    RUN(test_invariance_gptoss);
    rmdir(tmpdir);
    HARNESS_END();
}
