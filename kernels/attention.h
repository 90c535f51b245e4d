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
 * A chain is the same whatever computes it, so vector code takes keys as its lanes: the keys are first
 * transposed in blocks of 16 slots (key_blocks: kt[b][d][l] = key 16 b + l, dimension d), and a register
 * tile of several queries x several key blocks broadcasts q[d] and shares each key load; several positions'
 * queries take each block of keys and each chunk of values while it is in L1 (attend_positions). An unseen slot
 * inside a block or a tile is computed and then masked: its weight is 0, and a 0 weight adds an exact 0
 * to a chain that started at +0 (so it never holds -0), bit for bit as if the slot were skipped (the
 * values being finite). */
#ifndef ATTENTION_H
#define ATTENTION_H

#define BLOCK 16 /* slots in a transposed key block */
#define GROUP 4  /* the most query heads of a position attend_positions takes at once */

/* blocks of BLOCK slots that hold L slots */
static inline int64_t blocks_of(int64_t L) { return (L + BLOCK - 1) / BLOCK; }

#if defined(__AVX512F__)
/* r[0..16) as the rows of a 16 x 16 matrix, transposed in place */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) { /* each 128-bit lane: rows i, i + 1 interleaved */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* lane k of u[i + c]: rows i..i+3 of column 4 k + c */
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) { /* column 4 k + c: lane k of u[c], u[4 + c], u[8 + c], u[12 + c] */
        __m512 x = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), y = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 x2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), y2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(x, x2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(x, x2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(y, y2, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(y, y2, 0xDD);
    }
}
#endif

/* The keys [L, D] (row stride D) of blocks [b0, b1) transposed into kt: kt[(b D + d) 16 + l] = keys[16 b + l][d];
 * lanes past slot L - 1 are 0. Moves only: no rounding. */
static void key_blocks(const float *keys, int64_t L, int64_t D, int64_t b0, int64_t b1, float *kt) {
    for (int64_t b = b0; b < b1; b++) {
        float *o = kt + b * D * BLOCK;
        const float *k = keys + b * BLOCK * D;
        int64_t n = L - b * BLOCK < BLOCK ? L - b * BLOCK : BLOCK, d0 = 0;
#if defined(__AVX512F__)
        if (n == BLOCK)
            for (; d0 + 16 <= D; d0 += 16) {
                __m512 r[16];
                for (int l = 0; l < 16; l++) r[l] = _mm512_loadu_ps(k + l * D + d0);
                transpose16(r);
                for (int d = 0; d < 16; d++) _mm512_storeu_ps(o + (d0 + d) * BLOCK, r[d]);
            }
#endif
        for (int64_t l = 0; l < BLOCK; l++)
            for (int64_t d = d0; d < D; d++) o[d * BLOCK + l] = l < n ? k[l * D + d] : 0.0f;
    }
}

#if defined(__AVX512F__)
/* raw scores (chain * scale) of G queries q + c qs over KB blocks of kt into s + c ls (KB 16 slots each);
 * G x KB chains in flight, each block loaded once for the G queries */
static inline __attribute__((always_inline)) void score_tile(const float *q, int64_t qs, const int G, const int KB, const float *kt,
                                                             int64_t D, float scale, float *s, int64_t ls) {
    __m512 acc[GROUP][8], k[8];
    for (int c = 0; c < G; c++)
        for (int b = 0; b < KB; b++) acc[c][b] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        for (int b = 0; b < KB; b++) {
            k[b] = _mm512_loadu_ps(kt + (b * D + d) * BLOCK);
            __asm__("" : "+v"(k[b])); /* kept in a register: one load for the G queries, not one each */
        }
        for (int c = 0; c < G; c++) {
            __m512 x = _mm512_set1_ps(q[c * qs + d]);
            for (int b = 0; b < KB; b++) acc[c][b] = _mm512_fmadd_ps(x, k[b], acc[c][b]);
        }
    }
    for (int c = 0; c < G; c++)
        for (int b = 0; b < KB; b++) _mm512_storeu_ps(s + c * ls + b * BLOCK, _mm512_mul_ps(acc[c][b], _mm512_set1_ps(scale)));
}
#endif

