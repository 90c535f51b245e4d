/* attention.h's register tiles on VW-lane vectors (attention_vec.h: AVX-512 or AVX2), included by attention.h
 * where ATTENTION_VEC is defined. Each lane carries one of the contract's serial chains (a slot's score
 * over d, a dimension's output over the slots, a row's total over the slots), in the contract's order; the
 * tiles only choose which chains run side by side and which loads they share. */
#ifndef ATTENTION_TILES_H
#define ATTENTION_TILES_H

#define VB (BLOCK / VW) /* vectors in a block of slots */
/* Software prefetches a few KiB ahead of the key and value loads (hints only: no number changes): a block of
 * keys is a 4 KiB page of its own, a value row a quarter of one (SmolLM2's), and the hardware's streams stop
 * at each page, so at a long context (the cache from memory, decoding) every page would start on misses. */
/* The keys' into L2 (T1): a tile's next blocks arrive a tile ahead, and on Zen 4 (one core, 2 MB pages, 800 slots)
 * that scored ~15% faster than into L1 (T0), which the tile's own loads fill (noisy, docs/runners.md). */
#if defined(STEP_PROFILE)
extern int c_step_prefetch; /* the profiling build's A/B (c_step.c): 0, none */
#define PREFETCH(p) (c_step_prefetch ? _mm_prefetch((const char *)(p), _MM_HINT_T0) : (void)0)
#define PREFETCH_L2(p) (c_step_prefetch ? _mm_prefetch((const char *)(p), _MM_HINT_T1) : (void)0)
#else
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#endif
#if defined(STEP_PROFILE)
extern int c_step_pairs; /* the profiling build's A/B (c_step.c): 0, a position's queries alone in a score tile */
#define PAIRS c_step_pairs
#else
#define PAIRS 1
#endif
#if VW == 16
#define SCORE_KV(G) ((G) <= 2 ? 8 : ((G) == 3 ? 6 : 5)) /* key vectors a score tile holds: G KV + KV of 32 registers */
/* key vectors a tile of two positions' G queries holds (2 G KV + KV + 1 of 32 registers): the 2 G rows share each
 * key load (24 FMAs to 4 + 6 loads at G = 3, against 18 to 6 + 3), and the keys held take less of L1 */
#define PAIR_KV(G) ((G) == 1 ? 8 : ((G) == 2 ? 5 : ((G) == 3 ? 4 : 3)))
#define SPAN_V 4 /* a weigh tile's dimensions, in vectors: 64 */
#define ROWS_T 6 /* a weigh tile's rows: 6 x 4 sums + 4 values of 32 registers */
#else
#define SCORE_KV(G) ((G) == 1 ? 6 : ((G) == 2 ? 4 : 2)) /* whole blocks (2 vectors each) of 16 registers */
#define PAIR_KV(G) ((G) == 1 ? 4 : ((G) <= 3 ? 2 : 0)) /* whole blocks; 0: G = 4 alone (2 G KV > 13 registers) */
#define SPAN_V 2 /* 16 dimensions */
#define ROWS_T 5 /* 5 x 2 sums + 2 values + a weight of 16 registers */
#endif

/* raw scores (chain * scale) of R queries over KV key vectors (whole blocks) of kt (float32, or bfloat16: bf) into s + c ls, query c being
 * q0 + c qs for c < G, else q1 + (c - G) qs (a second position's G heads: R = 2 G): R x KV chains in flight,
 * each key vector loaded once for the R queries */
static inline __attribute__((always_inline)) void score_tile(const float *q0, const float *q1, int64_t qs, const int G, const int R,
                                                             const int KV, const void *kt, int64_t D, float scale, float *s, int64_t ls,
                                                             const int bf) {
    vec acc[2 * GROUP][8], k[8];
    for (int c = 0; c < R; c++)
        for (int b = 0; b < KV; b++) acc[c][b] = v_zero();
    for (int64_t d = 0; d < D; d++) {
        for (int b = 0; b < KV; b++) {
            k[b] = kv_load(kt, ((b / VB) * D + d) * BLOCK + (b % VB) * VW, bf);
            __asm__("" : "+v"(k[b])); /* kept in a register: one load for the R queries, not one each */
            if (b % VB == 0) PREFETCH_L2(kv_ptr(kt, ((b / VB + KV / VB) * D + d) * BLOCK, bf)); /* the next tile's block, this line */
        }
        for (int c = 0; c < R; c++) {
            vec x = v_set1(c < G ? q0[c * qs + d] : q1[(c - G) * qs + d]);
            for (int b = 0; b < KV; b++) acc[c][b] = v_fma(x, k[b], acc[c][b]);
        }
    }
    for (int c = 0; c < R; c++)
        for (int b = 0; b < KV; b++) v_store(s + c * ls + b * VW, v_mul(acc[c][b], v_set1(scale)));
}

