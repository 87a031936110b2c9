/*
 * api_chat: OpenAI Chat Completions (POST /v1/chat/completions).
 *
 * Request -> conv: each message becomes one turn (system, developer, user, assistant, tool);
 * content is a string or an array of text parts (other part types are rejected: this server
 * reads text only); an assistant's `reasoning_content` becomes a reasoning part and its
 * `tool_calls` tool-call parts; a tool message is a tool turn with one result part. Unknown
 * top-level fields are rejected as OpenAI does ("Unrecognized request argument supplied").
 * Extensions accepted: top_k, min_p, repetition_penalty, chat_template_kwargs (enable_thinking;
 * every member a variable of a Jinja template),
 * thinking {type, budget_tokens} (as Anthropic's: the reasoning is closed after that many
 * tokens, see sched.h), return_token_ids, and the structured-output fields of vLLM (guided_json,
 * guided_regex, guided_choice, guided_grammar) and llama.cpp (json_schema, grammar) next to
 * response_format (STRUCTURED OUTPUT in api.h).
 *
 * Output: a chat.completion object, or chat.completion.chunk SSE events: a role chunk per
 * choice, then content / reasoning_content / tool_calls deltas, a finish_reason chunk per
 * choice, the usage chunk when stream_options.include_usage, and `data: [DONE]`.
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static const char *const api_chat_keys[] = {
    "model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
    "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "service_tier", "stop", "stream",
    "stream_options", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "user", "metadata",
    "store", "reasoning_effort", "modalities", "prediction", "audio", "web_search_options", "functions",
    "function_call", "safety_identifier", "prompt_cache_key", "verbosity",
    /* extensions (vLLM / llama.cpp / DeepSeek) */
    "top_k", "min_p", "repetition_penalty", "chat_template_kwargs", "thinking", "return_token_ids", "cache_salt",
    "cache_class", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "json_schema", "grammar", NULL};

/* Appends the text of a content value (string or array of text parts, joined with nothing
 * between as the reference templates join them) to the last turn as one text part. Returns
 * false with e filled on a bad value. */
static bool api_chat_content(conv *c, json_t *content, const char *path, bool as_result, const char *call_id,
                             api_error *e)
{
    char *text = api_json_parts_text(API_KIND_CHAT, content, path, e);
    if (!text) return false;
    if (as_result) conv_add_tool_result(c, call_id, NULL, text, strlen(text));
    else conv_add_text(c, text, strlen(text));
    free(text);
    return true;
}

static bool api_chat_tool_calls(conv *c, json_t *tcs, const char *path, api_error *e)
{
    char p[96], q[128];
    if (!json_is_array(tcs)) {
        api_json_type_error(API_KIND_CHAT, e, path, "an array", tcs);
        return false;
    }
    size_t i;
    json_t *tc;
    json_array_foreach(tcs, i, tc) {
        if (!api_json_item(API_KIND_CHAT, path, i, tc, p, sizeof p, e)) return false;
        json_t *fn = json_object_get(tc, "function");
        if (!json_is_object(fn)) {
            api_path(q, sizeof q, p, "function", -1);
            api_json_bad(API_KIND_CHAT, e, q, "an object", fn);
            return false;
        }
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments"),
               *id = json_object_get(tc, "id");
        if (!json_is_string(name)) {
            api_path(q, sizeof q, p, "function.name", -1);
            api_json_bad(API_KIND_CHAT, e, q, "a string", name);
            return false;
        }
        const char *a = "{}";
        size_t alen = 2;
        char *dumped = NULL;
        if (json_is_string(args)) {
            a = json_string_value(args);
            alen = json_string_length(args);
            if (!jsonfmt_valid(a, alen)) {
                api_path(q, sizeof q, p, "function.arguments", -1);
                api_json_value_error(API_KIND_CHAT, e, q, "the arguments must be a JSON object encoded as a string.");
                return false;
            }
        } else if (json_is_object(args)) {
            dumped = api_json_dump(args);
            a = dumped;
            alen = strlen(dumped);
        } else if (args && !json_is_null(args)) {
            api_path(q, sizeof q, p, "function.arguments", -1);
            api_json_type_error(API_KIND_CHAT, e, q, "a string", args);
            return false;
        }
        conv_add_tool_call(c, json_is_string(id) ? json_string_value(id) : "", json_string_value(name), a, alen);
        free(dumped);
    }
    return true;
}

