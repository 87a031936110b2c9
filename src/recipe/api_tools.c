/*
 * api_tools: the grammars of tool calls. Per model family, the syntax its calls are written
 * in (the family's markers around each tool's name and arguments), made into GBNF whose
 * arguments are each tool's parameter schema: the whole answer for a forced call, or what
 * follows the call-opening token for tool_choice auto (a lazy grammar), alone or beside a
 * response format.
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/jsonfmt.h"
#include "util/util.h"

/* ---- tool-call syntax per model family ----
 * Each family with tool calls has one syntax function: it writes rule `calls`, the text that
 * follows the token opening the calls (*trigger; -1 when the family's calls are plain text
 * with no opening token), from the tools' names and the rules of their arguments. `lazy`: the
 * grammar binds what follows the trigger under tool_choice auto (several calls may follow in
 * turn); `one`: at most one call in the answer (parallel tool calls off), so a lazy grammar
 * ends in free text that no call marker can follow (the document never completes, the
 * grammar stays bound and masks the next opening). */
typedef struct {
    const char *name;          /* the tool's name (raw) */
    const char *args;          /* its arguments' rule, e.g. "t1-root" */
    const char *params;        /* its parameters' JSON schema text, NULL if none */
    bool bind;                 /* the schema binds the arguments (forced or strict) */
} api_tool_alt;

typedef bool (*api_tool_syntax_fn)(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                   bool one, int32_t *trigger);

/* Any text: every code point, so every token with bytes (a marker token has none, and is
 * allowed only where a rule names it by id). */
#define API_GBNF_TEXT "text ::= [^\\x00]*\n"

/* "{\"name\": N, \"KEY\": " ARGS "}" per tool, as alternatives of rule `call` */
static void api_tool_json_calls(bytebuf *g, const api_tool_alt *t, int n, const char *key)
{
    bytebuf head = {0};
    bytebuf_puts(g, "call ::= ");
    for (int i = 0; i < n; i++) {
        head.len = 0;
        bytebuf_puts(&head, "{\"name\": ");
        jsonfmt_write_string(&head, t[i].name, strlen(t[i].name));
        bytebuf_printf(&head, ", \"%s\": ", key);
        if (i) bytebuf_puts(g, " | ");
        api_json_gbnf_literal(g, head.p, head.len);
        bytebuf_printf(g, " %s \"}\"", t[i].args);
    }
    bytebuf_putc(g, '\n');
    bytebuf_free(&head);
}

/* <tool_call>\n{"name": N, "arguments": ARGS}\n</tool_call>: one call per opening marker */
static bool api_tool_syntax_qwen(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                 bool one, int32_t *trigger)
{
    if (mk->tool_start < 0 || mk->tool_end < 0) return false;
    *trigger = mk->tool_start;
    bytebuf_printf(g, "calls ::= \"\\n\" call \"\\n\" <[%d]>%s\n", mk->tool_end, lazy && one ? " text" : "");
    api_tool_json_calls(g, t, n, "arguments");
    if (lazy && one) bytebuf_puts(g, API_GBNF_TEXT);
    return true;
}

/* {"name": N, "parameters": ARGS} as the whole answer (no marker token) */
static bool api_tool_syntax_llama3(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                   bool one, int32_t *trigger)
{
    (void)lazy, (void)one;
    *trigger = -1;
    bytebuf_puts(g, "calls ::= call\n");
    api_tool_json_calls(g, t, n, "parameters");
    return true;
}

/* <｜tool▁calls▁begin｜> (<｜tool▁call▁begin｜> N <｜tool▁sep｜> ARGS <｜tool▁call▁end｜>)+
 * <｜tool▁calls▁end｜>, V3.1's form (the name as raw text, markers by id) */
