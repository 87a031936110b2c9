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

#define COMPL_MAX_N API_MAX_N
#define COMPL_MAX_STOPS API_MAX_STOP

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

/* Sampling: temperature .. seed, as chat reads them, plus logit_bias. */
static bool compl_parse_sampling(const api_cfg *cfg, json_t *root, api_req *r, api_error *e)
{
    double x;
    long long k;
    int st;
    if ((st = api_json_num(K, root, "temperature", 0, 2, &x, e)) < 0) return false;
    if (st) r->sp.temp = (float)x;
    if ((st = api_json_num(K, root, "top_p", 0, 1, &x, e)) < 0) return false;
    if (st) r->sp.top_p = (float)x;
    if ((st = api_json_int(K, root, "top_k", -1, 1 << 30, &k, e)) < 0) return false;
    if (st) r->sp.top_k = (int)k;
    if ((st = api_json_num(K, root, "min_p", 0, 1, &x, e)) < 0) return false;
    if (st) r->sp.min_p = (float)x;
    if ((st = api_json_num(K, root, "presence_penalty", -2, 2, &x, e)) < 0) return false;
    if (st) r->sp.presence_penalty = (float)x;
    if ((st = api_json_num(K, root, "frequency_penalty", -2, 2, &x, e)) < 0) return false;
    if (st) r->sp.frequency_penalty = (float)x;
    if ((st = api_json_num(K, root, "repeat_penalty", 0.01, 10, &x, e)) < 0) return false;
    if (st) r->sp.repeat_penalty = (float)x;
    if ((st = api_json_num(K, root, "repetition_penalty", 0.01, 10, &x, e)) < 0) return false;
    if (st) r->sp.repeat_penalty = (float)x;
    if (r->sp.presence_penalty != 0 || r->sp.frequency_penalty != 0 || r->sp.repeat_penalty != 1)
        r->sp.penalty_last_n = 64;
    if ((st = api_json_int(K, root, "seed", -(1LL << 62), 1LL << 62, &k, e)) < 0) return false;
    if (st) {
        r->sp.seed = (uint64_t)k;
        r->seed_given = true;
    }
    return api_json_logit_bias(K, root, cfg ? cfg->n_vocab : 0, &r->sp, e);
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
    if (!compl_parse_prompt(cfg, root, r, e) || !compl_parse_sampling(cfg, root, r, e)) goto out;
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
    ret = API_OK;
out:
    json_decref(root);
    return ret;
}

/* The prompt's token ids into j->prompt: as given, or the text tokenised with the model's BOS
 * and no control-token matching. */
static bool compl_tokenize(compl_job *j, const api_req *q, api_error *e)
{
    if (q->prompt_ids) {
        j->n_prompt = q->n_prompt_ids;
        j->prompt = xmalloc((size_t)j->n_prompt * sizeof *j->prompt);
        memcpy(j->prompt, q->prompt_ids, (size_t)j->n_prompt * sizeof *j->prompt);
    } else {
        int32_t cap = (int32_t)TM_MIN(q->prompt_len + 8, (size_t)INT32_MAX / 8);
        j->prompt = xmalloc((size_t)cap * sizeof(int32_t));
        int32_t n = tokenizer_encode(j->c->tok, q->prompt_text, q->prompt_len, true, false, j->prompt, cap);
        if (n > cap) {
            j->prompt = xrealloc(j->prompt, (size_t)n * sizeof(int32_t));
            n = tokenizer_encode(j->c->tok, q->prompt_text, q->prompt_len, true, false, j->prompt, n);
        }
        if (n < 0) {
            api_error_set(e, 400, "prompt", NULL, "The prompt could not be tokenised.");
            return false;
        }
        j->n_prompt = n;
    }
    if (j->n_prompt == 0) {
        api_json_value_error(API_KIND_COMPLETIONS, e, "prompt", "the prompt is empty.");
        return false;
    }
    return true;
}

