/*
 * test_bytebuf: the growable buffer's fallible calls. bytebuf_try_reserve / bytebuf_try_append
 * grow and NUL-terminate like the plain ones, and answer false, with the buffer untouched,
 * when the size overflows or the memory cannot be had (the plain calls would abort there).
 */
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>

#include "util/bytebuf.h"

/* An impossible allocation must come back as NULL under ASan too, not end the test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

TEST(test_try_append_grows)
{
    bytebuf b = { 0 };
    CHECK(bytebuf_try_append(&b, NULL, 0));   /* nothing: still a valid empty string */
    CHECK(b.p && b.len == 0 && b.p[0] == 0);
    for (int i = 0; i < 1000; i++) CHECK(bytebuf_try_append(&b, "abc", 3));
    CHECK(b.len == 3000 && b.cap > 3000 && b.p[3000] == 0);
    CHECK(!memcmp(b.p + 2997, "abc", 3));
    bytebuf_puts(&b, "z");   /* the plain calls on the same buffer */
    CHECK(b.len == 3001 && !strcmp(b.p + 2997, "abcz"));
    CHECK(bytebuf_try_reserve(&b, 100) && b.cap >= b.len + 101);
    bytebuf_free(&b);
    CHECK(!b.p && !b.len && !b.cap);
}

TEST(test_try_fails_cleanly)
{
    bytebuf b = { 0 };
    bytebuf_puts(&b, "keep");
    char *p = b.p;
    size_t cap = b.cap;
    /* len + extra + 1 overflows size_t */
    CHECK(!bytebuf_try_reserve(&b, SIZE_MAX));
    CHECK(!bytebuf_try_reserve(&b, SIZE_MAX - 4));
    CHECK(!bytebuf_try_append(&b, "x", SIZE_MAX - 3));
    /* representable, but no machine has it */
    CHECK(!bytebuf_try_reserve(&b, SIZE_MAX / 4));
    CHECK(!bytebuf_try_append(&b, "x", SIZE_MAX / 2));
    CHECK(b.p == p && b.cap == cap && b.len == 4 && !strcmp(b.p, "keep"));
    CHECK(bytebuf_try_append(&b, "!", 1) && !strcmp(b.p, "keep!"));
    bytebuf_free(&b);
}

int main(void)
{
    RUN(test_try_append_grows);
    RUN(test_try_fails_cleanly);
    HARNESS_END();
}
