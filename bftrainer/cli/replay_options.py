"""``bftrainer replay``'s argument and options, in the order ``--help`` lists them, and
the flag that sets each field of its configuration (for errors that name the flag)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from bftrainer.cli.joblog_options import log_options
from bftrainer.cli.params import POSITIVE, SEED, SYNTHETIC_HOURS, InputFile, Number
from bftrainer.cli.policy_options import FLAG_NAMES as POLICY_FLAG_NAMES
from bftrainer.cli.policy_options import policy_options
from bftrainer.replay.learning import CURVES, PRIORS
from bftrainer.replay.run import MAX_WINDOWS_ERROR_S, MAX_WINDOWS_LEAD_S, POLICIES, ReplayConfig
from bftrainer.replay.search import SEARCH_PRUNERS, SEARCH_TRIALS_MAX, SEARCHES
from bftrainer.replay.windows import WINDOW_MODES
from bftrainer.replay.zoo import ZOO_SPS

F = TypeVar("F", bound=Callable[..., Any])

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
    "search": "--search",
    "search_pruner": "--pruner",
    "search_trials": "--trials",
}


def replay_options(func: F) -> F:
    """Add the replay's argument and options; each arrives as a keyword."""
    options = [
        click.argument(
            "trace_path", metavar="[TRACE|LOG]", required=False, type=InputFile(path_type=None)
        ),
        log_options("--machine-nodes"),
        click.option("--nodes", "node_slice", help="Nodes by first-seen order, e.g. 0:1024."),
        click.option(
            "--start", help="Replay from this time (YYYY-mm-dd HH:MM:SS, ISO-8601 or epoch s)."
        ),
        click.option("--end", help="Replay until this time."),
        click.option(
            "--synthetic-nodes",
            type=Number(integer=True, min=1, max=1_000_000),
            default=512,
            show_default=True,
            help="Without TRACE: nodes of the synthetic trace.",
        ),
        click.option(
            "--synthetic-hours",
            type=SYNTHETIC_HOURS,
            default=24.0,
            show_default=True,
            help="Without TRACE: its duration.",
        ),
        click.option(
            "--seed",
            type=SEED,
            default=0,
            show_default=True,
            help="Seed of the synthetic trace and workload.",
        ),
        click.option(
            "--jobs",
            "jobs_path",
            type=InputFile(path_type=None),
            help="A paper job set (*-Jbnd-*.csv).",
        ),
        click.option(
            "--profiles",
            "profiles_path",
            type=InputFile(path_type=None),
            help="Its profiles (*-JNPs-*.csv); found by name if omitted.",
        ),
        click.option(
            "--workload",
            type=click.Choice(["hpo", "diverse", "pollux"]),
            default="hpo",
            show_default=True,
            help="Built-in workload when --jobs is not given (pollux: docs/goodput-replay.md).",
        ),
        click.option(
            "--pollux-data",
            type=click.Path(file_okay=False),
            help="Pollux simulator data (traces/<app>/); default $BFTRAINER_POLLUX_DATA or "
            "../shared/data/pollux-sim beside the repository.",
        ),
        click.option(
            "--pollux-workload",
            help="With --workload pollux: a workload CSV, or N for workloads/workload-N.csv of "
            "--pollux-data; without it, --jobs-count jobs cycling the six applications.",
        ),
        click.option(
            "--batch-adapt/--no-batch-adapt",
            default=True,
            show_default=True,
            help="With --workload pollux: trainers pick their batch size by goodput at every "
            "rescale.",
        ),
        click.option(
            "--replicas-per-node",
            type=Number(integer=True, min=1, max=64),
            default=1,
            show_default=True,
            help="With --workload pollux: data-parallel replicas (GPUs of the profiles) per node; "
            "16 nodes x 4 is Pollux's cluster.",
        ),
        click.option(
            "--jobs-count",
            type=Number(integer=True, min=1, max=1_000_000),
            default=1000,
            show_default=True,
            help="Jobs of the built-in workload.",
        ),
        click.option(
            "--model",
            type=click.Choice(list(ZOO_SPS)),
            default="shufflenet",
            show_default=True,
            help="Model of the hpo workload.",
        ),
        click.option(
            "--interval",
            "interval_s",
            type=Number(min=0.0, max=1e7),
            default=36.0,
            show_default=True,
            help="Seconds between arrivals (mean, for diverse).",
        ),
        click.option(
            "--config",
            "config_path",
            type=InputFile(path_type=None),
            help="A TOML file with [policy] (and [replay]) settings; flags override it.",
        ),
        click.option(
            "--policy",
            "policies",
            help=f"Comma list of {', '.join(POLICIES)} (default {DEFAULT.policy}).",
        ),
        policy_options,
        click.option(
            "--window-hours",
            type=POSITIVE,
            help=f"Window of the per-window U (default {DEFAULT.window_s / 3600:g}).",
        ),
        click.option(
            "--windows",
            type=click.Choice(list(WINDOW_MODES)),
            help="What the pool source knows of departures: none (default for a trace), trace (the "
            "windows it states; default for a job log), oracle (the true times), realistic "
            "(--windows-share/-lead/-error). docs/replay.md.",
        ),
        click.option(
            "--windows-share",
            "windows_known_share",
            type=Number(min=0.0, max=1.0),
            help="realistic: share of departures known (default 1).",
        ),
        click.option(
            "--windows-lead",
            "windows_lead_s",
            type=Number(min=0.0, max=MAX_WINDOWS_LEAD_S),
            help="realistic: a departure is known this many seconds ahead (default: from the "
            "join).",
        ),
        click.option(
            "--windows-error",
            "windows_error_s",
            type=Number(min=0.0, max=MAX_WINDOWS_ERROR_S),
            help="realistic: standard deviation of the stated departure time, s (default 0).",
        ),
        click.option(
            "--scavenger-size",
            type=Number(integer=True, min=1),
            help="scavenger: every job's rigid node count, within its own limits (default: its "
            "n_max).",
        ),
        click.option(
            "--checkpoint-every",
            "checkpoint_every_s",
            type=Number(min=0.0, min_open=True),
            help="scavenger: a job checkpoints every this many seconds of training; a kill loses "
            f"the training since (default {DEFAULT.checkpoint_every_s:g}).",
        ),
        click.option(
            "--restart-cost",
            "restart_s",
            type=Number(min=0.0),
            help="scavenger: seconds a requeued job holds its nodes restarting from its checkpoint "
            "(default: the job's R_up, what an elastic trainer pays to grow).",
        ),
        click.option(
            "--slots-per-node",
            type=Number(integer=True, min=1, max=1024),
            help="Slots (GPUs) per pool node, the unit of allocation: trainers share a node's "
            "slots; job curves given per node count S slots (default 1: whole nodes). "
            "docs/replay.md.",
        ),
        click.option(
            "--curves",
            type=click.Choice(CURVES),
            help="What the policy knows of each trainer's throughput curve: known (the job's "
            "profile; default) or learned (what the trainer has measured, and a prior; "
            "docs/replay.md).",
        ),
        click.option(
            "--prior",
            "curves_prior",
            type=click.Choice(PRIORS),
            help="learned: peers (default: what trainers of the same model measured, else as "
            "optimistic), optimistic (Pollux: perfect scaling, capped at 2x the largest count run) "
            "or profile (a short probe at a few sizes on a trainer's first nodes).",
        ),
        click.option(
            "--search",
            type=click.Choice(SEARCHES),
            help="Replay a search instead: Optuna's sampler asks a trial (a job like the first of "
            "the workload) whenever the pool can run one more; adds time_to_target_s to "
            "summary.json (docs/replay.md, 'Searches'; the hpo extra).",
        ),
        click.option(
            "--pruner",
            "search_pruner",
            type=click.Choice(SEARCH_PRUNERS),
            help="--search: asha (default), hyperband or none.",
        ),
        click.option(
            "--trials",
            "search_trials",
            type=Number(integer=True, min=1, max=SEARCH_TRIALS_MAX),
            help="--search: trials in the search (default 100).",
        ),
        click.option(
            "--sweep",
            help="tfwd=10,30,60,120,300: run the milp policy once per value, in parallel.",
        ),
        click.option(
            "--executor",
            type=click.Choice(["local", "slurm"]),
            default="local",
            show_default=True,
            help="Where several runs go: processes here, or the tasks of one Slurm job array "
            "(submitit; docs/replay.md).",
        ),
        click.option("--slurm-partition", help="slurm: the array's partition (default: Slurm's)."),
        click.option("--slurm-account", help="slurm: the account charged."),
        click.option(
            "--slurm-time",
            "slurm_time_min",
            type=Number(integer=True, min=1, max=525_600),
            help="slurm: each task's time limit, minutes (default 60).",
        ),
        click.option(
            "--slurm-folder",
            type=click.Path(file_okay=False, path_type=Path),
            help="slurm: the tasks' inputs, results and logs, on a filesystem the nodes share "
            "(default: OUT.slurm beside --out).",
        ),
        click.option(
            "--shift-arrivals",
            metavar="TIME|start",
            help="Move a --jobs job set's arrivals, keeping their spacing, so the first arrives at "
            "TIME or at the replay's start (start); the shift is in summary.json.",
        ),
        click.option(
            "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True
        ),
        click.option(
            "--progress/--no-progress",
            default=True,
            help="Progress bar on stderr (when a terminal).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func
