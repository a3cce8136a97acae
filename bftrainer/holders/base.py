"""Holder jobs: one preemptible scheduler job per pool node, so the main scheduler is
never delayed and bftrainer's workers run inside an allocation the scheduler knows.

A holder asks for exactly one node, in the partition (Slurm) or queue (LSF) that the
main workload preempts, for no longer than the node's backfill window. The node is usable
once its holder runs; when a main job wants it, the scheduler preempts the holder, the
trainer's worker steps inside it get SIGTERM, and the main job starts within seconds.

``Holders`` is the interface, in the shape of submitit's executors: a base class with the
common logic (``acquire``, ``release``, ``held``, ``reconcile``) and a few hooks per
scheduler (the command lines and the parsers). ``held`` asks about every holder of ours in
ONE status call, as submitit's watcher does with one ``sacct``.

Durability: ``acquire`` returns the job id only after the scheduler accepted it; the
daemon records it in its state. If the daemon dies between the two, the next
``reconcile`` finds a holder the state does not know and cancels it.
"""

from __future__ import annotations

import logging
import math
import shlex
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from bftrainer.idle_monitor.runner import CommandError, CommandResult, CommandRunner

log = logging.getLogger(__name__)

MIN_WINDOW_S = 60.0  # schedulers count time limits in whole minutes
# Seconds a holder leaves free before its node's window ends. Slurm's backfill plans in
# steps of bf_resolution (60 s by default) and does not start a job that ends within
# about a step of a planned start: on the local Slurm a 3-minute holder 31 s short of the
# start stayed pending for good, one 38 s short started (docs/holders.md).
WINDOW_SLACK_S = 60.0
DEFAULT_JOB_NAME = "bftrainer-hold"
HOLDER_STATES = ("pending", "running", "ended")


def job_script(folder: str, name: str) -> Path:
    """This installation's holder job script ``scripts/<folder>/<name>``.

    A wheel carries it inside the package (``bftrainer/scripts/...``, pyproject.toml);
    a source checkout, editable or not, keeps it in the tree's ``scripts/``. The path may
    not exist (a damaged installation): the daemon's start checks it and names it.
    """
    package = Path(__file__).resolve().parents[1]
    root = package if (package / "scripts").is_dir() else package.parent
    return root / "scripts" / folder / name


class HolderError(Exception):
    """A holder could not be submitted, listed or cancelled; the message names the command,
    the node or job, and where the command ran."""


class HolderSubmitError(HolderError):
    """The scheduler refused a holder, or its reply had no job id."""


class HolderStatusError(HolderError):
    """The batched status call failed or printed something unparseable."""


class WindowTooShortError(HolderError, ValueError):
    """The node's window is under a minute: a holder would outlive it (and Slurm reads a
    time limit of 0 as *no limit*)."""


@dataclass(frozen=True)
class HolderStatus:
    """One holder as the scheduler shows it.

    ``state``: ``pending`` (not on its node yet), ``running`` (the node is ours) or
    ``ended`` (the node is not ours any more: finished, cancelled, preempted, even while
    the scheduler is still winding the job down). ``reason``: why, in the scheduler's
    words (``preempted``, ``completed``, ``Resources``, ...). ``scheduler_state``: the raw
    state. ``lingering``: ended for us but still on the node until cancelled (suspended
    by a suspend-mode preemption); ``reconcile`` cancels those.
    """

    node: str
    state: str
    reason: str = ""
    scheduler_state: str = ""
    lingering: bool = False

    def __post_init__(self) -> None:
        if self.state not in HOLDER_STATES:
            raise ValueError(f"holder state {self.state!r}: expected one of {HOLDER_STATES}")

    @property
    def live(self) -> bool:
        """Pending or running: the job holds, or will hold, its node."""
        return self.state != "ended"


@dataclass(frozen=True)
class ReconcileResult:
    """What one ``reconcile`` found and did.

    ``live``: holders the state knows that are pending or running. ``gone``: holders the
    state knows that ended (with the scheduler's status) or that the scheduler no longer
    lists (state ``ended``, reason ``not listed``): the daemon marks them ended and drops
    their nodes. ``cancelled``: holders the state does not know (a daemon died between
    submitting and recording them), and known ones that linger suspended, cancelled now.
    """

    live: dict[str, HolderStatus] = field(default_factory=dict)
    gone: dict[str, HolderStatus] = field(default_factory=dict)
    cancelled: dict[str, HolderStatus] = field(default_factory=dict)


