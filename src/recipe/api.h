/*
 * api: what the four generating APIs (OpenAI Chat Completions in api_chat.c, OpenAI
 * Completions in api_completions.c, OpenAI Responses in api_responses.c, Anthropic Messages
 * in api_messages.c) share.
 *
 * DESIGN. A request goes through three pure stages that know no socket and no engine, so
 * that the unit tests drive them with strings:
 *   1. parse (api_json.c and each API's parser): JSON body -> api_req (the shared conv or
 *      raw prompt, sampling parameters, limits, flags). The body is bounded where it enters
 *      (nesting depth and value count, jsonfmt_scan) before anything recursive reads it.
 *      Every rejection is an api_error carrying the HTTP status and the vendor's fields;
 *      api_error_json writes it in the route's shape ({"error":{...}} for OpenAI routes,
 *      {"type":"error","error":{...}} for Anthropic).
 *   2. output (api_out.c and each API's formatter): api_out turns generated tokens back into
 *      the vendor's JSON. Per choice it owns the output splitter (events.h) and the
 *      stop-sequence matcher (api_stop: answer text is held back while it may still be the
 *      start of a stop sequence, and cut at the first match). It accumulates the answer
 *      (text, reasoning, tool calls) for the final body and, when streaming, appends the
 *      vendor's SSE events to `out` as soon as they are decided. The caller drains `out` to
 *      the connection. All JSON is written with jsonfmt, whose strings are always valid UTF-8.
 *   3. serve (api.c): the routes, the API key check, the prompt (chat template or raw), the
 *      context-length check, the token loop (see SERVING below). One path, api_serve, for
 *      all four APIs.
 * The API-specific parts are each API's api_format (its parser and formatter, declared at
 * the end), one table in each of api_chat.c, api_completions.c, api_responses.c and
 * api_messages.c; api_parse and api_out reach them through api_format_of.
 *
 * Memory: an api_req owns its conv and strings (api_req_free); an api_out owns its buffers
 * (api_out_free). Neither is shared between threads.
 *
 * SERVING: what every HTTP API route of `tokenmill serve` (and of the gateway) shares: the
 * serving context (the scheduler or a remote backend, model, tokenizer, template, names and
 * limits), the vendors' error shapes, and the register functions that cmd_serve calls to add
 * each API's routes.
 *
 * A route handler runs on its connection's thread (http.h), whose stack is small: nothing on
 * it recurses deeper than JSONFMT_MAX_DEPTH. It parses the body, builds the prompt token ids,
 * detokenises with api_detok (valid UTF-8 before anything else sees the text), calls
 * sched_submit, and either waits for the FINISH record
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
 * 503 (Anthropic: overloaded_error) with Retry-After when the scheduler refuses new work
 * (draining: see sched_drain).
 *
 * A request the stopping server cuts short (SCHED_FINISH_ABORTED) still ends properly:
 * OpenAI shapes finish with "length" (Responses: response.incomplete), Messages with an
 * overloaded_error (the SSE error event; non-streaming, a 503).
 */
#ifndef TM_API_H
#define TM_API_H

#include <stdbool.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/gc.h"
#include "engine/sched.h"
#include "grammar/grammar.h"
#include "http/http.h"
#include "model/model.h"

typedef struct tokenizer tokenizer;   /* recipe/tokenizer.h */
typedef struct template template;     /* recipe/template.h */
typedef struct threadpool threadpool; /* util/threadpool.h */

/* BACKEND: where the routes run their requests. api_ctx.backend NULL is the local scheduler
 * (api_ctx.sched, the one-process `tokenmill serve`); the gateway (cluster/gateway.h) gives its
 * own, which runs the same calls on remote workers. The calls have sched.h's meaning and
 * types; handles are opaque to the routes, so a backend may return its own type cast to
 * sched_req *. metrics (may be NULL) appends the backend's Prometheus lines to /metrics. */
