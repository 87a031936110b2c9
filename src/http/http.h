/*
 * http: a small HTTP/1.1 server and router over GNU libmicrohttpd.
 *
 * DESIGN. libmicrohttpd (Debian libmicrohttpd-dev; chosen over evhttp/h2o because it is a
 * small, well-kept C library with keep-alive, chunked responses, connection limits and
 * timeouts built in) runs one thread per request being served. A request's body is read completely
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
 * another method 405 (both as JSON errors in the path's shape, see below).
 *
 * Connections (see http.c for the why): the layer accepts connections itself and holds each
 * in the "gate" until its request head has arrived whole; the head is checked there (request
 * line, version, URI and header sizes, Content-Length, Transfer-Encoding, Host) and only then
 * handed to libmicrohttpd. So a slow or broken client costs a file descriptor, not a thread,
 * and the library's own HTML error pages are never reached for a connection's first request:
 * every error is JSON in the path's shape. The layer knows no API: the server's owner
 * registers the shapes (http_opts.errors: which shape a path's errors take, and how a body
 * in it is written), so each API's clients read the layer's errors as their own. Limits:
 *  - a request's head must arrive within request_timeout_s of the connection opening (an
 *    absolute deadline, not an idle timeout a trickle can keep resetting), its body at
 *    min_rate bytes/s after that grace; else 408;
 *  - max_connections requests served at once, max_client_connections connections (waiting
 *    in the gate or served) per client address; past them 503 / 429 with Retry-After;
 *  - routes added with http_route_ops (/health, /metrics) are served past both, from a
 *    reserve, so they answer while the API is saturated (only a client with
 *    max_client_connections heads still waiting in the gate is refused before its path shows).
 * Keep-alive is the default for HTTP/1.1; idle connections close after idle_timeout_s.
 *
 * CORS (off unless cors_origin names origins): a request whose Origin is one of them (or any,
 * with "*") gets Access-Control-Allow-Origin on every response the layer or a handler writes
 * past the gate, errors and streams included, so a browser can read an API error as well as
 * an answer; an OPTIONS preflight to any path is answered 204 by the layer itself (methods,
 * the headers asked for, Max-Age), before routes and the API key check, which a browser's
 * preflight cannot pass. A preflight from another origin is a 403.
 */
#ifndef TM_HTTP_H
#define TM_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_CORS 16          /* --cors-origin values */
#define HTTP_CORS_MAX_AGE "86400" /* s a browser may keep a preflight's answer */
#define HTTP_RETRY_AFTER "1"      /* Retry-After of a 503/429 (seconds, the header's text): the
                                   * layer's refusals and the API's (a draining server) */
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
    int idle_timeout_s;      /* keep-alive idle timeout, s; 0: 60 */
    int request_timeout_s;   /* deadline for a request's head, s, and grace for its body; 0: 30 */
    size_t min_rate;         /* body bytes/s a client must keep up past the grace; 0: 4096 */
    int max_connections;     /* requests served at once (a thread each); 0: 1024 */
    int max_client_connections; /* connections per client address; 0: 256 */
    const char *const *api_keys; /* (n_api_keys) accepted keys; none: no check */
    int n_api_keys;
    const char *cors_origin[HTTP_MAX_CORS]; /* (n_cors_origin) origins browsers may call from
                                 * ("https://app.example", or "*" for any); copied */
    int n_cors_origin;           /* 0: no CORS headers, OPTIONS is a 405 as before */
    const char *cors_headers;    /* Access-Control-Allow-Headers of a preflight that asks for
                                 * none (the APIs' own headers; static, not copied); NULL:
                                 * "Authorization, Content-Type" */
    const struct http_error_shape *errors; /* how the layer's own errors are written (static,
                                 * not copied); NULL: {"error":{"message":...}} on every path */
} http_opts;

/* Error shapes, registered by the server's owner (see the design note). shape_of maps a
 * request path ("" when the head could not be parsed) to a shape number >= 0, kept with the
 * connection; write appends the JSON body of an error in that shape to out. message is plain
 * text: write escapes it. Both may run on any thread at any time; they keep no state. */
typedef struct http_error_shape {
    int (*shape_of)(const char *path);
    void (*write)(bytebuf *out, int shape, int status, const char *message);
} http_error_shape;

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
/* Adds a route: exact path match (no query), method "GET"/"POST"/... Call before start. A
 * path whose last segment is a lone star ("/v1/models/" then "*") takes every longer path
 * under it (the handler reads
 * http_request_path); routes are tried in the order added. */
void http_route(http_server *h, const char *method, const char *path, http_handler fn, void *user);
/* The same for an operator's route (health, metrics): cheap handlers served past
 * max_connections and max_client_connections, from a reserve of connections (see above). */
