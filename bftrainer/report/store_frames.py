"""A daemon's store as frames (:class:`~bftrainer.report.frames.Frames`): its pool
events, each trainer's node changes told apart (a decrease whose nodes left the pool
then is a preemption; one at the trainer's end is its completion, cancel or failure),
its holders and its trainers' learned curves, between two times.

    from bftrainer.report.store_frames import load_store
    f = load_store("~/.bftrainer")
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from bftrainer.report.frames import (
    CHANGE_TYPE,
    PREEMPT_SLACK_S,
    Frames,
    FramesError,
    between,
    clip_steps,
    curves_frame,
    epoch_times,
    fmt_time,
    holders_frame,
)
from bftrainer.state import (
    DB_NAME,
    AllocationRow,
    MetricRow,
    PoolEventRow,
    StateError,
    Store,
    read_again,
)

_END_CHANGE = {"done": "complete", "cancelled": "cancel", "failed": "fail"}


class _Records(NamedTuple):
    """What ``load_store`` reads from a store, in one read."""

    trainers: list[dict[str, Any]]
    history: dict[str, list[AllocationRow]]
    holders: list[dict[str, Any]]
    pool_events: list[PoolEventRow]
    metrics: dict[str, list[MetricRow]]


def load_store(
    state_dir: str | Path, start: pd.Timestamp | None = None, end: pd.Timestamp | None = None
) -> Frames:
    """A daemon's records from its state directory, between ``start`` and ``end`` (None:
    from the first, to the last). Opened with the daemon's own state API."""
    d = Path(state_dir)
    if start is not None and end is not None and start >= end:
        raise FramesError(f"empty time range: {fmt_time(start)} is not before {fmt_time(end)}")

    def read() -> _Records:
        with Store.open(d, read_only=True) as store:
            rows = [vars(r) for r in store.trainers()]
            return _Records(
                rows,
                {r["id"]: store.allocation_history(r["id"]) for r in rows},
                [vars(h) for h in store.holders(live_only=False)],
                store.pool_events(),
                {r["id"]: store.metrics(r["id"]) for r in rows},
            )

    try:  # read afresh if a daemon opened or closed the store under the read
        rows, history, holders, pool_events, metrics = read_again(read)
    except StateError as exc:  # a damaged row among them: named by the store's check
        raise FramesError(str(exc)) from None
    _check_times(d, rows, history, holders, pool_events)
    events = pd.DataFrame(
        {
            "time": epoch_times([e.time_s for e in pool_events]),
            "joined": pd.Series([len(e.joined) for e in pool_events], dtype="int64"),
            "left": pd.Series([len(e.left) for e in pool_events], dtype="int64"),
            "stale": pd.Series([e.stale for e in pool_events], dtype="bool"),
        }
    )
    size, sizes = 0, []
    for e in pool_events:
        size += len(e.joined) - len(e.left)
        sizes.append(size)
    pool = pd.DataFrame({"time": events["time"], "nodes": pd.Series(sizes, dtype="int64")})
    left_at: dict[str, list[float]] = {}
    for e in pool_events:
        for n in e.left:
            left_at.setdefault(n, []).append(e.time_s)
    changes: list[tuple[float, str, int, str]] = []
    for r in rows:
        changes += _store_changes(r, history[r["id"]], left_at)
    allocations = _allocations(changes)
    trainers = _store_trainers(rows, allocations)
    holders_df = holders_frame(holders)
    times = [
        *events["time"],
        *allocations["time"],
        *trainers["submitted"],
        *trainers["finished"].dropna(),
        *holders_df["submitted"],
        *holders_df["ended"].dropna(),
    ]
    if not times:
        raise FramesError(f"{d}: the store holds no records yet")
    first, last = min(times), max(times)
    if (start is not None and start > last) or (end is not None and end < first):
        raise FramesError(
            f"empty time range: nothing between {fmt_time(start or first)} and "
            f"{fmt_time(end or last)} (the store has records from {fmt_time(first)} to "
            f"{fmt_time(last)})"
        )
    # Clamped to the records: the page's series are as long as the span, and --start 0
    # on a store of seconds asked for 56 years of them.
    lo = max(start, first) if start is not None else first
    hi = min(end, last) if end is not None else last
    shown = trainers[(trainers["submitted"] <= hi) & ~(trainers["finished"] < lo)]
    limits = {r["id"]: (r["n_min"], r["n_max"]) for r in rows if r["id"] in set(shown["id"])}
    return Frames(
        source="daemon",
        label=str(d),
        events=between(events, lo, hi),
        allocations=clip_steps(allocations, lo, hi, "trainer"),
        trainers=shown.reset_index(drop=True),
        pool=clip_steps(pool, lo, hi),
        holders=holders_df[
            (holders_df["submitted"] <= hi) & ~(holders_df["ended"] < lo)
        ].reset_index(drop=True),
        windows=pd.DataFrame(),
        start=lo,
        end=hi,
        curves=curves_frame(limits, metrics, hi.timestamp()),
    )


