/*
 * sched_admit: admission with prefix reuse. Before each step (engine thread, under mu) it
 * decides which waiting requests start running and how much of their tokens each need not
 * compute: full blocks attached from the pool's RAM tier, loaded from the block store, or
 * computed by a running request (a prefix in flight), and the rows of a partial block copied
 * from a running request or from a tail an ended one kept. Every full block of a request has
 * a key chained from its tenant's root (sched_chain_key): equal keys, same tenant and tokens.
 *
 * Admission by cache: when a slot is free, the waiting request admitted is the one with the
 * fewest blocks left to compute once its reusable prefix is attached (blocks keyed in the pool;
 * among the known tokens of a running request: a prefix in flight, attached as it completes;
 * or loaded from the block store while it waited), among the SCHED_ADMIT_WINDOW oldest, the
 * oldest on a tie (so with nothing to reuse it is first come, first served). Admitting one
 * makes its prefix in flight, which puts the others sharing it first next: sharers are
 * admitted together and compute the prefix once (SGLang's longest-prefix-first and in-batch
 * sharing). Counting what is left rather than what is reused keeps a conversation's later
 * turns, whose cached prefix is longer every turn, from overtaking other conversations'
 * earlier turns that have as much or less to compute. The age bound: every admission that
 * overtakes a waiting request counts a pass for it, and a request passed
 * SCHED_ADMIT_MAX_PASSED times goes before any other (the oldest such first), so a stream of
 * cache-friendly arrivals delays a cold request by at most that many admissions. KV still
 * decides last: a pick that does not fit waits, and blocks the admissions behind it as the
 * queue head did. A waiting request's store load follows its RAM-tier prefix: when the pool
 * reclaims blocks of that prefix while it waits (KV pressure), the load starts again from
 * where the prefix ends now, so its reusable blocks stay counted. A slow store does not hold
 * the queue: a load not ready after SCHED_LOAD_WAIT_S is given up and the blocks computed.
 *
 * Tails: a request that ends or is preempted keeps the rows of its prompt's last block and of
 * its last, partial block findable (sched_admit_keep_tails); a waiting request in the
 * admission window pins the tail it would copy, since, unlike a full block, a tail cannot be
 * loaded back from the store. Pins give way to running requests when the pool is full.
 *
 * Sharing in flight (sched_admit_share_locked, at the start of every plan): a running request
 * whose next block another, further on, is computing waits for it and attaches it when
 * committed, so requests sharing a prefix compute it once.
 */
#include "engine/sched_int.h"

#include <string.h>

#include "engine/blockio.h"
#include "engine/wincache.h"
#include "util/util.h"

#define SCHED_LOAD_WAIT_S 2.0   /* longest a request waits at the queue head for a store load */
#define SCHED_SHARE_MIN_ROWS 16 /* fewest rows of a block shared in flight below its boundary */
#define SCHED_LOAD_RETRIES 8    /* most loads restarted per request because the RAM tier lost
                                 * blocks of its prefix while it waited */

/* ---- block keys ---- */

/* The key r's first block chains from: its tenant salt's root, zeros without one. */
static const uint8_t *sched_root_key(const sched_req *r)
{
    static const uint8_t zeros[32];
    return r->prefix.salted ? r->prefix.root : zeros;
}

/* Key of r's full block bi of tokens ((bi + 1) * 128 <= n_tokens), computed once: the tokens
 * of a request never change, the generated ones included. */
static const uint8_t *sched_chain_key(sched *s, sched_req *r, int bi)
{
    sched_req_prefix *px = &r->prefix;
    while (px->n_chain <= bi) {
        const uint8_t *parent = px->n_chain ? px->chain[px->n_chain - 1] : sched_root_key(r);
        kvpool_block_key(s->pool, parent, r->tokens + (size_t)px->n_chain * KVPOOL_BLOCK, px->chain[px->n_chain]);
        px->n_chain++;
    }
    return px->chain[bi];
}

/* The key block bi of r's tokens chains from: block bi-1's, or the root for block 0. */
static const uint8_t *sched_parent_key(sched *s, sched_req *r, int bi)
{
    return bi ? sched_chain_key(s, r, bi - 1) : sched_root_key(r);
}

