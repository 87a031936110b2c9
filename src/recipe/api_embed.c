/*
 * api_embed: POST /v1/embeddings in OpenAI's shape, and reranking on the same requests.
 *
 *   {input, model, encoding_format = "float" | "base64", dimensions, user}
 *   -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
 *       "usage": {"prompt_tokens", "total_tokens"}}
 *
 * input is a string, an array of strings, an array of token ids or an array of such arrays;
 * every input is one scheduler request of the embedding kind (sched_params.embed), so the
 * inputs of one call and those of every other call share the engine's steps with the
 * generations: nothing computes beside the scheduler. At most EMBED_WINDOW of a call's inputs
 * are queued at once (the rest follow as those finish), so a long list does not fill the
 * queue; a call has at most EMBED_MAX_INPUTS inputs (OpenAI's bound).
 *
 * Pooling follows the GGUF's {arch}.pooling_type as llama.cpp reads it: last-token
 * (Qwen3-Embedding), mean or the first token's (CLS: BERT-style encoders); a model that
 * declares none (a chat model, or an encoder converted without pooling) is pooled by the mean,
 * as llama.cpp's server does when asked for a mean; a reranker's is refused here. The vector is L2-normalised, as llama.cpp's server returns it (embd_normalize 2).
 * Text is tokenised with the vocabulary's BOS/EOS (add_special) and its control-token text
 * left as text; token ids are taken as given.
 *
 * dimensions: vLLM's rule. A model trained with Matryoshka representation learning may be
 * cut to its first N components, renormalised; any other model refuses a size other than its
 * own with a 400. A GGUF says nothing of Matryoshka, so the one family known to be trained so
 * is recognised: qwen3 with last-token pooling (Qwen3-Embedding, any N from 32 up).
 *
 * POST /v1/rerank and /rerank (the shape of llama.cpp, vLLM, Jina, Cohere): {query,
 * documents, top_n, return_documents} -> {"results": [{"index", "relevance_score",
 * "document": {"text"}}], sorted by score, the first top_n}. A reranker GGUF as llama.cpp
 * converts Qwen3-Reranker: pooling_type rank, a cls.output head (the "yes" and "no" rows of
 * the output) and the prompt tokenizer.chat_template.rerank with {query} and {document}. Each
 * document's prompt is an embedding request of the last token; the score is the softmax over
 * the head's outputs of the first, as llama.cpp's rank pooling computes it. The template's
 * text may name control tokens; the query and documents are text only (llama.cpp parses
 * control-token text in them too).
 *
 * Through the gateway (api_backend.embedding) each input is an embedding PREFILL on a worker
 * serving the model, whose vector comes back in an EMBEDDING frame (docs/protocol.md); the
 * pooling, the normalisation, dimensions and the reranker's score head are computed here, as
 * for `serve`. A backend without the hook answers 501.
 */
#define _GNU_SOURCE   /* memmem */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "recipe/tokenizer.h"
#include "util/util.h"

#define EMB_KIND API_KIND_COMPLETIONS   /* OpenAI's error shape and wording */
#define EMBED_MAX_INPUTS 2048
#define EMBED_WINDOW 32
#define EMBED_MRL_MIN 32                /* Qwen3-Embedding's smallest Matryoshka size */

typedef struct {
    int32_t *ids;             /* (n) the input's token ids */
    int32_t n;
    sched_req *req;           /* in flight, or NULL */
    float *v;                 /* (dim) its pooled vector once done, or NULL */
} emb_input;

/* The pooling this model's embeddings take (MODEL_POOL_NONE: it has none to give). */
static model_pool emb_pool(const model *m)
{
    switch (m->hp.pooling) {
    case MODEL_POOL_LAST: return MODEL_POOL_LAST;
    case MODEL_POOL_CLS: return MODEL_POOL_CLS;
    case MODEL_POOL_MEAN:
    case MODEL_POOL_NONE: return MODEL_POOL_MEAN;
    default: return MODEL_POOL_NONE;
    }
}

