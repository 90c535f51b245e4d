/* The AMX path (BF16_AMX) of the bfloat16 linears: y[M, N] = x[M, K] . W[N, K]^T (+ b[N]) on Intel's
 * tile unit, W blocked bfloat16 as skinny_bf16.c's other paths read it, x and y float32.
 *
 * No copy of the weights: a block of 16 output features, [K / 2][16][2] (pairs of k interleaved, one
 * 64-byte line per pair), already is TDPBF16PS's B operand: 16 consecutive lines (32 input features)
 * are one B tile of 16 rows x 64 bytes, loaded in place with a stride of 64 bytes.
 *
 * Sums (one chain per output, the same whatever M, the variant, the tile's rows or the thread count):
 *   x rounded to bfloat16 (round to nearest even, vcvtne2ps2bf16: denormals to zero), then k in chunks
 *   of 32 in order (0..31, 32..63, ...), from a tile of +0: per chunk one TDPBF16PS adds the chunk's 32
 *   products to each float32 sum (each product exact; the rounding inside one instruction is the
 *   hardware's: on Sapphire Rapids it is not the SDM pseudo-code's one rounding per product, nor one
 *   per pair or per chunk, tests/test_amx.py checks only what is stated here), then + b. Where K is
 *   not a multiple of 32 the last chunk's missing pairs are +0 in x and in w, for every M alike. Each
 *   row of a tile is computed from its own row of A, the B tile and its own row of C alone, so a row's
 *   sums do not depend on the other rows: a position's logits are the same in a pass of 1 position and
 *   in one of 200.
 *
 * The path exists where the compiler targets AMX-BF16 and AMX-TILE (-march=native on such a CPU) with
 * avx512_bf16 (the rounding of x), the CPU says so (CPUID), and Linux grants this process the tile
 * data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): amx_state says which is missing.
 * Each thread loads its tile configuration (LDTILECFG) at the start of its share of a linear, inside
 * the OpenMP region, and releases the tiles at its end (other code on the thread may configure them). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "bf16_tiles.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__linux__)
#define HAVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

enum { AMX_OFFERED = 0, AMX_NOT_BUILT = 1, AMX_NOT_CPU = 2, AMX_REFUSED = 3 };

/* Whether the AMX path runs here: AMX_OFFERED, else why not (no AMX on this CPU; built without it;
 * refused by the OS). The first call asks Linux for the tile data state, for the whole process. */
int amx_state(void) {
    static int state = -1; /* threads may race to ask: each gets the same answer */
    int known = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (known >= 0) return known;
    known = AMX_NOT_CPU;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    /* CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE */
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (d & (1u << 24))) {
#ifdef HAVE_AMX
        known = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0 ? AMX_OFFERED : AMX_REFUSED;
#else
        known = AMX_NOT_BUILT;
#endif
    }
#endif
    __atomic_store_n(&state, known, __ATOMIC_RELEASE);
    return known;
}

#ifdef HAVE_AMX
#define KT 32   /* input features per tile (16 pairs: 64 bytes of bfloat16 a row) */
#define MT 16   /* rows per tile */
#define STACK_X 32768 /* bytes of rounded rows kept on the stack; more: on the heap for the call */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) TileConfig;

/* tiles 0..a-1 of `rows` rows (the sums C, then rows of x A), the rest of 16 (the weights B), all 64 bytes wide */
static void configure(int rows, int a) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = t < a ? (uint8_t)rows : 16;
    _tile_loadconfig(&c);
}

/* rows x[0..M) rounded to bfloat16 into xb [Mp, Kp] (row stride Kp, Kp a multiple of KT), the padding +0 */
static void round_rows(const float *x, int64_t M, int64_t K, int64_t Mp, int64_t Kp, uint16_t *xb) {
    for (int64_t i = 0; i < Mp; i++)
        for (int64_t c = 0; c < Kp; c += 32) {
            int64_t n = i < M ? (K - c < 32 ? (K - c > 0 ? K - c : 0) : 32) : 0;
            __mmask16 m0 = (__mmask16)((1u << (n < 16 ? n : 16)) - 1), m1 = (__mmask16)(n > 16 ? (1u << (n - 16)) - 1 : 0);
            const float *row = x + i * K + c;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, row + 16), _mm512_maskz_loadu_ps(m0, row));
            _mm512_storeu_si512(xb + i * Kp + c, (__m512i)v);
        }
}

