"""Negative controls: the block-scaled suite (MX, NVFP4), run on deliberately wrong quantisers and
linears, must fail.

The real suite files are copied into a scratch directory; a conftest swaps in a broken quantiser or
linear (``faults/block_scaled.py``), or patches torchao where the suite uses it directly; each test asserts
exactly which checks catch the fault.
"""

from __future__ import annotations

import pytest
from helpers import assert_caught, assert_clean
from scaled_controls import failed_rows, run_scaled

from harness.domains.block_scaled.blocklinear import PRODUCTS

pytest.importorskip("torchao", reason="the block-scaled suite's controls need torchao (pip install amp-harness[fp8])")

BLOCK_CODES = "block_scaled/test_block_scale_codes.py"


def test_mx_scales_with_a_wrong_element_exponent_fail(pytester, suite_copy):
    run = run_scaled(
        pytester,
        suite_copy,
        BLOCK_CODES,
        args=("-k", "mx_block and e4m3 and (floor or ceil) and not rceil"),
        **{"torchao.prototype.mx_formats.mx_tensor.F8E4M3_MAX_POW2": "faults.block_scaled.one_less"},
    )
    assert_caught(
        run,
        "*::test_mx_block_scales_equal_the_reference[[]e4m3-floor]",
        "*::test_mx_block_scales_equal_the_reference[[]e4m3-ceil]",
    )


def test_a_torchao_that_guards_the_nvfp4_zero_tensor_fails_as_appears_fixed(pytester, suite_copy):
    """The zero-tensor finding, fixed the way TransformerEngine guards it: the registry check says
    "appears fixed", and the block-scaling zero check passes without the finding's excuse."""
    run = run_scaled(
        pytester,
        suite_copy,
        BLOCK_CODES,
        BLOCK,
        args=("-k", "registered or zeros"),
        **{
            "torchao.prototype.mx_formats.nvfp4_tensor.per_tensor_amax_to_scale": "faults.block_scaled.nvfp4_zero_guarded"
        },
    )
    assert_caught(
        run, "*::test_registered_block_scaled_findings_match_what_this_torchao_does[[]torchao-nvfp4-zero-tensor-nan]"
    )
    zero = [r for r in run.rows if r["metric"] == "nvfp4.zero_tensor_nonzero_values"]
    assert [r["outcome"] for r in zero] == ["pass"], zero


# -- block-scaled recipes (MX, NVFP4) ---------------------------------------------------------------------
BLOCK = "block_scaled/test_block_scaling.py"
BLOCK_TRAINING = "block_scaled/test_block_training.py"
BLOCK_EXACT = "test_block_scaled_bits_equal_the_exact_reference"


def test_torchaos_nvfp4_zero_tensor_is_a_known_finding_and_its_mx_zeros_pass(pytester, suite_copy):
    """(torchao's quantisers passing the bit checks is what every ``pytest suites/`` shows.)"""
    run = run_scaled(pytester, suite_copy, BLOCK, args=("-k", "zeros"))
    assert_clean(run, at_least=6)
    zero = {r["metric"]: r["outcome"] for r in run.rows if r["metric"].endswith("zero_tensor_nonzero_values")}
    assert (
        zero["nvfp4.zero_tensor_nonzero_values"] == "known" and zero["mxfp8-rceil.zero_tensor_nonzero_values"] == "pass"
    )


def test_a_block_scale_one_binade_high_fails_the_block_checks(pytester, suite_copy):
    run = run_scaled(
        pytester,
        suite_copy,
        BLOCK,
        block="faults.block_scaled.BlockScaleOneBinadeHigh()",
        args=("-k", "exact_reference and (mxfp8-rceil or nvfp4])"),
    )
    assert_caught(run, f"*::{BLOCK_EXACT}[[]mxfp8-rceil]", f"*::{BLOCK_EXACT}[[]nvfp4]")
    run.stdout.fnmatch_lines(
        ["*nvfp4 (block scale one binade high): *block (0, 0) amax *: scale code 0x*, expected 0x*"]
    )


def test_nvfp4_tile_scales_laid_out_transposed_fail_the_tile_check(pytester, suite_copy):
    """The 16x16 weight tiles, judged on the harness's own quantiser with its tile grid transposed
    (torchao's tiles are a CUDA kernel): only the tile check fails, on a 2x2 grid of tiles."""
    run = run_scaled(
        pytester,
        suite_copy,
        BLOCK,
        block="faults.block_scaled.TransposedTiles()",
        args=("-k", "exact_reference and nvfp4"),
    )
    assert_caught(run, f"*::{BLOCK_EXACT}[[]nvfp4-2d]")
    run.stdout.fnmatch_lines(["*nvfp4-2d (2-D tile scales transposed): *block (0, 1) amax *"])


def test_a_users_quantiser_with_torchaos_tiny_value_findings_fails(pytester, suite_copy):
    """The registered findings excuse torchao's listed releases only: the same bits from code of
    one's own fail the MX and the NVFP4 check, each naming its finding."""
    run = run_scaled(
        pytester,
        suite_copy,
        BLOCK,
        block="faults.block_scaled.UsersAdapterOverTorchao()",
        args=("-k", "exact_reference"),
    )
    assert_caught(run, f"*::{BLOCK_EXACT}[[]mxfp8-rceil]", f"*::{BLOCK_EXACT}[[]nvfp4]")
    run.stdout.fnmatch_lines(["*mxfp8-rceil (a user's adapter over torchao): * at e8m0 scale code 0 (2^-127) divide *"])
    run.stdout.fnmatch_lines(["*nvfp4 (a user's adapter over torchao): * per-tensor scale / block scale overflows *"])


