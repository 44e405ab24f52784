"""The distributed family's reproductions: the suite's rank programs, forked over gloo on the CPU,
against a reduction of the ranks' own gradients within its derived budget."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.domains.repro import FailureRepro
from harness.numerics.formats import format_of

# -- distributed: ranks forked from the script (gloo on the CPU) --------------------------------
_DIST_PRELUDE = """import importlib
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = {world}  # ranks, forked from this process (they see its torch as it is): gloo on the CPU
{specs}


def resolve(spec):  # "module:function" -> the function
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def model():  # the distributed suite's model (seed 0)
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def batch(rank, n=8):  # each rank's inputs, drawn as the suite draws them
    g = torch.Generator().manual_seed(rank)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def grads(m):
    return [p.grad.detach().float().flatten() for p in m.parameters()]


def cpu_mesh():  # FSDP2's default mesh is on CUDA whenever CUDA is available; these ranks are gloo's
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


{program}


def _rank(rank, workdir):
    dist.init_process_group("gloo", init_method=f"file://{{workdir}}/store", rank=rank, world_size=WORLD)
    try:
        torch.save(rank_program(rank), f"{{workdir}}/rank{{rank}}.pt")
    finally:
        dist.destroy_process_group()


with tempfile.TemporaryDirectory() as workdir:
    mp.start_processes(_rank, args=(workdir,), nprocs=WORLD, start_method="fork")
    ranks = [torch.load(f"{{workdir}}/rank{{r}}.pt", weights_only=True) for r in range(WORLD)]
U32 = 2.0**-24  # float32's unit roundoff


def gamma(k, u):  # the bound on k roundings of unit roundoff u: k u / (1 - k u)
    return k * u / (1 - k * u)


def reduce_in(g, u, eta):  # a reduce of WORLD gradients |g| (ranks x n) in a format of unit roundoff u
    per_rank = ((2 * u + u * u) * g / WORLD + 2 * eta).sum(0)  # its rounding and /WORLD on each rank
    return per_rank + gamma(WORLD - 1, u) * (1 + 2 * u) * (g / WORLD).sum(0)  # the sum of WORLD terms


def worst(pairs):  # the worst element over (got, expected, bound) pairs, in units of its bound
    ratios = [float(((got.double() - ref).abs() / bound).max()) for got, ref, bound in pairs]
    return math.nan if any(r != r for r in ratios) else max(ratios)
"""


_DDP_PROGRAM = """def rank_program(rank):  # one backward of DDP per communication path, and this rank's own gradients
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = batch(rank)
    local = model()
    F.mse_loss(local(x), y).backward()
    out = {"local": grads(local)}
    for name, hook in (("plain", PLAIN_HOOK), ("hooked", HOOK)):
        ddp = DDP(model())
        if hook is not None:
            ddp.register_comm_hook(None, resolve(hook))
        F.mse_loss(ddp(x), y).backward()
        out[name] = grads(ddp.module)
    return out"""


_FSDP2_PROGRAM = """def rank_program(rank):  # FSDP2 (bf16 parameters, the reduce dtype) and the same bf16 computation unsharded
    import dataclasses

    from torch.distributed.fsdp import MixedPrecisionPolicy

    x, y = batch(rank)
    local = model().to(torch.bfloat16)
    F.mse_loss(local(x.to(torch.bfloat16)).float(), y).backward()
    inner = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPE, cast_forward_inputs=True)
    sharded = model()
    for layer in list(sharded.modules()):
        if isinstance(layer, torch.nn.Linear):
            resolve(SHARD)(layer, mesh=cpu_mesh(), mp_policy=inner)
    resolve(SHARD)(sharded, mesh=cpu_mesh(), mp_policy=dataclasses.replace(inner, output_dtype=torch.float32))
    F.mse_loss(sharded(x), y).backward()
    return {"local": grads(local), "averaged": [p.grad.full_tensor().float().flatten() for p in sharded.parameters()]}"""


_SCALER_PROGRAM = """def rank_program(rank):  # FSDP2 + fp16 autocast; for each rank in turn, an inf in that rank's shard only
    from torch.distributed.fsdp import fully_shard

    out = []
    for inf_rank in range(WORLD):
        sharded = model()
        fully_shard(sharded, mesh=cpu_mesh())
        opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
        scaler = resolve(SCALER)("cpu")
        x, y = batch(rank)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(sharded(x).float(), y)
        scaler.scale(loss).backward()
        if rank == inf_rank:
            next(sharded.parameters()).grad._local_tensor.view(-1)[0] = math.inf
        before = [p._local_tensor.detach().clone() for p in sharded.parameters()]
        scaler.step(opt)
        scaler.update()
        stepped = any(not torch.equal(b, p._local_tensor) for b, p in zip(before, sharded.parameters()))
        out.append([stepped, float(scaler.get_scale())])
    return out"""


_AMP_TRAINING_PROGRAM = """STEPS, B = 6, 16  # steps, samples of the global batch (each rank takes its share)


