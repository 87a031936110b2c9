/*
 * test_blockio: the block store behind the scheduler, on a tiny random llama model. Every
 * "server" is a fresh engine + scheduler (empty RAM tier) over a shared store, so hits come
 * from the store as after a restart. Checked: greedy outputs with the cache on are identical
 * to the cache off, token for token, for multi-turn conversations whose turns share prefixes
 * of lengths around multiples of 128; the hits are reported as cached tokens; two servers
 * alive at once share one dir: store; corrupted dir: blocks are detected and recomputed;
 * ec:10+2 loses nothing with 2 fragments of every block gone or corrupt and recomputes with 3;
 * the bounded flush at exit (all written, or a stuck store's queue given up).
 * Exact comparisons hold at any step size (the engine is batch invariant, see test_sched.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "schedtest.h"
#include "storetest.h"

#include "cache/store.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"

static char tmpdir[] = "/tmp/tm-blockio-XXXXXX";
static model *g_model;

typedef schedtest_stack server;

static int g_kv_blocks = 24;   /* KV pool of the next servers */
static const store_opts *g_store_opts;   /* store options of the next servers (NULL: defaults) */
static int g_read_bufs;                  /* blockio read buffers of the next servers (0: default) */
static bool g_no_map;                    /* the next servers read blocks into buffers, never map */

static server server_new(const char *spec)
{
    schedtest_stack_opts o = { .spec = spec, .n_kv_blocks = g_kv_blocks, .n_ctx = 2048,
                               .bio = { .n_read_bufs = g_read_bufs, .no_map = g_no_map } };
    if (g_store_opts) o.store = *g_store_opts;
    server v = schedtest_stack_new(g_model, &o);
    CHECK(v.s != NULL);
    if (spec) CHECK(v.bio != NULL);
    return v;
}

/* A dir: store under the test's directory: its path in dir, its spec ("dir:PATH") in spec. */
static void dir_store(const char *name, char *dir, size_t dn, char *spec, size_t sn)
{
    snprintf(dir, dn, "%s/%s", tmpdir, name);
    snprintf(spec, sn, "dir:%s", dir);
}

static const char *g_salt;   /* cache_salt of the next requests */

/* Greedy generation of n_gen tokens after prompt; returns cached tokens (-1 on failure). */
static int run(server *v, const int32_t *prompt, int n, int n_gen, int32_t *out)
{
    sched_params p = { .prompt = prompt, .n_prompt = n, .max_tokens = n_gen, .cache_salt = g_salt };
    p.sample = sample_params_default();
    p.sample.temp = 0;
    sched_output fin = { .kind = SCHED_OUT_TOKEN };
    int k = schedtest_run(v->s, &p, out, n_gen, &fin);
    return k == n_gen && fin.kind == SCHED_OUT_FINISH ? fin.usage.cached_tokens : -1;
}

/* One request on a fresh server with the given store; returns cached tokens, output in out. */
static int once(const char *spec, const int32_t *prompt, int n, int n_gen, int32_t *out)
{
    server v = server_new(spec);
    int c = run(&v, prompt, n, n_gen, out);
    schedtest_stack_free(&v);
    return c;
}

TEST(test_multi_turn_identical_cache_on_off)
{
    char dir[128], spec[160];
    dir_store("turns", dir, sizeof dir, spec, sizeof spec);
    const int lens[] = { 100, 127, 128, 129, 255, 256, 257, 384, 385 };
    for (size_t li = 0; li < TM_ARRAY_LEN(lens); li++) {
        int32_t conv[1024];
        int n = lens[li];
        schedtest_prompt(conv, n, (int)li + 3);
        int stored = 0;   /* positions whose KV earlier turns computed (and stored) */
        for (int turn = 0; turn < 3; turn++) {
            int32_t on[8], off[8];
            int c_on = once(spec, conv, n, 8, on);
            int c_off = once(NULL, conv, n, 8, off);
            CHECKF(c_on >= 0 && c_off == 0 && !memcmp(on, off, sizeof on), "len %d turn %d", lens[li], turn);
            int want = TM_MIN(stored / 128, (n - 1) / 128) * 128;
            CHECKF(c_on == want, "len %d turn %d: cached %d, want %d", lens[li], turn, c_on, want);
            /* the answer and a new user message of 50 tokens make the next turn's prompt */
            stored = n + 8 - 1;
            memcpy(conv + n, on, sizeof on);
            n += 8;
            schedtest_prompt(conv + n, 50, 100 + turn);
            n += 50;
        }
    }
}

