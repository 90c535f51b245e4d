/* Each logits row's m largest values and their indices, read in one pass over the row (drafters/ngram.py: NASD's
 * filler top-k, every verified position of every step). A row is read as blocks of TOPK_BLOCK values: a block's
 * maximum (a vectorized max) is compared with the m-th largest value kept so far, and only a block that beats it is
 * scanned value by value, each value that beats it inserted in order. On a row of V values about m log(V / m)
 * blocks are scanned, the rest read once: a few microseconds where numpy's partition took a hundred. Exact:
 * comparisons only. The values are torch.topk's (the m largest, descending); among equal values the lower index
 * comes first. A row holding a NaN is answered by the caller's other path (torch's topk treats NaN as the largest). */
#include "logits_top.h" /* block_max: a block's largest value and whether it holds a NaN */

#define TOPK_BLOCK 64

/* insert (v, at) into values/indices [m], descending, where v beats the last kept value (strictly: an equal value
 * found later stays behind the earlier one) */
static void topk_insert(float *values, int64_t *indices, int64_t m, float v, int64_t at) {
    int64_t i = m - 1;
    while (i > 0 && values[i - 1] < v) {
        values[i] = values[i - 1];
        indices[i] = indices[i - 1];
        i--;
    }
    values[i] = v;
    indices[i] = at;
}

/* values [n, m] float32, indices [n, m] int64: each row of logits [n, V] float32's m largest values, descending, and
 * their indices (a slot no finite-or-infinite value filled: -inf and index -1, where the row holds fewer than m values
 * above -inf). Returns 0, or 1 where a row holds a NaN (the outputs then say nothing). */
int64_t row_topk(const float *logits, int64_t n, int64_t V, int64_t m, float *values, int64_t *indices) {
    for (int64_t r = 0; r < n; r++) {
        const float *row = logits + r * V;
        float *vals = values + r * m;
        int64_t *idx = indices + r * m;
        for (int64_t i = 0; i < m; i++) {
            vals[i] = -INFINITY;
            idx[i] = -1;
        }
        int nan = 0;
        for (int64_t a = 0; a < V; a += TOPK_BLOCK) {
            int64_t b = a + TOPK_BLOCK < V ? a + TOPK_BLOCK : V;
            if (!(block_max(row, a, b, &nan) > vals[m - 1])) continue;
            for (int64_t k = a; k < b; k++)
                if (row[k] > vals[m - 1]) topk_insert(vals, idx, m, row[k], k);
        }
        if (nan) return 1;
    }
    return 0;
}
