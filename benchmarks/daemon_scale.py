"""The daemon at hundreds of nodes: taking idle nodes, one poll, one decision.

    python benchmarks/daemon_scale.py acquire [--nodes 200] [--workers 8] [--runs R]
        [--against OLD_HOLDER_SCRIPT]                                    # needs Slurm
    python benchmarks/daemon_scale.py submit [--nodes 200] [--workers 8]
    python benchmarks/daemon_scale.py poll [--held 200] [--polls 20]
    python benchmarks/daemon_scale.py decide [--size 100x256] [--events 50]

Run the first two on a local Slurm of 128-256 nodes (``NNODES=256
scripts/slurm/local-cluster.sh start``, SLURM_CONF exported; docs/slurm-local.md):

- ``acquire``: the time from the daemon's decision to hold N idle nodes of partition
  ``bf`` until every holder is RUNNING in ``held()`` (the daemon's own status call), and
  from ``release`` until none is live and sinfo shows the nodes idle again. The holders
  are submitted as the daemon does (``SlurmHolders.acquire_many``), each with a lease
  file, as the daemon passes.
- ``submit``: the same submissions and cancel with every holder held (``--hold``), so
  that none starts: the cost of ``sbatch`` and slurmctld alone, without 200 holders
  launching on the same 2 cores.
- ``poll``: one daemon poll's reading and planning, with N holders running: the pool
  source's commands (``sinfo``, ``squeue`` of running and of pending jobs, ``scontrol
  show res``), the holders' status (``squeue``) and reconcile, and the hold plan. Not
  timed: the state database's writes, which only happen when something changed.
- ``decide``: decision latency of the core loop with 100 trainers on 256 nodes, the
  machinery of benchmarks/decision_latency.py (no Slurm: a virtual clock).

Goals (issue 21): 200 idle nodes held within 10 s; a poll at 256 nodes <= 1 s; p95
decision latency at 100 trainers x 256 nodes <= 100 ms with the default solver. Each
command prints its figures as one JSON line and adds them to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.decision_latency import measure as decision_latency  # noqa: E402
from bftrainer.daemon.hold_plan import plan_holders  # noqa: E402
from bftrainer.holders.slurm import SUBMIT_WORKERS, SlurmHolders  # noqa: E402
from bftrainer.idle_monitor.runner import LocalRunner  # noqa: E402
from bftrainer.idle_monitor.slurm import SlurmScheduler  # noqa: E402
from bftrainer.idle_monitor.source import LivePoolSource  # noqa: E402
from bftrainer.policies.config import Config  # noqa: E402
from bftrainer.trainers.channel import renew_lease  # noqa: E402

JOB_NAME = "bftrainer-scale"  # not the daemon's: never touch a daemon's holders
GOALS = {"acquire_200_s": 10.0, "poll_256_s": 1.0, "decide_100x256_p95_ms": 100.0}


def _runner() -> LocalRunner:
    return LocalRunner(timeout_s=120.0)


def _holders(
    runner: LocalRunner,
    workers: int = SUBMIT_WORKERS,
    extra_args: tuple[str, ...] = (),
    script: Path | None = None,
) -> SlurmHolders:
    return SlurmHolders(
        runner,
        partition="bf",
        job_name=JOB_NAME,
        workers=workers,
        extra_args=extra_args,
        **({"script": script} if script is not None else {}),
    )


def _idle_bf_nodes(runner: LocalRunner) -> list[str]:
    out = runner.run(["sinfo", "-N", "-h", "-p", "bf", "-o", "%N|%T"]).stdout
    nodes = [n for n, s in (line.split("|") for line in out.split()) if s == "idle"]
    return sorted(nodes, key=lambda n: (len(n), n))


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - t0


def hold(
    runner: LocalRunner,
    n: int,
    lease_dir: Path,
    workers: int = SUBMIT_WORKERS,
    script: Path | None = None,
) -> tuple[list[str], dict[str, float]]:
    """Hold ``n`` idle nodes; the job ids and the times (s) of each phase."""
    holders = _holders(runner, workers, script=script)
    nodes = _idle_bf_nodes(runner)
    if len(nodes) < n:
        raise SystemExit(f"{n} nodes asked for, {len(nodes)} idle in partition bf")
    nodes = nodes[:n]
    until = time.time() + 3600
    for node in nodes:
        renew_lease(lease_dir / node, until)
    t0 = time.monotonic()
    jobs = holders.acquire_many(
        {node: None for node in nodes}, {n: str(lease_dir / n) for n in nodes}
    )
    submitted = time.monotonic() - t0
    ids = [j for j in jobs.values() if isinstance(j, str)]
    failed = {n: str(e) for n, e in jobs.items() if not isinstance(e, str)}
    if failed:
        holders.release(*ids)
        raise SystemExit(f"{len(failed)} holders not submitted, e.g. {next(iter(failed.items()))}")

    def all_running() -> bool:
        held = holders.held()
        return all(held.get(j) is not None and held[j].state == "running" for j in ids)

    _wait(all_running, 300, f"{n} holders running")
    return ids, {"submit_s": submitted, "running_s": time.monotonic() - t0}


def release(
    runner: LocalRunner, ids: list[str], nodes_before: int, workers: int = SUBMIT_WORKERS
) -> dict[str, float]:
    holders = _holders(runner, workers)
    t0 = time.monotonic()
    holders.release(*ids)
    cancelled = time.monotonic() - t0
    gone = _wait(lambda: not any(s.live for s in holders.held().values()), 300, "holders ended")
    idle = _wait(lambda: len(_idle_bf_nodes(runner)) >= nodes_before, 300, "nodes idle again")
    return {"cancel_s": cancelled, "ended_s": gone, "idle_s": idle}


def cmd_acquire(args: argparse.Namespace) -> dict[str, Any]:
    """Hold and give back N nodes ``--runs`` times; with ``--against OLD``, alternate the
    daemon's holder script with OLD, run by run, so both see the same machine."""
    runner = _runner()
    before = len(_idle_bf_nodes(runner))
    scripts: dict[str, Path | None] = {"daemon": None}
    if args.against is not None:
        scripts["against"] = args.against.resolve()
    series: dict[str, list[dict[str, float]]] = {k: [] for k in scripts}
    for _ in range(args.runs):
        for name, script in scripts.items():
            with tempfile.TemporaryDirectory(prefix="bftrainer-scale-") as tmp:
                ids, times = hold(runner, args.nodes, Path(tmp), args.workers, script)
                times.update(release(runner, ids, before, args.workers))
            series[name].append(times)
            print(name, json.dumps(times), flush=True)
    out: dict[str, Any] = {
        "nodes": args.nodes,
        "cluster_nodes": _cluster_size(runner),
        "workers": args.workers,
        "runs": args.runs,
        **series["daemon"][-1],
    }
    for name, rows in series.items():
        for key in ("running_s", "ended_s"):
            out[f"{name}_{key[:-2]}_median_s"] = statistics.median(r[key] for r in rows)
    if args.against is not None:
        out["against"] = str(args.against)
        out["running_ratio"] = out["daemon_running_median_s"] / out["against_running_median_s"]
    return out


