"""IBM Spectrum LSF as a pool source: ``bhosts -w`` for host states, ``bslots -l`` and the
allocation planner's plan for the claims on idle hosts, ``bjobs`` for bftrainer's own jobs.

LSF cannot run here; the parsers are tested on recorded outputs in the documented
formats (``idle_monitor/fixtures/lsf-*``).

- ``bhosts -w``: ``HOST_NAME STATUS JL/U MAX NJOBS RUN SSUSP USUSP RSV``. A host is idle
  when its status is ``ok`` and ``NJOBS`` is 0. A host with no running or suspended job
  but slots reserved (``RSV`` > 0) is held for a pending job: set aside, like Slurm's
  ``planned``, and in the pool only if its backfill window lasts beyond the horizon.
- ``bslots -l``: blocks of ``SLOTS:``, ``RUNTIME:`` (``UNLIMITED``, ``40 minutes``, ``1
  hour 30 minutes``) and ``HOSTS:`` (``n*host`` ..., possibly wrapped). Each block says
  that many slots stay free for that long; a host's whole-node window is the runtime of
  the block where it offers the most slots (the longest such). ``UNLIMITED`` is
  open-ended. LSF computes these windows from reservations (including those made for
  planned jobs) and advance reservations.
- The allocation plan (LSF 10.1 plan-based scheduling, ``ALLOCATION_PLANNER=Y``): the
  planner dumps it as JSON to ``$LSF_ENVDIR/../work/<cluster>/logdir/
  lsb.allocation.plan.json``; each entry names a pending job, its planned ``START_TIME``
  (epoch seconds) and its planned hosts (``ALLOC``). LSF reserves as little as it can for
  a plan, so a planned host may still show a long ``bslots`` window: the plan is the
  earlier, truer claim. The file is read with ``cat`` through the runner (so also over
  SSH); when it does not exist, planning is off and the claims come from ``bslots`` only.
- ``bjobs -u all -q QUEUE -o "jobid stat queue exec_host" -json`` lists bftrainer's own
  jobs (its preemptible queue). A host whose used slots (``bhosts`` ``RUN`` + ``SSUSP`` +
  ``USUSP``) all belong to those jobs counts as idle, as Slurm's ``--bf-partition`` does.
- Without ``-w`` LSF truncates long host names and marks them with ``*``; such a name is
  resolved to the one full name it can be (from ``bslots`` or an earlier reading), or
  the output is rejected as unparseable.
- ``lsload -gpu -w`` (only with ``--slots-per-node gres``): ``HOST_NAME status ngpus
  gpu_shared_avg_mut gpu_shared_avg_ut ngpus_physical``; a host's ``ngpus`` is its GPU
  count. A host it does not list has none; a ``-`` (the host's LIM unavailable) is that
  host's error, the others still count.
- OLCF's ``jobstat`` is a site wrapper, not part of LSF: it is not read.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bftrainer.idle_monitor.runner import (
    CommandFailedError,
    CommandResult,
    CommandRunner,
    ProgramNotFoundError,
)
from bftrainer.idle_monitor.source import (
    Claims,
    CommandOutputError,
    NodeStates,
    OutputParseError,
    Scheduler,
    merge_claims,
)
from bftrainer.names import BadNameError, check_host

log = logging.getLogger(__name__)

BHOSTS_COLUMNS = ("HOST_NAME", "STATUS", "JL/U", "MAX", "NJOBS", "RUN", "SSUSP", "USUSP", "RSV")
_UNIT_S = {"day": 86400.0, "hour": 3600.0, "minute": 60.0, "second": 1.0}
PLAN_AUTO = "auto"  # --lsf-plan-file default: the documented path where commands run
PLAN_FILE_NAME = "lsb.allocation.plan.json"
BJOBS_FIELDS = "jobid stat queue exec_host"
# bjobs says this (stderr, non-zero exit) when a queue has no unfinished job.
_NO_JOBS = re.compile(r"^\s*No (?:\w+ )*job found", re.MULTILINE)
# Job states in which a job holds slots on its execution hosts.
_HOLDING_STATES = frozenset({"RUN", "SSUSP", "USUSP", "PROV"})
# bhosts statuses that a host has only because of the jobs on it.
_JOB_STATUSES = frozenset({"ok", "closed_Full", "closed_Excl"})
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _is_host(name: str) -> bool:
    try:
        check_host(name)
    except BadNameError:
        return False
    return True


@dataclass(frozen=True)
class HostState:
    """One ``bhosts`` row (counts in slots)."""

    name: str
    status: str
    max_slots: int | None
    njobs: int
    run: int
    ssusp: int
    ususp: int
    rsv: int

    @property
    def kind(self) -> str:
        """``idle``, ``set_aside`` (reserved, nothing running) or ``busy``."""
        if self.run or self.ssusp or self.ususp:
            return "busy"
        if self.status == "ok" and self.njobs == 0:
            return "idle"
        if self.rsv > 0 and self.status in ("ok", "closed_Full"):
            return "set_aside"
        return "busy"


def _count(text: str, what: str, line_no: int, line: str) -> int:
    if not text.isdigit():
        raise OutputParseError(f"bad {what} {text!r}", line_no, line)
    return int(text)


def parse_bhosts(text: str, known_hosts: Iterable[str] = ()) -> list[HostState]:
    """Host rows from ``bhosts -w`` (or plain ``bhosts``, resolving truncated names)."""
    rows: list[HostState] = []
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.strip()), None)
    if header_at is None:
        raise OutputParseError("empty bhosts output")
    header = lines[header_at].split()
    if tuple(header) != BHOSTS_COLUMNS:
        raise OutputParseError(
            f"expected the header {' '.join(BHOSTS_COLUMNS)}", header_at + 1, lines[header_at]
        )
    known = {h for h in known_hosts if not h.endswith("*")}
    for line_no, line in enumerate(lines[header_at + 1 :], header_at + 2):
        if not line.strip():
            continue
        f = line.split()
        if len(f) != len(BHOSTS_COLUMNS):
            raise OutputParseError(f"expected {len(BHOSTS_COLUMNS)} columns", line_no, line)
        name = f[0]
        if name.endswith("*"):
            name = _resolve_truncated(name, known, line_no, line)
        try:
            check_host(name)  # it reaches ssh's command line (bftrainer.names)
        except BadNameError as exc:
            raise OutputParseError(f"host name: {exc}", line_no, line) from None
        max_slots = None if f[3] == "-" else _count(f[3], "MAX", line_no, line)
        counts = [
            _count(v, c, line_no, line) for v, c in zip(f[4:], BHOSTS_COLUMNS[4:], strict=True)
        ]
        rows.append(HostState(name, f[1], max_slots, *counts))
    if not rows:
        raise OutputParseError("no host rows in bhosts output")
    return rows


def _resolve_truncated(name: str, known: set[str], line_no: int, line: str) -> str:
    prefix = name.rstrip("*")
    matches = sorted(h for h in known if h.startswith(prefix))
    if len(matches) == 1:
        return matches[0]
    what = "no" if not matches else f"{len(matches)} ({', '.join(matches[:3])})"
    raise OutputParseError(
        f"truncated host name {name!r} matches {what} known host(s); run bhosts with -w",
        line_no,
        line,
    )


def parse_runtime_s(text: str) -> float | None:
    """Seconds from a ``bslots`` RUNTIME (``1 hour 30 minutes``); None for UNLIMITED."""
    value = text.strip()
    if value.upper() == "UNLIMITED":
        return None
    parts = re.findall(r"(\d+)\s*(day|hour|minute|second)s?\b", value, flags=re.IGNORECASE)
    rest = re.sub(r"(\d+)\s*(day|hour|minute|second)s?\b", "", value, flags=re.IGNORECASE)
    if not parts or rest.strip():
        raise OutputParseError(f"bad RUNTIME {value!r}")
    return sum(int(n) * _UNIT_S[unit.lower()] for n, unit in parts)


@dataclass(frozen=True)
class BackfillSlots:
    """One ``bslots -l`` block: ``slots`` free for ``runtime_s`` (None: unlimited)."""

    slots: int
    runtime_s: float | None
    hosts: tuple[tuple[str, int], ...]


def parse_bslots(text: str) -> list[BackfillSlots]:
    """Blocks from ``bslots -l``; ``No backfill window exists at this time`` gives none."""
    blocks: list[BackfillSlots] = []
    slots: int | None = None
    runtime: float | None = None
    hosts: list[tuple[str, int]] = []
    in_hosts = False
    seen_runtime = False

    def close(line_no: int) -> None:
        nonlocal slots, runtime, hosts, in_hosts, seen_runtime
        if slots is None:
            return
        if not seen_runtime:
            raise OutputParseError("SLOTS without RUNTIME", line_no)
        blocks.append(BackfillSlots(slots, runtime, tuple(hosts)))
        slots, runtime, hosts, in_hosts, seen_runtime = None, None, [], False, False

    for line_no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            in_hosts = False
            continue
        if stripped.lower().startswith("no backfill window"):
            continue
        key, sep, value = stripped.partition(":")
        key = key.strip().upper()
        if sep and key == "SLOTS":
            close(line_no)
            slots = _count(value.strip(), "SLOTS", line_no, line)
            in_hosts = False
        elif sep and key == "RUNTIME":
            if slots is None:
                raise OutputParseError("RUNTIME before SLOTS", line_no, line)
            try:
                runtime = parse_runtime_s(value)
            except OutputParseError as exc:
                raise OutputParseError(exc.problem, line_no, line) from None
            seen_runtime = True
            in_hosts = False
        elif sep and key == "HOSTS":
            if slots is None:
                raise OutputParseError("HOSTS before SLOTS", line_no, line)
            hosts.extend(_host_slots(value, line_no, line))
            in_hosts = True
        elif in_hosts and "*" in stripped:
            hosts.extend(_host_slots(stripped, line_no, line))
        else:
            raise OutputParseError("expected SLOTS:, RUNTIME: or HOSTS:", line_no, line)
    close(len(text.splitlines()))
    return blocks


def _host_slots(text: str, line_no: int, line: str) -> list[tuple[str, int]]:
    out = []
    for item in text.split():
        if item == "...":
            continue
        m = re.fullmatch(r"(\d+)\*(\S+)", item)
        if not m:
            raise OutputParseError(f"expected n*host, got {item!r}", line_no, line)
        out.append((m.group(2), int(m.group(1))))
    return out


def host_windows_s(blocks: Iterable[BackfillSlots]) -> dict[str, float | None]:
    """Each host's whole-node backfill window: the runtime of the block in which it
    offers the most slots (the longest such); None is unlimited."""
    best: dict[str, tuple[int, float]] = {}
    for block in blocks:
        length = float("inf") if block.runtime_s is None else block.runtime_s
        for host, n in block.hosts:
            if host not in best or (n, length) > best[host]:
                best[host] = (n, length)
    return {h: (None if length == float("inf") else length) for h, (_, length) in best.items()}


# ---------------------------------------------------------------------- allocation plan


@dataclass(frozen=True)
class PlannedJob:
    """One entry of the allocation plan: ``job_id`` is planned to start on ``hosts`` at
    ``start_s`` (epoch seconds)."""

    job_id: str
    start_s: float
    hosts: tuple[str, ...]
    rank: int | None = None

    @property
    def base_id(self) -> str:
        return job_base_id(self.job_id)


def job_base_id(job_id: str) -> str:
    """The numeric job id: ``172024`` from ``montreal@172024``, ``172024[3]`` or ``172024``.

    The plan names jobs ``cluster@id``; ``bjobs`` names them ``id``.
    """
    return re.sub(r"\[[^\]]*\]$", "", job_id.strip().rpartition("@")[2])


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputParseError(
            f"{what} is not JSON (cut off?): {exc.msg} at column {exc.colno}", exc.lineno
        ) from None
    if not isinstance(data, dict):
        raise OutputParseError(f"{what} is not a JSON object")
    return data


def _epoch_s(value: object, where: str) -> float:
    text = str(value).strip() if isinstance(value, str | int) else ""
    if not text.isdigit():
        raise OutputParseError(f"{where}: START_TIME {value!r} is not epoch seconds")
    return float(text)


def parse_plan(text: str) -> list[PlannedJob]:
    """Planned jobs from ``lsb.allocation.plan.json``.

    Each ``PLANS`` entry needs ``JOB_ID``, ``START_TIME`` (epoch seconds, a string in
    LSF's dump) and an ``ALLOC`` list of ``{"HOST": ...}``; what else an entry holds
    (``RSRC`` amounts, ``FINISH_TIME``) is not needed: any planned slot claims the host.
    """
    data = _json_object(text, "allocation plan")
    plans = data.get("PLANS")
    if plans is None and str(data.get("NUM_PLANS", "")).strip() == "0":
        return []
    if not isinstance(plans, list):
        raise OutputParseError("allocation plan without a PLANS list")
    jobs: list[PlannedJob] = []
    for i, plan in enumerate(plans):
        if not isinstance(plan, dict):
            raise OutputParseError(f"plan {i} is not a JSON object")
        job_id = str(plan.get("JOB_ID") or "").strip()
        if not job_id:
            raise OutputParseError(f"plan {i} has no JOB_ID")
        where = f"plan {i} (job {job_id})"
        start_s = _epoch_s(plan.get("START_TIME"), where)
        alloc = plan.get("ALLOC")
        if not isinstance(alloc, list):
            raise OutputParseError(f"{where} has no ALLOC list")
        hosts: list[str] = []
        for entry in alloc:
            host = entry.get("HOST") if isinstance(entry, dict) else None
            if not isinstance(host, str) or not _is_host(host):
                raise OutputParseError(f"{where}: ALLOC entry without a host name: {entry!r:.100}")
            hosts.append(host)
        rank_text = str(plan.get("RANK", "")).strip()
        rank = int(rank_text) if rank_text.isdigit() else None
        jobs.append(PlannedJob(job_id, start_s, tuple(dict.fromkeys(hosts)), rank))
    declared = str(data.get("NUM_PLANS", "")).strip()
    if declared.isdigit() and int(declared) != len(jobs):
        log.debug("lsf: plan says NUM_PLANS=%s but lists %d plan(s)", declared, len(jobs))
    return jobs


def plan_claims(
    jobs: Iterable[PlannedJob],
    now_s: float,
    *,
    overdue_s: float,
    skip_ids: frozenset[str] = frozenset(),
) -> tuple[dict[str, float], list[PlannedJob]]:
    """Earliest planned start per host, and the entries left out as overdue.

    Jobs in ``skip_ids`` (bftrainer's own) are left out: our own pending job does not
    take a host away from us. An entry whose start passed more than ``overdue_s`` ago is
    left out too: the job should have started, and a live planner re-plans it; a plan
    file left behind when planning was switched off would otherwise keep its hosts out
    of the pool for ever. An entry less overdue claims its hosts now.
    """
    keep: list[PlannedJob] = []
    overdue: list[PlannedJob] = []
    for job in jobs:
        if job.base_id in skip_ids:
            continue
        (overdue if job.start_s < now_s - overdue_s else keep).append(job)
    return merge_claims(*({h: j.start_s for h in j.hosts} for j in keep)), overdue


def parse_lsid_cluster(text: str) -> str:
    """The cluster name from ``lsid`` (``My cluster name is summit``)."""
    for line_no, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*My cluster name is\s+(\S+)\s*$", line)
        if m:
            if not _QUEUE_NAME.fullmatch(m.group(1)):
                raise OutputParseError(f"bad cluster name {m.group(1)!r}", line_no, line)
            return m.group(1)
    raise OutputParseError("no 'My cluster name is ...' line in lsid output")


# ---------------------------------------------------------------------- own jobs


@dataclass(frozen=True)
class QueueJob:
    """One ``bjobs -o "jobid stat queue exec_host" -json`` record; ``slots``: host -> slots."""

    job_id: str
    stat: str
    queue: str
    slots: tuple[tuple[str, int], ...]


def parse_exec_host(text: str) -> dict[str, int]:
    """Host -> slots from an ``EXEC_HOST`` value.

    LSF writes ``6*hostA:6*hostB`` (slots per host) or one name per slot
    (``hostA:hostA:hostB``); Summit's jobs start with their launch node
    (``1*batch2:42*a01n01:...``). Pending jobs have ``""`` (or ``-``).
    """
    value = text.strip()
    slots: dict[str, int] = {}
    if value in ("", "-"):
        return slots
    for item in re.split(r"[:\s]+", value):
        if not item:
            continue
        m = re.fullmatch(r"(?:(\d+)\*)?([A-Za-z0-9][A-Za-z0-9_.\-]*)", item)
        if not m:
            raise OutputParseError(f"bad EXEC_HOST entry {item!r} in {value[:80]!r}")
        slots[m.group(2)] = slots.get(m.group(2), 0) + int(m.group(1) or 1)
    return slots


def bjobs_records(text: str, fields: Sequence[str], asked: str) -> list[dict[str, Any]]:
    """The records of ``bjobs -o "<asked>" -json``, each checked to hold ``fields``
    (upper-case, as LSF names them); a record LSF marks as an error is refused."""
    data = _json_object(text, "bjobs output")
    records = data.get("RECORDS")
    if not isinstance(records, list):
        raise OutputParseError("bjobs JSON without a RECORDS list")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise OutputParseError(f"bjobs record {i} is not a JSON object")
        if rec.get("ERROR"):
            raise OutputParseError(f"bjobs record {i}: {rec['ERROR']!r:.200}")
        missing = [k for k in fields if k not in rec]
        if missing:
            raise OutputParseError(
                f"bjobs record {i} lacks {', '.join(missing)} (expected -o '{asked}')"
            )
    return records


def parse_bjobs_json(text: str) -> list[QueueJob]:
    """Jobs from ``bjobs -o "jobid stat queue exec_host" -json``."""
    records = bjobs_records(text, ("JOBID", "STAT", "QUEUE", "EXEC_HOST"), BJOBS_FIELDS)
    jobs: list[QueueJob] = []
    for i, rec in enumerate(records):
        try:
            slots = parse_exec_host(str(rec["EXEC_HOST"]))
        except OutputParseError as exc:
            raise OutputParseError(f"bjobs record {i} (job {rec['JOBID']}): {exc}") from None
        jobs.append(
            QueueJob(str(rec["JOBID"]), str(rec["STAT"]), str(rec["QUEUE"]), tuple(slots.items()))
        )
    return jobs


def release_own(row: HostState, own_slots: int) -> HostState:
    """The row as LSF would show it without bftrainer's jobs, when those jobs hold every
    used slot of the host; otherwise the row unchanged (another job shares the host).

    Reserved slots stay: a host reserved for a pending job stays set aside.
    """
    used = row.run + row.ssusp + row.ususp
    if used == 0 or own_slots < used or row.status not in _JOB_STATUSES:
        return row
    return replace(row, status="ok", njobs=row.rsv, run=0, ssusp=0, ususp=0)


def parse_lsload_gpus(text: str) -> tuple[dict[str, int], dict[str, str]]:
    """GPUs per host from ``lsload -gpu -w`` (module docstring): the counts that parse,
    and for each host whose ``ngpus`` does not, why (the other hosts still count)."""
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise OutputParseError("no header line in lsload -gpu output")
    header_no, header = lines[0]
    columns = header.split()
    if "HOST_NAME" not in columns or "ngpus" not in columns:
        raise OutputParseError("expected a header with HOST_NAME and ngpus", header_no, header)
    host_at, count_at = columns.index("HOST_NAME"), columns.index("ngpus")
    status_at = columns.index("status") if "status" in columns else None
    gpus: dict[str, int] = {}
    errors: dict[str, str] = {}
    for line_no, line in lines[1:]:
        fields = line.split()
        if len(fields) != len(columns):
            raise OutputParseError(f"expected {len(columns)} columns", line_no, line)
        host, count = fields[host_at], fields[count_at]
        if count.isdigit():
            gpus[host] = int(count)
        else:
            status = f" (status {fields[status_at]})" if status_at is not None else ""
            errors[host] = f"ngpus {count!r} is not a number{status}"
    return gpus, errors


# ---------------------------------------------------------------------- the adapter


class LsfScheduler(Scheduler):
    """LSF through ``bhosts -w``, ``bslots -l``, the allocation plan and ``bjobs``.

    ``host_pattern`` (a regular expression) keeps only compute hosts, e.g. Summit's
    ``[a-h]\\d{2}n\\d{2}`` to leave out login and launch nodes.

    ``plan_file``: where the allocation plan is, on the machine the commands run on;
    ``"auto"`` finds it as IBM documents (``$LSF_ENVDIR/../work/<cluster>/logdir/``, with
    ``LSF_ENVDIR`` from ``printenv`` and the cluster from ``lsid``, once); ``None`` does not
    read it. When the file does not exist (planning off) the claims come from ``bslots``
    only, logged once and checked again every ``plan_recheck_s``.

    ``bf_queues``: bftrainer's own preemptible queues; hosts held only by their jobs count
    as idle (one ``bjobs`` per queue and poll), and their pending jobs' plan entries are
    ignored (from the previous poll's ``bjobs``, since claims are read before nodes).

    ``read_gpus``: also read each host's GPU count (``lsload -gpu -w``, one per poll).
    """

    name = "lsf"
    gpu_field = "lsload -gpu's ngpus"

    def __init__(
        self,
        *,
        host_pattern: str | None = None,
        plan_file: str | None = PLAN_AUTO,
        bf_queues: Sequence[str] = (),
        plan_recheck_s: float = 600.0,
        plan_overdue_s: float = 600.0,
        read_gpus: bool = False,
    ) -> None:
        for queue in bf_queues:
            if not _QUEUE_NAME.fullmatch(queue):
                raise ValueError(f"bad LSF queue name {queue!r}")
        if plan_file is not None and plan_file != PLAN_AUTO and not plan_file.startswith("/"):
            raise ValueError(
                f"plan file {plan_file!r} is not an absolute path (or 'auto', or None)"
            )
        if plan_recheck_s < 0 or plan_overdue_s < 0:
            raise ValueError(
                f"plan_recheck_s and plan_overdue_s must be >= 0, got {plan_recheck_s}, "
                f"{plan_overdue_s}"
            )
        self.host_pattern = re.compile(host_pattern) if host_pattern else None
        self.plan_file = plan_file
        self.bf_queues = tuple(bf_queues)
        self.plan_recheck_s = plan_recheck_s
        self.plan_overdue_s = plan_overdue_s
        self.read_gpus = read_gpus
        self._known_hosts: set[str] = set()
        self._listed_hosts: frozenset[str] = frozenset()  # every bhosts row, last reading
        self._own_job_ids: frozenset[str] = frozenset()
        self._plan_path: str | None = None if plan_file == PLAN_AUTO else plan_file
        self._plan_located = plan_file != PLAN_AUTO
        self._plan_absent_s: float | None = None  # when the plan file was last found absent
        self._overdue_ids: frozenset[str] = frozenset()
        self._unknown_hosts: frozenset[str] = frozenset()

    @staticmethod
    def bhosts_argv() -> list[str]:
        return ["bhosts", "-w"]

    @staticmethod
    def bslots_argv() -> list[str]:
        return ["bslots", "-l"]

    @staticmethod
    def bjobs_argv(queue: str) -> list[str]:
        return ["bjobs", "-u", "all", "-q", queue, "-o", BJOBS_FIELDS, "-json"]

    @staticmethod
    def plan_argv(path: str) -> list[str]:
        return ["cat", path]

    @staticmethod
    def envdir_argv() -> list[str]:
        return ["printenv", "LSF_ENVDIR"]

    @staticmethod
    def lsid_argv() -> list[str]:
        return ["lsid"]

    @staticmethod
    def gpus_argv() -> list[str]:
        return ["lsload", "-gpu", "-w"]

    @property
    def plan_path(self) -> str | None:
        """The plan file in use (None: not located yet, or not read)."""
        return self._plan_path

    def _keep(self, host: str) -> bool:
        return self.host_pattern is None or bool(self.host_pattern.fullmatch(host))

    # ------------------------------------------------------------------ nodes

    def requirements(self, env: Callable[[str], str | None]) -> tuple[list[str], list[str]]:
        needed = ["bhosts", "bslots", *(["bjobs"] if self.bf_queues else [])]
        return needed + (["lsload"] if self.read_gpus else []), []

    def read_nodes(self, runner: CommandRunner, now_s: float) -> NodeStates:
        argv = self.bhosts_argv()
        out = runner.run(argv).stdout
        try:
            rows = parse_bhosts(out, self._known_hosts)
        except OutputParseError as exc:
            raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
        if self.bf_queues:
            own_slots, own_ids = self.read_own_jobs(runner)
            released = [release_own(r, own_slots.get(r.name, 0)) for r in rows]
            held = [r.name for r, new in zip(rows, released, strict=True) if new is not r]
            if held:
                log.debug("lsf: %d host(s) held only by bftrainer's jobs count as idle", len(held))
            rows, self._own_job_ids = released, own_ids
        self._listed_hosts = frozenset(r.name for r in rows)
        rows = [r for r in rows if self._keep(r.name)]
        if not rows:
            raise CommandOutputError(argv, runner.where, "no host matches the host pattern")
        self._known_hosts.update(r.name for r in rows)
        states = NodeStates(
            time_s=now_s,
            nodes=frozenset(r.name for r in rows),
            idle=frozenset(r.name for r in rows if r.kind == "idle"),
            set_aside=frozenset(r.name for r in rows if r.kind == "set_aside"),
        )
        if not self.read_gpus:
            return states
        argv = self.gpus_argv()
        try:
            gpus, errors = parse_lsload_gpus(runner.run(argv).stdout)
        except OutputParseError as exc:
            raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
        return replace(
            states,
            gpus={h: gpus.get(h, 0) for h in states.nodes if h not in errors},  # unlisted: none
            gpu_errors={h: why for h, why in errors.items() if h in states.nodes},
        )

    def read_own_jobs(self, runner: CommandRunner) -> tuple[dict[str, int], frozenset[str]]:
        """Slots per host held by jobs of ``bf_queues``, and all their job ids (pending
        ones too). A queue with no job (``No unfinished job found``) gives nothing."""
        slots: dict[str, int] = {}
        ids: set[str] = set()
        for queue in self.bf_queues:
            argv = self.bjobs_argv(queue)
            result = runner.run(argv, check=False)
            if result.returncode != 0:
                if _NO_JOBS.search(result.stderr) or _NO_JOBS.search(result.stdout):
                    continue
                raise CommandFailedError(result, runner.where)
            if not result.stdout.lstrip().startswith("{") and _NO_JOBS.search(result.stdout):
                continue
            try:
                jobs = parse_bjobs_json(result.stdout)
            except OutputParseError as exc:
                raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
            for job in jobs:
                if job.queue != queue:
                    continue
                ids.add(job_base_id(job.job_id))
                if job.stat in _HOLDING_STATES:
                    for host, n in job.slots:
                        slots[host] = slots.get(host, 0) + n
        return slots, frozenset(ids)

    # ------------------------------------------------------------------ claims

    def read_claims(self, runner: CommandRunner, now_s: float) -> Claims:
        argv = self.bslots_argv()
        out = runner.run(argv).stdout
        try:
            blocks = parse_bslots(out)
        except OutputParseError as exc:
            raise CommandOutputError(argv, runner.where, f"unparseable output: {exc}") from None
        windows = host_windows_s(blocks)
        self._known_hosts.update(h for h in windows if not h.endswith("*"))
        backfill = {h: now_s + w for h, w in windows.items() if w is not None and self._keep(h)}
        planned = self.read_plan_claims(runner, now_s)
        claims = merge_claims(backfill, planned)
        log.debug(
            "lsf: %d backfill block(s), %d host(s) with a window, %d planned host(s)",
            len(blocks),
            len(backfill),
            len(planned),
        )
        return Claims(now_s, claims)

    def read_plan_claims(self, runner: CommandRunner, now_s: float) -> dict[str, float]:
        """Host -> planned start from the allocation plan; empty when planning is off."""
        path = self._locate_plan(runner)
        if path is None:
            return {}
        text = self._read_plan_text(runner, path, now_s)
        if text is None:
            return {}
        try:
            jobs = parse_plan(text)
        except OutputParseError as exc:
            raise CommandOutputError(
                self.plan_argv(path), runner.where, f"unparseable allocation plan: {exc}"
            ) from None
        claims, overdue = plan_claims(
            jobs, now_s, overdue_s=self.plan_overdue_s, skip_ids=self._own_job_ids
        )
        self._note_overdue(overdue, path, now_s)
        claims = {h: t for h, t in claims.items() if self._keep(h)}
        self._note_unknown(claims, path)
        return claims

    def _note_overdue(self, overdue: list[PlannedJob], path: str, now_s: float) -> None:
        ids = frozenset(j.job_id for j in overdue)
        if ids and ids != self._overdue_ids:
            late = max(now_s - j.start_s for j in overdue)
            log.info(
                "lsf: ignoring %d plan entr%s of %s whose start passed up to %.0f s ago "
                "(more than %.0f s; stale plan?): %s",
                len(ids),
                "y" if len(ids) == 1 else "ies",
                path,
                late,
                self.plan_overdue_s,
                ", ".join(sorted(ids)[:5]),
            )
        self._overdue_ids = ids

    def _note_unknown(self, claims: Mapping[str, float], path: str) -> None:
        if not self._listed_hosts:
            return  # bhosts not read yet: nothing to compare with
        unknown = frozenset(claims) - self._listed_hosts
        if unknown and unknown != self._unknown_hosts:
            log.warning(
                "lsf: the allocation plan %s names %d host(s) that bhosts does not list "
                "(%s): their claims cannot matter",
                path,
                len(unknown),
                ", ".join(sorted(unknown)[:5]),
            )
        self._unknown_hosts = unknown

    def _locate_plan(self, runner: CommandRunner) -> str | None:
        """The plan path; with ``auto`` found once from ``LSF_ENVDIR`` and ``lsid``.

        An unset ``LSF_ENVDIR`` or a missing ``lsid`` turns plan reading off (logged
        once); a failing ``lsid`` (LIM down) raises, and the next poll tries again.
        """
        if self._plan_located:
            return self._plan_path
        envdir = _run_if_present(runner, self.envdir_argv())
        reason = None
        if envdir is None:
            reason = "printenv is missing"
        elif envdir.returncode != 0 or not envdir.stdout.strip():
            reason = f"LSF_ENVDIR is not set where the commands run ({runner.where})"
        if reason is None:
            lsid = _run_if_present(runner, self.lsid_argv())
            if lsid is None:
                reason = f"lsid is missing where the commands run ({runner.where})"
            elif lsid.returncode != 0:
                raise CommandFailedError(lsid, runner.where)
            else:
                try:
                    cluster = parse_lsid_cluster(lsid.stdout)
                except OutputParseError as exc:
                    raise CommandOutputError(
                        self.lsid_argv(), runner.where, f"unparseable output: {exc}"
                    ) from None
                assert envdir is not None
                base = envdir.stdout.strip().splitlines()[0].rstrip("/")
                self._plan_path = posixpath.join(
                    base, "..", "work", cluster, "logdir", PLAN_FILE_NAME
                )
                log.info("lsf: reading the allocation plan from %s", self._plan_path)
        if reason is not None:
            log.warning(
                "lsf: cannot locate the allocation plan (%s): claims come from bslots only; "
                "give its path with --lsf-plan-file, or 'none'",
                reason,
            )
        self._plan_located = True
        return self._plan_path

    def _read_plan_text(self, runner: CommandRunner, path: str, now_s: float) -> str | None:
        """The plan file's text, or None when it does not exist (planning off)."""
        if self._plan_absent_s is not None and now_s - self._plan_absent_s < self.plan_recheck_s:
            return None
        result = runner.run(self.plan_argv(path), check=False)
        if result.returncode != 0:
            if "No such file or directory" not in result.stderr:
                raise CommandFailedError(result, runner.where)
            if self._plan_absent_s is None:
                log.warning(
                    "lsf: no allocation plan at %s: plan-based scheduling is off "
                    "(ALLOCATION_PLANNER in lsb.params), so claims come from bslots only; "
                    "looking again every %.0f s",
                    path,
                    self.plan_recheck_s,
                )
            self._plan_absent_s = now_s
            return None
        if self._plan_absent_s is not None:
            log.info("lsf: allocation plan found at %s", path)
            self._plan_absent_s = None
        return result.stdout


def _run_if_present(runner: CommandRunner, argv: list[str]) -> CommandResult | None:
    """The command's result (any exit code), or None when its program does not exist
    (locally, or exit 127 from the login shell over SSH)."""
    try:
        result = runner.run(argv, check=False)
    except ProgramNotFoundError:
        return None
    return None if result.returncode == 127 else result
