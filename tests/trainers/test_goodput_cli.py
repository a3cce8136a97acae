"""`bftrainer goodput fit`: parameters, RMSLE and predictions; one-line errors, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.trainers.throughput import ThroughputParams, predict_step_time

TRUE = ThroughputParams(0.05, 0.002, 0.0, 0.0, 0.1, 0.01, 1.5)


def write_obs(path: Path) -> list[tuple[int, int, int, float]]:
    rows = []
    for nodes in (1, 2, 4, 8):
        for bsz in (16, 64):
            for accum in (0, 1):
                rows.append(
                    (nodes, bsz, accum, float(predict_step_time(TRUE, nodes, nodes, bsz, accum)))
                )
    path.write_text(
        "nodes,local_bsz,accum_steps,step_time_s\n"
        + "".join(f"{n},{m},{s},{t!r}\n" for n, m, s, t in rows)
    )
    return rows


def test_json_output_has_params_rmsle_and_one_prediction_per_row(tmp_path: Path) -> None:
    rows = write_obs(tmp_path / "obs.csv")
    result = CliRunner().invoke(cli, ["goodput", "fit", str(tmp_path / "obs.csv"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {
        "params",
        "rmsle",
        "predicted_step_time_s",
        "free_params",
        "distinct_configs",
        "under_determined",
    }
    assert out["under_determined"] is False and out["distinct_configs"] == 16
    assert set(out["params"]) == set(TRUE.to_dict())
    assert out["rmsle"] < 0.01
    assert len(out["predicted_step_time_s"]) == len(rows)
    for (_, _, _, t), p in zip(rows, out["predicted_step_time_s"], strict=True):
        assert p == pytest.approx(t, rel=0.02)


def test_text_output_shows_a_table(tmp_path: Path) -> None:
    rows = write_obs(tmp_path / "obs.csv")
    result = CliRunner().invoke(cli, ["goodput", "fit", str(tmp_path / "obs.csv")])
    assert result.exit_code == 0, result.output
    assert "RMSLE" in result.output and "alpha_grad_s" in result.output
    table = [ln for ln in result.output.splitlines() if ln.endswith("%") and ln[:5].strip()]
    assert [int(ln.split()[0]) for ln in table if ln.split()[0].isdigit()] == [r[0] for r in rows]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nodes,local_bsz,step_time_s\n1,2,3\n", "obs.csv:1: missing column(s) accum_steps"),
        ("nodes,local_bsz,accum_steps,step_time_s\n1,8,0,slow\n", "obs.csv:2: step_time_s"),
        ("nodes,local_bsz,accum_steps,step_time_s\n0,8,0,0.1\n", "obs.csv:2: nodes must be >= 1"),
    ],
)
def test_bad_input_exits_2_naming_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "obs.csv").write_text(text)
    result = CliRunner().invoke(cli, ["goodput", "fit", str(tmp_path / "obs.csv")])
    assert result.exit_code == 2
    assert match in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["goodput", "fit", str(tmp_path / "none.csv")])
    assert result.exit_code == 2


@pytest.mark.parametrize(
    "rows",
    [
        ["1,32,0,0.5"],  # one observation
        ["1,32,0,0.5", "1,32,0,0.52", "1,32,0,0.49"],  # repeats of one configuration
        ["1,32,0,0.5", "2,32,0,0.3"],  # two configurations, more free parameters
    ],
)
def test_an_under_determined_fit_says_so(tmp_path: Path, rows: list[str]) -> None:
    path = tmp_path / "obs.csv"
    path.write_text("nodes,local_bsz,accum_steps,step_time_s\n" + "\n".join(rows) + "\n")
    result = CliRunner().invoke(cli, ["goodput", "fit", str(path)])
    assert result.exit_code == 0, result.output
    assert "under-determined fit" in result.stderr
    result = CliRunner().invoke(cli, ["goodput", "fit", str(path), "--json"])
    out = json.loads(result.stdout)
    assert out["under_determined"] is True
    assert out["distinct_configs"] <= out["free_params"]


@pytest.mark.parametrize(
    ("column", "value"),
    [("nodes", "1e20"), ("local_bsz", "1e12"), ("accum_steps", "1e9"), ("step_time_s", "1e9")],
)
def test_values_beyond_any_real_step_are_one_line(tmp_path: Path, column: str, value: str) -> None:
    """Issue 19: 1e20 nodes was fitted and reported with errors of 1e14 %."""
    rows = {"nodes": "1", "local_bsz": "16", "accum_steps": "0", "step_time_s": "0.1"}
    path = tmp_path / "obs.csv"
    path.write_text(
        "nodes,local_bsz,accum_steps,step_time_s\n"
        + ",".join({**rows, column: value}.values())
        + "\n"
        + "2,16,0,0.12\n"
    )
    result = CliRunner().invoke(cli, ["goodput", "fit", str(path)])
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
    assert "obs.csv:2" in line and column in line and "more than any real step" in line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "nodes,local_bsz,accum_steps,step_time_s\n1,16,0,1e-320\n2,16,0,1e-320\n",
            "obs.csv:2: step_time_s is 1e-320, less than any real step (1e-06 s)",
        ),
        (
            "nodes,local_bsz,accum_steps,step_time_s,nodes\n1,16,0,0.1,2\n2,16,0,0.12,4\n",
            "obs.csv:1: column 'nodes' appears more than once in header",
        ),
    ],
    ids=["subnormal step", "repeated column"],
)
def test_a_subnormal_step_or_a_repeated_column_is_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    """A subnormal step time was fitted and shown with an error of +inf %; a header that
    repeats a column was read with the last one winning (the trace reader's old fault)."""
    path = tmp_path / "obs.csv"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", "goodput", "fit", str(path)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
