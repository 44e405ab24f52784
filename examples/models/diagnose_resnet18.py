"""Re-measure the ResNet-18 finding of docs/writing-checks.md: ``python -m examples.models.diagnose_resnet18``.

Parity of bf16 autocast against fp32 on two data streams (learnable class prototypes, and pure
noise with random labels as in the report that prompted it), the diagnosis of any failure, and the
fp16 + GradScaler run of 4 steps whose steps are all skipped (inconclusive)."""

from __future__ import annotations

import dataclasses

import torch

from examples.models import resnet18 as R
from harness.domains.engines import training as T
from harness.domains.engines.training.diagnosis import diagnose


def noise(step: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 3, 32, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)


def main() -> None:
    for name, batch in (("prototypes", R.batch), ("noise", noise)):
        setup = dataclasses.replace(R.RESNET18_SETUP, name=f"resnet18_{name}", batch=batch)
        report = T.check_parity(setup, [T.BF16])
        (r,) = report.results
        verdict = T.judge(setup.name, r)
        print(f"{setup.name}: bf16 parity {verdict.outcome.value}, worst |diff|/allowance {r.parity.worst:.3g}")
        print(f"  diffs {[f'{d:.3g}' for d in r.parity.diffs]} allowances {[f'{a:.3g}' for a in r.parity.allowances]}")
        print(diagnose(setup, r, report.band).explain())
        norms = tuple(n for n, m in setup.model(0).named_modules() if isinstance(m, torch.nn.BatchNorm2d))
        rerun = T.train(setup, T.BF16, fp32_modules=norms)
        after = T.parity(rerun, r.reference, report.band)
        print(f"  all {len(norms)} BatchNorm layers outside autocast: worst {r.parity.worst:.3g} -> {after.worst:.3g}")
    short = dataclasses.replace(R.RESNET18_SETUP, name="resnet18_fp16_4steps", steps=4, checkpoint_every=2)
    (r,) = T.check_parity(short, [T.FP16_SCALER]).results
    verdict = T.judge(short.name, r)
    print(f"{short.name}: {verdict.outcome.value}: {verdict.detail[0] if verdict.detail else ''}")


if __name__ == "__main__":
    main()
