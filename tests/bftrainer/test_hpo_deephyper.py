"""A real DeepHyper search through ``TrainerEvaluator`` on a real store, with the
daemon's part played by the scripted daemon of test_hpo_campaign.py in a thread. What
users rely on: the search runs unchanged (DeepHyper's own search, stopper and
results); each job's result is its trainer's end (done: the last report; stopped
early: its trainer cancelled, the last report; failed: a failure); DeepHyper's
successive halving stops losers; a search killed -9 and started again with
``checkpoint_restart`` neither loses nor doubles a trial. The real thing on Slurm:
test_hpo_e2e.py."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from deephyper.hpo import CBO, HpProblem, RandomSearch
from deephyper.stopper import SuccessiveHalvingStopper

from bftrainer.hpo import CampaignError, TrialSpec
from bftrainer.hpo.evaluator import TrainerEvaluator, params_of
from bftrainer.state import Store
from tests.bftrainer.test_hpo_campaign import STEPS, ScriptedDaemon
from tests.conftest import REPO, wait_until

WORK = STEPS[-1]


class DaemonThread:
    """The scripted daemon stepping every ``every_s`` on its own connection."""

    def __init__(
        self,
        state: Path,
        root: Path,
        nodes: int,
        every_s: float = 0.05,
        grow: tuple[int, int] | None = None,
    ) -> None:
        self.store = Store.open(state)
        self.daemon = ScriptedDaemon(self.store, root, nodes)
        self.every_s, self.stop = every_s, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.most_unfinished = 0  # trainers queued or running at once, seen at each step
        self.grow = grow  # (after that many trainers ended, the pool has that many nodes)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.daemon.step()
            rows = self.store.trainers()
            unfinished = sum(1 for r in rows if not r.finished)
            self.most_unfinished = max(self.most_unfinished, unfinished)
            if self.grow is not None and len(rows) - unfinished >= self.grow[0]:
                self.daemon.nodes = self.grow[1]
                pool = {"nodes": {f"n{i}": {} for i in range(self.grow[1])}}
                self.store.set_setting("pool", pool)
                self.grow = None

    def __enter__(self) -> DaemonThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.store.close()


def problem() -> HpProblem:
    p = HpProblem()
    p.add_hyperparameter((0.0, 1.0), "x")
    return p


def evaluator(state: Path, script: Path) -> TrainerEvaluator:
    spec = TrialSpec(script, n_min=1, n_max=1, work_samples=WORK)
    return TrainerEvaluator(
        spec, Store.open(state), "dh", budget_samples=STEPS[0], poll_s=0.01, max_parallel=3
    )


def stopper() -> SuccessiveHalvingStopper:
    # Budgets 1..4 (a report every 100 samples); rungs at 1 and 3, the top third goes on.
    return SuccessiveHalvingStopper(max_steps=len(STEPS), min_steps=1, reduction_factor=3)


def run_search(state: str, script: str, log_dir: str, max_evals: str, restart: str) -> None:
    """One search to the end (the subprocess of the kill test); CBO, as DeepHyper's
    restart from its results.csv (``checkpoint_restart``) is CBO's."""
    search = CBO(
        problem(),
        stopper=stopper(),
        log_dir=log_dir,
        random_state=int(max_evals),
        checkpoint_restart=restart == "1",
        n_initial_points=20,  # random points: the surrogate's fits are not what is tested
    )
    search.search(evaluator(Path(state), Path(script)), max_evals=int(max_evals))


def check_ends(results: pd.DataFrame, store: Store) -> None:
    """One result per trainer and one trainer per result, each result its trainer's end."""
    rows = {r.id: r for r in store.trainers()}
    assert sorted(results["m:trainer"]) == sorted(rows), (list(results["m:trainer"]), rows)
    names = Counter(r.args[r.args.index("--trial") + 1] for r in rows.values())
    assert set(names.values()) == {1}, names  # one trainer per trial name
    for _, r in results.iterrows():
        row = rows[r["m:trainer"]]
        assert r["m:trainer_end"] == row.state
        x = float(row.args[row.args.index("--x") + 1])
        assert r["p:x"] == pytest.approx(x)
        if row.state == "done":
            assert not r["m:pruned"]
            assert float(r["objective"]) == pytest.approx(-((x - 0.3) ** 2 + 1 / WORK))
        elif row.state == "cancelled":
            assert r["m:pruned"], "cancelled only by the stopper here"
            assert float(r["objective"]) < -((x - 0.3) ** 2 + 1 / WORK)  # before the end
        else:
            assert str(r["objective"]).startswith("F_")


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "trial.py").write_text("")
    Store.open(tmp_path / "state").close()
    yield tmp_path / "state"


