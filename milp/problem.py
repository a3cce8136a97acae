"""The allocation problem as plain data, and its validation.

A :class:`Problem` is what the allocator sees at one event: the pool of idle nodes and
the trainers in arrival order, each with its limits, costs, current nodes and curve.
Everything is validated on construction, so the models never see bad input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from bftrainer.common.limits import CURVE_VALUE_MAX
from bftrainer.common.names import MAX_SLOTS

OBJECTIVES = ("throughput", "speedup", "goodput")
# Whose shares the fairness of the objective evens out (docs/allocator.md, "Fair by").
FAIR_BY = ("trainer", "user", "account")
# A group's weight in fair_weights: relative to 1, the weight of a group not listed.
FAIR_WEIGHT_RANGE = (1e-3, 1e3)
FAIRNESS_P_RANGE = (-10.0, 1.0)
DEFAULT_T_FWD_S = 120.0
DEFAULT_MAX_TRAINERS = 10
# Limits of the input (docs/allocator.md, "Limits"): wide beyond any real use, and narrow
# enough that Eq. 16's terms (up to T_fwd x value and value x cost, ~1e19) and the
# per-count tables (one entry per node count) stay finite and small.
RESCALE_MAX_S = 1e6
T_FWD_MAX_S = 1e7
NODES_MAX = 1_000_000
# Counts tabulated over all admitted trainers (about 8 bytes each, a few tables each).
TABLE_CELLS_MAX = 20_000_000
# Curves already found valid, the very objects (a curve is immutable), by (id, name,
# n_max): a replay builds every admitted trainer's spec at every event from the same
# few curves, and checking each point was a tenth of its time. Identity, not equality:
# 1 == 1.0 == True, and a bool is refused. Cleared when full (learned curves are many).
_VALID_CURVES: dict[tuple[int, str, int], tuple[tuple[float, float], ...]] = {}
_VALID_CURVES_MAX = 4096
# The last valid pool and its set: a replay's decisions mostly see the pool of the one
# before (a completion changes no node), and the set of ~1,000-3,000 names was most of
# building a problem; an equal tuple (a pass of identity checks) has the same set.
_LAST_POOL: list[tuple[tuple[str, ...], frozenset[str]]] = []


class ProblemError(ValueError):
    """An allocation problem is malformed; the message names the field and trainer."""


@dataclass(frozen=True)
class TrainerSpec:
    """One trainer as the allocator sees it.

    ``curve`` holds breakpoints ``(nodes, value_per_s)`` with strictly increasing node
    counts; the value is linear between breakpoints and 0 at 0 nodes. ``nodes`` are
    the nodes the trainer holds now (some may have left the pool).

    With ``Problem.slots_per_node`` S > 1 the unit is a slot (a GPU), not a node:
    ``n_min``, ``n_max`` and the curve count slots, the curve is the value of slots
    packed on the fewest nodes, and ``nodes`` lists a node once per slot held there.
    ``spread_curve`` is the value when they span more nodes than that (default: the
    curve less ``slots.DEFAULT_SPREAD_PENALTY``; docs/allocator.md, "Slots").
    """

    id: str
    n_min: int
    n_max: int
    rescale_up_s: float
    rescale_down_s: float
    curve: tuple[tuple[float, float], ...]
    nodes: tuple[str, ...] = ()
    user: str = ""
    account: str = ""
    spread_curve: tuple[tuple[float, float], ...] | None = None
    # Promise (issue 40): a weight on the trainer's term of the objective, w_j O_j (a
    # search's trial that passed more rungs counts more); 1 is the paper's model.
    weight: float = 1.0

    def __post_init__(self) -> None:
        where = f"trainer {self.id!r}"
        _check_number(self.weight, f"{where}: weight", minimum=0.0, maximum=1e6, open_min=True)
        for name in ("user", "account"):
            if not isinstance(getattr(self, name), str):
                raise ProblemError(f"{where}: {name} is {getattr(self, name)!r}, expected a name")
        _check_int(self.n_min, f"{where}: n_min", minimum=1)
        _check_int(self.n_max, f"{where}: n_max", minimum=1)
        if self.n_max > NODES_MAX:
            raise ProblemError(f"{where}: n_max is {self.n_max}, expected <= {NODES_MAX:,}")
        if self.n_min > self.n_max:
            raise ProblemError(f"{where}: n_min {self.n_min} > n_max {self.n_max}")
        for name, value in (
            ("rescale_up", self.rescale_up_s),
            ("rescale_down", self.rescale_down_s),
        ):
            _check_number(value, f"{where}: {name}", minimum=0.0, maximum=RESCALE_MAX_S)
        _check_curve(self.curve, where, "curve", self.n_max)
        if self.spread_curve is not None:
            _check_curve(self.spread_curve, where, "spread_curve", self.n_max)
        self._check_nodes()

    def _check_nodes(self) -> None:
        if len(self.nodes) > self.n_max:
            raise ProblemError(
                f"trainer {self.id!r}: holds {len(self.nodes)} nodes, more than n_max {self.n_max}"
            )

    def with_nodes(self, nodes: tuple[str, ...]) -> TrainerSpec:
        """This valid spec holding ``nodes`` instead: only what depends on the nodes is
        checked again (a replay's trainer keeps its spec from one decision to the next,
        and most of them hold what they held; rebuilding was a tenth of a decision)."""
        spec = object.__new__(TrainerSpec)
        spec.__dict__.update(self.__dict__)
        object.__setattr__(spec, "nodes", nodes)
        spec._check_nodes()
        return spec

    def value_at(self, n: float) -> float:
        """The curve's value at ``n`` nodes (linear between breakpoints, 0 at 0)."""
        if n <= 0:
            return 0.0
        x0, y0 = 0.0, 0.0
        for x1, y1 in self.curve:
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
            x0, y0 = x1, y1
        return y0


