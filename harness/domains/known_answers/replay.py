"""A data-parallel job audits its own cards: on audit steps each rank replays a neighbour's
micro-batch and compares the gradients bitwise (the published DDP recipe for silent data
corruption; Megatron-LM's rerun state machine reruns a step for the same reason).

Why no recorded answers are needed: DDP's ranks hold bitwise identical parameters (broadcast at
the start, then every rank applies the same averaged gradient), run the same kernels, and a
micro-batch's gradients are then a function of the parameters and the batch alone. Rank ``r+1``
recomputing rank ``r``'s micro-batch must get rank ``r``'s bits. A rank whose unit is wrong
disagrees with both ring neighbours (its own batch, replayed by ``r+1``; ``r-1``'s batch, which it
replays), which names it on three or more ranks. Each rank also computes its own micro-batch twice:
a rank that disagrees with itself had a transient fault, and every rank doing so means the step is
not reproducible (nondeterministic kernels), so nothing can be judged.

The rule (:func:`judge`) is pure: digests in, a verdict out; :func:`audit` runs it on a process
group and locates each mismatch's first differing element.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from harness.domains.known_answers.answers import Mismatch, digest, mismatch

#: what a user's step gives the audit: the loss to differentiate for ``batch`` (run forward under
#: its own autocast; under fp16 with a GradScaler, ``scaler.scale(loss)``)
LossOf = Callable[[torch.nn.Module, Any], torch.Tensor]


class AuditVerdict(str, enum.Enum):
    """What an audit step says, from the most to the least severe."""

    #: the ranks' parameters differ before the step: DDP's invariant is broken (a corrupted
    #: optimizer step or all-reduce on some rank); the minority ranks are named where there is one
    DIVERGED = "diverged"
    #: every rank disagreed with itself computing its own micro-batch twice: the step is not
    #: bitwise reproducible here (nondeterministic kernels), so the replays judge nothing
    UNREPRODUCIBLE = "unreproducible"
    #: mismatches that name the rank(s) at fault
    SUSPECT = "suspect"
    #: mismatches that do not name one rank (two ranks; one transient mismatch between two)
    UNDECIDED = "undecided"
    #: every replay, and every rank's second computation, gave the same bits
    AGREE = "agree"


@dataclass(frozen=True)
class RankDigests:
    """One rank's audit step, as digests: its parameters, the gradients of its own micro-batch
    (twice, unless the repeat is off) and of its predecessor's, by parameter name."""

    rank: int
    params: str
    own: Mapping[str, str]
    again: Mapping[str, str] | None
    replay: Mapping[str, str]


@dataclass(frozen=True)
class Disagreement:
    """Two computations of one micro-batch whose gradient ``tensor`` differs: the micro-batch's
    owner, the two ranks that computed it (the same rank twice for a self-mismatch), and where the
    bits first differ (filled in by :func:`audit`)."""

    batch_of: int
    ranks: tuple[int, int]
    tensor: str
    where: Mismatch | None = None

    def describe(self) -> str:
        a, b = self.ranks
        who = f"rank {a} twice" if a == b else f"rank {a} (its own) and rank {b} (its replay)"
        place = f": {self.where.describe()}" if self.where is not None else ""
        return f"rank {self.batch_of}'s micro-batch, gradient of {self.tensor}, computed by {who}{place}"


