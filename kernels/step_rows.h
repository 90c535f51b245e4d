/* The row-by-row pieces the C steps share (c_step.c: the target's pass; head_step.c: a draft head's
 * step): each computes one row in a fixed order (lanes of 16, then a fixed tree), so a row's result
 * never depends on the others nor on the thread count. */
#ifndef STEP_ROWS_H
#define STEP_ROWS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define SPAN 128 /* columns of an element-wise loop a thread takes at a time */

/* exp(x) for float32, branch-free so that loops over it vectorize: Cephes' expf polynomial on
 * [-ln2/2, ln2/2] (relative error ~1e-7), scaled by 2^n through the exponent bits */
static inline float fexp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* sum of a[0..n) * b[0..n) in a fixed order: 16 lanes, then a fixed tree */
static inline float dot(const float *a, const float *b, int64_t n) {
    float lane[LANES] = {0};
    int64_t k = 0;
    for (; k + LANES <= n; k += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += a[k + l] * b[k + l];
    for (int l = 0; k < n; k++, l++) lane[l] += a[k] * b[k];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* y = weight * (x / sqrt(mean(x^2) + eps)) for one row of n (transformers' RMSNorm in float32) */
static void rms_norm(const float *x, const float *weight, float eps, float *y, int64_t n) {
    float ms = dot(x, x, n) / (float)n;
    float inv = 1.0f / sqrtf(ms + eps);
    for (int64_t k = 0; k < n; k++) y[k] = weight[k] * (x[k] * inv);
}

/* RoPE on one head vector v[D] in place, rotate-half form, with this position's cos and sin [D] */
static void rotate(float *v, const float *cos, const float *sin, int64_t D) {
    int64_t half = D / 2;
    float rotated[512];
    for (int64_t d = 0; d < half; d++) rotated[d] = -v[d + half];
    for (int64_t d = half; d < D; d++) rotated[d] = v[d - half];
    for (int64_t d = 0; d < D; d++) v[d] = v[d] * cos[d] + rotated[d] * sin[d];
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* lanes of 16 products of q[0..D) and one key (dot's lanes: lane l sums the products d = l mod 16 in
 * order, from 0) */
static inline __attribute__((always_inline)) __m512 key_lanes(const float *q, const float *key, int64_t D) {
    __m512 lane = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + LANES <= D; k += LANES)
        lane = _mm512_add_ps(lane, _mm512_mul_ps(_mm512_loadu_ps(q + k), _mm512_loadu_ps(key + k)));
    if (k < D) {
        __mmask16 tail = (__mmask16)((1u << (D - k)) - 1);
        lane = _mm512_mask_add_ps(lane, tail, lane, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, q + k), _mm512_maskz_loadu_ps(tail, key + k)));
    }
    return lane;
}

/* dot(q, key j) for the 16 keys keys[0..16) (row stride D) into out[0..16): each key's lanes, then
 * dot's tree (lane l += lane l + w, w = 8, 4, 2, 1) done for the 16 keys at once, two keys' lanes
 * side by side in each vector: the same additions on the same values as dot, so the same score. */
static inline __attribute__((always_inline)) void dot16(const float *q, const float *keys, int64_t D, float *out) {
    __m512 v[16], s1[8], s2[4], s3[2];
    /* slot j holds key 4 (j mod 4) + j / 4: the tree leaves key c + 4 m in lane 4 c + m, so this order
     * puts key j in lane j */
    for (int j = 0; j < 16; j++) v[j] = key_lanes(q, keys + (int64_t)(4 * (j % 4) + j / 4) * D, D);
    for (int p = 0; p < 8; p++) /* w = 8: lanes 0-7 of key 2p, then of key 2p + 1 */
        s1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44), _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; p++) /* w = 4: 128-bit chunk c holds lanes 0-3 of slot 4p + c */
        s2[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], 0x88), _mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; p++) /* w = 2: chunk c holds lanes 0-1 of slot 8p + c, then of slot 8p + 4 + c */
        s3[p] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * p], s2[2 * p + 1], 0x44), _mm512_shuffle_ps(s2[2 * p], s2[2 * p + 1], 0xEE));
    /* w = 1: chunk c, lane m: slot c + 4 m */
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88), _mm512_shuffle_ps(s3[0], s3[1], 0xDD)));
}

/* fexp on 16 lanes: the same operations in the same order as fexp, so the same value in each lane */
static inline __m512 fexp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 shift = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), shift), shift);
    __m512 r = _mm512_add_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f))),
                             _mm512_mul_ps(n, _mm512_set1_ps(2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* the 16 bytes seen[0..16) as a lane mask */
static inline __mmask16 seen16(const uint8_t *seen) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)seen));
    return _mm512_test_epi32_mask(b, b);
}

