/*
 * gguf: GGUF v2/v3 reader (read-only shared mmap, validated up front) and writer.
 *
 * Reading is one pass over the mapping with a bounds-checked cursor (gguf_rd): every length
 * and count is checked against what is left of the file before it is used, so the first
 * problem found stops the parse with a status and a one-line message. Counts above fixed sanity
 * limits are "absurd" (GGUF_ERR_FORMAT); counts that are plausible but do not fit in what is
 * left of the file mean the file was cut short (GGUF_ERR_TRUNCATED). After the header, metadata
 * and tensor infos, each tensor's type, shape, alignment and data range are checked, so that an
 * opened gguf can be read through its accessors without further checks.
 *
 * Metadata values stay in the mapping; the parse records where each value starts and ends
 * (gguf_kv). String arrays get an index of their element offsets so gguf_arr_str is O(1).
 * Numeric arrays whose data is not aligned to the element size in the file are copied to an
 * aligned buffer once, so callers may read them as typed C arrays.
 *
 * The writer keeps each key's value serialised exactly as it will be written (the bytes after
 * the value type), which makes copying a key from another file a byte copy. Tensors reference
 * caller data, or are produced at write time by a fill callback (mkmodel generates multi-GB
 * models tensor by tensor this way).
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
/* Sanity limits: beyond these a count is malformed whatever the file size. */
#define GGUF_MAX_KV ((uint64_t)1 << 20)
#define GGUF_MAX_TENSORS ((uint64_t)1 << 20)
#define GGUF_MAX_STRING ((uint64_t)1 << 30)
#define GGUF_MAX_ARRAY ((uint64_t)1 << 30)
#define GGUF_MAX_ALIGNMENT 65536

typedef struct {
    char *name;             /* NUL-terminated copy of the key */
    gguf_vtype type;        /* value type */
    gguf_vtype elt;         /* element type when type == ARRAY */
    uint64_t n;             /* element count when type == ARRAY */
    size_t val_off;         /* file offset of the value (after the type; arrays: after elt+n) */
    size_t val_end;         /* file offset just past the value */
    const void *arr_data;   /* numeric arrays: element data (mapping or aligned copy) */
    void *arr_copy;         /* owned aligned copy of arr_data, or NULL */
    uint64_t *str_off;      /* string arrays: file offset of each element's u64 length */
} gguf_kv;

struct gguf {
    const uint8_t *map;     /* the whole file, PROT_READ, MAP_SHARED */
    size_t size;            /* file size in bytes */
    struct stat st;         /* the file's stat at open (its identity for modelhash's cache) */
    uint32_t version;       /* 2 or 3 */
    uint32_t alignment;     /* data alignment in bytes (general.alignment or 32) */
    size_t data_off;        /* file offset of the tensor data section */
    int n_kv;               /* number of metadata keys */
    gguf_kv *kv;            /* (n_kv) */
    int n_tensors;          /* number of tensors */
    gguf_tensor *tensors;   /* (n_tensors); names are owned strings */
};

/* ---- element types (block sizes) ------------------------------------------------------ */

static bool gguf_type_ok(uint32_t type)
{
    /* I32: tables a model reads itself (the file is readable, the model decides whether it
     * knows the tensor) */
    return type < QTYPE_COUNT_MAX && (quant_weight_type((int)type) || type == QTYPE_I32);
}

/* ---- the cursor --------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *base;    /* mapping */
    size_t size;            /* bytes in the mapping */
    size_t pos;             /* current offset */
    gguf_status st;         /* first error, GGUF_OK while none */
    char *err;              /* message buffer */
    size_t errsz;           /* its size */
    const char *path;       /* file name for messages */
} gguf_rd;

