/* The row loops of the bfloat16 paths (their tiles: skinny_bf16.c, which states each path's sums).
 *
 * Variant 0 is decoding's loop: each thread streams a contiguous share of the weights, in groups of
 * the path's register block (blocks of 16 features), every row block over the whole of k. The others
 * are a prompt's many-row variants (as skinny_tiles.c's for float32): a register tile of rows x blocks,
 * the weights' whole blocks shared among the threads, and k-panels of kc input features (a tile's
 * weights for a panel stay in L1 while every row block passes over them; 0: the whole of k). Rows and
 * blocks a variant's tile does not cover take decoding's tiles. The dot path's many-row variants run
 * skinny_bf16_dot.c's loop (the rows rounded once a call). Every tile computes every output by its
 * path's one chain, panels included (bf16_tiles.h), so every variant gives every row the same bits
 * whatever M or the thread count: which one runs is a matter of speed only. */
#include <stddef.h>
#include <stdint.h>
#include <omp.h>
#include "bf16_tiles.h"
#include "linears.h"
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include "bf16_few.h" /* the dot path's loops over one position and over 2..12 rows */
#endif
/* Passes of 2..12 rows on the dot path take bf16_few.h's loop, on the AVX-512 widening path groups as wide as
 * the sums fit (bf16_few_wide): on Zen 4 (one thread, the pair target's linears, noisy) the widening path's
 * 2, 4 and 6 rows went from 1.4x, 1.8x and 2.1x one position to 1.0x, 1.2x and 1.6x. -DBF16_FEW=0 builds
 * decoding's 12 x 2 tiles for them instead (to compare: the same bits) */
#ifndef BF16_FEW
#define BF16_FEW 1
#endif
/* bytes ahead a pass of a few positions prefetches into L2 (bf16_few.h; -DBF16_FEW_AHEAD=0: none) */
#ifndef BF16_FEW_AHEAD
#define BF16_FEW_AHEAD 4096
#endif
int64_t bf16_few_ahead = BF16_FEW_AHEAD;

/* bf16_few_ahead's bytes (negative: left as they are); returns them after. Speed only */
int64_t skinny_set_few_ahead(int64_t bytes) {
    if (bytes >= 0) bf16_few_ahead = bytes;
    return bf16_few_ahead;
}

/* skinny_bf16_dot.c: the dot path's many-row loop (built where the compiler targets avx512_bf16) */
void many_dot(int64_t rows, int64_t blocks, int64_t kc, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N,
              int64_t K);
void skinny_rows_tile(int64_t tile, const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K);

typedef struct {
    int rows, blocks; /* the register tile: rows x blocks of 16 features */
    int kc;           /* input features per k-panel; 0: the whole of k per tile */
} Shape;

/* each path's variants: 0 decoding's (its register block), then the many-row ones; rows 0 ends a list */
static const Shape SHAPES[6][5] = {
    [BF16_SCALAR] = {{4, 1, 0}, {4, 1, 256}},
    [BF16_AVX2] = {{6, 1, 0}, {6, 1, 256}},
    [BF16_AVX512] = {{12, 2, 0}, {12, 2, 256}, {8, 3, 256}},
    /* the whole of k a tile: on Zen 4 (2 cores, 1 MiB L2, SmolLM2's linears over 256 rows, one thread) these
     * ran 207-210 GFLOP/s, 89% of vdpbf16ps's peak there, where panels of 256 ran 182-189 and of 512
     * 199-205 (scripts/bf16_widths.py --gflops): a tile's weights stream from L2 as fast, and each
     * panel's sums stored and loaded back, a tile's fixed cost, weigh more than the lines L1 saves */
    [BF16_DOT] = {{12, 2, 0}, {12, 2, 0}, {8, 3, 0}, {6, 4, 0}},
    [BF16_AMX] = {{16, 3, 0}, {32, 2, 0}}, /* skinny_amx.c's own loops: a row tile of 16 on three blocks; two on two */
};

/* how many variants `path` has (0 for no such path) */
int skinny_bf16_tiles(int64_t path) {
    int n = 0;
    while (path >= BF16_SCALAR && path <= BF16_AMX && n < 5 && SHAPES[path][n].rows) n++;
    return n;
}

/* variant `tile` of `path` into shape[0..3): rows, blocks, kc; -1 where there is none */
int skinny_bf16_tile_shape(int64_t path, int64_t tile, int64_t *shape) {
    if (tile < 0 || tile >= skinny_bf16_tiles(path)) return -1;
    shape[0] = SHAPES[path][tile].rows, shape[1] = SHAPES[path][tile].blocks, shape[2] = SHAPES[path][tile].kc;
    return 0;
}

static void add_bias(const float *b, float *y, int64_t M, int64_t N, int64_t n0, int64_t n1) {
    if (b)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = n0; j < n1 && j < N; j++) y[i * N + j] += b[j];
}

