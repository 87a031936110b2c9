/*
 * test_gateway: the gateway (src/cluster/gateway.h) in-process, with its API backend called
 * directly (no HTTP), against real workers (src/cluster/worker.h) that register with it and
 * against a fake worker played by the test over the protocol. On a tiny random llama model
 * with a shared temp dir: store. Checked:
 *   - a split run through the gateway gives the tokens of one scheduler alone, and /metrics
 *     then reports the learned prefill speed and the KV handoff cost (send and receive side,
 *     both populated; no timing is asserted), and the learned step-time curve a warm worker
 *     reports in its heartbeats;
 *   - a registered worker that sends a well-formed frame with a bad value (a token id beyond
 *     the vocabulary, in HANDOFF and in TOKENS; an unknown request id; tail KV of another
 *     geometry; more tokens than max_tokens) has its connection closed, and its request is
 *     rerouted like a dead worker's: it completes on a real worker with exactly the reference
 *     tokens, the client never seeing a value of the refused frame;
 *   - strangers on the registration port (no key, a wrong key, a replayed recording of a real
 *     worker's session) are refused at the handshake and never listed; a worker doing the
 *     handshake as docs/protocol.md writes it (HMACs computed here) is listed;
 *   - 34 strangers trickling a byte each every 400 ms do not keep a worker out (a full
 *     handshake table makes room), and none outlives the handshake's absolute deadline;
 *   - a worker whose name another live worker has is refused (ERROR NAME instead of the
 *     gateway's HELLO), the same worker reconnecting is not;
 *   - a static worker stuck in its handshake (it accepts TCP, never answers) delays neither the
 *     start nor the dispatcher (a request moved off a worker is placed on another, one left
 *     with no worker ends UNAVAILABLE after the wait timeout, not as an engine error) nor the
 *     gateway's exit, which cuts that handshake short;
 *   - a worker that stays connected and heartbeats but makes no progress on a request (after
 *     two tokens of its decode; on its prefill) loses it after the progress deadline: it completes elsewhere
 *     with exactly the reference tokens;
 *   - every cluster connection sends small frames at once: each connected TCP socket of the
 *     process (gateway and worker, the side that connected and the side that accepted, with a
 *     registered worker and a static one) has TCP_NODELAY set; and the gateway's share of each
 *     request's latency is counted in tokenmill_gateway_added_seconds (a one-token request,
 *     ended by the worker's FINISH, and a handed-off one; the values are not asserted);
 *   - with two idle fake workers, a request whose first blocks another request is prefilling
 *     on one of them goes to that one (not to the idle one), counted as shared in flight; an
 *     unrelated prompt then goes to the idle one;
 *   - a request's grammar travels as its source (flag GRAMMAR), and a worker's refusal of it
 *     (ERROR ARG), or of a prompt longer than it takes (ERROR TOO_LONG), ends the request
 *     REFUSED, not as an engine error;
 *   - window states: a prefill worker reports the state at 256 (WINDOW); the DECODE after its
 *     HANDOFF waits for the state fetched from it (WINFETCH) and reaches the decode worker right
 *     after it (WINSTATE, then DECODE); a holder that answers nothing, or does not answer, only
 *     delays the DECODE (bounded), counted as failed fetches.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "harness.h"
#include "schedtest.h"

#include "cache/store.h"
#include "cluster/gateway.h"
#include "cluster/gateway_int.h"
#include "cache/blockkey.h"
#include "cluster/proto.h"
#include "grammar/grammar.h"
#include "cluster/worker.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"

#define N_VOCAB 100
#define N_GEN 12

static char tmpdir[] = "/tmp/tm-gateway-XXXXXX";
static const auth_key g_key = { .secret = "gateway test cluster key 42", .n = 27 };
/* the frame state of each fake worker's connection, by descriptor */
static proto_conn g_conns[4096];
static proto_conn *PC(int fd) { return &g_conns[fd >= 0 && fd < 4096 ? fd : 0]; }
static char g_spec[300];
static model *g_model;
static char tmpdir2[] = "/tmp/tm-gateway2-XXXXXX";
static model *g_model2;      /* another tiny model (other weights): a second served model */

typedef struct {          /* one engine + scheduler (+ store), optionally serving as a worker */
    schedtest_stack srv;
    worker *w;
} node;

static node node_new_of(model *m, bool with_store)
{
    node v;
    memset(&v, 0, sizeof v);
    schedtest_stack_opts so = { .spec = with_store ? g_spec : NULL };
    v.srv = schedtest_stack_new(m, &so);
    CHECK(v.srv.s != NULL && (!with_store || v.srv.bio != NULL));
    return v;
}

static node node_new(bool with_store) { return node_new_of(g_model, with_store); }

/* Starts the node's worker, registering with the gateway at reg, announcing model_id (NULL:
 * none). */
static void node_serve_model(node *v, int role, const char *reg, const char *name, const char *model_id)
{
    worker_opts wo = { .role = role, .gateway = reg, .name = name, .model_id = model_id, .heartbeat_ms = 50,
                       .max_seqs = 4, .n_ctx = 1024, .key = &g_key };
    v->w = worker_new(&wo, v->srv.e, v->srv.s, v->srv.st, v->srv.bio);
    CHECK(v->w != NULL);
}

static void node_serve(node *v, int role, const char *reg, const char *name) { node_serve_model(v, role, reg, name, NULL); }

static void node_stop(node *v)
{
    worker_free(v->w);
    v->w = NULL;
}

static void node_free(node *v)
{
    node_stop(v);
    schedtest_stack_free(&v->srv);
}

static void make_prompt(int32_t *p, int n, int seed)
{
    for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 31 + seed * 7 + (i * i) % 11) % N_VOCAB);
}

static sched_params greedy(const int32_t *prompt, int n)
{
    sched_params p;
    memset(&p, 0, sizeof p);
    p.prompt = prompt;
    p.n_prompt = n;
    p.sample = sample_params_default();
    p.sample.temp = 0;
    p.max_tokens = N_GEN;
    p.ignore_eos = true;
    return p;
}

/* One scheduler alone: the reference tokens. */
static int reference(node *v, const int32_t *prompt, int n, int32_t *out)
{
    sched_params p = greedy(prompt, n);
    int k = schedtest_run(v->srv.s, &p, out, N_GEN, NULL);
    return k < N_GEN ? k : N_GEN;
}

/* Polls a gateway request to its end; its tokens into out (at most cap), the finish in *fin. */
static int collect(const api_backend *be, sched_req *h, int32_t *out, int cap, sched_finish *fin)
{
    sched_output o[16];
    int k = 0;
    *fin = SCHED_FINISH_NONE;
    for (int rounds = 0; rounds < 600 && *fin == SCHED_FINISH_NONE; rounds++) {   /* 600 x 100 ms at most */
        int m = be->poll(be->ud, h, o, 16, 100);
        for (int i = 0; i < m; i++) {
            if (o[i].kind == SCHED_OUT_TOKEN) {
                if (k < cap) out[k] = o[i].token;
                k++;
            } else {
                *fin = o[i].finish;
            }
        }
    }
    return k;
}

static char *metrics_text(const api_backend *be)
{
    bytebuf b = { 0 };
    be->metrics(be->ud, &b);
    bytebuf_append(&b, "", 1);
    return b.p;
}

