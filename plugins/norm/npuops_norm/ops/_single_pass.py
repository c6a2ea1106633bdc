"""Cost model shared by the norms whose least DRAM traffic is one read of every input and one write
of every output (the row-wise norms, L1/L2 normalize, weight and spectral norm)."""

import math

import torch
from npuops import Cost, InputRNG, Op
from npuops.workload import dtype_name


class SinglePassNormOp(Op):
    """Costs come from the inputs that ``make_inputs`` builds and the outputs the torch formulation
    returns, both on the ``meta`` device, so byte counts cannot drift from what the op moves."""

    family = "norm"
    flops_per_element = 4  # useful FLOPs per element of the workload's ``x``

    def _meta_io(self, w) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        inputs = self.make_inputs(w, InputRNG("meta"))
        outputs = self.torch_impl(w)(**inputs)
        outputs = list(outputs) if isinstance(outputs, tuple | list) else [outputs]
        return list(inputs.values()), outputs

    def flops(self, w) -> int:
        return self.flops_per_element * math.prod(w.shapes["x"])

    def cost(self, w):
        inputs, outputs = self._meta_io(w)
        return Cost(bytes=sum(t.nbytes for t in inputs + outputs), flops=self.flops(w))

    def output_dtypes(self, w):
        return tuple(dtype_name(t.dtype) for t in self._meta_io(w)[1])

    def memory_bytes(self, w):
        # Inputs, their clone, outputs, the reference's upcast inputs and outputs and the eager
        # formulation's fp32 temporaries: a few copies of everything, counted at least fp32 wide.
        inputs, outputs = self._meta_io(w)
        return 6 * sum(t.numel() * max(t.element_size(), 4) for t in inputs + outputs) + (64 << 20)
