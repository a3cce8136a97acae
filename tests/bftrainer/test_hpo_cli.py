"""`bftrainer hpo`'s bad input: one line naming what is wrong, nothing queued."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.state import Store


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--param", "lr=float:1:0"], "need LOW <= HIGH"),
        (["--param", "lr=exp:1:2"], "expected lr=float|int:LOW:HIGH"),
        (["--param", "lr=float:0.1:1", "--param", "lr=int:1:2"], "--param lr is given twice"),
        (["--param", "lr=float:0.1:1", "--min-nodes", "3"], "--max-nodes 1 is below"),
        (["--param", "lr=float:0.1:1"], "no bftrainer daemon is running"),
        (["--param", "opt=cat:sgd,sgd"], "choice 'sgd' is given twice"),
        (["--param", "lr=float:0.1:1", "--study", ""], "--study '': give a printable name"),
        (["--param", "lr=float:0.1:1", "--study", "a\nb"], "--study 'a\\nb': give a"),
        (["--param", "lr=float:0.1:1", "--study", "s#1"], "without '#'"),
    ],
)
def test_bad_input_is_one_line_and_queues_nothing(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    state = tmp_path / "state"
    Store.open(state).close()
    script = tmp_path / "trial.py"
    script.write_text("")
    args = ["hpo", str(script), "--study", "s", "--n-trials", "2", "--state-dir", str(state)]
    result = CliRunner().invoke(cli, [*args, *extra])
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    with Store.open(state) as store:
        assert store.trainers() == []


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_a_restarted_campaign_does_not_propose_the_first_trials_again(
    tmp_path: Path, name: str
) -> None:
    """`bftrainer hpo --seed S` killed and started again: the seeded sampler goes on past
    the trials the study holds (a fresh one repeated the first four trials' parameters
    in the e2e run of 2026-11-29)."""
    import optuna
    from optuna.distributions import FloatDistribution

    from bftrainer.cli.hpo import make_sampler, resumed_sampler

    space = {"lr": FloatDistribution(1e-3, 1.0, log=True)}
    storage = f"sqlite:///{tmp_path / 'hpo.db'}"

    def opened() -> optuna.Study:
        study = optuna.create_study(
            storage=storage, study_name="s", sampler=make_sampler(name, 7), load_if_exists=True
        )
        study.sampler = resumed_sampler(study, name, 7)
        return study

    first = [opened().ask(space).params["lr"] for _ in range(1)]
    study = opened()
    first += [study.ask(space).params["lr"] for _ in range(3)]
    again = opened()
    later = [again.ask(space).params["lr"] for _ in range(4)]
    assert not set(first) & set(later), (first, later)
    # The cause, which the resumed seed undoes: the same seed draws the same sequence.
    fresh = optuna.create_study(sampler=make_sampler(name, 7))
    assert fresh.ask(space).params["lr"] == first[0]


@pytest.mark.parametrize(
    "extra",
    [
        ["--pruner", "none", "--min-resource", "100"],
        ["--pruner", "median", "--reduction-factor", "4"],
    ],
)
def test_a_rung_option_without_a_rung_pruner_is_refused(tmp_path: Path, extra: list[str]) -> None:
    """It was accepted and ignored: the campaign ran with no rungs at all."""
    script = tmp_path / "trial.py"
    script.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", "hpo", str(script), "--study", "s", "--n-trials",
         "2", "--param", "lr=float:0.1:1", "--state-dir", str(tmp_path / "state"), *extra],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"Error: {extra[2]} means nothing without --pruner asha or hyperband"
    ]
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--storage", "bogus://x"], "--study 's' in bogus://x: Can't load plugin"),
        (["--storage", "sqlite:////no/such/dir/x.db"], "unable to open database file"),
        (["--direction", "minimize"], "--study 's' exists and maximizes its value; give"),
    ],
)
def test_a_storage_or_a_study_it_cannot_run_is_one_line(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    """With a daemon up, these were tracebacks (a bad URL), or a silent wrong answer: a
    study that maximizes run on as asked to minimize (Optuna loads it as it was)."""
    import optuna

    from bftrainer.state.lock import DaemonLock

    state = tmp_path / "state"
    Store.open(state).close()
    optuna.create_study(
        storage=f"sqlite:///{state / 'hpo.db'}", study_name="s", direction="maximize"
    )
    script = tmp_path / "trial.py"
    script.write_text("")
    lock = DaemonLock(state)  # as a running daemon holds it
    lock.acquire()
    try:  # a command that runs instead of refusing waits for trials: the timeout fails it
        args = ["hpo", str(script), "--study", "s", "--n-trials", "2", "--state-dir", str(state)]
        result = subprocess.run(
            [sys.executable, "-m", "bftrainer", *args, "--param", "lr=float:0.1:1", *extra],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        lock.release()
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    with Store.open(state) as store:
        assert store.trainers() == []
