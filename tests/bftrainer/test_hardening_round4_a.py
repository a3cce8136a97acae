"""Hardening, round 4 (issue 42, part A): the centre's syncs and socket, the replay's
progress, learned curves, options and settings, `report` and `allocate` on hostile input.
Each test failed before its fix."""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import struct
import subprocess
import sys
import time

import pytest

from bftrainer.centre import protocol
from bftrainer.centre.allocator import Allocator, CentreSettings
from bftrainer.centre.protocol import TrainerReport
from bftrainer.centre.transport import Peer, Request, RequestRefused, Server, call
from bftrainer.loop import Polled, VirtualClock
from bftrainer.policies.config import Config

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
        submit_s=0.0,
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


# ---- the replay: progress never negative, U_max never above 1 -----------------------------


def churny_trace(length_s: float = 2000.0):
    """Four nodes; every 50 s one leaves or comes back."""
    from bftrainer.idle_monitor.events import PoolEvent
    from bftrainer.idle_monitor.trace import Trace

    nodes = ("a", "b", "c", "d")
    events = []
    for i in range(1, int(length_s // 50)):
        n = nodes[i % 4]
        kind = "left" if (i // 4) % 2 == 0 else "joined"
        events.append(PoolEvent(50.0 * i, **{kind: frozenset({n})}))
    return Trace(nodes, frozenset(nodes), 0.0, length_s, tuple(events))


def costly_job(jid: str, curve=((1.0, 10.0), (4.0, 40.0)), rescale_s: float = 1e6):
    from bftrainer.loop.jobs import JobSpec

    return JobSpec(jid, "m", 0.0, 1, 4, rescale_s, rescale_s, 1e12, curve)


@pytest.mark.parametrize("policy", ["equal", "milp"])
def test_rescales_dearer_than_the_time_on_the_nodes_never_make_progress_negative(policy):
    from bftrainer.replay.run import ReplayConfig, replay

    jobs = [costly_job(f"j{i}") for i in range(3)]
    r = replay(churny_trace(), jobs, ReplayConfig(policy=policy, t_fwd_s=120.0))
    assert r.summary["preemption_cost_samples"] + r.summary["rescale_cost_samples"] > 0
    assert r.summary["samples_processed"] >= 0
    assert r.summary["utilization_efficiency"] >= 0
    assert all(t.progress_samples >= 0 for t in r.trainers)
    assert r.metrics.processed_samples >= r.summary["samples_processed"]


def test_a_curve_that_grows_faster_than_linearly_keeps_u_max_within_one():
    from bftrainer.replay.run import ReplayConfig, replay

    convex = ((1.0, 1.0), (2.0, 4.0), (3.0, 9.0), (4.0, 16.0))
    jobs = [costly_job("j0", curve=convex, rescale_s=0.0)]
    s = replay(churny_trace(), jobs, ReplayConfig(policy="milp")).summary
    assert 0.0 <= s["utilization_limit"] <= 1.0
    assert 0.0 <= s["utilization_efficiency"] <= s["utilization_limit"] + 1e-9


# ---- learned curves: zeros, subnormals, the allocator's limit, short windows ---------------


def still_trace(start_s: float = 1.6e9, length_s: float = 600.0):
    from bftrainer.idle_monitor.trace import Trace

    nodes = ("a", "b", "c", "d")
    return Trace(nodes, frozenset(nodes), start_s, start_s + length_s, ())


@pytest.mark.parametrize(
    "curve, what",
    [
        (((1.0, 0.0), (4.0, 40.0)), "gives 0 samples/s at 1 node(s)"),
        (((1.0, 10.0), (2.0, 0.0), (4.0, 40.0)), "gives 0 samples/s at 2 node(s)"),
        (((1.0, 10.0), (4.0, 0.0)), "gives 0 samples/s at 4 node(s)"),
        (((1.0, 5e-324), (4.0, 2e-323)), "gives 4.94066e-324 samples/s at 1 node(s)"),
    ],
    ids=["zero-at-1", "drops-to-zero", "zero-at-n_max", "subnormal"],
)
def test_a_curve_a_trainer_cannot_measure_is_refused_in_one_line(curve, what) -> None:
    from bftrainer.loop.jobs import JobSpec
    from bftrainer.replay.run import ReplayConfig, ReplayError, replay

    job = JobSpec("j", "m", 1.6e9, 1, 4, 1.0, 1.0, 1e9, curve)
    with pytest.raises(ReplayError, match=re.escape(what)) as refused:
        replay(still_trace(), [job], ReplayConfig(policy="milp", curves="learned"))
    assert "\n" not in str(refused.value) and "job 'j'" in str(refused.value)


@pytest.mark.parametrize("prior", ["optimistic", "profile", "peers"])
def test_a_learned_curve_past_the_allocators_limit_is_capped_there(prior) -> None:
    from bftrainer.loop.jobs import JobSpec
    from bftrainer.replay.run import ReplayConfig, replay

    top = ((1.0, 5e11), (8.0, 1e12))  # within the limit; the learned beliefs are not
    jobs = [JobSpec(f"j{i}", "m", 0.0, 1, 8, 1.0, 1.0, 1e16, top) for i in range(3)]
    config = ReplayConfig(policy="milp", curves="learned", curves_prior=prior)
    s = replay(churny_trace(), jobs, config).summary
    assert s["measurements"] > 0 and s["samples_processed"] > 0


def test_learned_curves_values_never_pass_the_allocators_limit() -> None:
    from bftrainer.milp.problem import CURVE_VALUE_MAX
    from bftrainer.trainers.learned_curve import learned_curve

    curve = learned_curve({1: 9e11}, 1, 1000, unmeasured_sps=1.0, growth=math.inf)
    assert max(v for _, v in curve.points) == CURVE_VALUE_MAX


def test_a_millisecond_observation_window_at_trace_times_does_not_stall() -> None:
    from bftrainer.loop.jobs import JobSpec
    from bftrainer.replay.run import ReplayConfig, replay

    job = JobSpec("j", "m", 1.6e9, 1, 4, 1.0, 1.0, 1e12, ((1.0, 10.0), (4.0, 40.0)))
    config = ReplayConfig(policy="milp", curves="learned", curves_observe_s=0.001)
    s = replay(still_trace(length_s=2.0), [job], config).summary
    assert s["measurements"] >= 1000


# ---- options that mean nothing alone, infinite settings, config limits as the flags' -------


def run_cli(*args: str):
    from click.testing import CliRunner

    from bftrainer.cli import cli

    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize(
    "args, config, what",
    [
        (["--prior", "peers"], None, "--prior means nothing without --curves learned"),
        (["--prior", "peers", "--curves", "known"], None, "--prior means nothing"),
        ([], "[replay]\ncurves_prior = 'peers'\n", "[replay] curves_prior means nothing"),
        ([], "[replay]\ncurves_observe_s = 5\n", "[replay] curves_observe_s means nothing"),
    ],
)
def test_a_learning_option_without_learned_curves_is_refused(tmp_path, args, config, what):
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        args = [*args, "--config", str(tmp_path / "c.toml")]
    r = run_cli("replay", "--synthetic-hours", "1", "--out", str(tmp_path / "o"), *args)
    assert r.exit_code == 2 and what in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "args, config, what",
    [
        (["--pruner", "none"], None, "--pruner means nothing without --search"),
        (["--trials", "5"], None, "--trials means nothing without --search"),
        ([], "[replay]\nsearch_seed = 3\n", "[replay] search_seed means nothing without --search"),
        (["--windows-share", "0.5"], None, "--windows-share means nothing without --windows"),
        (["--windows", "oracle", "--windows-error", "9"], None, "--windows-error means nothing"),
        ([], "[replay]\nwindows_lead_s = 60\n", "[replay] windows_lead_s means nothing"),
        (["--scavenger-size", "4"], None, "--scavenger-size means nothing without --policy"),
        (["--policy", "milp,equal", "--restart-cost", "5"], None, "--restart-cost means nothing"),
        (["--sweep", "tfwd=10,30", "--checkpoint-every", "60"], None, "--checkpoint-every means"),
        ([], "[policy]\nscavenger_size = 4\n", "[policy] scavenger_size means nothing"),
        ([], "[policy]\nfair_weights = { ann = 2 }\n", "[policy] fair_weights means nothing"),
    ],
)  # fmt: skip
def test_a_search_window_or_scavenger_setting_alone_is_refused(tmp_path, args, config, what):
    """Each was accepted and ignored: a replay ran, recorded the setting, and did not use it."""
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        args = [*args, "--config", str(tmp_path / "c.toml")]
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "replay", "--synthetic-hours", "1", "--jobs-count", "3",
         "--no-progress", "--out", str(tmp_path / "o"), *args],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and what in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_the_scavenger_settings_with_a_scavenger_run_are_taken(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "replay", "--synthetic-nodes", "32",
         "--synthetic-hours", "1", "--jobs-count", "3", "--no-progress",
         "--policy", "equal,scavenger", "--scavenger-size", "2", "--restart-cost", "5",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "table, line, what",
    [
        ("policy", "redecide_every_s = inf", "redecide_every_s = inf: expected a finite number"),
        ("policy", "time_limit_s = 0.001", "time_limit_s = 0.001: expected a number >= 0.01"),
        ("policy", "max_trainers = 1000000000000000000", "expected a whole number from 1 to"),
        ("daemon", "slots_per_node = 1025", "slots_per_node = 1025: expected a whole number"),
        ("daemon", "slots_per_node = 1000000000", "from 1 to 1024"),
        ("daemon", "metrics_textfile = '{tmp}/m.prom'", "is a folder, not a file"),
    ],
)
def test_a_daemon_setting_past_its_flags_limit_is_refused_at_start(tmp_path, table, line, what):
    from bftrainer.daemon.config import load_daemon_config
    from bftrainer.policies.config import ConfigError

    (tmp_path / "m.prom").mkdir()
    path = tmp_path / "d.toml"
    path.write_text(f"[{table}]\n{line.format(tmp=tmp_path)}\n")
    with pytest.raises(ConfigError, match=re.escape(what)) as refused:
        load_daemon_config(path, {})
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)


