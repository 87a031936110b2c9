/*
 * grammar_pda: the pushdown automaton over bytes: sets of parser stacks (deduplicated by a
 * generation-stamped hash table, so clearing a set is O(1)), the expansion of a stack whose
 * top is a rule reference into the stacks whose tops are terminals (a loop over a work list,
 * bounded by grammar_limits' max_stacks), and a step over one byte or one token terminal.
 * See grammar_int.h for the encoding.
 */
#include "grammar/grammar_int.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

void grammar_set_init(grammar_set *s)
{
    memset(s, 0, sizeof *s);
    s->gen = 1;
}

void grammar_set_free(grammar_set *s)
{
    free(s->data);
    free(s->off);
    free(s->ht);
    free(s->ht_gen);
    memset(s, 0, sizeof *s);
}

void grammar_set_clear(grammar_set *s)
{
    s->n_data = s->n_stacks = 0;
    if (++s->gen == 0) {  /* wrapped: really clear */
        if (s->ht_gen) memset(s->ht_gen, 0, (size_t)s->ht_cap * sizeof *s->ht_gen);
        s->gen = 1;
    }
}

static uint64_t grammar_hash_words(const uint32_t *w, int n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return h;
}

uint64_t grammar_set_hash(const grammar_set *s)
{
    return grammar_hash_words(s->data, s->n_data) ^ (uint64_t)s->n_stacks;
}

static void grammar_set_rehash(grammar_set *s, int cap)
{
    free(s->ht);
    free(s->ht_gen);
    s->ht_cap = cap;
    s->ht = xmalloc((size_t)cap * sizeof *s->ht);
    s->ht_gen = xcalloc((size_t)cap, sizeof *s->ht_gen);
    s->gen = 1;
    for (int i = 0; i < s->n_stacks; i++) {
        const uint32_t *w = s->data + s->off[i];
        uint64_t h = grammar_hash_words(w + 1, (int)w[0]);
        int j = (int)(h & (uint64_t)(cap - 1));
        while (s->ht_gen[j] == s->gen) j = (j + 1) & (cap - 1);
        s->ht_gen[j] = s->gen;
        s->ht[j] = (uint32_t)i + 1;
    }
}

/* Adds the stack stk[0..n) unless present. */
void grammar_set_add(grammar_set *s, const uint32_t *stk, int n)
{
    if (2 * (s->n_stacks + 1) > s->ht_cap) grammar_set_rehash(s, s->ht_cap ? 2 * s->ht_cap : 16);
    uint64_t h = grammar_hash_words(stk, n);
    int j = (int)(h & (uint64_t)(s->ht_cap - 1));
    while (s->ht_gen[j] == s->gen) {
        const uint32_t *w = s->data + s->off[s->ht[j] - 1];
        if ((int)w[0] == n && !memcmp(w + 1, stk, (size_t)n * sizeof *stk)) return;
        j = (j + 1) & (s->ht_cap - 1);
    }
    if (s->n_stacks == s->cap_stacks) {
        s->cap_stacks = s->cap_stacks ? 2 * s->cap_stacks : 16;
        s->off = xrealloc(s->off, (size_t)s->cap_stacks * sizeof *s->off);
    }
    if (s->n_data + n + 1 > s->cap_data) {
        s->cap_data = TM_MAX(2 * s->cap_data, s->n_data + n + 64);
        s->data = xrealloc(s->data, (size_t)s->cap_data * sizeof *s->data);
    }
    s->ht_gen[j] = s->gen;
    s->ht[j] = (uint32_t)s->n_stacks + 1;
    s->off[s->n_stacks++] = (uint32_t)s->n_data;
    s->data[s->n_data++] = (uint32_t)n;
    memcpy(s->data + s->n_data, stk, (size_t)n * sizeof *stk);
    s->n_data += n;
}

void grammar_set_copy(grammar_set *dst, const grammar_set *src)
{
    grammar_set_clear(dst);
    for (int i = 0; i < src->n_stacks; i++) {
        const uint32_t *w = src->data + src->off[i];
        grammar_set_add(dst, w + 1, (int)w[0]);
    }
}

