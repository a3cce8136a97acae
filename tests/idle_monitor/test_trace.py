"""The canonical trace reader: time formats, validation errors, slicing, whole-trace writing."""

from __future__ import annotations

import gzip
from dataclasses import replace
from pathlib import Path

import pytest

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.idle_monitor.trace import (
    Trace,
    TraceFormatError,
    TraceRangeError,
    format_time,
    load_trace,
    parse_time_s,
    write_trace,
)

T0 = parse_time_s("2021-02-10 00:00:00")

# Four nodes; a and b start idle. Times are the Summit log's naive format.
SMALL = """event_index,time,node,idle
0,2021-02-10 00:00:00,a,1
0,2021-02-10 00:00:00,b,1
0,2021-02-10 00:00:00,c,0
0,2021-02-10 00:00:00,d,0
1,2021-02-10 00:01:00,c,1
2,2021-02-10 00:02:00,a,0
2,2021-02-10 00:02:00,d,1
3,2021-02-10 00:05:00,d,0
4,2021-02-10 00:10:00,c,0
4,2021-02-10 00:10:00,a,1
"""


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_time_formats_agree() -> None:
    expected = 1612915732.0  # 2021-02-10 00:08:52 UTC
    assert parse_time_s("2021-02-10 00:08:52") == expected
    assert parse_time_s("2021-02-10T00:08:52Z") == expected
    assert parse_time_s("2021-02-10T02:08:52+02:00") == expected
    assert parse_time_s("1612915732") == expected
    assert parse_time_s(" 1612915732.5 ") == expected + 0.5
    assert format_time(expected) == "2021-02-10T00:08:52Z"
    assert format_time(expected + 0.25) == "2021-02-10T00:08:52.25Z"
    for bad in ("2021-13-01 00:00:00", "yesterday", "nan", ""):
        with pytest.raises(ValueError, match="time"):
            parse_time_s(bad)


def test_load_groups_rows_into_snapshot_and_events(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, SMALL))
    assert trace.nodes == ("a", "b", "c", "d")
    assert trace.initial_idle == {"a", "b"}
    assert trace.start_s == T0
    assert trace.end_s == T0 + 600
    assert trace.events == (
        PoolEvent(T0 + 60, joined=frozenset({"c"})),
        PoolEvent(T0 + 120, joined=frozenset({"d"}), left=frozenset({"a"})),
        PoolEvent(T0 + 300, left=frozenset({"d"})),
        PoolEvent(T0 + 600, joined=frozenset({"a"}), left=frozenset({"c"})),
    )
    assert all(e.windows_s == {} for e in trace.events)  # no window_s column


def test_same_instant_in_two_spellings_is_one_event(tmp_path: Path) -> None:
    text = (
        "time,node,idle\n"
        "2021-02-10 00:00:00,a,0\n2021-02-10 00:00:00,b,0\n"
        f"2021-02-10T00:01:00Z,a,1\n{T0 + 60:.0f},b,1\n"
    )
    trace = load_trace(write(tmp_path, text))
    assert trace.events == (PoolEvent(T0 + 60, joined=frozenset({"a", "b"})),)


def test_gzip_is_recognised_by_content(tmp_path: Path) -> None:
    path = tmp_path / "t.log"  # no .gz suffix: the magic bytes tell
    path.write_bytes(gzip.compress(SMALL.encode()))
    plain = load_trace(write(tmp_path, SMALL))
    assert load_trace(path) == replace(plain, source=str(path))