/* The value of the first metric line starting with prefix (labels included), or -1. */
static double metric(const api_backend *be, const char *prefix)
{
    char *t = metrics_text(be);
    double v = -1;
    for (char *line = t; line && *line;) {
        char *nl = strchr(line, '\n');
        if (!strncmp(line, prefix, strlen(prefix))) {
            char *sp = nl ? nl : line + strlen(line);
            while (sp > line && sp[-1] != ' ') sp--;
            v = atof(sp);
            break;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(t);
    return v;
}

static bool metrics_has(const api_backend *be, const char *needle)
{
    char *t = metrics_text(be);
    bool r = strstr(t, needle) != NULL;
    free(t);
    return r;
}

/* Workers the gateway counts up (tokenmill_worker_up ... 1). */
static int workers_up(const api_backend *be)
{
    char *t = metrics_text(be);
    int n = 0;
    for (char *p = t; (p = strstr(p, "tokenmill_worker_up{")); p++) {
        char *nl = strchr(p, '\n');
        if (nl && nl - p > 2 && nl[-1] == '1' && nl[-2] == ' ') n++;
    }
    free(t);
    return n;
}

typedef struct {
    gateway *g;
    const api_backend *be;
    char reg[64];
} gw_env;

static const char *g_static_prefill;   /* a --prefill address for the next gateway (NULL: none) */

/* A gateway taking registrations on a free port; progress_s: its stall deadlines (first and next
 * token), 0 for the defaults; hb_s, wait_s: its heartbeat and wait timeouts, 0 for 60 s (never,
 * in a test). */
static gw_env gw_start_opts(double progress_s, double handshake_s, double hb_s, double wait_s)
{
    gw_env v;
    memset(&v, 0, sizeof v);
    gateway_model gm = { .model = g_model, .name = "tiny", .n_ctx = 1024, .eos_ids = { -1, -1, -1, -1 } };
    gateway_opts o = { .models = &gm, .n_models = 1, .register_listen = "127.0.0.1:0",
                       .heartbeat_timeout_s = hb_s > 0 ? hb_s : 60, .wait_timeout_s = wait_s > 0 ? wait_s : 60, .key = &g_key,
                       .progress_first_s = progress_s, .progress_next_s = progress_s, .handshake_timeout_s = handshake_s };
    if (g_static_prefill) {
        o.prefill = &g_static_prefill;
        o.n_prefill = 1;
    }
    char err[256];
    CHECK(gateway_new(&o, &v.g, err, sizeof err) == GATEWAY_OK);
    v.be = gateway_backend(v.g, 0);
    snprintf(v.reg, sizeof v.reg, "127.0.0.1:%d", gateway_register_port(v.g));
    return v;
}

static gw_env gw_start_progress(double progress_s) { return gw_start_opts(progress_s, 0, 0, 0); }
static gw_env gw_start(void) { return gw_start_opts(0, 0, 0, 0); }

TEST(test_split_run_and_handoff_metrics)
{
    /* the reference without the store, so that P computes the whole prompt */
    node ref = node_new(false), P = node_new(true), D = node_new(true);
    gw_env G = gw_start();
    node_serve(&P, PROTO_ROLE_PREFILL, G.reg, "p");
    node_serve(&D, PROTO_ROLE_DECODE, G.reg, "d");
    CHECK(WAIT_UNTIL(workers_up(G.be) == 2, 30));
    /* 300 tokens: two full blocks through the store and a 44-token tail in the handoff */
    int32_t prompt[300], want[N_GEN], got[N_GEN + 4];
    make_prompt(prompt, 300, 1);
    CHECK(reference(&ref, prompt, 300, want) == N_GEN);
    sched_params sp = greedy(prompt, 300);
    sched_req *h = NULL;
    CHECK(G.be->submit(G.be->ud, &sp, &h) == SCHED_OK);
    sched_finish fin;
    int k = collect(G.be, h, got, N_GEN + 4, &fin);
    G.be->release(G.be->ud, h);
    CHECKF(k == N_GEN && fin == SCHED_FINISH_LENGTH, "%d tokens, finish %d", k, fin);
    CHECK(k == N_GEN && !memcmp(want, got, sizeof want));
    /* the heartbeats bring the handoff cost and the prefill speed to the gateway's /metrics */
    /* handoff_tokens_total: the prompt on the send side; 256 from the store + the 44-token
     * tail on the receive side */
    CHECK(WAIT_UNTIL(metrics_has(G.be, "role=\"prefill\",side=\"send\"} 300\n"), 30));
    CHECK(WAIT_UNTIL(metrics_has(G.be, "role=\"decode\",side=\"receive\"} 300\n"), 30));
    CHECK(metrics_has(G.be, "tokenmill_worker_handoffs_total{"));
    CHECK(metrics_has(G.be, "tokenmill_worker_handoff_seconds_total{"));
    CHECK(metric(G.be, "tokenmill_handoff_seconds_per_token ") > 0);
    CHECK(WAIT_UNTIL(metric(G.be, "tokenmill_recompute_seconds_per_token ") > 0, 30));
    /* 300 computed tokens: the speed was learned (no longer the 20000 tokens/s default) */
    CHECK(WAIT_UNTIL(metric(G.be, "tokenmill_worker_prefill_tokens_per_second{") != 20000, 30));
    CHECK(metric(G.be, "tokenmill_worker_prefill_tokens_per_second{") > 0);
    /* the decode worker has run more steps than its step-time model needs to warm up: its
     * heartbeats carry the learned curve (the prefill balancer's cost for a worker that has one) */
    CHECK(WAIT_UNTIL(metrics_has(G.be, "tokenmill_worker_step_curve_seconds{worker="), 30));
    CHECK(metrics_has(G.be, "role=\"decode\",term=\"prefill_token\"}"));
    node_stop(&P);
    node_stop(&D);
    gateway_shutdown(G.g);
    gateway_free(G.g);
    node_free(&ref);
    node_free(&P);
    node_free(&D);
}

/* ---- a fake worker ---- */

static int g_fake_role = PROTO_ROLE_MIXED;   /* the role fake workers register with */
static const char *g_fake_name;              /* and their name (NULL: fakeN, each its own) */
static const char *g_fake_listen = "127.0.0.1:1"; /* and listen address */

static void fake_hello(proto_msg *m)
{
    memset(m, 0, sizeof *m);
    m->hdr.type = PROTO_HELLO;
    m->hdr.flags = PROTO_F_REGISTER;
    m->u.hello.role = (uint8_t)g_fake_role;
    m->u.hello.kv_dtype = QTYPE_F16;   /* the real nodes' pool type: one KV type per model */
    memcpy(m->u.hello.model_fp, g_model->fingerprint, 32);
    m->u.hello.max_seqs = 4;
    m->u.hello.kv_blocks = 32;
    m->u.hello.max_batch_tokens = 128;
    m->u.hello.n_ctx = 1024;
    m->u.hello.n_vocab = N_VOCAB;
    m->u.hello.listen = (char *)g_fake_listen;
    static char names[256][16];   /* each fake its own name: a gateway refuses a taken one */
    static int n_names;
    char *name = names[n_names++ % 256];
    snprintf(name, sizeof names[0], "fake%d", n_names);
    m->u.hello.name = g_fake_name ? (char *)g_fake_name : name;
}

static void fake_close(int fd)
{
    proto_conn_free(PC(fd));
    close(fd);
}

/* A fake worker: connects to the registration port, does the handshake with key (the gateway's
 * own when NULL), and registers with HELLO when it succeeded. The descriptor (its frame state in
 * PC(fd)), or -1 when the gateway refused the key. */
static int fake_connect_key(const gw_env *G, const auth_key *key)
{
    int fd = proto_connect(G->reg, 2000);
    CHECK(fd >= 0);
    if (fd < 0) return -1;
    struct timeval tv = { 30, 0 };   /* a bound on every wait, never a speed */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn_init(PC(fd), fd);
    char why[160];
    if (auth_handshake(PC(fd), key ? key : &g_key, AUTH_SIDE_WORKER, why, sizeof why) != AUTH_OK) {
        fake_close(fd);
        return -1;
    }
    proto_msg m;
    fake_hello(&m);
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    return fd;
}

static int fake_connect(const gw_env *G)
{
    int fd = fake_connect_key(G, NULL);
    CHECK(fd >= 0);
    return fd;
}

/* A rogue without the key: HELLO (REGISTER) straight away, no handshake. */
static int fake_connect_nokey(const gw_env *G)
{
    int fd = proto_connect(G->reg, 2000);
    CHECK(fd >= 0);
    if (fd < 0) return -1;
    struct timeval tv = { 30, 0 };   /* a bound on every wait, never a speed */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn_init(PC(fd), fd);
    proto_msg m;
    fake_hello(&m);
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    return fd;
}

/* HMAC-SHA256(key, label | side | n1 | n2), as docs/protocol.md writes the proofs and session
 * keys: computed here independently of cluster/auth.c. */
static void doc_hmac(const auth_key *k, const char *label, char side, const uint8_t *n1, const uint8_t *n2, uint8_t out[32])
{
    uint8_t buf[96];
    size_t n = strlen(label);
    memcpy(buf, label, n);
    buf[n++] = (uint8_t)side;
    memcpy(buf + n, n1, 32);
    memcpy(buf + n + 32, n2, 32);
    unsigned int len = 0;
    HMAC(EVP_sha256(), k->secret, (int)k->n, buf, n + 64, out, &len);
}

/* A worker that does the handshake by the document (not with auth.c), registers, and records
 * every byte it sent in rec: CHALLENGE, PROOF, the tagged HELLO. Checks the gateway's proof. */
static int fake_connect_by_doc(const gw_env *G, bytebuf *rec)
{
    int fd = proto_connect(G->reg, 2000);
    CHECK(fd >= 0);
    if (fd < 0) return -1;
    struct timeval tv = { 30, 0 };   /* a bound on every wait, never a speed */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn *c = PC(fd);
    proto_conn_init(c, fd);
    uint8_t nw[32], ng[32], mac[32];
    for (int i = 0; i < 32; i++) nw[i] = (uint8_t)(i * 13 + 7);
    proto_msg m, r;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_CHALLENGE;
    memcpy(m.u.challenge.nonce, nw, 32);
    CHECK(proto_encode(rec, &m) == PROTO_OK);
    CHECK(proto_send_msg(c, &m) == PROTO_OK);
    CHECK(proto_recv(c, &r) == PROTO_OK && r.hdr.type == PROTO_CHALLENGE);
    memcpy(ng, r.u.challenge.nonce, 32);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PROOF;
    doc_hmac(&g_key, "TMCP-PROOF", 'W', nw, ng, m.u.proof.mac);
    CHECK(proto_encode(rec, &m) == PROTO_OK);
    CHECK(proto_send_msg(c, &m) == PROTO_OK);
    CHECK(proto_recv(c, &r) == PROTO_OK && r.hdr.type == PROTO_PROOF);
    doc_hmac(&g_key, "TMCP-PROOF", 'G', ng, nw, mac);
    CHECK(!memcmp(mac, r.u.proof.mac, 32));   /* the gateway holds the key too */
    doc_hmac(&g_key, "TMCP-KEY", 'W', nw, ng, c->tx.key);
    doc_hmac(&g_key, "TMCP-KEY", 'G', ng, nw, c->rx.key);
    c->sealed = true;
    fake_hello(&m);
    size_t at = rec->len;
    CHECK(proto_encode(rec, &m) == PROTO_OK);
    uint8_t tag[AUTH_TAG_SIZE];
    CHECK(auth_dir_tag(&c->tx, rec->p + at, PROTO_HDR_SIZE, rec->p + at + PROTO_HDR_SIZE, rec->len - at - PROTO_HDR_SIZE, tag));
    proto_put_bytes(rec, tag, sizeof tag);
    CHECK(proto_send(fd, rec->p + at, rec->len - at) == PROTO_OK);
    return fd;
}

/* Next frame of type want (HELLO and HEARTBEAT skipped); false when the connection ended. */
static bool fake_expect(int fd, int want, proto_msg *m)
{
    for (;;) {
        if (proto_recv(PC(fd), m) != PROTO_OK) return false;
        if (m->hdr.type == want) return true;
        proto_msg_free(m);
    }
}

/* Two fake workers up, each past the gateway's HELLO (then a readable fake has a job). */
static bool fake_connect_two(gw_env *G, int fd[2])
{
    fd[0] = fake_connect(G), fd[1] = fake_connect(G);
    if (!WAIT_UNTIL(workers_up(G->be) == 2, 30)) return false;
    for (int i = 0; i < 2; i++) {
        proto_msg m;
        if (!fake_expect(fd[i], PROTO_HELLO, &m)) return false;
        proto_msg_free(&m);
    }
    return true;
}

/* True when the gateway sends ERROR MALFORMED (id 0, with a reason) and then closes the
 * connection; other frames before it are read and dropped. */
static bool fake_refused(int fd)
{
    bool told = false;
    for (;;) {
        proto_msg m;
        proto_status st = proto_recv(PC(fd), &m);
        if (st == PROTO_ERR_CLOSED) return told;
        if (st == PROTO_ERR_IO) return told && errno != EAGAIN && errno != EWOULDBLOCK;
        if (st != PROTO_OK) return false;
        if (m.hdr.type == PROTO_ERROR && m.hdr.req_id == 0 && m.u.error.code == PROTO_E_MALFORMED && m.u.error.msg &&
            m.u.error.msg[0])
            told = true;
        proto_msg_free(&m);
    }
}

/* Submits p to the gateway (its handle in *h) and takes the PREFILL that the fake worker on fd
 * gets for it: the request's protocol id (0, and a failed check, when none came). */
static uint64_t fake_submit(const gw_env *G, int fd, const sched_params *p, sched_req **h)
{
    *h = NULL;
    CHECK(G->be->submit(G->be->ud, p, h) == SCHED_OK);
    proto_msg m;
    if (!fake_expect(fd, PROTO_PREFILL, &m)) {
        CHECKF(false, "no PREFILL: the connection ended");
        return 0;
    }
    uint64_t id = m.hdr.req_id;
    proto_msg_free(&m);
    return id;
}

static void fake_handoff(int fd, uint64_t id, int n_prompt, int32_t first, const proto_kv *kv)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HANDOFF;
    m.hdr.req_id = id;
    m.u.handoff.first.token = first;
    m.u.handoff.n_prompt = (uint32_t)n_prompt;
    m.u.handoff.n_computed = (uint32_t)n_prompt;
    if (kv) {
        m.hdr.flags = PROTO_F_HAS_TAIL;
        m.u.handoff.kv = *kv;
    }
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
}

static void fake_tokens(int fd, uint64_t id, const int32_t *toks, int n)
{
    proto_tok t[64];
    memset(t, 0, sizeof t);
    for (int i = 0; i < n; i++) t[i].token = toks[i];
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_TOKENS;
    m.hdr.req_id = id;
    m.u.tokens.n = (uint32_t)n;
    m.u.tokens.toks = t;
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
}

typedef enum {
    BAD_HANDOFF_TOKEN,    /* HANDOFF whose first token is >= the vocabulary */
    BAD_TOKENS_TOKEN,     /* after a good HANDOFF, DECODE: TOKENS [good, >= vocabulary] */
    BAD_UNKNOWN_ID,       /* TOKENS for a request id the gateway never issued */
    BAD_TAIL_GEOMETRY,    /* HANDOFF with tail KV of one layer too many */
    BAD_TOO_MANY,         /* after a good HANDOFF, DECODE: TOKENS past max_tokens */
    BAD_N
} bad_case;

static const char *bad_name[BAD_N] = { "handoff token", "tokens token", "unknown id", "tail geometry", "too many tokens" };

TEST(test_bad_values_close_the_worker_and_reroute)
{
    node ref = node_new(false), R = node_new(true);
    gw_env G = gw_start();
    int n_prompt = 40;
    int32_t prompt[40], want[N_GEN];
    make_prompt(prompt, n_prompt, 5);
    CHECK(reference(&ref, prompt, n_prompt, want) == N_GEN);
    for (int c = 0; c < BAD_N; c++) {
        CHECKF(WAIT_UNTIL(workers_up(G.be) == 0, 30), "%s: a worker is still up", bad_name[c]);
        int fd = fake_connect(&G);
        CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
        double refused0 = metric(G.be, "tokenmill_gateway_refused_values_total ");
        sched_params sp = greedy(prompt, n_prompt);
        sched_req *h = NULL;
        CHECK(G.be->submit(G.be->ud, &sp, &h) == SCHED_OK);
        proto_msg m;
        CHECKF(fake_expect(fd, PROTO_PREFILL, &m), "%s: no PREFILL", bad_name[c]);
        uint64_t id = m.hdr.req_id;
        CHECK(m.u.prefill.n_prompt == (uint32_t)n_prompt);
        proto_msg_free(&m);
        int32_t bad[N_GEN + 2];
        switch (c) {
        case BAD_HANDOFF_TOKEN:
            fake_handoff(fd, id, n_prompt, N_VOCAB, NULL);
            break;
        case BAD_UNKNOWN_ID:
            fake_tokens(fd, id + 1000, want, 1);
            break;
        case BAD_TAIL_GEOMETRY: {
            const model_hparams *hp = &g_model->hp;
            proto_kv kv = { .dtype = QTYPE_F32, .n_parts = 2, .n_layers = (uint16_t)(hp->n_layers + 1), .n_kv_heads = (uint16_t)hp->n_kv_heads,
                            .head_dim = (uint16_t)hp->head_dim, .start = 0, .n = (uint32_t)n_prompt };
            kv.n_bytes = (uint32_t)proto_kv_bytes(QTYPE_F32, 2, kv.n_layers, kv.n_kv_heads, kv.head_dim, n_prompt);
            kv.data = calloc(1, kv.n_bytes);
            fake_handoff(fd, id, n_prompt, want[0], &kv);
            free(kv.data);
            break;
        }
        case BAD_TOKENS_TOKEN:
        case BAD_TOO_MANY:
            /* a correct first token: the client gets it; then the decode part goes wrong */
            fake_handoff(fd, id, n_prompt, want[0], NULL);
            CHECKF(fake_expect(fd, PROTO_DECODE, &m), "%s: no DECODE", bad_name[c]);
            CHECK(m.hdr.req_id == id && m.u.decode.n_gen == 1 && m.u.decode.gen[0] == want[0]);
            proto_msg_free(&m);
            if (c == BAD_TOKENS_TOKEN) {
                bad[0] = want[1];
                bad[1] = N_VOCAB + 5;
                fake_tokens(fd, id, bad, 2);
            } else {
                for (int i = 0; i < N_GEN; i++) bad[i] = want[1 + i % (N_GEN - 1)];
                fake_tokens(fd, id, bad, N_GEN);   /* 1 + N_GEN > max_tokens */
            }
            break;
        }
        CHECKF(fake_refused(fd), "%s: no ERROR MALFORMED before the close", bad_name[c]);
        fake_close(fd);
        CHECKF(metric(G.be, "tokenmill_gateway_refused_values_total ") == refused0 + 1, "%s: not counted", bad_name[c]);
        /* the request waits for a worker, then completes on a real one, exactly */
        node_serve(&R, PROTO_ROLE_MIXED, G.reg, "real");
        int32_t got[N_GEN + 4];
        sched_finish fin;
        int k = collect(G.be, h, got, N_GEN + 4, &fin);
        G.be->release(G.be->ud, h);
        CHECKF(k == N_GEN && fin == SCHED_FINISH_LENGTH, "%s: %d tokens, finish %d", bad_name[c], k, fin);
        CHECKF(k == N_GEN && !memcmp(want, got, sizeof want), "%s: tokens differ from the reference", bad_name[c]);
        node_stop(&R);
    }
    gateway_shutdown(G.g);
    gateway_free(G.g);
    node_free(&ref);
    node_free(&R);
}

/* A request that every worker it meets answers wrongly (here: a handoff token out of the
 * vocabulary, refused each time, the worker closed): it is moved at most GW_MAX_MOVES times,
 * then fails, instead of circling between reconnecting workers for ever. */
TEST(test_request_moved_too_often_fails)
{
    gw_env G = gw_start();
    int n_prompt = 24;
    int32_t prompt[24];
    make_prompt(prompt, n_prompt, 7);
    sched_req *h = NULL;
    int sent = 0;
    for (int i = 0; i <= GW_MAX_MOVES; i++) {   /* moved GW_MAX_MOVES times: sent GW_MAX_MOVES + 1 */
        CHECKF(WAIT_UNTIL(workers_up(G.be) == 0, 30), "round %d: a worker is still up", i);
        int fd = fake_connect(&G);
        CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
        if (i == 0) {
            sched_params sp = greedy(prompt, n_prompt);
            CHECK(G.be->submit(G.be->ud, &sp, &h) == SCHED_OK);
        }
        proto_msg m;
        if (!fake_expect(fd, PROTO_PREFILL, &m)) {
            fake_close(fd);
            break;
        }
        uint64_t id = m.hdr.req_id;
        proto_msg_free(&m);
        sent++;
        fake_handoff(fd, id, n_prompt, N_VOCAB, NULL);
        CHECKF(fake_refused(fd), "round %d: no ERROR MALFORMED", i);
        fake_close(fd);
    }
    CHECKF(sent == GW_MAX_MOVES + 1, "sent %d times, want %d", sent, GW_MAX_MOVES + 1);
    int32_t got[N_GEN + 4];
    sched_finish fin = SCHED_FINISH_LENGTH;
    int k = h ? collect(G.be, h, got, N_GEN + 4, &fin) : -1;
    if (h) G.be->release(G.be->ud, h);
    CHECKF(k == 0 && fin == SCHED_FINISH_ERROR, "%d tokens, finish %d", k, fin);
    gateway_shutdown(G.g);
    gateway_free(G.g);
}

/* A frame that does not decode (bad magic): the gateway says ERROR MALFORMED, closes that
 * connection and counts it; a worker that connects next is served. */
TEST(test_malformed_frame_is_answered_and_closed)
{
    gw_env G = gw_start();
    CHECK(WAIT_UNTIL(workers_up(G.be) == 0, 30));
    int fd = fake_connect(&G);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
    double refused0 = metric(G.be, "tokenmill_gateway_refused_connections_total ");
    uint8_t junk[PROTO_HDR_SIZE];
    memset(junk, 0x5a, sizeof junk);
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    CHECK(fake_refused(fd));
    fake_close(fd);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 0, 30));
    CHECK(metric(G.be, "tokenmill_gateway_refused_connections_total ") == refused0 + 1);
    fd = fake_connect(&G);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
    fake_close(fd);
    gateway_shutdown(G.g);
    gateway_free(G.g);
}