static int sched_blocks_for(int n) { return (n + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK; }

/* ---- tails ---- */

/* Before r's sequence lets go of its blocks: the rows of the block where its prompt ends and
 * of its last, partial block stay findable as tails (kvpool_seq_keep_tail) for a request that
 * continues its tokens: its next turn (which resends the prompt, perhaps not the tokens
 * generated after it), a retry, its own resume. Not on a model with window layers. */
void sched_admit_keep_tails(sched *s, sched_req *r)
{
    if (s->wc || !r->seq || r->n_done <= 0) return;
    int last = (r->n_done - 1) / KVPOOL_BLOCK, pe = (TM_MIN(r->n_prompt, r->n_done) - 1) / KVPOOL_BLOCK;
    for (int bi = pe; bi <= last; bi += TM_MAX(1, last - pe)) {
        const uint8_t *parent = sched_parent_key(s, r, bi);
        int rows = TM_MIN(r->n_done, (bi + 1) * KVPOOL_BLOCK) - bi * KVPOOL_BLOCK;
        kvpool_seq_keep_tail(s->pool, r->seq, bi, parent, r->tokens + (size_t)bi * KVPOOL_BLOCK, rows);
    }
}

/* Lets go of the tail r pinned while it waited (engine thread). */
void sched_admit_tail_unpin(sched *s, sched_req *r)
{
    if (r->load.tail_pin) kvpool_tail_unpin(s->pool, r->load.tail_pin - 1);
    r->load.tail_pin = 0;
}

/* Waiting r: pins the tail it would copy rows from once admitted, the one after the longest
 * chain of its full blocks that has one (what it attaches then is decided at admission), so
 * that KV pressure does not reclaim it meanwhile: unlike full blocks, a tail is not in the
 * block store to be loaded back. Once per (re)admission, in the admission window. */
static void sched_tail_pin(sched *s, sched_req *r)
{
    if (r->load.tail_looked || s->wc) return;
    r->load.tail_looked = true;
    for (int k = (r->n_tokens - 2) / KVPOOL_BLOCK; k >= 0 && !r->load.tail_pin; k--) {
        const uint8_t *parent = sched_parent_key(s, r, k);
        int lim = TM_MIN(KVPOOL_BLOCK, r->n_tokens - 1 - k * KVPOOL_BLOCK);
        r->load.tail_pin = 1 + kvpool_tail_pin(s->pool, parent, r->tokens + (size_t)k * KVPOOL_BLOCK, lim,
                                               SCHED_SHARE_MIN_ROWS);
    }
}

/* Lets go of every waiting request's pinned tail (the pool has no room for what runs, or for
 * a request that can never fit otherwise); whether there was one. They pin again at the next
 * admission pass if their tail is still there. */
bool sched_admit_tail_unpin_all(sched *s)
{
    bool any = false;
    for (sched_req *r = s->wait_head; r; r = r->next) {
        any |= r->load.tail_pin != 0;
        sched_admit_tail_unpin(s, r);
        r->load.tail_looked = false;
    }
    return any;
}

/* ---- what a request can reuse ---- */

/* Whether a running request has block bi with this key among its known tokens: computed, or
 * to be computed in its next steps (a prefix in flight). */
static bool sched_in_flight(sched *s, int bi, const uint8_t key[32])
{
    for (int j = 0; j < s->n_running; j++) {
        sched_req *q = s->running[j];
        if (q->n_tokens >= (bi + 1) * KVPOOL_BLOCK && !memcmp(sched_chain_key(s, q, bi), key, 32)) return true;
    }
    return false;
}

/* Whether the model has recurrent layers: its state cache (s->wc) holds their states, which
 * a prefix needs as a window model's needs its window layers' (see sched_window_attach). */
static bool sched_recurrent(const sched *s) { return kvpool_state_bytes(s->pool) > 0; }

/* Cached tokens as usage counts them: on a model with window layers at most L - 134 of a
 * prompt of L; on a recurrent one the positions its restored state continues (att is those). */
static int sched_cached_cap(const sched *s, const sched_req *r, int n)
{
    if (!s->wc || sched_recurrent(s)) return n;
    return TM_MAX(0, TM_MIN(n, r->n_prompt - SCHED_WINDOW_UNCACHED));
}

/* On a recurrent model: the furthest block end b above `from` (leaving a token of r to
 * compute) whose state the cache holds and, with in_pool, whose blocks from `from` on are all
 * in the pool (attachable); `from` when there is none. */
static int sched_state_reach(sched *s, sched_req *r, int from, bool in_pool)
{
    int best = from;
    double now = util_now();
    for (int b = from + KVPOOL_BLOCK; b < r->n_tokens; b += KVPOOL_BLOCK) {
        const uint8_t *key = sched_chain_key(s, r, b / KVPOOL_BLOCK - 1);
        if (in_pool && !kvpool_key_cached(s->pool, key)) break;
        if (wincache_contains(s->wc, key, now)) best = b;
    }
    return best;
}

/* A recurrent model's sequence attached blocks up to att but its state there is not held:
 * unlike a window, a recurrent state depends on every position before it, so the replay is
 * from the furthest end below att whose state is held (restored), or from 0; the blocks past
 * it are let go (the replay computes them again, as a cold run would). Returns where it is. */
static int sched_state_replay(sched *s, sched_req *r, int att)
{
    double now = util_now();
    int b = att - KVPOOL_BLOCK;
    while (b > 0 && !wincache_contains(s->wc, sched_chain_key(s, r, b / KVPOOL_BLOCK - 1), now)) b -= KVPOOL_BLOCK;
    kvpool_seq_reset(s->pool, r->seq);
    if (r->prefix.salted) kvpool_seq_set_root(r->seq, r->prefix.root);
    int got = b > 0 ? kvpool_seq_attach_prefix(s->pool, r->seq, r->tokens, b + 1) : 0;
    if (got > 0 && (got != b || !wincache_get(s->wc, sched_chain_key(s, r, b / KVPOOL_BLOCK - 1), s->wstate, now))) {
        kvpool_seq_reset(s->pool, r->seq);   /* expired meanwhile: from 0 */
        if (r->prefix.salted) kvpool_seq_set_root(r->seq, r->prefix.root);
        got = 0;
    }
    if (got > 0) memcpy(kvpool_seq_state(s->pool, r->seq), s->wstate, kvpool_state_bytes(s->pool));
    wincache_count_replay(s->wc, true, att - got);
    return got;
}

/* After r's sequence attached blocks up to att (a multiple of 128, or 0): the window layers'
 * state (or the recurrent state) at att from the window cache, else a replay. Returns the
 * position to compute from. */
static int sched_window_attach(sched *s, sched_req *r, int att)
{
    if (!s->wc || att <= 0 || att % KVPOOL_BLOCK) return att;
    if (wincache_get(s->wc, sched_chain_key(s, r, att / KVPOOL_BLOCK - 1), s->wstate, util_now())) {
        if (sched_recurrent(s)) {
            memcpy(kvpool_seq_state(s->pool, r->seq), s->wstate, kvpool_state_bytes(s->pool));
            return att;
        }
        /* a state of another geometry (relayed from a worker of an older layout) is replayed */
        if (kvpool_seq_window_restore(s->pool, r->seq, att, s->wstate, kvpool_window_state_bytes(s->pool))) return att;
    }
    if (sched_recurrent(s)) return sched_state_replay(s, r, att);
    int from = kvpool_seq_window_replay(s->pool, r->seq, att, s->o.window_exact);
    wincache_count_replay(s->wc, s->o.window_exact, att - from);
    return from;
}

/* After a step: the window states its sequences crossed, into the window cache under the key
 * of the block each ends. */
void sched_admit_window_put(sched *s, int n_reqs)
{
    const engine_window_state *ws;
    int n = engine_window_states(s->e, &ws);
    double now = util_now();
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n_reqs; k++) {
            sched_req *r = s->batch_req[k];
            if (r->seq != ws[i].seq) continue;
            if (ws[i].end <= r->n_tokens)
                wincache_put(s->wc, sched_chain_key(s, r, ws[i].end / KVPOOL_BLOCK - 1), ws[i].state, now);
            break;
        }
}

