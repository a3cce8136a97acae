"""Seeded synthetic pool traces calibrated to the published Summit idle-node statistics.

The model is a machine of busy nodes that jobs release and take back:

- *Release events* (a job ends) come as a Poisson process; each releases a group of busy
  nodes, its size lognormal (median ~4 nodes, heavy tail: jobs span many nodes).
- *Take events* (a job starts) come as a second Poisson process.
- Each released node draws an intended idle time from a mixture (the shortest possible, or
  one of two lognormals) and is taken back by the take event nearest to its intended end,
  but at least ``min_s`` after its release. Ending idle time on take events is what keeps
  leaves grouped (~30 events/h) while fragments stay as short as the real ones.
- All events fall on the poll grid (``poll_s``), as a monitor would see them.

The parameters were fitted (see docs/traces.md) so that a 4,608-node machine shows what the
BFTrainer paper reports for Summit: ~58% of idle fragments shorter than 10 min holding ~10%
of idle node-time, median ~8 min, p90 ~56 min, mean ~20 min; ~40 events/h with joins and
~30 with leaves; ~10% of nodes idle. A trace of fewer nodes is the first nodes of a
Summit-sized machine, as the paper's 1,024-node slice; a larger one scales the rates.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass

import numpy as np

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace import Trace, parse_time_s

log = logging.getLogger(__name__)

SUMMIT_NODES = 4608
"""Summit's compute nodes: the machine size the rates are calibrated for."""
DEFAULT_NODES = SUMMIT_NODES
DEMO_NODES = 256
"""A slice small enough for the demo's solver, large enough to see a few events per hour."""
DEFAULT_START_S = parse_time_s("2021-02-10 00:00:00")
"""The Summit log's first day, so synthetic and real traces plot on one calendar."""


# Generation grows with node-hours: a Summit-month (4,608 nodes x 720 h, 2 million rows)
# took 10 s here. Past this it would run for long with nothing shown.
MAX_NODE_HOURS = SUMMIT_NODES * 8760.0


class SyntheticConfigError(ValueError):
    """A synthetic-trace option out of range; the message names it and its value."""


@dataclass(frozen=True)
class FragmentMixture:
    """Intended idle time of a released node: a mixture of lognormals, floored at ``min_s``.

    A component with ``sigma`` 0 and median ``min_s`` is the point mass "as short as
    possible": the backfill gaps that the next job start closes.
    """

    weights: tuple[float, ...]
    medians_s: tuple[float, ...]
    sigmas: tuple[float, ...]
    min_s: float

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        component = rng.choice(len(self.weights), size=size, p=np.asarray(self.weights))
        mu = np.log(np.asarray(self.medians_s))[component]
        sigma = np.asarray(self.sigmas)[component]
        return np.maximum(rng.lognormal(mu, sigma), self.min_s)


# Fitted to the published figures (docs/traces.md, "Calibration"); not to the data itself.
SUMMIT_FRAGMENTS = FragmentMixture(
    weights=(0.41, 0.30, 0.29),
    medians_s=(60.0, 585.0, 2530.0),
    sigmas=(0.0, 0.53, 0.71),
    min_s=60.0,
)


