/*
 * api: the parts the API routes share. Serving helpers (error responses, auth, submit-error
 * mapping, model check, SSE JSON, ids) used by api_completions.c too; and for the three chat
 * APIs: errors in both vendors' shapes, JSON checks,
 * the stop-sequence matcher, the output state machine (api_out) and the Responses store.
 *
 * api_out: per choice, tokens go to the output splitter (events.c); its events become items
 * (a run of text, a run of reasoning, a tool call). Answer text passes the stop matcher
 * first. Items are opened, grown and closed in output order, and each step is passed to the
 * route's formatter (api_*_on), which appends SSE events when streaming; the items are kept
 * for the final body (and the Responses store).
 *
 * Stop matching: the matcher holds back the longest suffix of the text seen that is a proper
 * prefix of some stop sequence; everything before it is released. On a match the text before
 * the match is released and the rest dropped.
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/util.h"

/* ------------------------------------------------------------------ serving helpers (api_completions.c too) */
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

/* The error body in the OpenAI ({"error":{message,type,param,code}}) or the Anthropic
 * ({"type":"error","error":{type,message}}) shape; param and code may be NULL (null). Written
 * with the JSON string writer, so a message quoting the client's bytes is always valid JSON. */
static void api_error_body(jsonfmt_buf *out, bool anthropic, const char *type, const char *message,
                           const char *param, const char *code)
{
    if (anthropic) {
        jsonfmt_buf_puts(out, "{\"type\":\"error\",\"error\":{\"type\":");
        api_buf_str(out, type);
        jsonfmt_buf_puts(out, ",\"message\":");
        api_buf_str(out, message);
        jsonfmt_buf_puts(out, "}}");
        return;
    }
    jsonfmt_buf_puts(out, "{\"error\":{\"message\":");
    api_buf_str(out, message);
    jsonfmt_buf_puts(out, ",\"type\":");
    api_buf_str(out, type);
    jsonfmt_buf_puts(out, ",\"param\":");
    api_buf_str(out, param);
    jsonfmt_buf_puts(out, ",\"code\":");
    api_buf_str(out, code);
    jsonfmt_buf_puts(out, "}}");
}

