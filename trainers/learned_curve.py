"""What the allocator may believe of a trainer's scaling: measured points and a prior.

Nobody hands a researcher's trial its throughput curve; the allocator learns it from what
the trainer measures as it runs. One rule, used by the replay's learning trainers
(``bftrainer replay --curves learned``, bftrainer/replay/learning.py) and by ``bftrainer
status`` to say which points of a live trainer's curve are measured (docs/allocator.md,
"Curves nobody gives"):

* **Measured.** Each node count a trainer has run at gives measurements of its rate
  (samples/s), each with noise; the point is their geometric mean (the noise is
  multiplicative: a step time is off by a factor, not by an amount).
* **Prior** elsewhere, Pollux's optimistic rule (OSDI'21, §4.1): between two measured
  counts, linear interpolation; below the smallest, its rate per node; above the
  largest, the measured points' scaling fit (:func:`scaling_fit`: perfect scaling from
  one point, Pollux's prior for an unseen regime; with more, what they show, never
  better than perfect scaling) through the largest measured point, up to the
  growth cap ``growth`` x the largest count run, and flat from there to n_max, so the
  allocator sees no gain in going further before the trainer has run closer. With
  nothing measured, perfect scaling at ``unmeasured_sps`` per node up to ``n_min`` (the
  cap of nothing seen).

The daemon plans on the same curve for a live trainer (``bftrainer/service/curves.py``):
its measured points are the rates its metrics records measured at each count it ran
(:func:`measured_rate_sps`), the prior the replay's default; :func:`point_sources`
labels a curve's breakpoints by the same rule either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bftrainer.common.limits import CURVE_VALUE_MAX

if TYPE_CHECKING:
    from bftrainer.trainers.metrics import MetricsRecord

MEASURED, PRIOR = "measured", "prior"
# Pollux: at most twice the largest allocation seen so far (goodput.py applies it too).
EXPLORATION_GROWTH = 2
# A growth of this much or more is no cap at all (a setting's finite spelling of inf).
NO_CAP = 1e9
# A trainer on its prior is told of a new best rate per node when it rose by 1%.
LEVEL_STEP = 1.01


@dataclass
class Measurements:
    """One trainer's measured rates, per node count (running sums of logs: memory stays
    bounded however long it runs)."""

    _log_sum: dict[int, float] = field(default_factory=dict)
    _count: dict[int, int] = field(default_factory=dict)

    def add(self, nodes: int, rate_sps: float) -> bool:
        """Record one measurement; True if ``nodes`` had none before (a new point)."""
        if nodes < 1 or not (math.isfinite(rate_sps) and rate_sps > 0):
            raise ValueError(
                f"a measurement needs nodes >= 1 and a rate > 0, got {nodes}, {rate_sps}"
            )
        new = nodes not in self._count
        self._log_sum[nodes] = self._log_sum.get(nodes, 0.0) + math.log(rate_sps)
        self._count[nodes] = self._count.get(nodes, 0) + 1
        return new

    def count(self, nodes: int) -> int:
        return self._count.get(nodes, 0)

    def mean(self, nodes: int) -> float:
        """The geometric mean at ``nodes`` (which must have a measurement)."""
        return math.exp(self._log_sum[nodes] / self._count[nodes])

    def means(self) -> dict[int, float]:
        """Node count -> the geometric mean of its measurements."""
        return {n: math.exp(self._log_sum[n] / c) for n, c in sorted(self._count.items())}


@dataclass(frozen=True)
class LearnedCurve:
    """Breakpoints ``(nodes, samples/s)`` for the allocator, and which counts are measured."""

    points: tuple[tuple[float, float], ...]
    measured: frozenset[int]

    def sources(self) -> list[str]:
        return point_sources((n for n, _ in self.points), self.measured)


def growth_cap(measured: Iterable[int], n_min: int, n_max: int, growth: float) -> int:
    """The largest count worth giving before the trainer has run closer: ``growth`` x the
    largest count measured (``n_min`` with none), within [n_min, n_max]."""
    most = max(measured, default=0)
    if growth >= NO_CAP:
        return n_max
    return min(n_max, max(n_min, math.floor(growth * most)))


def scaling_fit(measured: Mapping[int, float]) -> tuple[float, float]:
    """(a, b) of ``n / rate(n) = a + b log2(n)``: seconds per sample per node, growing with
    the synchronisation of more nodes (Pollux's step time at a fixed batch per node, its
    sync term growing as a tree all-reduce's). Least squares over the measured counts,
    a, b >= 0. Counts less than a doubling apart say nothing of the growth but their
    noise, so then b = 0: perfect scaling, Pollux's prior for what was not seen (as
    from one count)."""
    xs = [math.log2(n) for n in measured]
    ys = [n / v for n, v in measured.items()]
    if not xs:
        return 1.0, 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    if max(xs) - min(xs) < 1.0:
        return my, 0.0
    sxx = sum((x - mx) ** 2 for x in xs)
    b = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx, 0.0)
    a = my - b * mx
    if a < 0:  # the line would cross zero inside the counts: a pure log fit instead
        a, b = 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return a, b


def learned_curve(
    measured: Mapping[int, float],
    n_min: int,
    n_max: int,
    *,
    unmeasured_sps: float,
    growth: float = EXPLORATION_GROWTH,
    prior_points: Mapping[int, float] | None = None,
) -> LearnedCurve:
    """The curve the allocator plans on (see the module docstring for the rule).

    ``prior_points``: rates known from elsewhere (other trainers of the same model) at
    counts this trainer has not measured; they count as prior, and for the cap."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    if not (growth >= 1):
        raise ValueError(f"growth must be >= 1, got {growth!r}")
    own = {n: v for n, v in measured.items() if 1 <= n <= n_max}
    known = {n: v for n, v in (prior_points or {}).items() if 1 <= n <= n_max and n not in own}
    known.update(own)
    counts = sorted(known)
    cap = growth_cap(counts, n_min, n_max, growth)
    points: list[tuple[float, float]] = []
    if not counts:
        points.append((float(cap), cap * unmeasured_sps))
    else:
        a, b = scaling_fit({n: known[n] for n in counts})

        def model(n: float) -> float:
            return n / (a + b * math.log2(n))

        lo, top = counts[0], counts[-1]
        if lo > 1:  # perfect scaling down to one node: no fit reaches below what it saw
            points.append((1.0, known[lo] / lo))
        points += [(float(n), float(known[n])) for n in counts if n <= cap]
        n = top
        while n < cap:
            n = min(2 * n, cap)
            points.append((float(n), known[top] * model(n) / model(top)))
    last_n, last_v = points[-1]
    if last_n < n_max:
        points.append((float(n_max), last_v))
    # A belief the allocator can take: extrapolated past its limit on a curve's value
    # (scaling from a rate near it), the curve is flat at the limit.
    capped = tuple((n, min(v, CURVE_VALUE_MAX)) for n, v in points)
    return LearnedCurve(capped, frozenset(own))


