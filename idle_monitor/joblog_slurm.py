"""Slurm's job logs: ``sacct --parsable2`` and the job-completion text log.

sacct (docs/traces.md gives the command): a ``|``-separated header naming the columns,
then one line per job. Read: ``JobID``, ``Start``, ``End``, ``NNodes``, ``NodeList``
(required) and ``Submit``, ``Timelimit`` (optional: the scheduler's plan needs them). Job
steps (``123.batch``, ``123.0``) are skipped: the allocation holds the nodes.

The job-completion log (``JobCompType=jobcomp/filetxt``): one ``Key=Value`` line per run of
a job (a requeued job has one per run), with ``JobId``, ``StartTime``, ``EndTime``,
``NodeList``, ``NodeCnt``, ``SubmitTime`` and ``TimeLimit`` (minutes).

Times without an offset are UTC: dump the log with ``TZ=UTC`` (or ``SLURM_TIME_FORMAT=%s``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from bftrainer.common.names import repeated_column
from bftrainer.idle_monitor.joblog_model import (
    JobLog,
    JobLogError,
    JobRecord,
    check_span,
    log_count,
    log_time,
    node_names,
)
from bftrainer.idle_monitor.slurm import HostlistError, expand_hostlist

SACCT_REQUIRED = ("JobID", "Start", "End", "NNodes", "NodeList")
_NOT_A_TIME = {"", "unknown", "none", "n/a"}
# ASCII digits, a bounded count of them (int() refuses past 4,300, float() past 308).
_LIMIT = re.compile(r"^(?:(\d{1,9})-)?(\d{1,12})(?::(\d{1,12}))?(?::(\d{1,12}))?$", re.ASCII)
_KEY = re.compile(r"(?:^|\s)([A-Za-z]+)=")


def looks_like_sacct(lines: list[str]) -> bool:
    return bool(lines) and "|" in lines[0] and "JobID" in lines[0].split("|")


def looks_like_jobcomp(lines: list[str]) -> bool:
    return bool(lines) and lines[0].startswith("JobId=") and "StartTime=" in lines[0]


def parse_limit_s(text: str, unit_s: float) -> float | None:
    """A Slurm time limit in seconds: ``[D-]HH:MM:SS``, ``MM:SS``, or a bare number of
    ``unit_s`` (minutes in the job-completion log); ``None`` when unlimited or unknown."""
    text = text.strip()
    if not text or text.lower() in {"unlimited", "partition_limit", "infinite", "none"}:
        return None
    m = _LIMIT.match(text)
    if not m:
        return None
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if b is None:  # a bare number
        return float(a or 0) * unit_s + (days or 0) * 86400.0
    if c is None:  # MM:SS, or D-HH:MM
        if days is not None:
            return days * 86400.0 + (a or 0) * 3600.0 + b * 60.0
        return (a or 0) * 60.0 + b
    return (days or 0) * 86400.0 + (a or 0) * 3600.0 + b * 60.0 + c


def _nodes(text: str, where: str, job_id: str) -> tuple[str, ...] | None:
    try:
        names = expand_hostlist(text)
    except HostlistError as exc:
        raise JobLogError(f"{where}: job {job_id}: {exc}") from None
    return node_names(names, f"{where}: job {job_id}") or None


def _record(
    log: JobLog,
    where: str,
    job_id: str,
    start: str,
    end: str,
    nodes_text: str,
    count_text: str,
    submit: str,
    limit_s: float | None,
) -> None:
    """One run of a job, or a skip with its reason."""
    if start.strip().lower() in _NOT_A_TIME:
        log.skipped.add("never started")
        return
    start_s = log_time(start, where, f"job {job_id} start")
    if end.strip().lower() in _NOT_A_TIME:
        end_s = math.inf  # still running when the log was dumped: held to the log's end
        check_span(job_id, start_s, start_s, where)
    else:
        end_s = log_time(end, where, f"job {job_id} end")
        check_span(job_id, start_s, end_s, where)
    nodes = _nodes(nodes_text, where, job_id)
    if nodes is None:
        log.skipped.add("held no node")
        return
    if end_s == start_s:
        log.skipped.add("ran 0 s")
        return
    count = len(nodes)
    if count_text.strip() and log_count(count_text, where, f"job {job_id}: node count") != count:
        raise JobLogError(
            f"{where}: job {job_id}: node count {count_text} but node list {nodes_text!r} "
            f"names {count}"
        )
    submit_s = None
    if submit.strip().lower() not in _NOT_A_TIME:
        submit_s = log_time(submit, where, f"job {job_id} submit")
    log.records.append(JobRecord(job_id, start_s, end_s, count, nodes, submit_s, limit_s, where))


def parse_sacct(log: JobLog, lines: Iterable[tuple[int, str]]) -> None:
    columns: list[str] | None = None
    for number, line in lines:
        where = f"{log.path}:{number}"
        if not line.strip():
            continue
        cells = line.split("|")
        if columns is None:
            columns = cells
            missing = [c for c in SACCT_REQUIRED if c not in columns]
            if missing:
                raise JobLogError(
                    f"{where}: sacct header lacks {', '.join(missing)} (dump with "
                    "--format=JobID,Submit,Start,End,NNodes,NodeList,Timelimit; docs/traces.md)"
                )
            twice = repeated_column(columns)
            if twice is not None:
                raise JobLogError(f"{where}: column {twice!r} appears more than once in the header")
            continue
        if len(cells) != len(columns):
            raise JobLogError(
                f"{where}: {len(cells)} fields where the header has {len(columns)} "
                "(a cut line, or a '|' inside a value)"
            )
        row = dict(zip(columns, cells, strict=True))
        job_id = row["JobID"]
        if "." in job_id:
            log.skipped.add("job steps (the allocation holds the nodes)")
            continue
        _record(
            log,
            where,
            job_id,
            row["Start"],
            row["End"],
            row["NodeList"],
            row["NNodes"],
            row.get("Submit", ""),
            parse_limit_s(row.get("Timelimit", ""), 60.0),
        )
    if columns is None:
        raise JobLogError(f"{log.path}: empty sacct log (no header)")


def parse_jobcomp(log: JobLog, lines: Iterable[tuple[int, str]]) -> None:
    for number, line in lines:
        where = f"{log.path}:{number}"
        if not line.strip():
            continue
        fields = _key_values(line)
        missing = [k for k in ("JobId", "StartTime", "EndTime", "NodeList") if k not in fields]
        if missing:
            raise JobLogError(
                f"{where}: a job-completion line without {', '.join(missing)} (a cut line?)"
            )
        _record(
            log,
            where,
            fields["JobId"],
            fields["StartTime"],
            fields["EndTime"],
            fields["NodeList"],
            fields.get("NodeCnt", ""),
            fields.get("SubmitTime", ""),
            parse_limit_s(fields.get("TimeLimit", ""), 60.0),
        )


def _key_values(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of a line; a value runs to the next `` Key=``."""
    marks = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        stop = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out.setdefault(m.group(1), line[m.end() : stop].strip())
    return out
