"""The one squeue parser (bftrainer/common/squeue.py) that the daemon's holders and the
trainers' host watch both read squeue with: the fields each needs, a bad line named.

Lines as captured on the local Slurm 22.05.8 (tests/bftrainer/test_holders.py's SQUEUE);
what each reader concludes from them is tested in test_holders.py (the daemon's holder
states) and tests/trainers/test_hostwatch.py (the hosts a supervisor keeps)."""

from __future__ import annotations

import pytest

from bftrainer.common.squeue import FORMAT, TIME_ENV, SqueueJob, has_value, parse_squeue_jobs
from tests.bftrainer.test_holders import SQUEUE


def test_each_listed_job_has_every_field_as_printed() -> None:
    jobs = {j.job_id: j for j in parse_squeue_jobs(SQUEUE)}
    assert list(jobs) == ["11", "12", "13", "14", "15", "16"]
    assert jobs["11"] == SqueueJob("11", "RUNNING", "node1", "node1", "N/A", "None")
    assert jobs["14"] == SqueueJob("14", "PENDING", "node4", "", "N/A", "Resources")
    assert [j.line_no for j in jobs.values()] == [1, 2, 3, 4, 5, 6]


def test_a_preemption_is_told_by_its_time_whatever_the_state_shows() -> None:
    jobs = {j.job_id: j for j in parse_squeue_jobs(SQUEUE)}
    assert {j for j, job in jobs.items() if job.preempted} == {"12", "13"}
    assert jobs["13"].state == "RUNNING"  # preempted while still in its grace time


def test_a_pending_job_is_on_the_node_it_asked_for() -> None:
    jobs = {j.job_id: j for j in parse_squeue_jobs(SQUEUE)}
    assert jobs["14"].hostlist == "node4"  # NodeList empty until it starts
    assert jobs["11"].hostlist == "node1"
    (job,) = parse_squeue_jobs("21|RUNNING|node[1-2]|node[1-2]|N/A|None|\n")
    assert job.hostlist == "node[1-2]"


def test_no_value_is_any_of_slurms_spellings_of_none() -> None:
    for text in ("", " ", "N/A", "n/a", "None", "(null)", "Unknown"):
        assert not has_value(text)
    for text in ("1795375794", "Resources", "0"):
        assert has_value(text)


def test_a_line_not_in_the_format_is_named() -> None:
    assert parse_squeue_jobs("") == []
    assert parse_squeue_jobs("\n  \n") == []
    for bad in (
        "11|RUNNING|node1\n",  # the fields of another format
        "11|RUNNING|node1|node1|N/A|None\n",  # no closing |
        "|RUNNING|node1|node1|N/A|None|\n",  # no job id
        "11|RUNNING|node1|node1|N/A|None|x|\n",  # one field too many
    ):
        with pytest.raises(ValueError, match="line 1: expected JobID"):
            parse_squeue_jobs(bad)
    with pytest.raises(ValueError, match="line 2: "):
        parse_squeue_jobs("11|RUNNING|node1|node1|N/A|None|\ngarbage <html>|||\n")


def test_the_format_asks_for_the_fields_parsed_with_times_in_epoch_seconds() -> None:
    assert FORMAT == "JobID:|,State:|,ReqNodes:|,NodeList:|,PreemptTime:|,Reason:|"
    assert TIME_ENV == {"SLURM_TIME_FORMAT": "%s"}
