/*
 * events: the output splitter. See events.h for the rules; this file is the state machine.
 *
 * Buffers: `hold` keeps blank text that may still be followed by more words (trim mode),
 * `raw` the exact text of a tool call being read (markers included, for the malformed rule),
 * `name`/`body` the parts of the call, `args` the re-emitted arguments.
 *
 * Streaming a call's arguments: after each piece of a call's body, events_stream_args looks
 * for the call's head (the name, then the start of the arguments object); once it is there
 * the call is committed (TOOL_START). From then on the arguments text is re-emitted with
 * jsonfmt_prefix (compact, only what is final) into `pre`, and the part of it up to the last
 * point where it could be closed (events_json_cut: not inside a key, not after a ':' or ',')
 * that was not sent yet goes out as a TOOL_ARGS fragment; `sent` holds what was sent.
 */
#define _GNU_SOURCE /* memrchr */
#include "recipe/events.h"

#include <stdlib.h>
#include <string.h>

#include "util/jsonfmt.h"
#include "util/util.h"

typedef enum {
    EVENTS_ST_TEXT = 0,
    EVENTS_ST_REASONING,
    EVENTS_ST_QWEN_CALL,   /* inside <tool_call> ... */
    EVENTS_ST_DS_CALLS,    /* inside the tool-calls block, between calls */
    EVENTS_ST_DS_NAME,     /* after <｜tool▁call▁begin｜>, reading the name */
    EVENTS_ST_DS_ARGS,     /* after <｜tool▁sep｜>, reading the arguments */
    EVENTS_ST_LLAMA_JSON,  /* holding a JSON answer that may be a tool call */
    EVENTS_ST_H_HEAD,      /* HARMONY: reading a message header (up to <|message|>) */
    EVENTS_ST_H_CALL,      /* HARMONY: reading the arguments of a call message */
    EVENTS_ST_H_AFTER,     /* HARMONY: between messages (after <|end|>) */
    EVENTS_ST_MI_NAME,     /* MISTRAL: after [TOOL_CALLS], reading the name (or the older JSON) */
    EVENTS_ST_MI_ID,       /* MISTRAL: after [CALL_ID], up to [ARGS] */
    EVENTS_ST_MI_ARGS,     /* MISTRAL: after [ARGS], reading the arguments object */
    EVENTS_ST_MI_JSON,     /* MISTRAL: the older form, a JSON array (or object) of calls */
    EVENTS_ST_GLM_NAME,    /* GLM: after <tool_call>, reading the name */
    EVENTS_ST_GLM_KEY,     /* GLM: inside <arg_key> */
    EVENTS_ST_GLM_GAP,     /* GLM: after </arg_key>, before <arg_value> */
    EVENTS_ST_GLM_VAL,     /* GLM: inside <arg_value> */
    EVENTS_ST_GLM_AFTER,   /* GLM: after </arg_value> */
    EVENTS_ST_DSML,        /* DSML: inside a <｜DSML｜tool_calls> block (dsml_lvl says where) */
    EVENTS_ST_XML,         /* XML: after <tool_call> (xml_lvl says where) */
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
    bool committed;        /* the call being read was announced (TOOL_START sent) */
    bool no_stream;        /* its head does not have the streamable shape: decided at its end */
    bool args_over;        /* its arguments were read to their end, or went bad: no more fragments */
    bool h_channel;        /* HARMONY: the header being read has its <|channel|> marker */
    bool h_first;          /* HARMONY: still in the output's first message (m.h_analysis) */
    size_t args_at;        /* committed: offset in body where the arguments object starts */
    int n_calls;           /* tool calls sent */
    bytebuf hold;      /* held-back blank text */
    bytebuf raw;       /* raw text of the call being read */
    bytebuf name;      /* call name (decoded) */
    bytebuf body;      /* call body text */
    bytebuf args;      /* compact arguments */
    bytebuf tmp;       /* scratch */
    bytebuf cname;     /* committed call: its name */
    bytebuf pre;       /* committed call: compact re-emission of the arguments read so far */
    bytebuf sent;      /* committed call: the arguments fragments sent so far */
    bytebuf head;      /* HARMONY: the header being read; \x01 stands for <|channel|>, \x02 for <|constrain|>;
                          GLM: the argument key being read */
    bytebuf val;       /* GLM: the argument value being read */
    bool dsml_lt;          /* DSML: a '<' of the text is held back (the next token may be ｜DSML｜) */
    int dsml_lvl;          /* DSML: 0 before the block's opening tag, 1 between invokes, 2 inside one */
    size_t dsml_at;        /* DSML: offset in body up to which the block was parsed */
    int dsml_calls;        /* DSML: invokes opened in this block */
    int xml_lvl;           /* XML: 0 before <function=N>, 1 inside it, 2 after </function>; it went
                              bad: 3 after a sent call (the rest dropped), 4 before (all text) */
    size_t xml_at;         /* XML: offset in body up to which the call was parsed */
    char id[32];           /* current call id */
};

void events_markers_none(events_markers *m)
{
    memset(m, 0, sizeof *m);
    m->think_start = m->think_end = -1;
    m->tool_start = m->tool_end = m->tools_begin = m->tools_end = m->tool_sep = -1;
    m->call_id = m->arg_key = m->arg_key_end = m->arg_val = m->arg_val_end = -1;
    m->tools = NULL;
    m->h_start = m->h_channel = m->h_message = m->h_constrain = m->h_end = m->h_call = m->h_return = -1;
}

static bool events_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void events_clear(bytebuf *b)
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
    bytebuf_free(&ev->hold);
    bytebuf_free(&ev->raw);
    bytebuf_free(&ev->name);
    bytebuf_free(&ev->body);
    bytebuf_free(&ev->args);
    bytebuf_free(&ev->tmp);
    bytebuf_free(&ev->cname);
    bytebuf_free(&ev->pre);
    bytebuf_free(&ev->sent);
    bytebuf_free(&ev->head);
    bytebuf_free(&ev->val);
    free(ev);
}

void events_reset(events *ev, const events_markers *m, uint64_t seed)
{
    ev->m = *m;
    util_rng_seed(&ev->rng, seed);
    ev->st = m->starts_in_reasoning ? EVENTS_ST_REASONING : EVENTS_ST_TEXT;
    if (m->toolfmt == EVENTS_TOOLFMT_HARMONY) ev->st = EVENTS_ST_H_HEAD;  /* after "<|start|>assistant" */
    ev->h_channel = false;
    ev->h_first = m->h_analysis;
    events_clear(&ev->head);
    ev->text_started = ev->reason_started = false;
    ev->llama_checked = false;
    ev->ds_block = false;
    ev->committed = ev->no_stream = ev->args_over = false;
    ev->n_calls = 0;
    events_clear(&ev->hold);
    events_clear(&ev->raw);
    events_clear(&ev->name);
    events_clear(&ev->body);
    events_clear(&ev->args);
    events_clear(&ev->val);
    ev->dsml_lt = false;
    ev->dsml_lvl = 0;
    ev->dsml_at = 0;
    ev->dsml_calls = 0;
    ev->id[0] = 0;
    if (m->toolfmt == EVENTS_TOOLFMT_HARMONY && m->h_forced) {  /* the prompt opened a call */
        bytebuf_puts(&ev->name, m->h_forced);
        ev->st = EVENTS_ST_H_CALL;
    }
}

