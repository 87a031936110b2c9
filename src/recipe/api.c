/*
 * api: serving the API routes (see SERVING in api.h): the vendors' error responses, the API
 * key check, tenancy, the backend calls and submit-error mapping, the model names, and the
 * request path every generating route runs (api_serve: parse, prompt, context check,
 * submit, then the stream or the body), with its job, pump and pull. Reading requests is
 * api_json.c (tool-call grammars api_tools.c), writing answers api_out.c, and each API's
 * parser and formatter its api_format in its own file.
 */
#include "recipe/api.h"
#include "recipe/api_compile.h"
#include "recipe/api_int.h"

#include <jansson.h>
#include <limits.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/status.h"
#include "recipe/tokenizer.h"
#include "util/unicode.h"
#include "util/sha256.h"
#include "util/util.h"

/* ------------------------------------------------------------------ serving helpers (api_completions.c too) */
void api_respond_buf(http_request *r, int status, const bytebuf *b)
{
    http_respond(r, status, "application/json", b->p ? b->p : "", b->len);
}

static void api_error_respond(http_request *r, int status, bool anthropic, const char *type, const char *message,
                              const char *param, const char *code)
{
    bytebuf b = {0};
    api_error_body(&b, anthropic, type, message, param, code);
    api_respond_buf(r, status, &b);
    bytebuf_free(&b);
}

void api_openai_error(http_request *r, int status, const char *type, const char *message,
                      const char *param, const char *code)
{
    api_error_respond(r, status, false, type, message, param, code);
}

void api_anthropic_error(http_request *r, int status, const char *type, const char *message)
{
    api_error_respond(r, status, true, type, message, NULL, NULL);
}

/* A missing key and a wrong one get different messages (as the vendors' own APIs do), and
 * the types their SDKs map to an authentication error. */
bool api_openai_auth(http_request *r)
{
    http_auth a = http_request_auth(r);
    if (a == HTTP_AUTH_OK) return true;
    if (a == HTTP_AUTH_MISSING)
        api_openai_error(r, 401, "invalid_request_error",
                         "You didn't provide an API key. Send it as \"Authorization: Bearer KEY\" (or \"x-api-key: KEY\").",
                         NULL, NULL);
    else
        api_openai_error(r, 401, "invalid_request_error", "Incorrect API key provided.", NULL, "invalid_api_key");
    return false;
}

bool api_anthropic_auth(http_request *r)
{
    http_auth a = http_request_auth(r);
    if (a == HTTP_AUTH_OK) return true;
    api_anthropic_error(r, 401, "authentication_error",
                        a == HTTP_AUTH_MISSING ? "x-api-key header is required" : "invalid x-api-key");
    return false;
}

bool api_tenancy_of(http_request *r, const api_ctx *c, const char *cache_salt, const char *cache_class,
                    api_tenancy *t, api_error *e)
{
    gc_retention def;
    const gc_retention *ret = c->retention;
    if (!ret) {
        gc_retention_default(&def);
        ret = &def;
    }
    const char *param = "cache_class";
    if (!cache_class || !*cache_class) {
        cache_class = http_request_header(r, "x-cache-class");
        param = "x-cache-class";
    }
    t->cls = 0;
    if (cache_class && *cache_class) {
        t->cls = -1;
        for (int i = 0; i < ret->n; i++)
            if (!strcmp(ret->name[i], cache_class)) t->cls = i;
        if (t->cls < 0) {
            char names[GC_MAX_CLASSES * 24] = "";
            size_t n = 0;
            for (int i = 0; i < ret->n && n < sizeof names; i++)
                n += (size_t)snprintf(names + n, sizeof names - n, "%s'%s'", i ? ", " : "", ret->name[i]);
            api_error_set(e, 400, param, "invalid_value", "Invalid value for '%s': '%.64s'. Supported values are: %s.",
                          param, cache_class, names);
            return false;
        }
    }
    /* salt = SHA-256("tokenmill-tenant" 0, key ? 1 SHA-256("tokenmill-api-key" 0 key) : 0, cache_salt):
     * the key's identity has a fixed length, so no cache_salt can pose as another tenant's */
    const char *key = http_request_api_key(r);
    t->salt[0] = 0;
    if (!key && (!cache_salt || !*cache_salt)) return true;
    uint8_t id[32], h[32];
    if (key) {
        sha256_part kp[] = { { "tokenmill-api-key", 18 }, { key, strlen(key) } };
        sha256_parts(kp, 2, id);
    }
    sha256_part parts[] = { { "tokenmill-tenant", 17 }, { key ? "\1" : "\0", 1 }, { id, key ? 32 : 0 },
                            { cache_salt ? cache_salt : "", cache_salt ? strlen(cache_salt) : 0 } };
    sha256_parts(parts, 4, h);
    util_hex(h, 32, t->salt);
    return true;
}

int api_ctx_n_vocab(const api_ctx *c)
{
    int n = tokenizer_n_vocab(c->tok);
    return c->model && c->model->hp.n_vocab < n ? c->model->hp.n_vocab : n;
}

int api_ctx_max_input(const api_ctx *c)
{
    int n = c->n_ctx - 1, be = c->backend && c->backend->max_input ? c->backend->max_input(c->backend->ud) : 0;
    return be > 0 && be < n ? be : n;
}

sched_status api_be_submit(const api_ctx *c, const sched_params *p, sched_req **out)
{
    return c->backend ? c->backend->submit(c->backend->ud, p, out) : sched_submit(c->sched, p, out);
}

