"""``bftrainer run``: run an elastic trainer by hand on a host list that may change.

    bftrainer run --backend torchrun --hosts-file hosts.txt examples/train_mlp.py --work-epochs 2

The host file (one ``host[:slots]`` per line, Horovod's discovery format) is re-read as
it changes and copied to the trainer directory's ``hosts``; an empty file stops the
workers (they checkpoint) until hosts come back. Inside an ``salloc``, write the
allocation's nodes to the file and use ``--exec-mode slurm`` only through the daemon;
by hand, ssh reaches the other nodes. Exits with the trainer's outcome: 0 done (the
result line is printed), 1 failed (the reason in one line; the traceback is in the
trainer directory's supervisor.log), 130 stopped by Ctrl-C (workers checkpointed: run
the same command again to resume).
"""

from __future__ import annotations

import logging
import shutil
import signal
import time
from pathlib import Path

import click

from bftrainer import strict_json
from bftrainer.cli import UsageError
from bftrainer.cli.params import COUNT, SECONDS, InputFile
from bftrainer.trainers import channel, lifeline
from bftrainer.trainers.launch.base import BACKENDS, Launcher, LaunchError, LaunchSpec

logger = logging.getLogger(__name__)

POLL_S = 0.5


def _same_work(old: LaunchSpec, new: LaunchSpec) -> bool:
    """The checkpoint continues only the same script, arguments (the work among them)
    and trainer id."""
    return (old.script, old.args, old.trainer_id) == (
        new.script.resolve(),
        new.args,
        new.trainer_id,
    )


def _attached_alive(trainer_dir: Path) -> bool:
    try:
        return Launcher.attach(trainer_dir).alive()
    except LaunchError:
        return False


def _earlier_run(spec: LaunchSpec, fresh: bool) -> str | None:
    """What an existing ``--trainer-dir`` holds, said in one line on stderr: None (new,
    empty, or removed by --fresh), "resume" or "done" (the same work); any other folder is
    refused, so an earlier run's result is never taken for this one's."""
    d = spec.trainer_dir
    if not d.exists() and not d.is_symlink():
        return None
    if not d.is_dir():
        raise UsageError(f"--trainer-dir {d}: exists and is not a folder")
    if not any(d.iterdir()):
        return None
    spec_file = d / channel.SPEC
    if not spec_file.is_file():
        raise UsageError(
            f"--trainer-dir {d}: not empty and not a trainer directory (no {channel.SPEC}); "
            "choose a new or empty folder"
        )
    if (d / channel.SUPERVISOR_PID).is_file() and _attached_alive(d):
        raise UsageError(f"--trainer-dir {d}: a trainer is running there now")
    try:
        old = LaunchSpec.from_json(spec_file.read_text(), str(spec_file))
    except (OSError, LaunchError):
        old = None
    if fresh:
        shutil.rmtree(d)  # a trainer directory (spec.json): written by bftrainer run
        click.echo(
            f"bftrainer run: starting afresh in {d} (the earlier run's files removed)", err=True
        )
        return None
    if old is None or not _same_work(old, spec):
        what = "unreadable spec" if old is None else f"{old.script.name} {' '.join(old.args)}"
        raise UsageError(
            f"--trainer-dir {d} holds an earlier run of other work ({what}): add --fresh "
            "to start afresh there, or choose another --trainer-dir"
        )
    try:
        result = channel.read_result(d)
    except channel.ChannelError as e:
        raise UsageError(f"--trainer-dir {d}: {e}; add --fresh to start afresh") from None
    if result is not None:
        click.echo(
            f"bftrainer run: {d} holds this work finished by an earlier run: its result "
            "follows (--fresh trains again)",
            err=True,
        )
        return "done"
    click.echo(f"bftrainer run: resuming the same work in {d} from its checkpoint", err=True)
    return "resume"


