/* Shared declarations of the fastdata.io_native._native extension.
 *
 * Module state replaces C globals (multi-phase init): each sub-interpreter that imports
 * the module gets its own DecodeError reference and type objects.
 */
#ifndef FASTDATA_NATIVE_H
#define FASTDATA_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject *decode_error;     /* fastdata.io_native._errors.DecodeError (strong ref) */
    PyTypeObject *aligned_type; /* AlignedBuffer heap type (strong ref) */
} fd_state;

static inline fd_state *fd_get_state(PyObject *module) {
    return (fd_state *)PyModule_GetState(module);
}

/* aligned.c */
int fd_aligned_init_type(PyObject *module, fd_state *st);
PyObject *fd_aligned_empty(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif
