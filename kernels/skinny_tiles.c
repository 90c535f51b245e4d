/* The skinny kernel's many-row variants (a prompt's chunks): y[M, N] = x[M, K] . W[N, K]^T (+ b[N]) on
 * skinny_gemm.c's blocked float32 weights [N/16, K, 16], with another register tile (rows x blocks of
 * 16 features), the weights' blocks (not register groups) shared among the threads, and optionally the
 * k loop cut into panels of kc input features (a tile's weights for a panel stay in L1 while every row
 * block passes over them).
 *
 * Every variant computes every output by skinny_gemm.c's chain: acc = fma(x[k], w[k], acc) for
 * k = 0..K-1 in order from +0, then + b. A k-panel stores its accumulators in y and the next panel
 * loads them back: a float32 store and load change no bit, so the chain is the same one. Rows and
 * blocks a variant's tile does not cover (the last rows, a thread's last blocks, a padded block) take
 * skinny_gemm.c's own tiles (skinny_cover), which compute the same chain. So every variant gives the
 * reference's bits for every row whatever M, the thread count or the instruction set: which one runs
 * is a matter of speed only, measured on the machine (kernels/prompt_gemm.py, measure/prompt.py).
 *
 * Variant 0 is skinny_gemm.c's own loop (what decoding runs); the table below lists the others built
 * for this instruction set (AVX-512: 32 registers; AVX2: 16; plain C). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <omp.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define BW 16   /* output features per block (skinny_gemm.c) */
#define MMAX 12 /* the most rows of any tile below */
#define GMAX 4  /* the most blocks of any tile below */

void skinny_rows(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K);
void skinny_cover(const float *x, int64_t K, int64_t mb, int64_t gb, const float *p, float *out, int64_t ys);

/* MBC rows of x (row stride K) against GBC blocks of p (each [K][16]) over k = k0..k1-1; the
 * accumulators start at +0 (load 0) or at out (load 1: the panels before), and end in out[i * ys + 16 g + j].
 * Per k, the GBC weight vectors are loaded once and each row's x[k] broadcast once for its GBC products. */
static inline __attribute__((always_inline)) void shaped(const float *x, int64_t K, int64_t k0, int64_t k1, const float *p,
                                                         float *out, int64_t ys, int load, const int MBC, const int GBC) {
#if defined(__AVX512F__)
    __m512 acc[GMAX][MMAX], v[GMAX];
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) acc[g][i] = load ? _mm512_loadu_ps(out + i * ys + g * BW) : _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k++) {
        for (int g = 0; g < GBC; g++) {
            const float *w = p + (int64_t)g * K * BW + k * BW;
            _mm_prefetch((const char *)(w + 64 * BW), _MM_HINT_T0);
            v[g] = _mm512_loadu_ps(w);
        }
        for (int i = 0; i < MBC; i++) {
            __m512 xv = _mm512_set1_ps(x[i * K + k]);
            for (int g = 0; g < GBC; g++) acc[g][i] = _mm512_fmadd_ps(xv, v[g], acc[g][i]);
        }
    }
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) _mm512_storeu_ps(out + i * ys + g * BW, acc[g][i]);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 lo[GMAX][MMAX], hi[GMAX][MMAX], a[GMAX], c[GMAX];
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) {
            lo[g][i] = load ? _mm256_loadu_ps(out + i * ys + g * BW) : _mm256_setzero_ps();
            hi[g][i] = load ? _mm256_loadu_ps(out + i * ys + g * BW + 8) : _mm256_setzero_ps();
        }
    for (int64_t k = k0; k < k1; k++) {
        for (int g = 0; g < GBC; g++) {
            const float *w = p + (int64_t)g * K * BW + k * BW;
            _mm_prefetch((const char *)(w + 64 * BW), _MM_HINT_T0);
            a[g] = _mm256_loadu_ps(w);
            c[g] = _mm256_loadu_ps(w + 8);
        }
        for (int i = 0; i < MBC; i++) {
            __m256 xv = _mm256_set1_ps(x[i * K + k]);
            for (int g = 0; g < GBC; g++) {
                lo[g][i] = _mm256_fmadd_ps(xv, a[g], lo[g][i]);
                hi[g][i] = _mm256_fmadd_ps(xv, c[g], hi[g][i]);
            }
        }
    }
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) {
            _mm256_storeu_ps(out + i * ys + g * BW, lo[g][i]);
            _mm256_storeu_ps(out + i * ys + g * BW + 8, hi[g][i]);
        }
#else
    for (int g = 0; g < GBC; g++)
        for (int i = 0; i < MBC; i++) {
            float acc[BW];
            for (int j = 0; j < BW; j++) acc[j] = load ? out[i * ys + g * BW + j] : 0.0f;
            for (int64_t k = k0; k < k1; k++)
                for (int j = 0; j < BW; j++) acc[j] = fmaf(x[i * K + k], p[(int64_t)g * K * BW + k * BW + j], acc[j]);
            for (int j = 0; j < BW; j++) out[i * ys + g * BW + j] = acc[j];
        }
#endif
}

typedef void (*Tile)(const float *x, int64_t K, int64_t k0, int64_t k1, const float *p, float *out, int64_t ys, int load);

