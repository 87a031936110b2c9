/*
 * test_status: the status page's ring against a known workload at chosen times: cache hits
 * per traffic class and window, TTFT mean / P99 per input-length bucket and window, per-user
 * speed quantiles, utilisation from busy samples, the ring's recycling after 24 h, and the
 * page's figures (retention per class, the counters /metrics also exports, a chart per answer).
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "recipe/status.h"

static const double T0 = 1.8e9 + 25;   /* an epoch second 25 s into its minute */

static bool near(double a, double b) { return fabs(a - b) < 1e-9 * (1 + fabs(b)); }

static uint64_t sum_all(const uint64_t *v, int n)
{
    uint64_t s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

TEST(test_status_hits_by_window_and_class)
{
    status_ring *st = status_new(T0 - 2 * 86400);
    double now = T0;
    /* now: class 0, 1000 prompt tokens, 896 cached; class 1, 200 / 0 */
    status_note(st, now - 10, &(status_req){ .cls = 0, .n_prompt = 1000, .n_cached = 896, .n_gen = 10, .ttft_s = 0.02 });
    status_note(st, now - 5, &(status_req){ .cls = 1, .n_prompt = 200, .n_cached = 0, .n_gen = 5, .ttft_s = 0.02 });
    /* 10 minutes ago: in 1 h and 24 h, not in 5 min */
    status_note(st, now - 600, &(status_req){ .cls = 0, .n_prompt = 500, .n_cached = 128, .n_gen = 7, .ttft_s = 0.5 });
    /* 2 hours ago: only in 24 h */
    status_note(st, now - 7200, &(status_req){ .cls = 1, .n_prompt = 300, .n_cached = 256, .n_gen = 3, .ttft_s = 1.5 });
    /* 25 hours ago: in no window */
    status_note(st, now - 90000, &(status_req){ .cls = 0, .n_prompt = 9999, .n_cached = 9999, .n_gen = 9999, .ttft_s = 9 });
    status_window w5, w60, w1440;
    status_window_get(st, now, 5, &w5);
    status_window_get(st, now, 60, &w60);
    status_window_get(st, now, 1440, &w1440);
    CHECK(w5.n_prompt[0] == 1000 && w5.n_cached[0] == 896 && w5.n_prompt[1] == 200 && w5.n_cached[1] == 0);
    CHECK(w5.n_req[0] == 1 && w5.n_req[1] == 1 && w5.n_gen == 15);
    CHECK(w60.n_prompt[0] == 1500 && w60.n_cached[0] == 1024 && w60.n_prompt[1] == 200 && w60.n_gen == 22);
    CHECK(w1440.n_prompt[1] == 500 && w1440.n_cached[1] == 256 && w1440.n_prompt[0] == 1500 && w1440.n_gen == 25);
    CHECK(near(w5.span_s, 4 * 60.0 + fmod(now, 60.0)));   /* 4 whole minutes and this one so far */
    CHECK(near(w1440.span_s, 1439 * 60.0 + fmod(now, 60.0)));
    /* a class out of range counts as the default */
    status_note(st, now, &(status_req){ .cls = 99, .n_prompt = 1, .n_cached = 1 });
    status_window_get(st, now, 5, &w5);
    CHECK(w5.n_prompt[0] == 1001 && w5.n_cached[0] == 897);
    status_free(st);
}

TEST(test_status_ttft_by_length_and_quantiles)
{
    status_ring *st = status_new(T0 - 3600);
    for (int i = 0; i < 100; i++)   /* short prompts: (0.01, 0.025] */
        status_note(st, T0 - 30, &(status_req){ .n_prompt = 100, .n_gen = 2, .ttft_s = 0.02, .decode_tps = 40 });
    status_note(st, T0 - 30, &(status_req){ .n_prompt = 600, .n_gen = 2, .ttft_s = 3.0, .decode_tps = 4 });
    status_note(st, T0 - 30, &(status_req){ .n_prompt = 9000, .n_gen = 0, .ttft_s = -1 });   /* no first token */
    status_window w;
    status_window_get(st, T0, 5, &w);
    CHECK(status_len_bucket(100) == 0 && status_len_bucket(512) == 1 && status_len_bucket(600) == 1);
    CHECK(status_len_bucket(2048) == 2 && status_len_bucket(8192) == 3 && status_len_bucket(100000) == 3);
    CHECK(sum_all(w.ttft[0], SCHED_HIST_N + 1) == 100);
    CHECK(sum_all(w.ttft[1], SCHED_HIST_N + 1) == 1);
    CHECK(sum_all(w.ttft[3], SCHED_HIST_N + 1) == 0);   /* the request without a first token */
    CHECK(near(w.ttft_sum[0], 2.0) && near(w.ttft_sum[1], 3.0));
    /* Prometheus' histogram_quantile: linear inside (0.01, 0.025] */
    CHECK(near(status_quantile(w.ttft[0], sched_hist_bounds, SCHED_HIST_N, 0.5), 0.0175));
    CHECK(near(status_quantile(w.ttft[0], sched_hist_bounds, SCHED_HIST_N, 0.99), 0.01 + 0.015 * 0.99));
    CHECK(near(status_quantile(w.ttft[1], sched_hist_bounds, SCHED_HIST_N, 0.99), 2.5 + 2.5 * 0.99)); /* (2.5, 5] */
    CHECK(status_quantile(w.ttft[2], sched_hist_bounds, SCHED_HIST_N, 0.99) == -1);
    /* per-user speed: 100 at (30, 50], 1 at (3, 5]: the median in (30, 50], the slowest decile too */
    double med = status_quantile(w.speed, status_speed_bounds, STATUS_SPEED_N, 0.5);
    CHECK(med > 30 && med <= 50);
    CHECK(sum_all(w.speed, STATUS_SPEED_N + 1) == 101);
    CHECK(status_quantile(w.speed, status_speed_bounds, STATUS_SPEED_N, 0.001) <= 5);
    /* beyond the last bound: the last bound */
    uint64_t inf[SCHED_HIST_N + 1] = { 0 };
    inf[SCHED_HIST_N] = 3;
    CHECK(status_quantile(inf, sched_hist_bounds, SCHED_HIST_N, 0.5) == sched_hist_bounds[SCHED_HIST_N - 1]);
    status_free(st);
}

TEST(test_status_utilisation)
{
    status_ring *st = status_new(T0 - 7200);
    status_window w;
    status_window_get(st, T0, 5, &w);
    CHECK(w.busy < 0);   /* never sampled */
    status_observe(st, T0 - 3000, 0);      /* 50 min ago: outside 5 min, inside 1 h */
    status_observe(st, T0 - 240, 1000);    /* 4 min ago */
    status_observe(st, T0 - 200, 1010);    /* the same minute: the first sample stays */
    status_observe(st, T0, 1120);          /* 120 busy s over 240 s: 0.5 */
    status_window_get(st, T0, 5, &w);
    CHECK(near(w.busy, 0.5) && near(w.busy_s, 120));
    status_window_get(st, T0, 60, &w);
    CHECK(near(w.busy, 1120.0 / 3000.0));
    status_free(st);
}

TEST(test_status_ring_recycles_after_a_day)
{
    status_ring *st = status_new(T0);
    status_note(st, T0, &(status_req){ .n_prompt = 10, .n_cached = 5, .n_gen = 1 });
    double later = T0 + STATUS_MINUTES * 60.0;   /* the same slot of the ring, a day on */
    status_note(st, later, &(status_req){ .n_prompt = 3, .n_cached = 0, .n_gen = 2 });
    status_window w;
    status_window_get(st, later, 1440, &w);
    CHECK(w.n_prompt[0] == 3 && w.n_cached[0] == 0 && w.n_gen == 2);
    uint64_t per[60];
    status_minutes_gen(st, later, 60, per);
    CHECK(per[59] == 2 && sum_all(per, 60) == 2);
    status_free(st);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void cluster_block(void *ud, bytebuf *b) { bytebuf_puts(b, "<p id=\"cl\">x</p>"); }

TEST(test_status_page)
{
    status_ring *st = status_new(T0 - 600);
    status_observe(st, T0 - 600, 0);
    status_note(st, T0 - 30, &(status_req){ .cls = 1, .n_prompt = 1000, .n_cached = 768, .n_gen = 20, .ttft_s = 0.2, .decode_tps = 25 });
    status_observe(st, T0, 30);
    gc_retention ret;
    gc_retention_default(&ret);
    CHECK(gc_retention_parse(&ret, "agent=72h,batch=30m") == 0);
    sched_stats ss = { .n_requests = 7, .n_prompt_tokens = 1234, .n_cached_tokens = 768, .n_gen_tokens = 55, .n_running = 2 };
    status_page_in in = { .model_name = "m<1>", .now = T0, .started = T0 - 600, .sched = &ss, .store_spec = "dir:/x",
                          .store_bytes = 1 << 20, .store_capacity = 4 << 20, .store_expired = 3, .store_evicted = 4,
                          .store_oldest = T0 - 7200,
                          .retention = &ret, .cost_per_hour = 3.6, .role_text = "one process" };
    bytebuf b = { 0 };
    status_page(st, &in, &b);
    const char *p = b.p;
    CHECK(strstr(p, "<title>tokenmill: m&lt;1&gt;</title>") != NULL);   /* escaped */
    CHECK(strstr(p, "data-metric=\"tokenmill_prompt_tokens_total\">1234<") != NULL);
    CHECK(strstr(p, "data-metric=\"tokenmill_requests_total\">7<") != NULL);
    CHECK(strstr(p, "data-metric=\"tokenmill_running_sequences\">2<") != NULL);
    /* retention: TTL per class */
    CHECK(strstr(p, "<td>agent</td><td>3 d</td>") != NULL);
    CHECK(strstr(p, "<td>batch</td><td>30 min</td>") != NULL);
    CHECK(strstr(p, "<td>chat (default)</td><td>7 d</td>") != NULL);
    CHECK(strstr(p, "<span class=\"v\" data-oldest>2 h<") != NULL);   /* the oldest block's age */
    /* hits of class agent in the 5 min window: 768 of 1000 */
    CHECK(strstr(p, "data-window=\"5\" data-class=\"agent\" data-cached=\"768\" data-prompt=\"1000\">76.8 %") != NULL);
    CHECK(strstr(p, "data-window=\"5\" data-class=\"chat\" data-cached=\"0\" data-prompt=\"0\">–") != NULL);
    /* TTFT of the 512-2k bucket: 200 ms mean */
    CHECK(strstr(p, "data-window=\"5\" data-len=\"1\" data-n=\"1\"") != NULL);
    CHECK(strstr(p, ">200 ms / ") != NULL);
    /* a chart per answer, the store's fill, and the cost: busy 30 s of an hour at 3.6/h = 0.03 */
    CHECK(count(p, "<svg class=\"chart\"") == 5);
    CHECK(strstr(p, "data-chart=\"utilisation\"") && strstr(p, "data-chart=\"gen_per_minute\""));
    CHECK(strstr(p, "<td>output</td><td>20</td><td>1500</td>") != NULL);   /* 0.03 / 20 * 1e6 */
    CHECK(strstr(p, "<td>input, cached</td><td>768</td>") != NULL);
    CHECK(strstr(p, "http-equiv=\"refresh\"") != NULL);
    CHECK(strstr(p, "<script") == NULL && strstr(p, "src=") == NULL);
    bytebuf_free(&b);
    /* without a scheduler, a store or a price (the gateway's shape): no totals, no cost */
    status_page_in gw = { .model_name = "g", .now = T0, .started = T0 - 600, .cluster = cluster_block };
    status_page(st, &gw, &b);
    CHECK(strstr(b.p, "data-metric=\"tokenmill_requests_total\"") == NULL);
    CHECK(strstr(b.p, "id=\"cost\"") == NULL && strstr(b.p, "<p id=\"cl\">x</p>") != NULL);
    CHECK(strstr(b.p, "none (RAM only)") != NULL);
    bytebuf_free(&b);
    status_free(st);
}

static const char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/tm-test-status-%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

TEST(test_status_curve)
{
    status_curve c;
    char err[256];
    const char *p = write_tmp("{\"prefill\": [], \"decode\": [{\"streams\": 1, \"tok_s\": 30, \"per_user_tok_s\": 30, \"step_ms\": 33},"
                              " {\"streams\": 4, \"tok_s\": 80, \"per_user_tok_s\": 20, \"step_ms\": 50}]}");
    CHECK(status_curve_load(p, &c, err, sizeof err) == 0 && c.n == 2);
    CHECK(near(status_curve_user_at(&c, 1), 30) && near(status_curve_user_at(&c, 2.5), 25) && near(status_curve_user_at(&c, 9), 20));
    /* the page places the running streams on it */
    status_ring *st = status_new(T0 - 60);
    sched_stats ss = { .n_running = 2 };
    status_page_in in = { .model_name = "m", .now = T0, .started = T0 - 60, .sched = &ss, .curve = &c };
    bytebuf b = { 0 };
    status_page(st, &in, &b);
    CHECK(strstr(b.p, "data-chart=\"decode_curve\"") != NULL);
    CHECK(strstr(b.p, "2 concurrent streams get 26.7 tokens/s each") != NULL);
    bytebuf_free(&b);
    status_free(st);
    /* refused: not JSON, no decode points, streams not increasing */
    p = write_tmp("{");
    CHECK(status_curve_load(p, &c, err, sizeof err) == -1 && strstr(err, "tm-test-status"));
    p = write_tmp("{\"decode\": []}");
    CHECK(status_curve_load(p, &c, err, sizeof err) == -1 && strstr(err, "bench curves"));
    p = write_tmp("{\"decode\": [{\"streams\": 4, \"tok_s\": 1, \"per_user_tok_s\": 1}, {\"streams\": 2, \"tok_s\": 1, \"per_user_tok_s\": 1}]}");
    CHECK(status_curve_load(p, &c, err, sizeof err) == -1 && strstr(err, "increasing"));
    CHECK(status_curve_load("/nonexistent/curves.json", &c, err, sizeof err) == -1);
    unlink(p);
}

TEST(test_status_hits_per_key)
{
    status_ring *st = status_new(T0 - 600);
    status_note(st, T0 - 20, &(status_req){ .key_slot = 1, .n_prompt = 400, .n_cached = 300 });   /* key 0 */
    status_note(st, T0 - 10, &(status_req){ .key_slot = 2, .n_prompt = 100, .n_cached = 0 });     /* key 1 */
    status_note(st, T0 - 5, &(status_req){ .n_prompt = 50, .n_cached = 50 });                     /* no key */
    status_window w;
    status_window_get(st, T0, 5, &w);
    CHECK(w.key_prompt[0] == 400 && w.key_cached[0] == 300 && w.key_prompt[1] == 100 && w.key_cached[1] == 0);
    CHECK(w.n_prompt[0] == 550 && w.n_cached[0] == 350);
    status_page_in in = { .model_name = "m", .now = T0, .started = T0 - 600, .viewer_slot = 2 };
    bytebuf b = { 0 };
    status_page(st, &in, &b);
    /* key 1 sees its own share, and nothing of key 0's */
    CHECK(strstr(b.p, "data-window=\"5\" data-key-cached=\"0\" data-key-prompt=\"100\">0.0 %") != NULL);
    CHECK(strstr(b.p, "data-key-prompt=\"400\"") == NULL);
    bytebuf_free(&b);
    in.viewer_slot = 0;   /* no key: no key row */
    status_page(st, &in, &b);
    CHECK(strstr(b.p, "data-key-prompt") == NULL && strstr(b.p, "your API key") == NULL);
    bytebuf_free(&b);
    status_free(st);
}

int main(void)
{
    RUN(test_status_hits_by_window_and_class);
    RUN(test_status_ttft_by_length_and_quantiles);
    RUN(test_status_utilisation);
    RUN(test_status_ring_recycles_after_a_day);
    RUN(test_status_page);
    RUN(test_status_curve);
    RUN(test_status_hits_per_key);
    HARNESS_END();
}
