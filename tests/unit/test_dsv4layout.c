/*
 * test_dsv4layout: the compressed layout's sizes for DeepSeek V4 (engine_dsv4_sizes_of), on
 * the published V4-Flash shape (the figures docs/deepseek4.md quotes) and on shapes the layout
 * cannot hold. The block and ring counts are checked against a walk over positions that
 * applies the forward pass's rules (which position completes an entry, which rows a position
 * reads) rather than against the same closed forms.
 *
 * Then the layout in the engine, on a generated deepseek4 model (dsv4-tiny's 4 layers of
 * ratios 0, 4, 128, 4 with a 64-position window, so that the last block's replay is not exact):
 * the pool holds the entries in one slab per block and every layer in rings; the window state
 * captured inside a long step equals the ring's after a token-by-token run; attaching the
 * blocks and restoring it, or replaying exactly, gives logits bit-identical to computing
 * everything; bounded replay differs; replays never write the attached blocks; a sequence in
 * two runs of one step, and a rejected draft's few positions, compute exactly.
 */
#include "harness.h"
#include "windowtest.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "engine/engine.h"
#include "engine/engine_dsv4.h"
#include "model/model.h"
#include "util/util.h"

/* V4-Flash (model card): 43 layers, ratios 0, 0 then 4 and 128 alternating, heads of 512,
 * indexer keys of 128, a 128-token window. */
static void flash(int32_t *ratio, engine_dsv4_shape *s)
{
    for (int il = 0; il < 43; il++) ratio[il] = il < 2 ? 0 : il % 2 == 0 ? 4 : 128;
    *s = (engine_dsv4_shape){ 43, ratio, 512, 128, 128, QTYPE_F16 };
}

/* Values a block keeps, by walking its 128 positions: an entry (and an indexer entry on ratio
 * 4) at each position that completes a group. */
static int64_t walk_block(const engine_dsv4_shape *s)
{
    int64_t n = 0;
    for (int il = 0; il < s->n_layers; il++)
        for (int p = 0; p < KVPOOL_BLOCK; p++) {
            int r = s->ratio[il];
            if (r > 0 && (p + 1) % r == 0) n += s->head_dim + (r == 4 ? s->idx_dim : 0);
        }
    return n;
}

/* Ring slots a layer needs: the furthest row behind a position q that its step reads (the
 * window's raw rows; a completed group's projections, with the previous group on ratio 4),
 * plus q itself and the spare slots a rejected draft goes back. */
static int walk_slots(int r, int swa, bool raw)
{
    int back = 0;
    for (int q = 0; q < 4 * KVPOOL_BLOCK; q++) {
        if (raw) back = TM_MAX(back, TM_MIN(q, swa - 1));
        else if ((q + 1) % r == 0) back = TM_MAX(back, q - r * TM_MAX(0, q / r - (r == 4 ? 1 : 0)));
    }
    return back + 1 + KVPOOL_RING_SPARE;
}

