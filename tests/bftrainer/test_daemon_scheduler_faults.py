"""The daemon survives its scheduler: each Slurm command it runs (sinfo, squeue,
scontrol, sbatch, scancel) fails in turn with an error exit, an empty reply, garbage and
a hang longer than --timeout. After each, the real ``bftrainer daemon`` still runs, has
said so in a line naming the command, and carries on once the command heals."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.bftrainer.fake_slurm import FAILURES, FakeDaemon, fake_daemon  # noqa: F401
from tests.conftest import wait_until

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def _fails_then_heals(daemon: FakeDaemon, command: str, how: str, pattern: str, act=None) -> str:
    """Make ``command`` fail ``how``, do ``act`` (what makes the daemon run it), wait for
    the line naming it; heal the command. The line."""
    offset = len(daemon.log())
    daemon.slurm.fail(command, how)
    if act is not None:
        act()
    line = daemon.wait_line(offset, pattern, f"a line naming {command} ({how})")
    assert daemon.alive()
    daemon.slurm.fail(command, None)
    return line


@pytest.mark.parametrize("how", FAILURES)
def test_the_daemon_survives_every_scheduler_command_failing(
    fake_daemon: FakeDaemon,  # noqa: F811
    how: str,
) -> None:
    daemon, slurm = fake_daemon, fake_daemon.slurm
    # The scheduler fails from the start. The holders are read first (squeue; an empty
    # reply is no holder, a good one), then the pool (sinfo).
    for command in ("sinfo", "squeue", "scontrol"):
        slurm.fail(command, how)
    daemon.start(wait=False)
    if how != "empty":
        daemon.wait_line(0, r"\bsqueue\b", f"a line naming squeue at start ({how})")
        slurm.fail("squeue", None)
    daemon.wait_line(0, r"\bsinfo\b", f"a line naming sinfo at start ({how})")
    healed_s = time.time()
    for command in ("sinfo", "squeue", "scontrol"):
        slurm.fail(command, None)
    daemon.wait_pool()

    # ... and a poll read the claims (scontrol show res) since: breaking scontrol again
    # before that left the pool's growth held, so no holder was ever asked for and the
    # line below never came (1 run in 2 at load 8).
    def claims_read_s() -> float | None:
        started = [t for t, args in slurm.calls("scontrol") if t >= healed_s and "res" in args]
        return min(started) if started else None

    wait_until(
        lambda: (t := claims_read_s()) is not None and (daemon.status()["pool_time_s"] or 0.0) > t,
        60,
        "a pool read with the claims once scontrol healed",
    )

    # scontrol: the bf partition's MaxTime is read when the first holder is asked for.
    _fails_then_heals(
        daemon, "scontrol", how, r"scontrol show partition", lambda: daemon.submit(TRAINER)
    )
    wait_until(lambda: len(slurm.jobs()) == 1, 60, "the first holder once scontrol healed")

    _fails_then_heals(daemon, "sbatch", how, r"\bsbatch\b", lambda: daemon.submit(TRAINER))
    wait_until(lambda: len(slurm.jobs()) == 2, 60, "the second holder once sbatch healed")

    _fails_then_heals(daemon, "sinfo", how, r"\bsinfo\b")
    _fails_then_heals(daemon, "squeue", how, r"\bsqueue\b")
    wait_until(lambda: len(slurm.jobs()) == 2, 60, "two holders once squeue healed")

    # scancel: a holder of ours the state does not know is cancelled at the next poll.
    _fails_then_heals(
        daemon, "scancel", how, r"\bscancel\b", lambda: slurm.set_job("999", "RUNNING", "n6")
    )
    wait_until(lambda: "999" not in slurm.jobs(), 60, "the unknown holder cancelled")

    assert daemon.stop() == 0
    log = daemon.log()
    assert "Traceback" not in log, log
