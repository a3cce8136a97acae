"""``bftrainer status``: the daemon's trainers, pool and holders as a table or JSON, read
from the state directory without changing it (in centre mode, with what the allocator
decided)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from bftrainer.cli.options import socket_dir_option, state_dir_option
from bftrainer.cli.store_access import own_trainer, read_store
from bftrainer.common import strict_json
from bftrainer.state import (
    AllocationRow,
    Store,
    TrainerRow,
    daemon_running,
    resolve_state_dir,
    settings,
)
from bftrainer.trainers import channel
from bftrainer.trainers.launch.base import Launcher


def trainer_json(
    row: TrainerRow, nodes: tuple[str, ...], slots: Mapping[str, Sequence[int]] | None = None
) -> dict[str, Any]:
    """A trainer as ``bftrainer status --json`` shows it: the one place the record's
    names meet the status's, which keep their first release's spelling (``min_nodes``,
    ``max_nodes``, ``submitted_s`` for the record's ``n_min``, ``n_max``, ``submit_s``),
    and work until the trainer's own stop (``math.inf``) is ``null``.
    ``nodes`` lists a node once per slot held; ``slots``: which slots of each node when
    trainers share nodes ({} otherwise)."""
    return {
        "id": row.id,
        "state": row.state,
        "nodes": list(nodes),
        "slots": {n: list(s) for n, s in (slots or {}).items()},
        "samples_done": row.samples_done,
        "work_samples": None if math.isinf(row.work_samples) else row.work_samples,
        "throughput_sps": row.throughput_sps,
        "goodput_sps": row.goodput_sps,
        "batch_size": row.batch_size,
        "backend": row.backend,
        "min_nodes": row.n_min,
        "max_nodes": row.n_max,
        "script": row.script,
        "args": list(row.args),
        "submitted_s": row.submit_s,
        "started_s": row.started_s,
        "finished_s": row.finished_s,
        "reason": row.reason,
        "restarts": row.restarts,
    }


def _supervisor_exited(row: TrainerRow) -> str | None:
    """Why a trainer the store says is running or waiting has in fact no supervisor any
    more (the daemon records it at its next look), or None while it has one."""
    if row.state not in ("running", "waiting") or row.trainer_dir is None:
        return None
    trainer_dir = Path(row.trainer_dir)
    # Alive by identity, as the daemon's adoption checks it: a pid file naming a pid
    # that another process has now (recycled) is no supervisor.
    if Launcher.running_in(trainer_dir) is not None:
        return None
    try:
        ended = channel.read_exit(trainer_dir)
    except channel.ChannelError:
        ended = None
    if ended is None:
        return "its supervisor is gone; the daemon starts it again from its checkpoint"
    why = f"its supervisor exited ({ended['state']}: {ended.get('reason', '')})"
    return why + "; the daemon records it at its next look"


def status_json(store: Store, state_dir: Path) -> dict[str, Any]:
    """What ``status --json`` prints: the daemon, the pool it last saw, every trainer."""
    allocations = store.current_allocations()
    # Each setting checked for its shape here: one line naming it, never a traceback
    # later while printing (a window given as text, a next try missing).
    pool = settings.check_pool(store.path, store.get_setting("pool", {"time_s": None}))
    return {
        "daemon": {"pid": daemon_running(state_dir), "state_dir": str(state_dir)},
        "slots_per_node": settings.check_slots_per_node(
            store.path, store.get_setting("slots_per_node", 1)
        ),
        # "gres": read from the nodes' GPU counts (--slots-per-node gres); else "config".
        "slots_from": settings.check_slots_from(
            store.path, store.get_setting("slots_from", "config")
        ),
        "pool_time_s": pool.get("time_s"),
        # Holders failing to hold (the latest cause, the nodes, the next try): null if none.
        "holders_failing": pool.get("holders_failing"),
        "pool": [{"node": n, **info} for n, info in sorted(pool.get("nodes", {}).items())],
        "trainers": [_trainer_now(store, t, allocations) for t in store.trainers()],
    }


def _trainer_now(
    store: Store, row: TrainerRow, allocations: Mapping[str, AllocationRow]
) -> dict[str, Any]:
    """A trainer as status shows it: never ``running`` once its supervisor has exited."""
    alloc = allocations.get(row.id)
    out = trainer_json(row, alloc.nodes if alloc else (), alloc.slots if alloc else None)
    # Which points of the curve the allocator plans on are measured, which prior: for the
    # trainers it still plans for (a finished one's whole history is not read again at
    # every status; `bftrainer report --state-dir` shows it).
    if row.finished:
        out["curve"] = None
    else:
        # Imported here: it reads the agents' records (numpy), which an empty or a
        # finished store never needs; `status` stays light (benchmarks/cli_startup.py).
        from bftrainer.trainers.learned_curve import live_curve

        records = (m.record for m in store.metrics(row.id))
        out["curve"] = live_curve(records, row.n_max, row.n_min)
    exited = _supervisor_exited(row)
    if exited is not None:
        out["state"], out["reason"] = "exited", exited
    return out


def _rate(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.1f}"


@click.command("status")
@click.argument("trainer_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@state_dir_option
@socket_dir_option
def status_cmd(
    trainer_id: str | None, as_json: bool, state_dir: Path | None, socket_dir: Path | None
) -> None:
    """The pool the daemon holds, and each trainer's state, nodes and progress (only
    TRAINER_ID's when given)."""
    path = resolve_state_dir(state_dir)
    # Another user's trainer: refused by the allocator (an error too when it is down).
    local = None if trainer_id is None else own_trainer(trainer_id, socket_dir).rpartition("/")[2]
    centre = None
    if socket_dir is not None:
        from bftrainer.cli.centre_client import centre_view

        centre = centre_view(socket_dir.expanduser().absolute(), local)

    def read(store: Store) -> dict[str, Any]:
        if local is not None:
            store.trainer(local)  # an unknown id: one line
        return status_json(store, path)

    data = read_store(state_dir, read)
    if local is not None:
        data["trainers"] = [t for t in data["trainers"] if t["id"] == local]
    if centre is not None:
        data["centre"] = centre
    if as_json:
        click.echo(strict_json.dumps(data, indent=2))
        return
    if centre is not None:
        _print_centre(centre)
    pid = data["daemon"]["pid"]
    click.echo(f"daemon: {'pid ' + str(pid) if pid is not None else 'not running'} ({path})")
    held = sum(p.get("holder_state") == "running" for p in data["pool"])
    asked = sum(p.get("holder_state") == "pending" for p in data["pool"])
    out = sum(bool(p.get("left_out")) and p.get("holder_state") is None for p in data["pool"])
    free = len(data["pool"]) - held - asked - out
    left = f", {out} left out for their GPU count" if out else ""
    click.echo(f"pool: {held} node(s) held, {asked} asked for, {free} idle and not held{left}")
    failing = data["holders_failing"]
    if failing:
        wait_s = max(0.0, failing["next_try_s"] - time.time())
        nodes = failing["nodes"]
        shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        click.echo(
            f"holders failing: {failing['cause']} (holder {failing['job_id']}; "
            f"{len(nodes)} node(s): {shown}; next try in {wait_s:.0f} s)"
        )
    shared = data["slots_per_node"] > 1
    if shared or data["slots_from"] == "gres":
        source = " (the nodes' GPU count: gres)" if data["slots_from"] == "gres" else ""
        click.echo(f"slots per node: {data['slots_per_node']}{source}")
    for p in data["pool"]:
        window = p.get("window_s")
        users = p.get("trainer") or ""
        if shared and p.get("slots"):
            users = " ".join(f"{t}[{_numbers(s)}]" for t, s in p["slots"].items())
        if p.get("left_out"):
            users = f"left out: {p['left_out']}"
        click.echo(
            f"  {p['node']}\twindow {'open' if window is None else f'{window:.0f} s'}"
            f"\t{p.get('holder_state') or 'free'}\t{users}"
        )
    header = (
        "id",
        "state",
        "nodes",
        *(("slots",) if shared else ()),
        "samples",
        "samples/s",
        "goodput/s",
        "batch",
        "restarts",
        "curve",
        "script",
    )
    click.echo("\t".join(header))
    if data["trainers"]:
        from bftrainer.trainers.learned_curve import curve_summary
    for t in data["trainers"]:
        work = f"/{t['work_samples']}" if t["work_samples"] else ""
        click.echo(
            "\t".join(
                [
                    t["id"],
                    t["state"],
                    str(len(set(t["nodes"]))),
                    *((_slots_text(t["slots"]),) if shared else ()),
                    f"{t['samples_done']}{work}",
                    _rate(t["throughput_sps"]),
                    _rate(t["goodput_sps"]),
                    str(t["batch_size"] or "-"),
                    str(t["restarts"]),
                    curve_summary(t["curve"]),
                    Path(t["script"]).name + (f" ({t['reason']})" if t["reason"] else ""),
                ]
            )
        )


def _numbers(slots: Sequence[int]) -> str:
    return ",".join(str(i) for i in slots)


def _slots_text(slots: Mapping[str, Sequence[int]]) -> str:
    """``node1:0,1 node2:1``: the slots of each node (``-``: none)."""
    return " ".join(f"{n}:{_numbers(s)}" for n, s in sorted(slots.items())) or "-"


def _print_centre(centre: Mapping[str, Any]) -> None:
    if "unreachable" in centre:
        click.echo(f"centre: the allocator cannot be reached ({centre['unreachable']})")
        return
    others: dict[str, list[int]] = {}
    for t in centre["trainers"]:
        if "id" not in t:
            others.setdefault(t["user"], []).append(t["nodes"])
    mine = [t for t in centre["trainers"] if "id" in t]
    state = " (restoring: waiting for the agents)" if centre.get("restoring") else ""
    click.echo(f"centre: {len(centre['pool'])} idle node(s) in the pool{state}")
    for t in mine:
        click.echo(f"  {t['id']}\tassigned {len(t['nodes'])} node(s): {','.join(t['nodes'])}")
    for user, counts in sorted(others.items()):
        click.echo(f"  {user}: {len(counts)} trainer(s) on {sum(counts)} node(s)")
