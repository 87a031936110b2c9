/*
 * gateway_admin: what the gateway shows operators: its /metrics lines (requests, tokens,
 * per-worker load, the KV handoff cost, the latency it adds), the status page's cluster block,
 * and the admin routes (/admin/workers, /admin/drain, /admin/undrain, /admin/capacity). Each takes
 * gateway.mu only to copy its figures.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/balance.h"
#include "cluster/gateway_int.h"
#include "cluster/proto.h"
#include "util/util.h"


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

void gw_metrics(void *ud, bytebuf *b)
{
    gateway *g = ((gw_model *)ud)->g;   /* the whole gateway's figures, whichever model's backend */
    pthread_mutex_lock(&g->mu);
    /* the gateway's own counters and gauges, one line each */
    const struct { const char *name, *type, *help; double v; } one[] = {
        { "tokenmill_gateway_requests_total", "counter", "Generation requests accepted.", (double)g->n_requests },
        { "tokenmill_gateway_rejected_total", "counter", "Requests refused because no worker of a role was left in time (503).", (double)g->n_rejected },
        { "tokenmill_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", (double)g->n_prompt_tokens },
        { "tokenmill_gateway_hit_tokens_total", "counter", "Prompt tokens found in the block store at the entrypoint.", (double)g->n_hit_tokens },
        { "tokenmill_generated_tokens_total", "counter", "Tokens generated.", (double)g->n_gen_tokens },
        { "tokenmill_gateway_reprefills_total", "counter", "Prefill jobs re-sent after their prefill worker was lost.", (double)g->n_reprefills },
        { "tokenmill_gateway_resumes_total", "counter", "Decodes resumed on another worker after theirs was lost.", (double)g->n_resumes },
        { "tokenmill_gateway_refused_connections_total", "counter", "Worker connections closed for a malformed frame or a bad value.", (double)g->n_bad_conns },
        { "tokenmill_gateway_refused_handshakes_total", "counter", "Connections refused because the peer could not prove it holds the cluster key.", (double)g->n_refused_auth },
        { "tokenmill_gateway_inflight_routed_total", "counter", "Prefill jobs sent to the worker computing a prefix of theirs at the time (it attaches those blocks instead of computing them).", (double)g->n_inflight_routed },
        { "tokenmill_gateway_inflight_shared_tokens_total", "counter", "Prompt tokens of those jobs that were in flight on their worker.", (double)g->n_inflight_tokens },
        { "tokenmill_gateway_stalls_total", "counter", "Requests moved off a worker that made no progress on them in time.", (double)g->n_stalls },
        { "tokenmill_gateway_worker_connects_in_progress", "gauge", "Static workers (--prefill, --decode) being connected now: their connect or handshake is under way.", (double)g->n_connectors },
        { "tokenmill_gateway_window_directory_entries", "gauge", "Window states the workers reported holding (sliding-window models).", (double)windir_count(g->wdir) },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(one); i++) api_metric(b, one[i].name, one[i].type, one[i].help, one[i].v);
    bytebuf_printf(b, "# HELP tokenmill_gateway_window_fetches_total Window states fetched from the worker holding them for a job placed on another one: ok (relayed before the job), failed (not held any more, holder lost or too slow: the job replays).\n"
                      "# TYPE tokenmill_gateway_window_fetches_total counter\n"
                      "tokenmill_gateway_window_fetches_total{result=\"ok\"} %llu\n"
                      "tokenmill_gateway_window_fetches_total{result=\"failed\"} %llu\n",
                   (unsigned long long)g->n_wfetch_ok, (unsigned long long)g->n_wfetch_failed);
    api_metric(b, "tokenmill_gateway_window_fetch_bytes_total", "counter", "Bytes of the window states relayed.", (double)g->n_wfetch_bytes);
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
        bytebuf_puts(b, ",\"model\":");   /* the served model's id (null before its first HELLO) */
        if (w->model >= 0 && g->m[w->model].o.name) api_buf_str(b, g->m[w->model].o.name);
        else bytebuf_puts(b, "null");
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
    api_buf_str(&b, g->m[0].o.model->fingerprint_hex);   /* the default model's */
    bytebuf_puts(&b, ",\"models\":[");
    for (int i = 0; i < g->o.n_models; i++) {
        bytebuf_puts(&b, i ? ",{\"id\":" : "{\"id\":");
        api_buf_str(&b, g->m[i].o.name ? g->m[i].o.name : "");
        bytebuf_puts(&b, ",\"fingerprint\":");
        api_buf_str(&b, g->m[i].o.model->fingerprint_hex);
        bytebuf_putc(&b, '}');
    }
    bytebuf_putc(&b, ']');
    pthread_mutex_unlock(&g->mu);
    bytebuf_putc(&b, '}');
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

