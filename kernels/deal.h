/* A linear's register groups shared among the threads of a pass with the ends stolen (issue 71), included by the row
 * loops (skinny_gemm.c, skinny_bf16_rows.c, bf16_few.h) and by c_step.c, which owns the counters.
 *
 * The static share gives each thread a contiguous range of a linear's groups, one stream the hardware prefetchers
 * follow; a thread the memory system or the VM served slower made the other wait at each of a layer's barriers.
 * Here each thread still takes its own range from the front, a step (a group's units) at a time, and a thread done
 * with its own takes half of what is left of the range with the most left, from its back, read forward (again until
 * none is left), so the threads finish within about a step of each other. Dealing the groups in chunks from one
 * counter instead (every chunk a new stream) cost one position's pass on Zen 4 more than the waits it saved: 1.12x
 * with every group dealt in 128 KB chunks, 1.06x with half, 1.01x with a quarter (float32; noisy, quiet pairs of an
 * interleaved run); and stealing a step at a time, each a stream read backwards from the last, 1.5x where thread 0
 * stole every range (skinny_deal 2).
 *
 * Only who computes a group changes: every output is the chain its tile computes for it in any share (the same
 * bits, tests/test_deal.py). A thread's Deal counts the steps taken from its range's front and back, both from 0:
 * c_step.c zeroes the Deals of every linear call of a pass before its parallel region, so no barrier resets them. */
#ifndef DEAL_H
#define DEAL_H
#include <stdint.h>
#include <omp.h>

/* one thread's range in one linear call: units taken from its front (low 32 bits) and back (high 32), in one word
 * so that one atomic operation sees both; a cache line of its own */
typedef struct {
    uint64_t taken;
    int64_t pad[7];
} Deal;

/* 1: the ends of the threads' ranges stolen (Deal); 0: the static share alone; 2: as 1, but thread 0 steals from
 * the start, its own range's front untaken (tests/test_deal.py: every call's steals, whatever the timing). Set per
 * process (skinny_set_deal, linears.h), read once per call; speed only, the same bits */
extern int64_t skinny_deal;

/* a thread's walk over a linear's `units`: its own range's front, then the others' backs */
typedef struct {
    int64_t units, step, t, threads;
    Deal *deals; /* [threads], one call's; NULL: the static share, one range */
    int done;    /* the static share's range handed out */
} Share;

/* thread v's range of `units`: [units v / threads, units (v + 1) / threads) */
static inline int64_t range_at(const Share *s, int64_t v) { return s->units * v / s->threads; }

/* this thread's walk over `units` (deals NULL or one thread: its static range alone), `step` units a take from the
 * front (a group's), whole steps from the back */
static inline Share share_begin(int64_t units, int64_t step, Deal *deals) {
    Share s = {units, step > 0 ? step : 1, omp_get_thread_num(), omp_get_num_threads(), NULL, 0};
    if (deals && s.threads > 1 && skinny_deal) s.deals = deals, s.done = skinny_deal == 2 && s.t == 0;
    return s;
}

/* units [*first, *last) taken from thread v's range: from its front (own) or its back; 0 when none is left */
static inline int take(Share *s, int64_t v, int own, int64_t *first, int64_t *last) {
    const int64_t lo = range_at(s, v), n = range_at(s, v + 1) - lo;
    uint64_t *word = &s->deals[v].taken;
    if (own) { /* one atomic add: the front's count may pass the end, read as nothing left */
        uint64_t was = __atomic_fetch_add(word, (uint64_t)s->step, __ATOMIC_RELAXED);
        int64_t f = (int64_t)(was & 0xFFFFFFFFu), b = (int64_t)(was >> 32);
        if (f >= n - b) return 0;
        *first = lo + f, *last = lo + (f + s->step < n - b ? f + s->step : n - b);
        return 1;
    }
    uint64_t was = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        int64_t f = (int64_t)(was & 0xFFFFFFFFu), b = (int64_t)(was >> 32), end = n - b;
        if (f >= end) return 0;
        /* half of what is left (whole steps), read forward: one long stream, where a step at a time backwards
         * cost each stolen group its stream's start (a pass whose thread 0 stole from the start: 1.5x float32) */
        int64_t half = ((end - f + 1) / 2 + s->step - 1) / s->step * s->step, from = end - half > f ? end - half : f;
        if (__atomic_compare_exchange_n(word, &was, was + ((uint64_t)(end - from) << 32), 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            *first = lo + from, *last = lo + end;
            return 1;
        }
    }
}

/* the next units [*first, *last) this thread computes; 0 when there are none left */
static inline int share_next(Share *s, int64_t *first, int64_t *last) {
    if (!s->deals) {
        if (s->done) return 0;
        s->done = 1, *first = range_at(s, s->t), *last = range_at(s, s->t + 1);
        return *first < *last;
    }
    if (!s->done && take(s, s->t, 1, first, last)) return 1;
    s->done = 1;
    for (;;) { /* the range with the most left (its own too: thread 0's under 2), from its back */
        int64_t most = 0, victim = -1;
        for (int64_t v = 0; v < s->threads; v++) {
            uint64_t w = __atomic_load_n(&s->deals[v].taken, __ATOMIC_RELAXED);
            int64_t left = range_at(s, v + 1) - range_at(s, v) - (int64_t)(w & 0xFFFFFFFFu) - (int64_t)(w >> 32);
            if (left > most) most = left, victim = v;
        }
        if (victim < 0) return 0;
        if (take(s, victim, 0, first, last)) return 1;
    }
}

/* A dealt group's end, y[M, N] for its columns n0 .. n0 + width: its sums copied from `spill` where the group ran past N
 * (spilled: the padded last block), then + b[j] after each output's chain (b NULL: none) */
static inline void group_out(const float *spill, int spilled, const float *b, float *y, int64_t M, int64_t N, int64_t n0,
                             int64_t width) {
    if (spilled)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; n0 + j < N; j++) y[i * N + n0 + j] = spill[i * width + j];
    if (b)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = n0; j < n0 + width && j < N; j++) y[i * N + j] += b[j];
}

#endif
