"""Hardening, round 4 (issue 42, part A): the centre's syncs and socket, the replay's
progress, learned curves, options and settings, `report` and `allocate` on hostile input.
Each test failed before its fix."""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import time

import pytest

from bftrainer.centre import protocol
from bftrainer.centre.allocator import Allocator, CentreSettings
from bftrainer.centre.protocol import TrainerReport
from bftrainer.centre.transport import Peer, Request, RequestRefused, Server, call
from bftrainer.config import Config
from bftrainer.loop import Polled, VirtualClock

ALICE = Peer(uid=50001, gid=50001, pid=1, user="alice")
BOB = Peer(uid=50002, gid=50002, pid=2, user="bob")
NODES = tuple(f"n{i:02d}" for i in range(8))


class FixedPool:
    def prime(self, now_s: float) -> tuple[str, ...]:
        return NODES

    def poll(self, now_s: float) -> Polled:
        return Polled(())


def report(tid: str = "t0001", nodes: tuple[str, ...] = (), **fields: object) -> dict:
    body = TrainerReport(
        id=tid,
        model="m.py",
        submitted_s=0.0,
        n_min=1,
        n_max=4,
        rescale_up_s=1.0,
        rescale_down_s=1.0,
        work_samples=1e6,
        nodes=nodes,
    ).to_dict()
    return {**body, **fields}


def allocator(tmp_path) -> tuple[Allocator, VirtualClock]:
    clock = VirtualClock(1000.0)
    config = Config(fair_by="user", objective="speedup", fairness_p=-1.0)
    return Allocator(tmp_path, FixedPool(), config, CentreSettings(), {}, clock=clock), clock


def sync(a: Allocator, peer: Peer, *trainers: dict, held: list[str] | None = None) -> dict:
    body: dict = {"trainers": list(trainers)}
    if held is not None:
        body["held"] = held
    return dict(a.handle(peer, Request(protocol.SYNC, body)))


# ---- the centre: a sync checked against allocate's limits --------------------------------


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"rescale_up_s": 1e300}, "rescale_up is 1e+300, expected <= 1e+06"),
        ({"curves": {"throughput": [[1, 5.0], [4, -1.0]]}}, "expected >= 0"),
        ({"curves": {"throughput": [[2, 5.0], [1, 6.0], [4, 7.0]]}}, "counts must increase"),
        ({"curves": {"goodput": [[1, 5.0], [2, 6.0]]}}, "goodput curve ends at 2"),
        ({"curves": {"throughput": [[0, 3.0], [4, 6.0]]}}, "value at 0 nodes must be 0"),
        ({"curves": {"throughput": [[1, 1e13], [4, 1e13]]}}, "expected <= 1e+12"),
    ],
)
def test_a_bad_sync_is_refused_to_its_user_alone_and_others_are_served(
    tmp_path, caplog, fields, why
) -> None:
    a, clock = allocator(tmp_path)
    a.start_loop()
    assert a.loop is not None
    sync(a, BOB, report())
    a.loop.step(until_s=clock.now_s() + 1)
    with pytest.raises(RequestRefused, match=re.escape(why)) as refused:
        sync(a, ALICE, report(**fields))
    assert "\n" not in str(refused.value)
    # Another user submits: the next decision goes on, with bob's trainer alone.
    sync(a, BOB, report(), report("t0002"))
    a.loop.step(until_s=clock.now_s() + 1)
    got = sync(a, BOB, report(), report("t0002"))["assignment"]
    assert sorted(len(v) for v in got.values()) == [4, 4]
    assert not any(t.startswith("alice/") for t in a.loop.trainers)


def test_a_bad_sync_through_the_socket_is_one_line_naming_the_user(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    sockets = tmp_path / "s"
    sockets.mkdir(mode=0o755)
    a, _ = allocator(sockets)
    a.server.start()
    try:
        a.start_loop()
        body = {"trainers": [report(rescale_down_s=1e300)]}
        with pytest.raises(RequestRefused, match="rescale_down is 1e\\+300"):
            call(sockets / "centre.sock", protocol.SYNC, body)
    finally:
        a.server.close()
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert f"uid {os.getuid()}" in line and "rescale_down" in line


def test_at_restore_an_agent_cannot_take_nodes_it_does_not_hold(tmp_path, caplog) -> None:
    a, _ = allocator(tmp_path)
    sync(a, ALICE, report(nodes=NODES[:4]), held=list(NODES[:4]))
    # Bob's agent says its trainer runs on alice's nodes, and syncs first or last.
    sync(a, BOB, report(nodes=NODES[:4]), held=list(NODES[4:]))
    loop = a.start_loop()
    assert loop.trainers["alice/t0001"].nodes == NODES[:4]
    assert loop.trainers["bob/t0001"].nodes == ()
    assert "restore: bob's trainer bob/t0001 reported 4 node(s)" in caplog.text


def test_at_restore_a_node_two_agents_claim_goes_to_neither(tmp_path) -> None:
    a, _ = allocator(tmp_path)
    sync(a, BOB, report(nodes=NODES[:2]), held=list(NODES[:2]))
    sync(a, ALICE, report(nodes=NODES[:4]), held=list(NODES[:4]))
    loop = a.start_loop()
    assert loop.trainers["alice/t0001"].nodes == NODES[2:4]
    assert loop.trainers["bob/t0001"].nodes == ()


# ---- the centre's socket: hostile JSON -----------------------------------------------------


def frame(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"[" * 400_000 + b"]" * 400_000, "nested too deep"),
        (b'{"v": 1, "kind": "x", "body": {"n": ' + b"7" * 5000 + b"}}", "ValueError"),
    ],
    ids=["deep", "5000-digits"],
)
def test_deep_json_and_huge_integers_are_dropped_in_one_line(tmp_path, caplog, data, reason):
    caplog.set_level(logging.INFO, logger="bftrainer.centre.transport")
    sockets = tmp_path / "s"
    sockets.mkdir(mode=0o755)
    server = Server(sockets, lambda peer, request: {"ok": 1}).start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(server.path))
            s.sendall(frame(data))
            s.settimeout(10)
            assert s.recv(1024) == b""
        time.sleep(0.05)
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 1 and reason in lines[0] and "dropped" in lines[0]
        assert "\n" not in lines[0] and len(lines[0]) < 400
        assert call(server.path, "x") == {"ok": 1}
    finally:
        server.close()
