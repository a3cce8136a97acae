"""From a job log to the idle pool: which nodes no job held, when (docs/traces.md).

A node is idle when no job (and no down interval) holds it. One sweep over the jobs'
starts and ends, in time order, whatever order the log wrote them in:

- **Named nodes** (Slurm, LSF, PBS): a job holds exactly the nodes it names.
- **Counts only** (SWF, Cobalt): a starting job takes the lowest-numbered free nodes. A job
  that finds too few free nodes (the log over-commits the machine) holds what it finds and
  takes the rest, oldest short job first, as nodes free up. So the number of idle nodes is
  ``max(0, machine - nodes the running jobs hold)`` at every instant, exactly.
- **Repeats:** a record with the start, end, size and nodes of an earlier one is the same
  job logged twice and counts once.
- **Order:** records are taken by start, end, size, nodes and job id, whatever order the
  log has them in, so the same log always gives the same trace.
- At one instant, ends come before starts: a node passed from one job to the next is
  never idle.

Windows (``window_s``) state what the scheduler could have known when a node joined: the
plan of EASY backfill for the first queued job that does not fit in the idle nodes, from
the wall-time limits of the running jobs (its *shadow time*). The idle nodes it needs
(the lowest-numbered, the ones it would take) get the shadow time; the others, and every
node when nothing is queued, are open-ended. Without limits in the log there are none.
``idle_s``, how long each node did stay idle, is known in hindsight.

The sweep keeps one array of holders per node and touches a job's nodes as arrays, so a
year of a large machine (millions of node changes) converts in seconds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.joblog_model import JobLog, JobLogError, JobRecord
from bftrainer.idle_monitor.trace_model import Trace
from bftrainer.idle_monitor.trace_time import format_time

MAX_MACHINE_NODES = 1_000_000
Index = NDArray[np.int64]


@dataclass
class PoolFigures:
    """What the conversion met, for its one summary line (``summary_line``)."""

    jobs: int = 0
    repeated: int = 0
    over_node_s: float = 0.0
    over_peak_nodes: int = 0
    running_at_end: int = 0
    down_node_s: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)

    def summary_line(self, log: JobLog, machine: int) -> str:
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{n:,} {reason}" for reason, n in sorted(self.skipped.items()))
        line = (
            f"{log.path}: {log.format}, {self.jobs:,} jobs on {machine:,} nodes; "
            f"{self.repeated:,} records repeated another's (counted once); "
            f"{self.over_node_s / 3600:,.1f} node-hours over the machine "
            f"(peak {self.over_peak_nodes:,} nodes over); {skipped:,} records skipped"
        )
        if why:
            line += f" ({why})"
        if self.running_at_end:
            line += f"; {self.running_at_end:,} still running at the log's end"
        if self.down_node_s:
            line += f"; {self.down_node_s / 3600:,.1f} node-hours down"
        return line


@dataclass(frozen=True)
class Machine:
    """The machine's nodes, in order (counted jobs take the lowest-numbered first)."""

    names: tuple[str, ...]

    @staticmethod
    def counted(n: int) -> Machine:
        width = len(str(n - 1))
        return Machine(tuple(f"n{i:0{width}d}" for i in range(n)))


@dataclass
class Flip:
    """One instant at which some nodes' idleness changed.

    ``joined``/``left`` are machine indices. Joined nodes with an index up to
    ``window_upto`` have the window ``window_s`` (the rest are open-ended); ``idle_s`` is
    how long each joined node stayed idle (NaN: to the log's end)."""

    time_s: float
    joined: Index
    left: Index
    window_s: float | None = None
    window_upto: int = -1
    idle_s: NDArray[np.float64] = field(default_factory=lambda: np.empty(0))


