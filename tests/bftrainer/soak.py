"""A seeded, randomized soak of the live service on the real local Slurm.

A schedule drawn from a seed interleaves what a centre's service lives through:
submissions (both backends, various sizes and amounts of work, a few scripts written to
crash), cancels, main jobs that take held nodes, holders cancelled by hand, the daemon
killed -9, stopped with SIGTERM, or down for a while as main jobs preempt its nodes, and
a trainer's supervisor killed -9. While it runs and at its end it checks what a centre
relies on:

(a) no trainer fails unless its script was written to fail, or its supervisor was killed
    more often than the daemon restarts one (the retries ran out, and its reason says so);
(b) every finished trainer did exactly its work (samples == work);
(c) every main job starts within ``MAIN_START_LIMIT_S`` of its submission (main jobs never
    overlap, so Slurm always has the nodes: only holders stand in the way);
(d) once the trainers have ended and the daemon has stopped, no holder job and no process
    of any trainer is left;
(e) at quiet points, ``bftrainer status --json`` agrees with ``squeue`` on the held nodes.

The same seed gives the same schedule: a failing run names the command that replays it.
``tests/bftrainer/test_soak.py`` runs one seed briefly; ``benchmarks/soak.py`` runs long.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Self

from bftrainer.trainers import channel
from bftrainer.trainers.launch import remote
from bftrainer.trainers.launch.restarts import MAX_RESTARTS
from tests.bftrainer.daemon_service import MAIN_START_LIMIT_S, Service, StartWatch

TERMINAL = ("done", "failed", "cancelled")
KINDS = (
    "submit",
    "cancel",
    "main_job",
    "scancel_holder",
    "kill_daemon",
    "term_daemon",
    "daemon_down",
    "kill_supervisor",
)


@dataclass(frozen=True)
class Action:
    at_s: float
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


def schedule(seed: int, duration_s: float, nodes: int, down_s: float) -> list[Action]:
    """The actions of one soak, a pure function of its arguments."""
    rng = random.Random(seed)
    out: list[Action] = []
    t = 5.0
    main_free_at = 0.0
    submits = 0
    while t < duration_s:
        # Trainers first, so that there is something to disturb.
        if submits < 2:
            kind = "submit"
        else:
            kind = rng.choices(KINDS, weights=(30, 6, 16, 10, 7, 7, 4, 8))[0]
        args: dict[str, Any] = {}
        if kind == "submit":
            submits += 1
            args = {
                "backend": rng.choice(("torchrun", "horovod")),
                "max_nodes": rng.randint(1, 4),
                "work": rng.choice((2_000, 4_000, 8_000)),
                "crash": rng.random() < 0.1,
            }
        elif kind in ("main_job", "daemon_down"):
            if t < main_free_at:  # main jobs never overlap: see (c)
                t += 3.0
                continue
            length = rng.randint(15, 40)
            args = {"size": rng.randint(1, max(1, nodes // 2)), "length_s": length}
            if kind == "daemon_down":
                args["down_s"] = down_s
            main_free_at = t + length + (down_s if kind == "daemon_down" else 0) + 10
        args["pick"] = rng.random()  # which trainer or holder, among those there
        out.append(Action(round(t, 1), kind, args))
        t += rng.uniform(6.0, 14.0)
    return out


@dataclass
class Report:
    seed: int
    actions: int = 0
    faults: int = 0
    trainers: int = 0
    main_jobs: int = 0
    violations: list[str] = field(default_factory=list)
    main_delays_s: list[float] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)

    @classmethod
    def total(cls, reports: Sequence[Report], **fixed: Any) -> Self:
        """The seeds' reports as one: numbers and lists add up, counts by kind merge;
        ``fixed`` fields (the seed: -1) are set, not added."""
        out = cls(**{"seed": -1, **fixed})
        for r in reports:
            for f in fields(out):
                if f.name in fixed or f.name == "seed":
                    continue
                mine, theirs = getattr(out, f.name), getattr(r, f.name)
                if isinstance(mine, dict):
                    for key, n in theirs.items():
                        mine[key] = mine.get(key, 0) + n
                else:
                    setattr(out, f.name, mine + theirs)
        return out

    def summary(self) -> str:
        d = sorted(self.main_delays_s)

        def q(p: float) -> str:
            return f"{d[min(len(d) - 1, int(p * len(d)))]:.1f}" if d else "-"

        return (
            f"seed {self.seed}: {self.actions} events, {self.faults} faults injected, "
            f"{self.trainers} trainers, {self.main_jobs} main jobs, "
            f"{len(self.violations)} invariant violations; main-job start delay p50 "
            f"{q(0.5)} s, p95 {q(0.95)} s, max {d[-1] if d else 0:.1f} s"
            + (f" (mean {statistics.fmean(d):.1f} s)" if d else "")
        )


FAULTS = ("scancel_holder", "kill_daemon", "term_daemon", "daemon_down", "kill_supervisor")


class Soak:
    """Runs a schedule against a started :class:`Service` (see the module docstring)."""

    def __init__(self, service: Service, seed: int, actions: list[Action]) -> None:
        self.s = service
        self.seed = seed
        self.actions = actions
        self.report = Report(seed)
        self.work: dict[str, int] = {}
        self.crash: set[str] = set()
        self.cancelled: set[str] = set()
        self.main_jobs = StartWatch(service.cluster)
        self.supervisor_kills: dict[str, int] = {}  # trainer -> times its supervisor was killed

    # ---- helpers --------------------------------------------------------------------
    def violate(self, what: str) -> None:
        self.report.violations.append(what)

    def trainers(self) -> list[dict[str, Any]]:
        return list(self.s.status()["trainers"])

    def unfinished(self) -> list[dict[str, Any]]:
        return [t for t in self.trainers() if t["state"] not in TERMINAL]

    def squeue(self, *args: str) -> list[list[str]]:
        out = self.s.cluster.run(["squeue", "-h", *args], check=False)
        return [line.split("|") for line in out.splitlines() if line.strip()]

    def running_holders(self) -> dict[str, str]:
        """node -> job id of our RUNNING holders, as squeue shows them."""
        rows = self.squeue("-n", "bftrainer-hold", "-t", "R", "-o", "%i|%N")
        return {node: job for job, node in rows}

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if predicate():
                return True
            self.sleep(1.0)
        return predicate()

    def main_job(self, size: int, length_s: int, nodes: list[str] | None = None) -> None:
        where = ["-w", ",".join(nodes[:size])] if nodes else []
        job = self.s.cluster.sbatch(
            "-p", "main", "-N", str(size), *where, "-t", "2", "--wrap", f"sleep {length_s}"
        )
        self.s.main_jobs.append(job)
        self.main_jobs.track(job)
        self.report.main_jobs += 1

    # ---- the actions ----------------------------------------------------------------
    def act(self, a: Action) -> None:
        self.report.by_kind[a.kind] = self.report.by_kind.get(a.kind, 0) + 1
        if a.kind in FAULTS:
            self.report.faults += 1
        getattr(self, f"_{a.kind}")(a.args)

    def _submit(self, args: dict[str, Any]) -> None:
        if len(self.unfinished()) >= 3:  # 2 cores: more would only queue
            return
        extra = ("--fail-at-step", "3") if args["crash"] else ()
        tid = self.s.submit(args["backend"], args["work"], args["max_nodes"], *extra)
        self.work[tid] = args["work"]
        if args["crash"]:
            self.crash.add(tid)
        self.report.trainers += 1

    def _pick(self, items: list[Any], pick: float) -> Any:
        return items[int(pick * len(items))] if items else None

    def _cancel(self, args: dict[str, Any]) -> None:
        t = self._pick(self.unfinished(), args["pick"])
        if t is not None:
            self.s.cli("cancel", t["id"])
            self.cancelled.add(t["id"])

    def _main_job(self, args: dict[str, Any]) -> None:
        # On held nodes when there are some: the point is to preempt.
        held = sorted(self.running_holders())
        self.main_job(args["size"], args["length_s"], held if len(held) >= args["size"] else None)

    def _scancel_holder(self, args: dict[str, Any]) -> None:
        job = self._pick(sorted(self.running_holders().values()), args["pick"])
        if job is not None:
            self.s.cluster.run(["scancel", job], check=False)

    def _kill_daemon(self, args: dict[str, Any]) -> None:
        self.s.kill9()
        self.sleep(2.0)
        self.s.start(**self.start_args)

    def _term_daemon(self, args: dict[str, Any]) -> None:
        rc = self.s.stop()
        if rc != 0:
            self.violate(f"the daemon exited {rc} on SIGTERM")
        self.sleep(1.0)
        self.s.start(**self.start_args)

    def _daemon_down(self, args: dict[str, Any]) -> None:
        self.s.kill9()
        used = sorted({n for t in self.unfinished() for n in t["nodes"]})
        self.main_job(args["size"], args["length_s"], used if len(used) >= args["size"] else None)
        self.sleep(args["down_s"])
        self.s.start(**self.start_args)

    def _kill_supervisor(self, args: dict[str, Any]) -> None:
        running = [t for t in self.unfinished() if t["state"] == "running"]
        t = self._pick(running, args["pick"])
        if t is None:
            return
        path = self.s.state_dir / "trainers" / t["id"] / channel.SUPERVISOR_PID
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(path.read_text()), signal.SIGKILL)
            self.supervisor_kills[t["id"]] = self.supervisor_kills.get(t["id"], 0) + 1

    # ---- the invariants -------------------------------------------------------------
    def check_quiet_point(self) -> None:
        """(e): status and squeue agree on which nodes are held (a few tries: a holder
        may start between the two reads)."""
        for _ in range(4):
            status = self.s.status()
            said = {p["node"] for p in status["pool"] if p["holder_state"] == "running"}
            if said == set(self.running_holders()):
                break
            self.sleep(self.poll_s + 1.0)
        else:
            self.violate(
                f"status says held {sorted(said)}, squeue {sorted(self.running_holders())}"
            )
        for t in status["trainers"]:
            if t["state"] == "running":
                pid_file = self.s.state_dir / "trainers" / t["id"] / channel.SUPERVISOR_PID
                if pid_file.exists() and not remote.alive(int(pid_file.read_text())):
                    if not (pid_file.parent / channel.EXIT).exists():
                        continue  # killed by this soak: the daemon restarts it
                    self.violate(f"status says {t['id']} running; its supervisor has exited")

    def check_end(self) -> None:
        for t in self.trainers():
            tid, state = t["id"], t["state"]
            if state not in TERMINAL:
                self.violate(f"{tid} still {state} at the end")
            elif state == "failed" and tid not in self.crash:
                # Killed more often than the restart budget allows between two commits:
                # the retries ran out, as documented, and the reason must say so.
                kills = self.supervisor_kills.get(tid, 0)
                gave_up = f"gave up after {MAX_RESTARTS} restarts without a new" in t["reason"]
                if not (kills > MAX_RESTARTS and gave_up):
                    self.violate(f"(a) {tid} failed: {t['reason']} (supervisor killed {kills}x)")
            elif state == "done" and t["samples_done"] != self.work.get(tid):
                self.violate(f"(b) {tid} did {t['samples_done']} samples of {self.work.get(tid)}")
            elif tid in self.crash and state == "done":
                self.violate(f"{tid} was written to crash, yet is done")
        delays, late = self.main_jobs.delays(MAIN_START_LIMIT_S)
        self.report.main_delays_s += delays
        for what in late:
            self.violate(f"(c) {what}")

    def check_nothing_left(self) -> None:
        """(d): after the daemon's stop, no holder of ours and no trainer process."""
        ok = self.wait(lambda: not self.squeue("-n", "bftrainer-hold", "-t", "PD,R,CG"), 30)
        if not ok:
            self.violate(f"(d) holders left: {self.squeue('-n', 'bftrainer-hold')}")
        for d in (self.s.state_dir / "trainers").glob("*"):
            if left := remote.processes_of(d):
                self.violate(f"(d) processes of {d.name} left: {left}")

    # ---- the run --------------------------------------------------------------------
    def run(self, poll_s: float, lease_s: float, drain_s: float = 300.0) -> Report:
        self.poll_s = poll_s
        self.start_args = {"poll_s": poll_s, "lease_s": lease_s}
        self.s.start(**self.start_args)
        t0 = time.monotonic()
        for a in self.actions:
            self.sleep(max(0.0, t0 + a.at_s - time.monotonic()))
            self.act(a)
            self.report.actions += 1
            if a.kind in ("kill_daemon", "term_daemon", "daemon_down"):
                continue
            if self.report.actions % 5 == 0:
                self.check_quiet_point()
        # Let every trainer end (the daemon cancels what would outlast the drain).
        if not self.wait(lambda: not self.unfinished(), drain_s):
            for t in self.unfinished():
                self.violate(f"{t['id']} did not end within {drain_s:.0f} s of the last event")
        self.wait(lambda: len(self.main_jobs.started) == len(self.main_jobs.submitted), 60)
        self.main_jobs.stop()
        self.check_quiet_point()
        self.check_end()
        rc = self.s.stop()
        if rc != 0:
            self.violate(f"the daemon exited {rc} on its final SIGTERM")
        self.check_nothing_left()
        if "internal error" in (log := "".join(self.s.logs())):
            self.violate("the daemon logged an internal error: " + log[-2000:])
        return self.report


def replay_command(seed: int, duration_s: float, down_s: float) -> str:
    return (
        f"python benchmarks/soak.py --seeds {seed} --duration {duration_s:g} "
        f"--down {down_s:g}   # needs root or a running local Slurm"
    )
