"""``bftrainer report --state-dir`` says, per trainer, which points of the curve the
daemon planned on were measured and which prior, as ``bftrainer status`` labels them."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from bftrainer.report.store_frames import load_store
from bftrainer.state import Store
from bftrainer.trainers.learned_curve import live_curve
from tests.bftrainer.test_frames import T0, build_store
from tests.bftrainer.test_live_curves import rates_of
from tests.bftrainer.test_report import report
from tests.bftrainer.test_status_curve import records_of_a_trainer_run_at


def store_with_measurements(state: Path) -> tuple[str, str, list[dict[str, object]]]:
    """build_store's two trainers (4 nodes at most); the first measured 1 node at T0 + 10
    and 2 nodes at T0 + 150, the second nothing."""
    build_store(state)
    records = records_of_a_trainer_run_at([1, 2])
    with Store.open(state) as store:
        a, b = (t.id for t in store.trainers())
        for rec, at_s in zip(records, (10.0, 150.0), strict=True):
            store.add_metric(a, rec, now_s=T0 + at_s)
    return a, b, records


def rows_of(page: str) -> dict[str, list[str]]:
    table = page.split("Curves the allocator planned on", 1)[1].split("</table>", 1)[0]
    out = {}
    for row in table.split("<tr>")[2:]:
        cells = [html.unescape(c.split("</td>")[0]) for c in row.split("<td>")[1:]]
        out[cells[0]] = cells[1:]
    return out


def test_the_report_shows_each_trainers_measured_and_prior_points(tmp_path: Path) -> None:
    a, b, records = store_with_measurements(tmp_path / "state")
    r = report("--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    rows = rows_of((tmp_path / "rep" / "report.html").read_text())
    rates = rates_of(records)
    assert b not in rows, "it measured nothing: no curve of its own yet"
    assert rows == {a: [f"1: {rates[1]:,.1f}, 2: {rates[2]:,.1f}", "4"]}

    # The frame holds the curve bftrainer status shows.
    curves = load_store(tmp_path / "state").curves
    shown = live_curve(records, 4)
    assert shown is not None
    assert curves.drop(columns="trainer").to_dict("records") == shown
    assert set(curves["trainer"]) == {a}


def test_a_reports_end_shows_the_curve_as_it_was_then(tmp_path: Path) -> None:
    a, _, records = store_with_measurements(tmp_path / "state")
    end = pd.Timestamp(T0 + 100, unit="s", tz="UTC").isoformat()
    r = report("--state-dir", str(tmp_path / "state"), "--end", end, "--out", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    rows = rows_of((tmp_path / "r" / "report.html").read_text())
    assert rows == {a: [f"1: {rates_of(records)[1]:,.1f}", "2, 4"]}
