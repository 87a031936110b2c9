/*
 * test_moe: mixture-of-experts models (qwen3moe). The router against llama.cpp's arithmetic
 * (softmax, argsort with libstdc++'s std::sort tie order, renormalised weights), loading of
 * (and DeepSeek V3's sigmoid router with bias and groups), the 3-D expert tensors and the errors for bad ones, the engine's grouped-by-expert FFN
 * against a plain reference forward pass, the expert load statistics, and mkmodel's presets
 * (Qwen3-30B-A3B, DeepSeek-V2-Lite with latent attention and YaRN, gpt-oss-20b), the
 * repacked expert and per-head latent attention tensors, and the refusal of bad gpt-oss files.
 */
#include "harness.h"

#include <unistd.h>

#include "cli/cmd.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/moe.h"
#include "tinymodel.h"

static char tmpdir[] = "/tmp/tm_test_moe_XXXXXX";

/* The orders below are what std::sort (libstdc++) gives for these inputs with the
 * comparator v[a] > v[b], as ggml_argsort uses it (printed by a C++ program). */
TEST(test_sort_ties_like_std_sort)
{
    static const int32_t want40[] = { 29, 20, 17, 23, 14, 26, 11, 8, 32, 5, 35, 2, 38, 31, 1, 34, 28, 25, 37, 22,
                                      16, 13, 4, 10, 19, 7, 30, 39, 0, 3, 36, 6, 33, 9, 12, 27, 15, 24, 18, 21 };
    float v[128];
    int32_t idx[128];
    for (int i = 0; i < 40; i++) v[i] = (float)((i * 7) % 3), idx[i] = i;
    moe_sort_desc(idx, 40, v);
    CHECK(!memcmp(idx, want40, sizeof want40));
    /* up to 16 elements: insertion sort, stable */
    for (int i = 0; i < 16; i++) v[i] = (float)(i % 2), idx[i] = i;
    moe_sort_desc(idx, 16, v);
    for (int i = 0; i < 8; i++) CHECK(idx[i] == 2 * i + 1 && idx[8 + i] == 2 * i);
    /* distinct values: plain descending order */
    for (int i = 0; i < 128; i++) v[i] = (float)((i * 37) % 128), idx[i] = i;
    moe_sort_desc(idx, 128, v);
    for (int i = 1; i < 128; i++) CHECK(v[idx[i - 1]] > v[idx[i]]);
}

TEST(test_route_ties_and_weights)
{
    /* 128 equal scores (a router of zeros): llama.cpp picks these 8, in this order */
    static const int32_t want[8] = { 80, 95, 94, 93, 92, 91, 90, 89 };
    float lg[128], fs[MOE_SCRATCH(128)], w[8];
    int32_t is[MOE_SCRATCH(128)], sel[8];
    const float *probs = fs;
    for (int i = 0; i < 128; i++) lg[i] = 0.5f;
    moe_router r = { .gate = MOE_GATE_SOFTMAX, .n_expert = 128, .k = 8, .norm_w = true };
    moe_route(&r, lg, NULL, fs, is, sel, w);
    CHECK(!memcmp(sel, want, sizeof want));
    for (int s = 0; s < 8; s++) CHECKF(w[s] == 0.125f, "w[%d] = %g", s, w[s]);
    /* distinct scores: top 2 of 4, softmax then renormalised */
    const float l4[4] = { 1.0f, 3.0f, 2.0f, -1.0f };
    r = (moe_router){ .gate = MOE_GATE_SOFTMAX, .n_expert = 4, .k = 2, .norm_w = true };
    moe_route(&r, l4, NULL, fs, is, sel, w);
    CHECK(sel[0] == 1 && sel[1] == 2);
    double e1 = exp(0.0), e2 = exp(-1.0);
    CHECKF(fabs(w[0] - e1 / (e1 + e2)) < 1e-6 && fabs(w[1] - e2 / (e1 + e2)) < 1e-6, "w %g %g", w[0], w[1]);
    double z = exp(-2.0) + 1 + exp(-1.0) + exp(-4.0);
    CHECKF(fabs(probs[1] - 1 / z) < 1e-6, "p %g", probs[1]);
    /* without renormalisation the weights are the probabilities, times the routed scale */
    r.norm_w = false, r.w_scale = 3.0f;
    moe_route(&r, l4, NULL, fs, is, sel, w);
    CHECK(w[0] == probs[1] * 3.0f && w[1] == probs[2] * 3.0f);
}

/* DeepSeek V3's router: sigmoid scores, the selection bias, groups (the sum of each group's
 * two best; tied groups in std::sort's order), weights from the unbiased scores, renormalised
 * and scaled. */