/* out[d0 + 16 c + l] for c < nb: sum over the seen slots j in order of s[j] * values[j][...], kept in
 * registers (nb a constant in each inlined copy) */
static inline __attribute__((always_inline)) void weigh(const float *s, const float *values, const uint8_t *seen,
                                                        int64_t L, int64_t D, int64_t d0, const int nb, float inv, float *out) {
    __m512 acc[4];
    for (int c = 0; c < 4; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; j++)
        if (seen[j]) {
            __m512 w = _mm512_set1_ps(s[j]);
            for (int c = 0; c < 4; c++)
                if (c < nb) acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(w, _mm512_loadu_ps(values + j * D + d0 + 16 * c)));
        }
    for (int c = 0; c < nb; c++) _mm512_storeu_ps(out + d0 + 16 * c, _mm512_mul_ps(acc[c], _mm512_set1_ps(inv)));
}
#endif

/* A query's weights over the slots it may see (seen[j] != 0, j < L) of keys [L, D] (one key-value head)
 * into s[0..L): fexp(score_j - top) with score_j = dot(q, key j) * scale and top their maximum; 0
 * where unseen. Every number by the same operations in the same order on AVX-512 (16 keys at a time)
 * as in the plain loops. */
static void weights(const float *q, const float *keys, const uint8_t *seen, int64_t L, int64_t D, float scale, float *s) {
    int64_t j = 0, vector = 0;
    float top = -INFINITY;
#if defined(__AVX512F__)
    vector = L / 16 * 16;
    __m512 tops = _mm512_set1_ps(-INFINITY);
    for (; j < vector; j += 16) {
        if (D == 64) /* the common head sizes as constants: their lane loops unrolled */
            dot16(q, keys + j * D, 64, s + j);
        else if (D == 128)
            dot16(q, keys + j * D, 128, s + j);
        else
            dot16(q, keys + j * D, D, s + j);
        __m512 v = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), seen16(seen + j), _mm512_loadu_ps(s + j), _mm512_set1_ps(scale));
        _mm512_storeu_ps(s + j, v);
        tops = _mm512_max_ps(tops, v);
    }
    top = _mm512_reduce_max_ps(tops);
#endif
    for (; j < L; j++) {
        s[j] = seen[j] ? dot(q, keys + j * D, D) * scale : -INFINITY;
        top = s[j] > top ? s[j] : top;
    }
    j = 0;
#if defined(__AVX512F__)
    for (; j < vector; j += 16)
        _mm512_storeu_ps(s + j, _mm512_maskz_mov_ps(seen16(seen + j), fexp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(top)))));
#endif
    for (; j < L; j++) s[j] = seen[j] ? fexp(s[j] - top) : 0.0f;
}

/* One query head q[D] over the cache slots it may see (seen[j] != 0, j < L) of keys/values
 * [L, D] (one key-value head): softmax(q . k * scale) . v into out[D]; s: scratch [L].
 * Every number is computed by the same operations in the same order on AVX-512 (16 keys or 16
 * lanes of D at a time) as in the plain loops: each score dot(q, key) * scale, top their maximum,
 * each weight fexp(score - top), total their sum in slot order, out[d] the sum in slot order of
 * weight * value, times 1 / total. */
static void attend(const float *q, const float *keys, const float *values, const uint8_t *seen, int64_t L,
                   int64_t D, float scale, float *s, float *out) {
    weights(q, keys, seen, L, D, scale, s);
    float total = 0.0f;
    for (int64_t j = 0; j < L; j++) total += s[j];
    float inv = 1.0f / total;
#if defined(__AVX512F__)
    if (D % 16 == 0) {
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            switch ((D - d0) / 16) {
            case 1: weigh(s, values, seen, L, D, d0, 1, inv, out); break;
            case 2: weigh(s, values, seen, L, D, d0, 2, inv, out); break;
            case 3: weigh(s, values, seen, L, D, d0, 3, inv, out); break;
            default: weigh(s, values, seen, L, D, d0, 4, inv, out); break;
            }
        }
        return;
    }
#endif
    for (int64_t d = 0; d < D; d++) out[d] = 0.0f;
    for (int64_t j = 0; j < L; j++)
        if (seen[j])
            for (int64_t d = 0; d < D; d++) out[d] += s[j] * values[j * D + d];
    for (int64_t d = 0; d < D; d++) out[d] *= inv;
}

