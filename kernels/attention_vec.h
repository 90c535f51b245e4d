/* The vectors attention.h's tiles compute on (included by attention.h): VW lanes of float32, AVX-512 (16) or
 * AVX2 with FMA (8), each operation one IEEE operation per lane (fused multiply-add where written: one
 * rounding, as fmaf), so a lane computes what the plain loops compute for its slot or dimension. Neither:
 * ATTENTION_VEC undefined, attention.h's plain loops alone. kv_load and kv_store move the cache's elements,
 * float32 (bf 0) or bfloat16 (bf 1: widened on load, its 16 bits a float's upper half, exact; a widened one's
 * upper half stored back, exact), bf a constant in each inlined copy. */
#ifndef ATTENTION_VEC_H
#define ATTENTION_VEC_H

#if defined(__AVX512F__)
#define ATTENTION_VEC 1
#define VW 16
typedef __m512 vec;
typedef __mmask16 vmask; /* a lane seen where its bit is set */
#define v_zero _mm512_setzero_ps
#define v_load _mm512_loadu_ps
#define v_store _mm512_storeu_ps
#define v_set1 _mm512_set1_ps
#define v_fma _mm512_fmadd_ps
#define v_mul _mm512_mul_ps
#define v_add _mm512_add_ps
#define v_sub _mm512_sub_ps
#define v_max _mm512_max_ps
#define v_exp fexp16
#define v_first _mm512_cvtss_f32

/* VW keys or values at element i of p: float32, or bfloat16 widened */
static inline __attribute__((always_inline)) vec kv_load(const void *p, int64_t i, const int bf) {
    if (!bf) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* x at element i of p: float32, or (x widened from bfloat16) each lane's upper 16 bits */
static inline __attribute__((always_inline)) void kv_store(void *p, int64_t i, vec x, const int bf) {
    if (bf)
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
    else
        _mm512_storeu_ps((float *)p + i, x);
}

/* fexp16 for x <= 0 (or NaN), soften's s_j - top: the same bits, fewer operations. The upper clamp (88) is
 * a no-op there, and scalef rounds p * 2^n once, as fexp16's multiply by 2^n's exponent bits does (n an
 * integer in [-126, 0]: 2^n a normal float); checked equal over every float from -0 down to -inf. */
static inline __m512 v_exp_soft(__m512 x) {
    __m512 n, p = fexp16_poly(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), &n);
    return _mm512_scalef_ps(p, n);
}

/* seen[j..j+16) as a lane mask (seen NULL: all seen), the lanes from slot L on unset (and their bytes unread) */
static inline vmask seen_v(const uint8_t *seen, int64_t j, int64_t L) {
    if (!seen) return (vmask)(L - j >= 16 ? 0xFFFFu : (1u << (L - j)) - 1u);
    if (j + 16 <= L) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(seen + j)));
        return _mm512_test_epi32_mask(b, b);
    }
    unsigned m = 0;
    for (int64_t l = 0; j + l < L; l++) m |= (unsigned)(seen[j + l] != 0) << l;
    return (vmask)m;
}
static inline int v_any(vmask m) { return m != 0; }
/* x where seen, +0 elsewhere */
static inline vec v_masked(vmask m, vec x) { return _mm512_maskz_mov_ps(m, x); }
/* tops, raised to x in the lanes seen */
static inline vec v_top(vec tops, vmask m, vec x) { return _mm512_max_ps(tops, _mm512_mask_mov_ps(tops, m, x)); }
static inline float v_reduce_max(vec x) { return _mm512_reduce_max_ps(x); }

/* r[0..16) as the rows of a 16 x 16 matrix, transposed in place (moves only) */
static inline __attribute__((always_inline)) void transpose_v(vec r[16]) {
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

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATTENTION_VEC 1
#define VW 8
typedef __m256 vec;
typedef __m256 vmask; /* a lane seen where all its bits are set, unseen where none */
#define v_zero _mm256_setzero_ps
#define v_load _mm256_loadu_ps
#define v_store _mm256_storeu_ps
#define v_set1 _mm256_set1_ps
#define v_fma _mm256_fmadd_ps
#define v_mul _mm256_mul_ps
#define v_add _mm256_add_ps
#define v_sub _mm256_sub_ps
#define v_max _mm256_max_ps
#define v_first _mm256_cvtss_f32

/* VW keys or values at element i of p: float32, or bfloat16 widened */
static inline __attribute__((always_inline)) vec kv_load(const void *p, int64_t i, const int bf) {
    if (!bf) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* x at element i of p: float32, or (x widened from bfloat16) each lane's upper 16 bits (packed within 128-bit
 * halves, then the halves' low quarters joined) */
static inline __attribute__((always_inline)) void kv_store(void *p, int64_t i, vec x, const int bf) {
    if (!bf) {
        _mm256_storeu_ps((float *)p + i, x);
        return;
    }
    __m256i u = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0x08);
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_castsi256_si128(packed));
}

/* fexp on 8 lanes: fexp16's operations (fexp's, in its order), so the same value in each lane */
static inline __m256 v_exp(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift), shift);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#define v_exp_soft v_exp /* soften's (x <= 0): the same operations here */

/* seen[j..j+8) as a lane mask (seen NULL: all seen), the lanes from slot L on unset (and their bytes unread) */
static inline vmask seen_v(const uint8_t *seen, int64_t j, int64_t L) {
    if (!seen) /* lane l seen where l < L - j */
        return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(L - j < 8 ? L - j : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    uint8_t own[8] = {0};
    const uint8_t *from = seen + j;
    if (j + 8 > L) { /* a tail: its bytes copied, the rest 0 */
        for (int64_t l = 0; j + l < L; l++) own[l] = seen[j + l];
        from = own;
    }
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)from));
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cmpeq_epi32(b, _mm256_setzero_si256()), _mm256_set1_epi32(-1)));
}
static inline int v_any(vmask m) { return _mm256_movemask_ps(m) != 0; }
static inline vec v_masked(vmask m, vec x) { return _mm256_and_ps(m, x); }
static inline vec v_top(vec tops, vmask m, vec x) { return _mm256_max_ps(tops, _mm256_blendv_ps(tops, x, m)); }
static inline float v_reduce_max(vec x) { /* a maximum: exact, whatever the order */
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* r[0..8) as the rows of an 8 x 8 matrix, transposed in place (moves only) */
static inline __attribute__((always_inline)) void transpose_v(vec r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) { /* each 128-bit lane: rows i, i + 1 interleaved */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* u[i + c]: rows i..i+3 of column c (low lane), 4 + c (high) */
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}
#endif

#endif
