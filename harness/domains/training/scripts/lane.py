"""The AMP lane's judged steps, standalone: from each state of a run (weights, optimizer state,
next batch, loss scale), the next step taken three ways: by the recipe under autocast (attention
correctly rounded: its kernel is judged apart), exactly in float64, and correctly rounded to the
format in float64 with fp32 master weights. The AMP step's error over the correctly rounded step's,
both against float64, median over the states, is at most LANE_FACTOR.

amp-harness writes a failed lane's model, states and recipe over the defaults below
(``harness.domains.training.repro.lane_repro_of``). As it lies here it judges two SGD steps of a
small MLP under bf16. ``step`` is held to :func:`harness.domains.engines.training.loop.step_from` and the
emulation bit for bit by tests/test_whole_run_scripts.py.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

# -- model --


def mlp(seed: int) -> nn.Module:  # the default model: a small MLP regression
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))


LOSS: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.mse_loss

# -- inputs --
# the default states: the model's initial weights and a fresh SGD at steps 0 and 1, random batches
_gen = torch.Generator().manual_seed(0)
for _t in (0, 1):
    for _i, _w in enumerate(mlp(_t).state_dict().values()):
        globals()[f"m{_t}_{_i}"] = _w
    globals()[f"x{_t}"], globals()[f"y{_t}"] = torch.randn(16, 8, generator=_gen), torch.randn(16, 1, generator=_gen)

# -- parameters --
MODEL = mlp  # builds the model from a seed
INIT_SEED = 0
OPTIMIZER = torch.optim.SGD
DEVICE = "cpu"
LOW = torch.bfloat16  # the recipe's autocast dtype
SCALER = False  # fp16 with torch's GradScaler
MICRO = 1  # micro-batches per step
CLIP: float | None = None  # clip_grad_norm_'s max norm
# loss x LOSS_FACTOR in every step; the recipe's own: loss x STATIC (a static loss scale), each
# micro-batch's gradient divided by it into a buffer of dtype ACCUM (float32 where only STATIC is set)
LOSS_FACTOR = 1.0
STATIC: float | None = None
ACCUM: torch.dtype | None = None
# the run's state after each judged step t, saved as m<t>_<i> (the model's NAMES[i]), o<t>_<p>_<key>
# (the optimizer's state of parameter p where OPT_KEYS marks None), x<t>, y<t> (the next batch)
NAMES = list(mlp(0).state_dict())
OPT_KEYS: dict[int, dict[str, Any]] = {}
SCALES: dict[int, float | None] = {0: None, 1: None}  # the loss scale at each state
GROUPS = torch.optim.SGD(mlp(0).parameters(), lr=0.1).state_dict()["param_groups"]  # the hyperparameters
# an AMP step may be at most LANE_FACTOR times less accurate than the same step correctly rounded
# to its format: the error of one significand bit fewer (first-order rounding analysis: error ~ u)
LANE_FACTOR = 2.0
FP16_HEADROOM = 2.0**8  # the correctly rounded fp16 step's loss scale leaves this headroom
MAX_BACKOFF = 40  # halvings of that scale while the step overflows

# -- states --
State = tuple[dict[str, torch.Tensor], dict[int, dict[str, Any]], tuple[torch.Tensor, torch.Tensor], float | None]


def state(t: int) -> State:  # weights, optimizer state, next batch, loss scale
    g = globals()
    weights = {k: g[f"m{t}_{i}"] for i, k in enumerate(NAMES)}
    opt = {i: {k: g[f"o{t}_{i}_{k}"] if v is None else v for k, v in ks.items()} for i, ks in OPT_KEYS.items()}
    return weights, opt, (g[f"x{t}"], g[f"y{t}"]), SCALES[t]


STATES = {t: state(t) for t in SCALES}

# -- steps --


class Round(torch.autograd.Function):  # to LOW in the forward pass, the incoming gradient too
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = dtype
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.dtype).to(grad.dtype), None


def rounded(x: Any, dtype: torch.dtype) -> Any:  # a float64 tensor rounded to nearest even in dtype; else x
    return Round.apply(x, dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.float64 else x  # type: ignore[no-untyped-call]


# the functions autocast runs in low precision (PyTorch's autocast test lists), as models call them
LOW_PRECISION = {
    F.linear,
    F.conv1d,
    F.conv2d,
    F.conv3d,
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
    F.scaled_dot_product_attention,
    torch.matmul,
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.addbmm,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.Tensor.mm,
    torch.Tensor.bmm,
}


def attention(
    dtype: torch.dtype,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    # correctly rounded: both GEMMs take and give values rounded to dtype, the softmax is exact
    q, k, v = (rounded(t, dtype) for t in (q, k, v))
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = rounded(torch.matmul(q, k.transpose(-2, -1)) * factor, dtype)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
    return rounded(torch.matmul(rounded(torch.softmax(scores, dim=-1), dtype), v), dtype)


class Emulated(TorchFunctionMode):  # a float64 model's low-precision calls rounded as correct autocast rounds
    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func not in LOW_PRECISION:
            return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            return attention(LOW, *args, **kwargs)
        args, kwargs = [rounded(a, LOW) for a in args], {k: rounded(v, LOW) for k, v in kwargs.items()}
        return rounded(func(*args, **kwargs), LOW)


class CorrectAttention(TorchFunctionMode):  # autocast's attention correctly rounded: its kernel is judged apart
    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention or args[0].dtype not in (torch.bfloat16, torch.float16):
            return func(*args, **kwargs)
        wide: list[Any] = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        if isinstance(kwargs.get("attn_mask"), torch.Tensor) and kwargs["attn_mask"].is_floating_point():
            kwargs["attn_mask"] = kwargs["attn_mask"].double()
        return attention(args[0].dtype, *wide, **kwargs).to(args[0].dtype)


def flat(params: list[nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in params])


Step = tuple[torch.Tensor, torch.Tensor, float]


def step(
    t: int, kind: str, scale: float | None = None
) -> Step:  # from state t: "amp" (the recipe), "float64" (exact), "emulated" (correctly rounded)
    weights, opt_state, (x, y), run_scale = STATES[t]
    amp, emulated = kind == "amp", kind == "emulated"
    model = MODEL(INIT_SEED) if amp else MODEL(INIT_SEED).double()
    model.load_state_dict(weights)
    model = model.to(DEVICE).eval()  # dropout off: masks drawn in different dtypes differ
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.train()  # batch statistics, as in training
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZER(params, lr=0.0)
    opt.load_state_dict(
        {
            "state": {
                i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for i, s in opt_state.items()
            },
            "param_groups": GROUPS,
        }
    )
    scaler = torch.amp.GradScaler(DEVICE, init_scale=run_scale or 2.0**16) if SCALER and amp else None
    static, accum = (STATIC, ACCUM) if amp else (scale, None)
    if not amp:  # the problem in float64
        x, y = (t_.double() if t_.is_floating_point() else t_ for t_ in (x, y))
    before = flat(params)
    opt.zero_grad(set_to_none=True)
    acc: list[torch.Tensor] | None = None
    for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO), strict=True):
        with torch.autocast(DEVICE, dtype=LOW, enabled=amp), Emulated() if emulated else CorrectAttention():
            out = model(xm.to(DEVICE))
            loss = LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), ym.to(DEVICE)) / MICRO
        scaled = loss * LOSS_FACTOR * (static or 1.0)
        torch.autograd.backward(scaler.scale(scaled) if scaler else scaled)
        if static is not None or accum is not None:  # this micro-batch's gradient, unscaled, into buffers
            buf = accum or (torch.float64 if emulated else torch.float32)
            g = [
                (p.grad.to(torch.promote_types(p.grad.dtype, torch.float32)) / (static or 1.0)).to(buf)
                if p.grad is not None
                else torch.zeros_like(p, dtype=buf)
                for p in params
            ]
            acc = g if acc is None else [a + b for a, b in zip(acc, g, strict=True)]
            for p in params:
                p.grad = None
    for p, a in zip(params, acc or [], strict=False):
        p.grad = a.to(p.dtype)
    largest = max((float(p.grad.abs().max()) for p in params if p.grad is not None and p.grad.numel()), default=0.0)
    if CLIP is not None:  # unscaled first, then clipped
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, CLIP)
    (scaler.step(opt) if scaler else opt.step())
    after = flat(params)
    return before, after.float().double() if emulated else after, largest  # emulated: fp32 master weights


def correctly_rounded(
    t: int, largest: float
) -> torch.Tensor | None:  # fp16: the largest power-of-two loss scale leaving FP16_HEADROOM
    scale: float | None = None
    if torch.float16 == LOW:
        top = torch.finfo(LOW).max / FP16_HEADROOM / largest if largest > 0 else 2.0**16
        scale = 2.0 ** math.floor(math.log2(top))
    for _ in range(MAX_BACKOFF):  # halved while the step overflows
        before, after, _ = step(t, "emulated", scale)
        if bool(torch.isfinite(after).all()):
            return after - before
        if scale is None:
            return None
        scale /= 2
    return None


def relative_error(d: torch.Tensor, exact: torch.Tensor) -> float:
    norm, diff = float(exact.norm()), float((d - exact).norm())
    if not math.isfinite(diff):
        return math.inf
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


def ratio_of(a: float, b: float) -> float:  # a / b, with 0 / 0 = 0 and a / 0 = inf
    return a / b if b > 0 else (0.0 if a == 0 else math.inf)


ERRORS: dict[
    int, tuple[float, float]
] = {}  # step -> (the AMP step's error, the correctly rounded step's error), both against float64
for t in STATES:
    b64, a64, largest = step(t, "float64")
    emulated = correctly_rounded(t, largest)
    before, after, _ = step(t, "amp")
    if emulated is None or not bool(torch.isfinite(a64).all()) or (SCALER and bool((after == before).all())):
        print(f"step {t + 1}: left out (no finite correctly rounded step, or the scaler skipped it)")
        continue
    ERRORS[t] = (relative_error(after - before, a64 - b64), relative_error(emulated, a64 - b64))
    e_amp, e_emu = ERRORS[t]
    print(f"step {t + 1}: AMP step error {e_amp:.3g}, correctly rounded {e_emu:.3g} (x{ratio_of(e_amp, e_emu):.3g})")
ratios = sorted(ratio_of(a, e) for a, e in ERRORS.values())
n = len(ratios)
measured = (ratios[(n - 1) // 2] + ratios[n // 2]) / 2 if n else math.inf  # the median ratio over the steps
allowed = LANE_FACTOR
