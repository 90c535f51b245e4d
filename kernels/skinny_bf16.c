/* The skinny kernel's tiles on bfloat16 weights: y[M, N] = x[M, K] . W[N, K]^T (+ b[N]), x, b and y
 * float32, every sum accumulated in float32. Half the bytes of skinny_gemm.c's float32 weights per pass.
 * The row loops (decoding's, and a prompt's many-row variants) are skinny_bf16_rows.c's.
 *
 * Layout ("blocked bfloat16", kernels/blocked.py's pack of a bfloat16 weight): blocks of 16 output
 * features as in skinny_gemm.c, each block [K / 2][16][2]: one 64-byte line per pair of input
 * features (k even, k + 1) holds the 16 features' weights for both, feature j's pair in 32-bit
 * lane j (k in the low half). K is even.
 *
 * Paths (one per machine: the C step picks the best one compiled here, kernels/c_step.py, and names
 * it in the header; each is row-invariant: an output's sum is one chain over k in a fixed order,
 * whatever the tile, its rows, its blocks or its k-panels):
 *   BF16_DOT (avx512_bf16): x rounded to bfloat16 (round to nearest even, vcvtne2ps2bf16), then per
 *     pair of k one vdpbf16ps: acc += x[k+1] w[k+1], then acc += x[k] w[k] (each product exact in
 *     float32, each sum rounded once; denormals flushed to zero, as the instruction does), from +0,
 *     pairs in order. Half the instructions of the widening path.
 *   BF16_AVX512, BF16_AVX2, BF16_SCALAR (widening load: bf16 -> f32 by a 16-bit shift): x float32,
 *     acc = fma(x[k], w[k], acc) for k = 0..K-1 in order from +0: bit for bit the float32 kernel on
 *     the weights widened to float32, and the same on all three.
 * A tile over a k-panel stores its sums in out and the next panel loads them back: a float32 store
 * and load change no bit, so the chain is the same one. Each path is compiled where the compiler
 * targets its instruction set (-march=native), so a build on a CPU without avx512_bf16 has no
 * BF16_DOT (skinny_bf16_paths says which are here). */
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include "bf16_tiles.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include "bf16_dot.h" /* its tile and rounding, shared with the many-row loop (skinny_bf16_dot.c) */
#endif

#define GMAX 4 /* the most blocks of any tile (a many-row shape) */
#define KC 128 /* BF16_DOT: input features of x rounded to bfloat16 at a time, per row, on the stack */

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
    if (amx_state() == 0) paths |= 1 << BF16_AMX; /* compiled, on this CPU, and granted by the OS (skinny_amx.c) */
    return paths;
}

static inline float widen(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static void tile_scalar(const float *x, int64_t K, int64_t k0, int64_t k1, int64_t mb, int64_t gb, const uint16_t *p,
                        float *out, int64_t ys, int load) {
    for (int64_t g = 0; g < gb; g++)
        for (int64_t i = 0; i < mb; i++) {
            float acc[BW];
            for (int j = 0; j < BW; j++) acc[j] = load ? out[i * ys + g * BW + j] : 0.0f;
            for (int64_t k = k0; k < k1; k += 2) {
                const uint16_t *w = p + g * K * BW + k * BW;
                for (int j = 0; j < BW; j++) {
                    acc[j] = fmaf(x[i * K + k], widen(w[2 * j]), acc[j]);
                    acc[j] = fmaf(x[i * K + k + 1], widen(w[2 * j + 1]), acc[j]);
                }
            }
            for (int j = 0; j < BW; j++) out[i * ys + g * BW + j] = acc[j];
        }
}

#if defined(__AVX2__) && defined(__FMA__)
/* MBC rows (up to 6) against one block, a constant in each inlined copy */
static inline __attribute__((always_inline)) void tile_avx2(const float *x, int64_t K, int64_t k0, int64_t k1, const int MBC,
                                                            const uint16_t *p, float *out, int64_t ys, int load) {
    AHEAD_BYTES;
    __m256 lo[6], hi[6];
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000);
    for (int i = 0; i < MBC; i++) {
        lo[i] = load ? _mm256_loadu_ps(out + i * ys) : _mm256_setzero_ps();
        hi[i] = load ? _mm256_loadu_ps(out + i * ys + 8) : _mm256_setzero_ps();
    }
    for (int64_t k = k0; k < k1; k += 2) {
        const uint16_t *w = p + k * BW;
        PREFETCH(w);
        __m256i a = _mm256_loadu_si256((const __m256i *)w), b = _mm256_loadu_si256((const __m256i *)(w + 16));
        __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), b0 = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
        for (int i = 0; i < MBC; i++) {
            __m256 xv = _mm256_set1_ps(x[i * K + k]);
            lo[i] = _mm256_fmadd_ps(xv, a0, lo[i]);
            hi[i] = _mm256_fmadd_ps(xv, b0, hi[i]);
        }
        __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(a, high)), b1 = _mm256_castsi256_ps(_mm256_and_si256(b, high));
        for (int i = 0; i < MBC; i++) {
            __m256 xv = _mm256_set1_ps(x[i * K + k + 1]);
            lo[i] = _mm256_fmadd_ps(xv, a1, lo[i]);
            hi[i] = _mm256_fmadd_ps(xv, b1, hi[i]);
        }
    }
    for (int i = 0; i < MBC; i++) { _mm256_storeu_ps(out + i * ys, lo[i]); _mm256_storeu_ps(out + i * ys + 8, hi[i]); }
}
#endif

