/*
 * test_events: the output splitter on hand-written token sequences. Token ids below 1000 are
 * "ordinary" tokens carrying the given text; the marker ids are the ones in the markers.
 * Events are recorded into a log string: T:text R:reasoning S0:name A0:args E0 F:reason,
 * consecutive deltas of one kind merged (argument fragments too), so that the tests do not
 * depend on how text was split across tokens. The recorder also checks what a streaming
 * client relies on: a call's argument fragments concatenate to its TOOL_END arguments, which
 * are valid JSON (bad_args counts violations; every run() checks it is 0).
 */
#include "harness.h"

#include <stdlib.h>

#include "eventstest.h"
#include "recipe/conv.h"
#include "recipe/events.h"
#include "util/jsonfmt.h"
#include "util/util.h"

typedef struct {
    bytebuf log;
    int last_kind;
    char ids[8][32];
    bytebuf args;     /* fragments of the current call, concatenated */
    int n_frags[8];       /* TOOL_ARGS fragments per call */
    int bad_args;         /* calls whose fragments did not add up to valid final arguments */
} rec;

static void rec_cb(void *ud, const events_event *e)
{
    rec *r = ud;
    char tmp[128];
    switch (e->kind) {
    case EVENTS_TEXT:
    case EVENTS_REASONING:
        if (r->last_kind != (int)e->kind) {
            if (r->log.len) bytebuf_putc(&r->log, '|');
            bytebuf_puts(&r->log, e->kind == EVENTS_TEXT ? "T:" : "R:");
        }
        bytebuf_append(&r->log, e->text, e->len);
        break;
    case EVENTS_TOOL_START:
        snprintf(tmp, sizeof tmp, "%sS%d:%s", r->log.len ? "|" : "", e->tool_index, e->tool_name);
        bytebuf_puts(&r->log, tmp);
        if (e->tool_index < 8) snprintf(r->ids[e->tool_index], 32, "%s", e->tool_id);
        break;
    case EVENTS_TOOL_ARGS:
        if (r->last_kind != (int)e->kind) {
            snprintf(tmp, sizeof tmp, "|A%d:", e->tool_index);
            bytebuf_puts(&r->log, tmp);
        }
        bytebuf_append(&r->log, e->text, e->len);
        bytebuf_append(&r->args, e->text, e->len);
        if (e->len == 0) r->bad_args++;
        if (e->tool_index < 8) r->n_frags[e->tool_index]++;
        break;
    case EVENTS_TOOL_END:
        snprintf(tmp, sizeof tmp, "|E%d", e->tool_index);
        bytebuf_puts(&r->log, tmp);
        if (e->len != r->args.len || memcmp(e->text, r->args.p ? r->args.p : "", e->len) || !jsonfmt_valid(e->text, e->len))
            r->bad_args++;
        r->args.len = 0;
        break;
    case EVENTS_FINISH:
        snprintf(tmp, sizeof tmp, "%sF:%s", r->log.len ? "|" : "",
                 e->finish == EVENTS_FINISH_STOP ? "stop" : e->finish == EVENTS_FINISH_LENGTH ? "length" : "tool_calls");
        bytebuf_puts(&r->log, tmp);
        break;
    }
    r->last_kind = (int)e->kind;
}

/* Feeds a NULL-terminated list of pieces; a piece "#N" is marker token N (text given after
 * a colon, e.g. "#5000:<think>"), anything else is an ordinary token with that text. */
static char *run(const events_markers *m, events_finish_reason why, const char *const *pieces, rec *keep)
{
    rec r = { .last_kind = -1 };
    events *ev = events_new(m, 42, rec_cb, &r);
    for (int i = 0; pieces[i]; i++) {
        const char *p = pieces[i];
        if (p[0] == '#') {
            char *end;
            long id = strtol(p + 1, &end, 10);
            const char *t = *end == ':' ? end + 1 : "";
            events_feed(ev, (int32_t)id, t, strlen(t));
        } else {
            events_feed(ev, 100 + i, p, strlen(p));
        }
    }
    events_finish(ev, why);
    events_free(ev);
    CHECKF(r.bad_args == 0, "argument fragments do not add up to the final arguments: %s", r.log.p ? r.log.p : "");
    bytebuf_free(&r.args);
    if (keep) *keep = r;
    char *s = strdup(r.log.p ? r.log.p : "");
    if (!keep) bytebuf_free(&r.log);
    return s;
}

#define EXPECT(got, want)                                               \
    do {                                                                \
        char *g_ = (got);                                               \
        CHECKF(!strcmp(g_, (want)), "\n   got  %s\n   want %s", g_, (want)); \
        free(g_);                                                       \
    } while (0)

TEST(test_plain_text)
{
    events_markers m = eventstest_qwen();
    const char *p[] = { "Hel", "lo", " world", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:Hello world|F:stop");
    const char *q[] = { "a", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, q, NULL), "T:a|F:length");
}

TEST(test_reasoning_then_answer)
{
    events_markers m = eventstest_qwen();
    const char *p[] = { "#5000:<think>", "\n", "Let me", " think", ".\n\n", "Done", "\n", "#5001:</think>", "\n\n", "The", " answer", "\n", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "R:Let me think.\n\nDone|T:The answer|F:stop");
}

TEST(test_reasoning_opened_by_prompt)
{
    events_markers m = eventstest_qwen();
    m.starts_in_reasoning = true;
    const char *p[] = { "hmm", "#5001:</think>", "ok", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "R:hmm|T:ok|F:stop");
    /* cut off while thinking: the reasoning stays reasoning */
    const char *q[] = { "hmm", " more", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, q, NULL), "R:hmm more|F:length");
}

TEST(test_markers_spelled_in_text_are_text)
{
    events_markers m = eventstest_qwen();
    const char *p[] = { "Use ", "<", "think", ">", " and ", "<tool_call>", "{\"name\": \"x\", \"arguments\": {}}", "</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL),
           "T:Use <think> and <tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>|F:stop");
    /* the think-end spelled inside reasoning does not end it */
    const char *q[] = { "#5000:<think>", "a ", "</think>", " b", "#5001:</think>", "c", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "R:a </think> b|T:c|F:stop");
}

