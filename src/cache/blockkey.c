/*
 * blockkey: SHA-256 block keys (see blockkey.h for the chain and what it covers).
 * One digest per key over a stack buffer: no shared state.
 */
#include "cache/blockkey.h"

#include <string.h>

#include "util/sha256.h"
#include "util/util.h"

void blockkey_pool_fp(const uint8_t model_fp[32], int32_t dtype, uint8_t out[32])
{
    uint8_t buf[40];
    int32_t version = BLOCKKEY_KV_VERSION;
    memcpy(buf, model_fp, 32);
    memcpy(buf + 32, &dtype, 4);   /* x86-64: little-endian already */
    memcpy(buf + 36, &version, 4);
    sha256_digest(buf, sizeof buf, out);
}

void blockkey_root(const void *salt, size_t n, uint8_t out[32])
{
    if (!salt || n == 0) {
        memset(out, 0, 32);
        return;
    }
    sha256_part parts[] = { { "tokenmill-salt", 14 }, { salt, n } };
    sha256_parts(parts, 2, out);
}

void blockkey_compute(const uint8_t parent[32], const int32_t *tokens, const uint8_t pool_fp[32],
                      uint8_t out[32])
{
    uint8_t buf[32 + BLOCKKEY_TOKENS * 4 + 32];
    memcpy(buf, parent, 32);
    memcpy(buf + 32, tokens, BLOCKKEY_TOKENS * 4);   /* x86-64: int32 little-endian already */
    memcpy(buf + 32 + BLOCKKEY_TOKENS * 4, pool_fp, 32);
    sha256_digest(buf, sizeof buf, out);
}

void blockkey_chain(const uint8_t root[32], const int32_t *tokens, int n_blocks,
                    const uint8_t pool_fp[32], uint8_t (*out)[32])
{
    const uint8_t *parent = root;
    for (int i = 0; i < n_blocks; i++) {
        blockkey_compute(parent, tokens + (size_t)i * BLOCKKEY_TOKENS, pool_fp, out[i]);
        parent = out[i];
    }
}

void blockkey_hex(const uint8_t key[32], char out[BLOCKKEY_HEX]) { util_hex(key, 32, out); }

int blockkey_from_hex(const char *z, uint8_t out[32]) { return util_unhex(z, 32, out) ? 0 : -1; }
