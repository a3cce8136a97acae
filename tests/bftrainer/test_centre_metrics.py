"""The centre allocator's metrics (``daemon --centre --metrics-textfile/--metrics-port``):
the split by user, the agents, and what became of each request on the socket, as a
centre's Prometheus reads them. The real allocator, loop and socket; no Slurm."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.centre import protocol
from bftrainer.centre.allocator import Allocator, CentreSettings
from bftrainer.centre.protocol import SyncRequest
from bftrainer.centre.transport import OUTCOMES, RequestRefused, call
from bftrainer.loop import VirtualClock
from bftrainer.policies.config import Config
from bftrainer.service.metrics import DaemonMetrics
from tests.bftrainer.test_centre_allocator import BOB, NODES, FixedPool, report, sync
from tests.bftrainer.test_daemon_metrics import free_port, parse, scrape, value


def test_the_split_by_user_and_every_request_outcome_reach_the_metrics(tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    textfile = tmp_path / "centre.prom"
    port = free_port()
    metrics = DaemonMetrics.open(textfile, port)
    clock = VirtualClock(1000.0)
    allocator = Allocator(
        sockets,
        FixedPool(NODES),
        Config(fair_by="user", objective="speedup", fairness_p=-1.0, fair_share_speedup=True),
        CentreSettings(),
        {"bftrainer": "test"},
        clock=clock,
        metrics=metrics,
    )
    me = pwd.getpwuid(os.getuid()).pw_name
    path = sockets / "centre.sock"
    allocator.server.start()
    try:
        loop = allocator.start_loop()
        # This process's user (named by the kernel) with two trainers, bob with one.
        mine = SyncRequest((report("t0001"), report("t0002"))).to_dict()
        call(path, protocol.SYNC, mine)
        sync(allocator, BOB, report("t0001"))
        with pytest.raises(RequestRefused, match="may not cancel bob/t0001"):
            call(path, protocol.CANCEL, {"trainer": "bob/t0001"})
        loop.step(until_s=clock.now_s() + 1.0)
        call(path, protocol.SYNC, mine)
        loop.step(until_s=clock.now_s() + 1.0)  # the metrics follow each step
        file = parse(textfile.read_text())
        served = scrape(port)
    finally:
        allocator.server.close()
        metrics.close()
    assert file == served
    # Fair by user: the 8 nodes split 4/4, whatever the count of trainers.
    assert value(file, "bftrainer_user_allocated_nodes", user=me) == 4
    assert value(file, "bftrainer_user_allocated_nodes", user="bob") == 4
    assert value(file, "bftrainer_user_trainers", user=me, state="running") == 2
    assert value(file, "bftrainer_user_trainers", user="bob", state="running") == 1
    assert value(file, "bftrainer_user_trainers", user="bob", state="waiting") == 0
    assert value(file, "bftrainer_pool_nodes") == 8
    assert value(file, "bftrainer_allocated_nodes") == 8
    assert value(file, "bftrainer_agents") == 2
    # Through the socket: 2 syncs answered, the other user's trainer refused; every
    # outcome exported from the start (0 included), so rate() works at once.
    assert value(file, "bftrainer_requests_total", outcome="answered") == 2
    assert value(file, "bftrainer_requests_total", outcome="refused") == 1
    for outcome in set(OUTCOMES) - {"answered", "refused"}:
        assert value(file, "bftrainer_requests_total", outcome=outcome) == 0
    assert value(file, "bftrainer_decision_latency_seconds_count") >= 1
    assert value(file, "bftrainer_pool_reading_age_seconds") == float("inf")  # a test pool


def test_a_malformed_message_is_counted_as_dropped(tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    allocator = Allocator(
        sockets, FixedPool(NODES), Config(), CentreSettings(), {"bftrainer": "test"}
    )
    allocator.server.start()
    try:
        with pytest.raises(RequestRefused):
            call(sockets / "centre.sock", "no-such-kind", {})
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(os.fspath(sockets / "centre.sock"))
            s.sendall(b"\x00\x00\x00\x05nope!")
            assert s.recv(16) == b""  # dropped: the connection is closed
        agents = allocator.reading().agents
        assert agents is not None
        outcomes = agents.requests
    finally:
        allocator.server.close()
    assert outcomes["refused"] == 1 and outcomes["malformed"] == 1


def test_the_allocator_refuses_a_metrics_port_in_use_with_one_line(tmp_path: Path) -> None:
    import socket

    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bftrainer",
                "daemon",
                "--centre",
                "--socket-dir",
                str(sockets),
                "--scheduler",
                "slurm",
                "--bf-partition",
                "bf",
                "--metrics-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"Error: metrics port {port}: cannot listen on 127.0.0.1:{port}: already in use"
    ]
    assert not (sockets / "centre.sock").exists()
