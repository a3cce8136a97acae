"""The daemon learns with the replay's rule: the curve its loop plans on for a trainer
is ``learned_curve`` of the rates the trainer measured, with the replay's default prior,
and a trainer that measured nothing yet is valued at the best rate per node measured
(bftrainer/service/curves.py, docs/allocator.md)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.daemon import SubmissionQueue
from bftrainer.daemon.live_driver import LiveDriver
from bftrainer.loop import Arrival, CurveReport, PolicyInputs, TrainerState
from bftrainer.loop.churn import Churn
from bftrainer.loop.jobs import job_of, prior_curve
from bftrainer.policies.config import Config
from bftrainer.policies.registry import make_policy
from bftrainer.replay.learning import LearningOptions
from bftrainer.service.curves import LiveCurves
from bftrainer.state import Store, ensure_state_dir
from bftrainer.trainers.launch.base import Launcher, LaunchError
from bftrainer.trainers.learned_curve import MEASURED, learned_curve, live_curve
from bftrainer.trainers.metrics import MetricsRecord
from tests.bftrainer.test_live_restarts import start_on
from tests.bftrainer.test_status_curve import EXAMPLE, records_of_a_trainer_run_at


def rates_of(records: list[dict[str, object]]) -> dict[int, float]:
    """What each record measured, by hand: total batch over mean step time."""
    out = {}
    for rec in records:
        r = MetricsRecord.from_dict(rec)
        assert r.mean_step_time_s is not None
        out[r.nodes] = r.nodes * r.replicas_per_node * r.local_bsz / r.mean_step_time_s
    return out


def test_the_daemons_curve_is_the_replays_rule_on_the_measured_rates(tmp_path: Path) -> None:
    with Store.open(ensure_state_dir(tmp_path / "state")) as store:
        tid = store.submit(str(EXAMPLE), n_max=16, backend="torchrun")
        job = job_of(store.trainer(tid))
        curves = LiveCurves(store)
        records = records_of_a_trainer_run_at([1, 2])
        for rec in records:
            curve = curves.measured(job, MetricsRecord.from_dict(rec))
    rates = rates_of(records)
    replay = learned_curve(rates, 1, 16, unmeasured_sps=1.0, growth=LearningOptions().growth)
    assert curve == replay.points
    assert max(n for n, _ in curve if n < 16) == 4, "capped at 2x the largest count run"
    # bftrainer status shows the same curve, labelled
    shown = live_curve(records, 16)
    assert shown is not None
    assert [(p["nodes"], p["throughput_sps"]) for p in shown] == [(int(n), v) for n, v in curve]
    assert [p["nodes"] for p in shown if p["source"] == MEASURED] == [1, 2]
    assert curves.best_per_node_sps == max(v / n for n, v in rates.items())


def test_a_new_trainer_is_not_starved_by_the_prior(tmp_path: Path) -> None:
    """Under the throughput objective, 1 sample/s per node (the old prior) is worth
    nothing beside a trainer that measured hundreds: the new one never ran, so never
    measured. Valued at the best rate per node measured, it gets a node."""
    with Store.open(ensure_state_dir(tmp_path / "state")) as store:
        ran = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        new = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        curves = LiveCurves(store)
        running = TrainerState(job_of(store.trainer(ran)), nodes=("n1", "n2", "n3", "n4"))
        for rec in records_of_a_trainer_run_at([1, 2]):
            learned = curves.measured(running.job, MetricsRecord.from_dict(rec))
        assert learned is not None
        running.reported_curves["throughput"] = learned
        policy = make_policy(Config())
        pool = ("n1", "n2", "n3", "n4")

        def nodes_of_new(trainer: TrainerState) -> int:
            decision = policy.decide(PolicyInputs(pool, [running, trainer], Churn()))
            return len(decision.nodes.get(new, ()))

        old = job_of(store.trainer(new))
        assert old.curve == prior_curve(8), "job_of alone: the unit prior"
        assert nodes_of_new(TrainerState(old)) == 0, "starved at 1 sample/s per node"
        assert nodes_of_new(TrainerState(curves.prior_job(old))) >= 1


def test_waiting_trainers_hear_of_a_higher_rate_and_a_restart_keeps_it(tmp_path: Path) -> None:
    state = ensure_state_dir(tmp_path / "state")
    with Store.open(state) as store:
        ran = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        # The level alone (the trainers share a model: peers would add what ran measured;
        # test_a_trial_plans_on_what_its_peers_measured).
        curves = LiveCurves(store, prior="optimistic")
        queue = SubmissionQueue(store, curves=curves)
        first = queue.poll(0.0).inputs
        assert [type(i) for i in first] == [Arrival]
        assert first[0].job.curve == ((1.0, 1.0), (8.0, 1.0)), "nothing measured: 1/s to n_min"
        waiting = store.submit(str(EXAMPLE), n_min=2, n_max=8, backend="torchrun")
        queue.poll(1.0)
        for rec in records_of_a_trainer_run_at([1]):
            curves.measured(job_of(store.trainer(ran)), MetricsRecord.from_dict(rec))
        level = curves.best_per_node_sps
        assert level > 100
        restated = [i for i in queue.poll(2.0).inputs if isinstance(i, CurveReport)]
        assert restated == [
            CurveReport(waiting, "throughput", ((2.0, 2 * level), (8.0, 2 * level)))
        ]
        assert not queue.poll(3.0).inputs, "told once"
    # A new daemon on the same store gives a new trainer the same level at once.
    with Store.open(state) as store:
        late = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        again = LiveCurves(store, prior="optimistic")
        arrived = SubmissionQueue(store, curves=again).poll(0.0).inputs
        jobs = {i.job.id: i.job for i in arrived if isinstance(i, Arrival)}
        assert jobs[late].curve == ((1.0, level), (8.0, level))


@pytest.mark.slow
def test_a_live_trainers_reports_reach_the_loop_as_the_rules_curve(tmp_path: Path) -> None:
    """A real torchrun trainer of the example, run by the daemon's driver here: the
    throughput curve the driver reports to the loop is the one status shows."""
    state_dir = ensure_state_dir(tmp_path / "state")
    store = Store.open(state_dir)
    tid = store.submit(str(EXAMPLE), ("--report-every-s", "0.5"), backend="torchrun", n_max=4)
    trainer = TrainerState(job_of(store.trainer(tid)), nodes=("n0",))
    driver = LiveDriver(store, state_dir, report_every_s=0.5)
    try:
        start_on(driver, trainer)
        deadline = time.monotonic() + 120
        reports: list[CurveReport] = []
        while not reports:
            assert time.monotonic() < deadline, "timed out waiting for a throughput report"
            progress = driver.advance([trainer], time.time())
            reports = [
                r
                for r in progress.reports
                if isinstance(r, CurveReport) and r.metric == "throughput"
            ]
            time.sleep(0.2)
    finally:
        with contextlib.suppress(LaunchError):
            Launcher.attach(state_dir / "trainers" / tid).kill()
    shown = live_curve((m.record for m in store.metrics(tid)), 4)
    assert shown is not None
    assert reports[-1].curve == tuple((float(p["nodes"]), p["throughput_sps"]) for p in shown)
    assert shown[0]["source"] == MEASURED
    assert reports[-1].curve[-1][0] == 4.0 and max(n for n, _ in reports[-1].curve[:-1]) <= 2


def test_status_shows_the_daemons_curve_for_a_trainer_with_a_minimum(tmp_path: Path) -> None:
    """n_min sets the cap of a trainer that ran below it: status and daemon agree."""
    state = ensure_state_dir(tmp_path / "state")
    records = records_of_a_trainer_run_at([1])
    with Store.open(state) as store:
        tid = store.submit(str(EXAMPLE), n_min=4, n_max=16, backend="torchrun")
        store.add_metric(tid, records[0], now_s=1.0)
        record = MetricsRecord.from_dict(records[0])
        daemon = LiveCurves().measured(job_of(store.trainer(tid)), record)
    result = CliRunner().invoke(cli, ["status", "--json", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    (shown,) = json.loads(result.output)["trainers"]
    assert daemon is not None and [n for n, _ in daemon] == [1.0, 2.0, 4.0, 16.0]
    assert [(p["nodes"], p["throughput_sps"]) for p in shown["curve"]] == [
        (int(n), pytest.approx(v)) for n, v in daemon
    ]


def test_a_trial_plans_on_what_its_peers_measured(tmp_path: Path) -> None:
    """Trials of one search share a model (the script): a new one is valued at the rates
    its peers measured, at the counts they ran (the replay's ``--prior peers``, the
    default); another model's trainer, or the ``optimistic`` prior, has none of them."""
    other = tmp_path / "other.py"
    other.write_text("")
    with Store.open(ensure_state_dir(tmp_path / "state")) as store:
        ran = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        new = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        stranger = store.submit(str(other), n_max=8, backend="torchrun")
        records = records_of_a_trainer_run_at([1, 2])
        peers, optimistic = LiveCurves(store), LiveCurves(prior="optimistic")
        for curves in (peers, optimistic):
            for rec in records:
                curves.measured(job_of(store.trainer(ran)), MetricsRecord.from_dict(rec))
        rates = rates_of(records)
        growth = LearningOptions().growth
        fresh = peers.prior_job(job_of(store.trainer(new))).curve
        # As if it had measured what its peer did (geometric means: equal to round-off).
        same = learned_curve(rates, 1, 8, unmeasured_sps=1.0, growth=growth).points
        assert [n for n, _ in fresh] == [n for n, _ in same]
        assert [v for _, v in fresh] == pytest.approx([v for _, v in same], rel=1e-12)
        level = peers.best_per_node_sps
        nothing = learned_curve({}, 1, 8, unmeasured_sps=level, growth=growth).points
        assert peers.prior_job(job_of(store.trainer(stranger))).curve == nothing
        assert optimistic.prior_job(job_of(store.trainer(new))).curve == nothing
        assert fresh != nothing
    with pytest.raises(ValueError, match="prior 'profile'"):
        LiveCurves(prior="profile")
