"""Decision latency of the core loop: pool change seen -> node sets handed to the driver.

30 trainers (Table 2 curves cycled, n_min 1, n_max 64, the paper's costs) on 800 nodes,
placed by a first decision; then pool changes every 60 s of virtual time, each with 5%
of the pool leaving (some of them held by trainers: preemptions) and as many joining.
The loop runs as in the daemon but on a virtual clock, with the simulated driver; the
latency is the loop's own ``Step.latency_s`` (inputs seen -> the last ``rescale``
returned), so it includes the policy's solve, preemptions, the mapping and the hand-off.
Reports median, p95 and max per solver (wall, and CPU time of the deciding step, which a
loaded machine does not inflate), the part spent outside the solver, and the goal
(< 100 ms at 30 x 800, at the median and the p95) as JSON (benchmarks/results/), as
``allocator.py`` does.

    python benchmarks/decision_latency.py [--size 30x800] [--events 50] [--solvers highs,dp]
                                          [--slots-per-node 6]

``--slots-per-node S`` (S > 1): the same nodes with S slots each; the jobs' curves and
limits count slots (``jobs_in_slots``: n_min 1 slot, n_max 64 x S), and the status
says whether each answer is proven ``optimal`` or ``bounded`` (docs/allocator.md, "Slots").
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bftrainer.idle_monitor.events import PoolEvent
from bftrainer.loop import (
    Arrival,
    Input,
    Loop,
    LoopState,
    PoolChange,
    Step,
    TimedSource,
    VirtualClock,
)
from bftrainer.loop.jobs import JobSpec, jobs_in_slots
from bftrainer.policies.config import Config
from bftrainer.policies.registry import make_policy
from bftrainer.replay.simulator import SimulatedDriver
from bftrainer.replay.zoo import ZOO_SPS, zoo_curve

GOAL_MS = 100.0


class Steps:
    def __init__(self) -> None:
        self.steps: list[Step] = []

    def interval(self, t0_s: float, t1_s: float, pool_nodes: int, processed: float) -> None:
        pass

    def step(self, step: Step) -> None:
        self.steps.append(step)


def script(
    trainers: int, nodes: int, events: int, seed: int, slots: int = 1
) -> tuple[tuple[str, ...], list]:
    rng = np.random.default_rng(seed)
    models = list(ZOO_SPS)
    items: list[tuple[float, Input]] = []
    for j in range(trainers):
        job = JobSpec(
            id=f"t{j}",
            model=models[j % len(models)],
            submit_s=0.0,
            n_min=1,
            n_max=64,
            rescale_up_s=float(rng.uniform(17, 19)),
            rescale_down_s=float(rng.uniform(11, 13)),
            work_samples=1e15,
            curve=zoo_curve(models[j % len(models)]),
        )
        items.append((0.0, Arrival(jobs_in_slots([job], slots)[0])))
    pool = [f"n{i:05d}" for i in range(nodes)]
    spare = [f"s{i:05d}" for i in range(nodes)]
    k = max(1, nodes // 20)
    for e in range(events):
        t = 60.0 * (e + 1)
        out = set(rng.choice(pool, size=k, replace=False).tolist())
        back = rng.choice(spare, size=k, replace=False).tolist()
        pool = [n for n in pool if n not in out] + back
        spare = [n for n in spare if n not in back] + sorted(out)
        items.append((t, PoolChange(PoolEvent(t, joined=frozenset(back), left=frozenset(out)))))
    return tuple(f"n{i:05d}" for i in range(nodes)), items


def measure(
    trainers: int, nodes: int, events: int, solver: str, seed: int, slots: int = 1
) -> dict[str, Any]:
    pool, items = script(trainers, nodes, events, seed, slots)
    obs = Steps()
    source = TimedSource(items)
    config = Config(policy="milp", solver=solver, max_trainers=trainers, slots_per_node=slots)
    loop = Loop(
        [source],
        SimulatedDriver(slots),
        VirtualClock(0.0),
        config,
        policy=make_policy(config),
        observer=obs,
        state=LoopState(now_s=0.0, pool=pool),
    )
    cpu: list[float] = []  # CPU seconds of each step that decided (wall time is noisy)
    until = 60.0 * (events + 1)
    while loop.now_s < until:
        c0 = time.process_time()
        step = loop.step(until_s=until)
        if step is not None and step.decided and step.time_s > 0:
            cpu.append(time.process_time() - c0)
    decided = [s for s in obs.steps if s.decided and s.time_s > 0]  # not the first placement
    lat = sorted(s.latency_s for s in decided)
    outside = [s.latency_s - s.solve_s for s in decided]
    cpu.sort()
    return {
        "decisions": len(decided),
        "share_with_preemption": statistics.fmean(
            1.0 if s.preemption_cost_samples else 0.0 for s in decided
        ),
        "median_ms": 1e3 * statistics.median(lat),
        "p95_ms": 1e3 * lat[int(0.95 * (len(lat) - 1))],
        "max_ms": 1e3 * lat[-1],
        "median_solve_ms": 1e3 * statistics.median(s.solve_s for s in decided),
        "median_outside_solver_ms": 1e3 * statistics.median(outside),
        "median_cpu_ms": 1e3 * statistics.median(cpu),
        "p95_cpu_ms": 1e3 * cpu[int(0.95 * (len(cpu) - 1))],
        "statuses": {k: sum(s.status == k for s in decided) for k in {s.status for s in decided}},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="30x800")
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--solvers", default="highs,dp")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slots-per-node", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/decision_latency.json"))
    args = ap.parse_args()
    trainers, nodes = map(int, args.size.split("x"))
    results: dict[str, Any] = {
        "machine": platform.platform(),
        "size": args.size,
        "events": args.events,
        "slots_per_node": args.slots_per_node,
        "solvers": {},
    }
    for solver in args.solvers.split(","):
        row = measure(trainers, nodes, args.events, solver, args.seed, args.slots_per_node)
        row["goal_ms"] = {
            "goal": GOAL_MS,
            "measured_median_wall": row["median_ms"],
            "measured_median_cpu": row["median_cpu_ms"],
            "met_cpu": row["median_cpu_ms"] <= GOAL_MS,
            "met_wall": row["median_ms"] <= GOAL_MS,
            # The goal holds for a decision, so the tail too (issue 22: the p95 with slots).
            "met_p95_cpu": row["p95_cpu_ms"] <= GOAL_MS,
            "met_p95_wall": row["p95_ms"] <= GOAL_MS,
        }
        results["solvers"][solver] = row
        print(args.size, solver, json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
