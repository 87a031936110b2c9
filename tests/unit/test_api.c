/*
 * test_api: the three chat APIs' pure stages. JSON bodies in -> conv and parameters; every
 * bad-input case -> the vendor's error shape and status; token streams (hand-written, with
 * marker ids of eventstest.h) -> each vendor's JSON and SSE events; the Responses store.
 * The stop-sequence matcher's own tests are in test_api_out.c.
 */
#include "harness.h"
#include "eventstest.h"

#include <jansson.h>
#include <stdlib.h>

#include "recipe/api.h"
#include "util/unicode.h"
#include "util/util.h"


static const api_cfg cfg_plain = {"m", NULL, NULL, 0};

/* ---------------------------------------------------------------- helpers */

static int parse(api_kind kind, const char *body, api_req *r, api_error *e)
{
    api_req_init(r, kind);
    memset(e, 0, sizeof *e);
    return api_parse(&cfg_plain, kind, body, strlen(body), r, e);
}

/* Parses body expecting a rejection with status; checks the error JSON's shape. */
static bool rejects(api_kind kind, const char *body, size_t len, int status, const char *needle)
{
    api_req r;
    api_error e;
    api_req_init(&r, kind);
    memset(&e, 0, sizeof e);
    api_status st = api_parse(&cfg_plain, kind, body, len, &r, &e);
    api_req_free(&r);
    if (st != API_ERR) {
        fprintf(stderr, "  accepted: %.*s\n", (int)len, body);
        return false;
    }
    bool ok = e.status == status;
    if (needle && !strstr(e.message, needle)) ok = false;
    bytebuf b = {0};
    api_error_json(kind, &e, &b);
    json_t *j = json_loadb(b.p, b.len, 0, NULL);
    if (!j) ok = false;
    else if (kind == API_KIND_MESSAGES) {
        json_t *err = json_object_get(j, "error");
        ok = ok && !strcmp(json_string_value(json_object_get(j, "type")), "error") && json_is_object(err) &&
             json_is_string(json_object_get(err, "type")) && json_is_string(json_object_get(err, "message"));
    } else {
        json_t *err = json_object_get(j, "error");
        ok = ok && json_is_object(err) && json_is_string(json_object_get(err, "message")) &&
             json_is_string(json_object_get(err, "type")) && json_object_get(err, "param") &&
             json_object_get(err, "code");
    }
    if (!ok) fprintf(stderr, "  status %d (want %d): %s\n  body %s\n", e.status, status, b.p ? b.p : "", body);
    json_decref(j);
    bytebuf_free(&b);
    return ok;
}
#define REJECTS(kind, body, status, needle) CHECK(rejects(kind, body, strlen(body), status, needle))

static const char *part_text(const conv *c, int t, int p)
{
    if (t >= c->n_turns || p >= c->turns[t].n_parts) return "<none>";
    return c->turns[t].parts[p].text;
}

/* With TM_API_DUMP=DIR, writes an output to DIR/name (the e2e test replays these SSE bodies
 * through the vendors' SDKs). */
static void dump(const char *name, const bytebuf *b)
{
    const char *dir = getenv("TM_API_DUMP");
    if (!dir) return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(b->p, 1, b->len, f);
    fclose(f);
}

/* ---------------------------------------------------------------- chat parsing */

TEST(test_chat_parse_basic)
{
    api_req r;
    api_error e;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]}],"
                       "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,\"min_p\":0.1,\"seed\":42,\"stop\":[\"END\",\"\"],"
                       "\"max_completion_tokens\":17,\"n\":3,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
                       "\"logprobs\":true,\"top_logprobs\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"user\":\"u\",\"metadata\":null}";
    CHECK(parse(API_KIND_CHAT, body, &r, &e) == API_OK);
    CHECK(r.conv.n_turns == 2);
    CHECK(r.conv.turns[0].role == CONV_ROLE_SYSTEM && !strcmp(part_text(&r.conv, 0, 0), "be brief"));
    CHECK(r.conv.turns[1].role == CONV_ROLE_USER && !strcmp(part_text(&r.conv, 1, 0), "hi there"));
    CHECK(fabsf(r.sp.temp - 0.5f) < 1e-6 && fabsf(r.sp.top_p - 0.9f) < 1e-6 && r.sp.top_k == 20);
    CHECK(fabsf(r.sp.min_p - 0.1f) < 1e-6 && r.sp.seed == 42 && r.seed_given);
    CHECK(r.sp.presence_penalty == 0.5f && r.sp.frequency_penalty == -0.5f && r.sp.penalty_last_n > 0);
    CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "END"));
    CHECK(r.max_tokens == 17 && r.n == 3 && r.logprobs && r.top_logprobs == 2);
    CHECK(r.stream && r.include_usage && !strcmp(r.model, "m"));
    api_req_free(&r);

    /* defaults: vendor sampling, no limit, a fresh seed per request */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":\"S\"}", &r, &e) == API_OK);
    CHECK(r.sp.temp == 1.0f && r.sp.top_p == 1.0f && r.sp.top_k == 0 && r.max_tokens == -1 && r.n == 1 && !r.seed_given);
    CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "S") && !r.stream);
    api_req_free(&r);
    /* thinking.budget_tokens (extension, as Anthropic's): the most reasoning tokens */
    CHECK(parse(API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":7}}", &r, &e) == API_OK);
    CHECK(r.thinking_budget == 7 && r.conv.thinking == CONV_THINKING_ON);
    api_req_free(&r);
    CHECK(parse(API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"disabled\",\"budget_tokens\":7}}", &r, &e) == API_OK);
    CHECK(r.thinking_budget == 0);
    api_req_free(&r);
    CHECK(parse(API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":0}}", &r, &e) == API_ERR);
    CHECK(e.status == 400 && !strcmp(e.param, "thinking.budget_tokens"));
    api_req_free(&r);
    /* Messages: below Anthropic's minimum, a message that says so (not an empty one) */
    CHECK(parse(API_KIND_MESSAGES, "{\"max_tokens\":2000,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":10}}", &r, &e) == API_ERR);
    CHECKF(!strcmp(e.message, "thinking.budget_tokens: Input should be greater than or equal to 1024"), "%s", e.message);
    api_req_free(&r);
    CHECK(parse(API_KIND_MESSAGES, "{\"max_tokens\":2000,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1500}}", &r, &e) == API_OK);
    CHECK(r.thinking_budget == 1500);
    api_req_free(&r);
    /* no model named: the served one */
    CHECK(parse(API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == API_OK && !strcmp(r.model, "m"));
    api_req_free(&r);
}

TEST(test_chat_parse_tools)
{
    api_req r;
    api_error e;
    const char *body =
        "{\"model\":\"m\",\"messages\":["
        "{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":\"auto\",\"parallel_tool_calls\":true}";
    CHECK(parse(API_KIND_CHAT, body, &r, &e) == API_OK);
    CHECK(r.conv.n_turns == 3 && r.conv.n_tools == 1);
    CHECK(!strcmp(r.conv.tools[0].name, "get") && !strcmp(r.conv.tools[0].parameters, "{\"type\":\"object\"}"));
    const conv_turn *a = &r.conv.turns[1];
    CHECK(a->role == CONV_ROLE_ASSISTANT && a->n_parts == 2);
    CHECK(a->parts[0].kind == CONV_PART_REASONING && !strcmp(a->parts[0].text, "think"));
    CHECK(a->parts[1].kind == CONV_PART_TOOL_CALL && !strcmp(a->parts[1].name, "get") && !strcmp(a->parts[1].id, "c1"));
    CHECK(!strcmp(a->parts[1].args, "{\"city\": \"Oslo\"}"));
    const conv_turn *t = &r.conv.turns[2];
    CHECK(t->role == CONV_ROLE_TOOL && t->parts[0].kind == CONV_PART_TOOL_RESULT && !strcmp(t->parts[0].id, "c1"));
    CHECK(!strcmp(t->parts[0].text, "sunny"));
    api_req_free(&r);
    /* tool_choice none: no tools offered */
    CHECK(parse(API_KIND_CHAT,
                "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\","
                "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
                &r, &e) == API_OK);
    CHECK(r.conv.n_tools == 0);
    api_req_free(&r);
    /* thinking switches */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}", &r, &e) == API_OK);
    CHECK(r.conv.thinking == CONV_THINKING_OFF);
    api_req_free(&r);
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"high\"}", &r, &e) == API_OK);
    CHECK(r.conv.thinking == CONV_THINKING_ON);
    api_req_free(&r);
}

/* A tool definition's errors in each route's words, the whole error body pinned (the three
 * routes check definitions through one helper; each vendor words them its own way), and the
 * definitions that pass: null fields are absent, strict is kept. */
static const struct {
    api_kind kind;
    const char *tools;       /* the request's tools member */
    const char *want;        /* the error body */
} tool_errors[] = {
    { API_KIND_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{}}]",
      "{\"error\":{\"message\":\"Missing required parameter: 'tools[0].function.name'.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].function.name\",\"code\":\"missing_required_parameter\"}}" },
    { API_KIND_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":1}}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].function.name': expected a string, but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].function.name\",\"code\":\"invalid_type\"}}" },
    { API_KIND_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]",
      "{\"error\":{\"message\":\"Invalid 'tools[0].function.name': empty string.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].function.name\",\"code\":\"invalid_value\"}}" },
    { API_KIND_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":1}}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].function.description': expected a string, but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].function.description\",\"code\":\"invalid_type\"}}" },
    { API_KIND_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].function.parameters': expected an object, but got an array instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].function.parameters\",\"code\":\"invalid_type\"}}" },
    { API_KIND_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":\"yes\"}}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].function.strict': expected a boolean, but got a string instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].function.strict\",\"code\":\"invalid_type\"}}" },
    { API_KIND_CHAT, "\"functions\":[{\"name\":\"f\"},{\"name\":1}]",
      "{\"error\":{\"message\":\"Invalid type for 'functions[1].name': expected a string, but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"functions[1].name\",\"code\":\"invalid_type\"}}" },
    { API_KIND_CHAT, "\"functions\":[{\"name\":\"f\",\"parameters\":1}]",
      "{\"error\":{\"message\":\"Invalid type for 'functions[0].parameters': expected an object, but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"functions[0].parameters\",\"code\":\"invalid_type\"}}" },
    { API_KIND_MESSAGES, "\"tools\":[{\"input_schema\":{}}]",
      "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools[0].name: Field required\"}}" },
    { API_KIND_MESSAGES, "\"tools\":[{\"name\":\"\",\"input_schema\":{}}]",
      "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools[0].name: Input should be a valid non-empty string\"}}" },
    { API_KIND_MESSAGES, "\"tools\":[{\"name\":\"f\",\"description\":[],\"input_schema\":{}}]",
      "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools[0].description: Input should be a valid string\"}}" },
    { API_KIND_MESSAGES, "\"tools\":[{\"name\":\"f\"}]",
      "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools[0].input_schema: Field required\"}}" },
    { API_KIND_MESSAGES, "\"tools\":[{\"name\":\"f\",\"input_schema\":\"o\"}]",
      "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools[0].input_schema: Input should be a valid dictionary\"}}" },
    { API_KIND_MESSAGES, "\"tools\":[{\"name\":\"f\",\"input_schema\":{},\"strict\":1}]",
      "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"tools[0].strict: Input should be a valid boolean\"}}" },
    { API_KIND_RESPONSES, "\"tools\":[{\"type\":\"function\"}]",
      "{\"error\":{\"message\":\"Missing required parameter: 'tools[0].name'.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].name\",\"code\":\"missing_required_parameter\"}}" },
    { API_KIND_RESPONSES, "\"tools\":[{\"type\":\"function\",\"name\":2}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].name': expected a non-empty string, but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].name\",\"code\":\"invalid_type\"}}" },
    { API_KIND_RESPONSES, "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":{}}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].description': expected a string, but got an object instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].description\",\"code\":\"invalid_type\"}}" },
    { API_KIND_RESPONSES, "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":true}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].parameters': expected an object, but got a boolean instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].parameters\",\"code\":\"invalid_type\"}}" },
    { API_KIND_RESPONSES, "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"strict\":0}]",
      "{\"error\":{\"message\":\"Invalid type for 'tools[0].strict': expected a boolean, but got an integer instead.\",\"type\":\"invalid_request_error\",\"param\":\"tools[0].strict\",\"code\":\"invalid_type\"}}" },
};

