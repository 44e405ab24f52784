"""A loss scaler's scale, standalone, against its rule written out: the fp16 trace with overflows
injected (in the forward pass, the loss or one scaled gradient), the GradScaler state machine's
failing example replayed rule by rule, and a third-party scaler's conformance example replayed
iteration by iteration against its release's rule.

amp-harness keeps the blocks a failed check needs and writes its values over the defaults below
(``harness.domains.scaler.repro``): the scaler's module, a process group for a sharded scaler, the
third-party scaler as the harness's adapter drives it (its import inside ``make_scaler``). As it
lies here every judgement runs on torch's GradScaler, and the conformance example on torch's own
update kernel (``torch._amp_update_scale_``), whose rule is megatron-core's at hysteresis 1.
"""

import inspect
import math
import struct
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

# -- scaler_module --
import torch.amp  # isort: skip  (the module of the scaler under test)

# -- group --
if not dist.is_initialized():  # a sharded scaler needs a process group: one process, in memory
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]

# -- trace --
SCALER: Any = torch.amp.GradScaler  # the scaler under test
GROWTH_INTERVAL = 3
INJECT_AT = {2, 5}  # steps whose overflow is injected
STEPS = 8
WHERE = "backward"  # where: forward (fp16 activations beyond 65504), loss (inf), backward (one gradient)
torch.manual_seed(0)
l1, l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
trace_params = [*l1.parameters(), *l2.parameters()]
trace_opt = torch.optim.AdamW(trace_params, lr=1e-2)
trace_scaler = SCALER("cpu", growth_interval=GROWTH_INTERVAL)
gen = torch.Generator().manual_seed(1)
trace_x, trace_y = torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)
got: list[tuple[int, float, bool]] = []
for s in range(STEPS):
    trace_opt.zero_grad()
    before = [p.detach().clone() for p in trace_params]
    scale = trace_scaler.get_scale()
    with torch.autocast("cpu", dtype=torch.float16):
        h = torch.relu(l1(trace_x))
        if WHERE == "forward" and s in INJECT_AT:
            h = h * (65504.0 * 4)  # fp16 activations beyond 65504
        loss = torch.nn.functional.mse_loss(l2(h).float(), trace_y)
    if WHERE == "loss" and s in INJECT_AT:
        loss = loss * math.inf
    torch.autograd.backward(trace_scaler.scale(loss))
    if WHERE == "backward" and s in INJECT_AT and l2.weight.grad is not None:
        l2.weight.grad.view(-1)[0] = math.inf  # one scaled gradient
    trace_scaler.step(trace_opt)
    trace_scaler.update()
    got.append((s, scale, all(torch.equal(b, p) for b, p in zip(before, trace_params, strict=True))))
# reference: the rule written out (init 2^16; overflow: skip, x0.5, restart the count; else x2 after
# GROWTH_INTERVAL clean steps in a row)
expected: list[tuple[int, float, bool]] = []
rule_scale, clean = 2.0**16, 0
for s in range(STEPS):
    overflow = s in INJECT_AT
    expected.append((s, rule_scale, overflow))
    if overflow:
        rule_scale, clean = rule_scale * 0.5, 0
    elif clean + 1 == GROWTH_INTERVAL:
        rule_scale, clean = rule_scale * 2.0, 0
    else:
        clean += 1
for g_, e_ in zip(got, expected, strict=True):
    if g_ != e_:
        print(f"step {g_[0]}: scale {g_[1]} skipped={g_[2]}; expected scale {e_[1]} skipped={e_[2]}")
measured = sum(g_ != e_ for g_, e_ in zip(got, expected, strict=True))  # steps whose scale or skip differ
allowed = 0

# -- f32 --


def f32(x: float) -> float:  # a Python float rounded to float32, to nearest; beyond its range: inf
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


