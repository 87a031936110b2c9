/*
 * api_http: what the APIs tell the HTTP layer, which knows none of them: the shape of the
 * errors it writes itself (an unknown path, a refused head, a timeout), chosen by the request's
 * path, and the headers a browser's CORS preflight may send. The server sets both in
 * http_opts at start-up.
 *
 * Shapes: Anthropic's {"type":"error","error":{type,message}} for /v1/messages and below,
 * OpenAI's {"error":{message,type,param,code}} for every other path, and when the path is not
 * known (a head that could not be parsed) {"type":"error","error":{message,type,param,code}},
 * which both SDKs parse. The message is escaped (api_error_body's JSON string writer).
 */
#ifndef TM_API_HTTP_H
#define TM_API_HTTP_H

#include "http/http.h"

typedef enum {
    API_HTTP_SHAPE_ANY = 0,      /* the path is unknown: a body both SDKs parse */
    API_HTTP_SHAPE_OPENAI,
    API_HTTP_SHAPE_ANTHROPIC,    /* /v1/messages and below */
} api_http_shape;

/* The table http_opts.errors takes. */
extern const http_error_shape api_http_errors;
/* The headers http_opts.cors_headers takes: what the SDKs send. */
#define API_HTTP_CORS_HEADERS "Authorization, Content-Type, x-api-key, anthropic-version"
/* Sets both in o: what a server of these APIs (serve, gateway) does before http_server_new. */
void api_http_opts(http_opts *o);

/* The error type Anthropic documents for a status (not_found_error, overloaded_error, ...). */
const char *api_http_anthropic_type(int status);

#endif
