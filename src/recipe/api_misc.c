/*
 * api_misc: the server's small routes: GET /v1/models (OpenAI list shape), GET /health (both
 * also name the chat template in use, so an operator sees how prompts are written; /health is
 * a 503 "draining" once the scheduler refuses new work, so that load balancers move away), and
 * GET /metrics (Prometheus text exposition format 0.0.4) from the scheduler's and the HTTP
 * layer's counters (a remote backend without a scheduler: the backend's metrics hook): requests, tokens in/out, cached tokens, TTFT / inter-token latency /
 * engine step histograms, queue depth, running sequences, KV blocks, CPU gap between steps;
 * and GET / and /status, the operator's page (recipe/status.h), behind the same key check.
 */
#include "recipe/api.h"
#include "recipe/status.h"
#include "recipe/template.h"

#include "cache/store.h"
#include "cache/gc.h"

#include <stdio.h>
#include <string.h>

/* One model object of the OpenAI list shape. */
static void misc_model_obj(bytebuf *b, const api_ctx *c)
{
    bytebuf_puts(b, "{\"id\":");
    api_buf_str(b, c->model_name);
    bytebuf_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"tokenmill\",\"context_length\":%d",
                   (long long)c->created, c->n_ctx);
    if (c->tmpl) {
        /* the renderer: a built-in family's name, or "jinja" for the interpreter */
        bytebuf_puts(b, ",\"template\":");
        api_buf_str(b, template_name(c->tmpl));
        bytebuf_puts(b, ",\"tool_format\":");
        api_buf_str(b, template_tool_format(c->tmpl));
    }
    bytebuf_putc(b, '}');
}

