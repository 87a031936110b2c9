/*
 * store: spec parsing, dispatch to the dir / ec backends, verification of every block read,
 * counters, and the maintenance passes (fsck, gc, ls). Design in store.h.
 */
#include "cache/store.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/block.h"
#include "cache/blockkey.h"
#include "cache/gc.h"
#include "cache/store_dir.h"
#include "cache/store_ec.h"
#include "util/util.h"

typedef struct {
    uint64_t n_get, n_hit, n_miss, n_corrupt;
} store_counters;

struct store {
    char *spec;                        /* as given */
    store_opts o;
    gc_retention ret;                  /* TTL per traffic class */
    int k, m;                          /* ec geometry; 1 + 0 for dir */
    store_dir *dir;                    /* dir backend, or NULL */
    store_ec *ec;                      /* ec backend, or NULL */
    store_dir *live[STORE_EC_MAX];     /* the targets that opened (collector, stats) */
    int n_live;
    gc_collector *gc;                  /* background collector, or NULL */
    store_counters c;                  /* atomic */
    int instance;                      /* stores opened by this process before this one */
};

static int store_n_opened;             /* atomic */

#define STORE_INC(s, field) __atomic_fetch_add(&(s)->c.field, 1, __ATOMIC_RELAXED)

const char *store_status_name(store_status st)
{
    switch (st) {
    case STORE_OK: return "ok";
    case STORE_MISS: return "miss";
    case STORE_CORRUPT: return "corrupt";
    case STORE_NOSPACE: return "no space";
    case STORE_IO: return "I/O error";
    case STORE_ARG: return "bad argument";
    }
    return "?";
}

const char *store_spec(const store *s) { return s->spec; }
int store_class(const store *s, const char *name) { return gc_retention_class(&s->ret, name); }
double store_now(const store *s) { return s->o.clock ? s->o.clock() : gc_wall_now(); }

static double store_ttl(const store *s, int cls)
{
    if (cls < 0 || cls >= s->ret.n) cls = 0;
    return s->ret.ttl_s[cls];
}

/* Counters file of this store instance: ROOT/.stats/HOST-PID-N under the first live target, so
 * `tokenmill store stat` can sum the counters of every process that used the store. */
static void store_counters_path(store *s, char *buf, size_t n)
{
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(buf, n, "%s/.stats/%s-%d-%d", store_dir_root(s->live[0]), host, (int)getpid(), s->instance);
}

void store_save_counters(store *s)
{
    if (!s->n_live || s->o.read_only) return;
    store_stats st;
    store_get_stats(s, &st);
    if (!st.n_get && !st.n_put && !st.n_put_dup && !st.n_put_fail) return;   /* maintenance only */
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/.stats", store_dir_root(s->live[0]));
    mkdir(path, 0755);
    store_counters_path(s, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "get %llu hit %llu miss %llu corrupt %llu put %llu put_dup %llu put_fail %llu nospace %llu "
               "io_err %llu evicted %llu expired %llu frag_missing %llu frag_corrupt %llu decode %llu\n",
            (unsigned long long)st.n_get, (unsigned long long)st.n_hit, (unsigned long long)st.n_miss,
            (unsigned long long)st.n_corrupt, (unsigned long long)st.n_put, (unsigned long long)st.n_put_dup,
            (unsigned long long)st.n_put_fail, (unsigned long long)st.n_nospace,
            (unsigned long long)st.n_io_err, (unsigned long long)st.n_evicted,
            (unsigned long long)st.n_expired, (unsigned long long)st.n_frag_missing,
            (unsigned long long)st.n_frag_corrupt, (unsigned long long)st.n_decode);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

static void store_save_counters_cb(void *arg) { store_save_counters(arg); }

int store_load_counters(store *s, store_stats *sum)
{
    memset(sum, 0, sizeof *sum);
    if (!s->n_live) return 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/.stats", store_dir_root(s->live[0]));
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp")) continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long v[14];
        if (fscanf(f, "get %llu hit %llu miss %llu corrupt %llu put %llu put_dup %llu put_fail %llu nospace %llu "
                      "io_err %llu evicted %llu expired %llu frag_missing %llu frag_corrupt %llu decode %llu",
                   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11],
                   &v[12], &v[13]) == 14) {
            sum->n_get += v[0]; sum->n_hit += v[1]; sum->n_miss += v[2]; sum->n_corrupt += v[3];
            sum->n_put += v[4]; sum->n_put_dup += v[5]; sum->n_put_fail += v[6]; sum->n_nospace += v[7];
            sum->n_io_err += v[8]; sum->n_evicted += v[9]; sum->n_expired += v[10];
            sum->n_frag_missing += v[11]; sum->n_frag_corrupt += v[12]; sum->n_decode += v[13];
            n++;
        }
        fclose(f);
    }
    closedir(d);
    return n;
}

