/*
 * test_grammar: the structured-output grammar module: GBNF parsing and its errors, UTF-8
 * classes at byte level, the regex and JSON Schema front ends (integer ranges checked number
 * by number, unsupported keywords named), token masks against a brute-force check of every
 * token, tokens that cross terminals or end inside a character, stop ids only at the end of
 * a document, the mask cache and the compile cache, and the scheduler: a grammar-constrained
 * request on a tiny model only produces documents of the grammar, its log-probs are those of
 * the masked distribution (no -inf alternatives), and an allow-all grammar changes no greedy
 * token.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tinymodel.h"

#include "engine/engine.h"
#include "engine/sched.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"  /* the context-independent entries, to see both storages used */
#include "model/model.h"
#include "util/jsonfmt.h"

static grammar *compile(grammar_kind kind, const char *src, char *err)
{
    grammar *g = NULL;
    grammar_status st = grammar_compile(kind, src, strlen(src), &g, err, 256);
    if (st != GRAMMAR_OK) fprintf(stderr, "  compile: %s\n", err);
    return g;
}

static bool accepts(const grammar *g, const char *doc)
{
    return grammar_accepts(g, doc, strlen(doc));
}

TEST(test_gbnf_basics)
{
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_GBNF,
                         "# a comment\n"
                         "root ::= greeting (\" \" name)? \"!\"{1,3}\n"
                         "greeting ::= \"hi\" | \"hello\"\n"
                         "name ::= [A-Z] [a-z]*\n", err);
    CHECK(g);
    if (!g) return;
    CHECK(accepts(g, "hi!"));
    CHECK(accepts(g, "hello Bob!!!"));
    CHECK(!accepts(g, "hello Bob!!!!"));
    CHECK(!accepts(g, "hello bob!"));
    CHECK(!accepts(g, "hi"));
    CHECK(!accepts(g, ""));
    grammar_free(g);
}

TEST(test_gbnf_errors_name_the_problem)
{
    static const struct {
        const char *src, *msg;
        grammar_status st;
    } cases[] = {
        { "root ::= foo\n", "undefined rule 'foo'", GRAMMAR_ERR_INVALID },
        { "start ::= \"a\"\n", "no 'root' rule", GRAMMAR_ERR_INVALID },
        { "root ::= root \"a\" | \"b\"\n", "left-recursive", GRAMMAR_ERR_INVALID },
        { "root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"\n", "left-recursive", GRAMMAR_ERR_INVALID },
        { "root ::= \"a\n", "unterminated literal", GRAMMAR_ERR_SYNTAX },
        { "root ::= [a-z\n", "unterminated character class", GRAMMAR_ERR_SYNTAX },
        { "root ::= (\"a\"\n", "expecting ')'", GRAMMAR_ERR_SYNTAX },
        { "root ::= \"a\"{3,1}\n", "max below min", GRAMMAR_ERR_SYNTAX },
        { "root ::= \"a\"\n\nroot ::= \"b\"\n", "defined twice", GRAMMAR_ERR_SYNTAX },
        { "root ::= \"\\q\"\n", "unknown escape", GRAMMAR_ERR_SYNTAX },
        { "root := \"a\"\n", "line 1: expecting '::='", GRAMMAR_ERR_SYNTAX },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(cases); i++) {
        grammar *g = NULL;
        char err[256] = "";
        grammar_status st = grammar_compile(GRAMMAR_KIND_GBNF, cases[i].src, strlen(cases[i].src), &g, err, sizeof err);
        CHECKF(st == cases[i].st && !g, "%s: %s (%s)", cases[i].src, grammar_status_name(st), err);
        CHECKF(strstr(err, cases[i].msg), "%s: '%s' lacks '%s'", cases[i].src, err, cases[i].msg);
        grammar_free(g);
    }
}

TEST(test_utf8_classes_are_byte_sequences)
{
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_GBNF, "root ::= [a-zé世-丗\\U0001F600-\\U0001F64F]+\n", err);
    CHECK(g);
    if (!g) return;
    CHECK(accepts(g, "abé世丗\xF0\x9F\x98\x80"));
    CHECK(!accepts(g, "\xC3"));           /* half of é */
    CHECK(!accepts(g, "\xC3\xA8"));       /* è */
    CHECK(!accepts(g, "丘"));             /* past 丗 (U+4E17 < U+4E18) */
    grammar_free(g);
    g = compile(GRAMMAR_KIND_GBNF, "root ::= [^a\"]* \".\"\nx ::= .\n", err);
    CHECK(g);
    if (!g) return;
    CHECK(accepts(g, "bé\xE4\xB8\x96\xF0\x9F\x98\x80."));
    CHECK(!accepts(g, "ba."));
    CHECK(!accepts(g, "\xED\xA0\x80."));  /* an encoded surrogate is not a character */
    CHECK(!accepts(g, "\xC0\xAF."));      /* an overlong encoding neither */
    grammar_free(g);
}

TEST(test_llama_cpp_json_gbnf)
{
    char err[256];
    const char *src =
        "root   ::= object\n"
        "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::=\n"
        "  \"{\" ws (\n"
        "            string \":\" ws value\n"
        "    (\",\" ws string \":\" ws value)*\n"
        "  )? \"}\" ws\n"
        "array  ::=\n"
        "  \"[\" ws (\n"
        "            value\n"
        "    (\",\" ws value)*\n"
        "  )? \"]\" ws\n"
        "string ::=\n"
        "  \"\\\"\" (\n"
        "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
        "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
        "  )* \"\\\"\" ws\n"
        "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";
    grammar *g = compile(GRAMMAR_KIND_GBNF, src, err);
    CHECK(g);
    if (!g) return;
    CHECK(accepts(g, "{\"a\": [1, -2.5e3, \"x\\u00e9\", true, null, {}]}"));
    CHECK(!accepts(g, "{\"a\": [1,]}"));
    CHECK(!accepts(g, "[1]"));
    grammar_free(g);
}

TEST(test_json_object_kind)
{
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_JSON, "", err);
    CHECK(g);
    if (!g) return;
    CHECK(accepts(g, "{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}"));
    CHECK(accepts(g, " {}"));
    CHECK(!accepts(g, "[1]"));  /* json_object mode promises an object */
    CHECK(!accepts(g, "{\"a\": 01}"));
    grammar_free(g);
}

