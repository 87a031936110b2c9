/*
 * template_dsv4: the DeepSeek V4 family (deepseek-ai-DeepSeek-V4.jinja and its
 * -V4-Flash-0731 revision), statement for statement as the reference Jinja text renders.
 *
 *   BOS, [effort text], system prompt (the system turns joined by "\n\n"; with tools, the
 *   tools header, one `tool.function | tojson` line per tool and the footer), then per turn:
 *   user / developer / tool   "<｜User｜>" opens a user block, turns in a row join it with
 *                             "\n\n"; a tool result is "<tool_result>...</tool_result>"
 *   assistant                 "<｜Assistant｜>", "<think>REASONING</think>" when the
 *                             reasoning is kept, else "</think>"; the text; the calls as a
 *                             DSML block; "<｜end▁of▁sentence｜>"
 *   generation prompt         "<｜Assistant｜><think>" (thinking) or "<｜Assistant｜></think>".
 * Reasoning is kept when thinking is on and (tools are offered, or the turn comes after the
 * last user/tool turn, or the conversation holds a tool result); otherwise dropped. Thinking
 * defaults to off. The effort text: V4 writes it for reasoning_effort "max", which no API
 * spells, so never; Flash-0731 for "high" (its own "max" text likewise never).
 *
 * DSML ("｜DSML｜" is one token of V4's vocabulary; the '<' and the tag names around it are
 * text): <｜DSML｜tool_calls> ( <｜DSML｜invoke name="N"> ( <｜DSML｜parameter name="K"
 * string="true|false">V</｜DSML｜parameter> )* </｜DSML｜invoke> )* </｜DSML｜tool_calls>; a
 * string argument is written raw, any other as its tojson. The output splitter reads the
 * same block (events.h, DSML).
 */
#include "recipe/template_int.h"

#include <string.h>

#include "util/bytebuf.h"
#include "util/jsonfmt.h"

#define DSV4_DSML "｜DSML｜"

