/* Attention of a few positions (decoding, verification) split evenly across a team's threads, by the bytes
 * each reads (included by c_step.c after attention.h). A pass of a few positions has few units of attention
 * (SmolLM2: 3 key-value heads for 2 threads, one thread taking two), and at a long context each unit reads
 * its head's keys and values from memory, so the busiest thread sets the time. attention.h's contract fixes
 * every score (a chain over d), every weight (fexp(score - top), top a maximum: any order) and every output
 * (a chain over the slots in order, per dimension), so the work splits where no chain does:
 *   1. scores: each thread a contiguous span of (key-value head, block of 16 slots), every query of the head
 *      over its blocks (their keys read once, by one thread), into a scores buffer the team shares;
 *   (a barrier)
 *   2. outputs: each thread a contiguous span of (key-value head, group of query heads, part of the
 *      dimensions): the group's rows copied from the shared scores and softened (each row whole, as
 *      attend_positions does), then each output chain of its dimensions over all the slots in order (a
 *      group's consecutive parts in one sweep over the values' rows), and
 *      each row's total (a chain over the slots) by each thread that needs it, alike.
 * Every number is the one attend_positions computes, whatever the threads, the spans and the parts. */
#ifndef ATTENTION_SPLIT_H
#define ATTENTION_SPLIT_H
#include <omp.h>

#if defined(ATTENTION_VEC)
#define VW_OR_1 VW /* the dimensions a part holds a multiple of */
#else
#define VW_OR_1 1
#endif

/* The heads a split attention takes: key-value head kv's key blocks (key_blocks) at element kv bstride of blocks,
 * its values [n, D] at element kv vstride of values (both float32, or bfloat16: bf); its query heads kv per .. kv per
 * + per - 1, in groups of qg (<= GROUP); the dimensions in `parts` parts (whole vectors each where D is a multiple
 * of the lanes). */
typedef struct {
    const void *blocks, *values;
    int64_t bstride, vstride, Hkv, per, qg, D, parts;
    float scale;
    int bf;
} Heads;

/* positions 0..P-1 as query head `head` sees them: pos0's q and out moved on by head D */
static inline void at_head(const Position *pos0, int P, int64_t head, int64_t D, Position *pos) {
    for (int p = 0; p < P; p++) pos[p] = (Position){pos0[p].q + head * D, pos0[p].seen, pos0[p].n, pos0[p].out + head * D};
}

/* the contiguous share [*lo, *hi) of `units` units that this thread of the team takes */
static inline void share(int64_t units, int64_t *lo, int64_t *hi) {
    int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    *lo = units * t / T, *hi = units * (t + 1) / T;
}

/* The unit that iteration k < units of a round-robin deal over `threads` threads (schedule(static, 1)) takes:
 * the units in a snake, each round's order reversed after the one before (thread t takes units t, 2 T - 1 - t,
 * 2 T + t, ...; a last round of fewer units reversed over those), so that where a unit costs more than the one
 * before it (a prompt's later positions see more slots) no thread takes the dearer unit of every round. Who
 * computes a unit only: the same bits. */
static inline int64_t snaked(int64_t k, int64_t units, int64_t threads) {
    const int64_t round = k / threads, lane = k % threads, count = units - round * threads < threads ? units - round * threads : threads;
    return round * threads + (round % 2 ? count - 1 - lane : lane);
}

/* the first position of span s of `spans` over m positions, for spans of at most pp positions (spans:
 * ceil(m / pp)): as even as whole pairs allow where pp is even (a score tile takes two positions,
 * attention_tiles.h), so no span of one position beside spans of eight (a 121-row chunk: spans of 6 and 8
 * positions, not fifteen of 8 and one of 1); as even as whole positions allow where pp is odd */
static inline int64_t span_start(int64_t s, int64_t spans, int64_t m, int64_t pp) {
    const int64_t unit = pp % 2 ? 1 : 2, at = unit * ((m + unit - 1) / unit * s / spans);
    return at < m ? at : m;
}

