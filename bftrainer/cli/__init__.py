"""The ``bftrainer`` command line: one click group, one module per command."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from types import FrameType

import click

from bftrainer.common import strict_json
from bftrainer.trainers import lifeline


class UsageError(click.ClickException):
    """Bad input named in one line; exits 2 like click's own usage errors."""

    exit_code = 2


# Command name -> "module:attribute". Modules are imported when their command runs (or
# `--help` lists it), so that `bftrainer status` does not pay for the allocator's solvers
# and matplotlib: a user on a busy login node waits for none of it.
COMMANDS: dict[str, str] = {
    "agent": "bftrainer.cli.agent:agent_cmd",
    "allocate": "bftrainer.cli.allocate:allocate_cmd",
    "cancel": "bftrainer.cli.user_commands:cancel_cmd",
    "daemon": "bftrainer.cli.daemon:daemon_cmd",
    "goodput": "bftrainer.cli.goodput:goodput",
    "hpo": "bftrainer.cli.hpo:hpo_cmd",
    "logs": "bftrainer.cli.user_commands:logs_cmd",
    "pool": "bftrainer.cli.pool:pool_cmd",
    "replay": "bftrainer.cli.replay:replay_cmd",
    "report": "bftrainer.cli.report:report_cmd",
    "run": "bftrainer.cli.run:run_cmd",
    "status": "bftrainer.cli.status:status_cmd",
    "submit": "bftrainer.cli.user_commands:submit_cmd",
    "trace": "bftrainer.cli.trace:trace",
}


# Each command's first sentence, for `bftrainer --help` to list them without importing
# them all (that import alone took 2 s: scipy, pandas, matplotlib). A test checks each
# against its command's own docstring.
SUMMARIES: dict[str, str] = {
    "agent": "Run your agent for the centre's allocator (bftrainer submit starts it).",
    "allocate": "Decide the node set of every trainer for the pool in PROBLEM.json "
    "('-' for stdin).",
    "cancel": "Cancel a trainer: a queued one never starts, a running one checkpoints and stops.",
    "daemon": "Run the service: hold idle nodes, run submitted trainers on them, rescale them.",
    "goodput": "Pollux-style goodput model: step-time fit, efficiency, best batch size.",
    "hpo": "Run an Optuna study whose trials are trainers on the daemon's pool, pruned early.",
    "logs": "Print a trainer's log: its launcher's and workers' output, tracebacks included.",
    "pool": "Print the current pool of idle nodes and how long each stays free.",
    "replay": "Replay TRACE (or the embedded synthetic default) with simulated trainers.",
    "report": "Write report.html (images inlined) and its PNGs for a replay's output folder "
    "or, with --state-dir, a daemon's store; print the page's path.",
    "run": "Run SCRIPT [ARGS] elastically on the hosts listed in --hosts-file.",
    "status": "The pool the daemon holds, and each trainer's state, nodes and progress (only "
    "TRAINER_ID's when given).",
    "submit": "Queue SCRIPT [ARGS...] as an elastic trainer; prints its id as the last line.",
    "trace": "Pool traces: the idle-node event logs that `bftrainer replay` plays back.",
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (see ``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands from ``SUMMARIES``, importing none of them."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            loaded = self.commands.get(name)
            command = loaded or click.Command(name, help=SUMMARIES.get(name, ""))
            if not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, attr = COMMANDS[cmd_name].split(":")
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{COMMANDS[cmd_name]} is not a click command")
        self.add_command(command, cmd_name)
        return command


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """click's ``version_option``, reading the version only when asked (see
    ``bftrainer.__getattr__``): the same flag, help and output."""
    if not value or ctx.resilient_parsing:
        return
    from bftrainer import __version__

    click.echo(f"bftrainer, version {__version__}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More logging (-v info, -vv debug; the daemon logs at info by default).",
)
@click.option("-q", "--quiet", is_flag=True, help="Only errors.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log line format on stderr.",
)
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool, log_format: str) -> None:
    """Train deep-learning jobs on the idle, unbackfillable nodes of a supercomputer."""
    # A service's log is its operator's only view: the daemon says what it does (info)
    # by default; one-shot commands say only what went wrong.
    if ctx.invoked_subcommand in ("daemon", "agent"):
        verbose += 1
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
        return strict_json.dumps(
            {
                "t": self.formatTime(record),
                "level": record.levelname,
                "logger": record.name,
                "msg": record.getMessage(),
            }
        )


def main() -> None:
    # SIGTERM (batch systems, timeout, systemd) stops a command as Ctrl-C does; the
    # daemon and the centre put their own handlers in place of this one.
    terminated: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        terminated.append(signum)
        raise lifeline.Terminated(signum)

    signal.signal(signal.SIGTERM, interrupt)
    try:
        cli(prog_name="bftrainer")
    except SystemExit as exc:
        if terminated and exc.code not in (0, None):
            sys.exit(128 + terminated[0])  # the shell's code for a death by that signal
        raise
    except OSError as exc:
        # What a command did not handle itself: most often its output cannot be written
        # (stdout on a full disk, > /dev/full). One line, not a traceback.
        _drop_stdout()
        where = f": {exc.filename}" if exc.filename else " (writing the output?)"
        sys.stderr.write(f"Error: {exc.strerror or exc}{where}\n")
        sys.exit(1)


def _drop_stdout() -> None:
    """Discard what is still buffered for stdout, so that flushing it at exit does not
    fail a second time with Python's 'Exception ignored' report."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
