/* Record validation: the checks of docs/record-format.md, "Validation, in order".
 *
 * Nothing here touches a Python object, so every function runs without the GIL. The
 * record bytes are untrusted: each read goes through fd_at(), the one checked read helper,
 * which compares the request with what remains (n <= len - off), never off + n <= len.
 * Arithmetic on values read from the bytes happens only after they are bounded (all
 * lengths <= 2**40, so sums of two of them cannot overflow a uint64_t).
 * _pure.py implements the same steps in the same order with the same messages.
 */
#include "native.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FD_ZSTD_MAGIC 0xFD2FB528u
#define FD_ZSTD_BLOCK_MAX 131072u

static const uint8_t fd_itemsize[FD_NUM_DTYPES] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8, 8, 16};
static const char *const fd_kind_names[2] = {"bytes", "str"};

int fd_problem_set(fd_problem *problem, uint64_t offset, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem->message, sizeof(problem->message), fmt, ap);
    va_end(ap);
    problem->offset = offset;
    return -1;
}

/* The one checked read: n bytes at off inside the record, or NULL. */
static inline const uint8_t *fd_at(const fd_record *rec, uint64_t off, uint64_t n) {
    if (off > rec->len || n > rec->len - off) {
        return NULL;
    }
    return rec->data + off;
}

static inline uint64_t fd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline uint64_t fd_align(uint64_t value, uint64_t alignment) {
    return (value + alignment - 1) / alignment * alignment;
}

/* Strict UTF-8, as Python's bytes.decode("utf-8") accepts it (no surrogates, no overlongs). */
static int fd_utf8_valid(const uint8_t *s, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        uint64_t more;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return 0;
        }
        if (more > n - i - 1 || s[i + 1] < lo || s[i + 1] > hi) {
            return 0;
        }
        for (uint64_t j = 2; j <= more; j++) {
            if ((s[i + j] & 0xC0) != 0x80) {
                return 0;
            }
        }
        i += more + 1;
    }
    return 1;
}

/* Offset of the first non-zero byte in [start, stop), or stop. Both inside the record. */
static uint64_t fd_first_nonzero(const fd_record *rec, uint64_t start, uint64_t stop) {
    while (stop - start >= 8) { /* padding is short and nearly always zero: skip by words */
        uint64_t word;
        memcpy(&word, rec->data + start, 8);
        if (word != 0) {
            break;
        }
        start += 8;
    }
    for (uint64_t i = start; i < stop; i++) {
        if (rec->data[i] != 0) {
            return i;
        }
    }
    return stop;
}

/* Check one zstd frame's structure in [start, start + size) without decompressing.
 * Returns NULL when it is well formed, else the spec's reason (written into buf). */
static const char *fd_zstd_frame_problem(const fd_record *rec, uint64_t start, uint64_t size, uint64_t raw, char *buf,
                                         size_t buf_size) {
    const uint8_t *p = fd_at(rec, start, size);
    if (p == NULL || size < 5) {
        return "zstd frame header is truncated";
    }
    if (fd_le(p, 4) != FD_ZSTD_MAGIC) {
        return "payload is not a zstd frame";
    }
    uint8_t fhd = p[4];
    if (fhd & 0x08) {
        return "zstd frame header has its reserved bit set";
    }
    uint64_t single = (fhd >> 5) & 1;
    static const uint64_t did_sizes[4] = {0, 1, 2, 4};
    uint64_t did_bytes = did_sizes[fhd & 3];
    uint64_t fcs_bytes = (fhd >> 6) == 0 ? single : ((fhd >> 6) == 1 ? 2 : ((fhd >> 6) == 2 ? 4 : 8));
    uint64_t header = 5 + (1 - single) + did_bytes + fcs_bytes;
    if (header > size) {
        return "zstd frame header is truncated";
    }
    uint64_t pos = 5;
    if (!single) {
        if (10 + (p[pos] >> 3) > 31) {
            return "zstd frame window is too large";
        }
        pos += 1;
    }
    if (did_bytes && fd_le(p + pos, (int)did_bytes) != 0) {
        return "zstd frame uses a dictionary";
    }
    pos += did_bytes;
    if (fcs_bytes == 0) {
        return "zstd frame does not declare its content size";
    }
    uint64_t content = fd_le(p + pos, (int)fcs_bytes) + (fcs_bytes == 2 ? 256 : 0);
    if (content != raw) {
        snprintf(buf, buf_size, "zstd frame declares %" PRIu64 " bytes but the shape and dtype need %" PRIu64, content,
                 raw);
        return buf;
    }
    pos += fcs_bytes;
    for (;;) {
        if (size - pos < 3) {
            return "zstd block is truncated";
        }
        uint64_t word = fd_le(p + pos, 3);
        uint64_t type = (word >> 1) & 3, block = word >> 3;
        if (type == 3) {
            return "zstd block has the reserved type";
        }
        if (block > FD_ZSTD_BLOCK_MAX) {
            return "zstd block is larger than 131072 bytes";
        }
        uint64_t body = type == 1 ? 1 : block;
        pos += 3;
        if (body > size - pos) {
            return "zstd block is truncated";
        }
        pos += body;
        if (word & 1) {
            break;
        }
    }
    if (fhd & 0x04) {
        if (size - pos < 4) {
            return "zstd frame checksum is truncated";
        }
        pos += 4;
    }
    if (pos != size) {
        snprintf(buf, buf_size, "zstd frame has %" PRIu64 " bytes after its end", size - pos);
        return buf;
    }
    return NULL;
}