void http_route_ops(http_server *h, const char *method, const char *path, http_handler fn, void *user);
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

/* API keys, as "Authorization: Bearer KEY" (OpenAI) or "x-api-key: KEY" (Anthropic); either
 * header is accepted on every route. Keys are compared as SHA-256 digests with
 * CRYPTO_memcmp against every key, so neither a key's bytes nor its length leak in time. */
typedef enum {
    HTTP_AUTH_OK = 0,        /* the server has no keys, or the request carries one of them */
    HTTP_AUTH_MISSING,       /* no key in either header */
    HTTP_AUTH_INVALID,       /* a key that is none of the server's */
} http_auth;
http_auth http_request_auth(const http_request *r);
/* http_request_auth(r) == HTTP_AUTH_OK. */
bool http_request_authorized(const http_request *r);
/* The server's key that the request carries (as above), or NULL when the server has no keys
 * or the request none of them: the tenant's identity (e.g. for cache salts). */
const char *http_request_api_key(const http_request *r);
/* Its index in http_opts.api_keys, or -1 (no keys, or none carried). */
int http_request_key_index(const http_request *r);

/* True when the client has gone (a handler that waits for a whole answer checks it now and
 * then and cancels its work). A client that only half-closed (shut down its sending side,
 * as `nc -N` does) still reads its answer: on HTTP/1.1 the layer then sends one interim
 * "102 Processing", which a closed peer answers with a reset, seen at the next check. */
bool http_request_client_gone(const http_request *r);

/* Adds a response header (before http_respond*). */
void http_add_header(http_request *r, const char *name, const char *value);
/* Responds with a complete body (copied). */
void http_respond(http_request *r, int status, const char *content_type, const char *body, size_t len);
/* Responds with a streamed, chunked body; see the file comment. ctx belongs to the handler
 * until done is called. */
void http_respond_stream(http_request *r, int status, const char *content_type,
                         http_pull_fn pull, http_done_fn done, void *ctx);

/* Answers an error in the shape registered for the request's path (http_opts.errors). */
void http_respond_error(http_request *r, int status, const char *message);
/* The error body the server h writes for status on path (for tests). */
void http_error_body(const http_server *h, bytebuf *out, const char *path, int status, const char *message);

/* The gate's checks of a request (head.c; exposed for tests). */
typedef enum {
    HTTP_HEAD_INCOMPLETE = 0,  /* no end of head yet, and nothing wrong so far */
    HTTP_HEAD_OK,              /* a whole, well-formed head */
    HTTP_HEAD_BAD,             /* status and message say why */
} http_head_status;
typedef struct {
    int status;              /* HTTP_HEAD_BAD: the error status (400, 413, 414, 431, 501, 505) */
    const char *message;     /* HTTP_HEAD_BAD: why, a static string */
    size_t head_len;         /* HTTP_HEAD_OK: bytes of the head, blank line included */
    size_t path_off, path_len; /* the request target's path (no query) in buf; len 0: not parsed */
    bool get_or_head;        /* the method is GET or HEAD */
    bool chunked;            /* HTTP_HEAD_OK: Transfer-Encoding: chunked */
} http_head;
/* Checks the head at the start of buf (len bytes seen so far): head_max bytes at most for the
 * whole head, uri_max for the request target, max_body for Content-Length. */
http_head_status http_head_check(const char *buf, size_t len, size_t head_max, size_t uri_max, uint64_t max_body,
                                 http_head *out);
/* Checks the chunked body at the start of buf (len bytes seen so far): HTTP_HEAD_OK once the
 * last chunk and the trailer are seen (*body_len: the bytes they take), HTTP_HEAD_BAD on a
 * syntax error (400) or when the chunks' declared sizes pass max_body (413, said as soon as
 * a size line shows it), else HTTP_HEAD_INCOMPLETE. */
http_head_status http_head_chunked(const char *buf, size_t len, uint64_t max_body, size_t *body_len, http_head *out);

/* Counters for /metrics. */
typedef struct {
    uint64_t n_requests;      /* requests that reached a handler or the router */
    uint64_t n_by_class[6];   /* by status class: [1..5] = 1xx..5xx */
    uint64_t n_too_large;     /* 413 */
    uint64_t n_disconnects;   /* streams ended by the client */
    uint64_t n_refused;       /* 503/429 at capacity or past the per-client limit */
    uint64_t n_timeouts;      /* 408: a head or body too slow */
    int n_connections;        /* open now */
    int n_streams;            /* streaming responses open now */
    int n_active;             /* requests between their headers and the end of their response
                               * (a server that drains waits for 0) */
} http_stats;
void http_get_stats(http_server *h, http_stats *st);

#endif