/* tools (or legacy functions): adds definitions to c. */
static bool api_chat_tools(conv *c, json_t *tools, const char *key, bool legacy, api_error *e)
{
    char p[96], q[128];
    if (!json_is_array(tools)) {
        api_json_type_error(API_KIND_CHAT, e, key, "an array", tools);
        return false;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!api_json_item(API_KIND_CHAT, key, i, t, p, sizeof p, e)) return false;
        json_t *fn = t;
        if (!legacy) {
            json_t *type = json_object_get(t, "type");
            if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function"))) {
                api_path(q, sizeof q, p, "type", -1);
                api_json_value_error(API_KIND_CHAT, e, q, "only tools of type 'function' are supported.");
                return false;
            }
            fn = json_object_get(t, "function");
            if (!json_is_object(fn)) {
                api_path(q, sizeof q, p, "function", -1);
                api_json_bad(API_KIND_CHAT, e, q, "an object", fn);
                return false;
            }
        }
        if (!api_json_tool(API_KIND_CHAT, fn, p, legacy ? "" : "function.", c, e)) return false;
    }
    return true;
}

static bool api_chat_messages(api_req *r, json_t *msgs, api_error *e)
{
    char p[64], q[96];
    if (!json_is_array(msgs)) {
        api_json_type_error(API_KIND_CHAT, e, "messages", "an array", msgs);
        return false;
    }
    if (json_array_size(msgs) == 0) {
        api_error_set(e, 400, "messages", "empty_array",
                      "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
                      "array instead.");
        return false;
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!api_json_item(API_KIND_CHAT, "messages", i, m, p, sizeof p, e)) return false;
        json_t *role = json_object_get(m, "role");
        api_path(q, sizeof q, p, "role", -1);
        if (!role) {
            api_json_missing(API_KIND_CHAT, e, q);
            return false;
        }
        if (!json_is_string(role)) {
            api_json_type_error(API_KIND_CHAT, e, q, "a string", role);
            return false;
        }
        const char *rs = json_string_value(role);
        conv_role cr;
        if (!strcmp(rs, "system")) cr = CONV_ROLE_SYSTEM;
        else if (!strcmp(rs, "developer")) cr = CONV_ROLE_DEVELOPER;
        else if (!strcmp(rs, "user")) cr = CONV_ROLE_USER;
        else if (!strcmp(rs, "assistant")) cr = CONV_ROLE_ASSISTANT;
        else if (!strcmp(rs, "tool")) cr = CONV_ROLE_TOOL;
        else {
            api_error_set(e, 400, q, "invalid_value",
                          "Invalid value: '%s'. Supported values are: 'system', 'assistant', 'user', 'tool', and "
                          "'developer'.",
                          rs);
            return false;
        }
        json_t *content = json_object_get(m, "content");
        api_path(q, sizeof q, p, "content", -1);
        conv_add_turn(&r->conv, cr);
        if (cr == CONV_ROLE_TOOL) {
            json_t *tcid = json_object_get(m, "tool_call_id");
            char t2[96];
            api_path(t2, sizeof t2, p, "tool_call_id", -1);
            if (!tcid) {
                api_json_missing(API_KIND_CHAT, e, t2);
                return false;
            }
            if (!json_is_string(tcid)) {
                api_json_type_error(API_KIND_CHAT, e, t2, "a string", tcid);
                return false;
            }
            if (!content || json_is_null(content)) {
                api_json_missing(API_KIND_CHAT, e, q);
                return false;
            }
            if (!api_chat_content(&r->conv, content, q, true, json_string_value(tcid), e)) return false;
            continue;
        }
        if (cr == CONV_ROLE_ASSISTANT) {
            json_t *rc = json_object_get(m, "reasoning_content");
            if (!rc) rc = json_object_get(m, "reasoning");
            if (rc && !json_is_null(rc)) {
                if (!json_is_string(rc)) {
                    char t2[96];
                    api_json_type_error(API_KIND_CHAT, e, api_path(t2, sizeof t2, p, "reasoning_content", -1),
                                        "a string", rc);
                    return false;
                }
                conv_add_reasoning(&r->conv, json_string_value(rc), json_string_length(rc));
            }
            json_t *tcs = json_object_get(m, "tool_calls");
            bool has_calls = tcs && !json_is_null(tcs);
            if (content && !json_is_null(content)) {
                if (!api_chat_content(&r->conv, content, q, false, NULL, e)) return false;
            } else if (!has_calls) {
                api_json_missing(API_KIND_CHAT, e, q);
                return false;
            }
            if (has_calls) {
                char t2[96];
                if (!api_chat_tool_calls(&r->conv, tcs, api_path(t2, sizeof t2, p, "tool_calls", -1), e)) return false;
            }
            continue;
        }
        if (!content || json_is_null(content)) {
            api_json_missing(API_KIND_CHAT, e, q);
            return false;
        }
        if (!api_chat_content(&r->conv, content, q, false, NULL, e)) return false;
    }
    return true;
}

