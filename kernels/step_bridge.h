/* The bridge over a pass's sync points (issue 71), included by c_step.c after Dims: when a thread has done its share
 * of a linear, before it waits at the barrier that follows, it asks for the first bytes of its share of the NEXT
 * linear's weights (the o after q/k/v, gate/up after o, down after gate/up, the next layer's q/k/v after down, the
 * output layer after the last down) as software prefetches into L2. So the memory keeps working while a thread waits
 * and through the compute-only parts that follow (norms, RoPE and the keys' blocks, attention, the activation), and
 * the next linear's streams start on lines already near instead of cold (the hardware prefetchers' ramp).
 *
 * Hints only: a prefetch changes no bit (tests/test_bridge.py: every pass's logits equal a STEP_BRIDGE_BYTES=0
 * build's). The share is the one decoding's loops deal a thread: float32, groups of 2 blocks dealt contiguously
 * (skinny_gemm.c's register block); bfloat16, an even share of the blocks streamed 4 at a time (skinny_bf16_rows.c's
 * one-position groups). Another loop's share (a pass of more positions, AMX) is near it: a few lines off cost
 * a little speed, never a bit. */
#ifndef STEP_BRIDGE_H
#define STEP_BRIDGE_H

/* bytes of its share of the next linear each thread prefetches by default (0: none, the code before). 0: on the Zen 4
 * EPYC VM (2 threads, SmolLM2-135M, 64 cached, beside another process: noisy) no bridge of 8-256 KB changed a pass
 * measurably, float32 or bfloat16 (medians within 1%, wall and CPU; scripts/sync_profile.py, scripts/pass_read.py
 * --bridges), where software prefetches 4 KB ahead inside bfloat16's streams cost it (kernels/ahead.py) */
#ifndef STEP_BRIDGE_BYTES
#define STEP_BRIDGE_BYTES 0
#endif
/* __builtin_prefetch's locality: 2, prefetcht1 on x86 (into L2: the bytes outlast L1 through the compute parts) */
#ifndef STEP_BRIDGE_LOCALITY
#define STEP_BRIDGE_LOCALITY 2
#endif
/* the bytes bridge asks for, per process (c_step_set_bridge: scripts/pass_read.py --bridges, tests/test_bridge.py) */
int64_t c_step_bridge_bytes = STEP_BRIDGE_BYTES;

/* c_step_bridge_bytes set to `bytes` (negative: left as it is); returns it after */
int64_t c_step_set_bridge(int64_t bytes) {
    if (bytes >= 0) c_step_bridge_bytes = bytes;
    return c_step_bridge_bytes;
}
#define BRIDGE_LINE 64    /* bytes of a cache line */
#define BRIDGE_FEATURES 16 /* output features per block of the blocked weights: one line per input feature in float32 */

/* The first `bytes` of this thread's share of a linear's blocked weights p ([N / 16, K, 16], Dims.weights' format),
 * prefetched in the order the decoding loop reads them: each group's blocks side by side, line by line. */
static void bridge(const Dims *d, const void *p, int64_t N, int64_t K, int64_t bytes) {
    if (bytes <= 0 || !p) return;
    const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads(), f32 = d->weights == 0;
    const int64_t group = f32 ? 2 : 4, block = K * BRIDGE_FEATURES * (f32 ? 4 : 2), blocks = (N + BRIDGE_FEATURES - 1) / BRIDGE_FEATURES;
    const int64_t groups = (blocks + group - 1) / group;
    int64_t first = f32 ? groups * t / threads * group : blocks * t / threads;
    int64_t last = f32 ? groups * (t + 1) / threads * group : blocks * (t + 1) / threads, left = bytes / BRIDGE_LINE;
    last = last < blocks ? last : blocks;
    for (int64_t b0 = first; b0 < last && left > 0; b0 += group) {
        const int64_t gb = last - b0 < group ? last - b0 : group;
        const char *base = (const char *)p + b0 * block;
        for (int64_t at = 0; at < block && left > 0; at += BRIDGE_LINE)
            for (int64_t g = 0; g < gb && left > 0; g++, left--) __builtin_prefetch(base + g * block + at, 0, STEP_BRIDGE_LOCALITY);
    }
}

#endif
