/*
 * api_completions: OpenAI's raw-prompt POST /v1/completions.
 *
 * The request runs the same path as the chat APIs (api_serve): parse into an api_req, the
 * prompt as token ids, submit n choices (seeds seed, seed+1, ...), tokens through api_out
 * (detokenised with api_detok, stop strings held back and cut by the shared matcher). What
 * differs is only here: the prompt is not a conversation (a string is tokenised with the
 * model's BOS and no control-token matching; token ids go as they are), the output splitter
 * has no markers (raw text: no reasoning, no tool calls), the end-of-generation ids of the
 * vocabulary do not stop it beyond the model's own end token (so ignore_eos works), and the
 * answer's shape: "text_completion" objects whose log-probs are
 * {tokens, token_logprobs, top_logprobs, text_offset}.
 *
 * Streaming: one chunk per text delta of a choice (with its new log-prob entries), a last
 * chunk per choice with finish_reason, the usage chunk when stream_options.include_usage,
 * then "data: [DONE]".
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* ---- request parsing ---- */

static const char *const compl_known[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "logprobs",
    "echo", "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user", "suffix",
    "seed", "top_k", "min_p", "repeat_penalty", "repetition_penalty", "ignore_eos", "cache_salt", "cache_class",
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "json_schema", "grammar", NULL,
};

static const api_kind K = API_KIND_COMPLETIONS;

/* prompt: a string, a one-element array of strings, or an array of token ids. */
static bool compl_parse_prompt(const api_cfg *cfg, json_t *root, api_req *r, api_error *e)
{
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p)) {
        api_json_missing(K, e, "prompt");
        return false;
    }
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->prompt_len = json_string_length(p);
        r->prompt_text = xmalloc(r->prompt_len + 1);
        memcpy(r->prompt_text, json_string_value(p), r->prompt_len + 1);
        return true;
    }
    if (json_is_array(p) && json_array_size(p) > 1 && json_is_string(json_array_get(p, 0))) {
        api_json_value_error(K, e, "prompt", "only one prompt per request is supported.");
        return false;
    }
    if (!json_is_array(p) || json_array_size(p) == 0) {
        if (json_is_array(p)) api_json_value_error(K, e, "prompt", "the prompt is empty.");
        else api_json_type_error(K, e, "prompt", "a string or an array of token ids", p);
        return false;
    }
    size_t n = json_array_size(p);
    r->prompt_ids = xmalloc(n * sizeof *r->prompt_ids);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        long long id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id > INT32_MAX || (cfg && cfg->n_vocab > 0 && id >= cfg->n_vocab)) {
            char path[40];
            api_path(path, sizeof path, "prompt", NULL, (int)i);
            if (!json_is_integer(v)) api_json_type_error(K, e, path, "an integer (a token id)", v);
            else
                api_error_set(e, 400, "prompt", "invalid_value", "Invalid '%s': %lld is not a token id of this model "
                              "(0 to %d).", path, id, cfg && cfg->n_vocab > 0 ? cfg->n_vocab - 1 : INT32_MAX);
            return false;
        }
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = (int)n;
    return true;
}

