/* The skinny kernel on bfloat16 weights: y[M, N] = x[M, K] . W[N, K]^T (+ b[N]), x, b and y float32,
 * every sum accumulated in float32. Half the bytes of skinny_gemm.c's float32 weights per pass.
 *
 * Layout ("blocked bfloat16", kernels/blocked.py's pack of a bfloat16 weight): blocks of 16 output
 * features as in skinny_gemm.c, each block [K / 2][16][2]: one 64-byte line per pair of input
 * features (k even, k + 1) holds the 16 features' weights for both, feature j's pair in 32-bit
 * lane j (k in the low half). K is even.
 *
 * Paths (one per machine: the C step picks the best one compiled here, kernels/c_step.py, and names
 * it in the header; each is row-invariant: an output's sum is one chain over k in a fixed order):
 *   BF16_DOT (avx512_bf16): x rounded to bfloat16 (round to nearest even), then per pair of k
 *     one vdpbf16ps: acc += x[k+1] w[k+1], then acc += x[k] w[k] (each product exact in float32,
 *     each sum rounded once; denormals flushed to zero, as the instruction does). Half the
 *     instructions of the widening path on many rows (a prompt).
 *   BF16_AVX512, BF16_AVX2, BF16_SCALAR (widening load: bf16 -> f32 by a 16-bit shift): x float32,
 *     acc = fma(x[k], w[k], acc) for k = 0..K-1 in order: bit for bit the float32 kernel on the
 *     weights widened to float32, and the same on all three.
 * Each path is compiled where the compiler targets its instruction set (-march=native), so a build
 * on a CPU without avx512_bf16 has no BF16_DOT (skinny_bf16_paths says which are here). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include "linears.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

void skinny_rows(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K);
void skinny_rows_tile(int64_t tile, const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K);

enum { F32 = 0, BF16_SCALAR = 1, BF16_AVX2 = 2, BF16_AVX512 = 3, BF16_DOT = 4 };

#define BW 16  /* output features per block */
#define MBX 12 /* the most rows of any path's register block */
#define KC 64  /* BF16_DOT: input features of x rounded to bfloat16 at a time, per row, on the stack */

/* which paths this build has: bit p for path p */
int skinny_bf16_paths(void) {
    int paths = 1 << BF16_SCALAR;
#if defined(__AVX2__) && defined(__FMA__)
    paths |= 1 << BF16_AVX2;
#endif
#if defined(__AVX512F__)
    paths |= 1 << BF16_AVX512;
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    paths |= 1 << BF16_DOT;
#endif
    return paths;
}

static inline float widen(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static void tile_scalar(const float *x, int64_t K, int64_t mb, const uint16_t *p, float *out, int64_t ys) {
    for (int64_t i = 0; i < mb; i++) {
        float acc[BW] = {0};
        for (int64_t k = 0; k < K; k += 2) {
            const uint16_t *w = p + k * BW;
            for (int j = 0; j < BW; j++) {
                acc[j] = fmaf(x[i * K + k], widen(w[2 * j]), acc[j]);
                acc[j] = fmaf(x[i * K + k + 1], widen(w[2 * j + 1]), acc[j]);
            }
        }
        for (int j = 0; j < BW; j++) out[i * ys + j] = acc[j];
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* mb rows (a constant in each inlined copy, up to 6) against one block */
static inline __attribute__((always_inline)) void tile_avx2(const float *x, int64_t K, const int mb, const uint16_t *p,
                                                            float *out, int64_t ys) {
    __m256 lo[6], hi[6];
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000);
    for (int i = 0; i < 6; i++) { lo[i] = _mm256_setzero_ps(); hi[i] = _mm256_setzero_ps(); }
    for (int64_t k = 0; k < K; k += 2) {
        const uint16_t *w = p + k * BW;
        _mm_prefetch((const char *)(w + 64 * BW), _MM_HINT_T0);
        __m256i a = _mm256_loadu_si256((const __m256i *)w), b = _mm256_loadu_si256((const __m256i *)(w + 16));
        __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), b0 = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
        for (int i = 0; i < 6; i++)
            if (i < mb) {
                __m256 xv = _mm256_broadcast_ss(x + i * K + k);
                lo[i] = _mm256_fmadd_ps(xv, a0, lo[i]);
                hi[i] = _mm256_fmadd_ps(xv, b0, hi[i]);
            }
        __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(a, high)), b1 = _mm256_castsi256_ps(_mm256_and_si256(b, high));
        for (int i = 0; i < 6; i++)
            if (i < mb) {
                __m256 xv = _mm256_broadcast_ss(x + i * K + k + 1);
                lo[i] = _mm256_fmadd_ps(xv, a1, lo[i]);
                hi[i] = _mm256_fmadd_ps(xv, b1, hi[i]);
            }
    }
    for (int i = 0; i < mb; i++) { _mm256_storeu_ps(out + i * ys, lo[i]); _mm256_storeu_ps(out + i * ys + 8, hi[i]); }
}
#endif