static bool gguf_fail(gguf_rd *r, gguf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool gguf_fail(gguf_rd *r, gguf_status st, const char *fmt, ...)
{
    if (r->st != GGUF_OK) return false;
    r->st = st;
    if (r->err && r->errsz > 0) {
        int k = snprintf(r->err, r->errsz, "%s: %s: ", r->path, gguf_status_name(st));
        if (k >= 0 && (size_t)k < r->errsz) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + k, r->errsz - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return false;
}

static bool gguf_rd_need(gguf_rd *r, uint64_t n, const char *what)
{
    if (r->st != GGUF_OK) return false;
    if (n > r->size - r->pos)
        return gguf_fail(r, GGUF_ERR_TRUNCATED, "file ends inside %s (offset %zu, need %llu bytes, file size %zu)",
                         what, r->pos, (unsigned long long)n, r->size);
    return true;
}

static bool gguf_rd_u32(gguf_rd *r, uint32_t *v, const char *what)
{
    if (!gguf_rd_need(r, 4, what)) return false;
    memcpy(v, r->base + r->pos, 4);
    r->pos += 4;
    return true;
}

static bool gguf_rd_u64(gguf_rd *r, uint64_t *v, const char *what)
{
    if (!gguf_rd_need(r, 8, what)) return false;
    memcpy(v, r->base + r->pos, 8);
    r->pos += 8;
    return true;
}

/* A GGUF string: u64 length then bytes. Returns the offset of the bytes. */
static bool gguf_rd_str(gguf_rd *r, size_t *off, uint64_t *len, const char *what)
{
    if (!gguf_rd_u64(r, len, what)) return false;
    if (*len > GGUF_MAX_STRING)
        return gguf_fail(r, GGUF_ERR_FORMAT, "absurd string length %llu in %s (offset %zu)",
                         (unsigned long long)*len, what, r->pos - 8);
    if (!gguf_rd_need(r, *len, what)) return false;
    *off = r->pos;
    r->pos += (size_t)*len;
    return true;
}

/* A key's or a tensor's name (label i, e.g. "metadata key 3") as an owned NUL-terminated copy
 * in *out. *out is set once the copy is made, also when the name is then refused for a NUL
 * byte, so that the caller can count it to be freed. */
static bool gguf_rd_name(gguf_rd *r, const char *what, const char *kind, const char *label, uint64_t i, char **out)
{
    size_t off;
    uint64_t len;
    if (!gguf_rd_str(r, &off, &len, what)) return false;
    char *name = malloc(len + 1);
    if (!name) return gguf_fail(r, GGUF_ERR_NOMEM, "no memory for a %s name", kind);
    memcpy(name, r->base + off, len);
    name[len] = 0;
    *out = name;
    if (strlen(name) != len)
        return gguf_fail(r, GGUF_ERR_FORMAT, "%s %llu has a NUL byte in its name", label, (unsigned long long)i);
    return true;
}

static size_t gguf_vtype_size(gguf_vtype t)
{
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;  /* string, array */
    }
}

static const char *gguf_vtype_name(uint32_t t)
{
    static const char *names[] = { "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                   "string", "array", "u64", "i64", "f64" };
    return t < TM_ARRAY_LEN(names) ? names[t] : "?";
}

/* Parses one value of type T whose bytes start at the cursor into kv (kv->type set). */
static bool gguf_rd_value(gguf_rd *r, gguf_kv *kv, const char *key)
{
    char what[160];
    snprintf(what, sizeof what, "the value of '%.100s'", key);
    if (kv->type > GGUF_VT_FLOAT64)
        return gguf_fail(r, GGUF_ERR_FORMAT, "key '%.100s' has unknown value type %u", key, (unsigned)kv->type);
    if (kv->type == GGUF_VT_STRING) {
        size_t off;
        uint64_t len;
        kv->val_off = r->pos;
        if (!gguf_rd_str(r, &off, &len, what)) return false;
        kv->val_end = r->pos;
        return true;
    }
    if (kv->type != GGUF_VT_ARRAY) {
        size_t sz = gguf_vtype_size(kv->type);
        kv->val_off = r->pos;
        if (!gguf_rd_need(r, sz, what)) return false;
        if (kv->type == GGUF_VT_BOOL && r->base[r->pos] > 1)
            return gguf_fail(r, GGUF_ERR_FORMAT, "key '%.100s': bool value %u", key, r->base[r->pos]);
        r->pos += sz;
        kv->val_end = r->pos;
        return true;
    }
    uint32_t elt;
    uint64_t n;
    if (!gguf_rd_u32(r, &elt, what) || !gguf_rd_u64(r, &n, what)) return false;
    if (elt > GGUF_VT_FLOAT64 || elt == GGUF_VT_ARRAY)
        return gguf_fail(r, GGUF_ERR_FORMAT, "key '%.100s': array of unsupported element type %u (%s)", key,
                         elt, gguf_vtype_name(elt));
    if (n > GGUF_MAX_ARRAY)
        return gguf_fail(r, GGUF_ERR_FORMAT, "key '%.100s': absurd array count %llu", key, (unsigned long long)n);
    kv->elt = (gguf_vtype)elt;
    kv->n = n;
    kv->val_off = r->pos;
    if (elt == GGUF_VT_STRING) {
        /* every element takes at least its 8-byte length */
        if (!gguf_rd_need(r, n * 8, what)) return false;
        kv->str_off = malloc((n ? n : 1) * sizeof *kv->str_off);
        if (!kv->str_off) return gguf_fail(r, GGUF_ERR_NOMEM, "no memory for %llu strings", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            size_t off;
            uint64_t len;
            kv->str_off[i] = r->pos;
            if (!gguf_rd_str(r, &off, &len, what)) return false;
        }
    } else {
        size_t sz = gguf_vtype_size(kv->elt);
        if (!gguf_rd_need(r, n * sz, what)) return false;
        const uint8_t *p = r->base + r->pos;
        if (elt == GGUF_VT_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p[i] > 1) return gguf_fail(r, GGUF_ERR_FORMAT, "key '%.100s': bool value %u", key, p[i]);
        if ((uintptr_t)p % sz != 0) {
            kv->arr_copy = malloc(n > 0 ? n * sz : 1);
            if (!kv->arr_copy) return gguf_fail(r, GGUF_ERR_NOMEM, "no memory for array '%.100s'", key);
            memcpy(kv->arr_copy, p, n * sz);
            kv->arr_data = kv->arr_copy;
        } else {
            kv->arr_data = p;
        }
        r->pos += n * sz;
    }
    kv->val_end = r->pos;
    return true;
}

static int gguf_cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Returns a name that occurs twice among N names found every STRIDE bytes from FIRST, or
 * NULL. Sorting keeps this O(n log n) even for hostile files with a million entries. */
static const char *gguf_find_duplicate(int n, const void *first, size_t stride)
{
    if (n < 2) return NULL;
    const char **names = malloc((size_t)n * sizeof *names);
    if (!names) return NULL;
    for (int i = 0; i < n; i++) memcpy(&names[i], (const char *)first + (size_t)i * stride, sizeof *names);
    qsort(names, (size_t)n, sizeof *names, gguf_cmp_names);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (!strcmp(names[i - 1], names[i])) dup = names[i];
    free(names);
    return dup;
}

static bool gguf_parse(gguf *g, gguf_rd *r)
{
    uint8_t magic[4];
    if (!gguf_rd_need(r, 4, "the magic")) return false;
    memcpy(magic, r->base, 4);
    r->pos = 4;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0)
        return gguf_fail(r, GGUF_ERR_MAGIC, "bad magic %02x %02x %02x %02x (want \"GGUF\")", magic[0], magic[1],
                         magic[2], magic[3]);
    if (!gguf_rd_u32(r, &g->version, "the version")) return false;
    if (g->version != 2 && g->version != 3)
        return gguf_fail(r, GGUF_ERR_VERSION, "GGUF version %u (supported: 2, 3)", g->version);

    uint64_t n_tensors, n_kv;
    if (!gguf_rd_u64(r, &n_tensors, "the tensor count") || !gguf_rd_u64(r, &n_kv, "the key count")) return false;
    if (n_tensors > GGUF_MAX_TENSORS)
        return gguf_fail(r, GGUF_ERR_FORMAT, "absurd tensor count %llu", (unsigned long long)n_tensors);
    if (n_kv > GGUF_MAX_KV)
        return gguf_fail(r, GGUF_ERR_FORMAT, "absurd metadata key count %llu", (unsigned long long)n_kv);

    /* metadata; every key takes at least 8 (key length) + 4 (type) + 1 bytes */
    if (!gguf_rd_need(r, n_kv * 13, "the metadata")) return false;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    if (!g->kv) return gguf_fail(r, GGUF_ERR_NOMEM, "no memory for %llu keys", (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        char what[64];
        snprintf(what, sizeof what, "metadata key %llu", (unsigned long long)i);
        bool ok = gguf_rd_name(r, what, "key", "metadata key", i, &kv->name);
        if (kv->name) g->n_kv = (int)i + 1;
        if (!ok) return false;
        uint32_t type;
        if (!gguf_rd_u32(r, &type, what)) return false;
        kv->type = (gguf_vtype)type;
        if (!gguf_rd_value(r, kv, kv->name)) return false;
    }

    const char *dup = gguf_find_duplicate(g->n_kv, &g->kv[0].name, sizeof *g->kv);
    if (dup) return gguf_fail(r, GGUF_ERR_FORMAT, "duplicate metadata key '%.100s'", dup);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int ai = gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        int64_t a;
        if (!gguf_get_int(g, "general.alignment", &a) || a <= 0 || a > GGUF_MAX_ALIGNMENT || (a & (a - 1)) != 0)
            return gguf_fail(r, GGUF_ERR_FORMAT, "general.alignment must be a power of two integer <= %d",
                             GGUF_MAX_ALIGNMENT);
        g->alignment = (uint32_t)a;
    }

    /* tensor infos; each takes at least 8 + 4 + 8 + 4 + 8 bytes */
    if (!gguf_rd_need(r, n_tensors * 32, "the tensor infos")) return false;
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors) return gguf_fail(r, GGUF_ERR_NOMEM, "no memory for %llu tensors", (unsigned long long)n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        char what[64], *name = NULL;
        snprintf(what, sizeof what, "tensor info %llu", (unsigned long long)i);
        bool ok = gguf_rd_name(r, what, "tensor", "tensor", i, &name);
        if (name) {
            t->name = name;
            g->n_tensors = (int)i + 1;
        }
        if (!ok) return false;
        uint32_t n_dims, type;
        if (!gguf_rd_u32(r, &n_dims, what)) return false;
        if (n_dims < 1 || n_dims > 4)
            return gguf_fail(r, GGUF_ERR_SHAPE, "tensor '%.100s' has %u dimensions (want 1..4)", name, n_dims);
        t->n_dims = (int)n_dims;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            if (!gguf_rd_u64(r, &ne, what)) return false;
            t->ne[d] = (int64_t)ne;
        }
        if (!gguf_rd_u32(r, &type, what) || !gguf_rd_u64(r, &t->offset, what)) return false;
        if (!gguf_type_ok(type)) {
            const char *tn = type < 1000 ? quant_ggml_type_name((int)type) : NULL;
            if (tn)
                return gguf_fail(r, GGUF_ERR_TYPE, "tensor '%.100s' has weight type %s (ggml type %u), which "
                                 "tokenmill cannot read", name, tn, type);
            return gguf_fail(r, GGUF_ERR_TYPE, "tensor '%.100s' has unknown type %u", name, type);
        }
        t->type = (qtype)type;
        int64_t nel = 1;
        for (int d = 0; d < 4; d++) {
            if (t->ne[d] <= 0)
                return gguf_fail(r, GGUF_ERR_SHAPE, "tensor '%.100s' dimension %d is %lld", name, d, (long long)t->ne[d]);
            if (__builtin_mul_overflow(nel, t->ne[d], &nel))
                return gguf_fail(r, GGUF_ERR_SHAPE, "tensor '%.100s' element count overflows", name);
        }
        int64_t be = quant_block_elems(t->type);
        if (t->ne[0] % be != 0)
            return gguf_fail(r, GGUF_ERR_SHAPE, "tensor '%.100s' row length %lld is not a multiple of the %s block size %lld",
                             name, (long long)t->ne[0], quant_type_name(t->type), (long long)be);
        uint64_t nbytes;
        if (__builtin_mul_overflow((uint64_t)(nel / be), (uint64_t)quant_block_bytes(t->type), &nbytes) ||
            nbytes > (uint64_t)SIZE_MAX)
            return gguf_fail(r, GGUF_ERR_SHAPE, "tensor '%.100s' byte size overflows", name);
        t->nbytes = (size_t)nbytes;
    }

    dup = gguf_find_duplicate(g->n_tensors, &g->tensors[0].name, sizeof *g->tensors);
    if (dup) return gguf_fail(r, GGUF_ERR_FORMAT, "duplicate tensor name '%.100s'", dup);

    /* the data section starts at the next multiple of the alignment */
    g->data_off = TM_ALIGN_UP(r->pos, (size_t)g->alignment);
    for (int i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return gguf_fail(r, GGUF_ERR_BOUNDS, "tensor '%.100s' data offset %llu is not a multiple of the alignment %u",
                             t->name, (unsigned long long)t->offset, g->alignment);
        uint64_t avail = g->data_off <= r->size ? r->size - g->data_off : 0;
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return gguf_fail(r, GGUF_ERR_BOUNDS,
                             "tensor '%.100s' data [%llu, %llu) of the data section lies past the end of the file "
                             "(%llu data bytes; truncated?)",
                             t->name, (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes),
                             (unsigned long long)avail);
        t->data = r->base + g->data_off + t->offset;
    }
    return true;
}