static bool api_tool_syntax_deepseek(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                     bool one, int32_t *trigger)
{
    if (mk->tools_begin < 0 || mk->tools_end < 0 || mk->tool_start < 0 || mk->tool_end < 0 || mk->tool_sep < 0)
        return false;
    *trigger = mk->tools_begin;
    bytebuf_printf(g, "calls ::= call%s <[%d]>%s\n", lazy && !one ? "+" : "", mk->tools_end, lazy && one ? " text" : "");
    bytebuf_printf(g, "call ::= <[%d]> (", mk->tool_start);
    for (int i = 0; i < n; i++) {
        if (i) bytebuf_puts(g, " | ");
        api_json_gbnf_literal(g, t[i].name, strlen(t[i].name));
        bytebuf_printf(g, " <[%d]> %s", mk->tool_sep, t[i].args);
    }
    bytebuf_printf(g, ") <[%d]>\n", mk->tool_end);
    if (lazy && one) bytebuf_puts(g, API_GBNF_TEXT);
    return true;
}

/* <|start|>assistant<|channel|>commentary to=functions.N <|constrain|>json<|message|>ARGS<|call|>,
 * the call message as gpt-oss writes it after its analysis (the scheduler leaves the analysis
 * free up to its <|end|>, see api_job_submit). <|call|> ends generation, so an answer holds
 * one call whatever `one` says. Lazy (strict tools under auto): no token opens calls alone
 * (<|start|> opens every message, ` to` is text), so the trigger is <|start|> and the grammar
 * binds the message it opens: a call, or any other message with free text, which ends the
 * document (at <|end|>; <|return|> ends generation). */
static bool api_tool_syntax_harmony(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                    bool one, int32_t *trigger)
{
    (void)one;
    if (mk->h_start < 0 || mk->h_channel < 0 || mk->h_message < 0 || mk->h_constrain < 0 || mk->h_call < 0 ||
        mk->h_end < 0 || mk->h_return < 0)
        return false;
    *trigger = mk->h_start;
    if (lazy)
        bytebuf_printf(g,
                       "calls ::= \"assistant\" <[%d]> (call | (\"analysis\" | \"commentary\") <[%d]> text <[%d]> | "
                       "\"final\" <[%d]> text (<[%d]> | <[%d]>))\n" API_GBNF_TEXT,
                       mk->h_channel, mk->h_message, mk->h_end, mk->h_message, mk->h_end, mk->h_return);
    else bytebuf_printf(g, "calls ::= \"assistant\" <[%d]> call\n", mk->h_channel);
    bytebuf_puts(g, "call ::= \"commentary to=functions.\" (");
    for (int i = 0; i < n; i++) {
        if (i) bytebuf_puts(g, " | ");
        api_json_gbnf_literal(g, t[i].name, strlen(t[i].name));
        bytebuf_printf(g, " \" \" <[%d]> \"json\" <[%d]> %s", mk->h_constrain, mk->h_message, t[i].args);
    }
    bytebuf_printf(g, ") <[%d]>\n", mk->h_call);
    return true;
}

/* [TOOL_CALLS]N[ARGS]ARGS, one call per opening marker, as Mistral Small 3.2, Devstral and
 * Ministral 3 write them (the older [TOOL_CALLS][{...}] form of Nemo has no [ARGS] token and
 * no grammar here). No end marker: a call ends with its arguments' value. */
static bool api_tool_syntax_mistral(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                    bool one, int32_t *trigger)
{
    if (mk->tool_start < 0 || mk->tool_sep < 0) return false;
    *trigger = mk->tool_start;
    bytebuf_printf(g, "calls ::= call%s\ncall ::= ", lazy && one ? " text" : "");
    for (int i = 0; i < n; i++) {
        if (i) bytebuf_puts(g, " | ");
        api_json_gbnf_literal(g, t[i].name, strlen(t[i].name));
        bytebuf_printf(g, " <[%d]> %s", mk->tool_sep, t[i].args);
    }
    bytebuf_putc(g, '\n');
    if (lazy && one) bytebuf_puts(g, API_GBNF_TEXT);
    return true;
}

/* Is a JSON string literal s[0..n) one of the strings of the JSON array a[0..an)? */
static bool api_json_in(const char *a, size_t an, const char *s, size_t n)
{
    size_t pos = 0;
    const char *v;
    size_t vn;
    while (a && jsonfmt_next(a, an, &pos, NULL, &v, &vn))
        if (vn == n && !memcmp(v, s, n)) return true;
    return false;
}

/* The properties object and required array of tool t's schema when it binds the arguments
 * (*req NULL when the schema has none); false when it does not bind them or has no
 * properties object (the call's keys and values are free). */
