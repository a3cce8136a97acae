"""Which slots of a shared node each trainer holds, kept stable while it stays there.

With S slots per node (``--slots-per-node``, docs/allocator.md "Slots") the allocator
gives a trainer slot *counts* per node: its ``nodes`` list a node once per slot. Its
workers need slot *indices*: slot k of a node is the k-th share of the node's GPUs, or
of its CPUs where it has none (``bftrainer.trainers.launch.slot_pin``). A worker is pinned
to its slot when it starts, so indices must not move: one trainer's rescale never hands
it a slot another trainer's worker runs on, nor moves another trainer's workers.

:class:`SlotBook` keeps, per trainer and node, the indices in the order the trainer got
them. Elastic Horovod numbers a host's workers by local rank 0..k-1 and, when the host's
slot count drops, stops the highest ranks (``horovod/runner/common/util/hosts.py``,
``get_host_assignments``); so the i-th slot of a trainer on a node is the one its local
rank i runs on: a shrink drops the last ones, a grow appends the lowest free ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

SlotMap = dict[str, tuple[int, ...]]


class SlotError(ValueError):
    """A trainer was given more slots of a node than the node has free (names both)."""


def host_counts(nodes: Iterable[str]) -> list[tuple[str, int]]:
    """A node list with a node once per slot, as ``(host, slots)`` (Horovod's
    ``host:slots``, torchrun's ``--nproc-per-node``), by host name."""
    return sorted(Counter(nodes).items())


class SlotBook:
    """The slot indices each trainer holds on each node (see the module docstring)."""

    def __init__(self, slots_per_node: int) -> None:
        if slots_per_node < 1:
            raise ValueError(f"slots per node must be >= 1, got {slots_per_node}")
        self.slots_per_node = slots_per_node
        self._held: dict[str, dict[str, list[int]]] = {}

    def slots(self, trainer_id: str) -> SlotMap:
        """node -> the trainer's slots there, in the order it got them."""
        return {n: tuple(s) for n, s in sorted(self._held.get(trainer_id, {}).items())}

    def holders(self, node: str) -> dict[str, tuple[int, ...]]:
        """trainer -> its slots on ``node``."""
        return {t: tuple(h[node]) for t, h in self._held.items() if node in h}

    def assign(self, trainer_id: str, nodes: Sequence[str]) -> SlotMap:
        """Give the trainer ``nodes`` (a node once per slot): it keeps the first slots
        it had on each node and gets the lowest free ones for the rest."""
        counts = Counter(nodes)
        self._shrink(trainer_id, counts)
        self._grow(trainer_id, counts)
        return self.slots(trainer_id)

    def place(self, changes: Mapping[str, Sequence[str]]) -> None:
        """A whole decision at once: every shrink first, so that a slot one trainer
        gives up is free before another trainer is given it."""
        for trainer_id, nodes in changes.items():
            self._shrink(trainer_id, Counter(nodes))
        for trainer_id, nodes in changes.items():
            self._grow(trainer_id, Counter(nodes))

    def release(self, trainer_id: str) -> None:
        self._held.pop(trainer_id, None)

    def restore(
        self, trainer_id: str, nodes: Sequence[str], stored: Mapping[str, Sequence[int]]
    ) -> tuple[SlotMap, dict[str, int]]:
        """Take back a trainer's slots after a restart: on each of ``nodes`` the slots
        ``stored`` for it (none stored, as at S = 1: the lowest free ones) that still
        exist (index < S) and nobody took back first. Returns the slots kept and, per
        node, how many it lost (the node has fewer slots now, or they were taken)."""
        held = self._held.setdefault(trainer_id, {})
        lost: dict[str, int] = {}
        for node, count in sorted(Counter(nodes).items()):
            want = list(stored.get(node, ()))[:count]
            used = self._used(node)
            kept = [i for i in want if i < self.slots_per_node and i not in used]
            # slots stored without indices (S = 1): the lowest free ones
            kept += self._lowest_free(used | set(kept), count - len(want))
            if len(kept) < count:
                lost[node] = count - len(kept)
            if kept:
                held[node] = kept
        if not held:
            del self._held[trainer_id]
        return self.slots(trainer_id), lost

    def _lowest_free(self, used: set[int], count: int) -> list[int]:
        """The ``count`` lowest slot indices not in ``used`` (fewer if the node has no
        more). Never a list of every slot: S may be large (a config's typo is refused
        at start, but this costs what is asked for, not S)."""
        out: list[int] = []
        i = 0
        while len(out) < count and i < self.slots_per_node:
            if i not in used:
                out.append(i)
            i += 1
        return out

    def _used(self, node: str) -> set[int]:
        return {i for h in self._held.values() for i in h.get(node, ())}

    def _shrink(self, trainer_id: str, counts: Counter[str]) -> None:
        held = self._held.get(trainer_id)
        if held is None:
            return
        for node in list(held):
            held[node] = held[node][: counts.get(node, 0)]
            if not held[node]:
                del held[node]
        if not held:
            del self._held[trainer_id]

    def _grow(self, trainer_id: str, counts: Counter[str]) -> None:
        for node, count in sorted(counts.items()):
            held = self._held.setdefault(trainer_id, {})
            have = held.setdefault(node, [])
            if len(have) >= count:
                continue
            free = self._lowest_free(self._used(node), count - len(have))
            if count - len(have) > len(free):
                others = {t: s for t, s in self.holders(node).items() if t != trainer_id}
                raise SlotError(
                    f"node {node} has {self.slots_per_node} slot(s): {trainer_id} is given "
                    f"{count}, others hold {others} (please report)"
                )
            have += free[: count - len(have)]
