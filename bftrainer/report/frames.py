"""A replay's outputs, or a daemon's store, as pandas DataFrames.

Analysts work in pandas, and ``bftrainer report`` draws from the same frames, so both
read the outputs one way. Times are UTC datetimes (``NaT``: not yet), counts are
integers, and each kind of record is one frame:

- ``events``: the replay's ``events.csv`` (one row per loop step; docs/replay.md), or
  the daemon's pool events (time, joined, left, stale);
- ``allocations``: one row per change of a trainer's node count: time, trainer, nodes
  (after the change), change (start, rescale, preempt, complete, cancel, fail);
- ``trainers``: one row per trainer: id, submitted, started, finished, state,
  rescales, and what each source adds;
- ``pool``: the pool's size over time (time, nodes; each row holds until the next);
- ``holders``: the daemon's holder jobs (empty for a replay);
- ``windows``: the replay's U per window (empty for a daemon);
- ``curves``: the daemon's throughput curve of each trainer as of the end, one row per
  breakpoint: trainer, nodes, throughput_sps, source (``measured`` or ``prior``, by
  ``bftrainer.trainers.learned_curve``; empty for a replay, whose outputs keep none).

    from bftrainer.report.frames import load_replay
    f = load_replay("out/demo/milp-tfwdauto")

A daemon's store is read by ``bftrainer.report.store_frames.load_store``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from bftrainer.loop import Step
from bftrainer.replay.allocations import CHANGES as REPLAY_CHANGES
from bftrainer.state import (
    MetricRow,
)
from bftrainer.trainers.learned_curve import live_curve

# A daemon's trainers can also fail; a replay's never do.
CHANGES = (*REPLAY_CHANGES, "fail")
CHANGE_TYPE = pd.CategoricalDtype(list(CHANGES))
# The files every replay's run folder holds (bftrainer/replay/output.py).
REPLAY_FILES = ("summary.json", "events.csv", "trainers.csv", "allocations.csv", "windows.csv")
# A decrease whose nodes left the pool this long before it is a preemption (a daemon's
# store: bftrainer/report/store_frames.py).
PREEMPT_SLACK_S = 1.0


class FramesError(ValueError):
    """A folder or store that cannot be read as frames; the message names it and why."""


@dataclass(frozen=True)
class Frames:
    """One replay run's or one daemon's records (see the module docstring)."""

    source: str  # "replay" or "daemon"
    label: str
    events: pd.DataFrame
    allocations: pd.DataFrame
    trainers: pd.DataFrame
    pool: pd.DataFrame
    holders: pd.DataFrame
    windows: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    start: pd.Timestamp | None = None
    end: pd.Timestamp | None = None
    curves: pd.DataFrame = field(default_factory=lambda: curves_frame({}, {}, math.inf))


# ---------------------------------------------------------------------- replays


def replay_runs(path: str | Path) -> dict[str, Path]:
    """The runs of a replay's output folder, label -> folder: the folder itself for one
    run, each run's folder for several (``--policy milp,equal``, a sweep)."""
    out = Path(path)
    summary = _summary(out)
    if "runs" not in summary:
        return {out.name: out}
    runs = {p.name: p for p in sorted(out.iterdir()) if (p / "summary.json").is_file()}
    if len(runs) != len(summary["runs"]):
        raise FramesError(
            f"{out}: summary.json lists {len(summary['runs'])} runs but {len(runs)} run "
            "folders are there"
        )
    return runs


