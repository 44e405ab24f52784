"""Installing faulty stacks that need no harness: the named patches of torch and torchao
(:data:`STACKS`) and dispatcher kernels (:data:`KERNELS`) that both an injected conftest and a
fresh interpreter running a standalone reproduction can install (``installed``), so that a failed
check's script is shown to exit 1 on the faulty stack and 0 on the clean one.

Not a family's module: the faults themselves live in their families' modules
(``faults.<family>``), and these tables name them; :func:`kernel` and :func:`autocast_kernel`
are how a family's fault registers a kernel.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch


def kernel(op: str, fn: Callable[..., Any], key: str) -> Any:
    """``fn`` as ``op``'s kernel for dispatch ``key`` while the returned Library lives."""
    import warnings

    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
        lib.impl(op, fn, key)  # type: ignore[no-untyped-call]
    return lib


def autocast_kernel(op: str, fn: Callable[..., Any]) -> Any:
    """``fn`` as ``op``'s AutocastCPU kernel while the returned Library lives: a fault below
    every Python API, where autocast itself decides (a captured call replays into it)."""
    return kernel(op, fn, "AutocastCPU")


#: name -> (the aten op whose kernel it replaces, the family's function that registers it, by
#: name: the Library it returns keeps it)
KERNELS: dict[str, tuple[str, str]] = {
    "lossy_gelu": ("gelu", "faults.training.register_lossy_gelu"),
    "layer_norm_autocast_lowp": ("layer_norm", "faults.autocast.register_layer_norm_autocast_lowp"),
    "mm_autocast_one_ulp_off": ("mm", "faults.autocast.register_mm_autocast_one_ulp_off"),
    "mm_autocast_casting_float64": ("mm", "faults.autocast.register_mm_autocast_casting_float64"),
    "lowp_gemm_twice_as_slow": ("mm", "faults.speed.register_lowp_gemm_twice_as_slow"),
    "bf16_gemm_stuck_lane": ("mm", "faults.known_answers.register_bf16_gemm_stuck_lane"),
    "bf16_gemm_intermittent_flip": ("mm", "faults.known_answers.register_bf16_gemm_intermittent_flip"),
    "mm_autocast_in_fp32": ("mm", "faults.autocast.register_mm_autocast_in_fp32"),
    "linear_autocast_uncached": ("linear", "faults.autocast.register_linear_autocast_uncached"),
    "gelu_autocast_registered": ("gelu", "faults.autocast.register_gelu_autocast_kernel"),
    "addmm_activation_autocast_uncast": (
        "_addmm_activation",
        "faults.autocast.register_addmm_activation_autocast_uncast",
    ),
}


def load(name: str) -> None:
    """Import the family module that holds fault ``name`` (a module may use the harness: a fresh
    interpreter imports it before it forbids the harness to the scripts it then runs)."""
    spec = KERNELS[name][1] if name in KERNELS else STACKS[name][1]
    resolve(spec)


def register(name: str) -> Any:
    """Register the faulty kernel ``name``; it stays while the returned Library lives."""
    return resolve(KERNELS[name][1])()


def target(name: str) -> str:
    """What fault ``name`` replaces: two faults with one target cannot be installed together."""
    return f"aten::{KERNELS[name][0]}" if name in KERNELS else STACKS[name][0]