# -- rules --
SCALER = torch.amp.GradScaler  # the scaler under test
# the failing example hypothesis found: the machine's rules in the order they ran
RULES: list[tuple[str, dict[str, Any]]] = [
    (
        "setup",
        {
            "opt_kind": "sgd",
            "two_optimizers": True,
            "growth": 2.0,
            "backoff": 0.5,
            "growth_interval": 2,
            "init_exp": 10,
        },
    ),
    ("overflow_step", {"index": 0, "value": math.inf}),
    ("clean_step", {}),
    ("clean_step", {}),
    ("set_scale", {"exponent": 3, "as_tensor": True}),
    ("reload_into_a_fresh_scaler", {}),
    ("change_growth_interval", {"interval": 1}),
    ("accumulated_step", {"micro_batches": 2, "overflow": False}),
]
CAP_GROWTH = True  # a growth overflowing float32 is not applied (torch semantics)


def rule_update(scale: float, tracker: int, found_inf: bool, cfg: dict[str, Any]) -> tuple[float, int]:
    """Reference: torch's loss-scaling rule, written out."""
    if found_inf:
        return f32(scale * cfg["backoff"]), 0
    if tracker + 1 == cfg["growth_interval"]:
        grown = f32(scale * cfg["growth"])
        return (grown if math.isfinite(grown) or not CAP_GROWTH else scale), 0
    return scale, tracker + 1


def optimizer(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    entries = opt.state_dict()["state"].values()
    return [v.clone() if torch.is_tensor(v) else torch.tensor(float(v)) for s in entries for _, v in sorted(s.items())]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and bool(((x == y) | (x.isnan() & y.isnan())).all()) for x, y in zip(a, b, strict=True)
    )


measured = 0
scaler: Any = None
for n, (name, a) in enumerate(RULES):
    if name == "setup":
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4), torch.nn.Linear(4, 1)
        )
        params = list(model.parameters())
        opts = [optimizer(a["opt_kind"], p) for p in ([params[:2], params[2:]] if a["two_optimizers"] else [params])]
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
        y = torch.randn(16, 1, generator=torch.Generator().manual_seed(2))
        cfg = dict(growth=a["growth"], backoff=a["backoff"], growth_interval=a["growth_interval"])
        init = 2.0 ** a["init_exp"]
        scaler = SCALER(
            "cpu",
            init_scale=init,
            growth_factor=a["growth"],
            backoff_factor=a["backoff"],
            growth_interval=a["growth_interval"],
        )
        scale, tracker = f32(init), 0
    elif name == "set_scale":
        value = 2.0 ** a["exponent"]
        scaler.update(torch.tensor(value) if a["as_tensor"] else value)
        scale = f32(value)  # update(new_scale): the scale replaced, the tracker kept
    elif name == "reload_into_a_fresh_scaler":
        fresh = SCALER("cpu")
        fresh.load_state_dict(scaler.state_dict())
        scaler = fresh
    elif name == "change_growth_interval":
        scaler.set_growth_interval(a["interval"])
        cfg["growth_interval"] = a["interval"]
    else:  # a step: backward (micro-batches), maybe a gradient made inf/NaN, maybe clipping or a misuse
        for o in opts:
            o.zero_grad(set_to_none=False)
        k = a.get("micro_batches", 1)
        for i in range(k):
            torch.autograd.backward(scaler.scale(torch.nn.functional.mse_loss(model(x[i::k]), y[i::k]) / k))
        grads: list[Any] = [p.grad for p in params]
        if name == "overflow_step":
            grads[a["index"]].view(-1)[0] = a["value"]
        if name == "accumulated_step" and a["overflow"]:
            grads[0].view(-1)[0] = math.inf
        found = [any(not bool(p.grad.isfinite().all()) for p in o.param_groups[0]["params"]) for o in opts]
        held = [([p.detach().clone() for p in o.param_groups[0]["params"]], state(o)) for o in opts]
        if name == "clipped_step":
            for o in opts:
                scaler.unscale_(o)
            torch.nn.utils.clip_grad_norm_(params, a["max_norm"])
        if name == "documented_misuse_raises":
            m = a["misuse"]
            if m == "unscale_twice":
                scaler.unscale_(opts[0])
            if m in ("unscale_after_step", "step_twice"):
                scaler.step(opts[0])
            try:
                if m in ("unscale_twice", "unscale_after_step"):
                    scaler.unscale_(opts[0])
                else:
                    scaler.step(opts[0], **({"closure": lambda: None} if m == "closure" else {}))
            except RuntimeError:
                pass
            for o in opts:
                if m == "closure" or o is not opts[0] or m == "unscale_twice":
                    scaler.step(o)
        else:
            for o in opts:
                scaler.step(o)
        scaler.update()
        scale, tracker = rule_update(scale, tracker, any(found), cfg)
        for o, inf, (p0, s0) in zip(opts, found, held, strict=True):
            now = [p.detach() for p in o.param_groups[0]["params"]]
            if inf and name != "documented_misuse_raises" and not (same(now, p0) and same(state(o), s0)):
                print(f"rule {n} {name} {a}: a step with inf/NaN gradients changed parameters or optimizer state")
                measured += 1
    got_state, want = (scaler.get_scale(), scaler._get_growth_tracker()), (scale, tracker)
    if got_state != want:
        print(f"rule {n} {name} {a}: scaler (scale, growth tracker) = {got_state}, the rule gives {want}")
        measured += 1
