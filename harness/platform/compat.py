"""What the torch releases of the declared range (2.4 on) keep under other names: one place that
says which release moved what, so that a check reaches a feature where its release keeps it."""

from __future__ import annotations

import contextlib
import functools
import importlib

import torch


def force_eager() -> contextlib.AbstractContextManager[object]:
    """Compiled code runs eager inside: ``torch.compiler.set_stance("force_eager")`` (torch 2.6 on),
    and before it Dynamo disabled for the block (``torch._dynamo.config.patch(disable=True)``)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is not None:
        stance: contextlib.AbstractContextManager[object] = set_stance("force_eager")
        return stance
    from torch._dynamo import config as dynamo_config

    patched: contextlib.AbstractContextManager[object] = dynamo_config.patch(disable=True)
    return patched


#: FSDP2's sharding function (``module:function``): what the ranks wrap the model with.
FULLY_SHARD = "torch.distributed.fsdp:fully_shard"


#: where releases before torch 2.6 keep FSDP2 (``fully_shard``, ``MixedPrecisionPolicy``): a spec
#: naming ``torch.distributed.fsdp`` is reached there on those releases
FSDP2_HOMES = {"torch.distributed.fsdp": "torch.distributed._composable.fsdp"}


@functools.cache
def fsdp2_missing() -> str | None:
    """Why this torch cannot run FSDP2 on the CPU (None where it can): a one-rank gloo world shards
    a Linear with ``fully_shard`` and runs it, in this process (milliseconds). torch 2.4's FSDP2
    creates CUDA streams in its first forward, so it runs on CUDA only."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        module, _, name = FULLY_SHARD.partition(":")
        fully_shard = getattr(importlib.import_module(module), name, None) or getattr(
            importlib.import_module(FSDP2_HOMES[module]), name
        )
    except (ImportError, AttributeError) as e:
        return f"torch {torch.__version__} has no FSDP2 ({FULLY_SHARD}): {e}"
    created = not dist.is_initialized()  # a one-rank group of its own, destroyed after
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        m = torch.nn.Linear(2, 2)
        fully_shard(m, mesh=init_device_mesh("cpu", (1,)))
        m(torch.ones(1, 2))
    except Exception as e:  # whatever the release raises: the feature is not there on the CPU
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"torch {torch.__version__}'s FSDP2 (fully_shard) does not run on the CPU: {type(e).__name__}: {first}"
    finally:
        if created:
            dist.destroy_process_group()
    return None
