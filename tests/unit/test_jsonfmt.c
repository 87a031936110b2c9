/*
 * test_jsonfmt: util/jsonfmt.c. Re-emission in the three layouts (compact, tojson's spaced
 * and indented forms) with numbers printed as JavaScript prints them and strings escaped as
 * JSON.stringify escapes them, invalid texts refused without touching the output; the
 * streaming re-emission (every prefix's output extends to the whole's); member lookup and
 * walking; string decoding; the recursion-free scan that bounds request bodies.
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>

#include "util/jsonfmt.h"
#include "util/unicode.h"
#include "util/util.h"

/* Tool arguments as a model writes them: escapes, surrogate pairs, raw UTF-8, every kind of
 * number and literal, nesting, spaces and a newline between tokens. */
static const char tool_args[] =
    "{ \"path\": \"/tmp/caf\xc3\xa9 \\u00e9 \\ud83d\\ude00 \xf0\x9f\x98\x80.txt\", \"lines\": [1, -2.50, 3e2, true, false, null],\n"
    "  \"content\": \"line one\\nline \\\"two\\\"\\ttabbed \\\\ back\\/slash\", \"nested\": {\"a\": {\"b\": [[], {}, [\"x\"]]}},\n"
    "  \"big\": 12345678901234567890, \"small\": 0.000001 }";

/* jsonfmt_prefix: the output for every prefix of a text is a prefix of the output for the
 * whole, MORE until the value is complete, then DONE with jsonfmt_write's output. */
TEST(test_prefix_extends)
{
    const char *texts[] = { tool_args, "[1, 2.0, \"\\ud83d\\ude00\", {\"k\": [true, null]}]", "\"\\u00e9\xc3\xa9\"", "{}", NULL };
    for (int t = 0; texts[t]; t++) {
        size_t n = strlen(texts[t]);
        bytebuf full = { 0 }, b = { 0 };
        CHECK(jsonfmt_write(&full, texts[t], n, JSONFMT_COMPACT, 0));
        for (size_t k = 0; k <= n; k++) {
            b.len = 0;
            size_t used = 0;
            jsonfmt_prefix_status st = jsonfmt_prefix(&b, texts[t], k, &used);
            CHECKF(st == (k == n ? JSONFMT_PREFIX_DONE : JSONFMT_PREFIX_MORE) || (st == JSONFMT_PREFIX_DONE && texts[t][k - 1] == '}'),
                   "text %d prefix %zu: status %d", t, k, st);
            CHECKF(b.len <= full.len && !memcmp(b.p ? b.p : "", full.p, b.len), "text %d prefix %zu: %.*s", t, k, (int)b.len, b.p);
            CHECK(unicode_utf8_valid(b.p ? b.p : "", b.len));
            if (st == JSONFMT_PREFIX_DONE) CHECK(b.len == full.len);
        }
        bytebuf_free(&full);
        bytebuf_free(&b);
    }
    bytebuf b = { 0 };
    CHECK(jsonfmt_prefix(&b, "{\"a\": 12x", 9, NULL) == JSONFMT_PREFIX_BAD && !strcmp(b.p, "{\"a\":12"));
    bytebuf_free(&b);
}


