"""npuops_pool's functions: drop-ins for torch.nn.functional's (the same arguments, the same
results, the same errors), traceable, differentiable, counted in coverage()."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
import torch.nn.functional as F

import npuops_pool as P
from npuops_pool import functional as PF
from npuops.functional import coverage, reset_coverage

# (function name, input shape, args, kwargs): every form F takes that a model may pass.
FORMS = [
    # sliding windows: ints, one-value and full tuples and lists, stride None and (), ceil_mode
    ("avg_pool1d", (2, 3, 17), (3, 2, 1), {}),
    ("avg_pool1d", (2, 3, 16), (4, 2, 1, True, False), {}),
    ("avg_pool1d", (3, 17), ((3,), (), (1,)), {}),
    ("avg_pool1d", (2, 3, 17), ([4],), {"stride": [3], "ceil_mode": True}),
    ("avg_pool2d", (2, 3, 11, 13), ([3, 5], 2, [1, 2], True, False), {}),
    ("avg_pool2d", (2, 3, 11, 13), (3,), {"divisor_override": 7}),
    ("avg_pool2d", (3, 11, 13), ((3,), (), (1,)), {"ceil_mode": True, "count_include_pad": False}),
    ("avg_pool2d", (2, 3, 11, 13), ((2, 3), None, (1, 1), False, True, 5), {}),
    ("avg_pool3d", (1, 2, 5, 9, 11), ([2, 3, 3], 2, 1, True, False), {}),
    ("avg_pool3d", (2, 5, 9, 11), (3, (1, 2, 2), (1,)), {"divisor_override": 16}),
    ("max_pool1d", (2, 3, 20), (5, 2, 2, 2, True), {}),
    ("max_pool1d", (3, 20), ([3], (), [1]), {"dilation": (2,)}),
    ("max_pool2d", (2, 3, 12, 13), (3, 2, 1), {}),
    ("max_pool2d", (3, 12, 13), ((3,), ()), {"padding": (1,), "dilation": [2, 1], "ceil_mode": True}),
    ("max_pool2d", (2, 3, 9, 9), ([2, 3], 1, 0, 2), {}),
    ("max_pool3d", (1, 2, 5, 9, 9), (3, 2, 1), {"ceil_mode": True}),
    ("max_pool3d", (2, 5, 9, 9), ((2, 3, 3), None, (1,), (1, 2, 1)), {}),
    # adaptive: int, list, None entries (the input's size), unbatched
    ("adaptive_avg_pool2d", (2, 3, 55, 57), ([7, 7],), {}),
    ("adaptive_avg_pool2d", (3, 10, 9), (4,), {}),
    ("adaptive_avg_pool2d", (2, 3, 10, 9), ((None, 4),), {}),
    ("adaptive_avg_pool2d", (2, 3, 10, 9), ([5, None],), {}),
    ("adaptive_max_pool2d", (2, 3, 9, 4), ([4, 4],), {}),
    ("adaptive_max_pool2d", (3, 9, 7), ((None, 3),), {}),
    # forms the op does not express (torch's function runs them): empty inputs, zero output sizes
    ("max_pool2d", (0, 3, 8, 8), (2,), {}),
    ("max_pool2d", (0, 8, 8), (2,), {}),
    ("avg_pool1d", (0, 3, 8), (2,), {}),
    ("avg_pool3d", (0, 2, 4, 4, 4), (2,), {}),
    ("adaptive_avg_pool2d", (2, 3, 8, 8), ((0, 3),), {}),
    ("adaptive_max_pool2d", (0, 3, 8, 8), (2,), {}),
]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _expected(name, x, *args, **kwargs):
    """F's result; where PyTorch's CPU function has no 16-bit kernel (avg_pool3d) its f32 result,
    rounded, as the op's formulation computes it there (an empty input goes to F, which raises)."""
    try:
        return getattr(F, name)(x, *args, **kwargs)
    except NotImplementedError:
        if x.numel() == 0:
            raise
        assert name == "avg_pool3d" and x.dtype in (torch.float16, torch.bfloat16)
        result = getattr(F, name)(x.float(), *args, **kwargs)
        return result.to(x.dtype)