static bool emb_matryoshka(const model *m)
{
    return m->hp.arch == MODEL_ARCH_QWEN3 && m->hp.pooling == MODEL_POOL_LAST;
}

/* The token ids of one input v (a string or an array of ids); path names it in errors. */
static bool emb_input_ids(const api_ctx *c, json_t *v, const char *path, emb_input *in, api_error *e)
{
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);
        if (len == 0) {
            api_json_value_error(EMB_KIND, e, path, "an input must not be empty.");
            return false;
        }
        int32_t cap = (int32_t)TM_MIN(len + 8, (size_t)INT32_MAX / 8);
        for (;;) {
            in->ids = xrealloc(in->ids, (size_t)cap * sizeof *in->ids);
            int32_t k = tokenizer_encode(c->tok, s, len, true, false, in->ids, cap);
            if (k < 0) {
                api_error_set(e, 500, NULL, NULL, "The text could not be tokenised.");
                return false;
            }
            if (k <= cap) {
                in->n = k;
                break;
            }
            cap = k;
        }
    } else {
        size_t n = json_array_size(v), i;
        json_t *t;
        if (n == 0) {
            api_json_value_error(EMB_KIND, e, path, "an input must not be empty.");
            return false;
        }
        in->ids = xmalloc(n * sizeof *in->ids);
        json_array_foreach(v, i, t) {
            json_int_t id = json_integer_value(t);
            if (!json_is_integer(t) || id < 0 || id >= api_ctx_n_vocab(c)) {
                char p[64];
                snprintf(p, sizeof p, "%s[%zu]", path, i);
                api_json_value_error(EMB_KIND, e, p, "a token id from 0 to %d is expected.", api_ctx_n_vocab(c) - 1);
                return false;
            }
            in->ids[i] = (int32_t)id;
        }
        in->n = (int32_t)n;
    }
    if (in->n > api_ctx_max_input(c)) {
        api_error_set(e, 400, path, "context_length_exceeded",
                      "This model's maximum context length is %d tokens, however %s has %d tokens.", api_ctx_max_input(c),
                      path, in->n);
        return false;
    }
    if (in->n == 0) {
        api_json_value_error(EMB_KIND, e, path, "the input has no tokens.");
        return false;
    }
    return true;
}

/* The inputs of the request's "input" into *ins (*n of them). */
static bool emb_inputs(const api_ctx *c, json_t *input, emb_input **ins, int *n, api_error *e)
{
    *ins = NULL, *n = 0;
    if (json_is_string(input) || (json_is_array(input) && json_array_size(input) > 0 &&
                                  json_is_integer(json_array_get(input, 0)))) {
        *ins = xcalloc(1, sizeof **ins);
        *n = 1;
        return emb_input_ids(c, input, "input", &(*ins)[0], e);
    }
    if (!json_is_array(input)) {
        api_json_bad(EMB_KIND, e, "input", "a string, an array of strings, or an array of token id arrays", input);
        return false;
    }
    size_t k = json_array_size(input);
    if (k == 0) {
        api_json_value_error(EMB_KIND, e, "input", "at least one input is required.");
        return false;
    }
    if (k > EMBED_MAX_INPUTS) {
        api_json_value_error(EMB_KIND, e, "input", "at most %d inputs are allowed in one request, got %zu.",
                             EMBED_MAX_INPUTS, k);
        return false;
    }
    *ins = xcalloc(k, sizeof **ins);
    *n = (int)k;
    size_t i;
    json_t *v;
    json_array_foreach(input, i, v) {
        char path[48];
        api_path(path, sizeof path, "input", NULL, (int)i);
        if (!json_is_string(v) && !json_is_array(v)) {
            api_json_type_error(EMB_KIND, e, path, "a string or an array of token ids", v);
            return false;
        }
        if (!emb_input_ids(c, v, path, &(*ins)[i], e)) return false;
    }
    return true;
}

/* Waits for in's request to finish and keeps its vector. Returns false (and sets e) when it
 * did not end with its vector (cancelled, error). */
