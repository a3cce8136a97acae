"""A supervisor's host watch reads its holders' squeue lines with the daemon's parser
(bftrainer/common/squeue.py) and keeps only the hosts whose holder may still be ours.

Lines as captured on the local Slurm 22.05.8 (tests/bftrainer/test_holders.py's SQUEUE);
the watch on a real Slurm is exercised by the daemon's end-to-end tests."""

from __future__ import annotations

from bftrainer.common.squeue import parse_squeue_jobs
from bftrainer.trainers.launch.hostwatch import jobs_gone
from tests.bftrainer.test_holders import SQUEUE


def test_only_running_or_pending_unpreempted_holders_are_kept() -> None:
    listed = parse_squeue_jobs(SQUEUE)
    # 11 runs and 14 is pending: kept. 12 and 13 were preempted (13 still shows
    # RUNNING, in its grace time), 15 was cancelled, 16 suspended, 17 is not listed.
    jobs = {"11", "12", "13", "14", "15", "16", "17"}
    assert jobs_gone(jobs, listed) == {"12", "13", "15", "16", "17"}


def test_a_configuring_holder_is_kept_and_a_requeued_one_is_not() -> None:
    listed = parse_squeue_jobs(
        "21|CONFIGURING|node1|node1|N/A|None|\n"
        "22|REQUEUED|node2||N/A|None|\n"
        "23|COMPLETING|node3|node3|N/A|None|\n"
    )
    assert jobs_gone({"21", "22", "23"}, listed) == {"22", "23"}


def test_nothing_asked_nothing_gone() -> None:
    assert jobs_gone(set(), parse_squeue_jobs(SQUEUE)) == set()