# The epoch seconds a time of the frames can hold (pandas' times: 1677 to 2262), with a
# day to spare. The store checks that its times are finite numbers; a finite one past
# these is named here, not by pandas' OutOfBoundsDatetime.
_TIMES_S = (pd.Timestamp.min.timestamp() + 86400, pd.Timestamp.max.timestamp() - 86400)


def _check_times(
    d: Path,
    trainers: list[dict[str, Any]],
    history: dict[str, list[AllocationRow]],
    holders: list[dict[str, Any]],
    pool_events: list[PoolEventRow],
) -> None:
    """Every time the frames show can be shown: else ``FramesError`` naming the row."""
    named: list[tuple[str, str, float | None]] = [
        (f"pool_events row {e.id}", "time_s", e.time_s) for e in pool_events
    ]
    for r in trainers:
        named += [
            (f"trainers row {r['id']}", f, r[f]) for f in ("submit_s", "started_s", "finished_s")
        ]
        named += [
            (f"allocations row of trainer {r['id']}", "time_s", a.time_s) for a in history[r["id"]]
        ]
    for h in holders:
        named += [
            (f"holders row of job {h['job_id']}", f, h[f])
            for f in ("submit_s", "started_s", "ended_s")
        ]
    lo, hi = _TIMES_S
    for record, field, value in named:
        if value is not None and not lo <= value <= hi:
            raise FramesError(
                f"{d / DB_NAME}: {record}: {field} is {value!r}, not a time a report can "
                "show (epoch seconds from 1677 to 2262): the store is damaged"
            )


def _store_changes(
    trainer: dict[str, Any], history: Iterable[Any], left_at: dict[str, list[float]]
) -> list[tuple[float, str, int, str]]:
    """A trainer's allocation history as count changes, with their kind: a decrease
    whose nodes had just left the pool is a preemption."""
    out: list[tuple[float, str, int, str]] = []
    prev: tuple[str, ...] = ()
    prev_s = -math.inf
    for a in history:
        if len(a.nodes) != len(prev):
            lost = set(prev) - set(a.nodes)
            preempted = any(
                prev_s - PREEMPT_SLACK_S <= t <= a.time_s + PREEMPT_SLACK_S
                for n in lost
                for t in left_at.get(n, ())
            )
            if not out and a.nodes:
                kind = "start"
            elif preempted:
                kind = "preempt"
            elif not a.nodes and _at_end(trainer, a.time_s):
                kind = _END_CHANGE.get(trainer["state"], "rescale")
            else:
                kind = "rescale"
            out.append((a.time_s, trainer["id"], len(a.nodes), kind))
        prev, prev_s = a.nodes, a.time_s
    end = _END_CHANGE.get(trainer["state"])
    if end and trainer["finished_s"] is not None and out and out[-1][3] != end:
        out.append((trainer["finished_s"], trainer["id"], 0, end))  # its end, at zero nodes
    return out


def _at_end(trainer: dict[str, Any], time_s: float) -> bool:
    """The trainer ended at ``time_s`` (an empty allocation then is its end, not a
    shrink to zero while it waited)."""
    finished = trainer["finished_s"]
    return finished is not None and abs(time_s - finished) <= PREEMPT_SLACK_S


def _allocations(changes: list[tuple[float, str, int, str]]) -> pd.DataFrame:
    changes.sort(key=lambda c: c[0])
    return pd.DataFrame(
        {
            "time": epoch_times([c[0] for c in changes]),
            "trainer": pd.Series([c[1] for c in changes], dtype="string"),
            "nodes": pd.Series([c[2] for c in changes], dtype="int64"),
            "change": pd.Series([c[3] for c in changes], dtype=CHANGE_TYPE),
        }
    )


def _store_trainers(rows: list[dict[str, Any]], allocations: pd.DataFrame) -> pd.DataFrame:
    rescales = allocations[allocations["change"] == "rescale"].groupby("trainer").size()
    df = pd.DataFrame(
        {
            "id": pd.Series([r["id"] for r in rows], dtype="string"),
            "submitted": epoch_times([r["submit_s"] for r in rows]),
            "started": epoch_times([r["started_s"] for r in rows]),
            "finished": epoch_times([r["finished_s"] for r in rows]),
            "state": pd.Series([r["state"] for r in rows], dtype="string"),
            "min_nodes": pd.Series([r["n_min"] for r in rows], dtype="int64"),
            "max_nodes": pd.Series([r["n_max"] for r in rows], dtype="int64"),
            "samples_done": pd.Series([r["samples_done"] for r in rows], dtype="int64"),
            "reason": pd.Series([r["reason"] for r in rows], dtype="string"),
        }
    )
    df["rescales"] = df["id"].map(rescales).fillna(0).astype("int64")
    return df
