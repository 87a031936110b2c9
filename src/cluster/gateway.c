/*
 * gateway: request tracker over remote workers, dispatcher, acceptor, admin routes (see
 * gateway.h).
 */
#include "cluster/gateway.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "cluster/balance.h"
#include "cluster/proto.h"
#include "util/util.h"

#define GW_MAX_WORKERS 64
#define GW_MAX_RETRIES 8      /* re-sends of one request after BUSY / DRAINING answers */
#define GW_RATE_SLOTS 10      /* seconds of history for the prefill token rate */
#define GW_MAX_GREETING 32    /* registration handshakes in progress at once */

typedef enum { GW_WAIT_PREFILL = 0, GW_PREFILL, GW_WAIT_DECODE, GW_DECODE, GW_DONE } gw_state;

typedef struct {
    bool used;                /* slot taken (static address, or a registered worker) */
    bool connected;           /* a connection is open and its reader runs */
    bool reader_live;         /* the reader thread has not exited yet */
    bool draining;            /* takes no new work */
    bool is_static;           /* from --prefill/--decode: reconnect when down */
    char addr[128];           /* "HOST:PORT" (static or the HELLO's listen), or the peer */
    char name[64];            /* HELLO name, for logs */
    int role;                 /* proto_role from HELLO (static ones before: the list's role) */
    int fd;                   /* the connection, -1 when none */
    pthread_mutex_t send_mu;  /* held while a frame is written to the connection and while
                               * its reader closes it: no write reaches a closed (or reused) fd */
    int send_fd;              /* the connection writers may use (under send_mu), -1 once closed */
    proto_conn *send_conn;    /* its frame tags (under send_mu; the reader's, freed as it closes) */
    uint64_t send_gen;        /* its gen (under send_mu) */
    uint64_t gen;             /* bumped at each connection loss: stale readers are ignored */
    double last_hb;           /* util_now() of the last frame received */
    double next_connect;      /* static: next reconnect attempt */
    proto_heartbeat hb;       /* its last load report (zeros until the first) */
    bool has_curve;           /* hb.step_w holds its learned step-time curve (PROTO_F_STEPTIME) */
    bal_speed speed;          /* prefill tokens/s learned from the reports (balance.h) */
    uint32_t max_seqs;        /* HELLO */
    int kv_dtype;             /* HELLO */
    /* the gateway's own load figures (what it sent and has not seen finish) */
    double queued_s;          /* prefill: cost-model seconds queued */
    int n_prefill;            /* prefill jobs out */
    int n_decode;             /* decode requests running */
    int64_t sum_ctx;          /* their cache lengths, tokens */
    uint64_t n_jobs;          /* lifetime jobs sent */
} gw_worker;

typedef struct gw_req {
    struct gw_req *prev, *next;  /* the gateway's list of live requests */
    uint64_t id;              /* protocol req_id */
    int32_t *prompt;          /* (n_prompt) */
    int n_prompt;
    proto_params params;      /* params.salt owned */
    int64_t expect_len;       /* prompt + max new tokens (decode balancer) */
    int hit_len;              /* stored prefix at submit, tokens */
    uint8_t (*keys)[32];      /* (n_keys) block keys of the prompt's full blocks but the one
                               * holding its last token (gw_keys): the store lookup and the
                               * in-flight prefixes (gw_inflight) */
    int n_keys;
    int32_t *gen;             /* (n_gen) tokens streamed to the client, cap_gen allocated */
    int n_gen, cap_gen;
    int n_cached;             /* prompt tokens cached (the HANDOFF's, else hit_len) */
    uint32_t n_sampled;       /* sampler draws done (HANDOFF) */
    gw_state state;
    bool resume;              /* the next DECODE resumes (no handoff tail) */
    int worker;               /* slot it is on (PREFILL / DECODE), else -1 */
    double cost_s;            /* prefill cost counted in the worker's queued_s */
    int64_t ctx_counted;      /* tokens counted in the decode worker's sum_ctx */
    proto_kv tail;            /* handoff tail KV (tail.data owned) until the DECODE is sent */
    bool has_tail;
    sched_output *outs;       /* queued outputs [out_head, n_out) */
    int n_out, cap_out, out_head;
    bool finished;            /* FINISH queued */
    bool done;                /* FINISH polled */
    int retries;
    double t_submit, t_wait;  /* util_now(): submit, entering the current wait */
    double t_job;             /* util_now(): the current job sent, or its last token (stall check) */
    int job_tokens;           /* tokens the current job has produced */
    int avoid_slot;           /* worker this request stalled on (-1 none): others first */
    uint64_t avoid_gen;       /* that worker's connection */
    double t_first;           /* first token (0 none) */
    bool added_seen;          /* its added latency is counted (h_added) */
    pthread_cond_t cv;
} gw_req;

typedef struct gw_msg {      /* a frame waiting for the dispatcher to send it */
    struct gw_msg *next;
    int slot;
    uint64_t gen;             /* sent only while the worker's connection is this one */
    proto_buf buf;
} gw_msg;

struct gateway {
    gateway_opts o;
    api_backend be;
    pthread_mutex_t mu;
    pthread_cond_t cv_disp;   /* wakes the dispatcher */
    pthread_cond_t cv_workers;/* a worker came up / a reader exited */
    gw_worker w[GW_MAX_WORKERS];
    int n_slots;
    gw_req *reqs;             /* live requests */
    uint64_t next_id;
    gw_msg *out_head, *out_tail;
    bool flushing;            /* a thread is writing the queued frames (gw_flush) */
    bool stop, shut;
    int listen_fd;
    pthread_t disp, acc;
    bool acc_started;
    int greeting_fd[GW_MAX_GREETING]; /* connections in their handshake (-1 free), under mu */
    int n_greeting;           /* their threads still running, under mu */
    int kv_dtype;             /* the workers' KV type (pool fingerprint of block keys), -1 unknown */
    /* counters */
    uint64_t n_requests, n_rejected, n_reprefills, n_resumes, n_prompt_tokens, n_hit_tokens, n_gen_tokens;
    uint64_t n_uncached_tokens;   /* prompt tokens not found in the store, lifetime */
    uint64_t n_bad_conns;         /* connections refused (malformed HELLO / frames) */
    uint64_t n_bad_values;        /* of which: well-formed frames with values out of range */
    uint64_t n_refused_auth;      /* connections that failed the handshake (no / wrong key) */
    uint64_t n_stalls;            /* requests moved off a worker that made no progress */
    uint64_t n_inflight_routed;   /* prefill jobs sent where a prefix of theirs was in flight */
    uint64_t n_inflight_tokens;   /* the tokens they share there, lifetime */
    sched_hist h_added;           /* per request: seconds to its first token here minus the
                                   * worker's own (gw_count_added) */
    double rate_t[GW_RATE_SLOTS]; /* ring: time and n_uncached_tokens once a second */
    uint64_t rate_v[GW_RATE_SLOTS];
    int rate_i;
};

/* ------------------------------------------------------------------ helpers */

static bool gw_can_prefill(const gw_worker *w) { return w->role == PROTO_ROLE_PREFILL || w->role == PROTO_ROLE_MIXED; }
static bool gw_can_decode(const gw_worker *w) { return w->role == PROTO_ROLE_DECODE || w->role == PROTO_ROLE_MIXED; }
static bool gw_usable(const gw_worker *w) { return w->used && w->connected && !w->draining; }

static void gw_queue_msg(gateway *g, int slot, const proto_msg *m)
{
    gw_msg *q = xcalloc(1, sizeof *q);
    q->slot = slot;
    q->gen = g->w[slot].gen;
    proto_buf_init(&q->buf);
    if (proto_encode(&q->buf, m) != PROTO_OK) {
        log_error("gateway: cannot encode a %s frame", proto_type_name(m->hdr.type));
        proto_buf_free(&q->buf);
        free(q);
        return;
    }
    if (g->out_tail) g->out_tail->next = q;
    else g->out_head = q;
    g->out_tail = q;
    pthread_cond_signal(&g->cv_disp);
}

