/*
 * test_ep: the expert-parallel group's placement (cluster/ep.h): EPLB against the example
 * DeepSeek publishes with its algorithm (and that vLLM's tests repeat), the global policy
 * when groups do not divide among the processes, and the imbalance figure.
 */
#include "harness.h"

#include <unistd.h>

#include "cli/cmd.h"
#include "cluster/ep.h"
#include "engine/engine.h"
#include "model/model.h"
#include "util/util.h"

#define V 512        /* vocabulary */
#define N 40         /* prompt tokens */
#define G 6          /* greedy-free decode steps after it (fixed tokens) */

static char tmpdir[] = "/tmp/tm_test_ep_XXXXXX";

static model *mk_skew(const char *arch, const char *skew)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, arch);
    char *qw[] = { "mkmodel", "--arch", "qwen3moe", "--layers", "2", "--dim", "256", "--ffn", "256", "--heads", "4",
                   "--experts", "16", "--experts-used", "4", "--expert-ffn", "128", "--vocab-size", "512",
                   "--type", "q8_0", "--seed", "11", "--threads", "2", "-o", path, NULL };
    char *ds[] = { "mkmodel", "--arch", "deepseek2", "--layers", "2", "--dim", "256", "--ffn", "256", "--heads", "4",
                   "--q-lora", "256", "--kv-lora", "256", "--nope-dim", "64", "--rope-dim", "32", "--v-dim", "64",
                   "--experts", "8", "--experts-used", "2", "--expert-ffn", "256", "--shared-experts", "1",
                   "--dense-layers", "1", "--router", "sigmoid", "--expert-groups", "4", "--groups-used", "2",
                   "--routed-scale", "2.5", "--vocab-size", "512", "--type", "q8_0", "--seed", "3",
                   "--threads", "2", "--router-skew", (char *)skew, "-o", path, NULL };
    char *oss[] = { "mkmodel", "--arch", "gpt-oss", "--layers", "2", "--dim", "256", "--ffn", "256", "--heads", "4",
                    "--kv-heads", "2", "--head-dim", "64", "--experts", "8", "--experts-used", "2", "--expert-ffn", "256",
                    "--window", "16", "--vocab-size", "512", "--type", "mxfp4", "--seed", "4",
                    "--threads", "2", "-o", path, NULL };
    char **argv = !strcmp(arch, "deepseek2") ? ds : !strcmp(arch, "gpt-oss") ? oss : qw;
    int argc = 0;
    while (argv[argc]) argc++;
    if (cmd_mkmodel(argc, argv) != 0) return NULL;
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    unlink(path);
    return m;
}

static model *mk(const char *arch) { return mk_skew(arch, "0"); }

static engine *mk_engine(model *m, int threads)
{
    engine_opts o = { .n_threads = threads, .n_kv_blocks = 8, .max_batch_tokens = 64 };
    engine *e = NULL;
    char err[256];
    if (engine_new(m, &o, &e, err, sizeof err) != ENGINE_OK) fprintf(stderr, "%s\n", err);
    return e;
}

/* A leader's hooks without a network: experts x % 3 == 0 stay here; the others are computed by
 * the "member" engine (another thread count) in combine, except x % 3 == 2 on odd layers,
 * which combine reports failed, so that the leader computes them after all. */
typedef struct {
    engine *member;
    const int32_t *off;
    const float *xg;
    int32_t remote[64];
    int n_remote, dim;
    uint64_t rows_remote, rows_failed;
} fake_group;

static int fake_dispatch(void *ctx, int il, int32_t *act, int n_act, const int32_t *off, const float *xg)
{
    fake_group *g = ctx;
    int n_local = 0;
    g->n_remote = 0;
    g->off = off;
    g->xg = xg;
    int32_t local[64];
    for (int i = 0; i < n_act; i++) {
        if (act[i] % 3 == 0) local[n_local++] = act[i];
        else g->remote[g->n_remote++] = act[i];
    }
    memcpy(act, local, (size_t)n_local * sizeof *act);
    return n_local;
}

