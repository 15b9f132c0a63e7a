/* CRC-32C (Castagnoli): the SSE4.2 crc32 instruction when the CPU has it, else
 * slicing-by-8 tables kept in module state; fd_crc32c_copy also copies what it sums, in
 * the same pass (NOTE[crc-copy]). Everything here except fd_crc32c_py is pure C and runs
 * without the GIL; fd_crc32c_py is the module function crc32c().
 *
 * fd_crc32c() extends a finished CRC like google_crc32c.extend(): value 0 starts a new
 * one, and crc(a + b) == fd_crc32c(fd_crc32c(0, a), b).
 *
 * NOTE[crc-streams]: one crc32 instruction takes 3 cycles before the next one on the same
 * register may start, and the CPU can start one per cycle, so a single dependent chain runs
 * at a third of the instruction's speed (about 9.7 GB/s here). The hardware path therefore
 * cuts a buffer into blocks of three equal streams of 2**k bytes, sums the three streams in
 * one loop (three independent chains), and joins them: with `raw` the register value (no
 * inversions), raw(c, A + B + C) = Z(Z(raw(c, A)) ^ raw(0, B)) ^ raw(0, C), where Z
 * advances a register over 2**k zero bytes. Z is linear over GF(2), so it is four lookups
 * in a 4 x 256 table per k, built once at init. Long streams matter beyond the instruction
 * count: a buffer that comes from memory rather than cache is read fastest as few long
 * runs, so each block uses the largest 2**k (up to 64 KiB) with 3 * 2**k <= what is left.
 */
#include "native.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) /* _mm_crc32_u64 needs 64-bit mode; 32-bit x86 uses the tables */
#include <immintrin.h>
#define FD_HAVE_X86_CRC 1
#endif

#define FD_CRC32C_POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static inline uint64_t fd_load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* The register after 8 zero bytes, with slicing-by-8. */
static inline uint32_t fd_zeros8(const fd_crc *crc, uint32_t c) {
    const uint32_t (*t)[256] = crc->table;
    return t[7][c & 0xFF] ^ t[6][(c >> 8) & 0xFF] ^ t[5][(c >> 16) & 0xFF] ^ t[4][c >> 24];
}

/* The register after 2**k zero bytes (NOTE[crc-streams]). */
static inline uint32_t fd_zeros(const fd_crc *crc, int k, uint32_t c) {
    const uint32_t (*z)[256] = crc->zeros[k - FD_CRC_MIN_STREAM_LOG];
    return z[0][c & 0xFF] ^ z[1][(c >> 8) & 0xFF] ^ z[2][(c >> 16) & 0xFF] ^ z[3][c >> 24];
}

/* zeros[k] from the images of the 32 single-bit registers: table[t][b] is the XOR of the
 * images of b's bits, shifted by 8t. */
static void fd_zeros_fill(uint32_t (*z)[256], const uint32_t image[32]) {
    for (int t = 0; t < 4; t++) {
        z[t][0] = 0;
        for (uint32_t b = 1; b < 256; b++) {
            z[t][b] = z[t][b & (b - 1)] ^ image[8 * t + __builtin_ctz(b)];
        }
    }
}

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
    /* 2**MIN zero bytes by slicing-by-8 steps, then each longer table by applying the
     * previous one twice (Z over 2 * 2**k zeros is Z over 2**k zeros, twice). */
    uint32_t image[32];
    for (int j = 0; j < 32; j++) {
        uint32_t c = 1u << j;
        for (int step = 0; step < (1 << FD_CRC_MIN_STREAM_LOG) / 8; step++) {
            c = fd_zeros8(crc, c);
        }
        image[j] = c;
    }
    fd_zeros_fill(crc->zeros[0], image);
    for (int k = FD_CRC_MIN_STREAM_LOG + 1; k <= FD_CRC_MAX_STREAM_LOG; k++) {
        for (int j = 0; j < 32; j++) {
            image[j] = fd_zeros(crc, k - 1, fd_zeros(crc, k - 1, 1u << j));
        }
        fd_zeros_fill(crc->zeros[k - FD_CRC_MIN_STREAM_LOG], image);
    }