def _same(got, expected):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _same(g, e)
        return
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype
    if expected.is_floating_point():
        torch.testing.assert_close(got, expected, equal_nan=True)
    else:
        assert torch.equal(got, expected)


@pytest.mark.parametrize("name, shape, args, kwargs", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_torch_functional(name, shape, args, kwargs, dtype):
    x = torch.randn(shape).to(dtype)
    _same_or_raises(name, x, args, kwargs)
    if name.startswith(("max", "adaptive_max")):
        _same_or_raises(name, x, args, {**kwargs, "return_indices": True})


def _same_or_raises(name, x, args, kwargs):
    """Ours returns what F returns, or raises as it does (F.max_pool2d refuses an unbatched input
    with no channels that it takes with return_indices)."""
    try:
        expected = _expected(name, x, *args, **kwargs)
    except Exception as exc:
        with pytest.raises(type(exc)):
            getattr(P, name)(x, *args, **kwargs)
        return
    _same(getattr(P, name)(x, *args, **kwargs), expected)


def _layouts(shape):
    x = torch.randn(shape)
    yield "transposed", x.transpose(-1, -2)
    yield "strided", torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]
    if len(shape) == 4:
        yield "channels_last", x.to(memory_format=torch.channels_last)
    if len(shape) == 5:
        yield "channels_last_3d", x.to(memory_format=torch.channels_last_3d)


LAYOUT_FORMS = [
    ("max_pool2d", (2, 3, 12, 13), (3, 2, 1), {}),
    ("max_pool3d", (1, 2, 6, 9, 8), (2,), {"ceil_mode": True}),
    ("avg_pool2d", (2, 3, 12, 13), (3, 2, 1), {"count_include_pad": False}),
    ("avg_pool3d", (1, 2, 6, 9, 8), (2,), {}),
    ("avg_pool1d", (2, 3, 12), (3, 2), {}),
    ("adaptive_avg_pool2d", (2, 3, 12, 13), ((5, None),), {}),
    ("adaptive_max_pool2d", (2, 3, 12, 13), (5,), {"return_indices": True}),
]


@pytest.mark.parametrize("name, shape, args, kwargs", LAYOUT_FORMS)
def test_non_contiguous_and_channels_last_inputs(name, shape, args, kwargs):
    for _, x in _layouts(shape):
        _same(getattr(P, name)(x, *args, **kwargs), getattr(F, name)(x, *args, **kwargs))


def test_ties_and_nan_indices_match():
    # Rounded to a few values, so windows hold ties (the first in window order wins), and a NaN.
    for name, shape, args in [("max_pool1d", (2, 3, 20), (5, 2, 2, 2, True)), ("max_pool2d", (2, 3, 12, 13), (3, 2, 1)),
                              ("max_pool3d", (1, 2, 5, 9, 9), (3, 2, 1)), ("adaptive_max_pool2d", (2, 3, 9, 4), (4,))]:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randint(-3, 4, shape).to(dtype)
            x.view(-1)[5] = float("nan")
            _same(getattr(P, name)(x, *args, return_indices=True), getattr(F, name)(x, *args, return_indices=True))


@pytest.mark.parametrize("name, args", [
    ("max_pool1d_with_indices", (5, 2, 2, 2, True)),
    ("max_pool2d_with_indices", ((3, 2), None, 1)),
    ("max_pool3d_with_indices", (3, 2, 1)),
    ("adaptive_max_pool2d_with_indices", ((4, None),)),
])
@pytest.mark.parametrize("return_indices", [False, True])
def test_with_indices_return_both_as_torch(name, args, return_indices):
    dims = 1 if "1d" in name else 3 if "3d" in name else 2
    x = torch.randn((2, 3, 9, 10, 11)[:dims + 2])
    got = getattr(P, name)(x, *args, return_indices=return_indices)
    _same(got, getattr(F, name)(x, *args, return_indices=return_indices))
    _same(getattr(P, name)(x[0], *args), getattr(F, name)(x[0], *args))  # unbatched


