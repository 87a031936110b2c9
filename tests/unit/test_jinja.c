/*
 * test_jinja: the interpreter on its own: the language chat templates use, the taint each
 * operation keeps per byte, and the bounds a hostile template meets (a clear error, never a
 * hang or a crash). Byte-for-byte agreement with @huggingface/jinja on the reference
 * templates is tests/e2e/jinja.test.mjs.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "recipe/jinja.h"

/* Renders src with a tainted variable `u` (the JSON value u_json) and a tainted string `s`;
 * returns the status, fills out (text) and taint ("0"/"1" per byte) when non-NULL. */
static jinja_status render(const char *src, const char *u_json, char *out, size_t outsz, char *taint, char *err,
                           const jinja_limits *lim)
{
    jinja_program *p = NULL;
    char e[512] = "";
    jinja_status st = jinja_parse(src, strlen(src), &p, e, sizeof e);
    if (st == JINJA_OK) {
        jinja_var v[3] = {
            { .name = "u", .kind = JINJA_VAR_JSON, .text = u_json ? u_json : "null", .len = strlen(u_json ? u_json : "null"), .tainted = true },
            { .name = "s", .kind = JINJA_VAR_STRING, .text = "User<|x|>", .len = 9, .tainted = true },
            { .name = "flag", .kind = JINJA_VAR_BOOL, .b = true },
        };
        jinja_output o;
        st = jinja_render(p, v, 3, "2025-03-04", lim, &o, e, sizeof e);
        if (st == JINJA_OK) {
            if (out) snprintf(out, outsz, "%s", o.text);
            if (taint) {
                size_t k = 0;
                for (; k < o.len && k + 1 < outsz; k++) taint[k] = o.taint[k] ? '1' : '0';
                taint[k] = 0;
            }
            jinja_output_free(&o);
        }
        jinja_program_free(p);
    }
    if (err) snprintf(err, 512, "%s", e);
    return st;
}

static void check_render(const char *src, const char *u, const char *want, int line)
{
    char out[4096], err[512];
    jinja_status st = render(src, u, out, sizeof out, NULL, err, NULL);
    if (st != JINJA_OK || strcmp(out, want)) {
        harness_failed_checks++;
        fprintf(stderr, "  line %d: %s\n    got  [%s] (%s)\n    want [%s]\n", line, src, st == JINJA_OK ? out : "", err, want);
    }
}
#define R(src, u, want) check_render(src, u, want, __LINE__)

