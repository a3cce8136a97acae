"""The hold plan: never more than trainers can use, never a node a trainer runs on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bftrainer.daemon.hold_plan import plan_holders

NODES = [f"n{i}" for i in range(12)]


@st.composite
def situations(draw: st.DrawFn) -> dict:
    pool = draw(st.sets(st.sampled_from(NODES)))
    held = draw(st.sets(st.sampled_from(NODES)))
    running = draw(st.sets(st.sampled_from(sorted(held)))) if held else set()
    pending = held - running
    allocated = draw(st.sets(st.sampled_from(sorted(running)))) if running else set()
    windows = {n: draw(st.one_of(st.none(), st.floats(min_value=1, max_value=1e5))) for n in pool}
    demand = draw(st.integers(min_value=0, max_value=16))
    return dict(
        pool=pool,
        windows_s=windows,
        running=running,
        pending=pending,
        allocated=allocated,
        demand=demand,
    )


@given(situations())
def test_plan_invariants(s: dict) -> None:
    plan = plan_holders(**s)
    held = s["running"] | s["pending"]
    assert set(plan.acquire) <= s["pool"] - held, "acquires only free pool nodes"
    assert set(plan.release) <= held - s["allocated"], "never releases a node in use"
    after = (held - set(plan.release)) | set(plan.acquire)
    assert s["allocated"] <= after
    # Held nodes outside the pool are let go unless a trainer runs on them.
    assert not (after - s["pool"] - s["allocated"])
    target = max(min(s["demand"], len(s["pool"])), len(s["allocated"]))
    assert len(after) == target


def test_prefers_long_windows_and_releases_pending_first() -> None:
    plan = plan_holders(
        pool=["a", "b", "c", "d"],
        windows_s={"a": 60.0, "b": None, "c": 3600.0, "d": 600.0},
        running=[],
        pending=[],
        allocated=[],
        demand=2,
    )
    assert plan.acquire == ("b", "c")  # open-ended, then the longest window
    plan = plan_holders(
        pool=["a", "b", "c"],
        windows_s={"a": None, "b": None, "c": 60.0},
        running=["a", "c"],
        pending=["b"],
        allocated=["a"],
        demand=1,
    )
    assert plan.release == ("b", "c")
    assert plan.acquire == ()


def test_demand_zero_releases_all_unused() -> None:
    plan = plan_holders(
        pool=["a", "b"], windows_s={}, running=["a", "b"], pending=[], allocated=[], demand=0
    )
    assert plan.release == ("a", "b")


def test_a_node_kept_is_not_released_and_counts_as_held() -> None:
    spare = dict(pool=["a", "b", "c"], windows_s={}, running=["a", "b"], pending=[])
    plan = plan_holders(**spare, allocated=["a"], demand=1, keep=["b"])
    assert plan.release == () and plan.acquire == ()
    plan = plan_holders(**spare, allocated=["a"], demand=2, keep=["b"])
    assert plan.release == () and plan.acquire == ()  # b serves the second trainer
    plan = plan_holders(**spare, allocated=["a"], demand=1)
    assert plan.release == ("b",)