@pytest.mark.parametrize(
    "line, what",
    [
        ("search_trials = 1000000000", "search_trials = 1000000000: expected a whole number"),
        ("search_seed = -1", "search_seed = -1: expected a whole number from 0 to 4294967295"),
        ("search_seed = 'x'", "search_seed = 'x': expected"),
        ("search_seed = 1.5", "search_seed = 1.5: expected"),
        ("search_seed = 99999999999999999", "search_seed = 99999999999999999: expected"),
    ],
)
def test_a_search_setting_past_its_limit_is_one_line(tmp_path, line, what):
    """search_trials was accepted past --trials' 100,000; a search_seed Optuna cannot
    take (negative, text, fractional, over 32 bits) gave a ValueError or TypeError
    traceback once the search began."""
    config = tmp_path / "c.toml"
    config.write_text(f"[replay]\nsearch = 'tpe'\n{line}\n")
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "replay", "--synthetic-hours", "1", "--jobs-count",
         "3", "--no-progress", "--config", str(config), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and what in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("line", ["curves_growth = inf", "curves_observe_s = nan"])
def test_an_infinite_replay_setting_is_refused(tmp_path, line) -> None:
    (tmp_path / "c.toml").write_text(f"[replay]\ncurves = 'learned'\n{line}\n")
    r = run_cli("replay", "--config", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and line.split()[0] in r.output and "expected a number" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_max_parallel_has_the_config_files_limit(tmp_path) -> None:
    r = run_cli("replay", "--max-parallel", "1000000000000000000", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "<= 9.0072e+15" in r.output


# ---- report and traces: the state directory untouched, damaged files one line -------------


@pytest.mark.parametrize("out", ["sd/trainers", "sd", "sd/new/deeper", "."])
def test_a_report_never_writes_into_or_over_the_state_directory(tmp_path, monkeypatch, out):
    from tests.bftrainer.test_frames import build_store

    monkeypatch.chdir(tmp_path)
    build_store(tmp_path / "sd")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "sd").rglob("*"))
    r = run_cli("report", "--state-dir", "sd", "--out", out)
    assert r.exit_code == 2 and f"the state directory {tmp_path / 'sd'}," in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "sd").rglob("*")) == before


