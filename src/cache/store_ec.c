/*
 * store_ec: Reed-Solomon erasure-coded store over K+M dir targets (design in store_ec.h).
 * Locks: each target queue's mutex guards its job list; each read/write context's mutex
 * guards its fragment states; the decode cache has its own mutex. A worker never holds its
 * queue lock while it takes a context lock.
 */
#include "cache/store_ec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <isa-l/erasure_code.h>

#include "cache/block.h"
#include "util/util.h"

#define STORE_EC_DEC_CACHE 64      /* decode tables kept, one per loss pattern */
#define STORE_EC_ALIGN 64          /* fragment payload size is a multiple of this */

enum { EC_JOB_READ, EC_JOB_WRITE };
enum { EC_FRAG_IDLE = 0, EC_FRAG_PENDING, EC_FRAG_GOOD, EC_FRAG_BAD, EC_FRAG_TAKEN };

typedef struct ec_ctx {
    pthread_mutex_t mu;          /* guards everything below */
    pthread_cond_t cv;
    int refs;                    /* the caller + one per queued job */
    int n_pending;               /* jobs not finished */
    int n_good;                  /* reads: verified fragments; writes: fragments written */
    bool abandoned;              /* the caller is gone: late read buffers are freed */
    int state[STORE_EC_MAX];     /* EC_FRAG_* per fragment index */
    uint8_t *buf[STORE_EC_MAX];  /* fragment file bytes (reads) */
    size_t len[STORE_EC_MAX];
    store_status wst[STORE_EC_MAX]; /* write results */
} ec_ctx;

typedef struct ec_job {
    struct ec_job *next;
    int op;                      /* EC_JOB_* */
    int frag;                    /* fragment index */
    uint8_t key[32];
    double ttl_s;
    struct iovec iov[2];         /* writes: header, payload */
    ec_ctx *ctx;
} ec_job;

typedef struct {
    store_ec *e;
    int target;
    pthread_t th;
    bool started;
    pthread_mutex_t mu;          /* guards head/tail/stop */
    pthread_cond_t cv;
    ec_job *head, *tail;
    bool stop;
} ec_queue;

typedef struct {
    uint32_t mask;               /* fragment indices used as sources; 0 = empty slot */
    int n_out;                   /* missing data fragments recovered */
    uint8_t *tbls;               /* (32 * k * n_out) ISA-L tables */
} ec_dec_entry;

struct store_ec {
    int k, m, n;                 /* data, parity, total fragments */
    store_dir *t[STORE_EC_MAX];  /* targets (NULL: could not be opened) */
    ec_queue q[STORE_EC_MAX];    /* one I/O thread per target */
    uint8_t *enc;                /* (n, k) Cauchy encode matrix, first k rows identity */
    uint8_t *enc_tbls;           /* (32 * k * m) tables of the parity rows */
    pthread_mutex_t dec_mu;      /* guards dec[] and dec_next */
    ec_dec_entry dec[STORE_EC_DEC_CACHE];
    int dec_next;                /* slot replaced next when full */
    store_ec_counters c;         /* atomic */
};

#define EC_INC(e, field) __atomic_fetch_add(&(e)->c.field, 1, __ATOMIC_RELAXED)

static void ec_put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void ec_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t ec_get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t ec_get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static const char ec_magic[8] = "TMECFRG";

static size_t ec_frag_bytes(int k, uint64_t blob)
{
    size_t f = (size_t)((blob + (uint64_t)k - 1) / (uint64_t)k);
    f = TM_ALIGN_UP(f, STORE_EC_ALIGN);
    return f ? f : STORE_EC_ALIGN;
}

int store_ec_frag_target(const store_ec *e, const uint8_t key[32], int i)
{
    return (i + key[31]) % e->n;
}

int store_ec_n_targets(const store_ec *e) { return e->n; }
store_dir *store_ec_target(store_ec *e, int i) { return i >= 0 && i < e->n ? e->t[i] : NULL; }
void store_ec_geometry(const store_ec *e, int *k, int *m) { *k = e->k; *m = e->m; }