static void misc_models(http_request *r, void *user)
{
    const api_ctx *c = user;
    if (!api_openai_auth(r)) return;
    bytebuf b = {0};
    bytebuf_puts(&b, "{\"object\":\"list\",\"data\":[");
    if (c->n_all < 2) misc_model_obj(&b, c);
    for (int i = 0; c->n_all >= 2 && i < c->n_all; i++) {
        if (i) bytebuf_putc(&b, ',');
        misc_model_obj(&b, c->all[i]);
    }
    bytebuf_puts(&b, "]}");
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

/* GET /v1/models/{id}: the model object, or OpenAI's 404 (an alias finds its model too). */
static void misc_model_get(http_request *r, void *user)
{
    const api_ctx *c = user;
    if (!api_openai_auth(r)) return;
    const char *id = http_request_path(r) + strlen("/v1/models/");
    const api_ctx *m = api_ctx_route(c, id);
    if (!m) {
        char msg[512];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist", id);
        api_openai_error(r, 404, "invalid_request_error", msg, "model", "model_not_found");
        return;
    }
    bytebuf b = {0};
    misc_model_obj(&b, m);
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

/* 503 while draining, so that load balancers stop sending requests here, and while the
 * weights are still being faulted in ("loading"), so that they send none yet. */
static void misc_health(http_request *r, void *user)
{
    api_ctx *c = user;
    bool draining = c->backend ? c->backend->draining && c->backend->draining(c->backend->ud)
                               : c->sched && sched_draining(c->sched);
    bool loading = atomic_load(&c->loading);
    for (int i = 1; i < c->n_all; i++) {   /* several models: ok once every one is */
        draining |= c->all[i]->sched && sched_draining(c->all[i]->sched);
        loading |= atomic_load(&c->all[i]->loading);
    }
    bool down = draining || loading;
    bytebuf b = {0};
    bytebuf_printf(&b, "{\"status\":\"%s\"", draining ? "draining" : loading ? "loading" : "ok");
    if (c->tmpl) {
        /* the renderer: a built-in family's name, or "jinja" for the interpreter */
        bytebuf_puts(&b, ",\"template\":");
        api_buf_str(&b, template_name(c->tmpl));
        bytebuf_puts(&b, ",\"tool_format\":");
        api_buf_str(&b, template_tool_format(c->tmpl));
    }
    bytebuf_puts(&b, "}");
    if (down) http_add_header(r, "Retry-After", HTTP_RETRY_AFTER);
    api_respond_buf(r, down ? 503 : 200, &b);
    bytebuf_free(&b);
}

void api_metric_hist(bytebuf *b, const char *name, const char *help, const sched_hist *h)
{
    bytebuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SCHED_HIST_N; i++) {
        cum += h->counts[i];
        bytebuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, sched_hist_bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[SCHED_HIST_N];
    bytebuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
                    h->sum, name, (unsigned long long)h->n);
}

void api_metric(bytebuf *b, const char *name, const char *type, const char *help, double v)
{
    bytebuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* A MoE model's expert load: per layer, the tokens each expert received over the engine's
 * sliding window of steps, and the imbalance over 8 groups (expert parallelism's figure:
 * the busiest group's load over the mean). Nothing for a dense model. */
static void misc_moe_metrics(bytebuf *b, engine *e)
{
    const model_hparams *hp = &engine_model(e)->hp;
    if (hp->n_expert == 0) return;
    uint64_t win[MODEL_MAX_EXPERTS];
    int64_t steps = 0;
    int groups = hp->n_expert < 8 ? hp->n_expert : 8;
    engine_moe_load(e, 0, NULL, NULL, &steps);
    api_metric(b, "tokenmill_moe_window_steps", "gauge", "Engine steps in the expert load window.", (double)steps);
    bytebuf_puts(b, "# HELP tokenmill_moe_expert_tokens Tokens routed to each expert of each layer over the window.\n"
                     "# TYPE tokenmill_moe_expert_tokens gauge\n");
    for (int il = 0; il < hp->n_layers && engine_moe_load(e, il, win, NULL, NULL); il++)
        for (int x = 0; x < hp->n_expert; x++)
            bytebuf_printf(b, "tokenmill_moe_expert_tokens{layer=\"%d\",expert=\"%d\"} %llu\n", il, x,
                            (unsigned long long)win[x]);
    bytebuf_puts(b, "# HELP tokenmill_moe_imbalance Busiest expert group's load over the mean, experts in contiguous groups, over the window.\n"
                     "# TYPE tokenmill_moe_imbalance gauge\n");
    for (int il = 0; il < hp->n_layers && engine_moe_load(e, il, win, NULL, NULL); il++)
        bytebuf_printf(b, "tokenmill_moe_imbalance{layer=\"%d\",groups=\"%d\"} %.6g\n", il, groups,
                        engine_moe_imbalance(win, hp->n_expert, groups));
}

/* The figures of one model's scheduler and engine. */
static void misc_metrics_model(bytebuf *b, const api_ctx *c)
{
    sched_stats st;
    sched_hist ttft, itl, step, load_wait;
    sched_get_stats(c->sched, &st);
    if (c->status) status_observe(c->status, gc_wall_now(), st.step_s);  /* scrapes sample utilisation */
    sched_get_hists(c->sched, &ttft, &itl, &step, &load_wait);
    api_metric(b, "tokenmill_requests_total", "counter", "Generation requests accepted by the scheduler.", (double)st.n_requests);
    api_metric(b, "tokenmill_requests_rejected_total", "counter", "Requests refused because the queue was full.", (double)st.n_rejected);
    bytebuf_puts(b, "# HELP tokenmill_requests_finished_total Finished requests by reason.\n"
                      "# TYPE tokenmill_requests_finished_total counter\n");
    for (int f = SCHED_FINISH_STOP; f <= SCHED_FINISH_ABORTED; f++)
        bytebuf_printf(b, "tokenmill_requests_finished_total{reason=\"%s\"} %llu\n", sched_finish_name((sched_finish)f),
                        (unsigned long long)st.n_finished[f]);
    api_metric(b, "tokenmill_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", (double)st.n_prompt_tokens);
    api_metric(b, "tokenmill_cached_prompt_tokens_total", "counter", "Prompt tokens whose KV came from the prefix cache.", (double)st.n_cached_tokens);
    api_metric(b, "tokenmill_store_blocks_loaded_total", "counter", "KV blocks read from the block store.", (double)st.store_blocks_loaded);
    api_metric(b, "tokenmill_store_blocks_hit_total", "counter", "Block store blocks whose tokens were served as cached.", (double)st.store_blocks_hit);
    api_metric(b, "tokenmill_store_blocks_shared_total", "counter", "Blocks a load took from another request's load of the same prefix instead of reading the store again.", (double)st.store_blocks_shared);
    api_metric(b, "tokenmill_store_touches_total", "counter", "Stored blocks whose last use was refreshed because the RAM tier served them.", (double)st.store_touches);
    api_metric(b, "tokenmill_store_load_seconds_total", "counter", "Seconds the I/O threads spent reading and verifying blocks from the block store.", st.store_load_s);
    api_metric(b, "tokenmill_store_fill_wait_seconds_total", "counter", "Seconds engine steps waited for loaded blocks to be copied into the KV pool.", st.store_fill_wait_s);
    api_metric(b, "tokenmill_store_writes_total", "counter", "KV blocks written behind to the block store.", (double)st.store_writes);
    api_metric(b, "tokenmill_store_writes_dropped_total", "counter", "KV blocks not written: the store was too slow (write buffers full).", (double)st.store_writes_dropped);
    api_metric(b, "tokenmill_store_writes_failed_total", "counter", "KV block writes the store refused (disk full, I/O error).", (double)st.store_writes_failed);
    api_metric(b, "tokenmill_prefill_tokens_total", "counter", "Tokens computed as prefill (recomputation included).", (double)st.n_prefill_tokens);
    api_metric(b, "tokenmill_generated_tokens_total", "counter", "Tokens generated.", (double)st.n_gen_tokens);
    api_metric(b, "tokenmill_preemptions_total", "counter", "Running requests preempted for KV space.", (double)st.n_preempted);
    api_metric(b, "tokenmill_queue_depth", "gauge", "Requests waiting to run.", st.n_queued);
    api_metric(b, "tokenmill_running_sequences", "gauge", "Sequences in the running batch.", st.n_running);
    api_metric(b, "tokenmill_kv_blocks_total", "gauge", "KV pool size in 128-token blocks.", st.kv_blocks_total);
    api_metric(b, "tokenmill_kv_blocks_used", "gauge", "KV blocks held by running sequences.", st.kv_blocks_used);
    api_metric(b, "tokenmill_kv_blocks_cached", "gauge", "Unreferenced KV blocks kept for prefix reuse (reclaimable).", st.kv_blocks_cached);
    api_metric(b, "tokenmill_kv_blocks_free", "gauge", "KV blocks on the free list.", st.kv_blocks_free);
    if (st.window) {   /* models with sliding-window or recurrent layers: the window cache (a recurrent
                        * model's states count as window-layer states; replays are exact) */
        api_metric(b, "tokenmill_window_entries", "gauge", "Window-layer states held in the window cache.", (double)st.window_entries);
        api_metric(b, "tokenmill_window_bytes", "gauge", "Bytes of window-layer states held.", (double)st.window_bytes);
        api_metric(b, "tokenmill_window_puts_total", "counter", "Window-layer states kept at block ends.", (double)st.window_puts);
        api_metric(b, "tokenmill_window_hits_total", "counter", "Attached prefixes whose window-layer state was in the window cache.", (double)st.window_hits);
        api_metric(b, "tokenmill_window_misses_total", "counter", "Attached prefixes whose window-layer state was not (replayed).", (double)st.window_misses);
        api_metric(b, "tokenmill_window_expired_total", "counter", "Window-layer states dropped for age (--window-ttl).", (double)st.window_expired);
        api_metric(b, "tokenmill_window_evicted_total", "counter", "Window-layer states dropped for room (--window-mib).", (double)st.window_evicted);
        api_metric(b, "tokenmill_window_replays_exact_total", "counter", "Missing window states recomputed exactly.", (double)st.window_replay_exact);
        api_metric(b, "tokenmill_window_replays_bounded_total", "counter", "Missing window states recomputed over the last block only (bounded replay).", (double)st.window_replay_bounded);
        api_metric(b, "tokenmill_window_replay_tokens_total", "counter", "Positions recomputed by window replays.", (double)st.window_replay_tokens);
        api_metric(b, "tokenmill_window_fetches_total", "counter", "Window states fetched from another process.", (double)st.window_fetches);
    }
    api_metric(b, "tokenmill_engine_steps_total", "counter", "Engine forward steps.", (double)st.n_steps);
    api_metric(b, "tokenmill_engine_mixed_steps_total", "counter", "Engine steps that carried decodes and prefill chunks together.", (double)st.n_mixed_steps);
    api_metric(b, "tokenmill_step_tokens_budget", "gauge", "Token budget of one step (decodes + prefill chunks, --step-tokens).", st.step_tokens);
    api_metric(b, "tokenmill_prefill_step_tokens_budget", "gauge", "Token budget of a step without decodes (--prefill-step-tokens).", st.prefill_step_tokens);
    api_metric(b, "tokenmill_step_tokens_max", "gauge", "Most tokens any step carried so far.", st.max_step_tokens);
    api_metric(b, "tokenmill_shared_prompt_tokens_total", "counter", "Cached prompt tokens attached from a prefix another request was computing at the same time.", (double)st.n_shared_tokens);
    api_metric(b, "tokenmill_tail_prompt_tokens_total", "counter", "Cached prompt tokens below a block boundary, copied from the rows an ended request kept (its prompt's last block).", (double)st.n_tail_tokens);
    api_metric(b, "tokenmill_step_target_seconds", "gauge", "Time target of a step with decodes (--step-ms; 0: token budgets only).", st.step_ms / 1e3);
    api_metric(b, "tokenmill_step_model_predictions_total", "counter", "Engine steps whose duration the learned step-time model predicted.", (double)st.step_model_n);
    api_metric(b, "tokenmill_step_model_abs_error_seconds_total", "counter", "Sum of |predicted - measured| step seconds over those.", st.step_model_abs_err_s);
    api_metric(b, "tokenmill_step_model_rel_error_total", "counter", "Sum of |predicted - measured| / measured over those (divide by the predictions for the mean).", st.step_model_rel_err);
    api_metric(b, "tokenmill_engine_step_seconds_total", "counter", "Seconds inside engine steps.", st.step_s);
    api_metric(b, "tokenmill_cpu_gap_seconds_total", "counter",
                 "Seconds between consecutive engine steps while busy (planning, sampling, publishing).", st.gap_s);
    api_metric(b, "tokenmill_sampling_seconds_total", "counter", "Seconds of sampling between steps (part of the CPU gap).", st.gap_part_s[SCHED_GAP_SAMPLE]);
    api_metric(b, "tokenmill_planning_seconds_total", "counter", "Seconds of planning the next step (part of the CPU gap).", st.gap_part_s[SCHED_GAP_PLAN]);
    api_metric(b, "tokenmill_publishing_seconds_total", "counter", "Seconds of publishing a step's outputs, waiting for the lock included (part of the CPU gap).",
               st.gap_part_s[SCHED_GAP_LOCK] + st.gap_part_s[SCHED_GAP_PUBLISH] + st.gap_part_s[SCHED_GAP_HANDOFF]);
    bytebuf_printf(b, "# HELP tokenmill_cpu_gap_part_seconds_total The CPU gap's parts, which sum to it: commit (KV blocks after the step), sample, draft, lock (waiting for the scheduler's lock), publish (outputs published on the engine thread), handoff, plan, launch (the rest).\n"
                       "# TYPE tokenmill_cpu_gap_part_seconds_total counter\n");
    for (int i = 0; i < SCHED_GAP_N; i++)
        bytebuf_printf(b, "tokenmill_cpu_gap_part_seconds_total{part=\"%s\"} %.17g\n", sched_gap_part_name((sched_gap_part)i), st.gap_part_s[i]);
    api_metric(b, "tokenmill_spec_drafted_tokens_total", "counter", "Tokens drafted for speculative decoding (--spec).", (double)st.spec_drafted);
    api_metric(b, "tokenmill_spec_verified_tokens_total", "counter", "Drafted tokens put into engine steps to be verified.", (double)st.spec_verified);
    api_metric(b, "tokenmill_spec_accepted_tokens_total", "counter", "Verified drafted tokens accepted (emitted without a step of their own).", (double)st.spec_accepted);
    api_metric(b, "tokenmill_spec_verifies_total", "counter", "Sequence-steps that verified drafted tokens.", (double)st.spec_verifies);
    api_metric(b, "tokenmill_spec_mean_accepted_length", "gauge", "Drafted tokens accepted per verifying sequence-step (0: none yet).",
               st.spec_verifies ? (double)st.spec_accepted / (double)st.spec_verifies : 0);
    bytebuf_puts(b, "# HELP tokenmill_spec_verify_count_total Decodes that had drafts, by the count of drafted tokens verified.\n"
                      "# TYPE tokenmill_spec_verify_count_total counter\n");
    for (int k = 0; k <= SPEC_MAX_K; k++)
        bytebuf_printf(b, "tokenmill_spec_verify_count_total{k=\"%d\"} %llu\n", k, (unsigned long long)st.spec_k_hist[k]);
    static const struct { const char *stage, *help; } by_src[3] = {
        { "drafted", "Tokens drafted, by draft source (ngram: prompt lookup; model: --draft or --draft-layers; mtp: the model's MTP layer)." },
        { "verified", "Drafted tokens verified, by draft source." },
        { "accepted", "Verified drafted tokens accepted, by draft source." },
    };
    for (int j = 0; j < 3; j++) {
        const uint64_t *v = j == 0 ? st.spec_src_drafted : j == 1 ? st.spec_src_verified : st.spec_src_accepted;
        bytebuf_printf(b, "# HELP tokenmill_spec_source_%s_tokens_total %s\n# TYPE tokenmill_spec_source_%s_tokens_total counter\n",
                       by_src[j].stage, by_src[j].help, by_src[j].stage);
        for (int src = 0; src < SPEC_N_SRC; src++)
            bytebuf_printf(b, "tokenmill_spec_source_%s_tokens_total{source=\"%s\"} %llu\n", by_src[j].stage,
                           spec_source_name(src), (unsigned long long)v[src]);
    }
    api_metric_hist(b, "tokenmill_time_to_first_token_seconds", "Seconds from submission to the first generated token.", &ttft);
    api_metric_hist(b, "tokenmill_inter_token_latency_seconds", "Seconds between consecutive tokens of a request.", &itl);
    api_metric_hist(b, "tokenmill_engine_step_duration_seconds", "Duration of one engine step.", &step);
    api_metric_hist(b, "tokenmill_cache_load_wait_seconds",
              "Seconds a request waited for its block store load before admission (part of its time to first token).", &load_wait);
    misc_moe_metrics(b, sched_engine(c->sched));
    engine_ep_metrics(sched_engine(c->sched), b);
}

/* The figures of the process: the HTTP layer and the block store all models share. */
static void misc_metrics_server(bytebuf *b, const api_ctx *c, const http_stats *hs)
{
    bytebuf_puts(b, "# HELP tokenmill_http_requests_total HTTP responses by status class.\n"
                      "# TYPE tokenmill_http_requests_total counter\n");
    for (int k = 1; k <= 5; k++)
        bytebuf_printf(b, "tokenmill_http_requests_total{code=\"%dxx\"} %llu\n", k, (unsigned long long)hs->n_by_class[k]);
    api_metric(b, "tokenmill_http_disconnects_total", "counter", "Streams ended by the client.", (double)hs->n_disconnects);
    api_metric(b, "tokenmill_http_connections", "gauge", "Open HTTP connections (served, and waiting for their request head).", hs->n_connections);
    api_metric(b, "tokenmill_http_refused_total", "counter", "Connections refused at the connection or per-client limit (503/429).", (double)hs->n_refused);
    api_metric(b, "tokenmill_http_timeouts_total", "counter", "Requests whose head or body did not arrive in time (408).", (double)hs->n_timeouts);
    api_metric(b, "tokenmill_http_streams", "gauge", "Streaming responses in progress.", hs->n_streams);
    if (c->store) {   /* the block store: what it holds and what it let go (the retention answer) */
        store_stats ss;
        store_get_stats(c->store, &ss);
        api_metric(b, "tokenmill_store_bytes", "gauge", "Bytes of the block store's files (this process' view).", (double)ss.bytes_used);
        api_metric(b, "tokenmill_store_capacity_bytes", "gauge", "Capacity of each block store target (0: none set).", (double)c->store_capacity);
        api_metric(b, "tokenmill_store_expired_total", "counter", "Stored blocks deleted because their traffic class' TTL ran out.", (double)ss.n_expired);
        api_metric(b, "tokenmill_store_evicted_total", "counter", "Stored blocks deleted to stay under capacity (least recently used first).", (double)ss.n_evicted);
        api_metric(b, "tokenmill_store_oldest_use_timestamp_seconds", "gauge", "Last use of the least recently used stored block (0: none).", ss.oldest_use);
    }
}

/* Appends one sample line of a model's family with model="name" as its first label. */
static void misc_label_line(bytebuf *out, const char *line, size_t n, const char *name)
{
    size_t k = 0;
    while (k < n && line[k] != '{' && line[k] != ' ') k++;
    bytebuf_append(out, line, k);
    bytebuf_puts(out, "{model=\"");
    for (const char *p = name; *p; p++) {   /* a label value's escapes */
        if (*p == '\\' || *p == '"') bytebuf_putc(out, '\\');
        if (*p == '\n') bytebuf_puts(out, "\\n");
        else bytebuf_putc(out, *p);
    }
    bytebuf_putc(out, '"');
    if (k < n && line[k] == '{') {
        k++;
        if (k < n && line[k] != '}') bytebuf_putc(out, ',');
    } else {
        bytebuf_putc(out, '}');
    }
    bytebuf_append(out, line + k, n - k);
    bytebuf_putc(out, '\n');
}

/* The family named by the "# HELP NAME" line at p (its text up to the next "# HELP"), in
 * [*start, *end) of t; false when t has none of that name. */
static bool misc_family_find(const bytebuf *t, const char *name, size_t nlen, size_t *start, size_t *end)
{
    const char *p = t->p, *e = t->p + t->len;
    while (p && p < e) {
        if (!strncmp(p, "# HELP ", 7) && (size_t)(e - p) > 7 + nlen && !memcmp(p + 7, name, nlen) && p[7 + nlen] == ' ') {
            const char *q = p + 1;
            while ((q = memchr(q, '\n', (size_t)(e - q))) && ++q < e && strncmp(q, "# HELP ", 7)) {}
            *start = (size_t)(p - t->p);
            *end = q && q < e ? (size_t)(q - t->p) : t->len;
            return true;
        }
        p = memchr(p, '\n', (size_t)(e - p));
        if (p) p++;
    }
    return false;
}

/* Several models' figures as one exposition: each family once (its HELP and TYPE), then
 * every model's samples of it, labelled model="NAME". per[i] are the models' texts. */
static void misc_metrics_merge(bytebuf *out, const bytebuf *per, const api_ctx *const *all, int n)
{
    for (int i = 0; i < n; i++) {
        const char *p = per[i].p, *e = per[i].p + per[i].len;
        while (p && p < e) {
            const char *eol = memchr(p, '\n', (size_t)(e - p));
            size_t ll = eol ? (size_t)(eol - p) : (size_t)(e - p);
            if (ll > 7 && !strncmp(p, "# HELP ", 7)) {
                const char *nm = p + 7;
                size_t nlen = 0;
                while (nm + nlen < e && nm[nlen] != ' ') nlen++;
                size_t s0, s1;
                bool seen = false;   /* an earlier model had it: written already */
                for (int k = 0; k < i && !seen; k++) seen = misc_family_find(&per[k], nm, nlen, &s0, &s1);
                for (int k = i; k < n && !seen; k++) {
                    if (!misc_family_find(&per[k], nm, nlen, &s0, &s1)) continue;
                    const char *q = per[k].p + s0, *qe = per[k].p + s1;
                    while (q < qe) {
                        const char *ql = memchr(q, '\n', (size_t)(qe - q));
                        size_t qn = ql ? (size_t)(ql - q) : (size_t)(qe - q);
                        if (q[0] == '#') {
                            if (k == i) {
                                bytebuf_append(out, q, qn);
                                bytebuf_putc(out, '\n');
                            }
                        } else if (qn) {
                            misc_label_line(out, q, qn, all[k]->model_name);
                        }
                        q += qn + 1;
                    }
                }
            }
            p = eol ? eol + 1 : NULL;
        }
    }
}

static void misc_metrics(http_request *r, void *user)
{
    const api_ctx *c = user;
    if (!c->metrics_public && !api_openai_auth(r)) return;  /* the figures tell load and tenants' traffic */
    if (!c->sched) { /* a remote backend (the gateway): its own figures */
        bytebuf b = { 0 };
        if (c->backend && c->backend->metrics) c->backend->metrics(c->backend->ud, &b);
        http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", b.len);
        bytebuf_free(&b);
        return;
    }
    http_stats hs;
    http_get_stats(http_request_server(r), &hs);
    bytebuf b = { 0 };
    if (c->n_all < 2) {
        misc_metrics_model(&b, c);
    } else {   /* one family per figure, a sample per model */
        bytebuf per[API_MAX_MODELS];
        int n = c->n_all < API_MAX_MODELS ? c->n_all : API_MAX_MODELS;
        for (int i = 0; i < n; i++) {
            per[i] = (bytebuf){ 0 };
            misc_metrics_model(&per[i], c->all[i]);
        }
        misc_metrics_merge(&b, per, (const api_ctx *const *)c->all, n);
        for (int i = 0; i < n; i++) bytebuf_free(&per[i]);
    }
    misc_metrics_server(&b, c, &hs);
    http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
    bytebuf_free(&b);
}

/* The operator's page. It names tenants' traffic and load, so it is behind the key like
 * /metrics. The CSP forbids every load but the page's own inline style: it works offline and
 * makes no request of its own. */
static void misc_status(http_request *r, void *user)
{
    const api_ctx *c = user;
    if (!c->metrics_public && !api_openai_auth(r)) return;
    const char *names[API_MAX_MODELS];
    int n_models = c->n_all < API_MAX_MODELS ? c->n_all : API_MAX_MODELS;
    for (int i = 0; i < n_models; i++) names[i] = c->all[i]->model_name;
    const char *want = http_request_query(r, "model");
    if (want && *want) {   /* several models: ?model=NAME is that one's page */
        const api_ctx *m = api_ctx_route(c, want);
        if (!m) {
            api_openai_error(r, 404, "invalid_request_error", "no such model on this server", "model", "model_not_found");
            return;
        }
        c = m;
    }
    if (!c->status) {
        api_openai_error(r, 404, "invalid_request_error", "no status page on this server", NULL, "not_found");
        return;
    }
    double now = gc_wall_now();
    sched_stats st;
    status_page_in in = { .model_name = c->model_name, .now = now, .started = (double)c->created,
                          .retention = c->retention, .cost_per_hour = c->cost_per_hour,
                          .store_capacity = c->store_capacity, .curve = c->curve,
                          .viewer_slot = http_request_key_index(r) + 1, .model_names = names,
                          .n_models = n_models };
    if (c->sched) {
        sched_get_stats(c->sched, &st);
        status_observe(c->status, now, st.step_s);
        in.sched = &st;
        in.role_text = "One process does both: prefill chunks and decodes share each engine step (split them with "
                       "`tokenmill gateway` and prefill / decode workers).";
    }
    bytebuf role = { 0 }, ep = { 0 };   /* an expert group this process leads: its line after that one */
    if (c->sched) engine_ep_status(sched_engine(c->sched), &ep);
    if (ep.len) {
        bytebuf_printf(&role, "%s %s.", in.role_text, ep.p);
        in.role_text = role.p;
    }
    bytebuf_free(&ep);
    if (c->store) {
        store_stats ss;
        store_get_stats(c->store, &ss);
        in.store_spec = store_spec(c->store);
        in.store_bytes = ss.bytes_used;
        in.store_expired = ss.n_expired;
        in.store_evicted = ss.n_evicted;
        in.store_oldest = ss.oldest_use;
    }
    if (c->backend && c->backend->status) {   /* written into the page where answer 4 wants it */
        in.cluster = c->backend->status;
        in.cluster_ud = c->backend->ud;
        in.role_text = c->backend->role_text;
    }
    bytebuf b = { 0 };
    status_page(c->status, &in, &b);
    bytebuf_free(&role);
    http_add_header(r, "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'");
    http_add_header(r, "Cache-Control", "no-store");
    http_respond(r, 200, "text/html; charset=utf-8", b.p, b.len);
    bytebuf_free(&b);
}

void api_misc_register(http_server *h, api_ctx *c)
{
    http_route_ops(h, "GET", "/", misc_status, c);
    http_route_ops(h, "GET", "/status", misc_status, c);
    http_route(h, "GET", "/v1/models", misc_models, c);
    http_route(h, "GET", "/v1/models/*", misc_model_get, c);
    http_route_ops(h, "GET", "/health", misc_health, c);   /* answered while the API is saturated */
    http_route_ops(h, "GET", "/metrics", misc_metrics, c);
}
