/* The row pieces of c_step.c's layer (included by it after Layer and Dims): the residual and the norms, RoPE and
 * the cache's writes, the activation, the logits' finish; and the few-row pass's own rows.
 *
 * A pass of up to FEW_ROWS positions (decoding, verification) has each thread compute every row of the
 * row-by-row parts itself, into its own buffers (the residual stream h, the normed x, the activation): the
 * same operations in the same order in each thread, so the same bits, and no barrier to share them. Per layer
 * that leaves the barriers the linears' outputs need (after q/k/v, o, gate/up and down), one after RoPE and
 * the keys' blocks, and attention's, against four more where a thread's rows are dealt out (the residual and
 * norm before q/k/v, RoPE, the keys' blocks, the residual and norm before gate/up, the activation); at one
 * position those parts are a few microseconds of work that one thread did while the others waited. */
#ifndef STEP_LAYER_H
#define STEP_LAYER_H

/* The most positions a pass computes its rows in every thread (0: never; the same bits either way). Past it
 * a thread's own copy of the activation ([r, I] per thread) costs more than the barrier it saves. */
#ifndef FEW_ROWS
#define FEW_ROWS 8
#endif

/* x normed into y (n floats), or copied where the layer has no norm there (OLMo 2's input) */
static void norm_or_copy(const float *x, const float *weight, float eps, float *y, int64_t n) {
    if (weight)
        rms_norm(x, weight, eps, y, n);
    else
        memcpy(y, x, n * sizeof(float));
}

/* one row's residual: h += delta * residual_scale, delta normed first (into normed: delta itself, in place, or
 * a thread's own [H]) where the layer norms its block's output (OLMo 2, Gemma 3); torch's order: the product
 * rounded, then the sum */
static void add_residual(float *h, float *delta, const float *out_norm, const Dims *d, float *normed) {
    if (out_norm) {
        rms_norm(delta, out_norm, d->eps, normed, d->H);
        delta = normed;
    }
    for (int64_t k = 0; k < d->H; k++) h[k] += delta[k] * d->residual_scale;
}

/* gelu-tanh, 0.5 g (1 + tanh(u)) with u = sqrt(2 / pi) (g + 0.044715 g^3), as g / (1 + exp(-2u)):
 * the same value without the cancellation of 1 + tanh(u) near -1; branch-free, so it vectorizes */
static inline float gelu_tanh(float g) {
    float u = 0.7978845608028654f * (g + 0.044715f * (g * g * g));
    return g / (1.0f + fexp(-2.0f * u));
}

/* one row's activation over the columns [k, end): act = act_fn(gate) * up, gu the row's [gate | up] (2I) */
static void activate(const float *gu, float *act, int64_t k, int64_t end, const Dims *d) {
    const int64_t I = d->I;
    if (d->act == 1) { /* gelu-tanh (Gemma 3) */
        for (; k < end; k++) act[k] = gelu_tanh(gu[k]) * gu[I + k];
        return;
    }
#if defined(__AVX512F__)
    for (; k + 16 <= end; k += 16) { /* silu as below, on 16 lanes */
        __m512 g = _mm512_loadu_ps(gu + k);
        __m512 e = fexp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32((int)0x80000000))));
        _mm512_storeu_ps(act + k, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(gu + I + k)));
    }
#endif
    for (; k < end; k++) act[k] = gu[k] / (1.0f + fexp(-gu[k])) * gu[I + k];
}

/* one row of logits: / divisor, then tanh(y / cap) * cap where softcapped, tanh as 1 - 2 / (1 + exp(2y))
 * (odd: computed on |y|, the sign put back) */
static void finish_logits(float *logits, int64_t V, const Dims *d) {
    for (int64_t k = 0; k < V; k++) {
        float y = logits[k] / d->logit_divisor;
        if (d->softcap != 0.0f) {
            float a = fabsf(y / d->softcap), t = 1.0f - 2.0f / (1.0f + fexp(2.0f * a));
            y = (y < 0.0f ? -t : t) * d->softcap;
        }
        logits[k] = y;
    }
}

/* head `head` (q heads first, then k) of row i of qkv [r, nqkv]: its per-head norm, RoPE (cos, sin [T, r, rot]);
 * a key head's key and value written to the cache at slot start + i (a bfloat16 cache's rounded: bf16_round) */
