/* Helpers the batch functions share: argument parsing, holding input buffer views, and
 * raising a DecodeError that a GIL-free section recorded. All run with the GIL held.
 */
#include "native.h"

#include <stdio.h>
#include <string.h>

/* Parse positional/keyword arguments into values[] (borrowed references). */
int fd_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
            Py_ssize_t nnames, Py_ssize_t nrequired, PyObject **values) {
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
void fd_type_error(const char *what, PyObject *obj, const char *rest) {
    PyObject *tname = PyType_GetName(Py_TYPE(obj));
    if (tname != NULL) {
        PyErr_Format(PyExc_TypeError, "%s is a %U, not %s", what, tname, rest);
        Py_DECREF(tname);
    }
}

/* Take a read-only view of every item of buffers (any iterable). On failure the views taken
 * so far stay recorded in s, and fd_sources_release frees them; the caller owns s. */
int fd_sources_acquire(fd_sources *s, PyObject *buffers) {
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

/* Release every view and the sequence; safe on a partly acquired or zeroed s. */
void fd_sources_release(fd_sources *s) {
    for (Py_ssize_t i = 0; i < s->held; i++) {
        PyBuffer_Release(&s->views[i]);
    }
    PyMem_Free(s->views);
    Py_CLEAR(s->seq);
}

/* Raise DecodeError(message, index, offset) from a failure recorded without the GIL. */
void fd_raise_decode(fd_state *st, const fd_failure *f) {
    PyObject *exc = PyObject_CallFunction(st->decode_error, "snK", f->problem.message, f->index,
                                          (unsigned long long)f->problem.offset);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}
