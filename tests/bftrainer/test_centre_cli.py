"""Centre mode on the command line, without Slurm: the allocator's refusals at start,
the users' commands with no allocator, and an agent's link to a live allocator.

Slurm, real agents and trainers, two accounts: tests/bftrainer/test_centre_e2e.py.
"""

from __future__ import annotations

import math
from pathlib import Path

from click.testing import CliRunner

from bftrainer.centre.agent_link import AgentLink
from bftrainer.centre.allocator import Allocator, CentreSettings
from bftrainer.cli import cli
from bftrainer.loop import (
    Assignment,
    Loop,
    LoopView,
    PolicyInputs,
    Polled,
    TrainerState,
    VirtualClock,
)
from bftrainer.loop.churn import Churn
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import Config
from bftrainer.state import Store, ensure_state_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
CENTRE = ["daemon", "--centre", "--scheduler", "slurm", "--bf-partition", "bf"]


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def test_the_allocator_needs_a_socket_dir() -> None:
    code, out = run(*CENTRE, env={"BFTRAINER_SOCKET_DIR": ""})
    assert code == 2 and "--centre needs --socket-dir DIR" in out


def test_the_allocator_refuses_a_socket_dir_others_can_write(tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    sockets.chmod(0o777)
    code, out = run(*CENTRE, "--socket-dir", str(sockets))
    assert code == 1
    assert out.strip().splitlines()[-1] == (
        f"Error: socket directory {sockets} is writable by group or others (mode 777): "
        "make it 0755 (chmod go-w)"
    )
    assert not (sockets / "centre.sock").exists()


def test_the_allocator_refuses_a_path_that_is_not_a_socket(tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    (sockets / "centre.sock").write_text("mine")
    code, out = run(*CENTRE, "--socket-dir", str(sockets))
    assert code == 1 and "exists and is not a socket" in out.strip().splitlines()[-1]
    assert (sockets / "centre.sock").read_text() == "mine"


def test_the_allocator_refuses_shared_nodes(tmp_path: Path) -> None:
    """A node is held by one user's holder: its slots cannot go to several users."""
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    for slots in ("2", "gres"):
        code, out = run(*CENTRE, "--socket-dir", str(sockets), "--slots-per-node", slots)
        assert code == 2
        assert f"--centre: {slots} slots per node is not supported" in out
        assert not (sockets / "centre.sock").exists()


def test_users_commands_say_when_no_allocator_runs(tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    state = tmp_path / "state"
    for args in (
        ("submit", str(EXAMPLE), "--backend", "torchrun"),
        ("status", "someone/t0001"),
        ("cancel", "t0001"),
        ("logs", "someone/t0001"),
    ):
        code, out = run(
            *args, "--state-dir", str(state), env={"BFTRAINER_SOCKET_DIR": str(sockets)}
        )
        assert code == 1, args
        assert out.strip().splitlines() == [
            f"Error: {sockets}/centre.sock: no allocator socket there (is the centre's "
            "allocator running?)"
        ], args
    assert not state.exists()  # no agent was started, nothing was queued


def test_status_without_the_allocator_shows_what_the_agent_records(tmp_path: Path) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    state = ensure_state_dir(tmp_path / "state")
    Store.open(state).close()
    code, out = run("status", "--state-dir", str(state), env={"BFTRAINER_SOCKET_DIR": str(sockets)})
    assert code == 0
    assert out.splitlines()[0] == (
        f"centre: the allocator cannot be reached ({sockets}/centre.sock: no allocator "
        "socket there (is the centre's allocator running?))"
    )


class NoPool:
    def prime(self, now_s: float) -> tuple[str, ...]:
        return ("n1", "n2")

    def poll(self, now_s: float) -> Polled:
        return Polled()


def test_an_agent_follows_a_live_allocator_and_keeps_its_nodes_when_it_dies(
    tmp_path: Path,
) -> None:
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    clock = VirtualClock(0.0)
    allocator = Allocator(
        sockets, NoPool(), Config(), CentreSettings(), {"bftrainer": "test"}, clock=clock
    )
    store = Store.open(ensure_state_dir(tmp_path / "state"))
    allocator.server.start()
    try:
        allocator.start_loop()
        link = AgentLink(sockets)
        job = JobSpec("t0001", "m", 0.0, 1, 2, 0.0, 0.0, math.inf, ((1.0, 1.0), (2.0, 2.0)))
        trainer = TrainerState(job)
        view = LoopView((trainer,), frozenset())  # what the agent's loop hands its reader
        link.attach(store)
        link.read(0.0, view)
        assert link.poll(0.0).inputs == ()  # registered; not decided yet
        assert allocator.loop is not None
        allocator.loop.step(until_s=1.0)
        link.read(1.0, view)
        assert link.poll(1.0).inputs == (Assignment({"t0001": ("n1", "n2")}),)
        assert link.assignment == {"t0001": ("n1", "n2")}
        # No holder runs yet: no node to train on, both to hold.
        inputs = PolicyInputs((), [trainer], Churn(), assignment=link.assignment)
        decision = link.policy.decide(inputs)
        assert decision.nodes == {"t0001": ()} and decision.hold == {"n1", "n2"}
        link.read(2.0, view)
        assert link.poll(2.0).inputs == ()  # nothing moved: nothing to decide
    finally:
        allocator.server.close()
        store.close()
    # The allocator is gone: the agent keeps what it was given.
    link.read(3.0, view)
    assert link.poll(3.0).inputs == ()
    assert link.assignment == {"t0001": ("n1", "n2")}
    assert isinstance(allocator.loop, Loop)
