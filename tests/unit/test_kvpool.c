/*
 * test_kvpool: the paged KV pool and its RAM prefix tier: block sharing between sequences,
 * refcounts, LRU reclaim order, exhaustion, key chaining, slab addressing.
 */
#include "harness.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "storetest.h"

#include "cache/store.h"
#include "engine/blockio.h"
#include "engine/kvpool.h"
#include "model/model.h"

static kvpool *mkpool(int n_blocks, qtype dt)
{
    kvpool_opts o = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .dtype = dt, .n_blocks = n_blocks };
    for (int i = 0; i < 32; i++) o.model_fp[i] = (uint8_t)i;
    kvpool *p = NULL;
    CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
    return p;
}

static void fill_tokens(int32_t *t, int n, int seed)
{
    for (int i = 0; i < n; i++) t[i] = (seed * 7919 + i * 31) % 1000;
}

TEST(test_bad_args)
{
    kvpool_opts o = { .n_layers = 0, .n_kv_heads = 1, .head_dim = 8, .dtype = QTYPE_F16, .n_blocks = 1 };
    kvpool *p = (kvpool *)1;
    CHECK(kvpool_new(&o, &p) == KVPOOL_ERR_ARG && p == NULL);
    o.n_layers = 1;
    o.dtype = QTYPE_Q8_0;
    CHECK(kvpool_new(&o, &p) == KVPOOL_ERR_ARG);
    /* blocks of 2^49 bytes, 2^16 of them: the size overflows; refused, nothing kept (ASan's
     * leak check sees what a half-built pool would leave) */
    kvpool_opts big = { .n_layers = 1, .n_kv_heads = 1 << 20, .head_dim = 1 << 20, .dtype = QTYPE_F16,
                        .n_blocks = 1 << 16 };
    p = (kvpool *)1;
    CHECK(kvpool_new(&big, &p) == KVPOOL_ERR_NOMEM && p == NULL);
}

TEST(test_prefault_zeroes_every_block)
{
    /* every byte of every block reads as zero after kvpool_prefault (ASan: nothing past the
     * data area is written) */
    kvpool *p = mkpool(3, QTYPE_F32);
    size_t bytes = kvpool_block_bytes(p), nz = 0;
    kvpool_seq *a = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 3 * 128) == KVPOOL_OK);
    for (int bi = 0; bi < 3; bi++) memset(kvpool_seq_slab(p, a, bi, 0, 0, 0), 0xff, bytes);
    kvpool_seq_free(p, a);
    kvpool_prefault(p);
    a = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 3 * 128) == KVPOOL_OK);
    for (int bi = 0; bi < 3; bi++) {
        const uint8_t *d = kvpool_seq_slab(p, a, bi, 0, 0, 0);
        for (size_t i = 0; i < bytes; i++) nz += d[i] != 0;
    }
    CHECK(nz == 0);
    kvpool_seq_free(p, a);
    kvpool_free(p);
}

TEST(test_reserve_and_exhaustion)
{
    kvpool *p = mkpool(4, QTYPE_F16);
    kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 1) == KVPOOL_OK);
    CHECK(kvpool_seq_capacity(a) == 128);
    CHECK(kvpool_seq_reserve(p, a, 128) == KVPOOL_OK && kvpool_seq_capacity(a) == 128);
    CHECK(kvpool_seq_reserve(p, a, 129) == KVPOOL_OK && kvpool_seq_capacity(a) == 256);
    CHECK(kvpool_seq_reserve(p, b, 3 * 128) == KVPOOL_ERR_FULL);
    CHECK(kvpool_seq_capacity(b) == 0);  /* a failed reservation changes nothing */
    CHECK(kvpool_seq_reserve(p, b, 2 * 128) == KVPOOL_OK);
    kvpool_stats st;
    kvpool_get_stats(p, &st);
    CHECK(st.n_free == 0 && st.n_pinned == 4 && st.n_cached == 0);
    CHECK(kvpool_seq_reserve(p, b, 2 * 128 + 1) == KVPOOL_ERR_FULL);
    kvpool_seq_free(p, a);
    kvpool_get_stats(p, &st);
    CHECK(st.n_free == 2 && st.n_pinned == 2);
    CHECK(kvpool_seq_reserve(p, b, 4 * 128) == KVPOOL_OK);
    kvpool_seq_free(p, b);
    kvpool_get_stats(p, &st);
    CHECK(st.n_free == 4 && st.n_pinned == 0);
    kvpool_free(p);
}

TEST(test_slab_layout)
{
    for (int f32 = 0; f32 < 2; f32++) {
        kvpool *p = mkpool(3, f32 ? QTYPE_F32 : QTYPE_F16);
        size_t esz = f32 ? 4 : 2;
        kvpool_seq *a = kvpool_seq_new(p);
        CHECK(kvpool_seq_reserve(p, a, 300) == KVPOOL_OK);
        char *k = kvpool_seq_slab(p, a, 0, 0, 0, 0), *v = kvpool_seq_slab(p, a, 0, 0, 1, 0);
        CHECK((size_t)(v - k) == 2 * 128 * 8 * esz);
        CHECK(kvpool_block_bytes(p) == 2 * 2 * 2 * 128 * 8 * esz);
        /* store everything, read back: no overlap between positions/layers/heads */
        float kr[8], vr[8];
        for (int pos = 0; pos < 300; pos++)
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    for (int d = 0; d < 8; d++) {
                        kr[d] = (float)((pos * 4 + l * 2 + h) % 200) + d * 0.125f;
                        vr[d] = -kr[d];
                    }
                    kvpool_seq_store(p, a, pos, l, h, kr, vr);
                }
        int bad = 0;
        for (int pos = 0; pos < 300; pos++)
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    kvpool_seq_load(p, a, pos, l, h, kr, vr);
                    for (int d = 0; d < 8; d++) {
                        float x = (float)((pos * 4 + l * 2 + h) % 200) + d * 0.125f;
                        bad += kr[d] != x || vr[d] != -x;  /* exact in f16 */
                    }
                }
        CHECK(bad == 0);
        /* rows are contiguous per position: dim d of position 128 + r at r*8 + d */
        kvpool_seq_load(p, a, 130, 1, 1, kr, vr);
        char *ks = kvpool_seq_slab(p, a, 1, 1, 0, 1), *vs = kvpool_seq_slab(p, a, 1, 1, 1, 1);
        float k3, v3;
        if (f32) {
            k3 = ((float *)ks)[2 * 8 + 3];
            v3 = ((float *)vs)[2 * 8 + 3];
        } else {
            k3 = quant_fp16_to_fp32(((fp16_t *)ks)[2 * 8 + 3]);
            v3 = quant_fp16_to_fp32(((fp16_t *)vs)[2 * 8 + 3]);
        }
        CHECK(k3 == kr[3] && v3 == vr[3]);
        kvpool_seq_free(p, a);
        kvpool_free(p);
    }
}

/* A latent pool (V is K): one row per (layer, kv head, position), the V slab is the K slab,
 * the block is half a K-and-V block's bytes, and a load gives the stored row as both. */
