/*
 * template_jinja: a template text with no renderer of its own, run by the Jinja interpreter.
 *
 * The conversation becomes the variables llama.cpp's server and tokenmill's oracle give a
 * template (messages with role, content, reasoning_content and thinking, tool_calls whose
 * arguments are objects, tool_call_id and name; tools; add_generation_prompt; bos_token and
 * eos_token; enable_thinking and reasoning_effort when the request set them; the request's
 * chat_template_kwargs), built as JSON text and read by the interpreter with every string in
 * it tainted. Roles are the enum's names and are not request text; bos_token and eos_token
 * are the vocabulary's. The rendering comes back with a taint flag per byte: untainted runs go
 * through tmpl_scaffold_n (special tokens in them by id), tainted runs through tmpl_text
 * (never a special token), so whatever a request's fields spell, the model reads it as text.
 * A template that does not write BOS gets it in front when the vocabulary asks for one, as
 * llama.cpp's tokenizer adds it (and llama.cpp strips a BOS the template wrote itself).
 *
 * At start-up the text is parsed and rendered once on a plain conversation, so a template
 * that does not parse, loops past the step bound, recurses too deep or writes too much ends
 * the start with a message instead of failing every request. A template that raises or fails
 * an operation on the probe is kept: some refuse a system turn, some need tools; a request
 * it cannot render gets its message.
 *
 * Tool calls in the output are parsed by the splitter of the format the template itself
 * writes: its text is searched for the known call syntaxes (Qwen/Hermes <tool_call>, DeepSeek
 * tool-call tokens, harmony channels, Llama 3's <|python_tag|> or JSON calls under header ids,
 * Mistral's [TOOL_CALLS], GLM's <tool_call> with <arg_key>, Qwen3.5's <tool_call> with
 * <function=N> and <parameter=K> tags, DeepSeek V3.2/V4's DSML tags); a
 * template with none of them gets text answers.
 */
#define _GNU_SOURCE /* memmem */
#include "recipe/template_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/jinja.h"
#include "util/sha256.h"
#include "util/util.h"

struct tmpl_jinja {
    jinja_program *prog;
    char *text;                 /* the template text (NUL-terminated) */
    size_t len;
    bool developer;             /* the template knows the developer role (else it reads system) */
    events_toolfmt toolfmt;     /* the call syntax the template writes */
    bool thinks;                /* the template writes <think> blocks */
    bool mistral_think;         /* the template writes [THINK] blocks (Magistral, Ministral 3) */
    bool null_calls;            /* a turn of tool calls with no text gets content none (else "") */
};

static bool tj_has(const tmpl_jinja *j, const char *z) { return memmem(j->text, j->len, z, strlen(z)) != NULL; }

static void tj_str(bytebuf *b, const char *s, size_t n) { jsonfmt_write_string(b, s, n); }

/* A call id as the template gets it. Mistral's templates raise on any id that is not 9
 * characters (and their models were trained on 9 alphanumerics); ids from elsewhere (an
 * Anthropic client's toolu_..., another server's call_...) become 9 alphanumerics drawn from
 * their SHA-256, so a call and its result still agree. */
static void tj_id(bytebuf *o, const tmpl_jinja *j, const char *id)
{
    size_t n = strlen(id), k = 0;
    while (k < n && ((id[k] >= '0' && id[k] <= '9') || (id[k] >= 'a' && id[k] <= 'z') || (id[k] >= 'A' && id[k] <= 'Z'))) k++;
    if (j->toolfmt != EVENTS_TOOLFMT_MISTRAL || (n == 9 && k == 9)) {
        tj_str(o, id, n);
        return;
    }
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint8_t md[32];
    char z[9];
    sha256_digest(id, n, md);
    for (int i = 0; i < 9; i++) z[i] = al[md[i] % 62];
    tj_str(o, z, 9);
}

/* The messages array as JSON; false (error recorded) when a call's arguments or a tool's
 * parameters are not JSON. */
