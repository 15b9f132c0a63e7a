/* CRC-32C (Castagnoli): the SSE4.2 crc32 instruction when the CPU has it, else
 * slicing-by-8 tables kept in module state. fd_crc_init and fd_crc32c are pure C and run
 * without the GIL; fd_crc32c_py is the module function crc32c().
 *
 * fd_crc32c() extends a finished CRC like google_crc32c.extend(): value 0 starts a new
 * one, and crc(a + b) == fd_crc32c(fd_crc32c(0, a), b).
 */
#include "native.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define FD_HAVE_X86_CRC 1
#endif

#define FD_CRC32C_POLY 0x82F63B78u /* reflected Castagnoli polynomial */

void fd_crc_init(fd_crc *crc) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int b = 0; b < 8; b++) {
            c = (c & 1) ? (c >> 1) ^ FD_CRC32C_POLY : c >> 1;
        }
        crc->table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        for (int t = 1; t < 8; t++) {
            uint32_t prev = crc->table[t - 1][n];
            crc->table[t][n] = (prev >> 8) ^ crc->table[0][prev & 0xFF];
        }
    }
#ifdef FD_HAVE_X86_CRC
    __builtin_cpu_init();
    crc->hardware = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    crc->hardware = 0;
#endif
}

static uint32_t fd_crc_table(const fd_crc *crc, uint32_t c, const uint8_t *p, size_t n) {
    const uint32_t(*t)[256] = crc->table;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
    }
    return c;
}

#ifdef FD_HAVE_X86_CRC
/* One dependent chain of 8-byte crc32 instructions, unrolled by four. */
__attribute__((target("sse4.2"))) static uint32_t fd_crc_hardware(uint32_t c, const uint8_t *p, size_t n) {
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) {
        c64 = _mm_crc32_u8((uint32_t)c64, *p++);
        n--;
    }
    while (n >= 32) {
        uint64_t a, b, d, e;
        memcpy(&a, p, 8);
        memcpy(&b, p + 8, 8);
        memcpy(&d, p + 16, 8);
        memcpy(&e, p + 24, 8);
        c64 = _mm_crc32_u64(c64, a);
        c64 = _mm_crc32_u64(c64, b);
        c64 = _mm_crc32_u64(c64, d);
        c64 = _mm_crc32_u64(c64, e);
        p += 32;
        n -= 32;
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c64 = _mm_crc32_u64(c64, a);
        p += 8;
        n -= 8;
    }
    while (n--) {
        c64 = _mm_crc32_u8((uint32_t)c64, *p++);
    }
    return (uint32_t)c64;
}
#endif

uint32_t fd_crc32c(const fd_crc *crc, int method, uint32_t value, const uint8_t *data, size_t len) {
    uint32_t c = ~value;
#ifdef FD_HAVE_X86_CRC
    /* The caller refuses FD_CRC_HARDWARE on a CPU without SSE4.2; never execute it there. */
    if (crc->hardware && method != FD_CRC_TABLE) {
        return ~fd_crc_hardware(c, data, len);
    }
#else
    (void)method;
#endif
    return ~fd_crc_table(crc, c, data, len);
}

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