TEST(test_v_is_k_layout)
{
    kvpool_opts o = { .n_layers = 3, .n_kv_heads = 1, .head_dim = 12, .v_is_k = true, .dtype = QTYPE_F16, .n_blocks = 2 };
    kvpool *p = NULL;
    CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
    if (!p) return;
    CHECK(kvpool_n_parts(p) == 1 && kvpool_block_bytes(p) == 3 * 128 * 12 * 2);
    CHECK(kvpool_geom_block_bytes(&o) == kvpool_block_bytes(p));
    o.v_is_k = false;
    CHECK(kvpool_geom_block_bytes(&o) == 2 * kvpool_block_bytes(p));
    kvpool_seq *a = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 256) == KVPOOL_OK);
    for (int l = 0; l < 3; l++) {
        char *k = kvpool_seq_slab(p, a, 1, l, 0, 0);
        CHECK(kvpool_seq_slab(p, a, 1, l, 1, 0) == k);
        CHECK(l == 0 || (size_t)(k - (char *)kvpool_seq_slab(p, a, 1, l - 1, 0, 0)) == 128 * 12 * 2);
    }
    float kr[12], kb[12], vb[12];
    int bad = 0;
    for (int pos = 0; pos < 256; pos++)
        for (int l = 0; l < 3; l++) {
            for (int d = 0; d < 12; d++) kr[d] = (float)((pos + l * 7) % 100) + d * 0.25f;
            kvpool_seq_store(p, a, pos, l, 0, kr, NULL);
        }
    for (int pos = 0; pos < 256; pos++)
        for (int l = 0; l < 3; l++) {
            kvpool_seq_load(p, a, pos, l, 0, kb, vb);
            for (int d = 0; d < 12; d++) bad += kb[d] != (float)((pos + l * 7) % 100) + d * 0.25f || vb[d] != kb[d];
        }
    CHECK(bad == 0);
    kvpool_seq_free(p, a);
    kvpool_free(p);
}

/* kvpool_seq_copy_rows: positions [from, to) of one block, every layer, K and V of every
 * head, go from one sequence to the other, and nothing else of the destination changes (F16
 * and F32; a v_is_k pool has one slab per head). */
TEST(test_copy_rows)
{
    for (int vk = 0; vk < 2; vk++) {
        kvpool_opts o = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .v_is_k = vk, .dtype = vk ? QTYPE_F16 : QTYPE_F32,
                          .n_blocks = 4 };
        kvpool *p = NULL;
        CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
        if (!p) return;
        kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
        CHECK(kvpool_seq_reserve(p, a, 256) == KVPOOL_OK && kvpool_seq_reserve(p, b, 256) == KVPOOL_OK);
        float k[8], v[8], kb[8], vb[8];
        for (int pos = 0; pos < 256; pos++)
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    for (int d = 0; d < 8; d++) {
                        k[d] = (float)(pos * 4 + l * 2 + h) + d * 0.5f;
                        v[d] = -k[d];
                    }
                    kvpool_seq_store(p, a, pos, l, h, k, v);
                    for (int d = 0; d < 8; d++) k[d] = v[d] = 7.0f;
                    kvpool_seq_store(p, b, pos, l, h, k, v);
                }
        kvpool_seq_copy_rows(p, b, a, 128 + 5, 128 + 97);
        int bad = 0;
        for (int pos = 0; pos < 256; pos++)
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    kvpool_seq_load(p, b, pos, l, h, kb, vb);
                    bool in = pos >= 128 + 5 && pos < 128 + 97;
                    for (int d = 0; d < 8; d++) {
                        float want = in ? (float)(pos * 4 + l * 2 + h) + d * 0.5f : 7.0f;
                        bad += kb[d] != want || vb[d] != (in && !vk ? -want : want);
                    }
                }
        CHECKF(bad == 0, "v_is_k %d: %d values wrong", vk, bad);
        kvpool_seq_free(p, a);
        kvpool_seq_free(p, b);
        kvpool_free(p);
    }
}

/* Writes a value that names (pos, layer, head, d) into every K row of s below n. */
static void store_named(kvpool *p, kvpool_seq *s, int n)
{
    float k[8], v[8];
    for (int pos = 0; pos < n; pos++)
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                for (int d = 0; d < 8; d++) v[d] = -(k[d] = (float)(pos * 4 + l * 2 + h) + d * 0.5f);
                kvpool_seq_store(p, s, pos, l, h, k, v);
            }
}

/* Rows of a sequence's block outlive it as a tail: the next sequence after the same full
 * block copies the rows whose tokens it shares (not fewer than asked, never past a differing
 * token), as exact values, whether the tail was the sequence's own partial block or a full,
 * keyed one; the newest tail after a prefix replaces the older; a tail is an ordinary cached
 * block to reclaim. */
TEST(test_tail_rows)
{
    kvpool *p = mkpool(4, QTYPE_F32);
    int32_t toks[256];
    fill_tokens(toks, 256, 9);
    uint8_t k0[32];
    kvpool_seq *a = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 200) == KVPOOL_OK);
    store_named(p, a, 200);
    kvpool_seq_commit_full_blocks(p, a, toks, 200);
    memcpy(k0, kvpool_seq_last_key(a), 32);
    kvpool_seq_keep_tail(p, a, 1, k0, toks + 128, 72);   /* rows 128..199, unkeyed */
    kvpool_seq_free(p, a);
    kvpool_stats st;
    kvpool_get_stats(p, &st);
    CHECK(st.n_cached == 2 && st.n_free == 2 && st.n_tails_kept == 1);
    /* b: the block, then 60 of the tail's tokens and one of its own */
    int32_t tb[256];
    memcpy(tb, toks, sizeof tb);
    tb[188] = (tb[188] + 1) % 1000;
    kvpool_seq *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, b, tb, 256) == 128);
    CHECK(kvpool_seq_copy_tail(p, b, tb + 128, 127, 61) == 0);   /* fewer rows than asked */
    CHECK(kvpool_seq_copy_tail(p, b, tb + 128, 50, 16) == 50);   /* no more than the limit */
    kvpool_seq_free(p, b);
    b = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, b, tb, 256) == 128);
    CHECK(kvpool_seq_copy_tail(p, b, tb + 128, 127, 16) == 60);
    CHECK(kvpool_seq_capacity(b) == 256 && kvpool_seq_n_keyed(b) == 128);
    float kb[8], vb[8];
    int bad = 0;
    for (int pos = 128; pos < 188; pos++)
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                kvpool_seq_load(p, b, pos, l, h, kb, vb);
                for (int d = 0; d < 8; d++) bad += kb[d] != (float)(pos * 4 + l * 2 + h) + d * 0.5f || vb[d] != -kb[d];
            }
    CHECKF(bad == 0, "%d values wrong", bad);
    /* b ends at 188 + 10: its tail replaces a's (same block before it), a's block is free */
    kvpool_seq_keep_tail(p, b, 1, k0, tb + 128, 70);
    kvpool_seq_free(p, b);
    kvpool_get_stats(p, &st);
    CHECK(st.n_cached == 2 && st.n_free == 2 && st.n_tails_kept == 2);
    kvpool_seq *c = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, c, toks, 256) == 128);
    CHECK(kvpool_seq_copy_tail(p, c, toks + 128, 127, 16) == 60);   /* b's: differs at 188 */
    kvpool_seq_free(p, c);
    /* a full, keyed block as the tail: d computed 256 tokens; e shares its first 100 of block 1 */
    kvpool_seq *d = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, d, toks, 256) == 128);
    CHECK(kvpool_seq_reserve(p, d, 256) == KVPOOL_OK);
    store_named(p, d, 256);
    kvpool_seq_commit_full_blocks(p, d, toks, 256);
    kvpool_seq_keep_tail(p, d, 1, k0, toks + 128, 128);
    kvpool_seq_free(p, d);
    memcpy(tb, toks, sizeof tb);
    tb[228] = (tb[228] + 1) % 1000;
    kvpool_seq *e = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, e, tb, 300) == 128);   /* block 1 differs */
    CHECK(kvpool_seq_copy_tail(p, e, tb + 128, 127, 16) == 100);
    kvpool_seq_load(p, e, 227, 1, 1, kb, vb);
    CHECK(kb[3] == (float)(227 * 4 + 2 + 1) + 1.5f);
    kvpool_seq_free(p, e);
    /* pressure: all four blocks to another sequence, the tails among those reclaimed */
    kvpool_seq *f = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, f, 512) == KVPOOL_OK);
    kvpool_seq_free(p, f);
    c = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, c, toks, 256) == 0);
    CHECK(kvpool_seq_copy_tail(p, c, toks, 127, 16) == 0);
    kvpool_seq_free(p, c);
    kvpool_get_stats(p, &st);
    CHECK(st.n_free == 4 && st.n_cached == 0 && st.n_pinned == 0);
    kvpool_free(p);
}

