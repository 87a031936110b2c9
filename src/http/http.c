/*
 * http: router and streaming responses over libmicrohttpd, behind a gate of our own. See
 * http.h for the design.
 *
 * WHY A GATE. MHD runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION), because
 * handlers block: a non-streaming request waits for its whole answer, a stream's pull waits
 * in the scheduler. Its epoll mode would need every handler rewritten around suspend/resume.
 * But a thread per connection means a client that trickles its headers a byte a second holds
 * a thread and a connection slot, and MHD's timeout is an idle timeout the trickle resets: a
 * thousand such clients used to lock every slot. So the layer owns the listening socket: a
 * gate thread accepts, keeps each new connection in an epoll set and peeks (MSG_PEEK, edge
 * triggered, nothing consumed) until the request head is whole, checks it (head.c),
 * applies the limits, then hands the socket to MHD (MHD_add_connection), which reads the
 * same bytes. A waiting connection costs one fd and one small struct; its deadline is
 * absolute (request_timeout_s after accept); when the gate is full, the connection that has
 * waited longest makes room for a new one. A head the gate refuses is answered with raw
 * JSON (the path's registered shape) and a lingering close (shut down writing, drain, close),
 * so the client reads the answer instead of a reset.
 *
 * Past the gate, MHD still reads bodies and later keep-alive requests: the gate thread also
 * watches those connections (http_conn, made in MHD's connection notifications): a body must
 * arrive at min_rate after a grace of request_timeout_s, and a keep-alive request's head
 * within idle_timeout_s + request_timeout_s; a connection past its deadline gets a raw 408
 * and a lingering shutdown (NOTIFY_CLOSED runs before MHD closes the fd, and the scan holds
 * h->cmu while it writes or shuts down, so the fd is never another connection's).
 *
 * What MHD still answers with its own HTML (libmicrohttpd 0.9.75 has no hook for it:
 * transmit_error_response writes a built-in page): chunked encoding that goes wrong past the
 * gate's HTTP_PEEK_MAX window, and a malformed head on a keep-alive connection's second or
 * later request (the gate sees only a connection's first head).
 *
 * Per request: the access handler is called once at the headers (the http_request is
 * allocated then, and an oversize Content-Length is answered 413 at once), once per body
 * piece (appended, or dropped once over max_body), and once at the end, when the route runs.
 * A streaming response is an MHD callback response of unknown size (chunked encoding); its
 * reader calls the pull function in a loop of short waits, and between waits polls the
 * socket: a reset or hang-up ends the stream; a half-close (the client shut down its sending
 * side) is probed once with an SSE comment, which a closed peer answers with a reset. The
 * response's free callback calls the handler's done function, with client_gone unless the
 * stream had ended.
 *
 * s->mu guards the statistics; s->cmu the list of MHD connections and their phases.
 * n_active counts a request from its first access call to MHD's completion notice, which
 * comes once its response was sent (or the connection failed): a draining server waits for 0.
 */
#define _GNU_SOURCE
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/jsonfmt.h"
#include "util/sha256.h"
#include "util/util.h"

#define HTTP_MAX_ROUTES 32
#define HTTP_MAX_RESP_HEADERS 8
#define HTTP_PULL_WAIT_MS 25      /* one wait of a stream pull before checking the socket */
#define HTTP_HEAD_MAX 16384       /* bytes of a request head (request line + headers) */
#define HTTP_PEEK_MAX 65536       /* bytes the gate looks at: a head and a chunked body's start */
#define HTTP_URI_MAX 8192         /* bytes of a request target */
#define HTTP_OPS_RESERVE 64       /* MHD connections kept for ops routes past max_connections */
#define HTTP_GATE_TICK_MS 100     /* the gate's deadline scan period */
#define HTTP_LINGER_S 2.0         /* drain time after a refusal before the close */

typedef struct {
    char *method;                /* "GET", "POST", ... */
    char *path;                  /* exact path */
    http_handler fn;
    void *user;
    bool ops;                    /* served past the connection limits */
} http_route_t;

/* A connection waiting in the gate for its request head, or lingering after a refusal. */
typedef struct {
    int fd;
    struct sockaddr_storage addr; /* the client */
    socklen_t addrlen;
    double t0;                   /* s (util_now): accepted */
    double t_close;              /* s: lingering: close by then */
    size_t n_seen;               /* bytes seen at the last peek */
    bool lingering;              /* answered; draining until EOF or t_close */
    int i;                       /* index in gate_pend */
} http_pend;

typedef enum {
    HTTP_PHASE_IDLE = 0,         /* between requests (or before the first is parsed) */
    HTTP_PHASE_HEAD,             /* request line seen, headers coming */
    HTTP_PHASE_BODY,             /* headers seen, body coming */
    HTTP_PHASE_HANDLER,          /* the route runs / the response is sent */
} http_phase;

/* A connection MHD serves (from MHD_CONNECTION_NOTIFY_STARTED to _CLOSED). */
typedef struct http_conn {
    int fd;
    struct sockaddr_storage addr; /* the client */
    http_phase phase;
    double t_phase;              /* s (util_now): entered phase */
    uint64_t n_body;             /* body bytes received in the BODY phase */
    int shape;                   /* error shape of the request's path (HEAD and later) */
    double t_kill;               /* s: past its deadline, answered: shut down by then; 0: not */
    struct http_conn *prev, *next;
} http_conn;