def cmd_submit(args: argparse.Namespace) -> dict[str, Any]:
    """The submissions alone: holders submitted held (``sbatch --hold``), so none starts,
    then cancelled. What ``sbatch`` and slurmctld cost without the jobs' launches, which
    here run on the same 2 cores and on a real cluster on the nodes."""
    runner = _runner()
    holders = _holders(runner, args.workers, ("--hold",))
    nodes = _idle_bf_nodes(runner)[: args.nodes]
    t0 = time.monotonic()
    jobs = holders.acquire_many(dict.fromkeys(nodes))
    submitted = time.monotonic() - t0
    ids = [j for j in jobs.values() if isinstance(j, str)]
    t1 = time.monotonic()
    holders.release(*ids)
    cancelled = time.monotonic() - t1
    if len(ids) != len(nodes):
        raise SystemExit(f"{len(nodes) - len(ids)} holders not submitted")
    return {
        "nodes": len(nodes),
        "workers": args.workers,
        "submit_s": submitted,
        "cancel_s": cancelled,
    }


def cmd_poll(args: argparse.Namespace) -> dict[str, Any]:
    runner = _runner()
    before = len(_idle_bf_nodes(runner))
    with tempfile.TemporaryDirectory(prefix="bftrainer-scale-") as tmp:
        ids, _ = hold(runner, args.held, Path(tmp)) if args.held else ([], {})
        try:
            row = _time_polls(runner, ids, args.polls)
        finally:
            if ids:
                release(runner, ids, before)
    return {"cluster_nodes": _cluster_size(runner), "held": args.held, **row}


