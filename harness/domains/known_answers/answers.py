"""Known answers as baselines: a computation's output encoded bitwise (its digest for the fleet, its
bits for locating a mismatch), the key a healthy card's answers are recorded under, and the bitwise
comparison that decides the claim.

Tolerance-based checks cannot see a unit that is wrong by one ulp, persistently (a stuck lane) or
now and then (a flipped bit): the answers of one hardware class and software stack are bitwise
reproducible there (measured: ``tests/test_known_answers_can_fail.py``), so any differing bit is the card's.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from harness.domains.known_answers.computations import COMPUTATIONS, answer, bits
from harness.numerics.comparison import DataComparison, DataDifference
from harness.numerics.tolerance import Tolerance
from harness.platform.kernels import first_line

__all__ = ["COMPUTATIONS", "Mismatch", "answer", "attempt", "baseline_name", "compare", "decode", "encode"]

#: bitwise: the tolerance a known answer is held to, and where it comes from
BITWISE = Tolerance(0.0, 0.0, "bitwise: a healthy card of this hardware class and stack recorded these bits")


def digest(t: torch.Tensor) -> str:
    """SHA-256 of the tensor's dtype, shape and bytes: the answer's fingerprint in the fleet store."""
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(bits(t).numpy().tobytes())
    return h.hexdigest()


def encode(t: torch.Tensor) -> dict[str, Any]:
    """What a baseline keeps of an answer: dtype, shape, digest, and the bits (zlib, base64)."""
    raw = bits(t).numpy().tobytes()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": digest(t),
        "bits": base64.b64encode(zlib.compress(raw, 9)).decode("ascii"),
    }


def decode(data: dict[str, Any]) -> torch.Tensor:
    """The tensor an :func:`encode` dict holds."""
    dtype = getattr(torch, str(data["dtype"]))
    raw = bytearray(zlib.decompress(base64.b64decode(str(data["bits"]))))
    width = torch.empty((), dtype=dtype).element_size()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    return torch.frombuffer(raw, dtype=ints).view(dtype).reshape([int(n) for n in data["shape"]]).clone()


@dataclass(frozen=True)
class Mismatch:
    """Where an answer first differs: the flat index, the expected and observed values and bits,
    and how many elements differ."""

    index: int
    expected: float
    observed: float
    expected_bits: int
    observed_bits: int
    count: int
    total: int

    def describe(self) -> str:
        return (
            f"{self.count} of {self.total} elements differ bitwise; first at flat index {self.index}: expected "
            f"{self.expected!r} (bits {self.expected_bits:#x}), observed {self.observed!r} (bits {self.observed_bits:#x})"
        )


def mismatch(expected: torch.Tensor, observed: torch.Tensor) -> Mismatch | None:
    """The first bitwise difference of two answers (a shape or dtype change is a difference at 0)."""
    if expected.dtype != observed.dtype or expected.shape != observed.shape:
        return Mismatch(0, float("nan"), float("nan"), 0, 0, max(expected.numel(), observed.numel()), expected.numel())
    e, o = bits(expected), bits(observed)
    differ = (e != o).nonzero().flatten()
    if differ.numel() == 0:
        return None
    i = int(differ[0])
    mask = (1 << (8 * expected.element_size())) - 1
    return Mismatch(
        i,
        float(expected.flatten()[i].float()),
        float(observed.flatten()[i].float()),
        int(e[i]) & mask,
        int(o[i]) & mask,
        int(differ.numel()),
        expected.numel(),
    )


def compare(name: str, stored: dict[str, Any], obtained: dict[str, Any]) -> DataComparison:
    """The claim: the obtained answer's bits are the stored answer's (the digest first, the bits to
    say where they differ)."""
    if stored.get("sha256") == obtained.get("sha256"):
        return DataComparison(f"known answer {name}", 1, (), BITWISE)
    found = mismatch(decode(stored), decode(obtained))
    if found is None:  # same bits, another digest: a shape or dtype recorded differently
        found = Mismatch(0, float("nan"), float("nan"), 0, 0, 1, 1)
    diff = DataDifference(
        f"{name}[{found.index}]",
        f"{found.expected!r} (bits {found.expected_bits:#x})",
        f"{found.observed!r} (bits {found.observed_bits:#x})",
        found.describe(),
    )
    return DataComparison(f"known answer {name}", found.total, (diff,), BITWISE)


def baseline_name(hardware_class: str, name: str) -> str:
    """The baseline a card's answer of ``name`` is recorded under: the hardware class (without its
    thread count: the answers run on one thread), the exact torch and CUDA releases (a patch
    release may change a kernel's bits), and the computation."""
    cls = re.sub(r"-t\d+$", "", hardware_class)
    stack = f"torch{torch.__version__}" + (f"-cuda{torch.version.cuda}" if torch.version.cuda else "")
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{cls}__{stack}__{name}")


def attempt(name: str, device: torch.device) -> tuple[torch.Tensor | None, str | None]:
    """The answer of ``name`` on ``device`` and None, or None and why this stack cannot compute it
    (an op or dtype it lacks): the computation runs once either way."""
    try:
        return answer(name, device), None
    except (RuntimeError, NotImplementedError, TypeError, AttributeError) as e:
        return None, f"torch {torch.__version__} cannot run known answer {name} on {device.type}: {first_line(e)}"
