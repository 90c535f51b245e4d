/* The linears the C steps call (c_step.c, head_step.c), declared once and included where they are
 * defined too (skinny_gemm.c, skinny_bf16.c), so that a changed signature fails the build instead of
 * a call through a stale declaration. */
#ifndef LINEARS_H
#define LINEARS_H
#include <stdint.h>
#include "deal.h"

/* skinny_bf16.c: the linear for the weights' format: float32 blocked (skinny_gemm.c's, by its many-row
 * variant `tile`, skinny_tiles.c: the same bits whichever) or a bfloat16 path (`tile` not read) */
void skinny_rows_as(int64_t format, int64_t tile, const float *x, const void *p, const float *b, float *y, int64_t M, int64_t N,
                    int64_t K);
/* skinny_rows_as with decoding's loop (tile 0) sharing its groups by `deal` (deal.h: a Deal a thread; NULL: static) */
void skinny_rows_dealt(int64_t format, int64_t tile, const float *x, const void *p, const float *b, float *y, int64_t M, int64_t N,
                       int64_t K, Deal *deal);
/* skinny_gemm.c: skinny_rows with its groups shared by `deal` (NULL: the static share) */
void skinny_rows_deal(const float *x, const float *p, const float *b, float *y, int64_t M, int64_t N, int64_t K, Deal *deal);

/* skinny_gemm.c: how far ahead decoding's tiles prefetch their weight streams, in bytes, [0] on float32 weights
 * (skinny_gemm.c's tiles), [1] on bfloat16 (skinny_bf16.c's and skinny_amx.c's); 0: no software prefetch, the
 * hardware's alone. Speed only (a prefetch changes no bit): set per process by skinny_set_ahead, as measured
 * on the machine (kernels/ahead.py: 4 KB ahead paid on a Sapphire Rapids Xeon, and cost a Zen 4 EPYC VM). A
 * tile reads it once, before its loop. */
extern int64_t skinny_ahead[2];
#endif