#if defined(__AVX512F__)
/* seen[j..j+16) as a lane mask, the lanes from slot L on unset (and their bytes unread) */
static inline __mmask16 seen_at(const uint8_t *seen, int64_t j, int64_t L) {
    if (j + 16 <= L) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(seen + j)));
        return _mm512_test_epi32_mask(b, b);
    }
    unsigned m = 0;
    for (int64_t l = 0; j + l < L; l++) m |= (unsigned)(seen[j + l] != 0) << l;
    return (__mmask16)m;
}
#endif

/* a query's raw scores s[0..L) into its weights, in place: fexp(s_j - top) where seen[j], top the seen
 * scores' maximum; 0 where unseen (fexp16 is fexp on 16 lanes) */
static void soften(const uint8_t *seen, int64_t L, float *s) {
    float top = -INFINITY;
#if defined(__AVX512F__)
    /* every slot on 16 lanes (the scores' row holds whole blocks, so a tail's lanes are in it) */
    const int64_t blocks = blocks_of(L);
    __mmask16 m[blocks > 0 ? blocks : 1];
    __m512 tops = _mm512_set1_ps(-INFINITY);
    for (int64_t b = 0; b < blocks; b++) {
        m[b] = seen_at(seen, b * 16, L);
        tops = _mm512_max_ps(tops, _mm512_mask_mov_ps(tops, m[b], _mm512_loadu_ps(s + b * 16)));
    }
    top = _mm512_reduce_max_ps(tops);
    for (int64_t b = 0; b < blocks; b++) {
        __m512 e = m[b] ? _mm512_maskz_mov_ps(m[b], fexp16(_mm512_sub_ps(_mm512_loadu_ps(s + b * 16), _mm512_set1_ps(top))))
                        : _mm512_setzero_ps(); /* a block all unseen: its zeros */
        _mm512_mask_storeu_ps(s + b * 16, b * 16 + 16 <= L ? (__mmask16)0xFFFF : (__mmask16)((1u << (L - b * 16)) - 1), e);
    }
#else
    for (int64_t j = 0; j < L; j++) top = seen[j] && s[j] > top ? s[j] : top;
    for (int64_t j = 0; j < L; j++) s[j] = seen[j] ? fexp(s[j] - top) : 0.0f;
#endif
}

#define POSITIONS 8 /* the most positions attend_positions takes at once */
#define CHUNK 64     /* slots weighed for all the positions at a time (their values stay in L1) */

/* A position's part in attend_positions: its g query heads q[c D + d], the slots [0, n) of the range it
 * may see (seen[j] != 0), its outputs out[c D + d]. */
typedef struct {
    const float *q;
    const uint8_t *seen;
    int64_t n;
    float *out;
} Position;

#if defined(__AVX512F__)
/* raw scores of every position's G queries over the blocks of its range, KB blocks at a time for all the
 * positions (those blocks stay in L1): G x KB accumulators, KB as many as the registers hold (G a constant
 * in each copy) */
static inline __attribute__((always_inline)) void score_tiles(const Position *pos, int P, const int G, const float *kt, int64_t nb,
                                                              int64_t D, float scale, float *s, int64_t ls) {
    const int KB = G <= 2 ? 8 : (G == 3 ? 6 : 5);
    for (int64_t b = 0; b < nb; b += KB)
        for (int p = 0; p < P; p++) {
            int64_t left = blocks_of(pos[p].n) - b;
            const float *k = kt + b * D * BLOCK;
            float *o = s + p * G * ls + b * BLOCK;
            switch (left < KB ? left : KB) {
            case 1: score_tile(pos[p].q, D, G, 1, k, D, scale, o, ls); break;
            case 2: score_tile(pos[p].q, D, G, 2, k, D, scale, o, ls); break;
            case 3: score_tile(pos[p].q, D, G, 3, k, D, scale, o, ls); break;
            case 4: score_tile(pos[p].q, D, G, 4, k, D, scale, o, ls); break;
            case 5: score_tile(pos[p].q, D, G, 5, k, D, scale, o, ls); break;
            case 6: score_tile(pos[p].q, D, G, 6, k, D, scale, o, ls); break;
            case 7: score_tile(pos[p].q, D, G, 7, k, D, scale, o, ls); break;
            case 8: score_tile(pos[p].q, D, G, 8, k, D, scale, o, ls); break;
            default: break;
            }
        }
}

