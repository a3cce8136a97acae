"""The daemon's Prometheus metrics: opt-in, as a node_exporter textfile and/or on an
HTTP port bound to 127.0.0.1 (docs/deployment.md lists the metrics).

The daemon hands :class:`DaemonMetrics` a :class:`~bftrainer.service.reading.Reading` (plain
numbers it keeps anyway) at every wake-up of its loop, and the latency of each decision;
the centre's allocator (``daemon --centre``) hands it one after each step of its loop.
The figures both have are rendered once; each one's own part after them.
Nothing here reaches into the daemon, and the loop never knows: this module is imported
only when metrics are asked for, so without them they cost nothing.

Names follow the Slurm exporters' convention: the ``bftrainer_`` prefix, base units in
names (``_seconds``), ``_total`` for counters only. Counters count since the daemon
started (a restart resets them, as Prometheus expects of counters). The registry is the
daemon's own, without the client's process collectors: node_exporter exports
``process_*`` itself, and a textfile must not collide with it.
"""

from __future__ import annotations

import errno
import logging
import math
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    start_http_server,
    write_to_textfile,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bftrainer.service.reading import OUTCOMES, AgentsReading, HeldReading, Reading

log = logging.getLogger(__name__)

PREFIX = "bftrainer"
# Decisions take milliseconds (the exact DP, HiGHS at 30 x 800: 11 ms median) up to the
# solver's time limit (time_limit_s, 10 s by default) plus the trainers' rescale calls.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Every kind of failed scheduler operation, always exported (0 included) so that
# rate() works from the first scrape: the pool's node states and claims, the holders'
# status call, submissions and cancels, and a pool read that failed otherwise.
COMMAND_ERROR_KINDS = ("nodes", "claims", "holder_status", "holder_submit", "holder_cancel", "pool")
HOST = "127.0.0.1"


class MetricsError(Exception):
    """The metrics cannot be exposed as asked (a port in use, a folder that does not
    exist); one line naming the setting and the value."""