@dataclass
class PoolFlips:
    """The sweep's result: the first flip is the snapshot (its ``joined`` are idle then)."""

    machine: Machine
    start_s: float
    end_s: float
    flips: list[Flip]
    source: str

    def trace(self, start_s: float | None = None, end_s: float | None = None) -> Trace:
        """The pool as a ``Trace`` (windows as the plan stated them), from ``start_s`` to
        ``end_s`` when given: the same trace as ``trace().slice(start_s=, end_s=)``, but
        only the range's events are made (a week of a year: 1/52 of its node changes).
        The state at ``start_s`` is folded from the flips before it as arrays."""
        names = self.machine.names
        whole = Trace(names, frozenset(), self.start_s, self.end_s, (), source=self.source)
        if start_s is not None or end_s is not None:  # the slice's own range checks
            whole.slice(start_s=start_s, end_s=end_s)
        lo = self.start_s if start_s is None else start_s
        hi = self.end_s if end_s is None else min(end_s, self.end_s)
        first = self.flips[0]
        if lo <= self.start_s:
            initial_idle = frozenset(names[k] for k in first.joined)
            initial_windows = _windows(first, names)
            rest = self.flips[1:]
        else:
            initial_idle, initial_windows, after = self._state_at(lo)
            rest = self.flips[after:]
        events = []
        for f in rest:
            if f.time_s > hi:
                break
            joined = frozenset(names[k] for k in f.joined)
            events.append(
                PoolEvent(f.time_s, joined, frozenset(names[k] for k in f.left), _windows(f, names))
            )
        return Trace(
            nodes=names,
            initial_idle=initial_idle,
            start_s=lo,
            end_s=hi,
            events=tuple(events),
            initial_windows_s=initial_windows,
            source=self.source,
        )

    def _state_at(self, lo: float) -> tuple[frozenset[str], dict[str, float | None], int]:
        """The idle nodes at ``lo`` (a flip at ``lo`` included), their windows carried
        forward to ``lo`` in the order ``Trace.slice`` gives them (by the flip that
        stated them, then node), and the index of the first flip after ``lo``."""
        names = self.machine.names
        size = len(names)
        idle = np.zeros(size, bool)
        window = np.full(size, np.nan)  # the window stated at the node's join, if any
        stated_s = np.zeros(size)
        stated_at = np.full(size, -1, np.int64)  # the flip that stated it
        after = len(self.flips)
        for i, f in enumerate(self.flips):
            if f.time_s > lo and i:
                after = i
                break
            idle[f.joined] = True
            idle[f.left] = False
            window[f.left] = np.nan
            if f.window_s is not None:
                told = f.joined[f.joined <= f.window_upto]
                window[told] = f.window_s
                stated_s[told] = f.time_s
                stated_at[told] = i
        have = np.flatnonzero(idle & ~np.isnan(window))
        have = have[np.lexsort((have, stated_at[have]))]
        carried = np.maximum(0.0, window[have] - (lo - stated_s[have]))
        windows: dict[str, float | None] = {
            names[k]: float(x) for k, x in zip(have.tolist(), carried.tolist(), strict=True)
        }
        return frozenset(names[k] for k in np.flatnonzero(idle)), windows, after


def _windows(f: Flip, names: tuple[str, ...]) -> dict[str, float | None]:
    if f.window_s is None:
        return {}
    return {names[k]: f.window_s for k in f.joined if k <= f.window_upto}


@dataclass
class _Job:
    record: JobRecord
    end_s: float
    idx: Index | None = None  # its named nodes
    held: Index = field(default_factory=lambda: np.empty(0, np.int64))
    short: int = 0
    down: bool = False


class _Sweep:
    """The sweep's state: how many jobs hold each node, and the jobs still short."""

    def __init__(self, names: tuple[str, ...], strict: bool) -> None:
        self.names = names
        self.holders = np.zeros(len(names), np.int32)
        self.short_jobs: deque[_Job] = deque()
        self.shortfall = 0
        self.strict = strict

    def take(self, job: _Job, t: float) -> None:
        if job.idx is not None:
            if self.strict and not job.down and bool(np.any(self.holders[job.idx] > 0)):
                k = int(job.idx[np.argmax(self.holders[job.idx] > 0)])
                _over(t, job.record, f"node {self.names[k]}")
            self.holders[job.idx] += 1
            job.held = job.idx
            return
        job.short = job.record.node_count
        self._fill(job)
        if job.short:
            if self.strict and not job.down:
                _over(t, job.record, f"{job.short:,} of its {job.record.node_count:,} nodes")
            self.shortfall += job.short
            self.short_jobs.append(job)

    def _fill(self, job: _Job) -> int:
        free = np.flatnonzero(self.holders == 0)[: job.short]
        if free.size:
            self.holders[free] += 1
            job.held = np.concatenate((job.held, free)) if job.held.size else free
            job.short -= free.size
        return int(free.size)

    def release(self, job: _Job) -> None:
        if job.held.size:
            self.holders[job.held] -= 1
        self.shortfall -= job.short
        job.short = 0

    def top_up(self) -> None:
        """Short jobs, oldest first, take the nodes that freed up."""
        while self.short_jobs:
            job = self.short_jobs[0]
            if job.short:
                self.shortfall -= self._fill(job)
            if job.short:
                return
            self.short_jobs.popleft()

    def over_nodes(self) -> int:
        """Nodes beyond the machine now: second holders of a node, and shortfalls."""
        busy = self.holders > 1
        extra = int((self.holders[busy] - 1).sum()) if busy.any() else 0
        return extra + self.shortfall


