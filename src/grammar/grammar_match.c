/*
 * grammar_match: token-level matching of a byte grammar. See grammar.h.
 *
 * The vocabulary is a trie over token bytes, stored in depth-first order: node i has its
 * byte, its depth and skip[i], the index after its subtree. Computing a mask walks the
 * nodes in order, keeping one parser state per depth: node i's state is its parent's state
 * stepped over byte[i]; when it is empty the whole subtree is skipped (no token with that
 * prefix can be allowed), else the tokens ending at node i are allowed. The work is thus
 * proportional to the number of allowed token prefixes, not to the vocabulary.
 *
 * A grammar keeps a direct-mapped cache of masks keyed by parser state (its exact stack
 * set). Structured documents return to the same states over and over (inside a string, after
 * a comma at the same depth), so after the first few tokens most steps are a lookup and a
 * copy of n_vocab / 8 bytes. The cache is shared by every sequence using the grammar (under
 * the grammar's mutex; a miss computes outside it).
 */
#include "grammar/grammar_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

struct grammar_vocab {
    int n_vocab;
    int n_nodes;
    uint8_t *byte;          /* (n_nodes) the byte leading to node i */
    uint16_t *depth;        /* (n_nodes) 1 for children of the root */
    uint32_t *skip;         /* (n_nodes) index after node i's subtree */
    uint32_t *tok_off;      /* (n_nodes + 1) node i's tokens are toks[tok_off[i] .. tok_off[i+1]) */
    int32_t *toks;          /* token ids ordered by node */
    int max_depth;          /* longest token in bytes */
    uint8_t *bytes;         /* all tokens' bytes, concatenated */
    uint32_t *off;          /* (n_vocab + 1) token i's bytes are bytes[off[i] .. off[i+1]) */
};

struct grammar_match {
    grammar *g;
    const grammar_vocab *v;
    grammar_set cur;        /* state after the accepted tokens */
    grammar_set *lv;        /* (v->max_depth + 1) per-depth states of the trie walk */
    grammar_set tmp;        /* accept's double buffer */
    grammar_scratch sc;
    uint32_t *mask;         /* (n_words) the last mask computed */
    int n_words;
    int n_allowed;
    bool mask_valid;        /* mask is the one for cur */
    int32_t *stop;          /* (n_stop) */
    int n_stop;
    /* A memo of the byte-level automaton as a DFA: the parser states met in walks, interned,
     * with their transitions filled in as they are taken. A walk then costs one table lookup
     * per trie node once its states are known (inside a string, every character leads back
     * to the same state). Reset when it grows past GRAMMAR_DFA_MAX states, at a walk's start,
     * and never above GRAMMAR_DFA_HARD (a walk then goes on with plain sets);
     * the sets keep their buffers, so a warm matcher allocates nothing. */
    grammar_set *ds;        /* (cap_ds) interned states, n_ds used */
    int n_ds, cap_ds;
    int32_t *dt;            /* (cap_ds, 256) next state id, GRAMMAR_DFA_DEAD or _UNKNOWN */
    uint8_t *dacc;          /* (cap_ds) the state holds an empty stack */
    uint32_t *dh;           /* (dh_cap) open addressing: state id + 1, 0 = empty */
    int dh_cap;
    int32_t *lvid;          /* (max_depth + 1) state id per trie depth during a walk */
    uint8_t *lctx;          /* (max_depth + 1) some path below the walk's stack top so far */
    uint8_t *lraw;          /* (max_depth + 1) the state at this depth is lv[d], not lvid[d] */
    grammar_set one;        /* a single (truncated) stack, for the context-independent walk */
    uint32_t *unc;          /* (2 * n_unc) the current mask's undecided token ranges */
    int n_unc, cap_unc;
};

/* MAX: reset at a walk's start beyond it; HARD: never more states (1 KiB of transitions
 * each): past it a walk goes on with plain sets (GRAMMAR_DFA_FULL), for grammars whose
 * states do not repeat. */
