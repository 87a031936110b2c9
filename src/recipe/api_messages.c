/*
 * api_messages: Anthropic Messages (POST /v1/messages, POST /v1/messages/count_tokens).
 *
 * Request -> conv: `system` (a string or text blocks) is a system turn first. A user message
 * is a user turn, except that each tool_result block becomes its own tool turn (text blocks
 * after results open a new user turn); an assistant message is one assistant turn whose
 * thinking blocks become reasoning parts, text blocks text parts and tool_use blocks tool
 * calls (input re-serialised as JSON text). Images and documents are rejected (text only).
 * `thinking` {type: enabled, budget_tokens} turns the template's thinking on and caps the
 * reasoning at budget_tokens (the scheduler closes the think block then); without it
 * thinking is off, as Anthropic's models answer without thinking unless asked. max_tokens is
 * required. Unknown fields are rejected ("Extra inputs are not permitted"). Extensions: seed,
 * min_p, return_token_ids, cache_salt/cache_class, and logit_bias as OpenAI's chat reads it.
 *
 * Output: a message object with content blocks in output order (thinking, text, tool_use),
 * stop_reason end_turn / max_tokens / stop_sequence / tool_use, and usage where input_tokens
 * counts only the prompt tokens that were not read from a cache (cache_read_input_tokens).
 * Streaming: message_start, ping, content_block_start / content_block_delta (text_delta,
 * thinking_delta, input_json_delta) / content_block_stop per block, message_delta with
 * stop_reason and usage, message_stop. message_start waits for the request's first record
 * (token or end) from the scheduler, which carries the prompt figures known at admission, so
 * that its usage already has the real cache_read_input_tokens and input_tokens.
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <stdlib.h>
#include <string.h>

#include "engine/kvpool.h"
#include "util/util.h"

static const api_kind K = API_KIND_MESSAGES;

static const char *const api_messages_keys[] = {
    "model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k", "stream", "tools",
    "tool_choice", "thinking", "metadata", "service_tier", "container", "mcp_servers", "context_management",
    "output_config", "output_format",
    /* extensions */
    "seed", "min_p", "return_token_ids", "cache_salt", "cache_class", "logit_bias", NULL};

static const char *const api_messages_count_keys[] = {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "output_format",
                                                      "mcp_servers", "context_management", "return_token_ids", NULL};

