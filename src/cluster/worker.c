/*
 * worker: serving the cluster protocol on one engine + scheduler. See worker.h for the
 * design; the frames are in docs/protocol.md.
 *
 * Thread life: the accept, heartbeat, register and pump threads are joined by worker_free;
 * reader threads are detached and counted in w->n_active (worker_free waits for zero, and for
 * no job left, after closing every connection, which cancels their jobs). A connection is
 * freed (its fd closed) when its last reference goes: the reader holds one, each of its jobs
 * one.
 */
#include "cluster/worker.h"

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
#include "cluster/greet.h"
#include "cluster/proto.h"
#include "engine/wincache.h"
#include "util/util.h"

#define WORKER_FLUSH_WAIT_S 5.0   /* longest a prefill waits for its blocks' write-behind */
#define WORKER_MAX_PEERS 16       /* connections past the handshake at once (gateways); a
                                   * peer beyond them is refused (ERROR BUSY) */
#define WORKER_GREET 8            /* handshakes in progress at once on --listen (greet.h) */
#define WORKER_PUMPS 2            /* threads that submit jobs and turn their outputs into frames:
                                   * one is enough to keep up with the engine; the second keeps
                                   * the streams going while the other compiles a grammar or
                                   * writes to a slow socket (a prefill's wait for its store
                                   * writes is the handoff thread's, never a pump's) */

typedef struct wconn wconn;
typedef struct wjob wjob;

struct wconn {
    worker *w;
    int fd;                      /* socket; closed when refs reaches 0 */
    proto_conn pc;               /* fd with its frame tags (sealed by the handshake); tx under
                                  * send_mu, rx the reader's */
    pthread_mutex_t send_mu;     /* whole frames only */
    int refs;                    /* reader + jobs, under w->mu */
    bool closed;                 /* reader has stopped: jobs are cancelled, no more frames */
    bool ready;                  /* handshake done and HELLO sent: broadcasts may go to it
                                  * (listed before, so that worker_free reaches it) */
    wjob *jobs;                  /* this connection's jobs, under w->mu */
    wconn *next;                 /* w->conns */
    char peer[80];               /* for logs */
    uint64_t ticket;             /* accepted: its entry in w->greet until the handshake ends
                                  * (0: none, the register thread's own connection) */
};

struct wjob {
    worker *w;
    wconn *c;                    /* holds a reference */
    uint64_t id;                 /* request id (gateway's) */
    proto_msg msg;               /* the PREFILL or DECODE frame (owned) */
    sched_req *req;              /* under w->mu once submitted */
    bool cancel;                 /* CANCEL or connection gone (under w->mu) */
    bool moved;                  /* drain deadline: report FINISH MOVED (under w->mu) */
    bool first_done;             /* prefill: first token produced (heartbeat figures) */
    int ctx_len;                 /* context positions now (heartbeat), under w->mu */
    double t_recv;               /* util_now() at receipt */
    /* tail KV: prefill exports it (kv_out hook), decode installs it (kv_in hook) */
    uint8_t *tail;               /* (tail_bytes) [layer][k|v][kv_head][pos][head_dim], pool dtype
                                  * (k only in a pool where V is K) */
    size_t tail_bytes;
    int tail_start, tail_n;      /* positions [tail_start, tail_start + tail_n) */
    bool tail_used;              /* decode: the handoff's tail was installed */
    bool kv_in_seen;             /* decode: the kv_in hook ran (first admission) */
    double t_kv_in;              /* util_now() when it ran: the handed-off KV was in place */
    int kv_in_pos;               /* positions valid then (store blocks + installed tail) */
    bool linked;                 /* in c->jobs (under w->mu); unlinked before the last frame */
    wjob *next;                  /* c->jobs */
    /* the pump serving it (worker_pump_thread) */
    bool started;                /* submitted (or refused); the pump's only */
    bool counted;                /* decode: its handoff cost is counted (or it is a resume) */
    sched_output first, fin;     /* prefill: its token (token -1: none yet) and FINISH */
    bool got_fin;                /* prefill: fin holds the FINISH */
    bool queued;                 /* in the ready queue (under pump_mu) */
    bool busy;                   /* a pump serves it now (under pump_mu) */
    bool again;                  /* outputs came meanwhile: serve it again (under pump_mu) */
    wjob *rnext;                 /* ready queue (under pump_mu) */
};

