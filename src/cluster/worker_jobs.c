/*
 * worker_jobs: the worker's jobs: a PREFILL or DECODE frame submitted to the scheduler, the
 * pumps that turn its outputs into frames, the handoff thread that answers ended prefills, the
 * tail KV hooks on the engine thread and the window-state reports. See worker_int.h.
 */
#include "cluster/worker_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "util/util.h"

/* ---- tail KV hooks (engine thread) ---- */

/* Bytes of one row of the pool (its head_dim in its type: the pool's geometry, not the model's
 * heads, which differ for DeepSeek V4). */
static size_t worker_row(const kvpool *pool) { return quant_row_bytes(kvpool_dtype(pool), kvpool_block_width_max(pool)); }

/* kv_out: copies the partial last block [n_done/128*128, n_done) out of the pool. */
static void worker_kv_out(void *arg, const kvpool *pool, const kvpool_seq *seq, int n_done)
{
    wjob *j = arg;
    const model *m = j->w->m;
    int start = n_done / KVPOOL_BLOCK * KVPOOL_BLOCK, n = n_done - start;
    /* window layers live in a ring, not in the tail's slabs, and a recurrent state is captured
     * only at block ends: the decode worker computes the partial block itself (from the state
     * at the block end, fetched or replayed as a window-cache miss); the handoff's tail has one
     * row width, so a pool whose block layers differ in width hands off none either */
    if (n <= 0 || j->tail || kvpool_n_window_layers(pool) > 0 || kvpool_state_bytes(pool) > 0 ||
        !kvpool_block_uniform(pool))
        return;
    size_t row = worker_row(pool);
    int parts = kvpool_n_parts(pool), heads = kvpool_n_kv_heads(pool);
    size_t bytes = (size_t)m->hp.n_layers * (size_t)parts * (size_t)heads * (size_t)n * row;
    /* a tail must fit in the HANDOFF frame beside the prompt's ids (PROTO_MAX_TOKENS of them at
     * most): a DeepSeek V4 row is a position's whole state, and 127 rows of the real shape are
     * ~80 MB. Without it the decode worker computes the partial block itself. */
    if (bytes > PROTO_MAX_PAYLOAD - (size_t)PROTO_MAX_TOKENS * 4 - 4096) return;
    uint8_t *buf = malloc(bytes);
    if (!buf) return;
    uint8_t *p = buf;
    for (int l = 0; l < m->hp.n_layers; l++)
        for (int kv = 0; kv < parts; kv++)
            for (int h = 0; h < heads; h++) {
                const uint8_t *slab = kvpool_seq_slab(pool, seq, start / KVPOOL_BLOCK, l, kv, h);
                memcpy(p, slab, (size_t)n * row);
                p += (size_t)n * row;
            }
    j->tail = buf;
    j->tail_bytes = bytes;
    j->tail_start = start;
    j->tail_n = n;
}