def test_integer_inputs_as_torch():
    x = torch.randint(-50, 50, (2, 3, 8, 8))
    _same(P.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1))
    _same(P.max_pool3d(x, 2, return_indices=True), F.max_pool3d(x, 2, return_indices=True))
    _same(P.avg_pool2d(x, 2), F.avg_pool2d(x, 2))
    with pytest.raises(NotImplementedError):
        P.adaptive_avg_pool2d(x, 2)  # as torch: no integer kernel


@pytest.mark.parametrize("call", [
    lambda f, x: f.max_pool2d(x, 3, 2, 2),                      # padding over half the kernel
    lambda f, x: f.max_pool2d(x[0], 3, 2, 2),
    lambda f, x: f.max_pool1d(x[0], 3, 1, 2, 2),
    lambda f, x: f.max_pool2d(x, 3, 0),                         # stride 0
    lambda f, x: f.max_pool2d(x, 9),                            # no output
    lambda f, x: f.max_pool2d(x, -1),
    lambda f, x: f.max_pool2d(x, [3, 3, 3]),                    # a tuple of the wrong length
    lambda f, x: f.max_pool2d(x, 2, ceil_mode=1),               # not a bool
    lambda f, x: f.max_pool2d(x[0, 0], 2),                      # rank
    lambda f, x: f.max_pool2d(x[:, :0], 2),                     # empty channels
    lambda f, x: f.max_pool1d(x[0].int(), 2),                   # no integer 1-d kernel
    lambda f, x: f.avg_pool2d(x, 3, divisor_override=0),
    lambda f, x: f.avg_pool2d(x, 2.5),
    lambda f, x: f.avg_pool1d(x[0], 2, divisor_override=2),     # not an argument of avg_pool1d
    lambda f, x: f.adaptive_avg_pool2d(x, (3,)),
    lambda f, x: f.adaptive_avg_pool2d(x, (3, -1)),
    lambda f, x: f.adaptive_max_pool2d(x, None),
    lambda f, x: f.max_pool2d([1.0], 2),
])
def test_errors_as_torch(call):
    x = torch.randn(1, 2, 8, 8)
    with pytest.raises(Exception) as theirs:
        call(F, x)
    with pytest.raises(Exception) as ours:
        call(P, x)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


GRAD_FORMS = [
    ("max_pool1d", (3, 20), (3, 2, 1), {}),
    ("max_pool2d", (2, 3, 12, 13), (3, 2, 1), {"dilation": 2}),
    ("max_pool2d", (3, 12, 13), ((3,), ()), {"ceil_mode": True, "return_indices": True}),
    ("max_pool3d", (1, 2, 5, 9, 9), (3, 2, 1), {"return_indices": True}),
    ("avg_pool1d", (2, 3, 17), (3, 2, 1), {"count_include_pad": False}),
    ("avg_pool2d", (3, 11, 13), ([3, 5], 2, [1, 2], True), {"divisor_override": 7}),
    ("avg_pool3d", (1, 2, 5, 9, 11), (2, 2, 1, True, False), {}),
    ("adaptive_avg_pool2d", (2, 3, 10, 9), ((None, 4),), {}),
    ("adaptive_max_pool2d", (3, 10, 9), (4,), {"return_indices": True}),
    ("max_pool2d", (0, 3, 8, 8), (2,), {}),
]


@pytest.mark.parametrize("name, shape, args, kwargs", GRAD_FORMS)
def test_gradients_match_torch(name, shape, args, kwargs):
    x = torch.randn(shape)
    grads = []
    for module in (F, P):
        leaf = x.clone().requires_grad_()
        out = getattr(module, name)(leaf, *args, **kwargs)
        values = out[0] if isinstance(out, tuple) else out
        weights = torch.arange(values.numel(), dtype=values.dtype).reshape(values.shape).sin()
        (values * weights).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0])


