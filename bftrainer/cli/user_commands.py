"""``bftrainer submit``, ``status``, ``cancel`` and ``logs``: talking to a running daemon.

They talk through the state directory only (the daemon's SQLite store and the trainers'
directories): no socket, no port. ``submit`` queues a trainer and ``cancel`` flags one;
the daemon acts on both at its next poll. ``status`` and ``logs`` read.

With ``--socket-dir`` (or ``$BFTRAINER_SOCKET_DIR``), centre mode: the state directory is
the user's agent's (``submit`` starts the agent when none runs), ``cancel`` goes through
the centre's allocator, which refuses another user's trainer, and ``status`` adds what
the allocator decided (bftrainer.cli.centre_client).
"""

from __future__ import annotations

import errno
import importlib.util
import math
import os
import pwd
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from bftrainer.cli import UsageError
from bftrainer.cli.options import socket_dir_option, state_dir_option
from bftrainer.cli.params import NODES, SAMPLES, Number, file_to_read_error
from bftrainer.common import strict_json
from bftrainer.common.names import BadNameError, NotRegularFileError, check_trainer_id, open_regular
from bftrainer.state import (
    BACKENDS,
    DEFAULT_RESCALE_S,
    AllocationRow,
    StateError,
    Store,
    StoreChangedError,
    TrainerRow,
    UnknownTrainerError,
    check_state_dir,
    daemon_running,
    read_again,
    resolve_state_dir,
    settings,
)
from bftrainer.trainers import channel
from bftrainer.trainers.channel import SUPERVISOR_LOG
from bftrainer.trainers.launch.base import Launcher

# A rescale that takes longer than a day is a typo, not an elastic job.
RESCALE_S = Number(min=0.0, max=86400.0)
T = TypeVar("T")


def my_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def own_trainer(trainer_id: str, socket_dir: Path | None) -> str:
    """The local id of ``trainer_id`` (``t0001`` or, in centre mode, ``alice/t0001``);
    another user's trainer is asked of the allocator, which refuses it in one line."""
    user, sep, local = trainer_id.rpartition("/")
    try:
        check_trainer_id(local, "TRAINER_ID")
    except BadNameError as exc:
        raise UsageError(str(exc)) from None
    if not sep or socket_dir is None:
        return trainer_id
    if user != my_user():
        from bftrainer.centre import protocol
        from bftrainer.cli.centre_client import ask

        ask(socket_dir, protocol.STATUS, {"trainer": trainer_id})
    return local


