/*
 * worker_conn: the worker's connections: sending frames, the handshake and HELLO, the reader
 * that serves a connection's frames, the accept and register threads, the heartbeat and
 * broadcasts. See worker_int.h.
 */
#include "cluster/worker_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "util/util.h"

/* ---- connections ---- */

void worker_conn_unref_locked(worker *w, wconn *c)
{
    if (--c->refs > 0) return;
    for (wconn **pp = &w->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) { *pp = c->next; break; }
    close(c->fd);
    proto_conn_free(&c->pc);
    pthread_mutex_destroy(&c->send_mu);
    free(c);
}

bool worker_send(wconn *c, const proto_msg *m)
{
    pthread_mutex_lock(&c->send_mu);
    proto_status st = proto_send_msg(&c->pc, m);
    pthread_mutex_unlock(&c->send_mu);
    if (st != PROTO_OK) {
        if (st != PROTO_ERR_IO) log_warn("worker: %s: cannot send %s: %s", c->peer, proto_type_name(m->hdr.type),
                                         proto_status_name(st));
        shutdown(c->fd, SHUT_RDWR);   /* the reader sees it and closes the connection */
        return false;
    }
    return true;
}

void worker_send_error(wconn *c, uint64_t id, int code, const char *msg)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_ERROR;
    m.hdr.req_id = id;
    m.u.error.code = (uint32_t)code;
    m.u.error.msg = (char *)msg;
    worker_send(c, &m);
}

static void worker_send_hello(worker *w, wconn *c, bool reg)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HELLO;
    m.hdr.flags = reg ? PROTO_F_REGISTER : 0;
    proto_hello *h = &m.u.hello;
    kvpool *pool = engine_kvpool(w->e);
    kvpool_stats ks;
    kvpool_get_stats(pool, &ks);
    h->role = (uint8_t)w->o.role;
    h->kv_dtype = (uint8_t)kvpool_dtype(pool);
    memcpy(h->model_fp, w->m->fingerprint, 32);
    h->max_seqs = (uint32_t)w->o.max_seqs;
    h->kv_blocks = (uint32_t)ks.n_blocks;
    h->max_batch_tokens = (uint32_t)engine_max_batch(w->e);
    h->n_ctx = (uint32_t)w->o.n_ctx;
    h->n_vocab = (uint32_t)w->m->hp.n_vocab;
    char listen[300] = "";
    if (w->o.listen) {
        /* advertise the bound port (the option may say port 0) */
        const char *colon = strrchr(w->o.listen, ':');
        int hn = colon ? (int)(colon - w->o.listen) : 0;
        snprintf(listen, sizeof listen, "%.*s:%d", hn, w->o.listen, w->port);
    }
    h->listen = listen;
    h->name = w->name;
    h->model_id = (char *)(w->o.model_id ? w->o.model_id : "");
    worker_send(c, &m);
}

/* ---- connection reader ---- */


/* The gateway refused this worker's registration (ERROR instead of its HELLO: its name is
 * taken, another model, ...): one line, not one per retry while the reason stays the same. */
static void worker_refused_log(worker *w, wconn *c, const char *msg)
{
    pthread_mutex_lock(&w->mu);
    bool again = !strncmp(w->last_refusal, msg, sizeof w->last_refusal - 1);
    if (!again) snprintf(w->last_refusal, sizeof w->last_refusal, "%s", msg);
    pthread_mutex_unlock(&w->mu);
    if (!again) log_warn("worker: refused by the %s: %s (retrying every second)", c->peer, msg);
}

/* After refusing a frame: stop sending, then read and drop what the peer still sends (up to
 * 200 ms / 1 MiB), so that closing with unread bytes does not reset the connection before the
 * peer has read our ERROR. */
static void worker_linger(int fd)
{
    shutdown(fd, SHUT_WR);
    struct timeval tv = { 0, 200000 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    size_t total = 0;
    double t0 = util_now();
    while (total < (1u << 20) && util_now() - t0 < 0.2) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        total += (size_t)k;
    }
}

/* Reads frames until the connection ends; then cancels its jobs and drops the reader's
 * reference. */