#define GROUP 4 /* the most query heads attend_group takes at once */

/* each query c < G's total: s[c L + j] summed in slot order from +0 (attend's), the G chains interleaved
 * so that their additions overlap (one chain is an add's latency per slot) */
static inline __attribute__((always_inline)) void totals(const float *s, int64_t L, const int G, float *total) {
    float t[GROUP] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t j = 0; j < L; j++)
        for (int c = 0; c < G; c++) t[c] += s[c * L + j];
    for (int c = 0; c < G; c++) total[c] = t[c];
}

#if defined(__AVX512F__)
/* weigh for G queries at once (weights s[c L + j], outputs out + c * os): each query's sums by weigh's
 * operations in its order, the value vectors loaded once for all G; 4 G independent chains */
static inline __attribute__((always_inline)) void weigh_group(const float *s, const float *values, const uint8_t *seen, int64_t L,
                                                              int64_t D, int64_t d0, const int nb, const int G, const float *inv,
                                                              float *out, int64_t os) {
    __m512 acc[GROUP][4], v[4];
    for (int c = 0; c < G; c++)
        for (int b = 0; b < 4; b++) acc[c][b] = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; j++)
        if (seen[j]) {
            for (int b = 0; b < 4; b++)
                if (b < nb) v[b] = _mm512_loadu_ps(values + j * D + d0 + 16 * b);
            for (int c = 0; c < G; c++) {
                __m512 w = _mm512_set1_ps(s[c * L + j]);
                for (int b = 0; b < 4; b++)
                    if (b < nb) acc[c][b] = _mm512_add_ps(acc[c][b], _mm512_mul_ps(w, v[b]));
            }
        }
    for (int c = 0; c < G; c++)
        for (int b = 0; b < nb; b++) _mm512_storeu_ps(out + c * os + d0 + 16 * b, _mm512_mul_ps(acc[c][b], _mm512_set1_ps(inv[c])));
}

/* weigh_group with G a constant in each copy */
static inline __attribute__((always_inline)) void weigh_groups(const float *s, const float *values, const uint8_t *seen, int64_t L,
                                                               int64_t D, const int G, const float *inv, float *out, int64_t os) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        switch ((D - d0) / 16) {
        case 1: weigh_group(s, values, seen, L, D, d0, 1, G, inv, out, os); break;
        case 2: weigh_group(s, values, seen, L, D, d0, 2, G, inv, out, os); break;
        case 3: weigh_group(s, values, seen, L, D, d0, 3, G, inv, out, os); break;
        default: weigh_group(s, values, seen, L, D, d0, 4, G, inv, out, os); break;
        }
    }
}
#endif

/* attend for the g <= GROUP query heads q + c * qs (c < g) of one key-value head over the same slots,
 * into out + c * os; s: scratch [g L]. Each query's numbers are attend's, bit for bit: its weights by
 * weights(), its total and its weighted sums by attend's operations in attend's order; only the g
 * queries' independent chains are interleaved (totals, weigh_group), to fill the pipeline. */
static inline void attend_group(const float *q, int64_t qs, int g, const float *keys, const float *values, const uint8_t *seen,
                         int64_t L, int64_t D, float scale, float *s, float *out, int64_t os) {
    if (g <= 1) {
        attend(q, keys, values, seen, L, D, scale, s, out);
        return;
    }
    float total[GROUP], inv[GROUP];
    for (int c = 0; c < g; c++) weights(q + c * qs, keys, seen, L, D, scale, s + c * L);
    switch (g) {
    case 2: totals(s, L, 2, total); break;
    case 3: totals(s, L, 3, total); break;
    default: totals(s, L, 4, total); break;
    }
    for (int c = 0; c < g; c++) inv[c] = 1.0f / total[c];
#if defined(__AVX512F__)
    if (D % 16 == 0) {
        switch (g) {
        case 2: weigh_groups(s, values, seen, L, D, 2, inv, out, os); break;
        case 3: weigh_groups(s, values, seen, L, D, 3, inv, out, os); break;
        default: weigh_groups(s, values, seen, L, D, 4, inv, out, os); break;
        }
        return;
    }
#endif
    for (int c = 0; c < g; c++) {
        float *o = out + c * os;
        const float *w = s + c * L;
        for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < L; j++)
            if (seen[j])
                for (int64_t d = 0; d < D; d++) o[d] += w[j] * values[j * D + d];
        for (int64_t d = 0; d < D; d++) o[d] *= inv[c];
    }
}

#endif