#if defined(__AVX512F__)
/* mb rows (up to 12) against gb blocks (up to 2), both constants in each inlined copy */
static inline __attribute__((always_inline)) void tile_avx512(const float *x, int64_t K, const int mb, const int gb,
                                                              const uint16_t *p, float *out, int64_t ys) {
    __m512 acc[2][MBX];
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000);
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < MBX; i++) acc[g][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 2)
        for (int g = 0; g < 2; g++)
            if (g < gb) {
                const uint16_t *w = p + (int64_t)g * K * BW + k * BW;
                _mm_prefetch((const char *)(w + 64 * BW), _MM_HINT_T0);
                __m512i v = _mm512_loadu_si512(w);
                __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), odd = _mm512_castsi512_ps(_mm512_and_si512(v, high));
                for (int i = 0; i < MBX; i++)
                    if (i < mb) {
                        acc[g][i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + k]), even, acc[g][i]);
                        acc[g][i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * K + k + 1]), odd, acc[g][i]);
                    }
            }
    for (int g = 0; g < gb; g++)
        for (int i = 0; i < mb; i++) _mm512_storeu_ps(out + i * ys + g * BW, acc[g][i]);
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* as tile_avx512, by vdpbf16ps on x rounded to bfloat16, KC input features of the mb rows at a time */
static inline __attribute__((always_inline)) void tile_dot(const float *x, int64_t K, const int mb, const int gb,
                                                           const uint16_t *p, float *out, int64_t ys) {
    __m512 acc[2][MBX];
    uint32_t xb[MBX][KC / 2]; /* row i's pairs (x[k] low, x[k + 1] high), rounded */
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < MBX; i++) acc[g][i] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kc = K - k0 < KC ? K - k0 : KC;
        for (int i = 0; i < MBX; i++)
            if (i < mb)
                for (int64_t c = 0; c < kc; c += 32) {
                    int64_t n = kc - c < 32 ? kc - c : 32;
                    __mmask16 m0 = (__mmask16)((1u << (n < 16 ? n : 16)) - 1), m1 = (__mmask16)(n > 16 ? (1u << (n - 16)) - 1 : 0);
                    const float *row = x + i * K + k0 + c;
                    __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, row + 16), _mm512_maskz_loadu_ps(m0, row));
                    _mm512_storeu_si512(xb[i] + c / 2, (__m512i)v);
                }
        for (int64_t q = 0; q < kc / 2; q++)
            for (int g = 0; g < 2; g++)
                if (g < gb) {
                    const uint16_t *w = p + (int64_t)g * K * BW + (k0 + 2 * q) * BW;
                    _mm_prefetch((const char *)(w + 64 * BW), _MM_HINT_T0);
                    __m512bh v = (__m512bh)_mm512_loadu_si512(w);
                    for (int i = 0; i < MBX; i++)
                        if (i < mb) acc[g][i] = _mm512_dpbf16_ps(acc[g][i], v, (__m512bh)_mm512_set1_epi32((int)xb[i][q]));
                }
    }
    for (int g = 0; g < gb; g++)
        for (int i = 0; i < mb; i++) _mm512_storeu_ps(out + i * ys + g * BW, acc[g][i]);
}
#endif

/* every case a copy of a tile with its row count (and, after it, its block count) constant */
#define CASES_1_TO_5(T, ...)                         \
    case 1: T(x, K, 1, __VA_ARGS__ p, out, ys); return; \
    case 2: T(x, K, 2, __VA_ARGS__ p, out, ys); return; \
    case 3: T(x, K, 3, __VA_ARGS__ p, out, ys); return; \
    case 4: T(x, K, 4, __VA_ARGS__ p, out, ys); return; \
    case 5: T(x, K, 5, __VA_ARGS__ p, out, ys); return;
#define CASES_6_TO_12(T, ...)                          \
    case 6: T(x, K, 6, __VA_ARGS__ p, out, ys); return;   \
    case 7: T(x, K, 7, __VA_ARGS__ p, out, ys); return;   \
    case 8: T(x, K, 8, __VA_ARGS__ p, out, ys); return;   \
    case 9: T(x, K, 9, __VA_ARGS__ p, out, ys); return;   \
    case 10: T(x, K, 10, __VA_ARGS__ p, out, ys); return; \
    case 11: T(x, K, 11, __VA_ARGS__ p, out, ys); return; \
    default: T(x, K, 12, __VA_ARGS__ p, out, ys); return;

