/* gather: copy one field of N records back to back into one writable buffer, with the GIL
 * released for both passes (see NOTE[gather-snapshot]). zstd payloads are decompressed
 * straight into the destination. With verify, each record's checksum is computed in pass 2,
 * in the same pass over the payload as the copy (NOTE[gather-verify]). Every view is
 * released at one exit label.
 */
#include "native.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* NOTE[gather-snapshot]: pass 1 validates each record and copies what pass 2 needs into a
 * span; pass 2 reads only spans, never the record headers again. Another thread may write
 * into an input buffer while the GIL is released (a numpy array is mutable); that can make
 * the copied bytes wrong, but never make pass 2 read or write outside the views, whose
 * lengths cannot change while we hold them. */
typedef struct {
    const uint8_t *record, *payload;
    uint64_t record_bytes, payload_offset, payload_bytes, raw_bytes;
    uint32_t k, stored_crc;
    uint8_t codec;
} fd_span;

/* NOTE[gather-verify]: verify=True must not read a record twice, so pass 1 checks only the
 * structure, and pass 2 sums each record while it copies the field: the bytes before the
 * payload, then the payload in the same pass as its copy (fd_crc32c_copy, NOTE[crc-copy]),
 * then the bytes after it. The errors stay those of the spec's order (a record's checksum
 * before its entries, records in batch order, every checksum before any decompression):
 * whenever pass 1 or the checks after it fail, pass 1 runs again with checksums and its
 * error wins; a checksum failure in pass 2 is the first one of the batch (pass 1 found
 * nothing); and a zstd payload that does not decode is reported only after the checksums
 * of the records behind it have passed. A zstd record is summed whole before it is
 * decompressed (two reads; decompression is far slower than the sum anyway). On any error the
 * contents of out are unspecified, as always. */

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
        int found = 0,
            status = fd_record_open(&rec, s->views[i].buf, (uint64_t)s->views[i].len, verify, crc, &fail->problem);
        while (status == 0 && (status = fd_record_next(&rec, &f, &fail->problem)) == 1) {
            if (f.name_bytes == want_bytes && memcmp(f.name, want, want_bytes) == 0) {
                fd_span *sp = &spans[i];
                sp->record = rec.data;
                sp->record_bytes = rec.len;
                sp->payload = rec.data + f.payload_offset;
                sp->payload_offset = f.payload_offset;
                sp->payload_bytes = f.payload_bytes;
                sp->raw_bytes = f.raw_bytes;
                sp->k = f.k;
                sp->codec = f.codec;
                const uint8_t *h = rec.data + 20; /* the checksum field of the checked header */
                sp->stored_crc = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
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

/* The checksum the header of a span's record must hold: bytes [0, 20) and [24, end). With
 * dst, the (uncompressed) payload is copied to dst in the same pass. Runs without the GIL. */
static uint32_t fd_span_crc(const fd_crc *crc, const fd_span *sp, uint8_t *dst) {
    const uint8_t *rec = sp->record;
    uint32_t c = fd_crc32c(crc, FD_CRC_AUTO, 0, rec, 20);
    if (dst == NULL) {
        return fd_crc32c(crc, FD_CRC_AUTO, c, rec + 24, (size_t)(sp->record_bytes - 24));
    }
    uint64_t end = sp->payload_offset + sp->payload_bytes;
    c = fd_crc32c(crc, FD_CRC_AUTO, c, rec + 24, (size_t)(sp->payload_offset - 24));
    c = fd_crc32c_copy(crc, FD_CRC_AUTO, c, dst, sp->payload, (size_t)sp->payload_bytes);
    return fd_crc32c(crc, FD_CRC_AUTO, c, rec + end, (size_t)(sp->record_bytes - end));
}

/* 1 (and *fail filled as pass 1 would fill it) when span i's record fails its checksum. */
static int fd_span_bad(const fd_crc *crc, const fd_span *spans, Py_ssize_t i, uint8_t *dst, fd_failure *fail) {
    uint32_t computed = fd_span_crc(crc, &spans[i], dst);
    if (computed == spans[i].stored_crc) {
        return 0;
    }
    fd_problem_set(&fail->problem, 20, "checksum mismatch: stored 0x%08" PRIx32 ", computed 0x%08" PRIx32,
                   spans[i].stored_crc, computed);
    fail->kind = FD_ERR_DECODE;
    fail->index = i;
    return 1;
}

/* Pass 2: copy or decompress each span into dst (capacity already checked); with crc,
 * verify each record on the way (NOTE[gather-verify]). Runs without the GIL; one zstd
 * context per call, nothing allocated per record. */
static void fd_copy(const fd_span *spans, Py_ssize_t count, uint8_t *dst, const fd_zstd_api *zstd, int any_zstd,
                    const fd_crc *crc, fd_failure *fail) {
    void *dctx = NULL;
    if (any_zstd && (dctx = zstd->create_dctx()) == NULL) {
        fail->kind = FD_ERR_MEMORY;
    }
    uint64_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const fd_span *sp = &spans[i];
        if (fail->kind != FD_OK) {
            /* Only a verifying call gets here: the rest must pass their checksums first. */
            if (crc == NULL || fd_span_bad(crc, spans, i, NULL, fail)) {
                break;
            }
            continue;
        }
        if (sp->codec == FD_CODEC_NONE) {
            if (crc != NULL) {
                if (fd_span_bad(crc, spans, i, dst + pos, fail)) {
                    break;
                }
            } else {
                memcpy(dst + pos, sp->payload, (size_t)sp->raw_bytes);
            }
        } else {
            if (crc != NULL && fd_span_bad(crc, spans, i, NULL, fail)) {
                break;
            }
            size_t got =
                zstd->decompress_dctx(dctx, dst + pos, (size_t)sp->raw_bytes, sp->payload, (size_t)sp->payload_bytes);
            if (zstd->is_error(got) || got != sp->raw_bytes) {
                fd_problem_set(&fail->problem, sp->payload_offset,
                               "field %" PRIu32 ": zstd payload does not decompress to its declared %" PRIu64 " bytes",
                               sp->k, sp->raw_bytes);
                fail->kind = FD_ERR_DECODE;
                fail->index = i;
            }
        }
        pos += sp->raw_bytes;
    }
    if (dctx != NULL) {
        zstd->free_dctx(dctx);
    }
}

/* ValueError when out shares a byte with any input (memcpy needs disjoint buffers).
 * Runs with the GIL; compares addresses of the held views. */
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

/* ValueError for a too small out, worded as _pure words it. Runs with the GIL. */
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

/* Pass 1 again, now with checksums, for the error the spec's order puts first
 * (NOTE[gather-verify]). Returns -1 with that error raised, 0 when every record passes.
 * Called with the GIL; releases it around the pass. */
static int fd_reference_pass(fd_state *st, const fd_sources *src, const uint8_t *want, uint64_t want_bytes,
                             PyObject *field, fd_span *spans) {
    fd_plan plan = {0, 0, 0};
    fd_failure fail;
    memset(&fail, 0, sizeof(fail));
    Py_BEGIN_ALLOW_THREADS
    fd_locate(src, want, want_bytes, 1, &st->crc, spans, &plan, &fail);
    Py_END_ALLOW_THREADS
    if (fail.kind == FD_ERR_DECODE) {
        fd_raise_decode(st, &fail);
        return -1;
    }
    if (fail.kind == FD_ERR_MISSING) {
        PyErr_Format(PyExc_KeyError, "record %zd has no field %R", fail.index, field);
        return -1;
    }
    return 0;
}

/* gather(buffers, field, out, verify=False) -> int. Returns a new reference.
 * Borrowed: the arguments. Owned until `done`: the views of out and of every buffer, the
 * spans. Both passes run without the GIL; zstd is bound (GIL held) between them. With
 * verify, the checksums are computed in pass 2 (NOTE[gather-verify]). */
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
    fd_locate(&src, (const uint8_t *)want, (uint64_t)want_bytes, 0, &st->crc, spans, &plan, &fail);
    Py_END_ALLOW_THREADS
    int capacity_ok = !plan.overflow && plan.total <= (uint64_t)out.len;
    if (verify && (fail.kind != FD_OK || !capacity_ok) &&
        fd_reference_pass(st, &src, (const uint8_t *)want, (uint64_t)want_bytes, field, spans) < 0) {
        goto done;
    }
    if (fail.kind == FD_ERR_DECODE) {
        fd_raise_decode(st, &fail);
        goto done;
    }
    if (fail.kind == FD_ERR_MISSING) {
        PyErr_Format(PyExc_KeyError, "record %zd has no field %R", fail.index, field);
        goto done;
    }
    if (!capacity_ok) {
        fd_raise_capacity(field, out.len, src.count, &plan);
        goto done;
    }
    if (plan.any_zstd && fd_zstd_snapshot(st, &zstd) < 0) {
        if (!verify) {
            goto done;
        }
        /* A checksum failure comes before a missing codec (the spec's order): look for one,
         * then ask for the codec again, which raises the same CodecUnavailableError. */
        PyErr_Clear();
        if (fd_reference_pass(st, &src, (const uint8_t *)want, (uint64_t)want_bytes, field, spans) < 0 ||
            fd_zstd_snapshot(st, &zstd) < 0) {
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    fd_copy(spans, src.count, out.buf, &zstd, plan.any_zstd, verify ? &st->crc : NULL, &fail);
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
