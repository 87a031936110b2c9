/*
 * test_tenancy: a request's place in the block cache. The traffic class travels from
 * sched_params through the scheduler to blockio: blocks a request of class agent computes are
 * written with agent's TTL (expiry - last use in the store's listing), a chat request's with
 * chat's, and a load refreshes its hits with its own request's class. And the parsers of the
 * three chat APIs take cache_salt / cache_class as strings and reject other types in the
 * vendor's shape. (Salts keeping tenants apart: test_blockio; API keys and the HTTP fields:
 * tests/e2e/tenancy.test.mjs.)
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "schedtest.h"

#include "cache/store.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "recipe/api.h"

static char tmpdir[] = "/tmp/tm-tenancy-XXXXXX";
static model *g_model;

#define AGENT_TTL 3600.0        /* --retention agent=1h,chat=7d */
#define CHAT_TTL (7 * 86400.0)
static const char *g_retention = "agent=1h,chat=7d";   /* of the next servers */

typedef schedtest_stack server;

static server server_new(const char *spec)
{
    schedtest_stack_opts o = { .spec = spec, .n_kv_blocks = 24, .store = { .retention = g_retention } };
    server v = schedtest_stack_new(g_model, &o);
    CHECK(v.s != NULL && v.bio != NULL);
    return v;
}

/* Greedy generation of n_gen tokens of class cls; returns cached tokens (-1 on failure). */
static int run(server *v, const int32_t *prompt, int n, int n_gen, int cls)
{
    sched_params p = { .prompt = prompt, .n_prompt = n, .max_tokens = n_gen, .cache_class = cls };
    p.sample = sample_params_default();
    p.sample.temp = 0;
    sched_output fin = { .kind = SCHED_OUT_TOKEN };
    int k = schedtest_run(v->s, &p, NULL, 0, &fin);
    return k == n_gen && fin.kind == SCHED_OUT_FINISH ? fin.usage.cached_tokens : -1;
}

typedef struct {
    int n;            /* files listed */
    double ttl[16];   /* expiry - last use of each */
} listing;

static void list_cb(void *arg, int target, const uint8_t key[32], uint64_t bytes, double last_use, double expiry)
{
    listing *l = arg;
    if (l->n < 16) l->ttl[l->n] = expiry - last_use;
    l->n++;
}

static listing list_store(const char *spec)
{
    listing l = { 0 };
    store_opts so = { .read_only = true };
    store *st;
    if (store_open(spec, &so, &st) != STORE_OK) return l;
    store_ls(st, list_cb, &l);
    store_close(st);
    return l;
}

static bool all_near(const listing *l, double ttl)
{
    for (int i = 0; i < l->n && i < 16; i++)
        if (l->ttl[i] < ttl - 60 || l->ttl[i] > ttl + 60) {
            fprintf(stderr, "  block %d: ttl %.0f s, want %.0f s\n", i, l->ttl[i], ttl);
            return false;
        }
    return true;
}

TEST(test_writes_carry_the_request_class)
{
    char spec[160];
    int32_t pa[300], pc[300];
    schedtest_prompt(pa, 300, 5);
    schedtest_prompt(pc, 300, 6);
    /* an agent request alone: its 2 full blocks are written with agent's TTL */
    snprintf(spec, sizeof spec, "dir:%s/agent", tmpdir);
    server v = server_new(spec);
    int agent = store_class(v.st, "agent"), chat = store_class(v.st, "chat");
    CHECK(agent == 1 && chat == 0);
    CHECK(run(&v, pa, 300, 4, agent) == 0);
    schedtest_stack_free(&v);
    listing l = list_store(spec);
    CHECKF(l.n == 2, "%d files", l.n);
    CHECK(all_near(&l, AGENT_TTL));
    /* a chat request alone: chat's TTL */
    snprintf(spec, sizeof spec, "dir:%s/chat", tmpdir);
    v = server_new(spec);
    CHECK(run(&v, pc, 300, 4, chat) == 0);
    schedtest_stack_free(&v);
    l = list_store(spec);
    CHECKF(l.n == 2, "%d files", l.n);
    CHECK(all_near(&l, CHAT_TTL));
    /* both at once on one server: each request's blocks keep its own class */
    snprintf(spec, sizeof spec, "dir:%s/mixed", tmpdir);
    v = server_new(spec);
    sched_params p1 = { .prompt = pa, .n_prompt = 300, .max_tokens = 4, .cache_class = agent }, p2 = p1;
    p1.sample = sample_params_default();
    p2 = p1;
    p2.prompt = pc;
    p2.cache_class = chat;
    sched_req *r1, *r2;
    CHECK(sched_submit(v.s, &p1, &r1) == SCHED_OK && sched_submit(v.s, &p2, &r2) == SCHED_OK);
    sched_output o[16];
    while (!sched_done(r1) || !sched_done(r2)) {
        if (!sched_done(r1) && !sched_poll(r1, o, 16, 10000)) break;
        if (!sched_done(r2) && !sched_poll(r2, o, 16, 10000)) break;
    }
    sched_release(r1);
    sched_release(r2);
    schedtest_stack_free(&v);
    l = list_store(spec);
    CHECKF(l.n == 4, "%d files", l.n);
    int n_agent = 0, n_chat = 0;
    for (int i = 0; i < l.n && i < 16; i++) {
        n_agent += l.ttl[i] > AGENT_TTL - 60 && l.ttl[i] < AGENT_TTL + 60;
        n_chat += l.ttl[i] > CHAT_TTL - 60 && l.ttl[i] < CHAT_TTL + 60;
    }
    CHECKF(n_agent == 2 && n_chat == 2, "agent %d chat %d", n_agent, n_chat);
}

