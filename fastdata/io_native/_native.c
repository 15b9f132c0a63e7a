/* fastdata.io_native._native: module definition (multi-phase init, no C globals).
 *
 * The functions live in one file per concern (aligned.c, ...); this file wires them into
 * the module and imports DecodeError into module state at exec time.
 */
#include "native.h"

static PyMethodDef fd_methods[] = {
    {"aligned_empty", (PyCFunction)(void (*)(void))fd_aligned_empty, METH_FASTCALL | METH_KEYWORDS,
     "aligned_empty(nbytes, alignment=4096)\n--\n\n"
     "Allocate an uninitialised writable buffer whose address is a multiple of alignment."},
    {NULL, NULL, 0, NULL},
};

static int fd_exec(PyObject *module) {
    fd_state *st = fd_get_state(module);
    PyObject *errors = PyImport_ImportModule("fastdata.io_native._errors");
    if (errors == NULL) {
        return -1;
    }
    st->decode_error = PyObject_GetAttrString(errors, "DecodeError");
    Py_DECREF(errors);
    if (st->decode_error == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "DecodeError", st->decode_error) < 0) {
        return -1;
    }
    return fd_aligned_init_type(module, st);
}

static int fd_traverse(PyObject *module, visitproc visit, void *arg) {
    fd_state *st = fd_get_state(module);
    Py_VISIT(st->decode_error);
    Py_VISIT(st->aligned_type);
    return 0;
}

static int fd_clear(PyObject *module) {
    fd_state *st = fd_get_state(module);
    Py_CLEAR(st->decode_error);
    Py_CLEAR(st->aligned_type);
    return 0;
}

static void fd_free(void *module) {
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