static int fake_combine(void *ctx, int il, float *ye, int32_t *act)
{
    fake_group *g = ctx;
    int n_fail = 0, n_exp = 0;
    int32_t ex[64], rows[64];
    for (int i = 0; i < g->n_remote; i++) {
        int x = g->remote[i];
        if (il % 2 == 1 && x % 3 == 2) {
            act[n_fail++] = x;
            g->rows_failed += (uint64_t)(g->off[x + 1] - g->off[x]);
            continue;
        }
        ex[n_exp] = x;
        rows[n_exp++] = g->off[x + 1] - g->off[x];
    }
    /* the member's rows: those experts' rows of xg, gathered in order, as the wire carries them */
    static float in[64 * 4 * 256], out[64 * 4 * 256];
    size_t o = 0;
    for (int i = 0; i < n_exp; i++) {
        memcpy(in + o, g->xg + (size_t)g->off[ex[i]] * g->dim, (size_t)rows[i] * g->dim * sizeof(float));
        o += (size_t)rows[i] * g->dim;
    }
    CHECK(engine_moe_experts_run(g->member, il, n_exp, ex, rows, in, out) == ENGINE_OK);
    o = 0;
    for (int i = 0; i < n_exp; i++) {
        memcpy(ye + (size_t)g->off[ex[i]] * g->dim, out + o, (size_t)rows[i] * g->dim * sizeof(float));
        o += (size_t)rows[i] * g->dim;
        g->rows_remote += (uint64_t)rows[i];
    }
    return n_fail;
}

/* A prompt in one step, then decode steps of two sequences sharing each step. */
static bool run(engine *e, float *out)
{
    kvpool *kv = engine_kvpool(e);
    kvpool_seq *a = kvpool_seq_new(kv), *b = kvpool_seq_new(kv);
    engine_tok bt[64];
    for (int i = 0; i < N; i++) bt[i] = (engine_tok){ (i * 37 + 5) % V, i, a, true };
    engine_batch bb = { N, bt };
    bool ok = engine_step(e, &bb, out) == ENGINE_OK;
    for (int s = 0; s < G && ok; s++) {
        bt[0] = (engine_tok){ (s * 11 + 3) % V, N + s, a, true };
        bt[1] = (engine_tok){ (s * 13 + 7) % V, s, b, true };
        engine_batch d = { 2, bt };
        ok = engine_step(e, &d, out + (size_t)(N + 2 * s) * V) == ENGINE_OK;
    }
    kvpool_seq_free(kv, a);
    kvpool_seq_free(kv, b);
    return ok;
}

/* The leader's logits with experts computed elsewhere (and some of them failed over to it) are
 * the one process's, bit for bit, for each family's router and expert arithmetic. */
TEST(test_split_experts_same_bits)
{
    const char *archs[] = { "qwen3moe", "deepseek2", "gpt-oss" };
    for (size_t a = 0; a < TM_ARRAY_LEN(archs); a++) {
        model *m = mk(archs[a]);
        CHECK(m != NULL);
        if (!m) continue;
        engine *one = mk_engine(m, 2), *lead = mk_engine(m, 2), *member = mk_engine(m, 1);
        CHECK(one && lead && member);
        size_t n_out = (size_t)(N + 2 * G) * V;
        float *want = xmalloc(n_out * sizeof(float)), *got = xmalloc(n_out * sizeof(float));
        fake_group g = { .member = member, .dim = m->hp.dim };
        engine_ep_hooks h = { .ctx = &g, .dispatch = fake_dispatch, .combine = fake_combine };
        engine_set_ep(lead, &h);
        CHECK(run(one, want));
        CHECK(run(lead, got));
        CHECKF(!memcmp(want, got, n_out * sizeof(float)), "%s: logits differ", archs[a]);
        CHECKF(g.rows_remote > 0 && g.rows_failed > 0, "%s: %llu rows elsewhere, %llu failed over", archs[a],
               (unsigned long long)g.rows_remote, (unsigned long long)g.rows_failed);
        /* a bad request to a member is refused, not run */
        int32_t ex[2] = { 3, 1 }, rows[2] = { 1, 1 };
        CHECK(engine_moe_experts_run(member, 1, 2, ex, rows, got, want) == ENGINE_ERR_ARG);
        ex[0] = 0;
        rows[1] = 10000;
        CHECK(engine_moe_experts_run(member, 1, 2, ex, rows, got, want) == ENGINE_ERR_ARG);
        /* one expert past the member's batch: a step never routes it more than a row per token,
         * and its chunk buffers hold no more (the total would fit max_batch * n_expert_used) */
        int32_t ex1[1] = { 0 }, rows1[1] = { 65 };
        float *x1 = xmalloc((size_t)65 * m->hp.dim * sizeof(float)), *y1 = xmalloc((size_t)65 * m->hp.dim * sizeof(float));
        for (size_t i = 0; i < (size_t)65 * m->hp.dim; i++) x1[i] = 0.01f * (float)(i % 97);
        CHECK(engine_moe_experts_run(member, 1, 1, ex1, rows1, x1, y1) == ENGINE_ERR_ARG);
        free(x1);
        free(y1);
        free(want);
        free(got);
        engine_free(one);
        engine_free(lead);
        engine_free(member);
        model_free(m);
    }
}