/* Header checks 1-8. */
int fd_record_open(fd_record *rec, const uint8_t *data, uint64_t len, int verify, const fd_crc *crc,
                   fd_problem *problem) {
    rec->data = data;
    rec->len = len;
    const uint8_t *h = fd_at(rec, 0, FD_HEADER_BYTES);
    if (h == NULL) {
        return fd_problem_set(problem, 0, "record is %" PRIu64 " bytes, shorter than the 32-byte header", len);
    }
    if (memcmp(h, "FDRC", 4) != 0) {
        return fd_problem_set(problem, 0, "not a fastdata record (bad magic)");
    }
    uint64_t version = fd_le(h + 4, 2), count = fd_le(h + 6, 2), total = fd_le(h + 8, 8);
    uint64_t table = fd_le(h + 16, 4), stored = fd_le(h + 20, 4);
    if (version != FD_FORMAT_VERSION) {
        return fd_problem_set(problem, 4, "unsupported record version %" PRIu64 "; this build reads version 1",
                              version);
    }
    if (count > FD_MAX_FIELDS) {
        return fd_problem_set(problem, 6, "field count %" PRIu64 " is above the limit of 1024", count);
    }
    if (total > FD_MAX_RECORD_BYTES) {
        return fd_problem_set(problem, 8, "record length %" PRIu64 " is above the limit of 2**40 bytes", total);
    }
    if (total != len) {
        return fd_problem_set(problem, 8, "record length field says %" PRIu64 " bytes but the buffer holds %" PRIu64,
                              total, len);
    }
    if (table % 8 != 0 || table > total - FD_HEADER_BYTES || table < FD_ENTRY_BYTES * count) {
        return fd_problem_set(problem, 16,
                              "field table length %" PRIu64 " is invalid for %" PRIu64 " fields in a %" PRIu64
                              "-byte record",
                              table, count, total);
    }
    if (fd_le(h + 24, 8) != 0) {
        return fd_problem_set(problem, 24, "reserved header bytes are not zero");
    }
    if (verify) {
        uint32_t computed = fd_crc32c(crc, FD_CRC_AUTO, 0, data, 20);
        computed = fd_crc32c(crc, FD_CRC_AUTO, computed, data + 24, (size_t)(len - 24));
        if (computed != stored) {
            return fd_problem_set(problem, 20, "checksum mismatch: stored 0x%08" PRIx64 ", computed 0x%08" PRIx32,
                                  stored, computed);
        }
    }
    rec->count = (uint32_t)count;
    rec->k = 0;
    rec->pos = FD_HEADER_BYTES;
    rec->table_end = FD_HEADER_BYTES + table;
    rec->cursor = rec->table_end;
    rec->prev_name = NULL;
    rec->prev_name_bytes = 0;
    return 0;
}

