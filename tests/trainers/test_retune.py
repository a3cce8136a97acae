"""Re-tuning between commits keeps the work exact, and follows the one shared rule.

The real runtime and torch in one process: random batch changes at commits (drawn by
hypothesis instead of the agent's rule), mixed with crashes and stops each followed by
a restart from the checkpoint (a reset), must still cover each epoch's samples exactly
once and do exactly the work asked; each change is recorded (metrics.jsonl, result)
with the learning rate of ``--lr-rule`` for the new batch.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bftrainer.trainers import channel
from bftrainer.trainers.comm import SingleComm
from bftrainer.trainers.goodput import BatchLimits, GoodputModel, retune_choice
from bftrainer.trainers.lr_scaling import AdaScale
from bftrainer.trainers.runtime import CommitInfo, ElasticRuntime, add_runtime_args
from bftrainer.trainers.throughput import ThroughputParams

DATASET = 37
LR0 = 0.1
BASE = 4


class Crash(RuntimeError):
    """A worker dying in the middle of a step."""


class DrawnRetunes(ElasticRuntime):
    """The runtime with its re-tuning decisions drawn from a list (None: stay); each
    decision takes ``decide_s`` and is logged (at which epoch) in ``decided``."""

    def __init__(
        self, moves: list[tuple[int, int] | None], *args: Any, decide_s: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.moves = moves
        self.decide_s = decide_s
        self.decided: list[int] = []

    def retune_decision(self) -> tuple[int, int] | None:
        self.decided.append(self.sampler.epoch)
        if self.decide_s:
            time.sleep(self.decide_s)
        return self.moves.pop(0) if self.moves else None


def make(
    trainer_dir: Path,
    work: int,
    every: int | None,
    moves: list[tuple[int, int] | None],
    ledger: list[dict[str, Any]],
    crash_at: int | None,
    commit_s: float = 0.0,
    step_s: float = 0.0,
    decide_s: float = 0.0,
    max_batch: int = 64,
    commit_every_s: float = 10.0,
) -> DrawnRetunes:
    """The runtime on DATASET samples; ``every`` None: commits at the defaults (by
    time); ``commit_s``: each commit's own cost (a slow disk); ``step_s``: a step's;
    ``decide_s``: a re-tuning decision's."""
    parser = argparse.ArgumentParser()
    add_runtime_args(parser)
    every_args = [] if every is None else ["--commit-every-steps", str(every)]
    args = parser.parse_args(
        [
            "--work-samples", str(work),
            *every_args,
            "--base-batch", str(BASE),
            "--max-batch", str(max_batch),
            "--max-local-batch", "16",
            "--trainer-dir", str(trainer_dir),
            "--trainer-id", "retune",
            "--commit-every-s", str(commit_every_s),
        ]
    )  # fmt: skip
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(DATASET, 3, generator=g), torch.randint(0, 2, (DATASET,), generator=g)
    runtime: DrawnRetunes

    def fetch(ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(ids)
        return x[index], y[index]

    def loss_fn(m: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if crash_at is not None and runtime.progress.step >= crash_at:
            raise Crash(f"crash at step {runtime.progress.step}")
        time.sleep(step_s)
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    def on_commit(info: CommitInfo) -> None:
        ledger.append({"from": info.from_step, "to": info.to_step, "ids": info.ids})
        time.sleep(commit_s)

    runtime = DrawnRetunes(
        moves,
        args,
        model,
        optimizer,
        list(range(DATASET)),
        loss_fn,
        fetch=fetch,
        on_commit=on_commit,
        comm=SingleComm(),
        script="t",
        decide_s=decide_s,
    )
    return runtime


move = st.one_of(st.none(), st.tuples(st.integers(1, 16), st.integers(0, 3)))
# What ends each run but the last: a crash at a step, or a stop request.
interruption = st.one_of(st.tuples(st.just("crash"), st.integers(1, 30)), st.just(("stop", 0)))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    work=st.integers(1, 5 * DATASET),
    every=st.integers(1, 4),
    moves=st.lists(move, max_size=40),
    interruptions=st.lists(interruption, max_size=3),
)
def test_random_retunes_with_crashes_and_restarts_keep_the_work_exact(
    tmp_path_factory: pytest.TempPathFactory,
    work: int,
    every: int,
    moves: list[tuple[int, int] | None],
    interruptions: list[tuple[str, int]],
) -> None:
    trainer_dir = tmp_path_factory.mktemp("retune")
    ledger: list[dict[str, Any]] = []
    moves = list(moves)
    result = None
    for kind, at in [*interruptions, ("last", 0)]:
        crash_at = None
        runtime = make(trainer_dir, work, every, moves, ledger, None)
        if kind == "crash":
            crash_at = runtime.progress.step + at
            runtime = make(trainer_dir, work, every, moves, ledger, crash_at)
        elif kind == "stop":
            (trainer_dir / channel.STOP_REQUEST).touch()
        try:
            result = runtime.run()
        except Crash:
            continue
        finally:
            (trainer_dir / channel.STOP_REQUEST).unlink(missing_ok=True)
        if result is not None:
            break
    if result is None:  # the last run was interrupted: run once more to the end
        result = make(trainer_dir, work, every, moves, ledger, None).run()
    assert result is not None and result["samples"] == work

    # The commits chain without a gap, and together they are exactly the work.
    steps = [(e["from"], e["to"]) for e in ledger]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(steps)), steps
    per_epoch: dict[int, list[int]] = {}
    for entry in ledger:
        for epoch, ids in entry["ids"]:
            per_epoch.setdefault(epoch, []).extend(ids)
    full, rest = divmod(work, DATASET)
    for epoch, ids in per_epoch.items():
        expected = list(range(DATASET)) if epoch < full else None
        if expected is not None:
            assert sorted(ids) == expected, f"epoch {epoch} not covered once"
        else:
            assert len(ids) == rest == len(set(ids)), f"last epoch {epoch}"
    assert sum(len(v) for v in per_epoch.values()) == work

    # Every configuration is recorded, with the learning rate for its batch.
    records, _ = channel.read_metrics(trainer_dir)
    configs = [r for r in records if r["kind"] == "reset"]
    retunes = [r for r in configs if r["source"] == "retune"]
    # Re-tunes made after the last checkpoint before a crash are recorded but not
    # counted in the result (which comes from the checkpoint): at most one a step.
    crashes = sum(1 for kind, _ in interruptions if kind == "crash")
    assert len(retunes) - crashes * every <= result["retunes"] <= len(retunes)
    for r in configs:
        assert r["batch_size"] == r["local_bsz"] * (r["accum_steps"] + 1)
        pgns = (
            r["record"]["grad_var"] / r["record"]["grad_sqr"]
            if r["record"].get("grad_sqr")
            else None
        )
        if pgns is not None and math.isfinite(pgns):
            factor = AdaScale().factor(r["batch_size"], BASE, pgns)
            assert r["lr"] == pytest.approx(LR0 * factor, rel=1e-6), r