LINEAR = "block_scaled/test_block_linear.py"
LINEAR_TEST = "test_block_scaled_linear_output_and_gradients_are_within_budget"


def test_a_linear_over_a_quantiser_with_scales_one_binade_high_fails_every_product(pytester, suite_copy):
    """Every value decodes at twice its size, so every product of every recipe is 4x off: each
    product's elementwise bound and SQNR floor fail, in MX and NVFP4 alike."""
    run = run_scaled(pytester, suite_copy, LINEAR, linear="faults.block_scaled.LinearOverBinadeHighScales()")
    specs = ("mxfp8-rceil", "mxfp8-floor", "mxfp4-rceil", "mxfp4-floor", "nvfp4", "nvfp4-single-level")
    assert_caught(run, *(f"*::{LINEAR_TEST}[[]{s}]" for s in specs))
    assert failed_rows(run) == {
        f"{s}.{p}.{k}" for s in specs for p in PRODUCTS for k in ("mismatched", "sqnr_shortfall_db")
    }


@pytest.mark.amp_thorough  # an inner run trains an fp32 band and two recipes (~20 s); by default the same
# fault fails every product's budgets (test_a_linear_over_a_quantiser_with_scales_one_binade_high_...)
def test_block_scaled_training_over_scales_one_binade_high_fails_the_band(pytester, suite_copy):
    """Every linear's products 4x too large: the MLP's loss leaves the fp32 band in both default
    recipes; the controls of the products above show which budgets a subtler fault breaks."""
    run = run_scaled(
        pytester,
        suite_copy,
        BLOCK_TRAINING,
        linear="faults.block_scaled.LinearOverBinadeHighScales()",
        args=("-k", "band"),
    )
    test = "test_block_scaled_mlp_training_stays_within_its_band"
    assert_caught(run, f"*::{test}[[]*mxfp8-rceil]", f"*::{test}[[]*nvfp4]")
    assert failed_rows(run) == {"mlp.mxfp8-rceil.worst_diff_over_allowance", "mlp.nvfp4.worst_diff_over_allowance"}


ACCURATE = "test_block_scaled_steps_are_as_accurate_as_correctly_rounded_ones"
CONFORMS = "test_block_scaled_steps_are_the_specifications_up_to_float32"


@pytest.mark.amp_thorough  # an inner run of its own (~10 s); by default tests/test_block_steps.py fails both
# rules with the same fault directly, and the e5m2 control below runs the suite's step checks
def test_training_steps_over_scales_one_binade_high_fail_both_step_claims(pytester, suite_copy):
    """Every operand decodes at twice its size: each step is hundreds of times less accurate than
    the correctly rounded one, and millions of float32 evaluations away from it, in both recipes."""
    run = run_scaled(
        pytester,
        suite_copy,
        BLOCK_TRAINING,
        linear="faults.block_scaled.LinearOverBinadeHighScales()",
        args=("-k", "steps"),
    )
    assert_caught(run, *(f"*::{t}[[]*mlp-{s}]" for t in (ACCURATE, CONFORMS) for s in ("mxfp8-rceil", "nvfp4")))
    assert failed_rows(run) == {
        f"mlp.{s}.{m}"
        for s in ("mxfp8-rceil", "nvfp4")
        for m in ("amp_lane_error_ratio", "step_distance_over_float32s")
    }


def test_mx_training_with_e5m2_gradients_fails_only_the_conformance_of_its_steps(pytester, suite_copy):
    """A format slip in the backward alone (e5m2 output gradients where MXFP8 says e4m3): the step
    is barely less accurate (the lane's accuracy rule passes it, ~1.15x of 2), but it is not the
    recipe's step (~10^4 float32 evaluations away); NVFP4, which the slip does not touch, passes."""
    run = run_scaled(
        pytester, suite_copy, BLOCK_TRAINING, linear="faults.block_scaled.E5m2GradientsLinear()", args=("-k", "steps")
    )
    assert_caught(run, f"*::{CONFORMS}[[]*mlp-mxfp8-rceil]")
    assert failed_rows(run) == {"mlp.mxfp8-rceil.step_distance_over_float32s"}
    run.stdout.fnmatch_lines(["*mlp / mxfp8-rceil (MX linear with e5m2 gradients): its training steps lie a median *"])


def test_an_mx_linear_with_fp4_gradients_fails_only_its_gradients(pytester, suite_copy):
    """Output gradients cast to e2m1 in an MXFP8 recipe: both gradient products fall ~5 dB below
    their SQNR floor; the elementwise worst case (every product's largest error added up) still
    holds them, and the output, which never sees a gradient, passes both."""
    run = run_scaled(
        pytester, suite_copy, LINEAR, linear="faults.block_scaled.Fp4GradientsLinear()", args=("-k", "mxfp8")
    )
    assert_caught(run, f"*::{LINEAR_TEST}[[]mxfp8-rceil]", f"*::{LINEAR_TEST}[[]mxfp8-floor]")
    grads = ("grad_input", "grad_weight")
    assert failed_rows(run) == {f"{s}.{p}.sqnr_shortfall_db" for s in ("mxfp8-rceil", "mxfp8-floor") for p in grads}
    run.stdout.fnmatch_lines(["*mxfp8-rceil.grad_input.sqnr_shortfall_db*"])
