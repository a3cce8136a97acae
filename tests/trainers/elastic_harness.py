"""Helpers for the real-process elastic tests: start the example, read what it wrote."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from bftrainer.trainers import channel
from bftrainer.trainers.goodput import BatchLimits, GoodputModel
from bftrainer.trainers.launch import remote
from bftrainer.trainers.launch.base import Launcher, LaunchSpec
from bftrainer.trainers.launch.worker import PROCESS_NAME
from bftrainer.trainers.lr_scaling import AdaScale
from bftrainer.trainers.metrics import MetricsRecord

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_mlp.py"
LOCAL_HOSTS = ("localhost", "127.0.0.1", socket.gethostname())
EXAMPLE_LR = 0.05  # examples/train_mlp.py's default --lr
# A rescale takes 10-30 s on 2 cores; the notes say give each 60-90 s.
RESCALE_TIMEOUT_S = 90.0


def horovod_missing() -> str | None:
    """Why Horovod cannot run here (None when it can)."""
    try:
        import horovod.torch  # noqa: F401
    except Exception as e:
        return f"import horovod.torch failed ({e}); run make horovod"
    return None


class Trainer:
    """A launched example trainer and what it wrote into its directory."""

    def __init__(self, launcher: Launcher, work: int, hold: Path | None = None) -> None:
        self.launcher = launcher
        self.dir = launcher.trainer_dir
        self.work = work
        self.hold = hold

    def release(self) -> None:
        """Let a held trainer run the rest of its work at full speed."""
        if self.hold is not None:
            self.hold.unlink(missing_ok=True)

    def launcher_hosts(self) -> list[tuple[str, int]]:
        return channel.read_hosts(self.dir)

    @property
    def ledger(self) -> Path:
        return self.dir / "ledger.jsonl"

    def records(self, kind: str) -> list[dict[str, Any]]:
        records, _ = channel.read_metrics(self.dir, 0)
        return [r for r in records if r.get("kind") == kind]

    def resets(self) -> list[dict[str, Any]]:
        """The configurations chosen at a reset (or at the start)."""
        return [r for r in self.records("reset") if r.get("source") != "retune"]

    def retunes(self) -> list[dict[str, Any]]:
        """The batch changes between resets (Pollux's re-tuning)."""
        return [r for r in self.records("reset") if r.get("source") == "retune"]

    def configurations(self) -> list[dict[str, Any]]:
        """Every configuration the trainer ran, in order: resets and re-tunes."""
        return self.records("reset")

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            outcome = self.launcher.poll()
            if outcome is not None:
                raise AssertionError(
                    f"trainer ended ({outcome}) while waiting for {what}\n{self.log_tail()}"
                )
            time.sleep(0.25)
        raise AssertionError(
            f"timed out after {timeout_s:g} s waiting for {what}\n{self.log_tail()}"
        )

    def wait_reset(
        self, nodes: int, after: int, timeout_s: float = RESCALE_TIMEOUT_S
    ) -> dict[str, Any]:
        """The first reset record at ``nodes`` nodes past index ``after``, once it steps on."""
        found: dict[str, Any] = {}

        def ready() -> bool:
            resets = self.resets()
            for r in resets[after:]:
                if r["nodes"] == nodes:
                    found.update(r)
                    return self.committed_steps() > r["step"]
            return False

        self.wait_for(ready, f"a reset to {nodes} node(s) and a commit after it", timeout_s)
        return found

    def committed_steps(self) -> int:
        entries = ledger_chain(self.ledger)
        return entries[-1]["to_step"] if entries else 0

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = (self.dir / channel.SUPERVISOR_LOG).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def worker_pids(self) -> list[int]:
        return [
            pid
            for pid in remote.descendants(self.launcher.pid)
            if started_rank(pid) is not None and remote.alive(pid)
        ]

    def processes_anywhere(self) -> list[int]:
        """Every process on this machine of this trainer, whoever started it (workers
        started over ssh are sshd's children, not the supervisor's descendants)."""
        return remote.processes_of(self.dir)

    def worker_rank(self, pid: int) -> int | None:
        return started_rank(pid)

    def checkpoint_step(self) -> int:
        """The step of the checkpoint on disk; 0 before the first."""
        path = self.dir / channel.CHECKPOINT
        if not path.exists():
            return 0
        state = torch.load(path, weights_only=False)
        return int(state["progress"]["step"])

    def finish(self, timeout_s: float = 240.0) -> dict[str, Any]:
        self.release()
        outcome = self.launcher.wait(timeout_s)
        assert outcome is not None, f"trainer did not finish in {timeout_s} s\n{self.log_tail()}"
        assert outcome.state == "done", f"{outcome}\n{self.log_tail()}"
        result = channel.read_result(self.dir)
        assert result is not None
        return result


def ledger_chain(path: Path) -> list[dict[str, Any]]:
    """The commits that stand: a commit from step s drops earlier ones ending after s."""
    chain: list[dict[str, Any]] = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        if not line.endswith("}"):
            continue
        entry = json.loads(line)
        while chain and chain[-1]["to_step"] > entry["from_step"]:
            chain.pop()
        chain.append(entry)
    return chain


def assert_exact_epochs(trainer: Trainer, dataset_size: int) -> None:
    """Committed ids: the work exactly, each epoch's samples once each."""
    chain = ledger_chain(trainer.ledger)
    for a, b in itertools.pairwise(chain):
        assert a["to_step"] == b["from_step"], (
            f"gap in the commits: {a['to_step']} -> {b['from_step']}"
        )
    per_epoch: dict[int, list[int]] = {}
    for entry in chain:
        for epoch, ids in entry["ids"]:
            per_epoch.setdefault(epoch, []).extend(ids)
    total = sum(len(v) for v in per_epoch.values())
    assert total == trainer.work
    full, rest = divmod(trainer.work, dataset_size)
    for epoch, ids in sorted(per_epoch.items()):
        if epoch < full:
            assert sorted(ids) == list(range(dataset_size)), f"epoch {epoch} not covered once"
        else:
            assert len(ids) == rest == len(set(ids)), f"last epoch {epoch}: repeats"


def assert_agent_choices(trainer: Trainer, lr0: float = EXAMPLE_LR) -> None:
    """Every reset ran the agent's best configuration (base batch before a fit), every
    re-tune the best one at its size, and each the AdaScale learning rate for it."""
    for r in trainer.configurations():
        record = MetricsRecord.from_dict(r["record"])
        limits: BatchLimits = record.limits
        if r["source"] in ("agent", "retune"):
            assert record.throughput is not None
            model = GoodputModel(record.throughput, record.pgns, limits, record.replicas_per_node)
            best = model.best_config(r["nodes"])
            assert (r["local_bsz"], r["accum_steps"]) == (best.local_bsz, best.accum_steps), r
        else:
            assert record.throughput is None
            per = -(-limits.base_batch_size // r["replicas"])
            assert r["local_bsz"] == per and r["accum_steps"] == 0, r
        assert r["batch_size"] == r["replicas"] * r["local_bsz"] * (r["accum_steps"] + 1)
        factor = AdaScale().factor(r["batch_size"], limits.base_batch_size, record.pgns)
        assert r["lr"] == pytest.approx(lr0 * factor), r


def start_trainer(
    tmp_path: Path,
    backend: str,
    hosts: Sequence[str],
    work: int,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name: str = "t",
    n_max: int = 3,
    script: Path = EXAMPLE,
    held: bool = True,
) -> Trainer:
    """The example on ``hosts``. Held (the default), it steps at most every
    ``HELD_STEP_S`` until the test calls ``release`` or ``finish``: however the agent
    re-tunes its batch, the work cannot run out while the test still watches."""
    trainer_dir = tmp_path / name
    hold = tmp_path / f"{name}.hold" if held else None
    if hold is not None:
        hold.touch()
        args = (*args, "--step-delay-s", str(HELD_STEP_S), "--hold-file", str(hold))
    spec = LaunchSpec(
        trainer_id=name,
        script=script,
        args=(
            "--work-samples",
            str(work),
            "--ledger",
            str(trainer_dir / "ledger.jsonl"),
            *args,
        ),
        trainer_dir=trainer_dir,
        backend=backend,
        n_max=n_max,
        python=sys.executable,
        env={"BFTRAINER_STOP_GRACE_S": "60", **(env or {})},
    )
    return Trainer(Launcher.start(spec, hosts), work, hold)


@pytest.fixture
def launched() -> Iterator[list[Trainer]]:
    """Trainers a test started; killed (whole process trees) however the test ends."""
    trainers: list[Trainer] = []
    yield trainers
    for t in trainers:
        t.launcher.kill()
        for pid in t.worker_pids() + t.processes_anywhere():
            remote.kill_tree(pid)


def env_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}


DATASET = 8192  # examples/train_mlp.py's default --samples
FAST_COMMITS = ("--commit-every-steps", "20", "--commit-every-s", "2", "--report-every-s", "2")
# A held trainer's step: at the largest batch of these tests (256) it does at most
# 512 samples/s, so the three rescales of a scenario (10-30 s each) leave work to do.
HELD_STEP_S = 0.5


def scenario_rescale(launched: list[Trainer], tmp_path: Path, backend: str) -> Trainer:
    """Hosts 1 -> 3 -> 2 -> 1 during training; exact work, epochs, agent choices."""
    a, b, c = LOCAL_HOSTS
    t = start_trainer(
        tmp_path,
        backend,
        [a],
        work=60_000,
        args=(*FAST_COMMITS, "--max-batch", "256"),
    )
    launched.append(t)
    seen = 0
    for hosts in ([a], [a, b, c], [a, b], [a]):
        if len(hosts) != len(t.launcher_hosts()):
            t.launcher.set_hosts(hosts)
        t.wait_reset(len(hosts), seen)
        seen = len(t.resets())
    result = t.finish()
    assert result["samples"] == t.work
    assert_exact_epochs(t, DATASET)
    nodes = [r["nodes"] for r in t.resets()]
    assert nodes[0] == 1 and 3 in nodes and nodes[-1] == 1, nodes
    assert_agent_choices(t)
    assert result["batch_sizes"] == [r["batch_size"] for r in t.configurations()]
    assert result["resets"] == len(t.resets()) - 1
    assert result["retunes"] == len(t.retunes())
    return t


def scenario_two_slots_per_host(launched: list[Trainer], tmp_path: Path, backend: str) -> None:
    """Two workers per host (``host:2``): the agent counts nodes, not workers, and the
    work is exact across 1 -> 2 -> 1 hosts of two slots each."""
    a, b, _ = LOCAL_HOSTS
    t = start_trainer(
        tmp_path,
        backend,
        [f"{a}:2"],
        work=48_000,
        args=(*FAST_COMMITS, "--max-batch", "256"),
    )
    launched.append(t)
    seen = 0
    for hosts in ([f"{a}:2"], [f"{a}:2", f"{b}:2"], [f"{a}:2"]):
        if len(hosts) != len(t.launcher_hosts()):
            t.launcher.set_hosts(hosts)
        reset = t.wait_reset(len(hosts), seen)
        assert reset["replicas"] == 2 * len(hosts), reset
        seen = len(t.resets())
    result = t.finish()
    assert result["samples"] == t.work
    assert_exact_epochs(t, DATASET)
    assert_agent_choices(t)


def scenario_worker_killed(launched: list[Trainer], tmp_path: Path, backend: str) -> None:
    """A worker SIGKILLed on 2 hosts costs at most the steps since the last commit."""
    a, b, _ = LOCAL_HOSTS
    t = start_trainer(tmp_path, backend, [a, b], work=16_000, args=FAST_COMMITS)
    launched.append(t)
    first = t.wait_reset(2, 0)
    t.wait_for(lambda: t.checkpoint_step() >= first["step"] + 8, "8 checkpointed steps", 60)
    victims = [p for p in t.worker_pids() if t.worker_rank(p) == 1]
    assert victims, "no rank-1 worker found"
    seen = len(t.resets())
    # Durable before the kill: the checkpoint (the ledger is written just before it,
    # so a ledger entry alone may belong to a commit the kill interrupts).
    committed_before = t.checkpoint_step()
    os.kill(victims[0], 9)
    t.wait_for(lambda: len(t.resets()) > seen, "a reset after the kill", RESCALE_TIMEOUT_S)
    after = t.resets()[seen]
    committed = {e["to_step"] for e in ledger_chain(t.ledger)}
    # Resumed from a commit at or after the last one seen before the kill: what was lost
    # is at most the steps since that commit.
    assert after["step"] >= committed_before, (after["step"], committed_before)
    assert after["step"] in committed | {0}, (after["step"], sorted(committed)[-5:])
    result = t.finish()
    assert result["samples"] == t.work
    assert_exact_epochs(t, DATASET)


def scenario_zero_hosts_and_restart(launched: list[Trainer], tmp_path: Path, backend: str) -> None:
    """Zero hosts: workers checkpoint and stop; hosts back: same step. Stopped and
    started again: same step. The work and the epochs stay exact."""
    a, b, _ = LOCAL_HOSTS
    t = start_trainer(tmp_path, backend, [a, b], work=20_000, args=FAST_COMMITS)
    launched.append(t)
    t.wait_reset(2, 0)
    t.launcher.set_hosts([])
    t.wait_for(lambda: not t.worker_pids(), "the workers to stop at zero hosts", 60)
    assert t.launcher.poll() is None, "the supervisor must wait for hosts"
    paused_at = t.checkpoint_step()
    assert t.committed_steps() == paused_at
    seen = len(t.resets())
    t.launcher.set_hosts([a])
    resumed = t.wait_reset(1, seen)
    assert resumed["step"] == paused_at

    t.launcher.stop(grace_s=60)
    outcome = t.launcher.poll()
    assert outcome is not None and outcome.state == "stopped", outcome
    stopped_at = t.checkpoint_step()
    assert t.committed_steps() == stopped_at > paused_at
    seen = len(t.resets())
    again = start_trainer(tmp_path, backend, [a], work=20_000, args=FAST_COMMITS)
    launched.append(again)
    restarted = again.wait_reset(1, seen)
    assert restarted["step"] == stopped_at
    result = again.finish()
    assert result["samples"] == again.work
    assert_exact_epochs(again, DATASET)


def run_cli(
    tmp_path: Path, backend: str, script: Path, *args: str, timeout_s: float = 180
) -> tuple[int, str, Path]:
    """``bftrainer run`` on one local host; (return code, stderr, trainer dir)."""
    import subprocess

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    trainer_dir = tmp_path / f"run-{script.stem}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bftrainer",
            "run",
            "--backend",
            backend,
            "--hosts-file",
            str(hosts),
            "--trainer-dir",
            str(trainer_dir),
            str(script),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            remote.kill_tree(proc.pid)
        pid_file = trainer_dir / channel.SUPERVISOR_PID
        if pid_file.exists():
            remote.kill_tree(int(pid_file.read_text()))
    return proc.returncode, err, trainer_dir


def assert_failed_cleanly(rc: int, err: str, trainer_dir: Path, reason: str) -> None:
    """One clear line on stderr, exit.json failed with the reason, traceback in the log."""
    assert rc == 1, err
    lines = [line for line in err.splitlines() if line.startswith("bftrainer run: trainer")]
    assert len(lines) == 1 and reason in lines[0], err
    exit_ = channel.read_exit(trainer_dir)
    assert exit_ is not None and exit_["state"] == "failed" and reason in exit_["reason"]
    log = (trainer_dir / channel.SUPERVISOR_LOG).read_text()
    assert "Traceback (most recent call last)" in log and reason in log


def started_rank(pid: int) -> int | None:
    """The rank a worker started with, from the name the worker wrapper gives it
    (``bftrainer-w<rank>``; a worker forked by torchrun's agent has the agent's command
    line and environment in /proc); None: not a worker, or gone."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    rank = name.removeprefix(PROCESS_NAME)
    return int(rank) if name.startswith(PROCESS_NAME) and rank.isdigit() else None


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment; empty once it is gone."""
    try:
        items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in items if item)
    return {name: value for name, _, value in pairs}


