/* A linear's register groups dealt to the threads of a pass of a few positions (issue 71), included by the row
 * loops (skinny_gemm.c, skinny_bf16_rows.c, bf16_few.h) and by c_step.c, which owns the counters.
 *
 * Before, each thread took an even, static share of a linear's groups; a thread the memory system or the VM
 * served slower made the other wait at each of a layer's barriers. Here a linear called with a Deal gives each
 * thread a static, contiguous share of its first groups (1 - skinny_deal_tail of them: the streams the hardware
 * prefetchers follow) and deals the rest (the tail) in chunks of about skinny_deal_bytes of weights, each taken
 * from the Deal's shared counter by whichever thread comes first, so the threads finish about together. The last
 * thread's static share runs into the tail: its stream goes on where the chunks start.
 *
 * Only who computes a group changes: every output is the chain its tile computes for it in any share (the same
 * bits, tests/test_deal.py). A Deal's counter starts at 0 for one call: c_step.c zeroes one per linear call of a
 * pass (a layer's four and the output layer's) before its parallel region, so no barrier resets it. */
#ifndef DEAL_H
#define DEAL_H
#include <stdint.h>
#include <omp.h>

/* the counter of one linear call: chunks taken so far; a cache line of its own (threads hammer it, nothing else) */
typedef struct {
    int64_t taken;
    int64_t pad[7];
} Deal;

/* percent of a linear's groups dealt in chunks (0: the static share alone; 100: every group dealt); set per
 * process (skinny_set_deal, linears.h), read once per call */
extern int64_t skinny_deal_tail;
/* weights' bytes a dealt chunk holds at least (one group where a group holds more) */
extern int64_t skinny_deal_bytes;

/* one thread's walk over a linear's `units` groups: its static range, then the tail's chunks */
typedef struct {
    int64_t at, end;   /* the range being handed out, [at, end) */
    int64_t head;      /* groups [0, head) are shared statically, [head, units) dealt */
    int64_t units, chunk;
    Deal *deal;        /* NULL: the static share of every group */
    int started;
} Share;

/* this thread's walk over `units` groups of `group_bytes` each (deal NULL or one thread: its static share alone),
 * its chunks a multiple of `align` units */
static inline Share share_begin(int64_t units, int64_t group_bytes, int64_t align, Deal *deal) {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    Share s = {0, 0, units, units, 1, NULL, 0};
    if (deal && threads > 1 && skinny_deal_tail > 0) {
        int64_t tail = (units * (skinny_deal_tail < 100 ? skinny_deal_tail : 100) + 99) / 100;
        s.head = units - tail, s.deal = deal;
        s.chunk = group_bytes > 0 && skinny_deal_bytes > group_bytes ? skinny_deal_bytes / group_bytes : 1;
        s.chunk = (s.chunk + align - 1) / align * align;
    }
    s.at = s.head * t / threads, s.end = s.head * (t + 1) / threads;
    return s;
}

/* the next range [*first, *last) of groups this thread computes; 0 when there is none left */
static inline int share_next(Share *s, int64_t *first, int64_t *last) {
    if (!s->started) {
        s->started = 1;
        if (s->at < s->end) {
            *first = s->at, *last = s->end;
            return 1;
        }
    }
    if (!s->deal) return 0;
    int64_t i = s->head + __atomic_fetch_add(&s->deal->taken, s->chunk, __ATOMIC_RELAXED);
    if (i >= s->units) return 0;
    *first = i, *last = i + s->chunk < s->units ? i + s->chunk : s->units;
    return 1;
}

#endif