TEST(test_regex_front_end)
{
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_REGEX, "(\\+\\d{1,3} )?\\(\\d{3}\\) \\d{3}-\\d{4}", err);
    CHECK(g);
    if (g) {
        CHECK(accepts(g, "(555) 123-4567"));
        CHECK(accepts(g, "+44 (555) 123-4567"));
        CHECK(!accepts(g, "555 123-4567"));
        CHECK(!accepts(g, "(555) 123-4567x"));
        grammar_free(g);
    }
    g = compile(GRAMMAR_KIND_REGEX, "^[^\\s@]+@[a-z]+\\.(com|org)$", err);
    CHECK(g);
    if (g) {
        CHECK(accepts(g, "a.b@example.org"));
        CHECK(!accepts(g, "a b@example.org"));
        CHECK(!accepts(g, "ab@example.net"));
        grammar_free(g);
    }
    static const char *const refused[][2] = {
        { "(a)\\1", "backreferences" }, { "a(?=b)", "lookaround" }, { "\\bword", "word boundaries" },
        { "a^b", "anchors" }, { "(ab", "missing ')'" }, { "ab)", "unbalanced" }, { "*a", "quantifier" },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(refused); i++) {
        grammar *r = NULL;
        grammar_status st = grammar_compile(GRAMMAR_KIND_REGEX, refused[i][0], strlen(refused[i][0]), &r, err, sizeof err);
        CHECKF(st != GRAMMAR_OK && strstr(err, refused[i][1]), "%s: %s", refused[i][0], err);
        grammar_free(r);
    }
}

TEST(test_schema_objects_and_refs)
{
    char err[256];
    const char *schema =
        "{\"type\":\"object\",\"properties\":{"
        "\"name\":{\"type\":\"string\",\"maxLength\":5},"
        "\"kind\":{\"enum\":[\"a\",\"b\"]},"
        "\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
        "\"required\":[\"name\",\"next\"],\"additionalProperties\":false}";
    grammar *g = compile(GRAMMAR_KIND_SCHEMA, schema, err);
    CHECK(g);
    if (!g) return;
    CHECK(accepts(g, "{\"name\":\"x\",\"next\":null}"));
    CHECK(accepts(g, "{\"name\":\"x\",\"kind\":\"b\",\"next\":{\"name\":\"\\u00e9\",\"next\":null}}"));
    CHECK(accepts(g, "{ \"name\" : \"x\" ,\n  \"next\": null }"));
    CHECK(!accepts(g, "{\"name\":\"x\"}"));                          /* next is required */
    CHECK(!accepts(g, "{\"name\":\"xxxxxx\",\"next\":null}"));       /* maxLength */
    CHECK(!accepts(g, "{\"name\":\"x\",\"kind\":\"c\",\"next\":null}"));
    CHECK(!accepts(g, "{\"name\":\"x\",\"next\":null,\"extra\":1}")); /* additionalProperties */
    grammar_free(g);
    /* additional properties: any key but the declared ones */
    g = compile(GRAMMAR_KIND_SCHEMA, "{\"properties\":{\"ab\":{\"type\":\"integer\"}}}", err);
    CHECK(g);
    if (!g) return;
    CHECK(accepts(g, "{\"ab\":1,\"a\":\"x\",\"abc\":2,\"b\":[]}"));
    CHECK(!accepts(g, "{\"a\":1,\"ab\":\"x\"}"));  /* a second "ab" would override the first */
    CHECK(accepts(g, "\"not an object\""));        /* no type: other types are not constrained */
    grammar_free(g);
}

TEST(test_schema_integer_ranges_exact)
{
    static const char *const schemas[] = {
        "{\"type\":\"integer\",\"minimum\":-37,\"maximum\":215}",
        "{\"type\":\"integer\",\"minimum\":7}",
        "{\"type\":\"integer\",\"maximum\":-12}",
        "{\"type\":\"integer\",\"exclusiveMinimum\":-5,\"exclusiveMaximum\":99}",
        "{\"type\":\"integer\",\"minimum\":100,\"maximum\":1000}",
        "{\"type\":\"integer\",\"maximum\":45}",
        "{\"type\":\"integer\",\"minimum\":-250}",
    };
    static const long lo[] = { -37, 7, -100000000, -4, 100, -100000000, -250 };
    static const long hi[] = { 215, 100000000, -12, 98, 1000, 45, 100000000 };
    for (size_t i = 0; i < TM_ARRAY_LEN(schemas); i++) {
        char err[256];
        grammar *g = compile(GRAMMAR_KIND_SCHEMA, schemas[i], err);
        CHECKF(g, "%s", schemas[i]);
        if (!g) continue;
        int bad = 0;
        for (long v = -1200; v <= 1200 && bad < 3; v++) {
            char buf[32];
            snprintf(buf, sizeof buf, "%ld", v);
            bool want = v >= lo[i] && v <= hi[i];
            if (accepts(g, buf) != want) {
                bad++;
                CHECKF(false, "%s: %ld %s", schemas[i], v, want ? "refused" : "accepted");
            }
        }
        CHECK(!accepts(g, "007"));
        grammar_free(g);
    }
}

TEST(test_schema_unsupported_keywords_are_named)
{
    static const char *const cases[][2] = {
        { "{\"type\":\"object\",\"minProperties\":1,\"patternProperties\":{}}", "'minProperties', 'patternProperties'" },
        { "{\"oneOf\":[{\"type\":\"string\"}]}", "'oneOf'" },
        { "{\"type\":\"number\",\"multipleOf\":3}", "'multipleOf'" },
        { "{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems'" },
        { "{\"type\":\"string\",\"format\":\"email\"}", "format 'email'" },
        { "{\"properties\":{\"a\":{\"not\":{}}}}", "'not'" },
        { "{\"$ref\":\"http://example.com/x.json\"}", "only local references" },
        { "{\"$ref\":\"#/$defs/missing\"}", "does not resolve" },
        { "{\"type\":\"number\",\"maximum\":3.5}", "non-integer number" },
        { "{\"type\":\"objekt\"}", "unknown type 'objekt'" },
        { "{\"type\":", "not JSON" },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(cases); i++) {
        grammar *g = NULL;
        char err[256] = "";
        grammar_status st = grammar_compile(GRAMMAR_KIND_SCHEMA, cases[i][0], strlen(cases[i][0]), &g, err, sizeof err);
        CHECKF(st != GRAMMAR_OK && !g && strstr(err, cases[i][1]), "%s: '%s'", cases[i][0], err);
        grammar_free(g);
    }
}

/* Random texts made of each syntax's own characters: every one compiles or is refused with a
 * message, and a compiled one matches random documents without crashing (count-bounded). */