allowed = 0  # rules after which the scaler is unlike the rule

# -- conformance_parameters --


class AtMinimum(Exception):  # an overflow with the scale already at its minimum (DeepSpeed's error)
    pass


# the failing example hypothesis found: the configuration, then each iteration (True: inf/NaN gradients)
CFG: dict[str, Any] = {
    "init_scale": 1024.0,
    "min_scale": 1.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2,
    "hysteresis": 1,
    "raise_at_min_scale": False,
}
EVENTS = [False, True, False, False, True, True]
SEMANTICS = "megatron-core"  # the rule of the installed release

# -- deepspeed_rule --


def spec_update(s: dict[str, Any], found_inf: bool) -> dict[str, Any]:
    """Reference: DeepSpeed's DynamicLossScaler rule, written out (Python floats: no float32
    rounding or overflow)."""
    it = s["iteration"]
    if found_inf:
        if CFG["hysteresis"] == 1 or s["hysteresis_left"] == 1:
            if s["scale"] == CFG["min_scale"] and CFG["raise_at_min_scale"]:
                raise AtMinimum("an overflow at the minimum scale")
            s = dict(s, scale=max(s["scale"] / CFG["growth_factor"], CFG["min_scale"]))
        else:
            s = dict(s, hysteresis_left=s["hysteresis_left"] - 1)
        return dict(s, last_overflow_iter=it, iteration=it + 1)
    since = it - s["last_overflow_iter"]
    stable = since if SEMANTICS == "deepspeed<=0.17.0" else since - 1  # deepspeedai/DeepSpeed#6976
    if stable > 0 and stable % CFG["growth_interval"] == 0:
        s = dict(s, scale=s["scale"] * CFG["growth_factor"], hysteresis_left=CFG["hysteresis"])
    return dict(s, iteration=it + 1)


# -- megatron_rule --


def spec_update(s: dict[str, Any], found_inf: bool) -> dict[str, Any]:  # type: ignore[no-redef]  # noqa: F811
    """Reference: megatron-core's DynamicGradScaler rule, written out."""
    if found_inf:  # the scale backs off once hysteresis overflows have been seen, never below min_scale
        left = s["hysteresis_left"] - 1
        scale = max(f32(s["scale"] * CFG["backoff_factor"]), CFG["min_scale"]) if left <= 0 else s["scale"]
        return dict(s, scale=scale, tracker=0, hysteresis_left=left)
    if s["tracker"] + 1 == CFG["growth_interval"]:  # growth_interval clean iterations: grow, hysteresis refilled
        return dict(s, scale=f32(s["scale"] * CFG["growth_factor"]), tracker=0, hysteresis_left=CFG["hysteresis"])
    return dict(s, tracker=s["tracker"] + 1)


# -- deepspeed --
# the scaler as the harness's ready adapter builds and drives it


def make_scaler() -> Any:
    import deepspeed.runtime.fp16.loss_scaler as loss_scaler

    cls = loss_scaler.DynamicLossScaler
    args = dict(
        init_scale=CFG["init_scale"],
        scale_window=CFG["growth_interval"],
        min_scale=CFG["min_scale"],
        delayed_shift=CFG["hysteresis"],
        consecutive_hysteresis=False,
        raise_error_at_min_scale=CFG["raise_at_min_scale"],
    )
    if "scale_factor" in inspect.signature(cls.__init__).parameters:  # up to 0.17.0
        args["scale_factor"] = CFG["growth_factor"]
    return cls(**args)