static bool api_messages_messages(api_req *r, json_t *msgs, api_error *e)
{
    char p[64], q[96], bp[128];
    if (!msgs) {
        api_json_missing(K, e, "messages");
        return false;
    }
    if (!json_is_array(msgs)) {
        api_json_type_error(K, e, "messages", "a valid list", msgs);
        return false;
    }
    if (json_array_size(msgs) == 0) {
        api_error_set(e, 400, "messages", NULL, "messages: at least one message is required");
        return false;
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!api_json_item(K, "messages", i, m, p, sizeof p, e)) return false;
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        api_path(q, sizeof q, p, "role", -1);
        if (!json_is_string(role)) {
            api_json_bad(K, e, q, "a valid string", role);
            return false;
        }
        bool user = !strcmp(json_string_value(role), "user");
        if (!user && strcmp(json_string_value(role), "assistant")) {
            api_error_set(e, 400, q, NULL, "%s: Input should be 'user' or 'assistant'", q);
            return false;
        }
        api_path(q, sizeof q, p, "content", -1);
        if (!content) {
            api_json_missing(K, e, q);
            return false;
        }
        conv_role cr = user ? CONV_ROLE_USER : CONV_ROLE_ASSISTANT;
        if (json_is_string(content)) {
            conv_add_turn(&r->conv, cr);
            conv_add_text(&r->conv, json_string_value(content), json_string_length(content));
            continue;
        }
        if (!json_is_array(content)) {
            api_json_type_error(K, e, q, "a valid string or a valid list", content);
            return false;
        }
        bool turn_open = false; /* the last turn takes this message's text blocks */
        if (!user) {
            conv_add_turn(&r->conv, cr);
            turn_open = true;
        }
        size_t j;
        json_t *b;
        json_array_foreach(content, j, b) {
            api_path(bp, sizeof bp, q, NULL, (int)j);
            if (!json_is_object(b)) {
                api_json_type_error(K, e, bp, "a valid dictionary", b);
                return false;
            }
            json_t *type = json_object_get(b, "type");
            char fp[160];
            if (!json_is_string(type)) {
                api_path(fp, sizeof fp, bp, "type", -1);
                api_json_bad(K, e, fp, "a valid string", type);
                return false;
            }
            const char *t = json_string_value(type);
            if (!strcmp(t, "text")) {
                json_t *tx = json_object_get(b, "text");
                if (!json_is_string(tx)) {
                    api_path(fp, sizeof fp, bp, "text", -1);
                    api_json_bad(K, e, fp, "a valid string", tx);
                    return false;
                }
                if (!turn_open) {
                    conv_add_turn(&r->conv, cr);
                    turn_open = true;
                }
                conv_add_text(&r->conv, json_string_value(tx), json_string_length(tx));
            } else if (!strcmp(t, "thinking") && !user) {
                json_t *tx = json_object_get(b, "thinking");
                if (!json_is_string(tx)) {
                    api_path(fp, sizeof fp, bp, "thinking", -1);
                    api_json_bad(K, e, fp, "a valid string", tx);
                    return false;
                }
                conv_add_reasoning(&r->conv, json_string_value(tx), json_string_length(tx));
            } else if (!strcmp(t, "redacted_thinking") && !user) {
                /* opaque: nothing to show the model */
            } else if (!strcmp(t, "tool_use") && !user) {
                json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
                const char *miss = !json_is_string(id) ? "id" : !json_is_string(name) ? "name" : NULL;
                if (miss) {
                    json_t *v = json_object_get(b, miss);
                    api_path(fp, sizeof fp, bp, miss, -1);
                    api_json_bad(K, e, fp, "a valid string", v);
                    return false;
                }
                if (!json_is_object(input)) {
                    api_path(fp, sizeof fp, bp, "input", -1);
                    api_json_bad(K, e, fp, "a valid dictionary", input);
                    return false;
                }
                char *args = api_json_dump(input);
                conv_add_tool_call(&r->conv, json_string_value(id), json_string_value(name), args, strlen(args));
                free(args);
            } else if (!strcmp(t, "tool_result") && user) {
                json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content");
                api_path(fp, sizeof fp, bp, "tool_use_id", -1);
                if (!json_is_string(id)) {
                    api_json_bad(K, e, fp, "a valid string", id);
                    return false;
                }
                char *text = (c && !json_is_null(c)) ? api_json_parts_text(K, c, api_path(fp, sizeof fp, bp, "content", -1), e)
                                                     : xstrdup("");
                if (!text) return false;
                conv_add_turn(&r->conv, CONV_ROLE_TOOL);
                conv_add_tool_result(&r->conv, json_string_value(id), NULL, text, strlen(text));
                free(text);
                turn_open = false;
            } else if (!strcmp(t, "image") || !strcmp(t, "document") || !strcmp(t, "search_result")) {
                api_json_value_error(K, e, bp, "content blocks of type '%s' are not supported by this model (text only)", t);
                return false;
            } else {
                api_path(fp, sizeof fp, bp, "type", -1);
                api_error_set(e, 400, fp, NULL, "%s: Input tag '%s' found using 'type' does not match any of the expected tags for a %s message",
                              fp, t, user ? "user" : "assistant");
                return false;
            }
        }
        if (!turn_open && user && json_array_size(content) == 0) {
            conv_add_turn(&r->conv, cr);
            conv_add_text(&r->conv, "", 0);
        }
    }
    return true;
}

static bool api_messages_tools(api_req *r, json_t *tools, api_error *e)
{
    char p[64], q[96];
    if (!json_is_array(tools)) {
        api_json_type_error(K, e, "tools", "a valid list", tools);
        return false;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (!api_json_item(K, "tools", i, t, p, sizeof p, e)) return false;
        json_t *type = json_object_get(t, "type");
        if (type && !json_is_null(type) && (!json_is_string(type) || strcmp(json_string_value(type), "custom"))) {
            api_json_value_error(K, e, api_path(q, sizeof q, p, "type", -1), "only custom (client) tools are supported by this server");
            return false;
        }
        if (!api_json_tool(K, t, p, "", &r->conv, e)) return false;
    }
    return true;
}