@pytest.fixture(scope="module")
def small_replay(tmp_path_factory) -> object:
    out = tmp_path_factory.mktemp("replay") / "r"
    r = run_cli(
        "replay",
        *("--synthetic-hours", "2", "--synthetic-nodes", "32", "--jobs-count", "4"),
        *("--solver", "dp", "--no-progress", "--out", str(out)),
    )
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize(
    "cut, what",
    [
        (lambda d: d[:-7], "ends mid-row"),
        (lambda d: d.rsplit(b",", 1)[0] + b"\n", "misses a value"),
    ],
    ids=["mid-field", "at-a-comma"],
)
def test_a_report_on_an_allocations_file_cut_mid_row_is_refused(tmp_path, small_replay, cut, what):
    import shutil

    run = tmp_path / "r"
    shutil.copytree(small_replay, run)
    path = run / "allocations.csv"
    path.write_bytes(cut(path.read_bytes()))
    r = run_cli("report", str(run), "--out", str(tmp_path / "rep"))
    assert r.exit_code == 2 and "allocations.csv" in r.output and what in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "rep").exists()


def _swap_first_rows(path) -> None:
    """The first data row moved below the second (a sort by another column, a hand edit)."""
    lines = path.read_text().splitlines(keepends=True)
    later = next(i for i in range(2, len(lines)) if lines[i][:20] != lines[1][:20])
    lines.insert(later, lines.pop(1))
    path.write_text("".join(lines))


