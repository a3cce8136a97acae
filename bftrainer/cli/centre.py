"""Centre mode on the command line: the allocator (``bftrainer daemon --centre``), the
user's agent (``bftrainer agent``), and what ``submit``/``status``/``cancel``/``logs``
ask the allocator when given ``--socket-dir`` (docs/deployment.md, Centre mode)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from bftrainer.centre.transport import (
    SOCKET_NAME,
    RequestRefused,
    TransportError,
    call,
)
from bftrainer.cli import UsageError
from bftrainer.cli.service import socket_dir_option, state_dir_option
from bftrainer.state import StateError, Store, daemon_running, ensure_state_dir, resolve_state_dir

if TYPE_CHECKING:
    from bftrainer.daemon import DaemonConfig
    from bftrainer.daemon_metrics import DaemonMetrics

log = logging.getLogger(__name__)

# Trainers one agent's loop admits: all of its user's (the allocator chooses among them).
AGENT_MAX_TRAINERS = 1000
# How long `submit` waits for an agent it started to hold its state directory's lock.
AGENT_START_TIMEOUT_S = 30.0
AGENT_LOG = "agent.log"
# Source options that are the allocator's own (its ssh keys): never given to agents.
_ALLOCATOR_ONLY = ("ssh_target", "ssh_key", "known_hosts")


def require_socket_dir(socket_dir: Path | None) -> Path:
    if socket_dir is None:
        raise UsageError("--centre needs --socket-dir DIR (or $BFTRAINER_SOCKET_DIR)")
    return socket_dir.expanduser().absolute()


def ask(socket_dir: Path, kind: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request to the allocator; its refusal or a dead socket as one clear line."""
    try:
        return call(socket_dir / SOCKET_NAME, kind, body or {})
    except RequestRefused as exc:
        raise click.ClickException(f"refused by the allocator: {exc}") from None
    except TransportError as exc:
        raise click.ClickException(str(exc)) from None


def centre_view(socket_dir: Path, local_id: str | None) -> dict[str, Any]:
    """What the allocator says for ``status`` (of one own trainer, or all); while it
    is down, ``{"unreachable": why}``: the user's agent and trainers go on meanwhile,
    and status shows what the agent records."""
    from bftrainer.centre import protocol

    body = {} if local_id is None else {"trainer": local_id}
    try:
        return call(socket_dir / SOCKET_NAME, protocol.STATUS, body)
    except RequestRefused as exc:
        raise click.ClickException(f"refused by the allocator: {exc}") from None
    except TransportError as exc:
        return {"unreachable": str(exc)}


# ---------------------------------------------------------------------- the allocator


def run_allocator(
    socket_dir: Path | None,
    source: dict[str, Any],
    config: DaemonConfig,
    hold: dict[str, Any],
    open_metrics: Callable[[], DaemonMetrics | None],
) -> None:
    """``bftrainer daemon --centre``: serve until SIGTERM or Ctrl-C (``open_metrics``:
    the metrics asked for, opened once the socket directory passed its checks)."""
    from bftrainer import __version__
    from bftrainer.centre.allocator import Allocator, CentrePool, CentreSettings
    from bftrainer.centre.transport import TransportError
    from bftrainer.cli.pool import build_source

    path = require_socket_dir(socket_dir)
    if source.get("ssh_target"):
        raise UsageError(
            "--centre: --ssh is not supported (each agent runs the scheduler's commands "
            "as its user on this machine)"
        )
    hello = {
        "bftrainer": __version__,
        "source": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in source.items()
            if k not in _ALLOCATOR_ONLY
        },
        "holders": hold,
        "daemon": {
            "poll_interval_s": config.poll_interval_s,
            "report_every_s": config.report_every_s,
            "holder_lease_s": config.holder_lease_s,
            "sync_every_s": config.sync_every_s,
        },
    }
    monitor = build_source(**source)
    settings = CentreSettings(
        poll_interval_s=config.poll_interval_s,
        sync_every_s=config.sync_every_s,
        agent_lease_s=config.agent_lease_s,
        restore_grace_s=2 * config.sync_every_s + 1.0,
    )
    metrics = open_metrics()
    allocator = Allocator(
        path,
        CentrePool(monitor, config.poll_interval_s),
        config,
        settings,
        hello,
        metrics=metrics,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        allocator.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "bftrainer %s centre allocator started (pid %d): socket %s, policy %s (%s, fair by "
        "%s), pool every %g s, agents sync every %g s, agent lease %g s",
        __version__,
        os.getpid(),
        path / SOCKET_NAME,
        config.policy,
        config.objective,
        config.fair_by,
        config.poll_interval_s,
        config.sync_every_s,
        config.agent_lease_s,
    )
    if metrics is not None:
        log.info("metrics: %s", metrics.where)
    try:
        allocator.run()
    except TransportError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        monitor.runner.close()
        if metrics is not None:
            metrics.close()
    log.info("allocator stopped; agents and trainers keep the nodes they have")