/* One block's cache_control, if it has one: {type: "ephemeral", ttl: "5m" | "1h"}. */
static bool api_messages_cache_control(json_t *b, const char *path, api_error *e)
{
    json_t *cc = json_is_object(b) ? json_object_get(b, "cache_control") : NULL;
    if (!cc || json_is_null(cc)) return true;
    char p[192], q[224];
    api_path(p, sizeof p, path, "cache_control", -1);
    if (!json_is_object(cc)) {
        api_json_type_error(K, e, p, "a valid dictionary", cc);
        return false;
    }
    static const char *const keys[] = {"type", "ttl", NULL};
    if (!api_json_known(K, cc, keys, p, e)) return false;
    json_t *type = json_object_get(cc, "type"), *ttl = json_object_get(cc, "ttl");
    if (!json_is_string(type) || strcmp(json_string_value(type), "ephemeral")) {
        api_path(q, sizeof q, p, "type", -1);
        api_error_set(e, 400, q, NULL, "%s: Input should be 'ephemeral'", q);
        return false;
    }
    if (ttl && !json_is_null(ttl) &&
        (!json_is_string(ttl) || (strcmp(json_string_value(ttl), "5m") && strcmp(json_string_value(ttl), "1h")))) {
        api_path(q, sizeof q, p, "ttl", -1);
        api_error_set(e, 400, q, NULL, "%s: Input should be '5m' or '1h'", q);
        return false;
    }
    return true;
}

/* cache_control on every block that may carry one: system blocks, message content blocks
 * (tool_result content blocks too), tools. The prefix cache keeps every full block of every
 * prompt whatever is marked (see api_messages_cache_written), so a breakpoint changes
 * nothing; it is accepted wherever Anthropic accepts one and its shape checked as Anthropic
 * checks it. Types are checked by the parsers after this, so anything else is skipped. */
static bool api_messages_cache_controls(json_t *root, api_error *e)
{
    char p[64], q[96], bp[128];
    size_t i, j, k;
    json_t *v, *m, *b, *c;
    json_t *sys = json_object_get(root, "system"), *msgs = json_object_get(root, "messages");
    json_t *tools = json_object_get(root, "tools");
    if (json_is_array(sys))
        json_array_foreach(sys, i, v) if (!api_messages_cache_control(v, api_path(p, sizeof p, "system", NULL, (int)i), e)) return false;
    if (json_is_array(tools))
        json_array_foreach(tools, i, v) if (!api_messages_cache_control(v, api_path(p, sizeof p, "tools", NULL, (int)i), e)) return false;
    if (!json_is_array(msgs)) return true;
    json_array_foreach(msgs, i, m) {
        json_t *content = json_is_object(m) ? json_object_get(m, "content") : NULL;
        if (!json_is_array(content)) continue;
        api_path(p, sizeof p, "messages", NULL, (int)i);
        api_path(q, sizeof q, p, "content", -1);
        json_array_foreach(content, j, b) {
            api_path(bp, sizeof bp, q, NULL, (int)j);
            if (!api_messages_cache_control(b, bp, e)) return false;
            json_t *inner = json_is_object(b) ? json_object_get(b, "content") : NULL;
            if (!json_is_array(inner)) continue;
            json_array_foreach(inner, k, c) {
                char ip[192], cp[224];
                api_path(ip, sizeof ip, bp, "content", -1);
                if (!api_messages_cache_control(c, api_path(cp, sizeof cp, ip, NULL, (int)k), e)) return false;
            }
        }
    }
    return true;
}

