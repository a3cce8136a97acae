"""``bftrainer run``: run an elastic trainer by hand on a host list that may change.

    bftrainer run --backend torchrun --hosts-file hosts.txt examples/train_mlp.py --work-epochs 2

The host file (one ``host[:slots]`` per line, Horovod's discovery format) is re-read as
it changes and copied to the trainer directory's ``hosts``; an empty file stops the
workers (they checkpoint) until hosts come back, and says so. Inside an ``salloc``
(or ``sbatch``), write the allocation's nodes to the file: ``--exec-mode slurm`` runs
the workers as steps of that allocation (outside one it is refused); by hand, ssh
reaches the other nodes. Exits with the trainer's outcome: 0 done (the
result line is printed), 1 failed (the reason in one line; the traceback is in the
trainer directory's supervisor.log), 130 stopped by Ctrl-C (workers checkpointed: run
the same command again to resume).
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import click

from bftrainer.cli import UsageError
from bftrainer.cli.params import NODES, InputFile, Number
from bftrainer.common import strict_json
from bftrainer.common.names import (
    BadNameError,
    NotRegularFileError,
    check_trainer_id,
    decode_text,
    read_bytes,
    trainer_id_from,
)
from bftrainer.idle_monitor.slurm import HostlistError, expand_hostlist
from bftrainer.trainers import channel, lifeline
from bftrainer.trainers.launch.base import (
    BACKENDS,
    DEFAULT_STOP_GRACE_S,
    MAX_STOP_GRACE_S,
    Launcher,
    LaunchError,
    LaunchSpec,
)
from bftrainer.trainers.launch.own_files import is_trainer_dir, remove_own_files

logger = logging.getLogger(__name__)

POLL_S = 0.5


def _same_work(old: LaunchSpec, new: LaunchSpec) -> bool:
    """The checkpoint continues only the same script (path and content), arguments (the
    work among them) and trainer id. A spec that recorded no content (an earlier
    version's) is taken at its path."""
    same_content = not old.script_sha256 or old.script_sha256 == new.script_sha256
    return same_content and (old.script, old.args, old.trainer_id) == (
        new.script.resolve(),
        new.args,
        new.trainer_id,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
        # Only a folder that is provably a trainer directory, and only what bftrainer
        # wrote there: a user's folder with a spec.json of another kind is never touched.
        if not is_trainer_dir(d):
            raise UsageError(
                f"--trainer-dir {d}: --fresh removes only a trainer directory, and its "
                f"{channel.SPEC} is not a bftrainer launch spec written for this folder: "
                "nothing was removed; choose a new or empty folder"
            )
        left = remove_own_files(d)
        kept = f"; kept what bftrainer did not write: {', '.join(left[:5])}" if left else ""
        click.echo(
            f"bftrainer run: starting afresh in {d} (the earlier run's files removed{kept})",
            err=True,
        )
        return None
    edited = old is not None and not _same_work(old, spec)
    if edited and old is not None and _same_work(replace(old, script_sha256=""), spec):
        raise UsageError(
            f"--trainer-dir {d} holds an earlier run of {old.script.name} whose content "
            "has changed since (an edited script is new work): add --fresh to start "
            "afresh there, or choose another --trainer-dir"
        )
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


def _parse_host_file(data: bytes, path: Path) -> list[str]:
    """``host:slots`` entries of a hosts file's bytes; ``ChannelError`` naming the file
    (and line) when one is not UTF-8 or not a usable host."""
    try:
        text = decode_text(data, path)
    except BadNameError as e:
        raise channel.ChannelError(str(e)) from None
    return [f"{h}:{s}" for h, s in channel.parse_hosts(text, str(path))]


def _allocation() -> tuple[str, set[str]]:
    """``--exec-mode slurm`` by hand: the Slurm allocation ``run`` is inside (salloc or
    sbatch), whose nodes the workers run on as its job steps; its job id and nodes."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job:
        raise UsageError(
            "--exec-mode slurm: not inside a Slurm allocation (no SLURM_JOB_ID): run it "
            "inside salloc or sbatch, whose nodes the workers run on as job steps, or use "
            "--exec-mode ssh"
        )
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        return job, set(expand_hostlist(nodelist))
    except HostlistError as e:
        raise UsageError(f"--exec-mode slurm: SLURM_JOB_NODELIST={nodelist!r}: {e}") from None


def _outside(hosts: list[str], nodes: set[str]) -> list[str]:
    return [h for h in (e.rpartition(":")[0] for e in hosts) if h not in nodes]


def _say_waiting(hosts: list[str], hosts_file: Path) -> None:
    """A wait with no host says so (else run would print nothing until hosts come)."""
    if not hosts:
        click.echo(
            f"bftrainer run: {hosts_file} lists no host: the trainer waits (checkpointed) "
            "until it lists some",
            err=True,
        )


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
@click.option("--max-hosts", "n_max", type=NODES, default=64, show_default=True)
@click.option("--min-hosts", "n_min", type=NODES, default=1, show_default=True)
@click.option(
    "--exec-mode",
    type=click.Choice(channel.EXEC_MODES),
    help="How to reach the hosts [default: here for this machine's names, else ssh].",
)
@click.option("--ssh-arg", "ssh_args", multiple=True, help="Extra ssh argument (repeatable).")
@click.option(
    "--stop-grace-s",
    type=Number(min=0.0, max=MAX_STOP_GRACE_S),
    default=DEFAULT_STOP_GRACE_S,
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
    n_max: int,
    n_min: int,
    exec_mode: str | None,
    ssh_args: tuple[str, ...],
    stop_grace_s: float,
    script: Path,
    args: tuple[str, ...],
) -> None:
    """Run SCRIPT [ARGS] elastically on the hosts listed in --hosts-file."""
    if not script.is_file():
        raise UsageError(f"trainer script not found: {script}")
    if trainer_id is not None:
        try:
            check_trainer_id(trainer_id, "--trainer-id")
        except BadNameError as e:
            raise UsageError(str(e)) from None
    try:
        last_data = read_bytes(hosts_file)
        hosts = _parse_host_file(last_data, hosts_file)
    except NotRegularFileError as e:
        raise UsageError(f"--hosts-file: {e.strerror}") from None
    except OSError as e:
        raise UsageError(f"--hosts-file: {e.strerror}: {hosts_file}") from None
    except channel.ChannelError as e:
        raise UsageError(str(e)) from None
    if n_min > n_max:
        raise UsageError(f"--min-hosts {n_min} > --max-hosts {n_max}")
    allocation = None
    if exec_mode == "slurm":
        allocation = _allocation()
        outside = _outside(hosts, allocation[1])
        if outside:
            raise UsageError(
                f"--hosts-file {hosts_file}: {', '.join(outside)} not in this allocation "
                f"(job {allocation[0]}: {', '.join(sorted(allocation[1]))})"
            )
    trainer_dir = trainer_dir or Path(f"bftrainer-run-{script.stem}")
    try:
        script_sha256 = _sha256(script)
    except OSError as e:
        raise UsageError(f"trainer script {script}: {e.strerror}") from None
    spec = LaunchSpec(
        trainer_id=trainer_id or trainer_id_from(script.stem),
        script=script,
        args=args,
        trainer_dir=trainer_dir,
        backend=backend,
        n_min=n_min,
        n_max=n_max,
        script_sha256=script_sha256,
    )
    earlier = _earlier_run(spec, fresh)
    if earlier == "done":
        click.echo(strict_json.dumps(channel.read_result(trainer_dir), sort_keys=True))
        return
    try:
        trainer_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--trainer-dir {trainer_dir}: {e.strerror}") from None
    try:
        if exec_mode or ssh_args:
            jobs = dict.fromkeys(allocation[1], allocation[0]) if allocation else {}
            channel.write_exec(trainer_dir, exec_mode or "ssh", jobs, ssh_args)
        launcher = Launcher.start(spec, hosts, tied_grace_s=stop_grace_s)
    except LaunchError as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # a full disk, a folder made read-only meanwhile
        raise UsageError(f"--trainer-dir {trainer_dir}: {e.strerror or e}") from None
    click.echo(f"bftrainer run: {backend} trainer in {launcher.trainer_dir}", err=True)
    _say_waiting(hosts, hosts_file)
    try:
        while (outcome := launcher.poll()) is None:
            time.sleep(POLL_S)
            try:
                data = read_bytes(hosts_file)  # never blocks: a FIFO is refused
            except NotRegularFileError as e:
                if last_data != b"<not a file>":
                    logger.error("%s; keeping the previous hosts", e.strerror)
                last_data = b"<not a file>"  # said once, until it is a file again
                continue
            except OSError:
                continue  # being replaced; read it next time
            if data != last_data:
                try:
                    new = _parse_host_file(data, hosts_file)
                except channel.ChannelError as e:
                    logger.error("%s; keeping the previous hosts", e)
                else:
                    outside = _outside(new, allocation[1]) if allocation else []
                    if outside:
                        logger.error(
                            "%s: %s not in this allocation (job %s): left out",
                            hosts_file,
                            ", ".join(outside),
                            allocation[0] if allocation else "",
                        )
                        new = [h for h in new if h.rpartition(":")[0] not in outside]
                    logger.info("hosts now %s", new)
                    launcher.set_hosts(new)
                    _say_waiting(new, hosts_file)
                last_data = data
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