static gw_req *gw_find(gateway *g, uint64_t id)
{
    for (gw_req *r = g->reqs; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

static sched_output *gw_out_slot(gw_req *r)
{
    if (r->out_head > 0 && r->out_head == r->n_out) r->out_head = r->n_out = 0;
    if (r->n_out == r->cap_out) {
        r->cap_out = r->cap_out ? 2 * r->cap_out : 16;
        r->outs = xrealloc(r->outs, (size_t)r->cap_out * sizeof *r->outs);
    }
    sched_output *o = &r->outs[r->n_out++];
    memset(o, 0, sizeof *o);
    return o;
}

/* Takes the request off its worker's load figures. */
static void gw_unload(gateway *g, gw_req *r)
{
    if (r->worker < 0) return;
    gw_worker *w = &g->w[r->worker];
    if (r->state == GW_PREFILL) {
        w->queued_s -= r->cost_s;
        if (w->queued_s < 0) w->queued_s = 0;
        if (w->n_prefill > 0) w->n_prefill--;
    } else if (r->state == GW_DECODE) {
        if (w->n_decode > 0) w->n_decode--;
        w->sum_ctx -= r->ctx_counted;
        if (w->sum_ctx < 0) w->sum_ctx = 0;
    }
    r->ctx_counted = 0;
    r->worker = -1;
}

static bool gw_is_stop(const gateway *g, const gw_req *r, int32_t tok)
{
    for (int i = 0; i < r->params.n_stop_ids; i++)
        if (r->params.stop_ids[i] == tok) return true;
    if (!r->params.ignore_eos)
        for (int i = 0; i < 4; i++)
            if (g->o.eos_ids[i] >= 0 && g->o.eos_ids[i] == tok) return true;
    return false;
}

static void gw_push_token(gateway *g, gw_req *r, const proto_tok *t, bool with_lp)
{
    if (r->n_gen == r->cap_gen) {
        r->cap_gen = r->cap_gen ? 2 * r->cap_gen : 64;
        r->gen = xrealloc(r->gen, (size_t)r->cap_gen * sizeof *r->gen);
    }
    r->gen[r->n_gen++] = t->token;
    if (!r->t_first) r->t_first = util_now();
    r->t_job = util_now();
    r->job_tokens++;
    g->n_gen_tokens++;
    sched_output *o = gw_out_slot(r);
    o->kind = SCHED_OUT_TOKEN;
    o->token = t->token;
    o->is_stop = gw_is_stop(g, r, t->token);
    o->usage.prompt_tokens = r->n_prompt;   /* sched.h: TOKEN records carry the prompt figures */
    o->usage.cached_tokens = r->n_cached;
    if (with_lp) {
        o->logprob = t->logprob;
        o->n_top = TM_MIN(t->n_top, SCHED_MAX_TOP_LOGPROBS);
        for (int k = 0; k < o->n_top; k++) {
            o->top[k].token = t->top_ids[k];
            o->top[k].logprob = t->top_lps[k];
        }
    }
    if (r->state == GW_DECODE && r->worker >= 0) {
        g->w[r->worker].sum_ctx++;
        r->ctx_counted++;
    }
    pthread_cond_broadcast(&r->cv);
}

/* The gateway's share of a request's latency: from submit to its first token here, less the
 * worker's own time from receiving the job to producing that token (the HANDOFF's prefill_us,
 * or a one-token request's FINISH ttft_us). What is left is the gateway's queueing and
 * dispatch, the frames' trips over the cluster connections and the relay back: everything
 * the cluster path adds to what `serve` would do. Counted once per request. */
static void gw_count_added(gateway *g, gw_req *r, double worker_s)
{
    if (r->added_seen || !r->t_first || worker_s < 0) return;
    r->added_seen = true;
    double v = r->t_first - r->t_submit - worker_s;
    sched_hist_add(&g->h_added, v > 0 ? v : 0);
}

static void gw_free_tail(gw_req *r)
{
    free(r->tail.data);
    memset(&r->tail, 0, sizeof r->tail);
    r->has_tail = false;
}

static void gw_finish(gateway *g, gw_req *r, sched_finish f)
{
    if (r->finished) return;
    gw_unload(g, r);
    gw_free_tail(r);
    r->state = GW_DONE;
    r->finished = true;
    sched_output *o = gw_out_slot(r);
    o->kind = SCHED_OUT_FINISH;
    o->finish = f;
    o->usage.prompt_tokens = r->n_prompt;
    o->usage.cached_tokens = r->n_cached;
    o->usage.completion_tokens = r->n_gen;
    o->ttft_s = r->t_first ? r->t_first - r->t_submit : -1;
    pthread_cond_broadcast(&r->cv);
}

/* Back to waiting for a worker of the role its state needs. */
static void gw_requeue(gateway *g, gw_req *r, bool count)
{
    if (r->finished) return;
    bool was_prefill = r->state == GW_PREFILL || r->state == GW_WAIT_PREFILL;
    gw_unload(g, r);
    if (was_prefill) {
        r->state = GW_WAIT_PREFILL;
        if (count) g->n_reprefills++;
    } else {
        r->state = GW_WAIT_DECODE;
        r->resume = true;
        gw_free_tail(r);
        if (count) g->n_resumes++;
    }
    r->t_wait = util_now();
    pthread_cond_signal(&g->cv_disp);
}

/* The worker's connection is gone (or it is declared dead): its requests move elsewhere. */
/* keep_write: the caller is the worker's reader refusing a frame; the connection stays open
 * for writing so that the reader can say why before it closes it (gw_reader_close). */
static void gw_worker_lost_how(gateway *g, int slot, const char *why, bool keep_write)
{
    gw_worker *w = &g->w[slot];
    if (!w->connected) return;
    log_warn("gateway: worker %s (%s) is out: %s", w->addr, proto_role_name(w->role), why);
    w->connected = false;
    w->draining = false;
    w->gen++;
    if (w->fd >= 0) shutdown(w->fd, keep_write ? SHUT_RD : SHUT_RDWR);
    for (gw_req *r = g->reqs; r; r = r->next)
        if (r->worker == slot && !r->finished) gw_requeue(g, r, true);
    w->queued_s = 0;
    w->n_prefill = w->n_decode = 0;
    w->sum_ctx = 0;
    memset(&w->hb, 0, sizeof w->hb);
    w->has_curve = false;
    w->next_connect = util_now() + 0.5;
    if (!w->is_static) w->used = w->reader_live; /* a registered slot is freed once its reader is gone */
    pthread_cond_broadcast(&g->cv_workers);
}

static void gw_worker_lost(gateway *g, int slot, const char *why) { gw_worker_lost_how(g, slot, why, false); }
static void gw_send_decode(gateway *g, gw_req *r);
static void gw_flush(gateway *g);

/* ------------------------------------------------------------------ frames from workers */

static bool gw_tok_ok(const gateway *g, const proto_tok *t, bool with_lp)
{
    int32_t nv = g->o.model->hp.n_vocab;
    if (t->token < 0 || t->token >= nv) return false;
    if (!with_lp) return true;
    if (!(t->logprob <= 1e-3f)) return false;   /* NaN or positive: not a log-probability */
    for (int k = 0; k < t->n_top; k++)
        if (t->top_ids[k] < 0 || t->top_ids[k] >= nv || !(t->top_lps[k] <= 1e-3f)) return false;
    return true;
}

/* Checks every value of a decoded frame that the gateway uses against what it knows (the
 * model, the request it names, the worker's earlier reports): a registered worker is trusted
 * with nothing. NULL when the frame is fine, else why not (the connection is then closed and
 * the worker's requests are rerouted as a dead worker's, before anything of the frame reaches
 * a client). r is the request the frame names (NULL: unknown or 0), mine whether it is live
 * on this worker. */
static const char *gw_check_msg(const gateway *g, const gw_worker *w, const proto_msg *m, const gw_req *r, bool mine)
{
    uint64_t id = m->hdr.req_id;
    const model_hparams *hp = &g->o.model->hp;
    switch (m->hdr.type) {
    case PROTO_HEARTBEAT: {
        const proto_heartbeat *h = &m->u.heartbeat, *o = &w->hb;
        if (id) return "HEARTBEAT with a request id";
        /* lifetime counters of one connection never go back */
        if (h->n_prefill_tokens < o->n_prefill_tokens || h->n_gen_tokens < o->n_gen_tokens || h->busy_us < o->busy_us ||
            h->n_handoffs_out < o->n_handoffs_out || h->handoff_out_tokens < o->handoff_out_tokens ||
            h->handoff_out_us < o->handoff_out_us || h->n_handoffs_in < o->n_handoffs_in ||
            h->handoff_in_tokens < o->handoff_in_tokens || h->handoff_in_us < o->handoff_in_us)
            return "HEARTBEAT counter went back";
        return NULL;
    }
    case PROTO_HANDOFF:
    case PROTO_TOKENS:
    case PROTO_FINISH:
        if (!id) return "request frame with id 0";
        /* fallthrough */
    case PROTO_ERROR:
        if (id > g->next_id) return "unknown request id";
        break;
    case PROTO_DRAIN:
        if (id) return "DRAIN with a request id";
        return NULL;
    default:
        return "frame type a worker does not send";
    }
    if (m->hdr.type == PROTO_ERROR)
        return m->u.error.code < PROTO_E_MALFORMED || m->u.error.code > PROTO_E_DUPLICATE ? "unknown ERROR code" : NULL;
    if (!mine) return NULL;   /* a late frame of a request that moved on or ended: ignored */
    switch (m->hdr.type) {
    case PROTO_HANDOFF: {
        const proto_handoff *h = &m->u.handoff;
        if (r->state != GW_PREFILL) return "HANDOFF for a request not in prefill";
        if (!gw_tok_ok(g, &h->first, r->params.logprobs)) return "HANDOFF: first token out of range";
        if (h->n_prompt != (uint32_t)r->n_prompt) return "HANDOFF: prompt length differs";
        if (h->n_cached > h->n_prompt || h->n_computed > h->n_prompt || h->n_stored > h->n_prompt ||
            h->n_stored % BLOCKKEY_TOKENS)
            return "HANDOFF: counts out of range";
        if (r->params.max_tokens == 1) return "HANDOFF of a request that ended";
        if (m->hdr.flags & PROTO_F_HAS_TAIL) {
            const proto_kv *kv = &h->kv;
            if (kv->dtype != w->kv_dtype || kv->n_parts != (hp->mla ? 1 : 2) || kv->n_layers != hp->n_layers ||
                kv->n_kv_heads != hp->n_kv_heads || kv->head_dim != hp->head_dim)
                return "HANDOFF: tail KV of another geometry";
            if (kv->start != h->n_stored || kv->start + kv->n != h->n_prompt) return "HANDOFF: tail KV at the wrong positions";
        }
        return NULL;
    }
    case PROTO_TOKENS: {
        const proto_tokens *t = &m->u.tokens;
        if (r->state != GW_PREFILL && r->state != GW_DECODE) return "TOKENS for a request not running";
        if (t->n == 0) return "TOKENS without a token";
        if (r->state == GW_PREFILL && (t->n != 1 || r->n_gen != 0)) return "TOKENS: a prefill sends one token";
        int64_t max_new = r->expect_len - r->n_prompt;
        if ((int64_t)r->n_gen + t->n > max_new) return "TOKENS beyond max_tokens / the context";
        if (r->n_gen > 0 && gw_is_stop(g, r, r->gen[r->n_gen - 1])) return "TOKENS after the stop token";
        bool lp = (m->hdr.flags & PROTO_F_LOGPROBS) != 0;
        for (uint32_t i = 0; i < t->n; i++) {
            if (!gw_tok_ok(g, &t->toks[i], lp)) return "TOKENS: token id out of range";
            if (i + 1 < t->n && gw_is_stop(g, r, t->toks[i].token)) return "TOKENS after the stop token";
        }
        return NULL;
    }
    case PROTO_FINISH:
        if (m->u.finish.cached_tokens > (uint32_t)r->n_prompt) return "FINISH: cached tokens beyond the prompt";
        return NULL;
    default:
        return NULL;
    }
}

/* Returns false when the frame was refused (the worker is then out, *refused says why). */
static bool gw_on_msg(gateway *g, int slot, proto_msg *m, const char **refused)
{
    gw_worker *w = &g->w[slot];
    w->last_hb = util_now();
    uint64_t id = m->hdr.req_id;
    gw_req *r = id ? gw_find(g, id) : NULL;
    bool mine = r && !r->finished && r->worker == slot;
    const char *bad = gw_check_msg(g, w, m, r, mine);
    if (bad) {
        log_warn("gateway: worker %s: refused a %s frame (req %llu): %s; closing the connection", w->addr,
                 proto_type_name(m->hdr.type), (unsigned long long)id, bad);
        g->n_bad_conns++;
        g->n_bad_values++;
        gw_worker_lost_how(g, slot, bad, true);
        *refused = bad;
        return false;
    }
    switch (m->hdr.type) {
    case PROTO_HEARTBEAT:
        w->hb = m->u.heartbeat;
        w->has_curve = (m->hdr.flags & PROTO_F_STEPTIME) != 0;
        if (bal_speed_report(&w->speed, w->hb.n_prefill_tokens, w->hb.busy_us))
            log_debug("gateway: worker %s prefill speed %.0f tokens/s (%d samples)", w->addr, w->speed.tokens_per_s,
                      w->speed.n_samples);
        if (m->u.heartbeat.draining && !w->draining) {
            w->draining = true;
            log_info("gateway: worker %s drains", w->addr);
        }
        break;
    case PROTO_HANDOFF:
        if (!mine || r->state != GW_PREFILL) break;
        gw_unload(g, r);
        r->n_cached = (int)m->u.handoff.n_cached;
        r->n_sampled = m->u.handoff.n_sampled;
        gw_push_token(g, r, &m->u.handoff.first, r->params.logprobs);
        gw_count_added(g, r, m->u.handoff.prefill_us * 1e-6);
        if (m->hdr.flags & PROTO_F_HAS_TAIL) {
            gw_free_tail(r);
            r->tail = m->u.handoff.kv;
            m->u.handoff.kv.data = NULL; /* now the request's */
            r->has_tail = true;
        }
        r->state = GW_WAIT_DECODE;
        r->resume = false;
        r->t_wait = util_now();
        log_debug("gateway: req %llu handoff from %s: %u cached, %u computed, %u stored, %u us",
                  (unsigned long long)id, w->addr, m->u.handoff.n_cached, m->u.handoff.n_computed,
                  m->u.handoff.n_stored, m->u.handoff.prefill_us);
        gw_send_decode(g, r);   /* at once (the reader writes it, gw_flush); no decode worker
                                 * up: it waits, and the dispatcher sends it when one is */
        pthread_cond_signal(&g->cv_disp);
        break;
    case PROTO_TOKENS:
        if (!mine || (r->state != GW_PREFILL && r->state != GW_DECODE)) break;
        for (uint32_t i = 0; i < m->u.tokens.n; i++)
            gw_push_token(g, r, &m->u.tokens.toks[i], (m->hdr.flags & PROTO_F_LOGPROBS) != 0);
        break;
    case PROTO_FINISH:
        if (!mine) break;
        if (m->u.finish.reason == PROTO_FINISH_MOVED) {
            log_info("gateway: req %llu moved off %s after %d tokens", (unsigned long long)id, w->addr, r->n_gen);
            gw_requeue(g, r, true);
            break;
        }
        if (r->state == GW_PREFILL && m->u.finish.cached_tokens) r->n_cached = (int)m->u.finish.cached_tokens;
        if (r->state == GW_PREFILL && m->u.finish.ttft_us) gw_count_added(g, r, m->u.finish.ttft_us * 1e-6);
        if (m->u.finish.reason == PROTO_FINISH_ERROR)
            log_warn("gateway: req %llu failed on %s (%s) after %d tokens: the worker reports an engine error",
                     (unsigned long long)id, w->addr, r->state == GW_PREFILL ? "prefill" : "decode", r->n_gen);
        gw_finish(g, r, m->u.finish.reason >= 1 && m->u.finish.reason <= 4 ? (sched_finish)m->u.finish.reason
                                                                          : SCHED_FINISH_ERROR);
        break;
    case PROTO_ERROR:
        if (!id) {
            log_warn("gateway: worker %s: error %u: %s", w->addr, m->u.error.code, m->u.error.msg ? m->u.error.msg : "");
            break;
        }
        if (!mine) break;
        if ((m->u.error.code == PROTO_E_BUSY || m->u.error.code == PROTO_E_DRAINING || m->u.error.code == PROTO_E_ROLE ||
             m->u.error.code == PROTO_E_INTERNAL) && ++r->retries <= GW_MAX_RETRIES) {
            if (m->u.error.code == PROTO_E_DRAINING) w->draining = true;
            log_info("gateway: req %llu refused by %s (error %u), sent elsewhere", (unsigned long long)id, w->addr,
                     m->u.error.code);
            gw_requeue(g, r, false);
        } else {
            log_warn("gateway: req %llu failed on %s: error %u: %s", (unsigned long long)id, w->addr, m->u.error.code,
                     m->u.error.msg ? m->u.error.msg : "");
            gw_finish(g, r, SCHED_FINISH_ERROR);
        }
        break;
    case PROTO_DRAIN:
        if (!w->draining) log_info("gateway: worker %s drains (%s)", w->addr, m->u.drain.done ? "done" : "started");
        w->draining = true;
        break;
    default:
        break;
    }
    return true;
}

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

static void gw_connect_static(gateway *g, int slot)
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

static void *gw_acceptor(void *arg)
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

/* ------------------------------------------------------------------ dispatcher */

static void gw_params_copy(proto_params *dst, const proto_params *src)
{
    *dst = *src;
}

/* Whether slot is the worker r stalled on while another usable worker of the role is up
 * (then that one is chosen; with none other, the stalled one gets it back). */
static bool gw_avoided(const gateway *g, const gw_req *r, int slot, bool prefill)
{
    if (r->avoid_slot != slot || g->w[slot].gen != r->avoid_gen) return false;
    for (int i = 0; i < g->n_slots; i++)
        if (i != slot && gw_usable(&g->w[i]) && (prefill ? gw_can_prefill(&g->w[i]) : gw_can_decode(&g->w[i])))
            return true;
    return false;
}

static void gw_send_simple(gateway *g, int slot, int type, uint64_t id);

/* A running job whose worker made no progress in time (no first token within
 * progress_first_s of the job, no next one within progress_next_s): the worker is treated as
 * dead for this request (CANCEL, in case it wakes up; the request moves with its tokens so far,
 * as after a kill). Its late frames for the request are ignored like a dead worker's. */
static void gw_check_progress(gateway *g, gw_req *r, double now)
{
    if ((r->state != GW_PREFILL && r->state != GW_DECODE) || r->worker < 0) return;
    double limit = r->job_tokens ? g->o.progress_next_s : g->o.progress_first_s;
    if (now - r->t_job <= limit) return;
    int slot = r->worker;
    log_warn("gateway: req %llu: no %s token from %s in %.0f s: moved elsewhere after %d tokens",
             (unsigned long long)r->id, r->job_tokens ? "next" : "first", g->w[slot].addr, limit, r->n_gen);
    gw_send_simple(g, slot, PROTO_CANCEL, r->id);
    /* a new id: the worker may still hold the old job when the request comes back to it (no
     * other worker of the role), and its late frames for the old id are then simply unknown */
    r->id = ++g->next_id;
    r->avoid_slot = slot;
    r->avoid_gen = g->w[slot].gen;
    g->n_stalls++;
    gw_requeue(g, r, true);
}

/* Tokens of r's prompt past its stored prefix that the prefill in flight on slot computes
 * now: the longest run of leading block keys r shares with a request in prefill there (the
 * keys chain the salt and every token before, so equal keys are an equal prefix). */
static int64_t gw_inflight(const gateway *g, const gw_req *r, int slot)
{
    int best = 0;
    for (const gw_req *q = g->reqs; q; q = q->next) {
        if (q == r || q->state != GW_PREFILL || q->worker != slot || q->finished) continue;
        int n = TM_MIN(q->n_keys, r->n_keys), k = 0;
        while (k < n && !memcmp(q->keys[k], r->keys[k], 32)) k++;
        if (k > best) best = k;
    }
    int64_t t = (int64_t)best * BLOCKKEY_TOKENS - r->hit_len;
    return t > 0 ? t : 0;
}

static void gw_send_prefill(gateway *g, gw_req *r)
{
    bal_prefill_worker bw[GW_MAX_WORKERS];
    int map[GW_MAX_WORKERS], n = 0;
    bal_cost c;
    bal_cost_default(&c);
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!gw_usable(w) || !gw_can_prefill(w) || gw_avoided(g, r, i, true)) continue;
        bw[n] = (bal_prefill_worker){ .up = true, .queued_s = w->queued_s, .n_queued = w->n_prefill,
                                      .speed = bal_speed_rel(&w->speed, &c), .inflight_tokens = gw_inflight(g, r, i),
                                      .has_curve = w->has_curve };
        for (int k = 0; k < 4; k++) bw[n].curve[k] = w->hb.step_w[k];
        map[n++] = i;
    }
    bal_prefill_choice ch = bal_prefill_pick(&c, bw, n, r->n_prompt, r->hit_len);
    if (ch.worker < 0) return;
    int slot = map[ch.worker];
    gw_worker *w = &g->w[slot];
    log_debug("gateway: prefill req %llu (%d tokens, %d cached, %lld shared in flight, bucket %d, cost %.4f s, "
              "%lld steps) -> %s (queued %.4f s, %d jobs, %s; finish in %.4f s; %d candidates)",
              (unsigned long long)r->id, r->n_prompt, r->hit_len, (long long)ch.shared_tokens, ch.bucket, ch.cost_s,
              (long long)ch.steps, w->addr, w->queued_s, w->n_prefill,
              w->has_curve ? "its learned step-time curve" : "the cost model at its learned speed", ch.finish_s, n);
    if (ch.shared_tokens > 0) {
        g->n_inflight_routed++;
        g->n_inflight_tokens += (uint64_t)ch.shared_tokens;
    }
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = r->id;
    gw_params_copy(&m.u.prefill.params, &r->params);
    if (r->params.think_budget) m.hdr.flags |= PROTO_F_THINK;
    m.u.prefill.hit_len = (uint32_t)r->hit_len;
    m.u.prefill.n_prompt = (uint32_t)r->n_prompt;
    m.u.prefill.prompt = r->prompt;
    gw_queue_msg(g, slot, &m);
    r->state = GW_PREFILL;
    r->worker = slot;
    r->t_job = util_now();
    r->job_tokens = 0;
    r->cost_s = ch.cost_s;
    w->queued_s += ch.cost_s;
    w->n_prefill++;
    w->n_jobs++;
}

