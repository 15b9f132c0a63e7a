/* Shared declarations of the fastdata.io_native._native extension.
 *
 * Module state replaces C globals (multi-phase init): each sub-interpreter that imports
 * the module gets its own error references, type objects, CRC table and zstd binding.
 * The record format these files implement is specified in docs/record-format.md.
 */
#ifndef FASTDATA_NATIVE_H
#define FASTDATA_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stddef.h>
#include <stdint.h>

/* Limits and layout of record format version 1 (docs/record-format.md, "Limits"). */
#define FD_FORMAT_VERSION 1
#define FD_HEADER_BYTES 32
#define FD_ENTRY_BYTES 24
#define FD_PAYLOAD_ALIGNMENT 64
#define FD_MAX_FIELDS 1024
#define FD_MAX_NAME_BYTES 255
#define FD_MAX_NDIM 8
#define FD_MAX_RECORD_BYTES ((uint64_t)1 << 40)
#define FD_MAX_FIELD_BYTES ((uint64_t)1 << 40)
#define FD_MAX_BATCH_FIELDS 4096
#define FD_ROW_WIDTH 16
#define FD_NUM_DTYPES 14

enum { FD_KIND_BYTES = 0, FD_KIND_STR = 1, FD_KIND_SCALAR = 2, FD_KIND_ARRAY = 3 };
enum { FD_CODEC_NONE = 0, FD_CODEC_ZSTD = 1 };
enum { FD_CRC_AUTO = 0, FD_CRC_HARDWARE = 1, FD_CRC_TABLE = 2 };

/* CRC-32C tables, filled once at exec: slicing-by-8, and for the hardware path's streams
 * of 2**k bytes (NOTE[crc-streams] in crc32c.c) what 2**k zero bytes do to a register,
 * k = FD_CRC_MIN_STREAM_LOG..FD_CRC_MAX_STREAM_LOG; whether the CPU has SSE4.2 and AVX2. */
#define FD_CRC_MIN_STREAM_LOG 6
#define FD_CRC_MAX_STREAM_LOG 16
typedef struct {
    uint32_t table[8][256];
    uint32_t zeros[FD_CRC_MAX_STREAM_LOG - FD_CRC_MIN_STREAM_LOG + 1][4][256];
    int hardware, avx2;
} fd_crc;

/* The few libzstd entry points we use, looked up with dlsym (no zstd headers needed). */
typedef struct {
    const char *(*version)(void);
    void *(*create_dctx)(void);
    size_t (*free_dctx)(void *dctx);
    size_t (*decompress_dctx)(void *dctx, void *dst, size_t capacity, const void *src, size_t size);
    unsigned (*is_error)(size_t code);
} fd_zstd_api;

typedef struct {
    PyObject *decode_error;       /* fastdata.io_native._errors.DecodeError (strong ref) */
    PyObject *codec_error;        /* fastdata.io_native._errors.CodecUnavailableError (strong ref) */
    PyTypeObject *aligned_type;   /* AlignedBuffer heap type (strong ref) */
    PyThread_type_lock zstd_lock; /* guards the zstd_* fields below */
    int zstd_status;              /* 0 not tried, 1 loaded, -1 failed */
    fd_zstd_api zstd;             /* valid when zstd_status == 1; libraries are never closed */
    char zstd_problem[400];       /* why loading failed, when zstd_status == -1 */
    fd_crc crc;
} fd_state;

static inline fd_state *fd_get_state(PyObject *module) {
    return (fd_state *)PyModule_GetState(module);
}

/* One validated field table entry; pointers point into the record being parsed. */
typedef struct {
    uint32_t k; /* position in the record's field table */
    uint8_t kind, dtype, codec, ndim;
    const uint8_t *name;
    uint32_t name_bytes;
    uint64_t name_offset;
    uint64_t payload_offset, payload_bytes, raw_bytes;
    uint64_t shape[FD_MAX_NDIM];
} fd_field;

/* A record being walked entry by entry (format.c). */
typedef struct {
    const uint8_t *data;
    uint64_t len;
    uint32_t count, k;
    uint64_t pos, table_end, cursor;
    const uint8_t *prev_name;
    uint32_t prev_name_bytes;
} fd_record;

/* A validation failure: the spec's message and the byte offset inside the record. */
typedef struct {
    uint64_t offset;
    char message[240];
} fd_problem;

/* The input buffers of one call: `seq` owns a list/tuple of the objects, views[0..held) are
 * acquired read-only views. Released by fd_sources_release. */
typedef struct {
    PyObject *seq;
    Py_buffer *views;
    Py_ssize_t count, held;
} fd_sources;

/* What went wrong in a GIL-free section, raised after the GIL is back. */
enum { FD_OK = 0, FD_ERR_DECODE, FD_ERR_MISSING, FD_ERR_MEMORY };
typedef struct {
    int kind;
    Py_ssize_t index;
    fd_problem problem;
} fd_failure;

/* format.c: pure C, no Python objects; safe to call without the GIL. */
int fd_record_open(fd_record *rec, const uint8_t *data, uint64_t len, int verify, const fd_crc *crc,
                   fd_problem *problem);
int fd_record_next(fd_record *rec, fd_field *field, fd_problem *problem);
int fd_problem_set(fd_problem *problem, uint64_t offset, const char *fmt, ...);

/* crc32c.c: pure C; safe without the GIL. */
void fd_crc_init(fd_crc *crc);
uint32_t fd_crc32c(const fd_crc *crc, int method, uint32_t value, const uint8_t *data, size_t len);
/* Extends value over src[0, len) while copying it to dst (not overlapping src), in one pass
 * (NOTE[crc-copy] in crc32c.c). FD_CRC_AUTO picks the fastest kernel, FD_CRC_HARDWARE the
 * SSE4.2 one without AVX2 moves, FD_CRC_TABLE slicing-by-8. */
uint32_t fd_crc32c_copy(const fd_crc *crc, int method, uint32_t value, uint8_t *dst, const uint8_t *src, size_t len);

/* zstd.c: called with the GIL held. */
int fd_zstd_load(fd_state *st, const char *soname);
int fd_zstd_snapshot(fd_state *st, fd_zstd_api *api);

/* common.c: called with the GIL held. */
int fd_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
            Py_ssize_t nnames, Py_ssize_t nrequired, PyObject **values);
void fd_type_error(const char *what, PyObject *obj, const char *rest);
int fd_sources_acquire(fd_sources *s, PyObject *buffers);
void fd_sources_release(fd_sources *s);
void fd_raise_decode(fd_state *st, const fd_failure *f);

/* aligned.c */
int fd_aligned_init_type(PyObject *module, fd_state *st);
PyObject *fd_aligned_empty(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* The module's functions (decode.c, gather.c, crc32c.c, zstd.c). */
PyObject *fd_decode_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *fd_gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *fd_crc32c_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *fd_load_zstd(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif
