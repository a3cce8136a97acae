"""Hardening, round 5 (issue 42's classes, held-out variants a probe found): job sets
with short rows or a FIFO found by name, outputs that would replace an input, settings
without a bound or that mean nothing, a host named twice in two cases, and ``run
--fresh`` inside the folders bftrainer makes. Commands run as a user runs them; each test
failed before its fix."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.trainers import channel
from bftrainer.trainers.launch.base import MAX_STOP_GRACE_S, stop_grace_s
from bftrainer.trainers.launch.own_files import remove_own_files
from tests.conftest import bftrainer, wait_until

BOUNDS = "job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\n"
PROFILES = "job,nodes,throughput_samples_per_s\n"
JOBS = BOUNDS + "".join(f"j{i}-mlp,18,12,1,4,100000,2021-02-10T00:0{i}:00Z\n" for i in (1, 2))
CURVES = PROFILES + "".join(
    f"j{i}-mlp,{n},{r}\n" for i in (1, 2) for n, r in ((1, 100), (2, 190), (4, 340))
)


def refused(done: subprocess.CompletedProcess[str], says: str) -> str:
    """The one line of a refusal (exit 2, no traceback), which says ``says``."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.csv"
    done = bftrainer("trace", "synth", "--nodes", "8", "--hours", "1", "--seed", "1", "--out", path)
    assert done.returncode == 0, done.stderr
    return path


def job_set(folder: Path, name: str, bounds: str = JOBS, profiles: str = CURVES) -> Path:
    (folder / f"{name}-JNPs-2.csv").write_text(profiles)
    path = folder / f"{name}-Jbnd-2.csv"
    path.write_text(bounds)
    return path


# ---- job sets --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bounds", "profiles", "says"),
    [
        (
            BOUNDS + "j1-mlp,18,12,1,4\n",
            CURVES,
            "s-Jbnd-2.csv:2: 5 field(s) where the header has 7",
        ),
        (JOBS, PROFILES + "j1-mlp,1\n", "s-JNPs-2.csv:2: 2 field(s) where the header has 3"),
        (JOBS, CURVES + "j1-mlp,8,600,9\n", "s-JNPs-2.csv:8: 4 field(s) where the header has 3"),
    ],
)
def test_a_job_set_row_of_another_length_is_named(
    tmp_path: Path, trace: Path, bounds: str, profiles: str, says: str
) -> None:
    jobs = job_set(tmp_path, "s", bounds, profiles)
    refused(bftrainer("replay", trace, "--jobs", jobs, "--out", tmp_path / "o"), says)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_profiles_file_found_by_name_is_read_only_if_regular(
    tmp_path: Path, trace: Path, kind: str
) -> None:
    """A FIFO in its place hung the replay for ever (the --profiles flag was checked,
    the file found by the job set's name was not)."""
    jobs = tmp_path / "f-Jbnd-2.csv"
    jobs.write_text(JOBS)
    profiles = tmp_path / "f-JNPs-2.csv"
    if kind == "fifo":
        os.mkfifo(profiles)
    else:
        profiles.symlink_to("/dev/zero")
    what = "a FIFO" if kind == "fifo" else "a device or socket"
    refused(bftrainer("replay", trace, "--jobs", jobs, "--out", tmp_path / "o"), what)


# ---- an output that would replace an input -----------------------------------------------
def test_a_replay_into_the_folder_that_holds_its_trace_is_refused(
    tmp_path: Path, trace: Path
) -> None:
    jobs = job_set(tmp_path, "s")
    out = tmp_path / "out"
    first = bftrainer("replay", trace, "--jobs", jobs, "--solver", "dp", "--out", out)
    assert first.returncode == 0, first.stderr
    moved = out / "events.csv"  # a trace kept under one of the output's names
    moved.write_bytes(trace.read_bytes())
    again = bftrainer("replay", moved, "--jobs", jobs, "--solver", "dp", "--out", out)
    refused(again, f"holds TRACE {moved}, which the new output would replace")
    assert moved.read_bytes() == trace.read_bytes()


