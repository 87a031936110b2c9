/*
 * api_responses: OpenAI Responses (POST /v1/responses).
 *
 * Request -> conv: `instructions` is a system turn first; then, with previous_response_id,
 * the stored conversation of that response (its input and its answer, without its
 * instructions, as OpenAI does); then `input`: a string (one user turn) or a list of items:
 * messages (role + string or input_text/output_text parts), function_call (assistant tool
 * call), function_call_output (tool result) and reasoning items. Consecutive assistant-side
 * items (reasoning, assistant message, function_call) form one assistant turn. Unknown
 * top-level fields are rejected ("Unknown parameter"). Extensions: top_k, min_p, seed, stop,
 * penalties, return_token_ids, and logit_bias as chat reads it.
 *
 * Output: a `response` object whose output items are, in order, reasoning items (rs_…),
 * messages (msg_…, one output_text part) and function_call items (fc_…). Streaming sends
 * response.created, response.in_progress, then per item output_item.added, content_part.added,
 * *.delta …, *.done, content_part.done, output_item.done, and finally response.completed (or
 * response.incomplete when the token limit was hit), every event with a sequence_number.
 * A completed response with store=true is kept in the api_store for previous_response_id
 * (the store is at the end of this file).
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/sha256.h"
#include "util/slottab.h"
#include "util/util.h"

static const char *const api_responses_keys[] = {
    "model", "input", "instructions", "previous_response_id", "max_output_tokens", "temperature", "top_p", "stream",
    "store", "metadata", "user", "tools", "tool_choice", "parallel_tool_calls", "truncation", "include", "reasoning",
    "text", "service_tier", "background", "prompt_cache_key", "safety_identifier", "top_logprobs", "max_tool_calls",
    "stream_options", "conversation", "prompt",
    /* extensions */
    "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty", "return_token_ids",
    "cache_salt", "cache_class", "logit_bias", NULL};

static const api_kind K = API_KIND_RESPONSES;

