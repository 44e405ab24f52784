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