def test_the_rule_moves_only_for_more_than_the_switch_gain() -> None:
    """One rule for the live runtime and the replay: the best configuration at the
    same size, taken only when its goodput is over (1 + gain) x the current one's."""
    limits = BatchLimits(base_batch_size=64, max_batch_size=4096, max_local_bsz=512)
    params = ThroughputParams(0.01, 1e-4, 0.0, 0.0, 0.0, 0.0, 1.0)
    model = GoodputModel(params, pgns=5000.0, limits=limits)
    best = model.best_config(1)
    assert best.batch_size > 64  # noisy gradients: a bigger batch is worth more
    now = float(model.goodput(1, 64))
    assert best.goodput_sps > now * 1.05
    moved = retune_choice(model, 1, 1, 64, 0)
    assert moved == best
    gain = best.goodput_sps / now - 1
    assert retune_choice(model, 1, 1, 64, 0, switch_gain=gain * 1.01) is None
    assert retune_choice(model, 1, 1, best.local_bsz, best.accum_steps) is None


def test_each_pass_over_the_data_brings_a_retune_without_a_checkpoint(
    tmp_path: Path,
) -> None:
    """At the defaults (a commit every 10 s), a fast trainer still re-tunes at the end of
    each epoch (AdaptDL's cadence), in the first epoch too, without committing there;
    a decision that costs more than its share of the time waits for the clock."""
    ledger: list[dict[str, Any]] = []
    # 0.05 s a step: a pass of 0.25-0.5 s gives a decision 1.2 ms at 0.5% of the time,
    # ample for one drawn from a list even on a loaded machine.
    # No commit by the clock however loaded the machine: only the end's.
    stays = make(
        tmp_path / "stays", 5 * DATASET, None, [], ledger, None, step_s=0.05, commit_every_s=3600
    )
    stays.run()
    # Checkpoints only at the end of the work: re-tunes need none.
    assert [(e["from"], e["to"]) for e in ledger] == [(0, stays.progress.step)]
    # Each pass's end, stay or not (the back-off is the clock's: 60 s and more).
    assert stays.decided == [1, 2, 3, 4], stays.decided

    moves = [(2 * BASE, 0), (BASE, 0)] * 5
    moving = make(tmp_path / "moving", 4 * DATASET, None, list(moves), [], None, step_s=0.05)
    result = moving.run()
    # A move is recorded, and the cadence stays at every pass.
    assert moving.decided == [1, 2, 3], moving.decided
    assert result is not None and result["retunes"] == 3

    slow = make(tmp_path / "slow", 3 * DATASET, None, list(moves), [], None, step_s=0.02)
    slow.decide_s = 0.05
    slow.run()
    # 0.05 s a decision is 10 s of training at 0.5% of the time: one decision only.
    assert slow.decided == [1], slow.decided


def test_limits_that_allow_one_batch_never_retune(tmp_path: Path) -> None:
    """Nothing to choose: no decision, and no time spent on one."""
    runtime = make(tmp_path, 3 * DATASET, None, [], [], None, max_batch=BASE)
    runtime.run()
    assert runtime.decided == []
