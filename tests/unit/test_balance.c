/*
 * test_balance: the gateway's prefill and decode balancers and the capacity rule
 * (cluster/balance.h), on hand-made load figures.
 */
#include "cluster/balance.h"
#include "harness.h"

TEST(test_buckets)
{
    CHECK(bal_bucket(1) == 0);
    CHECK(bal_bucket(16384) == 0);
    CHECK(bal_bucket(16385) == 1);
    CHECK(bal_bucket(65536) == 1);
    CHECK(bal_bucket(262144) == 2);
    CHECK(bal_bucket(262145) == 3);
    CHECK(bal_bucket(10000000) == 3);
}

TEST(test_cost_model)
{
    bal_cost c = { .linear_s = 1e-4, .attn_s = 1e-8, .step_budget_s = 0.1 };
    CHECK(bal_prefill_cost(&c, 0, 100) == 0);
    /* 1000 new tokens after 0: 1000 * (1e-4 + 1e-8 * 500) */
    CHECK(fabs(bal_prefill_cost(&c, 1000, 0) - 1000 * (1e-4 + 1e-8 * 500)) < 1e-12);
    /* the same new tokens after a long cached prefix cost more (attention over it) */
    CHECK(bal_prefill_cost(&c, 1000, 100000) > bal_prefill_cost(&c, 1000, 0));
    /* chunks shrink with the bucket: long prompts fit fewer tokens in a step */
    int64_t c0 = bal_chunk_tokens(&c, 1000), c1 = bal_chunk_tokens(&c, 50000), c3 = bal_chunk_tokens(&c, 1000000);
    CHECK(c0 > c1 && c1 > c3 && c3 >= 1);
    CHECK(c0 == (int64_t)(0.1 / (1e-4 + 1e-8 * 16384)));
}

TEST(test_prefill_earliest_finish)
{
    bal_cost c = { .linear_s = 1e-4, .attn_s = 0, .step_budget_s = 0.01 };
    bal_prefill_worker w[3] = {
        { .up = true, .queued_s = 2.0, .n_queued = 3 },
        { .up = true, .queued_s = 0.5, .n_queued = 5 },
        { .up = false, .queued_s = 0, .n_queued = 0 },   /* down: never chosen */
    };
    bal_prefill_choice ch = bal_prefill_pick(&c, w, 3, 1000, 0);
    CHECK(ch.worker == 1);
    CHECK(ch.bucket == 0);
    CHECK(ch.steps == 10);                                 /* 100 tokens per step */
    CHECK(fabs(ch.finish_s - (0.5 + 0.1)) < 1e-9);
    /* a twice-as-fast worker with more queued work can still finish first */
    w[0].speed = 4;                                        /* (2.0 + 0.1) / 4 = 0.525 */
    ch = bal_prefill_pick(&c, w, 3, 1000, 0);
    CHECK(ch.worker == 0);
    /* cached tokens are not work: a fully cached prompt still computes one token */
    ch = bal_prefill_pick(&c, w, 3, 1000, 1000);
    CHECK(ch.steps == 1);
    /* a one-step prompt adds its cost, not a step budget: 50 tokens = 0.005 s */
    ch = bal_prefill_pick(&c, w, 3, 50, 0);
    CHECK(ch.steps == 1 && ch.worker == 0 && fabs(ch.finish_s - (2.0 + 0.005) / 4) < 1e-9);
    /* short prompts spread in proportion to speed: worker 0 four times as fast, equal queues:
     * it takes about four of every five */
    {
        bal_prefill_worker p2[2] = { { .up = true, .speed = 4 }, { .up = true, .speed = 1 } };
        int n0 = 0;
        for (int i = 0; i < 100; i++) {
            bal_prefill_choice k = bal_prefill_pick(&c, p2, 2, 50, 0);
            p2[k.worker].queued_s += k.cost_s;
            p2[k.worker].n_queued++;
            n0 += k.worker == 0;
        }
        CHECKF(n0 >= 78 && n0 <= 82, "%d of 100 to the 4x worker", n0);
    }
    /* ties: fewer queued jobs */
    bal_prefill_worker t[2] = { { .up = true, .queued_s = 1, .n_queued = 4 }, { .up = true, .queued_s = 1, .n_queued = 2 } };
    CHECK(bal_prefill_pick(&c, t, 2, 10, 0).worker == 1);
    /* nobody up */
    bal_prefill_worker d[1] = { { .up = false } };
    CHECK(bal_prefill_pick(&c, d, 1, 10, 0).worker == -1);
}

