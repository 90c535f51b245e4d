/* The avx512_bf16 dot path's register tile and its rounding of the activations, shared by decoding's
 * tiles (skinny_bf16.c: a few rows rounded per 128 input features on the stack) and the many-row loop
 * (skinny_bf16_dot.c: a chunk's rows rounded once). Both give an output the sum skinny_bf16.c states
 * for BF16_DOT: the same rounding of x (round to nearest even), the same vdpbf16ps per pair of k in
 * order, whichever rows, blocks or k-panels the tile covers. Included only where the compiler targets
 * avx512_bf16 (static inline: each includer its own copies). */
#ifndef BF16_DOT_H
#define BF16_DOT_H
#include <stdint.h>
#include <immintrin.h>
#include "bf16_tiles.h"

#define DOT_GMAX 4 /* the most blocks of a dot tile */
#define DOT_MMAX 12 /* the most rows of a dot tile */

/* MBC rows against GBC blocks (constants in each inlined copy) over nq pairs of k, the rows already
 * rounded: xb[i * xs + q] holds row i's pair q (x[k] low, x[k + 1] high); p the blocks at the first
 * pair ([K / 2][16][2] each, block g at p + g K 16). Per pair the GBC weight lines are loaded once and
 * each row's pair broadcast once for its GBC dot products. The sums start at +0 (load 0) or at out's
 * values (load 1). `stream` 1: prefetch each weight stream skinny_ahead[1] bytes on (decoding's single
 * pass over the weights, bf16_tiles.h); 2: bf16_few_ahead bytes on, into L2 (a pass of a few positions,
 * bf16_few.h); a many-row tile rereads its panel from L1, where a prefetch would only bring in lines a
 * later panel reads, so it passes 0. */
static inline __attribute__((always_inline)) void tile_dot(const uint32_t *xb, int64_t xs, int64_t K, int64_t nq, const int MBC,
                                                           const int GBC, const uint16_t *p, float *out, int64_t ys, int load,
                                                           const int stream) {
    AHEAD_WHEN(stream == 1);
    const int64_t few = stream == 2 ? bf16_few_ahead : 0;
    __m512 acc[DOT_GMAX][DOT_MMAX];
    __m512bh v[DOT_GMAX];
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) acc[g][i] = load ? _mm512_loadu_ps(out + i * ys + g * BW) : _mm512_setzero_ps();
    for (int64_t q = 0; q < nq; q++) {
        for (int g = 0; g < GBC; g++) {
            const uint16_t *w = p + (int64_t)g * K * BW + 2 * q * BW;
            if (stream == 2) {
                if (few) _mm_prefetch((const char *)w + few, _MM_HINT_T1);
            } else {
                PREFETCH(w);
            }
            v[g] = (__m512bh)_mm512_loadu_si512(w);
        }
        for (int i = 0; i < MBC; i++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[i * xs + q]);
            for (int g = 0; g < GBC; g++) acc[g][i] = _mm512_dpbf16_ps(acc[g][i], v[g], xv);
        }
    }
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) _mm512_storeu_ps(out + i * ys + g * BW, acc[g][i]);
}

/* rows x[0..mb) (row stride K) over input features [k, k + kc) (kc even) rounded to bfloat16 pairs into
 * xb (row stride xs pairs): round to nearest even, vcvtne2ps2bf16, 32 features a line */
static inline void round_rows(const float *x, int64_t K, int64_t k, int64_t kc, int64_t mb, uint32_t *xb, int64_t xs) {
    for (int64_t i = 0; i < mb; i++)
        for (int64_t c = 0; c < kc; c += 32) {
            int64_t n = kc - c < 32 ? kc - c : 32;
            __mmask16 m0 = (__mmask16)((1u << (n < 16 ? n : 16)) - 1), m1 = (__mmask16)(n > 16 ? (1u << (n - 16)) - 1 : 0);
            const float *row = x + i * K + k + c;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, row + 16), _mm512_maskz_loadu_ps(m0, row));
            _mm512_mask_storeu_epi32(xb + i * xs + c / 2, (__mmask16)((1u << ((n + 1) / 2)) - 1), (__m512i)v);
        }
}
#endif
