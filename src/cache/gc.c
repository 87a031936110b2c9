/*
 * gc: retention classes, the per-target view (hash map + last-use list) and the collector
 * thread. See gc.h for the design; the list is kept in last-use order by inserting from the
 * tail (new uses are the latest, so the walk is short).
 */
#include "cache/gc.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/store_dir.h"
#include "util/util.h"

void gc_retention_default(gc_retention *r)
{
    memset(r, 0, sizeof *r);
    r->n = 2;
    strcpy(r->name[0], "chat");
    r->ttl_s[0] = 7 * 86400.0;
    strcpy(r->name[1], "agent");
    r->ttl_s[1] = 72 * 3600.0;
}

static double gc_parse_duration(const char *z, size_t n, bool *ok)
{
    char buf[32];
    *ok = false;
    if (n == 0 || n >= sizeof buf) return 0;
    memcpy(buf, z, n);
    buf[n] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (end == buf || v < 0) return 0;
    double mul = 1;
    if (*end == 's') mul = 1, end++;
    else if (*end == 'm') mul = 60, end++;
    else if (*end == 'h') mul = 3600, end++;
    else if (*end == 'd') mul = 86400, end++;
    if (*end) return 0;
    *ok = true;
    return v * mul;
}

int gc_retention_parse(gc_retention *r, const char *z)
{
    while (z && *z) {
        const char *comma = strchr(z, ',');
        size_t len = comma ? (size_t)(comma - z) : strlen(z);
        const char *eq = memchr(z, '=', len);
        if (!eq || eq == z || (size_t)(eq - z) >= sizeof r->name[0]) return -1;
        size_t nlen = (size_t)(eq - z);
        bool ok;
        double ttl = gc_parse_duration(eq + 1, len - nlen - 1, &ok);
        if (!ok) return -1;
        int i;
        for (i = 0; i < r->n; i++)
            if (strlen(r->name[i]) == nlen && !memcmp(r->name[i], z, nlen)) break;
        if (i == r->n) {
            if (r->n == GC_MAX_CLASSES) return -1;
            memcpy(r->name[i], z, nlen);
            r->name[i][nlen] = 0;
            r->n++;
        }
        r->ttl_s[i] = ttl;
        z = comma ? comma + 1 : NULL;
    }
    return 0;
}

int gc_retention_class(const gc_retention *r, const char *name)
{
    if (!name || !*name) return 0;
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->name[i], name)) return i;
    return 0;
}

uint64_t gc_parse_size(const char *z)
{
    if (!z) return 0;
    char *end;
    double v = strtod(z, &end);
    if (end == z || v < 0) return 0;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return 0;
    return (uint64_t)(v * mul);
}

double gc_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the view ---- */

typedef struct {
    uint8_t key[32];         /* block key */
    uint64_t bytes;          /* file size */
    double last_use;         /* epoch seconds */
    double expiry;           /* epoch seconds */
    uint32_t gen;            /* scan generation that last saw it */
    bool busy;               /* its file is being written: never a victim */
    int prev, next;          /* last-use list (older -> newer), -1 ends */
    int hnext;               /* hash chain, or free-list link */
} gc_ent;

struct gc_view {
    pthread_mutex_t mu;      /* guards everything below */
    uint64_t capacity;       /* bytes; 0 = unlimited */
    uint64_t used;           /* bytes of all entries */
    uint64_t n;              /* entries */
    gc_ent *ent;             /* (cap_ent) */
    int cap_ent;
    int free_head;           /* free entries through hnext */
    int *bucket;             /* (n_bucket) heads, -1 empty */
    uint32_t bucket_mask;
    int lru_head, lru_tail;  /* oldest, newest */
    uint32_t gen;            /* current scan generation */
};

gc_view *gc_view_new(uint64_t capacity_bytes)
{
    gc_view *v = xcalloc(1, sizeof *v);
    pthread_mutex_init(&v->mu, NULL);
    v->capacity = capacity_bytes;
    v->free_head = -1;
    v->lru_head = v->lru_tail = -1;
    v->bucket_mask = 1023;
    v->bucket = xmalloc(sizeof(int) * 1024);
    for (int i = 0; i < 1024; i++) v->bucket[i] = -1;
    return v;
}

