/*
 * test_worker: prefill and decode workers (src/cluster/worker.h) driven in-process over
 * loopback sockets with the cluster protocol, the test playing the gateway. On a tiny random
 * llama model with a shared temp dir: store, checked: a prompt prefilled on one worker and
 * decoded on another gives exactly the tokens of one scheduler alone (greedy, and sampled with
 * a seed), for prompts shorter than a block, with a partial tail and a whole number of blocks;
 * the handoff carries the tail KV and counts the stored blocks; a resume (DECODE RESUME with
 * tokens already streamed, no KV) continues exactly; a malformed frame closes only that
 * connection (ERROR MALFORMED first); a reasoning budget (flag THINK) forces the think end on
 * the same token split, or resumed before / at / after it, as in one scheduler; CANCEL ends a
 * decode with FINISH cancelled; drain refuses new jobs; a peer that does not prove the cluster
 * key (no handshake, a wrong key) is closed without a HELLO or any job run; twelve concurrent
 * jobs add no thread to the process and each streams what it gets alone; 40 silent strangers
 * take a bounded number of threads and do not keep a gateway out, and past 16 gateways a
 * worker answers ERROR BUSY; a grammar sent with
 * the jobs (flag GRAMMAR) gives a split (and a resumed) run the tokens of one scheduler with
 * that grammar, and one that does not compile is ERROR ARG. Steps stay under 64 tokens
 * (step_tokens 48), see test_sched.c for why.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "harness.h"
#include "schedtest.h"

#include "cache/store.h"
#include "cluster/proto.h"
#include "cluster/worker.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "grammar/grammar.h"

static char tmpdir[] = "/tmp/tm-worker-XXXXXX";
static char g_spec[300];
static model *g_model;
/* reasoning budget of the requests the helpers below build (think_budget 0: none) */
static struct { int budget; int32_t start, end; bool open; } g_think;
static const auth_key g_key = { .secret = "test cluster key 0123456789", .n = 27 };
/* structured output of the requests the helpers build (src NULL: none): token i < 26 is the
 * letter 'a' + i, token 26..98 the two letters 'a' + i % 26, 'a' + i / 26 (a token may end
 * inside the document's next terminal), token 99 has no bytes and is the requests' stop id */
static struct { int kind; const char *src; } g_gram;
static char g_pieces[100][2];
static grammar_vocab *g_vocab;
enum { GRAM_STOP = 99 };

typedef struct {
    schedtest_stack srv;         /* engine, scheduler (+ store) */
    worker *w;
    char addr[64];
} node;

static node node_new(int role)
{
    node v;
    memset(&v, 0, sizeof v);
    schedtest_stack_opts so = { .spec = role ? g_spec : NULL };
    v.srv = schedtest_stack_new(g_model, &so);
    CHECK(v.srv.s != NULL && (!role || v.srv.bio != NULL));
    if (role) {
        worker_opts wo = { .role = role, .listen = "127.0.0.1:0", .name = "t", .heartbeat_ms = 50,
                           .max_seqs = 4, .n_ctx = 1024, .key = &g_key, .gvocab = g_vocab };
        v.w = worker_new(&wo, v.srv.e, v.srv.s, v.srv.st, v.srv.bio);
        CHECK(v.w != NULL);
        if (v.w) snprintf(v.addr, sizeof v.addr, "127.0.0.1:%d", worker_port(v.w));
    }
    return v;
}

static void node_free(node *v)
{
    worker_free(v->w);
    schedtest_stack_free(&v->srv);
}

static sample_params test_sample(float temp)
{
    sample_params sp = sample_params_default();
    sp.temp = temp;
    sp.seed = 1234;
    return sp;
}

/* One scheduler alone: n_gen tokens after prompt. */
static int reference(node *v, const int32_t *prompt, int n, int n_gen, float temp, int32_t *out)
{
    sched_params p = { .prompt = prompt, .n_prompt = n, .max_tokens = n_gen, .ignore_eos = true };
    p.sample = test_sample(temp);
    p.think_budget = g_think.budget;
    p.think_start = g_think.budget > 0 ? g_think.start : -1;   /* a grammar follows think blocks too */
    p.think_end = g_think.budget > 0 ? g_think.end : -1;
    p.think_open = g_think.open;
    grammar *g = NULL;
    char err[256];
    if (g_gram.src) {
        if (grammar_compile((grammar_kind)g_gram.kind, g_gram.src, strlen(g_gram.src), &g, err, sizeof err)) return -1;
        p.grammar = g;
        p.grammar_vocab = g_vocab;
        p.n_stop_ids = 1;
        p.stop_ids[0] = GRAM_STOP;
    }
    int k = schedtest_run(v->srv.s, &p, out, n_gen, NULL);
    grammar_free(g);
    return k < n_gen ? k : n_gen;
}

