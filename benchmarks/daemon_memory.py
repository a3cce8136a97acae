"""The daemon's memory over a long run at a centre's size: does it stay flat?

    NNODES=256 scripts/slurm/local-cluster.sh start   # then export its SLURM_CONF
    python benchmarks/daemon_memory.py [--minutes 60] [--trainers 2] [--seed 1]

A real ``bftrainer daemon`` (poll every 2 s) watches the whole local cluster while a
seeded main workload comes and goes on it (jobs of 1 to 1/4 of the nodes, 1-3 minutes
each, one every 10-40 s) and ``--trainers`` small torchrun trainers of the example
(2 nodes each, resubmitted as they finish) train on what is idle. Every 30 s the
daemon's resident memory (VmRSS) is read from /proc. Printed: the RSS after the first 5
minutes, at the end and at most, and the slope of a least-squares line through the
second half (MB per hour): what a leak would show. Cleans up only what it started.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.bftrainer.daemon_service import Service  # noqa: E402
from tests.conftest import SlurmCluster  # noqa: E402

SAMPLE_EVERY_S = 30.0
ACTIVE = ("queued", "waiting", "running")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def slope_mb_per_h(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB), in MB per hour."""
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mm = sum(m for _, m in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return 3600 * sum((t - mt) * (m - mm) for t, m in samples) / var if var else 0.0


def cluster() -> SlurmCluster:
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        raise SystemExit("export SLURM_CONF of a local Slurm (docs/slurm-local.md)")
    env = {**os.environ, "SLURM_CONF": conf}
    out = subprocess.run(
        ["sinfo", "-N", "-h", "-p", "main", "-o", "%N"], capture_output=True, text=True, env=env
    )
    nodes = tuple(sorted(set(out.stdout.split()), key=lambda n: (len(n), n)))
    if not nodes:
        raise SystemExit(f"no nodes in partition main of {conf}: {out.stderr.strip()}")
    return SlurmCluster(Path(conf), nodes, False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--trainers", type=int, default=2, help="small trainers kept running")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the samples here (JSON)")
    args = ap.parse_args()
    slurm = cluster()
    rng = random.Random(args.seed)
    samples: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bftrainer-memory-") as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()
        service = Service(slurm, Path(tmp) / "state", logs)
        try:
            service.start(poll_s=2.0, lease_s=120.0)
            assert service.proc is not None
            pid = service.proc.pid
            t0 = time.monotonic()
            end = t0 + 60 * args.minutes
            next_sample = next_main = next_check = t0
            trainers: list[str] = []
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_sample:
                    samples.append((now - t0, rss_mb(pid)))
                    # One line each: a run cut short still tells what it saw.
                    print(f"rss {samples[-1][0]:.0f} s {samples[-1][1]:.1f} MB", flush=True)
                    next_sample += SAMPLE_EVERY_S
                if now >= next_main:
                    size = rng.randint(1, max(1, len(slurm.nodes) // 4))
                    job = slurm.sbatch(
                        "-p", "main", "-N", str(size), "-t", "4",
                        "--wrap", f"sleep {rng.randint(60, 180)}",
                    )  # fmt: skip
                    service.main_jobs.append(job)
                    next_main = now + rng.uniform(10, 40)
                if now >= next_check:  # status is a process of its own: not every loop
                    states = {t["id"]: t["state"] for t in service.status()["trainers"]}
                    trainers = [t for t in trainers if states.get(t) in ACTIVE]
                    while len(trainers) < args.trainers:
                        trainers.append(service.submit("torchrun", 200_000, 2))
                    next_check = now + 15.0
                if service.proc.poll() is not None:
                    raise SystemExit(f"the daemon exited ({service.proc.returncode}): {logs}")
                time.sleep(2.0)
            assert service.stop() == 0
        finally:
            service.cleanup()
    half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    row = {
        "nodes": len(slurm.nodes),
        "minutes": args.minutes,
        "samples": len(samples),
        "rss_at_5min_mb": next((m for t, m in samples if t >= 300), samples[-1][1]),
        "rss_end_mb": samples[-1][1],
        "rss_max_mb": max(m for _, m in samples),
        "slope_second_half_mb_per_h": slope_mb_per_h(half),
        "main_jobs": len(service.main_jobs),
        "load_average_1min": os.getloadavg()[0],
    }
    print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({**row, "rss_mb": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