static bool api_responses_input(api_req *r, json_t *input, api_error *e)
{
    if (json_is_string(input)) {
        conv_add_turn(&r->conv, CONV_ROLE_USER);
        conv_add_text(&r->conv, json_string_value(input), json_string_length(input));
        return true;
    }
    if (!json_is_array(input)) {
        api_json_type_error(K, e, "input", "a string or an array of input items", input);
        return false;
    }
    bool asst_open = false; /* the last turn is an assistant turn still taking items */
    size_t i;
    json_t *it;
    char p[64], q[96];
    json_array_foreach(input, i, it) {
        if (!api_json_item(K, "input", i, it, p, sizeof p, e)) return false;
        json_t *type = json_object_get(it, "type");
        if (type && !json_is_string(type)) {
            api_json_type_error(K, e, api_path(q, sizeof q, p, "type", -1), "a string", type);
            return false;
        }
        const char *t = type ? json_string_value(type) : "message";
        if (!strcmp(t, "message")) {
            json_t *role = json_object_get(it, "role");
            api_path(q, sizeof q, p, "role", -1);
            if (!json_is_string(role)) {
                api_json_bad(K, e, q, "a string", role);
                return false;
            }
            const char *rs = json_string_value(role);
            conv_role cr;
            if (!strcmp(rs, "user")) cr = CONV_ROLE_USER;
            else if (!strcmp(rs, "assistant")) cr = CONV_ROLE_ASSISTANT;
            else if (!strcmp(rs, "system")) cr = CONV_ROLE_SYSTEM;
            else if (!strcmp(rs, "developer")) cr = CONV_ROLE_DEVELOPER;
            else {
                api_error_set(e, 400, q, "invalid_value",
                              "Invalid value: '%s'. Supported values are: 'assistant', 'system', 'developer', and "
                              "'user'.",
                              rs);
                return false;
            }
            json_t *content = json_object_get(it, "content");
            api_path(q, sizeof q, p, "content", -1);
            if (!content) {
                api_json_missing(K, e, q);
                return false;
            }
            char *text = api_json_parts_text(K, content, q, e);
            if (!text) return false;
            if (!(cr == CONV_ROLE_ASSISTANT && asst_open)) conv_add_turn(&r->conv, cr);
            conv_add_text(&r->conv, text, strlen(text));
            free(text);
            asst_open = cr == CONV_ROLE_ASSISTANT;
        } else if (!strcmp(t, "function_call")) {
            json_t *cid = json_object_get(it, "call_id"), *name = json_object_get(it, "name"),
                   *args = json_object_get(it, "arguments");
            const char *miss = !json_is_string(cid) ? "call_id" : !json_is_string(name) ? "name"
                               : !json_is_string(args) ? "arguments" : NULL;
            if (miss) {
                json_t *v = json_object_get(it, miss);
                api_path(q, sizeof q, p, miss, -1);
                api_json_bad(K, e, q, "a string", v);
                return false;
            }
            if (!jsonfmt_valid(json_string_value(args), json_string_length(args))) {
                api_json_value_error(K, e, api_path(q, sizeof q, p, "arguments", -1), "not valid JSON.");
                return false;
            }
            if (!asst_open) conv_add_turn(&r->conv, CONV_ROLE_ASSISTANT);
            asst_open = true;
            conv_add_tool_call(&r->conv, json_string_value(cid), json_string_value(name), json_string_value(args),
                               json_string_length(args));
        } else if (!strcmp(t, "function_call_output")) {
            json_t *cid = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
            api_path(q, sizeof q, p, "call_id", -1);
            if (!json_is_string(cid)) {
                api_json_bad(K, e, q, "a string", cid);
                return false;
            }
            api_path(q, sizeof q, p, "output", -1);
            if (!out) {
                api_json_missing(K, e, q);
                return false;
            }
            char *text = api_json_parts_text(K, out, q, e);
            if (!text) return false;
            conv_add_turn(&r->conv, CONV_ROLE_TOOL);
            conv_add_tool_result(&r->conv, json_string_value(cid), NULL, text, strlen(text));
            free(text);
            asst_open = false;
        } else if (!strcmp(t, "reasoning")) {
            json_t *content = json_object_get(it, "content");
            if (!content || json_is_null(content)) content = json_object_get(it, "summary");
            char *text = content && !json_is_null(content) ? api_json_parts_text(K, content, api_path(q, sizeof q, p, "content", -1), e)
                                                           : xstrdup("");
            if (!text) return false;
            if (!asst_open) conv_add_turn(&r->conv, CONV_ROLE_ASSISTANT);
            asst_open = true;
            conv_add_reasoning(&r->conv, text, strlen(text));
            free(text);
        } else {
            api_json_value_error(K, e, api_path(q, sizeof q, p, "type", -1),
                                 "input item type '%s' is not supported by this server.", t);
            return false;
        }
    }
    return true;
}

static bool api_responses_tools(api_req *r, json_t *tools, api_error *e)
{
    if (!json_is_array(tools)) {
        api_json_type_error(K, e, "tools", "an array", tools);
        return false;
    }
    size_t i;
    json_t *t;
    char p[64], q[96];
    json_array_foreach(tools, i, t) {
        if (!api_json_item(K, "tools", i, t, p, sizeof p, e)) return false;
        json_t *type = json_object_get(t, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function")) {
            api_json_value_error(K, e, api_path(q, sizeof q, p, "type", -1),
                                 "only tools of type 'function' are supported by this server.");
            return false;
        }
        if (!api_json_tool(K, t, p, "", &r->conv, e)) return false;
    }
    return true;
}