static const api_kind K = API_KIND_CHAT;

/* Step: limits and output switches: max_tokens, n, stop, stream(+options), logprobs. */
static bool api_chat_output_fields(json_t *root, api_req *r, api_error *e)
{
    long long k;
    int st;
    if ((st = api_json_int(K, root, "max_tokens", 1, 1 << 30, &k, e)) < 0) return false;
    if (st) r->max_tokens = (int)k;
    if ((st = api_json_int(K, root, "max_completion_tokens", 1, 1 << 30, &k, e)) < 0) return false;
    if (st) r->max_tokens = (int)k;
    if ((st = api_json_int(K, root, "n", 1, API_MAX_N, &k, e)) < 0) return false;
    if (st) r->n = (int)k;
    if (!api_json_stop(K, root, "stop", r, e)) return false;
    if (api_json_bool(K, root, "stream", &r->stream, e) < 0) return false;
    if (api_json_bool(K, root, "logprobs", &r->logprobs, e) < 0) return false;
    if ((st = api_json_int(K, root, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, &k, e)) < 0) return false;
    if (st) {
        if (!r->logprobs) {
            api_error_set(e, 400, "top_logprobs", "invalid_value",
                          "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is "
                          "used.");
            return false;
        }
        r->top_logprobs = (int)k;
    }
    if (api_json_bool(K, root, "return_token_ids", &r->return_token_ids, e) < 0) return false;
    return api_json_stream_options(K, root, r, e);
}

/* Step: the output format (response_format, or one of the extensions' fields) and what this
 * server does not do, refused by name: audio, predictions, web search, legacy function_call,
 * non-text modalities. */
static bool api_chat_unsupported(json_t *root, api_req *r, api_error *e)
{
    if (!api_json_format(K, json_object_get(root, "response_format"), "response_format", false, r, e) ||
        !api_json_guided(K, root, r, e))
        return false;
    static const char *const unsupported[] = {"audio", "prediction", "web_search_options", "function_call", NULL};
    for (int i = 0; unsupported[i]; i++) {
        json_t *v = json_object_get(root, unsupported[i]);
        if (v && !json_is_null(v)) {
            api_json_value_error(K, e, unsupported[i], "this parameter is not supported by this server.");
            return false;
        }
    }
    json_t *mod = json_object_get(root, "modalities");
    if (mod && !json_is_null(mod)) {
        size_t i;
        json_t *v;
        if (!json_is_array(mod)) {
            api_json_type_error(K, e, "modalities", "an array", mod);
            return false;
        }
        json_array_foreach(mod, i, v) if (!json_is_string(v) || strcmp(json_string_value(v), "text")) {
            api_json_value_error(K, e, "modalities", "only 'text' output is supported.");
            return false;
        }
    }
    return true;
}