TEST(test_route_sigmoid_groups)
{
    /* logits 0 (sigmoid 0.5); the biases make the selection scores, in groups of 2:
     * {0.75, 0.25} = 1.0, {0.625, 0.625} = 1.25, {0.875, 0} = 0.875, {0.5, 0.5} = 1.0 */
    const float lg[8] = { 0 }, bias[8] = { 0.25f, -0.25f, 0.125f, 0.125f, 0.375f, -0.5f, 0, 0 };
    float fs[MOE_SCRATCH(8)], w[2];
    int32_t is[MOE_SCRATCH(8)], sel[2];
    moe_router r = { .gate = MOE_GATE_SIGMOID, .n_expert = 8, .k = 2, .norm_w = true, .w_scale = 2.5f };
    moe_route(&r, lg, bias, fs, is, sel, w);
    CHECKF(sel[0] == 4 && sel[1] == 0, "no groups: %d %d", sel[0], sel[1]);
    /* 2 of 4 groups: group 1, then of the tied groups 0 and 3 the first; expert 4's group is
     * out, and of experts 2 and 3 (tied) the first */
    r.n_groups = 4, r.n_groups_used = 2;
    moe_route(&r, lg, bias, fs, is, sel, w);
    CHECKF(sel[0] == 0 && sel[1] == 2, "groups: %d %d", sel[0], sel[1]);
    CHECKF(w[0] == 1.25f && w[1] == 1.25f, "w %g %g", w[0], w[1]);   /* 0.5 / 1.0 * 2.5 */
    CHECK(fs[0] == 0.5f);   /* the unbiased sigmoid */
}

/* gpt-oss's router (llama.cpp's SOFTMAX_WEIGHT): the top k of the logits themselves, their
 * weights a softmax over those k only; the probabilities it reports are the logits. */
TEST(test_route_softmax_weight)
{
    const float l4[4] = { 1.0f, 3.0f, 2.0f, -1.0f };
    float fs[MOE_SCRATCH(4)], w[2];
    int32_t is[MOE_SCRATCH(4)], sel[2];
    moe_router r = { .gate = MOE_GATE_SOFTMAX_WEIGHT, .n_expert = 4, .k = 2 };
    moe_route(&r, l4, NULL, fs, is, sel, w);
    CHECK(sel[0] == 1 && sel[1] == 2);
    double e = exp(-1.0);
    CHECKF(fabs(w[0] - 1 / (1 + e)) < 1e-6 && fabs(w[1] - e / (1 + e)) < 1e-6, "w %g %g", w[0], w[1]);
    CHECK(fs[0] == 1.0f && fs[3] == -1.0f);
    /* a single expert per token gets weight 1 whatever its logit */
    r.k = 1;
    moe_route(&r, l4, NULL, fs, is, sel, w);
    CHECK(sel[0] == 1 && w[0] == 1.0f);
}

/* The routing margin: the closest a dropped candidate came to the kept ones, at the experts'
 * boundary or (groups) at the groups' boundary, whichever is smaller. */
TEST(test_route_margin)
{
    float fs[MOE_SCRATCH(8)], w[2];
    int32_t is[MOE_SCRATCH(8)], sel[2];
    /* gpt-oss: the logits themselves; kept 3 and 2, the best dropped 1: margin 1 */
    const float l4[4] = { 1.0f, 3.0f, 2.0f, -1.0f };
    moe_router r = { .gate = MOE_GATE_SOFTMAX_WEIGHT, .n_expert = 4, .k = 2 };
    CHECK(moe_route(&r, l4, NULL, fs, is, sel, w) == 1.0f);
    /* every expert kept: nothing was dropped */
    r.k = 4;
    float w4[4];
    int32_t sel4[4];
    CHECK(isinf(moe_route(&r, l4, NULL, fs, is, sel4, w4)));
    /* sigmoid scores 0.5 plus the biases (exact in binary): experts 0.75 0.25 | 0.625 0.5 |
     * 0.875 0 | 0.5 0.5, groups 1.0 | 1.125 | 0.875 | 1.0; no groups: kept 0.875 and 0.75,
     * the best dropped 0.625 */
    const float lg[8] = { 0 }, bias[8] = { 0.25f, -0.25f, 0.125f, 0, 0.375f, -0.5f, 0, 0 };
    r = (moe_router){ .gate = MOE_GATE_SIGMOID, .n_expert = 8, .k = 2, .norm_w = true };
    CHECKF(moe_route(&r, lg, bias, fs, is, sel, w) == 0.125f, "no groups");
    /* 2 of 4 groups: groups 1 (1.125) and 0 or 3 (1.0, tied): the groups' margin 0 decides */
    r.n_groups = 4, r.n_groups_used = 2;
    CHECKF(moe_route(&r, lg, bias, fs, is, sel, w) == 0.0f, "tied groups");
    /* 3 of 4 groups: group 2 (0.875) out, 0.125 below the third; the experts kept 0.75 and
     * 0.625, the best dropped 0.5: the smaller, 0.125, either way */
    r.n_groups_used = 3;
    CHECKF(moe_route(&r, lg, bias, fs, is, sel, w) == 0.125f, "three groups");
}