struct worker {
    worker_opts o;
    engine *e;
    sched *s;
    store *st;
    blockio *bio;
    const model *m;
    int listen_fd;               /* -1 without --listen */
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* n_active changed, stop, drain progress */
    bool stop;
    bool draining, drained;
    int drain_deadline_ms;
    wconn *conns;
    int n_active;                /* detached reader threads */
    int n_jobs;
    pthread_t accept_thr, hb_thr, reg_thr, drain_thr;
    char name[128];              /* in HELLO and logs: --name, else HOSTNAME:PORT (or
                                  * HOSTNAME/PID without --listen), unique per gateway */
    greet_table greet;           /* accepted connections in their handshake, under mu */
    double t_evict_log;          /* util_now() of the last line about handshakes cut for room */
    bool drain_remote;           /* the drain came from a gateway (DRAIN): it may undo it */
    char last_refusal[256];      /* the gateway's last refusal of our registration, logged once */
    uint64_t drain_gen;          /* bumped by each drain and undrain: a drain thread of an
                                  * older one stops (under mu) */
    pthread_t pumps[WORKER_PUMPS];
    int n_pumps;                 /* pump threads started */
    pthread_mutex_t pump_mu;     /* the ready queue; never held while calling sched_* or taking mu */
    pthread_cond_t pump_cv;      /* a job was queued, or pump_stop */
    wjob *ready_head, *ready_tail; /* jobs with something to do (a new job, new outputs) */
    bool pump_stop;              /* no job left: the pumps and the handoff thread exit (under pump_mu) */
    pthread_t handoff_thr;       /* answers the prefills that ended (worker_handoff_thread) */
    bool has_handoff;
    pthread_cond_t handoff_cv;   /* a prefill ended, or pump_stop */
    wjob *ho_head, *ho_tail;     /* prefills that ended, to answer (under pump_mu; rnext) */
    grammar_cache *gcache;       /* the jobs' compiled grammars, by kind and source (thread-safe) */
    bool has_accept, has_hb, has_reg, has_drain;
    uint8_t pool_fp[32];         /* blockkey_pool_fp(model, kv dtype) */
    /* handoff cost, lifetime (heartbeat), under mu */
    uint64_t n_handoffs_out;     /* prefill: HANDOFFs sent */
    uint64_t handoff_out_tokens; /* their n_prompt */
    uint64_t handoff_out_us;     /* first token -> HANDOFF sent, microseconds */
    uint64_t n_handoffs_in;      /* decode: handed-off DECODE jobs with KV brought in */
    uint64_t handoff_in_tokens;  /* positions brought in */
    uint64_t handoff_in_us;      /* DECODE receipt -> KV in place, microseconds */
    /* window cache directory reports (models with window layers; wincache.h) */
    wincache *wc;                /* the scheduler's, journaled; NULL without window layers */
    pthread_mutex_t wrep_mu;     /* one report at a time, so that adds and drops keep their order */
    wincache_event *wev;         /* (PROTO_MAX_WINDOW_EVENTS) events being sent, under wrep_mu */
    proto_window_ev *wpev;       /* (PROTO_MAX_WINDOW_EVENTS) their wire form, under wrep_mu */
};

/* ---- connections ---- */

static void worker_conn_unref_locked(worker *w, wconn *c)
{
    if (--c->refs > 0) return;
    for (wconn **pp = &w->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) { *pp = c->next; break; }
    close(c->fd);
    proto_conn_free(&c->pc);
    pthread_mutex_destroy(&c->send_mu);
    free(c);
}

static bool worker_send(wconn *c, const proto_msg *m)
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

static void worker_send_error(wconn *c, uint64_t id, int code, const char *msg)
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

/* ---- tail KV hooks (engine thread) ---- */

/* Bytes of one head_dim row of the pool's type. */
static size_t worker_row(const kvpool *pool, const model *m) { return quant_row_bytes(kvpool_dtype(pool), m->hp.head_dim); }

/* kv_out: copies the partial last block [n_done/128*128, n_done) out of the pool. */
static void worker_kv_out(void *arg, const kvpool *pool, const kvpool_seq *seq, int n_done)
{
    wjob *j = arg;
    const model *m = j->w->m;
    int start = n_done / KVPOOL_BLOCK * KVPOOL_BLOCK, n = n_done - start;
    /* window layers live in a ring, not in the tail's slabs: the decode worker computes the
     * partial block itself (and the window state as a window-cache miss) */
    if (n <= 0 || j->tail || kvpool_n_window_layers(pool) > 0) return;
    size_t row = worker_row(pool, m);
    int parts = kvpool_n_parts(pool);
    size_t bytes = (size_t)m->hp.n_layers * (size_t)parts * (size_t)m->hp.n_kv_heads * (size_t)n * row;
    uint8_t *buf = malloc(bytes);
    if (!buf) return;
    uint8_t *p = buf;
    for (int l = 0; l < m->hp.n_layers; l++)
        for (int kv = 0; kv < parts; kv++)
            for (int h = 0; h < m->hp.n_kv_heads; h++) {
                const uint8_t *slab = kvpool_seq_slab(pool, seq, start / KVPOOL_BLOCK, l, kv, h);
                memcpy(p, slab, (size_t)n * row);
                p += (size_t)n * row;
            }
    j->tail = buf;
    j->tail_bytes = bytes;
    j->tail_start = start;
    j->tail_n = n;
}

