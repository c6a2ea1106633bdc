"""npuops_pool's functions: F.*'s signatures and results, traceable, checked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import npuops_pool as P

CASES = [
    (P.avg_pool1d, F.avg_pool1d, (2, 3, 17), (3, 2, 1), {}),
    (P.avg_pool1d, F.avg_pool1d, (2, 3, 16), (4, 2, 1, True, False), {}),
    (P.avg_pool2d, F.avg_pool2d, (2, 3, 11, 13), ([3, 5], 2, [1, 2], True, False), {}),
    (P.avg_pool2d, F.avg_pool2d, (2, 3, 11, 13), (3,), {"divisor_override": 7}),
    (P.avg_pool3d, F.avg_pool3d, (1, 2, 5, 9, 11), ([2, 3, 3], 2, 1, True, False), {}),
    (P.max_pool1d, F.max_pool1d, (2, 3, 20), (5, 2, 2, 2, True), {}),
    (P.max_pool2d, F.max_pool2d, (2, 3, 12, 13), (3, 2, 1), {}),
    (P.max_pool3d, F.max_pool3d, (1, 2, 5, 9, 9), (3, 2, 1), {"ceil_mode": True}),
    (P.adaptive_avg_pool2d, F.adaptive_avg_pool2d, (2, 3, 55, 57), ([7, 7],), {}),
    (P.adaptive_max_pool2d, F.adaptive_max_pool2d, (2, 3, 9, 4), ([4, 4],), {}),
]


@pytest.mark.parametrize("ours, theirs, shape, args, kwargs", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_functional(ours, theirs, shape, args, kwargs, dtype):
    x = torch.randn(shape).to(dtype)
    # PyTorch's CPU avg_pool3d has no bf16 kernel: compare with its f32 result, rounded.
    expected = theirs(x.float(), *args, **kwargs).to(dtype)
    torch.testing.assert_close(ours(x, *args, **kwargs), expected)


INDEX_CASES = [
    (P.max_pool1d_with_indices, F.max_pool1d, (2, 3, 20), (5, 2, 2, 2, True), {}),
    (P.max_pool2d_with_indices, F.max_pool2d, (2, 3, 12, 13), (3, 2, 1), {}),
    (P.max_pool2d_with_indices, F.max_pool2d, (1, 2, 9, 9), ([2, 3], 1, 0, 2), {}),
    (P.max_pool3d_with_indices, F.max_pool3d, (1, 2, 5, 9, 9), (3, 2, 1), {"ceil_mode": True}),
    (P.adaptive_max_pool2d_with_indices, F.adaptive_max_pool2d, (2, 3, 9, 4), ([4, 4],), {}),
]


@pytest.mark.parametrize("ours, theirs, shape, args, kwargs", INDEX_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pools_with_indices_match_return_indices(ours, theirs, shape, args, kwargs, dtype):
    # Rounded to a few values, so windows hold ties (the first in window order wins), and a NaN.
    x = torch.randint(-3, 4, shape).to(dtype)
    x.view(-1)[5] = float("nan")
    values, indices = ours(x, *args, **kwargs)
    expected_values, expected_indices = theirs(x.float(), *args, **kwargs, return_indices=True)
    torch.testing.assert_close(values, expected_values.to(dtype), equal_nan=True)
    assert indices.dtype == torch.int64 and torch.equal(indices, expected_indices)


def test_traces_in_torch_compile():
    def net(x):
        return P.adaptive_avg_pool2d(P.max_pool2d(x, 3, 2, 1), [1, 1])

    x = torch.randn(2, 8, 16, 16)
    torch.testing.assert_close(torch.compile(net, fullgraph=True, backend="aot_eager")(x), net(x))


def test_opcheck():
    torch.library.opcheck(P.max_pool2d, (torch.randn(2, 3, 12, 12), [3, 3], [2, 2], [1, 1]))
    torch.library.opcheck(P.avg_pool1d, (torch.randn(2, 3, 17), [3]))
    torch.library.opcheck(P.max_pool3d_with_indices, (torch.randn(1, 2, 5, 9, 9), [3, 3, 3], [2, 2, 2], [1, 1, 1]))


@pytest.mark.parametrize("call, message", [
    (lambda: P.max_pool2d(torch.randn(1, 2, 8, 8), 3, 2, 2), "param 'padding' = 2 along H_in must be at most half"),
    (lambda: P.avg_pool2d(torch.randn(1, 2, 8, 8), 3, divisor_override=0), "'divisor_override' must be nonzero"),
    (lambda: P.max_pool2d(torch.ones(1, 2, 8, 8, dtype=torch.int32), 2), "must be a bf16, f16 or f32 tensor"),
])
def test_bad_arguments_say_what_is_wrong(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)