static tiny_cfg moe_cfg(uint64_t seed)
{
    return (tiny_cfg){ .arch = "qwen3moe", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                       .ffn = 32, .vocab = 100, .seed = seed, .n_expert = 8, .n_expert_used = 3 };
}

static model *mk(const tiny_cfg *c, char *err, size_t errsz, gguf_status *st)
{
    char path[256];
    snprintf(path, sizeof path, "%s/moe.gguf", tmpdir);
    if (tiny_write(c, path)) return NULL;
    model *m = NULL;
    *st = model_load(path, NULL, &m, err, errsz);
    unlink(path);
    return m;
}

TEST(test_load)
{
    tiny_cfg c = moe_cfg(1);
    char err[256];
    gguf_status st;
    model *m = mk(&c, err, sizeof err, &st);
    CHECKF(m, "%s", err);
    if (!m) return;
    const model_hparams *hp = &m->hp;
    CHECK(hp->arch == MODEL_ARCH_QWEN3MOE && !strcmp(hp->arch_name, "qwen3moe"));
    CHECK(hp->n_expert == 8 && hp->n_expert_used == 3 && hp->expert_ffn == 32);
    const model_layer *L = &m->layers[1];
    CHECK(L->gate_exps.rows == 8 * 32 && L->gate_exps.cols == 64 && L->down_exps.rows == 8 * 64 &&
          L->down_exps.cols == 32 && L->gate_inp.rows == 8 && L->q_norm && L->k_norm);
    /* expert 5 is a view into the mapping, 5 matrices in */
    ops_weight x = model_expert(&L->up_exps, 8, 5);
    CHECK(x.rows == 32 && x.cols == 64 && (const char *)x.data == (const char *)L->up_exps.data + 5 * 32 * 64 * 4);
    /* active bytes: the router and 3 of the 8 experts of each layer */
    size_t all = model_weight_bytes(m), act = model_active_weight_bytes(m), exp_b = 3 * 32 * 64 * 4;
    CHECK(all - act == 2 * 5 * exp_b);
    model_free(m);

    /* errors name the tensor or key */
    static const struct { const char *skip, *bad, *want; int used; } cases[] = {
        { "blk.1.ffn_down_exps.weight", NULL, "missing tensor blk.1.ffn_down_exps.weight", 3 },
        { NULL, "blk.0.ffn_up_exps.weight", "tensor blk.0.ffn_up_exps.weight has shape", 3 },
        { "blk.0.ffn_gate_inp.weight", NULL, "missing tensor blk.0.ffn_gate_inp.weight", 3 },
        { NULL, NULL, "bad expert hyper-parameters", 9 },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(cases); i++) {
        c = moe_cfg(1);
        c.skip = cases[i].skip, c.bad_shape = cases[i].bad, c.n_expert_used = cases[i].used;
        m = mk(&c, err, sizeof err, &st);
        CHECKF(!m && st != GGUF_OK && strstr(err, cases[i].want), "case %zu: %s", i, err);
        model_free(m);
    }
}

/* The engine's grouped expert FFN (prefill chunks and decode tokens) against the reference
 * forward pass, at every SIMD level; the load statistics count every (token, slot). */
