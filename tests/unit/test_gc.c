/*
 * test_gc: retention classes and sizes, the view's LRU order, TTL expiry per class counted
 * from last use (a hit extends it), LRU eviction under a capacity with several writer
 * threads (disk use never above capacity + one block per writer), the view rebuilt from the
 * files after a restart, the background collector.
 */
#include <pthread.h>

#include "harness.h"
#include "storetest.h"

#include "cache/gc.h"
#include "cache/store.h"
#include "cache/store_dir.h"

TEST(test_retention_parse)
{
    gc_retention r;
    gc_retention_default(&r);
    CHECK(r.n == 2 && r.ttl_s[0] == 7 * 86400.0 && r.ttl_s[1] == 72 * 3600.0);
    CHECK(gc_retention_parse(&r, "agent=2h,chat=30m,batch=90s") == 0);
    CHECK(r.n == 3 && r.ttl_s[1] == 7200 && r.ttl_s[0] == 1800 && r.ttl_s[2] == 90);
    CHECK(gc_retention_class(&r, "batch") == 2 && gc_retention_class(&r, "nope") == 0 &&
          gc_retention_class(&r, NULL) == 0);
    CHECK(gc_retention_parse(&r, "agent") == -1);
    CHECK(gc_retention_parse(&r, "agent=5x") == -1);
    CHECK(gc_retention_parse(&r, "=5s") == -1);
    CHECK(gc_parse_size("512M") == 512ull << 20 && gc_parse_size("2G") == 2ull << 30 &&
          gc_parse_size("1000") == 1000 && gc_parse_size("1.5KiB") == 1536 && gc_parse_size("x") == 0);
}

TEST(test_view_lru_and_capacity)
{
    gc_view *v = gc_view_new(300);
    uint8_t k[6][32], victims[8][32];
    for (int i = 0; i < 6; i++) storetest_key(i, k[i]);
    CHECK(gc_view_add(v, k[0], 100, 10, 1000, victims, 8) == 0);
    CHECK(gc_view_add(v, k[1], 100, 20, 1000, victims, 8) == 0);
    CHECK(gc_view_add(v, k[2], 100, 30, 50, victims, 8) == 0);
    CHECK(gc_view_touch(v, k[0], 40, 1000));   /* 0 is now the most recent */
    CHECK(gc_view_add(v, k[3], 100, 50, 1000, victims, 8) == 1);
    CHECK(!memcmp(victims[0], k[1], 32));      /* 1 was least recently used */
    gc_entry e;
    CHECK(gc_view_get(v, k[0], &e) && e.last_use == 40);
    CHECK(!gc_view_get(v, k[1], NULL));
    CHECK(gc_view_take_expired(v, 60, victims, 8) == 1 && !memcmp(victims[0], k[2], 32));
    uint64_t n, bytes;
    gc_view_totals(v, &n, &bytes);
    CHECK(n == 2 && bytes == 200);
    CHECK(gc_view_oldest(v) == 40);            /* 0 (used at 40) is now the least recent */
    /* an entry bigger than the rest: everything else goes, never itself */
    CHECK(gc_view_add(v, k[4], 250, 60, 1000, victims, 8) == 2);
    gc_view_totals(v, &n, &bytes);
    CHECK(n == 1 && bytes == 250);
    /* scans: entries not seen are dropped */
    gc_view_scan_begin(v);
    gc_view_scan_merge(v, k[5], 10, 5, 1000);
    gc_view_scan_end(v);
    CHECK(!gc_view_get(v, k[4], NULL) && gc_view_get(v, k[5], NULL));
    /* growth past the first hash/entry arrays */
    gc_view *big = gc_view_new(0);
    for (int i = 0; i < 5000; i++) {
        uint8_t key[32];
        storetest_key(1000 + i, key);
        gc_view_add(big, key, 1, i, 1e9, victims, 0);
    }
    gc_view_totals(big, &n, &bytes);
    CHECK(n == 5000);
    uint8_t key[32];
    storetest_key(1000 + 4321, key);
    CHECK(gc_view_get(big, key, &e) && e.last_use == 4321);
    gc_view_free(big);
    gc_view_free(v);
}

static store *open_dir(const char *dir, uint64_t cap, const char *ret, bool thread)
{
    char spec[300];
    snprintf(spec, sizeof spec, "dir:%s", dir);
    store_opts o = { .capacity_bytes = cap, .retention = ret, .clock = storetest_clock,
                     .gc_thread = thread, .gc_interval_s = 0.02, .rescan_s = 0.05 };
    store *s = NULL;
    CHECK(store_open(spec, &o, &s) == STORE_OK);
    return s;
}

