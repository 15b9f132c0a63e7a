/* decode_batch: validate N records and report where every field's payload is, without
 * copying payloads. The views are taken up front and released at one exit label; the
 * validation loop runs without the GIL and writes straight into two new bytes objects.
 */
#include "native.h"

#include <string.h>

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

/* Bytewise order, shorter first on a tie: the order the format sorts names in. */
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

/* Rows to reserve: each record's header field count, bounded as validation will bound it.
 * Runs with the GIL, before the GIL-free pass; reads the held views only. */
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

/* One decode_batch row (docs/record-format.md, "The decoder API"). Runs without the GIL. */
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