int api_be_poll(const api_ctx *c, sched_req *r, sched_output *out, int max, int timeout_ms)
{
    return c->backend ? c->backend->poll(c->backend->ud, r, out, max, timeout_ms) : sched_poll(r, out, max, timeout_ms);
}

void api_be_cancel(const api_ctx *c, sched_req *r)
{
    if (c->backend) c->backend->cancel(c->backend->ud, r);
    else sched_cancel(r);
}

void api_be_release(const api_ctx *c, sched_req *r)
{
    if (c->backend) c->backend->release(c->backend->ud, r);
    else sched_release(r);
}

bool api_be_done(const api_ctx *c, sched_req *r)
{
    return c->backend ? !c->backend->done || c->backend->done(c->backend->ud, r) : sched_done(r);
}

const float *api_be_embedding(const api_ctx *c, sched_req *r)
{
    return c->backend ? (c->backend->embedding ? c->backend->embedding(c->backend->ud, r) : NULL) : sched_embedding(r);
}

static void api_submit_message(char *buf, size_t sz, const api_ctx *c, sched_status st, int n_prompt, int max_tokens)
{
    switch (st) {
    case SCHED_ERR_TOO_LONG:
        if (max_tokens > 0)
            snprintf(buf, sz, "This model's maximum context length is %d tokens. However, you requested %d tokens "
                     "(%d in the prompt, %d for the completion). Please reduce the prompt.",
                     c->n_ctx, n_prompt + max_tokens, n_prompt, max_tokens);
        else
            snprintf(buf, sz, "This model's maximum context length is %d tokens. However, your prompt has %d tokens. "
                     "Please reduce the prompt.", c->n_ctx, n_prompt);
        break;
    case SCHED_ERR_QUEUE_FULL: snprintf(buf, sz, "The server is overloaded: too many queued requests. Retry later."); break;
    case SCHED_ERR_STOPPED:
        snprintf(buf, sz, c->backend ? "No worker is available to serve the request. Retry later." : "The server is shutting down.");
        break;
    case SCHED_ERR_ARG: snprintf(buf, sz, "Invalid prompt (empty, or a token id outside the vocabulary)."); break;
    default: snprintf(buf, sz, "Internal error: %s.", sched_status_name(st)); break;
    }
}

/* A 503 asks the client to come back (to another replica, behind a load balancer). */
static void api_retry_after(http_request *r) { http_add_header(r, "Retry-After", HTTP_RETRY_AFTER); }

void api_openai_submit_error(http_request *r, const api_ctx *c, sched_status st, int n_prompt, int max_tokens,
                             const char *prompt_param)
{
    char msg[400];
    api_submit_message(msg, sizeof msg, c, st, n_prompt, max_tokens);
    if (st == SCHED_ERR_STOPPED) api_retry_after(r);
    switch (st) {
    case SCHED_ERR_TOO_LONG: api_openai_error(r, 400, "invalid_request_error", msg, prompt_param, "context_length_exceeded"); break;
    case SCHED_ERR_ARG: api_openai_error(r, 400, "invalid_request_error", msg, "prompt", NULL); break;
    case SCHED_ERR_QUEUE_FULL: api_openai_error(r, 429, "rate_limit_error", msg, NULL, "rate_limit_exceeded"); break;
    case SCHED_ERR_STOPPED: api_openai_error(r, 503, "server_error", msg, NULL, NULL); break;
    default: api_openai_error(r, 500, "server_error", msg, NULL, NULL); break;
    }
}

void api_anthropic_submit_error(http_request *r, const api_ctx *c, sched_status st, int n_prompt, int max_tokens)
{
    char msg[400];
    api_submit_message(msg, sizeof msg, c, st, n_prompt, max_tokens);
    if (st == SCHED_ERR_STOPPED) api_retry_after(r);
    switch (st) {
    case SCHED_ERR_TOO_LONG:
    case SCHED_ERR_ARG: api_anthropic_error(r, 400, "invalid_request_error", msg); break;
    case SCHED_ERR_QUEUE_FULL: api_anthropic_error(r, 529, "overloaded_error", msg); break;
    case SCHED_ERR_STOPPED: api_anthropic_error(r, 503, "overloaded_error", msg); break;
    default: api_anthropic_error(r, 500, "api_error", msg); break;
    }
}

bool api_model_ok(const api_ctx *c, const char *name)
{
    if (!name || !*name) return true;
    if (c->model_name && !strcmp(name, c->model_name)) return true;
    if (c->model_alias && !strcmp(name, c->model_alias)) return true;
    return false;
}

const api_ctx *api_ctx_route(const api_ctx *c, const char *name)
{
    if (c->n_all < 2) return api_model_ok(c, name) ? c : NULL;
    if (!name || !*name) return c->all[0];
    for (int i = 0; i < c->n_all; i++)
        if (c->all[i]->model_name && !strcmp(name, c->all[i]->model_name)) return c->all[i];
    for (int i = 0; i < c->n_all; i++)   /* two files of one general.name: the first answers to it */
        if (c->all[i]->model_alias && !strcmp(name, c->all[i]->model_alias)) return c->all[i];
    return NULL;
}

