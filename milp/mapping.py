"""Turn a count per trainer into node sets without migration."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice


class InfeasibleCountsError(ValueError):
    """The counts need more nodes than the pool has."""


def map_counts(
    current: Mapping[str, tuple[str, ...]], counts: Mapping[str, int], pool: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """Node sets for ``counts``, given each trainer's ``current`` nodes (all in ``pool``).

    Each trainer keeps the first min(C_j, N_j) of its current nodes; growers then take
    the remaining pool nodes in pool order (free ones and those others released).
    """
    kept = {tid: nodes[: min(len(nodes), counts.get(tid, 0))] for tid, nodes in current.items()}
    held = {n for nodes in kept.values() for n in nodes}
    free = iter([n for n in pool if n not in held])
    out = {}
    for tid in current:
        need = counts.get(tid, 0) - len(kept[tid])
        grown = tuple(islice(free, need)) if need > 0 else ()
        if len(grown) < max(need, 0):
            raise InfeasibleCountsError(f"counts need more than the pool's {len(pool)} nodes")
        out[tid] = kept[tid] + grown
    return out
