"""A scheduler's job log in, a pool trace out: the one call the CLI and the replay use.

``read_job_log`` tells the format by content (sacct, Slurm's job-completion log, LSF's
``lsb.acct``, PBS/Cobalt accounting, SWF) and reads it into records; ``pool_from_log``
places them on the machine and returns the trace (``joblog_pool``). docs/traces.md,
"From your scheduler's log", gives each scheduler's dump command and the rules.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bftrainer.idle_monitor import joblog_lsf, joblog_pbs, joblog_slurm, joblog_swf
from bftrainer.idle_monitor.joblog_model import (
    FORMATS,
    JobLog,
    JobLogError,
    JobRecord,
    log_count,
    log_time,
    node_names,
    open_lines,
)
from bftrainer.idle_monitor.joblog_pool import (
    MAX_MACHINE_NODES,
    Machine,
    PoolFigures,
    PoolFlips,
    build_pool,
)
from bftrainer.idle_monitor.slurm import HostlistError, expand_hostlist
from bftrainer.idle_monitor.trace import check_trace_out
from bftrainer.idle_monitor.trace_model import LOG_COLUMNS, TraceFormatError
from bftrainer.idle_monitor.trace_time import format_time
from bftrainer.idle_monitor.trace_writer import format_window

__all__ = [
    "FORMATS",
    "JobLog",
    "JobLogError",
    "LogPool",
    "detect_format",
    "is_job_log",
    "pool_from_log",
    "read_job_log",
    "write_log_trace",
]

_PARSERS: dict[str, Callable[[JobLog, Iterable[tuple[int, str]]], None]] = {
    "sacct": joblog_slurm.parse_sacct,
    "jobcomp": joblog_slurm.parse_jobcomp,
    "lsf": joblog_lsf.parse,
    "pbs": joblog_pbs.parse,
    "swf": joblog_swf.parse,
}
_DETECTORS: tuple[tuple[str, Callable[[list[str]], bool]], ...] = (
    ("swf", joblog_swf.looks_like),
    ("sacct", joblog_slurm.looks_like_sacct),
    ("jobcomp", joblog_slurm.looks_like_jobcomp),
    ("lsf", joblog_lsf.looks_like),
    ("pbs", joblog_pbs.looks_like),
)
_SNIFF_LINES = 20
# A down list's NODES that starts with a digit or one of these is a count of nodes (a
# number), not a hostlist.
_COUNT_SIGNS = frozenset("+-.")


def _first_lines(path: Path) -> list[str]:
    lines = islice(open_lines(path, ends_lines=False), _SNIFF_LINES)  # a cut is read's to name
    return [line for _, line in lines if line.strip()]


def detect_format(path: Path) -> str | None:
    """The job-log format of ``path`` by its first lines, or ``None``."""
    lines = _first_lines(path)
    for name, looks_like in _DETECTORS:
        if looks_like(lines):
            return name
    return None


def is_job_log(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` reads as a job log (not a pool trace): a trace's header names
    ``time``, ``node`` and ``idle``; Parquet is always a trace."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            if f.read(4) == b"PAR1":
                return False
        first = _first_lines(p)
    except (OSError, JobLogError):
        return False
    if first and {"time", "node", "idle"} <= {c.strip() for c in first[0].split(",")}:
        return False
    return detect_format(p) is not None


def read_job_log(path: str | os.PathLike[str], format: str | None = None) -> JobLog:
    """The records of a job log; ``format`` overrides detection. ``JobLogError`` names
    ``file:line`` for anything that cannot be read."""
    p = Path(path)
    name = format or detect_format(p)
    if name is None:
        raise JobLogError(
            f"{p}: unknown job-log format (not sacct --parsable2, a Slurm job-completion "
            f"log, lsb.acct, PBS/Cobalt accounting or SWF); --format names one of "
            f"{', '.join(FORMATS)}"
        )
    if name not in _PARSERS:
        raise JobLogError(f"--format {name!r} is not one of {', '.join(FORMATS)}")
    log = JobLog(path=p, format=name, records=[])
    _PARSERS[name](log, open_lines(p))
    if not log.records:
        why = ", ".join(f"{n:,} {r}" for r, n in sorted(log.skipped.counts.items()))
        raise JobLogError(
            f"{p}: no usable job in this {name} log" + (f" (skipped: {why})" if why else "")
        )
    return log


@dataclass(frozen=True)
class LogPool:
    """A job log's idle pool (``pool.trace()`` for the replay) and its figures."""

    log: JobLog
    pool: PoolFlips
    figures: PoolFigures

    @property
    def summary_line(self) -> str:
        return self.figures.summary_line(self.log, len(self.pool.machine.names))