const api_ctx *api_ctx_of_body(const api_ctx *c, const char *body, size_t len)
{
    if (c->n_all < 2) return c;
    /* bounded first, as api_json_load: the peek must not recurse into a hostile body */
    if (jsonfmt_scan(body, len, JSONFMT_MAX_DEPTH, JSONFMT_MAX_VALUES, NULL, NULL) != JSONFMT_SCAN_OK) return c;
    json_t *root = json_loadb(body, len, 0, NULL);
    const api_ctx *to = NULL;
    if (json_is_object(root)) {
        json_t *m = json_object_get(root, "model");
        if (json_is_string(m)) to = api_ctx_route(c, json_string_value(m));
        else if (!m || json_is_null(m)) to = c->all[0];
    }
    json_decref(root);
    return to ? to : c;
}

void api_detok(tokenizer_stream *ts, int32_t token, bytebuf *scratch, bytebuf *out)
{
    scratch->len = 0;
    size_t cap = tokenizer_max_piece(ts->tok) + 4;  /* always enough (tokenizer.h) */
    bytebuf_reserve(scratch, cap);
    size_t n = token < 0 ? tokenizer_stream_flush(ts, scratch->p, cap) : tokenizer_stream_push(ts, token, scratch->p, cap);
    out->len = 0;
    bytebuf_reserve(out, 3 * n);
    out->len = unicode_utf8_repair(scratch->p, n, out->p);
    out->p[out->len] = 0;
}

char *api_model_default_name(const char *path)
{
    const char *base = strrchr(path, '/');
    char *name = xstrdup(base ? base + 1 : path);
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, ".gguf")) name[n - 5] = 0;
    return name;
}

const char *api_model_alias(const model *m, char *buf, size_t cap)
{
    const char *alias = NULL;
    size_t len = 0;
    if (!gguf_get_str(m->g, "general.name", &alias, &len) || len >= cap) return NULL;
    memcpy(buf, alias, len);
    buf[len] = 0;
    return buf;
}

void api_new_id(char *out, size_t sz, const char *prefix)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static util_rng rng;
    static bool seeded;
    pthread_mutex_lock(&mu);
    if (!seeded) {
        util_rng_seed(&rng, (uint64_t)(util_now() * 1e9) ^ (uint64_t)(uintptr_t)&rng);
        seeded = true;
    }
    uint64_t a = util_rng_next(&rng), b = util_rng_next(&rng);
    pthread_mutex_unlock(&mu);
    snprintf(out, sz, "%s%016llx%08llx", prefix, (unsigned long long)a, (unsigned long long)(b & 0xffffffffu));
}

/* ------------------------------------------------------------------ serving */

#include "recipe/template.h"
#include "recipe/tokenizer.h"

/* End-of-generation ids of a vocabulary (every request stops on them), found once per
 * tokenizer: a server of several models has several vocabularies. */
#define API_EOG_TOKENIZERS 16
typedef struct {
    const tokenizer *tok;               /* whose ids these are (NULL: a free entry) */
    int n;                              /* ids in ids */
    int32_t ids[SCHED_MAX_STOP_IDS];
} api_eog;
static api_eog api_eogs[API_EOG_TOKENIZERS];
static pthread_mutex_t api_eog_mu = PTHREAD_MUTEX_INITIALIZER;

/* The entry of tok (stable: entries are written once and never moved). Past the table's
 * size (more tokenizers than a server serves models) the last entry is recomputed. */
static const api_eog *api_find_eog(const tokenizer *tok)
{
    pthread_mutex_lock(&api_eog_mu);
    int i = 0;
    while (i < API_EOG_TOKENIZERS - 1 && api_eogs[i].tok && api_eogs[i].tok != tok) i++;
    api_eog *g = &api_eogs[i];
    if (g->tok != tok) {
        int n = 0;
        int32_t nv = tokenizer_n_vocab(tok);
        for (int32_t id = 0; id < nv && n < SCHED_MAX_STOP_IDS; id++)
            if (tokenizer_is_eog(tok, id)) g->ids[n++] = id;
        g->n = n;
        g->tok = tok;
    }
    pthread_mutex_unlock(&api_eog_mu);
    return g;
}

typedef struct {
    const api_ctx *c;
    const api_eog *eog;                 /* the vocabulary's end-of-generation ids */
    api_kind kind;
    api_req req;                        /* the parsed request */
    api_out out;                        /* its output state */
    template_prompt prompt;             /* rendered prompt ids */
    sched_req *sreq[API_MAX_N];         /* one scheduler request per choice (NULL: released) */
    tokenizer_stream ts[API_MAX_N];     /* detokenizer per choice */
    bool fin[API_MAX_N];                /* FINISH seen */
    int n;                              /* choices submitted */
    bool error;                         /* the engine failed a request */
    bool refused;                       /* a remote backend refused its arguments (400) */
    bool unavailable;                   /* a cluster gateway had no worker to go on with it (503) */
    bool aborted;                       /* Messages: the server stopped a choice (sched_abort) */
    bool ended;                         /* the closing events / body were written */
    bool begun;                         /* streaming: the opening events were written */
    int cls;                            /* traffic class (for the status page's note) */
    int key_slot;                       /* 1 + index of the API key it carried, 0: none */
    double t_submit;                    /* util_now() at submission, seconds */
    bytebuf raw;                    /* scratch: one token's bytes from the detokenizer */
    bytebuf text;                   /* one token's text as the client gets it (api_detok) */
    grammar *g;                         /* the answer's format (compiled), or NULL */
    int g_kind;                         /* its source, for a backend in another process */
    const char *g_src;                  /* (g_len) req.fmt_src or g_tool */
    size_t g_len;
    char *g_tool;                       /* the calls' grammar text (owned), or NULL */
    int32_t g_trigger;                  /* g binds only what follows this token (strict tools
                                         * under auto); -1: g binds the whole answer */
} api_job;

