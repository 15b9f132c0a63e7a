/* CRC-32C (Castagnoli): the SSE4.2 crc32 instruction when the CPU has it, else
 * slicing-by-8 tables kept in module state. Pure C, runs without the GIL.
 *
 * fd_crc32c() extends a finished CRC like google_crc32c.extend(): value 0 starts a new
 * one, and crc(a + b) == fd_crc32c(fd_crc32c(0, a), b).
 */
#include "native.h"

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