/* C tile (h, g) of the row block at m0, block b: into y where whole (16 rows of x, 16 features of N), else through spill */
#define STORE(T, h, g)                                                                                   \
    do {                                                                                                 \
        int64_t r0 = m0 + (h) * rows, n0 = (b0 + (g)) * BW;                                              \
        if (r0 + rows <= M && n0 + BW <= N) {                                                            \
            _tile_stored(T, y + r0 * N + n0, N * sizeof(float));                                         \
        } else if (r0 < M) {                                                                             \
            _tile_stored(T, spill, BW * sizeof(float));                                                  \
            for (int64_t i = 0; i < rows && r0 + i < M; i++)                                             \
                for (int64_t j = 0; j < BW && n0 + j < N; j++) y[(r0 + i) * N + n0 + j] = spill[i * BW + j]; \
        }                                                                                                \
    } while (0)

/* B tile of block `blk` at input features k..k+31: in place, or (the last, partial chunk) padded with +0 */
static inline const uint16_t *weights_at(const uint16_t *p, int64_t blk, int64_t K, int64_t k, uint16_t *tail) {
    const uint16_t *w = p + blk * K * BW + k * BW;
    if (k + KT <= K) return w;
    memset(tail, 0, KT * BW * sizeof(uint16_t));
    memcpy(tail, w, (K - k) * BW * sizeof(uint16_t));
    return tail;
}

/* the 16 lines of each of blocks b0..b0+gb-1 that chunk k will read AHEAD later (prefetches: speed only).
 * Tile loads have no prefetch of their own, and the hardware's alone leaves a one-row pass short of
 * the memory's speed: the streams are prefetched as the other paths' are (bf16_tiles.h). */
static inline void prefetch_chunk(const uint16_t *p, int64_t b0, int64_t gb, int64_t K, int64_t k) {
    AHEAD_BYTES;
    for (int64_t g = 0; g < gb; g++)
        for (int l = 0; l < KT / 2; l++) PREFETCH(p + (b0 + g) * K * BW + k * BW + l * 2 * BW);
}

/* Variant 0 (decoding's): groups of three blocks dealt contiguously (three weight streams at once), row
 * blocks of up to 16 rows; tiles C 0-2, A 3, B 4-6. */
static void amx_decode(const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K) {
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int64_t blocks = (N + BW - 1) / BW, groups = (blocks + 2) / 3;
    int64_t first = groups * t / threads, last = groups * (t + 1) / threads;
    if (first >= last) return;
    int rows = M < MT ? (int)M : MT;
    int64_t Mp = (M + rows - 1) / rows * rows, Kp = (K + KT - 1) / KT * KT;
    size_t bytes = (size_t)(Mp * Kp) * sizeof(uint16_t);
    uint16_t stack[STACK_X / sizeof(uint16_t)] __attribute__((aligned(64)));
    uint16_t *xb = bytes <= sizeof stack ? stack : aligned_alloc(64, (bytes + 63) / 64 * 64);
    uint16_t tails[3][KT * BW] __attribute__((aligned(64)));
    float spill[MT * BW] __attribute__((aligned(64)));
    if (!xb) abort();
    round_rows(x, M, K, Mp, Kp, xb);
    configure(rows, 4);
    for (int64_t grp = first; grp < last; grp++) {
        int64_t b0 = 3 * grp, gb = blocks - b0 < 3 ? blocks - b0 : 3;
        for (int64_t m0 = 0; m0 < M; m0 += rows) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            for (int64_t k = 0; k < Kp; k += KT) {
                if (m0 == 0) prefetch_chunk(p, b0, gb, K, k); /* the later row blocks read the group's weights from L2 */
                _tile_loadd(3, xb + m0 * Kp + k, Kp * sizeof(uint16_t));
                _tile_loadd(4, weights_at(p, b0, K, k, tails[0]), 64);
                _tile_dpbf16ps(0, 3, 4);
                if (gb > 1) {
                    _tile_loadd(5, weights_at(p, b0 + 1, K, k, tails[1]), 64);
                    _tile_dpbf16ps(1, 3, 5);
                }
                if (gb > 2) {
                    _tile_loadd(6, weights_at(p, b0 + 2, K, k, tails[2]), 64);
                    _tile_dpbf16ps(2, 3, 6);
                }
            }
            STORE(0, 0, 0);
            if (gb > 1) STORE(1, 0, 1);
            if (gb > 2) STORE(2, 0, 2);
        }
        if (b)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = b0 * BW; j < (b0 + gb) * BW && j < N; j++) y[i * N + j] += b[j];
    }
    _tile_release();
    if (xb != stack) free(xb);
}