def test_a_search_stops_its_losers_and_each_result_is_its_trainers_end(
    tmp_path: Path, state: Path
) -> None:
    with DaemonThread(state, tmp_path / "trainers", nodes=3) as daemon:
        daemon.daemon.fail.add("t0002")
        ev = evaluator(state, tmp_path / "trial.py")
        search = RandomSearch(
            problem(), stopper=stopper(), log_dir=str(tmp_path / "dh"), random_state=1
        )
        results = search.search(ev, max_evals=12)
    with Store.open(state) as store:
        check_ends(results, store)
        ends = Counter(r.state for r in store.trainers())
    assert ends["cancelled"] >= 4 and ends["done"] >= 1 and ends["failed"] == 1, ends
    assert len(results) >= 12
    # The pool had 3 nodes: never more than 3 trainers at once (each asked when room).
    assert 1 <= daemon.most_unfinished <= 3


def test_a_search_started_on_a_small_pool_grows_with_it(tmp_path: Path, state: Path) -> None:
    """DeepHyper reads num_workers once, at the start (1 node: 1 trial), then asks one
    configuration per end: the evaluator asks the search for one more when the pool grows
    to 2 nodes, and not one already in flight (CBO, past its first 2 random points,
    proposes the point it proposed last until it is told a result). Trials DeepHyper's
    stopper promoted are marked with the rungs they passed."""
    with DaemonThread(state, tmp_path / "trainers", nodes=1, grow=(3, 2)) as daemon:
        ev = evaluator(state, tmp_path / "trial.py")
        search = CBO(
            problem(),
            stopper=stopper(),
            log_dir=str(tmp_path / "dh"),
            random_state=2,
            n_initial_points=2,
            acq_optimizer="sampling",  # fast: its default genetic optimizer takes 1-2 s a tell
        )
        results = search.search(ev, max_evals=12)
    assert daemon.most_unfinished == 2  # 1 before the pool grew
    with Store.open(state) as store:
        check_ends(results, store)
        rungs = [r.rungs for r in store.trainers()]
    xs = list(results["p:x"])
    assert len(set(xs)) == len(xs), xs  # no configuration twice
    assert any(rungs) and set(rungs) <= {0, 1, 2}, rungs  # rungs at budgets 1 and 3


def test_num_workers_follow_the_pool(tmp_path: Path, state: Path) -> None:
    ev = evaluator(state, tmp_path / "trial.py")
    ev.max_parallel = None
    with Store.open(state) as store:
        store.set_setting("pool", {"nodes": {f"n{i}": {} for i in range(5)}})
        assert ev.num_workers == 5
        store.submit(tmp_path / "trial.py", ["--x", "0.5", "--trial", "dh#0"])
        store.submit(tmp_path / "trial.py", ["--x", "0.5", "--trial", "other#0"])
        assert ev.num_workers == 4  # its own trial counts, another search's takes room
        store.set_setting("pool", {"nodes": {}})
        assert ev.num_workers == 1  # its running trial


def test_a_search_killed_and_started_again_loses_and_doubles_no_trial(
    tmp_path: Path, state: Path
) -> None:
    log_dir = tmp_path / "dh"
    script = tmp_path / "trial.py"

    def search(max_evals: int, restart: bool) -> subprocess.Popen[bytes]:
        args = [str(state), str(script), str(log_dir), str(max_evals), "1" if restart else "0"]
        code = "import sys; from tests.bftrainer.test_hpo_deephyper import run_search as r; "
        code += "r(*sys.argv[1:])"
        return subprocess.Popen(
            [sys.executable, "-c", code, *args], cwd=REPO, start_new_session=True
        )

    with DaemonThread(state, tmp_path / "trainers", nodes=3, every_s=0.3):
        first = search(10, restart=False)
        try:
            # Mid-search: some told (in results.csv), some trainers running.
            wait_until(lambda: _told(log_dir) >= 3, 120, "3 results written")
            wait_until(lambda: _running(state) >= 1, 30, "a trainer running")
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
        with Store.open(state) as store:
            before = {r.id for r in store.trainers()}
        second = search(4, restart=True)
        assert second.wait(timeout=300) == 0
    results = pd.read_csv(log_dir / "results.csv")
    with Store.open(state) as store:
        check_ends(results, store)  # every trainer once: the killed search's adopted
    assert before <= set(results["m:trainer"])


