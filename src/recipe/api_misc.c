/*
 * api_misc: the server's small routes: GET /v1/models (OpenAI list shape), GET /health, and
 * GET /metrics (Prometheus text exposition format 0.0.4) from the scheduler's and the HTTP
 * layer's counters (a remote backend without a scheduler: the backend's metrics hook): requests, tokens in/out, cached tokens, TTFT / inter-token latency /
 * engine step histograms, queue depth, running sequences, KV blocks, CPU gap between steps.
 */
#include "recipe/api.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static void misc_models(http_request *r, void *user)
{
    const api_ctx *c = user;
    if (!api_openai_auth(r)) return;
    json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "id", c->model_name, "object", "model", "created",
                          (json_int_t)c->created, "owned_by", "tokenmill");
    json_object_set_new(m, "context_length", json_integer(c->n_ctx));
    api_respond_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

static void misc_health(http_request *r, void *user)
{
    (void)user;
    http_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

static void misc_hist(http_buf *b, const char *name, const char *help, const sched_hist *h)
{
    http_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SCHED_HIST_N; i++) {
        cum += h->counts[i];
        http_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, sched_hist_bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[SCHED_HIST_N];
    http_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
                    h->sum, name, (unsigned long long)h->n);
}

void api_metric(http_buf *b, const char *name, const char *type, const char *help, double v)
{
    http_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* A MoE model's expert load: per layer, the tokens each expert received over the engine's
 * sliding window of steps, and the imbalance over 8 groups (expert parallelism's figure:
 * the busiest group's load over the mean). Nothing for a dense model. */
static void misc_moe_metrics(http_buf *b, engine *e)
{
    const model_hparams *hp = &engine_model(e)->hp;
    if (hp->n_expert == 0) return;
    uint64_t win[MODEL_MAX_EXPERTS];
    int64_t steps = 0;
    int groups = hp->n_expert < 8 ? hp->n_expert : 8;
    engine_moe_load(e, 0, NULL, NULL, &steps);
    api_metric(b, "tokenmill_moe_window_steps", "gauge", "Engine steps in the expert load window.", (double)steps);
    http_buf_puts(b, "# HELP tokenmill_moe_expert_tokens Tokens routed to each expert of each layer over the window.\n"
                     "# TYPE tokenmill_moe_expert_tokens gauge\n");
    for (int il = 0; il < hp->n_layers && engine_moe_load(e, il, win, NULL, NULL); il++)
        for (int x = 0; x < hp->n_expert; x++)
            http_buf_printf(b, "tokenmill_moe_expert_tokens{layer=\"%d\",expert=\"%d\"} %llu\n", il, x,
                            (unsigned long long)win[x]);
    http_buf_puts(b, "# HELP tokenmill_moe_imbalance Busiest expert group's load over the mean, experts in contiguous groups, over the window.\n"
                     "# TYPE tokenmill_moe_imbalance gauge\n");
    for (int il = 0; il < hp->n_layers && engine_moe_load(e, il, win, NULL, NULL); il++)
        http_buf_printf(b, "tokenmill_moe_imbalance{layer=\"%d\",groups=\"%d\"} %.6g\n", il, groups,
                        engine_moe_imbalance(win, hp->n_expert, groups));
}

static void misc_metrics(http_request *r, void *user)
{
    const api_ctx *c = user;
    sched_stats st;
    sched_hist ttft, itl, step, load_wait;
    http_stats hs;
    if (!c->sched) { /* a remote backend (the gateway): its own figures */
        http_buf b = { 0 };
        if (c->backend && c->backend->metrics) c->backend->metrics(c->backend->ud, &b);
        http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.data ? b.data : "", b.len);
        http_buf_free(&b);
        return;
    }
    sched_get_stats(c->sched, &st);
    sched_get_hists(c->sched, &ttft, &itl, &step, &load_wait);
    http_get_stats(http_request_server(r), &hs);
    http_buf b = { 0 };
    api_metric(&b, "tokenmill_requests_total", "counter", "Generation requests accepted by the scheduler.", (double)st.n_requests);
    api_metric(&b, "tokenmill_requests_rejected_total", "counter", "Requests refused because the queue was full.", (double)st.n_rejected);
    http_buf_puts(&b, "# HELP tokenmill_requests_finished_total Finished requests by reason.\n"
                      "# TYPE tokenmill_requests_finished_total counter\n");
    for (int f = SCHED_FINISH_STOP; f <= SCHED_FINISH_ERROR; f++)
        http_buf_printf(&b, "tokenmill_requests_finished_total{reason=\"%s\"} %llu\n", sched_finish_name((sched_finish)f),
                        (unsigned long long)st.n_finished[f]);
    http_buf_puts(&b, "# HELP tokenmill_http_requests_total HTTP responses by status class.\n"
                      "# TYPE tokenmill_http_requests_total counter\n");
    for (int k = 1; k <= 5; k++)
        http_buf_printf(&b, "tokenmill_http_requests_total{code=\"%dxx\"} %llu\n", k, (unsigned long long)hs.n_by_class[k]);
    api_metric(&b, "tokenmill_http_disconnects_total", "counter", "Streams ended by the client.", (double)hs.n_disconnects);
    api_metric(&b, "tokenmill_http_connections", "gauge", "Open HTTP connections.", hs.n_connections);
    api_metric(&b, "tokenmill_http_streams", "gauge", "Streaming responses in progress.", hs.n_streams);
    api_metric(&b, "tokenmill_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", (double)st.n_prompt_tokens);
    api_metric(&b, "tokenmill_cached_prompt_tokens_total", "counter", "Prompt tokens whose KV came from the prefix cache.", (double)st.n_cached_tokens);
    api_metric(&b, "tokenmill_store_blocks_loaded_total", "counter", "KV blocks read from the block store.", (double)st.store_blocks_loaded);
    api_metric(&b, "tokenmill_store_blocks_hit_total", "counter", "Block store blocks whose tokens were served as cached.", (double)st.store_blocks_hit);
    api_metric(&b, "tokenmill_store_blocks_shared_total", "counter", "Blocks a load took from another request's load of the same prefix instead of reading the store again.", (double)st.store_blocks_shared);
    api_metric(&b, "tokenmill_store_touches_total", "counter", "Stored blocks whose last use was refreshed because the RAM tier served them.", (double)st.store_touches);
    api_metric(&b, "tokenmill_store_load_seconds_total", "counter", "Seconds the I/O threads spent reading and verifying blocks from the block store.", st.store_load_s);
    api_metric(&b, "tokenmill_store_fill_wait_seconds_total", "counter", "Seconds engine steps waited for loaded blocks to be copied into the KV pool.", st.store_fill_wait_s);
    api_metric(&b, "tokenmill_store_writes_total", "counter", "KV blocks written behind to the block store.", (double)st.store_writes);
    api_metric(&b, "tokenmill_store_writes_dropped_total", "counter", "KV blocks not written: the store was too slow (write buffers full).", (double)st.store_writes_dropped);
    api_metric(&b, "tokenmill_store_writes_failed_total", "counter", "KV block writes the store refused (disk full, I/O error).", (double)st.store_writes_failed);
    api_metric(&b, "tokenmill_prefill_tokens_total", "counter", "Tokens computed as prefill (recomputation included).", (double)st.n_prefill_tokens);
    api_metric(&b, "tokenmill_generated_tokens_total", "counter", "Tokens generated.", (double)st.n_gen_tokens);
    api_metric(&b, "tokenmill_preemptions_total", "counter", "Running requests preempted for KV space.", (double)st.n_preempted);
    api_metric(&b, "tokenmill_queue_depth", "gauge", "Requests waiting to run.", st.n_queued);
    api_metric(&b, "tokenmill_running_sequences", "gauge", "Sequences in the running batch.", st.n_running);
    api_metric(&b, "tokenmill_kv_blocks_total", "gauge", "KV pool size in 128-token blocks.", st.kv_blocks_total);
    api_metric(&b, "tokenmill_kv_blocks_used", "gauge", "KV blocks held by running sequences.", st.kv_blocks_used);
    api_metric(&b, "tokenmill_kv_blocks_cached", "gauge", "Unreferenced KV blocks kept for prefix reuse (reclaimable).", st.kv_blocks_cached);
    api_metric(&b, "tokenmill_kv_blocks_free", "gauge", "KV blocks on the free list.", st.kv_blocks_free);
    api_metric(&b, "tokenmill_engine_steps_total", "counter", "Engine forward steps.", (double)st.n_steps);
    api_metric(&b, "tokenmill_engine_mixed_steps_total", "counter", "Engine steps that carried decodes and prefill chunks together.", (double)st.n_mixed_steps);
    api_metric(&b, "tokenmill_step_tokens_budget", "gauge", "Token budget of one step (decodes + prefill chunks, --step-tokens).", st.step_tokens);
    api_metric(&b, "tokenmill_prefill_step_tokens_budget", "gauge", "Token budget of a step without decodes (--prefill-step-tokens).", st.prefill_step_tokens);
    api_metric(&b, "tokenmill_step_tokens_max", "gauge", "Most tokens any step carried so far.", st.max_step_tokens);
    api_metric(&b, "tokenmill_engine_step_seconds_total", "counter", "Seconds inside engine steps.", st.step_s);
    api_metric(&b, "tokenmill_cpu_gap_seconds_total", "counter",
                 "Seconds between consecutive engine steps while busy (planning, sampling, publishing).", st.gap_s);
    api_metric(&b, "tokenmill_sampling_seconds_total", "counter", "Seconds of sampling between steps (part of the CPU gap).", st.sample_s);
    misc_hist(&b, "tokenmill_time_to_first_token_seconds", "Seconds from submission to the first generated token.", &ttft);
    misc_hist(&b, "tokenmill_inter_token_latency_seconds", "Seconds between consecutive tokens of a request.", &itl);
    misc_hist(&b, "tokenmill_engine_step_duration_seconds", "Duration of one engine step.", &step);
    misc_hist(&b, "tokenmill_cache_load_wait_seconds",
              "Seconds a request waited for its block store load before admission (part of its time to first token).", &load_wait);
    misc_moe_metrics(&b, sched_engine(c->sched));
    http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len);
    http_buf_free(&b);
}

void api_misc_register(http_server *h, api_ctx *c)
{
    http_route(h, "GET", "/v1/models", misc_models, c);
    http_route(h, "GET", "/health", misc_health, c);
    http_route(h, "GET", "/metrics", misc_metrics, c);
}
