/*
 * worker: serving the cluster protocol on one engine + scheduler: its life (worker_new,
 * worker_free) and its drain. See worker.h for the design, worker_int.h for how the files
 * divide the work; the frames are in docs/protocol.md.
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

/* ---- drain ---- */

static void *worker_drain_thread(void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->mu);
    uint64_t gen = w->drain_gen;
    pthread_mutex_unlock(&w->mu);
    double deadline = util_now() + w->drain_deadline_ms / 1000.0;
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DRAIN;
    m.u.drain.deadline_ms = (uint32_t)w->drain_deadline_ms;
    worker_broadcast(w, &m);
    log_info("worker: draining (deadline %d ms)", w->drain_deadline_ms);
    pthread_mutex_lock(&w->mu);
    while (w->n_jobs > 0 && !w->stop && util_now() < deadline && w->drain_gen == gen && w->draining) {
        pthread_mutex_unlock(&w->mu);
        worker_nap(w, 50);
        pthread_mutex_lock(&w->mu);
    }
    if (w->drain_gen != gen || !w->draining) {   /* undrained meanwhile: the jobs go on here */
        pthread_mutex_unlock(&w->mu);
        return NULL;
    }
    int n_moved = 0;
    for (wconn *c = w->conns; c; c = c->next)
        for (wjob *j = c->jobs; j; j = j->next) {
            j->moved = true;
            n_moved++;
            if (j->req) sched_cancel(j->req);
        }
    while (w->n_jobs > 0) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    if (n_moved) log_info("worker: drain deadline: %d requests reported moved", n_moved);
    pthread_mutex_lock(&w->mu);
    bool current = w->drain_gen == gen && w->draining;
    pthread_mutex_unlock(&w->mu);
    if (!current) return NULL;   /* undrained while its last jobs ended */
    m.u.drain.done = 1;
    m.u.drain.deadline_ms = 0;
    worker_broadcast(w, &m);
    pthread_mutex_lock(&w->mu);
    if (w->drain_gen == gen && w->draining) w->drained = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    log_info("worker: drained");
    return NULL;
}

/* Starts a drain; remote: asked by a gateway (which may undo it), else the worker's own (a
 * signal: it exits when drained, so no gateway undoes it). A local drain turns a remote one in
 * progress into its own. */
void worker_drain_start(worker *w, int deadline_ms, bool remote)
{
    pthread_mutex_lock(&w->mu);
    if (!remote) w->drain_remote = false;
    if (w->draining || w->stop) {
        pthread_mutex_unlock(&w->mu);
        return;
    }
    /* the thread of an earlier drain, undone since, has returned or is about to */
    while (w->has_drain) {
        pthread_t t = w->drain_thr;
        w->has_drain = false;
        pthread_mutex_unlock(&w->mu);
        pthread_join(t, NULL);
        pthread_mutex_lock(&w->mu);
    }
    if (w->draining || w->stop) {
        pthread_mutex_unlock(&w->mu);
        return;
    }
    w->draining = true;
    w->drained = false;
    w->drain_remote = remote;
    w->drain_gen++;
    w->drain_deadline_ms = deadline_ms > 0 ? deadline_ms : 60000;
    w->has_drain = pthread_create(&w->drain_thr, NULL, worker_drain_thread, w) == 0;
    if (!w->has_drain) w->drained = true;
    pthread_mutex_unlock(&w->mu);
}

void worker_drain(worker *w, int deadline_ms) { worker_drain_start(w, deadline_ms, false); }

/* UNDRAIN from a gateway: a drain it asked for ends, and the worker takes jobs again (its next
 * heartbeat says so). A drain of the worker's own (a signal) is not undone. */
void worker_undrain(worker *w, wconn *c)
{
    pthread_mutex_lock(&w->mu);
    bool ok = w->draining && w->drain_remote && !w->stop;
    if (ok) {
        w->draining = false;
        w->drained = false;
        w->drain_gen++;   /* the drain thread, waiting or done, stops and sends nothing more */
        pthread_cond_broadcast(&w->cv);
    }
    bool draining = w->draining;
    pthread_mutex_unlock(&w->mu);
    if (ok) log_info("worker: undrained by the %s: taking jobs again", c->peer);
    else if (draining) log_warn("worker: %s asks to undrain, but this worker drains to exit: ignored", c->peer);
}

bool worker_drained(worker *w)
{
    pthread_mutex_lock(&w->mu);
    bool d = w->drained;
    pthread_mutex_unlock(&w->mu);
    return d;
}

/* ---- life ---- */

int worker_port(const worker *w) { return w->port; }
const char *worker_name(const worker *w) { return w->name; }

/* --name, else one no other worker has: this machine's name and the port it listens on (or,
 * registering only, its process id), so that two workers started alike are told apart. */