static bool api_tool_props(const api_tool_alt *t, const char **props, size_t *prl, const char **req, size_t *rl)
{
    const char *ps = t->bind ? t->params : NULL;
    size_t pl = ps ? strlen(ps) : 0;
    if (!ps || !jsonfmt_get_member(ps, pl, "properties", props, prl) || (*props)[0] != '{') return false;
    if (!jsonfmt_get_member(ps, pl, "required", req, rl) || (*req)[0] != '[') {
        *req = NULL;
        *rl = 0;
    }
    return true;
}

/* Does the property schema v[0..vn) type it "string"? */
static bool api_tool_string_prop(const char *v, size_t vn)
{
    const char *ty;
    size_t tl;
    return v[0] == '{' && jsonfmt_get_member(v, vn, "type", &ty, &tl) && tl == 8 && !memcmp(ty, "\"string\"", 8);
}

/* A property's value where the call syntax writes it raw (GLM's <arg_value>, DSML's
 * <parameter>), as rule text appended to rules: a "string" property its enum's strings or
 * textrule (any text), another the GBNF of its own schema v[0..vn) under the rule prefix pre,
 * whose rules go to extra. False when the schema does not compile. */
static bool api_tool_raw_value(bytebuf *rules, const char *v, size_t vn, const char *pre, const char *textrule,
                               bytebuf *extra)
{
    const char *en;
    size_t enl;
    bool str = api_tool_string_prop(v, vn);
    if (str && jsonfmt_get_member(v, vn, "enum", &en, &enl) && en[0] == '[') {
        /* the enum's strings, raw */
        size_t ep = 0;
        const char *ev;
        size_t evn;
        int ne = 0;
        bytebuf dec = {0};
        bytebuf_putc(rules, '(');
        while (jsonfmt_next(en, enl, &ep, NULL, &ev, &evn)) {
            dec.len = 0;
            if (ev[0] != '"' || !jsonfmt_decode_string(&dec, ev, evn)) continue;
            if (ne++) bytebuf_puts(rules, " | ");
            api_json_gbnf_literal(rules, dec.p ? dec.p : "", dec.len);
        }
        bytebuf_free(&dec);
        if (!ne) bytebuf_puts(rules, textrule);
        bytebuf_putc(rules, ')');
        return true;
    }
    if (str) {
        bytebuf_puts(rules, textrule);
        return true;
    }
    grammar_status st;
    char gerr[256] = "";
    char *pg = grammar_to_gbnf(GRAMMAR_KIND_SCHEMA, v, vn, &st, gerr, sizeof gerr);
    if (!pg) return false;
    char *pp = grammar_gbnf_prefix(pg, strlen(pg), pre);
    free(pg);
    bytebuf_printf(rules, "%sroot", pre);
    bytebuf_puts(extra, pp);
    bytebuf_putc(extra, '\n');
    free(pp);
    return true;
}

/* How a call syntax writes one named parameter around its value (api_tool_params). */
typedef struct {
    char c;                  /* the rules' prefix */
    const char *text;        /* the rule of a raw value */
    bool blank_optional;     /* a call with no required parameter may be a blank line (DSML) */
    void (*open)(bytebuf *r, const events_markers *mk, const char *key, size_t kn, const char *v, size_t vn);
    void (*close)(bytebuf *r, const events_markers *mk);
} api_param_syntax;

/* Tool i's parameters as its binding schema lays them out: "<c>i ::=" the properties in the
 * schema's order, each "<c>i-k" (optional unless required), a rule of the syntax's opening, the
 * value (raw or the JSON its schema describes) and closing. False: a value's schema did not
 * compile. */
