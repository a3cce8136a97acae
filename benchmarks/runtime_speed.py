"""The elastic runtime's speed against plain PyTorch, as three ratios measured in one run.

1. ``runtime/plain``: one process, at each of ``--batches``: ``ElasticRuntime`` (fixed
   batch) against a plain loop (``zero_grad``, forward, ``backward``, ``step``) on the
   same model and data, samples/s over whole runs (the runtime's start included). Both
   sides write no checkpoint (``--no-checkpoint``: the same policy on both sides) and
   shuffle on the device. Both run the real step before the runs are sized.
2. ``runtime/DDP``: ``--procs`` processes (default: every GPU, else 2), the same global
   batch: the runtime under a torch.distributed group (gloo on the CPU, NCCL on GPUs)
   against ``DistributedDataParallel`` on the same group.
3. ``defaults/best fixed``: one process, a task whose gradient noise is far above the
   base batch (noisy labels): the runtime with its defaults (base batch 64, re-tuning
   between rescales, a checkpoint every 10 s) against the plain loop at the best of a
   range of fixed batches; also the batch the agent settles on, the epoch it first left
   the base batch, the runtime's samples/s over its last third against the plain loop's
   at that batch, and the share of the run its commits and re-tunes took.

Runs alternate (plain, runtime, ...) over ``--rounds`` rounds, and each ratio is the
median of the rounds' ratios, so drift on a shared machine hits both sides alike.
Goals (issue 41): on the CPU, runtime/plain >= 0.98 at batch 64, runtime/DDP >= 1.00,
commits and re-tunes <= 1% of the run; on a GPU, runtime/plain and runtime/DDP >= 0.95
and the defaults >= 0.8 of the best fixed batch.

    python benchmarks/runtime_speed.py [--device auto|cpu|cuda] [--rounds 3]
        [--batches 64,256,1024] [--procs N] [--only plain,ddp,defaults] [--json out.json]
        [--tiny]   # the smallest sizes: a dry run of the script (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bftrainer.trainers import channel
from bftrainer.trainers.comm import SingleComm, TorchDistComm
from bftrainer.trainers.device import select_device
from bftrainer.trainers.runtime import ElasticRuntime, RuntimeOptions

GOAL = 0.95
GOAL_END_OF_RUN = 0.8
TINY = {"features": 8, "hidden": 16, "layers": 1, "classes": 4, "samples": 2048}
FIXED_BATCHES = (64, 128, 256, 512, 1024)


def sizes(device: torch.device) -> dict[str, int]:
    """The issue's MLP on a GPU (9.6 M parameters); a smaller one on these CPUs."""
    if device.type == "cuda":
        return {"features": 512, "hidden": 2048, "layers": 3, "classes": 100, "samples": 65536}
    return {"features": 64, "hidden": 256, "layers": 2, "classes": 10, "samples": 16384}


