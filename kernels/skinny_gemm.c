/* The skinny kernel: y[M, N] = x[M, K] . W[N, K]^T (+ b[N]) in float32 for few rows M (decoding and
 * verification passes), reading W once from a layout made for streaming.
 *
 * A pass over a few positions is bound by reading the weights, not by arithmetic. So W is repacked
 * once into blocks of 16 output features, each block [K][16] contiguous ("blocked": [N/16, K, 16],
 * kernels/skinny.py's pack): a thread reads its share of the blocks as one sequential stream, which
 * the hardware prefetcher follows at memory speed, and each 64-byte line read is one vector of 16
 * outputs' weights for one input feature, multiplied with every input row while it is in a register.
 *
 * The sum of every output is one fused multiply-add chain over k = 0..K-1, then + b: the same order
 * whatever M, the row block, the thread count or the instruction set (AVX-512, AVX2, scalar fmaf all
 * round alike), so row m of y does not depend on the other rows of x: a position's logits are the
 * same in a pass over 1 position and in one over 12.
 *
 * Built at first use by kernels/skinny.py with the machine's own compiler and -march=native. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <omp.h>
#include "linears.h"
#include "deal.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define BW 16 /* output features per block: one 64-byte line per input feature */
/* How far ahead a weight stream prefetches by default, in bytes (64 lines of float32; -DSTEP_AHEAD_BYTES=...,
 * BF16_AHEAD_BYTES for bfloat16's): skinny_ahead's values until skinny_set_ahead (linears.h) */
#ifndef STEP_AHEAD_BYTES
#define STEP_AHEAD_BYTES 4096
#endif
#ifndef BF16_AHEAD_BYTES
#define BF16_AHEAD_BYTES 4096
#endif
int64_t skinny_ahead[2] = {STEP_AHEAD_BYTES, BF16_AHEAD_BYTES};

/* deal.h's switch: the ends of the threads' shares stolen (1; 2: a test's, thread 0 a thief from the start) or the
 * static share (0); STEP_DEAL by default, set per process by skinny_set_deal; speed only, the same bits */
#ifndef STEP_DEAL
#define STEP_DEAL 1
#endif
int64_t skinny_deal = STEP_DEAL;

/* skinny_deal set to `on` (0, 1 or 2; negative: left as it is); returns it after */
int64_t skinny_set_deal(int64_t on) {
    if (on >= 0) skinny_deal = on < 2 ? on : 2;
    return skinny_deal;
}

/* skinny_ahead's bytes [0] on float32 weights, [1] on bfloat16 (negative: left as they are); returns [which] after */
int64_t skinny_set_ahead(int64_t f32, int64_t bf16, int64_t which) {
    if (f32 >= 0) skinny_ahead[0] = f32;
    if (bf16 >= 0) skinny_ahead[1] = bf16;
    return skinny_ahead[which != 0];
}
#ifndef STEP_AHEAD_HINT
#define STEP_AHEAD_HINT _MM_HINT_T0
#endif
/* the prefetch of a float32 tile's line w, `ahead` bytes on (a tile's copy of skinny_ahead[0]; 0: none) */
#define AHEAD32(w) (ahead ? _mm_prefetch((const char *)(w) + ahead, STEP_AHEAD_HINT) : (void)0)
#if defined(__AVX512F__)
#define MB 12 /* input rows per register block: 2 blocks x 12 rows = 24 accumulators of 32 registers */
#define GB 2  /* blocks per register block */
#elif defined(__AVX2__) && defined(__FMA__)
#define MB 6 /* 1 block = 2 registers x 6 rows = 12 accumulators of 16 registers */
#define GB 1
#else
#define MB 4
#define GB 1
#endif

/* rows x[0..mb) (row stride K) against blocks p[0..gb) (each [K][16]); out[i * ys + j] for the
 * gb * 16 features; mb and gb are constants in each inlined copy, so the accumulators stay in registers */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t K, const int mb, const int gb,
                                                       const float *p, float *out, int64_t ys) {
#if defined(__AVX2__) && defined(__FMA__)
    const int64_t ahead = skinny_ahead[0];
#endif
#if defined(__AVX512F__)
    __m512 acc[GB][MB];
    for (int g = 0; g < GB; g++)
        for (int i = 0; i < MB; i++) acc[g][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        for (int g = 0; g < GB; g++) {
            if (g < gb) {
                const float *w = p + (int64_t)g * K * BW + k * BW;
                AHEAD32(w);
                __m512 v = _mm512_loadu_ps(w);
                for (int i = 0; i < MB; i++)
                    if (i < mb) acc[g][i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + k]), v, acc[g][i]);
            }
        }
    }
    for (int g = 0; g < gb; g++)
        for (int i = 0; i < mb; i++) _mm512_storeu_ps(out + i * ys + g * BW, acc[g][i]);
