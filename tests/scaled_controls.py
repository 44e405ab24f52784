"""What the negative controls of the scaled-format families (fp8, block-scaled) share: the suite
files copied with a conftest whose fixtures hold the code under test, correct but for the fault each
control names, and torchao patched where the suite uses it directly."""

from __future__ import annotations

from helpers import inject, run_inner

FIXTURES = {
    "fp8_decode_under_test": "faults.fp8.torch_decode",
    "e8m0_cast_under_test": "faults.fp8.torch_e8m0_cast",
    # a cache per inner test (the suite's is per session): no run outlives the faults it was made under
    "train_cached": "harness.domains.engines.training.RunCache()",
    "block_lane_references": "dict()",
}


def run_scaled(
    pytester,
    suite_copy,
    *files: str,
    scaling: str = "faults.fp8.TorchaoScaling()",
    block: str = "faults.block_scaled.TorchaoBlockScaling()",
    linear: str = "faults.block_scaled.TorchaoBlockLinear()",
    fsdp_shard: str = '"torch.distributed.fsdp:fully_shard"',
    args=(),
    **patches: str,
):
    families = {f.split("/")[0] for f in files}
    assert len(families) == 1, f"one family's suite files at a time: {files}"
    suite_copy(*files, conftest=False)
    fixtures = {
        **FIXTURES,
        "fp8_scaling_under_test": scaling,
        "block_scaling_under_test": block,
        "block_linear_under_test": linear,
        "float8_fsdp_shard": fsdp_shard,
    }
    # the modules to import for each patched attribute (a class's module where its owner is a class)
    owners = tuple(
        sorted({".".join(p for p in t.rpartition(".")[0].split(".") if not p[:1].isupper()) for t in patches})
    )
    inject(
        pytester,
        families.pop(),
        fixtures=fixtures,
        patches=patches or None,
        imports=("harness.domains.engines.training", *owners),
    )
    return run_inner(pytester, *args)


def failed_rows(run) -> set[str]:
    """The metrics of the rows an inner run recorded as failed."""
    return {r["metric"] for r in run.rows if r["outcome"] == "fail"}