/* kv_in: installs the handoff's tail when the attached blocks end exactly where it starts. */
static int worker_kv_in(void *arg, kvpool *pool, kvpool_seq *seq, int n_attached)
{
    wjob *j = arg;
    const proto_kv *kv = &j->msg.u.decode.kv;
    const model *m = j->w->m;
    if (!j->kv_in_seen) {           /* first admission: the handed-off KV is in place now */
        j->kv_in_seen = true;
        j->t_kv_in = util_now();
        j->kv_in_pos = n_attached;
    }
    if (j->tail_used || !kv->data || kv->n == 0) return n_attached;
    if ((int)kv->start != n_attached || kv->dtype != kvpool_dtype(pool) || kv->n_parts != kvpool_n_parts(pool) ||
        kv->n_layers != m->hp.n_layers ||
        kv->n_kv_heads != kvpool_n_kv_heads(pool) || kv->head_dim != kvpool_block_width_max(pool) ||
        !kvpool_block_uniform(pool)) {
        log_debug("worker: req %llu: tail KV at %u not used (attached %d): recomputed",
                  (unsigned long long)j->id, kv->start, n_attached);
        return n_attached;
    }
    double t0 = util_now();
    if (kvpool_seq_reserve(pool, seq, (int)(kv->start + kv->n)) != KVPOOL_OK) return n_attached;
    size_t row = worker_row(pool);
    const uint8_t *p = kv->data;
    for (int l = 0; l < m->hp.n_layers; l++)
        for (int k = 0; k < kv->n_parts; k++)
            for (int h = 0; h < kv->n_kv_heads; h++) {
                uint8_t *slab = kvpool_seq_slab(pool, seq, (int)kv->start / KVPOOL_BLOCK, l, k, h);
                memcpy(slab, p, (size_t)kv->n * row);
                p += (size_t)kv->n * row;
            }
    j->tail_used = true;
    j->t_kv_in = util_now();
    j->kv_in_pos = (int)(kv->start + kv->n);
    double us = (j->t_kv_in - t0) * 1e6;
    log_debug("worker: req %llu: handoff tail installed: %u tokens, %u bytes (%.0f B/token), %.1f us (%.2f us/token)",
              (unsigned long long)j->id, kv->n, kv->n_bytes, (double)kv->n_bytes / kv->n, us, us / kv->n);
    return (int)(kv->start + kv->n);
}

/* ---- jobs ---- */

/* Fills sp from a job's params; false when a value is beyond this model (the job is answered
 * ERROR ARG): the reasoning budget's ids must lie in the vocabulary. */
static bool worker_params(const worker *w, const proto_params *pp, sched_params *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->sample = pp->sample;
    sp->max_tokens = pp->max_tokens;
    sp->n_stop_ids = TM_MIN(pp->n_stop_ids, SCHED_MAX_STOP_IDS);
    memcpy(sp->stop_ids, pp->stop_ids, (size_t)sp->n_stop_ids * sizeof sp->stop_ids[0]);
    sp->ignore_eos = pp->ignore_eos;
    sp->logprobs = pp->logprobs;
    sp->top_logprobs = pp->top_logprobs;
    sp->cache_salt = pp->salt;
    sp->cache_class = pp->cache_class;
    sp->think_start = sp->think_end = -1;
    if (pp->think_budget > 0) {   /* the state after gen is replayed by sched_submit */
        int n_vocab = w->m->hp.n_vocab;
        if (pp->think_start >= n_vocab || pp->think_end < 0 || pp->think_end >= n_vocab) return false;
        sp->think_budget = (int)pp->think_budget;
        sp->think_start = pp->think_start;
        sp->think_end = pp->think_end;
        sp->think_open = pp->think_open;
    }
    return true;
}

static int worker_sched_error(sched_status st)
{
    switch (st) {
    case SCHED_ERR_QUEUE_FULL: return PROTO_E_BUSY;
    case SCHED_ERR_TOO_LONG: return PROTO_E_TOO_LONG;
    case SCHED_ERR_ARG: return PROTO_E_ARG;
    case SCHED_ERR_STOPPED: return PROTO_E_DRAINING;
    default: return PROTO_E_INTERNAL;
    }
}

static void worker_tok(const sched_output *o, proto_tok *t)
{
    memset(t, 0, sizeof *t);
    t->token = o->token;
    t->logprob = o->logprob;
    t->n_top = (uint8_t)TM_MIN(o->n_top, PROTO_MAX_TOP);
    for (int i = 0; i < t->n_top; i++) {
        t->top_ids[i] = o->top[i].token;
        t->top_lps[i] = o->top[i].logprob;
    }
}

/* A TOKENS frame with the one token a prefill job produced (when it ends there instead of
 * handing off). */
static void worker_send_one_token(wjob *j, const sched_output *o, bool logprobs)
{
    proto_msg m;
    proto_tok t;
    memset(&m, 0, sizeof m);
    worker_tok(o, &t);
    m.hdr.type = PROTO_TOKENS;
    m.hdr.req_id = j->id;
    m.hdr.flags = logprobs ? PROTO_F_LOGPROBS : 0;
    m.u.tokens.n = 1;
    m.u.tokens.toks = &t;
    worker_send(j->c, &m);
}