void gc_view_free(gc_view *v)
{
    if (!v) return;
    pthread_mutex_destroy(&v->mu);
    free(v->ent);
    free(v->bucket);
    free(v);
}

uint64_t gc_view_capacity(const gc_view *v) { return v->capacity; }

static uint32_t gc_hash(const gc_view *v, const uint8_t key[32])
{
    uint32_t h;
    memcpy(&h, key + 4, 4);
    return h & v->bucket_mask;
}

static int gc_find(const gc_view *v, const uint8_t key[32])
{
    for (int i = v->bucket[gc_hash(v, key)]; i >= 0; i = v->ent[i].hnext)
        if (!memcmp(v->ent[i].key, key, 32)) return i;
    return -1;
}

static void gc_rehash(gc_view *v)
{
    uint32_t nb = (v->bucket_mask + 1) * 2;
    free(v->bucket);
    v->bucket = xmalloc(sizeof(int) * nb);
    for (uint32_t i = 0; i < nb; i++) v->bucket[i] = -1;
    v->bucket_mask = nb - 1;
    /* live entries are exactly those on the list */
    for (int i = v->lru_head; i >= 0; i = v->ent[i].next) {
        uint32_t h = gc_hash(v, v->ent[i].key);
        v->ent[i].hnext = v->bucket[h];
        v->bucket[h] = i;
    }
}

static void gc_list_unlink(gc_view *v, int i)
{
    gc_ent *e = &v->ent[i];
    if (e->prev >= 0) v->ent[e->prev].next = e->next; else v->lru_head = e->next;
    if (e->next >= 0) v->ent[e->next].prev = e->prev; else v->lru_tail = e->prev;
    e->prev = e->next = -1;
}

/* Inserts i in last-use order, walking from the newest end. */
static void gc_list_insert(gc_view *v, int i)
{
    gc_ent *e = &v->ent[i];
    int after = v->lru_tail;
    while (after >= 0 && v->ent[after].last_use > e->last_use) after = v->ent[after].prev;
    e->prev = after;
    e->next = after >= 0 ? v->ent[after].next : v->lru_head;
    if (e->prev >= 0) v->ent[e->prev].next = i; else v->lru_head = i;
    if (e->next >= 0) v->ent[e->next].prev = i; else v->lru_tail = i;
}

static void gc_remove_at(gc_view *v, int i)
{
    gc_ent *e = &v->ent[i];
    int *pp = &v->bucket[gc_hash(v, e->key)];
    while (*pp != i) pp = &v->ent[*pp].hnext;
    *pp = e->hnext;
    gc_list_unlink(v, i);
    v->used -= e->bytes;
    v->n--;
    e->hnext = v->free_head;
    v->free_head = i;
}

/* Finds or creates key's entry (new ones are not yet on the list: prev = next = -2). */
static int gc_upsert(gc_view *v, const uint8_t key[32], bool *created)
{
    int i = gc_find(v, key);
    *created = false;
    if (i >= 0) return i;
    if (v->free_head < 0) {
        int ncap = v->cap_ent ? v->cap_ent * 2 : 1024;
        v->ent = xrealloc(v->ent, sizeof(gc_ent) * (size_t)ncap);
        for (int j = ncap - 1; j >= v->cap_ent; j--) {
            v->ent[j].hnext = v->free_head;
            v->free_head = j;
        }
        v->cap_ent = ncap;
    }
    i = v->free_head;
    v->free_head = v->ent[i].hnext;
    gc_ent *e = &v->ent[i];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, 32);
    e->prev = e->next = -1;
    uint32_t h = gc_hash(v, key);
    e->hnext = v->bucket[h];
    v->bucket[h] = i;
    v->n++;
    *created = true;
    if (v->n > (uint64_t)v->bucket_mask + 1) gc_rehash(v);
    return i;
}