TEST(test_loads_refresh_with_the_request_class)
{
    /* here agent outlives chat (the default), so only a load of class agent keeps the
     * blocks longer than they were written for */
    g_retention = "agent=7d,chat=1h";
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/refresh", tmpdir);
    int32_t pa[300];
    schedtest_prompt(pa, 300, 7);
    server v = server_new(spec);
    int agent = store_class(v.st, "agent");
    CHECK(run(&v, pa, 300, 4, 0) == 0);
    schedtest_stack_free(&v);
    listing l = list_store(spec);
    CHECK(l.n == 2 && all_near(&l, 3600.0));
    /* an agent request of the same prefix on a fresh server (empty RAM tier): a store hit,
     * which keeps the blocks for agent's TTL from now */
    v = server_new(spec);
    CHECK(run(&v, pa, 300, 4, agent) == 256);
    schedtest_stack_free(&v);
    l = list_store(spec);
    CHECK(l.n == 2 && all_near(&l, 7 * 86400.0));
    g_retention = "agent=1h,chat=7d";
}

/* Parses body on kind's route; returns the status (0 accepted) and the error JSON in ej. */
static int parse(api_kind kind, const char *body, api_req *r, json_t **ej)
{
    api_cfg cfg = { 0 };
    api_error e;
    memset(&e, 0, sizeof e);
    api_req_init(r, kind);
    *ej = NULL;
    if (api_parse(&cfg, kind, body, strlen(body), r, &e) == API_OK) return 0;
    bytebuf b = { 0 };
    api_error_json(kind, &e, &b);
    *ej = json_loadb(b.p, b.len, 0, NULL);
    bytebuf_free(&b);
    return e.status;
}

TEST(test_parsers_take_cache_fields)
{
    static const struct {
        api_kind kind;
        const char *fmt;   /* %s: the extra members */
    } routes[] = {
        { API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s}" },
        { API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"hi\"%s}" },
        { API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s}" },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(routes); i++) {
        char body[512];
        api_req r;
        json_t *ej;
        snprintf(body, sizeof body, routes[i].fmt, ",\"cache_salt\":\"tenant-1\",\"cache_class\":\"agent\"");
        CHECKF(parse(routes[i].kind, body, &r, &ej) == 0, "route %zu", i);
        CHECK(r.cache_salt && !strcmp(r.cache_salt, "tenant-1") && r.cache_class && !strcmp(r.cache_class, "agent"));
        api_req_free(&r);
        snprintf(body, sizeof body, routes[i].fmt, ",\"cache_salt\":null");
        CHECK(parse(routes[i].kind, body, &r, &ej) == 0 && !r.cache_salt && !r.cache_class);
        api_req_free(&r);
        const char *bad[] = { ",\"cache_salt\":42", ",\"cache_class\":[\"agent\"]" };
        for (int k = 0; k < 2; k++) {
            snprintf(body, sizeof body, routes[i].fmt, bad[k]);
            CHECKF(parse(routes[i].kind, body, &r, &ej) == 400, "route %zu bad %d", i, k);
            json_t *err = ej ? json_object_get(ej, "error") : NULL;
            const char *msg = err ? json_string_value(json_object_get(err, "message")) : NULL;
            CHECK(msg && strstr(msg, k ? "cache_class" : "cache_salt"));
            if (routes[i].kind == API_KIND_MESSAGES) {
                CHECK(ej && !strcmp(json_string_value(json_object_get(ej, "type")), "error"));
                CHECK(err && !strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error"));
            } else {
                CHECK(err && !strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error"));
                CHECK(err && !strcmp(json_string_value(json_object_get(err, "param")), k ? "cache_class" : "cache_salt"));
            }
            json_decref(ej);
            api_req_free(&r);
        }
    }
}

int main(void)
{
    util_log_level = LOG_LEVEL_ERROR;
    if (!(g_model = schedtest_open(tmpdir, 7))) return 1;
    RUN(test_writes_carry_the_request_class);
    RUN(test_loads_refresh_with_the_request_class);
    RUN(test_parsers_take_cache_fields);
    schedtest_close(tmpdir, g_model);
    HARNESS_END();
}
