/* A logits row's greedy token as torch.argmax gives it, read where the row was written (c_step.c, Dims.tops), so
 * that a caller choosing greedily (utils/logits_processor.py's GreedyProcessor.choose) reads three numbers, not
 * the [V] row: `at` the first index of the largest value, or of the first NaN where there is one (torch.argmax's
 * answer: NaN is the largest, ties go to the lowest index); `top` row[at]; `others` the largest of the row's other
 * values (-inf where V is 1; NaN where the row holds a NaN besides `at`'s). Exact: maxima and comparisons only,
 * in any order the same numbers. */
#ifndef LOGITS_TOP_H
#define LOGITS_TOP_H

#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t at;
    float top, others;
} Top;

#define TOP_BLOCK 256 /* values a block's maximum covers: the first block holding the largest is scanned alone */

/* the largest of row[a..b) without NaNs (-inf where none), and whether it holds a NaN */
static float block_max(const float *row, int64_t a, int64_t b, int *nan) {
    float m = -INFINITY;
    int found = 0;
#pragma omp simd reduction(max : m) reduction(| : found)
    for (int64_t k = a; k < b; k++) {
        float v = row[k];
        found |= v != v;
        m = v > m ? v : m;
    }
    *nan |= found;
    return m;
}

static Top logits_top_row(const float *row, int64_t V) {
    Top t = {0, -INFINITY, -INFINITY};
    int nan = 0;
    if (V <= 0) return t;
    float m = block_max(row, 0, V, &nan);
    if (nan) { /* rare: the first NaN is the answer, and it stands clear of nothing (others NaN) */
        for (int64_t k = 0; k < V; k++)
            if (row[k] != row[k]) {
                t.at = k;
                break;
            }
        t.top = row[t.at];
        t.others = NAN;
        return t;
    }
    int64_t a = 0; /* the first block holding m, then its first index holding it */
    while (a + TOP_BLOCK < V && block_max(row, a, a + TOP_BLOCK, &nan) < m) a += TOP_BLOCK;
    while (row[a] < m) a++;
    t.at = a;
    t.top = m;
    float before = block_max(row, 0, a, &nan), after = block_max(row, a + 1, V, &nan);
    t.others = before > after ? before : after;
    return t;
}

#endif