bool grammar_set_accepting(const grammar_set *s)
{
    for (int i = 0; i < s->n_stacks; i++)
        if (s->data[s->off[i]] == 0) return true;
    return false;
}

void grammar_scratch_free(grammar_scratch *sc)
{
    free(sc->p);
    free(sc->work);
    free(sc->cur);
    free(sc->alt);
    grammar_set_free(&sc->seen);
    memset(sc, 0, sizeof *sc);
}

static uint32_t *grammar_scratch_push(grammar_scratch *sc, int n)
{
    if (sc->n + n > sc->cap) {
        sc->cap = TM_MAX(2 * sc->cap, sc->n + n + 256);
        sc->p = xrealloc(sc->p, (size_t)sc->cap * sizeof *sc->p);
    }
    uint32_t *r = sc->p + sc->n;
    sc->n += n;
    return r;
}

static bool grammar_el_ends(const grammar *g, uint32_t pos)
{
    return g->el[pos].type == GRAMMAR_EL_END || g->el[pos].type == GRAMMAR_EL_ALT;
}

/* A step starts: no work done, nothing seen. */
static void grammar_scratch_begin(grammar_scratch *sc)
{
    sc->n_expanded = 0;
    sc->truncated = false;
    grammar_set_clear(&sc->seen);
}

/* Appends stk[0..n) to the work list (stk may point into sc->p). */
static void grammar_work_push(grammar_scratch *sc, const uint32_t *stk, int n)
{
    size_t stk_off = (size_t)-1;
    if (sc->p && stk >= sc->p && stk < sc->p + sc->cap) stk_off = (size_t)(stk - sc->p);
    int at = sc->n;
    uint32_t *w = grammar_scratch_push(sc, n + 1);
    if (stk_off != (size_t)-1) stk = sc->p + stk_off;
    w[0] = (uint32_t)n;
    memmove(w + 1, stk, (size_t)n * sizeof *w);
    if (sc->n_work == sc->cap_work) {
        sc->cap_work = sc->cap_work ? 2 * sc->cap_work : 64;
        sc->work = xrealloc(sc->work, (size_t)sc->cap_work * sizeof *sc->work);
    }
    sc->work[sc->n_work++] = at;
}

/* Adds to out every stack that stk[0..n) expands to: a rule reference on top is replaced by
 * each of its alternatives (with the position after the reference below it), until a byte
 * set is on top or the stack is empty. Terminates because left recursion was refused.
 * A loop over a work list in sc, depth first in the order of the alternatives (the order a
 * recursion would add them in). The step's budgets (grammar_limits' max_stacks in out,
 * GRAMMAR_WORK_PER_STACK times that expansions) stop it with sc->truncated set; past
 * GRAMMAR_DEDUPE_WORK a rule-topped stack met before in the step is not expanded again. */
static void grammar_expand_into(const grammar *g, grammar_scratch *sc, grammar_set *out, const uint32_t *stk,
                                int n)
{
    long max_stacks = grammar_limits_get().max_stacks, max_work = max_stacks * GRAMMAR_WORK_PER_STACK;
    int base = sc->n, work0 = sc->n_work;
    grammar_work_push(sc, stk, n);
    while (sc->n_work > work0 && !sc->truncated) {
        int o = sc->work[--sc->n_work];
        int k = (int)sc->p[o];
        const uint32_t *w = sc->p + o + 1;
        if (k == 0 || g->el[w[k - 1]].type != GRAMMAR_EL_RULE) {  /* a terminal on top */
            if (out->n_stacks >= max_stacks) sc->truncated = true;
            else grammar_set_add(out, w, k);
            sc->n = o;
            continue;
        }
        if (++sc->n_expanded > max_work) {
            sc->truncated = true;
            break;
        }
        if (sc->n_expanded > GRAMMAR_DEDUPE_WORK) {
            int seen = sc->seen.n_stacks;
            grammar_set_add(&sc->seen, w, k);
            if (sc->seen.n_stacks == seen) {
                sc->n = o;
                continue;
            }
        }
        /* the popped stack is the last thing in sc->p (the work list's data is in the order
         * of the list): its children overwrite it, so it moves to cur first */
        if (k + 1 > sc->cap_cur) {
            sc->cap_cur = TM_MAX(2 * sc->cap_cur, k + 64);
            sc->cur = xrealloc(sc->cur, (size_t)sc->cap_cur * sizeof *sc->cur);
        }
        memcpy(sc->cur, w, (size_t)k * sizeof *sc->cur);
        sc->n = o;
        uint32_t pos = sc->cur[k - 1];
        int kb = k - 1;
        if (!grammar_el_ends(g, pos + 1)) sc->cur[kb++] = pos + 1;
        /* the alternatives' starts, then pushed last first: the first is expanded first */
        int n_alt = 0;
        for (uint32_t a = g->rule_start[g->el[pos].v];; a++) {
            if (n_alt == sc->cap_alt) {
                sc->cap_alt = sc->cap_alt ? 2 * sc->cap_alt : 64;
                sc->alt = xrealloc(sc->alt, (size_t)sc->cap_alt * sizeof *sc->alt);
            }
            sc->alt[n_alt++] = a;
            while (!grammar_el_ends(g, a)) a++;
            if (g->el[a].type == GRAMMAR_EL_END) break;
        }
        for (int i = n_alt - 1; i >= 0; i--) {
            uint32_t a = sc->alt[i];
            int len = kb;
            if (!grammar_el_ends(g, a)) sc->cur[len++] = a;
            grammar_work_push(sc, sc->cur, len);
        }
    }
    sc->n = base;
    sc->n_work = work0;
}