static void api_error_respond(http_request *r, int status, bool anthropic, const char *type, const char *message,
                              const char *param, const char *code)
{
    jsonfmt_buf b = {0};
    api_error_body(&b, anthropic, type, message, param, code);
    http_respond(r, status, "application/json", b.p, b.len);
    jsonfmt_buf_free(&b);
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
    unsigned len = 0;
    EVP_MD_CTX *x = EVP_MD_CTX_new();
    bool ok = x && EVP_DigestInit_ex(x, EVP_sha256(), NULL) && EVP_DigestUpdate(x, "tokenmill-tenant", 17);
    if (ok && !key) ok = EVP_DigestUpdate(x, "\0", 1);
    if (ok && key) {
        EVP_MD_CTX *y = EVP_MD_CTX_new();
        ok = y && EVP_DigestInit_ex(y, EVP_sha256(), NULL) && EVP_DigestUpdate(y, "tokenmill-api-key", 18) &&
             EVP_DigestUpdate(y, key, strlen(key)) && EVP_DigestFinal_ex(y, id, &len) &&
             EVP_DigestUpdate(x, "\1", 1) && EVP_DigestUpdate(x, id, 32);
        EVP_MD_CTX_free(y);
    }
    if (ok && cache_salt) ok = EVP_DigestUpdate(x, cache_salt, strlen(cache_salt));
    ok = ok && EVP_DigestFinal_ex(x, h, &len);
    EVP_MD_CTX_free(x);
    if (!ok) {
        api_error_set(e, 500, NULL, NULL, "cannot hash the cache salt");
        return false;
    }
    for (int i = 0; i < 32; i++) snprintf(t->salt + 2 * i, 3, "%02x", h[i]);
    return true;
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

/* ------------------------------------------------------------------ helpers */

void api_buf_printf(jsonfmt_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jsonfmt_buf_append(b, tmp, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    jsonfmt_buf_append(b, big, (size_t)n);
    free(big);
}

void api_buf_str(jsonfmt_buf *b, const char *s)
{
    if (!s) jsonfmt_buf_puts(b, "null");
    else jsonfmt_write_string(b, s, strlen(s));
}

void api_buf_strn(jsonfmt_buf *b, const char *s, size_t len) { jsonfmt_write_string(b, s ? s : "", s ? len : 0); }

void api_sse(jsonfmt_buf *b, const char *name, const char *json, size_t len)
{
    if (name) {
        jsonfmt_buf_puts(b, "event: ");
        jsonfmt_buf_puts(b, name);
        jsonfmt_buf_putc(b, '\n');
    }
    jsonfmt_buf_puts(b, "data: ");
    jsonfmt_buf_append(b, json, len);
    jsonfmt_buf_puts(b, "\n\n");
}

void api_sse_typed(jsonfmt_buf *b, const char *type, int seq, const char *fields, size_t flen)
{
    jsonfmt_buf d = {0};
    jsonfmt_buf_puts(&d, "{\"type\":");
    api_buf_str(&d, type);
    if (seq >= 0) api_buf_printf(&d, ",\"sequence_number\":%d", seq);
    if (flen) {
        jsonfmt_buf_putc(&d, ',');
        jsonfmt_buf_append(&d, fields, flen);
    }
    jsonfmt_buf_putc(&d, '}');
    api_sse(b, type, d.p, d.len);
    jsonfmt_buf_free(&d);
}

bool api_utf8_valid(const char *s, size_t len)
{
    for (size_t i = 0, k; i < len; i += k)
        if ((k = jsonfmt_utf8_char(s + i, len - i)) == 0) return false;
    return true;
}

/* ------------------------------------------------------------------ errors */

void api_error_set(api_error *e, int status, const char *param, const char *code, const char *fmt, ...)
{
    memset(e, 0, sizeof *e);
    e->status = status;
    /* OpenAI's error.type by status (a bad key is an invalid_request_error there too). */
    const char *type = "invalid_request_error";
    if (status == 403) type = "permission_error";
    else if (status == 413) type = "invalid_request_error";
    else if (status == 429) type = "rate_limit_exceeded";
    else if (status == 529 || status == 503) type = "server_overloaded";
    else if (status >= 500) type = "server_error";
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

static const char *api_anthropic_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

void api_error_json(api_kind kind, const api_error *e, jsonfmt_buf *out)
{
    if (kind == API_KIND_MESSAGES) api_error_body(out, true, api_anthropic_type(e->status), e->message, NULL, NULL);
    else api_error_body(out, false, e->type[0] ? e->type : "invalid_request_error", e->message,
                        e->param[0] ? e->param : NULL, e->code[0] ? e->code : NULL);
}

/* ------------------------------------------------------------------ JSON checks */

bool api_json_load(api_kind kind, const char *body, size_t len, json_t **root, api_error *e)
{
    *root = NULL;
    if (!api_utf8_valid(body, len)) {
        api_error_set(e, 400, NULL, "invalid_utf8", "The request body is not valid UTF-8.");
        return false;
    }
    json_error_t je;
    json_t *v = json_loadb(body, len, 0, &je);
    if (!v) {
        if (kind == API_KIND_MESSAGES)
            api_error_set(e, 400, NULL, NULL, "There was an error parsing the body: %s (line %d, column %d)", je.text,
                          je.line, je.column);
        else
            api_error_set(e, 400, NULL, "invalid_json",
                          "We could not parse the JSON body of your request: %s (line %d, column %d). The OpenAI API "
                          "expects a JSON payload.",
                          je.text, je.line, je.column);
        return false;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        if (kind == API_KIND_MESSAGES) api_error_set(e, 400, NULL, NULL, "Input should be a valid dictionary");
        else api_error_set(e, 400, NULL, "invalid_type", "The request body must be a JSON object.");
        return false;
    }
    *root = v;
    return true;
}

static const char *api_json_kind_name(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

void api_json_type_error(api_kind kind, api_error *e, const char *path, const char *expected, json_t *got)
{
    if (kind == API_KIND_MESSAGES)
        api_error_set(e, 400, path, NULL, "%s: Input should be %s", path, expected);
    else
        api_error_set(e, 400, path, "invalid_type", "Invalid type for '%s': expected %s, but got %s instead.", path,
                      expected, api_json_kind_name(got));
}

void api_json_value_error(api_kind kind, api_error *e, const char *path, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (kind == API_KIND_MESSAGES) api_error_set(e, 400, path, NULL, "%s: %s", path, msg);
    else api_error_set(e, 400, path, "invalid_value", "Invalid '%s': %s", path, msg);
}

void api_json_missing(api_kind kind, api_error *e, const char *path)
{
    if (kind == API_KIND_MESSAGES) api_error_set(e, 400, path, NULL, "%s: Field required", path);
    else api_error_set(e, 400, path, "missing_required_parameter", "Missing required parameter: '%s'.", path);
}

void api_json_bad(api_kind kind, api_error *e, const char *path, const char *expected, json_t *v)
{
    if (!v) api_json_missing(kind, e, path);
    else api_json_type_error(kind, e, path, expected, v);
}

bool api_json_known(api_kind kind, json_t *obj, const char *const *allowed, const char *path, api_error *e)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool ok = false;
        for (int i = 0; allowed[i]; i++)
            if (!strcmp(allowed[i], key)) { ok = true; break; }
        if (ok) continue;
        char full[128];
        api_path(full, sizeof full, path, key, -1);
        if (kind == API_KIND_MESSAGES)
            api_error_set(e, 400, full, NULL, "%s: Extra inputs are not permitted", full);
        else if (kind == API_KIND_RESPONSES)
            api_error_set(e, 400, full, "unknown_parameter", "Unknown parameter: '%s'.", full);
        else
            api_error_set(e, 400, full, "unknown_parameter", "Unrecognized request argument supplied: %s", full);
        return false;
    }
    return true;
}

const char *api_path(char *buf, size_t cap, const char *base, const char *key, int index)
{
    if (index >= 0) snprintf(buf, cap, "%s[%d]", base, index);
    else if (base && base[0]) snprintf(buf, cap, "%s.%s", base, key);
    else snprintf(buf, cap, "%s", key);
    return buf;
}

int api_json_num(api_kind kind, json_t *obj, const char *key, double lo, double hi, double *out, api_error *e)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        api_json_type_error(kind, e, key, kind == API_KIND_MESSAGES ? "a valid number" : "a decimal", v);
        return -1;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        if (kind == API_KIND_MESSAGES)
            api_error_set(e, 400, key, NULL, "%s: Input should be between %g and %g", key, lo, hi);
        else if (x < lo)
            api_error_set(e, 400, key, "decimal_below_min_value",
                          "Invalid '%s': decimal below minimum value. Expected a value >= %g, but got %g instead.", key,
                          lo, x);
        else
            api_error_set(e, 400, key, "decimal_above_max_value",
                          "Invalid '%s': decimal above maximum value. Expected a value <= %g, but got %g instead.", key,
                          hi, x);
        return -1;
    }
    *out = x;
    return 1;
}

