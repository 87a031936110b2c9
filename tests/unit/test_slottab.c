/*
 * test_slottab: the free list hands slots out in order and takes them back, the recency list
 * keeps its order through touches and unlinks, keys whose hashes collide are found, removed
 * from the middle of a chain and re-entered, and a long random run of every call agrees with a
 * plain reference model (arrays scanned end to end).
 */
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>

#include "util/slottab.h"

/* A key whose hash bytes (the first four) are h and whose rest is tag. */
static void mkkey(uint8_t key[32], uint32_t h, uint32_t tag)
{
    memset(key, 0, 32);
    memcpy(key, &h, 4);
    memcpy(key + 4, &tag, 4);
}

TEST(test_slottab_free_list)
{
    slottab t;
    CHECK(slottab_init(&t, 3));
    CHECK(slottab_take(&t) == 0);
    CHECK(slottab_take(&t) == 1);
    CHECK(slottab_take(&t) == 2);
    CHECK(slottab_take(&t) == -1);
    slottab_give(&t, 1);
    slottab_give(&t, 1);   /* twice: no-op, the list must not loop */
    slottab_give(&t, 0);
    CHECK(slottab_take(&t) == 0);
    CHECK(slottab_take(&t) == 1);
    CHECK(slottab_take(&t) == -1);
    slottab_free(&t);
    slottab_free(&t);      /* a freed table is zeroed and may be freed again */

    CHECK(slottab_init(&t, 0));
    uint8_t k[32];
    mkkey(k, 1, 1);
    CHECK(slottab_take(&t) == -1);
    CHECK(slottab_find(&t, k) == -1);
    slottab_free(&t);
    CHECK(!slottab_init(&t, -1));
    CHECK(!slottab_init(&t, SLOTTAB_MAX + 1));
    CHECK(slottab_find(&t, k) == -1);   /* a failed init leaves a zeroed, usable table */
    slottab_free(&t);
}

TEST(test_slottab_recency)
{
    slottab t;
    CHECK(slottab_init(&t, 4));
    for (int i = 0; i < 4; i++) CHECK(slottab_take(&t) == i);
    CHECK(slottab_oldest(&t) == -1);
    for (int i = 0; i < 4; i++) slottab_touch(&t, i);
    slottab_touch(&t, 1);     /* 0 2 3 1 */
    slottab_unlink(&t, 2);    /* 0 3 1 */
    slottab_unlink(&t, 2);    /* twice: no-op */
    CHECK(!slottab_listed(&t, 2) && slottab_listed(&t, 3));
    int want[] = { 0, 3, 1 }, n = 0;
    for (int i = slottab_oldest(&t); i >= 0 && n <= 4; i = slottab_newer(&t, i)) {   /* bounded: a broken list may loop */
        CHECK(n < 3 && i == want[n]);
        n++;
    }
    CHECK(n == 3);
    slottab_give(&t, 0);      /* off the recency list, onto the free list */
    CHECK(slottab_oldest(&t) == 3);
    slottab_touch(&t, 0);     /* a free slot stays free */
    CHECK(slottab_oldest(&t) == 3 && slottab_take(&t) == 0);
    slottab_give(&t, 1);      /* the newest goes: 3 alone */
    slottab_give(&t, 3);
    CHECK(slottab_oldest(&t) == -1);
    slottab_touch(&t, 2);
    CHECK(slottab_oldest(&t) == 2 && slottab_newer(&t, 2) == -1);
    slottab_free(&t);
}

TEST(test_slottab_collisions)
{
    slottab t;
    CHECK(slottab_init(&t, 8));
    uint8_t k[8][32];
    for (int i = 0; i < 8; i++) {
        mkkey(k[i], 7, (uint32_t)i);   /* one bucket: a chain of eight */
        CHECK(slottab_take(&t) == i);
        CHECK(slottab_find(&t, k[i]) == -1);
        slottab_set_key(&t, i, k[i]);
    }
    for (int i = 0; i < 8; i++) CHECK(slottab_find(&t, k[i]) == i);
    slottab_clear_key(&t, 3);   /* the chain's middle */
    slottab_clear_key(&t, 7);   /* its head (the last entered) */
    slottab_clear_key(&t, 0);   /* its end */
    slottab_clear_key(&t, 0);   /* twice: no-op */
    for (int i = 0; i < 8; i++) {
        bool gone = i == 3 || i == 7 || i == 0;
        CHECK(slottab_find(&t, k[i]) == (gone ? -1 : i));
        CHECK(slottab_keyed(&t, i) == !gone);
        CHECK(gone ? slottab_get_key(&t, i) == NULL : !memcmp(slottab_get_key(&t, i), k[i], 32));
    }
    slottab_set_key(&t, 3, k[0]);   /* a slot may come back under another key */
    CHECK(slottab_find(&t, k[0]) == 3 && slottab_find(&t, k[3]) == -1);
    slottab_give(&t, 5);            /* giving a slot back unkeys it */
    CHECK(slottab_find(&t, k[5]) == -1 && !slottab_keyed(&t, 5));
    slottab_free(&t);
}

