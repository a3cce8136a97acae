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
    parse_lsload_gpus,
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


# ---------------------------------------------------------------------- the allocation plan


def test_plan_parses_the_documented_shape() -> None:
    jobs = parse_plan(fixture("lsf-plan.json"))
    assert [j.job_id for j in jobs] == ["summit@2001", "summit@2002", "summit@1004", "summit@2003"]
    first = jobs[0]
    assert first.start_s == NOW + 1200 and first.rank == 1
    assert first.hosts == ("batch1", "a01n02", "a01n03")  # Summit: the launch node too
    assert first.base_id == "2001"


def test_plan_from_ibm_documentation_example() -> None:
    """IBM's own example (Plan-based allocation, LSF 10.1), verbatim in shape."""
    text = json.dumps(
        {
            "TIMESTAMP": "Mar 29 15:07:50 2018",
            "CHILD_PID": "18939",
            "NUM_PLANS": "1",
            "PLANS": [
                {
                    "JOB_ID": "montreal@172024",
                    "RANK": "1",
                    "START_TIME": "1522351070",
                    "START_TIME_H": "Mar 29 15:17:50 2018",
                    "FINISH_TIME": "1522351670",
                    "FINISH_TIME_H": "Mar 29 15:27:50 2018",
                    "ALLOC": [{"HOST": "host0", "RSRC": [{"NAME": "slots", "AMOUNT": 23}]}],
                }
            ],
        }
    )
    assert parse_plan(text) == [PlannedJob("montreal@172024", 1522351070.0, ("host0",), 1)]


@pytest.mark.parametrize(
    ("job_id", "base"),
    [("montreal@172024", "172024"), ("172024", "172024"), ("summit@172024[3]", "172024")],
)
def test_job_base_id(job_id: str, base: str) -> None:
    assert job_base_id(job_id) == base


def test_plan_claims_earliest_start_and_own_jobs_left_out() -> None:
    jobs = parse_plan(fixture("lsf-plan.json"))
    claims, overdue = plan_claims(jobs, NOW, overdue_s=600)
    assert overdue == []
    assert claims["a01n02"] == NOW + 1200 and claims["a01n04"] == NOW + 1500
    assert claims["a01n08"] == NOW + 60  # job 1004 wants it in a minute
    assert claims["batch1"] == NOW + 60
    mine, _ = plan_claims(jobs, NOW, overdue_s=600, skip_ids=frozenset({"1004"}))
    assert mine["a01n08"] == NOW + 5400  # bftrainer's own pending job does not count


def test_plan_entries_long_overdue_are_left_out() -> None:
    """20 minutes on, job 2001 (planned at +20 min) is 800 s late: a stale plan; job
    2002 (planned at +25 min) is 500 s late: it still claims its hosts now."""
    jobs = parse_plan(fixture("lsf-plan.json"))
    claims, overdue = plan_claims(jobs, NOW + 2000, overdue_s=600)
    assert {j.job_id for j in overdue} == {"summit@2001", "summit@1004"}
    assert "a01n02" not in claims
    assert claims["a01n04"] == NOW + 1500


def test_plan_with_no_plans() -> None:
    assert parse_plan('{"TIMESTAMP":"Nov 14 17:12:58 2023","NUM_PLANS":"0"}') == []
    assert parse_plan('{"NUM_PLANS":"0","PLANS":[]}') == []


def _plan_with(**changes: object) -> str:
    data = json.loads(fixture("lsf-plan.json"))
    data["PLANS"][1].update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (fixture("lsf-plan-cut.json"), r"line \d+: allocation plan is not JSON \(cut off\?\)"),
        ("", "line 1: allocation plan is not JSON"),
        ("[]", "not a JSON object"),
        ('{"NUM_PLANS":"2"}', "without a PLANS list"),
        (_plan_with(START_TIME="Nov 14 17:38:20 2023"), r"plan 1 \(job summit@2002\): START_TIME"),
        (_plan_with(ALLOC=[{"RSRC": []}]), "ALLOC entry without a host name"),
        (_plan_with(ALLOC=None), "has no ALLOC list"),
        (_plan_with(JOB_ID=""), "plan 1 has no JOB_ID"),
    ],
)
def test_plan_garbage(text: str, problem: str) -> None:
    with pytest.raises(OutputParseError, match=problem):
        parse_plan(text)