TEST(test_engine_against_reference)
{
    enum { N = 150, V = 100 };
    static float lg[N * V];
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (7 + i * 13 + i * i) % V;
    tiny_cfg c = moe_cfg(3);
    char err[256];
    gguf_status st;
    model *m = mk(&c, err, sizeof err, &st);
    CHECKF(m, "%s", err);
    if (!m) return;
    tiny_ref r;
    tiny_ref_init(&r, m, N);
    static float want[N * V];
    for (int p = 0; p < N; p++) tiny_ref_forward(&r, toks[p], p, want + (size_t)p * V);
    tiny_ref_free(&r);
    for (int lvl = 0; lvl <= (int)cpu_get_hw_level(); lvl++) {
        ops_force_level((cpu_level)lvl);
        engine_opts o = { .n_threads = 2, .kv_type = ENGINE_KV_F32, .n_kv_blocks = 4, .max_batch_tokens = 64 };
        engine *e = NULL;
        CHECK(engine_new(m, &o, &e, err, sizeof err) == ENGINE_OK);
        if (!e) break;
        /* a warm-up step first on every other level: it leaves no count behind (below) */
        if (lvl % 2) CHECK(engine_warmup(e) == ENGINE_OK);
        kvpool_seq *s = kvpool_seq_new(engine_kvpool(e));
        engine_tok bt[64];
        int steps = 0;
        for (int i = 0; i < N;) {   /* 64, 64, then one token per step */
            int n = i < 128 ? 64 : 1;
            for (int k = 0; k < n; k++) bt[k] = (engine_tok){ toks[i + k], i + k, s, true };
            engine_batch b = { n, bt };
            CHECK(engine_step(e, &b, lg + (size_t)i * V) == ENGINE_OK);
            i += n, steps++;
        }
        float worst = 0;
        for (int i = 0; i < N * V; i++) worst = fmaxf(worst, fabsf(want[i] - lg[i]));
        CHECKF(worst < 1e-4f, "%s: max |logit diff| %g", ops_level_name(), worst);
        uint64_t win[8], tot[8];
        int64_t ns = 0;
        for (int il = 0; il < 2; il++) {
            CHECK(engine_moe_load(e, il, win, tot, &ns));
            uint64_t sw = 0, st_ = 0;
            for (int x = 0; x < 8; x++) sw += win[x], st_ += tot[x];
            CHECKF(sw == (uint64_t)N * 3 && st_ == (uint64_t)N * 3 && ns == steps, "layer %d: %llu %llu %lld", il,
                   (unsigned long long)sw, (unsigned long long)st_, (long long)ns);
        }
        CHECK(!engine_moe_load(e, 2, win, tot, &ns));
        kvpool_seq_free(engine_kvpool(e), s);
        engine_free(e);
    }
    ops_force_level(cpu_get_hw_level());
    model_free(m);
}

/* Logits of N tokens (a prefill of N - 3, then 3 decode steps) of model m, 2 threads. */
static bool moe_logits(model *m, const int32_t *toks, int N, float *lg)
{
    char err[256];
    engine_opts o = { .n_threads = 2, .kv_type = ENGINE_KV_F32, .n_kv_blocks = 4, .max_batch_tokens = 64 };
    engine *e = NULL;
    if (engine_new(m, &o, &e, err, sizeof err) != ENGINE_OK) return false;
    kvpool_seq *s = kvpool_seq_new(engine_kvpool(e));
    engine_tok bt[64];
    bool ok = true;
    for (int i = 0; i < N && ok;) {
        int n = i == 0 ? N - 3 : 1;
        for (int k = 0; k < n; k++) bt[k] = (engine_tok){ toks[i + k], i + k, s, true };
        engine_batch b = { n, bt };
        ok = engine_step(e, &b, lg + (size_t)i * m->hp.n_vocab) == ENGINE_OK;
        i += n;
    }
    kvpool_seq_free(engine_kvpool(e), s);
    engine_free(e);
    return ok;
}

/* Loads path twice: repacked as a server would (*m) and in the file's layout (*f). False, with
 * both freed, when either load fails. */
static bool load_repacked_and_file(const char *path, model **m, model **f)
{
    char err[256];
    model_opts keep = { .no_repack = true };
    *m = *f = NULL;
    CHECKF(model_load(path, NULL, m, err, sizeof err) == GGUF_OK, "%s", err);
    CHECKF(model_load(path, &keep, f, err, sizeof err) == GGUF_OK, "%s", err);
    if (*m && *f) return true;
    model_free(*m);
    model_free(*f);
    return false;
}

/* Each of the n slices (experts or heads) of rep, the repacked tensor, multiplies x (2 rows of
 * rep.cols) to the bits of file's same slice at the scalar level, and at the active level when
 * `active` (the repacked kernels are bit-identical to scalar). */
