"""``--slots-per-node gres``: S is the GPU count of most of the bf partition's nodes,
read at start; a node of another count (or none, or one that does not parse) is left out
of the pool in one line; a held node whose count changes under trainers leaves the pool
in one line and comes back when it has S again, nothing recorded lost.

The pool source is the real one (``LivePoolSource``, ``SlurmScheduler``) reading the
GPUs recorded from the local Slurm (idle_monitor/fixtures/slurm-gres-sinfo.txt: node3
has 1 GPU, node8 none, the others 2); a count that changes is that file with one line
changed here. The holders are a double: every holder of the store runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest

from bftrainer.cli.status import status_json
from bftrainer.daemon import Daemon, load_daemon_config
from bftrainer.daemon.gpu_slots import GresError, slots_from_gpus
from bftrainer.holders.base import HolderStatus, ReconcileResult
from bftrainer.idle_monitor.runner import CommandResult, ReplayRunner, recorded
from bftrainer.idle_monitor.slurm import SlurmScheduler
from bftrainer.idle_monitor.source import LivePoolSource, PoolConfig
from bftrainer.loop import Demand, LoopView, PoolChange, TrainerState
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import Config, ConfigError
from bftrainer.state import Store, ensure_state_dir

FIXTURES = Path(__file__).resolve().parents[2] / "idle_monitor" / "fixtures"
GRES = (FIXTURES / "slurm-gres-sinfo.txt").read_text()
NODES = [f"node{i}" for i in range(1, 9)]
STATES = "".join(f"{n}|idle\n" for n in NODES)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


class RunningHolders:
    """Every holder of the store runs; nothing is submitted or cancelled for real."""

    scheduler = "slurm"

    def __init__(self) -> None:
        self.released: list[str] = []

    def survey(self, known: Mapping[str, str]) -> ReconcileResult:
        live = {j: HolderStatus(n, "running") for j, n in known.items() if j not in self.released}
        return ReconcileResult(live=live)

    def time_limit_min(self, window_s: float | None) -> int | None:
        return None

    def acquire_many(
        self, windows: Mapping[str, float | None], leases: Mapping[str, str] | None
    ) -> dict[str, str]:
        return {}

    def release(self, *job_ids: str) -> None:
        self.released += job_ids


class Cluster:
    """A daemon over the recorded GPU counts, holding node2 (a trainer on its 2 slots)
    and node3 (1 GPU)."""

    def __init__(self, state_dir: Path) -> None:
        self.runner = ReplayRunner(
            {"squeue": [recorded("")], "scontrol": [recorded("No reservations in the system\n")]}
        )
        self.answer(GRES)
        sched = SlurmScheduler(bf_partitions=("bf",), read_gpus=True)
        self.now_s = 1000.0
        monitor = LivePoolSource(
            sched, self.runner, PoolConfig(filter_blips=False), clock=lambda: self.now_s
        )
        self.store = Store.open(state_dir)
        for job, node in (("11", "node2"), ("12", "node3")):
            self.store.add_holder(job, node)
            self.store.set_holder_state(job, "running")
        self.trainer = self.store.submit(str(EXAMPLE), (), backend="horovod", n_max=2)
        self.store.set_trainer_state(self.trainer, "running")
        self.store.record_allocation(self.trainer, ["node2", "node2"], slots={"node2": [0, 1]})
        self.holders = RunningHolders()
        config = load_daemon_config(None, {"slots_per_node": "gres", "poll_interval_s": 1.0})
        self.daemon = Daemon(self.store, state_dir, monitor, self.holders, config)  # type: ignore[arg-type]
        # The loop is not run here: its demand is the trainer's two slots, on node2, and
        # what it hands the pool at each step's start, that trainer there.
        self.demand = Demand(1, frozenset({"node2"}))
        trainer = TrainerState(JobSpec(self.trainer, "m", 0.0, 1, 2, 0.0, 0.0, 1e6, ((1.0, 1.0),)))
        trainer.nodes = ("node2", "node2")
        self.view = LoopView((trainer,), frozenset({"node2"}))

    def answer(self, gres: str) -> None:
        """What sinfo says from now on: the states, then the GPUs, at every poll."""
        self.runner.set_replies("sinfo", [recorded(STATES), recorded(gres)] * 50)

    def poll(self) -> tuple[frozenset[str], frozenset[str]]:
        """One poll a second later: the nodes that joined and left the loop's pool."""
        self.now_s += 1.0
        pool = self.daemon.pool
        pool.read(self.now_s, self.view)  # as the loop's step: read, poll, plan, act
        polled = pool.poll(self.now_s)
        pool.learn(pool.act(pool.plan(self.now_s, False, self.demand).plan))
        joined: frozenset[str] = frozenset()
        left: frozenset[str] = frozenset()
        for change in polled.inputs:
            assert isinstance(change, PoolChange)
            joined |= change.event.joined
            left |= change.event.left
        return joined, left


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_s_is_the_count_of_most_nodes() -> None:
    assert slots_from_gpus({"a": 6, "b": 6, "c": 4}) == 6
    assert slots_from_gpus({"a": 2, "b": 4}) == 4  # a tie: the larger
    assert slots_from_gpus({"a": 0, "b": 0}) is None