def test_lsid_cluster_name() -> None:
    assert parse_lsid_cluster(fixture("lsf-lsid.txt")) == "summit"
    with pytest.raises(OutputParseError, match="My cluster name is"):
        parse_lsid_cluster(fixture("lsf-lsid-down.stderr"))


# ---------------------------------------------------------------------- own jobs (bjobs)


@pytest.mark.parametrize(
    ("text", "slots"),
    [
        ("6*hostA:6*hostB", {"hostA": 6, "hostB": 6}),
        ("hostA:hostA:hostB", {"hostA": 2, "hostB": 1}),
        ("1*batch1:42*a01n01:42*a01n02", {"batch1": 1, "a01n01": 42, "a01n02": 42}),
        (f"42*{LONG}", {LONG: 42}),
        ("4*hostA 4*hostB", {"hostA": 4, "hostB": 4}),
        ("", {}),
        ("-", {}),
    ],
)
def test_exec_host_forms(text: str, slots: dict[str, int]) -> None:
    assert parse_exec_host(text) == slots


def test_exec_host_garbage() -> None:
    with pytest.raises(OutputParseError, match=r"bad EXEC_HOST entry '\*a01n01'"):
        parse_exec_host("*a01n01")


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9.\-]{0,20}", fullmatch=True),
        st.integers(min_value=1, max_value=64),
        max_size=8,
    ),
    st.randoms(use_true_random=False),
)
def test_exec_host_counts_slots_in_either_form(slots: dict[str, int], rnd: random.Random) -> None:
    items: list[str] = []
    for host, n in slots.items():
        items += [f"{n}*{host}"] if rnd.random() < 0.5 else [host] * n
    rnd.shuffle(items)
    assert parse_exec_host(":".join(items)) == slots


def test_bjobs_json() -> None:
    jobs = {j.job_id: j for j in parse_bjobs_json(fixture("lsf-bjobs-killable.json"))}
    assert jobs["1001"].stat == "RUN" and jobs["1001"].queue == "killable"
    assert dict(jobs["1001"].slots) == {"batch1": 1, "a01n01": 42, LONG2: 42}
    assert dict(jobs["1002"].slots) == {"a01n10": 1}
    assert jobs["1004"].stat == "PEND" and jobs["1004"].slots == ()
    assert parse_bjobs_json(fixture("lsf-bjobs-empty.json")) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (fixture("lsf-bjobs-cut.json"), r"bjobs output is not JSON \(cut off\?\)"),
        ('{"COMMAND":"bjobs","JOBS":1}', "without a RECORDS list"),
        ('{"RECORDS":[{"JOBID":"7","ERROR":"Job <7> is not found"}]}', "Job <7> is not found"),
        ('{"RECORDS":[{"JOBID":"7","STAT":"RUN","QUEUE":"q"}]}', "lacks EXEC_HOST"),
        ('{"RECORDS":[{"JOBID":"7","STAT":"RUN","QUEUE":"q","EXEC_HOST":"4*"}]}', "job 7"),
    ],
)
def test_bjobs_garbage(text: str, problem: str) -> None:
    with pytest.raises(OutputParseError, match=problem):
        parse_bjobs_json(text)


