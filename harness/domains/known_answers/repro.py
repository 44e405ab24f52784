"""The known answers as scripts: the computation that disagreed, its source taken from
``computations.py`` (so the script runs what the check ran), and the recorded answer saved beside
it, compared bitwise (``scripts/answers.py``'s ``compare`` block)."""

from __future__ import annotations

import inspect
import textwrap

import torch

from harness.domains.known_answers import computations as C
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src

#: a known answer, standalone: ``scripts/answers.py``
ANSWERS = ScriptTemplate(__package__ or "harness.domains.known_answers", "answers")

#: what the computations' source needs beyond the imports every script gets (torch, math, F)
_IMPORTS = "import contextlib\nimport os\nfrom collections.abc import Callable, Iterator\n\nfrom torch import nn"


def _source(*objects: object) -> str:
    return "\n\n\n".join(textwrap.dedent(inspect.getsource(o)).rstrip() for o in objects)  # type: ignore[arg-type]


def answer_repro_of(name: str, expected: torch.Tensor, device: torch.device) -> FailureRepro:
    """The computation ``name`` run as the check ran it, against the recorded answer ``expected``."""
    fn, low = C.COMPUTATIONS[name]
    computation = _source(C._draw, fn, C.deterministic, C.run, C.bits)
    tail = ANSWERS.fill("compare", imports=False, values={"NAME": repr(name)})
    code = "\n\n\n".join(
        [
            _IMPORTS,
            f"SEED = {C.SEED!r}",
            computation,
            f"def observed() -> torch.Tensor:\n    return run({fn.__name__}, {dtype_src(low)}, torch.device({device.type!r}))",
            tail,
        ]
    )
    return FailureRepro(
        "known_answers",
        f"known answer {name}: elements whose bits differ from the answer a healthy card recorded",
        code,
        "0: bitwise, the answer of a healthy card of this hardware class and software stack (recorded with "
        "--amp-regen)",
        {"expected": expected},
        device=device.type,
    )
