# torch.addmv and torch.mv with mixed fp32 / low-precision inputs under CPU autocast (torch 2.12 on).
# Neither op is on CPU autocast's lists, so autocast hands it the inputs as they are. torch 2.11.0
# accepts an fp32 bias with a bf16 matrix and vector (bf16 result); torch 2.12.1 and later raise
# "addmv input tensors must have the same dtype". torch.mv, which goes through addmv, raised on
# 2.11.0 already, with another message ("expected scalar type Float but found BFloat16").
# Found by the autocast policy table of amp-harness (suites/autocast/test_op_policy.py,
# baselines/autocast/torch-2.11 against torch-2.12); a behaviour change, not a registered issue.
# Written on: torch 2.12.1+cu130 (PyPI's CUDA build, on the CPU), python 3.11.7,
# cpu-amd-zen3-f25m1-avx2-t2, amp-harness 0.1.0, 2026-12-06.
# Needs only torch. Run: python addmv_mixed_dtypes_under_cpu_autocast.py
# Exit status: 1 where addmv's mixed inputs raise (2.12 on), 0 where they are accepted (2.11); mv is
# printed for information (it raised on both); 2 if it could not run.
import sys

import torch

torch.manual_seed(0)
bias32 = torch.randn(4)
mat16, vec16 = torch.randn(4, 8).bfloat16(), torch.randn(8).bfloat16()
mat32 = torch.randn(4, 8)
addmv_raised = False
for name, call in (
    ("addmv(fp32 bias, bf16 matrix, bf16 vector)", lambda: torch.addmv(bias32, mat16, vec16)),
    ("mv(bf16 matrix, fp32 vector)", lambda: torch.mv(mat16, vec16.float())),
    ("mv(fp32 matrix, bf16 vector)", lambda: torch.mv(mat32, vec16)),
):
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = call()
        print(f"torch {torch.__version__}: {name} -> {out.dtype}")
    except RuntimeError as e:
        addmv_raised = addmv_raised or name.startswith("addmv")
        print(f"torch {torch.__version__}: {name} raises: {str(e).splitlines()[0][:100]}")
sys.exit(1 if addmv_raised else 0)