#if defined(__AVX512F__)
/* MBC rows against GBC blocks (constants in each inlined copy): per pair of k, the GBC lines loaded
 * and widened once, each row's x[k] and x[k + 1] broadcast once for their GBC products. `stream` 1:
 * decoding's prefetch (skinny_ahead[1]); 2: a few positions' pass's, bf16_few_ahead bytes on into L2 */
static inline __attribute__((always_inline)) void tile_avx512(const float *x, int64_t K, int64_t k0, int64_t k1, const int MBC,
                                                              const int GBC, const uint16_t *p, float *out, int64_t ys, int load,
                                                              const int stream) {
    AHEAD_WHEN(stream == 1);
    const int64_t few = stream == 2 ? bf16_few_ahead : 0;
    __m512 acc[GMAX][MBX], even[GMAX], odd[GMAX];
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000);
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) acc[g][i] = load ? _mm512_loadu_ps(out + i * ys + g * BW) : _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 2) {
        for (int g = 0; g < GBC; g++) {
            const uint16_t *w = p + (int64_t)g * K * BW + k * BW;
            if (stream == 2) {
                if (few) _mm_prefetch((const char *)w + few, _MM_HINT_T1);
            } else {
                PREFETCH(w);
            }
            __m512i v = _mm512_loadu_si512(w);
            even[g] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), odd[g] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        }
        for (int i = 0; i < MBC; i++) {
            __m512 xe = _mm512_set1_ps(x[i * K + k]), xo = _mm512_set1_ps(x[i * K + k + 1]);
            for (int g = 0; g < GBC; g++) acc[g][i] = _mm512_fmadd_ps(xo, odd[g], _mm512_fmadd_ps(xe, even[g], acc[g][i]));
        }
    }
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) _mm512_storeu_ps(out + i * ys + g * BW, acc[g][i]);
}
#endif

/* every case a copy of a tile with its row count constant */
#define CASES(T, ...)                          \
    case 1: T(1, __VA_ARGS__); break;          \
    case 2: T(2, __VA_ARGS__); break;          \
    case 3: T(3, __VA_ARGS__); break;          \
    case 4: T(4, __VA_ARGS__); break;          \
    case 5: T(5, __VA_ARGS__); break;          \
    case 6: T(6, __VA_ARGS__); break;          \
    case 7: T(7, __VA_ARGS__); break;          \
    case 8: T(8, __VA_ARGS__); break;          \
    case 9: T(9, __VA_ARGS__); break;          \
    case 10: T(10, __VA_ARGS__); break;        \
    case 11: T(11, __VA_ARGS__); break;        \
    default: T(12, __VA_ARGS__); break;
#define AVX512(R, G) tile_avx512(x, K, k0, k1, R, G, p, out, ys, load, 1)
#define AVX512S(R, G, S) tile_avx512(x, K, k0, k1, R, G, p, out, ys, load, S)
#define DOT(R, G) tile_dot(xb, KC / 2, K, kc / 2, R, G, p + kk * BW, out, ys, load || kk > k0, 1)

/* one decoding tile (mb <= MBX rows, gb <= GBX blocks) of `path` */
static void tile_one(int64_t path, const float *x, int64_t K, int64_t k0, int64_t k1, int64_t mb, int64_t gb, const uint16_t *p,
                     float *out, int64_t ys, int load) {
    switch (path) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    case BF16_DOT: {
        uint32_t xb[MBX * KC / 2];
        for (int64_t kk = k0; kk < k1; kk += KC) {
            int64_t kc = k1 - kk < KC ? k1 - kk : KC;
            round_rows(x + kk, K, 0, kc, mb, xb, KC / 2);
            if (gb == 2) switch (mb) { CASES(DOT, 2) }
            else switch (mb) { CASES(DOT, 1) }
        }
        return;
    }
#endif
#if defined(__AVX512F__)
    case BF16_AVX512:
        if (gb == 2) switch (mb) { CASES(AVX512, 2) }
        else switch (mb) { CASES(AVX512, 1) }
        return;
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case BF16_AVX2:
        for (int64_t g = 0; g < gb; g++) {
            const uint16_t *pg = p + g * K * BW;
            float *o = out + g * BW;
            switch (mb) {
            case 1: tile_avx2(x, K, k0, k1, 1, pg, o, ys, load); break;
            case 2: tile_avx2(x, K, k0, k1, 2, pg, o, ys, load); break;
            case 3: tile_avx2(x, K, k0, k1, 3, pg, o, ys, load); break;
            case 4: tile_avx2(x, K, k0, k1, 4, pg, o, ys, load); break;
            case 5: tile_avx2(x, K, k0, k1, 5, pg, o, ys, load); break;
            default: tile_avx2(x, K, k0, k1, 6, pg, o, ys, load); break;
            }
        }
        return;
#endif
    default: tile_scalar(x, K, k0, k1, mb, gb, p, out, ys, load); return;
    }
}