void store_ec_get_counters(store_ec *e, store_ec_counters *c)
{
    uint64_t *dst = (uint64_t *)c, *src = (uint64_t *)&e->c;
    for (size_t i = 0; i < sizeof *c / sizeof(uint64_t); i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

bool store_ec_frag_verify(const store_ec *e, const void *p, size_t n, const uint8_t *key, int *index)
{
    const uint8_t *b = p;
    if (n < STORE_EC_FRAG_HEADER || memcmp(b, ec_magic, 8) || ec_get32(b + 8) != 1) return false;
    if (ec_get32(b + 124) != block_crc32c(b, 124)) return false;
    uint32_t k = ec_get32(b + 12), m = ec_get32(b + 16), idx = ec_get32(b + 20);
    uint64_t blob = ec_get64(b + 24), frag = ec_get64(b + 32);
    if ((int)k != e->k || (int)m != e->m || idx >= k + m) return false;
    if (frag != ec_frag_bytes(e->k, blob) || n != STORE_EC_FRAG_HEADER + frag) return false;
    if (key && memcmp(b + 40, key, 32)) return false;
    if (block_crc64(b + STORE_EC_FRAG_HEADER, (size_t)frag) != ec_get64(b + 72)) return false;
    if (index) *index = (int)idx;
    return true;
}

store_status store_ec_peek(store_ec *e, const uint8_t key[32], void *buf, size_t n)
{
    store_dir *d = store_ec_target(e, store_ec_frag_target(e, key, 0));
    if (!d || n > 4096) return STORE_MISS;
    uint8_t b[STORE_EC_FRAG_HEADER + 4096];
    if (store_dir_peek(d, key, b, STORE_EC_FRAG_HEADER + n) != STORE_OK) return STORE_MISS;
    if (memcmp(b, ec_magic, 8) || ec_get32(b + 8) != 1 || ec_get32(b + 124) != block_crc32c(b, 124) ||
        ec_get32(b + 20) != 0 || memcmp(b + 40, key, 32) || ec_get64(b + 32) < n)
        return STORE_MISS;
    memcpy(buf, b + STORE_EC_FRAG_HEADER, n);
    return STORE_OK;
}

/* ---- contexts and workers ---- */

static ec_ctx *ec_ctx_new(void)
{
    ec_ctx *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->refs = 1;
    return c;
}

/* Drops one reference; the caller holds c->mu, which this releases. */
static void ec_ctx_unref_locked(ec_ctx *c)
{
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (!last) return;
    for (int i = 0; i < STORE_EC_MAX; i++)
        if (c->state[i] != EC_FRAG_TAKEN) free(c->buf[i]);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static void ec_job_run(store_ec *e, int target, ec_job *j)
{
    store_dir *d = e->t[target];
    ec_ctx *c = j->ctx;
    if (j->op == EC_JOB_WRITE) {
        store_status st = d ? store_dir_putv(d, j->key, j->iov, 2, j->ttl_s) : STORE_IO;
        pthread_mutex_lock(&c->mu);
        c->wst[j->frag] = st;
        if (st == STORE_OK) c->n_good++;
        c->n_pending--;
        pthread_cond_broadcast(&c->cv);
        ec_ctx_unref_locked(c);
        return;
    }
    void *buf = NULL;
    size_t len = 0;
    store_status st = d ? store_dir_read(d, j->key, j->ttl_s, &buf, &len) : STORE_IO;
    bool good = false;
    if (st == STORE_OK) {
        int idx = -1;
        good = store_ec_frag_verify(e, buf, len, j->key, &idx) && idx == j->frag;
        if (!good) {
            EC_INC(e, n_frag_corrupt);
            store_dir_delete(d, j->key);
            free(buf);
            buf = NULL;
        }
    } else {
        EC_INC(e, n_frag_missing);
    }
    pthread_mutex_lock(&c->mu);
    if (c->abandoned) {
        free(buf);
    } else {
        c->buf[j->frag] = buf;
        c->len[j->frag] = len;
        c->state[j->frag] = good ? EC_FRAG_GOOD : EC_FRAG_BAD;
        if (good) c->n_good++;
    }
    c->n_pending--;
    pthread_cond_broadcast(&c->cv);
    ec_ctx_unref_locked(c);
}

static void *ec_worker_main(void *arg)
{
    ec_queue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        ec_job *j = q->head;
        if (!j) {   /* stop, queue drained */
            pthread_mutex_unlock(&q->mu);
            return NULL;
        }
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        ec_job_run(q->e, q->target, j);
        free(j);
    }
}

/* Queues a job for fragment frag of key on its target; the caller holds c->mu. */
static void ec_submit(store_ec *e, ec_ctx *c, int op, int frag, const uint8_t key[32], double ttl_s,
                      const struct iovec *iov)
{
    int t = store_ec_frag_target(e, key, frag);
    c->state[frag] = EC_FRAG_PENDING;
    if (!e->t[t] || !e->q[t].started) {   /* target down: an immediate failure */
        if (op == EC_JOB_READ) {
            c->state[frag] = EC_FRAG_BAD;
            EC_INC(e, n_frag_missing);
        } else {
            c->wst[frag] = STORE_IO;
        }
        return;
    }
    ec_job *j = xcalloc(1, sizeof *j);
    j->op = op;
    j->frag = frag;
    memcpy(j->key, key, 32);
    j->ttl_s = ttl_s;
    if (iov) memcpy(j->iov, iov, sizeof j->iov);
    j->ctx = c;
    c->refs++;
    c->n_pending++;
    ec_queue *q = &e->q[t];
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = j; else q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* ---- open / close ---- */

store_status store_ec_open(int k, int m, char **targets, const store_dir_opts *opts, store_ec **out)
{
    *out = NULL;
    if (k < 1 || m < 0 || k + m > STORE_EC_MAX) return STORE_ARG;
    store_ec *e = xcalloc(1, sizeof *e);
    e->k = k;
    e->m = m;
    e->n = k + m;
    pthread_mutex_init(&e->dec_mu, NULL);
    e->enc = xmalloc((size_t)e->n * (size_t)k);
    gf_gen_cauchy1_matrix(e->enc, e->n, k);
    e->enc_tbls = xmalloc(32 * (size_t)k * (size_t)(m ? m : 1));
    if (m) ec_init_tables(k, m, e->enc + (size_t)k * (size_t)k, e->enc_tbls);
    int n_ok = 0;
    store_dir_opts o = *opts;
    o.ext = "frg";
    for (int i = 0; i < e->n; i++) {
        const char *path = targets[i];
        if (!strncmp(path, "dir:", 4)) path += 4;
        if (store_dir_open(path, &o, &e->t[i]) == STORE_OK) n_ok++;
        ec_queue *q = &e->q[i];
        q->e = e;
        q->target = i;
        pthread_mutex_init(&q->mu, NULL);
        pthread_cond_init(&q->cv, NULL);
        if (e->t[i] && !pthread_create(&q->th, NULL, ec_worker_main, q)) q->started = true;
    }
    if (n_ok < k) {
        log_error("store ec:%d+%d: only %d of %d targets usable; running without this cache", k, m, n_ok, e->n);
        store_ec_close(e);
        return STORE_IO;
    }
    if (n_ok < e->n)
        log_warn("store ec:%d+%d: %d of %d targets missing; blocks keep less redundancy", k, m, e->n - n_ok, e->n);
    *out = e;
    return STORE_OK;
}

void store_ec_close(store_ec *e)
{
    if (!e) return;
    for (int i = 0; i < e->n; i++) {
        ec_queue *q = &e->q[i];
        if (q->started) {
            pthread_mutex_lock(&q->mu);
            q->stop = true;
            pthread_cond_signal(&q->cv);
            pthread_mutex_unlock(&q->mu);
            pthread_join(q->th, NULL);
        }
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
        store_dir_close(e->t[i]);
    }
    for (int i = 0; i < STORE_EC_DEC_CACHE; i++) free(e->dec[i].tbls);
    pthread_mutex_destroy(&e->dec_mu);
    free(e->enc);
    free(e->enc_tbls);
    free(e);
}

/* ---- put ---- */

store_status store_ec_put(store_ec *e, const uint8_t key[32], const void *file, size_t n, double ttl_s)
{
    const uint8_t *blob = file;
    int k = e->k, m = e->m;
    size_t f = ec_frag_bytes(k, n);
    /* data fragments point into the file where they are whole; the tail is padded */
    int first_partial = (int)(n / f);                   /* fragments [first_partial, k) are copied */
    int n_pad = k - first_partial;
    uint8_t *pad = n_pad > 0 ? util_aligned_alloc(f * (size_t)n_pad) : NULL;
    uint8_t *par = m ? util_aligned_alloc(f * (size_t)m) : NULL;
    uint8_t *hdr = xcalloc((size_t)e->n, STORE_EC_FRAG_HEADER);
    if ((n_pad > 0 && !pad) || (m && !par)) {
        free(pad); free(par); free(hdr);
        return STORE_IO;
    }
    uint8_t *data[STORE_EC_MAX], *parity[STORE_EC_MAX];
    for (int i = 0; i < k; i++) {
        if (i < first_partial) {
            data[i] = (uint8_t *)blob + (size_t)i * f;
        } else {
            data[i] = pad + (size_t)(i - first_partial) * f;
            size_t off = (size_t)i * f, len = off < n ? TM_MIN(f, n - off) : 0;
            memset(data[i], 0, f);
            if (len) memcpy(data[i], blob + off, len);
        }
    }
    for (int i = 0; i < m; i++) parity[i] = par + (size_t)i * f;
    if (m) ec_encode_data((int)f, k, m, e->enc_tbls, data, parity);

    ec_ctx *c = ec_ctx_new();
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < e->n; i++) {
        uint8_t *h = hdr + (size_t)i * STORE_EC_FRAG_HEADER;
        uint8_t *payload = i < k ? data[i] : parity[i - k];
        memcpy(h, ec_magic, 8);
        ec_put32(h + 8, 1);
        ec_put32(h + 12, (uint32_t)k);
        ec_put32(h + 16, (uint32_t)m);
        ec_put32(h + 20, (uint32_t)i);
        ec_put64(h + 24, n);
        ec_put64(h + 32, f);
        memcpy(h + 40, key, 32);
        ec_put64(h + 72, block_crc64(payload, f));
        ec_put32(h + 124, block_crc32c(h, 124));
        struct iovec iov[2] = { { h, STORE_EC_FRAG_HEADER }, { payload, f } };
        ec_submit(e, c, EC_JOB_WRITE, i, key, ttl_s, iov);
    }
    while (c->n_pending > 0) pthread_cond_wait(&c->cv, &c->mu);
    int n_good = c->n_good;
    store_status worst = STORE_OK;
    for (int i = 0; i < e->n; i++)
        if (c->wst[i] != STORE_OK && (worst == STORE_OK || c->wst[i] == STORE_NOSPACE)) worst = c->wst[i];
    ec_ctx_unref_locked(c);
    free(pad);
    free(par);
    free(hdr);
    if (n_good == e->n) return STORE_OK;
    if (n_good >= k) {
        EC_INC(e, n_degraded_put);
        return STORE_OK;
    }
    store_ec_delete(e, key);   /* fewer than K: unreadable, take the pieces back */
    return worst == STORE_OK ? STORE_IO : worst;
}

/* ---- get ---- */

/* Decode tables recovering the data fragments missing from src (k sorted source indices). */
static const uint8_t *ec_dec_tables(store_ec *e, const int *src, int *n_out_ret, int *missing)
{
    int k = e->k;
    uint32_t mask = 0;
    for (int i = 0; i < k; i++) mask |= 1u << src[i];
    int n_out = 0;
    for (int i = 0; i < k; i++)
        if (!(mask & (1u << i))) missing[n_out++] = i;
    *n_out_ret = n_out;
    /* the cache (the caller holds dec_mu and copies the tables out before releasing it) */
    for (int i = 0; i < STORE_EC_DEC_CACHE; i++)
        if (e->dec[i].mask == mask) {
            EC_INC(e, n_decode_cached);
            return e->dec[i].tbls;
        }
    uint8_t *b = xmalloc((size_t)k * (size_t)k), *inv = xmalloc((size_t)k * (size_t)k);
    for (int r = 0; r < k; r++) memcpy(b + (size_t)r * k, e->enc + (size_t)src[r] * k, (size_t)k);
    if (gf_invert_matrix(b, inv, k) < 0) {   /* cannot happen with a Cauchy matrix */
        free(b);
        free(inv);
        return NULL;
    }
    uint8_t *rows = xmalloc((size_t)k * (size_t)n_out);
    for (int j = 0; j < n_out; j++) memcpy(rows + (size_t)j * k, inv + (size_t)missing[j] * k, (size_t)k);
    ec_dec_entry *slot = &e->dec[e->dec_next];
    e->dec_next = (e->dec_next + 1) % STORE_EC_DEC_CACHE;
    free(slot->tbls);
    slot->tbls = xmalloc(32 * (size_t)k * (size_t)n_out);
    ec_init_tables(k, n_out, rows, slot->tbls);
    slot->mask = mask;
    slot->n_out = n_out;
    free(b);
    free(inv);
    free(rows);
    return slot->tbls;
}

store_status store_ec_get(store_ec *e, const uint8_t key[32], double ttl_s, void **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    int k = e->k;
    ec_ctx *c = ec_ctx_new();
    pthread_mutex_lock(&c->mu);
    int next = 0;
    for (; next < TM_MIN(k + 1, e->n); next++) ec_submit(e, c, EC_JOB_READ, next, key, ttl_s, NULL);
    for (;;) {
        if (c->n_good >= k) break;
        /* keep one read more in flight than still needed, while targets remain */
        while (c->n_pending < k - c->n_good + 1 && next < e->n) ec_submit(e, c, EC_JOB_READ, next++, key, ttl_s, NULL);
        if (c->n_good >= k || (c->n_pending == 0 && next >= e->n)) break;
        pthread_cond_wait(&c->cv, &c->mu);
    }
    if (c->n_good < k) {
        c->abandoned = true;
        ec_ctx_unref_locked(c);
        EC_INC(e, n_lost);
        return STORE_MISS;
    }
    /* the first k good fragments, data ones first (no decoding when all k are there) */
    int src[STORE_EC_MAX], n_src = 0;
    uint8_t *fbuf[STORE_EC_MAX] = { 0 };
    for (int i = 0; i < e->n && n_src < k; i++)
        if (c->state[i] == EC_FRAG_GOOD) {
            src[n_src++] = i;
            fbuf[i] = c->buf[i];
            c->state[i] = EC_FRAG_TAKEN;
        }
    c->abandoned = true;
    ec_ctx_unref_locked(c);

    const uint8_t *h0 = fbuf[src[0]];
    uint64_t blob = ec_get64(h0 + 24);
    size_t f = (size_t)ec_get64(h0 + 32);
    store_status st = STORE_OK;
    for (int i = 1; i < k; i++)
        if (ec_get64(fbuf[src[i]] + 24) != blob) st = STORE_CORRUPT;   /* mixed writes: never mix */
    uint8_t *res = st == STORE_OK ? util_aligned_alloc(f * (size_t)k) : NULL;
    if (st == STORE_OK && !res) st = STORE_IO;
    if (st == STORE_OK) {
        for (int i = 0; i < k; i++)
            if (src[i] < k) memcpy(res + (size_t)src[i] * f, fbuf[src[i]] + STORE_EC_FRAG_HEADER, f);
        if (src[k - 1] >= k) {   /* some data fragment is missing: decode it */
            EC_INC(e, n_decode);
            uint8_t *sp[STORE_EC_MAX], *dp[STORE_EC_MAX];
            int missing[STORE_EC_MAX], n_miss = 0;
            for (int i = 0; i < k; i++) sp[i] = fbuf[src[i]] + STORE_EC_FRAG_HEADER;
            /* copy the tables out so decodes of different blocks run in parallel */
            pthread_mutex_lock(&e->dec_mu);
            const uint8_t *tb = ec_dec_tables(e, src, &n_miss, missing);
            uint8_t *tcopy = tb ? xmalloc(32 * (size_t)k * (size_t)n_miss) : NULL;
            if (tb) memcpy(tcopy, tb, 32 * (size_t)k * (size_t)n_miss);
            pthread_mutex_unlock(&e->dec_mu);
            if (tcopy) {
                for (int j = 0; j < n_miss; j++) dp[j] = res + (size_t)missing[j] * f;
                ec_encode_data((int)f, k, n_miss, tcopy, sp, dp);
                free(tcopy);
            } else {
                st = STORE_CORRUPT;
            }
        }
    }
    for (int i = 0; i < e->n; i++) free(fbuf[i]);
    if (st != STORE_OK) {
        free(res);
        return st;
    }
    *out = res;
    *n_out = (size_t)blob;
    return STORE_OK;
}

bool store_ec_exists(store_ec *e, const uint8_t key[32])
{
    int have = 0, lost = 0;
    for (int i = 0; i < e->n; i++) {
        store_dir *d = e->t[store_ec_frag_target(e, key, i)];
        if (d && store_dir_exists(d, key)) {
            if (++have >= e->k) return true;
        } else if (++lost > e->n - e->k) {
            return false;
        }
    }
    return false;
}

store_status store_ec_delete(store_ec *e, const uint8_t key[32])
{
    bool any = false;
    for (int i = 0; i < e->n; i++)
        if (e->t[i] && store_dir_delete(e->t[i], key) == STORE_OK) any = true;
    return any ? STORE_OK : STORE_MISS;
}

void store_ec_encode_raw(int k, int m, int len, uint8_t **data, uint8_t **parity)
{
    uint8_t *a = xmalloc((size_t)(k + m) * (size_t)k), *tb = xmalloc(32 * (size_t)k * (size_t)m);
    gf_gen_cauchy1_matrix(a, k + m, k);
    ec_init_tables(k, m, a + (size_t)k * k, tb);
    ec_encode_data(len, k, m, tb, data, parity);
    free(a);
    free(tb);
}
