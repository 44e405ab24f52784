"""An fp8 training recipe's casts, standalone: for each operand of each of a float8 linear's three
matmuls, the cast torchao's ``Float8LinearConfig.from_recipe_name(RECIPE)`` configures (format,
one scale per tensor or along an axis, scales rounded to a power of two, or no cast) against the
recipe's specification, written out below as amp-harness holds it.

amp-harness writes a failed check's recipe and its specification over the defaults below
(``harness.domains.fp8.repro.recipe_casts``). As it lies it holds torchao's tensorwise recipe.
"""

from typing import Any

# -- parameters --
RECIPE = "tensorwise"  # the torchao recipe name
#: (matmul, operand) -> (format, "tensor" or the reduced axis, power of two), or None: no cast
SPEC: dict[tuple[str, str], Any] = {
    ("output", "input"): ("e4m3fn", "tensor", False),
    ("output", "weight"): ("e4m3fn", "tensor", False),
    ("grad_input", "grad_output"): ("e5m2", "tensor", False),
    ("grad_input", "weight"): ("e4m3fn", "tensor", False),
    ("grad_weight", "grad_output"): ("e5m2", "tensor", False),
    ("grad_weight", "input"): ("e4m3fn", "tensor", False),
}

# -- casts --
#: torchao's field for each (matmul, operand), and the axis the operand is reduced along there
FIELDS = {
    ("output", "input"): ("cast_config_input", -1),
    ("output", "weight"): ("cast_config_weight", -1),
    ("grad_input", "grad_output"): ("cast_config_grad_output", -1),
    ("grad_input", "weight"): ("cast_config_weight_for_grad_input", 0),
    ("grad_weight", "grad_output"): ("cast_config_grad_output_for_grad_weight", 0),
    ("grad_weight", "input"): ("cast_config_input_for_grad_weight", 0),
}
from torchao.float8 import Float8LinearConfig  # noqa: E402  (the library under test)

config = Float8LinearConfig.from_recipe_name(RECIPE)
pow2 = bool(getattr(config, "round_scales_to_power_of_2", False))
diffs = []
for key, (field, axis) in FIELDS.items():
    cc = getattr(config, field)
    if str(cc.scaling_type.value) == "disabled":
        have = None
    else:
        short = {"float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2"}.get(str(cc.target_dtype).removeprefix("torch."))
        where = "tensor" if str(cc.scaling_granularity.value) == "tensorwise" else axis
        have = (short, where, pow2)
    if have != SPEC[key]:
        diffs.append(f"{key[0]}/{key[1]}: spec {SPEC[key]}, torchao {have}")
print(f"torchao's {RECIPE} recipe: " + ("; ".join(diffs) or "every operand cast as specified"))
measured = len(diffs)  # operands cast unlike the specification
allowed = 0
