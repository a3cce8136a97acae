"""Holders that fail to hold: their cause in one line, and when each node is tried again.

A holder that ends without holding its node (slurmd cannot run the job script, the node
fails to boot, the script exits at once) would otherwise be submitted again at every
poll, for ever, with nothing said but that it ended. Here a failed holder's node waits
before its next holder: twice the poll interval after the first failure, doubling with
each further one up to ``BACKOFF_MAX_S``, and forgotten once a holder of it runs. The
latest cause is what ``bftrainer status`` and the metrics show as "holders failing".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Scheduler end states (lower case, as the holders' classify gives them) that mean the
# holder failed: Slurm's FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, LAUNCH_FAILED;
# LSF's EXIT and ZOMBI.
FAILED_REASONS = frozenset(
    {"failed", "node_fail", "boot_fail", "out_of_memory", "launch_failed", "exit", "zombi"}
)
# A holder's script ends only when told (SIGTERM) or when its lease runs out: one that
# ends by itself before the daemon saw it run never held its node.
ENDED_REASONS = frozenset({"completed", "done"})
BACKOFF_MAX_S = 1800.0


def failed_to_hold(was_state: str, reason: str) -> bool:
    """Whether a holder that ended with the scheduler's ``reason`` (our state before:
    ``was_state``) failed, rather than being preempted, cancelled or timed out."""
    return reason in FAILED_REASONS or (was_state == "pending" and reason in ENDED_REASONS)


@dataclass(frozen=True)
class NodeFailing:
    """A node whose last holder failed: how many in a row, the latest's job id and
    cause, and when it is tried again (epoch s)."""

    failures: int
    job_id: str
    cause: str
    failed_s: float
    retry_s: float


class HolderBackoff:
    """Per-node exponential backoff of failed holders (see the module docstring)."""

    def __init__(self, first_s: float, max_s: float = BACKOFF_MAX_S) -> None:
        if not (math.isfinite(first_s) and first_s > 0 and max_s > 0):
            raise ValueError(f"holder backoff {first_s!r} s up to {max_s!r} s")
        self.first_s = min(first_s, max_s)  # a poll interval longer than the cap
        self.max_s = max_s
        self.nodes: dict[str, NodeFailing] = {}

    def failed(self, node: str, job_id: str, cause: str, now_s: float) -> NodeFailing:
        """Record a failed holder of ``node``; when the node is tried again."""
        failures = self.nodes[node].failures + 1 if node in self.nodes else 1
        delay_s = min(self.max_s, self.first_s * 2.0 ** min(failures - 1, 60))
        entry = NodeFailing(failures, job_id, cause, now_s, now_s + delay_s)
        self.nodes[node] = entry
        return entry

    def held(self, node: str) -> None:
        """A holder of ``node`` runs: its failures are over."""
        self.nodes.pop(node, None)

    def waiting(self, now_s: float) -> set[str]:
        """Nodes not to submit a holder for now."""
        return {n for n, f in self.nodes.items() if f.retry_s > now_s}

    def keep_only(self, nodes: set[str] | frozenset[str]) -> None:
        """Forget nodes outside ``nodes`` (they left the pool: not being tried)."""
        for n in set(self.nodes) - nodes:
            del self.nodes[n]

    def summary(self) -> dict[str, Any] | None:
        """What status shows: the latest cause, the nodes failing, and the next try
        (epoch s); None when no holder is failing."""
        if not self.nodes:
            return None
        latest = max(self.nodes.values(), key=lambda f: (f.failed_s, f.job_id))
        return {
            "cause": latest.cause,
            "job_id": latest.job_id,
            "nodes": sorted(self.nodes),
            "failures": sum(f.failures for f in self.nodes.values()),
            "next_try_s": min(f.retry_s for f in self.nodes.values()),
        }
