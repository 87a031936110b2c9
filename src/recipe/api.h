/*
 * api: what every HTTP API route of `tokenmill serve` shares: the serving context (the
 * scheduler, model, tokenizer, template, names and limits), the vendors' error shapes, and
 * the register functions that cmd_serve calls to add each API's routes.
 *
 * A route handler runs on its connection's thread (http.h). It parses the body with jansson,
 * builds the prompt token ids, calls sched_submit, and either waits for the FINISH record
 * (non-streaming) or answers with http_respond_stream whose pull function polls the request
 * (sched_poll with the timeout it is given), detokenises, and writes the API's own SSE
 * events; its done function calls sched_release (which cancels when still running, so a
 * disconnect frees the KV blocks at once). Stop strings are matched on this side; when one
 * matches, the handler calls sched_cancel and reports finish "stop".
 *
 * Errors: OpenAI routes answer {"error":{"message","type","param","code"}}, Anthropic routes
 * {"type":"error","error":{"type","message"}}; statuses: 400 invalid_request_error, 401
 * authentication_error, 404 not_found_error (unknown model), 413 request_too_large, 429
 * rate_limit_error (OpenAI, queue full) / 529 overloaded_error (Anthropic), 500 api_error,
 * 503 when shutting down.
 */
#ifndef TM_API_H
#define TM_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sched.h"
#include "http/http.h"
#include "model/model.h"

typedef struct tokenizer tokenizer;   /* recipe/tokenizer.h */
typedef struct template template;     /* recipe/template.h */

typedef struct {
    sched *sched;             /* the scheduler of the one engine */
    const model *model;       /* the loaded model (hparams, gguf metadata) */
    const tokenizer *tok;     /* its vocabulary */
    const template *tmpl;     /* chat template (NULL until recipe/template.h is wired) */
    const char *model_name;   /* id reported by /v1/models and accepted in "model" */
    const char *model_alias;  /* also accepted in "model" (the GGUF's general.name), or NULL */
    int n_ctx;                /* positions per sequence (prompt + completion) */
    int n_threads;            /* threads the handlers may use to tokenise long inputs */
    int64_t created;          /* unix seconds the server started ("created" fields) */
} api_ctx;

/* Routes of each API; cmd_serve calls every one that is linked in. */
void api_misc_register(http_server *h, api_ctx *c);          /* GET /v1/models, /health, /metrics */
void api_completions_register(http_server *h, api_ctx *c);   /* POST /v1/completions */
void api_chat_register(http_server *h, api_ctx *c);          /* POST /v1/chat/completions */
void api_responses_register(http_server *h, api_ctx *c);     /* POST /v1/responses */
void api_messages_register(http_server *h, api_ctx *c);      /* POST /v1/messages (+ count_tokens) */

/* The vendors' error bodies. param and code may be NULL (JSON null). */
void api_openai_error(http_request *r, int status, const char *type, const char *message,
                      const char *param, const char *code);
void api_anthropic_error(http_request *r, int status, const char *type, const char *message);
/* Checks the API key; on failure responds 401 in the route's shape and returns false. */
bool api_openai_auth(http_request *r);
bool api_anthropic_auth(http_request *r);
/* Maps a submit failure to the route's error response (429/529, 400 with the lengths, 503). */
void api_openai_submit_error(http_request *r, const api_ctx *c, sched_status st, int n_prompt, int max_tokens);
void api_anthropic_submit_error(http_request *r, const api_ctx *c, sched_status st, int n_prompt, int max_tokens);
/* True when the request's "model" may be served: NULL/empty, model_name or model_alias.
 * Otherwise the route answers 404 (not_found_error / model_not_found). */
bool api_model_ok(const api_ctx *c, const char *name);

/* Responds with a JSON value (takes the reference). */
struct json_t;
void api_respond_json(http_request *r, int status, struct json_t *v);
/* A JSON string of s[0..n) with invalid UTF-8 replaced by U+FFFD (jansson refuses it). */
struct json_t *api_json_text(const char *s, size_t n);
/* Appends "data: <compact JSON>\n\n" to b (takes the reference). */
void api_sse_json(http_buf *b, struct json_t *v);

/* Stop strings over generated text text[0..len): true when one occurs at or after byte
 * `from` (*cut = where the earliest starts: the answer ends there). Otherwise *safe = the
 * length that may be sent now: len minus the longest tail that is a prefix of a stop string.
 * `from` lets a caller search only new text: pass the previous len minus the longest stop's
 * length (clamped at 0). */
bool api_stop_find(const char *const *stops, int n_stops, const char *text, size_t len, size_t from,
                   size_t *cut, size_t *safe);
/* A fresh id "PREFIX" + 24 random hex digits (e.g. "cmpl-", "chatcmpl-", "msg_"). */
void api_new_id(char *out, size_t sz, const char *prefix);

#endif