static void rope_head(float *qkv, int64_t i, int64_t head, const Layer *w, const Dims *d, const float *cos, const float *sin,
                      int64_t r, int64_t start) {
    const int64_t D = d->D, Hq = d->Hq, Hkv = d->Hkv, nqkv = (Hq + 2 * Hkv) * D;
    float *v = qkv + i * nqkv + head * D;
    if (d->qk_norm == 1) rms_norm(v, head < Hq ? w->q_norm : w->k_norm, d->eps, v, D);
    if (w->rope >= 0) rotate(v, cos + (w->rope * r + i) * d->rot, sin + (w->rope * r + i) * d->rot, d->rot);
    if (head >= Hq) {
        int64_t kv = head - Hq, at = (kv * d->cap + start + i) * D;
        const float *value = qkv + i * nqkv + (Hq + Hkv + kv) * D;
        if (d->kv) {
            uint16_t *keys = (uint16_t *)w->keys + at, *values = (uint16_t *)w->values + at;
            for (int64_t e = 0; e < D; e++) keys[e] = bf16_round(v[e]), values[e] = bf16_round(value[e]);
        } else {
            memcpy((float *)w->keys + at, v, D * sizeof(float));
            memcpy((float *)w->values + at, value, D * sizeof(float));
        }
    }
}

/* floats a thread's own rows take in a pass of r positions (up to FEW_ROWS of them: a longer pass's chunks may
 * end in a few rows): h and x [r, H], the activation [r, I], a delta's norm [H] */
static int64_t few_floats(const Dims *d, int64_t r) {
    int64_t rows = r < FEW_ROWS ? r : FEW_ROWS;
    return rows * (2 * d->H + d->I) + d->H;
}

/* floats the Deals of a pass take (deal.h): a thread's in each linear call (a layer's four, the output layer's),
 * from the first cache line on */
static int64_t deal_floats(const Dims *d, int64_t threads) {
    return (4 * d->layers + 1) * threads * (int64_t)(sizeof(Deal) / sizeof(float)) + 16;
}

/* the pass's Deals at the first cache line from `at` (deal_floats of scratch), zeroed: [4 layers + 1, threads], call
 * by call, each at its start with no barrier to reset it */
static Deal *deals_at(float *at, const Dims *d, int64_t threads) {
    Deal *deals = (Deal *)(((uintptr_t)at + 63) & ~(uintptr_t)63);
    memset(deals, 0, (4 * d->layers + 1) * threads * sizeof(Deal));
    return deals;
}

/* The own rows [lo, r) of a few-row pass: the residual of the block before (delta [r, H], the team's, normed
 * into `normed` where out_norm) added to this thread's h, then its norm (or a copy) into this thread's x */
static void own_rows(float *h, float *delta, const float *out_norm, const float *norm, float *x, float *normed, int64_t lo,
                     int64_t r, const Dims *d) {
    for (int64_t i = lo; i < r; i++) {
        if (delta) add_residual(h + i * d->H, delta + i * d->H, out_norm, d, normed);
        norm_or_copy(h + i * d->H, norm, d->eps, x + i * d->H, d->H);
    }
}

/* RoPE, the cache's writes and the keys' blocks of a few-row pass, in one loop over units dealt out to the team:
 * a query head of a row; a key-value head (its rows' keys and values, then the blocks that hold them); a block
 * before the pass's slots made again (a cache without kept blocks). Each unit's writes are its own: one barrier
 * after, where the many-row loops take two. blocks_at(kv): kv's blocks; first: the first block made. */
static void rope_and_blocks(float *qkv, const Layer *w, const Dims *d, const float *cos, const float *sin, int64_t r, int64_t start,
                            void *blocks, int64_t first) {
    const int64_t Hq = d->Hq, Hkv = d->Hkv, D = d->D, L = start + r, nb = blocks_of(L), stride = blocks_of(d->cap) * BLOCK * D;
    const int bf = d->kv != 0;
    const int64_t fresh = start / BLOCK > first ? start / BLOCK : first; /* the first block holding a slot of the pass */
    const int64_t old = fresh - first, units = r * Hq + Hkv + Hkv * old;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; u++) {
        if (u < r * Hq) {
            rope_head(qkv, u / Hq, u % Hq, w, d, cos, sin, r, start);
        } else if (u < r * Hq + Hkv) {
            int64_t kv = u - r * Hq;
            for (int64_t i = 0; i < r; i++) rope_head(qkv, i, Hq + kv, w, d, cos, sin, r, start);
            key_blocks(kv_ptr(w->keys, kv * d->cap * D, bf), L, D, fresh, nb, kv_ptr(blocks, kv * stride, bf), bf);
        } else {
            int64_t kv = (u - r * Hq - Hkv) / old, b = first + (u - r * Hq - Hkv) % old;
            key_blocks(kv_ptr(w->keys, kv * d->cap * D, bf), L, D, b, b + 1, kv_ptr(blocks, kv * stride, bf), bf);
        }
    }
}

#endif