static void api_job_free(api_job *j)
{
    for (int i = 0; i < j->n; i++)
        if (j->sreq[i]) api_be_release(j->c, j->sreq[i]);
    api_out_free(&j->out);
    bytebuf_free(&j->raw);
    bytebuf_free(&j->text);
    template_prompt_free(&j->prompt);
    grammar_free(j->g);
    free(j->g_tool);
    api_req_free(&j->req);
    free(j);
}

static size_t api_job_piece(void *ud, int32_t token, char *buf, size_t cap)
{
    api_job *j = ud;
    int n = tokenizer_token_to_piece(j->c->tok, token, buf, (int)cap, true);
    return n < 0 || (size_t)n > cap ? 0 : (size_t)n;
}

/* One finished choice into the status page's ring: its usage, time to first token and the
 * user's decode speed (tokens after the first over the time after it). */
static void api_job_note(const api_job *j, const sched_output *so)
{
    int n_gen = so->usage.completion_tokens;
    double decode_s = util_now() - j->t_submit - so->ttft_s;
    status_req rq = { .cls = j->cls, .key_slot = j->key_slot, .n_prompt = so->usage.prompt_tokens, .n_cached = so->usage.cached_tokens,
                      .n_gen = n_gen, .ttft_s = so->ttft_s,
                      .decode_tps = so->ttft_s >= 0 && n_gen > 1 && decode_s > 0 ? (n_gen - 1) / decode_s : 0 };
    status_note(j->c->status, gc_wall_now(), &rq);
}

static void api_job_apply(api_job *j, int i, const sched_output *so)
{
    api_out *o = &j->out;
    if (!j->begun && j->req.stream) {
        /* Messages' message_start carries the prompt's cache figures: it waits for the first
         * record, which has them (the prefix lookup happens at admission, before any token). */
        if (so->usage.prompt_tokens > 0)
            api_out_set_prompt(o, so->usage.prompt_tokens, so->usage.cached_tokens, j->prompt.ids, (int)j->prompt.n_ids);
        api_out_begin(o);
        j->begun = true;
    }
    if (so->kind == SCHED_OUT_FINISH) {
        j->fin[i] = true;
        api_detok(&j->ts[i], -1, &j->raw, &j->text);
        api_out_text(o, i, j->text.p, j->text.len);
        if (so->finish == SCHED_FINISH_ERROR) j->error = true;
        if (so->finish == SCHED_FINISH_REFUSED) j->refused = true;
        if (so->finish == SCHED_FINISH_UNAVAILABLE) j->unavailable = true;
        if (so->finish == SCHED_FINISH_ABORTED && j->kind == API_KIND_MESSAGES) j->aborted = true;
        if (j->c->status) api_job_note(j, so);
        api_out_set_drafts(o, i, so->usage.accepted_drafts, so->usage.rejected_drafts);
        if (i == 0)
            api_out_set_prompt(o, so->usage.prompt_tokens ? so->usage.prompt_tokens : (int)j->prompt.n_ids,
                               so->usage.cached_tokens, j->prompt.ids, (int)j->prompt.n_ids);
        /* cut short by a stopping server: the OpenAI shapes say "length" (Responses:
         * incomplete); Messages ends with an overloaded_error instead (api_job_error_body) */
        bool cut = so->finish == SCHED_FINISH_LENGTH || so->finish == SCHED_FINISH_ABORTED;
        api_out_finish(o, i, cut ? EVENTS_FINISH_LENGTH : EVENTS_FINISH_STOP);
        return;
    }
    if (so->is_stop) {
        api_out_count_token(o, i);
        return;
    }
    api_detok(&j->ts[i], so->token, &j->raw, &j->text);
    api_logprob lp, *lpp = NULL;
    if (j->req.logprobs) {
        lp.token = so->token;
        lp.logprob = so->logprob;
        lp.n_top = TM_MIN(so->n_top, API_MAX_TOP_LOGPROBS);
        for (int k = 0; k < lp.n_top; k++) {
            lp.top_token[k] = so->top[k].token;
            lp.top_logprob[k] = so->top[k].logprob;
        }
        lpp = &lp;
    }
    bool stop = api_out_token(o, i, so->token, j->text.p, j->text.len, lpp);
    if (stop && j->sreq[i]) api_be_cancel(j->c, j->sreq[i]);
}

static bool api_job_all_finished(const api_job *j)
{
    for (int i = 0; i < j->n; i++)
        if (!j->fin[i]) return false;
    return true;
}

/* Polls every unfinished choice; waits up to timeout_ms on one if none had output. */
static bool api_job_pump(api_job *j, int timeout_ms)
{
    sched_output outs[32];
    bool any = false;
    for (int pass = 0; pass < 2 && !any; pass++) {
        for (int i = 0; i < j->n; i++) {
            if (j->fin[i]) continue;
            int k = api_be_poll(j->c, j->sreq[i], outs, 32, pass ? timeout_ms : 0);
            for (int q = 0; q < k; q++) api_job_apply(j, i, &outs[q]);
            if (k) any = true;
            if (pass) break;
        }
    }
    return any;
}

/* The error that ends a failed (500), a refused (400: a cluster worker could not take its
 * format or its length), an unavailable (503: no cluster worker of its role came in time) or,
 * for Messages, a server-stopped (503) request; returns its status. */
