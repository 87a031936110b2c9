/*
 * test_window: sliding-window layers' KV outside the blocks (the window cache itself:
 * test_wincache).
 *
 * On a generated gpt-oss model (6 layers, of which 0, 2, 4 attend to a 48-token window, so the
 * exact replay span is 48 + 2 * 47 = 142 positions, more than one block): blocks hold the full
 * layers only and the ring is bounded by the window; a sequence that attaches a prefix of
 * blocks and restores the window state captured at its end computes logits bit-identical to
 * the sequence that computed everything; so does an exact replay; a bounded replay recomputes
 * only the last block and is an approximation. A worker (played against by the test as its
 * gateway) keeps a relayed state only when its size is the model's, serves
 * it back on a fetch, and reports the states a prefill crossed (WINDOW) before its HANDOFF.
 */
#include "harness.h"
#include "windowtest.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/time.h>

#include "cache/blockkey.h"
#include "cli/cmd.h"
#include "cluster/proto.h"
#include "cluster/worker.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "model/model.h"
#include "util/util.h"

enum { N = 300, V = 300, W = 48, LAYERS = 6, CHUNK = 100 };

static char tmpdir[] = "/tmp/tm_test_window_XXXXXX";

static model *mk_model(void)
{
    char path[256], err[256], vs[16], ws[16], ls[16];
    snprintf(path, sizeof path, "%s/gpt-oss.gguf", tmpdir);
    snprintf(vs, sizeof vs, "%d", V);
    snprintf(ws, sizeof ws, "%d", W);
    snprintf(ls, sizeof ls, "%d", LAYERS);
    char *argv[] = { "mkmodel", "--arch", "gpt-oss", "--layers", ls, "--dim", "128", "--ffn", "128", "--heads", "2",
                     "--kv-heads", "1", "--head-dim", "64", "--experts", "4", "--experts-used", "2", "--expert-ffn", "128",
                     "--window", ws, "--vocab-size", vs, "--type", "q8_0", "--seed", "7", "--threads", "2", "-o", path, NULL };
    if (cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) != 0) return NULL;
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    unlink(path);
    return m;
}

static void toks_of(int32_t *t, int n)
{
    for (int i = 0; i < n; i++) t[i] = (i * 37 + i * i / 3 + 5) % V;
}

