"""Compiling the probe under a backend and a configuration variant, and observing it.

A *backend* is what ``torch.compile`` is given: ``"inductor"`` in the suite; the harness's own
tests pass faulty custom backends to show the checks fail. A *variant* is the configuration the
stack offers around it: the default (what a user gets), Inductor's ``emulate_precision_casts``
(keep eager's down/up-cast pairs), and AOTAutograd's ``backward_pass_autocast`` (which autocast
state the compiled backward is traced under). Every compile starts from a reset Dynamo cache, so
that a variant can never be served a graph compiled for another.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from harness.domains.compiled import probe, toolchain
from harness.domains.compiled.budget import Budget, derive
from harness.domains.compiled.probe import Observation, call_block, make_block, make_inputs, observe
from harness.domains.repro import FailureRepro

if TYPE_CHECKING:
    from harness.domains.compiled.budget import NumericsResult
    from harness.domains.repro import FailureRepro

Backend = str | Callable[..., Any]


@dataclass(frozen=True)
class Variant:
    name: str
    #: Inductor configuration of this compile (``torch._inductor.config``)
    inductor: Mapping[str, Any] = field(default_factory=dict)
    #: AOTAutograd configuration (``torch._functorch.config``), in force while tracing and running
    functorch: Mapping[str, Any] = field(default_factory=dict)

    def available(self) -> str | None:
        """Why this stack cannot run the variant (a switch it does not have), or None."""
        import torch._functorch.config as fc
        import torch._inductor.config as ic

        for module, wanted in ((ic, self.inductor), (fc, self.functorch)):
            missing = [k for k in wanted if not hasattr(module, k)]
            if missing:
                return f"torch {torch.__version__} has no {module.__name__}.{missing[0]}"
        return None


DEFAULT = Variant("default")
#: Inductor keeps eager's rounding of every fused intermediate (to compare against eager exactly).
EMULATED_CASTS = Variant("emulated_casts", inductor={"emulate_precision_casts": True})
#: The compiled backward traced without autocast, as eager runs a backward called outside autocast
#: (torch's documented remedy for known issue ``compiled-backward-under-forward-autocast``).
BACKWARD_AUTOCAST_OFF = Variant("backward_autocast_off", functorch={"backward_pass_autocast": "off"})


@contextlib.contextmanager
def configured(variant: Variant) -> Iterator[None]:
    """The variant's configuration in force (tracing happens at the first call, inside this)."""
    import torch._functorch.config as fc
    import torch._inductor.config as ic

    with ic.patch(dict(variant.inductor)), fc.patch(dict(variant.functorch)):
        yield


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


def compile_fn(fn: Callable[..., Any], backend: Backend) -> Callable[..., Any]:
    """``torch.compile(fn)`` with ``backend`` after a Dynamo reset (no graph of another variant is
    reused: Dynamo caches per code object, and every variant compiles the same code)."""
    toolchain.wait_for_warm_up()
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend)


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


def _block_script(block_runs: BlockRuns, dtype: torch.dtype) -> tuple[str, dict[str, torch.Tensor]]:
    """The probe block as a script's opening: its source, its saved weights and inputs, and
    ``eager`` and ``compiled`` (Inductor) observations of every stage and gradient under autocast."""
    import inspect

    state = {k: v.detach() for k, v in block_runs.model.state_dict().items()}
    names = {k: "p_" + k.replace(".", "_") for k in state}
    block = inspect.getsource(probe._identity) + "\n\n" + inspect.getsource(probe.Block)
    code = f"""import copy

from torch import nn

Tap = object  # the probe's annotation: the reproduction never taps its stages


{block}

model = Block({probe.WIDTH}, 4, {probe.CLASSES}).to(x.device)
model.load_state_dict({{{", ".join(f"{k!r}: {v}" for k, v in names.items())}}})
DTYPE = {dtype}


def call_block(m, x, y):
    return m(x, y)


def observe(fn, m, x, y, dtype):  # forward under autocast, backward outside it (as the docs say)
    m.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = fn(m, x, y)
    out["loss"].backward()
    found = {{f"forward.{{k}}": v.detach() for k, v in out.items()}}
    found.update({{f"grad.{{n}}": p.grad.detach() for n, p in m.named_parameters() if p.grad is not None}})
    found["grad.input"] = x.grad.detach()
    return found


eager = observe(call_block, model, x, y, DTYPE)
torch._dynamo.reset()
compiled = observe(torch.compile(call_block), model, x, y, DTYPE)
"""
    tensors = {names[k]: v for k, v in state.items()}
    tensors.update(x=block_runs.x.detach(), y=block_runs.y.detach())
    return code, tensors


