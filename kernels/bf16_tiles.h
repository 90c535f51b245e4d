/* The register tiles of the bfloat16 paths (skinny_bf16.c), called by their row loops
 * (skinny_bf16_rows.c). Declared once here, included by both. */
#ifndef BF16_TILES_H
#define BF16_TILES_H
#include <stdint.h>

enum { F32 = 0, BF16_SCALAR = 1, BF16_AVX2 = 2, BF16_AVX512 = 3, BF16_DOT = 4, BF16_AMX = 5 };

#define BW 16  /* output features per block */
#define MBX 12 /* the most rows of a decoding tile (bf16_tile) */
#define GBX 2  /* the most blocks of a decoding tile */

/* How far ahead a weight stream prefetches: skinny_ahead[1] bytes (linears.h; by default 4 KB, the float32
 * kernel's distance in bytes: a bfloat16 line holds half the bytes per output, so the float32 kernel's
 * distance in lines would cover half its time of the memory's latency), read by each tile into `ahead`
 * before its loop (AHEAD_BYTES); 0: none. Speed only: a prefetch changes no bit. A build with
 * -DBF16_AHEAD_BYTES=0 has no prefetch at all. */
#include "linears.h"
#ifndef STEP_AHEAD_HINT
#define STEP_AHEAD_HINT _MM_HINT_T0
#endif
#if !defined(BF16_AHEAD_BYTES) || BF16_AHEAD_BYTES > 0
#define AHEAD_WHEN(on) const int64_t ahead = (on) ? skinny_ahead[1] : 0
#define PREFETCH(w) (ahead ? _mm_prefetch((const char *)(w) + ahead, STEP_AHEAD_HINT) : (void)0)
#else
#define AHEAD_WHEN(on) const int64_t ahead = 0 * (on)
#define PREFETCH(w) ((void)(w), (void)ahead)
#endif
/* a tile on decoding's single pass over its weights: always the distance (AHEAD_WHEN: only where `on`) */
#define AHEAD_BYTES AHEAD_WHEN(1)

/* bytes ahead a tile of a few positions' pass prefetches its weight streams into L2 (its `stream` 2; 0: none;
 * skinny_bf16_rows.c's skinny_set_few_ahead) */
extern int64_t bf16_few_ahead;

/* Passes of FEW_AHEAD_ROWS rows or more on the dot path (bf16_few.h) and the AVX-512 widening path (skinny_bf16.c's
 * bf16_few_wide) prefetch their weight streams bf16_few_ahead bytes ahead into L2; fewer, as one position
 * (skinny_ahead[1], raced by kernels/ahead.py). From about 4 rows a thread's arithmetic between
 * two lines of a stream outlasts what its out-of-order window hides of the memory's latency, and the hardware's
 * prefetchers alone left the lines' arrival and the sums apart: on Zen 4 (one thread, the pair target's
 * linears, noisy) 6 rows cost 1.5x one without and 1.3x with 4 KB ahead into L2, where 2-3 rows cost
 * 1.1x without and 1.2x with; the widening path's 8 rows 2.5x without, 2.1x with. Speed only: a prefetch changes no bit. */
#ifndef FEW_AHEAD_ROWS
#define FEW_AHEAD_ROWS 4
#endif

/* rows x[0..mb) (row stride K) against blocks p[0..gb) (each [K / 2][16][2]) over the input features
 * k0..k1-1 (both even), by `path`: out[i * ys + 16 g + j] holds the sums, which start at +0 (load 0)
 * or at out's values (load 1: the k before k0). Any mb, gb: decoding's tiles (up to MBX x GBX) cover them. */
void bf16_tile(int64_t path, const float *x, int64_t K, int64_t k0, int64_t k1, int64_t mb, int64_t gb, const uint16_t *p,
               float *out, int64_t ys, int load);

/* bf16_tile for exactly `rows` x `blocks` (a many-row shape: bf16_shapes); 0 where `path` has no such tile */
int bf16_full(int64_t path, int64_t rows, int64_t blocks, const float *x, int64_t K, int64_t k0, int64_t k1, const uint16_t *p,
              float *out, int64_t ys, int load);

/* skinny_bf16.c: the AVX-512 widening path's tile of mb (<= MBX) rows x gb (<= 4) blocks for a pass of a few
 * positions; 0 where `path` is not that one or this build lacks it */
int bf16_few_wide(int64_t path, const float *x, int64_t K, int64_t k0, int64_t k1, int64_t mb, int64_t gb, const uint16_t *p,
                  float *out, int64_t ys, int load);

/* skinny_amx.c: the AMX path's row loop (its own tiles; variant `tile` 0 or 1), and whether it runs here (0) or why not */
void skinny_rows_amx(int64_t tile, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K);
int amx_state(void);
#endif
