/*
 * test_blockkey: cache/blockkey.c. Each key is checked against a reference built here from
 * the documented layout with OpenSSL directly (SHA-256 of parent || 128 int32 LE tokens ||
 * pool fingerprint; the pool fingerprint SHA-256 of model fingerprint || dtype || version),
 * the salted root against its published digest; the chain links each block to the one
 * before; salt, element type, model and any one token change the key; the KV pool keys its
 * blocks with the same function; hex goes both ways and refuses what is not hex.
 */
#include "harness.h"

#include <stdint.h>

#include <openssl/evp.h>

#include "cache/blockkey.h"
#include "engine/kvpool.h"
#include "model/quant.h"

static void ref_sha256(const void *p, size_t n, uint8_t out[32])
{
    unsigned int len = 0;
    EVP_Digest(p, n, out, &len, EVP_sha256(), NULL);
}

static void ref_le32(uint8_t *o, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) o[i] = (uint8_t)(u >> (8 * i));
}

static void ref_pool_fp(const uint8_t model_fp[32], int32_t dtype, uint8_t out[32])
{
    uint8_t b[40];
    memcpy(b, model_fp, 32);
    ref_le32(b + 32, dtype);
    ref_le32(b + 36, BLOCKKEY_KV_VERSION);
    ref_sha256(b, sizeof b, out);
}

static void ref_key(const uint8_t parent[32], const int32_t *toks, const uint8_t fp[32], uint8_t out[32])
{
    uint8_t b[32 + BLOCKKEY_TOKENS * 4 + 32];
    memcpy(b, parent, 32);
    for (int i = 0; i < BLOCKKEY_TOKENS; i++) ref_le32(b + 32 + 4 * i, toks[i]);
    memcpy(b + 32 + BLOCKKEY_TOKENS * 4, fp, 32);
    ref_sha256(b, sizeof b, out);
}

static uint8_t model_fp[32];
static int32_t toks[3 * BLOCKKEY_TOKENS];

static void fixtures(void)
{
    for (int i = 0; i < 32; i++) model_fp[i] = (uint8_t)i;
    for (int i = 0; i < 3 * BLOCKKEY_TOKENS; i++) toks[i] = i * 7 - 100;   /* negatives too */
}

TEST(test_root_and_pool_fp)
{
    uint8_t root[32], zero[32] = {0}, want[32];
    blockkey_root(NULL, 0, root);
    CHECK(!memcmp(root, zero, 32));
    blockkey_root("x", 0, root);
    CHECK(!memcmp(root, zero, 32));
    /* SHA-256("tokenmill-salt" "tenant-a") */
    blockkey_root("tenant-a", 8, root);
    CHECK(blockkey_from_hex("2e0a4d03be599cd8253ae5b20e5ffe78d1751ffc369bef8fa79eb4040b5c5162", want) == 0);
    CHECK(!memcmp(root, want, 32));
    uint8_t fp[32];
    blockkey_pool_fp(model_fp, QTYPE_F16, fp);
    ref_pool_fp(model_fp, QTYPE_F16, want);
    CHECK(!memcmp(fp, want, 32));
    blockkey_pool_fp(model_fp, QTYPE_F32, fp);
    ref_pool_fp(model_fp, QTYPE_F32, want);
    CHECK(!memcmp(fp, want, 32));
}

TEST(test_chain_matches_reference)
{
    uint8_t fp[32], root[32], keys[3][32], want[32];
    blockkey_pool_fp(model_fp, QTYPE_F16, fp);
    blockkey_root("tenant-a", 8, root);
    blockkey_chain(root, toks, 3, fp, keys);
    const uint8_t *parent = root;
    for (int b = 0; b < 3; b++) {
        ref_key(parent, toks + b * BLOCKKEY_TOKENS, fp, want);
        CHECKF(!memcmp(keys[b], want, 32), "block %d", b);
        uint8_t one[32];
        blockkey_compute(parent, toks + b * BLOCKKEY_TOKENS, fp, one);
        CHECK(!memcmp(one, keys[b], 32));
        parent = keys[b];
    }
    /* a chain of 0 blocks writes nothing */
    uint8_t untouched[1][32];
    memset(untouched, 0xAB, sizeof untouched);
    blockkey_chain(root, toks, 0, fp, untouched);
    CHECK(untouched[0][0] == 0xAB && untouched[0][31] == 0xAB);
}

