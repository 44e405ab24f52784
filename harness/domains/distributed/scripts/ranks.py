"""A distributed check, standalone: its ranks forked from this process over gloo on the CPU, each
running the suite's rank program on the suite's model and inputs, with the implementations under
test named ``module:function``; then the check's judgement, with the budget derived as the check
derives it: DDP's compressed or plain all-reduce, FSDP2's reduce in its declared dtype, one field of
FSDP2's mixed-precision policy against what its modules and collectives carried, DDP under AMP
against one process and a sharded GradScaler's skip on every rank.

amp-harness keeps the program and the judgement a failed check needs and writes its values over
the defaults below (``harness.domains.distributed.repro``). As it lies here two ranks run DDP's
plain all-reduce against the exact mean of their gradients.
"""

import importlib
import math
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

# -- prelude --
WORLD = 2  # ranks, forked from this process (they see its torch as it is): gloo on the CPU


def resolve(spec: str) -> Callable[..., Any]:  # "module:function" -> the function
    module, _, name = spec.partition(":")
    found: Callable[..., Any] | None = getattr(importlib.import_module(module), name, None)
    if found is None and module == "torch.distributed.fsdp":  # before torch 2.6 FSDP2 lived here
        found = getattr(importlib.import_module("torch.distributed._composable.fsdp"), name)
    assert found is not None, spec
    return found


def model() -> torch.nn.Module:  # the distributed suite's model (seed 0)
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def batch(rank: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:  # each rank's inputs, as the suite draws them
    g = torch.Generator().manual_seed(rank)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def grads(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().float().flatten() for p in m.parameters() if p.grad is not None]


def cpu_mesh() -> Any:  # FSDP2's default mesh is on CUDA whenever CUDA is available; these ranks are gloo's
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


# -- fsdp2 --
SHARD = "torch.distributed.fsdp:fully_shard"  # the sharding under test
REDUCE_DTYPE = torch.bfloat16  # the declared reduce dtype


def rank_program(rank: int) -> Any:  # FSDP2 (bf16 parameters, the reduce dtype) and the same bf16 computation unsharded
    import dataclasses

    MixedPrecisionPolicy = resolve("torch.distributed.fsdp:MixedPrecisionPolicy")
    x, y = batch(rank)
    local = model().to(torch.bfloat16)
    torch.autograd.backward(F.mse_loss(local(x.to(torch.bfloat16)).float(), y))
    inner = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPE, cast_forward_inputs=True)
    sharded = model()
    for layer in list(sharded.modules()):
        if isinstance(layer, torch.nn.Linear):
            resolve(SHARD)(layer, mesh=cpu_mesh(), mp_policy=inner)
    resolve(SHARD)(sharded, mesh=cpu_mesh(), mp_policy=dataclasses.replace(inner, output_dtype=torch.float32))
    torch.autograd.backward(F.mse_loss(sharded(x), y))
    return {"local": grads(local), "averaged": [p.grad.full_tensor().float().flatten() for p in sharded.parameters()]}  # type: ignore[union-attr]


# -- scaler --
SCALER = "torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler"  # the scaler under test


def rank_program(rank: int) -> Any:  # type: ignore[no-redef]  # noqa: F811
    """FSDP2 + fp16 autocast; for each rank in turn, an inf in that rank's shard only."""
    fully_shard = resolve("torch.distributed.fsdp:fully_shard")
    out = []
    for inf_rank in range(WORLD):
        sharded = model()
        fully_shard(sharded, mesh=cpu_mesh())
        opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
        scaler = resolve(SCALER)("cpu")
        x, y = batch(rank)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(sharded(x).float(), y)
        torch.autograd.backward(scaler.scale(loss))
        first: Any = next(sharded.parameters())
        if rank == inf_rank:
            first.grad._local_tensor.view(-1)[0] = math.inf
        shards: list[Any] = list(sharded.parameters())
        before = [p._local_tensor.detach().clone() for p in shards]
        scaler.step(opt)
        scaler.update()
        stepped = any(not torch.equal(b, p._local_tensor) for b, p in zip(before, shards, strict=True))
        out.append([stepped, float(scaler.get_scale())])
    return out


# -- amp_training --
HOOK: str | None = None  # DDP's communication hook under test (None: none)
STEPS = 6  # steps
B = 16  # samples of the global batch (each rank takes its share)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:  # the global batch of a step, as the suite draws it
    g = torch.Generator().manual_seed(1000 * step)
    return torch.randn(B, 16, generator=g), torch.randn(B, 4, generator=g)


