"""The loss-scaling family's reproductions: a scaler's trace and its state machine's rules against
the rule written out, a third-party scaler's conformance example against its release's rule, one
optimizer step under GradScaler against its float64 update or a skip, and a clipped step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness.domains.repro import FailureRepro, dict_src
from harness.domains.scaler.clipping import ClipObservation
from harness.domains.scaler.optimizers import FLAGS, HYPER, ROUNDINGS, STATE_ROUNDINGS, Step


def scaler_trace(
    what: str,
    scaler_cls: str,
    growth_interval: int,
    inject_at: Sequence[int],
    steps: int,
    where: str,
) -> FailureRepro | None:
    """The fp16 loss-scaler trace with overflows injected at the steps ``inject_at`` (the scaler
    suite's trainer), against the scaler's rule written out: backoff x0.5 and skip on overflow, x2
    after ``growth_interval`` clean steps. None when ``scaler_cls`` (module.qualname) cannot be
    imported standalone."""
    module, _, qualname = scaler_cls.rpartition(".")
    if not module or "<" in qualname or not (module == "torch" or module.startswith("torch.")):
        return None
    inject = {
        "forward": (
            "        if s in INJECT_AT:\n            h = h * (65504.0 * 4)  # fp16 activations beyond 65504\n",
            "",
            "",
        ),
        "loss": ("", "    if s in INJECT_AT:\n        loss = loss * math.inf\n", ""),
        "backward": (
            "",
            "",
            "    if s in INJECT_AT:\n        l2.weight.grad.view(-1)[0] = math.inf  # one scaled gradient\n",
        ),
    }
    if where not in inject:
        return None
    fwd, lss, bwd = inject[where]
    group = (
        "import torch.distributed as dist\n\n"
        'dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # the scaler needs one\n'
        if "Sharded" in qualname
        else ""
    )
    code = f"""import {module}
{group}
GROWTH_INTERVAL, INJECT_AT, STEPS = {growth_interval}, {set(inject_at)!r}, {steps}  # overflows at INJECT_AT
torch.manual_seed(0)
l1, l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
params = [*l1.parameters(), *l2.parameters()]
opt = torch.optim.AdamW(params, lr=1e-2)
scaler = {scaler_cls}("cpu", growth_interval=GROWTH_INTERVAL)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
got = []
for s in range(STEPS):
    opt.zero_grad()
    before = [p.detach().clone() for p in params]
    scale = scaler.get_scale()
    with torch.autocast("cpu", dtype=torch.float16):
        h = torch.relu(l1(x))
{fwd}        loss = torch.nn.functional.mse_loss(l2(h).float(), y)
{lss}    scaler.scale(loss).backward()
{bwd}    scaler.step(opt)
    scaler.update()
    got.append((s, scale, all(torch.equal(b, p) for b, p in zip(before, params))))
# reference: the rule written out (init 2^16; overflow: skip, x0.5, restart the count; else x2 after
# GROWTH_INTERVAL clean steps in a row)
expected, scale, clean = [], 2.0**16, 0
for s in range(STEPS):
    overflow = s in INJECT_AT
    expected.append((s, scale, overflow))
    scale, clean = (scale * 0.5, 0) if overflow else ((scale * 2.0, 0) if clean + 1 == GROWTH_INTERVAL else (scale, clean + 1))
for g_, e_ in zip(got, expected):
    if g_ != e_:
        print(f"step {{g_[0]}}: scale {{g_[1]}} skipped={{g_[2]}}; expected scale {{e_[1]}} skipped={{e_[2]}}")
measured = sum(g_ != e_ for g_, e_ in zip(got, expected))  # steps whose scale or skip differ
allowed = 0"""
    return FailureRepro("scaler", what, code, "exact: the trace is deterministic, the rule integral")


_F32 = """def f32(x):  # a Python float rounded to float32, to nearest; beyond its range: inf
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)"""  # the scalers' scripts round as float32 holds a scale


def scaler_rules(
    what: str, scaler_cls: str, transcript: Sequence[tuple[str, Mapping[str, Any]]], cap_growth: bool
) -> FailureRepro | None:
    """The GradScaler state machine's failing example, its rules replayed in order on the scaler
    suite's model, against the scaler rule written out (torch semantics, float32-faithful): after
    every rule the scale and growth tracker, and after every step with inf/NaN the parameters and
    optimizer state left bit-identical. None when ``scaler_cls`` cannot be imported standalone or
    the transcript does not start with the machine's setup."""
    module, _, qualname = scaler_cls.rpartition(".")
    if not module.startswith("torch") or "<" in qualname or not transcript or transcript[0][0] != "setup":
        return None
    rules = ",\n".join(f"    ({name!r}, {dict_src(args)})" for name, args in transcript)
    group = (
        'import torch.distributed as dist\n\ndist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)\n'
        if "Sharded" in qualname
        else ""
    )
    code = f"""import struct

import {module}
{group}
# the failing example hypothesis found: the machine's rules in the order they ran
RULES = [
{rules},
]
CAP_GROWTH = {cap_growth!r}  # a growth overflowing float32 is not applied (torch semantics)


{_F32}


def rule_update(scale, tracker, found_inf, cfg):  # reference: torch's loss-scaling rule, written out
    if found_inf:
        return f32(scale * cfg["backoff"]), 0
    if tracker + 1 == cfg["growth_interval"]:
        grown = f32(scale * cfg["growth"])
        return (grown if math.isfinite(grown) or not CAP_GROWTH else scale), 0
    return scale, tracker + 1


def optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def state(opt):
    return [v.clone() if torch.is_tensor(v) else torch.tensor(float(v)) for s in opt.state_dict()["state"].values() for _, v in sorted(s.items())]


def same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and bool(((x == y) | (x.isnan() & y.isnan())).all()) for x, y in zip(a, b))


measured = 0
for n, (name, a) in enumerate(RULES):
    if name == "setup":
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4), torch.nn.Linear(4, 1))
        params = list(model.parameters())
        opts = [optimizer(a["opt_kind"], p) for p in ([params[:2], params[2:]] if a["two_optimizers"] else [params])]
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
        y = torch.randn(16, 1, generator=torch.Generator().manual_seed(2))
        cfg = dict(growth=a["growth"], backoff=a["backoff"], growth_interval=a["growth_interval"])
        init = 2.0 ** a["init_exp"]
        scaler = {scaler_cls}("cpu", init_scale=init, growth_factor=a["growth"], backoff_factor=a["backoff"], growth_interval=a["growth_interval"])
        scale, tracker = f32(init), 0
    elif name == "set_scale":
        value = 2.0 ** a["exponent"]
        scaler.update(torch.tensor(value) if a["as_tensor"] else value)
        scale = f32(value)  # update(new_scale): the scale replaced, the tracker kept
    elif name == "reload_into_a_fresh_scaler":
        fresh = {scaler_cls}("cpu")
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
            scaler.scale(torch.nn.functional.mse_loss(model(x[i::k]), y[i::k]) / k).backward()
        if name == "overflow_step":
            params[a["index"]].grad.view(-1)[0] = a["value"]
        if name == "accumulated_step" and a["overflow"]:
            params[0].grad.view(-1)[0] = math.inf
        found = [any(not bool(p.grad.isfinite().all()) for p in o.param_groups[0]["params"]) for o in opts]
        before = [([p.detach().clone() for p in o.param_groups[0]["params"]], state(o)) for o in opts]
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
                scaler.unscale_(opts[0]) if m in ("unscale_twice", "unscale_after_step") else scaler.step(opts[0], **({{"closure": lambda: None}} if m == "closure" else {{}}))
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
        for o, inf, (p0, s0) in zip(opts, found, before):
            if inf and name != "documented_misuse_raises" and not (same([p.detach() for p in o.param_groups[0]["params"]], p0) and same(state(o), s0)):
                print(f"rule {{n}} {{name}} {{a}}: a step with inf/NaN gradients changed parameters or optimizer state")
                measured += 1
    got, want = (scaler.get_scale(), scaler._get_growth_tracker()), (scale, tracker)
    if got != want:
        print(f"rule {{n}} {{name}} {{a}}: scaler (scale, growth tracker) = {{got}}, the rule gives {{want}}")
        measured += 1
allowed = 0  # rules after which the scaler is unlike the rule"""
    return FailureRepro("scaler", what, code, "exact: the rule is float32-faithful, the trace deterministic")


