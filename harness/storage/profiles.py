"""Hardware-class profiles: calibrated speed thresholds and published peak rates, one file per
calibrated class in ``<baseline-dir>/profiles/<hardware-class>.json``.

A class with a file is judged against thresholds measured on that class by
``amp-harness calibrate``; a class without one is measured and recorded, never judged (shipped
thresholds of another class never judge it). Published datasheet peaks (for the fraction-of-peak
rows) are looked up by the ISA-level profile id whether or not the class is calibrated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.domains.speed.thresholds import Threshold
from harness.platform.hardware import PROFILES
from harness.storage import atomic

FORMAT = "amp-harness-profile"
#: 2: keyed by hardware class (version 1 files were keyed by ISA-level profile id and are not read)
FORMAT_VERSION = 2
DIR = "profiles"


class ProfileFileError(ValueError):
    """A profile file that cannot be used; names the file and the fix."""


@dataclass
class Profile:
    hardware_class: str
    description: str
    calibrated: bool
    peak_flops: dict[str, float | None] = field(default_factory=dict)
    peak_origin: str = ""
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    derived_from: dict[str, Any] = field(default_factory=dict)
    #: seconds of one trivial kernel launched and synchronised, measured at calibration: what the
    #: speed checks size their workloads against (None: measured when a run needs it)
    launch_floor_s: float | None = None

    def threshold(self, workload: str, dtype: str) -> Threshold | None:
        """The calibrated threshold of a pair; None on an uncalibrated class or an uncalibrated pair."""
        return self.thresholds.get(f"{workload}/{dtype}") if self.calibrated else None

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "hardware_class": self.hardware_class,
            "description": self.description,
            "derived_from": self.derived_from,
            "calibrated": self.calibrated,
            "peak_flops": self.peak_flops,
            "peak_origin": self.peak_origin,
            "thresholds": {k: vars(v) for k, v in sorted(self.thresholds.items())},
            "provenance": self.provenance,
            "launch_floor_s": self.launch_floor_s,
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def path_for(baseline_dir: Path, hardware_class: str) -> Path:
    return baseline_dir / DIR / f"{hardware_class}.json"


def calibrated_classes(baseline_dir: Path) -> tuple[str, ...]:
    d = baseline_dir / DIR
    return tuple(sorted(p.stem for p in d.glob("*.json"))) if d.is_dir() else ()


def _published(profile_id: str) -> tuple[dict[str, float | None], str]:
    info = PROFILES.get(profile_id)
    return (dict(info.peak_flops), info.peak_origin) if info is not None else ({}, "")


def load(baseline_dir: Path, hardware_class: str, profile_id: str = "") -> Profile:
    """The class's calibrated profile; an uncalibrated one (record, never judge) when it has no file."""
    path = path_for(baseline_dir, hardware_class)
    peaks, origin = _published(profile_id)
    if not path.exists():
        return Profile(hardware_class, f"{hardware_class} (not calibrated: recorded, not judged)", False, peaks, origin)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ProfileFileError(
            f"profile file {path} is corrupt ({exc}); regenerate it with `amp-harness calibrate`"
        ) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("format_version") != FORMAT_VERSION:
        raise ProfileFileError(
            f"profile file {path} is not a version-{FORMAT_VERSION} amp-harness profile; regenerate it with `amp-harness calibrate`"
        )
    if raw.get("hardware_class") != hardware_class:
        raise ProfileFileError(
            f"profile file {path} belongs to hardware class {raw.get('hardware_class')!r}, not {hardware_class!r} "
            "(copied or renamed?); calibrate this class with `amp-harness calibrate`"
        )
    try:
        thresholds = {k: Threshold(**v) for k, v in raw.get("thresholds", {}).items()}
    except TypeError as exc:
        raise ProfileFileError(f"profile file {path} has malformed thresholds ({exc})") from None
    return Profile(
        hardware_class,
        raw.get("description", ""),
        bool(raw.get("calibrated", False)),
        raw.get("peak_flops") or peaks,
        raw.get("peak_origin") or origin,
        thresholds,
        raw.get("provenance", {}),
        raw.get("derived_from", {}),
        raw.get("launch_floor_s"),
    )


def save(baseline_dir: Path, prof: Profile) -> Path:
    path = path_for(baseline_dir, prof.hardware_class)
    atomic.write_text(path, prof.to_json())
    return path
