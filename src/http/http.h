/*
 * http: a small HTTP/1.1 server and router over GNU libmicrohttpd.
 *
 * DESIGN. libmicrohttpd (Debian libmicrohttpd-dev; chosen over evhttp/h2o because it is a
 * small, well-kept C library with keep-alive, chunked responses, connection limits and
 * timeouts built in) runs one thread per connection. A request's body is read completely
 * (up to max_body bytes, else 413 before the handler runs), then the route's handler is
 * called on that connection's thread with method, path, query, headers and the whole body.
 * The handler answers with exactly one of http_respond* before it returns:
 *  - http_respond: status + content type + body (copied);
 *  - http_respond_stream: status + content type, then the body comes from a pull function
 *    the handler provides, sent with chunked transfer encoding (SSE streams use this).
 *    The pull function is called on the connection's thread whenever the socket can take
 *    more; it may block up to timeout_ms waiting for data (e.g. in sched_poll). Between
 *    calls the layer checks whether the client has gone; when it has (or the stream ends
 *    normally) the handler's done function is called exactly once, with client_gone set
 *    on a disconnect, so the handler cancels its request and frees its KV blocks at once.
 * A handler that responds with nothing gets a 500. Unknown paths get 404, a known path with
 * another method 405 (both as OpenAI-shaped JSON errors).
 *
 * Keep-alive is the default for HTTP/1.1; idle connections close after idle_timeout_s, and
 * a client that is too slow to send its headers/body is cut off by the same timeout.
 */
#ifndef TM_HTTP_H
#define TM_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/bytebuf.h"

typedef enum {
    HTTP_OK = 0,
    HTTP_ERR_BIND,       /* could not listen on host:port */
    HTTP_ERR_ARG,        /* bad options (host not an IPv4/IPv6 address) */
    HTTP_ERR_NOMEM,
} http_status;

typedef struct {
    const char *host;        /* listen address, numeric; NULL: 127.0.0.1 */
    int port;                /* 0: any free port (see http_server_port) */
    size_t max_body;         /* request body limit in bytes; 0: 8 MiB */
    int idle_timeout_s;      /* keep-alive idle / slow client timeout; 0: 60 */
    int max_connections;     /* concurrent connections; 0: 1024 */
    const char *const *api_keys; /* (n_api_keys) accepted keys; none: no check */
    int n_api_keys;
} http_opts;

typedef struct http_server http_server;
typedef struct http_request http_request;

typedef void (*http_handler)(http_request *req, void *user);

/* Pull for a streaming response: append bytes to out (or nothing, if none are ready within
 * timeout_ms). Return true while more may come, false when the stream is complete (what was
 * appended in that call is still sent). */
typedef bool (*http_pull_fn)(void *ctx, bytebuf *out, int timeout_ms);
/* Called exactly once when a stream ends: client_gone is true on a disconnect/error. */
typedef void (*http_done_fn)(void *ctx, bool client_gone);

http_status http_server_new(const http_opts *opts, http_server **out, char *err, size_t errsz);
/* Adds a route: exact path match (no query), method "GET"/"POST"/... Call before start. */
void http_route(http_server *h, const char *method, const char *path, http_handler fn, void *user);
/* Starts listening and serving (returns at once; connections run on their own threads). */
http_status http_server_start(http_server *h, char *err, size_t errsz);
/* The bound port (useful with port 0). */
int http_server_port(const http_server *h);
/* Stops accepting, closes connections (streams see client_gone) and frees. */
void http_server_free(http_server *h);

/* Request accessors (valid during the handler). */
const char *http_request_method(const http_request *r);
const char *http_request_path(const http_request *r);
/* A query argument's value or NULL. */
const char *http_request_query(const http_request *r, const char *key);
/* A header's value (case-insensitive name) or NULL. */
const char *http_request_header(const http_request *r, const char *name);
/* The whole body (NUL-terminated for convenience; may contain NULs, use len). */
const char *http_request_body(const http_request *r, size_t *len);
http_server *http_request_server(const http_request *r);

/* API keys: true when the server has no keys, or the request carries one of them, as
 * "Authorization: Bearer KEY" (OpenAI) or "x-api-key: KEY" (Anthropic); either header is
 * accepted on every route. */
bool http_request_authorized(const http_request *r);
/* The server's key that the request carries (as above), or NULL when the server has no keys
 * or the request none of them: the tenant's identity (e.g. for cache salts). */
const char *http_request_api_key(const http_request *r);

/* True when the client has closed its side of the connection (a handler that waits for a
 * whole answer checks it now and then and cancels its work). */
bool http_request_client_gone(const http_request *r);

/* Adds a response header (before http_respond*). */
void http_add_header(http_request *r, const char *name, const char *value);
/* Responds with a complete body (copied). */
void http_respond(http_request *r, int status, const char *content_type, const char *body, size_t len);
/* Responds with a streamed, chunked body; see the file comment. ctx belongs to the handler
 * until done is called. */
void http_respond_stream(http_request *r, int status, const char *content_type,
                         http_pull_fn pull, http_done_fn done, void *ctx);

/* Counters for /metrics. */
typedef struct {
    uint64_t n_requests;      /* requests that reached a handler or the router */
    uint64_t n_by_class[6];   /* by status class: [1..5] = 1xx..5xx */
    uint64_t n_too_large;     /* 413 */
    uint64_t n_disconnects;   /* streams ended by the client */
    int n_connections;        /* open now */
    int n_streams;            /* streaming responses open now */
} http_stats;
void http_get_stats(http_server *h, http_stats *st);

#endif