TEST(test_speed_learned_from_reports)
{
    bal_speed s;
    bal_speed_init(&s, 20000);
    CHECK(s.tokens_per_s == 20000 && s.n_samples == 0);
    /* too few tokens: no sample, the base stays at zero */
    CHECK(!bal_speed_report(&s, BAL_SPEED_MIN_TOKENS - 1, 100000));
    CHECK(s.tokens_per_s == 20000 && s.n_samples == 0);
    /* the first report with enough tokens (lifetime counters: 1000 tokens in 0.5 s of engine
     * time, a worker that served before this connection) replaces the default */
    CHECK(bal_speed_report(&s, 1000, 500000));
    CHECK(fabs(s.tokens_per_s - 2000) < 1e-6 && s.n_samples == 1);
    /* too few tokens since the base: no sample, the base stays */
    CHECK(!bal_speed_report(&s, 1000 + BAL_SPEED_MIN_TOKENS - 1, 600000));
    /* 2000 tokens in 0.2 s: 10000 tok/s, averaged in with weight BAL_SPEED_ALPHA */
    CHECK(bal_speed_report(&s, 3000, 700000));
    CHECK(fabs(s.tokens_per_s - (2000 + BAL_SPEED_ALPHA * (10000 - 2000))) < 1e-6 && s.n_samples == 2);
    double prev = s.tokens_per_s;
    /* idle heartbeats (no new tokens, no busy time) change nothing */
    CHECK(!bal_speed_report(&s, 3000, 700000));
    CHECK(!bal_speed_report(&s, 3000, 700000));
    /* then 4000 tok/s */
    CHECK(bal_speed_report(&s, 3400, 800000));
    CHECK(fabs(s.tokens_per_s - (prev + BAL_SPEED_ALPHA * (4000 - prev))) < 1e-6);
    /* a restarted worker (counters below the base): a new base, the estimate stays */
    double before = s.tokens_per_s;
    CHECK(!bal_speed_report(&s, 10, 10));
    CHECK(s.tokens_per_s == before);
    CHECK(bal_speed_report(&s, 10 + 500, 10 + 100000));   /* 5000 tok/s */
    CHECK(fabs(s.tokens_per_s - (before + BAL_SPEED_ALPHA * (5000 - before))) < 1e-6);
    /* relative speed against the cost model */
    bal_cost c = { .linear_s = 1e-4, .attn_s = 0, .step_budget_s = 0.01 };
    bal_speed d;
    bal_speed_init(&d, 10000);
    CHECK(fabs(bal_speed_rel(&d, &c) - 1.0) < 1e-9);
}

