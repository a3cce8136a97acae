"""The seeded soak of centre mode: several real Unix accounts on one allocator, long.

    python benchmarks/centre_soak.py --seeds 1 --duration 900 --users 3 --down 45

Each seed makes ``--users`` Unix accounts (deleted at the end, with whatever they left),
starts the centre's allocator as root and draws its own schedule of each user's submits
and cancels, requests about another user's trainer (each must be refused), main jobs, and
faults (the allocator killed -9, or down for ``--down`` seconds while a main job takes
its nodes; an agent killed -9, back after 2 s or after more than its lease);
tests/bftrainer/centre_soak.py says what is checked. Printed per seed and in total:
events, faults by kind, trainers, main jobs, cross-user requests tried and accepted,
trainer processes checked by uid, holder jobs checked by user, invariant violations, and
the main jobs' start delay (p50, p95, max). Needs root (accounts, and to start the local
Slurm, scripts/slurm/local-cluster.sh, unless one runs).
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

from benchmarks.soak import cluster  # noqa: E402
from tests.bftrainer.centre_service import (  # noqa: E402
    NoAccounts,
    accounts,
    centre_on,
    python_for_all,
)
from tests.bftrainer.centre_soak import (  # noqa: E402
    FAULTS,
    CentreReport,
    CentreSoak,
    replay_command,
    schedule,
)
from tests.conftest import CLUSTER_SCRIPT  # noqa: E402

# The allocator's configuration: fair by user, curves re-decided every 30 s, agents
# withdrawn after 30 s of silence (an agent killed and back after 45 s passes it).
CONFIG = (
    '[policy]\nobjective = "speedup"\nfair_by = "user"\nfairness_p = -1.0\n'
    "fair_share_speedup = true\nredecide_every_s = 30.0\n"
    "[daemon]\nsync_every_s = 1.0\nagent_lease_s = 30.0\n"
    "holder_lease_s = 120.0\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1", help="comma-separated seeds (default 1)")
    ap.add_argument("--duration", type=float, default=900.0, help="seconds of events a seed")
    ap.add_argument("--users", type=int, default=3, choices=(2, 3, 4), help="Unix accounts")
    ap.add_argument("--down", type=float, default=45.0, help="seconds the allocator is down")
    ap.add_argument("--drain", type=float, default=600.0, help="seconds for trainers to end")
    ap.add_argument("--json", type=Path, help="also write the reports here")
    ap.add_argument(
        "--keep",
        type=Path,
        help="keep each seed's allocator logs and the users' agent logs in KEEP/seed-N "
        "(default: a temporary directory, deleted), to read why a seed failed",
    )
    args = ap.parse_args()
    slurm, started = cluster()
    reports: list[CentreReport] = []
    try:
        with python_for_all() as python:
            for seed in (int(s) for s in args.seeds.split(",")):
                slurm.reset()
                with contextlib.ExitStack() as stack:
                    if args.keep is None:
                        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                    else:
                        logs = args.keep / f"seed-{seed}"
                        shutil.rmtree(logs, ignore_errors=True)
                        logs.mkdir(parents=True)
                    users = stack.enter_context(accounts(slurm, args.users))
                    centre = stack.enter_context(centre_on(slurm, users, python, logs))
                    centre.config = CONFIG
                    actions = schedule(seed, args.duration, args.users, 8, args.down)
                    soak = CentreSoak(centre, users, seed, actions)
                    try:
                        report = soak.run(args.drain)
                    finally:
                        for user in users:  # before the accounts go
                            agent_log = user.state_dir / "agent.log"
                            if agent_log.exists():
                                shutil.copyfile(agent_log, logs / f"agent-{user.name}.log")
                reports.append(report)
                print(report.summary(), report.by_kind, report.refusals, flush=True)
                if report.violations:
                    print(f"  replay: {replay_command(seed, args.duration, args.users, args.down)}")
    except NoAccounts as exc:
        sys.exit(f"centre_soak: {exc}")
    finally:
        slurm.reset()
        if started:
            subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True)
    total = CentreReport.total(reports, users=args.users)
    faults = {k: n for k, n in total.by_kind.items() if k in FAULTS}
    print("total:", total.summary().split(": ", 1)[1], "; faults by kind:", faults)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in reports], indent=1))
    return 1 if total.violations else 0


if __name__ == "__main__":
    sys.exit(main())