/* The reference: per slot its list (0 free, 1 held, 2 recency), its key, its place in the
 * recency order (a counter); the free list's order is a stack. */
enum { N = 24, STEPS = 20000 };
typedef struct {
    int list[N];
    bool keyed[N];
    uint8_t key[N][32];
    uint64_t stamp[N];
    int stack[N], n_stack;
    uint64_t clock;
} model;

static uint32_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

TEST(test_slottab_model)
{
    slottab t;
    CHECK(slottab_init(&t, N));
    model m = { 0 };
    for (int i = N - 1; i >= 0; i--) m.stack[m.n_stack++] = i;
    uint64_t seed = 12345;
    int bad = 0;
    for (int step = 0; step < STEPS && !bad; step++) {
        int i = (int)(rng_next(&seed) % N);
        uint8_t key[32];
        mkkey(key, rng_next(&seed) % 4, rng_next(&seed) % 40);   /* few hashes: long chains */
        switch (rng_next(&seed) % 6) {
        case 0: {
            int want = m.n_stack ? m.stack[--m.n_stack] : -1;
            if (slottab_take(&t) != want) bad = 1;
            if (want >= 0) m.list[want] = 1;
            break;
        }
        case 1:
            slottab_give(&t, i);
            if (m.list[i] != 0) {
                m.list[i] = 0;
                m.keyed[i] = false;
                m.stack[m.n_stack++] = i;
            }
            break;
        case 2:
            if (m.list[i] == 0) break;
            slottab_touch(&t, i);
            m.list[i] = 2;
            m.stamp[i] = ++m.clock;
            break;
        case 3:
            slottab_unlink(&t, i);
            if (m.list[i] == 2) m.list[i] = 1;
            break;
        case 4: {
            int have = -1;
            for (int j = 0; j < N; j++)
                if (m.keyed[j] && !memcmp(m.key[j], key, 32)) have = j;
            if (slottab_find(&t, key) != have) bad = 2;
            if (have < 0 && !m.keyed[i] && m.list[i] != 0) {
                slottab_set_key(&t, i, key);
                m.keyed[i] = true;
                memcpy(m.key[i], key, 32);
            }
            break;
        }
        case 5:
            slottab_clear_key(&t, i);
            m.keyed[i] = false;
            break;
        }
        /* the recency list walks oldest to newest in stamp order, over exactly the listed */
        int n_listed = 0, n_walk = 0;
        for (int j = 0; j < N; j++) {
            n_listed += m.list[j] == 2;
            if (slottab_listed(&t, j) != (m.list[j] == 2)) bad = 3;
            if (slottab_keyed(&t, j) != m.keyed[j]) bad = 4;
            if (m.keyed[j] && slottab_find(&t, m.key[j]) != j) bad = 5;
        }
        uint64_t last = 0;
        for (int j = slottab_oldest(&t); j >= 0 && n_walk <= N; j = slottab_newer(&t, j)) {
            if (m.list[j] != 2 || m.stamp[j] <= last) bad = 6;
            last = m.stamp[j];
            n_walk++;
        }
        if (n_walk != n_listed) bad = 7;
        if (bad) fprintf(stderr, "  step %d: disagreement %d\n", step, bad);
    }
    CHECK(!bad);
    slottab_free(&t);
}

int main(void)
{
    RUN(test_slottab_free_list);
    RUN(test_slottab_recency);
    RUN(test_slottab_collisions);
    RUN(test_slottab_model);
    HARNESS_END();
}
