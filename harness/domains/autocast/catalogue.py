"""Autocast op policy: a catalogue of ops called through public APIs, and the probe that
records what autocast does with each.

For each case the probe runs the op under ``torch.autocast`` with fp32 inputs, with inputs
already in the low-precision dtype, and (for ops with several tensor inputs) with mixed inputs,
and records the output dtypes. It then checks, as PyTorch's own autocast tests do, that the
autocast result is bitwise equal to running the op with autocast disabled on inputs cast by hand
to the dtype autocast chose. Pure: no pytest, no files.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Make = Callable[[torch.Generator, torch.device], tuple[Any, ...]]


@dataclass(frozen=True)
class OpCase:
    """One op as users call it: ``fn(*make(gen, device))`` with fp32 inputs."""

    name: str
    aten: tuple[str, ...]
    fn: Callable[..., Any]
    make: Make
    devices: tuple[str, ...] = ("cpu", "cuda")


def _r(g: torch.Generator, dev: torch.device, *shape: int, lo: float | None = None, scale: float = 1.0) -> torch.Tensor:
    t = torch.randn(*shape, generator=g) * scale
    if lo is not None:
        t = t.abs() + lo
    return t.to(dev)


def _idx(g: torch.Generator, dev: torch.device, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=g).to(dev)


def _mod(factory: Callable[[], nn.Module]) -> Make:
    def make(g: torch.Generator, dev: torch.device) -> tuple[Any, ...]:
        torch.manual_seed(0)
        m = factory().to(dev)
        shape = _MODULE_INPUTS[type(m)]
        return (m, *(_r(g, dev, *s) for s in shape))

    return make


_MODULE_INPUTS: dict[type, list[tuple[int, ...]]] = {
    nn.Linear: [(4, 8)],
    nn.Conv2d: [(2, 3, 8, 8)],
    nn.LayerNorm: [(4, 8)],
    nn.GroupNorm: [(2, 4, 5)],
    nn.MultiheadAttention: [(2, 5, 8), (2, 5, 8), (2, 5, 8)],
    nn.LSTMCell: [(3, 8)],
    nn.GRUCell: [(3, 8)],
    nn.RNNCell: [(3, 8)],
    nn.BatchNorm2d: [(2, 3, 4, 4)],
    nn.LSTM: [(2, 3, 8)],
}


def _mha(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = m(q, k, v, need_weights=False)[0]
    return out


def _unpool2d(a: torch.Tensor) -> torch.Tensor:
    out, idx = F.max_pool2d(a, 2, return_indices=True)
    return F.max_unpool2d(out, idx, (2, 2))


def _unpool3d(a: torch.Tensor) -> torch.Tensor:
    out, idx = F.max_pool3d(a, 2, return_indices=True)
    return F.max_unpool3d(out, idx, (2, 2, 2))


def _cases() -> list[OpCase]:
    c: list[OpCase] = []

    def add(
        name: str,
        aten: str | tuple[str, ...],
        fn: Callable[..., Any],
        make: Make,
        devices: tuple[str, ...] = ("cpu", "cuda"),
    ) -> None:
        c.append(OpCase(name, (aten,) if isinstance(aten, str) else aten, fn, make, devices))

    m2 = lambda g, d: (_r(g, d, 4, 8), _r(g, d, 8, 5))  # noqa: E731
    b3 = lambda g, d: (_r(g, d, 2, 4, 8), _r(g, d, 2, 8, 5))  # noqa: E731
    x = lambda *s, **kw: lambda g, d: (_r(g, d, *s, **kw),)  # noqa: E731
    xy = lambda *s, **kw: lambda g, d: (_r(g, d, *s, **kw), _r(g, d, *s, **kw))  # noqa: E731
    # -- matrix products and convolutions (lower-precision lists) ------------------------------
    add("torch.mm", "mm", torch.mm, m2)
    add("torch.matmul", "matmul", torch.matmul, m2)
    add("Tensor.__matmul__", "matmul", lambda a, b: a @ b, m2)
    add("torch.bmm", "bmm", torch.bmm, b3)
    add("torch.addmm", "addmm", torch.addmm, lambda g, d: (_r(g, d, 4, 5), *m2(g, d)))
    add("torch.baddbmm", "baddbmm", torch.baddbmm, lambda g, d: (_r(g, d, 2, 4, 5), *b3(g, d)))
    add("torch.addbmm", "addbmm", torch.addbmm, lambda g, d: (_r(g, d, 4, 5), *b3(g, d)))
    add("torch.addmv", "addmv", torch.addmv, lambda g, d: (_r(g, d, 4), _r(g, d, 4, 8), _r(g, d, 8)))
    add("torch.addr", "addr", torch.addr, lambda g, d: (_r(g, d, 4, 5), _r(g, d, 4), _r(g, d, 5)))
    add("torch.mv", "mv", torch.mv, lambda g, d: (_r(g, d, 4, 8), _r(g, d, 8)))
    add("torch.dot", "dot", torch.dot, xy(8))
    add("torch.vdot", "vdot", torch.vdot, xy(8))
    add("torch.einsum", "einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), m2)
    add("torch.tensordot", "tensordot", lambda a, b: torch.tensordot(a, b, dims=1), m2)
    add("torch.linalg.multi_dot", "linalg_multi_dot", lambda a, b: torch.linalg.multi_dot([a, b]), m2)
    add("torch.linalg.vecdot", "linalg_vecdot", torch.linalg.vecdot, xy(4, 8))
    add("F.linear", "linear", F.linear, lambda g, d: (_r(g, d, 4, 8), _r(g, d, 5, 8), _r(g, d, 5)))
    add("nn.Linear", "linear", lambda m, a: m(a), _mod(lambda: nn.Linear(8, 5)))
    add("F.bilinear", "bilinear", F.bilinear, lambda g, d: (_r(g, d, 3, 4), _r(g, d, 3, 5), _r(g, d, 2, 4, 5)))
    add("F.conv1d", "conv1d", F.conv1d, lambda g, d: (_r(g, d, 2, 3, 8), _r(g, d, 4, 3, 3)))
    add("F.conv2d", "conv2d", F.conv2d, lambda g, d: (_r(g, d, 2, 3, 8, 8), _r(g, d, 4, 3, 3, 3)))
    add("nn.Conv2d", "conv2d", lambda m, a: m(a), _mod(lambda: nn.Conv2d(3, 4, 3)))
    add("F.conv3d", "conv3d", F.conv3d, lambda g, d: (_r(g, d, 1, 2, 4, 4, 4), _r(g, d, 3, 2, 2, 2, 2)))
    add(
        "F.conv_transpose1d",
        "conv_transpose1d",
        F.conv_transpose1d,
        lambda g, d: (_r(g, d, 2, 3, 8), _r(g, d, 3, 4, 3)),
    )
    add(
        "F.conv_transpose2d",
        "conv_transpose2d",
        F.conv_transpose2d,
        lambda g, d: (_r(g, d, 2, 3, 5, 5), _r(g, d, 3, 4, 3, 3)),
    )
    add(
        "F.conv_transpose3d",
        "conv_transpose3d",
        F.conv_transpose3d,
        lambda g, d: (_r(g, d, 1, 2, 3, 3, 3), _r(g, d, 2, 3, 2, 2, 2)),
    )
    add("torch.conv_tbc", "conv_tbc", torch.conv_tbc, lambda g, d: (_r(g, d, 6, 2, 3), _r(g, d, 3, 3, 4), _r(g, d, 4)))
    add("F.prelu", "prelu", F.prelu, lambda g, d: (_r(g, d, 2, 3, 4), _r(g, d, 3)))
    add(
        "F.scaled_dot_product_attention",
        "scaled_dot_product_attention",
        F.scaled_dot_product_attention,
        lambda g, d: (_r(g, d, 2, 2, 5, 8), _r(g, d, 2, 2, 5, 8), _r(g, d, 2, 2, 5, 8)),
    )
    add(
        "nn.MultiheadAttention",
        ("_native_multi_head_attention", "linear"),
        _mha,
        _mod(lambda: nn.MultiheadAttention(8, 2, batch_first=True)),
    )
    add("nn.LSTMCell", "lstm_cell", lambda m, a: m(a)[0], _mod(lambda: nn.LSTMCell(8, 6)))
    add("nn.GRUCell", "gru_cell", lambda m, a: m(a), _mod(lambda: nn.GRUCell(8, 6)))
    add("nn.RNNCell", "rnn_tanh_cell", lambda m, a: m(a), _mod(lambda: nn.RNNCell(8, 6)))
    # -- fp32 list: pointwise ------------------------------------------------------------------
    for fname in ("exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "cosh", "sinh", "tan"):
        add(
            f"torch.{fname}",
            fname,
            getattr(torch, fname),
            x(4, 8, lo=0.1 if fname.startswith(("log", "rsqrt", "recip")) else None, scale=0.5),
        )
    add("torch.acos", "acos", torch.acos, lambda g, d: (torch.rand(4, 8, generator=g).to(d) * 1.8 - 0.9,))
    add("torch.asin", "asin", torch.asin, lambda g, d: (torch.rand(4, 8, generator=g).to(d) * 1.8 - 0.9,))
    add("torch.erfinv", "erfinv", torch.erfinv, lambda g, d: (torch.rand(4, 8, generator=g).to(d) * 1.8 - 0.9,))
    add("torch.pow(Tensor, Scalar)", "pow", lambda a: torch.pow(a, 3), x(4, 8))
    add("torch.pow(Tensor, Tensor)", "pow", torch.pow, lambda g, d: (_r(g, d, 4, 8, lo=0.5), _r(g, d, 4, 8)))
    add("torch.pow(Scalar, Tensor)", "pow", lambda a: torch.pow(2.0, a), x(4, 8))
    add("F.softplus", "softplus", F.softplus, x(4, 8))
    # -- fp32 list: normalisation, softmax, reductions -----------------------------------------
    add(
        "F.layer_norm",
        ("layer_norm", "native_layer_norm"),
        lambda a, w, b: F.layer_norm(a, (8,), w, b),
        lambda g, d: (_r(g, d, 4, 8), _r(g, d, 8), _r(g, d, 8)),
    )
    add("nn.LayerNorm", ("layer_norm", "native_layer_norm"), lambda m, a: m(a), _mod(lambda: nn.LayerNorm(8)))
    add("F.group_norm", "group_norm", lambda a: F.group_norm(a, 2), x(2, 4, 5))
    add("nn.GroupNorm", "group_norm", lambda m, a: m(a), _mod(lambda: nn.GroupNorm(2, 4)))
    add("F.rms_norm", "rms_norm", lambda a: F.rms_norm(a, (8,)), x(4, 8))
    add("F.softmax", "softmax", lambda a: F.softmax(a, dim=-1), x(4, 8))
    add("torch.softmax", "softmax", lambda a: torch.softmax(a, -1), x(4, 8))
    add("F.log_softmax", "log_softmax", lambda a: F.log_softmax(a, dim=-1), x(4, 8))
    add("torch.logsumexp", "logsumexp", lambda a: torch.logsumexp(a, -1), x(4, 8))
    add("torch.sum", "sum", torch.sum, x(4, 8))
    add("Tensor.sum(dim)", "sum", lambda a: a.sum(dim=1), x(4, 8))
    add("torch.prod", "prod", torch.prod, x(4, 8, lo=0.5))
    add("torch.cumsum", "cumsum", lambda a: torch.cumsum(a, 1), x(4, 8))
    add("torch.cumprod", "cumprod", lambda a: torch.cumprod(a, 1), x(4, 8, lo=0.5))
    add("torch.norm", "norm", torch.norm, x(4, 8))
    add("torch.linalg.vector_norm", "linalg_vector_norm", torch.linalg.vector_norm, x(4, 8))
    add("torch.linalg.matrix_norm", "linalg_matrix_norm", torch.linalg.matrix_norm, x(4, 8))
    add("torch.dist", "dist", torch.dist, xy(4, 8))
    add("torch.cdist", "cdist", torch.cdist, lambda g, d: (_r(g, d, 4, 8), _r(g, d, 5, 8)))
    add("F.pdist", "pdist", F.pdist, x(4, 8))
    add("F.cosine_similarity", "cosine_similarity", F.cosine_similarity, xy(4, 8))
    add("torch.renorm", "renorm", lambda a: torch.renorm(a, 2, 0, 1.0), x(4, 8))
    add("torch.trace", "trace", torch.trace, x(5, 5))
    # -- fp32 list: losses ---------------------------------------------------------------------
    add("F.mse_loss", "mse_loss", F.mse_loss, xy(4, 8))
    add("F.l1_loss", "l1_loss", F.l1_loss, xy(4, 8))
    add("F.smooth_l1_loss", "smooth_l1_loss", F.smooth_l1_loss, xy(4, 8))
    add("F.huber_loss", "huber_loss", F.huber_loss, xy(4, 8))
    add("F.cross_entropy", "cross_entropy_loss", F.cross_entropy, lambda g, d: (_r(g, d, 4, 6), _idx(g, d, 6, 4)))
    add(
        "nn.CrossEntropyLoss",
        "cross_entropy_loss",
        lambda a, t: nn.CrossEntropyLoss()(a, t),
        lambda g, d: (_r(g, d, 4, 6), _idx(g, d, 6, 4)),
    )
    add("F.nll_loss", "nll_loss", F.nll_loss, lambda g, d: (F.log_softmax(_r(g, d, 4, 6), -1), _idx(g, d, 6, 4)))
    add(
        "F.kl_div",
        "kl_div",
        lambda a, b: F.kl_div(a, b, reduction="batchmean"),
        lambda g, d: (F.log_softmax(_r(g, d, 4, 6), -1), F.softmax(_r(g, d, 4, 6), -1)),
    )
    add(
        "F.binary_cross_entropy_with_logits",
        "binary_cross_entropy_with_logits",
        F.binary_cross_entropy_with_logits,
        lambda g, d: (_r(g, d, 4, 8), torch.rand(4, 8, generator=g).to(d)),
    )
    add(
        "F.binary_cross_entropy",
        "binary_cross_entropy",
        F.binary_cross_entropy,
        lambda g, d: (torch.rand(4, 8, generator=g).to(d) * 0.9 + 0.05, torch.rand(4, 8, generator=g).to(d)),
    )
    add(
        "F.poisson_nll_loss",
        "poisson_nll_loss",
        F.poisson_nll_loss,
        lambda g, d: (_r(g, d, 4, 8), _r(g, d, 4, 8, lo=0.0)),
    )
    add(
        "F.cosine_embedding_loss",
        "cosine_embedding_loss",
        F.cosine_embedding_loss,
        lambda g, d: (_r(g, d, 4, 8), _r(g, d, 4, 8), (_idx(g, d, 2, 4) * 2 - 1)),
    )
    add(
        "F.hinge_embedding_loss",
        "hinge_embedding_loss",
        F.hinge_embedding_loss,
        lambda g, d: (_r(g, d, 4, 8), (_idx(g, d, 2, 4, 8) * 2 - 1)),
    )
    add(
        "F.margin_ranking_loss",
        "margin_ranking_loss",
        F.margin_ranking_loss,
        lambda g, d: (_r(g, d, 8), _r(g, d, 8), (_idx(g, d, 2, 8) * 2 - 1)),
    )
    add(
        "F.multilabel_margin_loss",
        "multilabel_margin_loss",
        F.multilabel_margin_loss,
        lambda g, d: (_r(g, d, 4, 6), _idx(g, d, 6, 4, 6)),
    )
    add(
        "F.soft_margin_loss",
        "soft_margin_loss",
        F.soft_margin_loss,
        lambda g, d: (_r(g, d, 4, 8), (_idx(g, d, 2, 4, 8) * 2 - 1).float()),
    )
    add(
        "F.triplet_margin_loss",
        "triplet_margin_loss",
        F.triplet_margin_loss,
        lambda g, d: (_r(g, d, 4, 8), _r(g, d, 4, 8), _r(g, d, 4, 8)),
    )
    add(
        "F.multi_margin_loss", "multi_margin_loss", F.multi_margin_loss, lambda g, d: (_r(g, d, 4, 6), _idx(g, d, 6, 4))
    )
    # -- fp32 list: resampling, pooling, padding, linear algebra, spectral ---------------------
    for mode, shape in (
        ("nearest", (1, 2, 4, 4)),
        ("bilinear", (1, 2, 4, 4)),
        ("bicubic", (1, 2, 4, 4)),
        ("linear", (1, 2, 4)),
        ("trilinear", (1, 1, 3, 3, 3)),
    ):
        kw: dict[str, Any] = {} if mode == "nearest" else {"align_corners": False}
        aten_up = {
            "nearest": "upsample_nearest2d",
            "bilinear": "upsample_bilinear2d",
            "bicubic": "upsample_bicubic2d",
            "linear": "upsample_linear1d",
            "trilinear": "upsample_trilinear3d",
        }[mode]
        add(
            f"F.interpolate({mode})",
            aten_up,
            lambda a, mode=mode, kw=kw: F.interpolate(a, scale_factor=2, mode=mode, **kw),
            x(*shape),
        )
    add(
        "F.grid_sample",
        "grid_sampler",
        lambda a, gr: F.grid_sample(a, gr, align_corners=False),
        lambda g, d: (_r(g, d, 1, 2, 4, 4), torch.rand(1, 3, 3, 2, generator=g).to(d) * 2 - 1),
    )
    add("F.avg_pool3d", "avg_pool3d", lambda a: F.avg_pool3d(a, 2), x(1, 2, 4, 4, 4))
    add("F.max_pool3d", "max_pool3d", lambda a: F.max_pool3d(a, 2), x(1, 2, 4, 4, 4))
    add("F.adaptive_avg_pool3d", "adaptive_avg_pool3d", lambda a: F.adaptive_avg_pool3d(a, 2), x(1, 2, 4, 4, 4))
    add("F.adaptive_max_pool3d", "adaptive_max_pool3d", lambda a: F.adaptive_max_pool3d(a, 2), x(1, 2, 4, 4, 4))
    add("F.pad(reflect)", "reflection_pad2d", lambda a: F.pad(a, (1, 1, 1, 1), mode="reflect"), x(1, 2, 4, 4))
    add("F.pad(replicate)", "replication_pad2d", lambda a: F.pad(a, (1, 1, 1, 1), mode="replicate"), x(1, 2, 4, 4))

    def spd(g: torch.Generator, d: torch.device) -> tuple[Any, ...]:
        a = _r(g, d, 4, 4)
        return (a @ a.T + 4 * torch.eye(4, device=d),)

    add("torch.linalg.inv", ("linalg_inv_ex", "linalg_inv"), torch.linalg.inv, spd)
    add("torch.linalg.cholesky", "linalg_cholesky_ex", torch.linalg.cholesky, spd)
    add("torch.linalg.qr", "linalg_qr", lambda a: torch.linalg.qr(a)[0], x(4, 4))
    add("torch.linalg.svdvals", "linalg_svdvals", torch.linalg.svdvals, x(4, 4))
    add("torch.linalg.eigvalsh", "linalg_eigvalsh", torch.linalg.eigvalsh, spd)
    add("torch.linalg.solve", "linalg_solve", torch.linalg.solve, lambda g, d: (*spd(g, d), _r(g, d, 4, 2)))
    add("torch.fft.fft", "fft_fft", lambda a: torch.view_as_real(torch.fft.fft(a)), x(4, 8))
    add("torch.fft.rfft", "fft_rfft", lambda a: torch.view_as_real(torch.fft.rfft(a)), x(4, 8))
    add("torch.quantile", "quantile", lambda a: torch.quantile(a, 0.25), x(16))
    add("torch.nanquantile", "nanquantile", lambda a: torch.nanquantile(a, 0.25), x(16))
    for mode, shape in (
        ("nearest-exact", (1, 2, 4)),
        ("nearest-exact", (1, 2, 4, 4)),
        ("nearest-exact", (1, 1, 2, 2, 2)),
        ("nearest", (1, 2, 4)),
        ("nearest", (1, 1, 2, 2, 2)),
    ):
        rank = len(shape) - 2
        base = "_upsample_nearest_exact" if mode == "nearest-exact" else "upsample_nearest"
        add(
            f"F.interpolate({mode}, {rank}d)",
            f"{base}{rank}d",
            lambda a, mode=mode: F.interpolate(a, scale_factor=2, mode=mode),
            x(*shape),
        )
    for mode in ("bilinear", "bicubic"):
        add(
            f"F.interpolate({mode}, antialias)",
            f"_upsample_{mode}2d_aa",
            lambda a, mode=mode: F.interpolate(a, scale_factor=0.5, mode=mode, antialias=True),
            x(1, 2, 8, 8),
        )
    add("torch.linalg.eigh", "linalg_eigh", lambda a: torch.linalg.eigh(a)[0], spd)
    add("torch.linalg.eig", "linalg_eig", lambda a: torch.linalg.eig(a)[0], spd)
    add("torch.linalg.eigvals", "linalg_eigvals", torch.linalg.eigvals, spd)
    add("torch.linalg.svd", "linalg_svd", lambda a: torch.linalg.svd(a)[1], x(4, 4))
    add("torch.svd", "svd", lambda a: torch.svd(a)[1], x(4, 4))
    add(
        "torch.linalg.lstsq",
        "linalg_lstsq",
        lambda a, b: torch.linalg.lstsq(a, b)[0],
        lambda g, d: (*spd(g, d), _r(g, d, 4, 2)),
    )
    add("torch.linalg.matrix_rank", "linalg_matrix_rank", torch.linalg.matrix_rank, spd)
    add("torch.linalg.cond", "linalg_cond", torch.linalg.cond, spd)
    add("torch.linalg.pinv", ("pinverse", "linalg_pinv"), torch.pinverse, x(4, 3))
    add("torch.inverse", "inverse", torch.inverse, spd)
    add("torch.cholesky", "cholesky", torch.cholesky, spd)
    add("torch.cholesky_inverse", "cholesky_inverse", lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a)), spd)
    add(
        "torch.cholesky_solve",
        "cholesky_solve",
        lambda a, b: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
        lambda g, d: (*spd(g, d), _r(g, d, 4, 2)),
    )
    add("torch.linalg.cholesky_ex", "linalg_cholesky", lambda a: torch.linalg.cholesky_ex(a)[0], spd)
    add("torch.geqrf", "geqrf", lambda a: torch.geqrf(a)[0], x(4, 4))
    add(
        "torch.linalg.householder_product",
        "linalg_householder_product",
        lambda a: torch.linalg.householder_product(*torch.geqrf(a)),
        x(4, 4),
    )
    add("torch.orgqr", "orgqr", lambda a: torch.orgqr(*torch.geqrf(a)), x(4, 4))
    add(
        "torch.ormqr",
        "ormqr",
        lambda a, b: torch.ormqr(*torch.geqrf(a), b),
        lambda g, d: (_r(g, d, 4, 4), _r(g, d, 4, 2)),
    )
    add("torch.qr", "qr", lambda a: torch.qr(a)[0], x(4, 4))
    add("torch.linalg.tensorinv", "linalg_tensorinv", lambda a: torch.linalg.tensorinv(a.reshape(4, 2, 2), ind=1), spd)
    add(
        "torch.linalg.tensorsolve",
        "linalg_tensorsolve",
        lambda a, b: torch.linalg.tensorsolve(a, b[:, 0]),
        lambda g, d: (*spd(g, d), _r(g, d, 4, 2)),
    )
    add(
        "torch.triangular_solve",
        "triangular_solve",
        lambda a, b: torch.triangular_solve(b, torch.linalg.cholesky(a), upper=False)[0],
        lambda g, d: (*spd(g, d), _r(g, d, 4, 2)),
    )
    add(
        "torch.lu_solve",
        ("lu_solve", "_lu_with_info"),
        lambda a, b: torch.lu_solve(b, *torch.linalg.lu_factor(a)),
        lambda g, d: (*spd(g, d), _r(g, d, 4, 2)),
    )
    add(
        "torch.polar",
        "polar",
        lambda a, b: torch.view_as_real(torch.polar(a, b)),
        lambda g, d: (_r(g, d, 4, lo=0.1), _r(g, d, 4)),
    )
    add("torch.view_as_complex", "view_as_complex", lambda a: torch.view_as_real(torch.view_as_complex(a)), x(4, 2))
    add(
        "torch.stft",
        ("stft",),
        lambda a: torch.view_as_real(
            torch.stft(a, 8, window=torch.hann_window(8, device=a.device), return_complex=True)
        ),
        x(32),
    )
    for fft in ("fft2", "fftn", "ifft", "ifft2", "ifftn", "ihfft", "rfft2", "rfftn"):
        add(
            f"torch.fft.{fft}",
            f"fft_{fft}",
            lambda a, fft=fft: torch.view_as_real(getattr(torch.fft, fft)(a).resolve_conj()),
            x(4, 8),
        )
    for fft in ("hfft", "irfft", "irfft2", "irfftn"):
        add(f"torch.fft.{fft}", f"fft_{fft}", lambda a, fft=fft: getattr(torch.fft, fft)(a), x(4, 8))
    add(
        "F.fractional_max_pool2d",
        "fractional_max_pool2d",
        lambda a: F.fractional_max_pool2d(a, 2, output_size=2),
        x(1, 2, 4, 4),
    )
    add(
        "F.fractional_max_pool3d",
        "fractional_max_pool3d",
        lambda a: F.fractional_max_pool3d(a, 2, output_size=2),
        x(1, 1, 4, 4, 4),
    )
    add(
        "F.max_unpool2d",
        "max_unpool2d",
        _unpool2d,
        x(1, 2, 4, 4),
    )
    add(
        "F.max_unpool3d",
        "max_unpool3d",
        _unpool3d,
        x(1, 1, 4, 4, 4),
    )
    add("F.pad(reflect, 1d)", "reflection_pad1d", lambda a: F.pad(a, (1, 1), mode="reflect"), x(1, 2, 4))
    add("F.pad(replicate, 1d)", "replication_pad1d", lambda a: F.pad(a, (1, 1), mode="replicate"), x(1, 2, 4))
    add(
        "F.pad(replicate, 3d)",
        "replication_pad3d",
        lambda a: F.pad(a, (1, 1, 1, 1, 1, 1), mode="replicate"),
        x(1, 1, 2, 2, 2),
    )
    add(
        "F.ctc_loss",
        "ctc_loss",
        lambda a, t: F.ctc_loss(a, t, torch.tensor([6, 6]), torch.tensor([2, 3])),
        lambda g, d: (F.log_softmax(_r(g, d, 6, 2, 5), -1), torch.randint(1, 5, (2, 3), generator=g).to(d)),
    )
    add(
        "F.nll_loss(2d)",
        "nll_loss2d",
        F.nll_loss,
        lambda g, d: (F.log_softmax(_r(g, d, 2, 3, 4, 4), 1), _idx(g, d, 3, 2, 4, 4)),
    )
    add(
        "torch.index_copy",
        "index_copy",
        lambda a, s: torch.index_copy(a, 0, torch.tensor([0, 2], device=a.device), s),
        lambda g, d: (_r(g, d, 4, 3), _r(g, d, 2, 3)),
    )
    add(
        "torch.fake_quantize_per_tensor_affine",
        "fake_quantize_per_tensor_affine",
        lambda a: torch.fake_quantize_per_tensor_affine(a, 0.1, 0, -128, 127),
        x(4, 8),
    )
    add("torch.chain_matmul", "chain_matmul", torch.chain_matmul, m2)
    add("torch.norm(p='nuc')", "nuclear_norm", lambda a: torch.norm(a, p="nuc"), x(4, 4))
    add("torch.norm(p='fro', dim)", "frobenius_norm", lambda a: torch.norm(a, p="fro", dim=(0, 1)), x(4, 4))
    add("nn.RNNCell(relu)", "rnn_relu_cell", lambda m, a: m(a), _mod(lambda: nn.RNNCell(8, 6, nonlinearity="relu")))
    add("nn.LSTM", ("mkldnn_rnn_layer", "lstm"), lambda m, a: m(a)[0], _mod(lambda: nn.LSTM(8, 6, batch_first=True)))
    # -- promote list: mixed inputs go to the widest dtype --------------------------------------
    add("torch.cat", "cat", lambda a, b: torch.cat([a, b]), xy(4, 8))
    add("torch.stack", "stack", lambda a, b: torch.stack([a, b]), xy(4, 8))
    add("torch.addcmul", "addcmul", torch.addcmul, lambda g, d: (_r(g, d, 4, 8), _r(g, d, 4, 8), _r(g, d, 4, 8)))
    add(
        "torch.addcdiv", "addcdiv", torch.addcdiv, lambda g, d: (_r(g, d, 4, 8), _r(g, d, 4, 8), _r(g, d, 4, 8, lo=0.5))
    )
    add("torch.atan2", "atan2", torch.atan2, xy(4, 8))
    add("torch.cross", "cross", lambda a, b: torch.linalg.cross(a, b), xy(4, 3))
    add(
        "torch.index_put",
        "index_put",
        lambda a, v, i: torch.index_put(a, (i,), v),
        lambda g, d: (_r(g, d, 8), _r(g, d, 3), _idx(g, d, 8, 3)),
    )
    add(
        "torch.scatter_add",
        "scatter_add",
        lambda a, i, s: torch.scatter_add(a, 0, i, s),
        lambda g, d: (_r(g, d, 8), _idx(g, d, 8, 5), _r(g, d, 5)),
    )
    # -- not on any list: follow their inputs --------------------------------------------------
    add("torch.add", "add", torch.add, xy(4, 8))
    add("torch.mul", "mul", torch.mul, xy(4, 8))
    add("F.relu", "relu", F.relu, x(4, 8))
    add("F.gelu", "gelu", F.gelu, x(4, 8))
    add("F.silu", "silu", F.silu, x(4, 8))
    add("torch.tanh", "tanh", torch.tanh, x(4, 8))
    add("torch.sigmoid", "sigmoid", torch.sigmoid, x(4, 8))
    add("F.dropout", "dropout", lambda a: F.dropout(a, 0.5, training=True), x(4, 8))
    add("F.embedding", "embedding", F.embedding, lambda g, d: (_idx(g, d, 10, 4), _r(g, d, 10, 8)))
    add("F.max_pool2d", "max_pool2d", lambda a: F.max_pool2d(a, 2), x(1, 2, 4, 4))
    add("F.avg_pool2d", "avg_pool2d", lambda a: F.avg_pool2d(a, 2), x(1, 2, 4, 4))
    add("nn.BatchNorm2d", "batch_norm", lambda m, a: m(a), _mod(lambda: nn.BatchNorm2d(3)))
    add("torch.mean", "mean", torch.mean, x(4, 8))
    add("torch.var", "var", torch.var, x(4, 8))
    add("torch.where", "where", lambda a, b: torch.where(a > 0, a, b), xy(4, 8))
    add("torch.clamp", "clamp", lambda a: torch.clamp(a, -0.5, 0.5), x(4, 8))
    return c


CATALOGUE: tuple[OpCase, ...] = tuple(_cases())

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


# -- probing ----------------------------------------------------------------------------------
def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    raise TypeError(f"op returned {type(out).__name__}, not a tensor")


def _cast(arg: Any, dtype: torch.dtype) -> Any:
    if isinstance(arg, torch.Tensor) and arg.is_floating_point():
        return arg.to(dtype)
    if isinstance(arg, nn.Module):
        return copy.deepcopy(arg).to(dtype)
    return arg


def _float_tensor_count(args: Sequence[Any]) -> int:
    return sum(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)


def _mixed(args: Sequence[Any], dtype: torch.dtype) -> tuple[Any, ...]:
    """First floating tensor fp32, the other floating tensors in ``dtype``."""
    out, seen = [], False
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            out.append(a if not seen else a.to(dtype))
            seen = True
        else:
            out.append(a)
    return tuple(out)


def _run(case: OpCase, args: Sequence[Any], device_type: str, dtype: torch.dtype, enabled: bool) -> torch.Tensor:
    torch.manual_seed(0)  # dropout and other random ops draw the same numbers in both runs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation chatter is not policy; results are what count
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            return _first_tensor(case.fn(*args))


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def probe(case: OpCase, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """What autocast does with one op: output dtypes for fp32 / low-precision / mixed inputs, and
    whether the fp32-input result equals the op run by hand on inputs cast to autocast's choice."""
    g = torch.Generator().manual_seed(seed)
    args = case.make(g, device)
    row: dict[str, Any] = {}
    try:
        out = _run(case, args, device.type, dtype, True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0][:120]
        return {"fp32_in": f"raises: {first}"}
    row["fp32_in"] = _name(out.dtype)
    if out.is_floating_point():
        cast_args = [_cast(a, out.dtype) for a in args]
        manual = _run(case, cast_args, device.type, dtype, False)
        if case.name in NOT_BITWISE_REPRODUCIBLE or not bitwise_equal(
            manual, _run(case, cast_args, device.type, dtype, False)
        ):
            row["manual_cast_equal"] = "nondeterministic"  # the op alone differs run to run
        else:
            row["manual_cast_equal"] = bitwise_equal(out, manual)
    try:
        row["lowp_in"] = _name(_run(case, [_cast(a, dtype) for a in args], device.type, dtype, True).dtype)
    except RuntimeError as exc:
        row["lowp_in"] = f"raises: {str(exc).strip().splitlines()[0][:80]}"
    if _float_tensor_count(args) >= 2:
        try:
            row["mixed_in"] = _name(_run(case, _mixed(args, dtype), device.type, dtype, True).dtype)
        except RuntimeError as exc:
            row["mixed_in"] = f"raises: {str(exc).strip().splitlines()[0][:80]}"
    return row