/* The request of kind with this tools member and a one-message conversation. */
static void tool_body(char *buf, size_t cap, api_kind kind, const char *tools)
{
    if (kind == API_KIND_MESSAGES)
        snprintf(buf, cap, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", tools);
    else if (kind == API_KIND_RESPONSES)
        snprintf(buf, cap, "{\"model\":\"m\",\"input\":\"x\",%s}", tools);
    else
        snprintf(buf, cap, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", tools);
}

TEST(test_tool_definition_errors)
{
    char body[512];
    for (size_t i = 0; i < sizeof tool_errors / sizeof tool_errors[0]; i++) {
        api_req r;
        api_error e;
        tool_body(body, sizeof body, tool_errors[i].kind, tool_errors[i].tools);
        CHECKF(parse(tool_errors[i].kind, body, &r, &e) == API_ERR && e.status == 400, "%zu accepted", i);
        bytebuf b = { 0 };
        api_error_json(tool_errors[i].kind, &e, &b);
        CHECKF(b.p && !strcmp(b.p, tool_errors[i].want), "%zu\n    got  %s\n    want %s", i, b.p ? b.p : "", tool_errors[i].want);
        bytebuf_free(&b);
        api_req_free(&r);
    }
    static const struct {
        api_kind kind;
        const char *tools;
    } ok[] = {
        { API_KIND_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":null,\"parameters\":null,\"strict\":true}},"
                         "{\"function\":{\"name\":\"g\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":null}}]" },
        { API_KIND_CHAT, "\"functions\":[{\"name\":\"f\",\"strict\":true},{\"name\":\"g\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}]" },
        { API_KIND_MESSAGES, "\"tools\":[{\"name\":\"f\",\"description\":null,\"input_schema\":{},\"strict\":true},"
                             "{\"name\":\"g\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"},\"type\":null}]" },
        { API_KIND_RESPONSES, "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":null,\"strict\":true},"
                              "{\"type\":\"function\",\"name\":\"g\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}]" },
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        api_req r;
        api_error e;
        tool_body(body, sizeof body, ok[i].kind, ok[i].tools);
        CHECKF(parse(ok[i].kind, body, &r, &e) == API_OK, "%zu: %s", i, e.message);
        const conv *c = &r.conv;
        CHECKF(c->n_tools == 2 && c->tools[0].strict && !c->tools[1].strict, "%zu: %d tools", i, c->n_tools);
        if (c->n_tools == 2) {
            CHECK(!strcmp(c->tools[0].name, "f") && !c->tools[0].description);
            CHECK(!strcmp(c->tools[1].name, "g") && c->tools[1].description && !strcmp(c->tools[1].description, "d"));
            CHECK(c->tools[1].parameters && strstr(c->tools[1].parameters, "object"));
        }
        api_req_free(&r);
    }
}

TEST(test_chat_bad_input)
{
    const api_kind C = API_KIND_CHAT;
    REJECTS(C, "{\"model\":\"m\",\"messages\":[", 400, "parse the JSON");
    REJECTS(C, "", 400, NULL);
    REJECTS(C, "[1,2]", 400, NULL);
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"bogus\":1}", 400, "Unrecognized request argument supplied: bogus");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[]}", 400, "empty array");
    REJECTS(C, "{\"model\":\"m\"}", 400, "Missing required parameter: 'messages'");
    REJECTS(C, "{\"model\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "'model'");
    REJECTS(C, "{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, "does not exist");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", 400, "Invalid type for 'temperature'");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", 400, "temperature");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400, "max_tokens");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", 400, "max_tokens");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":100}", 400, "'n'");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", 400, "stream");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":5}", 400, "stop");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",3]}", 400, "stop[1]");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400, "logprobs");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":true}}", 400, "stream");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "wizard");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[\"hi\"]}", 400, "messages[0]");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}", 400, "image_url");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "tool_call_id");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{bad\"}}]}]}", 400, "arguments");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}", 400, "tools[0].function.name");
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}", 400, "response_format");
    /* invalid UTF-8 anywhere in the body */
    const char bad[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}";
    CHECK(rejects(C, bad, sizeof bad - 1, 400, "UTF-8"));
    const char surrogate[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}";
    CHECK(rejects(C, surrogate, sizeof surrogate - 1, 400, "UTF-8"));
    /* NUL escapes are refused by the JSON reader */
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", 400, NULL);
    /* trailing garbage */
    REJECTS(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]} x", 400, NULL);
}

/* ---------------------------------------------------------------- responses parsing */

TEST(test_responses_parse)
{
    api_req r;
    api_error e;
    CHECK(parse(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"hello\",\"instructions\":\"be kind\",\"max_output_tokens\":9,\"temperature\":0.2,\"store\":false}", &r, &e) == API_OK);
    CHECK(r.conv.n_turns == 2 && r.conv.turns[0].role == CONV_ROLE_SYSTEM && !strcmp(part_text(&r.conv, 0, 0), "be kind"));
    CHECK(r.conv.turns[1].role == CONV_ROLE_USER && !strcmp(part_text(&r.conv, 1, 0), "hello"));
    CHECK(r.max_tokens == 9 && !r.store && !strcmp(r.instructions, "be kind"));
    api_req_free(&r);
    const char *items =
        "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"q\"}]},"
        "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c9\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c9\",\"output\":\"42\"},"
        "{\"type\":\"message\",\"role\":\"developer\",\"content\":\"dev\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}]}";
    CHECK(parse(API_KIND_RESPONSES, items, &r, &e) == API_OK);
    CHECK(r.conv.n_turns == 4 && r.conv.n_tools == 1);
    CHECK(r.conv.turns[1].role == CONV_ROLE_ASSISTANT && r.conv.turns[1].n_parts == 2);
    CHECK(r.conv.turns[1].parts[0].kind == CONV_PART_REASONING && r.conv.turns[1].parts[1].kind == CONV_PART_TOOL_CALL);
    CHECK(r.conv.turns[2].role == CONV_ROLE_TOOL && !strcmp(r.conv.turns[2].parts[0].text, "42"));
    CHECK(r.conv.turns[3].role == CONV_ROLE_DEVELOPER);
    api_req_free(&r);

    const api_kind R = API_KIND_RESPONSES;
    REJECTS(R, "{\"model\":\"m\",\"input\":\"x\",\"foo\":1}", 400, "Unknown parameter: 'foo'");
    REJECTS(R, "{\"model\":\"m\"}", 400, "input");
    REJECTS(R, "{\"model\":\"m\",\"input\":[]}", 400, "input");
    REJECTS(R, "{\"model\":\"m\",\"input\":5}", 400, "input");
    REJECTS(R, "{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":\"resp_nope\"}", 404, "resp_nope");
    REJECTS(R, "{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", 400, "function");
    REJECTS(R, "{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":\"9\"}", 400, "max_output_tokens");
    REJECTS(R, "{\"model\":\"x\",\"input\":\"x\"}", 404, NULL);
    REJECTS(R, "{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", 400, "call_id");
}

/* ---------------------------------------------------------------- messages parsing */

TEST(test_messages_parse)
{
    api_req r;
    api_error e;
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":2048,\"system\":[{\"type\":\"text\",\"text\":\"sys\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"s\"},{\"type\":\"text\",\"text\":\"checking\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get\",\"input\":{\"city\":\"Oslo\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},"
        "{\"type\":\"text\",\"text\":\"thanks\",\"cache_control\":{\"type\":\"ephemeral\"}}]}],"
        "\"tools\":[{\"name\":\"get\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"stop_sequences\":[\"X\"],\"temperature\":0.7,\"top_k\":5,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
        "\"metadata\":{\"user_id\":\"u\"}}";
    CHECK(parse(API_KIND_MESSAGES, body, &r, &e) == API_OK);
    CHECK(r.conv.n_turns == 5 && r.conv.n_tools == 1);
    CHECK(r.conv.turns[0].role == CONV_ROLE_SYSTEM && !strcmp(part_text(&r.conv, 0, 0), "sys"));
    const conv_turn *a = &r.conv.turns[2];
    CHECK(a->role == CONV_ROLE_ASSISTANT && a->n_parts == 3 && a->parts[0].kind == CONV_PART_REASONING);
    CHECK(a->parts[2].kind == CONV_PART_TOOL_CALL && !strcmp(a->parts[2].args, "{\"city\":\"Oslo\"}"));
    CHECK(r.conv.turns[3].role == CONV_ROLE_TOOL && !strcmp(r.conv.turns[3].parts[0].text, "sunny"));
    CHECK(r.conv.turns[4].role == CONV_ROLE_USER && !strcmp(part_text(&r.conv, 4, 0), "thanks"));
    CHECK(r.max_tokens == 2048 && r.n_stop == 1 && r.sp.top_k == 5 && r.conv.thinking == CONV_THINKING_ON && r.thinking_budget == 1024);
    api_req_free(&r);
    CHECK(parse(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == API_OK);
    CHECK(r.conv.thinking == CONV_THINKING_OFF);
    api_req_free(&r);

    const api_kind M = API_KIND_MESSAGES;
    REJECTS(M, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens: Field required");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[]}", 400, "at least one message");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", 400, "n: Extra inputs are not permitted");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":\"5\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "max_tokens");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400, "role");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1.5}", 400, "temperature");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}", 400, "image");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"bogus\"}]}]}", 400, "bogus");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2000}}", 400, "budget_tokens");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":\"X\"}", 400, "stop_sequences");
    REJECTS(M, "{\"model\":\"zz\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, NULL);
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],", 400, "parsing the body");
    REJECTS(M, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\"}]}", 400, "input_schema");
    const char bad[] = "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}";
    CHECK(rejects(M, bad, sizeof bad - 1, 400, "UTF-8"));

    /* count_tokens: no max_tokens needed, sampling fields are not accepted */
    api_req_init(&r, M);
    const char *cb = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":\"s\"}";
    CHECK(api_messages_count_parse(&cfg_plain, cb, strlen(cb), &r, &e) == API_OK && r.conv.n_turns == 2);
    api_req_free(&r);
    api_req_init(&r, M);
    cb = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":3}";
    CHECK(api_messages_count_parse(&cfg_plain, cb, strlen(cb), &r, &e) == API_ERR && e.status == 400);
    api_req_free(&r);
    bytebuf b = {0};
    api_messages_count_json(12, &b);
    CHECK(!strcmp(b.p, "{\"input_tokens\":12}"));
    bytebuf_free(&b);
}

/* The text-part reader the three APIs share (api_json_parts_text): joined texts, and each
 * rejection in its vendor's words with the part's path. */
TEST(test_text_parts_shared)
{
    api_req r;
    api_error e;
    /* joining: Anthropic by newlines (system blocks), OpenAI with nothing between */
    CHECK(parse(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"a\"},"
                "{\"type\":\"text\",\"text\":\"b\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == API_OK);
    CHECK(!strcmp(part_text(&r.conv, 0, 0), "a\nb"));
    api_req_free(&r);
    CHECK(parse(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
                "{\"type\":\"refusal\",\"refusal\":\"b\"}]}]}", &r, &e) == API_OK);
    CHECK(!strcmp(part_text(&r.conv, 0, 0), "ab"));
    api_req_free(&r);
    /* a part of an unsupported type, a part that is not an object, a text that is not a string */
    REJECTS(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"system\":[{\"type\":\"image\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
            400, "system[0]: content blocks of type 'image' are not supported");
    REJECTS(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"system\":[3],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
            400, "system[0]: Input should be a valid dictionary");
    REJECTS(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"system\":[{\"type\":\"text\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
            400, "system[0].text: Field required");
    REJECTS(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}",
            400, "Invalid 'input[0].content[0]': content part type 'input_image' is not supported");
    REJECTS(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":1}]}]}",
            400, "Invalid type for 'input[0].content[0].text': expected a string, but got an integer instead.");
    REJECTS(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}",
            400, "Missing required parameter: 'messages[0].content[0].type'.");
    REJECTS(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
            400, "expected a string or an array of content parts");
}

TEST(test_error_shapes)
{
    api_error e;
    bytebuf b = {0};
    api_error_set(&e, 401, NULL, "invalid_api_key", "Incorrect API key provided.");
    api_error_json(API_KIND_CHAT, &e, &b);
    CHECK(!strcmp(b.p, "{\"error\":{\"message\":\"Incorrect API key provided.\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}"));
    b.len = 0;
    api_error_json(API_KIND_MESSAGES, &e, &b);
    CHECK(!strcmp(b.p, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"Incorrect API key provided.\"}}"));
    b.len = 0;
    api_error_set(&e, 529, NULL, NULL, "busy");
    api_error_json(API_KIND_MESSAGES, &e, &b);
    CHECK(strstr(b.p, "overloaded_error") != NULL);
    b.len = 0;
    api_error_set(&e, 404, "model", "model_not_found", "no");
    api_error_json(API_KIND_MESSAGES, &e, &b);
    CHECK(strstr(b.p, "not_found_error") != NULL);
    b.len = 0;
    api_error_set(&e, 413, NULL, NULL, "big");
    api_error_json(API_KIND_MESSAGES, &e, &b);
    CHECK(strstr(b.p, "request_too_large") != NULL);
    bytebuf_free(&b);
}

/* An error message that quotes the client's text stays valid UTF-8 JSON when the quote ends
 * inside a character (jansson quotes the bytes read up to the error: here half of U+07A0), and
 * the string writer turns bytes that are not UTF-8 into U+FFFD. Found by fuzz_api_chat. */
TEST(test_error_quoting_split_character)
{
    static const char body[] = "\"\\\xde\xa0\"";
    for (int k = 0; k < 3; k++) CHECK(rejects((api_kind)k, body, sizeof body - 1, 400, NULL));
    bytebuf b = {0};
    jsonfmt_write_string(&b, "a\xde\xa0\xde-\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xe2\x82", 16);
#define R "\xef\xbf\xbd"
    /* one U+FFFD per maximal invalid subpart: the cut \xe2\x82 at the end is one */
    CHECK(!strcmp(b.p, "\"a\xde\xa0" R "-" R R R R R R R R R R "\""));
#undef R
    CHECK(unicode_utf8_valid("a\xde\xa0\xf0\x9f\x99\x82", 7) && !unicode_utf8_valid("\xde", 1) && !unicode_utf8_valid("\xed\xa0\x80", 3));
    bytebuf_free(&b);
}

/* A whole number written as a real past long long's range is refused as out of range (it was
 * converted to long long first: undefined, and on x86 it read as the minimum). Found by
 * fuzz_api_messages under UBSan. */