/* eplb.py's README: 12 experts in 4 groups, 16 slots on 8 GPUs of 2 nodes. */
TEST(test_eplb_reference)
{
    static const double w[2][12] = {
        { 90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86 },
        { 20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27 },
    };
    static const int32_t want[2][16] = {
        { 5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1 },
        { 7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1 },
    };
    for (int l = 0; l < 2; l++) {
        int32_t p2l[16], cnt[12];
        CHECK(ep_eplb(w[l], 12, 16, 4, 2, 8, p2l, cnt));
        for (int s = 0; s < 16; s++) CHECKF(p2l[s] == want[l][s], "layer %d slot %d: %d, want %d", l, s, p2l[s], want[l][s]);
        int total = 0;
        for (int x = 0; x < 12; x++) {
            int n = 0;
            for (int s = 0; s < 16; s++) n += p2l[s] == x;
            CHECK(n == cnt[x] && n >= 1);
            total += cnt[x];
        }
        CHECK(total == 16);
    }
}

/* 16 experts, 4 redundant slots on 5 processes: groups (4) do not divide among 5, so the
 * global policy; every expert placed, the hot ones copied, and the placement's imbalance far
 * below the contiguous ranges' on a skewed load. */
TEST(test_eplb_global_and_imbalance)
{
    double load[16];
    for (int x = 0; x < 16; x++) load[x] = x < 2 ? 400 : 10;   /* two hot experts, both in range 0 */
    int32_t p2l[20], cnt[16];
    CHECK(ep_eplb(load, 16, 20, 4, 5, 5, p2l, cnt));
    CHECK(cnt[0] >= 2 && cnt[1] >= 2);
    uint64_t placed[16], cont[16];
    ep_eplb_holders(p2l, 20, 5, 16, placed);
    for (int x = 0; x < 16; x++) CHECK(placed[x] != 0);
    for (int p = 0; p < 5; p++)
        for (int x = (16 * p) / 5; x < (16 * (p + 1)) / 5; x++) cont[x] = 1ull << p;
    double ic = ep_placement_imbalance(load, 16, cont, 5), ip = ep_placement_imbalance(load, 16, placed, 5);
    CHECKF(ic > 3.5, "contiguous %.3f", ic);
    CHECKF(ip < 1.6, "placed %.3f", ip);   /* 6 copies of ~133 on 5 processes: one holds 2 */
    /* uniform load: imbalance 1 with 16 slots on 4 processes, none without load */
    double u[16];
    for (int x = 0; x < 16; x++) u[x] = 1;
    int32_t q[16], c2[16];
    CHECK(ep_eplb(u, 16, 16, 1, 4, 4, q, c2));
    uint64_t h[16];
    ep_eplb_holders(q, 16, 4, 16, h);
    CHECK(fabs(ep_placement_imbalance(u, 16, h, 4) - 1.0) < 1e-12);
    double z[16] = { 0 };
    CHECK(ep_placement_imbalance(z, 16, h, 4) == 0);
    /* bad sizes */
    CHECK(!ep_eplb(u, 16, 15, 1, 4, 4, q, c2));   /* fewer slots than experts */
    CHECK(!ep_eplb(u, 16, 18, 1, 4, 4, q, c2));   /* not a multiple of the processes */
}