enum { GRAMMAR_DFA_UNKNOWN = -1, GRAMMAR_DFA_DEAD = -2, GRAMMAR_DFA_FULL = -3, GRAMMAR_DFA_MAX = 2048,
       GRAMMAR_DFA_HARD = 4096 };

/* ---- vocabulary trie ----------------------------------------------------------------- */

static const grammar_vocab *grammar_sort_vocab;  /* qsort context (build time only) */

static int grammar_cmp_tok(const void *a, const void *b)
{
    const grammar_vocab *v = grammar_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], TM_MIN(lx, ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : 1;
}

grammar_vocab *grammar_vocab_new(int n_vocab, const char *const *bytes, const int *lens)
{
    static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
    grammar_vocab *v = xcalloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->off = xmalloc((size_t)(n_vocab + 1) * sizeof *v->off);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++) total += (size_t)(lens[i] > 0 ? lens[i] : 0);
    v->bytes = xmalloc(total + 1);
    size_t k = 0;
    int n_text = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)k;
        if (lens[i] > 0) {
            memcpy(v->bytes + k, bytes[i], (size_t)lens[i]);
            k += (size_t)lens[i];
            n_text++;
            v->max_depth = TM_MAX(v->max_depth, lens[i]);
        }
    }
    v->off[n_vocab] = (uint32_t)k;
    int32_t *ids = xmalloc((size_t)(n_text ? n_text : 1) * sizeof *ids);
    int m = 0;
    for (int i = 0; i < n_vocab; i++)
        if (lens[i] > 0) ids[m++] = i;
    pthread_mutex_lock(&sort_mu);
    grammar_sort_vocab = v;
    qsort(ids, (size_t)m, sizeof *ids, grammar_cmp_tok);
    pthread_mutex_unlock(&sort_mu);
    /* nodes: at most one per byte of the sorted tokens */
    size_t cap = total + 1;
    v->byte = xmalloc(cap);
    v->depth = xmalloc(cap * sizeof *v->depth);
    v->skip = xmalloc(cap * sizeof *v->skip);
    v->tok_off = xmalloc((cap + 1) * sizeof *v->tok_off);
    v->toks = ids;
    uint32_t *path = xmalloc((size_t)(v->max_depth + 1) * sizeof *path);  /* node per depth */
    uint32_t *cnt = xcalloc(cap + 1, sizeof *cnt);  /* tokens ending at each node */
    int plen = 0, n = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (int t = 0; t < m; t++) {
        const uint8_t *b = v->bytes + v->off[ids[t]];
        uint32_t len = v->off[ids[t] + 1] - v->off[ids[t]];
        uint32_t common = 0;
        while (prev && common < len && common < prev_len && b[common] == prev[common]) common++;
        while ((uint32_t)plen > common) v->skip[path[--plen]] = (uint32_t)n;  /* close subtrees */
        for (uint32_t d = common; d < len; d++) {
            v->byte[n] = b[d];
            v->depth[n] = (uint16_t)(d + 1);
            path[plen++] = (uint32_t)n++;
        }
        cnt[path[len - 1]]++;
        prev = b;
        prev_len = len;
    }
    while (plen > 0) v->skip[path[--plen]] = (uint32_t)n;
    v->n_nodes = n;
    /* sorted order is the trie's preorder (a prefix sorts before its extensions), so the
     * tokens of node i are the next cnt[i] entries of ids */
    uint32_t acc = 0;
    for (int i = 0; i < n; i++) {
        v->tok_off[i] = acc;
        acc += cnt[i];
    }
    v->tok_off[n] = acc;
    free(cnt);
    free(path);
    return v;
}

void grammar_vocab_free(grammar_vocab *v)
{
    if (!v) return;
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tok_off);
    free(v->toks);
    free(v->bytes);
    free(v->off);
    free(v);
}