TEST(test_window_restore_and_replay)
{
    model *m = mk_model();
    CHECK(m != NULL);
    if (!m) return;
    engine_opts eo = { .n_threads = 2, .n_kv_blocks = 16, .max_batch_tokens = CHUNK };
    engine *e = NULL;
    char err[256];
    CHECK(engine_new(m, &eo, &e, err, sizeof err) == ENGINE_OK);
    if (!e) {
        model_free(m);
        return;
    }
    kvpool *kv = engine_kvpool(e);
    /* the geometry: blocks of the 3 full layers only, rings of window + 6 for the 3 others */
    CHECK(kvpool_n_window_layers(kv) == 3 && kvpool_n_block_layers(kv) == 3 && kvpool_window(kv) == W);
    CHECK(kvpool_layer_block_index(kv, 0) < 0 && kvpool_layer_block_index(kv, 1) == 0);
    CHECK(kvpool_block_bytes(kv) == (size_t)3 * 2 * 1 * 128 * 64 * 2);
    CHECK(kvpool_ring_bytes(kv) == (size_t)3 * 2 * 1 * (W + KVPOOL_RING_SPARE) * 64 * 2);
    CHECK(kvpool_window_state_bytes(kv) == 16 + (size_t)3 * 2 * 1 * W * 64 * 2);   /* header + rows */
    CHECK(kvpool_window_exact_span(kv) == W + 2 * (W - 1));
    /* a window wider than the pool (an odd GGUF) gets a ring of the pool's positions only */
    int32_t wide[3] = { 1 << 30, 0, 1 << 30 };
    kvpool_opts ko = { .n_layers = 3, .n_kv_heads = 1, .head_dim = 64, .dtype = QTYPE_F16, .n_blocks = 2, .layer_window = wide };
    kvpool *wp = NULL;
    CHECK(kvpool_new(&ko, &wp) == KVPOOL_OK && kvpool_window(wp) == 256 && kvpool_n_block_layers(wp) == 1);
    kvpool_free(wp);

    int32_t toks[N];
    toks_of(toks, N);
    static float ref[N * V], got[N * V];
    size_t sb = kvpool_window_state_bytes(kv);
    uint8_t *states[2] = { malloc(sb), malloc(sb) };
    memset(states[0], 0xff, sb);
    memset(states[1], 0xff, sb);

    /* the reference computes everything, in chunks that cross both block ends */
    kvpool_seq *a = kvpool_seq_new(kv);
    CHECK(windowtest_run(e, a, toks, 0, N, CHUNK, V, ref, states, 2));
    /* the state at 256 is what a sequence that computed everything holds there: the same
     * sequence token by token up to 256 (a different step shape) saves the same bytes */
    kvpool_seq *t = kvpool_seq_new(kv);
    for (int p = 0; p < 256; p++) {
        engine_tok bt = { toks[p], p, t, false };
        engine_batch b = { 1, &bt };
        CHECK(engine_step(e, &b, NULL) == ENGINE_OK);
        const engine_window_state *ws;   /* a decode step that ends a block captures it too */
        int ns = engine_window_states(e, &ws);
        CHECK(ns == ((p + 1) % 128 == 0));
        if (p == 255 && ns == 1)
            CHECKF(ws[0].seq == t && ws[0].end == 256 && !memcmp(ws[0].state, states[1], sb),
                   "the state captured by a one-token step differs");
    }
    uint8_t *saved = malloc(sb);
    kvpool_seq_window_save(kv, t, 256, saved);
    CHECKF(!memcmp(saved, states[1], sb), "the state captured inside a 100-token step differs from the ring's");
    kvpool_seq_free(kv, t);
    free(saved);

    /* attach the 2 blocks, restore the state at 256: identical logits from 256 on */
    kvpool_seq *b = kvpool_seq_new(kv);
    int att = kvpool_seq_attach_prefix(kv, b, toks, N);
    CHECK(att == 256);
    CHECK(kvpool_seq_window_restore(kv, b, att, states[1], sb));
    memset(got, 0, sizeof got);
    CHECK(windowtest_run(e, b, toks, att, N, CHUNK, V, got, NULL, 0));
    int d = windowtest_first_diff(ref, got, att, N, V);
    CHECKF(d < 0, "with the window state restored, position %d differs from computing everything", d);
    kvpool_seq_free(kv, b);

    /* without the state: garbage in the ring would show (what the restore fixes) */
    kvpool_seq *g = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, g, toks, N) == 256);
    CHECK(kvpool_seq_window_restore(kv, g, 256, states[0], sb));   /* the state of another position */
    CHECK(windowtest_run(e, g, toks, 256, N, CHUNK, V, got, NULL, 0));
    CHECKF(windowtest_first_diff(ref, got, 256, N, V) == 256, "a wrong window state must change the logits");
    kvpool_seq_free(kv, g);

    /* exact replay: from 256 - 142, window layers only below 256; identical */
    kvpool_seq *c = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, c, toks, N) == 256);
    int from = kvpool_seq_window_replay(kv, c, 256, true);
    CHECK(from == 256 - kvpool_window_exact_span(kv));
    CHECK(kvpool_seq_full_from(c) == 256 && kvpool_seq_exact_from(c) == 256);
    CHECK(windowtest_run(e, c, toks, from, N, CHUNK, V, got, NULL, 0));
    d = windowtest_first_diff(ref, got, 256, N, V);
    CHECKF(d < 0, "exact replay: position %d differs from computing everything", d);
    /* the replayed prefix's blocks were not written: the reference still agrees on them */
    kvpool_seq_free(kv, c);

    /* bounded replay: the last block only, an approximation (the span is 142 > 128) */
    kvpool_seq *bd = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, bd, toks, N) == 256);
    from = kvpool_seq_window_replay(kv, bd, 256, false);
    CHECK(from == 128 && kvpool_seq_win_lo(bd) == 128);
    CHECK(kvpool_seq_exact_from(bd) == 128 + kvpool_window_exact_span(kv));
    CHECK(windowtest_run(e, bd, toks, from, N, CHUNK, V, got, NULL, 0));
    d = windowtest_first_diff(ref, got, 256, N, V);
    CHECKF(d == 256, "bounded replay should differ at 256 (first diff %d)", d);
    bool finite = true;
    for (int i = 256 * V; i < N * V; i++) finite &= isfinite(got[i]);
    CHECK(finite);
    kvpool_seq_free(kv, bd);

    /* the reference's own blocks are unchanged by the replays (never written again) */
    kvpool_seq *r2 = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, r2, toks, N) == 256);
    CHECK(kvpool_seq_window_restore(kv, r2, 256, states[1], sb));
    CHECK(windowtest_run(e, r2, toks, 256, N, CHUNK, V, got, NULL, 0));
    CHECK(windowtest_first_diff(ref, got, 256, N, V) < 0);
    kvpool_seq_free(kv, r2);

    /* the step rules: a sequence in two runs of one step, a gap refused, going back a few
     * positions (a rejected draft) exactly and further refused */
    CHECK(kvpool_seq_ring_next(a) == N);
    windowtest_check_steps(e, a, toks, N, V, ref, got);

    kvpool_seq_free(kv, a);
    free(states[0]);
    free(states[1]);
    engine_free(e);
    model_free(m);
}

