# Reproduces update-before-scale-after-load (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# a GradScaler restored with load_state_dict() creates its scale tensor lazily at the next
# scale(); update(new_scale) before that raises AssertionError ('_scale is None')
# Where: torch/amp/grad_scaler.py: _check_scale_growth_tracker() in update(). Registered in
# amp-harness harness/domains/scaler/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python update_before_scale_after_load.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

import sys

import torch

# A GradScaler restored with load_state_dict() holds the saved scale; update(new_scale) right after
# restoring must set it, as it does on the scaler that was saved.
saved = torch.amp.GradScaler("cpu", init_scale=2.0**10)
restored = torch.amp.GradScaler("cpu")
restored.load_state_dict(saved.state_dict())
expected = 512.0
try:
    restored.update(new_scale=512.0)
    measured = f"scale {restored.get_scale()!r}"
    defect = restored.get_scale() != expected
except Exception as e:
    measured, defect = f"{type(e).__name__}: {e}", True
print(f"update(512.0) after load_state_dict(): {measured}; expected scale {expected!r} (allowance: exact)")
sys.exit(1 if defect else 0)