store_status store_open(const char *spec, const store_opts *opts, store **out)
{
    *out = NULL;
    store_opts o0 = { 0 };
    if (!opts) opts = &o0;
    if (!spec || !*spec) return STORE_ARG;
    store *s = xcalloc(1, sizeof *s);
    s->spec = xstrdup(spec);
    s->o = *opts;
    s->instance = __atomic_fetch_add(&store_n_opened, 1, __ATOMIC_RELAXED);
    gc_retention_default(&s->ret);
    if (opts->retention && gc_retention_parse(&s->ret, opts->retention)) {
        log_error("store: bad retention '%s' (want e.g. agent=72h,chat=7d)", opts->retention);
        store_close(s);
        return STORE_ARG;
    }
    store_dir_opts d_opts = {
        .ext = "blk", .capacity_bytes = opts->capacity_bytes, .fsync = opts->fsync,
        .read_only = opts->read_only, .clock = opts->clock,
    };
    store_status st;
    if (!strncmp(spec, "ec:", 3)) {
        char *end;
        long k = strtol(spec + 3, &end, 10), m = -1;
        if (*end == '+') m = strtol(end + 1, &end, 10);
        if (k < 1 || m < 0 || k + m > STORE_EC_MAX || *end != ':') {
            log_error("store: bad spec '%s' (want ec:K+M:DIR1,...,DIR(K+M), K+M <= %d)", spec, STORE_EC_MAX);
            store_close(s);
            return STORE_ARG;
        }
        char *list = xstrdup(end + 1), *targets[STORE_EC_MAX + 1];
        int n = 0;
        for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n == STORE_EC_MAX) { n++; break; }
            targets[n++] = t;
        }
        if (n != k + m) {
            log_error("store: spec '%s' names %d targets, ec:%ld+%ld needs %ld", spec, n, k, m, k + m);
            free(list);
            store_close(s);
            return STORE_ARG;
        }
        st = store_ec_open((int)k, (int)m, targets, &d_opts, &s->ec);
        free(list);
        if (st != STORE_OK) {
            store_close(s);
            return st;
        }
        s->k = (int)k;
        s->m = (int)m;
        for (int i = 0; i < s->k + s->m; i++)
            if (store_ec_target(s->ec, i)) s->live[s->n_live++] = store_ec_target(s->ec, i);
    } else {
        const char *path = !strncmp(spec, "dir:", 4) ? spec + 4 : spec;
        st = store_dir_open(path, &d_opts, &s->dir);
        if (st != STORE_OK) {
            store_close(s);
            return st;
        }
        s->k = 1;
        s->m = 0;
        s->live[s->n_live++] = s->dir;
    }
    if (opts->gc_thread && !opts->read_only)
        s->gc = gc_collector_start(s->live, s->n_live, opts->gc_interval_s, opts->rescan_s,
                                   store_save_counters_cb, s);
    *out = s;
    return STORE_OK;
}

void store_close(store *s)
{
    if (!s) return;
    gc_collector_stop(s->gc, NULL);
    if (s->n_live && !s->o.read_only) store_save_counters(s);
    store_dir_close(s->dir);
    store_ec_close(s->ec);
    free(s->spec);
    free(s);
}

store_status store_put(store *s, const uint8_t key[32], const void *file, size_t n, int cls)
{
    block_header h;
    if (block_parse_header(file, n, &h) != BLOCK_OK || memcmp(h.key, key, 32) ||
        n != block_file_bytes(&h))
        return STORE_ARG;
    if (s->o.read_only) return STORE_ARG;
    double ttl = store_ttl(s, cls);
    if (s->ec) return store_ec_put(s->ec, key, file, n, ttl);
    struct iovec iov = { (void *)file, n };
    return store_dir_putv(s->dir, key, &iov, 1, ttl);
}