/* The frame state of each test connection, by descriptor. */
static proto_conn g_conns[4096];
static proto_conn *PC(int fd) { return &g_conns[fd >= 0 && fd < 4096 ? fd : 0]; }

static void gw_close(int fd)
{
    proto_conn_free(PC(fd));
    close(fd);
}

/* The "gateway" side of a connection: connects, proves the key (and checks the worker's
 * proof), exchanges HELLO. */
static int gw_connect(const node *v)
{
    int fd = proto_connect(v->addr, 2000);
    CHECK(fd >= 0);
    if (fd < 0) return -1;
    proto_conn_init(PC(fd), fd);
    char why[160];
    CHECKF(auth_handshake(PC(fd), &g_key, AUTH_SIDE_GATEWAY, why, sizeof why) == AUTH_OK, "%s", why);
    proto_msg m;
    CHECK(proto_recv(PC(fd), &m) == PROTO_OK && m.hdr.type == PROTO_HELLO);
    CHECK(!memcmp(m.u.hello.model_fp, g_model->fingerprint, 32));
    proto_msg_free(&m);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HELLO;
    m.u.hello.role = PROTO_ROLE_GATEWAY;
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    return fd;
}

/* Next frame that is not a HEARTBEAT. */
static proto_status gw_recv(int fd, proto_msg *m)
{
    for (;;) {
        proto_status st = proto_recv(PC(fd), m);
        if (st != PROTO_OK || m->hdr.type != PROTO_HEARTBEAT) return st;
    }
}

static proto_params test_params(int max_tokens, float temp)
{
    proto_params p;
    memset(&p, 0, sizeof p);
    p.sample = test_sample(temp);
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    if (g_think.budget > 0) {   /* sent with PROTO_F_THINK (think_flag) */
        p.think_budget = (uint32_t)g_think.budget;
        p.think_start = g_think.start;
        p.think_end = g_think.end;
        p.think_open = g_think.open;
    }
    if (g_gram.src) {   /* sent with PROTO_F_GRAMMAR (think_flag too) */
        p.grammar_kind = (uint8_t)g_gram.kind;
        p.grammar = (char *)g_gram.src;
        p.grammar_len = (uint32_t)strlen(g_gram.src);
        p.n_stop_ids = 1;
        p.stop_ids[0] = GRAM_STOP;
    }
    return p;
}

/* The flags of the optional sections test_params fills. */
static uint32_t think_flag(void)
{
    return (g_think.budget > 0 ? PROTO_F_THINK : 0) | (g_gram.src ? PROTO_F_GRAMMAR : 0);
}

/* Sends DECODE and collects the streamed tokens after gen into out; returns their count. */
static int gw_decode(int fd, uint64_t id, const int32_t *prompt, int n, const int32_t *gen, int n_gen, int n_sampled,
                     const proto_kv *kv, int max_tokens, float temp, uint32_t flags, int32_t *out, int *reason)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DECODE;
    m.hdr.req_id = id;
    m.hdr.flags = flags | (kv && kv->data ? PROTO_F_HAS_TAIL : 0) | think_flag();
    m.u.decode.params = test_params(max_tokens, temp);
    m.u.decode.prompt = (int32_t *)prompt;
    m.u.decode.n_prompt = (uint32_t)n;
    m.u.decode.gen = (int32_t *)gen;
    m.u.decode.n_gen = (uint32_t)n_gen;
    m.u.decode.n_sampled = (uint32_t)n_sampled;
    if (kv && kv->data) m.u.decode.kv = *kv;
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    int k = 0;
    *reason = 0;
    for (;;) {
        proto_msg r;
        if (gw_recv(fd, &r) != PROTO_OK) break;
        CHECK(r.hdr.req_id == id);
        if (r.hdr.type == PROTO_TOKENS) {
            for (uint32_t i = 0; i < r.u.tokens.n; i++) out[k++] = r.u.tokens.toks[i].token;
        } else if (r.hdr.type == PROTO_FINISH) {
            *reason = r.u.finish.reason;
            CHECK(r.u.finish.completion_tokens == (uint32_t)(n_gen + k));
            proto_msg_free(&r);
            break;
        } else if (r.hdr.type == PROTO_ERROR) {
            *reason = -(int)r.u.error.code;
            proto_msg_free(&r);
            break;
        } else {
            CHECKF(0, "unexpected frame %s", proto_type_name(r.hdr.type));
            proto_msg_free(&r);
            break;
        }
        proto_msg_free(&r);
    }
    return k;
}

