/*
 * fuzz_grammar: the structured-output compilers (GBNF, regex, JSON Schema) on text from the
 * input, under budgets small enough that every input ends fast and small (the budgets' own
 * checks are what is fuzzed: no input may pass them and then take the time or memory they
 * bound). A grammar that compiles is run over a few documents (the source itself and its
 * prefixes) and its rules are compiled again renamed by grammar_gbnf_prefix under a root that
 * calls them.
 *
 * Input: byte 0 picks the kind (mod 3: GBNF, regex, schema); the rest is the source.
 */
#include "fuzz.h"

#include "grammar/grammar.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    grammar_limits l = { .max_states = 1 << 16, .max_stacks = 512, .max_seconds = 2, .cache_bytes = 16 << 20 };
    grammar_limits_set(&l);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 16384) return 0;
    static const grammar_kind kinds[] = { GRAMMAR_KIND_GBNF, GRAMMAR_KIND_REGEX, GRAMMAR_KIND_SCHEMA };
    grammar_kind kind = kinds[data[0] % 3];
    const char *src = (const char *)data + 1;
    size_t len = size - 1;
    char err[512];
    grammar *g = NULL;
    grammar_status st = grammar_compile(kind, src, len, &g, err, sizeof err);
    if (st != GRAMMAR_OK) {
        if (g || !err[0]) fuzz_die("a failed compile", g ? "returned a grammar" : "said nothing");
        return 0;
    }
    for (size_t n = 0; n <= len && n < 256; n += 1 + n / 4) (void)grammar_accepts(g, src, n);
    (void)grammar_accepts(g, src, len < 4096 ? len : 4096);
    (void)grammar_bytes(g);
    grammar_free(g);
    /* the same rules, renamed, under a root that calls them */
    char *text = grammar_to_gbnf(kind, src, len, &st, err, sizeof err);
    if (!text) return 0;
    char *pre = grammar_gbnf_prefix(text, strlen(text), "f-");
    size_t n_pre = strlen(pre);
    char *both = xmalloc(n_pre + 32);
    int k = snprintf(both, 32, "root ::= f-root \"!\"\n");
    memcpy(both + k, pre, n_pre + 1);
    if (grammar_compile(GRAMMAR_KIND_GBNF, both, strlen(both), &g, err, sizeof err) == GRAMMAR_OK) {
        (void)grammar_accepts(g, "!", 1);
        grammar_free(g);
    }
    free(both);
    free(pre);
    free(text);
    return 0;
}