TEST(test_flash_figures)
{
    int32_t ratio[43];
    engine_dsv4_shape s;
    flash(ratio, &s);
    engine_dsv4_sizes z;
    char err[256];
    CHECK(engine_dsv4_sizes_of(&s, &z, err, sizeof err));
    CHECK(z.block == 21 * 20480 + 20 * 512);                  /* 440,320 values */
    CHECK(z.block == walk_block(&s));
    CHECK(z.block * 2 == 880640);                               /* 860 KiB in F16 */
    CHECK(z.window == 43LL * 128 * 512);                        /* 5.4 MiB in F16 */
    CHECK(z.carry * 4 == 420 * 1024);                           /* 420 KiB in F32 */
    /* the pool's row bound: the widest row (512 raw; projections 2 x (512 + 512 + 128 + 128) on
     * ratio 4); the 440,320 values are one block layer of (128, 3440): exactly them */
    CHECK(z.width == 2560);
    CHECK(z.n_slabs == 1 && z.slab_width == 3440);
    CHECK(z.pool_block == z.block);
    /* the rings as the pool keeps them: raw rows of 134 positions per layer, projections of
     * 14 (ratio 4) and 134 (ratio 128): 6,447,104 values, 24.6 MiB in F32, no padding */
    CHECK(z.pool_ring == z.ring && z.ring == 6447104);
    /* kvpool in that geometry (engine_dsv4_kv_geometry's: the model's layers as window layers
     * with a raw ring and a projection ring of their own lengths, v_is_k, F32 rings, a window
     * state of the last 128 raw rows in F16 and the ratio-4 carry, then the entry slabs) */
    int32_t lw[44], width[44], aux[44], slots[88], srows[88], scols[88];
    for (int il = 0; il < 44; il++) {
        const int r = il < 43 ? ratio[il] : 0;
        lw[il] = il < 43 ? 128 : 0;
        width[il] = il >= 43 ? 3440 : 512;
        aux[il] = r == 4 ? 2560 : r == 128 ? 1024 : 0;
        slots[2 * il] = 128 + KVPOOL_RING_SPARE;
        slots[2 * il + 1] = r == 4 ? 8 + KVPOOL_RING_SPARE : r == 128 ? 128 + KVPOOL_RING_SPARE : 0;
        srows[2 * il] = 128, srows[2 * il + 1] = r == 4 ? 4 : 0;
        scols[2 * il] = 0, scols[2 * il + 1] = r == 4 ? 1280 : 0;
    }
    kvpool_opts ko = { .n_layers = 44, .n_kv_heads = 1, .head_dim = z.width, .v_is_k = true, .dtype = QTYPE_F16,
                       .n_blocks = 4, .layer_window = lw, .layer_width = width, .ring_f32 = true,
                       .ring_aux_width = aux, .ring_slots = slots, .state_rows = srows, .state_cols = scols,
                       .state_k_dtype = true };
    CHECK(kvpool_geom_block_bytes(&ko) == (size_t)z.pool_block * 2);
    CHECK(kvpool_geom_block_bytes(&ko) == 880640);                     /* 860 KiB, the entries' bytes */
    kvpool *p = NULL;
    CHECK(kvpool_new(&ko, &p) == KVPOOL_OK);
    if (!p) return;
    CHECK(kvpool_n_window_layers(p) == 43 && kvpool_n_block_layers(p) == 1 && kvpool_window(p) == 128);
    CHECK(kvpool_block_bytes(p) == 880640 && kvpool_block_uniform(p) && kvpool_block_width_max(p) == 3440 &&
          kvpool_layer_width(p, 43, 0) == 3440 && kvpool_layer_width(p, 2, 0) == 512 &&
          kvpool_layer_width(p, 2, 1) == 2560 && kvpool_layer_width(p, 3, 1) == 1024);
    CHECK(kvpool_ring_dtype(p) == QTYPE_F32);
    CHECK(kvpool_ring_bytes(p) == (size_t)z.ring * 4);                 /* 25,788,416: 24.6 MiB */
    CHECK(kvpool_ring_slots(p, 2, 1) == 14 && kvpool_ring_slots(p, 3, 1) == 134 && kvpool_ring_slots(p, 0, 0) == 134);
    /* the state: 16 header bytes, 43 x 128 x 512 raw values in F16 (5.4 MiB), the carry in F32
     * (420 KiB): 6,066,192 bytes (5.8 MiB), was 47.0 MiB */
    CHECK(kvpool_window_state_bytes(p) == 16 + (size_t)z.window * 2 + (size_t)z.carry * 4);
    CHECK(kvpool_window_state_bytes(p) == 6066192);
    CHECK(kvpool_window_state_bytes(p) < 64u << 20);                  /* a cluster frame carries it */
    /* a window state round-trips the kept rows of each ring: raw rows (F16-exact values here,
     * as the engine rounds them) and the carry's leading columns of the last 4 positions */
    kvpool_seq *sq = kvpool_seq_new(p), *s2 = kvpool_seq_new(p);
    CHECK(kvpool_seq_reserve(p, sq, 256) == KVPOOL_OK && kvpool_seq_reserve(p, s2, 256) == KVPOOL_OK);
    for (int pos = 100; pos < 256; pos++)
        for (int il = 0; il < 43; il++) {
            float *raw = kvpool_seq_ring_row(p, sq, il, 0, 0, pos);
            for (int i = 0; i < 512; i++) raw[i] = (float)((pos * 7 + il * 131 + i) % 2048);
            if (aux[il]) {
                float *pr = kvpool_seq_ring_row(p, sq, il, 1, 0, pos);
                for (int i = 0; i < aux[il]; i++) pr[i] = (float)(pos * 3 + il * 17 + i) + 0.25f;
            }
        }
    uint8_t *st = malloc(kvpool_window_state_bytes(p));
    kvpool_seq_window_save(p, sq, 256, st);
    CHECK(kvpool_seq_window_restore(p, s2, 256, st, kvpool_window_state_bytes(p)));
    bool same = true;
    for (int il = 0; il < 43; il++) {
        for (int pos = 128; pos < 256; pos++) {
            const float *raw = kvpool_seq_ring_row(p, s2, il, 0, 0, pos);
            for (int i = 0; i < 512; i++) same &= raw[i] == (float)((pos * 7 + il * 131 + i) % 2048);
        }
        for (int pos = 252; ratio[il] == 4 && pos < 256; pos++) {
            const float *pr = kvpool_seq_ring_row(p, s2, il, 1, 0, pos);
            for (int i = 0; i < 1280; i++) same &= pr[i] == (float)(pos * 3 + il * 17 + i) + 0.25f;
        }
    }
    CHECK(same);
    /* a state of another geometry, or a damaged header, is refused and changes nothing */
    st[8] ^= 1;
    CHECK(!kvpool_seq_window_restore(p, s2, 256, st, kvpool_window_state_bytes(p)));
    st[8] ^= 1;
    CHECK(!kvpool_seq_window_restore(p, s2, 256, st, kvpool_window_state_bytes(p) - 1));
    free(st);
    kvpool_seq_free(p, sq);
    kvpool_seq_free(p, s2);
    kvpool_free(p);
    int64_t ring = 0;
    for (int il = 0; il < 43; il++) {
        int r = ratio[il];
        ring += (int64_t)walk_slots(r, 128, true) * 512;
        if (r == 4) ring += (int64_t)walk_slots(4, 128, false) * (4 * 512 + 4 * 128);
        if (r == 128) ring += (int64_t)walk_slots(128, 128, false) * 2 * 512;
    }
    CHECKF(z.ring == ring, "%lld vs %lld", (long long)z.ring, (long long)ring);

    /* Q8_0 (34 bytes per 32 values): the entries are 467,840 bytes; the block layer's row rounds
     * 3440 up to whole blocks, 3456, so the pool's and the store's block is 470,016 bytes (53.4%
     * of F16's); a window state keeps the raw rows in Q8_0 beside the same F32 carry */
    engine_dsv4_sizes zq;
    s.type = QTYPE_Q8_0;
    CHECK(engine_dsv4_sizes_of(&s, &zq, err, sizeof err));
    CHECK(zq.block == z.block && zq.block_bytes == 440320 / 32 * 34 && zq.block_bytes == 467840);
    CHECK(zq.slab_width == 3456 && zq.pool_block == 128 * 3456 && zq.pool_block_bytes == 470016);
    CHECK(zq.window_bytes == 43LL * 128 * 16 * 34 && zq.width == 2560 && zq.ring == z.ring);
    ko.dtype = QTYPE_Q8_0;
    width[43] = 3456;
    CHECK(kvpool_geom_block_bytes(&ko) == 470016);
    p = NULL;
    CHECK(kvpool_new(&ko, &p) == KVPOOL_OK);
    if (!p) return;
    CHECK(kvpool_block_bytes(p) == 470016 && kvpool_ring_bytes(p) == (size_t)z.ring * 4);
    CHECK(kvpool_window_state_bytes(p) == 16 + (size_t)zq.window_bytes + (size_t)z.carry * 4);
    CHECK(kvpool_window_state_bytes(p) == 3424272);                   /* 3.3 MiB */
    kvpool_free(p);
    /* a head or indexer key size outside whole Q8_0 blocks, and Q4_0, are refused by name */
    s.idx_dim = 48;
    CHECK(!engine_dsv4_sizes_of(&s, &zq, err, sizeof err) && strstr(err, "multiples of 32"));
    s.idx_dim = 128, s.type = QTYPE_Q4_0;
    CHECK(!engine_dsv4_sizes_of(&s, &zq, err, sizeof err) && strstr(err, "q4_0"));
}

