"""What one preemption of a trainer's node costs the main job, and why.

    python benchmarks/preempt_probe.py [--backend torchrun|horovod] [--probes 12] [--seed 1]

On the local 8-node Slurm, a daemon runs one trainer over every node. Each probe submits
a one-node main job on a random node at a random moment (so some land while the trainer
is rescaling or restarting) and times, every 0.05 s, its submission -> RUNNING. The same
probes on idle nodes first give the floor, Slurm's own start latency. Printed: each
probe's delay and the trainer's state at that moment, then p50, p95, max with and
without the trainer: the difference is what bftrainer adds per preemption. Needs root
(to start the local Slurm) or a running one.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.soak import cluster  # noqa: E402
from tests.bftrainer.daemon_service import Service  # noqa: E402
from tests.conftest import CLUSTER_SCRIPT, SlurmCluster  # noqa: E402

NODES = 8


def probe(slurm: SlurmCluster, node: str, seconds: int = 5) -> float:
    """Submission -> RUNNING of a one-node main job on ``node`` (s); waits for its end."""
    t0 = time.time()
    job = slurm.sbatch("-p", "main", "-N", "1", "-w", node, "-t", "1", "--wrap", f"sleep {seconds}")
    while slurm.run(["squeue", "-h", "-j", job, "-o", "%T"], False).strip() != "RUNNING":
        if time.time() - t0 > 120:
            return float("inf")
        time.sleep(0.05)
    delay = time.time() - t0
    while slurm.run(["squeue", "-h", "-j", job, "-o", "%T"], False).strip():
        time.sleep(0.5)
    return delay


def quantiles(xs: list[float]) -> str:
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    return f"p50 {q(0.5):.2f} s, p95 {q(0.95):.2f} s, max {xs[-1]:.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("torchrun", "horovod"), default="torchrun")
    ap.add_argument("--probes", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--poll", type=float, default=2.0, help="the daemon's --poll-interval")
    ap.add_argument("--keep", type=Path, help="keep the daemon's state and logs here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    plan = [(f"node{rng.randint(1, NODES)}", rng.uniform(2, 40)) for _ in range(args.probes)]
    slurm, started_here = cluster()
    floor: list[float] = []
    rows: list[tuple[str, float, str, float]] = []
    try:
        slurm.reset()
        for node, _ in plan:
            floor.append(probe(slurm, node))
        with tempfile.TemporaryDirectory(prefix="bftrainer-probe-") as scratch:
            tmp = args.keep or Path(scratch)
            logs = tmp / "logs"
            logs.mkdir(parents=True)
            service = Service(slurm, tmp / "state", logs)
            try:
                service.start("equal", poll_s=args.poll)
                trainer = service.submit(args.backend, 100_000_000, NODES, "--step-delay-s", "0.05")
                time.sleep(45)
                for node, wait_s in plan:
                    time.sleep(wait_s)
                    t = service.trainer(trainer)
                    state = f"{t['state']} on {len(t['nodes'])}"
                    held = node in t["nodes"]
                    rows.append(
                        (
                            node,
                            wait_s,
                            state + ("" if held else f", {node} not its"),
                            probe(slurm, node),
                        )
                    )
                service.cli("cancel", trainer)
                service.stop()
            finally:
                service.cleanup()
    finally:
        slurm.reset()
        if started_here:
            subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True)
    print(f"{args.probes} probes, {args.backend} trainer on {NODES} nodes, seed {args.seed}")
    print("node   after_s  trainer           floor_s  delay_s")
    for (node, wait_s, state, delay), f in zip(rows, floor, strict=True):
        print(f"{node:6} {wait_s:7.1f}  {state:16}  {f:7.2f}  {delay:7.2f}")
    on_trainer = [d for (_, _, s, d) in rows if "not its" not in s]
    print(f"floor (no holder):          {quantiles(floor)}")
    print(f"node held by the trainer:   {quantiles(on_trainer)} ({len(on_trainer)} probes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