int api_json_int(api_kind kind, json_t *obj, const char *key, long long lo, long long hi, long long *out, api_error *e)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    long long x;
    bool beyond = false;   /* a whole number past long long's range (converting it is undefined) */
    double d = json_is_real(v) ? json_real_value(v) : 0;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && d >= -0x1p63 && d < 0x1p63 && d == (double)(long long)d) x = (long long)d;
    else if (json_is_real(v) && (d < -0x1p63 || d >= 0x1p63)) x = d < 0 ? LLONG_MIN : LLONG_MAX, beyond = true;
    else {
        api_json_type_error(kind, e, key, kind == API_KIND_MESSAGES ? "a valid integer" : "an integer", v);
        return -1;
    }
    if (beyond || x < lo || x > hi) {
        bool below = beyond ? d < 0 : x < lo;
        if (kind == API_KIND_MESSAGES)
            api_error_set(e, 400, key, NULL, "%s: Input should be %s %lld", key, below ? "greater than or equal to" : "less than or equal to",
                          below ? lo : hi);
        else
            api_error_set(e, 400, key, below ? "integer_below_min_value" : "integer_above_max_value",
                          "Invalid '%s': integer %s %s value. Expected a value %s %lld, but got %lld instead.", key,
                          below ? "below" : "above", below ? "minimum" : "maximum", below ? ">=" : "<=",
                          below ? lo : hi, x);
        return -1;
    }
    *out = x;
    return 1;
}

int api_json_bool(api_kind kind, json_t *obj, const char *key, bool *out, api_error *e)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        api_json_type_error(kind, e, key, kind == API_KIND_MESSAGES ? "a valid boolean" : "a boolean", v);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

int api_json_str(api_kind kind, json_t *obj, const char *key, const char **out, api_error *e)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) {
        api_json_type_error(kind, e, key, kind == API_KIND_MESSAGES ? "a valid string" : "a string", v);
        return -1;
    }
    *out = json_string_value(v);
    return 1;
}

bool api_json_cache(api_kind kind, json_t *root, api_req *r, api_error *e)
{
    const char *z;
    int st;
    if ((st = api_json_str(kind, root, "cache_salt", &z, e)) < 0) return false;
    if (st) r->cache_salt = xstrdup(z);
    if ((st = api_json_str(kind, root, "cache_class", &z, e)) < 0) return false;
    if (st) r->cache_class = xstrdup(z);
    return true;
}

bool api_json_model(const api_cfg *cfg, api_kind kind, json_t *root, api_req *r, api_error *e)
{
    const char *m = NULL;
    int st = api_json_str(kind, root, "model", &m, e);
    if (st < 0) return false;
    if (st == 0 || !m[0]) {
        /* As api_model_ok: no model named means the one this server serves. */
        free(r->model);
        r->model = xstrdup(cfg && cfg->model_name ? cfg->model_name : "");
        return true;
    }
    bool ok = !cfg || !cfg->model_name || !strcmp(m, cfg->model_name) || (cfg->model_alias && !strcmp(m, cfg->model_alias));
    if (!ok) {
        if (kind == API_KIND_MESSAGES) api_error_set(e, 404, "model", NULL, "model: %s", m);
        else
            api_error_set(e, 404, "model", "model_not_found",
                          "The model `%s` does not exist or you do not have access to it.", m);
        return false;
    }
    free(r->model);
    r->model = xstrdup(m);
    return true;
}

bool api_json_stop(api_kind kind, json_t *root, const char *key, api_req *r, api_error *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) > 0) r->stop[r->n_stop++] = xstrdup(json_string_value(v));
        return true;
    }
    if (!json_is_array(v)) {
        api_json_type_error(kind, e, key, kind == API_KIND_MESSAGES ? "a valid list" : "a string or an array of strings", v);
        return false;
    }
    if (json_array_size(v) > API_MAX_STOP) {
        api_json_value_error(kind, e, key, "at most %d stop sequences are supported, got %zu", API_MAX_STOP,
                             json_array_size(v));
        return false;
    }
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        char p[64];
        api_path(p, sizeof p, key, "", (int)i);
        if (!json_is_string(s)) {
            api_json_type_error(kind, e, p, kind == API_KIND_MESSAGES ? "a valid string" : "a string", s);
            return false;
        }
        if (json_string_length(s) == 0) {
            if (kind == API_KIND_MESSAGES) {
                api_json_value_error(kind, e, p, "stop sequences must be non-empty");
                return false;
            }
            continue;
        }
        r->stop[r->n_stop++] = xstrdup(json_string_value(s));
    }
    return true;
}

char *api_json_parts_text(api_kind kind, json_t *v, const char *path, const api_parts_words *w, api_error *e)
{
    if (json_is_string(v)) return xstrdup(json_string_value(v));
    if (!json_is_array(v)) {
        api_json_type_error(kind, e, path, w->want_value, v);
        return NULL;
    }
    jsonfmt_buf all = {0};
    jsonfmt_buf_puts(&all, "");
    size_t i;
    json_t *part;
    char p[128], q[160];
    json_array_foreach(v, i, part) {
        api_path(p, sizeof p, path, "", (int)i);
        if (!json_is_object(part)) {
            api_json_type_error(kind, e, p, w->want_part, part);
            goto fail;
        }
        json_t *type = json_object_get(part, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : NULL;
        if (!t && w->type_required) {
            api_json_missing(kind, e, api_path(q, sizeof q, p, "type", -1));
            goto fail;
        }
        if (!t) t = "";
        bool ok = false;
        for (int k = 0; w->types[k] && !ok; k++) ok = !strcmp(t, w->types[k]);
        if (!ok) {
            api_json_value_error(kind, e, p, w->unsupported, t);
            goto fail;
        }
        json_t *tx = json_object_get(part, !strcmp(t, "refusal") ? "refusal" : "text");
        if (!json_is_string(tx)) {
            api_path(q, sizeof q, p, "text", -1);
            api_json_bad(kind, e, q, w->want_text, tx);
            goto fail;
        }
        if (i) jsonfmt_buf_puts(&all, w->sep);
        jsonfmt_buf_append(&all, json_string_value(tx), json_string_length(tx));
    }
    return all.p;
fail:
    jsonfmt_buf_free(&all);
    return NULL;
}

char *api_json_dump(json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER); }

