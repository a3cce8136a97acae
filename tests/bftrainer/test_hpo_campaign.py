"""The campaign's bookkeeping on a real store and a real Optuna study (SQLite), with the
daemon's part played by a script: it starts queued trainers, writes their reports as
``runtime.report`` does, ends them, and cancels those asked. What users rely on: each
trial's end in the study is its trainer's, a pruned trial's trainer is cancelled, no
trial is asked before the pool has room, and a campaign killed anywhere between its
writes and started again neither loses nor doubles a trial. The real thing on Slurm:
test_hpo_e2e.py."""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from bftrainer.hpo import (
    ATTR_END,
    ATTR_PRUNED,
    ATTR_TRAINER,
    Campaign,
    CampaignError,
    SpaceError,
    TrialSpec,
    parse_space,
    study_lock,
    trainers_by_trial,
)
from bftrainer.hpo.campaign import STORAGE_ERRORS, DaemonWatch, storage_busy
from bftrainer.state import Store
from bftrainer.state.lock import DaemonLock
from bftrainer.trainers import channel
from tests.conftest import wait_until

SPACE = {"x": FloatDistribution(0.0, 1.0)}
STEPS = (100, 200, 300, 400)


class ScriptedDaemon:
    """The daemon's side on the store: each step, queued trainers start while ``nodes``
    allow, running ones report one value of ``(x - 0.3)^2 + 1/samples`` more and end
    done after the last; cancel requests end them ``cancelled``."""

    def __init__(self, store: Store, root: Path, nodes: int) -> None:
        self.store, self.root, self.nodes = store, root, nodes
        self.store.set_setting("pool", {"nodes": {f"n{i}": {} for i in range(nodes)}})
        self.reported: dict[str, int] = {}
        self.fail: set[str] = set()

    def step(self) -> None:
        for row in self.store.trainers():
            if row.finished:
                continue
            if row.cancel_requested:
                self.store.set_trainer_state(row.id, "cancelled", reason="cancelled")
                continue
            if row.state == "queued":
                busy = sum(1 for t in self.store.trainers() if t.state == "running")
                if busy < self.nodes:
                    d = self.root / row.id
                    self.store.set_launch(row.id, trainer_dir=d, supervisor=None)
                    self.store.set_trainer_state(row.id, "running")
                continue
            if row.id in self.fail:
                self.store.set_trainer_state(row.id, "failed", reason="ValueError: bad x")
                continue
            x = float(row.args[row.args.index("--x") + 1])
            k = self.reported.get(row.id, 0)
            samples = STEPS[k]
            writer = channel.ChannelWriter(Path(str(row.trainer_dir)))
            writer.report((x - 0.3) ** 2 + 1.0 / samples, samples, k, None)
            self.reported[row.id] = k + 1
            if k + 1 == len(STEPS):
                self.store.set_trainer_state(row.id, "done")


def study(tmp_path: Path, pruner: optuna.pruners.BasePruner | None = None) -> optuna.Study:
    return optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'hpo.db'}",
        study_name="s",
        sampler=optuna.samplers.RandomSampler(seed=1),
        pruner=pruner or optuna.pruners.SuccessiveHalvingPruner(min_resource=100),
        load_if_exists=True,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "state")
    for name in ("trial.py", "t.py"):  # the trial scripts the tests name
        (tmp_path / name).write_text("")
    yield s
    s.close()


def run(campaign: Campaign, daemon: ScriptedDaemon, limit: int = 200) -> None:
    for _ in range(limit):
        tally = campaign.step()
        if campaign.done(tally):
            return
        daemon.step()
    raise AssertionError(f"not done after {limit} steps: {campaign.tally()}")


def check_ends(s: optuna.Study, store: Store) -> None:
    """Each trial's state is its trainer's end; one trainer per trial."""
    rows = trainers_by_trial(store)
    assert len(store.trainers()) == len(s.trials) == len(rows)
    expect = {"done": TrialState.COMPLETE, "cancelled": TrialState.PRUNED}
    for t in s.trials:
        row = rows[f"s#{t.number}"]
        assert t.user_attrs[ATTR_TRAINER] == row.id
        assert t.state == expect.get(row.state, TrialState.FAIL), (t, row)


