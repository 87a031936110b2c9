/*
 * test_gguf: the GGUF reader and writer. A write -> read round trip of every value type and
 * several tensor types, then hand-built bad files (truncated at every byte of the header
 * region, bad magic/version, tensors out of bounds or misaligned, unknown types, bad shapes,
 * absurd lengths and counts), each of which must fail with its own status and a message.
 * Runs under ASan/UBSan too (make san), which is what "no read past the mapping" is checked by.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "model/gguf.h"
#include "util/util.h"

static char tpath[256];

static void tpath_init(void)
{
    snprintf(tpath, sizeof tpath, "/tmp/tm_test_gguf_%d.gguf", (int)getpid());
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static gguf_status open_bytes(const void *p, size_t n, char *err, size_t errsz)
{
    write_bytes(tpath, p, n);
    gguf *g = NULL;
    gguf_status st = gguf_open(tpath, &g, err, errsz);
    if (g) gguf_close(g);
    return st;
}

/* ---- round trip ---------------------------------------------------------------------- */

static void fill_pattern(void *ctx, const char *name, void *dst, size_t nbytes)
{
    (void)name;
    uint8_t base = (uint8_t)(uintptr_t)ctx;
    for (size_t i = 0; i < nbytes; i++) ((uint8_t *)dst)[i] = (uint8_t)(base + i * 7);
}

