"""TraceWriter: what a live recorder relies on — append-only, restartable, crash-tolerant."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace import (
    TraceFormatError,
    TraceInUseError,
    TraceWriter,
    load_trace,
    parse_time_s,
    quantize_time_s,
)

T0 = parse_time_s("2021-02-10 00:00:00")


def test_first_write_is_the_snapshot_then_only_changes(tmp_path: Path) -> None:
    path = tmp_path / "pool.csv"
    with TraceWriter(path) as writer:
        assert path.read_text() == "time,node,idle,window_s\n"
        assert writer.write(T0, {"a": True, "b": False, "c": False}, {"a": 600.0}) == 3
        assert writer.write(T0 + 10, {"a": True, "b": False, "c": False}) == 0
        assert writer.write(T0 + 20, {"a": False, "b": True, "c": False}, {"b": None}) == 2
        assert writer.write(T0 + 30, {"a": False, "b": True, "c": False, "d": True}) == 1
        assert dict(writer.state) == {"a": False, "b": True, "c": False, "d": True}
        assert writer.size_bytes == path.stat().st_size
    assert path.read_text().splitlines() == [
        "time,node,idle,window_s",
        "2021-02-10T00:00:00Z,a,1,600",
        "2021-02-10T00:00:00Z,b,0,",
        "2021-02-10T00:00:00Z,c,0,",
        "2021-02-10T00:00:20Z,a,0,",
        "2021-02-10T00:00:20Z,b,1,",
        "2021-02-10T00:00:30Z,d,1,",
    ]
    trace = load_trace(path)
    assert trace.nodes == ("a", "b", "c", "d")
    assert trace.initial_windows_s == {"a": 600.0}
    assert trace.events == (
        PoolEvent(T0 + 20, joined=frozenset({"b"}), left=frozenset({"a"}), windows_s={"b": None}),
        PoolEvent(T0 + 30, joined=frozenset({"d"}), windows_s={"d": None}),
    )


def test_time_going_backwards_is_refused(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "pool.csv") as writer:
        writer.write(T0 + 100, {"a": True})
        with pytest.raises(
            TraceFormatError, match=r"pool\.csv: time 2021-02-10T00:01:39Z goes back"
        ):
            writer.write(T0 + 99, {"a": False})
        assert writer.write(T0 + 100, {"a": True}) == 0  # same time, nothing new: fine
        with pytest.raises(TraceFormatError, match="would merge"):
            writer.write(T0 + 100, {"a": False})
        assert writer.write(T0 + 101, {"a": False}) == 1


def test_restart_continues_without_a_second_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "pool.csv"
    with TraceWriter(path) as writer:
        writer.write(T0, {"a": True, "b": False})
    with TraceWriter(path) as writer:
        assert dict(writer.state) == {"a": True, "b": False}
        assert writer.write(T0 + 10, {"a": True, "b": False}) == 0
        with pytest.raises(TraceFormatError, match="goes backwards"):
            writer.write(T0 - 10, {"a": False, "b": False})
        assert writer.write(T0 + 20, {"a": False, "b": True}) == 2
    lines = path.read_text().splitlines()
    assert lines.count("time,node,idle,window_s") == 1
    assert len(lines) == 1 + 2 + 2
    assert load_trace(path).events == (
        PoolEvent(T0 + 20, frozenset({"b"}), frozenset({"a"}), {"b": None}),
    )


def test_torn_last_line_is_dropped_and_the_trace_continues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "pool.csv"
    with TraceWriter(path) as writer:
        writer.write(T0, {"a": True, "b": False, "c": False})
    whole = path.read_bytes()
    # A crash in the middle of an event: its first row is complete, its second torn.
    with path.open("a") as f:
        f.write("2021-02-10T00:00:10Z,b,1,\n2021-02-10T00:00:1")
    with caplog.at_level(logging.WARNING), TraceWriter(path) as writer:
        assert path.read_bytes() == whole + b"2021-02-10T00:00:10Z,b,1,\n"
        assert "torn last line" in caplog.text
        assert dict(writer.state) == {"a": True, "b": True, "c": False}
        assert writer.write(T0 + 20, {"a": True, "b": True, "c": True}) == 1
    trace = load_trace(path)
    assert [(e.time_s - T0, e.joined) for e in trace.events] == [(10, {"b"}), (20, {"c"})]


def test_torn_header_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "pool.csv"
    path.write_text("time,no")
    with TraceWriter(path) as writer:
        assert writer.write(T0, {"a": True}) == 1
    assert path.read_text() == "time,node,idle,window_s\n2021-02-10T00:00:00Z,a,1,\n"


def test_continues_a_file_in_the_summit_layout(tmp_path: Path) -> None:
    path = tmp_path / "pool.csv"
    path.write_text(
        "event_index,time,node,idle\n0,2021-02-10 00:00:00,a,1\n0,2021-02-10 00:00:00,b,0\n"
    )
    with TraceWriter(path) as writer:
        assert writer.write(T0 + 5, {"a": False, "b": False}) == 1
    assert path.read_text().splitlines()[-1] == "1,2021-02-10T00:00:05Z,a,0"


def test_a_damaged_file_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "pool.csv"
    text = "time,node,idle\n2021-02-10 00:00:00,a,maybe\n"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=r"pool\.csv:2: unknown idle value 'maybe'"):
        TraceWriter(path)
    assert path.read_text() == text


def test_one_writer_per_file(tmp_path: Path) -> None:
    path = tmp_path / "pool.csv"
    with (
        TraceWriter(path),
        pytest.raises(TraceInUseError, match=r"pool\.csv: another TraceWriter"),
    ):
        TraceWriter(path)
    with TraceWriter(path) as again:  # released on close
        assert again.write(T0, {"a": True}) == 1


def test_state_is_read_only(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "pool.csv") as writer:
        writer.write(T0, {"a": True})
        with pytest.raises(TypeError):
            writer.state["a"] = False


NODES = [f"n{i}" for i in range(6)]
windows = st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
records = st.lists(
    st.tuples(
        st.integers(1, 10**7).map(lambda ms: ms / 1000.0),  # seconds since the last record
        st.dictionaries(st.sampled_from(NODES), st.booleans(), min_size=1),
        st.dictionaries(st.sampled_from(NODES), windows),
    ),
    min_size=1,
    max_size=15,
)


def _expected(
    sequence: list[tuple[float, Mapping[str, bool], Mapping[str, float | None]]],
) -> tuple[tuple[str, ...], frozenset[str], list[tuple[float, set[str], set[str]]]]:
    state: dict[str, bool] = {}
    order: list[str] = []
    events: list[tuple[float, set[str], set[str]]] = []
    for i, (t, idle, _) in enumerate(sequence):
        changed = {n: v for n, v in idle.items() if state.get(n, None if i == 0 else False) != v}
        order += [n for n in idle if n not in state]
        state.update(idle)
        if i == 0:
            continue
        joined = {n for n, v in changed.items() if v}
        left = {n for n, v in changed.items() if not v}
        if joined or left:
            events.append((quantize_time_s(t), joined, left))
    first = sequence[0][1]
    return tuple(order), frozenset(n for n, v in first.items() if v), events


@settings(max_examples=60, deadline=None)
@given(records=records, restart_at=st.integers(0, 15))
def test_round_trip_with_a_restart(
    tmp_path_factory: pytest.TempPathFactory,
    records: list[tuple[float, dict[str, bool], dict[str, float | None]]],
    restart_at: int,
) -> None:
    path = tmp_path_factory.mktemp("rt") / "pool.csv"
    t = T0
    sequence: list[tuple[float, Mapping[str, bool], Mapping[str, float | None]]] = []
    writer = TraceWriter(path)
    for i, (dt, idle, wins) in enumerate(records):
        if i == restart_at:
            writer.close()
            writer = TraceWriter(path)
        t += dt
        writer.write(t, idle, wins)
        sequence.append((t, idle, wins))
    writer.close()

    nodes, initial, events = _expected(sequence)
    trace = load_trace(path)
    assert trace.nodes == nodes
    assert trace.initial_idle == initial
    assert trace.start_s == quantize_time_s(sequence[0][0])
    assert [(e.time_s, set(e.joined), set(e.left)) for e in trace.events] == events
    assert path.read_text().count("time,node") == 1
    # Windows come back for every node that joined (None when not given).
    given_windows = {quantize_time_s(t): w for t, _, w in sequence}
    for event in trace.events:
        for node in event.joined:
            assert event.windows_s[node] == given_windows[event.time_s].get(node)