int grammar_vocab_n(const grammar_vocab *v)
{
    return v->n_vocab;
}

/* ---- matcher ------------------------------------------------------------------------- */

grammar_match *grammar_match_new(grammar *g, const grammar_vocab *v, const int32_t *stop_ids,
                                 int n_stop)
{
    grammar_match *m = xcalloc(1, sizeof *m);
    m->g = grammar_ref(g);
    m->v = v;
    grammar_set_init(&m->cur);
    grammar_set_init(&m->tmp);
    grammar_set_copy(&m->cur, &g->start);
    m->lv = xcalloc((size_t)v->max_depth + 2, sizeof *m->lv);
    m->lvid = xcalloc((size_t)v->max_depth + 1, sizeof *m->lvid);
    m->lctx = xcalloc((size_t)v->max_depth + 1, sizeof *m->lctx);
    m->lraw = xcalloc((size_t)v->max_depth + 2, sizeof *m->lraw);
    grammar_set_init(&m->one);
    for (int i = 0; i <= v->max_depth + 1; i++) grammar_set_init(&m->lv[i]);
    m->n_words = (v->n_vocab + 31) / 32;
    m->mask = xcalloc((size_t)m->n_words, sizeof *m->mask);
    m->stop = xmalloc((size_t)(n_stop > 0 ? n_stop : 1) * sizeof *m->stop);
    for (int i = 0; i < n_stop; i++)
        if (stop_ids[i] >= 0 && stop_ids[i] < v->n_vocab) m->stop[m->n_stop++] = stop_ids[i];
    return m;
}

void grammar_match_free(grammar_match *m)
{
    if (!m) return;
    for (int i = 0; i <= m->v->max_depth + 1; i++) grammar_set_free(&m->lv[i]);
    free(m->lv);
    free(m->lvid);
    free(m->lctx);
    free(m->lraw);
    free(m->dacc);
    free(m->unc);
    grammar_set_free(&m->one);
    for (int i = 0; i < m->cap_ds; i++) grammar_set_free(&m->ds[i]);
    free(m->ds);
    free(m->dt);
    free(m->dh);
    grammar_set_free(&m->cur);
    grammar_set_free(&m->tmp);
    grammar_scratch_free(&m->sc);
    free(m->mask);
    free(m->stop);
    grammar_free(m->g);
    free(m);
}

bool grammar_match_complete(const grammar_match *m)
{
    return grammar_set_accepting(&m->cur);
}

static bool grammar_set_equal(const grammar_set *a, const grammar_set *b)
{
    return a->n_stacks == b->n_stacks && a->n_data == b->n_data &&
           !memcmp(a->data, b->data, (size_t)a->n_data * sizeof *a->data);
}

/* Bits set in w[0..n). By hand (SWAR, 64 bits at a time): without -mpopcnt the builtin is a
 * library call per word, which dominated a mask over a 150k vocabulary. */
static int grammar_popcount(const uint32_t *w, int n)
{
    int total = 0, i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t x = (uint64_t)w[i] | (uint64_t)w[i + 1] << 32;
        if (!x) continue;
        x -= (x >> 1) & 0x5555555555555555ull;
        x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
        x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
        total += (int)((x * 0x0101010101010101ull) >> 56);
    }
    for (; i < n; i++)
        for (uint32_t x = w[i]; x; x &= x - 1) total++;
    return total;
}