TEST(test_qwen_several_tool_calls)
{
    events_markers m = eventstest_qwen();
    rec r;
    const char *p[] = { "#5000:<think>", "\nneed weather\n", "#5001:</think>", "\n\n", "Checking.", "\n",
                        "#5002:<tool_call>", "\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": ", "\"Paris\", \"unit\": \"c\"}}\n", "#5003:</tool_call>",
                        "\n", "#5002:<tool_call>", "\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n", "#5003:</tool_call>", NULL };
    char *s = run(&m, EVENTS_FINISH_STOP, p, &r);
    EXPECT(s, "R:need weather|T:Checking.|S0:get_weather|A0:{\"city\":\"Paris\",\"unit\":\"c\"}|E0"
              "|S1:get_time|A1:{\"tz\":\"CET\"}|E1|F:tool_calls");
    CHECK(!strncmp(r.ids[0], "call_", 5) && strlen(r.ids[0]) == 29);
    CHECK(strcmp(r.ids[0], r.ids[1]) != 0);
    bytebuf_free(&r.log);
}

TEST(test_qwen_arguments_as_string_and_missing)
{
    events_markers m = eventstest_qwen();
    const char *p[] = { "#5002:<tool_call>", "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, 2.50]}\"}", "#5003:</tool_call>",
                        "#5002:<tool_call>", "{\"name\": \"g\"}", "#5003:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "S0:f|A0:{\"a\":[1,2.5]}|E0|S1:g|A1:{}|E1|F:tool_calls");
}

TEST(test_qwen_malformed_call_is_text)
{
    events_markers m = eventstest_qwen();
    /* the head never came (no string name): text */
    const char *p[] = { "ok ", "#5002:<tool_call>", "{\"name\": 5, \"arguments\": {}}", "#5003:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL),
           "T:ok <tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>|F:stop");
    /* the head came, so the call was announced and stays a call: arguments that go bad are
     * closed where they were still valid */
    const char *p2[] = { "ok ", "#5002:<tool_call>", "{\"name\": \"f\", \"arguments\": {oops}}", "#5003:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p2, NULL), "T:ok|S0:f|A0:{}|E0|F:tool_calls");
    const char *p3[] = { "#5002:<tool_call>", "{\"name\": \"f\", \"arguments\": {\"a\": [1, \"x", "y\", oops", "#5003:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p3, NULL), "S0:f|A0:{\"a\":[1,\"xy\"]}|E0|F:tool_calls");
    /* unterminated but complete JSON at the limit: still a call */
    const char *q[] = { "#5002:<tool_call>", "{\"name\": \"f\", \"arguments\": {\"x\": 1}}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, q, NULL), "S0:f|A0:{\"x\":1}|E0|F:length");
    /* unterminated and cut before the head was complete: text */
    const char *r2[] = { "#5002:<tool_call>", "{\"name\": \"f\", \"argu", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r2, NULL), "T:<tool_call>{\"name\": \"f\", \"argu|F:length");
    /* cut inside the arguments: closed after the last complete value or inside the string */
    const char *r3[] = { "#5002:<tool_call>", "{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r3, NULL), "S0:f|A0:{\"a\":1}|E0|F:length");
    const char *r4[] = { "#5002:<tool_call>", "{\"name\": \"f\", \"arguments\": {\"a\": {\"b\": \"he", "llo\\", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r4, NULL), "S0:f|A0:{\"a\":{\"b\":\"hello\"}}|E0|F:length");
}

TEST(test_text_split_across_deltas_keeps_inner_blanks)
{
    events_markers m = eventstest_qwen();
    const char *p[] = { "\n", " a", " ", "\n", "b", " ", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:a \nb|F:stop");
    m.trim = false;
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:\n a \nb |F:stop");
}

TEST(test_deepseek_tool_calls)
{
    events_markers m = eventstest_deepseek();
    const char *p[] = { "Sure", "#5004:<｜tool▁calls▁begin｜>", "#5006:<｜tool▁call▁begin｜>", "get_", "weather", "#5008:<｜tool▁sep｜>",
                        "{\"city\": \"Paris\"}", "#5007:<｜tool▁call▁end｜>", "#5006:<｜tool▁call▁begin｜>", "f", "#5008:<｜tool▁sep｜>",
                        "```json\n{\"a\":true}\n```", "#5007:<｜tool▁call▁end｜>", "#5005:<｜tool▁calls▁end｜>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:Sure|S0:get_weather|A0:{\"city\":\"Paris\"}|E0|S1:f|A1:{\"a\":true}|E1|F:tool_calls");
    /* R1 form */
    const char *q[] = { "#5004:", "#5006:", "function", "#5008:", "get_time\n```json\n{\"tz\": \"UTC\"}\n```", "#5007:", "#5005:", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "S0:get_time|A0:{\"tz\":\"UTC\"}|E0|F:tool_calls");
    /* malformed arguments */
    const char *r2[] = { "#5004:[B]", "#5006:[b]", "f", "#5008:[s]", "not json", "#5007:[e]", "#5005:[E]", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r2, NULL), "T:[b]f[s]not json[e]|F:stop");
    /* the tool-call token spellings as text are text */
    const char *r3[] = { "<｜tool▁calls▁begin｜>", "x", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r3, NULL), "T:<｜tool▁calls▁begin｜>x|F:stop");
}

TEST(test_llama3_json_tool_call)
{
    events_markers m = eventstest_llama3();
    const char *p[] = { "{\"name\": \"get_weather\", ", "\"parameters\": {\"city\": \"Paris\"}", "}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "S0:get_weather|A0:{\"city\":\"Paris\"}|E0|F:tool_calls");
    const char *q[] = { "#5009:<|python_tag|>", "{\"name\": \"f\", \"parameters\": {}}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "S0:f|A0:{}|E0|F:tool_calls");
    /* JSON that is not a call is text, and so is an answer that does not start with '{' */
    const char *r2[] = { "{\"a\": ", "1}", " ok", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r2, NULL), "T:{\"a\": 1} ok|F:stop");
    const char *r3[] = { "Hi {\"name\": \"f\", \"parameters\": {}}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r3, NULL), "T:Hi {\"name\": \"f\", \"parameters\": {}}|F:stop");
    /* without tools offered, JSON answers are text */
    m.tools_enabled = false;
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}|F:stop");
    /* cut off JSON: text */
    m.tools_enabled = true;
    const char *r4[] = { "{\"name\": \"f\", ", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r4, NULL), "T:{\"name\": \"f\",|F:length");
}

/* Long arguments fed in small pieces (cut anywhere: inside escapes, surrogate pairs, UTF-8
 * characters, numbers, literals) stream as many fragments that add up to exactly the compact
 * arguments, each fragment whole UTF-8; in all three tool-call formats. */
static const char long_args[] =
    "{ \"path\": \"/tmp/caf\xc3\xa9 \\u00e9 \\ud83d\\ude00 \xf0\x9f\x98\x80.txt\", \"lines\": [1, -2.50, 3e2, true, false, null],\n"
    "  \"content\": \"line one\\nline \\\"two\\\"\\ttabbed \\\\ back\\/slash\", \"nested\": {\"a\": {\"b\": [[], {}, [\"x\"]]}},\n"
    "  \"big\": 12345678901234567890, \"small\": 0.000001 }";

static bool utf8_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

typedef struct {
    int n_frags;
    bool frag_utf8;
    bytebuf args, end;
} frag_rec;

static void frag_cb(void *ud, const events_event *e)
{
    frag_rec *f = ud;
    if (e->kind == EVENTS_TOOL_ARGS) {
        f->n_frags++;
        if (!utf8_ok(e->text, e->len)) f->frag_utf8 = false;
        bytebuf_append(&f->args, e->text, e->len);
    } else if (e->kind == EVENTS_TOOL_END) {
        bytebuf_append(&f->end, e->text, e->len);
    }
}

/* Feeds head + long_args + tail in pieces of `step` bytes between the markers (DeepSeek:
 * the name and the separator first). */
static void stream_long(const events_markers *m, int32_t open, const char *ds_name, const char *head, const char *tail,
                        int32_t close, size_t step, const char *want)
{
    frag_rec f = { .frag_utf8 = true };
    events *ev = events_new(m, 3, frag_cb, &f);
    if (open >= 0) events_feed(ev, open, "", 0);
    if (ds_name) {
        events_feed(ev, 1, ds_name, strlen(ds_name));
        events_feed(ev, SEP, "", 0);
    }
    bytebuf all = { 0 };
    bytebuf_puts(&all, head);
    bytebuf_puts(&all, long_args);
    bytebuf_puts(&all, tail);
    for (size_t i = 0; i < all.len; i += step) events_feed(ev, 1, all.p + i, TM_MIN(step, all.len - i));
    if (close >= 0) events_feed(ev, close, "", 0);
    events_finish(ev, EVENTS_FINISH_STOP);
    CHECKF(f.n_frags > 3, "step %zu: %d fragments", step, f.n_frags);
    CHECK(f.frag_utf8);
    CHECKF(f.args.p && !strcmp(f.args.p, want), "step %zu:\n   got  %s\n   want %s", step, f.args.p ? f.args.p : "", want);
    CHECK(f.end.p && !strcmp(f.end.p, want));
    events_free(ev);
    bytebuf_free(&all);
    bytebuf_free(&f.args);
    bytebuf_free(&f.end);
}

TEST(test_tool_arguments_stream)
{
    bytebuf want = { 0 };
    CHECK(jsonfmt_write(&want, long_args, strlen(long_args), JSONFMT_COMPACT, 0));
    events_markers q = eventstest_qwen(), d = eventstest_deepseek(), l = eventstest_llama3();
    for (size_t step = 1; step <= 9; step++) {
        stream_long(&q, TC, NULL, "\n{\"name\": \"write\", \"arguments\": ", "}\n", UNTC, step, want.p);
        stream_long(&d, CALL_B, "write", "", "", CALL_E, step, want.p);
        stream_long(&l, -1, NULL, "{\"name\": \"write\", \"parameters\": ", "}", -1, step, want.p);
    }
    /* DeepSeek with its name and a fence, R1 form */
    frag_rec f = { .frag_utf8 = true };
    events *ev = events_new(&d, 3, frag_cb, &f);
    events_feed(ev, CALL_B, "", 0);
    events_feed(ev, 1, "function", 8);
    events_feed(ev, SEP, "", 0);
    const char *pre = "write\n```json\n";
    for (const char *p = pre; *p; p++) events_feed(ev, 1, p, 1);
    for (size_t i = 0, n = strlen(long_args); i < n; i += 4) events_feed(ev, 1, long_args + i, TM_MIN(4, n - i));
    events_feed(ev, 1, "\n```", 4);
    events_feed(ev, CALL_E, "", 0);
    events_finish(ev, EVENTS_FINISH_STOP);
    CHECK(f.n_frags > 3 && f.args.p && !strcmp(f.args.p, want.p) && f.end.p && !strcmp(f.end.p, want.p));
    events_free(ev);
    bytebuf_free(&f.args);
    bytebuf_free(&f.end);
    bytebuf_free(&want);
}

TEST(test_reset_reuses)
{
    events_markers m = eventstest_qwen();
    rec r = { .last_kind = -1 };
    events *ev = events_new(&m, 1, rec_cb, &r);
    events_feed(ev, 1, "x", 1);
    events_finish(ev, EVENTS_FINISH_STOP);
    events_feed(ev, 1, "ignored", 7);
    events_reset(ev, &m, 1);
    r.last_kind = -1;
    events_feed(ev, 1, "y", 1);
    events_finish(ev, EVENTS_FINISH_STOP);
    CHECKF(!strcmp(r.log.p, "T:x|F:stop|T:y|F:stop"), "%s", r.log.p);
    events_free(ev);
    bytebuf_free(&r.log);
}

/* ---- harmony (gpt-oss) ---- */

TEST(test_harmony_analysis_then_final)
{
    events_markers m = eventstest_harmony();
    /* the prompt ended with "<|start|>assistant"; the caller stops on <|return|> */
    const char *p[] = { "#6001:<|channel|>", "analysis", "#6002:<|message|>", "Let me", " think.", "#6004:<|end|>",
                        "#6000:<|start|>", "assistant", "#6001:<|channel|>", "final", "#6002:<|message|>", "The", " answer", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "R:Let me think.|T:The answer|F:stop");
    /* <|return|> fed anyway; a commentary message without recipient is a preamble (text) */
    const char *q[] = { "#6001:<|channel|>", "comment", "ary", "#6002:<|message|>", "Looking", " it up.", "#6004:<|end|>",
                        "#6000:<|start|>", "assistant", "#6001:<|channel|>", "final", "#6002:<|message|>", " Done", "#6006:<|return|>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:Looking it up.Done|F:stop");
    /* a stray "<|channel|>commentary to=assistant" before the real channel (gpt-oss-20b) */
    const char *r[] = { "#6001:<|channel|>", "commentary to=assistant", "#6001:<|channel|>", "analysis", "#6002:<|message|>", "hm",
                        "#6004:<|end|>", "#6000:<|start|>", "assistant", "#6001:<|channel|>", "commentary", " to=assistant",
                        "#6001:<|channel|>", "final", "#6002:<|message|>", "ok", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r, NULL), "R:hm|T:ok|F:stop");
}

TEST(test_harmony_tool_calls)
{
    events_markers m = eventstest_harmony();
    rec r;
    /* recipient in the role part, <|constrain|>json, arguments split across tokens */
    const char *p[] = { "#6001:<|channel|>", "analysis", "#6002:<|message|>", "need weather", "#6004:<|end|>",
                        "#6000:<|start|>", "assistant", " to", "=functions", ".get", "_weather", "#6001:<|channel|>", "comment", "ary", " ",
                        "#6003:<|constrain|>", "json", "#6002:<|message|>", "{\"city\"", ": \"Par", "is\", \"unit\": \"c\"}", NULL };
    char *s = run(&m, EVENTS_FINISH_STOP, p, &r);
    EXPECT(s, "R:need weather|S0:get_weather|A0:{\"city\":\"Paris\",\"unit\":\"c\"}|E0|F:tool_calls");
    CHECK(r.n_frags[0] >= 2);  /* streamed while generated */
    CHECK(!strncmp(r.ids[0], "call_", 5));
    bytebuf_free(&r.log);
    /* recipient after the channel, <|call|> fed, empty arguments */
    const char *q[] = { "#6001:<|channel|>", "commentary to=functions.get_time json", "#6002:<|message|>", "{}", "#6005:<|call|>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "S0:get_time|A0:{}|E0|F:tool_calls");
    /* a name without the functions. namespace is kept whole */
    const char *w[] = { "#6001:<|channel|>", "commentary to=browser.search", "#6002:<|message|>", "{\"q\": 1}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, w, NULL), "S0:browser.search|A0:{\"q\":1}|E0|F:tool_calls");
}

TEST(test_harmony_truncated)
{
    events_markers m = eventstest_harmony();
    const char *h[] = { "#6001:<|channel|>", "analy", NULL };  /* cut inside the header */
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, h, NULL), "F:length");
    const char *a[] = { "#6001:<|channel|>", "analysis", "#6002:<|message|>", "half a", " thought ", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, a, NULL), "R:half a thought|F:length");
    /* a call cut inside its arguments: what was sent is closed into valid JSON */
    const char *c[] = { "#6001:<|channel|>", "commentary to=functions.get_weather", "#6002:<|message|>", "{\"city\": \"Par", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, c, NULL), "S0:get_weather|A0:{\"city\":\"Par\"}|E0|F:length");
    /* cut before the body */
    const char *d[] = { "#6001:<|channel|>", "commentary to=functions.get_weather", "#6002:<|message|>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, d, NULL), "T:<|channel|>commentary to=functions.get_weather<|message|>|F:length");
}

