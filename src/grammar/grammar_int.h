/*
 * grammar_int: what only src/grammar/grammar*.c see: the compiled form (grammar.c, built by
 * grammar_gbnf.c) and the byte-level pushdown automaton that grammar_pda.c implements and
 * grammar_match.c drives over the token trie.
 *
 * Compiled form (llama.cpp's flat encoding, at byte level): every rule is a run of elements
 * in el[], its alternatives separated by GRAMMAR_EL_ALT and closed by GRAMMAR_EL_END.
 * Elements are byte sets (index into sets[]), token terminals and references to rules. A
 * parser state is a SET of stacks; a stack is a list of element positions (bottom first), its
 * top the next terminal to match (a byte set or a token); the positions below it are where to
 * continue when the rule above ends. An empty stack means the document may end here. Stacks
 * only ever hold positions of terminals and rule references, and a set holds each distinct
 * stack once.
 */
#ifndef TM_GRAMMAR_INT_H
#define TM_GRAMMAR_INT_H

#include <pthread.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "util/jsonfmt.h"

/* TOKEN: a token terminal, matched by one token id and never by bytes (control tokens such
 * as a family's tool-call markers, which ordinary tokens could spell out as text). */
enum { GRAMMAR_EL_END = 0, GRAMMAR_EL_ALT, GRAMMAR_EL_RULE, GRAMMAR_EL_BYTES, GRAMMAR_EL_TOKEN };

typedef struct {
    uint32_t type;          /* GRAMMAR_EL_* */
    uint32_t v;             /* RULE: rule index; BYTES: index into sets; TOKEN: token id */
} grammar_el;

/* A set of stacks. data holds, per stack, its length then its positions (bottom first). */
typedef struct {
    uint32_t *data;         /* (cap_data) */
    int n_data, cap_data;
    uint32_t *off;          /* (cap_stacks) offset of each stack's length word in data */
    int n_stacks, cap_stacks;
    uint32_t *ht;           /* (ht_cap) stack index + 1, 0 = empty slot; dedupe table */
    uint32_t *ht_gen;       /* (ht_cap) generation of each slot; stale slots count as empty */
    uint32_t gen;           /* current generation (bumped by grammar_set_clear) */
    int ht_cap;             /* power of two */
} grammar_set;

/* A small direct-mapped cache of token masks per parser state, per grammar. */
typedef struct {
    uint64_t hash;          /* of the state's data */
    const void *vocab;      /* the grammar_vocab the mask is for */
    uint32_t *key;          /* (n_key) copy of the state's data words */
    int n_key;
    int n_stacks;
    uint32_t *mask;         /* (n_mask) words: n_vocab / 32 rounded up */
    int n_mask;
    int n_allowed;
} grammar_mask_entry;

#define GRAMMAR_MASK_CACHE 256   /* entries per grammar (power of two) */

/* How many top entries of a stack decide its context-independent tokens. */
#define GRAMMAR_CI_DEPTH 3

/* The tokens a single stack's top GRAMMAR_CI_DEPTH entries decide by themselves: those
 * accepted whatever lies below, and unc: those whose fate depends on the entries below,
 * because some path through their bytes pops past the top (as ranges of the vocabulary's
 * node-ordered token ids). Every other token is rejected whatever lies below. Most entries
 * accept few tokens (punctuation, keys, digits), so the accepted set is a list of ids when
 * that is smaller than a bitmask. */
typedef struct {
    uint64_t hash;
    uint32_t key[GRAMMAR_CI_DEPTH + 1];   /* the top entries, then 1 if the stack was longer */
    int n_key;                            /* 0: empty slot */
    uint32_t *mask;                       /* dense: (n_vocab / 32 rounded up) bits; or NULL */
    int32_t *ids;                         /* sparse: (n_ids) accepted token ids */
    int n_ids;
    uint32_t *unc;                        /* (2 * n_unc) [from, to) index ranges into toks */
    int n_unc;
} grammar_ci_entry;

/* The table of entries per grammar grows (open addressing) up to this many bytes of masks,
 * lists and ranges; past it, it starts over (a grammar whose stack tops never repeat). */
#define GRAMMAR_CI_BYTES (32u << 20)

