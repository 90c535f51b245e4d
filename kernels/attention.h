/* Attention for the C steps (included by step_rows.h, after fexp and fexp16): one query head's
 * softmax(q . k * scale) . v over the cache slots it may see, by a rounding contract that every build
 * (AVX-512, AVX2, plain C) and every tile computes alike, bit for bit:
 *   score_j   = (q[0] k_j[0] + ... + q[D-1] k_j[D-1]) as a serial fused multiply-add chain from 0, in d
 *               order (fmaf(q[d], k_j[d], s)), then times scale (one rounding);
 *   top       = the seen scores' maximum; weight_j = fexp(score_j - top) where seen, 0 elsewhere;
 *   total     = the seen weights' sum in slot order from +0 (a serial chain: only the order of the seen
 *               slots counts, never where they sit, so a tree's branch sums as the chain of it does);
 *   out[d]    = a serial fused multiply-add chain over the seen slots in order, fmaf(weight_j, v_j[d], o)
 *               from 0, then times 1 / total.
 * A chain is the same whatever computes it, so vector code (attention_tiles.h, on AVX-512's 16 lanes or
 * AVX2's 8: attention_vec.h) takes keys as its lanes: the keys are first transposed in blocks of 16 slots
 * (key_blocks: kt[b][d][l] = key 16 b + l, dimension d), and a register tile of several queries x several
 * key vectors broadcasts q[d] and shares each key load; a tile of several rows (queries) x a span of
 * dimensions shares each value load; a row's total rides on lanes too (row_totals: the rows' weights
 * transposed, each lane one row's chain); several positions' queries take each block of keys and each chunk
 * of values while it is in L1 (attend_positions). An unseen slot inside a block, a tile or a row's span
 * (the slots up to the unit's last, past a position's own) is computed and then masked: its weight is 0,
 * and a 0 weight adds an exact 0 to a chain that started at +0 (so it never holds -0), bit for bit as if
 * the slot were skipped (the values being finite).
 * The cache's keys and values (and so the key blocks) are float32 or bfloat16 (`bf`: 0 or 1, a bfloat16 model's
 * C step, Dims.kv): bfloat16 ones are rounded once where a pass writes them (bf16_round) and widened where
 * read (exact), so the chains above take the rounded keys and values as their inputs, the same contract.
 * Each function that reads them runs a copy for each element type (bf a constant there: the float32 copy is
 * the code it was). */
#ifndef ATTENTION_H
#define ATTENTION_H

#define BLOCK 16 /* slots in a transposed key block */
#define GROUP 4  /* the most query heads of a position attend_positions takes at once */
#define POSITIONS 8 /* the most positions attend_positions takes at once */
#define CHUNK 64     /* slots weighed for all the positions at a time (their values stay in L1) */

/* blocks of BLOCK slots that hold L slots */
static inline int64_t blocks_of(int64_t L) { return (L + BLOCK - 1) / BLOCK; }

/* A position's part in attend_positions: its g query heads q[c D + d], the slots [0, n) of the range it
 * may see (seen[j] != 0; seen NULL: all of them, no mask read), its outputs out[c D + d]. */
typedef struct {
    const float *q;
    const uint8_t *seen;
    int64_t n;
    float *out;
} Position;

/* element i of the cache's elements p, as float32: float32 (bf 0) or bfloat16 (bf 1) widened (exact) */
static inline __attribute__((always_inline)) float kv_at(const void *p, int64_t i, const int bf) {
    if (!bf) return ((const float *)p)[i];
    union { uint32_t u; float f; } x = {.u = (uint32_t)((const uint16_t *)p)[i] << 16};
    return x.f;
}

/* the address of element i of p (float32: bf 0, or bfloat16) */
static inline void *kv_ptr(const void *p, int64_t i, int bf) { return (char *)p + i * (bf ? 2 : 4); }

/* f as bfloat16, rounded to nearest, ties to even (NaN: a quiet NaN), as torch's .to(torch.bfloat16) */
static inline uint16_t bf16_round(float f) {
    union { float f; uint32_t u; } x = {.f = f};
    if (f != f) return 0x7FC0;
    return (uint16_t)((x.u + 0x7FFFu + ((x.u >> 16) & 1u)) >> 16);
}

#include "attention_vec.h"
#if defined(ATTENTION_VEC)
#include "attention_tiles.h"
#endif

/* The keys [L, D] (row stride D) of blocks [b0, b1) transposed into kt: kt[(b D + d) 16 + l] = keys[16 b + l][d];
 * lanes past slot L - 1 are 0. Moves only: no rounding (keys and blocks float32, or both bfloat16: bf). */