static bool api_tool_params(bytebuf *g, const events_markers *mk, const api_param_syntax *ps, int i,
                            const char *props, size_t prl, const char *req, size_t rl)
{
    bytebuf key = {0}, extra = {0}, rules = {0};
    bool ok = true, required_any = false;
    bytebuf_printf(g, "%c%d ::=", ps->c, i);
    size_t pos = 0, at = g->len;
    const char *v;
    size_t vn;
    int k = 0;
    while (jsonfmt_next(props, prl, &pos, &key, &v, &vn)) {
        bytebuf lit = {0};
        jsonfmt_write_string(&lit, key.p ? key.p : "", key.len);
        bool required = api_json_in(req, rl, lit.p, lit.len);
        bytebuf_free(&lit);
        required_any = required_any || required;
        bytebuf_printf(&rules, "%c%d-%d ::= ", ps->c, i, k);
        ps->open(&rules, mk, key.p ? key.p : "", key.len, v, vn);
        char pre[32];
        snprintf(pre, sizeof pre, "%c%d-%d-", ps->c, i, k);
        extra.len = 0;
        if (!api_tool_raw_value(&rules, v, vn, pre, ps->text, &extra)) {
            ok = false;
            break;
        }
        ps->close(&rules, mk);
        bytebuf_append(&rules, extra.p, extra.len);
        bytebuf_printf(g, " %c%d-%d%s", ps->c, i, k, required ? "" : "?");
        k++;
    }
    if (ps->blank_optional) {   /* nothing required: no parameter at all is the blank line */
        if (!required_any) bytebuf_puts(g, g->len == at ? " \"\\n\"" : " | \"\\n\"");
    } else if (g->len == at) {
        bytebuf_puts(g, " \"\"");
    }
    bytebuf_putc(g, '\n');
    bytebuf_append(g, rules.p, rules.len);
    bytebuf_free(&key);
    bytebuf_free(&extra);
    bytebuf_free(&rules);
    return ok;
}

/* GLM: <arg_key>K</arg_key>\n<arg_value>V</arg_value>\n, the four tags tokens. */
static void api_param_glm_open(bytebuf *r, const events_markers *mk, const char *key, size_t kn, const char *v, size_t vn)
{
    bytebuf_printf(r, "<[%d]> ", mk->arg_key);
    api_json_gbnf_literal(r, key, kn);
    bytebuf_printf(r, " <[%d]> gnl <[%d]> ", mk->arg_key_end, mk->arg_val);
}

static void api_param_glm_close(bytebuf *r, const events_markers *mk) { bytebuf_printf(r, " <[%d]> gnl\n", mk->arg_val_end); }

static const api_param_syntax api_param_glm = { 'g', "gtext", false, api_param_glm_open, api_param_glm_close };

/* DSML: <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n. */
static void api_param_dsml_open(bytebuf *r, const events_markers *mk, const char *key, size_t kn, const char *v, size_t vn)
{
    bytebuf_printf(r, "\"<\" <[%d]> \"parameter name=\\\"\" ", mk->tool_start);
    api_json_gbnf_literal(r, key, kn);
    bytebuf_printf(r, " \"\\\" string=\\\"%s\\\">\" ", api_tool_string_prop(v, vn) ? "true" : "false");
}

static void api_param_dsml_close(bytebuf *r, const events_markers *mk)
{
    bytebuf_printf(r, " \"</\" <[%d]> \"parameter>\\n\"\n", mk->tool_start);
}

static const api_param_syntax api_param_dsml = { 'd', "dtext", true, api_param_dsml_open, api_param_dsml_close };

/* XML: <parameter=K>\nV\n</parameter>\n, all text. */
static void api_param_xml_open(bytebuf *r, const events_markers *mk, const char *key, size_t kn, const char *v, size_t vn)
{
    bytebuf_puts(r, "\"<parameter=\" ");
    api_json_gbnf_literal(r, key, kn);
    bytebuf_puts(r, " \">\\n\" ");
}

static void api_param_xml_close(bytebuf *r, const events_markers *mk) { bytebuf_puts(r, " \"\\n</parameter>\\n\"\n"); }

static const api_param_syntax api_param_xml = { 'x', "xtext", false, api_param_xml_open, api_param_xml_close };

/* <tool_call>N (<arg_key>K</arg_key><arg_value>V</arg_value>)* </tool_call>, GLM's form (the
 * newlines of GLM-4.5/4.6 optional). With a binding schema, its properties in the schema's
 * order (the required ones present): a "string" property's value is raw text (no marker can
 * occur in it), another's the JSON its own schema describes; without one, any keys and raw
 * values. */