def load_replay(path: str | Path) -> Frames:
    """One replay run's frames, from the folder ``bftrainer replay --out`` wrote (or one
    of its runs' folders, when it ran several)."""
    run = Path(path)
    summary = _summary(run)
    if "runs" in summary:
        labels = ", ".join(replay_runs(run))
        raise FramesError(f"{run} holds several runs ({labels}): load one of their folders")
    missing = [n for n in REPLAY_FILES if not (run / n).is_file()]
    if missing:
        raise FramesError(
            f"{run}: not a complete replay output (no {', '.join(missing)}); replay again "
            "with this version of bftrainer"
        )
    events = _read_replay_csv(run / "events.csv", _events, dtype={"status": "string"})
    trainers = _read_replay_csv(
        run / "trainers.csv",
        _trainers,
        dtype={"id": "string", "model": "string"},
        keep_default_na=False,
    )
    allocations = _read_replay_csv(
        run / "allocations.csv", _allocations_read, dtype={"trainer": "string"}
    )
    windows = (
        pd.DataFrame()  # empty (no header) when the replay had no window
        if (run / "windows.csv").stat().st_size == 0
        else _read_replay_csv(run / "windows.csv", _windows)
    )
    trainers["state"] = _replay_states(trainers)
    pool = events[["time", "pool_nodes"]].rename(columns={"pool_nodes": "nodes"})
    return Frames(
        source="replay",
        label=run.name,
        events=events,
        allocations=allocations,
        trainers=trainers,
        pool=pool.reset_index(drop=True),
        holders=empty_holders(),
        windows=windows,
        summary=summary,
        start=_time_or_none(summary.get("start")),
        end=_time_or_none(summary.get("end")),
    )


def _summary(out: Path) -> dict[str, Any]:
    if not out.is_dir():
        raise FramesError(f"{out}: not a folder (give the folder bftrainer replay --out wrote)")
    path = out / "summary.json"
    if not path.is_file():
        raise FramesError(f"{out}: not a replay output (no summary.json)")
    try:
        summary = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise FramesError(f"{path}: not JSON ({e})") from None
    if not isinstance(summary, dict):
        raise FramesError(f"{path}: not a replay summary (a JSON object)")
    _check_summary(path, summary)
    return summary


# The summary's numbers that the page reads (report/headline.py, figures.py, page.py).
SUMMARY_NUMBERS = (
    "utilization_efficiency",
    "utilization_limit",
    "utilization_share_of_limit",
    "window_hours",
    "samples_processed",
    "rescale_cost_samples",
    "preemption_cost_samples",
)


def _check_summary(path: Path, summary: dict[str, Any]) -> None:
    """The fields the report reads, of the kinds the replay writes: else one line."""
    if "runs" in summary and not isinstance(summary["runs"], list):
        raise FramesError(f"{path}: runs is {summary['runs']!r}, not a list of runs")
    for key in ("start", "end"):
        value = summary.get(key)
        if value is None:
            continue
        try:
            if not isinstance(value, str):
                raise TypeError(type(value).__name__)
            pd.Timestamp(value)
        except (TypeError, ValueError):
            raise FramesError(f"{path}: {key} is {value!r}, not a time") from None
    for key in SUMMARY_NUMBERS:
        value = summary.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise FramesError(f"{path}: {key} is {value!r}, not a number")
        if value is not None and not 0 <= value < math.inf:
            raise FramesError(f"{path}: {key} is {value!r}; the replay writes it finite and >= 0")


EVENT_NUMBERS = tuple(f.name for f in fields(Step) if f.name not in ("time_s", "status", "decided"))


def _read_replay_csv(
    path: Path, convert: Callable[[pd.DataFrame], pd.DataFrame], **read: Any
) -> pd.DataFrame:
    """One CSV of a replay's output, read and converted; what cannot be is named in one
    line with its file (an empty, truncated or foreign file, a column of another kind)."""
    try:
        _check_whole(path)
        return convert(pd.read_csv(path, **read))
    except (
        pd.errors.EmptyDataError,
        pd.errors.ParserError,
        UnicodeDecodeError,
        KeyError,
        ValueError,
        TypeError,
        OverflowError,
    ) as e:
        raise FramesError(
            f"{path}: not a replay's {path.name} this version can read: {e}"
        ) from None


def _events(events: pd.DataFrame) -> pd.DataFrame:
    """events.csv's columns as the loop's ``Step`` has them (numbers, flags), checked."""
    events["time"] = _times(events["time"])
    events["status"] = events["status"].fillna("")
    for name in EVENT_NUMBERS:
        if name in events:  # latency_s, t_fwd_s: not in older outputs
            events[name] = pd.to_numeric(events[name], errors="raise")
    if events["decided"].dtype != bool:
        raise ValueError("column decided holds other values than True and False")
    events["pool_nodes"].astype("int64")  # a missing count (a cut row) raises
    _check_amounts(events, EVENT_NUMBERS)
    _check_in_time_order(events["time"])
    return events