/* Step: tools (and legacy functions) into the conversation, unless tool_choice is "none". */
static bool api_chat_tool_fields(json_t *root, api_req *r, api_error *e)
{
    bool b = true;
    if (api_json_bool(K, root, "parallel_tool_calls", &b, e) < 0) return false;
    r->one_call = !b;
    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            if (!api_json_tool_choice_word(json_string_value(tc), r, e)) return false;
        } else if (json_is_object(tc)) {
            json_t *fn = json_object_get(tc, "function");
            json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            if (!json_is_string(name)) {
                api_json_bad(K, e, "tool_choice.function.name", "a string", name);
                return false;
            }
            r->tools_mode = API_TOOLS_NAMED;
            r->tool_name = xstrdup(json_string_value(name));
        } else {
            api_json_type_error(K, e, "tool_choice", "a string or an object", tc);
            return false;
        }
    }
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools) && !api_chat_tools(&r->conv, tools, "tools", false, e)) return false;
    json_t *fns = json_object_get(root, "functions");
    if (fns && !json_is_null(fns) && !api_chat_tools(&r->conv, fns, "functions", true, e)) return false;
    if (r->tools_mode == API_TOOLS_NONE) r->conv.n_tools = 0;
    return true;
}

/* Step: the thinking switches: reasoning_effort, chat_template_kwargs.enable_thinking, and
 * thinking {type, budget_tokens}; the last one given wins. */
static bool api_chat_thinking(json_t *root, api_req *r, api_error *e)
{
    const char *effort = NULL;
    bool b;
    int st;
    if ((st = api_json_str(K, root, "reasoning_effort", &effort, e)) < 0) return false;
    if (st) {
        if (!strcmp(effort, "none") || !strcmp(effort, "minimal")) r->conv.thinking = CONV_THINKING_OFF;
        else if (!strcmp(effort, "low") || !strcmp(effort, "medium") || !strcmp(effort, "high")) {
            r->conv.thinking = CONV_THINKING_ON;
            r->conv.effort = effort[0] == 'l' ? CONV_EFFORT_LOW : effort[0] == 'm' ? CONV_EFFORT_MEDIUM : CONV_EFFORT_HIGH;
        }
        else {
            api_error_set(e, 400, "reasoning_effort", "invalid_value",
                          "Invalid value: '%s'. Supported values are: 'none', 'minimal', 'low', 'medium', and 'high'.",
                          effort);
            return false;
        }
    }
    json_t *ctk = json_object_get(root, "chat_template_kwargs");
    if (ctk && !json_is_null(ctk)) {
        if (!json_is_object(ctk)) {
            api_json_type_error(K, e, "chat_template_kwargs", "an object", ctk);
            return false;
        }
        if ((st = api_json_bool(K, ctk, "enable_thinking", &b, e)) < 0) return false;
        if (st) r->conv.thinking = b ? CONV_THINKING_ON : CONV_THINKING_OFF;
        /* every member is a variable for a Jinja template (request text: tainted there) */
        char *d = json_dumps(ctk, JSON_COMPACT);
        if (d) r->conv.template_kwargs = conv_strdup(&r->conv, d, strlen(d));
        free(d);
    }
    json_t *th = json_object_get(root, "thinking");
    if (th && !json_is_null(th)) {
        json_t *t = json_is_object(th) ? json_object_get(th, "type") : NULL;
        if (!json_is_string(t) || (strcmp(json_string_value(t), "enabled") && strcmp(json_string_value(t), "disabled"))) {
            api_json_value_error(K, e, "thinking", "expected {\"type\": \"enabled\"} or {\"type\": \"disabled\"}.");
            return false;
        }
        r->conv.thinking = !strcmp(json_string_value(t), "enabled") ? CONV_THINKING_ON : CONV_THINKING_OFF;
        long long bt = 0;
        if ((st = api_json_int(K, th, "budget_tokens", 1, 1 << 30, &bt, e)) < 0) {
            snprintf(e->param, sizeof e->param, "thinking.budget_tokens");
            return false;
        }
        if (st && r->conv.thinking == CONV_THINKING_ON) r->thinking_budget = (int)bt;
    }
    return true;
}