def test_release_own_only_when_own_jobs_hold_every_used_slot() -> None:
    rows = {r.name: r for r in parse_bhosts(fixture("lsf-bhosts-wide.txt"))}
    assert release_own(rows["a01n01"], 42).kind == "idle"  # closed_Full by our job alone
    assert release_own(rows["a01n10"], 1).kind == "idle"  # closed_Excl by our job alone
    assert release_own(rows["a01n09"], 2).kind == "busy"  # another job runs there
    assert release_own(rows["batch1"], 1).kind == "busy"  # the shared launch node
    assert release_own(rows["a01n07"], 42).kind == "busy"  # closed_Adm stays closed
    assert release_own(rows["a01n02"], 0) is rows["a01n02"]


# ---------------------------------------------------------------------- the pool


def test_pool_plan_gives_windows_and_excludes_hosts_planned_within_horizon() -> None:
    runner = lsf_replay()
    source = LivePoolSource(LsfScheduler(), runner, PoolConfig(horizon_s=600), clock=lambda: NOW)
    reading = source.read()
    assert reading is not None and not reading.stale_claims
    # a01n08: job 1004 is planned there in 60 s (no --bf-queue: not known as ours)
    assert reading.candidates == {"a01n02", "a01n03", LONG, "a01n04", "a01n05"}
    # bslots says a01n02/03 are free without limit; the plan says a job starts in 20 min
    assert reading.windows_s["a01n02"] == 1200.0 and reading.windows_s["a01n03"] == 1200.0
    assert reading.windows_s["a01n04"] == 1500.0 and reading.windows_s[LONG] is None
    longer = LivePoolSource(
        LsfScheduler(), lsf_replay(), PoolConfig(horizon_s=1300), clock=lambda: NOW
    )
    r2 = longer.read()
    assert r2 is not None and r2.candidates == {LONG, "a01n04", "a01n05"}
    assert ("cat", PLAN_PATH) in [a for a, _ in runner.calls]


def test_plan_located_once_from_lsf_envdir_and_lsid() -> None:
    runner = lsf_replay()
    now = [NOW]
    scheduler = LsfScheduler()
    source = LivePoolSource(scheduler, runner, clock=lambda: now[0])
    for _ in range(3):
        assert source.read() is not None
        now[0] += 10
    assert scheduler.plan_path == PLAN_PATH
    assert programs(runner).count("printenv") == 1 and programs(runner).count("lsid") == 1
    assert programs(runner).count("cat") == 3


def test_own_jobs_hosts_count_as_idle() -> None:
    runner = lsf_replay()
    now = [NOW]
    source = LivePoolSource(
        LsfScheduler(bf_queues=["killable"]),
        runner,
        PoolConfig(horizon_s=600),
        clock=lambda: now[0],
    )
    first = source.read()
    assert first is not None
    own = {"a01n01", LONG2, "a01n10"}
    assert own <= first.candidates
    assert first.windows_s["a01n01"] is None  # no window known: open-ended
    # shared with another job (a01n09) or the launch node: still busy
    assert "a01n09" not in first.candidates and "batch1" not in first.candidates
    # the plan's entry for our own pending job 1004 is dropped once bjobs named it
    assert "a01n08" not in first.candidates
    now[0] += 10
    second = source.read()
    assert second is not None and "a01n08" in second.candidates
    assert second.windows_s["a01n08"] == 5400.0 - 10  # job 2003; bslots says 7800
    assert (
        "bjobs", "-u", "all", "-q", "killable", "-o", "jobid stat queue exec_host", "-json",
    ) in [a for a, _ in runner.calls]  # fmt: skip


