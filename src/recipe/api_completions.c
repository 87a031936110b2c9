/*
 * api_completions: OpenAI's raw-prompt POST /v1/completions.
 *
 * The prompt (a string, a one-element array of strings, or an array of token ids) goes to
 * the scheduler as is: a string is tokenised with the model's BOS and no control-token
 * matching. `n` choices are n scheduler requests (seeds seed, seed+1, ...). Each choice
 * detokenises its tokens with a streaming detokenizer, matches the stop strings on the text
 * (holding back a tail that could still become one, cancelling the request when one
 * matches) and, when asked, collects per-token log-probs in the completions shape
 * ({tokens, token_logprobs, top_logprobs, text_offset}).
 *
 * Non-streaming: the handler waits for every choice's FINISH (checking for a disconnect now
 * and then) and answers one JSON object. Streaming: SSE chunks of "text_completion" objects,
 * one per batch of new text per choice, a last chunk per choice with finish_reason, the
 * usage chunk when stream_options.include_usage, then "data: [DONE]".
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/tokenizer.h"
#include "util/util.h"

#define COMPL_MAX_N 16
#define COMPL_MAX_STOPS 4

typedef struct {
    sched_req *req;              /* NULL once released */
    tokenizer_stream ts;         /* detokenizer */
    http_buf text;               /* all text generated so far (cut at a stop string) */
    size_t sent;                 /* bytes of text already streamed */
    bool stopped;                /* a stop string matched: text is final */
    bool finished;               /* FINISH record seen */
    const char *finish_reason;   /* "stop" / "length" */
    bool error;                  /* the scheduler failed the request */
    bool final_sent;             /* streaming: the chunk with finish_reason was written */
    sched_usage usage;
    /* log-probs (when asked): per token, collected in arrays */
    json_t *lp_tokens, *lp_logprobs, *lp_top, *lp_offset;
    size_t lp_streamed;          /* entries already streamed */
} compl_choice;

typedef struct {
    const api_ctx *c;
    char id[48];
    int n;                       /* choices */
    compl_choice ch[COMPL_MAX_N];
    char *stops[COMPL_MAX_STOPS];
    int n_stops;
    size_t max_stop;             /* longest stop string, bytes */
    int logprobs;                /* -1: off; else top alternatives */
    bool stream;
    bool include_usage;
    bool done_sent;              /* [DONE] written */
    int n_prompt;
    int32_t *prompt;             /* (n_prompt) ids */
    char piece[512];             /* scratch for one token's text (log-probs) */
    jsonfmt_buf raw;             /* scratch: one token's bytes from the detokenizer */
    jsonfmt_buf tok_text;        /* one token's text as the client gets it (api_detok) */
} compl_job;

static void compl_job_free(compl_job *j)
{
    for (int i = 0; i < j->n; i++) {
        compl_choice *ch = &j->ch[i];
        if (ch->req) api_be_release(j->c, ch->req);
        http_buf_free(&ch->text);
        json_decref(ch->lp_tokens);
        json_decref(ch->lp_logprobs);
        json_decref(ch->lp_top);
        json_decref(ch->lp_offset);
    }
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    free(j->prompt);
    jsonfmt_buf_free(&j->raw);
    jsonfmt_buf_free(&j->tok_text);
    free(j);
}

/* The text of one token for the log-probs arrays (control tokens render their text). */
static json_t *compl_token_text(compl_job *j, int32_t id)
{
    int n = tokenizer_token_to_piece(j->c->tok, id, j->piece, (int)sizeof j->piece, true);
    if (n < 0 || n > (int)sizeof j->piece) n = 0;
    return api_json_text(j->piece, (size_t)n);
}