/* PREFILL on pf, DECODE on df: the whole generation (first token included) into out. */
static int split_run(int pf, int df, uint64_t id, const int32_t *prompt, int n, int n_gen, float temp, int32_t *out,
                     proto_handoff *ho)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = id;
    m.hdr.flags = think_flag();
    m.u.prefill.params = test_params(n_gen, temp);
    m.u.prefill.prompt = (int32_t *)prompt;
    m.u.prefill.n_prompt = (uint32_t)n;
    CHECK(proto_send_msg(PC(pf), &m) == PROTO_OK);
    proto_msg h;
    if (gw_recv(pf, &h) != PROTO_OK) return -1;
    CHECKF(h.hdr.type == PROTO_HANDOFF && h.hdr.req_id == id, "got %s", proto_type_name(h.hdr.type));
    if (h.hdr.type != PROTO_HANDOFF) {
        proto_msg_free(&h);
        return -1;
    }
    *ho = h.u.handoff;
    out[0] = h.u.handoff.first.token;
    int reason;
    int k = gw_decode(df, id, prompt, n, out, 1, (int)h.u.handoff.n_sampled,
                      (h.hdr.flags & PROTO_F_HAS_TAIL) ? &h.u.handoff.kv : NULL, n_gen, temp, 0, out + 1, &reason);
    CHECK(reason == (g_gram.src ? PROTO_FINISH_STOP : PROTO_FINISH_LENGTH));
    proto_msg_free(&h);
    ho->kv.data = NULL;
    return 1 + k;
}

static void make_prompt(int32_t *p, int n, int seed)
{
    for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 37 + seed * 11 + (i * i) % 13) % 100);
}

TEST(test_split_equals_one_process)
{
    node ref = node_new(0), P = node_new(PROTO_ROLE_PREFILL), D = node_new(PROTO_ROLE_DECODE);
    int pf = gw_connect(&P), df = gw_connect(&D);
    static const int lens[] = { 90, 300, 256, 200 };
    for (int t = 0; t < 2; t++) {
        float temp = t ? 0.9f : 0;
        for (size_t li = 0; li < TM_ARRAY_LEN(lens); li++) {
            int n = lens[li], n_gen = 24;
            int32_t prompt[400], want[64], got[64];
            make_prompt(prompt, n, (int)li + 10 * t);
            CHECK(reference(&ref, prompt, n, n_gen, temp, want) == n_gen);
            proto_handoff ho;
            memset(&ho, 0, sizeof ho);
            int k = split_run(pf, df, 100 + li + 10 * (uint64_t)t, prompt, n, n_gen, temp, got, &ho);
            CHECKF(k == n_gen, "len %d temp %.1f: %d tokens", n, temp, k);
            CHECKF(k == n_gen && !memcmp(want, got, sizeof want[0] * (size_t)n_gen), "len %d temp %.1f: tokens differ", n,
                   temp);
            CHECK(ho.n_prompt == (uint32_t)n);
            if (t == 0) {
                CHECKF(ho.n_stored == (uint32_t)(n / 128 * 128), "len %d: stored %u", n, ho.n_stored);
                CHECK(ho.kv.n == (uint32_t)(n % 128));
            }
        }
    }
    /* the same prompt again: a cache hit on the prefill worker (its RAM tier / the store) */
    int32_t prompt[300], got[64];
    make_prompt(prompt, 300, 1);
    proto_handoff ho;
    CHECK(split_run(pf, df, 200, prompt, 300, 8, 0, got, &ho) == 8);
    CHECK(ho.n_cached == 299);   /* 2 blocks, and the rows the first run kept after them */
    gw_close(pf);
    gw_close(df);
    node_free(&ref);
    node_free(&P);
    node_free(&D);
}

TEST(test_resume_and_mixed)
{
    node ref = node_new(0), M = node_new(PROTO_ROLE_MIXED), D = node_new(PROTO_ROLE_DECODE);
    int mf = gw_connect(&M), df = gw_connect(&D);
    int32_t prompt[300], want[40], got[40];
    make_prompt(prompt, 300, 5);
    CHECK(reference(&ref, prompt, 300, 40, 0, want) == 40);
    /* prefill + decode on the mixed worker */
    proto_handoff ho;
    CHECK(split_run(mf, mf, 1, prompt, 300, 40, 0, got, &ho) == 40);
    CHECK(!memcmp(want, got, sizeof want));
    /* a decode worker "died" after 17 tokens: resume on another from the tokens streamed */
    int reason;
    int k = gw_decode(df, 2, prompt, 300, want, 17, 0, NULL, 40, 0, PROTO_F_RESUME, got, &reason);
    CHECK(k == 23 && reason == PROTO_FINISH_LENGTH);
    CHECK(!memcmp(want + 17, got, 23 * sizeof got[0]));
    /* a prefill-role worker refuses DECODE jobs */
    gw_close(mf);
    gw_close(df);
    node_free(&ref);
    node_free(&M);
    node_free(&D);
}

/* The reasoning budget travels with the jobs: a split run forces the think end where one
 * scheduler does, and so does a resume from any point (before the end, right at it, after
 * it): the worker replays the count and the open block from the tokens streamed. Ids
 * outside the vocabulary are refused with ERROR ARG. */