/* Reclaim passes over a tail among the oldest cached blocks while a full one is there (a full
 * block comes back from the block store, a tail does not), takes it when only tails are left,
 * and never takes a pinned one. */
TEST(test_tail_reclaim_order)
{
    kvpool *p = mkpool(3, QTYPE_F32);
    int32_t toks[384];
    fill_tokens(toks, 384, 11);
    uint8_t zero[32] = { 0 };
    kvpool_seq *a = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 200) == KVPOOL_OK);
    kvpool_seq_commit_full_blocks(p, a, toks, 200);
    int full = kvpool_seq_block_id(a, 0), tail = kvpool_seq_block_id(a, 1);
    kvpool_seq_keep_tail(p, a, 1, kvpool_seq_last_key(a), toks + 128, 72);
    kvpool_seq_free(p, a);   /* the tail is released first: the least recent */
    kvpool_seq *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, b, 256) == KVPOOL_OK);   /* the free block, then one cached */
    CHECKF(kvpool_seq_block_id(b, 1) == full, "reclaimed %d, the full block is %d", kvpool_seq_block_id(b, 1), full);
    kvpool_seq *c = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, c, toks, 384) == 0);   /* the full block is gone */
    uint8_t k0[32];
    kvpool_block_key(p, zero, toks, k0);
    int pin = kvpool_tail_pin(p, k0, toks + 128, 100, 16);   /* its tail is still there */
    CHECK(pin == tail);
    CHECK(kvpool_seq_reserve(p, c, 128) == KVPOOL_ERR_FULL);   /* pinned: not reclaimed */
    kvpool_tail_unpin(p, pin);
    CHECK(kvpool_seq_reserve(p, c, 128) == KVPOOL_OK);   /* only a tail left: it goes */
    CHECK(kvpool_seq_block_id(c, 0) == tail);
    CHECK(kvpool_tail_pin(p, k0, toks + 128, 100, 16) < 0);
    kvpool_seq_free(p, b);
    kvpool_seq_free(p, c);
    kvpool_free(p);
}

/* Bytes the process holds from malloc (glibc; 0 where the allocator does not say, e.g. under
 * ASan: the check below then holds trivially). */
static size_t heap_bytes(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#else
    return 0;
#endif
}

/* Keeping a tail (on the step path: a request ends or is preempted) allocates nothing: its
 * token table comes with the pool. */
TEST(test_tail_keep_allocates_nothing)
{
    enum { NB = 1024 };   /* a tail table of 512 KiB, were it made on the first kept tail */
    kvpool *p = mkpool(NB, QTYPE_F32);
    int32_t toks[200];
    fill_tokens(toks, 200, 5);
    kvpool_seq *a = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 200) == KVPOOL_OK);
    kvpool_seq_commit_full_blocks(p, a, toks, 200);
    size_t before = heap_bytes();
    kvpool_seq_keep_tail(p, a, 1, kvpool_seq_last_key(a), toks + 128, 72);
    size_t after = heap_bytes();
    CHECKF(after < before + (size_t)NB * KVPOOL_BLOCK * sizeof(int32_t) / 2, "keeping a tail took %zu bytes",
           after - before);
    kvpool_stats st;
    kvpool_get_stats(p, &st);
    CHECK(st.n_tails_kept == 1);
    kvpool_seq_free(p, a);
    kvpool_free(p);
}

TEST(test_prefix_sharing)
{
    kvpool *p = mkpool(8, QTYPE_F16);
    int32_t toks[600];
    fill_tokens(toks, 600, 1);
    kvpool_seq *a = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, a, toks, 600) == 0);  /* empty cache */
    CHECK(kvpool_seq_reserve(p, a, 300) == KVPOOL_OK);
    kvpool_seq_commit_full_blocks(p, a, toks, 300);
    CHECK(kvpool_seq_n_keyed(a) == 256);
    int a0 = kvpool_seq_block_id(a, 0), a1 = kvpool_seq_block_id(a, 1);

    /* b shares both full blocks while a is alive */
    kvpool_seq *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, b, toks, 400) == 256);
    CHECK(kvpool_seq_block_id(b, 0) == a0 && kvpool_seq_block_id(b, 1) == a1);
    CHECK(kvpool_block_refcount(p, a0) == 2 && kvpool_block_refcount(p, a1) == 2);
    CHECK(!memcmp(kvpool_seq_last_key(a), kvpool_seq_last_key(b), 32));

    /* never the whole prompt: exactly 256 tokens attach only the first block */
    kvpool_seq *c = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, c, toks, 256) == 128);
    /* called again, it continues the chain with what is cached now */
    CHECK(kvpool_seq_attach_prefix(p, c, toks, 400) == 256);
    CHECK(kvpool_seq_block_id(c, 1) == a1 && kvpool_block_refcount(p, a1) == 3);
    kvpool_seq_free(p, c);

    /* a different second block: only the first is shared */
    int32_t t2[400];
    memcpy(t2, toks, sizeof t2);
    t2[200] ^= 1;
    kvpool_seq *d = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, d, t2, 400) == 128);
    kvpool_seq_free(p, d);
    /* same tokens in the second block but a different first block: no match (chaining) */
    int32_t t3[400];
    memcpy(t3, toks, sizeof t3);
    t3[5] ^= 1;
    kvpool_seq *e = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, e, t3, 400) == 0);
    kvpool_seq_free(p, e);

    kvpool_seq_free(p, a);
    CHECK(kvpool_block_refcount(p, a0) == 1);
    kvpool_seq_free(p, b);
    kvpool_stats st;
    kvpool_get_stats(p, &st);
    CHECK(st.n_cached == 2 && st.n_pinned == 0 && st.n_free == 6);
    /* cached blocks survive with no references and are found again */
    kvpool_seq *f = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, f, toks, 600) == 256);
    kvpool_get_stats(p, &st);
    CHECK(st.n_cached == 0 && st.n_pinned == 2);
    kvpool_seq_free(p, f);
    kvpool_free(p);
}