/* The fields both /v1/messages and count_tokens read. */
static bool api_messages_common(json_t *root, api_req *r, long long max_tokens, api_error *e)
{
    if (!api_messages_cache_controls(root, e)) return false;
    json_t *sys = json_object_get(root, "system");
    if (sys && !json_is_null(sys)) {
        char *text = api_json_parts_text(K, sys, "system", e);
        if (!text) return false;
        conv_add_turn(&r->conv, CONV_ROLE_SYSTEM);
        conv_add_text(&r->conv, text, strlen(text));
        free(text);
    }
    if (!api_messages_messages(r, json_object_get(root, "messages"), e)) return false;
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools) && !api_messages_tools(r, tools, e)) return false;
    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        json_t *t = json_is_object(tc) ? json_object_get(tc, "type") : NULL;
        const char *ts = json_is_string(t) ? json_string_value(t) : NULL;
        if (!ts || (strcmp(ts, "auto") && strcmp(ts, "any") && strcmp(ts, "tool") && strcmp(ts, "none"))) {
            api_error_set(e, 400, "tool_choice", NULL, "tool_choice: Input should be an object with type 'auto', 'any', 'tool' or 'none'");
            return false;
        }
        if (!strcmp(ts, "none")) {
            r->tools_mode = API_TOOLS_NONE;
            r->conv.n_tools = 0;
        } else if (!strcmp(ts, "any")) {
            r->tools_mode = API_TOOLS_REQUIRED;
        } else if (!strcmp(ts, "tool")) {
            json_t *name = json_object_get(tc, "name");
            if (!json_is_string(name)) {
                api_json_bad(K, e, "tool_choice.tool.name", "a valid string", name);
                return false;
            }
            r->tools_mode = API_TOOLS_NAMED;
            r->tool_name = xstrdup(json_string_value(name));
        }
        bool dp = false;
        if (strcmp(ts, "none") && api_json_bool(K, tc, "disable_parallel_tool_use", &dp, e) < 0) return false;
        r->one_call = dp;
    }
    r->conv.thinking = CONV_THINKING_OFF;
    json_t *th = json_object_get(root, "thinking");
    if (th && !json_is_null(th)) {
        json_t *t = json_is_object(th) ? json_object_get(th, "type") : NULL;
        const char *ts = json_is_string(t) ? json_string_value(t) : NULL;
        if (!ts || (strcmp(ts, "enabled") && strcmp(ts, "disabled") && strcmp(ts, "adaptive"))) {
            api_error_set(e, 400, "thinking", NULL, "thinking: Input tag does not match any of the expected tags: 'enabled', 'disabled'");
            return false;
        }
        if (!strcmp(ts, "enabled")) {
            long long bt = 0;
            int st = api_json_int(K, th, "budget_tokens", 1024, 1LL << 30, &bt, e);
            if (st < 0) {  /* e says "budget_tokens: ...": the field's full name in front */
                char msg[sizeof e->message];
                snprintf(msg, sizeof msg, "%s", e->message);
                api_error_set(e, 400, "thinking.budget_tokens", NULL, "thinking.%s", msg);
                return false;
            }
            if (st == 0) {
                api_json_missing(K, e, "thinking.enabled.budget_tokens");
                return false;
            }
            if (max_tokens > 0 && bt >= max_tokens) {
                api_error_set(e, 400, "thinking.budget_tokens", NULL, "`max_tokens` must be greater than `thinking.budget_tokens`.");
                return false;
            }
            r->thinking_budget = (int)bt;
            /* families that take an effort (harmony): a budget of 8k tokens or more is "high" */
            r->conv.effort = bt >= 8192 ? CONV_EFFORT_HIGH : CONV_EFFORT_MEDIUM;
        }
        if (strcmp(ts, "disabled")) r->conv.thinking = CONV_THINKING_ON;
    }
    return true;
}

/* Structured outputs: output_config {format, effort} and the beta's output_format, where a
 * format is {type: "json_schema", schema}: the answer's text block is a document of the schema
 * (constrained decoding, as response_format). */
static bool api_messages_output_format(json_t *fmt, const char *path, api_req *r, api_error *e)
{
    if (!fmt || json_is_null(fmt)) return true;
    if (!json_is_object(fmt)) {
        api_json_type_error(K, e, path, "a valid dictionary", fmt);
        return false;
    }
    json_t *t = json_object_get(fmt, "type");
    char p[64];
    snprintf(p, sizeof p, "%s.type", path);
    if (!json_is_string(t) || strcmp(json_string_value(t), "json_schema")) {
        api_error_set(e, 400, p, NULL, "%s: Input tag '%.40s' found using 'type' does not match any of the expected tags: 'json_schema'",
                      p, json_is_string(t) ? json_string_value(t) : "");
        return false;
    }
    static const char *const keys[] = {"type", "schema", "name", "strict", NULL};
    if (!api_json_known(K, fmt, keys, path, e)) return false;
    return api_json_format(K, fmt, path, true, r, e);
}