def test_trace_stats_never_draws_a_plot_over_its_trace(tmp_path: Path, trace: Path) -> None:
    plots = tmp_path / "plots"
    plots.mkdir()
    kept = plots / "fragments_cdf.png"
    kept.write_bytes(trace.read_bytes())
    done = bftrainer("trace", "stats", kept, "--plots", plots)
    refused(done, "the plot would replace its input")
    assert kept.read_bytes() == trace.read_bytes()


# ---- settings: bounds and meaning --------------------------------------------------------
def test_the_config_bounds_the_windows_lead_as_the_flag_does(tmp_path: Path, trace: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[replay]\nwindows = "realistic"\nwindows_lead_s = 1e300\n')
    jobs = job_set(tmp_path, "s")
    done = bftrainer("replay", trace, "--jobs", jobs, "--config", config, "--out", tmp_path / "o")
    refused(done, "windows_lead_s = 1e+300: expected a number in [0, 1e+09]")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--synthetic-nodes", "5"), "--synthetic-nodes shapes the synthetic trace"),
        (("--synthetic-hours", "5"), "--synthetic-hours shapes the synthetic trace"),
        (("--seed", "5"), "--seed shapes the synthetic trace and workload"),
        (("--policy", "equal", "--tfwd", "100"), "--tfwd means nothing without --policy milp"),
        (("--policy", "equal", "--solver", "dp"), "--solver means nothing without --policy milp"),
        (("--policy", "scavenger", "--fairness-p", "0.5"), "means nothing without --policy milp"),
    ],
)
def test_a_replay_option_that_shapes_nothing_is_refused(
    tmp_path: Path, trace: Path, flags: tuple[str, ...], says: str
) -> None:
    jobs = job_set(tmp_path, "s")
    done = bftrainer("replay", trace, "--jobs", jobs, *flags, "--out", tmp_path / "o")
    refused(done, says)