int events_n_tool_calls(const events *ev) { return ev->n_calls; }

bool events_in_reasoning(const events *ev)
{
    return ev->st == EVENTS_ST_REASONING || (ev->st == EVENTS_ST_H_HEAD && ev->h_first);
}

static void events_emit(events *ev, events_kind kind, const char *s, size_t n)
{
    if (n == 0 && (kind == EVENTS_TEXT || kind == EVENTS_REASONING)) return;
    const bytebuf *nm = ev->committed ? &ev->cname : &ev->name;
    events_event e = { .kind = kind, .text = s, .len = n, .tool_index = ev->n_calls,
                       .tool_id = ev->id, .tool_name = nm->p ? nm->p : "" };
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
        if (*started) bytebuf_append(&ev->hold, s, n);
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
    bytebuf_append(&ev->hold, s + last, n - last);
}

/* A section ends (marker or finish): blanks held back are dropped. */
static void events_section_end(events *ev)
{
    events_clear(&ev->hold);
}

static void events_new_id(events *ev)
{
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    if (ev->m.toolfmt == EVENTS_TOOLFMT_MISTRAL) {  /* its templates refuse any other id */
        for (int k = 0; k < 9; k++) ev->id[k] = al[util_rng_next(&ev->rng) % 62];
        ev->id[9] = 0;
        return;
    }
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
    bytebuf_puts(&ev->args, "{}");
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
    bytebuf_append(&ev->tmp, nm, nn);
    events_clear(&ev->name);
    bytebuf_append(&ev->name, ev->tmp.p, ev->tmp.len);
    return true;
}

static void events_begin_call(events *ev, events_state st, const char *text, size_t len)
{
    /* blanks held before the marker go back into the text if the call turns out malformed */
    events_clear(&ev->raw);
    if (ev->hold.len) bytebuf_append(&ev->raw, ev->hold.p, ev->hold.len);
    events_section_end(ev);
    ev->st = st;
    events_clear(&ev->name);
    events_clear(&ev->body);
    events_clear(&ev->args);
    bytebuf_append(&ev->raw, text, len);
    ev->committed = ev->no_stream = ev->args_over = false;
}

/* ---- streaming the arguments of a call ---- */

/* Matches the literal z at s[*i..n) after blanks: 1 matched (*i past it), 0 the text ends
 * inside it (or before it), -1 something else stands there. */
static int events_match(const char *s, size_t n, size_t *i, const char *z)
{
    while (*i < n && events_blank(s[*i])) (*i)++;
    size_t l = strlen(z), k = TM_MIN(l, n - *i);
    if (memcmp(s + *i, z, k)) return -1;
    if (k < l) return 0;
    *i += l;
    return 1;
}

/* QWEN / LLAMA3 head: {"name": "N", "arguments"|"parameters": { — 1 with ev->cname = N and
 * *at = the offset of the arguments' '{'; 0 the body is too short to tell; -1 another shape
 * (other keys first, arguments given as a string, ...): the call is decided at its end. */
static int events_json_head(events *ev, const char *s, size_t n, size_t *at)
{
    size_t i = 0;
    int m;
    if ((m = events_match(s, n, &i, "{")) <= 0 || (m = events_match(s, n, &i, "\"name\"")) <= 0 ||
        (m = events_match(s, n, &i, ":")) <= 0 || (m = events_match(s, n, &i, "\"")) <= 0)
        return m;
    size_t q0 = i - 1, j = i;
    while (j < n && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
    if (j >= n) return 0;
    events_clear(&ev->cname);
    if (!jsonfmt_decode_string(&ev->cname, s + q0, j + 1 - q0) || ev->cname.len == 0) return -1;
    i = j + 1;
    if ((m = events_match(s, n, &i, ",")) <= 0) return m;
    size_t k = i;
    m = events_match(s, n, &i, "\"arguments\"");
    if (m < 0) {
        i = k;
        m = events_match(s, n, &i, "\"parameters\"");
    } else if (m == 0 && events_match(s, n, &k, "\"parameters\"") < 0) {
        m = 0;
    }
    if (m <= 0 || (m = events_match(s, n, &i, ":")) <= 0 || (m = events_match(s, n, &i, "{")) <= 0) return m;
    *at = i - 1;
    return 1;
}

/* DEEPSEEK head, in the arguments part after <｜tool▁sep｜>: the R1 form's name line, an
 * optional ```json fence line, then '{' (see events_json_head for the results). */
static int events_ds_head(events *ev, const char *s, size_t n, size_t *at)
{
    const char *nm = ev->name.p ? ev->name.p : "";
    size_t nn = ev->name.len, i = 0;
    events_trim(&nm, &nn);
    if (nn == 8 && !memcmp(nm, "function", 8)) {  /* R1: the name is the first line */
        const char *nl = memchr(s, '\n', n);
        if (!nl) return 0;
        nm = s;
        nn = (size_t)(nl - s);
        i = nn + 1;
        events_trim(&nm, &nn);
    }
    if (!nn) return -1;
    while (i < n && events_blank(s[i])) i++;
    if (i == n) return 0;
    if (s[i] == '`') {
        int m = events_match(s, n, &i, "```");
        if (m <= 0) return m;
        const char *nl = memchr(s + i, '\n', n - i);
        if (!nl) return 0;
        i = (size_t)(nl + 1 - s);
    }
    int m = events_match(s, n, &i, "{");
    if (m <= 0) return m;
    events_clear(&ev->cname);
    bytebuf_append(&ev->cname, nm, nn);
    *at = i - 1;
    return 1;
}

/* HARMONY head: the body is the arguments object itself (the name came in the header). */
static int events_h_head(events *ev, const char *s, size_t n, size_t *at)
{
    size_t i = 0;
    while (i < n && events_blank(s[i])) i++;
    if (i == n) return 0;
    if (s[i] != '{' || ev->name.len == 0) return -1;
    events_clear(&ev->cname);
    bytebuf_append(&ev->cname, ev->name.p, ev->name.len);
    *at = i;
    return 1;
}

/* For compact JSON text s[0..n) (a prefix of jsonfmt_prefix's output): the largest cut at
 * which it can be closed, i.e. not inside a key, an escape or a character, and not right
 * after a key, a ':' or a ','. When closer is given, it receives what closes s[0..cut): a
 * quote if the cut is inside a string value, then the open brackets in reverse. */
static size_t events_json_cut(const char *s, size_t n, bytebuf *closer)
{
    char stack[JSONFMT_MAX_DEPTH + 2];
    int depth = 0, cut_depth = 0;
    bool in_str = false, key = false, cut_in_str = false;
    bool want_key = false;  /* the next string is a key (after '{' or an object's ',') */
    int esc = 0;            /* bytes of an escape still to come */
    size_t cut = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok;
        if (in_str) {
            if (esc > 0) esc--;
            else if (c == '\\') esc = i + 1 < n && s[i + 1] == 'u' ? 5 : 1;
            else if (c == '"') in_str = false;
            ok = esc == 0 && (!in_str || !key) && !(in_str && i + 1 < n && ((unsigned char)s[i + 1] & 0xC0) == 0x80);
            if (!in_str && key) ok = false;  /* a key without its value */
        } else {
            switch (c) {
            case '{':
            case '[':
                if (depth <= JSONFMT_MAX_DEPTH) stack[depth++] = c;
                want_key = c == '{';
                ok = true;
                break;
            case '}':
            case ']':
                if (depth > 0) depth--;
                ok = true;
                break;
            case ':':
                ok = false;
                break;
            case ',':
                want_key = depth > 0 && stack[depth - 1] == '{';
                ok = false;
                break;
            case '"':
                in_str = true;
                key = want_key;
                want_key = false;
                ok = !key;
                break;
            default:  /* numbers and literals come whole */
                ok = true;
                break;
            }
        }
        if (ok) {
            cut = i + 1;
            cut_depth = depth;
            cut_in_str = in_str;
        }
    }
    if (closer) {
        if (cut_in_str) bytebuf_putc(closer, '"');
        for (int d = cut_depth - 1; d >= 0; d--) bytebuf_putc(closer, stack[d] == '{' ? '}' : ']');
    }
    return cut;
}

