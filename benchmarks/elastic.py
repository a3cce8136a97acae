"""Elastic trainers: rescale latency per backend, and the runtime's per-step overhead.

Two measurements, one run:

* ``overhead``: the example's MLP (examples/train_mlp.py, batch 64, one torch thread) in
  a plain PyTorch loop (shuffled ids, fetch, forward, backward, SGD step) against the
  same loop run by :class:`ElasticRuntime` on one process with its default options
  (sampler plan, agent bookkeeping and gradient probe, learning rate per step, stop
  check, commits to disk, reports). Runs alternate; times are the process's CPU time
  (robust to other work on a shared machine), and each run length's fastest run over
  the repeats is kept (other work only adds time). Goal: <= 2%.
* ``rescale``: the example under the real launcher on local hosts; the host list is
  changed (1 -> 2 grow, then 2 -> 1 shrink) and the latency is from the moment
  ``hosts`` was rewritten to the reset record of the new size (the workers then take
  their first step at it). Median of ``--runs`` runs per backend.

* ``instructions`` (only when asked): the same two loops' instructions per step,
  counted by valgrind, which no other work on the machine changes.

    python benchmarks/elastic.py [--runs 3] [--backends torchrun,horovod]
                                 [--only overhead|instructions|rescale]

Writes benchmarks/results/elastic.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bftrainer.trainers import channel
from bftrainer.trainers.comm import SingleComm
from bftrainer.trainers.launch.base import Launcher, LaunchSpec
from bftrainer.trainers.runtime import ElasticRuntime, RuntimeOptions

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_mlp.py"
GOAL_RATIO = 0.02
BATCH = 64


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _setup(ex: Any, samples: int) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x, y = ex.synthetic_data(samples, 32, 10, 0)
    model = ex.build_model(32, 64, 10)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), x, y


def _fetch_fn(x: torch.Tensor, y: torch.Tensor) -> Any:
    """The user's fetch, the same in both loops: numpy ids to a batch."""

    def fetch(ids: Any) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(ids)
        return x[idx], y[idx]

    return fetch


def _loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


def plain_run(ex: Any, steps: int, samples: int) -> float:
    """CPU seconds of ``steps`` steps of the plain loop (same fetch and loss)."""
    model, opt, x, y = _setup(ex, samples)
    fetch = _fetch_fn(x, y)
    rng = np.random.default_rng(0)
    order = rng.permutation(samples)
    t0 = time.process_time()
    pos = 0
    for _ in range(steps):
        if pos + BATCH > samples:
            order, pos = rng.permutation(samples), 0
        ids = order[pos : pos + BATCH]
        pos += BATCH
        opt.zero_grad(set_to_none=False)
        _loss(model, fetch(ids)).backward()
        opt.step()
    return time.process_time() - t0


def runtime_run(ex: Any, steps: int, samples: int, trainer_dir: Path) -> float:
    """CPU seconds of ``steps`` steps of the same loop under ElasticRuntime (one
    process), including its start (first configuration) and end (final report)."""
    model, opt, x, y = _setup(ex, samples)
    for f in trainer_dir.glob("*"):
        f.unlink()
    opts = RuntimeOptions(work_samples=steps * BATCH, trainer_dir=str(trainer_dir))
    rt = ElasticRuntime(
        opts, model, opt, x, _loss, fetch=_fetch_fn(x, y), comm=SingleComm(), script="bench"
    )
    t0 = time.process_time()
    result = rt.run()
    elapsed = time.process_time() - t0
    assert result is not None and result["steps"] == steps
    return elapsed


def overhead(steps: int, repeats: int) -> dict[str, Any]:
    """Per-step cost from runs of ``steps`` and ``3 x steps`` steps: the difference
    cancels what a run pays once (the runtime's start and final report).

    Other work on the machine only adds time to a run, never removes it, so each
    length's fastest run over the repeats (loops alternating) is the estimate least
    disturbed by it; the medians are reported beside it.
    """
    torch.set_num_threads(1)
    ex = _example()
    samples = 8192
    runs: dict[str, list[float]] = {"p1": [], "p3": [], "r1": [], "r3": []}
    with tempfile.TemporaryDirectory() as d:
        plain_run(ex, 200, samples)  # warm up
        runtime_run(ex, 200, samples, Path(d))
        for _ in range(repeats):
            runs["p1"].append(plain_run(ex, steps, samples))
            runs["r1"].append(runtime_run(ex, steps, samples, Path(d)))
            runs["p3"].append(plain_run(ex, 3 * steps, samples))
            runs["r3"].append(runtime_run(ex, 3 * steps, samples, Path(d)))

    def per_step(pick: Callable[[list[float]], float]) -> tuple[float, float, float]:
        p1, p3, r1, r3 = (pick(runs[k]) for k in ("p1", "p3", "r1", "r3"))
        plain, rt = (p3 - p1) / (2 * steps), (r3 - r1) / (2 * steps)
        return plain, rt, r1 - steps * rt - (p1 - steps * plain)

    plain, rt, fixed = per_step(min)
    plain_med, rt_med, _ = per_step(statistics.median)
    return {
        "steps": [steps, 3 * steps],
        "repeats": repeats,
        "plain_step_ms": plain * 1e3,
        "runtime_step_ms": rt * 1e3,
        "overhead_ratio": (rt - plain) / plain,
        "overhead_ratio_of_medians": (rt_med - plain_med) / plain_med,
        "runtime_once_per_run_ms": fixed * 1e3,
        "goal_ratio": GOAL_RATIO,
        "met": (rt - plain) / plain <= GOAL_RATIO,
    }