TEST(test_duplicate_commit)
{
    kvpool *p = mkpool(4, QTYPE_F16);
    int32_t toks[200];
    fill_tokens(toks, 200, 3);
    kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
    /* both compute the same prefix concurrently; the second commit keeps its block unkeyed */
    CHECK(kvpool_seq_reserve(p, a, 200) == KVPOOL_OK && kvpool_seq_reserve(p, b, 200) == KVPOOL_OK);
    kvpool_seq_commit_full_blocks(p, a, toks, 200);
    kvpool_seq_commit_full_blocks(p, b, toks, 200);
    CHECK(kvpool_seq_n_keyed(b) == 128);
    kvpool_seq_free(p, b);
    kvpool_stats st;
    kvpool_get_stats(p, &st);
    CHECK(st.n_cached == 0 && st.n_free == 2);  /* b's blocks were both unkeyed */
    kvpool_seq_free(p, a);
    kvpool_get_stats(p, &st);
    CHECK(st.n_cached == 1 && st.n_free == 3);
    kvpool_free(p);
}

/* A prefix computed in flight: b attaches each block of a's as soon as a commits it, and a
 * sequence with a block of its own being written attaches nothing more. */
TEST(test_attach_in_flight)
{
    kvpool *p = mkpool(8, QTYPE_F16);
    int32_t toks[500];
    fill_tokens(toks, 500, 7);
    kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, b, toks, 500) == 0);
    CHECK(kvpool_seq_reserve(p, a, 100) == KVPOOL_OK);   /* a: first chunk, block 0 partial */
    kvpool_seq_commit_full_blocks(p, a, toks, 100);
    CHECK(kvpool_seq_attach_prefix(p, b, toks, 500) == 0);
    CHECK(kvpool_seq_reserve(p, a, 200) == KVPOOL_OK);   /* block 0 complete */
    kvpool_seq_commit_full_blocks(p, a, toks, 200);
    CHECK(kvpool_seq_attach_prefix(p, b, toks, 500) == 128);
    CHECK(kvpool_seq_reserve(p, a, 300) == KVPOOL_OK);   /* block 1 complete */
    kvpool_seq_commit_full_blocks(p, a, toks, 300);
    CHECK(kvpool_seq_attach_prefix(p, b, toks, 500) == 256);
    CHECK(kvpool_seq_block_id(b, 1) == kvpool_seq_block_id(a, 1));
    /* b writes a block of its own: the chain ends there even when a completes it later */
    CHECK(kvpool_seq_reserve(p, b, 300) == KVPOOL_OK);
    CHECK(kvpool_seq_reserve(p, a, 400) == KVPOOL_OK);
    kvpool_seq_commit_full_blocks(p, a, toks, 400);
    CHECK(kvpool_seq_attach_prefix(p, b, toks, 500) == 256);
    CHECK(kvpool_seq_capacity(b) == 384);
    kvpool_seq_free(p, a);
    kvpool_seq_free(p, b);
    kvpool_free(p);
}

TEST(test_lru_reclaim)
{
    kvpool *p = mkpool(3, QTYPE_F16);
    int32_t t[3][200];
    for (int i = 0; i < 3; i++) fill_tokens(t[i], 200, 10 + i);
    /* three sequences each leave one cached block, released in order 0, 1, 2 */
    for (int i = 0; i < 3; i++) {
        kvpool_seq *s = kvpool_seq_new(p);
        CHECK(kvpool_seq_reserve(p, s, 128) == KVPOOL_OK);
        kvpool_seq_commit_full_blocks(p, s, t[i], 128);
        kvpool_seq_free(p, s);
    }
    kvpool_stats st;
    kvpool_get_stats(p, &st);
    CHECK(st.n_cached == 3 && st.n_free == 0);
    /* touch 0 (attach then release): order becomes 1 (oldest), 2, 0 */
    kvpool_seq *s = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, s, t[0], 200) == 128);
    kvpool_seq_free(p, s);
    /* one new block reclaims the least recently released: 1 */
    s = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, s, 1) == KVPOOL_OK);
    kvpool_get_stats(p, &st);
    CHECK(st.n_reclaimed == 1 && st.n_cached == 2);
    kvpool_seq *q = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, q, t[1], 200) == 0);
    CHECK(kvpool_seq_attach_prefix(p, q, t[2], 200) == 128);
    kvpool_seq_free(p, q);
    q = kvpool_seq_new(p);
    CHECK(kvpool_seq_attach_prefix(p, q, t[0], 200) == 128);
    /* pinned blocks are never reclaimed: s holds 1, q holds 1, one cached left (2) */
    kvpool_seq *r = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, r, 129) == KVPOOL_ERR_FULL);
    CHECK(kvpool_seq_reserve(p, r, 128) == KVPOOL_OK);
    CHECK(kvpool_seq_reserve(p, r, 129) == KVPOOL_ERR_FULL);
    kvpool_seq_free(p, r);
    kvpool_seq_free(p, q);
    kvpool_seq_free(p, s);
    kvpool_free(p);
}

TEST(test_key_chaining)
{
    kvpool *p = mkpool(2, QTYPE_F16);
    int32_t toks[256];
    fill_tokens(toks, 256, 5);
    uint8_t zero[32] = { 0 }, k0[32], k1[32], k1b[32];
    kvpool_block_key(p, zero, toks, k0);
    kvpool_block_key(p, k0, toks + 128, k1);
    kvpool_block_key(p, zero, toks + 128, k1b);
    CHECK(memcmp(k1, k1b, 32) != 0);  /* parent matters */
    kvpool_seq *s = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, s, 256) == KVPOOL_OK);
    kvpool_seq_commit_full_blocks(p, s, toks, 200);
    CHECK(!memcmp(kvpool_seq_last_key(s), k0, 32));
    kvpool_seq_commit_full_blocks(p, s, toks, 256);
    CHECK(!memcmp(kvpool_seq_last_key(s), k1, 32));
    kvpool_seq_free(p, s);
    /* the pool fingerprint (model + dtype) enters the key */
    kvpool *p2 = mkpool(2, QTYPE_F32);
    uint8_t k0b[32];
    kvpool_block_key(p2, zero, toks, k0b);
    CHECK(memcmp(k0, k0b, 32) != 0);
    kvpool_free(p2);
    kvpool_free(p);
}

typedef struct {
    int n_calls;
    int last_layer;
    int n_all;                  /* calls for every layer (layer < 0) */
} fill_log;

static void fill_hook(void *arg, int layer)
{
    fill_log *f = arg;
    f->n_calls++;
    f->last_layer = layer;
    if (layer < 0) f->n_all++;
}

