"""Bad input to a trainer: one clear line, the trainer failed, its traceback in the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.trainers import channel
from bftrainer.trainers.launch.base import Launcher, LaunchError, LaunchSpec
from bftrainer.trainers.launch.supervisor import main as supervisor_main
from tests.trainers.elastic_harness import (
    EXAMPLE,
    assert_failed_cleanly,
    horovod_missing,
    run_cli,
)


def test_missing_script_is_one_line_and_nothing_starts(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bftrainer",
            "run",
            "--backend",
            "torchrun",
            "--hosts-file",
            str(hosts),
            "--trainer-dir",
            str(tmp_path / "t"),
            str(tmp_path / "nope.py"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"Error: trainer script not found: {tmp_path / 'nope.py'}"
    ]
    assert not (tmp_path / "t").exists()


def test_launcher_refuses_a_missing_script(tmp_path: Path) -> None:
    spec = LaunchSpec("t", tmp_path / "nope.py", (), tmp_path / "t", "torchrun")
    with pytest.raises(LaunchError, match=r"trainer script not found: .*nope\.py"):
        Launcher.start(spec, ["localhost"])


def test_a_launch_spec_written_before_issue_43_still_reads(tmp_path: Path) -> None:
    """A trainer folder's spec.json of an earlier release names the host limits
    min_hosts, max_hosts; the record's n_min, n_max read them, and a spec written now
    reads back whole."""
    script = tmp_path / "s.py"
    script.write_text("")
    spec = LaunchSpec("t", script, ("--x",), tmp_path / "t", "torchrun", n_min=2, n_max=5)
    assert LaunchSpec.from_json(spec.to_json()) == spec
    old = json.loads(spec.to_json())
    old["min_hosts"], old["max_hosts"] = old.pop("n_min"), old.pop("n_max")
    assert LaunchSpec.from_json(json.dumps(old)) == spec
    old["min_hosts"] = 6
    with pytest.raises(LaunchError, match="need 1 <= n_min <= n_max, got 6, 5"):
        LaunchSpec.from_json(json.dumps(old))


def test_supervisor_fails_when_the_script_went_away(tmp_path: Path) -> None:
    script = tmp_path / "gone.py"
    script.write_text("")
    d = tmp_path / "t"
    d.mkdir()
    spec = LaunchSpec("t", script, (), d, "torchrun")
    (d / channel.SPEC).write_text(spec.to_json())
    script.unlink()
    assert supervisor_main([str(d)]) == 1
    exit_ = channel.read_exit(d)
    assert exit_ is not None and exit_["state"] == "failed"
    assert "trainer script not found" in exit_["reason"]


def test_bad_hosts_file_is_one_line(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node1:many\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bftrainer",
            "run",
            "--backend",
            "torchrun",
            "--hosts-file",
            str(hosts),
            str(EXAMPLE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"Error: {hosts}:1: expected 'host' or 'host:slots', got 'node1:many': "
        "slot count 'many': expected an integer"
    ]


@pytest.mark.slow
def test_script_raising_at_import(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("raise ValueError('broken at import')\n")
    rc, err, d = run_cli(tmp_path, "torchrun", script)
    assert_failed_cleanly(rc, err, d, "broken.py: ValueError: broken at import")


@pytest.mark.slow
def test_invalid_batch_limits(tmp_path: Path) -> None:
    rc, err, d = run_cli(
        tmp_path,
        "torchrun",
        EXAMPLE,
        "--work-samples",
        "1000",
        "--base-batch",
        "100",
        "--max-batch",
        "10",
    )
    assert_failed_cleanly(rc, err, d, "max_batch_size 10 < base_batch_size 100")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchrun", "horovod"])
def test_script_raising_at_step_n(tmp_path: Path, backend: str) -> None:
    if backend == "horovod" and horovod_missing():
        pytest.skip(str(horovod_missing()))
    rc, err, d = run_cli(
        tmp_path, backend, EXAMPLE, "--work-samples", "100000", "--fail-at-step", "5"
    )
    assert_failed_cleanly(rc, err, d, "RuntimeError: failing on purpose at step 5")


STORE_HOST = """
import time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
print(store.port, flush=True)
keys, deadline = store.num_keys(), time.monotonic() + 120
while store.num_keys() == keys and time.monotonic() < deadline:  # the worker joins
    time.sleep(0.05)
print("joined" if store.num_keys() != keys else "nobody joined in 120 s", flush=True)
time.sleep(600)
"""


def test_a_store_lost_while_joining_is_a_peer_loss_not_the_scripts_failure(
    tmp_path: Path,
) -> None:
    # Rank 0's worker hosts the group's store; when its node is preempted while the
    # others join (a torchrun restart), they lose it. Seen in a preemption probe: the
    # trainer was failed as if train_mlp.py had raised DistNetworkError.
    host = subprocess.Popen([sys.executable, "-c", STORE_HOST], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        assert host.stdout is not None
        port = host.stdout.readline().strip()
        env = {
            **os.environ,
            "WORLD_SIZE": "2",
            "RANK": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "TORCHELASTIC_RUN_ID": "store-lost",
            "BFTRAINER_TRAINER_DIR": str(tmp_path),
        }
        worker = subprocess.Popen(
            [sys.executable, "-m", "bftrainer.trainers.launch.worker", str(EXAMPLE),
             "--work-samples", "100"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        # The worker has joined and waits in the store for rank 0 (not a fixed sleep:
        # importing torch took longer than 5 s on a loaded CI machine).
        assert host.stdout.readline().strip() == "joined"
        assert worker.poll() is None, worker.communicate()[1][-2000:]
        host.kill()
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == 1, err[-2000:]
        assert "joining the group failed" in err
        assert not (tmp_path / "failure.json").exists()
    finally:
        for proc in (worker, host):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
