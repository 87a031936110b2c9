/*
 * api_http: the APIs' error shapes for the HTTP layer. See api_http.h.
 */
#include "recipe/api_http.h"

#include <string.h>

#include "recipe/api_int.h"

static int api_http_shape_of(const char *path)
{
    if (!*path) return API_HTTP_SHAPE_ANY;
    if (!strncmp(path, "/v1/messages", 12) && (path[12] == 0 || path[12] == '/' || path[12] == '?'))
        return API_HTTP_SHAPE_ANTHROPIC;
    return API_HTTP_SHAPE_OPENAI;
}

const char *api_http_anthropic_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static const char *api_http_openai_type(int status)
{
    if (status == 429) return "rate_limit_exceeded";
    return status >= 500 ? "server_error" : "invalid_request_error";
}

static void api_http_write(bytebuf *out, int shape, int status, const char *message)
{
    if (shape == API_HTTP_SHAPE_ANTHROPIC) {
        api_error_body(out, true, api_http_anthropic_type(status), message, NULL, NULL);
    } else if (shape == API_HTTP_SHAPE_OPENAI) {
        api_error_body(out, false, api_http_openai_type(status), message, NULL, NULL);
    } else {
        bytebuf_puts(out, "{\"type\":\"error\",\"error\":{\"message\":");
        api_buf_str(out, message);
        bytebuf_puts(out, ",\"type\":");
        api_buf_str(out, api_http_openai_type(status));
        bytebuf_puts(out, ",\"param\":null,\"code\":null}}");
    }
}

const http_error_shape api_http_errors = { api_http_shape_of, api_http_write };

void api_http_opts(http_opts *o)
{
    o->errors = &api_http_errors;
    o->cors_headers = API_HTTP_CORS_HEADERS;
}
