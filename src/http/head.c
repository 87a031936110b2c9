/*
 * head: the checks the HTTP gate makes on a request before libmicrohttpd sees it (see
 * http.c): the head, and the start of a chunked body. Pure functions over the bytes seen so
 * far, called again as more arrive, so every proper prefix of a good request must come out
 * INCOMPLETE and an error is said as soon as the bytes show it (a URI already too long, a
 * chunk size already past the body limit). Stricter than libmicrohttpd on every point, so
 * that it never reaches its own HTML error pages for a head the gate passed: no folded
 * header lines, no control characters, one Host on HTTP/1.1, Content-Length digits only and
 * agreeing, Transfer-Encoding exactly "chunked" and not with Content-Length.
 */
#include "http/http.h"

#include <string.h>
#include <strings.h>

#include "util/util.h"

static bool http_is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static http_head_status http_head_bad(http_head *out, int status, const char *message)
{
    out->status = status;
    out->message = message;
    return HTTP_HEAD_BAD;
}

/* The end of the line starting at p (its LF), or NULL when none before end. */
static const char *http_line_end(const char *p, const char *end) { return memchr(p, '\n', (size_t)(end - p)); }

http_head_status http_head_check(const char *buf, size_t len, size_t head_max, size_t uri_max, uint64_t max_body,
                                 http_head *out)
{
    memset(out, 0, sizeof *out);
    const char *p = buf, *end = buf + len;
    while (p < end && (*p == '\r' || *p == '\n') && p - buf < 8) p++;  /* stray CRLFs before a request */
    /* request line: METHOD SP TARGET SP HTTP/d.d CRLF */
    const char *m = p;
    while (p < end && http_is_tchar((unsigned char)*p)) p++;
    if (p == end) return len >= head_max ? http_head_bad(out, 431, "the request head is too large") : HTTP_HEAD_INCOMPLETE;
    if (p == m || *p != ' ') return http_head_bad(out, 400, "malformed request line");
    out->get_or_head = (p - m == 3 && !memcmp(m, "GET", 3)) || (p - m == 4 && !memcmp(m, "HEAD", 4));
    const char *t = ++p;
    while (p < end && (unsigned char)*p > ' ' && *p != 0x7f) p++;
    out->path_off = (size_t)(t - buf);
    const char *q = memchr(t, '?', (size_t)(p - t));
    out->path_len = (size_t)((q ? q : p) - t);
    if ((size_t)(p - t) > uri_max) return http_head_bad(out, 414, "the request URI is too long");
    if (p == end) return len >= head_max ? http_head_bad(out, 431, "the request head is too large") : HTTP_HEAD_INCOMPLETE;
    if (p == t || *p != ' ') {
        out->path_len = 0;
        return http_head_bad(out, 400, "malformed request line");
    }
    p++;
    const char *le = http_line_end(p, end);
    if (!le) {
        if ((size_t)(end - p) > 10) return http_head_bad(out, 400, "malformed HTTP version");
        return len >= head_max ? http_head_bad(out, 431, "the request head is too large") : HTTP_HEAD_INCOMPLETE;
    }
    size_t vl = (size_t)(le - p) - (le > p && le[-1] == '\r');
    if (vl != 8 || memcmp(p, "HTTP/", 5) || p[5] < '0' || p[5] > '9' || p[6] != '.' || p[7] < '0' || p[7] > '9')
        return http_head_bad(out, 400, "malformed HTTP version");
    if (p[5] != '1' || p[7] > '1') return http_head_bad(out, 505, "HTTP version not supported: use HTTP/1.1");
    bool http11 = p[7] == '1';
    /* header fields, up to the blank line */
    int n_host = 0;
    bool has_cl = false, chunked = false;
    uint64_t cl = 0;
    for (p = le + 1;;) {
        le = http_line_end(p, end);
        if (!le) return len >= head_max ? http_head_bad(out, 431, "the request head is too large") : HTTP_HEAD_INCOMPLETE;
        if ((size_t)(le + 1 - buf) > head_max) return http_head_bad(out, 431, "the request head is too large");
        const char *ll = le - (le > p && le[-1] == '\r');
        if (ll == p) break;
        if (*p == ' ' || *p == '\t') return http_head_bad(out, 400, "folded header lines are not accepted");
        const char *n = p;
        while (p < ll && http_is_tchar((unsigned char)*p)) p++;
        if (p == n || p == ll || *p != ':') return http_head_bad(out, 400, "malformed header line");
        size_t nl = (size_t)(p - n);
        const char *v = p + 1;
        for (const char *x = v; x < ll; x++)
            if ((unsigned char)*x < ' ' && *x != '\t') return http_head_bad(out, 400, "control character in a header");
        while (v < ll && (*v == ' ' || *v == '\t')) v++;
        const char *ve = ll;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        if (nl == 4 && !strncasecmp(n, "host", 4)) n_host++;
        else if (nl == 14 && !strncasecmp(n, "content-length", 14)) {
            uint64_t x = 0;
            if (v == ve) return http_head_bad(out, 400, "Content-Length is not a number");
            for (const char *d = v; d < ve; d++) {
                if (*d < '0' || *d > '9') return http_head_bad(out, 400, "Content-Length is not a number");
                if (x > (UINT64_MAX - 9) / 10) return http_head_bad(out, 413, "request body too large");
                x = x * 10 + (uint64_t)(*d - '0');
            }
            if (has_cl && x != cl) return http_head_bad(out, 400, "conflicting Content-Length headers");
            has_cl = true;
            cl = x;
        } else if (nl == 17 && !strncasecmp(n, "transfer-encoding", 17)) {
            if (ve - v != 7 || strncasecmp(v, "chunked", 7) || chunked)
                return http_head_bad(out, 501, "Transfer-Encoding other than chunked is not supported");
            chunked = true;
        }
        p = le + 1;
    }
    if (memchr(buf, 0, (size_t)(le + 1 - buf))) return http_head_bad(out, 400, "NUL byte in the request head");
    if (http11 && n_host != 1) return http_head_bad(out, 400, "an HTTP/1.1 request needs exactly one Host header");
    if (has_cl && chunked) return http_head_bad(out, 400, "both Content-Length and Transfer-Encoding");
    if (has_cl && cl > max_body) return http_head_bad(out, 413, "request body too large");
    out->head_len = (size_t)(le + 1 - buf);
    out->chunked = chunked;
    return HTTP_HEAD_OK;
}

