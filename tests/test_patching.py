"""npuops.patch: the family plugins' module forwards swapped into a model, and undone."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import npuops
from npuops import UnknownNameError


# -- stand-ins for Hugging Face's norm classes (same names, attributes and forwards) ---------------
class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class _OnePlusWeightRMSNorm(nn.Module):
    """Gemma's formulation (also Qwen3-Next's and Qwen3.5's, under their own names)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class GemmaRMSNorm(_OnePlusWeightRMSNorm):
    pass


class Qwen3NextRMSNorm(_OnePlusWeightRMSNorm):
    pass


class CenteredRMSNorm(LlamaRMSNorm):
    """Named and shaped like an RMSNorm, but subtracts the mean: neither of our formulas."""

    def forward(self, hidden_states):
        return super().forward(hidden_states - hidden_states.mean(-1, keepdim=True))


class Fp32LayerNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.float()).type_as(x)


HIDDEN = 16


class TinyModel(nn.Module):
    """Every module kind the norm, pool and conv plugins know, and some they must leave alone."""

    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleDict({
            "layer_norm": nn.LayerNorm(HIDDEN),
            "rms_norm": nn.RMSNorm(HIDDEN),
            "llama": LlamaRMSNorm(HIDDEN),
            "gemma": GemmaRMSNorm(HIDDEN),
            "qwen3_next": Qwen3NextRMSNorm(HIDDEN),
            # left alone:
            "centered": CenteredRMSNorm(HIDDEN),
            "fp32_layer_norm": Fp32LayerNorm(HIDDEN),
            "layer_norm_no_bias": nn.LayerNorm(HIDDEN, bias=False),
            "rms_norm_no_weight": nn.RMSNorm(HIDDEN, elementwise_affine=False),
        })
        self.pools2d = nn.ModuleList([
            nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(2, return_indices=True), nn.AvgPool2d(3, 1, 1, count_include_pad=False),
            nn.AdaptiveAvgPool2d((None, 2)), nn.AdaptiveMaxPool2d(3), nn.AdaptiveMaxPool2d(2, return_indices=True),
        ])
        self.pools1d = nn.ModuleList([nn.MaxPool1d(3, 2), nn.AvgPool1d(2)])
        self.pools3d = nn.ModuleList([nn.MaxPool3d(2), nn.AvgPool3d(2, divisor_override=3)])
        self.convs2d = nn.ModuleList([
            nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(3, 3, 3, stride=2, groups=3, bias=False),
            nn.Conv2d(3, 4, 3, padding="same", dilation=2),
            nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),  # left alone
        ])
        self.channel_norms = nn.ModuleList([
            nn.BatchNorm2d(3), nn.BatchNorm2d(3, momentum=None), nn.BatchNorm2d(3, track_running_stats=False),
            nn.InstanceNorm2d(3, affine=True), nn.InstanceNorm2d(3, track_running_stats=True),
            nn.GroupNorm(3, 3), nn.GroupNorm(1, 3, affine=False),
        ])
        self.batch_norm1d = nn.BatchNorm1d(3)
        self.conv1d = nn.Conv1d(3, 5, 3, padding=1)
        self.conv3d = nn.Conv3d(3, 2, 2)
        with torch.no_grad():  # weights away from their init, so a wrong formula shows
            for p in self.parameters():
                p.add_(torch.randn_like(p) * 0.3)

    def forward(self, x, image):
        outputs = [norm(x) for norm in self.norms.values()]
        outputs += [pool(image) for pool in self.pools2d]
        outputs += [pool(image.flatten(2)) for pool in self.pools1d]
        outputs += [pool(image.unsqueeze(2).expand(-1, -1, 4, -1, -1)) for pool in self.pools3d]
        outputs += [conv(image) for conv in self.convs2d]
        outputs += [norm(image) for norm in self.channel_norms] + [self.batch_norm1d(image.flatten(2))]
        outputs += [self.conv1d(image.flatten(2)), self.conv3d(image.unsqueeze(2).expand(-1, -1, 4, -1, -1))]
        return outputs


SWAPPED = {"LayerNorm": 1, "RMSNorm": 1, "LlamaRMSNorm": 1, "GemmaRMSNorm": 1, "Qwen3NextRMSNorm": 1,
           "MaxPool2d": 2, "AvgPool2d": 1, "AdaptiveAvgPool2d": 1, "AdaptiveMaxPool2d": 2, "MaxPool1d": 1,
           "AvgPool1d": 1, "MaxPool3d": 1, "AvgPool3d": 1, "Conv2d": 3, "Conv1d": 1, "Conv3d": 1, "BatchNorm2d": 3,
           "BatchNorm1d": 1, "InstanceNorm2d": 2, "GroupNorm": 2}


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TinyModel()