/* One position on the AVX-512 and dot paths: groups of ONE_ROW_BLOCKS blocks (a 1 x 4 tile, bf16_full),
 * not the register block's two. A widening pair of k is two dependent FMAs per output, a dot one
 * instruction, so two blocks' chains alone wait on their latency between lines; four chains and four
 * weight streams keep more of the memory's lines in flight. Each output's chain is the one it has in
 * any tile: the same bits. -DBF16_ONE_ROW_BLOCKS=2 builds the register block's groups instead. */
#ifndef BF16_ONE_ROW_BLOCKS
#define BF16_ONE_ROW_BLOCKS 4
#endif

/* One position on the dot path rounds its row once a call (bf16_few.h's one_dot), where decoding's 1 x 4 tiles
 * rounded it per 128 features of every group; -DBF16_ONE_ROUNDED=0 builds those instead (to compare: the same bits) */
#ifndef BF16_ONE_ROUNDED
#define BF16_ONE_ROUNDED 1
#endif

/* variant 0: groups of the register block's blocks, dealt contiguously; at one position (ONE_ROW_BLOCKS),
 * each thread an even share of the blocks, in groups from its first (its last group shorter): whole groups
 * of 4 dealt left one thread a group more on SmolLM2's o and down (9 groups: 5 against 4), 11% of their time
 * with the other waiting at the barrier, where float32's groups of 2 split evenly. Each output's chain is
 * its one chain in any tile: the same bits whatever the share (-DBF16_EVEN_SHARE=0: whole groups, to
 * compare). The padded last group through `spill`. */
#ifndef BF16_EVEN_SHARE
#define BF16_EVEN_SHARE 1
#endif
/* blocks [first, last) of decoding's loop in groups of GB from first (the last shorter): `one`, one position's 1 x 4
 * tiles; `few`, 2..12 rows' wide tiles; else the path's register blocks. spill [MBX * 4 * 16]: a padded block's */
static void blocks_range(int64_t path, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                         int64_t first, int64_t last, int64_t GB, int one, int few, float *spill) {
    for (int64_t b0 = first; b0 < last; b0 += GB) {
        int64_t gb = last - b0 < GB ? last - b0 : GB, n0 = b0 * BW, width = gb * BW;
        const uint16_t *pg = p + b0 * K * BW;
        /* the group's weights stay in L2 while every row block passes over them */
        for (int64_t m0 = 0; m0 < M; m0 += MBX) {
            int64_t mb = M - m0 < MBX ? M - m0 : MBX;
            if (n0 + width <= N) {
                if (!(one && gb == 4 && bf16_full(path, 1, 4, x, K, 0, K, pg, y + n0, N, 0)) &&
                    !(few && bf16_few_wide(path, x + m0 * K, K, 0, K, mb, gb, pg, y + m0 * N + n0, N, 0)))
                    bf16_tile(path, x + m0 * K, K, 0, K, mb, gb, pg, y + m0 * N + n0, N, 0);
            } else {
                bf16_tile(path, x + m0 * K, K, 0, K, mb, gb, pg, spill, width, 0);
                for (int64_t i = 0; i < mb; i++)
                    for (int64_t j = 0; n0 + j < N; j++) y[(m0 + i) * N + n0 + j] = spill[i * width + j];
            }
            add_bias(b, y + m0 * N, mb, N, n0, n0 + width);
        }
    }
}

/* decoding's loop; its groups shared statically, or their ends stolen (deal.h, a Deal a thread; NULL: static). A
 * share's unit is a block (the even share: taken GB at a time) or a group of GB blocks */
static void decoding(int64_t path, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                     Deal *deal) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if (BF16_FEW && path == BF16_DOT && M >= 2 && M <= FEW_MOST) {
        few_dot(x, p, b, y, M, N, K, deal);
        return;
    }
    if (BF16_ONE_ROUNDED && BF16_ONE_ROW_BLOCKS == 4 && path == BF16_DOT && M == 1 && K <= ONE_ROUNDED_MOST) {
        one_dot(x, p, b, y, N, K, deal);
        return;
    }
#endif
    int one = M == 1 && BF16_ONE_ROW_BLOCKS == 4 && (path == BF16_AVX512 || path == BF16_DOT);
    /* 2..12 rows on the AVX-512 widening path: groups as wide as the sums fit (bf16_few_wide), shared evenly */
    int few = BF16_FEW && path == BF16_AVX512 && M >= 2 && M <= MBX;
    int64_t GB = one ? 4 : few ? (M <= 5 ? 4 : M <= 7 ? 3 : 2) : SHAPES[path][0].blocks;
    int64_t blocks = (N + BW - 1) / BW, groups = (blocks + GB - 1) / GB, unit = (one || few) && BF16_EVEN_SHARE ? 1 : GB, u0, u1;
    Share dealt = share_begin(unit == 1 ? blocks : groups, unit == 1 ? GB : 1, deal);
    float spill[MBX * 4 * BW];
    while (share_next(&dealt, &u0, &u1))
        blocks_range(path, x, p, b, y, M, N, K, u0 * unit, u1 * unit < blocks ? u1 * unit : blocks, GB, one, few, spill);
}