gguf_status gguf_open(const char *path, gguf **out, char *err, size_t errsz)
{
    *out = NULL;
    if (err && errsz) err[0] = 0;
    gguf_rd r = { .err = err, .errsz = errsz, .path = path };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        gguf_fail(&r, GGUF_ERR_IO, "cannot open: %s", strerror(errno));
        return r.st;
    }
    struct stat stt;
    if (fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode)) {
        gguf_fail(&r, GGUF_ERR_IO, "%s", S_ISREG(stt.st_mode) ? strerror(errno) : "not a regular file");
        close(fd);
        return r.st;
    }
    gguf *g = calloc(1, sizeof *g);
    if (!g) {
        close(fd);
        gguf_fail(&r, GGUF_ERR_NOMEM, "no memory");
        return r.st;
    }
    g->size = (size_t)stt.st_size;
    g->st = stt;
    if (g->size > 0) {
        void *m = mmap(NULL, g->size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            gguf_fail(&r, GGUF_ERR_IO, "mmap: %s", strerror(errno));
            close(fd);
            free(g);
            return r.st;
        }
        g->map = m;
    }
    close(fd);
    r.base = g->map;
    r.size = g->size;
    if (!gguf_parse(g, &r)) {
        gguf_close(g);
        return r.st;
    }
    *out = g;
    return GGUF_OK;
}