static void gw_send_decode(gateway *g, gw_req *r)
{
    bal_decode_worker bw[GW_MAX_WORKERS];
    int map[GW_MAX_WORKERS], n = 0;
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!gw_usable(w) || !gw_can_decode(w) || gw_avoided(g, r, i, false)) continue;
        bw[n] = (bal_decode_worker){ .up = true, .n_running = w->n_decode, .sum_ctx = w->sum_ctx, .max_running = (int)w->max_seqs };
        map[n++] = i;
    }
    bal_decode_choice ch = bal_decode_pick(bw, n, r->expect_len, 2048);
    if (ch.worker < 0) return;
    int slot = map[ch.worker];
    gw_worker *w = &g->w[slot];
    log_debug("gateway: decode req %llu (expected %lld tokens, %s, mean %lld) -> %s (running %d, total cache %lld; "
              "%d candidates)%s",
              (unsigned long long)r->id, (long long)r->expect_len, ch.is_long ? "long" : "short", (long long)ch.mean_len,
              w->addr, w->n_decode, (long long)w->sum_ctx, n, r->resume ? " resume" : "");
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DECODE;
    m.hdr.req_id = r->id;
    gw_params_copy(&m.u.decode.params, &r->params);
    /* the same budget on a resume: the worker replays the reasoning count and whether the
     * block is open from think_open + gen (every token of gen was streamed), so the forced
     * end lands where an undisturbed run puts it */
    if (r->params.think_budget) m.hdr.flags |= PROTO_F_THINK;
    m.u.decode.n_prompt = (uint32_t)r->n_prompt;
    m.u.decode.prompt = r->prompt;
    m.u.decode.n_gen = (uint32_t)r->n_gen;
    m.u.decode.gen = r->gen;
    m.u.decode.n_cached = (uint32_t)r->n_cached;
    m.u.decode.n_sampled = r->resume ? (r->params.sample.temp > 0 ? (uint32_t)r->n_gen : 0) : r->n_sampled;
    if (r->resume) m.hdr.flags |= PROTO_F_RESUME;
    else if (r->has_tail) {
        m.hdr.flags |= PROTO_F_HAS_TAIL;
        m.u.decode.kv = r->tail;
    }
    gw_queue_msg(g, slot, &m);
    gw_free_tail(r);
    r->state = GW_DECODE;
    r->worker = slot;
    r->t_job = util_now();
    r->job_tokens = 0;
    r->ctx_counted = r->n_prompt + r->n_gen;
    w->n_decode++;
    w->sum_ctx += r->ctx_counted;
    w->n_jobs++;
}