TEST(test_integer_fields_beyond_long_long)
{
    static const char chat[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":5e26}";
    static const char chat_seed[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"seed\":-1e30}";
    static const char msgs[] = "{\"max_tokens\":500000000000000000000000000.2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    static const char resp[] = "{\"input\":\"hi\",\"max_output_tokens\":1e300}";
    CHECK(rejects(API_KIND_CHAT, chat, sizeof chat - 1, 400, "integer above maximum value"));
    CHECK(rejects(API_KIND_CHAT, chat_seed, sizeof chat_seed - 1, 400, "integer below minimum value"));
    CHECK(rejects(API_KIND_MESSAGES, msgs, sizeof msgs - 1, 400, "less than or equal to"));
    CHECK(rejects(API_KIND_RESPONSES, resp, sizeof resp - 1, 400, "integer above maximum value"));
}

/* ---------------------------------------------------------------- output */

/* Feeds "#ID" markers or text tokens (id 1) to choice i. */
static void feed(api_out *o, int i, const char **pieces)
{
    for (int k = 0; pieces[k]; k++) {
        if (pieces[k][0] == '#') {
            int32_t id = atoi(pieces[k] + 1);
            if (api_out_token(o, i, id, "", 0, NULL)) break;
        } else if (api_out_token(o, i, 1, pieces[k], strlen(pieces[k]), NULL)) {
            break;
        }
    }
}

/* Splits SSE text into parsed data objects (the [DONE] sentinel becomes the string "DONE"),
 * checking each event's "event:" name equals its data "type" when present. */
static json_t *sse_parse(const char *s, bool *names_ok)
{
    json_t *arr = json_array();
    *names_ok = true;
    const char *p = s;
    char name[96] = "";
    while (*p) {
        const char *nl = strchr(p, '\n');
        if (!nl) break;
        if (nl == p) { name[0] = 0; p++; continue; }
        if (!strncmp(p, "event: ", 7)) snprintf(name, sizeof name, "%.*s", (int)(nl - p - 7), p + 7);
        else if (!strncmp(p, "data: ", 6)) {
            if (!strncmp(p + 6, "[DONE]", 6)) json_array_append_new(arr, json_string("DONE"));
            else {
                json_t *j = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
                if (!j) { *names_ok = false; j = json_null(); }
                const char *t = json_string_value(json_object_get(j, "type"));
                if (name[0] && (!t || strcmp(t, name))) *names_ok = false;
                json_array_append_new(arr, j);
            }
        }
        p = nl + 1;
    }
    return arr;
}

TEST(test_chat_output_nonstream)
{
    api_req r;
    api_error e;
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"STOP\"]}", &r, &e) == API_OK);
    events_markers mk = eventstest_qwen();
    api_out o;
    api_out_init(&o, &r, &mk, 1, "m");
    api_out_set_prompt(&o, 100, 64, NULL, 0);
    api_out_begin(&o);
    const char *toks[] = {"#5000", "let me", " think", "#5001", "\n\n", "Hello", " wor", "ld S", "TOP", "never", NULL};
    feed(&o, 0, toks);
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_out_end(&o);
    json_t *j = json_loadb(o.out.p, o.out.len, 0, NULL);
    CHECK(j != NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    CHECK(!strcmp(json_string_value(json_object_get(msg, "content")), "Hello world "));
    CHECK(!strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "let me think"));
    CHECK(!strcmp(json_string_value(json_object_get(ch, "finish_reason")), "stop"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "chat.completion"));
    json_t *u = json_object_get(j, "usage");
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 100);
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 9);
    CHECK(json_integer_value(json_object_get(u, "total_tokens")) == 109);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 64);
    CHECK(json_integer_value(json_object_get(u, "prompt_cache_hit_tokens")) == 64);
    CHECK(json_integer_value(json_object_get(u, "prompt_cache_miss_tokens")) == 36);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "completion_tokens_details"), "reasoning_tokens")) == 4);
    json_decref(j);
    api_out_free(&o);
    api_req_free(&r);
}

TEST(test_chat_output_tools_and_stream)
{
    api_req r;
    api_error e;
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":2}", &r, &e) == API_OK);
    events_markers mk = eventstest_qwen();
    api_out o;
    api_out_init(&o, &r, &mk, 7, "m");
    api_out_set_prompt(&o, 10, 0, NULL, 0);
    api_out_begin(&o);
    const char *t0[] = {"Sure", "#5002", "{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}", "#5003",
                        "#5002", "{\"name\": \"put\", \"arguments\": {}}", "#5003", NULL};
    const char *t1[] = {"plain", " text", NULL};
    feed(&o, 0, t0);
    feed(&o, 1, t1);
    api_out_finish(&o, 1, EVENTS_FINISH_LENGTH);
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_out_end(&o);
    dump("chat_tools.sse", &o.out);
    bool names_ok;
    json_t *ev = sse_parse(o.out.p, &names_ok);
    CHECK(names_ok);
    size_t n = json_array_size(ev);
    CHECK(n > 6 && !strcmp(json_string_value(json_array_get(ev, n - 1)) ? json_string_value(json_array_get(ev, n - 1)) : "", "DONE"));
    /* reassemble as a client does */
    char content[2][64] = {"", ""}, args[2][64] = {"", ""}, names[2][16] = {"", ""}, finish[2][16] = {"", ""};
    bool role_first[2] = {false, false};
    int seen[2] = {0, 0};
    json_t *usage = NULL;
    for (size_t k = 0; k + 1 < n; k++) {
        json_t *c = json_array_get(ev, k);
        CHECK(!strcmp(json_string_value(json_object_get(c, "object")), "chat.completion.chunk"));
        json_t *chs = json_object_get(c, "choices");
        if (json_array_size(chs) == 0) { usage = json_object_get(c, "usage"); continue; }
        json_t *ch = json_array_get(chs, 0);
        int idx = (int)json_integer_value(json_object_get(ch, "index"));
        json_t *d = json_object_get(ch, "delta");
        if (seen[idx]++ == 0) role_first[idx] = json_is_string(json_object_get(d, "role"));
        json_t *ct = json_object_get(d, "content");
        if (json_is_string(ct)) strcat(content[idx], json_string_value(ct));
        json_t *tcs = json_object_get(d, "tool_calls");
        if (tcs) {
            json_t *tc = json_array_get(tcs, 0);
            int ti = (int)json_integer_value(json_object_get(tc, "index"));
            json_t *fn = json_object_get(tc, "function");
            if (json_is_string(json_object_get(fn, "name"))) {
                strcat(names[ti], json_string_value(json_object_get(fn, "name")));
                CHECK(json_is_string(json_object_get(tc, "id")));
            }
            if (json_is_string(json_object_get(fn, "arguments"))) strcat(args[ti], json_string_value(json_object_get(fn, "arguments")));
        }
        json_t *fr = json_object_get(ch, "finish_reason");
        if (json_is_string(fr)) strcpy(finish[idx], json_string_value(fr));
    }
    CHECK(role_first[0] && role_first[1]);
    CHECK(!strcmp(content[0], "Sure") && !strcmp(content[1], "plain text"));
    CHECK(!strcmp(names[0], "get") && !strcmp(names[1], "put"));
    CHECK(!strcmp(args[0], "{\"city\":\"Oslo\"}") && !strcmp(args[1], "{}"));
    CHECK(!strcmp(finish[0], "tool_calls") && !strcmp(finish[1], "length"));
    CHECK(usage && json_integer_value(json_object_get(usage, "completion_tokens")) == 9);
    json_decref(ev);
    api_out_free(&o);
    api_req_free(&r);

    /* non-streaming tool calls: content null, tool_calls with string arguments */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == API_OK);
    api_out_init(&o, &r, &mk, 7, "m");
    const char *t2[] = {"#5002", "{\"name\": \"get\", \"arguments\": {\"a\": [1, 2]}}", "#5003", NULL};
    feed(&o, 0, t2);
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_out_end(&o);
    json_t *j = json_loadb(o.out.p, o.out.len, 0, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    CHECK(json_is_null(json_object_get(msg, "content")));
    json_t *tc = json_array_get(json_object_get(msg, "tool_calls"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "{\"a\":[1,2]}"));
    CHECK(!strncmp(json_string_value(json_object_get(tc, "id")), "call_", 5));
    json_decref(j);
    api_out_free(&o);
    api_req_free(&r);
}

TEST(test_chat_logprobs)
{
    api_req r;
    api_error e;
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":2}", &r, &e) == API_OK);
    events_markers mk;
    events_markers_none(&mk);
    api_out o;
    api_out_init(&o, &r, &mk, 1, "m");
    api_logprob lp = {.token = 1, .logprob = -0.5f, .n_top = 3, .top_token = {1, 2, 3}, .top_logprob = {-0.5f, -1.f, -2.f}};
    api_out_token(&o, 0, 1, "hi", 2, &lp);
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_out_end(&o);
    json_t *j = json_loadb(o.out.p, o.out.len, 0, NULL);
    json_t *lc = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    CHECK(json_array_size(lc) == 1);
    json_t *en = json_array_get(lc, 0);
    CHECK(fabs(json_number_value(json_object_get(en, "logprob")) + 0.5) < 1e-6);
    CHECK(json_array_size(json_object_get(en, "top_logprobs")) == 2);
    json_decref(j);
    api_out_free(&o);
    api_req_free(&r);
}

TEST(test_responses_output)
{
    api_store *store = api_store_new(2);
    api_cfg cfg = {"m", NULL, store, 0};
    api_req r;
    api_error e;
    api_req_init(&r, API_KIND_RESPONSES);
    const char *body = "{\"model\":\"m\",\"input\":\"q\",\"instructions\":\"I\",\"stream\":true}";
    CHECK(api_responses_parse(&cfg, body, strlen(body), &r, &e) == API_OK);
    events_markers mk = eventstest_qwen();
    api_out o;
    api_out_init(&o, &r, &mk, 3, "m");
    api_out_set_prompt(&o, 50, 32, NULL, 0);
    api_out_begin(&o);
    const char *toks[] = {"#5000", "hmm", "#5001", "Answer", " here", "#5002", "{\"name\": \"f\", \"arguments\": {\"x\": 1}}", "#5003", NULL};
    feed(&o, 0, toks);
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_out_end(&o);
    dump("responses_tools.sse", &o.out);
    bool names_ok;
    json_t *ev = sse_parse(o.out.p, &names_ok);
    CHECK(names_ok);
    size_t n = json_array_size(ev);
    const char *want[] = {"response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.done",
                          "response.content_part.done", "response.output_item.done", "response.output_item.added",
                          "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                          "response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
    CHECKF(n == TM_ARRAY_LEN(want), "%zu events", n);
    for (size_t k = 0; k < n && k < TM_ARRAY_LEN(want); k++) {
        json_t *x = json_array_get(ev, k);
        CHECKF(!strcmp(json_string_value(json_object_get(x, "type")), want[k]), "event %zu is %s", k,
               json_string_value(json_object_get(x, "type")));
        CHECK(json_integer_value(json_object_get(x, "sequence_number")) == (json_int_t)k);
    }
    json_t *resp = json_object_get(json_array_get(ev, n - 1), "response");
    CHECK(!strcmp(json_string_value(json_object_get(resp, "status")), "completed"));
    json_t *out = json_object_get(resp, "output");
    CHECK(json_array_size(out) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning"));
    json_t *m1 = json_array_get(out, 1);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(json_object_get(m1, "content"), 0), "text")), "Answer here"));
    json_t *fc = json_array_get(out, 2);
    CHECK(!strcmp(json_string_value(json_object_get(fc, "arguments")), "{\"x\":1}") && !strcmp(json_string_value(json_object_get(fc, "name")), "f"));
    json_t *u = json_object_get(resp, "usage");
    CHECK(json_integer_value(json_object_get(u, "input_tokens")) == 50);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens")) == 32);
    CHECK(json_integer_value(json_object_get(json_object_get(u, "output_tokens_details"), "reasoning_tokens")) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(resp, "instructions")), "I"));
    /* item ids agree between the delta events and the final output */
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(ev, 10), "item_id")), json_string_value(json_object_get(m1, "id"))));
    json_decref(ev);

    /* previous_response_id continues the stored conversation (without the old instructions) */
    char id[48];
    snprintf(id, sizeof id, "%s", o.id);
    api_out_free(&o);
    api_req_free(&r);
    char body2[256];
    snprintf(body2, sizeof body2, "{\"model\":\"m\",\"input\":\"more\",\"previous_response_id\":\"%s\",\"instructions\":\"J\"}", id);
    api_req_init(&r, API_KIND_RESPONSES);
    CHECK(api_responses_parse(&cfg, body2, strlen(body2), &r, &e) == API_OK);
    CHECKF(r.conv.n_turns == 4, "%d turns", r.conv.n_turns);
    CHECK(r.conv.turns[0].role == CONV_ROLE_SYSTEM && !strcmp(part_text(&r.conv, 0, 0), "J"));
    CHECK(r.conv.turns[1].role == CONV_ROLE_USER && !strcmp(part_text(&r.conv, 1, 0), "q"));
    const conv_turn *a = &r.conv.turns[2];
    CHECK(a->role == CONV_ROLE_ASSISTANT && a->n_parts == 3 && a->parts[0].kind == CONV_PART_REASONING &&
          a->parts[1].kind == CONV_PART_TEXT && a->parts[2].kind == CONV_PART_TOOL_CALL);
    CHECK(r.conv.turns[3].role == CONV_ROLE_USER && !strcmp(part_text(&r.conv, 3, 0), "more"));
    CHECK(r.n_prev_turns == 2);
    api_req_free(&r);

    /* non-streaming, truncated: status incomplete */
    api_req_init(&r, API_KIND_RESPONSES);
    body = "{\"model\":\"m\",\"input\":\"q\",\"store\":false,\"max_output_tokens\":2}";
    CHECK(api_responses_parse(&cfg, body, strlen(body), &r, &e) == API_OK);
    api_out_init(&o, &r, &mk, 3, "m");
    const char *t2[] = {"a", "b", NULL};
    feed(&o, 0, t2);
    api_out_finish(&o, 0, EVENTS_FINISH_LENGTH);
    api_out_end(&o);
    json_t *j = json_loadb(o.out.p, o.out.len, 0, NULL);
    CHECK(!strcmp(json_string_value(json_object_get(j, "status")), "incomplete"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "incomplete_details"), "reason")), "max_output_tokens"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "response"));
    /* the message the limit cut is incomplete too, not completed */
    json_t *msg = json_array_get(json_object_get(j, "output"), 0);
    CHECKF(msg && !strcmp(json_string_value(json_object_get(msg, "status")), "incomplete"), "%.*s", (int)o.out.len, o.out.p);
    json_decref(j);
    /* store=false: not kept */
    conv tmp;
    conv_init(&tmp);
    CHECK(!api_store_get(store, o.id, &tmp));
    conv_free(&tmp);
    api_out_free(&o);
    api_req_free(&r);
    api_store_free(store);
}