static void gc_set(gc_view *v, int i, bool created, uint64_t bytes, double last_use, double expiry)
{
    gc_ent *e = &v->ent[i];
    if (!created) {
        v->used -= e->bytes;
        gc_list_unlink(v, i);
        if (e->last_use > last_use) last_use = e->last_use;
        if (e->expiry > expiry) expiry = e->expiry;
    }
    e->bytes = bytes;
    e->last_use = last_use;
    e->expiry = expiry;
    e->gen = v->gen;
    v->used += bytes;
    gc_list_insert(v, i);
}

static int gc_take_lru(gc_view *v, int keep, uint8_t (*keys)[32], int max)
{
    int n = 0;
    int i = v->lru_head;
    while (v->capacity && v->used > v->capacity && n < max && i >= 0) {
        int next = v->ent[i].next;
        if (i != keep && !v->ent[i].busy) {
            memcpy(keys[n++], v->ent[i].key, 32);
            gc_remove_at(v, i);
        }
        i = next;
    }
    return n;
}

int gc_view_add(gc_view *v, const uint8_t key[32], uint64_t bytes, double last_use, double expiry,
                uint8_t (*victims)[32], int max_victims)
{
    return gc_view_reserve(v, key, bytes, last_use, expiry, false, victims, max_victims);
}

int gc_view_reserve(gc_view *v, const uint8_t key[32], uint64_t bytes, double last_use, double expiry,
                    bool busy, uint8_t (*victims)[32], int max_victims)
{
    pthread_mutex_lock(&v->mu);
    bool created;
    int i = gc_upsert(v, key, &created);
    gc_set(v, i, created, bytes, last_use, expiry);
    if (busy) v->ent[i].busy = true;
    int n = gc_take_lru(v, i, victims, max_victims);
    pthread_mutex_unlock(&v->mu);
    return n;
}

void gc_view_done(gc_view *v, const uint8_t key[32])
{
    pthread_mutex_lock(&v->mu);
    int i = gc_find(v, key);
    if (i >= 0) v->ent[i].busy = false;
    pthread_mutex_unlock(&v->mu);
}

bool gc_view_touch(gc_view *v, const uint8_t key[32], double last_use, double expiry)
{
    pthread_mutex_lock(&v->mu);
    int i = gc_find(v, key);
    if (i >= 0) gc_set(v, i, false, v->ent[i].bytes, last_use, expiry);
    pthread_mutex_unlock(&v->mu);
    return i >= 0;
}

bool gc_view_get(gc_view *v, const uint8_t key[32], gc_entry *out)
{
    pthread_mutex_lock(&v->mu);
    int i = gc_find(v, key);
    if (i >= 0 && out) {
        out->bytes = v->ent[i].bytes;
        out->last_use = v->ent[i].last_use;
        out->expiry = v->ent[i].expiry;
    }
    pthread_mutex_unlock(&v->mu);
    return i >= 0;
}

void gc_view_remove(gc_view *v, const uint8_t key[32])
{
    pthread_mutex_lock(&v->mu);
    int i = gc_find(v, key);
    if (i >= 0) gc_remove_at(v, i);
    pthread_mutex_unlock(&v->mu);
}

int gc_view_take_expired(gc_view *v, double now, uint8_t (*keys)[32], int max)
{
    int n = 0;
    pthread_mutex_lock(&v->mu);
    for (int i = v->lru_head; i >= 0 && n < max;) {
        int next = v->ent[i].next;
        if (v->ent[i].expiry <= now) {
            memcpy(keys[n++], v->ent[i].key, 32);
            gc_remove_at(v, i);
        }
        i = next;
    }
    pthread_mutex_unlock(&v->mu);
    return n;
}

int gc_view_take_over_capacity(gc_view *v, uint8_t (*keys)[32], int max)
{
    pthread_mutex_lock(&v->mu);
    int n = gc_take_lru(v, -1, keys, max);
    pthread_mutex_unlock(&v->mu);
    return n;
}

void gc_view_totals(gc_view *v, uint64_t *n_entries, uint64_t *bytes)
{
    pthread_mutex_lock(&v->mu);
    if (n_entries) *n_entries = v->n;
    if (bytes) *bytes = v->used;
    pthread_mutex_unlock(&v->mu);
}

