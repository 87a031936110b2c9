/*
 * gateway: the request tracker (gateway.h has the design). Each request is a gw_req on the
 * gateway's list: submit creates it and sends its PREFILL, the workers' frames (gw_on_msg,
 * from their readers) move it along and queue its outputs, poll hands those to the API
 * thread, release frees it. The dispatcher, the connections and the admin routes are in
 * gateway_dispatch.c, gateway_conn.c and gateway_admin.c (gateway_int.h).
 */
#include "cluster/gateway.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "cluster/balance.h"
#include "cluster/gateway_int.h"
#include "cluster/proto.h"
#include "engine/engine.h"
#include "util/util.h"

/* ------------------------------------------------------------------ helpers */


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
            if (g->m[r->model].o.eos_ids[i] >= 0 && g->m[r->model].o.eos_ids[i] == tok) return true;
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

void gw_free_tail(gw_req *r)
{
    free(r->tail.data);
    memset(&r->tail, 0, sizeof r->tail);
    r->has_tail = false;
}

void gw_finish(gateway *g, gw_req *r, sched_finish f)
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
    o->usage.accepted_drafts = TM_MIN(r->n_accepted_drafts, r->n_gen);
    o->usage.rejected_drafts = r->n_rejected_drafts;
    o->ttft_s = r->t_first ? r->t_first - r->t_submit : -1;
    pthread_cond_broadcast(&r->cv);
}

