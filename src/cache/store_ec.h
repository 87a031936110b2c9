/*
 * store_ec: the `ec:K+M:T1,...` backend: each block file is cut into K data fragments and
 * M Reed-Solomon parity fragments (Intel ISA-L, a Cauchy matrix so any K of the K+M suffice),
 * one per dir target (store_dir.h), each fragment with its own header and checksum.
 *
 * DESIGN. Fragment i of a block lives on target (i + r) mod (K+M), r = a byte of the key, so
 * data and parity spread over all targets. Each target has its own I/O thread and job queue
 * (a slow or dead target only delays itself). A read asks the K data targets and one parity
 * target at once and decodes from the first K good replies; a missing or corrupt fragment
 * (checksum, wrong key, wrong geometry) is counted, deleted and replaced by asking another
 * target, so up to M bad fragments lose nothing. When a data fragment is missing, the decode
 * matrix for that set of surviving fragments is built once (invert the K x K submatrix of the
 * encode matrix) and cached per loss pattern. Late replies are dropped (the read context is
 * reference-counted). A put writes all K+M fragments in parallel; it succeeds when at least K
 * were written (fewer would be unreadable: those are deleted again).
 *
 * Fragment file: a 128-byte header (magic "TMECFRG", version, k, m, index, block bytes,
 * fragment bytes, key, payload CRC-64, header CRC-32C) then the fragment bytes.
 */
#ifndef TM_STORE_EC_H
#define TM_STORE_EC_H

#include <stddef.h>
#include <stdint.h>

#include "cache/store.h"
#include "cache/store_dir.h"

#define STORE_EC_MAX 32            /* K + M at most */
#define STORE_EC_FRAG_HEADER 128

typedef struct store_ec store_ec;

typedef struct {
    uint64_t n_frag_missing;   /* fragments absent when asked for */
    uint64_t n_frag_corrupt;   /* fragments that failed verification (deleted) */
    uint64_t n_decode;         /* reads that needed decoding */
    uint64_t n_decode_cached;  /* of those: decode tables found in the cache */
    uint64_t n_degraded_put;   /* puts that wrote K..K+M-1 fragments */
    uint64_t n_lost;           /* reads with fewer than K good fragments */
} store_ec_counters;

/* Opens K+M targets (paths, "dir:" prefix allowed). Targets that cannot be opened are
 * logged and left out; STORE_IO when fewer than K remain. */
store_status store_ec_open(int k, int m, char **targets, const store_dir_opts *opts, store_ec **out);
void store_ec_close(store_ec *e);
/* A block file of n bytes under key; STORE_OK when >= K fragments were written. */
store_status store_ec_put(store_ec *e, const uint8_t key[32], const void *file, size_t n, double ttl_s);
/* Reassembles key's block file into *out (64-byte aligned, free()). STORE_MISS when fewer
 * than K good fragments exist (the remaining ones are then deleted). */
store_status store_ec_get(store_ec *e, const uint8_t key[32], double ttl_s, void **out, size_t *n);
/* True when at least K fragments exist. */
bool store_ec_exists(store_ec *e, const uint8_t key[32]);
/* Deletes all fragments; STORE_MISS when none existed. */
store_status store_ec_delete(store_ec *e, const uint8_t key[32]);
/* The first n bytes of key's block file into buf, from data fragment 0 (its fragment header
 * checked, the fragment not), without touching or counting anything: inspection of a block's
 * header. STORE_MISS when that fragment is absent, damaged or shorter than n. */
store_status store_ec_peek(store_ec *e, const uint8_t key[32], void *buf, size_t n);
int store_ec_n_targets(const store_ec *e);
/* Target i, or NULL when it could not be opened. */
store_dir *store_ec_target(store_ec *e, int i);
void store_ec_geometry(const store_ec *e, int *k, int *m);
void store_ec_get_counters(store_ec *e, store_ec_counters *c);
/* Checks one fragment file's bytes (header, key when not NULL, checksum); fills index. */
bool store_ec_frag_verify(const store_ec *e, const void *p, size_t n, const uint8_t *key, int *index);
/* Target index holding fragment i of key. */
int store_ec_frag_target(const store_ec *e, const uint8_t key[32], int i);

/* Plain Reed-Solomon over buffers, for the benchmark: encode k data buffers of len bytes into
 * m parity buffers with a Cauchy matrix. */
void store_ec_encode_raw(int k, int m, int len, uint8_t **data, uint8_t **parity);

#endif