api_status api_responses_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e)
{
    json_t *root;
    if (!api_json_load(K, body, len, &root, e)) return API_ERR;
    api_status ret = API_ERR;
    double x;
    long long k;
    int st;
    const char *s;
    if (!api_json_known(K, root, api_responses_keys, "", e)) goto out;
    if (!api_json_cache(K, root, r, e)) goto out;
    if (!api_json_model(cfg, K, root, r, e)) goto out;
    if (!api_json_logit_bias(K, root, cfg ? cfg->n_vocab : 0, &r->sp, e)) goto out;
    if ((st = api_json_str(K, root, "instructions", &s, e)) < 0) goto out;
    if (st) {
        r->instructions = xstrdup(s);
        conv_add_turn(&r->conv, CONV_ROLE_SYSTEM);
        conv_add_text(&r->conv, s, strlen(s));
    }
    if ((st = api_json_str(K, root, "previous_response_id", &s, e)) < 0) goto out;
    if (st) {
        r->previous_response_id = xstrdup(s);
        int before = r->conv.n_turns;
        if (!cfg || !cfg->store || !api_store_get(cfg->store, s, &r->conv)) {
            api_error_set(e, 404, "previous_response_id", "previous_response_not_found",
                          "Previous response with id '%s' not found.", s);
            goto out;
        }
        r->n_prev_turns = r->conv.n_turns - before;
    }
    json_t *input = json_object_get(root, "input");
    if (input && !json_is_null(input)) {
        if (!api_responses_input(r, input, e)) goto out;
    } else if (!r->previous_response_id) {
        api_json_missing(K, e, "input");
        goto out;
    }
    bool has_user_side = false;
    for (int t = 0; t < r->conv.n_turns; t++)
        if (r->conv.turns[t].role != CONV_ROLE_SYSTEM && r->conv.turns[t].role != CONV_ROLE_DEVELOPER) has_user_side = true;
    if (!has_user_side) {
        api_error_set(e, 400, "input", "empty_array", "Invalid 'input': the conversation has no input to respond to.");
        goto out;
    }
    if ((st = api_json_num(K, root, "temperature", 0, 2, &x, e)) < 0) goto out;
    if (st) r->sp.temp = (float)x, r->temperature_echo = x;
    if ((st = api_json_num(K, root, "top_p", 0, 1, &x, e)) < 0) goto out;
    if (st) r->sp.top_p = (float)x, r->top_p_echo = x;
    if ((st = api_json_int(K, root, "top_k", -1, 1 << 30, &k, e)) < 0) goto out;
    if (st) r->sp.top_k = (int)k;
    if ((st = api_json_num(K, root, "min_p", 0, 1, &x, e)) < 0) goto out;
    if (st) r->sp.min_p = (float)x;
    if ((st = api_json_num(K, root, "presence_penalty", -2, 2, &x, e)) < 0) goto out;
    if (st) r->sp.presence_penalty = (float)x, r->sp.penalty_last_n = 64;
    if ((st = api_json_num(K, root, "frequency_penalty", -2, 2, &x, e)) < 0) goto out;
    if (st) r->sp.frequency_penalty = (float)x, r->sp.penalty_last_n = 64;
    if ((st = api_json_int(K, root, "seed", -(1LL << 62), 1LL << 62, &k, e)) < 0) goto out;
    if (st) r->sp.seed = (uint64_t)k, r->seed_given = true;
    if ((st = api_json_int(K, root, "max_output_tokens", 1, 1 << 30, &k, e)) < 0) goto out;
    if (st) r->max_tokens = (int)k;
    if ((st = api_json_int(K, root, "top_logprobs", 0, 0, &k, e)) < 0) goto out;
    if (!api_json_stop(K, root, "stop", r, e)) goto out;
    if (api_json_bool(K, root, "stream", &r->stream, e) < 0) goto out;
    if (api_json_bool(K, root, "store", &r->store, e) < 0) goto out;
    if (api_json_bool(K, root, "return_token_ids", &r->return_token_ids, e) < 0) goto out;
    if (!api_json_user(K, root, r, e)) goto out;
    bool ptc = true;
    if (api_json_bool(K, root, "parallel_tool_calls", &ptc, e) < 0) goto out;
    r->one_call = !ptc;
    bool bg = false;
    if (api_json_bool(K, root, "background", &bg, e) < 0) goto out;
    if (bg) {
        api_json_value_error(K, e, "background", "background responses are not supported by this server.");
        goto out;
    }
    static const char *const unsupported[] = {"conversation", "prompt", NULL};
    for (int i = 0; unsupported[i]; i++) {
        json_t *v = json_object_get(root, unsupported[i]);
        if (v && !json_is_null(v)) {
            api_json_value_error(K, e, unsupported[i], "this parameter is not supported by this server.");
            goto out;
        }
    }
    json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_null(md)) {
        if (!json_is_object(md)) {
            api_json_type_error(K, e, "metadata", "an object", md);
            goto out;
        }
        r->metadata_json = api_json_dump(md);
    }
    json_t *tf = json_object_get(root, "text");
    if (tf && !json_is_null(tf)) {
        if (!json_is_object(tf)) {
            api_json_type_error(K, e, "text", "an object", tf);
            goto out;
        }
        json_t *fmt = json_object_get(tf, "format");
        if (!api_json_format(K, fmt, "text.format", true, r, e)) goto out;
        if (json_is_object(fmt)) r->format_json = api_json_dump(fmt);
    }
    json_t *rsn = json_object_get(root, "reasoning");
    if (rsn && !json_is_null(rsn)) {
        if (!json_is_object(rsn)) {
            api_json_type_error(K, e, "reasoning", "an object", rsn);
            goto out;
        }
        json_t *eff = json_object_get(rsn, "effort");
        if (json_is_string(eff)) {
            const char *v = json_string_value(eff);
            r->conv.thinking = (!strcmp(v, "none") || !strcmp(v, "minimal")) ? CONV_THINKING_OFF : CONV_THINKING_ON;
            r->conv.effort = !strcmp(v, "low") ? CONV_EFFORT_LOW : !strcmp(v, "medium") ? CONV_EFFORT_MEDIUM
                             : !strcmp(v, "high") ? CONV_EFFORT_HIGH : CONV_EFFORT_DEFAULT;
        } else if (eff && !json_is_null(eff)) {
            api_json_type_error(K, e, "reasoning.effort", "a string", eff);
            goto out;
        }
    }
    json_t *tc = json_object_get(root, "tool_choice");
    if (json_is_string(tc)) {
        if (!api_json_tool_choice_word(json_string_value(tc), r, e)) goto out;
    } else if (json_is_object(tc)) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) {
            api_json_bad(K, e, "tool_choice.name", "a string", name);
            goto out;
        }
        r->tools_mode = API_TOOLS_NAMED;
        r->tool_name = xstrdup(json_string_value(name));
    } else if (tc && !json_is_null(tc)) {
        api_json_type_error(K, e, "tool_choice", "a string or an object", tc);
        goto out;
    }
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!api_responses_tools(r, tools, e)) goto out;
        r->tools_json = api_json_dump(tools);
    }
    if (r->tools_mode == API_TOOLS_NONE) r->conv.n_tools = 0;
    if (r->store && cfg) r->store_to = cfg->store;
    ret = API_OK;
