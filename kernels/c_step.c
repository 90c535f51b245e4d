/* The C step: a whole pass of a Llama-family decoder (or its kin's: models/layer_spec.py) over r
 * positions (r small: decoding, verification, draft trees) in one call, float32 on CPU, inside one
 * OpenMP parallel region. Its KV cache is float32, or (a bfloat16 model's, Dims.kv) bfloat16: keys and values
 * rounded once where a pass writes them, read widened (attention.h).
 *
 * Per layer, as transformers computes it (models/llama.py is the same arithmetic in torch):
 *   x = rms_norm(h) (where the layer norms its input) ; q|k|v = x . Wqkv^T (+ b) ; q/k norms (per
 *   head, or over all heads) ; RoPE on the first `rot` dimensions of q, k (rotate-half form, the
 *   layer's cos/sin table, or none) ; k, v written to the cache at slots start..start+r-1 ; attention
 *   of each query over the slots it may see (within the layer's window) ; h += post_norm?(o_proj(attention)) * rs ;
 *   x = rms_norm(h) ; g|u = x . Wgu^T ; h += post_norm?(down(act(g) * u)) * rs   (act: silu or gelu-tanh)
 * then the final norm and the output layer on the last n_last positions (divided, softcapped). The last
 * layer computes the other positions' keys and values only: nothing reads the rest of its output for
 * them (a prompt's first positions; the same bits for the rows computed, each row being alone).
 *
 * Every linear is the skinny kernel on weights blocked once (skinny_gemm.c), q/k/v fused into one
 * matrix and gate/up into another, so each weight matrix is read in one sweep. Everything else is
 * computed row by row, each row in a fixed order (norms: lanes of 16, then a fixed tree; attention:
 * each score a serial fused multiply-add chain over d, each output a serial fused chain over the slots,
 * kernels/attention.h; the same bits on every build and tile), so a position's
 * result depends only on its own row and on the cache: never on how many positions the pass has,
 * nor on the thread count. That makes a verification pass give the logits a decoding pass gives,
 * bit for bit: greedy speculative decoding emits the tokens of greedy decoding by construction
 * (where its first pass, the prompt and its first drafts, is a pass this step takes).
 *
 * Shapes: H hidden size, Hq / Hkv query / key-value heads, D head size, I intermediate size,
 * cap the cache's slots per layer, V the vocabulary, T the RoPE tables, rot the dimensions rotated. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "linears.h"
#include "logits_top.h"

/* The weights (blocked, as the format Dims.weights says: float32, or bfloat16 with pairs of k
 * interleaved, skinny_bf16.c); norms and biases float32 in either. */
typedef struct {
    const float *in_norm, *post_norm; /* [H] */
    const void *qkv;                  /* blocked [(Hq + 2 Hkv) D / 16, H, 16] */
    const float *qkv_bias;            /* [(Hq + 2 Hkv) D] or NULL */
    const void *o;                    /* blocked [H / 16, Hq D, 16] */
    const float *o_bias;              /* [H] or NULL */
    const void *gate_up;              /* blocked [2 I / 16, H, 16]: the gate's blocks, then the up's */
    const void *down;                 /* blocked [H / 16, I, 16] */
    void *keys, *values;              /* the cache [Hkv, cap, D]: float32, or bfloat16 (Dims.kv) */
    /* the family's own (models/layer_spec.py); NULL, 0 or -1 where it has none */
    const float *attn_out_norm, *mlp_out_norm; /* [H]: on the attention's, the MLP's output, before the residual */
    const float *q_norm, *k_norm;     /* [D] (Dims.qk_norm 1: per head) or [Hq D] / [Hkv D] (2: over all heads) */
    int64_t window;                   /* attends to the last `window` positions; 0: to all */
    int64_t rope;                     /* its cos/sin table; -1: no RoPE */
    void *kept_blocks;                /* the keys in blocks kept beside the cache [Hkv, blocks_of(cap) 16, D], the cache's
                                         element (attention.h's key_blocks; Dims.kept); NULL: made in the scratch each pass */
} Layer;

