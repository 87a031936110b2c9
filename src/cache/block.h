/*
 * block: the file format of one stored 128-token KV block.
 *
 * DESIGN. A block file is a 256-byte header followed by the payload. The payload is the K and
 * V of every layer for the block's tokens, laid out [layer][k|v][kv_head][token][head_dim]
 * (the kvpool block layout; [layer][kv_head][token][head_dim] when one row serves as K and V,
 * multi-head latent attention's, n_parts 1), so layer l is the contiguous range
 * [l * layer_bytes, (l + 1) * layer_bytes) and a loader can hand layers to compute one by one.
 * A pool whose layers have rows of their own widths writes layer_bytes 0 and head_dim its widest
 * row; the layers' ranges are then the reader's pool geometry, which the geometry digest pins:
 * a reader refuses a block whose digest is not its pool's.
 * Header (little-endian):
 *     0  magic "TMKVBLK\0"          8 bytes
 *     8  version (2; 1 reads as geometry digest 0)  u32
 *    12  header bytes (256)         u32
 *    16  key                        32 bytes (blockkey.h)
 *    48  pool fingerprint           32 bytes (model fingerprint + KV dtype)
 *    80  dtype (qtype)              u32
 *    84  n_layers, n_kv_heads, head_dim, n_tokens   4 x u32
 *   100  layer_bytes                u32 (K and V of one layer; 0: per-layer widths)
 *   104  payload_bytes              u64 (= n_layers * layer_bytes, when layer_bytes is not 0)
 *   112  payload checksum           u64 (CRC-64/ECMA, reflected; ISA-L)
 *   120  n_parts                    u32 (2: K and V; 1: V is K; 0 in older files means 2)
 *   124  geometry digest            u32 (kvpool_block_geom of the writer's pool)
 *   128  zeros up to 252
 *   252  header checksum            u32 (CRC-32C of bytes [0, 252))
 * A block is immutable once written: its bytes are a function of its key. Every reader checks
 * magic, version, header checksum, shape consistency, the key it asked for, the file size and
 * the payload checksum (block_verify) and treats any failure as corruption.
 */
#ifndef TM_BLOCK_H
#define TM_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#define BLOCK_HEADER_BYTES 256
#define BLOCK_VERSION 2
#define BLOCK_DIM_MAX 65536   /* most KV heads, head width or tokens a block header may declare */

typedef enum {
    BLOCK_OK = 0,
    BLOCK_ERR_SHORT,     /* fewer bytes than the header or the header's sizes promise */
    BLOCK_ERR_MAGIC,     /* not a block file */
    BLOCK_ERR_VERSION,   /* a format version we do not read */
    BLOCK_ERR_HEADER,    /* header checksum or inconsistent shape */
    BLOCK_ERR_KEY,       /* a valid block, but for another key */
    BLOCK_ERR_CHECKSUM,  /* payload checksum mismatch */
} block_status;

typedef struct {
    uint8_t key[32];         /* block key */
    uint8_t fp[32];          /* pool fingerprint (blockkey_pool_fp) */
    uint32_t dtype;          /* qtype of K/V elements */
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t n_tokens;       /* 128 */
    uint32_t n_parts;        /* rows per (layer, kv head, token): 2 (K, V) or 1 (V is K) */
    uint32_t layer_bytes;    /* bytes of K and V of one layer; 0: layers of different widths */
    uint32_t geom;           /* digest of the writer's block geometry (kvpool_block_geom); 0 in
                              * version-1 files */
    uint64_t payload_bytes;  /* n_layers * layer_bytes, or (layer_bytes 0) the layers' sum */
    uint64_t payload_crc;    /* CRC-64/ECMA-refl of the payload */
} block_header;

const char *block_status_name(block_status st);

/* Fills the shape fields of h (key and fp are the caller's) for rows of row_bytes bytes (head_dim
 * values in dtype: 2 or 4 bytes each, or Q8_0 / Q4_0 blocks) and n_parts (2: K and V, 1: V is K)
 * rows per (layer, kv head, token). */
void block_header_init(block_header *h, const uint8_t key[32], const uint8_t fp[32], uint32_t dtype,
                       int row_bytes, int n_layers, int n_kv_heads, int head_dim, int n_parts);
/* The same for a pool whose layers have rows of different widths: head_dim is the widest row,
 * layer_bytes 0, the payload payload_bytes. */
void block_header_init_layers(block_header *h, const uint8_t key[32], const uint8_t fp[32], uint32_t dtype,
                              int n_layers, int n_kv_heads, int head_dim, int n_parts, uint64_t payload_bytes);
/* Total file bytes (header + payload). */
size_t block_file_bytes(const block_header *h);
/* A zeroed, 64-byte aligned buffer of block_file_bytes(h) bytes (free with free()), payload at
 * +BLOCK_HEADER_BYTES. NULL when out of memory. */
void *block_alloc(const block_header *h);
/* Payload of a block file buffer. */
static inline void *block_payload(void *file) { return (uint8_t *)file + BLOCK_HEADER_BYTES; }
/* After the payload at file + BLOCK_HEADER_BYTES is written: computes its checksum into h and
 * writes the header to file[0, BLOCK_HEADER_BYTES). */
void block_seal(block_header *h, void *file);
/* Parses and checks the header only (magic, version, header checksum, shape). */
block_status block_parse_header(const void *file, size_t n, block_header *h);
/* Full check of a whole file of n bytes: header, key (when key is not NULL), size, payload
 * checksum. Fills h when not NULL. */
block_status block_verify(const void *file, size_t n, const uint8_t *key, block_header *h);

/* CRC helpers shared by the store (ISA-L). */
uint64_t block_crc64(const void *p, size_t n);
uint32_t block_crc32c(const void *p, size_t n);

#endif