TEST(test_two_servers_share_a_dir_store)
{
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/shared", tmpdir);
    server a = server_new(spec), b = server_new(spec);
    int32_t prompt[300], oa[4], ob[4];
    schedtest_prompt(prompt, 300, 9);
    CHECK(run(&a, prompt, 300, 4, oa) == 0);
    blockio_stats st;
    WAIT_UNTIL((blockio_get_stats(a.bio, &st),   /* write-behind is asynchronous */
                st.n_written + st.n_write_failed == st.n_write_queued && st.n_write_queued >= 2),
               30);
    CHECK(st.n_written == 2 && st.n_write_dropped == 0);
    CHECK(run(&b, prompt, 300, 4, ob) == 256);
    CHECK(!memcmp(oa, ob, sizeof oa));
    blockio_get_stats(b.bio, &st);
    CHECK(st.n_loads == 1 && st.n_appended == 2);
    schedtest_stack_free(&a);
    schedtest_stack_free(&b);
}

TEST(test_corrupt_dir_blocks_are_recomputed)
{
    char dir[128], spec[160], cmd[400];
    dir_store("corrupt", dir, sizeof dir, spec, sizeof spec);
    int32_t prompt[400], ref[6], out[6];
    schedtest_prompt(prompt, 400, 11);
    CHECK(once(spec, prompt, 400, 6, ref) == 0);
    /* flip a byte near the end of every block file */
    snprintf(cmd, sizeof cmd, "for f in $(find '%s' -name '*.blk'); do printf '\\x42' | dd of=$f bs=1 seek=5000 conv=notrunc status=none; done", dir);
    CHECK(system(cmd) == 0);
    CHECK(once(spec, prompt, 400, 6, out) == 0);   /* every block corrupt: all recomputed */
    CHECK(!memcmp(ref, out, sizeof ref));
    CHECK(once(spec, prompt, 400, 6, out) == 384);  /* and written again */
    CHECK(!memcmp(ref, out, sizeof ref));
}

/* Deletes (or corrupts) fragments idx[0..n) of every block of prompt's chain in the ec store. */
static void ec_damage(const char *base, const int32_t *prompt, int n_blocks, const int *idx, int n, bool corrupt)
{
    uint8_t fp[32], root[32] = { 0 }, keys[8][32];
    blockkey_pool_fp(g_model->fingerprint, QTYPE_F16, fp);
    blockkey_chain(root, prompt, n_blocks, fp, keys);
    for (int b = 0; b < n_blocks; b++) {
        char hex[BLOCKKEY_HEX], path[400];
        blockkey_hex(keys[b], hex);
        for (int j = 0; j < n; j++) {
            int t = (idx[j] + keys[b][31]) % 12;
            snprintf(path, sizeof path, "%s/t%d/%.2s/%.2s/%s.frg", base, t, hex, hex + 2, hex);
            if (corrupt) CHECK(storetest_flip(path, -9) == 0);
            else CHECK(unlink(path) == 0);
        }
    }
}

TEST(test_ec_10_2_fragments_lost)
{
    char base[128], spec[2048];
    snprintf(base, sizeof base, "%s/ec", tmpdir);
    int n = snprintf(spec, sizeof spec, "ec:10+2:");
    for (int i = 0; i < 12; i++) n += snprintf(spec + n, sizeof spec - (size_t)n, "%s%s/t%d", i ? "," : "", base, i);
    int32_t prompt[400], ref[6], out[6];
    schedtest_prompt(prompt, 400, 13);
    CHECK(once(NULL, prompt, 400, 6, ref) == 0);
    CHECK(once(spec, prompt, 400, 6, out) == 0);
    CHECK(!memcmp(ref, out, sizeof ref));
    int two[2] = { 0, 7 }, two_b[2] = { 3, 11 }, three[3] = { 1, 5, 10 };
    ec_damage(base, prompt, 3, two, 2, false);          /* 2 deleted: still every block */
    CHECK(once(spec, prompt, 400, 6, out) == 384);
    CHECK(!memcmp(ref, out, sizeof ref));
    /* the put after the hit does not happen (loaded blocks are not rewritten): repair by hand */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    CHECK(system(cmd) == 0);
    CHECK(once(spec, prompt, 400, 6, out) == 0);
    ec_damage(base, prompt, 3, two_b, 2, true);         /* 2 corrupt: still every block */
    CHECK(once(spec, prompt, 400, 6, out) == 384);
    CHECK(!memcmp(ref, out, sizeof ref));
    CHECK(system(cmd) == 0);
    CHECK(once(spec, prompt, 400, 6, out) == 0);
    ec_damage(base, prompt, 3, three, 3, false);        /* 3 gone: a miss, recomputed */
    CHECK(once(spec, prompt, 400, 6, out) == 0);
    CHECK(!memcmp(ref, out, sizeof ref));
}