static inline __attribute__((always_inline)) void key_blocks_as(const void *keys, int64_t L, int64_t D, int64_t b0, int64_t b1, void *kt,
                                                                const int bf) {
    for (int64_t b = b0; b < b1; b++) {
        void *o = kv_ptr(kt, b * D * BLOCK, bf);
        const void *k = kv_ptr(keys, b * BLOCK * D, bf);
        int64_t n = L - b * BLOCK < BLOCK ? L - b * BLOCK : BLOCK, d0 = 0;
#if defined(ATTENTION_VEC)
        if (n == BLOCK) /* VW x VW squares: VB of them side by side make a block's lanes */
            for (; d0 + VW <= D; d0 += VW)
                for (int h = 0; h < VB; h++) {
                    vec r[VW];
                    for (int l = 0; l < VW; l++) r[l] = kv_load(k, (h * VW + l) * D + d0, bf);
                    transpose_v(r);
                    for (int d = 0; d < VW; d++) kv_store(o, (d0 + d) * BLOCK + h * VW, r[d], bf);
                }
#endif
        for (int64_t l = 0; l < BLOCK; l++)
            for (int64_t d = d0; d < D; d++)
                if (bf)
                    ((uint16_t *)o)[d * BLOCK + l] = l < n ? ((const uint16_t *)k)[l * D + d] : 0;
                else
                    ((float *)o)[d * BLOCK + l] = l < n ? ((const float *)k)[l * D + d] : 0.0f;
    }
}

/* key_blocks_as for the cache's element type bf */
static void key_blocks(const void *keys, int64_t L, int64_t D, int64_t b0, int64_t b1, void *kt, int bf) {
    if (bf)
        key_blocks_as(keys, L, D, b0, b1, kt, 1);
    else
        key_blocks_as(keys, L, D, b0, b1, kt, 0);
}

/* seen[j], or every slot where seen is NULL (a chain's unit: every slot of its range up to its own) */
static inline int seen_at(const uint8_t *seen, int64_t j) { return !seen || seen[j]; }

/* a query's raw scores s[0..L) into its weights, in place: fexp(s_j - top) where seen[j] (seen NULL: all),
 * top the seen scores' maximum; 0 where unseen, and (vector builds, for the row tiles) 0 on from L to ls */
static void soften(const uint8_t *seen, int64_t L, float *s, int64_t ls) {
    float top = -INFINITY;
#if defined(ATTENTION_VEC)
    /* every slot on VW lanes (the scores' row holds whole blocks, so a tail's lanes are in it); the vectors
     * all seen (seen NULL: all but a tail) unmasked, the top over four running maxima (a maximum is exact in
     * any order, so the same top) so that the loads do not wait on one chain of maxima */
    const int64_t nv = (L + VW - 1) / VW, whole = seen ? 0 : L / VW;
    vec tops[4] = {v_set1(-INFINITY), v_set1(-INFINITY), v_set1(-INFINITY), v_set1(-INFINITY)};
    int64_t v = 0;
    for (; v + 4 <= whole; v += 4)
        for (int u = 0; u < 4; u++) tops[u] = v_max(tops[u], v_load(s + (v + u) * VW));
    for (; v < nv; v++) tops[v % 4] = v_top(tops[v % 4], seen_v(seen, v * VW, L), v_load(s + v * VW));
    top = v_reduce_max(v_max(v_max(tops[0], tops[1]), v_max(tops[2], tops[3])));
    for (v = 0; v < whole; v++) v_store(s + v * VW, v_exp_soft(v_sub(v_load(s + v * VW), v_set1(top))));
    for (; v < nv; v++) {
        vmask m = seen_v(seen, v * VW, L);
        v_store(s + v * VW, v_any(m) ? v_masked(m, v_exp_soft(v_sub(v_load(s + v * VW), v_set1(top)))) : v_zero());
    }
    for (int64_t j = nv * VW; j < ls; j += VW) v_store(s + j, v_zero());
#else
    (void)ls;
    for (int64_t j = 0; j < L; j++) top = seen_at(seen, j) && s[j] > top ? s[j] : top;
    for (int64_t j = 0; j < L; j++) s[j] = seen_at(seen, j) ? fexp(s[j] - top) : 0.0f;
#endif
}

/* raw scores of each position p's g <= GROUP queries over the blocks of its range: s[(p g + c) ls + j] =
 * chain(q_c, key j) * scale */
