"""The randomized soak of the live service, long: several seeds on the real local Slurm.

    python benchmarks/soak.py --seeds 1,2,3 --duration 1200 --down 120

Each seed draws its own schedule of submits, cancels, main jobs and faults (holders
cancelled by hand, the daemon killed -9, stopped or down for ``--down`` seconds while main
jobs preempt its nodes, supervisors killed -9; tests/bftrainer/soak.py), runs it against a
real daemon with real trainers, and checks the invariants a centre relies on. Printed per
seed and in total: events, trainers, main jobs, faults injected, invariant violations,
and the main jobs' start delay (p50, p95, max). Needs root (to start the local Slurm,
scripts/slurm/local-cluster.sh) or a running one, and Horovod (make horovod).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.bftrainer.daemon_service import Service  # noqa: E402
from tests.bftrainer.soak import Report, Soak, replay_command, schedule  # noqa: E402
from tests.conftest import CLUSTER_SCRIPT, SlurmCluster  # noqa: E402


def cluster() -> tuple[SlurmCluster, bool]:
    """The running local cluster, or one started here (and to be stopped)."""
    status = subprocess.run(["bash", str(CLUSTER_SCRIPT), "status"], capture_output=True, text=True)
    started = status.returncode != 0
    out = status.stdout
    if started:
        done = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True
        )
        if done.returncode != 0:
            sys.exit(f"soak: cannot start the local Slurm: {done.stderr.strip()[-500:]}")
        out = done.stdout
    conf = Path(out.strip().splitlines()[-1].split("=", 1)[1])
    return SlurmCluster(conf, tuple(f"node{i}" for i in range(1, 9)), started), started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    ap.add_argument("--duration", type=float, default=1200.0, help="seconds of events a seed")
    ap.add_argument("--down", type=float, default=120.0, help="seconds the daemon is down")
    ap.add_argument("--poll", type=float, default=2.0, help="the daemon's --poll-interval")
    ap.add_argument("--lease", type=float, default=60.0, help="the holders' lease, seconds")
    ap.add_argument("--json", type=Path, help="also write the reports here")
    ap.add_argument(
        "--keep",
        type=Path,
        help="keep each seed's state directory and logs in KEEP/seed-N (default: a "
        "temporary directory, deleted), to read why a seed failed",
    )
    args = ap.parse_args()
    slurm, started = cluster()
    reports: list[Report] = []
    try:
        for seed in (int(s) for s in args.seeds.split(",")):
            slurm.reset()
            with contextlib.ExitStack() as stack:
                if args.keep is None:
                    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
                else:
                    tmp = args.keep / f"seed-{seed}"
                    shutil.rmtree(tmp, ignore_errors=True)
                logs = tmp / "logs"
                logs.mkdir(parents=True)
                service = Service(slurm, tmp / "state", logs)
                actions = schedule(seed, args.duration, len(slurm.nodes), args.down)
                try:
                    report = Soak(service, seed, actions).run(args.poll, args.lease)
                finally:
                    service.cleanup()
                reports.append(report)
                print(report.summary(), report.by_kind, flush=True)
                for v in report.violations:
                    print(f"  violation: {v}")
                if report.violations:
                    print(f"  replay: {replay_command(seed, args.duration, args.down)}")
    finally:
        slurm.reset()
        if started:
            subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True)
    total = Report.total(reports)
    print("total:", total.summary().split(": ", 1)[1])
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in reports], indent=1))
    return 1 if total.violations else 0


if __name__ == "__main__":
    sys.exit(main())