/* kv_in: installs the handoff's tail when the attached blocks end exactly where it starts. */
static int worker_kv_in(void *arg, kvpool *pool, kvpool_seq *seq, int n_attached)
{
    wjob *j = arg;
    const proto_kv *kv = &j->msg.u.decode.kv;
    const model *m = j->w->m;
    if (!j->kv_in_seen) {           /* first admission: the handed-off KV is in place now */
        j->kv_in_seen = true;
        j->t_kv_in = util_now();
        j->kv_in_pos = n_attached;
    }
    if (j->tail_used || !kv->data || kv->n == 0) return n_attached;
    if ((int)kv->start != n_attached || kv->dtype != kvpool_dtype(pool) || kv->n_parts != kvpool_n_parts(pool) ||
        kv->n_layers != m->hp.n_layers ||
        kv->n_kv_heads != m->hp.n_kv_heads || kv->head_dim != m->hp.head_dim) {
        log_debug("worker: req %llu: tail KV at %u not used (attached %d): recomputed",
                  (unsigned long long)j->id, kv->start, n_attached);
        return n_attached;
    }
    double t0 = util_now();
    if (kvpool_seq_reserve(pool, seq, (int)(kv->start + kv->n)) != KVPOOL_OK) return n_attached;
    size_t row = worker_row(pool, m);
    const uint8_t *p = kv->data;
    for (int l = 0; l < m->hp.n_layers; l++)
        for (int k = 0; k < kv->n_parts; k++)
            for (int h = 0; h < m->hp.n_kv_heads; h++) {
                uint8_t *slab = kvpool_seq_slab(pool, seq, (int)kv->start / KVPOOL_BLOCK, l, k, h);
                memcpy(slab, p, (size_t)kv->n * row);
                p += (size_t)kv->n * row;
            }
    j->tail_used = true;
    j->t_kv_in = util_now();
    j->kv_in_pos = (int)(kv->start + kv->n);
    double us = (j->t_kv_in - t0) * 1e6;
    log_debug("worker: req %llu: handoff tail installed: %u tokens, %u bytes (%.0f B/token), %.1f us (%.2f us/token)",
              (unsigned long long)j->id, kv->n, kv->n_bytes, (double)kv->n_bytes / kv->n, us, us / kv->n);
    return (int)(kv->start + kv->n);
}

/* ---- jobs ---- */

/* Fills sp from a job's params; false when a value is beyond this model (the job is answered
 * ERROR ARG): the reasoning budget's ids must lie in the vocabulary. */
static bool worker_params(const worker *w, const proto_params *pp, sched_params *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->sample = pp->sample;
    sp->max_tokens = pp->max_tokens;
    sp->n_stop_ids = TM_MIN(pp->n_stop_ids, SCHED_MAX_STOP_IDS);
    memcpy(sp->stop_ids, pp->stop_ids, (size_t)sp->n_stop_ids * sizeof sp->stop_ids[0]);
    sp->ignore_eos = pp->ignore_eos;
    sp->logprobs = pp->logprobs;
    sp->top_logprobs = pp->top_logprobs;
    sp->cache_salt = pp->salt;
    sp->cache_class = pp->cache_class;
    sp->think_start = sp->think_end = -1;
    if (pp->think_budget > 0) {   /* the state after gen is replayed by sched_submit */
        int n_vocab = w->m->hp.n_vocab;
        if (pp->think_start >= n_vocab || pp->think_end < 0 || pp->think_end >= n_vocab) return false;
        sp->think_budget = (int)pp->think_budget;
        sp->think_start = pp->think_start;
        sp->think_end = pp->think_end;
        sp->think_open = pp->think_open;
    }
    return true;
}

static int worker_sched_error(sched_status st)
{
    switch (st) {
    case SCHED_ERR_QUEUE_FULL: return PROTO_E_BUSY;
    case SCHED_ERR_TOO_LONG: return PROTO_E_TOO_LONG;
    case SCHED_ERR_ARG: return PROTO_E_ARG;
    case SCHED_ERR_STOPPED: return PROTO_E_DRAINING;
    default: return PROTO_E_INTERNAL;
    }
}

static void worker_tok(const sched_output *o, proto_tok *t)
{
    memset(t, 0, sizeof *t);
    t->token = o->token;
    t->logprob = o->logprob;
    t->n_top = (uint8_t)TM_MIN(o->n_top, PROTO_MAX_TOP);
    for (int i = 0; i < t->n_top; i++) {
        t->top_ids[i] = o->top[i].token;
        t->top_lps[i] = o->top[i].logprob;
    }
}

/* A TOKENS frame with the one token a prefill job produced (when it ends there instead of
 * handing off). */
static void worker_send_one_token(wjob *j, const sched_output *o, bool logprobs)
{
    proto_msg m;
    proto_tok t;
    memset(&m, 0, sizeof m);
    worker_tok(o, &t);
    m.hdr.type = PROTO_TOKENS;
    m.hdr.req_id = j->id;
    m.hdr.flags = logprobs ? PROTO_F_LOGPROBS : 0;
    m.u.tokens.n = 1;
    m.u.tokens.toks = &t;
    worker_send(j->c, &m);
}