/* The id of state s in the DFA memo, adding it if new. */
static int32_t grammar_dfa_intern(grammar_match *m, const grammar_set *s)
{
    if (2 * (m->n_ds + 1) > m->dh_cap) {
        int cap = m->dh_cap ? 2 * m->dh_cap : 256;
        free(m->dh);
        m->dh = xcalloc((size_t)cap, sizeof *m->dh);
        m->dh_cap = cap;
        for (int i = 0; i < m->n_ds; i++) {
            uint64_t h = grammar_set_hash(&m->ds[i]);
            int j = (int)(h & (uint64_t)(cap - 1));
            while (m->dh[j]) j = (j + 1) & (cap - 1);
            m->dh[j] = (uint32_t)i + 1;
        }
    }
    uint64_t h = grammar_set_hash(s);
    int j = (int)(h & (uint64_t)(m->dh_cap - 1));
    while (m->dh[j]) {
        if (grammar_set_equal(&m->ds[m->dh[j] - 1], s)) return (int32_t)m->dh[j] - 1;
        j = (j + 1) & (m->dh_cap - 1);
    }
    if (m->n_ds == m->cap_ds) {
        int cap = m->cap_ds ? 2 * m->cap_ds : 64;
        m->ds = xrealloc(m->ds, (size_t)cap * sizeof *m->ds);
        for (int i = m->cap_ds; i < cap; i++) grammar_set_init(&m->ds[i]);
        m->dt = xrealloc(m->dt, (size_t)cap * 256 * sizeof *m->dt);
        m->dacc = xrealloc(m->dacc, (size_t)cap);
        m->cap_ds = cap;
    }
    int32_t id = m->n_ds++;
    grammar_set_copy(&m->ds[id], s);
    m->dacc[id] = grammar_set_accepting(s);
    for (int b = 0; b < 256; b++) m->dt[(size_t)id * 256 + (size_t)b] = GRAMMAR_DFA_UNKNOWN;
    m->dh[j] = (uint32_t)id + 1;
    return id;
}

/* The state after byte b from state id (memoised); GRAMMAR_DFA_FULL when it is new and the
 * memo is full: the state is then in m->tmp. */
static inline int32_t grammar_dfa_next(grammar_match *m, int32_t id, uint8_t b)
{
    int32_t to = m->dt[(size_t)id * 256 + b];
    if (to == GRAMMAR_DFA_UNKNOWN) {
        grammar_step(m->g, &m->sc, &m->ds[id], b, &m->tmp);
        if (m->tmp.n_stacks && m->n_ds >= GRAMMAR_DFA_HARD) return GRAMMAR_DFA_FULL;
        to = m->tmp.n_stacks ? grammar_dfa_intern(m, &m->tmp) : GRAMMAR_DFA_DEAD;
        m->dt[(size_t)id * 256 + b] = to;  /* (after intern: dt may have moved) */
    }
    return to;
}

/* Whether token t's bytes continue state id. */
static bool grammar_dfa_token(grammar_match *m, int32_t id, int32_t t)
{
    const grammar_vocab *v = m->v;
    uint32_t b = v->off[t], e = v->off[t + 1];
    for (; b < e; b++) {
        id = grammar_dfa_next(m, id, v->bytes[b]);
        if (id == GRAMMAR_DFA_DEAD) return false;
        if (id == GRAMMAR_DFA_FULL) break;
    }
    if (b == e) return true;
    /* the memo is full: the rest on plain sets */
    grammar_set *cur = &m->lv[0], *nxt = &m->lv[1];
    grammar_set_copy(cur, &m->tmp);
    for (b++; b < e; b++) {
        grammar_step(m->g, &m->sc, cur, v->bytes[b], nxt);
        if (!nxt->n_stacks) return false;
        grammar_set *x = cur;
        cur = nxt;
        nxt = x;
    }
    return true;
}

/* The trie walk from state set: the tokens it accepts into mask (cleared first). With
 * truncated (set is the top of a longer stack), an empty stack means "continues below the
 * top": a token rejected after some path got there is undecided and goes to *unc as a range
 * of node-ordered token indices (a rejected subtree is contiguous there). */