/* Takes the job off its connection's list before its last frame goes out, so that the
 * gateway may reuse the request id (a mixed worker's DECODE after its HANDOFF) at once. */
static void worker_job_unlink(wjob *j)
{
    pthread_mutex_lock(&j->w->mu);
    if (j->linked)
        for (wjob **pp = &j->c->jobs; *pp; pp = &(*pp)->next)
            if (*pp == j) { *pp = j->next; break; }
    j->linked = false;
    pthread_mutex_unlock(&j->w->mu);
}


/* Sends the window states added and dropped since the last report to every connection (the
 * gateway's directory, windir.h). Called before a HANDOFF and a FINISH, so that the gateway
 * knows where the states of a request are by the time it places its next job, and with each
 * heartbeat. */
void worker_window_report(worker *w)
{
    if (!w->wc) return;
    pthread_mutex_lock(&w->wrep_mu);
    int n;
    while ((n = wincache_events(w->wc, w->wev, PROTO_MAX_WINDOW_EVENTS)) > 0) {
        for (int i = 0; i < n; i++) {
            w->wpev[i].op = w->wev[i].op;
            memcpy(w->wpev[i].key, w->wev[i].key, 32);
            w->wpev[i].ttl_ms = w->wev[i].ttl_ms;
        }
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_WINDOW;
        m.u.window.n = (uint32_t)n;
        m.u.window.ev = w->wpev;
        worker_broadcast(w, &m);
    }
    pthread_mutex_unlock(&w->wrep_mu);
}

/* WINFETCH: the state of the key, or an empty WINSTATE when it is not held (expired,
 * evicted, never here). */
void worker_window_serve(worker *w, wconn *c, const proto_msg *q)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINSTATE;
    m.hdr.req_id = q->hdr.req_id;
    memcpy(m.u.winstate.key, q->u.winfetch.key, 32);
    size_t eb = wincache_entry_bytes(w->wc);
    /* a state larger than a frame (a big recurrent model's) is answered as not held: the job
     * replays, as for any state it cannot get */
    uint8_t *buf = eb && eb <= PROTO_MAX_PAYLOAD - 64 ? malloc(eb) : NULL;
    if (buf && wincache_peek(w->wc, q->u.winfetch.key, buf, util_now())) {
        m.u.winstate.n_bytes = (uint32_t)eb;
        m.u.winstate.data = buf;
    }
    log_debug("worker: %s: window fetch %llu: %s", c->peer, (unsigned long long)q->hdr.req_id,
              m.u.winstate.n_bytes ? "sent" : "not held");
    worker_send(c, &m);
    free(buf);
}

/* WINSTATE from the gateway: a state another worker produced, for a job about to come. The
 * payload is checked against this model's geometry (its size); one that does not fit is
 * logged and dropped (the job replays). */
void worker_window_keep(worker *w, wconn *c, const proto_msg *m)
{
    size_t eb = wincache_entry_bytes(w->wc);
    if (!eb || m->u.winstate.n_bytes != eb) {
        log_warn("worker: %s: a window state of %u bytes, this model's are %zu: not kept", c->peer,
                 m->u.winstate.n_bytes, eb);
        return;
    }
    wincache_put_fetched(w->wc, m->u.winstate.key, m->u.winstate.data, util_now());
}

/* The request's FINISH with its usage (fin: the scheduler's record, whose drafts are this
 * worker's; NULL: none, as when it ended at its first token) and the figures given. */
static void worker_send_finish(wjob *j, int reason, int n_prompt, int n_cached, int n_completion, double ttft,
                               const sched_output *fin)
{
    worker_window_report(j->w);
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_FINISH;
    m.hdr.req_id = j->id;
    m.u.finish.reason = (uint8_t)reason;
    m.u.finish.prompt_tokens = (uint32_t)n_prompt;
    m.u.finish.cached_tokens = (uint32_t)TM_MIN(n_cached, n_prompt);
    m.u.finish.completion_tokens = (uint32_t)n_completion;
    m.u.finish.ttft_us = ttft > 0 ? (uint32_t)(ttft * 1e6) : 0;
    if (fin && (fin->usage.accepted_drafts > 0 || fin->usage.rejected_drafts > 0)) {
        m.hdr.flags |= PROTO_F_DRAFTS;
        m.u.finish.accepted_drafts = (uint32_t)TM_MIN(fin->usage.accepted_drafts, n_completion);
        m.u.finish.rejected_drafts = (uint32_t)TM_MIN(fin->usage.rejected_drafts, n_completion * SPEC_MAX_K);
    }
    worker_job_unlink(j);
    worker_send(j->c, &m);
}