void gguf_close(gguf *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) {
        free(g->kv[i].name);
        free(g->kv[i].arr_copy);
        free(g->kv[i].str_off);
    }
    /* a kv whose name failed to allocate may still own arrays: only counted ones are freed,
     * and gguf_rd_value runs after n_kv is bumped, so nothing leaks */
    free(g->kv);
    for (int i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->tensors);
    if (g->map) munmap((void *)g->map, g->size);
    free(g);
}

const char *gguf_status_name(gguf_status st)
{
    switch (st) {
    case GGUF_OK: return "ok";
    case GGUF_ERR_IO: return "i/o error";
    case GGUF_ERR_TRUNCATED: return "truncated file";
    case GGUF_ERR_MAGIC: return "bad magic";
    case GGUF_ERR_VERSION: return "bad version";
    case GGUF_ERR_FORMAT: return "malformed metadata";
    case GGUF_ERR_TYPE: return "unknown tensor type";
    case GGUF_ERR_BOUNDS: return "tensor out of bounds";
    case GGUF_ERR_SHAPE: return "bad tensor shape";
    case GGUF_ERR_MISSING: return "missing";
    case GGUF_ERR_NOMEM: return "out of memory";
    }
    return "?";
}

uint32_t gguf_version(const gguf *g) { return g->version; }
size_t gguf_file_size(const gguf *g) { return g->size; }
const void *gguf_file_map(const gguf *g) { return g->map; }
const struct stat *gguf_file_stat(const gguf *g) { return &g->st; }
size_t gguf_data_offset(const gguf *g) { return g->data_off; }
uint32_t gguf_alignment(const gguf *g) { return g->alignment; }