typedef struct api_backend {
    void *ud;                 /* the backend's state, passed to every call */
    sched_status (*submit)(void *ud, const sched_params *p, sched_req **out);
    int (*poll)(void *ud, sched_req *r, sched_output *out, int max, int timeout_ms);
    void (*cancel)(void *ud, sched_req *r);
    void (*release)(void *ud, sched_req *r);
    void (*metrics)(void *ud, bytebuf *b);
    /* status (may be NULL) appends the status page's HTML block on the backend's workers
     * (up by role, capacity advice, resumed requests); role_text is its one-line answer on
     * the division of labour. */
    void (*status)(void *ud, bytebuf *b);
    const char *role_text;
    bool (*draining)(void *ud);   /* (may be NULL) true once it refuses new requests to stop:
                               * /health answers 503 "draining" */
    bool (*done)(void *ud, sched_req *r);   /* sched_done's meaning (may be NULL without embedding) */
    /* sched_embedding's meaning (NULL: the backend runs no embeddings, and the embedding and
     * rerank routes answer 501) */
    const float *(*embedding)(void *ud, sched_req *r);
    /* (may be NULL) the longest prompt the backend takes now when that is less than the
     * context (a gateway's encoder: its workers' smallest step), 0 when the context bounds */
    int (*max_input)(void *ud);
} api_backend;

/* SEVERAL MODELS: `serve -m a=A.gguf -m b=B.gguf` makes one api_ctx per model (each its own
 * scheduler, engine and KV pool); every ctx's `all` lists them all, all[0] the default (a
 * request naming no model). Routes are registered once, with all[0]; each handler routes the
 * request by its "model" field (api_ctx_route / api_ctx_of_body) before anything else reads
 * the ctx, so an unknown name meets the route's own 404. */
#define API_MAX_MODELS 8      /* models one server serves */
typedef struct api_ctx {
    sched *sched;             /* the scheduler of the one engine */
    const model *model;       /* the loaded model (hparams, gguf metadata) */
    const tokenizer *tok;     /* its vocabulary */
    const template *tmpl;     /* chat template (NULL until recipe/template.h is wired) */
    const char *model_name;   /* id reported by /v1/models and accepted in "model" */
    const char *model_alias;  /* also accepted in "model" (the GGUF's general.name), or NULL */
    int n_ctx;                /* positions per sequence (prompt + completion) */
    threadpool *tok_pool;     /* the pool the handlers share to tokenise long inputs (one at
                               * a time; the others alone), or NULL */
    int64_t created;          /* unix seconds the server started ("created" fields) */
    const gc_retention *retention; /* the block store's traffic classes (--retention over the
                                    * defaults), which cache_class may name; NULL: defaults */
    const api_backend *backend; /* NULL: requests run on sched; else on this backend (sched NULL) */
    bool metrics_public;      /* /metrics without the API key (--metrics-public) */
    grammar_cache *gcache;    /* compiled structured-output grammars; NULL: such requests are
                               * refused (400) */
    const grammar_vocab *gvocab; /* the tokenizer's token bytes (tokenizer_grammar_vocab) */
    struct status_ring *status; /* the status page's per-minute ring (recipe/status.h), or NULL:
                               * finished requests are noted there; GET / and /status draw it */
    struct store *store;      /* the block store, for the page (NULL: none) */
    uint64_t store_capacity;  /* its per-target capacity in bytes (0: unlimited) */
    double cost_per_hour;     /* --cost-per-hour: the machine's price per hour (0: not shown) */
    const struct status_curve *curve; /* --curves: the measured decode curve the page shows, or NULL */
    _Atomic bool loading;     /* the weights are still being faulted in: /health answers 503
                               * "loading" (requests are served, slower) until it is cleared */
    struct api_ctx *const *all; /* (n_all) every model's ctx of this server, all[0] the default;
                               * NULL (n_all 0): this one only */
    int n_all;
} api_ctx;

/* Token ids a request may name: the tokenizer's and the model's output rows both. */
int api_ctx_n_vocab(const api_ctx *c);
/* The longest prompt an embedding may have: within the context (n_ctx - 1), and within what
 * the backend takes now (api_backend.max_input). */
int api_ctx_max_input(const api_ctx *c);
/* The routes' calls into the backend: c->backend's, or sched_submit/poll/cancel/release. */
sched_status api_be_submit(const api_ctx *c, const sched_params *p, sched_req **out);
int api_be_poll(const api_ctx *c, sched_req *r, sched_output *out, int max, int timeout_ms);
void api_be_cancel(const api_ctx *c, sched_req *r);
void api_be_release(const api_ctx *c, sched_req *r);
bool api_be_done(const api_ctx *c, sched_req *r);
const float *api_be_embedding(const api_ctx *c, sched_req *r);