def repro_of(block_runs: BlockRuns, dtype: torch.dtype, result: NumericsResult) -> FailureRepro | None:
    """The standalone reproduction of a failed numerics check of the default variant: the probe
    block (its source, its weights and inputs saved), eager and ``torch.compile`` (Inductor, what a
    user gets) under autocast, against float64, each quantity's excess over eager within the budget
    the harness derived (written into the script with its origin). None for a custom backend."""

    if block_runs.backend != "inductor":
        return None
    opening, tensors = _block_script(block_runs, dtype)
    allowance = {k: result.budget.allowance[k] for k in result.compiled}
    code = f"""{opening}ref = observe(call_block, copy.deepcopy(model).double(), x.double(), y, None)  # the float64 reference


def error(v, k):  # max |v - fp64| / max |fp64|
    scale = float(ref[k].abs().max())
    diff = float((v.double() - ref[k]).abs().max())
    return diff / scale if scale > 0 else diff


# per quantity, relative to max |fp64|: one low-precision rounding at each op boundary, propagated
# through the block in float64 (amp-harness derives it from the format's unit roundoff)
ALLOWANCE = {allowance!r}
ratios = {{k: (error(compiled[k], k) - error(eager[k], k)) / a for k, a in ALLOWANCE.items()}}
worst = max(ratios, key=lambda k: ratios[k])
for k in sorted(ratios, key=lambda k: -ratios[k])[:4]:
    print(f"{{k}}: compiled error {{error(compiled[k], k):.3g}}, eager {{error(eager[k], k):.3g}}, ({{ratios[k]:.3g}}x its budget)")
measured = ratios[worst]  # the worst quantity's excess over eager, in units of its budget
allowed = 1.0"""
    return FailureRepro(
        "compiled",
        f"torch.compile (Inductor) of the probe block under {dtype} autocast: every stage and gradient's error "
        "against float64 beyond eager's, over its budget",
        code,
        "one low-precision rounding per op boundary, propagated in float64 (harness/domains/compiled/budget.py)",
        tensors,
        device=str(block_runs.device),
    )


def dtypes_repro_of(block_runs: BlockRuns, dtype: torch.dtype) -> FailureRepro | None:
    """The standalone reproduction of a failed dtype check: every stage output and gradient of the
    compiled (Inductor) probe block against eager's dtype. None for a custom backend."""

    if block_runs.backend != "inductor":
        return None
    opening, tensors = _block_script(block_runs, dtype)
    code = f"""{opening}
# reference: eager's dtypes (autocast's policy, as eager applies it)
differ = [k for k in eager if k not in compiled or compiled[k].dtype != eager[k].dtype]
for k in differ:
    print(f"{{k}}: compiled {{compiled[k].dtype if k in compiled else 'missing'}}, eager {{eager[k].dtype}}")
measured = len(differ)  # stages and gradients whose dtype differs from eager's
allowed = 0"""
    return FailureRepro(
        "compiled",
        f"torch.compile (Inductor) of the probe block under {dtype} autocast: every stage and gradient's dtype "
        "against eager's",
        code,
        "exact: compiled AMP keeps autocast's dtypes",
        tensors,
        device=str(block_runs.device),
    )
