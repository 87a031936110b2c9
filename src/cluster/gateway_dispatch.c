/*
 * gateway_dispatch: placing jobs and sending frames. The dispatcher thread places the
 * requests still waiting for a worker with the balancers (cluster/balance.h), drops workers
 * that missed heartbeats, enforces the progress and wait deadlines and starts the static
 * workers' reconnects (in connector threads, gateway_conn.c: it never waits on a worker's
 * connect or handshake); it sleeps on gateway.cv_disp, woken by every state change (its
 * timeout only paces the deadlines). Frames to workers are queued under gateway.mu (gw_queue_msg) and written at
 * once by the thread that made them (gw_flush, one writer at a time, mu released while
 * writing), so that no frame waits on the dispatcher or on a timer.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/blockkey.h"
#include "cluster/balance.h"
#include "cluster/gateway_int.h"
#include "cluster/proto.h"
#include "util/util.h"

/* ------------------------------------------------------------------ dispatcher */

gw_msg *gw_encode_msg(gateway *g, int slot, const proto_msg *m)
{
    gw_msg *q = xcalloc(1, sizeof *q);
    q->slot = slot;
    q->gen = g->w[slot].gen;
    if (proto_encode(&q->buf, m) != PROTO_OK) {
        log_error("gateway: cannot encode a %s frame", proto_type_name(m->hdr.type));
        bytebuf_free(&q->buf);
        free(q);
        return NULL;
    }
    return q;
}

void gw_queue_push(gateway *g, gw_msg *q)
{
    if (!q) return;
    q->next = NULL;
    if (g->out_tail) g->out_tail->next = q;
    else g->out_head = q;
    g->out_tail = q;
    pthread_cond_signal(&g->cv_disp);
}

void gw_queue_msg(gateway *g, int slot, const proto_msg *m) { gw_queue_push(g, gw_encode_msg(g, slot, m)); }


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
        if (i != slot && gw_fits(&g->w[i], r->model, prefill))
            return true;
    return false;
}


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

/* The start of a job's frame (PREFILL or DECODE) for r: its id, the request's params in pp
 * (the frame's own), and the flags they call for. The same budget goes again on a resume: the
 * worker replays the reasoning count and whether the block is open from think_open + gen
 * (every token of gen was streamed), so the forced end lands where an undisturbed run puts
 * it; and it replays gen through the grammar's automaton (as sched_submit does). */
static void gw_job_frame(proto_msg *m, int type, const gw_req *r, proto_params *pp)
{
    memset(m, 0, sizeof *m);
    m->hdr.type = (uint16_t)type;
    m->hdr.req_id = r->id;
    gw_params_copy(pp, &r->params);
    if (r->params.think_budget) m->hdr.flags |= PROTO_F_THINK;
    if (r->params.grammar) m->hdr.flags |= PROTO_F_GRAMMAR;
}

/* r's job was given to worker w (slot): both their books. */
static void gw_job_placed(gw_req *r, gw_worker *w, int slot, gw_state state)
{
    r->state = state;
    r->worker = slot;
    r->t_job = util_now();
    r->job_tokens = 0;
    w->n_jobs++;
}

void gw_send_prefill(gateway *g, gw_req *r)
{
    bal_prefill_worker bw[GW_MAX_WORKERS];
    int map[GW_MAX_WORKERS], n = 0;
    bal_cost c;
    bal_cost_default(&c);
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!gw_fits(w, r->model, true) || gw_avoided(g, r, i, true)) continue;
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
    gw_job_frame(&m, PROTO_PREFILL, r, &m.u.prefill.params);
    if (r->embed) m.hdr.flags |= PROTO_F_EMBED;
    m.u.prefill.embed = r->embed;
    m.u.prefill.hit_len = (uint32_t)r->hit_len;
    m.u.prefill.n_prompt = (uint32_t)r->n_prompt;
    m.u.prefill.prompt = r->prompt;
    /* the window state where its stored prefix ends comes along when another worker holds it */
    gw_window_send_job(g, r, slot, &m, r->hit_len / BLOCKKEY_TOKENS);
    gw_job_placed(r, w, slot, GW_PREFILL);
    r->cost_s = ch.cost_s;
    w->queued_s += ch.cost_s;
    w->n_prefill++;
}