def _read_host_file(path: Path) -> list[str]:
    return [f"{h}:{s}" for h, s in channel.parse_hosts(path.read_text(), str(path))]


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--backend", type=click.Choice(BACKENDS), required=True, help="Elastic backend.")
@click.option(
    "--hosts-file",
    type=InputFile(),
    required=True,
    help="host[:slots] per line; re-read as it changes (empty: zero hosts).",
)
@click.option(
    "--trainer-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Trainer directory [default: ./bftrainer-run-<script stem>].",
)
@click.option("--trainer-id", help="Trainer id [default: the script's stem].")
@click.option(
    "--fresh",
    is_flag=True,
    help="Start afresh in an existing trainer directory: its earlier run's files go.",
)
@click.option("--max-hosts", type=COUNT, default=64, show_default=True)
@click.option("--min-hosts", type=COUNT, default=1, show_default=True)
@click.option(
    "--exec-mode",
    type=click.Choice(channel.EXEC_MODES),
    help="How to reach the hosts [default: here for this machine's names, else ssh].",
)
@click.option("--ssh-arg", "ssh_args", multiple=True, help="Extra ssh argument (repeatable).")
@click.option(
    "--stop-grace-s",
    type=SECONDS,
    default=30.0,
    show_default=True,
    help="Ctrl-C, SIGTERM or this command's death: the workers' time to checkpoint.",
)
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_cmd(
    backend: str,
    hosts_file: Path,
    trainer_dir: Path | None,
    trainer_id: str | None,
    fresh: bool,
    max_hosts: int,
    min_hosts: int,
    exec_mode: str | None,
    ssh_args: tuple[str, ...],
    stop_grace_s: float,
    script: Path,
    args: tuple[str, ...],
) -> None:
    """Run SCRIPT [ARGS] elastically on the hosts listed in --hosts-file."""
    if not script.is_file():
        raise UsageError(f"trainer script not found: {script}")
    try:
        hosts = _read_host_file(hosts_file)
    except OSError as e:
        raise UsageError(f"--hosts-file: {e.strerror}: {hosts_file}") from None
    except channel.ChannelError as e:
        raise UsageError(str(e)) from None
    if min_hosts > max_hosts:
        raise UsageError(f"--min-hosts {min_hosts} > --max-hosts {max_hosts}")
    trainer_dir = trainer_dir or Path(f"bftrainer-run-{script.stem}")
    spec = LaunchSpec(
        trainer_id=trainer_id or script.stem,
        script=script,
        args=args,
        trainer_dir=trainer_dir,
        backend=backend,
        min_hosts=min_hosts,
        max_hosts=max_hosts,
    )
    earlier = _earlier_run(spec, fresh)
    if earlier == "done":
        click.echo(strict_json.dumps(channel.read_result(trainer_dir), sort_keys=True))
        return
    try:
        trainer_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--trainer-dir {trainer_dir}: {e.strerror}") from None
    if exec_mode or ssh_args:
        channel.write_exec(trainer_dir, exec_mode or "ssh", {}, ssh_args)
    try:
        launcher = Launcher.start(spec, hosts, tied_grace_s=stop_grace_s)
    except LaunchError as e:
        raise UsageError(str(e)) from None
    click.echo(f"bftrainer run: {backend} trainer in {launcher.trainer_dir}", err=True)
    last_text = hosts_file.read_text()
    try:
        while (outcome := launcher.poll()) is None:
            time.sleep(POLL_S)
            try:
                text = hosts_file.read_text()
            except OSError:
                continue  # being replaced; read it next time
            if text != last_text:
                try:
                    new = _read_host_file(hosts_file)
                except channel.ChannelError as e:
                    logger.error("%s; keeping the previous hosts", e)
                else:
                    logger.info("hosts now %s", new)
                    launcher.set_hosts(new)
                last_text = text
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (lifeline.Terminated)
        signum = e.signum if isinstance(e, lifeline.Terminated) else signal.SIGINT
        click.echo(
            f"bftrainer run: {signal.Signals(signum).name}: stopping (workers checkpoint) ...",
            err=True,
        )
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second one would cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        launcher.stop(stop_grace_s)
        outcome = launcher.poll()
        click.echo(f"bftrainer run: {outcome.state if outcome else 'stopped'}", err=True)
        raise SystemExit(128 + signum) from None
    log = launcher.trainer_dir / channel.SUPERVISOR_LOG
    if outcome.state == "done":
        result = channel.read_result(launcher.trainer_dir)
        click.echo(strict_json.dumps(result, sort_keys=True))
        return
    click.echo(f"bftrainer run: trainer {outcome.state}: {outcome.reason} (log: {log})", err=True)
    raise SystemExit(1)
