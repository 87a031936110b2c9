/*
 * events: the output splitter. See events.h for the rules; this file is the state machine.
 *
 * Buffers: `hold` keeps blank text that may still be followed by more words (trim mode),
 * `raw` the exact text of a tool call being read (markers included, for the malformed rule),
 * `name`/`body` the parts of the call, `args` the re-emitted arguments.
 */
#include "recipe/events.h"

#include <stdlib.h>
#include <string.h>

#include "recipe/jsonfmt.h"
#include "util/util.h"

typedef enum {
    EVENTS_ST_TEXT = 0,
    EVENTS_ST_REASONING,
    EVENTS_ST_QWEN_CALL,   /* inside <tool_call> ... */
    EVENTS_ST_DS_CALLS,    /* inside the tool-calls block, between calls */
    EVENTS_ST_DS_NAME,     /* after <｜tool▁call▁begin｜>, reading the name */
    EVENTS_ST_DS_ARGS,     /* after <｜tool▁sep｜>, reading the arguments */
    EVENTS_ST_LLAMA_JSON,  /* holding a JSON answer that may be a tool call */
    EVENTS_ST_DONE,
} events_state;

struct events {
    events_markers m;      /* marker ids and options */
    events_cb cb;          /* callback */
    void *ud;              /* its user data */
    util_rng rng;          /* tool-call ids */
    events_state st;       /* current state */
    bool text_started;     /* non-blank answer text sent in the current text section */
    bool reason_started;   /* non-blank reasoning sent in the current reasoning section */
    bool llama_checked;    /* LLAMA3: the answer's first non-blank character was seen */
    bool ds_block;         /* DEEPSEEK: the current call sits inside a calls block */
    int n_calls;           /* tool calls sent */
    jsonfmt_buf hold;      /* held-back blank text */
    jsonfmt_buf raw;       /* raw text of the call being read */
    jsonfmt_buf name;      /* call name (decoded) */
    jsonfmt_buf body;      /* call body text */
    jsonfmt_buf args;      /* compact arguments */
    jsonfmt_buf tmp;       /* scratch */
    char id[32];           /* current call id */
};

void events_markers_none(events_markers *m)
{
    memset(m, 0, sizeof *m);
    m->think_start = m->think_end = -1;
    m->tool_start = m->tool_end = m->tools_begin = m->tools_end = m->tool_sep = -1;
}

static bool events_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void events_clear(jsonfmt_buf *b)
{
    b->len = 0;
    if (b->p) b->p[0] = 0;
}

events *events_new(const events_markers *m, uint64_t seed, events_cb cb, void *ud)
{
    events *ev = xcalloc(1, sizeof *ev);
    ev->cb = cb;
    ev->ud = ud;
    events_reset(ev, m, seed);
    return ev;
}

void events_free(events *ev)
{
    if (!ev) return;
    jsonfmt_buf_free(&ev->hold);
    jsonfmt_buf_free(&ev->raw);
    jsonfmt_buf_free(&ev->name);
    jsonfmt_buf_free(&ev->body);
    jsonfmt_buf_free(&ev->args);
    jsonfmt_buf_free(&ev->tmp);
    free(ev);
}

void events_reset(events *ev, const events_markers *m, uint64_t seed)
{
    ev->m = *m;
    util_rng_seed(&ev->rng, seed);
    ev->st = m->starts_in_reasoning ? EVENTS_ST_REASONING : EVENTS_ST_TEXT;
    ev->text_started = ev->reason_started = false;
    ev->llama_checked = false;
    ev->ds_block = false;
    ev->n_calls = 0;
    events_clear(&ev->hold);
    events_clear(&ev->raw);
    events_clear(&ev->name);
    events_clear(&ev->body);
    events_clear(&ev->args);
    ev->id[0] = 0;
}

int events_n_tool_calls(const events *ev) { return ev->n_calls; }

static void events_emit(events *ev, events_kind kind, const char *s, size_t n)
{
    if (n == 0 && (kind == EVENTS_TEXT || kind == EVENTS_REASONING)) return;
    events_event e = { .kind = kind, .text = s, .len = n, .tool_index = ev->n_calls,
                       .tool_id = ev->id, .tool_name = ev->name.p ? ev->name.p : "" };
    ev->cb(ev->ud, &e);
}