static void check_slices_equal(const ops_weight *rep, const ops_weight *file, int n, const float *x, void *scratch,
                               bool active, const char *what)
{
    float y0[2 * 128], y1[2 * 128];
    cpu_level lvl = ops_get_level();
    for (int e = 0; e < n; e++) {
        ops_weight wr = model_expert(rep, n, e), wf = model_expert(file, n, e);
        CHECK(wr.rows <= 128);
        if (wr.rows > 128) return;
        size_t ny = (size_t)2 * (size_t)wr.rows * sizeof(float);
        ops_force_level(CPU_LEVEL_SCALAR);
        ops_matmul(NULL, &wf, x, 2, y0, scratch);
        ops_matmul(NULL, &wr, x, 2, y1, scratch);
        CHECKF(!memcmp(y0, y1, ny), "%s slice %d, scalar", what, e);
        ops_force_level(lvl);
        ops_matmul(NULL, &wr, x, 2, y1, scratch);
        if (active) CHECKF(!memcmp(y0, y1, ny), "%s slice %d, %s", what, e, ops_level_name());
    }
}

/* Q8_0 experts whose rows per expert are whole 16-row groups are repacked at load (on
 * AVX-512, as the 2-D matrices): every expert's slice multiplies to the bits of the file's
 * layout at the scalar level (and at the active one, which is bit-identical to scalar for
 * this layout), and the engine's logits agree with the file layout's. */
TEST(test_repacked_experts)
{
    enum { N = 24, V = 100 };
    tiny_cfg c = moe_cfg(5);
    c.ffn = 64;
    c.wtype = QTYPE_Q8_0;
    char path[256];
    snprintf(path, sizeof path, "%s/moe-q8.gguf", tmpdir);
    CHECK(tiny_write(&c, path) == 0);
    model *m, *f;
    bool loaded = load_repacked_and_file(path, &m, &f);
    unlink(path);
    if (!loaded) return;
    bool want = ops_get_level() == CPU_LEVEL_AVX512 && !getenv("TOKENMILL_REPACK");
    const model_layer *L = &m->layers[1], *LF = &f->layers[1];
    CHECK(LF->gate_exps.type == QTYPE_Q8_0 && LF->down_exps.type == QTYPE_Q8_0);
    CHECK(L->gate_exps.type == (want ? QTYPE_Q8_0_X16 : QTYPE_Q8_0));
    CHECK(L->up_exps.type == L->gate_exps.type && L->down_exps.type == L->gate_exps.type);
    float x[2 * 64];
    for (int i = 0; i < 2 * 64; i++) x[i] = sinf(0.41f * (float)i);
    void *scratch = malloc(ops_matmul_scratch_bytes(QTYPE_Q8_0, 64, 2));
    check_slices_equal(&L->gate_exps, &LF->gate_exps, 8, x, scratch, want, "gate_exps");
    check_slices_equal(&L->up_exps, &LF->up_exps, 8, x, scratch, want, "up_exps");
    check_slices_equal(&L->down_exps, &LF->down_exps, 8, x, scratch, want, "down_exps");
    free(scratch);
    static float lr[N * V], lf[N * V];
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (3 + i * 17 + i * i) % V;
    CHECK(moe_logits(m, toks, N, lr) && moe_logits(f, toks, N, lf));
    float worst = 0;
    for (int i = 0; i < N * V; i++) worst = fmaxf(worst, fabsf(lr[i] - lf[i]));
    CHECKF(worst < 1e-3f, "max |logit diff| %g", worst);
    model_free(m);
    model_free(f);
}

/* MLA's per-head tensors (attn_k_b, attn_v_b) are repacked as the experts are when each
 * head's rows are whole 16-row groups: every head's slice multiplies to the file layout's
 * bits at the scalar level and at the active one, and the engine's logits are the file
 * layout's at the scalar level. */
