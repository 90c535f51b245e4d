/* The fed tokens' embedding rows as the C step reads them, float32 [n, H], gathered in one call (runners/lean_lane.py:
 * a decided chain pass of 1..12 positions, the tokens read where the ids lie): from a released output layer's blocks
 * (kernels/one_head.py: row n is block n / 16, lane n % 16; float32 [ceil(V/16), H, 16], or bfloat16
 * [ceil(V/16), H/2, 16, 2] in memory, a row's features in pairs) or from a row-major table [V, H] (float32 or
 * bfloat16). Exact: a float32 copied, a bfloat16 widened (its bits, shifted), the values torch's gather and cast
 * give. Every token is checked against the table's V rows first: one outside, and nothing is gathered (the caller
 * runs the model's own forward, which says what is wrong). */
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
static void embed_row(const void *table, int64_t kind, int64_t token, int64_t H, float *out) {
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

/* out [n, H] float32: the rows of tokens[0..n-1] in `table` of `kind` and V rows. Returns 0, or the count of tokens
 * outside 0..V-1 (then out is untouched). */
int64_t c_step_embed_rows(const void *table, int64_t kind, const int64_t *tokens, int64_t n, int64_t V, int64_t H, float *out) {
    int64_t outside = 0;
    for (int64_t i = 0; i < n; i++) outside += tokens[i] < 0 || tokens[i] >= V;
    if (outside) return outside;
    for (int64_t i = 0; i < n; i++) embed_row(table, kind, tokens[i], H, out + i * H);
    return 0;
}