/* Leading full blocks of r's tokens in the RAM tier (pinned or cached), at most max, at most
 * those that leave a token to compute (as attach). */
static int sched_ram_blocks(sched *s, sched_req *r, int max)
{
    int nb = 0;
    while (nb < max && (nb + 1) * KVPOOL_BLOCK < r->n_tokens && kvpool_key_cached(s->pool, sched_chain_key(s, r, nb)))
        nb++;
    return nb;
}

/* Tokens of r whose blocks a store load looks up: all, but on a recurrent model only up to the
 * furthest block end whose state is held (blocks beyond it could not be used), none when no
 * state is (after a restart: the state cache is in RAM only). */
static int sched_load_tokens(sched *s, sched_req *r)
{
    if (!sched_recurrent(s)) return r->n_tokens;
    int b = sched_state_reach(s, r, 0, false);
    return b > 0 ? b + 1 : 0;
}

/* Whether waiting r's store load (finished, or none: nothing was left to look up) no longer
 * continues its RAM-tier prefix: blocks were reclaimed since it started. */
static bool sched_load_stale(sched *s, sched_req *r)
{
    if (r->load.retries >= SCHED_LOAD_RETRIES || (r->load.io && !blockio_load_ready(s->o.bio, r->load.io)))
        return false;
    return sched_ram_blocks(s, r, r->load.ram) < r->load.ram;
}

