/*
 * template_harmony: the harmony (gpt-oss) chat template. It follows openai-gpt-oss-120b.jinja
 * statement by statement through the builder of template_int.h: the system message with the
 * date and the reasoning effort, the developer message with the instructions and the tools
 * written as a TypeScript namespace (render_typescript_type), then each turn on its channel.
 * Tool parameters are read as raw JSON values (tmpl_jv) with Jinja's truthiness and printing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/jsonfmt.h"
#include "recipe/template_int.h"
#include "util/bytebuf.h"

/* A raw JSON value inside a tool's parameters (n == 0: Jinja undefined). */
typedef struct {
    const char *p;   /* value text */
    size_t n;        /* bytes */
} tmpl_jv;

static tmpl_jv tmpl_jget(tmpl_jv o, const char *key)
{
    tmpl_jv r = { "", 0 };
    if (o.n && o.p[0] == '{' && !jsonfmt_get_member(o.p, o.n, key, &r.p, &r.n)) r.n = 0;
    return r;
}

/* Jinja truthiness: false, null, 0, "", [] and {} are false. */
static bool tmpl_jtruthy(tmpl_jv v)
{
    if (!v.n) return false;
    switch (v.p[0]) {
    case 'n':
    case 'f': return false;
    case 't': return true;
    case '"': return v.n > 2;
    case '{':
    case '[': {
        size_t pos = 0, xn;
        const char *x;
        return jsonfmt_next(v.p, v.n, &pos, NULL, &x, &xn);
    }
    default: return strtod(v.p, NULL) != 0;
    }
}

/* The value as Jinja's `+` and `join` print it: a string's text, anything else as JSON. */
static void tmpl_jprint(bytebuf *out, tmpl_jv v)
{
    if (v.n && v.p[0] == '"' && jsonfmt_decode_string(out, v.p, v.n)) return;
    jsonfmt_write(out, v.p, v.n, JSONFMT_SPACED, 0);
}

static bool tmpl_jis(tmpl_jv v, const char *z)
{
    size_t zn = strlen(z);
    return v.n == zn + 2 && v.p[0] == '"' && !memcmp(v.p + 1, z, zn);
}

/* `name in (required or [])` for an array of strings. */
static bool tmpl_jrequired(tmpl_jv req, const char *name, size_t nn)
{
    if (!req.n || req.p[0] != '[') return false;
    size_t pos = 0;
    tmpl_jv e;
    bytebuf s = { 0 };
    bool found = false;
    while (!found && jsonfmt_next(req.p, req.n, &pos, NULL, &e.p, &e.n)) {
        s.len = 0;
        if (e.p[0] == '"' && jsonfmt_decode_string(&s, e.p, e.n)) found = s.len == nn && !memcmp(s.p, name, nn);
    }
    bytebuf_free(&s);
    return found;
}

/* render_typescript_type(spec) of the reference template. Its oneOf branch sets
 * has_object_variants inside a for loop, which Python Jinja scopes to the loop: the "any"
 * answer is never given, and neither is it here. */
