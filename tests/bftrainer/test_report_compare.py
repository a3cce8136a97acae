"""A replay of several policies opens its report with them side by side: one figure of
each policy's samples and U per window, one table of U, costs and trainers done, before
each policy's section (bftrainer/report/compare.py, page.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D

from bftrainer.report.compare import comparison
from bftrainer.report.frames import load_replay, replay_runs

POLICIES = ("milp-tfwdauto", "equal", "scavenger")


def replay_policies(out: Path) -> None:
    """What ``make demo`` runs, on a short synthetic pool with four windows."""
    subprocess.run(
        [
            *(sys.executable, "-m", "bftrainer", "replay", "--solver", "dp", "--no-progress"),
            *("--synthetic-nodes", "64", "--synthetic-hours", "2", "--jobs-count", "30"),
            *("--window-hours", "0.5", "--policy", "milp,equal,scavenger"),
            *("--scavenger-size", "4", "--out", str(out)),
        ],
        check=True,
        capture_output=True,
    )


def report(*args: str) -> Path:
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "report", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(r.stdout.strip())


@pytest.fixture(scope="module")
def policies_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("policies") / "out"
    replay_policies(out)
    return out


def summaries(out: Path) -> dict[str, dict[str, Any]]:
    return {
        label: json.loads((run / "summary.json").read_text())
        for label, run in replay_runs(out).items()
    }


def test_the_page_opens_with_the_policies_side_by_side(policies_out: Path) -> None:
    page = report(str(policies_out))
    text = page.read_text()
    body = text.split("<body>")[1]
    first_section = min(body.index(f"<h2>{p}</h2>") for p in POLICIES)
    opening = body[:first_section]
    # The comparison figure is the page's first, and its table the first table.
    assert body.index("<figure>") == opening.index("<figure>")
    assert re.search(r"<figcaption>[^<]*\(compare\.png\)</figcaption>", opening)
    assert opening.index("compare.png") < opening.index("<table>")
    assert body.index("<table>") == opening.index("<table>")
    assert (page.parent / "compare.png").is_file()
    # One column per policy, the figures each one's summary.json holds.
    table = opening[opening.index("<table>") : opening.index("</table>")]
    heads = re.findall(r"<th>(?:<span[^>]*></span>)?([^<]*)</th>", table.split("</thead>")[0])
    assert sorted(heads[1:]) == sorted(POLICIES)
    columns = {name: i for i, name in enumerate(heads[1:])}

    def row(name: str) -> list[str]:
        found = re.search(rf"<tr><th>{re.escape(name)}</th>(.*?)</tr>", table)
        assert found, name
        return re.findall(r"<td>([^<]*)</td>", found.group(1))

    for label, s in summaries(policies_out).items():
        col = columns[label]
        assert row("U (A_e / A_s)")[col] == f"{100 * s['utilization_efficiency']:.1f}%"
        assert row("limit U_max (clairvoyant)")[col] == f"{100 * s['utilization_limit']:.1f}%"
        done = f"{s['trainers_completed']} / {s['trainers_arrived']}"
        assert row("trainers done")[col] == done
        for name, key in [
            ("samples processed", "samples_processed"),
            ("rescale cost, samples", "rescale_cost_samples"),
            ("preemption cost, samples", "preemption_cost_samples"),
        ]:
            assert _samples(row(name)[col]) == pytest.approx(s[key], rel=0.006, abs=0.5), name


def _samples(cell: str) -> float:
    """A cell such as 92.6 M back as a number."""
    number, _, prefix = cell.partition(" ")
    return float(number) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[prefix]


def test_the_figure_draws_each_policy_from_its_windows(policies_out: Path) -> None:
    """Top: samples processed, cumulative at each window's end, ending at the summary's
    total; bottom: U per window; one line per policy, in one colour in both panels."""
    runs = [load_replay(p) for p in replay_runs(policies_out).values()]
    top, bottom = comparison(runs).axes
    colours = {}
    for f in runs:
        (line,) = [ln for ln in top.get_lines() if ln.get_label() == f.label]
        samples = np.asarray(line.get_ydata(), float)
        assert samples[0] == 0 and len(samples) == len(f.windows) + 1 == 5
        assert samples[-1] == pytest.approx(f.summary["samples_processed"])
        assert np.all(np.diff(samples) >= 0)
        colours[f.label] = line.get_color()
        steps = [
            ln
            for ln in bottom.get_lines()
            if ln.get_color() == colours[f.label] and len(np.asarray(ln.get_ydata()))
        ]
        assert len(steps) == 1
        u = np.asarray(steps[0].get_ydata(), float)[:-1]
        assert u == pytest.approx(100 * f.windows["utilization_efficiency"].to_numpy(float))
        x = pd.to_datetime(np.asarray(steps[0].get_xdata())[[0, -1]]).tz_localize("UTC")
        assert (x[0], x[1]) == (f.start, f.end)
    assert len(set(colours.values())) == len(runs)
    legend = bottom.get_legend()
    assert legend is not None
    keyed = {
        t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
    }
    for label, colour in colours.items():
        handle = keyed[label]
        assert isinstance(handle, Line2D) and handle.get_color() == colour


def test_one_run_opens_with_its_table_alone(policies_out: Path, tmp_path: Path) -> None:
    page = report(str(policies_out / "equal"), "--out", str(tmp_path / "rep"))
    text = page.read_text()
    assert "side by side" not in text and not (tmp_path / "rep" / "compare.png").exists()
    s = summaries(policies_out)["equal"]
    assert "<tr><th>rescale cost, samples</th><td>" in text
    assert f"<td>{100 * s['utilization_efficiency']:.1f}%</td>" in text


@pytest.mark.parametrize(
    ("column", "value"),
    [("hours", "x"), ("samples_processed", ""), ("utilization_efficiency", "-")],
)
def test_a_window_figure_of_another_kind_is_named_in_one_line(
    policies_out: Path, tmp_path: Path, column: str, value: str
) -> None:
    """The comparison reads every run's windows.csv: one that says no number where the
    replay writes one is refused in one line naming the file, not with a traceback."""
    out = tmp_path / "out"
    shutil.copytree(policies_out, out, ignore=shutil.ignore_patterns("report"))
    path = out / "equal" / "windows.csv"
    windows = pd.read_csv(path)
    windows[column] = windows[column].astype(object)
    windows.loc[1, column] = value
    windows.to_csv(path, index=False)
    r = subprocess.run(
        [sys.executable, "-m", "bftrainer", "report", str(out)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert str(path) in line and "not a replay's windows.csv" in line
