/* AlignedBuffer: an uninitialised, writable byte buffer at an aligned address.
 *
 * The object owns its memory (posix_memalign / free). It exports it through the buffer
 * protocol and counts live exports, so the buffer pool can tell when no array or tensor
 * still views a buffer before it hands the buffer out again.
 * Every function here runs with the GIL held.
 */
#include "native.h"

#include <stdint.h>
#include <stdlib.h>

#define FD_MAX_ALIGNMENT ((Py_ssize_t)1 << 30)

typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t nbytes;
    Py_ssize_t alignment;
    Py_ssize_t exports;
} fd_aligned;

static int fd_aligned_getbuffer(PyObject *obj, Py_buffer *view, int flags) {
    fd_aligned *self = (fd_aligned *)obj;
    if (PyBuffer_FillInfo(view, obj, self->data, self->nbytes, 0, flags) < 0) {
        return -1;
    }
    /* Atomic: the module declares that it does not need the GIL (free-threaded builds). */
    __atomic_add_fetch(&self->exports, 1, __ATOMIC_RELAXED);
    return 0;
}

static void fd_aligned_releasebuffer(PyObject *obj, Py_buffer *view) {
    (void)view;
    __atomic_sub_fetch(&((fd_aligned *)obj)->exports, 1, __ATOMIC_RELAXED);
}

static void fd_aligned_dealloc(PyObject *obj) {
    PyTypeObject *tp = Py_TYPE(obj);
    free(((fd_aligned *)obj)->data);
    tp->tp_free(obj);
    Py_DECREF(tp);
}

static Py_ssize_t fd_aligned_len(PyObject *obj) {
    return ((fd_aligned *)obj)->nbytes;
}

static PyObject *fd_aligned_repr(PyObject *obj) {
    fd_aligned *self = (fd_aligned *)obj;
    return PyUnicode_FromFormat("AlignedBuffer(nbytes=%zd, alignment=%zd, exports=%zd)", self->nbytes, self->alignment,
                                __atomic_load_n(&self->exports, __ATOMIC_RELAXED));
}

static PyObject *fd_aligned_get_address(PyObject *obj, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr(((fd_aligned *)obj)->data);
}

static PyObject *fd_aligned_get_nbytes(PyObject *obj, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(((fd_aligned *)obj)->nbytes);
}

static PyObject *fd_aligned_get_alignment(PyObject *obj, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(((fd_aligned *)obj)->alignment);
}

static PyObject *fd_aligned_get_exports(PyObject *obj, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(__atomic_load_n(&((fd_aligned *)obj)->exports, __ATOMIC_RELAXED));
}

static PyGetSetDef fd_aligned_getset[] = {
    {"address", fd_aligned_get_address, NULL, "Address of the first byte.", NULL},
    {"nbytes", fd_aligned_get_nbytes, NULL, "Size in bytes.", NULL},
    {"alignment", fd_aligned_get_alignment, NULL, "Alignment the address is a multiple of.", NULL},
    {"exports", fd_aligned_get_exports, NULL, "Live buffer-protocol views of this buffer.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot fd_aligned_slots[] = {
    {Py_tp_dealloc, (void *)fd_aligned_dealloc},
    {Py_tp_repr, (void *)fd_aligned_repr},
    {Py_tp_getset, (void *)fd_aligned_getset},
    {Py_bf_getbuffer, (void *)fd_aligned_getbuffer},
    {Py_bf_releasebuffer, (void *)fd_aligned_releasebuffer},
    {Py_sq_length, (void *)fd_aligned_len},
    {Py_tp_doc, (void *)"Writable byte buffer at an aligned address; create with aligned_empty()."},
    {0, NULL},
};

static PyType_Spec fd_aligned_spec = {
    .name = "fastdata.io_native._native.AlignedBuffer",
    .basicsize = sizeof(fd_aligned),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = fd_aligned_slots,
};

int fd_aligned_init_type(PyObject *module, fd_state *st) {
    st->aligned_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &fd_aligned_spec, NULL);
    if (st->aligned_type == NULL) {
        return -1;
    }
    return PyModule_AddType(module, st->aligned_type);
}

/* aligned_empty(nbytes, alignment=4096) -> AlignedBuffer. Returns a new reference. */
PyObject *fd_aligned_empty(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"nbytes", "alignment"};
    PyObject *values[2] = {NULL, NULL};
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "aligned_empty() takes at most 2 arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        values[i] = args[i];
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int slot = -1;
        for (int j = 0; j < 2; j++) {
            if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0) {
                slot = j;
            }
        }
        if (slot < 0 || values[slot] != NULL) {
            PyErr_Format(PyExc_TypeError, "aligned_empty() got an unexpected or repeated argument %R", key);
            return NULL;
        }
        values[slot] = args[nargs + k];
    }
    if (values[0] == NULL) {
        PyErr_SetString(PyExc_TypeError, "aligned_empty() missing required argument 'nbytes'");
        return NULL;
    }
    if (PyBool_Check(values[0]) || !PyLong_Check(values[0]) ||
        (values[1] != NULL && (PyBool_Check(values[1]) || !PyLong_Check(values[1])))) {
        PyErr_SetString(PyExc_ValueError, "nbytes and alignment must be ints");
        return NULL;
    }
    Py_ssize_t nbytes = PyLong_AsSsize_t(values[0]);
    if (nbytes == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "nbytes is out of range");
        return NULL;
    }
    Py_ssize_t alignment = 4096;
    if (values[1] != NULL) {
        alignment = PyLong_AsSsize_t(values[1]);
        if (alignment == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            alignment = -1;
        }
    }
    if (nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "nbytes must be a non-negative int, got %zd", nbytes);
        return NULL;
    }
    if (alignment < 1 || alignment > FD_MAX_ALIGNMENT || (alignment & (alignment - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "alignment must be a power of two in 1..2**30");
        return NULL;
    }
    /* posix_memalign needs a multiple of sizeof(void *); smaller alignments are implied. */
    size_t real_alignment = (size_t)alignment < sizeof(void *) ? sizeof(void *) : (size_t)alignment;
    size_t request = nbytes == 0 ? real_alignment : (size_t)nbytes;
    void *data = NULL;
    if (posix_memalign(&data, real_alignment, request) != 0) {
        return PyErr_NoMemory();
    }
    fd_state *st = fd_get_state(module);
    fd_aligned *self = PyObject_New(fd_aligned, st->aligned_type);
    if (self == NULL) {
        free(data);
        return NULL;
    }
    /* PyObject_New on a heap type does not take the reference tp_dealloc drops. */
    Py_INCREF(st->aligned_type);
    self->data = data;
    self->nbytes = nbytes;
    self->alignment = alignment;
    self->exports = 0;
    return (PyObject *)self;
}