static bool tj_messages(tmpl_b *b, const conv *c, const tmpl_jinja *j, bytebuf *o)
{
    bytebuf_putc(o, '[');
    for (int i = 0; i < c->n_turns; i++) {
        const conv_turn *t = &c->turns[i];
        conv_role r = t->role == CONV_ROLE_DEVELOPER && !j->developer ? CONV_ROLE_SYSTEM : t->role;
        if (i) bytebuf_putc(o, ',');
        bytebuf_puts(o, "{\"role\":");
        tj_str(o, conv_role_name(r), strlen(conv_role_name(r)));
        /* content: the text parts (a tool turn's results) joined; none for a call-only turn */
        conv_part_kind ck = t->role == CONV_ROLE_TOOL ? CONV_PART_TOOL_RESULT : CONV_PART_TEXT;
        int n_calls = conv_turn_count(t, CONV_PART_TOOL_CALL);
        size_t at = b->store.len;
        for (int k = 0; k < t->n_parts; k++)
            if (t->parts[k].kind == ck) bytebuf_append(&b->store, t->parts[k].text, t->parts[k].len);
        bytebuf_puts(o, ",\"content\":");
        /* a turn of calls with no text has none (OpenAI clients send null; the APIs do not
           keep "" apart from null), unless the template cannot take none there */
        if (n_calls && b->store.len == at && j->null_calls) bytebuf_puts(o, "null");
        else tj_str(o, b->store.p ? b->store.p + at : "", b->store.len - at);
        b->store.len = at;
        if (conv_turn_count(t, CONV_PART_REASONING)) {
            at = b->store.len;
            for (int k = 0; k < t->n_parts; k++)
                if (t->parts[k].kind == CONV_PART_REASONING) bytebuf_append(&b->store, t->parts[k].text, t->parts[k].len);
            bytebuf_puts(o, ",\"reasoning_content\":");
            tj_str(o, b->store.p ? b->store.p + at : "", b->store.len - at);
            bytebuf_puts(o, ",\"thinking\":");
            tj_str(o, b->store.p ? b->store.p + at : "", b->store.len - at);
            b->store.len = at;
        }
        if (n_calls) {
            bytebuf_puts(o, ",\"tool_calls\":[");
            int k = 0;
            for (int q = 0; q < t->n_parts; q++) {
                const conv_part *p = &t->parts[q];
                if (p->kind != CONV_PART_TOOL_CALL) continue;
                if (!jsonfmt_valid(p->args, p->args_len)) {
                    tmpl_fail(b, TEMPLATE_ERR_JSON, "%s is not valid JSON", "tool call arguments");
                    return false;
                }
                if (k++) bytebuf_putc(o, ',');
                bytebuf_puts(o, "{\"id\":");
                tj_id(o, j, p->id);
                bytebuf_puts(o, ",\"type\":\"function\",\"function\":{\"name\":");
                tj_str(o, p->name, strlen(p->name));
                bytebuf_puts(o, ",\"arguments\":");
                bytebuf_append(o, p->args, p->args_len);
                bytebuf_puts(o, "}}");
            }
            bytebuf_putc(o, ']');
        }
        if (t->role == CONV_ROLE_TOOL) {
            for (int q = 0; q < t->n_parts; q++) {
                const conv_part *p = &t->parts[q];
                if (p->kind != CONV_PART_TOOL_RESULT) continue;
                if (p->id && *p->id) {
                    bytebuf_puts(o, ",\"tool_call_id\":");
                    tj_id(o, j, p->id);
                }
                if (p->name && *p->name) {
                    bytebuf_puts(o, ",\"name\":");
                    tj_str(o, p->name, strlen(p->name));
                }
                break;
            }
        }
        bytebuf_putc(o, '}');
    }
    bytebuf_putc(o, ']');
    return true;
}

static bool tj_tools(tmpl_b *b, const conv *c, bytebuf *o)
{
    bytebuf_putc(o, '[');
    for (int i = 0; i < c->n_tools; i++) {
        const conv_tool *tl = &c->tools[i];
        if (i) bytebuf_putc(o, ',');
        if (tl->parameters && !jsonfmt_valid(tl->parameters, strlen(tl->parameters))) {
            tmpl_fail(b, TEMPLATE_ERR_JSON, "%s is not valid JSON", "a tool's parameters");
            return false;
        }
        tmpl_tool_openai(o, tl);
    }
    bytebuf_putc(o, ']');
    return true;
}

