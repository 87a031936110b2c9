/*
 * cmd_template: `tokenmill template -m MODEL [--template NAME] [--template-file FILE] [--threads N] --input CONV.json`
 * renders a conversation with the model's chat template and prints
 * {"template": NAME, "ids": [...], "text": "...", "markers": {...}} (tests compare the ids
 * with llama.cpp's tokenisation of the reference Jinja rendering). An input that is a JSON
 * array of conversations prints one such line per conversation. Without --template a model
 * whose template is none of the families' reference texts is rendered by the Jinja
 * interpreter ("template": "jinja"); a template the interpreter refuses exits with status 2.
 *
 * Input (close to an OpenAI Chat Completions body):
 *   {"messages": [{"role": "system"|"developer"|"user"|"assistant"|"tool",
 *                  "content": string | null | [{"type": "text", "text": ...}, ...],
 *                  "reasoning_content": string,                       (assistant)
 *                  "tool_calls": [{"id", "function": {"name", "arguments": string|object}}],
 *                  "tool_call_id": string, "name": string}],         (tool)
 *    "tools": [{"type": "function", "function": {"name", "description", "parameters"}}],
 *    "add_generation_prompt": bool (default true), "enable_thinking": bool (default: the
 *    family's), "reasoning_effort": "low"|"medium"|"high", "date": "YYYY-MM-DD" (templates
 *    that print the current date; default today, UTC), "chat_template_kwargs": {...}
 *    (more variables for a Jinja template)}
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cli/cmd_opts.h"
#include "model/gguf.h"
#include "recipe/conv.h"
#include "recipe/template.h"
#include "recipe/tokenizer.h"
#include "util/threadpool.h"
#include "util/util.h"

/* Appends the content of a message (string, null or array of text parts) as `kind`. */
static bool cmd_template_content(conv *c, json_t *content, conv_role role)
{
    if (!content || json_is_null(content)) return true;
    if (json_is_string(content)) {
        if (role == CONV_ROLE_TOOL) return true; /* handled by the caller */
        conv_add_text(c, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content)) return false;
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p) {
        json_t *tx = json_object_get(p, "text");
        if (!json_is_string(tx)) return false;
        conv_add_text(c, json_string_value(tx), json_string_length(tx));
    }
    return true;
}

static bool cmd_template_parse(conv *c, json_t *root, char *err, size_t errsz)
{
    json_t *msgs = json_object_get(root, "messages");
    if (!json_is_array(msgs)) {
        snprintf(err, errsz, "\"messages\" must be an array");
        return false;
    }
    json_t *agp = json_object_get(root, "add_generation_prompt");
    if (agp) c->add_generation_prompt = json_is_true(agp);
    json_t *th = json_object_get(root, "enable_thinking");
    if (th) c->thinking = json_is_true(th) ? CONV_THINKING_ON : CONV_THINKING_OFF;
    const char *eff = json_string_value(json_object_get(root, "reasoning_effort"));
    if (eff) c->effort = !strcmp(eff, "low") ? CONV_EFFORT_LOW : !strcmp(eff, "high") ? CONV_EFFORT_HIGH : CONV_EFFORT_MEDIUM;
    const char *date = json_string_value(json_object_get(root, "date"));
    if (date) c->date = conv_strdup(c, date, strlen(date));
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (json_is_object(kw)) {
        char *d = json_dumps(kw, JSON_COMPACT);
        c->template_kwargs = conv_strdup(c, d, strlen(d));
        free(d);
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        conv_role r;
        if (!role) { snprintf(err, errsz, "message %zu has no role", i); return false; }
        if (!strcmp(role, "system")) r = CONV_ROLE_SYSTEM;
        else if (!strcmp(role, "developer")) r = CONV_ROLE_DEVELOPER;
        else if (!strcmp(role, "user")) r = CONV_ROLE_USER;
        else if (!strcmp(role, "assistant")) r = CONV_ROLE_ASSISTANT;
        else if (!strcmp(role, "tool")) r = CONV_ROLE_TOOL;
        else { snprintf(err, errsz, "message %zu: unknown role '%s'", i, role); return false; }
        conv_add_turn(c, r);
        json_t *content = json_object_get(m, "content");
        if (r == CONV_ROLE_TOOL) {
            const char *s = json_string_value(content);
            conv_add_tool_result(c, json_string_value(json_object_get(m, "tool_call_id")),
                                 json_string_value(json_object_get(m, "name")), s ? s : "", s ? json_string_length(content) : 0);
            continue;
        }
        json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc)) conv_add_reasoning(c, json_string_value(rc), json_string_length(rc));
        if (!cmd_template_content(c, content, r)) {
            snprintf(err, errsz, "message %zu: bad content", i);
            return false;
        }
        json_t *calls = json_object_get(m, "tool_calls");
        size_t k;
        json_t *tc;
        json_array_foreach(calls, k, tc) {
            json_t *fn = json_object_get(tc, "function");
            json_t *args = json_object_get(fn, "arguments");
            char *dumped = NULL;
            const char *a = "{}";
            if (json_is_string(args)) a = json_string_value(args);
            else if (args) a = dumped = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
            conv_add_tool_call(c, json_string_value(json_object_get(tc, "id")),
                               json_string_value(json_object_get(fn, "name")), a, strlen(a));
            free(dumped);
        }
    }
    json_t *tools = json_object_get(root, "tools");
    size_t k;
    json_t *tl;
    json_array_foreach(tools, k, tl) {
        json_t *fn = json_object_get(tl, "function");
        if (!fn) fn = tl;
        json_t *params = json_object_get(fn, "parameters");
        char *p = params ? json_dumps(params, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        conv_add_tool(c, json_string_value(json_object_get(fn, "name")),
                      json_string_value(json_object_get(fn, "description")), p);
        free(p);
    }
    return true;
}