static int worker_finish_reason(wjob *j, sched_finish f)
{
    if (f == SCHED_FINISH_CANCELLED) {
        pthread_mutex_lock(&j->w->mu);
        bool moved = j->moved;
        pthread_mutex_unlock(&j->w->mu);
        return moved ? PROTO_FINISH_MOVED : PROTO_FINISH_CANCELLED;
    }
    return f == SCHED_FINISH_STOP ? PROTO_FINISH_STOP : f == SCHED_FINISH_LENGTH ? PROTO_FINISH_LENGTH
                                                                                 : PROTO_FINISH_ERROR;
}

/* Waits for the write-behind to take what is queued now, then counts the stored leading
 * full blocks of the prompt. */
static int worker_stored_prefix(worker *w, const proto_prefill_job *p)
{
    int n_full = (int)p->n_prompt / KVPOOL_BLOCK;
    if (!w->st || !w->bio || n_full == 0) return 0;
    (void)blockio_wait_writes(w->bio, (int)(WORKER_FLUSH_WAIT_S * 1000));
    uint8_t root[32] = { 0 };
    if (p->params.salt && *p->params.salt) blockkey_root(p->params.salt, strlen(p->params.salt), root);
    uint8_t (*keys)[32] = malloc((size_t)n_full * 32);
    if (!keys) return 0;
    blockkey_chain(root, p->prompt, n_full, w->pool_fp, keys);
    int n = store_exists(w->st, (const uint8_t (*)[32])keys, n_full);
    free(keys);
    return n * KVPOOL_BLOCK;
}

static void worker_job_ready(void *arg);

/* Submits, records the handle, applies a cancel that came first. */
static sched_status worker_submit(wjob *j, sched_params *sp)
{
    sp->on_output = worker_job_ready;   /* the engine thread wakes a pump for each output */
    sp->out_arg = j;
    sched_req *r = NULL;
    sched_status st = sched_submit(j->w->s, sp, &r);
    if (st != SCHED_OK) return st;
    pthread_mutex_lock(&j->w->mu);
    j->req = r;
    if (j->cancel || j->moved) sched_cancel(r);
    pthread_mutex_unlock(&j->w->mu);
    return SCHED_OK;
}

