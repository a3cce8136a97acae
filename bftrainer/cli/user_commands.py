"""``bftrainer submit``, ``cancel`` and ``logs`` (``status``: bftrainer/cli/status.py):
talking to a running daemon.

They talk through the state directory only (the daemon's SQLite store and the trainers'
directories): no socket, no port. ``submit`` queues a trainer and ``cancel`` flags one;
the daemon acts on both at its next poll. ``status`` and ``logs`` read.

With ``--socket-dir`` (or ``$BFTRAINER_SOCKET_DIR``), centre mode: the state directory is
the user's agent's (``submit`` starts the agent when none runs), ``cancel`` goes through
the centre's allocator, which refuses another user's trainer, and ``status`` adds what
the allocator decided (bftrainer.cli.centre_client).
"""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path

import click

from bftrainer.cli import UsageError
from bftrainer.cli.options import socket_dir_option, state_dir_option
from bftrainer.cli.params import NODES, SAMPLES, Number, file_to_read_error
from bftrainer.cli.store_access import open_store, own_trainer, read_store
from bftrainer.common.names import BadNameError, NotRegularFileError, check_trainer_id, open_regular
from bftrainer.state import (
    BACKENDS,
    DEFAULT_RESCALE_S,
    UnknownTrainerError,
    resolve_state_dir,
)
from bftrainer.trainers.channel import SUPERVISOR_LOG

# A rescale that takes longer than a day is a typo, not an elastic job.
RESCALE_S = Number(min=0.0, max=86400.0)


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