def test_gres_is_a_daemon_setting_only(tmp_path: Path) -> None:
    config = load_daemon_config(None, {"slots_per_node": "gres"})
    assert config.gpu_slots and config.slots_per_node == 1
    toml = tmp_path / "d.toml"
    toml.write_text('[daemon]\nslots_per_node = "gres"\n')
    assert load_daemon_config(toml, {}).gpu_slots
    toml.write_text("[daemon]\ngpu_slots = true\n")  # one way to say it: "gres"
    with pytest.raises(ConfigError, match="unknown key 'gpu_slots'"):
        load_daemon_config(toml, {})
    assert not load_daemon_config(None, {"slots_per_node": 4}).gpu_slots
    with pytest.raises(ConfigError, match="slots_per_node = 'gres': expected a whole number"):
        Config(slots_per_node="gres")  # type: ignore[arg-type]  # the replay's


def test_the_daemon_reads_s_and_leaves_other_counts_out_in_one_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = Cluster(ensure_state_dir(tmp_path / "state"))
    with caplog.at_level(logging.INFO, logger="bftrainer"):
        caplog.clear()
        assert c.daemon.use_gpu_slots()
        assert c.daemon.config.slots_per_node == 2 and c.daemon.driver.book.slots_per_node == 2
        assert lines(caplog, logging.INFO) == [
            "slots per node: 2, the GPU count of 6 of the 8 node(s) read"
        ]
        caplog.clear()
        joined, left = c.poll()
        assert (joined, left) == ({"node2"}, set())  # node3 is held, but has 1 GPU
        assert lines(caplog) == [
            "node3 is left out of the pool (--slots-per-node gres, 2 slots): it has 1 GPU(s), "
            "not the 2 of the partition's nodes",
            "node8 is left out of the pool (--slots-per-node gres, 2 slots): it has no GPU",
        ]
        caplog.clear()
        assert c.poll() == (set(), set())
        assert not lines(caplog)  # said once
    assert c.holders.released == ["12"]  # node3's holder: no trainer can use it
    status = status_json(c.store, tmp_path / "state")
    pool = {p["node"]: p for p in status["pool"]}
    assert "node8" in pool and pool["node8"]["left_out"].startswith("it has no GPU")
    assert "left_out" not in pool["node2"] and "node2" in c.daemon.pool.usable