def with_kernel(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A patch factory: the patched function runs with the faulty kernel ``name`` in force, which
    is undone when it returns (an injected conftest scopes a kernel fault to the calls it patches)."""

    def factory(real: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(*args: Any, **kwargs: Any) -> Any:
            lib = register(name)
            try:
                return real(*args, **kwargs)
            finally:
                lib._destroy()

        return faulty

    return factory


#: name -> (patched attribute, factory): what ``installed`` and the injected conftests apply
STACKS: dict[str, tuple[str, str]] = {
    "megatron_scaler_never_backs_off": (
        "megatron.core.optimizer.grad_scaler.DynamicGradScaler.update",
        "faults.scaler.megatron_update_never_backing_off",
    ),
    "deepspeed_scaler_never_backs_off": (
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler.update_scale",
        "faults.scaler.deepspeed_update_never_backing_off",
    ),
    "layer_norm_in_low_precision": ("torch.nn.functional.layer_norm", "faults.autocast.layer_norm_in_low_precision"),
    "scaler_never_backs_off": ("torch.amp.GradScaler.update", "faults.scaler.update_never_backing_off"),
    "sgd_without_weight_decay": ("torch.optim.sgd.sgd", "faults.scaler.sgd_without_weight_decay"),
    "sgd_skipping_low_precision_parameters": (
        "torch.optim.sgd.sgd",
        "faults.scaler.sgd_skipping_low_precision_parameters",
    ),
    "scaler_scaling_a_quarter_high": ("torch.amp.GradScaler.scale", "faults.scaler.scale_a_quarter_high"),
    "adamw_losing_fp32_update_precision": (
        "torch.optim.AdamW.step",
        "faults.training.adamw_losing_fp32_update_precision",
    ),
    "sgd_step_drifting_between_runs": (
        "torch.optim.SGD.step",
        "faults.training.optimizer_step_drifting_between_runs",
    ),
    "scaler_stepping_on_overflow": (
        "torch.amp.GradScaler._maybe_opt_step",
        "faults.scaler.scaler_stepping_on_overflow",
    ),
    "clip_grad_norm_in_bf16": ("torch.nn.utils.clip_grad_norm_", "faults.scaler.clip_grad_norm_in_bf16"),
    "clip_norm_sentinel": ("torch.nn.utils.clip_grad_norm_", "faults.scaler.clip_norm_sentinel"),
    "clip_ignoring_error_if_nonfinite": (
        "torch.nn.utils.clip_grad_norm_",
        "faults.scaler.clip_ignoring_error_if_nonfinite",
    ),
    "fp8_scale_doubled": ("torchao.float8.float8_utils.tensor_to_scale", "faults.fp8.tensor_to_scale_doubled"),
    # Float8Linear's casts take tensor_to_scale as float8_scaling_utils imported it
    "fp8_linear_scale_doubled": (
        "torchao.float8.float8_scaling_utils.tensor_to_scale",
        "faults.fp8.tensor_to_scale_doubled",
    ),
    "fp8_mx_scale_binade_high": (
        "torchao.prototype.mx_formats.mx_tensor.to_mx",
        "faults.block_scaled.to_mx_scale_binade_high",
    ),
    "fp8_mx_zero_block_scale_nan": (
        "torchao.prototype.mx_formats.mx_tensor.to_mx",
        "faults.block_scaled.to_mx_zero_block_scale_nan",
    ),
    "fp8_recipe_rowwise_grad_output_e5m2": (
        "torchao.float8.Float8LinearConfig.from_recipe_name",
        "faults.fp8.rowwise_grad_output_e5m2",
    ),
    "fp8_scaled_mm_without_scale_b": ("torch._scaled_mm", "faults.fp8.scaled_mm_without_scale_b"),
    "matmul_slowed_under_autocast": ("torch.Tensor.__matmul__", "faults.speed.matmul_slowed_under_autocast"),
    "autocast_disabled": ("torch.amp.autocast_mode.autocast.__init__", "faults.memory.autocast_disabled"),
    "adamw_amsgrad_by_default": ("torch.optim.AdamW.__init__", "faults.memory.adamw_amsgrad_by_default"),
    "fp16_cast_toward_zero": ("torch.Tensor.to", "faults.formats.fp16_cast_toward_zero"),
    "fp8_overflow_to_nan": ("torch.Tensor.to", "faults.formats.fp8_overflow_to_nan"),
    "fp8_decode_subnormals_flushed": ("torch.Tensor.to", "faults.fp8.fp8_decode_subnormals_flushed"),
    "fp8_e4m3_cast_toward_zero": ("torch.Tensor.to", "faults.formats.fp8_e4m3_cast_toward_zero"),
    "fp8_e8m0_cast_rounding_down": ("torch.Tensor.to", "faults.fp8.e8m0_cast_rounding_down"),
    "fp8_nan_to_zero": ("torch.Tensor.to", "faults.formats.fp8_nan_to_zero"),
    "finfo_fp16_max_halved": ("torch.finfo", "faults.formats.finfo_fp16_max_halved"),
    "fp8_sr_round_to_nearest": (
        "torchao.optim.quant_utils._fp32_to_bf16_sr",
        "faults.stochastic_rounding.sr_round_to_nearest",
    ),
    "fp8_sr_unseeded": ("torchao.optim.quant_utils._fp32_to_bf16_sr", "faults.stochastic_rounding.sr_unseeded"),
    "fp8_f4_cast_toward_zero": (
        "torchao.prototype.mx_formats.kernels.f32_to_f4_unpacked",
        "faults.block_scaled.f4_cast_toward_zero",
    ),
    # NVFP4's quantiser takes the same kernel as nvfp4_tensor imported it
    "fp8_nvfp4_elements_toward_zero": (
        "torchao.prototype.mx_formats.nvfp4_tensor.f32_to_f4_unpacked",
        "faults.block_scaled.f4_cast_toward_zero",
    ),
    "patterns_recompute_outside_autocast": (
        "torch.utils.checkpoint.checkpoint",
        "faults.patterns.recompute_outside_autocast",
    ),
    "patterns_custom_fwd_ignoring_cast_inputs": (
        "torch.amp.custom_fwd",
        "faults.patterns.custom_fwd_ignoring_cast_inputs",
    ),
    "patterns_scaler_state_not_restored": (
        "torch.amp.GradScaler.load_state_dict",
        "faults.patterns.scaler_state_not_restored",
    ),
    "patterns_update_per_optimizer": ("torch.amp.GradScaler.step", "faults.patterns.update_per_optimizer"),
    "compile_rounding_softmax": ("torch.compile", "faults.compiled.compile_rounding_softmax"),
    "compile_recomputing_in_fp32": ("torch.compile", "faults.compiled.compile_recomputing_in_fp32"),
    "compile_softmax_in_float32": ("torch.compile", "faults.compiled.compile_softmax_in_float32"),
    "compile_region_in_low_precision": ("torch.compile", "faults.compiled.compile_region_in_low_precision"),
    "compile_outputs_in_float32": ("torch.compile", "faults.compiled.compile_outputs_in_float32"),
    "compile_output_scaled_off": ("torch.compile", "faults.compiled.compile_output_scaled_off"),
}


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names. A module is the one ``from package import module`` gives: the
    package's attribute where it holds that module (after an in-process pytester run, sys.modules
    may have forgotten a submodule its package still holds, and the code under test uses the
    package's), else the module imported (one torch hides, torch.optim.sgd, too)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        parent, _, child = name.rpartition(".")
        held = getattr(sys.modules.get(parent), child, None) if parent else None
        if isinstance(held, types.ModuleType) and held.__name__ == name:
            obj: Any = held  # looked up before importing: an import would replace the package's attribute
        else:
            try:
                obj = importlib.import_module(name)
            except ImportError:
                continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@contextlib.contextmanager
def installed(name: str) -> Iterator[None]:
    """This interpreter's stack made the faulty one ``name`` (a patch of STACKS, or a kernel of
    KERNELS, whose registration lasts while its Library lives) for the body only, the real one
    restored after: faults that replace the same thing take turns in one interpreter."""
    if name in KERNELS:
        library = register(name)
        try:
            yield
        finally:
            library._destroy()
        return
    target, factory = STACKS[name]
    owner_name, _, attr = target.rpartition(".")
    owner = resolve(owner_name)
    own = vars(owner).get(attr, _INHERITED)  # torch.Tensor.to lives on a base class
    setattr(owner, attr, resolve(factory)(resolve(target)))
    try:
        yield
    finally:
        if own is _INHERITED:
            delattr(owner, attr)
        else:
            setattr(owner, attr, own)


_INHERITED = object()
