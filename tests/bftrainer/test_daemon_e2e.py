"""The daemon end to end on the real 8-node Slurm: holders, real elastic trainers, main
jobs that take nodes and give them back, and a daemon killed -9 mid-run.

What a centre relies on, asserted here: every main job starts within seconds of its
submission; trainers shrink when nodes leave and grow when they return; each allocation
satisfies the allocator's constraints; each trainer finishes with exactly the work asked;
a daemon killed -9 and restarted re-attaches without restarting the trainers and loses
no committed step.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bftrainer.state import Store
from bftrainer.trainers import channel
from bftrainer.trainers.launch import remote
from tests.bftrainer.daemon_service import (
    MAIN_START_LIMIT_S,
    Service,
    check_allocations,
    daemon_log,
    first_reset_at,
    resets,
    service_in,
    supervisor_pid,
    wait_done,
)
from tests.conftest import SlurmCluster, wait_until
from tests.trainers.elastic_harness import horovod_missing

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def service(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    if (why := horovod_missing()) is not None:
        pytest.skip(why)
    with service_in(slurm, tmp_path) as s:
        yield s


def delete_while_written(folder: Path) -> None:
    """``rm -rf`` of a folder its supervisor is writing in: a file that vanishes under
    it (a temp file renamed meanwhile) is gone already, and a file written after it was
    listed ("Directory not empty") is met by running it again, as a user would."""

    def gone_already(func: object, path: str, exc_info: tuple[Any, BaseException, Any]) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    for _ in range(10):
        try:
            shutil.rmtree(folder, onerror=gone_already)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise AssertionError(f"{folder} is still written in after 10 rm -rf")


def stepping_on(service: Service, trainer_id: str) -> int | None:
    """The nodes of the trainer's last step on the hosts it was last given (its last
    reset since the daemon wrote them), None before it. A reset from before is not
    enough: a trainer moved 4 -> 2 -> 4 nodes (a newcomer took two, holders of new
    nodes came a poll later) still showed its first reset on 4 while Horovod's new
    workers joined, and a main job taking one of those held the others for Gloo's
    whole timeout."""
    trainer_dir = service.state_dir / "trainers" / trainer_id
    try:
        given_s = (trainer_dir / channel.HOSTS).stat().st_mtime
    except FileNotFoundError:
        return None
    last = resets(service.state_dir, trainer_id)[-1:]
    return int(last[0]["nodes"]) if last and last[0]["time_s"] > given_s else None


def around_a_main_job(service: Service, trainers: tuple[str, str], kill_daemon: bool) -> None:
    """A main job takes one node of each trainer, stepping on 4: holders are preempted,
    both shrink to 3; it ends and they grow back. With ``kill_daemon`` the daemon is
    killed -9 once it has taken the nodes, and started again."""
    # ... and every worker joined: a Horovod worker killed while it joins holds the
    # others for Gloo's whole timeout (120 s here), a case the soak covers, not this test.
    wait_until(
        lambda: all(stepping_on(service, t) == 4 for t in trainers),
        180,
        "both trainers stepping on 4 nodes",
    )
    taken = [service.trainer(t)["nodes"][-1] for t in trainers]
    t_submit = time.time()
    # It runs until both trainers were seen on 3 nodes (a torchrun restart on 3 hosts
    # took over 30 s at load 15: a main job of fixed length ended first, and the trainer
    # went from 4 nodes back to 4 without a step on 3).
    job, start_s = service.main_job(taken, 600)
    assert start_s < MAIN_START_LIMIT_S, f"main job {job} took {start_s:.1f} s to start"
    wait_until(
        lambda: not set(taken) & {n for t in trainers for n in service.trainer(t)["nodes"]},
        60,
        "the daemon to take the main job's nodes from the trainers",
    )
    if kill_daemon:
        service.kill9()
        time.sleep(2)
        service.start("equal")
    shrink_s = {}
    for t in trainers:
        # Horovod's survivors of a worker killed in a collective wait out Gloo's timeout
        # (120 s in these tests) before they reset: seen once with the daemon killed.
        wait_until(
            lambda t=t: first_reset_at(service, t, 3, t_submit) is not None,
            240,
            f"trainer {t} training on 3 nodes",
        )
        shrink_s[t] = first_reset_at(service, t, 3, t_submit) - t_submit
    print(
        f"daemon killed: {kill_daemon}; main job start {start_s:.1f} s; "
        f"main job submitted -> first step at 3 nodes {shrink_s}"
    )
    # The main job ends; its nodes come back and the trainers grow again.
    service.end_main_job(job)
    wait_until(
        lambda: any(first_reset_at(service, t, 4, t_submit) for t in trainers),
        180,
        "a trainer to grow back to 4 nodes",
    )


def test_two_trainers_shrink_and_grow_around_main_jobs_with_the_daemon_up_then_killed(
    service: Service,
) -> None:
    """Two main jobs, one after the other, each taking a node of each trainer: around
    the first the daemon runs on, around the second it is killed -9 and started again.
    One pair of trainers for both (their start is most of such a test's time)."""
    # Equal share, so that the trainers grow back when the nodes return: with the milp
    # policy they may not, and rightly, when their own curves say that more workers on
    # this 2-core machine slow them down (measured: 8 workers, each fit turned flat).
    service.start("equal")
    work = 120_000
    # Held at 0.4 s a step (120,000 samples at batch 128: 6 min at least; the two main
    # jobs take 1.5-5 min of it): at 0.2 s the torchrun trainer, faster since its agents
    # stay up, once finished its work while the Horovod one still waited out Gloo's
    # timeout after the main job came.
    slow = (*service.paced(0.4), "--max-batch", "128")
    # One after the other: Horovod's start took 2.5 min on a loaded CI machine, and a
    # torchrun trainer submitted with it had finished its work before the main job came.
    a = service.submit("horovod", work, 4, *slow)
    wait_until(lambda: service.trainer(a)["samples_done"] > 0, 300, f"{a} training")
    b = service.submit("torchrun", work, 4, *slow)
    trainers = (a, b)
    wait_until(lambda: service.trainer(b)["samples_done"] > 0, 240, f"{b} training")
    wait_until(
        lambda: sum(len(service.trainer(t)["nodes"]) for t in trainers) == 8,
        120,
        "all 8 nodes held and given to the trainers",
    )
    supervisors = {t: supervisor_pid(service, t) for t in trainers}
    around_a_main_job(service, trainers, kill_daemon=False)
    around_a_main_job(service, trainers, kill_daemon=True)
    service.release()  # all seen: the rest of the work at full speed
    for t in trainers:
        done = wait_done(service, t, 600)
        assert done["samples_done"] == work
        result = channel.read_result(service.state_dir / "trainers" / t)
        assert result is not None and result["samples"] == work
        # Never restarted by the daemon (its restart re-attached): the same supervisor.
        assert supervisor_pid(service, t) == supervisors[t]
    check_allocations(service.state_dir, {a: (1, 4), b: (1, 4)})
    with Store.open(service.state_dir) as store:
        live_nodes = [h.node for h in store.holders(live_only=True)]
        counts = {t: [len(r.nodes) for r in store.allocation_history(t)] for t in trainers}
    # b waited for the nodes held for it, rather than take two of a's: a lost only the
    # main jobs' node, each time, and b started on 4 (not 4 -> 2 -> 4 for a, 2 -> 4 for b).
    assert min(c for c in counts[a] if c) == 3, counts
    assert next(c for c in counts[b] if c) == 4, counts
    assert len(live_nodes) == len(set(live_nodes)), "a node held twice"
    # With no trainer left, the daemon holds nothing.
    wait_until(
        lambda: not [p for p in service.status()["pool"] if p["holder_state"]],
        30,
        "holders released",
    )
    assert service.stop() == 0


def test_a_crashing_trainer_is_failed_with_its_log_and_frees_its_nodes(service: Service) -> None:
    service.start()
    bad = service.submit("torchrun", 10_000, 2, "--fail-at-step", "3")
    good = service.submit("torchrun", 3_000, 2)
    wait_until(lambda: service.trainer(bad)["state"] in ("failed", "done"), 300, "the bad trainer")
    t = service.trainer(bad)
    assert t["state"] == "failed"
    assert "failing on purpose" in t["reason"]
    assert t["nodes"] == []
    log = service.cli("logs", bad)
    assert "Traceback" in log and "failing on purpose at step 3" in log
    # The other trainer is not disturbed, and the freed nodes are released or reused.
    assert wait_done(service, good, 300)["samples_done"] == 3_000
    wait_until(
        lambda: not [p for p in service.status()["pool"] if p["holder_state"]],
        30,
        "holders released",
    )
    assert service.stop() == 0


def test_a_trainer_submitted_right_after_another_ended_runs(service: Service) -> None:
    # The first trainer's end frees its nodes; the daemon releases the holders no
    # trainer needs. A trainer submitted at once must never be handed those nodes. At
    # the default 10 s poll the submission lands in the step that releases them. The one
    # end-to-end test at the production delays (poll, restart backoff, settle time).
    service.start(poll_s=10.0, production=True)
    first = service.submit("torchrun", 2_000, 8)
    assert wait_done(service, first, 300)["samples_done"] == 2_000
    second = service.submit("torchrun", 2_000, 8)
    assert wait_done(service, second, 300)["samples_done"] == 2_000
    third = service.submit("torchrun", 2_000, 8)
    assert wait_done(service, third, 300)["samples_done"] == 2_000
    assert service.stop() == 0
    log = daemon_log(service)
    assert "internal error" not in log and "Traceback" not in log, log[-4000:]
    # Said at the default level (the daemon runs with -v here: the lines are INFO).
    assert f"trainer {second} started on" in log and f"trainer {second} done" in log


def test_a_trainer_shrinks_by_itself_when_preempted_while_the_daemon_is_down(
    service: Service,
) -> None:
    service.start("equal")
    work = 40_000
    t = service.submit("torchrun", work, 4, *service.paced(0.2), "--max-batch", "128")
    wait_until(lambda: len(service.trainer(t)["nodes"]) == 4, 120, "the trainer on 4 nodes")
    wait_until(lambda: service.trainer(t)["samples_done"] > 0, 240, "the trainer training")
    supervisor = supervisor_pid(service, t)
    service.kill9()
    taken = service.trainer(t)["nodes"][-1]
    t_submit = time.time()
    _, start_s = service.main_job([taken], 60)
    assert start_s < MAIN_START_LIMIT_S
    # No daemon: the supervisor sees the holder end and goes on with the other three.
    wait_until(
        lambda: first_reset_at(service, t, 3, t_submit) is not None,
        120,
        "the trainer training on 3 nodes with the daemon down",
    )
    assert not (service.state_dir / "trainers" / t / channel.EXIT).exists()
    service.start("equal")
    service.release()
    done = wait_done(service, t, 600)
    assert done["samples_done"] == work and done["restarts"] == 0
    assert supervisor_pid(service, t) == supervisor  # never restarted: it never failed
    assert service.stop() == 0


def test_a_killed_supervisor_is_started_again_from_its_checkpoint(service: Service) -> None:
    service.start()
    work = 20_000
    t = service.submit("torchrun", work, 2, *service.paced(0.05))
    wait_until(lambda: service.trainer(t)["samples_done"] > 2_000, 240, "the trainer training")
    os.kill(supervisor_pid(service, t), signal.SIGKILL)
    wait_until(lambda: service.trainer(t)["restarts"] == 1, 120, "the supervisor restarted")
    service.release()
    done = wait_done(service, t, 600)
    assert done["samples_done"] == work and done["restarts"] == 1
    assert "restart 1" in daemon_log(service) or "started again" in daemon_log(service)
    assert service.stop() == 0


def test_a_deleted_trainer_directory_is_one_line_and_the_trainer_starts_over(
    service: Service,
) -> None:
    service.start()
    work = 20_000
    t = service.submit("torchrun", work, 2, *service.paced(0.05))
    wait_until(lambda: service.trainer(t)["samples_done"] > 2_000, 240, "the trainer training")
    old = supervisor_pid(service, t)
    delete_while_written(service.state_dir / "trainers" / t)
    wait_until(lambda: service.trainer(t)["restarts"] == 1, 120, "the trainer started over")
    wait_until(lambda: not remote.alive(old), 30, f"the old supervisor {old} stopped")
    service.release()
    done = wait_done(service, t, 600)
    assert done["samples_done"] == work and done["restarts"] == 1
    lines = [ln for ln in daemon_log(service).splitlines() if "was deleted" in ln]
    assert len(lines) == 1, daemon_log(service)
    assert f"trainer {t}: its directory" in lines[0] and "it starts over" in lines[0]
    assert service.stop() == 0