static void gw_send_simple(gateway *g, int slot, int type, uint64_t id)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = (uint16_t)type;
    m.hdr.req_id = id;
    gw_queue_msg(g, slot, &m);
}

/* Writes the queued frames in order, from the calling thread, as soon as they are queued: the
 * thread that made them (the HTTP thread at submit, a worker's reader at HANDOFF) sends them
 * itself instead of waking the dispatcher, one thread switch less on every hop. mu held;
 * released while a frame is written. One writer at a time: a thread that finds another
 * writing leaves its frames to it (it writes until the queue is empty), so the frames of a
 * connection keep their order. A frame for a connection that is gone is dropped. */
static void gw_flush(gateway *g)
{
    if (g->flushing) return;
    g->flushing = true;
    while (g->out_head) {
        gw_msg *q = g->out_head;
        g->out_head = g->out_tail = NULL;
        while (q) {
            gw_msg *nx = q->next;
            gw_worker *w = &g->w[q->slot];
            if (w->connected && w->gen == q->gen) {
                int fd = w->fd;
                uint64_t gen = q->gen;
                pthread_mutex_unlock(&g->mu);
                pthread_mutex_lock(&w->send_mu);   /* the reader may be closing fd meanwhile */
                proto_status st = w->send_fd == fd && w->send_gen == gen && w->send_conn
                                      ? proto_send_frame(w->send_conn, q->buf.p, q->buf.n)
                                      : PROTO_ERR_CLOSED;
                pthread_mutex_unlock(&w->send_mu);
                pthread_mutex_lock(&g->mu);
                if (st != PROTO_OK && w->gen == gen) gw_worker_lost(g, q->slot, "send failed");
            }
            proto_buf_free(&q->buf);
            free(q);
            q = nx;
        }
    }
    g->flushing = false;
}

