"""The centre's allocator on a fixed pool, with agents as the kernel would name them:
the real loop and MILP decide; no Slurm, no trainers (tests/bftrainer/test_centre_e2e.py
runs those)."""

from __future__ import annotations

import math
import os
import pwd

import pytest

from bftrainer.centre import protocol
from bftrainer.centre.allocator import Allocator, CentreSettings
from bftrainer.centre.protocol import SyncRequest, TrainerReport
from bftrainer.centre.transport import Peer, Request, RequestRefused, call
from bftrainer.daemon.hold_plan import plan_assigned
from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import PolicyInputs, Polled, PoolChange, TrainerState, VirtualClock
from bftrainer.loop.churn import Churn
from bftrainer.loop.jobs import JobSpec
from bftrainer.policies.config import Config
from bftrainer.policies.follow import FollowPolicy

ALICE = Peer(uid=50001, gid=50001, pid=1, user="alice")
BOB = Peer(uid=50002, gid=50002, pid=2, user="bob")
NODES = tuple(f"n{i:02d}" for i in range(8))
LEASE_S = 60.0


class FixedPool:
    """A pool that changes only when the test says."""

    def __init__(self, nodes: tuple[str, ...]) -> None:
        self.nodes = nodes
        self.changes: list[PoolEvent] = []

    def prime(self, now_s: float) -> tuple[str, ...]:
        return self.nodes

    def poll(self, now_s: float) -> Polled:
        changes, self.changes = self.changes, []
        return Polled(tuple(PoolChange(e) for e in changes))


def report(tid: str, n_max: int = 8, nodes: tuple[str, ...] = ()) -> TrainerReport:
    return TrainerReport(
        id=tid,
        model="train_mlp.py",
        submit_s=0.0,
        n_min=1,
        n_max=n_max,
        # Free rescales: the fairness rule alone decides (with costs, the allocator's
        # look-ahead, from the churn watched so far, decides whether a move pays).
        rescale_up_s=0.0,
        rescale_down_s=0.0,
        work_samples=1e6,
        nodes=nodes,
    )


def make(tmp_path, fair_by: str = "user") -> tuple[Allocator, VirtualClock]:
    clock = VirtualClock(1000.0)
    allocator = Allocator(
        tmp_path,
        FixedPool(NODES),
        Config(fair_by=fair_by, objective="speedup", fairness_p=-1.0, fair_share_speedup=True),
        CentreSettings(agent_lease_s=LEASE_S),
        {"bftrainer": "test"},
        clock=clock,
    )
    return allocator, clock


def sync(allocator: Allocator, peer: Peer, *reports: TrainerReport) -> dict[str, tuple[str, ...]]:
    return dict(allocator.sync(peer, SyncRequest(reports)).assignment)


def step(allocator: Allocator, clock: VirtualClock, dt_s: float = 1.0) -> None:
    assert allocator.loop is not None
    allocator.loop.step(until_s=clock.now_s() + dt_s)


def holding(
    allocator: Allocator, peer: Peer, tid: str, n_max: int, missing: str = ""
) -> tuple[str, ...]:
    """``peer``'s agent syncs one trainer on what it was assigned, holding all of it
    but ``missing`` (a node its holder never starts on); its new assignment."""
    assigned = allocator._snapshot.get(f"{peer.user}/{tid}", ())
    held = tuple(n for n in assigned if n != missing)
    request = SyncRequest((report(tid, n_max, nodes=held),), held=held)
    return tuple(allocator.sync(peer, request).assignment.get(tid, ()))


def sharing(tmp_path, pool: FixedPool, n_max: int) -> tuple[Allocator, VirtualClock]:
    """An allocator whose refusals come after 30 s, alice's and bob's trainer decided on."""
    clock = VirtualClock(1000.0)
    settings = CentreSettings(hold_grace_s=30.0, refused_for_s=600.0)
    config = Config(fair_by="user", objective="speedup", fairness_p=-1.0)
    allocator = Allocator(tmp_path, pool, config, settings, {}, clock=clock)
    allocator.start_loop()
    holding(allocator, ALICE, "t0001", n_max)
    holding(allocator, BOB, "t0001", n_max)
    step(allocator, clock)
    return allocator, clock