/* Routes of each API; cmd_serve calls every one that is linked in. */
void api_misc_register(http_server *h, api_ctx *c);          /* GET /v1/models, /health, /metrics, / and /status */
void api_completions_register(http_server *h, api_ctx *c);   /* POST /v1/completions */
void api_chat_register(http_server *h, api_ctx *c);          /* POST /v1/chat/completions */
void api_responses_register(http_server *h, api_ctx *c);     /* POST /v1/responses */
void api_messages_register(http_server *h, api_ctx *c);      /* POST /v1/messages (+ count_tokens) */
void api_tokenize_register(http_server *h, api_ctx *c);      /* POST /tokenize, /detokenize (llama.cpp's) */
void api_embed_register(http_server *h, api_ctx *c);         /* POST /v1/embeddings, /v1/rerank, /rerank */

/* The vendors' error bodies. param and code may be NULL (JSON null). */
void api_openai_error(http_request *r, int status, const char *type, const char *message,
                      const char *param, const char *code);
void api_anthropic_error(http_request *r, int status, const char *type, const char *message);
/* Checks the API key; on failure responds 401 in the route's shape and returns false. */
bool api_openai_auth(http_request *r);
bool api_anthropic_auth(http_request *r);
/* Maps a submit failure to the route's error response (429/529, 400 with the lengths, 503).
 * prompt_param: the request field that holds the prompt ("messages", "input", "prompt"), the
 * param of a context-length error. */
void api_openai_submit_error(http_request *r, const api_ctx *c, sched_status st, int n_prompt, int max_tokens,
                             const char *prompt_param);
void api_anthropic_submit_error(http_request *r, const api_ctx *c, sched_status st, int n_prompt, int max_tokens);
/* True when the request's "model" may be served: NULL/empty, model_name or model_alias.
 * Otherwise the route answers 404 (not_found_error / model_not_found). */
bool api_model_ok(const api_ctx *c, const char *name);
/* The ctx serving the model `name` among c->all (NULL/empty: all[0]; exact names before
 * aliases), or NULL when none does. With one model, c itself when api_model_ok. */
const api_ctx *api_ctx_route(const api_ctx *c, const char *name);
/* The ctx for a request body: the one its top-level "model" names, else c (a body that does
 * not parse or names no served model goes on to c's own checks, which answer it in the
 * route's shape). Parses the body only when c serves several models. */
const api_ctx *api_ctx_of_body(const api_ctx *c, const char *body, size_t len);

/* One Prometheus metric without labels (HELP, TYPE counter|gauge, value), for /metrics of the
 * server and of the gateway. */
void api_metric(bytebuf *b, const char *name, const char *type, const char *help, double v);
/* One histogram in the Prometheus text format (cumulative buckets, _sum, _count). */
void api_metric_hist(bytebuf *b, const char *name, const char *help, const sched_hist *h);

/* Stop strings over generated text text[0..len): true when one occurs at or after byte
 * `from` (*cut = where the earliest starts: the answer ends there). Otherwise *safe = the
 * length that may be sent now: len minus the longest tail that is a prefix of a stop string.
 * `from` lets a caller search only new text: pass the previous len minus the longest stop's
 * length (clamped at 0). */
bool api_stop_find(const char *const *stops, int n_stops, const char *text, size_t len, size_t from,
                   size_t *cut, size_t *safe);
/* A fresh id "PREFIX" + 24 random hex digits (e.g. "cmpl-", "chatcmpl-", "msg_"). */
void api_new_id(char *out, size_t sz, const char *prefix);
/* The names a served model answers to: the default id is the file name without its .gguf
 * (malloc'd; the caller frees it), the alias the GGUF's general.name copied into buf (NULL
 * when absent or longer than cap - 1). Shared by `serve` and `gateway`. */
char *api_model_default_name(const char *path);
const char *api_model_alias(const model *m, char *buf, size_t cap);


/* ======================================================================== the generating APIs */



#include "engine/sample.h"
#include "recipe/conv.h"
#include "recipe/events.h"
#include "util/jsonfmt.h"
#include "recipe/tokenizer.h"

#define API_MAX_STOP 16       /* stop sequences per request */
#define API_MAX_N 16          /* choices per chat completion */
#define API_MAX_TOP_LOGPROBS 20

typedef enum {
    API_KIND_CHAT = 0,        /* POST /v1/chat/completions */
    API_KIND_RESPONSES,       /* POST /v1/responses */
    API_KIND_MESSAGES,        /* POST /v1/messages (and count_tokens) */
    API_KIND_COMPLETIONS,     /* POST /v1/completions (OpenAI's shapes, a raw prompt) */
} api_kind;