/* Entry step 8: what each kind allows. */
static int fd_check_kind(const fd_field *f, uint64_t p, fd_problem *problem) {
    uint32_t k = f->k;
    if (f->kind == FD_KIND_BYTES || f->kind == FD_KIND_STR) {
        const char *what = fd_kind_names[f->kind];
        if (f->dtype != 2) {
            return fd_problem_set(problem, p + 1, "field %" PRIu32 ": a %s field must have dtype uint8", k, what);
        }
        if (f->ndim != 1) {
            return fd_problem_set(problem, p + 3, "field %" PRIu32 ": a %s field must have ndim 1", k, what);
        }
        if (f->kind == FD_KIND_STR && f->codec != FD_CODEC_NONE) {
            return fd_problem_set(problem, p + 2, "field %" PRIu32 ": a str field cannot be compressed", k);
        }
    } else if (f->kind == FD_KIND_SCALAR) {
        if (f->dtype != 0 && f->dtype != 7 && f->dtype != 11) {
            return fd_problem_set(problem, p + 1,
                                  "field %" PRIu32 ": a scalar field must have dtype bool, int64 or float64", k);
        }
        if (f->ndim != 0) {
            return fd_problem_set(problem, p + 3, "field %" PRIu32 ": a scalar field must have ndim 0", k);
        }
        if (f->codec != FD_CODEC_NONE) {
            return fd_problem_set(problem, p + 2, "field %" PRIu32 ": a scalar field cannot be compressed", k);
        }
    }
    return 0;
}

/* Entry steps 10-12: shape, name, padding after the name. */
static int fd_check_shape_and_name(fd_record *rec, fd_field *f, uint64_t p, uint64_t size, fd_problem *problem) {
    uint32_t k = f->k;
    uint64_t raw = fd_itemsize[f->dtype];
    for (uint32_t j = 0; j < f->ndim; j++) {
        uint64_t q = p + FD_ENTRY_BYTES + 8 * (uint64_t)j;
        uint64_t dim = fd_le(fd_at(rec, q, 8), 8);
        if (dim > FD_MAX_FIELD_BYTES) {
            return fd_problem_set(problem, q,
                                  "field %" PRIu32 ": dimension %" PRIu32 " is %" PRIu64 ", above the limit of 2**40",
                                  k, j, dim);
        }
        if (dim != 0 && raw > FD_MAX_FIELD_BYTES / dim) {
            return fd_problem_set(problem, q, "field %" PRIu32 ": shape holds more than 2**40 bytes", k);
        }
        raw *= dim;
        f->shape[j] = dim;
    }
    for (uint32_t j = f->ndim; j < FD_MAX_NDIM; j++) {
        f->shape[j] = 0;
    }
    f->raw_bytes = raw;
    uint64_t q = p + FD_ENTRY_BYTES + 8 * (uint64_t)f->ndim;
    const uint8_t *name = fd_at(rec, q, f->name_bytes);
    if (!fd_utf8_valid(name, f->name_bytes)) {
        return fd_problem_set(problem, q, "field %" PRIu32 ": name is not valid UTF-8", k);
    }
    if (rec->prev_name != NULL) {
        uint32_t common = f->name_bytes < rec->prev_name_bytes ? f->name_bytes : rec->prev_name_bytes;
        int order = memcmp(name, rec->prev_name, common);
        if (order < 0 || (order == 0 && f->name_bytes <= rec->prev_name_bytes)) {
            return fd_problem_set(problem, q,
                                  "field %" PRIu32 ": name is not after the previous field's name "
                                  "(names must be unique and sorted)",
                                  k);
        }
    }
    f->name = name;
    f->name_offset = q;
    uint64_t bad = fd_first_nonzero(rec, q + f->name_bytes, p + size);
    if (bad != p + size) {
        return fd_problem_set(problem, bad, "field %" PRIu32 ": padding is not zero", k);
    }
    return 0;
}

/* Entry steps 13-17: the payload's position, padding, length and content rules. */
static int fd_check_payload(fd_record *rec, fd_field *f, uint64_t p, fd_problem *problem) {
    uint32_t k = f->k;
    const uint8_t *e = fd_at(rec, p, FD_ENTRY_BYTES);
    uint64_t offset = fd_le(e + 8, 8), stored = fd_le(e + 16, 8);
    uint64_t expected = fd_align(rec->cursor, FD_PAYLOAD_ALIGNMENT);
    if (offset != expected) {
        return fd_problem_set(problem, p + 8, "field %" PRIu32 ": payload offset %" PRIu64 " should be %" PRIu64, k,
                              offset, expected);
    }
    if (offset > rec->len) {
        return fd_problem_set(problem, p + 8, "field %" PRIu32 ": payload starts past the end of the record", k);
    }
    uint64_t bad = fd_first_nonzero(rec, rec->cursor, offset);
    if (bad != offset) {
        return fd_problem_set(problem, bad, "field %" PRIu32 ": padding before the payload is not zero", k);
    }
    if (f->codec == FD_CODEC_NONE && stored != f->raw_bytes) {
        return fd_problem_set(problem, p + 16,
                              "field %" PRIu32 ": payload is %" PRIu64 " bytes but its shape and dtype need %" PRIu64,
                              k, stored, f->raw_bytes);
    }
    if (f->codec == FD_CODEC_ZSTD && f->raw_bytes == 0) {
        return fd_problem_set(problem, p + 2, "field %" PRIu32 ": an empty field cannot be compressed", k);
    }
    const uint8_t *payload = fd_at(rec, offset, stored);
    if (payload == NULL) {
        return fd_problem_set(problem, p + 16, "field %" PRIu32 ": payload runs past the end of the record", k);
    }
    if (f->kind == FD_KIND_STR && !fd_utf8_valid(payload, stored)) {
        return fd_problem_set(problem, offset, "field %" PRIu32 ": str payload is not valid UTF-8", k);
    }
    if (f->codec == FD_CODEC_ZSTD) {
        char reason_buf[160];
        const char *reason = fd_zstd_frame_problem(rec, offset, stored, f->raw_bytes, reason_buf, sizeof(reason_buf));
        if (reason != NULL) {
            return fd_problem_set(problem, offset, "field %" PRIu32 ": %s", k, reason);
        }
    }
    f->payload_offset = offset;
    f->payload_bytes = stored;
    return 0;
}