/* Applies one scheduler output to a choice. */
static void compl_apply(compl_job *j, compl_choice *ch, const sched_output *o)
{
    if (o->kind == SCHED_OUT_FINISH) {
        ch->finished = true;
        ch->usage = o->usage;
        if (!ch->stopped) {
            api_detok(&ch->ts, -1, &j->raw, &j->tok_text);
            http_buf_append(&ch->text, j->tok_text.p, j->tok_text.len);
        }
        switch (o->finish) {
        case SCHED_FINISH_LENGTH: ch->finish_reason = "length"; break;
        case SCHED_FINISH_ERROR: ch->finish_reason = "error"; ch->error = true; break;
        default: ch->finish_reason = "stop"; break;  /* eos, or our stop-string cancel */
        }
        if (ch->stopped) ch->finish_reason = "stop";
        return;
    }
    if (ch->stopped || o->is_stop) return;   /* the eos token has no text */
    size_t before = ch->text.len;
    api_detok(&ch->ts, o->token, &j->raw, &j->tok_text);
    http_buf_append(&ch->text, j->tok_text.p, j->tok_text.len);
    if (j->logprobs >= 0) {
        json_array_append_new(ch->lp_tokens, compl_token_text(j, o->token));
        json_array_append_new(ch->lp_logprobs, json_real(o->logprob));
        json_t *top = json_object();
        for (int k = 0; k < o->n_top; k++) {
            int m = tokenizer_token_to_piece(j->c->tok, o->top[k].token, j->piece, (int)sizeof j->piece, true);
            if (m < 0 || m > (int)sizeof j->piece) m = 0;
            json_t *key = api_json_text(j->piece, (size_t)m);
            json_object_set_new(top, json_string_value(key), json_real(o->top[k].logprob));
            json_decref(key);
        }
        json_array_append_new(ch->lp_top, top);
        json_array_append_new(ch->lp_offset, json_integer((json_int_t)before));
    }
    if (j->n_stops) {
        size_t cut, safe;
        size_t from = before > j->max_stop ? before - j->max_stop : 0;
        if (api_stop_find((const char *const *)j->stops, j->n_stops, ch->text.data, ch->text.len, from, &cut, &safe)) {
            ch->text.len = cut;
            ch->text.data[cut] = 0;
            ch->stopped = true;
            api_be_cancel(j->c, ch->req);
        }
    }
}

/* Bytes of a choice's text that may be sent now. */
static size_t compl_sendable(const compl_job *j, const compl_choice *ch)
{
    if (ch->stopped || ch->finished || !j->n_stops) return ch->text.len;
    size_t cut, safe;
    if (api_stop_find((const char *const *)j->stops, j->n_stops, ch->text.data, ch->text.len, ch->text.len, &cut, &safe))
        return cut;
    return safe;
}

static json_t *compl_logprobs_json(compl_choice *ch, size_t from)
{
    size_t n = json_array_size(ch->lp_tokens);
    json_t *t = json_array(), *l = json_array(), *top = json_array(), *off = json_array();
    for (size_t i = from; i < n; i++) {
        json_array_append(t, json_array_get(ch->lp_tokens, i));
        json_array_append(l, json_array_get(ch->lp_logprobs, i));
        json_array_append(top, json_array_get(ch->lp_top, i));
        json_array_append(off, json_array_get(ch->lp_offset, i));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", t, "token_logprobs", l, "top_logprobs", top, "text_offset", off);
}

static json_t *compl_usage_json(const compl_job *j)
{
    int comp = 0, cached = j->n ? j->ch[0].usage.cached_tokens : 0;
    for (int i = 0; i < j->n; i++) comp += j->ch[i].usage.completion_tokens;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->n_prompt, "completion_tokens", comp,
                     "total_tokens", j->n_prompt + comp, "prompt_tokens_details", "cached_tokens", cached);
}

static json_t *compl_envelope(const compl_job *j, json_t *choices)
{
    char fp[24];
    snprintf(fp, sizeof fp, "fp_%.10s", j->c->model->fingerprint_hex);
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "id", j->id, "object", "text_completion",
                     "created", (json_int_t)j->c->created, "model", j->c->model_name, "system_fingerprint", fp,
                     "choices", choices);
}

/* Polls every unfinished choice once; waits up to timeout_ms on the first if none had
 * output. Returns true if anything was applied. */