static uint8_t g_adds[64][32];   /* keys the worker reported added (WINDOW), in order */
static int g_n_adds;

/* Reads frames until one of type want (HEARTBEATs and others skipped; WINDOW adds noted in
 * g_adds); false on error. */
static bool expect_frame(proto_conn *pc, int want, proto_msg *m)
{
    for (;;) {
        if (proto_recv(pc, m) != PROTO_OK) return false;
        if (m->hdr.type == PROTO_WINDOW)
            for (uint32_t i = 0; i < m->u.window.n && g_n_adds < 64; i++)
                if (m->u.window.ev[i].op == PROTO_WIN_ADD) memcpy(g_adds[g_n_adds++], m->u.window.ev[i].key, 32);
        if (m->hdr.type == want) return true;
        proto_msg_free(m);
    }
}

static void send_winstate(proto_conn *pc, uint64_t id, const uint8_t key[32], const uint8_t *data, uint32_t n)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINSTATE;
    m.hdr.req_id = id;
    memcpy(m.u.winstate.key, key, 32);
    m.u.winstate.n_bytes = n;
    m.u.winstate.data = (uint8_t *)data;
    CHECK(proto_send_msg(pc, &m) == PROTO_OK);
}

/* Fetches key from the worker; the bytes it answered (0: not held) into got. */
static uint32_t fetch_state(proto_conn *pc, uint64_t id, const uint8_t key[32], uint8_t *got, size_t cap)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINFETCH;
    m.hdr.req_id = id;
    memcpy(m.u.winfetch.key, key, 32);
    CHECK(proto_send_msg(pc, &m) == PROTO_OK);
    if (!expect_frame(pc, PROTO_WINSTATE, &m)) return 0xffffffffu;
    CHECK(m.hdr.req_id == id && !memcmp(m.u.winstate.key, key, 32));
    uint32_t n = m.u.winstate.n_bytes;
    if (n && n <= cap) memcpy(got, m.u.winstate.data, n);
    proto_msg_free(&m);
    return n;
}