/* ---- metadata accessors ---------------------------------------------------------------- */

int gguf_n_keys(const gguf *g) { return g->n_kv; }

int gguf_find_key(const gguf *g, const char *key)
{
    for (int i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].name, key)) return i;
    return -1;
}

const char *gguf_key_name(const gguf *g, int ki)
{
    return ki >= 0 && ki < g->n_kv ? g->kv[ki].name : NULL;
}

gguf_vtype gguf_key_type(const gguf *g, int ki)
{
    return ki >= 0 && ki < g->n_kv ? g->kv[ki].type : (gguf_vtype)-1;
}

static const gguf_kv *gguf_kv_get(const gguf *g, const char *key)
{
    int i = gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

bool gguf_get_int(const gguf *g, const char *key, int64_t *out)
{
    const gguf_kv *kv = gguf_kv_get(g, key);
    if (!kv) return false;
    const uint8_t *p = g->map + kv->val_off;
    switch (kv->type) {
    case GGUF_VT_UINT8: *out = p[0]; return true;
    case GGUF_VT_INT8: *out = (int8_t)p[0]; return true;
    case GGUF_VT_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_VT_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_VT_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_VT_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_VT_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v;
        return true;
    }
    case GGUF_VT_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return true; }
    default: return false;
    }
}

bool gguf_get_float(const gguf *g, const char *key, double *out)
{
    const gguf_kv *kv = gguf_kv_get(g, key);
    if (!kv) return false;
    const uint8_t *p = g->map + kv->val_off;
    if (kv->type == GGUF_VT_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return true;
    }
    if (kv->type == GGUF_VT_FLOAT64) {
        memcpy(out, p, 8);
        return true;
    }
    int64_t iv;
    if (gguf_get_int(g, key, &iv)) {
        *out = (double)iv;
        return true;
    }
    return false;
}

