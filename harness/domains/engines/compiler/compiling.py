"""Compiling under autocast, as every family that compiles does (compiled AMP, the patterns'
compiled checkpointing, fp8's compiled casts): a backend and configuration variant, and
``torch.compile`` after a Dynamo reset, without AOTAutograd's cache on the releases where it
serves one autocast dtype's graph to another.

That defect is a known issue of the compiled family's registry, observed by its suite; its entry
lives here, where every compile needs it, and the registry lists this very object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.domains.engines.compiler import toolchain
from harness.domains.versions import KnownIssue

#: The known issue that makes AOTAutograd's cache unsound across autocast dtypes; where it is
#: listed, every compile here runs without that cache (:func:`compile_fn`).
AUTOGRAD_CACHE_DTYPE = "autograd-cache-ignores-autocast-dtype"
AUTOGRAD_CACHE_IGNORES_DTYPE = KnownIssue(
    "autograd-cache-ignores-autocast-dtype",
    "AOTAutograd's cache key records whether autocast is enabled, not its dtype: code compiled under bf16 "
    "autocast is served from the cache to a compile of the same code under fp16 autocast (in the same process "
    "after a Dynamo reset, or in a later process sharing the Inductor cache directory), and the fp16 region "
    "silently runs in bf16, with 8x fp16's unit roundoff. Remedy: torch._functorch.config.enable_autograd_cache "
    "= False",
    first="2.7",
    fixed="2.13",
    verified="2.12",
    reference="pytorch/pytorch#181564 (autocast dtype in AOTAutogradCacheDetails)",
)

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


def compile_fn(fn: Callable[..., Any], backend: Backend) -> Callable[..., Any]:
    """``torch.compile(fn)`` with ``backend`` after a Dynamo reset (no graph of another variant is
    reused: Dynamo caches per code object, and every variant compiles the same code). In releases
    whose AOTAutograd cache ignores the autocast dtype (a registered known issue, observed by the
    compiled suite on its own probe) it runs without that cache: the bf16 and fp16 cells compile the
    same code, and the claims judge the compiler, not a cache that serves one dtype's graph to the other."""
    toolchain.wait_for_warm_up()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    if not AUTOGRAD_CACHE_IGNORES_DTYPE.listed(torch.__version__, "cpu"):
        return compiled

    def without_autograd_cache(*args: Any, **kwargs: Any) -> Any:
        import torch._functorch.config as fc

        with fc.patch(enable_autograd_cache=False):
            return compiled(*args, **kwargs)

    return without_autograd_cache
