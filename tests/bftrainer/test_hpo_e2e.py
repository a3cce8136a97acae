"""A real Optuna study and a real DeepHyper search on the real 8-node Slurm through one
daemon, at once: `bftrainer hpo` runs 16 trials and examples/hpo_deephyper.py 10 of
examples/hpo_digits.py (an MLP on scikit-learn's digits) as torchrun trainers, ASHA
(Optuna's pruner, DeepHyper's stopper) ends the losers on their reported validation loss,
and the daemon and both searches are killed -9 mid-search and started again.

What a user relies on, asserted for each search: every trial ends, none is left
running; each trial's state is its trainer's end (done: complete with its last report,
cancelled: pruned); at least a third are pruned, and a pruned trial's nodes leave it
within a few polls; the kills lose no trial and double none (one trainer per trial).
The two share the cluster and the daemon: one test's time for both.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from bftrainer.hpo import ATTR_PRUNED, ATTR_TRAINER, TRIAL_OPTION
from bftrainer.state import AllocationRow, Store, TrainerRow
from bftrainer.trainers import channel
from tests.bftrainer.daemon_service import BFTRAINER, Service, service_in
from tests.conftest import REPO, SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The goal: a study of at least 16 trials. The DeepHyper search passes the same
# checks on 10 (DeepHyper asks past max_evals for each end): a trial's cost is its
# torchrun agent's imports, and this test is the suite's largest CPU share.
TRIALS = 16
SEARCH_TRIALS = 10
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


# The same trials as a DeepHyper search (CBO, DeepHyper's successive halving on the same
# rungs: a budget unit is a report, 1,280 samples), on the other 4 nodes.
DH = [
    *(sys.executable, str(REPO / "examples" / "hpo_deephyper.py"), "--name", "dh"),
    *("--max-evals", str(SEARCH_TRIALS), "--work-samples", str(WORK), "--max-parallel", "4"),
    *("--max-nodes", "1", "--poll-interval", "1", "--seed", "0"),
    *("--step-delay-s", "0.03", "--device", "cpu"),  # the trial script's own
]


@pytest.fixture
def service(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    with service_in(slurm, tmp_path) as s:
        yield s


def campaign(service: Service, n: int, kind: str = "hpo") -> subprocess.Popen[bytes]:
    log = (service.log_dir / f"{kind}-{n}.log").open("ab")
    command = [*BFTRAINER, "-v", *HPO] if kind == "hpo" else DH
    proc = subprocess.Popen(
        [*command, "--state-dir", str(service.state_dir)],
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


def told(service: Service) -> int:
    """DeepHyper's results written so far (its results.csv)."""
    path = service.state_dir / "deephyper-dh" / "results.csv"
    return len(pd.read_csv(path)) if path.exists() else 0


def created(service: Service) -> bool:
    """Whether the campaign has created its study, read without writing: Optuna's storage
    writes its version rows when it opens a database that has none, so a reader opening
    it while the campaign creates it races the campaign ("UNIQUE constraint failed:
    alembic_version", seen once)."""
    path = service.state_dir / "hpo.db"
    if not path.exists():
        return False
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            version = db.execute("SELECT 1 FROM alembic_version").fetchone()
            named = db.execute("SELECT 1 FROM studies WHERE study_name = 'e2e'").fetchone()
    except sqlite3.OperationalError:  # its tables are not there yet
        return False
    return version is not None and named is not None


def ended(service: Service) -> int:
    """Trials of the study that ended, read as ``created`` reads: one short read-only
    look, closed at once. Polled every 0.25 s, an Optuna storage opened per look held the
    file longer than the test needs, beside a campaign that writes it."""
    if not created(service):
        return 0
    path = service.state_dir / "hpo.db"
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM trials t JOIN studies s ON t.study_id = s.study_id "
            "WHERE s.study_name = 'e2e' AND t.state IN ('COMPLETE', 'PRUNED', 'FAIL')"
        ).fetchone()
    return int(count)


