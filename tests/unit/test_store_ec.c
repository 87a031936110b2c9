/*
 * test_store_ec: the ec:K+M backend with 10+2 (and 4+2): round trips of odd sizes, any 2
 * fragments deleted or corrupted lose nothing (byte-identical), 3 make a miss (never wrong
 * data), decode tables cached per loss pattern, missing targets at open, fsck.
 */
#include "harness.h"
#include "storetest.h"

#include "cache/store.h"
#include "cache/store_dir.h"
#include "cache/store_ec.h"

#define N_T 12

typedef struct {
    char base[64];
    char spec[2048];
} ec_env;

static void ec_env_init(ec_env *e, int k, int m, int bad_targets)
{
    storetest_tmpdir(e->base, sizeof e->base, "ec");
    int n = snprintf(e->spec, sizeof e->spec, "ec:%d+%d:", k, m);
    for (int i = 0; i < k + m; i++) {
        /* bad targets sit below a regular file, so they cannot be created */
        if (i < bad_targets) {
            char file[128];
            snprintf(file, sizeof file, "%s/file%d", e->base, i);
            FILE *fp = fopen(file, "w");
            if (fp) fclose(fp);
            n += snprintf(e->spec + n, sizeof e->spec - (size_t)n, "%sdir:%s/file%d/t", i ? "," : "", e->base, i);
        } else {
            n += snprintf(e->spec + n, sizeof e->spec - (size_t)n, "%s%s/t%d", i ? "," : "", e->base, i);
        }
    }
}

static store *ec_open(ec_env *e)
{
    store *s = NULL;
    store_opts o = { 0 };
    CHECK(store_open(e->spec, &o, &s) == STORE_OK);
    return s;
}

/* Path of fragment i of key. */
static void frag_path(ec_env *e, int k, int m, const uint8_t key[32], int i, char *buf, size_t n)
{
    char hex[BLOCKKEY_HEX];
    blockkey_hex(key, hex);
    int t = (i + key[31]) % (k + m);
    snprintf(buf, n, "%s/t%d/%.2s/%.2s/%s.frg", e->base, t, hex, hex + 2, hex);
}

TEST(test_ec_roundtrip_sizes)
{
    ec_env e;
    ec_env_init(&e, 10, 2, 0);
    store *s = ec_open(&e);
    for (int layers = 1; layers <= 9; layers += 4) {
        uint8_t key[32];
        storetest_key(layers, key);
        size_t n;
        void *f = storetest_block(key, layers, (uint64_t)layers, &n);
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        CHECK(store_exists(s, (const uint8_t(*)[32])key, 1) == 1);
        void *got;
        size_t gn;
        CHECK(store_get(s, key, 0, &got, &gn) == STORE_OK);
        CHECK(gn == n && !memcmp(got, f, n));
        free(got);
        for (int i = 0; i < N_T; i++) {
            char p[512];
            frag_path(&e, 10, 2, key, i, p, sizeof p);
            CHECKF(storetest_size(p) > 0, "fragment %d missing", i);
        }
        free(f);
    }
    store_stats st;
    store_get_stats(s, &st);
    CHECKF(st.n_hit == 3 && st.n_put == 3, "decode %llu hit %llu put %llu",
           (unsigned long long)st.n_decode, (unsigned long long)st.n_hit, (unsigned long long)st.n_put);
    store_close(s);
    storetest_rmrf(e.base);
}

TEST(test_ec_get_into_caller_buffer)
{
    ec_env e;
    ec_env_init(&e, 10, 2, 0);
    store *s = ec_open(&e);
    uint8_t key[32];
    storetest_key(77, key);
    size_t n, gn;
    void *f = storetest_block(key, 3, 77, &n);
    uint8_t *buf = util_aligned_alloc(n);
    CHECK(store_get_into(s, key, 0, buf, n, &gn) == STORE_MISS);
    CHECK(store_put(s, key, f, n, 0) == STORE_OK);
    memset(buf, 0, n);
    CHECK(store_get_into(s, key, 0, buf, n, &gn) == STORE_OK && gn == n && !memcmp(buf, f, n));
    CHECK(store_get_into(s, key, 0, buf, n - 1, &gn) == STORE_ARG);
    free(buf);
    free(f);
    store_close(s);
    storetest_rmrf(e.base);
}

