"""Release versions as the claim families key them: ``release("0.17.1+cpu") == (0, 17, 1)``,
``minor("2.13.0+cpu") == "2.13"`` (known issues and findings are registered per minor release).
One parser for torch, DeepSpeed and megatron-core version strings."""

from __future__ import annotations

from dataclasses import dataclass

from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.verdict import RowKind
from harness.platform.versions import minor, release

__all__ = ["KnownIssue", "minor", "registry_claim", "release"]


@dataclass(frozen=True)
class KnownIssue:
    """A behaviour of some torch releases, registered with the minor releases it was observed in.
    A suite observes it on every run and :func:`registry_claim` fails when observation and
    registry disagree: a release that fixes it ("appears fixed") or one it newly affects."""

    id: str
    summary: str
    #: torch minor versions (e.g. "2.13") where the behaviour was observed
    affected: tuple[str, ...]
    reference: str
    #: the device types it concerns
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: the package whose minor releases ``affected`` names
    package: str = "torch"

    def listed(self, torch_version: str, device_type: str) -> bool:
        """Whether the registry says this issue is present for that release and device."""
        return minor(torch_version) in self.affected and device_type in self.devices


def registry_claim(
    issue: KnownIssue, present: bool, listed: bool, torch_version: str, where: str, context: str = ""
) -> ClaimComparison:
    """KNOWN while the issue occurs exactly where the registry says; a failure naming the edit to
    make when it does not (``where``: the registry's place in the source, for the message)."""
    release = minor(torch_version)
    if present and not listed:
        detail = (
            f"known issue {issue.id} ({issue.summary}) occurs in {issue.package} {torch_version}{context}, which the registry "
            f"does not list: add {release!r} to its affected releases (or this case to its scope) in {where}"
        )
    else:
        detail = (
            f"known issue {issue.id} appears fixed in {issue.package} {torch_version}{context}: remove {release!r} from its "
            f"affected releases in {where}"
        )
    return compare_claim(
        f"known_issue.{issue.id}",
        present,
        present == listed,
        f"the issue occurs exactly in the {issue.package} releases the registry lists",
        detail=detail,
        finding=present,
        kind=RowKind.KNOWN_ISSUE,
    )