/* tool_choice, the vendors' values mapped to one set. */
typedef enum {
    API_TOOLS_AUTO = 0,       /* the model decides (OpenAI "auto", Anthropic {type: auto}) */
    API_TOOLS_NONE,           /* no call (the tools are not shown and no call is reported) */
    API_TOOLS_REQUIRED,       /* exactly one call of any offered tool ("required", {type: any}) */
    API_TOOLS_NAMED,          /* exactly one call of api_req.tool_name */
} api_tools_mode;

typedef enum {
    API_OK = 0,
    API_ERR,                  /* the request is rejected; see the api_error */
} api_status;

/* A rejection, in the fields both vendors' shapes are built from. */
typedef struct {
    int status;               /* HTTP status: 400, 401, 404, 413, 429, 500, 529 */
    char type[40];            /* OpenAI error.type / Anthropic error.type */
    char param[64];           /* OpenAI error.param ("" = null) */
    char code[40];            /* OpenAI error.code ("" = null) */
    char message[512];        /* human-readable, names the offending field */
} api_error;

/* Fills e (status, OpenAI type/code chosen from the status; param may be NULL). */
void api_error_set(api_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Appends the error body in kind's vendor shape. For Anthropic the type is mapped from the
 * status (400 invalid_request_error, 401 authentication_error, 403 permission_error, 404
 * not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error, 529
 * overloaded_error). */
void api_error_json(api_kind kind, const api_error *e, bytebuf *out);
/* Responds with a JSON body b (application/json). */
void api_respond_buf(http_request *r, int status, const bytebuf *b);
/* Responds with e's status and body in kind's vendor shape. */
void api_respond_error(http_request *r, api_kind kind, const api_error *e);

/* Server facts the parsers check against. */
typedef struct {
    const char *model_name;   /* the name requests must use ("model"); NULL accepts any */
    const char *model_alias;  /* a second accepted name (e.g. the GGUF file name), or NULL */
    struct api_store *store;  /* Responses kept for previous_response_id, or NULL */
    int n_vocab;              /* token ids a request may name (logit_bias); 0: not checked */
} api_cfg;

/* One parsed request. */
typedef struct {
    api_kind kind;
    conv conv;                    /* the conversation to render (tools included) */
    sample_params sp;             /* temperature, top_p, top_k, min_p, penalties, seed */
    bool seed_given;              /* the client gave a seed (else sp.seed is fresh per request) */
    int max_tokens;               /* generated tokens at most; -1: until the context is full */
    int n;                        /* choices (chat `n`), 1..API_MAX_N */
    char *stop[API_MAX_STOP];     /* stop sequences (owned, NUL-terminated, non-empty) */
    int n_stop;
    bool stream;                  /* SSE response */
    bool include_usage;           /* chat: stream_options.include_usage */
    bool logprobs;                /* chat: return log-probabilities of the output tokens */
    int top_logprobs;             /* chat: alternatives per token, 0..API_MAX_TOP_LOGPROBS */
    bool return_token_ids;        /* extension: echo prompt (and output) token ids */
    char *model;                  /* the model name as requested (owned) */
    char *instructions;           /* responses: `instructions` (owned, NULL if none) */
    char *previous_response_id;   /* responses: as requested (owned, NULL if none) */
    bool store;                   /* responses: keep the response for previous_response_id */
    struct api_store *store_to;   /* responses: where to keep it (cfg->store when store), or NULL */
    int n_prev_turns;             /* responses: turns that came from the previous response */
    int thinking_budget;          /* messages, chat (extension): thinking.budget_tokens, the most
                                   * reasoning tokens (0: no limit); enforced by the scheduler */
    char *tools_json;             /* responses: the request's tools array, echoed (owned) */
    char *metadata_json;          /* responses: metadata object, echoed (owned) */
    char *format_json;            /* responses: text.format, echoed (owned; NULL: text) */
    double temperature_echo;      /* responses: the temperature as the response echoes it */
    double top_p_echo;            /* responses: top_p echoed */
    char *cache_salt;             /* extension (vLLM): tenant salt of the cached blocks (owned, NULL if none) */
    char *cache_class;            /* extension: traffic class of the cached blocks (owned, NULL if none) */
    char *user;                   /* the end user's id (`user`), echoed nowhere (owned, NULL if none) */
    char *prompt_text;            /* completions: the prompt as text (owned; NULL when given as ids) */
    size_t prompt_len;            /* its bytes */
    int32_t *prompt_ids;          /* completions: (n_prompt_ids) the prompt as token ids (owned) */
    int n_prompt_ids;
    bool ignore_eos;              /* completions (extension): do not stop at the end-of-text token */
    /* Structured output: the format the answer (after any reasoning) must follow, compiled by
     * api_serve through the grammar cache before submission (see STRUCTURED OUTPUT below). */
    int fmt_kind;                 /* grammar_kind of fmt_src, -1 when unconstrained */
    char *fmt_src;                /* the schema / regex / GBNF text (owned; NULL for the JSON kind) */
    size_t fmt_len;               /* bytes of fmt_src */
    char fmt_param[48];           /* the request field it came from (param of a 400) */
    api_tools_mode tools_mode;    /* tool_choice */
    char *tool_name;              /* NAMED: the tool that must be called (owned) */
    bool one_call;                /* at most one call per answer (parallel_tool_calls false,
                                     Anthropic disable_parallel_tool_use) */
} api_req;

void api_req_init(api_req *r, api_kind kind);
void api_req_free(api_req *r);

/* Parses a request body of the route. On API_ERR *e is filled and r holds nothing useful
 * (api_req_free it anyway). The body need not be NUL-terminated. */
api_status api_chat_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e);
api_status api_responses_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e);
api_status api_messages_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e);
/* /v1/messages/count_tokens: the same fields as a message request minus the sampling ones;
 * max_tokens is not required. */
