"""The pool as ``bftrainer status`` shows it: written by the held pool at each hold plan,
read by ``status`` from the store (the setting ``pool``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bftrainer.idle_monitor.source import PoolView
from bftrainer.state import Store


def publish_pool(
    store: Store,
    view: PoolView,
    leave_by_s: Mapping[str, float | None],
    now_s: float,
    left_out: Mapping[str, str],
    idle: frozenset[str],
    holders_failing: dict[str, Any] | None,
) -> None:
    """Record the pool: a held node's window is when we lose it (``leave_by_s``),
    another's the main scheduler's; ``left_out``: nodes the GPU check keeps out (with
    why), shown if idle (``idle``: the pool before the check) or held."""
    holders = {h.node: h for h in store.holders(live_only=True)}
    # node -> trainer -> its slots there (S = 1: each node one trainer, slot 0).
    users: dict[str, dict[str, list[int]]] = {}
    allocations = store.current_allocations()
    for tid, a in sorted(allocations.items()):
        for n in dict.fromkeys(a.nodes):
            users.setdefault(n, {})[tid] = list(a.slots.get(n, (0,)))
    shared = any(a.slots for a in allocations.values())
    nodes: dict[str, dict[str, Any]] = {}
    for n in sorted(set(view.pool) | set(holders)):
        h = holders.get(n)
        window = view.windows_s.get(n)
        if n in leave_by_s:
            leaves = leave_by_s[n]
            window = None if leaves is None else max(0.0, leaves - now_s)
        nodes[n] = {
            "window_s": window,
            "holder": h.job_id if h else None,
            "holder_state": h.state if h else None,
            "trainer": ",".join(users[n]) if n in users else None,
        }
        if shared:
            nodes[n]["slots"] = users.get(n, {})
    for n, why in sorted(left_out.items()):  # idle or held, with their GPUs
        if n in nodes or n in idle:
            empty = {"window_s": None, "holder": None, "holder_state": None, "trainer": None}
            nodes.setdefault(n, empty)["left_out"] = why
    store.set_setting(
        "pool",
        {"time_s": now_s, "stale": view.stale, "nodes": nodes, "holders_failing": holders_failing},
    )