/* acc[c D + 16 b + lane] (c < G, b < nb) carried on by the fmadd chains over the seen slots [j0, j1) in
 * order of s[c ls + j] * values[j][16 b + lane], and total[c] (where not NULL) by the adds of s[c ls + j]:
 * each value vector loaded once for the G queries */
static inline __attribute__((always_inline)) void weigh_tile(const float *s, int64_t ls, const float *values, const uint8_t *seen,
                                                             int64_t j0, int64_t j1, int64_t D, const int nb, const int G, float *acc,
                                                             float *total) {
    __m512 a[GROUP][4], v[4];
    float t[GROUP];
    for (int c = 0; c < G; c++) {
        t[c] = total ? total[c] : 0.0f;
        for (int b = 0; b < nb; b++) a[c][b] = _mm512_loadu_ps(acc + c * D + 16 * b);
    }
    for (int64_t j = j0; j < j1; j++)
        if (seen[j]) {
            if (total) /* the totals' scalar chains, their adds' latency hidden under the tile's FMAs */
                for (int c = 0; c < G; c++) t[c] += s[c * ls + j];
            for (int b = 0; b < nb; b++) {
                v[b] = _mm512_loadu_ps(values + j * D + 16 * b);
                __asm__("" : "+v"(v[b])); /* kept in a register: one load for the G queries */
            }
            for (int c = 0; c < G; c++) {
                __m512 w = _mm512_set1_ps(s[c * ls + j]);
                for (int b = 0; b < nb; b++) a[c][b] = _mm512_fmadd_ps(w, v[b], a[c][b]);
            }
        }
    for (int c = 0; c < G; c++) {
        if (total) total[c] = t[c];
        for (int b = 0; b < nb; b++) _mm512_storeu_ps(acc + c * D + 16 * b, a[c][b]);
    }
}

/* weigh_tile for every position over the slots [j0, j1) of its range, dimensions d0.. (nb 16-lane blocks);
 * the totals with the first span of dimensions */
static inline __attribute__((always_inline)) void weigh_chunk(const Position *pos, int P, const float *s, int64_t ls, const float *values,
                                                              int64_t j0, int64_t j1, int64_t D, int64_t d0, const int nb, const int G,
                                                              float *acc, float *total) {
    for (int p = 0; p < P; p++)
        if (j0 < pos[p].n)
            weigh_tile(s + p * G * ls, ls, values + d0, pos[p].seen, j0, j1 < pos[p].n ? j1 : pos[p].n, D, nb, G, acc + p * G * D + d0,
                       d0 == 0 ? total + p * G : NULL);
}

/* weigh_chunk over the chunks of slots and the spans of 64 dimensions (G a constant in each copy; D a multiple of 16) */
static inline __attribute__((always_inline)) void weigh_tiles(const Position *pos, int P, const float *s, int64_t ls, const float *values,
                                                              int64_t n, int64_t D, const int G, float *acc, float *total) {
    for (int64_t d0 = 0; d0 < D; d0 += 64)
        for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
            int64_t j1 = j0 + CHUNK < n ? j0 + CHUNK : n;
            switch ((D - d0) / 16) {
            case 1: weigh_chunk(pos, P, s, ls, values, j0, j1, D, d0, 1, G, acc, total); break;
            case 2: weigh_chunk(pos, P, s, ls, values, j0, j1, D, d0, 2, G, acc, total); break;
            case 3: weigh_chunk(pos, P, s, ls, values, j0, j1, D, d0, 3, G, acc, total); break;
            default: weigh_chunk(pos, P, s, ls, values, j0, j1, D, d0, 4, G, acc, total); break;
            }
        }
}
#endif

/* raw scores of each position p's g <= GROUP queries over the blocks of its range: s[(p g + c) ls + j] =
 * chain(q_c, key j) * scale */
