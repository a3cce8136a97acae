"""The trainer directory's files: atomic writes, torn lines, hosts, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bftrainer.trainers import channel
from bftrainer.trainers.agent import PolluxAgent
from bftrainer.trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from bftrainer.trainers.goodput import BatchLimits


def _record() -> object:
    agent = PolluxAgent("t1", BatchLimits(64, 1024, 256), clock=lambda: 5.0)
    agent.set_config(1, 64)
    return agent.metrics()


def test_reader_returns_new_records_and_leaves_a_torn_last_line(tmp_path: Path) -> None:
    w = channel.ChannelWriter(tmp_path, clock=lambda: 1.0)
    w.reset(nodes=2, batch_size=128, local_bsz=64, accum_steps=0, lr=0.1)
    w.metrics(_record(), samples_done=10, epoch=0)  # type: ignore[arg-type]
    records, offset = channel.read_metrics(tmp_path, 0)
    assert [r["kind"] for r in records] == ["reset", "metrics"]
    assert records[1]["record"]["trainer_id"] == "t1" and records[1]["samples_done"] == 10
    with (tmp_path / channel.METRICS).open("a") as f:
        f.write('{"kind": "reset", "nod')  # a writer died mid-line
    again, offset2 = channel.read_metrics(tmp_path, offset)
    assert again == [] and offset2 == offset
    with (tmp_path / channel.METRICS).open("a") as f:
        f.write('es": 1}\n')
    (last,), _ = channel.read_metrics(tmp_path, offset)
    assert last == {"kind": "reset", "nodes": 1}


def test_read_metrics_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert channel.read_metrics(tmp_path, 0) == ([], 0)


def test_result_and_exit_round_trip(tmp_path: Path) -> None:
    assert channel.read_result(tmp_path) is None and channel.read_exit(tmp_path) is None
    channel.ChannelWriter(tmp_path).result({"samples": 5, "steps": 1})
    assert channel.read_result(tmp_path) == {"samples": 5, "steps": 1}
    channel.write_exit(tmp_path, "failed", 1, "boom", 3.0, cause="script")
    assert channel.read_exit(tmp_path) == {
        "state": "failed",
        "returncode": 1,
        "reason": "boom",
        "time_s": 3.0,
        "cause": "script",
    }
    with pytest.raises(channel.ChannelError, match="cause"):
        channel.write_exit(tmp_path, "failed", 1, "boom", 3.0)
    with pytest.raises(channel.ChannelError, match="done, failed or stopped"):
        channel.write_exit(tmp_path, "gone", 0, "", 0.0)


def test_hosts_round_trip_and_bad_lines_are_named(tmp_path: Path) -> None:
    channel.write_hosts(tmp_path, ["localhost", "node2:4", ("node3", 2)])
    assert (tmp_path / "hosts").read_text() == "localhost:1\nnode2:4\nnode3:2\n"
    assert channel.read_hosts(tmp_path) == [("localhost", 1), ("node2", 4), ("node3", 2)]
    channel.write_hosts(tmp_path, [])
    assert channel.read_hosts(tmp_path) == []
    (tmp_path / "hosts").write_text("a:1\nb:zero\n")
    with pytest.raises(channel.ChannelError, match=r"hosts:2: expected 'host' or 'host:slots'"):
        channel.read_hosts(tmp_path)


def test_exec_json(tmp_path: Path) -> None:
    assert channel.read_exec(tmp_path) is None
    channel.write_exec(tmp_path, "slurm", {"node3": "1234"})
    assert channel.read_exec(tmp_path) == {
        "mode": "slurm",
        "slurm_jobs": {"node3": "1234"},
        "ssh_args": [],
        "leases": {},
        "lease_s": None,
    }
    channel.write_exec(tmp_path, "slurm", {"node3": "1234"}, leases={"node3": "/l/n3"}, lease_s=60)
    assert channel.read_exec(tmp_path)["leases"] == {"node3": "/l/n3"}
    assert channel.read_exec(tmp_path)["lease_s"] == 60
    (tmp_path / "exec.json").write_text(json.dumps({"mode": "telnet"}))
    with pytest.raises(channel.ChannelError, match="mode"):
        channel.read_exec(tmp_path)


def test_checkpoint_is_atomic_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    assert load_checkpoint(path) is None
    save_checkpoint({"w": torch.ones(3), "step": 4}, path)
    state = load_checkpoint(path)
    assert state["step"] == 4 and torch.equal(state["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt"):
        load_checkpoint(path)