TEST(test_roundtrip)
{
    gguf_writer *w = gguf_writer_new();
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    int64_t i64 = -5000000000LL; double f64 = 3.25e100;
    gguf_writer_set_scalar(w, "t.u8", GGUF_VT_UINT8, &u8);
    gguf_writer_set_scalar(w, "t.i8", GGUF_VT_INT8, &i8);
    gguf_writer_set_scalar(w, "t.u16", GGUF_VT_UINT16, &u16);
    gguf_writer_set_scalar(w, "t.i16", GGUF_VT_INT16, &i16);
    gguf_writer_set_u32(w, "t.u32", 4000000000u);
    gguf_writer_set_i32(w, "t.i32", -2000000000);
    gguf_writer_set_f32(w, "t.f32", 1.5f);
    gguf_writer_set_bool(w, "t.bool", true);
    gguf_writer_set_str(w, "t.str", "hello \xe2\x96\x81world");
    gguf_writer_set_u64(w, "t.u64", 1ULL << 40);
    gguf_writer_set_scalar(w, "t.i64", GGUF_VT_INT64, &i64);
    gguf_writer_set_scalar(w, "t.f64", GGUF_VT_FLOAT64, &f64);
    gguf_writer_set_str(w, "t.replaced", "first");
    gguf_writer_set_str(w, "t.replaced", "second");
    /* one byte string key first so that later numeric arrays land unaligned in the file */
    gguf_writer_set_str(w, "t.odd", "x");
    const char *strs[] = { "a", "", "<0x0A>", "\xe2\x96\x81the" };
    gguf_writer_set_arr_str(w, "t.astr", strs, NULL, 4);
    int32_t ai32[] = { -1, 0, 7, 2147483647 };
    gguf_writer_set_arr_i32(w, "t.ai32", ai32, 4);
    float af32[] = { 0.5f, -2.0f, 1e-5f };
    gguf_writer_set_arr_f32(w, "t.af32", af32, 3);
    uint8_t au8[] = { 1, 2, 3 };
    gguf_writer_set_arr(w, "t.au8", GGUF_VT_UINT8, au8, 3);
    int16_t ai16[] = { -3, 4 };
    gguf_writer_set_arr(w, "t.ai16", GGUF_VT_INT16, ai16, 2);
    uint64_t au64[] = { 1, 1ULL << 63 };
    gguf_writer_set_arr(w, "t.au64", GGUF_VT_UINT64, au64, 2);
    double af64[] = { 1.0 / 3 };
    gguf_writer_set_arr(w, "t.af64", GGUF_VT_FLOAT64, af64, 1);
    uint8_t abool[] = { 1, 0 };
    gguf_writer_set_arr(w, "t.abool", GGUF_VT_BOOL, abool, 2);
    gguf_writer_set_arr_i32(w, "t.aempty", NULL, 0);

    float f[2 * 3] = { 1, 2, 3, 4, 5, 6 };
    int64_t ne_f[2] = { 3, 2 };
    gguf_writer_add_tensor(w, "f32.weight", QTYPE_F32, 2, ne_f, f, sizeof f);
    int64_t ne_q8[2] = { 64, 3 };
    gguf_writer_add_tensor_fill(w, "q8.weight", QTYPE_Q8_0, 2, ne_q8, fill_pattern, (void *)(uintptr_t)3);
    int64_t ne_q4k[3] = { 512, 2, 2 };
    gguf_writer_add_tensor_fill(w, "q4k.weight", QTYPE_Q4_K, 3, ne_q4k, fill_pattern, (void *)(uintptr_t)5);
    int64_t ne_1[1] = { 7 };
    gguf_writer_add_tensor_fill(w, "f16.bias", QTYPE_F16, 1, ne_1, fill_pattern, (void *)(uintptr_t)9);
    int64_t ne_q6[2] = { 256, 1 };
    gguf_writer_add_tensor_fill(w, "q6.weight", QTYPE_Q6_K, 2, ne_q6, fill_pattern, (void *)(uintptr_t)11);
    int64_t ne_q40[4] = { 32, 1, 2, 3 };
    gguf_writer_add_tensor_fill(w, "q40.weight", QTYPE_Q4_0, 4, ne_q40, fill_pattern, (void *)(uintptr_t)13);
    int64_t ne_bf[2] = { 5, 5 };
    gguf_writer_add_tensor_fill(w, "bf16.weight", QTYPE_BF16, 2, ne_bf, fill_pattern, (void *)(uintptr_t)17);

    char err[256];
    CHECK(gguf_writer_write(w, tpath, err, sizeof err) == GGUF_OK);
    gguf_writer_free(w);

    gguf *g = NULL;
    gguf_status st = gguf_open(tpath, &g, err, sizeof err);
    CHECKF(st == GGUF_OK, "%s", err);
    if (!g) return;
    CHECK(gguf_version(g) == 3);
    CHECK(gguf_alignment(g) == 32);
    CHECK(gguf_data_offset(g) % 32 == 0);
    CHECK(gguf_n_keys(g) == 23);
    CHECK(!strcmp(gguf_key_name(g, 0), "t.u8"));
    CHECK(gguf_key_type(g, 0) == GGUF_VT_UINT8);
    CHECK(gguf_key_type(g, gguf_find_key(g, "t.f64")) == GGUF_VT_FLOAT64);
    CHECK(gguf_find_key(g, "nope") == -1);
    int64_t iv;
    double dv;
    bool bv;
    CHECK(gguf_get_int(g, "t.u8", &iv) && iv == 200);
    CHECK(gguf_get_int(g, "t.i8", &iv) && iv == -100);
    CHECK(gguf_get_int(g, "t.u16", &iv) && iv == 60000);
    CHECK(gguf_get_int(g, "t.i16", &iv) && iv == -30000);
    CHECK(gguf_get_int(g, "t.u32", &iv) && iv == 4000000000LL);
    CHECK(gguf_get_int(g, "t.i32", &iv) && iv == -2000000000);
    CHECK(gguf_get_int(g, "t.u64", &iv) && iv == 1LL << 40);
    CHECK(gguf_get_int(g, "t.i64", &iv) && iv == -5000000000LL);
    CHECK(!gguf_get_int(g, "t.str", &iv));
    CHECK(!gguf_get_int(g, "t.f32", &iv));
    CHECK(!gguf_get_int(g, "absent", &iv));
    CHECK(gguf_get_float(g, "t.f32", &dv) && dv == 1.5);
    CHECK(gguf_get_float(g, "t.f64", &dv) && dv == 3.25e100);
    CHECK(gguf_get_float(g, "t.i32", &dv) && dv == -2e9);
    CHECK(!gguf_get_float(g, "t.str", &dv));
    CHECK(gguf_get_bool(g, "t.bool", &bv) && bv);
    CHECK(!gguf_get_bool(g, "t.u8", &bv));
    const char *s;
    size_t len;
    CHECK(gguf_get_str(g, "t.str", &s, &len) && len == 14 && !memcmp(s, "hello \xe2\x96\x81world", 14));
    CHECK(gguf_get_str(g, "t.replaced", &s, &len) && len == 6 && !memcmp(s, "second", 6));
    CHECK(!gguf_get_str(g, "t.u8", &s, &len));

    gguf_vtype elt;
    uint64_t n;
    const void *data;
    CHECK(gguf_get_arr(g, "t.astr", &elt, &n, &data) && elt == GGUF_VT_STRING && n == 4 && data == NULL);
    for (uint64_t i = 0; i < 4; i++)
        CHECK(gguf_arr_str(g, "t.astr", i, &s, &len) && len == strlen(strs[i]) && !memcmp(s, strs[i], len));
    CHECK(!gguf_arr_str(g, "t.astr", 4, &s, &len));
    CHECK(!gguf_arr_str(g, "t.ai32", 0, &s, &len));
    CHECK(gguf_get_arr(g, "t.ai32", &elt, &n, &data) && elt == GGUF_VT_INT32 && n == 4);
    CHECK((uintptr_t)data % 4 == 0 && !memcmp(data, ai32, sizeof ai32));
    CHECK(gguf_get_arr(g, "t.af32", &elt, &n, &data) && elt == GGUF_VT_FLOAT32 && n == 3);
    CHECK((uintptr_t)data % 4 == 0 && ((const float *)data)[2] == 1e-5f);
    CHECK(gguf_get_arr(g, "t.au8", &elt, &n, &data) && elt == GGUF_VT_UINT8 && n == 3 && !memcmp(data, au8, 3));
    CHECK(gguf_get_arr(g, "t.ai16", &elt, &n, &data) && elt == GGUF_VT_INT16 && n == 2 && ((const int16_t *)data)[0] == -3);
    CHECK(gguf_get_arr(g, "t.au64", &elt, &n, &data) && elt == GGUF_VT_UINT64 && n == 2 &&
          ((const uint64_t *)data)[1] == 1ULL << 63);
    CHECK(gguf_get_arr(g, "t.af64", &elt, &n, &data) && elt == GGUF_VT_FLOAT64 && n == 1 &&
          ((const double *)data)[0] == 1.0 / 3);
    CHECK(gguf_get_arr(g, "t.abool", &elt, &n, &data) && elt == GGUF_VT_BOOL && n == 2);
    CHECK(gguf_get_arr(g, "t.aempty", &elt, &n, &data) && elt == GGUF_VT_INT32 && n == 0);
    CHECK(!gguf_get_arr(g, "t.u8", &elt, &n, &data));

    CHECK(gguf_n_tensors(g) == 7);
    const gguf_tensor *t = gguf_find_tensor(g, "f32.weight");
    CHECK(t && t->type == QTYPE_F32 && t->n_dims == 2 && t->ne[0] == 3 && t->ne[1] == 2 && t->ne[2] == 1);
    CHECK(t && t->nbytes == sizeof f && !memcmp(t->data, f, sizeof f));
    CHECK(t == gguf_tensor_at(g, 0));
    CHECK(gguf_tensor_at(g, 7) == NULL && gguf_find_tensor(g, "absent") == NULL);
    struct { const char *name; qtype type; size_t nbytes; int n_dims; uintptr_t seed; } want[] = {
        { "q8.weight", QTYPE_Q8_0, 3 * 2 * 34, 2, 3 },
        { "q4k.weight", QTYPE_Q4_K, 4 * 2 * 144, 3, 5 },
        { "f16.bias", QTYPE_F16, 14, 1, 9 },
        { "q6.weight", QTYPE_Q6_K, 210, 2, 11 },
        { "q40.weight", QTYPE_Q4_0, 6 * 18, 4, 13 },
        { "bf16.weight", QTYPE_BF16, 50, 2, 17 },
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        t = gguf_find_tensor(g, want[k].name);
        CHECKF(t && t->type == want[k].type && t->nbytes == want[k].nbytes && t->n_dims == want[k].n_dims, "%s",
               want[k].name);
        if (!t) continue;
        CHECK(t->offset % 32 == 0);
        uint8_t *exp = malloc(t->nbytes);
        fill_pattern((void *)want[k].seed, t->name, exp, t->nbytes);
        CHECKF(!memcmp(exp, t->data, t->nbytes), "%s data", want[k].name);
        free(exp);
    }
    t = gguf_find_tensor(g, "q40.weight");
    CHECK(t && t->ne[0] == 32 && t->ne[1] == 1 && t->ne[2] == 2 && t->ne[3] == 3);

    /* copy_key carries every kind of value over byte for byte */
    gguf_writer *w2 = gguf_writer_new();
    const char *keys[] = { "t.u8", "t.str", "t.astr", "t.ai32", "t.af64", "t.bool", "t.aempty" };
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) CHECK(gguf_writer_copy_key(w2, g, keys[k]));
    CHECK(!gguf_writer_copy_key(w2, g, "absent"));
    uint32_t al = 64;
    gguf_writer_set_scalar(w2, "general.alignment", GGUF_VT_UINT32, &al);
    gguf_writer_add_tensor(w2, "f32.weight", QTYPE_F32, 2, ne_f, f, sizeof f);
    gguf_writer_add_tensor(w2, "f32.again", QTYPE_F32, 2, ne_f, f, sizeof f);
    char path2[300];
    snprintf(path2, sizeof path2, "%s.2", tpath);
    CHECK(gguf_writer_write(w2, path2, err, sizeof err) == GGUF_OK);
    gguf_writer_free(w2);
    gguf_close(g);

    st = gguf_open(path2, &g, err, sizeof err);
    CHECKF(st == GGUF_OK, "%s", err);
    if (g) {
        CHECK(gguf_alignment(g) == 64 && gguf_data_offset(g) % 64 == 0);
        CHECK(gguf_get_int(g, "t.u8", &iv) && iv == 200);
        CHECK(gguf_get_str(g, "t.str", &s, &len) && len == 14);
        CHECK(gguf_arr_str(g, "t.astr", 3, &s, &len) && len == strlen(strs[3]) && !memcmp(s, strs[3], len));
        CHECK(gguf_get_arr(g, "t.ai32", &elt, &n, &data) && n == 4 && !memcmp(data, ai32, sizeof ai32));
        CHECK(gguf_get_arr(g, "t.af64", &elt, &n, &data) && ((const double *)data)[0] == 1.0 / 3);
        CHECK(gguf_get_bool(g, "t.bool", &bv) && bv);
        CHECK(gguf_get_arr(g, "t.aempty", &elt, &n, &data) && n == 0);
        t = gguf_find_tensor(g, "f32.again");
        CHECK(t && t->offset == 64 && !memcmp(t->data, f, sizeof f));
        gguf_close(g);
    }
    unlink(path2);
    unlink(tpath);
}

