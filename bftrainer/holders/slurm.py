"""Slurm holders: ``sbatch -p <bf> -w node -N1 --time=<window> hold-nodes.sbatch``.

Facts this relies on (Slurm 22.05.8 of scripts/slurm/local-cluster.sh, measured; see
docs/holders.md):

- Without accounting (``AccountingStorageType=accounting_storage/none``) ``sacct`` only
  says "Slurm accounting storage is disabled", so status comes from ``squeue -t all``,
  which lists ended jobs for ``MinJobAge`` seconds (300 by default, 30 on the test
  cluster); a holder no longer listed has ended.
- ``squeue``'s job lines are read by :mod:`bftrainer.common.squeue`, the one parser the
  trainers' supervisors use too (its docstring has the format's facts).
- A preempted holder shows ``PREEMPTED`` (``GraceTime=0``, the recommended setting) or,
  with a grace time it exits within, ``COMPLETED``; ``PreemptTime`` tells a preemption
  apart in both, even while the job still shows ``RUNNING``.
- ``scancel`` of an ended or unknown job exits 0.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bftrainer.common.squeue import FORMAT, TIME_ENV, has_value, parse_squeue_jobs
from bftrainer.holders.base import (
    DEFAULT_JOB_NAME,
    WINDOW_SLACK_S,
    HolderError,
    Holders,
    HolderStatus,
    HolderSubmitError,
    job_script,
)
from bftrainer.idle_monitor.runner import CommandError, CommandResult, CommandRunner
from bftrainer.idle_monitor.slurm import HostlistError, expand_hostlist

log = logging.getLogger(__name__)

SCRIPT = job_script("slurm", "hold-nodes.sbatch")
_PENDING = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
)
_SUSPENDED = frozenset({"SUSPENDED", "STOPPED"})
# sbatch and scancel commands in flight at once. slurmctld serves RPCs on many threads;
# one after another, 200 holders took 9 s to submit and a 200-id scancel 17 s on the
# local Slurm (docs/holders.md, "At hundreds of nodes").
SUBMIT_WORKERS = 8
# A release of more holders than this is split over parallel scancel commands; fewer go
# in one command (scancel cancels its ids one after another, 20-90 ms each here).
IDS_PER_SCANCEL = 25


def parse_duration_min(text: str) -> int | None:
    """Whole minutes from a Slurm duration (``MaxTime``: ``UNLIMITED``, ``30``,
    ``1:30:00``, ``2-00:00:00``, ``2-12``), rounded down; None for unlimited."""
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not m:
        raise ValueError(f"bad Slurm duration {text!r}")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # hours:minutes:seconds
        seconds = (a or 0) * 3600 + (b or 0) * 60 + c
    elif b is not None:  # minutes:seconds
        seconds = (a or 0) * 60 + b
    else:  # minutes
        seconds = (a or 0) * 60
    return seconds // 60


def parse_partition_max_minutes(text: str) -> int | None:
    """``MaxTime`` of ``scontrol show partition P -o``, in minutes (None: unlimited)."""
    m = re.search(r"(?:^|\s)MaxTime=(\S+)", text)
    if not m:
        raise ValueError(f"no MaxTime= in {text.strip()[:200]!r}")
    return parse_duration_min(m.group(1))


def parse_job_account(text: str) -> str:
    """ "FAILED, exit code 13, reason NonZeroExitCode" from ``scontrol show job ID -o``
    (``ExitCode=0:9``: "signal 9"); raises ``ValueError`` without a ``JobState``."""
    fields = dict(re.findall(r"(?:^|\s)(JobState|ExitCode|Reason)=(\S+)", text))
    if "JobState" not in fields:
        raise ValueError(f"no JobState= in {text.strip()[:200]!r}")
    words = [fields["JobState"]]
    code, _, signal = fields.get("ExitCode", "").partition(":")
    if code not in ("", "0"):
        words.append(f"exit code {code}")
    if signal not in ("", "0"):
        words.append(f"signal {signal}")
    reason = fields.get("Reason", "")
    if has_value(reason):
        words.append(f"reason {reason}")
    return ", ".join(words)


def classify(state: str, preempted: bool, reason: str) -> tuple[str, str, bool]:
    """(our state, reason, lingering) for a Slurm job state."""
    s = state.strip().upper().rstrip("+")
    if preempted:
        return "ended", "preempted", False
    if s == "RUNNING":
        return "running", "", False
    if s in _PENDING:
        return "pending", reason, False
    if s in _SUSPENDED:
        return "ended", "suspended", True
    return "ended", s.lower(), False


def parse_squeue_holders(text: str) -> dict[str, HolderStatus]:
    """Job id -> status from ``squeue -h -O`` :data:`bftrainer.common.squeue.FORMAT` (times as
    epoch seconds)."""
    out: dict[str, HolderStatus] = {}
    for job in parse_squeue_jobs(text):
        try:
            nodes = expand_hostlist(job.hostlist)
        except HostlistError as exc:
            raise ValueError(f"line {job.line_no}: {exc}") from None
        ours, why, lingering = classify(job.state, job.preempted, job.reason)
        if not has_value(why):
            why = ""
        out[job.job_id] = HolderStatus(",".join(nodes), ours, why, job.state, lingering)
    return out


def slurm_step_argv(job_id: str, node: str, command: Sequence[str]) -> list[str]:
    """Run ``command`` as a step of holder ``job_id`` on ``node``: ``--overlap`` shares the
    holder's CPUs with its sleeping task; the step gets SIGTERM when Slurm preempts."""
    if not command:
        raise ValueError("no command to run in the holder")
    return ["srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1", "-w", node, *command]