TEST(test_prefill_pick_uses_learned_speed)
{
    /* two prefill workers with the same queued work; synthetic heartbeats show worker 1
     * computing four times as many prefill tokens per engine second: it gets the next prompt,
     * and keeps getting them until its queue is about four times worker 0's */
    bal_cost c = { .linear_s = 1e-4, .attn_s = 0, .step_budget_s = 0.01 };
    bal_speed s[2];
    bal_speed_init(&s[0], 10000);
    bal_speed_init(&s[1], 10000);
    bal_prefill_worker w[2] = { { .up = true, .queued_s = 0.5, .n_queued = 1 }, { .up = true, .queued_s = 0.5, .n_queued = 1 } };
    /* before any report both run at the default: a tie, fewer jobs, then the lower index */
    for (int i = 0; i < 2; i++) w[i].speed = bal_speed_rel(&s[i], &c);
    CHECK(bal_prefill_pick(&c, w, 2, 1000, 0).worker == 0);
    /* reports every 500 ms: worker 0 computes 1000 tokens per 0.4 s busy (2500 tok/s),
     * worker 1 4000 per 0.4 s (10000 tok/s) */
    uint64_t tok[2] = { 0, 0 }, busy[2] = { 0, 0 };
    for (int hb = 0; hb < 10; hb++)
        for (int i = 0; i < 2; i++) {
            bal_speed_report(&s[i], tok[i], busy[i]);
            tok[i] += i ? 4000 : 1000;
            busy[i] += 400000;
        }
    CHECK(fabs(s[0].tokens_per_s - 2500) < 1 && fabs(s[1].tokens_per_s - 10000) < 1);
    for (int i = 0; i < 2; i++) w[i].speed = bal_speed_rel(&s[i], &c);
    CHECK(fabs(w[0].speed - 0.25) < 1e-6 && fabs(w[1].speed - 1.0) < 1e-6);
    bal_prefill_choice ch = bal_prefill_pick(&c, w, 2, 1000, 0);
    CHECK(ch.worker == 1);
    CHECK(fabs(ch.finish_s - (0.5 + 0.1) / 1.0) < 1e-9);
    /* the faster worker's queue grows: at 2.0 s queued it finishes at 2.1, worker 0 at
     * (0.5 + 0.1) / 0.25 = 2.4: still worker 1; at 2.5 s queued (2.6 > 2.4): worker 0 */
    w[1].queued_s = 2.0;
    CHECK(bal_prefill_pick(&c, w, 2, 1000, 0).worker == 1);
    w[1].queued_s = 2.5;
    CHECK(bal_prefill_pick(&c, w, 2, 1000, 0).worker == 0);
    /* the slow one speeds up (its later reports: 10000 tok/s): the average moves toward it and
     * it wins again once it is faster than the loaded worker 1 */
    for (int hb = 0; hb < 20; hb++) {
        tok[0] += 4000;
        busy[0] += 400000;
        bal_speed_report(&s[0], tok[0], busy[0]);
    }
    CHECK(s[0].tokens_per_s > 9900);
    w[0].speed = bal_speed_rel(&s[0], &c);
    w[1].queued_s = 0.6;
    CHECK(bal_prefill_pick(&c, w, 2, 1000, 0).worker == 0);   /* 0.6 < 0.7 */
}

TEST(test_prefill_shares_in_flight)
{
    bal_cost c = { .linear_s = 1e-4, .attn_s = 1e-8, .step_budget_s = 0.1 };
    /* equal workers, worker 1 computing 1024 of this 1100-token prompt: it goes there (by
     * index it would go to 0), and its cost there is that of its own 76 tokens */
    bal_prefill_worker w[2] = {
        { .up = true, .queued_s = 0.1, .n_queued = 1 },
        { .up = true, .queued_s = 0.1, .n_queued = 1, .inflight_tokens = 1024 },
    };
    bal_prefill_choice ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 1 && ch.shared_tokens == 1024);
    CHECK(fabs(ch.cost_s - bal_prefill_cost(&c, 76, 1024)) < 1e-12);
    CHECK(ch.cost_s < bal_prefill_cost(&c, 1100, 0));
    /* the same without the pending prefix: the lower index */
    w[1].inflight_tokens = 0;
    ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 0 && ch.shared_tokens == 0);
    CHECK(fabs(ch.cost_s - bal_prefill_cost(&c, 1100, 0)) < 1e-12);
    /* the worker computing the prefix has it in its queue (0.11 s): an idle one finishes
     * first, but going there adds less time (~2 ms) than it saves (~108 ms): worker 1 */
    w[1].inflight_tokens = 1024;
    w[0].queued_s = 0;
    w[1].queued_s = 0.11;
    ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 1 && ch.shared_tokens == 1024);
    CHECK(ch.finish_s > bal_prefill_cost(&c, 1100, 0));   /* later than on the idle one */
    w[0].queued_s = 0.1;
    /* sharing saves ~0.1 s; a queue 1 s longer there costs more than that: elsewhere */
    w[1].queued_s = 1.1;
    ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 0 && ch.shared_tokens == 0);
    /* a queue longer by less than the saving: still the sharing worker */
    w[1].queued_s = 0.15;
    ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 1 && ch.shared_tokens == 1024);
    /* with a much slower worker (10x), the time it adds is more than it saves: elsewhere */
    w[1].queued_s = 0.1;
    w[1].speed = 0.1;
    ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 0);
    /* the whole prompt in flight there: the last token is still computed (its logits) */
    w[1].speed = 1;
    w[1].inflight_tokens = 5000;
    ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 1 && ch.shared_tokens == 1099 && ch.steps == 1);
    /* stored prefix: in-flight tokens count past it (the gateway passes them so) */
    w[1].inflight_tokens = 512;
    ch = bal_prefill_pick(&c, w, 2, 1100, 256);
    CHECK(ch.worker == 1 && ch.shared_tokens == 512);
    CHECK(fabs(ch.cost_s - bal_prefill_cost(&c, 1100 - 256 - 512, 256 + 512)) < 1e-12);
    /* a worker that is down is never chosen, shared prefix or not */
    w[1].up = false;
    ch = bal_prefill_pick(&c, w, 2, 1100, 0);
    CHECK(ch.worker == 0 && ch.shared_tokens == 0);
}