def _over(t: float, rec: JobRecord, what: str) -> None:
    raise JobLogError(
        f"{rec.where}: job {rec.job_id} starts at {format_time(t)} on {what} that running "
        "jobs already hold: the log over-commits the machine (--strict)"
    )


def build_pool(
    log: JobLog,
    machine: Machine,
    down: Sequence[JobRecord] = (),
    *,
    strict: bool = False,
) -> tuple[PoolFlips, PoolFigures]:
    """The pool of ``log`` on ``machine`` and the figures of its summary line."""
    records = _deduplicated(log.records, strict)
    index = {n: i for i, n in enumerate(machine.names)}
    _check_nodes([*records, *down], index, len(machine.names))
    finite_ends = [r.end_s for r in records if math.isfinite(r.end_s)]
    log_end = max([*finite_ends, *(r.start_s for r in records)])
    start = min(r.start_s for r in records)
    jobs = [_job(r, log_end, index) for r in records]
    jobs += [_job(r, log_end, index, down=True) for r in down if r.start_s < log_end]
    figures = PoolFigures(
        jobs=len(records),
        repeated=len(log.records) - len(records),
        running_at_end=sum(1 for r in records if math.isinf(r.end_s)),
        skipped=dict(log.skipped.counts),
        down_node_s=sum(
            (min(r.end_s, log_end) - max(r.start_s, start)) * r.node_count
            for r in down
            if r.end_s > start and r.start_s < log_end
        ),
    )
    flips = list(_sweep(_Sweep(machine.names, strict), jobs, start, log_end, figures))
    if len(flips) < 2 and log_end <= start:
        raise JobLogError(f"{log.path}: the log spans no time")
    _add_idle_times(flips, len(machine.names))
    if any(r.requested_s for r in records):
        _add_windows(flips, records, len(machine.names))
    return PoolFlips(machine, start, log_end, flips, str(log.path)), figures


def _job(r: JobRecord, log_end: float, index: dict[str, int], down: bool = False) -> _Job:
    idx = None if r.nodes is None else np.fromiter((index[n] for n in r.nodes), np.int64)
    return _Job(r, min(r.end_s, log_end), idx=idx, down=down)


def _deduplicated(records: list[JobRecord], strict: bool) -> list[JobRecord]:
    seen: dict[tuple[object, ...], JobRecord] = {}
    out: list[JobRecord] = []
    for r in records:
        key = (r.start_s, r.end_s, r.node_count, r.nodes)
        first = seen.get(key)
        if first is not None:
            if strict:
                raise JobLogError(
                    f"{r.where}: job {r.job_id} repeats job {first.job_id} at {first.where} "
                    "(same start, end and nodes) (--strict)"
                )
            continue
        seen[key] = r
        out.append(r)
    if not out:
        raise JobLogError("no usable job (every record was skipped or repeated)")
    # A canonical order, so that which nodes a counted job takes never depends on the
    # order the log wrote its records in.
    out.sort(key=lambda r: (r.start_s, r.end_s, r.node_count, r.nodes or (), r.job_id))
    return out


def _check_nodes(records: Sequence[JobRecord], index: dict[str, int], size: int) -> None:
    for r in records:
        if r.nodes is not None:
            outside = [n for n in r.nodes if n not in index]
            if outside:
                raise JobLogError(
                    f"{r.where}: job {r.job_id} ran on {outside[0]!r}, which is not in the "
                    "machine's node list"
                )
        elif r.node_count > size:
            raise JobLogError(
                f"{r.where}: job {r.job_id} holds {r.node_count:,} nodes, more than the "
                f"machine's {size:,}"
            )