static void *gw_dispatcher(void *arg)
{
    gateway *g = arg;
    double last_rate = 0;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        double now = util_now();
        for (int i = 0; i < g->n_slots; i++) {
            gw_worker *w = &g->w[i];
            if (w->used && w->connected && now - w->last_hb > g->o.heartbeat_timeout_s)
                gw_worker_lost(g, i, "missed heartbeats");
        }
        for (gw_req *r = g->reqs; r; r = r->next) {
            if (r->finished) continue;
            gw_check_progress(g, r, now);
            if (r->state == GW_WAIT_PREFILL) gw_send_prefill(g, r);
            else if (r->state == GW_WAIT_DECODE) gw_send_decode(g, r);
            if ((r->state == GW_WAIT_PREFILL || r->state == GW_WAIT_DECODE) && now - r->t_wait > g->o.wait_timeout_s) {
                log_warn("gateway: req %llu waited %.0f s for a %s worker: failed", (unsigned long long)r->id,
                         g->o.wait_timeout_s, r->state == GW_WAIT_PREFILL ? "prefill" : "decode");
                gw_finish(g, r, SCHED_FINISH_ERROR);
            }
        }
        if (now - last_rate >= 1) {
            last_rate = now;
            g->rate_i = (g->rate_i + 1) % GW_RATE_SLOTS;
            g->rate_t[g->rate_i] = now;
            g->rate_v[g->rate_i] = g->n_uncached_tokens;
        }
        gw_flush(g);   /* what the loop above queued (moves, resumes, cancels) */
        int reconnect[GW_MAX_WORKERS], n_rc = 0;
        for (int i = 0; i < g->n_slots; i++) {
            gw_worker *w = &g->w[i];
            if (w->is_static && !w->connected && !w->reader_live && now >= w->next_connect) {
                w->next_connect = now + 1.0;
                reconnect[n_rc++] = i;
            }
        }
        if (!n_rc) {
            /* woken by every queued frame and state change; the timeout only paces the
             * heartbeat, progress and wait deadlines above */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&g->cv_disp, &g->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&g->mu);
        for (int k = 0; k < n_rc; k++) gw_connect_static(g, reconnect[k]);
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ------------------------------------------------------------------ backend */

static bool gw_has_role(const gateway *g, bool prefill)
{
    for (int i = 0; i < g->n_slots; i++) {
        const gw_worker *w = &g->w[i];
        if (gw_usable(w) && (prefill ? gw_can_prefill(w) : gw_can_decode(w))) return true;
    }
    return false;
}

/* The block keys of the prompt's full blocks, the block of its last token excepted (that
 * token is always computed): *n_keys of them, malloc'd (NULL when none). kv_dtype < 0 (no
 * worker has said its KV type yet): keys of the F32 pool, good for comparing prompts here. */
static uint8_t (*gw_keys(gateway *g, const sched_params *p, int kv_dtype, int *n_keys))[32]
{
    int nb = (p->n_prompt - 1) / BLOCKKEY_TOKENS;
    *n_keys = nb > 0 ? nb : 0;
    if (nb <= 0) return NULL;
    uint8_t root[32], fp[32];
    if (p->cache_salt && *p->cache_salt) blockkey_root(p->cache_salt, strlen(p->cache_salt), root);
    else blockkey_root(NULL, 0, root);
    blockkey_pool_fp(g->o.model->fingerprint, kv_dtype >= 0 ? kv_dtype : QTYPE_F32, fp);
    uint8_t (*keys)[32] = xmalloc((size_t)nb * 32);
    blockkey_chain(root, p->prompt, nb, fp, keys);
    return keys;
}

/* Leading tokens of the prompt whose blocks are in the store (the entry point's hit). */
static int gw_hit(gateway *g, const uint8_t (*keys)[32], int n_keys, int kv_dtype)
{
    if (!g->o.cache || kv_dtype < 0 || n_keys <= 0) return 0;
    return store_exists(g->o.cache, keys, n_keys) * BLOCKKEY_TOKENS;
}

static sched_status gw_submit(void *ud, const sched_params *p, sched_req **out)
{
    gateway *g = ud;
    *out = NULL;
    if (!p->prompt || p->n_prompt < 1) return SCHED_ERR_ARG;
    if (p->n_prompt + 1 > g->o.n_ctx) return SCHED_ERR_TOO_LONG;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= g->o.model->hp.n_vocab) return SCHED_ERR_ARG;
    if (p->think_budget < 0 || (p->think_budget > 0 && (p->think_end >= g->o.model->hp.n_vocab ||
                                                        p->think_start >= g->o.model->hp.n_vocab)))
        return SCHED_ERR_ARG;   /* as sched_submit */
    pthread_mutex_lock(&g->mu);
    double deadline = util_now() + g->o.wait_timeout_s;
    while (!g->shut && !(gw_has_role(g, true) && gw_has_role(g, false))) {
        double left = deadline - util_now();
        if (left <= 0) break;
        if (left > 0.2) left = 0.2;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(left * 1e9);
        while (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&g->cv_workers, &g->mu, &ts);
    }
    if (g->shut || !(gw_has_role(g, true) && gw_has_role(g, false))) {
        g->n_rejected++;
        pthread_mutex_unlock(&g->mu);
        return SCHED_ERR_STOPPED;
    }
    int kv_dtype = g->kv_dtype;
    pthread_mutex_unlock(&g->mu);

    int n_keys = 0;
    uint8_t (*keys)[32] = gw_keys(g, p, kv_dtype, &n_keys);
    int hit = gw_hit(g, (const uint8_t(*)[32])keys, n_keys, kv_dtype);   /* store I/O: outside the lock */

    gw_req *r = xcalloc(1, sizeof *r);
    r->keys = keys;
    r->n_keys = n_keys;
    r->prompt = xmalloc((size_t)p->n_prompt * sizeof *r->prompt);
    memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof *r->prompt);
    r->n_prompt = p->n_prompt;
    proto_params *pp = &r->params;
    pp->sample = p->sample;
    pp->max_tokens = p->max_tokens;
    pp->n_stop_ids = (uint8_t)TM_MIN(p->n_stop_ids, PROTO_MAX_STOP_IDS);
    for (int i = 0; i < pp->n_stop_ids; i++) pp->stop_ids[i] = p->stop_ids[i];
    pp->ignore_eos = p->ignore_eos;
    pp->logprobs = p->logprobs;
    pp->top_logprobs = (uint8_t)TM_MIN(p->top_logprobs, PROTO_MAX_TOP);
    pp->cache_class = p->cache_class;
    pp->salt = xstrdup(p->cache_salt ? p->cache_salt : "");
    int max_new = p->max_tokens > 0 ? TM_MIN(p->max_tokens, g->o.n_ctx - p->n_prompt) : g->o.n_ctx - p->n_prompt;
    pp->max_tokens = max_new;   /* explicit: a worker with a longer context stops where we do */
    if (p->think_budget > 0 && p->think_end >= 0) {   /* sent with PROTO_F_THINK; no end id: no budget */
        /* a budget of max_new or more never forces anything: the same within the wire's range */
        pp->think_budget = (uint32_t)TM_MIN(TM_MIN(p->think_budget, max_new), PROTO_MAX_THINK);
        pp->think_start = p->think_start >= 0 ? p->think_start : -1;
        pp->think_end = p->think_end;
        pp->think_open = p->think_open;
    }
    r->expect_len = p->n_prompt + max_new;
    r->hit_len = hit;
    r->n_cached = hit;
    r->worker = -1;
    r->avoid_slot = -1;
    r->state = GW_WAIT_PREFILL;
    r->t_submit = r->t_wait = util_now();
    pthread_cond_init(&r->cv, NULL);
    pthread_mutex_lock(&g->mu);
    if (g->shut) {
        pthread_mutex_unlock(&g->mu);
        pthread_cond_destroy(&r->cv);
        free(r->params.salt);
        free(r->prompt);
        free(r->keys);
        free(r);
        return SCHED_ERR_STOPPED;
    }
    r->id = ++g->next_id;
    r->next = g->reqs;
    if (g->reqs) g->reqs->prev = r;
    g->reqs = r;
    g->n_requests++;
    g->n_prompt_tokens += (uint64_t)p->n_prompt;
    g->n_hit_tokens += (uint64_t)hit;
    g->n_uncached_tokens += (uint64_t)(p->n_prompt - hit);
    log_debug("gateway: req %llu: %d prompt tokens, %d stored (entry point)", (unsigned long long)r->id, p->n_prompt, hit);
    gw_send_prefill(g, r);
    gw_flush(g);   /* the PREFILL goes out from this thread, now */
    pthread_mutex_unlock(&g->mu);
    *out = (sched_req *)r;
    return SCHED_OK;
}

static int gw_poll(void *ud, sched_req *h, sched_output *out, int max, int timeout_ms)
{
    gateway *g = ud;
    gw_req *r = (gw_req *)h;
    pthread_mutex_lock(&g->mu);
    if (timeout_ms != 0 && !r->done && r->out_head == r->n_out) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (timeout_ms > 0) {
            ts.tv_sec += timeout_ms / 1000;
            ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        }
        while (r->out_head == r->n_out && !r->done) {
            if (timeout_ms < 0) pthread_cond_wait(&r->cv, &g->mu);
            else if (pthread_cond_timedwait(&r->cv, &g->mu, &ts) == ETIMEDOUT) break;
        }
    }
    int k = 0;
    while (k < max && r->out_head < r->n_out && !r->done) {
        out[k] = r->outs[r->out_head++];
        if (out[k].kind == SCHED_OUT_FINISH) r->done = true;
        k++;
    }
    pthread_mutex_unlock(&g->mu);
    return k;
}

static void gw_cancel_locked(gateway *g, gw_req *r)
{
    if (r->finished) return;
    if (r->worker >= 0 && (r->state == GW_PREFILL || r->state == GW_DECODE)) gw_send_simple(g, r->worker, PROTO_CANCEL, r->id);
    gw_finish(g, r, SCHED_FINISH_CANCELLED);
}

static void gw_cancel(void *ud, sched_req *h)
{
    gateway *g = ud;
    pthread_mutex_lock(&g->mu);
    gw_cancel_locked(g, (gw_req *)h);
    gw_flush(g);   /* the CANCEL frees the worker's slot now */
    pthread_mutex_unlock(&g->mu);
}

static void gw_release(void *ud, sched_req *h)
{
    gateway *g = ud;
    gw_req *r = (gw_req *)h;
    if (!r) return;
    pthread_mutex_lock(&g->mu);
    gw_cancel_locked(g, r);
    gw_flush(g);   /* the CANCEL of a request still running goes out now */
    if (r->prev) r->prev->next = r->next;
    else g->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    pthread_mutex_unlock(&g->mu);
    pthread_cond_destroy(&r->cv);
    gw_free_tail(r);
    free(r->params.salt);
    free(r->prompt);
    free(r->keys);
    free(r->gen);
    free(r->outs);
    free(r);
}

