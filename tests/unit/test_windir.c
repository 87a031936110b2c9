/*
 * test_windir: the gateway's directory of window states (src/cluster/windir.h): a key is held
 * by the set of workers that reported it (the producer and those it was relayed to), a drop
 * clears one holder and the entry goes with the last, entries expire at the latest reported
 * expiry, a lost worker's bits all go, out-of-range slots are ignored, and memory stays bounded
 * (the oldest report goes when full) over many more reports than entries.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "cluster/windir.h"

static void mk_key(uint8_t key[32], uint32_t i)
{
    memset(key, 0, 32);
    memcpy(key, &i, 4);        /* the hash reads the first bytes */
    key[31] = (uint8_t)(i >> 3);
}

TEST(test_windir_holders)
{
    windir *d = windir_new(8);
    CHECK(d != NULL);
    if (!d) return;
    uint8_t k1[32], k2[32];
    mk_key(k1, 1);
    mk_key(k2, 2);
    CHECK(windir_find(d, k1, 0) == 0);
    windir_add(d, k1, 3, 100);
    CHECK(windir_find(d, k1, 50) == 1ull << 3);
    windir_add(d, k1, 63, 120);     /* relayed to another worker: both hold it */
    CHECK(windir_find(d, k1, 50) == ((1ull << 3) | (1ull << 63)));
    CHECK(windir_count(d) == 1);
    windir_add(d, k1, 64, 130);     /* not a slot: ignored */
    windir_add(d, k1, -1, 130);
    CHECK(windir_find(d, k1, 50) == ((1ull << 3) | (1ull << 63)));
    windir_drop(d, k1, 5);          /* not a holder: no change */
    windir_drop(d, k1, 3);
    CHECK(windir_find(d, k1, 110) == 1ull << 63);   /* expiry: the latest reported (120) */
    windir_drop(d, k1, 63);
    CHECK(windir_find(d, k1, 50) == 0 && windir_count(d) == 0);
    windir_add(d, k1, 1, 100);
    windir_add(d, k2, 2, 100);
    CHECK(windir_find(d, k2, 100.5) == 0);   /* expired: dropped */
    CHECK(windir_count(d) == 1);
    windir_add(d, k2, 1, 200);
    windir_add(d, k2, 2, 200);
    windir_drop_worker(d, 1);
    CHECK(windir_count(d) == 1 && windir_find(d, k1, 0) == 0 && windir_find(d, k2, 0) == 1ull << 2);
    windir_free(d);
    CHECK(windir_new(0) == NULL);
}

TEST(test_windir_bounded)
{
    enum { N = 64 };
    windir *d = windir_new(N);
    CHECK(d != NULL);
    if (!d) return;
    uint8_t k[32];
    for (uint32_t i = 0; i < 100000; i++) {
        mk_key(k, i);
        windir_add(d, k, (int)(i % 5), 1e9);
        if (i % 7 == 0) {
            mk_key(k, i / 2);
            windir_drop(d, k, (int)((i / 2) % 5));
        }
        CHECK(windir_count(d) <= N);
    }
    int found = 0;
    for (uint32_t i = 100000 - N; i < 100000; i++) {
        mk_key(k, i);
        found += windir_find(d, k, 0) == 1ull << (i % 5);
    }
    CHECK(found == N);   /* the newest N reports are the ones kept */
    mk_key(k, 0);
    CHECK(windir_find(d, k, 0) == 0);
    for (int s = 0; s < 5; s++) windir_drop_worker(d, s);
    CHECK(windir_count(d) == 0);
    windir_free(d);
}

int main(void)
{
    RUN(test_windir_holders);
    RUN(test_windir_bounded);
    HARNESS_END();
}