static int api_job_error_body(api_job *j, bytebuf *b)
{
    api_error e;
    if (j->unavailable) {
        /* the type a submit with no worker gets (api_openai_submit_error); Anthropic's is
         * overloaded_error by the status */
        api_error_set(&e, 503, NULL, "no_worker_available",
                      "No worker was available to go on with the request: the cluster had no worker of the role "
                      "it needed within the gateway's wait timeout. Retry the request.");
        snprintf(e.type, sizeof e.type, "server_error");
    } else if (j->refused)
        api_error_set(&e, 400, NULL, "invalid_value",
                      "The worker the request ran on refused it (its format did not compile there, or its "
                      "prompt is longer than that worker takes; the gateway and its workers may run "
                      "different builds or options).");
    else if (j->error)
        api_error_set(&e, 500, NULL, NULL, "The request failed in the engine (the KV cache may be too small for it).");
    else
        api_error_set(&e, 503, NULL, NULL, "The server is shutting down: the answer was cut short. Retry the request.");
    api_error_json(j->kind, &e, b);
    return e.status;
}

static bool api_job_pull(void *ctx, bytebuf *outb, int timeout_ms)
{
    api_job *j = ctx;
    if (j->ended) return false;
    api_job_pump(j, timeout_ms);
    if (api_job_all_finished(j)) {
        if (j->error || j->refused || j->unavailable || j->aborted) {
            bytebuf b = {0};
            api_job_error_body(j, &b);
            api_sse(&j->out.out, j->kind == API_KIND_MESSAGES ? "error" : NULL, b.p, b.len);
            bytebuf_free(&b);
        } else {
            api_out_end(&j->out);
        }
        j->ended = true;
    }
    if (j->out.out.len) {
        bytebuf_append(outb, j->out.out.p, j->out.out.len);
        j->out.out.len = 0;
    }
    return !j->ended;
}

static void api_job_done(void *ctx, bool client_gone)
{
    (void)client_gone;
    api_job_free(ctx); /* releases, and so cancels, what still runs: its KV blocks are freed */
}

void api_respond_error(http_request *r, api_kind kind, const api_error *e)
{
    bytebuf b = {0};
    api_error_json(kind, e, &b);
    http_respond(r, e->status, "application/json", b.p, b.len);
    bytebuf_free(&b);
}


/* Step: the prompt's token ids into j->prompt. Chat APIs render the conversation with the
 * chat template; completions take the ids as given, or tokenise the text with the model's
 * BOS and no control-token matching. */
static bool api_job_prompt(api_job *j, api_error *e)
{
    const api_ctx *c = j->c;
    const api_req *q = &j->req;
    if (j->kind == API_KIND_COMPLETIONS) {
        if (q->prompt_ids) {
            j->prompt.ids = xmalloc((size_t)q->n_prompt_ids * sizeof *j->prompt.ids);
            memcpy(j->prompt.ids, q->prompt_ids, (size_t)q->n_prompt_ids * sizeof *j->prompt.ids);
            j->prompt.n_ids = (size_t)q->n_prompt_ids;
            return true;
        }
        int32_t cap = (int32_t)TM_MIN(q->prompt_len + 8, (size_t)INT32_MAX / 8);
        j->prompt.ids = xmalloc((size_t)cap * sizeof(int32_t));
        int32_t n = tokenizer_encode(c->tok, q->prompt_text, q->prompt_len, true, false, j->prompt.ids, cap);
        if (n > cap) {
            j->prompt.ids = xrealloc(j->prompt.ids, (size_t)n * sizeof(int32_t));
            n = tokenizer_encode(c->tok, q->prompt_text, q->prompt_len, true, false, j->prompt.ids, n);
        }
        if (n <= 0) {
            if (n < 0) api_error_set(e, 500, "prompt", NULL, "The prompt could not be tokenised.");
            else api_json_value_error(j->kind, e, "prompt", "the prompt is empty.");
            return false;
        }
        j->prompt.n_ids = (size_t)n;
        return true;
    }
    if (!c->tmpl) {
        api_error_set(e, 500, NULL, NULL, "This server has no chat template for its model.");
        return false;
    }
    /* a call forced to one tool: families whose prompt can open it (harmony) do */
    api_req *qm = &j->req;
    if (qm->tools_mode == API_TOOLS_NAMED) qm->conv.forced_call = qm->tool_name;
    else if (qm->tools_mode == API_TOOLS_REQUIRED && qm->conv.n_tools == 1) qm->conv.forced_call = qm->conv.tools[0].name;
    char err[256] = "";
    template_status ts = template_apply(c->tmpl, &q->conv, c->tok_pool, &j->prompt, err, sizeof err);
    if (ts != TEMPLATE_OK) {
        api_error_set(e, ts == TEMPLATE_ERR_TOKENIZE ? 500 : 400, "messages", NULL, "The conversation cannot be rendered: %s",
                      err[0] ? err : "template error");
        return false;
    }
    return true;
}

/* count_tokens: the prompt's size (and ids) without generating. */
static void api_job_count(http_request *r, api_job *j)
{
    int n_prompt = (int)j->prompt.n_ids;
    bytebuf b = {0};
    bytebuf_printf(&b, "{\"input_tokens\":%d", n_prompt);
    if (j->req.return_token_ids) {
        bytebuf_puts(&b, ",\"prompt_token_ids\":[");
        for (int k = 0; k < n_prompt; k++) bytebuf_printf(&b, "%s%d", k ? "," : "", j->prompt.ids[k]);
        bytebuf_putc(&b, ']');
    }
    bytebuf_putc(&b, '}');
    api_respond_buf(r, 200, &b);
    bytebuf_free(&b);
}

