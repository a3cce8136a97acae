"""``bftrainer replay``: replay a pool trace with simulated trainers, offline."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
import signal
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from bftrainer import strict_json
from bftrainer.cli import UsageError
from bftrainer.cli.outdir import OutputDirError, check_output_dir, replaced_on_success
from bftrainer.cli.params import (
    POSITIVE,
    SEED,
    SYNTHETIC_HOURS,
    InputFile,
    Number,
)
from bftrainer.cli.policy_options import FLAG_NAMES as POLICY_FLAG_NAMES
from bftrainer.cli.policy_options import T_FWD, policy_flags, policy_options
from bftrainer.cli.trace import parse_node_range, parse_time_option
from bftrainer.config import ConfigError, load_config, with_overrides
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import (
    Trace,
    TraceFormatError,
    TraceRangeError,
    load_trace,
)
from bftrainer.jobs import JobSpec, JobSpecError, check_workload, jobs_in_slots
from bftrainer.replay.learning import CURVES, PRIORS
from bftrainer.replay.output import summary_table, write_result
from bftrainer.replay.plots import plot_costs, plot_sweep, plot_windows
from bftrainer.replay.pollux_output import pollux_summary, pollux_table, write_pollux_outputs
from bftrainer.replay.pollux_plots import plot_efficiency
from bftrainer.replay.pollux_sim import PolluxDriverFactory, PolluxReport, PolluxSimOptions
from bftrainer.replay.pollux_workload import (
    PolluxWorkloadError,
    generate_pollux_workload,
    read_pollux_workload,
    resolve_data_dir,
    resolve_workload_path,
)
from bftrainer.replay.run import (
    POLICIES,
    REPLAY_TABLES,
    ReplayConfig,
    ReplayError,
    ReplayResult,
    replay,
)
from bftrainer.replay.windows import WINDOW_MODES
from bftrainer.replay.workload import WorkloadError, diverse_workload, hpo_workload, read_paper_jobs
from bftrainer.replay.zoo import ZOO_SPS
from bftrainer.trainers import lifeline

log = logging.getLogger(__name__)

DEFAULT = ReplayConfig()
FLAG_NAMES = {
    **POLICY_FLAG_NAMES,
    "window_s": "--window-hours",
    "windows": "--windows",
    "windows_known_share": "--windows-share",
    "windows_lead_s": "--windows-lead",
    "windows_error_s": "--windows-error",
    "scavenger_size": "--scavenger-size",
    "checkpoint_every_s": "--checkpoint-every",
    "restart_s": "--restart-cost",
    "slots_per_node": "--slots-per-node",
    "curves": "--curves",
    "curves_prior": "--prior",
}


@click.command("replay")
@click.argument("trace_path", metavar="[TRACE]", required=False, type=InputFile(path_type=None))
@click.option("--nodes", "node_slice", help="Nodes by first-seen order, e.g. 0:1024.")
@click.option("--start", help="Replay from this time (YYYY-mm-dd HH:MM:SS, ISO-8601 or epoch s).")
@click.option("--end", help="Replay until this time.")
@click.option(
    "--synthetic-nodes",
    type=Number(integer=True, min=1, max=1_000_000),
    default=512,
    show_default=True,
    help="Without TRACE: nodes of the synthetic trace.",
)
@click.option(
    "--synthetic-hours",
    type=SYNTHETIC_HOURS,
    default=24.0,
    show_default=True,
    help="Without TRACE: its duration.",
)
@click.option(
    "--seed",
    type=SEED,
    default=0,
    show_default=True,
    help="Seed of the synthetic trace and workload.",
)
@click.option(
    "--jobs", "jobs_path", type=InputFile(path_type=None), help="A paper job set (*-Jbnd-*.csv)."
)
@click.option(
    "--profiles",
    "profiles_path",
    type=InputFile(path_type=None),
    help="Its profiles (*-JNPs-*.csv); found by name if omitted.",
)
@click.option(
    "--workload",
    type=click.Choice(["hpo", "diverse", "pollux"]),
    default="hpo",
    show_default=True,
    help="Built-in workload when --jobs is not given (pollux: docs/goodput-replay.md).",
)
@click.option(
    "--pollux-data",
    type=click.Path(file_okay=False),
    help="Pollux simulator data (traces/<app>/); default $BFTRAINER_POLLUX_DATA or "
    "../shared/data/pollux-sim beside the repository.",
)
@click.option(
    "--pollux-workload",
    help="With --workload pollux: a workload CSV, or N for workloads/workload-N.csv of "
    "--pollux-data; without it, --jobs-count jobs cycling the six applications.",
)
@click.option(
    "--batch-adapt/--no-batch-adapt",
    default=True,
    show_default=True,
    help="With --workload pollux: trainers pick their batch size by goodput at every rescale.",
)
@click.option(
    "--replicas-per-node",
    type=Number(integer=True, min=1, max=64),
    default=1,
    show_default=True,
    help="With --workload pollux: data-parallel replicas (GPUs of the profiles) per node; "
    "16 nodes x 4 is Pollux's cluster.",
)
@click.option(
    "--jobs-count",
    type=Number(integer=True, min=1, max=1_000_000),
    default=1000,
    show_default=True,
    help="Jobs of the built-in workload.",
)
@click.option(
    "--model",
    type=click.Choice(list(ZOO_SPS)),
    default="shufflenet",
    show_default=True,
    help="Model of the hpo workload.",
)
@click.option(
    "--interval",
    "interval_s",
    type=Number(min=0.0, max=1e7),
    default=36.0,
    show_default=True,
    help="Seconds between arrivals (mean, for diverse).",
)
@click.option(
    "--config",
    "config_path",
    type=InputFile(path_type=None),
    help="A TOML file with [policy] (and [replay]) settings; flags override it.",
)
@click.option(
    "--policy",
    "policies",
    help=f"Comma list of {', '.join(POLICIES)} (default {DEFAULT.policy}).",
)
@policy_options
@click.option(
    "--window-hours",
    type=POSITIVE,
    help=f"Window of the per-window U (default {DEFAULT.window_s / 3600:g}).",
)
@click.option(
    "--windows",
    type=click.Choice(list(WINDOW_MODES)),
    help="What the pool source knows of departures: none (default), oracle (the trace's "
    "true times), realistic (--windows-share/-lead/-error). docs/replay.md.",
)
@click.option(
    "--windows-share",
    "windows_known_share",
    type=Number(min=0.0, max=1.0),
    help="realistic: share of departures known (default 1).",
)
@click.option(
    "--windows-lead",
    "windows_lead_s",
    type=Number(min=0.0, max=1e9),
    help="realistic: a departure is known this many seconds ahead (default: from the join).",
)
@click.option(
    "--windows-error",
    "windows_error_s",
    type=Number(min=0.0, max=1e7),
    help="realistic: standard deviation of the stated departure time, s (default 0).",
)
@click.option(
    "--scavenger-size",
    type=Number(integer=True, min=1),
    help="scavenger: every job's rigid node count, within its own limits (default: its n_max).",
)
@click.option(
    "--checkpoint-every",
    "checkpoint_every_s",
    type=Number(min=0.0, min_open=True),
    help="scavenger: a job checkpoints every this many seconds of training; a kill loses "
    f"the training since (default {DEFAULT.checkpoint_every_s:g}).",
)
@click.option(
    "--restart-cost",
    "restart_s",
    type=Number(min=0.0),
    help="scavenger: seconds a requeued job holds its nodes restarting from its checkpoint "
    "(default: the job's R_up, what an elastic trainer pays to grow).",
)
@click.option(
    "--slots-per-node",
    type=Number(integer=True, min=1, max=1024),
    help="Slots (GPUs) per pool node, the unit of allocation: trainers share a node's "
    "slots; job curves given per node count S slots (default 1: whole nodes). "
    "docs/replay.md.",
)
@click.option(
    "--curves",
    type=click.Choice(CURVES),
    help="What the policy knows of each trainer's throughput curve: known (the job's "
    "profile; default) or learned (what the trainer has measured, and a prior; "
    "docs/replay.md).",
)
@click.option(
    "--prior",
    "curves_prior",
    type=click.Choice(PRIORS),
    help="learned: optimistic (Pollux: perfect scaling, capped at 2x the largest count run; "
    "default) or profile (a short probe at a few sizes on a trainer's first nodes).",
)
@click.option(
    "--sweep", help="tfwd=10,30,60,120,300: run the milp policy once per value, in parallel."
)
@click.option(
    "--executor",
    type=click.Choice(["local", "slurm"]),
    default="local",
    show_default=True,
    help="Where several runs go: processes here, or the tasks of one Slurm job array "
    "(submitit; docs/replay.md).",
)
@click.option("--slurm-partition", help="slurm: the array's partition (default: Slurm's).")
@click.option("--slurm-account", help="slurm: the account charged.")
@click.option(
    "--slurm-time",
    "slurm_time_min",
    type=Number(integer=True, min=1, max=525_600),
    help="slurm: each task's time limit, minutes (default 60).",
)
@click.option(
    "--slurm-folder",
    type=click.Path(file_okay=False, path_type=Path),
    help="slurm: the tasks' inputs, results and logs, on a filesystem the nodes share "
    "(default: OUT.slurm beside --out).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option(
    "--progress/--no-progress", default=True, help="Progress bar on stderr (when a terminal)."
)
def replay_cmd(
    trace_path: str | None,
    node_slice: str | None,
    start: str | None,
    end: str | None,
    synthetic_nodes: int,
    synthetic_hours: float,
    seed: int,
    jobs_path: str | None,
    profiles_path: str | None,
    workload: str,
    pollux_data: str | None,
    pollux_workload: str | None,
    batch_adapt: bool,
    replicas_per_node: int,
    jobs_count: int,
    model: str,
    interval_s: float,
    config_path: str | None,
    policies: str | None,
    window_hours: float | None,
    windows: str | None,
    windows_known_share: float | None,
    windows_lead_s: float | None,
    windows_error_s: float | None,
    scavenger_size: int | None,
    checkpoint_every_s: float | None,
    restart_s: float | None,
    slots_per_node: int | None,
    curves: str | None,
    curves_prior: str | None,
    sweep: str | None,
    executor: str,
    slurm_partition: str | None,
    slurm_account: str | None,
    slurm_time_min: int | None,
    slurm_folder: Path | None,
    out_dir: Path,
    progress: bool,
    **policy: Any,
) -> None:
    """Replay TRACE (or the embedded synthetic default) with simulated trainers.

    Writes summary.json, events.csv, trainers.csv, windows.csv and PNG plots to --out,
    and prints a short table. With several policies or a sweep, each run has its own
    folder and the top-level summary.json lists them all. See docs/replay.md.
    """
    trace = _load(trace_path, node_slice, start, end, synthetic_nodes, synthetic_hours, seed)
    flags = {
        **policy_flags(policy),
        "window_s": window_hours * 3600 if window_hours is not None else None,
        "windows": windows,
        "windows_known_share": windows_known_share,
        "windows_lead_s": windows_lead_s,
        "windows_error_s": windows_error_s,
        "scavenger_size": scavenger_size,
        "checkpoint_every_s": checkpoint_every_s,
        "restart_s": restart_s,
        "slots_per_node": slots_per_node,
        "curves": curves,
        "curves_prior": curves_prior,
    }
    try:
        base = DEFAULT
        if config_path is not None:
            base = load_config(Path(config_path), base, REPLAY_TABLES)
        base = with_overrides(base, flags, FLAG_NAMES)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    _refuse_workload_with_jobs(jobs_path)
    if workload != "pollux" or jobs_path:
        _refuse_given(("pollux_data", "batch_adapt"), "needs --workload pollux (and no --jobs)")
    factory = None
    if workload == "pollux" and not jobs_path:
        jobs, factory = _pollux(
            pollux_data,
            pollux_workload,
            batch_adapt,
            jobs_count,
            interval_s,
            seed,
            trace,
            replicas_per_node,
            base.slots_per_node,
        )
    else:
        if pollux_workload is not None:
            raise UsageError("--pollux-workload needs --workload pollux (and no --jobs)")
        if replicas_per_node != 1:
            raise UsageError("--replicas-per-node needs --workload pollux (and no --jobs)")
        jobs = _jobs(jobs_path, profiles_path, workload, jobs_count, model, interval_s, seed, trace)
        jobs = jobs_in_slots(jobs, base.slots_per_node)
    try:
        check_workload(jobs)  # the whole workload, before any replay starts
    except JobSpecError as e:
        raise UsageError(f"{jobs_path or 'workload'}: {e}") from None
    if sweep:
        if policies is not None and policies.strip() != "milp":
            raise UsageError(f"--sweep runs the milp policy only; drop --policy {policies!r}")
        configs = [replace(base, policy="milp", t_fwd_s=v) for v in _sweep_values(sweep)]
    else:
        names = [p.strip() for p in (policies or base.policy).split(",") if p.strip()]
        if not names:
            raise UsageError(f"--policy {policies!r}: name one of {', '.join(POLICIES)}")
        for p in names:
            if p not in POLICIES:
                raise UsageError(f"--policy {p!r} is not one of {', '.join(POLICIES)}")
            if names.count(p) > 1:
                raise UsageError(f"--policy {p!r} is named twice (its runs share one folder)")
        configs = [replace(base, policy=p) for p in names]
        if factory is not None and "scavenger" in names:
            raise UsageError(
                "--policy scavenger replays rigid jobs from their throughput curves; it "
                "cannot run Pollux's trainers (--workload pollux)"
            )
    windows_count = (trace.end_s - trace.start_s) / base.window_s
    if windows_count > MAX_WINDOWS:
        raise UsageError(
            f"--window-hours {base.window_s / 3600:g}: {windows_count:.3g} windows over the "
            f"trace's {(trace.end_s - trace.start_s) / 3600:g} h; at most {MAX_WINDOWS:,}"
        )
    slurm_flags = {
        "--slurm-partition": slurm_partition,
        "--slurm-account": slurm_account,
        "--slurm-time": slurm_time_min,
        "--slurm-folder": slurm_folder,
    }
    if executor != "slurm" and any(v is not None for v in slurm_flags.values()):
        given = next(k for k, v in slurm_flags.items() if v is not None)
        raise UsageError(f"{given} needs --executor slurm")
    try:
        check_output_dir(out_dir, "replay")  # before the run, not after an hour of it
    except OutputDirError as e:
        raise UsageError(f"--out {e}") from None
    failures: list[tuple[ReplayConfig, str, Path]] = []
    try:
        if executor == "slurm":
            folder = slurm_folder or out_dir.with_name(out_dir.name + ".slurm")
            outcomes, failures = _run_on_slurm(
                (trace, jobs, factory),
                configs,
                folder,
                slurm_partition,
                slurm_account,
                slurm_time_min,
                progress,
            )
        else:
            outcomes = _run_all(trace, jobs, configs, progress, factory)
    except ReplayError as e:
        raise UsageError(str(e)) from None
    for config, reason, log_path in failures:
        click.echo(f"replay {_label(config)} failed: {reason}; its log: {log_path}", err=True)
    if not outcomes:
        raise click.ClickException(f"every replay failed; --out {out_dir} left as it was")
    results = [r for r, _ in outcomes]
    for r, rep in outcomes:
        r.summary["workload"] = _workload_record(jobs_path, workload, pollux_workload, len(jobs))
        if rep is not None:
            end_s = r.metrics.start_s + r.summary["hours"] * 3600
            r.summary.update(pollux_summary(r.trainers, end_s, rep))
    reports = [(r, rep) for r, rep in outcomes if rep is not None]
    try:
        with replaced_on_success(out_dir, "replay") as tmp:
            _write_outputs(tmp, results, reports, bool(sweep), nested=len(configs) > 1)
    except OutputDirError as e:
        raise UsageError(f"--out {e}") from None
    click.echo(summary_table(results))
    if reports:
        click.echo("\n" + pollux_table([(_label(r), r.summary) for r, _ in reports]))
    click.echo(f"\nwrote {out_dir}/")
    if failures:
        raise click.ClickException(
            f"{len(failures)} of {len(configs)} replays failed (named above); the others' "
            "results are written"
        )


def _write_outputs(
    out_dir: Path,
    results: list[ReplayResult],
    reports: list[tuple[ReplayResult, PolluxReport]],
    sweep: bool,
    nested: bool,
) -> None:
    """Every output file, into ``out_dir`` (a fresh folder: see cli/outdir.py); with
    ``nested``, each run in its own folder (several runs asked for, even if some failed)."""
    if not nested:
        write_result(results[0], out_dir)
    else:
        for r in results:
            write_result(r, out_dir / _label(r))
        runs = [json.loads((out_dir / _label(r) / "summary.json").read_text()) for r in results]
        (out_dir / "summary.json").write_text(strict_json.dumps({"runs": runs}, indent=2) + "\n")
    _plot(plot_windows, results, out_dir / "utilization_per_window.png")
    _plot(plot_costs, results, out_dir / "costs.png")
    if sweep:
        _plot(plot_sweep, results, out_dir / "utilization_vs_tfwd.png")
    for r, rep in reports:
        write_pollux_outputs(r.trainers, rep, out_dir / _label(r) if nested else out_dir)
    if len(reports) > 1:
        _plot(plot_efficiency, [(_label(r), rep) for r, rep in reports], out_dir / "efficiency.png")


def _plot(draw: Callable[[Any, Path], object], data: Any, path: Path) -> None:
    """A figure that cannot be drawn costs that figure only: the runs' results (hours of
    work, all in summary.json and the CSVs) are written whatever a plot does."""
    try:
        draw(data, path)
    except Exception as exc:
        log.error("%s not written: %r (the figures are in the CSV files)", path.name, exc)


def _label(run: ReplayResult | ReplayConfig) -> str:
    c = run.config if isinstance(run, ReplayResult) else run
    tfwd = c.t_fwd_s if isinstance(c.t_fwd_s, str) else f"{c.t_fwd_s:g}"
    return f"milp-tfwd{tfwd}" if c.policy == "milp" else c.policy


# Windows of the per-window U: each is a row of windows.csv and a bar of its plot.
MAX_WINDOWS = 100_000


def _sweep_values(text: str) -> list[float | str]:
    key, _, values = text.partition("=")
    if key.strip() != "tfwd" or not values:
        raise UsageError(f"--sweep {text!r}: expected tfwd=V1,V2,... (seconds or auto)")
    out = [T_FWD.parse(v) for v in values.split(",")]
    if any(v is None for v in out):
        raise UsageError(f"--sweep {text!r}: each T_fwd must be {T_FWD.describe()} (seconds)")
    twice = next((v for i, v in enumerate(out) if v in out[:i]), None)
    if twice is not None:
        raise UsageError(f"--sweep {text!r}: T_fwd {twice} is given twice (one folder per value)")
    return [v if isinstance(v, str) else float(v) for v in out if v is not None]


def _load(
    path: str | None,
    nodes: str | None,
    start: str | None,
    end: str | None,
    synthetic_nodes: int,
    synthetic_hours: float,
    seed: int,
) -> Trace:
    node_slice = parse_node_range(nodes)
    start_s = parse_time_option("--start", start)
    end_s = parse_time_option("--end", end)
    try:
        if path is None:
            trace = synthetic_trace(
                SyntheticConfig(nodes=synthetic_nodes, duration_s=synthetic_hours * 3600, seed=seed)
            )
            if node_slice or start_s is not None or end_s is not None:
                trace = trace.slice(nodes=node_slice, start_s=start_s, end_s=end_s)
            return trace
        return load_trace(path, nodes=node_slice, start_s=start_s, end_s=end_s)
    except (TraceFormatError, TraceRangeError, ValueError) as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None


# Options of the built-in workloads, which a paper job set (--jobs) replaces.
_BUILT_IN_ONLY = ("workload", "jobs_count", "model", "interval_s")


def _given(names: tuple[str, ...]) -> str | None:
    """The flag of the first of ``names`` given on the command line, or None."""
    ctx = click.get_current_context()
    for name in names:
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            param = next(p for p in ctx.command.params if p.name == name)
            return "/".join([max(param.opts, key=len), *param.secondary_opts])
    return None


def _refuse_given(names: tuple[str, ...], why: str) -> None:
    flag = _given(names)
    if flag is not None:
        raise UsageError(f"{flag} {why}")


def _refuse_workload_with_jobs(jobs_path: str | None) -> None:
    """--jobs with an option of the built-in workloads given too: one line (the option
    was ignored without a word)."""
    flag = _given(_BUILT_IN_ONLY) if jobs_path else None
    if flag is not None:
        raise UsageError(
            f"{flag} and --jobs conflict: --jobs replays a paper job set, {flag} "
            "shapes a built-in workload; give one of them"
        )


def _workload_record(
    jobs_path: str | None, workload: str, pollux_workload: str | None, count: int
) -> dict[str, Any]:
    """What summary.json says was replayed."""
    if jobs_path:
        return {"name": "jobs", "file": str(jobs_path), "jobs": count}
    return {"name": workload, "file": pollux_workload, "jobs": count}


def _jobs(
    jobs_path: str | None,
    profiles_path: str | None,
    workload: str,
    count: int,
    model: str,
    interval_s: float,
    seed: int,
    trace: Trace,
) -> list[JobSpec]:
    try:
        if jobs_path:
            return read_paper_jobs(Path(jobs_path), Path(profiles_path) if profiles_path else None)
        if workload == "hpo":
            return hpo_workload(count, trace.start_s, model=model, interval_s=interval_s)
        return diverse_workload(count, trace.start_s, mean_interarrival_s=interval_s, seed=seed)
    except WorkloadError as e:
        raise UsageError(str(e)) from None


Run = tuple[ReplayResult, PolluxReport | None]


def _run_one(
    args: tuple[Trace, list[JobSpec], ReplayConfig, PolluxDriverFactory | None],
) -> Run:
    trace, jobs, config, factory = args
    if factory is None:
        return replay(trace, jobs, config), None
    driver = factory()
    return replay(trace, jobs, config, driver=driver), driver.report()


# A worker's copy of the inputs every run shares (see _run_all).
_inputs: tuple[Trace, list[JobSpec], PolluxDriverFactory | None] | None = None


def _load_inputs(path: str, parent_pid: int) -> None:
    """A worker's start: it dies with the replay that started it, however that ends
    (SIGKILL included: the pool's own exit never runs then), and reads the inputs."""
    global _inputs
    lifeline.die_with_parent(signal.SIGKILL, parent_pid)
    _inputs = pickle.loads(Path(path).read_bytes())


def _run_config(config: ReplayConfig) -> Run:
    assert _inputs is not None, "the pool's initializer did not run"
    return run_with_inputs(_inputs, config)


Inputs = tuple[Trace, list[JobSpec], PolluxDriverFactory | None]


def run_with_inputs(inputs: Inputs, config: ReplayConfig) -> Run:
    """One run of a sweep, from the inputs every run shares (a Slurm task runs this)."""
    trace, jobs, factory = inputs
    return _run_one((trace, jobs, config, factory))


def _run_on_slurm(
    inputs: Inputs,
    configs: list[ReplayConfig],
    folder: Path,
    partition: str | None,
    account: str | None,
    time_min: int | None,
    progress: bool,
) -> tuple[list[Run], list[tuple[ReplayConfig, str, Path]]]:
    """The runs as one Slurm job array (bftrainer/replay/slurm_sweep.py): the runs that
    ended, and (config, why, log) for each task that did not."""
    try:
        from bftrainer.replay.slurm_sweep import SlurmOptions, SlurmSweepError, run_array
    except ImportError:
        raise UsageError(
            "--executor slurm needs submitit: pip install 'bftrainer[slurm]'"
        ) from None
    options = SlurmOptions(folder, partition, account, time_min or 60)
    try:
        outcomes = run_array(run_with_inputs, inputs, configs, options, progress)
    except SlurmSweepError as e:
        raise UsageError(str(e)) from None
    runs: list[Run] = []
    failures = []
    for config, outcome in zip(configs, outcomes, strict=True):
        if isinstance(outcome, tuple):
            runs.append(outcome)
        else:
            failures.append((config, outcome.reason, outcome.log))
    return runs, failures


def _run_all(
    trace: Trace,
    jobs: list[JobSpec],
    configs: list[ReplayConfig],
    progress: bool,
    factory: PolluxDriverFactory | None = None,
) -> list[Run]:
    if len(configs) > 1:
        workers = min(len(configs), os.cpu_count() or 1)
        # Single-threaded BLAS in each worker: two Pollux replays side by side, each with
        # OpenBLAS's own threads, ran 8x slower on 2 cores. Spawned workers read the
        # variable when they import numpy.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        spawn = multiprocessing.get_context("spawn")
        # Ctrl-C reaches every process of the terminal's group. Workers are born
        # ignoring it (SIG_IGN survives exec, so it holds while they import): none prints
        # a traceback, and the pool's exit terminates them. This process ignores it only
        # while it starts them, with SIGINT blocked meanwhile: a Ctrl-C in that window
        # stays pending and lands once the pool is in its ``with`` (it was lost before,
        # and the replay ran to its end). Tasks hold only a config: a large task blocked
        # in the pool's pipe would hang the pool's exit once its workers are gone.
        with tempfile.TemporaryDirectory(prefix="bftrainer-replay-") as tmp:
            inputs = Path(tmp) / "inputs.pickle"
            inputs.write_bytes(pickle.dumps((trace, jobs, factory)))
            sigint = {signal.SIGINT}
            signal.pthread_sigmask(signal.SIG_BLOCK, sigint)
            try:
                handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
                try:
                    pool = spawn.Pool(workers, _load_inputs, (str(inputs), os.getpid()))
                finally:
                    signal.signal(signal.SIGINT, handler)
                with pool:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, sigint)
                    results = list(
                        tqdm(
                            pool.imap(_run_config, configs),
                            total=len(configs),
                            desc="replays",
                            unit="run",
                            disable=not progress or None,
                        )
                    )
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, sigint)
        return results
    with tqdm(total=1000, desc=configs[0].policy, unit="‰", disable=not progress or None) as bar:

        def update(fraction: float) -> None:
            bar.update(int(fraction * 1000) - bar.n)

        driver = factory() if factory else None
        result = replay(trace, jobs, configs[0], driver=driver, on_progress=update)
        return [(result, driver.report() if driver else None)]


