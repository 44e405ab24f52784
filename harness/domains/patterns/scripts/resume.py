"""Save and resume mid-run, standalone: model, optimizer, GradScaler and RNG state saved after
RESUME_AT steps and loaded into fresh objects (initialised from another seed, so the weights must
come from the checkpoint) must continue exactly as the uninterrupted run: the same losses, the same
scale before every step, the same final parameters. A scaler whose state is not restored starts
again at its initial scale (the loss spike after a restart).

amp-harness writes a failed check's device and dtype over the defaults below
(``harness.domains.patterns.repro``); the model (with dropout: the RNG state matters) and data are
seeded, as the check builds them. As it lies it resumes an fp16 run with GradScaler on the CPU.
"""

import io
from typing import Any

import torch
from torch import nn

# -- parameters --
DEVICE = torch.device("cpu")
DTYPE = torch.float16  # the autocast dtype (fp16: with a GradScaler)
WIDTH = 32  # the model's width
BATCH = 16  # samples per step
STEPS = 8  # steps of the run
RESUME_AT = 4  # steps before the save
GROWTH_INTERVAL = 2  # short: the scale moves within the run
INIT_SCALE = 2.0**8  # GradScaler's initial scale

# -- resume --


def fresh(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 1)).to(
        DEVICE
    )
    fp16 = torch.float16 == DTYPE
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL, enabled=fp16)
    return {"model": m, "optimizer": torch.optim.AdamW(m.parameters(), lr=1e-2), "scaler": scaler}


def run(resume_at: int | None) -> tuple[list[float], list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    r = fresh(0)
    torch.manual_seed(7)  # the dropout stream
    losses, scales = [], []
    for step in range(STEPS):
        if step == resume_at:
            buf = io.BytesIO()
            torch.save(
                {
                    "model": r["model"].state_dict(),
                    "optimizer": r["optimizer"].state_dict(),
                    "scaler": r["scaler"].state_dict(),
                    "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state(DEVICE) if DEVICE.type == "cuda" else None,
                },
                buf,
            )
            buf.seek(0)
            saved = torch.load(buf, weights_only=False)
            r = fresh(12345)  # other weights: the checkpoint must supply them
            r["model"].load_state_dict(saved["model"])
            r["optimizer"].load_state_dict(saved["optimizer"])
            r["scaler"].load_state_dict(saved["scaler"])
            torch.set_rng_state(saved["rng"])
            if saved["cuda_rng"] is not None:
                torch.cuda.set_rng_state(saved["cuda_rng"], DEVICE)
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(BATCH, WIDTH, generator=g).to(DEVICE), torch.randn(BATCH, 1, generator=g).to(DEVICE)
        r["optimizer"].zero_grad(set_to_none=True)
        scales.append(float(r["scaler"].get_scale()) if r["scaler"].is_enabled() else 1.0)
        with torch.autocast(DEVICE.type, dtype=DTYPE):
            out = r["model"](x)
        loss = nn.functional.mse_loss(out.float(), y)
        torch.autograd.backward(r["scaler"].scale(loss))
        r["scaler"].step(r["optimizer"])
        r["scaler"].update()
        losses.append(float(loss.detach()))
    return losses, scales, [p.detach().clone() for p in r["model"].parameters()]


(la, sa, pa), (lb, sb, pb) = run(None), run(RESUME_AT)  # reference: the uninterrupted run
differences = [f"step {i}: loss {x!r} vs {y!r}" for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y]
differences += [f"step {i}: scale {x!r} vs {y!r}" for i, (x, y) in enumerate(zip(sa, sb, strict=True)) if x != y]
if not all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True)):
    differences.append("final parameters differ")
print("resumed against uninterrupted: " + ("; ".join(differences) or "bitwise the same"))
measured = len(differences)  # steps whose loss or scale differ, and the final parameters
allowed = 0
