"""A known answer, standalone: one fixed mixed-precision computation run deterministically (one CPU
thread, deterministic algorithms) on inputs drawn from a fixed seed, compared bitwise with the
answer a healthy card of the same hardware class and software stack recorded.

amp-harness writes the computation that disagreed, from ``harness/domains/known_answers/
computations.py``, in place of the ``computation`` block, and the recorded answer as ``expected``
in place of the ``recorded`` block; the block here stands in for it (bf16 linear under autocast),
so that the file runs as it lies, comparing the computation with itself.
"""

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F

# -- computation --
SEED = 20261207


def _draw(device: torch.device, dtype: torch.dtype, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    return [torch.randn(s, generator=g).to(dtype).to(device) for s in shapes]


def linear(device: torch.device, low: torch.dtype) -> torch.Tensor:
    x, w, b = _draw(device, torch.float32, (64, 128), (96, 128), (96,))
    with torch.autocast(device.type, dtype=low):
        return F.linear(x, w, b)


@contextlib.contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    threads, was = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)
        torch.set_num_threads(threads)


def bits(t: torch.Tensor) -> torch.Tensor:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view).flatten()


COMPUTATION = linear
LOW = torch.bfloat16
DEVICE = "cpu"


def observed() -> torch.Tensor:
    with deterministic(torch.device(DEVICE)):
        return COMPUTATION(torch.device(DEVICE), LOW).detach().cpu().contiguous()


# -- recorded --
expected = observed()

# -- compare --
NAME = "linear_bf16"  # the computation that disagreed
got = observed()
differ = (bits(got) != bits(expected)).nonzero().flatten()
if differ.numel():
    i = int(differ[0])
    mask = (1 << 8 * expected.element_size()) - 1  # the bits as unsigned
    e, o = int(bits(expected)[i]) & mask, int(bits(got)[i]) & mask
    print(
        f"{NAME}: {differ.numel()} of {got.numel()} elements differ; first at flat index {i}: expected "
        f"{expected.flatten()[i].item()!r} (bits {e:#x}), observed {got.flatten()[i].item()!r} (bits {o:#x})"
    )
measured = differ.numel()  # elements whose bits differ from the recorded answer
allowed = 0