#: The third-party scalers' rules, written out as the conformance machine's specification holds
#: them (``harness.domains.scaler.reference.update``): one iteration's update of the state.
_SPEC_RULES = {
    "megatron": """def spec_update(s, found_inf):  # reference: megatron-core's DynamicGradScaler rule, written out
    if found_inf:  # the scale backs off once hysteresis overflows have been seen, never below min_scale
        left = s["hysteresis_left"] - 1
        scale = max(f32(s["scale"] * CFG["backoff_factor"]), CFG["min_scale"]) if left <= 0 else s["scale"]
        return dict(s, scale=scale, tracker=0, hysteresis_left=left)
    if s["tracker"] + 1 == CFG["growth_interval"]:  # growth_interval clean iterations: grow, hysteresis refilled
        return dict(s, scale=f32(s["scale"] * CFG["growth_factor"]), tracker=0, hysteresis_left=CFG["hysteresis"])
    return dict(s, tracker=s["tracker"] + 1)""",
    "deepspeed": """def spec_update(s, found_inf):  # reference: DeepSpeed's DynamicLossScaler rule, written out
    it = s["iteration"]  # Python floats: no float32 rounding or overflow
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
    return dict(s, iteration=it + 1)""",
}


#: The scaler as the harness's ready adapter builds and drives it (harness.domains.scaler.adapters),
#: with the same CPU shims.
_SCALER_UNDER_TEST = {
    "megatron-core": """import megatron.core.optimizer.grad_scaler as grad_scaler
from torch.overrides import TorchFunctionMode


class CudaOnCpu(TorchFunctionMode):  # DynamicGradScaler makes its tensors on 'cuda': on a CPU host, there
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def make_scaler():
    args = {k: CFG[c] for k, c in (("initial_scale", "init_scale"), ("min_scale", "min_scale"),
            ("growth_factor", "growth_factor"), ("backoff_factor", "backoff_factor"),
            ("growth_interval", "growth_interval"), ("hysteresis", "hysteresis"))}
    if torch.cuda.is_available():
        return grad_scaler.DynamicGradScaler(**args)
    with CudaOnCpu():
        return grad_scaler.DynamicGradScaler(**args)


def update(scaler, found_inf):
    scaler.update(found_inf)


def state_of(scaler):  # (scale, growth tracker)
    return float(scaler.scale.item()), int(scaler._growth_tracker)""",
    "deepspeed": """import inspect
from types import SimpleNamespace

import deepspeed.runtime.fp16.loss_scaler as loss_scaler


def make_scaler():
    cls = loss_scaler.DynamicLossScaler
    args = dict(init_scale=CFG["init_scale"], scale_window=CFG["growth_interval"], min_scale=CFG["min_scale"],
                delayed_shift=CFG["hysteresis"], consecutive_hysteresis=False,
                raise_error_at_min_scale=CFG["raise_at_min_scale"])
    if "scale_factor" in inspect.signature(cls.__init__).parameters:  # up to 0.17.0
        args["scale_factor"] = CFG["growth_factor"]
    return cls(**args)


def update(scaler, found_inf):
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


def state_of(scaler):  # (scale, growth tracker: DeepSpeed counts iterations, not clean steps)
    return float(scaler.cur_scale), None""",
}


