/*
 * template_int: what only the template's files (template*.c) may see: the render builder, the
 * per-turn view of a conv, and the builder calls a family's renderer makes. The token rules
 * and the families are described in template.h.
 *
 *   template.c          choosing the family, the builder (scaffold vs content text), the
 *                       per-turn view, every family but harmony, tokenising the runs
 *   template_harmony.c  the harmony (gpt-oss) family: the TypeScript tool namespace, the
 *                       channels, the call and result messages
 *   template_dsv4.c     the DeepSeek V4 family: the tools section, DSML calls, <tool_result>
 *   template_jinja.c    any other template text, through the Jinja interpreter (jinja.h)
 */
#ifndef TM_TEMPLATE_INT_H
#define TM_TEMPLATE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "recipe/conv.h"
#include "util/jsonfmt.h"
#include "recipe/template.h"
#include "util/bytebuf.h"

/* One piece of a rendered prompt: a special token by id, or a run of plain text. */
typedef struct {
    int32_t id;      /* token id, or -1 for a text run */
    size_t off;      /* text run: offset in runs */
    size_t len;      /* text run: bytes */
} tmpl_seg;

typedef struct {
    const template *t;
    tmpl_seg *segs;        /* n_segs segments in order */
    size_t n_segs, cap_segs;
    bytebuf runs;      /* bytes of all text runs */
    bytebuf shown;     /* the rendered text */
    bytebuf store;     /* per-turn contents (offsets in tmpl_msg) */
    bytebuf json;      /* scratch for JSON output */
    bytebuf json_src;  /* scratch for JSON input */
    bool rstrip_next;      /* the last special strips blanks to its right */
    bool raw_shown;        /* shown is the renderer's own text (the interpreter's), not rebuilt */
    template_status st;    /* first error */
    char *err;
    size_t errsz;
} tmpl_b;

/* One turn of the conv as the families read it. */
typedef struct {
    conv_role role;          /* developer mapped to system */
    const conv_turn *turn;
    size_t c_off, c_len;     /* content: text parts joined (tool turns: results joined) */
    bool has_reason;         /* a reasoning part is present */
    size_t r_off, r_len;     /* reasoning joined */
    int n_calls;             /* tool-call parts */
    const char *content;     /* resolved after the pre-pass */
    const char *reason;
} tmpl_msg;

/* The Jinja renderer's state for a template (template_jinja.c). */
typedef struct tmpl_jinja tmpl_jinja;

/* Content text: appended as plain text, never searched for special tokens. */
void tmpl_text(tmpl_b *b, const char *s, size_t n);
/* Template text z (NUL-terminated): the vocabulary's special tokens in it are emitted by id. */
void tmpl_scaffold(tmpl_b *b, const char *z);
/* The same for z[0..n). */
void tmpl_scaffold_n(tmpl_b *b, const char *z, size_t n);
/* The vocabulary's BOS token, if it has one. */
void tmpl_bos(tmpl_b *b);
/* The id of the control or user-defined token spelled z; -1 if none. */
int32_t tmpl_find(const tokenizer *tok, const char *z);
/* Records the first error (fmt has one %s, filled with arg); later calls are ignored. */
void tmpl_fail(tmpl_b *b, template_status st, const char *fmt, const char *arg);
/* src[0..n) as printed by Jinja's tojson (style, indent) into b->json; false (and the error
 * "WHAT is not valid JSON" recorded) if it is not JSON. */
bool tmpl_json(tmpl_b *b, const char *src, size_t n, jsonfmt_style style, int indent, const char *what);
/* The k-th tool-call part of a turn; NULL if it has fewer. */
const conv_part *tmpl_call(const tmpl_msg *m, int k);
/* The token ids of tool-call format fmt's markers into m (m->toolfmt = fmt); a marker the
 * vocabulary lacks is -1. */
void tmpl_tool_markers(const tokenizer *tok, events_toolfmt fmt, events_markers *m);
/* Tool call p's arguments as spaced JSON into the prompt (malformed ones fail the render). */
void tmpl_call_args(tmpl_b *b, const conv_part *p);
/* Appends a tool definition as OpenAI shapes it: {"type": "function", "function": {name,
 * description, parameters}}, the parameters' JSON text as given. */
void tmpl_tool_openai(bytebuf *o, const conv_tool *tl);

/* The harmony (gpt-oss) family's prompt for c, turns m (template_harmony.c). */
void tmpl_render_harmony(tmpl_b *b, const conv *c, const tmpl_msg *m);

/* The DeepSeek V4 family's prompt for c, turns m (template_dsv4.c); flash_0731: the
 * V4-Flash-0731 text (its "high" effort line); *open_think: the prompt ends inside <think>. */
void tmpl_render_deepseek4(tmpl_b *b, const conv *c, const tmpl_msg *m, bool flash_0731, bool *open_think);
/* Its splitter markers for a response to c. */
void tmpl_deepseek4_markers(const tokenizer *tok, const conv *c, events_markers *m);

/* Parses text[0..n) for t and renders a plain conversation with it (template_jinja.c). */
template_status tmpl_jinja_new(const template *t, const char *text, size_t n, tmpl_jinja **out, char *err, size_t errsz);
void tmpl_jinja_free(tmpl_jinja *j);
/* c's prompt by the interpreter: untainted output through tmpl_scaffold_n, tainted through
 * tmpl_text. */
void tmpl_render_jinja(tmpl_b *b, const conv *c, const tmpl_jinja *j);
/* The splitter's markers for a response to c: the tool format of the template's own call
 * syntax, think markers when the template writes them. */
void tmpl_jinja_markers(const template *t, const tmpl_jinja *j, const conv *c, events_markers *m);

#endif