TEST(test_random_inputs_never_crash)
{
    static const char *const alphabets[] = {
        "ab(|)*+?{1,2}[^-]\\d.$^\"",                           /* regex */
        "root::= \"a\"|()*+?[^b-c]{2,}\n#.x\\<[9]>",         /* GBNF (token terminals too) */
        "{}[]:,\"typeobjectpropertiesitemsminItems0123-truenullanyOf$ref#/\"", /* schema */
    };
    util_rng rng;
    util_rng_seed(&rng, 42);
    int n_ok[3] = { 0 };
    for (int kind = 0; kind < 3; kind++) {
        const char *al = alphabets[kind];
        size_t nal = strlen(al);
        for (int it = 0; it < 1500; it++) {
            char src[64], doc[24];
            int len = (int)(util_rng_next(&rng) % 40);
            if (kind == 1) {
                memcpy(src, "root ::= ", 9);
                for (int i = 9; i < 9 + len; i++) src[i] = al[util_rng_next(&rng) % nal];
                len += 9;
            } else
                for (int i = 0; i < len; i++) src[i] = al[util_rng_next(&rng) % nal];
            src[len] = 0;
            grammar *g = NULL;
            char err[256] = "";
            grammar_kind k = kind == 0 ? GRAMMAR_KIND_REGEX : kind == 1 ? GRAMMAR_KIND_GBNF : GRAMMAR_KIND_SCHEMA;
            grammar_status st = grammar_compile(k, src, (size_t)len, &g, err, sizeof err);
            CHECKF((st == GRAMMAR_OK) == (g != NULL) && (st == GRAMMAR_OK || err[0]), "%s", src);
            if (!g) continue;
            n_ok[kind]++;
            for (int d = 0; d < 8; d++) {
                int dl = (int)(util_rng_next(&rng) % sizeof doc);
                for (int i = 0; i < dl; i++) doc[i] = "ab\"{}[]:,0-1"[util_rng_next(&rng) % 13];
                (void)grammar_accepts(g, doc, (size_t)dl);
            }
            grammar_free(g);
        }
    }
    CHECK(n_ok[0] > 100 && n_ok[1] > 20);  /* the generator reaches the compilers' insides */
}

/* A small vocabulary with tokens that cross terminals and split characters. */
static const char *const tv_tokens[] = {
    "<eos>", "{", "}", "\"", "{\"", "\":", "a", "ab", "b\"", "\"}", "1", "12", ",", " ", "\xC3", "\xA9",
    "\xC3\xA9", "x", ":", "\"a\":1}", "\"\"", "\"a", "}}", "<ctl>",
};
enum { TV_N = sizeof tv_tokens / sizeof tv_tokens[0], TV_EOS = 0, TV_CTL = TV_N - 1 };

static grammar_vocab *tv_vocab(void)
{
    int lens[TV_N];
    for (int i = 0; i < TV_N; i++) lens[i] = (i == TV_EOS || i == TV_CTL) ? 0 : (int)strlen(tv_tokens[i]);
    return grammar_vocab_new(TV_N, tv_tokens, lens);
}

/* The mask must allow exactly the tokens whose bytes extend the text to a prefix of some
 * document (checked by asking a fresh matcher to accept text + token). */
static void check_mask_brute(grammar *g, grammar_vocab *v, const int32_t *path, int n_path)
{
    int32_t stop = TV_EOS;
    grammar_match *m = grammar_match_new(g, v, &stop, 1);
    for (int i = 0; i < n_path; i++) CHECK(grammar_match_accept(m, path[i]));
    uint32_t mask[(TV_N + 31) / 32];
    int n_allowed = grammar_match_mask(m, mask);
    int count = 0;
    for (int t = 0; t < TV_N; t++) {
        grammar_match *m2 = grammar_match_new(g, v, &stop, 1);
        for (int i = 0; i < n_path; i++) grammar_match_accept(m2, path[i]);
        bool ok = grammar_match_accept(m2, t);
        if (t == TV_EOS) ok = grammar_match_complete(m2);
        bool bit = mask[t >> 5] >> (t & 31) & 1;
        count += bit;
        CHECKF(bit == ok, "path len %d, token %d '%s': mask %d, accept %d", n_path, t, tv_tokens[t], bit, ok);
        grammar_match_free(m2);
    }
    CHECK(count == n_allowed);
    grammar_match_free(m);
}

TEST(test_token_masks_match_brute_force)
{
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_GBNF,
                         "root ::= \"{\" (\"\\\"\" [a-bé]* \"\\\":\" num (\",\" \"\\\"\" [a-b]* \"\\\":\" num)*)? \"}\"\n"
                         "num ::= [1-9] [0-9]? | \"0\"\n", err);
    CHECK(g);
    if (!g) return;
    grammar_vocab *v = tv_vocab();
    enum { OPEN = 1, CLOSE = 2, Q = 3, OPENQ = 4, QCOLON = 5, A = 6, AB = 7, BQ = 8, ONE = 10, TWELVE = 11,
           COMMA = 12, C3 = 14, A9 = 15, EACUTE = 16 };
    int32_t paths[][6] = {
        { 0 }, { OPEN }, { OPENQ }, { OPENQ, AB }, { OPENQ, C3 }, { OPENQ, C3, A9 }, { OPENQ, A, BQ },
        { OPENQ, QCOLON, TWELVE }, { OPENQ, QCOLON, ONE, COMMA }, { OPENQ, EACUTE, QCOLON, ONE, CLOSE },
    };
    int n_path[] = { 0, 1, 1, 2, 2, 3, 3, 3, 4, 5 };
    for (size_t i = 0; i < TM_ARRAY_LEN(n_path); i++) check_mask_brute(g, v, paths[i], n_path[i]);
    /* deep stacks (nested objects): masks composed from the stacks' tops plus the tokens whose
     * bytes pop below them, against brute force */
    grammar *gs = compile(GRAMMAR_KIND_SCHEMA,
                          "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"ab\":"
                          "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
                          "\"additionalProperties\":false}},\"additionalProperties\":false}", err);
    CHECK(gs);
    if (gs) {
        int32_t deep[][8] = {
            { OPENQ, AB, QCOLON }, { OPENQ, AB, QCOLON, OPENQ }, { OPENQ, AB, QCOLON, OPENQ, A, QCOLON },
            { OPENQ, AB, QCOLON, OPENQ, A, QCOLON, TWELVE }, { OPENQ, AB, QCOLON, OPENQ, 8, 18, Q, A },
            { OPENQ, AB, QCOLON, OPENQ, A, QCOLON, ONE, CLOSE }, { OPENQ, A, QCOLON, ONE, COMMA, Q },
        };
        int n_deep[] = { 3, 4, 6, 7, 8, 8, 6 };
        for (size_t i = 0; i < TM_ARRAY_LEN(n_deep); i++) check_mask_brute(gs, v, deep[i], n_deep[i]);
        grammar_free(gs);
    }
    /* a token crossing terminals: "\"a\":1}" finishes the document in one go */
    int32_t stop = TV_EOS;
    grammar_match *m = grammar_match_new(g, v, &stop, 1);
    CHECK(grammar_match_accept(m, OPEN));
    CHECK(grammar_match_accept(m, 19));
    CHECK(grammar_match_complete(m));
    uint32_t mask[1];
    CHECK(grammar_match_mask(m, mask) == 1 && mask[0] == 1u << TV_EOS);  /* only the end */
    CHECK(!grammar_match_accept(m, CLOSE));
    CHECK(!grammar_match_accept(m, TV_CTL));
    CHECK(grammar_match_accept(m, TV_EOS));
    float logits[TV_N];
    for (int i = 0; i < TV_N; i++) logits[i] = 1.0f;
    grammar_match_apply(m, logits);
    for (int i = 0; i < TV_N; i++) CHECK(i == TV_EOS ? logits[i] == 1.0f : isinf(logits[i]) && logits[i] < 0);
    grammar_match_free(m);
    /* the mask cache: the same state again is a hit */
    uint64_t hit0, comp0, hit1, comp1;
    grammar_match_stats(g, &hit0, &comp0, NULL);
    m = grammar_match_new(g, v, &stop, 1);
    grammar_match_mask(m, mask);
    grammar_match_stats(g, &hit1, &comp1, NULL);
    CHECK(hit1 == hit0 + 1 && comp1 == comp0);
    grammar_match_free(m);
    grammar_vocab_free(v);
    grammar_free(g);
}