/* Renders c; on success *out holds the text and its taint. */
static bool tj_run(tmpl_b *b, const conv *c, const tmpl_jinja *j, jinja_output *out)
{
    const tokenizer *tok = template_tokenizer(b->t);
    bytebuf msgs = { 0 }, tools = { 0 };
    bool ok = tj_messages(b, c, j, &msgs) && tj_tools(b, c, &tools);
    if (!ok) {
        bytebuf_free(&msgs);
        bytebuf_free(&tools);
        return false;
    }
    jinja_var v[16 + 64];
    size_t n = 0;
    size_t bl = 0, el = 0;
    int32_t bos = tokenizer_bos(tok), eos = tokenizer_eos(tok);
    const char *bp = bos >= 0 ? tokenizer_piece(tok, bos, &bl) : NULL;
    const char *ep = eos >= 0 ? tokenizer_piece(tok, eos, &el) : NULL;
    v[n++] = (jinja_var){ .name = "messages", .kind = JINJA_VAR_JSON, .text = msgs.p, .len = msgs.len, .tainted = true };
    if (c->n_tools) v[n++] = (jinja_var){ .name = "tools", .kind = JINJA_VAR_JSON, .text = tools.p, .len = tools.len, .tainted = true };
    v[n++] = (jinja_var){ .name = "add_generation_prompt", .kind = JINJA_VAR_BOOL, .b = c->add_generation_prompt };
    v[n++] = (jinja_var){ .name = "bos_token", .kind = JINJA_VAR_STRING, .text = bp ? bp : "", .len = bp ? bl : 0 };
    v[n++] = (jinja_var){ .name = "eos_token", .kind = JINJA_VAR_STRING, .text = ep ? ep : "", .len = ep ? el : 0 };
    if (c->thinking != CONV_THINKING_DEFAULT)
        v[n++] = (jinja_var){ .name = "enable_thinking", .kind = JINJA_VAR_BOOL, .b = c->thinking == CONV_THINKING_ON };
    static const char *const efforts[] = { NULL, "low", "medium", "high" };
    if (c->effort != CONV_EFFORT_DEFAULT) {
        const char *e = efforts[c->effort];
        v[n++] = (jinja_var){ .name = "reasoning_effort", .kind = JINJA_VAR_STRING, .text = e, .len = strlen(e) };
    }
    /* chat_template_kwargs: each member a variable, request text like the messages */
    bytebuf keys = { 0 };
    size_t key_off[64];
    const char *kv_val[64];
    size_t kv_len[64], n_kw = 0;
    if (c->template_kwargs && jsonfmt_valid(c->template_kwargs, strlen(c->template_kwargs))) {
        size_t pos = 0, kl = strlen(c->template_kwargs);
        bytebuf key = { 0 };
        const char *val;
        size_t vl;
        while (n_kw < 64 && jsonfmt_next(c->template_kwargs, kl, &pos, &key, &val, &vl)) {
            key_off[n_kw] = keys.len;
            bytebuf_append(&keys, key.p ? key.p : "", key.len);
            bytebuf_putc(&keys, 0);
            kv_val[n_kw] = val;
            kv_len[n_kw++] = vl;
        }
        bytebuf_free(&key);
    }
    for (size_t k = 0; k < n_kw; k++)
        v[n++] = (jinja_var){ .name = keys.p + key_off[k], .kind = JINJA_VAR_JSON, .text = kv_val[k], .len = kv_len[k], .tainted = true };
    char err[400];
    jinja_status st = jinja_render(j->prog, v, n, c->date, NULL, out, err, sizeof err);
    bytebuf_free(&keys);
    bytebuf_free(&msgs);
    bytebuf_free(&tools);
    if (st != JINJA_OK) {
        tmpl_fail(b, st == JINJA_ERR_LIMIT ? TEMPLATE_ERR_LIMIT : TEMPLATE_ERR_TEMPLATE, "%s", err);
        return false;
    }
    return true;
}

void tmpl_render_jinja(tmpl_b *b, const conv *c, const tmpl_jinja *j)
{
    jinja_output o;
    if (!tj_run(b, c, j, &o)) return;
    /* the prompt's text is the rendering itself (blanks a special token strips included) */
    b->raw_shown = true;
    bytebuf_append(&b->shown, o.text, o.len);
    const tokenizer *tok = template_tokenizer(b->t);
    int32_t bos = tokenizer_bos(tok);
    if (bos >= 0 && tokenizer_add_bos(tok)) {
        size_t bl = 0;
        const char *bp = tokenizer_piece(tok, bos, &bl);
        bool has = bp && bl && o.len >= bl && !memcmp(o.text, bp, bl);
        for (size_t i = 0; has && i < bl; i++) has = !o.taint[i];
        if (!has) tmpl_bos(b);
    }
    for (size_t i = 0; i < o.len;) {
        size_t e = i;
        while (e < o.len && o.taint[e] == o.taint[i]) e++;
        if (o.taint[i]) tmpl_text(b, o.text + i, e - i);
        else tmpl_scaffold_n(b, o.text + i, e - i);
        i = e;
    }
    jinja_output_free(&o);
}

