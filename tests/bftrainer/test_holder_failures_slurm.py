"""A failing holder on the real local Slurm: a holder job script that writes to its
stderr and exits 13 (as slurmd's "Permission denied" does) is named, with Slurm's state,
exit code and reason and that stderr line, in one daemon line; backed off; shown in
status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bftrainer.daemon_service import service_in
from tests.conftest import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm]

FAILING = """#!/bin/bash
#SBATCH --output=/dev/null
echo "hold-test: cannot start: Permission denied" >&2
exit 13
"""


def test_a_holder_script_that_fails_is_named_and_backed_off(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "failing-hold.sbatch"
    script.write_text(FAILING)
    with service_in(slurm, tmp_path) as service:
        service.start(extra=("--holder-script", str(script)))
        service.submit("torchrun", 640, 1)

        def failed_line() -> str | None:
            log = service.logs()[-1]
            return next((ln for ln in log.splitlines() if " failed: " in ln), None)

        wait_until(lambda: failed_line() is not None, 120, "a failed holder's line")
        line = failed_line()
        assert line is not None
        assert re.search(r"holder \d+ for \S+ failed: FAILED, exit code 13", line), line
        assert "hold-test: cannot start: Permission denied" in line, line
        assert "(failure 1 in a row)" in line, line
        failing = service.status()["holders_failing"]
        assert failing is not None and "exit code 13" in failing["cause"]
        assert service.cli("status").count("holders failing: FAILED, exit code 13") == 1
        assert service.stop() == 0