def test_a_count_that_changes_under_trainers_is_one_line_a_departure_and_a_return(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = Cluster(ensure_state_dir(tmp_path / "state"))
    assert c.daemon.use_gpu_slots()
    assert c.poll() == ({"node2"}, set())
    with caplog.at_level(logging.INFO, logger="bftrainer"):
        caplog.clear()
        c.answer(GRES.replace("node2|gpu:2", "node2|gpu:1"))
        assert c.poll() == (set(), {"node2"})
        assert lines(caplog) == [
            f"node2's GPU count changed from 2 to 1 while {c.trainer} run(s) on it: it leaves "
            "the pool (they shrink at a step boundary; no work is lost) and returns when it "
            "has 2 again"
        ]
        caplog.clear()
        c.answer(GRES)
        assert c.poll() == ({"node2"}, set())
        assert lines(caplog, logging.INFO) == ["node2 has 2 GPU(s) again: back in the pool"]
    # Nothing recorded is lost: the trainer and its slots are as they were (the loop,
    # not run here, is what shrinks it on the departure).
    assert c.store.trainer(c.trainer).state == "running"
    assert c.store.current_allocations()[c.trainer].slots == {"node2": (0, 1)}


def test_a_gres_that_does_not_parse_leaves_that_node_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = Cluster(ensure_state_dir(tmp_path / "state"))
    assert c.daemon.use_gpu_slots()
    c.poll()
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        caplog.clear()
        c.answer(GRES.replace("node4|gpu:tesla:2", "node4|gpu:tesla:two"))
        c.poll()
    assert lines(caplog) == [
        "node4 is left out of the pool (--slots-per-node gres, 2 slots): its Gres does not "
        "parse (GPU count 'two' in Gres 'gpu:tesla:two' is not a number)"
    ]


def test_a_reply_that_does_not_parse_is_one_line_and_the_daemon_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = Cluster(ensure_state_dir(tmp_path / "state"))
    assert c.daemon.use_gpu_slots()
    c.poll()
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        caplog.clear()
        c.answer("Gres\n")
        assert c.poll() == (set(), set())  # the last good pool stays
    (line,) = lines(caplog)
    assert "node states unavailable" in line and "expected 'NODE|GRES'" in line
    c.answer(GRES)
    assert c.poll() == (set(), set()) and c.daemon.pool.usable == {"node2"}


def test_no_node_with_a_gpu_is_one_clear_error(tmp_path: Path) -> None:
    c = Cluster(ensure_state_dir(tmp_path / "state"))
    c.answer("".join(f"{n}|(null)\n" for n in NODES))
    with pytest.raises(GresError, match=r"none of the 8 node\(s\) read has a GPU count"):
        c.daemon.use_gpu_slots()


def test_a_scheduler_silent_at_start_is_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = Cluster(ensure_state_dir(tmp_path / "state"))
    down = recorded(stderr=(FIXTURES / "slurm-down-sinfo.stderr").read_text(), returncode=1)
    c.runner.set_replies("sinfo", [down, recorded(STATES), recorded(GRES)])
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        caplog.clear()
        assert c.daemon.use_gpu_slots()  # the second try, a poll interval (1 s) later
    (line,) = lines(caplog)
    assert line.startswith("slurm node states unavailable"), line
    assert c.daemon.config.slots_per_node == 2


def test_on_lsf_s_is_the_hosts_ngpus(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same with LSF: each host's ``ngpus`` from ``lsload -gpu -w`` (recorded)."""
    from bftrainer.idle_monitor.lsf import LsfScheduler

    def reply(name: str) -> list[CommandResult]:
        return [recorded((FIXTURES / name).read_text())] * 5

    runner = ReplayRunner(
        {
            "bhosts": reply("lsf-bhosts-wide.txt"),
            "bslots": reply("lsf-bslots-long.txt"),
            "lsload": reply("lsf-lsload-gpu.txt"),
        }
    )
    monitor = LivePoolSource(
        LsfScheduler(plan_file=None, read_gpus=True),
        runner,
        PoolConfig(filter_blips=False),
        clock=lambda: 1_700_000_000.0,
    )
    state_dir = ensure_state_dir(tmp_path / "state")
    config = load_daemon_config(None, {"slots_per_node": "gres", "poll_interval_s": 1.0})
    with Store.open(state_dir) as store:
        daemon = Daemon(store, state_dir, monitor, RunningHolders(), config)  # type: ignore[arg-type]
        with caplog.at_level(logging.INFO, logger="bftrainer"):
            assert daemon.use_gpu_slots()
    assert daemon.config.slots_per_node == 6  # a01n01-10 but a01n06; 4 on two hosts
    assert "slots per node: 6, the GPU count of 9 of the 14 node(s) read" in lines(
        caplog, logging.INFO
    )