/* Takes the job off its connection's list before its last frame goes out, so that the
 * gateway may reuse the request id (a mixed worker's DECODE after its HANDOFF) at once. */
static void worker_job_unlink(wjob *j)
{
    pthread_mutex_lock(&j->w->mu);
    if (j->linked)
        for (wjob **pp = &j->c->jobs; *pp; pp = &(*pp)->next)
            if (*pp == j) { *pp = j->next; break; }
    j->linked = false;
    pthread_mutex_unlock(&j->w->mu);
}

static void worker_broadcast(worker *w, const proto_msg *m);

/* Sends the window states added and dropped since the last report to every connection (the
 * gateway's directory, windir.h). Called before a HANDOFF and a FINISH, so that the gateway
 * knows where the states of a request are by the time it places its next job, and with each
 * heartbeat. */
static void worker_window_report(worker *w)
{
    if (!w->wc) return;
    pthread_mutex_lock(&w->wrep_mu);
    int n;
    while ((n = wincache_events(w->wc, w->wev, PROTO_MAX_WINDOW_EVENTS)) > 0) {
        for (int i = 0; i < n; i++) {
            w->wpev[i].op = w->wev[i].op;
            memcpy(w->wpev[i].key, w->wev[i].key, 32);
            w->wpev[i].ttl_ms = w->wev[i].ttl_ms;
        }
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_WINDOW;
        m.u.window.n = (uint32_t)n;
        m.u.window.ev = w->wpev;
        worker_broadcast(w, &m);
    }
    pthread_mutex_unlock(&w->wrep_mu);
}

/* WINFETCH: the state of the key, or an empty WINSTATE when it is not held (expired,
 * evicted, never here). */
static void worker_window_serve(worker *w, wconn *c, const proto_msg *q)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINSTATE;
    m.hdr.req_id = q->hdr.req_id;
    memcpy(m.u.winstate.key, q->u.winfetch.key, 32);
    size_t eb = wincache_entry_bytes(w->wc);
    uint8_t *buf = eb ? malloc(eb) : NULL;
    if (buf && wincache_peek(w->wc, q->u.winfetch.key, buf, util_now())) {
        m.u.winstate.n_bytes = (uint32_t)eb;
        m.u.winstate.data = buf;
    }
    log_debug("worker: %s: window fetch %llu: %s", c->peer, (unsigned long long)q->hdr.req_id,
              m.u.winstate.n_bytes ? "sent" : "not held");
    worker_send(c, &m);
    free(buf);
}

/* WINSTATE from the gateway: a state another worker produced, for a job about to come. The
 * payload is checked against this model's geometry (its size); one that does not fit is
 * logged and dropped (the job replays). */
static void worker_window_keep(worker *w, wconn *c, const proto_msg *m)
{
    size_t eb = wincache_entry_bytes(w->wc);
    if (!eb || m->u.winstate.n_bytes != eb) {
        log_warn("worker: %s: a window state of %u bytes, this model's are %zu: not kept", c->peer,
                 m->u.winstate.n_bytes, eb);
        return;
    }
    wincache_put_fetched(w->wc, m->u.winstate.key, m->u.winstate.data, util_now());
}

/* The request's FINISH with its usage (fin: the scheduler's record, whose drafts are this
 * worker's; NULL: none, as when it ended at its first token) and the figures given. */
static void worker_send_finish(wjob *j, int reason, int n_prompt, int n_cached, int n_completion, double ttft,
                               const sched_output *fin)
{
    worker_window_report(j->w);
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_FINISH;
    m.hdr.req_id = j->id;
    m.u.finish.reason = (uint8_t)reason;
    m.u.finish.prompt_tokens = (uint32_t)n_prompt;
    m.u.finish.cached_tokens = (uint32_t)TM_MIN(n_cached, n_prompt);
    m.u.finish.completion_tokens = (uint32_t)n_completion;
    m.u.finish.ttft_us = ttft > 0 ? (uint32_t)(ttft * 1e6) : 0;
    if (fin && (fin->usage.accepted_drafts > 0 || fin->usage.rejected_drafts > 0)) {
        m.hdr.flags |= PROTO_F_DRAFTS;
        m.u.finish.accepted_drafts = (uint32_t)TM_MIN(fin->usage.accepted_drafts, n_completion);
        m.u.finish.rejected_drafts = (uint32_t)TM_MIN(fin->usage.rejected_drafts, n_completion * SPEC_MAX_K);
    }
    worker_job_unlink(j);
    worker_send(j->c, &m);
}

