"""Record a live pool into canonical trace files that ``bftrainer replay`` reads.

Each poll's record (every node; ``idle`` = in the pool before blip filtering, which the
replay applies) goes to a ``TraceWriter``: appended, flushed and fsync'ed per record, so
nothing already observed is lost. Files rotate by size: the next file starts with a full
snapshot, so each file replays on its own. A restart continues the newest file in the
output folder, without a second snapshot.

Nodes nobody could see are recorded busy, so a replay never counts them: a poll whose
node states cannot be read (an outage) records every node busy from when it began, and
a restart records every node busy just after the file's last row, for the time the
recorder was not running (the gap). An orderly stop (SIGINT, SIGTERM, ``polls``) closes
the file with a repeat row at the last poll, so the quiet stretch after the last change
is part of the trace.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from bftrainer.idle_monitor.source import LivePoolSource, Reading
from bftrainer.idle_monitor.trace import TraceFormatError, TraceWriter, format_time

log = logging.getLogger(__name__)


# An unseen stretch starts this long after the last recorded row (a trace's times are
# strictly increasing per event; a millisecond survives the microsecond time format).
GAP_AFTER_S = 0.001


class RecorderError(RuntimeError):
    """The output folder cannot hold the trace (not a folder, not writable); names it."""


# The longest interval between polls: a wait of ~1e10 s overflows (a traceback), and a
# recorder that polls less than daily records no pool worth replaying.
MAX_INTERVAL_S = 86_400.0


@dataclass(frozen=True)
class RecorderConfig:
    """Polling and rotation settings (defaults in this one place)."""

    interval_s: float = 10.0
    max_bytes: int = 64 * 1024 * 1024
    prefix: str = "pool"

    def __post_init__(self) -> None:
        if not 0 < self.interval_s <= MAX_INTERVAL_S:  # NaN too
            raise ValueError(
                f"interval_s must be > 0 and <= {MAX_INTERVAL_S:g}, got {self.interval_s}"
            )
        if self.max_bytes < 1024:
            raise ValueError(f"max_bytes must be >= 1024, got {self.max_bytes}")
        if not self.prefix or "/" in self.prefix:
            raise ValueError(f"bad file prefix {self.prefix!r}")


class Recorder:
    """Polls a ``LivePoolSource`` and appends each record to the current trace file."""

    def __init__(
        self,
        source: LivePoolSource,
        out_dir: Path,
        config: RecorderConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.out_dir = Path(out_dir)
        self.config = config or RecorderConfig()
        self._clock = clock
        self._writer: TraceWriter | None = None
        self._created: Path | None = None  # the file this recorder started, if any
        self._seen_s = -math.inf  # the last poll: a reading's time, or an outage's start
        self._gap_from_s = -math.inf  # a continued file's unrecorded stretch starts here
        self.records = 0
        self.rows = 0

    # ------------------------------------------------------------------ files

    def files(self) -> list[Path]:
        """This recorder's trace files in the folder, oldest first."""
        found = self.out_dir.glob(f"{self.config.prefix}-*.csv")
        return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))

    def _new_path(self, time_s: float) -> Path:
        stamp = datetime.fromtimestamp(time_s, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
        path = self.out_dir / f"{self.config.prefix}-{stamp}.csv"
        k = 1
        while path.exists():
            path = self.out_dir / f"{self.config.prefix}-{stamp}-{k}.csv"
            k += 1
        return path

    def open(self) -> Path:
        """Continue the newest trace file in the folder, or start one."""
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RecorderError(f"cannot create output folder {self.out_dir}: {exc}") from None
        if not self.out_dir.is_dir():
            raise RecorderError(f"output {self.out_dir} is not a folder")
        existing = self.files()
        path = existing[-1] if existing else self._new_path(self._clock())
        self._created = None if existing else path
        try:
            self._writer = TraceWriter(path)
        except (TraceFormatError, OSError) as exc:
            reason = str(exc) if isinstance(exc, TraceFormatError) else f"{path}: {exc}"
            raise RecorderError(
                f"cannot continue the newest trace file: {reason}; move it out of "
                f"{self.out_dir} or record into another folder"
            ) from None
        log.info("recording to %s (%d bytes already)", path, self._writer.size_bytes)
        # Marked at the first poll, so a start that fails (no scheduler) writes nothing.
        self._gap_from_s = self._writer.last_s + GAP_AFTER_S
        return path

    @property
    def path(self) -> Path | None:
        return self._writer.path if self._writer else None

    def close(self) -> None:
        """Close the file, first marking its end at the last poll (a repeat row). A file
        this recorder started and wrote no row to is removed: a start that failed (no
        scheduler) leaves no header-only trace behind to be taken for an empty pool."""
        if self._writer is not None:
            try:
                self._writer.mark_end(self._seen_s)
            finally:
                self._writer.close()
                path, self._writer = self._writer.path, None
                if path == self._created and self.rows == 0:
                    path.unlink(missing_ok=True)

    def _mark_unseen(self, time_s: float, why: str) -> int:
        """Every node busy from ``time_s``: nobody could see them (an outage, a gap)."""
        assert self._writer is not None
        if not any(self._writer.state.values()) or not math.isfinite(time_s):
            return 0
        time_s = max(time_s, self._writer.last_s + GAP_AFTER_S)
        rows = self._writer.write(time_s, dict.fromkeys(self._writer.state, False))
        log.warning(
            "%s: recorded %d idle node(s) as busy from %s: %s",
            self._writer.path.name,
            rows,
            format_time(time_s),
            why,
        )
        return rows

    def _rotate(self, reading: Reading) -> None:
        assert self._writer is not None
        old = self._writer.path
        self._writer.mark_end(self._seen_s)
        self._writer.close()
        self._writer = TraceWriter(self._new_path(reading.time_s))
        # The new file's first write is the full snapshot, so it replays on its own.
        self._write(reading)
        log.info("rotated %s -> %s", old.name, self._writer.path.name)

    # ------------------------------------------------------------------ recording

    def _write(self, reading: Reading) -> int:
        assert self._writer is not None
        idle = {n: n in reading.candidates for n in sorted(reading.nodes)}
        return self._writer.write(reading.time_s, idle, reading.windows_s)

    def record_once(self) -> int:
        """Poll once and append the record; the number of rows written (0: no change or
        no reading)."""
        if self._writer is None:
            self.open()
        assert self._writer is not None
        if math.isfinite(self._gap_from_s):
            self.rows += self._mark_unseen(self._gap_from_s, "the recorder was not running")
            self._gap_from_s = -math.inf
        reading = self.source.read()
        if reading is None:
            # An outage: the node states could not be read, so nobody sees the nodes.
            self._seen_s = max(self.source.last_poll_s, self._writer.last_s + GAP_AFTER_S)
            rows = self._mark_unseen(self._seen_s, "their states could not be read")
            self.rows += rows
            return rows
        self._seen_s = reading.time_s
        try:
            rows = self._write(reading)
        except TraceFormatError as exc:
            # The clock went back (or the file's last time is ahead of us): keep recording
            # in a new file rather than lose records.
            log.warning("%s; continuing in a new file", exc)
            self._rotate(reading)
            rows = 0
        self.records += 1
        self.rows += rows
        if self._writer.size_bytes >= self.config.max_bytes:
            self._rotate(reading)
        return rows

    def run(self, stop: threading.Event, *, polls: int | None = None) -> None:
        """Record every ``interval_s`` until ``stop`` is set (or after ``polls`` polls)."""
        if self._writer is None:
            self.open()
        done = 0
        try:
            while not stop.is_set():
                started = time.monotonic()
                self.record_once()
                done += 1
                if polls is not None and done >= polls:
                    break
                stop.wait(max(0.0, self.config.interval_s - (time.monotonic() - started)))
        finally:
            self.close()
            log.info("recorder stopped after %d poll(s), %d row(s)", done, self.rows)


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT or SIGTERM (main thread only), restoring the old handlers."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("got %s, stopping after the current poll", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
