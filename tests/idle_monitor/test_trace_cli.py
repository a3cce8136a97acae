"""``bftrainer trace stats`` and ``bftrainer trace synth`` through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli
from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
from bftrainer.idle_monitor.trace import load_trace
from tests.shared_data import SHARED

SUMMIT_WEEK = SHARED / "bftrainer-traces" / "summit_week1_node_events.csv.gz"

SMALL = """time,node,idle
2021-02-10 00:00:00,a,1
2021-02-10 00:00:00,b,0
2021-02-10 00:30:00,b,1
2021-02-10 00:40:00,a,0
2021-02-10 01:00:00,b,0
"""


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_stats_json(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(SMALL)
    code, out = run("trace", "stats", str(path), "--json")
    assert code == 0, out
    stats = json.loads(out)
    assert stats["nodes"] == 2
    assert stats["duration_h"] == 1.0
    assert stats["events"] == 3
    assert stats["inc_per_h"] == 1.0 and stats["dec_per_h"] == 2.0
    # idle: a for 40 min + b for 30 min over 2 nodes x 60 min
    assert stats["idle_ratio"] == pytest.approx(70 / 120)
    assert stats["fragments"] == 1 and stats["fragment_median_s"] == 1800.0


def test_stats_text_slices_and_plots(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(SMALL)
    code, out = run(
        "trace", "stats", str(path), "--nodes", "1:2", "--start", "2021-02-10T00:15:00Z",
        "--plots", str(tmp_path / "plots"),
    )  # fmt: skip
    assert code == 0, out
    assert "(1 nodes)" in out and "duration    0.8 h, 2 events" in out
    assert (tmp_path / "plots" / "fragments_cdf.png").exists()
    assert (tmp_path / "plots" / "events_12h.png").exists()


def test_stats_of_a_pool_never_idle_says_so_not_nan(tmp_path: Path) -> None:
    """A machine full all along has no fragment: its figures printed as "nan min"."""
    path = tmp_path / "t.csv"
    path.write_text("time,node,idle\n2021-02-10 00:00:00,a,0\n2021-02-10 01:00:00,a,0\n")
    code, out = run("trace", "stats", str(path))
    assert code == 0, out
    assert "fragments   0: no node was idle" in out
    assert "nan" not in out


@pytest.mark.parametrize(
    ("filler", "bad_line", "message"),
    [
        # Not the CSV reader's byte offset ("cannot read trace: 'utf-8' codec can't
        # decode byte 0xff in position 59").
        (0, b"2021-02-10 01:00:00,\xff,1\n", "not text (bytes that are not UTF-8)"),
        # Past the text stream's first 8 KiB chunk, which it decodes at once.
        (400, b"2021-02-11 00:00:00,\xff,1\n", "not text (bytes that are not UTF-8)"),
        # A NUL in a node's name made another node ("a" and "a\x00": 2 nodes).
        (0, b"2021-02-10 00:00:00,a\x00,1\n", "node 'a\\x00' is not a printable name"),
    ],
)
def test_a_trace_refused_names_its_file_and_line(
    tmp_path: Path, filler: int, bad_line: bytes, message: str
) -> None:
    path = tmp_path / "t.csv"
    rows = b"".join(b"2021-02-10 %02d:%02d:00,a,1\n" % divmod(m + 1, 60) for m in range(filler))
    path.write_bytes(b"time,node,idle\n2021-02-10 00:00:00,a,1\n" + rows + bad_line)
    code, out = run("trace", "stats", str(path))
    assert code == 2, out
    assert f"{path}:{3 + filler}: {message}" in out


def test_stats_of_a_pool_idle_all_along_does_not_call_it_never_idle(tmp_path: Path) -> None:
    """A fragment starts and ends inside the trace: a node idle from its first record to
    its last has none, and is not "no node was idle" for it."""
    path = tmp_path / "t.csv"
    path.write_text("time,node,idle\n2021-02-10 00:00:00,a,1\n2021-02-10 01:00:00,a,1\n")
    code, out = run("trace", "stats", str(path))
    assert code == 0, out
    assert "idle ratio  100.00 %" in out
    assert "fragments   0: no node's idle time both starts and ends inside the trace" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "1024"], "--nodes '1024' must be A:B"),
        (["--nodes", "5:5"], "is empty"),
        (["--nodes", "7:9"], "selects no node of the 2"),
        (["--start", "soon"], "--start: bad time 'soon'"),
        (["--start", "2021-02-09"], "is before"),
    ],
)
def test_stats_bad_options_exit_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(SMALL)
    code, out = run("trace", "stats", str(path), *args)
    assert code == 2
    assert message in out


def test_stats_bad_file_names_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(SMALL.replace("00:40:00,a,0", "00:40:00,a,idle"))
    code, out = run("trace", "stats", str(path))
    assert code == 2
    assert "t.csv:5: unknown idle value 'idle' for node 'a'" in out


def test_synth_writes_the_seeded_trace(tmp_path: Path) -> None:
    out = tmp_path / "syn.csv"
    code, text = run(
        "trace", "synth", "--nodes", "32", "--hours", "2", "--seed", "5", "--out", str(out)
    )
    assert code == 0, text
    assert text.startswith(f"wrote {out}: 32 nodes, 2 h")
    expected = synthetic_trace(SyntheticConfig(nodes=32, duration_s=7200.0, seed=5))
    got = load_trace(out)
    assert (got.nodes, got.initial_idle, got.events, got.end_s) == (
        expected.nodes,
        expected.initial_idle,
        expected.events,
        expected.end_s,
    )


@pytest.mark.data
@pytest.mark.skipif(not SUMMIT_WEEK.exists(), reason=f"Summit log not found at {SUMMIT_WEEK}")
def test_summit_week_as_the_reference_replayer_sees_it() -> None:
    """The 1,024-node slice from the first job (docs/notes: 6,457 events over 147.6 h)."""
    code, out = run(
        "trace", "stats", str(SUMMIT_WEEK), "--nodes", "0:1024", "--start", "2021-02-10 20:21:15",
        "--json",
    )  # fmt: skip
    assert code == 0, out
    stats = json.loads(out)
    assert stats["nodes"] == 1024
    assert stats["events"] == 6457
    assert round(stats["duration_h"], 1) == 147.6


def test_an_interrupted_plots_run_leaves_the_earlier_plots_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bftrainer.idle_monitor.trace_stats as trace_stats

    path = tmp_path / "t.csv"
    path.write_text(SMALL)
    plots = tmp_path / "plots"
    assert run("trace", "stats", str(path), "--plots", str(plots))[0] == 0
    before = {p.name: p.read_bytes() for p in plots.iterdir()}

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt  # after the first plot was drawn

    monkeypatch.setattr(trace_stats, "window_stats", interrupted)
    CliRunner().invoke(cli, ["trace", "stats", str(path), "--nodes", "0:1", "--plots", str(plots)])
    assert {p.name: p.read_bytes() for p in plots.iterdir()} == before