def read_node_list(path: Path) -> tuple[str, ...]:
    """The machine's nodes: one hostlist expression (``nid[00001-04392]``) per line, each
    a name a trace can hold (``node_names``). Written by hand: a last line may lack its
    newline."""
    names: list[str] = []
    for number, line in open_lines(path, ends_lines=False):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            names.extend(node_names(expand_hostlist(text), f"{path}:{number}"))
        except HostlistError as exc:
            raise JobLogError(f"{path}:{number}: {exc}") from None
        if len(names) > MAX_MACHINE_NODES:
            raise JobLogError(f"{path}:{number}: more than {MAX_MACHINE_NODES:,} nodes")
    unique = tuple(dict.fromkeys(names))
    if not unique:
        raise JobLogError(f"{path}: the node list names no node")
    return unique


def read_down(path: Path) -> list[JobRecord]:
    """Down or drained intervals: ``START,END,NODES`` per line, NODES a hostlist or a
    count of nodes; ``#`` starts a comment. NODES that a number would start (a digit, a
    sign, a point) is a count, a whole one: ``-3`` or ``1e3`` is no host's name. Written
    by hand: a last line may lack its newline. ``_machine`` checks the names against the
    machine."""
    out: list[JobRecord] = []
    for number, line in open_lines(path, ends_lines=False):
        where = f"{path}:{number}"
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = [p.strip() for p in text.split(",", 2)]
        if len(parts) != 3:
            raise JobLogError(f"{where}: expected START,END,NODES, got {text!r}")
        start_s = log_time(parts[0], where, "down interval start")
        end_s = log_time(parts[1], where, "down interval end")
        if end_s <= start_s:
            raise JobLogError(f"{where}: the down interval ends before it starts")
        nodes: tuple[str, ...] | None = None
        first = parts[2][:1]
        if first.isdigit() or first in _COUNT_SIGNS:
            count = log_count(parts[2], where, "down node count")
        else:
            try:
                nodes = node_names(expand_hostlist(parts[2]), where)
            except HostlistError as exc:
                raise JobLogError(f"{where}: {exc}") from None
            count = len(nodes)
        if count < 1:
            raise JobLogError(f"{where}: a down interval of no node")
        out.append(JobRecord(f"down@{number}", start_s, end_s, count, nodes, None, None, where))
    return out


def _machine(
    log: JobLog, nodes: int | None, node_list: Path | None, down: Sequence[JobRecord]
) -> Machine:
    """The machine: a node list, else ``nodes``, else the log's header, else (named logs
    only) the nodes the log names, at most ``MAX_MACHINE_NODES`` as ``--nodes`` and
    ``--node-list``. A down node must be one of the machine's: the down list marks nodes
    down, it does not add any (a count such as ``-3`` or a node no job names made one)."""
    machine = _log_machine(log, nodes, node_list)
    names = set(machine.names)
    for r in down:
        if r.node_count > len(names):
            raise JobLogError(
                f"{r.where}: {r.node_count:,} down nodes, more than the machine's {len(names):,}"
            )
        outside = next((n for n in r.nodes or () if n not in names), None)
        if outside is None:
            continue
        if node_list is not None:
            why = f"not in the node list {node_list}"
        elif any(rec.nodes for rec in log.records):
            why = (
                "not in the machine: no job in the log ran on it (give --node-list FILE with "
                "every node to mark nodes that no job used)"
            )
        else:
            why = (
                f"not in the machine: this {log.format} log counts nodes and names none "
                "(give a count of nodes)"
            )
        raise JobLogError(f"{r.where}: down node {outside!r} is {why}")
    return machine


def _log_named(log: JobLog) -> list[str]:
    """The nodes the log names, sorted; past ``MAX_MACHINE_NODES`` of them, the record
    that passes the bound is refused."""
    seen: dict[str, None] = {}
    for r in log.records:
        if r.nodes:
            seen.update(dict.fromkeys(r.nodes))
            if len(seen) > MAX_MACHINE_NODES:
                raise JobLogError(
                    f"{r.where}: job {r.job_id}: the log names more than "
                    f"{MAX_MACHINE_NODES:,} nodes by this record (the most a machine can have, "
                    "as for --nodes and --node-list)"
                )
    return sorted(seen)