TEST(test_salt_keeps_tenants_apart)
{
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/salt", tmpdir);
    int32_t prompt[300], ref[4], out[4];
    schedtest_prompt(prompt, 300, 17);
    g_salt = "tenant-a";
    CHECK(once(spec, prompt, 300, 4, ref) == 0);
    CHECK(once(spec, prompt, 300, 4, out) == 256);      /* same tenant: store hit */
    CHECK(!memcmp(ref, out, sizeof ref));
    g_salt = "tenant-b";
    CHECK(once(spec, prompt, 300, 4, out) == 0);        /* other tenant: no hit */
    CHECK(!memcmp(ref, out, sizeof ref));
    g_salt = NULL;
    CHECK(once(spec, prompt, 300, 4, out) == 0);        /* no salt: no hit either */
    /* the RAM tier too: one server, two tenants */
    server v = server_new(NULL);
    g_salt = "tenant-c";
    CHECK(run(&v, prompt, 300, 4, out) == 0);
    CHECK(run(&v, prompt, 300, 4, out) == 299);   /* 2 blocks, and the rows kept after them */
    g_salt = "tenant-d";
    CHECK(run(&v, prompt, 300, 4, out) == 0);
    g_salt = NULL;
    schedtest_stack_free(&v);
}

/* Drains r to FINISH: tokens into out (n_gen), returns cached tokens or -1. */
static int drain(sched_req *r, int n_gen, int32_t *out)
{
    sched_output o[16];
    int k = 0, cached = -1;
    while (!sched_done(r)) {
        int m = sched_poll(r, o, 16, 10000);
        if (m == 0) break;
        for (int i = 0; i < m; i++) {
            if (o[i].kind == SCHED_OUT_TOKEN && k < n_gen) out[k++] = o[i].token;
            if (o[i].kind == SCHED_OUT_FINISH) cached = o[i].usage.cached_tokens;
        }
    }
    sched_release(r);
    return k == n_gen ? cached : -1;
}

TEST(test_load_waits_for_kv_space)
{
    /* b's prefix is in the store; while a holds most of a small pool, b waits with its
     * blocks loaded in blockio and gets them once a finishes */
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/kvwait", tmpdir);
    int32_t pa[400], pb[400], ra[6], rb[6], oa[6], ob[6];
    schedtest_prompt(pa, 400, 21);
    schedtest_prompt(pb, 400, 22);
    CHECK(once(NULL, pa, 400, 6, ra) == 0);
    CHECK(once(spec, pb, 400, 6, rb) == 0);   /* stores b's 3 full blocks */
    g_kv_blocks = 6;
    server v = server_new(spec);
    sched_params p1 = { .prompt = pa, .n_prompt = 400, .max_tokens = 6 }, p2 = p1;
    p1.sample = sample_params_default();
    p1.sample.temp = 0;
    p2 = p1;
    p2.prompt = pb;
    sched_req *a, *b;
    CHECK(sched_submit(v.s, &p1, &a) == SCHED_OK);
    CHECK(sched_submit(v.s, &p2, &b) == SCHED_OK);
    CHECK(drain(a, 6, oa) == 0);
    CHECK(drain(b, 6, ob) == 384);
    CHECK(!memcmp(oa, ra, sizeof ra) && !memcmp(ob, rb, sizeof rb));
    schedtest_stack_free(&v);
    g_kv_blocks = 24;
}

TEST(test_inplace_blocks_let_go_on_reuse)
{
    /* mapped store blocks are used by the pool in place; when the pool reuses those blocks for
     * other contents it lets go of the mappings (ASan: nothing leaks, nothing is unmapped
     * twice), and loading them again gives the same output */
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/inplace", tmpdir);
    int32_t pa[520], pb[400], ra[6], rb[6], o1[6], o2[6], o3[6];
    schedtest_prompt(pa, 520, 41);
    schedtest_prompt(pb, 400, 42);
    CHECK(once(NULL, pa, 520, 6, ra) == 0);
    CHECK(once(spec, pb, 400, 6, rb) == 0);   /* stores b's 3 full blocks */
    g_kv_blocks = 6;
    server v = server_new(spec);
    CHECK(run(&v, pb, 400, 6, o1) == 384);
    blockio_stats st;
    blockio_get_stats(v.bio, &st);
    uint64_t inplace = st.n_inplace, loaded = st.n_load_blocks;
    CHECKF(inplace == (store_mappable(v.st) ? 3u : 0u) && inplace + st.n_fills == 3, "in place %llu fills %llu",
           (unsigned long long)inplace, (unsigned long long)st.n_fills);
    CHECK(run(&v, pa, 520, 6, o2) == 0);       /* 5 blocks: reuses b's cached ones */
    CHECK(run(&v, pb, 400, 6, o3) == 384);     /* loaded from the store again */
    blockio_get_stats(v.bio, &st);
    CHECK(st.n_load_blocks > loaded);
    CHECK(!memcmp(o1, rb, sizeof rb) && !memcmp(o2, ra, sizeof ra) && !memcmp(o3, rb, sizeof rb));
    schedtest_stack_free(&v);
    g_kv_blocks = 24;
}