/* Back to waiting for a worker of the role its state needs. */
void gw_requeue(gateway *g, gw_req *r, bool count)
{
    if (r->finished) return;
    if (count && ++r->moves > GW_MAX_MOVES) {
        log_warn("gateway: req %llu: moved off %d workers, failing it", (unsigned long long)r->id, GW_MAX_MOVES);
        gw_finish(g, r, SCHED_FINISH_ERROR);
        return;
    }
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
void gw_worker_lost_how(gateway *g, int slot, const char *why, bool keep_write)
{
    gw_worker *w = &g->w[slot];
    if (!w->connected) return;
    log_warn("gateway: worker %s (%s) is out: %s", w->addr, proto_role_name(w->role), why);
    w->connected = false;
    w->draining = w->undraining = false;
    w->gen++;
    if (w->fd >= 0) shutdown(w->fd, keep_write ? SHUT_RD : SHUT_RDWR);
    gw_window_worker_gone(g, slot);
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

void gw_worker_lost(gateway *g, int slot, const char *why) { gw_worker_lost_how(g, slot, why, false); }

/* ------------------------------------------------------------------ frames from workers */

static bool gw_tok_ok(const gateway *g, const gw_req *r, const proto_tok *t, bool with_lp)
{
    int32_t nv = g->m[r->model].o.model->hp.n_vocab;
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
    case PROTO_EMBEDDING:
        if (!id) return "request frame with id 0";
        /* fallthrough */
    case PROTO_ERROR:
        if (id > g->next_id) return "unknown request id";
        break;
    case PROTO_DRAIN:
        if (id) return "DRAIN with a request id";
        return NULL;
    case PROTO_WINDOW:
        if (id) return "WINDOW with a request id";
        return NULL;
    case PROTO_WINSTATE:   /* the answer of a fetch (gateway_window.c matches it to one) */
        if (!id || id > g->next_id) return "WINSTATE: unknown fetch id";
        return NULL;
    default:
        return "frame type a worker does not send";
    }
    if (m->hdr.type == PROTO_ERROR)
        return m->u.error.code < PROTO_E_MALFORMED || m->u.error.code > PROTO_E_DUPLICATE ? "unknown ERROR code" : NULL;
    if (!mine) return NULL;   /* a late frame of a request that moved on or ended: ignored */
    const model_hparams *hp = &g->m[r->model].o.model->hp;   /* the worker serves r's model */
    if (r->embed && m->hdr.type != PROTO_FINISH && m->hdr.type != PROTO_EMBEDDING) return "a token for an embedding";
    switch (m->hdr.type) {
    case PROTO_EMBEDDING:
        if (!r->embed || r->state != GW_PREFILL || r->emb) return "EMBEDDING for a request that is not an embedding running";
        if (m->u.embedding.n != (uint32_t)hp->dim) return "EMBEDDING of another width than the model's";
        return NULL;
    case PROTO_HANDOFF: {
        const proto_handoff *h = &m->u.handoff;
        if (r->state != GW_PREFILL) return "HANDOFF for a request not in prefill";
        if (!gw_tok_ok(g, r, &h->first, r->params.logprobs)) return "HANDOFF: first token out of range";
        if (h->n_prompt != (uint32_t)r->n_prompt) return "HANDOFF: prompt length differs";
        if (h->n_cached > h->n_prompt || h->n_computed > h->n_prompt || h->n_stored > h->n_prompt ||
            h->n_stored % BLOCKKEY_TOKENS)
            return "HANDOFF: counts out of range";
        if (r->params.max_tokens == 1) return "HANDOFF of a request that ended";
        if (m->hdr.flags & PROTO_F_HAS_TAIL) {
            const proto_kv *kv = &h->kv;
            const gw_model *gm = &g->m[r->model];
            if (kv->dtype != w->kv_dtype || kv->n_parts != gm->kv_parts || kv->n_layers != hp->n_layers ||
                kv->n_kv_heads != gm->kv_heads || kv->head_dim != gm->kv_dim)
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
            if (!gw_tok_ok(g, r, &t->toks[i], lp)) return "TOKENS: token id out of range";
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
bool gw_on_msg(gateway *g, int slot, proto_msg *m, const char **refused)
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
        if (w->undraining && !m->u.heartbeat.draining) {
            w->undraining = w->draining = false;
            log_info("gateway: worker %s takes work again", w->addr);
            pthread_cond_broadcast(&g->cv_workers);
            pthread_cond_signal(&g->cv_disp);
        } else if (m->u.heartbeat.draining && !w->draining) {
            w->draining = true;
            gw_window_worker_gone(g, slot);
            log_info("gateway: worker %s drains", w->addr);
        }
        break;
    case PROTO_WINDOW:
        if (!w->draining) gw_window_on_report(g, slot, &m->u.window);
        break;
    case PROTO_WINSTATE:
        gw_window_on_state(g, slot, m);
        break;
    case PROTO_HANDOFF:
        if (!mine || r->state != GW_PREFILL) break;
        gw_unload(g, r);
        r->n_cached = (int)m->u.handoff.n_cached;
        r->n_stored = (int)m->u.handoff.n_stored;
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
    case PROTO_EMBEDDING:
        if (!mine) break;
        r->emb = m->u.embedding.v;   /* taken from the frame */
        r->n_emb = (int)m->u.embedding.n;
        m->u.embedding.v = NULL;
        break;
    case PROTO_FINISH:
        if (!mine) break;
        if (r->embed && m->u.finish.reason == PROTO_FINISH_STOP && !r->emb) {   /* a stop with no vector: failed */
            log_warn("gateway: req %llu: embedding ended on %s without its vector", (unsigned long long)id, w->addr);
            gw_finish(g, r, SCHED_FINISH_ERROR);
            break;
        }
        /* a request moved between decode workers drafted on each: its usage counts them all */
        r->n_accepted_drafts = (int)TM_MIN((int64_t)r->n_accepted_drafts + m->u.finish.accepted_drafts, INT32_MAX);
        r->n_rejected_drafts = (int)TM_MIN((int64_t)r->n_rejected_drafts + m->u.finish.rejected_drafts, INT32_MAX);
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
            /* ARG, TOO_LONG: the worker refused what the request asks (its grammar did not
             * compile there; its prompt is longer than that worker takes, as an encoder's input
             * past a worker that joined with a smaller step): the client's fault as that worker
             * sees it, a 400 in the client's API shape */
            bool by_client = m->u.error.code == PROTO_E_ARG || m->u.error.code == PROTO_E_TOO_LONG;
            gw_finish(g, r, by_client ? SCHED_FINISH_REFUSED : SCHED_FINISH_ERROR);
        }
        break;
    case PROTO_DRAIN:
        if (!w->draining) log_info("gateway: worker %s drains (%s)", w->addr, m->u.drain.done ? "done" : "started");
        w->draining = true;
        gw_window_worker_gone(g, slot);   /* it is about to go: its states with it */
        break;
    default:
        break;
    }
    return true;
}


static bool gw_has_role(const gateway *g, int mi, bool prefill)
{
    for (int i = 0; i < g->n_slots; i++)
        if (gw_fits(&g->w[i], mi, prefill)) return true;
    return false;
}

/* An encoder computes an input whole in one step of the worker: the longest input every
 * prefill worker of model mi now up takes (0: none is up). */
static int gw_encoder_bound(const gateway *g, int mi)
{
    int bound = 0;
    for (int i = 0; i < g->n_slots; i++)
        if (gw_fits(&g->w[i], mi, true) && (bound == 0 || g->w[i].max_input < bound)) bound = g->w[i].max_input;
    return bound;
}

static int gw_max_input(void *ud)
{
    gw_model *gm = ud;
    if (!gm->o.model->hp.bidirectional) return 0;
    pthread_mutex_lock(&gm->g->mu);
    int bound = gw_encoder_bound(gm->g, gm->i);
    pthread_mutex_unlock(&gm->g->mu);
    return bound;
}

/* The block keys of the prompt's full blocks, the block of its last token excepted (that
 * token is always computed): *n_keys of them, malloc'd (NULL when none). kv_dtype < 0 (no
 * worker has said its KV type yet): keys of the F32 pool, good for comparing prompts here. */
static uint8_t (*gw_keys(const gw_model *gm, const sched_params *p, int kv_dtype, int *n_keys))[32]
{
    int nb = (p->n_prompt - 1) / BLOCKKEY_TOKENS;
    *n_keys = nb > 0 ? nb : 0;
    if (nb <= 0) return NULL;
    uint8_t root[32], fp[32];
    if (p->cache_salt && *p->cache_salt) blockkey_root(p->cache_salt, strlen(p->cache_salt), root);
    else blockkey_root(NULL, 0, root);
    blockkey_pool_fp(gm->o.model->fingerprint, kv_dtype >= 0 ? kv_dtype : QTYPE_F32, fp);
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
    gw_model *gm = ud;
    gateway *g = gm->g;
    const int n_vocab = gm->o.model->hp.n_vocab, n_ctx = gm->o.n_ctx;
    *out = NULL;
    if (!p->prompt || p->n_prompt < 1) return SCHED_ERR_ARG;
    if (p->n_prompt + 1 > n_ctx) return SCHED_ERR_TOO_LONG;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= n_vocab) return SCHED_ERR_ARG;
    if (p->think_budget < 0 || (p->think_budget > 0 && (p->think_end >= n_vocab || p->think_start >= n_vocab)))
        return SCHED_ERR_ARG;   /* as sched_submit */
    if (p->embed && p->embed != MODEL_POOL_MEAN && p->embed != MODEL_POOL_LAST && p->embed != MODEL_POOL_CLS)
        return SCHED_ERR_ARG;
    /* a grammar travels as its source, which the worker compiles (the API layer compiled it
     * here first, so a bad one was a 400 before this) */
    if (p->grammar && (!p->grammar_src || p->grammar_kind < 0 || p->grammar_kind >= PROTO_GRAMMAR_KINDS ||
                       p->grammar_len > PROTO_MAX_GRAMMAR || memchr(p->grammar_src, 0, p->grammar_len) ||
                       (p->grammar_lazy && (p->grammar_trigger < 0 || p->grammar_trigger >= n_vocab))))
        return SCHED_ERR_ARG;
    pthread_mutex_lock(&g->mu);
    double deadline = util_now() + g->o.wait_timeout_s;
    /* an embedding needs a prefill worker only (it ends there) */
    while (!g->shut && !g->draining && !(gw_has_role(g, gm->i, true) && (p->embed || gw_has_role(g, gm->i, false)))) {
        double left = deadline - util_now();
        if (left <= 0) break;
        if (left > 0.2) left = 0.2;
        util_cond_wait_ms(&g->cv_workers, &g->mu, (long)(left * 1000) + 1);
    }
    if (g->shut || g->draining) {
        pthread_mutex_unlock(&g->mu);
        return SCHED_ERR_STOPPED;
    }
    if (!(gw_has_role(g, gm->i, true) && (p->embed || gw_has_role(g, gm->i, false)))) {
        g->n_rejected++;
        pthread_mutex_unlock(&g->mu);
        return SCHED_ERR_STOPPED;
    }
    int bound = gm->o.model->hp.bidirectional ? gw_encoder_bound(g, gm->i) : 0;
    if (bound > 0 && p->n_prompt > bound) {   /* no worker of the model could take it */
        pthread_mutex_unlock(&g->mu);
        return SCHED_ERR_TOO_LONG;
    }
    int kv_dtype = gm->kv_dtype;
    pthread_mutex_unlock(&g->mu);
    if (p->embed) kv_dtype = -1;   /* an embedding reuses no stored prefix (every position's state is needed) */

    int n_keys = 0;
    uint8_t (*keys)[32] = p->embed ? NULL : gw_keys(gm, p, kv_dtype, &n_keys);
    int hit = gw_hit(g, (const uint8_t(*)[32])keys, n_keys, kv_dtype);   /* store I/O: outside the lock */

    gw_req *r = xcalloc(1, sizeof *r);
    r->model = gm->i;
    r->embed = (uint8_t)p->embed;
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
    int max_new = p->max_tokens > 0 ? TM_MIN(p->max_tokens, n_ctx - p->n_prompt) : n_ctx - p->n_prompt;
    pp->max_tokens = max_new;   /* explicit: a worker with a longer context stops where we do */
    /* sent with PROTO_F_THINK; no end id: no budget. A grammar applies from the end of the
     * think block, so its request sends the markers even without a budget: as a budget of
     * max_new, which never forces anything (nor does any budget of max_new or more) */
    if ((p->think_budget > 0 || p->grammar) && p->think_end >= 0) {
        int budget = p->think_budget > 0 ? p->think_budget : max_new;
        pp->think_budget = (uint32_t)TM_MIN(TM_MIN(budget, max_new), PROTO_MAX_THINK);
        pp->think_start = p->think_start >= 0 ? p->think_start : -1;
        pp->think_end = p->think_end;
        pp->think_open = p->think_open;
    }
    if (p->grammar) {
        pp->grammar_kind = (uint8_t)p->grammar_kind;
        pp->grammar_len = (uint32_t)p->grammar_len;
        pp->grammar = xmalloc(p->grammar_len + 1);
        memcpy(pp->grammar, p->grammar_src, p->grammar_len);
        pp->grammar[p->grammar_len] = 0;
        pp->grammar_lazy = p->grammar_lazy;
        pp->grammar_trigger = p->grammar_lazy ? p->grammar_trigger : 0;
    }
    if (p->embed) max_new = pp->max_tokens = 1;   /* nothing is generated; the prefill answers */
    r->expect_len = p->n_prompt + max_new;
    r->hit_len = hit;
    r->n_cached = hit;
    r->worker = -1;
    r->avoid_slot = -1;
    r->state = GW_WAIT_PREFILL;
    r->t_submit = r->t_wait = util_now();
    util_cond_init(&r->cv);
    pthread_mutex_lock(&g->mu);
    if (g->shut || g->draining) {
        pthread_mutex_unlock(&g->mu);
        pthread_cond_destroy(&r->cv);
        free(r->params.salt);
        free(r->params.grammar);
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
    gateway *g = ((gw_model *)ud)->g;
    gw_req *r = (gw_req *)h;
    pthread_mutex_lock(&g->mu);
    if (timeout_ms != 0 && !r->done && r->out_head == r->n_out) {
        struct timespec ts;
        util_deadline(&ts, CLOCK_MONOTONIC, timeout_ms > 0 ? timeout_ms : 0);
        while (r->out_head == r->n_out && !r->done) {
            if (timeout_ms < 0) pthread_cond_wait(&r->cv, &g->mu);
            else if (!util_cond_wait_until(&r->cv, &g->mu, &ts)) break;
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

void gw_cancel_locked(gateway *g, gw_req *r)
{
    if (r->finished) return;
    if (r->worker >= 0 && (r->state == GW_PREFILL || r->state == GW_DECODE)) gw_send_simple(g, r->worker, PROTO_CANCEL, r->id);
    gw_finish(g, r, SCHED_FINISH_CANCELLED);
}

static void gw_cancel(void *ud, sched_req *h)
{
    gateway *g = ((gw_model *)ud)->g;
    pthread_mutex_lock(&g->mu);
    gw_cancel_locked(g, (gw_req *)h);
    gw_flush(g);   /* the CANCEL frees the worker's slot now */
    pthread_mutex_unlock(&g->mu);
}

static void gw_release(void *ud, sched_req *h)
{
    gateway *g = ((gw_model *)ud)->g;
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
    free(r->params.grammar);
    free(r->prompt);
    free(r->keys);
    free(r->gen);
    free(r->outs);
    free(r->emb);
    free(r);
}

/* An embedding's vector once its FINISH was polled (NULL before, or for a generation). */
static const float *gw_embedding(void *ud, sched_req *h)
{
    gateway *g = ((gw_model *)ud)->g;
    gw_req *r = (gw_req *)h;
    pthread_mutex_lock(&g->mu);
    const float *v = r->done && r->embed ? r->emb : NULL;
    pthread_mutex_unlock(&g->mu);
    return v;
}

static bool gw_done(void *ud, sched_req *h)
{
    gateway *g = ((gw_model *)ud)->g;
    pthread_mutex_lock(&g->mu);
    bool d = ((gw_req *)h)->done;
    pthread_mutex_unlock(&g->mu);
    return d;
}

/* ------------------------------------------------------------------ life */

static bool gw_draining(void *ud)
{
    gateway *g = ((gw_model *)ud)->g;
    pthread_mutex_lock(&g->mu);
    bool d = g->draining || g->shut;
    pthread_mutex_unlock(&g->mu);
    return d;
}

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
    if (o->n_models < 1 || o->n_models > GATEWAY_MAX_MODELS) {
        snprintf(err, errsz, "%d models (1 to %d)", o->n_models, GATEWAY_MAX_MODELS);
        return GATEWAY_ERR_ARG;
    }
    gateway *g = xcalloc(1, sizeof *g);
    g->o = *o;
    if (g->o.heartbeat_timeout_s <= 0) g->o.heartbeat_timeout_s = 2;
    if (g->o.handshake_timeout_s <= 0) g->o.handshake_timeout_s = GREET_DEADLINE_S;
    if (g->o.progress_first_s <= 0) g->o.progress_first_s = 30;
    if (g->o.progress_next_s <= 0) g->o.progress_next_s = 10;
    if (g->o.wait_timeout_s <= 0) g->o.wait_timeout_s = 30;
    if (!g->o.drain_deadline_ms) g->o.drain_deadline_ms = 60000;
    if (g->o.prefill_tokens_per_s <= 0) g->o.prefill_tokens_per_s = 20000;
    if (g->o.min_workers <= 0) g->o.min_workers = 1;
    if (g->o.max_workers <= 0) g->o.max_workers = 16;
    for (int i = 0; i < o->n_models; i++) {
        gw_model *gm = &g->m[i];
        gm->o = o->models[i];
        gm->g = g;
        gm->i = i;
        gm->kv_dtype = -1;
        engine_kv_shape(gm->o.model, &gm->kv_parts, &gm->kv_heads, &gm->kv_dim);
        gm->be = (api_backend){ .ud = gm, .submit = gw_submit, .poll = gw_poll, .cancel = gw_cancel, .release = gw_release,
                                .metrics = gw_metrics, .status = gw_status, .draining = gw_draining,
                                .done = gw_done, .embedding = gw_embedding, .max_input = gw_max_input,
                                .role_text = "Yes: prefill workers compute prompts, decode workers generate; the gateway hands each request's KV from one to the other." };
    }
    g->o.models = NULL;   /* g->m holds them */
    g->listen_fd = -1;
    gw_window_init(g);
    greet_init(&g->greet, GREET_MAX);
    pthread_mutex_init(&g->mu, NULL);
    for (int i = 0; i < GW_MAX_WORKERS; i++) {
        pthread_mutex_init(&g->w[i].send_mu, NULL);
        g->w[i].send_fd = -1;
        g->w[i].connect_fd = -1;
    }
    util_cond_init(&g->cv_disp);
    util_cond_init(&g->cv_workers);
    for (int i = 0; i < o->n_prefill + o->n_decode; i++) {
        gw_worker *w = &g->w[g->n_slots++];
        bool pre = i < o->n_prefill;
        snprintf(w->addr, sizeof w->addr, "%s", pre ? o->prefill[i] : o->decode[i - o->n_prefill]);
        w->used = w->is_static = true;
        w->role = pre ? PROTO_ROLE_PREFILL : PROTO_ROLE_DECODE;
        w->model = -1;   /* its HELLO says */
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
    /* first connections now, so that a cluster started in order serves at once: all at once,
     * waited for up to GW_START_WAIT_S (a live worker is in well within it); one down or stuck
     * in its handshake goes on connecting in the background and does not hold up the start */
    pthread_mutex_lock(&g->mu);
    double t_start = util_now();
    for (int i = 0; i < g->n_slots; i++) {
        g->w[i].next_connect = t_start + 1.0;
        gw_connect_start(g, i);
    }
    while (g->n_connectors > 0 && util_now() - t_start < GW_START_WAIT_S)
        util_cond_wait_ms(&g->cv_workers, &g->mu, 20);
    pthread_mutex_unlock(&g->mu);
    pthread_create(&g->disp, NULL, gw_dispatcher, g);
    if (g->listen_fd >= 0) {
        pthread_create(&g->acc, NULL, gw_acceptor, g);
        g->acc_started = true;
    }
    *out = g;
    return GATEWAY_OK;
}

void gateway_drain(gateway *g)
{
    pthread_mutex_lock(&g->mu);
    g->draining = true;
    pthread_cond_broadcast(&g->cv_workers);   /* submits waiting for a worker give up */
    pthread_mutex_unlock(&g->mu);
}

/* Requests not finished yet (mu held). */
static int gw_n_running(const gateway *g)
{
    int n = 0;
    for (const gw_req *r = g->reqs; r; r = r->next) n += !r->finished;
    return n;
}

int gateway_wait_idle(gateway *g, int timeout_ms)
{
    double deadline = util_now() + timeout_ms / 1000.0;
    pthread_mutex_lock(&g->mu);
    int n;
    /* a request's end wakes its own waiter only: look again every 20 ms */
    while ((n = gw_n_running(g)) > 0 && (timeout_ms < 0 || util_now() < deadline)) {
        util_cond_wait_ms(&g->cv_workers, &g->mu, 20);
    }
    pthread_mutex_unlock(&g->mu);
    return n;
}

void gateway_abort(gateway *g)
{
    pthread_mutex_lock(&g->mu);
    g->draining = true;
    for (gw_req *r = g->reqs; r; r = r->next) {
        if (r->finished) continue;
        if (r->worker >= 0 && (r->state == GW_PREFILL || r->state == GW_DECODE)) gw_send_simple(g, r->worker, PROTO_CANCEL, r->id);
        gw_finish(g, r, SCHED_FINISH_ABORTED);
    }
    gw_flush(g);
    pthread_mutex_unlock(&g->mu);
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
    greet_shutdown_all(&g->greet);
    while (g->greet.n_threads > 0) pthread_cond_wait(&g->cv_workers, &g->mu);
    gw_connect_stop_all(g);
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
        bytebuf_free(&g->out_head->buf);
        free(g->out_head);
        g->out_head = nx;
    }
    gw_window_free(g);
    if (g->listen_fd >= 0) close(g->listen_fd);
    pthread_cond_destroy(&g->cv_disp);
    pthread_cond_destroy(&g->cv_workers);
    for (int i = 0; i < GW_MAX_WORKERS; i++) pthread_mutex_destroy(&g->w[i].send_mu);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

const api_backend *gateway_backend(gateway *g, int i) { return i >= 0 && i < g->o.n_models ? &g->m[i].be : NULL; }

int gateway_register_port(const gateway *g) { return g->listen_fd >= 0 ? proto_local_port(g->listen_fd) : -1; }