/* Submits the job to the scheduler; false (ERROR sent) when it is refused. */
static bool worker_job_start(wjob *j)
{
    worker *w = j->w;
    sched_params sp;
    bool ok;
    if (j->msg.hdr.type == PROTO_PREFILL) {
        const proto_prefill_job *p = &j->msg.u.prefill;
        ok = worker_params(w, &p->params, &sp);
        sp.prompt = p->prompt;
        sp.n_prompt = (int)p->n_prompt;
        sp.max_tokens = 1;
        if (j->msg.hdr.flags & PROTO_F_EMBED) sp.embed = (model_pool)p->embed;   /* worker_embed_done answers */
        else sp.kv_out = worker_kv_out;   /* an embedding hands nothing off */
    } else {
        const proto_decode_job *d = &j->msg.u.decode;
        ok = worker_params(w, &d->params, &sp);
        sp.prompt = d->prompt;
        sp.n_prompt = (int)d->n_prompt;
        sp.gen = d->gen;
        sp.n_gen = (int)d->n_gen;
        sp.n_sampled = (int)d->n_sampled;
        sp.kv_in = worker_kv_in;   /* installs the tail (HAS_TAIL); times the KV's arrival always */
        j->counted = (j->msg.hdr.flags & PROTO_F_RESUME) != 0;   /* a resume is no handoff */
        j->ctx_len = (int)(d->n_prompt + d->n_gen);
    }
    sp.kv_arg = j;
    const proto_params *pp = j->msg.hdr.type == PROTO_PREFILL ? &j->msg.u.prefill.params : &j->msg.u.decode.params;
    grammar *g = NULL;
    if (ok && pp->grammar) {
        /* compiled here, on the pump, through the cache: the gateway compiled the same source,
         * so this fails only when the builds differ; then the job is refused naming why */
        char err[PROTO_MAX_STR - 32] = "no vocabulary for grammars on this worker";
        grammar_status gs = w->o.gvocab ? grammar_cache_get(w->gcache, (grammar_kind)pp->grammar_kind, pp->grammar,
                                                            pp->grammar_len, &g, err, sizeof err)
                                        : GRAMMAR_ERR_INVALID;
        if (gs != GRAMMAR_OK) {
            char msg[PROTO_MAX_STR];
            snprintf(msg, sizeof msg, "grammar: %s", err);
            log_info("worker: req %llu refused: %s", (unsigned long long)j->id, msg);
            worker_job_unlink(j);
            worker_send_error(j->c, j->id, PROTO_E_ARG, msg);
            return false;
        }
        sp.grammar = g;
        sp.grammar_vocab = w->o.gvocab;
        sp.grammar_lazy = pp->grammar_lazy;   /* sched_submit checks the trigger is in the vocabulary */
        sp.grammar_trigger = pp->grammar_trigger;
    }
    sched_status st = ok ? worker_submit(j, &sp) : SCHED_ERR_ARG;
    grammar_free(g);   /* sched_submit took its own reference */
    if (st != SCHED_OK) {
        worker_job_unlink(j);
        worker_send_error(j->c, j->id, worker_sched_error(st), sched_status_name(st));
        return false;
    }
    return true;
}

/* An embedding PREFILL that ended: its vector (EMBEDDING) when computed, then FINISH. */
static void worker_embed_done(wjob *j)
{
    const sched_output fin = j->fin;
    const float *v = fin.finish == SCHED_FINISH_STOP && j->req ? sched_embedding(j->req) : NULL;
    if (v) {
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_EMBEDDING;
        m.hdr.req_id = j->id;
        m.u.embedding.n = (uint32_t)j->w->m->hp.dim;
        m.u.embedding.v = (float *)v;
        worker_send(j->c, &m);
    }
    worker_send_finish(j, v ? PROTO_FINISH_STOP : worker_finish_reason(j, fin.finish), (int)j->msg.u.prefill.n_prompt, 0, 0,
                       fin.ttft_s, NULL);
}

/* A prefill whose request ended (its one token, or cancelled / failed): HANDOFF, or the
 * token and FINISH when the request ends there. */