TEST(test_concurrent_loads_read_each_block_once)
{
    /* two requests with the same 1,000-token prefix (7 full blocks in the store), different
     * suffixes: the second load waits for / shares the first one's blocks */
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/share", tmpdir);
    int32_t pa[1100], pb[1100], ra[6], rb[6], out[6];
    schedtest_prompt(pa, 1100, 31);
    memcpy(pb, pa, sizeof pb);
    schedtest_prompt(pb + 1000, 100, 32);
    CHECK(once(spec, pa, 1000, 6, out) == 0);   /* stores the prefix's 7 blocks */
    CHECK(once(NULL, pa, 1100, 6, ra) == 0);
    CHECK(once(NULL, pb, 1100, 6, rb) == 0);

    /* blockio alone: both loads queued before either is finished */
    server v = server_new(spec);
    blockio_load *la = blockio_load_start(v.bio, NULL, pa, 1100);
    blockio_load *lb = blockio_load_start(v.bio, NULL, pb, 1100);
    CHECK(la && lb);
    CHECK(WAIT_UNTIL(blockio_load_ready(v.bio, la) && blockio_load_ready(v.bio, lb), 30));
    blockio_stats st;
    blockio_get_stats(v.bio, &st);
    CHECKF(st.n_load_blocks == 7 && st.n_load_shared == 7, "read %llu shared %llu",
           (unsigned long long)st.n_load_blocks, (unsigned long long)st.n_load_shared);
    store_stats ss;
    store_get_stats(v.st, &ss);
    CHECKF(ss.n_hit == 7, "store hits %llu", (unsigned long long)ss.n_hit);   /* each block read once */
    /* both sequences get all 7 blocks: a's go into the pool (used in place when the store
     * maps its files, else filled), b attaches them */
    kvpool *pool = engine_kvpool(v.e);
    kvpool_seq *sa = kvpool_seq_new(pool), *sb = kvpool_seq_new(pool);
    CHECK(blockio_load_finish(v.bio, la, sa) == 896);
    CHECK(blockio_load_finish(v.bio, lb, sb) == 896);
    kvpool_fill_wait(pool, -1);
    blockio_get_stats(v.bio, &st);
    CHECKF(st.n_fills + st.n_inplace == 7 && st.n_appended == 14 && st.n_load_wasted == 0,
           "fills %llu in place %llu appended %llu wasted %llu", (unsigned long long)st.n_fills,
           (unsigned long long)st.n_inplace, (unsigned long long)st.n_appended, (unsigned long long)st.n_load_wasted);
    for (int bi = 0; bi < 7; bi++) {
        CHECK(kvpool_seq_block_id(sa, bi) == kvpool_seq_block_id(sb, bi));
        void *f;
        size_t n;
        CHECK(store_get(v.st, kvpool_seq_block_key(pool, sa, bi), 0, &f, &n) == STORE_OK);
        if (f) {
            /* the filled block is the stored payload, byte for byte */
            CHECK(!memcmp(kvpool_seq_slab(pool, sa, bi, 0, 0, 0), block_payload(f), kvpool_block_bytes(pool)));
            free(f);
        }
    }
    kvpool_seq_free(pool, sa);
    kvpool_seq_free(pool, sb);
    schedtest_stack_free(&v);

    /* through the scheduler: two concurrent requests, each stored block read once, outputs
     * identical to the uncached ones */
    v = server_new(spec);
    sched_params p1 = { .prompt = pa, .n_prompt = 1100, .max_tokens = 6 }, p2;
    p1.sample = sample_params_default();
    p1.sample.temp = 0;
    p2 = p1;
    p2.prompt = pb;
    sched_req *a, *b;
    CHECK(sched_submit(v.s, &p1, &a) == SCHED_OK);
    CHECK(sched_submit(v.s, &p2, &b) == SCHED_OK);
    int32_t oa[6], ob[6];
    /* + the rows of the prefix's partial block for the one that found the other holding them
     * (whichever the engine admitted second) */
    int ca = drain(a, 6, oa), cb = drain(b, 6, ob);
    CHECKF((ca == 896 || ca == 1000) && (cb == 896 || cb == 1000) && ca + cb < 2000, "cached %d and %d", ca, cb);
    CHECK(!memcmp(oa, ra, sizeof ra) && !memcmp(ob, rb, sizeof rb));
    blockio_get_stats(v.bio, &st);
    CHECKF(st.n_load_blocks == 7, "read %llu", (unsigned long long)st.n_load_blocks);
    store_get_stats(v.st, &ss);
    CHECK(ss.n_hit == 7);
    /* both waited for their load before admission: the wait is on /metrics */
    sched_hist lw;
    sched_get_hists(v.s, NULL, NULL, NULL, &lw);
    CHECKF(lw.n == 2 && lw.sum > 0, "load waits %llu", (unsigned long long)lw.n);
    sched_stats ss2;
    sched_get_stats(v.s, &ss2);
    CHECK(ss2.store_load_s > 0);
    schedtest_stack_free(&v);
}


/* Loads pa's stored blocks with blockio alone, checks each filled pool block against the
 * store's payload; returns the blocks appended. */
