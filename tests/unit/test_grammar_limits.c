/*
 * test_grammar_limits: the grammar compilers under hostile input. Grammars whose expansion
 * is deep (a nullable repetition of 50,000, parentheses 100,000 deep) compile on a thread
 * with a small stack without touching its end; grammars whose states blow up (nested counted
 * repetitions of nullable symbols) are refused with GRAMMAR_ERR_LIMIT naming the limit, and
 * ambiguous ones whose stacks are reached by exponentially many paths compile; large counts
 * are not unrolled (maxLength 99999 costs a few hundred states) and match exactly the lengths
 * they should; the states, stacks and time budgets each stop a compile; the compile cache
 * keeps its bytes under its budget; a compile stops when its cancel hook says so; zod's safe-integer bounds compile exactly.
 *
 * Each compile runs on a thread with a 256 KiB stack (a server's connection threads are not
 * larger), watched with a generous wait that only bounds a hang.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "grammar/grammar.h"

typedef struct {
    grammar_kind kind;
    const char *src;
    grammar *g;
    grammar_status st;
    char err[512];
    volatile bool done;
} compile_job;

static void *compile_thread(void *arg)
{
    compile_job *j = arg;
    j->st = grammar_compile(j->kind, j->src, strlen(j->src), &j->g, j->err, sizeof j->err);
    __atomic_store_n(&j->done, true, __ATOMIC_RELEASE);
    return NULL;
}

/* Compiles on a small-stack thread; a compile that does not end within the wait fails the
 * test and ends the process (a hang is what the test is about). */
static grammar_status compile_small_stack(grammar_kind kind, const char *src, grammar **g, char *err)
{
    compile_job j = { .kind = kind, .src = src };
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    pthread_t t;
    CHECK(pthread_create(&t, &at, compile_thread, &j) == 0);
    pthread_attr_destroy(&at);
    if (!WAIT_UNTIL(__atomic_load_n(&j.done, __ATOMIC_ACQUIRE), 120)) {
        fprintf(stderr, "  compile of %.60s did not end\n", src);
        printf("FAIL (hang)\n0 passed, 1 failed\n");
        fflush(stdout);
        _exit(1);
    }
    pthread_join(t, NULL);
    strcpy(err, j.err);
    *g = j.g;
    return j.st;
}

static bool accepts(const grammar *g, const char *doc)
{
    return grammar_accepts(g, doc, strlen(doc));
}

TEST(test_deep_nullable_repetition_does_not_overflow)
{
    char err[512];
    grammar *g = NULL;
    /* a chain of 50,000 nullable helpers: refused by the stack budget, on a 256 KiB stack */
    grammar_status st = compile_small_stack(GRAMMAR_KIND_GBNF, "root ::= (\"a\"?){0,50000}\n", &g, err);
    CHECKF(st == GRAMMAR_ERR_LIMIT && strstr(err, "--grammar-max-stacks"), "%s: %s", grammar_status_name(st), err);
    CHECK(!g);
    /* the regex of 1,000: small enough to compile, and it means what it says */
    st = compile_small_stack(GRAMMAR_KIND_REGEX, "(a?){0,1000}", &g, err);
    CHECKF(st == GRAMMAR_OK, "%s", err);
    if (g) {
        CHECK(accepts(g, "") && accepts(g, "aaa") && !accepts(g, "ab"));
        char *s = malloc(1002);
        memset(s, 'a', 1001);
        s[1001] = 0;
        CHECK(!accepts(g, s));
        s[1000] = 0;
        CHECK(accepts(g, s));
        free(s);
        grammar_free(g);
    }
    /* a user's own chain of 20,000 rules, last referenced first (the checks walk it) */
    size_t cap = 1 << 20, n = 0;
    char *t = malloc(cap);
    n += (size_t)snprintf(t + n, cap - n, "root ::= r0\n");
    for (int i = 0; i < 20000; i++) n += (size_t)snprintf(t + n, cap - n, "r%d ::= \"x\"? r%d\n", i, i + 1);
    n += (size_t)snprintf(t + n, cap - n, "r20000 ::= \"y\"\n");
    st = compile_small_stack(GRAMMAR_KIND_GBNF, t, &g, err);
    CHECKF(st == GRAMMAR_OK || st == GRAMMAR_ERR_LIMIT, "%s: %s", grammar_status_name(st), err);
    if (g) {
        CHECK(accepts(g, "xxy") && !accepts(g, "xx"));
        grammar_free(g);
    }
    free(t);
}