/* ------------------------------------------------------------------ requests */

void api_req_init(api_req *r, api_kind kind)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    conv_init(&r->conv);
    r->sp = sample_params_default();
    /* The vendors' defaults: plain sampling at temperature 1 with no truncation. */
    r->sp.temp = 1.0f;
    r->sp.top_k = 0;
    r->sp.top_p = 1.0f;
    r->sp.min_p = 0.0f;
    r->sp.penalty_last_n = 0;
    r->max_tokens = -1;
    r->n = 1;
    r->top_logprobs = 0;
    r->store = true;
    r->temperature_echo = 1.0;
    r->top_p_echo = 1.0;
    static uint64_t ctr;
    r->sp.seed = ((uint64_t)time(NULL) << 16) ^ (__atomic_add_fetch(&ctr, 0x9E3779B97F4A7C15ull, __ATOMIC_RELAXED));
}

void api_req_free(api_req *r)
{
    conv_free(&r->conv);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->model);
    free(r->instructions);
    free(r->previous_response_id);
    free(r->tools_json);
    free(r->metadata_json);
    free(r->cache_salt);
    free(r->cache_class);
    memset(r, 0, sizeof *r);
}

api_status api_parse(const api_cfg *cfg, api_kind kind, const char *body, size_t len, api_req *r, api_error *e)
{
    switch (kind) {
    case API_KIND_CHAT: return api_chat_parse(cfg, body, len, r, e);
    case API_KIND_RESPONSES: return api_responses_parse(cfg, body, len, r, e);
    default: return api_messages_parse(cfg, body, len, r, e);
    }
}

/* ------------------------------------------------------------------ stop matcher */

void api_stop_init(api_stop *s, char *const *stop, int n_stop)
{
    memset(s, 0, sizeof *s);
    s->stop = stop;
    s->n_stop = n_stop;
    s->matched = -1;
}

void api_stop_free(api_stop *s) { jsonfmt_buf_free(&s->hold); }

bool api_stop_feed(api_stop *s, const char *text, size_t len, jsonfmt_buf *emit)
{
    if (s->matched >= 0) return true;
    if (s->n_stop == 0) {
        jsonfmt_buf_append(emit, text, len);
        return false;
    }
    jsonfmt_buf_append(&s->hold, text, len);
    size_t cut = 0, safe = 0;
    if (api_stop_find((const char *const *)s->stop, s->n_stop, s->hold.p, s->hold.len, 0, &cut, &safe)) {
        jsonfmt_buf_append(emit, s->hold.p, cut);
        /* which sequence: the first listed that starts at cut */
        for (int i = 0; i < s->n_stop; i++)
            if (!strncmp(s->hold.p + cut, s->stop[i], strlen(s->stop[i]))) {
                s->matched = i;
                break;
            }
        if (s->matched < 0) s->matched = 0;
        s->hold.len = 0;
        return true;
    }
    /* The held tail starts where a stop sequence (valid UTF-8) would, so the released text
     * ends on a character boundary. */
    jsonfmt_buf_append(emit, s->hold.p, safe);
    memmove(s->hold.p, s->hold.p + safe, s->hold.len - safe);
    s->hold.len -= safe;
    return false;
}

void api_stop_flush(api_stop *s, jsonfmt_buf *emit)
{
    if (s->matched < 0 && s->hold.len) jsonfmt_buf_append(emit, s->hold.p, s->hold.len);
    s->hold.len = 0;
}

/* ------------------------------------------------------------------ output */

static void api_out_dispatch(api_out *o, int i, api_op op, api_item *it, const char *d, size_t len)
{
    switch (o->kind) {
    case API_KIND_CHAT: api_chat_on(o, i, op, it, d, len); break;
    case API_KIND_RESPONSES: api_responses_on(o, i, op, it, d, len); break;
    default: api_messages_on(o, i, op, it, d, len); break;
    }
}

static void api_close_item(api_out *o, api_choice *c)
{
    if (!c->open) return;
    c->open = false;
    api_out_dispatch(o, c->index, API_OP_CLOSE, &c->items[c->n_items - 1], NULL, 0);
}

static api_item *api_open_item(api_out *o, api_choice *c, api_item_kind kind)
{
    api_close_item(o, c);
    if (c->n_items == c->cap_items) {
        c->cap_items = c->cap_items ? 2 * c->cap_items : 4;
        c->items = xrealloc(c->items, (size_t)c->cap_items * sizeof *c->items);
    }
    api_item *it = &c->items[c->n_items++];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    c->open = true;
    return it;
}

/* Appends text of a kind to the open item of that kind (opening one if needed). */
static void api_add_text(api_out *o, api_choice *c, api_item_kind kind, const char *d, size_t len)
{
    if (len == 0) return;
    api_item *it = (c->open && c->items[c->n_items - 1].kind == kind) ? &c->items[c->n_items - 1] : NULL;
    if (!it) {
        it = api_open_item(o, c, kind);
        api_out_dispatch(o, c->index, API_OP_OPEN, it, NULL, 0);
    }
    jsonfmt_buf_append(&it->text, d, len);
    api_out_dispatch(o, c->index, API_OP_DELTA, it, d, len);
}

