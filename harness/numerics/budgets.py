"""Elementwise error budgets for ops against a float64 reference, derived from rounding-error
analysis rather than guessed.

Each function takes the float64 inputs, the format the op computes in, and returns a
:class:`Budget`: a bound per output element and the text of its derivation. Conventions:

* ``u`` is a format's unit roundoff, ``eta`` half its smallest subnormal: one rounding of ``x``
  errs by at most ``u|x| + eta`` (Higham, Thm 2.2, with gradual underflow);
* ``gamma_n = n u / (1 - n u)`` bounds n successive roundings (Higham, Lemma 3.1); a recursive
  sum or dot product of n terms errs by at most ``gamma_{n-1}`` (sum) or ``gamma_n`` (dot) times
  the sum of absolute terms (Higham, eqs. 3.5 and 4.4); blocked and pairwise orders only do better;
* low-precision matrix products accumulate in fp32 (what oneDNN and cuBLAS do for bf16/fp16
  GEMM): inputs round to the low format, products and sums follow fp32's ``gamma``, the output
  rounds to the low format;
* elementary functions are within ``ULP_ELEMENTARY`` units in the last place (ulp = 2u).

First-order bounds: second-order terms in ``u`` are dropped only where they are below
``u^2`` times the kept terms, far below the float64 reference's own error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.numerics.formats import FP32, FloatFormat
from harness.numerics.tolerance import gamma

#: Max error of exp/log/pow/rsqrt in ulps: CUDA C Programming Guide, "Mathematical Functions",
#: single precision: expf 2 ulp, logf 1 ulp, powf 4 ulp, rsqrtf 2 ulp; SLEEF's u10 variants
#: (PyTorch's CPU vector path) are within 1.0 ulp. The largest, 4 ulp, bounds them all.
ULP_ELEMENTARY = 4


@dataclass(frozen=True)
class Budget:
    bound: torch.Tensor
    origin: str


def _u(fmt: FloatFormat) -> float:
    return fmt.unit_roundoff


def _eta(fmt: FloatFormat) -> float:
    return fmt.smallest_subnormal / 2


def _elem(fmt: FloatFormat) -> float:
    """Error of one elementary function evaluation, relative: ULP_ELEMENTARY ulps = 2 x that many u."""
    return 2 * ULP_ELEMENTARY * _u(fmt)


def matmul_like(
    a: torch.Tensor,
    b: torch.Tensor,
    k: int,
    low: FloatFormat,
    product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    bias: torch.Tensor | None = None,
    acc: FloatFormat = FP32,
) -> Budget:
    """A bilinear op ``product(a, b) (+ bias)`` with reduction length ``k`` (mm, bmm, linear via
    ``product``, conv via ``F.conv2d``), inputs rounded to ``low``, fp32 accumulation."""
    u, eta, ua = _u(low), _eta(low), _u(acc)
    ref = product(a, b) + (0 if bias is None else bias)
    s = product(a.abs(), b.abs()) + (0 if bias is None else bias.abs())
    ones_a, ones_b = torch.ones_like(a), torch.ones_like(b)
    # input rounding: |fl(a)fl(b) - ab| <= (2u + u^2)|a||b| + eta(1+u)(|a| + |b|) + eta^2
    in_err = (2 * u + u * u) * s + eta * (1 + u) * (product(a.abs(), ones_b) + product(ones_a, b.abs())) + eta * eta * k
    acc_err = gamma(k + 1, ua) * (1 + u) ** 2 * (s + in_err)
    total = in_err + acc_err
    # the output rounds to the low format once; with a bias, kernels may round the product first
    # and add the bias in the low format, a second rounding
    roundings = 1 if bias is None else 2
    out_err = roundings * (u * (ref.abs() + total) + eta)
    origin = (
        f"inputs rounded to {low.name} ((2u+u^2) sum|a||b|, u=2^-{low.precision}), products summed in {acc.name} "
        f"(gamma_{k + 1}(2^-{acc.precision}) sum|a||b|), output rounded to {low.name} ({roundings} x (u|c|+eta))"
    )
    return Budget(total + out_err, origin)


def summation(x: torch.Tensor, dim: int | None, fmt: FloatFormat) -> Budget:
    n = x.numel() if dim is None else x.shape[dim]
    s = x.abs().sum() if dim is None else x.abs().sum(dim)
    g = gamma(max(n - 1, 0), _u(fmt))
    return Budget(g * s + _eta(fmt), f"sum of n={n} in {fmt.name}: gamma_{n - 1} sum|x| (Higham eq. 4.4)")


def cumulative_sum(x: torch.Tensor, dim: int, fmt: FloatFormat) -> Budget:
    n = x.shape[dim]
    idx = torch.arange(n, dtype=torch.float64).reshape([-1 if d == dim % x.dim() else 1 for d in range(x.dim())])
    u = _u(fmt)
    g = idx * u / (1 - idx * u)  # gamma_i for the i-th prefix
    return Budget(g * x.abs().cumsum(dim) + _eta(fmt), f"prefix sums in {fmt.name}: gamma_i sum_(j<=i)|x_j|")


def product(x: torch.Tensor, fmt: FloatFormat) -> Budget:
    n = x.numel()
    g = gamma(max(n - 1, 0), _u(fmt))
    return Budget(
        g * x.prod().abs() + _eta(fmt), f"product of n={n} in {fmt.name}: gamma_{n - 1}|prod| (Higham Lemma 3.1)"
    )


def vector_norm(x: torch.Tensor, fmt: FloatFormat) -> Budget:
    n = x.numel()
    ref = torch.linalg.vector_norm(x)
    g = gamma(n + 1, _u(fmt))
    return Budget(g * ref + _eta(fmt), f"2-norm of n={n} in {fmt.name}: squares and sum gamma_{n + 1}, sqrt u")


def elementwise(ref: torch.Tensor, fmt: FloatFormat, what: str) -> Budget:
    e = _elem(fmt)
    return Budget(e * ref.abs() + _eta(fmt), f"{what} in {fmt.name} within {ULP_ELEMENTARY} ulp of the result")


def softmax(x: torch.Tensor, dim: int, fmt: FloatFormat) -> Budget:
    """y_i = exp(z_i)/sum exp(z_j), z = x - max: rounding of z_i (u|z_i|) is amplified by exp into a
    relative error; exp adds ULP_ELEMENTARY ulps; the sum gamma_{n-1} (positive terms); the division u."""
    u, e = _u(fmt), _elem(fmt)
    n = x.shape[dim]
    z = x - x.amax(dim, keepdim=True)
    y = torch.softmax(x, dim)
    num = u * z.abs() + e
    den = gamma(n - 1, u) + (u * z.abs() + e).amax(dim, keepdim=True)
    # below the normal range exp and the division each round absolutely: 2 eta
    return Budget(
        y * (num + den + u) + 2 * _eta(fmt),
        f"softmax over n={n} in {fmt.name}: (u|z_i|+exp) + gamma_{n - 1} + u, relative, + 2 eta",
    )


def log_softmax(x: torch.Tensor, dim: int, fmt: FloatFormat) -> Budget:
    u, e = _u(fmt), _elem(fmt)
    n = x.shape[dim]
    z = x - x.amax(dim, keepdim=True)
    lse = torch.logsumexp(z, dim, keepdim=True)
    ref = z - lse
    rel_sum = gamma(n - 1, u) + (u * z.abs() + e).amax(dim, keepdim=True)
    bound = u * z.abs() + rel_sum + e * lse.abs() + u * ref.abs() + _eta(fmt)
    return Budget(bound, f"log_softmax over n={n} in {fmt.name}: u|z_i| + (gamma_{n - 1}+exp) + log + u|out|")


def normalization(
    x: torch.Tensor,
    dims: tuple[int, ...],
    fmt: FloatFormat,
    eps: float,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> Budget:
    """layer_norm / group_norm over ``dims``: mean (gamma_n mean|x|), deviations, variance
    (gamma_(n+2) var + cross terms), rsqrt (ULP_ELEMENTARY), scale and shift (2u)."""
    u, e = _u(fmt), _elem(fmt)
    n = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims, keepdim=True)
    d = x - mean
    var = (d * d).mean(dims, keepdim=True)
    d_mu = gamma(n, u) * x.abs().mean(dims, keepdim=True)
    d_d = d_mu + u * (d.abs() + d_mu)
    d_var = gamma(n + 2, u) * var + (2 * d.abs() * d_d + d_d * d_d).mean(dims, keepdim=True)
    sigma = torch.sqrt(var + eps)
    d_sigma = d_var / (2 * sigma) + e * sigma
    g = torch.ones_like(x) if weight is None else weight.abs().expand_as(x)
    y0 = d / sigma
    err = (d_d / sigma + d.abs() * d_sigma / (sigma * sigma) + 2 * u * y0.abs()) * g
    y = y0 * (1 if weight is None else weight) + (0 if bias is None else bias)
    return Budget(
        err + 2 * u * y.abs() + _eta(fmt),
        f"normalisation over n={n} in {fmt.name}: mean gamma_{n}, variance gamma_{n + 2}, rsqrt, affine",
    )


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, fmt: FloatFormat) -> Budget:
    ls = log_softmax(logits, -1, fmt).bound
    picked = ls.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    b = logits.shape[0]
    ref = F.cross_entropy(logits, target)
    g = gamma(b, _u(fmt))
    return Budget(
        picked.mean() + g * ref.abs() + _eta(fmt),
        f"cross entropy of batch {b}: mean log_softmax bound + gamma_{b} mean",
    )


def mse(a: torch.Tensor, b: torch.Tensor, fmt: FloatFormat) -> Budget:
    u = _u(fmt)
    n = a.numel()
    ref = F.mse_loss(a, b)
    rel = (1 + u) ** 3 - 1 + gamma(max(n - 1, 0), u) + u
    return Budget(
        rel * ref + _eta(fmt), f"mse of n={n} in {fmt.name}: (difference, square) (1+u)^3-1, sum gamma_{n - 1}, mean u"
    )


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, low: FloatFormat, acc: FloatFormat = FP32) -> Budget:
    """softmax(q k^T / sqrt(d)) v with matmuls in ``low`` (fp32 accumulation) and softmax in fp32:
    logit errors delta perturb P by at most P (exp(2 max delta) - 1); P and v round to ``low``."""
    d = q.shape[-1]
    scale = 1 / math.sqrt(d)
    s_b = matmul_like(q * scale, k.transpose(-1, -2), d, low, torch.matmul)
    s = (q @ k.transpose(-1, -2)) * scale
    p = torch.softmax(s, -1)
    max_delta = s_b.bound.amax(-1, keepdim=True)
    d_p = p * (torch.expm1(2 * max_delta) + _u(low) + gamma(s.shape[-1] + 4, _u(acc)))
    n = s.shape[-1]
    pv = matmul_like(p, v, n, low, torch.matmul)
    bound = d_p @ v.abs() + pv.bound
    return Budget(
        bound, f"attention (d={d}, n={n}): logits {s_b.origin}; softmax perturbation P(exp(2 delta)-1); P v as matmul"
    )


# -- data-parallel reductions ---------------------------------------------------------------------
def ddp_compression(locals_: torch.Tensor, fmt: FloatFormat, world: int) -> Budget:
    """fp16/bf16 gradient compression against plain fp32 all-reduce. ``locals_`` is (ranks, n).

    Each rank's gradient rounds to ``fmt`` and is divided by the world size there
    ((2u+u^2)|g_r|/W + 2 eta per rank), the all-reduce sums W terms in ``fmt`` (gamma_{W-1}), the
    result casts back exactly; plus the fp32 reference's own gamma_W(2^-24).
    """
    g = locals_.to(torch.float64).abs()
    reference = gamma(world, _u(FP32)) * (g / world).sum(0)
    return Budget(
        _reduce_in(g, fmt, world) + reference,
        f"{fmt.name} rounding and /W per rank, gamma_{world - 1} all-reduce sum in {fmt.name}, "
        f"gamma_{world}(2^-24) of the fp32 reference",
    )


def low_precision_reduce(locals_: torch.Tensor, fmt: FloatFormat, world: int) -> Budget:
    """A reduce(-scatter) of W gradients in ``fmt`` (a declared reduce dtype) against their exact
    mean: each rank's gradient rounds to ``fmt`` and is divided by W, in either order, with a
    rounding each ((2u+u^2)|g_r|/W + 2 eta), and the W terms are summed in ``fmt`` (gamma_{W-1})."""
    return Budget(
        _reduce_in(locals_.to(torch.float64).abs(), fmt, world),
        f"reduce of W={world} gradients in {fmt.name}: its rounding and /W per rank, gamma_{world - 1} sum",
    )


def _reduce_in(g: torch.Tensor, fmt: FloatFormat, world: int) -> torch.Tensor:
    u, eta = _u(fmt), _eta(fmt)
    per_rank = ((2 * u + u * u) * g / world + 2 * eta).sum(0)
    summed = gamma(world - 1, u) * (1 + 2 * u) * (g / world).sum(0)
    return per_rank + summed


def reordered_batch_losses(losses: torch.Tensor, batch: int, fmt: FloatFormat) -> Budget:
    """Losses of the same training with the batch mean reduced in another order (per rank, then
    across ranks): one rounding in ``fmt`` of each of the ``batch`` per-sample gradient
    contributions per step, compounding over the steps taken: gamma_(B x (s+1))(u) |L_s|."""
    steps = torch.arange(1, losses.numel() + 1, dtype=torch.float64)
    bound = torch.tensor([gamma(int(batch * s), _u(fmt)) for s in steps.tolist()], dtype=torch.float64)
    return Budget(
        bound * losses.to(torch.float64).abs(),
        f"gamma_(B x steps)({fmt.name} u) x |loss|, B={batch}: the batch reduced in another order",
    )


def reordered_batch_gradient(magnitudes: torch.Tensor, batch: int, modules: int, fmt: FloatFormat) -> Budget:
    """A gradient of one step from the same weights with the batch reduced in another order (per
    rank, then across ranks): each of the ``batch`` per-sample contributions reaches the gradient
    through at most 4 roundings in ``fmt`` per module (the forward output, the input gradient, the
    weight-gradient product and the bias sum) and the batch sum adds one per sample:
    gamma_(B + 4 x modules)(u) x sum_i |g_i| (``magnitudes``, float64)."""
    n = batch + 4 * modules
    return Budget(
        gamma(n, _u(fmt)) * magnitudes.to(torch.float64),
        f"gamma_(B + 4 x {modules} modules)({fmt.name} u) x sum_i |g_i|, B={batch}: each sample's contribution "
        "through the model's roundings, the batch summed in another order",
    )


def fp32_reduce(locals_: torch.Tensor, world: int) -> Budget:
    """An fp32 reduce(-scatter) of W gradients against their exact mean: gamma_W(2^-24) mean|g|
    (plus fp32's smallest subnormal for zeros)."""
    g = locals_.to(torch.float64)
    return Budget(
        gamma(world, _u(FP32)) * g.abs().mean(0) + FP32.smallest_subnormal,
        f"fp32 reduce of W={world} gradients: gamma_W(2^-24) mean|g|",
    )
