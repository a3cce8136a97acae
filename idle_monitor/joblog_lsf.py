"""LSF's accounting log, ``lsb.acct``: one ``JOB_FINISH`` record per finished job.

Fields are blank-separated, strings double-quoted (a quote inside doubled). Read, by
position: 3 jobId, 7 submitTime, 9 termTime, 10 startTime, 22 numAskedHosts (then that
many asked hosts), numExHosts, then the execution hosts, one per slot, so a host repeats
once per slot it held. termTime is 0 when LSF did not log it; the record's event time
(field 2), when it was written, stands in. The two fields after the hosts, exitStatus and
hostFactor, are numbers: anything else means numExHosts does not count the hosts (a
damaged record, or a quote left open that swallowed the fields after it). lsb.acct's run
limit sits behind fields of varying count and is not read: an LSF log states no windows.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable

from bftrainer.idle_monitor.joblog_model import (
    JobLog,
    JobLogError,
    JobRecord,
    check_span,
    is_number,
    log_number,
    node_names,
    short_text,
)

_EVENT = '"JOB_FINISH"'
# What csv's messages mean in a one-line record.
_CSV_ERRORS = {
    "unexpected end of data": "a quoted string is not closed (a cut record, or a newline in it)",
    "field larger than field limit (131072)": "a field longer than 131,072 characters",
    "' ' expected after '\"'": "text after a closing quote (a quote left open or stray)",
}


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
        try:  # strict: a quote left open, or text after a closing one, is not a record
            fields = next(
                csv.reader([line], delimiter=" ", quotechar='"', doublequote=True, strict=True)
            )
        except csv.Error as exc:  # also a field past csv's limit (128 KiB)
            why = _CSV_ERRORS.get(str(exc), str(exc))
            raise JobLogError(f"{where}: not a readable lsb.acct record: {why}") from None
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
    after = fields[at + 1 + count : at + 3 + count]
    if len(after) < 2 or not all(is_number(f) for f in after):
        shown = " ".join(repr(short_text(f)) for f in after) or "nothing"
        raise JobLogError(
            f"{where}: job {job_id}: its {count} execution hosts are followed by {shown}, "
            "not exitStatus and hostFactor: numExHosts does not count the hosts (a damaged "
            "record or an unclosed quote)"
        )
    hosts = node_names((h for h in fields[at + 1 : at + 1 + count] if h), f"{where}: job {job_id}")
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