static int grammar_match_walk(grammar_match *m, const grammar_set *set, bool truncated, uint32_t *mask,
                              uint32_t **unc, int *n_unc, int *cap_unc)
{
    const grammar_vocab *v = m->v;
    memset(mask, 0, (size_t)m->n_words * sizeof *mask);
    if (m->n_ds > GRAMMAR_DFA_MAX) {
        m->n_ds = 0;
        memset(m->dh, 0, (size_t)m->dh_cap * sizeof *m->dh);
    }
    m->lvid[0] = grammar_dfa_intern(m, set);
    m->lctx[0] = truncated && m->dacc[m->lvid[0]];
    m->lraw[0] = 0;
    *n_unc = 0;
    int n_allowed = 0;
    int i = 0;
    while (i < v->n_nodes) {
        int d = v->depth[i];
        int32_t to;
        bool acc;
        if (m->lraw[d - 1]) {  /* past the memo's capacity: plain sets */
            grammar_step(m->g, &m->sc, &m->lv[d - 1], v->byte[i], &m->lv[d]);
            to = m->lv[d].n_stacks ? GRAMMAR_DFA_FULL : GRAMMAR_DFA_DEAD;
        } else {
            to = grammar_dfa_next(m, m->lvid[d - 1], v->byte[i]);
            if (to == GRAMMAR_DFA_FULL) grammar_set_copy(&m->lv[d], &m->tmp);
        }
        if (to == GRAMMAR_DFA_DEAD) {
            if (m->lctx[d - 1] && v->tok_off[i] < v->tok_off[v->skip[i]]) {
                if (*n_unc == *cap_unc) {
                    *cap_unc = *cap_unc ? 2 * *cap_unc : 64;
                    *unc = xrealloc(*unc, (size_t)*cap_unc * 2 * sizeof **unc);
                }
                (*unc)[2 * *n_unc] = v->tok_off[i];
                (*unc)[2 * *n_unc + 1] = v->tok_off[v->skip[i]];
                (*n_unc)++;
            }
            i = (int)v->skip[i];
            continue;
        }
        m->lraw[d] = to == GRAMMAR_DFA_FULL;
        if (m->lraw[d]) acc = grammar_set_accepting(&m->lv[d]);
        else {
            m->lvid[d] = to;
            acc = m->dacc[to];
        }
        m->lctx[d] = m->lctx[d - 1] || (truncated && acc);
        for (uint32_t k = v->tok_off[i]; k < v->tok_off[i + 1]; k++) {
            int32_t t = v->toks[k];
            mask[t >> 5] |= 1u << (t & 31);
            n_allowed++;
        }
        i++;
    }
    return n_allowed;
}

/* The entry of key[0..n) (hash h) in g's table, or the empty slot where it goes. Under g->mu. */
static grammar_ci_entry *grammar_ci_find(grammar *g, const uint32_t *key, int n, uint64_t h)
{
    int j = (int)(h & (uint64_t)(g->ci_cap - 1));
    for (;;) {
        grammar_ci_entry *e = &g->ci[j];
        if (!e->n_key || (e->n_key == n && e->hash == h && !memcmp(e->key, key, (size_t)n * sizeof *key))) return e;
        j = (j + 1) & (g->ci_cap - 1);
    }
}

static void grammar_ci_clear(grammar *g)
{
    for (int i = 0; i < g->ci_cap; i++) {
        free(g->ci[i].mask);
        free(g->ci[i].ids);
        free(g->ci[i].unc);
    }
    memset(g->ci, 0, (size_t)g->ci_cap * sizeof *g->ci);
    g->ci_n = 0;
    g->ci_bytes = 0;
}

/* Stores a computed entry (taking its buffers) unless another thread stored it meanwhile;
 * returns the one in the table. Under g->mu. */