# ---------------------------------------------------------------------- the agent


@click.command("agent")
@socket_dir_option
@state_dir_option
def agent_cmd(socket_dir: Path | None, state_dir: Path | None) -> None:
    """Run your agent for the centre's allocator (bftrainer submit starts it).

    It holds your nodes with holder jobs in your name and runs your trainers, as the
    allocator decides; it keeps your state directory, as `bftrainer daemon` does.
    """
    from bftrainer.centre.agent import AgentLink, hello
    from bftrainer.cli.daemon import _holder_factory, serve
    from bftrainer.daemon import DaemonConfig

    sockets = require_socket_dir(socket_dir)
    try:
        settings = hello(sockets)
    except (TransportError, RequestRefused) as exc:
        raise click.ClickException(f"cannot register with the allocator: {exc}") from None
    source = {k: tuple(v) if isinstance(v, list) else v for k, v in settings["source"].items()}
    source.update(dict.fromkeys(_ALLOCATOR_ONLY))
    hold = settings["holders"]
    holders_of = _holder_factory(
        source,
        None if hold["script"] is None else Path(hold["script"]),
        tuple(hold["args"]),
        float(hold["slack_s"]),
        str(hold["job_name"]),
    )
    timing = settings["daemon"]
    config = DaemonConfig(
        poll_interval_s=float(timing["poll_interval_s"]),
        report_every_s=float(timing["report_every_s"]),
        holder_lease_s=float(timing["holder_lease_s"]),
        sync_every_s=float(timing["sync_every_s"]),
        max_trainers=AGENT_MAX_TRAINERS,
    )
    link = AgentLink(sockets, config.sync_every_s)
    serve(resolve_state_dir(state_dir), source, holders_of, config, lambda: None, link)


def ensure_agent(socket_dir: Path, state_dir: Path) -> None:
    """Start the user's agent on ``state_dir`` unless one (or a daemon) runs there; it
    runs detached, as the user, logging to ``state_dir/agent.log``."""
    try:
        ensure_state_dir(state_dir)
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    if daemon_running(state_dir) is not None:
        return
    # The store first, so that this command's submit does not find it half made while
    # the new agent creates it.
    try:
        Store.open(state_dir).close()
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    argv = [
        sys.executable,
        "-m",
        "bftrainer",
        "agent",
        "--socket-dir",
        str(socket_dir),
        "--state-dir",
        str(state_dir),
    ]
    log_path = state_dir / AGENT_LOG
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # outlives this command and its terminal
            close_fds=True,
        )
    deadline = time.monotonic() + AGENT_START_TIMEOUT_S
    while daemon_running(state_dir) is None:
        if proc.poll() is not None:
            raise click.ClickException(
                f"your agent did not start (exit code {proc.returncode}); see {log_path}"
            )
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"your agent did not start within {AGENT_START_TIMEOUT_S:g} s; see {log_path}"
            )
        time.sleep(0.1)
    click.echo(f"started your agent (pid {proc.pid}, log {log_path})", err=True)