static void tmpl_ts_type(tmpl_jv spec, bytebuf *out, int depth)
{
    if (depth > JSONFMT_MAX_DEPTH) {
        bytebuf_puts(out, "any");
        return;
    }
    tmpl_jv type = tmpl_jget(spec, "type"), e;
    size_t pos = 0;
    if (tmpl_jis(type, "array")) {
        tmpl_jv items = tmpl_jget(spec, "items");
        if (tmpl_jtruthy(items)) {
            tmpl_jv it = tmpl_jget(items, "type");
            if (tmpl_jis(it, "string")) bytebuf_puts(out, "string[]");
            else if (tmpl_jis(it, "number") || tmpl_jis(it, "integer")) bytebuf_puts(out, "number[]");
            else if (tmpl_jis(it, "boolean")) bytebuf_puts(out, "boolean[]");
            else {
                bytebuf inner = { 0 };
                tmpl_ts_type(items, &inner, depth + 1);
                size_t chars = 0;
                for (size_t k = 0; k < inner.len; k++) chars += ((unsigned char)inner.p[k] & 0xC0) != 0x80;
                if ((inner.len == 15 && !memcmp(inner.p, "object | object", 15)) || chars > 50) bytebuf_puts(out, "any[]");
                else {
                    bytebuf_append(out, inner.p, inner.len);
                    bytebuf_puts(out, "[]");
                }
                bytebuf_free(&inner);
            }
        } else {
            bytebuf_puts(out, "any[]");
        }
        if (tmpl_jtruthy(tmpl_jget(spec, "nullable"))) bytebuf_puts(out, " | null");
    } else if (type.n && type.p[0] == '[' && jsonfmt_next(type.p, type.n, &pos, NULL, &e.p, &e.n)) {
        pos = 0;
        for (int k = 0; jsonfmt_next(type.p, type.n, &pos, NULL, &e.p, &e.n); k++) {
            if (k) bytebuf_puts(out, " | ");
            tmpl_jprint(out, e);
        }
    } else if (tmpl_jtruthy(tmpl_jget(spec, "oneOf"))) {
        tmpl_jv one = tmpl_jget(spec, "oneOf");
        if (one.p[0] != '[') return;
        size_t next = 0;
        tmpl_jv v;
        bool have = jsonfmt_next(one.p, one.n, &next, NULL, &v.p, &v.n);
        while (have) {
            tmpl_jv cur = v;
            have = jsonfmt_next(one.p, one.n, &next, NULL, &v.p, &v.n);
            tmpl_ts_type(cur, out, depth + 1);
            tmpl_jv d = tmpl_jget(cur, "description");
            if (tmpl_jtruthy(d)) {
                bytebuf_puts(out, "// ");
                tmpl_jprint(out, d);
            }
            d = tmpl_jget(cur, "default");
            if (d.n) {
                bytebuf_puts(out, "                    // default: ");
                jsonfmt_write(out, d.p, d.n, JSONFMT_SPACED, 0);
            }
            if (have) bytebuf_puts(out, " | \n");
        }
    } else if (tmpl_jis(type, "string")) {
        tmpl_jv en = tmpl_jget(spec, "enum");
        if (tmpl_jtruthy(en) && en.p[0] == '[') {
            bytebuf_putc(out, '"');
            for (int k = 0; jsonfmt_next(en.p, en.n, &pos, NULL, &e.p, &e.n); k++) {
                if (k) bytebuf_puts(out, "\" | \"");
                tmpl_jprint(out, e);
            }
            bytebuf_putc(out, '"');
        } else {
            bytebuf_puts(out, "string");
            if (tmpl_jtruthy(tmpl_jget(spec, "nullable"))) bytebuf_puts(out, " | null");
        }
    } else if (tmpl_jis(type, "number") || tmpl_jis(type, "integer")) {
        bytebuf_puts(out, "number");
    } else if (tmpl_jis(type, "boolean")) {
        bytebuf_puts(out, "boolean");
    } else if (tmpl_jis(type, "object")) {
        tmpl_jv props = tmpl_jget(spec, "properties"), req = tmpl_jget(spec, "required");
        if (tmpl_jtruthy(props) && props.p[0] == '{') {
            bytebuf_puts(out, "{\n");
            bytebuf key = { 0 };
            size_t next = 0;
            tmpl_jv v;
            bool have = jsonfmt_next(props.p, props.n, &next, &key, &v.p, &v.n);
            bytebuf name = { 0 };
            while (have) {
                tmpl_jv cur = v;
                name.len = 0;
                bytebuf_append(&name, key.p ? key.p : "", key.len);
                have = jsonfmt_next(props.p, props.n, &next, &key, &v.p, &v.n);
                bytebuf_append(out, name.p ? name.p : "", name.len);
                if (!tmpl_jrequired(req, name.p ? name.p : "", name.len)) bytebuf_putc(out, '?');
                /* the reference's "{{ render_typescript_type(...) }}" sits on its own
                   line: the newline and indentation before it are printed */
                bytebuf_puts(out, ": \n                ");
                tmpl_ts_type(cur, out, depth + 1);
                if (have) bytebuf_puts(out, ", ");
            }
            bytebuf_free(&name);
            bytebuf_free(&key);
            bytebuf_putc(out, '}');
        } else {
            bytebuf_puts(out, "object");
        }
    } else {
        bytebuf_puts(out, "any");
    }
}

