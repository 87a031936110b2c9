/*
 * blockkey: content addresses of 128-token KV blocks, shared by the RAM tier (kvpool) and the
 * block store.
 *
 * DESIGN. A block's key is SHA-256(parent key || its 128 token ids as int32 LE || pool
 * fingerprint). The pool fingerprint is SHA-256(model fingerprint || KV dtype as int32 LE), so
 * it covers everything that changes the KV bytes (weights, architecture, layer layout via the
 * model fingerprint; element type via dtype; the engine's K/V numerics via
 * BLOCKKEY_KV_VERSION, which must be bumped whenever a change to the engine alters the K/V
 * values it computes, so that stored blocks of an older build are never mixed in). The parent of the first block is the root: all
 * zeros without a tenant salt, SHA-256("tokenmill-salt" || salt) with one. The salt thus
 * reaches every key through the chain, and the same prefix gives the same key on every
 * machine while different models or salts never share one. Pure functions, thread-safe.
 */
#ifndef TM_BLOCKKEY_H
#define TM_BLOCKKEY_H

#include <stddef.h>
#include <stdint.h>

#define BLOCKKEY_TOKENS 128  /* tokens per block */
#define BLOCKKEY_BYTES  32   /* SHA-256 */
#define BLOCKKEY_HEX    65   /* 64 hex digits + NUL */
#define BLOCKKEY_KV_VERSION 4 /* bump when the engine's K/V values change (see above); 3: a
                              * deepseek4 block holds compressed entries, not rows; 4: and
                              * only them (no padding to whole slabs of its widest row) */

/* Pool fingerprint from the model fingerprint, the KV element type (a qtype value) and
 * BLOCKKEY_KV_VERSION. */
void blockkey_pool_fp(const uint8_t model_fp[32], int32_t dtype, uint8_t out[32]);
/* Parent key of the first block: zeros when n == 0 (no salt), else a hash of the salt. */
void blockkey_root(const void *salt, size_t n, uint8_t out[32]);
/* Key of one block from its parent key, its BLOCKKEY_TOKENS tokens and the pool fingerprint. */
void blockkey_compute(const uint8_t parent[32], const int32_t *tokens, const uint8_t pool_fp[32],
                      uint8_t out[32]);
/* Keys of the n_blocks full blocks of tokens (n_blocks * 128 of them), chained from root:
 * out[i] is the key of block i. */
void blockkey_chain(const uint8_t root[32], const int32_t *tokens, int n_blocks,
                    const uint8_t pool_fp[32], uint8_t (*out)[32]);
/* Lower-case hex (64 digits + NUL), and back (0 on success, -1 on a malformed string). */
void blockkey_hex(const uint8_t key[32], char out[BLOCKKEY_HEX]);
int blockkey_from_hex(const char *z, uint8_t out[32]);

#endif
