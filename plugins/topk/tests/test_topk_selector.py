"""TopkSelectorFwd: reference against a sort, the judge of selections, inputs, costs, workloads."""

import dataclasses

import pytest
import torch

from npuops import InputRNG, Workload, WorkloadError
from npuops.check import check
from npuops.devices import CPUDevice
from npuops.registry import load_registry


@pytest.fixture(scope="module")
def op():
    return load_registry().op("TopkSelectorFwd")


def workload(batch=1, seq_len=64, seq_len_kv=256, kv_group=1, dtype="f32", **params):
    return Workload(
        op="TopkSelectorFwd", id="T", label="test", dtype=dtype,
        shapes={"index_score": [batch, seq_len, seq_len_kv, kv_group], "starts": [batch, seq_len], "ends": [batch, seq_len]},
        shape_dtypes={"starts": "i32", "ends": "i32"},
        params={"batch": batch, "seq_len": seq_len, "seq_len_kv": seq_len_kv, "kv_group": kv_group, **params},
    )


SMALL = [
    dict(topk=16),
    dict(topk=32, prefix_len=0),  # rows 0..30 have fewer keys than topk
    dict(topk=32, prefix_len=0, padded_rows=6),  # and 6 rows with no key at all
    dict(topk=16, prefix_len=100, batch=2, kv_group=3, padded_rows=1),
    dict(topk=64, seq_len=5, seq_len_kv=77, prefix_len=40),
]


def inputs_of(op, w, seed=0):
    return op.make_inputs(w, InputRNG("cpu", seed))


def top_by_sort(scores, starts, ends, topk):
    """Per (batch, row, group): the positions of the topk largest valid scores, by a full sort."""
    batch, seq_len, _, kv_group = scores.shape
    rows = {}
    for b in range(batch):
        for s in range(seq_len):
            start, end = int(starts[b, s]), int(ends[b, s])
            for g in range(kv_group):
                order = scores[b, s, start:end, g].double().sort(descending=True, stable=True).indices
                rows[b, s, g] = set((order[:topk] + start).tolist())
    return rows


@pytest.mark.parametrize("params", SMALL)
def test_reference_matches_a_sort(op, params):
    w = workload(**params)
    op.validate(w)
    inputs = inputs_of(op, w)
    ref = op.reference(inputs, w).indices
    topk = params["topk"]
    assert ref.dtype == torch.int32 and tuple(ref.shape) == (*w.shapes["index_score"][:2], w.shapes["index_score"][3], topk)
    expected = top_by_sort(inputs["index_score"], inputs["starts"], inputs["ends"], topk)
    for (b, s, g), keys in expected.items():
        row = ref[b, s, g].tolist()
        chosen = [i for i in row if i != -1]
        assert set(chosen) == keys and len(chosen) == len(keys)  # random f32 scores: no ties
        assert row.count(-1) == topk - len(keys)


def test_inputs_are_a_causal_prefill_over_a_cached_prefix(op):
    w = workload(batch=2, seq_len=64, seq_len_kv=256, topk=32, padded_rows=4)
    inputs = inputs_of(op, w)
    rows = torch.arange(64)
    expected_ends = torch.where(rows < 60, 256 - 64 + rows + 1, 0).int()
    assert inputs["starts"].dtype == inputs["ends"].dtype == torch.int32
    assert torch.equal(inputs["starts"], torch.zeros(2, 64, dtype=torch.int32))
    assert torch.equal(inputs["ends"], expected_ends.expand(2, 64))
    assert inputs["ends"][0, 59] == 252  # the last real row sees every key but the padding rows'
    assert inputs["index_score"].std() > 0.5


def test_small_prefix_gives_short_and_empty_rows(op):
    w = workload(topk=32, prefix_len=0, padded_rows=6)
    lengths = (lambda x: x["ends"] - x["starts"])(inputs_of(op, w))[0]
    assert int((lengths < 32).sum()) == 31 + 6 and int((lengths == 0).sum()) == 6


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("params", SMALL)
def test_baseline_matches_reference(op, params, dtype):
    w = workload(dtype=dtype, **params)
    result = check(op, w, op.torch_impl(w), CPUDevice(), seed=1)
    assert result.ok, result.detail


# -- the judge: ties may be broken either way, nothing else may differ ---------------------------

@pytest.fixture()
def tied(op):
    """Coarse scores (few distinct values, so ties at the threshold) and the reference's answer."""
    w = workload(topk=16, prefix_len=0, padded_rows=3)
    inputs = inputs_of(op, w)
    inputs["index_score"] = inputs["index_score"].mul(2).round()
    return w, inputs, op.reference(inputs, w)


def other_tie_break(inputs, topk):
    """A valid answer choosing, among tied scores, the highest key positions, in shuffled slots."""
    scores, starts, ends = inputs["index_score"], inputs["starts"], inputs["ends"]
    batch, seq_len, seq_len_kv, kv_group = scores.shape
    out = torch.full((batch, seq_len, kv_group, topk), -1, dtype=torch.int32)
    generator = torch.Generator().manual_seed(0)
    for b in range(batch):
        for s in range(seq_len):
            start, end = int(starts[b, s]), int(ends[b, s])
            for g in range(kv_group):
                row = scores[b, s, start:end, g].flip(0)
                picked = end - 1 - row.sort(descending=True, stable=True).indices[:topk]
                out[b, s, g, torch.randperm(topk, generator=generator)[: len(picked)]] = picked.int()
    return out


