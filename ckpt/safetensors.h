/* safetensors.h - the safetensors file format (Hugging Face): a strict reader that validates the whole header
 * before anything is read, and a streaming writer that fixes the header from the sizes up front so tensors
 * of any size go out in bounded memory. Layout: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data.
 * Functions return 0 or a negative errno and, on failure, write one line into err naming the file and the
 * header field. */
#ifndef ZS_SAFETENSORS_H
#define ZS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ZS_ST_MAX_DIMS 8
#define ZS_ST_MAX_HEADER 100000000ull /* bytes of JSON, the limit the reference implementation enforces */

enum zs_st_dtype {
    ZS_ST_F64, ZS_ST_F32, ZS_ST_F16, ZS_ST_BF16, ZS_ST_I64, ZS_ST_I32, ZS_ST_I16, ZS_ST_I8, ZS_ST_U8, ZS_ST_BOOL,
    ZS_ST_NDTYPES
};

struct zs_st_tensor {
    const char *name;
    enum zs_st_dtype dtype;
    int32_t ndim;
    int64_t shape[ZS_ST_MAX_DIMS];
    int64_t numel;      /* product of shape (1 for a scalar) */
    uint64_t offset;    /* byte offset of the data in the file */
    uint64_t nbytes;
};

const char *zs_st_dtype_name(enum zs_st_dtype d); /* "F32", ...; "?" when out of range */
int zs_st_dtype_size(enum zs_st_dtype d);         /* bytes per element; 0 when out of range */
/* Formats a one-line message into err (when given; control characters become '?') and returns rc: how
 * these functions report. */
int zs_st_msg(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

// ----------------------------------------------------------------------------------- reader

struct zs_st;

/* Opens and validates a file: header length within the file and at most ZS_ST_MAX_HEADER, valid UTF-8 JSON
 * object, every tensor's dtype, shape (at most ZS_ST_MAX_DIMS dims, product checked for overflow) and
 * data_offsets (end - begin = numel x dtype size; sorted, no gap or overlap, from 0 to the end of the file),
 * __metadata__ a string -> string object. */
int zs_st_open(struct zs_st **st, const char *path, char *err, size_t errlen);
/* The same over a whole file image in memory (buf must outlive *st); `what` names it in messages. */
int zs_st_open_mem(struct zs_st **st, const void *buf, size_t len, const char *what, char *err, size_t errlen);
/* Validates a header alone: len bytes of JSON followed by data_len bytes of data. Reads fail on the result. */
int zs_st_parse_header(struct zs_st **st, const char *json, size_t len, uint64_t data_len, const char *what,
                       char *err, size_t errlen);
void zs_st_close(struct zs_st *st);

int zs_st_count(const struct zs_st *st);
const struct zs_st_tensor *zs_st_get(const struct zs_st *st, int i); /* in file order; NULL when out of range */
const struct zs_st_tensor *zs_st_find(const struct zs_st *st, const char *name); /* NULL when absent */
int zs_st_meta_count(const struct zs_st *st);
/* The i-th __metadata__ entry; returns the value and sets *key, or NULL when i is out of range. */
const char *zs_st_meta_get(const struct zs_st *st, int i, const char **key);
const char *zs_st_meta_find(const struct zs_st *st, const char *key);

/* Reads elements [first, first + count) of t (a tensor of st) as fp32: F32, F16 and BF16 convert exactly;
 * other dtypes are refused. */
int zs_st_read_f32(struct zs_st *st, const struct zs_st_tensor *t, int64_t first, int64_t count, float *dst,
                   char *err, size_t errlen);

// ----------------------------------------------------------------------------------- streaming writer

struct zs_st_writer;

/* Creates path.tmp and writes the header for `n` tensors (name, dtype, ndim and shape are read; the other
 * fields are ignored), laid out contiguously in the given order. meta: NULL or key, value, key, value, ...,
 * NULL. The header is padded with spaces so the data start at a multiple of 8 bytes. */
int zs_st_writer_open(struct zs_st_writer **w, const char *path, const struct zs_st_tensor *tensors, int n,
                      const char *const *meta, char *err, size_t errlen);
/* Appends the next bytes of tensor data (any split: a tensor over several calls, several tensors in one);
 * more than the header promised is an error. */
int zs_st_writer_append(struct zs_st_writer *w, const void *data, size_t bytes, char *err, size_t errlen);
/* Checks every promised byte was written, fsyncs, renames path.tmp to path and fsyncs the directory.
 * Frees w whatever happens; on failure path.tmp is removed and path left as it was. */
int zs_st_writer_close(struct zs_st_writer *w, char *err, size_t errlen);
/* Gives up: removes path.tmp and frees w. */
void zs_st_writer_abort(struct zs_st_writer *w);
/* Bytes the file will have (header included) once every tensor is appended. */
uint64_t zs_st_writer_file_bytes(const struct zs_st_writer *w);

#endif /* ZS_SAFETENSORS_H */
