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
