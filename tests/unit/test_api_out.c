/*
 * test_api_out: the stop-sequence matcher of api_out.c (api_stop_find over a text, api_stop
 * streaming over pieces). Text is released exactly up to the earliest match, held back only
 * while it may still start a stop sequence, and released whole at the end when nothing
 * matched; the matched sequence's index is reported. The output state machine is tested
 * through the APIs' formatters in test_api.c.
 */
#include "harness.h"

#include <stdlib.h>

#include "recipe/api.h"
#include "util/util.h"

static const char *stop_run(const char **pieces, char **stops, int n_stop, int *matched)
{
    static char out[256];
    api_stop s;
    api_stop_init(&s, stops, n_stop);
    bytebuf emit = {0};
    bytebuf_puts(&emit, "");
    bool hit = false;
    for (int i = 0; pieces[i] && !hit; i++) hit = api_stop_feed(&s, pieces[i], strlen(pieces[i]), &emit);
    if (!hit) api_stop_flush(&s, &emit);
    *matched = s.matched;
    snprintf(out, sizeof out, "%s", emit.p);
    bytebuf_free(&emit);
    api_stop_free(&s);
    return out;
}

TEST(test_stop_matcher)
{
    char *stops[] = {"STOP", "\n\n", "ab"};
    int m;
    const char *p1[] = {"hello S", "TO", "P world", NULL};
    CHECK(!strcmp(stop_run(p1, stops, 3, &m), "hello ") && m == 0);
    const char *p2[] = {"one\n", "\ntwo", NULL};
    CHECK(!strcmp(stop_run(p2, stops, 3, &m), "one") && m == 1);
    const char *p3[] = {"ST", "OX", NULL}; /* partial match that fails is released */
    CHECK(!strcmp(stop_run(p3, stops, 3, &m), "STOX") && m == -1);
    const char *p4[] = {"xx a", NULL}; /* held at the end, flushed */
    CHECK(!strcmp(stop_run(p4, stops, 3, &m), "xx a") && m == -1);
    const char *p5[] = {"zabSTOP", NULL}; /* earliest match wins */
    CHECK(!strcmp(stop_run(p5, stops, 3, &m), "z") && m == 2);
    /* hold-back: nothing that may start a stop is released early */
    api_stop s;
    bytebuf emit = {0};
    api_stop_init(&s, stops, 3);
    CHECK(!api_stop_feed(&s, "wait S", 6, &emit) && emit.len == 5 && !memcmp(emit.p, "wait ", 5));
    CHECK(!api_stop_feed(&s, "T", 1, &emit) && emit.len == 5);
    CHECK(api_stop_feed(&s, "OP", 2, &emit) && emit.len == 5);
    /* after a match nothing more is released */
    CHECK(api_stop_feed(&s, "more", 4, &emit) && emit.len == 5);
    api_stop_flush(&s, &emit);
    CHECK(emit.len == 5 && s.matched == 0);
    api_stop_free(&s);
    bytebuf_free(&emit);
    /* no stops: passthrough */
    const char *p6[] = {"a", "b", NULL};
    CHECK(!strcmp(stop_run(p6, NULL, 0, &m), "ab"));
}

/* One byte at a time, a stop of several bytes (here a UTF-8 character) is still found, and
 * the text before it is released as soon as it can no longer start the stop. */
TEST(test_stop_byte_pieces)
{
    char *stops[] = {"\xE2\x80\x94" "end"};   /* an em dash, then "end" */
    const char *text = "x\xE2\x80\x94" "en\xE2\x80\x94" "end!";
    api_stop s;
    bytebuf emit = {0};
    api_stop_init(&s, stops, 1);
    size_t n = strlen(text);
    bool hit = false;
    size_t released_at_5 = 0;
    for (size_t i = 0; i < n && !hit; i++) {
        hit = api_stop_feed(&s, text + i, 1, &emit);
        if (i == 5) released_at_5 = emit.len;
    }
    CHECK(hit && s.matched == 0);
    CHECK(emit.len == 6 && !memcmp(emit.p, "x\xE2\x80\x94" "en", 6));
    /* after "x—en" the held "—en" may still be the stop: only "x" is out */
    CHECK(released_at_5 == 1);
    api_stop_free(&s);
    bytebuf_free(&emit);
}

/* Two stops starting at the same byte: the first listed is reported. */
TEST(test_stop_same_start)
{
    char *stops[] = {"abc", "ab"};
    int m;
    const char *p[] = {"xabcd", NULL};
    CHECK(!strcmp(stop_run(p, stops, 2, &m), "x") && m == 0);
    char *stops2[] = {"ab", "abc"};
    CHECK(!strcmp(stop_run(p, stops2, 2, &m), "x") && m == 0);
}

TEST(test_stop_find)
{
    const char *stops[] = {"<end>", "##"};
    size_t cut = 99, safe = 99;
    /* earliest start among all stops */
    CHECK(api_stop_find(stops, 2, "a##b<end>", 9, 0, &cut, &safe) && cut == 1);
    CHECK(api_stop_find(stops, 2, "ab<end>c##", 10, 0, &cut, &safe) && cut == 2);
    /* `from` skips matches that start before it */
    CHECK(api_stop_find(stops, 2, "##x<end>", 8, 1, &cut, &safe) && cut == 3);
    /* no match: safe is len minus the longest tail that starts a stop */
    CHECK(!api_stop_find(stops, 2, "text<en", 7, 0, &cut, &safe) && safe == 4);
    CHECK(!api_stop_find(stops, 2, "text#", 5, 0, &cut, &safe) && safe == 4);
    CHECK(!api_stop_find(stops, 2, "text", 4, 0, &cut, &safe) && safe == 4);
    /* a whole stop at the tail is a match, not a hold */
    CHECK(api_stop_find(stops, 2, "t<end>", 6, 0, &cut, &safe) && cut == 1);
    /* text shorter than every stop: all of it may start one */
    CHECK(!api_stop_find(stops, 2, "<", 1, 0, &cut, &safe) && safe == 0);
}

int main(void)
{
    RUN(test_stop_matcher);
    RUN(test_stop_byte_pieces);
    RUN(test_stop_same_start);
    RUN(test_stop_find);
    HARNESS_END();
}