TEST(test_harmony_text_is_text)
{
    events_markers m = eventstest_harmony();
    /* marker spellings from ordinary tokens inside a final message are text */
    const char *p[] = { "#6001:<|channel|>", "final", "#6002:<|message|>", "say ", "<|channel|>", "analysis", "<|message|>", " or ",
                        "<|call|>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:say <|channel|>analysis<|message|> or <|call|>|F:stop");
    /* output with no harmony structure at all (a base model): the text is kept */
    const char *q[] = { "Hello", " world", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:Hello world|F:stop");
    /* a header that runs on is not one */
    const char *r[] = { "#6001:<|channel|>",
        "final xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", " tail", NULL };
    char *s = run(&m, EVENTS_FINISH_STOP, r, NULL);
    CHECKF(!strncmp(s, "T:<|channel|>final xxx", 22) && strstr(s, "x tail|F:stop"), "%s", s);
    free(s);
    /* malformed arguments: the whole message is text, nothing is dropped */
    const char *t[] = { "#6001:<|channel|>", "commentary to=functions.f", "#6002:<|message|>", "not json", "#6005:<|call|>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t, NULL), "T:<|channel|>commentary to=functions.f<|message|>not json|F:stop");
    /* text between messages is answer text */
    const char *u[] = { "#6001:<|channel|>", "final", "#6002:<|message|>", "A", "#6004:<|end|>", "\n", "B", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, u, NULL), "T:AB|F:stop");
}

TEST(test_harmony_forced_call)
{
    /* the prompt ended with the call's header: the output starts with the arguments */
    events_markers m = eventstest_harmony();
    m.h_forced = "get_weather";
    const char *p[] = { "{\"city\"", ": \"Rome\"}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "S0:get_weather|A0:{\"city\":\"Rome\"}|E0|F:tool_calls");
    const char *q[] = { "{\"city\"", ": \"Ro", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, q, NULL), "S0:get_weather|A0:{\"city\":\"Ro\"}|E0|F:length");
}

/* With no tools offered, what looks like a call is text in every family. */
TEST(test_calls_without_tools_are_text)
{
    events_markers m = eventstest_qwen();
    m.tools_enabled = false;
    const char *p[] = { "#5002:<tool_call>", "{\"name\": \"f\", \"arguments\": {}}", "#5003:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>|F:stop");
    m = eventstest_deepseek();
    m.tools_enabled = false;
    const char *d[] = { "#5004:<calls>", "#5006:<call>", "f", "#5008:<sep>", "{}", "#5007:</call>", "#5005:</calls>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, d, NULL), "T:<calls><call>f<sep>{}</call></calls>|F:stop");
    m = eventstest_harmony();
    m.tools_enabled = false;
    const char *h[] = { "#6001:<|channel|>", "commentary to=functions.f", "#6002:<|message|>", "{}", "#6005:<|call|>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, h, NULL), "T:{}|F:stop");
}

/* The server ends the first message with <|end|> (a reasoning budget): text the model wrote
 * there without a header is the analysis, and the answer after it is the text. */
TEST(test_harmony_server_ended_analysis)
{
    events_markers m = eventstest_harmony();
    m.h_analysis = true;
    const char *p[] = { "some", " musing", "#6004:<|end|>", "{\"unit\": \"c\"}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "R:some musing|T:{\"unit\": \"c\"}|F:stop");
    /* longer than any header: still reasoning up to the <|end|> */
    char big[400];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *q[] = { big, " more", "#6004:<|end|>", "{}", NULL };
    char *s = run(&m, EVENTS_FINISH_STOP, q, NULL);
    CHECKF(!strncmp(s, "R:xxx", 5) && strstr(s, "x more|T:{}|F:stop"), "%s", s);
    free(s);
    /* a real header is read as always; a later headerless message is text */
    const char *r[] = { "#6001:<|channel|>", "analysis", "#6002:<|message|>", "hm", "#6004:<|end|>", "x", "#6004:<|end|>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r, NULL), "R:hm|T:x|F:stop");
    /* without the flag, as before: text */
    m.h_analysis = false;
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:some musing{\"unit\": \"c\"}|F:stop");
}

/* Random mixes of markers, header words and argument pieces: the splitter never loses its
 * footing (run() checks every call's fragments add up to valid arguments; always a finish),
 * and the end markers never show up as text. */
TEST(test_harmony_random_sequences)
{
    events_markers m = eventstest_harmony();
    static const char *const pieces[] = {
        "#6000:<|start|>", "#6001:<|channel|>", "#6002:<|message|>", "#6003:<|constrain|>", "#6004:<|end|>",
        "#6005:<|call|>", "#6006:<|return|>", "assistant", "analysis", "final", "commentary", " to=functions.f",
        "to=", " json", "{", "}", "\"a\"", ":", "1", ",", "[", "]", "\"", "\\", " ", "\n", "word", "\xc3\xa9",
    };
    uint64_t x = 12345;
    const char *seq[41];
    for (int run_i = 0; run_i < 3000; run_i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int n = 1 + (int)((x >> 33) % 40);
        for (int k = 0; k < n; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            seq[k] = pieces[(x >> 33) % (sizeof pieces / sizeof pieces[0])];
        }
        seq[n] = NULL;
        char *got = run(&m, (run_i & 1) ? EVENTS_FINISH_LENGTH : EVENTS_FINISH_STOP, seq, NULL);
        CHECKF(strstr(got, "F:") && !strstr(got, "<|end|>") && !strstr(got, "<|call|>") && !strstr(got, "<|return|>"), "%s", got);
        free(got);
    }
}


/* Mistral, llama.cpp's test strings (tests/test-chat.cpp) first */
TEST(test_mistral_tool_calls)
{
    events_markers m = eventstest_mistral();
    rec r;
    const char *p[] = { "#7000:[TOOL_CALLS]", "special_function", "#7001:[ARGS]", "{\"arg1\":1}", NULL };
    char *s = run(&m, EVENTS_FINISH_STOP, p, &r);
    EXPECT(s, "S0:special_function|A0:{\"arg1\":1}|E0|F:tool_calls");
    CHECK(strlen(r.ids[0]) == 9);
    bytebuf_free(&r.log);
    /* parallel calls, [CALL_ID] read and ignored, text before; split across tokens */
    const char *q[] = { "Hello, world!\nWhat's up?", "#7000:[TOOL_CALLS]", "special_", "function", "#7002:[CALL_ID]", "000000001",
                        "#7001:[ARGS]", "{\"arg1\"", ": 1}", "#7000:[TOOL_CALLS]", "special_function_with_opt", "#7002:[CALL_ID]",
                        "000000002", "#7001:[ARGS]", "{\"arg1\": 1, ", "\"arg2\": 2}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:Hello, world!\nWhat's up?|S0:special_function|A0:{\"arg1\":1}|E0"
                                               "|S1:special_function_with_opt|A1:{\"arg1\":1,\"arg2\":2}|E1|F:tool_calls");
    /* the older form: a JSON array of calls, decided when it is complete */
    const char *o[] = { "#7000:[TOOL_CALLS]", "[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}, ", "\"id\": \"123456789\"}",
                        ", {\"name\": \"g\", \"arguments\": {}}]", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, o, NULL), "S0:special_function|A0:{\"arg1\":1}|E0|S1:g|A1:{}|E1|F:tool_calls");
    /* [THINK] reasoning; a marker spelled inside it is text */
    const char *t[] = { "#7003:[THINK]", "Let me think about [TOOL_CALLS]special_function[ARGS]{\"arg1\":1} and more", "#7004:[/THINK]",
                        "#7000:[TOOL_CALLS]", "special_function", "#7001:[ARGS]", "{\"arg1\": 1}", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t, NULL), "R:Let me think about [TOOL_CALLS]special_function[ARGS]{\"arg1\":1} and more"
                                               "|S0:special_function|A0:{\"arg1\":1}|E0|F:tool_calls");
    /* text after the arguments' value is answer text */
    const char *a[] = { "#7000:[TOOL_CALLS]", "f", "#7001:[ARGS]", "{\"x\": \"y\"} done", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, a, NULL), "S0:f|A0:{\"x\":\"y\"}|E0|T:done|F:tool_calls");
}

TEST(test_mistral_malformed_is_text)
{
    events_markers m = eventstest_mistral();
    /* no [ARGS]: text, marker text included */
    const char *p[] = { "ok ", "#7000:[TOOL_CALLS]", "f", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:ok [TOOL_CALLS]f|F:stop");
    /* arguments that are not an object */
    const char *q[] = { "#7000:[TOOL_CALLS]", "f", "#7001:[ARGS]", "nope", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:[TOOL_CALLS]f[ARGS]nope|F:stop");
    /* an older-form array with a bad element, and one cut by the limit */
    const char *r1[] = { "#7000:[TOOL_CALLS]", "[{\"name\": 1}]", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r1, NULL), "T:[TOOL_CALLS][{\"name\": 1}]|F:stop");
    const char *r2[] = { "#7000:[TOOL_CALLS]", "[{\"name\": \"f\", \"argu", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r2, NULL), "T:[TOOL_CALLS][{\"name\": \"f\", \"argu|F:length");
    /* committed then cut: closed where it was valid */
    const char *r3[] = { "#7000:[TOOL_CALLS]", "f", "#7001:[ARGS]", "{\"a\": 1, \"b\": \"x", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r3, NULL), "S0:f|A0:{\"a\":1,\"b\":\"x\"}|E0|F:length");
    /* without tools offered the marker is nothing special */
    m.tools_enabled = false;
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:ok [TOOL_CALLS]f|F:stop");
}

/* GLM, llama.cpp's test strings first: GLM-4.6's newlines and GLM-4.7's tight form */
TEST(test_glm_tool_calls)
{
    events_markers m = eventstest_glm();
    rec r;
    const char *p[] = { "#7100:<tool_call>", "special_function\n", "#7102:<arg_key>", "arg1", "#7103:</arg_key>", "\n", "#7104:<arg_value>",
                        "1", "#7105:</arg_value>", "\n", "#7101:</tool_call>", NULL };
    char *s = run(&m, EVENTS_FINISH_STOP, p, &r);
    EXPECT(s, "S0:special_function|A0:{\"arg1\":1}|E0|F:tool_calls");
    CHECK(!strncmp(r.ids[0], "call_", 5));
    bytebuf_free(&r.log);
    const char *q[] = { "#5000:<think>", "I'm\nthinking", "#5001:</think>", "#7100:<tool_call>", "special_function", "#7102:<arg_key>",
                        "arg1", "#7103:</arg_key>", "#7104:<arg_value>", "1", "#7105:</arg_value>", "#7101:</tool_call>", "#7100:<tool_call>",
                        "special_function_with_opt", "#7102:<arg_key>", "arg1", "#7103:</arg_key>", "#7104:<arg_value>", "1",
                        "#7105:</arg_value>", "#7102:<arg_key>", "arg2", "#7103:</arg_key>", "#7104:<arg_value>", "2", "#7105:</arg_value>",
                        "#7101:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "R:I'm\nthinking|S0:special_function|A0:{\"arg1\":1}|E0"
                                               "|S1:special_function_with_opt|A1:{\"arg1\":1,\"arg2\":2}|E1|F:tool_calls");
    /* values: JSON when they parse, else strings (raw); no arguments: {} */
    const char *v[] = { "#7100:<tool_call>", "f", "#7102:<arg_key>", "city", "#7103:</arg_key>", "#7104:<arg_value>", "New ", "York",
                        "#7105:</arg_value>", "#7102:<arg_key>", "opts", "#7103:</arg_key>", "#7104:<arg_value>", "{\"a\": [1, true]}",
                        "#7105:</arg_value>", "#7101:</tool_call>", "#7100:<tool_call>", "g", "#7101:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, v, NULL), "S0:f|A0:{\"city\":\"New York\",\"opts\":{\"a\":[1,true]}}|E0|S1:g|A1:{}|E1|F:tool_calls");
    /* the tool's schema types an argument string: its text stays a string */
    conv c;
    conv_init(&c);
    conv_add_tool(&c, "f", NULL, "{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"}}}");
    m.tools = &c;
    const char *t[] = { "#7100:<tool_call>", "f", "#7102:<arg_key>", "zip", "#7103:</arg_key>", "#7104:<arg_value>", "01234",
                        "#7105:</arg_value>", "#7102:<arg_key>", "n", "#7103:</arg_key>", "#7104:<arg_value>", "7", "#7105:</arg_value>",
                        "#7101:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t, NULL), "S0:f|A0:{\"zip\":\"01234\",\"n\":7}|E0|F:tool_calls");
    const char *t2[] = { "#7100:<tool_call>", "f", "#7102:<arg_key>", "zip", "#7103:</arg_key>", "#7104:<arg_value>", "true",
                         "#7105:</arg_value>", "#7101:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t2, NULL), "S0:f|A0:{\"zip\":\"true\"}|E0|F:tool_calls");
    conv_free(&c);
}

TEST(test_glm_malformed_is_text)
{
    events_markers m = eventstest_glm();
    /* no name, text where a marker belongs, cut inside a key: text */
    const char *p[] = { "ok ", "#7100:<tool_call>", "#7102:<arg_key>", "a", "#7103:</arg_key>", "#7101:</tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:ok <tool_call><arg_key>a</arg_key></tool_call>|F:stop");
    const char *q[] = { "#7100:<tool_call>", "f", "#7102:<arg_key>", "a", "#7103:</arg_key>", "junk", "#7104:<arg_value>", "1", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:<tool_call>f<arg_key>a</arg_key>junk<arg_value>1|F:stop");
    const char *r1[] = { "#7100:<tool_call>", "f", "#7102:<arg_key>", "a", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r1, NULL), "T:<tool_call>f<arg_key>a|F:length");
    /* committed (one argument sent), then cut: the call is closed */
    const char *r2[] = { "#7100:<tool_call>", "f", "#7102:<arg_key>", "a", "#7103:</arg_key>", "#7104:<arg_value>", "1", "#7105:</arg_value>",
                         "#7102:<arg_key>", "b", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r2, NULL), "S0:f|A0:{\"a\":1}|E0|F:length");
    /* markers spelled in text are text */
    const char *t[] = { "<tool_call>f<arg_key>a</arg_key>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t, NULL), "T:<tool_call>f<arg_key>a</arg_key>|F:stop");
}

/* Random token sequences over the Mistral and GLM markers never crash and always leave
 * valid arguments (run() checks the fragments add up). */
TEST(test_mistral_glm_random_sequences)
{
    static const char *const mi[] = { "#7000:[TOOL_CALLS]", "#7001:[ARGS]", "#7002:[CALL_ID]", "#7003:[THINK]", "#7004:[/THINK]",
                                      "f", "{", "}", "[", "]", "\"a\"", ":", ",", "1", " ", "\"", "x" };
    static const char *const gl[] = { "#7100:<tool_call>", "#7101:</tool_call>", "#7102:<arg_key>", "#7103:</arg_key>", "#7104:<arg_value>",
                                      "#7105:</arg_value>", "#5000:<think>", "#5001:</think>", "f", "a", "1", "{", "\"", " ", "\n" };
    util_rng rng;
    util_rng_seed(&rng, 7);
    for (int round = 0; round < 2000; round++) {
        bool glm = round & 1;
        events_markers m = glm ? eventstest_glm() : eventstest_mistral();
        const char *p[24];
        int n = 1 + (int)(util_rng_next(&rng) % 22);
        for (int i = 0; i < n; i++)
            p[i] = glm ? gl[util_rng_next(&rng) % TM_ARRAY_LEN(gl)] : mi[util_rng_next(&rng) % TM_ARRAY_LEN(mi)];
        p[n] = NULL;
        free(run(&m, util_rng_next(&rng) & 1 ? EVENTS_FINISH_STOP : EVENTS_FINISH_LENGTH, p, NULL));
    }
}

/* DeepSeek V4's DSML calls, llama.cpp's test strings (test-chat.cpp) cut into tokens as V4's
 * vocabulary cuts them: only ｜DSML｜ is a token, the '<' before it ends a text piece. */
#define D "#7200:｜DSML｜"
TEST(test_dsml_tool_calls)
{
    events_markers m = eventstest_dsml();
    rec r;
    const char *p[] = { "Let me check the time", "#5001:</think>", "\n\n", "<", D, "tool", "_calls", ">\n", "<", D, "invoke",
                        " name=\"get_time\">\n", "<", D, "parameter name=\"city\" string=\"true\">", "Tokyo", "</", D,
                        "parameter>\n", "</", D, "invoke>\n", "</", D, "tool_calls>", NULL };
    m.starts_in_reasoning = true;
    char *s = run(&m, EVENTS_FINISH_STOP, p, &r);
    EXPECT(s, "R:Let me check the time|S0:get_time|A0:{\"city\":\"Tokyo\"}|E0|F:tool_calls");
    CHECK(!strncmp(r.ids[0], "call_", 5));
    bytebuf_free(&r.log);
    m.starts_in_reasoning = false;
    /* text before the block; two calls; string="false" values are JSON; no parameters: {} */
    const char *q[] = { "Let me call the function.", "\n\n<", D, "tool_calls>\n<", D, "invoke name=\"magic_int\">\n<", D,
                        "parameter name=\"ref\" string=\"false\">42</", D, "parameter>\n<", D,
                        "parameter name=\"name\" string=\"true\">foo bar</", D, "parameter>\n<", D,
                        "parameter name=\"opts\" string=\"false\">{\"a\": [1, true]}</", D, "parameter>\n</", D, "invoke>\n<", D,
                        "invoke name=\"g\">\n\n</", D, "invoke>\n</", D, "tool_calls>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:Let me call the function.|S0:magic_int|A0:{\"ref\":42,\"name\":\"foo bar\","
                                               "\"opts\":{\"a\":[1,true]}}|E0|S1:g|A1:{}|E1|F:tool_calls");
    /* a string="false" value that is not JSON stays a string; V3.2's function_calls block */
    const char *v[] = { "<", D, "function_calls>\n<", D, "invoke name=\"f\">\n<", D, "parameter name=\"x\" string=\"false\">",
                        "not json</", D, "parameter>\n</", D, "invoke>\n</", D, "function_calls>", " after", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, v, NULL), "S0:f|A0:{\"x\":\"not json\"}|E0|T:after|F:tool_calls");
    /* the block may open inside reasoning, which ends there */
    m.starts_in_reasoning = true;
    const char *w[] = { "Let me check\n\n<", D, "tool_calls>\n<", D, "invoke name=\"f\">\n</", D, "invoke>\n</", D, "tool_calls>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, w, NULL), "R:Let me check|S0:f|A0:{}|E0|F:tool_calls");
    m.starts_in_reasoning = false;
    /* a '<' not followed by ｜DSML｜ is text, held back only until the next token */
    const char *x[] = { "a <", " b<", "<", "#5000:<think>", "t", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, x, NULL), "T:a < b<<|R:t|F:stop");
    const char *y[] = { "1 <", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, y, NULL), "T:1 <|F:stop");
}