out:
    json_decref(root);
    return ret;
}

/* ------------------------------------------------------------------ output */

static void api_responses_usage(const api_usage *u, bytebuf *b)
{
    bytebuf_printf(b,
                   "{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},\"output_tokens\":%d,"
                   "\"output_tokens_details\":{\"reasoning_tokens\":%d},\"total_tokens\":%d}",
                   u->prompt_tokens, u->cached_tokens, u->completion_tokens, u->reasoning_tokens,
                   u->prompt_tokens + u->completion_tokens);
}

/* One output item as JSON; done: completed form (else the in-progress one, text empty),
 * whose status is "incomplete" for the item the token limit cut. */
static void api_responses_item(const api_item *it, bool done, bytebuf *b)
{
    const char *status = !done ? "in_progress" : it->cut ? "incomplete" : "completed";
    const char *text = done && it->text.p ? it->text.p : "";
    size_t tlen = done ? it->text.len : 0;
    bytebuf_puts(b, "{\"id\":");
    api_buf_str(b, it->id);
    switch (it->kind) {
    case API_ITEM_REASONING:
        bytebuf_puts(b, ",\"type\":\"reasoning\",\"summary\":[],\"content\":[");
        if (done) {
            bytebuf_puts(b, "{\"type\":\"reasoning_text\",\"text\":");
            api_buf_strn(b, text, tlen);
            bytebuf_putc(b, '}');
        }
        bytebuf_puts(b, "]}");
        break;
    case API_ITEM_TEXT:
        bytebuf_printf(b, ",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[", status);
        if (done) {
            bytebuf_puts(b, "{\"type\":\"output_text\",\"text\":");
            api_buf_strn(b, text, tlen);
            bytebuf_puts(b, ",\"annotations\":[],\"logprobs\":[]}");
        }
        bytebuf_puts(b, "]}");
        break;
    case API_ITEM_TOOL:
        bytebuf_printf(b, ",\"type\":\"function_call\",\"status\":\"%s\",\"call_id\":", status);
        api_buf_str(b, it->call_id);
        bytebuf_puts(b, ",\"name\":");
        api_buf_str(b, it->name);
        bytebuf_puts(b, ",\"arguments\":");
        api_buf_strn(b, text, tlen);
        bytebuf_putc(b, '}');
        break;
    }
}