#ifdef FD_HAVE_X86_CRC
    __builtin_cpu_init();
    crc->hardware = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    crc->avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    crc->hardware = 0;
    crc->avx2 = 0;
#endif
}

/* Slicing-by-8 over n bytes from register c; with dst, each word is also stored to dst. */
static uint32_t fd_crc_table(const fd_crc *crc, uint32_t c, uint8_t *dst, const uint8_t *p, size_t n) {
    const uint32_t (*t)[256] = crc->table;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        if (dst != NULL) {
            memcpy(dst, p, 8);
            dst += 8;
        }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][hi & 0xFF] ^
            t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        uint8_t byte = *p++;
        if (dst != NULL) {
            *dst++ = byte;
        }
        c = (c >> 8) ^ t[0][(c ^ byte) & 0xFF];
    }
    return c;
}

#ifdef FD_HAVE_X86_CRC
/* One block of three streams of 2**k bytes each (NOTE[crc-streams]). With copy, every
 * 16 bytes are copied to dst just before they are summed (NOTE[crc-copy]). */
__attribute__((target("sse4.2"), always_inline)) static inline uint32_t
fd_crc_block(const fd_crc *crc, int k, uint32_t c, uint8_t *dst, const uint8_t *p, int copy) {
    size_t len = (size_t)1 << k;
    const uint8_t *pb = p + len, *pc = pb + len;
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < len; i += 16) {
        if (copy) {
            _mm_storeu_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(p + i)));
            _mm_storeu_si128((__m128i *)(dst + len + i), _mm_loadu_si128((const __m128i *)(pb + i)));
            _mm_storeu_si128((__m128i *)(dst + 2 * len + i), _mm_loadu_si128((const __m128i *)(pc + i)));
        }
        a = _mm_crc32_u64(_mm_crc32_u64(a, fd_load64(p + i)), fd_load64(p + i + 8));
        b = _mm_crc32_u64(_mm_crc32_u64(b, fd_load64(pb + i)), fd_load64(pb + i + 8));
        d = _mm_crc32_u64(_mm_crc32_u64(d, fd_load64(pc + i)), fd_load64(pc + i + 8));
    }
    uint32_t joined = fd_zeros(crc, k, (uint32_t)a) ^ (uint32_t)b;
    return fd_zeros(crc, k, joined) ^ (uint32_t)d;
}

/* fd_crc_block with copy, moving 32 bytes at a time with AVX2. */
__attribute__((target("sse4.2,avx2"))) static uint32_t fd_crc_block_avx2(const fd_crc *crc, int k, uint32_t c,
                                                                         uint8_t *dst, const uint8_t *p) {
    size_t len = (size_t)1 << k;
    const uint8_t *pb = p + len, *pc = pb + len;
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < len; i += 32) {
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_loadu_si256((const __m256i *)(p + i)));
        _mm256_storeu_si256((__m256i *)(dst + len + i), _mm256_loadu_si256((const __m256i *)(pb + i)));
        _mm256_storeu_si256((__m256i *)(dst + 2 * len + i), _mm256_loadu_si256((const __m256i *)(pc + i)));
        for (size_t j = i; j < i + 32; j += 8) {
            a = _mm_crc32_u64(a, fd_load64(p + j));
            b = _mm_crc32_u64(b, fd_load64(pb + j));
            d = _mm_crc32_u64(d, fd_load64(pc + j));
        }
    }
    uint32_t joined = fd_zeros(crc, k, (uint32_t)a) ^ (uint32_t)b;
    return fd_zeros(crc, k, joined) ^ (uint32_t)d;
}

/* The register after n bytes from c: blocks of three streams while they fit (each as long
 * as what is left allows), then one chain for the rest. copy: 0 sum only, 1 copy with
 * 16-byte moves, 2 with AVX2 (only from a function compiled for it). Inlined with copy
 * constant into the three entry points below. */