static bool emb_collect(const api_ctx *c, http_request *r, emb_input *in, int dim, const char *param, api_error *e)
{
    sched_output out[4];
    while (!api_be_done(c, in->req)) {
        int k = api_be_poll(c, in->req, out, 4, 200);
        for (int i = 0; i < k; i++) {
            if (out[i].kind != SCHED_OUT_FINISH || out[i].finish == SCHED_FINISH_STOP) continue;
            /* refused: a cluster worker took it for longer than it computes in one step (one
             * that joined after the gateway checked the input against the others) */
            if (out[i].finish == SCHED_FINISH_REFUSED)
                api_error_set(e, 400, param, "context_length_exceeded",
                              "The worker the input ran on refused it: %s has %d tokens, more than that worker "
                              "computes in one step.", param, in->n);
            else
                api_error_set(e, out[i].finish == SCHED_FINISH_ABORTED || out[i].finish == SCHED_FINISH_UNAVAILABLE ? 503 : 500, NULL, NULL,
                              "The embedding was not computed (%s).", sched_finish_name(out[i].finish));
            return false;
        }
        if (k == 0 && http_request_client_gone(r)) {
            api_error_set(e, 499, NULL, NULL, "The client has gone.");
            return false;
        }
    }
    const float *v = api_be_embedding(c, in->req);
    if (!v) {
        api_error_set(e, 500, NULL, NULL, "The embedding was not computed.");
        return false;
    }
    in->v = xmalloc((size_t)dim * sizeof *in->v);
    memcpy(in->v, v, (size_t)dim * sizeof *in->v);
    api_be_release(c, in->req);
    in->req = NULL;
    return true;
}

/* Runs the n inputs as embedding requests of this pooling, EMBED_WINDOW at a time, and keeps
 * their vectors; *n_tokens: their tokens. 0: done; -1: failed, e set; -2: failed, answered. */
static int emb_run(const api_ctx *c, http_request *r, emb_input *ins, int n, model_pool pool, const char *param,
                   int *n_tokens, api_error *e)
{
    int next = 0;
    for (int i = 0; i < n; i++) {
        while (next < n && next < i + EMBED_WINDOW) {
            sched_params p = { .prompt = ins[next].ids, .n_prompt = ins[next].n, .embed = pool };
            sched_status st = api_be_submit(c, &p, &ins[next].req);
            if (st == SCHED_ERR_QUEUE_FULL && next > i) break;   /* wait for ours to make room */
            if (st != SCHED_OK) {
                api_openai_submit_error(r, c, st, ins[next].n, 0, param);
                return -2;
            }
            *n_tokens += ins[next].n;
            next++;
        }
        if (!emb_collect(c, r, &ins[i], c->model->hp.dim, param, e)) return -1;
    }
    return 0;
}

static void emb_base64(bytebuf *b, const uint8_t *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    bytebuf_putc(b, '"');
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = { tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=', i + 2 < n ? tab[v & 63] : '=' };
        bytebuf_append(b, q, 4);
    }
    bytebuf_putc(b, '"');
}

/* The request body as a JSON object of only the allowed members, and its model's name (NULL
 * when absent). False with e filled (*root may then hold the object: the caller frees it). */
static bool emb_body(http_request *r, const char *const *allowed, json_t **root, const char **name, api_error *e)
{
    size_t len;
    const char *body = http_request_body(r, &len);
    return api_json_load(EMB_KIND, body, len, root, e) && api_json_known(EMB_KIND, *root, allowed, "", e) &&
           api_json_str(EMB_KIND, *root, "model", name, e) >= 0;
}

/* The model a request names (NULL: the default), if this process serves it itself; else NULL
 * with e filled: 404 for an unknown model, 501 for one behind a gateway. what: the route's
 * job with its verb ("Embeddings are"), for the message. */