def scaler_conformance(
    what: str, package: str, semantics: str, transcript: Sequence[tuple[str, Any]]
) -> FailureRepro | None:
    """The conformance machine's failing example against a third-party scaler (``package``: one of
    the ready adapters' packages), its iterations replayed on the scaler as the adapter drives it
    and on the ``semantics`` rule written out: after each, the scale, the growth tracker (where
    the scaler has one) and the at-minimum error compared. None for another scaler (your own
    adapter: the script would need your code) or a transcript without the machine's setup."""
    spec = _SPEC_RULES.get(semantics.split("<")[0].split(">")[0])
    under_test = _SCALER_UNDER_TEST.get(package)
    if spec is None or under_test is None or not transcript or transcript[0][0] != "setup":
        return None
    cfg = {k: v for k, v in transcript[0][1].items() if k not in ("max_scale", "cap_growth")}
    events = [bool(v) for name, v in transcript[1:] if name == "update"]
    code = f"""import struct

{under_test}


class AtMinimum(Exception):  # an overflow with the scale already at its minimum (DeepSpeed's error)
    pass


# the failing example hypothesis found: the configuration, then each iteration (True: inf/NaN gradients)
CFG = {dict_src(cfg)}
EVENTS = {events!r}
SEMANTICS = {semantics!r}  # the rule of the installed release


{_F32}


{spec}


def outcome(fn):  # (result, "at-minimum" or None)
    try:
        return fn(), None
    except AtMinimum:
        return None, "at-minimum"


scaler = make_scaler()
s = dict(scale=f32(CFG["init_scale"]), tracker=0, hysteresis_left=CFG["hysteresis"], iteration=0, last_overflow_iter=-1)
measured = 0
for n, found_inf in enumerate([None, *EVENTS]):  # None: as constructed
    got_error = want_error = None
    if found_inf is not None:
        _, got_error = outcome(lambda: update(scaler, found_inf))
        new, want_error = outcome(lambda: spec_update(s, found_inf))
        s = new or s
    scale, tracker = state_of(scaler)
    said = "as constructed" if found_inf is None else f"iteration {{n}} ({{'overflow' if found_inf else 'clean'}})"
    if got_error != want_error:
        print(f"{{said}}: the scaler raised {{got_error}}, the rule {{want_error}}")
        measured += 1
    if scale != s["scale"] or (tracker is not None and tracker != s["tracker"]):
        print(f"{{said}}: scaler (scale, growth tracker) = {{(scale, tracker)}}, the rule gives {{(s['scale'], s['tracker'])}}")
        measured += 1
allowed = 0  # iterations after which the scaler is unlike its release's rule"""
    return FailureRepro(
        "scaler",
        what,
        code,
        f"exact: the {semantics} rule, as its source states it (the scale is a power of two times the configured "
        "factors: no rounding to allow for)",
        needs=("torch", package),
    )