/* The connected worker an admin call names by address or name (mu held): its slot, -1 when
 * none is, -2 when several are (two workers advertising one address: the name tells them
 * apart, names being unique among live workers). */
static int gw_admin_find(const gateway *g, const char *who)
{
    int slot = -1, n = 0;
    for (int i = 0; i < g->n_slots; i++)
        if (g->w[i].used && g->w[i].connected && !strcmp(g->w[i].name, who)) return i;
    for (int i = 0; i < g->n_slots; i++)
        if (g->w[i].used && g->w[i].connected && !strcmp(g->w[i].addr, who)) {
            slot = i;
            n++;
        }
    return n > 1 ? -2 : slot;
}

/* The worker query parameter of an admin call, found (mu held on return, *slot its slot), or
 * NULL after answering 400 / 404 / 409 (mu not held). */
static const char *gw_admin_worker(gateway *g, http_request *r, int *slot)
{
    const char *who = http_request_query(r, "worker");
    if (!who || !*who) {
        api_openai_error(r, 400, "invalid_request_error", "Missing query parameter 'worker'.", "worker", NULL);
        return NULL;
    }
    pthread_mutex_lock(&g->mu);
    *slot = gw_admin_find(g, who);
    if (*slot >= 0) return who;
    pthread_mutex_unlock(&g->mu);
    if (*slot == -2)
        api_openai_error(r, 409, "invalid_request_error",
                         "Several connected workers have this address: name the worker by its name (/admin/workers).",
                         "worker", NULL);
    else
        api_openai_error(r, 404, "invalid_request_error", "No such worker connected.", "worker", NULL);
    return NULL;
}

static void gw_route_drain(http_request *r, void *user)
{
    gateway *g = user;
    if (!api_openai_auth(r)) return;
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
    int slot;
    const char *who = gw_admin_worker(g, r, &slot);
    if (!who) return;
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DRAIN;
    m.u.drain.done = 0;
    m.u.drain.deadline_ms = deadline;
    g->w[slot].draining = true;
    g->w[slot].undraining = false;
    log_info("gateway: draining %s (deadline %u ms)", g->w[slot].addr, deadline);
    gw_queue_msg(g, slot, &m);
    gw_flush(g);
    pthread_mutex_unlock(&g->mu);
    bytebuf b = {0};
    bytebuf_puts(&b, "{\"status\":\"draining\",\"worker\":");
    api_buf_str(&b, who);
    bytebuf_printf(&b, ",\"deadline_ms\":%u}", (unsigned)deadline);
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

/* Ends a drain asked with /admin/drain (DRAIN UNDRAIN): the worker takes jobs again, and the
 * gateway sends it work from its first heartbeat that no longer says it drains (a worker
 * draining to exit, after a signal, keeps draining). */
static void gw_route_undrain(http_request *r, void *user)
{
    gateway *g = user;
    if (!api_openai_auth(r)) return;
    int slot;
    const char *who = gw_admin_worker(g, r, &slot);
    if (!who) return;
    bool was = g->w[slot].draining;
    if (was) {
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_DRAIN;
        m.hdr.flags = PROTO_F_UNDRAIN;
        g->w[slot].undraining = true;
        log_info("gateway: undraining %s", g->w[slot].addr);
        gw_queue_msg(g, slot, &m);
        gw_flush(g);
    }
    pthread_mutex_unlock(&g->mu);
    bytebuf b = {0};
    bytebuf_printf(&b, "{\"status\":\"%s\",\"worker\":", was ? "undraining" : "serving");
    api_buf_str(&b, who);
    bytebuf_putc(&b, '}');
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
void gw_status(void *ud, bytebuf *b)
{
    gateway *g = ((gw_model *)ud)->g;
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
    http_route(h, "POST", "/admin/undrain", gw_route_undrain, g);
    http_route(h, "GET", "/admin/capacity", gw_route_capacity, g);
}

