"""``bftrainer agent``: a user's agent for the centre's allocator (docs/deployment.md,
Centre mode). It is a daemon on the user's state directory (cli/daemon.py's ``serve``)
whose decisions come from the allocator; ``bftrainer submit --socket-dir`` starts it
(cli/centre_client.py)."""

from __future__ import annotations

from pathlib import Path

import click

from bftrainer.centre.transport import RequestRefused, TransportError
from bftrainer.cli.centre import ALLOCATOR_ONLY
from bftrainer.cli.options import require_socket_dir, socket_dir_option, state_dir_option
from bftrainer.state import resolve_state_dir

# Trainers one agent's loop admits: all of its user's (the allocator chooses among them).
AGENT_MAX_TRAINERS = 1000


@click.command("agent")
@socket_dir_option
@state_dir_option
def agent_cmd(socket_dir: Path | None, state_dir: Path | None) -> None:
    """Run your agent for the centre's allocator (bftrainer submit starts it).

    It holds your nodes with holder jobs in your name and runs your trainers, as the
    allocator decides; it keeps your state directory, as `bftrainer daemon` does.
    """
    from bftrainer.centre.agent_link import AgentLink, hello
    from bftrainer.cli.daemon import holder_factory, serve
    from bftrainer.daemon import DaemonConfig

    sockets = require_socket_dir(socket_dir)
    try:
        settings = hello(sockets)
    except (TransportError, RequestRefused) as exc:
        raise click.ClickException(f"cannot register with the allocator: {exc}") from None
    source = {k: tuple(v) if isinstance(v, list) else v for k, v in settings["source"].items()}
    source.update(dict.fromkeys(ALLOCATOR_ONLY))
    hold = settings["holders"]
    holders_of = holder_factory(
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