__attribute__((target("sse4.2"), always_inline)) static inline uint32_t
fd_crc_streams(const fd_crc *crc, uint32_t c, uint8_t *dst, const uint8_t *p, size_t n, int copy) {
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) {
        c64 = _mm_crc32_u8((uint32_t)c64, *p);
        if (copy) {
            *dst++ = *p;
        }
        p++;
        n--;
    }
    c = (uint32_t)c64;
    /* Start at the largest k with 3 * 2**k <= n (small inputs skip the long sizes). */
    int k = n / 3 ? 63 - __builtin_clzll((unsigned long long)(n / 3)) : 0;
    for (k = k < FD_CRC_MAX_STREAM_LOG ? k : FD_CRC_MAX_STREAM_LOG; k >= FD_CRC_MIN_STREAM_LOG; k--) {
        size_t block = (size_t)3 << k;
        while (n >= block) {
            c = copy == 2 ? fd_crc_block_avx2(crc, k, c, dst, p) : fd_crc_block(crc, k, c, dst, p, copy);
            p += block;
            n -= block;
            if (copy) {
                dst += block;
            }
        }
    }
    c64 = c;
    while (n >= 8) {
        uint64_t x = fd_load64(p);
        c64 = _mm_crc32_u64(c64, x);
        if (copy) {
            memcpy(dst, p, 8);
            dst += 8;
        }
        p += 8;
        n -= 8;
    }
    while (n--) {
        c64 = _mm_crc32_u8((uint32_t)c64, *p);
        if (copy) {
            *dst++ = *p;
        }
        p++;
    }
    return (uint32_t)c64;
}

/* NOTE[crc-copy]: fd_crc32c_copy sums the bytes it copies in the same pass, so a record
 * that comes from memory is read from memory once. Each piece (32 bytes with AVX2, else 16)
 * is copied with vector moves and then summed from the same cache lines, loaded a moment
 * earlier. Summing the destination instead would make "what was summed is what was
 * written" hold even while another thread writes into the source, but it measured 10-20%
 * slower, and no caller needs it: LMDB pages under a read transaction and bytes objects
 * cannot change, and for a mutable source NOTE[gather-snapshot] already leaves the copied
 * bytes unspecified. Measured here (AMD EPYC, 100 KiB records from the page cache, fused
 * gather over plain gather, medians of paired runs): 32-byte moves 1.0-1.1x, 16-byte
 * moves 0.93-1.03x, 8-byte moves 0.86-1.0x. */
__attribute__((target("sse4.2"))) static uint32_t fd_crc_hardware(const fd_crc *crc, uint32_t c, const uint8_t *p,
                                                                  size_t n) {
    return fd_crc_streams(crc, c, NULL, p, n, 0);
}

__attribute__((target("sse4.2"))) static uint32_t fd_crc_hardware_copy(const fd_crc *crc, uint32_t c, uint8_t *dst,
                                                                       const uint8_t *p, size_t n) {
    return fd_crc_streams(crc, c, dst, p, n, 1);
}

__attribute__((target("sse4.2,avx2"))) static uint32_t fd_crc_avx2_copy(const fd_crc *crc, uint32_t c, uint8_t *dst,
                                                                        const uint8_t *p, size_t n) {
    return fd_crc_streams(crc, c, dst, p, n, 2);
}
#endif

uint32_t fd_crc32c(const fd_crc *crc, int method, uint32_t value, const uint8_t *data, size_t len) {
    uint32_t c = ~value;
#ifdef FD_HAVE_X86_CRC
    /* The caller refuses FD_CRC_HARDWARE on a CPU without SSE4.2; never execute it there. */
    if (crc->hardware && method != FD_CRC_TABLE) {
        return ~fd_crc_hardware(crc, c, data, len);
    }
#else
    (void)method;
#endif
    return ~fd_crc_table(crc, c, NULL, data, len);
}

uint32_t fd_crc32c_copy(const fd_crc *crc, int method, uint32_t value, uint8_t *dst, const uint8_t *src, size_t len) {
    uint32_t c = ~value;
#ifdef FD_HAVE_X86_CRC
    if (crc->hardware && crc->avx2 && method == FD_CRC_AUTO) {
        return ~fd_crc_avx2_copy(crc, c, dst, src, len);
    }
    if (crc->hardware && method != FD_CRC_TABLE) {
        return ~fd_crc_hardware_copy(crc, c, dst, src, len);
    }
#else
    (void)method;
#endif
    return ~fd_crc_table(crc, c, dst, src, len);
}

