/*
 * gateway_window: the window states of sliding-window models across the cluster.
 *
 * Every worker keeps the window layers' state at the block ends it crossed in its own RAM
 * (engine/wincache.h) and reports what it adds and drops (WINDOW frames); the directory here
 * (windir.h) maps each key to the workers holding it. When a job goes to a worker that does
 * not hold the state where the job's attached prefix ends (a PREFILL: where its stored prefix
 * ends; a DECODE after a handoff: where the prefill worker's stored blocks end), the gateway
 * relays the state: it holds the job, asks a holder (WINFETCH), and queues the answer
 * (WINSTATE, which the target keeps in its window cache) right before the job on the target's
 * connection, so the job finds it as a hit. Relaying through the gateway needs no connection
 * between workers (they may not even listen) and reuses the authenticated links there are.
 * A fetch never fails a request: when the holder answers nothing (the state expired or was
 * evicted), is lost, or does not answer within GW_WINDOW_FETCH_S, the job goes without it and
 * the target replays (--window-replay). All under gateway.mu.
 */
#include <stdlib.h>
#include <string.h>

#include "cache/blockkey.h"
#include "cluster/gateway_int.h"
#include "util/util.h"

_Static_assert(GW_MAX_WORKERS <= WINDIR_MAX_SLOTS, "a directory entry names its holders by slot bits");

void gw_window_init(gateway *g) { g->wdir = windir_new(GW_WINDOW_DIR_MAX); }

static void gw_fetch_free(gw_fetch *f)
{
    if (f->job) {
        bytebuf_free(&f->job->buf);
        free(f->job);
    }
    free(f);
}

void gw_window_free(gateway *g)
{
    while (g->fetches) {
        gw_fetch *nx = g->fetches->next;
        gw_fetch_free(g->fetches);
        g->fetches = nx;
    }
    windir_free(g->wdir);
    g->wdir = NULL;
}

void gw_window_on_report(gateway *g, int slot, const proto_window *w)
{
    double now = util_now();
    for (uint32_t i = 0; i < w->n; i++) {
        const proto_window_ev *e = &w->ev[i];
        if (e->op == PROTO_WIN_ADD) windir_add(g->wdir, e->key, slot, now + e->ttl_ms * 1e-3);
        else windir_drop(g->wdir, e->key, slot);
    }
}

/* Takes f off the list and queues its job, preceded by the state when there is one. */
static void gw_fetch_release(gateway *g, gw_fetch *f, const proto_winstate *st)
{
    for (gw_fetch **pp = &g->fetches; *pp; pp = &(*pp)->next)
        if (*pp == f) { *pp = f->next; break; }
    if (st && st->n_bytes) {
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_WINSTATE;
        m.u.winstate = *st;
        gw_msg *q = gw_encode_msg(g, f->job->slot, &m);
        if (q) {
            q->gen = f->job->gen;   /* to the connection the job is for */
            gw_queue_push(g, q);
            g->n_wfetch_ok++;
            g->n_wfetch_bytes += st->n_bytes;
        } else {
            g->n_wfetch_failed++;
        }
    } else {
        g->n_wfetch_failed++;
    }
    gw_queue_push(g, f->job);
    f->job = NULL;
    gw_fetch_free(f);
}

void gw_window_on_state(gateway *g, int slot, proto_msg *m)
{
    for (gw_fetch *f = g->fetches; f; f = f->next)
        if (f->id == m->hdr.req_id && f->src == slot) {
            bool same = !memcmp(f->key, m->u.winstate.key, 32);
            if (!same) log_warn("gateway: worker %s answered window fetch %llu with another key: not used", g->w[slot].addr,
                                (unsigned long long)f->id);
            log_debug("gateway: window fetch %llu from %s: %u bytes", (unsigned long long)f->id, g->w[slot].addr,
                      m->u.winstate.n_bytes);
            gw_fetch_release(g, f, same ? &m->u.winstate : NULL);
            return;
        }
}

/* The block key of r's context (prompt ++ gen) ending at block nb into out. */
static void gw_window_key(gateway *g, const gw_req *r, int nb, uint8_t out[32])
{
    if (nb <= r->n_keys) {
        memcpy(out, r->keys[nb - 1], 32);
        return;
    }
    /* the prompt's last block (its keys stop short of it): chained here */
    uint8_t root[32], fp[32];
    if (r->params.salt && *r->params.salt) blockkey_root(r->params.salt, strlen(r->params.salt), root);
    else blockkey_root(NULL, 0, root);
    const gw_model *gm = &g->m[r->model];
    blockkey_pool_fp(gm->o.model->fingerprint, gm->kv_dtype >= 0 ? gm->kv_dtype : QTYPE_F32, fp);
    uint8_t (*keys)[32] = xmalloc((size_t)nb * 32);
    blockkey_chain(root, r->prompt, nb, fp, keys);
    memcpy(out, keys[nb - 1], 32);
    free(keys);
}

void gw_window_send_job(gateway *g, gw_req *r, int slot, const proto_msg *job, int nb)
{
    gw_msg *q = gw_encode_msg(g, slot, job);
    if (!q) return;
    int holder = -1;
    uint8_t key[32];
    double now = util_now();
    if (nb > 0 && (int64_t)nb * BLOCKKEY_TOKENS <= r->n_prompt && windir_count(g->wdir) > 0) {
        gw_window_key(g, r, nb, key);
        uint64_t hs = windir_find(g->wdir, key, now);
        /* the target holds it: nothing to fetch; else the first live holder */
        for (int i = 0; i < g->n_slots && holder < 0 && !(hs >> slot & 1); i++)
            if ((hs >> i & 1) && g->w[i].connected && !g->w[i].draining) holder = i;
    }
    if (holder < 0) {
        gw_queue_push(g, q);
        return;
    }
    gw_fetch *f = xcalloc(1, sizeof *f);
    f->id = ++g->next_id;
    f->src = holder;
    memcpy(f->key, key, 32);
    f->req_id = r->id;
    f->job = q;
    f->deadline = now + GW_WINDOW_FETCH_S;
    f->next = g->fetches;
    g->fetches = f;
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINFETCH;
    m.hdr.req_id = f->id;
    memcpy(m.u.winfetch.key, key, 32);
    gw_queue_msg(g, holder, &m);
    log_debug("gateway: req %llu: the window state at %d is on %s: fetch %llu for %s", (unsigned long long)r->id,
              nb * BLOCKKEY_TOKENS, g->w[holder].addr, (unsigned long long)f->id, g->w[slot].addr);
}

void gw_window_cancel(gateway *g, uint64_t req_id)
{
    for (gw_fetch **pp = &g->fetches; *pp;) {
        gw_fetch *f = *pp;
        if (f->req_id == req_id) {
            *pp = f->next;
            gw_fetch_free(f);
        } else {
            pp = &f->next;
        }
    }
}

void gw_window_tick(gateway *g, double now)
{
    for (gw_fetch *f = g->fetches, *nx; f; f = nx) {
        nx = f->next;
        if (now > f->deadline) {
            log_info("gateway: window fetch %llu from %s: no answer in %.0f s, the job goes without it",
                     (unsigned long long)f->id, g->w[f->src].addr, GW_WINDOW_FETCH_S);
            gw_fetch_release(g, f, NULL);
        }
    }
}

void gw_window_worker_gone(gateway *g, int slot)
{
    windir_drop_worker(g->wdir, slot);
    for (gw_fetch *f = g->fetches, *nx; f; f = nx) {
        nx = f->next;
        if (f->src == slot) gw_fetch_release(g, f, NULL);
    }
}
