"""CPU kernels and compile caches, apart from the runners that use them.

    skinny.py / skinny_gemm.c  the skinny kernel: float32 linears over a few positions, built here at first use
    bf16.py / skinny_bf16.c    the same on bfloat16 weights (float32 sums): the path this CPU takes, named
    skinny_bf16_dot.c          the avx512_bf16 dot's prompt GEMM: a chunk's rows rounded once, whole-k register tiles
    skinny_amx.c               bfloat16 linears on Intel's AMX tiles (TDPBF16PS, the blocked weights in place)
    prepacking.py              ``PrepackedLinear``: each pass width on the kernel measured fastest for it
    plans.py                   a model's kernel plan as a whole: switched for a block, its unused copies freed, named
    holding.py                 one option's copy of the weights at a time (the start-up's kernel measurement)
    compile_cache.py           inductor's on-disk caches in the project's cache folder
    row_topk.py / row_topk.c   a logits row's few largest values in one C read (NASD's filler top-k), a small library of its own

``runners`` re-exports what callers use of them (``runners.kernels``, ``set_prepack``...).
"""
