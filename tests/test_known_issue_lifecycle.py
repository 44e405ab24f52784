"""A known issue is an upstream lifecycle (first release, fix, last verified): every way an
observation can meet it, judged by the one rule (``registry_claim``) every registry check uses."""

from __future__ import annotations

import pytest

from harness.domains.versions import KnownIssue, registry_claim
from harness.numerics.verdict import Outcome

OPEN = KnownIssue("open-one", "an open issue", first="2.13", verified="2.14", reference="upstream#1")
FIXED = KnownIssue("fixed-one", "a fixed issue", first="2.13", verified="2.13", fixed="2.14", reference="upstream#2")


def _claim(issue: KnownIssue, present: bool, version: str):
    return registry_claim(issue, present, issue.listed(version, "cpu"), version, "REGISTRY")


@pytest.mark.parametrize(
    ("issue", "present", "version", "outcome", "words"),
    [
        (OPEN, True, "2.14.1+cpu", Outcome.KNOWN, "as registered"),
        (OPEN, True, "2.15.0+cu132", Outcome.KNOWN, "still present in torch 2.15.0+cu132"),
        (OPEN, True, "2.16.0.dev20261201+cpu", Outcome.KNOWN, "set verified='2.16'"),
        (OPEN, False, "2.15.0rc3", Outcome.PASS, "fixed in 2.15? If the fix is upstream, set fixed='2.15'"),
        (OPEN, False, "2.14.1", Outcome.FAIL, "appears fixed in torch 2.14.1"),
        (OPEN, True, "2.12.0", Outcome.FAIL, "outside the releases and devices the registry lists"),
        (OPEN, False, "2.12.0", Outcome.PASS, "absent"),
        (FIXED, True, "2.13.0", Outcome.KNOWN, "as registered"),
        (FIXED, False, "2.14.0", Outcome.PASS, "absent"),
        (FIXED, True, "2.15.0a0+git1234abc", Outcome.FAIL, "a regression"),
    ],
)
def test_each_observation_meets_the_lifecycle_by_one_rule(issue, present, version, outcome, words):
    claim = _claim(issue, present, version)
    assert claim.outcome is outcome, claim.explain()
    assert words in claim.detail[0]


def test_an_open_issue_is_listed_for_every_later_release_and_a_fixed_one_stops_at_its_fix():
    assert [OPEN.listed(v, "cpu") for v in ("2.12", "2.13", "2.14", "2.15", "3.0")] == [False, True, True, True, True]
    assert [FIXED.listed(v, "cpu") for v in ("2.13", "2.14", "2.15")] == [True, False, False]
    assert not OPEN.listed("2.14", "xpu")
    assert OPEN.span == "2.13 on, open (last verified 2.14)"
    assert FIXED.span == "2.13 to before 2.14, fixed in 2.14"


#: a fix shipped in a patch release: 2.4.0 has it, 2.4.1 and every later release do not
PATCHED = KnownIssue("patched", "fixed in a patch", first="2.4", verified="2.4", fixed="2.4.1", reference="up#3")


def test_a_fix_shipped_in_a_patch_release_ends_the_range_at_that_patch():
    assert [PATCHED.listed(v, "cpu") for v in ("2.3.1", "2.4.0", "2.4.0+cu121", "2.4.1", "2.5.0")] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert _claim(PATCHED, True, "2.4.0+cu121").outcome is Outcome.KNOWN
    assert _claim(PATCHED, False, "2.4.1").outcome is Outcome.PASS
    regression = _claim(PATCHED, True, "2.4.1")
    assert regression.outcome is Outcome.FAIL and "a regression" in regression.detail[0]
    assert PATCHED.span == "2.4 to before 2.4.1, fixed in 2.4.1"


def test_a_lifecycle_that_cannot_be_is_refused():
    with pytest.raises(ValueError, match="not after its first release"):
        KnownIssue("x", "y", first="2.14", fixed="2.14", reference="r")
    with pytest.raises(ValueError, match="is not a release"):
        KnownIssue("x", "y", first="v2.14", reference="r")


#: fixed on the CPU in 2.14, seen on CUDA in 2.11 and not yet observed fixed there
PER_DEVICE = KnownIssue(
    "per-device",
    "fixed on one device only",
    first="2.13",
    fixed="2.14",
    reference="upstream#3",
    device_lifecycles=(("cuda", "2.11", None, "2.11"),),
)


@pytest.mark.parametrize(
    ("device", "present", "version", "outcome", "words"),
    [
        ("cuda", True, "2.11.0+cu130", Outcome.KNOWN, "as registered"),
        ("cpu", True, "2.11.0+cu130", Outcome.FAIL, "outside the releases"),
        ("cuda", False, "2.15.0", Outcome.PASS, "fixed in 2.15?"),
        ("cpu", True, "2.15.0", Outcome.FAIL, "a regression"),
        ("cpu", False, "2.15.0", Outcome.PASS, "absent"),
    ],
)
def test_a_device_can_carry_its_own_lifecycle(device, present, version, outcome, words):
    """A GPU run can see an issue in an earlier release than the CPU did, and before it is fixed there."""
    from harness.domains.versions import registry_verdict

    listed = PER_DEVICE.listed(version, device)
    claim = registry_verdict(PER_DEVICE, present, listed, version, "REGISTRY", device_type=device).claim
    assert claim.outcome is outcome, claim.explain()
    assert words in claim.detail[0]


def test_a_device_lifecycle_is_checked_like_the_main_one():
    with pytest.raises(ValueError, match="not a release"):
        KnownIssue("bad", "x", first="2.13", reference="r", device_lifecycles=(("cuda", "v2", None, ""),))


def test_a_lifecycle_registered_for_a_hardware_class_wins_over_its_device_types_on_that_class_only():
    """A kind of CPU on which an issue runs another course (Inductor's elided roundings: present on
    AMD Zen 4 in every release, fixed in 2.14 on the kind it was registered on)."""
    by_kind = KnownIssue(
        "by-kind", "an issue of some CPUs", first="2.13", fixed="2.14", reference="upstream#3",
        device_lifecycles=(("cuda", "2.11", None, "2.11"), ("cpu-amd-zen4", "2.4", None, "2.15")),
    )  # fmt: skip
    zen4, zen4_avx2, zen5 = "cpu-amd-zen4-f25m17-avx512bf16-t2", "cpu-amd-zen4-f25m17-avx2-t2", "cpu-amd-zen5-f26m2-t2"
    assert [by_kind.listed("2.14.1", "cpu", c) for c in (zen4, zen4_avx2, zen5, None)] == [True, True, False, False]
    assert not by_kind.listed("2.4.0", "cpu", "cpu-amd-zen40-x"), "a prefix of the id's words, not of its letters"
    h200 = "cuda-nvidia-h200-sm90"
    assert [by_kind.listed(v, "cuda", h200) for v in ("2.10.0", "2.11.0")] == [False, True], "the device type's"