static bool api_messages_output(json_t *root, api_req *r, api_error *e)
{
    json_t *oc = json_object_get(root, "output_config"), *of = json_object_get(root, "output_format");
    if (oc && !json_is_null(oc)) {
        if (!json_is_object(oc)) {
            api_json_type_error(K, e, "output_config", "a valid dictionary", oc);
            return false;
        }
        static const char *const keys[] = {"format", "effort", NULL};
        if (!api_json_known(K, oc, keys, "output_config", e)) return false;
        const char *eff;
        int st = api_json_str(K, oc, "effort", &eff, e);
        if (st < 0) return false;
        if (st) {
            if (!strcmp(eff, "low")) r->conv.effort = CONV_EFFORT_LOW;
            else if (!strcmp(eff, "medium")) r->conv.effort = CONV_EFFORT_MEDIUM;
            else if (!strcmp(eff, "high") || !strcmp(eff, "max")) r->conv.effort = CONV_EFFORT_HIGH;
            else {
                api_error_set(e, 400, "output_config.effort", NULL,
                              "output_config.effort: Input should be 'low', 'medium', 'high' or 'max'");
                return false;
            }
        }
        json_t *f = json_object_get(oc, "format");
        if (f && !json_is_null(f) && of && !json_is_null(of)) {
            api_error_set(e, 400, "output_format", NULL,
                          "output_format: give the format in output_config.format or in output_format, not both");
            return false;
        }
        if (!api_messages_output_format(f, "output_config.format", r, e)) return false;
    }
    return api_messages_output_format(of, "output_format", r, e);
}

api_status api_messages_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e)
{
    json_t *root;
    if (!api_json_load(K, body, len, &root, e)) return API_ERR;
    api_status ret = API_ERR;
    double x;
    long long k;
    int st;
    if (!api_json_known(K, root, api_messages_keys, "", e)) goto out;
    if (!api_json_cache(K, root, r, e)) goto out;
    if (!api_json_model(cfg, K, root, r, e)) goto out;
    if (!api_json_logit_bias(K, root, cfg ? cfg->n_vocab : 0, &r->sp, e)) goto out;
    if ((st = api_json_int(K, root, "max_tokens", 1, 1 << 30, &k, e)) < 0) goto out;
    if (st == 0) {
        api_json_missing(K, e, "max_tokens");
        goto out;
    }
    r->max_tokens = (int)k;
    if (!api_messages_common(root, r, k, e)) goto out;
    if (!api_messages_output(root, r, e)) goto out;
    if ((st = api_json_num(K, root, "temperature", 0, 1, &x, e)) < 0) goto out;
    if (st) r->sp.temp = (float)x;
    if ((st = api_json_num(K, root, "top_p", 0, 1, &x, e)) < 0) goto out;
    if (st) r->sp.top_p = (float)x;
    if ((st = api_json_int(K, root, "top_k", 0, 1 << 30, &k, e)) < 0) goto out;
    if (st) r->sp.top_k = (int)k;
    if ((st = api_json_num(K, root, "min_p", 0, 1, &x, e)) < 0) goto out;
    if (st) r->sp.min_p = (float)x;
    if ((st = api_json_int(K, root, "seed", -(1LL << 62), 1LL << 62, &k, e)) < 0) goto out;
    if (st) r->sp.seed = (uint64_t)k, r->seed_given = true;
    if (!api_json_stop(K, root, "stop_sequences", r, e)) goto out;
    if (json_is_string(json_object_get(root, "stop_sequences"))) {
        api_json_type_error(K, e, "stop_sequences", "a valid list", json_object_get(root, "stop_sequences"));
        goto out;
    }
    if (api_json_bool(K, root, "stream", &r->stream, e) < 0) goto out;
    if (api_json_bool(K, root, "return_token_ids", &r->return_token_ids, e) < 0) goto out;
    json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_null(md) && !json_is_object(md)) {
        api_json_type_error(K, e, "metadata", "a valid dictionary", md);
        goto out;
    }
    if (json_is_object(md)) {  /* Anthropic's metadata has one field, the end user's id */
        static const char *const md_keys[] = {"user_id", NULL};
        const char *uid;
        if (!api_json_known(K, md, md_keys, "metadata", e)) goto out;
        if (api_json_str(K, md, "user_id", &uid, e) < 0) {
            api_json_type_error(K, e, "metadata.user_id", "a valid string", json_object_get(md, "user_id"));
            goto out;
        }
    }
    json_t *mcp = json_object_get(root, "mcp_servers");
    if (mcp && !json_is_null(mcp) && !(json_is_array(mcp) && json_array_size(mcp) == 0)) {
        api_json_value_error(K, e, "mcp_servers", "MCP servers are not supported by this server");
        goto out;
    }
    ret = API_OK;
