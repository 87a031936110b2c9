/*
 * test_dsv4layout: the compressed layout's sizes for DeepSeek V4 (engine_dsv4_sizes_of), on
 * the published V4-Flash shape (the figures docs/deepseek4.md quotes) and on shapes the layout
 * cannot hold. The block and ring counts are checked against a walk over positions that
 * applies the forward pass's rules (which position completes an entry, which rows a position
 * reads) rather than against the same closed forms.
 */
#include "harness.h"

#include "engine/engine_dsv4.h"
#include "util/util.h"

/* V4-Flash (model card): 43 layers, ratios 0, 0 then 4 and 128 alternating, heads of 512,
 * indexer keys of 128, a 128-token window. */
static void flash(int32_t *ratio, engine_dsv4_shape *s)
{
    for (int il = 0; il < 43; il++) ratio[il] = il < 2 ? 0 : il % 2 == 0 ? 4 : 128;
    *s = (engine_dsv4_shape){ 43, ratio, 512, 128, 128 };
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
    /* the pool: rows of the widest ring row (512 raw + 2 x 1024 compressor + 2 x 256 indexer),
     * the 440,320 values packed into 2 slabs of (128, 3072) */
    CHECK(z.width == 3072);
    CHECK(z.n_slabs == 2);
    CHECK(z.pool_block == 2LL * 128 * 3072);
    CHECK(z.pool_state == 43LL * 128 * 3072);
    CHECK(z.pool_ring == 43LL * (128 + KVPOOL_RING_SPARE) * 3072);
    /* kvpool in that geometry (engine_dsv4_kv_geometry's: the model's layers as window layers,
     * v_is_k, F32 rings, then the entry slabs) has exactly those sizes */
    int32_t lw[45];
    for (int il = 0; il < 45; il++) lw[il] = il < 43 ? 128 : 0;
    kvpool_opts ko = { .n_layers = 45, .n_kv_heads = 1, .head_dim = z.width, .v_is_k = true, .dtype = QTYPE_F16,
                       .n_blocks = 2, .layer_window = lw, .ring_f32 = true };
    CHECK(kvpool_geom_block_bytes(&ko) == (size_t)z.pool_block * 2);   /* 1.5 MiB against 860 KiB */
    kvpool *p = NULL;
    CHECK(kvpool_new(&ko, &p) == KVPOOL_OK);
    CHECK(kvpool_n_window_layers(p) == 43 && kvpool_n_block_layers(p) == 2 && kvpool_window(p) == 128);
    CHECK(kvpool_ring_dtype(p) == QTYPE_F32);
    CHECK(kvpool_ring_bytes(p) == (size_t)z.pool_ring * 4);
    CHECK(kvpool_window_state_bytes(p) == (size_t)z.pool_state * 4);
    kvpool_free(p);
    int64_t ring = 0;
    for (int il = 0; il < 43; il++) {
        int r = ratio[il];
        ring += (int64_t)walk_slots(r, 128, true) * 512;
        if (r == 4) ring += (int64_t)walk_slots(4, 128, false) * (4 * 512 + 4 * 128);
        if (r == 128) ring += (int64_t)walk_slots(128, 128, false) * 2 * 512;
    }
    CHECKF(z.ring == ring, "%lld vs %lld", (long long)z.ring, (long long)ring);
}

TEST(test_small_window)
{
    /* the oracle tests' shape of layer kinds with a 16-position window: the ring's raw part
     * follows the window, the ratio-128 projections do not */
    int32_t ratio[4] = { 0, 4, 128, 4 };
    engine_dsv4_shape s = { 4, ratio, 64, 32, 16 };
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
    engine_dsv4_shape s = { 2, ratio, 64, 32, 16 };
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

int main(void)
{
    RUN(test_flash_figures);
    RUN(test_small_window);
    RUN(test_bad_shapes);
    HARNESS_END();
}