http_head_status http_head_chunked(const char *buf, size_t len, uint64_t max_body, size_t *body_len, http_head *out)
{
    const char *p = buf, *end = buf + len;
    uint64_t total = 0;
    for (;;) {
        /* chunk-size [; ext] CRLF */
        const char *le = http_line_end(p, end);
        const char *s = p;
        uint64_t sz = 0;
        int nd = 0;
        for (; (le ? p < le : p < end) && util_hexval(*p) >= 0; p++, nd++) {
            if (nd == 16) return http_head_bad(out, 400, "malformed chunked encoding: chunk size too long");
            sz = sz << 4 | (uint64_t)util_hexval(*p);
        }
        if (!le) {
            if (p < end && *p != ';' && *p != '\r') return http_head_bad(out, 400, "malformed chunked encoding: bad chunk size");
            if (end - s > 1024) return http_head_bad(out, 400, "malformed chunked encoding: chunk size line too long");
            return HTTP_HEAD_INCOMPLETE;
        }
        if (nd == 0 || (*p != ';' && *p != '\r') || le[-1] != '\r' || le - s > 1024)
            return http_head_bad(out, 400, "malformed chunked encoding: bad chunk size line");
        for (const char *x = p; x < le - 1; x++)
            if ((unsigned char)*x < ' ' && *x != '\t') return http_head_bad(out, 400, "malformed chunked encoding: control character");
        if (sz > max_body - total) return http_head_bad(out, 413, "request body too large");
        total += sz;
        p = le + 1;
        if (sz == 0) break;
        if ((uint64_t)(end - p) < sz + 2) return HTTP_HEAD_INCOMPLETE;
        p += sz;
        if (p[0] != '\r' || p[1] != '\n') return http_head_bad(out, 400, "malformed chunked encoding: no CRLF after a chunk");
        p += 2;
    }
    for (;;) {  /* trailer fields up to a blank line */
        const char *le = http_line_end(p, end);
        if (!le) return (end - p) > 4096 ? http_head_bad(out, 400, "malformed chunked encoding: trailer too long") : HTTP_HEAD_INCOMPLETE;
        if (le == p || le[-1] != '\r') return http_head_bad(out, 400, "malformed chunked encoding: bad trailer line");
        if (le - p == 1) {
            *body_len = (size_t)(le + 1 - buf);
            return HTTP_HEAD_OK;
        }
        if (!memchr(p, ':', (size_t)(le - p))) return http_head_bad(out, 400, "malformed chunked encoding: bad trailer line");
        p = le + 1;
    }
}