def test_windows_column(tmp_path: Path) -> None:
    text = (
        "time,node,idle,window_s\n"
        "2021-02-10 00:00:00,a,1,3600\n2021-02-10 00:00:00,b,0,\n"
        "2021-02-10 00:01:00,b,1,\n"
        "2021-02-10 00:02:00,a,1,100.5\n"  # a stays idle: only its window changes
    )
    trace = load_trace(write(tmp_path, text))
    assert trace.initial_windows_s == {"a": 3600.0}
    assert trace.events[0] == PoolEvent(T0 + 60, joined=frozenset({"b"}), windows_s={"b": None})
    assert trace.events[1] == PoolEvent(T0 + 120, windows_s={"a": 100.5})
    # Starting later carries a's window forward to the new snapshot.
    later = trace.slice(start_s=T0 + 30)
    assert later.initial_windows_s == {"a": 3570.0}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"t\.csv: empty file"),
        ("time,node,idle\n", r"t\.csv: empty trace"),
        ("time,node\n2021-02-10 00:00:00,a\n", r"t\.csv:1: missing required column\(s\) idle"),
        (
            "time,node,idle\n2021-02-10 00:00:00,a,2\n",
            r"t\.csv:2: unknown idle value '2' for node 'a'",
        ),
        ("time,node,idle\n2021-02-10 00:00:00,a,yes\n", r"t\.csv:2: unknown idle value 'yes'"),
        ("time,node,idle\n2021-02-31 00:00:00,a,1\n", r"t\.csv:2: bad time '2021-02-31 00:00:00'"),
        (
            "time,node,idle\n2021-02-10 00:01:00,a,1\n2021-02-10 00:00:00,a,0\n",
            r"t\.csv:3: time '2021-02-10 00:00:00' is earlier than .* at .*t\.csv:2",
        ),
        (
            "time,node,idle\n2021-02-10 00:00:00,a,1\n2021-02-10 00:00:00,a,0\n",
            r"t\.csv:3: node 'a' listed twice at time '2021-02-10 00:00:00' "
            r"\(first at .*t\.csv:2\)",
        ),
        ("time,node,idle\n2021-02-10 00:00:00,a\n", r"t\.csv:2: 2 field\(s\), expected 3"),
        ("time,node,idle\n2021-02-10 00:00:00,,1\n", r"t\.csv:2: empty node name"),
        (
            "time,node,idle,window_s\n2021-02-10 00:00:00,a,1,-5\n",
            r"t\.csv:2: bad window_s '-5' for node 'a'",
        ),
    ],
)
def test_bad_files_are_named_with_line_and_value(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(TraceFormatError, match=match):
        load_trace(write(tmp_path, text))


def test_node_missing_from_snapshot(tmp_path: Path) -> None:
    text = "time,node,idle\n2021-02-10 00:00:00,a,0\n2021-02-10 00:01:00,z,1\n"
    path = write(tmp_path, text)
    with pytest.raises(TraceFormatError, match=r"t\.csv:3: node 'z' is missing from the first"):
        load_trace(path, strict=True)
    # By default a late node is one a recorder met later: busy until its first row.
    trace = load_trace(path)
    assert trace.nodes == ("a", "z")
    assert trace.events == (PoolEvent(T0 + 60, joined=frozenset({"z"})),)
    # First listed busy (a no-op), then idle: one node, one join.
    text = (
        "time,node,idle\n2021-02-10 00:00:00,a,0\n"
        "2021-02-10 00:01:00,z,0\n2021-02-10 00:02:00,z,1\n"
    )
    trace = load_trace(write(tmp_path, text))
    assert trace.nodes == ("a", "z")
    assert trace.events == (PoolEvent(T0 + 120, joined=frozenset({"z"})),)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"nope\.csv: cannot read trace"):
        load_trace(tmp_path / "nope.csv")


def test_slice_nodes_drops_events_that_change_nothing(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, SMALL), nodes=slice(2, 4))
    assert trace.nodes == ("c", "d")
    assert trace.initial_idle == frozenset()
    assert [e.time_s - T0 for e in trace.events] == [60, 120, 300, 600]
    only_b = load_trace(write(tmp_path, SMALL), nodes=slice(1, 2))
    assert only_b.nodes == ("b",)
    assert only_b.initial_idle == {"b"}
    assert only_b.events == ()
    assert only_b.end_s == T0 + 600  # the trace still covers the same time