TEST(test_ec_any_two_lost_or_corrupt)
{
    ec_env e;
    ec_env_init(&e, 10, 2, 0);
    store *s = ec_open(&e);
    uint8_t key[32];
    storetest_key(42, key);
    size_t n;
    void *f = storetest_block(key, 3, 42, &n);
    int pairs = 0, identical = 0;
    for (int a = 0; a < N_T; a++)
        for (int b = a + 1; b < N_T; b++) {
            store_delete(s, key);   /* a clean start: an unread corrupt fragment would stay */
            CHECK(store_put(s, key, f, n, 0) == STORE_OK);
            char pa[512], pb[512];
            frag_path(&e, 10, 2, key, a, pa, sizeof pa);
            frag_path(&e, 10, 2, key, b, pb, sizeof pb);
            int mode = pairs % 3;   /* delete both, corrupt both, one of each */
            if (mode == 0) { unlink(pa); unlink(pb); }
            if (mode == 1) { storetest_flip(pa, -7); storetest_flip(pb, 200); }
            if (mode == 2) { unlink(pa); CHECK(truncate(pb, 1000) == 0); }
            void *got;
            size_t gn;
            store_status st = store_get(s, key, 0, &got, &gn);
            if (st == STORE_OK && gn == n && !memcmp(got, f, n)) identical++;
            else fprintf(stderr, "  pair %d,%d mode %d: %s\n", a, b, mode, store_status_name(st));
            free(got);
            pairs++;
        }
    CHECK(pairs == 66 && identical == 66);
    store_stats st;
    store_get_stats(s, &st);
    CHECK(st.n_frag_corrupt > 0 && st.n_frag_missing > 0 && st.n_decode > 0);
    CHECK(st.n_corrupt == 0);
    store_ec_counters ec;
    (void)ec;
    store_close(s);
    free(f);
    storetest_rmrf(e.base);
}

TEST(test_ec_three_lost_is_a_miss)
{
    ec_env e;
    ec_env_init(&e, 10, 2, 0);
    store *s = ec_open(&e);
    uint8_t key[32];
    storetest_key(43, key);
    size_t n;
    void *f = storetest_block(key, 2, 43, &n);
    for (int trial = 0; trial < 6; trial++) {
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        int lost[3] = { trial, (trial + 4) % N_T, (trial + 9) % N_T };
        for (int j = 0; j < 3; j++) {
            char p[512];
            frag_path(&e, 10, 2, key, lost[j], p, sizeof p);
            if (trial % 2) unlink(p); else storetest_flip(p, -1);
        }
        CHECK(store_exists(s, (const uint8_t(*)[32])key, 1) == (trial % 2 ? 0 : 1));
        void *got = (void *)1;
        size_t gn;
        CHECK(store_get(s, key, 0, &got, &gn) == STORE_MISS && got == NULL);
    }
    store_close(s);
    free(f);
    storetest_rmrf(e.base);
}

TEST(test_ec_decode_tables_cached)
{
    ec_env e;
    ec_env_init(&e, 4, 2, 0);
    store_opts o = { 0 };
    store_dir_opts dopts = { .ext = "frg" };
    (void)o;
    char *targets[6], paths[6][128];
    for (int i = 0; i < 6; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/t%d", e.base, i);
        targets[i] = paths[i];
    }
    store_ec *ec;
    CHECK(store_ec_open(4, 2, targets, &dopts, &ec) == STORE_OK);
    uint8_t key[32];
    storetest_key(44, key);
    size_t n;
    void *f = storetest_block(key, 2, 44, &n);
    for (int round = 0; round < 3; round++) {
        CHECK(store_ec_put(ec, key, f, n, 0) == STORE_OK);
        char p[512];
        frag_path(&e, 4, 2, key, 1, p, sizeof p);   /* data fragment 1 and parity 5 gone every */
        unlink(p);                                  /* time: always the same loss pattern */
        frag_path(&e, 4, 2, key, 5, p, sizeof p);
        unlink(p);
        void *got;
        size_t gn;
        CHECK(store_ec_get(ec, key, 0, &got, &gn) == STORE_OK && gn == n && !memcmp(got, f, n));
        free(got);
    }
    store_ec_counters c;
    store_ec_get_counters(ec, &c);
    CHECKF(c.n_decode == 3 && c.n_decode_cached == 2, "decode %llu cached %llu", (unsigned long long)c.n_decode,
           (unsigned long long)c.n_decode_cached);
    /* raw encode agrees with a decode of the same data */
    store_ec_close(ec);
    free(f);
    storetest_rmrf(e.base);
}