def amp_loop(m: torch.nn.Module, take: Callable[[int], Any], reduce_loss: Callable[[float], float]) -> dict[str, Any]:
    """SGD under fp16 autocast and GradScaler: the losses, the first finite step's gradients."""
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    losses, first = [], None
    for s in range(STEPS):
        x, y = take(s)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(m(x).float(), y)
        torch.autograd.backward(scaler.scale(loss))
        scale = float(scaler.get_scale())
        step_grads = [p.grad.detach().double().flatten() / scale for p in m.parameters() if p.grad is not None]
        if first is None and all(bool(g.isfinite().all()) for g in step_grads):
            first = torch.cat(step_grads)
        scaler.step(opt)
        scaler.update()
        losses.append(reduce_loss(loss.detach().item()))
    return {"losses": torch.tensor(losses, dtype=torch.float64), "first": first}


def rank_program(rank: int) -> Any:  # type: ignore[no-redef]  # noqa: F811
    """DDP over the ranks' shares of every global batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model())
    if HOOK is not None:
        ddp.register_comm_hook(None, resolve(HOOK))

    def mean_all(v: float) -> float:
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / WORLD

    return amp_loop(ddp, lambda s: tuple(t.chunk(WORLD)[rank] for t in global_batch(s)), mean_all)


# -- fsdp2_policy --
SHARD = "torch.distributed.fsdp:fully_shard"  # the sharding under test
REDUCE_DTYPE = torch.bfloat16  # the declared reduce dtype
GATHERS = ("all_gather_single", "all_gather_into_tensor", "all_gather")  # by release: torch 2.13 has *_single
REDUCES = ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter", "all_reduce")
COLLECTIVES = (*GATHERS, *REDUCES)


def dtypes(obj: Any) -> list[str]:  # the dtypes of the floating tensors in obj (a DTensor's local one)
    if isinstance(obj, torch.Tensor):
        t = getattr(obj, "_local_tensor", obj)
        return [str(t.dtype).removeprefix("torch.")] if t.is_floating_point() else []
    if isinstance(obj, (list, tuple)):
        return [d for x in obj for d in dtypes(x)]
    if isinstance(obj, dict):
        return [d for x in obj.values() for d in dtypes(x)]
    return []


def rank_program(rank: int) -> Any:  # type: ignore[no-redef]  # noqa: F811
    """FSDP2 under the policy (bf16 parameters, the reduce dtype, inputs cast; fp32 output on the
    root): what each module computed with and each collective call carried."""
    import dataclasses

    MixedPrecisionPolicy = resolve("torch.distributed.fsdp:MixedPrecisionPolicy")
    x, y = batch(rank)
    inner = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPE, cast_forward_inputs=True)
    sharded = model()
    for layer in list(sharded.modules()):
        if isinstance(layer, torch.nn.Linear):
            resolve(SHARD)(layer, mesh=cpu_mesh(), mp_policy=inner)
    resolve(SHARD)(sharded, mesh=cpu_mesh(), mp_policy=dataclasses.replace(inner, output_dtype=torch.float32))
    seen: dict[str, dict[str, list[str]]] = {"params": {}, "inputs": {}, "outputs": {}, "collectives": {}}
    for name, module in sharded.named_modules():  # hooks after FSDP2's own: what the module computes with
        if name and not list(module.parameters(recurse=False)):
            continue

        def pre(m: torch.nn.Module, args: Any, kwargs: Any, label: str = name or "<root>") -> None:
            seen["inputs"].setdefault(label, []).extend(dtypes((args, kwargs)))
            seen["params"].setdefault(label, []).extend(dtypes(list(m.parameters(recurse=False))))

        def post(m: torch.nn.Module, args: Any, out: Any, label: str = name or "<root>") -> None:
            seen["outputs"].setdefault(label, []).extend(dtypes(out))

        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(post)
    originals = {c: getattr(dist, c) for c in COLLECTIVES if hasattr(dist, c)}

    def recording(c: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen["collectives"].setdefault(c, []).append("+".join(sorted(set(dtypes([*args, *kwargs.values()])))))
            return originals[c](*args, **kwargs)

        return call

    for c in originals:
        setattr(dist, c, recording(c))
    try:
        torch.autograd.backward(F.mse_loss(sharded(x), y))
    finally:
        for c, original in originals.items():
            setattr(dist, c, original)
    return seen


# -- ddp --
PLAIN_HOOK: str | None = None  # DDP's plain path's hook (None: its built-in all-reduce)
HOOK = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks:fp16_compress_hook"  # the hooked path


def rank_program(rank: int) -> Any:  # type: ignore[no-redef]  # noqa: F811
    """One backward of DDP per communication path, and this rank's own gradients."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = batch(rank)
    local = model()
    torch.autograd.backward(F.mse_loss(local(x), y))
    out = {"local": grads(local)}
    for name, hook in (("plain", PLAIN_HOOK), ("hooked", HOOK)):
        ddp = DDP(model())
        if hook is not None:
            ddp.register_comm_hook(None, resolve(hook))
        torch.autograd.backward(F.mse_loss(ddp(x), y))
        out[name] = grads(ddp.module)
    return out