@dataclass(frozen=True)
class AuditResult:
    """One audit step, the same on every rank (every rank judges every rank's digests)."""

    step: int
    world: int
    verdict: AuditVerdict
    #: the ranks the verdict names (the odd ones out; for UNDECIDED, the candidates)
    suspects: tuple[int, ...]
    replay_mismatches: tuple[Disagreement, ...] = ()
    self_mismatches: tuple[Disagreement, ...] = ()
    #: ranks whose parameters differ from the majority's (all, when there is no majority)
    diverged: tuple[int, ...] = ()
    gradients: int = 0
    advice: str = field(default="", compare=False)

    @property
    def passed(self) -> bool:
        return self.verdict is AuditVerdict.AGREE

    @property
    def exit_code(self) -> int:
        """0 agree, 1 a mismatch (a card to pull), 3 not judged (the step is not reproducible)."""
        return {AuditVerdict.AGREE: 0, AuditVerdict.UNREPRODUCIBLE: 3}.get(self.verdict, 1)

    def describe(self) -> str:
        head = f"replay audit, step {self.step}, {self.world} ranks: {self.verdict.value.upper()}"
        if self.suspects:
            head += f", rank(s) {', '.join(map(str, self.suspects))}"
        lines = [head + f" ({self.gradients} gradients compared per micro-batch)"]
        if self.diverged:
            lines.append(f"  parameters differ before the step on rank(s) {', '.join(map(str, self.diverged))}")
        lines += [f"  replay mismatch: {d.describe()}" for d in self.replay_mismatches]
        lines += [f"  self mismatch: {d.describe()}" for d in self.self_mismatches]
        if self.advice:
            lines.append(f"  {self.advice}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (one line of an audit log)."""
        out = asdict(self)
        out["verdict"] = self.verdict.value
        out["passed"] = self.passed
        return out


class ReplayAuditFailed(RuntimeError):
    """An audit step that did not agree; raised on every rank alike, carrying the result."""

    def __init__(self, result: AuditResult) -> None:
        super().__init__(result.describe())
        self.result = result


_TWO_RANKS = (
    "with two ranks each replay mismatch involves both: run `amp-harness audit` or `amp-harness burn-in` "
    "on each host (the class's recorded answers decide), or audit with three or more ranks"
)
_NONDETERMINISTIC = (
    "the step gave other bits on every rank when recomputed: make it reproducible "
    "(torch.use_deterministic_algorithms(True); on CUDA CUBLAS_WORKSPACE_CONFIG=:4096:8; no data-dependent "
    "randomness outside torch's generator) and audit again"
)


def _first_differing(a: Mapping[str, str], b: Mapping[str, str]) -> str | None:
    return next((n for n in a if a[n] != b.get(n)), next((n for n in b if n not in a), None))


def judge(step: int, ranks: Sequence[RankDigests]) -> AuditResult:
    """The verdict of one audit step from every rank's digests (ordered by rank); rank ``r``
    replayed rank ``r-1``'s micro-batch (ring order)."""
    world = len(ranks)
    if world < 2:
        raise ValueError("a replay audit needs two or more ranks (one rank has no neighbour to replay it)")
    gradients = len(ranks[0].own)
    by_params: dict[str, list[int]] = {}
    for r in ranks:
        by_params.setdefault(r.params, []).append(r.rank)
    if len(by_params) > 1:
        largest = max(by_params.values(), key=len)
        majority = len(largest) * 2 > world
        odd = tuple(sorted(r for rs in by_params.values() if not (majority and rs is largest) for r in rs))
        return AuditResult(
            step, world, AuditVerdict.DIVERGED, odd if majority else (), diverged=odd, gradients=gradients,
            advice="DDP keeps parameters identical on every rank: a rank's optimizer step or all-reduce was corrupted "
            "earlier (compare the ranks' checkpoints; run `amp-harness burn-in` on the named hosts)",
        )  # fmt: skip
    selfs = tuple(
        Disagreement(r.rank, (r.rank, r.rank), name)
        for r in ranks
        if r.again is not None and (name := _first_differing(r.own, r.again)) is not None
    )
    if len(selfs) == world:
        return AuditResult(
            step, world, AuditVerdict.UNREPRODUCIBLE, (), self_mismatches=selfs, gradients=gradients,
            advice=_NONDETERMINISTIC,
        )  # fmt: skip
    replays = tuple(
        Disagreement(k, (k, (k + 1) % world), name)
        for k in range(world)
        if (name := _first_differing(ranks[k].own, ranks[(k + 1) % world].replay)) is not None
    )
    if not replays and not selfs:
        return AuditResult(step, world, AuditVerdict.AGREE, (), gradients=gradients)
    # a rank is named by disagreeing with itself, or (three ranks or more) with both ring neighbours
    bad_batches = {d.batch_of for d in replays}
    both = {r for r in range(world) if world >= 3 and r in bad_batches and (r - 1) % world in bad_batches}
    named = tuple(sorted(both | {d.batch_of for d in selfs}))
    if named:
        return AuditResult(step, world, AuditVerdict.SUSPECT, named, replays, selfs, gradients=gradients)
    candidates = tuple(sorted({r for d in replays for r in d.ranks}))
    advice = _TWO_RANKS if world == 2 else "one disagreement between two ranks (a transient fault): audit again"
    return AuditResult(
        step, world, AuditVerdict.UNDECIDED, candidates, replays, selfs, gradients=gradients, advice=advice
    )


# -- running it on a process group ---------------------------------------------------------------


def _to(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors, mappings, sequences of them, or anything with ``.to``) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        moved = {k: _to(v, device) for k, v in batch.items()}
        try:
            return type(batch)(moved)  # type: ignore[call-arg]
        except TypeError:
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_to(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device) for v in batch)
    if callable(getattr(batch, "to", None)):
        return batch.to(device)
    return batch


