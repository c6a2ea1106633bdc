"""The top-k selector as a function for model code: a ``torch.library`` custom op
``npuops_topk::topk_selector`` (see :mod:`npuops.functional`: our kernel on CUDA, masked
``torch.topk`` elsewhere and for tracing, arguments checked)."""

from npuops import OpFunction, define_function

topk_selector = define_function(OpFunction(
    "npuops_topk", "topk_selector", "TopkSelectorFwd",
    "(Tensor index_score, Tensor starts, Tensor ends, int topk=2048) -> Tensor",
    ("index_score", "starts", "ends"), (("topk", 2048),), shape_name="index_score"))