/* one copy of `shaped` per tile, its rows and blocks constant (the accumulators in registers) */
#define TILE(R, G) \
    static void tile_##R##x##G(const float *x, int64_t K, int64_t k0, int64_t k1, const float *p, float *out, int64_t ys, int load) { \
        shaped(x, K, k0, k1, p, out, ys, load, R, G); \
    }

typedef struct {
    int rows, blocks; /* the register tile: rows x blocks of 16 features */
    int kc;           /* input features per k-panel; 0: none (the whole of k per tile) */
    Tile full;        /* NULL: skinny_gemm.c's own loop (variant 0) */
} Variant;

#if defined(__AVX512F__)
TILE(12, 2) TILE(8, 3) TILE(6, 4)
static const Variant VARIANTS[] = {
    {12, 2, 0, NULL}, {12, 2, 0, tile_12x2}, {8, 3, 0, tile_8x3}, {6, 4, 0, tile_6x4},
    {12, 2, 256, tile_12x2}, {8, 3, 128, tile_8x3}, {6, 4, 128, tile_6x4},
};
#elif defined(__AVX2__) && defined(__FMA__)
TILE(6, 1) TILE(3, 2)
static const Variant VARIANTS[] = {
    {6, 1, 0, NULL}, {6, 1, 0, tile_6x1}, {3, 2, 0, tile_3x2}, {6, 1, 256, tile_6x1}, {3, 2, 128, tile_3x2},
};
#else
TILE(4, 1) TILE(4, 2)
static const Variant VARIANTS[] = {{4, 1, 0, NULL}, {4, 1, 0, tile_4x1}, {4, 2, 0, tile_4x2}, {4, 2, 128, tile_4x2}};
#endif
#define COUNT ((int64_t)(sizeof(VARIANTS) / sizeof(VARIANTS[0])))

/* how many variants this build has (variant 0 included) */
int skinny_tiles(void) { return (int)COUNT; }

/* variant `tile`'s shape into shape[0..3): rows, blocks, kc; -1 where there is no such variant */
int skinny_tile_shape(int64_t tile, int64_t *shape) {
    if (tile < 0 || tile >= COUNT) return -1;
    shape[0] = VARIANTS[tile].rows, shape[1] = VARIANTS[tile].blocks, shape[2] = VARIANTS[tile].kc;
    return 0;
}

/* One group of `gb` whole blocks (the variant's tile width, or fewer at a thread's end): the tiles
 * over the rows that fill them, panel by panel; skinny_cover for the rest; then the bias. */
static void group(const Variant *v, const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N,
                  int64_t K, int64_t gb) {
    int64_t tiled = gb == v->blocks ? M - M % v->rows : 0, kc = v->kc > 0 ? v->kc : K;
    for (int64_t k0 = 0; tiled > 0 && k0 < K; k0 += kc)
        for (int64_t m0 = 0; m0 < tiled; m0 += v->rows)
            v->full(x + m0 * K, K, k0, k0 + kc < K ? k0 + kc : K, p, y + m0 * N, N, k0 > 0);
    if (tiled < M) skinny_cover(x + tiled * K, K, M - tiled, gb, p, y + tiled * N, N);
    if (b)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < gb * BW; j++) y[i * N + j] += b[j];
}

/* Inside a parallel region (every thread calls it): skinny_rows by variant `tile` (0, or one this build
 * lacks: skinny_rows itself). Each thread takes a contiguous share of the whole blocks, in groups of the
 * tile's width; the padded last block (N not a multiple of 16) goes to the last thread, through `spill`. */
void skinny_rows_tile(int64_t tile, const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K) {
    if (tile <= 0 || tile >= COUNT) {
        skinny_rows(x, p, b, y, M, N, K);
        return;
    }
    const Variant *v = VARIANTS + tile;
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int64_t whole = N / BW, first = whole * t / threads, last = whole * (t + 1) / threads;
    for (int64_t b0 = first; b0 < last; b0 += v->blocks) {
        int64_t gb = last - b0 < v->blocks ? last - b0 : v->blocks;
        group(v, x, p + b0 * K * BW, b ? b + b0 * BW : NULL, y + b0 * BW, M, N, K, gb);
    }
    if (N % BW && t == threads - 1) {
        float spill[MMAX * BW];
        const float *pad = p + whole * K * BW;
        for (int64_t m0 = 0; m0 < M; m0 += MMAX) {
            int64_t mb = M - m0 < MMAX ? M - m0 : MMAX;
            skinny_cover(x + m0 * K, K, mb, 1, pad, spill, BW);
            for (int64_t i = 0; i < mb; i++)
                for (int64_t j = whole * BW; j < N; j++)
                    y[(m0 + i) * N + j] = b ? spill[i * BW + j - whole * BW] + b[j] : spill[i * BW + j - whole * BW];
        }
    }
}

/* skinny_rows_tile on `threads` threads (skinny_gemm.c's skinny_linear); the threads it ran on */
int skinny_linear_tile(int64_t tile, const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                       int64_t threads) {
    int ran = 1;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads((int)threads)
    {
        if (omp_get_thread_num() == 0) ran = omp_get_num_threads();
        skinny_rows_tile(tile, x, p, b, y, M, N, K);
    }
    return ran;
}