static void scores(const Position *pos, int P, int g, const float *kt, int64_t nb, int64_t D, float scale, float *s, int64_t ls) {
#if defined(__AVX512F__)
    switch (g) {
    case 1: score_tiles(pos, P, 1, kt, nb, D, scale, s, ls); return;
    case 2: score_tiles(pos, P, 2, kt, nb, D, scale, s, ls); return;
    case 3: score_tiles(pos, P, 3, kt, nb, D, scale, s, ls); return;
    default: score_tiles(pos, P, 4, kt, nb, D, scale, s, ls); return;
    }
#else
    (void)nb;
    for (int p = 0; p < P; p++)
        for (int64_t b = 0; b < blocks_of(pos[p].n); b++) /* lanes l: independent chains (vectorized where the build allows) */
            for (int c = 0; c < g; c++) {
                float acc[BLOCK] = {0.0f};
                for (int64_t d = 0; d < D; d++) {
                    float x = pos[p].q[c * D + d];
                    const float *k = kt + (b * D + d) * BLOCK;
                    for (int l = 0; l < BLOCK; l++) acc[l] = fmaf(x, k[l], acc[l]);
                }
                for (int l = 0; l < BLOCK; l++) s[(p * g + c) * ls + b * BLOCK + l] = acc[l] * scale;
            }
#endif
}

/* each position's outputs from its weights s[(p g + c) ls + j]: out[c D + d] = fmaf chain over the seen slots
 * in order of weight_j * values[j][d], from 0, times 1 / total, total the seen weights' sum in slot order
 * from +0; acc: scratch [P g D] */
static void weigh(const Position *pos, int P, int g, const float *s, int64_t ls, const float *values, int64_t n, int64_t D, float *acc) {
    float total[POSITIONS * GROUP] = {0.0f};
    for (int64_t e = 0; e < P * g * D; e++) acc[e] = 0.0f;
#if defined(__AVX512F__)
    if (D % 16 == 0) {
        switch (g) {
        case 1: weigh_tiles(pos, P, s, ls, values, n, D, 1, acc, total); break;
        case 2: weigh_tiles(pos, P, s, ls, values, n, D, 2, acc, total); break;
        case 3: weigh_tiles(pos, P, s, ls, values, n, D, 3, acc, total); break;
        default: weigh_tiles(pos, P, s, ls, values, n, D, 4, acc, total); break;
        }
    } else
#endif
        for (int p = 0; p < P; p++)
            for (int c = 0; c < g; c++) {
                float *o = acc + (p * g + c) * D;
                const float *w = s + (p * g + c) * ls;
                for (int64_t j = 0; j < pos[p].n; j++)
                    if (pos[p].seen[j]) {
                        total[p * g + c] += w[j];
                        for (int64_t d = 0; d < D; d++) o[d] = fmaf(w[j], values[j * D + d], o[d]);
                    }
            }
    for (int p = 0; p < P; p++)
        for (int c = 0; c < g; c++) {
            float inv = 1.0f / total[p * g + c];
            for (int64_t d = 0; d < D; d++) pos[p].out[c * D + d] = acc[(p * g + c) * D + d] * inv;
        }
}

/* Attention for P <= POSITIONS positions' g <= GROUP query heads each, of one key-value head, over one range
 * of slots: kt those slots' keys in blocks (key_blocks), values [n, D] theirs (n: the positions' largest).
 * s: scratch [P g blocks_of(n) 16]; acc: scratch [P g D]. Each query's numbers are the contract's (above),
 * whatever P and g: the queries only share loads (a block of keys, a chunk of values stays in L1 for all of
 * them) and interleave independent chains. */
static void attend_positions(const Position *pos, int P, int g, const float *kt, const float *values, int64_t D, float scale,
                             float *s, float *acc) {
    int64_t n = 0;
    for (int p = 0; p < P; p++) n = pos[p].n > n ? pos[p].n : n;
    const int64_t nb = blocks_of(n), ls = nb * BLOCK;
    scores(pos, P, g, kt, nb, D, scale, s, ls);
    for (int p = 0; p < P; p++)
        for (int c = 0; c < g; c++) soften(pos[p].seen, pos[p].n, s + (p * g + c) * ls);
    weigh(pos, P, g, s, ls, values, n, D, acc);
}

/* attend_positions for one position's g heads q [g, D] over seen [L] into out [g, D] */
static inline void attend_group(const float *q, int g, const float *kt, const float *values, const uint8_t *seen, int64_t L, int64_t D,
                         float scale, float *s, float *acc, float *out) {
    Position one = {q, seen, L, out};
    attend_positions(&one, 1, g, kt, values, D, scale, s, acc);
}

#endif