TEST(test_language)
{
    R("{% if flag %}a{% elif x %}b{% else %}c{% endif %}", NULL, "a");
    R("{% for x in [1,2,3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", NULL, "11,22,33");
    R("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
    R("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", NULL, "2242");
    R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL, "a=1;b=2;");
    R("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}", NULL, "13");
    R("{% for x in [1,2,3] %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}", NULL, "1");
    R("{% set ns = namespace(n=0) %}{% for x in [1,2] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", NULL, "3");
    R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
    R("{% macro m(a, b='d') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}", NULL, "[1d][12]");
    R("{% macro m() %}{{ varargs|length }}{{ kwargs.k }}{% endmacro %}{{ m(1, 2, k=3) }}", NULL, "23");
    R("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}", NULL, "<in>");
    R("{% set t %}a{{ 1 + 1 }}{% endset %}{{ t }}", NULL, "a2");
    R("{% filter upper %}abc{% endfilter %}", NULL, "ABC");
    R("{{ 'a' ~ 1 ~ 1.5 ~ true }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 3 }} {{ 1.0 }} {{ 7 / 2 }}", NULL, "a11.5true 3 1 8 1.0 3.5");
    R("{{ 'abcdef'[1:3] }}{{ 'abcdef'[-2:] }}{{ 'abc'[::-1] }}{{ [1,2,3][-1] }}", NULL, "bcefcba3");
    R("{{ 'x' if flag else 'y' }}{{ 'z' if not flag }}", NULL, "x");
    R("{{ u is defined }} {{ v is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ 1 is number }}", NULL,
      "true false true true true true");
    R("{{ 'a' in 'cat' }}{{ 1 in [1,2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}", NULL, "truetruetruetrue");
    R("{{ '  a b  '|trim }}|{{ 'Ab'|upper }}{{ 'Ab'|lower }}|{{ 'hello world'|title }}|{{ 'abc'|capitalize }}|{{ 'abc'|length }}", NULL,
      "a b|ABab|Hello World|Abc|3");
    R("{{ [3,1,2]|sort|join(',') }} {{ [1,1,2]|unique|list|length }} {{ [1,2]|first }}{{ [1,2]|last }} {{ -3|abs }} {{ '5'|int + 1 }}", NULL,
      "1,2,3 2 12 3 6");
    R("{{ {'b': 1, 'a': 2}|dictsort|first|first }} {{ {'a': 1}.get('a') }}{{ {'a': 1}.get('z', 9) }} {{ {'a': 1}|items|list|length }}", NULL,
      "a 19 1");
    R("{{ [{'n': 'a', 'k': 1}, {'n': 'b'}]|selectattr('k', 'defined')|map(attribute='n')|join }}"
      "{{ [{'n': 'a', 'k': 1}, {'n': 'b'}]|rejectattr('k')|map(attribute='n')|join }}", NULL, "ab");
    R("{{ 'a,b,c'.split(',')|length }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aXa'.replace('a', 'b') }}", NULL,
      "3 true true bXb");
    R("{{ ' x '.strip() }}{{ 'x '.rstrip() }}{{ ' x'.lstrip() }}{{ 'a b'.upper() }}", NULL, "xxxA B");
    R("{{ {'a': [1, 'x', none, true]}|tojson }}", NULL, "{\"a\": [1, \"x\", null, true]}");
    R("{{ {'b': {'c': 1}, 'a': 2}|tojson(indent=2, sort_keys=true) }}", NULL, "{\n  \"a\": 2,\n  \"b\": {\n    \"c\": 1\n  }\n}");
    R("{{ 'é'|tojson }}{{ 'é'|tojson(ensure_ascii=true) }}", NULL, "\"é\"\"\\u00e9\"");
    R("{{ u.a.b }}{{ u['a']['b'] }}{{ u.c|default('d') }}{{ u.a.n|default(1, true) }}", "{\"a\": {\"b\": 5, \"n\": 0}}", "55d1");
    R("{{ 'x {} y {}'.format(1, 'z') }}", NULL, "x 1 y z");
    R("{{ strftime_now('%Y-%m-%d %d %b %B') }}", NULL, "2025-03-04 04 Mar March");
    R("{# comment #}a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    /* lstrip_blocks and trim_blocks */
    R("a\n    {% if true %}\nb\n    {% endif %}\nc", NULL, "a\nb\nc");
    R("{{ \"\\u00e9\\n\" }}", NULL, "é\n");
}

/* Every operation keeps each byte's origin: request text stays tainted through concatenation,
 * slicing, trim, replace, split/join, tojson (escapes included) and macros; what the template
 * writes is not. */
TEST(test_taint)
{
    char out[512], t[512], err[512];
    CHECK(render("<{{ s }}>", NULL, out, sizeof out, t, err, NULL) == JINJA_OK);
    CHECKF(!strcmp(out, "<User<|x|>>") && !strcmp(t, "01111111110"), "%s %s", out, t);
    CHECK(render("{{ ('[' ~ s ~ ']')[1:5] | trim }}", NULL, out, sizeof out, t, err, NULL) == JINJA_OK);
    CHECKF(!strcmp(out, "User") && !strcmp(t, "1111"), "%s %s", out, t);
    CHECK(render("{{ s.replace('User', 'AB') }}", NULL, out, sizeof out, t, err, NULL) == JINJA_OK);
    CHECKF(!strcmp(out, "AB<|x|>") && !strcmp(t, "0011111"), "%s %s", out, t);
    CHECK(render("{{ u|tojson }}", "{\"k\":\"a\\\"\"}", out, sizeof out, t, err, NULL) == JINJA_OK);
    /* {"k": "a\""}: keys and values (the escape too) are request text, the punctuation is not */
    CHECKF(!strcmp(out, "{\"k\": \"a\\\"\"}") && !strcmp(t, "001000011100"), "%s %s", out, t);
    CHECK(render("{{ u|join('-') }}", "[\"a\",\"b\"]", out, sizeof out, t, err, NULL) == JINJA_OK);
    CHECKF(!strcmp(out, "a-b") && !strcmp(t, "101"), "%s %s", out, t);
    CHECK(render("{% macro m(x) %}({{ x|upper }}){% endmacro %}{{ m(s) }}", NULL, out, sizeof out, t, err, NULL) == JINJA_OK);
    CHECKF(!strcmp(out, "(USER<|X|>)") && !strcmp(t, "01111111110"), "%s %s", out, t);
    CHECK(render("{% for p in s.split('<') %}{{ p }}{% endfor %}", NULL, out, sizeof out, t, err, NULL) == JINJA_OK);
    CHECKF(!strcmp(out, "User|x|>") && !strcmp(t, "11111111"), "%s %s", out, t);
    /* a literal the template compares request text against stays untainted */
    CHECK(render("{% if s.startswith('User') %}<|im_start|>{% endif %}", NULL, out, sizeof out, t, err, NULL) == JINJA_OK);
    CHECKF(!strcmp(t, "000000000000"), "%s", t);
}

TEST(test_errors_and_bounds)
{
    char err[512];
    static const char *const syntax[] = {
        "{% if x %}", "{% for %}", "{{ 1 + }}", "{% endif %}", "{{ 'abc }}", "{% bogus %}", "{{ (1 }}", "{{ a[ }}", "{#",
        "{% macro m(a, a) %}{% endmacro %}", "{{ f(a=1, 2) }}", "{{ \"\\q\" }}", "{% set %}",
    };
    for (size_t i = 0; i < sizeof syntax / sizeof *syntax; i++) {
        jinja_status st = render(syntax[i], NULL, NULL, 0, NULL, err, NULL);
        CHECKF(st == JINJA_ERR_SYNTAX && strstr(err, "syntax error"), "%s: %d %s", syntax[i], st, err);
    }
    CHECK(render("{{ raise_exception('no system role') }}", NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_RAISED);
    CHECKF(strstr(err, "no system role") != NULL, "%s", err);
    CHECK(render("{{ 1 + none }}", NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_RUNTIME);
    CHECK(render("{{ x|bogus }}", NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_RUNTIME);
    CHECK(render("{% for x in 3 %}{% endfor %}", NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_RUNTIME);

    /* nesting in the source: parentheses, blocks */
    size_t n = 20000;
    char *deep = malloc(n + 16 * 1000 + 16);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++) strcat(deep + i, "(");
    CHECK(render(deep, NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_SYNTAX && strstr(err, "nested deeper"));
    deep[0] = 0;
    for (size_t i = 0; i < 1000; i++) strcat(deep, "{% if 1 %}");
    CHECK(render(deep, NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_SYNTAX);
    free(deep);
    /* a left-deep chain parses flat but evaluates deep */
    char *chain = malloc(8 * 5000 + 16);
    strcpy(chain, "{{ 1");
    for (int i = 0; i < 5000; i++) strcat(chain + strlen(chain), " + 1");
    strcat(chain, " }}");
    CHECK(render(chain, NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_LIMIT);
    free(chain);
    /* unbounded recursion, huge outputs, long loops, huge ranges */
    CHECK(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_LIMIT);
    CHECKF(strstr(err, "deeper") != NULL, "%s", err);
    jinja_limits lim = { .max_steps = 100000, .max_output = 1 << 16, .max_memory = 8 << 20 };
    CHECK(render("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, NULL, 0,
                 NULL, err, &lim) == JINJA_ERR_LIMIT);
    CHECK(render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL, NULL, 0, NULL, err, &lim) ==
          JINJA_ERR_LIMIT);
    CHECKF(strstr(err, "steps") || strstr(err, "memory"), "%s", err);
    CHECK(render("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", NULL, NULL, 0, NULL, err, &lim) == JINJA_ERR_LIMIT);
    CHECK(render("{{ range(10000000000)|length }}", NULL, NULL, 0, NULL, err, NULL) == JINJA_ERR_LIMIT);
    /* the same template renders again after a failure (nothing shared was damaged) */
    char out[64];
    CHECK(render("{{ 1 + 1 }}", NULL, out, sizeof out, NULL, err, NULL) == JINJA_OK && !strcmp(out, "2"));
}

int main(void)
{
    RUN(test_language);
    RUN(test_taint);
    RUN(test_errors_and_bounds);
    HARNESS_END();
}