api_status api_messages_count_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e);
/* /v1/completions: prompt (a string, a one-string array or token ids below cfg->n_vocab),
 * max_tokens (default 16, 0 allowed), logprobs N (top N alternatives, 0..5), the sampling
 * fields, stop (at most 4), n, stream(+options), ignore_eos; echo, suffix and best_of != n
 * are refused. */
api_status api_completions_parse(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e);
api_status api_parse(const api_cfg *cfg, api_kind kind, const char *body, size_t len, api_req *r, api_error *e);

/* STRUCTURED OUTPUT. response_format / text.format (json_object, json_schema), the vLLM and
 * llama.cpp extensions (guided_json, guided_regex, guided_choice, guided_grammar, json_schema,
 * grammar) and forced tool calls all become one grammar per request. A forced call (tool_choice
 * required / any / a named tool) is written in the model family's own call syntax, its control
 * tokens as token terminals (so the splitter, events.h, sees them by id), with the arguments
 * bound by each tool's schema:
 *   QWEN      <tool_call>\n{"name": N, "arguments": ARGS}\n</tool_call>;
 *   LLAMA3    {"name": N, "parameters": ARGS} (the family has no marker token);
 *   DEEPSEEK  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>
 *             <｜tool▁calls▁end｜> (V3.1's form).
 * Strict tools under tool_choice auto: the answer is free until the model writes the token
 * that opens calls (the trigger: <tool_call>, <｜tool▁calls▁begin｜>), then the call is bound
 * (strict tools by their schema, the others to a JSON object) until it closes. LLAMA3 has no
 * such token, so its auto calls stay free. With a response format and tools under auto, the
 * answer is either a document of the format or (from the trigger) a call.
 *   HARMONY   a call forced to one tool (named, or required with one tool offered) is opened
 *             by the prompt itself (conv.forced_call: the template writes the call's header),
 *             so the grammar is that tool's arguments alone and the splitter starts inside
 *             the call. Required / any with several tools: the analysis is free up to its
 *             <|end|>, then <|start|>assistant<|channel|>commentary to=functions.N
 *             <|constrain|>json<|message|>ARGS<|call|>. Strict tools under auto: the trigger
 *             is <|start|> (no token opens calls alone) and the grammar binds the message it
 *             opens, a call or a free message. With a response format the format alone binds.
 * parallel_tool_calls false (api_req.one_call): DEEPSEEK's block holds one call, and a lazy
 * grammar ends in free text where no call marker is allowed, so the answer has one call. */

/* The GBNF text of the calls for the family of mk over c's tools (only the tool named `only`
 * when not NULL). lazy = false: a forced call, the whole answer, every tool bound by its
 * schema; lazy = true: what follows *trigger, the family's call-opening token (strict tools
 * bound by their schema, the others to a JSON object). one: at most one call (see above). malloc'd, or NULL with a message in err
 * (a tool's schema refused), or NULL and err "" (the family has no call syntax, lacks one of
 * its tokens, or has no opening token for a lazy grammar). *trigger: the opening token, -1 if
 * none. */
char *api_tool_gbnf(const conv *c, const events_markers *mk, const char *only, bool lazy, bool one, int32_t *trigger,
                    char *err, size_t errsz);