api_status api_chat_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e)
{
    json_t *root;
    if (!api_json_load(K, body, len, &root, e)) return API_ERR;
    api_status ret = API_ERR;
    /* what the request is: known fields, the model, the conversation */
    if (!api_json_known(K, root, api_chat_keys, "", e) || !api_json_cache(K, root, r, e)) goto out;
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs) {
        api_json_missing(K, e, "messages");
        goto out;
    }
    if (!api_json_model(cfg, K, root, r, e) || !api_chat_messages(r, msgs, e)) goto out;
    /* how to generate, and what to send back */
    if (!api_json_sampling(K, root, cfg, r, e)) goto out;
    if (!api_chat_output_fields(root, r, e) || !api_json_user(K, root, r, e) || !api_chat_unsupported(root, r, e)) goto out;
    /* tools and thinking, which shape the prompt */
    if (!api_chat_tool_fields(root, r, e) || !api_chat_thinking(root, r, e)) goto out;
    ret = API_OK;
out:
    json_decref(root);
    return ret;
}

/* ------------------------------------------------------------------ output */

void api_chat_usage_json(const api_usage *u, bytebuf *b)
{
    bytebuf_printf(b,
                   "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":%d},"
                   "\"completion_tokens_details\":{\"reasoning_tokens\":%d,\"accepted_prediction_tokens\":%d,"
                   "\"rejected_prediction_tokens\":%d},"
                   "\"prompt_cache_hit_tokens\":%d,\"prompt_cache_miss_tokens\":%d}",
                   u->prompt_tokens, u->completion_tokens, u->prompt_tokens + u->completion_tokens, u->cached_tokens,
                   u->reasoning_tokens, u->accepted_drafts, u->rejected_drafts, u->cached_tokens,
                   u->prompt_tokens - u->cached_tokens);
}

static const char *api_chat_finish_name(events_finish_reason f)
{
    return f == EVENTS_FINISH_LENGTH ? "length" : f == EVENTS_FINISH_TOOL_CALLS ? "tool_calls" : "stop";
}

/* `token` is the text (a piece that is not UTF-8 on its own, e.g. half a character, reads as
 * U+FFFD), `bytes` the piece's raw bytes: joining the bytes of consecutive tokens gives the
 * real text back, as OpenAI documents. */
static void api_chat_lp_one(bytebuf *b, const char *text, size_t len, float lp)
{
    bytebuf_puts(b, "{\"token\":");
    api_buf_strn(b, text, len);
    bytebuf_printf(b, ",\"logprob\":%.6g,\"bytes\":[", (double)lp);
    for (size_t k = 0; k < len; k++) bytebuf_printf(b, "%s%u", k ? "," : "", (unsigned char)text[k]);
    bytebuf_putc(b, ']');
}

/* {"content":[...]} of entries [from, to) of choice c. */
static void api_chat_lps(bytebuf *b, const api_choice *c, int from, int to)
{
    bytebuf_puts(b, "{\"content\":[");
    for (int k = from; k < to; k++) {
        const api_lp_entry *en = &c->lps[k];
        if (k > from) bytebuf_putc(b, ',');
        api_chat_lp_one(b, en->text, en->len, en->logprob);
        bytebuf_puts(b, ",\"top_logprobs\":[");
        for (int t = 0; t < en->n_top; t++) {
            if (t) bytebuf_putc(b, ',');
            api_chat_lp_one(b, en->top_text[t], en->top_len[t], en->top_logprob[t]);
            bytebuf_putc(b, '}');
        }
        bytebuf_puts(b, "]}");
    }
    bytebuf_puts(b, "],\"refusal\":null}");
}

