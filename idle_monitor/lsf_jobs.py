"""LSF's view of the jobs, parsed: the allocation planner's plan (the hosts pending jobs
will take, and when), ``lsid`` (the cluster name that locates the plan) and ``bjobs
-json`` (bftrainer's own jobs), in the formats that :mod:`bftrainer.idle_monitor.lsf`
describes. A module of its own: pure parsers, tested on recorded outputs, apart from the
adapter that runs the commands (``lsf.py``); holders (``bftrainer.holders.lsf``) read
``bjobs`` through ``bjobs_records`` too."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bftrainer.common.names import BadNameError, check_host
from bftrainer.idle_monitor.source import OutputParseError, merge_claims

log = logging.getLogger(__name__)

BJOBS_FIELDS = "jobid stat queue exec_host"
# The names of queues and clusters accepted here.
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _is_host(name: str) -> bool:
    try:
        check_host(name)
    except BadNameError:
        return False
    return True


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
            if not QUEUE_NAME.fullmatch(m.group(1)):
                raise OutputParseError(f"bad cluster name {m.group(1)!r}", line_no, line)
            return m.group(1)
    raise OutputParseError("no 'My cluster name is ...' line in lsid output")


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
