"""The problem's cheap checks (issue 39) refuse what the full ones refuse, with the same
message: the windows' one-pass check and ``TrainerSpec.with_nodes``."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bftrainer.milp import Problem, ProblemError, TrainerSpec
from bftrainer.milp.problem import _check_number, _usual_windows

POOL = ("n1", "n2", "n3")
SPEC = TrainerSpec("t", 1, 2, 18.0, 12.0, ((1.0, 100.0), (2.0, 190.0)), ("n1",))


def checked_node_by_node(windows: dict[str, Any]) -> str | None:
    """What the node-by-node checks alone say of ``windows`` (None: valid)."""
    problem = Problem(POOL, (SPEC,))
    try:
        for node, w in windows.items():  # the loop of Problem.__post_init__, as it is
            if node not in problem.pool_set:
                raise ProblemError(f"windows: node {node!r} is not in the pool")
            if w is not None:
                _check_number(w, f"windows: node {node!r}", minimum=0.0)
    except ProblemError as e:
        return str(e)
    return None


WINDOW_VALUES = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 10**6),
    st.booleans(),
    st.sampled_from(["soon", 0.0, -0.0, 1e308, math.inf, -math.inf, math.nan]),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(("n1", "n2", "n3", "n9")), WINDOW_VALUES, max_size=4))
def test_windows_are_refused_as_the_node_by_node_checks_refuse_them(
    windows: dict[str, Any],
) -> None:
    expected = checked_node_by_node(windows)
    if _usual_windows(windows, frozenset(POOL)):
        assert expected is None  # the shortcut passes only what the full checks pass
    try:
        Problem(POOL, (SPEC,), windows_s=windows)
        got = None
    except ProblemError as e:
        got = str(e)
    assert got == expected


@pytest.mark.parametrize(
    ("windows", "message"),
    [
        ({"n1": 10.0, "n9": 5.0}, "windows: node 'n9' is not in the pool"),
        ({"n1": 10.0, "n2": math.nan}, "windows: node 'n2' is nan, expected a finite number"),
        ({"n1": math.inf}, "expected a finite number"),
        ({"n1": -1.0}, "expected >= 0"),
        ({"n1": True}, "expected a number"),
        ({"n1": 10.0, "n2": None, "n3": 7}, None),  # ints and None are valid too
    ],
)
def test_windows_messages(windows: dict[str, Any], message: str | None) -> None:
    if message is None:
        assert Problem(POOL, (SPEC,), windows_s=windows).windows_s == windows
        return
    with pytest.raises(ProblemError, match=message):
        Problem(POOL, (SPEC,), windows_s=windows)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from((*POOL, "x", "y")), max_size=4))
def test_with_nodes_is_the_spec_built_with_those_nodes(nodes: list[str]) -> None:
    held = tuple(nodes)
    try:
        full: TrainerSpec | str = replace(SPEC, nodes=held)  # every check again
    except ProblemError as e:
        full = str(e)
    try:
        quick: TrainerSpec | str = SPEC.with_nodes(held)
    except ProblemError as e:
        quick = str(e)
    if isinstance(full, str):
        assert quick == full
    else:
        assert isinstance(quick, TrainerSpec)
        assert quick == full and quick.__dict__ == full.__dict__
    assert SPEC.nodes == ("n1",)  # the original is unchanged


def test_a_pool_listing_a_node_twice_is_named() -> None:
    with pytest.raises(ProblemError, match="pool lists node 'n2' twice"):
        Problem(("n1", "n2", "n3", "n2"), (SPEC,))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(["n1", "n2", "n3", "n4", "x", ""]), max_size=6), max_size=5)
)
def test_the_pool_set_of_an_equal_pool_is_its_own_set(pools: list[list[str]]) -> None:
    """Problems built one after another (a replay's decisions): each one's pool_set is
    ``frozenset`` of its own pool, whether or not the last pool was equal, and a pool
    listing a node twice is refused all the same."""
    for names in pools:
        for pool in (tuple(names), tuple(names), list(names)):
            if len(set(pool)) != len(pool):
                with pytest.raises(ProblemError, match="twice"):
                    Problem(pool, ())  # type: ignore[arg-type]
                continue
            problem = Problem(pool, ())  # type: ignore[arg-type]
            assert problem.pool_set == frozenset(pool)
            assert type(problem.pool_set) is frozenset
