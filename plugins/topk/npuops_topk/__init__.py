"""npuops top-k family (plugin ``topk``): DeepSeek-V3.2's indexer top-k selector, its workloads and
our kernel, and ``npuops_topk.topk_selector(index_score, starts, ends, topk)`` for model code."""

from .functional import topk_selector

__all__ = ["topk_selector"]