class _ReadingCollector(Collector):
    """Gauges and counters from the daemon's last reading, read at each scrape (from
    the HTTP server's thread: the reading is immutable and swapped whole)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.reading: Reading | None = None
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        r = self.reading
        if r is None:
            return
        yield _gauge(
            "pool_nodes", "Idle nodes the main scheduler leaves (held ones included).", r.pool_nodes
        )
        yield _gauge(
            "allocated_nodes",
            "Nodes given to trainers (held nodes; at a centre, every user's).",
            r.allocated_nodes,
        )
        if r.held is not None:
            yield from _held(r.held)
        if r.agents is not None:
            yield from _agents(r.agents)
        yield _command_errors(r.command_errors)
        yield self._pool_age(r.pool_read_s)

    def _pool_age(self, read_s: float | None) -> GaugeMetricFamily:
        age = math.inf if read_s is None else max(0.0, self._clock() - read_s)
        return _gauge(
            "pool_reading_age_seconds",
            "Seconds since the pool was last read well (+Inf: never read).",
            age,
        )


def _held(r: HeldReading) -> Iterator[Metric]:
    yield _gauge("held_nodes", "Nodes whose holder job runs: what trainers may use.", r.held_nodes)
    trainers = GaugeMetricFamily(
        f"{PREFIX}_trainers",
        "Trainers in each state, as the store records them.",
        labels=["state"],
    )
    for state, n in r.trainers.items():
        trainers.add_metric([state], n)
    yield trainers
    h = r.holders
    yield _counter(
        "holders_acquired", "Holder jobs submitted and accepted by the scheduler.", h.acquired
    )
    yield _counter("holders_preempted", "Holder jobs preempted by a main job.", h.preempted)
    yield _counter(
        "holders_released",
        "Holder jobs bftrainer cancelled (no trainer needed the node, or at exit).",
        h.released,
    )
    yield _counter(
        "holders_lost",
        "Holder jobs that ended otherwise: cancelled outside bftrainer, time limit, lease.",
        h.lost,
    )
    yield _counter(
        "holders_failed",
        "Holder jobs that failed to hold their node (the script or the node failed).",
        h.failed,
    )
    failing = GaugeMetricFamily(
        f"{PREFIX}_holders_failing_nodes",
        "Nodes whose last holder failed, waiting for their next try; cause: the latest "
        "failure's, as bftrainer status shows it.",
        labels=["cause"],
    )
    f = r.holders_failing or {"cause": "", "nodes": ()}
    failing.add_metric([str(f["cause"])], len(f["nodes"]))
    yield failing
    yield _counter("rescales", "Trainers' node-count changes made by decisions.", r.rescales)


def _agents(r: AgentsReading) -> Iterator[Metric]:
    yield _gauge("agents", "Users' agents registered (synced within their lease).", r.agents)
    trainers = GaugeMetricFamily(
        f"{PREFIX}_user_trainers",
        "Each user's unfinished trainers, on nodes (running) or not (waiting).",
        labels=["user", "state"],
    )
    nodes = GaugeMetricFamily(
        f"{PREFIX}_user_allocated_nodes",
        "Nodes given to each user's trainers.",
        labels=["user"],
    )
    for user, u in sorted(r.users.items()):
        trainers.add_metric([user, "running"], u.running)
        trainers.add_metric([user, "waiting"], u.waiting)
        nodes.add_metric([user], u.nodes)
    yield trainers
    yield nodes
    requests = CounterMetricFamily(
        f"{PREFIX}_requests",
        "Requests on the centre's socket, by outcome: answered, refused (with a reason, "
        "e.g. another user's trainer), failed, or dropped (malformed, rate_limited, ...).",
        labels=["outcome"],
    )
    for outcome in (*OUTCOMES, *sorted(set(r.requests) - set(OUTCOMES))):
        requests.add_metric([outcome], r.requests.get(outcome, 0))
    yield requests


def _command_errors(counts: Mapping[str, int]) -> CounterMetricFamily:
    errors = CounterMetricFamily(
        f"{PREFIX}_scheduler_command_errors",
        "Scheduler operations that failed after their retries, by operation.",
        labels=["operation"],
    )
    for kind in (*COMMAND_ERROR_KINDS, *sorted(set(counts) - set(COMMAND_ERROR_KINDS))):
        errors.add_metric([kind], counts.get(kind, 0))
    return errors


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class DaemonMetrics:
    """A service's :class:`~bftrainer.service.reading.MetricsSink` for Prometheus: rewrites the
    textfile (atomically) at each update and/or serves the metrics over HTTP.

    Use :meth:`open`: it checks the settings at start, where a mistake gives one line.
    """

    def __init__(
        self, textfile: Path | None, port: int | None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.textfile = textfile
        self.port = port
        # No *_created series: the histogram's start time is noise on a dashboard (this
        # process is the daemon's; nothing else here exports metrics).
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self._readings = _ReadingCollector(clock)
        self.registry.register(self._readings)
        self.latency = Histogram(
            f"{PREFIX}_decision_latency_seconds",
            "From the inputs seen to the last changed node set handed to the trainers.",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._write_failing = False

    @classmethod
    def open(
        cls,
        textfile: str | Path | None,
        port: int | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> DaemonMetrics:
        """Check that the textfile's folder takes a file and bind the port;
        :class:`MetricsError` with one line if either cannot be used. ``clock``: the
        time the pool's age is counted to."""
        metrics = cls(Path(textfile) if textfile is not None else None, port, clock=clock)
        if metrics.textfile is not None:
            folder = metrics.textfile.parent
            if not folder.is_dir():
                raise MetricsError(
                    f"metrics textfile {metrics.textfile}: the folder {folder} does not exist "
                    "(give node_exporter's --collector.textfile.directory)"
                )
            try:  # a file of another name: nothing half-filled is left if the start fails
                with tempfile.NamedTemporaryFile(dir=folder, prefix=".bftrainer-check-"):
                    pass
            except OSError as exc:
                raise MetricsError(
                    f"metrics textfile {metrics.textfile}: cannot write it: {exc.strerror or exc}"
                ) from None
        if port is not None:
            try:
                metrics._server, metrics._thread = start_http_server(
                    port, addr=HOST, registry=metrics.registry
                )
            except OSError as exc:
                why = (
                    "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
                )
                raise MetricsError(
                    f"metrics port {port}: cannot listen on {HOST}:{port}: {why}"
                ) from None
        return metrics

    @property
    def url(self) -> str | None:
        return None if self.port is None else f"http://{HOST}:{self.port}/metrics"

    @property
    def where(self) -> str:
        """The textfile and/or the URL, for the start's log line."""
        return ", ".join(str(w) for w in (self.textfile, self.url) if w is not None)

    def update(self, reading: Reading, latency_s: float | None) -> None:
        """The daemon's (or allocator's) figures now; rewrite the textfile. A failed
        write is logged once (and when it works again), never raised: the daemon goes on."""
        self._readings.reading = reading
        if latency_s is not None:
            self.latency.observe(latency_s)
        if self.textfile is None:
            return
        try:
            self._write()
        except OSError as exc:
            if not self._write_failing:
                log.warning("metrics textfile %s not written: %s", self.textfile, exc)
            self._write_failing = True
        else:
            if self._write_failing:
                log.info("metrics textfile %s written again", self.textfile)
            self._write_failing = False

    def _write(self) -> None:
        assert self.textfile is not None
        # A temporary file in the same folder, renamed over the old one: node_exporter
        # never reads half a file, and reads only names ending in .prom.
        write_to_textfile(str(self.textfile), self.registry)

    def close(self) -> None:
        """Stop serving (the textfile stays: node_exporter's node_textfile_mtime_seconds
        tells how old it is)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
