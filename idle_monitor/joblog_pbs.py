"""The PBS Pro and Cobalt accounting log: ``date time;type;job id;key=value ...``.

An ``E`` (end) record carries ``start`` and ``end`` (epoch seconds), the nodes and the
request. The nodes: ``exec_vnode`` (``(n1:ncpus=64)+(n2:ncpus=64)``) or ``exec_host``
(``n1/0*64+n2/0``) where they name hosts; Cobalt names a block or a location, not hosts,
so its job has ``Resource_List.nodect`` nodes and no names. ``Resource_List.walltime``
(``HH:MM:SS``) is the wall-time limit, ``qtime`` the submission. An ``S`` (start) record
with no ``E`` is a job still running when the log ends: it holds its nodes to the end.
Other records (``Q``, ``D``, ``A``, ...) are read past.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from bftrainer.idle_monitor.joblog_model import (
    JobLog,
    JobLogError,
    JobRecord,
    check_span,
    log_number,
    node_names,
)

_LINE = re.compile(r"^(\d\d/\d\d/\d{4} \d\d:\d\d:\d\d);([A-Za-z]);([^;]*);(.*)$")
_VNODE = re.compile(r"\(([^:()+]+)")
_WALLTIME = re.compile(r"^\d{1,12}(?::\d{1,12}){0,2}$", re.ASCII)
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def looks_like(lines: list[str]) -> bool:
    return bool(lines) and bool(_LINE.match(lines[0]))


def parse(log: JobLog, lines: Iterable[tuple[int, str]]) -> None:
    started: dict[str, tuple[dict[str, str], str]] = {}
    for number, line in lines:
        where = f"{log.path}:{number}"
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise JobLogError(
                f"{where}: not an accounting record (expected 'MM/DD/YYYY HH:MM:SS;type;id;...')"
            )
        kind, job_id, rest = m.group(2).upper(), m.group(3), m.group(4)
        if kind not in ("S", "E"):
            continue
        fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        if kind == "S":
            started[job_id] = (fields, where)
            continue
        started.pop(job_id, None)
        _add(log, job_id, fields, where, ended=True)
    for job_id, (fields, where) in started.items():
        _add(log, job_id, fields, where, ended=False)


def _number(fields: dict[str, str], key: str, where: str, job_id: str) -> float | None:
    """A field's positive number; ``None`` when absent, 0 or negative (PBS's unknown)."""
    if key not in fields:
        return None
    value = log_number(fields[key], f"{where}: job {job_id}", key)
    return value if value > 0 else None


def _walltime_s(text: str | None) -> float | None:
    """``[[HH:]MM:]SS`` in seconds; ``None`` when absent, 0 or not of that form (ASCII
    digits, a bounded count of them: ``int()`` refuses past 4,300)."""
    if not text or not _WALLTIME.match(text):
        return None
    parts = text.split(":")
    seconds = 0.0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return seconds or None


def _hosts(fields: dict[str, str], where: str, job_id: str) -> tuple[str, ...] | None:
    """The hosts a PBS record names; ``None`` for Cobalt's blocks (counts only)."""
    vnode = fields.get("exec_vnode", "")
    if vnode.startswith("("):
        names = _VNODE.findall(vnode)
    else:
        host = fields.get("exec_host", "")
        if "/" not in host:
            return None  # Cobalt: a block or location, not hosts
        names = [part.split("/", 1)[0] for part in host.split("+")]
    for name in names:
        if not _HOST.match(name):
            raise JobLogError(f"{where}: job {job_id}: bad host name {name!r} in its node list")
    return node_names(names, f"{where}: job {job_id}") or None


def _add(log: JobLog, job_id: str, fields: dict[str, str], where: str, *, ended: bool) -> None:
    start_s = _number(fields, "start", where, job_id)
    if start_s is None:
        log.skipped.add("never started")
        return
    end_s = _number(fields, "end", where, job_id) if ended else math.inf
    if end_s is None:
        raise JobLogError(f"{where}: job {job_id}: an end record without end=")
    check_span(job_id, start_s, start_s if math.isinf(end_s) else end_s, where)
    if end_s == start_s:
        log.skipped.add("ran 0 s")
        return
    hosts = _hosts(fields, where, job_id)
    count = len(hosts) if hosts else None
    if count is None:
        nodect = _number(fields, "Resource_List.nodect", where, job_id)
        if nodect is None:
            log.skipped.add("held no node")
            return
        if nodect != int(nodect):
            raise JobLogError(
                f"{where}: job {job_id}: Resource_List.nodect {nodect:g} is not a whole number"
            )
        count = int(nodect)
    log.records.append(
        JobRecord(
            job_id=job_id,
            start_s=start_s,
            end_s=end_s,
            node_count=count,
            nodes=hosts,
            submit_s=_number(fields, "qtime", where, job_id),
            requested_s=_walltime_s(fields.get("Resource_List.walltime")),
            where=where,
        )
    )
