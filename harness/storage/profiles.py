"""Hardware profiles: per-profile speed thresholds and peak rates, one file each in
``baselines/profiles/<id>.json``.

Thresholds come from two places, each saying which: *measured* by ``amp-harness calibrate`` on
such a machine (placed between the calibration runs and a DETECT_SLOWDOWN-times slower path), or
*published* figures (datasheet peak rates), marked provisional (recorded, not judged) until
calibrated on such hardware. The ``generic`` profile records without judging.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.domains.speed.bench import DETECT_SLOWDOWN
from harness.storage.baselines import atomic_write_text

FORMAT = "amp-harness-profile"
FORMAT_VERSION = 1
DIR = "profiles"

#: (workload, dtype) pairs of the default tier; the thorough tier adds the rest of WORKLOADS.
DEFAULT_CASES: tuple[tuple[str, str], ...] = (
    ("matmul_512", "bfloat16"),
    ("matmul_1024", "bfloat16"),
    ("matmul_256", "float16"),
    ("linear_fwd_bwd", "bfloat16"),
    ("sdpa", "bfloat16"),
    ("layer_norm", "bfloat16"),
    ("lm_train_step", "bfloat16"),
)

#: Dense peak rates from the vendors' datasheets (FLOP/s), for the fraction-of-peak rows.
PUBLISHED: dict[str, dict[str, Any]] = {
    "nvidia-a100": {
        "description": "NVIDIA A100 SXM4 80GB",
        "peak_flops": {"float32": 19.5e12, "bfloat16": 312e12, "float16": 312e12},
        "peak_origin": "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS, BF16/FP16 Tensor Core 312 TFLOPS (dense)",
    },
    "nvidia-h100": {
        "description": "NVIDIA H100 SXM5",
        "peak_flops": {"float32": 67e12, "bfloat16": 989.4e12, "float16": 989.4e12},
        "peak_origin": "NVIDIA H100 Tensor Core GPU datasheet (SXM): FP32 67 TFLOPS, BF16/FP16 Tensor Core 989.4 TFLOPS (dense)",
    },
    "nvidia-h200": {
        "description": "NVIDIA H200 SXM (H100 compute, 141 GB HBM3e)",
        "peak_flops": {"float32": 67e12, "bfloat16": 989.4e12, "float16": 989.4e12},
        "peak_origin": "NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67 TFLOPS, BF16/FP16 Tensor Core 989 TFLOPS (dense)",
    },
}


class ProfileFileError(ValueError):
    """A profile file that cannot be used; names the file and the fix."""


@dataclass(frozen=True)
class Threshold:
    expect: str  # "judge" (min_speedup applies) | "slower" (not accelerated: recorded) | "record"
    min_speedup: float | None
    origin: str
    provisional: bool


@dataclass
class Profile:
    profile: str
    description: str
    judge: bool
    peak_flops: dict[str, float | None] = field(default_factory=dict)
    peak_origin: str = ""
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def threshold(self, workload: str, dtype: str) -> Threshold | None:
        return self.thresholds.get(f"{workload}/{dtype}")

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "profile": self.profile,
            "description": self.description,
            "judge": self.judge,
            "peak_flops": self.peak_flops,
            "peak_origin": self.peak_origin,
            "thresholds": {k: vars(v) for k, v in sorted(self.thresholds.items())},
            "provenance": self.provenance,
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def path_for(baseline_dir: Path, profile: str) -> Path:
    return baseline_dir / DIR / f"{profile}.json"


def known(baseline_dir: Path) -> tuple[str, ...]:
    d = baseline_dir / DIR
    return tuple(sorted(p.stem for p in d.glob("*.json"))) if d.is_dir() else ()


def load(baseline_dir: Path, profile: str) -> Profile:
    """The profile's file; the generic fallback (record, never judge) when there is none."""
    path = path_for(baseline_dir, profile)
    if not path.exists():
        return Profile(profile, f"{profile} (no profile file: recorded, not judged)", judge=False)
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
    return Profile(
        raw["profile"],
        raw.get("description", ""),
        bool(raw.get("judge", False)),
        raw.get("peak_flops", {}),
        raw.get("peak_origin", ""),
        {k: Threshold(**v) for k, v in raw.get("thresholds", {}).items()},
        raw.get("provenance", {}),
    )


def save(baseline_dir: Path, prof: Profile) -> Path:
    path = path_for(baseline_dir, prof.profile)
    atomic_write_text(path, prof.to_json())
    return path


def threshold_from_calibration(speedups: list[float]) -> Threshold:
    """Place a threshold from repeated measurements of one (workload, dtype).

    Not accelerated (median below 1): the slowdown is expected and recorded, not judged. Otherwise
    the threshold is the geometric mean of the slowest calibration run and the median slowed by
    DETECT_SLOWDOWN: equally far (as a ratio) from a clean run and from the path the gate must
    catch. If the slowest clean run is already as slow as that path, the machine is too noisy to
    judge and the pair is recorded only.
    """
    med, low = statistics.median(speedups), min(speedups)
    runs = ", ".join(f"{s:.3g}" for s in speedups)
    if med < 1.0:
        return Threshold(
            "slower",
            None,
            f"measured here: AMP is {1 / med:.3g}x slower (runs: {runs}); not accelerated on this profile: recorded, not judged",
            False,
        )
    caught = med / DETECT_SLOWDOWN
    if low <= caught:
        return Threshold(
            "record",
            None,
            f"measured here: runs {runs} vary too much to tell a {DETECT_SLOWDOWN}x slower path; recorded, not judged",
            False,
        )
    t = math.sqrt(low * caught)
    return Threshold(
        "judge",
        round(t, 4),
        f"measured here: speedups {runs} (median {med:.3g}); threshold sqrt(slowest {low:.3g} x median/{DETECT_SLOWDOWN} {caught:.3g}) = {t:.3g}",
        False,
    )


def published_profile(profile: str) -> Profile:
    """A GPU profile from datasheet figures: peaks known, thresholds provisional (not judged)."""
    info = PUBLISHED[profile]
    thresholds = {
        f"{w}/{d}": Threshold(
            "record", None, "provisional: not yet measured on such hardware; run `amp-harness calibrate` there", True
        )
        for w, d in DEFAULT_CASES
    }
    return Profile(
        profile,
        info["description"],
        judge=True,
        peak_flops=info["peak_flops"],
        peak_origin=info["peak_origin"],
        thresholds=thresholds,
        provenance={"source": "published datasheet figures", "measured": False},
    )