def test_slice_time_makes_the_state_at_start_the_snapshot(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, SMALL), start_s=T0 + 120, end_s=T0 + 400)
    assert trace.start_s == T0 + 120
    assert trace.end_s == T0 + 400
    assert trace.initial_idle == {"b", "c", "d"}  # the event at exactly start is in it
    assert trace.events == (PoolEvent(T0 + 300, left=frozenset({"d"})),)
    clamped = load_trace(write(tmp_path, SMALL), end_s=T0 + 10**6)
    assert clamped.end_s == T0 + 600


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nodes": slice(10, 20)}, "selects no node of the 4"),
        ({"start_s": T0 - 1}, "is before"),
        ({"start_s": T0 + 601}, "is after"),
        ({"start_s": T0 + 300, "end_s": T0 + 200}, "is before start"),
    ],
)
def test_slices_outside_the_trace_are_refused(
    tmp_path: Path, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(TraceRangeError, match=match):
        load_trace(write(tmp_path, SMALL), **kwargs)


@pytest.mark.parametrize("name", ["out.csv", "out.csv.gz", "out.parquet"])
def test_write_trace_round_trips(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    original = load_trace(write(tmp_path, SMALL))
    # A later end than the last event must survive: the writer marks it with a no-op row.
    extended = Trace(
        nodes=original.nodes,
        initial_idle=original.initial_idle,
        start_s=original.start_s,
        end_s=original.end_s + 3600,
        events=original.events,
        source=original.source,
    )
    out = tmp_path / name
    rows = write_trace(extended, out)
    assert rows == 4 + 6 + 1
    again = load_trace(out)
    assert (again.nodes, again.initial_idle, again.start_s, again.end_s, again.events) == (
        extended.nodes,
        extended.initial_idle,
        extended.start_s,
        extended.end_s,
        extended.events,
    )


def test_written_times_are_iso_utc(tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    write_trace(load_trace(write(tmp_path, SMALL)), out)
    lines = out.read_text().splitlines()
    assert lines[0] == "time,node,idle"  # no window is known: no window_s column
    assert lines[1] == "2021-02-10T00:00:00Z,a,1"


@pytest.mark.parametrize(
    "text",
    [
        "1612915732000",
        "1612915732000.5",
        "1e17",
        "1e30",
        "-1",
        "2300-01-01 00:00:00",
        "9999-12-31 23:59:59",  # a date: never "looks like milliseconds"
    ],
)
def test_implausible_epoch_times_are_refused_with_one_line(tmp_path: Path, text: str) -> None:
    # Epoch milliseconds or a typo would overflow date arithmetic or stall the replay's
    # clock: refused where the time is read, naming file and line.
    path = write(tmp_path, f"time,node,idle\n2021-02-10 00:00:00,a,1\n{text},a,0\n")
    with pytest.raises(TraceFormatError, match=r"t\.csv:3: time .* plausible range") as info:
        load_trace(path)
    assert "\n" not in str(info.value)
    assert ("milliseconds" in str(info.value)) == text.startswith("1612915732000")


def test_epoch_milliseconds_are_named_as_such() -> None:
    with pytest.raises(ValueError, match=r"milliseconds \(2021-02-10T00:08:52Z if divided"):
        parse_time_s("1612915732000")
    assert parse_time_s("0") == 0.0  # the epoch itself is plausible


def test_a_trace_in_memory_outside_the_epoch_range_is_refused() -> None:
    with pytest.raises(TraceRangeError, match="plausible range"):
        Trace(nodes=("a",), initial_idle=frozenset(), start_s=0.0, end_s=1e17, events=())
    assert format_time(1e30) == "1e+30 (epoch s)"  # error messages never fail themselves


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz"])
def test_an_interrupted_write_trace_leaves_the_earlier_file_whole(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv

    import bftrainer.idle_monitor.trace as trace_module

    path = tmp_path / name
    trace = load_trace(write(tmp_path, SMALL))
    write_trace(trace, path)
    before = path.read_bytes()

    class CutOff:
        """A csv writer interrupted after the header (Ctrl-C, a full disk)."""

        def __init__(self, f: object, **kwargs: object) -> None:
            self.inner = csv.writer(f, **kwargs)  # type: ignore[call-overload]

        def writerow(self, row: object) -> None:
            self.inner.writerow(row)

        def writerows(self, rows: object) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(trace_module, "csv", type("csv", (), {"writer": CutOff}))
    with pytest.raises(KeyboardInterrupt):
        write_trace(trace, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"t.csv", name})
