/*
 * gateway_conn: the gateway's connections to its workers. Every connection starts with the
 * handshake of cluster/auth.h and the HELLO exchange (gw_handshake: model fingerprint,
 * vocabulary and KV type must match ours); a greeted worker takes a slot (gw_attach) and gets
 * a reader thread that applies its frames to the requests under gateway.mu (gw_on_msg) and
 * closes the connection when it ends. Static workers (--prefill, --decode) are connected by
 * gateway_new and reconnected by the dispatcher; registering ones (--gateway) come in through
 * the acceptor, each handshake in a thread of its own, at most GW_MAX_GREETING at once, so
 * that a peer slow or silent in its handshake holds up nobody else.
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

static void gw_hello(const gateway *g, proto_msg *m)
{
    memset(m, 0, sizeof *m);
    m->hdr.type = PROTO_HELLO;
    m->u.hello.role = PROTO_ROLE_GATEWAY;
    memcpy(m->u.hello.model_fp, g->o.model->fingerprint, 32);
    m->u.hello.n_ctx = (uint32_t)g->o.n_ctx;
    m->u.hello.n_vocab = (uint32_t)g->o.model->hp.n_vocab;
    m->u.hello.listen = (char *)"";
    m->u.hello.name = (char *)"gateway";
}

static void gw_set_timeout(int fd, int ms)
{
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* The handshake (cluster/auth.h: the peer proves it holds the cluster key, and we prove it
 * too; pc is sealed after it), then both ends send HELLO and ours is checked against theirs.
 * 0, or -1 (logged, counted). */
static int gw_handshake(gateway *g, proto_conn *pc, const char *who, proto_hello *out)
{
    gw_set_timeout(pc->fd, 2000);
    char why[160];
    auth_status ast = auth_handshake(pc, g->o.key, AUTH_SIDE_GATEWAY, why, sizeof why);
    if (ast != AUTH_OK) {
        log_warn("gateway: %s: refused: %s", who, why);
        pthread_mutex_lock(&g->mu);
        g->n_refused_auth++;
        pthread_mutex_unlock(&g->mu);
        return -1;
    }
    proto_msg h;
    gw_hello(g, &h);
    if (proto_send_msg(pc, &h) != PROTO_OK) {
        log_warn("gateway: %s: cannot send HELLO", who);
        return -1;
    }
    proto_msg m;
    proto_status st = proto_recv(pc, &m);
    if (st != PROTO_OK || m.hdr.type != PROTO_HELLO) {
        log_warn("gateway: %s: refused: %s", who, st != PROTO_OK ? proto_status_name(st) : "first frame is not HELLO");
        if (st == PROTO_OK) proto_msg_free(&m);
        return -1;
    }
    int rc = 0;
    if (memcmp(m.u.hello.model_fp, g->o.model->fingerprint, 32)) {
        log_warn("gateway: %s: refused: it serves another model", who);
        rc = -1;
    } else if (m.u.hello.role != PROTO_ROLE_PREFILL && m.u.hello.role != PROTO_ROLE_DECODE &&
               m.u.hello.role != PROTO_ROLE_MIXED) {
        log_warn("gateway: %s: refused: role %d", who, m.u.hello.role);
        rc = -1;
    } else if (m.u.hello.n_vocab != (uint32_t)g->o.model->hp.n_vocab) {
        log_warn("gateway: %s: refused: vocabulary of %u tokens, the model has %d", who, m.u.hello.n_vocab,
                 g->o.model->hp.n_vocab);
        rc = -1;
    } else if (m.u.hello.kv_dtype != QTYPE_F32 && m.u.hello.kv_dtype != QTYPE_F16) {
        log_warn("gateway: %s: refused: KV type %u", who, m.u.hello.kv_dtype);
        rc = -1;
    }
    if (!rc) {
        *out = m.u.hello;
        out->listen = xstrdup(m.u.hello.listen ? m.u.hello.listen : "");
        out->name = xstrdup(m.u.hello.name ? m.u.hello.name : "");
    }
    proto_msg_free(&m);
    gw_set_timeout(pc->fd, 0);
    return rc;
}

/* A new connection's frame state, or NULL after closing fd when the handshake fails. */
static proto_conn *gw_greet(gateway *g, int fd, const char *who, proto_hello *h)
{
    proto_conn *pc = xmalloc(sizeof *pc);
    proto_conn_init(pc, fd);
    if (gw_handshake(g, pc, who, h)) {
        proto_conn_free(pc);
        free(pc);
        close(fd);
        return NULL;
    }
    return pc;
}

static void gw_conn_close(proto_conn *pc)
{
    close(pc->fd);
    proto_conn_free(pc);
    free(pc);
}

