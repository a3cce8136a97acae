"""Where a command's CPU goes, by kind of process: the test suite's, say.

    sudo .venv/bin/python benchmarks/suite_cpu.py [--json OUT] -- make unit

On 2 cores the suite is CPU-bound (a full run kept both cores 91% busy), so its wall
time falls only with the CPU its processes spend. This runs the command with the
kernel's process accounting on (``acct(2)``: one record per process that ends, with its
user and system time, short-lived ones included) and reads every new process's command
line from /proc meanwhile, to tell a torchrun agent from a daemon or a trainer's worker
(all of them "python" to the kernel). Needs root (CAP_SYS_PACCT); Linux only.

A process still running when the command ends is not counted: the suite leaves none.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

# struct acct_v3 (linux/acct.h): 64 bytes a record.
RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")
AHZ = 100  # the unit of its times

# (kind, pattern on the command line or the kernel's name), first match wins. Workers
# forked by a torchrun agent keep its command line but name themselves bftrainer-w<rank>.
CLI = r"(?:bftrainer\S*|-m bftrainer) "  # the command, run by its script or as a module
KINDS = [
    ("trainer worker", r"^comm:bftrainer-w|bftrainer\.trainers\.launch\.worker"),
    ("torchrun agent", r"torchrun_agent|torch\.distributed\.run|^comm:pt_elastic"),
    ("horovod driver", r"horovod_driver|horovodrun|horovod\.runner"),
    ("supervisor", rf"launch\.supervisor|{CLI}run\b"),
    ("bftrainer status", rf"{CLI}status"),
    ("daemon, agent, allocator", rf"{CLI}(daemon|agent|centre)"),
    ("bftrainer replay", rf"{CLI}replay"),
    ("bftrainer report", rf"{CLI}report"),
    ("other bftrainer command", r"bftrainer"),
    ("replay pool worker", r"multiprocessing"),
    ("pytest (tests in process)", r"pytest|xdist|execnet|exec\(eval\(sys\.stdin"),
    ("Slurm daemons", r"^comm:(slurmctld|slurmd|slurmstepd)"),
    ("Slurm commands", r"^comm:(sbatch|srun|scancel|squeue|sinfo|scontrol|sacct)"),
    ("chromium", r"chrom"),
]


def comp_t(value: int) -> float:
    """acct's 16-bit float: 13-bit mantissa, 3-bit base-8 exponent, in AHZ ticks."""
    return ((value & 0x1FFF) << (3 * (value >> 13))) / AHZ


def kind_of(cmdline: str, comm: str) -> str:
    for label, pattern in KINDS:
        if re.search(pattern, f"comm:{comm}") or (cmdline and re.search(pattern, cmdline)):
            return label
    return f"other ({comm})"


class CommandLines:
    """Every process's command line, read from /proc as processes appear."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) not in self.seen:
                    try:
                        raw = Path(f"/proc/{name}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if raw:
                        self.seen[int(name)] = raw.replace(b"\0", b" ").decode(errors="replace")
            self._stop.wait(self.every_s)


def accounting(path: Path | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(path).encode() if path else None) != 0:
        err = ctypes.get_errno()
        sys.exit(f"suite_cpu: acct({path}) failed: {os.strerror(err)} (needs root)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command to run")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given (after --)")
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as tmp:
        log = Path(tmp) / "acct"
        log.touch()
        start = time.monotonic()
        with CommandLines() as lines:
            accounting(log)
            try:
                code = subprocess.call(command)
            finally:
                accounting(None)
        wall_s = time.monotonic() - start
        data = log.read_bytes()
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        rec = RECORD.unpack_from(data, offset)
        pid, utime, stime, comm = rec[6], rec[10], rec[11], rec[18]
        name = comm.split(b"\0")[0].decode(errors="replace")
        row = by_kind[kind_of(lines.seen.get(pid, ""), name)]
        row[0] += 1
        row[1] += comp_t(utime)
        row[2] += comp_t(stime)
    total = sum(u + s for _, u, s in by_kind.values())
    cores = len(os.sched_getaffinity(0))
    print(f"{' '.join(command)}: exit {code}, {wall_s:.0f} s wall, {total:.0f} s CPU")
    print(f"(the cores busy {100 * total / (wall_s * cores):.0f}% of the time, {cores} cores)")
    print(f"{'kind':32s} {'processes':>9s} {'user s':>8s} {'sys s':>7s} {'share':>6s}")
    rows = sorted(by_kind.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
    for label, (n, user, system) in rows:
        share = 100 * (user + system) / total if total else 0.0
        print(f"{label:32s} {int(n):9d} {user:8.0f} {system:7.0f} {share:5.1f}%")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "exit": code,
                    "wall_s": wall_s,
                    "cpu_s": total,
                    "cores": cores,
                    "kinds": {
                        k: {"processes": int(n), "user_s": u, "sys_s": t} for k, (n, u, t) in rows
                    },
                },
                indent=1,
            )
            + "\n"
        )
    sys.exit(code)


if __name__ == "__main__":
    main()