/* Sends a TOOL_ARGS fragment and keeps it in `sent`. */
static void events_send_args(events *ev, const char *s, size_t n)
{
    if (!n) return;
    bytebuf_append(&ev->sent, s, n);
    events_emit(ev, EVENTS_TOOL_ARGS, s, n);
}

/* After the body of the call being read grew: commit it once its head is there, then send
 * the arguments that are final. */
static void events_stream_args(events *ev)
{
    if (ev->no_stream || ev->args_over) return;
    const char *s = ev->body.p ? ev->body.p : "";
    size_t n = ev->body.len;
    if (!ev->committed) {
        size_t at = 0;
        int h = ev->st == EVENTS_ST_DS_ARGS ? events_ds_head(ev, s, n, &at)
                : ev->st == EVENTS_ST_H_CALL || ev->st == EVENTS_ST_MI_ARGS ? events_h_head(ev, s, n, &at)
                                                                            : events_json_head(ev, s, n, &at);
        if (h == 0) return;
        if (h < 0) {
            ev->no_stream = true;
            return;
        }
        ev->committed = true;
        ev->args_at = at;
        events_clear(&ev->sent);
        events_new_id(ev);
        events_emit(ev, EVENTS_TOOL_START, NULL, 0);
    }
    events_clear(&ev->pre);
    size_t used = 0;
    jsonfmt_prefix_status st = jsonfmt_prefix(&ev->pre, s + ev->args_at, n - ev->args_at, &used);
    /* BAD: what came before the error is sent as far as it can be closed, then no more */
    size_t cut = st == JSONFMT_PREFIX_DONE ? ev->pre.len : events_json_cut(ev->pre.p, ev->pre.len, NULL);
    if (ev->pre.len < ev->sent.len || memcmp(ev->pre.p, ev->sent.p ? ev->sent.p : "", ev->sent.len)) {
        ev->args_over = true;  /* cannot happen (jsonfmt_prefix's outputs extend each other) */
        return;
    }
    if (cut > ev->sent.len) events_send_args(ev, ev->pre.p + ev->sent.len, cut - ev->sent.len);
    if (st != JSONFMT_PREFIX_MORE) ev->args_over = true;
}

/* Ends a committed call. ok: the whole body parsed, ev->args holds its arguments. Fragments
 * sent are never taken back: the rest of the parsed arguments is sent when they continue what
 * was sent; otherwise (malformed or cut arguments) what was sent is closed into valid JSON. */
static void events_end_committed(events *ev, bool ok)
{
    if (ok && ev->args.len >= ev->sent.len && !memcmp(ev->args.p, ev->sent.p ? ev->sent.p : "", ev->sent.len)) {
        events_send_args(ev, ev->args.p + ev->sent.len, ev->args.len - ev->sent.len);
    } else {
        if (ev->sent.len == 0) events_send_args(ev, "{", 1);  /* the head saw the arguments' '{' */
        events_clear(&ev->tmp);
        events_json_cut(ev->sent.p ? ev->sent.p : "", ev->sent.len, &ev->tmp);
        events_send_args(ev, ev->tmp.p, ev->tmp.len);
    }
    events_emit(ev, EVENTS_TOOL_END, ev->sent.p, ev->sent.len);
    ev->n_calls++;
    ev->committed = false;
}

/* After a call (sent or turned into text): back to answer text. */
static void events_after_call(events *ev, events_state st)
{
    ev->st = st;
    ev->text_started = false;
    events_clear(&ev->hold);
}

static void events_close_call(events *ev);

/* ---- mistral and glm ---- */

static void events_mi_json(events *ev, bool at_end);

/* MISTRAL, GLM: ev->name trimmed in place; false when empty or not one line. */
static bool events_call_name(events *ev)
{
    const char *s = ev->name.p ? ev->name.p : "";
    size_t n = ev->name.len;
    events_trim(&s, &n);
    if (!n || memchr(s, '\n', n)) return false;
    memmove(ev->name.p, s, n);
    ev->name.len = n;
    ev->name.p[n] = 0;
    return true;
}

/* GLM: does the schema of tool `name` in the request type its argument `key` "string"? */
static bool events_glm_string_arg(const events *ev, const char *name, const char *key, size_t kn)
{
    const conv *c = ev->m.tools;
    for (int i = 0; c && i < c->n_tools; i++) {
        const conv_tool *t = &c->tools[i];
        if (strcmp(t->name, name) || !t->parameters) continue;
        const char *props, *p, *ty;
        size_t pl, ppl, tl;
        size_t plen = strlen(t->parameters);
        if (!jsonfmt_get_member(t->parameters, plen, "properties", &props, &pl)) return false;
        /* keys may hold any bytes: look the member up through a NUL-terminated copy */
        char kz[256];
        if (kn >= sizeof kz) return false;
        memcpy(kz, key, kn);
        kz[kn] = 0;
        if (!jsonfmt_get_member(props, pl, kz, &p, &ppl)) return false;
        if (!jsonfmt_get_member(p, ppl, "type", &ty, &tl)) return false;
        return tl == 8 && !memcmp(ty, "\"string\"", 8);
    }
    return false;
}

/* GLM </arg_value>: the argument key/val joins ev->args ("{" or "," first) and is sent when
 * the call is committed (the first argument commits it). */
