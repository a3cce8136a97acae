"""The centre's wire across releases: a trainer's report keeps the keys its first release
sent (docs/deployment.md, "Centre mode"), while the record behind it has the trainer record's
names (``submit_s``; ``math.inf`` for work until the trainer's own stop)."""

from __future__ import annotations

import json
import math
from typing import Any

from bftrainer.centre.allocator import Allocator
from bftrainer.centre.protocol import SyncRequest, TrainerReport
from bftrainer.centre.transport import Request
from bftrainer.loop.jobs import JobSpec
from tests.bftrainer.test_centre_allocator import ALICE, make, step

# TrainerReport.to_dict's keys as the first release of the centre wrote them: what an
# allocator of that release reads (all of them required but work_samples, nodes,
# samples_done and curves), and what an agent of that release sends.
FIRST_RELEASE_KEYS = {
    "id",
    "model",
    "submitted_s",
    "n_min",
    "n_max",
    "rescale_up_s",
    "rescale_down_s",
    "work_samples",
    "nodes",
    "samples_done",
    "curves",
}


def first_release_report(tid: str = "t0001", work: float | None = None) -> dict[str, Any]:
    """A trainer as an agent of the first release reports it, key for key."""
    return {
        "id": tid,
        "model": "train_mlp.py",
        "submitted_s": 1234.5,
        "n_min": 1,
        "n_max": 4,
        "rescale_up_s": 15.0,
        "rescale_down_s": 5.0,
        "work_samples": work,
        "nodes": [],
        "samples_done": 0.0,
        "curves": {},
    }


def test_a_first_release_report_reads_as_the_trainer_record() -> None:
    assert set(first_release_report()) == FIRST_RELEASE_KEYS
    own_stop = TrainerReport.from_dict(first_release_report())
    assert (own_stop.submit_s, own_stop.work_samples) == (1234.5, math.inf)
    assert TrainerReport.from_dict(first_release_report(work=5000)).work_samples == 5000.0
    job = own_stop.job("alice/t0001", "alice", "physics")
    assert (job.id, job.submit_s, job.n_min, job.n_max, job.work_samples, job.user) == (
        "alice/t0001",
        1234.5,
        1,
        4,
        math.inf,
        "alice",
    )


def test_a_report_sent_now_has_the_first_release_keys_and_plain_json() -> None:
    for work in (math.inf, 9000.0):
        job = JobSpec("t0007", "m.py", 99.0, 2, 6, 15.0, 5.0, work, ((1.0, 1.0),))
        curves = {"throughput": ((1.0, 10.0), (6.0, 48.0))}
        report = TrainerReport.of_job(
            job, id="t0007", nodes=("n1", "n2"), samples_done=40.0, curves=curves
        )
        body = report.to_dict()
        assert set(body) == FIRST_RELEASE_KEYS
        assert body["submitted_s"] == 99.0
        assert body["work_samples"] == (None if math.isinf(work) else work)
        text = json.dumps(body, allow_nan=False)  # strict JSON: no Infinity on the wire
        back = TrainerReport.from_dict(json.loads(text))
        assert back == report
        again = back.job("t0007", "", "")
        assert (again.submit_s, again.n_min, again.n_max, again.work_samples) == (
            99.0,
            2,
            6,
            work,
        )


def test_an_agent_of_the_first_release_is_allocated_and_read_back(tmp_path) -> None:
    allocator: Allocator
    allocator, clock = make(tmp_path)
    allocator.start_loop()
    body = {"trainers": [first_release_report("t0001"), first_release_report("t0002", 8e6)]}
    request = Request(kind="sync", body=body)
    allocator.handle(ALICE, request)
    step(allocator, clock)
    reply = allocator.handle(ALICE, request)
    assert set(reply) == {"assignment", "cancel", "sync_every_s"}
    assert set(reply["assignment"]) == {"t0001", "t0002"}
    assert all(reply["assignment"].values()), "both trainers run"
    assert SyncRequest.from_dict(body).trainers[0].to_dict() == first_release_report("t0001")
