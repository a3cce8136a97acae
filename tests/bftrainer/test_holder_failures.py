"""A failing holder names its cause and backs off: the real daemon on a fake Slurm
whose holders fail as slurmd fails a job script it cannot run (exit 13, "Permission
denied" in the job's stderr); the backoff and the parsers on their own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bftrainer.holders.base import HolderStatus, stderr_tail
from bftrainer.holders.failures import HolderBackoff, failed_to_hold
from bftrainer.holders.slurm import SlurmHolders, parse_job_account
from bftrainer.idle_monitor.runner import CommandError, ReplayRunner, recorded
from tests.bftrainer.fake_slurm import POLL_S, FakeDaemon, fake_daemon  # noqa: F401
from tests.conftest import wait_until

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
DENIED = "slurmstepd: error: execve(): /opt/bftrainer/hold-nodes.sbatch: Permission denied"
# ``scontrol show job 44 -o`` of such a job on Slurm 22.05 (the fields the daemon reads,
# in their places; shortened).
SCONTROL_FAILED = (
    "JobId=44 JobName=bftrainer-hold UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A "
    "Priority=1 Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode "
    "Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=13:0 "
    "RunTime=00:00:00 TimeLimit=UNLIMITED Partition=bf NodeList=node1 BatchHost=node1\n"
)


def test_a_failing_holder_is_named_backed_off_and_shown(
    fake_daemon: FakeDaemon,  # noqa: F811
    tmp_path: Path,
) -> None:
    daemon, slurm = fake_daemon, fake_daemon.slurm
    prom = tmp_path / "bftrainer.prom"
    daemon.start("--metrics-textfile", str(prom))
    slurm.fail_jobs(13, "NonZeroExitCode", DENIED)
    daemon.submit(TRAINER)

    # One line: the holder, its node, Slurm's state, exit code and reason, its stderr.
    line = daemon.wait_line(0, r"holder \d+ for n\d failed", "a failed holder's line")
    assert "FAILED, exit code 13, reason NonZeroExitCode: " + DENIED in line, line
    node = re.search(r"for (n\d) failed", line).group(1)  # type: ignore[union-attr]

    # The same node again, after twice the wait (one line each, never sooner).
    again = daemon.wait_line(
        0, rf"for {node} failed: .*\(failure 2 in a row\)", f"{node}'s second failure"
    )
    first_s, second_s = (float(re.search(r"again in (\S+) s", x).group(1)) for x in (line, again))  # type: ignore[union-attr]
    assert first_s == pytest.approx(2 * POLL_S, rel=0.02)
    assert second_s == pytest.approx(2 * first_s, rel=0.02)
    tries = [t for t, args in slurm.calls("sbatch") if f"--nodelist={node}" in args]
    assert len(tries) >= 2 and tries[1] - tries[0] >= first_s, tries

    status = daemon.status()["holders_failing"]
    assert DENIED in status["cause"] and "exit code 13" in status["cause"]
    assert node in status["nodes"]
    text = daemon.cli("status").stdout
    assert re.search(r"^holders failing: FAILED, exit code 13, .*Permission denied", text, re.M)
    wait_until(lambda: "bftrainer_holders_failed_total" in prom.read_text(), 30, "metrics")
    metrics = prom.read_text()
    failing = re.search(r'^bftrainer_holders_failing_nodes\{cause="([^"]*)"\} (\S+)', metrics, re.M)
    assert failing and "Permission denied" in failing.group(1) and float(failing.group(2)) >= 1
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log()


def test_backoff_doubles_per_node_up_to_its_cap_and_ends_when_a_holder_runs() -> None:
    backoff = HolderBackoff(20.0, max_s=100.0)
    delays = [backoff.failed("a", str(i), "x", 0.0).retry_s for i in range(5)]
    assert delays == [20.0, 40.0, 80.0, 100.0, 100.0]
    backoff.failed("b", "9", "y", 50.0)
    assert backoff.waiting(60.0) == {"a", "b"}
    assert backoff.waiting(100.0) == set()  # both due
    assert backoff.summary()["cause"] == "y"  # type: ignore[index]
    backoff.held("a")
    backoff.keep_only(frozenset({"a"}))  # b left the pool
    assert backoff.summary() is None
    assert backoff.failed("a", "10", "z", 0.0).failures == 1  # counted again from one
    # A poll interval longer than the cap: the cap.
    assert HolderBackoff(7200.0, max_s=1800.0).failed("a", "1", "x", 0.0).retry_s == 1800.0


@pytest.mark.parametrize(
    ("was", "reason", "failed"),
    [
        ("pending", "failed", True),
        ("running", "node_fail", True),
        ("pending", "boot_fail", True),
        ("running", "exit", True),  # LSF
        ("pending", "completed", True),  # ended before it ever ran
        ("running", "completed", False),  # its lease ended it
        ("running", "preempted", False),
        ("running", "cancelled", False),
        ("running", "timeout", False),
        ("pending", "not listed", False),
    ],
)
def test_what_counts_as_a_failed_holder(was: str, reason: str, failed: bool) -> None:
    assert failed_to_hold(was, reason) is failed


def test_the_cause_is_slurms_account_and_the_stderr_tail(tmp_path: Path) -> None:
    runner = ReplayRunner({"scontrol": [recorded(SCONTROL_FAILED)]})
    holders = SlurmHolders(runner, script=tmp_path / "hold.sbatch")
    holders.stderr_dir = tmp_path
    (tmp_path / "44.err").write_bytes(b"\n" + DENIED.encode() + b"\n\n")
    status = HolderStatus("node1", "ended", "failed", "FAILED")
    cause = holders.why_failed("44", status)
    assert cause == f"FAILED, exit code 13, reason NonZeroExitCode: {DENIED}"
    assert "--error=" + str(tmp_path / "%j.err") in holders.submit_argv("node1", 5)
    # Slurm no longer knows the job (MinJobAge) and no stderr: the listed state.
    gone = CommandError(["scontrol"], "replay", "exit code 1: Invalid job id specified")
    holders = SlurmHolders(ReplayRunner({"scontrol": [gone]}), script=tmp_path / "h")
    assert holders.why_failed("45", status) == "FAILED"


def test_job_accounts_and_stderr_tails() -> None:
    assert parse_job_account("JobId=1 JobState=NODE_FAIL Reason=None ExitCode=0:9") == (
        "NODE_FAIL, signal 9"
    )
    with pytest.raises(ValueError, match="JobState"):
        parse_job_account("slurm_load_jobs error: Invalid job id specified")
    assert stderr_tail(None) == ""
    assert stderr_tail(Path("/nonexistent/1.err")) == ""


def test_a_stderr_tail_is_one_printable_bounded_line(tmp_path: Path) -> None:
    path = tmp_path / "1.err"
    path.write_bytes(b"first\n" + b"x" * 10_000 + b"\x1b[31m\xff\n")
    tail = stderr_tail(path)
    assert tail.endswith("...") and len(tail) == 303 and "\x1b" not in tail