void gw_send_decode(gateway *g, gw_req *r)
{
    bal_decode_worker bw[GW_MAX_WORKERS];
    int map[GW_MAX_WORKERS], n = 0;
    for (int i = 0; i < g->n_slots; i++) {
        gw_worker *w = &g->w[i];
        if (!gw_fits(w, r->model, false) || gw_avoided(g, r, i, false)) continue;
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
    gw_job_frame(&m, PROTO_DECODE, r, &m.u.decode.params);
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
    /* after a handoff: the window state where the stored blocks end, held by the prefill worker */
    gw_window_send_job(g, r, slot, &m, r->resume ? 0 : r->n_stored / BLOCKKEY_TOKENS);
    gw_free_tail(r);
    gw_job_placed(r, w, slot, GW_DECODE);
    r->ctx_counted = r->n_prompt + r->n_gen;
    w->n_decode++;
    w->sum_ctx += r->ctx_counted;
}

void gw_send_simple(gateway *g, int slot, int type, uint64_t id)
{
    if (type == PROTO_CANCEL) gw_window_cancel(g, id);   /* a job held for its window state is not sent */
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
void gw_flush(gateway *g)
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
                                      ? proto_send_frame(w->send_conn, q->buf.p, q->buf.len)
                                      : PROTO_ERR_CLOSED;
                pthread_mutex_unlock(&w->send_mu);
                pthread_mutex_lock(&g->mu);
                if (st != PROTO_OK && w->gen == gen) gw_worker_lost(g, q->slot, "send failed");
            }
            bytebuf_free(&q->buf);
            free(q);
            q = nx;
        }
    }
    g->flushing = false;
}

void *gw_dispatcher(void *arg)
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
            /* while the gateway drains, the drain's deadline bounds the wait instead: a stream
             * moved off a worker that died or stalled during the drain waits for that worker
             * (or another) to come back, and what still waits at the deadline ends as
             * incomplete (gateway_abort), not as an engine error */
            if (!g->draining && (r->state == GW_WAIT_PREFILL || r->state == GW_WAIT_DECODE) &&
                now - r->t_wait > g->o.wait_timeout_s) {
                log_warn("gateway: req %llu waited %.0f s for a %s worker: failed", (unsigned long long)r->id,
                         g->o.wait_timeout_s, r->state == GW_WAIT_PREFILL ? "prefill" : "decode");
                gw_finish(g, r, SCHED_FINISH_UNAVAILABLE);
            }
        }
        if (now - last_rate >= 1) {
            last_rate = now;
            g->rate_i = (g->rate_i + 1) % GW_RATE_SLOTS;
            g->rate_t[g->rate_i] = now;
            g->rate_v[g->rate_i] = g->n_uncached_tokens;
        }
        gw_window_tick(g, now);   /* jobs whose window fetch ran out of time go without it */
        gw_flush(g);   /* what the loop above queued (moves, resumes, cancels) */
        /* static workers that are down: a connector thread each tries again (one attempt
         * per second at most); nothing here waits on them */
        for (int i = 0; i < g->n_slots; i++) {
            gw_worker *w = &g->w[i];
            if (w->is_static && !w->connected && !w->reader_live && !w->connecting && now >= w->next_connect) {
                w->next_connect = now + 1.0;
                gw_connect_start(g, i);
            }
        }
        /* woken by every queued frame and state change; the timeout only paces the
         * heartbeat, progress and wait deadlines above and the reconnects */
        util_cond_wait_ms(&g->cv_disp, &g->mu, 50);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

