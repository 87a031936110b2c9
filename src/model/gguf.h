/*
 * gguf: reading GGUF v2/v3 model files through a read-only shared mmap, and writing them.
 *
 * Reader: gguf_open maps the file, parses the header, every metadata key/value (all value
 * types, arrays included, nested arrays rejected as the format allows only one level for our
 * needs) and every tensor info, and validates all of it against the mapping before returning:
 * string and array lengths, tensor types and shapes, data offsets aligned to
 * general.alignment (default 32) and tensor bytes inside the file. After a successful open no
 * accessor can read past the mapping. Strings are NOT NUL-terminated in the file, so the
 * accessors return (pointer, length) pairs.
 *
 * Writer: collects key/values and tensors in memory (tensor data is referenced, not copied,
 * unless the caller asks) and writes the file in one pass with correct padding.
 */
#ifndef TM_GGUF_H
#define TM_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "model/quant.h"

typedef enum {
    GGUF_OK = 0,
    GGUF_ERR_IO,         /* open/stat/mmap/write failed (errno in message) */
    GGUF_ERR_TRUNCATED,  /* the file ends inside the header, metadata or tensor infos */
    GGUF_ERR_MAGIC,      /* not a GGUF file */
    GGUF_ERR_VERSION,    /* unsupported GGUF version */
    GGUF_ERR_FORMAT,     /* malformed metadata: bad value type, absurd count, bad alignment */
    GGUF_ERR_TYPE,       /* unknown or unsupported tensor type */
    GGUF_ERR_BOUNDS,     /* tensor data outside the file, or misaligned */
    GGUF_ERR_SHAPE,      /* tensor shape invalid (zero/negative dims, row not a block multiple) */
    GGUF_ERR_MISSING,    /* a required key or tensor is absent (used by model loading) */
    GGUF_ERR_NOMEM,
} gguf_status;

typedef enum {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
} gguf_vtype;

typedef struct {
    const char *name;      /* NUL-terminated copy owned by the gguf */
    int n_dims;            /* 1..4 */
    int64_t ne[4];         /* elements per dim, ne[0] = row length (contiguous); unused = 1 */
    qtype type;
    uint64_t offset;       /* bytes from the start of the data section */
    size_t nbytes;         /* bytes of data */
    const void *data;      /* inside the mapping */
} gguf_tensor;

typedef struct gguf gguf;

/* Opens and validates PATH. On failure returns the status, writes a one-line human message
 * naming the problem into err (if errsz > 0) and sets *out = NULL. */
gguf_status gguf_open(const char *path, gguf **out, char *err, size_t errsz);
void gguf_close(gguf *g);
const char *gguf_status_name(gguf_status st);

uint32_t gguf_version(const gguf *g);
size_t gguf_file_size(const gguf *g);
/* The whole file as mapped (gguf_file_size bytes, NULL when empty) and its stat at open. */
const void *gguf_file_map(const gguf *g);
struct stat;
const struct stat *gguf_file_stat(const gguf *g);

/* Metadata. gguf_find_key returns the key index or -1. */
int gguf_n_keys(const gguf *g);
int gguf_find_key(const gguf *g, const char *key);
const char *gguf_key_name(const gguf *g, int ki);
gguf_vtype gguf_key_type(const gguf *g, int ki);
/* Scalar getters convert between integer widths / float widths; they return false when the
 * key is absent or of an incompatible type (e.g. a string asked as an int). */
bool gguf_get_int(const gguf *g, const char *key, int64_t *out);
bool gguf_get_float(const gguf *g, const char *key, double *out);
bool gguf_get_bool(const gguf *g, const char *key, bool *out);
bool gguf_get_str(const gguf *g, const char *key, const char **s, size_t *len);
/* Arrays: element type and count; for numeric element types *data points at the packed
 * little-endian elements inside the mapping. String arrays are read with gguf_arr_str. */
bool gguf_get_arr(const gguf *g, const char *key, gguf_vtype *elt, uint64_t *n, const void **data);
bool gguf_arr_str(const gguf *g, const char *key, uint64_t i, const char **s, size_t *len);

/* Tensors. */
int gguf_n_tensors(const gguf *g);
const gguf_tensor *gguf_tensor_at(const gguf *g, int i);
const gguf_tensor *gguf_find_tensor(const gguf *g, const char *name);

/* Writer. Keys keep insertion order; setting a key twice replaces the value. Tensor data
 * pointers must stay valid until gguf_writer_write returns. */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, const size_t *lens, uint64_t n);
void gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
void gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);
/* Copies one key/value (any type, arrays included) from an open gguf: used to carry a
 * vocabulary over from another file. Returns false if the key is absent. */
bool gguf_writer_copy_key(gguf_writer *w, const gguf *src, const char *key);
void gguf_writer_add_tensor(gguf_writer *w, const char *name, qtype type, int n_dims,
                            const int64_t *ne, const void *data, size_t nbytes);
/* Writes the file (GGUF v3, to PATH.tmp then renamed). */
gguf_status gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errsz);

/* Additions (helper "gguf"): */
/* File offset of the tensor data section, and the data alignment in bytes. */
size_t gguf_data_offset(const gguf *g);
uint32_t gguf_alignment(const gguf *g);
/* Any scalar type (not string/array): V points at the value in its C type. */
void gguf_writer_set_scalar(gguf_writer *w, const char *key, gguf_vtype t, const void *v);
/* A numeric array of any element type (not string/array); V holds N packed elements. */
void gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elt, const void *v, uint64_t n);
/* A tensor whose data is produced at write time: FILL is called once, during
 * gguf_writer_write, with a buffer of exactly the tensor's byte size to fill. Lets callers
 * write models larger than they want to hold in memory. */
typedef void (*gguf_fill_fn)(void *ctx, const char *name, void *dst, size_t nbytes);
void gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, qtype type, int n_dims,
                                 const int64_t *ne, gguf_fill_fn fill, void *ctx);
/* Bytes of a tensor of TYPE and shape NE (ne[0] a multiple of the block size). */
size_t gguf_writer_tensor_bytes(qtype type, int n_dims, const int64_t *ne);

#endif