def _pollux(
    data: str | None,
    workload_file: str | None,
    batch_adapt: bool,
    count: int,
    interval_s: float,
    seed: int,
    trace: Trace,
    replicas_per_node: int = 1,
    slots_per_node: int = 1,
) -> tuple[list[JobSpec], PolluxDriverFactory]:
    """Jobs of Pollux's applications, submitted from the trace's start, and the factory
    of their driver; a node runs ``replicas_per_node`` replicas of a job, or with
    ``slots_per_node`` S > 1, one replica per slot of several jobs."""
    if slots_per_node > 1 and replicas_per_node != 1:
        raise UsageError(
            "--replicas-per-node gives a whole node's replicas to one job; with "
            "--slots-per-node a slot is one replica: give one of them"
        )
    try:
        data_dir = resolve_data_dir(data)
        if workload_file is not None:
            path = resolve_workload_path(workload_file, data_dir)
            w = read_pollux_workload(
                path,
                data_dir,
                trace.start_s,
                replicas_per_node=replicas_per_node,
                slots_per_node=slots_per_node,
            )
        else:
            w = generate_pollux_workload(
                count,
                trace.start_s,
                data_dir,
                mean_interarrival_s=interval_s,
                seed=seed,
                replicas_per_node=replicas_per_node,
                slots_per_node=slots_per_node,
            )
    except PolluxWorkloadError as e:
        raise UsageError(str(e)) from None
    options = PolluxSimOptions(batch_adapt=batch_adapt, seed=seed, slots_per_node=slots_per_node)
    return list(w.jobs), PolluxDriverFactory(tuple(w.apps.items()), data_dir, options)
