"""npuops_topk.topk_selector: a custom op computing TopkSelectorFwd, checked and traceable."""

from __future__ import annotations

import pytest
import torch

import npuops_topk
from npuops import InputRNG, Workload
from npuops.registry import load_registry

OP = load_registry(strict=True).op("TopkSelectorFwd")


def inputs_for(shape, topk, **params):
    b, s = shape[:2]
    w = Workload("TopkSelectorFwd", "T", "t", "f32", {"index_score": list(shape), "starts": [b, s], "ends": [b, s]},
                 params={"topk": topk, **params}, shape_dtypes={"starts": "i32", "ends": "i32"})
    return w, OP.make_inputs(w, InputRNG("cpu", seed=7))


def test_selects_like_the_reference():
    w, x = inputs_for((2, 16, 64, 1), 8, prefix_len=0)
    out = npuops_topk.topk_selector(x["index_score"], x["starts"], x["ends"], 8)
    assert out.dtype == torch.int32 and OP.compare(out, OP.reference(x, w), w).ok


def test_traces_and_passes_opcheck():
    _, x = inputs_for((1, 8, 32, 1), 4)
    args = (x["index_score"], x["starts"], x["ends"], 4)
    torch.library.opcheck(npuops_topk.topk_selector.custom_op, args)
    compiled = torch.compile(lambda *a: npuops_topk.topk_selector(*a), fullgraph=True, backend="aot_eager")
    assert compiled(*args).shape == (1, 8, 1, 4)


def test_wrong_index_dtype_is_named():
    _, x = inputs_for((1, 8, 32, 1), 4)
    with pytest.raises(ValueError, match="starts"):
        npuops_topk.topk_selector(x["index_score"], x["starts"].long(), x["ends"], 4)