typedef struct {
    int64_t layers, H, Hq, Hkv, D, I, cap;
    float eps, scale;
    int64_t rot;          /* the dimensions RoPE rotates, the first of each head (<= D) */
    int64_t qk_norm;      /* 0: none; 1: per head; 2: over all heads */
    int64_t act;          /* 0: silu; 1: gelu-tanh */
    float residual_scale; /* h += delta * residual_scale (Granite; 1 elsewhere) */
    float logit_divisor;  /* logits / logit_divisor (Granite; 1 elsewhere) */
    float softcap;        /* logits = tanh(logits / softcap) * softcap (Gemma); 0: none */
    int64_t weights; /* the blocked weights' format and the path that reads them: skinny_bf16.c's F32, BF16_* */
    int64_t tile;    /* float32 weights: the linears' variant (skinny_tiles.c; 0: skinny_gemm.c's own), bits alike */
    int64_t kept;    /* the slots [0, kept) of every Layer.kept_blocks that hold the cache's keys as they are
                        (kernels/kept_keys.py); the pass transposes from the block of min(kept, start) on */
    void *tops;      /* Top [n_last] (logits_top.h): each logits row's argmax, its value, the largest of the rest; NULL: none */
    int64_t kv;      /* the cache's element (keys, values, key blocks): 0 float32; 1 bfloat16, rounded once where written
                        (attention.h: the chains read the rounded keys and values, widened) */
} Dims;

#include "step_rows.h"
#include "attention_split.h"

/* A pass of <= POSITIONS positions over >= this many slots splits attention by bytes (attention_split.h) where its units
 * would be under 2 a thread (SmolLM2's decoding: 3 for 2; a verification's 9+ ran as fast unsplit: scripts/decode_profile.py) */
#define SPLIT_FROM 128

#include "step_bridge.h"
#include "step_profile.h"

#include "step_layer.h"

/* floats of a thread's attention scratch: the scores [POSITIONS GROUP, cap + 16], the sums [POSITIONS GROUP, D],
 * then POSITIONS masks' bytes [cap + 16] */
static int64_t per_thread_floats(const Dims *d) {
    return POSITIONS * GROUP * (d->cap + BLOCK + d->D) + POSITIONS * (d->cap + BLOCK) / 4 + 64;
}

/* The scratch floats c_step needs for r positions and a cache of cap slots on `threads` threads. */
int64_t c_step_scratch(const Dims *d, int64_t r, int64_t threads) {
    int64_t nqkv = (d->Hq + 2 * d->Hkv) * d->D;
    return r * (d->H + nqkv + d->Hq * d->D + d->H + 2 * d->I + d->I) + d->Hkv * blocks_of(d->cap) * BLOCK * d->D +
           threads * (per_thread_floats(d) + few_floats(d, r)) + POSITIONS * d->Hq * (d->cap + BLOCK) + /* attend_split's */
           deal_floats(d, threads);
}

/* What attention reads of one layer's pass: the queries [r, nqkv], the outputs [r, Hq D], what a position sees
 * (mask [r, L], or a chain's slots up to its own, within window: 0 for all) */
typedef struct {
    const float *qkv;
    float *att;
    const uint8_t *mask;
    int64_t nqkv, Hq, D, start, L, cap, window;
} Queries;

/* positions i0..i0+P-1 as query head `head` sees them, over the slots from *lo on (a chain's: the block of the
 * first's window start, the slots before a position's own unseen; 0 with a mask); own: the thread's masks' bytes
 * [POSITIONS, cap + 16] */