def test_traces_in_torch_compile():
    def net(x):
        y, indices = P.max_pool2d(x, 3, 2, 1, return_indices=True)
        return P.adaptive_avg_pool2d(P.max_pool2d(y, (2,), ()), [1, None]), indices

    def reference(x):
        y, indices = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        return F.adaptive_avg_pool2d(F.max_pool2d(y, (2,), ()), [1, None]), indices

    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    for x in (torch.randn(2, 8, 16, 16), torch.randn(8, 16, 16)):
        _same(compiled(x), reference(x))
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    compiled(x)[0].sum().backward()
    got, x.grad = x.grad, None
    reference(x)[0].sum().backward()
    torch.testing.assert_close(got, x.grad)


def test_opcheck():
    torch.library.opcheck(PF._MAX_POOLS[2].custom_op, (torch.randn(2, 3, 12, 12), [3, 3], [2, 2], [1, 1]))
    torch.library.opcheck(PF._AVG_POOLS[1].custom_op, (torch.randn(2, 3, 17), [3], [3], [0]))
    torch.library.opcheck(PF._MAX_POOLS_WITH_INDICES[3].custom_op,
                          (torch.randn(1, 2, 5, 9, 9), [3, 3, 3], [2, 2, 2], [1, 1, 1]))
    torch.library.opcheck(PF._adaptive_max_pool2d_with_indices.custom_op, (torch.randn(2, 3, 9, 7), [4, 3]))


def test_coverage_counts_calls():
    reset_coverage()
    x = torch.randn(2, 3, 8, 8)
    P.max_pool2d(x, 2)
    P.max_pool2d(x[0], 2)
    P.max_pool2d(x, 2, return_indices=True)
    P.max_pool2d(x[:0], 2)
    P.adaptive_avg_pool2d(x, (None, 3))
    table = coverage()
    assert table["max_pool2d"] == {"ours": 0, "torch": 3, "why": {"cpu device": 2, "empty input": 1}}
    assert table["max_pool2d_with_indices"] == {"ours": 0, "torch": 1, "why": {"cpu device": 1}}
    assert table["adaptive_avg_pool2d"] == {"ours": 0, "torch": 1, "why": {"cpu device": 1}}


def _torch_signature(name):
    """F's parameters as (name, default) pairs: from its Python signature, or for a builtin (and
    the boolean-dispatched max pools) from the first line of its docstring."""
    function = getattr(F, name)
    if name in ("max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool2d"):
        function = getattr(F, f"{name}_with_indices")
    try:
        return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]
    except (TypeError, ValueError):
        pass
    head = function.__doc__.strip().splitlines()[0]
    params = head[head.index("(") + 1:head.index(")")].split(", ")
    return [(p.split("=")[0], ast.literal_eval(p.split("=")[1]) if "=" in p else inspect.Parameter.empty) for p in params]


@pytest.mark.parametrize("name", P.__all__)
def test_signatures_are_torch_functional(name):
    ours = [(p.name, p.default) for p in inspect.signature(getattr(P, name)).parameters.values()]
    assert ours == _torch_signature(name)


@pytest.mark.gpu
@pytest.mark.parametrize("name, args", [
    ("max_pool2d", (3, 2, 1)), ("avg_pool2d", (2,)), ("adaptive_avg_pool2d", ((7, 7),)),
    ("adaptive_max_pool2d", ((5, 3),)), ("max_pool1d", (3, 2)), ("avg_pool1d", (4, 4)),
    ("max_pool3d", (2, 2)), ("avg_pool3d", (3, 1, 1)),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_calls_of_many_sizes_run_our_kernel_and_match_torch(name, args, dtype):
    dims = 3 if name.endswith("3d") else 1 if name.endswith("1d") else 2
    reset_coverage()
    for batch, size in [(1, 20), (3, 33), (2, 57), (8, 64)]:
        x = torch.randn(batch, 16, *[max(size // (4 if dims == 3 else 1), 8)] * dims, device="cuda", dtype=dtype)
        torch.testing.assert_close(getattr(P, name)(x, *args), getattr(F, name)(x, *args), atol=1e-2, rtol=1e-2)
    (counts,) = coverage().values()
    assert counts["ours"] == 4, counts
