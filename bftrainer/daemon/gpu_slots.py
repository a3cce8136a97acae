"""Slots per node from the scheduler's GPU counts (``--slots-per-node gres``).

The allocator takes one S per decision (docs/allocator.md, "Slots"), and the partitions
a centre lends are of one kind (Summit 6 GPUs a node, Polaris 4). So S is read once, at
start, as the GPU count most of the bf partition's nodes have (Slurm's ``Gres=gpu:N``,
LSF's ``ngpus``; on a tie, the larger count). Then, at every poll:

- a node whose count is not S, whose ``Gres`` names no GPU, or whose ``Gres`` does not
  parse is left out of the pool: it is never given slots it does not have. One warning
  line names it when it is first seen so, and one info line when it fits again;
- a held node whose count changes while trainers run on it is one warning line too, and
  leaves the pool as a preempted node does: its trainers shrink at a step boundary (no
  work is lost) and the node returns when its count is S again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import replace

from bftrainer.idle_monitor.source import PoolView

log = logging.getLogger(__name__)


class GresError(RuntimeError):
    """S cannot be read from the scheduler's GPU counts (no node has one); says so."""


def slots_from_gpus(gpus: Mapping[str, int]) -> int | None:
    """S: the GPU count most nodes have (a tie: the larger); None when none has a GPU."""
    counts = Counter(c for c in gpus.values() if c > 0)
    if not counts:
        return None
    return max(counts, key=lambda c: (counts[c], c))


class GpuSlotGate:
    """Keeps the nodes whose GPU count is not S out of the pool (module docstring)."""

    def __init__(self, slots_per_node: int) -> None:
        self.slots_per_node = slots_per_node
        self._said: dict[str, str] = {}  # node -> why it is left out, as last logged
        self._gpus: dict[str, int] = {}  # node -> its count when last seen

    def misfits(self, view: PoolView, running: Mapping[str, Set[str]]) -> dict[str, str]:
        """Node -> why it is left out, for every node the scheduler listed and every
        held one (``running``: held node -> the trainers on it). Logs each change once."""
        s = self.slots_per_node
        out: dict[str, str] = {}
        for node in sorted(set(view.gpus) | set(view.gpu_errors) | set(running)):
            count = view.gpus.get(node)
            error = view.gpu_errors.get(node)
            if error is not None:
                out[node] = f"its Gres does not parse ({error})"
            elif count is None:
                continue  # not listed in the bf partition: the holders cannot run there
            elif count == 0:
                out[node] = "it has no GPU"
            elif count != s:
                out[node] = f"it has {count} GPU(s), not the {s} of the partition's nodes"
            before = self._gpus.get(node)
            if count is not None:
                self._gpus[node] = count
            if node in out and before is not None and count != before and running.get(node):
                log.warning(
                    "%s's GPU count changed from %d to %s while %s run(s) on it: it leaves "
                    "the pool (they shrink at a step boundary; no work is lost) and returns "
                    "when it has %d again",
                    node,
                    before,
                    "?" if count is None else count,
                    ", ".join(sorted(running[node])),
                    s,
                )
                self._said[node] = out[node]
        for node, why in out.items():
            if self._said.get(node) != why:
                log.warning(
                    "%s is left out of the pool (--slots-per-node gres, %d slots): %s",
                    node,
                    s,
                    why,
                )
        for node in sorted(self._said.keys() - out.keys()):
            if node in view.gpus:
                log.info("%s has %d GPU(s) again: back in the pool", node, s)
        self._said = out
        return out

    @staticmethod
    def without(view: PoolView, nodes: Set[str]) -> PoolView:
        """The view with ``nodes`` out of the pool."""
        if not nodes & view.pool:
            return view
        return replace(
            view,
            pool=view.pool - nodes,
            windows_s={n: w for n, w in view.windows_s.items() if n not in nodes},
        )