def scenario_worker_leaves(launched: list[Trainer], tmp_path: Path, backend: str) -> float:
    """A worker that gets SIGTERM (its node taken back) leaves at its next step, after
    the common commit; the others go on from that very commit on the hosts that remain,
    with nothing lost. Returns the seconds from the signal to the survivors' reset."""
    hosts = list(LOCAL_HOSTS)
    t = start_trainer(
        tmp_path,
        backend,
        hosts,
        work=40_000,
        args=(*FAST_COMMITS, "--max-batch", "192"),
        # Gloo's timeout above the wait below: a survivor stuck in a collective with the
        # leaver (seen on the local Slurm: 120 s) fails the test instead of recovering.
        env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "180"},
    )
    launched.append(t)
    first = t.wait_reset(3, 0)
    t.wait_for(lambda: t.committed_steps() >= first["step"] + 8, "8 committed steps", 60)
    (victim,) = [p for p in t.worker_pids() if t.worker_rank(p) == 2]
    host = environ_of(victim).get("HOROVOD_HOSTNAME")
    assert host in hosts, host
    seen = len(t.resets())
    signalled = time.monotonic()
    os.kill(victim, signal.SIGTERM)
    # The survivors go on at the leave's commit, without waiting for a host list. The
    # daemon removes the host once it sees the node go: when the holder job has ended,
    # that is, once the leaver's processes have exited. (Removed earlier, within the two
    # steps a leave takes to be agreed with the flags read a step late, Horovod aborts
    # the leaver: "vm[0] has been removed from elastic job", exit 134; the survivors
    # still resume from the last commit.)
    t.wait_for(lambda: not remote.alive(victim), "the leaver to exit", 60)
    t.launcher.set_hosts([h for h in hosts if h != host])
    after = t.wait_reset(2, seen, timeout_s=60)
    reset_s = time.monotonic() - signalled
    left = [e["to_step"] for e in ledger_chain(t.ledger) if e["to_step"] <= after["step"]]
    assert after["step"] == left[-1], "the survivors resume from the leaver's last commit"
    assert f"rank 2 left at step {after['step']} on SIGTERM" in t.log_tail(200)
    result = t.finish()
    assert result["samples"] == t.work
    assert_exact_epochs(t, DATASET)
    return reset_s
