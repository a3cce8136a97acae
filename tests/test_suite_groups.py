"""The suite's xdist groups hold: each group's tests run on one worker, one at a time.

`make test` runs `pytest -n N --dist loadgroup`, and tests/conftest.py puts the tests whose
trainers train flat out in groups (`TORCH_GROUPS`). Nothing fails when a group is not
honoured: its tests just overlap and starve each other, and Horovod's and Gloo's timeouts
fire now and then. That happened unseen: pytest-xdist 3.8.0 marks a grouped test by
changing a field of its id that pytest 9.2.0 no longer reads (pytest-xdist issue #1386),
and our hook marked the tests after xdist had looked; no group held. This runs the
suite's hook on a generated suite, as `make test` runs pytest.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO, TORCH_GROUPS

TRIVIAL_TESTS = """
import pytest

@pytest.mark.parametrize("i", range(4))
def test_step(i):
    pass
"""


def test_each_group_runs_on_one_worker(tmp_path: Path) -> None:
    grouped = sorted({group: stem for stem, group in TORCH_GROUPS.items()}.values())
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # The suite's own hook, imported whole; the modules take the grouped modules' names.
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    for stem in [*grouped, "test_ungrouped"]:
        (tmp_path / f"{stem}.py").write_text(TRIVIAL_TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    xdist = ["-n", "3", "--dist", "loadgroup"]  # as `make test` runs it
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *xdist, "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module, suffix in re.findall(
        r"^\[(gw\d+)\] .*PASSED (\w+)\.py::test_step\[\d\](\S*)", run.stdout, re.M
    ):
        workers[module].add(worker)
        if module in TORCH_GROUPS:
            assert suffix == f"@{TORCH_GROUPS[module]}", run.stdout
    assert set(workers) == {*grouped, "test_ungrouped"}, run.stdout
    for stem in grouped:
        assert len(workers[stem]) == 1, f"{stem}'s tests ran on {sorted(workers[stem])}"
