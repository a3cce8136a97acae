"""The live pool: what every scheduler adapter (Slurm, LSF) shares.

A ``Scheduler`` adapter runs its commands through a ``CommandRunner`` and gives back two
plain readings: the nodes' states (``NodeStates``: which nodes exist, which are idle and
usable, which are idle but set aside) and the claims on them (``Claims``: for each node,
the earliest known time a pending job or reservation takes it). ``LivePoolSource`` turns
those into the pool and its events:

- the pool is the idle nodes not claimed within ``horizon_s``; each pool node's window is
  the seconds until its claim, or ``None`` (open-ended);
- a failing command (error, timeout, unparseable output) is logged in one line; the last
  good reading is kept and marked stale. While the claims are older than ``max_stale_s``
  (or were never read) the pool does not grow: a node that looks idle may be planned for
  a job we cannot see. Leaves are always reported, since a busy node is busy whatever
  the plan says;
- records go through the paper's ``BlipFilter``: an event only when the pool changes, and
  a node idle in one record only is not a join.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.filtering import BlipFilter
from bftrainer.idle_monitor.runner import CommandError, CommandRunner

log = logging.getLogger(__name__)


class OutputParseError(ValueError):
    """Scheduler output that does not parse; names the line number, the line and why."""

    def __init__(self, problem: str, line_no: int | None = None, line: str | None = None) -> None:
        self.problem = problem
        self.line_no = line_no
        self.line = line
        where = f"line {line_no}: " if line_no is not None else ""
        shown = f": {line[:200]!r}" if line is not None else ""
        super().__init__(f"{where}{problem}{shown}")


class CommandOutputError(CommandError):
    """A command exited 0 but printed something unparseable (a wrapped ``OutputParseError``)."""


@dataclass(frozen=True)
class NodeStates:
    """One reading of node states. ``idle``: idle and usable now; ``set_aside``: idle but
    marked by the scheduler for a coming job (Slurm ``planned``), out of the pool unless
    the claims say when it is taken."""

    time_s: float
    nodes: frozenset[str]
    idle: frozenset[str]
    set_aside: frozenset[str] = frozenset()
    # GPUs per node, read only when asked (``--slots-per-node gres``; Slurm's
    # ``Gres=gpu:N``): ``gpus`` those that parse (0: no GPU), ``gpu_errors`` why a
    # node's did not, in one line.
    gpus: Mapping[str, int] = field(default_factory=dict)
    gpu_errors: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = (self.idle | self.set_aside) - self.nodes
        if unknown:
            raise ValueError(f"idle nodes missing from the node list: {sorted(unknown)[:5]}")


@dataclass(frozen=True)
class Claims:
    """One reading of claims: node -> earliest epoch second a job or reservation takes it."""

    time_s: float
    take_back_s: Mapping[str, float] = field(default_factory=dict)


def merge_claims(*claims: Mapping[str, float]) -> dict[str, float]:
    """The earliest claim per node over several sources (pending jobs, reservations)."""
    out: dict[str, float] = {}
    for one in claims:
        for node, at_s in one.items():
            if node not in out or at_s < out[node]:
                out[node] = at_s
    return out


class Scheduler(ABC):
    """A main scheduler seen through its commands; one subclass per scheduler."""

    name: str
    gpu_field = "GPU counts"  # where it keeps a node's GPU count, for messages

    @abstractmethod
    def read_nodes(self, runner: CommandRunner, now_s: float) -> NodeStates:
        """Node states now; raises ``CommandError`` (incl. ``CommandOutputError``)."""

    @abstractmethod
    def read_claims(self, runner: CommandRunner, now_s: float) -> Claims:
        """Claims on nodes now; raises ``CommandError`` (incl. ``CommandOutputError``)."""

    def requirements(self, env: Callable[[str], str | None]) -> tuple[list[str], list[str]]:
        """The programs every poll runs and the files they need (``env`` reads the
        commands' environment), for ``CommandRunner.missing``: what can be checked
        before a first poll times out."""
        return [], []


@dataclass(frozen=True)
class PoolConfig:
    """How the pool is cut from a scheduler's readings (defaults in this one place)."""

    horizon_s: float = 300.0
    max_stale_s: float = 120.0
    filter_blips: bool = True

    def __post_init__(self) -> None:
        if not (self.horizon_s >= 0 and math.isfinite(self.horizon_s)):
            raise ValueError(f"horizon_s must be finite and >= 0, got {self.horizon_s}")
        if not self.max_stale_s >= 0:
            raise ValueError(f"max_stale_s must be >= 0, got {self.max_stale_s}")


@dataclass(frozen=True)
class Reading:
    """One record: every node, the unfiltered pool candidates, and their windows.

    This is what the recorder writes (``idle`` = in ``candidates``) and what
    ``bftrainer pool`` prints.
    """

    time_s: float
    nodes: frozenset[str]
    candidates: frozenset[str]
    windows_s: Mapping[str, float | None]
    stale_claims: bool = False
    growth_held: bool = False


@dataclass(frozen=True)
class PoolView:
    """The pool as the source knows it now (after filtering), with freshness."""

    time_s: float
    pool: frozenset[str]
    windows_s: Mapping[str, float | None]
    stale: bool
    stale_s: float
    growth_held: bool
    # Seconds until the main scheduler takes each claimed node (in the pool or not:
    # a node we hold is claimed too), from the last claims read, counted down to now.
    claims_s: Mapping[str, float] = field(default_factory=dict)
    # GPUs per node, and why a node's count did not parse, as last read (NodeStates).
    gpus: Mapping[str, int] = field(default_factory=dict)
    gpu_errors: Mapping[str, str] = field(default_factory=dict)


def cut_pool(
    states: NodeStates, claims: Mapping[str, float], now_s: float, horizon_s: float
) -> tuple[frozenset[str], dict[str, float | None]]:
    """The pool and windows from one reading: idle nodes not claimed within the horizon.

    A set-aside node stays out unless a claim tells when it is taken and that is beyond
    the horizon. A claim already due (window <= 0) always keeps a node out.
    """
    pool: set[str] = set()
    windows: dict[str, float | None] = {}
    for node in states.idle | states.set_aside:
        at_s = claims.get(node)
        if at_s is None:
            if node in states.set_aside:
                continue
            windows[node] = None
        else:
            window_s = at_s - now_s
            if window_s <= horizon_s or window_s <= 0:
                continue
            windows[node] = window_s
        pool.add(node)
    return frozenset(pool), windows


class PoolSource(Protocol):
    """What the daemon's loop asks of any live pool source."""

    def poll(self) -> PoolEvent | None:
        """Read the scheduler once; the pool event this record causes, if any."""
        ...

    def view(self) -> PoolView:
        """The current pool, windows and freshness."""
        ...


class LivePoolSource:
    """Polls a ``Scheduler`` through a runner and tracks the pool (see module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: CommandRunner,
        config: PoolConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.config = config or PoolConfig()
        self._clock = clock
        self._filter = BlipFilter()
        self._states: NodeStates | None = None
        self._claims: Claims | None = None
        self._nodes_failed_s: float | None = None  # first failure of the current streak
        self._claims_failed_s: float | None = None
        self._last_reading: Reading | None = None
        self._last_poll_s = -math.inf
        # Reads that failed since the start, by what was read ("nodes", "claims"): the
        # warnings below as numbers, for the daemon's metrics.
        self.failed_reads: Counter[str] = Counter()

    # ------------------------------------------------------------------ reading

    def read(self) -> Reading | None:
        """Run the scheduler's commands once; the unfiltered record, or None when the
        node states could not be read (the last good pool stays, marked stale)."""
        now_s = self._clock()
        self._last_poll_s = now_s
        try:
            claims = self.scheduler.read_claims(self.runner, now_s)
        except CommandError as exc:
            self.failed_reads["claims"] += 1
            if self._claims_failed_s is None:
                self._claims_failed_s = now_s
            log.warning(
                "%s claims unavailable, keeping those of %s: %s",
                self.scheduler.name,
                _age(self._claims.time_s if self._claims else None, now_s),
                exc,
            )
        else:
            self._claims, self._claims_failed_s = claims, None
        try:
            states = self.scheduler.read_nodes(self.runner, now_s)
        except CommandError as exc:
            self.failed_reads["nodes"] += 1
            if self._nodes_failed_s is None:
                self._nodes_failed_s = now_s
            log.warning(
                "%s node states unavailable, keeping the pool of %s (stale): %s",
                self.scheduler.name,
                _age(self._states.time_s if self._states else None, now_s),
                exc,
            )
            return None
        if self._nodes_failed_s is not None:
            log.info(
                "%s node states readable again after %.0f s",
                self.scheduler.name,
                now_s - self._nodes_failed_s,
            )
        self._states, self._nodes_failed_s = states, None
        # Stamp the record with when the node states were in hand, not when the poll
        # began: the claims may have taken a minute of retries before them, and a node
        # seen idle now may not have been idle then.
        read_s = max(self._clock(), now_s)
        return self._reading(replace(states, time_s=read_s), read_s)

    def _reading(self, states: NodeStates, now_s: float) -> Reading:
        claims = self._claims.take_back_s if self._claims else {}
        candidates, windows = cut_pool(states, claims, now_s, self.config.horizon_s)
        claims_age_s = now_s - self._claims.time_s if self._claims else math.inf
        held = claims_age_s > self.config.max_stale_s
        if held:
            previous = self._filter.pool if self._last_reading is not None else frozenset()
            grown = candidates - previous
            if grown:
                log.info(
                    "%s claims are %s old (limit %.0f s): not adding %d idle node(s) to the pool",
                    self.scheduler.name,
                    "never read" if math.isinf(claims_age_s) else f"{claims_age_s:.0f} s",
                    self.config.max_stale_s,
                    len(grown),
                )
            candidates = candidates & previous
            windows = {n: w for n, w in windows.items() if n in candidates}
        reading = Reading(
            time_s=now_s,
            nodes=states.nodes,
            candidates=candidates,
            windows_s=windows,
            stale_claims=self._claims_failed_s is not None or self._claims is None,
            growth_held=held,
        )
        self._last_reading = reading
        return reading

    @property
    def last_reading(self) -> Reading | None:
        return self._last_reading

    @property
    def last_poll_s(self) -> float:
        """When the last ``read`` began (-inf before the first)."""
        return self._last_poll_s

    # ------------------------------------------------------------------ pool

    def poll(self) -> PoolEvent | None:
        """One record through the blip filter; an event only when the pool changes."""
        reading = self.read()
        if reading is None:
            return None
        if self.config.filter_blips:
            event = self._filter.push(reading.time_s, reading.candidates)
        else:
            event = self._unfiltered(reading)
        if event is None:
            return None
        pool = self._filter.pool
        windows = {n: reading.windows_s.get(n) for n in sorted(pool)}
        return replace(event, windows_s=windows)

    def _unfiltered(self, reading: Reading) -> PoolEvent | None:
        # Force the filter's pool to the raw candidates: two pushes of the same record
        # confirm every join at once.
        before = self._filter.pool
        self._filter.push(reading.time_s, reading.candidates)
        self._filter.push(reading.time_s, reading.candidates)
        after = self._filter.pool
        if after == before:
            return None
        return PoolEvent(reading.time_s, joined=after - before, left=before - after)

    def view(self) -> PoolView:
        """The filtered pool now, windows counted down to this instant, and freshness."""
        now_s = self._clock()
        pool = self._filter.pool
        reading = self._last_reading
        windows: dict[str, float | None] = {}
        if reading is not None:
            for n in pool:
                w = reading.windows_s.get(n)
                windows[n] = None if w is None else max(0.0, w - (now_s - reading.time_s))
        failed = self._nodes_failed_s
        stale_s = now_s - failed if failed is not None else 0.0
        take_back = self._claims.take_back_s if self._claims else {}
        states = self._states
        return PoolView(
            time_s=reading.time_s if reading else now_s,
            pool=pool,
            windows_s=windows,
            stale=failed is not None or reading is None,
            stale_s=stale_s,
            growth_held=(reading.growth_held if reading else True)
            or stale_s > self.config.max_stale_s,
            claims_s={n: max(0.0, at_s - now_s) for n, at_s in take_back.items()},
            gpus=states.gpus if states is not None else {},
            gpu_errors=states.gpu_errors if states is not None else {},
        )


def _age(then_s: float | None, now_s: float) -> str:
    if then_s is None:
        return "never (none read yet)"
    return f"{now_s - then_s:.0f} s ago"