static int load_and_check(server *v, const int32_t *pa, int n)
{
    blockio_load *l = blockio_load_start(v->bio, NULL, pa, n);
    CHECK(l != NULL);
    if (!l) return -1;
    CHECK(WAIT_UNTIL(blockio_load_ready(v->bio, l), 30));
    kvpool *pool = engine_kvpool(v->e);
    kvpool_seq *sq = kvpool_seq_new(pool);
    int got = blockio_load_finish(v->bio, l, sq) / 128;
    kvpool_fill_wait(pool, -1);
    for (int bi = 0; bi < got; bi++) {
        void *f;
        size_t fn;
        CHECK(store_get(v->st, kvpool_seq_block_key(pool, sq, bi), 0, &f, &fn) == STORE_OK);
        if (f) {
            CHECKF(!memcmp(kvpool_seq_slab(pool, sq, bi, 0, 0, 0), block_payload(f), kvpool_block_bytes(pool)),
                   "block %d", bi);
            free(f);
        }
    }
    kvpool_seq_free(pool, sq);
    return got;
}

TEST(test_load_read_buffers_reused_and_abandoned)
{
    /* blocks are read into the kept buffers while they last (no fresh ones), into fresh ones
     * beyond, with the same bytes either way; loads dropped at any point of their reading
     * (both I/O threads claim blocks of one load) free everything (ASan) */
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/rbuf", tmpdir);
    int32_t pa[1100], out[4];
    schedtest_prompt(pa, 1100, 51);
    CHECK(once(spec, pa, 1000, 4, out) == 0);   /* stores 7 blocks */
    g_kv_blocks = 64;
    server v = server_new(spec);   /* 16 kept buffers */
    blockio_stats st;
    for (int rep = 0; rep < 3; rep++) {   /* read, dropped: the buffers go back */
        blockio_load *l = blockio_load_start(v.bio, NULL, pa, 1100);
        CHECK(l && WAIT_UNTIL(blockio_load_ready(v.bio, l), 30));
        blockio_load_free(v.bio, l);
    }
    CHECK(load_and_check(&v, pa, 1100) == 7);
    blockio_get_stats(v.bio, &st);
    CHECKF(st.n_read_buf_alloc == 0 && st.n_load_blocks == 28, "fresh buffers %llu, read %llu",
           (unsigned long long)st.n_read_buf_alloc, (unsigned long long)st.n_load_blocks);
    schedtest_stack_free(&v);

    g_read_bufs = 2;   /* fewer kept buffers than blocks: fresh ones, same bytes */
    g_no_map = true;   /* (mapped blocks take no buffers) */
    v = server_new(spec);
    CHECK(load_and_check(&v, pa, 1100) == 7);
    blockio_get_stats(v.bio, &st);
    CHECKF(st.n_read_buf_alloc >= 5 && st.n_load_blocks == 7, "fresh buffers %llu, read %llu",
           (unsigned long long)st.n_read_buf_alloc, (unsigned long long)st.n_load_blocks);
    /* abandoned loads: dropped at once, after a while, or never looked at again */
    for (int i = 0; i < 40; i++) {
        blockio_load *l = blockio_load_start(v.bio, NULL, pa, 1100);
        if (i % 3 == 1) usleep(200 * (useconds_t)(i % 7));
        if (i % 3 != 2) blockio_load_free(v.bio, l);
        else {
            CHECK(WAIT_UNTIL(blockio_load_ready(v.bio, l), 30));
            blockio_load_free(v.bio, l);
        }
    }
    schedtest_stack_free(&v);
    g_read_bufs = 0;
    g_no_map = false;
    g_kv_blocks = 24;
}

/* Keys of the first n_blocks blocks of prompt (no salt, f16 pool). */
static void prompt_keys(const int32_t *prompt, int n_blocks, uint8_t (*keys)[32])
{
    uint8_t fp[32], root[32] = { 0 };
    blockkey_pool_fp(g_model->fingerprint, QTYPE_F16, fp);
    blockkey_chain(root, prompt, n_blocks, fp, keys);
}