/* Installs a connected, greeted worker in slot (mu held) and starts its reader, which owns pc. */
static void gw_attach(gateway *g, int slot, proto_conn *pc, const proto_hello *h)
{
    gw_worker *w = &g->w[slot];
    int fd = pc->fd;
    w->used = true;
    w->connected = true;
    w->reader_live = true;
    w->draining = false;
    w->fd = fd;
    pthread_mutex_lock(&w->send_mu);
    w->send_fd = fd;
    w->send_conn = pc;
    w->send_gen = w->gen;
    pthread_mutex_unlock(&w->send_mu);
    w->role = h->role;
    w->max_seqs = h->max_seqs;
    w->kv_dtype = h->kv_dtype;
    if (g->kv_dtype < 0) g->kv_dtype = h->kv_dtype;
    snprintf(w->name, sizeof w->name, "%s", h->name ? h->name : "");
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
    log_info("gateway: worker %s (%s%s%s) is in", w->addr, proto_role_name(w->role), w->name[0] ? ", " : "", w->name);
    pthread_cond_broadcast(&g->cv_workers);
    pthread_cond_signal(&g->cv_disp);
}

void gw_connect_static(gateway *g, int slot)
{
    char addr[128];
    memcpy(addr, g->w[slot].addr, sizeof addr);
    int fd = proto_connect(addr, 500);
    if (fd < 0) return;
    proto_hello h;
    proto_conn *pc = gw_greet(g, fd, addr, &h);
    if (!pc) return;
    pthread_mutex_lock(&g->mu);
    if (!g->stop && !g->w[slot].connected && !g->w[slot].reader_live) gw_attach(g, slot, pc, &h);
    else gw_conn_close(pc);
    pthread_mutex_unlock(&g->mu);
    free(h.listen);
    free(h.name);
}

/* Registers a greeted worker: its slot (the same address again, a restarted worker, reuses
 * its slot when free), then gw_attach. Closes pc when there is no room or the gateway stops. */
static void gw_register(gateway *g, proto_conn *pc, const proto_hello *h)
{
    pthread_mutex_lock(&g->mu);
    int slot = -1;
    for (int i = 0; i < g->n_slots && slot < 0; i++)
        if (g->w[i].used && !g->w[i].connected && !g->w[i].reader_live && h->listen[0] && !strcmp(g->w[i].addr, h->listen))
            slot = i;
    for (int i = 0; i < g->n_slots && slot < 0; i++)
        if (!g->w[i].used && !g->w[i].reader_live) slot = i;
    if (slot < 0 && g->n_slots < GW_MAX_WORKERS) slot = g->n_slots++;
    if (slot < 0 || g->stop) {
        if (slot < 0) log_warn("gateway: too many workers, refusing %s", h->listen);
        gw_conn_close(pc);
    } else {
        gw_worker *w = &g->w[slot];
        if (!w->is_static) snprintf(w->addr, sizeof w->addr, "%s", h->listen[0] ? h->listen : h->name);
        gw_attach(g, slot, pc, h);
    }
    pthread_mutex_unlock(&g->mu);
}

typedef struct {
    gateway *g;
    int fd;
    int i;                    /* its entry in g->greeting_fd */
} gw_greet_arg;

/* One connection on the registration port, from accept to registered (or refused): in a
 * thread of its own, so that a peer that is slow or silent in the handshake holds up nobody
 * else. */
static void *gw_greet_thread(void *arg)
{
    gw_greet_arg a = *(gw_greet_arg *)arg;
    free(arg);
    gateway *g = a.g;
    proto_hello h;
    proto_conn *pc = gw_greet(g, a.fd, "registering worker", &h);
    pthread_mutex_lock(&g->mu);
    g->greeting_fd[a.i] = -1;   /* from here on fd is pc's (or closed) */
    if (!pc) g->n_bad_conns++;
    pthread_mutex_unlock(&g->mu);
    if (pc) {
        gw_register(g, pc, &h);
        free(h.listen);
        free(h.name);
    }
    pthread_mutex_lock(&g->mu);
    g->n_greeting--;
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
        int fd = proto_accept(g->listen_fd);
        if (fd < 0) continue;
        pthread_mutex_lock(&g->mu);
        int i = -1;
        for (int k = 0; k < GW_MAX_GREETING && i < 0; k++)
            if (g->greeting_fd[k] < 0) i = k;
        if (i < 0 || g->stop) {   /* too many handshakes at once: this one is refused */
            if (i < 0) log_warn("gateway: %d handshakes in progress: refusing a connection", GW_MAX_GREETING);
            g->n_bad_conns++;
            pthread_mutex_unlock(&g->mu);
            close(fd);
            continue;
        }
        gw_greet_arg *a = xmalloc(sizeof *a);
        *a = (gw_greet_arg){ g, fd, i };
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        if (pthread_create(&t, &at, gw_greet_thread, a)) {
            free(a);
            close(fd);
        } else {
            g->greeting_fd[i] = fd;
            g->n_greeting++;
        }
        pthread_attr_destroy(&at);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}
