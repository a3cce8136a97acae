"""Per-trainer objective terms: the only place an objective metric enters the model.

Every formulation maximises Eq. 16 of the BFTrainer paper,

    T_fwd * sum_j O_j(N_j)  -  sum_j O_j(C_j) * R_j,

where O_j is a per-trainer value table (breakpoints, linear between them). A metric
(throughput, speedup, goodput) or a fairness transform changes only O_j, here; the
constraints never change. That is why a new objective is one function in this file.

The table is built in three steps (``docs/allocator.md``, "Objectives"):
1. the metric's curve: throughput as given, speedup over the 1-node value, or the goodput
   curve the trainer's Pollux model reported;
2. optionally, speedup over the trainer's fair share (Pollux): divided by its value at
   an equal share of the pool;
3. Pollux's fairness knob p: maximising the power mean (1/J sum_j s_j^p)^(1/p) is
   maximising sum_j f_p(s_j) with f_p(s) = ((s + e)^p - e^p) / p (log((s + e) / e) at
   p = 0), a per-trainer transform. p = 1 is the plain sum (f is the identity); p < 1
   favours the trainers that have least. The floor e (``SPEEDUP_FLOOR``) keeps a trainer
   with no nodes finite for p <= 0: it waits rather than making the model infeasible.
   Tabulated at every whole count, which is all an allocation can take.

Fair by user or account (``Problem.fair_by``): the power mean is taken over groups
(users or accounts) of weight w_u, each group's value being its trainers' total. That
sum inside f_p would tie a group's trainers together; instead each trainer of a group
of k_u admitted trainers is valued as its group would be if all its trainers did as
well: (w_u / k_u) f_p(k_u s_j / w_u) (with fair share: (w_u / k_u) f_p(s_j), the fair
share being the group's w_u / sum w of the pool split among its k_u trainers). The
objective stays a sum of per-trainer tables, so every formulation and the DP stay exact
for it; it equals w_u f_p(S_u / w_u) of the group's total S_u when the group's trainers
do equally well, and is below it otherwise (f_p is concave): within a group, the same p
evens out its own trainers too. By trainer, each trainer is a group of one of weight 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bftrainer.milp.problem import (
    Problem,
    ProblemError,
    TrainerSpec,
    check_divisor,
    fair_admission,
)
from bftrainer.milp.slot_packing import DEFAULT_SPREAD_PENALTY, is_packed, packable_counts


@dataclass(frozen=True)
class TrainerTerms:
    """One admitted trainer reduced to plain numbers for the models.

    ``bp_nodes``/``bp_value``: breakpoints of O_j from (0, 0) to ``n_max``, the trainer's
    limit capped at the pool size. ``runnable`` is false when the pool cannot reach
    ``n_min``: the trainer then gets 0 nodes.
    """

    id: str
    n_min: int
    n_max: int
    current: tuple[str, ...]
    bp_nodes: np.ndarray
    bp_value: np.ndarray
    rescale_up_s: float
    rescale_down_s: float
    runnable: bool
    current_value: float  # O_j(C_j), from the full curve: the rate a rescale interrupts
    # Slots (S > 1 only; docs/allocator.md, "Slots"): O_j at every count 0..n_max when
    # packed and when spread, and which counts the current holding can pack / spread.
    slots_per_node: int = 1
    packed_value: np.ndarray | None = None
    spread_value: np.ndarray | None = None
    can_pack: np.ndarray | None = None
    can_spread: np.ndarray | None = None
    _scores: dict[float, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _count_values: list[np.ndarray] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @property
    def c(self) -> int:
        """C_j: current nodes still in the pool."""
        return len(self.current)

    def value(self, n: float | np.ndarray) -> np.ndarray:
        """O_j(n), linear between breakpoints."""
        return np.interp(n, self.bp_nodes, self.bp_value)

    def scores(self, t_fwd_s: float) -> np.ndarray:
        """Eq. 16's term for every count 0..n_max; -inf where 0 < n < n_min.

        Exact at integer counts, which is all a node allocation can take: this is the
        table the dynamic program maximises and the tests' oracle. Computed once per
        ``t_fwd_s`` and read-only: the allocator reads it for every check.
        """
        cached = self._scores.get(t_fwd_s)
        if cached is not None:
            return cached
        if self.packed_value is not None:  # slots: the best placement this holding allows
            assert self.spread_value is not None and self.can_pack is not None
            values = np.where(self.can_pack, self.packed_value, self.spread_value)
        else:
            values = self.count_values()
        s = self.eq16_terms(t_fwd_s, values)
        check_table(self.id, s)
        if len(self._scores) >= SCORES_KEPT:  # terms outlive a decision (build_terms'
            del self._scores[next(iter(self._scores))]  # cache); T_fwd "auto" moves
        self._scores[t_fwd_s] = s
        return s

    def count_values(self) -> np.ndarray:
        """O_j at every whole count 0..n_max, computed once (read-only): the window-aware
        allocation reads it for every node map it values."""
        if self._count_values:
            return self._count_values[0]
        values = np.asarray(self.value(np.arange(self.n_max + 1)), dtype=float)
        values.flags.writeable = False
        self._count_values.append(values)
        return values

    def eq16_terms(self, t_fwd_s: float, values: np.ndarray) -> np.ndarray:
        """Eq. 16's term at every count for these values (slots)."""
        c = self.c  # slices, not masks: the same entries, a fifth of the time
        s = t_fwd_s * values
        s[c + 1 :] -= self.current_value * self.rescale_up_s
        s[:c] -= self.current_value * self.rescale_down_s
        s[1 : self.n_min] = -np.inf
        if not self.runnable:
            s[1:] = -np.inf
        s.flags.writeable = False
        return s

    def low_scores(self, t_fwd_s: float) -> np.ndarray:
        """Slots: Eq. 16's term at the worst placement of each count (spread where it
        can be), which every placement reaches; ``scores`` at S = 1."""
        if self.packed_value is None:
            return self.scores(t_fwd_s)
        assert self.spread_value is not None and self.can_spread is not None
        return self.eq16_terms(
            t_fwd_s, np.where(self.can_spread, self.spread_value, self.packed_value)
        )

    def placed_score(self, t_fwd_s: float, holding: tuple[str, ...]) -> float:
        """Eq. 16's term of this exact holding (its count, packed or spread)."""
        k = len(holding)
        if self.packed_value is None or k == 0:
            return float(self.scores(t_fwd_s)[k])
        assert self.spread_value is not None
        packed = is_packed(holding, self.slots_per_node)
        table = self.packed_value if packed else self.spread_value
        return float(self.eq16_terms(t_fwd_s, table)[k])