def test_a_study_prunes_losers_and_tells_each_end(tmp_path: Path, store: Store) -> None:
    daemon = ScriptedDaemon(store, tmp_path / "trainers", nodes=3)
    s = study(tmp_path)
    spec = TrialSpec(tmp_path / "trial.py", ("--base",), n_min=1, n_max=2)
    campaign = Campaign(s, SPACE, spec, store, n_trials=12)
    run(campaign, daemon)
    check_ends(s, store)
    states = [t.state for t in s.trials]
    assert states.count(TrialState.PRUNED) >= 4, states
    assert TrialState.COMPLETE in states
    # A complete trial's value is its last report; the trainer got its parameter.
    best = s.best_trial
    assert math.isclose(best.value, (best.params["x"] - 0.3) ** 2 + 1 / 400)
    row = store.trainer(best.user_attrs[ATTR_TRAINER])
    assert row.args[:3] == ("--base", "--x", repr(best.params["x"]))
    assert row.args[-2:] == ("--trial", f"s#{best.number}")


def test_no_trial_is_asked_while_the_pool_has_no_room(tmp_path: Path, store: Store) -> None:
    daemon = ScriptedDaemon(store, tmp_path / "trainers", nodes=2)
    spec = TrialSpec(tmp_path / "trial.py", n_min=2, n_max=2)
    campaign = Campaign(study(tmp_path), SPACE, spec, store, n_trials=5)
    campaign.step()
    assert len(store.trainers()) == 1  # 2 nodes: one trial of min 2 fits
    daemon.step()
    campaign.step()
    assert len(store.trainers()) == 1


def test_a_failed_trainer_fails_its_trial_with_the_cause(tmp_path: Path, store: Store) -> None:
    daemon = ScriptedDaemon(store, tmp_path / "trainers", nodes=1)
    s = study(tmp_path, optuna.pruners.NopPruner())
    campaign = Campaign(s, SPACE, TrialSpec(tmp_path / "t.py"), store, n_trials=1)
    campaign.step()
    daemon.fail.add(store.trainers()[0].id)
    run(campaign, daemon)
    (t,) = s.trials
    assert t.state == TrialState.FAIL
    assert t.user_attrs[ATTR_END] == "trainer t0001 failed: ValueError: bad x"


@pytest.mark.parametrize("cut", ["mid-ask", "after-ask", "after-submit", "after-prune-mark"])
def test_a_campaign_killed_between_its_writes_loses_and_doubles_nothing(
    tmp_path: Path, store: Store, cut: str
) -> None:
    daemon = ScriptedDaemon(store, tmp_path / "trainers", nodes=2)
    s = study(tmp_path)
    spec = TrialSpec(tmp_path / "trial.py")
    # The kill: the trial asked (mid-ask: before its parameters were recorded; after-
    # submit: its trainer queued too), nothing more.
    trial = s.ask() if cut == "mid-ask" else s.ask(SPACE)
    if cut not in ("mid-ask", "after-ask"):
        store.submit(spec.script, ["--x", repr(trial.params["x"]), "--trial", "s#0"])
    if cut == "after-prune-mark":  # the pruner said prune; the cancel was not yet asked
        trial.set_user_attr(ATTR_TRAINER, "t0001")
        trial.set_user_attr(ATTR_PRUNED, 100)
        daemon.step()
    again = Campaign(study(tmp_path), SPACE, spec, store, n_trials=6)
    run(again, daemon)
    check_ends(s, store)
    assert len(s.trials) == 6
    assert set(s.trials[0].params) == set(SPACE)
    if cut == "after-prune-mark":
        assert s.trials[0].state == TrialState.PRUNED
        assert store.trainer("t0001").state == "cancelled"


