"""Everything under a baseline root, validated: baselines, hardware-class profiles, leftovers.

The one place that walks the tree (``amp-harness baselines`` prints it); the lifecycle of a
single baseline lives in :mod:`harness.storage.baselines`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.storage import baselines as bl
from harness.storage import profiles


@dataclass
class Inventory:
    baselines: int = 0
    profiles: int = 0
    bad: int = 0
    lines: list[str] = field(default_factory=list)


def validate_tree(root: Path) -> Inventory:
    """Read every file the harness would read, and say for each whether it can be trusted."""
    inv = Inventory()
    serializer = bl.Serializer()
    files = sorted(p for p in root.rglob(f"*{bl.SUFFIX}") if not p.name.endswith(bl.OBTAINED_SUFFIX))
    for path in [p for p in files if p.parent.name == profiles.DIR]:
        inv.profiles += 1
        try:
            prof = profiles.load(root, path.stem)
        except profiles.ProfileFileError as exc:
            inv.bad += 1
            inv.lines.append(f"BAD  {exc}")
            continue
        judged = sum(t.judged for t in prof.thresholds.values())
        inv.lines.append(f"ok   {path}  (hardware class: {judged} judged thresholds)")
    for path in [p for p in files if p.parent.name != profiles.DIR]:
        inv.baselines += 1
        try:
            doc = serializer.loads(path.read_text(encoding="utf-8"), path, "Regenerate it with pytest --amp-regen")
        except bl.BaselineError as exc:
            inv.bad += 1
            inv.lines.append(f"BAD  {exc}")
            continue
        p = doc.provenance
        inv.lines.append(f"ok   {path}  ({p.get('created')}, torch {p.get('torch')}, {p.get('profile')})")
    for path in sorted(root.rglob(f"*{bl.OBTAINED_SUFFIX}")):
        inv.lines.append(f"note {path}: obtained values of a mismatch; compare with its baseline, then delete it")
    return inv