def _sweep(
    sweep: _Sweep, jobs: list[_Job], start: float, log_end: float, figures: PoolFigures
) -> Iterator[Flip]:
    """Each instant at which some node's idleness flipped; the first is the snapshot."""
    # (time, 0 = end / 1 = start, order): ends first at one instant. A job still running
    # at the log's end never ends.
    marks: list[tuple[float, int, int]] = [(j.record.start_s, 1, k) for k, j in enumerate(jobs)]
    marks += [(j.end_s, 0, k) for k, j in enumerate(jobs) if j.end_s < log_end]
    marks.sort()
    busy = np.zeros(sweep.holders.size, bool)
    over = 0
    last_s = start
    i = 0
    first = True
    while i < len(marks):
        t = marks[i][0]
        figures.over_node_s += over * (t - last_s)
        last_s = t
        ended = False
        while i < len(marks) and marks[i][0] == t:
            _, kind, k = marks[i]
            if kind == 0:
                sweep.release(jobs[k])
                ended = True
            else:
                if ended and sweep.short_jobs:
                    sweep.top_up()  # freed nodes go to short jobs before new ones
                ended = False
                sweep.take(jobs[k], t)
            i += 1
        if ended and sweep.short_jobs:
            sweep.top_up()
        now = sweep.holders > 0
        over = sweep.over_nodes()
        figures.over_peak_nodes = max(figures.over_peak_nodes, over)
        if first:
            yield Flip(t, np.flatnonzero(~now), np.empty(0, np.int64))
            first = False
        else:
            joined = np.flatnonzero(busy & ~now)
            left = np.flatnonzero(~busy & now)
            if joined.size or left.size:
                yield Flip(t, joined, left)
        busy = now
    figures.over_node_s += over * (log_end - last_s)


def _add_idle_times(flips: list[Flip], size: int) -> None:
    """Each join's idle time, from the node's next leave (a backward pass)."""
    next_leave = np.full(size, np.nan)
    for f in reversed(flips):
        f.idle_s = next_leave[f.joined] - f.time_s
        next_leave[f.left] = f.time_s


class _Queue:
    """Running and queued jobs as the sweep's clock moves (for the scheduler's plan)."""

    def __init__(self, records: Sequence[JobRecord]) -> None:
        self.by_start = sorted(records, key=lambda r: r.start_s)
        self.by_submit = sorted(
            (r for r in records if r.submit_s is not None and r.submit_s < r.start_s),
            key=lambda r: (r.submit_s, r.start_s),
        )
        self.next_start = 0
        self.next_submit = 0
        self.running: list[tuple[float, int, JobRecord]] = []  # a heap by true end
        self.queued: list[JobRecord] = []  # submitted; those started since are skipped
        self.calls = 0

    def advance(self, t: float) -> None:
        while self.next_start < len(self.by_start) and self.by_start[self.next_start].start_s <= t:
            r = self.by_start[self.next_start]
            heapq.heappush(self.running, (r.end_s, self.next_start, r))
            self.next_start += 1
        while self.running and self.running[0][0] <= t:
            heapq.heappop(self.running)
        while self.next_submit < len(self.by_submit):
            r = self.by_submit[self.next_submit]
            if r.submit_s is None or r.submit_s > t:
                break
            self.queued.append(r)
            self.next_submit += 1
        self.calls += 1
        if self.calls % 256 == 0:
            self.queued = [r for r in self.queued if r.start_s > t]

    def plan(self, t: float, idle_now: int) -> tuple[float | None, int]:
        """(shadow time or None, idle nodes the first job that must wait needs then)."""
        head = next((r for r in self.queued if r.start_s > t and r.node_count > idle_now), None)
        if head is None:
            return None, 0
        ends = sorted(
            (max(t, r.start_s + r.requested_s) if r.requested_s else math.inf, r.node_count)
            for _, _, r in self.running
        )
        freed = 0
        for end_s, count in ends:
            if math.isinf(end_s):
                return None, 0  # a running job with no limit: the plan is unknown
            freed += count
            if idle_now + freed >= head.node_count:
                return end_s, max(0, head.node_count - freed)
        return None, 0


def _add_windows(flips: list[Flip], records: Sequence[JobRecord], size: int) -> None:
    """The plan's window for each flip's joined nodes (the module docstring)."""
    queue = _Queue(records)
    idle = np.ones(size, bool)
    for n, f in enumerate(flips):
        if n == 0:
            idle[:] = False
        idle[f.joined] = True
        idle[f.left] = False
        queue.advance(f.time_s)
        if not f.joined.size:
            continue
        idle_now = int(idle.sum())
        shadow_s, needed = queue.plan(f.time_s, idle_now)
        if shadow_s is None or needed == 0:
            continue
        f.window_s = shadow_s - f.time_s
        f.window_upto = int(np.flatnonzero(idle)[needed - 1])