TEST(test_layouts_and_walk)
{
    bytebuf b = { 0 };
    const char *src = " {\"a\" : [1, 2.0, -0.5, 1e21, 1E-7, 12345678901234567890], \"b\":{}, \"c\":[], \"d\":\"\\u00e9\\n\\/\\ud83d\\ude00\\u0001\"} ";
    CHECK(jsonfmt_write(&b, src, strlen(src), JSONFMT_SPACED, 0));
    CHECKF(!strcmp(b.p, "{\"a\": [1, 2, -0.5, 1e+21, 1e-7, 12345678901234567000], \"b\": {}, \"c\": [], \"d\": \"\xc3\xa9\\n/\xf0\x9f\x98\x80\\u0001\"}"), "%s", b.p);
    b.len = 0;
    const char *s2 = "{\"a\":[1,{\"x\":null}],\"b\":{}}";
    CHECK(jsonfmt_write(&b, s2, strlen(s2), JSONFMT_INDENT, 4));
    CHECKF(!strcmp(b.p, "{\n    \"a\": [\n        1,\n        {\n            \"x\": null\n        }\n    ],\n    \"b\": {}\n}"), "%s", b.p);
    size_t before = b.len;
    CHECK(!jsonfmt_write(&b, "{\"a\":}", 6, JSONFMT_COMPACT, 0));
    CHECK(!jsonfmt_write(&b, "[1,]", 4, JSONFMT_COMPACT, 0));
    CHECK(!jsonfmt_write(&b, "1 2", 3, JSONFMT_COMPACT, 0));
    CHECK(!jsonfmt_write(&b, "01", 2, JSONFMT_COMPACT, 0));
    CHECK(b.len == before);
    const char *v;
    size_t vn;
    CHECK(jsonfmt_get_member(s2, strlen(s2), "b", &v, &vn) && vn == 2 && !memcmp(v, "{}", 2));
    CHECK(!jsonfmt_get_member(s2, strlen(s2), "x", &v, &vn));
    /* walking a container: members in order with decoded keys, array elements (strings too) */
    const char *o = " { \"k\\u00e9\" : [1, \"a\", {}] , \"b\":\"x:y\" } ";
    size_t pos = 0;
    b.len = 0;
    CHECK(jsonfmt_next(o, strlen(o), &pos, &b, &v, &vn) && !strcmp(b.p, "k\xc3\xa9") && vn == 12 && !memcmp(v, "[1, \"a\", {}]", 12));
    const char *arr = v;
    size_t arrn = vn;
    CHECK(jsonfmt_next(o, strlen(o), &pos, &b, &v, &vn) && !strcmp(b.p, "b") && vn == 5 && !memcmp(v, "\"x:y\"", 5));
    CHECK(!jsonfmt_next(o, strlen(o), &pos, &b, &v, &vn));
    size_t apos = 0;
    int n_el = 0;
    while (jsonfmt_next(arr, arrn, &apos, NULL, &v, &vn)) n_el++;
    CHECK(n_el == 3);
    apos = 0;
    CHECK(!jsonfmt_next("[]", 2, &apos, NULL, &v, &vn) && !jsonfmt_next("5", 1, &apos, NULL, &v, &vn));
    bytebuf_free(&b);
}

TEST(test_scan_bounds)
{
    int d;
    size_t n;
    CHECK(jsonfmt_scan("{\"a\":[1,2,{\"b\":null}]}", 22, 3, 100, &d, &n) == JSONFMT_SCAN_OK && d == 3 && n == 8);
    CHECK(jsonfmt_scan("{\"a\":[1,2,{\"b\":null}]}", 22, 2, 100, &d, NULL) == JSONFMT_SCAN_TOO_DEEP);
    CHECK(jsonfmt_scan("[1,2,3,4]", 9, 8, 4, NULL, &n) == JSONFMT_SCAN_TOO_MANY);
    /* brackets, commas and escaped quotes inside strings are text */
    CHECK(jsonfmt_scan("[\"[[[\\\"{{,,\"]", 13, 1, 2, &d, &n) == JSONFMT_SCAN_OK && d == 1 && n == 2);
    /* a million opening brackets: measured without recursion */
    size_t big = 1000000;
    char *s = xmalloc(big);
    memset(s, '[', big);
    CHECK(jsonfmt_scan(s, big, JSONFMT_MAX_DEPTH, JSONFMT_MAX_VALUES, &d, NULL) == JSONFMT_SCAN_TOO_DEEP &&
          d == JSONFMT_MAX_DEPTH + 1);
    free(s);
}

/* The compact form of the model's tool arguments, byte for byte: what clients receive. */
TEST(test_compact)
{
    bytebuf b = {0};
    CHECK(jsonfmt_write(&b, tool_args, strlen(tool_args), JSONFMT_COMPACT, 0));
    CHECKF(!strcmp(b.p, "{\"path\":\"/tmp/caf\xc3\xa9 \xc3\xa9 \xf0\x9f\x98\x80 \xf0\x9f\x98\x80.txt\",\"lines\":[1,-2.5,300,true,false,null],"
                        "\"content\":\"line one\\nline \\\"two\\\"\\ttabbed \\\\ back/slash\",\"nested\":{\"a\":{\"b\":[[],{},[\"x\"]]}},"
                        "\"big\":12345678901234567000,\"small\":0.000001}"),
           "%s", b.p);
    /* a lone surrogate stays escaped, as JSON.stringify writes it; duplicate keys are kept */
    b.len = 0;
    CHECK(jsonfmt_write(&b, "{\"k\":\"\\ud800x\",\"k\":1}", 21, JSONFMT_COMPACT, 0));
    CHECKF(!strcmp(b.p, "{\"k\":\"\\ud800x\",\"k\":1}"), "%s", b.p);
    bytebuf_free(&b);
}