# trainers.csv's amounts (empty where the replay has none).
TRAINER_NUMBERS = (
    "progress_samples",
    "work_samples",
    "rescales",
    "rescale_cost_samples",
    "preemption_cost_samples",
    "wait_before_first_slot_s",
)


def _trainers(trainers: pd.DataFrame) -> pd.DataFrame:
    trainers = trainers.rename(columns={"submit": "submitted"})
    _check_amounts(trainers, TRAINER_NUMBERS)
    for col in ("submitted", "started", "finished"):
        trainers[col] = _times(trainers[col].replace("", None))
    return trainers


def _check_whole(path: Path) -> None:
    """A CSV the replay wrote ends with a newline: one that does not was cut mid-row
    (a copy or a disk that ran out), and its last row is not what the replay wrote."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                raise ValueError("it ends mid-row (no newline after its last row): cut short?")


def _allocations_read(allocations: pd.DataFrame) -> pd.DataFrame:
    allocations["time"] = _times(allocations["time"])
    allocations["change"] = allocations["change"].astype(CHANGE_TYPE)
    allocations["nodes"] = pd.to_numeric(allocations["nodes"], errors="raise")
    out = allocations[["time", "trainer", "nodes", "change"]]
    blank = out.isna().any(axis=1)
    if blank.any():  # every field of every row is written: a blank one is a cut row
        raise ValueError(f"row {int(blank.argmax()) + 2} misses a value or holds an unknown one")
    _check_amounts(out, ("nodes",))
    _check_in_time_order(out["time"])
    return out


def _check_in_time_order(times: pd.Series) -> None:
    """The replay writes its rows as they happen: rows out of order (a hand edit, a sort
    by another column) drew each trainer's Gantt bars between the wrong times."""
    back = (times.diff() < pd.Timedelta(0)).to_numpy()
    if back.any():
        row = int(back.argmax())
        raise ValueError(
            f"row {row + 2}: time {times.iloc[row].isoformat()} is before the row above's; "
            "the replay writes its rows in time order"
        )


def _check_amounts(frame: pd.DataFrame, columns: Iterable[str]) -> None:
    """Counts, samples and seconds, which the replay writes finite and >= 0 (empty where
    it has none): a negative or infinite one (a hand edit, another program) was drawn as
    it was, a Gantt bar of -3 nodes or a U of -7, without a word."""
    for name in columns:
        if name not in frame:
            continue
        values = pd.to_numeric(frame[name].replace("", None), errors="raise")
        bad = (values < 0) | values.isin([math.inf, -math.inf])
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise ValueError(
                f"row {row + 2}: {name} is {values.iloc[row].item()!r}; the replay writes it "
                "finite and >= 0"
            )


# windows.csv's numbers that the page reads (report/figures.py, compare.py); U alone
# may be empty (a window with no pool has none).
WINDOW_NUMBERS = ("hours", "samples_processed", "utilization_efficiency")


def _windows(windows: pd.DataFrame) -> pd.DataFrame:
    if not windows.empty:
        windows["start"] = _times(windows["start"])
        for name in WINDOW_NUMBERS:
            windows[name] = pd.to_numeric(windows[name], errors="raise")
            if name != "utilization_efficiency" and windows[name].isna().any():
                raise ValueError(f"column {name} has an empty cell")
        _check_amounts(windows, WINDOW_NUMBERS)
    return windows


def _replay_states(trainers: pd.DataFrame) -> pd.Series:
    state = pd.Series("queued", index=trainers.index, dtype="string")
    state[trainers["started"].notna()] = "running"
    state[trainers["finished"].notna()] = "done"
    return state


# ---------------------------------------------------------------------- frame shapes


