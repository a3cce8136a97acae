"""Independent checks that an allocation satisfies every constraint of the model."""

from __future__ import annotations

from collections.abc import Mapping

from bftrainer.milp.problem import Problem


def violations(problem: Problem, nodes: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Every constraint an allocation breaks, in words; empty when it is feasible."""
    out = []
    owner: dict[str, str] = {}
    for t in problem.trainers:
        got = nodes.get(t.id, ())
        for n in got:
            if n not in problem.pool_set:
                out.append(f"{t.id}: node {n!r} is not in the pool")
            if n in owner:
                out.append(f"node {n!r} given to both {owner[n]!r} and {t.id!r}")
            owner[n] = t.id
        if got and not t.n_min <= len(got) <= t.n_max:
            out.append(f"{t.id}: {len(got)} nodes outside {t.n_min}..{t.n_max}")
        current = set(problem.current_nodes(t))
        kept, new = current & set(got), set(got) - current
        if new and kept != current:
            out.append(f"{t.id}: migrates (adds {len(new)} nodes but drops {len(current - kept)})")
    return out
