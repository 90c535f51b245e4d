/* A draft step of an EAGLE-3 head (eagle/head.py) in one C call, float32 on CPU, on the C step's
 * kernels: the skinny kernel (skinny_gemm.c) on weights blocked once, float32 or bfloat16 (then
 * skinny_bf16.c's path, HeadDims.weights, as c_step.c reads them), the rest row by row
 * (step_rows.h), so a row's result never depends on the step's width nor on the thread count.
 *
 * For each of m fed positions, as eagle/head.py computes it:
 *   g = fc(features) (where features are given; else g is the caller's: the layer's last output)
 *   x = [rms_norm(embedding) ; rms_norm(g)] (2H wide) ; residual = g (or its norm: norm_before_residual)
 *   q|k|v = x . Wqkv^T ; RoPE on q, k ; k, v to the head's cache at slots start.. ; attention
 *   h = residual + o_proj(attention) ; h += down(silu(gate) * up)(rms_norm(h))
 * then the head's final norm and its output layer (the draft vocabulary) on the last n_last rows.
 *
 * Shapes: H the head's hidden size, F the fc's input (3 target hidden sizes), Hq / Hkv / D / I as
 * in c_step.c, cap the head cache's slots, Vd the draft vocabulary. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#include "step_rows.h"

#include "linears.h" /* the linears: float32 (variant 0) or bfloat16 blocked, as HeadDims.weights says */

typedef struct {  /* blocked: in HeadDims.weights' format; norms and the fc bias float32 */
    const void *fc; const float *fc_bias;           /* blocked [H / 16, F, 16]; bias [H] or NULL */
    const float *in_norm, *hidden_norm, *post_norm; /* [H] */
    const void *qkv;                                /* blocked [(Hq + 2 Hkv) D / 16, 2H, 16] */
    const void *o;                                  /* blocked [H / 16, Hq D, 16] */
    const void *gate_up, *down;                     /* blocked [2 I / 16, H, 16], [H / 16, I, 16] */
    const float *norm; const void *lm_head;         /* [H]; blocked [Vd / 16, H, 16] */
    float *keys, *values;                           /* the head's cache [Hkv, cap, D] */
} HeadWeights;

typedef struct {
    int64_t H, F, Hq, Hkv, D, I, Vd, cap, norm_before_residual;
    float eps, scale;
    int64_t weights; /* the blocked weights' format and the path that reads them: skinny_bf16.c's F32, BF16_* */
} HeadDims;

/* The scratch floats head_step needs for m positions on `threads` threads. */
int64_t head_step_scratch(const HeadDims *d, int64_t m, int64_t threads) {
    int64_t nqkv = (d->Hq + 2 * d->Hkv) * d->D;
    return m * (2 * d->H + nqkv + d->Hq * d->D + d->H + 3 * d->I + d->H) + d->Hkv * blocks_of(d->cap) * BLOCK * d->D +
           threads * (d->cap + BLOCK + d->D + d->cap / 4 + 64);
}

/* One step. emb: [m, H] the fed tokens' embeddings; g: [m, H], written by fc from features [m, F]
 * where features is not NULL, else read. cos, sin: [m, D]. Position i sees slot j where
 * seen_mask[i * (start + m) + j] (a tree), or where j <= start + i (NULL: a chain). out: [m, H] the
 * layer's outputs; logits: [n_last, Vd] of the last n_last rows. Returns the threads it ran on. */
