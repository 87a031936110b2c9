/*
 * gateway_conn: the gateway's connections to its workers. Every connection starts with the
 * handshake of cluster/auth.h and the HELLO exchange (gw_handshake: the worker's model must be
 * one we serve, gw_model_of, and its vocabulary and KV type match that model's); a greeted
 * worker takes a slot (gw_attach) and gets a reader thread that applies its frames to the
 * requests under gateway.mu (gw_on_msg) and closes the connection when it ends.
 *
 * Static workers (--prefill, --decode) are connected and reconnected by connector threads
 * (gw_connect_start; gateway_new, then the dispatcher, start them, at most one per static slot
 * at a time, so their number is bounded by the static lists), so that a worker that is down,
 * stopped or silent in its handshake holds up neither the dispatcher (its heartbeat, progress
 * and wait checks, its placements) nor the other workers' connects. Registering ones
 * (--gateway) come in through the acceptor, each handshake in a thread of its own, within an
 * absolute deadline and in a bounded table (greet.h: when it is full the oldest handshake of
 * the busiest source address makes room), so that a peer slow or silent in its handshake holds
 * up nobody else, and strangers cannot keep a worker out. Both kinds go through the same
 * handshake and checks. The gateway answers a worker's HELLO with its own only once it is
 * accepted; a refused one (another model, its name taken) is told why with ERROR.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "cluster/balance.h"
#include "cluster/gateway_int.h"
#include "cluster/proto.h"
#include "util/util.h"

typedef struct {
    gateway *g;
    int slot;
    uint64_t gen;
    int fd;
    proto_conn *pc;           /* fd's frame tags; the reader frees it as it closes */
} gw_reader_arg;

/* Closes a worker's connection, from its reader as it ends: first, when a frame of the worker
 * was refused, ERROR MALFORMED (id 0) saying why, as docs/protocol.md asks "when it can" (best
 * effort: 200 ms at most). Under the slot's send lock, so that the dispatcher never writes to
 * the descriptor once it is closed (and perhaps reused). */
static void gw_reader_close(gateway *g, int slot, int fd, proto_conn *pc, const char *refused)
{
    gw_worker *w = &g->w[slot];
    pthread_mutex_lock(&w->send_mu);
    if (refused && w->send_fd == fd && w->send_conn == pc) {
        struct timeval tv = { .tv_sec = 0, .tv_usec = 200 * 1000 };
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_ERROR;
        m.u.error.code = PROTO_E_MALFORMED;
        m.u.error.msg = (char *)refused;
        (void)proto_send_msg(pc, &m);
    }
    shutdown(fd, SHUT_RDWR);
    close(fd);
    if (w->send_fd == fd) w->send_fd = -1;
    if (w->send_conn == pc) w->send_conn = NULL;
    pthread_mutex_unlock(&w->send_mu);
    proto_conn_free(pc);
    free(pc);
}