/* one register block of `path`: mb rows (up to the path's rows) against gb blocks (up to its blocks) */
static void tile_bf16(int64_t path, const float *x, int64_t K, int64_t mb, int64_t gb, const uint16_t *p, float *out, int64_t ys) {
    switch (path) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    case BF16_DOT:
        if (gb == 2) switch (mb) { CASES_1_TO_5(tile_dot, 2,) CASES_6_TO_12(tile_dot, 2,) }
        switch (mb) { CASES_1_TO_5(tile_dot, 1,) CASES_6_TO_12(tile_dot, 1,) }
#endif
#if defined(__AVX512F__)
    case BF16_AVX512:
        if (gb == 2) switch (mb) { CASES_1_TO_5(tile_avx512, 2,) CASES_6_TO_12(tile_avx512, 2,) }
        switch (mb) { CASES_1_TO_5(tile_avx512, 1,) CASES_6_TO_12(tile_avx512, 1,) }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case BF16_AVX2:
        switch (mb) { CASES_1_TO_5(tile_avx2, ) default: tile_avx2(x, K, 6, p, out, ys); return; }
#endif
    default: tile_scalar(x, K, mb, p, out, ys); return;
    }
}

/* the register block of `path`: rows, blocks */
static void register_block(int64_t path, int64_t *mb, int64_t *gb) {
    *mb = path == BF16_DOT || path == BF16_AVX512 ? 12 : path == BF16_AVX2 ? 6 : 4;
    *gb = path == BF16_DOT || path == BF16_AVX512 ? 2 : 1;
}

/* Inside a parallel region (every thread calls it): skinny_rows (skinny_gemm.c) on W blocked bfloat16
 * [ceil(N/16), K, 16] (pairs of k interleaved), by `path` (one of skinny_bf16_paths). */
void skinny_rows_bf16(int64_t path, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K) {
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int64_t MB, GB;
    register_block(path, &MB, &GB);
    int64_t blocks = (N + BW - 1) / BW, groups = (blocks + GB - 1) / GB;
    int64_t first = groups * t / threads, last = groups * (t + 1) / threads;
    float spill[MBX * 2 * BW];
    for (int64_t g = first; g < last; g++) {
        int64_t b0 = g * GB, gb = blocks - b0 < GB ? blocks - b0 : GB, n0 = b0 * BW, width = gb * BW;
        const uint16_t *pg = p + b0 * K * BW;
        for (int64_t m0 = 0; m0 < M; m0 += MB) {
            int64_t mb = M - m0 < MB ? M - m0 : MB;
            if (n0 + width <= N) {
                tile_bf16(path, x + m0 * K, K, mb, gb, pg, y + m0 * N + n0, N);
            } else {
                tile_bf16(path, x + m0 * K, K, mb, gb, pg, spill, width);
                for (int64_t i = 0; i < mb; i++)
                    for (int64_t j = 0; n0 + j < N; j++) y[(m0 + i) * N + n0 + j] = spill[i * width + j];
            }
            if (b)
                for (int64_t i = 0; i < mb; i++)
                    for (int64_t j = n0; j < n0 + width && j < N; j++) y[(m0 + i) * N + j] += b[j];
        }
    }
}

/* The linear the C step runs for its weights' format: F32 (skinny_gemm.c's, by its many-row variant `tile`,
 * skinny_tiles.c: the same bits whichever) or a bfloat16 path (`tile` not read). */
void skinny_rows_as(int64_t format, int64_t tile, const float *x, const void *p, const float *b, float *y, int64_t M, int64_t N,
                    int64_t K) {
    if (format == F32)
        skinny_rows_tile(tile, x, (const float *)p, b, y, M, N, K);
    else
        skinny_rows_bf16(format, x, (const uint16_t *)p, b, y, M, N, K);
}

/* skinny_rows_bf16 on `threads` threads (skinny_gemm.c's skinny_linear); the threads it ran on */
int skinny_linear_bf16(int64_t path, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N,
                       int64_t K, int64_t threads) {
    int ran = 1;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads((int)threads)
    {
        if (omp_get_thread_num() == 0) ran = omp_get_num_threads();
        skinny_rows_bf16(path, x, p, b, y, M, N, K);
    }
    return ran;
}