/* Masks on a larger vocabulary (every string of 1 to 4 characters over a JSON-ish alphabet:
 * the context-independent entries are stored both as id lists and as bitmasks there) against
 * brute force, along random documents. */
TEST(test_token_masks_large_vocab_brute_force)
{
    static const char alpha[] = "{}\":,ab1 ";
    enum { NA = sizeof alpha - 1, NV = 1 + NA + NA * NA + NA * NA * NA + NA * NA * NA * NA };
    char(*store)[5] = xcalloc(NV, sizeof *store);
    const char **bytes = xmalloc(NV * sizeof *bytes);
    int *lens = xmalloc(NV * sizeof *lens);
    int n = 0;
    lens[n] = 0;  /* id 0: the end of generation */
    bytes[n++] = store[0];
    for (int len = 1; len <= 4; len++) {
        int total = 1;
        for (int i = 0; i < len; i++) total *= NA;
        for (int x = 0; x < total; x++) {
            for (int i = 0, y = x; i < len; i++, y /= NA) store[n][i] = alpha[y % NA];
            bytes[n] = store[n];
            lens[n++] = len;
        }
    }
    grammar_vocab *v = grammar_vocab_new(NV, bytes, lens);
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_SCHEMA,
                         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"ab\":"
                         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}},"
                         "\"additionalProperties\":false}},\"additionalProperties\":false}", err);
    CHECK(g);
    uint32_t *mask = xmalloc((NV + 31) / 32 * sizeof *mask);
    util_rng rng;
    util_rng_seed(&rng, 5);
    int32_t stop = 0, path[24];
    int n_checked = 0, n_sparse = 0;  /* steps checked; entries stored as id lists */
    for (int doc = 0; g && doc < 8; doc++) {
        grammar_match *m = grammar_match_new(g, v, &stop, 1);
        for (int k = 0; k < 24; k++) {
            int n_allowed = grammar_match_mask(m, mask);
            int count = 0;
            for (int t = 0; t < NV; t++) {
                grammar_match *m2 = grammar_match_new(g, v, &stop, 1);
                for (int i = 0; i < k; i++) grammar_match_accept(m2, path[i]);
                bool ok = t == stop ? grammar_match_complete(m2) : grammar_match_accept(m2, t);
                grammar_match_free(m2);
                bool bit = mask[t >> 5] >> (t & 31) & 1;
                count += bit;
                CHECKF(bit == ok, "doc %d step %d token %d '%.4s': mask %d, accept %d", doc, k, t, store[t], bit, ok);
            }
            CHECK(count == n_allowed);
            n_checked++;
            if (n_allowed == 0 || (mask[0] & 1)) break;  /* a dead end, or a complete document */
            int pick = (int)(util_rng_uniform(&rng) * n_allowed), t = 0;
            for (;; t++)
                if ((mask[t >> 5] >> (t & 31) & 1) && pick-- == 0) break;
            path[k] = t;
            CHECK(grammar_match_accept(m, t));
        }
        grammar_match_free(m);
    }
    /* both storages of the entries were used */
    int n_dense = 0;
    for (int i = 0; g && i < g->ci_cap; i++) {
        n_sparse += g->ci[i].n_key && !g->ci[i].mask;
        n_dense += g->ci[i].n_key && g->ci[i].mask;
    }
    CHECKF(n_checked >= 30 && n_sparse >= 3 && n_dense >= 2, "%d steps, %d sparse, %d dense", n_checked, n_sparse, n_dense);
    /* the same grammar on another vocabulary: its entries start over, masks stay exact */
    grammar_vocab *tv = tv_vocab();
    enum { OPENQ = 4, A = 6, QCOLON = 5, ONE = 10, COMMA = 12 };
    int32_t p2[] = { OPENQ, A, QCOLON, ONE, COMMA };
    for (int k = 0; g && k <= 5; k++) check_mask_brute(g, tv, p2, k);
    CHECK(!g || (g->ci_vocab == tv && g->ci_n > 0 && g->ci_n < 20));
    grammar_vocab_free(tv);
    free(mask);
    grammar_free(g);
    grammar_vocab_free(v);
    free(store);
    free(bytes);
    free(lens);
}

/* Token terminals: <[ID]> matches that token id only, never its bytes spelled by other tokens
 * (nor by the token itself through a byte path), and composes with byte paths. */