def policy_table(
    device: torch.device, dtype: torch.dtype, cases: Sequence[OpCase] = CATALOGUE
) -> dict[str, dict[str, Any]]:
    return {c.name: probe(c, device, dtype) for c in cases if device.type in c.devices}


def category(row: dict[str, Any], dtype: torch.dtype) -> str:
    """The autocast list an op behaves as: lower_precision, fp32, widest_input, follows_input, or
    raises (the banned list, or an op autocast breaks)."""
    low = _name(dtype)
    if str(row.get("fp32_in", "")).startswith("raises"):
        return "raises"
    if row.get("fp32_in") == low:
        return "lower_precision"
    if row.get("lowp_in") == "float32":
        return "fp32"
    if row.get("mixed_in") == "float32":
        return "widest_input"  # the promote list, or plain type promotion: the same result
    return "follows_input"


def registered_autocast_ops(device_type: str) -> list[str]:
    """aten ops with a kernel registered for the Autocast dispatch key of ``device_type``."""
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device_type]
    return sorted(
        n for n in torch._C._dispatch_get_all_op_names() if torch._C._dispatch_has_kernel_for_dispatch_key(n, key)
    )


def aten_base(op: str) -> str:
    """``aten::conv2d.padding`` -> ``conv2d``."""
    return op.removeprefix("aten::").split(".")[0]