static bool events_glm_arg(events *ev)
{
    const char *k = ev->head.p ? ev->head.p : "";
    size_t kn = ev->head.len;
    events_trim(&k, &kn);
    if (!kn) return false;
    size_t at = ev->args.len;
    bytebuf_putc(&ev->args, at ? ',' : '{');
    jsonfmt_write_string(&ev->args, k, kn);
    bytebuf_putc(&ev->args, ':');
    const char *v = ev->val.p ? ev->val.p : "";
    size_t vn = ev->val.len;
    const char *tv = v;
    size_t tn = vn;
    events_trim(&tv, &tn);
    if (events_glm_string_arg(ev, ev->name.p, k, kn) || !tn || !jsonfmt_write(&ev->args, tv, tn, JSONFMT_COMPACT, 0))
        jsonfmt_write_string(&ev->args, v, vn);
    if (!ev->committed) {
        ev->committed = true;
        events_clear(&ev->cname);
        bytebuf_append(&ev->cname, ev->name.p, ev->name.len);
        events_clear(&ev->sent);
        events_new_id(ev);
        events_emit(ev, EVENTS_TOOL_START, NULL, 0);
    }
    events_send_args(ev, ev->args.p + ev->sent.len, ev->args.len - ev->sent.len);
    return true;
}

static void events_glm_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    const events_markers *m = &ev->m;
    bool marker = tok >= 0 && (tok == m->arg_key || tok == m->arg_key_end || tok == m->arg_val ||
                               tok == m->arg_val_end || tok == m->tool_end || tok == m->tool_start);
    bytebuf_append(&ev->raw, text, len);
    if (marker && tok == m->tool_end) {
        events_close_call(ev);
        return;
    }
    bool bad = false;
    switch (ev->st) {
    case EVENTS_ST_GLM_NAME:
        if (!marker) bytebuf_append(&ev->name, text, len);
        else if (tok == m->arg_key && events_call_name(ev)) {
            events_clear(&ev->args);
            events_clear(&ev->head);
            ev->st = EVENTS_ST_GLM_KEY;
        } else bad = true;
        break;
    case EVENTS_ST_GLM_KEY:
        if (!marker) bytebuf_append(&ev->head, text, len);
        else if (tok == m->arg_key_end) ev->st = EVENTS_ST_GLM_GAP;
        else bad = true;
        break;
    case EVENTS_ST_GLM_GAP:
    case EVENTS_ST_GLM_AFTER:
        if (!marker) {
            for (size_t i = 0; i < len; i++) bad = bad || !events_blank(text[i]);
        } else if (ev->st == EVENTS_ST_GLM_GAP && tok == m->arg_val) {
            events_clear(&ev->val);
            ev->st = EVENTS_ST_GLM_VAL;
        } else if (ev->st == EVENTS_ST_GLM_AFTER && tok == m->arg_key) {
            events_clear(&ev->head);
            ev->st = EVENTS_ST_GLM_KEY;
        } else bad = true;
        break;
    case EVENTS_ST_GLM_VAL:
        if (!marker) bytebuf_append(&ev->val, text, len);
        else if (tok == m->arg_val_end && events_glm_arg(ev)) ev->st = EVENTS_ST_GLM_AFTER;
        else bad = true;
        break;
    default:
        break;
    }
    if (bad) events_close_call(ev);  /* a state that cannot end a call: malformed */
}

/* ---- dsml ----
 * The block is kept in body with the ｜DSML｜ token as byte 0x01 (text holding that byte
 * makes the block malformed), so a tag spelled by ordinary tokens never matches; raw keeps the
 * text for the malformed rule. dsml_at: how far body was read. */

#define EVENTS_DSML_MAX_NAME 256  /* bytes: a longer tool or argument name is not one */

static void events_dsml_end(events *ev);

/* Matches one of the literals z[0..nz) at s[*i..n) after blanks: its index (*i past it), -1
 * the text ends inside one of them, -2 none can stand there. */
static int events_dsml_alt(const char *s, size_t n, size_t *i, const char *const *z, int nz)
{
    int r = -2;
    for (int k = 0; k < nz; k++) {
        size_t j = *i;
        int m = events_match(s, n, &j, z[k]);
        if (m > 0) {
            *i = j;
            return k;
        }
        if (m == 0) r = -1;
    }
    return r;
}

/* A name="..." value at s[*i..n) up to its closing quote: 1 (*i past the quote, [*at, *at +
 * *nl) the name), 0 not complete yet, -1 too long or empty. */
static int events_dsml_name(const char *s, size_t n, size_t *i, size_t *at, size_t *nl)
{
    const char *q = memchr(s + *i, '"', n - *i);
    if (!q) return n - *i > EVENTS_DSML_MAX_NAME ? -1 : 0;
    *at = *i;
    *nl = (size_t)(q - (s + *i));
    if (!*nl || *nl > EVENTS_DSML_MAX_NAME) return -1;
    *i = (size_t)(q - s) + 1;
    return 1;
}

/* One <parameter> read whole: its key and value join ev->args and are sent. A string="true"
 * value is a JSON string of its raw text; another is the JSON value it spells (trimmed),
 * else a string of its raw text. */
static void events_dsml_arg(events *ev, const char *k, size_t kn, bool str, const char *v, size_t vn)
{
    size_t at = ev->args.len;
    bytebuf_putc(&ev->args, at ? ',' : '{');
    jsonfmt_write_string(&ev->args, k, kn);
    bytebuf_putc(&ev->args, ':');
    const char *tv = v;
    size_t tn = vn;
    events_trim(&tv, &tn);
    if (str || !tn || !jsonfmt_write(&ev->args, tv, tn, JSONFMT_COMPACT, 0)) jsonfmt_write_string(&ev->args, v, vn);
    events_send_args(ev, ev->args.p + ev->sent.len, ev->args.len - ev->sent.len);
}

/* Reads the block in body from dsml_at as far as it is complete; false when it cannot be a
 * DSML block. Calls stream as they are read: TOOL_START at an invoke's opening tag, each
 * parameter when its closing tag arrives, TOOL_END at the invoke's closing tag. */
