"""A real Slurm's own job log, converted, against the pool recorded live: they must agree
node by node, within the recorder's polling interval and the log's one-second times.

The local cluster writes Slurm's job-completion log (``JobCompType=jobcomp/filetxt``,
scripts/slurm/slurm.conf.in); ``sacct -c`` prints the same log as sacct does. A mix of
main jobs runs (some wait for others, so the backfill scheduler plans them) while
``bftrainer trace record`` polls the pool; then ``bftrainer trace from-log`` converts
each form of the log. The recorder runs with ``--horizon 0``: a node the scheduler has
planned for a waiting job is idle (no job holds it) until that job starts, as in the log;
the default horizon would keep it out of the pool minutes early."""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bftrainer.idle_monitor.trace import Trace, load_trace
from tests.conftest import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.3
# The log's times are whole seconds (a change may show up to 1 s off), a poll sees a
# change up to one interval late, and a node completes its job's end for a moment.
TOLERANCE_S = 1.0 + 2 * POLL_S + 1.0
# (nodes, seconds): more nodes than the cluster's 8 at once, so some jobs wait.
MIX = [(3, 4), (2, 7), (4, 3), (1, 2), (5, 3), (2, 5), (8, 2), (1, 3)]


def _jobcomp_log(cluster: SlurmCluster) -> Path:
    config = cluster.run(["scontrol", "show", "config"])
    if "jobcomp/filetxt" not in config:
        pytest.skip("this cluster was started without jobcomp/filetxt: restart it (stop, start)")
    return cluster.conf.parent / "log" / "jobcomp.log"


def _changes(trace: Trace) -> dict[str, list[tuple[float, bool]]]:
    """Each node's state changes, the snapshot first."""
    out = {n: [(trace.start_s, n in trace.initial_idle)] for n in trace.nodes}
    for e in trace.events:
        for n in e.joined:
            out[n].append((e.time_s, True))
        for n in e.left:
            out[n].append((e.time_s, False))
    return out


def _state(changes: list[tuple[float, bool]], t: float) -> bool | None:
    k = bisect.bisect_right([c[0] for c in changes], t) - 1
    return changes[k][1] if k >= 0 else None


def _near_change(changes: list[tuple[float, bool]], t: float) -> bool:
    return any(abs(c[0] - t) <= TOLERANCE_S for c in changes[1:])


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


def _assert_agree(recorded: Trace, from_log: Trace, ids: list[str]) -> None:
    """At every recorded change and every 0.1 s between, each node's state in the two
    traces is the same, or the log changes it within the tolerance."""
    assert set(from_log.nodes) == set(recorded.nodes)
    rec = _changes(recorded)
    log = _changes(from_log)
    lo = max(recorded.start_s, from_log.start_s)
    hi = min(recorded.end_s, from_log.end_s)
    assert hi - lo > 5, "the traces overlap for too short a time to compare"
    times = sorted({lo + 0.1 * k for k in range(int((hi - lo) / 0.1))})
    checked = disagreements = 0
    for node in recorded.nodes:
        for t in times:
            a, b = _state(rec[node], t), _state(log[node], t)
            if a is None or b is None:
                continue
            checked += 1
            if a != b and not (_near_change(log[node], t) or _near_change(rec[node], t)):
                disagreements += 1
                raise AssertionError(
                    f"{node} at {t:.1f}: recorded {'idle' if a else 'busy'}, "
                    f"the log says {'idle' if b else 'busy'} (jobs {ids})"
                )
    assert checked > 100 and disagreements == 0
    # The mix made every node busy at least once, in both.
    assert all(any(not idle for _, idle in log[n]) for n in recorded.nodes)
    assert all(any(not idle for _, idle in rec[n]) for n in recorded.nodes)
