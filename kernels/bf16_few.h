/* The avx512_bf16 dot path's decoding loop (skinny_bf16_rows.c's variant 0) over a few positions: 2..12 rows
 * (a verification pass). Included by skinny_bf16_rows.c where the compiler targets avx512_bf16.
 *
 * Before, every width from 2 to 12 ran decoding's 12 x 2 register tile: two weight streams a thread (one
 * position runs four: a 1 x 4 tile, skinny_bf16_rows.c's ONE_ROW_BLOCKS), 2 x 2 rows x blocks four dependent
 * chains a pair of k, and the prefetch distance raced at one position (none on Zen 4). On Zen 4 (one thread,
 * the 1.5B pair target's linears, noisy) 2 positions cost 1.2x one, 6 positions 1.6x, 8 2.1x, 12 2.7x.
 * Here the tile is as wide as 24 sums allow at that width (few_blocks: 2-5 rows x 4 blocks, 6-8 x 3, 9-12 x 2),
 * one tile a group over the whole of k, each thread an even share of the blocks (as one position's), the
 * group's rows rounded to bfloat16 once per panel of FEW_KC input features; from FEW_AHEAD_ROWS rows on the
 * weight streams are prefetched into L2 (bf16_few_ahead bytes on). Same run: 1.1x, 1.1x, 1.3x, 1.9x (12 rows
 * are near the core's vdpbf16ps peak on one thread).
 *
 * Every output is the sum skinny_bf16.c states for BF16_DOT: x rounded to nearest even, one vdpbf16ps per
 * pair of k in order from +0, a panel's sums stored and loaded back (a float32 store and load change no bit):
 * the bits of any other tile of the path, whatever the width or the threads. */
#ifndef BF16_FEW_H
#define BF16_FEW_H
#include <stdint.h>
#include "bf16_dot.h"

#define FEW_KC 128  /* input features a panel (the rounded rows on the stack: 12 x 64 pairs) */
#define FEW_MOST 12 /* the most rows this loop takes (decoding's MANY_ROWS) */

/* blocks a group at M rows (the tile's: M x blocks sums, at most 24, with the blocks' weight lines and a
 * broadcast in 32 registers). 6 rows x 4 blocks ran slower than 6 x 3 on Zen 4 (1.26x one against 1.09x, noisy) */
#ifndef FEW_FOUR_MOST
#define FEW_FOUR_MOST 5 /* the most rows on 4 blocks */
#endif
static int64_t few_blocks(int64_t M) { return M <= FEW_FOUR_MOST ? 4 : M <= 8 ? 3 : 2; }

#define FEW_T(R, G) tile_dot(xb, xs, K, nq, R, G, p, out, ys, load, S)
#define FEW_R5(G) case 1: FEW_T(1, G); break; case 2: FEW_T(2, G); break; case 3: FEW_T(3, G); break; \
                  case 4: FEW_T(4, G); break; case 5: FEW_T(5, G); break;
#define FEW_R8(G) FEW_R5(G) case 6: FEW_T(6, G); break; case 7: FEW_T(7, G); break; case 8: FEW_T(8, G); break;
#define FEW_R12(G) FEW_R8(G) case 9: FEW_T(9, G); break; case 10: FEW_T(10, G); break; case 11: FEW_T(11, G); break; \
                   default: FEW_T(12, G); break;
#define FEW_G switch (gb) { case 1: switch (rows) { FEW_R12(1) } break; case 2: switch (rows) { FEW_R12(2) } break; \
                            case 3: switch (rows) { FEW_R8(3) } break; default: switch (rows) { FEW_R5(4) } break; }

/* rows x gb blocks over nq pairs (few_blocks' shapes and their shorter last groups: up to 5 rows on 4 blocks, 8 on
 * 3, 12 on 1-2), the rows rounded in xb (row stride xs pairs); `stream`: tile_dot's prefetch, 2 into L2 at bf16_few_ahead, 1 at one position's */
static void few_tile(int64_t rows, int64_t gb, const uint32_t *xb, int64_t xs, int64_t K, int64_t nq, const uint16_t *p, float *out,
                     int64_t ys, int load, int stream) {
    if (stream == 2) {
        const int S = 2;
        FEW_G
    } else {
        const int S = 1;
        FEW_G
    }
}

/* A pass of 2..12 positions rounds its rows once a call per thread where M K is at most FEW_ROUNDED_FEATURES (on the
 * stack: 48 KB, SmolLM2's 12 x 1536), not per FEW_KC features of every group (one_dot's reason, below); -DBF16_FEW_ROUNDED=0
 * builds the rounding per group for every width (to compare: the same bits, a panel's sums stored and loaded back) */
#ifndef BF16_FEW_ROUNDED
#define BF16_FEW_ROUNDED 1
#endif
#ifndef FEW_ROUNDED_FEATURES
#define FEW_ROUNDED_FEATURES 24576
#endif