api_status api_completions_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e)
{
    json_t *root;
    if (!api_json_load(K, body, len, &root, e)) return API_ERR;
    api_status ret = API_ERR;
    long long k;
    int st;
    bool b;
    r->max_tokens = 16;  /* OpenAI's default for this endpoint */
    if (!api_json_known(K, root, compl_known, "", e) || !api_json_model(cfg, K, root, r, e) ||
        !api_json_cache(K, root, r, e) || !api_json_user(K, root, r, e))
        goto out;
    if (!compl_parse_prompt(cfg, root, r, e) || !api_json_sampling(K, root, cfg, r, e)) goto out;
    if ((st = api_json_int(K, root, "max_tokens", 0, 1 << 30, &k, e)) < 0) goto out;
    if (st) r->max_tokens = (int)k;
    if ((st = api_json_int(K, root, "n", 1, API_MAX_N, &k, e)) < 0) goto out;
    if (st) r->n = (int)k;
    if ((st = api_json_int(K, root, "best_of", 1, API_MAX_N, &k, e)) < 0) goto out;
    if (st && k != r->n) {
        api_json_value_error(K, e, "best_of", "only best_of equal to n is supported by this server.");
        goto out;
    }
    if ((st = api_json_int(K, root, "logprobs", 0, 5, &k, e)) < 0) goto out;
    if (st) {
        r->logprobs = true;
        r->top_logprobs = (int)k;
    }
    b = false;
    if (api_json_bool(K, root, "echo", &b, e) < 0) goto out;
    if (b) {
        api_json_value_error(K, e, "echo", "echo is not supported by this server.");
        goto out;
    }
    const char *suffix = NULL;
    if ((st = api_json_str(K, root, "suffix", &suffix, e)) < 0) goto out;
    if (st) {
        api_json_value_error(K, e, "suffix", "suffix is not supported by this server.");
        goto out;
    }
    if (!api_json_stop(K, root, "stop", r, e)) goto out;
    if (r->n_stop > 4) {
        api_json_value_error(K, e, "stop", "at most 4 stop sequences are supported, got %d.", r->n_stop);
        goto out;
    }
    if (api_json_bool(K, root, "stream", &r->stream, e) < 0 || api_json_bool(K, root, "ignore_eos", &r->ignore_eos, e) < 0 ||
        !api_json_stream_options(K, root, r, e))
        goto out;
    if (!api_json_format(K, json_object_get(root, "response_format"), "response_format", false, r, e) ||
        !api_json_guided(K, root, r, e))
        goto out;
    ret = API_OK;
out:
    json_decref(root);
    return ret;
}

/* ---- output ---- */

static const char *compl_finish_name(events_finish_reason f) { return f == EVENTS_FINISH_LENGTH ? "length" : "stop"; }

/* {"id":...,"object":"text_completion",...,"choices":[ */
static void compl_open(const api_out *o, bytebuf *b)
{
    bytebuf_puts(b, "{\"id\":");
    api_buf_str(b, o->id);
    bytebuf_printf(b, ",\"object\":\"text_completion\",\"created\":%lld,\"model\":", (long long)o->created);
    api_buf_str(b, o->model);
    bytebuf_puts(b, ",\"system_fingerprint\":");
    api_buf_str(b, o->fingerprint);
    bytebuf_puts(b, ",\"choices\":[");
}

static void compl_usage(const api_out *o, bytebuf *b)
{
    const api_usage *u = &o->usage;
    bytebuf_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                      "\"prompt_tokens_details\":{\"cached_tokens\":%d},"
                      "\"completion_tokens_details\":{\"accepted_prediction_tokens\":%d,\"rejected_prediction_tokens\":%d}}",
                   u->prompt_tokens, u->completion_tokens, u->prompt_tokens + u->completion_tokens, u->cached_tokens,
                   u->accepted_drafts, u->rejected_drafts);
}

/* The log-probs of entries [from, to) of choice c in the completions shape. */
static void compl_logprobs(bytebuf *b, const api_choice *c, int from, int to)
{
    bytebuf_puts(b, "{\"tokens\":[");
    for (int k = from; k < to; k++) {
        if (k > from) bytebuf_putc(b, ',');
        api_buf_strn(b, c->lps[k].text, c->lps[k].len);
    }
    bytebuf_puts(b, "],\"token_logprobs\":[");
    for (int k = from; k < to; k++) bytebuf_printf(b, "%s%.6g", k > from ? "," : "", (double)c->lps[k].logprob);
    bytebuf_puts(b, "],\"top_logprobs\":[");
    for (int k = from; k < to; k++) {
        const api_lp_entry *en = &c->lps[k];
        bytebuf_puts(b, k > from ? ",{" : "{");
        int n = 0;
        for (int t = 0; t < en->n_top; t++) {
            bool dup = false;  /* an object: two alternatives with the same text keep the first */
            for (int u = 0; u < t && !dup; u++)
                dup = en->top_len[u] == en->top_len[t] && !memcmp(en->top_text[u], en->top_text[t], en->top_len[t]);
            if (dup) continue;
            if (n++) bytebuf_putc(b, ',');
            api_buf_strn(b, en->top_text[t], en->top_len[t]);
            bytebuf_printf(b, ":%.6g", (double)en->top_logprob[t]);
        }
        bytebuf_putc(b, '}');
    }
    bytebuf_puts(b, "],\"text_offset\":[");
    for (int k = from; k < to; k++) bytebuf_printf(b, "%s%zu", k > from ? "," : "", c->lps[k].offset);
    bytebuf_puts(b, "]}");
}

