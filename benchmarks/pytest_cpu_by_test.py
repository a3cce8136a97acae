"""A pytest plugin: the CPU each test costs, its child processes included.

On 2 cores the suite is CPU-bound, so its wall time falls only with the CPU its tests
spend; a test's own wall time says little (it waits on the others' CPU). Each xdist
worker moves itself into a cpuacct cgroup of its own at start, so every process it
starts (trainers, daemons, Slurm's local cluster and its jobs) is counted there, and a
test's CPU is that group's usage across the test (setup, call and teardown). What a
worker's leftovers spend while the next test runs is charged to that one.

    PYTHONPATH=benchmarks .venv/bin/pytest -p pytest_cpu_by_test -n 4 --dist loadgroup
    .venv/bin/python benchmarks/pytest_cpu_by_test.py [--top 40]   # the table

Needs root and the cgroup v1 cpuacct hierarchy (``/sys/fs/cgroup/cpuacct``); without
them it records nothing and says so once. One JSON line a test in
``benchmarks/results/cpu_by_test.jsonl`` (``CPU_BY_TEST_OUT`` overrides), appended.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path("/sys/fs/cgroup/cpuacct")
OUT = Path(os.environ.get("CPU_BY_TEST_OUT", "benchmarks/results/cpu_by_test.jsonl"))

_group: Path | None = None
_worker = "main"


def pytest_configure(config: pytest.Config) -> None:
    global _group, _worker
    worker = _worker = getattr(config, "workerinput", {}).get("workerid", "main")
    for stale in ROOT.glob("bft-test-*-*"):  # an earlier run's (its processes lingered at
        pid = stale.name.rsplit("-", 1)[1]  # its end): its worker gone, and empty
        if not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                stale.rmdir()
    group = ROOT / f"bft-test-{worker}-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        print(f"pytest_cpu_by_test: no cgroup ({e}); nothing recorded")
        return
    _group = group
    OUT.parent.mkdir(parents=True, exist_ok=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Back to the root group, and the worker's removed (if nothing is left in it)."""
    if _group is not None:
        (ROOT / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            _group.rmdir()


def _usage_s() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if _group is None:
        yield
        return
    cpu0, wall0 = _usage_s(), time.monotonic()
    yield
    line = {
        "test": item.nodeid,
        "cpu_s": round(_usage_s() - cpu0, 3),
        "wall_s": round(time.monotonic() - wall0, 3),
        "worker": _worker,
        "end_s": round(time.time(), 3),  # epoch: when each worker went idle, below
    }
    with OUT.open("a") as f:
        f.write(json.dumps(line) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description="The tests that cost most CPU, and by file.")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("path", nargs="?", type=Path, default=OUT)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = [json.loads(x) for x in args.path.read_text().splitlines()]
    total = sum(r["cpu_s"] for r in rows)
    print(f"{len(rows)} tests, {total:,.0f} s of CPU")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[: args.top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        f = by_file[r["test"].split("::")[0]]
        f[0] += r["cpu_s"]
        f[1] += 1
    print("\nby file:")
    for name, (cpu, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{cpu:8.1f} {int(n):5d}  {name}")
    timed = [r for r in rows if "end_s" in r]
    if timed:
        # A worker that goes idle long before the others: the run waited on a long test
        # that started late, or on a group held to one worker.
        start = min(r["end_s"] - r["wall_s"] for r in timed)
        print("\nby worker: tests, their wall s, idle from (s after the first start), last test")
        for worker in sorted({r["worker"] for r in timed}):
            mine = [r for r in timed if r["worker"] == worker]
            last = max(mine, key=lambda r: r["end_s"])
            busy = sum(r["wall_s"] for r in mine)
            idle = last["end_s"] - start
            print(f"{worker:>6} {len(mine):5d} {busy:8.1f} {idle:8.1f}  {last['test']}")


if __name__ == "__main__":
    main()