TEST(test_think_budget_split_and_resume)
{
    node ref = node_new(0), P = node_new(PROTO_ROLE_PREFILL), D = node_new(PROTO_ROLE_DECODE);
    int pf = gw_connect(&P), df = gw_connect(&D);
    enum { N = 200, G = 24 };
    int32_t prompt[N], free_run[G], want[G], got[G];
    make_prompt(prompt, N, 21);
    memset(&g_think, 0, sizeof g_think);
    CHECK(reference(&ref, prompt, N, G, 0, free_run) == G);
    int32_t end = 0;   /* an id the free run never produced stands for </think> */
    for (int i = 0; i < G; i++)
        if (free_run[i] == end) end++, i = -1;
    for (int t = 0; t < 2; t++) {
        /* t 0: the prompt opened the block (DeepSeek-R1), budget 4: token 4 is forced;
         * t 1: the model opens it with its 2nd token, budget 3 */
        int first = 0;
        if (t == 0) g_think = (typeof(g_think)){ .budget = 4, .start = -1, .end = end, .open = true };
        else {
            g_think = (typeof(g_think)){ .budget = 3, .start = free_run[1], .end = end, .open = false };
            while (free_run[first] != free_run[1]) first++;
            first++;   /* tokens up to and including the "<think>" */
        }
        int at = first + g_think.budget;   /* where the end is forced */
        CHECK(reference(&ref, prompt, N, G, 0, want) == G);
        CHECKF(want[at] == end && !memcmp(want, free_run, (size_t)at * sizeof want[0]), "t %d: reference", t);
        proto_handoff ho;
        memset(&ho, 0, sizeof ho);
        CHECK(split_run(pf, df, 300 + (uint64_t)t, prompt, N, G, 0, got, &ho) == G);
        CHECKF(!memcmp(want, got, sizeof want), "t %d: split run differs", t);
        /* a decode worker "died" after k streamed tokens: resume elsewhere */
        const int ks[] = { 1, at - 1, at, at + 1, at + 5 };
        for (size_t i = 0; i < TM_ARRAY_LEN(ks); i++) {
            int k = ks[i], reason;
            if (k < 1) continue;
            memset(got, 0xff, sizeof got);
            int n = gw_decode(df, 310 + 10 * (uint64_t)t + i, prompt, N, want, k, 0, NULL, G, 0, PROTO_F_RESUME, got,
                              &reason);
            CHECKF(n == G - k && reason == PROTO_FINISH_LENGTH, "t %d resume at %d: %d tokens, reason %d", t, k, n,
                   reason);
            CHECKF(!memcmp(want + k, got, (size_t)(G - k) * sizeof got[0]), "t %d resume at %d: tokens differ", t, k);
        }
    }
    /* ids beyond the vocabulary (100): the job is refused, the connection stays */
    int reason;
    g_think = (typeof(g_think)){ .budget = 4, .start = -1, .end = 100, .open = true };
    CHECK(gw_decode(df, 400, prompt, N, want, 2, 0, NULL, G, 0, PROTO_F_RESUME, got, &reason) == 0);
    CHECK(reason == -PROTO_E_ARG);
    g_think = (typeof(g_think)){ .budget = 4, .start = 100, .end = end, .open = false };
    CHECK(gw_decode(df, 401, prompt, N, want, 2, 0, NULL, G, 0, PROTO_F_RESUME, got, &reason) == 0);
    CHECK(reason == -PROTO_E_ARG);
    memset(&g_think, 0, sizeof g_think);
    CHECK(gw_decode(df, 402, prompt, N, free_run, 2, 0, NULL, G, 0, PROTO_F_RESUME, got, &reason) == G - 2);
    CHECK(reason == PROTO_FINISH_LENGTH && !memcmp(free_run + 2, got, (G - 2) * sizeof got[0]));
    gw_close(pf);
    gw_close(df);
    node_free(&ref);
    node_free(&P);
    node_free(&D);
}