@pytest.mark.parametrize("killed", ["with job 1 in flight", "before job 1 had a trainer"])
def test_a_restart_whose_results_miss_a_job_below_the_last_ends_and_tells_it_once(
    tmp_path: Path, state: Path, killed: str
) -> None:
    """A job in flight at a kill whose id is below a told one's leaves a gap in
    results.csv: DeepHyper's restart numbers the reloaded jobs 0..max, and nothing ever
    gathered the gap's id, so the restarted search's last collect waited for it forever
    (a core spinning: the Slurm test's search hung so). The orphan trainer takes the gap:
    the restarted search ends, and tells each trainer once, under the id it had. A gap
    with no trainer (killed between the two) is lost, and the search still ends."""
    log_dir = tmp_path / "dh"
    script = tmp_path / "trial.py"
    with DaemonThread(state, tmp_path / "trainers", nodes=3):
        run_search(str(state), str(script), str(log_dir), "4", "0")
        results = pd.read_csv(log_dir / "results.csv")
        orphan = str(results.loc[results["job_id"] == 1, "m:trainer"].iloc[0])
        if killed == "with job 1 in flight":  # its trainer ran, its result never written
            results = results[results["job_id"] != 1]
        else:  # job 1 never got a trainer: its configuration is lost
            results.loc[results["job_id"] == 1, "job_id"] = results["job_id"].max() + 1
        results.to_csv(log_dir / "results.csv", index=False)
        second = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; from tests.bftrainer.test_hpo_deephyper import run_search as r; "
             "r(*sys.argv[1:])", str(state), str(script), str(log_dir), "2", "1"],
            cwd=REPO, start_new_session=True,
        )  # fmt: skip
        try:
            assert second.wait(timeout=120) == 0
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
                second.wait(timeout=10)
    results = pd.read_csv(log_dir / "results.csv")
    ids = sorted(results["job_id"])
    if killed == "with job 1 in flight":
        assert ids == list(range(len(results)))  # no gap
        assert list(results.loc[results["job_id"] == 1, "m:trainer"]) == [orphan]
    else:
        assert 1 not in ids and ids == [0, *range(2, len(results) + 1)]
    with Store.open(state) as store:
        check_ends(results, store)  # every trainer once


def test_params_come_back_from_a_trainers_arguments() -> None:
    args = ("--base", "1", "--act", "relu", "--lr", "0.003", "--n", "4", "--trial", "s#2")
    assert params_of(args, 2) == {"act": "relu", "lr": 0.003, "n": 4}


def test_a_search_that_cannot_run_is_refused_in_one_line(tmp_path: Path, state: Path) -> None:
    spec = TrialSpec(tmp_path / "missing.py")
    with Store.open(state) as store:
        with pytest.raises(CampaignError, match=r"trial script .*missing.py: no such file"):
            TrainerEvaluator(spec, store, "dh")
        with pytest.raises(CampaignError, match="without '#'"):
            TrainerEvaluator(TrialSpec(tmp_path / "trial.py"), store, "a#b")
        for poll_s in (-1.0, math.nan, 1e12):  # a core spun; a traceback in the sleep
            with pytest.raises(CampaignError, match=r"poll_s = .*: expected seconds > 0"):
                TrainerEvaluator(TrialSpec(tmp_path / "trial.py"), store, "dh", poll_s=poll_s)
    ev = evaluator(state, tmp_path / "trial.py")
    with pytest.raises(CampaignError, match="search 'dh': parameter 'trial': --trial is the"):
        ev.submit([{"trial": 0.5}])  # it would come before the campaign's own --trial
    with Store.open(state) as store:
        assert store.trainers() == []


def _told(log_dir: Path) -> int:
    path = log_dir / "results.csv"
    if not path.exists():
        return 0
    return max(0, len(path.read_text().strip().splitlines()) - 1)


def _running(state: Path) -> int:
    with Store.open(state) as store:
        return sum(1 for r in store.trainers() if r.state == "running")