/* Submits the n choices (seeds seed, seed+1, ...); on failure answers the submit error. */
static bool compl_submit(http_request *r, compl_job *j, const api_req *q, const api_tenancy *tn)
{
    const api_ctx *c = j->c;
    sched_params sp = { .prompt = j->prompt, .n_prompt = j->n_prompt, .max_tokens = q->max_tokens, .sample = q->sp };
    sp.ignore_eos = q->ignore_eos;
    sp.cache_salt = tn->salt;
    sp.cache_class = tn->cls;
    sp.logprobs = q->logprobs;
    sp.top_logprobs = q->top_logprobs;
    if (q->max_tokens == 0) {
        /* nothing to generate: answer at once with the prompt's usage */
        if (j->n_prompt >= c->n_ctx) {
            api_openai_submit_error(r, c, SCHED_ERR_TOO_LONG, j->n_prompt, 0);
            return false;
        }
        for (int i = 0; i < j->n; i++) {
            j->ch[i].finished = true;
            j->ch[i].finish_reason = "length";
            j->ch[i].usage.prompt_tokens = j->n_prompt;
        }
        return true;
    }
    for (int i = 0; i < j->n; i++) {
        sp.sample.seed = q->sp.seed + (uint64_t)i;
        sched_status st = api_be_submit(c, &sp, &j->ch[i].req);
        if (st != SCHED_OK) {
            j->n = i;  /* only the submitted ones are released */
            api_openai_submit_error(r, c, st, j->n_prompt, q->max_tokens);
            return false;
        }
    }
    return true;
}

/* Non-streaming: waits for every choice, checking for a disconnect every 50 ms; answers. */
static void compl_wait_respond(http_request *r, compl_job *j, bool nothing_generated)
{
    double t_check = util_now();
    while (!compl_all_finished(j)) {
        compl_pump(j, 50);
        double now = util_now();
        if (now - t_check < 0.05) continue;
        t_check = now;
        if (http_request_client_gone(r)) {
            http_respond(r, 499, "application/json", "{}", 2);
            return;
        }
    }
    for (int i = 0; i < j->n; i++)
        if (j->ch[i].error) {
            api_openai_error(r, 500, "server_error", "the request failed in the engine (KV cache too small?)", NULL, NULL);
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
    if (nothing_generated)
        for (int i = 0; i < j->n; i++) j->ch[i].usage.cached_tokens = 0;
    json_object_set_new(resp, "usage", compl_usage_json(j));
    api_respond_json(r, 200, resp);
}

/* POST /v1/completions, in steps: auth, parse, tenancy, prompt ids, submit, then the stream
 * or the one JSON answer. */
static void compl_handle(http_request *r, void *user)
{
    const api_ctx *c = user;
    if (!api_openai_auth(r)) return;
    const api_kind kind = API_KIND_COMPLETIONS;
    api_req q;
    api_req_init(&q, kind);
    api_error e;
    memset(&e, 0, sizeof e);
    api_cfg cfg = {c->model_name, c->model_alias, NULL, api_ctx_n_vocab(c)};
    size_t blen;
    const char *body = http_request_body(r, &blen);
    compl_job *j = xcalloc(1, sizeof *j);
    j->c = c;
    j->logprobs = -1;
    api_tenancy tn;
    if (api_completions_parse(&cfg, body, blen, &q, &e) != API_OK || !api_tenancy_of(r, c, q.cache_salt, q.cache_class, &tn, &e) ||
        !compl_tokenize(j, &q, &e)) {
        api_respond_error(r, kind, &e);
        goto out;
    }
    for (int i = 0; i < q.n_stop; i++) {
        j->stops[j->n_stops++] = q.stop[i];
        j->max_stop = TM_MAX(j->max_stop, strlen(q.stop[i]));
        q.stop[i] = NULL;
    }
    q.n_stop = 0;
    j->stream = q.stream;
    j->include_usage = q.include_usage;
    j->logprobs = q.logprobs ? q.top_logprobs : -1;
    j->n = q.n;
    api_new_id(j->id, sizeof j->id, "cmpl-");
    if (!compl_submit(r, j, &q, &tn)) goto out;
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
    if (j->stream) {
        api_req_free(&q);
        http_add_header(r, "X-Accel-Buffering", "no");
        http_respond_stream(r, 200, "text/event-stream", compl_pull, compl_done, j);
        return;
    }
    compl_wait_respond(r, j, q.max_tokens == 0);
out:
    api_req_free(&q);
    compl_job_free(j);
}

void api_completions_register(http_server *h, api_ctx *c)
{
    http_route(h, "POST", "/v1/completions", compl_handle, c);
}