static void api_chat_chunk_open(api_out *o, bytebuf *b)
{
    bytebuf_puts(b, "{\"id\":");
    api_buf_str(b, o->id);
    bytebuf_printf(b, ",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":", (long long)o->created);
    api_buf_str(b, o->model);
    bytebuf_puts(b, ",\"system_fingerprint\":\"tokenmill\",\"choices\":[");
}

/* Sends one chunk for choice i: delta is the inside of the delta object, finish may be NULL. */
static void api_chat_chunk(api_out *o, int i, const char *delta, size_t dlen, const char *finish)
{
    api_choice *c = &o->choices[i];
    bytebuf b = {0};
    api_chat_chunk_open(o, &b);
    bytebuf_printf(&b, "{\"index\":%d,\"delta\":{", i);
    bytebuf_append(&b, delta, dlen);
    bytebuf_puts(&b, "},\"logprobs\":");
    if (o->req->logprobs && c->n_lps > c->n_lps_sent) {
        api_chat_lps(&b, c, c->n_lps_sent, c->n_lps);
        c->n_lps_sent = c->n_lps;
    } else {
        bytebuf_puts(&b, "null");
    }
    bytebuf_puts(&b, ",\"finish_reason\":");
    api_buf_str(&b, finish);
    bytebuf_puts(&b, "}]");
    if (o->req->include_usage) bytebuf_puts(&b, ",\"usage\":null");
    bytebuf_putc(&b, '}');
    api_sse(&o->out, NULL, b.p, b.len);
    bytebuf_free(&b);
}

static void api_chat_begin(api_out *o)
{
    for (int i = 0; i < o->n_choices; i++) {
        static const char role[] = "\"role\":\"assistant\",\"content\":\"\"";
        api_chat_chunk(o, i, role, sizeof role - 1, NULL);
    }
}

static void api_chat_on(api_out *o, int i, api_op op, api_item *it, const char *d, size_t len)
{
    if (!o->req->stream) return;
    bytebuf delta = {0};
    if (op == API_OP_DELTA && it->kind == API_ITEM_TEXT) {
        bytebuf_puts(&delta, "\"content\":");
        api_buf_strn(&delta, d, len);
    } else if (op == API_OP_DELTA && it->kind == API_ITEM_REASONING) {
        bytebuf_puts(&delta, "\"reasoning_content\":");
        api_buf_strn(&delta, d, len);
    } else if (op == API_OP_OPEN && it->kind == API_ITEM_TOOL) {
        bytebuf_printf(&delta, "\"tool_calls\":[{\"index\":%d,\"id\":", it->tool_index);
        api_buf_str(&delta, it->call_id);
        bytebuf_puts(&delta, ",\"type\":\"function\",\"function\":{\"name\":");
        api_buf_str(&delta, it->name);
        bytebuf_puts(&delta, ",\"arguments\":\"\"}}]");
    } else if (op == API_OP_DELTA && it->kind == API_ITEM_TOOL) {
        bytebuf_printf(&delta, "\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", it->tool_index);
        api_buf_strn(&delta, d, len);
        bytebuf_puts(&delta, "}}]");
    } else if (op == API_OP_FINISH) {
        api_chat_chunk(o, i, "", 0, api_chat_finish_name(o->choices[i].finish));
        return;
    } else {
        return;
    }
    api_chat_chunk(o, i, delta.p, delta.len, NULL);
    bytebuf_free(&delta);
}

static void api_chat_ids(bytebuf *b, const int32_t *ids, int n)
{
    bytebuf_putc(b, '[');
    for (int k = 0; k < n; k++) bytebuf_printf(b, "%s%d", k ? "," : "", ids[k]);
    bytebuf_putc(b, ']');
}

static void api_chat_end(api_out *o)
{
    bytebuf *b = &o->out;
    if (o->req->stream) {
        if (o->req->include_usage) {
            bytebuf u = {0};
            api_chat_chunk_open(o, &u);
            bytebuf_puts(&u, "],\"usage\":");
            api_chat_usage_json(&o->usage, &u);
            bytebuf_putc(&u, '}');
            api_sse(b, NULL, u.p, u.len);
            bytebuf_free(&u);
        }
        api_sse_done(b);
        return;
    }
    bytebuf_puts(b, "{\"id\":");
    api_buf_str(b, o->id);
    bytebuf_printf(b, ",\"object\":\"chat.completion\",\"created\":%lld,\"model\":", (long long)o->created);
    api_buf_str(b, o->model);
    bytebuf_puts(b, ",\"system_fingerprint\":\"tokenmill\",\"choices\":[");
    for (int i = 0; i < o->n_choices; i++) {
        const api_choice *c = &o->choices[i];
        if (i) bytebuf_putc(b, ',');
        bytebuf_printf(b, "{\"index\":%d,\"message\":{\"role\":\"assistant\",\"content\":", i);
        /* Text items joined; null when the answer is only tool calls. */
        bytebuf text = {0}, reasoning = {0};
        bool has_text = false, has_reasoning = false;
        for (int k = 0; k < c->n_items; k++) {
            const api_item *it = &c->items[k];
            if (it->kind == API_ITEM_TEXT) {
                has_text = true;
                bytebuf_append(&text, it->text.p ? it->text.p : "", it->text.len);
            } else if (it->kind == API_ITEM_REASONING) {
                has_reasoning = true;
                bytebuf_append(&reasoning, it->text.p ? it->text.p : "", it->text.len);
            }
        }
        if (has_text && !(c->n_calls && text.len == 0)) api_buf_strn(b, text.p ? text.p : "", text.len);
        else bytebuf_puts(b, "null");
        if (has_reasoning) {
            bytebuf_puts(b, ",\"reasoning_content\":");
            api_buf_strn(b, reasoning.p, reasoning.len);
        }
        bytebuf_free(&text);
        bytebuf_free(&reasoning);
        if (c->n_calls) {
            bytebuf_puts(b, ",\"tool_calls\":[");
            int n = 0;
            for (int k = 0; k < c->n_items; k++) {
                const api_item *it = &c->items[k];
                if (it->kind != API_ITEM_TOOL) continue;
                if (n++) bytebuf_putc(b, ',');
                bytebuf_puts(b, "{\"id\":");
                api_buf_str(b, it->call_id);
                bytebuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
                api_buf_str(b, it->name);
                bytebuf_puts(b, ",\"arguments\":");
                api_buf_strn(b, it->text.p ? it->text.p : "{}", it->text.p ? it->text.len : 2);
                bytebuf_puts(b, "}}");
            }
            bytebuf_putc(b, ']');
        }
        bytebuf_puts(b, ",\"refusal\":null},\"logprobs\":");
        if (o->req->logprobs) api_chat_lps(b, c, 0, c->n_lps);
        else bytebuf_puts(b, "null");
        bytebuf_puts(b, ",\"finish_reason\":");
        api_buf_str(b, api_chat_finish_name(c->finish));
        if (o->req->return_token_ids) {
            bytebuf_puts(b, ",\"token_ids\":");
            api_chat_ids(b, c->token_ids, c->n_token_ids);
        }
        bytebuf_putc(b, '}');
    }
    bytebuf_puts(b, "],\"usage\":");
    api_chat_usage_json(&o->usage, b);
    if (o->req->return_token_ids) {
        bytebuf_puts(b, ",\"prompt_token_ids\":");
        api_chat_ids(b, o->prompt_ids, o->n_prompt_ids);
    }
    bytebuf_putc(b, '}');
}

const api_format api_chat_format = {
    .id_prefix = "chatcmpl-",
    .parse = api_chat_parse,
    .begin = api_chat_begin,
    .on = api_chat_on,
    .end = api_chat_end,
};

/* ------------------------------------------------------------------ route */

static void api_chat_handle(http_request *r, void *user) { api_serve(r, user, API_KIND_CHAT, false, NULL); }

void api_chat_register(http_server *h, api_ctx *c) { http_route(h, "POST", "/v1/chat/completions", api_chat_handle, c); }