def test_milp_options_stand_when_one_of_the_runs_is_milps(tmp_path: Path, trace: Path) -> None:
    jobs = job_set(tmp_path, "s")
    done = bftrainer(
        "replay", trace, "--jobs", jobs, "--policy", "equal,milp", "--tfwd", "100",
        "--solver", "dp", "--out", tmp_path / "o",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = {p.name for p in (tmp_path / "o").iterdir() if p.is_dir()}
    assert {"equal", "milp-tfwd100"} <= runs, runs  # --tfwd reached the milp run


def test_the_daemon_refuses_a_poll_that_lets_its_leases_lapse(tmp_path: Path) -> None:
    done = bftrainer(
        "daemon",
        "--scheduler",
        "slurm",
        "--bf-partition",
        "bf",
        "--state-dir",
        tmp_path / "sd",
        "--poll-interval",
        "1e300",
    )
    refused(done, "expected at most half the holder lease (300 s)")
    assert not (tmp_path / "sd").exists()


def test_run_bounds_the_stop_grace(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    script = tmp_path / "t.py"
    script.write_text("print('never run')\n")
    done = bftrainer(
        "run", "--hosts-file", hosts, "--trainer-dir", tmp_path / "td",
        "--stop-grace-s", "1e300", script,
    )  # fmt: skip
    assert done.returncode == 2 and "--stop-grace-s" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "td").exists()


@pytest.mark.parametrize(
    ("given", "env", "grace"),
    [
        ("45", None, 45.0),
        ("1e300", None, 30.0),
        ("inf", "nan", 30.0),
        (None, "12", 12.0),
        ("x", "abc", 30.0),
        (str(MAX_STOP_GRACE_S), None, MAX_STOP_GRACE_S),
    ],
)
def test_a_stop_grace_beyond_the_bound_is_passed_over(
    monkeypatch: pytest.MonkeyPatch, given: str | None, env: str | None, grace: float
) -> None:
    """``stop.grace`` and BFTRAINER_STOP_GRACE_S were taken as they were: an endless
    grace kept a stopped trainer's processes for ever."""
    if env is None:
        monkeypatch.delenv("BFTRAINER_STOP_GRACE_S", raising=False)
    else:
        monkeypatch.setenv("BFTRAINER_STOP_GRACE_S", env)
    assert stop_grace_s(given) == grace


# ---- hosts and trainer directories -------------------------------------------------------
def test_a_host_named_twice_in_two_cases_is_refused() -> None:
    with pytest.raises(channel.ChannelError, match="host 'LOCALHOST' is listed twice"):
        channel.parse_hosts("localhost\nLOCALHOST\n", "hosts")


def test_fresh_keeps_a_users_files_inside_the_folders_bftrainer_makes(tmp_path: Path) -> None:
    d = tmp_path / "td"
    (d / "bin").mkdir(parents=True)
    (d / "torchrun" / "x-3_abcd1234" / "attempt_0").mkdir(parents=True)
    (d / "torchrun" / "mine").mkdir()
    (d / "bin" / "ssh").write_text("#!/bin/sh\n")
    (d / "bin" / "mytool").write_text("my precious tool\n")
    (d / "notes.txt").write_text("notes\n")
    spec = {"trainer_id": "x", "script": "t.py", "args": [], "trainer_dir": str(d.resolve())}
    (d / "spec.json").write_text(json.dumps({**spec, "backend": "torchrun"}))
    left = remove_own_files(d)
    assert left == ["bin/mytool", "notes.txt", "torchrun/mine"]
    assert (d / "bin" / "mytool").read_text() == "my precious tool\n"
    assert not (d / "bin" / "ssh").exists() and not (d / "torchrun" / "x-3_abcd1234").exists()
    assert not (d / "spec.json").exists()


# ---- the speedup objective's divisor ------------------------------------------------------
def test_a_job_set_the_speedup_objective_cannot_value_is_refused_up_front(
    tmp_path: Path, trace: Path
) -> None:
    """A 1-node rate of 1e-320 under --objective speedup: InfeasibleCountsError's
    traceback after the replay began; now one line before it."""
    tiny = CURVES.replace("j1-mlp,1,100", "j1-mlp,1,1e-320")
    jobs = job_set(tmp_path, "s", profiles=tiny)
    done = bftrainer(
        "replay", trace, "--jobs", jobs, "--solver", "dp", "--objective", "speedup",
        "--out", tmp_path / "o",
    )  # fmt: skip
    refused(done, "job 1 ('j1-mlp'): the speedup objective divides its curve by its rate")
    fine = bftrainer("replay", trace, "--jobs", jobs, "--solver", "dp", "--out", tmp_path / "o")
    assert fine.returncode == 0, fine.stderr  # throughput divides by nothing


def test_the_centre_refuses_at_the_sync_a_curve_the_speedup_objective_cannot_value() -> None:
    from bftrainer.centre.protocol import TrainerReport
    from bftrainer.centre.transport import RequestRefused

    report = TrainerReport(
        id="t0001", model="m.py", submit_s=0.0, n_min=1, n_max=4, rescale_up_s=1.0,
        rescale_down_s=1.0, work_samples=1e6,
        curves={"throughput": ((1, 1e-300), (4, 1e12))},
    )  # fmt: skip
    with pytest.raises(RequestRefused, match="trainer t0001: the speedup objective divides"):
        report.check_allocatable()


# ---- the centre: one user's sync, one user's flood -----------------------------------------
def _report(**fields: object) -> dict[str, object]:
    from bftrainer.centre.protocol import TrainerReport

    body = TrainerReport(
        id="t0001", model="m.py", submit_s=0.0, n_min=1, n_max=2, rescale_up_s=1.0,
        rescale_down_s=1.0, work_samples=1e6,
    ).to_dict()  # fmt: skip
    return {**body, **fields}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"nodes": ["n1", "n1"]}, "node 'n1' appears twice"),
        ({"rescale_up_s": 10**400}, "'rescale_up_s' is"),
        ({"work_samples": 10**400}, "'work_samples' is"),
        ({"curves": {"throughput": [[1, 10**400]]}}, "a point is"),
        ({"curves": {"throughput": [[10**400, 1]]}}, "a point is"),
    ],
)
def test_a_sync_the_allocator_could_not_use_is_refused_to_its_user(
    fields: dict[str, object], says: str
) -> None:
    """A node named twice in one trainer's sync was taken, and ended the allocator for
    every user at its restore (LoopError: held by both); a 400-digit integer was an
    OverflowError answered 'internal error'."""
    from bftrainer.centre.protocol import SyncRequest
    from bftrainer.centre.transport import RequestRefused

    with pytest.raises(RequestRefused, match=re.escape(says)):
        SyncRequest.from_dict({"trainers": [_report(**fields)], "held": ["n1"]})


