/* The register tiles of the bfloat16 paths (skinny_bf16.c), called by their row loops
 * (skinny_bf16_rows.c). Declared once here, included by both. */
#ifndef BF16_TILES_H
#define BF16_TILES_H
#include <stdint.h>

enum { F32 = 0, BF16_SCALAR = 1, BF16_AVX2 = 2, BF16_AVX512 = 3, BF16_DOT = 4, BF16_AMX = 5 };

#define BW 16  /* output features per block */
#define MBX 12 /* the most rows of a decoding tile (bf16_tile) */
#define GBX 2  /* the most blocks of a decoding tile */

/* How far ahead a weight stream prefetches, in bytes: 4 KB, the float32 kernel's distance (64 lines of
 * 16 floats, skinny_gemm.c). A bfloat16 line holds half the bytes per output, so a distance in lines
 * of the float32 kernel (w + 64 BW elements: 2 KB here) would cover half its time of the memory's
 * latency. Speed only: a prefetch changes no bit. -DBF16_AHEAD_BYTES=... to try another (0: none). */
#ifndef BF16_AHEAD_BYTES
#define BF16_AHEAD_BYTES 4096
#endif
#define AHEAD (BF16_AHEAD_BYTES / 2) /* the same, in bfloat16 elements */
#if BF16_AHEAD_BYTES > 0
#ifndef STEP_AHEAD_HINT
#define STEP_AHEAD_HINT _MM_HINT_T0
#endif
#define PREFETCH(w) _mm_prefetch((const char *)((w) + AHEAD), STEP_AHEAD_HINT)
#else
#define PREFETCH(w) ((void)(w))
#endif

/* rows x[0..mb) (row stride K) against blocks p[0..gb) (each [K / 2][16][2]) over the input features
 * k0..k1-1 (both even), by `path`: out[i * ys + 16 g + j] holds the sums, which start at +0 (load 0)
 * or at out's values (load 1: the k before k0). Any mb, gb: decoding's tiles (up to MBX x GBX) cover them. */
void bf16_tile(int64_t path, const float *x, int64_t K, int64_t k0, int64_t k1, int64_t mb, int64_t gb, const uint16_t *p,
               float *out, int64_t ys, int load);

/* bf16_tile for exactly `rows` x `blocks` (a many-row shape: bf16_shapes); 0 where `path` has no such tile */
int bf16_full(int64_t path, int64_t rows, int64_t blocks, const float *x, int64_t K, int64_t k0, int64_t k1, const uint16_t *p,
              float *out, int64_t ys, int load);

/* skinny_amx.c: the AMX path's row loop (its own tiles; variant `tile` 0 or 1), and whether it runs here (0) or why not */
void skinny_rows_amx(int64_t tile, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K);
int amx_state(void);
#endif