static int worker_finish_reason(wjob *j, sched_finish f)
{
    if (f == SCHED_FINISH_CANCELLED) {
        pthread_mutex_lock(&j->w->mu);
        bool moved = j->moved;
        pthread_mutex_unlock(&j->w->mu);
        return moved ? PROTO_FINISH_MOVED : PROTO_FINISH_CANCELLED;
    }
    return f == SCHED_FINISH_STOP ? PROTO_FINISH_STOP : f == SCHED_FINISH_LENGTH ? PROTO_FINISH_LENGTH
                                                                                 : PROTO_FINISH_ERROR;
}

/* Waits for the write-behind to take what is queued now, then counts the stored leading
 * full blocks of the prompt. */
static int worker_stored_prefix(worker *w, const proto_prefill_job *p)
{
    int n_full = (int)p->n_prompt / KVPOOL_BLOCK;
    if (!w->st || !w->bio || n_full == 0) return 0;
    (void)blockio_wait_writes(w->bio, (int)(WORKER_FLUSH_WAIT_S * 1000));
    uint8_t root[32] = { 0 };
    if (p->params.salt && *p->params.salt) blockkey_root(p->params.salt, strlen(p->params.salt), root);
    uint8_t (*keys)[32] = malloc((size_t)n_full * 32);
    if (!keys) return 0;
    blockkey_chain(root, p->prompt, n_full, w->pool_fp, keys);
    int n = store_exists(w->st, (const uint8_t (*)[32])keys, n_full);
    free(keys);
    return n * KVPOOL_BLOCK;
}

static void worker_job_ready(void *arg);

/* Submits, records the handle, applies a cancel that came first. */
static sched_status worker_submit(wjob *j, sched_params *sp)
{
    sp->on_output = worker_job_ready;   /* the engine thread wakes a pump for each output */
    sp->out_arg = j;
    sched_req *r = NULL;
    sched_status st = sched_submit(j->w->s, sp, &r);
    if (st != SCHED_OK) return st;
    pthread_mutex_lock(&j->w->mu);
    j->req = r;
    if (j->cancel || j->moved) sched_cancel(r);
    pthread_mutex_unlock(&j->w->mu);
    return SCHED_OK;
}

/* Submits the job to the scheduler; false (ERROR sent) when it is refused. */
static bool worker_job_start(wjob *j)
{
    worker *w = j->w;
    sched_params sp;
    bool ok;
    if (j->msg.hdr.type == PROTO_PREFILL) {
        const proto_prefill_job *p = &j->msg.u.prefill;
        ok = worker_params(w, &p->params, &sp);
        sp.prompt = p->prompt;
        sp.n_prompt = (int)p->n_prompt;
        sp.max_tokens = 1;
        sp.kv_out = worker_kv_out;
        if (j->msg.hdr.flags & PROTO_F_EMBED) sp.embed = (model_pool)p->embed;   /* worker_embed_done answers */
    } else {
        const proto_decode_job *d = &j->msg.u.decode;
        ok = worker_params(w, &d->params, &sp);
        sp.prompt = d->prompt;
        sp.n_prompt = (int)d->n_prompt;
        sp.gen = d->gen;
        sp.n_gen = (int)d->n_gen;
        sp.n_sampled = (int)d->n_sampled;
        sp.kv_in = worker_kv_in;   /* installs the tail (HAS_TAIL); times the KV's arrival always */
        j->counted = (j->msg.hdr.flags & PROTO_F_RESUME) != 0;   /* a resume is no handoff */
        j->ctx_len = (int)(d->n_prompt + d->n_gen);
    }
    sp.kv_arg = j;
    const proto_params *pp = j->msg.hdr.type == PROTO_PREFILL ? &j->msg.u.prefill.params : &j->msg.u.decode.params;
    grammar *g = NULL;
    if (ok && pp->grammar) {
        /* compiled here, on the pump, through the cache: the gateway compiled the same source,
         * so this fails only when the builds differ; then the job is refused naming why */
        char err[PROTO_MAX_STR - 32] = "no vocabulary for grammars on this worker";
        grammar_status gs = w->o.gvocab ? grammar_cache_get(w->gcache, (grammar_kind)pp->grammar_kind, pp->grammar,
                                                            pp->grammar_len, &g, err, sizeof err)
                                        : GRAMMAR_ERR_INVALID;
        if (gs != GRAMMAR_OK) {
            char msg[PROTO_MAX_STR];
            snprintf(msg, sizeof msg, "grammar: %s", err);
            log_info("worker: req %llu refused: %s", (unsigned long long)j->id, msg);
            worker_job_unlink(j);
            worker_send_error(j->c, j->id, PROTO_E_ARG, msg);
            return false;
        }
        sp.grammar = g;
        sp.grammar_vocab = w->o.gvocab;
        sp.grammar_lazy = pp->grammar_lazy;   /* sched_submit checks the trigger is in the vocabulary */
        sp.grammar_trigger = pp->grammar_trigger;
    }
    sched_status st = ok ? worker_submit(j, &sp) : SCHED_ERR_ARG;
    grammar_free(g);   /* sched_submit took its own reference */
    if (st != SCHED_OK) {
        worker_job_unlink(j);
        worker_send_error(j->c, j->id, worker_sched_error(st), sched_status_name(st));
        return false;
    }
    return true;
}

