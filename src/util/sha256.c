/*
 * sha256: one EVP context per call, nothing shared between threads. See sha256.h.
 */
#include "util/sha256.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/evp.h>

static void sha256_fail(void)
{
    fprintf(stderr, "fatal: libcrypto could not compute a SHA-256 (out of memory)\n");
    abort();
}

void sha256_parts(const sha256_part *parts, int n, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c) sha256_fail();
    unsigned int len = 0;
    bool ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
    for (int i = 0; i < n && ok; i++) ok = EVP_DigestUpdate(c, parts[i].p, parts[i].n) == 1;
    ok = ok && EVP_DigestFinal_ex(c, out, &len) == 1 && len == 32;
    EVP_MD_CTX_free(c);
    if (!ok) sha256_fail();
}

void sha256_digest(const void *p, size_t n, uint8_t out[32])
{
    sha256_part one = { p, n };
    sha256_parts(&one, 1, out);
}
