"""What ``submit``, ``status``, ``cancel`` and ``logs`` ask the centre's allocator when
given ``--socket-dir``, and the start of the user's agent that ``submit`` makes
(docs/deployment.md, Centre mode). A module of its own: those commands talk to the
allocator as its clients and need nothing of the allocator's or the agent's code."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from bftrainer.centre.transport import SOCKET_NAME, RequestRefused, TransportError, call
from bftrainer.state import StateError, Store, daemon_running, ensure_state_dir

# How long `submit` waits for an agent it started to hold its state directory's lock.
AGENT_START_TIMEOUT_S = 30.0
AGENT_LOG = "agent.log"


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