static void api_on_event(void *ud, const events_event *e)
{
    api_choice *c = ud;
    api_out *o = c->owner;
    if (c->finished) return;
    if (c->stopped && e->kind != EVENTS_FINISH) return;
    switch (e->kind) {
    case EVENTS_TEXT:
        c->emit.len = 0;
        if (api_stop_feed(&c->stop, e->text, e->len, &c->emit)) {
            c->stopped = true;
            c->stop_index = c->stop.matched;
        }
        api_add_text(o, c, API_ITEM_TEXT, c->emit.p, c->emit.len);
        break;
    case EVENTS_REASONING:
        api_add_text(o, c, API_ITEM_REASONING, e->text, e->len);
        break;
    case EVENTS_TOOL_START: {
        /* Text held by the stop matcher belongs before the call. */
        c->emit.len = 0;
        api_stop_flush(&c->stop, &c->emit);
        api_add_text(o, c, API_ITEM_TEXT, c->emit.p, c->emit.len);
        api_item *it = api_open_item(o, c, API_ITEM_TOOL);
        snprintf(it->call_id, sizeof it->call_id, "%s", e->tool_id);
        it->name = xstrdup(e->tool_name ? e->tool_name : "");
        it->tool_index = c->n_calls++;
        api_out_dispatch(o, c->index, API_OP_OPEN, it, NULL, 0);
        break;
    }
    case EVENTS_TOOL_ARGS: {
        if (!c->open || c->items[c->n_items - 1].kind != API_ITEM_TOOL) break;
        api_item *it = &c->items[c->n_items - 1];
        jsonfmt_buf_append(&it->text, e->text, e->len);
        api_out_dispatch(o, c->index, API_OP_DELTA, it, e->text, e->len);
        break;
    }
    case EVENTS_TOOL_END:
        if (c->open && c->items[c->n_items - 1].kind == API_ITEM_TOOL) {
            api_item *it = &c->items[c->n_items - 1];
            if (it->text.len == 0 && e->text) jsonfmt_buf_append(&it->text, e->text, e->len);
            if (it->text.len == 0) jsonfmt_buf_puts(&it->text, "{}");
            api_close_item(o, c);
        }
        break;
    case EVENTS_FINISH:
        if (!c->stopped) {
            c->emit.len = 0;
            api_stop_flush(&c->stop, &c->emit);
            api_add_text(o, c, API_ITEM_TEXT, c->emit.p, c->emit.len);
        }
        if (c->n_items == 0) {
            /* Always answer with at least an (empty) text item. */
            api_item *it = api_open_item(o, c, API_ITEM_TEXT);
            jsonfmt_buf_puts(&it->text, "");
            api_out_dispatch(o, c->index, API_OP_OPEN, it, NULL, 0);
        }
        api_close_item(o, c);
        c->finished = true;
        c->finish = e->finish;
        if (c->stopped) c->finish = EVENTS_FINISH_STOP;
        api_out_dispatch(o, c->index, API_OP_FINISH, NULL, NULL, 0);
        break;
    }
}

void api_out_init(api_out *o, const api_req *req, const events_markers *m, uint64_t seed, const char *model_name)
{
    memset(o, 0, sizeof *o);
    o->kind = req->kind;
    o->req = req;
    o->model = model_name ? model_name : (req->model ? req->model : "");
    o->created = (int64_t)time(NULL);
    api_new_id(o->id, sizeof o->id,
                req->kind == API_KIND_CHAT ? "chatcmpl-" : req->kind == API_KIND_RESPONSES ? "resp_" : "msg_");
    o->n_choices = req->n > 0 ? req->n : 1;
    o->choices = xcalloc((size_t)o->n_choices, sizeof *o->choices);
    for (int i = 0; i < o->n_choices; i++) {
        api_choice *c = &o->choices[i];
        c->owner = o;
        c->index = i;
        c->ev = events_new(m, seed + (uint64_t)i * 7919u, api_on_event, c);
        api_stop_init(&c->stop, req->stop, req->n_stop);
        c->stop_index = -1;
        c->think_start = m->think_start;
        c->think_end = m->think_end;
        c->in_think = m->starts_in_reasoning;
    }
}

void api_out_free(api_out *o)
{
    for (int i = 0; i < o->n_choices; i++) {
        api_choice *c = &o->choices[i];
        events_free(c->ev);
        api_stop_free(&c->stop);
        jsonfmt_buf_free(&c->emit);
        for (int k = 0; k < c->n_items; k++) {
            free(c->items[k].name);
            jsonfmt_buf_free(&c->items[k].text);
        }
        free(c->items);
        free(c->token_ids);
        free(c->lps);
    }
    free(o->choices);
    jsonfmt_buf_free(&o->out);
    memset(o, 0, sizeof *o);
}

void api_out_set_prompt(api_out *o, int prompt_tokens, int cached_tokens, const int32_t *ids, int n_ids)
{
    o->usage.prompt_tokens = prompt_tokens;
    o->usage.cached_tokens = cached_tokens;
    o->prompt_ids = ids;
    o->n_prompt_ids = n_ids;
}

void api_out_begin(api_out *o)
{
    if (!o->req->stream) return;
    switch (o->kind) {
    case API_KIND_CHAT: api_chat_begin(o); break;
    case API_KIND_RESPONSES: api_responses_begin(o); break;
    default: api_messages_begin(o); break;
    }
}

void api_out_text(api_out *o, int i, const char *text, size_t len)
{
    api_choice *c = &o->choices[i];
    if (c->finished || len == 0) return;
    events_feed(c->ev, -1, text, len);
}

void api_out_count_token(api_out *o, int i)
{
    api_choice *c = &o->choices[i];
    c->n_tokens++;
    if (c->in_think) c->n_reasoning_tokens++;
}

