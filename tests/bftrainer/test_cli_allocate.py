"""The `bftrainer allocate` contract: JSON out, one-line errors with exit code 2."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "problem.json"


def run(args: list[str], stdin: str | None = None) -> Any:
    return CliRunner().invoke(cli, args, input=stdin)


def test_json_output_is_a_feasible_allocation_of_the_example() -> None:
    result = run(["allocate", str(EXAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) >= {"allocation", "objective", "status", "solve_s"}
    assert out["status"] == "optimal"
    nodes = [n for ns in out["allocation"].values() for n in ns]
    assert len(nodes) == len(set(nodes))
    assert "n11" not in nodes  # vgg16's node n11 is not in the pool: it left


def test_solvers_agree_through_the_cli() -> None:
    objectives = set()
    for args in (["--solver", "dp"], ["--solver", "cbc"], ["--formulation", "node"]):
        result = run(["allocate", str(EXAMPLE), "--json", *args])
        assert result.exit_code == 0, result.output
        objectives.add(round(json.loads(result.output)["objective"], 6))
    assert len(objectives) == 1


def test_table_output_names_every_trainer() -> None:
    result = run(["allocate", str(EXAMPLE)])
    assert result.exit_code == 0
    for tid in ("resnet18", "vgg16", "alexnet"):
        assert tid in result.output
    assert "status optimal" in result.output


BASE = json.loads(EXAMPLE.read_text())


def _mutate(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_mutate(["colour"], "red"), "unknown field 'colour'"),
        (
            _mutate(["trainers", 0, "speed"], 3),
            "(id 'resnet18'): unknown field 'speed'",
        ),
        (_mutate(["trainers", 1, "n_min"], 9), "trainers[1] (id 'vgg16'): n_min 9 > n_max 8"),
        (_mutate(["trainers", 2, "n_max"], 6), "curve ends at 4"),
        (_mutate(["trainers", 0, "rescale_up"], -1), "rescale_up is -1"),
        (_mutate(["trainers", 0, "rescale_down"], float("nan")), "rescale_down is nan"),
        (_mutate(["t_fwd"], float("inf")), "t_fwd is inf"),
        (_mutate(["trainers", 2, "nodes"], ["n1"]), "node 'n1' is held by two trainers"),
        (_mutate(["pool"], ["n1", "n1"]), "pool lists node 'n1' twice"),
        (_mutate(["trainers", 0, "curve"], [[2, 5], [1, 6]]), "curve node counts must increase"),
        (_mutate(["trainers", 0, "n_min"], True), "n_min is True, expected an integer"),
        (_mutate(["objective"], "joy"), "objective 'joy'"),
    ],
)
def test_bad_input_exits_2_with_a_one_line_error(doc: dict[str, Any], message: str) -> None:
    result = run(["allocate", "-"], stdin=json.dumps(doc))
    assert result.exit_code == 2
    error_lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(error_lines) == 1, result.output
    assert message in error_lines[0]


def test_invalid_json_exits_2() -> None:
    result = run(["allocate", "-"], stdin="{not json")
    assert result.exit_code == 2
    assert "not valid JSON" in result.output


def test_version_and_help() -> None:
    assert run(["--version"]).output.startswith("bftrainer, version ")
    help_text = run(["--help"]).output
    assert "allocate" in help_text
    assert "--log-format" in help_text


def allocate_json(problem: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bftrainer", "allocate", str(problem), "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("slots", [None, 1])
def test_a_spread_curve_with_whole_nodes_is_refused(tmp_path: Path, slots: int | None) -> None:
    """A spread_curve values slots spread over more nodes than needed: with whole nodes
    (slots_per_node 1, said or not) it was accepted and ignored."""
    doc = _mutate(["trainers", 0, "spread_curve"], [[1, 4000], [8, 30000]])
    if slots is not None:
        doc["slots_per_node"] = slots
    problem = tmp_path / "p.json"
    problem.write_text(json.dumps(doc))
    done = allocate_json(problem)
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().splitlines() == [
        f"Error: {problem}: trainer 'resnet18': spread_curve means nothing without "
        "slots_per_node > 1"
    ]
    doc["slots_per_node"] = 2
    problem.write_text(json.dumps(doc))
    done = allocate_json(problem)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"pool": ["n1"], "trainers": [], "pool": ["n2"]}', "pool"),
        (
            '{"pool": ["n1"], "trainers": [{"id": "a", "n_min": 1, "n_max": 1, "n_min": 2, '
            '"rescale_up": 0, "rescale_down": 0, "curve": [[1, 1]]}]}',
            "n_min",
        ),
    ],
)
def test_a_key_given_twice_is_refused(tmp_path: Path, text: str, key: str) -> None:
    """The last of a repeated key won without a word: a second pool replaced the first."""
    problem = tmp_path / "p.json"
    problem.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "bftrainer", "allocate", str(problem)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().splitlines() == [
        f"Error: {problem}: not a usable JSON value: key {key!r} appears twice in one object"
    ]
