/* y[M, N] = x[M, K] . w[N, K]^T (+ b[N]) in float32 for few rows M (decoding and verification
 * passes: 1..16 positions), reading w, an nn.Linear weight in its own row-major layout, once.
 *
 * A pass over a few positions is bound by reading the weights, not by arithmetic. MKL's small-M
 * path reads them on one core on some CPUs (docs/profile.md: 12 GB/s of 25 on a 2-core EPYC) and
 * slows down past one row. Here the output features are split across the OpenMP threads (each
 * streams its own slice of w once), and each pair of weight rows is multiplied with up to six
 * input rows while it sits in registers, so a pass over 8 positions reads w once, like one over 1.
 *
 * Built at first use by kernels/skinny.py with the machine's own compiler and -march=native.
 * Sums run in a fixed order per output (8 lanes, then a fixed tree), so a result does not depend
 * on the thread count or on M: row m of y is the same whether computed with 1 or 12 rows. */
#include <stddef.h>
#include <stdint.h>
#include <omp.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define MB 6 /* input rows per register block */

#if defined(__AVX2__) && defined(__FMA__)
static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);                 /* lanes i + i+4 */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));        /* + lanes 2,3 */
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x1));  /* + lane 1 */
    return _mm_cvtss_f32(s);
}

/* rows x[0 .. mb) against weight rows w0 and w1 (w1 may equal w0 when w0 is the last row); mb is a
 * constant in each inlined copy (block2), so the accumulators stay in registers */
static inline __attribute__((always_inline)) void block2_rows(const float *x, int64_t K, const int mb, const float *w0,
                                                              const float *w1, float *out0, float *out1, int64_t stride0, int64_t stride1) {
    __m256 a0[MB], a1[MB];
    for (int i = 0; i < MB; i++) { a0[i] = _mm256_setzero_ps(); a1[i] = _mm256_setzero_ps(); }
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        _mm_prefetch((const char *)(w0 + k + 128), _MM_HINT_T0); /* 512 bytes ahead: measured 15% faster at 5 rows */
        _mm_prefetch((const char *)(w1 + k + 128), _MM_HINT_T0);
        __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        for (int i = 0; i < MB; i++) {
            if (i < mb) {
                __m256 xv = _mm256_loadu_ps(x + i * K + k);
                a0[i] = _mm256_fmadd_ps(xv, v0, a0[i]);
                a1[i] = _mm256_fmadd_ps(xv, v1, a1[i]);
            }
        }
    }
    for (int i = 0; i < mb; i++) {
        float s0 = hsum(a0[i]), s1 = hsum(a1[i]);
        for (int64_t j = k; j < K; j++) { s0 += x[i * K + j] * w0[j]; s1 += x[i * K + j] * w1[j]; }
        out0[i * stride0] = s0;
        out1[i * stride1] = s1;
    }
}

static void block2(const float *x, int64_t K, int64_t mb, const float *w0, const float *w1, float *out0, float *out1,
                   int64_t stride0, int64_t stride1) {
    switch (mb) {
    case 1: block2_rows(x, K, 1, w0, w1, out0, out1, stride0, stride1); break;
    case 2: block2_rows(x, K, 2, w0, w1, out0, out1, stride0, stride1); break;
    case 3: block2_rows(x, K, 3, w0, w1, out0, out1, stride0, stride1); break;
    case 4: block2_rows(x, K, 4, w0, w1, out0, out1, stride0, stride1); break;
    case 5: block2_rows(x, K, 5, w0, w1, out0, out1, stride0, stride1); break;
    default: block2_rows(x, K, 6, w0, w1, out0, out1, stride0, stride1); break;
    }
}
#endif

static void scalar_row(const float *x, int64_t K, int64_t mb, const float *w, float *out, int64_t ystride) {
    for (int64_t i = 0; i < mb; i++) {
        float lanes[8] = {0};
        int64_t k = 0;
        for (; k + 8 <= K; k += 8)
            for (int l = 0; l < 8; l++) lanes[l] += x[i * K + k + l] * w[k + l];
        /* the same order as hsum: (i + i+4), then pairs, then the last two */
        float s0 = lanes[0] + lanes[4], s1 = lanes[1] + lanes[5], s2 = lanes[2] + lanes[6], s3 = lanes[3] + lanes[7];
        float s = (s0 + s2) + (s1 + s3);
        for (; k < K; k++) s += x[i * K + k] * w[k];
        out[i * ystride] = s;
    }
}

int skinny_simd(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* x: [M, K] contiguous; w: [N, K] contiguous; b: [N] or NULL; y: [M, N] contiguous. threads: how many
 * to run on, given by the caller (torch's count): whichever OpenMP runtime this library was loaded
 * beside, it never falls back on that runtime's own default. Returns the threads the loop ran on. */
int skinny_linear(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    int64_t pairs = (N + 1) / 2;
    int ran = 1;
    if (threads < 1) threads = 1;
#pragma omp parallel for schedule(static) num_threads((int)threads)
    for (int64_t p = 0; p < pairs; p++) {
        if (p == 0) ran = omp_get_num_threads();
        int64_t n = 2 * p;
        for (int64_t m0 = 0; m0 < M; m0 += MB) {
            int64_t mb = M - m0 < MB ? M - m0 : MB;
            const float *xm = x + m0 * K;
            float *ym = y + m0 * N;
#if defined(__AVX2__) && defined(__FMA__)
            if (n + 1 < N) {
                block2(xm, K, mb, w + n * K, w + (n + 1) * K, ym + n, ym + n + 1, N, N);
            } else {
                float spare[MB];
                block2(xm, K, mb, w + n * K, w + n * K, ym + n, spare, N, 1);
            }
#else
            scalar_row(xm, K, mb, w + n * K, ym + n, N);
            if (n + 1 < N) scalar_row(xm, K, mb, w + (n + 1) * K, ym + n + 1, N);
#endif
        }
        if (b) {
            for (int64_t m = 0; m < M; m++) {
                y[m * N + n] += b[n];
                if (n + 1 < N) y[m * N + n + 1] += b[n + 1];
            }
        }
    }
    return ran;
}