def _one_run(loop: str, steps: int) -> None:
    """One run of one loop, for :func:`instructions` (a process of its own)."""
    torch.set_num_threads(1)
    ex = _example()
    if loop == "plain":
        plain_run(ex, steps, 8192)
        return
    with tempfile.TemporaryDirectory() as d:
        # Under valgrind time runs about 50x slower: commits and reports by time would
        # come 50x more often per step. They are left out (their cost is the time runs').
        opts = RuntimeOptions(
            work_samples=steps * BATCH, trainer_dir=d, commit_every_s=1e9, report_every_s=1e9
        )
        model, opt, x, y = _setup(ex, 8192)
        rt = ElasticRuntime(
            opts, model, opt, x, _loss, fetch=_fetch_fn(x, y), comm=SingleComm(), script="b"
        )
        rt.run()


def instructions(steps: int) -> dict[str, Any]:
    """Instructions per step of each loop, counted by valgrind (cachegrind): unlike
    CPU time, the same in every run whatever else the machine does. Four runs in
    parallel (each loop at ``steps`` and ``3 x steps``; about 10 min on 2 cores)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return {"skipped": "valgrind is not installed"}
    procs = {}
    for loop in ("plain", "runtime"):
        for n in (steps, 3 * steps):
            argv = [valgrind, "--tool=cachegrind", "--cache-sim=no"]
            argv += ["--cachegrind-out-file=/dev/null", sys.executable, __file__]
            argv += ["--one-run", loop, str(n)]
            procs[loop, n] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
    counts = {}
    for key, proc in procs.items():
        _, err = proc.communicate()
        match = re.search(rb"I\s+refs:\s+([\d,]+)", err)
        if proc.returncode != 0 or match is None:
            raise RuntimeError(f"valgrind run {key} failed: {err[-500:]!r}")
        counts[key] = int(match.group(1).replace(b",", b""))
    per_step = {
        loop: (counts[loop, 3 * steps] - counts[loop, steps]) / (2 * steps)
        for loop in ("plain", "runtime")
    }
    ratio = (per_step["runtime"] - per_step["plain"]) / per_step["plain"]
    return {
        "steps": [steps, 3 * steps],
        "plain_instructions_per_step": per_step["plain"],
        "runtime_instructions_per_step": per_step["runtime"],
        "overhead_ratio": ratio,
        "goal_ratio": GOAL_RATIO,
        "met": ratio <= GOAL_RATIO,
    }


def _reset_after(d: Path, nodes: int, t: float, timeout_s: float = 180) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records, _ = channel.read_metrics(d, 0)
        for r in records:
            if r.get("kind") == "reset" and r["nodes"] == nodes and r["time_s"] >= t:
                return float(r["time_s"]) - t
        time.sleep(0.1)
    raise TimeoutError(f"{d}: no reset to {nodes} node(s) within {timeout_s} s")


def _wait_commit_after(d: Path, t: float, timeout_s: float = 120) -> None:
    """A checkpoint written after ``t`` (the workers run at the new size)."""
    path = d / channel.CHECKPOINT
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime > t:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{d}: no commit after the rescale")


def rescale(backend: str, runs: int) -> dict[str, Any]:
    grow, shrink, start = [], [], []
    hosts = ["localhost", "127.0.0.1"]
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "t"
            spec = LaunchSpec(
                trainer_id=f"bench{i}",
                script=EXAMPLE,
                args=(
                    "--work-samples",
                    "100000000",
                    "--commit-every-s",
                    "1",
                    "--step-delay-s",
                    "0.005",
                ),
                trainer_dir=d,
                backend=backend,
                n_max=2,
                python=sys.executable,
            )
            t0 = time.time()
            launcher = Launcher.start(spec, hosts[:1])
            try:
                start.append(_reset_after(d, 1, t0))
                _wait_commit_after(d, time.time())
                t = time.time()
                launcher.set_hosts(hosts)
                grow.append(_reset_after(d, 2, t))
                _wait_commit_after(d, time.time())
                t = time.time()
                launcher.set_hosts(hosts[:1])
                shrink.append(_reset_after(d, 1, t))
                _wait_commit_after(d, time.time())
                launcher.stop(grace_s=30)
            finally:
                launcher.kill()
        print(
            f"{backend} run {i}: start {start[-1]:.1f} s, grow {grow[-1]:.1f} s, "
            f"shrink {shrink[-1]:.1f} s",
            file=sys.stderr,
        )
    return {
        "runs": runs,
        "start_s": start,
        "grow_s": grow,
        "shrink_s": shrink,
        "median_start_s": statistics.median(start),
        "median_grow_s": statistics.median(grow),
        "median_shrink_s": statistics.median(shrink),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--backends", default="torchrun,horovod")
    parser.add_argument("--only", choices=["overhead", "instructions", "rescale"])
    parser.add_argument("--one-run", nargs=2, metavar=("LOOP", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run:
        _one_run(args.one_run[0], int(args.one_run[1]))
        return
    out: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count()}
    out["load_avg_before"] = os.getloadavg()
    if args.only in (None, "overhead"):
        out["overhead"] = overhead(args.steps, args.repeats)
        print(json.dumps(out["overhead"]), file=sys.stderr)
    if args.only == "instructions":  # about 10 min: only when asked
        out["instructions"] = instructions(100)
        print(json.dumps(out["instructions"]), file=sys.stderr)
    if args.only in (None, "rescale"):
        out["rescale"] = {b: rescale(b, args.runs) for b in args.backends.split(",")}
    out["load_avg_after"] = os.getloadavg()
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "elastic.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