# -- one optimizer step under GradScaler (the scaler suite's optimizer matrix) -------------------
_OPTIMIZER_REFERENCES = {
    "SGD": """def reference(p, g, st):  # torch's SGD (momentum, weight decay), in float64
    d, d_abs = g + H["weight_decay"] * p, g.abs() + H["weight_decay"] * p.abs()
    buf = st.get("momentum_buffer")
    b, b_abs = (d, d_abs) if buf is None else (H["momentum"] * buf + d, H["momentum"] * buf.abs() + d_abs)
    new, mag = p - H["lr"] * b, p.abs() + H["lr"] * b_abs
    return new, gamma(K) * mag, {{"momentum_buffer": (b, gamma(K_STATE["momentum_buffer"]) * b_abs)}}""",
    "Adam": """def reference(p, g, st):  # torch's {name} (weight decay {decay}), in float64
    (b1, b2), lr, wd, eps = H["betas"], H["lr"], H["weight_decay"], H["eps"]
    step = float(st["step"]) + 1 if "step" in st else 1.0
    decayed, gd, gd_abs = {decayed}
    m0, v0 = st.get("exp_avg", torch.zeros_like(p)), st.get("exp_avg_sq", torch.zeros_like(p))
    m, m_abs = b1 * m0 + (1 - b1) * gd, 2 * m0.abs() + gd_abs  # torch's lerp: m0 + w (g - m0)
    v, v_abs = b2 * v0 + (1 - b2) * gd * gd, b2 * v0 + (1 - b2) * gd_abs * gd_abs
    denom = v.sqrt() / math.sqrt(1 - b2**step) + eps
    size = lr / (1 - b1**step)
    new, mag = decayed - size * m / denom, p.abs() + size * m_abs / denom
    exact = (torch.tensor(step, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))  # counts: exact
    return new, gamma(K) * mag, {{
        "exp_avg": (m, gamma(K_STATE["exp_avg"]) * m_abs),
        "exp_avg_sq": (v, gamma(K_STATE["exp_avg_sq"]) * v_abs),
        "step": exact,
    }}""",
    "Adagrad": """def reference(p, g, st):  # torch's Adagrad (weight decay, lr decay), in float64
    step = float(st["step"]) + 1
    gd, gd_abs = g + H["weight_decay"] * p, g.abs() + H["weight_decay"] * p.abs()
    s, s_abs = st["sum"] + gd * gd, st["sum"] + gd_abs * gd_abs
    clr = H["lr"] / (1 + (step - 1) * H["lr_decay"])
    std = s.sqrt() + H["eps"]
    new, mag = p - clr * gd / std, p.abs() + clr * gd_abs / std
    exact = (torch.tensor(step, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))  # counts: exact
    return new, gamma(K) * mag, {{"sum": (s, gamma(K_STATE["sum"]) * s_abs), "step": exact}}""",
}


