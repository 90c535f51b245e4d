/* Whether a blocked copy (kernels/blocked.py's pack: W [N, K] as [ceil(N/16), K, 16]) holds W's
 * values now, bit for bit: the check a C step makes of the copies it did not make itself, for edits
 * through w.data (which change no version). Read in place, both once, on every thread: the weight's
 * 16 rows of a block as 16 sequential streams, the block's K x 64 bytes from L2 (in chunks of
 * CHUNK inputs, so a block of a wide weight stays in L2 too). Bits, not values: -0.0 and NaN
 * compare as written. */
#include <stdint.h>
#include <omp.h>

#define BW 16
#define CHUNK 1024

/* 1 where blocks [ceil(N/16), K, 16] holds w [N, K] (row-major) bit for bit, else 0. */
int blocked_holds(const uint32_t *blocks, const uint32_t *w, int64_t N, int64_t K, int64_t threads) {
    int64_t nblocks = (N + BW - 1) / BW;
    int differs = 0;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads((int)threads) schedule(static) reduction(| : differs)
    for (int64_t b = 0; b < nblocks; b++) {
        const uint32_t *p = blocks + b * K * BW;
        uint32_t acc = 0;
        for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
            int64_t k1 = k0 + CHUNK < K ? k0 + CHUNK : K;
            for (int64_t j = 0; j < BW && b * BW + j < N; j++) {
                const uint32_t *row = w + (b * BW + j) * K;
                for (int64_t k = k0; k < k1; k++) acc |= row[k] ^ p[k * BW + j];
            }
        }
        differs |= acc != 0;
    }
    return !differs;
}
