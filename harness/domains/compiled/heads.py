"""Losses that share one set of logits, compiled as eager runs them.

Training rarely ends in one cross-entropy: a distilled student adds a KL term against a teacher's
softened probabilities, RL and calibration recipes add an entropy bonus, large language models add
a z-loss on the log-partition. Each reads the same autocast-produced logits through a softmax, a
log-softmax or a logsumexp, and the backward sums their gradients into one. Inductor's CPU backend
fuses those row reductions and their pointwise users (outer-loop fusion with function-local
buffers), a path where releases have shipped bugs that a single loss never reaches: on torch 2.6 a
softmax and a log-softmax of the same logits, differentiated, stop the compile with
``AssertionError: buf0`` (a buffer localised, then read by another kernel: pytorch/pytorch#144186,
fixed by #144243), in fp32 and under autocast alike; on 2.5 the bf16 entropy head's C++ does not
build (``fmadd`` on ``VectorizedN``). The probe block's one loss compiled on both.

The program (:class:`Heads`) is a hidden layer, a student head and a frozen teacher head under
autocast, and every head's loss on the student's logits; their sum is differentiated. It is
compiled once per dtype with all heads; only where that fails is each head compiled alone, to name
the ones that break the build (each beside the cross-entropy where each alone builds; a healthy
release pays one compile). Numerics are judged with the
compiled suite's budget (:mod:`harness.domains.compiled.budget`: one low-precision rounding per
stage boundary, propagated in float64), every stage and gradient against a float64 run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.domains.compiled.budget import Budget, NumericsResult, derive, judge
from harness.domains.compiled.known_issues import compiler_error, known_build_failure
from harness.domains.compiled.probe import Observation, Tap, observe
from harness.domains.engines.compiler.compiling import Backend, compile_fn
from harness.domains.versions import KnownIssue
from harness.numerics.comparison import ClaimComparison, compare_claim

#: Each head: the loss it adds to the student's cross-entropy, and the practice it stands for.
#: Weights and temperature are the published recipes' (a workload, not a tolerance).
HEADS: dict[str, str] = {
    "cross_entropy": "cross_entropy(logits, labels): the task loss every head is added to",
    "distillation": "T^2 KL(softmax(teacher / T) || log_softmax(logits / T)), T = 2 (Hinton et al., 2015)",
    "entropy_bonus": "-0.1 H(softmax(logits)), H = -sum p log p (an entropy bonus, as policy-gradient and "
    "confidence-penalty recipes add)",
    "z_loss": "1e-4 logsumexp(logits)^2 (PaLM's z-loss, Chowdhery et al., 2022)",
}
NAMES: tuple[str, ...] = tuple(HEADS)
#: what a failure of the program with every head is named where no smaller compile fails
TOGETHER = "every head together"
TEMPERATURE, ENTROPY_WEIGHT, Z_WEIGHT = 2.0, 0.1, 1e-4

#: the program's stages, in order (a ``tap`` sees each; the budget rounds at each in turn)
STAGES: tuple[str, ...] = ("hidden", "logits", "teacher_logits", *(f"loss.{n}" for n in NAMES), "loss")
#: Batch, sequence, width and classes of the program's inputs; the longest reduction is the width
#: (the linear layers; the classes' 64-long softmax rows are shorter)
BATCH, SEQUENCE, WIDTH, CLASSES = 4, 16, 64, 64


class Heads(nn.Module):
    """hidden = linear(x); logits = head(hidden); teacher = frozen_head(x); the heads'
    losses on the logits (``heads``: which ones; all by default), and their sum as ``loss``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.teacher = nn.Linear(WIDTH, CLASSES).requires_grad_(False)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, tap: Tap | None = None, heads: Sequence[str] = NAMES
    ) -> dict[str, torch.Tensor]:
        t = tap or (lambda _name, v: v)
        out: dict[str, torch.Tensor] = {}
        out["hidden"] = h = t("hidden", self.inp(x))
        out["logits"] = logits = t("logits", self.head(h))
        out["teacher_logits"] = teacher = t("teacher_logits", self.teacher(x))
        flat, soft = logits.flatten(0, 1), teacher.flatten(0, 1)
        losses = {
            "cross_entropy": lambda: F.cross_entropy(flat, y.flatten()),
            "distillation": lambda: (
                F.kl_div(
                    F.log_softmax(flat / TEMPERATURE, -1), F.softmax(soft / TEMPERATURE, -1), reduction="batchmean"
                )
                * TEMPERATURE**2
            ),
            "entropy_bonus": lambda: ENTROPY_WEIGHT * (F.softmax(flat, -1) * F.log_softmax(flat, -1)).sum(-1).mean(),
            "z_loss": lambda: Z_WEIGHT * torch.logsumexp(flat, -1).pow(2).mean(),
        }
        total: torch.Tensor | None = None
        for name in heads:
            out[f"loss.{name}"] = term = t(f"loss.{name}", losses[name]())
            total = term if total is None else total + term
        assert total is not None, "at least one head"
        out["loss"] = t("loss", total)
        return out


