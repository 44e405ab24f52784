"""Ready adapters for the loss scalers of megatron-core and DeepSpeed.

Each factory takes a :class:`~harness.domains.scaler.reference.ScalerConfig` and returns a
:class:`~harness.domains.scaler.reference.ScalerAdapter` for the conformance machine; the
semantics it is judged by follows the installed release (:func:`semantics_of`). Neither package
is a dependency of the harness: they are imported when a factory is called (``tox -e
thirdparty`` installs them).

What each adapter does beyond calling the scaler, and why:

megatron-core ``DynamicGradScaler``
    *Declines* configurations its constructor asserts against (``min_scale > 0``,
    ``min_scale <= initial_scale``, ``growth_factor > 1``, ``0 < backoff_factor < 1``).
    *CPU shim*: it creates its tensors with ``device='cuda'``; on a machine without CUDA the
    construction runs under :class:`CudaOnCpu`, which moves those tensors to the CPU.
DeepSpeed ``DynamicLossScaler``
    *Declines* ``growth_factor != 2`` from 0.17.1 (``scale_factor`` is no longer an argument), and
    nothing before (its backoff is always ``1 / scale_factor``: the machine's ``backoff_factor``
    is not part of the DeepSpeed semantics). *Maps* its plain ``Exception("Current loss scale
    already at minimum ...")`` to :class:`~harness.domains.scaler.reference.ScalerAtMinimumError`.
    *CPU shim*: ``update_scale`` asks ``deepspeed.comm.get_rank()`` before logging, which asserts
    unless DeepSpeed's distributed backend is initialised (initialising it on CPU builds a shared
    memory op: ~50 s); without a backend the adapter answers rank 0 for the duration of the call.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from harness.domains.scaler.reference import (
    ConfigurationDeclined,
    ScalerAtMinimumError,
    ScalerConfig,
    Semantics,
    semantics_for,
)
from harness.platform.thirdparty import import_third_party, version_of

#: DeepSpeed's message when an overflow hits the minimum scale (deepspeed/runtime/fp16/loss_scaler.py)
DEEPSPEED_AT_MINIMUM = "Current loss scale already at minimum"


class CudaOnCpu(TorchFunctionMode):
    """Factory calls asking for ``device='cuda'`` get the CPU instead (for code that hard-codes
    CUDA in a constructor). Only used where CUDA is not available."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def semantics_of(package: str) -> Semantics:
    """The semantics the installed release of ``package`` ("megatron-core", "deepspeed") follows."""
    framework = {"megatron-core": "megatron-core", "deepspeed": "deepspeed"}.get(package)
    if framework is None:
        raise ValueError(f"no adapter for {package!r}: choose megatron-core or deepspeed")
    return semantics_for(framework, version_of(package))


# -- megatron-core -------------------------------------------------------------------------------
@dataclass
class MegatronCoreAdapter:
    impl: Any  # megatron.core.optimizer.grad_scaler.DynamicGradScaler
    semantics: Semantics

    def update(self, found_inf: bool) -> None:
        self.impl.update(found_inf)

    def scale(self) -> float:
        return float(self.impl.scale.item())

    def growth_tracker(self) -> int | None:
        return int(self.impl._growth_tracker)


def megatron_core(cfg: ScalerConfig) -> MegatronCoreAdapter:
    """megatron-core's ``DynamicGradScaler`` for ``cfg`` (declines what its constructor refuses)."""
    refused = [
        why
        for bad, why in (
            (not cfg.min_scale > 0.0, "min_scale must be > 0"),
            (not cfg.min_scale <= cfg.init_scale, "min_scale must be <= initial_scale"),
            (not cfg.growth_factor > 1.0, "growth_factor must be > 1"),
            (not 0.0 < cfg.backoff_factor < 1.0, "backoff_factor must be in (0, 1)"),
        )
        if bad
    ]
    if refused:
        raise ConfigurationDeclined("megatron-core DynamicGradScaler: " + "; ".join(refused))
    module = import_third_party("megatron.core.optimizer.grad_scaler")
    args = dict(
        initial_scale=cfg.init_scale,
        min_scale=cfg.min_scale,
        growth_factor=cfg.growth_factor,
        backoff_factor=cfg.backoff_factor,
        growth_interval=cfg.growth_interval,
        hysteresis=cfg.hysteresis,
    )
    if torch.cuda.is_available():
        impl = module.DynamicGradScaler(**args)
    else:
        with CudaOnCpu():
            impl = module.DynamicGradScaler(**args)
    return MegatronCoreAdapter(impl, semantics_of("megatron-core"))


# -- DeepSpeed -----------------------------------------------------------------------------------
@contextmanager
def _rank_zero_without_backend(module: ModuleType) -> Iterator[None]:
    comm = getattr(module, "dist")  # noqa: B009  (a module attribute swapped for the call)
    if comm.is_initialized():
        yield
        return
    setattr(module, "dist", SimpleNamespace(get_rank=lambda: 0))  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "dist", comm)  # noqa: B010


@dataclass
class DeepSpeedLossScalerAdapter:
    impl: Any  # deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler
    module: ModuleType
    semantics: Semantics

    def update(self, found_inf: bool) -> None:
        with _rank_zero_without_backend(self.module):
            try:
                self.impl.update_scale(found_inf)
            except Exception as exc:
                if DEEPSPEED_AT_MINIMUM in str(exc):
                    raise ScalerAtMinimumError(str(exc)) from exc
                raise

    def scale(self) -> float:
        return float(self.impl.cur_scale)

    def growth_tracker(self) -> int | None:
        return None  # DeepSpeed counts iterations, not clean steps


def deepspeed(cfg: ScalerConfig) -> DeepSpeedLossScalerAdapter:
    """DeepSpeed's ``DynamicLossScaler`` for ``cfg``, judged by the semantics of its release."""
    module = import_third_party("deepspeed.runtime.fp16.loss_scaler")
    cls = module.DynamicLossScaler
    args: dict[str, Any] = dict(
        init_scale=cfg.init_scale,
        scale_window=cfg.growth_interval,
        min_scale=cfg.min_scale,
        delayed_shift=cfg.hysteresis,
        consecutive_hysteresis=False,
        raise_error_at_min_scale=cfg.raise_at_min_scale,
    )
    if "scale_factor" in inspect.signature(cls.__init__).parameters:
        args["scale_factor"] = cfg.growth_factor
    elif cfg.growth_factor != 2.0:
        raise ConfigurationDeclined(f"DeepSpeed {version_of('deepspeed')}: scale_factor is fixed at 2")
    return DeepSpeedLossScalerAdapter(cls(**args), module, semantics_of("deepspeed"))


#: The ready adapters by the PyPI package they need.
ADAPTERS = {"megatron-core": megatron_core, "deepspeed": deepspeed}