/* ---- hand-built files ---------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_put(buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u32(buf *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(buf *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(buf *b, const char *s) { b_u64(b, strlen(s)); b_put(b, s, strlen(s)); }

/* What make_file builds: a v3 file with two keys (a string and an i32 array) and one tensor. */
typedef struct {
    const char *magic;        /* 4 bytes */
    uint32_t version;
    uint64_t n_tensors_override; /* 0: the real count */
    uint64_t n_kv_override;
    uint64_t str_len_override; /* 0: real length of general.name */
    uint64_t arr_count_override;
    uint32_t value_type;      /* type of general.name (8) */
    uint32_t arr_elt;         /* element type of the array (5) */
    int64_t alignment;        /* >0: add general.alignment (u32) */
    uint32_t n_dims;
    int64_t ne[5];
    uint32_t type;
    uint64_t offset;
    size_t data_bytes;        /* bytes of tensor data actually written */
} spec;

static spec spec_default(void)
{
    spec s = { .magic = "GGUF", .version = 3, .value_type = GGUF_VT_STRING, .arr_elt = GGUF_VT_INT32, .n_dims = 2,
               .ne = { 64, 2, 1, 1, 1 }, .type = QTYPE_Q8_0, .offset = 0, .data_bytes = 2 * 2 * 34 };
    return s;
}