/* ------------------------------------------------------------------ metrics, admin */

static double gw_prefill_rate(const gateway *g)
{
    int newest = g->rate_i, oldest = (g->rate_i + 1) % GW_RATE_SLOTS;
    if (!g->rate_t[oldest]) oldest = 0;
    double dt = g->rate_t[newest] - g->rate_t[oldest];
    if (dt <= 0) return 0;
    return (double)(g->rate_v[newest] - g->rate_v[oldest]) / dt;
}

static void gw_capacity_in(const gateway *g, bal_capacity_in *pi, bal_capacity_in *di);

static void gw_metrics(void *ud, bytebuf *b)
{
    gateway *g = ud;
    pthread_mutex_lock(&g->mu);
    api_metric(b, "tokenmill_gateway_requests_total", "counter", "Generation requests accepted.", (double)g->n_requests);
    api_metric(b, "tokenmill_gateway_rejected_total", "counter", "Requests refused because no worker of a role was left in time (503).", (double)g->n_rejected);
    api_metric(b, "tokenmill_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", (double)g->n_prompt_tokens);
    api_metric(b, "tokenmill_gateway_hit_tokens_total", "counter", "Prompt tokens found in the block store at the entrypoint.", (double)g->n_hit_tokens);
    api_metric(b, "tokenmill_generated_tokens_total", "counter", "Tokens generated.", (double)g->n_gen_tokens);
    api_metric(b, "tokenmill_gateway_reprefills_total", "counter", "Prefill jobs re-sent after their prefill worker was lost.", (double)g->n_reprefills);
    api_metric(b, "tokenmill_gateway_resumes_total", "counter", "Decodes resumed on another worker after theirs was lost.", (double)g->n_resumes);
    api_metric(b, "tokenmill_gateway_refused_connections_total", "counter", "Worker connections closed for a malformed frame or a bad value.", (double)g->n_bad_conns);
    api_metric(b, "tokenmill_gateway_refused_handshakes_total", "counter", "Connections refused because the peer could not prove it holds the cluster key.", (double)g->n_refused_auth);
    api_metric(b, "tokenmill_gateway_inflight_routed_total", "counter", "Prefill jobs sent to the worker computing a prefix of theirs at the time (it attaches those blocks instead of computing them).", (double)g->n_inflight_routed);
    api_metric(b, "tokenmill_gateway_inflight_shared_tokens_total", "counter", "Prompt tokens of those jobs that were in flight on their worker.", (double)g->n_inflight_tokens);
    api_metric(b, "tokenmill_gateway_stalls_total", "counter", "Requests moved off a worker that made no progress on them in time.", (double)g->n_stalls);
    api_metric_hist(b, "tokenmill_gateway_added_seconds",
                    "Per request: seconds from its arrival to its first token through the gateway, less the "
                    "worker's own time to that token (the gateway's dispatch and the cluster connections).",
                    &g->h_added);
    bytebuf_puts(b, "# HELP tokenmill_worker_up Worker connected and heartbeating (1), draining (0.5), out (0).\n"
                     "# TYPE tokenmill_worker_up gauge\n");
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!w->used) continue;
        const char *role = proto_role_name(w->role);
        bytebuf_printf(b, "tokenmill_worker_up{worker=\"%s\",role=\"%s\"} %g\n", w->addr, role,
                        w->connected ? (w->draining ? 0.5 : 1) : 0);
        bytebuf_printf(b, "tokenmill_worker_prefill_queued_seconds{worker=\"%s\",role=\"%s\"} %.6f\n", w->addr, role, w->queued_s);
        bytebuf_printf(b, "tokenmill_worker_prefill_jobs{worker=\"%s\",role=\"%s\"} %d\n", w->addr, role, w->n_prefill);
        bytebuf_printf(b, "tokenmill_worker_running{worker=\"%s\",role=\"%s\"} %d\n", w->addr, role, w->n_decode);
        bytebuf_printf(b, "tokenmill_worker_cache_tokens{worker=\"%s\",role=\"%s\"} %lld\n", w->addr, role, (long long)w->sum_ctx);
        bytebuf_printf(b, "tokenmill_worker_reported_running{worker=\"%s\",role=\"%s\"} %u\n", w->addr, role, w->hb.n_running);
        bytebuf_printf(b, "tokenmill_worker_reported_queued{worker=\"%s\",role=\"%s\"} %u\n", w->addr, role, w->hb.n_queued);
        bytebuf_printf(b, "tokenmill_worker_kv_blocks_free{worker=\"%s\",role=\"%s\"} %u\n", w->addr, role, w->hb.kv_blocks_free);
        bytebuf_printf(b, "tokenmill_worker_jobs_total{worker=\"%s\",role=\"%s\"} %llu\n", w->addr, role, (unsigned long long)w->n_jobs);
    }
    /* prefill speed (learned) and KV handoff cost, from the workers' heartbeats (lifetime
     * counters of their current connections) */
    bytebuf_puts(b, "# HELP tokenmill_worker_prefill_tokens_per_second Prefill tokens per second of engine time, "
                     "learned from the heartbeats (the prefill balancer's speed).\n"
                     "# TYPE tokenmill_worker_prefill_tokens_per_second gauge\n");
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!w->used || !gw_can_prefill(w)) continue;
        bytebuf_printf(b, "tokenmill_worker_prefill_tokens_per_second{worker=\"%s\",role=\"%s\"} %.1f\n", w->addr,
                        proto_role_name(w->role), w->speed.tokens_per_s);
    }
    bytebuf_puts(b, "# HELP tokenmill_worker_step_curve_seconds The worker's learned engine step time, seconds per "
                     "unit of each term (a step, a decode row, a prefill token, 1024 positions attended), from its "
                     "heartbeats (the prefill balancer's cost on it).\n"
                     "# TYPE tokenmill_worker_step_curve_seconds gauge\n");
    static const char *const terms[4] = { "step", "decode", "prefill_token", "depth_1k" };
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!w->used || !w->has_curve) continue;
        for (int k = 0; k < 4; k++)
            bytebuf_printf(b, "tokenmill_worker_step_curve_seconds{worker=\"%s\",role=\"%s\",term=\"%s\"} %.9g\n",
                            w->addr, proto_role_name(w->role), terms[k], (double)w->hb.step_w[k]);
    }
    bytebuf_puts(b, "# TYPE tokenmill_worker_prefill_tokens_total counter\n# TYPE tokenmill_worker_busy_seconds_total counter\n");
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!w->used) continue;
        const char *role = proto_role_name(w->role);
        bytebuf_printf(b, "tokenmill_worker_prefill_tokens_total{worker=\"%s\",role=\"%s\"} %llu\n", w->addr, role,
                        (unsigned long long)w->hb.n_prefill_tokens);
        bytebuf_printf(b, "tokenmill_worker_busy_seconds_total{worker=\"%s\",role=\"%s\"} %.6f\n", w->addr, role,
                        (double)w->hb.busy_us * 1e-6);
    }
    bytebuf_puts(b, "# HELP tokenmill_worker_handoff_seconds_total KV handoff time: side=send on the prefill worker "
                     "(first token to HANDOFF sent), side=receive on the decode worker (DECODE received to KV in place).\n"
                     "# TYPE tokenmill_worker_handoff_seconds_total counter\n"
                     "# TYPE tokenmill_worker_handoff_tokens_total counter\n# TYPE tokenmill_worker_handoffs_total counter\n");
    double out_s = 0, in_s = 0, out_tok = 0, in_tok = 0, pre_busy = 0, pre_tok = 0;
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!w->used) continue;
        const char *role = proto_role_name(w->role);
        const proto_heartbeat *h = &w->hb;
        for (int side = 0; side < 2; side++) {
            const char *sz = side ? "receive" : "send";
            uint64_t n = side ? h->n_handoffs_in : h->n_handoffs_out;
            uint64_t tok = side ? h->handoff_in_tokens : h->handoff_out_tokens;
            uint64_t us = side ? h->handoff_in_us : h->handoff_out_us;
            if (side ? !gw_can_decode(w) : !gw_can_prefill(w)) continue;
            bytebuf_printf(b, "tokenmill_worker_handoffs_total{worker=\"%s\",role=\"%s\",side=\"%s\"} %llu\n", w->addr,
                            role, sz, (unsigned long long)n);
            bytebuf_printf(b, "tokenmill_worker_handoff_tokens_total{worker=\"%s\",role=\"%s\",side=\"%s\"} %llu\n",
                            w->addr, role, sz, (unsigned long long)tok);
            bytebuf_printf(b, "tokenmill_worker_handoff_seconds_total{worker=\"%s\",role=\"%s\",side=\"%s\"} %.6f\n",
                            w->addr, role, sz, (double)us * 1e-6);
        }
        out_s += (double)h->handoff_out_us * 1e-6;
        out_tok += (double)h->handoff_out_tokens;
        in_s += (double)h->handoff_in_us * 1e-6;
        in_tok += (double)h->handoff_in_tokens;
        if (w->role == PROTO_ROLE_PREFILL) {
            pre_busy += (double)h->busy_us * 1e-6;
            pre_tok += (double)h->n_prefill_tokens;
        }
    }
    /* the cluster's figures: handoff seconds per handed-off token (both sides), and what
     * recomputing a token costs on the prefill workers (their engine seconds per prefill token) */
    double per_tok = (out_tok > 0 ? out_s / out_tok : 0) + (in_tok > 0 ? in_s / in_tok : 0);
    bytebuf_printf(b, "# HELP tokenmill_handoff_seconds_per_token KV handoff cost per token (send + receive side).\n"
                       "# TYPE tokenmill_handoff_seconds_per_token gauge\ntokenmill_handoff_seconds_per_token %.9f\n", per_tok);
    if (pre_tok > 0)   /* only prefill-role workers: a mixed worker's engine time includes decodes */
        bytebuf_printf(b, "# HELP tokenmill_recompute_seconds_per_token Prefill engine seconds per token on the prefill "
                           "workers (the time to recompute what a handoff moves).\n"
                           "# TYPE tokenmill_recompute_seconds_per_token gauge\ntokenmill_recompute_seconds_per_token %.9f\n",
                        pre_busy / pre_tok);
    bytebuf_printf(b, "# TYPE tokenmill_gateway_refused_values_total counter\ntokenmill_gateway_refused_values_total %llu\n",
                    (unsigned long long)g->n_bad_values);
    /* the capacity rule's answer (/admin/capacity), for an autoscaler fed through Prometheus */
    bal_capacity_in ci[2];
    gw_capacity_in(g, &ci[0], &ci[1]);
    bytebuf_puts(b, "# HELP tokenmill_capacity_recommended_workers Workers per role the capacity rule recommends.\n"
                     "# TYPE tokenmill_capacity_recommended_workers gauge\n");
    for (int k = 0; k < 2; k++)
        bytebuf_printf(b, "tokenmill_capacity_recommended_workers{role=\"%s\"} %d\n", k ? "decode" : "prefill",
                       bal_capacity(&ci[k]).recommended);
    pthread_mutex_unlock(&g->mu);
}