/* A response format (kind, src[0..len): api_req.fmt_*) that the answer may take, or else a
 * call of c's tools opened by the family's call-opening token (tool_choice auto with a format):
 *   root ::= f-root | <[trigger]> c-root
 * (the format's rules prefixed f-, the lazy call grammar's c-). malloc'd; NULL and err "" when
 * the family has no opening token (the format alone binds the answer), NULL with err set when
 * a tool's schema or the format is refused. */
char *api_format_calls_gbnf(const conv *c, const events_markers *mk, int kind, const char *src, size_t len, bool one,
                            char *err, size_t errsz);

/* Token figures of a finished response (summed over choices). */
typedef struct {
    int prompt_tokens;        /* all prompt tokens (per choice: the same prompt) */
    int cached_tokens;        /* prompt tokens whose KV came from a cache tier */
    int completion_tokens;    /* generated tokens, all choices */
    int reasoning_tokens;     /* of those, inside a think block */
    int accepted_drafts;      /* of those, speculative drafts verified and kept (OpenAI's
                               * accepted_prediction_tokens) */
    int rejected_drafts;      /* drafted tokens verified and rejected (rejected_prediction_tokens) */
} api_usage;

/* Stop-sequence matcher over streamed text. */
typedef struct {
    char *const *stop;        /* n_stop sequences (borrowed) */
    int n_stop;
    bytebuf hold;         /* text not yet released: it may start a stop sequence */
    int matched;              /* index of the matched sequence, -1 while none */
} api_stop;

void api_stop_init(api_stop *s, char *const *stop, int n_stop);
void api_stop_free(api_stop *s);
/* Feeds text. Appends to `emit` the text that can be released now; returns true when a stop
 * sequence matched (emit then ends right before it; later text must not be fed). */
bool api_stop_feed(api_stop *s, const char *text, size_t len, bytebuf *emit);
/* End of output: releases what is held (no match can complete any more). */
void api_stop_flush(api_stop *s, bytebuf *emit);

/* One output token's log-probability, for chat `logprobs`. */
typedef struct {
    int32_t token;            /* the chosen token */
    float logprob;            /* its log-probability */
    int n_top;                /* alternatives in top_token/top_logprob */
    int32_t top_token[API_MAX_TOP_LOGPROBS];
    float top_logprob[API_MAX_TOP_LOGPROBS];
} api_logprob;

/* Renders a token id as text for logprobs (the caller's detokenizer); returns the bytes
 * written (at most cap). */
typedef size_t (*api_piece_fn)(void *ud, int32_t token, char *buf, size_t cap);

typedef struct {
    char text[64];            /* the token's raw bytes (cut at 64), maybe not UTF-8 on their own:
                               * `bytes` gets them as they are, `token` repaired (U+FFFD) */
    uint8_t len;              /* bytes of text */
    size_t offset;            /* bytes of the choice's text before this token (completions) */
    float logprob;
    int n_top;
    char top_text[API_MAX_TOP_LOGPROBS][64]; /* as text, per alternative */
    uint8_t top_len[API_MAX_TOP_LOGPROBS];
    float top_logprob[API_MAX_TOP_LOGPROBS];
} api_lp_entry;

/* One piece of an answer, in output order: a run of text, a run of reasoning, or a tool
 * call. Responses' output items and Anthropic's content blocks are these. */
typedef enum { API_ITEM_TEXT = 0, API_ITEM_REASONING, API_ITEM_TOOL } api_item_kind;

typedef struct {
    api_item_kind kind;
    char id[48];              /* vendor id set by the formatter at OPEN (msg_/rs_/fc_/toolu_) */
    char call_id[40];         /* TOOL: the splitter's "call_..." id */
    char *name;               /* TOOL: function name (owned) */
    bytebuf text;         /* TEXT/REASONING: the text; TOOL: the arguments JSON */
    int tool_index;           /* TOOL: 0-based index among the answer's calls */
    bool cut;                 /* the token limit ended the answer inside this item */
} api_item;

/* What api_out tells a formatter. */
typedef enum {
    API_OP_OPEN = 0,          /* a new item starts (it->text empty) */
    API_OP_DELTA,             /* text appended to the open item: d/len */
    API_OP_CLOSE,             /* the item is complete */
    API_OP_FINISH,            /* the choice ended (c->finish, c->stop_index set) */
} api_op;

