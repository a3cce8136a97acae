"""``bftrainer daemon --centre``: the centre's allocator, one for every user of the machine
(docs/deployment.md, Centre mode). The users' side is elsewhere: their agent is
``bftrainer agent`` (cli/agent.py), and what ``submit``/``status``/``cancel``/``logs`` ask
the allocator is in cli/centre_client.py."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from bftrainer.centre.transport import SOCKET_NAME
from bftrainer.cli import UsageError
from bftrainer.cli.options import require_socket_dir

if TYPE_CHECKING:
    from bftrainer.daemon import DaemonConfig
    from bftrainer.service.metrics import DaemonMetrics

log = logging.getLogger(__name__)

# Source options that are the allocator's own (its ssh keys): never given to agents.
ALLOCATOR_ONLY = ("ssh_target", "ssh_key", "known_hosts")


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
            if k not in ALLOCATOR_ONLY
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
        hold_grace_s=config.hold_grace_s,
        refused_for_s=config.refused_for_s,
        holder_lease_s=config.holder_lease_s,
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
