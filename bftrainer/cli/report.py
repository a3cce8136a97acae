"""``bftrainer report``: an HTML page of what a replay or a daemon did (docs/replay.md)."""

from __future__ import annotations

from pathlib import Path

import click
import pandas as pd

from bftrainer.cli import UsageError
from bftrainer.cli.outdir import OutputDirError, replaced_on_success
from bftrainer.cli.params import Number
from bftrainer.cli.trace import parse_time_option
from bftrainer.report.frames import Frames, FramesError, load_replay, replay_runs
from bftrainer.report.store_frames import load_store
from bftrainer.state import resolve_state_dir


@click.command("report")
@click.argument(
    "replay_dir", metavar="[REPLAY_OUT_DIR]", required=False, type=click.Path(path_type=Path)
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    help="Report on a daemon's store instead (its state directory).",
)
@click.option(
    "--start", help="With --state-dir: from this time (YYYY-mm-dd HH:MM:SS, ISO-8601 or epoch s)."
)
@click.option("--end", help="With --state-dir: until this time.")
@click.option(
    "--top",
    type=Number(integer=True, min=1, max=20),
    default=10,
    show_default=True,
    help="Trainers drawn on their own (most node-hours); the others are grouped.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for report.html and its PNGs (default: REPLAY_OUT_DIR/report).",
)
def report_cmd(
    replay_dir: Path | None,
    state_dir: Path | None,
    start: str | None,
    end: str | None,
    top: int,
    out_dir: Path | None,
) -> None:
    """Write report.html (images inlined) and its PNGs for a replay's output folder or,
    with --state-dir, a daemon's store; print the page's path."""
    if (replay_dir is None) == (state_dir is None):
        raise UsageError("give a replay's output folder or --state-dir, not both or neither")
    if replay_dir is not None:
        if start is not None or end is not None:
            raise UsageError(
                "--start/--end apply to --state-dir only (a replay's figures cover it whole)"
            )
        runs = _replay(replay_dir)
        out = out_dir if out_dir is not None else replay_dir / "report"
        title = f"bftrainer replay: {replay_dir.resolve().name}"
    else:
        assert state_dir is not None
        if out_dir is None:
            raise UsageError("--state-dir needs --out (the state directory is the daemon's)")
        _refuse_inside(out_dir, resolve_state_dir(state_dir))
        lo, hi = (_time(o, t) for o, t in (("--start", start), ("--end", end)))
        try:
            runs = [load_store(resolve_state_dir(state_dir), lo, hi)]
        except FramesError as e:
            raise UsageError(str(e)) from None
        out = out_dir
        title = f"bftrainer daemon: {state_dir}"
    # matplotlib (a second of CPU) once the input is read: a bad one fails without it.
    from bftrainer.report.page import PAGE, write_report

    try:
        with replaced_on_success(out, PAGE) as tmp:
            write_report(runs, tmp, top, title)
    except OutputDirError as e:
        raise UsageError(f"--out {e}") from None
    click.echo(out / PAGE)


def _refuse_inside(out: Path, state_dir: Path) -> None:
    """A read-only command never writes into the state directory (only the daemon
    does): ``--out`` inside it, or holding it, is refused in one line. Links resolved,
    so a link to the state directory counts as it."""
    out_real, state_real = out.resolve(), state_dir.resolve()
    if out_real == state_real or state_real in out_real.parents:
        raise UsageError(
            f"--out {out}: inside the state directory {state_dir}, which only the daemon "
            "writes; choose a folder outside it"
        )
    if out_real in state_real.parents:
        raise UsageError(
            f"--out {out}: holds the state directory {state_dir}, which the report would "
            "replace; choose a folder outside it"
        )


def _replay(path: Path) -> list[Frames]:
    try:
        return [load_replay(run) for run in replay_runs(path).values()]
    except FramesError as e:
        raise UsageError(str(e)) from None


def _time(option: str, text: str | None) -> pd.Timestamp | None:
    seconds = parse_time_option(option, text)
    return None if seconds is None else pd.Timestamp(seconds, unit="s", tz="UTC")