static bool compl_pump(compl_job *j, int timeout_ms)
{
    sched_output out[32];
    bool any = false;
    for (int pass = 0; pass < 2 && !any; pass++) {
        for (int i = 0; i < j->n; i++) {
            compl_choice *ch = &j->ch[i];
            if (ch->finished) continue;
            int k = api_be_poll(j->c, ch->req, out, 32, pass ? timeout_ms : 0);
            for (int q = 0; q < k; q++) compl_apply(j, ch, &out[q]);
            if (k) any = true;
            if (pass) break;  /* wait on one only */
        }
    }
    return any;
}

static bool compl_all_finished(const compl_job *j)
{
    for (int i = 0; i < j->n; i++)
        if (!j->ch[i].finished) return false;
    return true;
}

/* ---- streaming ---- */

static bool compl_pull(void *ctx, http_buf *out, int timeout_ms)
{
    compl_job *j = ctx;
    if (j->done_sent) return false;
    compl_pump(j, timeout_ms);
    bool all = true;
    for (int i = 0; i < j->n; i++) {
        compl_choice *ch = &j->ch[i];
        if (ch->final_sent) continue;
        if (ch->finished && ch->error) {
            api_sse_json(out, json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", "the request failed in the engine",
                                        "type", "server_error", "param", "code"));
            ch->final_sent = true;
            continue;
        }
        size_t can = compl_sendable(j, ch);
        bool last = ch->finished;
        if (can > ch->sent || last) {
            size_t upto = can > ch->sent ? can : ch->sent;
            json_t *lp = json_null();
            if (j->logprobs >= 0) {
                lp = compl_logprobs_json(ch, ch->lp_streamed);
                ch->lp_streamed = json_array_size(ch->lp_tokens);
            }
            json_t *choice = json_pack("{s:o, s:i, s:o, s:o}", "text", api_json_text(ch->text.data + ch->sent, upto - ch->sent),
                                       "index", i, "logprobs", lp,
                                       "finish_reason", last ? json_string(ch->finish_reason) : json_null());
            ch->sent = upto;
            ch->final_sent = last;
            api_sse_json(out, compl_envelope(j, json_pack("[o]", choice)));
        }
        all &= ch->final_sent;
    }
    if (!all) return true;
    if (j->include_usage) {
        json_t *u = compl_envelope(j, json_array());
        json_object_set_new(u, "usage", compl_usage_json(j));
        api_sse_json(out, u);
    }
    http_buf_puts(out, "data: [DONE]\n\n");
    j->done_sent = true;
    return false;
}

static void compl_done(void *ctx, bool client_gone)
{
    (void)client_gone;
    compl_job_free(ctx);   /* releases (and so cancels) every request still running */
}

/* ---- request parsing ---- */

static const char *const compl_known[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "logprobs",
    "echo", "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user", "suffix",
    "seed", "top_k", "min_p", "repeat_penalty", "repetition_penalty", "ignore_eos", "cache_salt", "cache_class",
    NULL,
};

static bool compl_bad(http_request *r, const char *param, const char *msg)
{
    api_openai_error(r, 400, "invalid_request_error", msg, param, NULL);
    return false;
}

static bool compl_num(http_request *r, json_t *body, const char *key, double lo, double hi, double *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return true;
    char msg[200];
    if (!json_is_number(v)) {
        snprintf(msg, sizeof msg, "'%s' must be a number", key);
        return compl_bad(r, key, msg);
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        snprintf(msg, sizeof msg, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
        return compl_bad(r, key, msg);
    }
    *out = d;
    return true;
}

static bool compl_str(http_request *r, json_t *body, const char *key, const char **out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) {
        char msg[200];
        snprintf(msg, sizeof msg, "'%s' must be a string", key);
        return compl_bad(r, key, msg);
    }
    *out = json_string_value(v);
    return true;
}