static void worker_prefill_done(wjob *j)
{
    worker *w = j->w;
    const proto_prefill_job *p = &j->msg.u.prefill;
    const sched_output first = j->first, fin = j->fin;
    if (j->msg.hdr.flags & PROTO_F_EMBED) {
        worker_embed_done(j);
        return;
    }
    double t_first = util_now();
    pthread_mutex_lock(&w->mu);
    j->first_done = true;
    pthread_mutex_unlock(&w->mu);
    int n_prompt = (int)p->n_prompt, n_cached = fin.usage.cached_tokens;
    if (first.token < 0 || fin.finish != SCHED_FINISH_LENGTH || first.is_stop) {
        /* ended at the first token (stop), or cancelled / failed before it */
        if (first.token >= 0) worker_send_one_token(j, &first, p->params.logprobs);
        worker_send_finish(j, worker_finish_reason(j, fin.finish), n_prompt, n_cached, first.token >= 0,
                           fin.ttft_s, NULL);
        return;
    }
    if (p->params.max_tokens == 1 || n_prompt + 1 >= w->o.n_ctx) {
        worker_send_one_token(j, &first, p->params.logprobs);
        worker_send_finish(j, PROTO_FINISH_LENGTH, n_prompt, n_cached, 1, fin.ttft_s, NULL);
        return;
    }
    int n_stored = worker_stored_prefix(w, p);
    worker_window_report(w);   /* before the HANDOFF: the decode job placed on it fetches them */
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HANDOFF;
    m.hdr.req_id = j->id;
    proto_handoff *h = &m.u.handoff;
    worker_tok(&first, &h->first);
    h->n_prompt = (uint32_t)n_prompt;
    h->n_cached = (uint32_t)n_cached;
    h->n_computed = (uint32_t)(n_prompt - n_cached);
    h->n_stored = (uint32_t)n_stored;
    h->n_sampled = p->params.sample.temp > 0 ? 1 : 0;
    h->prefill_us = (uint32_t)((util_now() - j->t_recv) * 1e6);
    if (j->tail && j->tail_start == n_stored && j->tail_n > 0) {
        kvpool *pool = engine_kvpool(w->e);
        m.hdr.flags = PROTO_F_HAS_TAIL;
        h->kv.dtype = (uint8_t)kvpool_dtype(pool);
        h->kv.n_parts = (uint8_t)kvpool_n_parts(pool);
        h->kv.n_layers = (uint16_t)w->m->hp.n_layers;
        h->kv.n_kv_heads = (uint16_t)kvpool_n_kv_heads(pool);
        h->kv.head_dim = (uint16_t)kvpool_block_width_max(pool);
        h->kv.start = (uint32_t)j->tail_start;
        h->kv.n = (uint32_t)j->tail_n;
        h->kv.n_bytes = (uint32_t)j->tail_bytes;
        h->kv.data = j->tail;
    }
    double t0 = util_now();
    worker_job_unlink(j);
    bool sent = worker_send(j->c, &m);
    double t1 = util_now();
    if (sent) {
        pthread_mutex_lock(&w->mu);
        w->n_handoffs_out++;
        w->handoff_out_tokens += (uint64_t)n_prompt;
        w->handoff_out_us += (uint64_t)((t1 - t_first) * 1e6);
        pthread_mutex_unlock(&w->mu);
    }
    log_debug("worker: req %llu: handoff: prompt %d, cached %d, stored %d, tail %d tokens %zu bytes, sent in %.1f us "
              "(%.1f us from the first token)",
              (unsigned long long)j->id, n_prompt, n_cached, n_stored, j->tail_n, j->tail_bytes, (t1 - t0) * 1e6,
              (t1 - t_first) * 1e6);
}

/* Whether answering the prefill that ended waits for the store: it hands off (the request goes
 * on) and the prompt has full blocks the write-behind must have taken first. */
static bool worker_prefill_waits(const wjob *j)
{
    const worker *w = j->w;
    const proto_prefill_job *p = &j->msg.u.prefill;
    bool goes_on = j->first.token >= 0 && j->fin.finish == SCHED_FINISH_LENGTH && !j->first.is_stop &&
                   p->params.max_tokens != 1 && (int)p->n_prompt + 1 < w->o.n_ctx;
    return goes_on && w->st && w->bio && p->n_prompt >= KVPOOL_BLOCK;
}

/* Takes a prefill's outputs; true once it ended (worker_prefill_done answers it). */
static bool worker_prefill_step(wjob *j)
{
    sched_output outs[4];
    int n;
    while ((n = sched_poll(j->req, outs, 4, 0)) > 0)
        for (int i = 0; i < n; i++) {
            if (outs[i].kind == SCHED_OUT_TOKEN) j->first = outs[i];
            else {
                j->fin = outs[i];
                j->got_fin = true;
            }
        }
    return j->got_fin;
}

/* Sends a decode's new tokens (one TOKENS frame per batch taken) and its FINISH; true once
 * it ended. */