ValueCurve = Callable[[TrainerSpec], tuple[tuple[float, float], ...]]


def _as_given(t: TrainerSpec) -> tuple[tuple[float, float], ...]:
    return t.curve


def _speedup(t: TrainerSpec) -> tuple[tuple[float, float], ...]:
    # The paper's "scaling efficiency": the curve over its 1-node value, so a model
    # that is slow per sample weighs as much as a fast one.
    one = t.value_at(1.0)
    if one <= 0:
        return tuple((n, 0.0) for n, _ in t.curve)
    return tuple((n, v / one) for n, v in t.curve)


# A goodput curve arrives already computed by the trainer's Pollux model (the trainer
# reports it), so the allocator takes it as given.
VALUE_CURVES: dict[str, ValueCurve] = {
    "throughput": _as_given,
    "speedup": _speedup,
    "goodput": _as_given,
}


SPEEDUP_FLOOR = 0.05


def fairness_transform(values: np.ndarray, p: float) -> np.ndarray:
    """f_p above: increasing, 0 at 0, the identity at p = 1."""
    if p == 1.0:
        return values
    e = SPEEDUP_FLOOR
    log_gain = np.log((values + e) / e)
    if p == 0.0:
        return log_gain
    if abs(p) >= 1e-3:  # as ever (the figures of before, to the last bit)
        return ((values + e) ** p - e**p) / p
    # Near 0, ((s + e)^p - e^p) / p as e^p expm1(p log((s + e) / e)) / p: the same
    # function, without the cancellation that made it 0 everywhere for p within ~1e-16
    # of 0 (p = 1e-300 gave every trainer 0 nodes); as p -> 0 it tends to p = 0's log.
    return e**p * np.expm1(p * log_gain) / p


