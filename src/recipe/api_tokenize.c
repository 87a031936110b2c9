/*
 * api_tokenize: POST /tokenize and POST /detokenize in llama.cpp server's shapes, so that
 * clients written for it (prompt budgeting, token-level tooling) work unchanged:
 *   /tokenize   {content, add_special = false, parse_special = true, with_pieces = false}
 *               -> {"tokens": [ids]} or, with_pieces, [{"id", "piece"}], a piece being a
 *               string when its bytes are valid UTF-8, else the list of its byte values;
 *               content may also be an array mixing strings and token ids (llama.cpp's
 *               "mixed" prompt: add_special applies to a leading string only);
 *   /detokenize {tokens: [ids]} -> {"content": the pieces' bytes, control tokens' text
 *               included, as llama.cpp's tokens_to_str writes them}.
 * Only the tokenizer is needed, so the gateway serves both from its own copy of the
 * vocabulary, never asking a worker. Errors are OpenAI's shape; ids outside the vocabulary
 * are a 400, not a crash or a silent skip.
 */
#include "recipe/api.h"
#include "recipe/api_int.h"

#include <stdlib.h>
#include <string.h>

#include "recipe/tokenizer.h"
#include "util/unicode.h"
#include "util/util.h"

/* Error shape and wording of the routes: OpenAI's (a raw-prompt route's). */
#define TOK_KIND API_KIND_COMPLETIONS

/* Appends the ids of text[0..len) to *ids (n, cap grow). False on a tokenizer failure. */
static bool tok_encode_append(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                              int32_t **ids, int32_t *n, int32_t *cap)
{
    for (;;) {
        int32_t room = *cap - *n;
        int32_t k = tokenizer_encode(t, text, len, add_special, parse_special, *ids + *n, room);
        if (k < 0) return false;
        if (k <= room) {
            *n += k;
            return true;
        }
        *cap = *n + k;
        *ids = xrealloc(*ids, (size_t)*cap * sizeof **ids);
    }
}

/* The one token id at v (path names it in errors), checked against the vocabulary. */
static bool tok_id_of(const tokenizer *t, json_t *v, const char *path, int32_t *out, api_error *e)
{
    if (!json_is_integer(v)) {
        api_json_type_error(TOK_KIND, e, path, "an integer", v);
        return false;
    }
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= tokenizer_n_vocab(t)) {
        api_json_value_error(TOK_KIND, e, path, "token id %lld is outside the vocabulary (0 to %d).", (long long)id,
                             (int)tokenizer_n_vocab(t) - 1);
        return false;
    }
    *out = (int32_t)id;
    return true;
}

/* Common start of both routes: the key, the body, the known fields, the model (*cp: the ctx
 * serving it). */
static json_t *tok_request(http_request *r, const api_ctx **cp, const char *const *allowed, api_error *e)
{
    if (!api_openai_auth(r)) return NULL;
    size_t len;
    const char *body = http_request_body(r, &len);
    json_t *root;
    if (!api_json_load(TOK_KIND, body, len, &root, e)) goto fail;
    const char *name = NULL;
    if (!api_json_known(TOK_KIND, root, allowed, "", e) || api_json_str(TOK_KIND, root, "model", &name, e) < 0) {
        json_decref(root);
        goto fail;
    }
    const api_ctx *to = api_ctx_route(*cp, name);
    if (!to) {
        api_error_set(e, 404, "model", "model_not_found", "The model '%.200s' does not exist.", name);
        json_decref(root);   /* after the message: name lives in root */
        goto fail;
    }
    *cp = to;
    return root;
fail:
    api_respond_error(r, TOK_KIND, e);
    return NULL;
}