@dataclass(frozen=True)
class Problem:
    """The pool and the trainers (in arrival order) at one event."""

    pool: tuple[str, ...]
    trainers: tuple[TrainerSpec, ...]
    t_fwd_s: float = DEFAULT_T_FWD_S
    objective: str = "throughput"
    max_trainers: int = DEFAULT_MAX_TRAINERS
    fairness_p: float = 1.0
    fair_share_speedup: bool = False
    # Seconds until the main scheduler is known to take a pool node back; a node that is
    # absent (or None) is open-ended or unknown. Empty: Eq. 16 as in the paper.
    windows_s: Mapping[str, float | None] = field(default_factory=dict)
    # Fairness (fairness_p, fair_share_speedup) between trainers, users or accounts; a
    # user's or account's weight (absent: 1). Weights do not apply by trainer.
    fair_by: str = "trainer"
    fair_weights: Mapping[str, float] = field(default_factory=dict)
    # S: slots (GPUs) per pool node, the unit of allocation (docs/allocator.md, "Slots").
    slots_per_node: int = 1
    pool_set: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pool_set = _pool_set(self.pool)  # one set: the check below and pool_set
        if len(pool_set) != len(self.pool):
            seen: set[str] = set()
            dup = next(n for n in self.pool if n in seen or seen.add(n))  # type: ignore[func-returns-value]
            raise ProblemError(f"pool lists node {dup!r} twice")
        if type(self.pool) is tuple:
            _LAST_POOL[:] = [(self.pool, pool_set)]  # a pool without repeats only
        # T_fwd = 0 values every allocation at nothing: no trainer would ever start.
        _check_number(self.t_fwd_s, "t_fwd", minimum=0.0, maximum=T_FWD_MAX_S, open_min=True)
        if self.objective not in OBJECTIVES:
            raise ProblemError(
                f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}"
            )
        _check_int(self.max_trainers, "max_trainers", minimum=1)
        _check_number(self.fairness_p, "fairness_p", minimum=FAIRNESS_P_RANGE[0])
        if self.fairness_p > FAIRNESS_P_RANGE[1]:
            raise ProblemError(
                f"fairness_p is {self.fairness_p!r}, expected <= 1 (1: plain sum; lower: fairer)"
            )
        if not isinstance(self.fair_share_speedup, bool):
            raise ProblemError(
                f"fair_share_speedup is {self.fair_share_speedup!r}, expected true/false"
            )
        if self.fair_by not in FAIR_BY:
            raise ProblemError(f"fair_by {self.fair_by!r} is not one of {', '.join(FAIR_BY)}")
        if not isinstance(self.fair_weights, Mapping):
            raise ProblemError("fair_weights must be an object: user or account -> weight")
        for name, weight in self.fair_weights.items():
            _check_number(
                weight,
                f"fair_weights: {name!r}",
                minimum=FAIR_WEIGHT_RANGE[0],
                maximum=FAIR_WEIGHT_RANGE[1],
            )
        if self.fair_weights and self.fair_by == "trainer":  # they weigh users or accounts
            raise ProblemError('fair_weights means nothing without fair_by "user" or "account"')
        _check_int(self.slots_per_node, "slots_per_node", minimum=1, maximum=MAX_SLOTS)
        ids: set[str] = set()
        for t in self.trainers:
            if t.id in ids:
                raise ProblemError(f"trainer id {t.id!r} appears twice")
            ids.add(t.id)
        _check_holdings(self.trainers, self.slots_per_node)
        object.__setattr__(self, "pool_set", pool_set)
        if self.objective == "speedup":  # fair-share speedup: checked by the objective
            for t in self.trainers:
                check_speedup(t)
        if self.slots_per_node > 1 and any(w is not None for w in self.windows_s.values()):
            raise ProblemError(
                'windows: not modelled with slots_per_node > 1 (docs/allocator.md, "Slots")'
            )
        if _usual_windows(self.windows_s, pool_set):
            return  # nothing below can fail; it runs to name what is wrong
        for node, w in self.windows_s.items():
            if node not in self.pool_set:
                raise ProblemError(f"windows: node {node!r} is not in the pool")
            if w is not None:
                _check_number(w, f"windows: node {node!r}", minimum=0.0)

    def current_nodes(self, trainer: TrainerSpec) -> tuple[str, ...]:
        """The trainer's nodes still in the pool (nodes that left are dropped)."""
        if self.pool_set.issuperset(trainer.nodes):  # the usual case, without a loop
            return tuple(trainer.nodes)  # the same tuple, not a copy
        return tuple(n for n in trainer.nodes if n in self.pool_set)

    def group_of(self, trainer: TrainerSpec) -> str:
        """Whose share the trainer counts toward: itself, its user or its account."""
        return group_key(trainer.id, trainer.user, trainer.account, self.fair_by)

    def weight_of(self, group: str) -> float:
        """A group's weight (1 by trainer, or when the group is not listed)."""
        return 1.0 if self.fair_by == "trainer" else float(self.fair_weights.get(group, 1.0))


