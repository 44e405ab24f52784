"""Release versions as the claim families key them: ``release("0.17.1+cpu") == (0, 17, 1)``,
``minor("2.13.0+cpu") == "2.13"`` (known issues and findings are registered per minor release).
One parser for torch, DeepSpeed and megatron-core version strings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.verdict import RowKind
from harness.platform.versions import minor, release

__all__ = ["KnownIssue", "Lifecycle", "RegistryVerdict", "minor", "registry_claim", "registry_verdict", "release"]


@dataclass(frozen=True)
class KnownIssue:
    """A behaviour of some releases, registered as an upstream lifecycle: the first release it was
    observed in, the release that fixed it (None while it is open) and the last release it was
    verified in. An open issue is listed for every release from its first on, so a release newer
    than any the registry knows inherits it: still present there, it is KNOWN, not a failure.
    A suite observes it on every run and :func:`registry_claim` compares observation and lifecycle."""

    id: str
    summary: str
    #: the first release (``"2.13"``: minor releases of ``package``) it was observed in
    first: str
    reference: str
    #: the device types it concerns
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: the package whose minor releases ``first``, ``fixed`` and ``verified`` name
    package: str = "torch"
    #: the first release without it (None: open); a patch release (``"2.4.1"``) where the fix was
    #: shipped in one: the releases before it in that minor are listed, the later ones are not
    fixed: str | None = None
    #: the last release it was observed in ("": ``first``)
    verified: str = ""
    #: a device whose lifecycle differs: (device type, first, fixed, verified), e.g. observed on a
    #: GPU in an earlier release than on the CPU, and not yet observed fixed there; or a hardware
    #: class's (an id prefix such as ``cpu-amd-zen4``: the kind of CPU it was verified on), which
    #: wins over its device type's where the class under test starts with it
    device_lifecycles: tuple[tuple[str, str, str | None, str], ...] = ()

    def __post_init__(self) -> None:
        lifecycles = [(self.first, self.fixed, self.verified), *((f, x, v) for _, f, x, v in self.device_lifecycles)]
        checked = [(w, v) for f, x, ve in lifecycles for w, v in (("first", f), ("fixed", x), ("verified", ve))]
        for what, value in checked:
            if value and not value[0].isdigit():
                raise ValueError(f"known issue {self.id}: {what} {value!r} is not a release such as '2.13'")
        if self.fixed is not None and release(self.fixed) <= release(self.first):
            raise ValueError(f"known issue {self.id}: fixed {self.fixed} is not after its first release {self.first}")

    def on(self, device_type: str, hardware_class: str | None = None) -> KnownIssue:
        """This issue with the lifecycle it has on ``device_type``, or on ``hardware_class`` (a
        hardware class id) where one is registered for a prefix of it (the longest wins)."""
        by_class = [
            e for e in self.device_lifecycles if hardware_class and (hardware_class + "-").startswith(e[0] + "-")
        ]
        chosen = max(by_class, key=lambda e: len(e[0])) if by_class else None
        chosen = chosen or next((e for e in self.device_lifecycles if e[0] == device_type), None)
        if chosen is None:
            return self
        _, first, fixed, verified = chosen
        return dataclasses.replace(self, first=first, fixed=fixed, verified=verified, device_lifecycles=())

    @property
    def last_verified(self) -> str:
        return self.verified or self.first

    @property
    def span(self) -> str:
        """The lifecycle in words: ``2.13 on, open (last verified 2.14)``, ``2.13, fixed in 2.14``."""
        if self.fixed is not None:
            return f"{self.first} to before {self.fixed}, fixed in {self.fixed}"
        return f"{self.first} on, open (last verified {self.last_verified})"

    def listed(self, version: str, device_type: str, hardware_class: str | None = None) -> bool:
        """Whether the registry says this issue is present for that release and device (and
        hardware class, where its lifecycle is registered by class): from its first release on, up
        to (not including) its fix."""
        life = self.on(device_type, hardware_class)
        return (
            device_type in self.devices
            and not before(version, life.first)
            and (life.fixed is None or before(version, life.fixed))
        )


class Lifecycle(str, Enum):
    """What one observation says of a known issue's lifecycle, decided once (the row's
    ``lifecycle_state`` tag and the claim's outcome both come from it)."""

    PRESENT = "present"
    #: present in a release newer than the last one it was verified in
    STILL_PRESENT = "still present"
    #: an open issue absent from a release newer than the last one it was verified in
    FIXED_HERE = "fixed?"
    #: absent from a release it was verified present in
    APPEARS_FIXED = "appears fixed"
    #: present in a release at or after its fix
    REGRESSION = "regression"
    #: present before its first release, or on a device it does not list
    OUTSIDE = "outside its range"
    ABSENT = "absent"

    @property
    def holds(self) -> bool:
        """Whether the registry agrees with the observation."""
        return self in (Lifecycle.PRESENT, Lifecycle.STILL_PRESENT, Lifecycle.FIXED_HERE, Lifecycle.ABSENT)