/* Counts a read's outcome; a block that fails verification is logged and deleted. */
static store_status store_check_read(store *s, const uint8_t key[32], store_status st, const void *buf, size_t len)
{
    if (st == STORE_OK) {
        block_status bs = block_verify(buf, len, key, NULL);
        if (bs == BLOCK_OK) {
            STORE_INC(s, n_hit);
            return STORE_OK;
        }
        char hex[BLOCKKEY_HEX];
        blockkey_hex(key, hex);
        log_warn("store %s: block %s is corrupt (%s): deleted, will be recomputed", s->spec, hex, block_status_name(bs));
        st = STORE_CORRUPT;
    }
    if (st == STORE_CORRUPT) {
        if (!s->o.read_only) store_delete(s, key);
        STORE_INC(s, n_corrupt);
    } else {
        STORE_INC(s, n_miss);
    }
    return st;
}

store_status store_get(store *s, const uint8_t key[32], int cls, void **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    STORE_INC(s, n_get);
    double ttl = s->o.read_only ? 0 : store_ttl(s, cls);
    void *buf = NULL;
    size_t len = 0;
    store_status st = s->ec ? store_ec_get(s->ec, key, ttl, &buf, &len)
                            : store_dir_read(s->dir, key, ttl, &buf, &len);
    st = store_check_read(s, key, st, buf, len);
    if (st != STORE_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *n = len;
    return STORE_OK;
}

store_status store_get_into(store *s, const uint8_t key[32], int cls, void *buf, size_t cap, size_t *n)
{
    *n = 0;
    if (s->ec) {   /* ec decodes into a buffer of its own: copy */
        void *f;
        size_t len;
        store_status st = store_get(s, key, cls, &f, &len);
        if (st != STORE_OK) return st;
        if (len <= cap) {
            memcpy(buf, f, len);
            *n = len;
        }
        free(f);
        return len <= cap ? STORE_OK : STORE_ARG;
    }
    double ttl = s->o.read_only ? 0 : store_ttl(s, cls);
    size_t len = 0;
    store_status st = store_dir_read_into(s->dir, key, ttl, buf, cap, &len);
    if (st == STORE_ARG) {
        /* larger than cap: not this caller's geometry, or corrupt (verified, deleted if so) */
        void *f;
        st = store_get(s, key, cls, &f, &len);
        free(f);
        return st == STORE_OK ? STORE_ARG : st;
    }
    STORE_INC(s, n_get);
    st = store_check_read(s, key, st, buf, len);
    if (st == STORE_OK) *n = len;
    return st;
}

store_status store_get_mapped(store *s, const uint8_t key[32], int cls, const void **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!store_mappable(s)) return STORE_ARG;
    double ttl = s->o.read_only ? 0 : store_ttl(s, cls);
    const void *p = NULL;
    size_t len = 0;
    store_status st = store_dir_map(s->dir, key, ttl, &p, &len);
    if (st == STORE_ARG) return STORE_ARG;
    STORE_INC(s, n_get);
    st = store_check_read(s, key, st, p, len);   /* a corrupt file is unlinked: p stays valid */
    if (st != STORE_OK) {
        store_dir_unmap(p, len);
        return st;
    }
    *out = p;
    *n = len;
    return STORE_OK;
}

void store_unmap(const void *file, size_t n) { store_dir_unmap(file, n); }

bool store_mappable(const store *s) { return s->dir && store_dir_mappable(s->dir); }

store_status store_touch(store *s, const uint8_t key[32], int cls)
{
    if (s->o.read_only) return STORE_ARG;
    double ttl = store_ttl(s, cls);
    if (!s->ec) return store_dir_touch(s->dir, key, ttl);
    bool any = false;   /* every fragment, where it is */
    for (int i = 0; i < s->k + s->m; i++) {
        store_dir *d = store_ec_target(s->ec, i);
        if (d && store_dir_touch(d, key, ttl) == STORE_OK) any = true;
    }
    return any ? STORE_OK : STORE_MISS;
}