/* Full blocks r would not compute if admitted now: cached in the RAM tier, in flight, or held
 * by its finished store load where that continues them. */
static int sched_reusable_blocks(sched *s, sched_req *r)
{
    int nb = 0, l0 = 0, l1 = 0;
    if (r->load.io) {
        l0 = blockio_load_first_block(r->load.io);
        l1 = blockio_load_end_block(s->o.bio, r->load.io);
    }
    while ((nb + 1) * KVPOOL_BLOCK < r->n_tokens) {   /* as attach: at least one token is computed */
        if (nb >= l0 && nb < l1) {   /* loaded, and the blocks before it reusable: no gap */
            nb++;
            continue;
        }
        const uint8_t *key = sched_chain_key(s, r, nb);
        if (!kvpool_key_cached(s->pool, key) && !sched_in_flight(s, nb, key)) break;
        nb++;
    }
    return nb;
}

/* ---- admission ---- */

/* The waiting request to admit next (see the admission policy in the file comment): the
 * oldest one overtaken SCHED_ADMIT_MAX_PASSED times if any, else the one with the fewest
 * blocks left to compute once its reusable prefix is attached, among the first
 * SCHED_ADMIT_WINDOW, the oldest of those on a tie. */
static sched_req *sched_admit_pick(sched *s)
{
    sched_req *best = NULL;
    int best_nc = 0, k = 0;
    for (sched_req *r = s->wait_head; r && k < SCHED_ADMIT_WINDOW; r = r->next, k++) {
        if (r->n_passed >= SCHED_ADMIT_MAX_PASSED) return r;
        int nc = sched_blocks_for(r->n_tokens) - sched_reusable_blocks(s, r);
        if (!best || nc < best_nc) {
            best = r;
            best_nc = nc;
        }
    }
    return best;
}