@pytest.fixture
def inputs():
    torch.manual_seed(1)
    return torch.randn(2, 5, HIDDEN), torch.randn(2, 3, 8, 8)


def flat(outputs):
    return [t for o in outputs for t in (o if isinstance(o, tuple) else (o,))]


def assert_same(got, want):
    assert len(flat(got)) == len(flat(want))
    for g, w in zip(flat(got), flat(want)):
        torch.testing.assert_close(g, w)


def instance_forwards(model):
    return {name: m.__dict__.get("forward") for name, m in model.named_modules()}


def test_patch_swaps_what_the_plugins_know_and_computes_the_same(model, inputs):
    want = model(*inputs)
    with npuops.patch(model) as handle:
        assert dict(handle.swapped) == SWAPPED
        assert not handle.errors and not handle.skipped
        for name in ("centered", "fp32_layer_norm", "layer_norm_no_bias", "rms_norm_no_weight"):
            assert "forward" not in model.norms[name].__dict__, name
        assert model.norms["gemma"].forward.__name__ == "gemma_rms_norm_forward"
        assert model.norms["qwen3_next"].forward.__name__ == "gemma_rms_norm_forward"
        assert model.norms["llama"].forward.__name__ == "rms_norm_forward"
        assert_same(model(*inputs), want)


@pytest.mark.parametrize("training", [True, False])
def test_channel_norms_keep_their_running_statistics_as_the_modules_do(model, inputs, training):
    """Running means, variances and batch counts after two calls, patched and not (momentum, None's
    cumulative average, untracked statistics; eval reads them)."""
    model.train(training)
    twin = copy.deepcopy(model)
    for _ in range(2):
        want = twin(*inputs)
    with npuops.patch(model):
        for _ in range(2):
            got = model(*inputs)
    assert_same(got, want)
    for (name, buffer), (_, expected) in zip(model.named_buffers(), twin.named_buffers(), strict=True):
        torch.testing.assert_close(buffer, expected, msg=name)


def test_modules_that_compute_otherwise_are_left_alone():
    from npuops_norm.modules import norm_forward

    class Fp32BatchNorm(nn.BatchNorm2d):
        def forward(self, x):
            return super().forward(x.float()).type_as(x)

    for module in (nn.SyncBatchNorm(3), Fp32BatchNorm(3), nn.LazyBatchNorm2d(), nn.LazyInstanceNorm2d()):
        assert norm_forward(module) is None, type(module).__name__


def test_gradients_flow_as_before(model, inputs):
    x, image = (t.clone().requires_grad_() for t in inputs)

    def grads():
        model.zero_grad()
        x.grad = image.grad = None
        sum(t.float().sum() for t in flat(model(x, image)) if t.is_floating_point()).backward()
        return [x.grad, image.grad, *(p.grad for p in model.parameters())]

    want = grads()
    with npuops.patch(model):
        got = grads()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_undo_restores_the_class_forwards(model, inputs):
    before = instance_forwards(model)
    handle = npuops.patch(model)
    assert instance_forwards(model) != before
    handle.undo()
    assert instance_forwards(model) == before
    for m in model.modules():
        assert m.forward.__func__ is type(m).forward
    assert not handle.swapped
    handle.undo()  # twice is harmless


def test_patching_twice_is_a_no_op(model, inputs):
    want = model(*inputs)
    first = npuops.patch(model)
    patched = instance_forwards(model)
    second = npuops.patch(model)
    assert not second.swapped and second.already_patched == sum(SWAPPED.values())
    assert instance_forwards(model) == patched
    assert_same(model(*inputs), want)
    second.undo()  # holds nothing
    assert instance_forwards(model) == patched
    first.undo()
    assert all(f is None for f in instance_forwards(model).values())


def test_only_the_patched_instance_changes(model):
    other = TinyModel()
    with npuops.patch(model):
        assert all(f is None for f in instance_forwards(other).values())
        assert LlamaRMSNorm.forward.__name__ == "forward"


def test_a_deepcopy_of_a_patched_model_is_patched_and_not_patched_again(model, inputs):
    with npuops.patch(model):
        twin = copy.deepcopy(model)
    assert twin.norms["llama"].forward.__self__ is twin.norms["llama"]
    assert npuops.patch(twin).already_patched == sum(SWAPPED.values())
    assert_same(twin(*inputs), model(*inputs))