static void worker_serve_conn(worker *w, wconn *c, bool reg)
{
    /* the handshake before anything else: a peer without the cluster key gets no HELLO, no
     * job, no heartbeat (broadcasts skip the connection until it is ready); the whole of it
     * has one deadline so that a silent or trickling peer does not keep the thread, and
     * worker_free ends it */
    pthread_mutex_lock(&w->mu);
    c->next = w->conns;
    w->conns = c;
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    if (stop) shutdown(c->fd, SHUT_RDWR);
    c->pc.deadline = util_now() + GREET_DEADLINE_S;
    char why[160];
    auth_status ast = auth_handshake(&c->pc, w->o.key, AUTH_SIDE_WORKER, why, sizeof why);
    c->pc.deadline = 0;
    pthread_mutex_lock(&w->mu);
    if (c->ticket) {   /* the entry goes before anything can close the fd */
        greet_done(&w->greet, c->ticket);
        greet_leave(&w->greet);
        c->ticket = 0;
    }
    int n_peers = 0;
    for (wconn *o = w->conns; o; o = o->next) n_peers += o->ready && !o->closed;
    pthread_mutex_unlock(&w->mu);
    if (ast == AUTH_OK && n_peers >= WORKER_MAX_PEERS) {
        log_warn("worker: %s: refused: %d connections already (at most %d)", c->peer, n_peers, WORKER_MAX_PEERS);
        worker_send_error(c, 0, PROTO_E_BUSY, "too many connections to this worker");
    } else if (ast != AUTH_OK) {
        log_warn("worker: %s: refused: %s", c->peer, why);
    }
    if (ast != AUTH_OK || n_peers >= WORKER_MAX_PEERS) {
        worker_linger(c->fd);
        pthread_mutex_lock(&w->mu);
        c->closed = true;
        worker_conn_unref_locked(w, c);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    worker_send_hello(w, c, reg);   /* before it is ready: HELLO is the first sealed frame */
    pthread_mutex_lock(&w->mu);
    c->ready = true;
    pthread_mutex_unlock(&w->mu);
    for (;;) {
        proto_msg m;
        proto_status st = proto_recv(&c->pc, &m);
        if (st != PROTO_OK) {
            bool stopping;
            pthread_mutex_lock(&w->mu);
            stopping = w->stop;
            pthread_mutex_unlock(&w->mu);
            if (st == PROTO_ERR_CLOSED || (st == PROTO_ERR_IO && stopping)) {
                log_info("worker: %s: connection closed", c->peer);
            } else if (st == PROTO_ERR_IO) {
                log_info("worker: %s: connection lost (%s)", c->peer, strerror(errno));
            } else {
                log_warn("worker: %s: refused a frame (type %u, %u bytes): %s; closing the connection", c->peer,
                         m.hdr.type, m.hdr.len, proto_status_name(st));
                worker_send_error(c, 0, PROTO_E_MALFORMED, proto_status_name(st));
                worker_linger(c->fd);
            }
            break;
        }
        switch (m.hdr.type) {
        case PROTO_HELLO:
            /* a gateway answers a registration's HELLO with its own only once it took the
             * worker in: only then is it registered */
            if (reg) {
                log_info("worker: registered with the %s as %s", c->peer, w->name);
                pthread_mutex_lock(&w->mu);
                w->last_refusal[0] = 0;
                pthread_mutex_unlock(&w->mu);
            }
            else log_info("worker: %s: hello from %s %s", c->peer, proto_role_name(m.u.hello.role),
                          m.u.hello.name ? m.u.hello.name : "");
            proto_msg_free(&m);
            continue;
        case PROTO_HEARTBEAT:
            continue;
        case PROTO_PREFILL:
        case PROTO_DECODE:
            worker_start_job(w, c, &m);
            continue;
        case PROTO_CANCEL:
            pthread_mutex_lock(&w->mu);
            for (wjob *j = c->jobs; j; j = j->next)
                if (j->id == m.hdr.req_id) {
                    j->cancel = true;
                    if (j->req) sched_cancel(j->req);
                }
            pthread_mutex_unlock(&w->mu);
            continue;
        case PROTO_DRAIN:
            if (m.hdr.flags & PROTO_F_UNDRAIN) worker_undrain(w, c);
            else if (!m.u.drain.done) worker_drain_start(w, m.u.drain.deadline_ms ? (int)m.u.drain.deadline_ms : 60000, true);
            continue;
        case PROTO_WINFETCH:
            worker_window_serve(w, c, &m);
            continue;
        case PROTO_WINSTATE:
            if (!m.hdr.req_id) worker_window_keep(w, c, &m);
            proto_msg_free(&m);
            continue;
        case PROTO_ERROR:
            if (reg && !m.hdr.req_id && m.u.error.code != PROTO_E_MALFORMED)
                worker_refused_log(w, c, m.u.error.msg ? m.u.error.msg : "");
            else
                log_warn("worker: %s: error from the peer (req %llu): %u %s", c->peer, (unsigned long long)m.hdr.req_id,
                         m.u.error.code, m.u.error.msg ? m.u.error.msg : "");
            bool conn_level = m.hdr.req_id == 0;
            proto_msg_free(&m);
            if (conn_level) goto out;
            continue;
        default:
            log_warn("worker: %s: unexpected %s frame from the gateway; closing the connection", c->peer,
                     proto_type_name(m.hdr.type));
            proto_msg_free(&m);
            worker_send_error(c, 0, PROTO_E_MALFORMED, "unexpected frame type");
            goto out;
        }
    }
out:
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_lock(&w->mu);
    c->closed = true;
    for (wjob *j = c->jobs; j; j = j->next) {
        j->cancel = true;
        if (j->req) sched_cancel(j->req);
    }
    worker_conn_unref_locked(w, c);
    pthread_mutex_unlock(&w->mu);
}

static wconn *worker_conn_new(worker *w, int fd, const char *peer)
{
    wconn *c = xcalloc(1, sizeof *c);
    c->w = w;
    c->fd = fd;
    proto_conn_init(&c->pc, fd);
    c->refs = 1;
    pthread_mutex_init(&c->send_mu, NULL);
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    return c;
}

typedef struct {
    worker *w;
    wconn *c;
} worker_reader_arg;

static void *worker_reader_thread(void *arg)
{
    worker_reader_arg *a = arg;
    worker *w = a->w;
    worker_serve_conn(w, a->c, false);
    free(a);
    pthread_mutex_lock(&w->mu);
    w->n_active--;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void *worker_accept_thread(void *arg)
{
    worker *w = arg;
    for (;;) {
        char host[GREET_HOST_MAX];
        int fd = proto_accept(w->listen_fd, host, sizeof host);
        pthread_mutex_lock(&w->mu);
        bool stop = w->stop;
        pthread_mutex_unlock(&w->mu);
        if (stop) {
            if (fd >= 0) close(fd);
            break;
        }
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            struct timespec ts = { 0, 10000000 };
            nanosleep(&ts, NULL);
            continue;
        }
        char peer[80];
        snprintf(peer, sizeof peer, "%s (fd %d)", host[0] ? host : "peer", fd);
        pthread_mutex_lock(&w->mu);
        int evicted = -1;
        uint64_t ticket = greet_add(&w->greet, fd, host, &evicted);
        if (evicted >= 0 && util_now() - w->t_evict_log >= 10) {   /* a flood: one line per 10 s */
            w->t_evict_log = util_now();
            log_warn("worker: %d handshakes in progress: the oldest of the busiest address made room for %s "
                     "(%llu cut so far)", w->greet.n_max, host[0] ? host : "?", (unsigned long long)w->greet.n_evicted);
        }
        if (!ticket) {   /* the cut handshakes' threads have not left yet */
            pthread_mutex_unlock(&w->mu);
            close(fd);
            continue;
        }
        wconn *c = worker_conn_new(w, fd, peer);
        c->ticket = ticket;
        worker_reader_arg *a = xmalloc(sizeof *a);
        a->w = w;
        a->c = c;
        w->n_active++;
        pthread_mutex_unlock(&w->mu);
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t th;
        if (pthread_create(&th, &at, worker_reader_thread, a) != 0) {
            pthread_mutex_lock(&w->mu);
            w->n_active--;
            greet_done(&w->greet, c->ticket);
            greet_leave(&w->greet);
            worker_conn_unref_locked(w, c);
            pthread_mutex_unlock(&w->mu);
            free(a);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

/* Sleeps up to ms or until stop; true when stopping. */
bool worker_nap(worker *w, int ms)
{
    pthread_mutex_lock(&w->mu);
    if (!w->stop) util_cond_wait_ms(&w->cv, &w->mu, ms);
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

void *worker_register_thread(void *arg)
{
    worker *w = arg;
    bool warned = false;
    while (!worker_nap(w, 0)) {
        int fd = proto_connect(w->o.gateway, 2000);
        if (fd < 0) {
            if (!warned) log_warn("worker: cannot reach the gateway %s (%s): retrying every second", w->o.gateway,
                                  strerror(errno));
            warned = true;
            if (worker_nap(w, 1000)) break;
            continue;
        }
        warned = false;
        char peer[80];
        snprintf(peer, sizeof peer, "gateway %.60s", w->o.gateway);
        wconn *c = worker_conn_new(w, fd, peer);
        worker_serve_conn(w, c, true);
        if (worker_nap(w, 1000)) break;
    }
    return NULL;
}

/* Sends msg to every open connection (outside w->mu). */
void worker_broadcast(worker *w, const proto_msg *m)
{
    pthread_mutex_lock(&w->mu);
    int n = 0;
    for (wconn *c = w->conns; c; c = c->next) n += c->ready && !c->closed;
    wconn **cs = xcalloc((size_t)(n ? n : 1), sizeof *cs);
    n = 0;
    for (wconn *c = w->conns; c; c = c->next)
        if (c->ready && !c->closed) {
            c->refs++;
            cs[n++] = c;
        }
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < n; i++) worker_send(cs[i], m);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < n; i++) worker_conn_unref_locked(w, cs[i]);
    pthread_mutex_unlock(&w->mu);
    free(cs);
}

void *worker_hb_thread(void *arg)
{
    worker *w = arg;
    int ms = w->o.heartbeat_ms > 0 ? w->o.heartbeat_ms : 500;
    while (!worker_nap(w, ms)) {
        worker_window_report(w);
        sched_stats ss;
        sched_get_stats(w->s, &ss);
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_HEARTBEAT;
        proto_heartbeat *h = &m.u.heartbeat;
        h->n_running = (uint32_t)ss.n_running;
        h->n_queued = (uint32_t)ss.n_queued;
        h->kv_blocks_free = (uint32_t)(ss.kv_blocks_free + ss.kv_blocks_cached);
        h->kv_blocks_total = (uint32_t)ss.kv_blocks_total;
        h->n_prefill_tokens = ss.n_prefill_tokens;
        h->n_gen_tokens = ss.n_gen_tokens;
        h->busy_us = (uint64_t)(ss.step_s * 1e6);
        if (ss.step_model_warm) {   /* the gateway's prefill cost model uses it (balance.h) */
            m.hdr.flags |= PROTO_F_STEPTIME;
            for (int i = 0; i < 4; i++) h->step_w[i] = (float)ss.step_model_w[i];
        }
        pthread_mutex_lock(&w->mu);
        h->draining = w->draining;
        h->n_handoffs_out = w->n_handoffs_out;
        h->handoff_out_tokens = w->handoff_out_tokens;
        h->handoff_out_us = w->handoff_out_us;
        h->n_handoffs_in = w->n_handoffs_in;
        h->handoff_in_tokens = w->handoff_in_tokens;
        h->handoff_in_us = w->handoff_in_us;
        for (wconn *c = w->conns; c; c = c->next)
            for (wjob *j = c->jobs; j; j = j->next) {
                h->sum_cache_len += (uint64_t)j->ctx_len;
                if (j->msg.hdr.type == PROTO_PREFILL && !j->first_done) {
                    uint32_t np = j->msg.u.prefill.n_prompt, hit = j->msg.u.prefill.hit_len;
                    h->uncached_queued += np > hit ? np - hit : 0;
                }
            }
        pthread_mutex_unlock(&w->mu);
        worker_broadcast(w, &m);
    }
    return NULL;
}