static bool events_dsml_parse(events *ev)
{
    static const char *const open[] = { "<\x01tool_calls>", "<\x01" "function_calls>" };
    static const char *const block[] = { "</\x01tool_calls>", ("</\x01" "function_calls>"), "<\x01invoke name=\"" };
    static const char *const invoke[] = { "</\x01invoke>", "<\x01parameter name=\"" };
    static const char *const kind[] = { "true\">", "false\">" };
    for (;;) {
        const char *s = ev->body.p ? ev->body.p : "";
        size_t n = ev->body.len, i = ev->dsml_at;
        if (ev->dsml_lvl == 0) {
            int r = events_dsml_alt(s, n, &i, open, 2);
            if (r < 0) return r == -1;
            ev->dsml_lvl = 1;
        } else if (ev->dsml_lvl == 1) {
            int r = events_dsml_alt(s, n, &i, block, 3);
            if (r < 0) return r == -1;
            if (r < 2) {  /* the block ends: what follows in this piece is answer text */
                ev->dsml_lvl = 0;
                events_after_call(ev, EVENTS_ST_TEXT);
                if (n > i) events_section_text(ev, EVENTS_TEXT, s + i, n - i);
                return true;
            }
            size_t at, nl;
            int q = events_dsml_name(s, n, &i, &at, &nl);
            if (q <= 0) return q == 0;
            if (i >= n) return true;
            if (s[i] != '>') return false;
            i++;
            events_clear(&ev->cname);
            bytebuf_append(&ev->cname, s + at, nl);
            events_clear(&ev->args);
            events_clear(&ev->sent);
            ev->committed = true;
            ev->dsml_calls++;
            events_new_id(ev);
            events_emit(ev, EVENTS_TOOL_START, NULL, 0);
            ev->dsml_lvl = 2;
        } else {
            int r = events_dsml_alt(s, n, &i, invoke, 2);
            if (r < 0) return r == -1;
            if (r == 0) {
                bytebuf_puts(&ev->args, ev->args.len ? "}" : "{}");
                events_end_committed(ev, true);
                ev->dsml_lvl = 1;
            } else {
                size_t at, nl;
                int q = events_dsml_name(s, n, &i, &at, &nl);
                if (q <= 0) return q == 0;
                int m = events_match(s, n, &i, "string=\"");
                if (m <= 0) return m == 0;
                int sk = events_dsml_alt(s, n, &i, kind, 2);
                if (sk < 0) return sk == -1;
                const char *e = memmem(s + i, n - i, "</\x01parameter>", strlen("</\x01parameter>"));
                if (!e) return true;
                events_dsml_arg(ev, s + at, nl, sk == 0, s + i, (size_t)(e - (s + i)));
                i = (size_t)(e - s) + strlen("</\x01parameter>");
            }
        }
        ev->dsml_at = i;
    }
}

/* The block ends unfinished (malformed, or the output ended): a committed call is closed as
 * far as it was sent; a block that opened no call is answer text. */
static void events_dsml_end(events *ev)
{
    if (ev->committed) events_end_committed(ev, false);
    ev->st = EVENTS_ST_TEXT;
    ev->dsml_lvl = 0;
    if (!ev->dsml_calls) {
        ev->text_started = true;
        events_call_as_text(ev);
    }
    events_after_call(ev, EVENTS_ST_TEXT);
}

static void events_dsml_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    bytebuf_append(&ev->raw, text, len);
    if (tok >= 0 && tok == ev->m.tool_start) {
        bytebuf_putc(&ev->body, '\x01');
    } else if (memchr(text, '\x01', len)) {
        events_dsml_end(ev);
        return;
    } else {
        bytebuf_append(&ev->body, text, len);
    }
    if (!events_dsml_parse(ev)) events_dsml_end(ev);
}

/* DSML, in answer text or reasoning: a '<' held back by events_dsml_section meets the next
 * token. The ｜DSML｜ token opens a block (reasoning ends there, as the reference parser's
 * does); anything else sends the '<' on. True when the token was taken. */
static bool events_dsml_lt(events *ev, int32_t tok, const char *text, size_t len)
{
    ev->dsml_lt = false;
    if (tok >= 0 && tok == ev->m.tool_start) {
        events_begin_call(ev, EVENTS_ST_DSML, "<", 1);
        ev->dsml_lvl = 0;
        ev->dsml_at = 0;
        ev->dsml_calls = 0;
        bytebuf_append(&ev->raw, text, len);
        bytebuf_puts(&ev->body, "<\x01");
        if (!events_dsml_parse(ev)) events_dsml_end(ev);
        return true;
    }
    events_section_text(ev, ev->st == EVENTS_ST_REASONING ? EVENTS_REASONING : EVENTS_TEXT, "<", 1);
    return false;
}

/* events_section_text, except that with DSML calls possible a final '<' waits for the next
 * token. */
static void events_dsml_section(events *ev, events_kind kind, const char *s, size_t n)
{
    if (ev->m.toolfmt == EVENTS_TOOLFMT_DSML && ev->m.tools_enabled && n && s[n - 1] == '<') {
        events_section_text(ev, kind, s, n - 1);
        ev->dsml_lt = true;
        return;
    }
    events_section_text(ev, kind, s, n);
}

/* ---- xml ----
 * The call's text after <tool_call> is kept in body and read from xml_at as it grows; the
 * tags are text, so they are matched on the text (blanks between tags skipped). */

/* A tag name up to its '>' at s[*i..n): 1 (*i past the '>', [*at, *at + *nl) the name), 0 not
 * complete yet, -1 empty, too long or not one line. */
static int events_xml_name(const char *s, size_t n, size_t *i, size_t *at, size_t *nl)
{
    const char *gt = memchr(s + *i, '>', n - *i);
    if (!gt) return n - *i > EVENTS_DSML_MAX_NAME || memchr(s + *i, '\n', n - *i) ? -1 : 0;
    *at = *i;
    *nl = (size_t)(gt - (s + *i));
    if (!*nl || *nl > EVENTS_DSML_MAX_NAME || memchr(s + *i, '\n', *nl)) return -1;
    *i = (size_t)(gt - s) + 1;
    return 1;
}

/* Reads the call in body from xml_at as far as it is complete; false when it cannot be one.
 * TOOL_START at <function=N>, each parameter sent at its </parameter>. */
static bool events_xml_parse(events *ev)
{
    static const char *const inside[] = { "</function>", "<parameter=" };
    for (;;) {
        const char *s = ev->body.p ? ev->body.p : "";
        size_t n = ev->body.len, i = ev->xml_at, at, nl;
        if (ev->xml_lvl == 0) {
            int r = events_match(s, n, &i, "<function=");
            if (r <= 0) return r == 0;
            int q = events_xml_name(s, n, &i, &at, &nl);
            if (q <= 0) return q == 0;
            events_clear(&ev->cname);
            bytebuf_append(&ev->cname, s + at, nl);
            events_clear(&ev->args);
            events_clear(&ev->sent);
            ev->committed = true;
            events_new_id(ev);
            events_emit(ev, EVENTS_TOOL_START, NULL, 0);
            ev->xml_lvl = 1;
        } else if (ev->xml_lvl == 1) {
            int r = events_dsml_alt(s, n, &i, inside, 2);
            if (r < 0) return r == -1;
            if (r == 0) {
                bytebuf_puts(&ev->args, ev->args.len ? "}" : "{}");
                ev->xml_lvl = 2;
            } else {
                int q = events_xml_name(s, n, &i, &at, &nl);
                if (q <= 0) return q == 0;
                const char *e = memmem(s + i, n - i, "</parameter>", strlen("</parameter>"));
                if (!e) return true;
                const char *v = s + i;
                size_t vn = (size_t)(e - v);
                /* the newlines framing the value are the format's */
                if (vn && v[0] == '\n') { v++; vn--; }
                if (vn && v[vn - 1] == '\n') vn--;
                bool str = events_glm_string_arg(ev, ev->cname.p, s + at, nl);
                events_dsml_arg(ev, s + at, nl, str, v, vn);
                i = (size_t)(e - s) + strlen("</parameter>");
            }
        } else if (ev->xml_lvl == 2) {  /* after </function>: blanks until </tool_call> */
            while (i < n && events_blank(s[i])) i++;
            return i == n;
        } else {
            return true;  /* it went bad (lvl 3, 4): read on to </tool_call> */
        }
        ev->xml_at = i;
    }
}