static grammar_ci_entry *grammar_ci_put(grammar *g, const grammar_vocab *v, grammar_ci_entry *x)
{
    if (g->ci_vocab != v || g->ci_bytes > GRAMMAR_CI_BYTES) {
        if (g->ci) grammar_ci_clear(g);
        g->ci_vocab = v;
    }
    if (2 * (g->ci_n + 1) > g->ci_cap) {  /* grow and rehash */
        int cap = g->ci_cap ? 2 * g->ci_cap : 256;
        grammar_ci_entry *old = g->ci;
        int old_cap = g->ci_cap;
        g->ci = xcalloc((size_t)cap, sizeof *g->ci);
        g->ci_cap = cap;
        for (int i = 0; i < old_cap; i++)
            if (old[i].n_key) *grammar_ci_find(g, old[i].key, old[i].n_key, old[i].hash) = old[i];
        free(old);
    }
    grammar_ci_entry *e = grammar_ci_find(g, x->key, x->n_key, x->hash);
    if (e->n_key) {  /* computed twice at once: keep the first */
        free(x->mask);
        free(x->ids);
        free(x->unc);
        return e;
    }
    *e = *x;
    g->ci_n++;
    g->ci_bytes += (e->mask ? ((size_t)v->n_vocab + 31) / 32 * 4 : 0) + (size_t)e->n_ids * 4 + (size_t)e->n_unc * 8 +
                   sizeof *e;
    return e;
}

/* The mask of state cur from its stacks' context-independent entries (computed once per
 * grammar and top of stack, shared) plus a check of their undecided tokens against cur.
 * mask(cur) is the union over its stacks, since the stacks of a state are alternatives. */
static int grammar_match_compose(grammar_match *m)
{
    grammar *g = m->g;
    const grammar_vocab *v = m->v;
    memset(m->mask, 0, (size_t)m->n_words * sizeof *m->mask);
    m->n_unc = 0;
    for (int si = 0; si < m->cur.n_stacks; si++) {
        const uint32_t *w = m->cur.data + m->cur.off[si];
        int n = (int)w[0];
        if (n == 0) continue;  /* the end of the document: no token continues it */
        const grammar_el *top = &g->el[w[n]];
        if (top->type == GRAMMAR_EL_TOKEN) {  /* exactly that id, whatever lies below */
            if (top->v < (uint32_t)v->n_vocab) m->mask[top->v >> 5] |= 1u << (top->v & 31);
            continue;
        }
        int k = TM_MIN(n, GRAMMAR_CI_DEPTH);
        grammar_ci_entry x = {0};
        memcpy(x.key, w + 1 + (n - k), (size_t)k * sizeof *x.key);
        x.key[k] = n > k;
        x.n_key = k + 1;
        uint64_t h = 0x51ED270B27u;
        for (int j = 0; j <= k; j++) h = (h ^ x.key[j]) * 0x100000001B3ull;
        x.hash = h ^ h >> 29;
        pthread_mutex_lock(&g->mu);
        grammar_ci_entry *e = g->ci_cap && g->ci_vocab == v ? grammar_ci_find(g, x.key, x.n_key, x.hash) : NULL;
        if (!e || !e->n_key) {
            pthread_mutex_unlock(&g->mu);
            /* compute outside the lock, then publish */
            grammar_set_clear(&m->one);
            grammar_set_add(&m->one, x.key, k);
            uint32_t *cm = xmalloc((size_t)m->n_words * sizeof *cm);
            int cap_unc = 0;
            int n_acc = grammar_match_walk(m, &m->one, x.key[k] != 0, cm, &x.unc, &x.n_unc, &cap_unc);
            if ((size_t)n_acc * 32 < (size_t)m->n_words * 16) {  /* a list is under half the bitmask */
                x.ids = xmalloc((size_t)(n_acc ? n_acc : 1) * sizeof *x.ids);
                for (int wi = 0; wi < m->n_words; wi++)
                    for (uint32_t bits = cm[wi]; bits; bits &= bits - 1) x.ids[x.n_ids++] = 32 * wi + __builtin_ctz(bits);
                free(cm);
            } else {
                x.mask = cm;
            }
            pthread_mutex_lock(&g->mu);
            g->n_computed++;
            e = grammar_ci_put(g, v, &x);
        }
        if (e->mask)
            for (int j = 0; j < m->n_words; j++) m->mask[j] |= e->mask[j];
        else
            for (int j = 0; j < e->n_ids; j++) m->mask[e->ids[j] >> 5] |= 1u << (e->ids[j] & 31);
        if (m->n_unc + e->n_unc > m->cap_unc) {
            m->cap_unc = TM_MAX(2 * m->cap_unc, m->n_unc + e->n_unc);
            m->unc = xrealloc(m->unc, (size_t)m->cap_unc * 2 * sizeof *m->unc);
        }
        if (e->n_unc) memcpy(m->unc + 2 * m->n_unc, e->unc, (size_t)e->n_unc * 2 * sizeof *m->unc);
        m->n_unc += e->n_unc;
        pthread_mutex_unlock(&g->mu);
    }
    /* the undecided tokens, byte by byte from the whole state */
    if (m->n_unc) {
        if (m->n_ds > GRAMMAR_DFA_MAX) {
            m->n_ds = 0;
            memset(m->dh, 0, (size_t)m->dh_cap * sizeof *m->dh);
        }
        int32_t sid = grammar_dfa_intern(m, &m->cur);
        for (int r = 0; r < m->n_unc; r++)
            for (uint32_t x = m->unc[2 * r]; x < m->unc[2 * r + 1]; x++) {
                int32_t t = v->toks[x];
                if (m->mask[t >> 5] >> (t & 31) & 1) continue;
                if (grammar_dfa_token(m, sid, t)) m->mask[t >> 5] |= 1u << (t & 31);
            }
    }
    return grammar_popcount(m->mask, m->n_words);
}