TEST(test_async_fill)
{
    /* blocks filled asynchronously: keyed at once, waited for per layer, never reclaimed
     * before every fill is done */
    kvpool *p = mkpool(3, QTYPE_F16);
    fill_log log = { 0 };
    kvpool_set_fill_hook(p, fill_hook, &log);
    kvpool_fill_wait(p, 0);
    CHECK(log.n_calls == 0);            /* nothing pending: no wait */
    int32_t t[384];
    fill_tokens(t, 384, 5);
    uint8_t k0[32], k1[32], zero[32] = { 0 };
    kvpool_block_key(p, zero, t, k0);
    kvpool_block_key(p, k0, t + 128, k1);
    kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
    void *d0 = NULL, *d1 = NULL, *d2 = NULL;
    CHECK(kvpool_seq_append_fill(p, a, k0, &d0) == KVPOOL_OK && d0);
    CHECK(kvpool_seq_append_fill(p, a, k1, &d1) == KVPOOL_OK && d1 && d1 != d0);
    CHECK(kvpool_seq_block_key(p, a, 1) && !memcmp(kvpool_seq_block_key(p, a, 1), k1, 32));
    CHECK(kvpool_seq_block_key(p, a, 2) == NULL);
    CHECK(kvpool_seq_n_keyed(a) == 256 && kvpool_seq_slab(p, a, 0, 0, 0, 0) == d0);
    /* another sequence attaches the filling blocks (a hit); its reads wait like a's */
    CHECK(kvpool_seq_attach_prefix(p, b, t, 300) == 256);
    kvpool_fill_wait(p, 0);
    CHECK(log.n_calls == 1 && log.last_layer == 0);
    kvpool_fill_wait(p, 1);             /* the last layer: every fill is done */
    CHECK(log.n_calls == 2);
    kvpool_fill_wait(p, 0);
    CHECK(log.n_calls == 2);            /* nothing pending any more */
    /* released filling blocks are reclaimed only after a full wait */
    kvpool_seq_free(p, b);
    kvpool_seq_reset(p, a);
    uint8_t k2[32];
    kvpool_block_key(p, k1, t + 256, k2);
    kvpool_seq_free(p, a);
    a = kvpool_seq_new(p);
    CHECK(kvpool_seq_append_fill(p, a, k2, &d2) == KVPOOL_OK && d2);   /* the free block */
    CHECK(log.n_all == 0);
    kvpool_seq *c = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, c, 1) == KVPOOL_OK);   /* reclaims k1's or k0's block, not filling */
    CHECK(log.n_all == 0);
    kvpool_seq_free(p, a);              /* k2's block: cached, fill pending */
    CHECK(kvpool_seq_reserve(p, c, 129) == KVPOOL_OK);
    CHECK(kvpool_seq_reserve(p, c, 257) == KVPOOL_OK); /* the LRU victim is k2's: full wait first */
    CHECK(log.n_all == 1);
    kvpool_seq_free(p, c);
    kvpool_free(p);
}

/* ---- layers of their own row widths ---- */

/* Layer 0: K 8 / V 4; layer 1: K 16 / V 16 (head_dim); layer 2: a window layer, K 8 / V 12. */
static const int32_t mix_kw[3] = { 8, 0, 8 }, mix_vw[3] = { 4, 0, 12 }, mix_win[3] = { 0, 0, 16 };

static kvpool_opts mix_opts(int n_blocks)
{
    kvpool_opts o = { .n_layers = 3, .n_kv_heads = 2, .head_dim = 16, .dtype = QTYPE_F16, .n_blocks = n_blocks,
                      .layer_window = mix_win, .layer_width = mix_kw, .layer_v_width = mix_vw };
    for (int i = 0; i < 32; i++) o.model_fp[i] = (uint8_t)(i * 3);
    return o;
}

static float mix_val(int pos, int layer, int kv, int h, int i)
{
    return (float)((pos * 13 + layer * 101 + kv * 37 + h * 7 + i) % 2000 - 1000) / 8.0f;   /* exact in f16 */
}

/* The fixtures of layers of their own geometry (row widths here, kv heads below; rows of at
 * most 16): positions [from, to) of every layer, every kv head of it, written with mix_val. */
static void mix_write(const kvpool *p, const kvpool_seq *s, int from, int to)
{
    float k[16], v[16];
    for (int pos = from; pos < to; pos++)
        for (int l = 0; l < kvpool_n_layers(p); l++)
            for (int h = 0; h < kvpool_layer_kv_heads(p, l); h++) {
                for (int i = 0; i < 16; i++) k[i] = mix_val(pos, l, 0, h, i), v[i] = mix_val(pos, l, 1, h, i);
                kvpool_seq_store(p, s, pos, l, h, k, v);
            }
}

/* Positions [from, to) of the layers in `layers` (bit mask), every kv head of each, read back as
 * written; counts bad values. */
static int mix_check(const kvpool *p, const kvpool_seq *s, int from, int to, int layers)
{
    float k[16], v[16];
    int bad = 0;
    for (int pos = from; pos < to; pos++)
        for (int l = 0; l < kvpool_n_layers(p); l++) {
            if (!(layers >> l & 1)) continue;
            for (int h = 0; h < kvpool_layer_kv_heads(p, l); h++) {
                for (int i = 0; i < 16; i++) k[i] = v[i] = -9999.0f;
                kvpool_seq_load(p, s, pos, l, h, k, v);
                for (int i = 0; i < kvpool_layer_width(p, l, 0); i++) bad += k[i] != mix_val(pos, l, 0, h, i);
                for (int i = 0; i < kvpool_layer_width(p, l, 1); i++) bad += v[i] != mix_val(pos, l, 1, h, i);
                /* nothing past a row's width is read or written */
                for (int i = kvpool_layer_width(p, l, 1); i < 16; i++) bad += v[i] != -9999.0f;
            }
        }
    return bad;
}

/* The round trip of both fixtures, on two sequences of 256 positions (window layers of 16): a
 * written whole reads back from its blocks (the layers in block_layers, a bit mask) and its
 * rings (window_layers: the last 16 + spare positions); b gets a's block rows of [130, 200)
 * by copy_rows and its window state at 256 (the last 16 rows, each at its layer's geometry). */
static void mix_round_trip(const kvpool *p, kvpool_seq *a, kvpool_seq *b, int block_layers, int window_layers)
{
    mix_write(p, a, 0, 256);
    kvpool_seq_set_ring_next(a, 256);
    CHECK(mix_check(p, a, 0, 256, block_layers) == 0);
    CHECK(mix_check(p, a, 256 - 16 - KVPOOL_RING_SPARE, 256, window_layers) == 0);
    kvpool_seq_copy_rows(p, b, a, 130, 200);
    CHECK(mix_check(p, b, 130, 200, block_layers) == 0);
    uint8_t *st = malloc(kvpool_window_state_bytes(p));
    kvpool_seq_window_save(p, a, 256, st);
    CHECK(kvpool_seq_window_restore(p, b, 256, st, kvpool_window_state_bytes(p)));
    CHECK(mix_check(p, b, 240, 256, window_layers) == 0);
    free(st);
}

/* Each layer's slabs are exactly its own K and V rows: the block's bytes are the sum, the slabs
 * lie back to back, rows round-trip without touching their neighbours, copy_rows, the ring and
 * the window state follow each layer's widths. */