/* Returns the buffer; *hdr_end is the offset where the tensor infos end. */
static buf make_file(const spec *s, size_t *hdr_end)
{
    buf b = { 0 };
    b_put(&b, s->magic, 4);
    b_u32(&b, s->version);
    b_u64(&b, s->n_tensors_override ? s->n_tensors_override : 1);
    b_u64(&b, s->n_kv_override ? s->n_kv_override : (s->alignment > 0 ? 3 : 2));
    b_str(&b, "general.name");
    b_u32(&b, s->value_type);
    const char *name = "tiny model";
    b_u64(&b, s->str_len_override ? s->str_len_override : strlen(name));
    b_put(&b, name, strlen(name));
    b_str(&b, "tokenizer.ggml.token_type");
    b_u32(&b, GGUF_VT_ARRAY);
    b_u32(&b, s->arr_elt);
    b_u64(&b, s->arr_count_override ? s->arr_count_override : 3);
    b_u32(&b, 1); b_u32(&b, 2); b_u32(&b, 3);
    if (s->alignment > 0) {
        b_str(&b, "general.alignment");
        b_u32(&b, GGUF_VT_UINT32);
        b_u32(&b, (uint32_t)s->alignment);
    }
    b_str(&b, "blk.0.ffn_up.weight");
    b_u32(&b, s->n_dims);
    for (uint32_t d = 0; d < s->n_dims && d < 5; d++) b_u64(&b, (uint64_t)s->ne[d]);
    b_u32(&b, s->type);
    b_u64(&b, s->offset);
    *hdr_end = b.n;
    size_t align = s->alignment > 0 ? (size_t)s->alignment : 32;
    /* An alignment past any the reader accepts (1 GiB in test_bad_metadata) must be refused
     * on the key itself, before the data: its file stops after the header (padding it wrote a
     * gigabyte per run); a reader that took the key would then fail on the data's bounds or
     * succeed, not give GGUF_ERR_FORMAT. */
    if (align > (1u << 20)) align = 1;
    while (b.n % align) b_put(&b, "", 1);
    for (size_t i = 0; i < s->data_bytes; i++) {
        uint8_t v = (uint8_t)i;
        b_put(&b, &v, 1);
    }
    return b;
}