/* Renders c; TEMPLATE_ERR_LIMIT (and err) when a bound was passed, TEMPLATE_ERR_TEMPLATE when
 * the template failed otherwise. */
static template_status tj_probe(const template *t, const tmpl_jinja *j, const conv *c, char *err, size_t errsz)
{
    char berr[400] = "";
    tmpl_b b = { .t = t, .err = berr, .errsz = sizeof berr };
    tmpl_render_jinja(&b, c, j);
    free(b.segs);
    bytebuf_free(&b.runs);
    bytebuf_free(&b.shown);
    bytebuf_free(&b.store);
    bytebuf_free(&b.json);
    bytebuf_free(&b.json_src);
    if (b.st == TEMPLATE_ERR_LIMIT) snprintf(err, errsz, "the chat template cannot be used: on a plain conversation, %s", berr);
    return b.st == TEMPLATE_OK ? TEMPLATE_OK : b.st == TEMPLATE_ERR_LIMIT ? TEMPLATE_ERR_LIMIT : TEMPLATE_ERR_TEMPLATE;
}

template_status tmpl_jinja_new(const template *t, const char *text, size_t n, tmpl_jinja **out, char *err, size_t errsz)
{
    *out = NULL;
    tmpl_jinja *j = xcalloc(1, sizeof *j);
    j->text = xmalloc(n + 1);
    memcpy(j->text, text, n);
    j->text[n] = 0;
    j->len = n;
    char perr[400];
    if (jinja_parse(text, n, &j->prog, perr, sizeof perr) != JINJA_OK) {
        snprintf(err, errsz, "the chat template cannot be used: %s", perr);
        tmpl_jinja_free(j);
        return TEMPLATE_ERR_TEMPLATE;
    }
    j->developer = tj_has(j, "developer");
    j->thinks = tj_has(j, "<think>");
    j->mistral_think = tj_has(j, "[THINK]");
    /* DeepSeek V3.2 / V4 spell their DSML tags through a variable */
    if (tj_has(j, "dsml_token") && tj_has(j, "DSML") && (tj_has(j, "function_calls") || tj_has(j, "tool_calls")))
        j->toolfmt = EVENTS_TOOLFMT_DSML;
    else if (tj_has(j, "<arg_key>") && tj_has(j, "<tool_call>")) j->toolfmt = EVENTS_TOOLFMT_GLM;
    else if (tj_has(j, "<tool_call>") && tj_has(j, "<function=") && tj_has(j, "<parameter="))
        j->toolfmt = EVENTS_TOOLFMT_XML;  /* Qwen3.5, Qwen3-Coder */
    else if (tj_has(j, "[TOOL_CALLS]")) j->toolfmt = EVENTS_TOOLFMT_MISTRAL;
    else if (tj_has(j, "<tool_call>")) j->toolfmt = EVENTS_TOOLFMT_QWEN;
    else if (tj_has(j, "<｜tool▁calls▁begin｜>") || tj_has(j, "<｜tool▁call▁begin｜>")) j->toolfmt = EVENTS_TOOLFMT_DEEPSEEK;
    else if (tj_has(j, "<|channel|>") && tj_has(j, "<|call|>")) j->toolfmt = EVENTS_TOOLFMT_HARMONY;
    else if (tj_has(j, "<|python_tag|>") || (tj_has(j, "<|start_header_id|>") && tj_has(j, "\"parameters\"")))
        j->toolfmt = EVENTS_TOOLFMT_LLAMA3;
    /* the probe: a plain conversation must render within the bounds */
    conv c;
    conv_init(&c);
    c.add_generation_prompt = true;
    c.date = "2025-01-01";
    conv_add_message(&c, CONV_ROLE_SYSTEM, "You are a helpful assistant.");
    conv_add_message(&c, CONV_ROLE_USER, "Hello!");
    template_status st = tj_probe(t, j, &c, err, errsz);
    conv_free(&c);
    if (st == TEMPLATE_ERR_LIMIT) {
        tmpl_jinja_free(j);
        return st;
    }
    /* a turn of tool calls with no text: none if the template takes it, as llama.cpp decides */
    conv_init(&c);
    c.add_generation_prompt = true;
    c.date = "2025-01-01";
    conv_add_tool(&c, "f", "A function.", "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}");
    conv_add_message(&c, CONV_ROLE_USER, "Call f.");
    conv_add_turn(&c, CONV_ROLE_ASSISTANT);
    conv_add_tool_call(&c, "call_1", "f", "{\"a\":\"x\"}", 9);
    conv_add_turn(&c, CONV_ROLE_TOOL);
    conv_add_tool_result(&c, "call_1", "f", "ok", 2);
    j->null_calls = true;
    char perr2[8];
    if (tj_probe(t, j, &c, perr2, sizeof perr2) != TEMPLATE_OK) {
        j->null_calls = false;
        if (tj_probe(t, j, &c, perr2, sizeof perr2) != TEMPLATE_OK) j->null_calls = true;
    }
    conv_free(&c);
    *out = j;
    return TEMPLATE_OK;
}