int store_exists(store *s, const uint8_t (*keys)[32], int n)
{
    int i = 0;
    for (; i < n; i++) {
        bool have = s->ec ? store_ec_exists(s->ec, keys[i]) : store_dir_exists(s->dir, keys[i]);
        if (!have) break;
    }
    return i;
}

store_status store_delete(store *s, const uint8_t key[32])
{
    if (s->o.read_only) return STORE_ARG;
    return s->ec ? store_ec_delete(s->ec, key) : store_dir_delete(s->dir, key);
}

void store_get_stats(store *s, store_stats *st)
{
    memset(st, 0, sizeof *st);
    st->n_get = __atomic_load_n(&s->c.n_get, __ATOMIC_RELAXED);
    st->n_hit = __atomic_load_n(&s->c.n_hit, __ATOMIC_RELAXED);
    st->n_miss = __atomic_load_n(&s->c.n_miss, __ATOMIC_RELAXED);
    st->n_corrupt = __atomic_load_n(&s->c.n_corrupt, __ATOMIC_RELAXED);
    st->n_targets = s->k + s->m;
    for (int i = 0; i < s->n_live; i++) {
        store_dir_counters c;
        store_dir_get_counters(s->live[i], &c);
        uint64_t nf, nb;
        gc_view_totals(store_dir_view(s->live[i]), &nf, &nb);
        st->n_files += nf;
        st->bytes_used += nb;
        double old = gc_view_oldest(store_dir_view(s->live[i]));
        if (old > 0 && (!st->oldest_use || old < st->oldest_use)) st->oldest_use = old;
        st->n_io_err += c.n_io_err;
        st->n_evicted += c.n_evicted;
        st->n_expired += c.n_expired;
        st->bytes_read += c.bytes_read;
        st->bytes_written += c.bytes_written;
        if (!s->ec) {
            st->n_put = c.n_put;
            st->n_put_dup = c.n_put_dup;
            st->n_put_fail = c.n_put_fail;
            st->n_nospace = c.n_nospace;
        } else {
            st->n_nospace += c.n_nospace;
        }
    }
    if (s->ec) {
        /* a block put is counted once: as written on its fragment-0 target is not tracked
         * separately, so count fragment writes / (K+M) */
        store_ec_counters ec;
        store_ec_get_counters(s->ec, &ec);
        uint64_t frag_put = 0, frag_dup = 0, frag_fail = 0;
        for (int i = 0; i < s->n_live; i++) {
            store_dir_counters c;
            store_dir_get_counters(s->live[i], &c);
            frag_put += c.n_put;
            frag_dup += c.n_put_dup;
            frag_fail += c.n_put_fail;
        }
        int n = s->k + s->m;
        st->n_put = frag_put / (uint64_t)n;
        st->n_put_dup = frag_dup / (uint64_t)n;
        st->n_put_fail = frag_fail;
        st->n_frag_missing = ec.n_frag_missing;
        st->n_frag_corrupt = ec.n_frag_corrupt;
        st->n_decode = ec.n_decode;
        st->n_degraded_put = ec.n_degraded_put;
    }
}

/* ---- maintenance ---- */

int store_n_targets(const store *s) { return s->k + s->m; }

const char *store_target_root(const store *s, int i)
{
    if (s->dir) return i == 0 ? store_dir_root(s->dir) : NULL;
    store_dir *d = store_ec_target(s->ec, i);
    return d ? store_dir_root(d) : NULL;
}

void store_geometry(const store *s, int *k, int *m)
{
    *k = s->k;
    *m = s->m;
}

store_status store_peek_header(store *s, const uint8_t key[32], block_header *h)
{
    uint8_t b[BLOCK_HEADER_BYTES];
    store_status st = s->dir ? store_dir_peek(s->dir, key, b, sizeof b) : store_ec_peek(s->ec, key, b, sizeof b);
    if (st != STORE_OK) return st;
    if (block_parse_header(b, sizeof b, h) != BLOCK_OK || memcmp(h->key, key, 32)) return STORE_CORRUPT;
    return STORE_OK;
}

typedef struct {
    store_ls_fn fn;
    void *arg;
    int target;
} store_ls_ctx;

static void store_ls_cb(void *arg, const uint8_t key[32], uint64_t bytes, double last_use, double expiry)
{
    store_ls_ctx *c = arg;
    c->fn(c->arg, c->target, key, bytes, last_use, expiry);
}

