/*
 * sha256: the one SHA-256 call (libcrypto underneath) for keys, fingerprints and digests.
 *
 * Failure policy: libcrypto's digest fails only when it cannot allocate its context; like
 * xmalloc, that aborts with a message instead of leaving every caller to invent a digest
 * (a zeroed or all-ones key that two inputs would then share).
 */
#ifndef TM_SHA256_H
#define TM_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const void *p;   /* bytes */
    size_t n;        /* their number */
} sha256_part;

/* out = SHA-256 of the n parts' concatenation. */
void sha256_parts(const sha256_part *parts, int n, uint8_t out[32]);
/* out = SHA-256 of p[0..n). */
void sha256_digest(const void *p, size_t n, uint8_t out[32]);

#endif