/* score_tile over `count` (<= KV, a multiple of VB) key vectors, each count alone compiled */
static inline __attribute__((always_inline)) void score_count(const float *q0, const float *q1, int64_t qs, const int G, const int R,
                                                              const int KV, int64_t count, const void *kt, int64_t D, float scale,
                                                              float *s, int64_t ls, const int bf) {
    switch (count) {
    case 1: if (1 <= KV && 1 % VB == 0) score_tile(q0, q1, qs, G, R, 1, kt, D, scale, s, ls, bf); break;
    case 2: if (2 <= KV && 2 % VB == 0) score_tile(q0, q1, qs, G, R, 2, kt, D, scale, s, ls, bf); break;
    case 3: if (3 <= KV && 3 % VB == 0) score_tile(q0, q1, qs, G, R, 3, kt, D, scale, s, ls, bf); break;
    case 4: if (4 <= KV && 4 % VB == 0) score_tile(q0, q1, qs, G, R, 4, kt, D, scale, s, ls, bf); break;
    case 5: if (5 <= KV && 5 % VB == 0) score_tile(q0, q1, qs, G, R, 5, kt, D, scale, s, ls, bf); break;
    case 6: if (6 <= KV && 6 % VB == 0) score_tile(q0, q1, qs, G, R, 6, kt, D, scale, s, ls, bf); break;
    case 7: if (7 <= KV && 7 % VB == 0) score_tile(q0, q1, qs, G, R, 7, kt, D, scale, s, ls, bf); break;
    case 8: if (8 <= KV && 8 % VB == 0) score_tile(q0, q1, qs, G, R, 8, kt, D, scale, s, ls, bf); break;
    default: break;
    }
}

/* raw scores of every position's G queries over the blocks of its range, KV vectors at a time for all the positions
 * (those keys stay in L1; G a constant in each copy), two positions to a tile where PAIR_KV(G) allows: a score
 * is its own chain whichever tile holds it, and the scores a pair's first position gets past its own blocks (the
 * second's range being longer) lie in its row's room (ls: the unit's longest range) past its own slots, which
 * soften never reads (it zeroes them) */
static inline __attribute__((always_inline)) void score_tiles(const Position *pos, int P, const int G, const void *kt, int64_t nb,
                                                              int64_t D, float scale, float *s, int64_t ls, const int bf) {
    const int two = PAIRS && PAIR_KV(G) > 0 && P > 1, KV = two ? PAIR_KV(G) : SCORE_KV(G); /* one position: decoding's tiles */
    for (int64_t v = 0; v < nb * VB; v += KV)
        for (int p = 0; p < P;) {
            const void *k = kv_ptr(kt, v / VB * D * BLOCK, bf);
            float *o = s + p * G * ls + v * VW;
            if (two && p + 1 < P) {
                int64_t n = pos[p].n > pos[p + 1].n ? pos[p].n : pos[p + 1].n, left = blocks_of(n) * VB - v;
                if (left > 0) score_count(pos[p].q, pos[p + 1].q, D, G, 2 * G, KV, left < KV ? left : KV, k, D, scale, o, ls, bf);
                p += 2;
            } else {
                int64_t left = blocks_of(pos[p].n) * VB - v; /* a multiple of VB, as KV is */
                if (left > 0) score_count(pos[p].q, pos[p].q, D, G, G, KV, left < KV ? left : KV, k, D, scale, o, ls, bf);
                p += 1;
            }
        }
}

/* Q rows' sums acc[c D + VW b + lane] (b < NB) carried on over the slots [j0, j1) by the chains
 * fmaf(s[c ls + j], values[j][VW b + lane], .), and total[c] (where not NULL) by the adds of s[c ls + j]:
 * each value vector loaded once for the Q rows. A row's weights are 0 past its own slots (soften), which
 * add exact zeros. */