class SlurmHolders(Holders):
    """Holders in Slurm partition ``partition`` (the one the main partitions preempt).

    ``script``: the holder batch script where ``sbatch`` runs (default: this
    installation's ``scripts/slurm/hold-nodes.sbatch``, in the source tree or the wheel;
    give the login node's copy when the commands run over SSH). ``extra_args``: more
    ``sbatch`` options a site needs (``--account=...``, ``--qos=...``).
    """

    scheduler = "slurm"

    def __init__(
        self,
        runner: CommandRunner,
        *,
        partition: str = "bf",
        job_name: str = DEFAULT_JOB_NAME,
        script: str | Path = SCRIPT,
        extra_args: Sequence[str] = (),
        slack_s: float = WINDOW_SLACK_S,
        workers: int = SUBMIT_WORKERS,
    ) -> None:
        super().__init__(runner, job_name=job_name, slack_s=slack_s)
        if workers < 1:
            raise ValueError(f"holder submission workers {workers!r}: expected >= 1")
        self.workers = workers
        self.partition = partition
        self.script = str(script)
        self.extra_args = tuple(extra_args)
        self._max_minutes: tuple[int | None] | None = None

    def max_minutes(self) -> int | None:
        """The partition's ``MaxTime`` (read once)."""
        if self._max_minutes is None:
            argv = ["scontrol", "show", "partition", self.partition, "-o"]
            try:
                text = self.runner.run(argv).stdout
            except CommandError as exc:
                raise HolderSubmitError(
                    f"cannot read partition {self.partition}'s MaxTime: {exc}"
                ) from None
            try:
                self._max_minutes = (parse_partition_max_minutes(text),)
            except ValueError as exc:
                raise HolderSubmitError(
                    f"cannot read partition {self.partition}'s MaxTime: {shlex.join(argv)} "
                    f"({self.runner.where}): unusable reply: {exc}"
                ) from None
        return self._max_minutes[0]

    def job_account(self, job_id: str) -> str:
        """``scontrol show job`` while Slurm still knows the job (``MinJobAge``; sacct
        may be absent): its state, exit code and reason."""
        argv = ["scontrol", "show", "job", job_id, "-o"]
        return parse_job_account(self.runner.run(argv).stdout)

    def acquire_many(
        self, windows_s: Mapping[str, float | None], leases: Mapping[str, str] | None = None
    ) -> dict[str, str | HolderError]:
        """One ``sbatch`` per node, ``workers`` of them in flight at once."""
        if windows_s and self.stderr_dir is not None:
            try:
                self.stderr_dir.mkdir(mode=0o700, exist_ok=True)  # sbatch --error's folder
            except OSError as exc:
                log.warning("holders keep no stderr: cannot create %s: %s", self.stderr_dir, exc)
                self.stderr_dir = None
        if self.workers == 1 or len(windows_s) <= 1:
            return super().acquire_many(windows_s, leases)
        self.max_minutes()  # read once, before the threads need it
        leases = leases or {}

        def one(node: str) -> str | HolderError:
            try:
                return self.acquire(node, windows_s[node], leases.get(node))
            except HolderError as exc:
                return exc

        with ThreadPoolExecutor(min(self.workers, len(windows_s))) as pool:
            return dict(zip(windows_s, pool.map(one, windows_s), strict=True))

    def release(self, *job_ids: str) -> None:
        """One ``scancel`` per ``IDS_PER_SCANCEL`` ids, up to ``workers`` at once."""
        ids = sorted(set(job_ids))
        n = min(self.workers, -(-len(ids) // IDS_PER_SCANCEL))
        chunks = [ids[i::n] for i in range(n)]
        if len(chunks) <= 1:
            return super().release(*ids)
        with ThreadPoolExecutor(len(chunks)) as pool:
            futures = [pool.submit(super(SlurmHolders, self).release, *c) for c in chunks]
        for f in futures:
            exc = f.exception()
            if exc is not None:
                raise exc

    def submit_argv(self, node: str, minutes: int | None, lease: str | None = None) -> list[str]:
        return [
            "sbatch",
            "--parsable",
            f"--partition={self.partition}",
            f"--nodelist={node}",
            "--nodes=1",
            f"--job-name={self.job_name}",
            f"--time={'UNLIMITED' if minutes is None else minutes}",
            *([f"--error={self.stderr_dir / '%j.err'}"] if self.stderr_dir else []),
            *self.extra_args,
            self.script,
            *([lease] if lease else []),
        ]

    def parse_submit(self, result: CommandResult) -> str:
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise ValueError(f"expected a job id, got {result.stdout.strip()[:200]!r}")
        return job_id

    def cancel_argv(self, job_ids: Sequence[str]) -> list[str]:
        return ["scancel", *job_ids]

    def status_argv(self) -> list[str]:
        return [
            "squeue",
            "--me",
            "--noheader",
            "--states=all",
            f"--partition={self.partition}",
            f"--name={self.job_name}",
            f"--Format={FORMAT}",
        ]

    def status_env(self) -> dict[str, str]:
        return dict(TIME_ENV)

    def parse_status(self, result: CommandResult) -> dict[str, HolderStatus]:
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()[:300]
            raise ValueError(f"exit code {result.returncode}: {detail}")
        return parse_squeue_holders(result.stdout)

    def step_argv(self, job_id: str, node: str, command: Sequence[str]) -> list[str]:
        return slurm_step_argv(job_id, node, command)