/* Strangers on the registration port: one with no key (HELLO straight away), one with a wrong
 * key, one replaying every byte a real worker sent in an earlier session. Each is refused at the
 * handshake, counted, and never listed as a worker (so never sent a request); a worker with the
 * key that follows the document byte for byte is listed. */
TEST(test_rogue_workers_refused)
{
    gw_env G = gw_start();
    double r0 = metric(G.be, "tokenmill_gateway_refused_handshakes_total ");
    CHECK(r0 == 0);
    /* no key */
    int fd = fake_connect_nokey(&G);
    CHECK(WAIT_UNTIL(metric(G.be, "tokenmill_gateway_refused_handshakes_total ") == r0 + 1, 30));
    proto_msg m;
    CHECK(!fake_expect(fd, PROTO_PREFILL, &m));   /* closed without a job */
    fake_close(fd);
    CHECK(workers_up(G.be) == 0);
    /* a wrong key: refused both ways */
    auth_key wrong = g_key;
    wrong.secret[0] ^= 0x20;
    CHECK(fake_connect_key(&G, &wrong) == -1);
    CHECK(WAIT_UNTIL(metric(G.be, "tokenmill_gateway_refused_handshakes_total ") == r0 + 2, 30));
    CHECK(workers_up(G.be) == 0);
    /* the key, by the document: listed; its bytes recorded */
    bytebuf rec = { 0 };
    fd = fake_connect_by_doc(&G, &rec);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
    fake_close(fd);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 0, 30));
    /* the recording replayed on a new connection */
    fd = proto_connect(G.reg, 2000);
    CHECK(fd >= 0);
    struct timeval tv = { 30, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn_init(PC(fd), fd);
    CHECK(proto_send(fd, rec.p, rec.len) == PROTO_OK);
    CHECK(WAIT_UNTIL(metric(G.be, "tokenmill_gateway_refused_handshakes_total ") == r0 + 3, 30));
    CHECK(!fake_expect(fd, PROTO_PREFILL, &m));
    fake_close(fd);
    CHECK(workers_up(G.be) == 0);
    bytebuf_free(&rec);
    gateway_shutdown(G.g);
    gateway_free(G.g);
}