double gc_view_oldest(gc_view *v)
{
    pthread_mutex_lock(&v->mu);
    double t = v->lru_head >= 0 ? v->ent[v->lru_head].last_use : 0;
    pthread_mutex_unlock(&v->mu);
    return t;
}

void gc_view_scan_begin(gc_view *v)
{
    pthread_mutex_lock(&v->mu);
    v->gen++;
    pthread_mutex_unlock(&v->mu);
}

void gc_view_scan_merge(gc_view *v, const uint8_t key[32], uint64_t bytes, double last_use, double expiry)
{
    pthread_mutex_lock(&v->mu);
    bool created;
    int i = gc_upsert(v, key, &created);
    gc_set(v, i, created, bytes, last_use, expiry);
    pthread_mutex_unlock(&v->mu);
}

void gc_view_scan_end(gc_view *v)
{
    pthread_mutex_lock(&v->mu);
    for (int i = v->lru_head; i >= 0;) {
        int next = v->ent[i].next;
        if (v->ent[i].gen != v->gen && !v->ent[i].busy) gc_remove_at(v, i);
        i = next;
    }
    pthread_mutex_unlock(&v->mu);
}

/* ---- collection ---- */

#define GC_BATCH 256

void gc_collect_dir(store_dir *d, double now, gc_result *res)
{
    uint8_t (*keys)[32] = xmalloc(sizeof(*keys) * GC_BATCH);
    gc_view *v = store_dir_view(d);
    int n;
    do {
        n = gc_view_take_expired(v, now, keys, GC_BATCH);
        for (int i = 0; i < n; i++)
            if (store_dir_delete_if_expired(d, keys[i], now) && res) res->n_expired++;
    } while (n == GC_BATCH);
    do {
        n = gc_view_take_over_capacity(v, keys, GC_BATCH);
        for (int i = 0; i < n; i++) store_dir_evict(d, keys[i]);
        if (res) res->n_evicted += (uint64_t)n;
    } while (n == GC_BATCH);
    free(keys);
}

struct gc_collector {
    pthread_t th;
    pthread_mutex_t mu;      /* guards stop */
    pthread_cond_t cv;
    bool stop;
    store_dir **dirs;        /* (n_dirs), not owned */
    int n_dirs;
    double interval_s;
    double rescan_s;
    gc_result total;         /* written by the thread only, read after join */
    void (*tick)(void *);    /* after each pass, or NULL */
    void *tick_arg;
};

static void *gc_collector_main(void *arg)
{
    gc_collector *c = arg;
    double last_scan = util_now();
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        util_cond_wait_ms(&c->cv, &c->mu, (long)(c->interval_s * 1000) + 1);
        if (c->stop) break;
        pthread_mutex_unlock(&c->mu);
        bool rescan = util_now() - last_scan >= c->rescan_s;
        for (int i = 0; i < c->n_dirs; i++) {
            if (rescan) store_dir_rebuild(c->dirs[i]);
            gc_collect_dir(c->dirs[i], store_dir_now(c->dirs[i]), &c->total);
        }
        if (rescan) last_scan = util_now();
        if (c->tick) c->tick(c->tick_arg);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

gc_collector *gc_collector_start(store_dir **dirs, int n_dirs, double interval_s, double rescan_s,
                                 void (*tick)(void *), void *tick_arg)
{
    gc_collector *c = xcalloc(1, sizeof *c);
    c->tick = tick;
    c->tick_arg = tick_arg;
    pthread_mutex_init(&c->mu, NULL);
    util_cond_init(&c->cv);
    c->dirs = dirs;
    c->n_dirs = n_dirs;
    c->interval_s = interval_s > 0 ? interval_s : 30;
    c->rescan_s = rescan_s > 0 ? rescan_s : 300;
    if (pthread_create(&c->th, NULL, gc_collector_main, c)) {
        log_error("store: cannot start the collector thread");
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return NULL;
    }
    return c;
}

void gc_collector_stop(gc_collector *c, gc_result *res)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->th, NULL);
    if (res) *res = c->total;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