TEST(test_repacked_mla)
{
    enum { N = 24 };
    char path[256];
    snprintf(path, sizeof path, "%s/mla-q8.gguf", tmpdir);
    char *argv[] = { "mkmodel", "--arch", "deepseek2", "--layers", "2", "--dim", "256", "--ffn", "256", "--heads", "4",
                     "--kv-lora", "128", "--nope-dim", "64", "--rope-dim", "32", "--v-dim", "64", "--experts", "8",
                     "--experts-used", "2", "--expert-ffn", "128", "--shared-experts", "1", "--dense-layers", "1",
                     "--vocab-size", "300", "--type", "q8_0", "--seed", "7", "--threads", "2", "-o", path, NULL };
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) == 0);
    model *m, *f;
    bool loaded = load_repacked_and_file(path, &m, &f);
    unlink(path);
    if (!loaded) return;
    bool want = ops_get_level() == CPU_LEVEL_AVX512 && !getenv("TOKENMILL_REPACK");
    const int H = m->hp.n_heads;
    float x[2 * 128];
    for (int i = 0; i < 2 * 128; i++) x[i] = sinf(0.37f * (float)i);
    void *scratch = malloc(ops_matmul_scratch_bytes(QTYPE_Q8_0, 128, 2));
    cpu_level lvl = ops_get_level();
    for (int il = 0; il < 2; il++) {
        const model_layer *L = &m->layers[il], *LF = &f->layers[il];
        CHECK(LF->wk_b.type == QTYPE_Q8_0 && LF->wv_b.type == QTYPE_Q8_0);
        CHECK(L->wk_b.type == (want ? QTYPE_Q8_0_X16 : QTYPE_Q8_0) && L->wv_b.type == L->wk_b.type);
        check_slices_equal(&L->wk_b, &LF->wk_b, H, x, scratch, want, il ? "layer 1 attn_k_b" : "layer 0 attn_k_b");
        check_slices_equal(&L->wv_b, &LF->wv_b, H, x, scratch, want, il ? "layer 1 attn_v_b" : "layer 0 attn_v_b");
    }
    free(scratch);
    int V = m->hp.n_vocab;
    float *lr = malloc((size_t)N * V * sizeof(float)), *lf = malloc((size_t)N * V * sizeof(float));
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (5 + i * 13 + i * i) % V;
    /* at the scalar level every product of the two models has the same bits (the file
     * layout's AVX-512 tiles round differently, which these random weights amplify) */
    ops_force_level(CPU_LEVEL_SCALAR);
    CHECK(lr && lf && moe_logits(m, toks, N, lr) && moe_logits(f, toks, N, lf));
    ops_force_level(lvl);
    CHECK(lr && lf && !memcmp(lr, lf, (size_t)N * V * sizeof(float)));
    free(lr);
    free(lf);
    model_free(m);
    model_free(f);
}

/* mkmodel's qwen3-30b-a3b preset keeps the real per-layer geometry when cut (fewer layers,
 * experts and vocabulary here, to stay small). */
TEST(test_mkmodel_preset)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/a3b.gguf", tmpdir);
    char *argv[] = { "mkmodel", "--preset", "qwen3-30b-a3b", "--layers", "1", "--experts", "8", "--vocab-size", "300",
                     "--type", "q8_0", "--seed", "1", "--threads", "2", "-o", path, NULL };
    CHECK(cmd_mkmodel(17, argv) == 0);
    model *m = NULL;
    CHECKF(model_load(path, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
    unlink(path);
    if (!m) return;
    const model_hparams *hp = &m->hp;
    CHECK(hp->arch == MODEL_ARCH_QWEN3MOE && hp->n_layers == 1 && hp->dim == 2048 && hp->n_heads == 32 &&
          hp->n_kv_heads == 4 && hp->head_dim == 128 && hp->n_expert == 8 && hp->n_expert_used == 8 &&
          hp->expert_ffn == 768 && hp->ffn_dim == 6144 && hp->n_ctx_train == 40960 && hp->rope_base == 1e6f &&
          hp->n_vocab == 300 && !m->tied_output);
    bool rep = ops_get_level() == CPU_LEVEL_AVX512 && !getenv("TOKENMILL_REPACK");
    CHECK(m->layers[0].gate_inp.type == QTYPE_F32 &&
          m->layers[0].gate_exps.type == (rep ? QTYPE_Q8_0_X16 : QTYPE_Q8_0));
    model_free(m);
    /* fewer experts than the preset's 8 per token is refused */
    char *bad[] = { "mkmodel", "--preset", "qwen3-30b-a3b", "--layers", "1", "--experts", "4", "--type", "q8_0",
                    "--seed", "1", "-o", path, NULL };
    CHECK(cmd_mkmodel(13, bad) == 2);
    CHECK(access(path, F_OK) != 0);
}

/* mkmodel's gpt-oss-20b preset, cut (2 layers, 4 small experts, a small vocabulary): the real
 * attention geometry, the window on even layers, sinks and biases, YaRN, MXFP4 experts with
 * Q8_0 elsewhere under --type mxfp4. */
TEST(test_mkmodel_gptoss_preset)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/gptoss.gguf", tmpdir);
    char *argv[] = { "mkmodel", "--preset", "gpt-oss-20b", "--layers", "2", "--experts", "4", "--expert-ffn", "64",
                     "--vocab-size", "300", "--type", "mxfp4", "--seed", "1", "--threads", "2", "-o", path, NULL };
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) == 0);
    model *m = NULL;
    CHECKF(model_load(path, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
    unlink(path);
    if (!m) return;
    const model_hparams *hp = &m->hp;
    CHECK(hp->arch == MODEL_ARCH_GPTOSS && !strcmp(hp->arch_name, "gpt-oss") && hp->n_layers == 2 && hp->dim == 2880 &&
          hp->n_heads == 64 && hp->n_kv_heads == 8 && hp->head_dim == 64 && hp->n_expert == 4 && hp->n_expert_used == 4 &&
          hp->expert_ffn == 64 && hp->n_ctx_train == 131072 && hp->rope_base == 150000.0f && hp->rope_neox &&
          hp->rope_yarn[0] == 1.0f && hp->rope_freq_scale == 1.0f / 32 && hp->n_vocab == 300 && !m->tied_output);
    CHECK(hp->router_logit_topk && hp->swiglu_limit == 7.0f && !hp->router_norm && hp->n_swa == 128);
    CHECK(model_layer_window(m, 0) == 128 && model_layer_window(m, 1) == 0);
    const model_layer *L = &m->layers[0];
    bool rep = ops_get_level() == CPU_LEVEL_AVX512 && !getenv("TOKENMILL_REPACK");
    CHECK(L->gate_exps.type == (rep ? QTYPE_MXFP4_X16 : QTYPE_MXFP4) && L->down_exps.type == L->gate_exps.type &&
          (L->wq.type == QTYPE_Q8_0 || L->wq.type == QTYPE_Q8_0_X16) &&
          L->gate_inp.type == QTYPE_F32 && (m->output.type == QTYPE_Q8_0 || m->output.type == QTYPE_Q8_0_X16));
    CHECK(L->sinks && L->bq && L->bk && L->bv && L->bo && L->gate_inp_b && L->gate_exps_b && L->up_exps_b && L->down_exps_b);
    model_free(m);
    /* the window and mxfp4 belong to gpt-oss; a tied output does not */
    char *bad1[] = { "mkmodel", "--arch", "qwen3moe", "--preset", "tiny", "--window", "16", "--type", "q8_0", "--seed", "1",
                     "-o", path, NULL };
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(bad1) - 1, bad1) == 2);
    char *bad2[] = { "mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "mxfp4", "--seed", "1", "-o", path, NULL };
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(bad2) - 1, bad2) == 2);
    char *bad3[] = { "mkmodel", "--arch", "gpt-oss", "--preset", "tiny", "--tied", "--type", "q8_0", "--seed", "1", "-o",
                     path, NULL };
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(bad3) - 1, bad3) == 2);
    CHECK(access(path, F_OK) != 0);
}