/* a many-row variant: each thread a contiguous share of the whole blocks, in groups of the tile's
 * width, panel by panel over the rows the tile fills, decoding's tiles for the rest; the padded last
 * block (N not a multiple of 16) to the last thread, through `spill` */
static void many(int64_t path, const Shape *s, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N,
                 int64_t K) {
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int64_t whole = N / BW, first = whole * t / threads, last = whole * (t + 1) / threads, kc = s->kc > 0 ? s->kc : K;
    for (int64_t b0 = first; b0 < last; b0 += s->blocks) {
        int64_t gb = last - b0 < s->blocks ? last - b0 : s->blocks, tiled = gb == s->blocks ? M - M % s->rows : 0;
        const uint16_t *pg = p + b0 * K * BW;
        float *yg = y + b0 * BW;
        for (int64_t k0 = 0; tiled > 0 && k0 < K; k0 += kc)
            for (int64_t m0 = 0; m0 < tiled; m0 += s->rows)
                if (!bf16_full(path, s->rows, s->blocks, x + m0 * K, K, k0, k0 + kc < K ? k0 + kc : K, pg, yg + m0 * N, N, k0 > 0))
                    bf16_tile(path, x + m0 * K, K, k0, k0 + kc < K ? k0 + kc : K, s->rows, s->blocks, pg, yg + m0 * N, N, k0 > 0);
        if (tiled < M) bf16_tile(path, x + tiled * K, K, 0, K, M - tiled, gb, pg, yg + tiled * N, N, 0);
        add_bias(b, y, M, N, b0 * BW, (b0 + gb) * BW);
    }
    if (N % BW && t == threads - 1) {
        float spill[MBX * BW];
        for (int64_t m0 = 0; m0 < M; m0 += MBX) {
            int64_t mb = M - m0 < MBX ? M - m0 : MBX;
            bf16_tile(path, x + m0 * K, K, 0, K, mb, 1, p + whole * K * BW, spill, BW, 0);
            for (int64_t i = 0; i < mb; i++)
                for (int64_t j = whole * BW; j < N; j++) y[(m0 + i) * N + j] = spill[i * BW + j - whole * BW];
            add_bias(b, y + m0 * N, mb, N, whole * BW, N);
        }
    }
}

/* Inside a parallel region (every thread calls it): skinny_rows (skinny_gemm.c) on W blocked bfloat16
 * [ceil(N/16), K, 16] (pairs of k interleaved), by `path` (one of skinny_bf16_paths) and its variant
 * `tile` (0 or one it lacks: decoding's loop). */
void skinny_rows_bf16(int64_t path, int64_t tile, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N,
                      int64_t K) {
    if (path == BF16_AMX)
        skinny_rows_amx(tile, x, p, b, y, M, N, K);
    else if (tile <= 0 || tile >= skinny_bf16_tiles(path))
        decoding(path, x, p, b, y, M, N, K, NULL);
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    else if (path == BF16_DOT)
        many_dot(SHAPES[path][tile].rows, SHAPES[path][tile].blocks, SHAPES[path][tile].kc, x, p, b, y, M, N, K);
#endif
    else
        many(path, &SHAPES[path][tile], x, p, b, y, M, N, K);
}

/* skinny_rows_as, decoding's loop (tile 0) dealing its groups by `deal` (linears.h); AMX and the many-row variants
 * their static shares */
void skinny_rows_dealt(int64_t format, int64_t tile, const float *x, const void *p, const float *b, float *y, int64_t M, int64_t N,
                       int64_t K, Deal *deal) {
    if (!deal || tile > 0 || format == BF16_AMX)
        skinny_rows_as(format, tile, x, p, b, y, M, N, K);
    else if (format == F32)
        skinny_rows_deal(x, (const float *)p, b, y, M, N, K, deal);
    else
        decoding(format, x, (const uint16_t *)p, b, y, M, N, K, deal);
}

/* The linear the C step runs for its weights' format: F32 (skinny_gemm.c's, by its many-row variant `tile`,
 * skinny_tiles.c: the same bits whichever) or a bfloat16 path (by its variant `tile`: the same bits whichever). */
void skinny_rows_as(int64_t format, int64_t tile, const float *x, const void *p, const float *b, float *y, int64_t M, int64_t N,
                    int64_t K) {
    if (format == F32)
        skinny_rows_tile(tile, x, (const float *)p, b, y, M, N, K);
    else
        skinny_rows_bf16(format, tile, x, (const uint16_t *)p, b, y, M, N, K);
}

/* skinny_rows_bf16 on `threads` threads (skinny_gemm.c's skinny_linear); the threads it ran on */
int skinny_linear_bf16(int64_t path, int64_t tile, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N,
                       int64_t K, int64_t threads) {
    int ran = 1;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads((int)threads)
    {
        if (omp_get_thread_num() == 0) ran = omp_get_num_threads();
        skinny_rows_bf16(path, tile, x, p, b, y, M, N, K);
    }
    return ran;
}