TEST(test_small_window)
{
    /* the oracle tests' shape of layer kinds with a 16-position window: the ring's raw part
     * follows the window, the ratio-128 projections do not */
    int32_t ratio[4] = { 0, 4, 128, 4 };
    engine_dsv4_shape s = { 4, ratio, 64, 32, 16, QTYPE_F16 };
    engine_dsv4_sizes z;
    char err[256];
    CHECK(engine_dsv4_sizes_of(&s, &z, err, sizeof err));
    CHECK(z.block == walk_block(&s));
    CHECK(z.window == 4 * 16 * 64);
    CHECK(z.ring == 4LL * (16 + KVPOOL_RING_SPARE) * 64 + 2LL * (8 + KVPOOL_RING_SPARE) * (4 * 64 + 4 * 32) +
                        (128LL + KVPOOL_RING_SPARE) * 2 * 64);
}

TEST(test_bad_shapes)
{
    int32_t ratio[2] = { 0, 8 };
    engine_dsv4_shape s = { 2, ratio, 64, 32, 16, QTYPE_F16 };
    engine_dsv4_sizes z;
    char err[256] = "";
    CHECK(!engine_dsv4_sizes_of(&s, &z, err, sizeof err));
    CHECK(strstr(err, "layer 1 has compression ratio 8"));
    ratio[1] = 4, s.idx_dim = 0;
    CHECK(!engine_dsv4_sizes_of(&s, &z, err, sizeof err));
    CHECK(strstr(err, "indexer"));
    s.idx_dim = 32, s.swa = 0;
    CHECK(!engine_dsv4_sizes_of(&s, &z, err, sizeof err));
    s.swa = 16, s.ratio = NULL;
    CHECK(!engine_dsv4_sizes_of(&s, &z, err, sizeof err));
    CHECK(z.block == 0 && z.pool_block == 0);
}

