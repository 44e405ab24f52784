"""The op catalogue: ops as users call them, as a table a reader can scan.

Each row is one way of calling an op through a public API (``torch.*``, ``F.*``, a Tensor
method, ``@`` or an ``nn`` module): its name, the aten op(s) it reaches, the call, the inputs it
gets (shapes and kinds, drawn from a seeded generator in order) and the autocast op list it is
filed under in torch's documentation. What autocast actually does with it on a device is what
:mod:`harness.domains.engines.ops.probe` observes and the golden tables judge.

To add an op: append a row. Inputs are specs, not code: ``R(4, 8)`` a standard-normal fp32
tensor, ``R(4, 8, lo=0.1)`` its absolute value plus 0.1, ``U(4, 8, scale=1.8, shift=-0.9)`` uniform
on [-0.9, 0.9), ``I(6, 4)`` integers below 6 of shape (4,), ``SPD()`` a symmetric positive definite
4x4 matrix, ``M(factory)`` an ``nn.Module`` built under ``torch.manual_seed(0)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class UpstreamList(Enum):
    """The autocast op list of torch's documentation (``torch.amp``) the catalogue files an op under."""

    #: runs in the low-precision dtype (matrix products, convolutions, RNN cells)
    LOWER_PRECISION = "lower_precision"
    #: runs in float32 (pointwise functions that overflow, reductions, norms, losses, linear algebra)
    FP32 = "fp32"
    #: mixed inputs run in the widest input dtype
    PROMOTE = "promote"
    #: on no list: follows its inputs
    NONE = "none"


# -- input specs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class R:
    """Standard normal ``* scale``; with ``lo``, ``|x| + lo`` (positive inputs)."""

    shape: tuple[int, ...]
    lo: float | None = None
    scale: float = 1.0

    def __init__(self, *shape: int, lo: float | None = None, scale: float = 1.0) -> None:
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "scale", scale)


@dataclass(frozen=True)
class U:
    """Uniform on ``[shift, shift + scale)``."""

    shape: tuple[int, ...]
    scale: float = 1.0
    shift: float = 0.0

    def __init__(self, *shape: int, scale: float = 1.0, shift: float = 0.0) -> None:
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "shift", shift)


@dataclass(frozen=True)
class I:  # noqa: E742 - a one-letter spec name like R and U, read in the table
    """Integers in ``[low, high)``; ``signs`` maps {0, 1} to {-1, +1}; ``as_float`` gives fp32."""

    high: int
    shape: tuple[int, ...]
    low: int = 0
    signs: bool = False
    as_float: bool = False

    def __init__(self, high: int, *shape: int, low: int = 0, signs: bool = False, as_float: bool = False) -> None:
        for k, v in (("high", high), ("shape", shape), ("low", low), ("signs", signs), ("as_float", as_float)):
            object.__setattr__(self, k, v)


@dataclass(frozen=True)
class LogProbs:
    """``log_softmax`` of a standard normal tensor over ``dim`` (log-probabilities)."""

    shape: tuple[int, ...]
    dim: int = -1


@dataclass(frozen=True)
class Probs:
    """``softmax`` of a standard normal tensor over ``dim`` (probabilities)."""

    shape: tuple[int, ...]
    dim: int = -1


@dataclass(frozen=True)
class SPD:
    """A symmetric positive definite ``n x n`` matrix: ``a a^T + 4 I``."""

    n: int = 4


@dataclass(frozen=True)
class M:
    """An ``nn.Module`` (its weights fp32, built under ``torch.manual_seed(0)``)."""

    factory: Callable[[], nn.Module]


Input = R | U | I | LogProbs | Probs | SPD | M


def make_input(spec: Input, g: torch.Generator, dev: torch.device) -> Any:
    """One input, drawn from ``g`` (inputs are drawn in the order the row lists them)."""
    if isinstance(spec, R):
        t = torch.randn(*spec.shape, generator=g) * spec.scale
        return (t if spec.lo is None else t.abs() + spec.lo).to(dev)
    if isinstance(spec, U):
        return torch.rand(*spec.shape, generator=g).to(dev) * spec.scale + spec.shift
    if isinstance(spec, I):
        t = torch.randint(spec.low, spec.high, spec.shape, generator=g).to(dev)
        t = t * 2 - 1 if spec.signs else t
        return t.float() if spec.as_float else t
    if isinstance(spec, LogProbs):
        return F.log_softmax(make_input(R(*spec.shape), g, dev), spec.dim)
    if isinstance(spec, Probs):
        return F.softmax(make_input(R(*spec.shape), g, dev), spec.dim)
    if isinstance(spec, SPD):
        a = make_input(R(spec.n, spec.n), g, dev)
        return a @ a.T + 4 * torch.eye(spec.n, device=dev)
    torch.default_generator.manual_seed(0)  # built on the CPU (see probe.run_op on torch.manual_seed)
    return spec.factory().to(dev)