struct http_server {
    http_opts o;                 /* resolved options (host/keys copied) */
    char **keys;                 /* (n_keys) accepted API keys */
    unsigned char (*key_sha)[32]; /* (n_keys) their SHA-256 digests */
    int n_keys;
    char *cors[HTTP_MAX_CORS];   /* (n_cors) allowed origins, "*" for any */
    int n_cors;
    http_route_t routes[HTTP_MAX_ROUTES];
    int n_routes;
    struct MHD_Daemon *d;
    int port;                    /* bound port */
    volatile int stopping;       /* http_server_free in progress: streams end */
    pthread_mutex_t mu;          /* guards st */
    http_stats st;
    /* the gate */
    int lfd;                     /* listening socket, -1 before start */
    int efd;                     /* epoll set: lfd, stopfd, pending connections */
    int stopfd;                  /* eventfd: the gate thread ends */
    pthread_t gate;
    bool gate_running;
    bool accept_paused;          /* out of fds: the listening socket is out of the epoll set until the next scan */
    double t_fd_warned;          /* s (util_now): the last "out of file descriptors" line */
    http_pend **pend;            /* (n_pend, max_pending) connections in the gate */
    int n_pend;
    int max_pending;
    char *peek;                  /* (HTTP_PEEK_MAX) the gate's peek buffer */
    /* connections MHD serves */
    pthread_mutex_t cmu;         /* guards conns, n_conns and every http_conn's fields */
    http_conn *conns;            /* list of MHD connections */
    int n_conns;                 /* its length */
};

struct http_request {
    http_server *h;
    struct MHD_Connection *conn;
    const char *method;          /* MHD's strings, valid for the request */
    const char *path;
    bool http11;                 /* HTTP/1.1 (may get an interim 1xx) */
    bytebuf body;               /* the request body, NUL-terminated */
    bool too_large;              /* body over max_body: answer 413 */
    bool responded;              /* a response was queued */
    bool probed;                 /* a half-closed client was sent "102 Processing" */
    int n_hdr;                   /* extra response headers */
    char *hdr_name[HTTP_MAX_RESP_HEADERS];
    char *hdr_value[HTTP_MAX_RESP_HEADERS];
};

typedef struct {
    http_server *h;
    struct MHD_Connection *conn;
    http_pull_fn pull;
    http_done_fn done;
    void *ctx;
    bytebuf pend;               /* bytes pulled, not yet handed to MHD */
    size_t pend_off;             /* bytes of pend already handed out */
    bool ended;                  /* pull returned false */
    bool complete;               /* END_OF_STREAM was returned: not a disconnect */
    bool sse;                    /* text/event-stream: a comment may probe a half-close */
    bool probed;                 /* the probe was sent */
} http_stream;

/* ---- statistics ---- */

static void http_count_status(http_server *h, int status)
{
    pthread_mutex_lock(&h->mu);
    int c = status / 100;
    if (c >= 1 && c <= 5) h->st.n_by_class[c]++;
    if (status == 413) h->st.n_too_large++;
    if (status == 503 || status == 429) h->st.n_refused++;
    if (status == 408) h->st.n_timeouts++;
    pthread_mutex_unlock(&h->mu);
}

void http_get_stats(http_server *h, http_stats *st)
{
    pthread_mutex_lock(&h->mu);
    *st = h->st;
    pthread_mutex_unlock(&h->mu);
    pthread_mutex_lock(&h->cmu);
    st->n_connections = h->n_conns + h->n_pend;
    pthread_mutex_unlock(&h->cmu);
}

/* ---- error bodies ---- */

/* Without a registered shape: one body for every path, in no API's particular dialect. */
static int http_plain_shape_of(const char *path) { return 0; }

static void http_plain_write(bytebuf *out, int shape, int status, const char *message)
{
    bytebuf_puts(out, "{\"error\":{\"message\":");
    jsonfmt_write_string(out, message, strlen(message));
    bytebuf_puts(out, "}}");
}

static const http_error_shape http_plain_errors = { http_plain_shape_of, http_plain_write };

static int http_shape_of(const http_server *h, const char *path) { return h->o.errors->shape_of(path ? path : ""); }

void http_error_body(const http_server *h, bytebuf *out, const char *path, int status, const char *message)
{
    h->o.errors->write(out, http_shape_of(h, path), status, message);
}