def _pool_set(pool: Sequence[str]) -> frozenset[str]:
    """``frozenset(pool)``; the last valid pool's set when ``pool`` is an equal tuple."""
    if _LAST_POOL and type(pool) is tuple:
        last, its_set = _LAST_POOL[0]
        if pool is last or pool == last:
            return its_set
    return frozenset(pool)


def _usual_windows(windows: Mapping[str, float | None], pool: frozenset[str]) -> bool:
    """True when every window is valid the usual way (a pool node, None or a finite float
    >= 0): one set operation and one cheap pass instead of a check per node (a replay
    states about a hundred windows a decision).
    False sends the windows through the node-by-node checks, which name the fault."""
    if not pool.issuperset(windows):
        return False
    return all(w is None or (type(w) is float and 0.0 <= w < math.inf) for w in windows.values())


def group_key(trainer_id: str, user: str, account: str, fair_by: str) -> str:
    """The fairness group of a trainer: one of its id, its user or its account."""
    return {"trainer": trainer_id, "user": user, "account": account}[fair_by]


def fair_admission(groups: Sequence[str], limit: int) -> list[int]:
    """The positions (in arrival order) of the ``limit`` trainers that take part, when
    trainers in arrival order belong to ``groups``: round by round, each group's next
    trainer, the earliest first, so one group's many trainers do not keep another's
    first one waiting. With one trainer per group: the first ``limit``."""
    rank: dict[str, int] = {}
    keyed = []
    for i, g in enumerate(groups):
        keyed.append((rank.get(g, 0), i))
        rank[g] = rank.get(g, 0) + 1
    return sorted(i for _, i in sorted(keyed)[:limit])