/* Per-choice output state. */
typedef struct {
    struct api_out *owner;    /* back pointer for the splitter callback */
    int index;                /* this choice's index */
    events *ev;               /* the output splitter */
    api_stop stop;            /* stop matcher on answer text */
    bytebuf emit;         /* scratch: text released by the stop matcher */
    api_item *items;          /* n_items items in output order */
    int n_items, cap_items;
    bool open;                /* the last item is still open */
    int n_calls;              /* tool calls */
    bool stopped;             /* a stop sequence matched: ignore further output */
    bool finished;            /* FINISH seen */
    bool ending_cut;          /* the token limit is ending the output: an item closed now was cut */
    events_finish_reason finish;
    int stop_index;           /* the stop sequence that matched, -1 if none */
    size_t n_fed;             /* bytes of text fed to the splitter so far */
    int n_tokens;             /* tokens generated */
    int n_reasoning_tokens;   /* of those, inside a think block (markers included) */
    int n_accepted_drafts;    /* speculation: drafted tokens verified and kept (api_out_set_drafts) */
    int n_rejected_drafts;    /* and rejected */
    bool in_think;            /* token-level: inside a think block */
    int32_t think_start;      /* marker ids for the count above (-1 none) */
    int32_t think_end;
    int32_t *token_ids;       /* generated ids (return_token_ids) */
    int n_token_ids, cap_token_ids;
    api_lp_entry *lps;        /* logprob entries (chat logprobs) */
    int n_lps, cap_lps;
    int n_lps_sent;           /* entries already streamed */
    int n_blocks;             /* formatter: blocks/items announced so far */
} api_choice;

typedef struct api_out {
    api_kind kind;
    const struct api_format *fmt; /* the route's formatter (api_format_of(kind)) */
    const api_req *req;       /* borrowed; must outlive the api_out */
    char id[48];              /* chatcmpl-… / resp_… / msg_… / cmpl-… */
    char fingerprint[24];     /* system_fingerprint (completions): "fp_" + the model's, or "" */
    int64_t created;          /* unix seconds */
    const char *model;        /* name echoed in responses (borrowed) */
    api_choice *choices;      /* n_choices (= req->n) choices */
    int n_choices;
    api_usage usage;          /* prompt figures from api_out_set_prompt; output ones at end */
    const int32_t *prompt_ids;/* for return_token_ids (borrowed, may be NULL) */
    int n_prompt_ids;
    int seq;                  /* responses: next sequence_number */
    api_piece_fn piece;       /* logprob token text (NULL: logprobs carry no text) */
    void *piece_ud;
    bytebuf out;          /* bytes ready for the client (SSE events, or the final body) */
} api_out;

/* Prepares the output of req: markers for the splitter, a seed for tool-call ids, the model
 * name to echo. */
void api_out_init(api_out *o, const api_req *req, const events_markers *m, uint64_t seed, const char *model_name);
void api_out_free(api_out *o);
/* The prompt's figures, known after prefill (or before it: cached tokens 0). */
void api_out_set_prompt(api_out *o, int prompt_tokens, int cached_tokens, const int32_t *ids, int n_ids);
/* Choice i's speculative drafts, verified and accepted or rejected (its FINISH record's). */
void api_out_set_drafts(api_out *o, int i, int accepted, int rejected);
/* Streaming: the opening events (chat: nothing until the first delta; responses:
 * response.created + in_progress; messages: message_start + ping, whose usage is the one set
 * by api_out_set_prompt: api_serve calls it for Messages once the first record is in). */
void api_out_begin(api_out *o);
/* One generated token of choice i with its detokenized text; lp may be NULL. Returns true
 * when a stop sequence matched: generation of that choice must stop (then api_out_finish). */
bool api_out_token(api_out *o, int i, int32_t token, const char *text, size_t len, const api_logprob *lp);
/* Choice i ended: reason LENGTH when the token limit was hit, STOP otherwise (end of turn or
 * a stop sequence; TOOL_CALLS is decided here). */
void api_out_finish(api_out *o, int i, events_finish_reason reason);
/* All choices finished: the closing events (streaming) or the whole body (non-streaming). */
void api_out_end(api_out *o);
/* Text that belongs to no token (the detokenizer's held-back bytes at the end). */
void api_out_text(api_out *o, int i, const char *text, size_t len);
/* A generated token that is not fed (the end-of-turn token): counted in usage only. */
void api_out_count_token(api_out *o, int i);
/* The response status as Responses reports it, and whether any choice hit the limit. */
bool api_out_truncated(const api_out *o);

/* Responses kept in memory for previous_response_id: a bounded map id -> conversation
 * (input turns plus the answer turn), oldest dropped first. Thread-safe. */