/* The call ends: at </tool_call>, at finish, or malformed. A committed call is closed as far
 * as it was sent (whole when </function> was read); one that never opened is answer text. */
static void events_xml_end(events *ev)
{
    ev->st = EVENTS_ST_TEXT;
    if (ev->committed) {
        events_end_committed(ev, ev->xml_lvl == 2);
    } else if (ev->xml_lvl != 3) {
        ev->text_started = true; /* keep the raw text's own blanks */
        events_call_as_text(ev);
    }
    events_after_call(ev, EVENTS_ST_TEXT);
}

static void events_xml_begin(events *ev, const char *text, size_t len)
{
    events_begin_call(ev, EVENTS_ST_XML, text, len);
    ev->xml_lvl = 0;
    ev->xml_at = 0;
}

static void events_xml_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    bytebuf_append(&ev->raw, text, len);
    if (tok >= 0 && tok == ev->m.tool_end) {
        events_xml_end(ev);
        return;
    }
    if (tok >= 0 && tok == ev->m.tool_start) {  /* a call left open: the next one begins */
        ev->raw.len -= len;
        events_xml_end(ev);
        events_xml_begin(ev, text, len);
        return;
    }
    bytebuf_append(&ev->body, text, len);
    if (events_xml_parse(ev)) return;
    /* malformed: a sent call is closed as far as it was sent, one not sent becomes text; either
       way the block is read on to </tool_call> (or the end) */
    ev->xml_lvl = ev->committed ? 3 : 4;
    if (ev->committed) events_end_committed(ev, false);
}

/* MISTRAL, the older form: body holds the text after [TOOL_CALLS]. When it is a complete JSON
 * array of calls (or one call object), they are sent; at_end: the output ended (or another
 * [TOOL_CALLS] came), so what is not such a value is text. Text after the value is answer
 * text. */
static void events_mi_json(events *ev, bool at_end)
{
    const char *s = ev->body.p ? ev->body.p : "";
    size_t n = ev->body.len, used = 0;
    events_clear(&ev->tmp);
    jsonfmt_prefix_status st = jsonfmt_prefix(&ev->tmp, s, n, &used);
    if (st == JSONFMT_PREFIX_MORE && !at_end) return;
    bool ok = st == JSONFMT_PREFIX_DONE;
    const char *v = s;
    size_t vn = used;
    events_trim(&v, &vn);
    if (ok && v[0] == '[') {
        size_t pos = 0, k = 0;
        const char *e;
        size_t en;
        while (ok && jsonfmt_next(v, vn, &pos, NULL, &e, &en)) {
            ok = events_parse_json_call(ev, e, en);
            k++;
        }
        ok = ok && k > 0;
    } else if (ok) {
        ok = events_parse_json_call(ev, v, vn);
    }
    ev->st = EVENTS_ST_TEXT;
    if (!ok) {
        ev->text_started = true;
        events_call_as_text(ev);
        events_after_call(ev, EVENTS_ST_TEXT);
        return;
    }
    if (v[0] == '[') {
        size_t pos = 0;
        const char *e;
        size_t en;
        while (jsonfmt_next(v, vn, &pos, NULL, &e, &en)) {
            events_parse_json_call(ev, e, en);
            events_send_call(ev);
        }
    } else {
        events_send_call(ev);
    }
    events_after_call(ev, EVENTS_ST_TEXT);
    /* text after the calls: copied out, body is reused */
    if (used < n) {
        events_clear(&ev->tmp);
        bytebuf_append(&ev->tmp, s + used, n - used);
        events_section_text(ev, EVENTS_TEXT, ev->tmp.p, ev->tmp.len);
    }
}

/* MISTRAL [ARGS]: after the body grew, stream it; once the arguments' value is complete the
 * call ends and what follows it in the body is answer text. */
static void events_close_call(events *ev);
static void events_mi_args(events *ev)
{
    events_stream_args(ev);
    size_t used = 0;
    events_clear(&ev->tmp);
    if (jsonfmt_prefix(&ev->tmp, ev->body.p ? ev->body.p : "", ev->body.len, &used) != JSONFMT_PREFIX_DONE) return;
    events_clear(&ev->val);  /* scratch here (val is GLM's) */
    bytebuf_append(&ev->val, ev->body.p + used, ev->body.len - used);
    ev->body.len = used;
    events_close_call(ev);
    if (ev->val.len) events_section_text(ev, EVENTS_TEXT, ev->val.p, ev->val.len);
}

static void events_mi_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    const events_markers *m = &ev->m;
    if (tok >= 0 && tok == m->tool_start) {  /* the next call: this one ends */
        events_close_call(ev);
        events_begin_call(ev, EVENTS_ST_MI_NAME, text, len);
        return;
    }
    bytebuf_append(&ev->raw, text, len);
    switch (ev->st) {
    case EVENTS_ST_MI_NAME:
        if (tok >= 0 && (tok == m->tool_sep || tok == m->call_id)) {
            if (!events_call_name(ev)) {
                events_close_call(ev);
                return;
            }
            ev->st = tok == m->tool_sep ? EVENTS_ST_MI_ARGS : EVENTS_ST_MI_ID;
            return;
        }
        bytebuf_append(&ev->name, text, len);
        {
            size_t i = 0;
            while (i < ev->name.len && events_blank(ev->name.p[i])) i++;
            if (i < ev->name.len && (ev->name.p[i] == '[' || ev->name.p[i] == '{')) {
                /* the older form: the name part is JSON */
                events_clear(&ev->body);
                bytebuf_append(&ev->body, ev->name.p, ev->name.len);
                events_clear(&ev->name);
                ev->st = EVENTS_ST_MI_JSON;
                events_mi_json(ev, false);
            }
        }
        return;
    case EVENTS_ST_MI_ID:
        if (tok >= 0 && tok == m->tool_sep) ev->st = EVENTS_ST_MI_ARGS;
        return;
    case EVENTS_ST_MI_ARGS:
        bytebuf_append(&ev->body, text, len);
        events_mi_args(ev);
        return;
    case EVENTS_ST_MI_JSON:
        bytebuf_append(&ev->body, text, len);
        events_mi_json(ev, false);
        return;
    default:
        return;
    }
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
    case EVENTS_ST_H_CALL:
        ok = ev->name.len > 0 && events_norm_args(ev, ev->body.p ? ev->body.p : "", ev->body.len);
        next = EVENTS_ST_H_AFTER;
        break;
    case EVENTS_ST_MI_NAME:
    case EVENTS_ST_MI_ID:
        ok = false;
        break;
    case EVENTS_ST_MI_ARGS:
        ok = ev->name.len > 0 && events_norm_args(ev, ev->body.p ? ev->body.p : "", ev->body.len);
        break;
    case EVENTS_ST_MI_JSON:
        events_mi_json(ev, true);
        return;
    case EVENTS_ST_GLM_NAME:
    case EVENTS_ST_GLM_AFTER:
        ok = events_call_name(ev);
        if (ok) {
            if (ev->args.len == 0) bytebuf_putc(&ev->args, '{');
            bytebuf_putc(&ev->args, '}');
        }
        break;
    case EVENTS_ST_GLM_KEY:
    case EVENTS_ST_GLM_GAP:
    case EVENTS_ST_GLM_VAL:
        ok = false;
        break;
    case EVENTS_ST_DSML:
        events_dsml_end(ev);
        return;
    case EVENTS_ST_XML:
        events_xml_end(ev);
        return;
    default:
        return;
    }
    ev->st = EVENTS_ST_TEXT;
    if (ev->committed) {
        events_end_committed(ev, ok);
    } else if (ok) {
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
    bool ok = events_parse_json_call(ev, s, n);
    if (ev->committed) {
        ev->st = EVENTS_ST_TEXT;
        events_end_committed(ev, ok);
        events_after_call(ev, EVENTS_ST_TEXT);
    } else if (ok) {
        events_send_call(ev);
        events_after_call(ev, EVENTS_ST_TEXT);
    } else {
        ev->st = EVENTS_ST_TEXT;
        events_call_as_text(ev);
    }
}