static const api_ctx *emb_route(const api_ctx *user, const char *name, const char *what, api_error *e)
{
    const api_ctx *c = api_ctx_route(user, name);
    if (!c) {
        api_error_set(e, 404, "model", "model_not_found", "The model '%.200s' does not exist.", name);
        return NULL;
    }
    if (c->backend && !c->backend->embedding) {
        api_error_set(e, 501, NULL, "not_implemented",
                      "%s not served through this backend; ask a `tokenmill serve` of the model.", what);
        return NULL;
    }
    return c;
}

static void emb_handle(http_request *r, void *user)
{
    const api_ctx *c = user;
    static const char *const allowed[] = { "input", "model", "encoding_format", "dimensions", "user", NULL };
    if (!api_openai_auth(r)) return;
    api_error e = {0};
    emb_input *ins = NULL;
    int n_in = 0;
    bytebuf b = {0};
    json_t *root = NULL;
    const char *name = NULL, *fmt = NULL;
    if (!emb_body(r, allowed, &root, &name, &e) || api_json_str(EMB_KIND, root, "encoding_format", &fmt, &e) < 0)
        goto bad;
    if (!(c = emb_route(user, name, "Embeddings are", &e))) {
        c = user;
        goto bad;
    }
    bool b64 = fmt && !strcmp(fmt, "base64");
    if (fmt && !b64 && strcmp(fmt, "float")) {
        api_json_value_error(EMB_KIND, &e, "encoding_format", "'float' or 'base64' is expected, got '%.40s'.", fmt);
        goto bad;
    }
    const int dim = c->model->hp.dim;
    long long dims = dim;
    if (api_json_int(EMB_KIND, root, "dimensions", 1, 1 << 20, &dims, &e) < 0) goto bad;
    if (dims != dim) {
        if (!emb_matryoshka(c->model)) {
            api_error_set(&e, 400, "dimensions", NULL,
                          "This model does not support Matryoshka representations: dimensions must be %d.", dim);
            goto bad;
        }
        if (dims < EMBED_MRL_MIN || dims > dim) {
            api_error_set(&e, 400, "dimensions", NULL, "dimensions must be from %d to %d.", EMBED_MRL_MIN, dim);
            goto bad;
        }
    }
    model_pool pool = emb_pool(c->model);
    if (pool == MODEL_POOL_NONE) {
        api_error_set(&e, 400, "model", NULL, "This model (pooling type %d) gives no embeddings: it is a reranker.",
                      (int)c->model->hp.pooling);
        goto bad;
    }
    if (!emb_inputs(c, json_object_get(root, "input"), &ins, &n_in, &e)) goto bad;

    int n_tokens = 0, rc = emb_run(c, r, ins, n_in, pool, "input", &n_tokens, &e);
    if (rc == -1) goto bad;
    if (rc == -2) goto out;

    bytebuf_puts(&b, "{\"object\":\"list\",\"data\":[");
    float *v = xmalloc((size_t)dims * sizeof *v);
    for (int i = 0; i < n_in; i++) {
        double ss = 0;
        for (long long d = 0; d < dims; d++) ss += (double)ins[i].v[d] * ins[i].v[d];
        float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (long long d = 0; d < dims; d++) v[d] = ins[i].v[d] * inv;
        bytebuf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        if (b64) {
            emb_base64(&b, (const uint8_t *)v, (size_t)dims * sizeof *v);   /* little-endian f32, as OpenAI's */
        } else {
            bytebuf_putc(&b, '[');
            for (long long d = 0; d < dims; d++) bytebuf_printf(&b, "%s%.9g", d ? "," : "", v[d]);
            bytebuf_putc(&b, ']');
        }
        bytebuf_putc(&b, '}');
    }
    free(v);
    bytebuf_puts(&b, "],\"model\":");
    api_buf_str(&b, c->model_name);
    bytebuf_printf(&b, ",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", n_tokens, n_tokens);
    api_respond_buf(r, 200, &b);
    goto out;
bad:
    if (e.status != 499) api_respond_error(r, EMB_KIND, &e);
out:
    for (int i = 0; i < n_in; i++) {
        if (ins[i].req) api_be_release(c, ins[i].req);
        free(ins[i].ids);
        free(ins[i].v);
    }
    free(ins);
    bytebuf_free(&b);
    json_decref(root);
}