/* rows x[0..M) (M <= FEW_MOST, row stride K) against gb (<= few_blocks(M)) blocks at p over the whole of k into
 * out (row stride ys), from +0 */
static void few_group(const float *x, int64_t M, int64_t K, int64_t gb, const uint16_t *p, float *out, int64_t ys) {
    uint32_t xb[FEW_MOST * FEW_KC / 2];
    const int64_t xs = FEW_KC / 2;
    const int stream = M >= FEW_AHEAD_ROWS ? 2 : 1;
    for (int64_t kk = 0; kk < K; kk += FEW_KC) {
        int64_t kc = K - kk < FEW_KC ? K - kk : FEW_KC;
        round_rows(x + kk, K, 0, kc, M, xb, xs);
        few_tile(M, gb, xb, xs, K, kc / 2, p + kk * BW, out, ys, kk > 0, stream);
    }
}

/* Inside a parallel region: y[M, N] = x[M, K] . W^T (+ b) for 2 <= M <= FEW_MOST on the dot path, each thread an
 * even share of the blocks in groups of few_blocks(M) from its first (its last group shorter), its end stolen by a
 * thread done with its own (deal.h, a Deal a thread; NULL: the even share alone); the padded last block (N not a
 * multiple of 16) through `spill` */
static void few_dot(const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K, Deal *deal) {
    const int64_t GB = few_blocks(M), blocks = (N + BW - 1) / BW;
    float spill[FEW_MOST * 4 * BW];
    /* the rows rounded once a call where they fit (FEW_ROUNDED_FEATURES), each group's tile then over the whole of k */
    uint32_t xr[FEW_ROUNDED_FEATURES / 2];
    const int rounded = BF16_FEW_ROUNDED && M * K <= FEW_ROUNDED_FEATURES;
    if (rounded) round_rows(x, K, 0, K, M, xr, K / 2);
    const int stream = M >= FEW_AHEAD_ROWS ? 2 : 1;
    Share dealt = share_begin(blocks, GB, deal);
    int64_t first, last;
    while (share_next(&dealt, &first, &last))
        for (int64_t b0 = first; b0 < last; b0 += GB) {
            int64_t gb = last - b0 < GB ? last - b0 : GB, n0 = b0 * BW, width = gb * BW;
            const uint16_t *pg = p + b0 * K * BW;
            const int spilled = n0 + width > N;
            if (rounded)
                few_tile(M, gb, xr, K / 2, K, K / 2, pg, spilled ? spill : y + n0, spilled ? width : N, 0, stream);
            else
                few_group(x, M, K, gb, pg, spilled ? spill : y + n0, spilled ? width : N);
            group_out(spill, spilled, b, y, M, N, n0, width);
        }
}

/* One position on the dot path (decoding's loop at M 1, ONE_ROUNDED): the row rounded to bfloat16 pairs once a call
 * per thread, not once per 128 features of every group of 4 blocks (on SmolLM2's one-position pass, 3,200 groups of
 * 5-12 roundings and as many panels' sums stored and loaded back), then per group one 1 x gb tile over the whole of k
 * (one chain per output from +0, pairs in order: the sum skinny_bf16.c states, the bits of every other tile), each
 * thread an even share of the blocks in groups of 4 from its first, its end stolen as decoding's (deal.h). K at most
 * ONE_ROUNDED_MOST (the rounded row on the stack); past it, decoding's tiles (skinny_bf16_rows.c). */
#ifndef ONE_ROUNDED_MOST
#define ONE_ROUNDED_MOST 20480 /* 40 KB of pairs: a 7B model's intermediate size of 18944 fits */
#endif
#define ONE_T(G) tile_dot(xb, 0, K, K / 2, 1, G, pg, out, 0, 0, 1)

static void one_dot(const float *x, const uint16_t *p, const float *b, float *y, int64_t N, int64_t K, Deal *deal) {
    uint32_t xb[ONE_ROUNDED_MOST / 2];
    const int64_t blocks = (N + BW - 1) / BW;
    float spill[4 * BW];
    round_rows(x, K, 0, K, 1, xb, K / 2);
    Share dealt = share_begin(blocks, 4, deal);
    int64_t first, last;
    while (share_next(&dealt, &first, &last))
        for (int64_t b0 = first; b0 < last; b0 += 4) {
            const int64_t gb = last - b0 < 4 ? last - b0 : 4, n0 = b0 * BW, width = gb * BW;
            const uint16_t *pg = p + b0 * K * BW;
            const int spilled = n0 + width > N;
            float *out = spilled ? spill : y + n0;
            switch (gb) {
            case 1: ONE_T(1); break;
            case 2: ONE_T(2); break;
            case 3: ONE_T(3); break;
            default: ONE_T(4); break;
            }
            group_out(spill, spilled, b, y, 1, N, n0, width);
        }
}
#undef ONE_T
#endif