static bool api_tool_syntax_glm(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                bool one, int32_t *trigger)
{
    if (mk->tool_start < 0 || mk->tool_end < 0 || mk->arg_key < 0 || mk->arg_key_end < 0 || mk->arg_val < 0 ||
        mk->arg_val_end < 0)
        return false;
    *trigger = mk->tool_start;
    bytebuf_printf(g, "calls ::= call <[%d]>%s\n", mk->tool_end, lazy && one ? " text" : "");
    bytebuf_puts(g, "gnl ::= \"\\n\"?\ngtext ::= [^\\x00]*\n");
    if (lazy && one) bytebuf_puts(g, API_GBNF_TEXT);
    bytebuf_puts(g, "call ::= ");
    for (int i = 0; i < n; i++) {
        if (i) bytebuf_puts(g, " | ");
        api_json_gbnf_literal(g, t[i].name, strlen(t[i].name));
        bytebuf_printf(g, " gnl g%d", i);
    }
    bytebuf_putc(g, '\n');
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        const char *props = NULL, *req = NULL;
        size_t prl = 0, rl = 0;
        if (!api_tool_props(&t[i], &props, &prl, &req, &rl)) {
            /* free keys and values */
            bytebuf_printf(g, "g%d ::= (<[%d]> gtext <[%d]> gnl <[%d]> gtext <[%d]> gnl)*\n", i, mk->arg_key,
                           mk->arg_key_end, mk->arg_val, mk->arg_val_end);
            continue;
        }
        ok = api_tool_params(g, mk, &api_param_glm, i, props, prl, req, rl);
    }
    return ok;
}

/* <｜DSML｜tool_calls>\n (<｜DSML｜invoke name="N">\n PARAMETERS </｜DSML｜invoke>\n)
 * </｜DSML｜tool_calls>, as DeepSeek V4's template writes calls (V3.2: function_calls). Only
 * ｜DSML｜ is a token; the '<' before it is text, so a forced answer's grammar starts with that
 * '<' (no trigger) and a lazy one binds what follows the ｜DSML｜ token that opens the block.
 * Each parameter is <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n. With
 * a binding schema, the schema's properties in its order (the required ones present): a
 * "string" property's value raw with string="true", another the JSON its own schema describes
 * with string="false"; without one, any names and raw values. No parameter: a blank line. */
static bool api_tool_syntax_dsml(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                 bool one, int32_t *trigger)
{
    int d = mk->tool_start;
    if (d < 0) return false;
    const char *blk = mk->dsml_v32 ? "function_calls" : "tool_calls";
    *trigger = lazy ? d : -1;
    bytebuf_puts(g, "calls ::= ");
    if (!lazy) bytebuf_printf(g, "\"<\" <[%d]> ", d);
    bytebuf_printf(g, "\"%s>\\n\" inv%s \"</\" <[%d]> \"%s>\"%s\n", blk, lazy && !one ? "+" : "", d, blk,
                   lazy && one ? " text" : "");
    if (lazy && one) bytebuf_puts(g, API_GBNF_TEXT);
    bytebuf_puts(g, "dtext ::= [^\\x00]*\n");
    bytebuf_printf(g, "dpar ::= \"<\" <[%d]> \"parameter name=\\\"\" [^\"\\x00]+ \"\\\" string=\\\"\" (\"true\" | \"false\") "
                      "\"\\\">\" dtext \"</\" <[%d]> \"parameter>\\n\"\n", d, d);
    bytebuf_printf(g, "inv ::= \"<\" <[%d]> \"invoke name=\\\"\" (", d);
    for (int i = 0; i < n; i++) {
        if (i) bytebuf_puts(g, " | ");
        api_json_gbnf_literal(g, t[i].name, strlen(t[i].name));
        bytebuf_printf(g, " \"\\\">\\n\" d%d", i);
    }
    bytebuf_printf(g, ") \"</\" <[%d]> \"invoke>\\n\"\n", d);
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        const char *props = NULL, *req = NULL;
        size_t prl = 0, rl = 0;
        if (!api_tool_props(&t[i], &props, &prl, &req, &rl)) {
            bytebuf_printf(g, "d%d ::= dpar+ | \"\\n\"\n", i);  /* free names and values */
            continue;
        }
        ok = api_tool_params(g, mk, &api_param_dsml, i, props, prl, req, rl);
    }
    return ok;
}

