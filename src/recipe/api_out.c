/*
 * api_out: writing answers. The output state machine (api_out), the stop-sequence matcher,
 * the JSON/SSE write helpers the formatters share.
 *
 * api_out: per choice, tokens go to the output splitter (events.c); its events become items
 * (a run of text, a run of reasoning, a tool call). Answer text passes the stop matcher
 * first. Items are opened, grown and closed in output order, and each step is passed to the
 * route's formatter (its api_format's on), which appends SSE events when streaming; the items are kept
 * for the final body (and the Responses store, api_responses.c). Every string goes through jsonfmt's writer,
 * so the output is valid UTF-8 whatever the model wrote.
 *
 * Stop matching: the matcher holds back the longest suffix of the text seen that is a proper
 * prefix of some stop sequence; everything before it is released. On a match the text before
 * the match is released and the rest dropped.
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/util.h"

/* ------------------------------------------------------------------ helpers */

void api_buf_str(bytebuf *b, const char *s)
{
    if (!s) bytebuf_puts(b, "null");
    else jsonfmt_write_string(b, s, strlen(s));
}

void api_buf_strn(bytebuf *b, const char *s, size_t len) { jsonfmt_write_string(b, s ? s : "", s ? len : 0); }

void api_sse(bytebuf *b, const char *name, const char *json, size_t len)
{
    if (name) {
        bytebuf_puts(b, "event: ");
        bytebuf_puts(b, name);
        bytebuf_putc(b, '\n');
    }
    bytebuf_puts(b, "data: ");
    bytebuf_append(b, json, len);
    bytebuf_puts(b, "\n\n");
}

void api_sse_done(bytebuf *b) { bytebuf_puts(b, "data: [DONE]\n\n"); }

void api_sse_typed(bytebuf *b, const char *type, int seq, const char *fields, size_t flen)
{
    bytebuf d = {0};
    bytebuf_puts(&d, "{\"type\":");
    api_buf_str(&d, type);
    if (seq >= 0) bytebuf_printf(&d, ",\"sequence_number\":%d", seq);
    if (flen) {
        bytebuf_putc(&d, ',');
        bytebuf_append(&d, fields, flen);
    }
    bytebuf_putc(&d, '}');
    api_sse(b, type, d.p, d.len);
    bytebuf_free(&d);
}

/* ------------------------------------------------------------------ stop matcher */

bool api_stop_find(const char *const *stops, int n_stops, const char *text, size_t len, size_t from,
                   size_t *cut, size_t *safe)
{
    bool found = false;
    size_t best = len;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (sl == 0 || sl > len) continue;
        for (size_t p = from; p + sl <= len && p < best; p++)
            if (!memcmp(text + p, stops[i], sl)) {
                best = p;
                found = true;
                break;
            }
    }
    if (found) {
        *cut = best;
        return true;
    }
    size_t hold = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= len && !memcmp(text + len - k, stops[i], k)) {
                hold = k;
                break;
            }
    }
    *safe = len - hold;
    return false;
}


void api_stop_init(api_stop *s, char *const *stop, int n_stop)
{
    memset(s, 0, sizeof *s);
    s->stop = stop;
    s->n_stop = n_stop;
    s->matched = -1;
}

void api_stop_free(api_stop *s) { bytebuf_free(&s->hold); }

bool api_stop_feed(api_stop *s, const char *text, size_t len, bytebuf *emit)
{
    if (s->matched >= 0) return true;
    if (s->n_stop == 0) {
        bytebuf_append(emit, text, len);
        return false;
    }
    bytebuf_append(&s->hold, text, len);
    size_t cut = 0, safe = 0;
    if (api_stop_find((const char *const *)s->stop, s->n_stop, s->hold.p, s->hold.len, 0, &cut, &safe)) {
        bytebuf_append(emit, s->hold.p, cut);
        /* which sequence: the first listed that starts at cut */
        for (int i = 0; i < s->n_stop; i++)
            if (!strncmp(s->hold.p + cut, s->stop[i], strlen(s->stop[i]))) {
                s->matched = i;
                break;
            }
        if (s->matched < 0) s->matched = 0;
        s->hold.len = 0;
        return true;
    }
    /* The held tail starts where a stop sequence (valid UTF-8) would, so the released text
     * ends on a character boundary. */
    bytebuf_append(emit, s->hold.p, safe);
    memmove(s->hold.p, s->hold.p + safe, s->hold.len - safe);
    s->hold.len -= safe;
    return false;
}

