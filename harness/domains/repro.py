"""Standalone reproductions of failed checks: what a check saw when it failed, written so that
``amp-harness repro`` can turn it into a script that needs only torch (and the library concerned).

A check that fails attaches a :class:`FailureRepro` to its row: the failing example's tensors
(saved exactly, beside the run report), the computation under test and its independent reference
as source text, and the allowance with its origin. The script :func:`render` writes seeds nothing
and draws nothing: it loads the very inputs the check failed on, so it shows the same numbers on
the same stack. Its last line prints measured against allowed and exits 1 while the defect is
present (``measured > allowed``, or not a number), 0 once fixed, 2 if it could not run.

The families' builders live with their checks, one ``repro`` module per family package
(``harness.domains.<family>.repro``); this module is what they share: the type, the rendering,
the header, the could-not-run hook, and the known-issue scripts' type. Families, one builder each: an op against float64 (autocast numerics), captured calls under
autocast against their expected dtypes, the hand-cast run or PyTorch's lists (autocast policy,
with :mod:`harness.domains.call_capture`), one aten op of a training step against itself in
float64, a loss-scaler trace or the state machine's rules against the scaler's rule, a
third-party scaler's conformance example against its release's rule, one optimizer
step under GradScaler against its float64 update or a skip, fp8 scales,
casts and format limits against their exact definitions, stochastic rounding against the binomial
law of its draws, and
(``harness.domains.compiled.runs.repro_of``) the compiled probe block. A check of another kind
records no reproduction; ``amp-harness repro`` says so and prints the rerun command.
"""

from __future__ import annotations

import functools
import io
import math
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import torch

from harness.domains.versions import KnownIssue

#: A tensor this small is written into the script itself; a larger one is saved beside it.
INLINE_ELEMENTS = 64


@dataclass(frozen=True)
class FailureRepro:
    """One failed check, reproducible without the harness. ``code`` runs after the inputs are
    defined (each tensor by its name) and must set ``measured`` and ``allowed``; ``what`` says what
    is measured, ``allowance`` where the allowance comes from."""

    family: str
    what: str
    code: str
    allowance: str
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    needs: tuple[str, ...] = ("torch",)
    device: str = "cpu"

    def spec(self, attachment: str | None) -> dict[str, Any]:
        """What the row keeps (JSON): everything but the tensors, which ``attachment`` names."""
        return {
            "family": self.family,
            "what": self.what,
            "code": self.code,
            "allowance": self.allowance,
            "needs": list(self.needs),
            "device": self.device,
            "tensors": {k: [str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in self.tensors.items()},
            "attachment": attachment,
        }

    def tensor_bytes(self) -> bytes:
        """The tensors, saved exactly (``torch.save`` of a dict, CPU)."""
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu().clone() for k, v in self.tensors.items()}, buf)
        return buf.getvalue()


def load_tensors(data: bytes) -> dict[str, torch.Tensor]:
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    return {str(k): v for k, v in loaded.items()}


def _literal(name: str, t: torch.Tensor, device: str) -> str:
    """``name = torch.tensor([...])``, exact: float64 reprs round-trip, and every narrower float is
    a float64 exactly."""
    dtype = str(t.dtype)
    values = t.detach().cpu().double().flatten().tolist() if t.is_floating_point() else t.flatten().tolist()
    body = ", ".join("float('nan')" if v != v else repr(v).replace("inf", "float('inf')") for v in values)
    src = f"torch.tensor([{body}], dtype=torch.float64)" if t.is_floating_point() else f"torch.tensor([{body}])"
    to = f".to({dtype})" if t.dtype != torch.float64 else ""
    dev = f'.to("{device}")' if device != "cpu" else ""
    return f"{name} = {src}.reshape({tuple(t.shape)!r}){to}{dev}"


def render(
    spec: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], header: list[str], inputs_file: str | None
) -> str:
    """The script: ``header`` (comment lines), the could-not-run hook, imports, the inputs (inline
    when small, else loaded from ``inputs_file`` beside the script), the check's code, the verdict."""
    device = str(spec.get("device", "cpu"))
    lines = ["# " + h if h else "#" for h in header]
    code = str(spec["code"]).rstrip("\n")
    imports = ["import math", "", "import torch"] + (["import torch.nn.functional as F"] if "F." in code else [])
    out = ["\n".join(lines), "", COULD_NOT_RUN.rstrip("\n"), "", *imports, ""]
    if tensors:
        out.append("# the inputs the check failed on, exactly")
    if tensors and not needs_file(tensors):
        out += [_literal(k, v, device) for k, v in tensors.items()]
    elif tensors:
        if inputs_file is None:
            raise ValueError("tensors too large to inline need an inputs file beside the script")
        dev = f'.to("{device}")' if device != "cpu" else ""
        out += [
            "from pathlib import Path",
            "",
            f"_inputs = torch.load(Path(__file__).with_name({inputs_file!r}), weights_only=True)",
            *(f"{k} = _inputs[{k!r}]{dev}" for k in tensors),
        ]
    two_blank_lines = tensors and code.startswith(("def ", "class "))  # a definition after the inputs
    out += ["", "", code, ""] if two_blank_lines else ["", code, ""]
    what, allowance = str(spec["what"]), str(spec["allowance"])
    out += [
        f'print({what!r} + f": measured {{measured!r}}, allowed {{allowed!r}}")',  # what: text, not a format
        f"print({('allowance: ' + allowance).__repr__()})",
        "_sys.exit(0 if measured <= allowed else 1)  # NaN is not <=: a defect",
        "",
    ]
    return "\n".join(out)


