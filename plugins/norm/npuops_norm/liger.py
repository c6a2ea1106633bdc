"""Liger-Kernel's Triton norms (``pip install liger-kernel``), registered as ``open-source``
alternatives when the package imports: what a user fusing norms with Triton would reach for.

Liger computes RMSNorm with Llama's casting (only the inverse RMS in fp32) and Gemma's with
everything in fp32; its fused-add RMSNorm returns the sum instead of writing it into the residual.
The correctness gate judges each against our reference like any implementation.
"""

from __future__ import annotations

from npuops import Implementation


def _rms_norm(offset: float, casting: str):
    def build(op, w, device):
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        eps = op.config(w)["eps"]
        return lambda x, weight: LigerRMSNormFunction.apply(x, weight, eps, offset, casting, False)

    return build


def _layer_norm(op, w, device):
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    eps = op.config(w)["eps"]
    return lambda x, weight, bias: LigerLayerNormFunction.apply(x, weight, bias, eps)


def _fused_add_rms_norm(op, w, device):
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    eps = op.config(w)["eps"]
    return lambda x, residual, weight: LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, "llama", False)


BUILDS = {
    "RMSNormFwd": _rms_norm(0.0, "llama"),
    "GemmaRMSNormFwd": _rms_norm(1.0, "gemma"),
    "LayerNormFwd": _layer_norm,
    "FusedAddRMSNormFwd": _fused_add_rms_norm,
}


def liger_implementations(ops) -> list[Implementation]:
    try:
        import liger_kernel.ops.rms_norm  # noqa: F401  (needs triton and a GPU build of torch)
    except Exception:
        return []
    return [Implementation(name, "liger", "open-source", build, devices=("cuda",),
                           description="Liger-Kernel (Triton)")
            for name, build in BUILDS.items() if name in ops]