TEST(test_mixed_widths)
{
    kvpool_opts o = mix_opts(4);
    /* block layers: 0 (K 8 + V 4) and 1 (K 16 + V 16), 2 heads x 128 rows x f16 */
    const size_t l0 = 2 * 128 * (8 + 4) * 2, l1 = 2 * 128 * (16 + 16) * 2;
    CHECK(kvpool_geom_block_bytes(&o) == l0 + l1);
    kvpool *p = NULL;
    CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
    if (!p) return;
    CHECK(kvpool_block_bytes(p) == l0 + l1 && !kvpool_block_uniform(p) && kvpool_block_width_max(p) == 16);
    CHECK(kvpool_block_layer_offset(p, 0) == 0 && kvpool_block_layer_offset(p, 1) == l0 &&
          kvpool_block_layer_offset(p, 2) == l0 + l1);
    CHECK(kvpool_layer_width(p, 0, 0) == 8 && kvpool_layer_width(p, 0, 1) == 4 && kvpool_layer_width(p, 1, 1) == 16);
    CHECK(kvpool_layer_width(p, 2, 0) == 8 && kvpool_layer_width(p, 2, 1) == 12);
    /* ring: (16 + spare) slots x 2 heads x (8 + 12) f16; a state: 16 of them */
    CHECK(kvpool_ring_bytes(p) == (size_t)(16 + KVPOOL_RING_SPARE) * 2 * (8 + 12) * 2);
    CHECK(kvpool_window_state_bytes(p) == 16 + (size_t)16 * 2 * (8 + 12) * 2);   /* header + rows */
    kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 256) == KVPOOL_OK && kvpool_seq_reserve(p, b, 256) == KVPOOL_OK);
    uint8_t *base = kvpool_seq_slab(p, a, 1, 0, 0, 0);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 0, 0, 1) == base + 128 * 8 * 2);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 0, 1, 0) == base + 2 * 128 * 8 * 2);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 0, 1, 1) == base + 2 * 128 * 8 * 2 + 128 * 4 * 2);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 1, 0, 0) == base + l0);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 1, 1, 1) == base + l0 + 3 * 128 * 16 * 2);
    CHECK(kvpool_seq_slab(p, a, 1, 2, 0, 0) == NULL);   /* the window layer: in the ring */
    mix_round_trip(p, a, b, 3, 4);
    /* the same geometry gives the same digest; another split of the same bytes another one */
    kvpool *q = NULL;
    CHECK(kvpool_new(&o, &q) == KVPOOL_OK && q && kvpool_block_geom(q) == kvpool_block_geom(p));
    kvpool_free(q);
    int32_t kw2[3] = { 4, 0, 8 }, vw2[3] = { 8, 0, 12 };
    o.layer_width = kw2, o.layer_v_width = vw2;
    q = NULL;
    CHECK(kvpool_new(&o, &q) == KVPOOL_OK && q);
    if (q) CHECK(kvpool_block_bytes(q) == kvpool_block_bytes(p) && kvpool_block_geom(q) != kvpool_block_geom(p));
    kvpool_free(q);
    /* a width the dtype cannot hold is refused */
    o.dtype = QTYPE_Q8_0, o.head_dim = 32;
    q = (kvpool *)1;
    CHECK(kvpool_new(&o, &q) == KVPOOL_ERR_ARG && q == NULL && kvpool_geom_block_bytes(&o) == 0);
    /* a uniform pool says so */
    kvpool *u = mkpool(2, QTYPE_F16);
    CHECK(u && kvpool_block_uniform(u) && kvpool_layer_width(u, 1, 1) == 8);
    kvpool_free(u);
    kvpool_seq_free(p, a);
    kvpool_seq_free(p, b);
    kvpool_free(p);
}

/* ---- rings of their own lengths, compact window states ---- */

/* A v_is_k pool of 2 heads of 16 (F16 blocks, F32 rings): layer 0 a window layer (16) with a raw
 * ring of 12 slots of which a state keeps the last 8 rows in F16, and an aux ring of 24 columns,
 * 9 slots, of which a state keeps 3 rows' first 10 columns; layer 1 a window layer of the
 * defaults; layer 2 a full layer. */
static int32_t rp_win[3] = { 16, 16, 0 }, rp_aux[3] = { 24, 0, 0 }, rp_slots[6] = { 12, 9, 0, 0, 0, 0 },
               rp_rows[6] = { 8, 3, 16, 0, 0, 0 }, rp_cols[6] = { 0, 10, 0, 0, 0, 0 };

static kvpool_opts rp_opts(void)
{
    kvpool_opts o = { .n_layers = 3, .n_kv_heads = 2, .head_dim = 16, .v_is_k = true, .dtype = QTYPE_F16,
                      .n_blocks = 4, .layer_window = rp_win, .ring_f32 = true, .ring_aux_width = rp_aux,
                      .ring_slots = rp_slots, .state_rows = rp_rows, .state_cols = rp_cols, .state_k_dtype = true };
    for (int i = 0; i < 32; i++) o.model_fp[i] = (uint8_t)i;
    return o;
}

/* position pos's value i of (layer, kv, head): F16-exact */
static float rp_val(int pos, int l, int kv, int h, int i) { return (float)((pos * 11 + l * 53 + kv * 29 + h * 5 + i) % 1500) / 4.0f; }

static void rp_write(const kvpool *p, kvpool_seq *s, int from, int to)
{
    for (int pos = from; pos < to; pos++)
        for (int l = 0; l < 2; l++)
            for (int kv = 0; kv < (l == 0 ? 2 : 1); kv++)   /* layer 1's V is its K */
                for (int h = 0; h < 2; h++) {
                    float *r = kvpool_seq_ring_row(p, s, l, kv, h, pos);
                    for (int i = 0; i < kvpool_layer_width(p, l, kv); i++) r[i] = rp_val(pos, l, kv, h, i);
                }
    kvpool_seq_set_ring_next(s, to);
}

/* Rows [from, to) of (l, kv), the first n values of each, as written; counts bad values. */
static int rp_check(const kvpool *p, const kvpool_seq *s, int l, int kv, int from, int to, int n)
{
    int bad = 0;
    for (int pos = from; pos < to; pos++)
        for (int h = 0; h < 2; h++) {
            const float *r = kvpool_seq_ring_row(p, s, l, kv, h, pos);
            for (int i = 0; i < n; i++) bad += r[i] != rp_val(pos, l, kv, h, i);
        }
    return bad;
}