#elif defined(__AVX2__) && defined(__FMA__)
    (void)gb;
    __m256 lo[MB], hi[MB];
    for (int i = 0; i < MB; i++) { lo[i] = _mm256_setzero_ps(); hi[i] = _mm256_setzero_ps(); }
    for (int64_t k = 0; k < K; k++) {
        const float *w = p + k * BW;
        AHEAD32(w);
        __m256 a = _mm256_loadu_ps(w), b = _mm256_loadu_ps(w + 8);
        for (int i = 0; i < MB; i++) {
            if (i < mb) {
                __m256 xv = _mm256_set1_ps(x[i * K + k]);
                lo[i] = _mm256_fmadd_ps(xv, a, lo[i]);
                hi[i] = _mm256_fmadd_ps(xv, b, hi[i]);
            }
        }
    }
    for (int i = 0; i < mb; i++) { _mm256_storeu_ps(out + i * ys, lo[i]); _mm256_storeu_ps(out + i * ys + 8, hi[i]); }
#else
    (void)gb;
    for (int i = 0; i < mb; i++) {
        float acc[BW] = {0};
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < BW; j++) acc[j] = fmaf(x[i * K + k], p[k * BW + j], acc[j]);
        for (int j = 0; j < BW; j++) out[i * ys + j] = acc[j];
    }
#endif
}

#include "f32_few.h" /* 2..12 rows' own loop, one position's too where raced (AVX-512): wider tiles, prefetched into L2 */

/* one register block: mb rows (1..MB) against gb blocks (1..GB); each case a copy of tile with its
 * row and block counts constant, so that its accumulators stay in registers */
#define ROWS_UP_TO_6(G)                                       \
    case 1: tile(x, K, 1, G, p, out, ys); return;             \
    case 2: tile(x, K, 2, G, p, out, ys); return;             \
    case 3: tile(x, K, 3, G, p, out, ys); return;             \
    case 4: tile(x, K, 4, G, p, out, ys); return;             \
    case 5: tile(x, K, 5, G, p, out, ys); return;
#define ROWS_7_TO_12(G)                                       \
    case 6: tile(x, K, 6, G, p, out, ys); return;             \
    case 7: tile(x, K, 7, G, p, out, ys); return;             \
    case 8: tile(x, K, 8, G, p, out, ys); return;             \
    case 9: tile(x, K, 9, G, p, out, ys); return;             \
    case 10: tile(x, K, 10, G, p, out, ys); return;           \
    case 11: tile(x, K, 11, G, p, out, ys); return;           \
    default: tile(x, K, 12, G, p, out, ys); return;

static void tile_any(const float *x, int64_t K, int64_t mb, int64_t gb, const float *p, float *out, int64_t ys) {
#if defined(__AVX512F__)
    if (gb == 2) {
        switch (mb) { ROWS_UP_TO_6(2) ROWS_7_TO_12(2) }
    }
    switch (mb) { ROWS_UP_TO_6(1) ROWS_7_TO_12(1) }
#elif defined(__AVX2__) && defined(__FMA__)
    (void)gb;
    switch (mb) {
        ROWS_UP_TO_6(1)
    default: tile(x, K, 6, 1, p, out, ys); return;
    }
#else
    (void)gb;
    tile(x, K, (int)mb, 1, p, out, ys);
#endif
}

/* mb rows (any count) of x against gb blocks (any count) of p, out[i * ys + j], in register blocks of
 * up to MB rows x GB blocks: the reference tiles for what a variant's tile does not cover
 * (skinny_tiles.c: a last rows' block, a thread's last blocks, a padded block) */
void skinny_cover(const float *x, int64_t K, int64_t mb, int64_t gb, const float *p, float *out, int64_t ys) {
    for (int64_t m0 = 0; m0 < mb; m0 += MB)
        for (int64_t g0 = 0; g0 < gb; g0 += GB)
            tile_any(x + m0 * K, K, mb - m0 < MB ? mb - m0 : MB, gb - g0 < GB ? gb - g0 : GB, p + g0 * K * BW, out + m0 * ys + g0 * BW, ys);
}

/* One position against ONE_ROW blocks at a time (AVX-512: -DSTEP_ONE_ROW_BLOCKS=1..4; 2, the register block's
 * count, takes tile's own loop): one chain per output as in tile, so the same bits; a count of weight streams
 * per thread to compare (scripts/pass_read.py --variants). */
#ifndef STEP_ONE_ROW_BLOCKS
#define STEP_ONE_ROW_BLOCKS 2
#endif
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void row_tile(const float *x, int64_t K, const int G, const float *p, float *out) {
    const int64_t ahead = skinny_ahead[0];
    __m512 acc[4];
    for (int g = 0; g < G; g++) acc[g] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 xv = _mm512_set1_ps(x[k]);
        for (int g = 0; g < G; g++) {
            const float *w = p + (int64_t)g * K * BW + k * BW;
            AHEAD32(w);
            acc[g] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w), acc[g]);
        }
    }
    for (int g = 0; g < G; g++) _mm512_storeu_ps(out + g * BW, acc[g]);
}