def test_a_requests_kind_is_logged_as_data_and_drops_are_logged_now_and_then(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from bftrainer.centre.transport import (
        Peer,
        Request,
        RequestRefused,
        Server,
    )

    def refuse(peer: Peer, request: Request) -> dict[str, object]:
        raise RequestRefused("no")

    server = Server(tmp_path, refuse)
    peer = Peer(uid=50001, gid=50001, pid=1, user="alice")
    with caplog.at_level(logging.INFO, logger="bftrainer.centre.transport"):
        server._handle(peer, Request("x\n1 ERROR FORGED line", {}))
        for _ in range(1000):  # garbage in a loop: one line now, the count later
            server._warn_now_and_then(peer.uid, "malformed", "alice: dropped: not JSON")
    lines = [r.getMessage() for r in caplog.records]
    assert all("\n" not in line for line in lines), lines
    assert sum("dropped: not JSON" in line for line in lines) == 1, lines
    assert server._warned[(peer.uid, "malformed")][1] == 999  # counted for the next line


def test_a_dead_agents_pid_is_alive_only_while_the_same_process_runs() -> None:
    """The allocator took a zombie (or a recycled pid) for the user's agent: its next
    agent was refused 'has an agent already' until the lease ran out."""
    from bftrainer.centre.allocator import Allocator, process_start

    me = process_start(os.getpid())
    assert me is not None and Allocator.alive(os.getpid(), me)
    assert not Allocator.alive(os.getpid(), me + 1)  # the pid, another process's start
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # It exits and, not waited for, stays a zombie: its pid is no agent.
        wait_until(lambda: process_start(child.pid) is None, 30, "the child a zombie")
        assert os.waitpid(child.pid, os.WNOHANG)[0] == child.pid  # it was one, till now
    finally:
        child.poll()


# ---- a supervisor.pid that is not a file ---------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_supervisor_pid_that_is_no_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO there hung status and the daemon at start (which then ignored SIGTERM);
    /dev/zero was read without end."""
    from bftrainer.trainers.launch.base import Launcher, LaunchError

    pid_file = tmp_path / "supervisor.pid"
    if kind == "fifo":
        os.mkfifo(pid_file)
    else:
        pid_file.symlink_to("/dev/zero")
    with pytest.raises(LaunchError, match="no supervisor pid"):
        Launcher.attach(tmp_path)
    assert Launcher.running_in(tmp_path) is None


# ---- an empty holder listing ---------------------------------------------------------------
def test_an_empty_listing_ends_no_holder_submitted_minutes_ago(tmp_path: Path) -> None:
    """squeue answering nothing (exit 0) ended every holder: a running trainer lost its
    node and a holder was submitted again at every poll. A scheduler lists a job for
    minutes after it took it: an empty reply then is no answer. After a long outage (the
    holders older than that) it is believed."""
    import time

    from bftrainer.daemon import HeldPool
    from bftrainer.holders import SlurmHolders
    from bftrainer.holders.base import HolderStatusError
    from bftrainer.idle_monitor.runner import ReplayRunner, recorded
    from bftrainer.state import Store, ensure_state_dir

    partition = "PartitionName=bf AllowGroups=ALL Default=NO MaxTime=UNLIMITED State=UP\n"
    with Store.open(ensure_state_dir(tmp_path / "state")) as store:
        store.add_holder("11", "node1", now_s=time.time() - 20)
        store.set_holder_state("11", "running")
        runner = ReplayRunner({"scontrol": [recorded(partition)], "squeue": [recorded("")]})
        pool = HeldPool(None, SlurmHolders(runner), store, 10.0)  # type: ignore[arg-type]
        with pytest.raises(HolderStatusError, match="listed none of our 1 holder"):
            pool.records.read({})
        store.add_holder("12", "node2", now_s=100.0)  # long ago
        store.set_holder_state("12", "running", now_s=101.0)
        with pytest.raises(HolderStatusError):
            pool.records.read({})  # 11 is still recent
        with store.transaction():
            store.set_holder_state("11", "ended", reason="released")
        read = pool.records.read({})
        assert read.gone["12"].reason == "not listed"  # only old holders: believed
