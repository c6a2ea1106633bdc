"""Judging a top-k selection whose order, and choice among tied scores, is left open.

An answer is right when, per row, its -1 slots number max(0, topk - valid keys), its other indices
are distinct keys of the row's range, and the scores they select are, as a multiset, the
reference's. Judging needs the scores, so the reference hands them over with its indices.
"""

import math
from dataclasses import replace
from typing import NamedTuple

import torch

from npuops import CheckResult


class Selection(NamedTuple):
    """The reference's answer and the inputs it was computed from."""

    indices: torch.Tensor  # [batch, seq_len, kv_group, topk] int32, -1 in unused slots
    scores: torch.Tensor  # [batch, seq_len, seq_len_kv, kv_group]
    starts: torch.Tensor  # [batch, seq_len]
    ends: torch.Tensor  # [batch, seq_len]


def selected_scores(scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Per row, the scores the indices select, in descending order; -inf for unused slots."""
    by_row = scores.permute(0, 1, 3, 2)  # [batch, seq_len, kv_group, seq_len_kv]
    picked = by_row.gather(-1, indices.clamp_min(0))
    return picked.masked_fill(indices < 0, -math.inf).sort(dim=-1, descending=True).values


def _failure(what: torch.Tensor, message: str) -> CheckResult:
    """A failed check naming the first offending [batch, seq_len, kv_group(, slot)] position."""
    where = what.nonzero()[0].tolist()
    return CheckResult(False, math.inf, math.inf, f"{message} at {where}")


def judge_selection(out, expected: Selection, topk: int) -> CheckResult:
    if not isinstance(out, torch.Tensor):
        return CheckResult(False, math.inf, math.inf, f"returned {type(out).__name__}, not a tensor")
    if out.shape != expected.indices.shape:
        return CheckResult(False, math.inf, math.inf, f"output has shape {tuple(out.shape)}, expected {tuple(expected.indices.shape)}")
    if out.dtype != torch.int32:
        return CheckResult(False, math.inf, math.inf, f"output has dtype {out.dtype}, expected torch.int32")
    indices = out.long()
    starts = expected.starts.long()[..., None, None]
    ends = expected.ends.long()[..., None, None]
    unused = indices == -1
    wanted_unused = (topk - (ends - starts).clamp_min(0)).clamp_min(0)
    wrong_count = unused.sum(dim=-1, keepdim=True) != wanted_unused
    if wrong_count.any():
        return _failure(wrong_count[..., 0], "the number of -1 slots is not max(0, topk - valid keys)")
    outside = ~unused & ((indices < starts) | (indices >= ends))
    if outside.any():
        return _failure(outside, "an index lies outside its row's key range [start, end)")
    ordered = indices.sort(dim=-1).values
    repeated = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] != -1)
    if repeated.any():
        return _failure(repeated.any(dim=-1), "a key is selected twice")
    got = selected_scores(expected.scores, indices)
    want = selected_scores(expected.scores, expected.indices.long())
    differ = (got != want).any(dim=-1)
    if differ.any():
        gap = float(torch.where(got == want, 0.0, (got - want).abs()).max())
        return replace(_failure(differ, "the selected scores are not the top-k scores of the row"), max_abs_error=gap)
    return CheckResult(True, 0.0, 0.0)