static bool worker_decode_step(wjob *j)
{
    worker *w = j->w;
    const proto_decode_job *d = &j->msg.u.decode;
    sched_output outs[64];
    proto_tok toks[64];
    bool ended = false;
    int n;
    while (!ended && (n = sched_poll(j->req, outs, 64, 0)) > 0) {
        int nt = 0;
        for (int i = 0; i < n; i++)
            if (outs[i].kind == SCHED_OUT_TOKEN) worker_tok(&outs[i], &toks[nt++]);
        if (nt && !j->counted) {
            /* the first token came after the admission, so the kv_in hook has run */
            j->counted = true;
            if (j->kv_in_seen && j->kv_in_pos > 0) {
                pthread_mutex_lock(&w->mu);
                w->n_handoffs_in++;
                w->handoff_in_tokens += (uint64_t)j->kv_in_pos;
                w->handoff_in_us += (uint64_t)((j->t_kv_in - j->t_recv) * 1e6);
                pthread_mutex_unlock(&w->mu);
            }
        }
        if (nt) {
            proto_msg m;
            memset(&m, 0, sizeof m);
            m.hdr.type = PROTO_TOKENS;
            m.hdr.req_id = j->id;
            m.hdr.flags = d->params.logprobs ? PROTO_F_LOGPROBS : 0;
            m.u.tokens.n = (uint32_t)nt;
            m.u.tokens.toks = toks;
            worker_send(j->c, &m);
            pthread_mutex_lock(&w->mu);
            j->ctx_len += nt;
            pthread_mutex_unlock(&w->mu);
        }
        for (int i = 0; i < n; i++)
            if (outs[i].kind == SCHED_OUT_FINISH) {
                worker_send_finish(j, worker_finish_reason(j, outs[i].finish), (int)d->n_prompt, (int)d->n_cached,
                                   outs[i].usage.completion_tokens, outs[i].ttft_s, &outs[i]);
                ended = true;
            }
    }
    return ended;
}

/* The job's last frame went out (or it was refused): off its connection, freed. */
static void worker_job_end(wjob *j)
{
    worker *w = j->w;
    worker_job_unlink(j);
    pthread_mutex_lock(&w->mu);
    sched_req *r = j->req;
    j->req = NULL;
    worker_conn_unref_locked(w, j->c);
    w->n_jobs--;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (r) sched_release(r);
    proto_msg_free(&j->msg);
    free(j->tail);
    free(j);
}

/* Appends j to the ready queue and wakes a pump (pump_mu held). */
/* The pumps' ready queue and the handoff thread's queue are both jobs linked by rnext, under
 * pump_mu: j goes to the back of *head..*tail, and one waiter on cv wakes. */
static void worker_queue_push(wjob **head, wjob **tail, pthread_cond_t *cv, wjob *j)
{
    j->rnext = NULL;
    if (*tail) (*tail)->rnext = j;
    else *head = j;
    *tail = j;
    pthread_cond_signal(cv);
}

/* The front of a queue (pump_mu held), waiting on cv for one; NULL once pump_stop is set and
 * the queue is empty. */
static wjob *worker_queue_pop(worker *w, wjob **head, wjob **tail, pthread_cond_t *cv)
{
    while (!*head && !w->pump_stop) pthread_cond_wait(cv, &w->pump_mu);
    wjob *j = *head;
    if (!j) return NULL;
    *head = j->rnext;
    if (!*head) *tail = NULL;
    return j;
}

static void worker_ready_push_locked(worker *w, wjob *j)
{
    j->queued = true;
    worker_queue_push(&w->ready_head, &w->ready_tail, &w->pump_cv, j);
}

/* Queues j for a pump; a job being served is marked to be served again instead, so that one
 * pump at a time serves a job (its frames keep their order). Called by the engine thread
 * under the scheduler's lock (sched_params.on_output) and by the reader: takes pump_mu only,
 * which nobody holds while calling sched_* or taking w->mu. */
static void worker_job_ready(void *arg)
{
    wjob *j = arg;
    worker *w = j->w;
    pthread_mutex_lock(&w->pump_mu);
    if (j->busy) j->again = true;
    else if (!j->queued) worker_ready_push_locked(w, j);
    pthread_mutex_unlock(&w->pump_mu);
}

/* A pump: serves the jobs that have something to do, until worker_free stops it with none
 * left. After a job's FINISH was taken the scheduler queues nothing more for it, so a job that
 * ended is in no queue and may be freed. */
