/* libzstd bound at run time with dlopen/dlsym: the build needs no zstd headers, and a
 * machine without libzstd.so.1 still imports the module (gathering a zstd field then
 * raises CodecUnavailableError, which fastdata.record answers with the pure backend).
 *
 * Everything here runs with the GIL held and take st->zstd_lock, so loading is also safe in a
 * free-threaded build. A loaded library is never closed: a gather running without the GIL
 * may still be using function pointers from an earlier snapshot.
 */
#include "native.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* dlsym returns void *; converting it to a function pointer goes through memcpy so that
 * -Wpedantic builds stay quiet. */
static int fd_sym(void *handle, const char *name, void *slot, size_t slot_size, char *problem, size_t size) {
    void *sym = dlsym(handle, name);
    if (sym == NULL) {
        snprintf(problem, size, "symbol %s is missing", name);
        return -1;
    }
    memcpy(slot, &sym, slot_size);
    return 0;
}

/* (Re)load libzstd from soname. Returns 0, or -1 with CodecUnavailableError set. */
int fd_zstd_load(fd_state *st, const char *soname) {
    PyThread_acquire_lock(st->zstd_lock, WAIT_LOCK);
    fd_zstd_api api;
    char problem[300] = "";
    void *handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    int ok = handle != NULL;
    if (!ok) {
        const char *why = dlerror();
        snprintf(problem, sizeof(problem), "%s", why ? why : "dlopen failed");
    }
    ok = ok && fd_sym(handle, "ZSTD_versionString", &api.version, sizeof(api.version), problem, sizeof(problem)) == 0;
    ok = ok &&
         fd_sym(handle, "ZSTD_createDCtx", &api.create_dctx, sizeof(api.create_dctx), problem, sizeof(problem)) == 0;
    ok = ok && fd_sym(handle, "ZSTD_freeDCtx", &api.free_dctx, sizeof(api.free_dctx), problem, sizeof(problem)) == 0;
    ok = ok && fd_sym(handle, "ZSTD_decompressDCtx", &api.decompress_dctx, sizeof(api.decompress_dctx), problem,
                      sizeof(problem)) == 0;
    ok = ok && fd_sym(handle, "ZSTD_isError", &api.is_error, sizeof(api.is_error), problem, sizeof(problem)) == 0;
    char why[sizeof(st->zstd_problem)];
    if (ok) {
        st->zstd = api;
        st->zstd_status = 1;
    } else {
        st->zstd_status = -1;
        snprintf(st->zstd_problem, sizeof(st->zstd_problem), "cannot load %s: %s", soname, problem);
        memcpy(why, st->zstd_problem, sizeof(why));
    }
    PyThread_release_lock(st->zstd_lock);
    if (!ok) {
        PyErr_Format(st->codec_error,
                     "the native decoder cannot decompress zstd (%s); install libzstd (e.g. apt-get install "
                     "libzstd1) or use FASTDATA_DECODER=pure",
                     why);
        return -1;
    }
    return 0;
}

/* Copy the current binding into *api, loading the default library on first use.
 * Returns 0, or -1 with CodecUnavailableError set. */
int fd_zstd_snapshot(fd_state *st, fd_zstd_api *api) {
    PyThread_acquire_lock(st->zstd_lock, WAIT_LOCK);
    int status = st->zstd_status;
    PyThread_release_lock(st->zstd_lock);
    if (status == 0 && fd_zstd_load(st, "libzstd.so.1") < 0) {
        return -1;
    }
    char why[sizeof(st->zstd_problem)];
    PyThread_acquire_lock(st->zstd_lock, WAIT_LOCK);
    status = st->zstd_status;
    *api = st->zstd;
    memcpy(why, st->zstd_problem, sizeof(why));
    PyThread_release_lock(st->zstd_lock);
    if (status != 1) {
        PyErr_Format(st->codec_error,
                     "the native decoder cannot decompress zstd (%s); install libzstd (e.g. apt-get install "
                     "libzstd1) or use FASTDATA_DECODER=pure",
                     why);
        return -1;
    }
    return 0;
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
