/* decode_batch, gather, crc32c and load_zstd: the Python-facing functions.
 *
 * Each function takes every buffer view it needs up front, holds them for the whole call
 * and releases them all at one exit label (`done`), so no bytearray can be resized and no
 * AlignedBuffer freed under us while the GIL is released. The GIL is released only around
 * loops that touch no Python objects (format.c, memcpy, zstd); results and exceptions are
 * built after it is taken back. Nothing keeps a pointer into a buffer after returning.
 */
#include "native.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Parse positional/keyword arguments into values[] (borrowed references). */
static int fd_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   const char *const *names, Py_ssize_t nnames, Py_ssize_t nrequired, PyObject **values) {
    if (nargs > nnames) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments (%zd given)", fname, nnames, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        values[i] = args[i];
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t slot = -1;
        for (Py_ssize_t j = 0; j < nnames; j++) {
            if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0) {
                slot = j;
            }
        }
        if (slot < 0 || values[slot] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated argument %R", fname, key);
            return -1;
        }
        values[slot] = args[nargs + k];
    }
    for (Py_ssize_t j = 0; j < nrequired; j++) {
        if (values[j] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[j]);
            return -1;
        }
    }
    return 0;
}

/* TypeError "<what> is a <type>, not ..." with the type's short name, as _pure words it. */
static void fd_type_error(const char *what, PyObject *obj, const char *rest) {
    PyObject *tname = PyType_GetName(Py_TYPE(obj));
    if (tname != NULL) {
        PyErr_Format(PyExc_TypeError, "%s is a %U, not %s", what, tname, rest);
        Py_DECREF(tname);
    }
}

/* The input buffers of one call: `seq` owns a list/tuple of the objects, views[0..held) are
 * acquired read-only views. Released by fd_sources_release. */
typedef struct {
    PyObject *seq;
    Py_buffer *views;
    Py_ssize_t count, held;
} fd_sources;

