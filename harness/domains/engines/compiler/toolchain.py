"""Whether Inductor can compile for a device here: the reason it cannot, or None.

Inductor's CPU backend writes C++ and builds it with the system compiler against Python's
headers; its CUDA backend writes Triton. A machine without them cannot run the compiled suite,
which then skips with this reason instead of failing on a compiler error deep inside a test.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import sysconfig
import threading
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
    try:
        cxx = _cpp_compiler()
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


def _cpp_compiler() -> str:
    """The C++ compiler Inductor will call ($CXX or its default): ``cpp_builder.get_cpp_compiler``
    from torch 2.5, ``codecache.cpp_compiler`` in 2.4."""
    from torch._inductor import cpp_builder

    found = getattr(cpp_builder, "get_cpp_compiler", None)
    if found is None:
        from torch._inductor import codecache

        found = getattr(codecache, "cpp_compiler")  # noqa: B009  (torch 2.4 only: not in newer stubs)
    return str(found())


def _valid_vec_isa_list() -> object:
    """Inductor's probe of the CPU's vector ISAs (``cpu_vec_isa`` from torch 2.5, ``codecache`` in 2.4)."""
    import importlib

    try:
        home = importlib.import_module("torch._inductor.cpu_vec_isa")
    except ImportError:
        home = importlib.import_module("torch._inductor.codecache")
    return home.valid_vec_isa_list()


_warm_up: threading.Thread | None = None


def warm_up_in_background() -> None:
    """Start Inductor's one-time CPU set-up in a background thread, once per process.

    Before its first CPU kernel Inductor probes the vector ISAs the CPU reports by building and
    loading a C++ test program for each (AMX, AVX-512 VNNI, AVX-512, AVX2): about 17 s on a fresh
    Inductor cache on 2 cores, nearly all of it the compiler's, in subprocesses. Started when a run
    has selected compiled checks, it runs on the core the tests leave idle; :func:`wait_for_warm_up`
    (every compile) joins it, so Inductor itself then finds the result cached, as it would have
    computed it. A failure here is left for Inductor to raise in the test that compiles."""
    global _warm_up
    if _warm_up is not None or unavailable("cpu") is not None:
        return
    # Every module the probe needs is imported here, on the calling thread, so that the thread
    # imports none: an import that finishes in the background while a test runs can be undone
    # under it (pytester's in-process runs restore sys.modules after them). Undone half-way it left
    # setuptools' distutils shim without setuptools, and the next compile failed on setuptools'
    # warning that distutils came first.
    import torch.utils.cpp_extension  # noqa: F401  (setuptools: Inductor's build options import it)
    from torch._inductor import codecache  # noqa: F401  (the probe's build and load)

    with contextlib.suppress(ImportError):
        from torch._inductor import cpu_vec_isa  # noqa: F401  (the probe itself, from torch 2.5)

    def probe() -> None:
        try:
            _valid_vec_isa_list()
        except Exception:  # Inductor probes again in the compiling test and says why
            return

    _warm_up = threading.Thread(target=probe, name="amp-harness-inductor-isa-probe", daemon=True)
    _warm_up.start()


def wait_for_warm_up() -> None:
    """Join the background set-up, if one was started (two concurrent probes would only repeat work)."""
    if _warm_up is not None:
        _warm_up.join()