TEST(test_ring_parts)
{
    kvpool_opts o = rp_opts();
    kvpool *p = NULL;
    CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
    if (!p) return;
    CHECK(kvpool_n_window_layers(p) == 2 && kvpool_n_block_layers(p) == 1);
    CHECK(kvpool_layer_width(p, 0, 0) == 16 && kvpool_layer_width(p, 0, 1) == 24 && kvpool_layer_width(p, 1, 1) == 16);
    CHECK(kvpool_ring_slots(p, 0, 0) == 12 && kvpool_ring_slots(p, 0, 1) == 9 && kvpool_ring_slots(p, 1, 0) == 22 &&
          kvpool_ring_slots(p, 2, 0) == 0);
    /* rings: layer 0 2 x 12 x 16 + 2 x 9 x 24, layer 1 2 x 22 x 16 (its V is K), F32 */
    CHECK(kvpool_ring_bytes(p) == (size_t)(2 * 12 * 16 + 2 * 9 * 24 + 2 * 22 * 16) * 4);
    /* a state: header, 2 x 8 raw rows of 16 in F16, 2 x 3 x 10 in F32, 2 x 16 x 16 in F16 */
    CHECK(kvpool_window_state_bytes(p) == 16 + 2 * 8 * 16 * 2 + 2 * 3 * 10 * 4 + 2 * 16 * 16 * 2);
    kvpool_wstate_part sp;
    uint8_t *st = malloc(kvpool_window_state_bytes(p));
    CHECK((uint8_t *)kvpool_window_state_rows(p, st, 0, 1, 1, &sp) == st + 16 + 2 * 8 * 16 * 2 + 3 * 10 * 4);
    CHECK(sp.n_rows == 3 && sp.n_cols == 10 && sp.type == QTYPE_F32 && sp.row_bytes == 40);
    kvpool_window_state_rows(p, st, 1, 1, 0, &sp);
    CHECK(sp.n_rows == 0);   /* V is K: not kept twice */

    kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 256) == KVPOOL_OK && kvpool_seq_reserve(p, b, 256) == KVPOOL_OK);
    /* the parts wrap at their own lengths and do not overwrite each other */
    rp_write(p, a, 0, 100);
    CHECK(rp_check(p, a, 0, 0, 88, 100, 16) == 0 && rp_check(p, a, 0, 1, 91, 100, 24) == 0 &&
          rp_check(p, a, 1, 0, 78, 100, 16) == 0);
    CHECK(rp_check(p, a, 0, 0, 87, 88, 16) > 0);   /* 12 slots: position 87 is gone */
    CHECK(kvpool_seq_ring_row(p, a, 1, 1, 1, 50) == kvpool_seq_ring_row(p, a, 1, 0, 1, 50));   /* V is K */
    CHECK(kvpool_seq_ring_row(p, a, 0, 1, 0, 50) != kvpool_seq_ring_row(p, a, 0, 0, 0, 50));
    /* the state at 100 restores the kept rows (raw through F16, the aux rows' leading columns) */
    kvpool_seq_window_save(p, a, 100, st);
    CHECK(kvpool_seq_window_restore(p, b, 100, st, kvpool_window_state_bytes(p)));
    CHECK(rp_check(p, b, 0, 0, 92, 100, 16) == 0 && rp_check(p, b, 0, 1, 97, 100, 10) == 0 &&
          rp_check(p, b, 1, 0, 84, 100, 16) == 0);
    CHECK(rp_check(p, b, 0, 0, 91, 92, 16) > 0 && rp_check(p, b, 0, 1, 97, 98, 24) > 0);   /* not kept */
    CHECK(kvpool_seq_ring_next(b) == 100 && kvpool_seq_full_from(b) == 100 && kvpool_seq_win_lo(b) == 84);

    /* a state of another geometry of the same size is refused, the sequence unchanged */
    kvpool_opts o2 = rp_opts();
    int32_t rows2[6] = { 8, 5, 16, 0, 0, 0 }, cols2[6] = { 0, 6, 0, 0, 0, 0 };
    o2.state_rows = rows2, o2.state_cols = cols2;
    kvpool *q = NULL;
    CHECK(kvpool_new(&o2, &q) == KVPOOL_OK && q);
    if (q) {
        CHECK(kvpool_window_state_bytes(q) == kvpool_window_state_bytes(p));
        CHECK(kvpool_window_state_geom(q) != kvpool_window_state_geom(p));
        kvpool_seq *c = kvpool_seq_new(q);
        CHECK(kvpool_seq_reserve(q, c, 256) == KVPOOL_OK);
        CHECK(!kvpool_seq_window_restore(q, c, 100, st, kvpool_window_state_bytes(q)));
        CHECK(kvpool_seq_ring_next(c) == 0 && kvpool_seq_full_from(c) == 0);
        kvpool_seq_free(q, c);
        kvpool_free(q);
    }
    /* nor is a state without the header (an older layout), or of another size */
    uint8_t *old = calloc(1, kvpool_window_state_bytes(p));
    memcpy(old, st + 16, kvpool_window_state_bytes(p) - 16);
    CHECK(!kvpool_window_state_ok(p, old, kvpool_window_state_bytes(p)));
    CHECK(!kvpool_window_state_ok(p, st, kvpool_window_state_bytes(p) - 16));
    CHECK(kvpool_window_state_ok(p, st, kvpool_window_state_bytes(p)));
    free(old);
    free(st);
    kvpool_seq_free(p, a);
    kvpool_seq_free(p, b);
    kvpool_free(p);

    /* bad geometries: a state of more rows than its ring keeps or than the window; an aux ring
     * outside a v_is_k pool; a state converting from a ring that is not F32 */
    int32_t bad_rows[6] = { 13, 3, 16, 0, 0, 0 };
    o = rp_opts(), o.state_rows = bad_rows;
    q = (kvpool *)1;
    CHECK(kvpool_new(&o, &q) == KVPOOL_ERR_ARG && q == NULL);
    int32_t bad_rows2[6] = { 8, 3, 17, 0, 0, 0 };
    o = rp_opts(), o.state_rows = bad_rows2;
    CHECK(kvpool_new(&o, &q) == KVPOOL_ERR_ARG);
    o = rp_opts(), o.v_is_k = false;
    CHECK(kvpool_new(&o, &q) == KVPOOL_ERR_ARG);
    o = rp_opts(), o.ring_f32 = false, o.dtype = QTYPE_Q8_0, o.head_dim = 32;
    CHECK(kvpool_new(&o, &q) == KVPOOL_ERR_ARG);
}

/* A pool of layers of their own widths writes its blocks to the store and a pool of the same
 * geometry loads them back, row for row; a pool of another geometry with the same block bytes
 * and the same model refuses them (the header's geometry digest) and loads nothing. */
static int mix_load(const char *spec, kvpool_opts o, const int32_t *toks, int write_from, bool *rows_ok)
{
    model m;
    memset(&m, 0, sizeof m);
    memcpy(m.fingerprint, o.model_fp, 32);
    kvpool *p = NULL;
    store *st = NULL;
    CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
    CHECK(store_open(spec, NULL, &st) == STORE_OK);
    if (!p || !st) return -1;
    blockio *bio = blockio_new(st, p, &m, NULL);
    CHECK(bio != NULL);
    int got = -1;
    kvpool_seq *s = kvpool_seq_new(p);
    if (write_from >= 0) {   /* compute and commit 2 blocks: the keyed hook writes them */
        CHECK(kvpool_seq_reserve(p, s, 256) == KVPOOL_OK);
        mix_write(p, s, 0, 256);
        kvpool_seq_commit_full_blocks(p, s, toks, 256);
        CHECK(blockio_flush(bio, 10000) == 0);
        got = 0;
    } else {
        blockio_load *l = blockio_load_start(bio, NULL, toks, 300);
        CHECK(l != NULL);
        for (int i = 0; l && i < 1000 && !blockio_load_ready(bio, l); i++) usleep(10000);
        got = l ? blockio_load_finish(bio, l, s) : -1;
        kvpool_fill_wait(p, -1);
        if (got > 0) *rows_ok = mix_check(p, s, 0, got, 3) == 0;
    }
    kvpool_seq_free(p, s);
    blockio_free(bio);
    store_close(st);
    kvpool_free(p);
    return got;
}