def _check_curve(curve: tuple[tuple[float, float], ...], where: str, name: str, n_max: int) -> None:
    """Breakpoints (count, value): counts increasing, value 0 at 0, reaching n_max."""
    key = (id(curve), name, n_max)
    if _VALID_CURVES.get(key) is curve:
        return
    _check_curve_points(curve, where, name, n_max)
    if type(curve) is tuple and all(type(p) is tuple for p in curve):  # immutable
        if len(_VALID_CURVES) >= _VALID_CURVES_MAX:
            _VALID_CURVES.clear()
        _VALID_CURVES[key] = curve


def _check_curve_points(
    curve: tuple[tuple[float, float], ...], where: str, name: str, n_max: int
) -> None:
    if not curve:
        raise ProblemError(f"{where}: {name} is empty")
    previous = 0.0
    for i, point in enumerate(curve):
        if len(point) != 2:
            raise ProblemError(f"{where}: {name}[{i}] is {point!r}, expected [nodes, value]")
        n, v = point
        _check_number(n, f"{where}: {name}[{i}] nodes", minimum=0.0, maximum=NODES_MAX)
        _check_number(v, f"{where}: {name}[{i}] value", minimum=0.0, maximum=CURVE_VALUE_MAX)
        if i and n <= previous:
            raise ProblemError(
                f"{where}: {name} node counts must increase, got {n} after {previous}"
            )
        if n == 0 and v != 0:
            raise ProblemError(f"{where}: {name} value at 0 nodes must be 0, got {v}")
        previous = n
    if curve[-1][0] < n_max:
        raise ProblemError(f"{where}: {name} ends at {curve[-1][0]} nodes, below n_max {n_max}")


def _check_holdings(trainers: tuple[TrainerSpec, ...], slots: int) -> None:
    """No trainer holds more slots of a node than it has, nor trainers together."""
    if slots == 1:
        held_once = list(chain.from_iterable(t.nodes for t in trainers))
        if len(set(held_once)) == len(held_once):
            return  # no node twice: nothing below can fail
    holder: dict[str, str] = {}
    held: dict[str, int] = {}
    for t in trainers:
        mine: dict[str, int] = {}
        for node in t.nodes:
            mine[node] = mine.get(node, 0) + 1
            if mine[node] > slots:
                if slots == 1:
                    raise ProblemError(f"trainer {t.id!r}: nodes lists a node twice")
                raise ProblemError(
                    f"trainer {t.id!r}: holds {mine[node]} slots of node {node!r}, "
                    f"more than its {slots}"
                )
            if slots == 1 and node in holder:
                raise ProblemError(
                    f"node {node!r} is held by two trainers: {holder[node]!r} and {t.id!r}"
                )
            holder.setdefault(node, t.id)
        for node, k in mine.items():
            held[node] = held.get(node, 0) + k
            if held[node] > slots:
                raise ProblemError(
                    f"node {node!r} has {slots} slots; trainers up to {t.id!r} hold {held[node]}"
                )