static bool compl_int(http_request *r, json_t *body, const char *key, long long lo, long long hi, long long *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return true;
    char msg[200];
    if (!json_is_integer(v)) {
        snprintf(msg, sizeof msg, "'%s' must be an integer", key);
        return compl_bad(r, key, msg);
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        snprintf(msg, sizeof msg, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
        return compl_bad(r, key, msg);
    }
    *out = x;
    return true;
}

static bool compl_bool(http_request *r, json_t *body, const char *key, bool *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        char msg[200];
        snprintf(msg, sizeof msg, "'%s' must be a boolean", key);
        return compl_bad(r, key, msg);
    }
    *out = json_is_true(v);
    return true;
}

/* The prompt as token ids (j->prompt, j->n_prompt). */
static bool compl_prompt(http_request *r, compl_job *j, json_t *body)
{
    json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) return compl_bad(r, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        const char *s = json_string_value(p);
        size_t len = json_string_length(p);
        int32_t cap = (int32_t)TM_MIN(len + 8, (size_t)INT32_MAX / 8);
        j->prompt = xmalloc((size_t)cap * sizeof(int32_t));
        int32_t n = tokenizer_encode(j->c->tok, s, len, true, false, j->prompt, cap);
        if (n > cap) {
            j->prompt = xrealloc(j->prompt, (size_t)n * sizeof(int32_t));
            n = tokenizer_encode(j->c->tok, s, len, true, false, j->prompt, n);
        }
        if (n < 0) return compl_bad(r, "prompt", "the prompt could not be tokenised");
        j->n_prompt = n;
    } else if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p);
        j->prompt = xmalloc(n * sizeof(int32_t));
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(p, i);
            long long id = json_is_integer(v) ? json_integer_value(v) : -1;
            if (id < 0 || id >= tokenizer_n_vocab(j->c->tok) || id >= j->c->model->hp.n_vocab)
                return compl_bad(r, "prompt", "'prompt' token ids must be integers within the vocabulary");
            j->prompt[i] = (int32_t)id;
        }
        j->n_prompt = (int)n;
    } else if (json_is_array(p) && json_array_size(p) > 1) {
        return compl_bad(r, "prompt", "only one prompt per request is supported");
    } else {
        return compl_bad(r, "prompt", "'prompt' must be a string or an array of token ids");
    }
    if (j->n_prompt == 0) return compl_bad(r, "prompt", "the prompt is empty");
    return true;
}

static bool compl_stops(http_request *r, compl_job *j, json_t *body)
{
    json_t *s = json_object_get(body, "stop");
    if (!s || json_is_null(s)) return true;
    if (json_is_string(s)) {
        if (json_string_length(s)) j->stops[j->n_stops++] = xstrdup(json_string_value(s));
    } else if (json_is_array(s)) {
        if (json_array_size(s) > COMPL_MAX_STOPS) return compl_bad(r, "stop", "at most 4 stop sequences");
        size_t i;
        json_t *v;
        json_array_foreach(s, i, v) {
            if (!json_is_string(v)) return compl_bad(r, "stop", "'stop' must be a string or an array of strings");
            if (json_string_length(v)) j->stops[j->n_stops++] = xstrdup(json_string_value(v));
        }
    } else {
        return compl_bad(r, "stop", "'stop' must be a string or an array of strings");
    }
    for (int i = 0; i < j->n_stops; i++) j->max_stop = TM_MAX(j->max_stop, strlen(j->stops[i]));
    return true;
}