TEST(test_token_terminals)
{
    char err[256];
    enum { OPEN = 1, CLOSE = 2, A = 6, ONE = 10, X = 17 };
    grammar_vocab *v = tv_vocab();
    int32_t stop = TV_EOS;
    /* a control token (no bytes) around a body, as a family's tool-call markers are */
    grammar *g = compile(GRAMMAR_KIND_GBNF, "root ::= <[23]> \"{\" \"a\"* \"}\" <[23]>\n", err);
    CHECK(g);
    if (!g) return;
    CHECK(grammar_max_token(g) == TV_CTL);
    CHECK(!accepts(g, "{a}"));  /* bytes never match a token terminal */
    grammar_match *m = grammar_match_new(g, v, &stop, 1);
    uint32_t mask[1];
    CHECK(grammar_match_mask(m, mask) == 1 && mask[0] == 1u << TV_CTL);
    CHECK(!grammar_match_accept(m, OPEN));
    CHECK(grammar_match_accept(m, TV_CTL));
    CHECK(!grammar_match_accept(m, TV_CTL));
    CHECK(grammar_match_accept(m, OPEN) && grammar_match_accept(m, A) && grammar_match_accept(m, CLOSE));
    CHECK(!grammar_match_complete(m) && !grammar_match_done(m));
    CHECK(grammar_match_mask(m, mask) == 1 && mask[0] == 1u << TV_CTL);
    CHECK(grammar_match_accept(m, TV_CTL));
    CHECK(grammar_match_complete(m) && grammar_match_done(m));
    grammar_match_reset(m);
    CHECK(!grammar_match_done(m) && grammar_match_accept(m, TV_CTL));
    grammar_match_free(m);
    int32_t paths[][3] = { { 0 }, { TV_CTL }, { TV_CTL, OPEN }, { TV_CTL, OPEN, A } };
    int n_path[] = { 0, 1, 2, 3 };
    for (size_t i = 0; i < TM_ARRAY_LEN(n_path); i++) check_mask_brute(g, v, paths[i], n_path[i]);
    grammar_free(g);
    /* an ordinary token as a terminal: "x" the token, or "x" the byte followed by "1"; the
     * token "x" takes both paths at once, and a document is only done when no path goes on */
    g = compile(GRAMMAR_KIND_GBNF, "root ::= \"x1\" | <[17]> \"}\" | <[17]>\n", err);
    CHECK(g);
    if (g) {
        CHECK(accepts(g, "x1") && !accepts(g, "x}"));
        m = grammar_match_new(g, v, &stop, 1);
        CHECK(grammar_match_accept(m, X));
        CHECK(grammar_match_complete(m) && !grammar_match_done(m));
        CHECK(grammar_match_mask(m, mask) == 3 && mask[0] == (1u << ONE | 1u << CLOSE | 1u << TV_EOS));
        grammar_match_free(m);
        int32_t p2[][2] = { { 0 }, { X }, { X, CLOSE } };
        int n2[] = { 0, 1, 2 };
        for (size_t i = 0; i < TM_ARRAY_LEN(n2); i++) check_mask_brute(g, v, p2[i], n2[i]);
        grammar_free(g);
    }
    /* under a deep stack (composed masks): a token terminal between nested rules */
    g = compile(GRAMMAR_KIND_GBNF,
                "root ::= \"{\" inner \"}\"\ninner ::= \"{\" (<[23]> | \"a\") \"}\" | \"1\"\n", err);
    CHECK(g);
    if (g) {
        int32_t p3[][3] = { { OPEN }, { OPEN, OPEN }, { OPEN, OPEN, TV_CTL } };
        int n3[] = { 1, 2, 3 };
        for (size_t i = 0; i < TM_ARRAY_LEN(n3); i++) check_mask_brute(g, v, p3[i], n3[i]);
        grammar_free(g);
    }
    /* ids beyond the vocabulary are never allowed (a dead end: the stops end it) */
    g = compile(GRAMMAR_KIND_GBNF, "root ::= <[4000000000]>\n", err);
    CHECK(!g && strstr(err, "token terminal"));
    g = compile(GRAMMAR_KIND_GBNF, "root ::= <[1000]>\n", err);
    CHECK(g && grammar_max_token(g) == 1000);
    if (g) {
        m = grammar_match_new(g, v, &stop, 1);
        CHECK(grammar_match_mask(m, mask) == 1 && mask[0] == 1u << TV_EOS);
        grammar_match_free(m);
        grammar_free(g);
    }
    /* syntax: tokens by text need a vocabulary the compiler does not have */
    CHECK(!compile(GRAMMAR_KIND_GBNF, "root ::= <think>\n", err) && strstr(err, "line 1") && strstr(err, "<["));
    CHECK(!compile(GRAMMAR_KIND_GBNF, "root ::= <[12\n", err) && strstr(err, "token terminal"));
    CHECK(!compile(GRAMMAR_KIND_GBNF, "root ::= <[]>\n", err));
    /* a token terminal survives the rule-name prefixing that combines grammars */
    const char *src = "root ::= <[23]> x\nx ::= \"a\"\n";
    char *pg = grammar_gbnf_prefix(src, strlen(src), "t1-");
    CHECK(pg && !strcmp(pg, "t1-root ::= <[23]> t1-x\nt1-x ::= \"a\"\n"));
    free(pg);
    grammar_vocab_free(v);
}

TEST(test_grammars_combine_by_prefix)
{
    /* two tools' argument schemas under one root, the way a forced tool call is written */
    const char *sa = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8}},"
                     "\"required\":[\"city\"],\"additionalProperties\":false}";
    const char *sb = "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},"
                     "\"required\":[\"n\"],\"additionalProperties\":false}";
    grammar_status st;
    char err[256];
    char *ga = grammar_to_gbnf(GRAMMAR_KIND_SCHEMA, sa, strlen(sa), &st, err, sizeof err);
    char *gb = grammar_to_gbnf(GRAMMAR_KIND_SCHEMA, sb, strlen(sb), &st, err, sizeof err);
    CHECK(ga && gb);
    if (!ga || !gb) return;
    char *pa = grammar_gbnf_prefix(ga, strlen(ga), "t1-"), *pb = grammar_gbnf_prefix(gb, strlen(gb), "t2-");
    CHECK(strstr(pa, "t1-root ::= t1-schema") && strstr(pa, "[0-9a-fA-F]{4}") && !strstr(pa, "t1-0"));
    bytebuf all = { 0 };
    bytebuf_puts(&all, "root ::= \"<call>{\\\"name\\\": \\\"weather\\\", \\\"arguments\\\": \" t1-root \"}</call>\" | "
                           "\"<call>{\\\"name\\\": \\\"dice\\\", \\\"arguments\\\": \" t2-root \"}</call>\"\n");
    bytebuf_puts(&all, pa);
    bytebuf_puts(&all, pb);
    grammar *g = compile(GRAMMAR_KIND_GBNF, all.p, err);
    CHECK(g);
    if (g) {
        CHECK(accepts(g, "<call>{\"name\": \"weather\", \"arguments\": {\"city\":\"Oslo\"}}</call>"));
        CHECK(accepts(g, "<call>{\"name\": \"dice\", \"arguments\": {\"n\": 6}}</call>"));
        CHECK(!accepts(g, "<call>{\"name\": \"dice\", \"arguments\": {\"city\":\"Oslo\"}}</call>"));
        CHECK(!accepts(g, "<call>{\"name\": \"dice\", \"arguments\": {\"n\": 10}}</call>"));
        grammar_free(g);
    }
    bytebuf_free(&all);
    free(pa);
    free(pb);
    free(ga);
    free(gb);
}

