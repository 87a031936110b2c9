/*
 * block: encode/verify the block file header (layout in block.h). Checksums come from ISA-L
 * (CRC-64/ECMA-refl for the payload, CRC-32C for headers), both several GB/s per core.
 */
#include "cache/block.h"

#include <stdlib.h>
#include <string.h>

#include <isa-l/crc.h>
#include <isa-l/crc64.h>

#include "util/util.h"

static const char block_magic[8] = "TMKVBLK";  /* + NUL */

const char *block_status_name(block_status st)
{
    switch (st) {
    case BLOCK_OK: return "ok";
    case BLOCK_ERR_SHORT: return "truncated";
    case BLOCK_ERR_MAGIC: return "bad magic";
    case BLOCK_ERR_VERSION: return "unknown version";
    case BLOCK_ERR_HEADER: return "bad header";
    case BLOCK_ERR_KEY: return "wrong key";
    case BLOCK_ERR_CHECKSUM: return "payload checksum mismatch";
    }
    return "?";
}

uint64_t block_crc64(const void *p, size_t n)
{
    return crc64_ecma_refl(0, (const unsigned char *)p, n);
}

uint32_t block_crc32c(const void *p, size_t n)
{
    uint32_t crc = 0;
    const unsigned char *b = p;
    while (n > 0) {   /* crc32_iscsi takes an int length */
        int len = n > (1u << 30) ? (1 << 30) : (int)n;
        crc = crc32_iscsi((unsigned char *)b, len, crc);
        b += len;
        n -= (size_t)len;
    }
    return crc;
}

void block_header_init(block_header *h, const uint8_t key[32], const uint8_t fp[32], uint32_t dtype,
                       int row_bytes, int n_layers, int n_kv_heads, int head_dim, int n_parts)
{
    memset(h, 0, sizeof *h);
    memcpy(h->key, key, 32);
    memcpy(h->fp, fp, 32);
    h->dtype = dtype;
    h->n_layers = (uint32_t)n_layers;
    h->n_kv_heads = (uint32_t)n_kv_heads;
    h->head_dim = (uint32_t)head_dim;
    h->n_tokens = 128;
    h->n_parts = (uint32_t)n_parts;
    h->layer_bytes = (uint32_t)((uint32_t)n_parts * (uint32_t)n_kv_heads * 128u * (uint32_t)row_bytes);
    h->payload_bytes = (uint64_t)h->n_layers * h->layer_bytes;
}

void block_header_init_layers(block_header *h, const uint8_t key[32], const uint8_t fp[32], uint32_t dtype,
                              int n_layers, int n_kv_heads, int head_dim, int n_parts, uint64_t payload_bytes)
{
    block_header_init(h, key, fp, dtype, 4, n_layers, n_kv_heads, head_dim, n_parts);
    h->layer_bytes = 0;
    h->payload_bytes = payload_bytes;
}

size_t block_file_bytes(const block_header *h)
{
    return BLOCK_HEADER_BYTES + (size_t)h->payload_bytes;
}

void *block_alloc(const block_header *h)
{
    size_t n = block_file_bytes(h);
    void *p = util_aligned_alloc(n);
    if (p) memset(p, 0, n);
    return p;
}

static void block_put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void block_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t block_get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t block_get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

void block_seal(block_header *h, void *file)
{
    uint8_t *b = file;
    h->payload_crc = block_crc64(b + BLOCK_HEADER_BYTES, (size_t)h->payload_bytes);
    memset(b, 0, BLOCK_HEADER_BYTES);
    memcpy(b, block_magic, 8);
    block_put32(b + 8, BLOCK_VERSION);
    block_put32(b + 12, BLOCK_HEADER_BYTES);
    memcpy(b + 16, h->key, 32);
    memcpy(b + 48, h->fp, 32);
    block_put32(b + 80, h->dtype);
    block_put32(b + 84, h->n_layers);
    block_put32(b + 88, h->n_kv_heads);
    block_put32(b + 92, h->head_dim);
    block_put32(b + 96, h->n_tokens);
    block_put32(b + 100, h->layer_bytes);
    block_put64(b + 104, h->payload_bytes);
    block_put64(b + 112, h->payload_crc);
    block_put32(b + 120, h->n_parts);
    block_put32(b + 124, h->geom);
    block_put32(b + 252, block_crc32c(b, 252));
}