def global_batch(step):  # the global batch of a step, drawn as the suite draws it
    g = torch.Generator().manual_seed(1000 * step)
    return torch.randn(B, 16, generator=g), torch.randn(B, 4, generator=g)


def amp_loop(m, take, reduce_loss):  # SGD under fp16 autocast and GradScaler: losses, first step's gradients
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    losses, first = [], None
    for s in range(STEPS):
        x, y = take(s)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(m(x).float(), y)
        scaler.scale(loss).backward()
        scale = float(scaler.get_scale())
        grads = [p.grad.detach().double().flatten() / scale for p in m.parameters()]
        if first is None and all(bool(g.isfinite().all()) for g in grads):
            first = torch.cat(grads)
        scaler.step(opt)
        scaler.update()
        losses.append(reduce_loss(loss.detach().item()))
    return {"losses": torch.tensor(losses, dtype=torch.float64), "first": first}


def rank_program(rank):  # DDP over the ranks' shares of every global batch
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model())
    if HOOK is not None:
        ddp.register_comm_hook(None, resolve(HOOK))

    def mean_all(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / WORLD

    return amp_loop(ddp, lambda s: tuple(t.chunk(WORLD)[rank] for t in global_batch(s)), mean_all)"""


_F8_GATHER_PROGRAM = """BATCH, WIDTH, HIDDEN = 32, 32, 64  # global batch, features: every weight shard is whole rows


def train(rank, all_gather):  # the float8 MLP (torchao, tensorwise) sharded by SHARD, as the suite trains it
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's CUDA-only extensions do not load on a CPU host
        from torchao import float8
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, WIDTH),
    )
    config = float8.Float8LinearConfig(emulate=EMULATE, enable_fsdp_float8_all_gather=all_gather)
    float8.convert_to_float8_training(m, config=config)
    for layer in m:
        if type(layer).__name__ == "Float8Linear":
            resolve(SHARD)(layer, mesh=cpu_mesh())
    resolve(SHARD)(m, mesh=cpu_mesh())
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
        loss = F.mse_loss(m(x.chunk(WORLD)[rank]), y.chunk(WORLD)[rank])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / WORLD)
    local = [p.to_local().detach() for p in m.parameters()]
    shards = [getattr(t, "_tensor", t).float().flatten() for t in local]  # all-gather wraps a shard
    return {"losses": torch.tensor(losses, dtype=torch.float64), "shards": shards}