TEST(test_malformed_closes_only_that_connection)
{
    node D = node_new(PROTO_ROLE_DECODE);
    int good = gw_connect(&D), bad = gw_connect(&D);
    /* a frame with a bad magic */
    uint8_t junk[64];
    memset(junk, 0xab, sizeof junk);
    CHECK(proto_send(bad, junk, sizeof junk) == PROTO_OK);
    proto_msg m;
    proto_status st = gw_recv(bad, &m);
    CHECK(st == PROTO_OK && m.hdr.type == PROTO_ERROR && m.hdr.req_id == 0 && m.u.error.code == PROTO_E_MALFORMED);
    proto_msg_free(&m);
    CHECK(gw_recv(bad, &m) != PROTO_OK);   /* closed */
    gw_close(bad);
    /* an oversized one, and a payload that does not decode */
    bad = gw_connect(&D);
    bytebuf b = { 0 };
    proto_put_u32(&b, PROTO_MAGIC);
    proto_put_u16(&b, PROTO_VERSION);
    proto_put_u16(&b, PROTO_DECODE);
    proto_put_u32(&b, 0);
    proto_put_u64(&b, 1);
    proto_put_u32(&b, 7);
    proto_put_bytes(&b, "garbage", 7);
    CHECK(proto_send_frame(PC(bad), b.p, b.len) == PROTO_OK);   /* tagged right, undecodable */
    st = gw_recv(bad, &m);
    CHECK(st == PROTO_OK && m.hdr.type == PROTO_ERROR && m.u.error.code == PROTO_E_MALFORMED);
    proto_msg_free(&m);
    CHECK(gw_recv(bad, &m) != PROTO_OK);
    gw_close(bad);
    bytebuf_free(&b);
    /* the good connection still works: a resume from scratch */
    int32_t prompt[50], gen[1] = { 3 }, got[16];
    make_prompt(prompt, 50, 9);
    int reason;
    CHECK(gw_decode(good, 5, prompt, 50, gen, 1, 0, NULL, 6, 0, PROTO_F_RESUME, got, &reason) == 5);
    CHECK(reason == PROTO_FINISH_LENGTH);
    /* a PREFILL to a decode worker: ERROR ROLE for that request */
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = 6;
    m.u.prefill.params = test_params(4, 0);
    m.u.prefill.prompt = prompt;
    m.u.prefill.n_prompt = 50;
    CHECK(proto_send_msg(PC(good), &m) == PROTO_OK);
    CHECK(gw_recv(good, &m) == PROTO_OK && m.hdr.type == PROTO_ERROR && m.hdr.req_id == 6 &&
          m.u.error.code == PROTO_E_ROLE);
    proto_msg_free(&m);
    /* cancel a long decode */
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DECODE;
    m.hdr.req_id = 7;
    m.u.decode.params = test_params(900, 0);
    m.u.decode.prompt = prompt;
    m.u.decode.n_prompt = 50;
    m.u.decode.gen = gen;
    m.u.decode.n_gen = 1;
    CHECK(proto_send_msg(PC(good), &m) == PROTO_OK);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_CANCEL;
    m.hdr.req_id = 7;
    CHECK(proto_send_msg(PC(good), &m) == PROTO_OK);
    int reason2 = 0;
    for (;;) {
        if (gw_recv(good, &m) != PROTO_OK) break;
        int t = m.hdr.type;
        if (t == PROTO_FINISH) reason2 = m.u.finish.reason;
        proto_msg_free(&m);
        if (t == PROTO_FINISH) break;
    }
    CHECK(reason2 == PROTO_FINISH_CANCELLED);
    /* drain: DRAIN announced, new work refused, DRAIN done when idle */
    worker_drain(D.w, 5000);
    bool saw_drain = false, saw_done = false;
    for (int i = 0; i < 100 && !saw_done; i++) {
        if (gw_recv(good, &m) != PROTO_OK) break;
        if (getenv("TM_TEST_VERBOSE")) fprintf(stderr, "frame %s\n", proto_type_name(m.hdr.type));
        if (m.hdr.type == PROTO_DRAIN) {
            if (m.u.drain.done) saw_done = true;
            else saw_drain = true;
        }
        proto_msg_free(&m);
    }
    /* DRAIN done is broadcast just before the flag is set (so that it is sent before
     * `tokenmill worker` sees the flag and closes): wait a moment for the flag */
    if (saw_done) WAIT_UNTIL(worker_drained(D.w), 30);
    CHECK(saw_drain && saw_done && worker_drained(D.w));
    CHECK(gw_decode(good, 8, prompt, 50, gen, 1, 0, NULL, 6, 0, PROTO_F_RESUME, got, &reason) == 0);
    CHECK(reason == -PROTO_E_DRAINING);
    gw_close(good);
    node_free(&D);
}

/* Reads what the worker sends on an unauthenticated connection until it closes: true when it
 * closed without ever sending a HELLO or a job's frame (HANDOFF, TOKENS, FINISH). */
static bool closed_without_service(proto_conn *c)
{
    for (int i = 0; i < 100; i++) {
        proto_msg m;
        proto_status st = proto_recv(c, &m);
        if (st != PROTO_OK) return st == PROTO_ERR_CLOSED || st == PROTO_ERR_IO;
        int t = m.hdr.type;
        proto_msg_free(&m);
        if (t == PROTO_HELLO || t == PROTO_HANDOFF || t == PROTO_TOKENS || t == PROTO_FINISH) return false;
    }
    return false;
}