/* render_tool_namespace("functions", tools) into out. */
static void tmpl_harmony_tools(const conv *c, bytebuf *out)
{
    bytebuf_puts(out, "## functions\n\nnamespace functions {\n\n");
    for (int i = 0; i < c->n_tools; i++) {
        const conv_tool *tl = &c->tools[i];
        /* a tool without a description gets an empty comment (the reference fails there) */
        bytebuf_puts(out, "// ");
        if (tl->description) bytebuf_puts(out, tl->description);
        bytebuf_puts(out, "\ntype ");
        bytebuf_puts(out, tl->name);
        bytebuf_puts(out, " = ");
        tmpl_jv params = { tl->parameters ? tl->parameters : "", tl->parameters ? strlen(tl->parameters) : 0 };
        tmpl_jv props = tmpl_jget(params, "properties"), req = tmpl_jget(params, "required");
        if (tmpl_jtruthy(params) && tmpl_jtruthy(props) && props.p[0] == '{') {
            bytebuf_puts(out, "(_: {\n");
            bytebuf key = { 0 };
            size_t pos = 0;
            tmpl_jv v;
            while (jsonfmt_next(props.p, props.n, &pos, &key, &v.p, &v.n)) {
                tmpl_jv d = tmpl_jget(v, "description");
                if (tmpl_jtruthy(d)) {
                    bytebuf_puts(out, "// ");
                    tmpl_jprint(out, d);
                    bytebuf_putc(out, '\n');
                }
                bytebuf_append(out, key.p ? key.p : "", key.len);
                if (!tmpl_jrequired(req, key.p ? key.p : "", key.len)) bytebuf_putc(out, '?');
                bytebuf_puts(out, ": ");
                tmpl_ts_type(v, out, 1);
                d = tmpl_jget(v, "default");
                if (d.n) {
                    if (tmpl_jtruthy(tmpl_jget(v, "enum"))) {
                        bytebuf_puts(out, ", // default: ");
                        tmpl_jprint(out, d);
                    } else if (tmpl_jtruthy(tmpl_jget(v, "oneOf"))) {
                        bytebuf_puts(out, "// default: ");
                        tmpl_jprint(out, d);
                    } else {
                        bytebuf_puts(out, ", // default: ");
                        jsonfmt_write(out, d.p, d.n, JSONFMT_SPACED, 0);
                    }
                }
                bytebuf_puts(out, ",\n");
            }
            bytebuf_free(&key);
            bytebuf_puts(out, "}) => any;\n\n");
        } else {
            bytebuf_puts(out, "() => any;\n\n");
        }
    }
    bytebuf_puts(out, "} // namespace functions");
}

/* The name of the call a tool turn answers: by its id among the earlier calls, else the
 * latest call (the reference's last_tool_call). */
static const char *tmpl_harmony_result_name(const tmpl_msg *m, int i, const char *last_call)
{
    const char *id = NULL;
    for (int p = 0; p < m[i].turn->n_parts; p++)
        if (m[i].turn->parts[p].kind == CONV_PART_TOOL_RESULT) {
            id = m[i].turn->parts[p].id;
            break;
        }
    for (int j = i - 1; id && *id && j >= 0; j--) {
        if (m[j].role != CONV_ROLE_ASSISTANT) continue;
        for (int k = 0; k < m[j].n_calls; k++) {
            const conv_part *p = tmpl_call(&m[j], k);
            if (p->id && !strcmp(p->id, id)) return p->name;
        }
    }
    return last_call;
}

/* The reference is openai-gpt-oss-120b.jinja (model_identity and builtin_tools not set).
 * Where it fails (a tool without a description, both content and thinking on a call turn)
 * a prompt is still written; several calls in one assistant turn are written as one
 * message each (the reference writes only the first, and names every result after the
 * last call; here a result is named after the call whose id it answers). */