def test_a_pruned_trial_stays_pruned_across_a_restart(tmp_path: Path, store: Store) -> None:
    daemon = ScriptedDaemon(store, tmp_path / "trainers", nodes=4)
    s = study(tmp_path)
    first = Campaign(s, SPACE, TrialSpec(tmp_path / "t.py"), store, n_trials=8)
    for _ in range(3):
        first.step()
        daemon.step()
    # A new campaign (offsets forgotten) reads every report again: none is doubled.
    run(Campaign(study(tmp_path), SPACE, TrialSpec(tmp_path / "t.py"), store, 8), daemon)
    check_ends(s, store)
    for t in s.trials:
        assert len(t.intermediate_values) <= len(STEPS)


def test_a_campaign_that_cannot_run_is_refused_in_one_line(tmp_path: Path, store: Store) -> None:
    with pytest.raises(CampaignError, match=r"trial script .*missing.py: no such file"):
        Campaign(study(tmp_path), SPACE, TrialSpec(tmp_path / "missing.py"), store, 2)
    script = tmp_path / "t.py"
    two = optuna.create_study(directions=["minimize", "maximize"])
    with pytest.raises(CampaignError, match="2 objectives"):
        Campaign(two, SPACE, TrialSpec(script), store, 2)
    with pytest.raises(CampaignError, match=r"trial nodes 2\.\.1"):
        Campaign(study(tmp_path), SPACE, TrialSpec(script, n_min=2), store, 2)