out:
    json_decref(root);
    return ret;
}

api_status api_messages_count_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e)
{
    json_t *root;
    if (!api_json_load(K, body, len, &root, e)) return API_ERR;
    api_status ret = API_ERR;
    if (!api_json_known(K, root, api_messages_count_keys, "", e)) goto out;
    if (!api_json_model(cfg, K, root, r, e)) goto out;
    if (!api_messages_common(root, r, 0, e)) goto out;
    if (api_json_bool(K, root, "return_token_ids", &r->return_token_ids, e) < 0) goto out;
    ret = API_OK;
out:
    json_decref(root);
    return ret;
}

void api_messages_count_json(int input_tokens, bytebuf *out) { bytebuf_printf(out, "{\"input_tokens\":%d}", input_tokens); }

/* ------------------------------------------------------------------ output */

static const char *api_messages_stop_reason(const api_choice *c)
{
    if (c->stop_index >= 0) return "stop_sequence";
    if (c->finish == EVENTS_FINISH_LENGTH) return "max_tokens";
    if (c->finish == EVENTS_FINISH_TOOL_CALLS) return "tool_use";
    return "end_turn";
}

/* Prompt tokens the request wrote to the prefix cache (cache_creation_input_tokens): every
 * full block of the prompt is kept (keyed in RAM, and in the block store when there is one),
 * so the tokens of full blocks it computed rather than read are those it wrote, whether or
 * not the request marked a cache_control breakpoint. Anthropic's input_tokens counts what
 * was neither read nor written. */
static int api_messages_cache_written(const api_usage *u)
{
    return TM_MAX(0, u->prompt_tokens / KVPOOL_BLOCK * KVPOOL_BLOCK - u->cached_tokens);
}

static void api_messages_usage(const api_out *o, bool with_output, bytebuf *b)
{
    const api_usage *u = &o->usage;
    int written = api_messages_cache_written(u);
    bytebuf_printf(b, "{\"input_tokens\":%d,\"cache_creation_input_tokens\":%d,\"cache_read_input_tokens\":%d,\"output_tokens\":%d}",
                   u->prompt_tokens - u->cached_tokens - written, written, u->cached_tokens,
                   with_output ? u->completion_tokens : 0);
}

static void api_messages_block(const api_item *it, bool done, bytebuf *b)
{
    const char *text = done && it->text.p ? it->text.p : "";
    size_t tlen = done ? it->text.len : 0;
    switch (it->kind) {
    case API_ITEM_TEXT:
        bytebuf_puts(b, "{\"type\":\"text\",\"text\":");
        api_buf_strn(b, text, tlen);
        bytebuf_putc(b, '}');
        break;
    case API_ITEM_REASONING:
        bytebuf_puts(b, "{\"type\":\"thinking\",\"thinking\":");
        api_buf_strn(b, text, tlen);
        bytebuf_puts(b, ",\"signature\":\"\"}");
        break;
    case API_ITEM_TOOL:
        bytebuf_puts(b, "{\"type\":\"tool_use\",\"id\":");
        api_buf_str(b, it->id);
        bytebuf_puts(b, ",\"name\":");
        api_buf_str(b, it->name);
        bytebuf_puts(b, ",\"input\":");
        if (done && tlen) bytebuf_append(b, text, tlen);
        else bytebuf_puts(b, "{}");
        bytebuf_putc(b, '}');
        break;
    }
}