/* Sends a text or reasoning delta, holding back trailing blanks in trim mode. */
static void events_section_text(events *ev, events_kind kind, const char *s, size_t n)
{
    if (!ev->m.trim) {
        events_emit(ev, kind, s, n);
        return;
    }
    bool *started = kind == EVENTS_TEXT ? &ev->text_started : &ev->reason_started;
    size_t last = n;
    while (last > 0 && events_blank(s[last - 1])) last--;
    if (last == 0) {
        if (*started) jsonfmt_buf_append(&ev->hold, s, n);
        return;
    }
    size_t i = 0;
    if (!*started) {
        while (events_blank(s[i])) i++;
    } else if (ev->hold.len) {
        events_emit(ev, kind, ev->hold.p, ev->hold.len);
    }
    events_clear(&ev->hold);
    events_emit(ev, kind, s + i, last - i);
    *started = true;
    jsonfmt_buf_append(&ev->hold, s + last, n - last);
}

/* A section ends (marker or finish): blanks held back are dropped. */
static void events_section_end(events *ev)
{
    events_clear(&ev->hold);
}

static void events_new_id(events *ev)
{
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(ev->id, "call_", 5);
    for (int k = 0; k < 24; k++) ev->id[5 + k] = al[util_rng_next(&ev->rng) % 62];
    ev->id[29] = 0;
}

static void events_trim(const char **s, size_t *n)
{
    while (*n && events_blank(**s)) { (*s)++; (*n)--; }
    while (*n && events_blank((*s)[*n - 1])) (*n)--;
}

/* ev->args = the compact JSON object in a[0..n), or the object held in a JSON string. */
static bool events_norm_args(events *ev, const char *a, size_t n)
{
    events_clear(&ev->args);
    events_trim(&a, &n);
    if (n && a[0] == '"') {
        events_clear(&ev->tmp);
        if (!jsonfmt_decode_string(&ev->tmp, a, n)) return false;
        a = ev->tmp.p;
        n = ev->tmp.len;
        events_trim(&a, &n);
    }
    if (!n || a[0] != '{') return false;
    return jsonfmt_write(&ev->args, a, n, JSONFMT_COMPACT, 0);
}

/* Parses {"name": N, "arguments"|"parameters": ARGS} into ev->name / ev->args. */
static bool events_parse_json_call(events *ev, const char *s, size_t n)
{
    events_trim(&s, &n);
    const char *v;
    size_t vn;
    if (!n || s[0] != '{') return false;
    if (!jsonfmt_get_member(s, n, "name", &v, &vn) || v[0] != '"') return false;
    events_clear(&ev->name);
    if (!jsonfmt_decode_string(&ev->name, v, vn) || ev->name.len == 0) return false;
    if (jsonfmt_get_member(s, n, "arguments", &v, &vn) || jsonfmt_get_member(s, n, "parameters", &v, &vn))
        return events_norm_args(ev, v, vn);
    events_clear(&ev->args);
    jsonfmt_buf_puts(&ev->args, "{}");
    return true;
}

/* Sends the three events of a decided call (name/args already in the buffers). */
static void events_send_call(events *ev)
{
    events_new_id(ev);
    events_emit(ev, EVENTS_TOOL_START, NULL, 0);
    events_emit(ev, EVENTS_TOOL_ARGS, ev->args.p, ev->args.len);
    events_emit(ev, EVENTS_TOOL_END, ev->args.p, ev->args.len);
    ev->n_calls++;
}

/* The malformed rule: the raw call text becomes answer text. */
static void events_call_as_text(events *ev)
{
    events_section_text(ev, EVENTS_TEXT, ev->raw.p ? ev->raw.p : "", ev->raw.len);
}

static void events_strip_fence(const char **s, size_t *n)
{
    events_trim(s, n);
    if (*n >= 3 && !memcmp(*s, "```", 3)) {
        const char *nl = memchr(*s, '\n', *n);
        if (!nl) return;
        *n -= (size_t)(nl + 1 - *s);
        *s = nl + 1;
        events_trim(s, n);
        if (*n >= 3 && !memcmp(*s + *n - 3, "```", 3)) *n -= 3;
        events_trim(s, n);
    }
}