def make_model(s: dict[str, int], device: torch.device, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = s["features"]
    for _ in range(s["layers"]):
        layers += [nn.Linear(width, s["hidden"]), nn.ReLU()]
        width = s["hidden"]
    layers.append(nn.Linear(width, s["classes"]))
    return nn.Sequential(*layers).to(device)


def make_data(
    s: dict[str, int], device: torch.device, label_noise: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(s["samples"], s["features"], generator=g)
    teacher = torch.randn(s["features"], s["classes"], generator=g)
    y = (x @ teacher).argmax(dim=1)
    noisy = torch.rand(s["samples"], generator=g) < label_noise
    y[noisy] = torch.randint(0, s["classes"], (int(noisy.sum()),), generator=g)
    return x.to(device), y.to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(
    s: dict[str, int], device: torch.device, batch: int, samples: int, data: Any = None
) -> float:
    """Samples/s of the plain loop: shuffled mini-batches of ``batch``."""
    model = make_model(s, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = data if data is not None else make_data(s, device)
    n = len(x)
    steps = max(1, samples // batch)
    synchronize(device)
    t0 = time.perf_counter()
    order = torch.randperm(n, device=device)
    pos = 0
    for _ in range(steps):
        if pos + batch > n:
            order, pos = torch.randperm(n, device=device), 0
        idx = order[pos : pos + batch]
        pos += batch
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    synchronize(device)
    return steps * batch / (time.perf_counter() - t0)


def runtime_run(
    s: dict[str, int],
    device: torch.device,
    options: dict[str, Any],
    comm: Any = None,
    data: Any = None,
) -> tuple[float, dict[str, Any], Path]:
    """Samples/s of one whole ``ElasticRuntime.run``, its result, and its directory."""
    model = make_model(s, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = data if data is not None else make_data(s, device)
    trainer_dir = Path(options.pop("trainer_dir", None) or tempfile.mkdtemp(prefix="rt-speed-"))

    def fetch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[idx], y[idx]  # ids on the device: nothing from the host per step

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    opts = RuntimeOptions(trainer_dir=str(trainer_dir), trainer_id="speed", **options)
    runtime = ElasticRuntime(
        opts,
        model,
        optimizer,
        x,
        loss_fn,
        fetch=fetch,
        comm=comm or SingleComm(),
        script="speed",
        device_ids=True,
    )
    synchronize(device)
    t0 = time.perf_counter()
    result = runtime.run()
    synchronize(device)
    elapsed_s = time.perf_counter() - t0
    assert result is not None
    result = {**result, "overhead_s": dict(runtime.overhead_s), "elapsed_s": elapsed_s}
    return result["samples"] / elapsed_s, result, trainer_dir


def fixed(batch: int, samples: int) -> dict[str, Any]:
    """Options for a runtime that runs ``batch`` and nothing else."""
    return {
        "work_samples": samples,
        "base_batch": batch,
        "max_batch": batch,
        "max_local_batch": batch,
        "commit_every_s": 1e9,
        "report_every_s": 1e9,
        "checkpoint": False,  # the plain loop writes none either
    }


# -- 1. one process -------------------------------------------------------------------
def one_process(
    s: dict[str, int], device: torch.device, rounds: int, batch: int, seconds: float
) -> dict[str, Any]:
    data = make_data(s, device)
    # Warm-up: the real steps of both sides first (imports, the first cuBLAS call, lazy
    # kernel loads, the allocator's pools), then a warm run to size the measured ones.
    plain_loop(s, device, batch, batch * 20, data)
    runtime_run(s, device, fixed(batch, batch * 20), data=data)
    probe = plain_loop(s, device, batch, batch * 20, data)
    samples = max(batch * 5, int(probe * seconds))
    ratios, plain, rt = [], [], []
    for _ in range(rounds):
        p = plain_loop(s, device, batch, samples, data)
        r, _, _ = runtime_run(s, device, fixed(batch, samples), data=data)
        plain.append(p)
        rt.append(r)
        ratios.append(r / p)
    return {
        "batch": batch,
        "plain_sps": statistics.median(plain),
        "runtime_sps": statistics.median(rt),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }


# -- 2. two processes ---------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ddp_loop(s: dict[str, int], device: torch.device, batch: int, samples: int) -> float:
    rank, size = dist.get_rank(), dist.get_world_size()
    model = make_model(s, device)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x, y = make_data(s, device)
    n, local = len(x), batch // size
    steps = max(1, samples // batch)
    g = torch.Generator(device=device).manual_seed(0)
    dist.barrier()
    synchronize(device)
    t0 = time.perf_counter()
    order = torch.randperm(n, device=device, generator=g)
    pos = 0
    for _ in range(steps):
        if pos + batch > n:
            order, pos = torch.randperm(n, device=device, generator=g), 0
        idx = order[pos + rank * local : pos + (rank + 1) * local]
        pos += batch
        loss = nn.functional.cross_entropy(ddp(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    synchronize(device)
    dist.barrier()
    return steps * batch / (time.perf_counter() - t0)


def _worker(rank: int, args: dict[str, Any], out: Any) -> None:
    n = str(args["procs"])
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": n, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": n}
    )
    torch.set_num_threads(1)
    device = select_device(args["device"])
    s = args["sizes"]
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    for r in range(args["rounds"]):
        for kind in ("ddp", "runtime"):
            init = f"tcp://127.0.0.1:{args['ports'][2 * r + (kind == 'runtime')]}"
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=args["procs"])
            if kind == "ddp":
                sps = _ddp_loop(s, device, args["batch"], args["samples"])
                dist.destroy_process_group()
            else:
                options = {**fixed(args["batch"], args["samples"]), "trainer_dir": args["dirs"][r]}
                sps, _, _ = runtime_run(s, device, options, comm=TorchDistComm(device))
            if rank == 0:
                out.put((r, kind, sps))


def n_processes(
    s: dict[str, int],
    device: torch.device,
    procs: int,
    rounds: int,
    batch: int,
    seconds: float,
    one_sps: float,
) -> dict[str, Any]:
    # N processes: about the one-process rate (N cores or N GPUs, N times the batch).
    samples = max(batch * 20, int(one_sps * seconds))
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    args = {
        "device": str(device.type),
        "procs": procs,
        "sizes": s,
        "rounds": rounds,
        "batch": batch,
        "samples": samples,
        "ports": [_free_port() for _ in range(2 * rounds)],
        "dirs": [tempfile.mkdtemp(prefix="rt-speed-2-") for _ in range(rounds)],
    }
    mp.start_processes(_worker, args=(args, out), nprocs=procs, join=True, start_method="spawn")
    got: dict[tuple[int, str], float] = {}
    while not out.empty():
        r, kind, sps = out.get()
        got[(r, kind)] = sps
    ratios = [got[(r, "runtime")] / got[(r, "ddp")] for r in range(rounds)]
    return {
        "procs": procs,
        "global_batch": batch,
        "ddp_sps": statistics.median(got[(r, "ddp")] for r in range(rounds)),
        "runtime_sps": statistics.median(got[(r, "runtime")] for r in range(rounds)),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }


# -- 3. defaults against the best fixed batch ----------------------------------------
def defaults_vs_fixed(s: dict[str, int], device: torch.device, epochs: int) -> dict[str, Any]:
    data = make_data(s, device, label_noise=0.5)
    samples = epochs * s["samples"]
    # The runtime's defaults (commits every 10 s: the first re-tune comes at the first
    # commit); metrics every second only to time the last third of the run.
    options = {"work_epochs": epochs, "report_every_s": 1.0}
    sps, result, trainer_dir = runtime_run(s, device, options, data=data)
    records, _ = channel.read_metrics(trainer_dir)
    configs = [r for r in records if r["kind"] == "reset"]
    first_move = next((r for r in configs if r["batch_size"] != configs[0]["batch_size"]), None)
    metrics = [(r["time_s"], r["samples_done"]) for r in records if r["kind"] == "metrics"]
    settled = result["batch_sizes"][-1]
    # The last third of the run (by time), from the metrics records.
    t_end, n_end = metrics[-1]
    t_from, n_from = next(
        m for m in metrics if m[0] >= metrics[0][0] + 2 * (t_end - metrics[0][0]) / 3
    )
    end_sps = (n_end - n_from) / max(t_end - t_from, 1e-9)
    fixed_sps = {b: plain_loop(s, device, b, samples // 4, data) for b in FIXED_BATCHES}
    at_settled = plain_loop(s, device, settled, samples // 4, data)
    best = max(fixed_sps, key=lambda b: fixed_sps[b])
    overhead = result["overhead_s"]
    return {
        "epochs": epochs,
        "elapsed_s": result["elapsed_s"],
        "commit_s": overhead["commit"],
        "retune_s": overhead["retune"],
        "overhead_share": (overhead["commit"] + overhead["retune"]) / result["elapsed_s"],
        "defaults_sps": sps,
        "batch_sizes": result["batch_sizes"],
        "retunes": result.get("retunes"),
        "settled_batch": settled,
        "first_move_epoch": None
        if first_move is None
        else first_move["samples_done"] / s["samples"],
        "fixed_sps": fixed_sps,
        "best_fixed_batch": best,
        "ratio": sps / fixed_sps[best],
        "end_sps": end_sps,
        "plain_at_settled_sps": at_settled,
        "end_ratio": end_sps / at_settled,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="64,256,1024", help="runtime/plain at each")
    parser.add_argument("--ddp-batch", type=int, default=256, help="the global batch")
    parser.add_argument("--procs", type=int, help="default: every GPU, else 2")
    parser.add_argument("--seconds", type=float, default=4.0, help="per measured run")
    parser.add_argument("--epochs", type=int, default=40, help="for the defaults run")
    parser.add_argument("--only", default="plain,ddp,defaults")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a dry run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    device = select_device(args.device)
    s = TINY if args.tiny else sizes(device)
    parts = set(args.only.split(","))
    batches = [int(b) for b in args.batches.split(",")]
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    procs = args.procs or (gpus if gpus else 2)
    report: dict[str, Any] = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "gpus": gpus,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "model": s,
    }
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    one_sps = 0.0
    if "plain" in parts or "ddp" in parts:
        report["one_process"] = []
        for batch in batches:
            one = one_process(s, device, args.rounds, batch, args.seconds)
            report["one_process"].append(one)
            one_sps = max(one_sps, one["plain_sps"])
            say(
                f"runtime/plain   1 process, batch {batch}: {one['ratio']:.3f} (rounds "
                f"{' '.join(f'{r:.2f}' for r in one['ratios'])}; medians "
                f"{one['runtime_sps']:,.0f} / {one['plain_sps']:,.0f} samples/s)"
            )
    if "ddp" in parts and (device.type == "cuda" and procs > gpus):
        say(f"runtime/DDP     {procs} processes: skipped (NCCL needs a GPU per process)")
    elif "ddp" in parts and procs >= 2:
        multi = n_processes(s, device, procs, args.rounds, args.ddp_batch, args.seconds, one_sps)
        report["processes"] = multi
        say(
            f"runtime/DDP     {procs} processes, global batch {multi['global_batch']}: "
            f"{multi['ratio']:.3f} (rounds {' '.join(f'{r:.2f}' for r in multi['ratios'])}; "
            f"medians {multi['runtime_sps']:,.0f} / {multi['ddp_sps']:,.0f} samples/s)"
        )
    if "defaults" in parts:
        d = defaults_vs_fixed(s, device, args.epochs)
        report["defaults"] = d
        say(
            f"defaults/best fixed batch {d['best_fixed_batch']}: {d['ratio']:.3f} "
            f"({d['defaults_sps']:,.0f} / {d['fixed_sps'][d['best_fixed_batch']]:,.0f} "
            f"samples/s); batches {d['batch_sizes']}, settled {d['settled_batch']}, left "
            f"the base batch at epoch {d['first_move_epoch']}; last third "
            f"{d['end_ratio']:.3f} of the plain loop at the settled batch"
        )
        say(
            f"commits + re-tunes with the defaults: {100 * d['overhead_share']:.2f}% of "
            f"{d['elapsed_s']:.0f} s ({d['commit_s']:.2f} s commits, {d['retune_s']:.2f} s "
            f"re-tunes, {d['retunes']} moves)"
        )
    report["summary"] = lines
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