def _time_polls(runner: LocalRunner, ids: list[str], polls: int) -> dict[str, Any]:
    """What ``Daemon.poll`` and ``settle`` read and compute, timed part by part."""
    source = LivePoolSource(SlurmScheduler(bf_partitions=("bf",)), runner)
    holders = _holders(runner)
    known = {j: s.node for j, s in holders.held().items() if j in set(ids)}
    parts: dict[str, list[float]] = {"pool_s": [], "holders_s": [], "plan_s": [], "total_s": []}
    for _ in range(polls):
        t0 = time.perf_counter()
        source.poll()
        t1 = time.perf_counter()
        result = holders.reconcile(known)
        t2 = time.perf_counter()
        view = source.view()
        running = [s.node for s in result.live.values() if s.state == "running"]
        pending = [s.node for s in result.live.values() if s.state == "pending"]
        plan = plan_holders(
            pool=sorted(view.pool),
            windows_s=view.windows_s,
            running=running,
            pending=pending,
            allocated=running,
            demand=len(running),
        )
        t3 = time.perf_counter()
        assert not plan.acquire and not plan.release, plan
        for key, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
            parts[key].append(v)
    out: dict[str, Any] = {"polls": polls, "pool_nodes": len(view.pool)}
    for key, values in parts.items():
        values.sort()
        out[f"{key[:-2]}_median_s"] = statistics.median(values)
        out[f"{key[:-2]}_p95_s"] = values[int(0.95 * (len(values) - 1))]
        out[f"{key[:-2]}_max_s"] = values[-1]
    return out


def cmd_decide(args: argparse.Namespace) -> dict[str, Any]:
    trainers, nodes = map(int, args.size.split("x"))
    solver = args.solver or Config().solver
    row = decision_latency(trainers, nodes, args.events, solver, args.seed)
    return {"size": args.size, "solver": solver, "events": args.events, **row}


def _cluster_size(runner: LocalRunner) -> int:
    return len(runner.run(["sinfo", "-N", "-h", "-p", "bf", "-o", "%N"]).stdout.split())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("acquire", help="hold N idle nodes, then give them back")
    a.add_argument("--nodes", type=int, default=200)
    a.add_argument(
        "--workers",
        type=int,
        default=SUBMIT_WORKERS,
        help="sbatch/scancel in flight at once (1: one after another)",
    )
    a.add_argument("--runs", type=int, default=1, help="hold and give back this many times")
    a.add_argument(
        "--against",
        type=Path,
        help="another holder script, run alternately with the daemon's (an A/B in one run)",
    )
    s = sub.add_parser("submit", help="N holders submitted held (none starts), cancelled")
    s.add_argument("--nodes", type=int, default=200)
    s.add_argument("--workers", type=int, default=SUBMIT_WORKERS)
    p = sub.add_parser("poll", help="one poll's cost with N holders running")
    p.add_argument("--held", type=int, default=200)
    p.add_argument("--polls", type=int, default=20)
    d = sub.add_parser("decide", help="decision latency, 100 trainers x 256 nodes")
    d.add_argument("--size", default="100x256")
    d.add_argument("--events", type=int, default=50)
    d.add_argument("--solver", help="default: the daemon's default solver")
    d.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/daemon_scale.json"))
    args = ap.parse_args()
    if args.what != "decide" and not os.environ.get("SLURM_CONF"):
        raise SystemExit("export SLURM_CONF of a local Slurm (docs/slurm-local.md)")
    commands = {"acquire": cmd_acquire, "submit": cmd_submit, "poll": cmd_poll}
    row = {**commands, "decide": cmd_decide}[args.what](args)
    row["machine"] = platform.platform()
    row["load_average_1min"] = os.getloadavg()[0]  # 2 shared cores: figures move with it
    print(args.what, json.dumps(row), flush=True)
    results = json.loads(args.out.read_text()) if args.out.exists() else {"goals": GOALS}
    results.setdefault(args.what, []).append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