@dataclass(frozen=True)
class SyntheticConfig:
    """Options of the generator; the defaults reproduce the Summit statistics.

    Rates are per hour on a machine of ``machine_nodes``; ``nodes`` below it is a slice.
    """

    nodes: int = DEFAULT_NODES
    duration_s: float = 24 * 3600.0
    seed: int = 0
    poll_s: float = 10.0
    start_s: float = DEFAULT_START_S
    machine_nodes: int = SUMMIT_NODES
    release_events_per_h: float = 42.0
    take_events_per_h: float = 31.5
    group_median_nodes: float = 4.0
    group_sigma: float = 2.13
    fragments: FragmentMixture = SUMMIT_FRAGMENTS
    warmup_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        checks = {
            "nodes": self.nodes >= 1,
            "duration_s": self.duration_s > 0 and math.isfinite(self.duration_s),
            "poll_s": self.poll_s > 0,
            "machine_nodes": self.machine_nodes >= 1,
            "release_events_per_h": self.release_events_per_h > 0,
            "take_events_per_h": self.take_events_per_h > 0,
            "group_median_nodes": self.group_median_nodes >= 1,
            "group_sigma": self.group_sigma >= 0,
            "warmup_s": self.warmup_s >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise SyntheticConfigError(
                    f"synthetic trace option {name}={getattr(self, name)!r} is out of range"
                )
        node_hours = max(self.nodes, self.machine_nodes) * self.duration_s / 3600.0
        if node_hours > MAX_NODE_HOURS:
            raise SyntheticConfigError(
                f"a synthetic trace of {self.nodes:,} nodes for {self.duration_s / 3600:g} h "
                f"is {node_hours:.3g} node-hours (slices of a smaller machine count as "
                f"{self.machine_nodes:,} nodes); at most {MAX_NODE_HOURS:.3g}, a Summit-sized "
                "machine for a year (about 2 min to generate): fewer nodes or hours"
            )


def node_names(count: int) -> tuple[str, ...]:
    width = max(4, len(str(count - 1)))
    return tuple(f"n{i:0{width}d}" for i in range(count))


def synthetic_trace(config: SyntheticConfig | None = None) -> Trace:
    """A reproducible synthetic trace: the same config (seed included) gives the same trace."""
    cfg = config or SyntheticConfig()
    machine = max(cfg.nodes, cfg.machine_nodes)
    scale = machine / cfg.machine_nodes
    rng = np.random.default_rng(cfg.seed)
    t0 = -cfg.warmup_s  # simulated seconds relative to cfg.start_s; warm-up reaches steady state
    release = _poisson_grid(rng, cfg.release_events_per_h * scale, t0, cfg.duration_s, cfg.poll_s)
    take = _poisson_grid(rng, cfg.take_events_per_h * scale, t0, cfg.duration_s, cfg.poll_s)
    take_s = np.array(sorted(take))

    busy = list(range(machine))  # unordered: a node leaves it by swap-and-pop
    where = list(range(machine))  # where[node] = its index in `busy`, -1 when idle
    due: list[tuple[float, int]] = []  # heap of (time the node's idle time ends, node)
    names = node_names(machine)
    events: list[PoolEvent] = []
    for time_s in sorted(release | take):
        joined: list[int] = []
        if time_s in release and busy:
            size = min(len(busy), _group_size(rng, cfg, machine))
            picks = rng.choice(len(busy), size=size, replace=False)
            joined = [busy[i] for i in picks]
            for node in joined:
                _remove(busy, where, node)
            ends = _take_times(take_s, time_s, cfg.fragments.sample(rng, size), cfg.fragments.min_s)
            for node, end_s in zip(joined, ends, strict=True):
                heapq.heappush(due, (float(end_s), node))
        left: list[int] = []
        if time_s in take:
            while due and due[0][0] <= time_s:
                _, node = heapq.heappop(due)
                left.append(node)
                where[node] = len(busy)
                busy.append(node)
        if joined or left:
            events.append(
                PoolEvent(
                    cfg.start_s + time_s,
                    joined=frozenset(names[n] for n in joined),
                    left=frozenset(names[n] for n in left),
                )
            )
    full = Trace(
        nodes=names,
        initial_idle=frozenset(),
        start_s=cfg.start_s + t0,
        end_s=cfg.start_s + cfg.duration_s,
        events=tuple(events),
        source=f"synthetic(nodes={cfg.nodes}, hours={cfg.duration_s / 3600:g}, seed={cfg.seed})",
    )
    trace = full.slice(nodes=slice(0, cfg.nodes), start_s=cfg.start_s)
    log.info(
        "synthetic trace: %d nodes, %.1f h, %d events (seed %d)",
        cfg.nodes,
        cfg.duration_s / 3600,
        len(trace.events),
        cfg.seed,
    )
    return trace


def _poisson_grid(
    rng: np.random.Generator, per_h: float, t0: float, t1: float, poll_s: float
) -> set[float]:
    """Poisson event times in (t0, t1], each moved up to the next poll."""
    expected = per_h * (t1 - t0) / 3600.0
    gaps = rng.exponential(3600.0 / per_h, size=int(expected + 10 * math.sqrt(expected) + 10))
    times = t0 + np.cumsum(gaps)
    times = np.ceil(times[times <= t1] / poll_s) * poll_s
    return {float(t) for t in times if t0 < t <= t1}


def _take_times(
    take_s: np.ndarray, release_s: float, idle_s: np.ndarray, min_s: float
) -> np.ndarray:
    """For each intended idle time, the nearest take event at least ``min_s`` after release.

    Infinity when no take event that late exists: the node stays idle past the trace's end.
    """
    earliest = np.searchsorted(take_s, release_s + min_s)
    target = release_s + idle_s
    i = np.clip(np.searchsorted(take_s, target), earliest, len(take_s))
    padded = np.append(take_s, np.inf)
    after = padded[i]
    before = padded[np.maximum(i - 1, earliest)]
    use_before = (i > earliest) & (target - before < after - target)
    return np.where(use_before, before, after)


def _group_size(rng: np.random.Generator, cfg: SyntheticConfig, machine: int) -> int:
    size = rng.lognormal(math.log(cfg.group_median_nodes), cfg.group_sigma)
    return int(min(max(1.0, round(size)), machine / 2))


def _remove(busy: list[int], where: list[int], node: int) -> None:
    i = where[node]
    last = busy.pop()
    if last != node:
        busy[i] = last
        where[last] = i
    where[node] = -1