/* A "gateway" that does not prove the cluster key gets nothing: with no handshake (HELLO and a
 * PREFILL straight away, as a replayed recording of an old session would send) the worker sends
 * its CHALLENGE and closes; with a wrong key the handshake is refused both ways (ERROR AUTH).
 * The worker keeps serving a gateway with the key. */
TEST(test_refuses_peer_without_key)
{
    node M = node_new(PROTO_ROLE_MIXED);
    struct timeval tv = { 30, 0 };   /* a bound on every wait, never a speed */
    int32_t prompt[40];
    make_prompt(prompt, 40, 4);
    /* no handshake */
    int fd = proto_connect(M.addr, 2000);
    CHECK(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn c;
    proto_conn_init(&c, fd);
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HELLO;
    m.u.hello.role = PROTO_ROLE_GATEWAY;
    CHECK(proto_send_msg(&c, &m) == PROTO_OK);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = 1;
    m.u.prefill.params = test_params(4, 0);
    m.u.prefill.prompt = prompt;
    m.u.prefill.n_prompt = 40;
    CHECK(proto_send_msg(&c, &m) == PROTO_OK);
    CHECK(proto_recv(&c, &m) == PROTO_OK && m.hdr.type == PROTO_CHALLENGE);   /* its first frame */
    CHECK(closed_without_service(&c));
    close(fd);
    /* a wrong key */
    fd = proto_connect(M.addr, 2000);
    CHECK(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn_init(&c, fd);
    auth_key wrong = { .secret = "test cluster key 0123456780", .n = 27 };
    char why[160];
    CHECK(auth_handshake(&c, &wrong, AUTH_SIDE_GATEWAY, why, sizeof why) == AUTH_ERR_REFUSED);
    CHECK(!c.sealed);
    CHECK(closed_without_service(&c));
    proto_conn_free(&c);
    close(fd);
    /* the key */
    int good = gw_connect(&M);
    int32_t gen[1] = { 3 }, got[16];
    int reason;
    CHECK(gw_decode(good, 5, prompt, 40, gen, 1, 0, NULL, 6, 0, PROTO_F_RESUME, got, &reason) == 5);
    CHECK(reason == PROTO_FINISH_LENGTH);
    gw_close(good);
    node_free(&M);
}

/* A grammar travels with the jobs as its source: the prefill worker samples the first token
 * under it, the decode worker replays that token through the automaton and goes on, so a split
 * run (sampled, seeded) gives exactly the tokens of one scheduler with the same grammar, a
 * document of the language ended by the stop id; so does a resume. A source that does not
 * compile, and generated tokens that leave the grammar, are refused with ERROR ARG (the
 * connection stays). */
TEST(test_grammar_split_equals_one_process)
{
    node ref = node_new(0), P = node_new(PROTO_ROLE_PREFILL), D = node_new(PROTO_ROLE_DECODE);
    int pf = gw_connect(&P), df = gw_connect(&D);
    enum { N = 200, G = 16 };
    int32_t prompt[N], want[G], got[G];
    make_prompt(prompt, N, 33);
    g_gram.kind = GRAMMAR_KIND_REGEX;
    g_gram.src = "[a-c]{2,6}";
    for (int t = 0; t < 3; t++) {
        float temp = t ? 1.0f : 0;
        int nw = reference(&ref, prompt, N, G, temp, want);
        char doc[2 * G + 1];
        int nd = 0;
        bool stopped = nw >= 2 && want[nw - 1] == GRAM_STOP;
        for (int i = 0; i < nw - stopped; i++) {
            doc[nd++] = g_pieces[want[i]][0];
            if (want[i] >= 26) doc[nd++] = g_pieces[want[i]][1];
        }
        doc[nd] = 0;
        CHECKF(stopped && nd >= 2 && nd <= 6 && strspn(doc, "abc") == (size_t)nd, "t %d: reference %d tokens, \"%s\"",
               t, nw, doc);
        proto_handoff ho;
        memset(&ho, 0, sizeof ho);
        memset(got, 0xff, sizeof got);
        int n = split_run(pf, df, 500 + (uint64_t)t, prompt, N, G, temp, got, &ho);
        CHECKF(n == nw && !memcmp(want, got, (size_t)nw * sizeof want[0]), "t %d: split run gives %d tokens, %d alone",
               t, n, nw);
        /* a decode worker "died" after 2 streamed tokens: resumed elsewhere, the grammar replayed */
        int reason;
        n = gw_decode(df, 510 + (uint64_t)t, prompt, N, want, 2, temp > 0 ? 2 : 0, NULL, G, temp, PROTO_F_RESUME, got,
                      &reason);
        CHECKF(n == nw - 2 && reason == PROTO_FINISH_STOP && !memcmp(want + 2, got, (size_t)n * sizeof got[0]),
               "t %d: resume gives %d tokens, reason %d", t, n, reason);
    }
    /* a regex that does not compile: ERROR ARG naming the grammar, on either job type */
    int reason;
    g_gram.src = "(ab";
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = 520;
    m.hdr.flags = think_flag();
    m.u.prefill.params = test_params(G, 0);
    m.u.prefill.prompt = prompt;
    m.u.prefill.n_prompt = N;
    CHECK(proto_send_msg(PC(pf), &m) == PROTO_OK);
    proto_msg e;
    CHECK(gw_recv(pf, &e) == PROTO_OK);
    CHECKF(e.hdr.type == PROTO_ERROR && e.hdr.req_id == 520 && e.u.error.code == PROTO_E_ARG && e.u.error.msg &&
           !strncmp(e.u.error.msg, "grammar: ", 9), "got %s %s", proto_type_name(e.hdr.type),
           e.hdr.type == PROTO_ERROR && e.u.error.msg ? e.u.error.msg : "");
    proto_msg_free(&e);
    CHECK(gw_decode(df, 521, prompt, N, want, 1, 0, NULL, G, 0, 0, got, &reason) == 0 && reason == -PROTO_E_ARG);
    /* tokens generated elsewhere that leave the grammar (token 25 is "z") */
    g_gram.src = "[a-c]{2,6}";
    int32_t off[1] = { 25 };
    CHECK(gw_decode(df, 522, prompt, N, off, 1, 0, NULL, G, 0, 0, got, &reason) == 0 && reason == -PROTO_E_ARG);
    /* the connections still serve */
    CHECK(gw_decode(df, 523, prompt, N, want, 2, 0, NULL, G, 0, PROTO_F_RESUME, got, &reason) >= 1);
    memset(&g_gram, 0, sizeof g_gram);
    gw_close(pf);
    gw_close(df);
    node_free(&ref);
    node_free(&P);
    node_free(&D);
}

/* Threads of process pid now. */
static int count_tasks_of(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* What connects cannot multiply the worker's threads: 40 silent strangers on its port take a
 * bounded number of handshake threads (their table is full: the oldest are cut), a gateway with
 * the key still gets in among them, and of 20 gateways with the key past the handshake at once
 * the worker serves 16 and refuses the rest with ERROR BUSY. */
TEST(test_connections_bounded)
{
    node M = node_new(PROTO_ROLE_MIXED);
    int base = count_tasks_of(getpid());
    CHECK(base > 0);
    enum { N_SILENT = 40, N_GW = 20, MAX_PEERS = 16 };
    int silent[N_SILENT];
    for (int i = 0; i < N_SILENT; i++) {
        silent[i] = proto_connect(M.addr, 2000);
        CHECK(silent[i] >= 0);
    }
    usleep(300 * 1000);   /* every one accepted by now */
    int extra = count_tasks_of(getpid()) - base;
    CHECKF(extra <= 16, "%d threads for %d silent connections", extra, N_SILENT);
    int fd = gw_connect(&M);   /* among them: let in */
    CHECK(fd >= 0);
    gw_close(fd);
    for (int i = 0; i < N_SILENT; i++) close(silent[i]);
    int gws[N_GW], n_in = 0, n_busy = 0;
    for (int i = 0; i < N_GW; i++) {
        gws[i] = proto_connect(M.addr, 2000);
        CHECK(gws[i] >= 0);
        proto_conn_init(PC(gws[i]), gws[i]);
        struct timeval tv = { 30, 0 };   /* a bound on every wait, never a speed */
        setsockopt(gws[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char why[160];
        CHECKF(auth_handshake(PC(gws[i]), &g_key, AUTH_SIDE_GATEWAY, why, sizeof why) == AUTH_OK, "%s", why);
        proto_msg m;
        CHECK(proto_recv(PC(gws[i]), &m) == PROTO_OK);
        if (m.hdr.type == PROTO_HELLO) n_in++;
        if (m.hdr.type == PROTO_ERROR && m.u.error.code == PROTO_E_BUSY) n_busy++;
        proto_msg_free(&m);
    }
    CHECKF(n_in == MAX_PEERS && n_busy == N_GW - MAX_PEERS, "%d in, %d refused busy", n_in, n_busy);
    for (int i = 0; i < N_GW; i++) gw_close(gws[i]);
    node_free(&M);
}

/* Jobs take no thread of their own: with twelve jobs on one connection (four running, eight
 * queued in the scheduler) the process has no more threads than before they came, and
 * concurrent jobs multiplexed on the pumps stream exactly the tokens each gets alone, every
 * job's frames in order and ended by its own FINISH (CANCEL ends the long ones). */
TEST(test_concurrent_jobs_take_no_threads)
{
    node ref = node_new(0), M = node_new(PROTO_ROLE_MIXED);
    int fd = gw_connect(&M);
    int base = count_tasks_of(getpid());
    CHECK(base > 0);
    enum { N = 12, N_SHORT = 6, SHORT = 10 };
    int32_t prompts[N][24], got[N][SHORT];
    int n_got[N] = { 0 }, reason[N] = { 0 }, n_done = 0, n_started = 0, during = -1;
    for (int i = 0; i < N; i++) make_prompt(prompts[i], 24, 40 + i);
    for (int i = 0; i < N; i++) {
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_DECODE;   /* prompt[0..23), then prompt[23] as if generated */
        m.hdr.req_id = (uint64_t)(i + 1);
        m.u.decode.params = test_params(i < N_SHORT ? SHORT : 900, 0);
        m.u.decode.prompt = prompts[i];
        m.u.decode.n_prompt = 23;
        m.u.decode.gen = &prompts[i][23];
        m.u.decode.n_gen = 1;
        CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    }
    for (int k = 0; k < 100000 && n_done < N; k++) {
        proto_msg r;
        if (gw_recv(fd, &r) != PROTO_OK) break;
        int i = (int)r.hdr.req_id - 1;
        CHECKF(i >= 0 && i < N, "id %llu", (unsigned long long)r.hdr.req_id);
        if (i < 0 || i >= N) {
            proto_msg_free(&r);
            break;
        }
        if (r.hdr.type == PROTO_TOKENS) {
            CHECKF(!reason[i], "tokens of job %d after its FINISH", i);
            if (n_got[i] == 0) n_started++;
            for (uint32_t t = 0; t < r.u.tokens.n; t++)
                if (n_got[i] < SHORT) got[i][n_got[i]++] = r.u.tokens.toks[t].token;
            if (during < 0 && n_started >= 4) {
                /* four jobs running, the rest queued: count now, then cancel the long ones */
                during = count_tasks_of(getpid());
                for (int c = N_SHORT; c < N; c++) {
                    proto_msg x;
                    memset(&x, 0, sizeof x);
                    x.hdr.type = PROTO_CANCEL;
                    x.hdr.req_id = (uint64_t)(c + 1);
                    CHECK(proto_send_msg(PC(fd), &x) == PROTO_OK);
                }
            }
        } else if (r.hdr.type == PROTO_FINISH) {
            CHECKF(!reason[i], "a second FINISH for job %d", i);
            reason[i] = r.u.finish.reason;
            n_done++;
        } else {
            CHECKF(0, "unexpected %s for job %d", proto_type_name(r.hdr.type), i);
        }
        proto_msg_free(&r);
    }
    CHECK(n_done == N);
    CHECKF(during >= 0 && during <= base + 1, "%d threads with %d jobs in, %d before", during, N, base);
    for (int i = 0; i < N; i++)
        CHECKF(reason[i] == (i < N_SHORT ? PROTO_FINISH_LENGTH : PROTO_FINISH_CANCELLED), "job %d: finish %d", i,
               reason[i]);
    /* job i continues prompt[0..23) after the token prompt[23]: one scheduler, same context */
    for (int i = 0; i < N_SHORT; i++) {
        int32_t alone[SHORT];
        sched_params p = { .prompt = prompts[i], .n_prompt = 23, .max_tokens = SHORT, .ignore_eos = true,
                           .gen = &prompts[i][23], .n_gen = 1 };
        p.sample = test_sample(0);
        int k = schedtest_run(ref.srv.s, &p, alone, SHORT, NULL);
        CHECKF(k == SHORT - 1 && n_got[i] == SHORT - 1 && !memcmp(alone, got[i], (size_t)k * sizeof alone[0]),
               "job %d: %d tokens, %d alone", i, n_got[i], k);
    }
    gw_close(fd);
    node_free(&ref);
    node_free(&M);
}

int main(void)
{
    util_log_level = LOG_LEVEL_ERROR;
    if (!(g_model = schedtest_open(tmpdir, 7))) return 1;
    snprintf(g_spec, sizeof g_spec, "dir:%s/store", tmpdir);
    const char *bytes[100];
    int lens[100];
    for (int i = 0; i < 100; i++) {
        g_pieces[i][0] = (char)('a' + i % 26);
        g_pieces[i][1] = (char)('a' + i / 26);
        bytes[i] = g_pieces[i];
        lens[i] = i == GRAM_STOP ? 0 : i < 26 ? 1 : 2;
    }
    g_vocab = grammar_vocab_new(100, bytes, lens);
    RUN(test_split_equals_one_process);
    RUN(test_resume_and_mixed);
    RUN(test_think_budget_split_and_resume);
    RUN(test_malformed_closes_only_that_connection);
    RUN(test_refuses_peer_without_key);
    RUN(test_concurrent_jobs_take_no_threads);
    RUN(test_connections_bounded);
    RUN(test_grammar_split_equals_one_process);
    grammar_vocab_free(g_vocab);
    schedtest_close(tmpdir, g_model);
    HARNESS_END();
}