def rank_program(rank):  # without, then with float8 all-gather
    return {"plain": train(rank, False), "all_gather": train(rank, True)}"""


def distributed(
    what: str,
    check: str,
    world: int,
    specs: Mapping[str, str | None],
    fmt_name: str | None = None,
    settings: Mapping[str, object] | None = None,
) -> FailureRepro | None:
    """A distributed check as a script whose ``world`` ranks are forked from it (gloo, CPU): the
    rank program and the suite's model and inputs written out, the implementations under test by
    ``module:function`` name (``specs``: torch's own, or a module of yours the script then needs),
    the budget derived inline as the check derives it. ``check``: ``ddp_compression`` (the hooked
    path against DDP's plain all-reduce), ``ddp_allreduce`` (DDP's plain path against the exact mean
    of the ranks' own gradients), ``fsdp2_reduce`` (FSDP2's reduced gradient against that mean),
    ``sharded_scaler`` (an inf on any one rank: every rank skips, one scale), ``float8_all_gather``
    (torchao's float8 MLP under FSDP2 without and with float8 all-gather: bit for bit; ``settings``:
    ``STEPS`` and ``EMULATE``)."""
    fmt = format_of(getattr(torch, fmt_name)) if fmt_name else None
    lines = []
    for name, spec in specs.items():
        lines.append(f"{name} = {spec!r}")
    lines += [f"{name} = {value!r}" for name, value in (settings or {}).items()]
    if check in ("ddp_compression", "ddp_allreduce"):
        program = _DDP_PROGRAM
        if check == "ddp_compression":
            assert fmt is not None
            reference = f"""# reference: DDP's plain fp32 all-reduce; budget: {fmt.name} rounding and /WORLD per rank, gamma_(WORLD-1)
# sum in {fmt.name}, plus gamma_WORLD(2^-24) of the fp32 reference (as the check derives it)
U, ETA = {fmt.unit_roundoff!r}, {fmt.smallest_subnormal / 2!r}  # {fmt.name}: unit roundoff, half its smallest subnormal
pairs = []
for i in range(len(ranks[0]["local"])):
    g = torch.stack([r["local"][i] for r in ranks]).double().abs()
    bound = reduce_in(g, U, ETA) + gamma(WORLD, U32) * (g / WORLD).sum(0)
    pairs += [(r["hooked"][i], r["plain"][i].double(), bound) for r in ranks]"""
        else:
            reference = """# reference: the exact mean of the ranks' own gradients (float64); budget gamma_WORLD(2^-24) mean|g|
# plus float32's smallest subnormal, as the check derives it
pairs = []
for i in range(len(ranks[0]["local"])):
    g = torch.stack([r["local"][i] for r in ranks]).double()
    bound = gamma(WORLD, U32) * g.abs().mean(0) + 2.0**-149
    pairs += [(r["plain"][i], g.mean(0), bound) for r in ranks]"""
        reference += """
measured = worst(pairs)  # the worst element, in units of its bound
allowed = 1.0"""
    elif check == "fsdp2_reduce":
        assert fmt is not None
        program = _FSDP2_PROGRAM
        lines.append(f"REDUCE_DTYPE = torch.{fmt_name}  # the declared reduce dtype")
        own = (
            "gamma(WORLD, U32) * g.abs().mean(0) + 2.0**-149  # fp32: gamma_WORLD(2^-24) mean|g|"
            if fmt_name == "float32"
            else f"reduce_in(g.abs(), {fmt.unit_roundoff!r}, {fmt.smallest_subnormal / 2!r})  # {fmt.name}"
        )
        reference = f"""# reference: the exact mean of the ranks' own bf16 gradients (float64); budget: the declared
# reduce dtype's, as the check derives it
pairs = []
for i in range(len(ranks[0]["local"])):
    g = torch.stack([r["local"][i] for r in ranks]).double()
    bound = {own}
    pairs.append((ranks[0]["averaged"][i], g.mean(0), bound))
measured = worst(pairs)  # the worst element, in units of its bound
allowed = 1.0"""
    elif check == "ddp_amp_training":
        program = _AMP_TRAINING_PROGRAM
        reference = """single = amp_loop(model(), global_batch, lambda v: v)  # the same training in one process
# reference: one process. The first step's gradients (same weights) within the reordered batch's
# roundings: each sample's contribution through at most 4 fp16 roundings per module (5 modules) and
# one in the batch sum, gamma_(B + 20)(2^-11) x sum_i |g_i| (per-sample gradients in float64); the
# losses within gamma_(B x (s+1))(2^-11) |L_s| (the same reordering, compounded over the steps)
U16 = 2.0**-11
m64 = model().double()
x0, y0 = global_batch(0)
magnitudes = 0
for i in range(B):
    m64.zero_grad()
    (F.mse_loss(m64(x0[i : i + 1].double()), y0[i : i + 1].double()) / B).backward()
    magnitudes = magnitudes + torch.cat([p.grad.flatten().abs() for p in m64.parameters()])
pairs = []
for r in ranks:
    pairs.append((r["first"], single["first"], gamma(B + 4 * 5, U16) * magnitudes))
    steps = torch.arange(1, STEPS + 1, dtype=torch.float64)
    bound = torch.tensor([gamma(int(B * s), U16) for s in steps.tolist()], dtype=torch.float64) * single["losses"].abs()
    pairs.append((r["losses"], single["losses"], bound))
measured = worst(pairs)  # the worst element, in units of its bound
allowed = 1.0"""
    elif check == "sharded_scaler":
        program = _SCALER_PROGRAM
        reference = """# reference: an inf on any one rank makes every rank skip the step with the same scale
wrong = 0
for case in range(WORLD):
    stepped = [r[case][0] for r in ranks]
    scales = [r[case][1] for r in ranks]
    if any(stepped) or len(set(scales)) != 1:
        print(f"inf only on rank {case}: ranks {[r for r, s in enumerate(stepped) if s]} stepped; scales {scales}")
        wrong += 1
measured = wrong  # cases where a rank stepped or the scales differ
allowed = 0"""
    elif check == "float8_all_gather":
        program = _F8_GATHER_PROGRAM
        reference = """# reference: the same training without float8 all-gather, bit for bit (torchao promises it)
wrong = 0
for r, out in enumerate(ranks):
    plain, gathered = out["plain"], out["all_gather"]
    if not torch.equal(plain["losses"], gathered["losses"]):
        print(f"rank {r}: losses without {plain['losses'].tolist()}, with {gathered['losses'].tolist()}")
        wrong += 1
    for i, (a, b) in enumerate(zip(plain["shards"], gathered["shards"])):
        if not torch.equal(a, b):
            print(f"rank {r}, parameter {i}: final shards differ by up to {float((a - b).abs().max())!r}")
            wrong += 1
measured = wrong  # losses and final weight shards unlike the run without it
allowed = 0"""
    else:
        return None
    prelude = _DIST_PRELUDE.format(world=world, specs="\n".join(lines), program=program)
    needs = sorted(
        {"torch", *(s.partition(":")[0].split(".")[0] for s in specs.values() if s)}
        | ({"torchao"} if check == "float8_all_gather" else set())
    )
    return FailureRepro("distributed", what, prelude + "\n" + reference, _DIST_ALLOWANCE[check], needs=tuple(needs))


_DIST_ALLOWANCE = {
    "ddp_compression": "the compression format's rounding and /W per rank, gamma_(W-1) of its sum, gamma_W(2^-24) of "
    "the fp32 reference",
    "ddp_allreduce": "gamma_W(2^-24) mean|g|: an fp32 reduce of W gradients",
    "fsdp2_reduce": "the declared reduce dtype's: its rounding and /W per rank and gamma_(W-1) of its sum (fp32: "
    "gamma_W(2^-24) mean|g|)",
    "sharded_scaler": "exact: a skipped step on every rank, one scale",
    "float8_all_gather": "exact: torchao promises identical numerics with float8 all-gather",
    "ddp_amp_training": "the batch reduced in another order: gamma_(B + 4 x modules)(2^-11) sum_i |g_i| of the first "
    "step's gradients, gamma_(B x steps)(2^-11) |L| of the losses",
}
