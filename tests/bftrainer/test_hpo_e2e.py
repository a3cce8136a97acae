"""A real Optuna study on the real 8-node Slurm through the daemon: `bftrainer hpo` runs
16 trials of examples/hpo_digits.py (an MLP on scikit-learn's digits) as torchrun
trainers, ASHA prunes the losers on their reported validation loss, and the daemon and
the campaign are both killed -9 mid-study and started again.

What a user relies on, asserted here: every trial ends, none is left RUNNING; each
trial's state is its trainer's end (done: COMPLETE with its last report, cancelled:
PRUNED); at least a third are pruned, and a pruned trial's nodes leave it within a few
polls; the kills lose no trial and double none (one trainer per trial).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from bftrainer.hpo import ATTR_PRUNED, ATTR_TRAINER, TRIAL_OPTION
from bftrainer.state import Store
from tests.bftrainer.daemon_service import BFTRAINER, Service, service_in
from tests.conftest import REPO, SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRIALS = 16
WORK = 8000  # samples per trial if not pruned: 125 steps at batch 64
# Rungs at 1,280 and 3,840 samples (reports every 20 steps of 64), x3 apart.
HPO = [
    *("hpo", str(REPO / "examples" / "hpo_digits.py"), "--study", "e2e"),
    *("--param", "lr=float:0.001:1.0:log", "--param", "hidden=int:4:64:log"),
    *("--n-trials", str(TRIALS), "--seed", "0", "--pruner", "asha"),
    *("--min-resource", "1280", "--reduction-factor", "3", "--max-parallel", "4"),
    *("--work-samples", str(WORK), "--poll-interval", "1"),
    # The trial script's own options: a fixed batch, a report every 20 steps, slow
    # enough (0.03 s a step) that a pruning decision lands before the work is done.
    *("--max-batch", "64", "--commit-every-steps", "20", "--step-delay-s", "0.03"),
    *("--device", "cpu"),
]


@pytest.fixture
def service(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    with service_in(slurm, tmp_path) as s:
        yield s


def campaign(service: Service, n: int) -> subprocess.Popen[bytes]:
    log = (service.log_dir / f"hpo-{n}.log").open("ab")
    proc = subprocess.Popen(
        [*BFTRAINER, "-v", *HPO, "--state-dir", str(service.state_dir)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=service.env,
        start_new_session=True,
    )
    log.close()
    return proc


def study(service: Service) -> optuna.Study:
    storage = f"sqlite:///{service.state_dir / 'hpo.db'}"
    return optuna.load_study(study_name="e2e", storage=storage)


def ended(service: Service) -> int:
    if not (service.state_dir / "hpo.db").exists():
        return 0
    try:
        return sum(t.state.is_finished() for t in study(service).trials)
    except KeyError:  # the study is not created yet
        return 0


def test_a_study_prunes_its_losers_and_survives_kill9s(service: Service) -> None:
    service.start("milp")
    first = campaign(service, 1)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: ended(service) >= 5, 300, "5 trials ended")
        # Mid-study: trials running, others queued or not yet asked. Kill both, -9.
        service.kill9()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        time.sleep(2)
        service.start("milp")
        second = campaign(service, 2)
        second.wait(timeout=600)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for log in sorted(service.log_dir.glob("hpo-*.log")):
            print(f"==== {log.name}\n{log.read_text()[-4000:]}")
    assert second is not None and second.returncode == 0
    out = (service.log_dir / "hpo-2.log").read_text().strip().splitlines()[-1]
    summary = json.loads(out)
    trials = study(service).trials
    with Store.open(service.state_dir) as store:
        rows = store.trainers()
        history = {r.id: store.allocation_history(r.id) for r in rows}
    # One trainer per trial, no more: the kills lost none and doubled none.
    names = Counter(r.args[r.args.index(TRIAL_OPTION) + 1] for r in rows)
    assert sorted(names) == sorted(f"e2e#{n}" for n in range(TRIALS)), names
    assert set(names.values()) == {1}, names
    assert len(trials) == TRIALS
    by_id = {r.id: r for r in rows}
    expect = {"done": TrialState.COMPLETE, "cancelled": TrialState.PRUNED}
    for t in trials:
        row = by_id[t.user_attrs[ATTR_TRAINER]]
        assert t.state == expect.get(row.state), (t.number, t.state, row.state, row.reason)
    states = Counter(t.state for t in trials)
    assert states[TrialState.PRUNED] * 3 >= TRIALS, states
    assert summary["pruned"] == states[TrialState.PRUNED]
    assert summary["complete"] == states[TrialState.COMPLETE] > 0
    # A complete trial's value is its last report, at all of its work.
    for t in trials:
        if t.state == TrialState.COMPLETE:
            assert max(t.intermediate_values) == WORK
            assert t.value == t.intermediate_values[WORK]
    # A pruned trial's nodes: taken from it soon after the decision (the daemon polls
    # every second; a decision may land while the daemon was down: not counted).
    freed_s = []
    for t in trials:
        mark = t.user_attrs.get(ATTR_PRUNED)
        if t.state != TrialState.PRUNED or not isinstance(mark, dict):
            continue
        row = by_id[t.user_attrs[ATTR_TRAINER]]
        after = [a.time_s for a in history[row.id] if not a.nodes and a.time_s >= mark["time_s"]]
        if after:
            freed_s.append(after[0] - mark["time_s"])
    print(f"pruned trial -> nodes freed (s): {sorted(round(s, 2) for s in freed_s)}")
    assert freed_s and sorted(freed_s)[len(freed_s) // 2] < 5.0, freed_s
