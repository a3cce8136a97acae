"""A seeded soak of centre mode with several real Unix accounts, on the real local Slurm.

One allocator (as root, the centre's account) serves 2-3 accounts made for the run (as
tests/bftrainer/test_centre_e2e.py makes them). A schedule drawn from a seed interleaves
what a centre lives through: each user submitting and cancelling their own trainers,
users asking about another's trainer (``cancel``, ``logs``, ``status`` of ``bob/t0001``
through the socket, or of ``t0001`` with ``--state-dir`` pointed at Bob's directory),
main jobs taking held nodes, the allocator killed -9 (restarted at once, or after being
down while a main job takes its nodes), and an agent killed -9 (restarted after a few
seconds, or after more than its lease, so that its trainers are withdrawn and registered
anew). While it runs and at its end it checks what a centre relies on:

(u) every process of a user's trainers runs under that user's uid (``/proc/PID/status``
    of every process whose environment names a trainer directory of one of the run's
    users), and so does each agent;
(h) every holder job belongs to one of the users (the allocator holds nothing), and every
    node a user's running trainer uses is held by a holder of that same user (``squeue``);
(x) no request about another user's trainer is accepted (each is refused in one line);
(w) every trainer its owner did not cancel ends ``done`` with exactly its work;
(m) every main job starts within ``MAIN_START_LIMIT_S`` of its submission;
(n) once the trainers have ended and the agents and the allocator have stopped, no
    holder job and no trainer process is left; the allocator logged no internal error.

The same seed gives the same schedule. ``benchmarks/centre_soak.py`` runs it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bftrainer.state import daemon_running
from tests.bftrainer.centre_service import Centre, User, submit_args, uid_of
from tests.bftrainer.daemon_service import MAIN_START_LIMIT_S, StartWatch
from tests.bftrainer.soak import Action, Report

TERMINAL = ("done", "failed", "cancelled")
KINDS = (
    "submit",
    "cancel",
    "cross_user",
    "main_job",
    "kill_allocator",
    "allocator_down",
    "kill_agent",
)
FAULTS = ("kill_allocator", "allocator_down", "kill_agent")
VERBS = ("cancel", "logs", "status")
# At most this many unfinished trainers at once, all users together (2 cores: more
# would only queue).
MAX_UNFINISHED = 3


def schedule(seed: int, duration_s: float, users: int, nodes: int, down_s: float) -> list[Action]:
    """The actions of one soak, a pure function of its arguments."""
    rng = random.Random(seed)
    out: list[Action] = []
    t = 5.0
    main_free_at = 0.0
    submits = 0
    while t < duration_s:
        args: dict[str, Any] = {}
        if submits < users:  # every user has a trainer first: something to disturb
            kind, args["user"] = "submit", submits
        else:
            kind = rng.choices(KINDS, weights=(28, 6, 22, 14, 7, 4, 9))[0]
            args["user"] = rng.randrange(users)
        if kind == "submit":
            submits += 1
            args["max_nodes"] = rng.randint(1, 4)
            args["work"] = rng.choice((10_000, 20_000, 40_000))
        elif kind == "cross_user":
            args["victim"] = (args["user"] + rng.randrange(1, users)) % users
            args["verb"] = rng.choice(VERBS)
            args["how"] = rng.choice(("socket", "socket", "state_dir"))
        elif kind == "kill_agent":
            # A few seconds (a unit restarting it), or past the allocator's lease.
            args["gone_s"] = rng.choice((2.0, 2.0, 45.0))
        elif kind in ("main_job", "allocator_down"):
            if t < main_free_at:  # main jobs never overlap: see (m)
                t += 3.0
                continue
            length = rng.randint(15, 40)
            args["size"] = rng.randint(1, max(1, nodes // 2))
            args["length_s"] = length
            if kind == "allocator_down":
                args["down_s"] = down_s
            main_free_at = t + length + (down_s if kind == "allocator_down" else 0) + 10
        args["pick"] = rng.random()  # which trainer, among those there
        out.append(Action(round(t, 1), kind, args))
        t += rng.uniform(6.0, 14.0)
    return out


@dataclass
class CentreReport(Report):
    users: int = 0
    cross_user_tried: int = 0
    cross_user_accepted: int = 0
    processes_checked: int = 0  # (process, check) pairs: a process is seen many times
    wrong_uid: int = 0
    holders_checked: int = 0
    wrong_holder: int = 0
    refusals: dict[str, int] = field(default_factory=dict)  # how each was refused
    cancelled: int = 0  # cancels by the trainers' own users, accepted
    wall_s: float = 0.0  # events run late when the machine is loaded: the real length

    def summary(self) -> str:
        whose = f"trainers of {self.users} users ({self.cancelled} cancelled by their user),"
        return (
            super().summary().replace("trainers,", whose, 1)
            + f"; {self.wall_s / 60:.0f} min of wall time; cross-user requests "
            f"{self.cross_user_tried} tried, {self.cross_user_accepted} accepted; trainer "
            f"processes checked {self.processes_checked}x, {self.wrong_uid} under another "
            f"uid; holder jobs checked {self.holders_checked}x, {self.wrong_holder} not their "
            "trainer's user's"
        )


class CentreSoak:
    """Runs a schedule against a :class:`Centre` (not started) and its ``users``."""

    def __init__(self, centre: Centre, users: list[User], seed: int, actions: list[Action]):
        self.c = centre
        self.users = users
        self.actions = actions
        self.report = CentreReport(seed, users=len(users))
        self.work: dict[tuple[str, str], int] = {}  # (user, trainer) -> samples
        self.cancelled: set[tuple[str, str]] = set()
        self.main_jobs = StartWatch(centre.cluster)
        self.main_job_ids: list[str] = []
        self.agents: list[subprocess.Popen[bytes]] = []  # agents this soak restarted

    # ---- helpers --------------------------------------------------------------------
    def violate(self, what: str) -> None:
        self.report.violations.append(what)
        print(f"  violation: {what}", flush=True)

    def trainers(self, user: User) -> list[dict[str, Any]]:
        if not (user.state_dir / "state.db").exists():
            return []  # nothing submitted yet
        return list(self.c.status(user)["trainers"])

    def unfinished(self, user: User) -> list[dict[str, Any]]:
        return [t for t in self.trainers(user) if t["state"] not in TERMINAL]

    def squeue(self, *args: str) -> list[list[str]]:
        out = self.c.cluster.run(["squeue", "-h", *args], check=False)
        return [line.split("|") for line in out.splitlines() if line.strip()]

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(1.0)
        return predicate()

    def _pick(self, items: list[Any], pick: float) -> Any:
        return items[int(pick * len(items))] if items else None

    def main_job(self, size: int, length_s: int, nodes: list[str]) -> None:
        where = ["-w", ",".join(nodes[:size])] if len(nodes) >= size else []
        job = self.c.cluster.sbatch(
            "-p", "main", "-N", str(size), *where, "-t", "2", "--wrap", f"sleep {length_s}"
        )
        self.main_job_ids.append(job)
        self.main_jobs.track(job)
        self.report.main_jobs += 1

    def held_nodes(self) -> list[str]:
        rows = self.squeue("-p", "bf", "-t", "R", "-o", "%N")
        return sorted(node for (node,) in rows if node)

    def start_agent(self, user: User) -> None:
        """``bftrainer agent`` as ``user``, as a user unit restarts it (its log appended
        to the agent's, by the user)."""
        log = user.state_dir / "agent.log"
        cmd = [*self.c.bftrainer, "agent", "--socket-dir", str(self.c.sockets)]
        self.agents.append(
            subprocess.Popen(
                ["sh", "-c", 'exec "$@" >>"$0" 2>&1', str(log), *cmd],
                env=self.c.env(user),
                user=user.uid,
                group=user.gid,
                extra_groups=[],
                cwd=user.home,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    # ---- the actions ----------------------------------------------------------------
    def act(self, a: Action) -> None:
        self.report.by_kind[a.kind] = self.report.by_kind.get(a.kind, 0) + 1
        if a.kind in FAULTS:
            self.report.faults += 1
        getattr(self, f"_{a.kind}")(a.args)

    def _submit(self, args: dict[str, Any]) -> None:
        if sum(len(self.unfinished(u)) for u in self.users) >= MAX_UNFINISHED:
            return
        user = self.users[args["user"]]
        done = self.c.run(
            user, *submit_args(args["max_nodes"], args["work"], self.c.hold, self.c.example)
        )
        if done.returncode != 0:
            self.violate(f"{user.name}: submit failed: {done.stderr.strip()[-300:]}")
            return
        tid = done.stdout.strip().splitlines()[-1]
        self.work[(user.name, tid)] = args["work"]
        self.report.trainers += 1

    def _cancel(self, args: dict[str, Any]) -> None:
        user = self.users[args["user"]]
        t = self._pick(self.unfinished(user), args["pick"])
        if t is None:
            return
        done = self.c.run(user, "cancel", t["id"])
        if done.returncode == 0:
            self.cancelled.add((user.name, t["id"]))
            self.report.cancelled += 1
        else:  # e.g. the agent not registered yet after a restart: not cancelled
            print(f"  {user.name}: cancel {t['id']} refused: {done.stderr.strip()}", flush=True)

    def _cross_user(self, args: dict[str, Any]) -> None:
        """(x): ask about another user's trainer; it must be refused, and change nothing."""
        user, victim = self.users[args["user"]], self.users[args["victim"]]
        theirs = self.trainers(victim)
        t = self._pick(theirs, args["pick"])
        tid = t["id"] if t is not None else "t0001"
        verb = args["verb"]
        if args["how"] == "socket":
            argv = [verb, f"{victim.name}/{tid}"]
        else:
            argv = [verb, tid, "--state-dir", str(victim.state_dir)]
        done = self.c.run(user, *argv)
        self.report.cross_user_tried += 1
        err = done.stderr.strip()
        if done.returncode == 0:
            self.report.cross_user_accepted += 1
            self.violate(
                f"(x) {user.name}: bftrainer {' '.join(argv)} was accepted: {done.stdout!r}"
            )
            return
        last = err.splitlines()[-1] if err else f"exit {done.returncode}"
        if "refused by the allocator" in err and f"it belongs to {victim.name}" in err:
            how = "refused by the allocator"
            if len(err.splitlines()) != 1:
                self.violate(f"(x) {user.name}: bftrainer {' '.join(argv)}: {err!r}")
        elif "is not readable" in last or "ermission denied" in last or "not to you" in last:
            how = "their state directory is not readable"  # 0700, another user's
        else:  # e.g. the allocator down: refused all the same
            how = last[:100]
        self.report.refusals[how] = self.report.refusals.get(how, 0) + 1

    def _main_job(self, args: dict[str, Any]) -> None:
        # On held nodes when there are some: the point is to preempt.
        self.main_job(args["size"], args["length_s"], self.held_nodes())

    def _kill_allocator(self, args: dict[str, Any]) -> None:
        self.c.kill9()
        time.sleep(2.0)
        self.c.start()

    def _allocator_down(self, args: dict[str, Any]) -> None:
        self.c.kill9()
        self.main_job(args["size"], args["length_s"], self.held_nodes())
        time.sleep(args["down_s"])
        self.c.start()

    def _kill_agent(self, args: dict[str, Any]) -> None:
        user = self.users[args["user"]]
        pid = daemon_running(user.state_dir) if user.state_dir.is_dir() else None
        if not pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.wait(lambda: daemon_running(user.state_dir) is None, 30)
        time.sleep(args["gone_s"])
        self.start_agent(user)
        if not self.wait(lambda: daemon_running(user.state_dir) is not None, 60):
            self.violate(f"{user.name}'s agent did not start again")

    # ---- the invariants -------------------------------------------------------------
    def check_uids(self) -> None:
        """(u): every process working for a trainer of one of the users runs as that user;
        so does each user's agent."""
        dirs = {f"BFTRAINER_TRAINER_DIR={u.state_dir}/".encode(): u for u in self.users}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            owner = next((u for marker, u in dirs.items() if marker in environ), None)
            if owner is None:
                continue
            try:
                uid = uid_of(int(proc.name))
            except (OSError, StopIteration):
                continue  # gone meanwhile
            self.report.processes_checked += 1
            if uid != owner.uid:
                self.report.wrong_uid += 1
                self.violate(f"(u) pid {proc.name} works for {owner.name} but runs as uid {uid}")
        for user in self.users:
            pid = daemon_running(user.state_dir) if user.state_dir.is_dir() else None
            if pid:
                with contextlib.suppress(OSError, StopIteration):
                    if (uid := uid_of(pid)) != user.uid:
                        self.violate(f"(u) {user.name}'s agent pid {pid} runs as uid {uid}")

    def check_holders(self) -> None:
        """(h): holder jobs are the users' own; each running trainer's nodes are held by
        its user's holders (a few tries: status and squeue are read one after the other)."""
        names = {u.name for u in self.users}
        for job, who, _node in self.squeue("-p", "bf", "-o", "%i|%u|%N"):
            self.report.holders_checked += 1
            if who not in names:
                self.report.wrong_holder += 1
                self.violate(f"(h) holder job {job} belongs to {who}, not to a user")
        for _ in range(4):
            owners = {node: who for who, node in self.squeue("-p", "bf", "-t", "R", "-o", "%u|%N")}
            wrong = [
                f"{user.name}/{t['id']} on {node}, held by {owners[node]}"
                for user in self.users
                for t in self.trainers(user)
                if t["state"] == "running"
                for node in t["nodes"]
                if owners.get(node, user.name) != user.name
            ]
            if not wrong:
                return
            time.sleep(3.0)
        self.report.wrong_holder += len(wrong)
        self.violate(f"(h) nodes held by another user's holder: {wrong}")

    def check_end(self) -> None:
        """(w) and (m)."""
        for user in self.users:
            for t in self.trainers(user):
                key = (user.name, t["id"])
                state = t["state"]
                if key in self.cancelled:
                    if state not in ("cancelled", "done"):
                        self.violate(f"(w) {user.name}/{t['id']}, cancelled, is {state}")
                elif state != "done":
                    self.violate(f"(w) {user.name}/{t['id']} is {state}: {t['reason']}")
                elif t["samples_done"] != self.work.get(key):
                    self.violate(
                        f"(w) {user.name}/{t['id']} did {t['samples_done']} samples of "
                        f"{self.work.get(key)}"
                    )
        delays, late = self.main_jobs.delays(MAIN_START_LIMIT_S)
        self.report.main_delays_s += delays
        for what in late:
            self.violate(f"(m) {what}")

    def check_nothing_left(self) -> None:
        """(n): after the agents' and the allocator's stop, nothing of the users is left."""
        if not self.wait(lambda: not self.squeue("-p", "bf", "-t", "PD,R,CG"), 60):
            self.violate(f"(n) holders left: {self.squeue('-p', 'bf', '-o', '%i|%u|%T|%N')}")
        for user in self.users:
            pid = daemon_running(user.state_dir) if user.state_dir.is_dir() else None
            if pid:
                os.kill(pid, signal.SIGTERM)
                if not self.wait(lambda u=user: daemon_running(u.state_dir) is None, 60):
                    self.violate(f"(n) {user.name}'s agent did not stop on SIGTERM")
        if self.c.proc is not None:
            self.c.proc.send_signal(signal.SIGTERM)
            if (rc := self.c.proc.wait(timeout=60)) != 0:
                self.violate(f"(n) the allocator exited {rc} on SIGTERM")
        markers = [f"BFTRAINER_TRAINER_DIR={u.state_dir}/".encode() for u in self.users]
        left = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    environ = (proc / "environ").read_bytes()
                    if any(m in environ for m in markers):
                        left.append(int(proc.name))
        if left:
            self.violate(f"(n) trainer processes left: {left}")
        log = self.c.allocator_log()
        if "internal error" in log or "Traceback" in log:
            self.violate("(n) the allocator logged an internal error: " + log[-2000:])

    def check(self) -> None:
        self.check_uids()
        self.check_holders()

    # ---- the run --------------------------------------------------------------------
    def run(self, drain_s: float = 600.0) -> CentreReport:
        t0 = time.monotonic()
        self.c.start()
        try:
            for a in self.actions:
                time.sleep(max(0.0, t0 + a.at_s - time.monotonic()))
                self.act(a)
                self.report.actions += 1
                self.check()
            for user in self.users:  # as a user unit would: each user's agent runs
                if user.state_dir.is_dir() and daemon_running(user.state_dir) is None:
                    self.start_agent(user)
            self.c.release()  # the drain: every trainer's rest at full speed

            def ended() -> bool:
                self.check_uids()
                return not any(self.unfinished(u) for u in self.users)

            if not self.wait(ended, drain_s):
                for u in self.users:
                    for t in self.unfinished(u):
                        self.violate(f"{u.name}/{t['id']} did not end within {drain_s:.0f} s")
            self.wait(lambda: len(self.main_jobs.started) == len(self.main_jobs.submitted), 60)
            self.check()
            self.check_end()
            self.check_nothing_left()
        finally:
            self.report.wall_s = time.monotonic() - t0
            self.main_jobs.stop()
            if self.main_job_ids:
                self.c.cluster.run(["scancel", *self.main_job_ids], check=False)
            for proc in self.agents:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1)
        return self.report


def replay_command(seed: int, duration_s: float, users: int, down_s: float) -> str:
    return (
        f"python benchmarks/centre_soak.py --seeds {seed} --duration {duration_s:g} "
        f"--users {users} --down {down_s:g}   # needs root"
    )