@dataclass(frozen=True)
class OpCase:
    """One op as users call it: ``fn(*inputs)`` with fp32 inputs drawn per ``inputs``."""

    name: str
    aten: tuple[str, ...]
    fn: Callable[..., Any]
    inputs: tuple[Input, ...]
    listed: UpstreamList
    devices: tuple[str, ...] = ("cpu", "cuda")

    def make(self, g: torch.Generator, dev: torch.device) -> tuple[Any, ...]:
        return tuple(make_input(spec, g, dev) for spec in self.inputs)


def op(
    name: str,
    aten: str | tuple[str, ...],
    fn: Callable[..., Any],
    inputs: tuple[Input, ...],
    listed: UpstreamList,
    devices: tuple[str, ...] = ("cpu", "cuda"),
) -> OpCase:
    """A table row (``aten`` may be one name)."""
    return OpCase(name, (aten,) if isinstance(aten, str) else aten, fn, inputs, listed, devices)


def _mha(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = m(q, k, v, need_weights=False)[0]
    return out


def _unpool2d(a: torch.Tensor) -> torch.Tensor:
    out, idx = F.max_pool2d(a, 2, return_indices=True)
    return F.max_unpool2d(out, idx, (2, 2))


def _unpool3d(a: torch.Tensor) -> torch.Tensor:
    out, idx = F.max_pool3d(a, 2, return_indices=True)
    return F.max_unpool3d(out, idx, (2, 2, 2))


def _call(m: nn.Module, *args: Any) -> Any:
    return m(*args)


LOW, FP32, PROMOTE, NONE = UpstreamList.LOWER_PRECISION, UpstreamList.FP32, UpstreamList.PROMOTE, UpstreamList.NONE
M2 = (R(4, 8), R(8, 5))
B3 = (R(2, 4, 8), R(2, 8, 5))
X48 = (R(4, 8),)
XY48 = (R(4, 8), R(4, 8))
SOLVE = (SPD(), R(4, 2))
_UPSAMPLE = {
    "nearest": ("upsample_nearest2d", (1, 2, 4, 4)),
    "bilinear": ("upsample_bilinear2d", (1, 2, 4, 4)),
    "bicubic": ("upsample_bicubic2d", (1, 2, 4, 4)),
    "linear": ("upsample_linear1d", (1, 2, 4)),
    "trilinear": ("upsample_trilinear3d", (1, 1, 3, 3, 3)),
}
_NEAREST = (
    ("nearest-exact", (1, 2, 4)),
    ("nearest-exact", (1, 2, 4, 4)),
    ("nearest-exact", (1, 1, 2, 2, 2)),
    ("nearest", (1, 2, 4)),
    ("nearest", (1, 1, 2, 2, 2)),
)
_POINTWISE_FP32 = ("exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "cosh", "sinh", "tan")


def _interpolate(mode: str, **kw: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda a: F.interpolate(a, mode=mode, **kw)


def _fft_real(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda a: torch.view_as_real(getattr(torch.fft, name)(a).resolve_conj())


def _fft(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda a: getattr(torch.fft, name)(a)


# fmt: off
#: an op new in torch 2.14 (looked up by name: older releases and their type stubs lack it)
_SQRTH = "matrix_sqrth"

CATALOGUE: tuple[OpCase, ...] = (
    # -- matrix products, convolutions, attention, RNN cells: lower-precision lists -------------
    op("torch.mm", "mm", torch.mm, M2, LOW),
    op("torch.matmul", "matmul", torch.matmul, M2, LOW),
    op("Tensor.__matmul__", "matmul", lambda a, b: a @ b, M2, LOW),
    op("torch.bmm", "bmm", torch.bmm, B3, LOW),
    op("torch.addmm", "addmm", torch.addmm, (R(4, 5), *M2), LOW),
    op("torch.baddbmm", "baddbmm", torch.baddbmm, (R(2, 4, 5), *B3), LOW),
    op("torch.addbmm", "addbmm", torch.addbmm, (R(4, 5), *B3), LOW),
    op("torch.addmv", "addmv", torch.addmv, (R(4), R(4, 8), R(8)), LOW),
    op("torch.addr", "addr", torch.addr, (R(4, 5), R(4), R(5)), LOW),
    op("torch.mv", "mv", torch.mv, (R(4, 8), R(8)), LOW),
    op("torch.dot", "dot", torch.dot, (R(8), R(8)), LOW),
    op("torch.vdot", "vdot", torch.vdot, (R(8), R(8)), LOW),
    op("torch.einsum", "einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), M2, LOW),
    op("torch.tensordot", "tensordot", lambda a, b: torch.tensordot(a, b, dims=1), M2, LOW),
    op("torch.linalg.multi_dot", "linalg_multi_dot", lambda a, b: torch.linalg.multi_dot([a, b]), M2, LOW),
    op("torch.linalg.vecdot", "linalg_vecdot", torch.linalg.vecdot, XY48, LOW),
    op("F.linear", "linear", F.linear, (R(4, 8), R(5, 8), R(5)), LOW),
    op("nn.Linear", "linear", _call, (M(lambda: nn.Linear(8, 5)), R(4, 8)), LOW),
    op("F.bilinear", "bilinear", F.bilinear, (R(3, 4), R(3, 5), R(2, 4, 5)), LOW),
    op("F.conv1d", "conv1d", F.conv1d, (R(2, 3, 8), R(4, 3, 3)), LOW),
    op("F.conv2d", "conv2d", F.conv2d, (R(2, 3, 8, 8), R(4, 3, 3, 3)), LOW),
    op("nn.Conv2d", "conv2d", _call, (M(lambda: nn.Conv2d(3, 4, 3)), R(2, 3, 8, 8)), LOW),
    op("F.conv3d", "conv3d", F.conv3d, (R(1, 2, 4, 4, 4), R(3, 2, 2, 2, 2)), LOW),
    op("F.conv_transpose1d", "conv_transpose1d", F.conv_transpose1d, (R(2, 3, 8), R(3, 4, 3)), LOW),
    op("F.conv_transpose2d", "conv_transpose2d", F.conv_transpose2d, (R(2, 3, 5, 5), R(3, 4, 3, 3)), LOW),
    op("F.conv_transpose3d", "conv_transpose3d", F.conv_transpose3d, (R(1, 2, 3, 3, 3), R(2, 3, 2, 2, 2)), LOW),
    op("torch.conv_tbc", "conv_tbc", torch.conv_tbc, (R(6, 2, 3), R(3, 3, 4), R(4)), LOW),
    op("F.prelu", "prelu", F.prelu, (R(2, 3, 4), R(3)), LOW),
    op("F.scaled_dot_product_attention", "scaled_dot_product_attention", F.scaled_dot_product_attention,
       (R(2, 2, 5, 8), R(2, 2, 5, 8), R(2, 2, 5, 8)), LOW),
    op("nn.MultiheadAttention", ("_native_multi_head_attention", "linear"), _mha,
       (M(lambda: nn.MultiheadAttention(8, 2, batch_first=True)), R(2, 5, 8), R(2, 5, 8), R(2, 5, 8)), LOW),
    op("nn.LSTMCell", "lstm_cell", lambda m, a: m(a)[0], (M(lambda: nn.LSTMCell(8, 6)), R(3, 8)), LOW),
    op("nn.GRUCell", "gru_cell", _call, (M(lambda: nn.GRUCell(8, 6)), R(3, 8)), LOW),
    op("nn.RNNCell", "rnn_tanh_cell", _call, (M(lambda: nn.RNNCell(8, 6)), R(3, 8)), LOW),
    # -- pointwise functions that overflow or lose precision: fp32 list ------------------------
    *(op(f"torch.{f}", f, getattr(torch, f), (R(4, 8, lo=0.1 if f.startswith(("log", "rsqrt", "recip")) else None,
                                                 scale=0.5),), FP32)
      for f in _POINTWISE_FP32),
    op("torch.acos", "acos", torch.acos, (U(4, 8, scale=1.8, shift=-0.9),), FP32),
    op("torch.asin", "asin", torch.asin, (U(4, 8, scale=1.8, shift=-0.9),), FP32),
    op("torch.erfinv", "erfinv", torch.erfinv, (U(4, 8, scale=1.8, shift=-0.9),), FP32),
    op("torch.pow(Tensor, Scalar)", "pow", lambda a: torch.pow(a, 3), X48, FP32),
    op("torch.pow(Tensor, Tensor)", "pow", torch.pow, (R(4, 8, lo=0.5), R(4, 8)), FP32),
    op("torch.pow(Scalar, Tensor)", "pow", lambda a: torch.pow(2.0, a), X48, FP32),
    op("F.softplus", "softplus", F.softplus, X48, FP32),
    # -- normalisation, softmax, reductions: fp32 list -----------------------------------------
    op("F.layer_norm", ("layer_norm", "native_layer_norm"), lambda a, w, b: F.layer_norm(a, (8,), w, b),
       (R(4, 8), R(8), R(8)), FP32),
    op("nn.LayerNorm", ("layer_norm", "native_layer_norm"), _call, (M(lambda: nn.LayerNorm(8)), R(4, 8)), FP32),
    op("F.group_norm", "group_norm", lambda a: F.group_norm(a, 2), (R(2, 4, 5),), FP32),
    op("nn.GroupNorm", "group_norm", _call, (M(lambda: nn.GroupNorm(2, 4)), R(2, 4, 5)), FP32),
    op("F.rms_norm", "rms_norm", lambda a: F.rms_norm(a, (8,)), X48, FP32),
    op("F.softmax", "softmax", lambda a: F.softmax(a, dim=-1), X48, FP32),
    op("torch.softmax", "softmax", lambda a: torch.softmax(a, -1), X48, FP32),
    op("F.log_softmax", "log_softmax", lambda a: F.log_softmax(a, dim=-1), X48, FP32),
    op("torch.logsumexp", "logsumexp", lambda a: torch.logsumexp(a, -1), X48, FP32),
    op("torch.sum", "sum", torch.sum, X48, FP32),
    op("Tensor.sum(dim)", "sum", lambda a: a.sum(dim=1), X48, FP32),
    op("torch.prod", "prod", torch.prod, (R(4, 8, lo=0.5),), FP32),
    op("torch.cumsum", "cumsum", lambda a: torch.cumsum(a, 1), X48, FP32),
    op("torch.cumprod", "cumprod", lambda a: torch.cumprod(a, 1), (R(4, 8, lo=0.5),), FP32),
    op("torch.norm", "norm", torch.norm, X48, FP32),
    op("torch.linalg.vector_norm", "linalg_vector_norm", torch.linalg.vector_norm, X48, FP32),
    op("torch.linalg.matrix_norm", "linalg_matrix_norm", torch.linalg.matrix_norm, X48, FP32),
    op("torch.dist", "dist", torch.dist, XY48, FP32),
    op("torch.cdist", "cdist", torch.cdist, (R(4, 8), R(5, 8)), FP32),
    op("F.pdist", "pdist", F.pdist, X48, FP32),
    op("F.cosine_similarity", "cosine_similarity", F.cosine_similarity, XY48, FP32),
    op("torch.renorm", "renorm", lambda a: torch.renorm(a, 2, 0, 1.0), X48, FP32),
    op("torch.trace", "trace", torch.trace, (R(5, 5),), FP32),
    # -- losses: fp32 list ----------------------------------------------------------------------
    op("F.mse_loss", "mse_loss", F.mse_loss, XY48, FP32),
    op("F.l1_loss", "l1_loss", F.l1_loss, XY48, FP32),
    op("F.smooth_l1_loss", "smooth_l1_loss", F.smooth_l1_loss, XY48, FP32),
    op("F.huber_loss", "huber_loss", F.huber_loss, XY48, FP32),
    op("F.cross_entropy", "cross_entropy_loss", F.cross_entropy, (R(4, 6), I(6, 4)), FP32),
    op("nn.CrossEntropyLoss", "cross_entropy_loss", lambda a, t: nn.CrossEntropyLoss()(a, t), (R(4, 6), I(6, 4)), FP32),
    op("F.nll_loss", "nll_loss", F.nll_loss, (LogProbs((4, 6)), I(6, 4)), FP32),
    op("F.kl_div", "kl_div", lambda a, b: F.kl_div(a, b, reduction="batchmean"), (LogProbs((4, 6)), Probs((4, 6))), FP32),
    op("F.binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits,
       (R(4, 8), U(4, 8)), FP32),
    op("F.binary_cross_entropy", "binary_cross_entropy", F.binary_cross_entropy,
       (U(4, 8, scale=0.9, shift=0.05), U(4, 8)), FP32),
    op("F.poisson_nll_loss", "poisson_nll_loss", F.poisson_nll_loss, (R(4, 8), R(4, 8, lo=0.0)), FP32),
    op("F.cosine_embedding_loss", "cosine_embedding_loss", F.cosine_embedding_loss,
       (R(4, 8), R(4, 8), I(2, 4, signs=True)), FP32),
    op("F.hinge_embedding_loss", "hinge_embedding_loss", F.hinge_embedding_loss, (R(4, 8), I(2, 4, 8, signs=True)), FP32),
    op("F.margin_ranking_loss", "margin_ranking_loss", F.margin_ranking_loss, (R(8), R(8), I(2, 8, signs=True)), FP32),
    op("F.multilabel_margin_loss", "multilabel_margin_loss", F.multilabel_margin_loss, (R(4, 6), I(6, 4, 6)), FP32),
    op("F.soft_margin_loss", "soft_margin_loss", F.soft_margin_loss,
       (R(4, 8), I(2, 4, 8, signs=True, as_float=True)), FP32),
    op("F.triplet_margin_loss", "triplet_margin_loss", F.triplet_margin_loss, (R(4, 8), R(4, 8), R(4, 8)), FP32),
    op("F.multi_margin_loss", "multi_margin_loss", F.multi_margin_loss, (R(4, 6), I(6, 4)), FP32),
    # -- resampling, pooling, padding, linear algebra, spectral: fp32 list (CPU's mostly) -----
    *(op(f"F.interpolate({mode})", aten, _interpolate(mode, scale_factor=2, **({} if mode == "nearest" else
                                                                                 {"align_corners": False})),
         (R(*shape),), FP32)
      for mode, (aten, shape) in _UPSAMPLE.items()),
    op("F.grid_sample", "grid_sampler", lambda a, gr: F.grid_sample(a, gr, align_corners=False),
       (R(1, 2, 4, 4), U(1, 3, 3, 2, scale=2, shift=-1)), FP32),
    op("F.avg_pool3d", "avg_pool3d", lambda a: F.avg_pool3d(a, 2), (R(1, 2, 4, 4, 4),), FP32),
    op("F.max_pool3d", "max_pool3d", lambda a: F.max_pool3d(a, 2), (R(1, 2, 4, 4, 4),), FP32),
    op("F.adaptive_avg_pool3d", "adaptive_avg_pool3d", lambda a: F.adaptive_avg_pool3d(a, 2), (R(1, 2, 4, 4, 4),), FP32),
    op("F.adaptive_max_pool3d", "adaptive_max_pool3d", lambda a: F.adaptive_max_pool3d(a, 2), (R(1, 2, 4, 4, 4),), FP32),
    op("F.pad(reflect)", "reflection_pad2d", lambda a: F.pad(a, (1, 1, 1, 1), mode="reflect"), (R(1, 2, 4, 4),), FP32),
    op("F.pad(replicate)", "replication_pad2d", lambda a: F.pad(a, (1, 1, 1, 1), mode="replicate"), (R(1, 2, 4, 4),),
       FP32),
    op("torch.linalg.inv", ("linalg_inv_ex", "linalg_inv"), torch.linalg.inv, (SPD(),), FP32),
    op("torch.linalg.cholesky", "linalg_cholesky_ex", torch.linalg.cholesky, (SPD(),), FP32),
    op("torch.linalg.qr", "linalg_qr", lambda a: torch.linalg.qr(a)[0], (R(4, 4),), FP32),
    op("torch.linalg.svdvals", "linalg_svdvals", torch.linalg.svdvals, (R(4, 4),), FP32),
    op("torch.linalg.eigvalsh", "linalg_eigvalsh", torch.linalg.eigvalsh, (SPD(),), FP32),
    # new in torch 2.14 (registered for AutocastCPU there): a row only where the API exists
    *(
        (op("torch.linalg.matrix_sqrth", "linalg_matrix_sqrth", lambda a: getattr(torch.linalg, _SQRTH)(a), (SPD(),), FP32),)
        if hasattr(torch.linalg, _SQRTH)
        else ()
    ),
    op("torch.linalg.solve", "linalg_solve", torch.linalg.solve, SOLVE, FP32),
    op("torch.fft.fft", "fft_fft", lambda a: torch.view_as_real(torch.fft.fft(a)), X48, FP32),
    op("torch.fft.rfft", "fft_rfft", lambda a: torch.view_as_real(torch.fft.rfft(a)), X48, FP32),
    op("torch.quantile", "quantile", lambda a: torch.quantile(a, 0.25), (R(16),), FP32),
    op("torch.nanquantile", "nanquantile", lambda a: torch.nanquantile(a, 0.25), (R(16),), FP32),
    *(op(f"F.interpolate({mode}, {len(shape) - 2}d)",
         f"{'_upsample_nearest_exact' if mode == 'nearest-exact' else 'upsample_nearest'}{len(shape) - 2}d",
         _interpolate(mode, scale_factor=2), (R(*shape),), FP32)
      for mode, shape in _NEAREST),
    *(op(f"F.interpolate({mode}, antialias)", f"_upsample_{mode}2d_aa",
         _interpolate(mode, scale_factor=0.5, antialias=True), (R(1, 2, 8, 8),), FP32)
      for mode in ("bilinear", "bicubic")),
    op("torch.linalg.eigh", "linalg_eigh", lambda a: torch.linalg.eigh(a)[0], (SPD(),), FP32),
    op("torch.linalg.eig", "linalg_eig", lambda a: torch.linalg.eig(a)[0], (SPD(),), FP32),
    op("torch.linalg.eigvals", "linalg_eigvals", torch.linalg.eigvals, (SPD(),), FP32),
    op("torch.linalg.svd", "linalg_svd", lambda a: torch.linalg.svd(a)[1], (R(4, 4),), FP32),
    op("torch.svd", "svd", lambda a: torch.svd(a)[1], (R(4, 4),), FP32),
    op("torch.linalg.lstsq", "linalg_lstsq", lambda a, b: torch.linalg.lstsq(a, b)[0], SOLVE, FP32),
    op("torch.linalg.matrix_rank", "linalg_matrix_rank", torch.linalg.matrix_rank, (SPD(),), FP32),
    op("torch.linalg.cond", "linalg_cond", torch.linalg.cond, (SPD(),), FP32),
    op("torch.linalg.pinv", ("pinverse", "linalg_pinv"), torch.pinverse, (R(4, 3),), FP32),
    op("torch.inverse", "inverse", torch.inverse, (SPD(),), FP32),
    op("torch.cholesky", "cholesky", torch.cholesky, (SPD(),), FP32),
    op("torch.cholesky_inverse", "cholesky_inverse", lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a)),
       (SPD(),), FP32),
    op("torch.cholesky_solve", "cholesky_solve", lambda a, b: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
       SOLVE, FP32),
    op("torch.linalg.cholesky_ex", "linalg_cholesky", lambda a: torch.linalg.cholesky_ex(a)[0], (SPD(),), FP32),
    op("torch.geqrf", "geqrf", lambda a: torch.geqrf(a)[0], (R(4, 4),), FP32),
    op("torch.linalg.householder_product", "linalg_householder_product",
       lambda a: torch.linalg.householder_product(*torch.geqrf(a)), (R(4, 4),), FP32),
    op("torch.orgqr", "orgqr", lambda a: torch.orgqr(*torch.geqrf(a)), (R(4, 4),), FP32),
    op("torch.ormqr", "ormqr", lambda a, b: torch.ormqr(*torch.geqrf(a), b), (R(4, 4), R(4, 2)), FP32),
    op("torch.qr", "qr", lambda a: torch.qr(a)[0], (R(4, 4),), FP32),
    op("torch.linalg.tensorinv", "linalg_tensorinv", lambda a: torch.linalg.tensorinv(a.reshape(4, 2, 2), ind=1),
       (SPD(),), FP32),
    op("torch.linalg.tensorsolve", "linalg_tensorsolve", lambda a, b: torch.linalg.tensorsolve(a, b[:, 0]), SOLVE, FP32),
    op("torch.triangular_solve", "triangular_solve",
       lambda a, b: torch.triangular_solve(b, torch.linalg.cholesky(a), upper=False)[0], SOLVE, FP32),
    op("torch.lu_solve", ("lu_solve", "_lu_with_info"), lambda a, b: torch.lu_solve(b, *torch.linalg.lu_factor(a)),
       SOLVE, FP32),
    op("torch.polar", "polar", lambda a, b: torch.view_as_real(torch.polar(a, b)), (R(4, lo=0.1), R(4)), FP32),
    op("torch.view_as_complex", "view_as_complex", lambda a: torch.view_as_real(torch.view_as_complex(a)), (R(4, 2),),
       FP32),
    op("torch.stft", ("stft",), lambda a: torch.view_as_real(
        torch.stft(a, 8, window=torch.hann_window(8, device=a.device), return_complex=True)), (R(32),), FP32),
    *(op(f"torch.fft.{f}", f"fft_{f}", _fft_real(f), X48, FP32)
      for f in ("fft2", "fftn", "ifft", "ifft2", "ifftn", "ihfft", "rfft2", "rfftn")),
    *(op(f"torch.fft.{f}", f"fft_{f}", _fft(f), X48, FP32) for f in ("hfft", "irfft", "irfft2", "irfftn")),
    op("F.fractional_max_pool2d", "fractional_max_pool2d", lambda a: F.fractional_max_pool2d(a, 2, output_size=2),
       (R(1, 2, 4, 4),), FP32),
    op("F.fractional_max_pool3d", "fractional_max_pool3d", lambda a: F.fractional_max_pool3d(a, 2, output_size=2),
       (R(1, 1, 4, 4, 4),), FP32),
    op("F.max_unpool2d", "max_unpool2d", _unpool2d, (R(1, 2, 4, 4),), FP32),
    op("F.max_unpool3d", "max_unpool3d", _unpool3d, (R(1, 1, 4, 4, 4),), FP32),
    op("F.pad(reflect, 1d)", "reflection_pad1d", lambda a: F.pad(a, (1, 1), mode="reflect"), (R(1, 2, 4),), FP32),
    op("F.pad(replicate, 1d)", "replication_pad1d", lambda a: F.pad(a, (1, 1), mode="replicate"), (R(1, 2, 4),), FP32),
    op("F.pad(replicate, 3d)", "replication_pad3d", lambda a: F.pad(a, (1, 1, 1, 1, 1, 1), mode="replicate"),
       (R(1, 1, 2, 2, 2),), FP32),
    op("F.ctc_loss", "ctc_loss", lambda a, t: F.ctc_loss(a, t, torch.tensor([6, 6]), torch.tensor([2, 3])),
       (LogProbs((6, 2, 5)), I(5, 2, 3, low=1)), FP32),
    op("F.nll_loss(2d)", "nll_loss2d", F.nll_loss, (LogProbs((2, 3, 4, 4), dim=1), I(3, 2, 4, 4)), FP32),
    op("torch.index_copy", "index_copy",
       lambda a, s: torch.index_copy(a, 0, torch.tensor([0, 2], device=a.device), s), (R(4, 3), R(2, 3)), PROMOTE),
    op("torch.fake_quantize_per_tensor_affine", "fake_quantize_per_tensor_affine",
       lambda a: torch.fake_quantize_per_tensor_affine(a, 0.1, 0, -128, 127), X48, FP32),
    op("torch.chain_matmul", "chain_matmul", torch.chain_matmul, M2, LOW),
    op("torch.norm(p='nuc')", "nuclear_norm", lambda a: torch.norm(a, p="nuc"), (R(4, 4),), FP32),
    op("torch.norm(p='fro', dim)", "frobenius_norm", lambda a: torch.norm(a, p="fro", dim=(0, 1)), (R(4, 4),), FP32),
    op("nn.RNNCell(relu)", "rnn_relu_cell", _call, (M(lambda: nn.RNNCell(8, 6, nonlinearity="relu")), R(3, 8)), LOW),
    op("nn.LSTM", ("mkldnn_rnn_layer", "lstm", "_cudnn_rnn"), lambda m, a: m(a)[0], (M(lambda: nn.LSTM(8, 6, batch_first=True)),
                                                                        R(2, 3, 8)), LOW),
    # -- promote list: mixed inputs go to the widest dtype --------------------------------------
    op("torch.cat", "cat", lambda a, b: torch.cat([a, b]), XY48, PROMOTE),
    op("torch.stack", "stack", lambda a, b: torch.stack([a, b]), XY48, PROMOTE),
    op("torch.addcmul", "addcmul", torch.addcmul, (R(4, 8), R(4, 8), R(4, 8)), PROMOTE),
    op("torch.addcdiv", "addcdiv", torch.addcdiv, (R(4, 8), R(4, 8), R(4, 8, lo=0.5)), PROMOTE),
    op("torch.atan2", "atan2", torch.atan2, XY48, PROMOTE),
    op("torch.cross", "cross", lambda a, b: torch.linalg.cross(a, b), (R(4, 3), R(4, 3)), PROMOTE),
    op("torch.index_put", "index_put", lambda a, v, i: torch.index_put(a, (i,), v), (R(8), R(3), I(8, 3)), PROMOTE),
    op("torch.scatter_add", "scatter_add", lambda a, i, s: torch.scatter_add(a, 0, i, s), (R(8), I(8, 5), R(5)), PROMOTE),
    # -- on no list: follow their inputs --------------------------------------------------------
    op("torch.add", "add", torch.add, XY48, NONE),
    op("torch.mul", "mul", torch.mul, XY48, NONE),
    op("F.relu", "relu", F.relu, X48, NONE),
    op("F.gelu", "gelu", F.gelu, X48, NONE),
    op("F.silu", "silu", F.silu, X48, NONE),
    op("torch.tanh", "tanh", torch.tanh, X48, NONE),
    op("torch.sigmoid", "sigmoid", torch.sigmoid, X48, NONE),
    op("F.dropout", "dropout", lambda a: F.dropout(a, 0.5, training=True), X48, NONE),
    op("F.embedding", "embedding", F.embedding, (I(10, 4), R(10, 8)), NONE),
    op("F.max_pool2d", "max_pool2d", lambda a: F.max_pool2d(a, 2), (R(1, 2, 4, 4),), NONE),
    op("F.avg_pool2d", "avg_pool2d", lambda a: F.avg_pool2d(a, 2), (R(1, 2, 4, 4),), NONE),
    op("nn.BatchNorm2d", "batch_norm", _call, (M(lambda: nn.BatchNorm2d(3)), R(2, 3, 4, 4)), NONE),
    op("torch.mean", "mean", torch.mean, X48, NONE),
    op("torch.var", "var", torch.var, X48, NONE),
    op("torch.where", "where", lambda a, b: torch.where(a > 0, a, b), XY48, NONE),
    op("torch.clamp", "clamp", lambda a: torch.clamp(a, -0.5, 0.5), X48, NONE),
    # -- type promotion built into the op (PyTorch's expect_builtin_promote lists) ------------
    op("torch.div", "div", torch.div, XY48, NONE),
    *(op(f"torch.{f}", f, getattr(torch, f), XY48, NONE) for f in ("eq", "ge", "gt", "le", "lt", "ne")),
)
# fmt: on

#: Ops whose result varies between identical calls, so bitwise comparison means nothing.
NOT_BITWISE_REPRODUCIBLE: dict[str, str] = {
    "torch.linalg.lstsq": "CPU LAPACK least squares: 6 distinct results in 200 identical calls (measured, torch 2.13)",
}
#: Registered autocast ops that users reach only through a public API of the catalogue.
INTERNAL_OPS: dict[str, str] = {
    "_convolution": "F.conv*/nn.Conv2d",
    "convolution": "F.conv*/nn.Conv2d",
    "cudnn_convolution": "F.conv* on CUDA",
    "cudnn_convolution_transpose": "F.conv_transpose* on CUDA",
    "_scaled_dot_product_flash_attention": "F.scaled_dot_product_attention on CUDA",
    "_thnn_fused_lstm_cell": "nn.LSTMCell on CUDA",
    "_thnn_fused_gru_cell": "nn.GRUCell on CUDA",
    "_addmm_activation": "fused linear+activation of nn.TransformerEncoderLayer fast paths",
    "grid_sampler_2d": "F.grid_sample",
    "grid_sampler_3d": "F.grid_sample (5-D input)",
    "_grid_sampler_2d_cpu_fallback": "F.grid_sample on CPU",
    "multilabel_margin_loss_forward": "F.multilabel_margin_loss",
}


#: Ops whose CPU autocast behaviour depends on the CPU's instruction set, not on the torch release:
#: the golden policy table (keyed by torch release) leaves them out on the CPU, and the suite
#: records what they did as a finding of the hardware profile.
ISA_DEPENDENT_ON_CPU: dict[str, str] = {
    "nn.LSTM": (
        "oneDNN's low-precision LSTM primitive: bf16 runs on CPUs with AVX512 and raises 'could not create a "
        "primitive descriptor' on AVX2-only CPUs (AMD EPYC Zen 3); fp16 raises on both"
    ),
}