bool gguf_get_bool(const gguf *g, const char *key, bool *out)
{
    const gguf_kv *kv = gguf_kv_get(g, key);
    if (!kv || kv->type != GGUF_VT_BOOL) return false;
    *out = g->map[kv->val_off] != 0;
    return true;
}

bool gguf_get_str(const gguf *g, const char *key, const char **s, size_t *len)
{
    const gguf_kv *kv = gguf_kv_get(g, key);
    if (!kv || kv->type != GGUF_VT_STRING) return false;
    uint64_t n;
    memcpy(&n, g->map + kv->val_off, 8);
    *s = (const char *)g->map + kv->val_off + 8;
    *len = (size_t)n;
    return true;
}

bool gguf_get_arr(const gguf *g, const char *key, gguf_vtype *elt, uint64_t *n, const void **data)
{
    const gguf_kv *kv = gguf_kv_get(g, key);
    if (!kv || kv->type != GGUF_VT_ARRAY) return false;
    if (elt) *elt = kv->elt;
    if (n) *n = kv->n;
    if (data) *data = kv->elt == GGUF_VT_STRING ? NULL : kv->arr_data;
    return true;
}

bool gguf_arr_str(const gguf *g, const char *key, uint64_t i, const char **s, size_t *len)
{
    const gguf_kv *kv = gguf_kv_get(g, key);
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->elt != GGUF_VT_STRING || i >= kv->n) return false;
    uint64_t n;
    memcpy(&n, g->map + kv->str_off[i], 8);
    *s = (const char *)g->map + kv->str_off[i] + 8;
    *len = (size_t)n;
    return true;
}

/* ---- tensors --------------------------------------------------------------------------- */

int gguf_n_tensors(const gguf *g) { return g->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf *g, int i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* ---- writer ---------------------------------------------------------------------------- */

typedef struct {
    char *key;              /* NUL-terminated */
    uint32_t type;          /* gguf_vtype */
    uint8_t *val;           /* serialised value (arrays: elt u32 + n u64 + elements) */
    size_t val_len;         /* bytes in val */
} gguf_wkv;

typedef struct {
    char *name;             /* NUL-terminated */
    qtype type;             /* element type */
    int n_dims;             /* 1..4 */
    int64_t ne[4];          /* shape, unused dims 1 */
    const void *data;       /* caller's data, or NULL when fill is set */
    size_t nbytes;          /* data size */
    gguf_fill_fn fill;      /* produces the data at write time, or NULL */
    void *fill_ctx;         /* its argument */
} gguf_wtensor;

struct gguf_writer {
    gguf_wkv *kv;           /* (n_kv) in insertion order */
    int n_kv, cap_kv;
    gguf_wtensor *t;        /* (n_t) in insertion order */
    int n_t, cap_t;
};

gguf_writer *gguf_writer_new(void)
{
    return xcalloc(1, sizeof(gguf_writer));
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    free(w->kv);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w);
}

/* Sets KEY to a value of TYPE whose serialised bytes are VAL (taken over, not copied). */
static void gguf_writer_put(gguf_writer *w, const char *key, uint32_t type, uint8_t *val, size_t len)
{
    for (int i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_len = len;
            return;
        }
    }
    if (w->n_kv == w->cap_kv) {
        w->cap_kv = w->cap_kv ? 2 * w->cap_kv : 32;
        w->kv = xrealloc(w->kv, (size_t)w->cap_kv * sizeof *w->kv);
    }
    w->kv[w->n_kv++] = (gguf_wkv){ .key = xstrdup(key), .type = type, .val = val, .val_len = len };
}