/* <tool_call>\n<function=N>\n (<parameter=K>\nV\n</parameter>\n)* </function>\n</tool_call>, as
 * Qwen3.5's template writes calls: only <tool_call> and </tool_call> are tokens, one call per
 * opening. With a binding schema, its properties in the schema's order (the required ones
 * present): a "string" property's value raw, another the JSON its own schema describes;
 * without one, any names and raw values. A raw value never holds "</", so the splitter's
 * first </parameter> is its end. */
static bool api_tool_syntax_xml(bytebuf *g, const events_markers *mk, const api_tool_alt *t, int n, bool lazy,
                                bool one, int32_t *trigger)
{
    if (mk->tool_start < 0 || mk->tool_end < 0) return false;
    *trigger = mk->tool_start;
    bytebuf_printf(g, "calls ::= \"\\n<function=\" call \"</function>\\n\" <[%d]>%s\n", mk->tool_end,
                   lazy && one ? " text" : "");
    if (lazy && one) bytebuf_puts(g, API_GBNF_TEXT);
    bytebuf_puts(g, "xtext ::= ([^<\\x00] | \"<\" [^/\\x00])*\n");
    bytebuf_puts(g, "xpar ::= \"<parameter=\" [^>\\n\\x00]+ \">\\n\" xtext \"\\n</parameter>\\n\"\n");
    bytebuf_puts(g, "call ::= ");
    for (int i = 0; i < n; i++) {
        if (i) bytebuf_puts(g, " | ");
        api_json_gbnf_literal(g, t[i].name, strlen(t[i].name));
        bytebuf_printf(g, " \">\\n\" x%d", i);
    }
    bytebuf_putc(g, '\n');
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        const char *props = NULL, *req = NULL;
        size_t prl = 0, rl = 0;
        if (!api_tool_props(&t[i], &props, &prl, &req, &rl)) {
            bytebuf_printf(g, "x%d ::= xpar*\n", i);  /* free names and values */
            continue;
        }
        ok = api_tool_params(g, mk, &api_param_xml, i, props, prl, req, rl);
    }
    return ok;
}

static const api_tool_syntax_fn api_tool_syntaxes[] = {
    [EVENTS_TOOLFMT_MISTRAL] = api_tool_syntax_mistral,
    [EVENTS_TOOLFMT_GLM] = api_tool_syntax_glm,
    [EVENTS_TOOLFMT_QWEN] = api_tool_syntax_qwen,
    [EVENTS_TOOLFMT_LLAMA3] = api_tool_syntax_llama3,
    [EVENTS_TOOLFMT_DEEPSEEK] = api_tool_syntax_deepseek,
    [EVENTS_TOOLFMT_HARMONY] = api_tool_syntax_harmony,
    [EVENTS_TOOLFMT_DSML] = api_tool_syntax_dsml,
    [EVENTS_TOOLFMT_XML] = api_tool_syntax_xml,
};

