/* The row-by-row pieces the C steps share (c_step.c: the target's pass; head_step.c: a draft head's
 * step): each computes one row in a fixed order (norms: lanes of 16, then a fixed tree; attention: the
 * serial fused chains of attention.h), so a row's result never depends on the others nor on the thread
 * count, and every build (AVX-512, AVX2, plain C) computes the same bits. Fused multiply-adds only where
 * written (fmaf, _mm512_fmadd_ps: one rounding on every build; the builds pass -ffp-contract=off). */
#ifndef STEP_ROWS_H
#define STEP_ROWS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define SPAN 128 /* columns of an element-wise loop a thread takes at a time */

/* exp(x) for float32, branch-free so that loops over it vectorize: Cephes' expf polynomial on
 * [-ln2/2, ln2/2] (relative error ~1e-7), fused where written (fmaf: one rounding on every build),
 * scaled by 2^n through the exponent bits */
static inline float fexp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = fmaf(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = fmaf(n, 2.12194440e-4f, fmaf(-n, 0.693359375f, x));      /* x - n ln2 in two parts (Cody-Waite) */
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;
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

/* fexp16's reduction and polynomial on a clamped x: e^x = p 2^n (n returned through *n); shared with
 * attention_vec.h's v_exp_soft, which must give fexp16's bits */
static inline __m512 fexp16_poly(__m512 x, __m512 *n_out) {
    const __m512 shift = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift), shift);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    *n_out = n;
    return _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
}

/* fexp on 16 lanes: the same operations in the same order as fexp (fused where it fuses), so the same value in each lane */
static inline __m512 fexp16(__m512 x) {
    __m512 n, p = fexp16_poly(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f)), &n);
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

#endif

#include "attention.h"

#endif
