/*
 * test_wincache: engine/wincache.c, the window cache. Put and get copy the state; entries
 * expire ttl_s after their put; the least recently used goes when the byte bound is reached;
 * a put of a held key replaces it; the counters /metrics reads; the journal a cluster worker
 * reports (adds with their TTL, drops, lost events counted); a peek or a fetched put as a
 * cluster's relay does them.
 */
#include "harness.h"

#include <stdint.h>

#include "engine/wincache.h"

/* The journal a cluster worker reports to the gateway's directory: adds with their TTL, drops
 * for room and age, in order; a full journal loses new events (counted), never blocks. A peek
 * (a fetch by another worker) copies without counting a hit; a fetched put counts a fetch. */
TEST(test_wincache_journal)
{
    enum { EB = 32 };
    wincache_opts o = { .entry_bytes = EB, .max_bytes = 2 * EB, .ttl_s = 5 };
    wincache *c = wincache_new(&o);
    CHECK(c != NULL);
    if (!c) return;
    uint8_t key[3][32] = { { 1 }, { 2 }, { 3 } }, st[EB], got[EB];
    memset(st, 7, EB);
    wincache_put(c, key[0], st, 10);   /* no journal yet: nothing recorded */
    wincache_event ev[8];
    CHECK(wincache_events(c, ev, 8) == 0);
    wincache_journal_start(c, 3);
    wincache_put(c, key[1], st, 11);
    wincache_put(c, key[2], st, 12);   /* full: key 0 (least recently used) goes */
    int n = wincache_events(c, ev, 8);
    CHECK(n == 3);
    CHECK(ev[0].op == WINCACHE_EV_ADD && ev[0].key[0] == 2 && ev[0].ttl_ms == 5000);
    CHECK(ev[1].op == WINCACHE_EV_DROP && ev[1].key[0] == 1 && ev[1].ttl_ms == 0);
    CHECK(ev[2].op == WINCACHE_EV_ADD && ev[2].key[0] == 3);
    CHECK(wincache_events(c, ev, 8) == 0);   /* taken */
    for (int i = 0; i < 3; i++) wincache_put(c, key[1], st, 13 + i);
    wincache_put(c, key[2], st, 16);   /* the fourth event: lost */
    wincache_stats s;
    wincache_get_stats(c, &s);
    CHECK(s.n_journal_lost == 1);
    CHECK(wincache_events(c, ev, 2) == 2 && wincache_events(c, ev, 8) == 1);

    memset(got, 0, EB);
    CHECK(wincache_peek(c, key[1], got, 16) && got[EB - 1] == 7);
    CHECK(!wincache_peek(c, key[0], got, 16));
    CHECK(!wincache_peek(c, key[1], got, 30));   /* expired: not served */
    wincache_get_stats(c, &s);
    CHECK(s.n_hits == 0 && s.n_misses == 0 && s.n_served == 1);
    uint8_t k4[32] = { 4 };
    memset(st, 8, EB);
    wincache_put_fetched(c, k4, st, 20);
    CHECK(wincache_get(c, k4, got, 20) && got[0] == 8);
    wincache_get_stats(c, &s);
    CHECK(s.n_fetches == 1 && s.n_fetch_bytes == EB && s.n_hits == 1);
    CHECK(wincache_entry_bytes(c) == EB && wincache_entry_bytes(NULL) == 0);
    wincache_free(c);
}