def test_judge_accepts_another_tie_break(op, tied):
    w, inputs, ref = tied
    alternative = other_tie_break(inputs, 16)
    assert not torch.equal(alternative.sort(-1).values, ref.indices.sort(-1).values)  # really differs
    assert op.compare(ref.indices, ref, w).ok
    result = op.compare(alternative, ref, w)
    assert result.ok, result.detail


def corrupt_index(indices, inputs, b, s):
    """A row of `indices` with one selected key swapped for the row's lowest-scoring valid key."""
    wrong = indices.clone()
    end = int(inputs["ends"][b, s])
    lowest = int(inputs["index_score"][b, s, :end, 0].argmin())
    slot = int((wrong[b, s, 0] != lowest).nonzero()[0])
    wrong[b, s, 0, slot] = lowest
    return wrong


def test_judge_rejects_a_wrong_index(op, tied):
    w, inputs, ref = tied
    wrong = corrupt_index(ref.indices, inputs, 0, 60)
    result = op.compare(wrong, ref, w)
    assert not result.ok and "top-k scores" in result.detail and "[0, 60, 0]" in result.detail


def test_judge_rejects_a_repeated_index(op, tied):
    w, inputs, ref = tied
    wrong = ref.indices.clone()
    wrong[0, 50, 0, 1] = wrong[0, 50, 0, 0]
    result = op.compare(wrong, ref, w)
    assert not result.ok and "twice" in result.detail


@pytest.mark.parametrize("row,index", [(40, 41), (40, 300), (40, -2), (62, 0)])
def test_judge_rejects_an_index_out_of_range(op, tied, row, index):
    w, _, ref = tied
    wrong = ref.indices.clone()
    slot = 0 if row != 62 else 5  # row 62 is padding: every slot must stay -1
    wrong[0, row, 0, slot] = index
    assert not op.compare(wrong, ref, w).ok


def test_judge_rejects_a_missing_key_in_a_short_row(op, tied):
    w, _, ref = tied
    wrong = ref.indices.clone()
    row = ref.indices[0, 5, 0]  # 6 valid keys, 10 slots of -1
    wrong[0, 5, 0, (row != -1).nonzero()[0]] = -1
    result = op.compare(wrong, ref, w)
    assert not result.ok and "-1 slots" in result.detail


def test_judge_rejects_wrong_dtype_and_shape(op, tied):
    w, _, ref = tied
    assert not op.compare(ref.indices.long(), ref, w).ok
    assert not op.compare(ref.indices[..., :-1], ref, w).ok
    assert not op.compare((ref.indices,), ref, w).ok


# -- catalog, costs, bad workloads ----------------------------------------------------------------

def test_catalog_workloads_build_on_meta(op):
    assert [w.id for w in op.workloads] == ["W1", "W2"]
    for w in op.workloads:
        op.validate(w)
        inputs = op.make_inputs(w, InputRNG("meta"))
        assert {k: tuple(v.shape) for k, v in inputs.items()} == {k: tuple(v) for k, v in w.shapes.items()}
        assert inputs["starts"].dtype == inputs["ends"].dtype == torch.int32
        out = op.torch_impl(w)(**inputs)
        assert tuple(out.shape) == (1, 32768, 1, w.params["topk"]) and out.dtype == torch.int32
        cost = op.cost(w)
        assert cost.bytes > 0 and cost.flops > 0
        scores = 1 * 32768 * 65536 * 4
        assert op.memory_bytes(w) > 4 * scores  # the inputs, a clone, another set and the masked copy


@pytest.mark.parametrize("params", SMALL)
def test_cost_counts_the_scores_inside_the_ranges(op, params):
    w = workload(**params)
    inputs = inputs_of(op, w)
    batch, seq_len, _, kv_group = w.shapes["index_score"]
    valid = int((inputs["ends"] - inputs["starts"]).clamp_min(0).sum())
    cost = op.cost(w)
    assert cost.flops == valid * kv_group
    assert cost.bytes == valid * kv_group * 4 + 2 * batch * seq_len * 4 + batch * seq_len * kv_group * params["topk"] * 4


def test_catalog_cost_reads_the_causal_half_and_more(op):
    w = op.workload("W1")
    prefix, rows = 65536 - 32768, 32768
    assert op.cost(w).flops == rows * prefix + rows * (rows + 1) // 2


@pytest.mark.parametrize("change,field", [
    (dict(params={"topk": 300}), "'topk'"),
    (dict(params={"topk": 0}), "'topk'"),
    (dict(params={"topk": 16, "prefix_len": 193}), "'prefix_len'"),
    (dict(params={"topk": 16, "padded_rows": 65}), "'padded_rows'"),
    (dict(params={"topk": 16, "seq_len": 63}), "'seq_len'"),
    (dict(params={"topk": 16}, shapes={"starts": [1, 63]}), "'starts'"),
    (dict(params={"topk": 16}, shape_dtypes={"starts": "i32", "ends": "i64"}), "'ends'"),
    (dict(params={"topk": 16}, shapes={"index_score": [1, 64, 256]}), "'index_score'"),
])
def test_bad_workload_names_the_field(op, change, field):
    w = workload(topk=16)
    params = {**w.params, **change.get("params", {})}
    shapes = {**w.shapes, **change.get("shapes", {})}
    w = dataclasses.replace(w, params=params, shapes=shapes, shape_dtypes=change.get("shape_dtypes", w.shape_dtypes))
    with pytest.raises(WorkloadError, match=field):
        op.validate(w)