void api_stop_flush(api_stop *s, bytebuf *emit)
{
    if (s->matched < 0 && s->hold.len) bytebuf_append(emit, s->hold.p, s->hold.len);
    s->hold.len = 0;
}

/* ------------------------------------------------------------------ output */

static void api_close_item(api_out *o, api_choice *c)
{
    if (!c->open) return;
    c->open = false;
    if (c->ending_cut) c->items[c->n_items - 1].cut = true;
    o->fmt->on(o, c->index, API_OP_CLOSE, &c->items[c->n_items - 1], NULL, 0);
}

static api_item *api_open_item(api_out *o, api_choice *c, api_item_kind kind)
{
    api_close_item(o, c);
    if (c->n_items == c->cap_items) {
        c->cap_items = c->cap_items ? 2 * c->cap_items : 4;
        c->items = xrealloc(c->items, (size_t)c->cap_items * sizeof *c->items);
    }
    api_item *it = &c->items[c->n_items++];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    c->open = true;
    return it;
}

/* Appends text of a kind to the open item of that kind (opening one if needed). */
static void api_add_text(api_out *o, api_choice *c, api_item_kind kind, const char *d, size_t len)
{
    if (len == 0) return;
    api_item *it = (c->open && c->items[c->n_items - 1].kind == kind) ? &c->items[c->n_items - 1] : NULL;
    if (!it) {
        it = api_open_item(o, c, kind);
        o->fmt->on(o, c->index, API_OP_OPEN, it, NULL, 0);
    }
    bytebuf_append(&it->text, d, len);
    o->fmt->on(o, c->index, API_OP_DELTA, it, d, len);
}

static void api_on_event(void *ud, const events_event *e)
{
    api_choice *c = ud;
    api_out *o = c->owner;
    if (c->finished) return;
    if (c->stopped && e->kind != EVENTS_FINISH) return;
    switch (e->kind) {
    case EVENTS_TEXT:
        c->emit.len = 0;
        if (api_stop_feed(&c->stop, e->text, e->len, &c->emit)) {
            c->stopped = true;
            c->stop_index = c->stop.matched;
        }
        api_add_text(o, c, API_ITEM_TEXT, c->emit.p, c->emit.len);
        break;
    case EVENTS_REASONING:
        api_add_text(o, c, API_ITEM_REASONING, e->text, e->len);
        break;
    case EVENTS_TOOL_START: {
        /* Text held by the stop matcher belongs before the call. */
        c->emit.len = 0;
        api_stop_flush(&c->stop, &c->emit);
        api_add_text(o, c, API_ITEM_TEXT, c->emit.p, c->emit.len);
        api_item *it = api_open_item(o, c, API_ITEM_TOOL);
        snprintf(it->call_id, sizeof it->call_id, "%s", e->tool_id);
        it->name = xstrdup(e->tool_name ? e->tool_name : "");
        it->tool_index = c->n_calls++;
        o->fmt->on(o, c->index, API_OP_OPEN, it, NULL, 0);
        break;
    }
    case EVENTS_TOOL_ARGS: {
        if (!c->open || c->items[c->n_items - 1].kind != API_ITEM_TOOL) break;
        api_item *it = &c->items[c->n_items - 1];
        bytebuf_append(&it->text, e->text, e->len);
        o->fmt->on(o, c->index, API_OP_DELTA, it, e->text, e->len);
        break;
    }
    case EVENTS_TOOL_END:
        if (c->open && c->items[c->n_items - 1].kind == API_ITEM_TOOL) {
            api_item *it = &c->items[c->n_items - 1];
            if (it->text.len == 0 && e->text) bytebuf_append(&it->text, e->text, e->len);
            if (it->text.len == 0) bytebuf_puts(&it->text, "{}");
            api_close_item(o, c);
        }
        break;
    case EVENTS_FINISH:
        if (!c->stopped) {
            c->emit.len = 0;
            api_stop_flush(&c->stop, &c->emit);
            api_add_text(o, c, API_ITEM_TEXT, c->emit.p, c->emit.len);
        }
        if (c->n_items == 0) {
            /* Always answer with at least an (empty) text item. */
            api_item *it = api_open_item(o, c, API_ITEM_TEXT);
            bytebuf_puts(&it->text, "");
            o->fmt->on(o, c->index, API_OP_OPEN, it, NULL, 0);
        }
        api_close_item(o, c);
        c->finished = true;
        c->finish = e->finish;
        if (c->stopped) c->finish = EVENTS_FINISH_STOP;
        o->fmt->on(o, c->index, API_OP_FINISH, NULL, NULL, 0);
        break;
    }
}