/* The response object; final: with output and usage. */
static void api_responses_object(api_out *o, bool final, bytebuf *b)
{
    const api_req *r = o->req;
    bool trunc = final && api_out_truncated(o);
    bytebuf_puts(b, "{\"id\":");
    api_buf_str(b, o->id);
    bytebuf_printf(b, ",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\",\"background\":false,\"error\":null,",
                   (long long)o->created, !final ? "in_progress" : trunc ? "incomplete" : "completed");
    bytebuf_puts(b, trunc ? "\"incomplete_details\":{\"reason\":\"max_output_tokens\"}," : "\"incomplete_details\":null,");
    bytebuf_puts(b, "\"instructions\":");
    api_buf_str(b, r->instructions);
    if (r->max_tokens > 0) bytebuf_printf(b, ",\"max_output_tokens\":%d", r->max_tokens);
    else bytebuf_puts(b, ",\"max_output_tokens\":null");
    bytebuf_puts(b, ",\"model\":");
    api_buf_str(b, o->model);
    bytebuf_puts(b, ",\"output\":[");
    if (final) {
        const api_choice *c = &o->choices[0];
        for (int k = 0; k < c->n_items; k++) {
            if (k) bytebuf_putc(b, ',');
            api_responses_item(&c->items[k], true, b);
        }
    }
    bytebuf_printf(b, "],\"parallel_tool_calls\":%s,\"previous_response_id\":", r->one_call ? "false" : "true");
    api_buf_str(b, r->previous_response_id);
    /* the effort asked for, as OpenAI echoes it */
    static const char *const efforts[] = { "null", "\"low\"", "\"medium\"", "\"high\"" };
    bytebuf_printf(b, ",\"reasoning\":{\"effort\":%s,\"summary\":null},\"store\":%s,\"temperature\":%g,",
                   efforts[r->conv.effort], r->store ? "true" : "false", r->temperature_echo);
    bytebuf_puts(b, "\"text\":{\"format\":");  /* the request's format and tool_choice, as OpenAI echoes them */
    bytebuf_puts(b, r->format_json ? r->format_json : "{\"type\":\"text\"}");
    bytebuf_puts(b, "},\"tool_choice\":");
    if (r->tools_mode == API_TOOLS_NAMED) {
        bytebuf_puts(b, "{\"type\":\"function\",\"name\":");
        api_buf_str(b, r->tool_name);
        bytebuf_putc(b, '}');
    } else {
        api_buf_str(b, r->tools_mode == API_TOOLS_NONE ? "none" : r->tools_mode == API_TOOLS_REQUIRED ? "required" : "auto");
    }
    bytebuf_puts(b, ",\"tools\":");
    bytebuf_puts(b, r->tools_json ? r->tools_json : "[]");
    bytebuf_printf(b, ",\"top_p\":%g,\"truncation\":\"disabled\",\"usage\":", r->top_p_echo);
    if (final) api_responses_usage(&o->usage, b);
    else bytebuf_puts(b, "null");
    bytebuf_puts(b, ",\"user\":null,\"metadata\":");
    bytebuf_puts(b, r->metadata_json ? r->metadata_json : "{}");
    if (final && r->return_token_ids) {
        bytebuf_puts(b, ",\"prompt_token_ids\":[");
        for (int k = 0; k < o->n_prompt_ids; k++) bytebuf_printf(b, "%s%d", k ? "," : "", o->prompt_ids[k]);
        bytebuf_putc(b, ']');
    }
    bytebuf_putc(b, '}');
}

/* Sends `event: type` with data {"type":type,"sequence_number":n,<fields>} (fields without
 * braces, may be empty). */
static void api_responses_event(api_out *o, const char *type, const char *fields, size_t flen)
{
    api_sse_typed(&o->out, type, o->seq++, fields, flen);
}

static void api_responses_begin(api_out *o)
{
    bytebuf f = {0};
    bytebuf_puts(&f, "\"response\":");
    api_responses_object(o, false, &f);
    api_responses_event(o, "response.created", f.p, f.len);
    api_responses_event(o, "response.in_progress", f.p, f.len);
    bytebuf_free(&f);
}