static bool grammar_entry_is(const grammar_mask_entry *e, const grammar_set *s, uint64_t h,
                             const void *vocab)
{
    return e->mask && e->hash == h && e->vocab == vocab && e->n_key == s->n_data &&
           e->n_stacks == s->n_stacks && !memcmp(e->key, s->data, (size_t)s->n_data * sizeof *s->data);
}

int grammar_match_mask(grammar_match *m, uint32_t *mask)
{
    if (!m->mask_valid) {
        grammar *g = m->g;
        uint64_t h = grammar_set_hash(&m->cur);
        grammar_mask_entry *e = &g->cache[h & (GRAMMAR_MASK_CACHE - 1)];
        bool hit = false;
        pthread_mutex_lock(&g->mu);
        if (grammar_entry_is(e, &m->cur, h, m->v)) {
            memcpy(m->mask, e->mask, (size_t)m->n_words * sizeof *m->mask);
            m->n_allowed = e->n_allowed;
            hit = true;
            g->n_hit++;
        }
        pthread_mutex_unlock(&g->mu);
        if (!hit) {
            double t0 = util_now();
            m->n_allowed = grammar_match_compose(m);
            double dt = util_now() - t0;
            pthread_mutex_lock(&g->mu);
            g->n_composed++;
            g->walk_s += dt;
            /* the entry's buffers are sized once per grammar slot (the first vocabulary);
             * a different vocabulary size reallocates, which does not happen in a server */
            if (!e->mask || e->vocab != m->v) {
                free(e->mask);
                e->mask = xmalloc((size_t)m->n_words * sizeof *e->mask);
                e->n_mask = m->n_words;
            }
            if (e->n_key < m->cur.n_data || !e->key) {
                free(e->key);
                e->key = xmalloc((size_t)(m->cur.n_data + 1) * sizeof *e->key);
            }
            e->hash = h;
            e->vocab = m->v;
            e->n_key = m->cur.n_data;
            e->n_stacks = m->cur.n_stacks;
            memcpy(e->key, m->cur.data, (size_t)m->cur.n_data * sizeof *e->key);
            memcpy(e->mask, m->mask, (size_t)m->n_words * sizeof *e->mask);
            e->n_allowed = m->n_allowed;
            pthread_mutex_unlock(&g->mu);
        }
        /* stop ids: exactly when the document may end here; also on a dead end */
        bool complete = grammar_set_accepting(&m->cur);
        if (complete || m->n_allowed == 0)
            for (int i = 0; i < m->n_stop; i++) {
                int32_t t = m->stop[i];
                if (!(m->mask[t >> 5] >> (t & 31) & 1)) m->n_allowed++;
                m->mask[t >> 5] |= 1u << (t & 31);
            }
        m->mask_valid = true;
    }
    if (mask && mask != m->mask) memcpy(mask, m->mask, (size_t)m->n_words * sizeof *mask);
    return m->n_allowed;
}