struct grammar {
    int refs;                   /* atomic */
    grammar_el *el;             /* (n_el) all rules */
    int n_el;
    uint32_t *rule_start;       /* (n_rules) index in el of each rule's first element */
    int n_rules;
    uint32_t (*sets)[8];        /* (n_sets) 256-bit byte sets */
    int n_sets;
    int root;                   /* start rule */
    int32_t max_token;          /* largest token id a token terminal names; -1: none */
    grammar_set start;          /* the initial state */
    pthread_mutex_t mu;         /* guards the mask cache */
    grammar_mask_entry cache[GRAMMAR_MASK_CACHE];
    grammar_ci_entry *ci;       /* (ci_cap) per top of stack, open addressing, under mu */
    int ci_cap, ci_n;           /* slots (power of two, 0 before the first), used */
    size_t ci_bytes;            /* bytes held by the entries' masks, lists and ranges */
    const void *ci_vocab;       /* the grammar_vocab the entries are for */
    uint64_t n_hit;             /* masks found in the whole-state cache */
    uint64_t n_computed;        /* context-independent entries computed (trie walks) */
    uint64_t n_composed;        /* masks composed from ci entries (whole-state cache misses) */
    double walk_s;              /* seconds spent composing masks (walks included) */
};

/* Scratch for expanding stacks (grows as needed, kept between calls). Expansion is a loop
 * over a work list, never recursion, so a grammar's depth cannot reach the C stack. */
typedef struct {
    uint32_t *p;            /* (cap) the stacks: per stack its length then its positions */
    int n, cap;
    int *work;              /* (cap_work) offsets in p of the stacks still to expand */
    int n_work, cap_work;
    uint32_t *cur;          /* (cap_cur) the stack being expanded */
    int cap_cur;
    uint32_t *alt;          /* (cap_alt) its rule's alternatives' first positions */
    int cap_alt;
    grammar_set seen;       /* rule-topped stacks expanded in this step (used once a step's
                             * work passes GRAMMAR_DEDUPE_WORK: ambiguous nullable rules reach
                             * one stack by exponentially many paths) */
    long n_expanded;        /* stacks expanded in this step */
    bool truncated;         /* the last step stopped at a budget: past grammar_limits'
                             * max_stacks stacks, or GRAMMAR_WORK_PER_STACK times that work */
} grammar_scratch;

/* Work past which a step dedupes the stacks it expands (below it, hashing costs more than
 * the few repeats it saves). */
#define GRAMMAR_DEDUPE_WORK 512
/* A step's expansion work per stack it may keep. */
#define GRAMMAR_WORK_PER_STACK 64

void grammar_set_init(grammar_set *s);
void grammar_set_free(grammar_set *s);
void grammar_set_clear(grammar_set *s);
void grammar_set_copy(grammar_set *dst, const grammar_set *src);
bool grammar_set_accepting(const grammar_set *s);
/* Adds the stack stk[0..n) (bottom first) unless the set has it. */
void grammar_set_add(grammar_set *s, const uint32_t *stk, int n);
void grammar_scratch_free(grammar_scratch *sc);
/* out = the states after reading byte b in every stack of in (out cleared first). */
void grammar_step(const grammar *g, grammar_scratch *sc, const grammar_set *in, uint8_t b,
                  grammar_set *out);
/* out = the states after token terminal `token` in every stack of in (out cleared first);
 * stacks whose top is a byte set or another token die. */
void grammar_step_token(const grammar *g, grammar_scratch *sc, const grammar_set *in, int32_t token,
                        grammar_set *out);
uint64_t grammar_set_hash(const grammar_set *s);
/* Adds to out the expansion of the one-element stack {pos} (pos: a rule reference or a
 * terminal); sc->truncated says whether it stopped at max_stacks. */
void grammar_expand(const grammar *g, grammar_scratch *sc, grammar_set *out, uint32_t pos);

/* GBNF text -> compiled grammar, giving up past deadline (util_now()) or when cancelled;
 * grammar_compile's contract otherwise. */
grammar_status grammar_gbnf_compile(const char *src, size_t len, double deadline, grammar **out, char *err,
                                    size_t errsz);
/* Whether the calling thread's compile has been cancelled (grammar_cancel_set's hook). */
bool grammar_cancelled(void);

/* Front ends (GBNF text into a malloc'd string; NULL on error with err set). */
char *grammar_regex_to_gbnf(const char *re, size_t len, grammar_status *st, char *err, size_t errsz);
char *grammar_schema_to_gbnf(const char *json, size_t len, grammar_status *st, char *err, size_t errsz);
/* Appends to a GBNF text the rules of a regex as rule `name` (json_string: the regex describes
 * the decoded content of a JSON string, written with JSON escapes; search: unanchored ends
 * match anything, as JSON Schema's pattern does). Returns false with err set. */
bool grammar_regex_rule(bytebuf *t, const char *name, const char *re, size_t len,
                        bool json_string, bool search, grammar_status *st, char *err, size_t errsz);
/* printf into a growable buffer. */
void grammar_printf(bytebuf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
