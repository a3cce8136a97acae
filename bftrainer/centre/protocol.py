"""The records an agent and the centre's allocator exchange (over bftrainer.centre.transport).

An agent sends its whole view at every sync (``SyncRequest``: every unfinished trainer of
its user, with its nodes and latest curves), never a diff: so either side can die and
come back, and the next sync says everything again. The allocator answers with the nodes
it gives each of those trainers (``SyncReply``). Each record is checked field by field
on arrival; a bad one is refused with one line naming the field.

Who the agent is comes from the kernel (``SO_PEERCRED``), never from these records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from bftrainer.centre.transport import RequestRefused
from bftrainer.loop.jobs import JobSpec, prior_curve
from bftrainer.milp.problem import ProblemError, check_speedup

# Request kinds.
HELLO = "hello"  # an agent (or a user's command) asks for the centre's settings
SYNC = "sync"  # an agent reports its trainers and gets its assignment
STATUS = "status"  # a user asks what the allocator knows (of one trainer, or all)
CANCEL = "cancel"  # a user cancels one of their trainers

# A trainer id inside one user's state directory (bftrainer.state.trainer_id_of).
LOCAL_ID = re.compile(r"t[0-9]{4,9}")
# A node name as schedulers spell them.
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_TRAINERS_PER_AGENT = 1000
MAX_NODES = 100_000
MAX_CURVE_POINTS = 1024
# The wire's name of TrainerReport.submit_s, as its first release spelled it (compatible).
WIRE_SUBMIT_S = "submitted_s"


def centre_id(user: str, local_id: str) -> str:
    """How the centre names a user's trainer: ``alice/t0001``."""
    return f"{user}/{local_id}"


def split_id(trainer: str, default_user: str) -> tuple[str, str]:
    """(user, local id) of ``alice/t0001`` or of ``t0001`` (``default_user``'s)."""
    user, sep, local = trainer.rpartition("/")
    if not sep:
        user = default_user
    if not user or not LOCAL_ID.fullmatch(local):
        raise RequestRefused(f"trainer {trainer[:80]!r}: expected an id like t0001 or alice/t0001")
    return user, local