def _gradients(
    module: torch.nn.Module, named: Sequence[tuple[str, torch.nn.Parameter]], batch: Any, loss_of: LossOf, seed: int
) -> dict[str, torch.Tensor]:
    """The gradients of ``batch`` alone, from fresh ``.grad`` and a fixed random state (dropout
    draws the same masks for the owner and the replayer)."""
    for _, p in named:
        p.grad = None
    cuda = sorted({p.device.index or 0 for _, p in named if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        loss_of(module, batch).backward()  # type: ignore[no-untyped-call]
    return {n: p.grad.detach().clone() for n, p in named if p.grad is not None}


def _params_digest(named: Sequence[tuple[str, torch.nn.Parameter]]) -> str:
    h = hashlib.sha256()
    for n, p in named:
        h.update(f"{n}={digest(p.detach().cpu())};".encode())
    return h.hexdigest()


def _ring_exchange(batch: Any, rank: int, world: int, group: Any) -> Any:
    """Send ``batch`` to the next rank and receive the previous rank's (even ranks send first, odd
    ranks receive first: no cycle of blocked sends)."""
    import torch.distributed as dist

    def glob(r: int) -> int:
        return r if group is None else int(dist.get_global_rank(group, r))

    out: list[Any] = [_to(batch, torch.device("cpu"))]
    got: list[Any] = [None]
    if rank % 2 == 0:
        dist.send_object_list(out, dst=glob((rank + 1) % world), group=group)
        dist.recv_object_list(got, src=glob((rank - 1) % world), group=group)
    else:
        dist.recv_object_list(got, src=glob((rank - 1) % world), group=group)
        dist.send_object_list(out, dst=glob((rank + 1) % world), group=group)
    return got[0]


def audit(
    model: torch.nn.Module, batch: Any, loss_of: LossOf, *, step: int, repeat: bool = True, group: Any = None
) -> AuditResult:
    """Audit one step on every rank of ``group`` (collective: every rank calls it with its own
    micro-batch). ``model``: the DDP-wrapped model or the module itself; the gradients are computed
    on the module, without DDP's all-reduce, and the ranks' ``.grad`` and random state are left as
    they were. ``repeat``: also compute the rank's own micro-batch a second time (a transient fault
    on one rank names it; without it, an audit costs two backward passes instead of three)."""
    import torch.distributed as dist

    module = getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if any(type(p.data).__name__ == "DTensor" for _, p in named):
        raise TypeError(
            "replay audit: the parameters are sharded (FSDP2 DTensors); a rank cannot replay a neighbour's "
            "micro-batch without the whole model: audit the DDP (replicated) part, or run `amp-harness audit`"
        )
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world < 2:
        raise ValueError("a replay audit needs two or more ranks (one rank has no neighbour to replay it)")
    device = next((p.device for _, p in named), torch.device("cpu"))
    saved = [p.grad for _, p in named]
    try:
        own = _gradients(module, named, batch, loss_of, step)
        again = _gradients(module, named, batch, loss_of, step) if repeat else None
        neighbour = _to(_ring_exchange(batch, rank, world, group), device)
        replay = _gradients(module, named, neighbour, loss_of, step)
    finally:
        for (_, p), g in zip(named, saved, strict=True):
            p.grad = g
    mine = RankDigests(
        rank,
        _params_digest(named),
        {n: digest(g.cpu()) for n, g in own.items()},
        {n: digest(g.cpu()) for n, g in again.items()} if again is not None else None,
        {n: digest(g.cpu()) for n, g in replay.items()},
    )
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, json.dumps(asdict(mine)), group=group)
    result = judge(step, [RankDigests(**json.loads(s)) for s in everyone])
    if not (result.replay_mismatches or result.self_mismatches):
        return result
    # where each disagreement's bits first differ: its two tensors, from the ranks that hold them
    wanted: dict[str, torch.Tensor] = {}
    for i, d in enumerate(result.replay_mismatches):
        if rank == d.ranks[0]:
            wanted[f"r{i}a"] = own[d.tensor].cpu()
        if rank == d.ranks[1]:
            wanted[f"r{i}b"] = replay[d.tensor].cpu()
    for i, d in enumerate(result.self_mismatches):
        if rank == d.batch_of and again is not None:
            wanted[f"s{i}a"], wanted[f"s{i}b"] = own[d.tensor].cpu(), again[d.tensor].cpu()
    pieces: list[Any] = [None] * world
    dist.all_gather_object(pieces, wanted, group=group)
    held = {k: t for p in pieces for k, t in p.items()}

    def located(prefix: str, ds: tuple[Disagreement, ...]) -> tuple[Disagreement, ...]:
        return tuple(replace(d, where=mismatch(held[f"{prefix}{i}a"], held[f"{prefix}{i}b"])) for i, d in enumerate(ds))

    return replace(
        result,
        replay_mismatches=located("r", result.replay_mismatches),
        self_mismatches=located("s", result.self_mismatches),
    )


class ReplayAudit:
    """The audit in a training loop: every ``every`` steps, before the step, each rank replays its
    neighbour's micro-batch (:func:`audit`)::

        audit = ReplayAudit(lambda m, b: loss_fn(m(b[0]), b[1]), every=100, record=AuditLog("audit.jsonl"))
        for step, batch in enumerate(loader):
            audit(step, ddp_model, batch)  # collective on audit steps; raises ReplayAuditFailed on every rank
            ...  # the training step as before

    The loss function runs the forward as the training does (its autocast included). ``record``
    gets every audit step's result (passed or not) before anything is raised. ``raise_on_failure``
    False returns the failed result instead. Cost per audit step: three forward and backward passes
    on the module (two with ``repeat=False``) and one micro-batch sent to the next rank."""

    def __init__(
        self,
        loss_of: LossOf,
        every: int = 100,
        *,
        repeat: bool = True,
        group: Any = None,
        record: Callable[[AuditResult], None] | None = None,
        raise_on_failure: bool = True,
    ) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"ReplayAudit(every={every!r}): a positive number of steps between audits")
        self.loss_of, self.every, self.repeat, self.group = loss_of, every, repeat, group
        self.record, self.raise_on_failure = record, raise_on_failure
        self.results: list[AuditResult] = []

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def __call__(self, step: int, model: torch.nn.Module, batch: Any) -> AuditResult | None:
        """The audit of ``step`` (None when it is not an audit step)."""
        if not self.due(step):
            return None
        result = audit(model, batch, self.loss_of, step=step, repeat=self.repeat, group=self.group)
        self.results.append(result)
        if self.record is not None:
            self.record(result)
        if self.raise_on_failure and not result.passed:
            raise ReplayAuditFailed(result)
        return result
