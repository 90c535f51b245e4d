/* The row-by-row pieces the C steps share (c_step.c: the target's pass; head_step.c: a draft head's
 * step): each computes one row in a fixed order (lanes of 16, then a fixed tree), so a row's result
 * never depends on the others nor on the thread count. */
#ifndef STEP_ROWS_H
#define STEP_ROWS_H
#include <math.h>
#include <stdint.h>

#define LANES 16

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

/* One query head q[D] over the cache slots it may see (seen[j] != 0, j < L) of keys/values
 * [L, D] (one key-value head): softmax(q . k * scale) . v into out[D]; s: scratch [L]. */
static void attend(const float *q, const float *keys, const float *values, const uint8_t *seen, int64_t L,
                   int64_t D, float scale, float *s, float *out) {
    float top = -INFINITY;
    for (int64_t j = 0; j < L; j++) {
        s[j] = seen[j] ? dot(q, keys + j * D, D) * scale : -INFINITY;
        top = s[j] > top ? s[j] : top;
    }
    float total = 0.0f;
    for (int64_t j = 0; j < L; j++) s[j] = seen[j] ? fexp(s[j] - top) : 0.0f;
    for (int64_t j = 0; j < L; j++) total += s[j];
    for (int64_t d = 0; d < D; d++) out[d] = 0.0f;
    for (int64_t j = 0; j < L; j++)
        if (seen[j])
            for (int64_t d = 0; d < D; d++) out[d] += s[j] * values[j * D + d];
    float inv = 1.0f / total;
    for (int64_t d = 0; d < D; d++) out[d] *= inv;
}

#endif