void grammar_expand(const grammar *g, grammar_scratch *sc, grammar_set *out, uint32_t pos)
{
    grammar_scratch_begin(sc);
    grammar_expand_into(g, sc, out, &pos, 1);
}

/* out = the stacks of in whose top terminal matches (byte x of a byte set, or token x of a
 * token terminal), advanced past it and expanded. */
static void grammar_advance(const grammar *g, grammar_scratch *sc, const grammar_set *in, uint32_t type, uint32_t x,
                            grammar_set *out)
{
    grammar_set_clear(out);
    grammar_scratch_begin(sc);
    for (int i = 0; i < in->n_stacks && !sc->truncated; i++) {
        const uint32_t *w = in->data + in->off[i];
        int n = (int)w[0];
        if (n == 0) continue;
        uint32_t pos = w[n];
        const grammar_el *e = &g->el[pos];
        if (e->type != type) continue;
        if (type == GRAMMAR_EL_BYTES ? !(g->sets[e->v][x >> 5] >> (x & 31) & 1) : e->v != x) continue;
        int base = sc->n;
        uint32_t *t = grammar_scratch_push(sc, n);
        w = in->data + in->off[i];
        memcpy(t, w + 1, (size_t)(n - 1) * sizeof *t);
        int k = n - 1;
        if (!grammar_el_ends(g, pos + 1)) t[k++] = pos + 1;
        grammar_expand_into(g, sc, out, sc->p + base, k);
        sc->n = base;
    }
}

void grammar_step(const grammar *g, grammar_scratch *sc, const grammar_set *in, uint8_t b,
                  grammar_set *out)
{
    grammar_advance(g, sc, in, GRAMMAR_EL_BYTES, b, out);
}

void grammar_step_token(const grammar *g, grammar_scratch *sc, const grammar_set *in, int32_t token,
                        grammar_set *out)
{
    if (token < 0) grammar_set_clear(out);
    else grammar_advance(g, sc, in, GRAMMAR_EL_TOKEN, (uint32_t)token, out);
}

bool grammar_accepts(const grammar *g, const char *doc, size_t len)
{
    grammar_set a, b;
    grammar_set_init(&a);
    grammar_set_init(&b);
    grammar_scratch sc = { 0 };
    grammar_set_copy(&a, &g->start);
    grammar_set *cur = &a, *nxt = &b;
    for (size_t i = 0; i < len && cur->n_stacks; i++) {
        grammar_step(g, &sc, cur, (uint8_t)doc[i], nxt);
        grammar_set *t = cur;
        cur = nxt;
        nxt = t;
    }
    bool ok = grammar_set_accepting(cur);
    grammar_set_free(&a);
    grammar_set_free(&b);
    grammar_scratch_free(&sc);
    return ok;
}