int head_step(const HeadWeights *w, const HeadDims *d, const float *emb, const float *features, float *g,
              const float *cos, const float *sin, int64_t m, int64_t start, const uint8_t *seen_mask, float *out,
              float *logits, int64_t n_last, float *scratch, int64_t threads) {
    const int64_t H = d->H, D = d->D, Hq = d->Hq, Hkv = d->Hkv, I = d->I, nqkv = (Hq + 2 * Hkv) * D, L = start + m;
    float *x = scratch, *qkv = x + m * 2 * H, *att = qkv + m * nqkv, *delta = att + m * Hq * D, *gu = delta + m * H,
          *act = gu + m * 2 * I, *normed = act + m * I, *kt = normed + m * H,
          *per_thread = kt + Hkv * blocks_of(d->cap) * BLOCK * D;
    int ran = 1;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num();
        float *s = per_thread + t * (d->cap + BLOCK + D + d->cap / 4 + 64), *acc = s + d->cap + BLOCK; /* attention's */
        uint8_t *seen = (uint8_t *)(acc + D);
        if (t == 0) ran = omp_get_num_threads();
        if (features) {
            skinny_rows_as(d->weights, 0, features, w->fc, w->fc_bias, g, m, H, d->F);
#pragma omp barrier
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            rms_norm(emb + i * H, w->in_norm, d->eps, x + i * 2 * H, H);
            rms_norm(g + i * H, w->hidden_norm, d->eps, x + i * 2 * H + H, H);
            memcpy(out + i * H, d->norm_before_residual ? x + i * 2 * H + H : g + i * H, H * sizeof(float));
        }
        skinny_rows_as(d->weights, 0, x, w->qkv, NULL, qkv, m, nqkv, 2 * H);
#pragma omp barrier
#pragma omp for schedule(static) collapse(2)
        for (int64_t i = 0; i < m; i++)
            for (int64_t head = 0; head < Hq + Hkv; head++) {
                float *v = qkv + i * nqkv + head * D;
                rotate(v, cos + i * D, sin + i * D, D);
                if (head >= Hq) {
                    int64_t kv = head - Hq, slot = start + i;
                    memcpy(w->keys + (kv * d->cap + slot) * D, v, D * sizeof(float));
                    memcpy(w->values + (kv * d->cap + slot) * D, qkv + i * nqkv + (Hq + Hkv + kv) * D, D * sizeof(float));
                }
            }
#pragma omp for schedule(static) collapse(2) /* the keys in blocks (attention.h), shared by the queries */
        for (int64_t kv = 0; kv < Hkv; kv++)
            for (int64_t b = 0; b < blocks_of(L); b++)
                key_blocks(w->keys + kv * d->cap * D, L, D, b, b + 1, kt + kv * blocks_of(d->cap) * BLOCK * D, 0); /* float32 */
#pragma omp for schedule(static) collapse(2)
        for (int64_t i = 0; i < m; i++)
            for (int64_t head = 0; head < Hq; head++) {
                int64_t kv = head / (Hq / Hkv), upto = start + i + 1;
                for (int64_t j = 0; j < L; j++) seen[j] = seen_mask ? seen_mask[i * L + j] : j < upto;
                attend_group(qkv + i * nqkv + head * D, 1, kt + kv * blocks_of(d->cap) * BLOCK * D, w->values + kv * d->cap * D,
                             seen, seen_mask ? L : upto, D, d->scale, s, acc, att + (i * Hq + head) * D, 0);
            }
        skinny_rows_as(d->weights, 0, att, w->o, NULL, delta, m, H, Hq * D);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            for (int64_t k = 0; k < H; k++) out[i * H + k] += delta[i * H + k];
            rms_norm(out + i * H, w->post_norm, d->eps, normed + i * H, H);
        }
        skinny_rows_as(d->weights, 0, normed, w->gate_up, NULL, gu, m, 2 * I, H);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++)
            for (int64_t k = 0; k < I; k++) {
                float gate = gu[i * 2 * I + k];
                act[i * I + k] = gate / (1.0f + fexp(-gate)) * gu[i * 2 * I + I + k];
            }
        skinny_rows_as(d->weights, 0, act, w->down, NULL, delta, m, H, I);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            for (int64_t k = 0; k < H; k++) out[i * H + k] += delta[i * H + k];
            if (i >= m - n_last) rms_norm(out + i * H, w->norm, d->eps, normed + (i - (m - n_last)) * H, H);
        }
        skinny_rows_as(d->weights, 0, normed, w->lm_head, NULL, logits, n_last, d->Vd, H);
    }
    return ran;
}