static void api_messages_message(api_out *o, bool final, bytebuf *b)
{
    const api_choice *c = &o->choices[0];
    bytebuf_puts(b, "{\"id\":");
    api_buf_str(b, o->id);
    bytebuf_puts(b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    api_buf_str(b, o->model);
    bytebuf_puts(b, ",\"content\":[");
    if (final)
        for (int k = 0; k < c->n_items; k++) {
            if (k) bytebuf_putc(b, ',');
            api_messages_block(&c->items[k], true, b);
        }
    bytebuf_puts(b, "],\"stop_reason\":");
    api_buf_str(b, final ? api_messages_stop_reason(c) : NULL);
    bytebuf_puts(b, ",\"stop_sequence\":");
    api_buf_str(b, final && c->stop_index >= 0 ? o->req->stop[c->stop_index] : NULL);
    bytebuf_puts(b, ",\"usage\":");
    api_messages_usage(o, final, b);
    if (final && o->req->return_token_ids) {
        bytebuf_puts(b, ",\"prompt_token_ids\":[");
        for (int k = 0; k < o->n_prompt_ids; k++) bytebuf_printf(b, "%s%d", k ? "," : "", o->prompt_ids[k]);
        bytebuf_putc(b, ']');
    }
    bytebuf_putc(b, '}');
}

static void api_messages_event(api_out *o, const char *type, const char *fields, size_t flen)
{
    api_sse_typed(&o->out, type, -1, fields, flen);
}

static void api_messages_begin(api_out *o)
{
    bytebuf f = {0};
    bytebuf_puts(&f, "\"message\":");
    api_messages_message(o, false, &f);
    api_messages_event(o, "message_start", f.p, f.len);
    api_messages_event(o, "ping", "", 0);
    bytebuf_free(&f);
}

static void api_messages_on(api_out *o, int i, api_op op, api_item *it, const char *d, size_t len)
{
    if (i != 0) return;
    api_choice *c = &o->choices[0];
    if (op == API_OP_OPEN && it->kind == API_ITEM_TOOL) {
        /* toolu_ + the splitter's id without its call_ prefix */
        const char *tail = strncmp(it->call_id, "call_", 5) ? it->call_id : it->call_id + 5;
        snprintf(it->id, sizeof it->id, "toolu_%s", tail);
    }
    if (!o->req->stream || op == API_OP_FINISH) return;
    int bi = c->n_items - 1;
    bytebuf f = {0};
    switch (op) {
    case API_OP_OPEN:
        bytebuf_printf(&f, "\"index\":%d,\"content_block\":", bi);
        api_messages_block(it, false, &f);
        api_messages_event(o, "content_block_start", f.p, f.len);
        break;
    case API_OP_DELTA:
        bytebuf_printf(&f, "\"index\":%d,\"delta\":{\"type\":", bi);
        if (it->kind == API_ITEM_TEXT) bytebuf_puts(&f, "\"text_delta\",\"text\":");
        else if (it->kind == API_ITEM_REASONING) bytebuf_puts(&f, "\"thinking_delta\",\"thinking\":");
        else bytebuf_puts(&f, "\"input_json_delta\",\"partial_json\":");
        api_buf_strn(&f, d, len);
        bytebuf_putc(&f, '}');
        api_messages_event(o, "content_block_delta", f.p, f.len);
        break;
    case API_OP_CLOSE:
        if (it->kind == API_ITEM_REASONING) {
            bytebuf_printf(&f, "\"index\":%d,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"\"}", bi);
            api_messages_event(o, "content_block_delta", f.p, f.len);
            f.len = 0;
        }
        bytebuf_printf(&f, "\"index\":%d", bi);
        api_messages_event(o, "content_block_stop", f.p, f.len);
        break;
    default: break;
    }
    bytebuf_free(&f);
}

static void api_messages_end(api_out *o)
{
    if (!o->req->stream) {
        api_messages_message(o, true, &o->out);
        return;
    }
    const api_choice *c = &o->choices[0];
    bytebuf f = {0};
    bytebuf_puts(&f, "\"delta\":{\"stop_reason\":");
    api_buf_str(&f, api_messages_stop_reason(c));
    bytebuf_puts(&f, ",\"stop_sequence\":");
    api_buf_str(&f, c->stop_index >= 0 ? o->req->stop[c->stop_index] : NULL);
    bytebuf_puts(&f, "},\"usage\":");
    api_messages_usage(o, true, &f);
    api_messages_event(o, "message_delta", f.p, f.len);
    api_messages_event(o, "message_stop", "", 0);
    bytebuf_free(&f);
}

const api_format api_messages_format = {
    .id_prefix = "msg_",
    .parse = api_messages_parse,
    .begin = api_messages_begin,
    .on = api_messages_on,
    .end = api_messages_end,
};

/* ------------------------------------------------------------------ routes */

static void api_messages_handle(http_request *r, void *user) { api_serve(r, user, API_KIND_MESSAGES, false, NULL); }
static void api_messages_count_handle(http_request *r, void *user) { api_serve(r, user, API_KIND_MESSAGES, true, NULL); }

void api_messages_register(http_server *h, api_ctx *c)
{
    http_route(h, "POST", "/v1/messages", api_messages_handle, c);
    http_route(h, "POST", "/v1/messages/count_tokens", api_messages_count_handle, c);
}