static void api_respond_submit_error(http_request *r, const api_job *j, sched_status st)
{
    int n_prompt = (int)j->prompt.n_ids, max_tokens = j->req.max_tokens > 0 ? j->req.max_tokens : 0;
    if (j->kind == API_KIND_MESSAGES) api_anthropic_submit_error(r, j->c, st, n_prompt, max_tokens);
    else api_openai_submit_error(r, j->c, st, n_prompt, max_tokens,
                                 j->kind == API_KIND_COMPLETIONS ? "prompt" : j->kind == API_KIND_RESPONSES ? "input" : "messages");
}

/* Step: the splitter's markers of the family. No tools offered (or tool_choice none): no
 * call, whatever is written. */
static void api_job_markers(api_job *j, events_markers *mk)
{
    if (j->kind == API_KIND_COMPLETIONS) events_markers_none(mk);  /* raw text: nothing to split */
    else template_markers(j->c->tmpl, &j->req.conv, mk);
    if (j->req.tools_mode == API_TOOLS_NONE || j->req.conv.n_tools == 0) mk->tools_enabled = false;
}

/* Does the server end harmony's opening analysis message (with <|end|>, see api_job_submit)?
 * Then the splitter reads what precedes that <|end|> as reasoning (events_markers.h_analysis). */
static bool api_job_harmony_analysis(const api_job *j, const events_markers *mk)
{
    return (j->req.thinking_budget > 0 || j->g) && mk->think_end < 0 && mk->toolfmt == EVENTS_TOOLFMT_HARMONY &&
           !mk->h_forced && mk->h_end >= 0;
}

/* Step: the output state (ids, the prompt's figures), after the grammar step. */
static void api_job_output(api_job *j, events_markers *mk)
{
    const api_ctx *c = j->c;
    mk->h_analysis = api_job_harmony_analysis(j, mk);
    api_out_init(&j->out, &j->req, mk, j->req.sp.seed ^ 0x5DEECE66Dull, c->model_name);
    if (c->model) snprintf(j->out.fingerprint, sizeof j->out.fingerprint, "fp_%.10s", c->model->fingerprint_hex);
    j->out.piece = api_job_piece;
    j->out.piece_ud = j;
    api_out_set_prompt(&j->out, (int)j->prompt.n_ids, 0, j->prompt.ids, (int)j->prompt.n_ids);
}

static bool api_client_gone(void *r)
{
    return http_request_client_gone(r);
}

/* Step: the answer's format (STRUCTURED OUTPUT in api.h), compiled through the cache before
 * the request is queued (on the compile pool: api_job_grammar_run), so that a bad schema / regex / grammar is a 400 naming the
 * problem before anything is queued. A forced call of a family with a grammar form wins over
 * a response format (the answer is the call); strict tools under auto bind calls only, and
 * only when no response format binds the answer. */