def update(scaler: Any, found_inf: bool) -> None:
    import deepspeed.runtime.fp16.loss_scaler as loss_scaler

    comm = loss_scaler.dist  # update_scale logs on rank 0; without a distributed backend, this is rank 0
    if not comm.is_initialized():
        loss_scaler.dist = SimpleNamespace(get_rank=lambda: 0)
    try:
        scaler.update_scale(found_inf)
    except Exception as exc:
        if "Current loss scale already at minimum" in str(exc):  # its way of signalling the minimum
            raise AtMinimum(str(exc)) from exc
        raise
    finally:
        loss_scaler.dist = comm


def state_of(scaler: Any) -> tuple[float, int | None]:  # (scale, growth tracker: DeepSpeed counts iterations)
    return float(scaler.cur_scale), None


# -- megatron_core --
# the scaler as the harness's ready adapter builds and drives it, with the same CPU shim


class CudaOnCpu(TorchFunctionMode):  # DynamicGradScaler makes its tensors on 'cuda': on a CPU host, there
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def make_scaler() -> Any:  # type: ignore[no-redef]  # noqa: F811
    import megatron.core.optimizer.grad_scaler as grad_scaler

    names = (
        ("initial_scale", "init_scale"),
        ("min_scale", "min_scale"),
        ("growth_factor", "growth_factor"),
        ("backoff_factor", "backoff_factor"),
        ("growth_interval", "growth_interval"),
        ("hysteresis", "hysteresis"),
    )
    args = {k: CFG[c] for k, c in names}
    if torch.cuda.is_available():
        return grad_scaler.DynamicGradScaler(**args)
    with CudaOnCpu():
        return grad_scaler.DynamicGradScaler(**args)


def update(scaler: Any, found_inf: bool) -> None:  # type: ignore[no-redef]  # noqa: F811
    scaler.update(found_inf)


def state_of(scaler: Any) -> tuple[float, int | None]:  # type: ignore[no-redef]  # noqa: F811  # (scale, growth tracker)
    return float(scaler.scale.item()), int(scaler._growth_tracker)


# -- torch_kernel --
# the default's scaler: torch's own update kernel, whose rule is megatron-core's at hysteresis 1


def make_scaler() -> Any:  # type: ignore[no-redef]  # noqa: F811
    return torch.full((), CFG["init_scale"]), torch.zeros((), dtype=torch.int32)


def update(scaler: Any, found_inf: bool) -> None:  # type: ignore[no-redef]  # noqa: F811
    scale, tracker = scaler
    inf = torch.full((), float(found_inf))
    factors = CFG["growth_factor"], CFG["backoff_factor"], CFG["growth_interval"]
    torch._amp_update_scale_(scale, tracker, inf, *factors)


def state_of(scaler: Any) -> tuple[float, int | None]:  # type: ignore[no-redef]  # noqa: F811
    return float(scaler[0]), int(scaler[1])


# -- conformance --


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:  # (result, "at-minimum" or None)
    try:
        return fn(*args), None
    except AtMinimum:
        return None, "at-minimum"


conformance_scaler = make_scaler()
spec = dict(
    scale=f32(CFG["init_scale"]), tracker=0, hysteresis_left=CFG["hysteresis"], iteration=0, last_overflow_iter=-1
)
measured = 0
for n, found_inf in enumerate([None, *EVENTS]):  # None: as constructed
    got_error = want_error = None
    if found_inf is not None:
        _, got_error = outcome(update, conformance_scaler, found_inf)
        new, want_error = outcome(spec_update, spec, found_inf)
        spec = new or spec
    now_scale, now_tracker = state_of(conformance_scaler)
    said = "as constructed" if found_inf is None else f"iteration {n} ({'overflow' if found_inf else 'clean'})"
    if got_error != want_error:
        print(f"{said}: the scaler raised {got_error}, the rule {want_error}")
        measured += 1
    if now_scale != spec["scale"] or (now_tracker is not None and now_tracker != spec["tracker"]):
        print(
            f"{said}: scaler (scale, growth tracker) = {(now_scale, now_tracker)}, "
            f"the rule gives {(spec['scale'], spec['tracker'])}"
        )
        measured += 1
allowed = 0  # iterations after which the scaler is unlike its release's rule