def needs_file(tensors: Mapping[str, torch.Tensor]) -> bool:
    return sum(t.numel() for t in tensors.values()) > INLINE_ELEMENTS


# -- the families -------------------------------------------------------------------------------
def dtype_src(dtype: torch.dtype | None) -> str:
    """A dtype as source (``torch.bfloat16``); None as ``None``."""
    return "None" if dtype is None else str(dtype)


def upcast_src(tensors: Mapping[str, torch.Tensor]) -> str:
    """Source rebinding each floating input to itself upcast exactly to float64."""
    names = ", ".join(tensors) + ("," if len(tensors) == 1 else "")
    values = ", ".join(f"{k}.double() if {k}.is_floating_point() else {k}" for k in tensors)
    return f"{names} = ({values}{',' if len(tensors) == 1 else ''})"


def header(
    spec: Mapping[str, Any], nodeid: str, metric: str, run: str, provenance: str, rerun: str, script: str
) -> list[str]:
    """The script's header: what failed, where it was produced, how to rerun the check itself."""
    wrap = textwrap.TextWrapper(width=96, break_on_hyphens=False, break_long_words=False)
    return [
        f"Reproduces a failed amp-harness check: {metric} (run {run}), of",
        f"  {nodeid}",
        *wrap.wrap(f"Produced on: {provenance}."),
        *wrap.wrap(f"What is measured: {spec['what']}."),
        f"Needs only {' and '.join(spec.get('needs', ['torch']))}. Run: python {script}",
        "Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.",
        "The check itself, with the harness:",
        f"  {rerun}",
    ]


def float_src(x: float) -> str:
    return repr(x) if math.isfinite(x) else f"float({str(x)!r})"


def dict_src(d: Mapping[str, Any]) -> str:
    """A dict of plain values as source (inf and NaN included)."""
    items = (f"{k!r}: {float_src(v) if isinstance(v, float) else repr(v)}" for k, v in d.items())
    return "{" + ", ".join(items) + "}"