/* Strangers that open connections to the registration port and trickle into each the bytes
 * of a handshake without the key (a CHALLENGE, then a PROOF of zeros), one byte per connection
 * every 400 ms: well within any per-read timeout, and 45 s to the end. */
#define N_TRICKLE 34
typedef struct {
    int fd[N_TRICKLE];
    uint8_t bytes[2 * (PROTO_HDR_SIZE + 32)];
    int stop;                 /* __atomic */
    pthread_t t;
} trickle;

static void *trickle_thread(void *p)
{
    trickle *tr = p;
    for (size_t k = 1; k < sizeof tr->bytes && !__atomic_load_n(&tr->stop, __ATOMIC_ACQUIRE); k++) {
        for (int i = 0; i < 10 && !__atomic_load_n(&tr->stop, __ATOMIC_ACQUIRE); i++) usleep(40 * 1000);
        for (int i = 0; i < N_TRICKLE; i++)
            if (tr->fd[i] >= 0) (void)send(tr->fd[i], tr->bytes + k, 1, MSG_NOSIGNAL);
    }
    return NULL;
}

static void trickle_start(trickle *tr, const gw_env *G)
{
    memset(tr, 0, sizeof *tr);
    bytebuf b = { 0 };
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_CHALLENGE;
    CHECK(proto_encode(&b, &m) == PROTO_OK);
    m.hdr.type = PROTO_PROOF;
    CHECK(proto_encode(&b, &m) == PROTO_OK);
    CHECK(b.len == sizeof tr->bytes);
    memcpy(tr->bytes, b.p, sizeof tr->bytes);
    bytebuf_free(&b);
    for (int i = 0; i < N_TRICKLE; i++) {
        tr->fd[i] = proto_connect(G->reg, 2000);
        CHECK(tr->fd[i] >= 0);
        if (tr->fd[i] >= 0) CHECK(send(tr->fd[i], tr->bytes, 1, MSG_NOSIGNAL) == 1);
    }
    CHECK(!pthread_create(&tr->t, NULL, trickle_thread, tr));
}

static void trickle_stop(trickle *tr)
{
    __atomic_store_n(&tr->stop, 1, __ATOMIC_RELEASE);
    pthread_join(tr->t, NULL);
    for (int i = 0; i < N_TRICKLE; i++)
        if (tr->fd[i] >= 0) close(tr->fd[i]);
}

/* How many of the n sockets the peer has not closed within s seconds (what it sent before is
 * read and dropped). */
static int open_after(const int *fd, int n, double s)
{
    double end = util_now() + s;
    bool closed[N_TRICKLE] = { 0 };
    int n_open = n;
    char buf[256];
    while (n_open > 0 && util_now() < end) {
        struct pollfd p[N_TRICKLE];
        for (int i = 0; i < n; i++) p[i] = (struct pollfd){ .fd = closed[i] ? -1 : fd[i], .events = POLLIN };
        if (poll(p, (nfds_t)n, 100) <= 0) continue;
        for (int i = 0; i < n; i++) {
            if (closed[i] || !p[i].revents) continue;
            ssize_t k = recv(fd[i], buf, sizeof buf, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                closed[i] = true;
                n_open--;
            }
        }
    }
    return n_open;
}

/* Strangers cannot keep workers out. 34 keyless connections that trickle a byte each every
 * 400 ms fill the registration port's handshake table (32); a real worker that comes next
 * registers all the same (a full table makes room by cutting the oldest stranger), and none of
 * the strangers outlives the handshake's deadline, however steadily its bytes come. */
TEST(test_trickling_strangers_do_not_keep_workers_out)
{
    node R = node_new(false);
    gw_env G = gw_start_opts(0, 60, 0, 0);   /* a deadline that plays no part: room is made by eviction */
    trickle tr;
    trickle_start(&tr, &G);
    usleep(300 * 1000);   /* every trickler accepted and in its handshake */
    node_serve(&R, PROTO_ROLE_MIXED, G.reg, "real");   /* retries every second, as --gateway does */
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 10));
    node_stop(&R);
    trickle_stop(&tr);
    gateway_shutdown(G.g);
    gateway_free(G.g);
    node_free(&R);

    gw_env H = gw_start_opts(0, 1, 0, 0);    /* the whole handshake within 1 s */
    trickle_start(&tr, &H);
    int n_open = open_after(tr.fd, N_TRICKLE, 10);   /* a bound, far below the trickle's 45 s */
    CHECKF(n_open == 0, "%d trickling strangers still connected", n_open);
    trickle_stop(&tr);
    gateway_shutdown(H.g);
    gateway_free(H.g);
}

/* Names tell workers apart (/admin/drain picks one by name): a second live worker with a name
 * already taken is refused with ERROR NAME instead of the gateway's HELLO, never listed; the
 * same name from the same worker (its listen address, its host) is not another worker. */
TEST(test_worker_names_unique)
{
    gw_env G = gw_start();
    g_fake_name = "twin";
    int a = fake_connect(&G);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
    proto_msg m;
    CHECK(proto_recv(PC(a), &m) == PROTO_OK && m.hdr.type == PROTO_HELLO);   /* taken in */
    proto_msg_free(&m);
    g_fake_listen = "127.0.0.1:2";
    int b = fake_connect(&G);
    CHECK(proto_recv(PC(b), &m) == PROTO_OK);
    CHECKF(m.hdr.type == PROTO_ERROR && m.hdr.req_id == 0 && m.u.error.code == PROTO_E_NAME && m.u.error.msg &&
               strstr(m.u.error.msg, "\"twin\" is taken by the worker at 127.0.0.1:1"),
           "got %s %s", proto_type_name(m.hdr.type), m.hdr.type == PROTO_ERROR ? m.u.error.msg : "");
    proto_msg_free(&m);
    CHECK(!fake_expect(b, PROTO_HELLO, &m));   /* then closed, never greeted */
    fake_close(b);
    CHECK(workers_up(G.be) == 1);
    /* the first one's address again: the same worker (reconnected), not refused */
    g_fake_listen = "127.0.0.1:1";
    b = fake_connect(&G);
    CHECK(proto_recv(PC(b), &m) == PROTO_OK && m.hdr.type == PROTO_HELLO);
    proto_msg_free(&m);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 2, 30));
    fake_close(a);
    fake_close(b);
    g_fake_name = NULL;
    gateway_shutdown(G.g);
    gateway_free(G.g);
}

/* Heartbeats for a fake worker that has stopped working but not stopped living. */
typedef struct {
    int fd;
    int stop;                 /* __atomic */
    pthread_t t;
} hb_pump;

static void *hb_pump_thread(void *p)
{
    hb_pump *h = p;
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HEARTBEAT;
    while (!__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE)) {
        if (proto_send_msg(PC(h->fd), &m) != PROTO_OK) break;
        usleep(100 * 1000);
    }
    return NULL;
}

/* A worker that is up (connected, never silent long enough to be dropped) but makes no progress
 * on a request is treated as dead for it: after the progress deadline the request moves to
 * another worker with the tokens it has, and completes with exactly the reference tokens. Once
 * stuck after two tokens of its decode (the next-token deadline), once on the prefill (the
 * first-token deadline). */
