/* fastdata.io_native._native: module definition (multi-phase init, no C globals).
 *
 * One file per concern: aligned.c (allocation), format.c (record validation), common.c
 * (arguments, buffer views), decode.c, gather.c, crc32c.c, zstd.c. This file wires them
 * into the module, imports the error classes into module state and exports the format
 * constants that _pure.py also exports.
 */
#include "native.h"

static PyMethodDef fd_methods[] = {
    {"aligned_empty", (PyCFunction)(void (*)(void))fd_aligned_empty, METH_FASTCALL | METH_KEYWORDS,
     "aligned_empty(nbytes, alignment=4096)\n--\n\n"
     "Allocate an uninitialised writable buffer whose address is a multiple of alignment."},
    {"decode_batch", (PyCFunction)(void (*)(void))fd_decode_batch, METH_FASTCALL | METH_KEYWORDS,
     "decode_batch(buffers, verify=False)\n--\n\n"
     "Validate N records; return (names, starts, rows) locating their fields without copying."},
    {"gather", (PyCFunction)(void (*)(void))fd_gather, METH_FASTCALL | METH_KEYWORDS,
     "gather(buffers, field, out, verify=False)\n--\n\n"
     "Copy one field of N records back to back into out (GIL released); return bytes written."},
    {"crc32c", (PyCFunction)(void (*)(void))fd_crc32c_py, METH_FASTCALL | METH_KEYWORDS,
     "crc32c(data, value=0, method='auto', out=None)\n--\n\n"
     "Extend the CRC-32C value over data (copying data into out in the same pass)."},
    {"load_zstd", (PyCFunction)(void (*)(void))fd_load_zstd, METH_FASTCALL | METH_KEYWORDS,
     "load_zstd(soname='libzstd.so.1')\n--\n\n"
     "Load libzstd for zstd payloads and return its version."},
    {NULL, NULL, 0, NULL},
};

static const char *const fd_dtype_names[FD_NUM_DTYPES] = {
    "bool",  "int8",   "uint8",   "int16",   "uint16",  "int32",     "uint32",
    "int64", "uint64", "float16", "float32", "float64", "complex64", "complex128",
};

/* PyModule_Add (3.13+) for 3.11: add value to module, stealing the reference. */
static int fd_module_add(PyObject *module, const char *name, PyObject *value) {
    if (value == NULL) {
        return -1;
    }
    int rc = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return rc;
}

static int fd_add_constants(PyObject *module) {
    static const struct {
        const char *name;
        long long value;
    } ints[] = {
        {"FORMAT_VERSION", FD_FORMAT_VERSION},
        {"HEADER_BYTES", FD_HEADER_BYTES},
        {"ENTRY_BYTES", FD_ENTRY_BYTES},
        {"PAYLOAD_ALIGNMENT", FD_PAYLOAD_ALIGNMENT},
        {"MAX_FIELDS", FD_MAX_FIELDS},
        {"MAX_NAME_BYTES", FD_MAX_NAME_BYTES},
        {"MAX_NDIM", FD_MAX_NDIM},
        {"MAX_RECORD_BYTES", (long long)FD_MAX_RECORD_BYTES},
        {"MAX_FIELD_BYTES", (long long)FD_MAX_FIELD_BYTES},
        {"MAX_BATCH_FIELDS", FD_MAX_BATCH_FIELDS},
        {"ROW_WIDTH", FD_ROW_WIDTH},
        {"MAX_ALIGNMENT", (long long)1 << 30},
        {"KIND_BYTES", FD_KIND_BYTES},
        {"KIND_STR", FD_KIND_STR},
        {"KIND_SCALAR", FD_KIND_SCALAR},
        {"KIND_ARRAY", FD_KIND_ARRAY},
        {"CODEC_NONE", FD_CODEC_NONE},
        {"CODEC_ZSTD", FD_CODEC_ZSTD},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        PyObject *value = PyLong_FromLongLong(ints[i].value);
        if (fd_module_add(module, ints[i].name, value) < 0) {
            return -1;
        }
    }
    PyObject *dtypes = PyTuple_New(FD_NUM_DTYPES);
    if (dtypes == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < FD_NUM_DTYPES; i++) {
        PyObject *name = PyUnicode_FromString(fd_dtype_names[i]);
        if (name == NULL) {
            Py_DECREF(dtypes);
            return -1;
        }
        PyTuple_SET_ITEM(dtypes, i, name);
    }
    if (fd_module_add(module, "DTYPE_NAMES", dtypes) < 0) {
        return -1;
    }
    return fd_module_add(module, "MAGIC", PyBytes_FromStringAndSize("FDRC", 4));
}

static int fd_exec(PyObject *module) {
    fd_state *st = fd_get_state(module);
    PyObject *errors = PyImport_ImportModule("fastdata.io_native._errors");
    if (errors == NULL) {
        return -1;
    }
    st->decode_error = PyObject_GetAttrString(errors, "DecodeError");
    st->codec_error = PyObject_GetAttrString(errors, "CodecUnavailableError");
    Py_DECREF(errors);
    if (st->decode_error == NULL || st->codec_error == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "DecodeError", st->decode_error) < 0 ||
        PyModule_AddObjectRef(module, "CodecUnavailableError", st->codec_error) < 0) {
        return -1;
    }
    st->zstd_lock = PyThread_allocate_lock();
    if (st->zstd_lock == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    st->zstd_status = 0;
    fd_crc_init(&st->crc);
    if (fd_add_constants(module) < 0) {
        return -1;
    }
    return fd_aligned_init_type(module, st);
}

static int fd_traverse(PyObject *module, visitproc visit, void *arg) {
    fd_state *st = fd_get_state(module);
    Py_VISIT(st->decode_error);
    Py_VISIT(st->codec_error);
    Py_VISIT(st->aligned_type);
    return 0;
}

static int fd_clear(PyObject *module) {
    fd_state *st = fd_get_state(module);
    Py_CLEAR(st->decode_error);
    Py_CLEAR(st->codec_error);
    Py_CLEAR(st->aligned_type);
    return 0;
}

static void fd_free(void *module) {
    fd_state *st = fd_get_state((PyObject *)module);
    if (st != NULL && st->zstd_lock != NULL) {
        PyThread_free_lock(st->zstd_lock);
        st->zstd_lock = NULL;
    }
    fd_clear((PyObject *)module);
}

static PyModuleDef_Slot fd_slots[] = {
    {Py_mod_exec, (void *)fd_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef fd_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastdata.io_native._native",
    .m_doc = "Record decoding and batch gathering for fastdata (see docs/record-format.md).",
    .m_size = sizeof(fd_state),
    .m_methods = fd_methods,
    .m_slots = fd_slots,
    .m_traverse = fd_traverse,
    .m_clear = fd_clear,
    .m_free = fd_free,
};

PyMODINIT_FUNC PyInit__native(void) {
    return PyModuleDef_Init(&fd_module);
}