static gguf_status open_spec(const spec *s, char *err, size_t errsz)
{
    size_t he;
    buf b = make_file(s, &he);
    gguf_status st = open_bytes(b.p, b.n, err, errsz);
    free(b.p);
    return st;
}

#define EXPECT_SPEC(s, want)                                                                     \
    do {                                                                                         \
        char err_[512] = "";                                                                     \
        gguf_status st_ = open_spec(&(s), err_, sizeof err_);                                    \
        CHECKF(st_ == (want), "got %s (%s), want %s", gguf_status_name(st_), err_, gguf_status_name(want)); \
        CHECKF((want) == GGUF_OK || strstr(err_, gguf_status_name(want)) != NULL, "message: %s", err_); \
    } while (0)

TEST(test_valid_spec)
{
    spec s = spec_default();
    EXPECT_SPEC(s, GGUF_OK);
    s.version = 2;
    EXPECT_SPEC(s, GGUF_OK);
    s = spec_default();
    s.alignment = 64;
    EXPECT_SPEC(s, GGUF_OK);
    s.offset = 64;
    s.data_bytes = 64 + 136;
    EXPECT_SPEC(s, GGUF_OK);
}

TEST(test_truncated_everywhere)
{
    spec s = spec_default();
    size_t he;
    buf b = make_file(&s, &he);
    size_t data_off = (he + 31) / 32 * 32;
    char err[512];
    /* every cut inside the header, metadata and tensor infos */
    for (size_t cut = 0; cut < he; cut++) {
        gguf_status st = open_bytes(b.p, cut, err, sizeof err);
        CHECKF(st == GGUF_ERR_TRUNCATED, "cut %zu: %s (%s)", cut, gguf_status_name(st), err);
    }
    /* cuts in the padding and the data leave the tensor out of bounds */
    for (size_t cut = he; cut < b.n; cut += 7) {
        gguf_status st = open_bytes(b.p, cut, err, sizeof err);
        CHECKF(st == GGUF_ERR_BOUNDS, "cut %zu (data at %zu): %s (%s)", cut, data_off, gguf_status_name(st), err);
    }
    CHECK(open_bytes(b.p, b.n, err, sizeof err) == GGUF_OK);
    free(b.p);
}