TEST(test_stalled_worker_rerouted)
{
    node ref = node_new(false), R = node_new(true);
    gw_env G = gw_start_progress(2);
    int n_prompt = 40;
    int32_t prompt[40], want[N_GEN], got[N_GEN + 4];
    make_prompt(prompt, n_prompt, 6);
    CHECK(reference(&ref, prompt, n_prompt, want) == N_GEN);
    for (int c = 0; c < 2; c++) {
        const char *what = c ? "prefill stall" : "decode stall";
        CHECK(WAIT_UNTIL(workers_up(G.be) == 0, 30));
        int fd = fake_connect(&G);
        CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
        double stalls0 = metric(G.be, "tokenmill_gateway_stalls_total ");
        sched_params sp = greedy(prompt, n_prompt);
        sched_req *h = NULL;
        CHECK(G.be->submit(G.be->ud, &sp, &h) == SCHED_OK);
        proto_msg m;
        CHECKF(fake_expect(fd, PROTO_PREFILL, &m), "%s: no PREFILL", what);
        uint64_t id = m.hdr.req_id;
        proto_msg_free(&m);
        if (c == 0) {   /* the right first token and two more, then nothing */
            fake_handoff(fd, id, n_prompt, want[0], NULL);
            CHECKF(fake_expect(fd, PROTO_DECODE, &m), "%s: no DECODE", what);
            proto_msg_free(&m);
            fake_tokens(fd, id, want + 1, 2);
        }
        /* the fake goes on heartbeating (it is not dead) and a real worker comes */
        hb_pump hb = { .fd = fd };
        pthread_create(&hb.t, NULL, hb_pump_thread, &hb);
        node_serve(&R, PROTO_ROLE_MIXED, G.reg, "real");
        sched_finish fin;
        int k = collect(G.be, h, got, N_GEN + 4, &fin);
        G.be->release(G.be->ud, h);
        CHECKF(k == N_GEN && fin == SCHED_FINISH_LENGTH, "%s: %d tokens, finish %d", what, k, fin);
        CHECKF(k == N_GEN && !memcmp(want, got, sizeof want), "%s: tokens differ from the reference", what);
        CHECKF(metric(G.be, "tokenmill_gateway_stalls_total ") >= stalls0 + 1, "%s: not counted", what);
        node_stop(&R);
        __atomic_store_n(&hb.stop, 1, __ATOMIC_RELEASE);
        pthread_join(hb.t, NULL);
        fake_close(fd);
    }
    gateway_shutdown(G.g);
    gateway_free(G.g);
    node_free(&ref);
    node_free(&R);
}

/* Polls what h has now (no wait): its tokens appended to out at *k (at most cap), its finish
 * into *fin when it came. */
static void poll_now(const api_backend *be, sched_req *h, int32_t *out, int cap, int *k, sched_finish *fin)
{
    sched_output o[16];
    int m;
    while ((m = be->poll(be->ud, h, o, 16, 0)) > 0)
        for (int i = 0; i < m; i++) {
            if (o[i].kind != SCHED_OUT_TOKEN) *fin = o[i].finish;
            else if (*k < cap) out[(*k)++] = o[i].token;
        }
}

/* A request decoding on a fake worker that goes silent once the gateway drains: the gateway
 * declares the worker dead and the request waits for another decode worker. Returns its handle
 * with the 3 tokens streamed so far in got (*k), checked not to have ended after a wait of
 * several times wait_s (the gateway's wait timeout). */
static sched_req *drain_with_silent_worker(gw_env *G, const int32_t *prompt, int n_prompt, const int32_t *want,
                                           int32_t *got, int *k, double wait_s)
{
    int fd = fake_connect(G);
    hb_pump hb = { .fd = fd };   /* alive until the drain */
    pthread_create(&hb.t, NULL, hb_pump_thread, &hb);
    CHECK(WAIT_UNTIL(workers_up(G->be) == 1, 30));
    sched_params sp = greedy(prompt, n_prompt);
    sched_req *h;
    uint64_t id = fake_submit(G, fd, &sp, &h);
    proto_msg m;
    fake_handoff(fd, id, n_prompt, want[0], NULL);
    CHECK(fake_expect(fd, PROTO_DECODE, &m));
    proto_msg_free(&m);
    fake_tokens(fd, id, want + 1, 2);
    sched_finish fin = SCHED_FINISH_NONE;
    *k = 0;
    CHECK(WAIT_UNTIL((poll_now(G->be, h, got, N_GEN + 4, k, &fin), *k == 3), 30));
    gateway_drain(G->g);
    __atomic_store_n(&hb.stop, 1, __ATOMIC_RELEASE);
    pthread_join(hb.t, NULL);
    CHECK(WAIT_UNTIL(workers_up(G->be) == 0, 30));   /* missed heartbeats: out, the request waits */
    usleep((useconds_t)(4 * wait_s * 1e6));
    poll_now(G->be, h, got, N_GEN + 4, k, &fin);
    CHECKF(fin == SCHED_FINISH_NONE && *k == 3, "the waiting request ended (finish %d, %d tokens) while the gateway drains",
           fin, *k);
    fake_close(fd);
    return h;
}

/* While the gateway drains, the drain's deadline bounds a request's wait for a worker, not the
 * wait timeout: a stream moved off a decode worker that died during the drain (here: a fake
 * that stopped heartbeating after two tokens of its decode) waits past the wait timeout; it
 * resumes on a worker that comes within the drain (exactly the reference tokens), and
 * gateway_abort (the drain's deadline) ends one still waiting as ABORTED (incomplete) with the
 * tokens it had, never as an engine error. */
TEST(test_drain_waits_for_a_worker_past_wait_timeout)
{
    node ref = node_new(false), R = node_new(true);
    /* the fake's heartbeats come every 0.1 s: a 1 s timeout dropped it under a sanitizer on a
     * loaded 2-core machine before its tokens came (the request then ended UNAVAILABLE) */
    const double hb_s = 3, wait_s = 0.5;
    int n_prompt = 40, k;
    int32_t prompt[40], want[N_GEN], got[N_GEN + 4];
    make_prompt(prompt, n_prompt, 9);
    CHECK(reference(&ref, prompt, n_prompt, want) == N_GEN);
    /* a worker comes back within the drain: the stream resumes there */
    gw_env G = gw_start_opts(0, 0, hb_s, wait_s);
    sched_req *h = drain_with_silent_worker(&G, prompt, n_prompt, want, got, &k, wait_s);
    node_serve(&R, PROTO_ROLE_MIXED, G.reg, "real");
    sched_finish fin;
    int n = collect(G.be, h, got + k, N_GEN + 4 - k, &fin);
    G.be->release(G.be->ud, h);
    CHECKF(k + n == N_GEN && fin == SCHED_FINISH_LENGTH, "resumed: %d tokens, finish %d", k + n, fin);
    CHECK(k + n == N_GEN && !memcmp(want, got, sizeof want));
    CHECK(gateway_wait_idle(G.g, 0) == 0);
    node_stop(&R);
    gateway_shutdown(G.g);
    gateway_free(G.g);
    /* none comes: the drain's deadline (gateway_abort) ends it as incomplete */
    G = gw_start_opts(0, 0, hb_s, wait_s);
    h = drain_with_silent_worker(&G, prompt, n_prompt, want, got, &k, wait_s);
    CHECK(gateway_wait_idle(G.g, 0) == 1);
    gateway_abort(G.g);
    n = collect(G.be, h, got + k, N_GEN + 4 - k, &fin);
    G.be->release(G.be->ud, h);
    CHECKF(n == 0 && fin == SCHED_FINISH_ABORTED, "at the deadline: %d more tokens, finish %d", n, fin);
    CHECK(!memcmp(want, got, 3 * sizeof *got));
    gateway_shutdown(G.g);
    gateway_free(G.g);
    node_free(&ref);
    node_free(&R);
}

static int fake_which_prefill(const int *fd, int n, proto_msg *m);

/* A static worker address whose TCP connect succeeds (a listening socket: the kernel's backlog
 * takes it) but that never answers the handshake: a stopped worker, a hung host. Its listening
 * descriptor; the address in addr. */
static int blackhole_listen(char *addr, size_t sz)
{
    int fd = proto_listen("127.0.0.1:0", 8);
    CHECK(fd >= 0);
    snprintf(addr, sz, "127.0.0.1:%d", proto_local_port(fd));
    return fd;
}

/* Whether the peer of fd has closed: reads (and drops) what it sent, up to 30 s for the end. */
static bool peer_closed(int fd)
{
    char buf[256];
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 30000) <= 0) return false;   /* a bound, not a speed */
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0) return true;
        if (n < 0) return errno == ECONNRESET;
    }
}

/* Whether fd is still open from the peer's side now (what it sent so far is dropped). */
static bool peer_open(int fd)
{
    char buf[256];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
}

/* A static worker stuck in its handshake (it accepts TCP, never answers; the handshake's
 * deadline is 60 s) holds up nothing else: the gateway starts, and while that handshake is
 * still pending (its connection open, counted in tokenmill_gateway_worker_connects_in_progress)
 * the dispatcher places a request moved off a registered worker that dropped it on another
 * one, and ends the request as UNAVAILABLE (not an engine error) with its 3 streamed tokens once
 * no worker came within the wait timeout; gateway_free then cuts the handshake short (before
 * its deadline) and closes that connection. */
