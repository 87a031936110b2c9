/*
 * api: the pieces every API route shares: error bodies in the OpenAI and Anthropic shapes,
 * the API-key check, submit-failure mapping, the model-name check. See api.h.
 */
#include "recipe/api.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

void api_respond_json(http_request *r, int status, json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!s) {
        http_respond(r, 500, "application/json", "{\"error\":{\"message\":\"encoding failed\"}}", 40);
        return;
    }
    http_respond(r, status, "application/json", s, strlen(s));
    free(s);
}

void api_openai_error(http_request *r, int status, const char *type, const char *message,
                      const char *param, const char *code)
{
    json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", message, "type", type,
                          "param", param ? json_string(param) : json_null(),
                          "code", code ? json_string(code) : json_null());
    api_respond_json(r, status, json_pack("{s:o}", "error", e));
}

void api_anthropic_error(http_request *r, int status, const char *type, const char *message)
{
    api_respond_json(r, status, json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type,
                                          "message", message));
}

bool api_openai_auth(http_request *r)
{
    if (http_request_authorized(r)) return true;
    const char *h = http_request_header(r, "Authorization");
    api_openai_error(r, 401, "invalid_request_error",
                     h ? "Incorrect API key provided." : "You didn't provide an API key. Use \"Authorization: Bearer KEY\".",
                     NULL, "invalid_api_key");
    return false;
}

bool api_anthropic_auth(http_request *r)
{
    if (http_request_authorized(r)) return true;
    api_anthropic_error(r, 401, "authentication_error", "invalid x-api-key");
    return false;
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
    case SCHED_ERR_STOPPED: snprintf(buf, sz, "The server is shutting down."); break;
    case SCHED_ERR_ARG: snprintf(buf, sz, "Invalid prompt (empty, or a token id outside the vocabulary)."); break;
    default: snprintf(buf, sz, "Internal error: %s.", sched_status_name(st)); break;
    }
}

void api_openai_submit_error(http_request *r, const api_ctx *c, sched_status st, int n_prompt, int max_tokens)
{
    char msg[400];
    api_submit_message(msg, sizeof msg, c, st, n_prompt, max_tokens);
    switch (st) {
    case SCHED_ERR_TOO_LONG: api_openai_error(r, 400, "invalid_request_error", msg, "messages", "context_length_exceeded"); break;
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
    switch (st) {
    case SCHED_ERR_TOO_LONG:
    case SCHED_ERR_ARG: api_anthropic_error(r, 400, "invalid_request_error", msg); break;
    case SCHED_ERR_QUEUE_FULL: api_anthropic_error(r, 529, "overloaded_error", msg); break;
    case SCHED_ERR_STOPPED: api_anthropic_error(r, 503, "api_error", msg); break;
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

json_t *api_json_text(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    if (v) return v;
    /* repair: copy valid sequences, U+FFFD for each bad byte */
    char *out = xmalloc(n * 3 + 1);
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = k > 0 && i + k <= n && c != 0;
        for (size_t j = 1; ok && j < k; j++) ok = (p[i + j] & 0xC0) == 0x80;
        if (ok && k > 1) {
            /* overlongs, surrogates, > U+10FFFF */
            unsigned cp = k == 2 ? (c & 0x1F) : k == 3 ? (c & 0x0F) : (c & 0x07);
            for (size_t j = 1; j < k; j++) cp = (cp << 6) | (p[i + j] & 0x3F);
            ok = !((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) ||
                   (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF);
        }
        if (ok) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else if (c == 0) {
            out[o++] = 0;  /* NUL is valid in JSON strings via json_stringn */
            i++;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    v = json_stringn(out, o);
    free(out);
    return v ? v : json_string("");
}

void api_sse_json(http_buf *b, json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    http_buf_puts(b, "data: ");
    if (s) http_buf_puts(b, s);
    http_buf_puts(b, "\n\n");
    free(s);
}

bool api_stop_find(const char *const *stops, int n_stops, const char *text, size_t len, size_t from,
                   size_t *cut, size_t *safe)
{
    bool found = false;
    size_t best = len;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (sl == 0 || sl > len) continue;
        for (size_t p = from; p + sl <= len && p < best; p++)
            if (!memcmp(text + p, stops[i], sl)) {
                best = p;
                found = true;
                break;
            }
    }
    if (found) {
        *cut = best;
        return true;
    }
    size_t hold = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= len && !memcmp(text + len - k, stops[i], k)) {
                hold = k;
                break;
            }
    }
    *safe = len - hold;
    return false;
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