static void gguf_writer_scalar(gguf_writer *w, const char *key, gguf_vtype t, const void *v, size_t sz)
{
    uint8_t *p = xmalloc(sz);
    memcpy(p, v, sz);
    gguf_writer_put(w, key, t, p, sz);
}

void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) { gguf_writer_scalar(w, key, GGUF_VT_UINT32, &v, 4); }
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) { gguf_writer_scalar(w, key, GGUF_VT_INT32, &v, 4); }
void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) { gguf_writer_scalar(w, key, GGUF_VT_UINT64, &v, 8); }
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v) { gguf_writer_scalar(w, key, GGUF_VT_FLOAT32, &v, 4); }

void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    gguf_writer_scalar(w, key, GGUF_VT_BOOL, &b, 1);
}

void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    uint64_t n = strlen(v);
    uint8_t *p = xmalloc(8 + n);
    memcpy(p, &n, 8);
    memcpy(p + 8, v, n);
    gguf_writer_put(w, key, GGUF_VT_STRING, p, 8 + n);
}

void gguf_writer_set_scalar(gguf_writer *w, const char *key, gguf_vtype t, const void *v)
{
    size_t sz = gguf_vtype_size(t);
    if (sz == 0) return;
    gguf_writer_scalar(w, key, t, v, sz);
}

void gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elt, const void *v, uint64_t n)
{
    size_t sz = gguf_vtype_size(elt);
    if (sz == 0) return;
    uint8_t *p = xmalloc(12 + n * sz);
    uint32_t e = elt;
    memcpy(p, &e, 4);
    memcpy(p + 4, &n, 8);
    if (n) memcpy(p + 12, v, n * sz);
    gguf_writer_put(w, key, GGUF_VT_ARRAY, p, 12 + n * sz);
}

void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, const size_t *lens, uint64_t n)
{
    size_t total = 12;
    for (uint64_t i = 0; i < n; i++) total += 8 + (lens ? lens[i] : strlen(v[i]));
    uint8_t *p = xmalloc(total), *q = p + 12;
    uint32_t e = GGUF_VT_STRING;
    memcpy(p, &e, 4);
    memcpy(p + 4, &n, 8);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : strlen(v[i]);
        memcpy(q, &len, 8);
        if (len) memcpy(q + 8, v[i], len);
        q += 8 + len;
    }
    gguf_writer_put(w, key, GGUF_VT_ARRAY, p, total);
}

void gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    gguf_writer_set_arr(w, key, GGUF_VT_INT32, v, n);
}

void gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    gguf_writer_set_arr(w, key, GGUF_VT_FLOAT32, v, n);
}

bool gguf_writer_copy_key(gguf_writer *w, const gguf *src, const char *key)
{
    const gguf_kv *kv = gguf_kv_get(src, key);
    if (!kv) return false;
    size_t off = kv->val_off, len = kv->val_end - kv->val_off;
    if (kv->type == GGUF_VT_ARRAY) {
        off -= 12;  /* include elt + count */
        len += 12;
    }
    uint8_t *p = xmalloc(len ? len : 1);
    memcpy(p, src->map + off, len);
    gguf_writer_put(w, key, kv->type, p, len);
    return true;
}

static gguf_wtensor *gguf_writer_tensor(gguf_writer *w, const char *name, qtype type, int n_dims, const int64_t *ne)
{
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? 2 * w->cap_t : 64;
        w->t = xrealloc(w->t, (size_t)w->cap_t * sizeof *w->t);
    }
    gguf_wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->type = type;
    t->n_dims = n_dims;
    int64_t nel = 1;
    for (int d = 0; d < 4; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        nel *= t->ne[d];
    }
    t->nbytes = quant_row_bytes(type, t->ne[0]) * (size_t)(nel / t->ne[0]);
    return t;
}

void gguf_writer_add_tensor(gguf_writer *w, const char *name, qtype type, int n_dims, const int64_t *ne,
                            const void *data, size_t nbytes)
{
    gguf_wtensor *t = gguf_writer_tensor(w, name, type, n_dims, ne);
    t->data = data;
    t->nbytes = nbytes;
}

void gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, qtype type, int n_dims, const int64_t *ne,
                                 gguf_fill_fn fill, void *ctx)
{
    gguf_wtensor *t = gguf_writer_tensor(w, name, type, n_dims, ne);
    t->fill = fill;
    t->fill_ctx = ctx;
}