/* An embedding PREFILL that ended: its vector (EMBEDDING) when computed, then FINISH. */
static void worker_embed_done(wjob *j)
{
    const sched_output fin = j->fin;
    const float *v = fin.finish == SCHED_FINISH_STOP && j->req ? sched_embedding(j->req) : NULL;
    if (v) {
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_EMBEDDING;
        m.hdr.req_id = j->id;
        m.u.embedding.n = (uint32_t)j->w->m->hp.dim;
        m.u.embedding.v = (float *)v;
        worker_send(j->c, &m);
    }
    worker_send_finish(j, v ? PROTO_FINISH_STOP : worker_finish_reason(j, fin.finish), (int)j->msg.u.prefill.n_prompt, 0, 0,
                       fin.ttft_s, NULL);
}

/* A prefill whose request ended (its one token, or cancelled / failed): HANDOFF, or the
 * token and FINISH when the request ends there. */
static void worker_prefill_done(wjob *j)
{
    worker *w = j->w;
    const proto_prefill_job *p = &j->msg.u.prefill;
    const sched_output first = j->first, fin = j->fin;
    if (j->msg.hdr.flags & PROTO_F_EMBED) {
        worker_embed_done(j);
        return;
    }
    double t_first = util_now();
    pthread_mutex_lock(&w->mu);
    j->first_done = true;
    pthread_mutex_unlock(&w->mu);
    int n_prompt = (int)p->n_prompt, n_cached = fin.usage.cached_tokens;
    if (first.token < 0 || fin.finish != SCHED_FINISH_LENGTH || first.is_stop) {
        /* ended at the first token (stop), or cancelled / failed before it */
        if (first.token >= 0) worker_send_one_token(j, &first, p->params.logprobs);
        worker_send_finish(j, worker_finish_reason(j, fin.finish), n_prompt, n_cached, first.token >= 0,
                           fin.ttft_s, NULL);
        return;
    }
    if (p->params.max_tokens == 1 || n_prompt + 1 >= w->o.n_ctx) {
        worker_send_one_token(j, &first, p->params.logprobs);
        worker_send_finish(j, PROTO_FINISH_LENGTH, n_prompt, n_cached, 1, fin.ttft_s, NULL);
        return;
    }
    int n_stored = worker_stored_prefix(w, p);
    worker_window_report(w);   /* before the HANDOFF: the decode job placed on it fetches them */
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HANDOFF;
    m.hdr.req_id = j->id;
    proto_handoff *h = &m.u.handoff;
    worker_tok(&first, &h->first);
    h->n_prompt = (uint32_t)n_prompt;
    h->n_cached = (uint32_t)n_cached;
    h->n_computed = (uint32_t)(n_prompt - n_cached);
    h->n_stored = (uint32_t)n_stored;
    h->n_sampled = p->params.sample.temp > 0 ? 1 : 0;
    h->prefill_us = (uint32_t)((util_now() - j->t_recv) * 1e6);
    if (j->tail && j->tail_start == n_stored && j->tail_n > 0) {
        kvpool *pool = engine_kvpool(w->e);
        m.hdr.flags = PROTO_F_HAS_TAIL;
        h->kv.dtype = (uint8_t)kvpool_dtype(pool);
        h->kv.n_parts = (uint8_t)kvpool_n_parts(pool);
        h->kv.n_layers = (uint16_t)w->m->hp.n_layers;
        h->kv.n_kv_heads = (uint16_t)w->m->hp.n_kv_heads;
        h->kv.head_dim = (uint16_t)w->m->hp.head_dim;
        h->kv.start = (uint32_t)j->tail_start;
        h->kv.n = (uint32_t)j->tail_n;
        h->kv.n_bytes = (uint32_t)j->tail_bytes;
        h->kv.data = j->tail;
    }
    double t0 = util_now();
    worker_job_unlink(j);
    bool sent = worker_send(j->c, &m);
    double t1 = util_now();
    if (sent) {
        pthread_mutex_lock(&w->mu);
        w->n_handoffs_out++;
        w->handoff_out_tokens += (uint64_t)n_prompt;
        w->handoff_out_us += (uint64_t)((t1 - t_first) * 1e6);
        pthread_mutex_unlock(&w->mu);
    }
    log_debug("worker: req %llu: handoff: prompt %d, cached %d, stored %d, tail %d tokens %zu bytes, sent in %.1f us "
              "(%.1f us from the first token)",
              (unsigned long long)j->id, n_prompt, n_cached, n_stored, j->tail_n, j->tail_bytes, (t1 - t0) * 1e6,
              (t1 - t_first) * 1e6);
}

/* Whether answering the prefill that ended waits for the store: it hands off (the request goes
 * on) and the prompt has full blocks the write-behind must have taken first. */