void bf16_tile(int64_t path, const float *x, int64_t K, int64_t k0, int64_t k1, int64_t mb, int64_t gb, const uint16_t *p,
               float *out, int64_t ys, int load) {
    int64_t rows = path == BF16_DOT || path == BF16_AVX512 ? MBX : path == BF16_AVX2 ? 6 : 4;
    for (int64_t m0 = 0; m0 < mb; m0 += rows)
        for (int64_t g0 = 0; g0 < gb; g0 += GBX)
            tile_one(path, x + m0 * K, K, k0, k1, mb - m0 < rows ? mb - m0 : rows, gb - g0 < GBX ? gb - g0 : GBX,
                     p + g0 * K * BW, out + m0 * ys + g0 * BW, ys, load);
}

/* The AVX-512 widening path's tile of a pass of a few positions (skinny_bf16_rows.c's decoding loop, 2..12 rows):
 * mb rows x gb blocks in one tile over [k0, k1) (up to 5 rows on 4 blocks, 7 on 3, 12 on 1-2: mb x gb sums, 2 gb
 * widened lines and 2 broadcasts in 32 registers), from FEW_AHEAD_ROWS rows prefetching into L2 (bf16_tiles.h);
 * 0 where `path` is not BF16_AVX512, this build lacks it, or the tile does not fit. Each output's chain is its
 * one chain in any tile: the same bits. */
int bf16_few_wide(int64_t path, const float *x, int64_t K, int64_t k0, int64_t k1, int64_t mb, int64_t gb, const uint16_t *p,
                  float *out, int64_t ys, int load) {
#if defined(__AVX512F__)
    if (path != BF16_AVX512 || mb < 1 || mb > MBX || gb < 1 || gb > 4 || (gb == 4 && mb > 5) || (gb == 3 && mb > 7)) return 0;
#define WIDE(S)                                                                                                                 \
    if (gb == 4) switch (mb) { case 1: AVX512S(1, 4, S); break; case 2: AVX512S(2, 4, S); break; case 3: AVX512S(3, 4, S); break; \
                               case 4: AVX512S(4, 4, S); break; default: AVX512S(5, 4, S); break; }                            \
    else if (gb == 3) switch (mb) { case 1: AVX512S(1, 3, S); break; case 2: AVX512S(2, 3, S); break; case 3: AVX512S(3, 3, S); break; \
                                    case 4: AVX512S(4, 3, S); break; case 5: AVX512S(5, 3, S); break; case 6: AVX512S(6, 3, S); break; \
                                    default: AVX512S(7, 3, S); break; }                                                          \
    else if (gb == 2) switch (mb) { CASES(AVX512S, 2, S) }                                                                      \
    else switch (mb) { CASES(AVX512S, 1, S) }
    if (mb >= FEW_AHEAD_ROWS) { WIDE(2) } else { WIDE(1) }
#undef WIDE
    return 1;
#else
    (void)path, (void)x, (void)K, (void)k0, (void)k1, (void)mb, (void)gb, (void)p, (void)out, (void)ys, (void)load;
    return 0;
#endif
}

int bf16_full(int64_t path, int64_t rows, int64_t blocks, const float *x, int64_t K, int64_t k0, int64_t k1, const uint16_t *p,
              float *out, int64_t ys, int load) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if (path == BF16_DOT && rows == 1 && blocks == 4) { /* one position's (skinny_bf16_rows.c: ONE_ROW_BLOCKS) */
        uint32_t xb[KC / 2];
        for (int64_t kk = k0; kk < k1; kk += KC) {
            int64_t kc = k1 - kk < KC ? k1 - kk : KC;
            round_rows(x + kk, K, 0, kc, 1, xb, KC / 2);
            DOT(1, 4);
        }
        return 1;
    }
#endif
#if defined(__AVX512F__)
    if (path == BF16_AVX512 && ((rows == 8 && blocks == 3) || (rows == 1 && blocks == 4))) {
        if (blocks == 3) AVX512(8, 3);
        else AVX512(1, 4); /* one position's (skinny_bf16_rows.c: ONE_ROW_BLOCKS) */
        return 1;
    }
#endif
    if (rows <= MBX && blocks <= GBX) {
        bf16_tile(path, x, K, k0, k1, rows, blocks, p, out, ys, load);
        return 1;
    }
    return 0;
}
