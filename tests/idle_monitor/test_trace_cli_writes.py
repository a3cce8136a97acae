"""`trace synth` and `trace stats` never replace what is not theirs, and refuse up front
what they could not finish (issue 19)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bftrainer.cli import cli

TRACE = "time,node,idle\n2021-02-10 00:00:00,a,1\n2021-02-10 01:00:00,a,0\n"


def one_error(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), repr(result.exception)
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
    return line


def synth(out: Path | str, *extra: str) -> list[str]:
    return ["trace", "synth", "--nodes", "4", "--hours", "1", *extra, "--out", str(out)]


def test_synth_never_replaces_a_symlink_or_a_device(tmp_path: Path) -> None:
    target = tmp_path / "target.csv"
    target.write_text("keep")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert "is a symlink" in one_error(synth(link))
    assert link.is_symlink() and target.read_text() == "keep"
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    assert "not a regular file" in one_error(synth(fifo))
    assert "not a regular file" in one_error(synth("/dev/null"))
    assert Path("/dev/null").is_char_device()


def test_synth_refuses_before_generating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "not a writable folder" in one_error(synth(tmp_path / "no" / "t.csv"))
    line = one_error(synth(tmp_path / "t.csv", "--start", "2199-12-31 00:00:00", "--hours", "48"))
    assert "--start and --hours" in line and "plausible range" in line
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as where it is not installed
    assert "needs pyarrow" in one_error(synth(tmp_path / "t.parquet"))
    assert not list(tmp_path.iterdir())


def test_synth_still_replaces_its_own_regular_file(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    out.write_text("old")
    result = CliRunner().invoke(cli, synth(out))
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("time,node,idle")


def test_stats_of_an_empty_span_is_one_line_not_a_table_of_nan(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    at = "2021-02-10 00:30:00"
    assert "span is empty" in one_error(["trace", "stats", str(trace), "--start", at, "--end", at])
    single = tmp_path / "one.csv"
    single.write_text(TRACE.splitlines(keepends=True)[0] + TRACE.splitlines(keepends=True)[1])
    assert "spans no time" in one_error(["trace", "stats", str(single)])


def test_stats_plots_where_they_cannot_be_written_fail_before_reading(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    (tmp_path / "afile").write_text("")
    line = one_error(["trace", "stats", str(trace), "--plots", str(tmp_path / "afile" / "p")])
    assert "--plots" in line and "afile" in line


@pytest.mark.parametrize(
    "args",
    [
        ["trace", "synth", "--nodes", "1000000", "--hours", "8760", "--out", "x.csv"],
        ["replay", "--synthetic-nodes", "1000000", "--synthetic-hours", "100", "--out", "o"],
    ],
)
def test_a_synthetic_trace_too_large_to_generate_is_refused_at_once(
    tmp_path: Path, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert "node-hours" in one_error(args)
    assert not list(tmp_path.iterdir())