TEST(test_ec_missing_targets_at_open)
{
    ec_env e;
    ec_env_init(&e, 10, 2, 2);   /* two targets unusable: still every block readable */
    store *s = ec_open(&e);
    if (s) {
        uint8_t key[32];
        storetest_key(45, key);
        size_t n;
        void *f = storetest_block(key, 2, 45, &n);
        CHECK(store_put(s, key, f, n, 0) == STORE_OK);
        void *got;
        size_t gn;
        CHECK(store_get(s, key, 0, &got, &gn) == STORE_OK && gn == n && !memcmp(got, f, n));
        free(got);
        store_stats st;
        store_get_stats(s, &st);
        CHECK(st.n_degraded_put == 1);
        free(f);
        store_close(s);
    }
    storetest_rmrf(e.base);
    ec_env_init(&e, 10, 2, 3);   /* three: fewer than K, no store */
    store *s2 = NULL;
    CHECK(store_open(e.spec, NULL, &s2) == STORE_IO && s2 == NULL);
    storetest_rmrf(e.base);
}

TEST(test_ec_fsck)
{
    ec_env e;
    ec_env_init(&e, 10, 2, 0);
    store *s = ec_open(&e);
    uint8_t keys[3][32];
    for (int b = 0; b < 3; b++) {
        storetest_key(50 + b, keys[b]);
        size_t n;
        void *f = storetest_block(keys[b], 1, (uint64_t)b, &n);
        CHECK(store_put(s, keys[b], f, n, 0) == STORE_OK);
        free(f);
    }
    char p[512];
    /* block 0: one corrupt fragment (degraded), block 1: 3 corrupt (lost), block 2: fine */
    frag_path(&e, 10, 2, keys[0], 3, p, sizeof p);
    storetest_flip(p, -2);
    for (int i = 0; i < 3; i++) {
        frag_path(&e, 10, 2, keys[1], i * 4, p, sizeof p);
        storetest_flip(p, 140);
    }
    store_fsck_result r;
    store_fsck(s, &r);
    CHECK(r.n_files == 36 && r.n_broken == 4 && r.n_ok == 32);
    CHECK(r.n_lost == 1 && r.n_degraded == 1 && r.n_repaired == 1);
    store_fsck(s, &r);
    CHECK(r.n_files == 12 + 12 && r.n_broken == 0 && r.n_lost == 0 && r.n_degraded == 0);
    store_close(s);
    storetest_rmrf(e.base);
}

TEST(test_ec_raw_encode)
{
    /* parity of all-equal data columns: a Cauchy code is linear; parity of zeros is zero */
    uint8_t *d[10], *p[2];
    for (int i = 0; i < 10; i++) d[i] = calloc(1, 256);
    for (int i = 0; i < 2; i++) p[i] = malloc(256);
    store_ec_encode_raw(10, 2, 256, d, p);
    int nz = 0;
    for (int i = 0; i < 256; i++) nz += p[0][i] | p[1][i];
    CHECK(nz == 0);
    for (int i = 0; i < 10; i++) free(d[i]);
    for (int i = 0; i < 2; i++) free(p[i]);
}

int main(void)
{
    util_log_level = LOG_LEVEL_ERROR;
    RUN(test_ec_roundtrip_sizes);
    RUN(test_ec_get_into_caller_buffer);
    RUN(test_ec_any_two_lost_or_corrupt);
    RUN(test_ec_three_lost_is_a_miss);
    RUN(test_ec_decode_tables_cached);
    RUN(test_ec_missing_targets_at_open);
    RUN(test_ec_fsck);
    RUN(test_ec_raw_encode);
    HARNESS_END();
}
