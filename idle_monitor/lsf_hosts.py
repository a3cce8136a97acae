"""LSF's view of its hosts, parsed: ``bhosts -w`` (host states), ``bslots -l`` (backfill
windows) and ``lsload -gpu -w`` (GPU counts), in the formats that
:mod:`bftrainer.idle_monitor.lsf` describes. A module of its own: pure parsers of one
kind of output each, tested on recorded outputs, apart from the adapter that runs the
commands (``lsf.py``) and from the jobs' side (``lsf_jobs.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from bftrainer.common.names import BadNameError, check_host
from bftrainer.idle_monitor.source import OutputParseError

BHOSTS_COLUMNS = ("HOST_NAME", "STATUS", "JL/U", "MAX", "NJOBS", "RUN", "SSUSP", "USUSP", "RSV")
_UNIT_S = {"day": 86400.0, "hour": 3600.0, "minute": 60.0, "second": 1.0}
# bhosts statuses that a host has only because of the jobs on it.
_JOB_STATUSES = frozenset({"ok", "closed_Full", "closed_Excl"})


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
            check_host(name)  # it reaches ssh's command line (bftrainer.common.names)
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
    """GPUs per host from ``lsload -gpu -w`` (the format: lsf.py's docstring): the counts
    that parse, and for each host whose ``ngpus`` does not, why (the other hosts still
    count)."""
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
