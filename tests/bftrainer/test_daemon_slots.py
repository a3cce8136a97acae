"""The daemon's restore when the slots per node changed under running trainers (a
restart with another ``--slots-per-node``), or when the scheduler does not answer at
start: one clear line (a try), and nothing recorded lost.

No scheduler runs here: ``FixedHolders`` answers every holder of the store as running,
as Horovod's ``FixedHosts`` answers discovery; the restore's own logic is the real one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from bftrainer.daemon import Daemon, DaemonConfig
from bftrainer.holders.base import HolderStatus, ReconcileResult
from bftrainer.idle_monitor.runner import CommandError
from bftrainer.state import Store, ensure_state_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


class FixedHolders:
    scheduler = "slurm"

    def survey(self, known: Mapping[str, str]) -> ReconcileResult:
        return ReconcileResult(live={j: HolderStatus(n, "running") for j, n in known.items()})


def shared_node(state_dir: Path) -> tuple[Store, str, str]:
    """Two trainers on node n1's two slots, a third node n2 held for the first."""
    store = Store.open(state_dir)
    for job, node in (("7", "n1"), ("8", "n2")):
        store.add_holder(job, node)
        store.set_holder_state(job, "running")
    a, b = (store.submit(str(EXAMPLE), (), backend="torchrun", n_max=3) for _ in range(2))
    for tid in (a, b):
        store.set_trainer_state(tid, "running")
    store.record_allocation(a, ["n1", "n2"], slots={"n1": [1], "n2": [0]})
    store.record_allocation(b, ["n1"], slots={"n1": [0]})
    store.set_setting("slots_per_node", 2)
    return store, a, b


def restore(store: Store, state_dir: Path, slots: int) -> dict[str, tuple[str, ...]]:
    config = DaemonConfig(slots_per_node=slots)
    daemon = Daemon(store, state_dir, None, FixedHolders(), config)  # type: ignore[arg-type]
    return {t.id: t.nodes for t in daemon.restore().trainers}


def test_the_same_slot_count_takes_every_slot_back(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    state_dir = ensure_state_dir(tmp_path / "state")
    store, a, b = shared_node(state_dir)
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        caplog.clear()  # what the set-up logged (a level other tests may have set)
        assert restore(store, state_dir, 2) == {a: ("n1", "n2"), b: ("n1",)}
    assert not caplog.records


@pytest.mark.parametrize("slots", [1, 4])
def test_a_changed_slot_count_is_one_line_and_loses_nothing(
    tmp_path: Path,
    caplog,
    slots: int,  # type: ignore[no-untyped-def]
) -> None:
    state_dir = ensure_state_dir(tmp_path / "state")
    store, a, b = shared_node(state_dir)
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        caplog.clear()  # what the set-up logged (a level other tests may have set)
        nodes = restore(store, state_dir, slots)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"slots per node changed from 2 to {slots} while trainers run on n1")
    if slots == 1:
        # Slot 1 of n1 no longer exists: a gives it up and goes on with n2.
        assert nodes == {a: ("n2",), b: ("n1",)}
        assert f"1 of {a}'s slot(s) on n1 no longer exist" in line
    else:
        assert nodes == {a: ("n1", "n2"), b: ("n1",)}
    assert "running workers keep the CPUs and GPUs they started with" in line
    # Nothing recorded is lost: both trainers still run, their history is whole.
    assert {t.id: t.state for t in store.trainers()} == {a: "running", b: "running"}
    assert store.allocation_history(a)[0].slots == {"n1": (1,), "n2": (0,)}
    assert store.get_setting("slots_per_node") == slots


class SilentScheduler(FixedHolders):
    """squeue fails ``failures`` times (the controller restarting), then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def survey(self, known: Mapping[str, str]) -> ReconcileResult:
        if self.failures > 0:
            self.failures -= 1
            raise CommandError(["squeue", "--me"], "here", "timed out after 20 s")
        return super().survey(known)


def test_a_scheduler_silent_at_start_is_one_line_a_try_then_the_daemon_goes_on(
    tmp_path: Path,
    caplog,  # type: ignore[no-untyped-def]
) -> None:
    state_dir = ensure_state_dir(tmp_path / "state")
    store, a, b = shared_node(state_dir)
    config = DaemonConfig(slots_per_node=2, poll_interval_s=0.1)
    daemon = Daemon(store, state_dir, None, SilentScheduler(2), config)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="bftrainer"):
        caplog.clear()  # what the set-up logged (a level other tests may have set)
        state = daemon.restore()
    assert state is not None and {t.id: t.nodes for t in state.trainers} == {
        a: ("n1", "n2"),
        b: ("n1",),
    }
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("holders not read at start" in ln for ln in lines), lines
    assert "timed out after 20 s" in lines[0]


def test_a_daemon_asked_to_stop_while_the_scheduler_is_silent_stops(tmp_path: Path) -> None:
    state_dir = ensure_state_dir(tmp_path / "state")
    store, _, _ = shared_node(state_dir)
    config = DaemonConfig(slots_per_node=2, poll_interval_s=0.1)
    daemon = Daemon(store, state_dir, None, SilentScheduler(10**9), config)  # type: ignore[arg-type]
    threading.Timer(0.3, daemon.request_stop).start()
    daemon.run()  # returns: stopped before the scheduler answered, nothing changed
    assert store.holders(live_only=True), "the holders' records are kept"