static bool has(store *s, const uint8_t key[32])
{
    return store_exists(s, (const uint8_t(*)[32])key, 1) == 1;
}

TEST(test_ttl_per_class_from_last_use)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "gc");
    storetest_clock_now = 1.7e9;
    store *s = open_dir(dir, 0, "agent=100s,chat=1000s", false);
    int agent = store_class(s, "agent"), chat = store_class(s, "chat");
    CHECK(agent == 1 && chat == 0);
    uint8_t a[32], b[32], c[32];
    storetest_key(1, a);
    storetest_key(2, b);
    storetest_key(3, c);
    size_t n;
    void *fa = storetest_block(a, 1, 1, &n), *fb = storetest_block(b, 1, 2, &n), *fc = storetest_block(c, 1, 3, &n);
    CHECK(store_put(s, a, fa, n, agent) == STORE_OK);
    CHECK(store_put(s, b, fb, n, chat) == STORE_OK);
    CHECK(store_put(s, c, fc, n, agent) == STORE_OK);
    storetest_clock_now += 90;
    void *got;
    size_t gn;
    CHECK(store_get(s, c, agent, &got, &gn) == STORE_OK);   /* a use: c lives to +190 */
    free(got);
    storetest_clock_now += 20;                                /* +110 */
    uint64_t expired, evicted;
    store_gc(s, &expired, &evicted);
    CHECK(expired == 1 && evicted == 0);
    CHECK(!has(s, a) && has(s, b) && has(s, c));
    /* an agent block used by a chat request gets the longer TTL */
    CHECK(store_get(s, c, chat, &got, &gn) == STORE_OK);     /* c lives to +1110 */
    free(got);
    storetest_clock_now += 900;                               /* +1010 */
    store_gc(s, &expired, &evicted);
    CHECK(expired == 1 && !has(s, b) && has(s, c));
    /* restart: expiry comes back from the files */
    store_close(s);
    s = open_dir(dir, 0, "agent=100s,chat=1000s", false);
    storetest_clock_now += 50;                                /* +1060 */
    store_gc(s, &expired, &evicted);
    CHECK(expired == 0 && has(s, c));
    storetest_clock_now += 100;                               /* +1160 */
    store_gc(s, &expired, &evicted);
    CHECK(expired == 1 && !has(s, c));
    store_close(s);
    free(fa);
    free(fb);
    free(fc);
    storetest_rmrf(dir);
}

TEST(test_lru_capacity_and_restart)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "gc");
    storetest_clock_now = 1.7e9;
    size_t n;
    uint8_t keys[8][32];
    void *f[8];
    for (int i = 0; i < 8; i++) {
        storetest_key(10 + i, keys[i]);
        f[i] = storetest_block(keys[i], 1, (uint64_t)i, &n);
    }
    store *s = open_dir(dir, 3 * n + n / 2, NULL, false);   /* room for 3 blocks */
    for (int i = 0; i < 3; i++) {
        CHECK(store_put(s, keys[i], f[i], n, 0) == STORE_OK);
        storetest_clock_now += 100;
    }
    void *got;
    size_t gn;
    CHECK(store_get(s, keys[0], 0, &got, &gn) == STORE_OK);   /* 0 recently used: 1 is LRU */
    free(got);
    storetest_clock_now += 100;
    CHECK(store_put(s, keys[3], f[3], n, 0) == STORE_OK);
    CHECK(has(s, keys[0]) && !has(s, keys[1]) && has(s, keys[2]) && has(s, keys[3]));
    store_stats st;
    store_get_stats(s, &st);
    CHECK(st.n_evicted == 1 && st.n_files == 3);
    store_close(s);
    /* after a restart the order comes from the files: 2 is now the least recently used */
    storetest_clock_now += 100;
    s = open_dir(dir, 3 * n + n / 2, NULL, false);
    CHECK(store_put(s, keys[4], f[4], n, 0) == STORE_OK);
    CHECK(has(s, keys[0]) && !has(s, keys[2]) && has(s, keys[3]) && has(s, keys[4]));
    /* a smaller capacity at open: the collector trims the oldest down to it */
    store_close(s);
    s = open_dir(dir, n + n / 2, NULL, false);
    uint64_t expired, evicted;
    store_gc(s, &expired, &evicted);
    CHECK(evicted == 2 && has(s, keys[4]) && !has(s, keys[0]) && !has(s, keys[3]));
    store_close(s);
    for (int i = 0; i < 8; i++) free(f[i]);
    storetest_rmrf(dir);
}