static const char *http_reason(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* Writes a whole error response straight to a socket MHD is not writing to (the gate's, or
 * one past its deadline), with Connection: close. Best effort: the socket buffer of a fresh
 * connection always takes these few hundred bytes. */
static void http_raw_error(http_server *h, int fd, int shape, int status, const char *message, bool retry)
{
    bytebuf body = { 0 }, msg = { 0 };
    h->o.errors->write(&body, shape, status, message);
    bytebuf_printf(&msg, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                   status, http_reason(status), body.len, retry ? "Retry-After: " HTTP_RETRY_AFTER "\r\n" : "");
    bytebuf_append(&msg, body.p, body.len);
    if (send(fd, msg.p, msg.len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        log_debug("http: error response not sent: %s", strerror(errno));
    bytebuf_free(&body);
    bytebuf_free(&msg);
    http_count_status(h, status);
}

/* ---- responses ---- */

/* The Access-Control-Allow-Origin value for the request's Origin: the origin itself when it
 * is listed, "*" when any is allowed, NULL when CORS is off, there is no Origin, or it is not
 * allowed. */
static const char *http_cors_allow(const http_request *r)
{
    if (!r->h->n_cors) return NULL;
    const char *origin = http_request_header(r, "Origin");
    if (!origin || !*origin) return NULL;
    bool any = false;
    for (int i = 0; i < r->h->n_cors; i++) {
        if (!strcasecmp(r->h->cors[i], origin)) return origin;
        any |= !strcmp(r->h->cors[i], "*");
    }
    return any ? "*" : NULL;
}

static void http_cors_headers(http_request *r, struct MHD_Response *resp)
{
    const char *allow = http_cors_allow(r);
    if (r->h->n_cors) MHD_add_response_header(resp, "Vary", "Origin");   /* the answer depends on it */
    if (!allow) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", allow);
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "Retry-After");
}

/* An OPTIONS request while CORS is on: the preflight's answer. The headers asked for are
 * allowed as asked (Authorization and x-api-key among them, which "*" would not cover). */
static void http_cors_preflight(http_request *r)
{
    if (!http_cors_allow(r)) {
        http_respond_error(r, 403, "origin not allowed (see --cors-origin)");
        return;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return;
    http_cors_headers(r, resp);
    const char *want = http_request_header(r, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            want && *want ? want : r->h->o.cors_headers ? r->h->o.cors_headers : "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", HTTP_CORS_MAX_AGE);
    if (MHD_queue_response(r->conn, 204, resp) == MHD_YES) {
        r->responded = true;
        http_count_status(r->h, 204);
    }
    MHD_destroy_response(resp);
}

static void http_apply_headers(http_request *r, struct MHD_Response *resp, const char *content_type)
{
    http_cors_headers(r, resp);
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    for (int i = 0; i < r->n_hdr; i++) MHD_add_response_header(resp, r->hdr_name[i], r->hdr_value[i]);
}

void http_add_header(http_request *r, const char *name, const char *value)
{
    if (r->n_hdr >= HTTP_MAX_RESP_HEADERS) return;
    r->hdr_name[r->n_hdr] = xstrdup(name);
    r->hdr_value[r->n_hdr] = xstrdup(value);
    r->n_hdr++;
}

void http_respond(http_request *r, int status, const char *content_type, const char *body, size_t len)
{
    if (r->responded) return;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return;
    http_apply_headers(r, resp, content_type);
    if (MHD_queue_response(r->conn, (unsigned)status, resp) == MHD_YES) {
        r->responded = true;
        http_count_status(r->h, status);
    }
    MHD_destroy_response(resp);
}

void http_respond_error(http_request *r, int status, const char *message)
{
    bytebuf body = { 0 };
    http_error_body(r->h, &body, r->path, status, message);
    http_respond(r, status, "application/json", body.p, body.len);
    bytebuf_free(&body);
}

/* The peer of socket fd: 0 connected, 1 half-closed (it shut down its sending side: it may
 * still read), 2 gone (reset or hung up). */
static int http_peer_state(int fd)
{
    struct pollfd pfd = { .fd = fd, .events = POLLRDHUP };
    if (poll(&pfd, 1, 0) <= 0) return 0;
    if (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) return 2;
    return (pfd.revents & POLLRDHUP) ? 1 : 0;
}

static int http_conn_fd(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

bool http_request_client_gone(const http_request *r)
{
    int fd = http_conn_fd(r->conn);
    if (fd < 0) return true;
    int ps = http_peer_state(fd);
    if (ps != 1) return ps == 2;
    /* half-closed or closed: FIN looks the same. An interim response (clients skip 1xx
     * before the final one) tells them apart: a closed peer answers it with a reset. */
    if (!r->probed && r->http11 && !r->responded) {
        ((http_request *)r)->probed = true;
        static const char probe[] = "HTTP/1.1 102 Processing\r\n\r\n";
        if (send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) return true;
    }
    return false;
}

static ssize_t http_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    http_stream *st = cls;
    (void)pos;
    for (;;) {
        if (st->pend_off < st->pend.len) {
            size_t n = TM_MIN(max, st->pend.len - st->pend_off);
            memcpy(buf, st->pend.p + st->pend_off, n);
            st->pend_off += n;
            if (st->pend_off == st->pend.len) st->pend_off = st->pend.len = 0;
            return (ssize_t)n;
        }
        if (st->ended) {
            st->complete = true;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (st->h->stopping) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!st->pull(st->ctx, &st->pend, HTTP_PULL_WAIT_MS)) st->ended = true;
        if (st->pend.len == 0 && !st->ended) {
            int fd = http_conn_fd(st->conn);
            int ps = fd < 0 ? 2 : http_peer_state(fd);
            if (ps == 2 || (ps == 1 && !st->sse)) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (ps == 1 && !st->probed) {  /* see http_request_client_gone: an SSE comment probes */
                st->probed = true;
                bytebuf_puts(&st->pend, ":\n\n");
            }
        }
    }
}

static void http_stream_free(void *cls)
{
    http_stream *st = cls;
    if (!st->complete) {
        pthread_mutex_lock(&st->h->mu);
        st->h->st.n_disconnects++;
        pthread_mutex_unlock(&st->h->mu);
    }
    pthread_mutex_lock(&st->h->mu);
    st->h->st.n_streams--;
    pthread_mutex_unlock(&st->h->mu);
    st->done(st->ctx, !st->complete);
    bytebuf_free(&st->pend);
    free(st);
}

void http_respond_stream(http_request *r, int status, const char *content_type,
                         http_pull_fn pull, http_done_fn done, void *ctx)
{
    if (r->responded) {
        done(ctx, true);
        return;
    }
    http_stream *st = xcalloc(1, sizeof *st);
    st->h = r->h;
    st->conn = r->conn;
    st->pull = pull;
    st->done = done;
    st->ctx = ctx;
    st->sse = content_type && !strncmp(content_type, "text/event-stream", 17);
    pthread_mutex_lock(&r->h->mu);
    r->h->st.n_streams++;
    pthread_mutex_unlock(&r->h->mu);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, http_stream_read, st, http_stream_free);
    if (!resp) {
        st->complete = false;
        http_stream_free(st);
        return;
    }
    http_apply_headers(r, resp, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (MHD_queue_response(r->conn, (unsigned)status, resp) == MHD_YES) {
        r->responded = true;
        http_count_status(r->h, status);
    }
    MHD_destroy_response(resp);  /* if not queued, this frees st through the callback */
}

/* ---- requests ---- */

const char *http_request_method(const http_request *r) { return r->method; }
const char *http_request_path(const http_request *r) { return r->path; }
http_server *http_request_server(const http_request *r) { return r->h; }

const char *http_request_query(const http_request *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *http_request_header(const http_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *http_request_body(const http_request *r, size_t *len)
{
    if (len) *len = r->body.len;
    return r->body.p ? r->body.p : "";
}

static void http_sha256(const char *z, unsigned char out[32])
{
    sha256_digest(z, strlen(z), out);
}

/* The server's key equal to z, or -1. Every key is compared, by digest, in constant time. */
static int http_key_find(const http_server *h, const char *z)
{
    unsigned char d[32];
    http_sha256(z, d);
    int found = -1;
    for (int i = 0; i < h->n_keys; i++) {
        int ne = CRYPTO_memcmp(d, h->key_sha[i], 32);
        found = ne ? found : i;
    }
    return found;
}

/* The key index the request carries (>= 0), -1 when it carries none, -2 a wrong one. */
int http_request_key_index(const http_request *r)
{
    const char *auth = http_request_header(r, "Authorization");
    const char *xkey = http_request_header(r, "x-api-key");
    const char *bearer = NULL;
    if (auth && !strncasecmp(auth, "Bearer ", 7)) {
        bearer = auth + 7;
        while (*bearer == ' ') bearer++;
    }
    int kb = bearer && *bearer ? http_key_find(r->h, bearer) : -1;
    int kx = xkey && *xkey ? http_key_find(r->h, xkey) : -1;
    if (kb >= 0) return kb;
    if (kx >= 0) return kx;
    return (bearer && *bearer) || (xkey && *xkey) || auth ? -2 : -1;
}

http_auth http_request_auth(const http_request *r)
{
    if (r->h->n_keys == 0) return HTTP_AUTH_OK;
    int k = http_request_key_index(r);
    return k >= 0 ? HTTP_AUTH_OK : k == -1 ? HTTP_AUTH_MISSING : HTTP_AUTH_INVALID;
}

bool http_request_authorized(const http_request *r) { return http_request_auth(r) == HTTP_AUTH_OK; }

const char *http_request_api_key(const http_request *r)
{
    if (r->h->n_keys == 0) return NULL;
    int k = http_request_key_index(r);
    return k >= 0 ? r->h->keys[k] : NULL;
}

static void http_request_free(http_request *r)
{
    if (!r) return;
    bytebuf_free(&r->body);
    for (int i = 0; i < r->n_hdr; i++) {
        free(r->hdr_name[i]);
        free(r->hdr_value[i]);
    }
    free(r);
}

static bool http_path_match(const char *route, const char *path);

static void http_dispatch(http_request *r)
{
    http_server *h = r->h;
    pthread_mutex_lock(&h->mu);
    h->st.n_requests++;
    pthread_mutex_unlock(&h->mu);
    if (r->too_large) {
        http_respond_error(r, 413, "request body too large");
        return;
    }
    if (h->n_cors && !strcmp(r->method, "OPTIONS")) {
        http_cors_preflight(r);
        return;
    }
    bool path_known = false;
    for (int i = 0; i < h->n_routes; i++) {
        http_route_t *rt = &h->routes[i];
        if (!http_path_match(rt->path, r->path)) continue;
        path_known = true;
        if (strcmp(rt->method, r->method)) continue;
        rt->fn(r, rt->user);
        if (!r->responded) http_respond_error(r, 500, "the handler did not respond");
        return;
    }
    if (path_known) http_respond_error(r, 405, "method not allowed");
    else http_respond_error(r, 404, "not found");
}

/* The tracked connection of an MHD connection, or NULL. */
static http_conn *http_conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void http_conn_phase(http_server *h, struct MHD_Connection *conn, http_phase ph, const char *path)
{
    http_conn *c = http_conn_of(conn);
    if (!c) return;
    pthread_mutex_lock(&h->cmu);
    c->phase = ph;
    c->t_phase = util_now();
    c->n_body = 0;
    if (path) c->shape = http_shape_of(h, path);
    pthread_mutex_unlock(&h->cmu);
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                   const char *version, const char *upload_data, size_t *upload_data_size,
                                   void **con_cls)
{
    http_server *h = cls;
    http_request *r = *con_cls;
    if (!r) {
        r = xcalloc(1, sizeof *r);
        r->h = h;
        r->conn = conn;
        r->method = method;
        r->path = url;
        r->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
        *con_cls = r;
        pthread_mutex_lock(&h->mu);
        h->st.n_active++;   /* until http_completed */
        pthread_mutex_unlock(&h->mu);
        http_conn_phase(h, conn, HTTP_PHASE_BODY, url);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > h->o.max_body) {
                r->too_large = true;
                http_respond_error(r, 413, "request body too large");
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        http_conn *c = http_conn_of(conn);
        if (c) {
            pthread_mutex_lock(&h->cmu);
            c->n_body += *upload_data_size;
            pthread_mutex_unlock(&h->cmu);
        }
        if (!r->responded && !r->too_large) {
            if (r->body.len + *upload_data_size > h->o.max_body) {
                r->too_large = true;
                bytebuf_free(&r->body);
            } else {
                bytebuf_append(&r->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->responded) return MHD_YES;
    http_conn_phase(h, conn, HTTP_PHASE_HANDLER, NULL);
    if (!r->body.p) bytebuf_append(&r->body, NULL, 0);
    http_dispatch(r);
    return r->responded ? MHD_YES : MHD_NO;
}

static void http_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    http_server *h = cls;
    (void)toe;
    if (*con_cls) {
        pthread_mutex_lock(&h->mu);
        h->st.n_active--;
        pthread_mutex_unlock(&h->mu);
    }
    http_request_free(*con_cls);
    *con_cls = NULL;
    http_conn_phase(h, conn, HTTP_PHASE_IDLE, NULL);
}

/* MHD's URI log hook: the request line of a (keep-alive) request has arrived. */
static void *http_uri_seen(void *cls, const char *uri, struct MHD_Connection *conn)
{
    http_conn_phase(cls, conn, HTTP_PHASE_HEAD, uri);
    return NULL;
}

static void http_notify_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
                             enum MHD_ConnectionNotificationCode code)
{
    http_server *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_conn *c = xcalloc(1, sizeof *c);
        c->fd = http_conn_fd(conn);
        c->shape = http_shape_of(h, "");
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr) {
            socklen_t len = ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
            memcpy(&c->addr, ci->client_addr, len);
        }
        c->t_phase = util_now();
        pthread_mutex_lock(&h->cmu);
        c->next = h->conns;
        if (h->conns) h->conns->prev = c;
        h->conns = c;
        h->n_conns++;
        pthread_mutex_unlock(&h->cmu);
        *socket_context = c;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        http_conn *c = *socket_context;
        if (!c) return;
        pthread_mutex_lock(&h->cmu);
        if (c->prev) c->prev->next = c->next;
        else h->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        h->n_conns--;
        pthread_mutex_unlock(&h->cmu);
        free(c);
        *socket_context = NULL;
    }
}

static void http_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (util_log_level > LOG_LEVEL_DEBUG) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    log_debug("http: %s", msg);
}

/* ---- the gate ---- */

static bool http_same_client(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
    return false;
}

/* Connections of this client waiting in the gate (not lingering), and with served, those MHD
 * serves too. */
static int http_client_count(http_server *h, const struct sockaddr_storage *a, bool served)
{
    int n = 0;
    for (int i = 0; i < h->n_pend; i++) n += !h->pend[i]->lingering && http_same_client(&h->pend[i]->addr, a);
    if (!served) return n;
    pthread_mutex_lock(&h->cmu);
    for (http_conn *c = h->conns; c; c = c->next) n += http_same_client(&c->addr, a);
    pthread_mutex_unlock(&h->cmu);
    return n;
}

static void http_pend_close(http_server *h, http_pend *p)
{
    epoll_ctl(h->efd, EPOLL_CTL_DEL, p->fd, NULL);
    close(p->fd);
    pthread_mutex_lock(&h->cmu);
    h->pend[p->i] = h->pend[--h->n_pend];
    h->pend[p->i]->i = p->i;
    pthread_mutex_unlock(&h->cmu);
    free(p);
}

/* Answers a refused connection and lingers: writing is shut down (the client sees the end of
 * the answer) and what it still sends is drained, so closing does not reset the answer away. */
static void http_pend_refuse(http_server *h, http_pend *p, int shape, int status, const char *message, bool retry)
{
    http_raw_error(h, p->fd, shape, status, message, retry);
    shutdown(p->fd, SHUT_WR);
    p->lingering = true;
    p->t_close = util_now() + HTTP_LINGER_S;
}

/* Drains a lingering connection; closes it at EOF. */
static void http_pend_drain(http_server *h, http_pend *p)
{
    char buf[4096];
    for (;;) {
        ssize_t n = recv(p->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) continue;
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        http_pend_close(h, p);
        return;
    }
}

static bool http_path_is_ops(http_server *h, const char *path, size_t len)
{
    for (int i = 0; i < h->n_routes; i++)
        if (h->routes[i].ops && strlen(h->routes[i].path) == len && !memcmp(h->routes[i].path, path, len)) return true;
    return false;
}

/* The path of a checked head, NUL-terminated (truncated), or "" when it was not parsed. */
static void http_head_path(const http_server *h, const http_head *hd, char *out, size_t outsz)
{
    snprintf(out, outsz, "%.*s", (int)TM_MIN(hd->path_len, outsz - 1), h->peek + hd->path_off);
}

/* A waiting connection has news: peek at its head (and a chunked body's start); refuse it,
 * wait for more, or hand it to MHD. */
static void http_pend_ready(http_server *h, http_pend *p, bool hup)
{
    if (p->lingering) {
        http_pend_drain(h, p);
        return;
    }
    ssize_t n = recv(p->fd, h->peek, HTTP_PEEK_MAX, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {  /* gone before a whole head */
        http_pend_close(h, p);
        return;
    }
    if (n < 0) return;
    p->n_seen = (size_t)n;
    http_head hd;
    http_head_status hs = http_head_check(h->peek, (size_t)n, HTTP_HEAD_MAX, HTTP_URI_MAX, h->o.max_body, &hd);
    char path[256];
    http_head_path(h, &hd, path, sizeof path);
    int shape = http_shape_of(h, path);
    if (hs == HTTP_HEAD_BAD) {
        http_pend_refuse(h, p, shape, hd.status, hd.message, false);
        return;
    }
    if (hs == HTTP_HEAD_INCOMPLETE) {
        if (hup) http_pend_close(h, p);  /* half a head and the client stopped sending */
        return;
    }
    if (!http_path_is_ops(h, h->peek + hd.path_off, hd.path_len)) {
        int n_served;
        pthread_mutex_lock(&h->cmu);
        n_served = h->n_conns;
        pthread_mutex_unlock(&h->cmu);
        if (n_served >= h->o.max_connections) {
            http_pend_refuse(h, p, shape, 503, "the server is at its connection limit, retry shortly", true);
            return;
        }
        /* this connection is among the waiting ones http_client_count sees: hence > */
        if (http_client_count(h, &p->addr, true) > h->o.max_client_connections) {
            http_pend_refuse(h, p, shape, 429, "too many connections from this client", true);
            return;
        }
    }
    if (hd.chunked) {  /* MHD answers a bad chunk with HTML: check what fits in the window here */
        size_t body_len;
        http_head bd;
        http_head_status cs = http_head_chunked(h->peek + hd.head_len, (size_t)n - hd.head_len, h->o.max_body, &body_len, &bd);
        if (cs == HTTP_HEAD_BAD) {
            http_pend_refuse(h, p, shape, bd.status, bd.message, false);
            return;
        }
        if (cs == HTTP_HEAD_INCOMPLETE && (size_t)n < HTTP_PEEK_MAX) {
            if (hup) http_pend_close(h, p);
            return;
        }
    }
    /* hand over: MHD owns the fd from here (and closes it, also when it refuses) */
    int fd = p->fd;
    struct sockaddr_storage addr = p->addr;
    socklen_t addrlen = p->addrlen;
    epoll_ctl(h->efd, EPOLL_CTL_DEL, fd, NULL);
    pthread_mutex_lock(&h->cmu);
    h->pend[p->i] = h->pend[--h->n_pend];
    h->pend[p->i]->i = p->i;
    pthread_mutex_unlock(&h->cmu);
    free(p);
    if (MHD_add_connection(h->d, fd, (struct sockaddr *)&addr, addrlen) != MHD_YES)
        log_debug("http: connection refused by the HTTP library: %s", strerror(errno));
}

static void http_gate_accept(http_server *h)
{
    for (;;) {
        struct sockaddr_storage addr;
        socklen_t addrlen = sizeof addr;
        int fd = accept4(h->lfd, (struct sockaddr *)&addr, &addrlen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE) {
                /* the connection stays in the backlog: stop listening until the next scan
                 * (the listening socket would wake the loop at once, again and again) */
                struct epoll_event ev = { .events = 0, .data.ptr = &h->lfd };
                epoll_ctl(h->efd, EPOLL_CTL_MOD, h->lfd, &ev);
                h->accept_paused = true;
                if (util_now() - h->t_fd_warned > 10) {
                    log_warn("http: out of file descriptors: new connections wait in the backlog (raise `ulimit -n`)");
                    h->t_fd_warned = util_now();
                }
            }
            return;
        }
        if (h->n_pend >= h->max_pending) {
            /* the gate is full (of slow heads, most likely): the connection that has waited
             * longest goes, so that a new one, whose head may be whole at once, gets its turn */
            http_pend *old = h->pend[0];
            for (int i = 1; i < h->n_pend; i++)
                if (h->pend[i]->t0 < old->t0) old = h->pend[i];
            if (!old->lingering)
                http_raw_error(h, old->fd, http_shape_of(h, ""), 503, "the server is at its connection limit, retry shortly", true);
            http_pend_close(h, old);
        }
        http_pend *p = xcalloc(1, sizeof *p);
        p->fd = fd;
        p->addr = addr;
        p->addrlen = addrlen;
        p->t0 = util_now();
        pthread_mutex_lock(&h->cmu);
        p->i = h->n_pend;
        h->pend[h->n_pend++] = p;
        pthread_mutex_unlock(&h->cmu);
        /* here only those waiting count (the path, unknown yet, may be an ops route): one
         * address cannot fill the gate with slow heads */
        if (http_client_count(h, &addr, false) > h->o.max_client_connections)
            http_pend_refuse(h, p, http_shape_of(h, ""), 429, "too many connections from this client", true);
        struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = p };
        if (epoll_ctl(h->efd, EPOLL_CTL_ADD, fd, &ev)) {
            http_pend_close(h, p);
            continue;
        }
        if (!p->lingering) http_pend_ready(h, p, false);  /* the head may be there already */
    }
}

/* Deadlines: heads in the gate, lingering closes, and MHD connections' bodies and keep-alive
 * heads. */
static void http_gate_scan(http_server *h)
{
    double now = util_now();
    for (int i = h->n_pend - 1; i >= 0; i--) {
        http_pend *p = h->pend[i];
        if (p->lingering) {
            if (now >= p->t_close) http_pend_close(h, p);
        } else if (now - p->t0 > h->o.request_timeout_s + (double)p->n_seen / (double)h->o.min_rate) {
            /* the path, if the request line got here, chooses the shape */
            ssize_t n = recv(p->fd, h->peek, HTTP_PEEK_MAX, MSG_PEEK | MSG_DONTWAIT);
            http_head hd;
            char path[256] = "";
            if (n > 0) {
                http_head_check(h->peek, (size_t)n, HTTP_HEAD_MAX, HTTP_URI_MAX, h->o.max_body, &hd);
                http_head_path(h, &hd, path, sizeof path);
            }
            if (n > 0) http_pend_refuse(h, p, http_shape_of(h, path), 408, "the request did not arrive in time", false);
            else http_pend_close(h, p);  /* nothing sent at all: just close */
        }
    }
    double grace = h->o.request_timeout_s, idle = h->o.idle_timeout_s;
    pthread_mutex_lock(&h->cmu);
    for (http_conn *c = h->conns; c; c = c->next) {
        if (c->fd < 0) continue;
        if (c->t_kill) {  /* lingered: MHD's thread now reads the end and closes */
            if (now >= c->t_kill) {
                shutdown(c->fd, SHUT_RDWR);
                c->t_kill = INFINITY;
            }
            continue;
        }
        double age = now - c->t_phase;
        bool late = false;
        const char *why = NULL;
        if (c->phase == HTTP_PHASE_BODY && age > grace + (double)c->n_body / (double)h->o.min_rate) {
            late = true;
            why = "the request body arrived too slowly";
        } else if (c->phase == HTTP_PHASE_HEAD && age > grace) {
            late = true;
            why = "the request head did not arrive in time";
        } else if (c->phase == HTTP_PHASE_IDLE && age > idle + grace) {
            late = true;  /* a keep-alive request trickling its request line */
        }
        if (!late) continue;
        /* the answer, then a lingering close as in the gate: writing ends now (the client reads
         * the 408 and its end), reading after HTTP_LINGER_S */
        if (why) http_raw_error(h, c->fd, c->shape, 408, why, false);
        shutdown(c->fd, SHUT_WR);
        c->t_kill = now + HTTP_LINGER_S;
    }
    pthread_mutex_unlock(&h->cmu);
}

static void *http_gate_main(void *arg)
{
    http_server *h = arg;
    struct epoll_event evs[64];
    double t_scan = util_now();
    for (;;) {
        int n = epoll_wait(h->efd, evs, 64, HTTP_GATE_TICK_MS);
        if (n < 0 && errno != EINTR) {
            log_error("http: epoll_wait: %s", strerror(errno));
            break;
        }
        bool stop = false, accept = false;
        for (int i = 0; i < n; i++) {
            void *ptr = evs[i].data.ptr;
            if (ptr == &h->lfd) accept = true;
            else if (ptr == &h->stopfd) stop = true;
            else http_pend_ready(h, ptr, (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
        }
        /* accepting last: a full gate frees its oldest waiting connection to make room, and
         * that one's event may still be further on in this batch */
        if (accept) http_gate_accept(h);
        if (stop) break;
        double now = util_now();
        if (now - t_scan >= HTTP_GATE_TICK_MS / 1000.0) {
            http_gate_scan(h);
            t_scan = now;
            if (h->accept_paused) {
                struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &h->lfd };
                epoll_ctl(h->efd, EPOLL_CTL_MOD, h->lfd, &ev);
                h->accept_paused = false;
            }
        }
    }
    while (h->n_pend) http_pend_close(h, h->pend[h->n_pend - 1]);
    return NULL;
}

/* ---- server ---- */

http_status http_server_new(const http_opts *opts, http_server **out, char *err, size_t errsz)
{
    *out = NULL;
    http_server *h = xcalloc(1, sizeof *h);
    h->lfd = h->efd = h->stopfd = -1;
    http_opts o = opts ? *opts : (http_opts){ 0 };
    o.host = xstrdup(!o.host || !strcmp(o.host, "localhost") ? "127.0.0.1" : o.host);
    if (o.max_body == 0) o.max_body = 8u << 20;
    if (o.idle_timeout_s <= 0) o.idle_timeout_s = 60;
    if (o.request_timeout_s <= 0) o.request_timeout_s = 30;
    if (o.min_rate == 0) o.min_rate = 4096;
    if (o.max_connections <= 0) o.max_connections = 1024;
    if (o.max_client_connections <= 0) o.max_client_connections = 256;
    if (!o.errors) o.errors = &http_plain_errors;
    h->o = o;
    h->keys = xcalloc((size_t)(o.n_api_keys > 0 ? o.n_api_keys : 1), sizeof *h->keys);
    h->key_sha = xcalloc((size_t)(o.n_api_keys > 0 ? o.n_api_keys : 1), sizeof *h->key_sha);
    for (int i = 0; i < o.n_api_keys; i++) {
        h->keys[h->n_keys] = xstrdup(o.api_keys[i]);
        http_sha256(o.api_keys[i], h->key_sha[h->n_keys]);
        h->n_keys++;
    }
    h->o.api_keys = NULL;
    for (int i = 0; i < o.n_cors_origin && i < HTTP_MAX_CORS; i++) h->cors[h->n_cors++] = xstrdup(o.cors_origin[i]);
    memset(h->o.cors_origin, 0, sizeof h->o.cors_origin);
    pthread_mutex_init(&h->mu, NULL);
    pthread_mutex_init(&h->cmu, NULL);
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, o.host, &a4) != 1 && inet_pton(AF_INET6, o.host, &a6) != 1) {
        snprintf(err, errsz, "bad listen address '%s' (want a numeric IPv4 or IPv6 address)", o.host);
        http_server_free(h);
        return HTTP_ERR_ARG;
    }
    *out = h;
    return HTTP_OK;
}

/* A route's path matches: exactly, or, when its last segment is a lone star, any path
 * under it (at least one more byte, slashes included: model ids such as "org/name"). */
static bool http_path_match(const char *route, const char *path)
{
    size_t n = strlen(route);
    if (n >= 2 && route[n - 1] == '*' && route[n - 2] == '/') return !strncmp(route, path, n - 1) && path[n - 1];
    return !strcmp(route, path);
}

static void http_route_add(http_server *h, const char *method, const char *path, http_handler fn, void *user, bool ops)
{
    if (h->n_routes >= HTTP_MAX_ROUTES) {
        log_error("http: too many routes (%s %s dropped)", method, path);
        return;
    }
    http_route_t *rt = &h->routes[h->n_routes++];
    rt->method = xstrdup(method);
    rt->path = xstrdup(path);
    rt->fn = fn;
    rt->user = user;
    rt->ops = ops;
}

void http_route(http_server *h, const char *method, const char *path, http_handler fn, void *user)
{
    http_route_add(h, method, path, fn, user, false);
}

void http_route_ops(http_server *h, const char *method, const char *path, http_handler fn, void *user)
{
    http_route_add(h, method, path, fn, user, true);
}

/* Raises the soft fd limit to the hard one, then fits the connection limits into it: every
 * waiting and served connection is an fd, and the model, the block store and the cluster
 * links need some of their own. */
static void http_fit_fd_limit(http_server *h)
{
    struct rlimit rl;
    h->max_pending = 4 * h->o.max_connections;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t cur = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl)) rl.rlim_cur = cur;
    }
    long avail = rl.rlim_cur == RLIM_INFINITY ? 1L << 20 : (long)rl.rlim_cur - 256;
    long want = (long)h->max_pending + h->o.max_connections + HTTP_OPS_RESERVE;
    if (want <= avail) return;
    int mc = (int)TM_MAX(16, TM_MIN((long)h->o.max_connections, (avail - HTTP_OPS_RESERVE) / 2));
    int mp = (int)TM_MAX(16, avail - HTTP_OPS_RESERVE - mc);
    log_warn("http: %ld file descriptors allowed: serving %d connections (not %d), %d waiting for their headers "
             "(raise `ulimit -n` for more)", (long)rl.rlim_cur, mc, h->o.max_connections, mp);
    h->o.max_connections = mc;
    h->max_pending = mp;
}