# -- launch --


def _rank(rank: int, workdir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank, world_size=WORLD)
    try:
        torch.save(rank_program(rank), f"{workdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


with tempfile.TemporaryDirectory() as workdir:
    mp.start_processes(_rank, args=(workdir,), nprocs=WORLD, start_method="fork")  # type: ignore[attr-defined,no-untyped-call]
    ranks: list[Any] = [torch.load(f"{workdir}/rank{r}.pt", weights_only=True) for r in range(WORLD)]
U32 = 2.0**-24  # float32's unit roundoff


def gamma(k: int, u: float) -> float:  # the bound on k roundings of unit roundoff u: k u / (1 - k u)
    return k * u / (1 - k * u)


def reduce_in(g: torch.Tensor, u: float, eta: float) -> torch.Tensor:
    """A reduce of WORLD gradients |g| (ranks x n) in a format of unit roundoff u."""
    per_rank = ((2 * u + u * u) * g / WORLD + 2 * eta).sum(0)  # its rounding and /WORLD on each rank
    return per_rank + gamma(WORLD - 1, u) * (1 + 2 * u) * (g / WORLD).sum(0)  # the sum of WORLD terms


def worst(pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> float:
    """The worst element over (got, expected, bound) pairs, in units of its bound."""
    ratios = [float(((got.double() - ref).abs() / bound).max()) for got, ref, bound in pairs]
    return math.nan if any(r != r for r in ratios) else max(ratios)


Verdict = tuple[float, float]  # measured, allowed

# -- fsdp2_reduce --
# reference: the exact mean of the ranks' own bf16 gradients (float64); budget: the declared
# reduce dtype's, as the check derives it (fp32: gamma_WORLD(2^-24) mean|g|)
REDUCE_U = 2.0**-8  # the reduce dtype's unit roundoff
REDUCE_ETA = 2.0**-134 / 2  # half its smallest subnormal
FP32_REDUCE = False  # the reduce dtype is float32


def judge() -> Verdict:
    pairs = []
    for i in range(len(ranks[0]["local"])):
        g = torch.stack([r["local"][i] for r in ranks]).double()
        own = reduce_in(g.abs(), REDUCE_U, REDUCE_ETA)
        bound = gamma(WORLD, U32) * g.abs().mean(0) + 2.0**-149 if FP32_REDUCE else own
        pairs.append((ranks[0]["averaged"][i], g.mean(0), bound))
    return worst(pairs), 1.0  # the worst element, in units of its bound


# -- amp_training_reference --


def judge() -> Verdict:  # type: ignore[no-redef]  # noqa: F811
    """Reference: one process. The first step's gradients (same weights) within the reordered
    batch's roundings: each sample's contribution through at most 4 fp16 roundings per module (5
    modules) and one in the batch sum, gamma_(B + 20)(2^-11) x sum_i |g_i| (per-sample gradients in
    float64); the losses within gamma_(B x (s+1))(2^-11) |L_s| (the same reordering, compounded)."""
    single = amp_loop(model(), global_batch, lambda v: v)  # the same training in one process
    u16 = 2.0**-11
    m64 = model().double()
    x0, y0 = global_batch(0)
    magnitudes: Any = 0
    for i in range(B):
        m64.zero_grad()
        torch.autograd.backward(F.mse_loss(m64(x0[i : i + 1].double()), y0[i : i + 1].double()) / B)
        magnitudes = magnitudes + torch.cat([p.grad.flatten().abs() for p in m64.parameters() if p.grad is not None])
    pairs = []
    for r in ranks:
        pairs.append((r["first"], single["first"], gamma(B + 4 * 5, u16) * magnitudes))
        steps = torch.arange(1, STEPS + 1, dtype=torch.float64)
        bound = torch.tensor([gamma(int(B * s), u16) for s in steps.tolist()], dtype=torch.float64)
        pairs.append((r["losses"], single["losses"], bound * single["losses"].abs()))
    return worst(pairs), 1.0  # the worst element, in units of its bound


# -- sharded_scaler --


def judge() -> Verdict:  # type: ignore[no-redef]  # noqa: F811
    """Reference: an inf on any one rank makes every rank skip the step with the same scale."""
    wrong = 0
    for case in range(WORLD):
        stepped = [r[case][0] for r in ranks]
        scales = [r[case][1] for r in ranks]
        if any(stepped) or len(set(scales)) != 1:
            print(f"inf only on rank {case}: ranks {[r for r, s in enumerate(stepped) if s]} stepped; scales {scales}")
            wrong += 1
    return wrong, 0  # cases where a rank stepped or the scales differ


# -- fsdp2_policy_field --
FIELD = "param_dtype"  # the policy field judged: param_dtype, param_dtype.all_gather, reduce_dtype.reduce_scatter,
# output_dtype or cast_forward_inputs


def judge() -> Verdict:  # type: ignore[no-redef]  # noqa: F811
    """The declared field against what every rank observed: each module or collective call that
    carried another dtype is a mismatch, and so is a field observed nowhere."""
    param, reduce = "bfloat16", str(REDUCE_DTYPE).removeprefix("torch.")
    declared = {
        "param_dtype": param,
        "param_dtype.all_gather": param,
        "reduce_dtype.reduce_scatter": reduce,
        "output_dtype": "float32",
        "cast_forward_inputs": param,
    }[FIELD]
    bad = []
    for rank, seen in enumerate(ranks):
        calls = {c: [f"{c} call {i}: {d}" for i, d in enumerate(v)] for c, v in seen["collectives"].items()}
        sites: dict[str, list[str]] = {
            "param_dtype": [f"{m}: {d}" for m, ds in seen["params"].items() if ds for d in ds],
            "param_dtype.all_gather": [x for c in GATHERS for x in calls.get(c, [])],
            "reduce_dtype.reduce_scatter": [x for c in REDUCES for x in calls.get(c, [])],
            "output_dtype": [f"<root> output: {d}" for d in seen["outputs"].get("<root>", [])],
            "cast_forward_inputs": [f"{m} input: {d}" for m, ds in seen["inputs"].items() for d in ds],
        }
        found = sites[FIELD]
        wrong = [x for x in found if x.rsplit(": ", 1)[1] != declared] or ([] if found else ["nothing observed"])
        bad += [f"rank {rank}: {x}" for x in sorted(set(wrong))]
    for line in bad:
        print(f"{FIELD} declared {declared}; {line}")
    return float(len(bad)), 0.0  # module or collective calls carrying another dtype


# -- ddp_compression --
# reference: DDP's plain fp32 all-reduce; budget: the compression format's rounding and /WORLD per
# rank, gamma_(WORLD-1) sum in it, plus gamma_WORLD(2^-24) of the fp32 reference (as the check derives it)
U = 2.0**-8  # the compression format's unit roundoff
ETA = 2.0**-134 / 2  # half its smallest subnormal


def judge() -> Verdict:  # type: ignore[no-redef]  # noqa: F811
    pairs = []
    for i in range(len(ranks[0]["local"])):
        g = torch.stack([r["local"][i] for r in ranks]).double().abs()
        bound = reduce_in(g, U, ETA) + gamma(WORLD, U32) * (g / WORLD).sum(0)
        pairs += [(r["hooked"][i], r["plain"][i].double(), bound) for r in ranks]
    return worst(pairs), 1.0  # the worst element, in units of its bound


# -- ddp_allreduce --


def judge() -> Verdict:  # type: ignore[no-redef]  # noqa: F811
    """Reference: the exact mean of the ranks' own gradients (float64); budget gamma_WORLD(2^-24)
    mean|g| plus float32's smallest subnormal, as the check derives it."""
    pairs = []
    for i in range(len(ranks[0]["local"])):
        g = torch.stack([r["local"][i] for r in ranks]).double()
        bound = gamma(WORLD, U32) * g.abs().mean(0) + 2.0**-149
        pairs += [(r["plain"][i], g.mean(0), bound) for r in ranks]
    return worst(pairs), 1.0  # the worst element, in units of its bound


# -- verdict --
measured, allowed = judge()