static int fd_sources_acquire(fd_sources *s, PyObject *buffers) {
    if (PyList_Check(buffers) || PyTuple_Check(buffers)) {
        s->seq = Py_NewRef(buffers);
    } else {
        PyObject *it = PyObject_GetIter(buffers);
        if (it == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyObject *tname = PyType_GetName(Py_TYPE(buffers));
                if (tname != NULL) {
                    PyErr_Format(PyExc_TypeError, "buffers must be an iterable of buffer objects, not %U", tname);
                    Py_DECREF(tname);
                }
            }
            return -1;
        }
        s->seq = PySequence_List(it);
        Py_DECREF(it);
        if (s->seq == NULL) {
            return -1;
        }
    }
    s->count = PySequence_Fast_GET_SIZE(s->seq);
    s->views = PyMem_Calloc(s->count ? (size_t)s->count : 1, sizeof(Py_buffer));
    if (s->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(s->seq);
    for (Py_ssize_t i = 0; i < s->count; i++) {
        if (PyBytes_CheckExact(items[i])) {
            /* bytes are immutable and `seq` keeps them alive: no export needed, and
             * PyBuffer_Release of a view whose obj is NULL does nothing. */
            s->views[i].buf = PyBytes_AS_STRING(items[i]);
            s->views[i].len = PyBytes_GET_SIZE(items[i]);
            s->views[i].obj = NULL;
        } else if (PyObject_GetBuffer(items[i], &s->views[i], PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            char what[48];
            snprintf(what, sizeof(what), "buffers[%zd]", i);
            fd_type_error(what, items[i],
                          "a contiguous buffer; pass bytes, memoryview, numpy arrays or other buffer-protocol objects");
            return -1;
        }
        s->held = i + 1;
    }
    return 0;
}

static void fd_sources_release(fd_sources *s) {
    for (Py_ssize_t i = 0; i < s->held; i++) {
        PyBuffer_Release(&s->views[i]);
    }
    PyMem_Free(s->views);
    Py_CLEAR(s->seq);
}

/* What went wrong in a GIL-free section, raised after the GIL is back. */
enum { FD_OK = 0, FD_ERR_DECODE, FD_ERR_MISSING, FD_ERR_MEMORY };
typedef struct {
    int kind;
    Py_ssize_t index;
    fd_problem problem;
} fd_failure;

static void fd_raise_decode(fd_state *st, const fd_failure *f) {
    PyObject *exc = PyObject_CallFunction(st->decode_error, "snK", f->problem.message, f->index,
                                          (unsigned long long)f->problem.offset);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* ---- decode_batch ---------------------------------------------------------------- */

typedef struct {
    const uint8_t *name;
    uint32_t bytes, index;
} fd_name;

/* The batch's distinct names: `sorted` for lookup, `by_index` in first-seen order. The
 * pointers point into the held views. Runs without the GIL (PyMem_Raw* only). */
typedef struct {
    fd_name *sorted, *by_index;
    uint32_t count, capacity;
} fd_namebook;

static int fd_name_cmp(const uint8_t *a, uint32_t an, const uint8_t *b, uint32_t bn) {
    int order = memcmp(a, b, an < bn ? an : bn);
    return order != 0 ? order : (an > bn) - (an < bn);
}

/* Index of f's name, adding it when new: >= 0, or -1 at the batch limit, -2 out of memory. */
static int64_t fd_namebook_index(fd_namebook *nb, const fd_field *f) {
    if (f->k < nb->count) {
        const fd_name *guess = &nb->by_index[f->k];
        if (guess->bytes == f->name_bytes && memcmp(guess->name, f->name, f->name_bytes) == 0) {
            return f->k;
        }
    }
    uint32_t lo = 0, hi = nb->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int order = fd_name_cmp(nb->sorted[mid].name, nb->sorted[mid].bytes, f->name, f->name_bytes);
        if (order == 0) {
            return nb->sorted[mid].index;
        }
        if (order < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (nb->count == FD_MAX_BATCH_FIELDS) {
        return -1;
    }
    if (nb->count == nb->capacity) {
        uint32_t capacity = nb->capacity ? nb->capacity * 2 : 32;
        fd_name *sorted = PyMem_RawRealloc(nb->sorted, capacity * sizeof(fd_name));
        if (sorted == NULL) {
            return -2;
        }
        nb->sorted = sorted;
        fd_name *by_index = PyMem_RawRealloc(nb->by_index, capacity * sizeof(fd_name));
        if (by_index == NULL) {
            return -2;
        }
        nb->by_index = by_index;
        nb->capacity = capacity;
    }
    fd_name entry = {f->name, f->name_bytes, nb->count};
    memmove(&nb->sorted[lo + 1], &nb->sorted[lo], (nb->count - lo) * sizeof(fd_name));
    nb->sorted[lo] = entry;
    nb->by_index[nb->count] = entry;
    return nb->count++;
}

/* decode_batch's output, written without the GIL straight into two new bytes objects
 * (nobody else sees them yet). `capacity` rows were reserved from the field counts in the
 * headers; a valid record never needs more (count <= table_bytes / 24 <= len / 24). */
typedef struct {
    int64_t *starts; /* count + 1 entries */
    int64_t *rows;   /* capacity * FD_ROW_WIDTH entries */
    size_t nrows, capacity;
    fd_namebook names;
} fd_layout;

/* Rows to reserve: each record's header field count, bounded as validation will bound it. */
static size_t fd_estimate_rows(const fd_sources *s) {
    size_t total = 0;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        const uint8_t *p = s->views[i].buf;
        uint64_t len = (uint64_t)s->views[i].len;
        uint64_t count = len >= 8 ? (uint64_t)p[6] | (uint64_t)p[7] << 8 : 0;
        count = count < FD_MAX_FIELDS ? count : FD_MAX_FIELDS;
        count = count < len / FD_ENTRY_BYTES ? count : len / FD_ENTRY_BYTES;
        total += (size_t)count;
    }
    return total;
}

static void fd_write_row(int64_t *row, int64_t name_index, const fd_field *f) {
    row[0] = name_index;
    row[1] = f->kind;
    row[2] = f->dtype;
    row[3] = f->codec;
    row[4] = f->ndim;
    row[5] = (int64_t)f->payload_offset;
    row[6] = (int64_t)f->payload_bytes;
    row[7] = (int64_t)f->raw_bytes;
    for (int j = 0; j < FD_MAX_NDIM; j++) {
        row[8 + j] = (int64_t)f->shape[j];
    }
}

/* Validate every record and fill *out. Runs without the GIL. */
static void fd_decode_all(const fd_sources *s, int verify, const fd_crc *crc, fd_layout *out, fd_failure *fail) {
    out->starts[0] = 0;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        fd_record rec;
        fd_field f;
        int status = fd_record_open(&rec, s->views[i].buf, (uint64_t)s->views[i].len, verify, crc, &fail->problem);
        if (status == 0 && rec.count > out->capacity - out->nrows) {
            /* Only a buffer that another thread rewrote since fd_estimate_rows gets here. */
            status = fd_problem_set(&fail->problem, 6, "record changed while decode_batch was reading it");
        }
        uint64_t limit_offset = UINT64_MAX; /* the first name past the batch limit, if any */
        while (status == 0 && (status = fd_record_next(&rec, &f, &fail->problem)) == 1) {
            int64_t index = fd_namebook_index(&out->names, &f);
            if (index == -2) {
                fail->kind = FD_ERR_MEMORY;
                return;
            }
            if (index == -1 && limit_offset == UINT64_MAX) {
                limit_offset = f.name_offset;
            }
            fd_write_row(out->rows + out->nrows * FD_ROW_WIDTH, index, &f);
            out->nrows++;
            status = 0;
        }
        if (status == 0 && limit_offset != UINT64_MAX) {
            status = fd_problem_set(&fail->problem, limit_offset, "more than 4096 distinct field names in one batch");
        }
        if (status < 0) {
            fail->kind = FD_ERR_DECODE;
            fail->index = i;
            return;
        }
        out->starts[i + 1] = (int64_t)out->nrows;
    }
}

/* (names, starts, rows); steals starts and rows. Runs with the GIL. */
static PyObject *fd_layout_result(const fd_layout *out, PyObject *starts, PyObject *rows) {
    PyObject *names = PyTuple_New(out->names.count);
    if (names == NULL) {
        goto fail;
    }
    for (uint32_t j = 0; j < out->names.count; j++) {
        const fd_name *n = &out->names.by_index[j];
        PyObject *name = PyUnicode_DecodeUTF8((const char *)n->name, n->bytes, "strict");
        if (name == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(names, j, name);
    }
    Py_ssize_t used = (Py_ssize_t)(out->nrows * FD_ROW_WIDTH * sizeof(int64_t));
    if (used != PyBytes_GET_SIZE(rows) && _PyBytes_Resize(&rows, used) < 0) {
        goto fail;
    }
    return Py_BuildValue("(NNN)", names, starts, rows); /* steals all three, also on failure */
fail:
    Py_XDECREF(names);
    Py_DECREF(starts);
    Py_XDECREF(rows);
    return NULL;
}

/* decode_batch(buffers, verify=False) -> (names, starts, rows). Returns a new reference.
 * Borrowed: the arguments. Owned until `done`: the views, the layout arrays. The
 * validation loop runs without the GIL. */
PyObject *fd_decode_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"buffers", "verify"};
    PyObject *values[2] = {NULL, NULL};
    if (fd_args("decode_batch", args, nargs, kwnames, names, 2, 1, values) < 0) {
        return NULL;
    }
    int verify = values[1] ? PyObject_IsTrue(values[1]) : 0;
    if (verify < 0) {
        return NULL;
    }
    fd_state *st = fd_get_state(module);
    fd_sources src = {NULL, NULL, 0, 0};
    fd_layout out;
    memset(&out, 0, sizeof(out));
    fd_failure fail;
    memset(&fail, 0, sizeof(fail));
    PyObject *starts = NULL, *rows = NULL, *result = NULL;
    if (fd_sources_acquire(&src, values[0]) < 0) {
        goto done;
    }
    out.capacity = fd_estimate_rows(&src);
    if (out.capacity > (size_t)PY_SSIZE_T_MAX / (FD_ROW_WIDTH * sizeof(int64_t))) {
        PyErr_NoMemory();
        goto done;
    }
    starts = PyBytes_FromStringAndSize(NULL, (src.count + 1) * (Py_ssize_t)sizeof(int64_t));
    rows = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(out.capacity * FD_ROW_WIDTH * sizeof(int64_t)));
    if (starts == NULL || rows == NULL) {
        goto done;
    }
    out.starts = (int64_t *)PyBytes_AS_STRING(starts);
    out.rows = (int64_t *)PyBytes_AS_STRING(rows);
    Py_BEGIN_ALLOW_THREADS
    fd_decode_all(&src, verify, &st->crc, &out, &fail);
    Py_END_ALLOW_THREADS
    if (fail.kind == FD_ERR_DECODE) {
        fd_raise_decode(st, &fail);
    } else if (fail.kind == FD_ERR_MEMORY) {
        PyErr_NoMemory();
    } else {
        result = fd_layout_result(&out, starts, rows);
        starts = rows = NULL;
    }