/* Takes r out of the waiting queue; every request it overtook counts one more pass. */
static void sched_wait_take(sched *s, sched_req *r)
{
    sched_req **pp = &s->wait_head, *prev = NULL;
    while (*pp != r) {
        (*pp)->n_passed++;
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = r->next;
    if (s->wait_tail == r) s->wait_tail = prev;
    r->next = NULL;
    s->n_waiting--;
}

/* Cancels, admissions. Under mu. */
void sched_admit_locked(sched *s)
{
    /* cancels of running requests */
    for (int i = 0; i < s->n_running;) {
        sched_req *r = s->running[i];
        if (r->pub.cancel) {
            sched_running_remove(s, i);
            sched_finish_locked(s, r, r->pub.cancel_why);
            sched_drop_locked(r);
        } else {
            i++;
        }
    }
    /* cancels of waiting requests */
    for (sched_req **pp = &s->wait_head, *prev = NULL; *pp;) {
        sched_req *r = *pp;
        if (r->pub.cancel) {
            *pp = r->next;
            if (s->wait_tail == r) s->wait_tail = prev;
            s->n_waiting--;
            sched_finish_locked(s, r, r->pub.cancel_why);
            sched_drop_locked(r);
        } else {
            prev = r;
            pp = &r->next;
        }
    }
    /* block store: load what follows each waiting request's RAM-tier prefix, and again from
     * where it ends now when the RAM tier reclaimed some of it meanwhile (so that what the
     * request can reuse stays known to admission, which it would otherwise pass over; only
     * for the requests admission scores) */
    int k = 0;
    for (sched_req *r = s->wait_head; r && k < SCHED_ADMIT_WINDOW; r = r->next, k++) sched_tail_pin(s, r);
    k = 0;
    if (s->o.bio)
        for (sched_req *r = s->wait_head; r; r = r->next, k++) {
            if (r->embd) continue;   /* an embedding's root is its own: the store holds nothing of it */
            if (!r->load.started || (k < SCHED_ADMIT_WINDOW && sched_load_stale(s, r))) {
                if (r->load.started) r->load.retries++;
                r->load.started = true;
                blockio_load_free(s->o.bio, r->load.io);
                r->load.io = NULL;
                r->load.ram = sched_ram_blocks(s, r, r->n_tokens);
                int n_load = sched_load_tokens(s, r);
                if (n_load > 0)
                    r->load.io = blockio_load_start_class(s->o.bio, r->prefix.salted ? r->prefix.root : NULL, r->tokens,
                                                          n_load, r->p.cache_class);
                r->load.t = util_now();
                if (r->load.t0 == 0 && r->load.io) r->load.t0 = r->load.t;
            }
        }
    /* admissions, fewest blocks to compute first within the age bound, while KV allows */
    while (s->n_running < s->o.max_seqs && s->wait_head) {
        sched_req *r = sched_admit_pick(s);
        if (r->load.io && !blockio_load_ready(s->o.bio, r->load.io)) {
            if (util_now() - r->load.t < SCHED_LOAD_WAIT_S) break;   /* the store is slow: */
            blockio_load_free(s->o.bio, r->load.io);                    /* compute instead */
            r->load.io = NULL;
        }
        kvpool_seq *seq = kvpool_seq_new(s->pool);
        if (r->prefix.salted) kvpool_seq_set_root(seq, r->prefix.root);
        int att = kvpool_seq_attach_prefix(s->pool, seq, r->tokens, r->n_tokens);
        if (r->load.io && att < blockio_load_first_block(r->load.io) * KVPOOL_BLOCK) {
            /* the RAM tier lost blocks since the load started: load again from where it
             * ends now (a few times at most), then compute what is missing */
            blockio_load_free(s->o.bio, r->load.io);
            r->load.io = NULL;
            int n_load = sched_load_tokens(s, r);
            if (r->load.retries++ < SCHED_LOAD_RETRIES && n_load > 0) {
                r->load.io = blockio_load_start_class(s->o.bio, r->prefix.salted ? r->prefix.root : NULL, r->tokens,
                                                      n_load, r->p.cache_class);
                r->load.t = util_now();
            }
            if (r->load.io) {
                kvpool_seq_free(s->pool, seq);
                break;
            }
        }
        kvpool_stats ks;
        kvpool_get_stats(s->pool, &ks);
        int need = sched_blocks_for(r->n_tokens + 1) - att / KVPOOL_BLOCK;
        /* headroom: one block for every running sequence to grow into */
        int avail = ks.n_free + ks.n_cached - s->n_running;
        if (need > avail) {   /* a load stays buffered in blockio until the request fits */
            kvpool_seq_free(s->pool, seq);
            if (s->n_running == 0 && need > ks.n_free + ks.n_cached && sched_admit_tail_unpin_all(s)) continue;
            if (s->n_running == 0 && need > ks.n_free + ks.n_cached) {
                /* nothing else holds blocks: it can never fit */
                sched_wait_take(s, r);
                sched_finish_locked(s, r, SCHED_FINISH_ERROR);
                sched_drop_locked(r);
                continue;
            }
            break;
        }
        sched_wait_take(s, r);
        sched_admit_tail_unpin(s, r);   /* to the LRU's head: the plan's share pass copies its rows */
        if (r->load.t0 > 0) {   /* it waited for a load (finished, or given up for slowness) */
            sched_hist_add(&s->h_load_wait, util_now() - r->load.t0);
            r->load.t0 = 0;
        }
        /* RAM-tier hits never read the store: refresh their last use there (LRU, TTL) */
        if (s->o.bio && att) blockio_touch(s->o.bio, seq, att / KVPOOL_BLOCK, r->p.cache_class);
        if (r->load.io) {   /* loaded blocks take pool blocks as computed ones would: in need */
            att += blockio_load_finish(s->o.bio, r->load.io, seq);
            r->load.io = NULL;
        }
        if (r->p.kv_in) att = r->p.kv_in(r->p.kv_arg, s->pool, seq, att);
        r->seq = seq;
        r->n_done = sched_window_attach(s, r, att);
        if (sched_recurrent(s)) att = r->n_done;   /* blocks past the state restored were let go */
        if (!r->prefix.admitted_once) {
            r->tr.admit_step = s->n_planned;
            r->prefix.n_cached = sched_cached_cap(s, r, TM_MIN(att, r->n_prompt));
            r->tr.n_cached_at_admit = r->prefix.n_cached;
            log_debug("sched: req %llu admitted at step %llu: submitted at step %llu, prompt %d, %d positions "
                      "attached, %d running, %d waiting, passed %d times", (unsigned long long)r->id,
                      (unsigned long long)s->n_planned, (unsigned long long)r->tr.step0, r->n_prompt, att,
                      s->n_running, s->n_waiting, r->n_passed);
            r->prefix.admitted_once = true;
            r->prefix.first_run = true;
            s->st.n_prompt_tokens += (uint64_t)r->n_prompt;
            s->st.n_cached_tokens += (uint64_t)r->prefix.n_cached;
        }
        r->n_passed = 0;
        r->state = REQ_RUNNING;
        r->admit_no = ++s->admit_counter;
        s->running[s->n_running++] = r;
    }
}

/* ---- prefixes shared in flight ---- */

/* Whether running q is ahead of r in the order that decides who waits for whom on a prefix
 * in flight: further on, or at the same position and admitted earlier. A strict order, so the
 * request at its top never waits. */
static bool sched_ahead(const sched_req *q, const sched_req *r)
{
    return q->n_done > r->n_done || (q->n_done == r->n_done && q->admit_no < r->admit_no);
}

/* Prefixes shared in flight below a block boundary: r, at the start of its block bi with no
 * full block to wait for, takes the leading rows of that block from a running request q that
 * has the same tokens there (same chain of blocks before bi, same ids from bi * 128 on): the
 * K and V of those positions are the same (the engine is batch invariant), so they are copied
 * when q has computed them, or r waits while q, ahead of it, computes them. A system prompt
 * shared by agents rarely ends on a block boundary: without this each would compute the tail
 * of its last block itself. With no running request to take them from, the rows a finished
 * (or preempted) one kept after the same blocks (kvpool_seq_keep_tail): an agent's next turn
 * resends its last prompt, whose end its last request computed. Counted as cached, as
 * attached blocks are. Not on a model with window layers (their state is in each sequence's
 * ring). */
static void sched_share_rows(sched *s, sched_req *r, int bi)
{
    int base = bi * KVPOOL_BLOCK;
    int lim = TM_MIN(KVPOOL_BLOCK, r->n_tokens - 1 - base);   /* leave a token to compute */
    if (lim < SCHED_SHARE_MIN_ROWS) return;
    const uint8_t *pk = bi ? sched_chain_key(s, r, bi - 1) : NULL;
    sched_req *best = NULL;
    int best_n = 0;
    bool best_ready = false;
    for (int j = 0; j < s->n_running; j++) {
        sched_req *q = s->running[j];
        if (q == r || q->n_tokens <= base) continue;
        if (pk ? memcmp(sched_chain_key(s, q, bi - 1), pk, 32) != 0
               : q->prefix.salted != r->prefix.salted ||
                     (r->prefix.salted && memcmp(q->prefix.root, r->prefix.root, 32) != 0))
            continue;   /* another prefix or tenant */
        int n = 0, m = TM_MIN(lim, q->n_tokens - base);
        while (n < m && q->tokens[base + n] == r->tokens[base + n]) n++;
        bool ready = q->n_done >= base + n;
        if (n < SCHED_SHARE_MIN_ROWS || (!ready && !sched_ahead(q, r))) continue;
        if (n > best_n || (n == best_n && ready && !best_ready)) {
            best = q;
            best_n = n;
            best_ready = ready;
        }
    }
    if (!best) {   /* none running: the rows a finished request kept after the same blocks */
        int n = kvpool_seq_copy_tail(s->pool, r->seq, r->tokens + base, lim, SCHED_SHARE_MIN_ROWS);
        if (n && r->prefix.first_run) {
            int hits = TM_MIN(base + n, r->n_prompt) - TM_MIN(base, r->n_prompt);
            r->prefix.n_cached += hits;
            s->st.n_cached_tokens += (uint64_t)hits;
            s->st.n_tail_tokens += (uint64_t)hits;
        }
        r->n_done += n;
        return;
    }
    if (!best_ready) {   /* q computes them in its next steps */
        r->prefix.share_wait = true;
        return;
    }
    if (kvpool_seq_reserve(s->pool, r->seq, base + best_n) != KVPOOL_OK) return;   /* compute them */
    if (kvpool_seq_n_keyed(best->seq) > base) kvpool_fill_wait(s->pool, -1);   /* a loaded block */
    kvpool_seq_copy_rows(s->pool, r->seq, best->seq, base, base + best_n);
    if (r->prefix.first_run) {
        int hits = TM_MIN(base + best_n, r->n_prompt) - TM_MIN(base, r->n_prompt);
        r->prefix.n_cached += hits;
        s->st.n_cached_tokens += (uint64_t)hits;
        s->st.n_shared_tokens += (uint64_t)hits;
    }
    r->n_done = base + best_n;
}

/* Prefixes shared in flight, before each plan: every running request between prompt blocks
 * first attaches the blocks others completed since (counted as cached in its first run), then
 * waits this step (prefix.share_wait) when its next block is being computed by a request that is
 * ahead of it: same block key, that block not complete yet, and either further on or, at the
 * same position, admitted earlier. "Ahead" is a strict order, so the request at its top never
 * waits and every wait ends when that block is committed (attached at the next plan) or when
 * the computing request leaves the running set (cancelled, preempted, failed): then the
 * waiting one computes the block itself, from its last attached block. */
void sched_admit_share_locked(sched *s)
{
    for (int i = 0; i < s->n_running; i++) {
        sched_req *r = s->running[i];
        r->prefix.share_wait = false;
        if (r->n_tokens - r->n_done <= 1 || r->n_done % KVPOOL_BLOCK != 0 ||
            kvpool_seq_capacity(r->seq) != r->n_done || kvpool_seq_n_keyed(r->seq) != r->n_done)
            continue;   /* decoding, or inside a block of its own */
        /* a recurrent model attaches only as far as a state it can restore */
        int lim = sched_recurrent(s) ? sched_state_reach(s, r, r->n_done, true) + 1 : r->n_tokens;
        int att = kvpool_seq_attach_prefix(s->pool, r->seq, r->tokens, lim);
        if (att > r->n_done) {
            r->n_done = sched_window_attach(s, r, att);
            if (sched_recurrent(s)) att = r->n_done;   /* blocks past the state restored were let go */
            if (r->prefix.first_run) {
                int hits = sched_cached_cap(s, r, TM_MIN(att, r->n_prompt)) - r->prefix.n_cached;
                hits = TM_MAX(0, hits);
                r->prefix.n_cached += hits;
                s->st.n_cached_tokens += (uint64_t)hits;
                s->st.n_shared_tokens += (uint64_t)hits;
            }
        }
        if (r->n_done < kvpool_seq_n_keyed(r->seq)) continue;   /* replaying window layers */
        int end = r->n_done + KVPOOL_BLOCK;   /* the next block, attachable if it leaves a token */
        int bi = r->n_done / KVPOOL_BLOCK;
        const uint8_t *key = NULL;
        for (int j = 0; j < s->n_running && r->n_tokens > end; j++) {
            sched_req *q = s->running[j];
            if (q == r || q->n_tokens < end || q->n_done >= end) continue;
            if (!sched_ahead(q, r)) continue;
            if (!key) key = sched_chain_key(s, r, bi);
            if (!memcmp(sched_chain_key(s, q, bi), key, 32)) {
                r->prefix.share_wait = true;
                break;
            }
        }
        if (!r->prefix.share_wait && !s->wc) sched_share_rows(s, r, bi);
    }
}
