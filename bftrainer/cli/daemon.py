"""``bftrainer daemon``: the live service on a login node (docs/deployment.md).

``serve`` and ``holder_factory`` run a daemon on a state directory for this command and
for ``bftrainer agent`` (cli/agent.py), which is such a daemon taking the centre's
decisions; ``--centre`` runs the centre's allocator instead (cli/centre.py)."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from bftrainer.cli import UsageError
from bftrainer.cli.options import socket_dir_option, state_dir_option
from bftrainer.cli.params import POSITIVE, SECONDS, InputFile, Number, SlotsPerNode
from bftrainer.cli.policy_options import FLAG_NAMES, policy_flags, policy_options
from bftrainer.cli.pool import build_source, parse_env, source_options
from bftrainer.holders.base import DEFAULT_JOB_NAME, WINDOW_SLACK_S, Holders, check_job_name
from bftrainer.idle_monitor.runner import CommandRunner
from bftrainer.policies.config import ConfigError
from bftrainer.policies.registry import LIVE_POLICIES
from bftrainer.state import (
    DaemonLock,
    DaemonRunningError,
    DamagedRecordError,
    StateError,
    Store,
    ensure_state_dir,
    resolve_state_dir,
)

if TYPE_CHECKING:
    from bftrainer.daemon import CentreLink, DaemonConfig
    from bftrainer.service.metrics import DaemonMetrics

log = logging.getLogger(__name__)


@click.command("daemon")
@source_options
@state_dir_option
@click.option(
    "--config",
    "config_path",
    type=InputFile(),
    help="TOML file with [policy] and [daemon] tables (docs/deployment.md); flags win.",
)
@click.option(
    "--policy",
    type=click.Choice(LIVE_POLICIES),
    help="The allocation policy (default milp).",
)
@policy_options
@click.option(
    "--poll-interval",
    "poll_interval_s",
    type=POSITIVE,
    help="Seconds between two reads of the scheduler (default 10).",
)
@click.option(
    "--slots-per-node",
    type=SlotsPerNode(),
    metavar="S|gres",
    help="Slots (GPUs) per held node: trainers share a node, each worker on its own "
    "slot's GPUs or CPUs; --min-nodes/--max-nodes then count slots (default 1: whole "
    "nodes). 'gres': the GPU count of the bf nodes (Slurm's Gres=gpu:N, LSF's ngpus), "
    "read at start. docs/deployment.md.",
)
@click.option(
    "--holder-script",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The holder job script where the scheduler's commands run (default: this "
    "installation's scripts/slurm/hold-nodes.sbatch or scripts/lsf/bsub-hold.lsf).",
)
@click.option(
    "--holder-arg",
    "holder_args",
    multiple=True,
    metavar="ARG",
    help="One more sbatch/bsub argument for holders, e.g. --holder-arg=--account=ml (repeatable).",
)
@click.option(
    "--holder-slack",
    "holder_slack_s",
    type=SECONDS,
    default=WINDOW_SLACK_S,
    show_default=True,
    help="Seconds a holder leaves free before its node's window ends (at least the "
    "scheduler's backfill resolution, Slurm's bf_resolution).",
)
@click.option(
    "--job-name",
    default=DEFAULT_JOB_NAME,
    show_default=True,
    help="Name of the holder jobs; two daemons of one account need two names.",
)
@click.option(
    "--metrics-textfile",
    type=click.Path(dir_okay=False),
    help="Write Prometheus metrics to this file (ending in .prom) in node_exporter's "
    "--collector.textfile.directory, rewritten atomically at each step (docs/deployment.md).",
)
@click.option(
    "--metrics-port",
    type=Number(integer=True, min=1, max=65535),
    metavar="PORT",
    help="Serve Prometheus metrics on http://127.0.0.1:PORT/metrics (docs/deployment.md).",
)
@click.option(
    "--centre",
    is_flag=True,
    help="Run the centre's allocator for every user (with --socket-dir): it decides, the "
    "users' agents hold nodes and run trainers (docs/deployment.md, Centre mode).",
)
@socket_dir_option
def daemon_cmd(
    state_dir: Path | None,
    config_path: Path | None,
    policy: str | None,
    poll_interval_s: float | None,
    slots_per_node: int | str | None,
    holder_script: Path | None,
    holder_args: tuple[str, ...],
    holder_slack_s: float,
    job_name: str,
    metrics_textfile: str | None,
    metrics_port: int | None,
    centre: bool,
    socket_dir: Path | None,
    **source: Any,
) -> None:
    """Run the service: hold idle nodes, run submitted trainers on them, rescale them.

    Runs in the foreground until SIGTERM or Ctrl-C; then it stops taking work and exits,
    leaving running trainers and their holder jobs for the next start to re-attach to.
    """
    from bftrainer.daemon import load_daemon_config

    flags = {
        **policy_flags(source),
        "policy": policy,
        "poll_interval_s": poll_interval_s,
        "slots_per_node": slots_per_node,
        "metrics_textfile": metrics_textfile,
        "metrics_port": metrics_port,
    }
    holders_of = holder_factory(source, holder_script, holder_args, holder_slack_s, job_name)
    try:
        names = {
            **FLAG_NAMES,
            "policy": "--policy",
            "poll_interval_s": "--poll-interval",
            "slots_per_node": "--slots-per-node",
            "metrics_textfile": "--metrics-textfile",
            "metrics_port": "--metrics-port",
        }
        config = load_daemon_config(config_path, flags, names)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if centre and (config.gpu_slots or config.slots_per_node > 1):
        # Each user's agent holds its nodes with its own holder jobs: a node held by one
        # user cannot carry another user's trainers on its other slots.
        shared = "gres" if config.gpu_slots else str(config.slots_per_node)
        raise UsageError(
            f"--centre: {shared} slots per node is not supported: a node is held by one "
            "user's holder job, so its slots cannot be shared among users (run the centre "
            "with whole nodes, slots_per_node 1)"
        )
    if centre:
        from bftrainer.cli.centre import run_allocator

        hold = {
            "script": None if holder_script is None else str(holder_script),
            "args": list(holder_args),
            "slack_s": holder_slack_s,
            "job_name": job_name,
        }
        run_allocator(socket_dir, source, config, hold, lambda: _open_metrics(config))
        return
    serve(
        resolve_state_dir(state_dir),
        source,
        holders_of,
        config,
        lambda: _open_metrics(config),
        None,
    )


def serve(
    path: Path,
    source: dict[str, Any],
    holders_of: Callable[[CommandRunner], Holders],
    config: DaemonConfig,
    open_metrics: Callable[[], DaemonMetrics | None],
    centre: CentreLink | None,
) -> None:
    """Run a daemon on the state directory ``path`` (a centre agent: with ``centre``)
    until SIGTERM or Ctrl-C."""
    from bftrainer import __version__
    from bftrainer.daemon import Daemon, state_unwritable
    from bftrainer.daemon.gpu_slots import GresError

    try:
        ensure_state_dir(path)
        lock = DaemonLock(path).acquire()
    except DaemonRunningError as exc:
        raise click.ClickException(str(exc)) from None
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        metrics = open_metrics()
    except click.ClickException:
        lock.release()
        raise
    monitor = build_source(**source, read_gpus=config.gpu_slots)
    store = None
    try:
        # Checked at start: a newer schema, a file that is no database, a table or a
        # column gone, a record the daemon restores from damaged.
        store = Store.open(path, wait_for_writers=True)
        store.check_records()
    except StateError as exc:
        if store is not None:
            store.close()
        monitor.runner.close()
        if metrics is not None:
            metrics.close()
        lock.release()
        raise click.ClickException(str(exc)) from None
    holders = holders_of(monitor.runner)
    if not source.get("ssh_target"):  # the nodes may see the state directory: kept if so
        holders.stderr_dir = path / "holders"
    daemon = Daemon(
        store,
        path,
        monitor,
        holders,
        config,
        env=parse_env(source["env_pairs"]),
        metrics=metrics,
        centre=centre,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        daemon.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    where = (
        f"partition {source['bf_partitions'][0]}"
        if source["scheduler"] == "slurm"
        else f"queue {source['bf_queues'][0]}"
    )
    log.info(
        "bftrainer %s %s started (pid %d): %s %s, state %s, policy %s, "
        "poll every %g s, holder lease %g s%s",
        __version__,
        "daemon" if centre is None else "agent",
        os.getpid(),
        source["scheduler"],
        where,
        path,
        # An agent follows the allocator: its own objective (a default) decides nothing.
        f"{config.policy} ({config.objective})" if centre is None else "the centre's allocator",
        config.poll_interval_s,
        config.holder_lease_s,
        ", slots per node from the nodes' GPUs (gres)"
        if config.gpu_slots
        else f", {config.slots_per_node} slots per node"
        if config.slots_per_node > 1
        else "",
    )
    if metrics is not None:
        log.info("metrics: %s", metrics.where)
    try:
        daemon.run()
    except (GresError, DamagedRecordError) as exc:
        # A record damaged since the start (by hand): the trainers (detached) and their
        # holders (leases they renew) go on; the line names the row to repair.
        raise click.ClickException(str(exc)) from None
    except (sqlite3.Error, OSError) as exc:
        if not state_unwritable(exc):
            raise
        # SQLite rolled the unfinished write back: nothing recorded is lost, and the
        # trainers (detached) and their holders (leases they renew) go on meanwhile.
        log.error(
            "stopping: the state directory %s cannot be written (%s); trainers keep "
            "running; start the daemon again once it can be written",
            path,
            exc,
        )
        raise SystemExit(1) from None
    finally:
        if metrics is not None:
            metrics.close()
        store.close()
        monitor.runner.close()
        lock.release()


def _open_metrics(config: DaemonConfig) -> DaemonMetrics | None:
    """The metrics asked for (None: none; prometheus_client is then never imported)."""
    if config.metrics_textfile is None and config.metrics_port is None:
        return None
    from bftrainer.service.metrics import DaemonMetrics, MetricsError

    try:
        return DaemonMetrics.open(config.metrics_textfile, config.metrics_port)
    except MetricsError as exc:
        raise click.ClickException(str(exc)) from None


def holder_factory(
    source: dict[str, Any],
    holder_script: Path | None,
    holder_args: tuple[str, ...],
    slack_s: float,
    job_name: str,
) -> Callable[[CommandRunner], Holders]:
    """A function of the runner that builds the scheduler's holders; checks the flags."""
    try:
        check_job_name(job_name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    common: dict[str, Any] = {"job_name": job_name, "extra_args": holder_args, "slack_s": slack_s}
    if source["scheduler"] == "slurm":
        from bftrainer.holders.slurm import SCRIPT, SlurmHolders

        if len(source["bf_partitions"]) != 1:
            raise UsageError(
                "--bf-partition: give exactly one, the preemptible partition where holder "
                "jobs run (scripts/slurm/README.md)"
            )
        script = _holder_script(holder_script, SCRIPT, source)
        return partial(SlurmHolders, partition=source["bf_partitions"][0], script=script, **common)
    from bftrainer.holders.lsf import SCRIPT, LsfHolders

    if len(source["bf_queues"]) != 1:
        raise UsageError(
            "--bf-queue: give exactly one, the preemptible queue where holder jobs run "
            "(scripts/lsf/README.md)"
        )
    script = _holder_script(holder_script, SCRIPT, source)
    return partial(LsfHolders, queue=source["bf_queues"][0], script=script, **common)


def _holder_script(given: Path | None, default: Path, source: dict[str, Any]) -> Path:
    """The holder job script, checked at start where the scheduler's commands run here:
    a missing one would otherwise fail every holder, one poll after another."""
    script = default if given is None else given
    if source.get("ssh_target") or script.is_file():
        return script  # over SSH it is a path on the other machine
    if given is None:
        raise UsageError(
            f"this installation has no holder job script ({script}); give the login "
            "node's copy with --holder-script"
        )
    raise UsageError(f"--holder-script {script}: not a file")
