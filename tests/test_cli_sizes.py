"""Sizes within the documented limits run in bounded memory (issue 31): each command runs
as users run it, in a process whose address space is capped well below what the dense
tables of before asked for, and must answer, not die of a MemoryError."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

# Far below what the dense DP asked for in each case below (74.5 GiB; 1.8 GB per block of
# a 15,000-node pool), far above what a replay or an allocation needs (~150-300 MB).
ADDRESS_SPACE_BYTES = 1_500_000_000 if sys.platform == "linux" else None


def capped(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``bftrainer ARGS`` with its address space capped at ``ADDRESS_SPACE_BYTES``."""

    def cap() -> None:
        assert ADDRESS_SPACE_BYTES is not None
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))

    return subprocess.run(
        [sys.executable, "-m", "bftrainer", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        preexec_fn=cap,
        timeout=600,
        check=False,
    )


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "MemoryError" not in done.stderr, done.stderr[-3000:]


pytestmark = pytest.mark.skipif(ADDRESS_SPACE_BYTES is None, reason="RLIMIT_AS is Linux's")


@pytest.mark.parametrize("solver", ["dp", "highs"])
def test_allocate_of_a_huge_pool_and_n_max_answers_in_bounded_memory(
    tmp_path: Path, solver: str
) -> None:
    # 100,000 nodes, three trainers of n_max 1,000,000 (the documented limit).
    pool = [f"n{i}" for i in range(100_000)]
    curve = [[1, 100.0], [1000, 50_000.0], [1_000_000, 1e7]]
    trainers = [
        {"id": f"t{j}", "n_min": 1, "n_max": 1_000_000, "rescale_up": 10, "rescale_down": 5}
        | {"curve": curve, "nodes": pool[j : j + 1]}
        for j in range(3)
    ]
    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps({"pool": pool, "trainers": trainers}))
    done = capped(
        "allocate", str(problem), "--solver", solver, "--time-limit", "2", "--json", cwd=tmp_path
    )
    no_traceback(done)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] in ("optimal", "time_limit")
    held = [n for nodes in result["allocation"].values() for n in nodes]
    assert len(held) == len(set(held)) and set(held) <= set(pool)
    assert len(held) > 90_000  # growing pays: the pool is not left idle


def test_a_pool_and_job_of_15000_nodes_replay_in_bounded_memory(tmp_path: Path) -> None:
    nodes = 15_000
    rows = ["time,node,idle", *(f"1612915200,n{i},1" for i in range(nodes))]
    rows += [f"{1612915200 + 600 * k},n{k},0" for k in range(1, 3)]
    (tmp_path / "wide.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "one-Jbnd-1J.csv").write_text(
        f"job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\nJ0,18.0,12.0,1,{nodes},1e12,2021-02-10 00:00:10\n"
    )
    (tmp_path / "one-JNPs-1J.csv").write_text(
        "job,point,nodes,throughput_samples_per_s,objective\n"
        f"J0,0,0,0,0\nJ0,1,1,100,100\nJ0,2,{nodes},1000000,1000000\n"
    )
    done = capped(
        "replay", "wide.csv", "--jobs", "one-Jbnd-1J.csv", "--solver", "dp", "--no-progress",
        "--out", "out", cwd=tmp_path,
    )  # fmt: skip
    no_traceback(done)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["samples_processed"] > 0


def test_max_parallel_far_past_the_jobs_costs_no_more_than_the_jobs(tmp_path: Path) -> None:
    args = ["replay", "--synthetic-nodes", "64", "--synthetic-hours", "2", "--jobs-count", "20"]
    runs = {}
    for p in ("100000000000", "20"):
        done = capped(
            *args, "--max-parallel", p, "--no-progress", "--out", f"out-{p}", cwd=tmp_path
        )
        no_traceback(done)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[p] = json.loads((tmp_path / f"out-{p}" / "summary.json").read_text())
    # Twenty jobs: at most twenty run at once, whatever the cap.
    assert runs["100000000000"]["samples_processed"] == runs["20"]["samples_processed"]


def test_allocate_past_the_table_limit_is_refused_before_work(tmp_path: Path) -> None:
    pool = [f"n{i}" for i in range(100_000)]
    curve = [[1, 100.0], [1_000_000, 1e7]]
    trainers = [
        {"id": f"t{j}", "n_min": 1, "n_max": 1_000_000, "rescale_up": 10, "rescale_down": 5}
        | {"curve": curve}
        for j in range(2_000)
    ]
    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps({"pool": pool, "trainers": trainers, "max_trainers": 2_000}))
    done = capped("allocate", str(problem), "--solver", "dp", cwd=tmp_path)
    no_traceback(done)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("Error")]
    assert "max_trainers" in line and "n_max" in line and "20,000,000" in line