def _loaded_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    scale: float,
    optimizer: str,
    received: str,
    device: str,
) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors and source that rebuild one step of a run: the parameters, the optimizer
    (``optimizer``: source over ``params``) loaded with its state, the scaled gradients as
    ``received`` received them, a GradScaler at ``scale``; and ``untouched()``, what a skipped step
    must leave bitwise as it was."""
    tensors: dict[str, torch.Tensor] = {}
    state_src = []
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        tensors[f"p{i}"], tensors[f"g{i}"] = p.detach(), g.detach()
        for key, value in state.get(i, {}).items():
            tensors[f"s{i}_{key}"] = value.detach()
        state_src.append("{" + ", ".join(f"{key!r}: s{i}_{key}" for key in state.get(i, {})) + "}")
    n = len(params)
    return (
        tensors,
        f"""P0 = [{", ".join(f"p{i}" for i in range(n))}]  # the parameters before the step
G = [{", ".join(f"g{i}" for i in range(n))}]  # their gradients, scaled, as {received} received them
STATE = [{", ".join(state_src)}]  # the optimizer's state before the step ({{}}: none yet)
SCALE = {scale!r}  # GradScaler's scale then (a power of two: unscaling is exact)
params = [torch.nn.Parameter(p.clone()) for p in P0]
opt = {optimizer}
for p, st in zip(params, STATE):
    if st:
        opt.state[p] = {{k: v.clone() for k, v in st.items()}}
for p, g in zip(params, G):
    p.grad = g.clone()
scaler = torch.amp.GradScaler({device!r}, init_scale=SCALE)
scaler.scale(torch.zeros((), device={device!r}))  # GradScaler creates its scale on first use


def same(a, b):  # bitwise, NaN equal to NaN
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def untouched():  # what a skipped step must leave as it was: parameters and optimizer state
    out = [f"parameter {{i}}" for i, (p, p0) in enumerate(zip(params, P0)) if not same(p.detach(), p0)]
    for i, (p, st) in enumerate(zip(params, STATE)):
        for k, v in opt.state.get(p, {{}}).items():
            if torch.is_tensor(v) and (not same(v, st[k]) if k in st else bool((v != 0).any())):
                out.append(f"state {{k}} of parameter {{i}}")
    return out
""",
    )


def optimizer_step(
    what: str,
    name: str,
    flags: Mapping[str, bool],
    hyper: Mapping[str, Any],
    step: int,
    scale: float,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    *,
    overflow: bool,
    roundings: int,
    state_roundings: Mapping[str, int],
    device: str = "cpu",
) -> FailureRepro | None:
    """One step of torch's optimizer ``name`` (``flags``: foreach, fused) stepped by GradScaler,
    from the parameters, state and scaled gradients the run had at ``step`` (saved exactly; the
    smallest faithful part of a training run). Without overflow: against the update written out in
    float64, within gamma_k(2^-24) of it evaluated on magnitudes (k: ``roundings``, the state's
    ``state_roundings``). With a planted non-finite gradient: parameters and state bitwise as they
    were, nothing created but zeros, the scale halved. None for an optimizer with no reference."""
    family = "Adam" if name in ("Adam", "AdamW") else name
    if family not in _OPTIMIZER_REFERENCES:
        return None
    decayed = (
        "p * (1 - lr * wd), g, g.abs()  # decoupled: the parameter decays"
        if name == "AdamW"
        else "p, g + wd * p, g.abs() + wd * p.abs()  # L2: the gradient carries the decay"
    )
    reference = _OPTIMIZER_REFERENCES[family].format(
        name=name, decay="decoupled" if name == "AdamW" else "as L2", decayed=decayed
    )
    used = {k: v for k, v in state_roundings.items() if f'K_STATE["{k}"]' in reference}
    tensors, loaded = _loaded_step(
        params,
        grads,
        state,
        scale,
        f"torch.optim.{name}(params, **H, **{dict_src(dict(flags))})",
        "GradScaler's step",
        device,
    )
    setup = f"""H = {dict_src(dict(hyper))}  # the optimizer's hyperparameters; the state of step {step} of the run
{loaded}
scaler.step(opt)
scaler.update()
"""
    if overflow:
        code = f"""{setup}