/* Overwrites the first occurrence of `what` (len bytes) in the file with `with` (same length),
 * or, when value is >= 0, the u32 that follows the key `what` and its u32 type tag. */
static bool patch_file(const char *path, const char *what, const char *with, int64_t value)
{
    FILE *f = fopen(path, "r+b");
    if (!f) return false;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    char *buf = malloc((size_t)n);
    fseek(f, 0, SEEK_SET);
    bool ok = fread(buf, 1, (size_t)n, f) == (size_t)n;
    size_t wl = strlen(what);
    char *hit = NULL;
    for (long i = 0; ok && i + (long)wl <= n && !hit; i++)
        if (!memcmp(buf + i, what, wl)) hit = buf + i;
    ok = ok && hit;
    if (ok) {
        long at = (long)(hit - buf);
        fseek(f, value >= 0 ? at + (long)wl + 4 : at, SEEK_SET);
        uint32_t v = (uint32_t)value;
        ok = value >= 0 ? fwrite(&v, 4, 1, f) == 1 : fwrite(with, wl, 1, f) == 1;
    }
    free(buf);
    fclose(f);
    return ok;
}

/* A gpt-oss file with a bad window or without a layer's sinks is refused, naming the problem. */
TEST(test_gptoss_bad_files)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/oss-bad.gguf", tmpdir);
    char *argv[] = { "mkmodel", "--arch", "gpt-oss", "--preset", "tiny", "--vocab-size", "300", "--experts", "4",
                     "--experts-used", "2", "--expert-ffn", "64", "--window", "16", "--type", "q8_0", "--seed", "1",
                     "--threads", "2", "-o", path, NULL };
    model *m = NULL;
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) == 0);
    CHECK(patch_file(path, "gpt-oss.attention.sliding_window", NULL, 0));
    CHECK(model_load(path, NULL, &m, err, sizeof err) == GGUF_ERR_FORMAT && !m);
    CHECKF(strstr(err, "sliding_window 0"), "%s", err);
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) == 0);
    CHECK(patch_file(path, "blk.1.attn_sinks", "blk.1.attn_sinkz", -1));
    CHECK(model_load(path, NULL, &m, err, sizeof err) == GGUF_ERR_MISSING && !m);
    CHECKF(strstr(err, "blk.1.attn_sinks.weight"), "%s", err);
    unlink(path);
}