char *api_tool_gbnf(const conv *c, const events_markers *mk, const char *only, bool lazy, bool one, int32_t *trigger,
                    char *err, size_t errsz)
{
    err[0] = 0;
    *trigger = -1;
    if (mk->toolfmt == EVENTS_TOOLFMT_HARMONY && c->forced_call && !lazy) {
        /* the prompt opened the call to one tool: its arguments alone */
        for (int i = 0; i < c->n_tools; i++) {
            const conv_tool *t = &c->tools[i];
            if (strcmp(t->name, c->forced_call)) continue;
            grammar_status st;
            char gerr[400] = "";
            const char *ps = t->parameters;
            char *g = ps ? grammar_to_gbnf(GRAMMAR_KIND_SCHEMA, ps, strlen(ps), &st, gerr, sizeof gerr)
                         : grammar_to_gbnf(GRAMMAR_KIND_JSON, "", 0, &st, gerr, sizeof gerr);
            if (!g) snprintf(err, errsz, "the parameters of tool '%.64s': %s", t->name, gerr);
            return g;
        }
        snprintf(err, errsz, "'%.64s' is not one of the tools offered.", c->forced_call);
        return NULL;
    }
    unsigned fmt = (unsigned)mk->toolfmt;
    api_tool_syntax_fn syntax = fmt < TM_ARRAY_LEN(api_tool_syntaxes) ? api_tool_syntaxes[fmt] : NULL;
    if (!syntax) return NULL;
    bytebuf rules = {0}, g = {0};
    api_tool_alt *alts = xcalloc((size_t)(c->n_tools ? c->n_tools : 1), sizeof *alts);
    char (*prefix)[24] = xcalloc((size_t)(c->n_tools ? c->n_tools : 1), sizeof *prefix);
    int n_alt = 0;
    bool ok = true;
    for (int i = 0; i < c->n_tools && ok; i++) {
        const conv_tool *t = &c->tools[i];
        if (only && strcmp(only, t->name)) continue;
        grammar_status st;
        char gerr[400] = "";
        /* the schema binds a forced call's arguments, and a strict tool's; others: any object */
        const char *ps = lazy && !t->strict ? NULL : t->parameters;
        char *tg = ps ? grammar_to_gbnf(GRAMMAR_KIND_SCHEMA, ps, strlen(ps), &st, gerr, sizeof gerr)
                      : grammar_to_gbnf(GRAMMAR_KIND_JSON, "", 0, &st, gerr, sizeof gerr);
        if (!tg) {
            snprintf(err, errsz, "the parameters of tool '%.64s': %s", t->name, gerr);
            ok = false;
            break;
        }
        snprintf(prefix[n_alt], sizeof prefix[n_alt], "t%d-", i + 1);
        char *pg = grammar_gbnf_prefix(tg, strlen(tg), prefix[n_alt]);
        free(tg);
        bytebuf_puts(&rules, pg);
        bytebuf_putc(&rules, '\n');
        free(pg);
        strcat(prefix[n_alt], "root");
        alts[n_alt].name = t->name;
        alts[n_alt].args = prefix[n_alt];
        alts[n_alt].params = t->parameters;
        alts[n_alt].bind = ps != NULL;
        n_alt++;
    }
    if (ok && !n_alt) {
        snprintf(err, errsz, "'%.64s' is not one of the tools offered.", only ? only : "");
        ok = false;
    }
    char *out = NULL;
    if (ok && syntax(&g, mk, alts, n_alt, lazy, one, trigger) && (!lazy || *trigger >= 0)) {
        /* forced: the answer opens the calls itself; lazy: the grammar starts after the opening */
        if (lazy || *trigger < 0) bytebuf_puts(&g, "root ::= calls\n");
        else bytebuf_printf(&g, "root ::= <[%d]> calls\n", *trigger);
        bytebuf_append(&g, rules.p, rules.len);
        out = g.p;
        g.p = NULL;
    } else *trigger = -1;
    bytebuf_free(&g);
    bytebuf_free(&rules);
    free(alts);
    free(prefix);
    return out;
}

char *api_format_calls_gbnf(const conv *c, const events_markers *mk, int kind, const char *src, size_t len, bool one,
                            char *err, size_t errsz)
{
    int32_t trigger;
    err[0] = 0;
    /* harmony's lazy grammar binds every message <|start|> opens, answers too: the format
     * alone binds the answer there */
    if (mk->toolfmt == EVENTS_TOOLFMT_HARMONY) return NULL;
    char *calls = api_tool_gbnf(c, mk, NULL, true, one, &trigger, err, errsz);
    if (!calls) return NULL;
    grammar_status st;
    char *fg = grammar_to_gbnf((grammar_kind)kind, src ? src : "", len, &st, err, errsz);
    if (!fg) {
        free(calls);
        return NULL;
    }
    char *pf = grammar_gbnf_prefix(fg, strlen(fg), "f-"), *pc = grammar_gbnf_prefix(calls, strlen(calls), "c-");
    bytebuf g = {0};
    /* DSML: the '<' before the ｜DSML｜ token that opens the block is text */
    bytebuf_printf(&g, "root ::= f-root | %s<[%d]> c-root\n", mk->toolfmt == EVENTS_TOOLFMT_DSML ? "\"<\" " : "", trigger);
    bytebuf_puts(&g, pf);
    bytebuf_putc(&g, '\n');
    bytebuf_puts(&g, pc);
    free(pf);
    free(pc);
    free(fg);
    free(calls);
    return g.p;
}