static bool events_parse_ds_call(events *ev)
{
    const char *nm = ev->name.p ? ev->name.p : "";
    size_t nn = ev->name.len;
    const char *a = ev->body.p ? ev->body.p : "";
    size_t an = ev->body.len;
    events_trim(&nm, &nn);
    events_trim(&a, &an);
    if (nn == 8 && !memcmp(nm, "function", 8)) {
        /* R1 form: the name is the first line of the body */
        const char *nl = memchr(a, '\n', an);
        if (!nl) return false;
        nm = a;
        nn = (size_t)(nl - a);
        an -= nn + 1;
        a = nl + 1;
        events_trim(&nm, &nn);
    }
    if (!nn) return false;
    events_strip_fence(&a, &an);
    if (!events_norm_args(ev, a, an)) return false;
    events_clear(&ev->tmp);
    jsonfmt_buf_append(&ev->tmp, nm, nn);
    events_clear(&ev->name);
    jsonfmt_buf_append(&ev->name, ev->tmp.p, ev->tmp.len);
    return true;
}

static void events_begin_call(events *ev, events_state st, const char *text, size_t len)
{
    /* blanks held before the marker go back into the text if the call turns out malformed */
    events_clear(&ev->raw);
    if (ev->hold.len) jsonfmt_buf_append(&ev->raw, ev->hold.p, ev->hold.len);
    events_section_end(ev);
    ev->st = st;
    events_clear(&ev->name);
    events_clear(&ev->body);
    jsonfmt_buf_append(&ev->raw, text, len);
}

/* After a call (sent or turned into text): back to answer text. */
static void events_after_call(events *ev, events_state st)
{
    ev->st = st;
    ev->text_started = false;
    events_clear(&ev->hold);
}

/* Decides the call being read; `complete` says whether its end marker arrived. */
static void events_close_call(events *ev)
{
    bool ok;
    events_state next = EVENTS_ST_TEXT;
    switch (ev->st) {
    case EVENTS_ST_QWEN_CALL:
    case EVENTS_ST_LLAMA_JSON:
        ok = events_parse_json_call(ev, ev->body.p ? ev->body.p : "", ev->body.len);
        break;
    case EVENTS_ST_DS_NAME:
    case EVENTS_ST_DS_ARGS:
        ok = ev->st == EVENTS_ST_DS_ARGS && events_parse_ds_call(ev);
        if (ev->ds_block) next = EVENTS_ST_DS_CALLS;
        break;
    default:
        return;
    }
    ev->st = EVENTS_ST_TEXT;
    if (ok) {
        events_send_call(ev);
    } else {
        ev->text_started = true; /* keep the raw text's own blanks */
        events_call_as_text(ev);
    }
    events_after_call(ev, next);
}

/* LLAMA3: is the held body a complete JSON value yet? */
static void events_llama_check(events *ev)
{
    const char *s = ev->body.p ? ev->body.p : "";
    size_t n = ev->body.len;
    events_trim(&s, &n);
    if (!n || s[0] != '{' || s[n - 1] != '}') return;
    if (!jsonfmt_valid(s, n)) return;
    if (events_parse_json_call(ev, s, n)) {
        events_send_call(ev);
        events_after_call(ev, EVENTS_ST_TEXT);
    } else {
        ev->st = EVENTS_ST_TEXT;
        events_call_as_text(ev);
    }
}