TEST(test_compile_cache_by_content)
{
    grammar_cache *c = grammar_cache_new(2);
    char err[256];
    const char *a = "{\"type\":\"integer\"}", *b = "{\"type\":\"string\"}", *d = "{\"type\":\"boolean\"}";
    grammar *g1, *g2, *g3, *g4;
    CHECK(grammar_cache_get(c, GRAMMAR_KIND_SCHEMA, a, strlen(a), &g1, err, sizeof err) == GRAMMAR_OK);
    CHECK(grammar_cache_get(c, GRAMMAR_KIND_SCHEMA, a, strlen(a), &g2, err, sizeof err) == GRAMMAR_OK);
    CHECK(g1 == g2);
    CHECK(grammar_cache_get(c, GRAMMAR_KIND_REGEX, a, strlen(a), &g3, err, sizeof err) == GRAMMAR_OK);
    CHECK(g3 != g1);  /* the kind is part of the key */
    uint64_t nc, nh;
    grammar_cache_stats(c, &nc, &nh);
    CHECK(nc == 2 && nh == 1);
    CHECK(grammar_cache_get(c, GRAMMAR_KIND_SCHEMA, b, strlen(b), &g4, err, sizeof err) == GRAMMAR_OK);
    grammar_free(g4);
    CHECK(grammar_cache_get(c, GRAMMAR_KIND_SCHEMA, d, strlen(d), &g4, err, sizeof err) == GRAMMAR_OK);
    grammar_free(g4);
    grammar *bad = NULL;
    CHECK(grammar_cache_get(c, GRAMMAR_KIND_SCHEMA, "{", 1, &bad, err, sizeof err) != GRAMMAR_OK && !bad);
    CHECK(accepts(g1, "42"));  /* evicted from the cache, still alive through its references */
    grammar_free(g1);
    grammar_free(g2);
    grammar_free(g3);
    grammar_cache_free(c);
}

/* ---- scheduler ---------------------------------------------------------------------- */

static model *tm_model;
static engine *tm_engine;

static bool tiny_setup(void)
{
    if (tm_engine) return true;
    tiny_cfg cfg = { .arch = "llama", .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                     .ffn = 128, .vocab = 256, .seed = 11 };
    char path[] = "/tmp/tm-grammar-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return false;
    close(fd);
    if (tiny_write(&cfg, path)) return false;
    char err[256];
    if (model_load(path, NULL, &tm_model, err, sizeof err) != GGUF_OK) return false;
    unlink(path);
    engine_opts eo = { .n_threads = 1, .n_kv_blocks = 16 };
    return engine_new(tm_model, &eo, &tm_engine, err, sizeof err) == ENGINE_OK;
}

/* Byte i of token i: a vocabulary where every token is one byte (ids 0..255). */
static grammar_vocab *byte_vocab(int n)
{
    char *store = xmalloc((size_t)n);
    const char **bytes = xmalloc((size_t)n * sizeof *bytes);
    int *lens = xmalloc((size_t)n * sizeof *lens);
    for (int i = 0; i < n; i++) {
        store[i] = (char)i;
        bytes[i] = store + i;
        lens[i] = i == 0 ? 0 : 1;  /* id 0: the end-of-generation id, no bytes */
    }
    grammar_vocab *v = grammar_vocab_new(n, bytes, lens);
    free(store);
    free(bytes);
    free(lens);
    return v;
}

static int run_req(sched *s, const sched_params *p, int32_t *out, int cap, sched_finish *fin)
{
    sched_req *r;
    if (sched_submit(s, p, &r) != SCHED_OK) return -1;
    int n = 0;
    sched_output o[8];
    while (!sched_done(r)) {
        int k = sched_poll(r, o, 8, 10000);
        for (int j = 0; j < k; j++) {
            if (o[j].kind == SCHED_OUT_FINISH) *fin = o[j].finish;
            else if (!o[j].is_stop && n < cap) out[n++] = o[j].token;
        }
    }
    sched_release(r);
    return n;
}

TEST(test_sched_constrains_sampling)
{
    if (!tiny_setup()) {
        CHECK(false);
        return;
    }
    sched_opts so = { .max_seqs = 4, .n_ctx = 256, .eos_ids = { 0, -1, -1, -1 } };
    sched *s;
    CHECK(sched_new(tm_engine, &so, &s) == SCHED_OK);
    grammar_vocab *v = byte_vocab(256);
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_REGEX, "(ab|c[0-9]{2})+", err);
    int32_t prompt[] = { 1, 2, 3 };
    int n_stop = 0, n_length = 0;
    for (int seed = 0; seed < 12; seed++) {
        sched_params p = { .prompt = prompt, .n_prompt = 3, .sample = sample_params_default(), .max_tokens = 40,
                           .grammar = g, .grammar_vocab = v };
        p.sample.temp = 1.0f;
        p.sample.top_k = 0;
        p.sample.top_p = 1.0f;
        p.sample.min_p = 0.0f;
        p.sample.seed = (uint64_t)seed;
        int32_t out[64];
        sched_finish fin = SCHED_FINISH_NONE;
        int n = run_req(s, &p, out, 64, &fin);
        CHECK(n > 0);
        char text[65];
        for (int i = 0; i < n; i++) text[i] = (char)out[i];
        text[n > 0 ? n : 0] = 0;
        if (fin == SCHED_FINISH_STOP) {
            n_stop++;
            CHECKF(accepts(g, text), "seed %d: '%s'", seed, text);
        } else {
            n_length++;
            CHECKF(fin == SCHED_FINISH_LENGTH && n == 40, "seed %d: finish %d after %d", seed, fin, n);
            /* a prefix of a document: some completion exists */
            grammar_match *m = grammar_match_new(g, v, NULL, 0);
            for (int i = 0; i < n; i++) CHECK(grammar_match_accept(m, out[i]));
            grammar_match_free(m);
        }
    }
    CHECK(n_stop + n_length == 12);
    /* a budget that ends inside the structure: LENGTH */
    grammar *g2 = compile(GRAMMAR_KIND_REGEX, "x{10}", err);
    sched_params p = { .prompt = prompt, .n_prompt = 3, .sample = sample_params_default(), .max_tokens = 4,
                       .grammar = g2, .grammar_vocab = v };
    int32_t out[16];
    sched_finish fin = SCHED_FINISH_NONE;
    CHECK(run_req(s, &p, out, 16, &fin) == 4 && fin == SCHED_FINISH_LENGTH);
    for (int i = 0; i < 4; i++) CHECK(out[i] == 'x');
    p.max_tokens = 30;
    CHECK(run_req(s, &p, out, 16, &fin) == 10 && fin == SCHED_FINISH_STOP);  /* then only the end */
    /* the vocabulary must be the model's */
    grammar_vocab *small = byte_vocab(100);
    p.grammar_vocab = small;
    sched_req *r;
    CHECK(sched_submit(s, &p, &r) == SCHED_ERR_ARG);
    grammar_vocab_free(small);
    grammar_free(g2);
    grammar_free(g);
    sched_free(s);
    grammar_vocab_free(v);
}

