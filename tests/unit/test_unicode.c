/*
 * test_unicode: util/unicode.c. The lenient decoder's llama.cpp conventions (what becomes
 * U+FFFD and how many bytes it consumes; overlong forms and surrogates decoded to their
 * value), the encoder, the general-category flags of chosen code points, the GPT-2 byte map
 * both ways, and the strict UTF-8 checks and repair for what crosses the API (one U+FFFD per
 * maximal subpart).
 */
#include "harness.h"

#include <stdint.h>

#include "util/unicode.h"

/* Decodes s[0..len) from 0; true when it gives exactly the code points want[0..n) and
 * consumes len bytes. */
static bool decodes_to(const char *s, size_t len, const uint32_t *want, int n)
{
    size_t pos = 0;
    int i = 0;
    while (pos < len) {
        uint32_t c = unicode_decode(s, len, &pos);
        if (i >= n || c != want[i]) {
            fprintf(stderr, "  decode of code point %d gave U+%04X\n", i, c);
            return false;
        }
        i++;
    }
    return i == n && pos == len;
}

TEST(test_decode_lenient)
{
    CHECK(decodes_to("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10, (const uint32_t[]){'a', 0xE9, 0x20AC, 0x1F600}, 4));
    /* a stray continuation byte, a truncated sequence and 0xF8..0xFF: U+FFFD, one byte each */
    CHECK(decodes_to("\x80x", 2, (const uint32_t[]){0xFFFD, 'x'}, 2));
    CHECK(decodes_to("\xE2\x82", 2, (const uint32_t[]){0xFFFD, 0xFFFD}, 2));
    CHECK(decodes_to("\xE2\x82x", 3, (const uint32_t[]){0xFFFD, 0xFFFD, 'x'}, 3));
    CHECK(decodes_to("\xF8\xFF", 2, (const uint32_t[]){0xFFFD, 0xFFFD}, 2));
    /* overlong forms and surrogates are not rejected: their value (llama.cpp's unicode.cpp) */
    CHECK(decodes_to("\xC0\x80", 2, (const uint32_t[]){0}, 1));
    CHECK(decodes_to("\xED\xA0\x80", 3, (const uint32_t[]){0xD800}, 1));
    /* above U+10FFFF: one U+FFFD for the whole four bytes */
    CHECK(decodes_to("\xF4\x90\x80\x80", 4, (const uint32_t[]){0xFFFD}, 1));
}

TEST(test_encode)
{
    char o[4];
    CHECK(unicode_encode('A', o) == 1 && o[0] == 'A');
    CHECK(unicode_encode(0xE9, o) == 2 && !memcmp(o, "\xC3\xA9", 2));
    CHECK(unicode_encode(0x7FF, o) == 2 && !memcmp(o, "\xDF\xBF", 2));
    CHECK(unicode_encode(0x800, o) == 3 && !memcmp(o, "\xE0\xA0\x80", 3));
    CHECK(unicode_encode(0x20AC, o) == 3 && !memcmp(o, "\xE2\x82\xAC", 3));
    CHECK(unicode_encode(0x10000, o) == 4 && !memcmp(o, "\xF0\x90\x80\x80", 4));
    CHECK(unicode_encode(0x10FFFF, o) == 4 && !memcmp(o, "\xF4\x8F\xBF\xBF", 4));
    CHECK(unicode_encode(0x110000, o) == 3 && !memcmp(o, "\xEF\xBF\xBD", 3));
    /* every code point round-trips through the decoder */
    for (uint32_t c = 0; c <= 0x10FFFF; c += 0x3FF) {
        size_t pos = 0;
        int n = unicode_encode(c, o);
        CHECKF(unicode_decode(o, (size_t)n, &pos) == c && pos == (size_t)n, "U+%04X", c);
    }
    CHECK(unicode_len_utf8(0x41) == 1 && unicode_len_utf8(0xC3) == 2 && unicode_len_utf8(0xE2) == 3 &&
          unicode_len_utf8(0xF0) == 4 && unicode_len_utf8(0x80) == 1);
}

TEST(test_flags)
{
    const struct { uint32_t cpt, flags; } want[] = {
        {'A', UNICODE_FLAG_LETTER},
        {0x4E2D, UNICODE_FLAG_LETTER},                          /* 中 */
        {'7', UNICODE_FLAG_NUMBER},
        {0x0663, UNICODE_FLAG_NUMBER},                          /* Arabic-Indic three */
        {0x2167, UNICODE_FLAG_NUMBER},                          /* Roman numeral eight (Nl) */
        {' ', UNICODE_FLAG_SEPARATOR | UNICODE_FLAG_WHITESPACE},
        {0x00A0, UNICODE_FLAG_SEPARATOR | UNICODE_FLAG_WHITESPACE},
        {0x3000, UNICODE_FLAG_SEPARATOR | UNICODE_FLAG_WHITESPACE},
        {'\n', UNICODE_FLAG_CONTROL | UNICODE_FLAG_WHITESPACE},
        {0x0085, UNICODE_FLAG_CONTROL | UNICODE_FLAG_WHITESPACE},
        {0x0000, UNICODE_FLAG_CONTROL},
        {0x200B, UNICODE_FLAG_CONTROL},                         /* zero width space: Cf, not White_Space */
        {0x0301, UNICODE_FLAG_MARK},                            /* combining acute */
        {'!', UNICODE_FLAG_PUNCTUATION},
        {0x3002, UNICODE_FLAG_PUNCTUATION},                     /* ideographic full stop */
        {'+', UNICODE_FLAG_SYMBOL},
        {'$', UNICODE_FLAG_SYMBOL},
        {0x1F600, UNICODE_FLAG_SYMBOL},                         /* 😀 */
        {0x0378, UNICODE_FLAG_UNDEFINED},                       /* unassigned */
        {0x110000, UNICODE_FLAG_UNDEFINED},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECKF(unicode_flags(want[i].cpt) == want[i].flags, "U+%04X: 0x%x, want 0x%x", want[i].cpt,
               unicode_flags(want[i].cpt), want[i].flags);
}

TEST(test_gpt2_byte_map)
{
    /* printable bytes stand for themselves; the 68 others move to U+0100.. in byte order */
    CHECK(unicode_byte_to_cpt('a') == 'a' && unicode_byte_to_cpt('!') == '!' && unicode_byte_to_cpt('~') == '~');
    CHECK(unicode_byte_to_cpt(0xA1) == 0xA1 && unicode_byte_to_cpt(0xAC) == 0xAC && unicode_byte_to_cpt(0xAE) == 0xAE &&
          unicode_byte_to_cpt(0xFF) == 0xFF);
    CHECK(unicode_byte_to_cpt(0x00) == 0x100 && unicode_byte_to_cpt('\n') == 0x10A && unicode_byte_to_cpt(' ') == 0x120);
    CHECK(unicode_byte_to_cpt(0x7F) == 0x121 && unicode_byte_to_cpt(0xA0) == 0x142 && unicode_byte_to_cpt(0xAD) == 0x143);
    bool seen[0x144] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t c = unicode_byte_to_cpt((uint8_t)b);
        CHECKF(c < 0x144 && !seen[c] && unicode_cpt_to_byte(c) == b, "byte %d", b);
        if (c < 0x144) seen[c] = true;
    }
    CHECK(unicode_cpt_to_byte(0x144) == -1 && unicode_cpt_to_byte(0x20) == -1 && unicode_cpt_to_byte(0x4E2D) == -1);
}

static bool repaired_is(const char *in, size_t n, const char *want)
{
    char out[64];
    size_t m = unicode_utf8_repair(in, n, out);
    bool ok = m == strlen(want) && !memcmp(out, want, m);
    if (!ok) fprintf(stderr, "  repair gave %.*s, want %s\n", (int)m, out, want);
    return ok;
}

TEST(test_utf8_repair)
{
    /* one U+FFFD per maximal subpart, as WHATWG decoders (and llama.cpp's server) do */
    CHECK(repaired_is("\xE2\x82" "A", 3, "\xEF\xBF\xBD" "A"));
    CHECK(repaired_is("\xE2" "ab", 3, "\xEF\xBF\xBD" "ab"));
    CHECK(repaired_is("\xF0\x9D\x84\xF0\x9D\x84\x9E", 7, "\xEF\xBF\xBD" "\xF0\x9D\x84\x9E"));
    CHECK(repaired_is("\xC0\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"));             /* overlong */
    CHECK(repaired_is("\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD")); /* surrogate */
    CHECK(repaired_is("\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD")); /* > U+10FFFF */
    CHECK(repaired_is("\x9E", 1, "\xEF\xBF\xBD"));
    CHECK(repaired_is("h\xC3\xA9!", 4, "h\xC3\xA9!"));
    CHECK(repaired_is("", 0, ""));
}

TEST(test_utf8_strict)
{
    bool ok, inc;
    CHECK(unicode_utf8_next("\xE2\x82\xAC", 3, &ok, &inc) == 3 && ok && !inc);
    CHECK(unicode_utf8_next("\xE2\x82", 2, &ok, &inc) == 2 && !ok && inc);       /* cut by the end */
    CHECK(unicode_utf8_next("\xE2\x82" "A", 3, &ok, &inc) == 2 && !ok && !inc);  /* cut by a byte */
    CHECK(unicode_utf8_next("\xE0\x80\x80", 3, &ok, &inc) == 1 && !ok && !inc);  /* overlong */
    CHECK(unicode_utf8_next("\xC1\xBF", 2, &ok, &inc) == 1 && !ok);
    CHECK(unicode_utf8_next("\xF5", 1, &ok, &inc) == 1 && !ok && !inc);
    /* what may still become a character, at the end */
    CHECK(unicode_utf8_tail("ab\xE2\x82", 4) == 2 && unicode_utf8_tail("ab\xE2\x82\xAC", 5) == 0);
    CHECK(unicode_utf8_tail("\xF0\x9D\x84", 3) == 3 && unicode_utf8_tail("\xC0", 1) == 0 && unicode_utf8_tail("\xF4\x90", 2) == 0);
    CHECK(unicode_utf8_tail("", 0) == 0 && unicode_utf8_tail("abc", 3) == 0);
    CHECK(unicode_utf8_valid("\xF0\x9D\x84\x9E", 4) && !unicode_utf8_valid("\xF0\x9D\x84", 3) && !unicode_utf8_valid("\xE0\x80\x80", 3));
    CHECK(unicode_utf8_valid("\xF4\x8F\xBF\xBF", 4) && !unicode_utf8_valid("\xF4\x90\x80\x80", 4));
    CHECK(unicode_utf8_valid("\xED\x9F\xBF", 3) && !unicode_utf8_valid("\xED\xA0\x80", 3));
    CHECK(unicode_utf8_valid("", 0) && !unicode_utf8_valid("a\x80", 2));
}

/* The three-byte blanks the template interpreters share: each one found with its length, the
 * code points next to them and a truncated sequence not. */
TEST(test_space3)
{
    static const char *yes[] = { "\u1680", "\u2000", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff" };
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) CHECKF(unicode_space3_at(yes[i], 3) == 3, "%zu", i);
    static const char *no[] = { "\u200b", "\u2027", "\u202e", "\u2060", "\u3001", "\ufefe", " ab", "\u00a0x" };
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) CHECKF(unicode_space3_at(no[i], strlen(no[i])) == 0, "%zu", i);
    CHECK(unicode_space3_at("\u3000", 2) == 0);
    CHECK(unicode_space3_at("", 0) == 0);
}

int main(void)
{
    RUN(test_decode_lenient);
    RUN(test_encode);
    RUN(test_flags);
    RUN(test_gpt2_byte_map);
    RUN(test_utf8_repair);
    RUN(test_utf8_strict);
    RUN(test_space3);
    HARNESS_END();
}