void events_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    const events_markers *m = &ev->m;
    if (!text) len = 0;
    if (!text) text = "";
    switch (ev->st) {
    case EVENTS_ST_DONE:
        return;
    case EVENTS_ST_TEXT:
        if (tok == m->think_start && tok >= 0) {
            events_section_end(ev);
            ev->st = EVENTS_ST_REASONING;
            ev->reason_started = false;
            return;
        }
        if (tok == m->think_end && tok >= 0) return; /* stray: the marker carries no text */
        if (m->toolfmt == EVENTS_TOOLFMT_QWEN && tok == m->tool_start && tok >= 0) {
            events_begin_call(ev, EVENTS_ST_QWEN_CALL, text, len);
            return;
        }
        if (m->toolfmt == EVENTS_TOOLFMT_DEEPSEEK && tok >= 0 && tok == m->tools_begin) {
            events_begin_call(ev, EVENTS_ST_DS_CALLS, text, len);
            ev->ds_block = true;
            return;
        }
        if (m->toolfmt == EVENTS_TOOLFMT_DEEPSEEK && tok >= 0 && tok == m->tool_start) {
            events_begin_call(ev, EVENTS_ST_DS_NAME, text, len);
            ev->ds_block = false;
            return;
        }
        if (m->toolfmt == EVENTS_TOOLFMT_LLAMA3 && m->tools_enabled && !ev->llama_checked) {
            if (tok >= 0 && tok == m->tool_start) {
                ev->llama_checked = true;
                events_begin_call(ev, EVENTS_ST_LLAMA_JSON, text, len);
                return;
            }
            size_t i = 0;
            while (i < len && events_blank(text[i])) i++;
            if (i == len) return; /* still nothing but blanks: dropped in any case */
            ev->llama_checked = true;
            if (text[i] == '{') {
                events_begin_call(ev, EVENTS_ST_LLAMA_JSON, text, len);
                jsonfmt_buf_append(&ev->body, text + i, len - i);
                events_llama_check(ev);
                return;
            }
        }
        events_section_text(ev, EVENTS_TEXT, text, len);
        return;
    case EVENTS_ST_REASONING:
        if (tok == m->think_end && tok >= 0) {
            events_section_end(ev);
            ev->st = EVENTS_ST_TEXT;
            ev->text_started = false;
            return;
        }
        if (tok == m->think_start && tok >= 0) return;
        events_section_text(ev, EVENTS_REASONING, text, len);
        return;
    case EVENTS_ST_QWEN_CALL:
        jsonfmt_buf_append(&ev->raw, text, len);
        if (tok == m->tool_end && tok >= 0) {
            events_close_call(ev);
            return;
        }
        jsonfmt_buf_append(&ev->body, text, len);
        return;
    case EVENTS_ST_LLAMA_JSON:
        jsonfmt_buf_append(&ev->raw, text, len);
        jsonfmt_buf_append(&ev->body, text, len);
        if (memchr(text, '}', len)) events_llama_check(ev);
        return;
    case EVENTS_ST_DS_CALLS:
        if (tok >= 0 && tok == m->tool_start) {
            events_begin_call(ev, EVENTS_ST_DS_NAME, text, len);
            return;
        }
        if (tok >= 0 && tok == m->tools_end) {
            ev->ds_block = false;
            events_after_call(ev, EVENTS_ST_TEXT);
            return;
        }
        return; /* blanks between calls */
    case EVENTS_ST_DS_NAME:
        jsonfmt_buf_append(&ev->raw, text, len);
        if (tok >= 0 && tok == m->tool_sep) {
            ev->st = EVENTS_ST_DS_ARGS;
            return;
        }
        if (tok >= 0 && tok == m->tool_end) {
            events_close_call(ev);
            return;
        }
        jsonfmt_buf_append(&ev->name, text, len);
        return;
    case EVENTS_ST_DS_ARGS:
        jsonfmt_buf_append(&ev->raw, text, len);
        if (tok >= 0 && tok == m->tool_end) {
            events_close_call(ev);
            return;
        }
        jsonfmt_buf_append(&ev->body, text, len);
        return;
    }
}

void events_finish(events *ev, events_finish_reason reason)
{
    if (ev->st == EVENTS_ST_DONE) return;
    if (ev->st == EVENTS_ST_LLAMA_JSON) {
        const char *s = ev->body.p ? ev->body.p : "";
        size_t n = ev->body.len;
        events_trim(&s, &n);
        if (n && jsonfmt_valid(s, n) && events_parse_json_call(ev, s, n)) {
            events_send_call(ev);
        } else {
            ev->text_started = true;
            events_call_as_text(ev);
        }
    } else {
        events_close_call(ev);
    }
    events_section_end(ev);
    ev->st = EVENTS_ST_DONE;
    if (reason == EVENTS_FINISH_STOP && ev->n_calls > 0) reason = EVENTS_FINISH_TOOL_CALLS;
    events_event e = { .kind = EVENTS_FINISH, .tool_index = -1, .tool_id = "", .tool_name = "", .finish = reason };
    ev->cb(ev->ud, &e);
}
