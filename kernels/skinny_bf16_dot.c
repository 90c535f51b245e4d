/* The avx512_bf16 dot path's many-row loop (a prompt's chunks, skinny_bf16_rows.c's variants 1..): the
 * chunk's rows rounded to bfloat16 pairs once per call (each thread its own copy: no barrier, and a few
 * hundred KB against the call's megabytes of weights), then, on each thread's share of the whole blocks,
 * per group of the variant's blocks, per k-panel of kc features (the group's weights for a panel stay
 * in L1), a register tile of rows x blocks passes over every row. Decoding's tiles round a few rows per
 * 128 features on the stack for each tile instead: at 12 rows and one weight pass that is cheap, but a
 * many-row variant paid it once per row tile per group, and through L2.
 *
 * Every output is the sum skinny_bf16.c states for BF16_DOT (x rounded to nearest even, one vdpbf16ps
 * per pair of k in order from +0, a k-panel's sums stored and loaded back, then + b): the bits of
 * decoding's tiles whatever M, the tile, its panels or the threads. */
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>
#include "bf16_tiles.h"
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include "bf16_dot.h"

/* The most bytes of rounded rows a thread allocates for a call (2 M K); past it, or where malloc refuses,
 * decoding's tiles. 64 MiB: a chunk of 512 rows of 65536 features. -DBF16_DOT_ROUNDED_BYTES=0 builds
 * the loop that never rounds ahead (tests/test_bf16_dot.py: the same bits). */
#ifndef BF16_DOT_ROUNDED_BYTES
#define BF16_DOT_ROUNDED_BYTES (64LL << 20)
#endif

/* the most rows a tile of g blocks takes here (every register a sum but g weight lines and a broadcast) */
static int64_t rows_for(int64_t g) { return g >= 4 ? 6 : g == 3 ? 8 : 12; }

#define T(R, G) tile_dot(xr, xs, K, nq, R, G, p, out, ys, load, 0)
#define ROWS6(G) case 1: T(1, G); break; case 2: T(2, G); break; case 3: T(3, G); break; case 4: T(4, G); break; \
                 case 5: T(5, G); break; case 6: T(6, G); break;
#define ROWS8(G) ROWS6(G) case 7: T(7, G); break; case 8: T(8, G); break;
#define ROWS12(G) ROWS8(G) case 9: T(9, G); break; case 10: T(10, G); break; case 11: T(11, G); break; case 12: T(12, G); break;

/* one tile: mb rows (<= rows_for(gb)) of xr (row stride xs pairs) against gb blocks (1..4) over nq pairs */
static void dot_tile(int64_t mb, int64_t gb, const uint32_t *xr, int64_t xs, int64_t K, int64_t nq, const uint16_t *p, float *out,
                     int64_t ys, int load) {
    switch (gb) {
    case 4: switch (mb) { ROWS6(4) } break;
    case 3: switch (mb) { ROWS8(3) } break;
    case 2: switch (mb) { ROWS12(2) } break;
    default: switch (mb) { ROWS12(1) } break;
    }
}

/* rows [0, M) against gb blocks at p over the input features [k0, k1), `rows` at a time (the last tile
 * fewer); out's sums start at +0 (load 0) or at its values */
static void dot_rows(const uint32_t *xr, int64_t xs, int64_t M, int64_t rows, int64_t K, int64_t k0, int64_t k1, int64_t gb,
                     const uint16_t *p, float *out, int64_t ys, int load) {
    for (int64_t m0 = 0; m0 < M; m0 += rows)
        dot_tile(M - m0 < rows ? M - m0 : rows, gb, xr + m0 * xs + k0 / 2, xs, K, (k1 - k0) / 2, p + k0 * BW, out + m0 * ys, ys, load);
}

/* the padded last block (N not a multiple of 16) of rows [0, M): the whole of k per row tile, through a
 * spill of 16 columns, then + b */
static void padded(const uint32_t *xr, int64_t xs, const float *x, int64_t M, int64_t K, const uint16_t *p, const float *b, float *y,
                   int64_t N) {
    float spill[DOT_MMAX * BW];
    int64_t n0 = N / BW * BW;
    for (int64_t m0 = 0; m0 < M; m0 += DOT_MMAX) {
        int64_t mb = M - m0 < DOT_MMAX ? M - m0 : DOT_MMAX;
        if (xr) dot_rows(xr + m0 * xs, xs, mb, DOT_MMAX, K, 0, K, 1, p, spill, BW, 0);
        else bf16_tile(BF16_DOT, x + m0 * K, K, 0, K, mb, 1, p, spill, BW, 0);
        for (int64_t i = 0; i < mb; i++)
            for (int64_t j = n0; j < N; j++) y[(m0 + i) * N + j] = spill[i * BW + j - n0] + (b ? b[j] : 0.0f);
    }
}

/* Inside a parallel region (every thread calls it): y[M, N] = x[M, K] . W^T (+ b) on the dot path by a
 * rows x blocks tile over k-panels of kc (0: the whole of k), each thread a contiguous share of the whole
 * blocks, the padded one to the last thread. Where the rounded rows' memory is refused (or over
 * BF16_DOT_ROUNDED_BYTES), decoding's tiles (which round a few rows at a time) cover the same share:
 * the same bits, slower. */
void many_dot(int64_t rows, int64_t blocks, int64_t kc, const float *x, const uint16_t *p, const float *b, float *y, int64_t M,
              int64_t N, int64_t K) {
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int64_t whole = N / BW, first = whole * t / threads, last = whole * (t + 1) / threads, xs = K / 2;
    uint32_t *xr = M * K * 2 <= BF16_DOT_ROUNDED_BYTES ? malloc((size_t)(M * xs) * sizeof(uint32_t)) : NULL;
    if (xr) round_rows(x, K, 0, K, M, xr, xs);
    if (kc <= 0) kc = K;
    for (int64_t b0 = first; b0 < last; b0 += blocks) {
        int64_t gb = last - b0 < blocks ? last - b0 : blocks, r = gb == blocks && rows < rows_for(gb) ? rows : rows_for(gb);
        for (int64_t k0 = 0; xr && k0 < K; k0 += kc)
            dot_rows(xr, xs, M, r, K, k0, k0 + kc < K ? k0 + kc : K, gb, p + b0 * K * BW, y + b0 * BW, N, k0 > 0);
        if (!xr) bf16_tile(BF16_DOT, x, K, 0, K, M, gb, p + b0 * K * BW, y + b0 * BW, N, 0);
        if (b)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = b0 * BW; j < (b0 + gb) * BW; j++) y[i * N + j] += b[j];
    }
    if (N % BW && t == threads - 1) padded(xr, xs, x, M, K, p + whole * K * BW, b, y, N);
    free(xr);
}
#endif
