"""The catalog the plugins ship: the seed's 45 ops and 414 workloads, each buildable."""

from __future__ import annotations

import collections

import pytest

from npuops import InputRNG
from npuops.registry import load_registry

REGISTRY = load_registry(strict=True)
WORKLOADS = [w for op in REGISTRY.ops.values() for w in op.workloads]


def test_counts_match_the_seed():
    families = collections.Counter(op.family for op in REGISTRY.ops.values())
    assert families == {"norm": 23, "conv": 13, "pool": 8, "topk": 1}
    per_family = collections.Counter(REGISTRY.op(w.op).family for w in WORKLOADS)
    assert per_family == {"norm": 174, "conv": 208, "pool": 30, "topk": 2}
    assert len(WORKLOADS) == 414


def test_workload_ids_are_unique_per_op():
    for op in REGISTRY.ops.values():
        ids = [w.id for w in op.workloads]
        assert len(ids) == len(set(ids)), op.name


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.key)
def test_every_workload_builds_on_meta_and_costs_something(w):
    op = REGISTRY.op(w.op)
    op.validate(w)
    inputs = op.make_inputs(w, InputRNG("meta"))
    assert inputs and all(t.device.type == "meta" for t in inputs.values())
    for name, shape in w.shapes.items():
        if name in inputs:
            assert tuple(inputs[name].shape) == tuple(shape), (name, inputs[name].shape)
    cost = op.cost(w)
    assert cost.bytes > 0 and cost.flops >= 0
    assert op.memory_bytes(w) > cost.bytes // 2


def test_every_op_has_semantics_and_baselines():
    for op in REGISTRY.ops.values():
        assert op.summary and op.__doc__ and len(op.__doc__) > 40, op.name
        names = {i.name for i in REGISTRY.impls_for(op.name)}
        assert {"torch_eager", "torch_compile", "torch_compile_reduce_overhead"} <= names, op.name