static bool api_job_grammar(api_job *j, const events_markers *mk, api_error *e)
{
    const api_ctx *c = j->c;
    api_req *q = &j->req;
    j->g_trigger = -1;
    bool forced = q->tools_mode == API_TOOLS_REQUIRED || q->tools_mode == API_TOOLS_NAMED;
    if (forced && q->conv.n_tools == 0) {
        api_error_set(e, 400, "tool_choice", "invalid_value",
                      "Invalid value for 'tool_choice': a tool call is required, but no tools were given.");
        return false;
    }
    bool strict = false;
    for (int i = 0; i < q->conv.n_tools; i++) strict |= q->conv.tools[i].strict;
    /* (a server without the grammar machinery, the gateway, leaves such calls free as before) */
    bool lazy = !forced && strict && q->tools_mode == API_TOOLS_AUTO && q->fmt_kind < 0 && c->gcache && c->gvocab;
    char err[512] = "";
    char *tool_src = NULL;
    int32_t trigger = -1;
    if (forced || lazy) {
        tool_src = api_tool_gbnf(&q->conv, mk, q->tools_mode == API_TOOLS_NAMED ? q->tool_name : NULL, lazy, q->one_call,
                                 &trigger, err, sizeof err);
        if (!tool_src && err[0]) {
            api_error_set(e, 400, q->tools_mode == API_TOOLS_NAMED ? "tool_choice" : "tools", "invalid_value",
                          "Invalid tool call format: %s", err);
            return false;
        }
    }
    if (forced && !tool_src) {
        /* the family has no call syntax (or lacks its tokens): answering free text under a
         * forced call would be a silent lie to the client */
        api_error_set(e, 400, "tool_choice", "invalid_value",
                      "Invalid value for 'tool_choice': this model's chat template (%s) has no tool-call syntax, so a "
                      "call cannot be forced; use tool_choice auto or none, or serve the model with a template "
                      "that has tool calls (--template).",
                      c->tmpl ? template_name(c->tmpl) : "none");
        return false;
    }
    if (!tool_src && q->fmt_kind < 0) return true;
    const char *param = tool_src ? "tools" : q->fmt_param;
    if (!c->gcache || !c->gvocab) {
        free(tool_src);
        api_error_set(e, 400, param, "invalid_value",
                      "Structured output is not available on this server.");
        return false;
    }
    grammar_status st;
    if (tool_src) {  /* the schemas compiled in api_tool_gbnf: an error here is the combination's */
        st = grammar_cache_get(c->gcache, GRAMMAR_KIND_GBNF, tool_src, strlen(tool_src), &j->g, err, sizeof err);
        j->g_tool = tool_src;
        j->g_kind = GRAMMAR_KIND_GBNF;
        j->g_src = tool_src;
        j->g_len = strlen(tool_src);
        if (lazy) j->g_trigger = trigger;
    } else {
        st = grammar_cache_get(c->gcache, (grammar_kind)q->fmt_kind, q->fmt_src ? q->fmt_src : "", q->fmt_len, &j->g,
                               err, sizeof err);
        j->g_kind = q->fmt_kind;
        j->g_src = q->fmt_src ? q->fmt_src : "";
        j->g_len = q->fmt_len;
    }
    if (st != GRAMMAR_OK) {
        api_error_set(e, 400, param, "invalid_value", "Invalid format in '%s': %s", param, err);
        return false;
    }
    if (grammar_max_token(j->g) >= grammar_vocab_n(c->gvocab)) {  /* a GBNF <[ID]> the model does not have */
        api_error_set(e, 400, param, "invalid_value", "Invalid format in '%s': token id %d is not in the model's vocabulary (%d tokens).",
                      param, (int)grammar_max_token(j->g), grammar_vocab_n(c->gvocab));
        return false;
    }
    if (!tool_src && q->tools_mode == API_TOOLS_AUTO && q->conv.n_tools > 0) {
        /* the format checked alone above (its errors name its field); the answer may still
         * be a call instead, as with no format */
        tool_src = api_format_calls_gbnf(&q->conv, mk, q->fmt_kind, q->fmt_src, q->fmt_len, q->one_call, err,
                                         sizeof err);
        if (!tool_src && err[0]) {
            api_error_set(e, 400, "tools", "invalid_value", "Invalid tool call format: %s", err);
            return false;
        }
        if (tool_src) {
            grammar *both = NULL;
            st = grammar_cache_get(c->gcache, GRAMMAR_KIND_GBNF, tool_src, strlen(tool_src), &both, err, sizeof err);
            if (st != GRAMMAR_OK) {
                free(tool_src);
                api_error_set(e, 400, "tools", "invalid_value", "Invalid format in 'tools': %s", err);
                return false;
            }
            grammar_free(j->g);
            j->g = both;
            j->g_tool = tool_src;
            j->g_kind = GRAMMAR_KIND_GBNF;
            j->g_src = tool_src;
            j->g_len = strlen(tool_src);
        }
    }
    return true;
}

typedef struct {
    api_job *j;
    const events_markers *mk;
    api_error *e;
} api_grammar_call;

static bool api_grammar_call_fn(void *arg)
{
    api_grammar_call *a = arg;
    return api_job_grammar(a->j, a->mk, a->e);
}

/* api_job_grammar for a request with a format or tools, on the compile pool: the compiles
 * running at once are the pool's threads, not the connections, and a compile stops when its
 * client goes (a hostile grammar that the budgets let run for seconds). */
static bool api_job_grammar_run(http_request *r, api_job *j, const events_markers *mk, api_error *e)
{
    if (j->req.fmt_kind < 0 && j->req.conv.n_tools == 0) return api_job_grammar(j, mk, e);
    api_compile_pool *p = api_compile_shared();
    if (!p) {
        api_error_set(e, 500, NULL, NULL, "The structured-output compile threads could not be started.");
        return false;
    }
    api_grammar_call a = { j, mk, e };
    bool ok = false;
    if (api_compile_run(p, api_grammar_call_fn, &a, api_client_gone, r, &ok) == API_COMPILE_BUSY) {
        api_error_set(e, 429, NULL, "rate_limit_exceeded",
                      "Too many structured-output formats are being compiled (%d waiting); retry the request shortly.",
                      API_COMPILE_QUEUE);
        return false;
    }
    return ok;
}

/* Step: one scheduler request per choice (seeds seed, seed+1, ...). Completions' max_tokens 0
 * generates nothing: every choice ends at once ("length"). On failure answers the error. */