TEST(test_mapped_blocks_deleted_or_corrupt)
{
    /* blocks are mapped, verified and filled from the mapping: files deleted after the load
     * (before the fill) still fill the stored bytes; abandoned mapped loads free everything; a
     * corrupt block is a miss (counted, deleted), the blocks before it are used, outputs equal
     * the uncached ones */
    char dir[128], spec[160], path[400];
    dir_store("mapped", dir, sizeof dir, spec, sizeof spec);
    int32_t pa[1100], ra[6], out[6];
    schedtest_prompt(pa, 1100, 61);
    CHECK(once(NULL, pa, 1100, 6, ra) == 0);
    CHECK(once(spec, pa, 1000, 6, out) == 0);   /* stores 7 blocks */
    uint8_t keys[7][32];
    prompt_keys(pa, 7, keys);
    server v = server_new(spec);
    if (!store_mappable(v.st)) {
        printf("     (skipped: %s is not on a local file system)\n", dir);
        schedtest_stack_free(&v);
        return;
    }
    kvpool *pool = engine_kvpool(v.e);
    size_t bb = kvpool_block_bytes(pool);
    uint8_t *want = xmalloc(7 * bb);
    for (int i = 0; i < 7; i++) {
        void *f;
        size_t n;
        CHECK(store_get(v.st, keys[i], 0, &f, &n) == STORE_OK);
        if (f) memcpy(want + (size_t)i * bb, block_payload(f), bb);
        free(f);
    }
    blockio_load *l = blockio_load_start(v.bio, NULL, pa, 1100);
    CHECK(l && WAIT_UNTIL(blockio_load_ready(v.bio, l), 30));
    for (int i = 0; i < 7; i++) {   /* gone from the store while mapped */
        CHECK(store_delete(v.st, keys[i]) == STORE_OK);
    }
    kvpool_seq *sq = kvpool_seq_new(pool);
    CHECK(blockio_load_finish(v.bio, l, sq) == 896);
    kvpool_fill_wait(pool, -1);
    for (int bi = 0; bi < 7; bi++)
        CHECKF(!memcmp(kvpool_seq_slab(pool, sq, bi, 0, 0, 0), want + (size_t)bi * bb, bb), "block %d", bi);
    kvpool_seq_free(pool, sq);
    blockio_stats st;
    blockio_get_stats(v.bio, &st);
    CHECKF(st.n_load_mapped == 7 && st.n_load_blocks == 7 && st.n_read_buf_alloc == 0, "mapped %llu of %llu",
           (unsigned long long)st.n_load_mapped, (unsigned long long)st.n_load_blocks);
    schedtest_stack_free(&v);
    free(want);

    CHECK(once(spec, pa, 1000, 6, out) == 0);   /* stored again */
    v = server_new(spec);
    for (int i = 0; i < 30; i++) {   /* abandoned at once, after a while, or once ready */
        l = blockio_load_start(v.bio, NULL, pa, 1100);
        if (i % 3 == 1) usleep(300 * (useconds_t)(i % 7));
        if (i % 3 == 2) CHECK(WAIT_UNTIL(blockio_load_ready(v.bio, l), 30));
        blockio_load_free(v.bio, l);
    }
    schedtest_stack_free(&v);

    char hex[BLOCKKEY_HEX];
    blockkey_hex(keys[3], hex);
    snprintf(path, sizeof path, "%s/%.2s/%.2s/%s.blk", dir, hex, hex + 2, hex);
    CHECK(storetest_flip(path, -100) == 0);
    v = server_new(spec);
    CHECK(run(&v, pa, 1100, 6, out) == 384);   /* blocks 0-2 from the store, 3.. recomputed */
    CHECK(!memcmp(out, ra, sizeof ra));
    store_stats ss;
    store_get_stats(v.st, &ss);
    CHECKF(ss.n_corrupt == 1, "corrupt %llu", (unsigned long long)ss.n_corrupt);
    blockio_get_stats(v.bio, &st);
    CHECK(st.n_load_mapped >= 3);
    schedtest_stack_free(&v);
    CHECK(once(spec, pa, 1100, 6, out) == 1024);   /* written again (with block 7) */
    CHECK(!memcmp(out, ra, sizeof ra));
}

static int g_ready_calls;   /* atomic */
static void count_ready(void *arg) { __atomic_fetch_add((int *)arg, 1, __ATOMIC_RELAXED); }

TEST(test_ready_hook_called_per_settled_load)
{
    /* the owner hears of a finished load without polling; a removed hook is not called */
    char spec[160];
    snprintf(spec, sizeof spec, "dir:%s/ready", tmpdir);
    int32_t pa[400], out[4];
    schedtest_prompt(pa, 400, 61);
    CHECK(once(spec, pa, 300, 4, out) == 0);   /* 2 blocks stored */
    server v = server_new(spec);
    blockio_set_ready_hook(v.bio, count_ready, &g_ready_calls);
    blockio_load *l = blockio_load_start(v.bio, NULL, pa, 400);
    CHECK(l != NULL);
    CHECK(WAIT_UNTIL(__atomic_load_n(&g_ready_calls, __ATOMIC_RELAXED) == 1, 30));
    CHECK(blockio_load_ready(v.bio, l));
    blockio_load_free(v.bio, l);
    blockio_set_ready_hook(v.bio, NULL, NULL);
    l = blockio_load_start(v.bio, NULL, pa, 400);
    CHECK(l && WAIT_UNTIL(blockio_load_ready(v.bio, l), 30));
    blockio_load_free(v.bio, l);
    CHECK(__atomic_load_n(&g_ready_calls, __ATOMIC_RELAXED) == 1);
    schedtest_stack_free(&v);
}

typedef struct {
    int n;
    double last_use[8], expiry[8];
} ls_result;

static void ls_cb(void *arg, int target, const uint8_t key[32], uint64_t bytes, double last_use, double expiry)
{
    ls_result *r = arg;
    if (r->n < 8) {
        r->last_use[r->n] = last_use;
        r->expiry[r->n] = expiry;
    }
    r->n++;
}

