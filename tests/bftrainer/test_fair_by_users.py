"""Fairness by user or account through the loop, the configuration and the replay.

The allocator's side (the objective, exactness, admission) is tests/milp/test_fair_by.py.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.daemon.config import load_daemon_config
from bftrainer.idle_monitor.trace_reader import load_trace
from bftrainer.loop import Arrival, Input
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import Config, ConfigError, load_config
from bftrainer.replay.run import ReplayConfig, replay
from bftrainer.replay.workload import read_paper_jobs
from tests.bftrainer.test_loop import make_loop

NODES = 40
SUBMIT = "2021-02-10 00:10:00"


def user_job(jid: str, user: str, submit_s: float = 0.0) -> JobSpec:
    return JobSpec(
        id=jid,
        model="m",
        submit_s=submit_s,
        n_min=1,
        n_max=8,
        rescale_up_s=0.0,
        rescale_down_s=0.0,
        work_samples=1e9,
        curve=((1.0, 1.0), (8.0, 8.0)),
        user=user,
    )


def test_the_policy_table_takes_fair_by_and_weights(tmp_path: Path) -> None:
    path = tmp_path / "bftrainer.toml"
    path.write_text('[policy]\nfair_by = "account"\nfair_weights = { physics = 2, bio = 0.5 }\n')
    c = load_config(path, Config())
    assert c.fair_by == "account" and dict(c.fair_weights) == {"physics": 2, "bio": 0.5}
    assert Config().fair_by == "trainer" and dict(Config().fair_weights) == {}


def test_weights_by_trainer_are_refused_at_start_not_ignored(tmp_path: Path) -> None:
    """Weights are per user or account: a daemon by trainer ignored them (issue 42)."""
    path = tmp_path / "bftrainer.toml"
    path.write_text("[policy]\nfair_weights = { ann = 2 }\n")
    with pytest.raises(ConfigError) as err:
        load_daemon_config(path, {})
    assert str(err.value) == (
        f"{path}: [policy] fair_weights means nothing without "
        'fair_by = "user" or "account" (--fair-by)'
    )
    assert load_daemon_config(path, {"fair_by": "user"}).fair_weights == {"ann": 2}  # the flag
    path.write_text('[policy]\nfair_by = "account"\nfair_weights = { ann = 2 }\n')
    assert load_daemon_config(path, {}).fair_by == "account"
    with pytest.raises(ConfigError, match="fair_weights means nothing"):
        load_daemon_config(path, {"fair_by": "trainer"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('fair_by = "group"', "fair_by = 'group': expected one of trainer, user, account"),
        ("fair_weights = 3", "fair_weights = 3: expected a table of user or account = weight"),
        ("fair_weights = { ann = 0 }", "fair_weights.ann = 0: expected a number >= 0.001"),
        ("fair_weights = { ann = 1e9 }", "fair_weights.ann = 1000000000.0: expected a number <="),
        ('fair_weights = { ann = "x" }', "fair_weights.ann = 'x': expected a number"),
    ],
)
def test_bad_fairness_settings_get_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bftrainer.toml"
    path.write_text(f"[policy]\n{text}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, Config())
    assert message in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_the_loop_admits_across_users_and_a_displaced_trainer_gives_its_nodes_back() -> None:
    script: list[tuple[float, Input]] = [
        (0.0, Arrival(user_job("a1", "ann"))),
        (0.0, Arrival(user_job("a2", "ann"))),
        (10.0, Arrival(user_job("b1", "bob", 10.0))),
    ]
    for fair_by, seen_at_10 in (("trainer", ("a1", "a2")), ("user", ("a1", "b1"))):
        config = Config(max_trainers=2, fair_by=fair_by)
        loop, driver, policy, _ = make_loop(script, pool=("n1", "n2", "n3", "n4"), config=config)
        loop.run(until_s=10.0)
        assert policy.seen[0][1] == ("a1", "a2")
        assert policy.seen[-1] == (("n1", "n2", "n3", "n4"), seen_at_10)
        nodes = {t.id: t.nodes for t in loop.trainers.values()}
        if fair_by == "user":
            # a2 lost its place to bob's first trainer: its nodes went back first.
            assert nodes["a2"] == () and len(nodes["b1"]) == 2
            assert ("rescale", 10.0, ("a2", ())) in driver.calls
        else:
            assert nodes["b1"] == () and len(nodes["a2"]) == 2
        held = [n for ns in nodes.values() for n in ns]
        assert len(held) == len(set(held)) == 4


def write_inputs(folder: Path) -> tuple[Path, Path]:
    """40 nodes idle for an hour; user "many" submits 20 jobs, then "one" submits 1."""
    trace = folder / "pool.csv"
    lines = ["time,node,idle"]
    lines += [f"2021-02-10 00:00:00,n{i},1" for i in range(NODES)]
    lines += [f"2021-02-10 01:00:00,n{i},0" for i in range(NODES)]
    trace.write_text("\n".join(lines) + "\n")
    jobs = folder / "U-Jbnd-21J.csv"
    rows = [f"M{k:02d},18.0,12.0,1,{NODES},1e12,{SUBMIT},many,lab-a" for k in range(20)]
    rows.append(f"ONE,18.0,12.0,1,{NODES},1e12,2021-02-10 00:10:01,one,lab-b")
    jobs.write_text("job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub,user,account\n" + "\n".join(rows) + "\n")
    ids = [*(f"M{k:02d}" for k in range(20)), "ONE"]
    profiles = [p for j in ids for p in (f"{j},1,100.0", f"{j},{NODES},{100.0 * NODES!r}")]
    (folder / "U-JNPs-21J.csv").write_text(
        "job,nodes,throughput_samples_per_s\n" + "\n".join(profiles) + "\n"
    )
    return trace, jobs


def test_job_sets_carry_their_owners(tmp_path: Path) -> None:
    _, jobs_path = write_inputs(tmp_path)
    jobs = read_paper_jobs(jobs_path)
    assert {(j.user, j.account) for j in jobs} == {("many", "lab-a"), ("one", "lab-b")}
    plain = tmp_path / "P-Jbnd-1J.csv"
    plain.write_text(f"job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\nM00,18,12,1,4,1e9,{SUBMIT}\n")
    (tmp_path / "P-JNPs-1J.csv").write_text("job,nodes,throughput_samples_per_s\nM00,4,4\n")
    (job,) = read_paper_jobs(plain)
    assert (job.user, job.account) == ("", "")  # one default owner


def share_of_one(tmp_path: Path, fair_by: str) -> float:
    trace_path, jobs_path = write_inputs(tmp_path)
    # Speedup over the fair share, as Pollux: the power mean's transform is scaled for
    # values near 1 (its floor is 0.05); on raw samples/s it is flat, and the rescale
    # costs then keep every map. T_fwd of an hour: the pool stays that long.
    config = ReplayConfig(
        solver="dp",
        fair_share_speedup=True,
        fairness_p=-1.0,
        fair_by=fair_by,
        max_trainers=21,
        t_fwd_s=3600.0,
    )
    result = replay(load_trace(trace_path), read_paper_jobs(jobs_path), config)
    done = {t.job.user: 0.0 for t in result.trainers}
    for t in result.trainers:
        done[t.job.user] += t.processed_samples
    return done["one"] / (done["one"] + done["many"])


def test_a_replay_by_user_gives_the_lone_user_half_the_work(tmp_path: Path) -> None:
    by_trainer = share_of_one(tmp_path, "trainer")
    by_user = share_of_one(tmp_path, "user")
    by_account = share_of_one(tmp_path, "account")
    assert by_trainer < 0.1  # one trainer of 21
    assert by_user == pytest.approx(0.5, abs=0.05)  # less the minutes before it came
    assert by_account == by_user


def test_the_replay_command_takes_fair_by_and_writes_the_owners(tmp_path: Path) -> None:
    trace, jobs = write_inputs(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bftrainer", "replay", str(trace), "--jobs", str(jobs)),
            *("--fair-by", "user", "--fairness-p", "-1", "--max-parallel", "21"),
            *("--fair-share-speedup", "--tfwd", "3600"),
            *("--solver", "dp", "--no-progress", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fair_by"] == "user"
    with (out / "trainers.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["user"], r["account"]) for r in rows} == {("many", "lab-a"), ("one", "lab-b")}
    bad = subprocess.run(
        [sys.executable, "-m", "bftrainer", "replay", "--fair-by", "group", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "'group' is not one of" in bad.stderr
