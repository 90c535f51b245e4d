/* The C step's profiling build (-DSTEP_PROFILE, scripts/prompt_profile.py, scripts/decode_profile.py), included by
 * c_step.c after its constants: each thread's CPU seconds by part of the pass, and the A/B switches of the same
 * bits read at run time; without it, MARK is nothing and the limits are c_step.c's constants. */
#ifndef STEP_PROFILE_H
#define STEP_PROFILE_H
#ifdef STEP_PROFILE
/* A profiling build (-DSTEP_PROFILE, scripts/prompt_profile.py): each thread's CPU seconds by part of the
 * pass, summed over the threads since the last c_step_profile. CPU time, not wall time: with
 * OMP_WAIT_POLICY=passive a thread waiting at a barrier sleeps, so a part's figure is the work it did. */
#include <time.h>
enum { LINEARS, ATTENTION, REST, PARTS };
#define PROFILED_THREADS 64
static double profiled[PROFILED_THREADS][PARTS]; /* by thread (the first 64), then part */

static double waited[PROFILED_THREADS]; /* by thread: the seconds at the linears' barriers (SYNC) */

/* -DSTEP_PROFILE_WALL: wall seconds instead (a waiting thread's spin or sleep counted: scripts/sync_profile.py) */
static double cpu_now(void) {
    struct timespec t;
#ifdef STEP_PROFILE_WALL
    clock_gettime(CLOCK_MONOTONIC, &t);
#else
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
#endif
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the CPU seconds since this thread's last mark, to `part` */
#define MARK(part)                                                                            \
    do {                                                                                      \
        double now_ = cpu_now();                                                              \
        profiled[omp_get_thread_num() % PROFILED_THREADS][part] += now_ - since_;             \
        since_ = now_;                                                                        \
    } while (0)

int c_step_group = GROUP; /* attention's most query heads at once (1: one at a time): an A/B of the same bits */
int c_step_positions = POSITIONS; /* attention's most positions at once: the same */

/* a barrier after a linear: the time before it to `part`, the wait at it to this thread's `waited` */
#define SYNC(part)                                                                            \
    do {                                                                                      \
        MARK(part);                                                                           \
        _Pragma("omp barrier");                                                               \
        double then_ = cpu_now();                                                             \
        waited[omp_get_thread_num() % PROFILED_THREADS] += then_ - since_;                    \
        since_ = then_;                                                                       \
    } while (0)

/* c_step's wall seconds, summed since the last c_step_called: in the call; from its entry to its last thread's
 * start on the layers (the team woken); from the team's end to the return (the logits' tops) */
static double called[3], began[PROFILED_THREADS];
static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#define PROFILE_ENTER() const double entered_ = wall_now()
#define PROFILE_START()                                                                       \
    double since_ = cpu_now();                                                                \
    began[omp_get_thread_num() % PROFILED_THREADS] = wall_now()
#define PROFILE_JOINED() const double joined_ = wall_now()
#define PROFILE_LEAVE()                                                                       \
    do {                                                                                      \
        double last_ = entered_;                                                              \
        for (int t_ = 0; t_ < ran && t_ < PROFILED_THREADS; t_++) last_ = began[t_] > last_ ? began[t_] : last_; \
        called[0] += wall_now() - entered_, called[1] += last_ - entered_, called[2] += wall_now() - joined_; \
    } while (0)

/* out[0..3): called's seconds; then zeroed */
int c_step_called(double *out) {
    for (int i = 0; i < 3; i++) out[i] = called[i], called[i] = 0.0;
    return 3;
}

/* out[0..threads): each thread's seconds at SYNC's barriers since the last call (the first 64); then zeroed */
int c_step_waited(double *out, int threads) {
    for (int t = 0; t < threads && t < PROFILED_THREADS; t++) out[t] = waited[t], waited[t] = 0.0;
    return threads < PROFILED_THREADS ? threads : PROFILED_THREADS;
}

/* out[0..3): linears, attention, the rest (CPU seconds since the last call, summed over the threads); then zeroed */
int c_step_profile(double *out) {
    for (int p = 0; p < PARTS; p++) {
        out[p] = 0.0;
        for (int t = 0; t < PROFILED_THREADS; t++) out[p] += profiled[t][p], profiled[t][p] = 0.0;
    }
    return PARTS;
}

/* out[0..3): c_step_profile's parts, the busiest thread's alone (the most CPU seconds of one thread), not zeroed */
int c_step_busiest(double *out) {
    for (int p = 0; p < PARTS; p++) {
        out[p] = 0.0;
        for (int t = 0; t < PROFILED_THREADS; t++) out[p] = profiled[t][p] > out[p] ? profiled[t][p] : out[p];
    }
    return PARTS;
}
int c_step_split_from = SPLIT_FROM; /* the fewest slots a pass of few positions splits its attention at: the same */
int c_step_prefetch = 1;            /* attention's software prefetches (attention_tiles.h; 0: none): the same */
int c_step_pairs = 1;               /* attention's score tiles of two positions (attention_tiles.h; 0: one): the same */
#define GROUP_LIMIT c_step_group
#define POSITIONS_LIMIT c_step_positions
#define SPLIT_LIMIT c_step_split_from
#else
#define MARK(part) ((void)0)
#define SYNC(part) _Pragma("omp barrier")
#define PROFILE_ENTER() ((void)0)
#define PROFILE_START() ((void)0)
#define PROFILE_JOINED() ((void)0)
#define PROFILE_LEAVE() ((void)0)
#define GROUP_LIMIT GROUP
#define POSITIONS_LIMIT POSITIONS
#define SPLIT_LIMIT SPLIT_FROM
#endif
#endif