void api_out_init(api_out *o, const api_req *req, const events_markers *m, uint64_t seed, const char *model_name)
{
    memset(o, 0, sizeof *o);
    o->kind = req->kind;
    o->fmt = api_format_of(req->kind);
    o->req = req;
    o->model = model_name ? model_name : (req->model ? req->model : "");
    o->created = (int64_t)time(NULL);
    api_new_id(o->id, sizeof o->id, o->fmt->id_prefix);
    o->n_choices = req->n > 0 ? req->n : 1;
    o->choices = xcalloc((size_t)o->n_choices, sizeof *o->choices);
    for (int i = 0; i < o->n_choices; i++) {
        api_choice *c = &o->choices[i];
        c->owner = o;
        c->index = i;
        c->ev = events_new(m, seed + (uint64_t)i * 7919u, api_on_event, c);
        api_stop_init(&c->stop, req->stop, req->n_stop);
        c->stop_index = -1;
        c->think_start = m->think_start;
        c->think_end = m->think_end;
        c->in_think = m->starts_in_reasoning;
    }
}

void api_out_free(api_out *o)
{
    for (int i = 0; i < o->n_choices; i++) {
        api_choice *c = &o->choices[i];
        events_free(c->ev);
        api_stop_free(&c->stop);
        bytebuf_free(&c->emit);
        for (int k = 0; k < c->n_items; k++) {
            free(c->items[k].name);
            bytebuf_free(&c->items[k].text);
        }
        free(c->items);
        free(c->token_ids);
        free(c->lps);
    }
    free(o->choices);
    bytebuf_free(&o->out);
    memset(o, 0, sizeof *o);
}

void api_out_set_prompt(api_out *o, int prompt_tokens, int cached_tokens, const int32_t *ids, int n_ids)
{
    o->usage.prompt_tokens = prompt_tokens;
    o->usage.cached_tokens = cached_tokens;
    o->prompt_ids = ids;
    o->n_prompt_ids = n_ids;
}

void api_out_set_drafts(api_out *o, int i, int accepted, int rejected)
{
    if (i < 0 || i >= o->n_choices) return;
    o->choices[i].n_accepted_drafts = accepted;
    o->choices[i].n_rejected_drafts = rejected;
}

void api_out_begin(api_out *o)
{
    if (!o->req->stream) return;
    o->fmt->begin(o);
}

void api_out_text(api_out *o, int i, const char *text, size_t len)
{
    api_choice *c = &o->choices[i];
    if (c->finished || len == 0) return;
    c->n_fed += len;
    events_feed(c->ev, -1, text, len);
}

/* Is the next token reasoning? By the think markers; families without them (harmony's
 * analysis channel) by the splitter's state. */