TEST(test_bad_header)
{
    spec s = spec_default();
    s.magic = "GGUG";
    EXPECT_SPEC(s, GGUF_ERR_MAGIC);
    s.magic = "\x00\x00\x00\x00";
    EXPECT_SPEC(s, GGUF_ERR_MAGIC);
    s = spec_default();
    s.version = 1;
    EXPECT_SPEC(s, GGUF_ERR_VERSION);
    s.version = 4;
    EXPECT_SPEC(s, GGUF_ERR_VERSION);
    s.version = 0x03000000; /* big-endian v3 */
    EXPECT_SPEC(s, GGUF_ERR_VERSION);
    s = spec_default();
    s.n_tensors_override = 1ULL << 62;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s = spec_default();
    s.n_kv_override = UINT64_MAX;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s = spec_default();
    s.n_kv_override = 1000; /* plausible, but the file is far too short for it */
    EXPECT_SPEC(s, GGUF_ERR_TRUNCATED);
    s = spec_default();
    s.n_tensors_override = 50;
    EXPECT_SPEC(s, GGUF_ERR_TRUNCATED);
    /* a directory and a missing file */
    gguf *g = NULL;
    char err[256];
    CHECK(gguf_open("/tmp", &g, err, sizeof err) == GGUF_ERR_IO && g == NULL);
    CHECK(gguf_open("/nonexistent/x.gguf", &g, err, sizeof err) == GGUF_ERR_IO && strstr(err, "x.gguf"));
}

TEST(test_bad_metadata)
{
    spec s = spec_default();
    s.str_len_override = 0xFFFFFFFFFFFFFF00ULL;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s.str_len_override = 1u << 20; /* plausible, longer than the file */
    EXPECT_SPEC(s, GGUF_ERR_TRUNCATED);
    s = spec_default();
    s.arr_count_override = 1ULL << 61;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s.arr_count_override = 1u << 20;
    EXPECT_SPEC(s, GGUF_ERR_TRUNCATED);
    s = spec_default();
    s.value_type = 13;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s.value_type = 0xFFFFFFFF;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s = spec_default();
    s.arr_elt = GGUF_VT_ARRAY; /* nested arrays */
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s.arr_elt = 77;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s = spec_default();
    s.alignment = 3;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
    s.alignment = 1 << 30;
    EXPECT_SPEC(s, GGUF_ERR_FORMAT);
}

TEST(test_bad_tensors)
{
    spec s = spec_default();
    s.offset = 1024;
    EXPECT_SPEC(s, GGUF_ERR_BOUNDS);
    s.offset = UINT64_MAX - 31;
    EXPECT_SPEC(s, GGUF_ERR_BOUNDS);
    s = spec_default();
    s.offset = 4; /* misaligned */
    s.data_bytes += 4;
    EXPECT_SPEC(s, GGUF_ERR_BOUNDS);
    s = spec_default();
    s.data_bytes -= 1;
    EXPECT_SPEC(s, GGUF_ERR_BOUNDS);
    s = spec_default();
    s.type = 40; /* NVFP4: a real ggml type we do not support, refused by name */
    EXPECT_SPEC(s, GGUF_ERR_TYPE);
    {
        char err[512] = "";
        CHECK(open_spec(&s, err, sizeof err) == GGUF_ERR_TYPE && strstr(err, "nvfp4"));
    }
    s.type = 41; /* Q1_0 */
    EXPECT_SPEC(s, GGUF_ERR_TYPE);
    s.type = QTYPE_Q8_1; /* an activation-only type */
    EXPECT_SPEC(s, GGUF_ERR_TYPE);
    s.type = 99;
    EXPECT_SPEC(s, GGUF_ERR_TYPE);
    s.type = QTYPE_Q8_K; /* an activation-only type */
    EXPECT_SPEC(s, GGUF_ERR_TYPE);
    s = spec_default();
    s.ne[1] = 0;
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
    s = spec_default();
    s.ne[0] = -64;
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
    s = spec_default();
    s.ne[0] = 33; /* not a multiple of the Q8_0 block */
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
    s = spec_default();
    s.type = QTYPE_Q4_K;
    s.ne[0] = 128;
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
    s = spec_default();
    s.n_dims = 4;
    s.ne[0] = 1LL << 40; s.ne[1] = 1LL << 20; s.ne[2] = 1LL << 10; s.ne[3] = 2;
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
    s = spec_default();
    s.n_dims = 0;
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
    s.n_dims = 5;
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
    s = spec_default();
    s.type = QTYPE_F32;
    s.ne[0] = 1LL << 62; s.ne[1] = 1; /* element count fits, byte count overflows size */
    EXPECT_SPEC(s, GGUF_ERR_SHAPE);
}