/* ValueError unless out can take data's bytes without sharing one. Runs with the GIL. */
static int fd_check_crc_out(const Py_buffer *out, const Py_buffer *data) {
    if (out->len < data->len) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes but data is %zd", out->len, data->len);
        return -1;
    }
    uintptr_t lo = (uintptr_t)out->buf, hi = lo + (uintptr_t)out->len;
    uintptr_t a = (uintptr_t)data->buf, b = a + (uintptr_t)data->len;
    if (data->len > 0 && a < hi && lo < b) {
        PyErr_SetString(PyExc_ValueError, "out overlaps data; crc32c needs a separate destination");
        return -1;
    }
    return 0;
}

/* Parses method and value; -1 with ValueError set when either is bad. Runs with the GIL. */
static int fd_crc_args(PyObject *method_obj, PyObject *value_obj, int *method, uint32_t *value) {
    static const char *const methods[] = {"auto", "hardware", "table"};
    *method = method_obj == NULL ? FD_CRC_AUTO : -1;
    for (int m = 0; m < 3 && *method < 0; m++) {
        if (PyUnicode_Check(method_obj) && PyUnicode_CompareWithASCIIString(method_obj, methods[m]) == 0) {
            *method = m;
        }
    }
    if (*method < 0) {
        PyErr_Format(PyExc_ValueError, "method must be 'auto', 'hardware' or 'table', not %R", method_obj);
        return -1;
    }
    *value = 0;
    if (value_obj != NULL) {
        int ok = PyLong_Check(value_obj) && !PyBool_Check(value_obj);
        unsigned long long v = ok ? PyLong_AsUnsignedLongLong(value_obj) : 0;
        if (ok && v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
        }
        if (!ok || v > 0xFFFFFFFFull) {
            PyErr_Format(PyExc_ValueError, "value must be an int in 0..2**32-1, not %R", value_obj);
            return -1;
        }
        *value = (uint32_t)v;
    }
    return 0;
}

/* crc32c(data, value=0, method="auto", out=None) -> int. Returns a new reference.
 * Borrowed: the arguments; the views of data and out are held until `done`. With out, data
 * is copied into out's first bytes in the same pass (fd_crc32c_copy). Large inputs are
 * summed without the GIL. */
PyObject *fd_crc32c_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"data", "value", "method", "out"};
    PyObject *values[4] = {NULL, NULL, NULL, NULL};
    if (fd_args("crc32c", args, nargs, kwnames, names, 4, 1, values) < 0) {
        return NULL;
    }
    int method;
    uint32_t value;
    if (fd_crc_args(values[2], values[1], &method, &value) < 0) {
        return NULL;
    }
    fd_state *st = fd_get_state(module);
    if (method == FD_CRC_HARDWARE && !st->crc.hardware) {
        PyErr_SetString(PyExc_ValueError, "this CPU has no SSE4.2 crc32 instruction; use method='auto' or 'table'");
        return NULL;
    }
    PyObject *out_obj = values[3] == Py_None ? NULL : values[3];
    Py_buffer view, out;
    int have_view = 0, have_out = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(values[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        fd_type_error("data", values[0],
                      "a contiguous buffer; pass bytes, memoryview, numpy arrays or other buffer-protocol objects");
        goto done;
    }
    have_view = 1;
    if (out_obj != NULL) {
        if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) < 0) {
            PyErr_Clear();
            fd_type_error("out", out_obj, "a writable contiguous buffer; allocate it with aligned_empty(nbytes)");
            goto done;
        }
        have_out = 1;
        if (fd_check_crc_out(&out, &view) < 0) {
            goto done;
        }
    }
    uint32_t crc;
    const fd_crc *tables = &st->crc;
    PyThreadState *released = view.len >= 65536 ? PyEval_SaveThread() : NULL;
    if (have_out) {
        crc = fd_crc32c_copy(tables, method, value, out.buf, view.buf, (size_t)view.len);
    } else {
        crc = fd_crc32c(tables, method, value, view.buf, (size_t)view.len);
    }
    if (released != NULL) {
        PyEval_RestoreThread(released);
    }
    result = PyLong_FromUnsignedLong(crc);
done:
    if (have_out) {
        PyBuffer_Release(&out);
    }
    if (have_view) {
        PyBuffer_Release(&view);
    }
    return result;
}