/* ---- rerank ---- */

/* Appends text's ids to in (parse_special: control-token text becomes those tokens, for the
 * model's own template only). */
static bool rr_append(const api_ctx *c, emb_input *in, int32_t *cap, const char *text, size_t len, bool parse_special)
{
    for (;;) {
        int32_t room = *cap - in->n;
        int32_t k = tokenizer_encode(c->tok, text, len, false, parse_special, in->ids + in->n, room);
        if (k < 0) return false;
        if (k <= room) {
            in->n += k;
            return true;
        }
        *cap = in->n + k;
        in->ids = xrealloc(in->ids, (size_t)*cap * sizeof *in->ids);
    }
}

/* The prompt of (query, doc): the model's rerank template, {query} and {document} put in as
 * text. */
static bool rr_prompt(const api_ctx *c, const char *tmpl, size_t tlen, json_t *q, json_t *d, emb_input *in)
{
    int32_t cap = 64;
    in->ids = xmalloc((size_t)cap * sizeof *in->ids);
    size_t at = 0;
    while (at < tlen) {
        const char *qp = memmem(tmpl + at, tlen - at, "{query}", 7), *dp = memmem(tmpl + at, tlen - at, "{document}", 10);
        const char *next = qp && (!dp || qp < dp) ? qp : dp;
        size_t lit = next ? (size_t)(next - (tmpl + at)) : tlen - at;
        if (lit && !rr_append(c, in, &cap, tmpl + at, lit, true)) return false;
        at += lit;
        if (!next) break;
        json_t *v = next == qp ? q : d;
        if (!rr_append(c, in, &cap, json_string_value(v), json_string_length(v), false)) return false;
        at += next == qp ? 7 : 10;
    }
    return true;
}

typedef struct {
    int index;
    double score;
} rr_result;

static int rr_cmp(const void *a, const void *b)
{
    const rr_result *x = a, *y = b;
    return x->score < y->score ? 1 : x->score > y->score ? -1 : x->index - y->index;
}