/* The next servers' store: dir:TMPDIR/name with TTLs ret, on the test clock set to t0. */
static store_opts g_clocked_opts;
static void use_clocked_store(char *spec, size_t n, const char *name, double t0, const char *ret)
{
    snprintf(spec, n, "dir:%s/%s", tmpdir, name);
    storetest_clock_now = t0;
    g_clocked_opts = (store_opts){ .retention = ret, .clock = storetest_clock };
    g_store_opts = &g_clocked_opts;
}

TEST(test_ram_hits_touch_the_store)
{
    /* a prefix served from the RAM tier never reads the store; its stored blocks' last use
     * and expiry are refreshed all the same (at most once per block per 60 s), so the store's
     * TTL does not expire a prefix that is hot in RAM */
    char spec[160];
    const double t0 = 1.8e9;
    use_clocked_store(spec, sizeof spec, "touch", t0, "chat=100s");
    int32_t hot[300], cold[300], out[4];
    schedtest_prompt(hot, 300, 41);
    schedtest_prompt(cold, 300, 42);
    server v = server_new(spec);
    CHECK(run(&v, hot, 300, 4, out) == 0);
    CHECK(run(&v, cold, 300, 4, out) == 0);
    blockio_stats st;
    CHECK(WAIT_UNTIL((blockio_get_stats(v.bio, &st), st.n_written == 4), 30));
    ls_result ls = { 0 };
    store_ls(v.st, ls_cb, &ls);
    CHECK(ls.n == 4);
    for (int i = 0; i < 4 && i < ls.n; i++) CHECK(ls.last_use[i] == t0 && ls.expiry[i] == t0 + 100);

    storetest_clock_now = t0 + 80;
    store_stats ss0, ss;
    store_get_stats(v.st, &ss0);
    CHECK(run(&v, hot, 300, 4, out) == 299);   /* RAM hit: 2 blocks (touched), 43 rows kept after them */
    CHECK(WAIT_UNTIL((blockio_get_stats(v.bio, &st), st.n_touched == 2), 30));
    store_get_stats(v.st, &ss);
    CHECK(ss.n_get == ss0.n_get);              /* the store was not read */
    CHECK(st.n_touch_queued == 2 && st.n_touch_skipped == 0);
    ls = (ls_result){ 0 };
    store_ls(v.st, ls_cb, &ls);
    int n_hot = 0;
    for (int i = 0; i < 4 && i < ls.n; i++)
        if (ls.last_use[i] == t0 + 80 && ls.expiry[i] == t0 + 180) n_hot++;
        else CHECK(ls.last_use[i] == t0 && ls.expiry[i] == t0 + 100);
    CHECK(n_hot == 2);

    storetest_clock_now = t0 + 100;            /* 20 s after the touch: not touched again */
    CHECK(run(&v, hot, 300, 4, out) == 299);
    blockio_get_stats(v.bio, &st);
    CHECK(st.n_touch_queued == 2 && st.n_touch_skipped == 2);

    storetest_clock_now = t0 + 130;            /* the cold prefix expires, the hot one stays */
    uint64_t n_exp = 0, n_ev = 0;
    store_gc(v.st, &n_exp, &n_ev);
    CHECK(n_exp == 2);
    ls = (ls_result){ 0 };
    store_ls(v.st, ls_cb, &ls);
    CHECK(ls.n == 2);
    for (int i = 0; i < 2 && i < ls.n; i++) CHECK(ls.expiry[i] == t0 + 180);

    storetest_clock_now = t0 + 145;            /* 65 s after the touch: touched again */
    CHECK(run(&v, hot, 300, 4, out) == 299);
    CHECK(WAIT_UNTIL((blockio_get_stats(v.bio, &st), st.n_touched == 4), 30));
    CHECK(st.n_touch_queued == 4);
    schedtest_stack_free(&v);
    g_store_opts = NULL;
}

