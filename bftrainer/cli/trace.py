"""``bftrainer trace``: pool traces — statistics, synthetic traces (and ``record``, elsewhere)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import click

from bftrainer.cli import UsageError
from bftrainer.cli.joblog_options import LogOptions, log_options, options_from, read_log_pool
from bftrainer.cli.outdir import OutputDirError, check_can_create
from bftrainer.cli.params import POSITIVE, SEED, SYNTHETIC_HOURS, SYNTHETIC_NODES, InputFile
from bftrainer.cli.trace_record import record
from bftrainer.common import strict_json
from bftrainer.idle_monitor.joblog import is_job_log, write_log_trace
from bftrainer.idle_monitor.synthetic import (
    DEFAULT_NODES,
    SyntheticConfig,
    SyntheticConfigError,
    synthetic_trace,
)
from bftrainer.idle_monitor.trace import (
    Trace,
    TraceFormatError,
    TraceRangeError,
    check_epoch_s,
    check_trace_out,
    load_trace,
    parse_time_s,
    write_trace,
)
from bftrainer.idle_monitor.trace_stats import PLOT_NAMES, format_summary, summarize, write_plots

log = logging.getLogger(__name__)

_NODE_RANGE = re.compile(r"^\s*(\d*)\s*:\s*(\d*)\s*$")


def parse_node_range(text: str | None) -> slice | None:
    """``A:B`` (either end may be omitted) as a slice of the first-seen node order."""
    if text is None:
        return None
    match = _NODE_RANGE.match(text)
    if not match:
        raise UsageError(f"--nodes {text!r} must be A:B, a range of node positions (e.g. 0:1024)")
    start, stop = (int(g) if g else None for g in match.groups())
    if start is not None and stop is not None and stop <= start:
        raise UsageError(f"--nodes {text!r} is empty: B must be greater than A")
    return slice(start, stop)


def parse_time_option(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time_s(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


@click.group("trace")
def trace() -> None:
    """Pool traces: the idle-node event logs that `bftrainer replay` plays back.

    A trace is CSV (.csv, .csv.gz) or Parquet with columns time,node,idle[,window_s]: a
    first snapshot of every node, then only changes. See docs/traces.md.
    """


@trace.command("stats")
@click.argument("trace_path", metavar="TRACE|LOG", type=InputFile())
@click.option("--nodes", "node_range", metavar="A:B", help="Nodes A..B-1 in first-seen order.")
@click.option("--start", help="Start here; the state then is the snapshot (time or epoch s).")
@click.option("--end", help="End here (time or epoch s).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write fragments_cdf.png (paper Fig. 1) and events_12h.png (Fig. 6) here.",
)
@log_options("--machine-nodes")
def stats(
    trace_path: Path,
    node_range: str | None,
    start: str | None,
    end: str | None,
    as_json: bool,
    plots_dir: Path | None,
    **log_kwargs: Any,
) -> None:
    """The BFTrainer paper's Table 1 row for TRACE, and the idle-fragment figures.

    INC/h and DEC/h count events (timestamps) with joins and with leaves per hour; the
    idle ratio is the mean share of idle nodes; eq-nodes is idle node-time / duration.
    A scheduler's job LOG (sacct, Slurm jobcomp, lsb.acct, PBS/Cobalt, SWF) is read as
    the pool its jobs left idle (docs/traces.md); stretches of 6 h with no node taken are
    flagged as possible outages.
    """
    nodes = parse_node_range(node_range)
    start_s = parse_time_option("--start", start)
    end_s = parse_time_option("--end", end)
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise UsageError(f"--start {start} and --end {end}: the span is empty")
    options = options_from(log_kwargs)
    if plots_dir is not None:
        try:
            check_can_create(plots_dir)  # before the trace is read and summarised
        except OutputDirError as exc:
            raise UsageError(f"--plots {exc}") from None
        inputs = (
            ("TRACE", trace_path),
            ("--node-list", options.node_list),
            ("--down", options.down),
        )
        for name in PLOT_NAMES:  # a plot named as an input would replace it
            _refuse_out_over_an_input(plots_dir / name, inputs, "--plots", "the plot")
    began = time.perf_counter()
    loaded, _ = load_trace_or_log(trace_path, options, nodes, start_s, end_s)
    if loaded.end_s <= loaded.start_s:
        raise UsageError(f"{trace_path}: the trace (as sliced) spans no time: no statistics")
    load_s = time.perf_counter() - began
    log.info("loaded %s in %.2f s", trace_path, load_s)
    summary = summarize(loaded)
    plots = [str(p) for p in write_plots(loaded, plots_dir)] if plots_dir else []
    if as_json:
        click.echo(
            strict_json.dumps({**summary.as_json(), "load_s": round(load_s, 3), "plots": plots})
        )
        return
    for line in format_summary(summary, load_s=load_s):
        click.echo(line)
    for path in plots:
        click.echo(f"plot        {path}")


def load_trace_or_log(
    path: Path,
    options: LogOptions,
    nodes: slice | None,
    start_s: float | None,
    end_s: float | None,
) -> tuple[Trace, bool]:
    """A pool trace, or the pool of a job log (its summary line on stderr), sliced; and
    whether it came from a job log (told by content once, here)."""
    try:
        if not is_job_log(path) and options.format is None:
            if options.given or options.nodes is not None:
                flag = options.given or "--machine-nodes"
                raise UsageError(f"{flag} applies to a job log; {path} is a pool trace")
            return load_trace(path, nodes=nodes, start_s=start_s, end_s=end_s), False
        pool = read_log_pool(path, options)
        click.echo(pool.summary_line, err=True)
        if nodes is None:  # only the range's events are made
            return pool.pool.trace(start_s, end_s), True
        return pool.pool.trace().slice(nodes=nodes, start_s=start_s, end_s=end_s), True
    except (TraceFormatError, TraceRangeError) as exc:
        raise UsageError(str(exc)) from None


@trace.command("from-log")
@click.argument("log_path", metavar="LOG", type=InputFile())
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Trace file to write: .csv or .csv.gz.",
)
@log_options("--nodes")
def from_log(log_path: Path, out: Path, **log_kwargs: Any) -> None:
    """Write the pool trace of a scheduler's job LOG: the nodes no job held, when.

    LOG is sacct --parsable2 output, Slurm's job-completion log, LSF's lsb.acct, PBS or
    Cobalt accounting, or SWF, told apart by content. Each idle node gets window_s (what
    the scheduler's plan said then) and idle_s (how long it did stay idle). Prints one
    summary line: records repeated, node-hours over the machine, records skipped and why.
    Nothing is written when the log is refused. See docs/traces.md.
    """
    options = options_from(log_kwargs)
    try:
        check_trace_out(out)  # before the log is read: a year takes a while
        if out.suffix == ".parquet":
            raise UsageError(f"--out {out}: a trace from a job log is written as .csv or .csv.gz")
    except TraceFormatError as exc:
        raise UsageError(f"--out {exc}") from None
    _refuse_out_over_an_input(out, (("LOG", log_path), ("--node-list", options.node_list),
                                    ("--down", options.down)))  # fmt: skip
    pool = read_log_pool(log_path, options)
    try:
        rows = write_log_trace(pool.pool, out)
    except TraceFormatError as exc:
        raise UsageError(f"--out {exc}") from None
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    click.echo(pool.summary_line)
    p = pool.pool
    click.echo(
        f"wrote {out}: {len(p.machine.names):,} nodes, {(p.end_s - p.start_s) / 3600:,.1f} h, "
        f"{len(p.flips) - 1:,} events, {rows:,} rows"
    )


def _refuse_out_over_an_input(
    out: Path,
    inputs: tuple[tuple[str, Path | None], ...],
    option: str = "--out",
    written: str = "the trace",
) -> None:
    """An output naming an input (--out the job log, its node list, its down list; a plot
    of --plots the trace) replaced the user's file with ours, a file no command can
    rebuild: refused, by identity (a link, another spelling of the path)."""
    if not out.exists():
        return
    for flag, path in inputs:
        if path is not None and path.exists() and out.samefile(path):
            raise UsageError(f"{option} {out} is {flag} {path}: {written} would replace its input")


@trace.command("synth")
@click.option(
    "--nodes",
    type=SYNTHETIC_NODES,
    default=DEFAULT_NODES,
    show_default=True,
    help="Nodes; fewer than Summit's 4,608 are a slice of a Summit-sized machine.",
)
@click.option(
    "--hours",
    type=SYNTHETIC_HOURS,
    default=24.0,
    show_default=True,
    help="Duration (at most a year).",
)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Same seed, same trace.")
@click.option(
    "--poll-s",
    type=POSITIVE,
    default=SyntheticConfig().poll_s,
    show_default=True,
    help="Event times fall on this grid, as a monitor polling this often would see them.",
)
@click.option(
    "--start",
    help="Time of the first snapshot (time or epoch s) [default: 2021-02-10 00:00:00].",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Trace file to write: .csv, .csv.gz or .parquet.",
)
def synth(nodes: int, hours: float, seed: int, poll_s: float, start: str | None, out: Path) -> None:
    """Write a synthetic trace calibrated to the Summit statistics of the BFTrainer paper."""
    start_s = parse_time_option("--start", start)
    try:
        config = SyntheticConfig(
            nodes=nodes,
            duration_s=hours * 3600.0,
            seed=seed,
            poll_s=poll_s,
            **({} if start_s is None else {"start_s": start_s}),
        )
    except SyntheticConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        check_epoch_s(config.start_s + config.duration_s)
    except ValueError as exc:
        raise UsageError(f"--start and --hours: the trace would end at a {exc}") from None
    try:
        check_trace_out(out)  # before generating: a year of a large machine takes a while
    except TraceFormatError as exc:
        raise UsageError(f"--out {exc}") from None
    generated = synthetic_trace(config)
    try:
        rows = write_trace(generated, out)
    except TraceFormatError as exc:
        raise UsageError(f"--out {exc}") from None
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    click.echo(
        f"wrote {out}: {len(generated.nodes):,} nodes, {hours:g} h, "
        f"{len(generated.events):,} events, {rows:,} rows"
    )


trace.add_command(record)