block_status block_parse_header(const void *file, size_t n, block_header *h)
{
    const uint8_t *b = file;
    if (n < BLOCK_HEADER_BYTES) return BLOCK_ERR_SHORT;
    if (memcmp(b, block_magic, 8)) return BLOCK_ERR_MAGIC;
    const uint32_t version = block_get32(b + 8);
    if (version != 1 && version != BLOCK_VERSION) return BLOCK_ERR_VERSION;
    if (block_get32(b + 12) != BLOCK_HEADER_BYTES) return BLOCK_ERR_HEADER;
    if (block_get32(b + 252) != block_crc32c(b, 252)) return BLOCK_ERR_HEADER;
    block_header t;
    memcpy(t.key, b + 16, 32);
    memcpy(t.fp, b + 48, 32);
    t.dtype = block_get32(b + 80);
    t.n_layers = block_get32(b + 84);
    t.n_kv_heads = block_get32(b + 88);
    t.head_dim = block_get32(b + 92);
    t.n_tokens = block_get32(b + 96);
    t.layer_bytes = block_get32(b + 100);
    t.payload_bytes = block_get64(b + 104);
    t.payload_crc = block_get64(b + 112);
    t.n_parts = block_get32(b + 120);
    if (t.n_parts == 0) t.n_parts = 2;   /* written before the field existed */
    t.geom = version == 1 ? 0 : block_get32(b + 124);
    if (t.layer_bytes != 0 && t.payload_bytes != (uint64_t)t.n_layers * t.layer_bytes) return BLOCK_ERR_HEADER;
    /* each dimension bounded so that their product can neither wrap nor reach zero; a row of
     * head_dim values is whole bytes, from a quantised one (Q4_0: 18 bytes per 32 values) up to
     * f32's 4 per value */
    if (t.n_kv_heads == 0 || t.head_dim == 0 || t.n_tokens == 0 || t.n_parts > 2 ||
        t.n_kv_heads > BLOCK_DIM_MAX || t.head_dim > BLOCK_DIM_MAX || t.n_tokens > BLOCK_DIM_MAX)
        return BLOCK_ERR_HEADER;
    uint64_t rows = (uint64_t)t.n_parts * t.n_kv_heads * t.n_tokens, row = t.layer_bytes / rows;
    if (t.layer_bytes == 0) {
        /* layers of their own widths (version 2 only): the payload is bounded by every row at
         * the widest, in f32 */
        if (version == 1 || t.n_layers == 0 || t.n_layers > BLOCK_DIM_MAX || t.payload_bytes == 0 ||
            t.payload_bytes > (uint64_t)t.n_layers * rows * 4ull * t.head_dim)
            return BLOCK_ERR_HEADER;
    } else if (t.layer_bytes % rows != 0 || row * 2 < t.head_dim || row > 4ull * t.head_dim) {
        return BLOCK_ERR_HEADER;
    }
    if (h) *h = t;
    return BLOCK_OK;
}

block_status block_verify(const void *file, size_t n, const uint8_t *key, block_header *h)
{
    block_header t;
    block_status st = block_parse_header(file, n, &t);
    if (st != BLOCK_OK) return st;
    if (key && memcmp(key, t.key, 32)) return BLOCK_ERR_KEY;
    if (n != BLOCK_HEADER_BYTES + t.payload_bytes)
        return n < BLOCK_HEADER_BYTES + t.payload_bytes ? BLOCK_ERR_SHORT : BLOCK_ERR_HEADER;
    if (block_crc64((const uint8_t *)file + BLOCK_HEADER_BYTES, (size_t)t.payload_bytes) != t.payload_crc)
        return BLOCK_ERR_CHECKSUM;
    if (h) *h = t;
    return BLOCK_OK;
}
