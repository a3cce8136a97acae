"""LSF holders: ``bsub -q <queue> -m host -n 1 -W <minutes> bsub-hold.lsf``.

LSF cannot run here: this follows IBM's documentation of LSF 10.1 and is tested against
outputs written from it (tests/bftrainer/holders_fixtures/, see the README there).

- The holder script is given to ``bsub`` as the command (``runner`` has no stdin to
  pipe it through), so its ``#BSUB`` lines are not read: every option is on the command
  line. The script must exist at that path on the execution host (shared filesystem).
- Each holder's job name is ``<job_name>-<host>``: the host of a pending holder is then
  known from ``bjobs`` alone (``EXEC_HOST`` is empty until it runs).
- Status: ``bjobs -a -q QUEUE -o "jobid stat queue exec_host job_name" -json`` (own
  jobs; ``-a`` adds recently finished ones). With no job at all bjobs prints ``No job
  found`` or ``No unfinished job found`` instead of JSON, with exit 0 or 255 depending on
  ``LSB_BJOBS_CONSISTENT_EXIT_CODE``.
- ``bsub`` answers ``Job <1234> is submitted to queue <killable>.``; ``bkill`` of a
  finished job says ``Job has already finished`` (not an error for ``release``).
- A step inside a holder: ``blaunch -z host CMD`` with ``LSB_JOBID`` set. IBM documents
  ``blaunch`` only inside a job's allocation; launching into a running holder from the
  login node this way is NOT verified on a real LSF (see docs/holders.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from bftrainer.holders.base import (
    DEFAULT_JOB_NAME,
    WINDOW_SLACK_S,
    Holders,
    HolderStatus,
    job_script,
)
from bftrainer.idle_monitor.lsf_jobs import bjobs_records
from bftrainer.idle_monitor.runner import CommandResult, CommandRunner

SCRIPT = job_script("lsf", "bsub-hold.lsf")
BJOBS_FIELDS = "jobid stat queue exec_host job_name"
_SUBMITTED = re.compile(r"Job <(\d+)> is submitted")
_NO_JOBS = re.compile(r"No (?:unfinished )?job found")
_PENDING = frozenset({"PEND", "PSUSP", "WAIT"})
_SUSPENDED = frozenset({"SSUSP", "USUSP"})


def parse_bsub(text: str) -> str:
    """The job id from ``bsub``'s reply."""
    m = _SUBMITTED.search(text)
    if not m:
        raise ValueError(f"expected 'Job <id> is submitted', got {text.strip()[:200]!r}")
    return m.group(1)


def classify(stat: str) -> tuple[str, str, bool]:
    """(our state, reason, lingering) for an LSF job ``STAT``."""
    s = stat.strip().upper()
    if s == "RUN":
        return "running", "", False
    if s in _PENDING:
        return "pending", s.lower(), False
    if s in _SUSPENDED:
        return "ended", "suspended", True
    return "ended", s.lower(), False  # DONE, EXIT, ZOMBI, UNKWN


def parse_bjobs_holders(text: str, queue: str, job_name: str) -> dict[str, HolderStatus]:
    """Job id -> status of our holders (job name ``<job_name>-<host>`` in ``queue``) from
    ``bjobs -o "jobid stat queue exec_host job_name" -json``; other jobs are skipped."""
    stripped = text.strip()
    if not stripped.startswith("{") and _NO_JOBS.search(stripped):
        return {}
    records = bjobs_records(stripped, ("JOBID", "STAT", "QUEUE", "JOB_NAME"), BJOBS_FIELDS)
    prefix = f"{job_name}-"
    out: dict[str, HolderStatus] = {}
    for rec in records:
        name = str(rec["JOB_NAME"])
        if str(rec["QUEUE"]) != queue or not name.startswith(prefix) or name == prefix:
            continue
        state, reason, lingering = classify(str(rec["STAT"]))
        out[str(rec["JOBID"])] = HolderStatus(
            name[len(prefix) :], state, reason, str(rec["STAT"]), lingering
        )
    return out


def lsf_step_argv(job_id: str, host: str, command: Sequence[str]) -> list[str]:
    """``LSB_JOBID=<job> blaunch -z host CMD`` (unverified from outside the job: see the
    module docstring)."""
    if not command:
        raise ValueError("no command to run in the holder")
    return ["env", f"LSB_JOBID={job_id}", "blaunch", "-z", host, *command]


class LsfHolders(Holders):
    """Holders in LSF queue ``queue`` (preempted by the main queues: Summit's
    ``killable``, or a site's ``bftrainer`` queue as in scripts/lsf/README.md).

    ``exclusive``: ``bsub -x`` (the queue needs ``EXCLUSIVE=Y``). ``extra_args``: more
    ``bsub`` options (``-P project``, ``-nnodes 1`` instead of ``-n 1`` on CSM sites such
    as Summit is not covered: see docs/holders.md).
    """

    scheduler = "lsf"

    def __init__(
        self,
        runner: CommandRunner,
        *,
        queue: str = "killable",
        job_name: str = DEFAULT_JOB_NAME,
        script: str | Path = SCRIPT,
        exclusive: bool = True,
        extra_args: Sequence[str] = (),
        slack_s: float = WINDOW_SLACK_S,
    ) -> None:
        super().__init__(runner, job_name=job_name, slack_s=slack_s)
        self.queue = queue
        self.script = str(script)
        self.exclusive = exclusive
        self.extra_args = tuple(extra_args)

    def submit_argv(self, node: str, minutes: int | None, lease: str | None = None) -> list[str]:
        # No -W when the window is open-ended: the queue's RUNLIMIT applies.
        limit = [] if minutes is None else ["-W", str(minutes)]
        return [
            "bsub",
            "-q",
            self.queue,
            "-m",
            node,
            "-n",
            "1",
            *(["-x"] if self.exclusive else []),
            "-J",
            f"{self.job_name}-{node}",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            *limit,
            *self.extra_args,
            self.script,
            *([lease] if lease else []),
        ]

    def parse_submit(self, result: CommandResult) -> str:
        return parse_bsub(result.stdout + "\n" + result.stderr)

    def cancel_argv(self, job_ids: Sequence[str]) -> list[str]:
        return ["bkill", *job_ids]

    def status_argv(self) -> list[str]:
        return ["bjobs", "-a", "-q", self.queue, "-o", BJOBS_FIELDS, "-json"]

    def parse_status(self, result: CommandResult) -> dict[str, HolderStatus]:
        text = result.stdout if result.stdout.strip() else result.stderr
        if result.returncode != 0 and not _NO_JOBS.search(text):
            detail = (result.stderr or result.stdout).strip()[:300]
            raise ValueError(f"exit code {result.returncode}: {detail}")
        return parse_bjobs_holders(text, self.queue, self.job_name)

    def step_argv(self, job_id: str, node: str, command: Sequence[str]) -> list[str]:
        return lsf_step_argv(job_id, node, command)
