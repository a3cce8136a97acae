"""The replay with S slots per node: S = 1 is the replay of before, to the last digit;
with S > 1 trainers share nodes, a node's departure ends every share on it, and the
wait before a trainer's first slot is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace import Trace
from bftrainer.loop.jobs import JobSpec, jobs_in_slots
from bftrainer.replay.run import ReplayConfig, ReplayError, replay
from tests.shared_data import SHARED

SMALL = ["--synthetic-nodes", "64", "--synthetic-hours", "6", "--jobs-count", "60"]
POLLUX = SHARED / "pollux-sim"


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / ("r" + "_".join(extra))
    result = CliRunner().invoke(cli, ["replay", *SMALL, *extra, "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())


def test_one_slot_per_node_is_the_replay_of_before(tmp_path: Path) -> None:
    """tests/bftrainer/data/replay_before_slots.json: SMALL's summary by the replay of
    commit 005229f, before slots; every figure the same, with the flag or without."""
    want = json.loads((Path(__file__).parent / "data" / "replay_before_slots.json").read_text())
    want.pop("made_by")
    for extra in ((), ("--slots-per-node", "1")):
        got = _run(tmp_path, *extra)
        for key, value in want.items():
            assert got[key] == value, (extra, key)


def _small(n: int) -> list[JobSpec]:
    """Jobs counted in slots, each scaling poorly past 2: sharing pays."""
    curve = ((1.0, 100.0), (2.0, 150.0), (4.0, 200.0))
    return [JobSpec(f"j{i}", "m", 0.0, 1, 4, 10.0, 5.0, 1e9, curve) for i in range(n)]


def test_jobs_given_per_node_count_s_slots_per_node() -> None:
    job = JobSpec("j", "m", 0.0, 2, 4, 1.0, 1.0, 1.0, ((1.0, 10.0), (4.0, 30.0)))
    (slots,) = jobs_in_slots([job], 6)
    assert (slots.n_min, slots.n_max, slots.curve) == (7, 24, ((6.0, 10.0), (24.0, 30.0)))
    assert jobs_in_slots([job], 1) == [job]


def test_small_trainers_share_nodes_and_a_departure_ends_every_share() -> None:
    trace = Trace(
        nodes=("a", "b"),
        initial_idle=frozenset({"a", "b"}),
        start_s=0.0,
        end_s=3600.0,
        events=(PoolEvent(1800.0, joined=frozenset(), left=frozenset({"a"})),),
    )
    r = replay(trace, _small(4), ReplayConfig(slots_per_node=4, t_fwd_s=120.0))
    assert r.summary["slots_per_node"] == 4
    assert r.summary["trainers_never_started"] == 0
    assert r.summary["mean_wait_before_first_slot_s"] == 0.0
    first = [a for a in r.allocations if a.time_s == 0.0]
    assert len(first) == 4  # four trainers at once on two nodes, two slots each
    after = next(s for s in r.metrics.steps if s.time_s == 1800.0)
    assert after.left == 1 and after.allocated_nodes == 1


def test_a_job_bigger_than_every_slot_of_the_trace_is_refused() -> None:
    trace = Trace(nodes=("a",), initial_idle=frozenset({"a"}), start_s=0.0, end_s=60.0, events=())
    job = JobSpec("big", "m", 0.0, 5, 8, 0.0, 0.0, 1.0, ((8.0, 1.0),))
    with pytest.raises(ReplayError, match=r"job 'big': n_min 5 slots exceeds the pool's 4 "):
        replay(trace, [job], ReplayConfig(slots_per_node=4))


def test_slots_below_one_is_one_usage_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["replay", *SMALL, "--slots-per-node", "0", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 2
    assert "--slots-per-node" in result.output and "0" in result.output


@pytest.mark.skipif(not (POLLUX / "traces").is_dir(), reason="no Pollux data")
def test_a_placements_file_that_does_not_match_the_slots_is_one_usage_line(
    tmp_path: Path,
) -> None:
    data = POLLUX
    result = CliRunner().invoke(
        cli,
        [
            "replay",
            *SMALL[:4],
            "--workload",
            "pollux",
            "--pollux-data",
            str(data),
            "--jobs-count",
            "2",
            "--slots-per-node",
            "6",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert result.exit_code == 2
    assert "measures at most 4 replicas per node; --slots-per-node 6 does not match" in (
        result.output
    )


@pytest.mark.skipif(not (POLLUX / "traces").is_dir(), reason="no Pollux data")
def test_pollux_jobs_share_nodes_at_their_placements_measured_rates() -> None:
    from bftrainer.replay.pollux.sim import PolluxDriverFactory, PolluxSimOptions
    from bftrainer.replay.pollux.workload import generate_pollux_workload

    w = generate_pollux_workload(4, 0.0, POLLUX, mean_interarrival_s=0.0, slots_per_node=4)
    assert all(j.n_max > 16 for j in w.jobs if j.model == "cifar10")  # replicas, not nodes
    options = PolluxSimOptions(batch_adapt=False, noise=0.0, slots_per_node=4)
    driver = PolluxDriverFactory(tuple(w.apps.items()), POLLUX, options)()
    nodes = ("a", "b")
    trace = Trace(nodes=nodes, initial_idle=frozenset(nodes), start_s=0.0, end_s=9e5, events=())
    config = ReplayConfig(
        slots_per_node=4, objective="goodput", fairness_p=-1.0, fair_share_speedup=True
    )
    r = replay(trace, list(w.jobs), config, driver=driver)
    assert r.summary["trainers_completed"] == 4
    assert max(s.running for s in r.metrics.steps) > 2  # more trainers than nodes at once
    report = driver.report()
    assert all(t["finished_s"] is not None for t in report.trainers.values())


def test_slots_per_node_is_a_replay_setting_of_the_configuration_file(tmp_path: Path) -> None:
    from bftrainer.policies.config import ConfigError, load_config
    from bftrainer.replay.run import REPLAY_TABLES

    good = tmp_path / "good.toml"
    good.write_text("[replay]\nslots_per_node = 6\n")
    assert load_config(good, ReplayConfig(), REPLAY_TABLES).slots_per_node == 6
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nslots_per_node = 6\n")  # the daemon's table: not yet
    with pytest.raises(ConfigError, match="slots_per_node"):
        load_config(bad, ReplayConfig(), REPLAY_TABLES)
    with pytest.raises(ConfigError, match=r"slots_per_node = 0: expected a whole number from 1 to"):
        ReplayConfig(slots_per_node=0)
