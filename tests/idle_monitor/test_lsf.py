"""LSF parsers and the LSF pool on recorded outputs in LSF's documented formats
(idle_monitor/fixtures/lsf-*): wide and truncated host names, backfill windows, the
allocation plan, bftrainer's own jobs, and failures."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bftrainer.cli import cli
from bftrainer.idle_monitor.lsf import (
    LsfScheduler,
    PlannedJob,
    host_windows_s,
    job_base_id,
    parse_bhosts,
    parse_bjobs_json,
    parse_bslots,
    parse_exec_host,
    parse_lsid_cluster,
    parse_plan,
    parse_runtime_s,
    plan_claims,
    release_own,
)
from bftrainer.idle_monitor.runner import (
    CommandResult,
    CommandTimeoutError,
    ReplayRunner,
    SshRunner,
    recorded,
)
from bftrainer.idle_monitor.source import LivePoolSource, OutputParseError, PoolConfig
from tests.conftest import SshServer

FIXTURES = Path(__file__).resolve().parents[2] / "idle_monitor" / "fixtures"
LONG = "gpu-rack12-node0001.summit.example.org"
LONG2 = "gpu-rack12-node0002.summit.example.org"
NOW = 1_700_000_000.0  # the fixtures' plan and bjobs were written for this instant
ENVDIR = "/opt/ibm/spectrumcomputing/lsf/conf"
PLAN_PATH = f"{ENVDIR}/../work/summit/logdir/lsb.allocation.plan.json"
LOGGER = "bftrainer.idle_monitor.lsf"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def replay(
    bhosts: str = "lsf-bhosts-wide.txt", bslots: str = "lsf-bslots-long.txt"
) -> ReplayRunner:
    return ReplayRunner(
        {"bhosts": [recorded(fixture(bhosts))], "bslots": [recorded(fixture(bslots))]}
    )


def lsf_replay(
    *, plan: CommandResult | None = None, bjobs: CommandResult | None = None
) -> ReplayRunner:
    """bhosts -w, bslots -l, LSF_ENVDIR, lsid, the plan (``cat``) and bjobs as recorded."""
    replies: dict[str, list[CommandResult]] = {
        "bhosts": [recorded(fixture("lsf-bhosts-wide.txt"))],
        "bslots": [recorded(fixture("lsf-bslots-long.txt"))],
        "printenv": [recorded(ENVDIR + "\n")],
        "lsid": [recorded(fixture("lsf-lsid.txt"))],
        "cat": [plan or recorded(fixture("lsf-plan.json"))],
        "bjobs": [bjobs or recorded(fixture("lsf-bjobs-killable.json"))],
    }
    return ReplayRunner(replies)


def programs(runner: ReplayRunner) -> list[str]:
    return [argv[0] for argv, _ in runner.calls]


def messages(caplog: pytest.LogCaptureFixture, level: str = "WARNING") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == level]


def test_bhosts_wide() -> None:
    rows = {r.name: r for r in parse_bhosts(fixture("lsf-bhosts-wide.txt"))}
    assert LONG in rows
    kinds = {n: r.kind for n, r in rows.items()}
    assert {n for n, k in kinds.items() if k == "idle"} == {"a01n02", "a01n03", "a01n08", LONG}
    # slots reserved for a pending job, nothing running: set aside
    assert {n for n, k in kinds.items() if k == "set_aside"} == {"a01n04", "a01n05"}
    assert kinds["a01n06"] == kinds["a01n07"] == kinds["a01n09"] == "busy"
    assert rows["batch1"].max_slots is None


def test_bhosts_truncated_names_resolve_against_known_hosts() -> None:
    known = [LONG, "login-rack12-edge"]
    rows = parse_bhosts(fixture("lsf-bhosts-truncated.txt"), known_hosts=known)
    names = [r.name for r in rows]
    assert LONG in names and "login-rack12-edge" in names
    with pytest.raises(OutputParseError, match=r"truncated host name 'login-rack12-ed\*'"):
        parse_bhosts(fixture("lsf-bhosts-truncated.txt"), known_hosts=[LONG])


def test_bhosts_truncated_name_ambiguous() -> None:
    known = [LONG, "gpu-rack12-node0002.summit.example.org", "login-rack12-edge"]
    with pytest.raises(OutputParseError, match=r"matches 2 \(gpu-rack12-node0001"):
        parse_bhosts(fixture("lsf-bhosts-truncated.txt"), known_hosts=known)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty bhosts output"),
        ("HOST_NAME STATUS\n", "expected the header"),
        (fixture("lsf-bhosts-wide.txt").replace("     42      0", "     42      x", 1), "bad"),
        (fixture("lsf-bhosts-wide.txt").splitlines()[0] + "\n", "no host rows"),
    ],
)
def test_bhosts_garbage(text: str, problem: str) -> None:
    with pytest.raises(OutputParseError, match=problem):
        parse_bhosts(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("UNLIMITED", None),
        ("40 minutes", 2400.0),
        ("1 hour 0 minutes", 3600.0),
        ("2 hours 10 minutes", 7800.0),
        ("1 day 2 hours", 93600.0),
    ],
)
def test_runtime(text: str, seconds: float | None) -> None:
    assert parse_runtime_s(text) == seconds


def test_runtime_garbage() -> None:
    with pytest.raises(OutputParseError, match="RUNTIME"):
        parse_runtime_s("soon")


def test_bslots_long_windows() -> None:
    blocks = parse_bslots(fixture("lsf-bslots-long.txt"))
    assert [b.slots for b in blocks] == [84, 126, 148, 232]
    assert blocks[3].hosts[-1] == ("a01n07", 22)  # a wrapped HOSTS line
    windows = host_windows_s(blocks)
    assert windows["a01n02"] is None and windows["a01n03"] is None
    assert windows["a01n08"] == 7800.0
    assert windows["a01n05"] == 1500.0  # all 42 slots only for 25 minutes
    assert windows["a01n04"] == 1500.0


def test_bslots_none_and_short_format() -> None:
    assert parse_bslots(fixture("lsf-bslots-none.txt")) == []
    # the short format (no -l) has no host names: refused, not silently empty
    with pytest.raises(OutputParseError, match="line 1: expected SLOTS:"):
        parse_bslots(fixture("lsf-bslots-short.txt"))


def test_lsf_pool_with_windows() -> None:
    source = LivePoolSource(LsfScheduler(), replay(), PoolConfig(horizon_s=600), clock=lambda: NOW)
    reading = source.read()
    assert reading is not None
    # a01n04/05 are held for a job starting in 25 minutes (beyond the 10-minute horizon)
    assert reading.candidates == {"a01n02", "a01n03", "a01n08", LONG, "a01n04", "a01n05"}
    assert reading.windows_s["a01n02"] is None and reading.windows_s[LONG] is None
    assert reading.windows_s["a01n08"] == 7800.0 and reading.windows_s["a01n04"] == 1500.0
    shorter = LivePoolSource(
        LsfScheduler(), replay(), PoolConfig(horizon_s=1800), clock=lambda: NOW
    )
    r2 = shorter.read()
    assert r2 is not None and r2.candidates == {"a01n02", "a01n03", "a01n08", LONG}


def test_lsf_host_pattern_leaves_out_service_nodes() -> None:
    source = LivePoolSource(LsfScheduler(host_pattern=r"a\d\dn\d\d"), replay(), clock=lambda: NOW)
    reading = source.read()
    assert reading is not None
    assert "batch1" not in reading.nodes and LONG not in reading.nodes
    assert reading.candidates == {"a01n02", "a01n03", "a01n08", "a01n04", "a01n05"}


def test_lsf_truncated_bhosts_resolved_from_bslots_and_earlier_readings() -> None:
    runner = replay()
    scheduler = LsfScheduler()
    source = LivePoolSource(scheduler, runner, clock=lambda: NOW)
    assert source.read() is not None  # learns the full names from bhosts -w
    runner.set_replies("bhosts", [recorded(fixture("lsf-bhosts-truncated.txt"))])
    # login-rack12-ed* was never seen in full: the reading fails, the pool is kept
    assert source.read() is None


def test_lsf_down_times_out_and_keeps_pool(caplog: pytest.LogCaptureFixture) -> None:
    """bhosts prints 'batch system daemon not responding ... still trying' and never ends."""
    runner = replay()
    source = LivePoolSource(LsfScheduler(), runner, clock=lambda: NOW)
    source.poll()
    runner.set_replies("bhosts", [CommandTimeoutError(["bhosts", "-w"], "replay", 30.0)])
    assert source.poll() is None
    assert source.view().stale and source.view().pool
    assert any(
        "bhosts -w" in r.getMessage() and "timed out" in r.getMessage() for r in caplog.records
    )


def test_lsf_lim_not_ready_is_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    runner = replay()
    runner.set_replies(
        "bhosts", [recorded(stderr=fixture("lsf-lim-bhosts.stderr"), returncode=255)]
    )
    source = LivePoolSource(LsfScheduler(), runner, clock=lambda: NOW)
    assert source.poll() is None
    assert any("LIM configuration is not ready" in r.getMessage() for r in caplog.records)
