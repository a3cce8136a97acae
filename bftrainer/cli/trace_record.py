"""``bftrainer trace record``: record the live pool as a canonical trace, for replay."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import click

from bftrainer.cli import UsageError
from bftrainer.cli.params import COUNT, Number
from bftrainer.cli.pool import build_source, check_source, source_options
from bftrainer.idle_monitor.recorder import (
    MAX_INTERVAL_S,
    Recorder,
    RecorderConfig,
    RecorderError,
    stop_on_signals,
)
from bftrainer.idle_monitor.trace import TraceInUseError

log = logging.getLogger(__name__)


@click.command("record")
@source_options
@click.option(
    "--interval",
    "interval_s",
    type=Number(min=0.1, max=MAX_INTERVAL_S),
    default=RecorderConfig().interval_s,
    show_default=True,
    help="Seconds between polls.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the trace files (pool-<UTC time>.csv); the newest one is continued.",
)
@click.option(
    "--max-mb",
    type=Number(min=0.01),
    default=RecorderConfig().max_bytes / 2**20,
    show_default=True,
    help="Start a new file (with a full snapshot) once the current one is this large.",
)
@click.option(
    "--polls",
    type=COUNT,
    default=None,
    help="Stop after this many polls (default: until SIGINT or SIGTERM).",
)
def record(
    interval_s: float, out_dir: Path, max_mb: float, polls: int | None, **options: Any
) -> None:
    """Poll the scheduler every --interval seconds and append the pool to a trace.

    Each record lists every node (idle = in the pool: idle and not claimed within
    --horizon). Rows are flushed to disk as they are written; stop with Ctrl-C or
    SIGTERM and start again to continue the same trace.
    """
    source = build_source(**options)
    config = RecorderConfig(interval_s=interval_s, max_bytes=int(max_mb * 2**20))
    recorder = Recorder(source, out_dir, config)
    try:
        path = recorder.open()
    except (RecorderError, TraceInUseError) as exc:
        raise UsageError(f"--out {out_dir}: {exc}") from None
    try:
        check_source(source)
    except click.ClickException:
        recorder.close()
        source.runner.close()
        raise
    click.echo(f"recording {options['scheduler']} pool to {path}", err=True)
    stop = threading.Event()
    try:
        with stop_on_signals(stop):
            recorder.run(stop, polls=polls)
    finally:
        source.runner.close()
    click.echo(
        f"stopped: {recorder.records} record(s), {recorder.rows} row(s) in {out_dir}", err=True
    )
    if recorder.records == 0 and not stop.is_set():
        # Every poll failed (an unreachable scheduler): not a recording, whatever the file.
        raise click.ClickException(
            f"no poll of {options['scheduler']} could be read, so nothing was recorded "
            "(see the log lines above)"
        )