size_t gguf_writer_tensor_bytes(qtype type, int n_dims, const int64_t *ne)
{
    int64_t nrows = 1;
    for (int d = 1; d < n_dims; d++) nrows *= ne[d];
    return quant_row_bytes(type, ne[0]) * (size_t)nrows;
}

typedef struct {
    FILE *f;                /* output stream */
    uint64_t pos;           /* bytes written so far */
    bool ok;                /* no write error so far */
} gguf_out;

static void gguf_out_put(gguf_out *o, const void *p, size_t n)
{
    if (!o->ok || n == 0) return;
    if (fwrite(p, 1, n, o->f) != n) o->ok = false;
    o->pos += n;
}

static void gguf_out_pad(gguf_out *o, uint32_t align)
{
    static const uint8_t zeros[GGUF_MAX_ALIGNMENT];
    size_t pad = (size_t)(TM_ALIGN_UP(o->pos, align) - o->pos);
    gguf_out_put(o, zeros, pad);
}

gguf_status gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errsz)
{
    if (err && errsz) err[0] = 0;
    uint32_t align = GGUF_DEFAULT_ALIGNMENT;
    for (int i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, "general.alignment") && w->kv[i].type == GGUF_VT_UINT32) {
            memcpy(&align, w->kv[i].val, 4);
            if (align == 0 || (align & (align - 1)) || align > GGUF_MAX_ALIGNMENT) align = GGUF_DEFAULT_ALIGNMENT;
        }
    size_t plen = strlen(path);
    char *tmp = xmalloc(plen + 8);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        if (err && errsz) snprintf(err, errsz, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return GGUF_ERR_IO;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    gguf_out o = { .f = f, .ok = true };
    uint32_t version = 3;
    uint64_t n_t = (uint64_t)w->n_t, n_kv = (uint64_t)w->n_kv;
    gguf_out_put(&o, GGUF_MAGIC, 4);
    gguf_out_put(&o, &version, 4);
    gguf_out_put(&o, &n_t, 8);
    gguf_out_put(&o, &n_kv, 8);
    for (int i = 0; i < w->n_kv; i++) {
        uint64_t klen = strlen(w->kv[i].key);
        gguf_out_put(&o, &klen, 8);
        gguf_out_put(&o, w->kv[i].key, klen);
        gguf_out_put(&o, &w->kv[i].type, 4);
        gguf_out_put(&o, w->kv[i].val, w->kv[i].val_len);
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        gguf_wtensor *t = &w->t[i];
        uint64_t nlen = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims, ty = (uint32_t)t->type;
        gguf_out_put(&o, &nlen, 8);
        gguf_out_put(&o, t->name, nlen);
        gguf_out_put(&o, &nd, 4);
        for (int d = 0; d < t->n_dims; d++) gguf_out_put(&o, &t->ne[d], 8);
        gguf_out_put(&o, &ty, 4);
        gguf_out_put(&o, &off, 8);
        off = TM_ALIGN_UP(off + t->nbytes, align);
    }
    gguf_out_pad(&o, align);
    gguf_status st = GGUF_OK;
    for (int i = 0; i < w->n_t && o.ok; i++) {
        gguf_wtensor *t = &w->t[i];
        if (t->fill) {
            void *buf = malloc(t->nbytes ? t->nbytes : 1);
            if (!buf) {
                st = GGUF_ERR_NOMEM;
                if (err && errsz) snprintf(err, errsz, "%s: no memory for tensor '%s' (%zu bytes)", path, t->name, t->nbytes);
                break;
            }
            t->fill(t->fill_ctx, t->name, buf, t->nbytes);
            gguf_out_put(&o, buf, t->nbytes);
            free(buf);
        } else {
            gguf_out_put(&o, t->data, t->nbytes);
        }
        gguf_out_pad(&o, align);
    }
    if (fclose(f) != 0) o.ok = false;
    if (st == GGUF_OK && !o.ok) {
        st = GGUF_ERR_IO;
        if (err && errsz) snprintf(err, errsz, "%s: write failed: %s", tmp, strerror(errno));
    }
    if (st == GGUF_OK && rename(tmp, path) != 0) {
        st = GGUF_ERR_IO;
        if (err && errsz) snprintf(err, errsz, "%s: rename failed: %s", path, strerror(errno));
    }
    if (st != GGUF_OK) unlink(tmp);
    free(tmp);
    return st;
}
