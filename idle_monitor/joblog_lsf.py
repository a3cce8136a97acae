"""LSF's accounting log, ``lsb.acct``: one ``JOB_FINISH`` record per finished job.

Fields are blank-separated, strings double-quoted (a quote inside doubled). Read, by
position: 3 jobId, 7 submitTime, 9 termTime, 10 startTime, 22 numAskedHosts (then that
many asked hosts), numExHosts, then the execution hosts, one per slot, so a host repeats
once per slot it held. termTime is 0 when LSF did not log it; the record's event time
(field 2), when it was written, stands in. lsb.acct's run limit sits behind fields of
varying count and is not read: an LSF log states no windows.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable

from bftrainer.idle_monitor.joblog_model import (
    JobLog,
    JobLogError,
    JobRecord,
    check_span,
    log_number,
)

_EVENT = '"JOB_FINISH"'


def looks_like(lines: list[str]) -> bool:
    return bool(lines) and lines[0].startswith('"JOB_')


def parse(log: JobLog, lines: Iterable[tuple[int, str]]) -> None:
    for number, line in lines:
        where = f"{log.path}:{number}"
        if not line.strip():
            continue
        if not line.startswith('"'):
            raise JobLogError(f"{where}: not an lsb.acct record (no quoted event type)")
        if not line.startswith(_EVENT):
            log.skipped.add("records other than JOB_FINISH")
            continue
        fields = next(csv.reader([line], delimiter=" ", quotechar='"', doublequote=True))
        record = _record(fields, where)
        if isinstance(record, str):
            log.skipped.add(record)
        else:
            log.records.append(record)


def _int(fields: list[str], i: int, where: str, what: str) -> int:
    if i >= len(fields):
        raise JobLogError(f"{where}: the record ends before its {what} (a cut line?)")
    return int(log_number(fields[i], where, what))


def _record(fields: list[str], where: str) -> JobRecord | str:
    """The record, or the reason it holds no node."""
    job_id = fields[3] if len(fields) > 3 else "?"
    event_s = _int(fields, 2, where, "event time")
    submit_s = _int(fields, 7, where, "submitTime")
    term_s = _int(fields, 9, where, "termTime")
    start_s = _int(fields, 10, where, "startTime")
    asked = _int(fields, 22, where, "numAskedHosts")
    if asked < 0:
        raise JobLogError(f"{where}: job {job_id}: numAskedHosts {asked} is negative")
    at = 23 + asked
    count = _int(fields, at, where, "numExHosts")
    if count < 0 or at + 1 + count > len(fields):
        raise JobLogError(f"{where}: job {job_id}: numExHosts {count} runs past the record")
    hosts = tuple(dict.fromkeys(h for h in fields[at + 1 : at + 1 + count] if h))
    if start_s <= 0:
        return "never started"
    if not hosts:
        return "held no node"
    end_s = term_s if term_s > 0 else event_s
    check_span(job_id, float(start_s), float(end_s), where)
    if end_s == start_s:
        return "ran 0 s"
    return JobRecord(
        job_id=job_id,
        start_s=float(start_s),
        end_s=float(end_s),
        node_count=len(hosts),
        nodes=hosts,
        submit_s=float(submit_s) if submit_s > 0 else None,
        requested_s=None,
        where=where,
    )