/* Everything the key covers changes it: salt, dtype, model, one token, the parent. */
TEST(test_key_changes)
{
    uint8_t fp[32], fp32[32], fp_other[32], root[32], salted[32], base[3][32], k[3][32];
    blockkey_pool_fp(model_fp, QTYPE_F16, fp);
    blockkey_pool_fp(model_fp, QTYPE_F32, fp32);
    uint8_t other[32];
    memcpy(other, model_fp, 32);
    other[31] ^= 1;
    blockkey_pool_fp(other, QTYPE_F16, fp_other);
    blockkey_root(NULL, 0, root);
    blockkey_root("tenant-b", 8, salted);
    blockkey_chain(root, toks, 3, fp, base);
    blockkey_chain(salted, toks, 3, fp, k);
    for (int b = 0; b < 3; b++) CHECKF(memcmp(k[b], base[b], 32), "salt, block %d", b);
    blockkey_chain(root, toks, 3, fp32, k);
    for (int b = 0; b < 3; b++) CHECKF(memcmp(k[b], base[b], 32), "dtype, block %d", b);
    blockkey_chain(root, toks, 3, fp_other, k);
    for (int b = 0; b < 3; b++) CHECKF(memcmp(k[b], base[b], 32), "model, block %d", b);
    /* one token of block 1 changed: block 0 keeps its key, blocks 1 and 2 do not */
    int32_t t2[3 * BLOCKKEY_TOKENS];
    memcpy(t2, toks, sizeof t2);
    t2[BLOCKKEY_TOKENS + 127] += 1;
    blockkey_chain(root, t2, 3, fp, k);
    CHECK(!memcmp(k[0], base[0], 32) && memcmp(k[1], base[1], 32) && memcmp(k[2], base[2], 32));
    /* the same 128 tokens under another parent: another key */
    uint8_t a[32], b2[32];
    blockkey_compute(base[0], toks, fp, a);
    blockkey_compute(base[1], toks, fp, b2);
    CHECK(memcmp(a, b2, 32));
}

TEST(test_shared_with_kvpool)
{
    kvpool_opts o = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 8, .dtype = QTYPE_F16, .n_blocks = 2 };
    memcpy(o.model_fp, model_fp, 32);
    kvpool *p;
    CHECK(kvpool_new(&o, &p) == KVPOOL_OK);
    uint8_t fp[32], root[32], a[32], keys[2][32];
    blockkey_pool_fp(o.model_fp, QTYPE_F16, fp);
    blockkey_root(NULL, 0, root);
    kvpool_block_key(p, root, toks, a);
    blockkey_chain(root, toks, 2, fp, keys);
    CHECK(!memcmp(a, keys[0], 32));
    kvpool_block_key(p, keys[0], toks + 128, a);
    CHECK(!memcmp(a, keys[1], 32));
    kvpool_free(p);
}

TEST(test_hex)
{
    uint8_t k[32], back[32];
    for (int i = 0; i < 32; i++) k[i] = (uint8_t)(i * 37 + 5);
    char hex[BLOCKKEY_HEX];
    blockkey_hex(k, hex);
    CHECKF(!strcmp(hex, "052a4f7499bee3082d52779cc1e60b30557a9fc4e90e33587da2c7ec11365b80"), "%s", hex);
    CHECK(blockkey_from_hex(hex, back) == 0 && !memcmp(back, k, 32));
    /* upper case is read too */
    CHECK(blockkey_from_hex("052A4F7499BEE3082D52779CC1E60B30557A9FC4E90E33587DA2C7EC11365B80", back) == 0 &&
          !memcmp(back, k, 32));
    CHECK(blockkey_from_hex("zz", back) == -1);
    CHECK(blockkey_from_hex("", back) == -1);
    CHECK(blockkey_from_hex("052a4f7499bee3082d52779cc1e60b30557a9fc4e90e33587da2c7ec11365b8", back) == -1);  /* 63 */
    CHECK(blockkey_from_hex("052a4f7499bee3082d52779cc1e60b30557a9fc4e90e33587da2c7ec11365bg0", back) == -1);
}

int main(void)
{
    fixtures();
    RUN(test_root_and_pool_fp);
    RUN(test_chain_matches_reference);
    RUN(test_key_changes);
    RUN(test_shared_with_kvpool);
    RUN(test_hex);
    HARNESS_END();
}