static const auth_key key = { .secret = "ep test key 0123456789abcdef", .n = 28 };

/* A metric's value in the group's /metrics text (-1 when absent). */
static double ep_metric(ep_group *g, const char *name)
{
    bytebuf b = { 0 };
    ep_group_metrics(g, &b);
    bytebuf_putc(&b, 0);
    char want[128];
    snprintf(want, sizeof want, "\n%s ", name);
    const char *p = strstr(b.p, want);
    double v = p ? atof(p + strlen(want)) : -1;
    bytebuf_free(&b);
    return v;
}

/* The real group over loopback: two members (ep_member, one thread each) and a leader
 * (ep_group), with one micro-batch per member and layer and with two (overlap): the logits
 * are one process's, bit for bit, and with overlap the members' shares went as two
 * micro-batches, without as one. qwen3moe and deepseek2 (shared experts, expert groups). */
TEST(test_group_micro_batches_same_bits)
{
    const char *archs[] = { "qwen3moe", "deepseek2" };
    for (size_t a = 0; a < TM_ARRAY_LEN(archs); a++) {
        model *m = mk(archs[a]);
        CHECK(m != NULL);
        if (!m) continue;
        char err[256];
        ep_member *mb[2];
        char addr[2][64];
        const char *members[2] = { addr[0], addr[1] };
        for (int i = 0; i < 2; i++) {
            mb[i] = ep_member_new(m, 1, "127.0.0.1:0", &key, err, sizeof err);
            CHECKF(mb[i] != NULL, "%s", err);
            snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", mb[i] ? ep_member_port(mb[i]) : 0);
        }
        size_t n_out = (size_t)(N + 2 * G) * V;
        float *want = xmalloc(n_out * sizeof(float)), *got = xmalloc(n_out * sizeof(float));
        engine *one = mk_engine(m, 2);
        CHECK(one && run(one, want));
        for (int n_mb = 1; n_mb <= 2 && mb[0] && mb[1]; n_mb++) {
            engine *lead = mk_engine(m, 2);
            ep_opts o = { .members = members, .n_members = 2, .key = &key, .timeout_s = 30, .micro_batches = n_mb };
            ep_group *g = lead ? ep_group_new(lead, &o, err, sizeof err) : NULL;
            CHECKF(g != NULL, "%s", err);
            if (g) {
                memset(got, 0, n_out * sizeof(float));
                CHECK(run(lead, got));
                CHECKF(!memcmp(want, got, n_out * sizeof(float)), "%s, %d micro-batches: logits differ", archs[a], n_mb);
                double split = ep_metric(g, "tokenmill_ep_split_exchanges_total");
                double ex = ep_metric(g, "tokenmill_ep_exchanges_total");
                CHECKF(ex > 0 && (n_mb == 2 ? split > 0 : split == 0), "%s, %d micro-batches: %.0f exchanges, %.0f split",
                       archs[a], n_mb, ex, split);
                CHECK(ep_metric(g, "tokenmill_ep_micro_batches") == n_mb);
                CHECK(ep_group_up(g) == 2);
                ep_group_free(g);
            }
            engine_free(lead);
        }
        for (int i = 0; i < 2; i++) ep_member_free(mb[i]);
        free(want);
        free(got);
        engine_free(one);
        model_free(m);
    }
}

/* The balancer on a skewed load: a Zipf load over 16 experts (expert x gets 1 / (x + 1) of
 * the hottest one's tokens; a random router spreads tokens evenly, so a balancer has nothing
 * to do there), 4 processes. The contiguous ranges put the four hottest experts on process 0;
 * EPLB's global policy packs them (16 slots: no copies), with 4 and 12 copies of the hottest
 * more so. Its hierarchical policy with one process per node (4 groups on 4 nodes) copies
 * within a node, onto the process of the original: no better than the ranges, which is why
 * the group places globally. Exact figures: a placement is a deterministic function of the
 * load. */
