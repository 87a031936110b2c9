/*
 * api_json: reading requests. The JSON checks the parsers of every API share (api_int.h):
 * the body's loader (bounds, UTF-8, syntax, a top-level object), typed member readers that
 * word their errors as the route's vendor does, the shared fields (model, stop, cache,
 * user, stream_options, logit_bias, text parts, response formats); the errors in both vendors'
 * shapes; and api_req's life cycle and dispatch to each API's parser. The grammars of tool
 * calls are api_tools.c's.
 */
#include "recipe/api.h"
#include "recipe/api_http.h"
#include "recipe/api_int.h"

#include <jansson.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/unicode.h"
#include "util/util.h"

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

/* One table of Anthropic error types for the HTTP layer and the routes. */
static const char *api_anthropic_type(int status) { return api_http_anthropic_type(status); }

void api_error_body(bytebuf *out, bool anthropic, const char *type, const char *message, const char *param,
                    const char *code)
{
    if (anthropic) {
        bytebuf_puts(out, "{\"type\":\"error\",\"error\":{\"type\":");
        api_buf_str(out, type);
        bytebuf_puts(out, ",\"message\":");
        api_buf_str(out, message);
        bytebuf_puts(out, "}}");
        return;
    }
    bytebuf_puts(out, "{\"error\":{\"message\":");
    api_buf_str(out, message);
    bytebuf_puts(out, ",\"type\":");
    api_buf_str(out, type);
    bytebuf_puts(out, ",\"param\":");
    api_buf_str(out, param);
    bytebuf_puts(out, ",\"code\":");
    api_buf_str(out, code);
    bytebuf_puts(out, "}}");
}

void api_error_json(api_kind kind, const api_error *e, bytebuf *out)
{
    if (kind == API_KIND_MESSAGES) api_error_body(out, true, api_anthropic_type(e->status), e->message, NULL, NULL);
    else
        api_error_body(out, false, e->type[0] ? e->type : "invalid_request_error", e->message,
                       e->param[0] ? e->param : NULL, e->code[0] ? e->code : NULL);
}

/* ------------------------------------------------------------------ JSON checks */