/* Long tool arguments generated a few bytes per token stream as many argument deltas in each
 * API's own events, which concatenate to the final arguments (written for the e2e replay
 * through the SDKs as *_longargs.sse). */
static const char long_call[] =
    "{\"name\": \"write_file\", \"arguments\": {\"path\": \"/tmp/notes \xc3\xa9t\xc3\xa9.txt\", \"lines\": [1, 2.50, -3],"
    " \"content\": \"first line\\nsecond \\\"quoted\\\" line\\n\\u00e9 and \\ud83d\\ude00\", \"overwrite\": true}}";
static const char long_args_want[] =
    "{\"path\":\"/tmp/notes \xc3\xa9t\xc3\xa9.txt\",\"lines\":[1,2.5,-3],\"content\":\"first line\\nsecond \\\"quoted\\\" line\\n\xc3\xa9 and "
    "\xf0\x9f\x98\x80\",\"overwrite\":true}";

static void feed_long_call(api_out *o)
{
    api_out_token(o, 0, 1, "Ok", 2, NULL);
    api_out_token(o, 0, 5002, "", 0, NULL);
    for (size_t i = 0, n = strlen(long_call); i < n; i += 3) api_out_token(o, 0, 1, long_call + i, TM_MIN(3, n - i), NULL);
    api_out_token(o, 0, 5003, "", 0, NULL);
    api_out_finish(o, 0, EVENTS_FINISH_STOP);
    api_out_end(o);
}

/* Harmony (gpt-oss) output through the real splitter and each API's formatter: an analysis
 * message, then a call message with its recipient and <|constrain|>json. Non-streaming bodies
 * are checked here; the streams are written for the e2e replay through the SDKs
 * (*_harmony.sse). */
static void feed_harmony(api_out *o, bool call)
{
    struct { int32_t id; const char *text; } toks[] = {
        { H_CHANNEL, "<|channel|>" }, { 1, "analysis" }, { H_MESSAGE, "<|message|>" }, { 1, "deep" }, { 1, " thought" },
        { H_END, "<|end|>" }, { H_START, "<|start|>" }, { 1, "assistant" }, { 1, call ? " to=functions.get_weather" : "" },
        { H_CHANNEL, "<|channel|>" }, { 1, call ? "commentary " : "final" }, { call ? H_CONSTRAIN : 1, call ? "<|constrain|>" : "" },
        { 1, call ? "json" : "" }, { H_MESSAGE, "<|message|>" }, { 1, call ? "{\"city\": " : "Answer" }, { 1, call ? "\"Oslo\"}" : " here" },
    };
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) api_out_token(o, 0, toks[i].id, toks[i].text, strlen(toks[i].text), NULL);
    api_out_finish(o, 0, EVENTS_FINISH_STOP);  /* <|call|> / <|return|> end generation: not fed */
    api_out_end(o);
}

/* The reasoning effort each API's field maps to (harmony's "Reasoning:" line). */
TEST(test_reasoning_effort_fields)
{
    static const struct { api_kind kind; const char *body; conv_effort want; } cases[] = {
        { API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", CONV_EFFORT_DEFAULT },
        { API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"low\"}", CONV_EFFORT_LOW },
        { API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"high\"}", CONV_EFFORT_HIGH },
        { API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"effort\":\"medium\"}}", CONV_EFFORT_MEDIUM },
        { API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"effort\":\"high\"}}", CONV_EFFORT_HIGH },
        { API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":9000,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", CONV_EFFORT_DEFAULT },
        { API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":9000,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                             "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048}}", CONV_EFFORT_MEDIUM },
        { API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":9000,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                             "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":8192}}", CONV_EFFORT_HIGH },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_req r;
        api_error e;
        CHECKF(parse(cases[i].kind, cases[i].body, &r, &e) == API_OK, "%s: %s", cases[i].body, e.message);
        CHECKF(r.conv.effort == cases[i].want, "%s: effort %d", cases[i].body, (int)r.conv.effort);
        api_req_free(&r);
    }
}

TEST(test_harmony_outputs)
{
    const char *bodies[3] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}",
        "{\"model\":\"m\",\"input\":\"x\",\"store\":false%s}",
        "{\"model\":\"m\",\"max_tokens\":500,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}"};
    const char *names[3] = {"chat_harmony.sse", "responses_harmony.sse", "messages_harmony.sse"};
    events_markers mk = eventstest_harmony();
    for (int k = 0; k < 3; k++) {
        api_kind kind = k == 0 ? API_KIND_CHAT : k == 1 ? API_KIND_RESPONSES : API_KIND_MESSAGES;
        for (int variant = 0; variant < 3; variant++) {  /* call, answer, call streamed */
            bool call = variant != 1, stream = variant == 2;
            char body[512];
            snprintf(body, sizeof body, bodies[k], stream ? ",\"stream\":true" : "");
            api_req r;
            api_error e;
            CHECK(parse(kind, body, &r, &e) == API_OK);
            api_out o;
            api_out_init(&o, &r, &mk, 5, "m");
            api_out_set_prompt(&o, 10, 0, NULL, 0);
            api_out_begin(&o);
            feed_harmony(&o, call);
            if (stream) {
                dump(names[k], &o.out);
                bool names_ok;
                json_t *ev = sse_parse(o.out.p, &names_ok);
                CHECK(names_ok && json_array_size(ev) > 3);
                CHECKF(strstr(o.out.p, "get_weather") && strstr(o.out.p, "\"deep\"") && !strstr(o.out.p, "<|") && !strstr(o.out.p, "commentary"), "%s", o.out.p);
                json_decref(ev);
            } else {
                json_error_t je;
                json_t *j = json_loadb(o.out.p, o.out.len, 0, &je);
                CHECKF(j != NULL, "%s", o.out.p);
                char *d = json_dumps(j, JSON_COMPACT);
                if (kind == API_KIND_CHAT) {
                    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(c0, "message");
                    CHECKF(!strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "deep thought"), "%s", d);
                    CHECKF(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), call ? "tool_calls" : "stop"), "%s", d);
                    if (call) {
                        json_t *f = json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function");
                        CHECKF(!strcmp(json_string_value(json_object_get(f, "name")), "get_weather") &&
                               !strcmp(json_string_value(json_object_get(f, "arguments")), "{\"city\":\"Oslo\"}"), "%s", d);
                    } else {
                        CHECKF(!strcmp(json_string_value(json_object_get(msg, "content")), "Answer here"), "%s", d);
                    }
                    /* the analysis body and its end marker count as reasoning */
                    json_t *det = json_object_get(json_object_get(j, "usage"), "completion_tokens_details");
                    CHECKF(json_integer_value(json_object_get(det, "reasoning_tokens")) == 3, "%s", d);
                } else {
                    CHECKF(strstr(d, "deep thought") && strstr(d, call ? "get_weather" : "Answer here") &&
                           !strstr(d, "<|") && !strstr(d, "analysis") && !strstr(d, "commentary") && !strstr(d, "json\""), "%s", d);
                    if (kind == API_KIND_MESSAGES) CHECKF(strstr(d, call ? "\"stop_reason\":\"tool_use\"" : "\"stop_reason\":\"end_turn\""), "%s", d);
                }
                free(d);
                json_decref(j);
            }
            api_out_free(&o);
            api_req_free(&r);
        }
    }
}

TEST(test_tool_arguments_stream_sse)
{
    const char *bodies[3] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}",
        "{\"model\":\"m\",\"input\":\"x\",\"stream\":true,\"store\":false}",
        "{\"model\":\"m\",\"max_tokens\":500,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}"};
    const char *names[3] = {"chat_longargs.sse", "responses_longargs.sse", "messages_longargs.sse"};
    for (int k = 0; k < 3; k++) {
        api_kind kind = k == 0 ? API_KIND_CHAT : k == 1 ? API_KIND_RESPONSES : API_KIND_MESSAGES;
        api_req r;
        api_error e;
        CHECK(parse(kind, bodies[k], &r, &e) == API_OK);
        events_markers mk = eventstest_qwen();
        api_out o;
        api_out_init(&o, &r, &mk, 5, "m");
        api_out_set_prompt(&o, 10, 0, NULL, 0);
        api_out_begin(&o);
        feed_long_call(&o);
        dump(names[k], &o.out);
        bool names_ok;
        json_t *ev = sse_parse(o.out.p, &names_ok);
        CHECK(names_ok);
        bytebuf cat = {0};
        bytebuf_puts(&cat, "");
        int n_deltas = 0;
        const char *done = NULL;
        for (size_t q = 0; q < json_array_size(ev); q++) {
            json_t *x = json_array_get(ev, q);
            const char *frag = NULL;
            if (kind == API_KIND_CHAT) {
                json_t *tc = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(x, "choices"), 0), "delta"), "tool_calls"), 0);
                frag = json_string_value(json_object_get(json_object_get(tc, "function"), "arguments"));
                if (frag && !*frag) frag = NULL;  /* the opening chunk's "" */
            } else if (kind == API_KIND_RESPONSES) {
                const char *t = json_string_value(json_object_get(x, "type"));
                if (t && !strcmp(t, "response.function_call_arguments.delta")) frag = json_string_value(json_object_get(x, "delta"));
                if (t && !strcmp(t, "response.function_call_arguments.done")) done = json_string_value(json_object_get(x, "arguments"));
            } else {
                json_t *d = json_object_get(x, "delta");
                const char *t = json_string_value(json_object_get(d, "type"));
                if (t && !strcmp(t, "input_json_delta")) frag = json_string_value(json_object_get(d, "partial_json"));
            }
            if (frag) {
                n_deltas++;
                bytebuf_puts(&cat, frag);
            }
        }
        CHECKF(n_deltas > 5, "%s: %d argument deltas", names[k], n_deltas);
        CHECKF(!strcmp(cat.p, long_args_want), "%s:\n   got  %s\n   want %s", names[k], cat.p, long_args_want);
        if (kind == API_KIND_RESPONSES) CHECK(done && !strcmp(done, long_args_want));
        if (kind == API_KIND_CHAT) CHECK(strstr(o.out.p, "\"finish_reason\":\"tool_calls\"") != NULL);
        bytebuf_free(&cat);
        json_decref(ev);
        api_out_free(&o);
        api_req_free(&r);
    }
}

/* DeepSeek V4 output (the prompt opened <think>): reasoning, </think>, text, then a DSML block
 * of one call whose '<' and tag names are text and ｜DSML｜ a token, through the real splitter
 * and each API's formatter. Non-streaming bodies are checked here; the streams are written for
 * the e2e replay through the SDKs (*_dsml.sse). */
static void feed_dsml(api_out *o)
{
    static const char *const toks[] = {
        "deep", " thought", "#5001:</think>", "Sure", "\n\n", "<", "#7200", "tool_calls>\n", "<", "#7200", "invoke name=\"get\">\n", "<",
        "#7200", "parameter name=\"city\" string=\"true\">", "Oslo", "</", "#7200", "parameter>\n", "<", "#7200",
        "parameter name=\"days\" string=\"false\">", "3", "</", "#7200", "parameter>\n", "</", "#7200", "invoke>\n", "</", "#7200",
        "tool_calls>",
    };
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        const char *t = toks[i];
        if (t[0] == '#') {
            int32_t id = (int32_t)strtol(t + 1, NULL, 10);
            const char *x = id == DSML ? "｜DSML｜" : strchr(t, ':') + 1;
            api_out_token(o, 0, id, x, strlen(x), NULL);
        } else {
            api_out_token(o, 0, 1, t, strlen(t), NULL);
        }
    }
    api_out_finish(o, 0, EVENTS_FINISH_STOP);
    api_out_end(o);
}