TEST(test_prefill_uses_learned_curve)
{
    bal_cost c = { .linear_s = 1e-4, .attn_s = 0, .step_budget_s = 1 };
    /* the curve: 10 ms a step, 1 ms per prefill token, 2 ms per 1024 positions attended */
    double cv[4] = { 0.01, 0.0005, 0.001, 0.002 };
    /* 1000 tokens after 24 cached in steps of 400: 3 steps, depth 1000 * (24 + 500) */
    double want = 3 * 0.01 + 1000 * 0.001 + 0.002 * 1000.0 * 524 / 1024;
    CHECK(fabs(bal_curve_prefill_s(cv, 1000, 24, 400) - want) < 1e-12);
    CHECK(bal_curve_prefill_s(cv, 0, 24, 400) == 0);
    /* equal queues and no learned speed: by the cost model worker 0 (the lower index); its
     * curve says it takes ~2 s where the model gives 0.1 s: worker 1 */
    bal_prefill_worker w[2] = {
        { .up = true, .has_curve = true, .curve = { 0.01, 0.0005, 0.001, 0.002 } },
        { .up = true },
    };
    bal_prefill_choice ch = bal_prefill_pick(&c, w, 2, 1024, 24);
    CHECK(ch.worker == 1);
    /* a fast curve (10 us a token) beats the model's 100 us: worker 0, its cost in its seconds */
    double fast[4] = { 0.001, 0, 1e-5, 0 };
    for (int k = 0; k < 4; k++) w[0].curve[k] = fast[k];
    ch = bal_prefill_pick(&c, w, 2, 1024, 24);
    CHECK(ch.worker == 0);
    CHECK(fabs(ch.cost_s - bal_curve_prefill_s(fast, 1000, 24, bal_chunk_tokens(&c, 1024))) < 1e-12);
    /* its queue is in the same seconds: 0.2 s queued there, nothing on worker 1 -> worker 1 */
    w[0].queued_s = 0.2;
    ch = bal_prefill_pick(&c, w, 2, 1024, 24);
    CHECK(ch.worker == 1);
    /* a curve that gives no positive time is not used: the model, the lower index */
    w[0].queued_s = 0;
    double bad[4] = { -1, 0, 0, 0 };
    for (int k = 0; k < 4; k++) w[0].curve[k] = bad[k];
    ch = bal_prefill_pick(&c, w, 2, 1024, 24);
    CHECK(ch.worker == 0 && fabs(ch.cost_s - bal_prefill_cost(&c, 1000, 24)) < 1e-12);
}