done:
    Py_XDECREF(starts);
    Py_XDECREF(rows);
    PyMem_RawFree(out.names.sorted);
    PyMem_RawFree(out.names.by_index);
    fd_sources_release(&src);
    return result;
}

/* ---- gather ---------------------------------------------------------------------- */

/* NOTE[gather-snapshot]: pass 1 validates each record and copies what pass 2 needs into a
 * span; pass 2 reads only spans, never the record headers again. Another thread may write
 * into an input buffer while the GIL is released (a numpy array is mutable); that can make
 * the copied bytes wrong, but never make pass 2 read or write outside the views, whose
 * lengths cannot change while we hold them. */
typedef struct {
    const uint8_t *payload;
    uint64_t payload_offset, payload_bytes, raw_bytes;
    uint32_t k;
    uint8_t codec;
} fd_span;

typedef struct {
    uint64_t total;
    int overflow, any_zstd;
} fd_plan;

/* Pass 1: validate and locate. Runs without the GIL. */
static void fd_locate(const fd_sources *s, const uint8_t *want, uint64_t want_bytes, int verify, const fd_crc *crc,
                      fd_span *spans, fd_plan *plan, fd_failure *fail) {
    for (Py_ssize_t i = 0; i < s->count; i++) {
        fd_record rec;
        fd_field f;
        int found = 0, status = fd_record_open(&rec, s->views[i].buf, (uint64_t)s->views[i].len, verify, crc,
                                               &fail->problem);
        while (status == 0 && (status = fd_record_next(&rec, &f, &fail->problem)) == 1) {
            if (f.name_bytes == want_bytes && memcmp(f.name, want, want_bytes) == 0) {
                spans[i] = (fd_span){rec.data + f.payload_offset, f.payload_offset, f.payload_bytes, f.raw_bytes, f.k,
                                     f.codec};
                found = 1;
            }
            status = 0;
        }
        if (status < 0 || !found) {
            fail->kind = status < 0 ? FD_ERR_DECODE : FD_ERR_MISSING;
            fail->index = i;
            return;
        }
        if (spans[i].raw_bytes > UINT64_MAX - plan->total) {
            plan->overflow = 1;
        }
        plan->total += spans[i].raw_bytes;
        plan->any_zstd |= spans[i].codec == FD_CODEC_ZSTD;
    }
}

