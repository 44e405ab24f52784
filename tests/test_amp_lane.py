"""The AMP lane's parts: the float64 emulation rounds as CPU autocast's GEMMs do, the lane passes
a clean recipe and fails a noisy one on the same states, and says INCONCLUSIVE where its emulation
knows none of the model's functions."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.domains.engines import training as T
from harness.domains.engines.training import amp_lane as L
from harness.domains.engines.training.emulation import RoundingMode


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_emulated_linear_is_autocasts_linear_up_to_fp32_accumulation(dtype):
    """Inputs rounded to the format, products summed exactly, the output rounded once: CPU
    autocast's linear (fp32 accumulation) gives the same value for almost every element, and none
    more than one spacing of the format at the product's and the bias's magnitude away (CPU's
    fp16 linear rounds the product, then adds the bias: two roundings, visible under cancellation)."""
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=gen) for shape in ((64, 128), (32, 128), (32,)))
    with torch.autocast("cpu", dtype=dtype):
        amp = F.linear(x, w, b).double()
    with RoundingMode(dtype) as mode:
        emulated = F.linear(x.double(), w.double(), b.double())
    assert mode.calls == 1
    same = (amp == emulated).double().mean().item()
    spacing = torch.finfo(dtype).eps * ((x.double() @ w.double().T).abs() + b.double().abs())
    assert same > 0.99 and bool(((amp - emulated).abs() <= spacing).all()), same


def _mlp_run(recipe):
    setup = T.SETUPS["mlp"]
    return setup, T.train(setup, recipe, 0, keep_states_at=L.lane_steps(setup))


def test_the_lane_passes_clean_bf16_and_fails_its_steps_with_gradient_noise():
    setup, run = _mlp_run(T.BF16)
    clean, reference = L.check_lane(setup, T.BF16, run)
    assert L.judge_lane(clean).passed and 0.5 < clean.ratio < 1.5, clean
    noisy = L.amp_lane(setup, replace(T.BF16, grad_noise=0.25), run, reference)
    verdict = L.judge_lane(noisy)
    assert not verdict.passed and "loses precision its format does not explain" in "\n".join(verdict.detail)


def test_the_master_weights_control_is_caught_and_a_blind_control_makes_a_pass_inconclusive():
    setup, run = _mlp_run(T.FP16_SCALER)
    references: dict[torch.dtype, L.LaneReference] = {}
    controls = {c.recipe.name: c for c in L.power(setup, T.FP16_SCALER, run, references, underflow_share=0.0)}
    assert controls["bf16 parameters, no fp32 master weights"].caught
    blind = controls["fp16 without loss scaling"]
    assert not blind.caught  # the MLP's gradients sit far inside fp16's range
    lane = L.amp_lane(setup, T.FP16_SCALER, run, references[torch.float16])
    verdict = L.judge_lane(lane, blind=[blind])
    assert verdict.outcome.value == "inconclusive"
    assert "cannot see fp16 without loss scaling" in "\n".join(verdict.detail)


class Elementwise(nn.Module):
    """No GEMM, no convolution, no attention: nothing the emulation rounds."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, x):
        return (x * self.scale).sum(-1, keepdim=True)


def test_a_model_without_low_precision_functions_is_inconclusive_not_pass():
    mlp = T.SETUPS["mlp"]
    setup = T.Setup("elementwise", lambda s: Elementwise(), mlp.batch, mlp.loss, steps=20, lr=0.01)
    run = T.train(setup, T.BF16, 0, keep_states_at=L.lane_steps(setup))
    lane, _ = L.check_lane(setup, T.BF16, run)
    verdict = L.judge_lane(lane)
    assert verdict.outcome.value == "inconclusive" and "rounded no call" in "\n".join(verdict.detail)


class TinyAttention(nn.Module):
    """16 features as 4 tokens of width 4, one self-attention, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(4, 12), nn.Linear(16, 1)

    def forward(self, x):
        q, k, v = self.qkv(x.reshape(-1, 4, 4)).split(4, -1)
        return self.out(F.scaled_dot_product_attention(q, k, v).reshape(-1, 16))


def test_attention_is_taken_correctly_rounded_and_the_stack_kernel_measured_apart():
    mlp = T.SETUPS["mlp"]
    setup = T.Setup("attention", lambda s: TinyAttention(), mlp.batch, mlp.loss, steps=20, lr=0.01, checkpoint_every=10)
    run = T.train(setup, T.BF16, 0, keep_states_at=L.lane_steps(setup))
    lane, reference = L.check_lane(setup, T.BF16, run)
    assert lane.attention_calls == 1 and lane.kernel_ratio is not None, lane
    assert all(e.with_kernel is not None for e in lane.errors)
    ladder = L.ladder_lanes(setup, T.BF16, run, reference, [0.5])[0.5]
    assert ladder.kernel_ratio is None  # the ladder takes no second, stack-kernel step