TEST(test_mixed_widths_store_round_trip)
{
    char dir[64], spec[96];
    storetest_tmpdir(dir, sizeof dir, "kvmix");
    snprintf(spec, sizeof spec, "dir:%s", dir);
    int32_t toks[300];
    fill_tokens(toks, 300, 5);
    kvpool_opts o = mix_opts(4);
    bool rows_ok = false;
    CHECK(mix_load(spec, o, toks, 0, &rows_ok) == 0);
    CHECK(mix_load(spec, o, toks, -1, &rows_ok) == 256 && rows_ok);
    /* same bytes per block, same model, the widths split otherwise: nothing loaded */
    int32_t kw2[3] = { 4, 0, 8 }, vw2[3] = { 8, 0, 12 };
    o.layer_width = kw2, o.layer_v_width = vw2;
    kvpool_opts o1 = mix_opts(4);
    CHECK(kvpool_geom_block_bytes(&o) == kvpool_geom_block_bytes(&o1));
    rows_ok = false;
    CHECK(mix_load(spec, o, toks, -1, &rows_ok) == 0);
    storetest_rmrf(dir);
}

/* ---- layers of their own kv heads (Gemma 4) ---- */

/* Layer 0: window, 4 kv heads of 8; layer 1: full, 1 of 16; layer 2: window, 2 of 16; layer 3:
 * full, 2 of 16. n_kv_heads 4 and head_dim 16 are the most and the widest. */
static const int32_t kvh_win[4] = { 16, 0, 16, 0 }, kvh_w[4] = { 8, 16, 16, 16 }, kvh_n[4] = { 4, 1, 2, 2 };

static kvpool_opts kvh_opts(int n_blocks, const int32_t *heads)
{
    kvpool_opts o = { .n_layers = 4, .n_kv_heads = 4, .head_dim = 16, .dtype = QTYPE_F16, .n_blocks = n_blocks,
                      .layer_window = kvh_win, .layer_width = kvh_w, .layer_kv_heads = heads };
    for (int i = 0; i < 32; i++) o.model_fp[i] = (uint8_t)(i * 5);
    return o;
}

/* Each layer's slabs are its own kv heads x its own rows: the block's bytes are their sum, a
 * layer's heads lie back to back, every head of every layer round-trips without touching
 * another's, copy_rows, the rings and the window state take each layer's heads, and the
 * digest tells two splits of the same bytes apart. */
TEST(test_layer_kv_heads)
{
    kvpool_opts o = kvh_opts(4, kvh_n);
    /* block layers: 1 (1 head) and 3 (2 heads), K and V of 16, 128 rows of f16 */
    const size_t l1 = 1 * 128 * 32 * 2, l3 = 2 * 128 * 32 * 2;
    CHECK(kvpool_geom_block_bytes(&o) == l1 + l3);
    kvpool *p = NULL;
    CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
    if (!p) return;
    CHECK(kvpool_block_bytes(p) == l1 + l3 && !kvpool_block_uniform(p));
    CHECK(kvpool_layer_kv_heads(p, 0) == 4 && kvpool_layer_kv_heads(p, 1) == 1 && kvpool_layer_kv_heads(p, 2) == 2 &&
          kvpool_layer_kv_heads(p, 3) == 2);
    CHECK(kvpool_block_layer_offset(p, 1) == l1 && kvpool_block_layer_offset(p, 2) == l1 + l3);
    /* rings: (16 + spare) slots x (4 heads x (8 + 8) + 2 heads x (16 + 16)) f16; a state: 16 of them */
    const size_t per_pos = (4 * 16 + 2 * 32) * 2;
    CHECK(kvpool_ring_bytes(p) == (size_t)(16 + KVPOOL_RING_SPARE) * per_pos);
    CHECK(kvpool_window_state_bytes(p) == 16 + 16 * per_pos);   /* the header, then the rows */
    {
        uint8_t *st0 = malloc(kvpool_window_state_bytes(p));
        uint8_t *k0 = kvpool_window_state_rows(p, st0, 0, 0, 0, NULL), *k2 = kvpool_window_state_rows(p, st0, 2, 0, 0, NULL);
        uint8_t *k2h1 = kvpool_window_state_rows(p, st0, 2, 0, 1, NULL);
        CHECK(k0 - st0 == 16 && k2 - st0 == 16 + (ptrdiff_t)16 * 4 * 16 * 2);   /* layer 0: 4 heads of K and V */
        CHECK(k2h1 - k2 == (ptrdiff_t)16 * 16 * 2);
        free(st0);
    }
    kvpool_seq *a = kvpool_seq_new(p), *b = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, a, 256) == KVPOOL_OK && kvpool_seq_reserve(p, b, 256) == KVPOOL_OK);
    uint8_t *base = kvpool_seq_slab(p, a, 1, 1, 0, 0);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 1, 1, 0) == base + 128 * 16 * 2);   /* layer 1's one head: then V */
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 3, 0, 0) == base + l1);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 3, 0, 1) == base + l1 + 128 * 16 * 2);
    CHECK((uint8_t *)kvpool_seq_slab(p, a, 1, 3, 1, 0) == base + l1 + 2 * 128 * 16 * 2);
    mix_round_trip(p, a, b, 0xa, 0x5);
    /* the same bytes per block with layers 1 and 3's heads swapped: another digest */
    const int32_t swapped[4] = { 4, 2, 2, 1 };
    kvpool_opts o2 = kvh_opts(4, swapped);
    kvpool *q = NULL;
    CHECK(kvpool_new(&o2, &q) == KVPOOL_OK && q);
    if (q) CHECK(kvpool_block_bytes(q) == kvpool_block_bytes(p) && kvpool_block_geom(q) != kvpool_block_geom(p));
    kvpool_free(q);
    kvpool_seq_free(p, a);
    kvpool_seq_free(p, b);
    kvpool_free(p);
}

int main(void)
{
    RUN(test_bad_args);
    RUN(test_reserve_and_exhaustion);
    RUN(test_prefault_zeroes_every_block);
    RUN(test_slab_layout);
    RUN(test_v_is_k_layout);
    RUN(test_copy_rows);
    RUN(test_tail_rows);
    RUN(test_tail_reclaim_order);
    RUN(test_tail_keep_allocates_nothing);
    RUN(test_prefix_sharing);
    RUN(test_duplicate_commit);
    RUN(test_attach_in_flight);
    RUN(test_lru_reclaim);
    RUN(test_key_chaining);
    RUN(test_async_fill);
    RUN(test_mixed_widths);
    RUN(test_mixed_widths_store_round_trip);
    RUN(test_ring_parts);
    RUN(test_layer_kv_heads);
    HARNESS_END();
}