@pytest.mark.parametrize(
    "reply",
    [
        recorded(stderr=fixture("lsf-bjobs-none.stderr"), returncode=255),
        recorded(stderr="No unfinished job found in queue <killable>\n", returncode=255),
        recorded(fixture("lsf-bjobs-empty.json")),
    ],
    ids=["no-unfinished-job", "no-job-in-queue", "empty-json"],
)
def test_no_own_jobs_is_not_a_failure(reply: CommandResult) -> None:
    source = LivePoolSource(
        LsfScheduler(bf_queues=["killable"]), lsf_replay(bjobs=reply), clock=lambda: NOW
    )
    reading = source.read()
    assert reading is not None
    assert reading.candidates.isdisjoint({"a01n01", LONG2, "a01n10"})  # busy, as bhosts says
    assert "a01n02" in reading.candidates


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (recorded(stderr=fixture("lsf-bjobs-noqueue.stderr"), returncode=255), "No such queue"),
        (recorded(fixture("lsf-bjobs-cut.json")), "unparseable output"),
    ],
    ids=["no-such-queue", "cut-json"],
)
def test_bad_bjobs_reply_keeps_last_pool_stale(
    caplog: pytest.LogCaptureFixture, reply: CommandResult, problem: str
) -> None:
    runner = lsf_replay()
    now = [NOW]
    source = LivePoolSource(
        LsfScheduler(bf_queues=["killable"]),
        runner,
        PoolConfig(horizon_s=600, filter_blips=False),
        clock=lambda: now[0],
    )
    assert source.poll() is not None
    before = source.view().pool
    assert "a01n01" in before
    runner.set_replies("bjobs", [reply])
    now[0] += 10
    caplog.clear()
    assert source.poll() is None
    view = source.view()
    assert view.stale and view.pool == before
    lines = messages(caplog)
    assert any("bjobs -u all -q killable" in m and problem in m for m in lines), lines