/* A number for the admin bodies: JSON has no inf or NaN, so those (an unlearned speed) are 0. */
static void gw_json_num(bytebuf *b, const char *name, double v)
{
    bytebuf_printf(b, ",\"%s\":%.17g", name, isfinite(v) ? v : 0.0);
}

/* The workers' array of /admin/workers (mu held). */
static void gw_workers_json(gateway *g, bytebuf *b)
{
    bytebuf_putc(b, '[');
    bool first = true;
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!w->used) continue;
        bytebuf_puts(b, first ? "{\"addr\":" : ",{\"addr\":");
        first = false;
        api_buf_str(b, w->addr);
        bytebuf_puts(b, ",\"name\":");
        api_buf_str(b, w->name);
        bytebuf_puts(b, ",\"role\":");
        api_buf_str(b, proto_role_name(w->role));
        bytebuf_printf(b, ",\"up\":%s,\"draining\":%s", w->connected ? "true" : "false", w->draining ? "true" : "false");
        gw_json_num(b, "prefill_queued_s", w->queued_s);
        bytebuf_printf(b, ",\"prefill_jobs\":%d,\"running\":%d,\"cache_tokens\":%lld,\"jobs\":%lld", w->n_prefill,
                       w->n_decode, (long long)w->sum_ctx, (long long)w->n_jobs);
        gw_json_num(b, "prefill_tokens_per_s", w->speed.tokens_per_s);
        bytebuf_putc(b, '}');
    }
    bytebuf_putc(b, ']');
}

/* The admin routes are behind the API keys, like the generating ones: they show the cluster's
 * layout and one of them drains workers. */