void tmpl_jinja_free(tmpl_jinja *j)
{
    if (!j) return;
    jinja_program_free(j->prog);
    free(j->text);
    free(j);
}

void tmpl_jinja_markers(const template *t, const tmpl_jinja *j, const conv *c, events_markers *m)
{
    const tokenizer *tok = template_tokenizer(t);
    m->toolfmt = j->toolfmt;
    if (j->thinks) {
        m->think_start = tmpl_find(tok, "<think>");
        m->think_end = tmpl_find(tok, "</think>");
    } else if (j->mistral_think) {
        m->think_start = tmpl_find(tok, "[THINK]");
        m->think_end = tmpl_find(tok, "[/THINK]");
    }
    tmpl_tool_markers(tok, j->toolfmt, m);
    /* a format whose markers the vocabulary lacks writes no calls */
    switch (j->toolfmt) {
    case EVENTS_TOOLFMT_QWEN:
    case EVENTS_TOOLFMT_DEEPSEEK:
    case EVENTS_TOOLFMT_MISTRAL:
        if (m->tool_start < 0) m->toolfmt = EVENTS_TOOLFMT_NONE;
        break;
    case EVENTS_TOOLFMT_DSML:
        m->tools = c;
        m->dsml_v32 = !tj_has(j, "tool_calls");
        if (m->tool_start < 0) m->toolfmt = EVENTS_TOOLFMT_NONE;
        break;
    case EVENTS_TOOLFMT_XML:
        m->tools = c;
        if (m->tool_start < 0 || m->tool_end < 0) m->toolfmt = EVENTS_TOOLFMT_NONE;
        break;
    case EVENTS_TOOLFMT_GLM:
        m->tools = c;
        if (m->tool_start < 0 || m->tool_end < 0 || m->arg_key < 0 || m->arg_key_end < 0 || m->arg_val < 0 ||
            m->arg_val_end < 0)
            m->toolfmt = EVENTS_TOOLFMT_NONE;
        break;
    case EVENTS_TOOLFMT_HARMONY:
        if (m->h_start < 0 || m->h_channel < 0 || m->h_message < 0) m->toolfmt = EVENTS_TOOLFMT_NONE;
        if (c->add_generation_prompt) m->h_forced = NULL;
        break;
    default:
        break;
    }
    /* does the prompt end inside an open think block? Render it and look at its end. */
    if (m->think_start >= 0 && c->add_generation_prompt) {
        char berr[400];
        tmpl_b b = { .t = t, .err = berr, .errsz = sizeof berr };
        jinja_output o;
        if (tj_run(&b, c, j, &o)) {
            size_t e = o.len;
            while (e && (o.text[e - 1] == '\n' || o.text[e - 1] == ' ')) e--;
            m->starts_in_reasoning = e >= 7 && !memcmp(o.text + e - 7, "<think>", 7) && !o.taint[e - 1];
            jinja_output_free(&o);
        }
        bytebuf_free(&b.store);
    }
}
