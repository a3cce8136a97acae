"""Slots: several trainers on one node (docs/allocator.md, "Slots").

A pool node has S slots (GPUs). A trainer's holding is a tuple of node names, a node
once per slot it holds there, so ``len`` is its slot count and a node's departure
removes all its slots at once. Its value depends on the slot count k and on whether
the slots are *packed* (on ceil(k/S) nodes, the fewest possible) or *spread* (more):
Pollux's throughput model has one all-reduce cost within a node and another over the
network, and its profiles (placements.csv) show that leaving the node is what costs
(cifar10, 4 GPUs at local batch 64: 0.068 s per step on one node, 0.13-0.17 s over 2-4).

With S = 1 every holding is packed and nothing here is used: the allocator takes
today's code path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

# A curve given per slot count only: spreading costs this share of its value.
DEFAULT_SPREAD_PENALTY = 0.2


def nodes_needed(slots: int, slots_per_node: int) -> int:
    """ceil(k / S): the fewest nodes that hold k slots."""
    return -(-slots // slots_per_node)


def is_packed(holding: Sequence[str], slots_per_node: int) -> bool:
    """The slots are on the fewest nodes that can hold them (always, at S = 1)."""
    return len(set(holding)) <= nodes_needed(len(holding), slots_per_node)


def per_node(holding: Sequence[str]) -> Counter[str]:
    """Slots held on each node."""
    return Counter(holding)


def packable(holding: Sequence[str], k: int, slots_per_node: int) -> bool:
    """Whether k slots can be packed from ``holding`` without migration, were the rest
    of the pool free: a grower keeps every node it has, a shrinker keeps a subset."""
    if k <= 0:
        return True
    need = nodes_needed(k, slots_per_node)
    counts = sorted(per_node(holding).values(), reverse=True)
    if k >= len(holding):
        return len(counts) <= need
    return sum(counts[:need]) >= k


def packable_counts(holding: Sequence[str], top: int, slots_per_node: int) -> np.ndarray:
    """``packable(holding, k, S)`` for every k in 0..top at once."""
    k = np.arange(top + 1)
    need = -(-k // slots_per_node)
    held = np.sort(np.fromiter(per_node(holding).values(), dtype=np.int64))[::-1]
    prefix = np.concatenate(([0], np.cumsum(held)))
    grow = len(held) <= need
    shrink = prefix[np.minimum(need, len(held))] >= k
    return np.where(k >= len(holding), grow, shrink) | (k == 0)


def map_slots(
    current: Mapping[str, tuple[str, ...]],
    counts: Mapping[str, int],
    pool: tuple[str, ...],
    slots_per_node: int,
) -> dict[str, tuple[str, ...]]:
    """Holdings for ``counts`` without migration, packing where it can (best fit).

    A shrinker keeps its slots on the nodes where it holds most; growers, the largest
    need first, fill their own nodes, then take whole free nodes, then the node whose
    free slots fit the remainder most tightly (else the fullest free ones). A heuristic:
    a packing may exist that it misses; ``allocate`` values what it returns exactly.
    """
    s = slots_per_node
    free = dict.fromkeys(pool, s)
    kept: dict[str, list[str]] = {}
    for tid, holding in current.items():
        k = counts.get(tid, 0)
        if k >= len(holding):
            kept[tid] = list(holding)
        else:
            order = sorted(per_node(holding).items(), key=lambda kv: (-kv[1], holding.index(kv[0])))
            keep: list[str] = []
            for node, held in order:
                take = min(held, k - len(keep))
                keep += [node] * take
            kept[tid] = keep
        for node in kept[tid]:
            free[node] -= 1
    wholes = iter([n for n in pool if free[n] == s])  # only lose slots from here on
    growers = sorted(
        (tid for tid in current if counts.get(tid, 0) > len(kept[tid])),
        key=lambda tid: -(counts.get(tid, 0) - len(kept[tid])),
    )
    for tid in growers:
        need = counts[tid] - len(kept[tid])
        got: list[str] = []
        for node in dict.fromkeys(kept[tid]):  # own nodes first: no new node spanned
            take = min(free[node], need - len(got))
            got += [node] * take
            free[node] -= take
        while need - len(got) >= s:
            whole = next((n for n in wholes if free[n] == s), None)
            if whole is None:
                break
            got += [whole] * s
            free[whole] = 0
        while len(got) < need:
            rest = need - len(got)
            fits = [n for n in pool if free[n] >= rest]
            if fits:
                node = min(fits, key=lambda n: free[n])
            else:
                node = max(pool, key=lambda n: free[n])
                if free[node] == 0:
                    raise ValueError(f"counts need more than the pool's {len(pool) * s} slots")
            take = min(free[node], rest)
            got += [node] * take
            free[node] -= take
        kept[tid] += got
    return {tid: tuple(kept[tid]) for tid in current}
