# Reproduces cpu-autocast-encoder-fast-path-mixed-dtypes (torch 2.4 to before 2.6, fixed in 2.6; cpu).
# nn.TransformerEncoderLayer's inference fast path (eval, no autograd) under CPU autocast raises
# 'mat1 and mat2 must have the same dtype': autocast casts the fused attention to low precision
# but not _addmm_activation, so the fused feed-forward meets a low-precision activation and fp32
# weights
# Where: pytorch/pytorch#132613, fixed by #135936 (_addmm_activation in AutocastCPU's
# lower-precision list). Registered in amp-harness harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python cpu_autocast_encoder_fast_path_mixed_dtypes.py
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

# nn.TransformerEncoderLayer's inference (eval mode, no autograd: the fused fast path
# aten::_transformer_encoder_layer_fwd) under CPU autocast. Autocast casts the fused attention
# (_native_multi_head_attention) to low precision; when it does not cast _addmm_activation, the
# feed-forward inside the fused op meets a low-precision activation and fp32 weights and raises
# "mat1 and mat2 must have the same dtype". Reference: inference runs, as it does without autocast.
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
x = torch.randn(4, 16, 32)
outcome = {}
for dtype in (torch.bfloat16, torch.float16):
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype):
            out = layer(x)
        outcome[str(dtype)] = f"ran, output {out.dtype}"
    except RuntimeError as exc:
        outcome[str(dtype)] = "raised: " + (str(exc).strip().splitlines() or [""])[0]
print(f"TransformerEncoderLayer inference under CPU autocast: {outcome}")
sys.exit(1 if any(v.startswith("raised") for v in outcome.values()) else 0)