# reference: a step with a non-finite gradient is skipped (nothing moves) and the scale is halved
wrong = untouched()
if scaler.get_scale() != SCALE * 0.5:
    wrong.append(f"the scale: {{scaler.get_scale()!r}} after the step, not {{SCALE * 0.5!r}}")
for w in wrong:
    print(f"the skipped step changed {{w}}")
measured = len(wrong)  # things the skipped step changed
allowed = 0"""
        allowance = "exact: a skipped step changes nothing (bitwise) and halves the scale"
    else:
        code = f"""{setup}
U = 2.0**-24  # float32's unit roundoff
K, K_STATE = {roundings}, {dict_src(used)}  # roundings on the way to each result


def gamma(k):  # the bound on k float32 roundings: k u / (1 - k u)
    return k * U / (1 - k * U)


{reference}


ratios = []
for i, (p, p0, g, st) in enumerate(zip(params, P0, G, STATE)):
    new, budget, states = reference(p0.double(), g.double() / SCALE, {{k: v.double() for k, v in st.items()}})
    results = [("parameter", p.detach(), new, budget)] + [(k, opt.state[p].get(k), r, b) for k, (r, b) in states.items()]
    for entry, got, ref, bound in results:
        if got is None:
            print(f"parameter {{i}}: the step kept no {{entry}}")
            ratios.append(math.inf)
            continue
        err = (got.double() - ref).abs()
        ratio = float(torch.where(err == 0, 0.0, err / bound).max())  # NaN stays NaN
        if not ratio <= 1:
            print(f"parameter {{i}}, {{entry}}: worst error {{ratio:.3g}} x its budget")
        ratios.append(ratio)
measured = math.nan if any(r != r for r in ratios) else max(ratios)  # the worst error, in units of its budget
allowed = 1.0"""
        allowance = (
            f"gamma_k(2^-24) times the update evaluated on magnitudes, k = {roundings} roundings of torch's "
            f"{name} formula (state: its own roundings; step counts exact)"
        )
    return FailureRepro("scaler", what, code, allowance, tensors, device=device)


def clip_step(
    what: str,
    kind: str,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    scale: float,
    max_norm: float,
    foreach: bool,
    *,
    device: str = "cpu",
) -> FailureRepro:
    """One ``unscale_`` -> ``clip_grad_norm_`` -> ``step`` of the clipping suite's SGD (momentum)
    from the saved parameters, state and scaled gradients. ``kind``: ``float64`` (the returned norm
    and the clipped gradients against clipping's definition in float64, within gamma_(n+1) and
    gamma_(n+4) of float32's unit roundoff), ``non_finite`` (a planted inf/NaN: a non-finite norm,
    the step skipped bitwise, the scale halved) or ``error_if_nonfinite`` (a non-finite norm
    raises and keeps the gradients; a finite one never raises)."""
    tensors, loaded = _loaded_step(
        params, grads, state, scale, "torch.optim.SGD(params, lr=0.05, momentum=0.9)", "unscale_", device
    )
    setup = f"""MAX_NORM, FOREACH = {max_norm!r}, {foreach!r}
{loaded}
scaler.unscale_(opt)
"""
    if kind == "float64":
        code = f"""{setup}
norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH))
# reference: clipping by its definition in float64 from the gradients unscaled exactly (SCALE is a
# power of two): norm = sqrt(sum g^2), coefficient min(1, max_norm / (norm + 1e-6))
g64 = [g.double() / SCALE for g in G]
n = sum(g.numel() for g in g64)
ref_norm = math.sqrt(sum(float((g * g).sum()) for g in g64))
coef = min(1.0, MAX_NORM / (ref_norm + 1e-6))
U = 2.0**-24  # float32's unit roundoff


def gamma(k):  # the bound on k float32 roundings
    return k * U / (1 - k * U)