/* Pass 2: copy or decompress each span into dst (capacity already checked). Runs without
 * the GIL; one zstd context per call, nothing allocated per record. */
static void fd_copy(const fd_span *spans, Py_ssize_t count, uint8_t *dst, const fd_zstd_api *zstd, int any_zstd,
                    fd_failure *fail) {
    void *dctx = NULL;
    if (any_zstd && (dctx = zstd->create_dctx()) == NULL) {
        fail->kind = FD_ERR_MEMORY;
        return;
    }
    uint64_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const fd_span *sp = &spans[i];
        if (sp->codec == FD_CODEC_NONE) {
            memcpy(dst + pos, sp->payload, (size_t)sp->raw_bytes);
        } else {
            size_t got = zstd->decompress_dctx(dctx, dst + pos, (size_t)sp->raw_bytes, sp->payload,
                                               (size_t)sp->payload_bytes);
            if (zstd->is_error(got) || got != sp->raw_bytes) {
                fd_problem_set(&fail->problem, sp->payload_offset,
                               "field %" PRIu32 ": zstd payload does not decompress to its declared %" PRIu64 " bytes",
                               sp->k, sp->raw_bytes);
                fail->kind = FD_ERR_DECODE;
                fail->index = i;
                break;
            }
        }
        pos += sp->raw_bytes;
    }
    if (dctx != NULL) {
        zstd->free_dctx(dctx);
    }
}

