"""Decoding's float32 loop over 2..12 positions (kernels/f32_few.h: wider register tiles, the weights prefetched into
L2) computes every output by skinny_gemm.c's one chain over k in order, then + b: each row of a few-row linear has
the bits of that row alone (a one-position pass's loop), in each of the loop's variants, whatever the thread count,
a padded last block, a thread's shorter last group or the bias. A loop that summed in another order (k split, the
bias first) changes a bit here."""
import ctypes

import pytest
import torch

from kernels import skinny
from kernels.blocked import pack

pytestmark = pytest.mark.skipif(not skinny.available()[0], reason=f"the skinny kernel does not build here: {skinny.available()[1]}")

# kernels/f32_few.h's f32_few (on, shape, bytes ahead into L2, from rows): the loop before, its default, its parts
VARIANTS = [(0, 1, 4096, 4), (1, 1, 4096, 4), (1, 0, 4096, 4), (1, 1, 0, 4), (1, 1, 4096, 2), (1, 1, 64, 9), (2, 1, 4096, 1), (2, 0, 0, 4)]


def linear(library: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, bias, n: int, threads: int) -> torch.Tensor:
    out = torch.empty(x.shape[0], n)
    library.skinny_linear(x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                          x.shape[0], n, x.shape[1], threads)
    return out


@pytest.mark.parametrize("n,k", [(200, 576), (48, 37), (960, 64)])
def test_each_row_of_a_few_row_linear_has_the_bits_of_that_row_alone_in_every_variant(n, k):
    generator = torch.Generator().manual_seed(n + k)
    x, weight = torch.randn(13, k, generator=generator), torch.randn(n, k, generator=generator)
    bias, packed = torch.randn(n, generator=generator), pack(weight)
    library = skinny.library()
    setter = library.skinny_set_few32
    setter.argtypes, setter.restype = [ctypes.c_int64] * 5, ctypes.c_int64
    before = [setter(-1, -1, -1, -1, i) for i in range(4)]
    try:
        alone = {b is None: torch.cat([linear(library, x[i : i + 1], packed, b, n, 1) for i in range(13)]) for b in (bias, None)}
        for variant in VARIANTS:
            setter(*variant, 0)
            for rows in range(1, 14):
                for threads in (1, 2, 3):
                    for b in (bias, None):
                        many = linear(library, x[:rows].contiguous(), packed, b, n, threads)
                        assert torch.equal(many, alone[b is None][:rows]), (variant, rows, threads, b is None)
    finally:
        setter(*before, 0)
