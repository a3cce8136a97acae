"""``bftrainer pool``: the idle-node pool right now, with each node's backfill window.

Also the options shared with ``bftrainer trace record`` (scheduler, SSH, timeouts, pool
cut), so both commands build their source the same way.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from bftrainer.cli import UsageError
from bftrainer.cli.params import SECONDS, InputFile, Number, file_to_read_error
from bftrainer.common import strict_json
from bftrainer.idle_monitor.runner import (
    MAX_TIMEOUT_S,
    CommandRunner,
    LocalRunner,
    RetryPolicy,
    SshRunner,
)
from bftrainer.idle_monitor.source import LivePoolSource, PoolConfig, Reading, Scheduler

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
DEFAULTS = PoolConfig()


def source_options(func: F) -> F:
    """The options that say which scheduler to read, how, and how to cut the pool."""
    options = [
        click.option(
            "--scheduler",
            type=click.Choice(["slurm", "lsf"]),
            required=True,
            help="The main scheduler to read.",
        ),
        click.option(
            "--ssh",
            "ssh_target",
            metavar="USER@HOST[:PORT]",
            help="Run the scheduler's commands on this login node over SSH.",
        ),
        click.option(
            "--ssh-key",
            type=InputFile(),
            help="Private key for --ssh (default: the SSH agent and ~/.ssh keys).",
        ),
        click.option(
            "--known-hosts",
            type=InputFile(),
            help="known_hosts file that must hold the login node's key "
            "(default ~/.ssh/known_hosts).",
        ),
        click.option(
            "--env",
            "env_pairs",
            multiple=True,
            metavar="NAME=VALUE",
            help="Environment for the scheduler commands, e.g. SLURM_CONF=/etc/slurm/x.conf.",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=Number(min=0.1, max=MAX_TIMEOUT_S),
            default=30.0,
            show_default=True,
            help="Seconds one command may take.",
        ),
        click.option(
            "--retries",
            type=Number(integer=True, min=0, max=10),
            default=1,
            show_default=True,
            help="Retries of a failed command (with backoff).",
        ),
        click.option(
            "--horizon",
            "horizon_s",
            type=SECONDS,
            default=DEFAULTS.horizon_s,
            show_default=True,
            help="Seconds: an idle node claimed by a job or reservation sooner is not in the pool.",
        ),
        click.option(
            "--max-stale",
            "max_stale_s",
            type=SECONDS,
            default=DEFAULTS.max_stale_s,
            show_default=True,
            help="Seconds after which stale claims stop the pool from growing.",
        ),
        click.option(
            "--partition",
            "partitions",
            multiple=True,
            help="Slurm: only nodes of this partition (repeatable).",
        ),
        click.option(
            "--bf-partition",
            "bf_partitions",
            multiple=True,
            help="Slurm: bftrainer's preemptible partition; nodes held only by its jobs "
            "count as idle (repeatable).",
        ),
        click.option("--sinfo-json", is_flag=True, help="Slurm: read sinfo --json (21.08+)."),
        click.option(
            "--host-pattern",
            help="LSF: regular expression that compute host names match (others are ignored).",
        ),
        click.option(
            "--lsf-plan-file",
            metavar="PATH|auto|none",
            help="LSF: the allocation planner's lsb.allocation.plan.json (absolute path where "
            "the commands run); auto (default): $LSF_ENVDIR/../work/<cluster>/logdir/; none: "
            "do not read it.",
        ),
        click.option(
            "--bf-queue",
            "bf_queues",
            multiple=True,
            help="LSF: bftrainer's preemptible queue; hosts held only by its jobs count as "
            "idle (repeatable).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"--env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env


def build_source(
    *,
    scheduler: str,
    ssh_target: str | None,
    ssh_key: Path | None,
    known_hosts: Path | None,
    env_pairs: tuple[str, ...],
    timeout_s: float,
    retries: int,
    horizon_s: float,
    max_stale_s: float,
    partitions: tuple[str, ...],
    bf_partitions: tuple[str, ...],
    sinfo_json: bool,
    host_pattern: str | None,
    lsf_plan_file: str | None = None,
    bf_queues: tuple[str, ...] = (),
    filter_blips: bool = True,
    read_gpus: bool = False,
) -> LivePoolSource:
    """A ``LivePoolSource`` from the command-line options; bad values raise UsageError."""
    env = parse_env(env_pairs)
    retry = RetryPolicy(attempts=retries + 1)
    runner: CommandRunner
    if ssh_target:
        problem = None if ssh_key is None else file_to_read_error(ssh_key)
        if problem is not None:
            raise UsageError(f"--ssh-key {problem}")
        try:
            runner = SshRunner(
                ssh_target,
                key_path=ssh_key,
                known_hosts=known_hosts,
                env=env,
                timeout_s=timeout_s,
                retry=retry,
            )
        except ValueError as exc:
            raise UsageError(f"--ssh: {exc}") from None
    else:
        if ssh_key or known_hosts:
            raise UsageError("--ssh-key and --known-hosts need --ssh USER@HOST")
        runner = LocalRunner(env=env, timeout_s=timeout_s, retry=retry)
    sched: Scheduler
    if scheduler == "slurm":
        from bftrainer.idle_monitor.slurm import SlurmScheduler

        if host_pattern or lsf_plan_file is not None or bf_queues:
            raise UsageError(
                "--host-pattern, --lsf-plan-file and --bf-queue are for --scheduler lsf"
            )
        try:
            sched = SlurmScheduler(
                partitions=partitions,
                use_json=sinfo_json,
                bf_partitions=bf_partitions,
                read_gpus=read_gpus,
            )
        except ValueError as exc:
            raise UsageError(f"--partition/--bf-partition: {exc}") from None
    else:
        from bftrainer.idle_monitor.lsf import PLAN_AUTO, LsfScheduler

        if partitions or sinfo_json or bf_partitions:
            raise UsageError(
                "--partition, --bf-partition and --sinfo-json are for --scheduler slurm"
            )
        plan_file = lsf_plan_file or PLAN_AUTO
        if plan_file not in (PLAN_AUTO, "none") and not plan_file.startswith("/"):
            raise UsageError(
                f"--lsf-plan-file {plan_file!r}: expected an absolute path, auto or none"
            )
        try:
            sched = LsfScheduler(
                host_pattern=host_pattern,
                plan_file=None if plan_file == "none" else plan_file,
                bf_queues=bf_queues,
                read_gpus=read_gpus,
            )
        except re.error as exc:
            raise UsageError(f"--host-pattern {host_pattern!r}: {exc}") from None
        except ValueError as exc:
            raise UsageError(f"--bf-queue: {exc}") from None
    config = PoolConfig(horizon_s=horizon_s, max_stale_s=max_stale_s, filter_blips=filter_blips)
    return LivePoolSource(sched, runner, config)


def check_source(source: LivePoolSource) -> None:
    """Refuse, naming it, what can be known before a first poll: programs missing from
    PATH, a config file (SLURM_CONF) that does not exist. Otherwise each command would
    retry for its whole timeout and then say only that it timed out."""
    runner = source.runner
    problems = runner.missing(*source.scheduler.requirements(runner.env_value))
    if problems:
        raise click.ClickException(
            f"cannot read {source.scheduler.name} ({runner.where}): {'; '.join(problems)}"
        )


def reading_json(reading: Reading) -> dict[str, Any]:
    """``{"time": ISO-8601, "nodes": {"node1": {"window_s": float | None}}}``."""
    from bftrainer.idle_monitor.trace import format_time

    return {
        "time": format_time(reading.time_s),
        "nodes": {
            n: {"window_s": _round(reading.windows_s.get(n))} for n in sorted(reading.candidates)
        },
    }


def _round(window_s: float | None) -> float | None:
    return None if window_s is None else round(window_s, 3)


def _window_text(window_s: float | None) -> str:
    if window_s is None:
        return "open-ended"
    if math.isinf(window_s):
        return "open-ended"
    h, rest = divmod(int(window_s), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


@click.command("pool")
@source_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def pool_cmd(as_json: bool, **options: Any) -> None:
    """Print the current pool of idle nodes and how long each stays free.

    The pool is the idle nodes that no pending job or reservation claims within
    --horizon seconds. This reads the scheduler once, so no blip filtering is applied
    (the recorder and the daemon apply it across polls).
    """
    source = build_source(**options)
    check_source(source)
    try:
        reading = source.read()
    finally:
        source.runner.close()
    if reading is None:
        raise click.ClickException(
            f"could not read node states from {options['scheduler']} (see the log line above)"
        )
    if reading.stale_claims:
        raise click.ClickException(
            f"could not read pending jobs and reservations from {options['scheduler']}, "
            "so the pool is unknown (see the log line above)"
        )
    if as_json:
        click.echo(strict_json.dumps(reading_json(reading), indent=2))
        return
    click.echo(
        f"{len(reading.candidates)} of {len(reading.nodes)} nodes in the pool "
        f"(horizon {source.config.horizon_s:g} s)"
    )
    for node in sorted(reading.candidates):
        click.echo(f"{node}\t{_window_text(reading.windows_s.get(node))}")