bool api_out_token(api_out *o, int i, int32_t token, const char *text, size_t len, const api_logprob *lp)
{
    api_choice *c = &o->choices[i];
    if (c->finished) return true;
    c->n_tokens++;
    if (token == c->think_start && token >= 0) c->in_think = true;
    if (c->in_think) c->n_reasoning_tokens++;
    if (token == c->think_end && token >= 0) c->in_think = false;
    if (o->req->return_token_ids) {
        if (c->n_token_ids == c->cap_token_ids) {
            c->cap_token_ids = c->cap_token_ids ? 2 * c->cap_token_ids : 64;
            c->token_ids = xrealloc(c->token_ids, (size_t)c->cap_token_ids * sizeof *c->token_ids);
        }
        c->token_ids[c->n_token_ids++] = token;
    }
    if (o->req->logprobs && lp && !c->stopped) {
        if (c->n_lps == c->cap_lps) {
            c->cap_lps = c->cap_lps ? 2 * c->cap_lps : 32;
            c->lps = xrealloc(c->lps, (size_t)c->cap_lps * sizeof *c->lps);
        }
        api_lp_entry *en = &c->lps[c->n_lps++];
        memset(en, 0, sizeof *en);
        size_t n = o->piece ? o->piece(o->piece_ud, lp->token, en->text, sizeof en->text - 1) : 0;
        en->text[TM_MIN(n, sizeof en->text - 1)] = 0;
        en->logprob = lp->logprob;
        en->n_top = TM_MIN(lp->n_top, o->req->top_logprobs);
        for (int k = 0; k < en->n_top; k++) {
            n = o->piece ? o->piece(o->piece_ud, lp->top_token[k], en->top_text[k], 63) : 0;
            en->top_text[k][TM_MIN(n, 63)] = 0;
            en->top_logprob[k] = lp->top_logprob[k];
        }
    }
    events_feed(c->ev, token, text, len);
    return c->stopped;
}

void api_out_finish(api_out *o, int i, events_finish_reason reason)
{
    api_choice *c = &o->choices[i];
    if (c->finished) return;
    events_finish(c->ev, c->stopped ? EVENTS_FINISH_STOP : reason);
}

bool api_out_truncated(const api_out *o)
{
    for (int i = 0; i < o->n_choices; i++)
        if (o->choices[i].finish == EVENTS_FINISH_LENGTH) return true;
    return false;
}

void api_out_end(api_out *o)
{
    o->usage.completion_tokens = 0;
    o->usage.reasoning_tokens = 0;
    for (int i = 0; i < o->n_choices; i++) {
        o->usage.completion_tokens += o->choices[i].n_tokens;
        o->usage.reasoning_tokens += o->choices[i].n_reasoning_tokens;
    }
    switch (o->kind) {
    case API_KIND_CHAT: api_chat_end(o); break;
    case API_KIND_RESPONSES: api_responses_end(o); break;
    default: api_messages_end(o); break;
    }
}

/* ------------------------------------------------------------------ responses store */

typedef struct {
    char id[48];              /* response id ("" = free slot) */
    conv conv;                /* its conversation incl. the answer turn */
    uint64_t age;             /* insertion counter */
} api_store_entry;

struct api_store {
    pthread_mutex_t mu;       /* guards everything below */
    api_store_entry *e;       /* cap entries */
    int cap;
    uint64_t clock;
};

api_store *api_store_new(int max_entries)
{
    api_store *s = xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->cap = max_entries > 0 ? max_entries : 1;
    s->e = xcalloc((size_t)s->cap, sizeof *s->e);
    for (int i = 0; i < s->cap; i++) conv_init(&s->e[i].conv);
    return s;
}

