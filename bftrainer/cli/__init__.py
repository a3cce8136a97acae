"""The ``bftrainer`` command line: one click group, one module per command."""

from __future__ import annotations

import json
import logging
import sys

import click

from bftrainer import __version__


class UsageError(click.ClickException):
    """Bad input named in one line; exits 2 like click's own usage errors."""

    exit_code = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bftrainer")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log line format on stderr.",
)
def cli(verbose: int, quiet: bool, log_format: str) -> None:
    """Train deep-learning jobs on the idle, unbackfillable nodes of a supercomputer."""
    level = (
        logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    )
    configure_logging(level, log_format)


def configure_logging(level: int, log_format: str) -> None:
    """The CLI chooses the log format; modules only use ``logging.getLogger(__name__)``."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors on a login node."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "t": self.formatTime(record),
                "level": record.levelname,
                "logger": record.name,
                "msg": record.getMessage(),
            }
        )


def _register() -> None:
    # One line per command module; each module defines one click command or group.
    from bftrainer.cli import allocate, goodput

    cli.add_command(allocate.allocate_cmd)
    cli.add_command(goodput.goodput)
    from bftrainer.cli import pool

    cli.add_command(pool.pool_cmd)
    from bftrainer.cli import replay

    cli.add_command(replay.replay_cmd)
    from bftrainer.cli import trace

    cli.add_command(trace.trace)
    from bftrainer.cli.run import run_cmd

    cli.add_command(run_cmd)
    from bftrainer.cli import daemon, service

    cli.add_command(daemon.daemon_cmd)
    for command in (service.submit_cmd, service.status_cmd, service.cancel_cmd, service.logs_cmd):
        cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="bftrainer")