/* A NUL byte inside a key's or a tensor's name is refused with the name's place; the copy
 * already made is freed with the rest (the sanitizer build checks the leak). */
TEST(test_nul_in_names)
{
    static const struct {
        const char *name;
        const char *want;
    } cases[] = {
        { "general.name", "metadata key 0 has a NUL byte in its name" },
        { "tokenizer.ggml.token_type", "metadata key 1 has a NUL byte in its name" },
        { "blk.0.ffn_up.weight", "tensor 0 has a NUL byte in its name" },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(cases); i++) {
        spec s = spec_default();
        size_t he;
        buf b = make_file(&s, &he);
        char *p = memmem(b.p, he, cases[i].name, strlen(cases[i].name));
        CHECK(p != NULL);
        if (p) p[4] = '\0';
        char err[512] = "";
        gguf_status st = open_bytes(b.p, b.n, err, sizeof err);
        CHECKF(st == GGUF_ERR_FORMAT && strstr(err, cases[i].want), "%s: %s", cases[i].name, err);
        free(b.p);
    }
}

TEST(test_duplicates)
{
    char err[512];
    gguf_writer *w = gguf_writer_new();
    float f[4] = { 0 };
    int64_t ne[1] = { 4 };
    gguf_writer_add_tensor(w, "x.weight", QTYPE_F32, 1, ne, f, sizeof f);
    gguf_writer_add_tensor(w, "x.weight", QTYPE_F32, 1, ne, f, sizeof f);
    CHECK(gguf_writer_write(w, tpath, err, sizeof err) == GGUF_OK);
    gguf_writer_free(w);
    gguf *g = NULL;
    CHECK(gguf_open(tpath, &g, err, sizeof err) == GGUF_ERR_FORMAT && strstr(err, "duplicate tensor"));

    w = gguf_writer_new();
    gguf_writer_set_u32(w, "k.aa", 1);
    gguf_writer_set_u32(w, "k.ab", 2);
    CHECK(gguf_writer_write(w, tpath, err, sizeof err) == GGUF_OK);
    gguf_writer_free(w);
    size_t n;
    char *b = util_read_file(tpath, &n);
    char *p = b ? memmem(b, n, "k.ab", 4) : NULL;
    CHECK(p != NULL);
    if (p) {
        p[3] = 'a';
        CHECK(open_bytes(b, n, err, sizeof err) == GGUF_ERR_FORMAT && strstr(err, "duplicate metadata key 'k.aa'"));
    }
    free(b);
}

/* Random byte corruption of the header region: any status is fine, crashes and reads past the
 * mapping (ASan) are not; a successful open must still give consistent tensors. */
TEST(test_random_corruption)
{
    spec s = spec_default();
    size_t he;
    buf b = make_file(&s, &he);
    util_rng rng;
    util_rng_seed(&rng, 42);
    uint8_t *m = malloc(b.n);
    char err[512];
    for (int it = 0; it < 500; it++) {
        memcpy(m, b.p, b.n);
        int nflip = 1 + (int)(util_rng_next(&rng) % 4);
        for (int k = 0; k < nflip; k++) m[util_rng_next(&rng) % he] = (uint8_t)util_rng_next(&rng);
        size_t n = util_rng_next(&rng) % 4 == 0 ? util_rng_next(&rng) % b.n : b.n;
        write_bytes(tpath, m, n);
        gguf *g = NULL;
        gguf_status st = gguf_open(tpath, &g, err, sizeof err);
        CHECK((st == GGUF_OK) == (g != NULL));
        if (g) {
            for (int i = 0; i < gguf_n_tensors(g); i++) {
                const gguf_tensor *t = gguf_tensor_at(g, i);
                const uint8_t *p = t->data;
                volatile uint8_t sink = 0;
                if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1];
                (void)sink;
            }
            gguf_close(g);
        } else {
            CHECK(err[0] != 0);
        }
    }
    free(m);
    free(b.p);
}

int main(void)
{
    tpath_init();
    RUN(test_roundtrip);
    RUN(test_valid_spec);
    RUN(test_truncated_everywhere);
    RUN(test_bad_header);
    RUN(test_bad_metadata);
    RUN(test_bad_tensors);
    RUN(test_nul_in_names);
    RUN(test_duplicates);
    RUN(test_random_corruption);
    unlink(tpath);
    HARNESS_END();
}