void *worker_pump_thread(void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->pump_mu);
    for (;;) {
        wjob *j = worker_queue_pop(w, &w->ready_head, &w->ready_tail, &w->pump_cv);
        if (!j) break;
        j->queued = false;
        j->busy = true;
        j->again = false;
        pthread_mutex_unlock(&w->pump_mu);
        bool ended;
        if (!j->started) {
            j->started = true;
            ended = !worker_job_start(j);
        } else {
            ended = j->msg.hdr.type == PROTO_PREFILL ? worker_prefill_step(j) : worker_decode_step(j);
        }
        if (ended && j->got_fin && worker_prefill_waits(j)) {   /* not on a pump: the handoff thread */
            pthread_mutex_lock(&w->pump_mu);
            worker_queue_push(&w->ho_head, &w->ho_tail, &w->handoff_cv, j);
            continue;
        }
        if (ended) {
            if (j->got_fin) worker_prefill_done(j);
            worker_job_end(j);
            pthread_mutex_lock(&w->pump_mu);
            continue;
        }
        pthread_mutex_lock(&w->pump_mu);
        j->busy = false;
        if (j->again) worker_ready_push_locked(w, j);
    }
    pthread_mutex_unlock(&w->pump_mu);
    return NULL;
}

/* Sends the HANDOFFs that wait for the prompt's full blocks to be in the store
 * (worker_prefill_waits), in order, so that the pumps never wait on the store; a wait covers
 * the writes queued until then, so the prefills behind it mostly find theirs done. */
void *worker_handoff_thread(void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->pump_mu);
    for (;;) {
        wjob *j = worker_queue_pop(w, &w->ho_head, &w->ho_tail, &w->handoff_cv);
        if (!j) break;
        pthread_mutex_unlock(&w->pump_mu);
        worker_prefill_done(j);
        worker_job_end(j);
        pthread_mutex_lock(&w->pump_mu);
    }
    pthread_mutex_unlock(&w->pump_mu);
    return NULL;
}

/* Takes ownership of m (a PREFILL or DECODE): checks it, lists it on its connection and hands
 * it to the pumps, which submit it. */
void worker_start_job(worker *w, wconn *c, proto_msg *m)
{
    int t = m->hdr.type;
    bool role_ok = w->o.role == PROTO_ROLE_MIXED || (t == PROTO_PREFILL && w->o.role == PROTO_ROLE_PREFILL) ||
                   (t == PROTO_DECODE && w->o.role == PROTO_ROLE_DECODE);
    uint64_t id = m->hdr.req_id;
    if (!role_ok || id == 0) {
        proto_msg_free(m);
        worker_send_error(c, id, id ? PROTO_E_ROLE : PROTO_E_ARG, id ? "job type not taken by this role" : "request id 0");
        return;
    }
    pthread_mutex_lock(&w->mu);
    bool dup = false;
    for (wjob *x = c->jobs; x; x = x->next) dup |= x->id == id;
    if (w->draining || dup || w->stop) {
        bool draining = w->draining || w->stop;
        pthread_mutex_unlock(&w->mu);
        proto_msg_free(m);
        worker_send_error(c, id, draining ? PROTO_E_DRAINING : PROTO_E_DUPLICATE,
                          draining ? "worker is draining" : "request id already running");
        return;
    }
    wjob *j = xcalloc(1, sizeof *j);
    j->w = w;
    j->c = c;
    j->id = id;
    j->msg = *m;
    j->t_recv = util_now();
    j->ctx_len = t == PROTO_PREFILL ? (int)m->u.prefill.n_prompt : (int)(m->u.decode.n_prompt + m->u.decode.n_gen);
    j->first.token = -1;
    j->fin.kind = SCHED_OUT_TOKEN;   /* no FINISH yet */
    c->refs++;
    j->next = c->jobs;
    c->jobs = j;
    j->linked = true;
    w->n_jobs++;
    pthread_mutex_unlock(&w->mu);
    worker_job_ready(j);
}
