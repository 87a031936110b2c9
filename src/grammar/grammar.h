/*
 * grammar: structured output. One grammar form (llama.cpp's GBNF: rules of alternatives of
 * literals, character classes, rule references and repetitions) that three front ends compile
 * into: GBNF text itself (llama.cpp's grammars directory loads), regular expressions
 * (grammar_regex.c) and JSON Schema (grammar_schema.c); the latter two emit GBNF text, so
 * `tokenmill grammar print` shows what a schema became.
 *
 * A compiled grammar works on BYTES: character classes are expanded into UTF-8 byte-range
 * sequences at compile time, so a token that ends in the middle of a character (byte-fallback
 * and byte-level BPE tokens do) is matched as far as its bytes go. Token terminals (`<[ID]>`,
 * llama.cpp's syntax) match one token id and never bytes: a family's control tokens (tool-call
 * markers) are written by id, and ordinary tokens spelling the same text do not match them. Matching is a pushdown
 * automaton over those bytes (a set of stacks of grammar positions, llama.cpp's scheme at
 * byte level); grammar_match.c lifts it to tokens with a trie over the vocabulary's token
 * bytes (a token may cross any number of terminals) and caches the token mask of each parser
 * state per grammar, so that the states a generation keeps returning to (inside a string,
 * between members) cost one lookup.
 *
 * A grammar is immutable after compilation and reference counted; matchers (one per
 * sequence) hold a reference. grammar_cache_* keys compiled grammars by the SHA-256 of their
 * kind and source, so the same schema sent by many requests is compiled once.
 */
#ifndef TM_GRAMMAR_H
#define TM_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    GRAMMAR_OK = 0,
    GRAMMAR_ERR_SYNTAX,        /* the GBNF / regex / JSON text does not parse */
    GRAMMAR_ERR_UNSUPPORTED,   /* a JSON Schema keyword or regex feature the compiler refuses */
    GRAMMAR_ERR_INVALID,       /* undefined rule, no root, left recursion, empty language */
    GRAMMAR_ERR_LIMIT,         /* past a compile budget (grammar_limits): the message names it */
} grammar_status;

typedef enum {
    GRAMMAR_KIND_GBNF = 0,     /* llama.cpp GBNF text, start rule "root" */
    GRAMMAR_KIND_REGEX,        /* a regular expression, matched in full */
    GRAMMAR_KIND_SCHEMA,       /* a JSON Schema (JSON text) */
    GRAMMAR_KIND_JSON,         /* a JSON object (response_format json_object); src unused */
} grammar_kind;

typedef struct grammar grammar;

const char *grammar_status_name(grammar_status st);

/* What one grammar may cost, process-wide (set once before serving; compiles read it). Each
 * is checked as the compile goes, so a hostile grammar stops at the limit, not after it: */
typedef struct {
    long max_states;        /* compiled elements (the automaton's positions, helper rules'
                             * included); a counted repetition past a few dozen costs
                             * O(log count) of them, not count */
    long max_stacks;        /* parser stacks one state may hold: the start state and what any
                             * rule reference expands to are checked at compile; a state that
                             * grows past it while matching keeps its first max_stacks stacks */
    double max_seconds;     /* wall time of one compile */
    size_t cache_bytes;     /* what a grammar_cache may hold: compiled size plus each grammar's
                             * mask memos, measured on every lookup */
} grammar_limits;

#define GRAMMAR_DEFAULT_MAX_STATES   (1L << 20)
#define GRAMMAR_DEFAULT_MAX_STACKS   4096L
#define GRAMMAR_DEFAULT_MAX_SECONDS  5.0
#define GRAMMAR_DEFAULT_CACHE_BYTES  ((size_t)256 << 20)

/* Fields <= 0 keep the default. */
void grammar_limits_set(const grammar_limits *l);
grammar_limits grammar_limits_get(void);

/* Compiles on the calling thread poll fn(ctx) as they go (at their first rule, then about
 * every GRAMMAR_CANCEL_POLL_S); when it returns true the compile stops with GRAMMAR_ERR_LIMIT
 * ("cancelled") and frees what it built. A server sets it around a request's compile to
 * "has the client gone"; NULL clears it. Per thread. */
typedef bool (*grammar_cancel_fn)(void *ctx);
void grammar_cancel_set(grammar_cancel_fn fn, void *ctx);
#define GRAMMAR_CANCEL_POLL_S 0.01

/* Compiles src[0..len) of the given kind. On error returns non-OK, *out NULL and a one-line
 * message in err (naming the offending keyword / rule / position). */
grammar_status grammar_compile(grammar_kind kind, const char *src, size_t len, grammar **out,
                               char *err, size_t errsz);
/* The GBNF text a regex / schema compiles to (GBNF and JSON kinds: the text itself / the JSON
 * grammar). malloc'd, NULL on error with err set. */
char *grammar_to_gbnf(grammar_kind kind, const char *src, size_t len, grammar_status *st,
                      char *err, size_t errsz);

/* GBNF text with every rule name prefixed (literals, classes, comments and repetition counts
 * untouched), so that grammars can be combined: e.g. each tool's argument schema as
 * "t1-root", "t2-root" under a root that writes the model family's tool-call syntax around
 * them. malloc'd. */
