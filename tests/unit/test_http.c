/*
 * test_http: the HTTP gate's checks of request heads and chunked bodies (http_head_check,
 * http_head_chunked), fed whole and byte by byte (a head is checked as it trickles in:
 * every prefix of a good head must be INCOMPLETE, never BAD), and the error bodies in the
 * shapes the APIs register (escaped) and in the layer's own shape when none is registered.
 */
#include "harness.h"

#include <jansson.h>

#include "http/http.h"
#include "recipe/api_http.h"

#define MAXB 4096

static http_head_status check(const char *z, http_head *hd) { return http_head_check(z, strlen(z), 1024, 64, MAXB, hd); }

/* Every proper prefix of a good head is INCOMPLETE; the whole is OK. */
static bool good_head(const char *z)
{
    http_head hd;
    size_t n = strlen(z);
    for (size_t i = 0; i < n; i++)
        if (http_head_check(z, i, 1024, 64, MAXB, &hd) != HTTP_HEAD_INCOMPLETE) {
            fprintf(stderr, "  prefix %zu of %s: status %d %s\n", i, z, hd.status, hd.message ? hd.message : "");
            return false;
        }
    return http_head_check(z, n, 1024, 64, MAXB, &hd) == HTTP_HEAD_OK && hd.head_len == n;
}

static int bad_status(const char *z)
{
    http_head hd;
    return check(z, &hd) == HTTP_HEAD_BAD ? hd.status : 0;
}