static void compl_handle(http_request *r, void *user)
{
    const api_ctx *c = user;
    if (!api_openai_auth(r)) return;
    size_t blen;
    const char *bz = http_request_body(r, &blen);
    json_t *body;
    api_error le;
    if (!api_json_load(API_KIND_COMPLETIONS, bz, blen, &body, &le)) {
        api_respond_error(r, API_KIND_COMPLETIONS, &le);
        return;
    }
    compl_job *j = xcalloc(1, sizeof *j);
    j->c = c;
    j->logprobs = -1;
    const char *key;
    json_t *val;
    json_object_foreach(body, key, val) {
        bool known = false;
        for (int i = 0; compl_known[i]; i++) known |= !strcmp(key, compl_known[i]);
        if (!known) {
            char msg[200];
            snprintf(msg, sizeof msg, "Unrecognized request argument supplied: %s", key);
            compl_bad(r, key, msg);
            goto out;
        }
    }
    json_t *mv = json_object_get(body, "model");
    if (mv && !json_is_null(mv) && !json_is_string(mv)) {
        compl_bad(r, "model", "'model' must be a string");
        goto out;
    }
    if (!api_model_ok(c, mv ? json_string_value(mv) : NULL)) {
        char msg[300];
        snprintf(msg, sizeof msg, "The model '%s' does not exist; this server serves '%s'.", json_string_value(mv), c->model_name);
        api_openai_error(r, 404, "invalid_request_error", msg, "model", "model_not_found");
        goto out;
    }
    double temp = 1, top_p = 1, pres = 0, freq = 0, min_p = 0, rep = 1;
    long long max_tokens = 16, n = 1, seed = -1, top_k = 0, logprobs = -1, best_of = 1;
    bool stream = false, echo = false, ignore_eos = false;
    if (!compl_num(r, body, "temperature", 0, 2, &temp) || !compl_num(r, body, "top_p", 0, 1, &top_p) ||
        !compl_num(r, body, "presence_penalty", -2, 2, &pres) || !compl_num(r, body, "frequency_penalty", -2, 2, &freq) ||
        !compl_num(r, body, "min_p", 0, 1, &min_p) || !compl_num(r, body, "repeat_penalty", 0, 10, &rep) ||
        !compl_num(r, body, "repetition_penalty", 0, 10, &rep) ||
        !compl_int(r, body, "max_tokens", 0, INT32_MAX, &max_tokens) || !compl_int(r, body, "n", 1, COMPL_MAX_N, &n) ||
        !compl_int(r, body, "seed", INT64_MIN, INT64_MAX, &seed) || !compl_int(r, body, "top_k", 0, 1 << 20, &top_k) ||
        !compl_int(r, body, "logprobs", 0, 5, &logprobs) || !compl_int(r, body, "best_of", 1, COMPL_MAX_N, &best_of) ||
        !compl_bool(r, body, "stream", &stream) || !compl_bool(r, body, "echo", &echo) ||
        !compl_bool(r, body, "ignore_eos", &ignore_eos))
        goto out;
    if (echo) { compl_bad(r, "echo", "'echo' is not supported"); goto out; }
    if (best_of != n && json_object_get(body, "best_of") && !json_is_null(json_object_get(body, "best_of"))) {
        compl_bad(r, "best_of", "'best_of' other than n is not supported");
        goto out;
    }
    json_t *suffix = json_object_get(body, "suffix");
    if (suffix && !json_is_null(suffix)) { compl_bad(r, "suffix", "'suffix' is not supported"); goto out; }
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) { compl_bad(r, "stream_options", "'stream_options' must be an object"); goto out; }
        if (!stream) { compl_bad(r, "stream_options", "'stream_options' is only allowed when 'stream' is true"); goto out; }
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_boolean(iu)) { compl_bad(r, "stream_options.include_usage", "'include_usage' must be a boolean"); goto out; }
        j->include_usage = iu && json_is_true(iu);
    }
    const char *salt = NULL, *cls = NULL;
    if (!compl_str(r, body, "cache_salt", &salt) || !compl_str(r, body, "cache_class", &cls)) goto out;
    api_tenancy tn;
    api_error ae;
    if (!api_tenancy_of(r, c, salt, cls, &tn, &ae)) {
        api_openai_error(r, ae.status, ae.type, ae.message, ae.param[0] ? ae.param : NULL, ae.code[0] ? ae.code : NULL);
        goto out;
    }
    if (!compl_stops(r, j, body) || !compl_prompt(r, j, body)) goto out;
    j->stream = stream;
    j->logprobs = (int)logprobs;
    j->n = (int)n;
    api_new_id(j->id, sizeof j->id, "cmpl-");

    sched_params sp = { .prompt = j->prompt, .n_prompt = j->n_prompt, .max_tokens = (int)max_tokens };
    sp.sample = sample_params_default();
    sp.sample.temp = (float)temp;
    sp.sample.top_p = (float)top_p;
    sp.sample.top_k = (int)top_k;
    sp.sample.min_p = (float)min_p;
    sp.sample.presence_penalty = (float)pres;
    sp.sample.frequency_penalty = (float)freq;
    sp.sample.repeat_penalty = (float)rep;
    sp.ignore_eos = ignore_eos;
    sp.cache_salt = tn.salt;
    sp.cache_class = tn.cls;
    sp.logprobs = logprobs >= 0;
    sp.top_logprobs = logprobs > 0 ? (int)logprobs : 0;
    uint64_t base_seed = seed >= 0 ? (uint64_t)seed : (uint64_t)(util_now() * 1e6);
    if (max_tokens == 0) {
        /* nothing to generate: answer at once with the prompt's usage */
        j->n = (int)n;
        for (int i = 0; i < j->n; i++) {
            j->ch[i].finished = true;
            j->ch[i].finish_reason = "length";
            j->ch[i].usage.prompt_tokens = j->n_prompt;
        }
        if (j->n_prompt >= c->n_ctx) {
            api_openai_submit_error(r, c, SCHED_ERR_TOO_LONG, j->n_prompt, 0);
            goto out;
        }
    } else {
        for (int i = 0; i < j->n; i++) {
            sp.sample.seed = base_seed + (uint64_t)i;
            sched_status st = api_be_submit(c, &sp, &j->ch[i].req);
            if (st != SCHED_OK) {
                j->n = i;  /* only the submitted ones are released */
                api_openai_submit_error(r, c, st, j->n_prompt, (int)max_tokens);
                goto out;
            }
        }
    }
    for (int i = 0; i < j->n; i++) {
        compl_choice *ch = &j->ch[i];
        tokenizer_stream_init(&ch->ts, c->tok);
        ch->ts.prev = j->prompt[j->n_prompt - 1];  /* no BOS-space rule in mid-text */
        http_buf_append(&ch->text, NULL, 0);
        if (j->logprobs >= 0) {
            ch->lp_tokens = json_array();
            ch->lp_logprobs = json_array();
            ch->lp_top = json_array();
            ch->lp_offset = json_array();
        }
    }
    json_decref(body);
    if (j->stream) {
        http_add_header(r, "X-Accel-Buffering", "no");
        http_respond_stream(r, 200, "text/event-stream", compl_pull, compl_done, j);
        return;
    }
    /* non-streaming: wait for every choice */
    double t_check = util_now();
    while (!compl_all_finished(j)) {
        compl_pump(j, 50);
        double now = util_now();
        if (now - t_check < 0.05) continue;
        t_check = now;
        if (http_request_client_gone(r)) {
            compl_job_free(j);
            http_respond(r, 499, "application/json", "{}", 2);
            return;
        }
    }
    for (int i = 0; i < j->n; i++)
        if (j->ch[i].error) {
            api_openai_error(r, 500, "server_error", "the request failed in the engine (KV cache too small?)", NULL, NULL);
            compl_job_free(j);
            return;
        }
    json_t *choices = json_array();
    for (int i = 0; i < j->n; i++) {
        compl_choice *ch = &j->ch[i];
        json_array_append_new(choices, json_pack("{s:o, s:i, s:o, s:s}", "text", api_json_text(ch->text.data, ch->text.len),
                                                 "index", i, "logprobs",
                                                 j->logprobs >= 0 ? compl_logprobs_json(ch, 0) : json_null(),
                                                 "finish_reason", ch->finish_reason));
    }
    json_t *resp = compl_envelope(j, choices);
    if (max_tokens == 0) {
        for (int i = 0; i < j->n; i++) j->ch[i].usage.cached_tokens = 0;
    }
    json_object_set_new(resp, "usage", compl_usage_json(j));
    api_respond_json(r, 200, resp);
    compl_job_free(j);
    return;
out:
    json_decref(body);
    compl_job_free(j);
}

void api_completions_register(http_server *h, api_ctx *c)
{
    http_route(h, "POST", "/v1/completions", compl_handle, c);
}