def test_a_study_and_a_search_prune_their_losers_and_survive_kill9s(service: Service) -> None:
    service.start("milp")
    first = [campaign(service, 1), campaign(service, 1, "dh")]
    second: list[subprocess.Popen[bytes]] = []
    try:
        wait_until(lambda: ended(service) >= 5 and told(service) >= 3, 300, "trials ended")
        # Mid-search: trials running, others queued or not yet asked. Kill all, -9.
        service.kill9()
        for proc in first:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        time.sleep(2)
        service.start("milp")
        second = [campaign(service, 2), campaign(service, 2, "dh")]
        for proc in second:
            proc.wait(timeout=600)
    finally:
        for proc in (*first, *second):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for log in sorted(service.log_dir.glob("*-[12].log")):
            print(f"==== {log.name}\n{log.read_text()[-4000:]}")
    assert [proc.returncode for proc in second] == [0, 0]
    out = (service.log_dir / "hpo-2.log").read_text().strip().splitlines()[-1]
    summary = json.loads(out)
    trials = study(service).trials
    with Store.open(service.state_dir) as store:
        every = store.trainers()
        history = {r.id: store.allocation_history(r.id) for r in every}
        marks = store.get_setting("hpo-stopped:dh", {})
    rows = [r for r in every if r.args[r.args.index(TRIAL_OPTION) + 1].startswith("e2e#")]
    check_deephyper(service, [r for r in every if r not in rows], history, marks)
    # One trainer per trial, no more: the kills lost none and doubled none.
    names = Counter(r.args[r.args.index(TRIAL_OPTION) + 1] for r in rows)
    assert sorted(names) == sorted(f"e2e#{n}" for n in range(TRIALS)), names
    assert set(names.values()) == {1}, names
    assert len(trials) == TRIALS
    # The restarted campaign's seeded sampler went on: no trial repeats another's draw.
    draws = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(draws)) == len(draws), draws
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
    freed_s = []
    for t in trials:
        mark = t.user_attrs.get(ATTR_PRUNED)
        if t.state != TrialState.PRUNED or not isinstance(mark, dict):
            continue
        row = by_id[t.user_attrs[ATTR_TRAINER]]
        after = [a.time_s for a in history[row.id] if not a.nodes and a.time_s >= mark["time_s"]]
        if after:
            freed_s.append(after[0] - mark["time_s"])
    check_freed(freed_s)


def check_freed(freed_s: list[float]) -> None:
    """A pruned trial's nodes: taken from it soon after the decision (the daemon polls
    every second; a decision may land while the daemon was down: not counted)."""
    print(f"pruned trial -> nodes freed (s): {sorted(round(s, 2) for s in freed_s)}")
    assert freed_s and sorted(freed_s)[len(freed_s) // 2] < 5.0, freed_s


def check_deephyper(
    service: Service,
    rows: list[TrainerRow],
    history: dict[str, list[AllocationRow]],
    marks: dict[str, float],
) -> None:
    """The DeepHyper search's checks: the Optuna study's, on its results.csv."""
    out = (service.log_dir / "dh-2.log").read_text().strip().splitlines()[-1]
    summary = json.loads(out)
    results = pd.read_csv(service.state_dir / "deephyper-dh" / "results.csv")
    # One trainer per trial and one result per trainer: the kills lost none, doubled none.
    names = Counter(r.args[r.args.index(TRIAL_OPTION) + 1] for r in rows)
    assert set(names.values()) == {1}, names
    assert sorted(results["m:trainer"]) == sorted(r.id for r in rows)
    assert len(results) >= SEARCH_TRIALS
    by_id = {r.id: r for r in rows}
    assert all(r.finished for r in rows)  # none left running
    for _, res in results.iterrows():
        row = by_id[res["m:trainer"]]
        assert res["m:trainer_end"] == row.state, (res, row.state, row.reason)
        assert bool(res["m:pruned"]) == (row.state == "cancelled"), (res, row.state)
        assert row.state in ("done", "cancelled"), (row.id, row.state, row.reason)
        # Its value is its trainer's last report (DeepHyper maximises: minus the loss);
        # a stopped one's, the last before it was stopped (it may report on its way out).
        reports, _ = channel.read_reports(Path(str(row.trainer_dir)))
        values = [-r["value"] for r in reports]
        if row.state == "done":
            assert reports[-1]["samples_done"] == WORK
            assert float(res["objective"]) == values[-1]
        else:
            assert float(res["objective"]) in values
    pruned = int((results["m:trainer_end"] == "cancelled").sum())
    assert pruned * 3 >= len(results), results[["m:trainer", "m:trainer_end"]]
    assert summary["pruned"] == pruned and summary["complete"] == len(results) - pruned
    freed_s = []
    for tid, mark_s in marks.items():
        after = [a.time_s for a in history[tid] if not a.nodes and a.time_s >= mark_s]
        if after and by_id[tid].state == "cancelled":
            freed_s.append(after[0] - mark_s)
    check_freed(freed_s)
