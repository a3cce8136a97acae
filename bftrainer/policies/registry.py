"""Allocation policies: pure functions of the inputs the loop hands them.

A policy admits (:class:`Admission`: which unfinished trainers take part) and decides
(``decide(inputs) -> Decision``, from :class:`~bftrainer.loop.PolicyInputs`): it reads
no clock and no table that anything else writes, so the same inputs give the same
decision in the daemon, the centre and the replay.

``POLICIES`` is the registry (as ``milp.solvers`` has of solvers): a name -> a factory
that builds the policy from the configuration record (``bftrainer.policies.config.Config``);
:func:`make_policy` builds the one a record names, for whoever builds a loop (the loop
builds none). A new policy is a class here, a line in the registry and its name in
``bftrainer.policies.config.POLICY_NAMES`` (which the record checks names against).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bftrainer.loop.churn import auto_t_fwd_s
from bftrainer.loop.jobs import JobSpec
from bftrainer.loop.protocols import Policy
from bftrainer.loop.records import Curve, Decision, PolicyInputs, TrainerState
from bftrainer.milp import Problem, TrainerSpec, allocate
from bftrainer.milp.mapping import map_counts
from bftrainer.milp.problem import fair_admission, group_key
from bftrainer.milp.slot_packing import map_slots
from bftrainer.policies.config import POLICY_NAMES, Config


def admit(trainers: Iterable[TrainerState], limit: int, fair_by: str) -> list[TrainerState]:
    """The ``limit`` trainers that take part, in arrival order: first come, first served;
    with ``fair_by`` user or account, round by round across users or accounts
    (``bftrainer.milp.problem.fair_admission``)."""
    if fair_by == "trainer":
        out: list[TrainerState] = []
        for t in trainers:
            if len(out) == limit:
                break
            out.append(t)
        return out
    listed = list(trainers)
    groups = [group_key(t.id, t.job.user, t.job.account, fair_by) for t in listed]
    return [listed[i] for i in fair_admission(groups, limit)]


class Admission:
    """The admission every policy here uses (:func:`admit`); a policy that admits
    otherwise overrides ``admit``."""

    def admit(
        self, trainers: Iterable[TrainerState], limit: int, fair_by: str
    ) -> list[TrainerState]:
        return admit(trainers, limit, fair_by)


@dataclass(frozen=True)
class MilpPolicy(Admission):
    """The BFTrainer allocator (``docs/allocator.md``) at every event, with the
    settings of ``config`` (T_fwd, objective, formulation, solver, time limit, fairness).
    ``t_fwd_s = "auto"``: T_fwd from the pool's churn (bftrainer/loop/churn.py)."""

    config: Config
    name: str = "milp"
    # Promise (issue 40): each trainer's weight on its objective term (TrainerSpec.weight),
    # from whoever knows it (a replayed search: its trials' rungs); None: all 1.
    weights: Callable[[str], float] | None = None
    # The specs of the last decision's trainers, by id, with the job each was built from.
    _specs: dict[str, tuple[JobSpec, TrainerSpec]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def decide(self, inputs: PolicyInputs) -> Decision:
        c = self.config
        problem = self.problem(inputs)
        result = allocate(
            problem, formulation=c.formulation, solver=c.solver, time_limit_s=c.time_limit_s
        )
        return Decision(dict(result.nodes), result.status, result.solve_s, problem.t_fwd_s)

    def problem(self, inputs: PolicyInputs) -> Problem:
        """The allocator's input (the paper's model, ``bftrainer.milp.Problem``) for
        ``inputs``: what :meth:`decide` solves."""
        c = self.config
        pool, trainers, churn = inputs.pool, inputs.trainers, inputs.churn
        t_fwd = auto_t_fwd_s(churn) if c.t_fwd_s == "auto" else float(c.t_fwd_s)
        metric = "goodput" if c.objective == "goodput" else "throughput"
        spread = spread_metric(metric)
        last = dict(self._specs)
        self._specs.clear()
        return Problem(
            pool=pool,
            trainers=tuple(
                self._spec(
                    t,
                    last.get(t.id),
                    t.curve(metric),
                    t.reported_curves.get(spread),
                    1.0 if self.weights is None else self.weights(t.id),
                )
                for t in trainers
            ),
            t_fwd_s=t_fwd,
            objective=c.objective,
            max_trainers=max(len(trainers), 1),
            fairness_p=c.fairness_p,
            fair_share_speedup=c.fair_share_speedup,
            windows_s=churn.windows_s,
            fair_by=c.fair_by,
            fair_weights=c.fair_weights,
            slots_per_node=c.slots_per_node,
        )

    def _spec(
        self,
        t: TrainerState,
        last: tuple[JobSpec, TrainerSpec] | None,
        curve: Curve,
        spread_curve: Curve | None,
        weight: float,
    ) -> TrainerSpec:
        """``t.job.trainer_spec(curve, t.nodes, spread_curve, weight)``, checked on
        construction. The spec built at the last decision is reused when it was built
        from the same job, curves (the same objects: immutable tuples) and weight: a
        replay rebuilt and re-checked every admitted trainer's spec at every decision
        (a tenth of it), nearly all unchanged. Only the specs of the last decision are
        kept (P_jmax of them), so finished trainers leave the cache."""
        if (
            last is None
            or last[0] is not t.job
            or last[1].curve is not curve
            or last[1].spread_curve is not spread_curve
            or type(weight) is not float
            or type(last[1].weight) is not float
            or weight != last[1].weight
        ):
            spec = t.job.trainer_spec(
                curve=curve, nodes=t.nodes, spread_curve=spread_curve, weight=weight
            )
        elif last[1].nodes != t.nodes:
            spec = last[1].with_nodes(t.nodes)
        else:
            spec = last[1]
        self._specs[t.id] = (t.job, spec)
        return spec


@dataclass(frozen=True)
class EqualSharePolicy(Admission):
    """The paper's baseline: an equal share of the pool for each admitted trainer, within
    its limits; leftover nodes go first come, first served. Oblivious to rescale costs."""

    slots_per_node: int = 1
    name: str = "equal"

    def decide(self, inputs: PolicyInputs) -> Decision:
        s = self.slots_per_node
        pool, trainers = inputs.pool, inputs.trainers
        limits = [(t.id, t.job.n_min, t.job.n_max) for t in trainers]
        counts = equal_share_counts(limits, len(pool) * s)
        current = {t.id: t.nodes for t in trainers}
        if s == 1:
            return Decision(map_counts(current, counts, pool))
        return Decision(map_slots(current, counts, pool, s))


@dataclass(frozen=True)
class ScavengerPolicy(Admission):
    """What a centre runs without bftrainer: a preemptible partition with requeue.

    Each job is rigid (:func:`rigid_size`) and starts, first come first served, once
    that many pool nodes are free; the queue's head blocks the jobs behind it (when every
    job has one size, as in the paper's job sets, backfill would do the same). A job that
    lost any node is killed and requeued at its place in the queue, a running one keeps
    its nodes: it never shrinks or grows. A (re)start takes the first free nodes in pool
    order: a requeued job is a new launch, on any nodes. What a kill costs (the work
    since the last checkpoint, a restart) is the driver's accounting
    (``bftrainer/replay/rigid.py``).
    """

    size: int | None = None
    name: str = "scavenger"

    def decide(self, inputs: PolicyInputs) -> Decision:
        pool, trainers = inputs.pool, inputs.trainers
        nodes: dict[str, tuple[str, ...]] = {}
        for t in trainers:
            if t.nodes and len(t.nodes) == rigid_size(t.job, self.size):
                nodes[t.id] = t.nodes
        held = {n for kept in nodes.values() for n in kept}
        free = [n for n in pool if n not in held]
        blocked = False
        for t in trainers:
            if t.id in nodes:
                continue
            size = rigid_size(t.job, self.size)
            if blocked or len(free) < size:
                blocked = True  # first come, first served: nobody passes the head
                nodes[t.id] = ()
                continue
            nodes[t.id], free = tuple(free[:size]), free[size:]
        return Decision(nodes)


def spread_metric(metric: str) -> str:
    """The name of a reported curve's spread twin (slots over more nodes than needed)."""
    return f"{metric}_spread"


def rigid_size(job: JobSpec, size: int | None) -> int:
    """A rigid job's node count: ``size`` (a centre's fixed job size) within the job's
    own [n_min, n_max], or its n_max when no size is set."""
    return job.n_max if size is None else min(max(size, job.n_min), job.n_max)


POLICIES: dict[str, Callable[[Config], Policy]] = {
    "milp": MilpPolicy,
    "equal": lambda config: EqualSharePolicy(config.slots_per_node),
    "scavenger": lambda config: ScavengerPolicy(config.scavenger_size),
}
if tuple(POLICIES) != POLICY_NAMES:  # one list of names, checked where both are seen
    raise ImportError(
        f"bftrainer.policies.registry.POLICIES {tuple(POLICIES)} and "
        "bftrainer.policies.config.POLICY_NAMES "
        f"{POLICY_NAMES} differ: name each policy in both, in the same order"
    )
# The policies the daemon can carry out on real, elastic trainers. The scavenger baseline
# models rigid jobs killed and requeued from checkpoints: a replay model only.
LIVE_POLICIES = ("equal", "milp")


def make_policy(config: Config) -> Policy:
    """The policy ``config`` names, from the registry, built with its settings."""
    return POLICIES[config.policy](config)


def equal_share_counts(limits: list[tuple[str, int, int]], pool_size: int) -> dict[str, int]:
    """Counts for (id, n_min, n_max) in arrival order: the latest arrivals drop out until
    an equal share reaches everyone's n_min; then leftovers fill up in arrival order."""
    active = list(limits)
    while active:
        share = pool_size // len(active)
        if all(share >= n_min for _, n_min, _ in active):
            break
        active.pop()
    counts = {tid: 0 for tid, _, _ in limits}
    if not active:
        return counts
    share = pool_size // len(active)
    for tid, _, n_max in active:
        counts[tid] = min(share, n_max)
    left = pool_size - sum(counts.values())
    for tid, _, n_max in active:
        extra = min(left, n_max - counts[tid])
        counts[tid] += extra
        left -= extra
    return counts