static void gw_route_workers(http_request *r, void *user)
{
    gateway *g = user;
    if (!api_openai_auth(r)) return;
    bytebuf b = {0};
    bytebuf_puts(&b, "{\"workers\":");
    pthread_mutex_lock(&g->mu);
    gw_workers_json(g, &b);
    bytebuf_printf(&b, ",\"requests\":%llu,\"resumes\":%llu,\"reprefills\":%llu,\"refused_connections\":%llu,"
                       "\"refused_values\":%llu,\"refused_handshakes\":%llu,\"stalls\":%llu,\"model_fingerprint\":",
                   (unsigned long long)g->n_requests, (unsigned long long)g->n_resumes, (unsigned long long)g->n_reprefills,
                   (unsigned long long)g->n_bad_conns, (unsigned long long)g->n_bad_values,
                   (unsigned long long)g->n_refused_auth, (unsigned long long)g->n_stalls);
    api_buf_str(&b, g->o.model->fingerprint_hex);
    pthread_mutex_unlock(&g->mu);
    bytebuf_putc(&b, '}');
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

static void gw_route_drain(http_request *r, void *user)
{
    gateway *g = user;
    if (!api_openai_auth(r)) return;
    const char *who = http_request_query(r, "worker");
    const char *dl = http_request_query(r, "deadline_ms");
    uint32_t deadline = g->o.drain_deadline_ms;
    if (dl) {
        char *end = NULL;
        errno = 0;
        unsigned long v = *dl >= '0' && *dl <= '9' ? strtoul(dl, &end, 10) : 0;
        if (!end || *end || errno || v > 86400000UL) {
            api_openai_error(r, 400, "invalid_request_error",
                             "Query parameter 'deadline_ms' must be a whole number of milliseconds in 0..86400000.",
                             "deadline_ms", NULL);
            return;
        }
        deadline = (uint32_t)v;
    }
    if (!who || !*who) {
        api_openai_error(r, 400, "invalid_request_error", "Missing query parameter 'worker'.", "worker", NULL);
        return;
    }
    pthread_mutex_lock(&g->mu);
    int slot = -1;
    for (int i = 0; i < g->n_slots && slot < 0; i++)
        if (g->w[i].used && g->w[i].connected && (!strcmp(g->w[i].addr, who) || (g->w[i].name[0] && !strcmp(g->w[i].name, who))))
            slot = i;
    if (slot >= 0) {
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_DRAIN;
        m.u.drain.done = 0;
        m.u.drain.deadline_ms = deadline;
        gw_queue_msg(g, slot, &m);
        g->w[slot].draining = true;
        log_info("gateway: draining %s (deadline %u ms)", g->w[slot].addr, deadline);
    }
    pthread_mutex_unlock(&g->mu);
    if (slot < 0) {
        api_openai_error(r, 404, "invalid_request_error", "No such worker connected.", "worker", NULL);
        return;
    }
    bytebuf b = {0};
    bytebuf_puts(&b, "{\"status\":\"draining\",\"worker\":");
    api_buf_str(&b, who);
    bytebuf_printf(&b, ",\"deadline_ms\":%u}", (unsigned)deadline);
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

/* One role's entry of /admin/capacity. */
static void gw_capacity_json(bytebuf *b, const char *role, const bal_capacity_in *in)
{
    bal_capacity_out o = bal_capacity(in);
    bytebuf_printf(b, "{\"role\":\"%s\",\"current\":%d,\"recommended\":%d", role, in->n_current, o.recommended);
    gw_json_num(b, "load", in->load);
    gw_json_num(b, "per_worker", in->per_worker);
    gw_json_num(b, "utilisation", o.utilisation > 1e9 ? 1e9 : o.utilisation);
    bytebuf_printf(b, ",\"held\":%s,\"min\":%d,\"max\":%d}", o.held ? "true" : "false", in->min_workers, in->max_workers);
}

/* The capacity rule's inputs for both roles (mu held): /admin/capacity and the status page. */
static void gw_capacity_in(const gateway *g, bal_capacity_in *pi, bal_capacity_in *di)
{
    int n_pre = 0, n_dec = 0, running = 0;
    double seqs = 0, tps = 0;
    for (int i = 0; i < g->n_slots; i++) {
        const gw_worker *w = &g->w[i];
        if (!gw_usable(w)) continue;
        if (gw_can_prefill(w)) {
            n_pre++;
            tps += w->speed.tokens_per_s;
        }
        if (gw_can_decode(w)) {
            n_dec++;
            running += w->n_decode;
            seqs += w->max_seqs ? w->max_seqs : 16;
        }
    }
    /* one prefill worker's capacity: the mean of the learned speeds (the option until learned) */
    *pi = (bal_capacity_in){ .n_current = n_pre, .load = gw_prefill_rate(g), .per_worker = n_pre ? tps / n_pre : g->o.prefill_tokens_per_s,
                             .target_util = 0.6, .min_workers = g->o.min_workers, .max_workers = g->o.max_workers };
    *di = (bal_capacity_in){ .n_current = n_dec, .load = running, .per_worker = n_dec ? seqs / n_dec : 16,
                             .target_util = 0.6, .min_workers = g->o.min_workers, .max_workers = g->o.max_workers };
}

static void gw_route_capacity(http_request *r, void *user)
{
    gateway *g = user;
    if (!api_openai_auth(r)) return;
    bal_capacity_in pi, di;
    pthread_mutex_lock(&g->mu);
    gw_capacity_in(g, &pi, &di);
    pthread_mutex_unlock(&g->mu);
    bytebuf b = {0};
    bytebuf_puts(&b, "{\"prefill\":");
    gw_capacity_json(&b, "prefill", &pi);
    bytebuf_puts(&b, ",\"decode\":");
    gw_capacity_json(&b, "decode", &di);
    bytebuf_putc(&b, '}');
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

/* The status page's block on the cluster: workers up by role, the capacity advice per role,
 * the requests moved after worker failures. Figures /metrics has carry data-metric. */
static void gw_status(void *ud, bytebuf *b)
{
    gateway *g = ud;
    static const int roles[3] = { PROTO_ROLE_PREFILL, PROTO_ROLE_DECODE, PROTO_ROLE_MIXED };
    int up[3] = { 0 }, draining[3] = { 0 }, out[3] = { 0 }, streams = 0;
    bal_capacity_in in[2];
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_slots; i++) {
        const gw_worker *w = &g->w[i];
        if (!w->used) continue;
        for (int k = 0; k < 3; k++)
            if (w->role == roles[k]) {
                if (!w->connected) out[k]++;
                else if (w->draining) draining[k]++;
                else up[k]++;
            }
        if (w->connected) streams += w->n_decode;
    }
    gw_capacity_in(g, &in[0], &in[1]);
    uint64_t n_req = g->n_requests, n_resumes = g->n_resumes, n_reprefills = g->n_reprefills, n_stalls = g->n_stalls;
    pthread_mutex_unlock(&g->mu);
    bytebuf_puts(b, "<table><tr><th>role</th><th>up</th><th>draining</th><th>out</th></tr>");
    for (int k = 0; k < 3; k++)
        bytebuf_printf(b, "<tr><td>%s</td><td data-role=\"%s\" data-up=\"%d\">%d</td><td>%d</td><td>%d</td></tr>",
                       proto_role_name(roles[k]), proto_role_name(roles[k]), up[k], up[k], draining[k], out[k]);
    bytebuf_puts(b, "</table><div class=\"figs\">");
    bytebuf_printf(b, "<div class=\"fig\"><span class=\"v\" data-metric=\"tokenmill_gateway_requests_total\">%llu</span>"
                      "<span class=\"l\">requests</span></div>", (unsigned long long)n_req);
    bytebuf_printf(b, "<div class=\"fig\"><span class=\"v\">%d</span><span class=\"l\">concurrent streams (decode "
                      "jobs)</span></div>", streams);
    bytebuf_printf(b, "<div class=\"fig\"><span class=\"v\" data-metric=\"tokenmill_gateway_resumes_total\">%llu</span>"
                      "<span class=\"l\">decodes resumed after a worker failed</span></div>", (unsigned long long)n_resumes);
    bytebuf_printf(b, "<div class=\"fig\"><span class=\"v\" data-metric=\"tokenmill_gateway_reprefills_total\">%llu</span>"
                      "<span class=\"l\">prefills re-sent</span></div>", (unsigned long long)n_reprefills);
    bytebuf_printf(b, "<div class=\"fig\"><span class=\"v\" data-metric=\"tokenmill_gateway_stalls_total\">%llu</span>"
                      "<span class=\"l\">requests moved off a stalled worker</span></div></div>", (unsigned long long)n_stalls);
    bytebuf_puts(b, "<table><tr><th>capacity advice</th><th>workers</th><th>recommended</th><th>utilisation</th></tr>");
    for (int k = 0; k < 2; k++) {
        bal_capacity_out o = bal_capacity(&in[k]);
        bytebuf_printf(b, "<tr><td>%s</td><td>%d</td><td data-advice=\"%s\">%d</td><td>%.0f %%</td></tr>",
                       k ? "decode" : "prefill", in[k].n_current, k ? "decode" : "prefill", o.recommended,
                       100 * TM_MIN(o.utilisation, 1e6));
    }
    bytebuf_puts(b, "</table>");
}

void gateway_routes(gateway *g, http_server *h)
{
    http_route(h, "GET", "/admin/workers", gw_route_workers, g);
    http_route(h, "POST", "/admin/drain", gw_route_drain, g);
    http_route(h, "GET", "/admin/capacity", gw_route_capacity, g);
}

/* ------------------------------------------------------------------ life */

gateway_status gateway_new(const gateway_opts *o, gateway **out, char *err, size_t errsz)
{
    *out = NULL;
    if (o->n_prefill + o->n_decode > GW_MAX_WORKERS) {
        snprintf(err, errsz, "too many workers (at most %d)", GW_MAX_WORKERS);
        return GATEWAY_ERR_ARG;
    }
    if (!o->key || !o->key->n) {
        snprintf(err, errsz, "no cluster key");
        return GATEWAY_ERR_ARG;
    }
    gateway *g = xcalloc(1, sizeof *g);
    g->o = *o;
    if (g->o.heartbeat_timeout_s <= 0) g->o.heartbeat_timeout_s = 2;
    if (g->o.progress_first_s <= 0) g->o.progress_first_s = 30;
    if (g->o.progress_next_s <= 0) g->o.progress_next_s = 10;
    if (g->o.wait_timeout_s <= 0) g->o.wait_timeout_s = 30;
    if (!g->o.drain_deadline_ms) g->o.drain_deadline_ms = 60000;
    if (g->o.prefill_tokens_per_s <= 0) g->o.prefill_tokens_per_s = 20000;
    if (g->o.min_workers <= 0) g->o.min_workers = 1;
    if (g->o.max_workers <= 0) g->o.max_workers = 16;
    g->kv_dtype = -1;
    g->listen_fd = -1;
    for (int i = 0; i < GW_MAX_GREETING; i++) g->greeting_fd[i] = -1;
    pthread_mutex_init(&g->mu, NULL);
    for (int i = 0; i < GW_MAX_WORKERS; i++) {
        pthread_mutex_init(&g->w[i].send_mu, NULL);
        g->w[i].send_fd = -1;
    }
    pthread_cond_init(&g->cv_disp, NULL);
    pthread_cond_init(&g->cv_workers, NULL);
    for (int i = 0; i < o->n_prefill + o->n_decode; i++) {
        gw_worker *w = &g->w[g->n_slots++];
        bool pre = i < o->n_prefill;
        snprintf(w->addr, sizeof w->addr, "%s", pre ? o->prefill[i] : o->decode[i - o->n_prefill]);
        w->used = w->is_static = true;
        w->role = pre ? PROTO_ROLE_PREFILL : PROTO_ROLE_DECODE;
        w->fd = -1;
    }
    if (o->register_listen) {
        g->listen_fd = proto_listen(o->register_listen, 64);
        if (g->listen_fd < 0) {
            snprintf(err, errsz, "cannot listen on %s: %s", o->register_listen, strerror(errno));
            gateway_free(g);
            return GATEWAY_ERR_BIND;
        }
    }
    g->be = (api_backend){ .ud = g, .submit = gw_submit, .poll = gw_poll, .cancel = gw_cancel, .release = gw_release,
                           .metrics = gw_metrics, .status = gw_status,
                           .role_text = "Yes: prefill workers compute prompts, decode workers generate; the gateway hands each request's KV from one to the other." };
    /* first connections now, so that a cluster started in order serves at once */
    for (int i = 0; i < g->n_slots; i++) gw_connect_static(g, i);
    pthread_create(&g->disp, NULL, gw_dispatcher, g);
    if (g->listen_fd >= 0) {
        pthread_create(&g->acc, NULL, gw_acceptor, g);
        g->acc_started = true;
    }
    *out = g;
    return GATEWAY_OK;
}

void gateway_shutdown(gateway *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->shut = true;
    for (gw_req *r = g->reqs; r; r = r->next) gw_cancel_locked(g, r);
    pthread_cond_broadcast(&g->cv_workers);
    pthread_mutex_unlock(&g->mu);
}

void gateway_free(gateway *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    bool had_threads = g->disp != 0;
    g->stop = true;
    g->shut = true;
    pthread_cond_broadcast(&g->cv_disp);
    pthread_mutex_unlock(&g->mu);
    if (had_threads) pthread_join(g->disp, NULL);
    if (g->acc_started) pthread_join(g->acc, NULL);
    pthread_mutex_lock(&g->mu);
    /* handshakes in progress end now (their reads fail); their threads are waited for */
    for (int i = 0; i < GW_MAX_GREETING; i++)
        if (g->greeting_fd[i] >= 0) shutdown(g->greeting_fd[i], SHUT_RDWR);
    while (g->n_greeting > 0) pthread_cond_wait(&g->cv_workers, &g->mu);
    for (int i = 0; i < g->n_slots; i++)
        if (g->w[i].connected || g->w[i].reader_live) {
            g->w[i].connected = false;
            g->w[i].gen++;
            if (g->w[i].fd >= 0) shutdown(g->w[i].fd, SHUT_RDWR);
        }
    for (;;) {
        bool live = false;
        for (int i = 0; i < g->n_slots; i++) live |= g->w[i].reader_live;
        if (!live) break;
        pthread_cond_wait(&g->cv_workers, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    while (g->out_head) {
        gw_msg *nx = g->out_head->next;
        proto_buf_free(&g->out_head->buf);
        free(g->out_head);
        g->out_head = nx;
    }
    if (g->listen_fd >= 0) close(g->listen_fd);
    pthread_cond_destroy(&g->cv_disp);
    pthread_cond_destroy(&g->cv_workers);
    for (int i = 0; i < GW_MAX_WORKERS; i++) pthread_mutex_destroy(&g->w[i].send_mu);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

const api_backend *gateway_backend(gateway *g) { return &g->be; }

int gateway_register_port(const gateway *g) { return g->listen_fd >= 0 ? proto_local_port(g->listen_fd) : -1; }