/* y[0, blocks * 16) of one row (N whole blocks' worth, the padded block through spill) in groups of ONE_ROW blocks */
static void one_row(const float *x, const float *p, const float *b, float *y, int64_t N, int64_t K) {
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int64_t blocks = (N + BW - 1) / BW, groups = (blocks + STEP_ONE_ROW_BLOCKS - 1) / STEP_ONE_ROW_BLOCKS;
    int64_t first = groups * t / threads, last = groups * (t + 1) / threads;
    for (int64_t g = first; g < last; g++) {
        int64_t b0 = g * STEP_ONE_ROW_BLOCKS, gb = blocks - b0 < STEP_ONE_ROW_BLOCKS ? blocks - b0 : STEP_ONE_ROW_BLOCKS;
        float out[4 * BW];
        const float *pg = p + b0 * K * BW;
        switch (gb) {
        case 1: row_tile(x, K, 1, pg, out); break;
        case 2: row_tile(x, K, 2, pg, out); break;
        case 3: row_tile(x, K, 3, pg, out); break;
        default: row_tile(x, K, 4, pg, out); break;
        }
        for (int64_t j = 0; j < gb * BW && b0 * BW + j < N; j++) y[b0 * BW + j] = b ? out[j] + b[b0 * BW + j] : out[j];
    }
}
#endif

/* register group g (GB blocks from block g * GB) of y[M, N] = x . W^T + b, every row block over it; a padded
 * last block's tail features through spill [MB * GB * 16], then dropped */
static void one_group(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K, int64_t g,
                      float *spill) {
    int64_t blocks = (N + BW - 1) / BW, b0 = g * GB, gb = blocks - b0 < GB ? blocks - b0 : GB, n0 = b0 * BW, width = gb * BW;
    const float *pg = p + b0 * K * BW;
    /* the group's weights (gb * K * 64 bytes) stay in L2 while every row block passes over them */
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
        int64_t mb = M - m0 < MB ? M - m0 : MB;
        if (n0 + width <= N) {
            tile_any(x + m0 * K, K, mb, gb, pg, y + m0 * N + n0, N);
        } else {
            tile_any(x + m0 * K, K, mb, gb, pg, spill, width);
            for (int64_t i = 0; i < mb; i++)
                for (int64_t j = 0; n0 + j < N; j++) y[(m0 + i) * N + n0 + j] = spill[i * width + j];
        }
        if (b)
            for (int64_t i = 0; i < mb; i++)
                for (int64_t j = n0; j < n0 + width && j < N; j++) y[(m0 + i) * N + j] += b[j];
    }
}

/* Inside a parallel region (every thread calls it): y[M, N] = x . W^T + b, W blocked [N/16, K, 16] (N a multiple
 * of 16 or not: one_group's spill); the register groups shared statically, each thread a contiguous range (deal
 * NULL), or their ends stolen (deal.h, a Deal a thread: the same bits). */
void skinny_rows_deal(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K, Deal *deal) {
#if defined(__AVX512F__)
    if (M >= (f32_few[0] == 2 ? 1 : 2) && M <= F32_FEW_MOST && f32_few[0]) {
        few32_rows(x, p, b, y, M, N, K, deal);
        return;
    }
    if (M == 1 && STEP_ONE_ROW_BLOCKS != GB) {
        one_row(x, p, b, y, N, K);
        return;
    }
#endif
    int64_t groups = ((N + BW - 1) / BW + GB - 1) / GB, first, last;
    Share dealt = share_begin(groups, 1, deal);
    float spill[MB * GB * BW];
    while (share_next(&dealt, &first, &last))
        for (int64_t g = first; g < last; g++) one_group(x, p, b, y, M, N, K, g, spill);
}

void skinny_rows(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K) {
    skinny_rows_deal(x, p, b, y, M, N, K, NULL);
}

int skinny_simd(void) {
#if defined(__AVX512F__)
    return 512;
#elif defined(__AVX2__) && defined(__FMA__)
    return 256;
#else
    return 0;
#endif
}

/* x: [M, K] contiguous; p: W blocked [ceil(N/16), K, 16]; b: [N] or NULL; y: [M, N] contiguous.
 * threads: how many to run on, given by the caller (torch's count): whichever OpenMP runtime this
 * library was loaded beside, it never falls back on that runtime's own default. Returns the threads
 * the loop ran on. */
int skinny_linear(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    int ran = 1;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads((int)threads)
    {
        if (omp_get_thread_num() == 0) ran = omp_get_num_threads();
        skinny_rows(x, p, b, y, M, N, K);
    }
    return ran;
}
