/*
 * modelhash: the SHA-256 of every byte of a model file, computed once per file and kept in a
 * cache directory, so that a later start pays one stat() instead of reading the whole file.
 *
 * Why every byte: the model fingerprint (model.h) keys the KV blocks shared between processes,
 * machines and restarts. Two files that differ anywhere (an embedding row in the middle of a
 * tensor) compute different KV, so any sampling of the bytes lets one model reuse another's
 * blocks and answer differently.
 *
 * Digest: the file is cut into MODELHASH_CHUNK-byte chunks, up to MODELHASH_MAX_THREADS
 * threads hash them (SHA-256 is sequential within one stream, so one stream would be bound by
 * one core), and the result is SHA-256(tag, file size, the chunk digests in order).
 *
 * Cache: one entry per file, DIR/fp/<dev>-<ino>, where DIR is $TOKENMILL_CACHE_DIR, else
 * $XDG_CACHE_HOME/tokenmill, else $HOME/.cache/tokenmill. The entry is one line
 *   tokenmill-modelhash-v1 <dev> <ino> <size> <mtime s.ns> <ctime s.ns> <64 hex>
 * and is untrusted input: at most 255 bytes are read, the line is parsed strictly, and it is
 * used only when every field equals the file's stat taken when it was opened. ctime changes
 * on every write to the file and cannot be set by its owner, so a file rewritten in place
 * (even with its mtime restored) never matches. An entry is written (temporary file, rename,
 * mode 0600) only for a file whose ctime is older than the start of the hash and whose stat
 * after hashing still equals the one at open: a file changed within the same clock tick as
 * the hash began is hashed again at its next load rather than risk a stale entry. Any failure
 * to read or write the cache only costs a hash; it is never an error.
 */
#ifndef TM_MODELHASH_H
#define TM_MODELHASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/stat.h>

#define MODELHASH_CHUNK ((size_t)64 << 20)  /* bytes per chunk digest */
#define MODELHASH_MAX_THREADS 16

typedef struct {
    bool from_cache;   /* the digest came from a valid cache entry */
    bool cached;       /* a cache entry was written */
    double seconds;    /* time spent hashing (0 from the cache) */
} modelhash_info;

/* Digest of the size bytes at map (the whole file PATH, whose stat at open is st) into out.
 * Uses and fills the cache unless use_cache is false. Returns true (a libcrypto failure
 * aborts, util/sha256.h). info may be NULL. */
bool modelhash_file(const char *path, const void *map, size_t size, const struct stat *st, bool use_cache,
                    uint8_t out[32], modelhash_info *info);

/* The cache directory (no trailing slash) into buf; false when no environment names one. */
bool modelhash_cache_dir(char *buf, size_t bufsz);

#endif
