"""The options that read a scheduler's job log, shared by ``trace from-log``, ``trace
stats`` and ``replay``, and the one call that turns a log into a trace for them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from bftrainer.cli import UsageError
from bftrainer.cli.params import InputFile, Number
from bftrainer.idle_monitor.joblog import FORMATS, JobLogError, LogPool, pool_from_log
from bftrainer.idle_monitor.joblog_pool import MAX_MACHINE_NODES
from bftrainer.idle_monitor.trace_model import TraceFormatError

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class LogOptions:
    """How to read a job log: its format (None: by content), the machine's size or node
    list (None: the log's header, or the nodes it names), down intervals, strictness."""

    format: str | None = None
    nodes: int | None = None
    node_list: Path | None = None
    down: Path | None = None
    strict: bool = False

    @property
    def given(self) -> str | None:
        """The first option given, for refusing them with a pool trace."""
        for flag, value in (
            ("--format", self.format),
            ("--node-list", self.node_list),
            ("--down", self.down),
            ("--strict", self.strict or None),
        ):
            if value is not None:
                return flag
        return None


def log_options(size_flag: str) -> Callable[[F], F]:
    """The job-log options; the machine's size is ``size_flag`` (``--nodes`` for
    ``from-log``; ``--machine-nodes`` where ``--nodes`` already slices a trace)."""

    def decorate(f: F) -> F:
        for option in reversed(
            [
                click.option(
                    "--format",
                    "log_format",
                    type=click.Choice(FORMATS),
                    help="The job log's format (default: told by content).",
                ),
                click.option(
                    size_flag,
                    "machine_nodes",
                    type=Number(integer=True, min=1, max=MAX_MACHINE_NODES),
                    help="A job log's machine size in nodes (default: the log's header, "
                    "e.g. SWF MaxNodes, or the nodes the log names).",
                ),
                click.option(
                    "--node-list",
                    type=InputFile(),
                    help="A job log's machine: one hostlist (nid[0001-4392]) per line.",
                ),
                click.option(
                    "--down",
                    "down_path",
                    type=InputFile(),
                    help="Down or drained intervals of a job log's machine: START,END,NODES "
                    "lines (NODES a hostlist or a count); those nodes are not idle.",
                ),
                click.option(
                    "--strict",
                    is_flag=True,
                    help="Refuse a job log with repeated records or over-committed nodes.",
                ),
            ]
        ):
            f = option(f)
        return f

    return decorate


def options_from(kwargs: dict[str, Any]) -> LogOptions:
    """The job-log options out of a command's keyword arguments (removed from them)."""
    return LogOptions(
        format=kwargs.pop("log_format"),
        nodes=kwargs.pop("machine_nodes"),
        node_list=kwargs.pop("node_list"),
        down=kwargs.pop("down_path"),
        strict=kwargs.pop("strict"),
    )


def read_log_pool(path: Path, options: LogOptions) -> LogPool:
    """The pool of a job log, or one line naming what is wrong (exit 2)."""
    try:
        return pool_from_log(
            path,
            format=options.format,
            nodes=options.nodes,
            node_list=options.node_list,
            down=options.down,
            strict=options.strict,
        )
    except (JobLogError, TraceFormatError) as exc:
        raise UsageError(str(exc)) from None
