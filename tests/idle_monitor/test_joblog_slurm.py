"""A real Slurm's own job log, converted, against the pool recorded live: they must agree
node by node, within the recorder's polling interval and the log's one-second times.

The local cluster writes Slurm's job-completion log (``JobCompType=jobcomp/filetxt``,
scripts/slurm/slurm.conf.in); ``sacct -c`` prints the same log as sacct does. A mix of
main jobs runs (some wait for others, so the backfill scheduler plans them) while
``bftrainer trace record`` polls the pool; then ``bftrainer trace from-log`` converts
each form of the log. The recorder runs with ``--horizon 0``: a node the scheduler has
planned for a waiting job is idle (no job holds it) until that job starts, as in the log;
the default horizon would keep it out of the pool minutes early. Each node's changes
must match, in both directions, within 2 s: a log shifted by 3 s fails."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from bftrainer.idle_monitor.trace import Trace, load_trace
from tests.conftest import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.3
# The log's times are whole seconds (a change shows up to 1 s early), and a poll sees a
# change up to one interval late, plus the time sinfo takes to answer.
TOLERANCE_S = 1.0 + POLL_S + 0.7
# (nodes, seconds): more nodes than the cluster's 8 at once, so some jobs wait.
MIX = [(3, 4), (2, 7), (4, 3), (1, 2), (5, 3), (2, 5), (8, 2), (1, 3)]


def _jobcomp_log(cluster: SlurmCluster) -> Path:
    config = cluster.run(["scontrol", "show", "config"])
    if "jobcomp/filetxt" not in config:
        pytest.skip("this cluster was started without jobcomp/filetxt: restart it (stop, start)")
    return cluster.conf.parent / "log" / "jobcomp.log"


def _recorded_idle(folder: Path) -> set[str]:
    """The nodes idle in the recorder's latest record (its file is flushed per record;
    a last line still being written is left out)."""
    idle: dict[str, bool] = {}
    for path in folder.glob("pool-*.csv"):
        for line in path.read_text().splitlines(keepends=True)[1:]:
            cells = line.split(",")
            if line.endswith("\n") and len(cells) >= 3:
                idle[cells[1]] = cells[2] == "1"
    return {n for n, i in idle.items() if i}


def _changes(trace: Trace) -> dict[str, list[tuple[float, bool]]]:
    """Each node's state changes, the snapshot first."""
    out = {n: [(trace.start_s, n in trace.initial_idle)] for n in trace.nodes}
    for e in trace.events:
        for n in e.joined:
            out[n].append((e.time_s, True))
        for n in e.left:
            out[n].append((e.time_s, False))
    return out


