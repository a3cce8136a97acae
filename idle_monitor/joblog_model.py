"""A scheduler's job log as records: one ``JobRecord`` per job that ran, and the errors.

Every reader (``joblog_formats``) yields the same record whatever the scheduler wrote, so
one builder (``joblog_pool``) turns any of them into a pool trace. A record names its
nodes where the log does (Slurm, LSF, PBS) and only counts them where it does not (SWF,
Cobalt blocks).
"""

from __future__ import annotations

import gzip
import math
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bftrainer.idle_monitor.text_lines import line_not_text
from bftrainer.idle_monitor.trace_reader import node_name_problem
from bftrainer.idle_monitor.trace_time import check_epoch_s, parse_time_s

# Formats, by the name `--format` takes.
FORMATS = ("sacct", "jobcomp", "lsf", "pbs", "swf")
# A job whose run time exceeds this is a unit mistake or a corrupt line, not a job.
MAX_RUN_S = 366 * 86400.0
_GZIP_MAGIC = b"\x1f\x8b"
# A count of more digits than this is no machine's (a million nodes has 7).
_COUNT_DIGITS = 12


class JobLogError(ValueError):
    """A job log that cannot be read; the message names ``file:line`` and the value."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job that held nodes from ``start_s`` to ``end_s``.

    ``nodes`` are the hosts it held where the log names them, else ``None`` and only
    ``node_count`` is known. ``submit_s`` and ``requested_s`` (the wall-time limit) let the
    builder state what the scheduler could have planned; ``None`` where the log lacks them.
    ``where`` is ``file:line``, for messages.
    """

    job_id: str
    start_s: float
    end_s: float
    node_count: int
    nodes: tuple[str, ...] | None
    submit_s: float | None
    requested_s: float | None
    where: str


@dataclass
class Skipped:
    """Records a reader passed over, by reason (they never ran, or held no node)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class JobLog:
    """What a reader found: the records, the machine size its header states (SWF's
    ``MaxNodes``), the format, and what it skipped. ``end_s`` is the log's last instant
    (a job still running at the end holds its nodes until then)."""

    path: Path
    format: str
    records: list[JobRecord]
    header_nodes: int | None = None
    skipped: Skipped = field(default_factory=Skipped)


def open_lines(path: Path, *, ends_lines: bool = True) -> Iterator[tuple[int, str]]:
    """The lines of a text or gzip file, numbered from 1, without their newline.

    A FIFO, device or folder is refused from stat alone, before it is opened; a line cut
    by the end of a gzip stream, bytes that are not text, or a damaged stream raise
    ``JobLogError`` naming the file (and line). A UTF-8 byte-order mark (a file saved by
    a Windows editor) is dropped: it made the first line's first name another name.

    ``ends_lines``: the file's writer ends every line (every scheduler's does), so a last
    line without its newline is a record cut short (``NodeList=n1`` of ``n10``), refused
    before it is read. A file written by hand (a node list, a down list) may lack it.
    """
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise JobLogError(f"{path}: not a regular file (a FIFO, device or folder)")
        with path.open("rb") as raw:
            magic = raw.read(2)
    except OSError as exc:
        raise JobLogError(f"{path}: cannot read: {exc.strerror or exc}") from None
    number = 0
    try:
        if magic == _GZIP_MAGIC:
            stream = gzip.open(path, "rt", encoding="utf-8-sig", newline="")  # noqa: SIM115
        else:
            stream = path.open("rt", encoding="utf-8-sig", newline="")
        with stream as text:
            for number, line in enumerate(text, start=1):
                if ends_lines and not line.endswith(("\n", "\r")) and line.strip():
                    raise JobLogError(
                        f"{path}:{number}: the last line ends without a newline: the log is "
                        "cut short mid-record (or was still being written)"
                    )
                yield number, line.rstrip("\r\n")
    except (OSError, EOFError, zlib.error) as exc:
        raise JobLogError(
            f"{path}:{number + 1}: the file is cut or damaged ({exc}); nothing was written"
        ) from None
    except UnicodeDecodeError:
        where = line_not_text(path, magic == _GZIP_MAGIC) or number + 1
        raise JobLogError(f"{path}:{where}: not text (bytes that are not UTF-8)") from None


def log_number(text: str, where: str, what: str) -> float:
    """A number as a log writes it, finite: ``inf``, ``nan`` or digits past a float's
    range are a damaged field, refused in one line (they would fail later, in a node
    count or a time, as a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise JobLogError(f"{where}: {what} {short_text(text)!r} is not a number") from None
    if not math.isfinite(value):
        raise JobLogError(f"{where}: {what} {short_text(text)!r} is not a finite number")
    return value


def log_count(text: str, where: str, what: str) -> int:
    """A whole count (of nodes, hosts) as a log writes it: ASCII digits, at most
    ``_COUNT_DIGITS`` of them, so no count is larger than any machine by orders of
    magnitude before ``int()`` (which refuses past 4,300 digits) sees it."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise JobLogError(f"{where}: {what} {short_text(text)!r} is not a whole number")
    if len(text) > _COUNT_DIGITS:
        raise JobLogError(f"{where}: {what} of {len(text):,} digits is not a plausible count")
    return int(text)


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a float (a format's sniffing; a field's check)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def node_names(names: Iterable[str], where: str) -> tuple[str, ...]:
    """A record's nodes, each once, in order; one that a trace cannot hold is refused
    naming ``where``: an empty name, the trace reader's own check (``node_name_problem``: a
    control character), and what the trace's CSV, written unquoted, cannot carry (a ``,`` or
    ``"``, a blank at either end)."""
    unique = tuple(dict.fromkeys(names))
    for name in unique:
        problem = node_name_problem(name) if name else "is an empty name"
        if problem is None and ("," in name or '"' in name or name != name.strip()):
            problem = "holds a ',', a '\"' or a blank at an end, which a trace cannot hold"
        if problem is not None:
            raise JobLogError(f"{where}: node {short_text(name)!r} {problem}")
    return unique


def short_text(text: str) -> str:
    """A value for a message: a field of thousands of characters is cut."""
    return text if len(text) <= 40 else f"{text[:20]}...({len(text):,} characters)"


def log_time(text: str, where: str, what: str) -> float:
    """A time as a log writes it (epoch seconds, ISO-8601; naive is UTC), checked plausible."""
    try:
        return parse_time_s(text)
    except ValueError as exc:
        raise JobLogError(f"{where}: {what}: {exc}") from None


def check_span(job_id: str, start_s: float, end_s: float, where: str) -> None:
    """A job must end at or after it starts, and run for less than a year."""
    for value in (start_s, end_s):
        try:
            check_epoch_s(value)
        except ValueError as exc:
            raise JobLogError(f"{where}: job {job_id}: {exc}") from None
    if end_s < start_s:
        raise JobLogError(
            f"{where}: job {job_id} ends ({end_s:.0f}) before it starts ({start_s:.0f})"
        )
    if end_s - start_s > MAX_RUN_S:
        raise JobLogError(
            f"{where}: job {job_id} runs {(end_s - start_s) / 86400:.0f} days; "
            "more than a year is not a plausible job"
        )
