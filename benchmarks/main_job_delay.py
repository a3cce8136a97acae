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
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.soak import cluster  # noqa: E402
from tests.bftrainer.daemon_service import Service  # noqa: E402
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


def run(
    slurm: SlurmCluster, jobs: list[tuple[float, int, int]], service: Service | None
) -> tuple[dict[int, float], float, float]:
    """Start delay of each job (s); idle and training node-seconds (sampled each 1 s)."""
    submitted: dict[int, tuple[str, float]] = {}
    started: dict[int, float] = {}
    idle_s = trained_s = 0.0
    t0 = time.monotonic()
    end = jobs[-1][0] + max(length for _, _, length in jobs) + 30
    last = t0
    while time.monotonic() - t0 < end or len(started) < len(jobs):
        now = time.monotonic()
        for i, (at, size, length) in enumerate(jobs):
            if i not in submitted and now - t0 >= at:
                job = slurm.sbatch(
                    "-p", "main", "-N", str(size), "-t", "3", "--wrap", f"sleep {length}"
                )
                submitted[i] = (job, time.time())
        ids = ",".join(j for j, _ in submitted.values())
        out = (
            slurm.run(["squeue", "-h", "-t", "all", "-j", ids, "-o", "%i|%T|%D"], False)
            if ids
            else ""
        )
        busy = 0
        for line in out.splitlines():
            job, state, nodes = line.split("|")
            i = next(k for k, (j, _) in submitted.items() if j == job)
            if state in ("RUNNING", "COMPLETING", "COMPLETED") and i not in started:
                started[i] = time.time() - submitted[i][1]
            if state == "RUNNING":
                busy += int(nodes)
        dt, last = now - last, now
        idle_s += max(0, NODES - busy) * dt
        if service is not None:
            status = service.status()
            held = {p["node"] for p in status["pool"] if p["holder_state"] == "running"}
            used = {n for t in status["trainers"] if t["state"] == "running" for n in t["nodes"]}
            trained_s += len(used & held) * dt
            if sum(t["state"] in ("queued", "running", "waiting") for t in status["trainers"]) < 2:
                service.submit("torchrun", 10_000_000, NODES, "--step-delay-s", "0.05")
        if time.monotonic() - t0 > end + 600:
            break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    return started, idle_s, trained_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--compress", type=float, default=60.0)
    args = ap.parse_args()
    jobs = workload(args.seed, args.jobs, args.compress)
    slurm, started_here = cluster()
    try:
        slurm.reset()
        alone, idle_alone, _ = run(slurm, jobs, None)
        slurm.reset()
        with tempfile.TemporaryDirectory(prefix="bftrainer-delay-") as tmp:
            logs = Path(tmp) / "logs"
            logs.mkdir()
            service = Service(slurm, Path(tmp) / "state", logs)
            try:
                service.start("equal", poll_s=10.0)
                time.sleep(60)  # the trainers on every idle node before the workload
                with_bf, idle_s, trained_s = run(slurm, jobs, service)
                for t in service.status()["trainers"]:
                    if t["state"] in ("queued", "running", "waiting"):
                        service.cli("cancel", t["id"])
                service.stop()
            finally:
                service.cleanup()
    finally:
        slurm.reset()
        if started_here:
            import subprocess

            subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True)
    added = sorted(with_bf[i] - alone[i] for i in range(len(jobs)) if i in alone and i in with_bf)
    print(f"{len(jobs)} main jobs (seed {args.seed}, time compressed {args.compress:g}x)")
    print("job  nodes  length_s  delay_alone_s  delay_with_s  added_s")
    for i, (_, size, length) in enumerate(jobs):
        a, w = alone.get(i, float("nan")), with_bf.get(i, float("nan"))
        print(f"{i:3d}  {size:5d}  {length:8d}  {a:13.1f}  {w:12.1f}  {w - a:7.1f}")

    def q(p: float) -> float:
        return added[min(len(added) - 1, int(p * len(added)))]

    print(
        f"added start delay: p50 {q(0.5):.1f} s, p95 {q(0.95):.1f} s, max {added[-1]:.1f} s; "
        f"idle node-time harvested: {trained_s / idle_s:.1%} "
        f"({trained_s:.0f} of {idle_s:.0f} node-s; alone the pool had {idle_alone:.0f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