bool api_json_load(api_kind kind, const char *body, size_t len, json_t **root, api_error *e)
{
    *root = NULL;
    /* Measured before anything recursive reads it (see jsonfmt_scan): past here no reader
     * meets more than JSONFMT_MAX_DEPTH levels, whatever field the nesting sits in. */
    jsonfmt_scan_status sc = jsonfmt_scan(body, len, JSONFMT_MAX_DEPTH, JSONFMT_MAX_VALUES, NULL, NULL);
    if (sc != JSONFMT_SCAN_OK) {
        char what[96];
        if (sc == JSONFMT_SCAN_TOO_DEEP)
            snprintf(what, sizeof what, "nests arrays and objects more than %d levels deep", JSONFMT_MAX_DEPTH);
        else
            snprintf(what, sizeof what, "has more than %u values", JSONFMT_MAX_VALUES);
        if (kind == API_KIND_MESSAGES)
            api_error_set(e, 400, NULL, NULL, "There was an error parsing the body: the JSON %s, the limit", what);
        else
            api_error_set(e, 400, NULL, sc == JSONFMT_SCAN_TOO_DEEP ? "json_too_deep" : "json_too_large",
                          "The JSON body of your request %s, the limit.", what);
        return false;
    }
    if (!unicode_utf8_valid(body, len)) {
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

bool api_json_item(api_kind kind, const char *base, size_t i, json_t *v, char *p, size_t cap, api_error *e)
{
    snprintf(p, cap, "%s[%zu]", base, i);
    if (json_is_object(v)) return true;
    api_json_type_error(kind, e, p, kind == API_KIND_MESSAGES ? "a valid dictionary" : "an object", v);
    return false;
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
    else if (json_is_real(v) && (d < -0x1p63 || d >= 0x1p63) && d == d) x = d < 0 ? LLONG_MIN : LLONG_MAX, beyond = true;
    else {
        api_json_type_error(kind, e, key, kind == API_KIND_MESSAGES ? "a valid integer" : "an integer", v);
        return -1;
    }
    if (beyond || x < lo || x > hi) {
        if (kind == API_KIND_MESSAGES)
            api_error_set(e, 400, key, NULL, "%s: Input should be %s %lld", key, x < lo ? "greater than or equal to" : "less than or equal to",
                          x < lo ? lo : hi);
        else
            api_error_set(e, 400, key, x < lo ? "integer_below_min_value" : "integer_above_max_value",
                          "Invalid '%s': integer %s %s value. Expected a value %s %lld, but got %lld instead.", key,
                          x < lo ? "below" : "above", x < lo ? "minimum" : "maximum", x < lo ? ">=" : "<=",
                          x < lo ? lo : hi, x);
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

/* The path of a tool's field into q: p + "." + prefix + field. */
static const char *api_json_tool_path(char *q, size_t cap, const char *p, const char *prefix, const char *field)
{
    char key[64];
    snprintf(key, sizeof key, "%s%s", prefix, field);
    return api_path(q, cap, p, key, -1);
}

bool api_json_tool(api_kind kind, json_t *fn, const char *p, const char *prefix, conv *c, api_error *e)
{
    bool anth = kind == API_KIND_MESSAGES;   /* "a valid ..." words, input_schema required */
    const char *schema_key = anth ? "input_schema" : "parameters";
    json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
           *schema = json_object_get(fn, schema_key), *strict = json_object_get(fn, "strict");
    char q[192];
    if (!json_is_string(name) || json_string_length(name) == 0) {
        api_json_tool_path(q, sizeof q, p, prefix, "name");
        if (kind != API_KIND_CHAT) api_json_bad(kind, e, q, anth ? "a valid non-empty string" : "a non-empty string", name);
        else if (!name) api_json_missing(kind, e, q);
        else if (!json_is_string(name)) api_json_type_error(kind, e, q, "a string", name);
        else api_json_value_error(kind, e, q, "empty string.");
        return false;
    }
    if (desc && !json_is_null(desc) && !json_is_string(desc)) {
        api_json_tool_path(q, sizeof q, p, prefix, "description");
        api_json_type_error(kind, e, q, anth ? "a valid string" : "a string", desc);
        return false;
    }
    if (anth ? !json_is_object(schema) : schema && !json_is_null(schema) && !json_is_object(schema)) {
        api_json_tool_path(q, sizeof q, p, prefix, schema_key);
        if (anth) api_json_bad(kind, e, q, "a valid dictionary", schema);
        else api_json_type_error(kind, e, q, "an object", schema);
        return false;
    }
    if (strict && !json_is_null(strict) && !json_is_boolean(strict)) {
        api_json_tool_path(q, sizeof q, p, prefix, "strict");
        api_json_type_error(kind, e, q, anth ? "a valid boolean" : "a boolean", strict);
        return false;
    }
    char *pj = json_is_object(schema) ? api_json_dump(schema) : NULL;
    conv_add_tool(c, json_string_value(name), json_is_string(desc) ? json_string_value(desc) : NULL, pj);
    c->tools[c->n_tools - 1].strict = json_is_true(strict);
    free(pj);
    return true;
}

bool api_json_tool_choice_word(const char *v, api_req *r, api_error *e)
{
    if (!strcmp(v, "none")) r->tools_mode = API_TOOLS_NONE;
    else if (!strcmp(v, "required")) r->tools_mode = API_TOOLS_REQUIRED;
    else if (!strcmp(v, "auto")) r->tools_mode = API_TOOLS_AUTO;
    else {
        api_error_set(e, 400, "tool_choice", "invalid_value",
                      "Invalid value: '%.64s'. Supported values are: 'none', 'auto', and 'required'.", v);
        return false;
    }
    return true;
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

bool api_json_sampling(api_kind kind, json_t *root, const api_cfg *cfg, api_req *r, api_error *e)
{
    double x;
    long long k;
    int st;
    if ((st = api_json_num(kind, root, "temperature", 0, 2, &x, e)) < 0) return false;
    if (st) r->sp.temp = (float)x;
    if ((st = api_json_num(kind, root, "top_p", 0, 1, &x, e)) < 0) return false;
    if (st) r->sp.top_p = (float)x;
    if ((st = api_json_int(kind, root, "top_k", -1, 1 << 30, &k, e)) < 0) return false;
    if (st) r->sp.top_k = (int)k;
    if ((st = api_json_num(kind, root, "min_p", 0, 1, &x, e)) < 0) return false;
    if (st) r->sp.min_p = (float)x;
    if ((st = api_json_num(kind, root, "presence_penalty", -2, 2, &x, e)) < 0) return false;
    if (st) r->sp.presence_penalty = (float)x;
    if ((st = api_json_num(kind, root, "frequency_penalty", -2, 2, &x, e)) < 0) return false;
    if (st) r->sp.frequency_penalty = (float)x;
    /* llama.cpp's name and vLLM's (the route's key list admits the ones it knows) */
    static const char *const rep[] = {"repeat_penalty", "repetition_penalty"};
    for (int i = 0; i < 2; i++) {
        if ((st = api_json_num(kind, root, rep[i], 0.01, 10, &x, e)) < 0) return false;
        if (st) r->sp.repeat_penalty = (float)x;
    }
    if (r->sp.presence_penalty != 0 || r->sp.frequency_penalty != 0 || r->sp.repeat_penalty != 1)
        r->sp.penalty_last_n = 64;
    if ((st = api_json_int(kind, root, "seed", -(1LL << 62), 1LL << 62, &k, e)) < 0) return false;
    if (st) {
        r->sp.seed = (uint64_t)k;
        r->seed_given = true;
    }
    return api_json_logit_bias(kind, root, cfg ? cfg->n_vocab : 0, &r->sp, e);
}

bool api_json_logit_bias(api_kind kind, json_t *root, int n_vocab, sample_params *sp, api_error *e)
{
    json_t *lb = json_object_get(root, "logit_bias");
    sp->n_bias = 0;
    if (!lb || json_is_null(lb)) return true;
    if (!json_is_object(lb)) {
        api_json_type_error(kind, e, "logit_bias", "an object", lb);
        return false;
    }
    if (json_object_size(lb) > SAMPLE_MAX_BIAS) {
        api_json_value_error(kind, e, "logit_bias", "at most %d tokens may be biased, got %zu.", SAMPLE_MAX_BIAS,
                             json_object_size(lb));
        return false;
    }
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX || (n_vocab > 0 && id >= n_vocab)) {
            api_error_set(e, 400, "logit_bias", "invalid_value",
                          "Invalid key in 'logit_bias': '%.40s'. Keys must be token ids of this model's vocabulary "
                          "(integers from 0 to %d, as strings).", key, n_vocab > 0 ? n_vocab - 1 : INT32_MAX);
            return false;
        }
        char path[80];
        snprintf(path, sizeof path, "logit_bias.%s", key);
        if (!json_is_number(v)) {
            api_json_type_error(kind, e, path, "a number", v);
            return false;
        }
        double b = json_number_value(v);
        if (!(b >= -100 && b <= 100)) {
            api_json_value_error(kind, e, path, "a bias must be between -100 and 100, got %g.", b);
            return false;
        }
        sp->bias_id[sp->n_bias] = (int32_t)id;
        sp->bias[sp->n_bias++] = (float)b;
    }
    return true;
}

bool api_json_user(api_kind kind, json_t *root, api_req *r, api_error *e)
{
    const char *z;
    int st = api_json_str(kind, root, "user", &z, e);
    if (st > 0) r->user = xstrdup(z);
    return st >= 0;
}

bool api_json_stream_options(api_kind kind, json_t *root, api_req *r, api_error *e)
{
    json_t *so = json_object_get(root, "stream_options");
    if (!so || json_is_null(so)) return true;
    if (!json_is_object(so)) {
        api_json_type_error(kind, e, "stream_options", "an object", so);
        return false;
    }
    if (!r->stream) {
        api_error_set(e, 400, "stream_options", "invalid_value",
                      "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
        return false;
    }
    static const char *const known[] = {"include_usage", "include_obfuscation", NULL};
    if (!api_json_known(kind, so, known, "stream_options", e)) return false;
    char path[40] = "stream_options.include_usage";
    bool b;
    int st = api_json_bool(kind, so, "include_usage", &b, e);
    if (st < 0) {
        snprintf(e->param, sizeof e->param, "%s", path);
        return false;
    }
    if (st) r->include_usage = b;
    return api_json_bool(kind, so, "include_obfuscation", &b, e) >= 0;
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

/* The vendors' words for a content value made of text parts, by API (api_json_parts_text). */
typedef struct {
    const char *want_value;     /* expected type of the value: "a string or an array of content parts" */
    const char *want_part;      /* of each part: "an object" / "a valid dictionary" */
    const char *want_text;      /* of a part's text member: "a string" / "a valid string" */
    const char *unsupported;    /* format with one %s (the part's type) for a part that is not text */
    const char *const *types;   /* the accepted part types (NULL-terminated); "refusal" reads its
                                 * member "refusal", every other type its member "text" */
    bool type_required;         /* a part without a string "type" is a missing field (else it is
                                 * an unsupported type "") */
    const char *sep;            /* put between the parts' texts ("" or "\n") */
} api_parts_words;

static const char *const api_chat_text_types[] = {"text", "input_text", "refusal", NULL};
static const char *const api_responses_text_types[] = {"input_text", "output_text", "text", "reasoning_text",
                                                       "summary_text", "refusal", NULL};
static const char *const api_messages_text_types[] = {"text", NULL};
static const api_parts_words api_parts_words_of[] = {
    /* chat: joined with nothing between, as the reference templates join them */
    [API_KIND_CHAT] = {"a string or an array of content parts", "an object", "a string",
                       "content part type '%s' is not supported by this model (text only).", api_chat_text_types, true, ""},
    [API_KIND_RESPONSES] = {"a string or an array of content parts", "an object", "a string",
                            "content part type '%s' is not supported by this model (text only).", api_responses_text_types,
                            false, ""},
    /* tool_result content or system: a list of text blocks, joined by newlines */
    [API_KIND_MESSAGES] = {"a valid string or a valid list", "a valid dictionary", "a valid string",
                           "content blocks of type '%s' are not supported here (text only)", api_messages_text_types, false, "\n"},
};

char *api_json_parts_text(api_kind kind, json_t *v, const char *path, api_error *e)
{
    const api_parts_words *w = &api_parts_words_of[kind];
    if (!w->want_value) w = &api_parts_words_of[API_KIND_CHAT];   /* completions: OpenAI's words */
    if (json_is_string(v)) return xstrdup(json_string_value(v));
    if (!json_is_array(v)) {
        api_json_type_error(kind, e, path, w->want_value, v);
        return NULL;
    }
    bytebuf all = {0};
    bytebuf_puts(&all, "");
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
        if (i) bytebuf_puts(&all, w->sep);
        bytebuf_append(&all, json_string_value(tx), json_string_length(tx));
    }
    return all.p;
fail:
    bytebuf_free(&all);
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
    r->fmt_kind = -1;
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
    free(r->user);
    free(r->prompt_text);
    free(r->prompt_ids);
    free(r->fmt_src);
    free(r->tool_name);
    free(r->format_json);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------ structured output */

/* Sets r's format; src is taken (malloc'd, or NULL for the JSON kind). */
static void api_set_format(api_req *r, grammar_kind kind, char *src, size_t len, const char *param)
{
    free(r->fmt_src);
    r->fmt_kind = (int)kind;
    r->fmt_src = src;
    r->fmt_len = len;
    snprintf(r->fmt_param, sizeof r->fmt_param, "%.*s", (int)sizeof r->fmt_param - 1, param);
}

bool api_json_format(api_kind kind, json_t *fmt, const char *path, bool flat, api_req *r, api_error *e)
{
    char p[64];
    if (!fmt || json_is_null(fmt)) return true;
    if (!json_is_object(fmt)) {
        api_json_type_error(kind, e, path, "an object", fmt);
        return false;
    }
    json_t *t = json_object_get(fmt, "type");
    snprintf(p, sizeof p, "%.40s.type", path);
    if (!json_is_string(t)) {
        api_json_bad(kind, e, p, "a string", t);
        return false;
    }
    const char *ts = json_string_value(t);
    if (!strcmp(ts, "text")) return true;
    if (!strcmp(ts, "json_object")) {
        /* llama.cpp's server also takes a schema here */
        json_t *sc = json_object_get(fmt, "schema");
        if (json_is_object(sc)) {
            char *src = api_json_dump(sc);
            api_set_format(r, GRAMMAR_KIND_SCHEMA, src, strlen(src), path);
        } else {
            api_set_format(r, GRAMMAR_KIND_JSON, NULL, 0, path);
        }
        return true;
    }
    if (strcmp(ts, "json_schema")) {
        api_error_set(e, 400, p, "invalid_value",
                      "Invalid value: '%.64s'. Supported values are: 'text', 'json_object', and 'json_schema'.", ts);
        return false;
    }
    json_t *js = fmt;
    const char *jpath = path;
    char q[64], sp[80], nm[80];
    if (!flat) {
        js = json_object_get(fmt, "json_schema");
        snprintf(q, sizeof q, "%.40s.json_schema", path);
        jpath = q;
        if (!json_is_object(js)) {
            api_json_bad(kind, e, jpath, "an object", js);
            return false;
        }
    }
    json_t *sc = json_object_get(js, "schema");
    snprintf(sp, sizeof sp, "%.60s.schema", jpath);
    if (!json_is_object(sc) && !json_is_boolean(sc)) {
        api_json_bad(kind, e, sp, "an object", sc);
        return false;
    }
    json_t *name = json_object_get(js, "name");
    if (name && !json_is_null(name) && !json_is_string(name)) {
        snprintf(nm, sizeof nm, "%.60s.name", jpath);
        api_json_type_error(kind, e, nm, "a string", name);
        return false;
    }
    bool strict;
    if (api_json_bool(kind, js, "strict", &strict, e) < 0) return false;
    char *src = api_json_dump(sc);
    api_set_format(r, GRAMMAR_KIND_SCHEMA, src, strlen(src), sp);
    return true;
}

/* Appends s[0..len) as a GBNF string literal (llama.cpp's escapes). */
void api_json_gbnf_literal(bytebuf *b, const char *s, size_t len)
{
    bytebuf_putc(b, '"');
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') bytebuf_printf(b, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) bytebuf_printf(b, "\\x%02X", ch);
        else bytebuf_putc(b, (char)ch);
    }
    bytebuf_putc(b, '"');
}

bool api_json_guided(api_kind kind, json_t *root, api_req *r, api_error *e)
{
    static const char *const keys[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                       "json_schema", "grammar", NULL};
    const char *given = NULL;
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(root, keys[i]);
        if (!v || json_is_null(v)) continue;
        if (given || r->fmt_kind >= 0) {
            api_json_value_error(kind, e, keys[i], "only one output format may be given (%s is set too).",
                                 given ? given : r->fmt_param);
            return false;
        }
        given = keys[i];
        bool schema = !strcmp(keys[i], "guided_json") || !strcmp(keys[i], "json_schema");
        if (schema && (json_is_object(v) || json_is_boolean(v))) {
            char *src = api_json_dump(v);
            api_set_format(r, GRAMMAR_KIND_SCHEMA, src, strlen(src), keys[i]);
        } else if (!strcmp(keys[i], "guided_choice")) {
            size_t k;
            json_t *c;
            if (!json_is_array(v) || json_array_size(v) == 0) {
                api_json_value_error(kind, e, keys[i], "expected a non-empty array of strings.");
                return false;
            }
            bytebuf b = {0};
            bytebuf_puts(&b, "root ::= ");
            json_array_foreach(v, k, c) {
                if (!json_is_string(c)) {
                    char q[64];
                    snprintf(q, sizeof q, "%s[%d]", keys[i], (int)k);
                    api_json_type_error(kind, e, q, "a string", c);
                    bytebuf_free(&b);
                    return false;
                }
                if (k) bytebuf_puts(&b, " | ");
                api_json_gbnf_literal(&b, json_string_value(c), json_string_length(c));
            }
            bytebuf_putc(&b, '\n');
            size_t n = b.len;
            api_set_format(r, GRAMMAR_KIND_GBNF, b.p, n, keys[i]);
        } else if (json_is_string(v)) {
            /* a schema may come as JSON text (vLLM) */
            grammar_kind gk = schema ? GRAMMAR_KIND_SCHEMA : !strcmp(keys[i], "guided_regex") ? GRAMMAR_KIND_REGEX
                                                                                             : GRAMMAR_KIND_GBNF;
            size_t n = json_string_length(v);
            char *src = xmalloc(n + 1);
            memcpy(src, json_string_value(v), n + 1);
            api_set_format(r, gk, src, n, keys[i]);
        } else {
            api_json_type_error(kind, e, keys[i], schema ? "an object" : "a string", v);
            return false;
        }
    }
    return true;
}

const api_format *api_format_of(api_kind kind)
{
    switch (kind) {
    case API_KIND_CHAT: return &api_chat_format;
    case API_KIND_RESPONSES: return &api_responses_format;
    case API_KIND_COMPLETIONS: return &api_completions_format;
    case API_KIND_MESSAGES: break;
    }
    return &api_messages_format;
}

api_status api_parse(const api_cfg *cfg, api_kind kind, const char *body, size_t len, api_req *r, api_error *e)
{
    return api_format_of(kind)->parse(cfg, body, len, r, e);
}