/* ---- harmony ---- */

#define EVENTS_H_MAX_HEAD 256  /* bytes: a header longer than this is not one */

static void events_h_begin(events *ev)
{
    ev->st = EVENTS_ST_H_HEAD;
    ev->h_channel = false;
    events_clear(&ev->head);
    events_clear(&ev->raw);
}

/* A header that is not one: its raw text (markers included) becomes answer text, and so
 * does what follows until the next message; in a first message that the server ends
 * (m.h_analysis), reasoning instead: the analysis the model began without its header. */
static void events_h_bad_head(events *ev, events_state next)
{
    if (ev->h_first) {
        ev->st = EVENTS_ST_REASONING;
        ev->reason_started = true;
        events_section_text(ev, EVENTS_REASONING, ev->raw.p ? ev->raw.p : "", ev->raw.len);
        events_clear(&ev->raw);
        ev->st = next == EVENTS_ST_TEXT ? EVENTS_ST_REASONING : next;
        return;
    }
    ev->st = EVENTS_ST_TEXT;
    ev->text_started = true;
    events_call_as_text(ev);
    events_clear(&ev->raw);
    ev->st = next;
}

/* The word of s[0..n) that starts at i (ends at a blank or a marker stand-in). */
static size_t events_h_word(const char *s, size_t n, size_t i)
{
    size_t j = i;
    while (j < n && !events_blank(s[j]) && s[j] != '\x01' && s[j] != '\x02') j++;
    return j - i;
}

/* <|message|> ended the header: decide what the body is. */
static void events_h_open(events *ev)
{
    const char *s = ev->head.p ? ev->head.p : "";
    size_t n = ev->head.len;
    /* the recipient: the first "to=" word that is not "assistant" (gpt-oss sometimes writes a
       stray "<|channel|>commentary to=assistant" before its real channel) */
    const char *to = NULL;
    for (size_t i = 0; !to && i + 3 <= n; i++)
        if (!memcmp(s + i, "to=", 3) && (i == 0 || events_blank(s[i - 1]) || s[i - 1] == '\x01')) {
            size_t wn = events_h_word(s, n, i + 3);
            if (!(wn == 9 && !memcmp(s + i + 3, "assistant", 9))) to = s + i + 3;
        }
    /* the channel: the word after the last <|channel|> */
    const char *ch = memrchr(s, '\x01', n);
    size_t chn = 0;
    if (ch) {
        size_t i = (size_t)(ch + 1 - s);
        while (i < n && events_blank(s[i])) i++;
        ch = s + i;
        chn = events_h_word(s, n, i);
    }
    ev->h_first = false;
    if (to && ev->m.tools_enabled) {
        size_t tn = events_h_word(s, n, (size_t)(to - s));
        if (tn > 10 && !memcmp(to, "functions.", 10)) {
            to += 10;
            tn -= 10;
        }
        events_clear(&ev->name);
        bytebuf_append(&ev->name, to, tn);
        events_clear(&ev->body);
        ev->committed = ev->no_stream = ev->args_over = false;
        ev->st = EVENTS_ST_H_CALL;
        return;  /* raw keeps the message's text for the malformed rule */
    }
    events_clear(&ev->raw);
    if (chn == 8 && !memcmp(ch, "analysis", 8)) {
        ev->st = EVENTS_ST_REASONING;
        ev->reason_started = false;
    } else {
        ev->st = EVENTS_ST_TEXT;
    }
}

static void events_h_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    const events_markers *m = &ev->m;
    bool marker = tok >= 0 && (tok == m->h_start || tok == m->h_channel || tok == m->h_message ||
                               tok == m->h_constrain || tok == m->h_end || tok == m->h_call || tok == m->h_return);
    bool ends = marker && (tok == m->h_end || tok == m->h_call || tok == m->h_return);
    switch (ev->st) {
    case EVENTS_ST_H_HEAD:
        if (!ends) bytebuf_append(&ev->raw, text, len);
        if (!marker) {
            bytebuf_append(&ev->head, text, len);
            if (ev->head.len > EVENTS_H_MAX_HEAD) events_h_bad_head(ev, EVENTS_ST_TEXT);
        } else if (tok == m->h_message) {
            events_h_open(ev);
        } else if (tok == m->h_channel) {
            bytebuf_putc(&ev->head, '\x01');
            ev->h_channel = true;
        } else if (tok == m->h_constrain) {
            bytebuf_putc(&ev->head, '\x02');
        } else if (tok == m->h_start) {
            events_h_begin(ev);  /* the header starts again */
        } else {
            if (tok != m->h_end) ev->h_first = false;  /* <|call|> / <|return|>: not the server's end */
            events_h_bad_head(ev, EVENTS_ST_H_AFTER);  /* the message ended inside its header */
            ev->h_first = false;
        }
        return;
    case EVENTS_ST_TEXT:
    case EVENTS_ST_REASONING:
    case EVENTS_ST_H_AFTER:
        if (ends) {
            events_section_end(ev);
            ev->st = EVENTS_ST_H_AFTER;
            ev->text_started = false;
            ev->h_first = false;
        } else if (marker && (tok == m->h_start || tok == m->h_channel)) {
            /* a new message (<|end|> left out, or <|start|>assistant left out) */
            events_section_end(ev);
            events_h_begin(ev);
            bytebuf_append(&ev->raw, text, len);
            if (tok == m->h_channel) {
                bytebuf_putc(&ev->head, '\x01');
                ev->h_channel = true;
            }
        } else if (!marker) {
            events_section_text(ev, ev->st == EVENTS_ST_REASONING ? EVENTS_REASONING : EVENTS_TEXT, text, len);
        }
        return;
    case EVENTS_ST_H_CALL:
        if (ends || (marker && tok == m->h_start)) {  /* the end marker is not part of the text */
            events_close_call(ev);
            if (tok == m->h_start) events_h_begin(ev);
            return;
        }
        bytebuf_append(&ev->raw, text, len);
        if (marker) return;  /* <|channel|>, <|constrain|>, <|message|> inside a body are not arguments */
        bytebuf_append(&ev->body, text, len);
        events_stream_args(ev);
        return;
    default:
        return;
    }
}