/* Renders one conversation and prints its JSON line; 0 on success. */
static int cmd_template_one(const template *t, json_t *root, threadpool *tp)
{
    char err[512] = "";
    conv c;
    conv_init(&c);
    template_prompt p = { 0 };
    int rc = 1;
    if (!cmd_template_parse(&c, root, err, sizeof err)) {
        fprintf(stderr, "tokenmill template: %s\n", err);
        goto out;
    }
    if (template_apply(t, &c, tp, &p, err, sizeof err) != TEMPLATE_OK) {
        fprintf(stderr, "tokenmill template: %s\n", err);
        goto out;
    }
    events_markers mk;
    template_markers(t, &c, &mk);
    json_t *o = json_object();
    json_object_set_new(o, "template", json_string(template_name(t)));
    json_object_set_new(o, "tool_format", json_string(template_tool_format(t)));
    json_t *ids = json_array();
    for (size_t i = 0; i < p.n_ids; i++) json_array_append_new(ids, json_integer(p.ids[i]));
    json_object_set_new(o, "ids", ids);
    json_object_set_new(o, "text", json_stringn(p.text, p.text_len));
    /* what a Jinja template gets as bos_token / eos_token (tests hand them to the oracle) */
    const tokenizer *tok = template_tokenizer(t);
    size_t bl = 0, el = 0;
    const char *bp = tokenizer_bos(tok) >= 0 ? tokenizer_piece(tok, tokenizer_bos(tok), &bl) : NULL;
    const char *ep = tokenizer_eos(tok) >= 0 ? tokenizer_piece(tok, tokenizer_eos(tok), &el) : NULL;
    json_object_set_new(o, "bos_token", json_stringn(bp ? bp : "", bp ? bl : 0));
    json_object_set_new(o, "eos_token", json_stringn(ep ? ep : "", ep ? el : 0));
    json_t *mj = json_object();
    json_object_set_new(mj, "think_start", json_integer(mk.think_start));
    json_object_set_new(mj, "think_end", json_integer(mk.think_end));
    json_object_set_new(mj, "tool_start", json_integer(mk.tool_start));
    json_object_set_new(mj, "tool_end", json_integer(mk.tool_end));
    json_object_set_new(mj, "starts_in_reasoning", json_boolean(mk.starts_in_reasoning));
    json_object_set_new(o, "markers", mj);
    char *s = json_dumps(o, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(o);
    rc = 0;
out:
    if (rc) {
        /* keep one line per conversation: {"error": MESSAGE} */
        json_t *e = json_pack("{s:s}", "error", err);
        char *es = json_dumps(e, JSON_COMPACT);
        puts(es);
        free(es);
        json_decref(e);
    }
    template_prompt_free(&p);
    conv_free(&c);
    return rc;
}

int cmd_template(int argc, char **argv)
{
    const char *model_path = NULL, *name = NULL, *input = NULL, *file = NULL;
    long threads = 1;
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF whose vocabulary and template to use", .required = true },
        { "--template", NULL, CMD_OPT_STR, &name, .arg = "NAME", .help = "chat template: auto (the default: the family whose reference text the template is, else the Jinja interpreter), jinja, or a family" },
        { "--template-file", NULL, CMD_OPT_STR, &file, .arg = "FILE", .help = "a Jinja chat template to use instead of the model's own" },
        { "--input", NULL, CMD_OPT_STR, &input, .arg = "CONV.json", .help = "the conversation", .required = true },
        { "--threads", NULL, CMD_OPT_LONG, &threads, 0, 1024, .arg = "N", .help = "tokenise a long prompt's text runs on N threads (default 1)" },
        { 0 },
    };
    const char *synopsis = "template -m MODEL --input CONV.json [options]: the prompt's token ids as JSON";
    cmd_opts_status ost = cmd_opts_parse("template", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);

    int rc = 1;
    char err[512] = "";
    gguf *g = NULL;
    tokenizer *tok = NULL;
    template *t = NULL;
    json_t *root = NULL;
    threadpool *tp = NULL;

    if (gguf_open(model_path, &g, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tokenmill template: %s\n", err);
        goto done;
    }
    if (tokenizer_load(g, &tok, err, sizeof err) != TOKENIZER_OK) {
        fprintf(stderr, "tokenmill template: %s\n", err);
        goto done;
    }
    if (template_open_file(tok, g, name, file, &t, err, sizeof err) != TEMPLATE_OK) {
        fprintf(stderr, "tokenmill template: %s\n", err);
        rc = 2;
        goto done;
    }
    json_error_t jerr;
    root = json_load_file(input, 0, &jerr);
    if (!root) {
        fprintf(stderr, "tokenmill template: %s: %s (line %d)\n", input, jerr.text, jerr.line);
        goto done;
    }
    if (threads > 1) tp = threadpool_new((int)TM_MIN(threads, 16));   /* more would split no further */
    if (json_is_array(root)) {
        /* a batch: one output line per conversation */
        size_t i;
        json_t *one;
        rc = 0;
        json_array_foreach(root, i, one) {
            if (cmd_template_one(t, one, tp) != 0) rc = 1;
        }
    } else {
        rc = cmd_template_one(t, root, tp);
    }
done:
    threadpool_free(tp);
    json_decref(root);
    template_free(t);
    tokenizer_free(tok);
    gguf_close(g);
    return rc;
}