TEST(test_deep_parentheses_are_an_error)
{
    char err[512];
    grammar *g = NULL;
    int depth = 100000;
    char *t = malloc((size_t)2 * depth + 32);
    char *q = t + sprintf(t, "root ::= ");
    for (int i = 0; i < depth; i++) *q++ = '(';
    q += sprintf(q, "\"a\"");
    for (int i = 0; i < depth; i++) *q++ = ')';
    strcpy(q, "\n");
    grammar_status st = compile_small_stack(GRAMMAR_KIND_GBNF, t, &g, err);
    CHECKF(st == GRAMMAR_ERR_SYNTAX && strstr(err, "nested"), "%s: %s", grammar_status_name(st), err);
    CHECK(!g);
    free(t);
}

TEST(test_blow_ups_are_refused_naming_the_limit)
{
    char err[512];
    grammar *g = NULL;
    static const struct {
        grammar_kind kind;
        const char *src;
    } cases[] = {
        { GRAMMAR_KIND_REGEX, "((a?){0,100}){0,100}" },
        { GRAMMAR_KIND_REGEX, "(((a?){0,20}){0,20}){0,20}" },
        { GRAMMAR_KIND_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^(a?){0,10000}$\"}" },
        { GRAMMAR_KIND_GBNF, "root ::= \"b\" x\nx ::= ((\"a\"?){0,100}){0,100}\n" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        grammar_status st = compile_small_stack(cases[i].kind, cases[i].src, &g, err);
        CHECKF(st == GRAMMAR_ERR_LIMIT && strstr(err, "--grammar-max-"), "%s: %s: %s", cases[i].src,
               grammar_status_name(st), err);
        CHECK(!g);
    }
}

TEST(test_ambiguous_paths_compile_and_match)
{
    /* each helper reached two ways from the one before: 2^40 paths to the same stacks */
    char err[512];
    grammar *g = NULL;
    grammar_status st = compile_small_stack(GRAMMAR_KIND_GBNF, "root ::= (\"a\"? | \"a\"?){0,40} \"b\"\n", &g, err);
    CHECKF(st == GRAMMAR_OK, "%s", err);
    if (g) {
        CHECK(accepts(g, "b") && accepts(g, "aaab") && !accepts(g, "aaa"));
        grammar_free(g);
    }
}

/* x{lo,hi} (hi < 0: unbounded) of a two-byte literal, checked at every length up to top. */
static void check_counts(int lo, int hi, int top)
{
    char src[128], err[512];
    if (hi < 0) snprintf(src, sizeof src, "root ::= \"xy\"{%d,} \"z\"\n", lo);
    else snprintf(src, sizeof src, "root ::= \"xy\"{%d,%d} \"z\"\n", lo, hi);
    grammar *g = NULL;
    CHECKF(grammar_compile(GRAMMAR_KIND_GBNF, src, strlen(src), &g, err, sizeof err) == GRAMMAR_OK, "%s", err);
    if (!g) return;
    CHECKF(grammar_n_states(g) < 400, "%s: %d states", src, grammar_n_states(g));
    char *doc = malloc((size_t)2 * top + 2);
    int bad = 0;
    for (int n = 0; n <= top; n++) {
        for (int i = 0; i < n; i++) doc[2 * i] = 'x', doc[2 * i + 1] = 'y';
        doc[2 * n] = 'z';
        doc[2 * n + 1] = 0;
        bool want = n >= lo && (hi < 0 || n <= hi);
        if (accepts(g, doc) != want && bad++ < 3) fprintf(stderr, "  %s: %d copies: %d\n", src, n, !want);
    }
    CHECK(bad == 0);
    /* half a copy is never accepted */
    snprintf(doc, 4, "xz");
    CHECK(!accepts(g, doc));
    free(doc);
    grammar_free(g);
}

TEST(test_large_counts_are_exact_without_unrolling)
{
    check_counts(0, 33, 40);
    check_counts(0, 100, 130);
    check_counts(37, 37, 60);
    check_counts(33, 70, 90);
    check_counts(40, -1, 120);
    check_counts(5, 1000, 1030);
    check_counts(1000, 1023, 1030);
}

TEST(test_schema_max_length_is_small)
{
    const char *s = "{\"type\":\"string\",\"maxLength\":99999}";
    char err[512];
    grammar *g = NULL;
    grammar_status st = compile_small_stack(GRAMMAR_KIND_SCHEMA, s, &g, err);
    CHECKF(st == GRAMMAR_OK, "%s", err);
    if (!g) return;
    CHECKF(grammar_n_states(g) < 5000, "%d states", grammar_n_states(g));
    CHECKF(grammar_bytes(g) < (1u << 20), "%zu bytes", grammar_bytes(g));
    char *doc = malloc(100010);
    doc[0] = '"';
    memset(doc + 1, 'q', 99999);
    strcpy(doc + 100000, "\"");
    CHECK(accepts(g, doc));
    doc[100000] = 'q';
    strcpy(doc + 100001, "\"");
    CHECK(!accepts(g, doc));
    CHECK(accepts(g, "\"\"") && accepts(g, "\"a\\\"b\""));
    free(doc);
    grammar_free(g);
}

TEST(test_budgets_stop_a_compile)
{
    grammar_limits keep = grammar_limits_get();
    char err[512];
    grammar *g = NULL;
    /* states: 40 alternatives of 30 literal bytes each are past 1,000 */
    char src[4096];
    char *q = src + sprintf(src, "root ::= ");
    for (int i = 0; i < 40; i++) q += sprintf(q, "%s\"abcdefghijklmnopqrstuvwxyz%04d\"", i ? " | " : "", i);
    strcpy(q, "\n");
    grammar_limits l = keep;
    l.max_states = 1000;
    grammar_limits_set(&l);
    grammar_status st = grammar_compile(GRAMMAR_KIND_GBNF, src, strlen(src), &g, err, sizeof err);
    CHECKF(st == GRAMMAR_ERR_LIMIT && strstr(err, "1000 states") && strstr(err, "--grammar-max-states"), "%s", err);
    CHECK(!g);
    /* stacks: 40 alternatives are past 16 */
    l = keep;
    l.max_stacks = 16;
    grammar_limits_set(&l);
    st = grammar_compile(GRAMMAR_KIND_GBNF, src, strlen(src), &g, err, sizeof err);
    CHECKF(st == GRAMMAR_ERR_LIMIT && strstr(err, "16 parser stacks"), "%s", err);
    /* a schema goes through the same budgets, and says which */
    const char *en = "{\"enum\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}";
    st = grammar_compile(GRAMMAR_KIND_SCHEMA, en, strlen(en), &g, err, sizeof err);
    CHECKF(st == GRAMMAR_ERR_LIMIT && strstr(err, "--grammar-max-stacks") && !strstr(err, "compiled from"), "%s", err);
    /* time: a budget already spent */
    l = keep;
    l.max_seconds = 1e-9;
    grammar_limits_set(&l);
    st = grammar_compile(GRAMMAR_KIND_GBNF, src, strlen(src), &g, err, sizeof err);
    CHECKF(st == GRAMMAR_ERR_LIMIT && strstr(err, "--grammar-max-seconds"), "%s", err);
    grammar_limits_set(&keep);
    st = grammar_compile(GRAMMAR_KIND_GBNF, src, strlen(src), &g, err, sizeof err);
    CHECKF(st == GRAMMAR_OK, "%s", err);
    grammar_free(g);
}

static int n_polls;

static bool gone_after_polls(void *ctx)
{
    return ++n_polls > *(int *)ctx;
}

TEST(test_a_compile_stops_when_cancelled)
{
    char err[512];
    grammar *g = NULL;
    int after = 0;
    n_polls = 0;
    grammar_cancel_set(gone_after_polls, &after);
    grammar_status st = grammar_compile(GRAMMAR_KIND_REGEX, "(a?){0,1000}", 12, &g, err, sizeof err);
    CHECKF(st == GRAMMAR_ERR_LIMIT && strstr(err, "cancelled") && !g, "%s", err);
    CHECK(n_polls == 1);
    /* a client still there: the compile goes on */
    after = 1 << 30;
    st = grammar_compile(GRAMMAR_KIND_REGEX, "(a?){0,1000}", 12, &g, err, sizeof err);
    CHECKF(st == GRAMMAR_OK && n_polls >= 2, "%s", err);
    grammar_free(g);
    grammar_cancel_set(NULL, NULL);
}

TEST(test_cache_is_bounded_in_bytes)
{
    grammar_limits keep = grammar_limits_get();
    char src[256], err[512];
    snprintf(src, sizeof src, "{\"type\":\"object\",\"properties\":{\"k%d\":{\"type\":\"string\",\"maxLength\":%d}}}", 0, 500);
    grammar *g = NULL;
    CHECK(grammar_compile(GRAMMAR_KIND_SCHEMA, src, strlen(src), &g, err, sizeof err) == GRAMMAR_OK);
    size_t one = g ? grammar_bytes(g) : 0;
    grammar_free(g);
    grammar_limits l = keep;
    l.cache_bytes = 3 * one + one / 2;
    grammar_limits_set(&l);
    grammar_cache *c = grammar_cache_new(64);
    for (int i = 0; i < 12; i++) {
        snprintf(src, sizeof src, "{\"type\":\"object\",\"properties\":{\"k%d\":{\"type\":\"string\",\"maxLength\":%d}}}", i,
                 500 + i);
        CHECK(grammar_cache_get(c, GRAMMAR_KIND_SCHEMA, src, strlen(src), &g, err, sizeof err) == GRAMMAR_OK);
        CHECK(g && accepts(g, "{}"));
        grammar_free(g);
    }
    int n = 0;
    size_t bytes = 0;
    grammar_cache_usage(c, &n, &bytes);
    CHECKF(bytes <= l.cache_bytes && n >= 1 && n <= 4, "%d entries, %zu bytes of %zu", n, bytes, l.cache_bytes);
    /* the most recent is kept: a hit, no compile */
    uint64_t n_comp0, n_hit0, n_comp, n_hit;
    grammar_cache_stats(c, &n_comp0, &n_hit0);
    CHECK(grammar_cache_get(c, GRAMMAR_KIND_SCHEMA, src, strlen(src), &g, err, sizeof err) == GRAMMAR_OK);
    grammar_free(g);
    grammar_cache_stats(c, &n_comp, &n_hit);
    CHECK(n_comp == n_comp0 && n_hit == n_hit0 + 1);
    grammar_cache_free(c);
    grammar_limits_set(&keep);
}

TEST(test_zod_safe_integers)
{
    const char *s = "{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}";
    char err[512];
    grammar *g = NULL;
    CHECKF(grammar_compile(GRAMMAR_KIND_SCHEMA, s, strlen(s), &g, err, sizeof err) == GRAMMAR_OK, "%s", err);
    if (g) {
        CHECK(accepts(g, "0") && accepts(g, "-17") && accepts(g, "9007199254740991") && accepts(g, "-9007199254740991"));
        CHECK(!accepts(g, "9007199254740992") && !accepts(g, "-9007199254740992") && !accepts(g, "99999999999999999"));
        CHECK(!accepts(g, "01") && !accepts(g, "1.5"));
        grammar_free(g);
    }
    /* a bound past what 16 digits write leaves nothing out; one below them all is refused */
    s = "{\"type\":\"integer\",\"minimum\":0,\"maximum\":1e300}";
    CHECKF(grammar_compile(GRAMMAR_KIND_SCHEMA, s, strlen(s), &g, err, sizeof err) == GRAMMAR_OK, "%s", err);
    if (g) {
        CHECK(accepts(g, "9999999999999999") && !accepts(g, "-1"));
        grammar_free(g);
    }
    s = "{\"type\":\"integer\",\"minimum\":1e17}";
    CHECK(grammar_compile(GRAMMAR_KIND_SCHEMA, s, strlen(s), &g, err, sizeof err) == GRAMMAR_ERR_UNSUPPORTED);
}

int main(void)
{
    RUN(test_deep_nullable_repetition_does_not_overflow);
    RUN(test_deep_parentheses_are_an_error);
    RUN(test_blow_ups_are_refused_naming_the_limit);
    RUN(test_ambiguous_paths_compile_and_match);
    RUN(test_large_counts_are_exact_without_unrolling);
    RUN(test_schema_max_length_is_small);
    RUN(test_budgets_stop_a_compile);
    RUN(test_a_compile_stops_when_cancelled);
    RUN(test_cache_is_bounded_in_bytes);
    RUN(test_zod_safe_integers);
    printf("%d passed, %d failed\n", harness_passed, harness_failed);
    return harness_failed != 0;
}
