/*
 * http: router and streaming responses over libmicrohttpd. See http.h for the design.
 *
 * MHD runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION with poll()), so a
 * handler and a stream's pull function may block. Per request: the access handler is called
 * once at the headers (the http_request is allocated then, and an oversize Content-Length is
 * answered 413 at once), once per body piece (appended, or dropped once over max_body), and
 * once at the end, when the route runs. A streaming response is an MHD callback response of
 * unknown size (chunked encoding); its reader calls the pull function in a loop of short
 * waits, and between waits polls the socket for a hang-up (POLLRDHUP), so a client that
 * goes away is noticed within a wait even while no tokens come. The response's free callback
 * calls the handler's done function, with client_gone unless the stream had ended.
 *
 * s->mu guards only the statistics.
 */
#define _GNU_SOURCE
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "util/util.h"

#define HTTP_MAX_ROUTES 32
#define HTTP_MAX_RESP_HEADERS 8
#define HTTP_PULL_WAIT_MS 25      /* one wait of a stream pull before checking the socket */

typedef struct {
    char *method;                /* "GET", "POST", ... */
    char *path;                  /* exact path */
    http_handler fn;
    void *user;
} http_route_t;

struct http_server {
    http_opts o;                 /* resolved options (host/keys copied) */
    char **keys;                 /* (n_keys) accepted API keys */
    int n_keys;
    http_route_t routes[HTTP_MAX_ROUTES];
    int n_routes;
    struct MHD_Daemon *d;
    int port;                    /* bound port */
    volatile int stopping;       /* http_server_free in progress: streams end */
    pthread_mutex_t mu;          /* guards st */
    http_stats st;
};

struct http_request {
    http_server *h;
    struct MHD_Connection *conn;
    const char *method;          /* MHD's strings, valid for the request */
    const char *path;
    bytebuf body;               /* the request body, NUL-terminated */
    bool too_large;              /* body over max_body: answer 413 */
    bool responded;              /* a response was queued */
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
} http_stream;

/* ---- statistics ---- */

static void http_count_status(http_server *h, int status)
{
    pthread_mutex_lock(&h->mu);
    int c = status / 100;
    if (c >= 1 && c <= 5) h->st.n_by_class[c]++;
    if (status == 413) h->st.n_too_large++;
    pthread_mutex_unlock(&h->mu);
}

void http_get_stats(http_server *h, http_stats *st)
{
    pthread_mutex_lock(&h->mu);
    *st = h->st;
    pthread_mutex_unlock(&h->mu);
}

/* ---- responses ---- */

static void http_apply_headers(http_request *r, struct MHD_Response *resp, const char *content_type)
{
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

static void http_error(http_request *r, int status, const char *type, const char *msg)
{
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":null}}", msg, type);
    http_respond(r, status, "application/json", body, (size_t)n);
}

static bool http_client_gone(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    struct pollfd pfd = { .fd = ci->connect_fd, .events = POLLRDHUP };
    if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return true;
    return false;
}

