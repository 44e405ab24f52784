"""Whether Inductor can compile for a device here: the reason it cannot, or None.

Inductor's CPU backend writes C++ and builds it with the system compiler against Python's
headers; its CUDA backend writes Triton. A machine without them cannot run the compiled suite,
which then skips with this reason instead of failing on a compiler error deep inside a test.
"""

from __future__ import annotations

import functools
import shutil
import sys
import sysconfig
from pathlib import Path

import torch


@functools.cache
def unavailable(device_type: str) -> str | None:
    """Why Inductor cannot compile for ``device_type`` ("cpu", "cuda") here, or None."""
    if sys.platform == "win32":
        return "Inductor on Windows needs MSVC set up for torch.compile; this harness does not configure it"
    if device_type == "cuda":
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return f"Inductor's CUDA backend needs triton, which is not installed beside torch {torch.__version__}"
        return None
    from torch._inductor import cpp_builder

    try:
        cxx = cpp_builder.get_cpp_compiler()
    except Exception as exc:
        return f"Inductor's CPU backend needs a C++ compiler: {exc}"
    if shutil.which(cxx) is None:
        return f"Inductor's CPU backend needs a C++ compiler: {cxx!r} (from $CXX or the default) is not on PATH"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        return (
            f"Inductor's CPU backend builds against Python's headers, and {include / 'Python.h'} is missing "
            "(install the python3-dev package of this Python)"
        )
    return None