def test_families_choose_the_plugins(model):
    with npuops.patch(model, families=["pool"]) as handle:
        assert set(handle.swapped) == {name for name in SWAPPED if "Pool" in name}
    with pytest.raises(UnknownNameError, match="did you mean 'norm'"):
        npuops.patch(model, families=["norms"])


def test_a_forward_already_replaced_on_the_instance_is_kept(model):
    def hooked(x):
        return x

    model.norms["llama"].forward = hooked
    with npuops.patch(model) as handle:
        assert model.norms["llama"].forward is hooked
        assert handle.skipped == ["norms.llama (LlamaRMSNorm): its forward is already replaced on the instance"]
        assert "LlamaRMSNorm" not in handle.swapped


BROKEN_HOOK = '''
from npuops import hookimpl

@hookimpl
def npuops_module_forwards():
    raise RuntimeError("hook broken")
'''

BROKEN_FINDER = '''
from npuops import hookimpl

def finder(module):
    raise RuntimeError("finder broken")

@hookimpl
def npuops_module_forwards():
    return [finder]
'''


def test_a_broken_plugin_does_not_stop_the_others(plugins, model, inputs):
    plugins.install("npuops-broken-hook", "npuops_broken_hook", BROKEN_HOOK, entry_name="a_broken_hook")
    plugins.install("npuops-broken-finder", "npuops_broken_finder", BROKEN_FINDER, entry_name="a_broken_finder")
    want = model(*inputs)
    with pytest.warns(RuntimeWarning, match="hook broken"):
        handle = npuops.patch(model)
    assert dict(handle.swapped) == SWAPPED
    assert len(handle.errors) == 2
    assert any("a_broken_hook" in e and "hook broken" in e for e in handle.errors)
    assert any("a_broken_finder" in e and "finder broken" in e for e in handle.errors)
    assert_same(model(*inputs), want)
    handle.undo()


def test_warm_builds_the_kernels_of_the_patched_row_norms_first(model, monkeypatch):
    """patch(warm=True) hands functional.warm one workload per kernel the patched row norms call
    (one row of their hidden size in their dtype: the kernel key), none twice; the channel norms,
    pools and convs name none (their calls' sizes are not known ahead). On a CPU machine, no warm."""
    from npuops import functional

    handle = npuops.patch(copy.deepcopy(model), warm=True)
    assert handle.warmed == {}  # no CUDA here
    warmed = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(functional, "warm", lambda workloads: warmed.extend(workloads) or {"with a kernel": len(workloads)})
    handle = npuops.patch(model, warm=True)
    assert {w.op for w in warmed} == {"LayerNormFwd", "RMSNormFwd", "GemmaRMSNormFwd"}
    assert all(w.shapes["x"] == (1, HIDDEN) and w.dtype == "f32" for w in warmed)
    assert len({repr(w.to_dict()) for w in warmed}) == len(warmed)
    assert handle.warmed["with a kernel"] == len(warmed) and handle.warmed["seconds"] >= 0
    handle.undo()


def test_a_hugging_face_llama_and_gemma(model):
    # transformers is in the test extra (CI installs it); the stand-ins above cover the logic
    from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8)
    ids = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(0))
    for cls, config, norm in ((LlamaForCausalLM, LlamaConfig, "LlamaRMSNorm"),
                              (GemmaForCausalLM, GemmaConfig, "GemmaRMSNorm")):
        torch.manual_seed(0)
        hf = cls(config(**sizes)).eval()
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn_like(p) * 0.3)
            want = hf(ids).logits
            with npuops.patch(hf) as handle:
                assert dict(handle.swapped) == {norm: 2 * 2 + 1}
                torch.testing.assert_close(hf(ids).logits, want)
            assert all("forward" not in m.__dict__ for m in hf.modules())


def test_the_hf_benchmark_script_runs_end_to_end_on_cpu(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench-hf-model.py"
    spec = importlib.util.spec_from_file_location("bench_hf_model", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "results.json"
    assert bench.main(["--device", "cpu", "--tokens", "1,4", "--unseen", "5,9", "--layers", "1", "--hidden", "64",
                       "--heads", "4", "--vocab", "128", "--repeats", "2", "--logits-tokens", "8", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["swapped"] == {"LlamaRMSNorm": 3}
    assert set(results["eager"]) == {"1", "4"} and set(results["unseen"]) == {"5", "9"}
    assert results["graph"] == {"skipped": "CUDA graphs need a CUDA device"}
    assert results["coverage"]["rms_norm"]["torch"] > 0 and results["env"]["transformers"]
    assert results["bar"]["logits as close"] in (True, False)