TEST(test_dsml_outputs)
{
    const char *bodies[3] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}",
        "{\"model\":\"m\",\"input\":\"x\",\"store\":false%s}",
        "{\"model\":\"m\",\"max_tokens\":500,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}"};
    const char *names[3] = {"chat_dsml.sse", "responses_dsml.sse", "messages_dsml.sse"};
    events_markers mk = eventstest_dsml();
    mk.starts_in_reasoning = true;
    for (int k = 0; k < 3; k++) {
        api_kind kind = k == 0 ? API_KIND_CHAT : k == 1 ? API_KIND_RESPONSES : API_KIND_MESSAGES;
        for (int stream = 0; stream < 2; stream++) {
            char body[512];
            snprintf(body, sizeof body, bodies[k], stream ? ",\"stream\":true" : "");
            api_req r;
            api_error e;
            CHECK(parse(kind, body, &r, &e) == API_OK);
            api_out o;
            api_out_init(&o, &r, &mk, 5, "m");
            api_out_set_prompt(&o, 10, 0, NULL, 0);
            api_out_begin(&o);
            feed_dsml(&o);
            CHECKF(!strstr(o.out.p, "DSML") && !strstr(o.out.p, "invoke") && !strstr(o.out.p, "think>"), "%s", o.out.p);
            if (stream) {
                dump(names[k], &o.out);
                bool names_ok;
                json_t *ev = sse_parse(o.out.p, &names_ok);
                CHECK(names_ok && json_array_size(ev) > 3);
                json_decref(ev);
            } else {
                json_error_t je;
                json_t *j = json_loadb(o.out.p, o.out.len, 0, &je);
                CHECKF(j != NULL, "%s", o.out.p);
                char *d = json_dumps(j, JSON_COMPACT);
                CHECKF(strstr(d, "deep thought") && strstr(d, "Sure") && strstr(d, "Oslo") && strstr(d, "days"), "%s", d);
                if (kind == API_KIND_CHAT) {
                    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(c0, "message");
                    json_t *f = json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function");
                    CHECKF(!strcmp(json_string_value(json_object_get(f, "name")), "get") &&
                           !strcmp(json_string_value(json_object_get(f, "arguments")), "{\"city\":\"Oslo\",\"days\":3}"), "%s", d);
                    CHECKF(!strcmp(json_string_value(json_object_get(msg, "content")), "Sure"), "%s", d);
                    CHECKF(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls"), "%s", d);
                }
                if (kind == API_KIND_MESSAGES) CHECKF(strstr(d, "\"stop_reason\":\"tool_use\""), "%s", d);
                free(d);
                json_decref(j);
            }
            api_out_free(&o);
            api_req_free(&r);
        }
    }
}

TEST(test_store_bound)
{
    api_store *s = api_store_new(2);
    api_req r;
    api_error e;
    CHECK(parse(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"q\"}", &r, &e) == API_OK);
    events_markers mk;
    events_markers_none(&mk);
    api_out o;
    api_out_init(&o, &r, &mk, 1, "m");
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_store_put(s, "a", &r, &o);
    api_store_put(s, "b", &r, &o);
    api_store_put(s, "c", &r, &o);
    conv c;
    conv_init(&c);
    CHECK(!api_store_get(s, "a", &c));
    CHECK(api_store_get(s, "b", &c) && api_store_get(s, "c", &c));
    CHECK(c.n_turns == 4);
    conv_free(&c);
    api_out_free(&o);
    api_req_free(&r);
    api_store_free(s);
}

TEST(test_messages_output)
{
    api_req r;
    api_error e;
    CHECK(parse(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":50,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"stop_sequences\":[\"%%\"]}", &r, &e) == API_OK);
    events_markers mk = eventstest_qwen();
    api_out o;
    api_out_init(&o, &r, &mk, 3, "m");
    api_out_set_prompt(&o, 300, 256, NULL, 0);
    api_out_begin(&o);
    const char *toks[] = {"#5000", "deep", "#5001", "#5002", "{\"name\": \"f\", \"arguments\": {\"q\": \"a\\\"b\"}}", "#5003", "then %", "% cut", NULL};
    feed(&o, 0, toks);
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_out_end(&o);
    dump("messages_tools.sse", &o.out);
    bool names_ok;
    json_t *ev = sse_parse(o.out.p, &names_ok);
    CHECK(names_ok);
    size_t n = json_array_size(ev);
    const char *want[] = {"message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                          "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
                          "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"};
    CHECKF(n == TM_ARRAY_LEN(want), "%zu events", n);
    for (size_t k = 0; k < n && k < TM_ARRAY_LEN(want); k++)
        CHECKF(!strcmp(json_string_value(json_object_get(json_array_get(ev, k), "type")), want[k]), "event %zu", k);
    json_t *ms = json_object_get(json_array_get(ev, 0), "message");
    json_t *u0 = json_object_get(ms, "usage");
    CHECK(json_integer_value(json_object_get(u0, "input_tokens")) == 44);
    CHECK(json_integer_value(json_object_get(u0, "cache_read_input_tokens")) == 256);
    json_t *d = json_object_get(json_array_get(ev, 3), "delta");
    CHECK(!strcmp(json_string_value(json_object_get(d, "type")), "thinking_delta") && !strcmp(json_string_value(json_object_get(d, "thinking")), "deep"));
    d = json_object_get(json_array_get(ev, 4), "delta");
    CHECK(!strcmp(json_string_value(json_object_get(d, "type")), "signature_delta"));
    json_t *cb = json_object_get(json_array_get(ev, 6), "content_block");
    CHECK(!strcmp(json_string_value(json_object_get(cb, "type")), "tool_use") && !strncmp(json_string_value(json_object_get(cb, "id")), "toolu_", 6));
    d = json_object_get(json_array_get(ev, 7), "delta");
    CHECK(!strcmp(json_string_value(json_object_get(d, "type")), "input_json_delta"));
    CHECK(!strcmp(json_string_value(json_object_get(d, "partial_json")), "{\"q\":\"a\\\"b\"}"));
    d = json_object_get(json_array_get(ev, 10), "delta");
    CHECK(!strcmp(json_string_value(json_object_get(d, "text")), "then "));
    json_t *md = json_array_get(ev, 12);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(md, "delta"), "stop_reason")), "stop_sequence"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(md, "delta"), "stop_sequence")), "%%"));
    CHECK(json_integer_value(json_object_get(json_object_get(md, "usage"), "output_tokens")) == 8);
    json_decref(ev);
    api_out_free(&o);
    api_req_free(&r);

    /* non-streaming: blocks in order, tool_use input an object, stop_reason tool_use */
    CHECK(parse(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":50,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == API_OK);
    api_out_init(&o, &r, &mk, 3, "m");
    api_out_set_prompt(&o, 10, 0, NULL, 0);
    const char *t2[] = {"ok", "#5002", "{\"name\": \"f\", \"arguments\": {\"n\": 2}}", "#5003", NULL};
    feed(&o, 0, t2);
    api_out_finish(&o, 0, EVENTS_FINISH_STOP);
    api_out_end(&o);
    json_t *j = json_loadb(o.out.p, o.out.len, 0, NULL);
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "tool_use"));
    json_t *content = json_object_get(j, "content");
    CHECK(json_array_size(content) == 2);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(content, 0), "text")), "ok"));
    json_t *tu = json_array_get(content, 1);
    CHECK(json_integer_value(json_object_get(json_object_get(tu, "input"), "n")) == 2);
    CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "input_tokens")) == 10);
    CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")) == 4);
    json_decref(j);
    api_out_free(&o);
    api_req_free(&r);

    /* max_tokens, nothing generated: an empty text block */
    CHECK(parse(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == API_OK);
    api_out_init(&o, &r, &mk, 3, "m");
    api_out_finish(&o, 0, EVENTS_FINISH_LENGTH);
    api_out_end(&o);
    j = json_loadb(o.out.p, o.out.len, 0, NULL);
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "max_tokens"));
    CHECK(json_array_size(json_object_get(j, "content")) == 1);
    json_decref(j);
    api_out_free(&o);
    api_req_free(&r);
}

/* ---------------------------------------------------------------- bounded input */

/* body_tpl with its one %s replaced by arrays nested so that the whole body nests `depth`
 * levels (the template's own brackets before %s count; its strings hold none). */
static char *nested_body(const char *tpl, int depth)
{
    const char *at = strstr(tpl, "%s");
    int open = 0;
    for (const char *q = tpl; q < at; q++) open += (*q == '[' || *q == '{') - (*q == ']' || *q == '}');
    int k = depth - open;
    size_t n = strlen(tpl) + 2 * (size_t)k + 8;
    char *b = xmalloc(n), *w = b;
    w += snprintf(w, n, "%.*s", (int)(at - tpl), tpl);
    for (int i = 0; i < k; i++) *w++ = '[';
    for (int i = 0; i < k; i++) *w++ = ']';
    snprintf(w, n - (size_t)(w - b), "%s", at + 2);
    return b;
}

TEST(test_nesting_limit_every_field)
{
    /* Every field that holds JSON of the client's shape, in every API: at the limit the depth
     * is not what a rejection is about (most are accepted), one level past it is refused with
     * a message that names the limit. */
    static const struct { api_kind kind; const char *tpl; bool must_accept; } cases[] = {
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                        "{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"x\":%s}}}]}", true},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":%s}}}]}]}", true},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{\"name\":\"f\",\"parameters\":{\"x\":%s}}]}", true},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":{\"x\":%s}}", false},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"text\",\"x\":%s}}", false},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\",\"x\":%s}}", false},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"x\":%s}}", false},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\",\"x\":%s}]}]}", false},
        {API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"user\":%s}", false},
        {API_KIND_RESPONSES, "{\"input\":\"x\",\"metadata\":{\"x\":%s}}", false},
        {API_KIND_RESPONSES, "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"x\":%s}}]}", true},
        {API_KIND_RESPONSES, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"x\",\"x\":%s}]}]}", false},
        {API_KIND_RESPONSES, "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"text\",\"x\":%s}}}", false},
        {API_KIND_RESPONSES, "{\"input\":\"x\",\"reasoning\":{\"x\":%s}}", false},
        {API_KIND_RESPONSES, "{\"input\":\"x\",\"include\":%s}", false},
        {API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\","
                            "\"input_schema\":{\"type\":\"object\",\"x\":%s}}]}", true},
        {API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\","
                            "\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{\"x\":%s}}]}]}", true},
        {API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":{\"x\":%s}}", false},
        {API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":[{\"type\":\"text\",\"text\":\"s\",\"x\":%s}]}", false},
        {API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"disabled\",\"x\":%s}}", false},
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(cases); i++) {
        for (int depth = JSONFMT_MAX_DEPTH; depth <= JSONFMT_MAX_DEPTH + 1; depth++) {
            char *body = nested_body(cases[i].tpl, depth);
            api_req r;
            api_error e;
            api_status st = parse(cases[i].kind, body, &r, &e);
            api_req_free(&r);
            bool deep = st == API_ERR && strstr(e.message, "128") && strstr(e.message, "deep");
            if (depth == JSONFMT_MAX_DEPTH)
                CHECKF(!deep && (st == API_OK || !cases[i].must_accept), "case %zu at the limit: %s", i, e.message);
            else
                CHECKF(deep && e.status == 400, "case %zu past the limit: %s", i, st == API_OK ? "accepted" : e.message);
            free(body);
        }
    }
    /* count_tokens reads the same way */
    char *body = nested_body("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{\"x\":%s}}]}",
                             JSONFMT_MAX_DEPTH + 1);
    api_req r;
    api_error e;
    api_req_init(&r, API_KIND_MESSAGES);
    CHECK(api_messages_count_parse(&cfg_plain, body, strlen(body), &r, &e) == API_ERR && strstr(e.message, "128"));
    api_req_free(&r);
    free(body);
    /* too many values: a flat array of zeros past the count */
    size_t nv = JSONFMT_MAX_VALUES + 2;
    char *flat = xmalloc(2 * nv + 64), *w = flat;
    w += sprintf(w, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"user\":[");
    for (size_t k = 0; k < nv; k++) w += sprintf(w, k ? ",0" : "0");
    sprintf(w, "]}");
    REJECTS(API_KIND_CHAT, flat, 400, "values");
    free(flat);
}

/* ---------------------------------------------------------------- one way to read a field */