def test_a_node_a_users_agent_never_holds_goes_to_another_user(tmp_path, caplog) -> None:
    allocator, clock = sharing(tmp_path, FixedPool(NODES), n_max=8)
    missing = holding(allocator, BOB, "t0001", 8)[0]  # say, outside bob's QOS
    for _ in range(2):  # within the grace: a holder may just be slow to start
        step(allocator, clock, 10.0)
        assert len(holding(allocator, ALICE, "t0001", 8)) == 4
        assert missing in holding(allocator, BOB, "t0001", 8, missing)
    step(allocator, clock, 11.0)
    holding(allocator, BOB, "t0001", 8, missing)
    step(allocator, clock)
    bob = holding(allocator, BOB, "t0001", 8, missing)
    alice = holding(allocator, ALICE, "t0001", 8)
    assert len(bob) == 3 and missing not in bob
    assert len(alice) == 5 and missing in alice  # decided again, not left idle
    assert f"bob's agent has not held {missing} within 30 s" in caplog.text


def test_a_node_another_users_holder_still_occupies_is_not_refused(tmp_path, caplog) -> None:
    allocator, clock = sharing(tmp_path, FixedPool(NODES), n_max=8)
    alices = holding(allocator, ALICE, "t0001", 8)
    bobs = holding(allocator, BOB, "t0001", 8)
    # Bob's trainer ends; his holders stay on its nodes a while (their lease).
    allocator.sync(BOB, SyncRequest((), held=bobs))
    step(allocator, clock)
    assert len(holding(allocator, ALICE, "t0001", 8)) == 8
    for _ in range(4):
        step(allocator, clock, 10.0)
        allocator.sync(BOB, SyncRequest((), held=bobs))
        request = SyncRequest((report("t0001", 8, nodes=alices),), held=alices)
        assert len(allocator.sync(ALICE, request).assignment["t0001"]) == 8
    assert "has not held" not in caplog.text
    # Once his holders have ended, alice's own wait begins.
    allocator.sync(BOB, SyncRequest((), held=()))
    step(allocator, clock, 31.0)
    allocator.sync(ALICE, request)
    step(allocator, clock)
    assert len(allocator.sync(ALICE, request).assignment["t0001"]) == 4


def test_a_node_refused_to_a_user_is_swapped_for_a_free_one(tmp_path) -> None:
    pool = FixedPool((*NODES, "n99"))
    allocator, clock = sharing(tmp_path, pool, n_max=4)
    missing = holding(allocator, BOB, "t0001", 4)[0]
    free = (
        set(pool.nodes)
        - set(allocator._snapshot["alice/t0001"])
        - set(allocator._snapshot["bob/t0001"])
    )
    step(allocator, clock, 31.0)
    holding(allocator, BOB, "t0001", 4, missing)
    step(allocator, clock)
    bob = holding(allocator, BOB, "t0001", 4, missing)
    assert len(bob) == 4 and missing not in bob and free <= set(bob)


def test_a_user_with_many_trainers_does_not_crowd_out_a_user_with_one(tmp_path) -> None:
    allocator, clock = make(tmp_path)
    allocator.start_loop()
    sync(allocator, ALICE, *(report(f"t000{i}") for i in range(1, 4)))
    sync(allocator, BOB, report("t0001"))
    step(allocator, clock)
    alice = sync(allocator, ALICE, *(report(f"t000{i}") for i in range(1, 4)))
    bob = sync(allocator, BOB, report("t0001"))
    # Each user's own ids, never the other's; the pool split evenly between the users.
    assert set(alice) == {"t0001", "t0002", "t0003"} and set(bob) == {"t0001"}
    alice_nodes = [n for nodes in alice.values() for n in nodes]
    assert len(alice_nodes) == 4 and len(bob["t0001"]) == 4
    assert not set(alice_nodes) & set(bob["t0001"])


def test_by_trainer_the_same_demand_gives_the_many_more(tmp_path) -> None:
    allocator, clock = make(tmp_path, fair_by="trainer")
    allocator.start_loop()
    sync(allocator, ALICE, *(report(f"t000{i}") for i in range(1, 4)))
    sync(allocator, BOB, report("t0001"))
    step(allocator, clock)
    bob = sync(allocator, BOB, report("t0001"))
    assert len(bob["t0001"]) == 2  # 8 nodes over 4 trainers


def test_another_users_trainer_is_refused_in_one_line(tmp_path) -> None:
    allocator, _ = make(tmp_path)
    allocator.start_loop()
    sync(allocator, BOB, report("t0001"))
    for kind in (protocol.CANCEL, protocol.STATUS):
        with pytest.raises(RequestRefused) as refused:
            allocator.handle(ALICE, Request(kind, {"trainer": "bob/t0001"}))
        assert str(refused.value) == (
            f"uid 50001 (alice) may not {'cancel' if kind == protocol.CANCEL else 'see'} "
            "bob/t0001: it belongs to bob"
        )
    # Nothing reached bob's agent.
    assert allocator.sync(BOB, SyncRequest((report("t0001"),))).cancel == ()