@dataclass(frozen=True)
class TrainerReport:
    """One unfinished trainer as its agent sees it: the trainer record's fields
    (``bftrainer.loop.jobs``) under the same names, and what it has now.

    On the wire two keep their first release's spelling, so that an agent and an
    allocator of either release understand each other (docs/deployment.md, "Centre mode"):
    ``submit_s`` is sent as ``submitted_s``, and work until the trainer's own stop
    (``math.inf`` here) as ``null``."""

    id: str
    model: str
    submit_s: float
    n_min: int
    n_max: int
    rescale_up_s: float
    rescale_down_s: float
    work_samples: float  # math.inf: the trainer's own stop
    nodes: tuple[str, ...] = ()
    samples_done: float = 0.0
    curves: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    @classmethod
    def of_job(
        cls,
        job: JobSpec,
        *,
        id: str,
        nodes: tuple[str, ...] = (),
        samples_done: float = 0.0,
        curves: Mapping[str, tuple[tuple[float, float], ...]] | None = None,
    ) -> TrainerReport:
        """The report of ``job`` (its agent's trainer ``id``) and what it has now."""
        return cls(
            id=id,
            model=job.model,
            submit_s=job.submit_s,
            n_min=job.n_min,
            n_max=job.n_max,
            rescale_up_s=job.rescale_up_s,
            rescale_down_s=job.rescale_down_s,
            work_samples=job.work_samples,
            nodes=nodes,
            samples_done=samples_done,
            curves=dict(curves or {}),
        )

    def job(self, id: str, user: str, account: str) -> JobSpec:
        """The job the centre's loop plans on (``id``: the centre's name of it, owned by
        ``user`` and ``account``), on the prior curve until its agent reports one."""
        return JobSpec(
            id=id,
            model=self.model,
            submit_s=self.submit_s,
            n_min=self.n_min,
            n_max=self.n_max,
            rescale_up_s=self.rescale_up_s,
            rescale_down_s=self.rescale_down_s,
            work_samples=self.work_samples,
            curve=prior_curve(self.n_max),
            user=user,
            account=account,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            WIRE_SUBMIT_S: self.submit_s,
            "n_min": self.n_min,
            "n_max": self.n_max,
            "rescale_up_s": self.rescale_up_s,
            "rescale_down_s": self.rescale_down_s,
            "work_samples": None if math.isinf(self.work_samples) else self.work_samples,
            "nodes": list(self.nodes),
            "samples_done": self.samples_done,
            "curves": {m: [list(p) for p in c] for m, c in self.curves.items()},
        }

    @classmethod
    def from_dict(cls, value: object) -> TrainerReport:
        d = _object(value, "trainer")
        tid = _str(d, "id", "trainer")
        if not LOCAL_ID.fullmatch(tid):
            raise RequestRefused(f"trainer id {tid[:80]!r}: expected one like t0001")
        where = f"trainer {tid}"
        n_min, n_max = _int(d, "n_min", where, 1), _int(d, "n_max", where, 1)
        if n_max < n_min:
            raise RequestRefused(f"{where}: n_max {n_max} is below n_min {n_min}")
        work = math.inf
        if d.get("work_samples") is not None:
            work = _num(d, "work_samples", where, 1.0)
        nodes = _nodes(d.get("nodes", []), f"{where}: 'nodes'")
        curves_in = d.get("curves", {})
        if not isinstance(curves_in, dict):
            raise RequestRefused(f"{where}: 'curves' is not an object")
        curves = {}
        for metric, points in curves_in.items():
            if metric not in ("throughput", "goodput"):
                raise RequestRefused(f"{where}: unknown curve {str(metric)[:40]!r}")
            curves[metric] = _curve(points, f"{where}'s {metric} curve")
        report = cls(
            id=tid,
            model=_str(d, "model", where)[:200],
            submit_s=_num(d, WIRE_SUBMIT_S, where, 0.0),
            n_min=n_min,
            n_max=n_max,
            rescale_up_s=_num(d, "rescale_up_s", where, 0.0),
            rescale_down_s=_num(d, "rescale_down_s", where, 0.0),
            work_samples=work,
            nodes=tuple(nodes),
            samples_done=_num(d, "samples_done", where, 0.0),
            curves=curves,
        )
        report.check_allocatable()
        return report

    def check_allocatable(self) -> None:
        """Refuse what the allocator's model would refuse (the limits of ``allocate``'s
        input, bftrainer.milp.problem): checked here, at the sync, so one user's bad
        report is refused to that user and never reaches a decision that serves all."""
        where = f"trainer {self.id}"
        for metric, curve in {"throughput": None, **self.curves}.items():
            try:
                spec = self.job(self.id, "", "").trainer_spec(
                    curve=curve or ((float(self.n_max), float(self.n_max)),), nodes=self.nodes
                )
                # Whatever the centre's objective: under speedup, the decision that
                # serves every user would refuse the curve (milp's check_speedup).
                check_speedup(spec)
            except ProblemError as e:
                reason = str(e).split(": ", 1)[-1].replace("curve", f"{metric} curve", 1)
                raise RequestRefused(f"{where}: {reason}") from None


@dataclass(frozen=True)
class SyncRequest:
    """An agent's whole view: its user's unfinished trainers, and ``held``, the nodes its
    holders run on (None: an agent that does not say; bftrainer.centre.refusals)."""

    trainers: tuple[TrainerReport, ...]
    held: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"trainers": [t.to_dict() for t in self.trainers]}
        if self.held is not None:
            body["held"] = list(self.held)
        return body

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> SyncRequest:
        trainers = body.get("trainers")
        if not isinstance(trainers, list) or len(trainers) > MAX_TRAINERS_PER_AGENT:
            raise RequestRefused(
                f"'trainers' must be a list of at most {MAX_TRAINERS_PER_AGENT} trainers"
            )
        reports = tuple(TrainerReport.from_dict(t) for t in trainers)
        if len({t.id for t in reports}) < len(reports):
            raise RequestRefused("a trainer id appears twice in 'trainers'")
        held = body.get("held")
        return cls(reports, None if held is None else _nodes(held, "'held'"))


