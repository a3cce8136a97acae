"""The Standard Workload Format (SWF) of the Parallel Workloads Archive.

One job per line, 18 whitespace-separated fields; ``;`` lines are the header
(``; MaxNodes: 4360``, ``; UnixStartTime: 0``). The fields read: 1 job number, 2 submit
time, 3 wait time, 4 run time, 5 allocated processors, 8 requested processors, 9
requested time. Times are seconds from the header's ``UnixStartTime``. A value of -1 is
unknown. SWF names no nodes: a record has a node count only.

Processors are nodes unless the header says otherwise: with ``MaxProcs`` a multiple of
``MaxNodes`` greater than it, a job's nodes are its processors divided by
``MaxProcs / MaxNodes``, rounded up (a job cannot hold part of a node).
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
    is_number,
    log_number,
)

_HEADER = re.compile(r"^;\s*([A-Za-z]+)\s*:\s*(\S+)")
_FIELDS = 18


def looks_like(lines: list[str]) -> bool:
    """A ``;`` header line, or a first record of 18 numbers."""
    for line in lines:
        if line.startswith(";"):
            return True
        fields = line.split()
        return len(fields) == _FIELDS and all(is_number(f) for f in fields)
    return False


def parse(log: JobLog, lines: Iterable[tuple[int, str]]) -> None:
    """Append the log's records to ``log.records``; the header to ``log.header_nodes``."""
    header: dict[str, str] = {}
    origin_s = 0.0
    procs_per_node = 1
    in_header = True
    for number, line in lines:
        where = f"{log.path}:{number}"
        if not line.strip():
            continue
        if line.startswith(";"):
            m = _HEADER.match(line)
            if m:
                header[m.group(1).lower()] = m.group(2)
            continue
        if in_header:
            in_header = False
            origin_s, procs_per_node = _apply_header(log, header, where)
        fields = line.split()
        if len(fields) != _FIELDS:
            raise JobLogError(
                f"{where}: {len(fields)} fields where SWF has {_FIELDS} (a cut or foreign line)"
            )
        values = [log_number(f, where, f"field {i}") for i, f in enumerate(fields, start=1)]
        job_id = fields[0]
        submit, wait, run, procs, requested_procs, requested = (
            values[1],
            values[2],
            values[3],
            values[4],
            values[7],
            values[8],
        )
        if run < 0 or submit < 0 or wait < 0:
            log.skipped.add("no start or run time (-1)")
            continue
        if procs <= 0:
            procs = requested_procs
        if procs <= 0:
            log.skipped.add("no processor count (-1)")
            continue
        if run == 0:
            log.skipped.add("ran 0 s")
            continue
        start_s = origin_s + submit + wait
        end_s = start_s + run
        check_span(job_id, start_s, end_s, where)
        log.records.append(
            JobRecord(
                job_id=job_id,
                start_s=start_s,
                end_s=end_s,
                node_count=math.ceil(procs / procs_per_node),
                nodes=None,
                submit_s=origin_s + submit,
                requested_s=requested if requested > 0 else None,
                where=where,
            )
        )


def _apply_header(log: JobLog, header: dict[str, str], where: str) -> tuple[float, int]:
    """The time origin and processors per node that the header states."""

    def number(key: str) -> float | None:
        if key not in header:
            return None
        return log_number(header[key], where, f"header {key}")

    origin = number("unixstarttime") or 0.0
    max_nodes = number("maxnodes")
    max_procs = number("maxprocs")
    per_node = 1
    if max_nodes is not None and max_nodes >= 1:
        log.header_nodes = int(max_nodes)
        if max_procs is not None and max_procs > max_nodes and max_procs % max_nodes == 0:
            per_node = int(max_procs // max_nodes)
    elif max_procs is not None and max_procs >= 1:
        log.header_nodes = int(max_procs)
    return origin, per_node