TEST(test_dsml_malformed_is_text)
{
    events_markers m = eventstest_dsml();
    /* the tags spelled by ordinary tokens are text */
    const char *p[] = { "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>|F:stop");
    /* a block that opened no call: its text (the blanks before it included); what follows
       is text again, a new section */
    const char *q[] = { "ok\n\n<", D, "tool_calls>\n<", D, "nonsense>", " more", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜nonsense>more|F:stop");
    /* committed, then cut: the call is closed where it was valid */
    const char *r1[] = { "<", D, "tool_calls>\n<", D, "invoke name=\"f\">\n<", D, "parameter name=\"a\" string=\"false\">1</", D,
                         "parameter>\n<", D, "parameter name=\"b\" string=\"true\">xy", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r1, NULL), "S0:f|A0:{\"a\":1}|E0|F:length");
    /* without tools offered the block is text */
    m.tools_enabled = false;
    const char *t[] = { "<", D, "tool_calls>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t, NULL), "T:<｜DSML｜tool_calls>|F:stop");
}

/* Random token sequences over the DSML pieces never crash and always leave valid arguments. */
TEST(test_dsml_random_sequences)
{
    static const char *const ds[] = { D, "<", "</", "tool_calls>", "invoke name=\"f\">", "parameter name=\"a\" string=\"false\">",
                                      "parameter name=\"b\" string=\"true\">", "parameter>", "invoke>", "1", "{", "\"", " ", "\n",
                                      "#5000:<think>", "#5001:</think>", "\x01" };
    util_rng rng;
    util_rng_seed(&rng, 11);
    for (int round = 0; round < 2000; round++) {
        events_markers m = eventstest_dsml();
        const char *p[32];
        int n = 1 + (int)(util_rng_next(&rng) % 30);
        for (int i = 0; i < n; i++) p[i] = ds[util_rng_next(&rng) % TM_ARRAY_LEN(ds)];
        p[n] = NULL;
        free(run(&m, util_rng_next(&rng) & 1 ? EVENTS_FINISH_STOP : EVENTS_FINISH_LENGTH, p, NULL));
    }
}
#undef D

/* Qwen3.5's XML calls, llama.cpp's test strings (test-chat.cpp, Qwen3.5-4B) cut into tokens:
 * only <tool_call> and </tool_call> are tokens, the tags are text split anywhere. */
#define TC "#7100:<tool_call>"
#define UNTC "#7101:</tool_call>"
TEST(test_xml_tool_calls)
{
    events_markers m = eventstest_xml();
    conv c;
    conv_init(&c);
    conv_add_tool(&c, "special_function", NULL, "{\"type\":\"object\",\"properties\":{\"arg1\":{\"type\":\"integer\"}}}");
    conv_add_tool(&c, "special_function_with_opt", NULL,
                  "{\"type\":\"object\",\"properties\":{\"arg1\":{\"type\":\"integer\"},\"arg2\":{\"type\":\"integer\"}}}");
    conv_add_tool(&c, "python", NULL, "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\"}}}");
    conv_add_tool(&c, "f", NULL, "{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\"},\"o\":{\"type\":\"object\"}}}");
    m.tools = &c;
    rec r;
    const char *p[] = { TC, "\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n", UNTC, NULL };
    char *s = run(&m, EVENTS_FINISH_STOP, p, &r);
    EXPECT(s, "S0:special_function|A0:{\"arg1\":1}|E0|F:tool_calls");
    CHECK(!strncmp(r.ids[0], "call_", 5));
    bytebuf_free(&r.log);
    /* reasoning first (the prompt opened it), then two calls, the tags cut mid-word */
    m.starts_in_reasoning = true;
    const char *q[] = { "I'm\nthinking\n", "#5001:</think>", "\n\n", TC, "\n<func", "tion=special_function>\n<param", "eter=arg1>\n1",
                        "\n</parameter>\n</function>\n", UNTC, "\n", TC, "\n<function=special_function_with_opt>\n",
                        "<parameter=arg1>\n1\n</parameter>\n<parameter=arg2>\n2\n</para", "meter>\n</function>\n", UNTC, NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "R:I'm\nthinking|S0:special_function|A0:{\"arg1\":1}|E0"
                                               "|S1:special_function_with_opt|A1:{\"arg1\":1,\"arg2\":2}|E1|F:tool_calls");
    m.starts_in_reasoning = false;
    /* a string parameter is its raw text (the framing newlines removed); others JSON */
    const char *py[] = { TC, "\n<function=python>\n<parameter=code>\ndef hello():\n    print(\"Hello, world!\")\n\nhello()\n</parameter>\n",
                         "</function>\n", UNTC, NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, py, NULL),
           "S0:python|A0:{\"code\":\"def hello():\\n    print(\\\"Hello, world!\\\")\\n\\nhello()\"}|E0|F:tool_calls");
    const char *t[] = { "Sure.", TC, "\n<function=f>\n<parameter=zip>\n01234\n</parameter>\n<parameter=o>\n{\"a\": [1, true]}\n</parameter>\n",
                        "<parameter=n>\nabc\n</parameter>\n</function>\n", UNTC, "\n", TC, "<function=g>\n</function>", UNTC, NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t, NULL), "T:Sure.|S0:f|A0:{\"zip\":\"01234\",\"o\":{\"a\":[1,true]},\"n\":\"abc\"}"
                                               "|E0|S1:g|A1:{}|E1|F:tool_calls");
    /* a call may end the reasoning */
    m.starts_in_reasoning = true;
    const char *u[] = { "hmm", TC, "<function=g>", "</function>", UNTC, NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, u, NULL), "R:hmm|S0:g|A0:{}|E0|F:tool_calls");
    conv_free(&c);
}

