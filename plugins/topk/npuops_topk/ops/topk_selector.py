"""TopkSelectorFwd."""

import math

import torch

from npuops import Cost, KernelOp, Param, WorkloadError, reference_math, tensor_bytes

from ._selection import Selection, judge_selection

SHAPE_PARAMS = ("batch", "seq_len", "seq_len_kv", "kv_group")


class TopkSelectorFwd(KernelOp):
    """DeepSeek-V3.2 sparse attention's top-k key selection (the lightning indexer's selector).

    Inputs: ``index_score: [batch, seq_len, seq_len_kv, kv_group]`` (finite scores of every query
    row against every key, per kv group), ``starts, ends: [batch, seq_len]`` int32, each query
    row's valid keys [start, end) with 0 <= start and end <= seq_len_kv (shared by its kv groups).

    Output: ``indices: [batch, seq_len, kv_group, topk]`` int32, TileOPs'/TileLang's
    ``topk_selector`` layout: for every (row, kv group) the key positions (absolute, in
    [0, seq_len_kv)) of the ``topk`` largest scores among the row's valid keys. A row with fewer
    than ``topk`` valid keys (possibly none) selects all of them and fills the remaining slots with
    -1. The order of a row's slots is unspecified, and among tied scores any may be chosen: an
    answer is judged by the multiset of scores it selects (see ``_selection``).

    The input builder makes a causal prefill over a cached prefix: key j is visible to query row r
    when j <= prefix_len + r, so start = 0 and end = prefix_len + r + 1, with prefix_len =
    seq_len_kv - seq_len unless stated; the last ``padded_rows`` rows are padding with the empty
    range [0, 0). Catalog rows therefore see 32769..65536 keys; small test workloads with
    prefix_len = 0 have rows with fewer than topk keys."""

    name = "TopkSelectorFwd"
    family = "topk"
    summary = "per query row, the int32 key indices of the top-k index scores in its valid range"
    required_tensors = ("index_score", "starts", "ends")
    params = {
        "batch": Param(None, "index_score.shape[0]", types=(int,)),
        "seq_len": Param(None, "index_score.shape[1]: query rows", types=(int,)),
        "seq_len_kv": Param(None, "index_score.shape[2]: keys", types=(int,)),
        "kv_group": Param(None, "index_score.shape[3]: kv groups, each selecting its own keys", types=(int,)),
        "topk": Param(2048, "keys selected per row (DeepSeek-V3.2's index_topk is 2048)", types=(int,)),
        "prefix_len": Param(None, "input builder: keys cached before the first query row; None = seq_len_kv - seq_len", types=(int,)),
        "padded_rows": Param(0, "input builder: trailing query rows that are padding, with no valid key", types=(int,)),
    }

    def check_workload(self, w, cfg):
        where = f"{self.name} {w.id}"
        score_shape = w.shapes["index_score"]
        if len(score_shape) != 4:
            raise WorkloadError(f"{where}: shape of 'index_score' {list(score_shape)} must be [{', '.join(SHAPE_PARAMS)}]")
        for i, name in enumerate(SHAPE_PARAMS):
            if cfg[name] is not None and cfg[name] != score_shape[i]:
                raise WorkloadError(f"{where}: param {name!r} = {cfg[name]} must equal index_score.shape[{i}] = {score_shape[i]}")
        if not w.dtype_of("index_score").is_floating_point:
            raise WorkloadError(f"{where}: dtype {w.dtype!r} of 'index_score' must be a floating-point dtype")
        for name in ("starts", "ends"):
            if tuple(w.shapes[name]) != tuple(score_shape[:2]):
                raise WorkloadError(f"{where}: shape of {name!r} {list(w.shapes[name])} must be [batch, seq_len] = {list(score_shape[:2])}")
            if w.dtype_of(name) != torch.int32:
                raise WorkloadError(f"{where}: 'shape_dtypes' must give {name!r} dtype 'i32'")
        seq_len, seq_len_kv = score_shape[1:3]
        if not 1 <= cfg["topk"] <= seq_len_kv:
            raise WorkloadError(f"{where}: param 'topk' = {cfg['topk']} must be in [1, seq_len_kv = {seq_len_kv}]")
        prefix_len, _ = self.ranges(w)
        if not 0 <= prefix_len <= seq_len_kv - seq_len:
            raise WorkloadError(
                f"{where}: param 'prefix_len' = {prefix_len} must be in [0, seq_len_kv - seq_len = {seq_len_kv - seq_len}]"
            )
        if not 0 <= cfg["padded_rows"] <= seq_len:
            raise WorkloadError(f"{where}: param 'padded_rows' = {cfg['padded_rows']} must be in [0, seq_len = {seq_len}]")

    def ranges(self, w) -> tuple[int, int]:
        """(prefix_len, the number of leading query rows that are not padding)."""
        cfg = self.config(w)
        _, seq_len, seq_len_kv, _ = w.shapes["index_score"]
        prefix_len = seq_len_kv - seq_len if cfg["prefix_len"] is None else cfg["prefix_len"]
        return prefix_len, seq_len - cfg["padded_rows"]

    def make_inputs(self, w, rng):
        batch, seq_len, _, _ = w.shapes["index_score"]
        prefix_len, real_rows = self.ranges(w)
        rows = torch.arange(seq_len, dtype=torch.int32, device=rng.device)
        ends = torch.where(rows < real_rows, rows + (prefix_len + 1), 0).to(torch.int32)
        return {
            "index_score": rng.normal(w.shapes["index_score"], w.dtype_of("index_score")),
            "starts": torch.zeros((batch, seq_len), dtype=torch.int32, device=rng.device),
            "ends": ends.expand(batch, seq_len).contiguous(),
        }

    def kernel_unsupported(self, w):
        if w.dtype_of("index_score") != torch.float32:
            return f"the TileLang selector reads f32 scores, not {w.dtype}"
        return None

    def tilelang_variants(self, w):
        from ..select_kernel import launch_variants

        return launch_variants()

    def tilelang_build(self, w, device, config=None):
        from ..select_kernel import select_kernel

        return select_kernel(*w.shapes["index_score"], self.config(w)["topk"], **(config or {})).compile(device)

    def torch_impl(self, w):
        topk = self.config(w)["topk"]

        def topk_selector(index_score, starts, ends):
            keys = torch.arange(index_score.shape[2], dtype=starts.dtype, device=index_score.device)
            valid = (keys >= starts[..., None]) & (keys < ends[..., None])
            masked = torch.where(valid[..., None], index_score, -math.inf)
            scores, indices = masked.topk(topk, dim=2, sorted=False)
            indices = indices.masked_fill(scores == -math.inf, -1)
            return indices.transpose(2, 3).to(torch.int32, memory_format=torch.contiguous_format)

        return topk_selector

    def reference(self, inputs, w):
        """The torch formulation on the scores as given: selecting by comparison is exact in any
        float dtype, so an upcast would change nothing. Returns the indices with the inputs, which
        :meth:`compare` needs to judge a selection."""
        with reference_math():
            indices = self.torch_impl(w)(**inputs)
        return Selection(indices, inputs["index_score"], inputs["starts"], inputs["ends"])

    def output_dtypes(self, w):
        return ("i32",)

    def compare(self, out, ref, w):
        return judge_selection(out, ref, self.config(w)["topk"])

    def cost(self, w):
        """Only the scores inside the rows' ranges must be read, once: sum over rows of
        (end - start) = prefix_len + r + 1 for the real rows r; one compare per such score."""
        batch, seq_len, _, kv_group = w.shapes["index_score"]
        prefix_len, real_rows = self.ranges(w)
        valid_keys = batch * (real_rows * prefix_len + real_rows * (real_rows + 1) // 2)
        scores = valid_keys * kv_group * w.dtype_of("index_score").itemsize
        range_bytes = sum(tensor_bytes(w.shapes[name], torch.int32) for name in ("starts", "ends"))
        indices = batch * seq_len * kv_group * self.config(w)["topk"] * torch.int32.itemsize
        return Cost(bytes=scores + range_bytes + indices, flops=valid_keys * kv_group)

    def memory_bytes(self, w):
        """Scores: the timed and the checked inputs, the reference's clone (which compare reads)
        and one masked copy; the [batch, seq_len, seq_len_kv] bool mask and the two comparisons it
        is made of; per selected slot the topk values, int64 indices and their masked copy, the
        int32 results of the implementation and of the reference, and compare's temporaries."""
        batch, seq_len, seq_len_kv, kv_group = w.shapes["index_score"]
        dtype = w.dtype_of("index_score")
        scores = tensor_bytes(w.shapes["index_score"], dtype)
        mask = batch * seq_len * seq_len_kv
        slots = batch * seq_len * kv_group * self.config(w)["topk"]
        per_slot = dtype.itemsize + 8 + 8 + 2 * 4 + 64
        return 4 * scores + 3 * mask + slots * per_slot + (64 << 20)
