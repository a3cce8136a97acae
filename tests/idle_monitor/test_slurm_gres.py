"""GPU counts per node from Slurm's ``Gres`` (``--slots-per-node gres``), on outputs
recorded from the real local Slurm 22.05 (idle_monitor/fixtures/slurm-gres-sinfo.txt:
nodes declared with ``gpu:2``, ``gpu:1``, ``gpu:tesla:2``, two types, socket bindings,
and none)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bftrainer.idle_monitor.runner import ReplayRunner, recorded
from bftrainer.idle_monitor.slurm import SlurmScheduler, gpu_count, parse_sinfo_gpus
from bftrainer.idle_monitor.source import LivePoolSource, OutputParseError

FIXTURES = Path(__file__).resolve().parents[2] / "idle_monitor" / "fixtures"
GRES = (FIXTURES / "slurm-gres-sinfo.txt").read_text()
RECORDED = {
    "node1": 2,
    "node2": 2,
    "node3": 1,
    "node4": 2,  # gpu:tesla:2
    "node5": 2,  # gpu:tesla:1,gpu:volta:1
    "node6": 2,  # gpu:2(S:0-1)
    "node7": 2,
    "node8": 0,  # (null)
}


def test_the_recorded_gres_give_each_nodes_gpus() -> None:
    assert parse_sinfo_gpus(GRES) == (RECORDED, {})


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:6", 6),
        ("gpu:a100:4", 4),
        ("gpu:a100_3g.20gb:2", 2),  # a MIG type name
        ("gpu:4(S:0,2)", 4),
        ("gpu:4(S:0-1),mps:400", 4),  # other resources count nothing
        ("gpu", 1),
        ("gpu:tesla", 1),  # a type without a count: one, as Slurm reads it
        ("mps:100", 0),
        ("(null)", 0),
        ("", 0),
    ],
)
def test_gpu_count_reads_slurms_forms(gres: str, gpus: int) -> None:
    assert gpu_count(gres) == gpus


@pytest.mark.parametrize("gres", ["gpu:tesla:x", "gpu:-1", "gpu:2:"])
def test_a_gres_that_does_not_parse_names_itself(gres: str) -> None:
    with pytest.raises(ValueError, match=f"in Gres {gres!r} is not a number"):
        gpu_count(gres)


def test_one_bad_gres_leaves_the_other_nodes_counted() -> None:
    gpus, errors = parse_sinfo_gpus(GRES.replace("node3|gpu:1", "node3|gpu:tesla:x"))
    assert gpus == {n: c for n, c in RECORDED.items() if n != "node3"}
    assert errors == {"node3": "GPU count 'x' in Gres 'gpu:tesla:x' is not a number"}


@pytest.mark.parametrize("text", ["", "node1 gpu:2\n", "node 1|gpu:2\n"])
def test_a_reply_that_is_not_node_lines_is_refused(text: str) -> None:
    with pytest.raises(OutputParseError):
        parse_sinfo_gpus(text)


def _runner(gres: str) -> ReplayRunner:
    states = "".join(f"{n}|idle\n" for n in RECORDED)
    return ReplayRunner(
        {
            # sinfo twice a poll: the states ('%N|%T'), then the GPUs ('%N|%G').
            "sinfo": [recorded(states), recorded(gres)] * 3,
            "squeue": [recorded("")],
            "scontrol": [recorded("No reservations in the system\n")],
        }
    )


def test_the_pool_source_reads_the_bf_partitions_gpus() -> None:
    runner = _runner(GRES)
    sched = SlurmScheduler(bf_partitions=("bf",), read_gpus=True)
    states = sched.read_nodes(runner, 0.0)
    assert states.gpus == RECORDED and not states.gpu_errors
    gres_argv = [a for a, _ in runner.calls if "%N|%G" in a]
    assert gres_argv == [("sinfo", "-N", "-h", "-o", "%N|%G", "-p", "bf")]
    source = LivePoolSource(sched, _runner(GRES), clock=lambda: 100.0)
    source.poll()
    assert source.view().gpus == RECORDED


def test_gpus_are_not_read_unless_asked() -> None:
    runner = _runner(GRES)
    states = SlurmScheduler(bf_partitions=("bf",)).read_nodes(runner, 0.0)
    assert states.gpus == {} and len(runner.calls) == 1


def test_an_unparseable_gres_reply_is_one_line_and_the_last_pool_stays(caplog) -> None:  # type: ignore[no-untyped-def]
    sched = SlurmScheduler(bf_partitions=("bf",), read_gpus=True)
    runner = _runner(GRES)
    states = "".join(f"{n}|idle\n" for n in RECORDED)
    runner.set_replies(
        "sinfo", [recorded(states), recorded(GRES), recorded(states), recorded("garbage\n")]
    )
    source = LivePoolSource(sched, runner, clock=lambda: 100.0)
    source.poll()
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        caplog.clear()
        assert source.read() is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "unparseable output: line 1: expected 'NODE|GRES': 'garbage'" in line
    assert source.view().gpus == RECORDED  # the last good reading is kept