def test_job_log_matches_the_recorded_pool(slurm: SlurmCluster, tmp_path: Path) -> None:
    jobcomp = _jobcomp_log(slurm)
    env = {**os.environ, **slurm.env}
    recorder = subprocess.Popen(
        [sys.executable, "-m", "bftrainer", "trace", "record", "--scheduler", "slurm",
         "--interval", str(POLL_S), "--horizon", "0", "--out", str(tmp_path / "rec"),
         "--env", f"SLURM_CONF={slurm.conf}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    try:
        wait_until(lambda: any((tmp_path / "rec").glob("pool-*.csv")), 60, "the first record")
        ids = [
            slurm.sbatch("-p", "main", "-N", str(n), "-t", "1", "--wrap", f"sleep {s}")
            for n, s in MIX
        ]
        wait_until(lambda: not (set(ids) & slurm.jobs()), 120, "every job of the mix done")
        wait_until(lambda: all(s == "idle" for s in slurm.states().values()), 30, "all nodes idle")
        # The recorder too: stopped before its poll saw the last job end, its trace would
        # end before the log's and miss that change.
        wait_until(
            lambda: _recorded_idle(tmp_path / "rec") == set(slurm.nodes), 30, "all idle recorded"
        )
        wait_until(
            lambda: all(f"JobId={i} " in jobcomp.read_text() for i in ids), 30, "the log written"
        )
    finally:
        recorder.send_signal(signal.SIGTERM)
        _, err = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, err
    (recorded_path,) = (tmp_path / "rec").glob("pool-*.csv")
    recorded = load_trace(recorded_path)
    node_list = tmp_path / "nodes.txt"
    node_list.write_text("\n".join(slurm.nodes) + "\n")

    sacct = tmp_path / "sacct.txt"
    sacct.write_text(
        subprocess.run(
            ["sacct", "-c", "-a", "-P",
             "--format=JobID,Submit,Start,End,NNodes,NodeList,Timelimit,State"],
            env={**env, "TZ": "UTC"}, capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    for log in (jobcomp, sacct):
        out = tmp_path / f"{log.stem}.csv"
        converted = subprocess.run(
            [sys.executable, "-m", "bftrainer", "trace", "from-log", str(log),
             "--node-list", str(node_list), "--out", str(out)],
            capture_output=True, text=True, check=False, cwd=REPO,
        )  # fmt: skip
        assert converted.returncode == 0, converted.stderr
        assert "jobs on 8 nodes" in converted.stdout
        from_log = load_trace(out)
        _assert_agree(recorded, from_log, ids)


def _transitions(
    changes: list[tuple[float, bool]], lo: float, hi: float
) -> list[tuple[float, bool]]:
    """The node's changes of state within [lo, hi] (repeats of a state dropped)."""
    out: list[tuple[float, bool]] = []
    state = changes[0][1]
    for t, idle in changes[1:]:
        if idle != state and lo <= t <= hi:
            out.append((t, idle))
        state = idle
    return out


def _unmatched(
    mine: list[tuple[float, bool]],
    mine_all: list[tuple[float, bool]],
    theirs: list[tuple[float, bool]],
) -> list[tuple[float, bool]]:
    """My changes (``mine``, those compared) with no change to the same state in theirs
    within the tolerance, except both ends of an idle spell shorter than it (a poll may
    miss one; the log's whole seconds may close one): spells read from all my changes
    (``mine_all``), since a spell that starts in the compared span may end after it."""
    lonely = [
        (t, idle)
        for t, idle in mine
        if not any(u == idle and abs(t - s) <= TOLERANCE_S for s, u in theirs)
    ]
    short = set()
    for (a, ia), (b, ib) in pairwise(mine_all):
        if ia and not ib and b - a <= TOLERANCE_S:
            short |= {(a, ia), (b, ib)}
    return [c for c in lonely if c not in short]


def _assert_agree(recorded: Trace, from_log: Trace, ids: list[str]) -> None:
    """Each node changes state at the same moments in both traces, to the tolerance."""
    assert set(from_log.nodes) == set(recorded.nodes)
    rec = _changes(recorded)
    log = _changes(from_log)
    lo = max(recorded.start_s, from_log.start_s) + TOLERANCE_S
    hi = min(recorded.end_s, from_log.end_s) - TOLERANCE_S
    assert hi - lo > 5, "the traces overlap for too short a time to compare"
    matched = 0
    everything = (-math.inf, math.inf)
    for node in recorded.nodes:
        r = _transitions(rec[node], lo, hi)
        g = _transitions(log[node], lo, hi)
        r_all = _transitions(rec[node], *everything)
        g_all = _transitions(log[node], *everything)
        for mine, mine_all, theirs, who in (
            (r, r_all, g_all, "recorded"),
            (g, g_all, r_all, "the log"),
        ):
            lonely = _unmatched(mine, mine_all, theirs)
            assert not lonely, (
                f"{node}: {who} has changes {lonely} that the other trace does not have "
                f"within {TOLERANCE_S} s (recorded {r}, log {g}; jobs {ids})"
            )
        matched += len(g)
        # The mix made every node busy at least once (a job that ends at the log's very
        # end never ends in it: the log has nothing after it).
        assert any(not idle for _, idle in g_all) and any(not idle for _, idle in r_all), node
    assert matched >= len(recorded.nodes)