enum { N = 300, V = 300, CHUNK = 100 };

static char tmpdir[] = "/tmp/tm_test_dsv4layout_XXXXXX";

static model *mk_model(void)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/dsv4.gguf", tmpdir);
    char *argv[] = { "mkmodel", "--arch", "deepseek4", "--window", "64", "--vocab-size", "300", "--type", "f32",
                     "--seed", "5", "-o", path, NULL };
    if (cmd_mkmodel((int)TM_ARRAY_LEN(argv) - 1, argv) != 0) return NULL;
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) fprintf(stderr, "%s\n", err);
    unlink(path);
    return m;
}

/* The layout in the engine with blocks (and a state's raw rows) of kt: F16 or Q8_0. */
static void engine_window(engine_kv_type kt)
{
    model *m = mk_model();
    CHECK(m != NULL);
    if (!m) return;
    const bool q8 = kt == ENGINE_KV_Q8_0;
    engine_opts eo = { .n_threads = 2, .n_kv_blocks = 16, .max_batch_tokens = CHUNK, .kv_type = kt };
    engine *e = NULL;
    char err[256];
    CHECK(engine_new(m, &eo, &e, err, sizeof err) == ENGINE_OK);
    if (!e) {
        model_free(m);
        return;
    }
    kvpool *kv = engine_kvpool(e);
    engine_dsv4_sizes z;
    engine_dsv4_model_sizes(m, q8 ? QTYPE_Q8_0 : QTYPE_F16, &z);
    CHECK(z.width == 512 && z.n_slabs == 1 && z.block == 2 * 32 * (64 + 64) + 64);
    CHECK(kvpool_n_window_layers(kv) == 4 && kvpool_n_block_layers(kv) == 1 && kvpool_window(kv) == 128);
    CHECK(kvpool_dtype(kv) == (q8 ? QTYPE_Q8_0 : QTYPE_F16) && kvpool_ring_dtype(kv) == QTYPE_F32);
    if (q8) {
        /* 8256 values to whole Q8_0 rows of 128 x 96 (34 bytes per 32 values) */
        CHECK(z.slab_width == 96 && z.pool_block == 128 * 96 && z.pool_block_bytes == 128 * 3 * 34);
        CHECK(z.block_bytes == 8256 / 32 * 34);
        CHECK(kvpool_block_bytes(kv) == 13056);
        /* the state: the last 64 raw rows of 4 layers in Q8_0, the carry of 2 ratio-4 layers */
        CHECK(kvpool_window_state_bytes(kv) == 16 + 4 * 64 * 2 * 34 + 2 * 4 * (2 * 64 + 2 * 64) * 4);
    } else {
        CHECK(z.slab_width == 65 && z.pool_block == 128 * 65);   /* 8256 values to a whole row: 64 more */
        CHECK(kvpool_block_bytes(kv) == (size_t)z.pool_block * 2);
        /* the state: the last 64 raw rows of 4 layers in F16, the carry of 2 ratio-4 layers */
        CHECK(kvpool_window_state_bytes(kv) == 16 + 4 * 64 * 64 * 2 + 2 * 4 * (2 * 64 + 2 * 64) * 4);
    }
    CHECK(kvpool_block_bytes(kv) == (size_t)z.pool_block_bytes && z.window_bytes == (q8 ? 4 * 64 * 2 * 34 : 4 * 64 * 64 * 2));
    CHECK(kvpool_ring_bytes(kv) == (size_t)z.ring * 4);
    /* Q4_0 is refused for V4, by name */
    engine *q = NULL;
    eo.kv_type = ENGINE_KV_Q4_0;
    CHECK(engine_new(m, &eo, &q, err, sizeof err) != ENGINE_OK && strstr(err, "deepseek4") && strstr(err, "q4_0"));
    eo.kv_type = kt;

    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 37 + i * i / 3 + 5) % V;
    static float ref[N * V], got[N * V];
    const size_t sb = kvpool_window_state_bytes(kv);
    uint8_t *st = malloc(sb), *saved = malloc(sb);
    memset(st, 0xff, sb);

    /* the reference in 100-token steps: the state at 256 is captured inside the step 200..299 */
    kvpool_seq *a = kvpool_seq_new(kv);
    CHECK(windowtest_run(e, a, toks, 0, N, CHUNK, V, ref, (uint8_t *[2]){ NULL, st }, 2));
    /* token by token up to 256: the ring then holds the same state */
    kvpool_seq *t = kvpool_seq_new(kv);
    for (int p = 0; p < 256; p++) {
        engine_tok bt = { toks[p], p, t, false };
        engine_batch b = { 1, &bt };
        CHECK(engine_step(e, &b, NULL) == ENGINE_OK);
    }
    kvpool_seq_window_save(kv, t, 256, saved);
    CHECKF(!memcmp(saved, st, sb), "the state captured inside a 100-token step differs from the ring's");
    kvpool_seq_free(kv, t);

    /* attach the 2 blocks, restore the state at 256: identical logits */
    kvpool_seq *b = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, b, toks, N) == 256);
    CHECK(kvpool_seq_window_restore(kv, b, 256, st, sb));
    CHECK(windowtest_run(e, b, toks, 256, N, CHUNK, V, got, NULL, 0));
    int d = windowtest_first_diff(ref, got, 256, N, V);
    CHECKF(d < 0, "window state restored: position %d differs", d);
    kvpool_seq_free(kv, b);

    /* exact replay (here from 0: the span 128 + 3 x 127 is longer than 256): identical */
    kvpool_seq *c = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, c, toks, N) == 256);
    int from = kvpool_seq_window_replay(kv, c, 256, true);
    CHECK(from == 0);
    CHECK(windowtest_run(e, c, toks, from, N, CHUNK, V, got, NULL, 0));
    d = windowtest_first_diff(ref, got, 256, N, V);
    CHECKF(d < 0, "exact replay: position %d differs", d);
    kvpool_seq_free(kv, c);

    /* bounded replay, the last block: an approximation (the window reaches 253 back) */
    kvpool_seq *bd = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, bd, toks, N) == 256);
    from = kvpool_seq_window_replay(kv, bd, 256, false);
    CHECK(from == 128 && kvpool_seq_win_lo(bd) == 128);
    CHECK(windowtest_run(e, bd, toks, from, N, 7, V, got, NULL, 0));
    d = windowtest_first_diff(ref, got, 256, N, V);
    CHECKF(d == 256, "bounded replay should differ at 256 (first diff %d)", d);
    kvpool_seq_free(kv, bd);

    /* the attached blocks were not written by the replays */
    kvpool_seq *r2 = kvpool_seq_new(kv);
    CHECK(kvpool_seq_attach_prefix(kv, r2, toks, N) == 256);
    CHECK(kvpool_seq_window_restore(kv, r2, 256, st, sb));
    CHECK(windowtest_run(e, r2, toks, 256, N, CHUNK, V, got, NULL, 0));
    CHECK(windowtest_first_diff(ref, got, 256, N, V) < 0);
    kvpool_seq_free(kv, r2);

    /* the step rules: a sequence in two runs of one step, a gap refused, going back a few
     * positions (a rejected draft) exactly and further refused */
    windowtest_check_steps(e, a, toks, N, V, ref, got);

    kvpool_seq_free(kv, a);
    free(st);
    free(saved);
    engine_free(e);
    model_free(m);
}

TEST(test_engine_window) { engine_window(ENGINE_KV_F16); }
TEST(test_engine_window_q8) { engine_window(ENGINE_KV_Q8_0); }

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_flash_figures);
    RUN(test_small_window);
    RUN(test_bad_shapes);
    RUN(test_engine_window);
    RUN(test_engine_window_q8);
    rmdir(tmpdir);
    HARNESS_END();
}
