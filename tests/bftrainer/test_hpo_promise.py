"""Promise, live: a campaign marks each trial with the rungs its pruner passed it, in the
daemon's store, and the daemon's milp weighs it by ``search_promise ** rungs`` when
``[daemon] search_promise`` is on (off by default: every weight 1). A real store and a
real Optuna study, the daemon's trainers scripted (test_hpo_campaign.py); the daemon's
own queue and policy (``SubmissionQueue``, ``own_policy``) read the store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from bftrainer.common.promise import promise_error, promise_weight, rungs_passed
from bftrainer.daemon import DaemonConfig, load_daemon_config
from bftrainer.daemon.daemon import own_policy
from bftrainer.daemon.queue import SubmissionQueue
from bftrainer.hpo import ATTR_PRUNED, Campaign, TrialSpec, trainers_by_trial
from bftrainer.loop import Arrival, PolicyInputs, TrainerState
from bftrainer.policies.config import ConfigError
from bftrainer.policies.registry import MilpPolicy
from bftrainer.state import Store
from tests.bftrainer.test_hpo_campaign import SPACE, ScriptedDaemon, study

POOL = ("n0", "n1", "n2")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "state")
    (tmp_path / "trial.py").write_text("")
    yield s
    s.close()


def inputs_of(queue: SubmissionQueue) -> PolicyInputs:
    """What the loop hands the policy after the queue's poll: its trainers, on the pool."""
    polled = queue.poll(0.0)
    trainers = [TrainerState(i.job) for i in polled.inputs if isinstance(i, Arrival)]
    return PolicyInputs(POOL, trainers)


def weights(policy: object, inputs: PolicyInputs) -> dict[str, float]:
    assert isinstance(policy, MilpPolicy)
    return {t.id: t.weight for t in policy.problem(inputs).trainers}


def test_a_promoted_trial_is_marked_in_the_store_and_weighed_only_when_on(
    tmp_path: Path, store: Store
) -> None:
    daemon = ScriptedDaemon(store, tmp_path / "trainers", nodes=3)
    s = study(tmp_path)  # successive halving, first rung at 100 samples
    spec = TrialSpec(tmp_path / "trial.py", n_min=1, n_max=2)
    campaign = Campaign(s, SPACE, spec, store, n_trials=12)

    def marked_and_not() -> bool:
        unfinished = [r for r in store.trainers() if not r.finished]
        return any(r.rungs for r in unfinished) and any(not r.rungs for r in unfinished)

    for _ in range(100):
        campaign.step()
        if marked_and_not():
            break
        daemon.step()
    assert marked_and_not(), [(r.id, r.state, r.rungs) for r in store.trainers()]
    # The mark is the rungs Optuna's pruner recorded on a trial it let on (one rule,
    # shared with the replay); a pruned one, RUNNING until its trainer ends, is not marked.
    by_trial = trainers_by_trial(store)
    for ft in s.get_trials(states=(optuna.trial.TrialState.RUNNING,)):
        row = by_trial[f"s#{ft.number}"]
        if ATTR_PRUNED in ft.user_attrs:
            assert row.cancel_requested
            continue
        assert row.rungs == rungs_passed(ft.system_attrs), (ft.number, ft.system_attrs)
    rungs = {r.id: r.rungs for r in store.trainers() if not r.finished}

    # Off (the default): every weight 1, marks or not.
    off = own_policy(DaemonConfig(), SubmissionQueue(store))
    assert set(weights(off, inputs_of(SubmissionQueue(store))).values()) == {1.0}
    # On: search_promise ** rungs, read from the store by the daemon's own queue.
    queue = SubmissionQueue(store, promise=3.0)
    on = own_policy(DaemonConfig(search_promise=3.0), queue)
    assert weights(on, inputs_of(queue)) == {tid: 3.0**n for tid, n in rungs.items()}
    assert max(rungs.values()) >= 1  # some weight is above 1

    # Durable: a daemon started again on the same state reads the same marks.
    store.close()
    with Store.open(tmp_path / "state") as again:
        queue = SubmissionQueue(again, promise=3.0)
        on = own_policy(DaemonConfig(search_promise=3.0), queue)
        assert weights(on, inputs_of(queue)) == {tid: 3.0**n for tid, n in rungs.items()}


def test_a_weighed_trial_gets_the_node_two_alike_trials_want(tmp_path: Path, store: Store) -> None:
    """Two trials alike but for the mark want the one node: milp gives it to the marked
    one when promise is on, whichever came first; off, the mark changes nothing."""
    script = tmp_path / "trial.py"
    first = store.submit(script, ["--trial", "s#0"])
    marked = store.submit(script, ["--trial", "s#1"])

    def decide(config: DaemonConfig) -> dict[str, tuple[str, ...]]:
        queue = SubmissionQueue(store, promise=config.search_promise)
        inputs = inputs_of(queue)
        return dict(own_policy(config, queue).decide(PolicyInputs(("n0",), inputs.trainers)).nodes)

    unmarked = decide(DaemonConfig())
    assert unmarked == {first: ("n0",), marked: ()}  # alike: the first comes first
    store.set_rungs(marked, 2)
    assert decide(DaemonConfig(search_promise=2.0)) == {first: (), marked: ("n0",)}
    assert decide(DaemonConfig()) == unmarked


def test_the_option_is_the_replays_and_is_checked(tmp_path: Path) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text("[daemon]\nsearch_promise = 4\n")
    assert load_daemon_config(config, {}).search_promise == 4.0
    assert DaemonConfig().search_promise == 1.0  # off by default
    config.write_text("[daemon]\nsearch_promise = 0.5\n")
    with pytest.raises(ConfigError, match=r"\[daemon\] search_promise = 0.5: expected a number"):
        load_daemon_config(config, {})
    config.write_text('[policy]\npolicy = "equal"\n[daemon]\nsearch_promise = 2\n')
    with pytest.raises(ConfigError, match="means nothing without policy = milp"):
        load_daemon_config(config, {})
    assert promise_error(True) is not None and promise_error(100) is None
    assert promise_weight(2.0, 3) == 8.0 and promise_weight(5.0, 0) == 1.0


def test_a_mark_is_a_whole_number_of_rungs(store: Store, tmp_path: Path) -> None:
    tid = store.submit(tmp_path / "trial.py", [])
    assert store.trainer(tid).rungs == 0
    with pytest.raises(ValueError, match="rungs -1"):
        store.set_rungs(tid, -1)
    assert store.set_rungs(tid, 2).rungs == 2
