"""What the torch releases of the declared range (2.4 on) keep under other names: one place that
says which release moved what, so that a check reaches a feature where its release keeps it."""

from __future__ import annotations

import contextlib

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