@dataclass(frozen=True)
class RegistryVerdict:
    """The lifecycle state of one observation, and the claim a registry check records."""

    state: Lifecycle
    claim: ClaimComparison

    def tags(self, **observed: object) -> dict[str, object]:
        """What a registry check's row keeps: what was observed, and the lifecycle it leaves."""
        return {**observed, "lifecycle": self.claim.detail[0], "lifecycle_state": self.state.value}


def before(version: str, boundary: str) -> bool:
    """Whether release ``version`` comes before ``boundary``, compared as precisely as the boundary
    is written: ``"2.5"`` compares minor releases (every 2.4.x is before it, no 2.5.x is), a patch
    release such as ``"2.4.1"`` (a fix shipped in a patch) compares patches too."""
    parts = 3 if boundary.strip().count(".") >= 2 else 2
    return release(version)[:parts] < release(boundary)[:parts]


def lifecycle_state(issue: KnownIssue, present: bool, listed: bool, version: str) -> Lifecycle:
    """Where one observation of ``issue`` in release ``version`` leaves its lifecycle."""
    r = release(version)[:2]
    newer = r > release(issue.last_verified)[:2]
    if present and listed:
        return Lifecycle.STILL_PRESENT if newer else Lifecycle.PRESENT
    if present and issue.fixed is not None and not before(version, issue.fixed):
        return Lifecycle.REGRESSION
    if present:
        return Lifecycle.OUTSIDE
    if listed and newer and issue.fixed is None:
        return Lifecycle.FIXED_HERE
    return Lifecycle.APPEARS_FIXED if listed else Lifecycle.ABSENT


def registry_verdict(
    issue: KnownIssue,
    present: bool,
    listed: bool,
    torch_version: str,
    where: str,
    context: str = "",
    device_type: str | None = None,
    hardware_class: str | None = None,
) -> RegistryVerdict:
    """KNOWN while the issue occurs where its lifecycle lists it; PASS where it is absent outside
    it, and where an open issue no longer occurs in a release newer than the last verified one (a
    finding: "fixed in 2.15?", naming the edit); FAIL where a fixed issue comes back (a regression),
    where it occurs outside its range, or where it vanishes from a release it was verified in."""
    version = minor(torch_version)
    issue = issue if device_type is None else issue.on(device_type, hardware_class)
    state = lifecycle_state(issue, present, listed, torch_version)
    seen = f"{issue.package} {torch_version}{context}"
    detail = {
        Lifecycle.PRESENT: f"known issue {issue.id} is present in {seen}, as registered",
        Lifecycle.STILL_PRESENT: f"known issue {issue.id} is still present in {seen} (last verified "
        f"{issue.last_verified}): set verified={version!r} in {where}",
        Lifecycle.REGRESSION: f"known issue {issue.id} ({issue.summary}) was fixed in {issue.package} {issue.fixed} "
        f"and occurs again in {torch_version}{context}: a regression (report it upstream; register it again with "
        f"first={version!r} in {where})",
        Lifecycle.OUTSIDE: f"known issue {issue.id} ({issue.summary}) occurs in {seen}, outside the releases and "
        f"devices the registry lists (first {issue.first}, devices {', '.join(issue.devices)}): widen its entry in "
        f"{where}",
        Lifecycle.FIXED_HERE: f"known issue {issue.id} did not occur in {seen}: fixed in {version}? If the fix is "
        f"upstream, set fixed={version!r} in {where}",
        Lifecycle.APPEARS_FIXED: f"known issue {issue.id} appears fixed in {seen}, a release it was verified present "
        f"in (up to {issue.last_verified}): set fixed={version!r} in {where}, or find why the observation no longer "
        "sees it",
        Lifecycle.ABSENT: f"known issue {issue.id} is absent in {seen}, as registered",
    }[state]
    claim = compare_claim(
        f"known_issue.{issue.id}",
        present,
        state.holds,
        f"the issue occurs exactly in the {issue.package} releases its lifecycle lists",
        detail=detail,
        finding=present,
        kind=RowKind.KNOWN_ISSUE,
    )
    return RegistryVerdict(state, claim)


def registry_claim(
    issue: KnownIssue, present: bool, listed: bool, torch_version: str, where: str, context: str = ""
) -> ClaimComparison:
    """:func:`registry_verdict`'s claim."""
    return registry_verdict(issue, present, listed, torch_version, where, context).claim