static void worker_default_name(worker *w)
{
    if (w->o.name && w->o.name[0]) {
        snprintf(w->name, sizeof w->name, "%s", w->o.name);
        return;
    }
    char host[64] = "";
    if (gethostname(host, sizeof host) || !host[0]) snprintf(host, sizeof host, "worker");
    host[sizeof host - 1] = 0;
    if (w->port > 0) snprintf(w->name, sizeof w->name, "%s:%d", host, w->port);
    else snprintf(w->name, sizeof w->name, "%s/%d", host, (int)getpid());
}

worker *worker_new(const worker_opts *o, engine *e, sched *s, store *st, blockio *bio)
{
    if (!o->key || !o->key->n) {
        log_error("worker: no cluster key");
        return NULL;
    }
    worker *w = xcalloc(1, sizeof *w);
    w->o = *o;
    if (w->o.max_seqs <= 0) w->o.max_seqs = 16;
    if (w->o.n_ctx <= 0) w->o.n_ctx = sched_n_ctx(s);
    w->e = e;
    w->s = s;
    w->st = st;
    w->bio = bio;
    w->m = engine_model(e);
    w->listen_fd = -1;
    w->port = -1;
    blockkey_pool_fp(w->m->fingerprint, (int32_t)kvpool_dtype(engine_kvpool(e)), w->pool_fp);
    greet_init(&w->greet, WORKER_GREET);
    pthread_mutex_init(&w->mu, NULL);
    util_cond_init(&w->cv);
    pthread_mutex_init(&w->pump_mu, NULL);
    pthread_cond_init(&w->pump_cv, NULL);
    w->gcache = grammar_cache_new(256);
    pthread_cond_init(&w->handoff_cv, NULL);
    pthread_mutex_init(&w->wrep_mu, NULL);
    w->wc = sched_wincache(s);
    if (w->wc) {
        w->wev = xcalloc(PROTO_MAX_WINDOW_EVENTS, sizeof *w->wev);
        w->wpev = xcalloc(PROTO_MAX_WINDOW_EVENTS, sizeof *w->wpev);
        wincache_journal_start(w->wc, 4 * PROTO_MAX_WINDOW_EVENTS);
    }
    for (int i = 0; i < WORKER_PUMPS; i++)
        if (pthread_create(&w->pumps[w->n_pumps], NULL, worker_pump_thread, w) == 0) w->n_pumps++;
    w->has_handoff = pthread_create(&w->handoff_thr, NULL, worker_handoff_thread, w) == 0;
    if (!w->n_pumps || !w->has_handoff) {
        log_error("worker: cannot start the job threads");
        worker_free(w);
        return NULL;
    }
    if (o->listen) {
        w->listen_fd = proto_listen(o->listen, 64);
        if (w->listen_fd < 0) {
            log_error("worker: cannot listen on %s: %s", o->listen, strerror(errno));
            worker_free(w);
            return NULL;
        }
        w->port = proto_local_port(w->listen_fd);
    }
    worker_default_name(w);
    if (w->listen_fd >= 0) w->has_accept = pthread_create(&w->accept_thr, NULL, worker_accept_thread, w) == 0;
    w->has_hb = pthread_create(&w->hb_thr, NULL, worker_hb_thread, w) == 0;
    if (o->gateway) w->has_reg = pthread_create(&w->reg_thr, NULL, worker_register_thread, w) == 0;
    return w;
}

void worker_free(worker *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    for (wconn *c = w->conns; c; c = c->next) {
        shutdown(c->fd, SHUT_RDWR);
        for (wjob *j = c->jobs; j; j = j->next) {
            j->cancel = true;
            if (j->req) sched_cancel(j->req);
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (w->listen_fd >= 0) shutdown(w->listen_fd, SHUT_RDWR);
    if (w->has_accept) pthread_join(w->accept_thr, NULL);
    if (w->has_reg) pthread_join(w->reg_thr, NULL);
    if (w->has_hb) pthread_join(w->hb_thr, NULL);
    if (w->has_drain) pthread_join(w->drain_thr, NULL);
    pthread_mutex_lock(&w->mu);
    while (w->n_active > 0 || w->n_jobs > 0) {
        for (wconn *c = w->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
        pthread_cond_wait(&w->cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&w->pump_mu);
    w->pump_stop = true;
    pthread_cond_broadcast(&w->pump_cv);
    pthread_cond_broadcast(&w->handoff_cv);
    pthread_mutex_unlock(&w->pump_mu);
    for (int i = 0; i < w->n_pumps; i++) pthread_join(w->pumps[i], NULL);
    if (w->has_handoff) pthread_join(w->handoff_thr, NULL);
    if (w->listen_fd >= 0) close(w->listen_fd);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->pump_mu);
    pthread_cond_destroy(&w->pump_cv);
    pthread_cond_destroy(&w->handoff_cv);
    grammar_cache_free(w->gcache);
    pthread_mutex_destroy(&w->wrep_mu);
    free(w->wev);
    free(w->wpev);
    free(w);
}