static inline __attribute__((always_inline)) void rows_tile(const float *s, int64_t ls, const void *values, int64_t j0, int64_t j1,
                                                            int64_t D, const int NB, const int Q, float *acc, float *total, const int bf) {
    vec a[ROWS_T][SPAN_V], v[SPAN_V];
    float t[ROWS_T];
    for (int c = 0; c < Q; c++) {
        t[c] = total ? total[c] : 0.0f;
        for (int b = 0; b < NB; b++) a[c][b] = v_load(acc + c * D + VW * b);
    }
    for (int64_t j = j0; j < j1; j++) {
        for (int b = 0; b < NB; b++) {
            v[b] = kv_load(values, j * D + VW * b, bf);
            __asm__("" : "+v"(v[b])); /* kept in a register: one load for the Q rows */
            PREFETCH(kv_ptr(values, (j + BLOCK) * D + VW * b, bf)); /* 16 slots on */
        }
        for (int c = 0; c < Q; c++) {
            vec w = v_set1(s[c * ls + j]);
            if (total) t[c] += v_first(w); /* a few rows' scalar chains, hidden under the tile's FMAs */
            for (int b = 0; b < NB; b++) a[c][b] = v_fma(w, v[b], a[c][b]);
        }
    }
    for (int c = 0; c < Q; c++) {
        if (total) total[c] = t[c];
        for (int b = 0; b < NB; b++) v_store(acc + c * D + VW * b, a[c][b]);
    }
}

/* rows_tile over the rows [0, R), ROWS_T at a time, NB vectors of dimensions (Q a constant in each copy) */
static inline __attribute__((always_inline)) void rows_tiles(const float *s, int64_t ls, const void *values, int64_t j0, int64_t j1,
                                                             int64_t D, const int NB, int R, float *acc, float *total, const int bf) {
    for (int r0 = 0; r0 < R; r0 += ROWS_T) {
        const float *w = s + r0 * ls;
        float *a = acc + r0 * D, *t = total ? total + r0 : NULL;
        switch (R - r0 < ROWS_T ? R - r0 : ROWS_T) {
        case 1: rows_tile(w, ls, values, j0, j1, D, NB, 1, a, t, bf); break;
        case 2: rows_tile(w, ls, values, j0, j1, D, NB, 2, a, t, bf); break;
        case 3: rows_tile(w, ls, values, j0, j1, D, NB, 3, a, t, bf); break;
        case 4: rows_tile(w, ls, values, j0, j1, D, NB, 4, a, t, bf); break;
        case 5: rows_tile(w, ls, values, j0, j1, D, NB, 5, a, t, bf); break;
        default: rows_tile(w, ls, values, j0, j1, D, NB, ROWS_T, a, t, bf); break;
        }
    }
}

/* total[c] (c < R) = row c's weights s[c ls + j] summed over j in [0, n) in slot order from +0: VW rows' chains
 * on VW lanes, each VW x VW square of weights transposed (moves) so that one add carries them all a slot on */
static void row_totals(const float *s, int64_t ls, int R, int64_t n, float *total) {
    for (int r0 = 0; r0 < R; r0 += VW) {
        vec t = v_zero(), x[VW];
        float lanes[VW];
        for (int64_t j = 0; j < n; j += VW) { /* past n: whole blocks of zeros (soften) */
            for (int c = 0; c < VW; c++) x[c] = r0 + c < R ? v_load(s + (r0 + c) * ls + j) : v_zero();
            transpose_v(x);
            for (int l = 0; l < VW; l++) t = v_add(t, x[l]);
        }
        v_store(lanes, t);
        for (int c = 0; c < VW && r0 + c < R; c++) total[r0 + c] = lanes[c];
    }
}

/* every row's sums acc [R, D] (zeroed) and totals (from +0) over the slots [0, n): the totals apart (row_totals)
 * where the rows fill half a vector, else within the tiles; the slots in chunks whose values stay in L1 */
static inline __attribute__((always_inline)) void weigh_rows(const float *s, int64_t ls, int R, const void *values, int64_t n, int64_t D,
                                                             float *acc, float *total, const int bf) {
    const int apart = 2 * R >= VW;
    if (apart) row_totals(s, ls, R, n, total);
    for (int64_t d0 = 0; d0 < D; d0 += SPAN_V * VW)
        for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
            int64_t j1 = j0 + CHUNK < n ? j0 + CHUNK : n;
            float *t = apart || d0 ? NULL : total;
            if (d0 + SPAN_V * VW <= D)
                rows_tiles(s, ls, kv_ptr(values, d0, bf), j0, j1, D, SPAN_V, R, acc + d0, t, bf);
            else /* a tail of dimensions: a vector at a time */
                for (int64_t d = d0; d < D; d += VW) rows_tiles(s, ls, kv_ptr(values, d, bf), j0, j1, D, 1, R, acc + d, d == d0 ? t : NULL, bf);
        }
}

#endif