TEST(test_xml_malformed_is_text)
{
    events_markers m = eventstest_xml();
    /* no function tag, junk in its place, cut before the name ends: text */
    const char *p[] = { "ok ", TC, "\n<parameter=a>\n1\n</parameter>\n", UNTC, NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, p, NULL), "T:ok <tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>|F:stop");
    const char *q[] = { TC, "junk", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, q, NULL), "T:<tool_call>junk|F:stop");
    const char *r1[] = { TC, "<function=f", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r1, NULL), "T:<tool_call><function=f|F:length");
    /* committed (one parameter sent), then cut or junk: the call is closed as sent */
    const char *r2[] = { TC, "<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nx", NULL };
    EXPECT(run(&m, EVENTS_FINISH_LENGTH, r2, NULL), "S0:f|A0:{\"a\":1}|E0|F:length");
    const char *r3[] = { TC, "<function=f>\nnot a tag", "<parameter=a>\n1\n</parameter>", UNTC, "after", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, r3, NULL), "S0:f|A0:{}|E0|T:after|F:tool_calls");
    /* the markers spelled in text are text; without tools offered the marker is too */
    const char *t[] = { "<tool_call><function=f></function></tool_call>", NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t, NULL), "T:<tool_call><function=f></function></tool_call>|F:stop");
    m.tools_enabled = false;
    const char *t2[] = { TC, "<function=f></function>", UNTC, NULL };
    EXPECT(run(&m, EVENTS_FINISH_STOP, t2, NULL), "T:<tool_call><function=f></function></tool_call>|F:stop");
}