def test_own_cancel_reaches_the_agent_once(tmp_path) -> None:
    allocator, _ = make(tmp_path)
    allocator.start_loop()
    sync(allocator, BOB, report("t0001"))
    reply = allocator.handle(BOB, Request(protocol.CANCEL, {"trainer": "t0001"}))
    assert reply == {"trainer": "bob/t0001", "requested": True}
    assert allocator.sync(BOB, SyncRequest((report("t0001"),))).cancel == ("t0001",)
    assert allocator.sync(BOB, SyncRequest((report("t0001"),))).cancel == ()


def test_status_shows_others_only_by_user_and_count(tmp_path) -> None:
    allocator, clock = make(tmp_path)
    allocator.start_loop()
    sync(allocator, ALICE, report("t0001"))
    sync(allocator, BOB, report("t0001"))
    step(allocator, clock)
    status = allocator.status(ALICE, {})
    mine = [t for t in status["trainers"] if "id" in t]
    others = [t for t in status["trainers"] if "id" not in t]
    assert [t["id"] for t in mine] == ["alice/t0001"] and len(mine[0]["nodes"]) == 4
    assert others == [{"user": "bob", "nodes": 4}]


def test_a_silent_agent_loses_its_nodes_after_the_lease_never_before(tmp_path) -> None:
    allocator, clock = make(tmp_path)
    allocator.start_loop()
    sync(allocator, ALICE, report("t0001"))
    sync(allocator, BOB, report("t0001"))
    step(allocator, clock)
    # Bob's agent stops answering; alice's goes on syncing.
    for _ in range(int(LEASE_S / 10) - 1):
        step(allocator, clock, 10.0)
        alice = sync(allocator, ALICE, report("t0001"))
        assert len(alice["t0001"]) == 4, "reclaimed before the lease ran out"
    step(allocator, clock, 20.0)  # past the lease
    step(allocator, clock)
    alice = sync(allocator, ALICE, report("t0001"))
    assert len(alice["t0001"]) == 8
    # Bob's agent comes back: registered anew, and the pool split again.
    assert sync(allocator, BOB, report("t0001")) == {}
    step(allocator, clock)
    assert len(sync(allocator, BOB, report("t0001"))["t0001"]) == 4
    assert "bob/t0001~1" in allocator.loop.trainers  # type: ignore[union-attr]


def test_a_restarted_allocator_keeps_what_the_agents_report(tmp_path) -> None:
    allocator, clock = make(tmp_path)
    # Before the loop exists: the agents' first syncs after a restart (each says the
    # nodes its holders run on, as the agent does: bftrainer.centre.agent_link).
    for peer, mine in ((ALICE, NODES[:5]), (BOB, NODES[5:])):
        request = SyncRequest((report("t0001", nodes=mine),), held=mine)
        assert allocator.sync(peer, request).assignment == {}
    loop = allocator.start_loop()
    assert loop.trainers["alice/t0001"].nodes == NODES[:5]
    assert loop.trainers["bob/t0001"].nodes == NODES[5:]
    step(allocator, clock)
    # Then the rule applies, moving as few nodes as it needs.
    alice = sync(allocator, ALICE, report("t0001"))["t0001"]
    bob = sync(allocator, BOB, report("t0001"))["t0001"]
    assert len(alice) == len(bob) == 4
    assert set(alice) <= set(NODES[:5]) and set(NODES[5:]) <= set(bob)


def test_a_trainer_gone_from_its_agents_report_is_retired(tmp_path) -> None:
    allocator, clock = make(tmp_path)
    allocator.start_loop()
    sync(allocator, ALICE, report("t0001"), report("t0002"))
    step(allocator, clock)
    sync(allocator, ALICE, report("t0002"))
    step(allocator, clock)
    assert set(sync(allocator, ALICE, report("t0002"))["t0002"]) == set(NODES)


def test_a_preempted_node_leaves_its_trainer(tmp_path) -> None:
    allocator, clock = make(tmp_path)
    allocator.start_loop()
    sync(allocator, ALICE, report("t0001"))
    step(allocator, clock)
    allocator.pool.changes.append(PoolEvent(clock.now_s(), left=frozenset({"n03"})))  # type: ignore[attr-defined]
    step(allocator, clock)
    assert "n03" not in sync(allocator, ALICE, report("t0001"))["t0001"]