static void *gw_reader(void *arg)
{
    gw_reader_arg a = *(gw_reader_arg *)arg;
    free(arg);
    gateway *g = a.g;
    const char *refused = NULL;   /* why a frame of the worker was refused (static text) */
    for (;;) {
        proto_msg m;
        proto_status st = proto_recv(a.pc, &m);
        pthread_mutex_lock(&g->mu);
        bool current = g->w[a.slot].gen == a.gen;
        if (st != PROTO_OK) {
            if (current) {
                char why[96];
                snprintf(why, sizeof why, "connection %s", st == PROTO_ERR_CLOSED ? "closed" : proto_status_name(st));
                if (st != PROTO_ERR_CLOSED && st != PROTO_ERR_IO) {
                    g->n_bad_conns++;
                    refused = proto_status_name(st);
                }
                gw_worker_lost_how(g, a.slot, why, refused != NULL);
            }
            pthread_mutex_unlock(&g->mu);
            break;
        }
        bool ok = !current || gw_on_msg(g, a.slot, &m, &refused);
        if (ok) gw_flush(g);   /* the frames this one caused (a HANDOFF's DECODE) */
        pthread_mutex_unlock(&g->mu);
        proto_msg_free(&m);
        if (!ok) break;
    }
    gw_reader_close(g, a.slot, a.fd, a.pc, refused);
    /* only now: gateway_free waits for reader_live to go false before freeing the slots */
    pthread_mutex_lock(&g->mu);
    g->w[a.slot].reader_live = false;
    if (!g->w[a.slot].is_static && !g->w[a.slot].connected) g->w[a.slot].used = false;
    pthread_cond_broadcast(&g->cv_workers);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ------------------------------------------------------------------ connections */

/* Our HELLO to a worker of model mi: that model's fingerprint, context and id. */
static void gw_hello(const gateway *g, int mi, proto_msg *m)
{
    const gw_model *gm = &g->m[mi];
    memset(m, 0, sizeof *m);
    m->hdr.type = PROTO_HELLO;
    m->u.hello.role = PROTO_ROLE_GATEWAY;
    memcpy(m->u.hello.model_fp, gm->o.model->fingerprint, 32);
    m->u.hello.n_ctx = (uint32_t)gm->o.n_ctx;
    m->u.hello.n_vocab = (uint32_t)gm->o.model->hp.n_vocab;
    m->u.hello.listen = (char *)"";
    m->u.hello.name = (char *)"gateway";
    m->u.hello.model_id = (char *)(gm->o.name ? gm->o.name : "");
}

/* The served model a worker's HELLO is for: the fingerprint decides (the model named by the
 * id first, else any with that fingerprint: a worker may know the file by another name); -1
 * with the refusal's text in why when none. */
static int gw_model_of(const gateway *g, const proto_hello *h, char *why, size_t whysz)
{
    const char *id = h->model_id ? h->model_id : "";
    int named = -1;
    for (int i = 0; i < g->o.n_models; i++)
        if (id[0] && g->m[i].o.name && !strcmp(g->m[i].o.name, id)) named = i;
    if (named >= 0 && !memcmp(h->model_fp, g->m[named].o.model->fingerprint, 32)) return named;
    for (int i = 0; i < g->o.n_models; i++)
        if (!memcmp(h->model_fp, g->m[i].o.model->fingerprint, 32)) return i;
    if (named >= 0) {
        snprintf(why, whysz, "it serves '%.200s' from another file than the gateway's (the model fingerprints differ)", id);
        return -1;
    }
    size_t n = (size_t)snprintf(why, whysz, "it serves %s%.200s%s, which this gateway does not serve (it serves",
                                id[0] ? "the model '" : "another model", id, id[0] ? "'" : "");
    for (int i = 0; i < g->o.n_models && n < whysz; i++)
        n += (size_t)snprintf(why + n, whysz - n, "%s '%.100s'", i ? "," : "", g->m[i].o.name ? g->m[i].o.name : "?");
    if (n < whysz) snprintf(why + n, whysz - n, ")");
    return -1;
}

/* The handshake (cluster/auth.h: the peer proves it holds the cluster key, and we prove it
 * too; pc is sealed after it), then the peer's HELLO, checked against ours; all of it within
 * one absolute deadline (greet.h), however slowly the peer's bytes come. Our HELLO is not sent
 * yet: gw_reply sends it, or says why the worker is refused, once its name was checked. 0, or
 * -1 (logged, counted; *why_refused, when not NULL, says why the worker should be told). */
static int gw_handshake(gateway *g, proto_conn *pc, const char *who, proto_hello *out, int *mi_out, char *why_refused,
                        size_t refusedsz, int *code)
{
    why_refused[0] = 0;
    pc->deadline = util_now() + g->o.handshake_timeout_s;
    char why[160];
    auth_status ast = auth_handshake(pc, g->o.key, AUTH_SIDE_GATEWAY, why, sizeof why);
    if (ast != AUTH_OK) {
        log_warn("gateway: %s: refused: %s", who, why);
        pthread_mutex_lock(&g->mu);
        g->n_refused_auth++;
        pthread_mutex_unlock(&g->mu);
        return -1;
    }
    proto_msg m;
    proto_status st = proto_recv(pc, &m);
    pc->deadline = 0;
    if (st != PROTO_OK || m.hdr.type != PROTO_HELLO) {
        log_warn("gateway: %s: refused: %s", who, st != PROTO_OK ? proto_status_name(st) : "first frame is not HELLO");
        if (st == PROTO_OK) proto_msg_free(&m);
        return -1;
    }
    char detail[PROTO_MAX_STR] = "";
    *code = PROTO_E_MODEL;
    int mi = gw_model_of(g, &m.u.hello, detail, sizeof detail);
    const model *mm = mi >= 0 ? g->m[mi].o.model : NULL;
    pthread_mutex_lock(&g->mu);
    int kv_dtype = mi >= 0 ? g->m[mi].kv_dtype : -1;   /* the model's first worker's */
    pthread_mutex_unlock(&g->mu);
    if (mi < 0) {
        /* detail says which model it serves and which ones we do */
    } else if (m.u.hello.role != PROTO_ROLE_PREFILL && m.u.hello.role != PROTO_ROLE_DECODE &&
               m.u.hello.role != PROTO_ROLE_MIXED) {
        snprintf(detail, sizeof detail, "role %d", m.u.hello.role);
        *code = PROTO_E_ROLE;
    } else if (m.u.hello.n_vocab != (uint32_t)mm->hp.n_vocab) {
        snprintf(detail, sizeof detail, "vocabulary of %u tokens, the model has %d", m.u.hello.n_vocab, mm->hp.n_vocab);
    } else if (m.u.hello.kv_dtype != QTYPE_F32 && m.u.hello.kv_dtype != QTYPE_F16 && m.u.hello.kv_dtype != QTYPE_Q8_0 &&
               m.u.hello.kv_dtype != QTYPE_Q4_0) {
        snprintf(detail, sizeof detail, "KV type %u", m.u.hello.kv_dtype);
    } else if (kv_dtype >= 0 && m.u.hello.kv_dtype != kv_dtype) {
        /* blocks, their keys and handed-off tails are in one KV type across the cluster */
        snprintf(detail, sizeof detail, "KV type %s, the model's workers have %s (start them with the same --kv-type)",
                 quant_type_name((qtype)m.u.hello.kv_dtype), quant_type_name((qtype)kv_dtype));
    }
    if (detail[0]) {
        log_warn("gateway: %s: refused: %s", who, detail);
        /* the worker is told (its log then says why it is not in): which model, when that was
         * it; the other details are in our log */
        snprintf(why_refused, refusedsz, "%s", *code == PROTO_E_ROLE ? "unknown role"
                                               : mi < 0 ? detail : "the vocabulary or KV type differs from the gateway's");
        proto_msg_free(&m);
        return -1;
    }
    *mi_out = mi;
    *out = m.u.hello;
    out->listen = xstrdup(m.u.hello.listen ? m.u.hello.listen : "");
    out->name = xstrdup(m.u.hello.name ? m.u.hello.name : "");
    out->model_id = xstrdup(m.u.hello.model_id ? m.u.hello.model_id : "");
    proto_msg_free(&m);
    return 0;
}

/* The gateway's answer to a greeted worker: its HELLO (refusal NULL: the worker is in), or ERROR
 * code saying why not (then the caller closes). Sent at once on a fresh connection, so the
 * write is bounded (1 s) rather than waited for. */
static void gw_reply(gateway *g, proto_conn *pc, const char *refusal, int code, int mi)
{
    struct timeval tv = { .tv_sec = 1, .tv_usec = 0 }, none = { 0, 0 };
    setsockopt(pc->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    proto_msg m;
    if (refusal) {
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_ERROR;
        m.u.error.code = (uint32_t)code;
        m.u.error.msg = (char *)refusal;
    } else {
        gw_hello(g, mi, &m);
    }
    (void)proto_send_msg(pc, &m);
    setsockopt(pc->fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
}

/* A new connection's frame state, or NULL when the handshake fails (the refusal said to the
 * peer when it got that far; fd is then the caller's to close). */
static proto_conn *gw_greet(gateway *g, int fd, const char *who, proto_hello *h, int *mi)
{
    proto_conn *pc = xmalloc(sizeof *pc);
    proto_conn_init(pc, fd);
    char refusal[PROTO_MAX_STR];
    int code = 0;
    if (gw_handshake(g, pc, who, h, mi, refusal, sizeof refusal, &code)) {
        if (refusal[0]) gw_reply(g, pc, refusal, code, 0);
        proto_conn_free(pc);
        free(pc);
        return NULL;
    }
    return pc;
}

/* The slot of another worker, up or still being closed, that goes by h's name (mu held); -1
 * none. Names identify workers to operators (/admin/drain), so two live ones never share one;
 * the same worker again (the same listen address from the same host: it reconnected before its
 * old connection was seen to drop, or it is in both static lists) is not another one. */
static int gw_name_taken(const gateway *g, const proto_hello *h, const char *peer, int self)
{
    if (!h->name || !h->name[0]) return -1;
    for (int i = 0; i < g->n_slots; i++) {
        const gw_worker *w = &g->w[i];
        if (i == self || !w->used || !(w->connected || w->reader_live) || strcmp(w->name, h->name)) continue;
        if (h->listen[0] && !strcmp(w->listen, h->listen) && !strcmp(w->peer, peer)) continue;
        return i;
    }
    return -1;
}

/* Refuses a greeted worker whose name another live worker has (mu held): logged here, told to
 * the worker. True when refused (the caller closes pc). */
static bool gw_refuse_name(gateway *g, proto_conn *pc, const proto_hello *h, int self, const char *who)
{
    char peer[64];
    proto_peer_host(pc->fd, peer, sizeof peer);
    int other = gw_name_taken(g, h, peer, self);
    if (other < 0) return false;
    char msg[PROTO_MAX_STR];
    snprintf(msg, sizeof msg, "the name \"%.200s\" is taken by the worker at %.200s: give each worker its own --name",
             h->name, g->w[other].addr);
    log_warn("gateway: %s (%s): refused: %s", who, h->listen[0] ? h->listen : "no address", msg);
    g->n_bad_conns++;
    gw_reply(g, pc, msg, PROTO_E_NAME, 0);
    return true;
}

static void gw_conn_close(proto_conn *pc)
{
    close(pc->fd);
    proto_conn_free(pc);
    free(pc);
}

/* Installs a connected, greeted worker in slot (mu held) and starts its reader, which owns pc. */
static void gw_attach(gateway *g, int slot, proto_conn *pc, const proto_hello *h, int mi)
{
    gw_worker *w = &g->w[slot];
    int fd = pc->fd;
    w->used = true;
    w->connected = true;
    w->reader_live = true;
    w->draining = w->undraining = false;
    w->fd = fd;
    pthread_mutex_lock(&w->send_mu);
    w->send_fd = fd;
    w->send_conn = pc;
    w->send_gen = w->gen;
    pthread_mutex_unlock(&w->send_mu);
    w->role = h->role;
    w->max_seqs = h->max_seqs;
    w->kv_dtype = h->kv_dtype;
    w->max_input = (int)TM_MIN(TM_MIN(h->max_batch_tokens, h->n_ctx), (uint32_t)INT32_MAX);
    w->model = mi;
    if (g->m[mi].kv_dtype < 0) g->m[mi].kv_dtype = h->kv_dtype;
    snprintf(w->name, sizeof w->name, "%s", h->name ? h->name : "");
    snprintf(w->listen, sizeof w->listen, "%s", h->listen ? h->listen : "");
    proto_peer_host(fd, w->peer, sizeof w->peer);
    w->last_hb = util_now();
    w->queued_s = 0;
    w->n_prefill = w->n_decode = 0;
    w->sum_ctx = 0;
    memset(&w->hb, 0, sizeof w->hb);
    w->has_curve = false;
    bal_speed_init(&w->speed, g->o.prefill_tokens_per_s);
    gw_reader_arg *a = xmalloc(sizeof *a);
    *a = (gw_reader_arg){ g, slot, w->gen, fd, pc };
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, gw_reader, a)) {
        free(a);
        w->reader_live = false;
        w->connected = false;
        pthread_mutex_lock(&w->send_mu);
        w->send_fd = -1;
        w->send_conn = NULL;
        gw_conn_close(pc);
        pthread_mutex_unlock(&w->send_mu);
    }
    pthread_attr_destroy(&at);
    log_info("gateway: worker %s (%s%s%s) is in, model %s", w->addr, proto_role_name(w->role), w->name[0] ? ", " : "",
             w->name, g->m[mi].o.name ? g->m[mi].o.name : "?");
    pthread_cond_broadcast(&g->cv_workers);
    pthread_cond_signal(&g->cv_disp);
}

/* One attempt at static worker slot: connect (500 ms at most), the handshake and HELLO
 * (within the handshake's deadline), then attach. The socket is published in connect_fd while
 * the handshake runs, so that gateway_free can cut it short; it is withdrawn (under mu) before
 * it is closed or handed to a reader, so a shutdown never reaches a reused descriptor. */
static void gw_connect_static(gateway *g, int slot)
{
    char addr[128];
    pthread_mutex_lock(&g->mu);
    memcpy(addr, g->w[slot].addr, sizeof addr);
    pthread_mutex_unlock(&g->mu);
    int fd = proto_connect(addr, 500);
    if (fd < 0) return;
    pthread_mutex_lock(&g->mu);
    bool stop = g->stop;
    if (!stop) g->w[slot].connect_fd = fd;
    pthread_mutex_unlock(&g->mu);
    if (stop) {
        close(fd);
        return;
    }
    proto_hello h;
    int mi = -1;
    proto_conn *pc = gw_greet(g, fd, addr, &h, &mi);
    pthread_mutex_lock(&g->mu);
    g->w[slot].connect_fd = -1;
    if (!pc) {
        pthread_mutex_unlock(&g->mu);
        close(fd);
        return;
    }
    if (g->stop || g->w[slot].connected || g->w[slot].reader_live) {
        gw_conn_close(pc);
    } else if (!gw_refuse_name(g, pc, &h, slot, addr)) {
        gw_reply(g, pc, NULL, 0, mi);
        gw_attach(g, slot, pc, &h, mi);
    } else {
        gw_conn_close(pc);
    }
    pthread_mutex_unlock(&g->mu);
    free(h.listen);
    free(h.name);
    free(h.model_id);
}

typedef struct {
    gateway *g;
    int slot;
} gw_connector_arg;

static void *gw_connector(void *arg)
{
    gw_connector_arg a = *(gw_connector_arg *)arg;
    free(arg);
    gateway *g = a.g;
    gw_connect_static(g, a.slot);
    pthread_mutex_lock(&g->mu);
    g->w[a.slot].connecting = false;
    g->n_connectors--;
    pthread_cond_broadcast(&g->cv_workers);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

bool gw_connect_start(gateway *g, int slot)
{
    gw_worker *w = &g->w[slot];
    if (w->connecting || g->stop) return false;
    gw_connector_arg *a = xmalloc(sizeof *a);
    *a = (gw_connector_arg){ g, slot };
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    bool ok = pthread_create(&t, &at, gw_connector, a) == 0;
    pthread_attr_destroy(&at);
    if (!ok) {
        free(a);
        log_warn("gateway: worker %s: cannot start a thread to connect to it (trying again later)", w->addr);
        return false;
    }
    w->connecting = true;
    g->n_connectors++;
    return true;
}

void gw_connect_stop_all(gateway *g)
{
    for (int i = 0; i < g->n_slots; i++)
        if (g->w[i].connect_fd >= 0) shutdown(g->w[i].connect_fd, SHUT_RDWR);
    while (g->n_connectors > 0) pthread_cond_wait(&g->cv_workers, &g->mu);
}

/* Registers a greeted worker: its slot (the same address again, a restarted worker, reuses
 * its slot when free), then our HELLO and gw_attach. Closes pc when the worker's name is taken,
 * there is no room or the gateway stops (the worker told why in the first two cases). */
static void gw_register(gateway *g, proto_conn *pc, const proto_hello *h, int mi, const char *who)
{
    pthread_mutex_lock(&g->mu);
    int slot = -1;
    for (int i = 0; i < g->n_slots && slot < 0; i++)
        if (g->w[i].used && !g->w[i].connected && !g->w[i].reader_live && h->listen[0] && !strcmp(g->w[i].addr, h->listen))
            slot = i;
    for (int i = 0; i < g->n_slots && slot < 0; i++)
        if (!g->w[i].used && !g->w[i].reader_live) slot = i;
    if (slot < 0 && g->n_slots < GW_MAX_WORKERS) slot = g->n_slots++;
    if (g->stop) {
        gw_conn_close(pc);
    } else if (gw_refuse_name(g, pc, h, slot, who)) {
        gw_conn_close(pc);
    } else if (slot < 0) {
        log_warn("gateway: too many workers, refusing %s", h->listen);
        gw_reply(g, pc, "too many workers", PROTO_E_BUSY, 0);
        gw_conn_close(pc);
    } else {
        gw_worker *w = &g->w[slot];
        if (!w->is_static) snprintf(w->addr, sizeof w->addr, "%s", h->listen[0] ? h->listen : h->name);
        gw_reply(g, pc, NULL, 0, mi);
        gw_attach(g, slot, pc, h, mi);
    }
    pthread_mutex_unlock(&g->mu);
}

typedef struct {
    gateway *g;
    int fd;
    uint64_t ticket;          /* its entry in g->greet */
    char host[GREET_HOST_MAX];
} gw_greet_arg;

/* One connection on the registration port, from accept to registered (or refused): in a
 * thread of its own, so that a peer that is slow or silent in the handshake holds up nobody
 * else. */
static void *gw_greet_thread(void *arg)
{
    gw_greet_arg a = *(gw_greet_arg *)arg;
    free(arg);
    gateway *g = a.g;
    char who[128];
    snprintf(who, sizeof who, "registering worker from %s", a.host[0] ? a.host : "?");
    proto_hello h;
    int mi = -1;
    proto_conn *pc = gw_greet(g, a.fd, who, &h, &mi);
    pthread_mutex_lock(&g->mu);
    greet_done(&g->greet, a.ticket);   /* before the fd closes: an eviction never hits a reused fd */
    if (!pc) g->n_bad_conns++;
    pthread_mutex_unlock(&g->mu);
    if (pc) {
        gw_register(g, pc, &h, mi, who);
        free(h.listen);
        free(h.name);
        free(h.model_id);
    } else {
        close(a.fd);
    }
    pthread_mutex_lock(&g->mu);
    greet_leave(&g->greet);
    pthread_cond_broadcast(&g->cv_workers);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

void *gw_acceptor(void *arg)
{
    gateway *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        bool stop = g->stop;
        pthread_mutex_unlock(&g->mu);
        if (stop) break;
        struct pollfd p = { .fd = g->listen_fd, .events = POLLIN };
        if (poll(&p, 1, 200) <= 0) continue;
        gw_greet_arg *a = xmalloc(sizeof *a);
        int fd = proto_accept(g->listen_fd, a->host, sizeof a->host);
        if (fd < 0) {
            free(a);
            continue;
        }
        pthread_mutex_lock(&g->mu);
        int evicted = -1;
        uint64_t ticket = g->stop ? 0 : greet_add(&g->greet, fd, a->host, &evicted);
        if (evicted >= 0 && util_now() - g->t_evict_log >= 10) {   /* a flood: one line per 10 s */
            g->t_evict_log = util_now();
            log_warn("gateway: %d handshakes in progress: the oldest of the busiest address made room for %s "
                     "(%llu cut so far)", g->greet.n_max, a->host[0] ? a->host : "?", (unsigned long long)g->greet.n_evicted);
        }
        if (!ticket) {   /* stopping, or the cut handshakes' threads have not left yet */
            if (!g->stop) g->n_bad_conns++;
            pthread_mutex_unlock(&g->mu);
            close(fd);
            free(a);
            continue;
        }
        a->g = g;
        a->fd = fd;
        a->ticket = ticket;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        if (pthread_create(&t, &at, gw_greet_thread, a)) {
            greet_done(&g->greet, ticket);
            greet_leave(&g->greet);
            free(a);
            close(fd);
        }
        pthread_attr_destroy(&at);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}