/* The next entry (steps 1-17): 1 with *f filled, 0 after the last one (and the two
 * closing checks passed), -1 with *problem filled. */
int fd_record_next(fd_record *rec, fd_field *f, fd_problem *problem) {
    if (rec->k == rec->count) {
        if (rec->pos != rec->table_end) {
            return fd_problem_set(problem, rec->pos, "field table has %" PRIu64 " unused bytes",
                                  rec->table_end - rec->pos);
        }
        if (rec->cursor != rec->len) {
            return fd_problem_set(problem, rec->cursor, "record has %" PRIu64 " bytes after the last payload",
                                  rec->len - rec->cursor);
        }
        return 0;
    }
    uint32_t k = rec->k;
    uint64_t p = rec->pos;
    if (FD_ENTRY_BYTES > rec->table_end - p) {
        return fd_problem_set(problem, p, "field %" PRIu32 ": entry runs past the field table", k);
    }
    const uint8_t *e = fd_at(rec, p, FD_ENTRY_BYTES);
    f->k = k;
    f->kind = e[0];
    f->dtype = e[1];
    f->codec = e[2];
    f->ndim = e[3];
    f->name_bytes = (uint32_t)fd_le(e + 4, 2);
    if (f->kind > FD_KIND_ARRAY) {
        return fd_problem_set(problem, p, "field %" PRIu32 ": unknown kind %u", k, (unsigned)f->kind);
    }
    if (f->dtype >= FD_NUM_DTYPES) {
        return fd_problem_set(problem, p + 1, "field %" PRIu32 ": unknown dtype code %u", k, (unsigned)f->dtype);
    }
    if (f->codec > FD_CODEC_ZSTD) {
        return fd_problem_set(problem, p + 2, "field %" PRIu32 ": unknown codec %u", k, (unsigned)f->codec);
    }
    if (f->ndim > FD_MAX_NDIM) {
        return fd_problem_set(problem, p + 3, "field %" PRIu32 ": ndim %u is above the limit of 8", k,
                              (unsigned)f->ndim);
    }
    if (f->name_bytes < 1 || f->name_bytes > FD_MAX_NAME_BYTES) {
        return fd_problem_set(problem, p + 4, "field %" PRIu32 ": name length %" PRIu32 " is outside 1..255", k,
                              f->name_bytes);
    }
    if (e[6] != 0 || e[7] != 0) {
        return fd_problem_set(problem, p + 6, "field %" PRIu32 ": reserved bytes are not zero", k);
    }
    if (fd_check_kind(f, p, problem) < 0) {
        return -1;
    }
    uint64_t size = fd_align(FD_ENTRY_BYTES + 8 * (uint64_t)f->ndim + f->name_bytes, 8);
    if (size > rec->table_end - p) {
        return fd_problem_set(problem, p, "field %" PRIu32 ": entry runs past the field table", k);
    }
    if (fd_check_shape_and_name(rec, f, p, size, problem) < 0 || fd_check_payload(rec, f, p, problem) < 0) {
        return -1;
    }
    rec->cursor = f->payload_offset + f->payload_bytes;
    rec->pos = p + size;
    rec->prev_name = f->name;
    rec->prev_name_bytes = f->name_bytes;
    rec->k++;
    return 1;
}