_TOP_FIELDS = {
    "pool",
    "t_fwd",
    "objective",
    "trainers",
    "max_trainers",
    "fairness_p",
    "fair_share_speedup",
    "windows",
    "fair_by",
    "fair_weights",
    "slots_per_node",
}
_TRAINER_FIELDS = {
    "id",
    "n_min",
    "n_max",
    "rescale_up",
    "rescale_down",
    "nodes",
    "curve",
    "user",
    "account",
    "spread_curve",
}
_TRAINER_REQUIRED = _TRAINER_FIELDS - {"nodes", "user", "account", "spread_curve"}


def problem_from_dict(data: Any) -> Problem:
    """Build a :class:`Problem` from the JSON document of ``bftrainer allocate``."""
    if not isinstance(data, Mapping):
        raise ProblemError("the problem must be a JSON object")
    unknown = set(data) - _TOP_FIELDS
    if unknown:
        raise ProblemError(
            f"unknown field {sorted(unknown)[0]!r} (known: {', '.join(sorted(_TOP_FIELDS))})"
        )
    for name in ("pool", "trainers"):
        if name not in data:
            raise ProblemError(f"missing field {name!r}")
    pool = _string_list(data["pool"], "pool")
    raw_trainers = data["trainers"]
    if not isinstance(raw_trainers, Sequence) or isinstance(raw_trainers, str):
        raise ProblemError("trainers must be a list")
    trainers = tuple(_trainer_from_dict(i, t) for i, t in enumerate(raw_trainers))
    problem = Problem(
        pool=pool,
        trainers=trainers,
        t_fwd_s=data.get("t_fwd", DEFAULT_T_FWD_S),
        objective=data.get("objective", "throughput"),
        max_trainers=data.get("max_trainers", DEFAULT_MAX_TRAINERS),
        fairness_p=data.get("fairness_p", 1.0),
        fair_share_speedup=data.get("fair_share_speedup", False),
        windows_s=_windows(data.get("windows", {})),
        fair_by=data.get("fair_by", "trainer"),
        fair_weights=data.get("fair_weights", {}),
        slots_per_node=data.get("slots_per_node", 1),
    )
    _check_table_size(problem)
    if problem.slots_per_node == 1:
        spread = next((t for t in problem.trainers if t.spread_curve is not None), None)
        if spread is not None:
            # A value for slots spread over nodes: with whole nodes there is no spreading,
            # and the curve was accepted and ignored.
            raise ProblemError(
                f"trainer {spread.id!r}: spread_curve means nothing without slots_per_node > 1"
            )
    return problem


def _check_table_size(problem: Problem) -> None:
    """Refuse, before any work, a problem whose per-count tables (one entry per count
    0..n_max of each admitted trainer, n_max capped at the pool) would not fit in
    bounded memory: 2,000 trainers of n_max 1,000,000 on 100,000 nodes took 1.6 GB."""
    capacity = len(problem.pool) * problem.slots_per_node
    sizes = sorted((min(t.n_max, capacity) + 1 for t in problem.trainers), reverse=True)
    cells = sum(sizes[: problem.max_trainers])
    if cells > TABLE_CELLS_MAX:
        raise ProblemError(
            f"max_trainers x n_max: the admitted trainers' tables would hold {cells:,} counts "
            f"(n_max capped at the pool's {capacity:,}), over the limit of "
            f"{TABLE_CELLS_MAX:,}: admit fewer trainers or lower their n_max"
        )


def _windows(value: Any) -> dict[str, float | None]:
    if not isinstance(value, Mapping):
        raise ProblemError("windows must be an object: node -> seconds (or null: open-ended)")
    return dict(value)