static void tok_handle_tokenize(http_request *r, void *user)
{
    const api_ctx *c = user;
    static const char *const allowed[] = { "content", "add_special", "parse_special", "with_pieces", "model", NULL };
    api_error e = {0};
    json_t *root = tok_request(r, &c, allowed, &e);
    if (!root) return;
    bool add_special = false, parse_special = true, with_pieces = false;
    int32_t *ids = NULL, n = 0, cap = 0;
    bytebuf b = {0};
    json_t *content = json_object_get(root, "content");
    if (api_json_bool(TOK_KIND, root, "add_special", &add_special, &e) < 0 ||
        api_json_bool(TOK_KIND, root, "parse_special", &parse_special, &e) < 0 ||
        api_json_bool(TOK_KIND, root, "with_pieces", &with_pieces, &e) < 0)
        goto bad;
    if (json_is_string(content)) {
        cap = (int32_t)json_string_length(content) + 8;
        ids = xmalloc((size_t)cap * sizeof *ids);
        if (!tok_encode_append(c->tok, json_string_value(content), json_string_length(content), add_special,
                               parse_special, &ids, &n, &cap))
            goto fail;
    } else if (json_is_array(content)) {
        size_t i;
        json_t *v;
        json_array_foreach(content, i, v) {
            char path[48];
            api_path(path, sizeof path, "content", NULL, (int)i);
            if (json_is_string(v)) {
                if (!tok_encode_append(c->tok, json_string_value(v), json_string_length(v), add_special && i == 0,
                                       parse_special, &ids, &n, &cap))
                    goto fail;
                continue;
            }
            if (n == cap) {
                cap = cap * 2 + 16;
                ids = xrealloc(ids, (size_t)cap * sizeof *ids);
            }
            if (!json_is_integer(v)) {
                api_json_type_error(TOK_KIND, &e, path, "a string or a token id", v);
                goto bad;
            }
            if (!tok_id_of(c->tok, v, path, &ids[n], &e)) goto bad;
            n++;
        }
    } else {
        api_json_bad(TOK_KIND, &e, "content", "a string or an array of strings and token ids", content);
        goto bad;
    }

    bytebuf_puts(&b, "{\"tokens\":[");
    char small[256];
    for (int32_t i = 0; i < n; i++) {
        if (i) bytebuf_putc(&b, ',');
        if (!with_pieces) {
            bytebuf_printf(&b, "%d", ids[i]);
            continue;
        }
        /* the piece as llama.cpp's common_token_to_piece gives it: control tokens' text too */
        int k = tokenizer_token_to_piece(c->tok, ids[i], small, (int)sizeof small, true);
        char *p = small;
        if (k > (int)sizeof small) {
            p = xmalloc((size_t)k);
            k = tokenizer_token_to_piece(c->tok, ids[i], p, k, true);
        }
        if (k < 0) k = 0;
        bytebuf_printf(&b, "{\"id\":%d,\"piece\":", ids[i]);
        if (unicode_utf8_valid(p, (size_t)k)) api_buf_strn(&b, p, (size_t)k);
        else {
            bytebuf_putc(&b, '[');
            for (int j = 0; j < k; j++) bytebuf_printf(&b, "%s%u", j ? "," : "", (unsigned)(unsigned char)p[j]);
            bytebuf_putc(&b, ']');
        }
        bytebuf_putc(&b, '}');
        if (p != small) free(p);
    }
    bytebuf_puts(&b, "]}");
    api_respond_buf(r, 200, &b);
    goto out;
fail:
    api_error_set(&e, 500, NULL, NULL, "The text could not be tokenised.");
bad:
    api_respond_error(r, TOK_KIND, &e);
out:
    bytebuf_free(&b);
    free(ids);
    json_decref(root);
}

static void tok_handle_detokenize(http_request *r, void *user)
{
    const api_ctx *c = user;
    static const char *const allowed[] = { "tokens", "model", NULL };
    api_error e = {0};
    json_t *root = tok_request(r, &c, allowed, &e);
    if (!root) return;
    bytebuf text = {0}, b = {0};
    json_t *tokens = json_object_get(root, "tokens");
    if (!json_is_array(tokens)) {
        api_json_bad(TOK_KIND, &e, "tokens", "an array of token ids", tokens);
        goto bad;
    }
    size_t i;
    json_t *v;
    json_array_foreach(tokens, i, v) {
        char path[48];
        int32_t id;
        if (!tok_id_of(c->tok, v, api_path(path, sizeof path, "tokens", NULL, (int)i), &id, &e)) goto bad;
        /* every piece whole, with control tokens' text, as llama.cpp's tokens_to_str */
        int k = tokenizer_token_to_piece(c->tok, id, NULL, 0, true);
        if (k <= 0) continue;
        bytebuf_reserve(&text, (size_t)k);
        text.len += (size_t)tokenizer_token_to_piece(c->tok, id, text.p + text.len, k, true);
    }
    bytebuf_puts(&b, "{\"content\":");
    api_buf_strn(&b, text.p ? text.p : "", text.len);
    bytebuf_putc(&b, '}');
    api_respond_buf(r, 200, &b);
    goto out;
bad:
    api_respond_error(r, TOK_KIND, &e);
out:
    bytebuf_free(&text);
    bytebuf_free(&b);
    json_decref(root);
}

void api_tokenize_register(http_server *h, api_ctx *c)
{
    http_route(h, "POST", "/tokenize", tok_handle_tokenize, c);
    http_route(h, "POST", "/detokenize", tok_handle_detokenize, c);
}