@pytest.mark.parametrize("name", ["allocations.csv", "events.csv"])
def test_a_report_on_rows_out_of_time_order_is_refused(tmp_path, small_replay, name):
    """They were drawn as they came: a trainer's Gantt bars between the wrong times."""
    import shutil

    run = tmp_path / "r"
    shutil.copytree(small_replay, run)
    _swap_first_rows(run / name)
    r = run_cli("report", str(run), "--out", str(tmp_path / "rep"))
    assert r.exit_code == 2 and name in r.output and "writes its rows in time order" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "rep").exists()


def _set_cell(path, column: str, value: str) -> None:
    """The first data row's ``column`` set to ``value`` (a hand edit, another program)."""
    lines = path.read_text().splitlines(keepends=True)
    i = lines[0].rstrip("\n").split(",").index(column)
    cells = lines[1].rstrip("\n").split(",")
    cells[i] = value
    lines[1] = ",".join(cells) + "\n"
    path.write_text("".join(lines))


def _set_summary(path, key: str, value: float) -> None:
    import json

    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))


@pytest.mark.parametrize(
    "edit, what",
    [
        (lambda r: _set_cell(r / "allocations.csv", "nodes", "-3"), "row 2: nodes is -3"),
        (lambda r: _set_cell(r / "allocations.csv", "nodes", "inf"), "row 2: nodes is inf"),
        (lambda r: _set_cell(r / "events.csv", "running", "-1"), "row 2: running is -1"),
        (lambda r: _set_cell(r / "trainers.csv", "progress_samples", "-5"), "progress_samples"),
        (lambda r: _set_cell(r / "windows.csv", "utilization_efficiency", "-7"), "is -7"),
        (lambda r: _set_cell(r / "windows.csv", "hours", "inf"), "row 2: hours is inf"),
        (lambda r: _set_summary(r / "summary.json", "utilization_efficiency", -1), "is -1"),
    ],
    ids=["nodes", "nodes-inf", "running", "progress", "U", "hours", "summary-U"],
)
def test_a_report_on_a_negative_or_infinite_amount_is_refused(tmp_path, small_replay, edit, what):
    """Each was drawn as it was (a Gantt bar of -3 nodes, a U of -7), exit 0."""
    import shutil

    run = tmp_path / "r"
    shutil.copytree(small_replay, run)
    edit(run)
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "report", str(run), "--out", str(tmp_path / "rep")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and what in r.stderr, r.stderr
    assert "the replay writes it finite and >= 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "rep").exists()