static void rr_handle(http_request *r, void *user)
{
    const api_ctx *c = user;
    static const char *const allowed[] = { "query", "documents", "top_n", "return_documents", "model", NULL };
    if (!api_openai_auth(r)) return;
    api_error e = {0};
    emb_input *ins = NULL;
    rr_result *res = NULL;
    int n_in = 0;
    bytebuf b = {0};
    json_t *root = NULL;
    const char *name = NULL;
    bool ret_docs = false;
    if (!emb_body(r, allowed, &root, &name, &e) || api_json_bool(EMB_KIND, root, "return_documents", &ret_docs, &e) < 0)
        goto bad;
    if (!(c = emb_route(user, name, "Reranking is", &e))) {
        c = user;
        goto bad;
    }
    const char *tmpl = NULL;
    size_t tlen = 0;
    if (c->model->hp.pooling != MODEL_POOL_RANK || !c->model->cls_out ||
        !gguf_get_str(c->model->g, "tokenizer.chat_template.rerank", &tmpl, &tlen)) {
        api_error_set(&e, 400, "model", NULL, "This model cannot rerank: it is not a reranker GGUF (pooling_type rank, "
                      "a cls.output head and a tokenizer.chat_template.rerank prompt, as llama.cpp converts Qwen3-Reranker).");
        goto bad;
    }
    json_t *q = json_object_get(root, "query"), *docs = json_object_get(root, "documents");
    if (!json_is_string(q) || json_string_length(q) == 0) {
        api_json_bad(EMB_KIND, &e, "query", "a non-empty string", q);
        goto bad;
    }
    if (!json_is_array(docs) || json_array_size(docs) == 0 || json_array_size(docs) > EMBED_MAX_INPUTS) {
        api_json_bad(EMB_KIND, &e, "documents", "an array of 1 to 2048 strings", docs);
        goto bad;
    }
    n_in = (int)json_array_size(docs);
    long long top_n = n_in;
    if (api_json_int(EMB_KIND, root, "top_n", 1, 1 << 30, &top_n, &e) < 0) goto bad;
    ins = xcalloc((size_t)n_in, sizeof *ins);
    for (int i = 0; i < n_in; i++) {
        json_t *d = json_array_get(docs, (size_t)i);
        char path[48];
        api_path(path, sizeof path, "documents", NULL, i);
        if (!json_is_string(d)) {
            api_json_type_error(EMB_KIND, &e, path, "a string", d);
            goto bad;
        }
        if (!rr_prompt(c, tmpl, tlen, q, d, &ins[i])) {
            api_error_set(&e, 500, NULL, NULL, "The text could not be tokenised.");
            goto bad;
        }
        if (ins[i].n > api_ctx_max_input(c) || ins[i].n == 0) {
            api_error_set(&e, 400, path, "context_length_exceeded",
                          "This model's maximum context length is %d tokens, however the prompt of %s has %d tokens.",
                          api_ctx_max_input(c), path, ins[i].n);
            goto bad;
        }
    }
    int n_tokens = 0, rc = emb_run(c, r, ins, n_in, MODEL_POOL_LAST, "documents", &n_tokens, &e);
    if (rc == -1) goto bad;
    if (rc == -2) goto out;
    /* the head over the last token's state, softmax over its outputs: the first's probability
     * (Qwen3-Reranker's p("yes"), as llama.cpp's rank pooling gives it) */
    res = xcalloc((size_t)n_in, sizeof *res);
    const int dim = c->model->hp.dim, nc = c->model->n_cls_out;
    for (int i = 0; i < n_in; i++) {
        double lg[16], mx = -INFINITY, sum = 0;
        for (int k = 0; k < nc; k++) {
            double dot = 0;
            for (int d = 0; d < dim; d++) dot += (double)c->model->cls_out[(size_t)k * dim + d] * ins[i].v[d];
            lg[k] = dot;
            mx = fmax(mx, dot);
        }
        for (int k = 0; k < nc; k++) sum += exp(lg[k] - mx);
        res[i] = (rr_result){ .index = i, .score = exp(lg[0] - mx) / sum };
    }
    qsort(res, (size_t)n_in, sizeof *res, rr_cmp);
    bytebuf_puts(&b, "{\"object\":\"list\",\"model\":");
    api_buf_str(&b, c->model_name);
    bytebuf_puts(&b, ",\"results\":[");
    for (int i = 0; i < n_in && i < top_n; i++) {
        bytebuf_printf(&b, "%s{\"index\":%d,\"relevance_score\":%.9g", i ? "," : "", res[i].index, res[i].score);
        if (ret_docs) {
            bytebuf_puts(&b, ",\"document\":{\"text\":");
            json_t *d = json_array_get(docs, (size_t)res[i].index);
            api_buf_strn(&b, json_string_value(d), json_string_length(d));
            bytebuf_putc(&b, '}');
        }
        bytebuf_putc(&b, '}');
    }
    bytebuf_printf(&b, "],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", n_tokens, n_tokens);
    api_respond_buf(r, 200, &b);
    goto out;
bad:
    if (e.status != 499) api_respond_error(r, EMB_KIND, &e);
out:
    for (int i = 0; i < n_in && ins; i++) {
        if (ins[i].req) api_be_release(c, ins[i].req);
        free(ins[i].ids);
        free(ins[i].v);
    }
    free(ins);
    free(res);
    bytebuf_free(&b);
    json_decref(root);
}

void api_embed_register(http_server *h, api_ctx *c)
{
    http_route(h, "POST", "/v1/embeddings", emb_handle, c);
    http_route(h, "POST", "/v1/rerank", rr_handle, c);
    http_route(h, "POST", "/rerank", rr_handle, c);
}