static bool worker_prefill_waits(const wjob *j)
{
    const worker *w = j->w;
    const proto_prefill_job *p = &j->msg.u.prefill;
    bool goes_on = j->first.token >= 0 && j->fin.finish == SCHED_FINISH_LENGTH && !j->first.is_stop &&
                   p->params.max_tokens != 1 && (int)p->n_prompt + 1 < w->o.n_ctx;
    return goes_on && w->st && w->bio && p->n_prompt >= KVPOOL_BLOCK;
}

/* Takes a prefill's outputs; true once it ended (worker_prefill_done answers it). */
static bool worker_prefill_step(wjob *j)
{
    sched_output outs[4];
    int n;
    while ((n = sched_poll(j->req, outs, 4, 0)) > 0)
        for (int i = 0; i < n; i++) {
            if (outs[i].kind == SCHED_OUT_TOKEN) j->first = outs[i];
            else {
                j->fin = outs[i];
                j->got_fin = true;
            }
        }
    return j->got_fin;
}

/* Sends a decode's new tokens (one TOKENS frame per batch taken) and its FINISH; true once
 * it ended. */
static bool worker_decode_step(wjob *j)
{
    worker *w = j->w;
    const proto_decode_job *d = &j->msg.u.decode;
    sched_output outs[64];
    proto_tok toks[64];
    bool ended = false;
    int n;
    while (!ended && (n = sched_poll(j->req, outs, 64, 0)) > 0) {
        int nt = 0;
        for (int i = 0; i < n; i++)
            if (outs[i].kind == SCHED_OUT_TOKEN) worker_tok(&outs[i], &toks[nt++]);
        if (nt && !j->counted) {
            /* the first token came after the admission, so the kv_in hook has run */
            j->counted = true;
            if (j->kv_in_seen && j->kv_in_pos > 0) {
                pthread_mutex_lock(&w->mu);
                w->n_handoffs_in++;
                w->handoff_in_tokens += (uint64_t)j->kv_in_pos;
                w->handoff_in_us += (uint64_t)((j->t_kv_in - j->t_recv) * 1e6);
                pthread_mutex_unlock(&w->mu);
            }
        }
        if (nt) {
            proto_msg m;
            memset(&m, 0, sizeof m);
            m.hdr.type = PROTO_TOKENS;
            m.hdr.req_id = j->id;
            m.hdr.flags = d->params.logprobs ? PROTO_F_LOGPROBS : 0;
            m.u.tokens.n = (uint32_t)nt;
            m.u.tokens.toks = toks;
            worker_send(j->c, &m);
            pthread_mutex_lock(&w->mu);
            j->ctx_len += nt;
            pthread_mutex_unlock(&w->mu);
        }
        for (int i = 0; i < n; i++)
            if (outs[i].kind == SCHED_OUT_FINISH) {
                worker_send_finish(j, worker_finish_reason(j, outs[i].finish), (int)d->n_prompt, (int)d->n_cached,
                                   outs[i].usage.completion_tokens, outs[i].ttft_s, &outs[i]);
                ended = true;
            }
    }
    return ended;
}

/* The job's last frame went out (or it was refused): off its connection, freed. */
static void worker_job_end(wjob *j)
{
    worker *w = j->w;
    worker_job_unlink(j);
    pthread_mutex_lock(&w->mu);
    sched_req *r = j->req;
    j->req = NULL;
    worker_conn_unref_locked(w, j->c);
    w->n_jobs--;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (r) sched_release(r);
    proto_msg_free(&j->msg);
    free(j->tail);
    free(j);
}

/* Appends j to the ready queue and wakes a pump (pump_mu held). */
static void worker_ready_push_locked(worker *w, wjob *j)
{
    j->queued = true;
    j->rnext = NULL;
    if (w->ready_tail) w->ready_tail->rnext = j;
    else w->ready_head = j;
    w->ready_tail = j;
    pthread_cond_signal(&w->pump_cv);
}

/* Queues j for a pump; a job being served is marked to be served again instead, so that one
 * pump at a time serves a job (its frames keep their order). Called by the engine thread
 * under the scheduler's lock (sched_params.on_output) and by the reader: takes pump_mu only,
 * which nobody holds while calling sched_* or taking w->mu. */
static void worker_job_ready(void *arg)
{
    wjob *j = arg;
    worker *w = j->w;
    pthread_mutex_lock(&w->pump_mu);
    if (j->busy) j->again = true;
    else if (!j->queued) worker_ready_push_locked(w, j);
    pthread_mutex_unlock(&w->pump_mu);
}

/* A pump: serves the jobs that have something to do, until worker_free stops it with none
 * left. After a job's FINISH was taken the scheduler queues nothing more for it, so a job that
 * ended is in no queue and may be freed. */