# budgets: the norm's n squares, n - 1 sums and root (gamma_(n+1)); each gradient adds the
# coefficient's sum and quotient and the product (gamma_(n+4)), plus float32's smallest subnormal
ratios = [abs(norm - ref_norm) / (gamma(n + 1) * ref_norm)]
print(f"total norm: torch {{norm!r}}, float64 {{ref_norm!r}} (coefficient {{coef:.6g}})")
for i, (p, g) in enumerate(zip(params, g64)):
    ref = g * coef
    ratios.append(float(((p.grad.double() - ref).abs() / (gamma(n + 4) * ref.abs() + 2.0**-149)).max()))
measured = math.nan if any(r != r for r in ratios) else max(ratios)  # the worst error, in units of its budget
allowed = 1.0"""
        allowance = "gamma_(n+1)(2^-24) of the norm; gamma_(n+4)(2^-24) |clipped| of each gradient"
    elif kind == "non_finite":
        code = f"""{setup}
norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH))
scaler.step(opt)
scaler.update()
# reference: an inf/NaN gradient has a non-finite norm (never a finite sentinel), GradScaler skips
# the step (nothing moves, bitwise) and halves the scale
wrong = [f"clip_grad_norm_ returned a finite norm {{norm!r}}"] if math.isfinite(norm) else []
wrong += [f"the skipped step changed {{w}}" for w in untouched()]
if scaler.get_scale() != SCALE * 0.5:
    wrong.append(f"the scale went {{SCALE!r}} -> {{scaler.get_scale()!r}}, not halved")
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0"""
        allowance = "exact: a non-finite norm, nothing moved, the scale halved"
    else:
        code = f"""{setup}
kept = [p.grad.clone() for p in params]
planted = any(not bool(g.isfinite().all()) for g in G)
try:
    torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH, error_if_nonfinite=True)
    raised = None
except RuntimeError as exc:
    raised = str(exc).splitlines()[0]
if raised is None:
    scaler.step(opt)
scaler.update()
# reference: error_if_nonfinite=True raises on a non-finite norm with the gradients as they were
# (and the step is skipped); with finite gradients it never raises
wrong = []
if planted and raised is None:
    wrong.append("a non-finite gradient, and no error raised")
if not planted and raised is not None:
    wrong.append(f"finite gradients, yet clip_grad_norm_ raised: {{raised}}")
if planted and not all(same(p.grad, k) for p, k in zip(params, kept)):
    wrong.append("the gradients changed although clipping refused")
if planted:
    wrong += [f"the skipped step changed {{w}}" for w in untouched()]
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0"""
        allowance = "exact: a non-finite norm raises, the gradients and the step untouched; a finite one never raises"
    return FailureRepro("scaler", what, code, allowance, tensors, device=device)


def clipping_repro_of(o: ClipObservation, foreach: bool, kind: str, device: torch.device) -> FailureRepro:
    """Step ``o`` alone as a standalone script (:func:`harness.domains.scaler.repro.clip_step`)."""
    impl = "foreach" if foreach else "for-loop"
    what = {
        "float64": f"torch's {impl} unscale_ + clip_grad_norm_({o.max_norm:g}): the worst error over its float32 budget",
        "non_finite": f"torch's {impl} unscale_ + clip_grad_norm_ with {o.planted} planted: promises broken",
        "error_if_nonfinite": f"torch's {impl} clip_grad_norm_(error_if_nonfinite=True): promises broken",
    }[kind]
    return clip_step(
        what,
        kind,
        list(o.params_before),
        list(o.grads_scaled),
        o.state_before,
        o.scale_before,
        o.max_norm,
        foreach,
        device=device.type,
    )


def optimizer_repro_of(name: str, implementation: str, step: Step, device: torch.device) -> FailureRepro | None:
    """The failed ``step`` of a torch optimizer's run as a standalone script: that one step under
    GradScaler from the saved parameters, state and scaled gradients, against the float64 update
    (or, with overflow, against nothing moving and the scale halved)."""
    kind = "overflow step" if step.overflow else "step"
    return optimizer_step(
        f"torch's {implementation} {name} under GradScaler, {kind} {step.index}: "
        + ("what the skipped step changed" if step.overflow else "|update - float64| in units of its budget"),
        name,
        FLAGS[implementation],
        HYPER[name],
        step.index,
        step.scale_before,
        step.params_before,
        step.grads_scaled,
        step.state_before,
        overflow=step.overflow,
        roundings=ROUNDINGS[name],
        state_roundings=STATE_ROUNDINGS,
        device=device.type,
    )