static bool api_choice_reasoning(const api_choice *c)
{
    return c->in_think || (c->think_start < 0 && events_in_reasoning(c->ev));
}

void api_out_count_token(api_out *o, int i)
{
    api_choice *c = &o->choices[i];
    if (c->stopped) return;   /* after a stop sequence: see api_out_token */
    c->n_tokens++;
    if (api_choice_reasoning(c)) c->n_reasoning_tokens++;
}

bool api_out_token(api_out *o, int i, int32_t token, const char *text, size_t len, const api_logprob *lp)
{
    api_choice *c = &o->choices[i];
    /* Tokens after the one that completed a stop sequence are not part of the answer, and
     * how many arrive before the cancel takes effect depends on timing: usage counts none */
    if (c->finished || c->stopped) return true;
    c->n_tokens++;
    if (token == c->think_start && token >= 0) c->in_think = true;
    if (api_choice_reasoning(c)) c->n_reasoning_tokens++;
    if (token == c->think_end && token >= 0) c->in_think = false;
    if (o->req->return_token_ids) {
        if (c->n_token_ids == c->cap_token_ids) {
            c->cap_token_ids = c->cap_token_ids ? 2 * c->cap_token_ids : 64;
            c->token_ids = xrealloc(c->token_ids, (size_t)c->cap_token_ids * sizeof *c->token_ids);
        }
        c->token_ids[c->n_token_ids++] = token;
    }
    if (o->req->logprobs && lp && !c->stopped) {
        if (c->n_lps == c->cap_lps) {
            c->cap_lps = c->cap_lps ? 2 * c->cap_lps : 32;
            c->lps = xrealloc(c->lps, (size_t)c->cap_lps * sizeof *c->lps);
        }
        api_lp_entry *en = &c->lps[c->n_lps++];
        memset(en, 0, sizeof *en);
        size_t n = o->piece ? o->piece(o->piece_ud, lp->token, en->text, sizeof en->text) : 0;
        en->len = (uint8_t)TM_MIN(n, sizeof en->text);
        en->offset = c->n_fed;
        en->logprob = lp->logprob;
        en->n_top = TM_MIN(lp->n_top, o->req->top_logprobs);
        for (int k = 0; k < en->n_top; k++) {
            n = o->piece ? o->piece(o->piece_ud, lp->top_token[k], en->top_text[k], sizeof en->top_text[k]) : 0;
            en->top_len[k] = (uint8_t)TM_MIN(n, sizeof en->top_text[k]);
            en->top_logprob[k] = lp->top_logprob[k];
        }
    }
    c->n_fed += len;
    events_feed(c->ev, token, text, len);
    return c->stopped;
}

void api_out_finish(api_out *o, int i, events_finish_reason reason)
{
    api_choice *c = &o->choices[i];
    if (c->finished) return;
    /* the splitter closes what is open (a call cut inside its arguments) before FINISH */
    c->ending_cut = reason == EVENTS_FINISH_LENGTH && !c->stopped;
    events_finish(c->ev, c->stopped ? EVENTS_FINISH_STOP : reason);
}

bool api_out_truncated(const api_out *o)
{
    for (int i = 0; i < o->n_choices; i++)
        if (o->choices[i].finish == EVENTS_FINISH_LENGTH) return true;
    return false;
}

void api_out_end(api_out *o)
{
    o->usage.completion_tokens = 0;
    o->usage.reasoning_tokens = 0;
    o->usage.accepted_drafts = o->usage.rejected_drafts = 0;
    for (int i = 0; i < o->n_choices; i++) {
        o->usage.completion_tokens += o->choices[i].n_tokens;
        o->usage.reasoning_tokens += o->choices[i].n_reasoning_tokens;
        o->usage.accepted_drafts += o->choices[i].n_accepted_drafts;
        o->usage.rejected_drafts += o->choices[i].n_rejected_drafts;
    }
    o->fmt->end(o);
}