typedef struct api_store api_store;
api_store *api_store_new(int max_entries);
void api_store_free(api_store *s);
/* Keeps a copy of req's conversation (without the instructions turn) plus o's answer. */
void api_store_put(api_store *s, const char *id, const api_req *req, const api_out *o);
/* Appends the stored turns of id to c; false when id is unknown. */
bool api_store_get(api_store *s, const char *id, conv *c);

/* TENANCY: a request's place in the block cache (src/cache). Blocks are keyed with a salt
 * made from the request's `cache_salt` field and, when the server has API keys, the identity of
 * the key the request carries (SHA-256 of it; the key itself goes nowhere), so that tenants
 * never share cached blocks (a hit is a timing side channel). The traffic class (retention TTL
 * of its blocks) comes from the `cache_class` field, else the `x-cache-class` header, else the
 * default class ("chat"). */
#define API_SALT_CAP 65
typedef struct {
    char salt[API_SALT_CAP];  /* sched_params.cache_salt: "" (no salt: no key, no cache_salt) or
                               * 64 hex digits of SHA-256 over the key identity and cache_salt */
    int cls;                  /* sched_params.cache_class (index into the retention classes) */
} api_tenancy;

/* Fills t for request r from its cache_salt and cache_class fields (NULL when absent; "" is
 * absent), the x-cache-class header and its API key. False with e filled (400, param
 * cache_class, code invalid_value) when the class is not one of c->retention's names. */
bool api_tenancy_of(http_request *r, const api_ctx *c, const char *cache_salt, const char *cache_class,
                    api_tenancy *t, api_error *e);

/* Serves one request of a chat route: auth, parse, template, context check, submit (n
 * choices), then the JSON answer or the SSE stream (see SERVING above). count_only: the
 * Anthropic count_tokens route. store: where Responses are kept (NULL for the others). */
void api_serve(http_request *r, const api_ctx *c, api_kind kind, bool count_only, api_store *store);

/* ---- helpers shared by the three files ---- */
/* Appends a JSON string literal (NULL -> null). */
void api_buf_str(bytebuf *b, const char *s);
void api_buf_strn(bytebuf *b, const char *s, size_t len);
/* Appends an SSE event: "event: NAME\n" (when name) + "data: JSON\n\n". */
void api_sse(bytebuf *b, const char *name, const char *json, size_t len);
/* Appends OpenAI's end of stream: "data: [DONE]". */
void api_sse_done(bytebuf *b);
/* Appends the SSE event "event: TYPE" with data {"type":TYPE[,"sequence_number":seq],FIELDS}
 * (fields: members without braces, may be empty; seq < 0: no sequence_number). */
void api_sse_typed(bytebuf *b, const char *type, int seq, const char *fields, size_t flen);
/* The client's text of one generated token, or with token < 0 of the end of the output (what
 * the detokenizer still holds): the detokenizer's ready bytes (an unfinished character waits
 * for the token that completes it) with every byte sequence that can never be a character
 * replaced by U+FFFD. Everything downstream (stop strings, the reasoning/answer/tool-call
 * split, tool-call arguments, the JSON) sees this text. out is overwritten; scratch is the
 * caller's reusable buffer for the raw bytes. */
void api_detok(tokenizer_stream *ts, int32_t token, bytebuf *scratch, bytebuf *out);

/* One API's shape: its request parser and its answer's formatter. begin (streaming only), on
 * (each op of choice i; it is NULL for FINISH) and end append to o->out. api_parse and
 * api_out reach a route's through api_format_of, so an API is one table in its own file. */
typedef struct api_format {
    const char *id_prefix;    /* of its answers' ids: "chatcmpl-", "resp_", "msg_", "cmpl-" */
    api_status (*parse)(const api_cfg *cfg, const char *body, size_t len, api_req *r, api_error *e);
    void (*begin)(api_out *o);
    void (*on)(api_out *o, int i, api_op op, api_item *it, const char *d, size_t len);
    void (*end)(api_out *o);
} api_format;
extern const api_format api_chat_format, api_responses_format, api_messages_format, api_completions_format;
/* The format of a route (an unknown kind: the messages API's, as api_parse always did). */
const api_format *api_format_of(api_kind kind);
/* Usage JSON objects in each vendor's fields. */
void api_chat_usage_json(const api_usage *u, bytebuf *b);
/* The Anthropic count_tokens body. */
void api_messages_count_json(int input_tokens, bytebuf *out);

#endif
