"""`bftrainer allocate` refuses, in one line with exit code 2, a curve the speedup
objective or fair-share speedup cannot divide by, and a slots_per_node above the limit
of everywhere else: before, a traceback (the DP's NaN table, slot_packing's overflow),
or exit 0 with a trainer starved or a null objective."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bftrainer

ROOT = Path(__file__).resolve().parents[2]


def trainer(tid: str, curve: list[list[float]]) -> dict[str, Any]:
    return {
        "id": tid,
        "n_min": 1,
        "n_max": 4,
        "rescale_up": 1,
        "rescale_down": 1,
        "curve": curve,
    }


LINEAR = trainer("t2", [[1, 1], [4, 4]])
POOL = ["a", "b", "c", "d"]
CASES = {
    "speedup-1e-300": (
        {
            "pool": POOL,
            "objective": "speedup",
            "trainers": [trainer("t1", [[1, 1e-300], [4, 1e12]]), LINEAR],
        },
        "trainer 't1': the speedup objective divides its curve by its rate at 1 node, 1e-300",
    ),
    "speedup-5e-324-alone": (
        {"pool": POOL, "objective": "speedup", "trainers": [trainer("t1", [[1, 5e-324], [4, 4]])]},
        "trainer 't1': the speedup objective divides its curve by its rate at 1 node, 5e-324",
    ),
    "slots-1e20": (
        {"pool": POOL, "slots_per_node": 10**20, "trainers": [trainer("t1", [[1, 10], [4, 40]])]},
        "slots_per_node is 100000000000000000000, expected 1 to 1024",
    ),
    "slots-1025": (
        {"pool": POOL, "slots_per_node": 1025, "trainers": [trainer("t1", [[1, 10], [4, 40]])]},
        "slots_per_node is 1025, expected 1 to 1024",
    ),
}


def allocate(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return bftrainer("allocate", path, "--json", *args, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("solver", ["dp", "highs"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_in_one_line_with_exit_2(tmp_path: Path, case: str, solver: str) -> None:
    problem, message = CASES[case]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(problem))
    done = allocate(path, "--solver", solver)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: {path}: "), lines[0]
    assert message in lines[0], lines[0]