TEST(test_fields_checked_alike)
{
    /* logit_bias: the token-id map, in chat and completions, read by one reader */
    static const char *const lb_bodies[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":%s}",
        "{\"prompt\":\"x\",\"logit_bias\":%s}",
    };
    const api_kind lb_kinds[] = {API_KIND_CHAT, API_KIND_COMPLETIONS};
    for (int k = 0; k < 2; k++) {
        char body[256];
        api_req r;
        api_error e;
        snprintf(body, sizeof body, lb_bodies[k], "{\"5\":100,\"77\":-100,\"9\":0.5}");
        CHECK(parse(lb_kinds[k], body, &r, &e) == API_OK);
        CHECK(r.sp.n_bias == 3 && r.sp.bias_id[0] == 5 && r.sp.bias[0] == 100 && r.sp.bias_id[1] == 77 &&
              r.sp.bias[1] == -100 && r.sp.bias[2] == 0.5f);
        api_req_free(&r);
        static const struct { const char *v, *needle; } bad[] = {
            {"[1]", "Invalid type for 'logit_bias'"}, {"{\"x\":1}", "Invalid key in 'logit_bias'"},
            {"{\"-1\":1}", "Invalid key"}, {"{\"5\":101}", "between -100 and 100"},
            {"{\"5\":\"a\"}", "Invalid type for 'logit_bias.5'"}, {"{\"5\":null}", "logit_bias.5"},
        };
        for (size_t i = 0; i < TM_ARRAY_LEN(bad); i++) {
            snprintf(body, sizeof body, lb_bodies[k], bad[i].v);
            REJECTS(lb_kinds[k], body, 400, bad[i].needle);
        }
        /* ids outside the vocabulary, when the server knows its size */
        api_cfg small = {"m", NULL, NULL, 100};
        snprintf(body, sizeof body, lb_bodies[k], "{\"100\":1}");
        api_req_init(&r, lb_kinds[k]);
        CHECK(api_parse(&small, lb_kinds[k], body, strlen(body), &r, &e) == API_ERR && strstr(e.message, "0 to 99"));
        api_req_free(&r);
    }
    /* user and parallel_tool_calls: typed in every OpenAI API, as every other field */
    REJECTS(API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"user\":5}", 400, "Invalid type for 'user': expected a string, but got an integer instead.");
    REJECTS(API_KIND_RESPONSES, "{\"input\":\"x\",\"user\":{}}", 400, "Invalid type for 'user': expected a string, but got an object instead.");
    REJECTS(API_KIND_COMPLETIONS, "{\"prompt\":\"x\",\"user\":[1]}", 400, "Invalid type for 'user': expected a string, but got an array instead.");
    REJECTS(API_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":\"yes\"}", 400, "Invalid type for 'parallel_tool_calls': expected a boolean");
    REJECTS(API_KIND_RESPONSES, "{\"input\":\"x\",\"parallel_tool_calls\":1}", 400, "Invalid type for 'parallel_tool_calls': expected a boolean");
    REJECTS(API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":{\"user_id\":5}}", 400, "metadata.user_id: Input should be a valid string");
    REJECTS(API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":{\"who\":\"a\"}}", 400, "metadata.who: Extra inputs are not permitted");
    /* logit_bias as an extension of Responses and Messages, read by the same reader */
    REJECTS(API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"1\":500}}", 400, "logit_bias.1: a bias must be between -100 and 100");
    REJECTS(API_KIND_RESPONSES, "{\"input\":\"x\",\"logit_bias\":{\"a\":1}}", 400, "Invalid key in 'logit_bias'");
    {
        api_req q;
        api_error qe;
        CHECK(parse(API_KIND_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"3\":-100},\"metadata\":{\"user_id\":\"u\"}}", &q, &qe) == API_OK && q.sp.n_bias == 1);
        api_req_free(&q);
        CHECK(parse(API_KIND_RESPONSES, "{\"input\":\"x\",\"logit_bias\":{\"3\":7}}", &q, &qe) == API_OK && q.sp.n_bias == 1 && q.sp.bias[0] == 7);
        api_req_free(&q);
    }
    /* completions reads its fields with the same checks and words as chat */
    const api_kind P = API_KIND_COMPLETIONS;
    REJECTS(P, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "Invalid type for 'temperature': expected a decimal, but got a string instead.");
    REJECTS(P, "{\"prompt\":\"x\",\"max_tokens\":\"a\"}", 400, "Invalid type for 'max_tokens'");
    REJECTS(P, "{\"prompt\":\"x\",\"n\":100}", 400, "integer above maximum value");
    REJECTS(P, "{\"prompt\":\"x\",\"bogus\":1}", 400, "Unrecognized request argument supplied: bogus");
    REJECTS(P, "{\"prompt\":5}", 400, "Invalid type for 'prompt'");
    REJECTS(P, "{}", 400, "Missing required parameter: 'prompt'");
    REJECTS(P, "{\"prompt\":[1,\"a\"]}", 400, "prompt[1]");
    REJECTS(P, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400, "stream");
    REJECTS(P, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "at most 4");
    REJECTS(P, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo");
    REJECTS(P, "{\"prompt\":\"x\",\"model\":\"other\"}", 404, "does not exist");
    api_req r;
    api_error e;
    CHECK(parse(P, "{\"prompt\":[1,2,3],\"logprobs\":2,\"stop\":\"S\",\"max_tokens\":0,\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true,\"seed\":7}", &r, &e) == API_OK);
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && r.logprobs && r.top_logprobs == 2 && r.n_stop == 1);
    CHECK(r.max_tokens == 0 && r.stream && r.include_usage && r.ignore_eos && r.sp.seed == 7);
    api_req_free(&r);
    CHECK(parse(P, "{\"prompt\":[\"hello\"]}", &r, &e) == API_OK && r.prompt_text && !strcmp(r.prompt_text, "hello") &&
          r.max_tokens == 16);
    api_req_free(&r);
}

/* ---------------------------------------------------------------- UTF-8 out */

TEST(test_utf8_out)
{
    /* every formatter writes through jsonfmt's string writer (test_jsonfmt): tokens whose
     * text is not UTF-8 on their own, in every API's body and stream, come out valid */
    for (int kind = API_KIND_CHAT; kind <= API_KIND_MESSAGES; kind++) {
        for (int stream = 0; stream < 2; stream++) {
            api_req r;
            api_req_init(&r, (api_kind)kind);
            r.stream = stream;
            r.logprobs = kind == API_KIND_CHAT;
            events_markers m;
            events_markers_none(&m);
            api_out o;
            api_out_init(&o, &r, &m, 1, "m");
            api_out_begin(&o);
            api_logprob lp = {.token = 1, .logprob = -0.5f};
            api_out_token(&o, 0, 1, "x\xE2", 2, &lp);
            api_out_token(&o, 0, 2, "\x82" "ab", 3, &lp);
            api_out_finish(&o, 0, EVENTS_FINISH_STOP);
            api_out_end(&o);
            CHECKF(unicode_utf8_valid(o.out.p, o.out.len), "kind %d stream %d: %s", kind, stream, o.out.p);
            CHECK(strstr(o.out.p, "\xEF\xBF\xBD"));
            api_out_free(&o);
            api_req_free(&r);
        }
    }
}

/* ---------------------------------------------------------------- structured output */

static const char chat_head[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],";

/* Parses chat_head + rest + "}" with kind's parser (rest must name every other member). */
static int parse_with(api_kind kind, const char *head, const char *rest, api_req *r, api_error *e)
{
    char body[2048];
    snprintf(body, sizeof body, "%s%s}", head, rest);
    return parse(kind, body, r, e);
}

static bool rejects_with(api_kind kind, const char *head, const char *rest, const char *param, const char *needle)
{
    api_req r;
    api_error e;
    bool ok = parse_with(kind, head, rest, &r, &e) == API_ERR && e.status == 400 &&
              (!param || !strcmp(e.param, param)) && (!needle || strstr(e.message, needle));
    if (!ok) fprintf(stderr, "  want 400 %s: param '%s' message '%s' for %s\n", param ? param : "", e.param, e.message, rest);
    api_req_free(&r);
    return ok;
}

/* The format r holds, compiled, accepts doc. */
static bool format_accepts(const api_req *r, const char *doc)
{
    grammar *g = NULL;
    char err[256];
    if (grammar_compile((grammar_kind)r->fmt_kind, r->fmt_src ? r->fmt_src : "", r->fmt_len, &g, err, sizeof err) !=
        GRAMMAR_OK) {
        fprintf(stderr, "  compile: %s\n", err);
        return false;
    }
    bool ok = grammar_accepts(g, doc, strlen(doc));
    grammar_free(g);
    return ok;
}

TEST(test_structured_formats_parse)
{
    api_req r;
    api_error e;
    /* chat: json_schema nests {name, schema, strict} under json_schema */
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
                     "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                     "\"required\":[\"a\"],\"additionalProperties\":false}}}", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_SCHEMA && !strcmp(r.fmt_param, "response_format.json_schema.schema"));
    CHECK(format_accepts(&r, "{\"a\": 12}") && !format_accepts(&r, "{\"a\": \"x\"}") && !format_accepts(&r, "{}"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"response_format\":{\"type\":\"json_object\"}", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_JSON && format_accepts(&r, "{\"k\": [1, null]}") && !format_accepts(&r, "[1]"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"response_format\":{\"type\":\"text\"}", &r, &e) == API_OK);
    CHECK(r.fmt_kind == -1);
    api_req_free(&r);
    /* Messages: structured outputs, output_config.format (GA) and output_format (beta) */
    static const char msg_head[] = "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],";
    CHECK(parse_with(API_KIND_MESSAGES, msg_head, "\"output_config\":{\"effort\":\"low\",\"format\":{\"type\":\"json_schema\","
                     "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_SCHEMA && !strcmp(r.fmt_param, "output_config.format.schema") && r.conv.effort == CONV_EFFORT_LOW);
    CHECK(format_accepts(&r, "{\"a\": 12}") && !format_accepts(&r, "{\"a\": \"x\"}"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_MESSAGES, msg_head, "\"output_format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"string\"}}", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_SCHEMA && !strcmp(r.fmt_param, "output_format.schema") && format_accepts(&r, "\"s\""));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_MESSAGES, msg_head, "\"output_format\":{\"type\":\"json_object\"}", &r, &e) == API_ERR);
    CHECKF(e.status == 400 && strstr(e.message, "output_format.type"), "%s", e.message);
    api_req_free(&r);
    CHECK(parse_with(API_KIND_MESSAGES, msg_head, "\"output_config\":{\"format\":{\"type\":\"json_schema\"}}", &r, &e) == API_ERR);
    CHECKF(strstr(e.message, "output_config.format.schema"), "%s", e.message);
    api_req_free(&r);
    /* Responses: the format's own members (flat) */
    CHECK(parse_with(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",", "\"text\":{\"format\":{\"type\":\"json_schema\","
                     "\"name\":\"p\",\"schema\":{\"enum\":[\"a\",\"b\"]}}}", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_SCHEMA && !strcmp(r.fmt_param, "text.format.schema"));
    CHECK(format_accepts(&r, "\"b\"") && !format_accepts(&r, "\"c\""));
    api_req_free(&r);
    /* the extensions */
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"guided_choice\":[\"yes\",\"maybe \\\"so\\\"\\n\"]", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_GBNF && !strcmp(r.fmt_param, "guided_choice"));
    CHECK(format_accepts(&r, "yes") && format_accepts(&r, "maybe \"so\"\n") && !format_accepts(&r, "no"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"guided_regex\":\"[a-c]{2}\"", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_REGEX && format_accepts(&r, "ab") && !format_accepts(&r, "abc"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"guided_json\":\"{\\\"type\\\":\\\"boolean\\\"}\"", &r, &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_SCHEMA && format_accepts(&r, "true"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",", "\"grammar\":\"root ::= \\\"hi\\\"\"", &r,
                     &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_GBNF && format_accepts(&r, "hi"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",", "\"json_schema\":{\"type\":\"null\"}", &r,
                     &e) == API_OK);
    CHECK(r.fmt_kind == GRAMMAR_KIND_SCHEMA && format_accepts(&r, "null"));
    api_req_free(&r);
    /* refused, naming the field */
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"response_format\":{\"type\":\"xml\"}", "response_format.type", "xml"));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"response_format\":{\"type\":\"json_schema\"}",
                       "response_format.json_schema", NULL));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}",
                       "response_format.json_schema.schema", NULL));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"response_format\":\"json\"", "response_format", NULL));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"response_format\":{\"type\":\"json_object\"},\"guided_regex\":\"a\"",
                       "guided_regex", "response_format"));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]", "guided_choice", NULL));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"guided_choice\":[]", "guided_choice", NULL));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"guided_choice\":[\"a\",1]", "guided_choice[1]", NULL));
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"guided_regex\":3", "guided_regex", NULL));
    CHECK(rejects_with(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",", "\"text\":{\"format\":{\"type\":\"json_schema\"}}",
                       "text.format.schema", NULL));
}

TEST(test_structured_tool_choice_parse)
{
    api_req r;
    api_error e;
    static const char tools[] = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],";
    char rest[512];
    snprintf(rest, sizeof rest, "%s\"tool_choice\":\"required\"", tools);
    CHECK(parse_with(API_KIND_CHAT, chat_head, rest, &r, &e) == API_OK && r.tools_mode == API_TOOLS_REQUIRED);
    api_req_free(&r);
    snprintf(rest, sizeof rest, "%s\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", tools);
    CHECK(parse_with(API_KIND_CHAT, chat_head, rest, &r, &e) == API_OK && r.tools_mode == API_TOOLS_NAMED &&
          !strcmp(r.tool_name, "f"));
    api_req_free(&r);
    snprintf(rest, sizeof rest, "%s\"tool_choice\":\"none\"", tools);
    CHECK(parse_with(API_KIND_CHAT, chat_head, rest, &r, &e) == API_OK && r.tools_mode == API_TOOLS_NONE && r.conv.n_tools == 0);
    api_req_free(&r);
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"tool_choice\":{\"type\":\"function\"}", "tool_choice.function.name", NULL));
    CHECK(parse_with(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",",
                     "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}",
                     &r, &e) == API_OK);
    CHECK(r.tools_mode == API_TOOLS_NAMED && !strcmp(r.tool_name, "f"));
    api_req_free(&r);
    CHECK(parse_with(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",", "\"tool_choice\":\"required\"", &r, &e) == API_OK);
    CHECK(r.tools_mode == API_TOOLS_REQUIRED);
    api_req_free(&r);
    CHECK(rejects_with(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",", "\"tool_choice\":\"always\"", "tool_choice", NULL));
    static const char mhead[] = "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],";
    CHECK(parse_with(API_KIND_MESSAGES, mhead, "\"tool_choice\":{\"type\":\"any\"}", &r, &e) == API_OK &&
          r.tools_mode == API_TOOLS_REQUIRED);
    api_req_free(&r);
    CHECK(parse_with(API_KIND_MESSAGES, mhead, "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}", &r, &e) == API_OK &&
          r.tools_mode == API_TOOLS_NAMED && !strcmp(r.tool_name, "f"));
    api_req_free(&r);
    CHECK(rejects_with(API_KIND_MESSAGES, mhead, "\"tool_choice\":{\"type\":\"tool\"}", "tool_choice.tool.name", NULL));
}

/* Whether the tokens of pieces form a complete document of gbnf: "#ID" is token ID (a
 * control token: no bytes), any other piece is text fed one byte-token at a time. */
static bool tokens_accepted(const char *gbnf, const char *const *pieces)
{
    enum { NV = 6100 };  /* to the harmony markers */
    static char bytes[256];
    static const char *tb[NV];
    static int lens[NV];
    for (int i = 0; i < NV; i++) {
        bytes[i & 255] = (char)(i & 255);
        tb[i] = &bytes[i & 255];
        lens[i] = i < 256;  /* 0..255: one byte each; the rest: control tokens */
    }
    grammar *g = NULL;
    char err[256];
    if (grammar_compile(GRAMMAR_KIND_GBNF, gbnf, strlen(gbnf), &g, err, sizeof err) != GRAMMAR_OK) {
        fprintf(stderr, "  compile: %s\n%s\n", err, gbnf);
        return false;
    }
    grammar_vocab *v = grammar_vocab_new(NV, tb, lens);
    grammar_match *m = grammar_match_new(g, v, NULL, 0);
    bool ok = true;
    for (int k = 0; pieces[k] && ok; k++) {
        if (pieces[k][0] == '#') ok = grammar_match_accept(m, atoi(pieces[k] + 1));
        else
            for (const char *c = pieces[k]; *c && ok; c++) ok = grammar_match_accept(m, (unsigned char)*c);
    }
    ok = ok && grammar_match_complete(m);
    grammar_match_free(m);
    grammar_vocab_free(v);
    grammar_free(g);
    return ok;
}

