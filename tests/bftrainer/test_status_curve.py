"""bftrainer status: which points of a live trainer's curve are measured, which prior."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.state import Store, ensure_state_dir
from bftrainer.trainers.agent import PolluxAgent
from bftrainer.trainers.goodput import BatchLimits
from bftrainer.trainers.learned_curve import MEASURED, PRIOR, live_curve, measured_rate_sps
from bftrainer.trainers.metrics import MetricsRecord

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def records_of_a_trainer_run_at(counts: list[int]) -> list[dict[str, object]]:
    """The records a real agent reports after steps at each of ``counts`` nodes."""
    agent = PolluxAgent(
        "t1", BatchLimits(base_batch_size=64, max_batch_size=4096, max_local_bsz=512)
    )
    out = []
    for n in counts:
        agent.set_config(nodes=n, local_bsz=64)
        agent.observe_steps(20, 0.10 + 0.01 * n)
        out.append(agent.metrics().to_dict())
    return out


def test_live_curve_labels_the_counts_the_trainer_ran_at() -> None:
    assert live_curve([], 8) is None
    curve = live_curve(records_of_a_trainer_run_at([1, 2]), 8)
    assert curve is not None
    sources = {p["nodes"]: p["source"] for p in curve}
    assert sources[1] == sources[2] == MEASURED
    assert {n for n, s in sources.items() if s == PRIOR} == {3, 4, 5, 6, 7, 8} & set(sources)
    assert all(p["throughput_sps"] > 0 for p in curve)


def test_status_shows_measured_and_prior_points(tmp_path: Path) -> None:
    state = ensure_state_dir(tmp_path / "state")
    with Store.open(state) as store:
        ran = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        for rec in records_of_a_trainer_run_at([1, 2]):
            store.add_metric(ran, rec, now_s=1.0)
        waiting = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
    result = CliRunner().invoke(cli, ["status", "--json", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    trainers = {t["id"]: t for t in json.loads(result.output)["trainers"]}
    curve = trainers[ran]["curve"]
    assert [p["nodes"] for p in curve if p["source"] == MEASURED] == [1, 2]
    assert trainers[waiting]["curve"] is None  # no fit yet: the allocator's prior
    text = CliRunner().invoke(cli, ["status", "--state-dir", str(state)]).output
    assert "measured 1,2;" in text


def test_the_shown_rates_are_the_daemons_without_numpy(tmp_path: Path) -> None:
    """status reads the rates from the stored records' fields: the same as the daemon's
    (measured_rate_sps of the parsed record), and numpy is never imported for them (it
    was, through the records' models: 0.25 s for a status with running trainers)."""
    records = records_of_a_trainer_run_at([1, 2, 4])
    parsed = [MetricsRecord.from_dict(r) for r in records]
    curve = live_curve(records, 8)
    assert curve is not None
    shown = {p["nodes"]: p["throughput_sps"] for p in curve if p["source"] == MEASURED}
    assert shown == {r.nodes: measured_rate_sps(r) for r in parsed}
    state = ensure_state_dir(tmp_path / "state")
    with Store.open(state) as store:
        ran = store.submit(str(EXAMPLE), n_max=8, backend="torchrun")
        store.set_trainer_state(ran, "running")
        for rec in records:
            store.add_metric(ran, rec, now_s=1.0)
    code = (
        "import sys; from bftrainer.cli import main; sys.argv = ['bftrainer', 'status', "
        f"'--state-dir', {str(state)!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('numpy' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and "measured 1,2,4;" in done.stdout, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout


def test_a_stored_record_the_daemon_would_not_have_parsed_measures_nothing() -> None:
    good = {"nodes": 2, "replicas_per_node": 1, "local_bsz": 64, "accum_steps": 0}
    for bad in (
        {"local_bsz": 0},
        {"replicas_per_node": 0},
        {"nodes": True},
        {"accum_steps": -1},
        {"mean_step_time_s": 0.0},
        {"mean_step_time_s": 5e-324},  # a rate past every float
        {"mean_step_time_s": "0.1"},
    ):
        record = {**good, "mean_step_time_s": 0.1, **bad}
        assert live_curve([record], 4) is None, bad
    assert live_curve([{**good, "mean_step_time_s": 0.1}], 4) is not None