/* step 1: this thread's (kv, block) units' raw scores into shared rows ((kv per + head in kv) P + p) ls */
static void split_scores(const Position *pos0, int P, const Heads *h, int64_t nb, float *shared, int64_t ls) {
    int64_t u0, u1;
    share(h->Hkv * nb, &u0, &u1);
    for (int64_t kv = u0 / nb; kv < h->Hkv && kv * nb < u1; kv++) {
        int64_t b0 = u0 > kv * nb ? u0 - kv * nb : 0, b1 = u1 < (kv + 1) * nb ? u1 - kv * nb : nb;
        for (int64_t c0 = 0; c0 < h->per; c0 += h->qg) {
            int g = (int)(h->per - c0 < h->qg ? h->per - c0 : h->qg);
            Position pos[POSITIONS];
            at_head(pos0, P, kv * h->per + c0, h->D, pos);
            for (int p = 0; p < P; p++) { /* its slots within the span: the blocks' from b0 on */
                int64_t n = pos[p].n - b0 * BLOCK;
                pos[p].n = n < 0 ? 0 : (n > (b1 - b0) * BLOCK ? (b1 - b0) * BLOCK : n);
            }
            scores(pos, P, g, kv_ptr(h->blocks, kv * h->bstride + b0 * BLOCK * h->D, h->bf), b1 - b0, h->D, h->scale,
                   shared + (kv * h->per + c0) * P * ls + b0 * BLOCK, ls, h->bf);
        }
    }
}

/* rows_tiles over NB (a count known here) vectors of dimensions, NB <= SPAN_V */
#if defined(ATTENTION_VEC)
static inline __attribute__((always_inline)) void rows_span(const float *s, int64_t ls, const void *values, int64_t j0, int64_t j1,
                                                            int64_t D, int NB, int R, float *acc, float *total, const int bf) {
    switch (NB) {
    case 1: rows_tiles(s, ls, values, j0, j1, D, 1, R, acc, total, bf); return;
    case 2: if (2 <= SPAN_V) rows_tiles(s, ls, values, j0, j1, D, 2, R, acc, total, bf); return;
    case 3: if (3 <= SPAN_V) rows_tiles(s, ls, values, j0, j1, D, 3, R, acc, total, bf); return;
    default: if (4 <= SPAN_V) rows_tiles(s, ls, values, j0, j1, D, 4, R, acc, total, bf); return;
    }
}
#endif

/* weigh's outputs for the dimensions [d0, d1) alone: out[c D + d] of each position's g rows s[(p g + c) ls + j]
 * (softened) over the slots [0, n) (values [n, D]), by weigh's chains; acc: scratch [P g D] */
static inline __attribute__((always_inline)) void weigh_dims_as(const Position *pos, int P, int g, const float *s, int64_t ls,
                                                                const void *values, int64_t n, int64_t D, int64_t d0, int64_t d1,
                                                                float *acc, const int bf) {
    float total[POSITIONS * GROUP] = {0.0f};
    const int R = P * g;
#if defined(ATTENTION_VEC)
    if (D % VW == 0) { /* d0, d1: whole vectors (split_weigh) */
        const int apart = 2 * R >= VW;
        if (apart) row_totals(s, ls, R, n, total);
        for (int64_t e = 0; e < R * D; e++) acc[e] = 0.0f;
        for (int64_t d = d0; d < d1; d += SPAN_V * VW)
            for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
                int64_t j1 = j0 + CHUNK < n ? j0 + CHUNK : n, nv = (d1 - d) / VW < SPAN_V ? (d1 - d) / VW : SPAN_V;
                rows_span(s, ls, kv_ptr(values, d, bf), j0, j1, D, (int)nv, R, acc + d, apart || d != d0 ? NULL : total, bf);
            }
    } else