static int fd_check_overlap(const Py_buffer *out, const fd_sources *s) {
    uintptr_t lo = (uintptr_t)out->buf, hi = lo + (uintptr_t)out->len;
    for (Py_ssize_t i = 0; out->len > 0 && i < s->count; i++) {
        uintptr_t a = (uintptr_t)s->views[i].buf, b = a + (uintptr_t)s->views[i].len;
        if (s->views[i].len > 0 && a < hi && lo < b) {
            PyErr_Format(PyExc_ValueError, "out overlaps buffers[%zd]; gather needs a separate destination", i);
            return -1;
        }
    }
    return 0;
}

static void fd_raise_capacity(PyObject *field, Py_ssize_t out_len, Py_ssize_t count, const fd_plan *plan) {
    char needs[48];
    if (plan->overflow) {
        snprintf(needs, sizeof(needs), "more than 18446744073709551615");
    } else {
        snprintf(needs, sizeof(needs), "%" PRIu64, plan->total);
    }
    PyErr_Format(PyExc_ValueError, "out holds %zd bytes but field %R of %zd records needs %s", out_len, field, count,
                 needs);
}

/* gather(buffers, field, out, verify=False) -> int. Returns a new reference.
 * Borrowed: the arguments. Owned until `done`: the views of out and of every buffer, the
 * spans. Both passes run without the GIL; zstd is bound (GIL held) between them. */