static int http_listen(http_server *h, char *err, size_t errsz)
{
    struct sockaddr_storage ss = { 0 };
    socklen_t sl;
    struct sockaddr_in *sa4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sa6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, h->o.host, &sa4->sin_addr) == 1) {
        sa4->sin_family = AF_INET;
        sa4->sin_port = htons((uint16_t)h->o.port);
        sl = sizeof *sa4;
    } else {
        inet_pton(AF_INET6, h->o.host, &sa6->sin6_addr);
        sa6->sin6_family = AF_INET6;
        sa6->sin6_port = htons((uint16_t)h->o.port);
        sl = sizeof *sa6;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, 4096)) {
        snprintf(err, errsz, "cannot listen on %s:%d: %s", h->o.host, h->o.port, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    h->port = ntohs(ss.ss_family == AF_INET ? sa4->sin_port : sa6->sin6_port);
    return fd;
}

http_status http_server_start(http_server *h, char *err, size_t errsz)
{
    http_fit_fd_limit(h);
    if ((h->lfd = http_listen(h, err, errsz)) < 0) return HTTP_ERR_BIND;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, http_access, h,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)h->o.idle_timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(h->o.max_connections + HTTP_OPS_RESERVE),
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(4 * HTTP_HEAD_MAX),
                            MHD_OPTION_NOTIFY_COMPLETED, http_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, http_notify_conn, h,
                            MHD_OPTION_URI_LOG_CALLBACK, http_uri_seen, h,
                            MHD_OPTION_EXTERNAL_LOGGER, http_log, h,
                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(256 * 1024),
                            MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errsz, "cannot start the HTTP server on %s:%d", h->o.host, h->port);
        return HTTP_ERR_BIND;
    }
    h->pend = xcalloc((size_t)h->max_pending, sizeof *h->pend);
    h->peek = xmalloc(HTTP_PEEK_MAX);
    h->efd = epoll_create1(EPOLL_CLOEXEC);
    h->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event el = { .events = EPOLLIN, .data.ptr = &h->lfd }, es = { .events = EPOLLIN, .data.ptr = &h->stopfd };
    if (h->efd < 0 || h->stopfd < 0 || epoll_ctl(h->efd, EPOLL_CTL_ADD, h->lfd, &el) ||
        epoll_ctl(h->efd, EPOLL_CTL_ADD, h->stopfd, &es) || pthread_create(&h->gate, NULL, http_gate_main, h)) {
        snprintf(err, errsz, "cannot start the HTTP gate: %s", strerror(errno));
        return HTTP_ERR_NOMEM;
    }
    h->gate_running = true;
    return HTTP_OK;
}

int http_server_port(const http_server *h) { return h->port; }

void http_server_free(http_server *h)
{
    if (!h) return;
    h->stopping = 1;
    if (h->gate_running) {
        uint64_t one = 1;
        if (write(h->stopfd, &one, sizeof one) < 0) log_error("http: cannot stop the gate: %s", strerror(errno));
        pthread_join(h->gate, NULL);
    }
    if (h->lfd >= 0) close(h->lfd);
    if (h->d) MHD_stop_daemon(h->d);
    if (h->efd >= 0) close(h->efd);
    if (h->stopfd >= 0) close(h->stopfd);
    free(h->pend);
    free(h->peek);
    for (int i = 0; i < h->n_routes; i++) {
        free(h->routes[i].method);
        free(h->routes[i].path);
    }
    for (int i = 0; i < h->n_keys; i++) free(h->keys[i]);
    for (int i = 0; i < h->n_cors; i++) free(h->cors[i]);
    free(h->keys);
    free(h->key_sha);
    free((char *)h->o.host);
    pthread_mutex_destroy(&h->mu);
    pthread_mutex_destroy(&h->cmu);
    free(h);
}