TEST(test_http_head_good)
{
    CHECK(good_head("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    CHECK(good_head("POST /v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nX-Api-Key: k\r\n\r\n"));
    CHECK(good_head("GET / HTTP/1.0\r\n\r\n"));                       /* 1.0 needs no Host */
    CHECK(good_head("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n"));
    CHECK(good_head("\r\nGET /x HTTP/1.1\nHost: x\n\n"));               /* a stray CRLF, bare LFs */
    http_head hd;
    const char *z = "POST /v1/messages/count_tokens?x=1 HTTP/1.1\r\nHost: x\r\n\r\nBODY";
    CHECK(check(z, &hd) == HTTP_HEAD_OK);
    CHECK(hd.path_len == strlen("/v1/messages/count_tokens") && !memcmp(z + hd.path_off, "/v1/messages/count_tokens", hd.path_len));
    CHECK(hd.head_len == strlen(z) - 4);
    CHECK(!hd.chunked && !hd.get_or_head);
}

TEST(test_http_head_bad)
{
    CHECK(bad_status("GET /x HTTP/2.0\r\nHost: x\r\n\r\n") == 505);
    CHECK(bad_status("GET /x HTTP/1.2\r\nHost: x\r\n\r\n") == 505);
    CHECK(bad_status("GET /x HTTQ/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(bad_status("GET /x\r\n\r\n") == 400);                       /* HTTP/0.9 */
    CHECK(bad_status("GET  /x HTTP/1.1\r\n") == 400);
    CHECK(bad_status("G(T /x HTTP/1.1\r\n") == 400);
    CHECK(bad_status("GET /x HTTP/1.1\r\n\r\n") == 400);              /* no Host */
    CHECK(bad_status("GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400);
    CHECK(bad_status("GET /x HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n") == 400);
    CHECK(bad_status("GET /x HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n") == 400);
    CHECK(bad_status("GET /x HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n") == 400);
    CHECK(bad_status("GET /x HTTP/1.1\r\nHost: x\r\nA: b\x01\r\n\r\n") == 400);
    CHECK(bad_status("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n") == 400);
    CHECK(bad_status("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n") == 400);
    CHECK(bad_status("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n") == 400);
    CHECK(bad_status("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4097\r\n\r\n") == 413);
    CHECK(bad_status("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999999999999999\r\n\r\n") == 413);
    CHECK(bad_status("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n") == 501);
    CHECK(bad_status("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n") == 400);
    /* said as soon as it shows, before the head is whole */
    char big[200];
    snprintf(big, sizeof big, "GET /%0100d", 0);
    CHECK(bad_status(big) == 414);
    char hdrs[1100];
    snprintf(hdrs, sizeof hdrs, "GET /x HTTP/1.1\r\nX: %01070d", 0);
    CHECK(bad_status(hdrs) == 431);
    CHECK(bad_status("GET /x HTTP/1.1\r\nHost: x\r\nA: \0\r\n\r\n") == 0);  /* strlen stops at the NUL: incomplete */
    http_head hd;
    const char nul[] = "GET /x HTTP/1.1\r\nHost: x\r\nA: \0\r\n\r\n";
    CHECK(http_head_check(nul, sizeof nul - 1, 1024, 64, MAXB, &hd) == HTTP_HEAD_BAD && hd.status == 400);
}

static http_head_status chunked(const char *z, size_t *len, int *status)
{
    http_head hd = { 0 };
    http_head_status s = http_head_chunked(z, strlen(z), MAXB, len, &hd);
    *status = hd.status;
    return s;
}

TEST(test_http_chunked)
{
    size_t len = 0;
    int st = 0;
    const char *good = "5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nTrailer: x\r\n\r\nNEXT";
    CHECK(chunked(good, &len, &st) == HTTP_HEAD_OK && len == strlen(good) - 4);
    for (size_t i = 0; i < strlen(good) - 4; i++) {
        http_head hd = { 0 };
        CHECKF(http_head_chunked(good, i, MAXB, &len, &hd) == HTTP_HEAD_INCOMPLETE, "prefix %zu", i);
    }
    CHECK(chunked("zz\r\nhello\r\n", &len, &st) == HTTP_HEAD_BAD && st == 400);
    CHECK(chunked("5\r\nhelloXX", &len, &st) == HTTP_HEAD_BAD && st == 400);
    CHECK(chunked("5\nhello\r\n", &len, &st) == HTTP_HEAD_BAD && st == 400);
    CHECK(chunked("0\r\nnot a trailer\r\n\r\n", &len, &st) == HTTP_HEAD_BAD && st == 400);
    CHECK(chunked("11111111111111111\r\n", &len, &st) == HTTP_HEAD_BAD && st == 400);
    CHECK(chunked("1001\r\nabc", &len, &st) == HTTP_HEAD_BAD && st == 413);          /* one size past the limit */
    CHECK(chunked("800\r\n", &len, &st) == HTTP_HEAD_INCOMPLETE);
    char two[4200];
    snprintf(two, sizeof two, "800\r\n%02048d\r\n801\r\n", 0);
    CHECK(chunked(two, &len, &st) == HTTP_HEAD_BAD && st == 413);                   /* the sum past it */
}

/* The body the server writes for path's error, with the shapes errors (NULL: its own). */
static void error_body(const http_error_shape *errors, const char *path, int status, const char *msg, bytebuf *out)
{
    http_opts o = { .errors = errors };
    http_server *h = NULL;
    char err[256];
    out->len = 0;
    if (http_server_new(&o, &h, err, sizeof err) != HTTP_OK) {
        CHECKF(false, "http_server_new: %s", err);
        return;
    }
    http_error_body(h, out, path, status, msg);
    http_server_free(h);
}

TEST(test_http_error_shapes)
{
    bytebuf b = { 0 };
    error_body(&api_http_errors, "/v1/messages", 404, "not found", &b);
    CHECKF(!strcmp(b.p, "{\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"not found\"}}"), "%s", b.p);
    error_body(&api_http_errors, "/v1/messages/count_tokens", 503, "busy", &b);
    CHECKF(strstr(b.p, "overloaded_error") != NULL, "%s", b.p);
    error_body(&api_http_errors, "/v1/chat/completions", 503, "busy", &b);
    CHECKF(!strcmp(b.p, "{\"error\":{\"message\":\"busy\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"), "%s", b.p);
    error_body(&api_http_errors, "/v1/messagesX", 429, "slow down", &b);
    CHECKF(!strcmp(b.p, "{\"error\":{\"message\":\"slow down\",\"type\":\"rate_limit_exceeded\",\"param\":null,\"code\":null}}"), "%s", b.p);
    error_body(&api_http_errors, "", 400, "bad", &b);
    CHECKF(!strcmp(b.p, "{\"type\":\"error\",\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}"), "%s", b.p);
    /* none registered: one plain shape on every path */
    error_body(NULL, "/v1/messages", 404, "not found", &b);
    CHECKF(!strcmp(b.p, "{\"error\":{\"message\":\"not found\"}}"), "%s", b.p);
    bytebuf_free(&b);
}

/* A message that quotes the client's bytes stays valid JSON in every shape. */
TEST(test_http_error_escaped)
{
    const char *msg = "bad \"path\" \\ \n\x01";
    const char *paths[] = { "", "/v1/messages", "/v1/completions" };
    bytebuf b = { 0 };
    for (int i = 0; i < 4; i++) {
        error_body(i < 3 ? &api_http_errors : NULL, paths[i % 3], 400, msg, &b);
        json_error_t je;
        json_t *v = json_loadb(b.p, b.len, 0, &je);
        CHECKF(v != NULL, "%s: %s", b.p, je.text);
        json_t *e = json_object_get(v, "error");
        CHECK(e && json_is_string(json_object_get(e, "message")) &&
              !strcmp(json_string_value(json_object_get(e, "message")), msg));
        json_decref(v);
    }
    bytebuf_free(&b);
}

int main(void)
{
    RUN(test_http_head_good);
    RUN(test_http_head_bad);
    RUN(test_http_chunked);
    RUN(test_http_error_shapes);
    RUN(test_http_error_escaped);
    printf("%d passed, %d failed\n", harness_passed, harness_failed);
    return harness_failed ? 1 : 0;
}