#: a template's block marker, on a line of its own: ``# -- <block> --``
_MARKER = re.compile(r"^# -- ([a-z_][a-z0-9_]*) --$", re.MULTILINE)
#: a parameter the check fills in: ``NAME = value`` (an annotation and a trailing comment kept)
_PARAMETER = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<annotation>: [^=]+)? = (?P<value>.+?)(?P<comment>  # .*)?$")
#: the type checker's and linters' pragmas of a template (type-ignore, noqa and isort-skip
#: comments): the script a user reads is not checked, so they are left out of it
_PRAGMA = re.compile(r"  # (type: ignore\[[^\]]*\]|noqa: [A-Z0-9, ]+|isort: skip)(?=  #|$)")
#: the imports :func:`render` writes itself
_RENDERED_IMPORTS = frozenset({"import math", "import torch", "import torch.nn.functional as F"})

#: Every script starts with this: an error the script did not expect (a missing package, an API
#: that moved) exits 2, never 1, so that it cannot read as "the defect is present".
_HOOK_FILE = resources.files(__package__ or "harness.domains").joinpath("scripts", "could_not_run.py")
#: after its docstring, its pragmas out, two blank lines after it
COULD_NOT_RUN = _PRAGMA.sub("", _HOOK_FILE.read_text(encoding="utf-8").split('"""\n\n', 1)[1]) + "\n"


def _bound_names(line: str) -> list[str]:
    """The names an import line binds: ``import a.b`` -> a, ``from m import x, y as z`` -> x, z."""
    if line.startswith("from "):
        names = line.split(" import ", 1)[1].split(",")
    else:
        names = [line.removeprefix("import ").split(".")[0]]
    return [n.split(" as ")[-1].strip(" ()") for n in names if n.strip(" ()")]


def _depth(source: str) -> int:
    """Brackets ``source`` opens minus those it closes (a default's value spread over lines)."""
    return sum(source.count(c) for c in "([{") - sum(source.count(c) for c in ")]}")


@functools.cache
def _blocks_of(template: ScriptTemplate) -> tuple[tuple[str, str], ...]:
    parts = _MARKER.split(template.text)
    return (("", parts[0]), *((parts[i], parts[i + 1]) for i in range(1, len(parts), 2)))


@dataclass(frozen=True)
class ScriptTemplate:
    """A family's reproduction script as a real file, ``scripts/<name>.py`` in its package: it runs
    as it lies (its defaults stand in for a failed check's values) and is linted and type-checked
    with the harness, where a template inside a Python string is read by no tool.

    After its opening (docstring, imports), marker lines ``# -- <block> --`` cut it into blocks. A
    check's reproduction (:attr:`FailureRepro.code`) is some of those blocks, in order, each as it
    lies or replaced (a model's source, the inputs: :func:`render` defines the tensors), with the
    parameters the check measured written over the defaults (``NAME = value`` lines; a default's
    annotation, there for the type checker, is left out of the script)."""

    package: str
    name: str

    @property
    def text(self) -> str:
        return resources.files(self.package).joinpath("scripts", f"{self.name}.py").read_text(encoding="utf-8")

    def blocks(self) -> dict[str, str]:
        """Each block's text by name, in file order (the opening is ``""``): read and cut once."""
        return dict(_blocks_of(self))

    def fill(
        self,
        *names: str,
        values: Mapping[str, str] | None = None,
        replace: Mapping[str, str] | None = None,
        imports: bool = True,
    ) -> str:
        """Blocks ``names`` in order, those in ``replace`` by its text, each parameter in ``values``
        (source text) written over its default: the imports :func:`render` does not write first.
        A value naming no parameter of those blocks, or an unknown block, is an error (the template
        and its check drifted apart). ``imports=False``: blocks that follow others already filled."""
        blocks, values, replace = self.blocks(), dict(values or {}), dict(replace or {})
        unknown = [n for n in (*names, *replace) if n not in blocks]
        if unknown:
            raise ValueError(f"{self.package}.scripts.{self.name}: no block {unknown} (it has {list(blocks)[1:]})")
        opening = [ln for ln in blocks[""].splitlines() if ln.startswith(("import ", "from "))]
        own = [ln for ln in opening if ln not in _RENDERED_IMPORTS and ln != "from __future__ import annotations"]
        out: list[str] = []
        written: set[str] = set()
        for name in names:
            lines: list[str] = []
            open_brackets = 0  # > 0: inside a default spread over several lines, being skipped
            for line in (replace[name] if name in replace else blocks[name]).strip("\n").splitlines():
                if open_brackets > 0:
                    open_brackets += _depth(line)
                    continue
                m = _PARAMETER.match(line)
                if m and m["name"] in values:
                    written.add(m["name"])
                    open_brackets = _depth(m["value"])
                    comment = m["comment"] if open_brackets == 0 else None
                    line = f"{m['name']} = {values[m['name']]}{comment or ''}"  # the annotation: for mypy
                lines.append(_PRAGMA.sub("", line))
            out.append("\n".join(lines))
        body = "\n\n\n".join(part for part in out if part.strip())
        if imports:  # the opening's imports that the blocks use
            used = [ln for ln in own if any(re.search(rf"\b{n}\b", body) for n in _bound_names(ln))]
            out.insert(0, "\n".join(used))
        if set(values) - written:
            raise ValueError(
                f"{self.package}.scripts.{self.name}: no parameter {sorted(set(values) - written)} in {names}"
            )
        return "\n\n\n".join(part for part in out if part.strip())


@dataclass(frozen=True)
class Reproduction:
    """A registered known issue's standalone script: a real ``.py`` file in its family's
    ``issue_scripts/`` folder (package data, linted and type-checked with the harness, runnable as
    it is), what it imports, the edit standing for the upstream fix (``fixed``: the control that the
    script can say "fixed"), and whether it compiles (Inductor: seconds per run on a small CPU)."""

    issue: str
    #: the family package whose ``issue_scripts/`` holds the script
    package: str
    needs: tuple[str, ...]
    fixed: tuple[str, str]
    compiles: bool = False

    @property
    def filename(self) -> str:
        return f"{self.issue.replace('-', '_')}.py"

    @property
    def body(self) -> str:
        """The script as it lies in the package."""
        return resources.files(self.package).joinpath("issue_scripts", self.filename).read_text(encoding="utf-8")

    def fixed_body(self) -> str:
        """The body with the fix applied (the control that the script can say "fixed")."""
        old, new = self.fixed
        body = self.body
        if body.count(old) != 1:
            raise ValueError(f"{self.issue}: the fix's anchor {old!r} must occur once in {self.filename}")
        return body.replace(old, new, 1)


def known_issue_script(
    issue: KnownIssue, where: str, reproduction: Reproduction, provenance: str, body: str | None = None
) -> str:
    """The standalone script of a known issue: a header naming the issue, its registry entry
    (``where``) and ``provenance`` (versions, hardware, date: where the script was written), the
    could-not-run hook, then its body."""
    wrap = textwrap.TextWrapper(
        width=98, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False, break_long_words=False
    )
    header = [
        f"# Reproduces {issue.id} ({issue.package} {issue.span}; {', '.join(issue.devices)}).",
        *wrap.wrap(issue.summary),
        *wrap.wrap(f"Where: {issue.reference}. Registered in amp-harness {where}."),
        *wrap.wrap(f"Written on: {provenance}."),
        f"# Needs only {' and '.join(reproduction.needs)}. Run: python {reproduction.filename}",
        "# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.",
        "",
    ]
    return "\n".join(header) + COULD_NOT_RUN + (reproduction.body if body is None else body)
