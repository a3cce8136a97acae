"""Slurm parsers and the Slurm pool on outputs recorded from a real Slurm 22.05
(idle_monitor/fixtures/slurm-*), including its real failing outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bftrainer.idle_monitor.runner import CommandTimeoutError, ReplayRunner, recorded
from bftrainer.idle_monitor.slurm import (
    HostlistError,
    SlurmScheduler,
    classify_state,
    expand_hostlist,
    parse_reservations,
    parse_running,
    parse_sinfo,
    parse_sinfo_json,
    parse_squeue_start,
)
from bftrainer.idle_monitor.source import LivePoolSource, OutputParseError, PoolConfig

FIXTURES = Path(__file__).resolve().parents[2] / "idle_monitor" / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def now_of(scenario: str) -> float:
    return float(fixture(f"slurm-{scenario}-now.txt"))


def replay(scenario: str, *, use_json: bool = False) -> ReplayRunner:
    sinfo = f"slurm-{scenario}-sinfo.{'json' if use_json else 'txt'}"
    return ReplayRunner(
        {
            "sinfo": [recorded(fixture(sinfo))],
            "squeue": [recorded(fixture(f"slurm-{scenario}-squeue.txt"))],
            "scontrol": [recorded(fixture(f"slurm-{scenario}-res.txt"))],
        }
    )


# ---------------------------------------------------------------------- hostlists


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[08-10],login1", ["node08", "node09", "node10", "login1"]),
        ("n[1,3-4]", ["n1", "n3", "n4"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a01n01", ["a01n01"]),
        ("(null)", []),
        ("", []),
    ],
)
def test_expand_hostlist(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["node[1-", "node[3-1]", "node[a-b]", "node]1[", "a,,b"])
def test_expand_hostlist_rejects(text: str) -> None:
    with pytest.raises(HostlistError, match="hostlist"):
        expand_hostlist(text)


@given(
    st.text("abcxyz", min_size=1, max_size=4),
    st.lists(st.integers(0, 500), min_size=1, max_size=20, unique=True),
    st.integers(1, 4),
)
def test_expand_hostlist_ranges_round_trip(prefix: str, numbers: list[int], width: int) -> None:
    numbers.sort()
    names = [f"{prefix}{n:0{width}d}" for n in numbers]
    body = ",".join(f"{n:0{width}d}" for n in numbers)
    assert expand_hostlist(f"{prefix}[{body}]") == names


# ---------------------------------------------------------------------- node states


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("idle", "idle"),
        ("planned", "planned"),
        ("idle*", "busy"),
        ("idle~", "busy"),
        ("idle#", "busy"),
        ("allocated", "allocated"),
        ("mixed", "busy"),
        ("drained", "busy"),
        ("reserved", "busy"),
        ("maint", "busy"),
        ("unknown", "busy"),
        ("down*", "busy"),
    ],
)
def test_classify_state(state: str, kind: str) -> None:
    assert classify_state(state) == kind


def test_sinfo_planned_recorded() -> None:
    states = parse_sinfo(fixture("slurm-planned-sinfo.txt"), 0.0)
    assert states.nodes == {f"node{i}" for i in range(1, 9)}  # each listed twice (2 partitions)
    assert states.idle == frozenset()
    assert states.set_aside == {"node4", "node5", "node6", "node7", "node8"}


@pytest.mark.parametrize("scenario", ["planned", "mixed"])
def test_sinfo_text_and_json_agree(scenario: str) -> None:
    text = parse_sinfo(fixture(f"slurm-{scenario}-sinfo.txt"), 0.0)
    js = parse_sinfo_json(fixture(f"slurm-{scenario}-sinfo.json"), 0.0)
    assert text == js


def test_sinfo_mixed_recorded() -> None:
    states = parse_sinfo(fixture("slurm-mixed-sinfo.txt"), 0.0)
    # node4 maint, node5 reserved, node6 drained, node1-3 allocated
    assert states.idle == {"node7", "node8"}
    assert states.set_aside == frozenset()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no node lines"),
        ("node1 idle\n", "expected 'NODE|STATE'"),
        ("<html><body>502 Bad Gateway</body></html>\n", "expected 'NODE|STATE'"),
        ("node1|idle\nnode1|allocated\n", "listed as idle and allocated"),
    ],
)
def test_sinfo_garbage(text: str, problem: str) -> None:
    with pytest.raises(OutputParseError, match=problem):
        parse_sinfo(text, 0.0)


def test_sinfo_json_garbage() -> None:
    with pytest.raises(OutputParseError, match="not JSON"):
        parse_sinfo_json('{"nodes": [', 0.0)
    with pytest.raises(OutputParseError, match="errors"):
        parse_sinfo_json('{"nodes": [], "errors": [{"error": "x"}]}', 0.0)


# ---------------------------------------------------------------------- claims


def test_squeue_planned_job_recorded() -> None:
    (job,) = parse_squeue_start(fixture("slurm-planned-squeue.txt"))
    assert job.job_id == "2" and job.num_nodes == 8
    assert job.planned_nodes == tuple(f"node{i}" for i in range(1, 9))
    assert job.start_s == 1795308594.0


def test_squeue_unplanned_job() -> None:
    (job,) = parse_squeue_start("7|main|8|N/A|(null)|Resources\n")
    assert job.start_s is None and job.planned_nodes == ()


def test_squeue_garbage() -> None:
    with pytest.raises(OutputParseError, match="line 1: expected 6 fields"):
        parse_squeue_start("JOBID PARTITION NAME\n")
    with pytest.raises(OutputParseError, match="bad time"):
        parse_squeue_start("7|main|8|tomorrow|node1|Resources\n")


def test_reservations_recorded() -> None:
    (maint,) = parse_reservations(fixture("slurm-planned-res.txt"))
    assert maint.name == "maint1" and maint.nodes == ("node7", "node8")
    assert maint.start_s == 1795312073.0 and maint.state == "INACTIVE"
    assert "MAINT" in maint.flags
    assert parse_reservations("No reservations in the system\n") == []


# ---------------------------------------------------------------------- the pool


def test_pool_pending_big_job_within_horizon() -> None:
    """A pending 8-node job planned to start in 114 s: its idle planned nodes stay out."""
    now = now_of("planned")
    source = LivePoolSource(
        SlurmScheduler(), replay("planned"), PoolConfig(horizon_s=300), clock=lambda: now
    )
    reading = source.read()
    assert reading is not None and reading.candidates == frozenset()


def test_pool_pending_big_job_beyond_horizon_has_windows() -> None:
    """With a short horizon the planned nodes are in the pool until the job's start."""
    now = now_of("planned")
    start = 1795308594.0
    source = LivePoolSource(
        SlurmScheduler(), replay("planned"), PoolConfig(horizon_s=60), clock=lambda: now
    )
    reading = source.read()
    assert reading is not None
    assert reading.candidates == {"node4", "node5", "node6", "node7", "node8"}
    assert reading.windows_s == dict.fromkeys(reading.candidates, start - now)