static void api_responses_on(api_out *o, int i, api_op op, api_item *it, const char *d, size_t len)
{
    if (i != 0) return;
    api_choice *c = &o->choices[0];
    if (op == API_OP_OPEN)
        api_new_id(it->id, sizeof it->id,
                    it->kind == API_ITEM_TEXT ? "msg_" : it->kind == API_ITEM_REASONING ? "rs_" : "fc_");
    if (!o->req->stream || op == API_OP_FINISH) return;
    int oi = c->n_items - 1; /* the item concerned is always the last one */
    bytebuf f = {0};
    const char *part_type = it->kind == API_ITEM_TEXT ? "output_text" : "reasoning_text";
    switch (op) {
    case API_OP_OPEN:
        bytebuf_printf(&f, "\"output_index\":%d,\"item\":", oi);
        api_responses_item(it, false, &f);
        api_responses_event(o, "response.output_item.added", f.p, f.len);
        if (it->kind != API_ITEM_TOOL) {
            f.len = 0;
            bytebuf_puts(&f, "\"item_id\":");
            api_buf_str(&f, it->id);
            bytebuf_printf(&f, ",\"output_index\":%d,\"content_index\":0,\"part\":{\"type\":\"%s\",\"text\":\"\"%s}", oi,
                           part_type, it->kind == API_ITEM_TEXT ? ",\"annotations\":[],\"logprobs\":[]" : "");
            api_responses_event(o, "response.content_part.added", f.p, f.len);
        }
        break;
    case API_OP_DELTA:
        bytebuf_puts(&f, "\"item_id\":");
        api_buf_str(&f, it->id);
        bytebuf_printf(&f, ",\"output_index\":%d,", oi);
        if (it->kind != API_ITEM_TOOL) bytebuf_puts(&f, "\"content_index\":0,");
        bytebuf_puts(&f, "\"delta\":");
        api_buf_strn(&f, d, len);
        if (it->kind == API_ITEM_TEXT) bytebuf_puts(&f, ",\"logprobs\":[]");
        api_responses_event(o,
                            it->kind == API_ITEM_TEXT        ? "response.output_text.delta"
                            : it->kind == API_ITEM_REASONING ? "response.reasoning_text.delta"
                                                             : "response.function_call_arguments.delta",
                            f.p, f.len);
        break;
    case API_OP_CLOSE: {
        const char *text = it->text.p ? it->text.p : "";
        bytebuf_puts(&f, "\"item_id\":");
        api_buf_str(&f, it->id);
        bytebuf_printf(&f, ",\"output_index\":%d,", oi);
        if (it->kind == API_ITEM_TOOL) {
            bytebuf_puts(&f, "\"name\":");
            api_buf_str(&f, it->name);
            bytebuf_puts(&f, ",\"arguments\":");
            api_buf_strn(&f, text, it->text.len);
            api_responses_event(o, "response.function_call_arguments.done", f.p, f.len);
        } else {
            bytebuf_puts(&f, "\"content_index\":0,\"text\":");
            api_buf_strn(&f, text, it->text.len);
            if (it->kind == API_ITEM_TEXT) bytebuf_puts(&f, ",\"logprobs\":[]");
            api_responses_event(o, it->kind == API_ITEM_TEXT ? "response.output_text.done" : "response.reasoning_text.done",
                                f.p, f.len);
            f.len = 0;
            bytebuf_puts(&f, "\"item_id\":");
            api_buf_str(&f, it->id);
            bytebuf_printf(&f, ",\"output_index\":%d,\"content_index\":0,\"part\":{\"type\":\"%s\",\"text\":", oi, part_type);
            api_buf_strn(&f, text, it->text.len);
            bytebuf_puts(&f, it->kind == API_ITEM_TEXT ? ",\"annotations\":[],\"logprobs\":[]}" : "}");
            api_responses_event(o, "response.content_part.done", f.p, f.len);
        }
        f.len = 0;
        bytebuf_printf(&f, "\"output_index\":%d,\"item\":", oi);
        api_responses_item(it, true, &f);
        api_responses_event(o, "response.output_item.done", f.p, f.len);
        break;
    }
    default: break;
    }
    bytebuf_free(&f);
}