/* DeepSeek V4's DSML: only ｜DSML｜ is a token (5500 here, within tokens_accepted's
 * vocabulary), the '<' before it text, so a forced grammar starts with that '<' (no trigger)
 * and a lazy one after the token; string properties raw with string="true", others their
 * schema's JSON with string="false", in the schema's order; a blank line for no parameters. */
TEST(test_structured_tool_gbnf_dsml)
{
    conv c;
    conv_init(&c);
    conv_add_tool(&c, "get_weather", NULL,
                  "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                  "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\",\"days\"],\"additionalProperties\":false}");
    conv_add_tool(&c, "now", NULL, "{\"type\":\"object\",\"properties\":{}}");
    char err[256];
    int32_t trig;
    events_markers m = eventstest_dsml();
    m.tool_start = 5500;
#define D "#5500"
    char *g = api_tool_gbnf(&c, &m, NULL, false, true, &trig, err, sizeof err);
    CHECKF(g && trig == -1, "%s", err);
    if (g) {
        const char *ok[] = {"<", D, "tool_calls>\n<", D, "invoke name=\"get_weather\">\n<", D, "parameter name=\"city\" string=\"true\">New </York",
                            "</", D, "parameter>\n<", D, "parameter name=\"days\" string=\"false\">3</", D, "parameter>\n<", D,
                            "parameter name=\"unit\" string=\"true\">f</", D, "parameter>\n</", D, "invoke>\n</", D, "tool_calls>", NULL};
        const char *opt[] = {"<", D, "tool_calls>\n<", D, "invoke name=\"get_weather\">\n<", D, "parameter name=\"city\" string=\"true\">x</",
                             D, "parameter>\n<", D, "parameter name=\"days\" string=\"false\">-1</", D, "parameter>\n</", D, "invoke>\n</", D,
                             "tool_calls>", NULL};
        const char *none[] = {"<", D, "tool_calls>\n<", D, "invoke name=\"now\">\n\n</", D, "invoke>\n</", D, "tool_calls>", NULL};
        const char *missing[] = {"<", D, "tool_calls>\n<", D, "invoke name=\"get_weather\">\n\n</", D, "invoke>\n</", D, "tool_calls>", NULL};
        const char *bad_int[] = {"<", D, "tool_calls>\n<", D, "invoke name=\"get_weather\">\n<", D, "parameter name=\"city\" string=\"true\">x</",
                                 D, "parameter>\n<", D, "parameter name=\"days\" string=\"true\">3</", D, "parameter>\n</", D, "invoke>\n</", D,
                                 "tool_calls>", NULL};
        const char *spelled[] = {"<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", NULL};
        const char *two[] = {"<", D, "tool_calls>\n<", D, "invoke name=\"now\">\n\n</", D, "invoke>\n<", D, "invoke name=\"now\">\n\n</", D,
                             "invoke>\n</", D, "tool_calls>", NULL};
        CHECK(tokens_accepted(g, ok) && tokens_accepted(g, opt) && tokens_accepted(g, none));
        CHECK(!tokens_accepted(g, missing) && !tokens_accepted(g, bad_int) && !tokens_accepted(g, spelled) && !tokens_accepted(g, two));
    }
    free(g);
    /* lazy (strict tools under auto): after the ｜DSML｜ token, several calls, then nothing */
    c.tools[1].strict = true;
    g = api_tool_gbnf(&c, &m, NULL, true, false, &trig, err, sizeof err);
    CHECK(g && trig == 5500);
    if (g) {
        const char *two[] = {"tool_calls>\n<", D, "invoke name=\"now\">\n\n</", D, "invoke>\n<", D, "invoke name=\"get_weather\">\n<", D,
                             "parameter name=\"q\" string=\"false\">{\"a\": 1}</", D, "parameter>\n</", D, "invoke>\n</", D, "tool_calls>", NULL};
        CHECK(tokens_accepted(g, two));
    }
    free(g);
    /* V3.2's block name; a vocabulary without ｜DSML｜: no grammar, no error */
    m.dsml_v32 = true;
    g = api_tool_gbnf(&c, &m, "now", false, true, &trig, err, sizeof err);
    const char *v32[] = {"<", D, "function_calls>\n<", D, "invoke name=\"now\">\n\n</", D, "invoke>\n</", D, "function_calls>", NULL};
    CHECK(g && tokens_accepted(g, v32));
    free(g);
    m.tool_start = -1;
    CHECK(api_tool_gbnf(&c, &m, NULL, false, true, &trig, err, sizeof err) == NULL && err[0] == 0);
#undef D
    conv_free(&c);
}