@pytest.mark.parametrize("which", ["Jbnd", "JNPs"])
def test_a_job_set_whose_header_repeats_a_column_is_refused(tmp_path, which) -> None:
    """The job set's (or its profiles') last repeated column won without a word: a job
    of n_max 4 replayed at n_max 2."""
    jobs = "job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\na,10,10,1,4,1e6,2021-02-10 00:00:00\n"
    profiles = "job,nodes,throughput_samples_per_s\na,1,10\na,4,38\n"
    if which == "Jbnd":
        jobs = jobs.replace("Tsub\n", "Tsub,Jmax\n").replace(":00\n", ":00,2\n")
    else:
        profiles = profiles.replace("per_s\n", "per_s,nodes\n").replace("10\n", "10,2\n")
    (tmp_path / "S-Jbnd-1J.csv").write_text(jobs)
    (tmp_path / "S-JNPs-1J.csv").write_text(profiles)
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "replay", "--synthetic-hours", "1", "--jobs",
         str(tmp_path / "S-Jbnd-1J.csv"), "--shift-arrivals", "start", "--no-progress",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    column = "Jmax" if which == "Jbnd" else "nodes"
    assert r.returncode == 2, r.stderr
    assert f"S-{which}-1J.csv:1: column {column!r} appears more than once" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_a_trace_whose_header_repeats_a_column_is_refused(tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time,node,idle,idle\n0,a,1,0\n10,a,0,1\n")
    r = run_cli("replay", str(path), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2
    assert "column 'idle' appears more than once in header" in r.output
    assert len(r.output.strip().splitlines()) == 1


# ---- allocate: p near 0, the time limit at large sizes -------------------------------------


@pytest.mark.parametrize("p", [1e-300, -1e-300, 1e-17, -1e-12])
@pytest.mark.parametrize("solver", ["dp", "highs"])
def test_a_fairness_p_next_to_0_allocates_as_p_0(p, solver) -> None:
    from bftrainer.milp import allocate, problem_from_dict

    def counts(fairness_p: float) -> list[int]:
        data = {
            "pool": [f"n{i}" for i in range(8)],
            "fairness_p": fairness_p,
            "objective": "speedup",
            "trainers": [
                {"id": f"t{i}", "n_min": 1, "n_max": 8, "rescale_up": 0, "rescale_down": 0}
                | {"curve": [[1, 1.0], [8, 6.0]]}
                for i in range(4)
            ],
        }
        result = allocate(problem_from_dict(data), solver=solver)
        assert result.status == "optimal"
        return sorted(len(v) for v in result.nodes.values())

    assert counts(p) == counts(0.0) == [2, 2, 2, 2]


def test_a_count_model_that_cannot_be_built_in_time_is_not_started(caplog) -> None:
    """Building has no clock to look at: the per-count model of 20 trainers of n_max 1e6
    on 1e6 nodes took 18 s against --time-limit 5. Not started, the greedy answer stands
    (a smaller instance and limit here, the same rule)."""
    from bftrainer.milp import Problem, TrainerSpec, allocate

    pool = tuple(f"n{i}" for i in range(100_000))
    curve = ((1.0, 1.0), (1000.0, 500.0), (100_000.0, 2000.0))
    trainers = tuple(TrainerSpec(f"t{i}", 1, 100_000, 10.0, 5.0, curve) for i in range(20))
    caplog.set_level(logging.INFO, logger="bftrainer.milp.allocate")
    result = allocate(Problem(pool, trainers, max_trainers=20), time_limit_s=0.5)
    assert "highs/count not run: building the model would take" in caplog.text
    assert result.status == "time_limit" and sum(result.counts.values()) == len(pool)