static void positions_of(const Queries *a, int64_t i0, int64_t P, int64_t head, uint8_t *own, Position *pos, int64_t *lo) {
    *lo = 0;
    if (!a->mask) {
        int64_t from = a->window && a->start + i0 + 1 > a->window ? a->start + i0 + 1 - a->window : 0;
        *lo = from / BLOCK * BLOCK;
    }
    for (int64_t p = 0; p < P; p++) {
        int64_t i = i0 + p, upto = a->start + i + 1;
        pos[p].q = a->qkv + i * a->nqkv + head * a->D;
        pos[p].out = a->att + (i * a->Hq + head) * a->D;
        if (a->mask) {
            pos[p].seen = a->mask + i * a->L;
            pos[p].n = a->L;
        } else { /* a chain: every slot of its range seen (NULL: no mask built nor read) but a window's first */
            int64_t from = a->window && upto > a->window ? upto - a->window : 0;
            uint8_t *mine = own + p * (a->cap + BLOCK);
            pos[p].n = upto - *lo;
            for (int64_t j = 0; j < pos[p].n && from > *lo; j++) mine[j] = *lo + j >= from;
            pos[p].seen = from > *lo ? mine : NULL;
        }
    }
}

/* The query heads of a key-value head that one attention unit takes (<= limit), for r positions on `threads`
 * threads: the count that makes the busiest thread's share least, a unit of g heads costing about 8 + g
 * (its keys' and values' loads, shared by its heads, weigh about 8 heads' arithmetic: SmolLM2's shapes at 800
 * slots, a rough model for the schedule alone; every count gives the same bits); the most on a tie. */
static int64_t heads_at_once(int64_t per, int64_t Hkv, int64_t r, int64_t threads, int64_t limit) {
    int64_t best = 1, cost = -1;
    for (int64_t g = per < limit ? per : limit; g >= 1; g--) {
        int64_t units = Hkv * ((per + g - 1) / g) * r, share = (units + threads - 1) / threads * (8 + g);
        if (cost < 0 || share < cost) best = g, cost = share;
    }
    return best;
}

/* One pass. h: [r, H], the embeddings of the fed ids in, overwritten (its last n_last rows: the last
 * layer's output, before the final norm). cos, sin: [T, r, rot], a layer's table Layer.rope. The fed positions' keys and values go
 * to slots start..start+r-1; position i sees slot j where seen_mask[i * (start + r) + j] (a tree
 * pass; window_mask instead in a layer with a window), or where j <= start + i and, in a layer with a
 * window W, j > start + i - W (seen_mask NULL: a chain). hidden_at[0..n_hidden): layers whose input (the residual stream
 * entering them) is copied to hidden [r, n_hidden * H]. Then logits [n_last, V] of the last n_last
 * positions: final_norm, and the output layer head (blocked [V / 16, H, 16], Dims.weights). scratch: floats, at
 * least c_step_scratch. Returns the threads it ran on. */