@dataclass(frozen=True)
class SyncReply:
    """The allocator's answer: nodes for each trainer it has decided on (a trainer absent
    from ``assignment`` keeps what it has until the allocator decides: it is new, or the
    allocator has just restarted), trainers whose cancel a user asked for, and how often
    to sync."""

    assignment: Mapping[str, tuple[str, ...]]
    cancel: tuple[str, ...] = ()
    sync_every_s: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "assignment": {t: list(n) for t, n in self.assignment.items()},
            "cancel": list(self.cancel),
            "sync_every_s": self.sync_every_s,
        }

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> SyncReply:
        assignment = body.get("assignment", {})
        if not isinstance(assignment, dict):
            raise ValueError("'assignment' is not an object")
        out = {}
        for tid, nodes in assignment.items():
            if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
                raise ValueError(f"assignment of {tid!r} is not a list of nodes")
            out[str(tid)] = tuple(nodes)
        cancel = body.get("cancel", [])
        if not isinstance(cancel, list) or not all(isinstance(c, str) for c in cancel):
            raise ValueError("'cancel' is not a list of trainer ids")
        every = body.get("sync_every_s", 1.0)
        if not isinstance(every, int | float) or not 0.05 <= every <= 600:
            raise ValueError(f"sync_every_s = {every!r}: out of range")
        return cls(out, tuple(cancel), float(every))


# ---------------------------------------------------------------------- checks


def _nodes(value: object, what: str) -> tuple[str, ...]:
    """``what`` (a field, with where it is) checked as a list of node names."""
    if not isinstance(value, list) or len(value) > MAX_NODES:
        raise RequestRefused(f"{what} is not a list of node names")
    seen: set[str] = set()
    for n in value:
        if not isinstance(n, str) or not NODE.fullmatch(n):
            raise RequestRefused(f"{what}: node {str(n)[:80]!r} is not a node name")
        if n in seen:  # one trainer twice on a node: the restore took it for two holders
            raise RequestRefused(f"{what}: node {n!r} appears twice")
        seen.add(n)
    return tuple(value)


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RequestRefused(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _str(d: Mapping[str, Any], key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise RequestRefused(f"{where}: '{key}' is {v!r:.40}, expected a string")
    return v


def _int(d: Mapping[str, Any], key: str, where: str, lo: int) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= MAX_NODES:
        raise RequestRefused(f"{where}: '{key}' is {v!r:.40}, expected {lo} to {MAX_NODES}")
    return v


def _finite(v: object) -> TypeGuard[int | float]:
    """A JSON number that is a finite float (an integer of 400 digits is not one: its
    float overflows)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _num(d: Mapping[str, Any], key: str, where: str, lo: float) -> float:
    v = d.get(key)
    if not _finite(v) or float(v) < lo:
        raise RequestRefused(f"{where}: '{key}' is {v!r:.40}, expected a finite number >= {lo:g}")
    return float(v)


def _curve(points: object, where: str) -> tuple[tuple[float, float], ...]:
    if not isinstance(points, list) or not 0 < len(points) <= MAX_CURVE_POINTS:
        raise RequestRefused(f"{where}: expected 1 to {MAX_CURVE_POINTS} points")
    out: list[tuple[float, float]] = []
    for p in points:
        if not isinstance(p, list) or len(p) != 2 or not all(_finite(x) for x in p):
            raise RequestRefused(f"{where}: a point is {str(p)[:40]!r}, expected [nodes, value]")
        out.append((float(p[0]), float(p[1])))
    return tuple(out)


def nodes_of(assignment: Mapping[str, Sequence[str]]) -> set[str]:
    return {n for nodes in assignment.values() for n in nodes}