static bool api_job_submit(http_request *r, api_job *j, const api_tenancy *tn, const events_markers *mk)
{
    const api_ctx *c = j->c;
    int n_prompt = (int)j->prompt.n_ids;
    if (j->req.max_tokens == 0) {
        j->n = j->out.n_choices;
        for (int i = 0; i < j->n; i++) {
            j->fin[i] = true;
            api_out_finish(&j->out, i, EVENTS_FINISH_LENGTH);
        }
        return true;
    }
    sched_params sp = {.prompt = j->prompt.ids, .n_prompt = n_prompt, .sample = j->req.sp, .max_tokens = j->req.max_tokens};
    if (j->kind != API_KIND_COMPLETIONS)  /* chat turns also end at the vocabulary's other end-of-generation ids */
        for (int k = 0; k < j->eog->n; k++) sp.stop_ids[sp.n_stop_ids++] = j->eog->ids[k];
    sp.ignore_eos = j->req.ignore_eos;
    sp.logprobs = j->req.logprobs;
    sp.top_logprobs = TM_MIN(j->req.top_logprobs, SCHED_MAX_TOP_LOGPROBS);
    sp.cache_salt = tn->salt;
    sp.cache_class = tn->cls;
    j->cls = tn->cls;
    j->t_submit = util_now();
    if ((j->req.thinking_budget > 0 || j->g) && mk->think_end >= 0) {  /* enforced by the scheduler */
        sp.think_budget = j->req.thinking_budget;
        sp.think_start = mk->think_start;
        sp.think_end = mk->think_end;
        sp.think_open = mk->starts_in_reasoning;
    } else if (mk->h_analysis) {
        /* harmony: the output opens with its analysis message, which <|end|> closes */
        sp.think_budget = j->req.thinking_budget;
        sp.think_start = -1;
        sp.think_end = mk->h_end;
        sp.think_open = true;
    }
    sp.grammar = j->g;  /* reasoning stays free: the format applies from the end of the think block */
    sp.grammar_vocab = j->g ? c->gvocab : NULL;
    if (j->g) {
        sp.grammar_kind = j->g_kind;
        sp.grammar_src = j->g_src;
        sp.grammar_len = j->g_len;
    }
    sp.grammar_lazy = j->g && j->g_trigger >= 0;
    sp.grammar_trigger = j->g_trigger;
    for (int i = 0; i < j->out.n_choices; i++) {
        sp.sample.seed = j->req.sp.seed + (uint64_t)i;
        sched_status ss = api_be_submit(c, &sp, &j->sreq[i]);
        if (ss != SCHED_OK) {
            api_respond_submit_error(r, j, ss);
            return false;
        }
        j->n = i + 1;
        tokenizer_stream_init(&j->ts[i], c->tok);
        j->ts[i].prev = j->prompt.ids[n_prompt - 1]; /* mid-text: no BOS space rule */
    }
    return true;
}

/* Step: the answer. Streaming hands the job to the connection (api_job_pull / api_job_done
 * own it from here); otherwise waits for every choice, checking the socket every 50 ms, also
 * while tokens flow, and answers one body. Frees the job either way. */
static void api_job_answer(http_request *r, api_job *j)
{
    if (j->req.stream) {
        if (j->kind != API_KIND_MESSAGES) {  /* Messages begins at the first record (api_job_apply) */
            api_out_begin(&j->out);
            j->begun = true;
        }
        http_add_header(r, "Cache-Control", "no-cache");
        http_add_header(r, "X-Accel-Buffering", "no");
        http_respond_stream(r, 200, "text/event-stream", api_job_pull, api_job_done, j);
        return;
    }
    double t_check = util_now();
    while (!api_job_all_finished(j)) {
        api_job_pump(j, 50);
        double now = util_now();
        if (now - t_check < 0.05) continue;
        t_check = now;
        if (http_request_client_gone(r)) {
            api_job_free(j);
            http_respond(r, 499, "application/json", "{}", 2);
            return;
        }
    }
    if (j->error || j->refused || j->unavailable || j->aborted) {
        bytebuf b = {0};
        int status = api_job_error_body(j, &b);
        if (status == 503) api_retry_after(r);
        http_respond(r, status, "application/json", b.p, b.len);
        bytebuf_free(&b);
    } else {
        api_out_end(&j->out);
        api_respond_buf(r, 200, &j->out.out);
    }
    api_job_free(j);
}

void api_serve(http_request *r, const api_ctx *c, api_kind kind, bool count_only, api_store *store)
{
    if (kind == API_KIND_MESSAGES ? !api_anthropic_auth(r) : !api_openai_auth(r)) return;
    size_t blen;
    const char *body = http_request_body(r, &blen);
    c = api_ctx_of_body(c, body, blen);
    if (c->model && c->model->hp.bidirectional && !count_only) {   /* an encoder has no logits to sample */
        api_error ee;
        memset(&ee, 0, sizeof ee);
        api_error_set(&ee, 400, "model", "model_not_supported",
                      "This model (%s) is an embedding model: it serves /v1/embeddings, not text generation.",
                      c->model->hp.arch_name);
        api_respond_error(r, kind, &ee);
        return;
    }
    api_job *j = xcalloc(1, sizeof *j);
    j->c = c;
    j->eog = api_find_eog(c->tok);
    j->kind = kind;
    j->key_slot = http_request_key_index(r) + 1;
    api_req_init(&j->req, kind);
    api_error e;
    memset(&e, 0, sizeof e);
    /* parse, then the prompt's ids */
    api_cfg cfg = {c->model_name, c->model_alias, store, api_ctx_n_vocab(c)};
    api_status st = count_only ? api_messages_count_parse(&cfg, body, blen, &j->req, &e)
                               : api_parse(&cfg, kind, body, blen, &j->req, &e);
    api_tenancy tn;
    if (st != API_OK || !api_job_prompt(j, &e)) goto refuse;
    if (count_only) {
        api_job_count(r, j);
        api_job_free(j);
        return;
    }
    /* the context check and the tenant's place in the cache */
    if ((int)j->prompt.n_ids >= c->n_ctx) {
        api_respond_submit_error(r, j, SCHED_ERR_TOO_LONG);
        api_job_free(j);
        return;
    }
    if (!api_tenancy_of(r, c, j->req.cache_salt, j->req.cache_class, &tn, &e)) goto refuse;
    /* output state, submission, answer */
    events_markers mk;
    api_job_markers(j, &mk);
    if (!api_job_grammar_run(r, j, &mk, &e)) goto refuse;
    api_job_output(j, &mk);
    if (!api_job_submit(r, j, &tn, &mk)) {
        api_job_free(j);
        return;
    }
    api_job_answer(r, j);
    return;
refuse:
    api_respond_error(r, kind, &e);
    api_job_free(j);
}
