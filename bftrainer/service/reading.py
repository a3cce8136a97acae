"""What a live service's metrics read: one :class:`Reading`, the daemon's and the centre
allocator's, as plain data (``bftrainer.service.metrics`` renders it for Prometheus).

Both read the same pool from the same scheduler, so they share its figures (the pool, the
nodes given to trainers, failed scheduler operations, the pool's age); what only one of
them has rides in its own part: a daemon's holders and trainers (:class:`HeldReading`),
a centre's agents and users (:class:`AgentsReading`). Counts are since the service
started. Nothing here imports the services: they import it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# What became of each request or connection, as the centre's server counts it
# (bftrainer.centre.transport; the allocator's metrics export every one, 0 included): a
# reply (``answered``; ``refused`` with the handler's reason; ``failed``: internal
# error), or a drop with one log line.
OUTCOMES = (
    "answered",
    "refused",
    "failed",
    "malformed",
    "rate_limited",
    "no_account",
    "too_many_connections",
    "no_credentials",
)


@dataclass
class HoldCounts:
    """What the holders did since the daemon started, counted where each is logged
    (plain numbers: the metrics, when enabled, read them)."""

    acquired: int = 0  # submitted and accepted by the scheduler
    preempted: int = 0  # ended by a main job
    released: int = 0  # cancelled by the daemon (pending or running)
    lost: int = 0  # ended otherwise: cancelled outside, time limit, lease, requeued
    failed: int = 0  # ended without holding: the script or the node failed
    # Scheduler operations that failed, by kind: holder_status, holder_submit,
    # holder_cancel, pool (the pool source's own failed reads are counted there).
    errors: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class HeldReading:
    """A daemon's own part: the nodes its holders keep and the trainers it runs."""

    held_nodes: int  # nodes whose holder runs: the loop's pool
    trainers: Mapping[str, int]  # by state, every state of the store
    holders: HoldCounts
    rescales: int
    # Holders failing to hold (HolderBackoff.summary: the latest cause, the nodes, the
    # next try); None: none failing.
    holders_failing: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class UserReading:
    running: int  # the user's trainers on nodes
    waiting: int  # the user's trainers without nodes (queued, or given none)
    nodes: int  # the nodes given to the user's trainers


@dataclass(frozen=True)
class AgentsReading:
    """A centre allocator's own part: its agents, their users, and the requests."""

    agents: int  # agents registered (synced within their lease)
    users: Mapping[str, UserReading]  # by user, every registered agent's
    requests: Mapping[str, int]  # by outcome (OUTCOMES)


@dataclass(frozen=True)
class Reading:
    """A live service's figures at one instant."""

    pool_nodes: int  # the idle pool the main scheduler leaves (held nodes included)
    allocated_nodes: int  # nodes given to trainers (every user's, at a centre)
    command_errors: Mapping[str, int]  # failed scheduler operations, by kind
    pool_read_s: float | None  # when the pool was last read well (epoch s; None: never)
    held: HeldReading | None = None  # a daemon's holders and trainers
    agents: AgentsReading | None = None  # a centre allocator's agents and users


class MetricsSink(Protocol):
    """Where a service's figures go when metrics are enabled (the loop never knows)."""

    def update(self, reading: Reading, latency_s: float | None) -> None:
        """The figures now, and the latency of the decision just made (None: none)."""
        ...