@pytest.mark.parametrize(
    "body, why",
    [
        ({"trainers": "x"}, "'trainers' must be a list"),
        ({"trainers": [{"id": "../etc"}]}, "trainer id '../etc'"),
        (
            {"trainers": [{**report("t0001").to_dict(), "n_max": 0}]},
            "trainer t0001: 'n_max' is 0",
        ),
        (
            {"trainers": [{**report("t0001").to_dict(), "nodes": ["a b"]}]},
            "node 'a b' is not a node name",
        ),
        ({"trainers": [report("t0001").to_dict()] * 2}, "appears twice"),
        ({"trainers": [], "held": "n01"}, "'held' is not a list of node names"),
        ({"trainers": [], "held": ["n01", ""]}, "'held': node '' is not a node name"),
    ],
)
def test_a_bad_sync_is_refused_naming_the_field(tmp_path, body, why) -> None:
    allocator, _ = make(tmp_path)
    with pytest.raises(RequestRefused, match=why):
        allocator.handle(ALICE, Request(protocol.SYNC, body))


def test_through_the_socket_the_kernel_names_the_peer(tmp_path) -> None:
    """The user comes from SO_PEERCRED: this process's account, whatever it says."""
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    allocator, clock = make(sockets)
    allocator.server.start()
    try:
        allocator.start_loop()
        me = pwd.getpwuid(os.getuid()).pw_name
        path = sockets / "centre.sock"
        call(path, protocol.SYNC, SyncRequest((report("t0001"),)).to_dict())
        step(allocator, clock)
        reply = call(path, protocol.SYNC, SyncRequest((report("t0001"),)).to_dict())
        assert reply["assignment"] == {"t0001": list(NODES)}
        assert f"{me}/t0001" in allocator.loop.trainers  # type: ignore[union-attr]
        with pytest.raises(RequestRefused, match="may not cancel bob/t0001: it belongs to bob"):
            call(path, protocol.CANCEL, {"trainer": "bob/t0001"})
    finally:
        allocator.server.close()


# ---- the agent's side: pure parts ---------------------------------------------------------


def trainer(tid: str, nodes: tuple[str, ...] = (), n_min: int = 1) -> TrainerState:
    job = JobSpec(tid, "m", 0.0, n_min, 4, 1.0, 1.0, math.inf, ((1.0, 1.0),))
    return TrainerState(job, nodes=nodes)


def test_follow_policy_gives_assigned_nodes_whose_holder_runs() -> None:
    policy = FollowPolicy()
    assignment = {"t0001": ("a", "b", "c"), "t0002": ("d", "e")}
    pool = ("a", "b", "d", "x")  # c's and e's holders are not running yet
    trainers = [trainer("t0001"), trainer("t0002", n_min=2), trainer("t0003", ("x",))]
    decision = policy.decide(PolicyInputs(pool, trainers, Churn(), assignment=assignment))
    assert decision.nodes == {"t0001": ("a", "b"), "t0002": (), "t0003": ("x",)}
    assert decision.hold == {"a", "b", "c", "d", "e"}  # what the holders keep or start


def test_holders_follow_the_assignment() -> None:
    plan = plan_assigned(
        pool={"a", "b", "c", "d"},
        running={"a", "z"},
        pending={"b"},
        allocated={"a"},
        assigned={"b", "c", "q"},
    )
    # c is assigned and idle: held; a is still in use: kept until the loop frees it; z
    # is neither: released; q is not in the pool: not asked for.
    assert plan.acquire == ("c",) and plan.release == ("z",)


def test_one_agent_per_user_a_dead_ones_successor_takes_over(tmp_path) -> None:
    allocator, _ = make(tmp_path)
    allocator.start_loop()
    first = Peer(uid=50001, gid=50001, pid=os.getpid(), user="alice")  # alive: this process
    sync(allocator, first, report("t0001"))
    second = Peer(uid=50001, gid=50001, pid=first.pid + 10**6, user="alice")
    with pytest.raises(RequestRefused, match=r"alice has an agent already \(pid \d+\)"):
        sync(allocator, second, report("t0002"))
    # The first one dies (kill -9): its successor (same uid) is the agent now.
    allocator.alive = lambda pid, started: False  # type: ignore[method-assign]
    assert sync(allocator, second, report("t0001")) == {}
    assert allocator.status(second, {})["queued"] == ["alice/t0001"]