/* One streamed chunk of choice i: text d[0..len), its new log-prob entries, finish or NULL. */
static void compl_chunk(api_out *o, int i, const char *d, size_t len, const char *finish)
{
    api_choice *c = &o->choices[i];
    bytebuf b = {0};
    compl_open(o, &b);
    bytebuf_puts(&b, "{\"text\":");
    api_buf_strn(&b, d, len);
    bytebuf_printf(&b, ",\"index\":%d,\"logprobs\":", i);
    if (o->req->logprobs) {
        compl_logprobs(&b, c, c->n_lps_sent, c->n_lps);
        c->n_lps_sent = c->n_lps;
    } else {
        bytebuf_puts(&b, "null");
    }
    bytebuf_puts(&b, ",\"finish_reason\":");
    api_buf_str(&b, finish);
    bytebuf_puts(&b, "}]}");
    api_sse(&o->out, NULL, b.p, b.len);
    bytebuf_free(&b);
}

static void api_completions_begin(api_out *o) { (void)o; }

static void api_completions_on(api_out *o, int i, api_op op, api_item *it, const char *d, size_t len)
{
    if (!o->req->stream) return;
    if (op == API_OP_DELTA && it->kind == API_ITEM_TEXT) compl_chunk(o, i, d, len, NULL);
    else if (op == API_OP_FINISH) compl_chunk(o, i, "", 0, compl_finish_name(o->choices[i].finish));
}

static void api_completions_end(api_out *o)
{
    bytebuf *b = &o->out;
    if (o->req->stream) {
        if (o->req->include_usage) {
            bytebuf u = {0};
            compl_open(o, &u);
            bytebuf_puts(&u, "],\"usage\":");
            compl_usage(o, &u);
            bytebuf_putc(&u, '}');
            api_sse(b, NULL, u.p, u.len);
            bytebuf_free(&u);
        }
        api_sse_done(b);
        return;
    }
    compl_open(o, b);
    for (int i = 0; i < o->n_choices; i++) {
        const api_choice *c = &o->choices[i];
        bytebuf text = {0};
        for (int k = 0; k < c->n_items; k++)
            if (c->items[k].kind == API_ITEM_TEXT) bytebuf_append(&text, c->items[k].text.p, c->items[k].text.len);
        bytebuf_puts(b, i ? ",{\"text\":" : "{\"text\":");
        api_buf_strn(b, text.p, text.len);
        bytebuf_free(&text);
        bytebuf_printf(b, ",\"index\":%d,\"logprobs\":", i);
        if (o->req->logprobs) compl_logprobs(b, c, 0, c->n_lps);
        else bytebuf_puts(b, "null");
        bytebuf_puts(b, ",\"finish_reason\":");
        api_buf_str(b, compl_finish_name(c->finish));
        bytebuf_putc(b, '}');
    }
    bytebuf_puts(b, "],\"usage\":");
    compl_usage(o, b);
    bytebuf_putc(b, '}');
}

const api_format api_completions_format = {
    .id_prefix = "cmpl-",
    .parse = api_completions_parse,
    .begin = api_completions_begin,
    .on = api_completions_on,
    .end = api_completions_end,
};

/* ---- route ---- */

static void compl_handle(http_request *r, void *user) { api_serve(r, user, API_KIND_COMPLETIONS, false, NULL); }

void api_completions_register(http_server *h, api_ctx *c) { http_route(h, "POST", "/v1/completions", compl_handle, c); }
