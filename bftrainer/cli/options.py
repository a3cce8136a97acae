"""Options shared by several commands: the state directory and the centre's socket
directory. A module of their own so that each command imports them without importing
another command (``daemon``, ``agent`` and the service commands all take them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from bftrainer.cli import UsageError

F = TypeVar("F", bound=Callable[..., Any])


def state_dir_option(func: F) -> F:
    return click.option(
        "--state-dir",
        # No access check here: check_state_dir says in one line whose directory it is.
        type=click.Path(file_okay=False, readable=False, path_type=Path),
        help="The daemon's state directory (default: $BFTRAINER_STATE_DIR, else "
        "$XDG_STATE_HOME/bftrainer).",
    )(func)


def socket_dir_option(func: F) -> F:
    return click.option(
        "--socket-dir",
        type=click.Path(file_okay=False, path_type=Path),
        envvar="BFTRAINER_SOCKET_DIR",
        help="Centre mode: the directory of the centre allocator's socket (default: "
        "$BFTRAINER_SOCKET_DIR; docs/deployment.md).",
    )(func)


def require_socket_dir(socket_dir: Path | None) -> Path:
    if socket_dir is None:
        raise UsageError("--centre needs --socket-dir DIR (or $BFTRAINER_SOCKET_DIR)")
    return socket_dir.expanduser().absolute()
