"""Turn a count per trainer into node sets without migration."""

from __future__ import annotations

from itertools import islice

from bftrainer.milp.objective import TrainerTerms


class InfeasibleCountsError(ValueError):
    """The counts need more nodes than the pool has."""


def map_counts(
    terms: list[TrainerTerms], counts: dict[str, int], pool: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """Each trainer keeps the first min(C_j, N_j) of its current nodes; growers then take
    the remaining pool nodes in pool order (free ones and those others released)."""
    kept = {t.id: t.current[: min(t.c, counts.get(t.id, 0))] for t in terms}
    held = {n for nodes in kept.values() for n in nodes}
    free = iter([n for n in pool if n not in held])
    out = {}
    for t in terms:
        need = counts.get(t.id, 0) - len(kept[t.id])
        grown = tuple(islice(free, need)) if need > 0 else ()
        if len(grown) < max(need, 0):
            raise InfeasibleCountsError(f"counts need more than the pool's {len(pool)} nodes")
        out[t.id] = kept[t.id] + grown
    return out