PyObject *fd_gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"buffers", "field", "out", "verify"};
    PyObject *values[4] = {NULL, NULL, NULL, NULL};
    if (fd_args("gather", args, nargs, kwnames, names, 4, 3, values) < 0) {
        return NULL;
    }
    PyObject *field = values[1];
    if (!PyUnicode_Check(field)) {
        PyObject *tname = PyType_GetName(Py_TYPE(field));
        if (tname != NULL) {
            PyErr_Format(PyExc_TypeError, "field must be a str, not %U", tname);
            Py_DECREF(tname);
        }
        return NULL;
    }
    int verify = values[3] ? PyObject_IsTrue(values[3]) : 0;
    if (verify < 0) {
        return NULL;
    }
    Py_ssize_t want_bytes;
    const char *want = PyUnicode_AsUTF8AndSize(field, &want_bytes);
    if (want == NULL) {
        return NULL;
    }
    fd_state *st = fd_get_state(module);
    fd_sources src = {NULL, NULL, 0, 0};
    Py_buffer out;
    int have_out = 0;
    fd_span *spans = NULL;
    fd_plan plan = {0, 0, 0};
    fd_failure fail;
    memset(&fail, 0, sizeof(fail));
    fd_zstd_api zstd;
    memset(&zstd, 0, sizeof(zstd));
    PyObject *result = NULL;
    if (PyObject_GetBuffer(values[2], &out, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        fd_type_error("out", values[2], "a writable contiguous buffer; allocate it with aligned_empty(nbytes)");
        goto done;
    }
    have_out = 1;
    if (fd_sources_acquire(&src, values[0]) < 0 || fd_check_overlap(&out, &src) < 0) {
        goto done;
    }
    spans = PyMem_RawMalloc((size_t)(src.count ? src.count : 1) * sizeof(fd_span));
    if (spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    fd_locate(&src, (const uint8_t *)want, (uint64_t)want_bytes, verify, &st->crc, spans, &plan, &fail);
    Py_END_ALLOW_THREADS
    if (fail.kind == FD_ERR_DECODE) {
        fd_raise_decode(st, &fail);
        goto done;
    }
    if (fail.kind == FD_ERR_MISSING) {
        PyErr_Format(PyExc_KeyError, "record %zd has no field %R", fail.index, field);
        goto done;
    }
    if (plan.overflow || plan.total > (uint64_t)out.len) {
        fd_raise_capacity(field, out.len, src.count, &plan);
        goto done;
    }
    if (plan.any_zstd && fd_zstd_snapshot(st, &zstd) < 0) {
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    fd_copy(spans, src.count, out.buf, &zstd, plan.any_zstd, &fail);
    Py_END_ALLOW_THREADS
    if (fail.kind == FD_ERR_DECODE) {
        fd_raise_decode(st, &fail);
    } else if (fail.kind == FD_ERR_MEMORY) {
        PyErr_NoMemory();
    } else {
        result = PyLong_FromUnsignedLongLong(plan.total);
    }
done:
    PyMem_RawFree(spans);
    fd_sources_release(&src);
    if (have_out) {
        PyBuffer_Release(&out);
    }
    return result;
}

/* ---- crc32c, load_zstd ------------------------------------------------------------ */

/* crc32c(data, value=0, method="auto") -> int. Returns a new reference. Borrowed: the
 * arguments; the view of data is held until `done`. Large inputs are summed without the GIL. */
PyObject *fd_crc32c_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"data", "value", "method"};
    static const char *const methods[] = {"auto", "hardware", "table"};
    PyObject *values[3] = {NULL, NULL, NULL};
    if (fd_args("crc32c", args, nargs, kwnames, names, 3, 1, values) < 0) {
        return NULL;
    }
    int method = values[2] == NULL ? FD_CRC_AUTO : -1;
    for (int m = 0; m < 3 && method < 0; m++) {
        if (PyUnicode_Check(values[2]) && PyUnicode_CompareWithASCIIString(values[2], methods[m]) == 0) {
            method = m;
        }
    }
    if (method < 0) {
        PyErr_Format(PyExc_ValueError, "method must be 'auto', 'hardware' or 'table', not %R", values[2]);
        return NULL;
    }
    unsigned long long value = 0;
    if (values[1] != NULL) {
        int ok = PyLong_Check(values[1]) && !PyBool_Check(values[1]);
        value = ok ? PyLong_AsUnsignedLongLong(values[1]) : 0;
        if (ok && value == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
        }
        if (!ok || value > 0xFFFFFFFFull) {
            PyErr_Format(PyExc_ValueError, "value must be an int in 0..2**32-1, not %R", values[1]);
            return NULL;
        }
    }
    fd_state *st = fd_get_state(module);
    if (method == FD_CRC_HARDWARE && !st->crc.hardware) {
        PyErr_SetString(PyExc_ValueError, "this CPU has no SSE4.2 crc32 instruction; use method='auto' or 'table'");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(values[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        fd_type_error("data", values[0],
                      "a contiguous buffer; pass bytes, memoryview, numpy arrays or other buffer-protocol objects");
        return NULL;
    }
    uint32_t crc;
    if (view.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        crc = fd_crc32c(&st->crc, method, (uint32_t)value, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = fd_crc32c(&st->crc, method, (uint32_t)value, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* load_zstd(soname="libzstd.so.1") -> str. Returns a new reference; runs with the GIL. */
PyObject *fd_load_zstd(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"soname"};
    PyObject *values[1] = {NULL};
    if (fd_args("load_zstd", args, nargs, kwnames, names, 1, 0, values) < 0) {
        return NULL;
    }
    const char *soname = "libzstd.so.1";
    if (values[0] != NULL) {
        if (!PyUnicode_Check(values[0])) {
            PyObject *tname = PyType_GetName(Py_TYPE(values[0]));
            if (tname != NULL) {
                PyErr_Format(PyExc_TypeError, "soname must be a str, not %U", tname);
                Py_DECREF(tname);
            }
            return NULL;
        }
        soname = PyUnicode_AsUTF8(values[0]);
        if (soname == NULL) {
            return NULL;
        }
    }
    fd_state *st = fd_get_state(module);
    fd_zstd_api api;
    if (fd_zstd_load(st, soname) < 0 || fd_zstd_snapshot(st, &api) < 0) {
        return NULL;
    }
    return PyUnicode_FromString(api.version());
}