TEST(test_wincache_ttl_lru)
{
    enum { EB = 64 };
    wincache_opts o = { .entry_bytes = EB, .max_bytes = 3 * EB + 10, .ttl_s = 10 };
    wincache *c = wincache_new(&o);
    CHECK(c != NULL);
    if (!c) return;
    uint8_t key[4][32] = { { 1 }, { 2 }, { 3 }, { 4 } }, st[EB], got[EB];
    for (int i = 0; i < 4; i++) key[i][5] = (uint8_t)(i * 7);
    for (int i = 0; i < 3; i++) {
        memset(st, i + 1, EB);
        wincache_put(c, key[i], st, 100.0 + i);
    }
    wincache_stats s;
    wincache_get_stats(c, &s);
    CHECK(s.n_entries == 3 && s.bytes == 3 * EB && s.n_puts == 3);
    CHECK(wincache_get(c, key[0], got, 105) && got[0] == 1 && got[EB - 1] == 1);   /* key 0 most recent now */
    memset(st, 9, EB);
    wincache_put(c, key[3], st, 106);   /* full: the least recently used (key 1) goes */
    CHECK(!wincache_get(c, key[1], got, 106));
    CHECK(wincache_get(c, key[0], got, 106) && wincache_get(c, key[3], got, 106) && got[0] == 9);
    wincache_get_stats(c, &s);
    CHECK(s.n_evicted == 1 && s.n_entries == 3 && s.n_misses == 1 && s.n_hits == 3);
    /* TTL: key 2 was put at 102; at 112.5 it has expired, key 3 (106) has not */
    CHECK(!wincache_get(c, key[2], got, 112.5));
    CHECK(wincache_get(c, key[3], got, 112.5));
    wincache_get_stats(c, &s);
    CHECK(s.n_expired == 1 && s.n_entries == 2);
    /* a put replaces an entry of the same key */
    memset(st, 4, EB);
    wincache_put(c, key[3], st, 113);
    CHECK(wincache_get(c, key[3], got, 113) && got[0] == 4);
    wincache_get_stats(c, &s);
    CHECK(s.n_entries == 2);
    wincache_count_replay(c, false, 128);
    wincache_count_replay(c, true, 142);
    wincache_get_stats(c, &s);
    CHECK(s.n_replay_bounded == 1 && s.n_replay_exact == 1 && s.n_replay_tokens == 270);
    wincache_free(c);

    /* less room than one entry: nothing is kept, replays are still counted */
    o.max_bytes = EB - 1;
    c = wincache_new(&o);
    CHECK(c != NULL);
    wincache_put(c, key[0], st, 1);
    CHECK(!wincache_get(c, key[0], got, 1));
    wincache_free(c);
}

/* Keys that differ only in their last byte are distinct entries; a long run of puts through
 * a small cache keeps exactly the most recent ones. */
TEST(test_wincache_many_keys)
{
    enum { EB = 16, HELD = 3, PUTS = 100 };
    wincache_opts o = { .entry_bytes = EB, .max_bytes = HELD * EB, .ttl_s = 1000 };
    wincache *c = wincache_new(&o);
    CHECK(c != NULL);
    if (!c) return;
    uint8_t key[32] = { 0 }, st[EB], got[EB];
    for (int i = 0; i < PUTS; i++) {
        key[31] = (uint8_t)i;
        memset(st, i, EB);
        wincache_put(c, key, st, 1.0 + i);
    }
    wincache_stats s;
    wincache_get_stats(c, &s);
    CHECK(s.n_entries == HELD && s.bytes == HELD * EB && s.n_puts == PUTS && s.n_evicted == PUTS - HELD);
    for (int i = 0; i < PUTS; i++) {
        key[31] = (uint8_t)i;
        memset(got, 0xFF, EB);
        bool hit = wincache_get(c, key, got, 200);
        CHECKF(hit == (i >= PUTS - HELD), "key %d", i);
        if (hit) CHECK(got[0] == i && got[EB - 1] == i);
    }
    wincache_get_stats(c, &s);
    CHECK(s.n_hits == HELD && s.n_misses == PUTS - HELD && s.n_expired == 0);
    wincache_free(c);
}

/* No window layers: no cache. ttl_s <= 0 means 180 s. A put of a held key starts its TTL
 * again. */
TEST(test_wincache_defaults)
{
    wincache_opts none = { .entry_bytes = 0, .max_bytes = 1 << 20, .ttl_s = 5 };
    CHECK(wincache_new(&none) == NULL);
    enum { EB = 8 };
    wincache_opts o = { .entry_bytes = EB, .max_bytes = 4 * EB, .ttl_s = 0 };
    wincache *c = wincache_new(&o);
    CHECK(c != NULL);
    if (!c) return;
    uint8_t k[32] = { 9 }, st[EB] = { 1 }, got[EB];
    wincache_put(c, k, st, 1000);
    CHECK(wincache_get(c, k, got, 1179));
    CHECK(!wincache_get(c, k, got, 1181));
    wincache_put(c, k, st, 2000);
    wincache_put(c, k, st, 2100);     /* again: lives until 2280 */
    CHECK(wincache_get(c, k, got, 2250));
    CHECK(!wincache_get(c, k, got, 2281));
    wincache_stats s;
    wincache_get_stats(c, &s);
    CHECK(s.n_expired == 2 && s.n_entries == 0 && s.bytes == 0);
    wincache_free(c);
}

int main(void)
{
    RUN(test_wincache_ttl_lru);
    RUN(test_wincache_journal);
    RUN(test_wincache_many_keys);
    RUN(test_wincache_defaults);
    HARNESS_END();
}