def make(device: torch.device, seed: int = 0) -> tuple[Heads, torch.Tensor, torch.Tensor]:
    """The program's module and inputs (seeded; labels drawn over the classes)."""
    torch.manual_seed(seed)
    model = Heads().to(device)
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(BATCH, SEQUENCE, WIDTH, generator=g)
    y = torch.randint(0, CLASSES, (BATCH, SEQUENCE), generator=g)
    return model, x.to(device).requires_grad_(), y.to(device)


def call(heads: Sequence[str] = NAMES) -> Callable[..., Any]:
    """The function compiled: the module called with the batch and the given heads."""

    def program(model: nn.Module, x: torch.Tensor, y: torch.Tensor, tap: Tap | None = None) -> Any:
        return model(x, y, tap, heads)

    return program


def describe_error(exc: BaseException) -> str:
    """The first line that says what failed (the exception's own line where there is one), and a
    C++ compiler's first ``error:`` line where the generated code did not build."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if re.match(r"^\w+(Error|Exception)\b", ln)]
    said = f"{type(exc).__name__}: {(named or lines or [''])[0][:300]}"
    compiler = compiler_error(exc)
    return f"{said} ({compiler.split('error: ', 1)[1][:200]})" if compiler else said


@dataclass(frozen=True)
class Compiled:
    """One compile of the program with every head: its observation, or the error that stopped it
    and, then, the compiles that tell which heads break it: each head alone and, where every one
    builds alone, each beside the cross-entropy (None where that one builds and runs)."""

    observation: Observation | None
    error: BaseException | None = None
    alone: dict[str, BaseException | None] = field(default_factory=dict)

    def breaking(self) -> dict[str, BaseException]:
        """The heads (or pairs) whose own compile fails, with their errors."""
        return {n: e for n, e in self.alone.items() if e is not None}

    def failures(self) -> dict[str, BaseException]:
        """The failed compiles that say which heads break the build: :meth:`breaking`, else the
        program's own (every head builds alone and beside the cross-entropy)."""
        breaking = self.breaking()
        return breaking if breaking or self.error is None else {TOGETHER: self.error}