static void api_responses_end(api_out *o)
{
    if (o->req->store_to) api_store_put(o->req->store_to, o->id, o->req, o);
    if (!o->req->stream) {
        api_responses_object(o, true, &o->out);
        return;
    }
    bytebuf f = {0};
    bytebuf_puts(&f, "\"response\":");
    api_responses_object(o, true, &f);
    api_responses_event(o, api_out_truncated(o) ? "response.incomplete" : "response.completed", f.p, f.len);
    bytebuf_free(&f);
}

const api_format api_responses_format = {
    .id_prefix = "resp_",
    .parse = api_responses_parse,
    .begin = api_responses_begin,
    .on = api_responses_on,
    .end = api_responses_end,
};

/* ------------------------------------------------------------------ route */

#define API_RESPONSES_KEEP 1024   /* responses kept for previous_response_id */

/* One store for the process: responses outlive a request. Freed at exit by the OS. */
static api_store *api_responses_store;

static void api_responses_handle(http_request *r, void *user)
{
    api_serve(r, user, API_KIND_RESPONSES, false, api_responses_store);
}

void api_responses_register(http_server *h, api_ctx *c)
{
    if (!api_responses_store) api_responses_store = api_store_new(API_RESPONSES_KEEP);
    http_route(h, "POST", "/v1/responses", api_responses_handle, c);
}

/* ------------------------------------------------------------------ the store */

/* A slottab (util/slottab.h) over cap slots keys the entries by the SHA-256 of their id and
 * keeps them on its recency list in the order they were put: a full store drops the oldest
 * put, whatever was read since. The mutex guards the table and the entries. */
typedef struct {
    char id[48];              /* the response id */
    conv conv;                /* its conversation incl. the answer turn */
} api_store_entry;

struct api_store {
    pthread_mutex_t mu;       /* guards everything below */
    slottab tab;              /* SHA-256 of the ids, the order of puts */
    api_store_entry *e;       /* (tab.n) by slot */
};

api_store *api_store_new(int max_entries)
{
    api_store *s = xcalloc(1, sizeof *s);
    int cap = max_entries > 0 ? TM_MIN(max_entries, SLOTTAB_MAX) : 1;
    if (!slottab_init(&s->tab, cap)) util_oom((size_t)cap * (32 + 3 * sizeof(int32_t)));
    pthread_mutex_init(&s->mu, NULL);
    s->e = xcalloc((size_t)cap, sizeof *s->e);
    for (int i = 0; i < cap; i++) conv_init(&s->e[i].conv);
    return s;
}

void api_store_free(api_store *s)
{
    if (!s) return;
    for (int i = 0; i < s->tab.n; i++) conv_free(&s->e[i].conv);
    free(s->e);
    slottab_free(&s->tab);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Copies turns [from, src->n_turns) of src to the end of dst. */
static void api_store_copy(conv *dst, const conv *src, int from)
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
    uint8_t key[32];
    sha256_digest(id, strlen(id), key);
    pthread_mutex_lock(&s->mu);
    int slot = slottab_find(&s->tab, key);
    if (slot >= 0) slottab_give(&s->tab, slot);   /* the same id again: the new one replaces it */
    slot = slottab_take(&s->tab);
    if (slot < 0) {
        slottab_give(&s->tab, slottab_oldest(&s->tab));
        slot = slottab_take(&s->tab);
    }
    slottab_set_key(&s->tab, slot, key);
    slottab_touch(&s->tab, slot);
    api_store_entry *en = &s->e[slot];
    conv_free(&en->conv);
    conv_init(&en->conv);
    snprintf(en->id, sizeof en->id, "%s", id);
    api_store_copy(&en->conv, &req->conv, req->instructions ? 1 : 0);
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
    uint8_t key[32];
    sha256_digest(id, strlen(id), key);
    pthread_mutex_lock(&s->mu);
    int slot = slottab_find(&s->tab, key);
    bool found = slot >= 0 && !strcmp(s->e[slot].id, id);   /* (an id past 47 bytes was cut) */
    if (found) api_store_copy(c, &s->e[slot].conv, 0);
    pthread_mutex_unlock(&s->mu);
    return found;
}
