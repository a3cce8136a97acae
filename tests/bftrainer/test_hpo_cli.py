"""`bftrainer hpo`'s bad input: one line naming what is wrong, nothing queued."""

from __future__ import annotations

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