typedef struct {
    store *s;
    int base;
    int n_ok;
} cap_writer;

static void *cap_writer_main(void *p)
{
    cap_writer *w = p;
    for (int i = 0; i < 40; i++) {
        uint8_t key[32];
        storetest_key(w->base + i, key);
        size_t n;
        void *f = storetest_block(key, 1, (uint64_t)(w->base + i), &n);
        w->n_ok += store_put(w->s, key, f, n, 0) == STORE_OK;
        free(f);
    }
    return NULL;
}

typedef struct {
    const char *dir;
    volatile int stop;
    long long max_bytes;
} du_monitor;

static void *du_main(void *p)
{
    du_monitor *m = p;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "find '%s' -type f -printf '%%s\\n' 2>/dev/null | awk '{s+=$1} END {print s+0}'", m->dir);
    while (!m->stop) {
        FILE *fp = popen(cmd, "r");
        long long b = 0;
        if (fp) {
            if (fscanf(fp, "%lld", &b) != 1) b = 0;
            pclose(fp);
        }
        if (b > m->max_bytes) m->max_bytes = b;
    }
    return NULL;
}

TEST(test_capacity_bound_with_writers)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "gc");
    storetest_clock_now = 1.7e9;
    size_t n;
    uint8_t k0[32];
    storetest_key(0, k0);
    free(storetest_block(k0, 1, 0, &n));
    uint64_t cap = 5 * n;
    store *s = open_dir(dir, cap, NULL, false);
    enum { N_W = 3 };
    cap_writer w[N_W];
    pthread_t th[N_W], mon;
    du_monitor m = { dir, 0, 0 };
    pthread_create(&mon, NULL, du_main, &m);
    for (int i = 0; i < N_W; i++) {
        w[i] = (cap_writer){ s, 1000 * (i + 1), 0 };
        pthread_create(&th[i], NULL, cap_writer_main, &w[i]);
    }
    for (int i = 0; i < N_W; i++) pthread_join(th[i], NULL);
    m.stop = 1;
    pthread_join(mon, NULL);
    CHECK(w[0].n_ok + w[1].n_ok + w[2].n_ok == 3 * 40);
    CHECKF((uint64_t)m.max_bytes <= cap + N_W * n, "max %lld cap %llu", m.max_bytes, (unsigned long long)cap);
    store_stats st;
    store_get_stats(s, &st);
    CHECK(st.bytes_used <= cap && st.n_files == 5 && st.n_evicted == 3 * 40 - 5);
    store_close(s);
    storetest_rmrf(dir);
}

TEST(test_collector_thread)
{
    char dir[64];
    storetest_tmpdir(dir, sizeof dir, "gc");
    storetest_clock_now = 1.7e9;
    store *s = open_dir(dir, 0, "chat=10s", true);
    uint8_t a[32], b[32];
    storetest_key(1, a);
    storetest_key(2, b);
    size_t n;
    void *fa = storetest_block(a, 1, 1, &n), *fb = storetest_block(b, 1, 2, &n);
    CHECK(store_put(s, a, fa, n, 0) == STORE_OK);
    /* another process writes b straight into the directory: the rescan picks it up */
    char spec[300];
    snprintf(spec, sizeof spec, "dir:%s", dir);
    store *other = NULL;
    store_opts o = { .clock = storetest_clock, .retention = "chat=10s" };
    CHECK(store_open(spec, &o, &other) == STORE_OK);
    CHECK(store_put(other, b, fb, n, 0) == STORE_OK);
    store_close(other);
    storetest_clock_now += 20;
    /* exists() already answers "no" for an expired entry; the collector's deletion (and its
     * counter) comes on its own thread a little later */
    store_stats st;
    CHECK(WAIT_UNTIL((store_get_stats(s, &st), st.n_expired == 2), 30));
    CHECK(!has(s, a) && !has(s, b));
    store_close(s);
    free(fa);
    free(fb);
    storetest_rmrf(dir);
}

int main(void)
{
    util_log_level = LOG_LEVEL_ERROR;
    RUN(test_retention_parse);
    RUN(test_view_lru_and_capacity);
    RUN(test_ttl_per_class_from_last_use);
    RUN(test_lru_capacity_and_restart);
    RUN(test_capacity_bound_with_writers);
    RUN(test_collector_thread);
    HARNESS_END();
}