def _trainer_from_dict(index: int, raw: Any) -> TrainerSpec:
    where = f"trainers[{index}]"
    if not isinstance(raw, Mapping):
        raise ProblemError(f"{where} must be an object")
    if "id" in raw:
        where = f"{where} (id {raw['id']!r})"
    unknown = set(raw) - _TRAINER_FIELDS
    if unknown:
        raise ProblemError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    missing = _TRAINER_REQUIRED - set(raw)
    if missing:
        raise ProblemError(f"{where}: missing field {sorted(missing)[0]!r}")
    if not isinstance(raw["id"], str) or not raw["id"]:
        raise ProblemError(f"{where}: id must be a non-empty string")
    points = _points(raw["curve"], where, "curve")
    spread = None
    if raw.get("spread_curve") is not None:
        spread = _points(raw["spread_curve"], where, "spread_curve")
    try:
        return TrainerSpec(
            id=raw["id"],
            n_min=raw["n_min"],
            n_max=raw["n_max"],
            rescale_up_s=raw["rescale_up"],
            rescale_down_s=raw["rescale_down"],
            curve=points,
            nodes=_string_list(raw.get("nodes", []), f"{where}: nodes"),
            user=raw.get("user", ""),
            account=raw.get("account", ""),
            spread_curve=spread,
        )
    except ProblemError as e:
        # Name the position too: ids are user text and may be unhelpful.
        raise ProblemError(f"{where}: {str(e).split(': ', 1)[-1]}") from None


def _points(curve: Any, where: str, name: str) -> tuple[tuple[Any, Any], ...]:
    if not isinstance(curve, Sequence) or isinstance(curve, str):
        raise ProblemError(f"{where}: {name} must be a list of [nodes, value] pairs")
    points = []
    for i, p in enumerate(curve):
        if not isinstance(p, Sequence) or isinstance(p, str) or len(p) != 2:
            raise ProblemError(f"{where}: {name}[{i}] is {p!r}, expected [nodes, value]")
        points.append((p[0], p[1]))
    return tuple(points)


def _string_list(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ProblemError(f"{what} must be a list of node names")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ProblemError(f"{what}[{i}] is {item!r}, expected a node name")
    return tuple(value)


def _check_number(
    value: Any, what: str, *, minimum: float, maximum: float = math.inf, open_min: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProblemError(f"{what} is {value!r}, expected a number")
    if not math.isfinite(value):
        raise ProblemError(f"{what} is {value!r}, expected a finite number")
    if value < minimum or (open_min and value == minimum):
        raise ProblemError(f"{what} is {value!r}, expected {'>' if open_min else '>='} {minimum:g}")
    if value > maximum:
        raise ProblemError(
            f"{what} is {value!r}, expected <= {maximum:g} (the allocator's limits: "
            "docs/allocator.md)"
        )


def _check_int(value: Any, what: str, *, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProblemError(f"{what} is {value!r}, expected an integer")
    if value < minimum:
        raise ProblemError(f"{what} is {value!r}, expected >= {minimum}")
    if maximum is not None and value > maximum:
        raise ProblemError(f"{what} is {value!r}, expected {minimum} to {maximum}")


def check_speedup(trainer: TrainerSpec) -> None:
    """Refuse a trainer that the speedup objective cannot value: its curve over its rate
    at 1 node would pass ``CURVE_VALUE_MAX`` (``check_divisor``). ``Problem`` runs it on
    every trainer under that objective; a workload can run it up front."""
    check_divisor(
        trainer,
        trainer.value_at(1.0),
        "the speedup objective divides its curve by its rate at 1 node",
    )


def check_divisor(
    trainer: TrainerSpec, divisor: float, what: str, top: float | None = None
) -> None:
    """Refuse a division of the trainer's values (their largest: ``top``, by default its
    curve's) by ``divisor`` (``what``) that would leave one above ``CURVE_VALUE_MAX``:
    ``top`` may be at most that many times the divisor. A divisor of 0 divides nothing
    (docs/allocator.md, "Objectives"), so it passes."""
    if divisor <= 0:
        return
    if top is None:
        top = max(v for _, v in trainer.curve)
    if top > CURVE_VALUE_MAX * divisor:
        raise ProblemError(
            f"trainer {trainer.id!r}: {what}, {divisor!r}, and its values reach {top:g}, "
            f"more than {CURVE_VALUE_MAX:g} times that (the allocator's limits: "
            "docs/allocator.md)"
        )