TEST(test_worker_window_frames)
{
    model *m = mk_model();
    CHECK(m != NULL);
    if (!m) return;
    engine *e = NULL;
    sched *s = NULL;
    char err[256];
    engine_opts eo = { .n_threads = 1, .n_kv_blocks = 16, .max_batch_tokens = 128 };
    CHECK(engine_new(m, &eo, &e, err, sizeof err) == ENGINE_OK);
    sched_opts so = { .max_seqs = 2, .max_queue = 4, .step_tokens = 128, .n_ctx = 512, .eos_ids = { -1, -1, -1, -1 } };
    CHECK(e && sched_new(e, &so, &s) == SCHED_OK);
    static const auth_key key = { .secret = "window test cluster key 0123", .n = 28 };
    worker_opts wo = { .role = PROTO_ROLE_PREFILL, .listen = "127.0.0.1:0", .max_seqs = 2, .n_ctx = 512, .key = &key,
                       .heartbeat_ms = 50 };
    worker *w = s ? worker_new(&wo, e, s, NULL, NULL) : NULL;
    CHECK(w != NULL);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", w ? worker_port(w) : 1);
    int fd = w ? proto_connect(addr, 2000) : -1;
    CHECK(fd >= 0);
    proto_conn pc;
    proto_conn_init(&pc, fd);
    struct timeval tv = { 30, 0 };   /* a bound on every wait, never a speed */
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char why[160];
    proto_msg f;
    bool up = fd >= 0 && auth_handshake(&pc, &key, AUTH_SIDE_GATEWAY, why, sizeof why) == AUTH_OK &&
              expect_frame(&pc, PROTO_HELLO, &f);
    CHECK(up);
    if (up) {
        proto_msg_free(&f);
        memset(&f, 0, sizeof f);
        f.hdr.type = PROTO_HELLO;
        f.u.hello.role = PROTO_ROLE_GATEWAY;
        CHECK(proto_send_msg(&pc, &f) == PROTO_OK);

        size_t eb = kvpool_window_state_bytes(engine_kvpool(e));
        uint8_t *st = malloc(eb), *got = malloc(eb);
        for (size_t i = 0; i < eb; i++) st[i] = (uint8_t)(i * 7 + 3);
        uint8_t k1[32] = { 0xab, 1, 2 };
        /* a state that is not this model's size is not kept */
        send_winstate(&pc, 0, k1, st, (uint32_t)eb - 2);
        CHECK(fetch_state(&pc, 1, k1, got, eb) == 0);
        /* one of the right size is kept (counted as a fetch) and served back as it came */
        send_winstate(&pc, 0, k1, st, (uint32_t)eb);
        CHECK(fetch_state(&pc, 2, k1, got, eb) == eb && !memcmp(got, st, eb));
        sched_stats ss;
        sched_get_stats(s, &ss);
        CHECK(ss.window_fetches == 1);

        /* a prefill crossing 128 and 256: both states reported before the HANDOFF */
        int32_t toks[N];
        toks_of(toks, N);
        memset(&f, 0, sizeof f);
        f.hdr.type = PROTO_PREFILL;
        f.hdr.req_id = 3;
        f.u.prefill.params.sample = sample_params_default();
        f.u.prefill.params.sample.temp = 0;
        f.u.prefill.params.max_tokens = 4;
        f.u.prefill.n_prompt = N;
        f.u.prefill.prompt = toks;
        CHECK(proto_send_msg(&pc, &f) == PROTO_OK);
        CHECK(expect_frame(&pc, PROTO_HANDOFF, &f));
        proto_msg_free(&f);
        uint8_t root[32], fp[32], keys[2][32];
        blockkey_root(NULL, 0, root);
        blockkey_pool_fp(m->fingerprint, kvpool_dtype(engine_kvpool(e)), fp);
        blockkey_chain(root, toks, 2, fp, keys);
        int seen = 0;
        for (int i = 0; i < g_n_adds; i++)
            seen |= (!memcmp(g_adds[i], keys[0], 32) ? 1 : 0) | (!memcmp(g_adds[i], keys[1], 32) ? 2 : 0) |
                    (!memcmp(g_adds[i], k1, 32) ? 4 : 0);
        /* the relayed state too: the gateway then knows this worker holds it as well */
        CHECKF(seen == 7, "reported adds: %d, seen %#x", g_n_adds, seen);
        free(st);
        free(got);
    }
    if (fd >= 0) close(fd);
    proto_conn_free(&pc);
    worker_free(w);
    sched_free(s);
    engine_free(e);
    model_free(m);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_window_restore_and_replay);
    RUN(test_worker_window_frames);
    rmdir(tmpdir);
    HARNESS_END();
}