@pytest.mark.parametrize("use_json", [False, True])
def test_pool_reservation_window(use_json: bool) -> None:
    """Idle node7/8 under a maintenance reservation in ~1 h: in the pool with that window."""
    now = now_of("mixed")
    source = LivePoolSource(
        SlurmScheduler(use_json=use_json), replay("mixed", use_json=use_json), clock=lambda: now
    )
    reading = source.read()
    assert reading is not None
    assert reading.candidates == {"node7", "node8"}
    assert reading.windows_s["node7"] == pytest.approx(1795312073.0 - now)


def test_commands_use_epoch_times_and_argument_lists() -> None:
    runner = replay("mixed")
    LivePoolSource(SlurmScheduler(partitions=["main"]), runner).read()
    argvs = [argv for argv, _ in runner.calls]
    assert ("sinfo", "-N", "-h", "-o", "%N|%T", "-p", "main") in argvs
    assert all(env == {"SLURM_TIME_FORMAT": "%s"} for _, env in runner.calls)


def test_nodes_held_by_bf_jobs_count_as_idle() -> None:
    running = "bf|node[3-4]\nmain|node[1-2]\nbf|node2\n"
    assert parse_running(running, ["bf"]) == {"node3", "node4"}  # node2 also runs main work
    runner = ReplayRunner(
        {
            "sinfo": [recorded("node1|allocated\nnode2|allocated\nnode3|allocated\nnode4|idle\n")],
            "squeue": [recorded(""), recorded("bf|node3\nmain|node[1-2]\n")],
            "scontrol": [recorded("")],
        }
    )
    source = LivePoolSource(SlurmScheduler(bf_partitions=["bf"]), runner)
    reading = source.read()
    assert reading is not None and reading.candidates == {"node3", "node4"}
    assert ("squeue", "--all", "-t", "R", "-h", "-o", "%P|%N") in [a for a, _ in runner.calls]


def test_bad_partition_name_is_refused() -> None:
    with pytest.raises(ValueError, match="partition"):
        SlurmScheduler(partitions=["main;rm -rf /"])


# ---------------------------------------------------------------------- real failures


def test_controller_down_keeps_last_pool_and_logs_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Recorded: every command exits 1 with 'Unable to contact slurm controller'."""
    now = [now_of("mixed")]
    runner = replay("mixed")
    source = LivePoolSource(SlurmScheduler(), runner, clock=lambda: now[0])
    first = source.poll()
    assert first is not None and first.joined == {"node7", "node8"}
    for program, name in [("sinfo", "sinfo"), ("squeue", "squeue"), ("scontrol", "res")]:
        runner.set_replies(
            program, [recorded(stderr=fixture(f"slurm-down-{name}.stderr"), returncode=1)]
        )
    now[0] += 10
    caplog.clear()
    assert source.poll() is None
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        "node states unavailable" in m and "sinfo -N" in m and "Unable to contact" in m
        for m in lines
    )
    assert all("\n" not in m for m in lines)
    view = source.view()
    assert view.pool == {"node7", "node8"} and view.stale


def test_hung_controller_timeout_keeps_pool() -> None:
    """A hung slurmctld makes sinfo time out (recorded: 'Socket timed out')."""
    now = [now_of("mixed")]
    runner = replay("mixed")
    source = LivePoolSource(SlurmScheduler(), runner, clock=lambda: now[0])
    source.poll()
    runner.set_replies(
        "sinfo", [CommandTimeoutError(SlurmScheduler().sinfo_argv(), "replay", 30.0)]
    )
    now[0] += 40
    assert source.poll() is None
    view = source.view()
    assert view.stale and view.stale_s == 0.0 and view.pool == {"node7", "node8"}
    now[0] += 200
    assert source.view().stale_s == 200 and source.view().growth_held


def test_garbage_output_is_a_parse_failure_naming_the_command(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner = replay("mixed")
    runner.set_replies("sinfo", [recorded("sinfo: error: garbage\x00\x01\n")])
    source = LivePoolSource(SlurmScheduler(), runner)
    assert source.poll() is None
    assert any(
        "unparseable output" in r.getMessage() and "sinfo" in r.getMessage() for r in caplog.records
    )