class HeadsRuns:
    """Eager, float64 and compiled runs of the program on one device with one backend, each
    dtype's made once and shared by the checks that read it."""

    def __init__(self, device: torch.device, backend: Backend, seed: int = 0) -> None:
        self.device, self.backend = device, backend
        self.model, self.x, self.y = make(device, seed)
        self._eager: dict[torch.dtype, Observation] = {}
        self._reference: dict[torch.dtype, tuple[Observation, Budget]] = {}
        self._compiled: dict[torch.dtype, Compiled] = {}

    def eager(self, dtype: torch.dtype) -> Observation:
        if dtype not in self._eager:
            self._eager[dtype] = observe(call(), self.model, self.x, self.y, dtype)
        return self._eager[dtype]

    def reference(self, dtype: torch.dtype) -> tuple[Observation, Budget]:
        if dtype not in self._reference:
            # each stage rounds at the format eager gives it: the losses autocast keeps in fp32 at fp32
            formats = {k: v.dtype for k, v in self.eager(dtype).outputs.items()}
            self._reference[dtype] = derive(self.model, self.x, self.y, dtype, call(), STAGES, WIDTH, formats)
        return self._reference[dtype]

    def _compile(self, dtype: torch.dtype, heads: Sequence[str]) -> Observation:
        return observe(compile_fn(call(heads), self.backend), self.model, self.x, self.y, dtype)

    def compiled(self, dtype: torch.dtype) -> Compiled:
        if dtype not in self._compiled:
            try:
                self._compiled[dtype] = Compiled(self._compile(dtype, NAMES))
            except Exception as exc:  # which heads break the build: each alone, else each beside the task loss
                self._compiled[dtype] = Compiled(None, exc, self._attribute(dtype))
        return self._compiled[dtype]

    def _attribute(self, dtype: torch.dtype) -> dict[str, BaseException | None]:
        tried: dict[str, BaseException | None] = {}
        for group in ([(n,) for n in NAMES], [(NAMES[0], n) for n in NAMES[1:]]):
            for combination in group:
                try:
                    self._compile(dtype, combination)
                    tried[" + ".join(combination)] = None
                except Exception as own:
                    tried[" + ".join(combination)] = own
            if any(e is not None for e in tried.values()):
                break
        return tried

    def judge(self, dtype: torch.dtype) -> NumericsResult:
        """Compiled against eager, both against float64, under the budget (the program built)."""
        compiled = self.compiled(dtype).observation
        assert compiled is not None, "judge() needs a program that built: see Compiled.error"
        ref, budget = self.reference(dtype)
        return judge("heads", self.eager(dtype), compiled, ref, budget)


def describe_failure(compiled: Compiled) -> str:
    """What stopped the compile, and which heads break it alone (or none: only together)."""
    assert compiled.error is not None
    breaking = compiled.breaking()
    who = (
        "; ".join(f"{n} alone: {describe_error(e)}" for n, e in breaking.items())
        if breaking
        else "every head builds alone and beside the cross-entropy: only all together fail"
    )
    return f"the program with every head raised {describe_error(compiled.error)}; {who}"


def build_claim(compiled: Compiled) -> ClaimComparison:
    """The claim that the program compiles and runs, forward and backward, as eager does."""
    return compare_claim(
        "compiled.heads.builds",
        compiled.error is None,
        compiled.error is None,
        "a program whose logits feed several losses compiles and runs, forward and backward, as eager does",
        detail=describe_failure(compiled) if compiled.error is not None else (),
    )


def failures_matching(compiled: Compiled, matches: Callable[[BaseException], bool]) -> dict[str, BaseException]:
    """The failed compiles whose error ``matches`` (a registered failure's test: the registry check's
    observation), the program's own where no head alone or beside the cross-entropy shows it."""
    hit = {n: e for n, e in compiled.failures().items() if matches(e)}
    if not hit and compiled.error is not None and matches(compiled.error):
        hit = {TOGETHER: compiled.error}
    return hit


def registered_failures(compiled: Compiled, device_type: str) -> list[KnownIssue] | None:
    """The registered compile failures that explain every failing compile of ``compiled`` on this
    release (its cells then read KNOWN), or None where one is a failure of its own."""
    assert compiled.error is not None
    known = [known_build_failure(e, device_type) for e in compiled.failures().values()]
    if any(k is None for k in known):
        return None
    return sorted({k.id: k for k in known if k is not None}.values(), key=lambda k: k.id)