/* Random token sequences over the XML pieces never crash and always leave valid arguments. */
TEST(test_xml_random_sequences)
{
    static const char *const xs[] = { TC, UNTC, "<function=f>", "<function=", "</function>", "<parameter=a>", "<parameter=",
                                      "</parameter>", "</para", "1", "{", "\"", " ", "\n", ">", "#5000:<think>", "#5001:</think>" };
    util_rng rng;
    util_rng_seed(&rng, 13);
    for (int round = 0; round < 2000; round++) {
        events_markers m = eventstest_xml();
        const char *p[32];
        int n = 1 + (int)(util_rng_next(&rng) % 30);
        for (int i = 0; i < n; i++) p[i] = xs[util_rng_next(&rng) % TM_ARRAY_LEN(xs)];
        p[n] = NULL;
        free(run(&m, util_rng_next(&rng) & 1 ? EVENTS_FINISH_STOP : EVENTS_FINISH_LENGTH, p, NULL));
    }
}
#undef TC
#undef UNTC

int main(void)
{
    RUN(test_plain_text);
    RUN(test_reasoning_then_answer);
    RUN(test_reasoning_opened_by_prompt);
    RUN(test_markers_spelled_in_text_are_text);
    RUN(test_qwen_several_tool_calls);
    RUN(test_qwen_arguments_as_string_and_missing);
    RUN(test_qwen_malformed_call_is_text);
    RUN(test_text_split_across_deltas_keeps_inner_blanks);
    RUN(test_deepseek_tool_calls);
    RUN(test_llama3_json_tool_call);
    RUN(test_tool_arguments_stream);
    RUN(test_reset_reuses);
    RUN(test_harmony_analysis_then_final);
    RUN(test_harmony_tool_calls);
    RUN(test_harmony_truncated);
    RUN(test_harmony_text_is_text);
    RUN(test_harmony_random_sequences);
    RUN(test_harmony_forced_call);
    RUN(test_calls_without_tools_are_text);
    RUN(test_harmony_server_ended_analysis);
    RUN(test_mistral_tool_calls);
    RUN(test_mistral_malformed_is_text);
    RUN(test_glm_tool_calls);
    RUN(test_glm_malformed_is_text);
    RUN(test_mistral_glm_random_sequences);
    RUN(test_dsml_tool_calls);
    RUN(test_dsml_malformed_is_text);
    RUN(test_dsml_random_sequences);
    RUN(test_xml_tool_calls);
    RUN(test_xml_malformed_is_text);
    RUN(test_xml_random_sequences);
    HARNESS_END();
}