static const char dsv4_tools_header[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<" DSV4_DSML "tool_calls>\" block like the following:\n\n<" DSV4_DSML "tool_calls>\n<" DSV4_DSML
    "invoke name=\"$TOOL_NAME\">\n<" DSV4_DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSV4_DSML
    "parameter>\n...\n</" DSV4_DSML "invoke>\n<" DSV4_DSML "invoke name=\"$TOOL_NAME2\">\n...\n</" DSV4_DSML "invoke>\n</" DSV4_DSML
    "tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled "
    "(triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final "
    "response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool "
    "Schemas\n\n";

static const char dsv4_tools_footer[] =
    "\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static const char dsv4_effort_high[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and "
    "comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all "
    "potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, "
    "documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no "
    "assumption is left unchecked.\n\n";

/* A tool's `function` object as tojson prints it, into the prompt as content. */
static void tmpl_dsv4_tool(tmpl_b *b, const conv_tool *tl)
{
    bytebuf *s = &b->json_src;
    s->len = 0;
    tmpl_tool_openai(s, tl);
    const char *fn;
    size_t fl;
    if (!jsonfmt_get_member(s->p, s->len, "function", &fn, &fl)) {
        tmpl_fail(b, TEMPLATE_ERR_JSON, "%s is not valid JSON", "a tool's parameters");
        return;
    }
    if (tmpl_json(b, fn, fl, JSONFMT_SPACED, 0, "a tool's parameters")) tmpl_text(b, b->json.p, b->json.len);
}

/* One call's invoke element: its arguments walked in their order, a string raw, any other
 * value as tojson; an empty object writes a blank line. */
static void tmpl_dsv4_invoke(tmpl_b *b, const conv_part *p)
{
    if (!jsonfmt_valid(p->args, p->args_len) || p->args[strspn(p->args, " \t\r\n")] != '{') {
        tmpl_fail(b, TEMPLATE_ERR_JSON, "%s is not valid JSON", "tool call arguments");
        return;
    }
    tmpl_scaffold(b, "<" DSV4_DSML "invoke name=\"");
    tmpl_text(b, p->name, strlen(p->name));
    tmpl_scaffold(b, "\">\n");
    size_t pos = 0, vl;
    const char *v;
    bytebuf key = { 0 }, str = { 0 };
    int n = 0;
    while (jsonfmt_next(p->args, p->args_len, &pos, &key, &v, &vl)) {
        n++;
        tmpl_scaffold(b, "<" DSV4_DSML "parameter name=\"");
        tmpl_text(b, key.p ? key.p : "", key.len);
        if (v[0] == '"') {
            str.len = 0;
            jsonfmt_decode_string(&str, v, vl);
            tmpl_scaffold(b, "\" string=\"true\">");
            tmpl_text(b, str.p ? str.p : "", str.len);
        } else {
            tmpl_scaffold(b, "\" string=\"false\">");
            if (tmpl_json(b, v, vl, JSONFMT_SPACED, 0, "tool call arguments")) tmpl_text(b, b->json.p, b->json.len);
        }
        tmpl_scaffold(b, "</" DSV4_DSML "parameter>\n");
    }
    if (!n) tmpl_scaffold(b, "\n");
    tmpl_scaffold(b, "</" DSV4_DSML "invoke>\n");
    bytebuf_free(&key);
    bytebuf_free(&str);
}

static bool tmpl_dsv4_thinking(const conv *c) { return c->thinking == CONV_THINKING_ON; }

void tmpl_render_deepseek4(tmpl_b *b, const conv *c, const tmpl_msg *m, bool flash_0731, bool *open_think)
{
    int n = c->n_turns;
    bool thinking = tmpl_dsv4_thinking(c), has_tools = c->n_tools > 0;
    tmpl_bos(b);
    /* reasoning_effort == 'high' (Flash-0731); V4's 'max' has no API spelling */
    if (n && thinking && flash_0731 && c->effort == CONV_EFFORT_HIGH) tmpl_scaffold(b, dsv4_effort_high);
    /* the system prompt: only "system" turns (the template reads "developer" as a user turn) */
    bool first_sp = true;
    size_t sp_len = 0;  /* bytes of the system prompt so far (Jinja tests the string) */
    for (int i = 0; i < n; i++) {
        if (m[i].turn->role != CONV_ROLE_SYSTEM) continue;
        if (!first_sp) tmpl_scaffold(b, "\n\n");
        tmpl_text(b, m[i].content, m[i].c_len);
        sp_len += m[i].c_len + (first_sp ? 0 : 2);
        first_sp = false;
    }
    if (has_tools) {
        if (sp_len) tmpl_scaffold(b, "\n\n");
        tmpl_scaffold(b, dsv4_tools_header);
        for (int i = 0; i < c->n_tools; i++) {
            tmpl_dsv4_tool(b, &c->tools[i]);
            tmpl_scaffold(b, "\n");
        }
        tmpl_scaffold(b, dsv4_tools_footer);
    }
    int last_user = -1;
    bool has_results = false;
    for (int i = 0; i < n; i++) {
        conv_role r = m[i].turn->role;
        if (r == CONV_ROLE_USER || r == CONV_ROLE_DEVELOPER || r == CONV_ROLE_TOOL) last_user = i;
        has_results = has_results || r == CONV_ROLE_TOOL;
    }
    bool in_user = false;
    for (int i = 0; i < n; i++) {
        const tmpl_msg *x = &m[i];
        conv_role r = x->turn->role;
        if (r == CONV_ROLE_USER || r == CONV_ROLE_DEVELOPER || r == CONV_ROLE_TOOL) {
            tmpl_scaffold(b, in_user ? "\n\n" : "<｜User｜>");
            in_user = true;
            if (r == CONV_ROLE_TOOL) tmpl_scaffold(b, "<tool_result>");
            tmpl_text(b, x->content, x->c_len);
            if (r == CONV_ROLE_TOOL) tmpl_scaffold(b, "</tool_result>");
        } else if (r == CONV_ROLE_ASSISTANT) {
            in_user = false;
            tmpl_scaffold(b, "<｜Assistant｜>");
            bool keep = thinking && (has_tools || i > last_user || has_results);
            if (keep) {
                tmpl_scaffold(b, "<think>");
                tmpl_text(b, x->reason, x->r_len);
            }
            tmpl_scaffold(b, "</think>");
            tmpl_text(b, x->content, x->c_len);
            if (x->n_calls > 0) {
                tmpl_scaffold(b, "\n\n<" DSV4_DSML "tool_calls>\n");
                for (int k = 0; k < x->n_calls && b->st == TEMPLATE_OK; k++) tmpl_dsv4_invoke(b, tmpl_call(x, k));
                tmpl_scaffold(b, "</" DSV4_DSML "tool_calls>");
            }
            tmpl_scaffold(b, "<｜end▁of▁sentence｜>");
        }
    }
    *open_think = false;
    if (c->add_generation_prompt) {
        tmpl_scaffold(b, "<｜Assistant｜>");
        tmpl_scaffold(b, thinking ? "<think>" : "</think>");
        *open_think = thinking;
    }
}

void tmpl_deepseek4_markers(const tokenizer *tok, const conv *c, events_markers *m)
{
    m->think_start = tmpl_find(tok, "<think>");
    m->think_end = tmpl_find(tok, "</think>");
    tmpl_tool_markers(tok, EVENTS_TOOLFMT_DSML, m);
    if (m->tool_start < 0) m->toolfmt = EVENTS_TOOLFMT_NONE;  /* no ｜DSML｜ token: no calls */
    m->tools = c;
    m->starts_in_reasoning = m->think_start >= 0 && c->add_generation_prompt && tmpl_dsv4_thinking(c);
}
