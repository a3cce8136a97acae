"""What the daemon leaves running, said by name: a failed ``scancel`` or a stop never
leaves a trainer's processes or a holder job unnamed in the log (issue 42)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping, Sequence

from bftrainer.state import Store
from bftrainer.trainers.launch.base import Launcher

log = logging.getLogger(__name__)


def holding(store: Store, job_ids: Sequence[str]) -> str:
    """``17 (n1: t0001's processes run there), 18 (n2)``: what each holder whose cancel
    failed still keeps."""
    nodes = {h.job_id: h.node for h in store.holders(live_only=True)}
    users: dict[str, list[str]] = {}
    for tid, alloc in sorted(store.current_allocations().items()):
        for n in dict.fromkeys(alloc.nodes):
            users.setdefault(n, []).append(tid)
    out = []
    for j in job_ids:
        node = nodes.get(j)
        on = users.get(node or "", [])
        runs = f": {', '.join(on)}'s processes run there" if on else ""
        out.append(f"{j} ({node}{runs})" if node else j)
    return ", ".join(out)


def say_left_running(store: Store, launchers: Mapping[str, Launcher]) -> None:
    """One line per trainer left running at the daemon's stop: its supervisor's pid and
    folder, and the holder jobs its processes run in (scancel them by hand to end it)."""
    if not launchers:
        return
    jobs: dict[str, list[str]] = {}
    allocations = {}
    try:
        for h in store.holders(live_only=True):
            jobs.setdefault(h.node, []).append(h.job_id)
        allocations = store.current_allocations()
    except (sqlite3.Error, OSError) as exc:  # the state cannot be read: pids alone
        log.debug("holders not read at exit: %s", exc)
    for tid, launcher in sorted(launchers.items()):
        alloc = allocations.get(tid)
        nodes = list(dict.fromkeys(alloc.nodes)) if alloc else []
        held = [f"{j} on {n}" for n in nodes for j in jobs.get(n, [])]
        log.info(
            "left running: trainer %s, supervisor pid %d (%s), holder job(s): %s",
            tid,
            launcher.pid,
            launcher.trainer_dir,
            ", ".join(held) or "none",
        )
