/*
 * fuzz_block: the block file reader on arbitrary files. The first input byte is a flag byte,
 * the rest is the file. With bit 0 set the harness seals the checksums (the header's CRC-32C
 * and the payload's CRC-64) over the fuzzed bytes first, so the fuzzer reaches the shape and
 * size checks behind them instead of stopping at a checksum it cannot guess.
 *
 * The file is checked directly (block_parse_header, block_verify with and without the key),
 * then planted in a directory store under the key its header names (store_dir_putv writes raw
 * bytes) and read back through the store's three read paths, each of which verifies it and
 * deletes it when corrupt: store_get, store_get_into, store_get_mapped.
 */
#include "fuzz.h"

#include <sys/uio.h>

#include "cache/block.h"
#include "cache/store.h"
#include "cache/store_dir.h"

static store *st;
static store_dir *dir;   /* a second handle on st's directory, to plant raw files */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    const char *root = fuzz_tmpdir();
    if (store_open(root, NULL, &st) != STORE_OK) fuzz_die("store_open", root);
    store_dir_opts o = { .ext = "blk" };
    if (store_dir_open(root, &o, &dir) != STORE_OK) fuzz_die("store_dir_open", root);
    return 0;
}

static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool seal = data[0] & 1;
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);   /* exactly n bytes, so ASan sees a read past the file */
    memcpy(file, data + 1, n);
    if (seal && n >= BLOCK_HEADER_BYTES) {
        put_u64(file + 112, block_crc64(file + BLOCK_HEADER_BYTES, n - BLOCK_HEADER_BYTES));
        put_u32(file + 252, block_crc32c(file, 252));
    }
    uint8_t key[32] = { 0 };
    if (n >= 48) memcpy(key, file + 16, 32);

    block_header h;
    block_parse_header(file, n, &h);
    block_verify(file, n, NULL, &h);
    block_status bs = block_verify(file, n, key, &h);
    if (bs == BLOCK_OK && n != block_file_bytes(&h)) {
        fprintf(stderr, "block: a verified file of %zu bytes whose header says %zu\n", n, block_file_bytes(&h));
        abort();
    }

    struct iovec iov = { file, n };
    if (store_dir_putv(dir, key, &iov, 1, 3600) == STORE_OK) {
        void *out;
        size_t len;
        store_status gs = store_get(st, key, 0, &out, &len);
        if ((gs == STORE_OK) != (bs == BLOCK_OK) || (gs == STORE_OK && (len != n || memcmp(out, file, n)))) {
            fprintf(stderr, "block: store_get says %s for a file block_verify calls %s\n", store_status_name(gs),
                    block_status_name(bs));
            abort();
        }
        free(out);
        store_dir_putv(dir, key, &iov, 1, 3600);
        size_t cap = n < 8192 ? 8192 : n;
        void *buf = aligned_alloc(64, (cap + 63) / 64 * 64);
        store_get_into(st, key, 0, buf, cap, &len);
        store_get_into(st, key, 0, buf, n / 2, &len);   /* a buffer too small for it */
        free(buf);
        store_dir_putv(dir, key, &iov, 1, 3600);
        const void *map;
        if (store_get_mapped(st, key, 0, &map, &len) == STORE_OK) store_unmap(map, len);
        store_delete(st, key);
    }
    free(file);
    return 0;
}
