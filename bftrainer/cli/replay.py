"""``bftrainer replay``: replay a pool trace with simulated trainers, offline.

The command, and the checks that name its options (replay_options.py); what it replays
(bftrainer/replay/inputs.py), its runs (sweep.py), where they run (executors.py) and
what it writes (runs_output.py) live in the replay package.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import click

from bftrainer.cli import UsageError
from bftrainer.cli.joblog_options import LogOptions, options_from
from bftrainer.cli.outdir import (
    OutputDirError,
    check_output_dir,
    refuse_inputs_inside,
    replaced_on_success,
)
from bftrainer.cli.policy_options import T_FWD, policy_flags
from bftrainer.cli.replay_options import DEFAULT, FLAG_NAMES, replay_options
from bftrainer.cli.trace import load_trace_or_log, parse_node_range, parse_time_option
from bftrainer.idle_monitor.trace import Trace
from bftrainer.loop.jobs import JobSpec, JobSpecError, check_workload, jobs_in_slots
from bftrainer.milp import ProblemError
from bftrainer.policies.config import (
    ConfigError,
    given_fields,
    load_config,
    refuse_unused,
    with_overrides,
)
from bftrainer.replay.executors import run_all, run_on_slurm
from bftrainer.replay.inputs import pollux_jobs, replay_trace, workload_jobs, workload_record
from bftrainer.replay.output import summary_table
from bftrainer.replay.pollux.output import pollux_summary, pollux_table
from bftrainer.replay.run import REPLAY_NEEDS, REPLAY_TABLES, ReplayConfig, ReplayError
from bftrainer.replay.runs_output import write_outputs
from bftrainer.replay.sweep import policy_configs, run_label, sweep_configs, unused_by_policies

log = logging.getLogger(__name__)


@click.command("replay")
@replay_options
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
    search: str | None,
    search_pruner: str | None,
    search_trials: int | None,
    sweep: str | None,
    executor: str,
    slurm_partition: str | None,
    slurm_account: str | None,
    slurm_time_min: int | None,
    slurm_folder: Path | None,
    shift_arrivals: str | None,
    out_dir: Path,
    progress: bool,
    **policy: Any,
) -> None:
    """Replay TRACE (or the embedded synthetic default) with simulated trainers.

    Writes summary.json, events.csv, trainers.csv, windows.csv and PNG plots to --out,
    and prints a short table. With several policies or a sweep, each run has its own
    folder and the top-level summary.json lists them all. See docs/replay.md.
    """
    log_options_given = options_from(policy)
    if trace_path is not None:
        _refuse_given(
            ("synthetic_nodes", "synthetic_hours"), "shapes the synthetic trace: not with TRACE"
        )
        if jobs_path is not None:
            _refuse_given(
                ("seed",), "shapes the synthetic trace and workload: not with TRACE and --jobs"
            )
    trace, from_log = _load(
        trace_path,
        log_options_given,
        node_slice,
        start,
        end,
        synthetic_nodes,
        synthetic_hours,
        seed,
    )
    if from_log and windows is None and config_path is None:
        windows = "trace"  # a job log states what the scheduler planned: use it
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
        "search": search,
        "search_pruner": search_pruner,
        "search_trials": search_trials,
    }
    try:
        base = DEFAULT
        if config_path is not None:
            base = load_config(Path(config_path), base, REPLAY_TABLES)
        base = with_overrides(base, flags, FLAG_NAMES)
        set_by = given_fields(Path(config_path), REPLAY_TABLES) if config_path else {}
        set_by.update({f: FLAG_NAMES.get(f, f) for f, v in flags.items() if v is not None})
        refuse_unused(base, set_by, REPLAY_NEEDS)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    _refuse_workload_with_jobs(jobs_path)
    if workload != "pollux" or jobs_path:
        _refuse_given(("pollux_data", "batch_adapt"), "needs --workload pollux (and no --jobs)")
    factory = None
    arrival_shift_s: float | None = None
    if shift_arrivals is not None and (workload == "pollux" and not jobs_path):
        raise UsageError("--shift-arrivals moves a --jobs job set: give --jobs")
    if workload == "pollux" and not jobs_path:
        try:
            jobs, factory = pollux_jobs(
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
        except ReplayError as e:
            raise UsageError(str(e)) from None
    else:
        if pollux_workload is not None:
            raise UsageError("--pollux-workload needs --workload pollux (and no --jobs)")
        if replicas_per_node != 1:
            raise UsageError("--replicas-per-node needs --workload pollux (and no --jobs)")
        try:
            jobs = workload_jobs(
                jobs_path, profiles_path, workload, jobs_count, model, interval_s, seed, trace
            )
        except ReplayError as e:
            raise UsageError(str(e)) from None
        if shift_arrivals is not None:
            if not jobs_path:
                raise UsageError("--shift-arrivals moves a --jobs job set: give --jobs")
            jobs, arrival_shift_s = _shifted(jobs, shift_arrivals, trace)
        jobs = jobs_in_slots(jobs, base.slots_per_node)
    if sweep:
        if policies is not None and policies.strip() != "milp":
            raise UsageError(f"--sweep runs the milp policy only; drop --policy {policies!r}")
        configs = sweep_configs(base, _sweep_values(sweep))
    else:
        try:
            configs = policy_configs(base, policies, pollux=factory is not None)
        except ReplayError as e:
            raise UsageError(str(e)) from None
    try:  # the whole workload, before any replay starts, as its runs value it
        speedup = any(c.policy == "milp" and c.objective == "speedup" for c in configs)
        check_workload(jobs, speedup=speedup)
    except JobSpecError as e:
        raise UsageError(f"{jobs_path or 'workload'}: {e}") from None
    unused = unused_by_policies(configs, set_by)
    if unused is not None:
        raise UsageError(f"{unused[0]} means nothing without --policy {unused[1]}")
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
    inputs = (
        ("TRACE", trace_path),
        ("--jobs", jobs_path),
        ("--profiles", profiles_path),
        ("--config", config_path),
        ("--pollux-data", pollux_data),
        ("--pollux-workload", pollux_workload),
        ("--node-list", log_options_given.node_list),
        ("--down", log_options_given.down),
    )
    try:
        check_output_dir(out_dir, "replay")  # before the run, not after an hour of it
        refuse_inputs_inside(out_dir, inputs)
    except OutputDirError as e:
        raise UsageError(f"--out {e}") from None
    failures: list[tuple[ReplayConfig, str, Path]] = []
    try:
        if executor == "slurm":
            folder = slurm_folder or out_dir.with_name(out_dir.name + ".slurm")
            outcomes, failures = run_on_slurm(
                (trace, jobs, factory),
                configs,
                folder,
                slurm_partition,
                slurm_account,
                slurm_time_min,
                progress,
            )
        else:
            outcomes = run_all(trace, jobs, configs, progress, factory)
    except ReplayError as e:
        raise UsageError(str(e)) from None
    except ProblemError as e:  # what only a decision finds (a fair share's divisor)
        raise UsageError(f"{jobs_path or 'workload'}: {e}") from None
    for config, reason, log_path in failures:
        click.echo(f"replay {run_label(config)} failed: {reason}; its log: {log_path}", err=True)
    if not outcomes:
        raise click.ClickException(f"every replay failed; --out {out_dir} left as it was")
    results = [r for r, _ in outcomes]
    for r, rep in outcomes:
        r.summary["workload"] = workload_record(jobs_path, workload, pollux_workload, len(jobs))
        if arrival_shift_s is not None:
            r.summary["arrival_shift_s"] = arrival_shift_s
        if rep is not None:
            end_s = r.metrics.start_s + r.summary["hours"] * 3600
            r.summary.update(pollux_summary(r.trainers, end_s, rep))
    reports = [(r, rep) for r, rep in outcomes if rep is not None]
    try:
        with replaced_on_success(out_dir, "replay") as tmp:
            write_outputs(tmp, results, reports, bool(sweep), nested=len(configs) > 1)
    except OutputDirError as e:
        raise UsageError(f"--out {e}") from None
    click.echo(summary_table(results))
    if reports:
        click.echo("\n" + pollux_table([(run_label(r), r.summary) for r, _ in reports]))
    click.echo(f"\nwrote {out_dir}/")
    if failures:
        raise click.ClickException(
            f"{len(failures)} of {len(configs)} replays failed (named above); the others' "
            "results are written"
        )


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
    log_options: LogOptions,
    nodes: str | None,
    start: str | None,
    end: str | None,
    synthetic_nodes: int,
    synthetic_hours: float,
    seed: int,
) -> tuple[Trace, bool]:
    """The trace to replay, and whether it came from a job log."""
    node_slice = parse_node_range(nodes)
    start_s = parse_time_option("--start", start)
    end_s = parse_time_option("--end", end)
    if path is not None:
        return load_trace_or_log(Path(path), log_options, node_slice, start_s, end_s)
    if log_options.given or log_options.nodes is not None:
        raise UsageError(f"{log_options.given or '--machine-nodes'} needs a job LOG to replay")
    try:
        trace = replay_trace(
            path, node_slice, start_s, end_s, synthetic_nodes, synthetic_hours, seed
        )
    except ReplayError as e:
        raise UsageError(str(e)) from None
    return trace, False


def _shifted(jobs: list[JobSpec], shift: str, trace: Trace) -> tuple[list[JobSpec], float]:
    """The job set with its arrivals moved so the first is at ``shift`` (a time, or
    ``start`` for the trace's start), and the shift in seconds."""
    target = (
        trace.start_s if shift.strip() == "start" else parse_time_option("--shift-arrivals", shift)
    )
    assert target is not None
    first = min(j.submit_s for j in jobs)
    offset = target - first
    return [dataclasses.replace(j, submit_s=j.submit_s + offset) for j in jobs], offset


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