char *grammar_gbnf_prefix(const char *gbnf, size_t len, const char *prefix);

grammar *grammar_ref(grammar *g);
/* Drops a reference; the last one frees. NULL is ignored. */
void grammar_free(grammar *g);
/* Whether the whole of doc[0..len) is in the grammar's language. */
bool grammar_accepts(const grammar *g, const char *doc, size_t len);
/* Rules and byte sets after expansion (statistics, tests). */
int grammar_n_rules(const grammar *g);
/* Compiled elements (what max_states counts). */
int grammar_n_states(const grammar *g);
/* Bytes the grammar holds now: its compiled form and the masks memoised so far. */
size_t grammar_bytes(grammar *g);
/* The largest token id a token terminal (<[ID]>) of the grammar names; -1 when it has none.
 * A grammar for a vocabulary must name only ids below its size (the caller checks). */
int32_t grammar_max_token(const grammar *g);

/* ---- compile cache ------------------------------------------------------------------- */
typedef struct grammar_cache grammar_cache;
/* Keeps at most max_entries compiled grammars and at most grammar_limits' cache_bytes of them
 * (grammar_bytes, memos included; least recently used dropped; a grammar larger than the
 * whole budget is returned but not kept). Thread-safe. */
grammar_cache *grammar_cache_new(int max_entries);
void grammar_cache_free(grammar_cache *c);
/* grammar_compile through the cache: a hit returns a new reference to the grammar compiled
 * before for the same kind and bytes. Errors are not cached. */
grammar_status grammar_cache_get(grammar_cache *c, grammar_kind kind, const char *src, size_t len,
                                 grammar **out, char *err, size_t errsz);
/* Compilations performed (misses) and hits, for tests and metrics. */
void grammar_cache_stats(grammar_cache *c, uint64_t *n_compiled, uint64_t *n_hits);
/* Entries held and their bytes (measured now, after dropping what no longer fits). */
void grammar_cache_usage(grammar_cache *c, int *n_entries, size_t *bytes);

/* ---- token level (grammar_match.c) --------------------------------------------------- */
/* The vocabulary as bytes: a trie over every token's decoded bytes. Tokens with no bytes
 * (control tokens) are allowed only by the grammar's token terminals and as the stop ids a
 * matcher is given. */
typedef struct grammar_vocab grammar_vocab;
/* bytes[i] / lens[i]: token i's decoded bytes (copied); lens[i] 0 for a token that only token
 * terminals match. The grammar knows no tokenizer: recipe/ builds these arrays from a model's
 * vocabulary (tokenizer_grammar_vocab). */
grammar_vocab *grammar_vocab_new(int n_vocab, const char *const *bytes, const int *lens);
void grammar_vocab_free(grammar_vocab *v);
int grammar_vocab_n(const grammar_vocab *v);

/* One sequence's position in a grammar. Everything a step needs is allocated here, so
 * grammar_match_mask and grammar_match_accept allocate nothing once the buffers reached the
 * sizes the grammar needs (they grow on the first steps of a deep document only). Not
 * thread-safe: one thread at a time per matcher (different matchers of one grammar may run
 * on different threads). */
typedef struct grammar_match grammar_match;
/* stop_ids: tokens that end generation; they are allowed exactly when the bytes so far are a
 * complete document. Holds references to g; v must outlive the matcher. */
grammar_match *grammar_match_new(grammar *g, const grammar_vocab *v, const int32_t *stop_ids,
                                 int n_stop);
void grammar_match_free(grammar_match *m);
/* The allowed tokens now: bit i of mask[i / 32] (n_vocab bits). Returns the count allowed.
 * When nothing can follow (a dead end the grammar let the model reach), the stop ids are
 * allowed, so generation ends instead of hanging. */
int grammar_match_mask(grammar_match *m, uint32_t *mask);
/* Sets logits[i] = -INFINITY for every token the mask does not allow (n_vocab floats). */
void grammar_match_apply(grammar_match *m, float *logits);
/* Advances over a chosen token (over its bytes, or as a token terminal, or both where both
 * paths exist). Returns false (state unchanged) if the token is not allowed. */
bool grammar_match_accept(grammar_match *m, int32_t token);
/* A new matcher of m's grammar, vocabulary and stop ids at m's position (speculative
 * decoding checks drafted tokens on it without moving m). */
grammar_match *grammar_match_clone(const grammar_match *m);
/* Moves dst, a matcher of the same grammar and vocabulary, to src's position. */
void grammar_match_copy_state(grammar_match *dst, const grammar_match *src);
/* True when the bytes accepted so far form a complete document. */
bool grammar_match_complete(const grammar_match *m);
/* True when the document is complete and nothing can continue it (every path ended). */
bool grammar_match_done(const grammar_match *m);
/* Back to the grammar's start, for the next document (the memos are kept). */
void grammar_match_reset(grammar_match *m);
/* Mask cache statistics of the grammar: lookups that hit, masks computed, and the seconds
 * the computed ones took (walk_s may be NULL). */
void grammar_match_stats(const grammar *g, uint64_t *n_hit, uint64_t *n_computed, double *walk_s);

#endif