/* A token in the answer text: a marker opening reasoning or a call of the family's format, or
 * text (DSML's held-back '<' included). */
static void events_text_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    const events_markers *m = &ev->m;
    if (tok == m->think_start && tok >= 0) {
        events_section_end(ev);
        ev->st = EVENTS_ST_REASONING;
        ev->reason_started = false;
        return;
    }
    if (tok == m->think_end && tok >= 0) return; /* stray: the marker carries no text */
    if (m->toolfmt == EVENTS_TOOLFMT_QWEN && m->tools_enabled && tok == m->tool_start && tok >= 0) {
        events_begin_call(ev, EVENTS_ST_QWEN_CALL, text, len);
        return;
    }
    if (m->toolfmt == EVENTS_TOOLFMT_MISTRAL && m->tools_enabled && tok >= 0 && tok == m->tool_start) {
        events_begin_call(ev, EVENTS_ST_MI_NAME, text, len);
        return;
    }
    if (m->toolfmt == EVENTS_TOOLFMT_GLM && m->tools_enabled && tok >= 0 && tok == m->tool_start) {
        events_begin_call(ev, EVENTS_ST_GLM_NAME, text, len);
        return;
    }
    if (m->toolfmt == EVENTS_TOOLFMT_XML && m->tools_enabled && tok >= 0 && tok == m->tool_start) {
        events_xml_begin(ev, text, len);
        return;
    }
    if (m->toolfmt == EVENTS_TOOLFMT_DEEPSEEK && m->tools_enabled && tok >= 0 && tok == m->tools_begin) {
        events_begin_call(ev, EVENTS_ST_DS_CALLS, text, len);
        ev->ds_block = true;
        return;
    }
    if (m->toolfmt == EVENTS_TOOLFMT_DEEPSEEK && m->tools_enabled && tok >= 0 && tok == m->tool_start) {
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
            bytebuf_append(&ev->body, text + i, len - i);
            events_stream_args(ev);
            events_llama_check(ev);
            return;
        }
    }
    events_dsml_section(ev, EVENTS_TEXT, text, len);
}

void events_feed(events *ev, int32_t tok, const char *text, size_t len)
{
    const events_markers *m = &ev->m;
    if (!text) len = 0;
    if (!text) text = "";
    if (m->toolfmt == EVENTS_TOOLFMT_HARMONY && ev->st != EVENTS_ST_DONE) {
        events_h_feed(ev, tok, text, len);
        return;
    }
    if (ev->dsml_lt && events_dsml_lt(ev, tok, text, len)) return;
    switch (ev->st) {
    case EVENTS_ST_DONE:
        return;
    case EVENTS_ST_TEXT:
        events_text_feed(ev, tok, text, len);
        return;
    case EVENTS_ST_REASONING:
        if (tok == m->think_end && tok >= 0) {
            events_section_end(ev);
            ev->st = EVENTS_ST_TEXT;
            ev->text_started = false;
            return;
        }
        if (tok == m->think_start && tok >= 0) return;
        if (m->toolfmt == EVENTS_TOOLFMT_XML && m->tools_enabled && tok >= 0 && tok == m->tool_start) {
            events_xml_begin(ev, text, len);  /* a call ends the reasoning, as the reference parser's does */
            return;
        }
        events_dsml_section(ev, EVENTS_REASONING, text, len);
        return;
    case EVENTS_ST_QWEN_CALL:
        bytebuf_append(&ev->raw, text, len);
        if (tok == m->tool_end && tok >= 0) {
            events_close_call(ev);
            return;
        }
        bytebuf_append(&ev->body, text, len);
        events_stream_args(ev);
        return;
    case EVENTS_ST_LLAMA_JSON:
        bytebuf_append(&ev->raw, text, len);
        bytebuf_append(&ev->body, text, len);
        events_stream_args(ev);
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
        bytebuf_append(&ev->raw, text, len);
        if (tok >= 0 && tok == m->tool_sep) {
            ev->st = EVENTS_ST_DS_ARGS;
            return;
        }
        if (tok >= 0 && tok == m->tool_end) {
            events_close_call(ev);
            return;
        }
        bytebuf_append(&ev->name, text, len);
        return;
    case EVENTS_ST_DS_ARGS:
        bytebuf_append(&ev->raw, text, len);
        if (tok >= 0 && tok == m->tool_end) {
            events_close_call(ev);
            return;
        }
        bytebuf_append(&ev->body, text, len);
        events_stream_args(ev);
        return;
    case EVENTS_ST_MI_NAME:
    case EVENTS_ST_MI_ID:
    case EVENTS_ST_MI_ARGS:
    case EVENTS_ST_MI_JSON:
        events_mi_feed(ev, tok, text, len);
        return;
    case EVENTS_ST_GLM_NAME:
    case EVENTS_ST_GLM_KEY:
    case EVENTS_ST_GLM_GAP:
    case EVENTS_ST_GLM_VAL:
    case EVENTS_ST_GLM_AFTER:
        events_glm_feed(ev, tok, text, len);
        return;
    case EVENTS_ST_DSML:
        events_dsml_feed(ev, tok, text, len);
        return;
    case EVENTS_ST_XML:
        events_xml_feed(ev, tok, text, len);
        return;
    case EVENTS_ST_H_HEAD:
    case EVENTS_ST_H_CALL:
    case EVENTS_ST_H_AFTER:
        return;  /* harmony states are fed by events_h_feed */
    }
}

void events_finish(events *ev, events_finish_reason reason)
{
    if (ev->st == EVENTS_ST_DONE) return;
    if (ev->dsml_lt) events_dsml_lt(ev, -1, "", 0);
    if (ev->st == EVENTS_ST_LLAMA_JSON) {
        const char *s = ev->body.p ? ev->body.p : "";
        size_t n = ev->body.len;
        events_trim(&s, &n);
        bool ok = n && jsonfmt_valid(s, n) && events_parse_json_call(ev, s, n);
        if (ev->committed) {
            events_end_committed(ev, ok);
        } else if (ok) {
            events_send_call(ev);
        } else {
            ev->text_started = true;
            events_call_as_text(ev);
        }
    } else if (ev->st == EVENTS_ST_H_HEAD) {
        /* cut inside a header: a real one (it has its channel) is dropped, other text kept */
        if (!ev->h_channel) events_h_bad_head(ev, EVENTS_ST_H_AFTER);
    } else {
        events_close_call(ev);
    }
    events_section_end(ev);
    ev->st = EVENTS_ST_DONE;
    if (reason == EVENTS_FINISH_STOP && ev->n_calls > 0) reason = EVENTS_FINISH_TOOL_CALLS;
    events_event e = { .kind = EVENTS_FINISH, .tool_index = -1, .tool_id = "", .tool_name = "", .finish = reason };
    ev->cb(ev->ud, &e);
}