void api_store_free(api_store *s)
{
    if (!s) return;
    for (int i = 0; i < s->cap; i++) conv_free(&s->e[i].conv);
    free(s->e);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Copies turns [from, src->n_turns) of src to the end of dst. */
static void api_conv_copy(conv *dst, const conv *src, int from)
{
    for (int t = from; t < src->n_turns; t++) {
        const conv_turn *ct = &src->turns[t];
        conv_add_turn(dst, ct->role);
        for (int k = 0; k < ct->n_parts; k++) {
            const conv_part *p = &ct->parts[k];
            switch (p->kind) {
            case CONV_PART_TEXT: conv_add_text(dst, p->text, p->len); break;
            case CONV_PART_REASONING: conv_add_reasoning(dst, p->text, p->len); break;
            case CONV_PART_TOOL_CALL: conv_add_tool_call(dst, p->id, p->name, p->args, p->args_len); break;
            case CONV_PART_TOOL_RESULT: conv_add_tool_result(dst, p->id, p->name, p->text, p->len); break;
            }
        }
    }
}

void api_store_put(api_store *s, const char *id, const api_req *req, const api_out *o)
{
    pthread_mutex_lock(&s->mu);
    int slot = 0;
    for (int i = 0; i < s->cap; i++) {
        if (!s->e[i].id[0]) { slot = i; break; }
        if (s->e[i].age < s->e[slot].age) slot = i;
    }
    api_store_entry *en = &s->e[slot];
    conv_free(&en->conv);
    conv_init(&en->conv);
    snprintf(en->id, sizeof en->id, "%s", id);
    en->age = ++s->clock;
    api_conv_copy(&en->conv, &req->conv, req->instructions ? 1 : 0);
    /* The answer: reasoning, text and tool calls of choice 0 as one assistant turn. */
    const api_choice *c = &o->choices[0];
    conv_add_turn(&en->conv, CONV_ROLE_ASSISTANT);
    for (int k = 0; k < c->n_items; k++) {
        const api_item *it = &c->items[k];
        if (it->kind == API_ITEM_REASONING) conv_add_reasoning(&en->conv, it->text.p ? it->text.p : "", it->text.len);
    }
    for (int k = 0; k < c->n_items; k++) {
        const api_item *it = &c->items[k];
        if (it->kind == API_ITEM_TEXT) conv_add_text(&en->conv, it->text.p ? it->text.p : "", it->text.len);
    }
    for (int k = 0; k < c->n_items; k++) {
        const api_item *it = &c->items[k];
        if (it->kind == API_ITEM_TOOL) conv_add_tool_call(&en->conv, it->call_id, it->name, it->text.p, it->text.len);
    }
    pthread_mutex_unlock(&s->mu);
}

bool api_store_get(api_store *s, const char *id, conv *c)
{
    bool found = false;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->cap; i++)
        if (s->e[i].id[0] && !strcmp(s->e[i].id, id)) {
            api_conv_copy(c, &s->e[i].conv, 0);
            found = true;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return found;
}

/* ------------------------------------------------------------------ serving */

#include "recipe/template.h"
#include "recipe/tokenizer.h"

/* End-of-generation ids of the vocabulary (every request stops on them), found once. */
static int32_t api_eog_ids[SCHED_MAX_STOP_IDS];
static int api_n_eog_ids = -1;
static pthread_mutex_t api_eog_mu = PTHREAD_MUTEX_INITIALIZER;

static void api_find_eog(const tokenizer *tok)
{
    pthread_mutex_lock(&api_eog_mu);
    if (api_n_eog_ids < 0) {
        int n = 0;
        int32_t nv = tokenizer_n_vocab(tok);
        for (int32_t id = 0; id < nv && n < SCHED_MAX_STOP_IDS; id++)
            if (tokenizer_is_eog(tok, id)) api_eog_ids[n++] = id;
        api_n_eog_ids = n;
    }
    pthread_mutex_unlock(&api_eog_mu);
}

typedef struct {
    const api_ctx *c;
    api_kind kind;
    api_req req;                        /* the parsed request */
    api_out out;                        /* its output state */
    template_prompt prompt;             /* rendered prompt ids */
    sched_req *sreq[API_MAX_N];         /* one scheduler request per choice (NULL: released) */
    tokenizer_stream ts[API_MAX_N];     /* detokenizer per choice */
    bool fin[API_MAX_N];                /* FINISH seen */
    int n;                              /* choices submitted */
    bool error;                         /* the engine failed a request */
    bool ended;                         /* the closing events / body were written */
    bool begun;                         /* streaming: the opening events were written */
    char piece[1024];                   /* scratch: one token's text */
} api_job;

static void api_job_free(api_job *j)
{
    for (int i = 0; i < j->n; i++)
        if (j->sreq[i]) api_be_release(j->c, j->sreq[i]);
    api_out_free(&j->out);
    template_prompt_free(&j->prompt);
    api_req_free(&j->req);
    free(j);
}

static size_t api_job_piece(void *ud, int32_t token, char *buf, size_t cap)
{
    api_job *j = ud;
    int n = tokenizer_token_to_piece(j->c->tok, token, buf, (int)cap, true);
    return n < 0 || (size_t)n > cap ? 0 : (size_t)n;
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
        size_t n = tokenizer_stream_flush(&j->ts[i], j->piece, sizeof j->piece);
        if (n <= sizeof j->piece) api_out_text(o, i, j->piece, n);
        if (so->finish == SCHED_FINISH_ERROR) j->error = true;
        if (i == 0)
            api_out_set_prompt(o, so->usage.prompt_tokens ? so->usage.prompt_tokens : (int)j->prompt.n_ids,
                               so->usage.cached_tokens, j->prompt.ids, (int)j->prompt.n_ids);
        api_out_finish(o, i, so->finish == SCHED_FINISH_LENGTH ? EVENTS_FINISH_LENGTH : EVENTS_FINISH_STOP);
        return;
    }
    if (so->is_stop) {
        api_out_count_token(o, i);
        return;
    }
    char *text = j->piece, *big = NULL;
    size_t n = tokenizer_stream_push(&j->ts[i], so->token, text, sizeof j->piece);
    if (n > sizeof j->piece) { /* a piece longer than the scratch: some vocabularies have them */
        text = big = xmalloc(n);
        n = tokenizer_stream_push(&j->ts[i], so->token, big, n);
    }
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
    bool stop = api_out_token(o, i, so->token, text, n, lpp);
    free(big);
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

static void api_job_error_body(api_job *j, jsonfmt_buf *b)
{
    api_error e;
    api_error_set(&e, 500, NULL, NULL, "The request failed in the engine (the KV cache may be too small for it).");
    api_error_json(j->kind, &e, b);
}

static bool api_job_pull(void *ctx, http_buf *outb, int timeout_ms)
{
    api_job *j = ctx;
    if (j->ended) return false;
    api_job_pump(j, timeout_ms);
    if (api_job_all_finished(j)) {
        if (j->error) {
            jsonfmt_buf b = {0};
            api_job_error_body(j, &b);
            api_sse(&j->out.out, j->kind == API_KIND_MESSAGES ? "error" : NULL, b.p, b.len);
            jsonfmt_buf_free(&b);
        } else {
            api_out_end(&j->out);
        }
        j->ended = true;
    }
    if (j->out.out.len) {
        http_buf_append(outb, j->out.out.p, j->out.out.len);
        j->out.out.len = 0;
    }
    return !j->ended;
}

static void api_job_done(void *ctx, bool client_gone)
{
    (void)client_gone;
    api_job_free(ctx); /* releases, and so cancels, what still runs: its KV blocks are freed */
}

static void api_respond_error(http_request *r, api_kind kind, const api_error *e)
{
    jsonfmt_buf b = {0};
    api_error_json(kind, e, &b);
    http_respond(r, e->status, "application/json", b.p, b.len);
    jsonfmt_buf_free(&b);
}

static void api_respond_buf(http_request *r, int status, const jsonfmt_buf *b)
{
    http_respond(r, status, "application/json", b->p ? b->p : "", b->len);
}

void api_serve(http_request *r, const api_ctx *c, api_kind kind, bool count_only, api_store *store)
{
    if (kind == API_KIND_MESSAGES ? !api_anthropic_auth(r) : !api_openai_auth(r)) return;
    api_find_eog(c->tok);
    api_job *j = xcalloc(1, sizeof *j);
    j->c = c;
    j->kind = kind;
    api_req_init(&j->req, kind);
    api_error e;
    memset(&e, 0, sizeof e);
    api_cfg cfg = {c->model_name, c->model_alias, store};
    size_t blen;
    const char *body = http_request_body(r, &blen);
    api_status st = count_only ? api_messages_count_parse(&cfg, body, blen, &j->req, &e)
                               : api_parse(&cfg, kind, body, blen, &j->req, &e);
    if (st != API_OK) {
        api_respond_error(r, kind, &e);
        api_job_free(j);
        return;
    }
    if (!c->tmpl) {
        api_error_set(&e, 500, NULL, NULL, "This server has no chat template for its model.");
        api_respond_error(r, kind, &e);
        api_job_free(j);
        return;
    }
    char err[256] = "";
    template_status ts = template_apply(c->tmpl, &j->req.conv, c->n_threads, &j->prompt, err, sizeof err);
    if (ts != TEMPLATE_OK) {
        api_error_set(&e, ts == TEMPLATE_ERR_TOKENIZE ? 500 : 400, "messages", NULL, "The conversation cannot be rendered: %s",
                      err[0] ? err : "template error");
        api_respond_error(r, kind, &e);
        api_job_free(j);
        return;
    }
    int n_prompt = (int)j->prompt.n_ids;
    jsonfmt_buf b = {0};
    if (count_only) {
        api_buf_printf(&b, "{\"input_tokens\":%d", n_prompt);
        if (j->req.return_token_ids) {
            jsonfmt_buf_puts(&b, ",\"prompt_token_ids\":[");
            for (int k = 0; k < n_prompt; k++) api_buf_printf(&b, "%s%d", k ? "," : "", j->prompt.ids[k]);
            jsonfmt_buf_putc(&b, ']');
        }
        jsonfmt_buf_putc(&b, '}');
        api_respond_buf(r, 200, &b);
        jsonfmt_buf_free(&b);
        api_job_free(j);
        return;
    }
    if (n_prompt >= c->n_ctx) {
        if (kind == API_KIND_MESSAGES) api_anthropic_submit_error(r, c, SCHED_ERR_TOO_LONG, n_prompt, 0);
        else api_openai_submit_error(r, c, SCHED_ERR_TOO_LONG, n_prompt, 0);
        api_job_free(j);
        return;
    }
    api_tenancy tn;
    if (!api_tenancy_of(r, c, j->req.cache_salt, j->req.cache_class, &tn, &e)) {
        api_respond_error(r, kind, &e);
        api_job_free(j);
        return;
    }
    events_markers mk;
    template_markers(c->tmpl, &j->req.conv, &mk);
    api_out_init(&j->out, &j->req, &mk, j->req.sp.seed ^ 0x5DEECE66Dull, c->model_name);
    j->out.piece = api_job_piece;
    j->out.piece_ud = j;
    api_out_set_prompt(&j->out, n_prompt, 0, j->prompt.ids, n_prompt);
    sched_params sp = {.prompt = j->prompt.ids, .n_prompt = n_prompt, .sample = j->req.sp, .max_tokens = j->req.max_tokens};
    for (int k = 0; k < api_n_eog_ids; k++) sp.stop_ids[sp.n_stop_ids++] = api_eog_ids[k];
    sp.logprobs = j->req.logprobs;
    sp.top_logprobs = TM_MIN(j->req.top_logprobs, SCHED_MAX_TOP_LOGPROBS);
    sp.cache_salt = tn.salt;
    sp.cache_class = tn.cls;
    if (j->req.thinking_budget > 0 && mk.think_end >= 0) {  /* enforced by the scheduler */
        sp.think_budget = j->req.thinking_budget;
        sp.think_start = mk.think_start;
        sp.think_end = mk.think_end;
        sp.think_open = mk.starts_in_reasoning;
    }
    for (int i = 0; i < j->out.n_choices; i++) {
        sp.sample.seed = j->req.sp.seed + (uint64_t)i;
        sched_status ss = api_be_submit(c, &sp, &j->sreq[i]);
        if (ss != SCHED_OK) {
            if (kind == API_KIND_MESSAGES) api_anthropic_submit_error(r, c, ss, n_prompt, 0);
            else api_openai_submit_error(r, c, ss, n_prompt, 0);
            api_job_free(j);
            return;
        }
        j->n = i + 1;
        tokenizer_stream_init(&j->ts[i], c->tok);
        j->ts[i].prev = j->prompt.ids[n_prompt - 1]; /* mid-text: no BOS space rule */
    }
    if (j->req.stream) {
        if (kind != API_KIND_MESSAGES) {  /* Messages begins at the first record (api_job_apply) */
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
        double now = util_now();  /* check the socket every 50 ms, also while tokens flow */
        if (now - t_check < 0.05) continue;
        t_check = now;
        if (http_request_client_gone(r)) {
            api_job_free(j);
            http_respond(r, 499, "application/json", "{}", 2);
            return;
        }
    }
    if (j->error) {
        api_job_error_body(j, &b);
        http_respond(r, 500, "application/json", b.p, b.len);
    } else {
        api_out_end(&j->out);
        api_respond_buf(r, 200, &j->out.out);
    }
    jsonfmt_buf_free(&b);
    api_job_free(j);
}