void grammar_match_apply(grammar_match *m, float *logits)
{
    grammar_match_mask(m, NULL);
    int n = m->v->n_vocab;
    for (int w = 0; w < m->n_words; w++) {
        uint32_t bits = m->mask[w];
        if (bits == 0xFFFFFFFFu) continue;
        int end = TM_MIN(n, 32 * w + 32);
        for (int i = 32 * w; i < end; i++)
            if (!(bits >> (i & 31) & 1)) logits[i] = -INFINITY;
    }
}

grammar_match *grammar_match_clone(const grammar_match *m)
{
    grammar_match *c = grammar_match_new(m->g, m->v, m->stop, m->n_stop);
    grammar_match_copy_state(c, m);
    return c;
}

void grammar_match_copy_state(grammar_match *dst, const grammar_match *src)
{
    grammar_set_copy(&dst->cur, &src->cur);
    dst->mask_valid = false;   /* the memo of automaton states stays valid: it is per grammar */
}

bool grammar_match_accept(grammar_match *m, int32_t token)
{
    const grammar_vocab *v = m->v;
    if (token < 0 || token >= v->n_vocab) return false;
    for (int i = 0; i < m->n_stop; i++)
        if (m->stop[i] == token) {
            if (!grammar_set_accepting(&m->cur)) {
                grammar_match_mask(m, NULL);  /* a dead end allows stops too */
                if (!(m->mask[token >> 5] >> (token & 31) & 1)) return false;
            }
            return true;  /* the state stays: generation ends here */
        }
    /* as a token terminal (into lv[1]) and over its bytes (into tmp); the new state is both */
    grammar_step_token(m->g, &m->sc, &m->cur, token, &m->lv[1]);
    uint32_t a = v->off[token], b = v->off[token + 1];
    grammar_set_clear(&m->tmp);
    if (a < b) {
        grammar_set_copy(&m->tmp, &m->cur);
        for (uint32_t k = a; k < b && m->tmp.n_stacks; k++) {
            grammar_step(m->g, &m->sc, &m->tmp, v->bytes[k], &m->lv[0]);
            grammar_set_copy(&m->tmp, &m->lv[0]);
        }
    }
    for (int i = 0; i < m->lv[1].n_stacks; i++) {
        const uint32_t *w = m->lv[1].data + m->lv[1].off[i];
        grammar_set_add(&m->tmp, w + 1, (int)w[0]);
    }
    if (m->tmp.n_stacks == 0) return false;
    grammar_set_copy(&m->cur, &m->tmp);
    m->mask_valid = false;
    return true;
}

bool grammar_match_done(const grammar_match *m)
{
    for (int i = 0; i < m->cur.n_stacks; i++)
        if (m->cur.data[m->cur.off[i]] != 0) return false;
    return m->cur.n_stacks > 0;
}

void grammar_match_reset(grammar_match *m)
{
    grammar_set_copy(&m->cur, &m->g->start);
    m->mask_valid = false;
}

void grammar_match_stats(const grammar *g, uint64_t *n_hit, uint64_t *n_computed, double *walk_s)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&g->mu;
    pthread_mutex_lock(mu);
    *n_hit = g->n_hit;
    *n_computed = g->n_composed;
    if (walk_s) *walk_s = g->walk_s;
    pthread_mutex_unlock(mu);
}