void store_ls(store *s, store_ls_fn fn, void *arg)
{
    for (int i = 0; i < s->k + s->m; i++) {
        store_dir *d = s->dir ? s->dir : store_ec_target(s->ec, i);
        if (!d) continue;
        store_ls_ctx c = { fn, arg, i };
        store_dir_scan(d, store_ls_cb, &c);
    }
}

typedef struct {
    uint8_t key[32];
    int target;
} store_fsck_ent;

typedef struct {
    store_fsck_ent *v;         /* (n, cap) */
    size_t n, cap;
} store_fsck_list;

static void store_fsck_cb(void *arg, const uint8_t key[32], uint64_t bytes, double last_use, double expiry)
{
    store_fsck_list *l = arg;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->v = xrealloc(l->v, l->cap * sizeof *l->v);
    }
    memcpy(l->v[l->n].key, key, 32);
    l->v[l->n++].target = 0;
}

static int store_fsck_cmp(const void *a, const void *b)
{
    return memcmp(((const store_fsck_ent *)a)->key, ((const store_fsck_ent *)b)->key, 32);
}

void store_fsck(store *s, store_fsck_result *r)
{
    memset(r, 0, sizeof *r);
    int n_t = s->k + s->m;
    store_fsck_list good = { 0 };
    for (int t = 0; t < n_t; t++) {
        store_dir *d = s->dir ? s->dir : store_ec_target(s->ec, t);
        if (!d) continue;
        store_fsck_list files = { 0 };
        store_dir_scan(d, store_fsck_cb, &files);
        for (size_t i = 0; i < files.n; i++) {
            const uint8_t *key = files.v[i].key;
            void *buf;
            size_t len;
            if (store_dir_read(d, key, 0, &buf, &len) != STORE_OK) continue;  /* gone meanwhile */
            r->n_files++;
            r->bytes += len;
            bool ok;
            if (s->ec) {
                int idx = -1;
                ok = store_ec_frag_verify(s->ec, buf, len, key, &idx) && store_ec_frag_target(s->ec, key, idx) == t;
            } else {
                ok = block_verify(buf, len, key, NULL) == BLOCK_OK;
            }
            free(buf);
            if (ok) {
                r->n_ok++;
                store_fsck_cb(&good, key, len, 0, 0);
                continue;
            }
            r->n_broken++;
            char hex[BLOCKKEY_HEX];
            blockkey_hex(key, hex);
            log_warn("store fsck: %s/%s is broken%s", store_dir_root(d), hex, s->o.read_only ? "" : ": removed");
            if (!s->o.read_only) store_dir_delete(d, key);
        }
        free(files.v);
    }
    if (s->ec && good.n) {   /* blocks: count good fragments per key */
        qsort(good.v, good.n, sizeof *good.v, store_fsck_cmp);
        for (size_t i = 0; i < good.n;) {
            size_t j = i;
            while (j < good.n && !memcmp(good.v[j].key, good.v[i].key, 32)) j++;
            int have = (int)(j - i);
            if (have < s->k) {
                r->n_lost++;
                if (!s->o.read_only) store_ec_delete(s->ec, good.v[i].key);
            } else if (have < n_t) {
                r->n_degraded++;
                void *f;
                size_t n;
                if (!s->o.read_only && store_ec_get(s->ec, good.v[i].key, 0, &f, &n) == STORE_OK) {
                    if (block_verify(f, n, good.v[i].key, NULL) == BLOCK_OK &&
                        store_ec_put(s->ec, good.v[i].key, f, n, s->ret.ttl_s[0]) == STORE_OK)
                        r->n_repaired++;
                    free(f);
                }
            }
            i = j;
        }
    }
    free(good.v);
}

void store_gc(store *s, uint64_t *n_expired, uint64_t *n_evicted)
{
    gc_result res = { 0 };
    if (!s->o.read_only) {
        double now = store_now(s);
        for (int i = 0; i < s->n_live; i++) gc_collect_dir(s->live[i], now, &res);
    }
    if (n_expired) *n_expired = res.n_expired;
    if (n_evicted) *n_evicted = res.n_evicted;
}