TEST(test_static_worker_stuck_in_handshake_delays_nothing)
{
    char bh_addr[64];
    int bh = blackhole_listen(bh_addr, sizeof bh_addr);
    g_static_prefill = bh_addr;
    const double handshake_s = 60, wait_s = 1;
    gw_env G = gw_start_opts(0, handshake_s, 0, wait_s);
    g_static_prefill = NULL;
    double t_start = util_now();
    struct pollfd bp = { .fd = bh, .events = POLLIN };
    CHECK(poll(&bp, 1, 30000) == 1);   /* the gateway's connect reached the black hole */
    int bc = accept(bh, NULL, NULL);
    CHECK(bc >= 0);
    CHECK(metric(G.be, "tokenmill_gateway_worker_connects_in_progress ") == 1);
    int fd[2];
    CHECK(fake_connect_two(&G, fd));
    proto_msg m;
    int32_t prompt[40], toks[3] = { 5, 6, 7 }, got[8];
    make_prompt(prompt, 40, 11);
    sched_params sp = greedy(prompt, 40);
    sched_req *h = NULL;
    CHECK(G.be->submit(G.be->ud, &sp, &h) == SCHED_OK);
    int first = fake_which_prefill(fd, 2, &m);
    CHECK(first >= 0);
    proto_msg_free(&m);
    int other = first >= 0 ? 1 - first : 1;
    fake_close(fd[first >= 0 ? first : 0]);   /* the request moves: the dispatcher places it */
    CHECKF(fake_expect(fd[other], PROTO_PREFILL, &m), "the moved request was not placed on the other worker");
    uint64_t id = m.hdr.req_id;
    proto_msg_free(&m);
    fake_handoff(fd[other], id, 40, toks[0], NULL);
    CHECK(fake_expect(fd[other], PROTO_DECODE, &m));
    proto_msg_free(&m);
    fake_tokens(fd[other], id, toks + 1, 2);
    int k = 0;
    sched_finish fin = SCHED_FINISH_NONE;
    CHECK(WAIT_UNTIL((poll_now(G.be, h, got, 8, &k, &fin), k == 3), 30));
    fake_close(fd[other]);   /* no worker left: the request waits, then ends */
    int n = collect(G.be, h, got + k, 8 - k, &fin);
    G.be->release(G.be->ud, h);
    CHECKF(n == 0 && fin == SCHED_FINISH_UNAVAILABLE, "after the wait timeout: %d more tokens, finish %s", n,
           sched_finish_name(fin));
    CHECK(k == 3 && !memcmp(got, toks, sizeof toks));
    /* all of it while the black hole's handshake was still pending */
    CHECK(util_now() - t_start < handshake_s);
    CHECK(peer_open(bc));
    CHECK(metric(G.be, "tokenmill_gateway_worker_connects_in_progress ") == 1);
    gateway_shutdown(G.g);
    gateway_free(G.g);   /* cuts the handshake short */
    CHECK(util_now() - t_start < handshake_s);
    CHECK(peer_closed(bc));
    close(bc);
    close(bh);
}

/* Connected TCP sockets of this process: how many, and how many lack TCP_NODELAY. Listening
 * sockets and other descriptors are skipped. */
static int tcp_sockets(int *without_nodelay)
{
    int n = 0;
    *without_nodelay = 0;
    for (int fd = 0; fd < 4096; fd++) {
        int type = 0, acc = 0, nd = 0;
        socklen_t l = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) || type != SOCK_STREAM) continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) || (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) continue;
        l = sizeof acc;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) || acc) continue;
        sl = sizeof ss;
        if (getpeername(fd, (struct sockaddr *)&ss, &sl)) continue;
        l = sizeof nd;
        if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, &l)) continue;
        n++;
        if (!nd) ++*without_nodelay;
    }
    return n;
}

/* One greedy request of max_tokens through the gateway: its token count (tokens in out, at most
 * cap), or -1 when it did not end at its length. */
static int run_one(const api_backend *be, const int32_t *prompt, int n, int max_tokens, int32_t *out, int cap)
{
    sched_params sp = greedy(prompt, n);
    sp.max_tokens = max_tokens;
    sched_req *h = NULL;
    if (be->submit(be->ud, &sp, &h) != SCHED_OK) return -1;
    sched_finish fin;
    int k = collect(be, h, out, cap, &fin);
    be->release(be->ud, h);
    return fin == SCHED_FINISH_LENGTH ? k : -1;
}

TEST(test_sockets_nodelay_and_added_latency)
{
    node ref = node_new(false), R = node_new(true), S = node_new(true);
    gw_env G = gw_start();
    /* R registers with G; S listens and a second gateway connects to it (--prefill / --decode) */
    node_serve(&R, PROTO_ROLE_MIXED, G.reg, "registered");
    worker_opts wo = { .role = PROTO_ROLE_MIXED, .listen = "127.0.0.1:0", .name = "static", .heartbeat_ms = 50,
                       .max_seqs = 4, .n_ctx = 1024, .key = &g_key };
    S.w = worker_new(&wo, S.srv.e, S.srv.s, S.srv.st, S.srv.bio);
    CHECK(S.w != NULL);
    char saddr[64];
    snprintf(saddr, sizeof saddr, "127.0.0.1:%d", S.w ? worker_port(S.w) : 1);
    const char *const addrs[1] = { saddr };
    gateway_model gm = { .model = g_model, .name = "tiny", .n_ctx = 1024, .eos_ids = { -1, -1, -1, -1 } };
    gateway_opts o = { .models = &gm, .n_models = 1, .prefill = addrs, .n_prefill = 1, .decode = addrs, .n_decode = 1,
                       .heartbeat_timeout_s = 60, .wait_timeout_s = 60, .key = &g_key };
    gateway *g2 = NULL;
    char err[256];
    CHECK(gateway_new(&o, &g2, err, sizeof err) == GATEWAY_OK);
    const api_backend *be2 = g2 ? gateway_backend(g2, 0) : NULL;
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
    CHECK(be2 && WAIT_UNTIL(workers_up(be2) == 2, 30));   /* one slot per list, the same worker */

    int32_t prompt[40], want[N_GEN], got[N_GEN + 4];
    make_prompt(prompt, 40, 9);
    CHECK(reference(&ref, prompt, 40, want) == N_GEN);
    const api_backend *bes[2] = { G.be, be2 };
    for (int i = 0; i < 2 && be2; i++) {
        /* a one-token request (TOKENS + FINISH from the prefill) and a handed-off one */
        CHECKF(run_one(bes[i], prompt, 40, 1, got, N_GEN + 4) == 1 && got[0] == want[0], "gateway %d: one token", i);
        CHECKF(run_one(bes[i], prompt, 40, N_GEN, got, N_GEN + 4) == N_GEN && !memcmp(got, want, sizeof want),
               "gateway %d: split run", i);
        CHECKF(metric(bes[i], "tokenmill_gateway_added_seconds_count ") == 2, "gateway %d: %g requests counted", i,
               metric(bes[i], "tokenmill_gateway_added_seconds_count "));
        CHECK(metrics_has(bes[i], "# TYPE tokenmill_gateway_added_seconds histogram\n"));
        CHECK(metric(bes[i], "tokenmill_gateway_added_seconds_bucket{le=\"+Inf\"} ") == 2);
        /* the sum may be 0: the gateway's added time is clamped at 0 (its clock against the worker's) */
        CHECK(metrics_has(bes[i], "\ntokenmill_gateway_added_seconds_sum "));
    }
    /* both ends of G <-> R (R connected) and of g2 <-> S (g2 connected, S accepted) */
    int without = 0, n = tcp_sockets(&without);
    CHECKF(n >= 4 && without == 0, "%d connected TCP sockets, %d without TCP_NODELAY", n, without);
    node_stop(&R);
    node_stop(&S);
    gateway_shutdown(g2);
    gateway_free(g2);
    gateway_shutdown(G.g);
    gateway_free(G.g);
    node_free(&ref);
    node_free(&R);
    node_free(&S);
}

/* Which of the n fake workers gets a PREFILL next (its index, the frame in *m), -1 none. */
static int fake_which_prefill(const int *fd, int n, proto_msg *m)
{
    struct pollfd p[4];
    for (int i = 0; i < n; i++) p[i] = (struct pollfd){ .fd = fd[i], .events = POLLIN };
    if (poll(p, (nfds_t)n, 30000) <= 0) return -1;   /* a bound, not a speed */
    for (int i = 0; i < n; i++)
        if (p[i].revents & POLLIN) return fake_expect(fd[i], PROTO_PREFILL, m) ? i : -1;
    return -1;
}

TEST(test_prefill_goes_where_its_prefix_is_in_flight)
{
    gw_env G = gw_start();
    int fd[2];
    CHECK(fake_connect_two(&G, fd));
    proto_msg m;
    /* A and B share their first two blocks (256 tokens) and differ after; C is unrelated */
    int32_t a[300], b[300], c[300];
    make_prompt(a, 300, 3);
    memcpy(b, a, sizeof b);
    b[280] = (b[280] + 1) % N_VOCAB;
    make_prompt(c, 300, 4);
    sched_params pa = greedy(a, 300), pb = greedy(b, 300), pc = greedy(c, 300);
    sched_req *ha = NULL, *hb = NULL, *hc = NULL;
    CHECK(G.be->submit(G.be->ud, &pa, &ha) == SCHED_OK);
    int wa = fake_which_prefill(fd, 2, &m);
    CHECK(wa >= 0);
    if (wa >= 0) proto_msg_free(&m);
    /* A is still prefilling (the fake does not answer): B goes to the same worker, although
     * the other one is idle */
    CHECK(G.be->submit(G.be->ud, &pb, &hb) == SCHED_OK);
    int wb = fake_which_prefill(fd, 2, &m);
    CHECKF(wb == wa, "B went to worker %d, A is on %d", wb, wa);
    if (wb >= 0) {
        CHECK(m.u.prefill.n_prompt == 300);
        proto_msg_free(&m);
    }
    CHECK(metric(G.be, "tokenmill_gateway_inflight_routed_total ") == 1);
    CHECK(metric(G.be, "tokenmill_gateway_inflight_shared_tokens_total ") == 256);
    /* nothing of C's is in flight: the idle worker */
    CHECK(G.be->submit(G.be->ud, &pc, &hc) == SCHED_OK);
    int wc = fake_which_prefill(fd, 2, &m);
    CHECKF(wc >= 0 && wc != wa, "C went to worker %d, A is on %d", wc, wa);
    if (wc >= 0) proto_msg_free(&m);
    CHECK(metric(G.be, "tokenmill_gateway_inflight_routed_total ") == 1);
    G.be->release(G.be->ud, ha);
    G.be->release(G.be->ud, hb);
    G.be->release(G.be->ud, hc);
    gateway_shutdown(G.g);
    gateway_free(G.g);
    fake_close(fd[0]);
    fake_close(fd[1]);
}