def window_minutes(window_s: float | None, max_minutes: int | None) -> int | None:
    """The time limit of a holder, in whole minutes: the window rounded down (a holder
    must never outlive its node's window), capped at the partition's/queue's maximum.
    None (or ``inf``) window: open-ended, so the maximum (None: no limit at all)."""
    if window_s is None or window_s == math.inf:
        return max_minutes
    if not math.isfinite(window_s) or window_s < MIN_WINDOW_S:
        raise WindowTooShortError(
            f"window of {window_s:g} s is under {MIN_WINDOW_S:g} s: no holder fits in it"
        )
    minutes = int(window_s // 60)
    return minutes if max_minutes is None else min(minutes, max_minutes)


def stderr_tail(path: Path | None, limit: int = 300) -> str:
    """The last non-empty line of a job's stderr file, printable and at most ``limit``
    characters; "" when there is none or it cannot be read."""
    if path is None:
        return ""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    line = "".join(c if c.isprintable() else "?" for c in lines[-1])
    return line if len(line) <= limit else line[:limit] + "..."


# Slurm's and LSF's job names are one token: squeue --name and bjobs filter on it (a
# comma is squeue's list separator), and a holder's name ends with -HOST on LSF.
JOB_NAME_MAX = 100


def check_job_name(job_name: str, source: str = "--job-name") -> str:
    """``job_name`` if the schedulers can carry it as one name; else ``ValueError``
    naming it, in one line (checked before the daemon creates its store)."""
    if not job_name:
        raise ValueError(f"{source}: the holder job name is empty")
    bad = [c for c in job_name if c.isspace() or not c.isprintable() or c in ",\\'\"`$"]
    if bad:
        raise ValueError(
            f"{source} {job_name!r}: the holder job name holds {bad[0]!r}; use letters, "
            "digits and -_. only"
        )
    if len(job_name) > JOB_NAME_MAX:
        raise ValueError(f"{source}: the holder job name is longer than {JOB_NAME_MAX}")
    return job_name


class Holders(ABC):
    """Holder jobs on one scheduler. Subclasses fill the hooks; the logic lives here.

    ``job_name`` tells our holders apart from every other job of the same account: two
    daemons of one account need two names, or each cancels the other's holders as
    unknown.
    """

    scheduler: ClassVar[str]

    def __init__(
        self,
        runner: CommandRunner,
        *,
        job_name: str = DEFAULT_JOB_NAME,
        slack_s: float = WINDOW_SLACK_S,
    ) -> None:
        check_job_name(job_name)
        if not (math.isfinite(slack_s) and slack_s >= 0):
            raise ValueError(f"holder slack {slack_s!r} s: expected a finite number >= 0")
        self.runner = runner
        self.job_name = job_name
        self.slack_s = slack_s
        # Where holder jobs write their stderr (``<job id>.err``), read back when one
        # fails; None: nowhere (the scheduler's own account only). The daemon sets it to
        # a folder of its state directory where the scheduler's commands run here.
        self.stderr_dir: Path | None = None

    # ------------------------------------------------------------- hooks

    @abstractmethod
    def submit_argv(self, node: str, minutes: int | None, lease: str | None = None) -> list[str]:
        """The command that submits one holder for ``node`` with a ``minutes`` limit
        (None: no limit), given ``lease`` (a lease file the holder watches, if any)."""

    @abstractmethod
    def parse_submit(self, result: CommandResult) -> str:
        """The job id from the submit command's reply (raise ``ValueError`` if none)."""

    @abstractmethod
    def cancel_argv(self, job_ids: Sequence[str]) -> list[str]:
        """One command that cancels all of ``job_ids``."""

    @abstractmethod
    def status_argv(self) -> list[str]:
        """One command that lists all our holders, recently ended ones included."""

    @abstractmethod
    def parse_status(self, result: CommandResult) -> dict[str, HolderStatus]:
        """Job id -> status from the status command's result (any exit code); raise
        ``ValueError`` for output that does not parse."""

    @abstractmethod
    def step_argv(self, job_id: str, node: str, command: Sequence[str]) -> list[str]:
        """The argv that runs ``command`` on ``node`` as a task inside holder ``job_id``,
        so that a preemption's SIGTERM reaches it."""

    def max_minutes(self) -> int | None:
        """The longest time limit the partition/queue allows (None: unlimited/unknown)."""
        return None

    def job_account(self, job_id: str) -> str:
        """The scheduler's account of an ended job in a few words (state, exit code,
        reason); "" when it has none. May raise ``CommandError`` or ``ValueError``."""
        return ""

    def status_env(self) -> dict[str, str]:
        return {}

    # ------------------------------------------------------------- the logic

    def time_limit_min(self, window_s: float | None) -> int | None:
        """The time limit ``acquire`` asks for a node of this window, in minutes
        (None: none): the window less ``slack_s``, rounded down. ``WindowTooShortError``
        when no holder fits."""
        usable_s = window_s if window_s is None else window_s - self.slack_s
        return window_minutes(usable_s, self.max_minutes())

    def acquire(self, node: str, window_s: float | None, lease: str | None = None) -> str:
        """Submit a holder for ``node``, limited to its window (None: open-ended, the
        partition's maximum). ``lease``: a file holding an epoch time; the holder ends
        by itself once that time has passed (``trainers.channel.renew_lease``). Returns
        the job id once the scheduler accepted it."""
        minutes = self.time_limit_min(window_s)
        argv = self.submit_argv(node, minutes, lease)
        try:
            result = self.runner.run(argv)
        except CommandError as exc:
            raise HolderSubmitError(f"holder for {node} not submitted: {exc}") from None
        try:
            job_id = self.parse_submit(result)
        except ValueError as exc:
            raise HolderSubmitError(
                f"holder for {node}: no job id in the reply of {shlex.join(argv)} "
                f"({self.runner.where}): {exc}"
            ) from None
        log.debug("%s holder %s submitted for %s", self.scheduler, job_id, node)
        return job_id

    def acquire_many(
        self, windows_s: Mapping[str, float | None], leases: Mapping[str, str] | None = None
    ) -> dict[str, str | HolderError]:
        """``acquire`` for each node of ``windows_s`` (node -> window), with its lease
        from ``leases``: node -> job id, or the ``HolderError`` of that node alone (one
        refused holder does not stop the others). One after another here; a scheduler
        whose submissions can overlap overrides it (``SlurmHolders``)."""
        leases = leases or {}
        out: dict[str, str | HolderError] = {}
        for node, window in windows_s.items():
            try:
                out[node] = self.acquire(node, window, leases.get(node))
            except HolderError as exc:
                out[node] = exc
        return out

    def stderr_file(self, job_id: str) -> Path | None:
        return None if self.stderr_dir is None else self.stderr_dir / f"{job_id}.err"

    def why_failed(self, job_id: str, status: HolderStatus) -> str:
        """A failed holder's cause in one line: the scheduler's account of the job (its
        state as listed when it has none) and the last line of its stderr. Never raises:
        a scheduler that does not answer leaves the listed state."""
        try:
            account = self.job_account(job_id)
        except (CommandError, ValueError) as exc:
            log.debug("no account of holder %s: %s", job_id, exc)
            account = ""
        account = account or status.scheduler_state or status.reason or "no reason given"
        tail = stderr_tail(self.stderr_file(job_id))
        return f"{account}: {tail}" if tail else account

    def forget(self, job_id: str) -> None:
        """Remove the stderr file of a holder that ended well (nothing to keep)."""
        path = self.stderr_file(job_id)
        if path is not None:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.debug("cannot remove %s: %s", path, exc)

    def release(self, *job_ids: str) -> None:
        """Cancel holders (one command). A holder that already ended is no error."""
        ids = sorted(set(job_ids))
        if not ids:
            return
        argv = self.cancel_argv(ids)
        try:
            result = self.runner.run(argv, check=False)
        except CommandError as exc:
            raise HolderError(f"cannot cancel holder(s) {', '.join(ids)}: {exc}") from None
        if result.returncode != 0:
            log.warning(
                "%s (%s) exited %d: %s",
                result.command,
                self.runner.where,
                result.returncode,
                (result.stderr or result.stdout).strip()[:300],
            )
        for job_id in ids:
            self.forget(job_id)
        log.debug("%s holder(s) cancelled: %s", self.scheduler, ", ".join(ids))

    def held(self) -> dict[str, HolderStatus]:
        """Every holder of ours the scheduler lists (ended ones too, while it lists
        them): job id -> status. One command."""
        argv = self.status_argv()
        try:
            result = self.runner.run(argv, env=self.status_env(), check=False)
        except CommandError as exc:
            raise HolderStatusError(f"cannot list holders: {exc}") from None
        try:
            return self.parse_status(result)
        except ValueError as exc:
            raise HolderStatusError(
                f"{shlex.join(argv)} ({self.runner.where}): unusable reply: {exc}"
            ) from None

    def survey(self, known: Iterable[str] | Mapping[str, str]) -> ReconcileResult:
        """Compare the scheduler with the state's holders (``known``: job ids, or job id
        -> node), and only read: ``cancelled`` names the holders to end (unknown to the
        state, or lingering), which the caller ends by its own cancel path. One status
        call; nothing is cancelled here (the daemon reads outside its step, and ends
        holders only by the orders a step commits)."""
        nodes = dict(known) if isinstance(known, Mapping) else dict.fromkeys(known, "")
        listed = self.held()
        out = ReconcileResult()
        for job_id, status in listed.items():
            if job_id not in nodes:
                if status.live or status.lingering:
                    out.cancelled[job_id] = status
            elif status.lingering:
                out.cancelled[job_id] = status
                out.gone[job_id] = status
            elif status.live:
                out.live[job_id] = status
            else:
                out.gone[job_id] = status
        for job_id, node in nodes.items():
            if job_id not in listed:
                out.gone[job_id] = HolderStatus(node, "ended", "not listed", "")
        return out

    def reconcile(self, known: Iterable[str] | Mapping[str, str]) -> ReconcileResult:
        """:meth:`survey`, then cancel what it names (holders the state does not know,
        and known ones that linger) in one command: for a tool with no step of its own.
        One status call and at most one cancel."""
        out = self.survey(known)
        if out.cancelled:
            cancelled = sorted(out.cancelled.items())
            ids = [j for j, _ in cancelled]
            log.warning(
                "%s: cancelling holder(s) %s with %s",
                self.scheduler,
                ", ".join(f"{j} ({c.node}, {c.scheduler_state})" for j, c in cancelled),
                self.cancel_argv(ids)[0],
            )
            self.release(*out.cancelled)
        return out
