/* Decoding's float32 loop over a few positions: 2..12 rows (a verification pass; one position's too where f32_few[0]
 * is 2), on AVX-512. Included by skinny_gemm.c after its tile (BW, AHEAD32, skinny_ahead).
 *
 * Before, every width from 2 to 12 ran decoding's 12 x 2 register tile with one position's prefetch (skinny_ahead[0],
 * raced at one position by kernels/ahead.py). From about 4 rows a thread's arithmetic between two lines of a stream
 * (one zmm FMA a row a line, 1 a cycle on Zen 4) outlasts what its out-of-order window hides of the memory's latency,
 * so a pass of 8 positions cost ~1.2x one in its linears alone (bf16_tiles.h found the same on bfloat16). Here, from
 * f32_few[3] rows on, the weight streams are prefetched f32_few[2] bytes ahead into L2, and the tile is as wide as 24
 * sums allow (f32_few_blocks: 2-5 rows x 4 blocks, 6-8 x 3, 9-12 x 2 as before): more streams a thread, fewer
 * broadcasts a line (docs/runners.md, 2026-11-30).
 *
 * Every output is skinny_gemm.c's chain: acc = fma(x[k], w[k], acc) for k = 0..K-1 in order from +0, then + b; only
 * the register tile and the prefetches differ, so a row's bits are those of any other width (tests/test_f32_few.py).
 * Speed only: f32_few[1] 0 keeps decoding's 12 x 2 shape, f32_few[2] 0 prefetches as one position does, f32_few[0]
 * 0 runs the loop before; skinny_set_few32 sets them per process (scripts/decode_profile.py --few, few_costs_ab.py). */
#ifndef F32_FEW_H
#define F32_FEW_H
#include <stdint.h>
#include "deal.h"

#define F32_FEW_MOST 12 /* the most rows this loop takes (decoding's MANY_ROWS) */
#ifndef F32_FEW_AHEAD
#define F32_FEW_AHEAD 4096 /* bytes ahead into L2 */
#endif
#ifndef F32_FEW_ROWS
#define F32_FEW_ROWS 4 /* the fewest rows that prefetch into L2 */
#endif
#ifndef F32_FEW_SHAPE
#define F32_FEW_SHAPE 1 /* 1: f32_few_blocks' tiles; 0: decoding's 12 x 2 */
#endif
#ifndef F32_FEW_ON
#define F32_FEW_ON 1 /* 0: skinny_gemm.c's own loop at every width (the loop before); 2: one position's too */
#endif
int64_t f32_few[4] = {F32_FEW_ON, F32_FEW_SHAPE, F32_FEW_AHEAD, F32_FEW_ROWS}; /* on, shape, bytes ahead, from rows */
static const int64_t f32_few_built[4] = {F32_FEW_ON, F32_FEW_SHAPE, F32_FEW_AHEAD, F32_FEW_ROWS};

/* f32_few's values set (each negative: left as it is); returns f32_few[which] after (which 4..7: f32_few[which - 4]
 * as built, whatever was set since). Speed only, the same bits */
int64_t skinny_set_few32(int64_t on, int64_t shape, int64_t ahead, int64_t rows, int64_t which) {
    const int64_t to[4] = {on, shape, ahead, rows};
    for (int i = 0; i < 4; i++)
        if (to[i] >= 0) f32_few[i] = to[i];
    return which >= 4 ? f32_few_built[which & 3] : f32_few[which & 3];
}

#if defined(__AVX512F__)
/* blocks a group at M rows: M x blocks sums, at most 24, with the blocks' lines and a broadcast in 32 registers */
static int64_t f32_few_blocks(int64_t M) { return !f32_few[1] || M > 8 ? 2 : M <= 5 ? 4 : 3; }

/* MBC rows (row stride K) against GBC blocks of p (each [K][16]) into out (row stride ys), from +0; L2: the streams
 * prefetched `ahead` bytes on into L2 (else one position's prefetch, AHEAD32) */
static inline __attribute__((always_inline)) void few32_tile(const float *x, int64_t K, const int MBC, const int GBC, const float *p,
                                                             float *out, int64_t ys, const int L2, int64_t far) {
    const int64_t ahead = L2 ? 0 : skinny_ahead[0];
    __m512 acc[4][F32_FEW_MOST], v[4];
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) acc[g][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        for (int g = 0; g < GBC; g++) {
            const float *w = p + (int64_t)g * K * BW + k * BW;
            if (L2)
                _mm_prefetch((const char *)w + far, _MM_HINT_T1);
            else
                AHEAD32(w);
            v[g] = _mm512_loadu_ps(w);
        }
        for (int i = 0; i < MBC; i++) {
            __m512 xv = _mm512_set1_ps(x[i * K + k]);
            for (int g = 0; g < GBC; g++) acc[g][i] = _mm512_fmadd_ps(xv, v[g], acc[g][i]);
        }
    }
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) _mm512_storeu_ps(out + i * ys + g * BW, acc[g][i]);
}

#define F32_T(R, G) few32_tile(x, K, R, G, p, out, ys, L2, far)
#define F32_R5(G) case 1: F32_T(1, G); return; case 2: F32_T(2, G); return; case 3: F32_T(3, G); return; \
                  case 4: F32_T(4, G); return; case 5: F32_T(5, G); return;
#define F32_R8(G) F32_R5(G) case 6: F32_T(6, G); return; case 7: F32_T(7, G); return; case 8: F32_T(8, G); return;
#define F32_R12(G) F32_R8(G) case 9: F32_T(9, G); return; case 10: F32_T(10, G); return; case 11: F32_T(11, G); return; \
                   default: F32_T(12, G); return;
#define F32_G switch (gb) { case 1: switch (rows) { F32_R12(1) } case 2: switch (rows) { F32_R12(2) } \
                            case 3: switch (rows) { F32_R8(3) default: return; } default: switch (rows) { F32_R5(4) default: return; } }

/* rows (1..12) x gb (<= f32_few_blocks(rows)) blocks: each shape's copy with its counts constant */
static void few32_any(int64_t rows, int64_t gb, const float *x, int64_t K, const float *p, float *out, int64_t ys, int64_t far) {
    if (far > 0) {
        const int L2 = 1;
        F32_G
    } else {
        const int L2 = 0;
        F32_G
    }
}

/* Inside a parallel region: y[M, N] = x[M, K] . W^T (+ b) for 1 <= M <= F32_FEW_MOST, W blocked [N/16, K, 16]; each
 * thread an even share of the blocks in groups of f32_few_blocks(M), its end stolen by a thread done with its own
 * (deal.h; NULL: the even share alone); a padded last block (N not a multiple of 16) through spill */
static void few32_rows(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K, Deal *deal) {
    const int64_t GBF = f32_few_blocks(M), blocks = (N + BW - 1) / BW, far = M >= f32_few[3] ? f32_few[2] : 0;
    float spill[F32_FEW_MOST * 4 * BW];
    Share dealt = share_begin(blocks, GBF, deal);
    int64_t first, last;
    while (share_next(&dealt, &first, &last))
        for (int64_t b0 = first; b0 < last; b0 += GBF) {
            int64_t gb = last - b0 < GBF ? last - b0 : GBF, n0 = b0 * BW, width = gb * BW;
            const float *pg = p + b0 * K * BW;
            const int spilled = n0 + width > N;
            if (!spilled)
                few32_any(M, gb, x, K, pg, y + n0, N, far);
            else
                few32_any(M, gb, x, K, pg, spill, width, far);
            group_out(spill, spilled, b, y, M, N, n0, width);
        }
}
#endif
#endif