/* A request with a grammar sends its source and kind in the PREFILL (flag GRAMMAR), and the
 * think markers as a budget that never forces (max_tokens) when it has no budget of its own,
 * so the worker knows where reasoning ends; a grammar without its source is refused at
 * submit. A worker that refuses the job's arguments (ERROR ARG: it could not compile the
 * grammar; ERROR TOO_LONG: the prompt is longer than it takes) ends the request REFUSED (a
 * 400 in the client's shape), not as an engine error. */
/* The fake worker on fd answers request id (the gateway's h) with ERROR code; true when the
 * request then ends REFUSED (h is released either way). */
static bool fake_refuse(const gw_env *G, int fd, sched_req *h, uint64_t id, uint32_t code, const char *why)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_ERROR;
    m.hdr.req_id = id;
    m.u.error.code = code;
    m.u.error.msg = (char *)why;
    bool ok = proto_send_msg(PC(fd), &m) == PROTO_OK;
    int32_t out[4];
    sched_finish fin = SCHED_FINISH_NONE;
    ok = ok && collect(G->be, h, out, 4, &fin) == 0;
    if (fin != SCHED_FINISH_REFUSED) fprintf(stderr, "  error %u: finish %s\n", code, sched_finish_name(fin));
    G->be->release(G->be->ud, h);
    return ok && fin == SCHED_FINISH_REFUSED;
}

TEST(test_grammar_travels_and_worker_refusal)
{
    gw_env G = gw_start();
    int fd = fake_connect(&G);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
    proto_msg m;
    CHECK(fake_expect(fd, PROTO_HELLO, &m));
    proto_msg_free(&m);
    static const char src[] = "[a-c]{2,6}";
    grammar *gr = NULL;
    char err[256];
    CHECK(grammar_compile(GRAMMAR_KIND_REGEX, src, strlen(src), &gr, err, sizeof err) == GRAMMAR_OK);
    int32_t prompt[40];
    make_prompt(prompt, 40, 11);
    sched_params p = greedy(prompt, 40);
    p.max_tokens = 20;
    p.grammar = gr;
    sched_req *h = NULL;
    CHECK(G.be->submit(G.be->ud, &p, &h) == SCHED_ERR_ARG);   /* no source to send */
    p.grammar_kind = GRAMMAR_KIND_REGEX;
    p.grammar_src = src;
    p.grammar_len = strlen(src);
    p.think_start = 4;
    p.think_end = 5;
    CHECK(G.be->submit(G.be->ud, &p, &h) == SCHED_OK);
    CHECK(fake_expect(fd, PROTO_PREFILL, &m));
    const proto_params *pp = &m.u.prefill.params;
    CHECKF((m.hdr.flags & PROTO_F_GRAMMAR) && (m.hdr.flags & PROTO_F_THINK), "flags %#x", m.hdr.flags);
    CHECK(pp->grammar_kind == GRAMMAR_KIND_REGEX && pp->grammar_len == strlen(src) && pp->grammar &&
          !strcmp(pp->grammar, src));
    CHECK(pp->think_budget == 20 && pp->think_start == 4 && pp->think_end == 5);
    uint64_t id = m.hdr.req_id;
    proto_msg_free(&m);
    CHECK(fake_refuse(&G, fd, h, id, PROTO_E_ARG, "grammar: not compiled here"));
    /* a prompt longer than the worker takes (ERROR TOO_LONG) is refused the same way */
    sched_params q = greedy(prompt, 40);
    id = fake_submit(&G, fd, &q, &h);
    CHECK(fake_refuse(&G, fd, h, id, PROTO_E_TOO_LONG, "prompt too long"));
    grammar_free(gr);
    gateway_shutdown(G.g);
    gateway_free(G.g);
    fake_close(fd);
}

/* One request through a fake prefill worker P and a fake decode worker D; P holds the window
 * state at 256. answer: 0 P answers the fetch with the state, 1 with nothing, 2 not at all. */
static void window_fetch_round(const gw_env *G, int fp, int fd, const int32_t *prompt, int answer)
{
    sched_params p = greedy(prompt, 300);
    p.max_tokens = 2;
    sched_req *h;
    uint64_t id = fake_submit(G, fp, &p, &h);
    proto_msg m;
    uint8_t root[32], pfp[32], keys[2][32];
    blockkey_root(NULL, 0, root);
    blockkey_pool_fp(g_model->fingerprint, QTYPE_F16, pfp);
    blockkey_chain(root, prompt, 2, pfp, keys);
    proto_window_ev ev = { .op = PROTO_WIN_ADD, .ttl_ms = 600000 };
    memcpy(ev.key, keys[1], 32);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINDOW;
    m.u.window.n = 1;
    m.u.window.ev = &ev;
    CHECK(proto_send_msg(PC(fp), &m) == PROTO_OK);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HANDOFF;
    m.hdr.req_id = id;
    m.u.handoff.first.token = 3;
    m.u.handoff.n_prompt = 300;
    m.u.handoff.n_computed = 300;
    m.u.handoff.n_stored = 256;
    CHECK(proto_send_msg(PC(fp), &m) == PROTO_OK);
    CHECK(fake_expect(fp, PROTO_WINFETCH, &m));
    CHECK(!memcmp(m.u.winfetch.key, keys[1], 32));
    uint64_t fid = m.hdr.req_id;
    uint8_t state[48];
    for (int i = 0; i < 48; i++) state[i] = (uint8_t)(i + answer);
    if (answer < 2) {
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_WINSTATE;
        m.hdr.req_id = fid;
        memcpy(m.u.winstate.key, keys[1], 32);
        m.u.winstate.n_bytes = answer == 0 ? 48 : 0;
        m.u.winstate.data = answer == 0 ? state : NULL;
        CHECK(proto_send_msg(PC(fp), &m) == PROTO_OK);
    }
    /* D: the state first (when there is one), then the DECODE */
    CHECK(proto_recv(PC(fd), &m) == PROTO_OK);
    if (answer == 0) {
        CHECKF(m.hdr.type == PROTO_WINSTATE, "got %s", proto_type_name(m.hdr.type));
        CHECK(m.hdr.req_id == 0 && m.u.winstate.n_bytes == 48 && m.u.winstate.data &&
              !memcmp(m.u.winstate.data, state, 48) && !memcmp(m.u.winstate.key, keys[1], 32));
        proto_msg_free(&m);
        CHECK(proto_recv(PC(fd), &m) == PROTO_OK);
    }
    CHECKF(m.hdr.type == PROTO_DECODE, "got %s", proto_type_name(m.hdr.type));
    uint64_t did = m.hdr.req_id;
    proto_msg_free(&m);
    int32_t tok = 4;
    fake_tokens(fd, did, &tok, 1);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_FINISH;
    m.hdr.req_id = did;
    m.u.finish.reason = PROTO_FINISH_LENGTH;
    m.u.finish.prompt_tokens = 300;
    m.u.finish.completion_tokens = 2;
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    int32_t out[4];
    sched_finish fin;
    CHECK(collect(G->be, h, out, 4, &fin) == 2 && out[0] == 3 && out[1] == 4);
    G->be->release(G->be->ud, h);
}

TEST(test_window_state_fetched_for_the_decode_worker)
{
    gw_env G = gw_start();
    g_fake_role = PROTO_ROLE_PREFILL;
    int fp = fake_connect(&G);
    g_fake_role = PROTO_ROLE_DECODE;
    int fd = fake_connect(&G);
    g_fake_role = PROTO_ROLE_MIXED;
    CHECK(WAIT_UNTIL(workers_up(G.be) == 2, 30));
    proto_msg m;
    CHECK(fake_expect(fp, PROTO_HELLO, &m));
    proto_msg_free(&m);
    CHECK(fake_expect(fd, PROTO_HELLO, &m));
    proto_msg_free(&m);
    int32_t prompt[300];
    make_prompt(prompt, 300, 21);
    window_fetch_round(&G, fp, fd, prompt, 0);
    CHECK(metric(G.be, "tokenmill_gateway_window_fetches_total{result=\"ok\"} ") == 1);
    CHECK(metric(G.be, "tokenmill_gateway_window_fetch_bytes_total ") == 48);
    CHECK(metric(G.be, "tokenmill_gateway_window_directory_entries ") == 1);
    window_fetch_round(&G, fp, fd, prompt, 1);   /* not held any more: the DECODE goes alone */
    window_fetch_round(&G, fp, fd, prompt, 2);   /* no answer: it goes after the bounded wait */
    CHECK(metric(G.be, "tokenmill_gateway_window_fetches_total{result=\"ok\"} ") == 1);
    CHECK(metric(G.be, "tokenmill_gateway_window_fetches_total{result=\"failed\"} ") == 2);
    gateway_shutdown(G.g);
    gateway_free(G.g);
    fake_close(fp);
    fake_close(fd);
}

/* Two models behind one gateway: each worker says which it serves (HELLO model_id, checked
 * against the fingerprint), each request goes to a worker of its own model (the tokens are that
 * model's, an embedding's vector that model's engine's), a request for a model with no worker up waits and is refused (not sent to a worker
 * of the other model), and a worker of a model the gateway does not serve is refused with a
 * message naming the served ones. */