def test_a_campaign_says_once_that_its_daemon_is_gone_and_once_that_it_is_back(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Its trials wait for the daemon (trainers that run train on), which is right; a
    wait that says nothing looks like a hang."""
    watch = DaemonWatch(store)
    with caplog.at_level(logging.INFO, logger="bftrainer.hpo.campaign"):
        for _ in range(3):
            watch.check()
        with DaemonLock(store.path.parent):
            watch.check()
            watch.check()
        watch.check()
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" ", 3)[:3] for m in said] == [
        ["no", "bftrainer", "daemon"],
        ["the", "daemon", "of"],
        ["no", "bftrainer", "daemon"],
    ], said


def test_a_campaign_outlasts_another_program_locking_its_study(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A dashboard or a script reading the study's SQLite file holds its lock; past
    SQLite's wait Optuna raised, and `bftrainer hpo` died with a traceback (seen in the
    Slurm HPO test). A step is redone from what is stored, so the campaign waits."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    quick = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 0.05}})
    s = optuna.create_study(
        storage=quick, study_name="s", sampler=optuna.samplers.RandomSampler(seed=1),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=100),
    )  # fmt: skip
    spec = TrialSpec(tmp_path / "trial.py", n_min=1, n_max=1)
    campaign = Campaign(s, SPACE, spec, store, n_trials=6)
    stop = threading.Event()

    def daemon() -> None:
        with Store.open(store.path.parent) as own:
            scripted = ScriptedDaemon(own, tmp_path / "trainers", nodes=2)
            while not stop.wait(0.02):
                scripted.step()

    busy = threading.Event()  # the campaign said it waits: the lock has been met

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "storage is busy" in record.getMessage():
                busy.set()

    def trials() -> int:
        with contextlib.closing(sqlite3.connect(tmp_path / "hpo.db", timeout=5)) as db:
            return int(db.execute("SELECT count(*) FROM trials").fetchone()[0])

    def lock() -> None:
        # Once the campaign asked for its first trial (it needs the study for the rest),
        # until it has met the lock: events, not a clock (it was 0.3 s then 1 s, which
        # a loaded machine outran: the campaign touched no storage meanwhile).
        wait_until(lambda: trials() >= 1, 60, "the campaign's first trial")
        other = sqlite3.connect(tmp_path / "hpo.db")
        other.execute("BEGIN EXCLUSIVE")  # readers and writers wait, then fail
        busy.wait(60)
        other.rollback()
        other.close()

    said = Said()
    logging.getLogger("bftrainer.hpo.campaign").addHandler(said)
    threads = [threading.Thread(target=f, daemon=True) for f in (daemon, lock)]
    for t in threads:
        t.start()
    try:
        with caplog.at_level(logging.WARNING, logger="bftrainer.hpo.campaign"):
            campaign.run(poll_s=0.02, timeout_s=60)
    finally:
        logging.getLogger("bftrainer.hpo.campaign").removeHandler(said)
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert busy.is_set()
    check_ends(s, store)


def test_a_step_the_storage_refused_loses_no_report(tmp_path: Path, store: Store) -> None:
    """The reports a refused step had read are told at the next one. The campaign read
    past them before the study took them, so a trainer whose reports all came in one
    such step ended "without a report" (seen in CI under the locking test above)."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    quick = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 0.05}})
    s = optuna.create_study(storage=quick, study_name="s")
    daemon = ScriptedDaemon(store, tmp_path / "trainers", nodes=1)
    campaign = Campaign(s, SPACE, TrialSpec(tmp_path / "t.py"), store, n_trials=1)
    campaign.step()  # asked and queued
    daemon.step()  # running
    daemon.step()  # its first report
    other = sqlite3.connect(tmp_path / "hpo.db")
    other.execute("BEGIN IMMEDIATE")  # readers go on, writers wait, then fail
    try:
        with pytest.raises(STORAGE_ERRORS) as refused:
            campaign.step()
        assert storage_busy(refused.value)
    finally:
        other.rollback()
        other.close()
    run(campaign, daemon)
    (t,) = s.trials
    assert t.state == TrialState.COMPLETE
    assert sorted(t.intermediate_values) == list(STEPS)


def test_a_storage_fault_that_waiting_cannot_mend_ends_the_campaign_at_once(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only another program's lock is waited out: a study whose table is gone (a damaged
    or foreign file) was retried for 10 minutes before its one line."""
    monkeypatch.setattr("bftrainer.hpo.campaign.STORAGE_BUSY_MAX_S", 30.0)
    s = optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="s")
    campaign = Campaign(s, SPACE, TrialSpec(tmp_path / "trial.py", n_min=1, n_max=1), store, 2)
    with sqlite3.connect(tmp_path / "hpo.db") as db:
        db.execute("DROP TABLE trials")
    with pytest.raises(CampaignError, match=r"storage failed: .*no such table: trials"):
        campaign.run(poll_s=0.01, timeout_s=60)


@pytest.mark.parametrize("poll_s", [-1.0, 0.0, math.nan, math.inf, 1e12])
def test_a_poll_interval_that_cannot_be_slept_is_refused_in_one_line(
    tmp_path: Path, store: Store, poll_s: float
) -> None:
    """From a script: a negative interval spun a core; NaN or 1e12 died in time.sleep
    with a traceback (`bftrainer hpo --poll-interval` was bounded already)."""
    campaign = Campaign(study(tmp_path), SPACE, TrialSpec(tmp_path / "trial.py"), store, 2)
    with pytest.raises(CampaignError, match=r"poll_s = .*: expected seconds > 0 and <= 3600"):
        campaign.run(poll_s=poll_s, timeout_s=5)


def test_a_second_campaign_of_a_study_is_refused(tmp_path: Path) -> None:
    s = study(tmp_path)
    refused = pytest.raises(CampaignError, match="another campaign")
    with study_lock(tmp_path, s), refused, study_lock(tmp_path, s):
        pass


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("lr", "expected NAME="),
        ("lr=float:1", "float\\|int:LOW:HIGH"),
        ("lr=float:0:1:log", "LOW > 0 with log"),
        ("n=int:a:3", "must be ints"),
        ("c=cat:", "at least one choice"),
        ("n=int:1:9007199254740993", "ints within"),  # 2**53 + 1: stored as 2**53
        # --trial comes after the parameters: a parameter named so would hide the trial.
        ("trial=float:0:1", "'trial': --trial is the runtime's own option"),
        ("trainer-dir=cat:a", "--trainer-dir is the runtime's own option"),
    ],
)
def test_a_bad_param_is_named_in_one_line(text: str, match: str) -> None:
    with pytest.raises(SpaceError, match=match):
        parse_space([text])
