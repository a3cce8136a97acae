"""A replay gives the same figures in every run and at any PYTHONHASHSEED.

Each replay runs in a fresh interpreter with its own hash seed: within one process every
set of node names iterates the same way, so only a second process can show a figure that
depends on set order (issue 11; before the loop sorted joined nodes, U moved by a few
0.0001 with the seed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.shared_data import SHARED

# Run in the child: replays of one input and prints their summaries as JSON. argv: the
# input ("synthetic" or the Summit trace's path), the policies, and "set-order" to make
# the loop add joined nodes in set order (what it did before), to show the test sees it.
CHILD = r"""
import json, sys
from bftrainer.replay.run import ReplayConfig, replay
what, policies, mode = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
if mode == "set-order":
    import bftrainer.loop.core
    bftrainer.loop.core.sorted = lambda items, **_: list(items)
if what == "synthetic":
    from bftrainer.idle_monitor.synthetic import SyntheticConfig, synthetic_trace
    from bftrainer.replay.workload import hpo_workload
    # The CLI's default (512 nodes, seed 0), its first 6 h: seconds, not a minute.
    trace = synthetic_trace(SyntheticConfig(duration_s=6 * 3600))
    jobs = hpo_workload(1000, trace.start_s)
else:
    from bftrainer.idle_monitor.trace import load_trace
    from bftrainer.replay.workload import read_paper_jobs
    jobs = read_paper_jobs(__import__("pathlib").Path(sys.argv[4]))
    first = min(j.submit_s for j in jobs)
    trace = load_trace(what, nodes=slice(0, 1024), end_s=first + 24 * 3600)
out = []
for p in policies:
    s = replay(trace, jobs, ReplayConfig(policy=p, solver="dp", t_fwd_s=120.0)).summary
    out.append({k: v for k, v in s.items() if k not in ("wall_s", "events_per_s", "mean_solve_s")})
print(json.dumps(out))
"""


def replay_with_seed(hash_seed: str, *args: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out: list[dict[str, Any]] = json.loads(done.stdout)
    return out


def replays(seeds: tuple[str, ...], *args: str) -> list[list[dict[str, Any]]]:
    """The same replay at each hash seed, side by side."""
    with ThreadPoolExecutor(len(seeds)) as pool:
        return list(pool.map(lambda seed: replay_with_seed(seed, *args), seeds))


def test_the_synthetic_default_is_the_same_at_any_hash_seed() -> None:
    a, b = replays(("1", "2"), "synthetic", "milp,equal", "sorted")
    assert [s["policy"] for s in a] == ["milp", "equal"]
    assert a == b  # every figure, to the last bit
    assert a[0]["events"] > 300  # hours of pool changes, not an empty replay


def test_the_check_sees_a_replay_that_follows_set_order() -> None:
    """The loop as it was (joined nodes in set order) fails the test above."""
    a, b = replays(("1", "2"), "synthetic", "equal", "set-order")
    assert a[0]["utilization_efficiency"] != b[0]["utilization_efficiency"]


WEEK1 = SHARED / "bftrainer-traces" / "summit_week1_node_events.csv.gz"
JOBS = SHARED / "bftrainer-traces" / "hps-shufflenet-Jbnd-1000J.csv"


@pytest.mark.skipif(not WEEK1.is_file(), reason=f"Summit trace not found at {WEEK1}")
def test_equal_share_on_a_summit_day_is_the_same_at_any_hash_seed() -> None:
    # The note's 0.8028-0.8043 spread came from this replay (first 24 h, equal share).
    a, b = replays(("1", "2"), str(WEEK1), "equal", "sorted", str(JOBS))
    assert a == b
    assert a[0]["hours"] == pytest.approx(24.0)