#endif
        for (int p = 0; p < P; p++) /* the plain loops: each position's own slots */
            for (int c = 0; c < g; c++) {
                float *o = acc + (p * g + c) * D;
                const float *w = s + (p * g + c) * ls;
                for (int64_t d = d0; d < d1; d++) o[d] = 0.0f;
                for (int64_t j = 0; j < pos[p].n; j++)
                    if (seen_at(pos[p].seen, j)) {
                        total[p * g + c] += w[j];
                        for (int64_t d = d0; d < d1; d++) o[d] = fmaf(w[j], kv_at(values, j * D + d, bf), o[d]);
                    }
            }
    (void)n, (void)R;
    for (int p = 0; p < P; p++)
        for (int c = 0; c < g; c++) {
            float inv = 1.0f / total[p * g + c];
            for (int64_t d = d0; d < d1; d++) pos[p].out[c * D + d] = acc[(p * g + c) * D + d] * inv;
        }
}

/* step 2: this thread's (kv, group, part) units' outputs from the shared scores; s, acc: its own scratch
 * (attend_positions') */
static void split_weigh(const Position *pos0, int P, const Heads *h, int64_t nmax, const float *shared, int64_t ls, float *s,
                        float *acc) {
    const int64_t groups = (h->per + h->qg - 1) / h->qg, unit = h->D % VW_OR_1 == 0 ? VW_OR_1 : 1, nv = h->D / unit;
    int64_t u0, u1, softened = -1;
    share(h->Hkv * groups * h->parts, &u0, &u1);
    for (int64_t u = u0, last; u < u1; u = last + 1) {
        /* this thread's consecutive parts of one group in one sweep (last: its last part here): each value row read
         * whole once, not a part's span of it per sweep (a dimension's chain is its own whichever span holds it) */
        for (last = u; last + 1 < u1 && (last + 1) / h->parts == u / h->parts;) last++;
        int64_t kv = u / (groups * h->parts), c0 = u / h->parts % groups * h->qg, part = u % h->parts, end = last % h->parts;
        int g = (int)(h->per - c0 < h->qg ? h->per - c0 : h->qg);
        Position pos[POSITIONS];
        at_head(pos0, P, kv * h->per + c0, h->D, pos);
        if (softened != u / h->parts) { /* this group's rows, whole: copied (the team reads them), then softened */
            for (int r = 0; r < P * g; r++) {
                memcpy(s + r * ls, shared + ((kv * h->per + c0) * P + r) * ls, (size_t)ls * sizeof(float));
                soften(pos[r / g].seen, pos[r / g].n, s + r * ls, ls);
            }
            softened = u / h->parts;
        }
        const void *values = kv_ptr(h->values, kv * h->vstride, h->bf);
        const int64_t d0 = nv * part / h->parts * unit, d1 = nv * (end + 1) / h->parts * unit;
        if (h->bf)
            weigh_dims_as(pos, P, g, s, ls, values, nmax, h->D, d0, d1, acc, 1);
        else
            weigh_dims_as(pos, P, g, s, ls, values, nmax, h->D, d0, d1, acc, 0);
    }
}

/* Attention of P <= POSITIONS positions (pos0: as query head 0 sees them; every head sees the same slots) for
 * every query head of h, on the calling team's threads (inside a parallel region; every thread calls it),
 * split by bytes: step 1, a barrier, step 2. shared: [Hkv per P, blocks_of(nmax) 16] floats the team shares;
 * s, acc: the thread's own (attend_positions' scratch). Ends without a barrier. */
static void attend_split(const Position *pos0, int P, const Heads *h, float *shared, float *s, float *acc) {
    int64_t nmax = 0;
    for (int p = 0; p < P; p++) nmax = pos0[p].n > nmax ? pos0[p].n : nmax;
    const int64_t nb = blocks_of(nmax), ls = nb * BLOCK;
    split_scores(pos0, P, h, nb, shared, ls);
#pragma omp barrier
    split_weigh(pos0, P, h, nmax, shared, ls, s, acc);
}

/* the parts to split the dimensions in: as many as make the units a multiple of the threads, at most one a
 * vector of dimensions (VW_OR_1) */
static inline int64_t dimension_parts(int64_t units, int64_t threads, int64_t D) {
    int64_t parts = 1, most = D % VW_OR_1 == 0 ? D / VW_OR_1 : D;
    while (parts < most && units * parts % threads) parts++;
    return parts;
}

#endif