TEST(test_shared_load_refreshes_with_each_class)
{
    /* two requests of different traffic classes share one store load: the blocks' expiry is
     * moved by both classes' TTLs (the later of the two), not only by the first load's */
    char spec[160];
    const double t0 = 1.9e9;
    use_clocked_store(spec, sizeof spec, "shared-class", t0, "chat=100s,agent=1000s");
    int32_t p[300], out[4];
    schedtest_prompt(p, 300, 51);
    CHECK(once(spec, p, 300, 4, out) == 0);   /* 2 full blocks, class chat: expiry t0 + 100 */
    server v = server_new(spec);
    int agent = store_class(v.st, "agent"), chat = store_class(v.st, "chat");
    CHECK(agent >= 0 && chat >= 0 && agent != chat);
    storetest_clock_now = t0 + 10;
    blockio_load *la = blockio_load_start_class(v.bio, NULL, p, 300, chat);
    CHECK(la && WAIT_UNTIL(blockio_load_ready(v.bio, la), 30));
    storetest_clock_now = t0 + 20;
    blockio_load *lb = blockio_load_start_class(v.bio, NULL, p, 300, agent);   /* shares la's blocks */
    CHECK(lb && WAIT_UNTIL(blockio_load_ready(v.bio, lb), 30));
    blockio_stats st;
    CHECK(WAIT_UNTIL((blockio_get_stats(v.bio, &st), st.n_touched == 2), 30));
    CHECKF(st.n_load_blocks == 2 && st.n_load_shared == 2, "read %llu shared %llu",
           (unsigned long long)st.n_load_blocks, (unsigned long long)st.n_load_shared);
    ls_result ls = { 0 };
    store_ls(v.st, ls_cb, &ls);
    CHECK(ls.n == 2);
    for (int i = 0; i < 2 && i < ls.n; i++) CHECKF(ls.expiry[i] == t0 + 1020, "expiry t0 + %.0f", ls.expiry[i] - t0);
    kvpool *pool = engine_kvpool(v.e);
    kvpool_seq *sa = kvpool_seq_new(pool), *sb = kvpool_seq_new(pool);
    CHECK(blockio_load_finish(v.bio, la, sa) == 256);
    CHECK(blockio_load_finish(v.bio, lb, sb) == 256);
    kvpool_fill_wait(pool, -1);
    kvpool_seq_free(pool, sa);
    kvpool_seq_free(pool, sb);
    schedtest_stack_free(&v);
    g_store_opts = NULL;
}

/* The store's clock for the stalled store: blocks every write (store_put reads the clock)
 * while g_stall is set. */
static int g_stall;   /* atomic */
static double stall_clock(void)
{
    while (__atomic_load_n(&g_stall, __ATOMIC_ACQUIRE)) usleep(1000);
    return 1.8e9;
}

TEST(test_flush_writes_the_queue_or_gives_up)
{
    enum { N = 4 * 128 + 10 };   /* a prompt of 4 full blocks */
    int32_t prompt[N], out[1];
    schedtest_prompt(prompt, N, 21);
    /* a store that takes its writes: after the engine's last step the flush returns 0 and
     * every block is in the store */
    char dir[300], spec[320];
    dir_store("flush", dir, sizeof dir, spec, sizeof spec);
    server v = server_new(spec);
    CHECK(run(&v, prompt, N, 1, out) == 0);
    sched_free(v.s);   /* no block is queued after this */
    v.s = NULL;
    CHECK(blockio_flush(v.bio, 30000) == 0);
    ls_result ls = { 0 };
    store_ls(v.st, ls_cb, &ls);
    CHECK(ls.n == 4);
    schedtest_stack_free(&v);

    /* a stuck store: the flush gives up at its bound with the 4 blocks still queued or being
     * written; once the store moves again, the writes under way end and what was queued is
     * dropped, not written (blockio_free waits for no queue) */
    static store_opts stall_opts = { .clock = stall_clock };
    g_store_opts = &stall_opts;
    dir_store("stalled", dir, sizeof dir, spec, sizeof spec);
    v = server_new(spec);
    __atomic_store_n(&g_stall, 1, __ATOMIC_RELEASE);
    CHECK(run(&v, prompt, N, 1, out) == 0);
    sched_free(v.s);
    v.s = NULL;
    CHECK(blockio_flush(v.bio, 100) == 4);
    __atomic_store_n(&g_stall, 0, __ATOMIC_RELEASE);
    blockio_stats bs;
    CHECK(WAIT_UNTIL((blockio_get_stats(v.bio, &bs), bs.n_written + bs.n_write_dropped == 4), 30));
    /* two I/O threads: at most two writes were under way, the rest was given up */
    CHECKF(bs.n_write_dropped >= 2, "%llu written, %llu dropped",
           (unsigned long long)bs.n_written, (unsigned long long)bs.n_write_dropped);
    schedtest_stack_free(&v);
    g_store_opts = NULL;
}

int main(void)
{
    util_log_level = LOG_LEVEL_ERROR;
    if (!(g_model = schedtest_open(tmpdir, 7))) return 1;
    RUN(test_multi_turn_identical_cache_on_off);
    RUN(test_two_servers_share_a_dir_store);
    RUN(test_corrupt_dir_blocks_are_recomputed);
    RUN(test_ec_10_2_fragments_lost);
    RUN(test_salt_keeps_tenants_apart);
    RUN(test_load_waits_for_kv_space);
    RUN(test_inplace_blocks_let_go_on_reuse);
    RUN(test_concurrent_loads_read_each_block_once);
    RUN(test_shared_load_refreshes_with_each_class);
    RUN(test_load_read_buffers_reused_and_abandoned);
    RUN(test_mapped_blocks_deleted_or_corrupt);
    RUN(test_ready_hook_called_per_settled_load);
    RUN(test_ram_hits_touch_the_store);
    RUN(test_flush_writes_the_queue_or_gives_up);
    schedtest_close(tmpdir, g_model);
    HARNESS_END();
}
