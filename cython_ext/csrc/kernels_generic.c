/* Scalar reference kernels that do not touch the KV arena: always built. */
#define _POSIX_C_SOURCE 200809L  /* pread under -std=c11 */
#define _FILE_OFFSET_BITS 64     /* files past 2 GiB on 32-bit ARM */
#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include "dp_kernels.h"

int dp_embed_generic(const void *table, const float *scales, int dtype, int64_t vocab,
                     int64_t dim, const int64_t *ids, int64_t num_tokens, float *out) {
    if (!table || !ids || !out || vocab <= 0 || dim <= 0 || num_tokens < 0) return DP_ERR_ARG;
    if ((dtype == DP_Q8_0 || dtype == DP_Q4_0) && (dim % 32 != 0 || !scales)) return DP_ERR_ARG;
    const int64_t nblocks = dim / 32;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t id = ids[t];
        if (id < 0 || id >= vocab) return DP_ERR_BOUNDS;
        float *o = out + t * dim;
        if (dtype == DP_F32) {
            memcpy(o, (const float *)table + id * dim, (size_t)dim * sizeof(float));
        } else if (dtype == DP_Q8_0) {
            const uint8_t *row = (const uint8_t *)table + id * dim;
            for (int64_t b = 0; b < nblocks; b++) {
                const float d = scales[id * nblocks + b];
                for (int i = 0; i < 32; i++) o[b * 32 + i] = d * (float)((int)row[b * 32 + i] - 128);
            }
        } else if (dtype == DP_Q4_0) {
            const uint8_t *row = (const uint8_t *)table + id * (dim / 2);
            for (int64_t b = 0; b < nblocks; b++) {
                const float d = scales[id * nblocks + b];
                for (int i = 0; i < 16; i++) {
                    const uint8_t byte = row[b * 16 + i];
                    o[b * 32 + 2 * i] = d * (float)((int)(byte & 0x0f) - 8);
                    o[b * 32 + 2 * i + 1] = d * (float)((int)(byte >> 4) - 8);
                }
            }
        } else {
            return DP_ERR_ARG;
        }
    }
    return DP_OK;
}

int dp_read_rows(int fd, int64_t offset, int64_t row_bytes, int64_t num_rows,
                 const int64_t *ids, int64_t n, uint8_t *out) {
    if (fd < 0 || offset < 0 || row_bytes <= 0 || num_rows <= 0 || n < 0 || !ids || !out) return DP_ERR_ARG;
    if (num_rows > (INT64_MAX - offset) / row_bytes) return DP_ERR_ARG;
    for (int64_t t = 0; t < n; t++) {
        const int64_t id = ids[t];
        if (id < 0 || id >= num_rows) return DP_ERR_BOUNDS;
        uint8_t *dst = out + t * row_bytes;
        const int64_t src = offset + id * row_bytes;
        int64_t done = 0;
        while (done < row_bytes) {
            const ssize_t r = pread(fd, dst + done, (size_t)(row_bytes - done), (off_t)(src + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                if (r == 0) errno = EIO;  /* the file is shorter than its table */
                return DP_ERR_IO;
            }
            done += r;
        }
    }
    return DP_OK;
}