static inline __attribute__((always_inline)) void scores_as(const Position *pos, int P, int g, const void *kt, int64_t nb, int64_t D,
                                                            float scale, float *s, int64_t ls, const int bf) {
#if defined(ATTENTION_VEC)
    switch (g) {
    case 1: score_tiles(pos, P, 1, kt, nb, D, scale, s, ls, bf); return;
    case 2: score_tiles(pos, P, 2, kt, nb, D, scale, s, ls, bf); return;
    case 3: score_tiles(pos, P, 3, kt, nb, D, scale, s, ls, bf); return;
    default: score_tiles(pos, P, 4, kt, nb, D, scale, s, ls, bf); return;
    }
#else
    (void)nb;
    for (int p = 0; p < P; p++)
        for (int64_t b = 0; b < blocks_of(pos[p].n); b++) /* lanes l: independent chains (vectorized where the build allows) */
            for (int c = 0; c < g; c++) {
                float acc[BLOCK] = {0.0f};
                for (int64_t d = 0; d < D; d++) {
                    float x = pos[p].q[c * D + d];
                    for (int l = 0; l < BLOCK; l++) acc[l] = fmaf(x, kv_at(kt, (b * D + d) * BLOCK + l, bf), acc[l]);
                }
                for (int l = 0; l < BLOCK; l++) s[(p * g + c) * ls + b * BLOCK + l] = acc[l] * scale;
            }
#endif
}

/* scores_as for the keys' element type bf */
static void scores(const Position *pos, int P, int g, const void *kt, int64_t nb, int64_t D, float scale, float *s, int64_t ls, int bf) {
    if (bf)
        scores_as(pos, P, g, kt, nb, D, scale, s, ls, 1);
    else
        scores_as(pos, P, g, kt, nb, D, scale, s, ls, 0);
}

/* each position's outputs from its weights s[(p g + c) ls + j]: out[c D + d] = fmaf chain over the seen slots
 * in order of weight_j * values[j][d], from 0, times 1 / total, total the seen weights' sum in slot order
 * from +0; acc: scratch [P g D] */
static inline __attribute__((always_inline)) void weigh_as(const Position *pos, int P, int g, const float *s, int64_t ls, const void *values,
                                                           int64_t n, int64_t D, float *acc, const int bf) {
    float total[POSITIONS * GROUP] = {0.0f};
    (void)n; /* the plain loops: each position's own */
    for (int64_t e = 0; e < P * g * D; e++) acc[e] = 0.0f;
#if defined(ATTENTION_VEC)
    if (D % VW == 0) /* every row over the slots [0, n): its weights 0 past its own */
        weigh_rows(s, ls, P * g, values, n, D, acc, total, bf);
    else
#endif
        for (int p = 0; p < P; p++)
            for (int c = 0; c < g; c++) {
                float *o = acc + (p * g + c) * D;
                const float *w = s + (p * g + c) * ls;
                for (int64_t j = 0; j < pos[p].n; j++)
                    if (seen_at(pos[p].seen, j)) {
                        total[p * g + c] += w[j];
                        for (int64_t d = 0; d < D; d++) o[d] = fmaf(w[j], kv_at(values, j * D + d, bf), o[d]);
                    }
            }
    for (int p = 0; p < P; p++)
        for (int c = 0; c < g; c++) {
            float inv = 1.0f / total[p * g + c];
            for (int64_t d = 0; d < D; d++) pos[p].out[c * D + d] = acc[(p * g + c) * D + d] * inv;
        }
}

/* weigh_as for the values' element type bf */
static void weigh(const Position *pos, int P, int g, const float *s, int64_t ls, const void *values, int64_t n, int64_t D, float *acc, int bf) {
    if (bf)
        weigh_as(pos, P, g, s, ls, values, n, D, acc, 1);
    else
        weigh_as(pos, P, g, s, ls, values, n, D, acc, 0);
}

/* Attention for P <= POSITIONS positions' g <= GROUP query heads each, of one key-value head, over one range
 * of slots: kt those slots' keys in blocks (key_blocks), values [n, D] theirs (n: the positions' largest), both
 * float32 (bf 0) or bfloat16 (bf 1).
 * s: scratch [P g blocks_of(n) 16]; acc: scratch [P g D]. Each query's numbers are the contract's (above),
 * whatever P and g: the queries only share loads (a block of keys, a chunk of values stays in L1 for all of
 * them) and interleave independent chains. */
static void attend_positions(const Position *pos, int P, int g, const void *kt, const void *values, int64_t D, float scale,
                             float *s, float *acc, int bf) {
    int64_t n = 0;
    for (int p = 0; p < P; p++) n = pos[p].n > n ? pos[p].n : n;
    const int64_t nb = blocks_of(n), ls = nb * BLOCK;
    scores(pos, P, g, kt, nb, D, scale, s, ls, bf);
    for (int p = 0; p < P; p++)
        for (int c = 0; c < g; c++) soften(pos[p].seen, pos[p].n, s + (p * g + c) * ls, ls);
    weigh(pos, P, g, s, ls, values, n, D, acc, bf);
}

/* attend_positions for one position's g heads q [g, D] over seen [L] into out [g, D] */
static inline void attend_group(const float *q, int g, const void *kt, const void *values, const uint8_t *seen, int64_t L, int64_t D,
                         float scale, float *s, float *acc, float *out, int bf) {
    Position one = {q, seen, L, out};
    attend_positions(&one, 1, g, kt, values, D, scale, s, acc, bf);
}

#endif