/* mkmodel's deepseek-v2-lite preset, cut: latent attention hyper-parameters as llama.cpp
 * reads them (one kv head of latent + RoPE dims), its router and YaRN. */
TEST(test_mkmodel_deepseek_preset)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/v2lite.gguf", tmpdir);
    char *argv[] = { "mkmodel", "--preset", "deepseek-v2-lite", "--layers", "2", "--experts", "8", "--vocab-size", "300",
                     "--type", "q8_0", "--seed", "1", "--threads", "2", "-o", path, NULL };
    CHECK(cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) == 0);
    model *m = NULL;
    CHECKF(model_load(path, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
    unlink(path);
    if (!m) return;
    const model_hparams *hp = &m->hp;
    CHECK(hp->arch == MODEL_ARCH_DEEPSEEK2 && hp->mla && hp->dim == 2048 && hp->n_heads == 16 && hp->n_kv_heads == 1);
    CHECK(hp->q_lora == 0 && hp->kv_lora == 512 && hp->nope_dim == 128 && hp->n_rot == 64 && hp->v_dim == 128 &&
          hp->head_dim == 576 && !hp->rope_neox);
    CHECK(hp->n_expert == 8 && hp->n_expert_used == 6 && hp->expert_ffn == 1408 && hp->n_shared == 2 &&
          hp->n_dense_lead == 1 && !hp->router_sigmoid && !hp->router_norm && hp->n_groups == 0);
    /* YaRN (factor 40): the ramp is on, and the score scale carries mscale^2 > 1 */
    CHECK(hp->rope_yarn[0] == 1.0f && hp->rope_freq_scale == 1.0f / 40.0f);
    CHECK(hp->att_scale > 1.0f / sqrtf(192.0f) * 1.5f);
    const model_layer *L0 = &m->layers[0], *L1 = &m->layers[1];
    CHECK(L0->gate.data && !L0->gate_inp.data && L1->gate_inp.data && L1->gate_shexp.rows == 2 * 1408);
    CHECK(L1->wq.data && !L1->wq_a.data && L1->wk_b.rows == 16 * 512 && L1->wk_b.cols == 128 &&
          L1->wv_b.rows == 16 * 128 && L1->wv_b.cols == 512 && L1->wkv_a.rows == 576);
    /* the KV pool holds the latent and the RoPE key once per token and layer (V is K):
     * layers x (kv_lora + n_rot) x 2 bytes (f16) per token */
    engine_opts eo = { .n_threads = 1, .n_kv_blocks = 2, .max_batch_tokens = 8 };
    engine *e = NULL;
    CHECKF(engine_new(m, &eo, &e, err, sizeof err) == ENGINE_OK, "%s", err);
    if (e) {
        CHECK(kvpool_block_bytes(engine_kvpool(e)) == (size_t)128 * 2 * (512 + 64) * 2);
        int32_t lw[2];
        kvpool_opts ko = engine_kv_geometry(m, ENGINE_KV_F32, lw);
        CHECK(ko.v_is_k && kvpool_geom_block_bytes(&ko) == (size_t)128 * 2 * (512 + 64) * 4);
        engine_free(e);
    }
    model_free(m);
}

TEST(test_imbalance)
{
    const uint64_t even[8] = { 5, 5, 5, 5, 5, 5, 5, 5 }, skew[8] = { 10, 10, 0, 0, 2, 2, 4, 4 };
    CHECK(engine_moe_imbalance(even, 8, 4) == 1.0);
    /* groups {10,10} {0,0} {2,2} {4,4}: 20 over a mean of 8 */
    CHECK(engine_moe_imbalance(skew, 8, 4) == 2.5);
    CHECK(engine_moe_imbalance(skew, 8, 1) == 1.0);
    const uint64_t none[8] = { 0 };
    CHECK(engine_moe_imbalance(none, 8, 2) == 0.0);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_sort_ties_like_std_sort);
    RUN(test_route_ties_and_weights);
    RUN(test_route_sigmoid_groups);
    RUN(test_route_softmax_weight);
    RUN(test_route_margin);
    RUN(test_load);
    RUN(test_engine_against_reference);
    RUN(test_repacked_experts);
    RUN(test_repacked_mla);
    RUN(test_mkmodel_preset);
    RUN(test_mkmodel_deepseek_preset);
    RUN(test_mkmodel_gptoss_preset);
    RUN(test_gptoss_bad_files);
    RUN(test_imbalance);
    rmdir(tmpdir);
    HARNESS_END();
}
