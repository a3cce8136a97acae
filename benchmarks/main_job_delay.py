"""The central promise, measured: what bftrainer costs the main scheduler's jobs.

    python benchmarks/main_job_delay.py [--seed 1] [--jobs 12] [--compress 60]

A seeded main workload runs twice on the local 8-node Slurm: once alone, once with the
daemon and trainers soaking up the idle nodes. Jobs arrive at Summit week 1's rate of
node take-backs (0.264 per node-hour, measured from the log in ../shared/data, scaled to
8 nodes; sizes 1-4 nodes, the week's median take-back is 4 nodes of 4,734), with time
compressed ``--compress`` times so that an hour of Summit lasts a minute here. Printed:
per job, the start delay bftrainer adds (with minus without), its p50, p95 and max, and
the share of idle node-time that became training time (nodes a running trainer was
given, held by a running holder, over the nodes no main job used). Needs root (to start
the local Slurm) or a running one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.soak import cluster  # noqa: E402
from tests.bftrainer.daemon_service import Service, StartWatch  # noqa: E402
from tests.conftest import CLUSTER_SCRIPT, SlurmCluster  # noqa: E402

TAKES_PER_NODE_HOUR = 0.264  # Summit week 1: 209,178 take-backs / 4,734 nodes / 167.2 h
NODES = 8


def workload(seed: int, jobs: int, compress: float) -> list[tuple[float, int, int]]:
    """(arrival s, nodes, length s) of each main job: Poisson arrivals."""
    rng = random.Random(seed)
    sizes = [rng.randint(1, 4) for _ in range(jobs)]
    per_s = TAKES_PER_NODE_HOUR * NODES / statistics.fmean(sizes) / 3600 * compress
    t, out = 10.0, []
    for size in sizes:
        out.append((round(t, 1), size, rng.randint(20, 90)))
        t += rng.expovariate(per_s)
    return out


def keep_two_trainers(service: Service, status: dict[str, Any]) -> None:
    """Demand for every idle node: two torchrun trainers that never end by themselves."""
    alive = sum(t["state"] in ("queued", "running", "waiting") for t in status["trainers"])
    for _ in range(2 - alive):
        service.submit("torchrun", 10_000_000, NODES, "--step-delay-s", "0.05")


def run(
    slurm: SlurmCluster, jobs: list[tuple[float, int, int]], service: Service | None
) -> tuple[list[float | None], dict[str, float]]:
    """Start delay of each job (s, None if it never started), and node-seconds (sampled
    each 1 s): ``idle`` (no main job on the node) and, with bftrainer, how much of it was
    in the daemon's pool, held by a running holder, and given to a running trainer."""
    watch = StartWatch(slurm)
    ids: list[str] = []
    node_s = dict.fromkeys(("idle", "pool", "held", "trained"), 0.0)
    t0 = time.monotonic()
    end = jobs[-1][0] + max(length for _, _, length in jobs) + 30
    last = t0
    while time.monotonic() - t0 < end or len(watch.started) < len(jobs):
        now = time.monotonic()
        for at, size, length in jobs[len(ids) :]:
            if now - t0 < at:
                break
            job = slurm.sbatch(
                "-p", "main", "-N", str(size), "-t", "3", "--wrap", f"sleep {length}"
            )
            watch.track(job)
            ids.append(job)
        dt, last = now - last, now
        node_s["idle"] += max(0, NODES - sum(watch.running.values())) * dt
        if service is not None:
            status = service.status()
            held = {p["node"] for p in status["pool"] if p["holder_state"] == "running"}
            used = {n for t in status["trainers"] if t["state"] == "running" for n in t["nodes"]}
            node_s["pool"] += len(status["pool"]) * dt
            node_s["held"] += len(held) * dt
            node_s["trained"] += len(used & held) * dt
            keep_two_trainers(service, status)
        if time.monotonic() - t0 > end + 600:
            break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    watch.stop()
    return [watch.started.get(job) for job in ids], node_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--compress", type=float, default=60.0)
    ap.add_argument("--poll", type=float, default=10.0, help="The daemon's poll interval (s).")
    args = ap.parse_args()
    jobs = workload(args.seed, args.jobs, args.compress)
    slurm, started_here = cluster()
    try:
        slurm.reset()
        alone, alone_s = run(slurm, jobs, None)
        slurm.reset()
        with tempfile.TemporaryDirectory(prefix="bftrainer-delay-") as tmp:
            logs = Path(tmp) / "logs"
            logs.mkdir()
            service = Service(slurm, Path(tmp) / "state", logs)
            try:
                service.start("equal", poll_s=args.poll)
                keep_two_trainers(service, service.status())
                time.sleep(60)  # the trainers on every idle node before the workload
                with_bf, node_s = run(slurm, jobs, service)
                for t in service.status()["trainers"]:
                    if t["state"] in ("queued", "running", "waiting"):
                        service.cli("cancel", t["id"])
                service.stop()
            finally:
                service.cleanup()
    finally:
        slurm.reset()
        if started_here:
            subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True)
    print(
        f"{len(jobs)} main jobs (seed {args.seed}, time compressed {args.compress:g}x, "
        f"poll {args.poll:g} s)"
    )
    print("job  nodes  length_s  delay_alone_s  delay_with_s  added_s")
    added = []

    def fmt(x: float | None) -> str:
        return "never" if x is None else f"{x:.2f}"

    for i, (_, size, length) in enumerate(jobs):
        a, w = alone[i], with_bf[i]
        diff = None if a is None or w is None else w - a
        if diff is not None:
            added.append(diff)
        print(f"{i:3d}  {size:5d}  {length:8d}  {fmt(a):>13}  {fmt(w):>12}  {fmt(diff):>7}")
    added.sort()

    def q(p: float) -> float:
        return added[min(len(added) - 1, int(p * len(added)))]

    idle = node_s["idle"]
    print(
        f"added start delay: p50 {q(0.5):.2f} s, p95 {q(0.95):.2f} s, max {added[-1]:.2f} s; "
        f"idle node-time harvested: {node_s['trained'] / idle:.1%} "
        f"({node_s['trained']:.0f} of {idle:.0f} node-s; alone the pool had {alone_s['idle']:.0f})"
    )
    print(
        "where the idle node-time went: "
        f"in the daemon's pool {node_s['pool'] / idle:.1%}, held by a running holder "
        f"{node_s['held'] / idle:.1%}, given to a running trainer {node_s['trained'] / idle:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