TEST(test_structured_tool_gbnf)
{
    conv c;
    conv_init(&c);
    conv_add_tool(&c, "get_weather", NULL,
                  "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
                  "\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}");
    conv_add_tool(&c, "a\"b", NULL, NULL);  /* no parameters: any object; a name JSON must escape */
    char err[256];
    int32_t trig;
    events_markers qm = eventstest_qwen(), dm = eventstest_deepseek(), lm;
    events_markers_none(&lm);
    lm.toolfmt = EVENTS_TOOLFMT_LLAMA3;
    /* Qwen: the markers are token terminals around the JSON body */
    char *q = api_tool_gbnf(&c, &qm, NULL, false, false, &trig, err, sizeof err);
    CHECK(q != NULL && trig == TC);
    if (q) {
        const char *ok1[] = {"#5002", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"c\"}}\n", "#5003", NULL};
        const char *ok2[] = {"#5002", "\n{\"name\": \"a\\\"b\", \"arguments\": {\"x\": [1]}}\n", "#5003", NULL};
        const char *bad_unit[] = {"#5002", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"k\"}}\n", "#5003", NULL};
        const char *missing[] = {"#5002", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n", "#5003", NULL};
        const char *other[] = {"#5002", "\n{\"name\": \"other\", \"arguments\": {}}\n", "#5003", NULL};
        const char *spelled[] = {"<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": {}}\n</tool_call>", NULL};
        const char *unclosed[] = {"#5002", "\n{\"name\": \"a\\\"b\", \"arguments\": {}}\n", NULL};
        CHECK(tokens_accepted(q, ok1) && tokens_accepted(q, ok2));
        CHECK(!tokens_accepted(q, bad_unit) && !tokens_accepted(q, missing) && !tokens_accepted(q, other));
        CHECK(!tokens_accepted(q, spelled));  /* markers by id only, never their text */
        CHECK(!tokens_accepted(q, unclosed));
    }
    free(q);
    char *only = api_tool_gbnf(&c, &qm, "a\"b", false, false, &trig, err, sizeof err);
    const char *named_other[] = {"#5002", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"c\"}}\n", "#5003", NULL};
    const char *named[] = {"#5002", "\n{\"name\": \"a\\\"b\", \"arguments\": {}}\n", "#5003", NULL};
    CHECK(only && !tokens_accepted(only, named_other) && tokens_accepted(only, named));
    free(only);
    /* Llama 3: no marker token, the answer is the JSON object */
    char *l = api_tool_gbnf(&c, &lm, "get_weather", false, false, &trig, err, sizeof err);
    const char *ll[] = {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"\", \"unit\": \"f\"}}", NULL};
    CHECK(l && trig == -1 && tokens_accepted(l, ll));
    free(l);
    /* ... so strict tools under auto cannot be bound there: no grammar, no error */
    CHECK(api_tool_gbnf(&c, &lm, NULL, true, false, &trig, err, sizeof err) == NULL && err[0] == 0 && trig == -1);
    /* DeepSeek V3.1: every marker a control token, the name as text between them */
    char *d = api_tool_gbnf(&c, &dm, NULL, false, false, &trig, err, sizeof err);
    CHECK(d && trig == CALLS_B);
    if (d) {
        const char *ok[] = {"#5004", "#5006", "get_weather", "#5008", "{\"city\": \"Oslo\", \"unit\": \"f\"}", "#5007", "#5005", NULL};
        const char *bad[] = {"#5004", "#5006", "get_weather", "#5008", "{\"city\": \"Oslo\"}", "#5007", "#5005", NULL};
        const char *two[] = {"#5004", "#5006", "a\"b", "#5008", "{}", "#5007", "#5006", "a\"b", "#5008", "{}", "#5007", "#5005", NULL};
        const char *nosep[] = {"#5004", "#5006", "get_weather", "{\"city\": \"Oslo\", \"unit\": \"f\"}", "#5007", "#5005", NULL};
        CHECK(tokens_accepted(d, ok) && !tokens_accepted(d, bad) && !tokens_accepted(d, nosep));
        CHECK(!tokens_accepted(d, two));  /* a forced call is one call */
    }
    free(d);
    /* DeepSeek, lazy (strict tools under auto): what follows the trigger, several calls */
    c.tools[0].strict = true;
    d = api_tool_gbnf(&c, &dm, NULL, true, false, &trig, err, sizeof err);
    CHECK(d && trig == CALLS_B);
    if (d) {
        const char *two[] = {"#5006", "a\"b", "#5008", "{}", "#5007", "#5006", "get_weather", "#5008",
                             "{\"city\": \"x\", \"unit\": \"c\"}", "#5007", "#5005", NULL};
        const char *bad[] = {"#5006", "get_weather", "#5008", "{\"city\": 1, \"unit\": \"c\"}", "#5007", "#5005", NULL};
        const char *with_trigger[] = {"#5004", "#5006", "a\"b", "#5008", "{}", "#5007", "#5005", NULL};
        CHECK(tokens_accepted(d, two) && !tokens_accepted(d, bad) && !tokens_accepted(d, with_trigger));
    }
    free(d);
    /* lazy Qwen: a strict tool by its schema, a non-strict one any object (even one its
     * schema would refuse) */
    c.tools[0].strict = false;
    conv_add_tool(&c, "s", NULL, "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],"
                                 "\"additionalProperties\":false}");
    c.tools[2].strict = true;
    q = api_tool_gbnf(&c, &qm, NULL, true, false, &trig, err, sizeof err);
    CHECK(q && trig == TC);
    if (q) {
        const char *loose[] = {"\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}\n", "#5003", NULL};
        const char *strict_ok[] = {"\n{\"name\": \"s\", \"arguments\": {\"n\": 42}}\n", "#5003", NULL};
        const char *strict_bad[] = {"\n{\"name\": \"s\", \"arguments\": {\"n\": \"42\"}}\n", "#5003", NULL};
        CHECK(tokens_accepted(q, loose) && tokens_accepted(q, strict_ok) && !tokens_accepted(q, strict_bad));
    }
    free(q);
    /* a family lacking one of its tokens, or with no call syntax: none, and no error */
    dm.tool_sep = -1;
    CHECK(api_tool_gbnf(&c, &dm, NULL, false, false, &trig, err, sizeof err) == NULL && err[0] == 0);
    events_markers nm;
    events_markers_none(&nm);
    CHECK(api_tool_gbnf(&c, &nm, NULL, false, false, &trig, err, sizeof err) == NULL && err[0] == 0);
    /* a tool not offered, a schema refused: the error names it */
    CHECK(api_tool_gbnf(&c, &qm, "nope", false, false, &trig, err, sizeof err) == NULL && strstr(err, "nope"));
    conv_add_tool(&c, "bad", NULL, "{\"type\":\"object\",\"not\":{}}");
    CHECK(api_tool_gbnf(&c, &qm, NULL, false, false, &trig, err, sizeof err) == NULL && strstr(err, "bad") && strstr(err, "not"));
    /* ... but not when it is not strict and the call is lazy (its schema is not used) */
    q = api_tool_gbnf(&c, &qm, NULL, true, false, &trig, err, sizeof err);
    CHECK(q != NULL);
    free(q);
    conv_free(&c);
}

/* A response format with tools under auto: the answer is a document of the format, or a call
 * opened by the family's token; never a mix. */
TEST(test_structured_format_or_calls_gbnf)
{
    conv c;
    conv_init(&c);
    conv_add_tool(&c, "n", NULL, "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},\"required\":[\"k\"],"
                                 "\"additionalProperties\":false}");
    c.tools[0].strict = true;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"x\":{\"enum\":[1,2]}},\"required\":[\"x\"],\"additionalProperties\":false}";
    char err[256];
    events_markers qm = eventstest_qwen(), lm;
    events_markers_none(&lm);
    lm.toolfmt = EVENTS_TOOLFMT_LLAMA3;
    char *g = api_format_calls_gbnf(&c, &qm, GRAMMAR_KIND_SCHEMA, schema, strlen(schema), false, err, sizeof err);
    CHECK(g != NULL);
    if (g) {
        const char *doc[] = {"{\"x\": 2}", NULL};
        const char *bad_doc[] = {"{\"x\": 3}", NULL};
        const char *call[] = {"#5002", "\n{\"name\": \"n\", \"arguments\": {\"k\": 7}}\n", "#5003", NULL};
        const char *bad_call[] = {"#5002", "\n{\"name\": \"n\", \"arguments\": {\"k\": \"7\"}}\n", "#5003", NULL};
        const char *mix[] = {"{\"x\": 2}", "#5002", "\n{\"name\": \"n\", \"arguments\": {\"k\": 7}}\n", "#5003", NULL};
        CHECK(tokens_accepted(g, doc) && tokens_accepted(g, call));
        CHECK(!tokens_accepted(g, bad_doc) && !tokens_accepted(g, bad_call) && !tokens_accepted(g, mix));
    }
    free(g);
    /* the JSON kind (no source) and a family without an opening token */
    g = api_format_calls_gbnf(&c, &qm, GRAMMAR_KIND_JSON, NULL, 0, false, err, sizeof err);
    const char *obj[] = {"{\"a\": [true]}", NULL};
    CHECK(g && tokens_accepted(g, obj));
    free(g);
    CHECK(api_format_calls_gbnf(&c, &lm, GRAMMAR_KIND_SCHEMA, schema, strlen(schema), false, err, sizeof err) == NULL && !err[0]);
    /* a refused format or tool schema is an error */
    CHECK(api_format_calls_gbnf(&c, &qm, GRAMMAR_KIND_SCHEMA, "{\"not\":{}}", 10, false, err, sizeof err) == NULL && strstr(err, "not"));
    conv_free(&c);
}

/* harmony: the call message after the analysis, every marker by id; under auto the trigger
 * is <|start|> and the message it opens is a call or a free message */
TEST(test_structured_tool_gbnf_harmony)
{
    conv c;
    conv_init(&c);
    conv_add_tool(&c, "get_weather", NULL,
                  "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],"
                  "\"additionalProperties\":false}");
    conv_add_tool(&c, "noop", NULL, NULL);
    events_markers hm = eventstest_harmony();
    char err[256];
    int32_t trig;
    /* required with several tools: <|start|>assistant<|channel|>commentary to=functions.N ... */
    char *g = api_tool_gbnf(&c, &hm, NULL, false, false, &trig, err, sizeof err);
    CHECK(g && trig == H_START);
    if (g) {
        const char *ok[] = {"#6000", "assistant", "#6001", "commentary to=functions.get_weather ", "#6003", "json", "#6002",
                            "{\"city\": \"Oslo\"}", "#6005", NULL};
        const char *ok2[] = {"#6000", "assistant", "#6001", "commentary to=functions.noop ", "#6003", "json", "#6002",
                             "{\"a\": 1}", "#6005", NULL};
        const char *bad_args[] = {"#6000", "assistant", "#6001", "commentary to=functions.get_weather ", "#6003", "json",
                                  "#6002", "{\"town\": \"Oslo\"}", "#6005", NULL};
        const char *other[] = {"#6000", "assistant", "#6001", "commentary to=functions.set ", "#6003", "json", "#6002",
                               "{}", "#6005", NULL};
        const char *answer[] = {"#6000", "assistant", "#6001", "final", "#6002", "hi", "#6006", NULL};
        const char *spelled[] = {"<|start|>assistant<|channel|>commentary to=functions.noop <|constrain|>json<|message|>{}",
                                 "#6005", NULL};
        const char *unended[] = {"#6000", "assistant", "#6001", "commentary to=functions.noop ", "#6003", "json", "#6002",
                                 "{}", NULL};
        CHECK(tokens_accepted(g, ok) && tokens_accepted(g, ok2));
        CHECK(!tokens_accepted(g, bad_args) && !tokens_accepted(g, other) && !tokens_accepted(g, answer));
        CHECK(!tokens_accepted(g, spelled) && !tokens_accepted(g, unended));
    }
    free(g);
    /* a call forced to one tool (named, or required with one tool): the prompt opened it */
    c.forced_call = "get_weather";
    g = api_tool_gbnf(&c, &hm, "get_weather", false, false, &trig, err, sizeof err);
    const char *args[] = {"{\"city\": \"x\"}", NULL};
    CHECK(g && trig == -1 && tokens_accepted(g, args));
    free(g);
    c.forced_call = NULL;
    /* auto with a strict tool: what follows <|start|> */
    c.tools[0].strict = true;
    g = api_tool_gbnf(&c, &hm, NULL, true, false, &trig, err, sizeof err);
    CHECK(g && trig == H_START);
    if (g) {
        const char *call[] = {"assistant", "#6001", "commentary to=functions.get_weather ", "#6003", "json", "#6002",
                              "{\"city\": \"Oslo\"}", "#6005", NULL};
        const char *loose[] = {"assistant", "#6001", "commentary to=functions.noop ", "#6003", "json", "#6002",
                               "{\"z\": [1]}", "#6005", NULL};
        const char *strict_bad[] = {"assistant", "#6001", "commentary to=functions.get_weather ", "#6003", "json", "#6002",
                                    "{\"city\": 3}", "#6005", NULL};
        const char *final[] = {"assistant", "#6001", "final", "#6002", "any text {", "#6006", NULL};
        const char *analysis[] = {"assistant", "#6001", "analysis", "#6002", "think", "#6004", NULL};
        const char *preamble[] = {"assistant", "#6001", "commentary", "#6002", "on it", "#6004", NULL};
        const char *marker_in_text[] = {"assistant", "#6001", "final", "#6002", "a", "#6001", "#6006", NULL};
        CHECK(tokens_accepted(g, call) && tokens_accepted(g, loose) && !tokens_accepted(g, strict_bad));
        CHECK(tokens_accepted(g, final) && tokens_accepted(g, analysis) && tokens_accepted(g, preamble));
        CHECK(!tokens_accepted(g, marker_in_text));
    }
    free(g);
    /* with a response format the format alone binds the answer (no error) */
    CHECK(api_format_calls_gbnf(&c, &hm, GRAMMAR_KIND_JSON, NULL, 0, false, err, sizeof err) == NULL && !err[0]);
    /* a vocabulary without one of the markers: no grammar, no error */
    hm.h_constrain = -1;
    CHECK(api_tool_gbnf(&c, &hm, NULL, false, false, &trig, err, sizeof err) == NULL && !err[0]);
    conv_free(&c);
}

/* parallel tool calls off: one call per block (DeepSeek), and after a lazy call free text in
 * which no call may open (Qwen, DeepSeek) */
TEST(test_structured_tool_gbnf_one_call)
{
    conv c;
    conv_init(&c);
    conv_add_tool(&c, "f", NULL, NULL);
    c.tools[0].strict = true;
    char err[256];
    int32_t trig;
    events_markers qm = eventstest_qwen(), dm = eventstest_deepseek();
    const char *q_two[] = {"\n{\"name\": \"f\", \"arguments\": {}}\n", "#5003", "then ", "#5002", NULL};
    const char *q_one[] = {"\n{\"name\": \"f\", \"arguments\": {}}\n", "#5003", "then text", NULL};
    char *many = api_tool_gbnf(&c, &qm, NULL, true, false, &trig, err, sizeof err);
    char *one = api_tool_gbnf(&c, &qm, NULL, true, true, &trig, err, sizeof err);
    CHECK(many && one && trig == TC);
    CHECK(one && tokens_accepted(one, q_one) && !tokens_accepted(one, q_two));
    /* (several calls: the lazy grammar ends at </tool_call>, the next <tool_call> opens another) */
    const char *q_end[] = {"\n{\"name\": \"f\", \"arguments\": {}}\n", "#5003", "x", NULL};
    CHECK(many && !tokens_accepted(many, q_end));
    free(many);
    free(one);
    const char *d_two[] = {"#5006", "f", "#5008", "{}", "#5007", "#5006", "f", "#5008", "{}", "#5007", "#5005", NULL};
    const char *d_one[] = {"#5006", "f", "#5008", "{}", "#5007", "#5005", "done", NULL};
    const char *d_again[] = {"#5006", "f", "#5008", "{}", "#5007", "#5005", "#5004", NULL};
    many = api_tool_gbnf(&c, &dm, NULL, true, false, &trig, err, sizeof err);
    one = api_tool_gbnf(&c, &dm, NULL, true, true, &trig, err, sizeof err);
    CHECK(many && tokens_accepted(many, d_two));
    CHECK(one && !tokens_accepted(one, d_two) && tokens_accepted(one, d_one) && !tokens_accepted(one, d_again));
    free(many);
    free(one);
    /* with a response format: one call in the block */
    char *g = api_format_calls_gbnf(&c, &dm, GRAMMAR_KIND_JSON, NULL, 0, true, err, sizeof err);
    const char *fd_two[] = {"#5004", "#5006", "f", "#5008", "{}", "#5007", "#5006", "f", "#5008", "{}", "#5007", "#5005", NULL};
    CHECK(g && !tokens_accepted(g, fd_two));
    free(g);
    conv_free(&c);
}

/* parallel_tool_calls false (Chat, Responses), disable_parallel_tool_use (Messages) */
TEST(test_structured_one_call_parse)
{
    api_req r;
    api_error e;
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"parallel_tool_calls\":false", &r, &e) == API_OK && r.one_call);
    api_req_free(&r);
    CHECK(parse_with(API_KIND_CHAT, chat_head, "\"parallel_tool_calls\":true", &r, &e) == API_OK && !r.one_call);
    api_req_free(&r);
    CHECK(parse_with(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",", "\"parallel_tool_calls\":false", &r, &e) ==
              API_OK && r.one_call);
    api_req_free(&r);
    CHECK(parse_with(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],",
                     "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true}", &r, &e) == API_OK && r.one_call);
    api_req_free(&r);
    CHECK(rejects_with(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],",
                       "\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":1}", "disable_parallel_tool_use", NULL));
}

TEST(test_structured_tool_strict_parse)
{
    api_req r;
    api_error e;
    CHECK(parse_with(API_KIND_CHAT, chat_head,
                     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true}},"
                     "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]", &r, &e) == API_OK);
    CHECK(r.conv.n_tools == 2 && r.conv.tools[0].strict && !r.conv.tools[1].strict);
    api_req_free(&r);
    CHECK(parse_with(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",",
                     "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"strict\":true}]", &r, &e) == API_OK);
    CHECK(r.conv.n_tools == 1 && r.conv.tools[0].strict);
    api_req_free(&r);
    CHECK(parse_with(API_KIND_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],",
                     "\"tools\":[{\"name\":\"f\",\"strict\":true,\"input_schema\":{\"type\":\"object\"}}]", &r, &e) == API_OK);
    CHECK(r.conv.n_tools == 1 && r.conv.tools[0].strict);
    api_req_free(&r);
    CHECK(rejects_with(API_KIND_CHAT, chat_head, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":1}}]",
                       "tools[0].function.strict", NULL));
}

/* A forced call after free reasoning comes out as a tool call: the grammar makes the model
 * write the family's markers by id, which the splitter reads as a call (Qwen, DeepSeek). */
TEST(test_structured_forced_call_output)
{
    api_req r;
    api_error e;
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == API_OK);
    for (int fam = 0; fam < 2; fam++) {
        events_markers mk = fam ? eventstest_deepseek() : eventstest_qwen();
        api_out o;
        api_out_init(&o, &r, &mk, 7, "m");
        api_out_set_prompt(&o, 10, 0, NULL, 0);
        const char *tq[] = {"#5000", "free ", "thought", "#5001", "#5002", "\n{\"name\": \"get\", ",
                            "\"arguments\": {\"city\": \"Oslo\"}}\n", "#5003", NULL};
        const char *td[] = {"#5000", "free ", "thought", "#5001", "#5004", "#5006", "get", "#5008",
                            "{\"city\": \"Oslo\"}", "#5007", "#5005", NULL};
        feed(&o, 0, fam ? td : tq);
        api_out_finish(&o, 0, EVENTS_FINISH_STOP);
        api_out_end(&o);
        json_t *j = json_loadb(o.out.p, o.out.len, 0, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *m = json_object_get(ch, "message");
        json_t *fn = json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "function");
        CHECKF(json_is_string(json_object_get(ch, "finish_reason")) &&
               !strcmp(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls"), "family %d", fam);
        CHECK(json_is_string(json_object_get(fn, "name")) && !strcmp(json_string_value(json_object_get(fn, "name")), "get"));
        CHECK(json_is_string(json_object_get(fn, "arguments")) &&
              !strcmp(json_string_value(json_object_get(fn, "arguments")), "{\"city\":\"Oslo\"}"));
        CHECK(json_is_string(json_object_get(m, "reasoning_content")) &&
              !strcmp(json_string_value(json_object_get(m, "reasoning_content")), "free thought"));
        json_decref(j);
        api_out_free(&o);
    }
    api_req_free(&r);
}

int main(void)
{
    RUN(test_chat_parse_basic);
    RUN(test_chat_parse_tools);
    RUN(test_chat_bad_input);
    RUN(test_tool_definition_errors);
    RUN(test_error_quoting_split_character);
    RUN(test_integer_fields_beyond_long_long);
    RUN(test_responses_parse);
    RUN(test_messages_parse);
    RUN(test_text_parts_shared);
    RUN(test_error_shapes);
    RUN(test_chat_output_nonstream);
    RUN(test_chat_output_tools_and_stream);
    RUN(test_chat_logprobs);
    RUN(test_responses_output);
    RUN(test_tool_arguments_stream_sse);
    RUN(test_dsml_outputs);
    RUN(test_structured_tool_gbnf_dsml);
    RUN(test_harmony_outputs);
    RUN(test_reasoning_effort_fields);
    RUN(test_store_bound);
    RUN(test_messages_output);
    RUN(test_nesting_limit_every_field);
    RUN(test_fields_checked_alike);
    RUN(test_utf8_out);
    RUN(test_structured_formats_parse);
    RUN(test_structured_tool_choice_parse);
    RUN(test_structured_tool_gbnf);
    RUN(test_structured_format_or_calls_gbnf);
    RUN(test_structured_tool_gbnf_harmony);
    RUN(test_structured_tool_gbnf_one_call);
    RUN(test_structured_one_call_parse);
    RUN(test_structured_tool_strict_parse);
    RUN(test_structured_forced_call_output);
    HARNESS_END();
}