int c_step(const Layer *layers, const Dims *d, float *h, const float *cos, const float *sin, int64_t r,
              int64_t start, const uint8_t *seen_mask, const uint8_t *window_mask, const int64_t *hidden_at, int64_t n_hidden, float *hidden,
              const float *final_norm, const void *head, int64_t V, float *logits, int64_t n_last, float *scratch,
              int64_t threads) {
    const int64_t H = d->H, D = d->D, Hq = d->Hq, Hkv = d->Hkv, I = d->I, nqkv = (Hq + 2 * Hkv) * D, L = start + r;
    const int bf = d->kv != 0; /* the cache's element: bfloat16 */
    float *x = scratch, *qkv = x + r * H, *att = qkv + r * nqkv, *delta = att + r * Hq * D, *gu = delta + r * H,
          *act = gu + r * 2 * I, *kt = act + r * I, *per_thread = kt + Hkv * blocks_of(d->cap) * BLOCK * D;
    int ran = 1;
    PROFILE_ENTER();
    if (threads < 1) threads = 1;
    /* attention's units: a position's query heads of one key-value head (per), in groups of qg */
    const int64_t per = Hq / Hkv, qg = heads_at_once(per, Hkv, r, threads, GROUP_LIMIT), groups = (per + qg - 1) / qg;
    int64_t pp = POSITIONS_LIMIT < POSITIONS ? POSITIONS_LIMIT : POSITIONS; /* positions a unit takes: as many as keep 4 units a thread */
    while (pp > 1 && Hkv * groups * ((r + pp - 1) / pp) < 4 * threads) pp /= 2;
    /* few positions split across the threads (attend_split): its query heads in groups as even as GROUP allows */
    const int64_t split_groups = (per + GROUP_LIMIT - 1) / GROUP_LIMIT, split_qg = (per + split_groups - 1) / split_groups;
    const int64_t parts = dimension_parts(Hkv * split_groups, threads, D);
    float *shared = per_thread + threads * per_thread_floats(d), *own = shared + POSITIONS * Hq * (d->cap + BLOCK);
    const int few = r <= FEW_ROWS; /* every thread computes every row's row-by-row parts (step_layer.h) */
    Deal *deals = deals_at(own + threads * few_floats(d, r), d, threads); /* [call, thread]: deal.h */
#pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num();
        float *s = per_thread + t * per_thread_floats(d), *acc = s + POSITIONS * GROUP * (d->cap + BLOCK);
        uint8_t *seen = (uint8_t *)(acc + POSITIONS * GROUP * D);
        /* a few-row pass's own rows: this thread's residual stream, normed rows, activation, a delta's norm */
        float *hs = few ? own + t * few_floats(d, r) : h, *xs = few ? hs + r * H : x, *acts = few ? xs + r * H : act,
              *normed = few ? acts + r * I : NULL;
        if (few) memcpy(hs, h, r * H * sizeof(float));
        if (t == 0) ran = omp_get_num_threads();
        PROFILE_START();
        for (int64_t l = 0; l < d->layers; l++) {
            const Layer *w = layers + l;
            /* the rows past the keys and values: every row's but in the last layer, whose output only the
             * last n_last rows' logits read (a prompt's other positions there: their keys and values only) */
            const int64_t lo = l == d->layers - 1 ? r - n_last : 0, m = r - lo;
            const int64_t nth = omp_get_num_threads(), split = nth > 1 && m > 0 && m <= POSITIONS && L >= SPLIT_LIMIT &&
                                                              Hkv * groups * ((m + pp - 1) / pp) < 2 * nth;
            /* the residual from the layer before (its MLP's delta), the hidden states, the input norm */
            if (few) {
                own_rows(hs, l > 0 ? delta : NULL, l > 0 ? w[-1].mlp_out_norm : NULL, w->in_norm, xs, normed, 0, r, d);
                for (int64_t i = 0; i < r && t == 0; i++)
                    for (int64_t e = 0; e < n_hidden; e++)
                        if (hidden_at[e] == l) memcpy(hidden + (i * n_hidden + e) * H, hs + i * H, H * sizeof(float));
            } else {
#pragma omp for schedule(static)
                for (int64_t i = 0; i < r; i++) {
                    if (l > 0) add_residual(h + i * H, delta + i * H, w[-1].mlp_out_norm, d, delta + i * H);
                    for (int64_t e = 0; e < n_hidden; e++)
                        if (hidden_at[e] == l) memcpy(hidden + (i * n_hidden + e) * H, h + i * H, H * sizeof(float));
                    norm_or_copy(h + i * H, w->in_norm, d->eps, x + i * H, H);
                }
            }
            MARK(REST);
            skinny_rows_dealt(d->weights, d->tile, xs, w->qkv, w->qkv_bias, qkv, r, nqkv, H, deals + 4 * l * threads);
            bridge(d, w->o, H, Hq * D, c_step_bridge_bytes);
            SYNC(LINEARS);
            if (d->qk_norm == 2) { /* q and k normed over all their heads (OLMo 2) */
#pragma omp for schedule(static)
                for (int64_t i = 0; i < r; i++) {
                    rms_norm(qkv + i * nqkv, w->q_norm, d->eps, qkv + i * nqkv, Hq * D);
                    rms_norm(qkv + i * nqkv + Hq * D, w->k_norm, d->eps, qkv + i * nqkv + Hq * D, Hkv * D);
                }
            }
            /* q/k norms per head, RoPE on queries and keys; keys and values into the cache; then each key-value
             * head's keys in blocks of 16 slots (attention.h), shared by all its queries: kept beside the cache,
             * only the blocks from the first slot this pass wrote or not kept on (the last block, partial,
             * included: its lanes past L are 0 again, as a fresh transposition's); else in the scratch, from the
             * first block a chain's window reaches. The same keys either way (moves only). */
            const uint8_t *mask = w->window && window_mask ? window_mask : seen_mask;
            void *blocks = w->kept_blocks ? w->kept_blocks : (void *)kt; /* the scratch's: room for float32 ones */
            const int64_t nb = blocks_of(L),
                          first = w->kept_blocks ? (d->kept < start ? d->kept : start) / BLOCK
                                  : (!mask && w->window && start + 1 > w->window ? (start + 1 - w->window) / BLOCK : 0);
            if (few) {
                rope_and_blocks(qkv, w, d, cos, sin, r, start, blocks, first);
            } else {
#pragma omp for schedule(static) collapse(2)
                for (int64_t i = 0; i < r; i++)
                    for (int64_t head = 0; head < Hq + Hkv; head++) rope_head(qkv, i, head, w, d, cos, sin, r, start);
#pragma omp for schedule(static) collapse(2)
                for (int64_t kv = 0; kv < Hkv; kv++)
                    for (int64_t b = first; b < nb; b++)
                        key_blocks(kv_ptr(w->keys, kv * d->cap * D, bf), L, D, b, b + 1,
                                   kv_ptr(blocks, kv * blocks_of(d->cap) * BLOCK * D, bf), bf);
            }
            /* attention, units of up to pp positions' query heads that share a key-value head, in groups of up
             * to qg heads each (attend_positions: the same bits as one at a time, their loads shared). Key-value
             * head by head, so a thread's next units read the same head's slots (in L2 on a long pass), its
             * positions in spans as even as pairs allow, dealt round robin in a snake (snaked), as a later position
             * sees more slots (in blocks, the last rows' would all go to one thread; in plain rounds, each round's
             * dearer unit to the last thread). A chain's slots from the block of the unit's first window start: the
             * slots before a position's own unseen (a masked slot adds an exact 0, so a tree's row over all the
             * slots gives the same numbers). */
            MARK(REST);
            const Queries a = {qkv, att, mask, nqkv, Hq, D, start, L, d->cap, w->window};
            const int64_t stride = blocks_of(d->cap) * BLOCK * D;
            Position pos[POSITIONS];
            int64_t from;
            if (split) { /* few positions: every thread the same share of the bytes (attention_split.h) */
                positions_of(&a, lo, m, 0, seen, pos, &from);
                const Heads heads = {kv_ptr(blocks, from * D, bf), kv_ptr(w->values, from * D, bf), stride, d->cap * D, Hkv, per, split_qg, D,
                                     parts, d->scale, bf};
                attend_split(pos, (int)m, &heads, shared, s, acc);
#pragma omp barrier
            } else {
                const int64_t spans = (m + pp - 1) / pp, units = Hkv * spans * groups; /* spans: span_start */
#pragma omp for schedule(static, 1)
                for (int64_t k = 0; k < units; k++) {
                    const int64_t unit = snaked(k, units, nth), kv = unit / (spans * groups), span = unit / groups % spans, u = unit % groups;
                    const int64_t i0 = lo + span_start(span, spans, m, pp), P = lo + span_start(span + 1, spans, m, pp) - i0, head = kv * per + u * qg;
                    positions_of(&a, i0, P, head, seen, pos, &from);
                    attend_positions(pos, (int)P, (int)(per - u * qg < qg ? per - u * qg : qg), kv_ptr(blocks, kv * stride + from * D, bf),
                                     kv_ptr(w->values, (kv * d->cap + from) * D, bf), D, d->scale, s, acc, bf);
                }
            }
            MARK(ATTENTION);
            if (m > 0) skinny_rows_dealt(d->weights, d->tile, att + lo * Hq * D, w->o, w->o_bias, delta + lo * H, m, H, Hq * D, deals + (4 * l + 1) * threads);
            bridge(d, w->gate_up, 2 * I, H, c_step_bridge_bytes);
            SYNC(LINEARS);
            if (few) {
                own_rows(hs, delta, w->attn_out_norm, w->post_norm, xs, normed, lo, r, d);
            } else {
#pragma omp for schedule(static)
                for (int64_t i = lo; i < r; i++) {
                    add_residual(h + i * H, delta + i * H, w->attn_out_norm, d, delta + i * H);
                    norm_or_copy(h + i * H, w->post_norm, d->eps, x + i * H, H);
                }
            }
            MARK(REST);
            if (m > 0) skinny_rows_dealt(d->weights, d->tile, xs + lo * H, w->gate_up, NULL, gu + lo * 2 * I, m, 2 * I, H, deals + (4 * l + 2) * threads);
            bridge(d, w->down, H, I, c_step_bridge_bytes);
            SYNC(LINEARS);
            /* over rows and spans of columns: both threads busy at one position too (each element alone); a
             * few-row pass's in every thread, whole rows */
            if (few) {
                for (int64_t i = lo; i < r; i++) activate(gu + i * 2 * I, acts + i * I, 0, I, d);
            } else {
#pragma omp for schedule(static) collapse(2)
                for (int64_t i = lo; i < r; i++)
                    for (int64_t k0 = 0; k0 < I; k0 += SPAN) activate(gu + i * 2 * I, act + i * I, k0, k0 + SPAN < I ? k0 + SPAN : I, d);
            }
            MARK(REST);
            if (m > 0) skinny_rows_dealt(d->weights, d->tile, acts + lo * I, w->down, NULL, delta + lo * H, m, H, I, deals + (4 * l + 3) * threads);
            if (l + 1 < d->layers) bridge(d, w[1].qkv, nqkv, H, c_step_bridge_bytes);
            else bridge(d, head, V, H, c_step_bridge_bytes);
            SYNC(LINEARS);
        }
        /* the last layer's residual, the final norm of the last n_last positions, the output layer; a few-row
         * pass's residual stream back in h (the first thread's: every thread's holds the same bits) */
        if (few) {
            for (int64_t i = r - n_last; i < r; i++) {
                add_residual(hs + i * H, delta + i * H, layers[d->layers - 1].mlp_out_norm, d, normed);
                rms_norm(hs + i * H, final_norm, d->eps, xs + (i - (r - n_last)) * H, H);
            }
            if (t == 0) memcpy(h, hs, r * H * sizeof(float));
        } else {
#pragma omp for schedule(static)
            for (int64_t i = r - n_last; i < r; i++) {
                add_residual(h + i * H, delta + i * H, layers[d->layers - 1].mlp_out_norm, d, delta + i * H);
                rms_norm(h + i * H, final_norm, d->eps, x + (i - (r - n_last)) * H, H);
            }
        }
        MARK(REST);
        skinny_rows_dealt(d->weights, d->tile, xs, head, NULL, logits, n_last, V, H, deals + 4 * d->layers * threads);
        MARK(LINEARS);
        if (d->logit_divisor != 1.0f || d->softcap != 0.0f) {
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t i = 0; i < n_last; i++) finish_logits(logits + i * V, V, d);
        }
        MARK(REST);
    }
    PROFILE_JOINED();
    for (int64_t i = 0; d->tops && i < n_last; i++) ((Top *)d->tops)[i] = logits_top_row(logits + i * V, V);
    PROFILE_LEAVE();
    return ran;
}

/* logits_top_row of each row of logits [n, V] into out [n] (the tests' view of what c_step writes to Dims.tops) */
void logits_top(const float *logits, int64_t n, int64_t V, Top *out) {
    for (int64_t i = 0; i < n; i++) out[i] = logits_top_row(logits + i * V, V);
}
