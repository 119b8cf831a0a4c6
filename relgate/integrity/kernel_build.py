"""Build recipe for the native SHA-256 row kernel (``relgate.integrity._sha256``).

cffi compiles this at install time (``setup.py``: ``cffi_modules``) against the OpenSSL
libcrypto that CPython already links.  The loops are the only native code in the project:
per-row SHA-256 over Arrow offsets and data buffers (one column, or several
length-prefixed as the tuple encoding without building it), RFC 6962 node levels over packed 32-byte
hashes, and the ``sha256:<hex>`` text form of packed digests.  The hashing itself is
OpenSSL's (SHA-NI where the CPU has it); nothing here implements SHA-256.  cffi releases the
GIL for the duration of every call, so Python threads over row slices use every core.

Why the low-level ``SHA256_Init/Update/Final``: OpenSSL 3's ``SHA256()`` and ``EVP_Digest*``
re-dispatch through the provider on every message, which costs more than hashing a 64-byte
row (docs/performance.md has the figures).
"""

from __future__ import annotations

from cffi import FFI

CDEF = """
void rg_sha256_rows(const unsigned char *data, const int64_t *offsets, int64_t n,
                    const unsigned char *prefix, size_t prefix_len, unsigned char *out);
void rg_sha256_fields(int ncols, const unsigned char **data, const int64_t **offsets,
                      int64_t lo, int64_t hi, const unsigned char *prefix, size_t prefix_len,
                      unsigned char *out);
int64_t rg_merkle_level(const unsigned char *level, int64_t n, unsigned char *out);
void rg_merkle_root(unsigned char *scratch, int64_t n, unsigned char *out);
void rg_hex_digests(const unsigned char *digests, int64_t n, const unsigned char *prefix,
                    size_t prefix_len, unsigned char *out);
void rg_word_runs(const unsigned char *data, const int64_t *offsets, int64_t n,
                  unsigned char separator_max, int64_t *out);
void rg_sha256_stream(int ncols, const unsigned char **data, const int64_t **offsets,
                      const int64_t *order, int64_t n, const unsigned char *header,
                      size_t header_len, unsigned char *out);
"""