TEST(test_requests_routed_by_model)
{
    gateway_model gm[2] = { { .model = g_model, .name = "a", .n_ctx = 1024, .eos_ids = { -1, -1, -1, -1 } },
                            { .model = g_model2, .name = "b", .n_ctx = 1024, .eos_ids = { -1, -1, -1, -1 } } };
    gateway_opts o = { .models = gm, .n_models = 2, .register_listen = "127.0.0.1:0", .heartbeat_timeout_s = 60,
                       .wait_timeout_s = 0.3, .key = &g_key };
    gw_env G;
    memset(&G, 0, sizeof G);
    char err[256];
    CHECK(gateway_new(&o, &G.g, err, sizeof err) == GATEWAY_OK);
    snprintf(G.reg, sizeof G.reg, "127.0.0.1:%d", gateway_register_port(G.g));
    const api_backend *be_a = gateway_backend(G.g, 0), *be_b = gateway_backend(G.g, 1);
    CHECK(be_a && be_b && be_a != be_b && !gateway_backend(G.g, 2));
    node ref_a = node_new_of(g_model, false), ref_b = node_new_of(g_model2, false);
    node A = node_new_of(g_model, false), B = node_new_of(g_model2, false);
    int32_t prompt[40], want_a[N_GEN], want_b[N_GEN], got[N_GEN + 4];
    make_prompt(prompt, 40, 5);
    CHECK(reference(&ref_a, prompt, 40, want_a) == N_GEN && reference(&ref_b, prompt, 40, want_b) == N_GEN);
    CHECK(memcmp(want_a, want_b, sizeof want_a));   /* the models tell apart */

    /* only a's worker (announcing no id: matched by its fingerprint) is up: b's requests wait
     * and are refused, never sent to it */
    node_serve_model(&A, PROTO_ROLE_MIXED, G.reg, "wa", NULL);
    CHECK(WAIT_UNTIL(workers_up(be_a) == 1, 30));
    sched_params p = greedy(prompt, 40);
    sched_req *h = NULL;
    CHECK(be_b->submit(be_b->ud, &p, &h) == SCHED_ERR_STOPPED && !h);
    sched_finish fin;
    CHECK(be_a->submit(be_a->ud, &p, &h) == SCHED_OK);
    CHECK(collect(be_a, h, got, N_GEN + 4, &fin) == N_GEN && !memcmp(got, want_a, sizeof want_a));
    be_a->release(be_a->ud, h);

    /* b's worker (by id) comes in; each model's requests get that model's tokens */
    node_serve_model(&B, PROTO_ROLE_MIXED, G.reg, "wb", "b");
    CHECK(WAIT_UNTIL(workers_up(be_a) == 2, 30));
    for (int k = 0; k < 2; k++) {
        const api_backend *be = k ? be_b : be_a;
        CHECK(be->submit(be->ud, &p, &h) == SCHED_OK);
        CHECKF(collect(be, h, got, N_GEN + 4, &fin) == N_GEN && !memcmp(got, k ? want_b : want_a, sizeof want_a),
               "model %s: tokens of the other model", k ? "b" : "a");
        be->release(be->ud, h);
    }
    /* an embedding of b runs on b's worker (EMBEDDING then FINISH): the vector of b's engine */
    sched_params ep = { .prompt = prompt, .n_prompt = 40, .embed = MODEL_POOL_MEAN };
    sched_req *er = NULL;
    CHECK(sched_submit(ref_b.srv.s, &ep, &er) == SCHED_OK);
    schedtest_drain(er, got, N_GEN + 4, NULL);
    const float *want_v = sched_embedding(er);
    CHECK(want_v != NULL && be_b->embedding && be_b->done);
    CHECK(be_b->submit(be_b->ud, &ep, &h) == SCHED_OK);
    CHECK(collect(be_b, h, got, N_GEN + 4, &fin) == 0 && fin == SCHED_FINISH_STOP && be_b->done(be_b->ud, h));
    const float *v = be_b->embedding(be_b->ud, h);
    CHECKF(v && want_v && !memcmp(v, want_v, (size_t)g_model2->hp.dim * sizeof *v), "embedding differs from b's engine's");
    be_b->release(be_b->ud, h);
    sched_release(er);
    ep.embed = MODEL_POOL_RANK;   /* a reranker's score is the gateway's own: no worker pools it */
    CHECK(be_b->submit(be_b->ud, &ep, &h) == SCHED_ERR_ARG);
    CHECK(metrics_has(be_a, "tokenmill_worker_up{"));

    /* a worker of a model not served here is refused, told which ones are */
    uint8_t other_fp[32];
    memset(other_fp, 0x5a, sizeof other_fp);
    int fd = proto_connect(G.reg, 2000);
    CHECK(fd >= 0);
    struct timeval tv = { 30, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn_init(PC(fd), fd);
    char why[160];
    CHECK(auth_handshake(PC(fd), &g_key, AUTH_SIDE_WORKER, why, sizeof why) == AUTH_OK);
    proto_msg m;
    fake_hello(&m);
    memcpy(m.u.hello.model_fp, other_fp, 32);
    m.u.hello.model_id = (char *)"c";
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    CHECK(proto_recv(PC(fd), &m) == PROTO_OK);
    CHECKF(m.hdr.type == PROTO_ERROR && m.u.error.code == PROTO_E_MODEL && m.u.error.msg &&
               strstr(m.u.error.msg, "'c'") && strstr(m.u.error.msg, "'a', 'b'"),
           "got %s %s", proto_type_name(m.hdr.type), m.hdr.type == PROTO_ERROR ? m.u.error.msg : "");
    proto_msg_free(&m);
    fake_close(fd);
    /* b's id with a's file: refused too (the fingerprint decides, and says so) */
    fd = proto_connect(G.reg, 2000);
    CHECK(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    proto_conn_init(PC(fd), fd);
    CHECK(auth_handshake(PC(fd), &g_key, AUTH_SIDE_WORKER, why, sizeof why) == AUTH_OK);
    fake_hello(&m);
    memcpy(m.u.hello.model_fp, other_fp, 32);
    m.u.hello.model_id = (char *)"b";
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    CHECK(proto_recv(PC(fd), &m) == PROTO_OK);
    CHECKF(m.hdr.type == PROTO_ERROR && m.u.error.msg && strstr(m.u.error.msg, "fingerprints differ"), "got %s",
           m.hdr.type == PROTO_ERROR ? m.u.error.msg : proto_type_name(m.hdr.type));
    proto_msg_free(&m);
    fake_close(fd);
    CHECK(workers_up(be_a) == 2);

    gateway_shutdown(G.g);
    node_stop(&A);
    node_stop(&B);
    gateway_free(G.g);
    node_free(&A);
    node_free(&B);
    node_free(&ref_a);
    node_free(&ref_b);
}

/* An embedding is a PREFILL with PROTO_F_EMBED and its pooling; a worker that answers it with a
 * vector of the wrong width is dropped (nothing reaches the client), and the embedding is
 * computed again on the next worker, exactly. */
TEST(test_embedding_bad_vector_rerouted)
{
    gw_env G = gw_start();
    node ref = node_new(false), R = node_new(false);
    int32_t prompt[20];
    make_prompt(prompt, 20, 3);
    sched_params ep = { .prompt = prompt, .n_prompt = 20, .embed = MODEL_POOL_LAST };
    sched_req *er = NULL;
    int32_t toks[4];
    CHECK(sched_submit(ref.srv.s, &ep, &er) == SCHED_OK);
    schedtest_drain(er, toks, 4, NULL);
    const float *want = sched_embedding(er);
    CHECK(want != NULL);

    int fd = fake_connect(&G);
    CHECK(WAIT_UNTIL(workers_up(G.be) == 1, 30));
    sched_req *h = NULL;
    CHECK(G.be->submit(G.be->ud, &ep, &h) == SCHED_OK);
    proto_msg m;
    CHECK(fake_expect(fd, PROTO_PREFILL, &m));
    CHECK((m.hdr.flags & PROTO_F_EMBED) && m.u.prefill.embed == MODEL_POOL_LAST && m.u.prefill.n_prompt == 20);
    uint64_t id = m.hdr.req_id;
    proto_msg_free(&m);
    float v[8] = { 0 };
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_EMBEDDING;
    m.hdr.req_id = id;
    m.u.embedding.n = 8;   /* the model is wider */
    m.u.embedding.v = v;
    CHECK(proto_send_msg(PC(fd), &m) == PROTO_OK);
    CHECK(fake_refused(fd));
    fake_close(fd);
    node_serve(&R, PROTO_ROLE_PREFILL, G.reg, "real");   /* an embedding needs no decode worker */
    int32_t got[4];
    sched_finish fin;
    CHECK(collect(G.be, h, got, 4, &fin) == 0 && fin == SCHED_FINISH_STOP);
    const float *v2 = G.be->embedding(G.be->ud, h);
    CHECK(v2 && !memcmp(v2, want, (size_t)g_model->hp.dim * sizeof *v2));
    G.be->release(G.be->ud, h);
    sched_release(er);
    gateway_shutdown(G.g);
    node_stop(&R);
    gateway_free(G.g);
    node_free(&R);
    node_free(&ref);
}

int main(void)
{
    util_log_level = getenv("TM_DEBUG_LOG") ? LOG_LEVEL_DEBUG : LOG_LEVEL_ERROR;
    if (!(g_model = schedtest_open(tmpdir, 7))) return 1;   /* its vocabulary: N_VOCAB */
    snprintf(g_spec, sizeof g_spec, "dir:%s/store", tmpdir);
    if (!(g_model2 = schedtest_open(tmpdir2, 8))) return 1;
    RUN(test_requests_routed_by_model);
    RUN(test_embedding_bad_vector_rerouted);
    RUN(test_split_run_and_handoff_metrics);
    RUN(test_window_state_fetched_for_the_decode_worker);
    RUN(test_bad_values_close_the_worker_and_reroute);
    RUN(test_request_moved_too_often_fails);
    RUN(test_malformed_frame_is_answered_and_closed);
    RUN(test_rogue_workers_refused);
    RUN(test_trickling_strangers_do_not_keep_workers_out);
    RUN(test_worker_names_unique);
    RUN(test_stalled_worker_rerouted);
    RUN(test_drain_waits_for_a_worker_past_wait_timeout);
    RUN(test_static_worker_stuck_in_handshake_delays_nothing);
    RUN(test_sockets_nodelay_and_added_latency);
    RUN(test_prefill_goes_where_its_prefix_is_in_flight);
    RUN(test_grammar_travels_and_worker_refusal);
    schedtest_close(tmpdir, g_model);
    schedtest_close(tmpdir2, g_model2);
    HARNESS_END();
}