def _log_machine(log: JobLog, nodes: int | None, node_list: Path | None) -> Machine:
    if node_list is not None:  # a job on a node outside it is refused (build_pool)
        names = read_node_list(node_list)
        if nodes is not None and nodes != len(names):
            raise JobLogError(f"--nodes {nodes} but {node_list} names {len(names):,} nodes")
        return Machine(names)
    named = _log_named(log)
    size = nodes if nodes is not None else log.header_nodes
    if named:
        if size is not None and size < len(named):
            raise JobLogError(
                f"{log.path}: the log names {len(named):,} nodes, more than the machine's "
                f"{size:,} (--nodes or the header)"
            )
        extra = (size or len(named)) - len(named)
        spare = Machine.counted(extra).names if extra else ()
        return Machine((*named, *(f"unused-{n}" for n in spare)))
    if size is None:
        raise JobLogError(
            f"{log.path}: this {log.format} log names no nodes and states no machine size: "
            "give --nodes N or --node-list FILE"
        )
    if not 1 <= size <= MAX_MACHINE_NODES:
        raise JobLogError(f"machine size {size:,} is not within 1..{MAX_MACHINE_NODES:,}")
    return Machine.counted(size)


def pool_from_log(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    nodes: int | None = None,
    node_list: Path | None = None,
    down: Path | None = None,
    strict: bool = False,
) -> LogPool:
    """The idle pool of a job log on its machine (``joblog_pool``'s rules)."""
    log = read_job_log(path, format)
    down_records = read_down(down) if down is not None else []
    machine = _machine(log, nodes, node_list, down_records)
    try:
        pool, figures = build_pool(log, machine, down_records, strict=strict)
    except JobLogError as exc:
        raise JobLogError(
            str(exc) if str(exc).startswith(str(log.path)) else f"{log.path}: {exc}"
        ) from None
    if pool.end_s <= pool.start_s:
        raise JobLogError(f"{log.path}: the log spans no time")
    return LogPool(log, pool, figures)


def write_log_trace(pool: PoolFlips, path: Path) -> int:
    """Write the pool as a trace (``.csv`` or ``.csv.gz``) with ``window_s`` and the
    informative ``idle_s``; to a temporary file renamed over ``path`` when complete, so a
    refused or interrupted conversion never leaves half a trace. Returns the rows.

    Millions of rows for a year of a large machine: each instant's rows are formatted as
    one block of text, and gzip runs at level 1 (the file is about twice as large as at
    level 9, and written several times faster)."""
    check_trace_out(path)
    if path.suffix == ".parquet":
        raise TraceFormatError(f"{path}: a trace from a job log is written as .csv or .csv.gz")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        gz = path.suffix == ".gz"
        opened: Any = (
            gzip.open(tmp, "wt", compresslevel=1, encoding="utf-8")  # noqa: SIM115 - with below
            if gz
            else open(tmp, "w", encoding="utf-8")  # noqa: SIM115 - with below
        )
        with opened as f:
            f.write(",".join(LOG_COLUMNS) + "\n")
            count = 0
            for block, rows in _log_blocks(pool):
                f.write(block)
                count += rows
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _seconds_text(values: NDArray[np.float64]) -> list[str]:
    """Seconds as trace cells: whole seconds as integers, NaN (unknown) as empty."""
    known = ~np.isnan(values)
    if known.all() and (values == np.round(values)).all():
        return list(map(str, values.astype(np.int64).tolist()))
    return [
        "" if not ok else format_window(round(v, 6))
        for v, ok in zip(values.tolist(), known.tolist(), strict=True)
    ]


def _log_blocks(pool: PoolFlips) -> Iterator[tuple[str, int]]:
    """Each flip's rows as one block of text: the snapshot lists every node, later flips
    their changes; a last row restates a node at the log's end."""
    names = pool.machine.names
    idle = np.zeros(len(names), bool)
    last = pool.start_s
    for n, f in enumerate(pool.flips):
        text = format_time(f.time_s)
        window = format_window(f.window_s)
        joined = f.joined.tolist()
        idle_s = _seconds_text(f.idle_s)
        cells = [window if k <= f.window_upto else "" for k in joined]
        lines = [
            f"{text},{names[k]},1,{w},{s}\n" for k, w, s in zip(joined, cells, idle_s, strict=True)
        ]
        if n == 0:  # the snapshot: every node, in machine order (the order --nodes cuts)
            by_node = dict(zip(joined, lines, strict=True))
            lines = [by_node.get(k) or f"{text},{names[k]},0,,\n" for k in range(len(names))]
        else:
            lines += [f"{text},{names[k]},0,,\n" for k in f.left.tolist()]
        idle[f.joined] = True
        idle[f.left] = False
        yield "".join(lines), len(lines)
        last = f.time_s
    if pool.end_s > last:
        yield f"{format_time(pool.end_s)},{names[0]},{int(idle[0])},,\n", 1