SOURCE = r"""
#define OPENSSL_SUPPRESS_DEPRECATED
#include <stdint.h>
#include <string.h>
#include <openssl/sha.h>

/* Rows whose tuple encoding is at most this long are hashed from one stack buffer. */
#define RG_ROW 2048

void rg_sha256_rows(const unsigned char *data, const int64_t *offsets, int64_t n,
                    const unsigned char *prefix, size_t prefix_len, unsigned char *out) {
    SHA256_CTX ctx;
    for (int64_t i = 0; i < n; i++) {
        SHA256_Init(&ctx);
        if (prefix_len) SHA256_Update(&ctx, prefix, prefix_len);
        SHA256_Update(&ctx, data + offsets[i], (size_t)(offsets[i + 1] - offsets[i]));
        SHA256_Final(out + 32 * i, &ctx);
    }
}

/* SHA-256(prefix || len(c1) c1 || len(c2) c2 ...) for rows [lo, hi), 4-byte big-endian
   lengths (the tuple encoding), without materialising the encoded rows.  Offsets are
   absolute row offsets into each column's data; row i's digest goes to out + 32 * i. */
void rg_sha256_fields(int ncols, const unsigned char **data, const int64_t **offsets,
                      int64_t lo, int64_t hi, const unsigned char *prefix, size_t prefix_len,
                      unsigned char *out) {
    SHA256_CTX ctx;
    unsigned char be[4];
    /* A row whose encoding fits is assembled here and hashed in one call (one
       SHA256_Update per field costs more than the copy); longer rows go field by field. */
    unsigned char row[RG_ROW];
    for (int64_t i = lo; i < hi; i++) {
        size_t total = prefix_len;
        for (int c = 0; c < ncols; c++) total += 4 + (size_t)(offsets[c][i + 1] - offsets[c][i]);
        if (total <= RG_ROW) {
            size_t used = prefix_len;
            if (prefix_len) memcpy(row, prefix, prefix_len);
            for (int c = 0; c < ncols; c++) {
                int64_t start = offsets[c][i];
                size_t len = (size_t)(offsets[c][i + 1] - start);
                row[used] = (unsigned char)(len >> 24);
                row[used + 1] = (unsigned char)(len >> 16);
                row[used + 2] = (unsigned char)(len >> 8);
                row[used + 3] = (unsigned char)len;
                used += 4;
                if (len) memcpy(row + used, data[c] + start, len);
                used += len;
            }
            SHA256_Init(&ctx);
            SHA256_Update(&ctx, row, used);
            SHA256_Final(out + 32 * i, &ctx);
            continue;
        }
        SHA256_Init(&ctx);
        if (prefix_len) SHA256_Update(&ctx, prefix, prefix_len);
        for (int c = 0; c < ncols; c++) {
            int64_t start = offsets[c][i], len = offsets[c][i + 1] - start;
            be[0] = (unsigned char)(len >> 24);
            be[1] = (unsigned char)(len >> 16);
            be[2] = (unsigned char)(len >> 8);
            be[3] = (unsigned char)len;
            SHA256_Update(&ctx, be, 4);
            if (len) SHA256_Update(&ctx, data[c] + start, (size_t)len);
        }
        SHA256_Final(out + 32 * i, &ctx);
    }
}

/* One SHA-256 over header || the tuple encoding of every row (len(c1) c1 len(c2) c2 ...,
   4-byte big-endian lengths), rows in ``order`` (NULL: 0..n-1), the encoding never
   materialised: fields are staged into a 64 KiB buffer hashed as it fills, so a row costs
   copies, not SHA256_Update calls. */
#define RG_STAGE (64 * 1024)
void rg_sha256_stream(int ncols, const unsigned char **data, const int64_t **offsets,
                      const int64_t *order, int64_t n, const unsigned char *header,
                      size_t header_len, unsigned char *out) {
    SHA256_CTX ctx;
    unsigned char stage[RG_STAGE];
    size_t used = 0;
    SHA256_Init(&ctx);
    if (header_len) SHA256_Update(&ctx, header, header_len);
    for (int64_t i = 0; i < n; i++) {
        int64_t row = order ? order[i] : i;
        for (int c = 0; c < ncols; c++) {
            int64_t start = offsets[c][row];
            size_t len = (size_t)(offsets[c][row + 1] - start);
            if (used + 4 > RG_STAGE) {
                SHA256_Update(&ctx, stage, used);
                used = 0;
            }
            stage[used] = (unsigned char)(len >> 24);
            stage[used + 1] = (unsigned char)(len >> 16);
            stage[used + 2] = (unsigned char)(len >> 8);
            stage[used + 3] = (unsigned char)len;
            used += 4;
            if (used + len > RG_STAGE) {
                SHA256_Update(&ctx, stage, used);
                used = 0;
                if (len > RG_STAGE) {
                    SHA256_Update(&ctx, data[c] + start, len);
                    continue;
                }
            }
            if (len) memcpy(stage + used, data[c] + start, len);
            used += len;
        }
    }
    if (used) SHA256_Update(&ctx, stage, used);
    SHA256_Final(out, &ctx);
}

/* One RFC 6962 level up: SHA-256(0x01 || left || right) per pair, an odd last node carried
   up unchanged.  `out` may alias `level` (entry i is written after entries 2i, 2i+1 are
   read).  Returns the number of nodes written. */
int64_t rg_merkle_level(const unsigned char *level, int64_t n, unsigned char *out) {
    static const unsigned char node_prefix = 0x01;
    SHA256_CTX ctx;
    int64_t pairs = n / 2;
    for (int64_t i = 0; i < pairs; i++) {
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, &node_prefix, 1);
        SHA256_Update(&ctx, level + 64 * i, 64);
        SHA256_Final(out + 32 * i, &ctx);
    }
    if (n % 2) memmove(out + 32 * pairs, level + 32 * (n - 1), 32);
    return pairs + n % 2;
}

/* The RFC 6962 root over n >= 1 packed leaf hashes, reduced in place in `scratch`. */
void rg_merkle_root(unsigned char *scratch, int64_t n, unsigned char *out) {
    while (n > 1) n = rg_merkle_level(scratch, n, scratch);
    memcpy(out, scratch, 32);
}

void rg_hex_digests(const unsigned char *digests, int64_t n, const unsigned char *prefix,
                    size_t prefix_len, unsigned char *out) {
    static const char hex[] = "0123456789abcdef";
    size_t width = prefix_len + 64;
    for (int64_t i = 0; i < n; i++) {
        unsigned char *row = out + width * i;
        const unsigned char *digest = digests + 32 * i;
        memcpy(row, prefix, prefix_len);
        for (int j = 0; j < 32; j++) {
            row[prefix_len + 2 * j] = (unsigned char)hex[digest[j] >> 4];
            row[prefix_len + 2 * j + 1] = (unsigned char)hex[digest[j] & 15];
        }
    }
}

/* Per row: maximal runs of bytes above separator_max (a run never crosses rows).  A run
   starts at a word byte that is a row's first byte or follows a separator byte: counted
   without a loop-carried state, so the compiler vectorizes the inner loop. */
void rg_word_runs(const unsigned char *data, const int64_t *offsets, int64_t n,
                  unsigned char separator_max, int64_t *out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t start = offsets[i], end = offsets[i + 1];
        if (end <= start) {
            out[i] = 0;
            continue;
        }
        int64_t runs = data[start] > separator_max;
        for (int64_t k = start + 1; k < end; k++) {
            runs += (data[k] > separator_max) & (data[k - 1] <= separator_max);
        }
        out[i] = runs;
    }
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "relgate.integrity._sha256",
    SOURCE,
    libraries=["crypto"],
    extra_compile_args=["-O3", "-Wall", "-Werror"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