def check_table(trainer_id: str, table: np.ndarray) -> None:
    """Refuse a value table holding NaN or +inf (no sum over it means anything); -inf is
    what a count below n_min is worth. Problem's limits keep them out: a last guard."""
    if not (table < np.inf).all():
        raise ProblemError(f"trainer {trainer_id!r}: its objective table holds NaN or +inf")


def _value_table(
    problem: Problem, t: TrainerSpec, share: float, group: tuple[int, float] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Steps 1-3 of the module docstring: breakpoints of O_j over 0..curve end.

    ``group``: (k_u, w_u) of the trainer's group when fair by user or account."""
    xs, ys = _metric_points(problem, t)
    if problem.fair_share_speedup:
        at_share = _at_share(t, share, xs, ys)
        _check_share_divisor(t, share, at_share, float(ys.max()))
        ys = ys / at_share if at_share > 0 else ys
    if problem.fairness_p != 1.0:  # f_p is not linear: tabulate at every whole count
        grid = np.arange(int(np.ceil(xs[-1])) + 1, dtype=float)
        xs, ys = grid, np.interp(grid, xs, ys)
    return xs, _fair(ys, problem, group)


def _metric_points(problem: Problem, t: TrainerSpec) -> tuple[np.ndarray, np.ndarray]:
    """Step 1: the metric's breakpoints, from (0, 0)."""
    curve = VALUE_CURVES[problem.objective](t)
    xs = np.array([0.0] + [float(n) for n, _ in curve if n > 0])
    ys = np.array([0.0] + [float(v) for n, v in curve if n > 0])
    return xs, ys


def _at_share(t: TrainerSpec, share: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Step 2's divisor: the metric at the fair share, within n_min..n_max."""
    return float(np.interp(_share_count(t, share), xs, ys))


def _share_count(t: TrainerSpec, share: float) -> float:
    return min(max(share, t.n_min), t.n_max)


def _check_share_divisor(t: TrainerSpec, share: float, at_share: float, top: float) -> None:
    """Step 2 divides values reaching ``top`` by ``at_share``: refuse (``ProblemError``,
    naming the trainer) one that would pass the curve limit (docs/allocator.md,
    "Limits"); the speedup's own divisor is checked by ``Problem``."""
    check_divisor(
        t,
        at_share,
        f"fair-share speedup divides its values by its value at its fair share of "
        f"{_share_count(t, share):g}",
        top,
    )


def _fair(values: np.ndarray, problem: Problem, group: tuple[int, float] | None) -> np.ndarray:
    """Step 3 on values at whole counts: f_p, and by user or account the value of the
    trainer's group (k_u, w_u) as if all its trainers did as well, (w/k) f_p(k v / w)."""
    if group is None:
        return fairness_transform(values, problem.fairness_p)
    k, w = group
    if problem.fair_share_speedup:
        inner = 1.0  # already relative to the group's share
    elif problem.fairness_p == 1.0:
        return values  # (w/k) (k/w) v: the plain sum, whoever owns what
    else:
        inner = k / w
    return fairness_transform(values * inner, problem.fairness_p) * (w / k)


def admitted(problem: Problem) -> tuple[tuple[TrainerSpec, ...], tuple[TrainerSpec, ...]]:
    """The ``max_trainers`` that take part, the rest wait: first come, first served by
    trainer; by user or account, round by round across groups (``fair_admission``)."""
    k = problem.max_trainers
    if problem.fair_by == "trainer":
        return problem.trainers[:k], problem.trainers[k:]
    chosen = set(fair_admission([problem.group_of(t) for t in problem.trainers], k))
    taking_part = tuple(t for i, t in enumerate(problem.trainers) if i in chosen)
    waiting = tuple(t for i, t in enumerate(problem.trainers) if i not in chosen)
    return taking_part, waiting


# Score tables a terms object keeps, one per T_fwd, the oldest out first: a decision reads
# one or two, and terms reused across decisions (below) would otherwise keep one for every
# T_fwd that "auto" took while their trainer was unchanged.
SCORES_KEPT = 4

# The terms built for a spec (the very object: a spec is immutable, and the replay's
# policy hands the same one to consecutive decisions while its trainer is unchanged),
# with everything else they were built from (_terms_key). A hit is the same terms, its
# score tables included (TrainerTerms.scores keeps them per T_fwd): rebuilding them was
# a quarter of a replay's decision. The oldest entry goes first when full.
_TERMS: dict[int, tuple[TrainerSpec, tuple[object, ...], TrainerTerms]] = {}
_TERMS_MAX = 4096


def build_terms(problem: Problem) -> list[TrainerTerms]:
    """The objective terms of the admitted trainers, in arrival order."""
    if problem.slots_per_node > 1:
        return _slot_terms(problem)
    pool_size = len(problem.pool)
    taking_part = admitted(problem)[0]
    terms = []
    for t, (share, group) in zip(
        taking_part, _shares(problem, taking_part, pool_size), strict=True
    ):
        current = problem.current_nodes(t)
        key = _terms_key(problem, t, share, group, current)
        known = _TERMS.get(id(t))
        if known is not None and known[0] is t and known[1] == key:
            terms.append(known[2])
            continue
        made = _terms(problem, t, share, group, current)
        if len(_TERMS) >= _TERMS_MAX:
            del _TERMS[next(iter(_TERMS))]
        _TERMS.pop(id(t), None)  # re-inserted last: the newest
        _TERMS[id(t)] = (t, key, made)
        terms.append(made)
    return terms


def _terms_key(
    problem: Problem,
    t: TrainerSpec,
    share: float,
    group: tuple[int, float] | None,
    current: tuple[str, ...],
) -> tuple[object, ...]:
    """All that ``_terms`` reads besides the spec: n_max as capped by the pool, the
    objective's settings, the share (read with fair_share_speedup only), the group and
    the nodes held in the pool."""
    return (
        min(t.n_max, len(problem.pool)),
        problem.objective,
        problem.fairness_p,
        problem.fair_share_speedup,
        share if problem.fair_share_speedup else None,
        group,
        current,
    )


def _terms(
    problem: Problem,
    t: TrainerSpec,
    share: float,
    group: tuple[int, float] | None,
    current: tuple[str, ...],
) -> TrainerTerms:
    """One admitted trainer's terms (S = 1), holding ``current``."""
    n_max = min(t.n_max, len(problem.pool))
    runnable = t.n_min <= n_max
    if not runnable:
        n_max = 0
    full_n, full_v = _value_table(problem, t, share, group)
    if t.weight != 1.0:  # promise: w_j O_j (TrainerSpec.weight)
        full_v = full_v * t.weight
    bp_n, bp_v = _clip_breakpoints(full_n, full_v, n_max)
    return TrainerTerms(
        id=t.id,
        n_min=t.n_min,
        n_max=n_max,
        current=current,
        bp_nodes=bp_n,
        bp_value=bp_v,
        rescale_up_s=float(t.rescale_up_s),
        rescale_down_s=float(t.rescale_down_s),
        runnable=runnable,
        current_value=float(np.interp(len(current), full_n, full_v)),
    )


def _shares(
    problem: Problem, taking_part: tuple[TrainerSpec, ...], capacity: int
) -> list[tuple[float, tuple[int, float] | None]]:
    """Each admitted trainer's fair share of ``capacity`` (nodes, or slots) and, by user
    or account, its group's (k_u admitted trainers, weight w_u); by trainer, None."""
    if problem.fair_by == "trainer":
        return [(capacity / max(len(taking_part), 1), None)] * len(taking_part)
    sizes: dict[str, int] = {}
    for t in taking_part:
        g = problem.group_of(t)
        sizes[g] = sizes.get(g, 0) + 1
    total_weight = sum(problem.weight_of(g) for g in sizes)
    out: list[tuple[float, tuple[int, float] | None]] = []
    for t in taking_part:
        g = problem.group_of(t)
        k, w = sizes[g], problem.weight_of(g)
        out.append((capacity * w / total_weight / k, (k, w)))  # the group's, split in k
    return out


def _slot_terms(problem: Problem) -> list[TrainerTerms]:
    """The terms with slots (S > 1): the unit is a slot; O_j packed and spread at every
    count, through the same metric and fairness steps as ``_value_table``, shares and
    group sizes counted in slots (|pool| x S)."""
    S = problem.slots_per_node
    capacity = len(problem.pool) * S
    taking_part = admitted(problem)[0]
    terms = []
    for t, (share, group) in zip(taking_part, _shares(problem, taking_part, capacity), strict=True):
        n_max = min(t.n_max, capacity)
        runnable = t.n_min <= n_max
        if not runnable:
            n_max = 0
        current = problem.current_nodes(t)
        packed, spread = _slot_values(problem, t, share, max(n_max, len(current)), group)
        c = len(current)
        current_value = float(packed[c] if is_packed(current, S) else spread[c])
        terms.append(
            TrainerTerms(
                id=t.id,
                n_min=t.n_min,
                n_max=n_max,
                current=current,
                bp_nodes=np.arange(n_max + 1, dtype=float) if n_max else np.array([0.0, 1.0]),
                bp_value=packed[: n_max + 1] if n_max else np.array([0.0, 0.0]),
                rescale_up_s=float(t.rescale_up_s),
                rescale_down_s=float(t.rescale_down_s),
                runnable=runnable,
                current_value=current_value,
                slots_per_node=S,
                packed_value=packed[: n_max + 1],
                spread_value=spread[: n_max + 1],
                can_pack=packable_counts(current, n_max, S),
                can_spread=-(-np.arange(n_max + 1) // S) < np.arange(n_max + 1),
            )
        )
    return terms


def _slot_values(
    problem: Problem,
    t: TrainerSpec,
    share: float,
    top: int,
    group: tuple[int, float] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """O_j packed and spread at counts 0..top (spread never above packed).

    ``group``: (k_u, w_u) of the trainer's group when fair by user or account, applied
    as in ``_value_table``."""
    grid = np.arange(top + 1, dtype=float)

    def raw(curve: tuple[tuple[float, float], ...]) -> np.ndarray:
        xs = np.array([0.0] + [float(n) for n, _ in curve if n > 0])
        ys = np.array([0.0] + [float(v) for n, v in curve if n > 0])
        return np.interp(grid, xs, ys)

    packed = raw(t.curve)
    spread = (
        raw(t.spread_curve)
        if t.spread_curve is not None
        else (1.0 - DEFAULT_SPREAD_PENALTY) * packed
    )
    spread = np.minimum(spread, packed)
    norm, at_share = _slot_divisors(problem, t, share)
    if problem.fair_share_speedup:
        _check_share_divisor(t, share, at_share, max(v for _, v in t.curve) / norm)
    if at_share > 0:
        norm = norm * at_share
    packed, spread = packed / norm, spread / norm
    w = t.weight  # promise: w_j O_j (TrainerSpec.weight)
    return _fair(packed, problem, group) * w, _fair(spread, problem, group) * w


def _slot_divisors(problem: Problem, t: TrainerSpec, share: float) -> tuple[float, float]:
    """With slots: the metric's divisor (speedup: the rate at 1 slot, inf when it is 0,
    so the values are 0; else 1) and step 2's (the metric at the fair share; 1 without
    fair share)."""
    norm = 1.0
    if problem.objective == "speedup":
        one = t.value_at(1.0)
        norm = one if one > 0 else math.inf
    if not problem.fair_share_speedup:
        return norm, 1.0
    return norm, t.value_at(_share_count(t, share)) / norm


def _clip_breakpoints(xs: np.ndarray, ys: np.ndarray, n_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints from (0, 0) to ``n_max`` (interpolated there); one segment at least."""
    if n_max == 0:
        return np.array([0.0, 1.0]), np.array([0.0, 0.0])
    if n_max >= xs[-1]:
        return xs, ys
    keep = xs < n_max
    bx = np.append(xs[keep], float(n_max))
    by = np.append(ys[keep], np.interp(n_max, xs, ys))
    return bx, by


def objective_of_holdings(
    terms: list[TrainerTerms], nodes: dict[str, tuple[str, ...]], t_fwd_s: float
) -> float:
    """Eq. 16 of an allocation, each trainer at its placement (slots); at S = 1 the same
    as ``objective_of_counts``."""
    return sum(t.placed_score(t_fwd_s, nodes.get(t.id, ())) for t in terms)


def objective_of_counts(terms: list[TrainerTerms], counts: dict[str, int], t_fwd_s: float) -> float:
    """Eq. 16 for a count per trainer (missing trainers count as 0 nodes)."""
    total = 0.0
    for t in terms:
        n = counts.get(t.id, 0)
        total += float(t.scores(t_fwd_s)[n])
    return total
