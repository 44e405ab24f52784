"""Compiling the probe under a backend and a configuration variant, and observing it.

A *backend* is what ``torch.compile`` is given: ``"inductor"`` in the suite; the harness's own
tests pass faulty custom backends to show the checks fail. A *variant* is the configuration the
stack offers around it: the default (what a user gets), Inductor's ``emulate_precision_casts``
(keep eager's down/up-cast pairs), and AOTAutograd's ``backward_pass_autocast`` (which autocast
state the compiled backward is traced under). Every compile starts from a reset Dynamo cache, so
that a variant can never be served a graph compiled for another. The variants and ``compile_fn``
are the compiler engine's (:mod:`harness.domains.engines.compiler.compiling`), named here for the
family's checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from harness.domains.compiled.budget import Budget, derive
from harness.domains.compiled.probe import Observation, call_block, make_block, make_inputs, observe
from harness.domains.engines.compiler import toolchain
from harness.domains.engines.compiler.compiling import (
    BACKWARD_AUTOCAST_OFF as BACKWARD_AUTOCAST_OFF,
)
from harness.domains.engines.compiler.compiling import DEFAULT as DEFAULT
from harness.domains.engines.compiler.compiling import EMULATED_CASTS as EMULATED_CASTS
from harness.domains.engines.compiler.compiling import Backend as Backend
from harness.domains.engines.compiler.compiling import Variant as Variant
from harness.domains.engines.compiler.compiling import compile_fn as compile_fn
from harness.domains.engines.compiler.compiling import configured as configured

#: The autocast dtypes a graph pass treats as low precision.
LOW_PRECISION = (torch.bfloat16, torch.float16)
GraphPass = Callable[[torch.fx.GraphModule], None]


def node_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype of a traced node's value (its fake tensor), None for a non-tensor."""
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def retarget(
    gm: torch.fx.GraphModule, targets: Mapping[Any, Callable[..., Any]], when: Callable[[torch.fx.Node], bool]
) -> None:
    """Every call of an op in ``targets`` for which ``when(node)`` holds calls its replacement."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in targets and when(node):
            node.target = targets[node.target]
    gm.recompile()


def pass_backend(fw_pass: GraphPass | None, bw_pass: GraphPass | None = None) -> Any:
    """An AOTAutograd backend that applies ``fw_pass``/``bw_pass`` to the traced forward/backward
    ATen graphs and runs them as they are (no C++ compile): a compiler that differs from a correct
    one in exactly what the passes change (the harness's measured faults and negative controls)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch._aot_autograd.utils import make_boxed_func

    def compiler(graph_pass: GraphPass | None) -> Callable[[torch.fx.GraphModule, Any], Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            if graph_pass is not None:
                graph_pass(gm)
            return make_boxed_func(gm.forward)

        return compile_graph

    return aot_autograd(fw_compiler=compiler(fw_pass), bw_compiler=compiler(bw_pass))


@dataclass(frozen=True)
class Compiled:
    observation: Observation
    #: seconds of the first call (tracing + compiling + running forward and backward once)
    compile_s: float


def observe_compiled(
    backend: Backend,
    variant: Variant,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    dtype: torch.dtype | None,
) -> Compiled:
    """The block compiled with ``backend`` under ``variant``, run once forward and backward."""
    with configured(variant):
        compiled = compile_fn(call_block, backend)
        start = time.perf_counter()
        obs = observe(compiled, model, x, y, dtype)
        return Compiled(obs, time.perf_counter() - start)


class BlockRuns:
    """Every observation of the probe block one session needs, each made once: eager, float64 (with
    its budget) and compiled per (dtype, variant), for one device and backend. The suite's checks
    share it, so the block is compiled once per dtype and variant however many checks read it."""

    def __init__(self, device: torch.device, backend: Backend, seed: int = 0) -> None:
        self.device = device
        self.backend = backend
        self.model = make_block(device, seed)
        self.x, self.y = make_inputs(device, seed)
        self._eager: dict[torch.dtype | None, Observation] = {}
        self._reference: dict[torch.dtype, tuple[Observation, Budget]] = {}
        self._compiled: dict[tuple[torch.dtype | None, str], Compiled] = {}

    def eager(self, dtype: torch.dtype | None) -> Observation:
        if dtype not in self._eager:
            self._eager[dtype] = observe(call_block, self.model, self.x, self.y, dtype)
        return self._eager[dtype]

    def reference(self, dtype: torch.dtype) -> tuple[Observation, Budget]:
        """The float64 observation and the numerics budget for ``dtype``."""
        if dtype not in self._reference:
            self._reference[dtype] = derive(self.model, self.x, self.y, dtype)
        return self._reference[dtype]

    def compiled(self, dtype: torch.dtype | None, variant: Variant = DEFAULT) -> Compiled:
        key = (dtype, variant.name)
        if key not in self._compiled:
            self._compiled[key] = observe_compiled(self.backend, variant, self.model, self.x, self.y, dtype)
        return self._compiled[key]


def autograd_cache_serves_another_dtype(device: torch.device, backend: Backend = "inductor") -> tuple[bool, str]:
    """Whether AOTAutograd's cache serves a graph compiled under bf16 autocast to the same code
    compiled under fp16 autocast (after a Dynamo reset, the cache on as a user has it): a linear
    with a weight that needs its gradient, compiled under each in turn. The reference is the
    autocast dtype each compile ran under."""
    import torch._functorch.config as fc

    if not getattr(fc, "enable_autograd_cache", False):  # none in torch 2.4; off by default in 2.5 and 2.6
        return False, f"torch {torch.__version__} has no AOTAutograd cache on by default to serve another dtype's graph"
    toolchain.wait_for_warm_up()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 16, generator=g).to(device).requires_grad_(True)
    x = torch.randn(8, 16, generator=g).to(device)
    seen: dict[torch.dtype, torch.dtype] = {}
    with fc.patch(enable_autograd_cache=True):
        for dtype in (torch.bfloat16, torch.float16):
            torch._dynamo.reset()
            with torch.autocast(device.type, dtype=dtype):
                out = torch.compile(_linear, backend=backend)(w, x)
            out.float().sum().backward()  # type: ignore[no-untyped-call]
            seen[dtype] = out.dtype
    wrong = [f"compiled under {a} autocast, computed in {b}" for a, b in seen.items() if a != b]
    return bool(wrong), "; ".join(wrong) or "each compile computed in its autocast dtype"


def _linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w)