TEST(test_decode_short_and_long)
{
    /* worker 0: few requests, long total cache; worker 1: many short requests */
    bal_decode_worker w[2] = {
        { .up = true, .n_running = 2, .sum_ctx = 40000, .max_running = 64 },
        { .up = true, .n_running = 10, .sum_ctx = 5000, .max_running = 64 },
    };
    /* mean length per request = 45000 / 12 = 3750 */
    bal_decode_choice s = bal_decode_pick(w, 2, 200, 4096);
    CHECK(!s.is_long && s.worker == 0);          /* short -> few requests */
    CHECK(s.mean_len == 3750);
    bal_decode_choice l = bal_decode_pick(w, 2, 20000, 4096);
    CHECK(l.is_long && l.worker == 1);           /* long -> short total cache */
    /* short, equal counts: the longer total cache */
    bal_decode_worker e[2] = { { .up = true, .n_running = 3, .sum_ctx = 100 }, { .up = true, .n_running = 3, .sum_ctx = 900 } };
    CHECK(bal_decode_pick(e, 2, 10, 4096).worker == 1);
    /* a full worker is skipped while another has room */
    w[0].n_running = 64;
    CHECK(bal_decode_pick(w, 2, 200, 4096).worker == 1);
    /* all full: still placed */
    w[1].n_running = 64;
    CHECK(bal_decode_pick(w, 2, 200, 4096).worker >= 0);
    /* nothing running: long_tokens is the threshold */
    bal_decode_worker z[2] = { { .up = true }, { .up = false } };
    bal_decode_choice zc = bal_decode_pick(z, 2, 5000, 4096);
    CHECK(zc.is_long && zc.worker == 0 && zc.mean_len == 4096);
    bal_decode_worker none[1] = { { .up = false } };
    CHECK(bal_decode_pick(none, 1, 10, 4096).worker == -1);
}

TEST(test_capacity_rule)
{
    /* prefill: 3000 tokens/s at 1000 per worker aimed at 0.6 -> 5 workers */
    bal_capacity_in in = { .n_current = 2, .load = 3000, .per_worker = 1000, .target_util = 0.6, .min_workers = 1,
                           .max_workers = 8 };
    bal_capacity_out o = bal_capacity(&in);
    CHECK(o.recommended == 5);
    CHECK(fabs(o.utilisation - 1.5) < 1e-9);
    /* upper limit */
    in.max_workers = 3;
    CHECK(bal_capacity(&in).recommended == 3);
    /* idle: the lower limit */
    in = (bal_capacity_in){ .n_current = 4, .load = 0, .per_worker = 1000, .target_util = 0.6, .min_workers = 1, .max_workers = 8 };
    o = bal_capacity(&in);
    CHECK(o.recommended == 1 && !o.held && o.utilisation == 0);
    /* would shrink but utilisation is above 0.8: held at the current count */
    in = (bal_capacity_in){ .n_current = 4, .load = 34, .per_worker = 10, .target_util = 0.3, .min_workers = 1, .max_workers = 20 };
    o = bal_capacity(&in); /* 34 / 40 = 0.85 > 0.8; target 0.3 wants 12: grows, not held */
    CHECK(o.recommended == 12 && !o.held);
    in.target_util = 0.95; /* wants ceil(34 / 9.5) = 4: equal, fine */
    CHECK(bal_capacity(&in).recommended == 4);
    in.n_current = 5;      /* 34 / 50 = 0.68: may shrink to 4 */
    o = bal_capacity(&in);
    CHECK(o.recommended == 4 && !o.held);
    in.load = 41;          /* 41 / 50 = 0.82 > 0.8: wants ceil(41/9.5) = 5 = current */
    CHECK(bal_capacity(&in).recommended == 5);
    in.target_util = 1.0;  /* wants ceil(41 / 10) = 5 */
    in.load = 45; in.n_current = 6; in.per_worker = 10; /* 45/60 = 0.75: may shrink to 5 */
    o = bal_capacity(&in);
    CHECK(o.recommended == 5 && !o.held);
    in.load = 49; in.n_current = 6; in.min_workers = 1; /* 49/60 = 0.817: wants 5, held at 6 */
    o = bal_capacity(&in);
    CHECK(o.recommended == 6 && o.held);
    /* no worker at all but load: recommend at least one */
    in = (bal_capacity_in){ .n_current = 0, .load = 5, .per_worker = 10, .target_util = 0.6, .min_workers = 0, .max_workers = 4 };
    CHECK(bal_capacity(&in).recommended == 1);
}

int main(void)
{
    RUN(test_buckets);
    RUN(test_cost_model);
    RUN(test_prefill_earliest_finish);
    RUN(test_speed_learned_from_reports);
    RUN(test_prefill_pick_uses_learned_speed);
    RUN(test_prefill_shares_in_flight);
    RUN(test_prefill_uses_learned_curve);
    RUN(test_decode_short_and_long);
    RUN(test_capacity_rule);
    HARNESS_END();
}