static void *worker_pump_thread(void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->pump_mu);
    for (;;) {
        while (!w->ready_head && !w->pump_stop) pthread_cond_wait(&w->pump_cv, &w->pump_mu);
        wjob *j = w->ready_head;
        if (!j) break;
        w->ready_head = j->rnext;
        if (!w->ready_head) w->ready_tail = NULL;
        j->queued = false;
        j->busy = true;
        j->again = false;
        pthread_mutex_unlock(&w->pump_mu);
        bool ended;
        if (!j->started) {
            j->started = true;
            ended = !worker_job_start(j);
        } else {
            ended = j->msg.hdr.type == PROTO_PREFILL ? worker_prefill_step(j) : worker_decode_step(j);
        }
        if (ended && j->got_fin && worker_prefill_waits(j)) {   /* not on a pump: the handoff thread */
            pthread_mutex_lock(&w->pump_mu);
            j->rnext = NULL;
            if (w->ho_tail) w->ho_tail->rnext = j;
            else w->ho_head = j;
            w->ho_tail = j;
            pthread_cond_signal(&w->handoff_cv);
            continue;
        }
        if (ended) {
            if (j->got_fin) worker_prefill_done(j);
            worker_job_end(j);
            pthread_mutex_lock(&w->pump_mu);
            continue;
        }
        pthread_mutex_lock(&w->pump_mu);
        j->busy = false;
        if (j->again) worker_ready_push_locked(w, j);
    }
    pthread_mutex_unlock(&w->pump_mu);
    return NULL;
}

/* Sends the HANDOFFs that wait for the prompt's full blocks to be in the store
 * (worker_prefill_waits), in order, so that the pumps never wait on the store; a wait covers
 * the writes queued until then, so the prefills behind it mostly find theirs done. */
static void *worker_handoff_thread(void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->pump_mu);
    for (;;) {
        while (!w->ho_head && !w->pump_stop) pthread_cond_wait(&w->handoff_cv, &w->pump_mu);
        wjob *j = w->ho_head;
        if (!j) break;
        w->ho_head = j->rnext;
        if (!w->ho_head) w->ho_tail = NULL;
        pthread_mutex_unlock(&w->pump_mu);
        worker_prefill_done(j);
        worker_job_end(j);
        pthread_mutex_lock(&w->pump_mu);
    }
    pthread_mutex_unlock(&w->pump_mu);
    return NULL;
}

/* Takes ownership of m (a PREFILL or DECODE): checks it, lists it on its connection and hands
 * it to the pumps, which submit it. */
static void worker_start_job(worker *w, wconn *c, proto_msg *m)
{
    int t = m->hdr.type;
    bool role_ok = w->o.role == PROTO_ROLE_MIXED || (t == PROTO_PREFILL && w->o.role == PROTO_ROLE_PREFILL) ||
                   (t == PROTO_DECODE && w->o.role == PROTO_ROLE_DECODE);
    uint64_t id = m->hdr.req_id;
    if (!role_ok || id == 0) {
        proto_msg_free(m);
        worker_send_error(c, id, id ? PROTO_E_ROLE : PROTO_E_ARG, id ? "job type not taken by this role" : "request id 0");
        return;
    }
    pthread_mutex_lock(&w->mu);
    bool dup = false;
    for (wjob *x = c->jobs; x; x = x->next) dup |= x->id == id;
    if (w->draining || dup || w->stop) {
        bool draining = w->draining || w->stop;
        pthread_mutex_unlock(&w->mu);
        proto_msg_free(m);
        worker_send_error(c, id, draining ? PROTO_E_DRAINING : PROTO_E_DUPLICATE,
                          draining ? "worker is draining" : "request id already running");
        return;
    }
    wjob *j = xcalloc(1, sizeof *j);
    j->w = w;
    j->c = c;
    j->id = id;
    j->msg = *m;
    j->t_recv = util_now();
    j->ctx_len = t == PROTO_PREFILL ? (int)m->u.prefill.n_prompt : (int)(m->u.decode.n_prompt + m->u.decode.n_gen);
    j->first.token = -1;
    j->fin.kind = SCHED_OUT_TOKEN;   /* no FINISH yet */
    c->refs++;
    j->next = c->jobs;
    c->jobs = j;
    j->linked = true;
    w->n_jobs++;
    pthread_mutex_unlock(&w->mu);
    worker_job_ready(j);
}

/* ---- connection reader ---- */

static void worker_drain_start(worker *w, int deadline_ms, bool remote);
static void worker_undrain(worker *w, wconn *c);

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

static void *worker_accept_thread(void *arg)
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
static bool worker_nap(worker *w, int ms)
{
    pthread_mutex_lock(&w->mu);
    if (!w->stop) util_cond_wait_ms(&w->cv, &w->mu, ms);
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

static void *worker_register_thread(void *arg)
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
static void worker_broadcast(worker *w, const proto_msg *m)
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

static void *worker_hb_thread(void *arg)
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
static void worker_drain_start(worker *w, int deadline_ms, bool remote)
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
static void worker_undrain(worker *w, wconn *c)
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
