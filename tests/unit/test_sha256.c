/*
 * test_sha256: the digest against FIPS 180-2's vectors, and parts hashing as their
 * concatenation (empty parts included).
 */
#include <string.h>

#include "harness.h"

#include "util/sha256.h"
#include "util/util.h"

static void hex_of(const uint8_t d[32], char out[65])
{
    util_hex(d, 32, out);
}

TEST(test_known_vectors)
{
    uint8_t d[32];
    char h[65];
    sha256_digest("abc", 3, d);
    hex_of(d, h);
    CHECKF(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "%s", h);
    sha256_digest("", 0, d);
    hex_of(d, h);
    CHECKF(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "%s", h);
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256_digest(two, strlen(two), d);
    hex_of(d, h);
    CHECKF(!strcmp(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "%s", h);
}

TEST(test_parts_are_the_concatenation)
{
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    uint8_t whole[32], split[32];
    sha256_digest(two, strlen(two), whole);
    sha256_part parts[] = { { two, 5 }, { "", 0 }, { two + 5, 20 }, { NULL, 0 }, { two + 25, strlen(two) - 25 } };
    sha256_parts(parts, 5, split);
    CHECK(!memcmp(whole, split, 32));
    sha256_parts(parts, 0, split);
    uint8_t empty[32];
    sha256_digest("", 0, empty);
    CHECK(!memcmp(empty, split, 32));
}

int main(void)
{
    RUN(test_known_vectors);
    RUN(test_parts_are_the_concatenation);
    HARNESS_END();
}
