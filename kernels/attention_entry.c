/* The attention entry points the tests call (tests/test_attention_kernel.py, tests/test_c_step.py): attention.h's
 * attend_positions and attention_split.h's attend_split on given queries, keys and values, and the lanes of
 * this build's vectors. The C step (c_step.c) runs the same functions. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "step_rows.h"
#include "attention_split.h"

/* attention for the tests (tests/test_c_step.py): P <= POSITIONS positions' g <= GROUP query heads q [P, g, D]
 * of one key-value head over keys, values [L, D] (float32, or bfloat16 where kv is 1) into out [P, g, D],
 * position p seeing slot j < n[p] where seen[p L + j] (seen NULL: every slot j < n[p], as a chain's unit); all
 * at once (1: attend_positions) or each query alone (0). Returns 0, or -1 where its scratch could not be allocated. */
int c_attend_kv(const float *q, int64_t P, int64_t g, const void *keys, const void *values, const uint8_t *seen, const int64_t *n,
                int64_t L, int64_t D, float scale, float *out, int64_t together, int64_t kv) {
    float *kt = malloc((size_t)(blocks_of(L) * BLOCK * D + P * g * (L + BLOCK + D)) * sizeof(float));
    if (!kt) return -1;
    float *s = kt + blocks_of(L) * BLOCK * D, *acc = s + P * g * (L + BLOCK);
    Position pos[POSITIONS];
    key_blocks(keys, L, D, 0, blocks_of(L), kt, (int)kv);
    for (int64_t p = 0; p < P; p++) {
        const uint8_t *own = seen ? seen + p * L : NULL;
        pos[p] = (Position){q + p * g * D, own, n[p], out + p * g * D};
        for (int64_t c = 0; c < g && !together; c++) {
            Position one = {q + (p * g + c) * D, own, n[p], out + (p * g + c) * D};
            attend_positions(&one, 1, 1, kt, values, D, scale, s, acc, (int)kv);
        }
    }
    if (together) attend_positions(pos, (int)P, (int)g, kt, values, D, scale, s, acc, (int)kv);
    free(kt);
    return 0;
}

/* c_attend_kv on float32 keys and values */
int c_attend(const float *q, int64_t P, int64_t g, const float *keys, const float *values, const uint8_t *seen, const int64_t *n,
             int64_t L, int64_t D, float scale, float *out, int64_t together) {
    return c_attend_kv(q, P, g, keys, values, seen, n, L, D, scale, out, together, 0);
}

/* attend_split for the tests: P <= POSITIONS positions' Hq query heads q [P, Hq, D] over keys, values [Hkv, L, D]
 * (float32, or bfloat16 where kv is 1) into out [P, Hq, D], position p seeing slot j < n[p] where seen[p L + j], on
 * `threads` threads, the heads in groups of qg <= GROUP, the dimensions in `parts`; shape: P, Hq, Hkv, L, D, threads,
 * parts, qg. Returns 0, or -1 where its scratch could not be allocated. */
int c_attend_split_kv(const float *q, const void *keys, const void *values, const uint8_t *seen, const int64_t *n, const int64_t *shape,
                      float scale, float *out, int64_t kv) {
    const int64_t P = shape[0], Hq = shape[1], Hkv = shape[2], L = shape[3], D = shape[4], threads = shape[5], nb = blocks_of(L);
    const int64_t mine = POSITIONS * GROUP * (L + BLOCK + D);
    float *kt = malloc((size_t)(Hkv * nb * BLOCK * D + P * Hq * (L + BLOCK) + threads * mine) * sizeof(float));
    if (!kt) return -1;
    float *shared = kt + Hkv * nb * BLOCK * D, *own = shared + P * Hq * (L + BLOCK);
    Position pos[POSITIONS];
    for (int64_t h = 0; h < Hkv; h++) key_blocks(kv_ptr(keys, h * L * D, (int)kv), L, D, 0, nb, kv_ptr(kt, h * nb * BLOCK * D, (int)kv), (int)kv);
    for (int64_t p = 0; p < P; p++) pos[p] = (Position){q + p * Hq * D, seen + p * L, n[p], out + p * Hq * D};
    const Heads heads = {kt, values, nb * BLOCK * D, L * D, Hkv, Hq / Hkv, shape[7], D, shape[6], scale, (int)kv};
#pragma omp parallel num_threads((int)threads)
    {
        float *s = own + omp_get_thread_num() * mine;
        attend_split(pos, (int)P, &heads, shared, s, s + POSITIONS * GROUP * (L + BLOCK));
    }
    free(kt);
    return 0;
}

/* c_attend_split_kv on float32 keys and values */
int c_attend_split(const float *q, const float *keys, const float *values, const uint8_t *seen, const int64_t *n, const int64_t *shape,
                   float scale, float *out) {
    return c_attend_split_kv(q, keys, values, seen, n, shape, scale, out, 0);
}

/* bf16_round of x [n] into out [n]: what a bfloat16 cache holds of each key and value the step writes (the tests) */
void c_bf16_round(const float *x, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16_round(x[i]);
}

/* the lanes of attention's vectors in this build (attention_vec.h: 16 on AVX-512, 8 on AVX2); 1: the plain loops */
int c_attention_lanes(void) {
#if defined(ATTENTION_VEC)
    return VW;
#else
    return 1;
#endif
}