def point_sources(nodes: Iterable[float], measured: Iterable[int]) -> list[str]:
    """``measured`` or ``prior`` for each breakpoint's node count: measured only where the
    trainer has run at exactly that count."""
    seen = set(measured)
    return [MEASURED if float(n).is_integer() and int(n) in seen else PRIOR for n in nodes]


def measured_rate_sps(record: MetricsRecord) -> float | None:
    """The rate a live trainer measured at its current count: its total batch over its
    mean step time there (None before its first timed step)."""
    step_s = record.mean_step_time_s
    return record.batch_size / step_s if step_s is not None and step_s > 0 else None


def _stored_rate_sps(record: Mapping[str, Any]) -> tuple[int, float] | None:
    """(count, rate) of a metrics record as the store keeps it (the daemon stores only
    records that parse, ``MetricsRecord.to_dict``): :func:`measured_rate_sps` read from
    its fields, without building its models (numpy, which ``bftrainer status`` does
    without). None before its first timed step, or for a record of another shape."""
    counts: list[int] = []
    for name, least in (
        ("nodes", 1),
        ("replicas_per_node", 1),
        ("local_bsz", 1),
        ("accum_steps", 0),
    ):
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return None  # as MetricsRecord.from_dict refuses it
        counts.append(value)
    step_s = record.get("mean_step_time_s")
    if isinstance(step_s, bool) or not isinstance(step_s, int | float):
        return None
    nodes, replicas, local_bsz, accum = counts
    rate = nodes * replicas * local_bsz * (accum + 1) / step_s if 0 < step_s < math.inf else 0
    return (nodes, rate) if 0 < rate < math.inf else None


def live_curve(
    records: Iterable[Mapping[str, Any]], n_max: int, n_min: int = 1
) -> list[dict[str, Any]] | None:
    """A live trainer's throughput curve as the daemon plans on it, each breakpoint
    labelled ``measured`` or ``prior`` (``bftrainer status``, ``bftrainer report``).

    ``records`` are the trainer's metrics records (trainers/metrics.py), oldest first: a
    node count is measured once a record at it carries a measured step time, its point
    the latest such record's rate (:func:`measured_rate_sps`, read from the stored
    fields); the curve is
    :func:`learned_curve` of those points, as ``bftrainer.service.curves`` gives the loop.
    None before the first measured step (the daemon then plans on the prior of a
    trainer with nothing measured, which needs every trainer's rates).
    """
    rates: dict[int, float] = {}
    for rec in records:
        measured = _stored_rate_sps(rec)
        if measured is not None:
            rates[measured[0]] = measured[1]
    if not rates:
        return None
    curve = learned_curve(rates, min(n_min, n_max), n_max, unmeasured_sps=1.0)
    return [
        {"nodes": int(n), "throughput_sps": v, "source": s}
        for (n, v), s in zip(curve.points, curve.sources(), strict=True)
    ]


def curve_summary(curve: Sequence[Mapping[str, Any]] | None) -> str:
    """``measured 1,2,4; 61 prior`` for a status table (``-``: no curve yet)."""
    if not curve:
        return "-"
    measured = [str(p["nodes"]) for p in curve if p["source"] == MEASURED]
    prior = len(curve) - len(measured)
    return f"measured {','.join(measured) or 'none'}; {prior} prior"