bool http_request_client_gone(const http_request *r) { return http_client_gone(r->conn); }

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
        if (st->pend.len == 0 && !st->ended && http_client_gone(st->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
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

static bool http_key_eq(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la && i < lb; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

bool http_request_authorized(const http_request *r)
{
    return r->h->n_keys == 0 || http_request_api_key(r) != NULL;
}

const char *http_request_api_key(const http_request *r)
{
    http_server *h = r->h;
    if (h->n_keys == 0) return NULL;
    const char *auth = http_request_header(r, "Authorization");
    const char *xkey = http_request_header(r, "x-api-key");
    const char *bearer = NULL;
    if (auth && !strncasecmp(auth, "Bearer ", 7)) {
        bearer = auth + 7;
        while (*bearer == ' ') bearer++;
    }
    for (int i = 0; i < h->n_keys; i++) {
        if (bearer && http_key_eq(bearer, h->keys[i])) return h->keys[i];
        if (xkey && http_key_eq(xkey, h->keys[i])) return h->keys[i];
    }
    return NULL;
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

static void http_dispatch(http_request *r)
{
    http_server *h = r->h;
    pthread_mutex_lock(&h->mu);
    h->st.n_requests++;
    pthread_mutex_unlock(&h->mu);
    if (r->too_large) {
        http_error(r, 413, "invalid_request_error", "request body too large");
        return;
    }
    bool path_known = false;
    for (int i = 0; i < h->n_routes; i++) {
        http_route_t *rt = &h->routes[i];
        if (strcmp(rt->path, r->path)) continue;
        path_known = true;
        if (strcmp(rt->method, r->method)) continue;
        rt->fn(r, rt->user);
        if (!r->responded) http_error(r, 500, "server_error", "the handler did not respond");
        return;
    }
    if (path_known) http_error(r, 405, "invalid_request_error", "method not allowed");
    else http_error(r, 404, "invalid_request_error", "not found");
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                   const char *version, const char *upload_data, size_t *upload_data_size,
                                   void **con_cls)
{
    http_server *h = cls;
    (void)version;
    http_request *r = *con_cls;
    if (!r) {
        r = xcalloc(1, sizeof *r);
        r->h = h;
        r->conn = conn;
        r->method = method;
        r->path = url;
        *con_cls = r;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > h->o.max_body) {
                r->too_large = true;
                http_error(r, 413, "invalid_request_error", "request body too large");
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
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
    if (!r->body.p) bytebuf_append(&r->body, NULL, 0);
    http_dispatch(r);
    return r->responded ? MHD_YES : MHD_NO;
}

static void http_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls; (void)conn; (void)toe;
    http_request_free(*con_cls);
    *con_cls = NULL;
}

static void http_notify_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
                             enum MHD_ConnectionNotificationCode code)
{
    http_server *h = cls;
    (void)conn; (void)socket_context;
    pthread_mutex_lock(&h->mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) h->st.n_connections++;
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED) h->st.n_connections--;
    pthread_mutex_unlock(&h->mu);
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

/* ---- server ---- */

http_status http_server_new(const http_opts *opts, http_server **out, char *err, size_t errsz)
{
    *out = NULL;
    http_server *h = xcalloc(1, sizeof *h);
    http_opts o = opts ? *opts : (http_opts){ 0 };
    o.host = xstrdup(!o.host || !strcmp(o.host, "localhost") ? "127.0.0.1" : o.host);
    if (o.max_body == 0) o.max_body = 8u << 20;
    if (o.idle_timeout_s <= 0) o.idle_timeout_s = 60;
    if (o.max_connections <= 0) o.max_connections = 1024;
    h->o = o;
    h->keys = xcalloc((size_t)(o.n_api_keys > 0 ? o.n_api_keys : 1), sizeof *h->keys);
    for (int i = 0; i < o.n_api_keys; i++) h->keys[h->n_keys++] = xstrdup(o.api_keys[i]);
    h->o.api_keys = NULL;
    pthread_mutex_init(&h->mu, NULL);
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

void http_route(http_server *h, const char *method, const char *path, http_handler fn, void *user)
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
}

http_status http_server_start(http_server *h, char *err, size_t errsz)
{
    struct sockaddr_in sa4 = { 0 };
    struct sockaddr_in6 sa6 = { 0 };
    struct sockaddr *sa;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (inet_pton(AF_INET, h->o.host, &sa4.sin_addr) == 1) {
        sa4.sin_family = AF_INET;
        sa4.sin_port = htons((uint16_t)h->o.port);
        sa = (struct sockaddr *)&sa4;
    } else {
        inet_pton(AF_INET6, h->o.host, &sa6.sin6_addr);
        sa6.sin6_family = AF_INET6;
        sa6.sin6_port = htons((uint16_t)h->o.port);
        sa = (struct sockaddr *)&sa6;
        flags |= MHD_USE_IPv6;
    }
    h->d = MHD_start_daemon(flags, (uint16_t)h->o.port, NULL, NULL, http_access, h,
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)h->o.idle_timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)h->o.max_connections,
                            MHD_OPTION_NOTIFY_COMPLETED, http_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, http_notify_conn, h,
                            MHD_OPTION_EXTERNAL_LOGGER, http_log, h,
                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(256 * 1024),
                            MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errsz, "cannot listen on %s:%d: %s", h->o.host, h->o.port, strerror(errno ? errno : EADDRINUSE));
        return HTTP_ERR_BIND;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : h->o.port;
    return HTTP_OK;
}

int http_server_port(const http_server *h) { return h->port; }

void http_server_free(http_server *h)
{
    if (!h) return;
    h->stopping = 1;
    if (h->d) MHD_stop_daemon(h->d);
    for (int i = 0; i < h->n_routes; i++) {
        free(h->routes[i].method);
        free(h->routes[i].path);
    }
    for (int i = 0; i < h->n_keys; i++) free(h->keys[i]);
    free(h->keys);
    free((char *)h->o.host);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