/* Variant 1 (a prompt's, and the C step's passes of 13-16 positions): groups of two blocks dealt
 * contiguously; per group, row blocks of two tiles of `rows` rows, each over every chunk of k (the
 * group's weights stay in L2 while the row blocks pass): per chunk two A and two B tiles loaded for
 * four TDPBF16PS. The first row block prefetches the group's weights as variant 0 does: up to 32 rows
 * are that one block, which reads every weight once from memory. */
static void amx_rows(const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K) {
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    int64_t blocks = (N + BW - 1) / BW, groups = (blocks + 1) / 2;
    int64_t first = groups * t / threads, last = groups * (t + 1) / threads;
    if (first >= last) return;
    int rows = M < MT ? (int)M : MT;
    int64_t step = 2 * (int64_t)rows, Mp = (M + step - 1) / step * step, Kp = (K + KT - 1) / KT * KT;
    size_t bytes = (size_t)(Mp * Kp) * sizeof(uint16_t);
    uint16_t stack[STACK_X / sizeof(uint16_t)] __attribute__((aligned(64)));
    uint16_t *xb = bytes <= sizeof stack ? stack : aligned_alloc(64, (bytes + 63) / 64 * 64);
    uint16_t tail0[KT * BW] __attribute__((aligned(64))), tail1[KT * BW] __attribute__((aligned(64)));
    float spill[MT * BW] __attribute__((aligned(64)));
    if (!xb) abort(); /* no memory for the rounded rows: never a wrong sum */
    round_rows(x, M, K, Mp, Kp, xb);
    configure(rows, 6); /* C[half][block] 0-3, A 4-5, B 6-7 */
    for (int64_t grp = first; grp < last; grp++) {
        int64_t b0 = 2 * grp;
        int two = b0 + 1 < blocks;
        for (int64_t m0 = 0; m0 < M; m0 += step) {
            int lower = m0 + rows < M; /* a second half with rows of x in it */
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t k = 0; k < Kp; k += KT) {
                if (m0 == 0) prefetch_chunk(p, b0, 1 + two, K, k); /* as decoding's: the first row block streams from memory */
                _tile_loadd(4, xb + m0 * Kp + k, Kp * sizeof(uint16_t));
                _tile_loadd(6, weights_at(p, b0, K, k, tail0), 64);
                _tile_dpbf16ps(0, 4, 6);
                if (two) {
                    _tile_loadd(7, weights_at(p, b0 + 1, K, k, tail1), 64);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (lower) {
                    _tile_loadd(5, xb + (m0 + rows) * Kp + k, Kp * sizeof(uint16_t));
                    _tile_dpbf16ps(2, 5, 6);
                    if (two) _tile_dpbf16ps(3, 5, 7);
                }
            }
            STORE(0, 0, 0);
            if (two) STORE(1, 0, 1);
            if (lower) {
                STORE(2, 1, 0);
                if (two) STORE(3, 1, 1);
            }
        }
        if (b)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = b0 * BW; j < (b0 + 1 + two) * BW && j < N; j++) y[i * N + j] += b[j];
    }
    _tile_release();
    if (xb != stack) free(xb);
}

#endif

/* Inside a parallel region (every thread calls it): the AMX path's variant `tile` (0: row blocks of
 * up to 16 rows, decoding's; 1: of 32, two row tiles per weight tile loaded), both the same bits.
 * Where the path is not offered (amx_state), y is all NaN: never a tile instruction without the OS's grant. */
void skinny_rows_amx(int64_t tile, const float *x, const uint16_t *p, const float *b, float *y, int64_t M, int64_t N, int64_t K) {
#ifdef HAVE_AMX
    if (amx_state() == AMX_OFFERED) {
        if (M > 0 && tile == 1)
            amx_rows(x, p, b, y, M, N, K);
        else if (M > 0)
            amx_decode(x, p, b, y, M, N, K);
        return;
    }
#endif
    (void)tile, (void)x, (void)p, (void)b;
    if (omp_get_thread_num() == 0)
        for (int64_t i = 0; i < M * N; i++) y[i] = __builtin_nanf("");
}
