/* A token's embedding row as the C step reads it, float32 [H], gathered in one call (runners/lean_lane.py: decoding's
 * one-position pass): from a released output layer's blocks (kernels/one_head.py: row n is block n / 16, lane n % 16;
 * float32 [ceil(V/16), H, 16], or bfloat16 [ceil(V/16), H/2, 16, 2] in memory, a row's features in pairs) or from a
 * row-major table [V, H] (float32 or bfloat16). Exact: a float32 copied, a bfloat16 widened (its bits, shifted), the
 * values torch's gather and cast give. The caller checks the token against the table's rows. */
#include <stdint.h>
#include <string.h>

#define EMBED_BLOCK 16

enum { ROWS_F32 = 0, ROWS_BF16 = 1, BLOCKS_F32 = 2, BLOCKS_BF16 = 3 };

static inline float widened(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float v;
    memcpy(&v, &wide, sizeof v);
    return v;
}

/* out [H] float32: the row of `token` in `table` of `kind` (above). */
void c_step_embed(const void *table, int64_t kind, int64_t token, int64_t H, float *out) {
    const int64_t block = token / EMBED_BLOCK, lane = token % EMBED_BLOCK;
    if (kind == ROWS_F32) {
        memcpy(out, (const float *)table + token * H, (size_t)H * sizeof(float));
    } else if (kind == ROWS_BF16) {
        const uint16_t *row = (const uint16_t *)table + token * H;
        for (int64_t k = 0; k < H; k++) out[k] = widened(row[k]);
    } else if (kind == BLOCKS_F32) {
        const float *b = (const float *)table + block * H * EMBED_BLOCK + lane;
        for (int64_t k = 0; k < H; k++) out[k] = b[k * EMBED_BLOCK];
    } else { /* BLOCKS_BF16: feature 2q + j at ((q 16 + lane) 2 + j) within the block */
        const uint16_t *b = (const uint16_t *)table + block * H * EMBED_BLOCK + lane * 2;
        for (int64_t q = 0; q < H / 2; q++) {
            out[2 * q] = widened(b[q * 2 * EMBED_BLOCK]);
            out[2 * q + 1] = widened(b[q * 2 * EMBED_BLOCK + 1]);
        }
    }
}