def curves_frame(
    limits: dict[str, tuple[int, int]], metrics: dict[str, list[MetricRow]], until_s: float
) -> pd.DataFrame:
    """Each trainer's curve from its metrics records up to ``until_s`` (the one
    ``bftrainer status`` shows); trainers that measured nothing by then have no rows."""
    rows: list[tuple[str, int, float, str]] = []
    for tid, (n_min, n_max) in limits.items():
        records = (m.record for m in metrics.get(tid, ()) if m.time_s <= until_s)
        curve = live_curve(records, n_max, n_min)
        rows += [(tid, p["nodes"], p["throughput_sps"], p["source"]) for p in curve or ()]
    return pd.DataFrame(
        {
            "trainer": pd.Series([r[0] for r in rows], dtype="string"),
            "nodes": pd.Series([r[1] for r in rows], dtype="int64"),
            "throughput_sps": pd.Series([r[2] for r in rows], dtype="float64"),
            "source": pd.Series([r[3] for r in rows], dtype="string"),
        }
    )


def holders_frame(holders: list[dict[str, Any]]) -> pd.DataFrame:
    if not holders:
        return empty_holders()
    return pd.DataFrame(
        {
            "job_id": pd.Series([h["job_id"] for h in holders], dtype="string"),
            "node": pd.Series([h["node"] for h in holders], dtype="string"),
            "state": pd.Series([h["state"] for h in holders], dtype="string"),
            "submitted": epoch_times([h["submit_s"] for h in holders]),
            "started": epoch_times([h["started_s"] for h in holders]),
            "ended": epoch_times([h["ended_s"] for h in holders]),
            "trainer": pd.Series([h["trainer_id"] for h in holders], dtype="string"),
            "reason": pd.Series([h["reason"] for h in holders], dtype="string"),
            "limit_s": pd.Series([h["limit_s"] for h in holders], dtype="float64"),
        }
    )


def empty_holders() -> pd.DataFrame:
    return holders_frame(
        [
            dict.fromkeys(
                ("job_id", "node", "state", "submit_s", "started_s", "ended_s", "trainer_id")
            )
            | {"reason": "", "limit_s": None}
        ]
    ).iloc[0:0]


# ---------------------------------------------------------------------- time helpers


def _times(col: pd.Series) -> pd.Series:
    """ISO-8601 text (the replay's ``format_time``) as UTC datetimes; empty: NaT. A time
    that is none (30 February) is named with its row in one line: pandas' own message
    runs to four lines of advice on ``format``."""
    times = pd.to_datetime(col, utc=True, format="ISO8601", errors="coerce")
    given = col.notna() & (col.astype("string").str.len() > 0)  # empty: NaT, as before
    bad = (times.isna() & given).to_numpy()
    if bad.any():
        row = int(bad.argmax())
        raise ValueError(f"row {row + 2}: {col.name} {col.iloc[row]!r} is not an ISO-8601 time")
    return times


def epoch_times(values: list[float | None]) -> pd.Series:
    return pd.to_datetime(pd.Series(values, dtype="float64"), unit="s", utc=True)


def _time_or_none(text: Any) -> pd.Timestamp | None:
    return pd.Timestamp(text) if isinstance(text, str) else None


def fmt_time(t: pd.Timestamp) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def between(df: pd.DataFrame, lo: pd.Timestamp, hi: pd.Timestamp) -> pd.DataFrame:
    return df[(df["time"] >= lo) & (df["time"] <= hi)].reset_index(drop=True)


def clip_steps(
    df: pd.DataFrame, lo: pd.Timestamp, hi: pd.Timestamp, key: str | None = None
) -> pd.DataFrame:
    """Rows of a step function (each holds until the next of its ``key``) between
    ``lo`` and ``hi``, with the value each had at ``lo`` as a row at ``lo``."""
    before = df[df["time"] < lo]
    if key is None:
        carried = before.tail(1)
    else:  # the trainers that held nodes at lo
        carried = before.groupby(key, sort=False).tail(1)
        carried = carried[carried["nodes"] > 0]
    carried = carried.assign(time=lo)
    inside = df[(df["time"] >= lo) & (df["time"] <= hi)]
    return pd.concat([carried, inside], ignore_index=True)