def test_cut_plan_keeps_last_claims_and_marks_them_stale(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The planner rewrites the file while we read it: JSON cut off mid-way."""
    runner = lsf_replay()
    now = [NOW]
    source = LivePoolSource(LsfScheduler(), runner, PoolConfig(horizon_s=600), clock=lambda: now[0])
    assert source.read() is not None
    runner.set_replies("cat", [recorded(fixture("lsf-plan-cut.json"))])
    now[0] += 10
    caplog.clear()
    reading = source.read()
    assert reading is not None and reading.stale_claims and not reading.growth_held
    assert reading.windows_s["a01n02"] == 1190.0  # the last good plan, counted down
    assert any(f"cat {PLAN_PATH}" in m and "not JSON (cut off?)" in m for m in messages(caplog))
    now[0] += 200  # the last good claims are now older than --max-stale
    held = source.read()
    assert held is not None and held.growth_held


def test_plan_file_absent_means_planning_off_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    absent = recorded(stderr=fixture("lsf-plan-absent.stderr"), returncode=1)
    runner = lsf_replay(plan=absent)
    now = [NOW]
    source = LivePoolSource(
        LsfScheduler(plan_recheck_s=300), runner, PoolConfig(horizon_s=600), clock=lambda: now[0]
    )
    for _ in range(3):
        reading = source.read()
        assert reading is not None and not reading.stale_claims  # not a failure
        now[0] += 10
    assert reading.windows_s["a01n02"] is None  # bslots only: UNLIMITED
    assert reading.windows_s["a01n04"] == 1500.0
    assert programs(runner).count("cat") == 1  # looked again only after plan_recheck_s
    off = [m for m in messages(caplog) if "no allocation plan" in m]
    assert len(off) == 1 and PLAN_PATH in off[0] and "bslots only" in off[0]
    # the administrator turns the planner on: found at the next look
    runner.set_replies("cat", [recorded(fixture("lsf-plan.json"))])
    now[0] = NOW + 300
    reading = source.read()
    assert reading is not None and reading.windows_s["a01n02"] == 900.0
    assert any("allocation plan found" in m for m in messages(caplog, "INFO"))


def test_unreadable_plan_is_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    denied = recorded(stderr=fixture("lsf-plan-denied.stderr"), returncode=1)
    source = LivePoolSource(LsfScheduler(), lsf_replay(plan=denied), clock=lambda: NOW)
    reading = source.read()
    assert reading is not None and reading.stale_claims and reading.candidates == set()
    assert any("Permission denied" in m and PLAN_PATH in m for m in messages(caplog))


def test_lsf_envdir_unset_reads_no_plan(caplog: pytest.LogCaptureFixture) -> None:
    runner = lsf_replay()
    runner.set_replies("printenv", [recorded(returncode=1)])
    source = LivePoolSource(LsfScheduler(), runner, clock=lambda: NOW)
    reading = source.read()
    assert reading is not None and not reading.stale_claims
    assert "lsid" not in programs(runner) and "cat" not in programs(runner)
    assert any("LSF_ENVDIR is not set" in m for m in messages(caplog))


def test_lim_down_fails_this_poll_and_locates_the_plan_next_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner = lsf_replay()
    runner.set_replies(
        "lsid",
        [
            recorded(stderr=fixture("lsf-lsid-down.stderr"), returncode=255),
            recorded(fixture("lsf-lsid.txt")),
        ],
    )
    now = [NOW]
    scheduler = LsfScheduler()
    source = LivePoolSource(scheduler, runner, PoolConfig(horizon_s=600), clock=lambda: now[0])
    first = source.read()
    assert first is not None and first.stale_claims
    assert any("LIM is down" in m for m in messages(caplog))
    now[0] += 10
    second = source.read()
    assert second is not None and not second.stale_claims
    assert scheduler.plan_path == PLAN_PATH and second.windows_s["a01n02"] == 1190.0


def test_plan_host_missing_from_bhosts_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    now = [NOW]
    source = LivePoolSource(LsfScheduler(), lsf_replay(), clock=lambda: now[0])
    for _ in range(3):
        assert source.read() is not None
        now[0] += 10
    unknown = [m for m in messages(caplog) if "does not list" in m]
    assert len(unknown) == 1 and "h41n07" in unknown[0]


def test_plan_file_none_and_explicit_path() -> None:
    runner = lsf_replay()
    LivePoolSource(LsfScheduler(plan_file=None), runner, clock=lambda: NOW).read()
    assert {"printenv", "lsid", "cat"}.isdisjoint(programs(runner))
    runner = lsf_replay()
    LivePoolSource(LsfScheduler(plan_file="/site/plan.json"), runner, clock=lambda: NOW).read()
    assert ("cat", "/site/plan.json") in [a for a, _ in runner.calls]
    assert "lsid" not in programs(runner)


def test_host_pattern_applies_to_plan_claims() -> None:
    scheduler = LsfScheduler(host_pattern=r"a\d\dn\d\d")
    claims = scheduler.read_claims(lsf_replay(), NOW).take_back_s
    assert "batch1" not in claims and "h41n07" not in claims
    assert claims["a01n02"] == NOW + 1200


def test_bad_scheduler_options() -> None:
    with pytest.raises(ValueError, match="bad LSF queue name"):
        LsfScheduler(bf_queues=["killable;rm -rf /"])
    with pytest.raises(ValueError, match="not an absolute path"):
        LsfScheduler(plan_file="logdir/lsb.allocation.plan.json")


# ---------------------------------------------------------------------- over SSH, real cat


def shifted_plan(path: Path, now_s: float) -> Path:
    """The recorded plan moved to ``now_s`` (its times are relative to NOW)."""
    data = json.loads(fixture("lsf-plan.json"))
    for plan in data["PLANS"]:
        for key in ("START_TIME", "FINISH_TIME"):
            plan[key] = str(int(plan[key]) + int(now_s - NOW))
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.mark.sshd
def test_plan_read_over_ssh(sshd: SshServer, tmp_path: Path) -> None:
    now_s = time.time()
    plan = shifted_plan(tmp_path / "lsb.allocation.plan.json", now_s)
    with SshRunner(sshd.target, key_path=sshd.key, known_hosts=sshd.known_hosts) as runner:
        claims = LsfScheduler(plan_file=str(plan)).read_plan_claims(runner, now_s)
        assert claims["a01n02"] == pytest.approx(now_s + 1200, abs=1)
        missing = LsfScheduler(plan_file=str(tmp_path / "absent.json"))
        assert missing.read_plan_claims(runner, now_s) == {}  # cat's real 'No such file'


# ---------------------------------------------------------------------- the command line


@pytest.fixture
def fake_lsf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``bhosts``/``bslots``/``bjobs`` programs on PATH that print the recorded outputs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program, name in [
        ("bhosts", "lsf-bhosts-wide.txt"),
        ("bslots", "lsf-bslots-long.txt"),
        ("bjobs", "lsf-bjobs-killable.json"),
    ]:
        script = bin_dir / program
        script.write_text(f"#!/bin/sh\nexec cat {FIXTURES / name}\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("LSF_ENVDIR", raising=False)
    return tmp_path


def test_pool_command_with_plan_and_own_queue(fake_lsf: Path) -> None:
    plan = shifted_plan(fake_lsf / "plan.json", time.time())
    result = CliRunner().invoke(
        cli,
        [
            "pool", "--scheduler", "lsf", "--bf-queue", "killable", "--lsf-plan-file",
            str(plan), "--horizon", "600", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    nodes = json.loads(result.output[result.output.index("{") :])["nodes"]
    assert {"a01n01", LONG2, "a01n10", "a01n02"} <= set(nodes)
    assert 1100 < nodes["a01n02"]["window_s"] <= 1200
    assert nodes["a01n01"]["window_s"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheduler", "slurm", "--bf-queue", "killable"], "are for --scheduler lsf"),
        (["--scheduler", "slurm", "--lsf-plan-file", "none"], "are for --scheduler lsf"),
        (["--scheduler", "lsf", "--lsf-plan-file", "plan.json"], "expected an absolute path"),
        (["--scheduler", "lsf", "--bf-queue", "a b"], "--bf-queue: bad LSF queue name 'a b'"),
    ],
)
def test_pool_command_bad_lsf_options(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["pool", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_trace_record_has_the_lsf_options() -> None:
    result = CliRunner().invoke(cli, ["trace", "record", "--help"])
    assert result.exit_code == 0
    assert "--lsf-plan-file" in result.output and "--bf-queue" in result.output


# ---------------------------------------------------------------------- GPUs (ngpus)


def test_gpus_are_each_hosts_ngpus_unlisted_hosts_have_none() -> None:
    """``--slots-per-node gres`` on LSF: ``lsload -gpu -w`` after ``bhosts -w``."""
    runner = ReplayRunner(
        {
            "bhosts": [recorded(fixture("lsf-bhosts-wide.txt"))],
            "lsload": [recorded(fixture("lsf-lsload-gpu.txt"))],
        }
    )
    states = LsfScheduler(plan_file=None, read_gpus=True).read_nodes(runner, NOW)
    assert [list(argv) for argv, _ in runner.calls] == [["bhosts", "-w"], ["lsload", "-gpu", "-w"]]
    assert states.gpus == {
        **{f"a01n{i:02d}": 6 for i in (1, 2, 3, 4, 5, 7, 8, 9, 10)},
        LONG: 4,
        LONG2: 4,
        "batch1": 0,  # not listed: no GPU
        "login1": 0,
    }
    assert states.gpu_errors == {"a01n06": "ngpus '-' is not a number (status unavail)"}


def test_without_gres_no_gpu_command_runs() -> None:
    runner = ReplayRunner({"bhosts": [recorded(fixture("lsf-bhosts-wide.txt"))]})
    states = LsfScheduler(plan_file=None).read_nodes(runner, NOW)
    assert [list(argv) for argv, _ in runner.calls] == [["bhosts", "-w"]] and not states.gpus


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no header line"),
        ("HOST_NAME status ngpus_physical\na01n01 ok 6\n", "a header with HOST_NAME and ngpus"),
        (fixture("lsf-lsload-gpu.txt").replace("     12%", "", 1), "expected 6 columns"),
    ],
)
def test_lsload_gpu_garbage_is_named(text: str, problem: str) -> None:
    with pytest.raises(OutputParseError, match=problem):
        parse_lsload_gpus(text)