/* A lazy grammar (strict tools under tool_choice auto): free text until the trigger token,
 * then a document of the grammar closed by its own end token, then free again. */
TEST(test_sched_lazy_grammar)
{
    if (!tiny_setup()) {
        CHECK(false);
        return;
    }
    enum { TRIG = 250, CLOSE = 251 };
    sched_opts so = { .max_seqs = 4, .n_ctx = 256, .eos_ids = { 0, -1, -1, -1 } };
    sched *s;
    CHECK(sched_new(tm_engine, &so, &s) == SCHED_OK);
    /* bytes 1..255 except the trigger and the closing token (control tokens: no bytes) */
    char store[256];
    const char *bytes[256];
    int lens[256];
    for (int i = 0; i < 256; i++) {
        store[i] = (char)i;
        bytes[i] = store + i;
        lens[i] = i == 0 || i == TRIG || i == CLOSE ? 0 : 1;
    }
    grammar_vocab *v = grammar_vocab_new(256, bytes, lens);
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_GBNF, "root ::= \"{\" [a-c]{1,3} \"}\" <[251]>\n", err);
    CHECK(g);
    if (!g) return;
    int32_t prompt[] = { 1, 2, 3 };
    int n_docs = 0, n_free_other = 0;
    for (int seed = 0; seed < 8; seed++) {
        sched_params p = { .prompt = prompt, .n_prompt = 3, .sample = sample_params_default(), .max_tokens = 48,
                           .grammar = g, .grammar_vocab = v, .grammar_lazy = true, .grammar_trigger = TRIG };
        p.sample.temp = 1.0f;
        p.sample.top_k = 0;
        p.sample.top_p = 1.0f;
        p.sample.min_p = 0.0f;
        p.sample.seed = (uint64_t)seed;
        p.sample.n_bias = 1;
        p.sample.bias_id[0] = TRIG;  /* a random model would rarely open a call by itself */
        p.sample.bias[0] = 6.0f;
        int32_t out[64];
        sched_finish fin = SCHED_FINISH_NONE;
        int n = run_req(s, &p, out, 64, &fin);
        CHECK(n > 0);
        grammar_match *m = grammar_match_new(g, v, NULL, 0);
        bool on = false;
        for (int i = 0; i < n; i++) {
            if (!on) {
                if (out[i] == TRIG) on = true;
                else n_free_other += !strchr("{}abc", out[i]);
                continue;
            }
            CHECKF(grammar_match_accept(m, out[i]), "seed %d: token %d at %d leaves the grammar", seed, out[i], i);
            if (grammar_match_done(m)) {
                n_docs++;
                grammar_match_reset(m);
                on = false;
            }
        }
        if (on) CHECK(fin == SCHED_FINISH_LENGTH);  /* never ends inside a document */
        grammar_match_free(m);
    }
    CHECK(n_docs >= 4);         /* documents were opened and closed ... */
    CHECK(n_free_other >= 10);  /* ... between free text */
    /* a lazy grammar needs a trigger in the vocabulary */
    sched_params p = { .prompt = prompt, .n_prompt = 3, .sample = sample_params_default(), .max_tokens = 4,
                       .grammar = g, .grammar_vocab = v, .grammar_lazy = true, .grammar_trigger = 256 };
    sched_req *r;
    CHECK(sched_submit(s, &p, &r) == SCHED_ERR_ARG);
    grammar_free(g);
    /* nor may a grammar name a token the model does not have */
    g = compile(GRAMMAR_KIND_GBNF, "root ::= <[300]>\n", err);
    p.grammar = g;
    p.grammar_lazy = false;
    CHECK(g && sched_submit(s, &p, &r) == SCHED_ERR_ARG);
    grammar_free(g);
    sched_free(s);
    grammar_vocab_free(v);
}

/* With sampling workers, the masks of a step's constrained sequences are computed on them
 * while the engine computes the step: the same documents as computing them at sampling (the
 * one-thread engine, no workers), and valid ones. */
TEST(test_sched_masks_overlap_step)
{
    if (!tiny_setup()) {
        CHECK(false);
        return;
    }
    char err[256];
    engine *e2 = NULL;
    engine_opts eo = { .n_threads = 3, .n_kv_blocks = 16 };
    CHECK(engine_new(tm_model, &eo, &e2, err, sizeof err) == ENGINE_OK);
    if (!e2) return;
    grammar_vocab *v = byte_vocab(256);
    grammar *g = compile(GRAMMAR_KIND_REGEX, "\\{\"[a-z]{1,6}\": ([0-9]{1,3}|\"[a-c]*\")\\}", err);
    int32_t prompt[] = { 1, 2, 3 };
    enum { N = 4 };
    int32_t out[2][N][48];
    int n_out[2][N];
    for (int run = 0; run < 2; run++) {
        sched_opts so = { .max_seqs = N, .n_ctx = 256, .eos_ids = { 0, -1, -1, -1 } };
        sched *s;
        CHECK(sched_new(run ? e2 : tm_engine, &so, &s) == SCHED_OK);
        sched_req *r[N];
        for (int i = 0; i < N; i++) {  /* all in flight at once: one batch */
            sched_params p = { .prompt = prompt, .n_prompt = 3, .sample = sample_params_default(), .max_tokens = 40,
                               .grammar = g, .grammar_vocab = v };
            p.sample.temp = 1.0f;
            p.sample.top_k = 0;
            p.sample.top_p = 1.0f;
            p.sample.min_p = 0.0f;
            p.sample.seed = (uint64_t)(100 + i);
            CHECK(sched_submit(s, &p, &r[i]) == SCHED_OK);
        }
        for (int i = 0; i < N; i++) {
            n_out[run][i] = 0;
            sched_output o[8];
            while (!sched_done(r[i])) {
                int k = sched_poll(r[i], o, 8, 10000);
                for (int j = 0; j < k; j++)
                    if (o[j].kind != SCHED_OUT_FINISH && !o[j].is_stop && n_out[run][i] < 48)
                        out[run][i][n_out[run][i]++] = o[j].token;
            }
            sched_release(r[i]);
            char text[49];
            for (int j = 0; j < n_out[run][i]; j++) text[j] = (char)out[run][i][j];
            text[n_out[run][i]] = 0;
            CHECKF(accepts(g, text), "run %d seq %d: '%s'", run, i, text);
        }
        sched_free(s);
    }
    for (int i = 0; i < N; i++)
        CHECKF(n_out[0][i] == n_out[1][i] && !memcmp(out[0][i], out[1][i], (size_t)n_out[0][i] * sizeof(int32_t)),
               "seq %d differs between 1 and 3 threads", i);
    grammar_free(g);
    grammar_vocab_free(v);
    engine_free(e2);
}