void tmpl_render_harmony(tmpl_b *b, const conv *c, const tmpl_msg *m)
{
    int n = c->n_turns;
    const char *effort = c->effort == CONV_EFFORT_LOW ? "low" : c->effort == CONV_EFFORT_MEDIUM ? "medium"
                         : c->effort == CONV_EFFORT_HIGH ? "high" : c->thinking == CONV_THINKING_OFF ? "low" : "medium";
    char date[32];
    if (c->date) {
        snprintf(date, sizeof date, "%s", c->date);
    } else {
        time_t now = time(NULL);
        struct tm tmv;
        gmtime_r(&now, &tmv);
        strftime(date, sizeof date, "%Y-%m-%d", &tmv);
    }
    tmpl_scaffold(b, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                     "Knowledge cutoff: 2024-06\nCurrent date: ");
    tmpl_text(b, date, strlen(date));
    tmpl_scaffold(b, "\n\nReasoning: ");
    tmpl_scaffold(b, effort);
    tmpl_scaffold(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if (c->n_tools) tmpl_scaffold(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    tmpl_scaffold(b, "<|end|>");
    int i0 = 0;
    if (n > 0 && m[0].role == CONV_ROLE_SYSTEM) i0 = 1;
    if ((i0 && m[0].c_len) || c->n_tools) {
        tmpl_scaffold(b, "<|start|>developer<|message|>");
        if (i0 && m[0].c_len) {
            tmpl_scaffold(b, "# Instructions\n\n");
            tmpl_text(b, m[0].content, m[0].c_len);
            tmpl_scaffold(b, "\n\n");
        }
        if (c->n_tools) {
            tmpl_scaffold(b, "# Tools\n\n");
            b->json_src.len = 0;
            tmpl_harmony_tools(c, &b->json_src);
            tmpl_text(b, b->json_src.p, b->json_src.len);
        }
        tmpl_scaffold(b, "<|end|>");
    }
    const char *last_call = NULL;
    for (int i = i0; i < n; i++) {
        const tmpl_msg *x = &m[i];
        if (x->role == CONV_ROLE_ASSISTANT && x->n_calls > 0) {
            /* the analysis of a call turn is kept until a later final answer */
            bool future_final = false;
            for (int j = i + 1; j < n; j++)
                if (m[j].role == CONV_ROLE_ASSISTANT && m[j].n_calls == 0) future_final = true;
            if (!future_final && (x->r_len || x->c_len)) {
                tmpl_scaffold(b, "<|start|>assistant<|channel|>analysis<|message|>");
                if (x->r_len) tmpl_text(b, x->reason, x->r_len);
                else tmpl_text(b, x->content, x->c_len);
                tmpl_scaffold(b, "<|end|>");
            }
            for (int k = 0; k < x->n_calls; k++) {
                const conv_part *p = tmpl_call(x, k);
                tmpl_scaffold(b, "<|start|>assistant to=functions.");
                tmpl_text(b, p->name, strlen(p->name));
                tmpl_scaffold(b, "<|channel|>commentary json<|message|>");
                tmpl_call_args(b, p);
                tmpl_scaffold(b, "<|call|>");
                last_call = p->name;
            }
        } else if (x->role == CONV_ROLE_ASSISTANT && i == n - 1 && !c->add_generation_prompt) {
            if (x->has_reason) {
                tmpl_scaffold(b, "<|start|>assistant<|channel|>analysis<|message|>");
                tmpl_text(b, x->reason, x->r_len);
                tmpl_scaffold(b, "<|end|>");
            }
            tmpl_scaffold(b, "<|start|>assistant<|channel|>final<|message|>");
            tmpl_text(b, x->content, x->c_len);
            tmpl_scaffold(b, "<|return|>");
        } else if (x->role == CONV_ROLE_ASSISTANT) {
            /* earlier turns' reasoning is dropped */
            tmpl_scaffold(b, "<|start|>assistant<|channel|>final<|message|>");
            tmpl_text(b, x->content, x->c_len);
            tmpl_scaffold(b, "<|end|>");
            last_call = NULL;
        } else if (x->role == CONV_ROLE_TOOL) {
            const char *name = tmpl_harmony_result_name(m, i, last_call);
            if (!name) {
                tmpl_fail(b, TEMPLATE_ERR_CONV, "%s", "harmony: a tool result must follow an assistant tool call");
                return;
            }
            tmpl_scaffold(b, "<|start|>functions.");
            tmpl_text(b, name, strlen(name));
            tmpl_scaffold(b, " to=assistant<|channel|>commentary<|message|>");
            b->json.len = 0;
            jsonfmt_write_string(&b->json, x->content, x->c_len);
            tmpl_text(b, b->json.p, b->json.len);
            tmpl_scaffold(b, "<|end|>");
        } else if (x->role == CONV_ROLE_USER) {
            tmpl_scaffold(b, "<|start|>user<|message|>");
            tmpl_text(b, x->content, x->c_len);
            tmpl_scaffold(b, "<|end|>");
        }
        /* a system or developer message after the first is not written (as the reference) */
    }
    if (c->add_generation_prompt) tmpl_scaffold(b, "<|start|>assistant");
    if (c->add_generation_prompt && c->forced_call) {
        /* a forced call: its header as gpt-oss writes it, the grammar writes the arguments */
        tmpl_scaffold(b, "<|channel|>commentary to=functions.");
        tmpl_text(b, c->forced_call, strlen(c->forced_call));
        tmpl_scaffold(b, " <|constrain|>json<|message|>");
    }
}