static bool number_is(double v, const char *want)
{
    bytebuf b = {0};
    jsonfmt_write_number(&b, v);
    bool ok = b.p && !strcmp(b.p, want);
    if (!ok) fprintf(stderr, "  %.17g printed as %s, want %s\n", v, b.p ? b.p : "", want);
    bytebuf_free(&b);
    return ok;
}

/* Number#toString: integers without ".0", the shortest digits that round-trip, exponent form
 * from 1e21 up and below 1e-6. */
TEST(test_numbers)
{
    CHECK(number_is(1.0, "1"));
    CHECK(number_is(-0.0, "0"));
    CHECK(number_is(0.1, "0.1"));
    CHECK(number_is(-2.5, "-2.5"));
    CHECK(number_is(1.0 / 3, "0.3333333333333333"));
    CHECK(number_is(123456789.0, "123456789"));
    CHECK(number_is(1e20, "100000000000000000000"));
    CHECK(number_is(1e21, "1e+21"));
    CHECK(number_is(1.5e300, "1.5e+300"));
    CHECK(number_is(0.000001, "0.000001"));
    CHECK(number_is(1e-7, "1e-7"));
    CHECK(number_is(-1.25e-7, "-1.25e-7"));
    CHECK(number_is(NAN, "null"));
    CHECK(number_is(INFINITY, "null"));
}

/* JSON.stringify's escapes; any bytes in, valid UTF-8 out (U+FFFD per maximal subpart). */
TEST(test_write_string)
{
    bytebuf b = {0};
    jsonfmt_write_string(&b, "a\"b\\c\b\f\n\r\t\x01\x1f/\x7f\xc3\xa9", 16);
    CHECKF(!strcmp(b.p, "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0001\\u001f/\x7f\xc3\xa9\""), "%s", b.p);
    b.len = 0;
    jsonfmt_write_string(&b, "a\xE2" "b\"\x01\xFF", 6);
    CHECK(!strcmp(b.p, "\"a\xEF\xBF\xBD" "b\\\"\\u0001\xEF\xBF\xBD\""));
    CHECK(unicode_utf8_valid(b.p, b.len));
    b.len = 0;
    jsonfmt_write_string(&b, "", 0);
    CHECK(b.len == 2 && !memcmp(b.p, "\"\"", 2));
    bytebuf_free(&b);
}

TEST(test_valid_and_decode)
{
    const char *good[] = {"0", "-0.5e+3", "\"\"", " [ ] ", "{\"a\":{\"b\":[null,true,false]}}", "\"\\u00e9\\/\"", NULL};
    const char *bad[] = {"", " ", "01", "1.", ".5", "+1", "[1,]", "{\"a\"}", "{a:1}", "'x'", "\"\\x\"", "\"\\u12\"",
                         "\"a\nb\"", "tru", "nul", "[1] 2", "\"abc", NULL};
    for (int i = 0; good[i]; i++) CHECKF(jsonfmt_valid(good[i], strlen(good[i])), "%s", good[i]);
    for (int i = 0; bad[i]; i++) CHECKF(!jsonfmt_valid(bad[i], strlen(bad[i])), "%s", bad[i]);
    bytebuf b = {0};
    const char *s = "\"a\\u00e9\\ud83d\\ude00\\n\\\"\\\\\\/\xc3\xa9\"";
    CHECK(jsonfmt_decode_string(&b, s, strlen(s)));
    CHECKF(b.len == 13 && !memcmp(b.p, "a\xc3\xa9\xf0\x9f\x98\x80\n\"\\/\xc3\xa9", 13), "%.*s", (int)b.len, b.p);
    b.len = 0;
    CHECK(!jsonfmt_decode_string(&b, "\"abc", 4));
    CHECK(!jsonfmt_decode_string(&b, "abc", 3));
    CHECK(!jsonfmt_decode_string(&b, "\"\\q\"", 4));
    bytebuf_free(&b);
}

int main(void)
{
    RUN(test_compact);
    RUN(test_layouts_and_walk);
    RUN(test_numbers);
    RUN(test_write_string);
    RUN(test_valid_and_decode);
    RUN(test_prefix_extends);
    RUN(test_scan_bounds);
    HARNESS_END();
}