@contextmanager
def open_store(
    state_dir: Path | None, *, need_daemon: bool, read_only: bool = False
) -> Iterator[Store]:
    """The store of an existing state directory; one clear line when it cannot be used.
    ``read_only``: nothing in the directory changes, and a store that changed under the
    read raises ``StoreChangedError`` (``read_store`` reads it again)."""
    path = resolve_state_dir(state_dir)
    try:
        check_state_dir(path)
    except StateError as exc:
        raise click.ClickException(
            f"{exc} (is a daemon set up? see bftrainer daemon --help)"
        ) from None
    if need_daemon and daemon_running(path) is None:
        raise click.ClickException(
            f"no bftrainer daemon is running for state directory {path}: start one with "
            "`bftrainer daemon --scheduler slurm|lsf` (docs/deployment.md)"
        )
    try:
        store = Store.open(path, create=False, read_only=read_only)
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield store
    except StoreChangedError:
        raise
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    except sqlite3.OperationalError as exc:
        if "readonly" in str(exc):
            raise click.ClickException(f"state directory {path} is not writable ({exc})") from None
        if disk_full(exc):
            raise click.ClickException(_full(path, exc)) from None
        raise click.ClickException(f"{store.path} is damaged: {exc!r}") from None
    except OSError as exc:
        if disk_full(exc):
            raise click.ClickException(_full(path, exc)) from None
        raise
    except (sqlite3.DatabaseError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # A missing table or column, bad JSON in a column, a setting of another shape:
        # the store is not as bftrainer wrote it. Named, never changed.
        raise click.ClickException(f"{store.path} is damaged: {exc!r}") from None
    finally:
        try:
            store.close()
        except StoreChangedError:
            raise
        except StateError as exc:
            raise click.ClickException(str(exc)) from None


def read_store(
    state_dir: Path | None, read: Callable[[Store], T], *, need_daemon: bool = False
) -> T:
    """``read(store)`` on a read-only open of an existing state directory (status, logs,
    cancel's look first): nothing in it changes. Opened and read afresh when a writer
    changed the files under the read (a daemon or ``submit`` opening or closing the store
    right then); one clear line when that goes on, or the store cannot be used."""

    def once() -> T:
        with open_store(state_dir, need_daemon=need_daemon, read_only=True) as store:
            return read(store)

    try:
        return read_again(once)
    except StoreChangedError as exc:
        raise click.ClickException(str(exc)) from None


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system (or the user's quota) has no room left."""
    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" or "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _full(path: Path, exc: BaseException) -> str:
    what = "over quota" if getattr(exc, "errno", None) == errno.EDQUOT else "full"
    return (
        f"the disk holding state directory {path} is {what} ({exc}): nothing was changed; "
        "free some space and try again"
    )


# ---------------------------------------------------------------------- submit


@click.command(
    "submit",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True},
)
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--min-nodes", "n_min", type=NODES, default=1, show_default=True)
@click.option("--max-nodes", "n_max", type=NODES, default=1, show_default=True)
@click.option(
    "--work-samples",
    type=SAMPLES,
    help="Samples to train; passed to the trainer as --work-samples (else its own stop).",
)
@click.option("--backend", type=click.Choice(BACKENDS), default="horovod", show_default=True)
@click.option(
    "--rescale-up",
    "rescale_up_s",
    type=RESCALE_S,
    help="Seconds a grow costs the trainer (the allocator's scale-up cost); default: the "
    "backend's measured figure.",
)
@click.option(
    "--rescale-down",
    "rescale_down_s",
    type=RESCALE_S,
    help="Seconds a shrink costs the trainer; default: the backend's measured figure.",
)
@state_dir_option
@socket_dir_option
def submit_cmd(
    script: Path,
    args: tuple[str, ...],
    n_min: int,
    n_max: int,
    work_samples: int | None,
    backend: str,
    rescale_up_s: float | None,
    rescale_down_s: float | None,
    state_dir: Path | None,
    socket_dir: Path | None,
) -> None:
    """Queue SCRIPT [ARGS...] as an elastic trainer; prints its id as the last line.

    Options of this command may come before or after the script's own arguments; put
    `--` before arguments of the script that look like them.
    """
    script = script.expanduser().absolute()
    problem = file_to_read_error(script)
    if problem is not None:
        raise UsageError(f"trainer script {problem}")
    if n_max < n_min:
        raise UsageError(f"--max-nodes {n_max} is below --min-nodes {n_min}")
    if backend == "horovod" and importlib.util.find_spec("horovod") is None:
        raise UsageError(
            "--backend horovod: Horovod is not installed here (`make horovod`, "
            "docs/trainers.md), or use --backend torchrun"
        )
    up_s, down_s = DEFAULT_RESCALE_S[backend]
    if socket_dir is not None:
        from bftrainer.centre import protocol
        from bftrainer.cli.centre_client import ask, ensure_agent

        socket_dir = socket_dir.expanduser().absolute()
        ask(socket_dir, protocol.HELLO)  # the allocator runs: else say so before queueing
        ensure_agent(socket_dir, resolve_state_dir(state_dir))
    with open_store(state_dir, need_daemon=True) as store:
        trainer_id = store.submit(
            script,
            args,
            backend=backend,
            n_min=n_min,
            n_max=n_max,
            work_samples=math.inf if work_samples is None else work_samples,
            rescale_up_s=up_s if rescale_up_s is None else rescale_up_s,
            rescale_down_s=down_s if rescale_down_s is None else rescale_down_s,
        )
    click.echo(trainer_id)


# ---------------------------------------------------------------------- status


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


# ---------------------------------------------------------------------- cancel


@click.command("cancel")
@click.argument("trainer_id")
@state_dir_option
@socket_dir_option
def cancel_cmd(trainer_id: str, state_dir: Path | None, socket_dir: Path | None) -> None:
    """Cancel a trainer: a queued one never starts, a running one checkpoints and stops."""
    try:
        check_trainer_id(trainer_id.rpartition("/")[2], "TRAINER_ID")
    except BadNameError as exc:
        raise UsageError(str(exc)) from None
    if socket_dir is not None:
        from bftrainer.centre import protocol
        from bftrainer.cli.centre_client import ask

        reply = ask(socket_dir.expanduser().absolute(), protocol.CANCEL, {"trainer": trainer_id})
        click.echo(f"{reply['trainer']}: cancel requested (your agent stops it)")
        return
    # An unknown id: one line, nothing written.
    row = read_store(state_dir, lambda store: store.trainer(trainer_id), need_daemon=True)
    if not row.finished:
        with open_store(state_dir, need_daemon=True) as store:
            row = store.request_cancel(trainer_id)
    if row.finished:
        click.echo(f"{row.id} already ended: {row.state}")
    else:
        click.echo(f"{row.id}: cancel requested ({row.state} now; the daemon stops it)")


# ---------------------------------------------------------------------- logs


@click.command("logs")
@click.argument("trainer_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the trainer ends.")
@state_dir_option
@socket_dir_option
def logs_cmd(
    trainer_id: str, follow: bool, state_dir: Path | None, socket_dir: Path | None
) -> None:
    """Print a trainer's log: its launcher's and workers' output, tracebacks included."""
    trainer_id = own_trainer(trainer_id, socket_dir)
    row = read_store(state_dir, lambda store: store.trainer(trainer_id))
    if row.trainer_dir is None:
        raise click.ClickException(f"trainer {trainer_id} has not started yet: no log")
    log_path = Path(row.trainer_dir) / SUPERVISOR_LOG
    if not log_path.parent.is_dir():
        raise click.ClickException(
            f"trainer {trainer_id}'s directory {log_path.parent} is gone, its log with it"
        )
    offset = 0
    failed_looks: list[str] = []
    while True:
        offset = _print_from(log_path, offset)
        if not follow:
            break
        if _finished(state_dir, trainer_id, failed_looks):
            break
        try:
            time.sleep(1.0)
        except KeyboardInterrupt:
            break
    # A trainer that just ended may have written its last lines after our last read.
    if follow:
        _print_from(log_path, offset)


# Looks in a row at a store that cannot be read before ``logs -f`` gives up on it.
FOLLOW_TRIES = 10


def _finished(state_dir: Path | None, trainer_id: str, failed: list[str]) -> bool:
    """Whether the trainer has ended, at this look. Opened afresh at each look: a store
    read as immutable sees no later commit. A daemon that starts meanwhile changes the
    files under a reader (the store changes while it is read, its -wal comes and goes):
    no error for a follower, which looks again at the next second; only
    ``FOLLOW_TRIES`` failed looks in a row (``failed`` keeps them) end it, with the last
    one's line."""
    try:
        ended = read_store(state_dir, lambda store: store.trainer(trainer_id).finished)
    except click.ClickException as exc:
        if isinstance(exc.__context__, UnknownTrainerError):
            raise
        failed.append(exc.message)
        if len(failed) >= FOLLOW_TRIES:
            raise
        return False
    failed.clear()
    return ended


def _print_from(path: Path, offset: int) -> int:
    try:
        with open_regular(path) as f:  # a FIFO in its place: refused, never waited on
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    except NotRegularFileError as exc:
        raise click.ClickException(f"the trainer's log {exc.strerror}") from None
    if data:
        click.echo(data.decode(errors="replace"), nl=False)
    return offset + len(data)