TEST(test_sched_allow_all_grammar_changes_nothing)
{
    if (!tiny_setup()) {
        CHECK(false);
        return;
    }
    sched_opts so = { .max_seqs = 2, .n_ctx = 256, .eos_ids = { 0, -1, -1, -1 } };
    sched *s;
    CHECK(sched_new(tm_engine, &so, &s) == SCHED_OK);
    grammar_vocab *v = byte_vocab(256);
    char err[256];
    /* every byte string: single bytes 1..255 as one class per encoded length is not expressible
     * in GBNF's code point classes, so allow all ASCII and check the model stays in it */
    grammar *g = compile(GRAMMAR_KIND_GBNF, "root ::= [\\x01-\\x7F]*\n", err);
    int32_t prompt[] = { 5, 6, 7, 8 };
    for (int seed = 0; seed < 3; seed++) {
        sched_params p = { .prompt = prompt, .n_prompt = 4, .sample = sample_params_default(), .max_tokens = 60,
                           .ignore_eos = false };
        p.sample.temp = 0;
        p.sample.seed = (uint64_t)seed;
        prompt[0] = 5 + seed;
        int32_t a[64], b[64];
        sched_finish fa, fb;
        int na = run_req(s, &p, a, 64, &fa);
        bool ascii = true;
        for (int i = 0; i < na; i++) ascii &= a[i] > 0 && a[i] < 128;
        p.grammar = g;
        p.grammar_vocab = v;
        int nb = run_req(s, &p, b, 64, &fb);
        if (ascii) {
            CHECK(na == nb && fa == fb && !memcmp(a, b, (size_t)na * sizeof *a));
        } else {
            /* the constrained run equals the unconstrained one up to the first non-ASCII id */
            int k = 0;
            while (k < na && a[k] > 0 && a[k] < 128) k++;
            CHECK(nb >= k && !memcmp(a, b, (size_t)k * sizeof *a));
            for (int i = 0; i < nb; i++) CHECK(b[i] > 0 && b[i] < 128);
        }
    }
    grammar_free(g);
    sched_free(s);
    grammar_vocab_free(v);
}

/* Log-probs of a constrained request are those of the masked distribution: the tokens the
 * grammar rules out are no alternatives (a -inf log-prob is no JSON number), so the top list
 * holds only allowed tokens, all finite. */
TEST(test_sched_logprobs_masked)
{
    if (!tiny_setup()) {
        CHECK(false);
        return;
    }
    sched_opts so = { .max_seqs = 2, .n_ctx = 256, .eos_ids = { 0, -1, -1, -1 } };
    sched *s;
    CHECK(sched_new(tm_engine, &so, &s) == SCHED_OK);
    grammar_vocab *v = byte_vocab(256);
    char err[256];
    grammar *g = compile(GRAMMAR_KIND_REGEX, "x{3}[ab]", err);   /* one token, then two, then the end */
    int32_t prompt[] = { 1, 2, 3 };
    sched_params p = { .prompt = prompt, .n_prompt = 3, .sample = sample_params_default(), .max_tokens = 8,
                       .grammar = g, .grammar_vocab = v, .logprobs = true, .top_logprobs = 5 };
    p.sample.temp = 1.0f;
    p.sample.seed = 7;
    sched_req *r;
    CHECK(sched_submit(s, &p, &r) == SCHED_OK);
    sched_output o[16];
    int n = 0, k;
    while (!sched_done(r) && (k = sched_poll(r, o + n, 16 - n, 10000)) > 0) n += k;
    sched_release(r);
    CHECK(n == 6 && o[5].kind == SCHED_OUT_FINISH && o[5].finish == SCHED_FINISH_STOP);
    static const int allowed[5] = { 1, 1, 1, 2, 1 };  /* x x x [ab] end */
    for (int i = 0; i < n && i < 5; i++) {
        CHECKF(o[i].n_top == allowed[i], "token %d: %d alternatives", i, o[i].n_top);
        CHECK(isfinite(o[i].logprob) && o[i].logprob <= 0);
        for (int j = 0; j < o[i].n_top; j++) CHECK(isfinite(o[i].top[j].logprob) && o[i].top[j].logprob <= 0);
        if (allowed[i] == 1) CHECK(o[i].top[0].token == o[i].token && o[i].logprob == 0);
    }
    CHECK(o[0].token == 'x' && (o[3].token == 'a' || o[3].token == 'b') && o[4].token == 0 && o[4].is_stop);
    grammar_free(g);
    sched_free(s);
    grammar_vocab_free(v);
}

int main(void)
{
    RUN(test_gbnf_basics);
    RUN(test_gbnf_errors_name_the_problem);
    RUN(test_utf8_classes_are_byte_sequences);
    RUN(test_llama_cpp_json_gbnf);
    RUN(test_json_object_kind);
    RUN(test_regex_front_end);
    RUN(test_schema_objects_and_refs);
    RUN(test_schema_integer_ranges_exact);
    RUN(test_schema_unsupported_keywords_are_named);
    RUN(test_random_inputs_never_crash);
    RUN(test_token_masks_match_brute_force);
    RUN(test_token_masks_large_vocab_brute_force);
    RUN(test_token_terminals);
    RUN(test_grammars_combine_by_prefix);
    RUN(test_compile_cache_by_content);
    RUN(test_sched_constrains_sampling);
    RUN(test_sched_lazy_grammar);
    RUN(test_sched_masks_overlap_step);
    RUN(test_sched_allow_all_grammar_changes_nothing);
    RUN(test_sched_logprobs_masked);
    engine_free(tm_engine);
    model_free(tm_model);
    printf("%d passed, %d failed\n", harness_passed, harness_failed);
    return harness_failed ? 1 : 0;
}
