/*
 * api_int: what only api*.c may see: the JSON (jansson) checks the request parsers share (chat,
 * completions, messages, responses).
 *
 * Each check looks up one member of an object, treats JSON null as absent (the SDKs send
 * null for unset optional fields), and on a wrong type or value fills the api_error in the
 * vendor's wording: OpenAI routes "Invalid type for 'x': expected a number, but got a string
 * instead." (code invalid_type), Anthropic "x: Input should be a valid number". `path` is the
 * member's full name in messages ("messages[0].content").
 * Return: 1 present and valid, 0 absent, -1 error (e filled).
 */
#ifndef TM_API_INT_H
#define TM_API_INT_H

#include <jansson.h>

#include "recipe/api.h"

/* The error body in the OpenAI ({"error":{message,type,param,code}}) or the Anthropic
 * ({"type":"error","error":{type,message}}) shape; param and code may be NULL (null). Written
 * with the JSON string writer, so a message quoting the client's bytes is always valid JSON. */
void api_error_body(bytebuf *out, bool anthropic, const char *type, const char *message, const char *param,
                    const char *code);
/* Checks UTF-8, parses, requires a top-level object. */
bool api_json_load(api_kind kind, const char *body, size_t len, json_t **root, api_error *e);
/* Rejects members of obj not in allowed (NULL-terminated), as the vendor words it. */
bool api_json_known(api_kind kind, json_t *obj, const char *const *allowed, const char *path, api_error *e);
/* A member that is present but has the wrong JSON type. */
void api_json_type_error(api_kind kind, api_error *e, const char *path, const char *expected, json_t *got);
void api_json_value_error(api_kind kind, api_error *e, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void api_json_missing(api_kind kind, api_error *e, const char *path);
/* A required member v that is absent (NULL: missing) or not of the expected type. */
void api_json_bad(api_kind kind, api_error *e, const char *path, const char *expected, json_t *v);

int api_json_num(api_kind kind, json_t *obj, const char *key, double lo, double hi, double *out, api_error *e);
int api_json_int(api_kind kind, json_t *obj, const char *key, long long lo, long long hi, long long *out,
                 api_error *e);
int api_json_bool(api_kind kind, json_t *obj, const char *key, bool *out, api_error *e);
int api_json_str(api_kind kind, json_t *obj, const char *key, const char **out, api_error *e);
/* Element i of the array at path base, which must be an object: its path ("messages[2]") in
 * p[0..cap); false with e filled in the vendor's words when it is not one. */
bool api_json_item(api_kind kind, const char *base, size_t i, json_t *v, char *p, size_t cap, api_error *e);
/* "x.y" or "x[3]" into buf. */
const char *api_path(char *buf, size_t cap, const char *base, const char *key, int index);

/* The model name: absent or "" means the served one; any other name not served is 404. */
bool api_json_model(const api_cfg *cfg, api_kind kind, json_t *root, api_req *r, api_error *e);
/* stop / stop_sequences: a string or an array of strings. */
bool api_json_stop(api_kind kind, json_t *root, const char *key, api_req *r, api_error *e);
/* The OpenAI sampling fields (chat, completions): temperature, top_p, top_k, min_p, the
 * penalties (repeat_penalty / repetition_penalty as extensions), seed and logit_bias. */
bool api_json_sampling(api_kind kind, json_t *root, const api_cfg *cfg, api_req *r, api_error *e);
/* logit_bias: an object mapping token ids (decimal strings, below n_vocab when that is > 0)
 * to biases in [-100, 100], at most SAMPLE_MAX_BIAS of them, into sp (OpenAI's chat and
 * completions field). */
bool api_json_logit_bias(api_kind kind, json_t *root, int n_vocab, sample_params *sp, api_error *e);
/* user: the end user's id, a string (OpenAI routes), into r->user. */
bool api_json_user(api_kind kind, json_t *root, api_req *r, api_error *e);
/* stream_options {include_usage}: an object, allowed only when r->stream is set. */
bool api_json_stream_options(api_kind kind, json_t *root, api_req *r, api_error *e);
/* cache_salt and cache_class (strings, see TENANCY in api.h) into r. */
bool api_json_cache(api_kind kind, json_t *root, api_req *r, api_error *e);
/* One tool definition, fn, the element at path p of a route's tools (its fields named after
 * prefix: "function." in chat's nested form), added to c when it checks out: name a non-empty
 * string, description a string, the schema an object (chat and responses: "parameters",
 * optional; messages: "input_schema", required), strict a boolean; null is absent. The errors
 * use the route's words. */
bool api_json_tool(api_kind kind, json_t *fn, const char *p, const char *prefix, conv *c, api_error *e);
/* OpenAI's tool_choice word ("none", "auto", "required") into r->tools_mode; false with e
 * filled for any other word. */
bool api_json_tool_choice_word(const char *v, api_req *r, api_error *e);
/* A content value that is a string or an array of text parts (`path` names it), as one string
 * (malloc'd), the parts joined as the API joins them (Messages by newlines, the OpenAI APIs
 * with nothing between). NULL with e filled in the API's words. Chat, Responses and Messages. */
char *api_json_parts_text(api_kind kind, json_t *v, const char *path, api_error *e);
/* Reads a response format object at `path` (chat's response_format, where a json_schema
 * format holds {name, schema, strict} in member json_schema; Responses' text.format, where
 * name / schema / strict are the format's own members: flat) into r. Type "text" leaves r
 * unconstrained. */
bool api_json_format(api_kind kind, json_t *fmt, const char *path, bool flat, api_req *r, api_error *e);
/* The extensions' fields of a chat or completions request (at most one of them). */
bool api_json_guided(api_kind kind, json_t *root, api_req *r, api_error *e);
/* Appends s[0..len) as a GBNF string literal (llama.cpp's escapes). */
void api_json_gbnf_literal(bytebuf *b, const char *s, size_t len);
/* The compact JSON text of a value (malloc'd). */
char *api_json_dump(json_t *v);

#endif