TEST(test_eplb_skewed_load)
{
    double load[16];
    for (int x = 0; x < 16; x++) load[x] = 1e6 / (x + 1);
    uint64_t cont[16];
    for (int p = 0; p < 4; p++)
        for (int x = 4 * p; x < 4 * (p + 1); x++) cont[x] = 1ull << p;
    const double ic = ep_placement_imbalance(load, 16, cont, 4);
    CHECKF(fabs(ic - 2.4649515977244962) < 1e-12, "contiguous %.17g", ic);
    struct { int n_phys, n_groups, n_nodes; double want; } cases[] = {
        { 16, 1, 1, 1.4205163921743742 },   /* global, no copies: packing alone */
        { 20, 1, 1, 1.1092282189760234 },   /* global, 4 copies */
        { 28, 1, 1, 1.0301576936983674 },   /* global, 12 copies */
        { 20, 4, 4, 2.4649515977244962 },   /* hierarchical, a node per process: the ranges' */
    };
    for (size_t c = 0; c < TM_ARRAY_LEN(cases); c++) {
        int32_t p2l[32], cnt[16];
        uint64_t h[16];
        CHECK(ep_eplb(load, 16, cases[c].n_phys, cases[c].n_groups, cases[c].n_nodes, 4, p2l, cnt));
        ep_eplb_holders(p2l, cases[c].n_phys, 4, 16, h);
        double ip = ep_placement_imbalance(load, 16, h, 4);
        CHECKF(fabs(ip - cases[c].want) < 1e-12, "%d slots, %d groups on %d nodes: %.17g, want %.17g", cases[c].n_phys,
               cases[c].n_groups, cases[c].n_nodes, ip, cases[c].want);
    }
}

/* The same through a model whose router is skewed on purpose (mkmodel --router-skew: the
 * selection bias favours the high expert ids) and a group with redundant experts placed from
 * the live load: after a few steps the contiguous ranges' imbalance is far above 1 and the
 * placement the group switched to (a rebalance at every step's first MoE layer) is lower;
 * the logits stay one process's. */
TEST(test_group_skewed_router_rebalanced)
{
    /* the skew is the sigmoid router's selection bias: refused for another router */
    char *bad[] = { "mkmodel", "--arch", "deepseek2", "--preset", "tiny", "--router", "softmax", "--router-skew", "1",
                    "--vocab-size", "512", "--type", "q8_0", "--seed", "1", "-o", "/dev/null", NULL };
    CHECK(cmd_mkmodel(17, bad) == 2);
    model *m = mk_skew("deepseek2", "1.5");
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    ep_member *mb = ep_member_new(m, 1, "127.0.0.1:0", &key, err, sizeof err);
    CHECKF(mb != NULL, "%s", err);
    if (!mb) { model_free(m); return; }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ep_member_port(mb));
    const char *members[1] = { addr };
    size_t n_out = (size_t)(N + 2 * G) * V;
    float *want = xmalloc(n_out * sizeof(float)), *got = xmalloc(n_out * sizeof(float));
    engine *one = mk_engine(m, 2), *lead = mk_engine(m, 2);
    CHECK(one && lead && run(one, want));
    ep_opts o = { .members = members, .n_members = 1, .key = &key, .timeout_s = 30, .redundant = 2, .rebalance_s = 1e-9 };
    ep_group *g = lead ? ep_group_new(lead, &o, err, sizeof err) : NULL;
    CHECKF(g != NULL, "%s", err);
    if (g) {
        CHECK(run(lead, got));
        CHECK(!memcmp(want, got, n_out * sizeof(float)));
        ep_summary s;
        ep_group_summary(g, &s);
        CHECKF(s.imb_contiguous > 1.3 && s.imb_placed < s.imb_contiguous && s.n_rebalances > 0,
               "contiguous %.3f, placed %.3f, %llu rebalances", s.imb_contiguous, s.imb_placed, (unsigned long long)s.n_rebalances);
        ep_group_free(g);
    }
    engine_free(one);
    engine_free(lead);
    ep_member_free(mb);
    free(want);
    free(got);
    model_free(m);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_split_experts_same_bits);
    RUN(test_eplb_reference);
    RUN(test_eplb_global_and_imbalance);
    RUN(test_eplb_skewed_load);
    RUN(test_group_micro_batches_same_bits);
    RUN(test_group_skewed_router_rebalanced);
    rmdir(tmpdir);
    HARNESS_END();
}
