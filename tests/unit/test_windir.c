/*
 * test_windir: the gateway's directory of window states (src/cluster/windir.h): the latest
 * report of a key wins, a drop by another worker than the holder changes nothing, entries
 * expire, a lost worker's entries all go, and memory stays bounded (the oldest report goes
 * when full) over many more reports than entries.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "cluster/windir.h"
#include "util/util.h"

static void mk_key(uint8_t key[32], uint32_t i)
{
    memset(key, 0, 32);
    memcpy(key, &i, 4);        /* the hash reads the first bytes: spread them */
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
    int slot = -1;
    uint64_t gen = 0;
    CHECK(!windir_find(d, k1, 0, &slot, &gen));
    windir_add(d, k1, 3, 7, 100);
    CHECK(windir_find(d, k1, 50, &slot, &gen) && slot == 3 && gen == 7);
    windir_add(d, k1, 4, 1, 120);   /* another worker reports it later: it wins */
    CHECK(windir_find(d, k1, 50, &slot, &gen) && slot == 4 && gen == 1);
    CHECK(windir_count(d) == 1);
    windir_drop(d, k1, 3);          /* not the holder: no change */
    CHECK(windir_find(d, k1, 50, &slot, &gen) && slot == 4);
    windir_drop(d, k1, 4);
    CHECK(!windir_find(d, k1, 50, &slot, &gen) && windir_count(d) == 0);
    windir_add(d, k1, 1, 1, 100);
    windir_add(d, k2, 2, 1, 100);
    CHECK(!windir_find(d, k2, 100.5, &slot, &gen));   /* expired: dropped */
    CHECK(windir_count(d) == 1);
    windir_add(d, k2, 1, 1, 200);
    windir_drop_worker(d, 1);
    CHECK(windir_count(d) == 0 && !windir_find(d, k1, 0, &slot, &gen));
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
        windir_add(d, k, (int)(i % 5), 0, 1e9);
        if (i % 7 == 0) {
            mk_key(k, i / 2);
            windir_drop(d, k, (int)((i / 2) % 5));
        }
        CHECK(windir_count(d) <= N);
    }
    int slot;
    uint64_t gen;
    int found = 0;
    for (uint32_t i = 100000 - N; i < 100000; i++) {
        mk_key(k, i);
        found += windir_find(d, k, 0, &slot, &gen) && slot == (int)(i % 5);
    }
    CHECK(found == N);   /* the newest N reports are the ones kept */
    mk_key(k, 0);
    CHECK(!windir_find(d, k, 0, &slot, &gen));
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
